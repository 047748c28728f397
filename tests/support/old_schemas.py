"""Files of an older schema version, made from a file the engine made, to test migrating them
forward."""

from __future__ import annotations


# What each schema version added, undone newest first: `downgrade_schema` turns a file
# the engine made into one of an older version, to test migrating it forward.
def _cap_column(column: str, item: str) -> str:
    """Version 10's column of one provider cap from version 11's `caps` text."""
    padded = "(' ' || caps || ' ')"
    rest = f"substr({padded}, instr({padded}, ' {item}=') + {len(item) + 2})"
    value = f"substr({rest}, 1, instr({rest}, ' ') - 1)"
    return (
        f"{column} = CASE WHEN caps IS NULL OR instr({padded}, ' {item}=') = 0 THEN NULL "
        f"WHEN {value} = 'none' THEN -1 ELSE CAST({value} AS INTEGER) END"
    )


_UNDO = {
    13: [
        "DELETE FROM failure_history WHERE kind = 'penalty'",
        "CREATE TABLE failure_history_v12 (platform TEXT NOT NULL, model_id TEXT NOT NULL, "
        "key_id INTEGER NOT NULL, kind TEXT NOT NULL CHECK (kind IN ('ladder', 'unknown', 'auth', 'empty', "
        "'transient', 'concurrency', 'upstream', 'pool_minute', 'pool_day')), hit_at_ms INTEGER NOT NULL, "
        "value INTEGER)",
        "INSERT INTO failure_history_v12 SELECT * FROM failure_history",
        "DROP TABLE failure_history",
        "ALTER TABLE failure_history_v12 RENAME TO failure_history",
        "CREATE INDEX idx_failure_history_key ON failure_history (key_id)",
        "ALTER TABLE rate_limit_usage DROP COLUMN tenants",
        "ALTER TABLE quota_leases DROP COLUMN tenants",
        "DROP TABLE tenant_limits",
        "DELETE FROM quotaengine_meta WHERE name = 'tenant_limits'",
    ],
    12: [
        "DROP TABLE model_prices",
        "DELETE FROM quotaengine_meta WHERE name = 'model_prices'",
        "ALTER TABLE rate_limit_usage DROP COLUMN cost",
        "ALTER TABLE quota_leases DROP COLUMN cost",
        "DROP TABLE platform_limits",
        "DELETE FROM quotaengine_meta WHERE name = 'platform_limits'",
    ],
    11: [
        "UPDATE provider_caps SET "
        + ", ".join(
            _cap_column(column, item)
            for column, item in [
                ("daily_requests", "requests/day"),
                ("minute_requests", "requests/minute"),
                ("daily_tokens", "tokens/day"),
            ]
        ),
        "ALTER TABLE provider_caps DROP COLUMN caps",
    ],
    10: ["DROP TABLE priority_reserves", "DELETE FROM quotaengine_meta WHERE name = 'priority_reserves'"],
    9: [
        "DELETE FROM rate_limit_cooldowns WHERE key_id IS NULL OR source = 'upstream'",
        "CREATE TABLE rate_limit_cooldowns_v8 (platform TEXT NOT NULL, model_id TEXT NOT NULL, "
        "key_id INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL, source TEXT NOT NULL "
        "CHECK (source IN ('heuristic', 'authoritative', 'credit', 'tier')), set_at_ms INTEGER NOT NULL, "
        "PRIMARY KEY (platform, model_id, key_id))",
        "INSERT INTO rate_limit_cooldowns_v8 SELECT * FROM rate_limit_cooldowns",
        "DROP TABLE rate_limit_cooldowns",
        "ALTER TABLE rate_limit_cooldowns_v8 RENAME TO rate_limit_cooldowns",
        "DELETE FROM failure_history WHERE kind IN ('upstream', 'pool_minute', 'pool_day')",
        "CREATE TABLE failure_history_v8 (platform TEXT NOT NULL, model_id TEXT NOT NULL, "
        "key_id INTEGER NOT NULL, kind TEXT NOT NULL CHECK (kind IN ('ladder', 'unknown', 'auth', 'empty', "
        "'transient', 'concurrency')), hit_at_ms INTEGER NOT NULL, value INTEGER)",
        "INSERT INTO failure_history_v8 SELECT * FROM failure_history",
        "DROP TABLE failure_history",
        "ALTER TABLE failure_history_v8 RENAME TO failure_history",
        "CREATE INDEX idx_failure_history_key ON failure_history (key_id)",
    ],
    8: ["ALTER TABLE api_keys DROP COLUMN concurrency_cap"],
    7: [
        "DELETE FROM failure_history WHERE kind IN ('transient', 'concurrency')",
        "CREATE TABLE failure_history_v6 (platform TEXT NOT NULL, model_id TEXT NOT NULL, "
        "key_id INTEGER NOT NULL, kind TEXT NOT NULL CHECK (kind IN ('ladder', 'unknown', 'auth', 'empty')), "
        "hit_at_ms INTEGER NOT NULL)",
        "INSERT INTO failure_history_v6 SELECT platform, model_id, key_id, kind, hit_at_ms FROM failure_history",
        "DROP TABLE failure_history",
        "ALTER TABLE failure_history_v6 RENAME TO failure_history",
        "CREATE INDEX idx_failure_history_key ON failure_history (key_id)",
    ],
    6: ["ALTER TABLE api_keys DROP COLUMN account"],
    5: [
        "ALTER TABLE rate_limit_usage DROP COLUMN input_tokens",
        "ALTER TABLE rate_limit_usage DROP COLUMN output_tokens",
        "ALTER TABLE rate_limit_usage DROP COLUMN cached_tokens",
        "ALTER TABLE quota_leases DROP COLUMN output_tokens",
    ],
    4: ["ALTER TABLE models DROP COLUMN limits"],
    3: ["DROP TABLE platform_calendars", "DELETE FROM quotaengine_meta WHERE name = 'platform_calendars'"],
}


def downgrade_schema(con: object, version: int) -> None:
    """Back to schema `version` on an open sqlite3 connection (inside the caller's `with con`)."""
    current = con.execute("PRAGMA user_version").fetchone()[0]  # type: ignore[attr-defined]
    for v in range(current, version, -1):
        for sql in _UNDO.get(v, []):
            con.execute(sql)  # type: ignore[attr-defined]
    con.execute(f"PRAGMA user_version = {version}")  # type: ignore[attr-defined]
