//! The SQLite backend: one connection per engine, WAL mode, the system's SQLite.
use super::schema::{current_version, triggers_sql, MIGRATIONS, VERSIONED_TABLES};
use super::{
    Changes, CooldownRow, HistoryKind, HistoryRow, KeptUsage, LeaseRow, LogRow, QuotaStateRow, Store,
    StoreResult, TenantLimitsRow, TokenKinds, UsageFilter, UsageKind, UsageRow, Write,
};
use crate::core::error::StoreError;
use crate::core::limits::{decode_caps, decode_limits, Limit, LimitSet};
use crate::core::money::Prices;
use crate::core::tenants::TenantList;
use crate::core::types::{CapOverrides, CooldownSource, KeyInfo, ModelInfo};
use rusqlite::{params, Connection, OpenFlags};
use std::collections::HashMap;

mod tenants;
mod writes;
use std::sync::Arc;
use std::time::Duration;

/// Prepared statements kept per connection.
const STATEMENT_CACHE: usize = 96;

pub struct SqliteStore {
    conn: Connection,
    readonly: bool,
    in_section: bool,
    /// `PRAGMA data_version` at the previous pull; `None` before the first.
    data_version: Option<i64>,
    /// Highest `rate_limit_usage.id` delivered (or written by us); `None` before the first load.
    usage_cursor: Option<i64>,
    /// `usage_cursor` as of the last pull or commit (rows the engine has applied),
    /// restored by a rollback so that our abandoned inserts' ids are read again.
    cursor_at_begin: Option<i64>,
    versions: [i64; VERSIONED_TABLES.len()],
    /// What the rows read so far say about stragglers (for retention).
    seen: RowsSeen,
    /// Until the first sweep has scanned the whole table, rows older than this
    /// engine may hide anywhere.
    full_sweep_done: bool,
    /// `usage_trims` as of the last pull: a sweep that deleted the newest rows
    /// (so SQLite hands their ids out again) bumps it, and every engine following
    /// the table by id steps its cursor back to what was left.
    trims_seen: Option<i64>,
    trims_at_begin: Option<i64>,
    /// The cut-offs of a sweep in the open section (applied to the above on commit):
    /// every other model's, and the kept models' own.
    sweep_cutoff: Option<(i64, Arc<[KeptUsage]>)>,
    /// Where the retention sweep's classes start (committed), and as the open
    /// section's sweep left them (applied on commit).
    sweep_lo: SweepCursors,
    sweep_pending: Option<SweepCursors>,
    /// The open section's sweep stopped at [`SWEEP_CHUNK`] (and, once committed, the
    /// last one did).
    sweep_more_pending: bool,
    sweep_more: bool,
    /// This engine's registration on the file (writable files only).
    registry: Option<super::registry::Registry>,
    memory: bool,
    /// The WAL index (`<db>-shm`), read to learn cheaply that nothing was committed.
    shm: Option<Arc<std::fs::File>>,
    /// Its header as read just before `data_version` was last taken.
    shm_seen: Option<[u8; SHM_HEADER]>,
}

/// `provider_quota_state`'s place in [`VERSIONED_TABLES`].
const QUOTA_TABLE: usize = 7;

/// The first copy of the WAL index header: every commit changes it (frame count and
/// checksums; a restarted WAL, its salts).
const SHM_HEADER: usize = 48;

/// A row stamped this much before the newest one seen is a straggler.
const STRAGGLER_SLACK_MS: i64 = 60_000;
/// Ids one step of the retention sweep covers per class, at most (SPEC 14.2: a kept
/// model's period ending deletes a month of its rows); the rest at the next commit.
const SWEEP_CHUNK: i64 = 20_000;
/// Past this many stragglers, the next sweep scans the table instead.
const MAX_STRAGGLERS: usize = 100_000;

/// A busy timeout as SQLite takes it: 0 to 2^31 - 1 ms (a longer one is clamped).
fn busy_timeout(ms: i64) -> Duration {
    Duration::from_millis(ms.clamp(0, i64::from(i32::MAX)) as u64)
}

/// Why a file cannot be used as this engine's database: SQLite's own error or the
/// engine's reason. [`SqliteStore::open`] says it as one [`StoreError::Incompatible`].
struct Unfit(String);

impl From<rusqlite::Error> for Unfit {
    fn from(e: rusqlite::Error) -> Unfit {
        Unfit(e.to_string())
    }
}

impl From<&str> for Unfit {
    fn from(why: &str) -> Unfit {
        Unfit(why.to_string())
    }
}

impl From<String> for Unfit {
    fn from(why: String) -> Unfit {
        Unfit(why)
    }
}

/// The version of the SQLite library this process links (the system one, shared with
/// Python's `sqlite3`).
pub fn sqlite_version() -> &'static str {
    rusqlite::version()
}

impl SqliteStore {
    /// Opens (creating unless `readonly`) and migrates a database. A file that is not
    /// SQLite, holds another application's tables, or has a newer schema is refused
    /// before anything is written to it.
    pub fn open(path: &str, readonly: bool, busy_timeout_ms: i64) -> StoreResult<Self> {
        let memory = path == ":memory:";
        let sides = [format!("{path}-wal"), format!("{path}-shm")];
        let existed: Vec<bool> = sides.iter().map(|f| std::path::Path::new(f).exists()).collect();
        let result = Self::open_inner(path, readonly, busy_timeout_ms).map_err(|Unfit(why)| {
            StoreError::Incompatible(format!("cannot open {path:?} as a quotaengine database: {why}"))
        });
        if result.is_err() && !memory {
            // A refused file is left as it was: remove the side files opening it made
            // (SQLite creates them to read a WAL-mode file, even read-only). The
            // connection is closed by now.
            let wal_empty = std::fs::metadata(&sides[0]).map(|m| m.len() == 0).unwrap_or(true);
            if wal_empty {
                for (f, e) in sides.iter().zip(existed) {
                    if !e {
                        let _ = std::fs::remove_file(f);
                    }
                }
            }
        }
        result
    }

    fn open_inner(path: &str, readonly: bool, busy_timeout_ms: i64) -> Result<Self, Unfit> {
        let memory = path == ":memory:";
        let flags = if readonly {
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI
        } else {
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI
        };
        if readonly && !memory && !std::path::Path::new(path).exists() {
            return Err(Unfit::from("no such file"));
        }
        let conn = Connection::open_with_flags(path, flags)?;
        conn.busy_timeout(busy_timeout(busy_timeout_ms))?;
        // Room for every statement the store runs (rusqlite keeps 16 by default, fewer
        // than it has): a statement evicted is parsed again at its next use.
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        if !readonly && !memory && conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
            // SQLite falls back to read-only when it cannot write the file: say so now
            // rather than serve from memory forever.
            return Err(Unfit::from(
                "the file (or its directory) is not writable; open it with readonly=True",
            ));
        }
        // Reading the header fails on a file that is not a database; nothing is written yet.
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version > current_version() {
            return Err(Unfit::from(format!(
                "schema version {version} is newer than this engine's ({})",
                current_version()
            )));
        }
        let tables: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())?;
        if version == 0 && !tables.is_empty() {
            return Err(Unfit::from("it holds another application's tables"));
        }
        if version > 0 && !tables.iter().any(|t| t == "quotaengine_meta") {
            return Err(Unfit::from("it is not a quotaengine database"));
        }
        if readonly && version == 0 {
            return Err(Unfit::from("the database is empty"));
        }
        if version > 0 {
            check_schema(&conn, version)?;
        }
        if !readonly && version == 0 {
            // Small pages: a commit writes a few rows, and each WAL frame is a page.
            conn.execute_batch("PRAGMA page_size = 1024")?;
        }
        if !readonly {
            // SPEC §10: WAL. Set only now: switching journal mode writes the file header.
            let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
            if !memory && !mode.eq_ignore_ascii_case("wal") {
                return Err(Unfit::from(format!("cannot use WAL mode (got {mode})")));
            }
        }
        // NORMAL in WAL mode: a commit survives a crash of the process (not of the OS).
        // Checkpoint less often than SQLite's default (each one fsyncs twice).
        conn.execute_batch(
            "PRAGMA synchronous = NORMAL; PRAGMA temp_store = MEMORY; PRAGMA wal_autocheckpoint = 8000;",
        )?;
        let mut store = Self {
            conn,
            readonly,
            in_section: false,
            data_version: None,
            usage_cursor: None,
            cursor_at_begin: None,
            versions: [-1; VERSIONED_TABLES.len()],
            seen: RowsSeen { stragglers: Vec::new(), newest_seen_ms: i64::MIN, untracked_until: i64::MIN },
            full_sweep_done: false,
            trims_seen: None,
            trims_at_begin: None,
            sweep_cutoff: None,
            sweep_lo: SweepCursors::default(),
            sweep_pending: None,
            sweep_more_pending: false,
            sweep_more: false,
            registry: None,
            memory,
            shm: None,
            shm_seen: None,
        };
        if !readonly {
            // A `file:` URI names no plain path to put the side file next to.
            if !memory && !path.starts_with("file:") {
                store.registry = super::registry::Registry::join(path);
            }
            store.migrate()?;
        }
        Ok(store)
    }

    fn migrate(&mut self) -> rusqlite::Result<()> {
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let result = (|| {
            // Re-read inside the lock: another process may have migrated meanwhile.
            let version: i64 = self.conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            for (i, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
                self.conn.execute_batch(sql)?;
                self.conn.execute_batch(&format!("PRAGMA user_version = {}", i + 1))?;
            }
            self.conn.execute_batch(&triggers_sql())
        })();
        match result {
            Ok(()) => self.conn.execute_batch("COMMIT"),
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }

    fn data_version(&self) -> rusqlite::Result<i64> {
        self.conn.prepare_cached("PRAGMA data_version")?.query_row([], |r| r.get(0))
    }

    /// The WAL index header now (`None` when it cannot be read: then `data_version`
    /// decides alone).
    fn shm_header(&mut self) -> Option<[u8; SHM_HEADER]> {
        if self.shm.is_none() {
            let path = self.conn.path().filter(|p| !p.is_empty())?;
            self.shm = shm_file(&format!("{path}-shm"));
        }
        let mut hdr = [0u8; SHM_HEADER];
        read_exact_at(self.shm.as_ref()?, &mut hdr)?;
        Some(hdr)
    }

    /// `data_version` with the WAL index header read just before it: while the
    /// header stays the same, nothing was committed after that `data_version`.
    fn versioned_header(&mut self) -> rusqlite::Result<(Option<[u8; SHM_HEADER]>, i64)> {
        let hdr = self.shm_header();
        Ok((hdr, self.data_version()?))
    }

    /// Streams the usage rows `sql` selects to `f` (none is kept here: a load of a
    /// month of rows costs the windows' counters, not the rows); returns the largest id.
    fn read_usage(&mut self, sql: &str, arg: i64, f: &mut dyn FnMut(UsageRow)) -> rusqlite::Result<i64> {
        let (conn, seen) = (&self.conn, &mut self.seen);
        (|| {
            let mut stmt = conn.prepare_cached(sql)?;
            let mut rows = stmt.query([arg])?;
            let mut max_id = 0;
            let mut names = Interner::default();
            while let Some(r) = rows.next()? {
                let id: i64 = r.get(0)?;
                max_id = max_id.max(id);
                let u = usage_row(r, &mut names)?;
                seen.note(id, &u);
                f(u);
            }
            Ok(max_id)
        })()
    }

    fn read_leases(&self) -> rusqlite::Result<Vec<LeaseRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, platform, model_id, key_id, tokens, created_at_ms, expires_at_ms, output_tokens, cost, \
             tenants FROM quota_leases",
        )?;
        let mut names = Interner::default();
        let mut rows = stmt.query([])?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            out.push(LeaseRow {
                id: r.get(0)?,
                platform: names.get(r.get_ref(1)?.as_str()?),
                model_id: names.get(r.get_ref(2)?.as_str()?),
                key_id: r.get(3)?,
                tokens: r.get(4)?,
                output_tokens: r.get(7)?,
                cost: r.get::<_, Option<i64>>(8)?.unwrap_or(0),
                created_at_ms: r.get(5)?,
                expires_at_ms: r.get(6)?,
                tenants: names.tenants(r.get_ref(9)?),
            });
        }
        Ok(out)
    }

    fn read_cooldowns(&self) -> rusqlite::Result<Vec<CooldownRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT platform, model_id, key_id, expires_at_ms, source, set_at_ms FROM rate_limit_cooldowns",
        )?;
        let mut rows = stmt.query([])?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let source: String = r.get(4)?;
            out.push(CooldownRow {
                platform: Arc::from(r.get_ref(0)?.as_str()?),
                model_id: Arc::from(r.get_ref(1)?.as_str()?),
                key_id: r.get(2)?,
                expires_at_ms: r.get(3)?,
                source: source.parse().unwrap_or(CooldownSource::Heuristic),
                set_at_ms: r.get(5)?,
            });
        }
        Ok(out)
    }

    fn read_keys(&self) -> rusqlite::Result<Vec<KeyInfo>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT key_id, platform, base_url, label, enabled, account, concurrency_cap FROM api_keys",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(KeyInfo {
                key_id: r.get(0)?,
                platform: r.get(1)?,
                base_url: r.get(2)?,
                label: r.get(3)?,
                enabled: r.get::<_, Option<i64>>(4)?.unwrap_or(1) != 0,
                account: r.get(5)?,
                concurrency_cap: r.get(6)?,
            })
        })?;
        rows.collect()
    }

    fn read_models(&self) -> rusqlite::Result<Vec<ModelInfo>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT platform, model_id, rpm_limit, rpd_limit, tpm_limit, tpd_limit, monthly_token_budget, limits \
             FROM models",
        )?;
        let rows = stmt.query_map([], |r| {
            let others: Option<String> = r.get(7)?;
            // The classic four's columns, in their gate order.
            let classic = [r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?];
            // A row a plain writer spoiled keeps its classic four.
            let others = others.as_deref().map(decode_limits).and_then(|l| l.ok()).unwrap_or_default();
            Ok(ModelInfo {
                platform: r.get(0)?,
                model_id: r.get(1)?,
                limits: LimitSet::stored(classic, others),
                monthly_token_budget: r.get(6)?,
            })
        })?;
        rows.collect()
    }

    fn read_caps(&self) -> rusqlite::Result<Vec<(String, CapOverrides)>> {
        let mut stmt = self.conn.prepare_cached("SELECT platform, caps FROM provider_caps")?;
        let rows = stmt.query_map([], |r| {
            let caps: Option<String> = r.get(1)?;
            // A row a plain writer spoiled sets no cap.
            Ok((
                r.get::<_, String>(0)?,
                caps.as_deref().map(decode_caps).and_then(|c| c.ok()).unwrap_or_default(),
            ))
        })?;
        rows.collect()
    }

    /// The observed quota rows (SPEC §8.2), of one platform or all.
    fn read_quota_states(&self, platform: Option<&str>) -> rusqlite::Result<Vec<QuotaStateRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT platform, key_id, pool_key, metric, limit_value, remaining, reset_at_ms, source, confidence, \
             observed_at_ms FROM provider_quota_state WHERE ?1 IS NULL OR platform = ?1 \
             ORDER BY platform, key_id, pool_key, metric",
        )?;
        let rows = stmt.query_map([platform], |r| {
            Ok(QuotaStateRow {
                platform: r.get(0)?,
                key_id: r.get(1)?,
                pool_key: r.get(2)?,
                metric: r.get(3)?,
                limit: r.get(4)?,
                remaining: r.get(5)?,
                reset_at_ms: r.get(6)?,
                source: r.get(7)?,
                confidence: r.get(8)?,
                observed_at_ms: r.get(9)?,
            })
        })?;
        rows.collect()
    }

    /// The stored model prices (SPEC 23.1). A row a plain writer spoiled (a negative
    /// or non-integer price) prices nothing.
    fn read_prices(&self) -> rusqlite::Result<Vec<(String, String, Prices)>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT platform, model_id, input_pps, output_pps, cached_input_pps, per_request_pps \
             FROM model_prices WHERE MIN(input_pps, output_pps, cached_input_pps, per_request_pps) >= 0 \
             AND typeof(input_pps) = 'integer' AND typeof(output_pps) = 'integer' \
             AND typeof(cached_input_pps) = 'integer' AND typeof(per_request_pps) = 'integer'",
        )?;
        let rows = stmt.query_map([], |r| {
            let prices = Prices {
                input: r.get(2)?,
                output: r.get(3)?,
                cached_input: r.get(4)?,
                per_request: r.get(5)?,
            };
            Ok((r.get(0)?, r.get(1)?, prices))
        })?;
        rows.collect()
    }

    /// SPEC 23.3: every platform's limits; a row a plain writer spoiled declares none.
    fn read_platform_limits(&self) -> rusqlite::Result<Vec<(String, Vec<Limit>)>> {
        let mut stmt = self.conn.prepare_cached("SELECT platform, limits FROM platform_limits")?;
        let rows = stmt.query_map([], |r| {
            let text: Option<String> = r.get(1)?;
            Ok((
                r.get::<_, String>(0)?,
                text.as_deref().and_then(|t| decode_limits(t).ok()).unwrap_or_default(),
            ))
        })?;
        rows.collect()
    }

    /// SPEC 23.2: every tenant's (and pattern's) declaration; a row a plain writer
    /// spoiled declares no limits.
    fn read_tenant_limits(&self) -> rusqlite::Result<Vec<TenantLimitsRow>> {
        let mut stmt = self.conn.prepare_cached("SELECT tenant, limits, tz FROM tenant_limits")?;
        let rows = stmt.query_map([], |r| {
            let text: Option<String> = r.get(1)?;
            Ok(TenantLimitsRow {
                tenant: r.get(0)?,
                limits: text.as_deref().and_then(|t| decode_limits(t).ok()).unwrap_or_default(),
                tz: r.get(2)?,
            })
        })?;
        rows.collect()
    }

    fn read_history(&self) -> rusqlite::Result<Vec<HistoryRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT platform, model_id, key_id, kind, hit_at_ms, value FROM failure_history",
        )?;
        let mut rows = stmt.query([])?;
        let mut names = Interner::default();
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let Some(kind) = HistoryKind::parse(r.get_ref(3)?.as_str()?) else { continue };
            out.push(HistoryRow {
                platform: names.get(r.get_ref(0)?.as_str()?),
                model_id: names.get(r.get_ref(1)?.as_str()?),
                key_id: r.get(2)?,
                kind,
                hit_at_ms: r.get(4)?,
                value: r.get(5)?,
            });
        }
        Ok(out)
    }

    fn pull_inner(&mut self) -> rusqlite::Result<Changes> {
        let (hdr, dv) = self.versioned_header()?;
        let mut changes = Changes::default();
        if self.data_version == Some(dv) {
            self.shm_seen = hdr;
            return Ok(changes);
        }
        let mut versions = self.versions;
        let (mut trims, mut trimmed_to) = (0, 0);
        let mut quota_counted = false;
        {
            let mut stmt = self.conn.prepare_cached("SELECT name, version FROM quotaengine_meta")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let name = r.get_ref(0)?.as_str()?;
                if let Some(i) = VERSIONED_TABLES.iter().position(|t| *t == name) {
                    versions[i] = r.get(1)?;
                    quota_counted |= i == QUOTA_TABLE;
                } else if name == "usage_trims" {
                    trims = r.get(1)?;
                } else if name == "usage_trimmed_to" {
                    trimmed_to = r.get(1)?;
                }
            }
        }
        if self.trims_seen.is_some_and(|seen| seen != trims) {
            // A sweep deleted the newest rows since: ids above what it left are new.
            if let Some(cur) = self.usage_cursor.as_mut() {
                *cur = (*cur).min(trimmed_to);
            }
            // And the retention sweep's classes start over.
            self.sweep_lo = SweepCursors::default();
        }
        self.trims_seen = Some(trims);
        self.trims_at_begin = self.trims_seen;
        if let Some(cursor) = self.usage_cursor {
            let newest: i64 = self
                .conn
                .prepare_cached("SELECT COALESCE(MAX(id), 0) FROM rate_limit_usage")?
                .query_row([], |r| r.get(0))?;
            if newest < cursor {
                // Someone emptied the table behind our back: follow from the start.
                self.usage_cursor = Some(0);
                self.sweep_lo = SweepCursors::default();
            }
            let cursor = self.usage_cursor.unwrap_or(0);
            let mut rows = Vec::new();
            let max_id = self.read_usage(
                "SELECT id, platform, model_id, key_id, kind, tokens, created_at_ms, input_tokens, \
                 output_tokens, cached_tokens, cost, tenants FROM rate_limit_usage WHERE id > ?1 ORDER BY id",
                cursor,
                &mut |row| rows.push(row),
            )?;
            self.usage_cursor = Some(cursor.max(max_id));
            self.cursor_at_begin = self.usage_cursor;
            changes.usage = rows;
        }
        changes.leases = Some(self.read_leases()?);
        if versions[0] != self.versions[0] {
            changes.cooldowns = Some(self.read_cooldowns()?);
        }
        if versions[1] != self.versions[1] {
            changes.keys = Some(self.read_keys()?);
        }
        if versions[2] != self.versions[2] {
            changes.models = Some(self.read_models()?);
        }
        if versions[3] != self.versions[3] {
            changes.caps = Some(self.read_caps()?);
        }
        if versions[4] != self.versions[4] {
            changes.history = Some(self.read_history()?);
        }
        if versions[5] != self.versions[5] {
            let mut stmt = self.conn.prepare_cached("SELECT platform, tz FROM platform_calendars")?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            changes.calendars = Some(rows.collect::<rusqlite::Result<Vec<_>>>()?);
        }
        if versions[6] != self.versions[6] {
            let mut stmt = self.conn.prepare_cached("SELECT priority, fraction FROM priority_reserves")?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            changes.priorities = Some(rows.collect::<rusqlite::Result<Vec<_>>>()?);
        }
        // A file no writer of this engine opened yet counts no quota changes (see
        // `triggers_sql`): its quota rows are read at every change.
        if versions[QUOTA_TABLE] != self.versions[QUOTA_TABLE] || !quota_counted {
            changes.quota_states = Some(self.read_quota_states(None)?);
        }
        if versions[8] != self.versions[8] {
            changes.prices = Some(self.read_prices()?);
        }
        if versions[9] != self.versions[9] {
            changes.platform_limits = Some(self.read_platform_limits()?);
        }
        if versions[10] != self.versions[10] {
            changes.tenant_limits = Some(self.read_tenant_limits()?);
        }
        self.versions = versions;
        self.data_version = Some(dv);
        self.shm_seen = hdr;
        Ok(changes)
    }
}

/// Refuses a file whose pages are damaged, or whose tables are not the ones this
/// engine's migrations made at `version` (same table names, other columns: another
/// application's file). Reads only.
fn check_schema(conn: &Connection, version: i64) -> Result<(), Unfit> {
    let ok: String = conn.query_row("PRAGMA quick_check(1)", [], |r| r.get(0))?;
    if ok != "ok" {
        return Err(Unfit(format!("the file is damaged ({ok})")));
    }
    // The expected schema: this engine's migrations up to `version`, in memory.
    let expected = Connection::open_in_memory()?;
    for sql in MIGRATIONS.iter().take(version.max(0) as usize) {
        expected.execute_batch(sql)?;
    }
    let columns = |c: &Connection, table: &str| -> rusqlite::Result<Vec<String>> {
        let mut stmt = c.prepare("SELECT name FROM pragma_table_info(?1) ORDER BY cid")?;
        let rows = stmt.query_map([table], |r| r.get(0))?;
        rows.collect()
    };
    let tables: Vec<String> = expected
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())?;
    for t in tables {
        let want = columns(&expected, &t)?;
        let have = columns(conn, &t)?;
        if have.is_empty() {
            return Err(Unfit(format!("table {t} is missing: not a quotaengine database")));
        }
        if have != want {
            return Err(Unfit(format!(
                "table {t} has columns {have:?}, expected {want:?}: another application's database"
            )));
        }
    }
    Ok(())
}

/// A `rate_limit_usage` row read as `id, platform, model_id, key_id, kind, tokens,
/// created_at_ms, input_tokens, output_tokens, cached_tokens, cost, tenants`: a
/// `request` row is one request (its `tokens` column is not read: it is 0, or 1 in a
/// row an older writer made).
fn usage_row(r: &rusqlite::Row<'_>, names: &mut Interner) -> rusqlite::Result<UsageRow> {
    let request = r.get_ref(4)?.as_str()? == "request";
    Ok(UsageRow {
        platform: names.get(r.get_ref(1)?.as_str()?),
        model_id: names.get(r.get_ref(2)?.as_str()?),
        key_id: r.get(3)?,
        kind: if request { UsageKind::Request } else { UsageKind::Tokens },
        tokens: if request { 0 } else { r.get::<_, Option<i64>>(5)?.unwrap_or(0) },
        count: 1,
        created_at_ms: r.get(6)?,
        kinds: TokenKinds { input: r.get(7)?, output: r.get(8)?, cached: r.get(9)? },
        cost: r.get::<_, Option<i64>>(10)?.unwrap_or(0),
        tenants: names.tenants(r.get_ref(11)?),
    })
}

/// Shares one allocation per distinct name (and tenant list) within a batch of rows.
#[derive(Default)]
struct Interner {
    names: std::collections::HashSet<Arc<str>>,
    tenants: tenants::TenantLists,
}

impl Interner {
    /// One shared copy per distinct name: a read of millions of rows over many routes
    /// holds as many names as there are routes, not one per row.
    fn get(&mut self, s: &str) -> Arc<str> {
        intern(&mut self.names, s)
    }

    /// A `tenants` column's list (SPEC 23.2), one shared copy per distinct value.
    fn tenants(&mut self, v: rusqlite::types::ValueRef<'_>) -> TenantList {
        let names = &mut self.names;
        self.tenants.get(v, |n| intern(names, n))
    }
}

fn intern(names: &mut std::collections::HashSet<Arc<str>>, s: &str) -> Arc<str> {
    if let Some(a) = names.get(s) {
        return a.clone();
    }
    let a: Arc<str> = Arc::from(s);
    names.insert(a.clone());
    a
}

/// Where each class of the retention sweep starts (SPEC 14.2, 24.3: a kept model, a
/// kept tenant, or every other model): no row of a class below its id is older than
/// the class's last cut-off, but those another class kept longer (that class deletes
/// them), so the next sweep of the class scans from there.
#[derive(Debug, Default, Clone)]
struct SweepCursors {
    /// The kept models and tenants these are for: another set starts over.
    kept: Vec<SweepName>,
    /// Per class (`None`: every model not kept), the lowest id a row of it may have.
    lo: HashMap<SweepClass, i64>,
}

/// A class of the retention sweep: a kept model (platform, model, `None`) or tenant
/// (empty, empty, its name), or `None` for every model not kept.
type SweepClass = Option<SweepName>;
type SweepName = (Arc<str>, Arc<str>, Option<Arc<str>>);

/// Retention without a time index: rows arrive in id order and almost in time order;
/// the few stamped well before the newest seen ("stragglers": another process's slow
/// clock, a plain sqlite3 insert, rows written after an outage) are remembered by id.
/// Kept apart from the connection, so that rows stream to the engine while it reads.
struct RowsSeen {
    /// At least the newest time of any row below the ones still to come (an
    /// overestimate only makes more stragglers).
    newest_seen_ms: i64,
    /// The newest time of a straggler that could not be remembered (past
    /// `MAX_STRAGGLERS`): sweeps scan the table until their cutoff passes it.
    untracked_until: i64,
    stragglers: Vec<Straggler>,
}

impl RowsSeen {
    /// A row `id` was seen.
    fn note(&mut self, id: i64, u: &UsageRow) {
        let t = u.created_at_ms;
        if t.saturating_add(STRAGGLER_SLACK_MS) < self.newest_seen_ms {
            if self.stragglers.len() < MAX_STRAGGLERS {
                let (platform, model_id, tenants) =
                    (u.platform.clone(), u.model_id.clone(), u.tenants.clone());
                self.stragglers.push(Straggler { id, t, platform, model_id, tenants });
            } else {
                self.untracked_until = self.untracked_until.max(t);
            }
        } else {
            self.newest_seen_ms = self.newest_seen_ms.max(t);
        }
    }
}

/// A row stamped well before the rows below it, remembered by id with its route's
/// model and its tenants (retention deletes it at their cut-off, SPEC 14.2, 24.3).
struct Straggler {
    id: i64,
    t: i64,
    platform: Arc<str>,
    model_id: Arc<str>,
    tenants: crate::core::tenants::TenantList,
}

impl Store for SqliteStore {
    fn readonly(&self) -> bool {
        self.readonly
    }

    fn changed(&mut self) -> StoreResult<bool> {
        let Some(seen) = self.data_version else { return Ok(true) };
        if self.shm_seen.is_some() && self.shm_header() == self.shm_seen {
            // A read of a page the kernel holds, against a statement.
            return Ok(false);
        }
        // Changed, or our own commit: `data_version` tells.
        let (hdr, dv) = self.versioned_header()?;
        if dv != seen {
            return Ok(true);
        }
        self.shm_seen = hdr;
        Ok(false)
    }

    fn begin(&mut self, write: bool) -> StoreResult<()> {
        if write && self.readonly {
            return Err(StoreError::ReadOnly);
        }
        if self.in_section {
            self.rollback();
        }
        let sql = if write { "BEGIN IMMEDIATE" } else { "BEGIN" };
        self.conn.prepare_cached(sql)?.execute([])?;
        self.in_section = true;
        Ok(())
    }

    fn sweep_unfinished(&mut self) -> bool {
        std::mem::take(&mut self.sweep_more)
    }

    fn sole_writer(&mut self) -> bool {
        // An in-memory database is this connection's alone.
        self.registry.as_ref().map_or(self.memory, |r| r.alone())
    }

    fn commit(&mut self) -> StoreResult<()> {
        if !self.in_section {
            return Ok(());
        }
        match self.conn.prepare_cached("COMMIT").and_then(|mut s| s.execute([])) {
            Ok(_) => {
                self.in_section = false;
                self.cursor_at_begin = self.usage_cursor;
                self.trims_at_begin = self.trims_seen;
                if let Some((before, kept)) = self.sweep_cutoff.take() {
                    // What the sweep deleted: each straggler older than its cut-off.
                    self.seen.stragglers.retain(|s| {
                        s.t >= super::usage_cutoff(&kept, before, &s.platform, &s.model_id, &s.tenants)
                    });
                    self.full_sweep_done = true;
                }
                if let Some(cursors) = self.sweep_pending.take() {
                    self.sweep_lo = cursors;
                    self.sweep_more = std::mem::take(&mut self.sweep_more_pending);
                }
                Ok(())
            }
            Err(e) => {
                self.rollback();
                Err(e.into())
            }
        }
    }

    fn rollback(&mut self) {
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        self.in_section = false;
        self.sweep_cutoff = None;
        self.sweep_pending = None;
        self.sweep_more_pending = false;
        self.usage_cursor = self.cursor_at_begin;
        self.trims_seen = self.trims_at_begin;
        // What we delivered may include rows of the abandoned section: re-read on next pull.
        self.data_version = None;
        self.shm_seen = None;
        self.versions = [-1; VERSIONED_TABLES.len()];
    }

    fn pull(&mut self) -> StoreResult<Changes> {
        Ok(self.pull_inner()?)
    }

    fn load_usage_since(&mut self, since_ms: i64, f: &mut dyn FnMut(UsageRow)) -> StoreResult<()> {
        // The rows stamped `since_ms` or later are read again in id order: whether one
        // is a straggler depends on the rows below it only, not on rows read before
        // (a reload after a longer window was declared would otherwise make a month of
        // rows stragglers, and every sweep a scan of the table).
        self.seen.stragglers.retain(|s| s.t < since_ms);
        self.seen.newest_seen_ms = i64::MIN;
        // The rows and the cursor come from one snapshot: outside a section (a read
        // that found nothing changed opens none), another engine's commit between the
        // two reads would move the cursor past rows never loaded, and this engine
        // would stop counting them (an overshoot).
        let own_snapshot = self.conn.is_autocommit();
        if own_snapshot {
            self.conn.execute_batch("BEGIN DEFERRED")?;
        }
        let loaded = (|| -> rusqlite::Result<i64> {
            self.read_usage(
                "SELECT id, platform, model_id, key_id, kind, tokens, created_at_ms, input_tokens, output_tokens, \
                 cached_tokens, cost, tenants FROM rate_limit_usage \
                 WHERE id >= COALESCE((SELECT id FROM rate_limit_usage WHERE created_at_ms >= ?1 ORDER BY id LIMIT 1), \
                 9223372036854775807) AND created_at_ms >= ?1 ORDER BY id",
                since_ms,
                f,
            )?;
            self.conn.query_row("SELECT COALESCE(MAX(id), 0) FROM rate_limit_usage", [], |r| r.get(0))
        })();
        if own_snapshot {
            let _ = self.conn.execute_batch(if loaded.is_ok() { "COMMIT" } else { "ROLLBACK" });
        }
        let max_id = loaded?;
        // Rows not loaded are stamped before `since_ms`: a row stamped well before
        // that, arriving later, is a straggler.
        self.seen.newest_seen_ms = self.seen.newest_seen_ms.max(since_ms);
        self.usage_cursor = Some(max_id);
        self.cursor_at_begin = self.usage_cursor;
        Ok(())
    }

    fn write(&mut self, w: &Write) -> StoreResult<i64> {
        if self.readonly {
            return Err(StoreError::ReadOnly);
        }
        Ok(self.apply(w)?)
    }

    fn write_all(&mut self, ws: &[&Write]) -> StoreResult<()> {
        if self.readonly {
            return Err(StoreError::ReadOnly);
        }
        // Runs of consecutive usage rows go in chunks of one statement each.
        let mut rest = ws;
        while let Some((first, tail)) = rest.split_first() {
            let run = rest.iter().take_while(|w| matches!(w, Write::Usage(_))).count();
            if run > 1 {
                self.insert_usage(rest[..run].iter().filter_map(|w| match w {
                    Write::Usage(u) => Some(u),
                    _ => None,
                }))?;
                rest = &rest[run..];
            } else {
                self.apply(first)?;
                rest = tail;
            }
        }
        Ok(())
    }

    fn set_busy_timeout(&mut self, ms: i64) {
        let _ = self.conn.busy_timeout(busy_timeout(ms));
    }

    fn after_fork(&mut self) -> bool {
        if self.memory {
            return true;
        }
        // SQLite's rule: a connection is never used across fork(). Closing it now,
        // before the child opens one of its own, also clears the lock state SQLite
        // keeps per process and file, which the child inherited from the parent. It
        // writes nothing (the fork hook ended every transaction first), and the locks
        // it lets go of are the parent's, which the child never held.
        if let Ok(inert) = Connection::open_in_memory() {
            drop(std::mem::replace(&mut self.conn, inert));
        }
        // The registration's flock belongs to an open file description shared with
        // the parent: it stays as it is (the fd is left open, never unlocked).
        if let Some(r) = self.registry.take() {
            std::mem::forget(r);
        }
        self.readonly = true;
        false
    }

    fn usage_events(&mut self, f: &UsageFilter) -> StoreResult<Vec<UsageRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, platform, model_id, key_id, kind, tokens, created_at_ms, input_tokens, output_tokens, \
             cached_tokens, cost, tenants FROM rate_limit_usage \
             WHERE id >= COALESCE((SELECT id FROM rate_limit_usage WHERE created_at_ms >= ?1 ORDER BY id LIMIT 1), \
             9223372036854775807) AND created_at_ms >= ?1 AND created_at_ms < ?2 AND (?3 IS NULL OR platform = ?3) \
             AND (?4 IS NULL OR model_id = ?4) AND (?5 IS NULL OR key_id = ?5) ORDER BY created_at_ms, id",
        )?;
        let mut rows = stmt.query(params![
            f.since_ms.unwrap_or(i64::MIN),
            f.until_ms.unwrap_or(i64::MAX),
            f.platform,
            f.model_id,
            f.key_id
        ])?;
        let mut out = Vec::new();
        let mut names = Interner::default();
        while let Some(r) = rows.next()? {
            out.push(usage_row(r, &mut names)?);
        }
        Ok(out)
    }

    fn quota_states(&mut self, platform: Option<&str>) -> StoreResult<Vec<QuotaStateRow>> {
        Ok(self.read_quota_states(platform)?)
    }

    fn server_logs(&mut self, limit: i64) -> StoreResult<Vec<(i64, LogRow, Option<String>)>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, level, source, provider, model, event, request_id, message, created_at_ms \
             FROM server_logs ORDER BY created_at_ms DESC, id DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map([limit], |r| {
            let level: Option<String> = r.get(1)?;
            Ok((
                r.get::<_, i64>(0)?,
                LogRow {
                    level: match level.as_deref() {
                        Some("error") => "error",
                        Some("warn") | Some("warning") => "warn",
                        _ => "info",
                    },
                    source: r.get::<_, Option<String>>(2)?.unwrap_or_default(),
                    provider: r.get(3)?,
                    model: r.get(4)?,
                    event: r.get(5)?,
                    message: r.get::<_, Option<String>>(7)?.unwrap_or_default(),
                    created_at_ms: r.get::<_, Option<i64>>(8)?.unwrap_or(0),
                },
                r.get::<_, Option<String>>(6)?,
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }
}

/// The process's one read handle on a WAL index file, kept open for the life of the
/// process. Closing any descriptor of a file drops every POSIX lock the process holds
/// on it, and SQLite holds its WAL read locks on `-shm` (for this engine's connection
/// and for any other in the process: another engine, Python's `sqlite3`): closing a
/// handle of our own when an engine closes would silently drop those. A `-shm` that
/// SQLite removed and made anew (the last connection closed meanwhile) is another
/// file: it gets a handle of its own.
fn shm_file(path: &str) -> Option<Arc<std::fs::File>> {
    type Open = Vec<(String, Arc<std::fs::File>)>;
    static OPEN: parking_lot::Mutex<Open> = parking_lot::Mutex::new(Vec::new());
    let now = std::fs::metadata(path).ok()?;
    let mut open = OPEN.lock();
    if let Some((_, f)) =
        open.iter().find(|(p, f)| p == path && f.metadata().is_ok_and(|m| same_inode(&m, &now)))
    {
        return Some(f.clone());
    }
    let f = Arc::new(std::fs::File::open(path).ok()?);
    open.push((path.to_string(), f.clone()));
    Some(f)
}

#[cfg(unix)]
fn same_inode(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.ino() == b.ino() && a.dev() == b.dev()
}

#[cfg(not(unix))]
fn same_inode(_a: &std::fs::Metadata, _b: &std::fs::Metadata) -> bool {
    false
}

#[cfg(unix)]
fn read_exact_at(f: &std::fs::File, buf: &mut [u8]) -> Option<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, 0).ok()
}

#[cfg(not(unix))]
fn read_exact_at(_f: &std::fs::File, _buf: &mut [u8]) -> Option<()> {
    None
}

#[cfg(test)]
mod tests;
