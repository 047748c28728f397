//! The SQLite schema, versioned by `PRAGMA user_version` (SPEC §10).
//!
//! `rate_limit_usage`, `rate_limit_cooldowns` and `server_logs` keep the seed's names
//! and columns so that plain `sqlite3` and pandas can read them. `quotaengine_meta`
//! holds one version counter per small table, bumped by triggers, so that a change
//! made by any connection (another engine, or a plain `sqlite3` session) is noticed
//! without re-reading the tables.
//!
//! Ids: every engine follows `rate_limit_usage` by id. Ids grow, except after a
//! retention sweep deleted the newest rows (SQLite then hands their ids out again):
//! such a sweep bumps `quotaengine_meta.usage_trims` and stores what it left in
//! `usage_trimmed_to`, and every engine steps its cursor back to that at its next read.
//! Lease ids are random 63-bit numbers chosen by the engine, so a late, idempotent
//! `release_lease` can never hit a newer lease. Neither table uses AUTOINCREMENT: it
//! would add a page write to every commit.

/// `MIGRATIONS[i]` takes a database from version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE rate_limit_usage (
    id            INTEGER PRIMARY KEY,
    platform      TEXT    NOT NULL,
    model_id      TEXT    NOT NULL,
    key_id        INTEGER NOT NULL,
    kind          TEXT    NOT NULL CHECK (kind IN ('request', 'tokens')),
    tokens        INTEGER NOT NULL DEFAULT 1,
    created_at_ms INTEGER NOT NULL
);
-- No time index: it would add a WAL frame to every commit. Ids follow commit order,
-- so "the first id with created_at_ms >= t" bounds every row stamped at or after t
-- (see SqliteStore): time ranges are scans from that id, exact and cheap.

CREATE TABLE rate_limit_cooldowns (
    platform      TEXT    NOT NULL,
    model_id      TEXT    NOT NULL,
    key_id        INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    source        TEXT    NOT NULL CHECK (source IN ('heuristic', 'authoritative', 'credit', 'tier')),
    set_at_ms     INTEGER NOT NULL,
    PRIMARY KEY (platform, model_id, key_id)
);

CREATE TABLE server_logs (
    id            INTEGER PRIMARY KEY,
    level         TEXT,
    source        TEXT,
    provider      TEXT,
    model         TEXT,
    event         TEXT,
    request_id    TEXT,
    message       TEXT,
    created_at_ms INTEGER
);
CREATE INDEX idx_server_logs_time ON server_logs (created_at_ms);

CREATE TABLE quota_leases (
    id            INTEGER PRIMARY KEY,
    platform      TEXT    NOT NULL,
    model_id      TEXT    NOT NULL,
    key_id        INTEGER NOT NULL,
    tokens        INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
);
-- No index: the table holds only live leases, and an index page would add a
-- WAL frame to every commit.

CREATE TABLE api_keys (
    key_id   INTEGER PRIMARY KEY,
    platform TEXT    NOT NULL,
    base_url TEXT,
    label    TEXT,
    enabled  INTEGER NOT NULL DEFAULT 1
);

CREATE TABLE models (
    platform             TEXT NOT NULL,
    model_id             TEXT NOT NULL,
    rpm_limit            INTEGER,
    rpd_limit            INTEGER,
    tpm_limit            INTEGER,
    tpd_limit            INTEGER,
    monthly_token_budget TEXT,
    PRIMARY KEY (platform, model_id)
);

-- NULL: not set (env and defaults apply); -1: no cap; >= 0: the cap.
CREATE TABLE provider_caps (
    platform        TEXT PRIMARY KEY,
    daily_requests  INTEGER,
    minute_requests INTEGER,
    daily_tokens    INTEGER
);

-- Failure history that persists across restarts and processes (SPEC §6.1, §6.2):
-- kind 'ladder' (a ladder step), 'unknown' (an unknown-limit hit), 'auth' (a 401 of
-- the key; model_id is ''), 'empty' (an empty completion in a row).
CREATE TABLE failure_history (
    platform  TEXT    NOT NULL,
    model_id  TEXT    NOT NULL,
    key_id    INTEGER NOT NULL,
    kind      TEXT    NOT NULL CHECK (kind IN ('ladder', 'unknown', 'auth', 'empty')),
    hit_at_ms INTEGER NOT NULL
);
CREATE INDEX idx_failure_history_key ON failure_history (key_id);

-- Observed provider quota (SPEC §8.2): one merged row per key, pool and metric.
CREATE TABLE provider_quota_state (
    platform       TEXT    NOT NULL,
    key_id         INTEGER NOT NULL,
    pool_key       TEXT    NOT NULL,
    metric         TEXT    NOT NULL,
    limit_value    INTEGER,
    remaining      INTEGER,
    reset_at_ms    INTEGER,
    source         TEXT    NOT NULL,
    confidence     REAL    NOT NULL,
    observed_at_ms INTEGER NOT NULL,
    PRIMARY KEY (platform, key_id, pool_key, metric)
);

CREATE TABLE quotaengine_meta (
    name    TEXT PRIMARY KEY,
    version INTEGER NOT NULL
);
INSERT INTO quotaengine_meta (name, version) VALUES
    ('rate_limit_cooldowns', 0), ('api_keys', 0), ('models', 0), ('provider_caps', 0),
    ('failure_history', 0);
"#,
    r#"
-- Version 2: a request row is one request with tokens 0 (SPEC §10), so that
-- COUNT(*) of request rows counts requests and SUM(tokens) counts only tokens.
-- Version 1 stored 1 in a request row's tokens, or N for N requests merged while
-- degraded: such a row becomes N rows with its timestamp.
WITH RECURSIVE more(id, n) AS (
    SELECT id, tokens - 1 FROM rate_limit_usage WHERE kind = 'request' AND tokens > 1
    UNION ALL
    SELECT id, n - 1 FROM more WHERE n > 1
)
INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms)
SELECT u.platform, u.model_id, u.key_id, 'request', 0, u.created_at_ms
FROM more JOIN rate_limit_usage AS u ON u.id = more.id;
UPDATE rate_limit_usage SET tokens = 0 WHERE kind = 'request' AND tokens <> 0;
"#,
    r#"
-- Version 3: provider calendars (SPEC §14.2), one IANA zone per platform set with
-- set_platform_calendar (platforms without a row follow the environment or the
-- built-in zone).
CREATE TABLE platform_calendars (
    platform TEXT PRIMARY KEY,
    tz       TEXT NOT NULL
);
INSERT INTO quotaengine_meta (name, version) VALUES ('platform_calendars', 0);
"#,
    r#"
-- Version 4: limits as data (SPEC §14.1). The classic four stay in their columns;
-- every other declared limit of a model is listed in `limits`, space-separated
-- `metric/per=limit` with `:key` after `per` for scope key, e.g.
-- 'requests/1s=1 tokens/month=1000000'. NULL or '' when there are none.
ALTER TABLE models ADD COLUMN limits TEXT;
"#,
    r#"
-- Version 5: token kinds (SPEC 14.4). A tokens row keeps its total in `tokens` (a
-- plain SUM(tokens) stays right); what the call reported of its input, output and
-- cached input tokens sits beside it, NULL where it did not say. A lease notes how
-- much of its estimate is output.
ALTER TABLE rate_limit_usage ADD COLUMN input_tokens INTEGER;
ALTER TABLE rate_limit_usage ADD COLUMN output_tokens INTEGER;
ALTER TABLE rate_limit_usage ADD COLUMN cached_tokens INTEGER;
ALTER TABLE quota_leases ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
"#,
    r#"
-- Version 6: accounts (SPEC 14.3). The provider-side unit that meters a key (a
-- cloud project, an organisation, an aggregator's account); NULL: the key is its
-- own account.
ALTER TABLE api_keys ADD COLUMN account TEXT;
"#,
    r#"
-- Version 7: fewer wasted dispatches (SPEC 15). Two more kinds of failure history:
-- 'transient' (a transient bench of the route, 15.2) and 'concurrency' (a
-- concurrency failure of the key, model_id ''; `value` holds the key concurrency
-- cap it taught or confirmed, 15.4). SQLite cannot widen a CHECK in place, so the
-- table is rebuilt (it holds at most a day of failures).
CREATE TABLE failure_history_v7 (
    platform  TEXT    NOT NULL,
    model_id  TEXT    NOT NULL,
    key_id    INTEGER NOT NULL,
    kind      TEXT    NOT NULL
              CHECK (kind IN ('ladder', 'unknown', 'auth', 'empty', 'transient', 'concurrency')),
    hit_at_ms INTEGER NOT NULL,
    value     INTEGER
);
INSERT INTO failure_history_v7 (platform, model_id, key_id, kind, hit_at_ms)
    SELECT platform, model_id, key_id, kind, hit_at_ms FROM failure_history;
DROP TABLE failure_history;
ALTER TABLE failure_history_v7 RENAME TO failure_history;
CREATE INDEX idx_failure_history_key ON failure_history (key_id);
"#,
    r#"
-- Version 8: a key's configured concurrency cap (SPEC 20, set_key_concurrency_cap);
-- NULL: none configured (the env cap and a learned cap still apply).
ALTER TABLE api_keys ADD COLUMN concurrency_cap INTEGER;
"#,
    r#"
-- Version 9: the last percent of wasted calls (SPEC 21). A cooldown with key_id NULL
-- benches its model for every key of the platform, source 'upstream' (21.1). Three
-- more kinds of failure history: 'upstream' (an upstream failure of the model, the
-- chain its bench doubles along), 'pool_minute' and 'pool_day' (a provider cap
-- learned from a pool 429, model_id ''; `value` holds the cap, 21.2). SQLite cannot
-- widen a CHECK or drop NOT NULL in place, so both tables are rebuilt (they are small).
CREATE TABLE rate_limit_cooldowns_v9 (
    platform      TEXT    NOT NULL,
    model_id      TEXT    NOT NULL,
    key_id        INTEGER,
    expires_at_ms INTEGER NOT NULL,
    source        TEXT    NOT NULL
                  CHECK (source IN ('heuristic', 'authoritative', 'credit', 'tier', 'upstream')),
    set_at_ms     INTEGER NOT NULL,
    PRIMARY KEY (platform, model_id, key_id)
);
INSERT INTO rate_limit_cooldowns_v9 SELECT platform, model_id, key_id, expires_at_ms, source, set_at_ms
    FROM rate_limit_cooldowns;
DROP TABLE rate_limit_cooldowns;
ALTER TABLE rate_limit_cooldowns_v9 RENAME TO rate_limit_cooldowns;
CREATE TABLE failure_history_v9 (
    platform  TEXT    NOT NULL,
    model_id  TEXT    NOT NULL,
    key_id    INTEGER NOT NULL,
    kind      TEXT    NOT NULL
              CHECK (kind IN ('ladder', 'unknown', 'auth', 'empty', 'transient', 'concurrency',
                              'upstream', 'pool_minute', 'pool_day')),
    hit_at_ms INTEGER NOT NULL,
    value     INTEGER
);
INSERT INTO failure_history_v9 SELECT platform, model_id, key_id, kind, hit_at_ms, value FROM failure_history;
DROP TABLE failure_history;
ALTER TABLE failure_history_v9 RENAME TO failure_history;
CREATE INDEX idx_failure_history_key ON failure_history (key_id);
"#,
    r#"
-- Version 10: priority reserves (SPEC 22.1, set_priority_reserve): a call of priority
-- p leaves floor(limit * fraction) of every limit free, the fraction of the largest
-- priority here <= p.
CREATE TABLE priority_reserves (
    priority INTEGER PRIMARY KEY,
    fraction REAL    NOT NULL
);
INSERT INTO quotaengine_meta (name, version) VALUES ('priority_reserves', 0);
"#,
    r#"
-- Version 11: provider caps as a declaration (SPEC 8, 14.1). What set_provider_caps
-- persisted for a platform is one text, `caps`: the caps set, in gate order, in the
-- form of `models.limits` (`metric/per=limit`), with `none` for no cap; a cap not
-- listed is not set (the environment and the defaults apply), e.g.
-- 'requests/day=1000 tokens/day=none'. The three columns of version 1 are folded into
-- it and left in the table, NULL and unused (SQLite drops a column only from 3.35 on).
ALTER TABLE provider_caps ADD COLUMN caps TEXT;
UPDATE provider_caps SET caps = TRIM(
    COALESCE('requests/day=' || CASE WHEN daily_requests < 0 THEN 'none' ELSE daily_requests END || ' ', '')
    || COALESCE('requests/minute=' || CASE WHEN minute_requests < 0 THEN 'none' ELSE minute_requests END || ' ', '')
    || COALESCE('tokens/day=' || CASE WHEN daily_tokens < 0 THEN 'none' ELSE daily_tokens END, '')
);
UPDATE provider_caps SET daily_requests = NULL, minute_requests = NULL, daily_tokens = NULL;
"#,
    r#"
-- Version 12: money (SPEC 23.1) and platform limits (SPEC 23.3). Model prices (set_model_prices), each an integer
-- number of pico-dollars (10^-12 $): per input token (cache reads excluded), per output
-- token, per cached input token, and per request; a model without a row costs
-- nothing. What each event cost in micro-dollars at the prices in force when it was
-- recorded, and what each live lease reserves: NULL for none.
CREATE TABLE model_prices (
    platform         TEXT    NOT NULL,
    model_id         TEXT    NOT NULL,
    input_pps        INTEGER NOT NULL,
    output_pps       INTEGER NOT NULL,
    cached_input_pps INTEGER NOT NULL,
    per_request_pps  INTEGER NOT NULL,
    PRIMARY KEY (platform, model_id)
);
INSERT INTO quotaengine_meta (name, version) VALUES ('model_prices', 0);
ALTER TABLE rate_limit_usage ADD COLUMN cost INTEGER;
ALTER TABLE quota_leases ADD COLUMN cost INTEGER;
-- Platform limits (set_platform_limits): limits that hold across every model of a
-- platform, per account or per key. `limits` is the platform's whole declaration in
-- the form of `models.limits`, e.g. 'requests/minute=20 tokens/hour:key=100000'; a
-- platform without limits has no row.
CREATE TABLE platform_limits (
    platform TEXT PRIMARY KEY,
    limits   TEXT NOT NULL
);
INSERT INTO quotaengine_meta (name, version) VALUES ('platform_limits', 0);
"#,
    r#"
-- Version 13: tenants (SPEC 23.2). The tenants a usage row was served for and a live
-- lease is taken for: a JSON array of their names in the order the call gave them,
-- e.g. '["user:a","team:x"]' (SQLite's json_each reads it); NULL for none. Tenant
-- declarations (set_tenant_limits): a tenant's name or a pattern ending in '*', its
-- whole declaration in the form of `models.limits` (scope account), and the IANA zone
-- its calendar periods start in (NULL: UTC); a tenant without limits has no row.
ALTER TABLE rate_limit_usage ADD COLUMN tenants TEXT;
ALTER TABLE quota_leases ADD COLUMN tenants TEXT;
CREATE TABLE tenant_limits (
    tenant TEXT PRIMARY KEY,
    limits TEXT NOT NULL,
    tz     TEXT
);
INSERT INTO quotaengine_meta (name, version) VALUES ('tenant_limits', 0);
-- Also in version 13: the model penalty (SPEC 24.7). One more kind of failure history,
-- 'penalty': a server_error, timeout, transport or empty_completion of the route's
-- model, which ranks the model after healthy ones for `headroom` and `spread` for 5
-- minutes (the latest per key and model). The table is rebuilt to widen its CHECK.
CREATE TABLE failure_history_v13 (
    platform  TEXT    NOT NULL,
    model_id  TEXT    NOT NULL,
    key_id    INTEGER NOT NULL,
    kind      TEXT    NOT NULL
              CHECK (kind IN ('ladder', 'unknown', 'auth', 'empty', 'transient', 'concurrency',
                              'upstream', 'pool_minute', 'pool_day', 'penalty')),
    hit_at_ms INTEGER NOT NULL,
    value     INTEGER
);
INSERT INTO failure_history_v13 SELECT platform, model_id, key_id, kind, hit_at_ms, value FROM failure_history;
DROP TABLE failure_history;
ALTER TABLE failure_history_v13 RENAME TO failure_history;
CREATE INDEX idx_failure_history_key ON failure_history (key_id);
"#,
];

/// Tables whose changes bump `quotaengine_meta`; the order is the engine's index.
pub const VERSIONED_TABLES: [&str; 11] = [
    "rate_limit_cooldowns",
    "api_keys",
    "models",
    "provider_caps",
    "failure_history",
    "platform_calendars",
    "priority_reserves",
    "provider_quota_state",
    "model_prices",
    "platform_limits",
    "tenant_limits",
];

/// Each versioned table's counter and triggers, (re)created after every migration,
/// so that a table of an earlier version (`provider_quota_state`) can join
/// [`VERSIONED_TABLES`] without a new schema version: a file stays readable by the
/// engines of its version, and a reader of a file no writer of this engine opened yet
/// (no counter) reads such a table at every change instead.
pub fn triggers_sql() -> String {
    let mut sql = String::new();
    for t in VERSIONED_TABLES {
        sql.push_str(&format!("INSERT OR IGNORE INTO quotaengine_meta (name, version) VALUES ('{t}', 0);\n"));
        for op in ["INSERT", "UPDATE", "DELETE"] {
            sql.push_str(&format!(
                "CREATE TRIGGER IF NOT EXISTS qe_bump_{t}_{op} AFTER {op} ON {t} BEGIN \
                 UPDATE quotaengine_meta SET version = version + 1 WHERE name = '{t}'; END;\n"
            ));
        }
    }
    sql
}

/// The newest schema version this engine knows.
pub fn current_version() -> i64 {
    MIGRATIONS.len() as i64
}
