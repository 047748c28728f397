//! The SQLite store's writes: one codec per kind of [`Write`], each its own
//! statement(s) below, picked by [`SqliteStore::apply`].
use super::{tenants, SqliteStore, Straggler, SweepCursors, SweepName, STRAGGLER_SLACK_MS, SWEEP_CHUNK};
use crate::core::limits::{encode_caps, encode_limits};
use crate::core::store::{
    CooldownRow, HistoryKind, HistoryRow, KeptUsage, LeaseRow, LogRow, QuotaStateRow, UsageKind, UsageRow,
    Write,
};
use crate::core::types::{CapOverrides, KeyInfo, ModelInfo};
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension, Params};
use std::collections::HashMap;
use std::sync::Arc;

/// Usage rows per multi-row insert when many are written at once.
pub(super) const USAGE_CHUNK: usize = 32;

/// How many `rate_limit_usage` rows a usage row is written as: one per request.
pub(super) fn copies(u: &UsageRow) -> i64 {
    match u.kind {
        UsageKind::Request => u.count.max(1),
        UsageKind::Tokens => 1,
    }
}

impl SqliteStore {
    /// Applies one change (inside a write section). Returns the new row id of an
    /// insert, the number of rows a delete removed, 0 otherwise.
    pub(super) fn apply(&mut self, w: &Write) -> rusqlite::Result<i64> {
        match w {
            Write::Usage(u) if copies(u) == 1 => self.insert_usage_row(u, u.cost),
            Write::Usage(u) => self.insert_usage(std::iter::once(u)).map(|()| 0),
            Write::InsertLease(l) => self.insert_lease(l),
            Write::DeleteLease(id) => self.exec("DELETE FROM quota_leases WHERE id = ?1", [id]),
            Write::UpsertCooldown(c) => self.upsert_cooldown(c),
            Write::DeleteCooldown { platform, model_id, key_id } => self.exec(
                "DELETE FROM rate_limit_cooldowns WHERE platform = ?1 AND model_id = ?2 AND key_id = ?3",
                params![&**platform, &**model_id, key_id],
            ),
            Write::DeleteCooldownsForKey(key_id) => {
                self.exec("DELETE FROM rate_limit_cooldowns WHERE key_id = ?1", [key_id])
            }
            Write::DeleteExpiredCooldowns(now) => {
                self.exec("DELETE FROM rate_limit_cooldowns WHERE expires_at_ms <= ?1", [now])
            }
            Write::UpsertKey(k) => self.upsert_key(k),
            Write::UpsertModel(m) => self.upsert_model(m),
            Write::SetCaps(platform, caps) => self.set_caps(platform, caps),
            Write::ResetCaps(platform) => {
                self.exec("DELETE FROM provider_caps WHERE platform = ?1", [platform])
            }
            Write::UpsertQuotaState(q) => self.upsert_quota_state(q),
            Write::InsertHistory(h) => self.insert_history(h),
            Write::DeleteHistory { key_id, route, kinds } => {
                self.delete_history(*key_id, route.as_ref(), kinds)
            }
            Write::Sweep { usage_before, kept, leases_expired_before, history_before } => {
                self.sweep(usage_before, kept, leases_expired_before, history_before)
            }
            Write::SetCalendar { platform, zone: Some(z) } => self.exec(
                "INSERT INTO platform_calendars (platform, tz) VALUES (?1, ?2) \
                 ON CONFLICT (platform) DO UPDATE SET tz = excluded.tz",
                params![platform, z],
            ),
            Write::SetCalendar { platform, zone: None } => {
                self.exec("DELETE FROM platform_calendars WHERE platform = ?1", [platform])
            }
            Write::Log(l) => self.insert_log(l),
            Write::SetPriorityReserve { priority, fraction } => self.exec(
                "INSERT INTO priority_reserves (priority, fraction) VALUES (?1, ?2) \
                 ON CONFLICT (priority) DO UPDATE SET fraction = excluded.fraction",
                params![priority, fraction],
            ),
            Write::SetModelPrices { platform, model_id, prices: Some(p) } => self.exec(
                "INSERT INTO model_prices \
                 (platform, model_id, input_pps, output_pps, cached_input_pps, per_request_pps) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (platform, model_id) DO UPDATE SET \
                 input_pps = excluded.input_pps, output_pps = excluded.output_pps, \
                 cached_input_pps = excluded.cached_input_pps, per_request_pps = excluded.per_request_pps",
                params![platform, model_id, p.input, p.output, p.cached_input, p.per_request],
            ),
            Write::SetModelPrices { platform, model_id, prices: None } => self.exec(
                "DELETE FROM model_prices WHERE platform = ?1 AND model_id = ?2",
                params![platform, model_id],
            ),
            Write::SetPlatformLimits { platform, limits } if limits.is_empty() => {
                self.exec("DELETE FROM platform_limits WHERE platform = ?1", [platform])
            }
            Write::SetPlatformLimits { platform, limits } => self.exec(
                "INSERT INTO platform_limits (platform, limits) VALUES (?1, ?2) \
                 ON CONFLICT (platform) DO UPDATE SET limits = excluded.limits",
                params![platform, encode_limits(limits)],
            ),
            Write::RenewLeases(rows) => {
                for l in rows {
                    let n = self.exec(
                        "UPDATE quota_leases SET expires_at_ms = ?2 WHERE id = ?1",
                        params![l.id, l.expires_at_ms],
                    )?;
                    if n == 0 {
                        // Swept after its max age passed: it counts again from now.
                        self.insert_lease(l)?;
                    }
                }
                Ok(0)
            }
            Write::SetTenantLimits(t) if t.limits.is_empty() => {
                self.exec("DELETE FROM tenant_limits WHERE tenant = ?1", [&t.tenant])
            }
            Write::SetTenantLimits(t) => self.exec(
                "INSERT INTO tenant_limits (tenant, limits, tz) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (tenant) DO UPDATE SET limits = excluded.limits, tz = excluded.tz",
                params![t.tenant, encode_limits(&t.limits), t.tz],
            ),
        }
    }

    /// One cached statement; returns the number of rows it changed.
    fn exec(&self, sql: &str, p: impl Params) -> rusqlite::Result<i64> {
        Ok(self.conn.prepare_cached(sql)?.execute(p)? as i64)
    }

    /// Inserts usage rows, a merged request row as that many rows of one request
    /// (SPEC §10): full chunks of `USAGE_CHUNK` rows with one statement each, the
    /// rest one by one.
    pub(super) fn insert_usage<'a>(
        &mut self, rows: impl Iterator<Item = &'a UsageRow>,
    ) -> rusqlite::Result<()> {
        // Each row with the cost it is written with: a merged row's on its first copy.
        let mut chunk: Vec<(&UsageRow, i64)> = Vec::with_capacity(USAGE_CHUNK);
        for u in rows {
            for i in 0..copies(u) {
                chunk.push((u, if i == 0 { u.cost } else { 0 }));
                if chunk.len() == USAGE_CHUNK {
                    self.insert_usage_chunk(&chunk)?;
                    chunk.clear();
                }
            }
        }
        for (u, cost) in chunk {
            self.insert_usage_row(u, cost)?;
        }
        Ok(())
    }

    /// Inserts one usage row of one event, written with `cost`.
    pub(super) fn insert_usage_row(&mut self, u: &UsageRow, cost: i64) -> rusqlite::Result<i64> {
        let tokens = u.tokens * i64::from(u.kind == UsageKind::Tokens);
        if u.kinds.is_empty() && cost == 0 && u.tenants.is_empty() {
            // The common row (a request, or a total only, unpriced, for no tenant): its
            // split, cost and tenants columns stay NULL.
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
                     input_tokens, output_tokens, cached_tokens, cost, tenants) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
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
                    u.kinds.cached,
                    stored_cost(cost),
                    tenants::stored(&u.tenants)
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
    /// split, cost and tenants columns only when some row of the chunk has a split, a
    /// cost or tenants).
    pub(super) fn insert_usage_chunk(&mut self, ws: &[(&UsageRow, i64)]) -> rusqlite::Result<()> {
        static PLAIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        static SPLIT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let chunk_sql = |split: bool| {
            let (cols, row) = if split {
                (
                    ", input_tokens, output_tokens, cached_tokens, cost, tenants",
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                )
            } else {
                ("", "(?, ?, ?, ?, ?, ?)")
            };
            let values = vec![row; USAGE_CHUNK].join(", ");
            format!(
                "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms{cols}) \
                 VALUES {values}"
            )
        };
        let split = ws.iter().any(|(u, cost)| !u.kinds.is_empty() || *cost != 0 || !u.tenants.is_empty());
        let sql = if split {
            SPLIT.get_or_init(|| chunk_sql(true))
        } else {
            PLAIN.get_or_init(|| chunk_sql(false))
        };
        let width = if split { 11 } else { 6 };
        let rows = || ws.iter().copied();
        let mut stmt = self.conn.prepare_cached(sql)?;
        for (n, (u, cost)) in rows().enumerate() {
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
                stmt.raw_bind_parameter(at + 9, stored_cost(cost))?;
                stmt.raw_bind_parameter(at + 10, tenants::stored(&u.tenants))?;
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
        for (n, (u, _)) in rows().enumerate() {
            self.seen.note(first + n as i64, u);
        }
        Ok(())
    }

    fn insert_lease(&self, l: &LeaseRow) -> rusqlite::Result<i64> {
        // SPEC 23.2: the tenants a lease is taken for, NULL for none.
        let tenants = (!l.tenants.is_empty()).then(|| tenants::encode(&l.tenants));
        self.exec(
            "INSERT INTO quota_leases (id, platform, model_id, key_id, tokens, created_at_ms, expires_at_ms, \
             output_tokens, cost, tenants) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                l.id,
                &*l.platform,
                &*l.model_id,
                l.key_id,
                l.tokens,
                l.created_at_ms,
                l.expires_at_ms,
                l.output_tokens,
                stored_cost(l.cost),
                tenants
            ],
        )?;
        Ok(l.id)
    }

    fn upsert_cooldown(&self, cd: &CooldownRow) -> rusqlite::Result<i64> {
        if cd.key_id.is_none() {
            // A model-wide bench (SPEC 21.1): NULL never conflicts, so replace it.
            self.exec(
                "DELETE FROM rate_limit_cooldowns WHERE platform = ?1 AND model_id = ?2 AND key_id IS NULL",
                params![&*cd.platform, &*cd.model_id],
            )?;
        }
        self.exec(
            "INSERT INTO rate_limit_cooldowns (platform, model_id, key_id, expires_at_ms, source, set_at_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (platform, model_id, key_id) DO UPDATE SET \
             expires_at_ms = excluded.expires_at_ms, source = excluded.source, set_at_ms = excluded.set_at_ms",
            params![&*cd.platform, &*cd.model_id, cd.key_id, cd.expires_at_ms, cd.source.as_str(), cd.set_at_ms],
        )?;
        Ok(0)
    }

    fn upsert_key(&self, k: &KeyInfo) -> rusqlite::Result<i64> {
        self.exec(
            "INSERT INTO api_keys (key_id, platform, base_url, label, enabled, account, concurrency_cap) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (key_id) DO UPDATE SET platform = excluded.platform, \
             base_url = excluded.base_url, label = excluded.label, enabled = excluded.enabled, \
             account = excluded.account, concurrency_cap = excluded.concurrency_cap",
            params![k.key_id, k.platform, k.base_url, k.label, k.enabled as i64, k.account, k.concurrency_cap],
        )?;
        Ok(0)
    }

    fn upsert_model(&self, m: &ModelInfo) -> rusqlite::Result<i64> {
        // The classic four in their columns (gate order), every other limit beside.
        let (classic, others) = (m.limits.classic(), m.limits.others());
        self.exec(
            "INSERT INTO models (platform, model_id, rpm_limit, rpd_limit, tpm_limit, tpd_limit, monthly_token_budget, limits) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (platform, model_id) DO UPDATE SET \
             rpm_limit = excluded.rpm_limit, rpd_limit = excluded.rpd_limit, tpm_limit = excluded.tpm_limit, \
             tpd_limit = excluded.tpd_limit, monthly_token_budget = excluded.monthly_token_budget, \
             limits = excluded.limits",
            params![
                m.platform,
                m.model_id,
                classic[0],
                classic[1],
                classic[2],
                classic[3],
                m.monthly_token_budget,
                (!others.is_empty()).then(|| encode_limits(&others)),
            ],
        )?;
        Ok(0)
    }

    fn set_caps(&self, platform: &str, caps: &CapOverrides) -> rusqlite::Result<i64> {
        self.exec(
            "INSERT INTO provider_caps (platform, caps) VALUES (?1, ?2) \
             ON CONFLICT (platform) DO UPDATE SET caps = excluded.caps",
            params![platform, encode_caps(caps)],
        )?;
        Ok(0)
    }

    fn upsert_quota_state(&self, q: &QuotaStateRow) -> rusqlite::Result<i64> {
        self.exec(
            "INSERT INTO provider_quota_state (platform, key_id, pool_key, metric, limit_value, remaining, \
             reset_at_ms, source, confidence, observed_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
             ON CONFLICT (platform, key_id, pool_key, metric) DO UPDATE SET limit_value = excluded.limit_value, \
             remaining = excluded.remaining, reset_at_ms = excluded.reset_at_ms, source = excluded.source, \
             confidence = excluded.confidence, observed_at_ms = excluded.observed_at_ms",
            params![
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
            ],
        )?;
        Ok(0)
    }

    fn insert_history(&self, h: &HistoryRow) -> rusqlite::Result<i64> {
        self.exec(
            "INSERT INTO failure_history (platform, model_id, key_id, kind, hit_at_ms, value) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![&*h.platform, &*h.model_id, h.key_id, h.kind.as_str(), h.hit_at_ms, h.value],
        )?;
        Ok(0)
    }

    fn delete_history(
        &self, key_id: i64, route: Option<&(Arc<str>, Arc<str>)>, kinds: &[HistoryKind],
    ) -> rusqlite::Result<i64> {
        let mut n = 0;
        for k in kinds {
            n += match route {
                Some((p, m)) => self.exec(
                    "DELETE FROM failure_history WHERE key_id = ?1 AND kind = ?2 AND platform = ?3 AND model_id = ?4",
                    params![key_id, k.as_str(), &**p, &**m],
                )?,
                None => self.exec(
                    "DELETE FROM failure_history WHERE key_id = ?1 AND kind = ?2",
                    params![key_id, k.as_str()],
                )?,
            };
        }
        Ok(n)
    }

    /// Retention: history, usage and leases past their cutoffs (SPEC 10, 14.2: each
    /// kept model's usage at its own cut-off). Returns the usage rows deleted.
    fn sweep(
        &mut self, usage_before: &i64, kept: &Arc<[KeptUsage]>, leases_expired_before: &i64,
        history_before: &i64,
    ) -> rusqlite::Result<i64> {
        let c = &self.conn;
        // SPEC 24.2: a learned concurrency cap's rows are never swept.
        c.prepare_cached("DELETE FROM failure_history WHERE hit_at_ms < ?1 AND kind <> 'concurrency'")?
            .execute([history_before])?;
        let top = |c: &Connection| -> rusqlite::Result<i64> {
            c.prepare_cached("SELECT COALESCE(MAX(id), 0) FROM rate_limit_usage")?.query_row([], |r| r.get(0))
        };
        let top_before = top(c)?;
        // SPEC 14.2: each kept model's rows go at its own cut-off, every other
        // model's at `usage_before`. One delete per class, each from where the
        // class's rows start (a cursor), so that a month of one model's rows is
        // not scanned again at every sweep to find the others' last minute.
        let names: Vec<SweepName> =
            kept.iter().map(|k| (k.platform.clone(), k.model_id.clone(), k.tenant.clone())).collect();
        let mut cursors = if self.sweep_lo.kept == names {
            self.sweep_lo.clone()
        } else {
            SweepCursors { kept: names, lo: HashMap::new() }
        };
        let models: Vec<&KeptUsage> = kept.iter().filter(|k| k.tenant.is_none()).collect();
        let others = if models.is_empty() {
            "1".to_string()
        } else {
            let each: Vec<String> = (0..models.len())
                .map(|i| format!("(platform = ?{} AND model_id = ?{})", 4 + 2 * i, 5 + 2 * i))
                .collect();
            format!("NOT ({})", each.join(" OR "))
        };
        let every_name: Vec<Value> = models
            .iter()
            .flat_map(|k| [Value::Text(k.platform.to_string()), Value::Text(k.model_id.to_string())])
            .collect();
        // SPEC 24.3: a kept tenant's rows are of any model, so a row one class's cut-off
        // passed may be kept longer by another's (its tenant's, or its model's): no class
        // deletes what another keeps, and that one deletes it when its own cut-off passes.
        let tenants_kept = kept.iter().any(|k| k.tenant.is_some());
        let classes = kept
            .iter()
            .map(|k| (Some((k.platform.clone(), k.model_id.clone(), k.tenant.clone())), k.before))
            .chain(std::iter::once((None, *usage_before)));
        let mut n = 0;
        let mut unfinished = false;
        for (class, cutoff) in classes {
            let (pred, names): (String, Vec<Value>) = match &class {
                Some((_, _, Some(t))) => (carries(4), vec![Value::Text(t.to_string())]),
                Some((p, m, None)) => (
                    "platform = ?4 AND model_id = ?5".to_string(),
                    vec![Value::Text(p.to_string()), Value::Text(m.to_string())],
                ),
                None => (others.clone(), every_name.clone()),
            };
            let (keep, keep_args) =
                if tenants_kept { kept_longer(kept, 4 + names.len()) } else { (String::new(), Vec::new()) };
            let args = |a: i64, b: i64| -> Vec<Value> {
                [Value::Integer(a), Value::Integer(b), Value::Integer(cutoff)]
                    .into_iter()
                    .chain(names.iter().cloned())
                    .chain(keep_args.iter().cloned())
                    .collect()
            };
            let delete = format!(
                "DELETE FROM rate_limit_usage WHERE id >= ?1 AND id < ?2 AND created_at_ms < ?3 AND {pred}{keep}"
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
                    Some((_, _, Some(t))) => s.tenants.iter().any(|x| x == t),
                    Some((p, m, None)) => s.platform == *p && s.model_id == *m,
                    None => !models.iter().any(|k| s.platform == k.platform && s.model_id == k.model_id),
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
        Ok(n as i64)
    }

    fn insert_log(&self, l: &LogRow) -> rusqlite::Result<i64> {
        self.exec(
            "INSERT INTO server_logs (level, source, provider, model, event, request_id, message, created_at_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, NULL, ?6, ?7)",
            params![l.level, l.source, l.provider, l.model, l.event, l.message, l.created_at_ms],
        )?;
        Ok(self.conn.last_insert_rowid())
    }
}

/// A cost as its column holds it: NULL for none (an unpriced event or lease), so a
/// file without prices stays as it was.
fn stored_cost(cost: i64) -> Option<i64> {
    (cost != 0).then_some(cost)
}

/// A usage row carries the tenant bound to `?i` (its `tenants` column, SPEC 23.2; a
/// value a plain writer spoiled carries none).
fn carries(i: usize) -> String {
    format!("CASE WHEN json_valid(tenants) THEN EXISTS (SELECT 1 FROM json_each(tenants) WHERE value = ?{i}) ELSE 0 END")
}

/// The sweep's guard while tenants are kept (SPEC 24.3): not a row that some kept model
/// or tenant keeps (stamped at or after its cut-off), with its arguments from `?base`.
fn kept_longer(kept: &[KeptUsage], base: usize) -> (String, Vec<Value>) {
    let mut terms = Vec::with_capacity(kept.len());
    let mut args = Vec::new();
    for k in kept {
        let i = base + args.len();
        match &k.tenant {
            Some(t) => {
                terms.push(format!("({} AND created_at_ms >= ?{})", carries(i), i + 1));
                args.extend([Value::Text(t.to_string()), Value::Integer(k.before)]);
            }
            None => {
                terms.push(format!(
                    "(platform = ?{i} AND model_id = ?{} AND created_at_ms >= ?{})",
                    i + 1,
                    i + 2
                ));
                args.extend([
                    Value::Text(k.platform.to_string()),
                    Value::Text(k.model_id.to_string()),
                    Value::Integer(k.before),
                ]);
            }
        }
    }
    (format!(" AND NOT ({})", terms.join(" OR ")), args)
}
