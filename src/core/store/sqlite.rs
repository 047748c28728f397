//! The SQLite backend: one connection per engine, WAL mode, the system's SQLite.
use super::schema::{current_version, triggers_sql, MIGRATIONS, VERSIONED_TABLES};
use super::{
    Changes, CooldownRow, HistoryKind, HistoryRow, KeptUsage, LeaseRow, LogRow, QuotaStateRow, Store,
    StoreResult, TokenKinds, UsageFilter, UsageKind, UsageRow, Write,
};
use crate::core::error::StoreError;
use crate::core::limits::{decode_limits, encode_limits};
use crate::core::types::{CapOverrides, CapSetting, CooldownSource, KeyInfo, Limits, ModelInfo};
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, Connection, OpenFlags, OptionalExtension};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

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

/// The first copy of the WAL index header: every commit changes it (frame count and
/// checksums; a restarted WAL, its salts).
const SHM_HEADER: usize = 48;

/// Usage rows per multi-row insert when many are written at once.
const USAGE_CHUNK: usize = 32;

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

fn incompatible(path: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::Incompatible(format!("cannot open {path:?} as a quotaengine database: {why}"))
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
        let result = Self::open_inner(path, readonly, busy_timeout_ms);
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

    fn open_inner(path: &str, readonly: bool, busy_timeout_ms: i64) -> StoreResult<Self> {
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
            return Err(incompatible(path, "no such file"));
        }
        let conn = Connection::open_with_flags(path, flags).map_err(|e| incompatible(path, e))?;
        conn.busy_timeout(busy_timeout(busy_timeout_ms)).map_err(|e| incompatible(path, e))?;
        if !readonly && !memory && conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
            // SQLite falls back to read-only when it cannot write the file: say so now
            // rather than serve from memory forever.
            return Err(incompatible(
                path,
                "the file (or its directory) is not writable; open it with readonly=True",
            ));
        }
        // Reading the header fails on a file that is not a database; nothing is written yet.
        let version: i64 =
            conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(|e| incompatible(path, e))?;
        if version > current_version() {
            return Err(incompatible(
                path,
                format!("schema version {version} is newer than this engine's ({})", current_version()),
            ));
        }
        let tables: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(|e| incompatible(path, e))?;
        if version == 0 && !tables.is_empty() {
            return Err(incompatible(path, "it holds another application's tables"));
        }
        if version > 0 && !tables.iter().any(|t| t == "quotaengine_meta") {
            return Err(incompatible(path, "it is not a quotaengine database"));
        }
        if readonly && version == 0 {
            return Err(incompatible(path, "the database is empty"));
        }
        if version > 0 {
            check_schema(&conn, version).map_err(|e| incompatible(path, e))?;
        }
        if !readonly && version == 0 {
            // Small pages: a commit writes a few rows, and each WAL frame is a page.
            conn.execute_batch("PRAGMA page_size = 1024").map_err(|e| incompatible(path, e))?;
        }
        if !readonly {
            // SPEC §10: WAL. Set only now: switching journal mode writes the file header.
            let mode: String = conn
                .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
                .map_err(|e| incompatible(path, e))?;
            if !memory && !mode.eq_ignore_ascii_case("wal") {
                return Err(incompatible(path, format!("cannot use WAL mode (got {mode})")));
            }
        }
        // NORMAL in WAL mode: a commit survives a crash of the process (not of the OS).
        // Checkpoint less often than SQLite's default (each one fsyncs twice).
        conn.execute_batch(
            "PRAGMA synchronous = NORMAL; PRAGMA temp_store = MEMORY; PRAGMA wal_autocheckpoint = 8000;",
        )
        .map_err(|e| incompatible(path, e))?;
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
            store.migrate().map_err(|e| incompatible(path, e))?;
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
            "SELECT id, platform, model_id, key_id, tokens, created_at_ms, expires_at_ms, output_tokens \
             FROM quota_leases",
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
                created_at_ms: r.get(5)?,
                expires_at_ms: r.get(6)?,
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
            Ok(ModelInfo {
                platform: r.get(0)?,
                model_id: r.get(1)?,
                limits: Limits { rpm: r.get(2)?, rpd: r.get(3)?, tpm: r.get(4)?, tpd: r.get(5)? },
                // A row a plain writer spoiled keeps its classic four.
                others: others.as_deref().map(decode_limits).and_then(|l| l.ok()).unwrap_or_default(),
                monthly_token_budget: r.get(6)?,
            })
        })?;
        rows.collect()
    }

    fn read_caps(&self) -> rusqlite::Result<Vec<(String, CapOverrides)>> {
        fn setting(v: Option<i64>) -> CapSetting {
            match v {
                None => CapSetting::Inherit,
                Some(v) if v < 0 => CapSetting::NoCap,
                Some(v) => CapSetting::Cap(v),
            }
        }
        let mut stmt = self.conn.prepare_cached(
            "SELECT platform, daily_requests, minute_requests, daily_tokens FROM provider_caps",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                CapOverrides {
                    daily_requests: setting(r.get(1)?),
                    minute_requests: setting(r.get(2)?),
                    daily_tokens: setting(r.get(3)?),
                },
            ))
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
        {
            let mut stmt = self.conn.prepare_cached("SELECT name, version FROM quotaengine_meta")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let name = r.get_ref(0)?.as_str()?;
                if let Some(i) = VERSIONED_TABLES.iter().position(|t| *t == name) {
                    versions[i] = r.get(1)?;
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
                 output_tokens, cached_tokens FROM rate_limit_usage WHERE id > ?1 ORDER BY id",
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
        self.versions = versions;
        self.data_version = Some(dv);
        self.shm_seen = hdr;
        Ok(changes)
    }

    /// Inserts usage rows, a merged request row as that many rows of one request
    /// (SPEC §10): full chunks of `USAGE_CHUNK` rows with one statement each, the
    /// rest one by one.
    fn insert_usage<'a>(&mut self, rows: impl Iterator<Item = &'a UsageRow>) -> rusqlite::Result<()> {
        let mut chunk: Vec<&UsageRow> = Vec::with_capacity(USAGE_CHUNK);
        for u in rows {
            for _ in 0..copies(u) {
                chunk.push(u);
                if chunk.len() == USAGE_CHUNK {
                    self.insert_usage_chunk(&chunk)?;
                    chunk.clear();
                }
            }
        }
        for u in chunk {
            self.insert_usage_row(u)?;
        }
        Ok(())
    }

    fn insert_usage_row(&mut self, u: &UsageRow) -> rusqlite::Result<i64> {
        let tokens = u.tokens * i64::from(u.kind == UsageKind::Tokens);
        if u.kinds.is_empty() {
            // The common row (a request, or a total only): its split columns stay NULL.
            self.conn
                .prepare_cached(
                    "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?
                .execute(params![
                    &*u.platform,
                    &*u.model_id,
                    u.key_id,
                    u.kind.as_str(),
                    tokens,
                    u.created_at_ms
                ])?;
        } else {
            self.conn
                .prepare_cached(
                    "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms, \
                     input_tokens, output_tokens, cached_tokens) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                )?
                .execute(params![
                    &*u.platform,
                    &*u.model_id,
                    u.key_id,
                    u.kind.as_str(),
                    tokens,
                    u.created_at_ms,
                    u.kinds.input,
                    u.kinds.output,
                    u.kinds.cached
                ])?;
        }
        let id = self.conn.last_insert_rowid();
        if let Some(cur) = self.usage_cursor.as_mut() {
            *cur = (*cur).max(id);
        }
        self.seen.note(id, u);
        Ok(id)
    }

    /// Inserts `USAGE_CHUNK` usage rows, one request each, with one statement (the
    /// split columns only when some row of the chunk has a split).
    fn insert_usage_chunk(&mut self, ws: &[&UsageRow]) -> rusqlite::Result<()> {
        static PLAIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        static SPLIT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let chunk_sql = |split: bool| {
            let (cols, row) = if split {
                (", input_tokens, output_tokens, cached_tokens", "(?, ?, ?, ?, ?, ?, ?, ?, ?)")
            } else {
                ("", "(?, ?, ?, ?, ?, ?)")
            };
            let values = vec![row; USAGE_CHUNK].join(", ");
            format!(
                "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms{cols}) \
                 VALUES {values}"
            )
        };
        let split = ws.iter().any(|u| !u.kinds.is_empty());
        let sql = if split {
            SPLIT.get_or_init(|| chunk_sql(true))
        } else {
            PLAIN.get_or_init(|| chunk_sql(false))
        };
        let width = if split { 9 } else { 6 };
        let rows = || ws.iter().copied();
        let mut stmt = self.conn.prepare_cached(sql)?;
        for (n, u) in rows().enumerate() {
            let at = n * width + 1;
            stmt.raw_bind_parameter(at, &*u.platform)?;
            stmt.raw_bind_parameter(at + 1, &*u.model_id)?;
            stmt.raw_bind_parameter(at + 2, u.key_id)?;
            stmt.raw_bind_parameter(at + 3, u.kind.as_str())?;
            stmt.raw_bind_parameter(at + 4, u.tokens * i64::from(u.kind == UsageKind::Tokens))?;
            stmt.raw_bind_parameter(at + 5, u.created_at_ms)?;
            if split {
                stmt.raw_bind_parameter(at + 6, u.kinds.input)?;
                stmt.raw_bind_parameter(at + 7, u.kinds.output)?;
                stmt.raw_bind_parameter(at + 8, u.kinds.cached)?;
            }
        }
        stmt.raw_execute()?;
        drop(stmt);
        // One statement under the write lock: the new ids are consecutive.
        let last = self.conn.last_insert_rowid();
        let first = last - ws.len() as i64 + 1;
        if let Some(cur) = self.usage_cursor.as_mut() {
            *cur = (*cur).max(last);
        }
        for (n, u) in rows().enumerate() {
            self.seen.note(first + n as i64, u);
        }
        Ok(())
    }

    fn write_inner(&mut self, w: &Write) -> rusqlite::Result<i64> {
        let c = &self.conn;
        Ok(match w {
            Write::Usage(u) if copies(u) == 1 => self.insert_usage_row(u)?,
            Write::Usage(u) => {
                self.insert_usage(std::iter::once(u))?;
                0
            }
            Write::InsertLease(l) => {
                c.prepare_cached(
                    "INSERT INTO quota_leases (id, platform, model_id, key_id, tokens, created_at_ms, expires_at_ms, \
                     output_tokens) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )?
                .execute(params![
                    l.id,
                    &*l.platform,
                    &*l.model_id,
                    l.key_id,
                    l.tokens,
                    l.created_at_ms,
                    l.expires_at_ms,
                    l.output_tokens
                ])?;
                l.id
            }
            Write::DeleteLease(id) => {
                c.prepare_cached("DELETE FROM quota_leases WHERE id = ?1")?.execute([id])? as i64
            }
            Write::UpsertCooldown(cd) => {
                c.prepare_cached(
                    "INSERT INTO rate_limit_cooldowns (platform, model_id, key_id, expires_at_ms, source, set_at_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (platform, model_id, key_id) DO UPDATE SET \
                     expires_at_ms = excluded.expires_at_ms, source = excluded.source, set_at_ms = excluded.set_at_ms",
                )?
                .execute(params![
                    &*cd.platform,
                    &*cd.model_id,
                    cd.key_id,
                    cd.expires_at_ms,
                    cd.source.as_str(),
                    cd.set_at_ms
                ])?;
                0
            }
            Write::DeleteCooldown { platform, model_id, key_id } => {
                c.prepare_cached(
                    "DELETE FROM rate_limit_cooldowns WHERE platform = ?1 AND model_id = ?2 AND key_id = ?3",
                )?
                .execute(params![&**platform, &**model_id, key_id])? as i64
            }
            Write::DeleteCooldownsForKey(key_id) => c
                .prepare_cached("DELETE FROM rate_limit_cooldowns WHERE key_id = ?1")?
                .execute([key_id])? as i64,
            Write::DeleteExpiredCooldowns(now) => c
                .prepare_cached("DELETE FROM rate_limit_cooldowns WHERE expires_at_ms <= ?1")?
                .execute([now])? as i64,
            Write::UpsertKey(k) => {
                c.prepare_cached(
                    "INSERT INTO api_keys (key_id, platform, base_url, label, enabled, account, concurrency_cap) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (key_id) DO UPDATE SET platform = excluded.platform, \
                     base_url = excluded.base_url, label = excluded.label, enabled = excluded.enabled, \
                     account = excluded.account, concurrency_cap = excluded.concurrency_cap",
                )?
                .execute(params![
                    k.key_id,
                    k.platform,
                    k.base_url,
                    k.label,
                    k.enabled as i64,
                    k.account,
                    k.concurrency_cap
                ])?;
                0
            }
            Write::UpsertModel(m) => {
                c.prepare_cached(
                    "INSERT INTO models (platform, model_id, rpm_limit, rpd_limit, tpm_limit, tpd_limit, monthly_token_budget, limits) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (platform, model_id) DO UPDATE SET \
                     rpm_limit = excluded.rpm_limit, rpd_limit = excluded.rpd_limit, tpm_limit = excluded.tpm_limit, \
                     tpd_limit = excluded.tpd_limit, monthly_token_budget = excluded.monthly_token_budget, \
                     limits = excluded.limits",
                )?
                .execute(params![
                    m.platform,
                    m.model_id,
                    m.limits.rpm,
                    m.limits.rpd,
                    m.limits.tpm,
                    m.limits.tpd,
                    m.monthly_token_budget,
                    (!m.others.is_empty()).then(|| encode_limits(&m.others)),
                ])?;
                0
            }
            Write::SetCaps(platform, caps) => {
                fn col(s: CapSetting) -> Option<i64> {
                    match s {
                        CapSetting::Inherit => None,
                        CapSetting::NoCap => Some(-1),
                        CapSetting::Cap(v) => Some(v),
                    }
                }
                c.prepare_cached(
                    "INSERT INTO provider_caps (platform, daily_requests, minute_requests, daily_tokens) \
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (platform) DO UPDATE SET daily_requests = excluded.daily_requests, \
                     minute_requests = excluded.minute_requests, daily_tokens = excluded.daily_tokens",
                )?
                .execute(params![
                    platform,
                    col(caps.daily_requests),
                    col(caps.minute_requests),
                    col(caps.daily_tokens)
                ])?;
                0
            }
            Write::ResetCaps(platform) => {
                c.prepare_cached("DELETE FROM provider_caps WHERE platform = ?1")?.execute([platform])? as i64
            }
            Write::UpsertQuotaState(q) => {
                c.prepare_cached(
                    "INSERT INTO provider_quota_state (platform, key_id, pool_key, metric, limit_value, remaining, \
                     reset_at_ms, source, confidence, observed_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
                     ON CONFLICT (platform, key_id, pool_key, metric) DO UPDATE SET limit_value = excluded.limit_value, \
                     remaining = excluded.remaining, reset_at_ms = excluded.reset_at_ms, source = excluded.source, \
                     confidence = excluded.confidence, observed_at_ms = excluded.observed_at_ms",
                )?
                .execute(params![
                    q.platform,
                    q.key_id,
                    q.pool_key,
                    q.metric,
                    q.limit,
                    q.remaining,
                    q.reset_at_ms,
                    q.source,
                    q.confidence,
                    q.observed_at_ms
                ])?;
                0
            }
            Write::InsertHistory(h) => {
                c.prepare_cached(
                    "INSERT INTO failure_history (platform, model_id, key_id, kind, hit_at_ms, value) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?
                .execute(params![
                    &*h.platform,
                    &*h.model_id,
                    h.key_id,
                    h.kind.as_str(),
                    h.hit_at_ms,
                    h.value
                ])?;
                0
            }
            Write::DeleteHistory { key_id, route, kinds } => {
                let mut n = 0;
                for k in kinds {
                    n += match route {
                        Some((p, m)) => c
                            .prepare_cached(
                                "DELETE FROM failure_history WHERE key_id = ?1 AND kind = ?2 AND platform = ?3 AND model_id = ?4",
                            )?
                            .execute(params![key_id, k.as_str(), &**p, &**m])?,
                        None => c
                            .prepare_cached("DELETE FROM failure_history WHERE key_id = ?1 AND kind = ?2")?
                            .execute(params![key_id, k.as_str()])?,
                    };
                }
                n as i64
            }
            Write::Sweep { usage_before, kept, leases_expired_before, history_before } => {
                c.prepare_cached("DELETE FROM failure_history WHERE hit_at_ms < ?1")?
                    .execute([history_before])?;
                let top = |c: &Connection| -> rusqlite::Result<i64> {
                    c.prepare_cached("SELECT COALESCE(MAX(id), 0) FROM rate_limit_usage")?
                        .query_row([], |r| r.get(0))
                };
                let top_before = top(c)?;
                // SPEC 14.2: each kept model's rows go at its own cut-off, every other
                // model's at `usage_before`. One delete per class, each from where the
                // class's rows start (a cursor), so that a month of one model's rows is
                // not scanned again at every sweep to find the others' last minute.
                let names: Vec<(Arc<str>, Arc<str>)> =
                    kept.iter().map(|k| (k.platform.clone(), k.model_id.clone())).collect();
                let mut cursors = if self.sweep_lo.kept == names {
                    self.sweep_lo.clone()
                } else {
                    SweepCursors { kept: names, lo: HashMap::new() }
                };
                let others = if kept.is_empty() {
                    "1".to_string()
                } else {
                    let each: Vec<String> = (0..kept.len())
                        .map(|i| format!("(platform = ?{} AND model_id = ?{})", 4 + 2 * i, 5 + 2 * i))
                        .collect();
                    format!("NOT ({})", each.join(" OR "))
                };
                let every_name: Vec<Value> = kept
                    .iter()
                    .flat_map(|k| [Value::Text(k.platform.to_string()), Value::Text(k.model_id.to_string())])
                    .collect();
                let classes = kept
                    .iter()
                    .map(|k| (Some((k.platform.clone(), k.model_id.clone())), k.before))
                    .chain(std::iter::once((None, *usage_before)));
                let mut n = 0;
                let mut unfinished = false;
                for (class, cutoff) in classes {
                    let (pred, names): (&str, Vec<Value>) = match &class {
                        Some((p, m)) => (
                            "platform = ?4 AND model_id = ?5",
                            vec![Value::Text(p.to_string()), Value::Text(m.to_string())],
                        ),
                        None => (&others, every_name.clone()),
                    };
                    let args = |a: i64, b: i64| -> Vec<Value> {
                        [Value::Integer(a), Value::Integer(b), Value::Integer(cutoff)]
                            .into_iter()
                            .chain(names.iter().cloned())
                            .collect()
                    };
                    let delete = format!(
                        "DELETE FROM rate_limit_usage WHERE id >= ?1 AND id < ?2 AND created_at_ms < ?3 AND {pred}"
                    );
                    // Until the first sweep has scanned the whole table, and while
                    // stragglers went untracked, rows of the class may hide anywhere.
                    let bounded = self.full_sweep_done && cutoff > self.seen.untracked_until;
                    let lo = if bounded { cursors.lo.get(&class).copied().unwrap_or(0) } else { 0 };
                    let hi = if bounded {
                        // Ids follow commit order, and a row stamped more than the slack
                        // before a row below it is a remembered straggler. So past the
                        // first id stamped at or after cutoff + slack, every other row is
                        // at or after the cutoff: the scan stops there (about a minute of
                        // rows beyond the stale ones), and stragglers go by id. At most
                        // SWEEP_CHUNK ids a sweep: the rest at the next commit.
                        let end = lo.saturating_add(SWEEP_CHUNK);
                        let found: Option<i64> = c
                            .prepare_cached(
                                "SELECT id FROM rate_limit_usage WHERE id >= ?1 AND id < ?3 \
                                 AND created_at_ms >= ?2 ORDER BY id LIMIT 1",
                            )?
                            .query_row([lo, cutoff.saturating_add(STRAGGLER_SLACK_MS), end], |r| r.get(0))
                            .optional()?;
                        match found {
                            Some(id) => id,
                            None if end <= top_before => {
                                unfinished = true;
                                end
                            }
                            None => i64::MAX,
                        }
                    } else {
                        i64::MAX
                    };
                    n += c.prepare_cached(&delete)?.execute(params_from_iter(args(lo, hi)))?;
                    if bounded {
                        // Only the class's own: a kept model's straggler is not tried again
                        // by every other class at each sweep until its own cut-off passes it.
                        let of_class = |s: &Straggler| match &class {
                            Some((p, m)) => s.platform == *p && s.model_id == *m,
                            None => {
                                !kept.iter().any(|k| s.platform == k.platform && s.model_id == k.model_id)
                            }
                        };
                        for s in self.seen.stragglers.iter().filter(|s| s.t < cutoff && of_class(s)) {
                            n += c
                                .prepare_cached(&delete)?
                                .execute(params_from_iter(args(s.id, s.id.saturating_add(1))))?;
                        }
                    }
                    // No row of the class is left below the first row stamped at or
                    // after the cutoff (below `hi`, which is one, or where a bounded
                    // step stopped): the next sweep of the class starts there.
                    let next: i64 = c
                        .prepare_cached(
                            "SELECT COALESCE((SELECT id FROM rate_limit_usage WHERE id >= ?1 AND id < ?3 \
                             AND created_at_ms >= ?2 ORDER BY id LIMIT 1), \
                             MIN(?3, (SELECT COALESCE(MAX(id), 0) + 1 FROM rate_limit_usage)))",
                        )?
                        .query_row([lo, cutoff, hi], |r| r.get(0))?;
                    cursors.lo.insert(class, next);
                }
                let top_after = top(c)?;
                if top_after < top_before {
                    // The newest rows went: SQLite will hand their ids out again. Every
                    // engine following the table by id steps back to what is left.
                    c.prepare_cached(
                        "INSERT INTO quotaengine_meta (name, version) VALUES ('usage_trims', 1) \
                         ON CONFLICT (name) DO UPDATE SET version = version + 1",
                    )?
                    .execute([])?;
                    c.prepare_cached(
                        "INSERT INTO quotaengine_meta (name, version) VALUES ('usage_trimmed_to', ?1) \
                         ON CONFLICT (name) DO UPDATE SET version = excluded.version",
                    )?
                    .execute([top_after])?;
                    let trims: i64 = c
                        .prepare_cached("SELECT version FROM quotaengine_meta WHERE name = 'usage_trims'")?
                        .query_row([], |r| r.get(0))?;
                    self.trims_seen = Some(trims);
                    if let Some(cur) = self.usage_cursor.as_mut() {
                        *cur = (*cur).min(top_after);
                    }
                    // SQLite hands the ids above what is left out again.
                    for lo in cursors.lo.values_mut() {
                        *lo = (*lo).min(top_after + 1);
                    }
                }
                self.sweep_cutoff = Some((*usage_before, kept.clone()));
                self.sweep_pending = Some(cursors);
                self.sweep_more_pending = unfinished;
                c.prepare_cached("DELETE FROM quota_leases WHERE expires_at_ms < ?1")?
                    .execute([leases_expired_before])?;
                n as i64
            }
            Write::SetCalendar { platform, zone: Some(z) } => {
                c.prepare_cached(
                    "INSERT INTO platform_calendars (platform, tz) VALUES (?1, ?2) \
                     ON CONFLICT (platform) DO UPDATE SET tz = excluded.tz",
                )?
                .execute(params![platform, z])? as i64
            }
            Write::SetCalendar { platform, zone: None } => c
                .prepare_cached("DELETE FROM platform_calendars WHERE platform = ?1")?
                .execute([platform])? as i64,
            Write::Log(l) => {
                c.prepare_cached(
                    "INSERT INTO server_logs (level, source, provider, model, event, request_id, message, created_at_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5, NULL, ?6, ?7)",
                )?
                .execute(params![l.level, l.source, l.provider, l.model, l.event, l.message, l.created_at_ms])?;
                c.last_insert_rowid()
            }
        })
    }
}

/// Refuses a file whose pages are damaged, or whose tables are not the ones this
/// engine's migrations made at `version` (same table names, other columns: another
/// application's file). Reads only.
fn check_schema(conn: &Connection, version: i64) -> std::result::Result<(), String> {
    let ok: String = conn.query_row("PRAGMA quick_check(1)", [], |r| r.get(0)).map_err(|e| e.to_string())?;
    if ok != "ok" {
        return Err(format!("the file is damaged ({ok})"));
    }
    // The expected schema: this engine's migrations up to `version`, in memory.
    let expected = Connection::open_in_memory().map_err(|e| e.to_string())?;
    for sql in MIGRATIONS.iter().take(version.max(0) as usize) {
        expected.execute_batch(sql).map_err(|e| e.to_string())?;
    }
    let columns = |c: &Connection, table: &str| -> rusqlite::Result<Vec<String>> {
        let mut stmt = c.prepare("SELECT name FROM pragma_table_info(?1) ORDER BY cid")?;
        let rows = stmt.query_map([table], |r| r.get(0))?;
        rows.collect()
    };
    let tables: Vec<String> = expected
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())
        .map_err(|e| e.to_string())?;
    for t in tables {
        let want = columns(&expected, &t).map_err(|e| e.to_string())?;
        let have = columns(conn, &t).map_err(|e| e.to_string())?;
        if have.is_empty() {
            return Err(format!("table {t} is missing: not a quotaengine database"));
        }
        if have != want {
            return Err(format!(
                "table {t} has columns {have:?}, expected {want:?}: another application's database"
            ));
        }
    }
    Ok(())
}

/// A `rate_limit_usage` row read as `id, platform, model_id, key_id, kind, tokens,
/// created_at_ms`: a `request` row is one request (its `tokens` column is not read:
/// it is 0, or 1 in a row an older writer made).
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
    })
}

/// How many `rate_limit_usage` rows a usage row is written as: one per request.
fn copies(u: &UsageRow) -> i64 {
    match u.kind {
        UsageKind::Request => u.count.max(1),
        UsageKind::Tokens => 1,
    }
}

/// Shares one allocation per distinct name within a batch of rows.
#[derive(Default)]
struct Interner(std::collections::HashSet<Arc<str>>);

impl Interner {
    /// One shared copy per distinct name: a read of millions of rows over many routes
    /// holds as many names as there are routes, not one per row.
    fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.0.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.0.insert(a.clone());
        a
    }
}

/// Where each class of the retention sweep starts (SPEC 14.2: a kept model, or every
/// other model): no row of a class below its id is older than the class's last
/// cut-off, so the next sweep of the class scans from there.
#[derive(Debug, Default, Clone)]
struct SweepCursors {
    /// The kept models these are for: another set starts over.
    kept: Vec<(Arc<str>, Arc<str>)>,
    /// Per class (`None`: every model not kept), the lowest id a row of it may have.
    lo: HashMap<SweepClass, i64>,
}

/// A class of the retention sweep: a kept model (platform, model), or `None` for
/// every model not kept.
type SweepClass = Option<(Arc<str>, Arc<str>)>;

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
                let (platform, model_id) = (u.platform.clone(), u.model_id.clone());
                self.stragglers.push(Straggler { id, t, platform, model_id });
            } else {
                self.untracked_until = self.untracked_until.max(t);
            }
        } else {
            self.newest_seen_ms = self.newest_seen_ms.max(t);
        }
    }
}

/// A row stamped well before the rows below it, remembered by id with its route's
/// model (retention deletes it at that model's cut-off, SPEC 14.2).
struct Straggler {
    id: i64,
    t: i64,
    platform: Arc<str>,
    model_id: Arc<str>,
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
                    // What the sweep deleted: each straggler older than its class's cut-off.
                    self.seen.stragglers.retain(|s| {
                        let cut = kept
                            .iter()
                            .find(|k| s.platform == k.platform && s.model_id == k.model_id)
                            .map_or(before, |k| k.before);
                        s.t >= cut
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
        self.read_usage(
            "SELECT id, platform, model_id, key_id, kind, tokens, created_at_ms, input_tokens, output_tokens, \
             cached_tokens FROM rate_limit_usage \
             WHERE id >= COALESCE((SELECT id FROM rate_limit_usage WHERE created_at_ms >= ?1 ORDER BY id LIMIT 1), \
             9223372036854775807) AND created_at_ms >= ?1 ORDER BY id",
            since_ms,
            f,
        )?;
        let max_id: i64 =
            self.conn.query_row("SELECT COALESCE(MAX(id), 0) FROM rate_limit_usage", [], |r| r.get(0))?;
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
        Ok(self.write_inner(w)?)
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
                self.write_inner(first)?;
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
             cached_tokens FROM rate_limit_usage \
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
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
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
