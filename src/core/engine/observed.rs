//! What the engine tells about providers (SPEC §8, §9, §12): provider pools and caps,
//! observed quota headers and states, the routing guardrail, snapshots and the
//! analysis reads. [`Observed`] is the desk (`engine.observed()`); [`ObservedState`]
//! what only it keeps (the guardrail snapshot, the headroom cache).
use super::unit::Access;
use super::{unit, Engine};
use crate::core::error::{Error, Result};
use crate::core::limits::{
    classic_use, classic_window, Declared, LimitSet, Metric, WindowSpec, CAPS, CLASSIC, CLASSIC_NAMES, DAY,
};
use crate::core::state::{CooldownRec, FastMap, Prepared};
use crate::core::store::{LogRow, QuotaStateRow, UsageFilter, UsageRow, Write};
use crate::core::types::{check_name, check_non_negative, CapOverrides, CapSetting, Cooldown, Route};
use crate::core::windows::Counts;
use std::collections::HashMap;
use std::sync::Arc;

/// One observation of a provider's quota (SPEC §8.2).
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaObservation {
    pub platform: String,
    pub key_id: i64,
    pub model_id: Option<String>,
    pub pool_key: String,
    pub metric: &'static str,
    pub limit: Option<i64>,
    pub remaining: Option<i64>,
    pub reset_at_ms: Option<i64>,
    pub retry_after_ms: Option<i64>,
    pub source: &'static str,
    pub confidence: f64,
    pub status: i64,
}

/// Confidence of an observation by its source (SPEC §8.2).
pub fn source_confidence(source: &str) -> f64 {
    match source {
        "header" => 1.0,
        "error_body" => 0.75,
        "probe" => 0.6,
        "local_usage" => 0.45,
        "documentation" => 0.35,
        _ => 0.0,
    }
}

/// One route of `snapshot()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRow {
    pub route: Route,
    /// The route's own counts in the sliding minute and the calendar day.
    pub minute: Counts,
    pub day: Counts,
    /// Every declared limit of the model with what the route used in its window, in
    /// gate order.
    pub limits: Vec<(Declared, i64)>,
    pub in_flight: i64,
    pub cooldown: Option<CooldownRec>,
    /// SPEC 22.2: the earliest of the route's forecasts (default lookback).
    pub exhausts_at_ms: Option<i64>,
}

impl SnapshotRow {
    /// Its windows as `usage()` keys them, `(key, used, limit)`: the classic four
    /// (SPEC §9: the route's own use, the model's limit or None), then every other
    /// declared limit by its reason (SPEC §14.1), in gate order.
    pub fn windows(&self) -> Vec<(&str, i64, Option<i64>)> {
        let mut out = Vec::with_capacity(self.limits.len() + CLASSIC);
        for name in CLASSIC_NAMES {
            let used = classic_use(name, &self.minute, &self.day);
            let limit = self.limits.iter().find(|(l, _)| l.limit.classic_axis() == Some(name));
            out.push((name, used, limit.map(|(l, _)| l.limit.limit)));
        }
        for (l, used) in self.limits.iter().filter(|(l, _)| classic_window(l.reason.as_str()).is_none()) {
            out.push((l.reason.as_str(), *used, Some(l.limit.limit)));
        }
        out
    }
}

/// SPEC 22.2: `forecast()`'s default lookback, and the one `snapshot()` uses.
pub const DEFAULT_LOOKBACK_MS: i64 = 600_000;

/// How old the observed quota headroom may be (SPEC §8.2: a cache of at most 5 s that
/// a new observation through this engine invalidates): `key_quota_headroom` serves
/// its answer that long, and the `headroom` pick reads the mirror at most that old.
pub(super) const HEADROOM_CACHE_MS: i64 = 5_000;

/// platform -> model_id -> `K` -> what each window used.
type ByModel<K> = HashMap<Arc<str>, HashMap<Arc<str>, HashMap<K, Vec<(WindowSpec, Counts)>>>>;

/// The routing guardrail's snapshot (SPEC §9): window usage per route, reused for
/// `window_usage_ttl_ms`. Keys and limits are not part of it: they are read from the
/// mirror at each call, so a key or limit changed through this engine counts at once.
#[derive(Debug, Default)]
struct WindowSnapshot {
    built_at_ms: i64,
    /// platform -> model_id -> key_id -> what each window the route keeps has used.
    usage: ByModel<i64>,
    /// platform -> model_id -> shared account name -> what its windows used.
    accounts: ByModel<Arc<str>>,
}

/// What only the observed desk keeps between calls (a field of [`Engine`]).
#[derive(Default)]
pub(super) struct ObservedState {
    /// The routing guardrail's snapshot (SPEC §9), reused for `window_usage_ttl_ms`.
    window_snapshot: Option<WindowSnapshot>,
    /// `key_quota_headroom`'s last answer per platform: (given at, key -> headroom).
    /// Only that call's: the `headroom` pick reads the mirror's quota rows.
    headroom_cache: FastMap<String, (i64, Vec<(i64, f64)>)>,
}

/// What the engine observed and reports (SPEC §8, §9, §12, 22.2): provider pools and
/// caps, observed quota headers and states, the routing guardrail, snapshots,
/// forecasts and the analysis reads.
pub struct Observed<'e> {
    unit: &'e mut unit::Unit,
    state: &'e mut ObservedState,
}

impl Engine {
    /// What the engine observed and reports: provider pools, quota, the guardrail,
    /// snapshots and forecasts.
    pub fn observed(&mut self) -> Observed<'_> {
        Observed { unit: &mut self.unit, state: &mut self.observed }
    }
}

impl Observed<'_> {
    // ---- provider pools ----------------------------------------------------------

    pub fn provider_caps(&mut self, platform: &str) -> Result<LimitSet> {
        check_name("platform", platform)?;
        self.unit.run(Access::Read, |tx| Ok(tx.mirror().caps_for(platform)))
    }

    /// One setting per provider cap (in the order of [`CapOverrides`]): `None` keeps
    /// what is set; `Some(setting)` replaces it.
    pub fn set_provider_caps(&mut self, platform: &str, settings: [Option<CapSetting>; CAPS]) -> Result<()> {
        check_name("platform", platform)?;
        for s in settings.into_iter().flatten() {
            if let CapSetting::Cap(v) = s {
                check_non_negative("cap", v)?;
            }
        }
        self.unit
            .run_counted(Access::Write, |tx| {
                let (u, _, writes) = tx.parts();
                let old = u.mirror.config.caps.get(platform).copied().unwrap_or_default();
                let new: CapOverrides = std::array::from_fn(|i| settings[i].unwrap_or(old[i]));
                writes.push(Write::SetCaps(platform.to_string(), new));
                Ok(())
            })
            .map(|_| ())
    }

    pub fn reset_provider_caps(&mut self, platform: &str) -> Result<()> {
        check_name("platform", platform)?;
        self.unit.run(Access::Write, |tx| {
            tx.push(Write::ResetCaps(platform.to_string()));
            Ok(())
        })
    }

    pub fn provider_daily_request_count(&mut self, platform: &str, key_id: i64) -> Result<i64> {
        self.unit.run(Access::Read, |tx| {
            let now = tx.now();
            let m = tx.mirror();
            Ok(m.provider_day_requests(platform, key_id, now))
        })
    }

    pub fn provider_minute_request_count(&mut self, platform: &str, key_id: i64) -> Result<i64> {
        self.unit.run(Access::Read, |tx| {
            let now = tx.now();
            let m = tx.mirror();
            let a = m.account_id(platform, key_id);
            m.prune_account_id(a, now);
            Ok(m.provider_minute_requests(platform, key_id, now))
        })
    }

    pub fn provider_daily_token_count(&mut self, platform: &str, key_id: i64) -> Result<i64> {
        self.unit.run(Access::Read, |tx| {
            let (u, now, _) = tx.parts();
            let cap = u.mirror.caps_for(platform).cap(Metric::Tokens, DAY);
            Ok(u.mirror.provider_day_tokens(platform, key_id, cap, now))
        })
    }

    // ---- analysis ----------------------------------------------------------------

    pub fn usage_events(&mut self, filter: &UsageFilter) -> Result<Vec<UsageRow>> {
        let _ = self.unit.flush();
        Ok(self.unit.store_read(|s| s.usage_events(filter))?)
    }

    pub fn server_logs(&mut self, limit: i64) -> Result<Vec<(i64, LogRow, Option<String>)>> {
        check_non_negative("limit", limit)?;
        let _ = self.unit.flush();
        Ok(self.unit.store_read(|s| s.server_logs(limit))?)
    }

    /// Every cooldown the store holds, expired ones included until they are cleaned up
    /// (`cleanup_expired_cooldowns`), sorted by (platform, model_id, key_id): what
    /// `analysis.plot_cooldowns` draws (SPEC §12).
    pub fn stored_cooldowns(&mut self) -> Result<Vec<Cooldown>> {
        self.unit.run(Access::Read, |tx| {
            // The model-wide benches (SPEC 21.1) come last: key_id 0 stands for no key.
            let mut v: Vec<Cooldown> = tx.mirror().reader().held_cooldowns().collect();
            v.sort_by(|a, b| a.route.cmp(&b.route));
            Ok(v)
        })
    }

    // ---- observed provider quota (SPEC §8.2) -----------------------------------

    /// Reads quota headers of one response; merges what they say into the state and
    /// returns the observations. A 429 or 402 adds an error-body observation.
    pub fn record_quota_headers(
        &mut self, platform: &str, key_id: i64, headers: &[(String, String)], model_id: Option<&str>,
        status: i64,
    ) -> Result<Vec<QuotaObservation>> {
        check_name("platform", platform)?;
        if let Some(m) = model_id {
            check_name("model_id", m)?;
        }
        let (obs, _) = self.unit.run_counted(Access::Write, |tx| {
            let (u, now, writes) = tx.parts();
            let parsed = crate::core::headers::parse_quota_headers(headers, now);
            let pool_key = crate::core::pools::infer_quota_pool_key(platform, model_id);
            let mut obs: Vec<QuotaObservation> = parsed
                .quotas
                .iter()
                .map(|q| QuotaObservation {
                    platform: platform.to_string(),
                    key_id,
                    model_id: model_id.map(str::to_string),
                    pool_key: pool_key.clone(),
                    metric: q.metric.as_str(),
                    limit: q.limit,
                    remaining: q.remaining,
                    reset_at_ms: q.reset_at_ms,
                    retry_after_ms: parsed.retry_after_ms,
                    source: "header",
                    confidence: source_confidence("header"),
                    status,
                })
                .collect();
            if status == 429 || status == 402 {
                obs.push(QuotaObservation {
                    platform: platform.to_string(),
                    key_id,
                    model_id: model_id.map(str::to_string),
                    pool_key: pool_key.clone(),
                    metric: "requests",
                    limit: None,
                    remaining: Some(0),
                    reset_at_ms: parsed.retry_after_ms.map(|ms| now.saturating_add(ms)),
                    retry_after_ms: parsed.retry_after_ms,
                    source: "error_body",
                    confidence: source_confidence("error_body"),
                    status,
                });
            }
            if obs.is_empty() {
                return Ok(obs);
            }
            // The mirror's rows: the store's as of this section, with our own waiting ones.
            let existing = u.mirror.reader().quota_rows(platform);
            let mut merged: Vec<QuotaStateRow> = Vec::new();
            for o in &obs {
                let old = merged
                    .iter()
                    .position(|r| r.key_id == key_id && r.pool_key == o.pool_key && r.metric == o.metric)
                    .map(|i| merged.remove(i))
                    .or_else(|| {
                        existing
                            .iter()
                            .find(|r| r.key_id == key_id && r.pool_key == o.pool_key && r.metric == o.metric)
                            .cloned()
                    });
                let row = match old {
                    // Known values replace, missing ones keep the old, confidence is the max.
                    Some(old) => QuotaStateRow {
                        limit: o.limit.or(old.limit),
                        remaining: o.remaining.or(old.remaining),
                        reset_at_ms: o.reset_at_ms.or(old.reset_at_ms),
                        source: o.source.to_string(),
                        confidence: o.confidence.max(old.confidence),
                        observed_at_ms: now,
                        ..old
                    },
                    None => QuotaStateRow {
                        platform: platform.to_string(),
                        key_id,
                        pool_key: o.pool_key.clone(),
                        metric: o.metric.to_string(),
                        limit: o.limit,
                        remaining: o.remaining,
                        reset_at_ms: o.reset_at_ms,
                        source: o.source.to_string(),
                        confidence: o.confidence,
                        observed_at_ms: now,
                    },
                };
                merged.push(replenished(row, now));
            }
            writes.extend(merged.into_iter().map(Write::UpsertQuotaState));
            Ok(obs)
        })?;
        self.state.headroom_cache.remove(platform);
        Ok(obs)
    }

    /// The merged quota rows; rows past their reset read (and are stored) full again.
    pub fn quota_state(&mut self) -> Result<Vec<QuotaStateRow>> {
        let write = !self.unit.readonly();
        let access = if write { Access::Write } else { Access::Read };
        self.unit.run(access, |tx| {
            let now = tx.now();
            let rows = if tx.online() || !write {
                tx.parts().0.store_read(|s| s.quota_states(None)).unwrap_or_default()
            } else {
                Vec::new()
            };
            let rows: Vec<QuotaStateRow> = rows
                .into_iter()
                .map(|r| {
                    let fresh = replenished(r.clone(), now);
                    if fresh != r && write {
                        tx.push(Write::UpsertQuotaState(fresh.clone()));
                    }
                    fresh
                })
                .collect();
            Ok(rows)
        })
    }

    /// SPEC §8.2: per key of the platform, the worst `min(1, remaining / limit)` over
    /// its confident rows (a row past its reset counts 1.0), from the mirror's quota
    /// rows. The answer is served for 5 s; a new observation through this engine drops it.
    pub fn key_quota_headroom(&mut self, platform: &str) -> Result<Vec<(i64, f64)>> {
        check_name("platform", platform)?;
        let now = self.unit.clock.now_ms();
        if let Some((at, v)) = self.state.headroom_cache.get(platform) {
            if now >= *at && now.saturating_sub(*at) < HEADROOM_CACHE_MS {
                return Ok(v.clone());
            }
        }
        let v = self.unit.run(Access::Read, |tx| {
            let now = tx.now();
            Ok(tx.mirror().reader().quota_headroom(platform, now))
        })?;
        self.state.headroom_cache.insert(platform.to_string(), (now, v.clone()));
        Ok(v)
    }

    // ---- routing guardrail (SPEC §9) --------------------------------------------

    /// Drops the guardrail snapshot; the next call rebuilds it.
    pub fn invalidate_window_usage(&mut self) {
        self.state.window_snapshot = None;
    }

    fn rebuild_window_snapshot(&mut self) -> Result<bool> {
        let (failed, snap) = self.unit.run(Access::Read, |tx| {
            let (u, now, _) = tx.parts();
            let mut snap = WindowSnapshot { built_at_ms: now, ..WindowSnapshot::default() };
            u.mirror.prune_all(now);
            for route_use in u.mirror.reader().route_uses(now) {
                let r = route_use.route;
                if let Some((name, group)) = route_use.account {
                    snap.accounts
                        .entry(r.platform.clone())
                        .or_default()
                        .entry(r.model_id.clone())
                        .or_default()
                        .insert(name, group);
                }
                let used = route_use.used;
                if used.iter().all(|(_, c)| *c == Counts::default()) {
                    continue;
                }
                snap.usage
                    .entry(r.platform.clone())
                    .or_default()
                    .entry(r.model_id.clone())
                    .or_default()
                    .insert(r.key_id, used);
            }
            Ok((u.read_failed(), snap))
        })?;
        if failed {
            self.state.window_snapshot = None;
            return Ok(false);
        }
        self.state.window_snapshot = Some(snap);
        Ok(true)
    }

    /// The routes of a model's routable keys keep every window of `limits` (an ad hoc
    /// `limits=` may name one they do not): when one did not, the snapshot is rebuilt.
    fn keep_guardrail_windows(&mut self, platform: &str, model_id: &str, limits: &LimitSet) -> Result<()> {
        let read = self.unit.mirror.reader();
        let keys = read.routable_keys(platform).to_vec();
        let missing = keys.iter().any(|k| !read.keeps_windows(platform, model_id, *k, limits));
        if !missing {
            return Ok(());
        }
        self.unit.run(Access::Read, |tx| {
            let (u, now, _) = tx.parts();
            for k in keys {
                let route =
                    Route { platform: platform.to_string(), model_id: model_id.to_string(), key_id: k };
                u.ready_route(&route, limits, now);
            }
            Ok(())
        })?;
        self.state.window_snapshot = None;
        Ok(())
    }

    /// SPEC §9: how much of its window quota a model has used, following the key
    /// with the most headroom; `None` without window limits, without a routable key,
    /// or when the database cannot be read. Served from a snapshot reused for
    /// `window_usage_ttl_ms`; live leases are not counted.
    pub fn model_window_used_fraction(
        &mut self, platform: &str, model_id: &str, limits: Option<LimitSet>, key_id: Option<i64>,
    ) -> Result<Option<f64>> {
        // The model's own declaration is kept by every route of it; an ad hoc one may
        // name a window they do not keep yet.
        let ad_hoc = limits.is_some();
        let limits = self.unit.mirror.limits_for(platform, model_id, limits);
        if limits.is_empty() {
            return Ok(None);
        }
        if ad_hoc {
            self.keep_guardrail_windows(platform, model_id, &limits)?;
        }
        let now = self.unit.clock.now_ms();
        let fresh = self.state.window_snapshot.as_ref().is_some_and(|s| {
            now >= s.built_at_ms && now.saturating_sub(s.built_at_ms) < self.unit.settings.window_usage_ttl_ms
        });
        if !fresh && !self.rebuild_window_snapshot()? {
            return Ok(None);
        }
        let Some(snap) = self.state.window_snapshot.as_ref() else { return Ok(None) };
        let read = self.unit.mirror.reader();
        let keys = read.routable_keys(platform);
        let per_model = snap.usage.get(platform).and_then(|m| m.get(model_id));
        let per_account = snap.accounts.get(platform).and_then(|m| m.get(model_id));
        let mut best: Option<f64> = None;
        for k in keys.iter().filter(|k| key_id.is_none_or(|want| **k == want)) {
            let used = per_model.and_then(|m| m.get(k));
            // SPEC §14.3: a key's figure at the scope of each limit.
            let shared = per_account.and_then(|a| a.get(&read.account_name(platform, *k)));
            let worst = limits
                .iter()
                .map(|d| {
                    let counts = match shared {
                        Some(a) if d.limit.scope == crate::core::limits::Scope::Account => Some(a),
                        _ => used,
                    };
                    let u = counts
                        .and_then(|u| u.iter().find(|(w, _)| *w == d.limit.window))
                        .map_or(0, |(_, c)| c.get(d.limit.metric));
                    if d.limit.limit <= 0 {
                        1.0
                    } else {
                        u as f64 / d.limit.limit as f64
                    }
                })
                .fold(0.0f64, f64::max);
            best = Some(best.map_or(worst, |b| b.min(worst)));
        }
        Ok(best)
    }

    /// One row per route that has usage today, a live lease or an active cooldown,
    /// sorted by (platform, model_id, key_id) (SPEC §12).
    pub fn snapshot(&mut self) -> Result<Vec<SnapshotRow>> {
        self.unit
            .run(Access::Read, |tx| {
                let now = tx.now();
                let m = tx.mirror();
                m.prune_all(now);
                let m = &*m;
                let mut rows = Vec::new();
                for f in m.reader().route_figures(now) {
                    let (r, minute, day, in_flight, cooldown) =
                        (f.route, f.minute, f.day, f.in_flight, f.bench);
                    if day.requests == 0
                        && day.tokens == 0
                        && minute.requests == 0
                        && minute.tokens == 0
                        && in_flight == 0
                        && cooldown.is_none()
                    {
                        continue;
                    }
                    let limits = m
                        .config
                        .limit_set(&r.platform, &r.model_id)
                        .iter()
                        .map(|d| {
                            let used =
                                r.win.counts(d.limit.window, now).unwrap_or_default().get(d.limit.metric);
                            (d.clone(), used)
                        })
                        .collect();
                    rows.push(SnapshotRow {
                        route: Route {
                            platform: r.platform.to_string(),
                            model_id: r.model_id.to_string(),
                            key_id: r.key_id,
                        },
                        minute,
                        day,
                        limits,
                        in_flight,
                        cooldown,
                        exhausts_at_ms: None,
                    });
                }
                rows.sort_by(|a, b| a.route.cmp(&b.route));
                Ok(rows)
            })
            .and_then(|mut rows| {
                // SPEC 22.2: the earliest forecast of each row.
                self.unit.run(Access::Read, |tx| {
                    let (u, now, _) = tx.parts();
                    let routes: Vec<Route> = rows.iter().map(|r| r.route.clone()).collect();
                    let forecasts = forecast_routes(u, &routes, DEFAULT_LOOKBACK_MS, now);
                    for (row, f) in rows.iter_mut().zip(forecasts) {
                        row.exhausts_at_ms = f.into_iter().filter_map(|(_, t)| t).min();
                    }
                    Ok(rows)
                })
            })
    }

    // ---- forecasts (SPEC 22.2) -------------------------------------------------------

    /// Per declared window of an hour or longer and per daily provider cap of the
    /// route, when it would run out if the pace of the last `lookback_ms` went on.
    pub fn forecast(&mut self, route: &Route, lookback_ms: i64) -> Result<Vec<(String, Option<i64>)>> {
        check_name("platform", &route.platform)?;
        check_name("model_id", &route.model_id)?;
        if lookback_ms <= 0 {
            return Err(Error::Invalid(format!("lookback_ms must be a positive int, got {lookback_ms}")));
        }
        self.unit.run(Access::Read, |tx| {
            let (u, now, _) = tx.parts();
            Ok(forecast_routes(u, std::slice::from_ref(route), lookback_ms, now).remove(0))
        })
    }
}

/// The forecasts of routes at `now`, their windows made ready (the pace's window
/// counted from the store, once for them all, the first time it is asked for).
fn forecast_routes(
    unit: &mut unit::Unit, routes: &[Route], lookback_ms: i64, now: i64,
) -> Vec<Vec<(String, Option<i64>)>> {
    use crate::core::forecast::{forecast, recent_width};
    let width = recent_width(lookback_ms);
    let ready: Vec<Prepared> = routes.iter().map(|route| unit.prepare(route, None, 0, now)).collect();
    let mut complete = true;
    for rid in ready.iter().filter_map(|p| p.route) {
        complete &= unit.mirror.keep_recent(rid, width, now);
    }
    if !complete || unit.mirror.needs_reload {
        unit.reload_windows(now);
        for rid in ready.iter().filter_map(|p| p.route) {
            unit.mirror.keep_recent(rid, width, now);
        }
    }
    ready
        .iter()
        .map(|p| p.route.map_or_else(Vec::new, |rid| forecast(&unit.mirror, rid, &p.ctx, lookback_ms, now)))
        .collect()
}

/// A state row as it reads at `now`: past its reset, the window is full again.
fn replenished(mut row: QuotaStateRow, now: i64) -> QuotaStateRow {
    if row.reset_at_ms.is_some_and(|t| t <= now) {
        row.remaining = row.limit;
        row.reset_at_ms = None;
    }
    row
}
