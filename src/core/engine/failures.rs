//! Failures (SPEC §6, §7): cooldowns, the failure kinds and their benches, the
//! ladders, and learning limits from provider messages. SPEC 21, what an aggregator's
//! errors teach beyond the failing route: an upstream congested for one model benches
//! the model on every key (21.1); a pool 429 teaches the account a provider cap
//! (21.2), which the gates read through `Mirror::prepare`.
use super::unit::Access;
use super::{unit, Engine};
use crate::core::clock::DAY_MS;
use crate::core::cooldowns::MIN_STATED_BENCH_MS;
use crate::core::cooldowns::{concurrency_chain_start, learned_concurrency_cap};
use crate::core::cooldowns::{
    decide_limit, kind_rule, ladder_step, CooldownDecision, KindRule, LimitFacts, AUTH_LADDER_MS,
    EMPTY_STREAK_BENCH, LADDER_MS, LOCAL_BENCH_MS, TRANSIENT_MEMORY_MS, UNKNOWN_HIT_WINDOW_MS,
};
use crate::core::error::{Error, Result};
use crate::core::limits::{classic_slot, LimitSet, Metric, DAY};
use crate::core::parse::{
    failure_skip, infer_failure_kind, parse_provider_limit, parse_retry_after_ms, parse_stated_retry_ms,
    FailureKind, LearnedLimit, LimitAxis, Skip,
};
use crate::core::pools::infer_quota_pool_key;
use crate::core::state::{pool_cap_row, pool_reset_row};
use crate::core::store::{CooldownRow, HistoryKind, HistoryRow, LogRow, Write};
use crate::core::types::{check_name, check_non_negative, Cooldown, CooldownSource, ModelInfo, Route};
use crate::core::upstream::{parse_pool_429, upstream_bench_ms, upstream_chain, PoolAxis, PoolSignal};
use std::sync::Arc;

/// `retry_after=` of `record_failure`: header text, or a delay already in ms.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryAfter {
    Text(String),
    Millis(i64),
}

/// The inputs of `record_failure`.
#[derive(Debug, Clone, Default)]
pub struct FailureInput {
    pub status: Option<i64>,
    pub retry_after: Option<RetryAfter>,
    pub message: Option<String>,
    pub kind: Option<FailureKind>,
    pub limits: Option<LimitSet>,
    /// The response's headers, when the caller has them (`Lease.observe`): a pool
    /// 429's `X-RateLimit-Limit` and `-Reset` may sit there (SPEC 21.2).
    pub headers: Vec<(String, String)>,
}

/// What `record_failure` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureOutcome {
    pub kind: FailureKind,
    pub cooldown: Option<CooldownDecision>,
    pub learned: Option<LearnedLimit>,
    /// What the rest of the request skips (SPEC 24.7).
    pub skip: Skip,
}

/// The failure policy (SPEC §6, §7, 15.4, 21): cooldowns and their probes, what a
/// failure benches and counts, and the limits and caps it teaches. It keeps no state
/// of its own: cooldowns and history are the mirror's, kept through the unit of work.
pub struct Failures<'e> {
    unit: &'e mut unit::Unit,
}

impl Engine {
    /// The failure policy: cooldowns, failures, learning.
    pub fn failures(&mut self) -> Failures<'_> {
        Failures { unit: &mut self.unit }
    }

    /// A lease's failure: `record_failure` for its route, then the lease released.
    pub fn finish_lease_failure(
        &mut self, lease_id: i64, route: &Route, f: FailureInput,
    ) -> Result<FailureOutcome> {
        let out = self.failures().record_failure_of(route, f, Some(lease_id))?;
        self.release_lease(lease_id)?;
        Ok(out)
    }
}

/// What a failure's message and headers say, read before the write section opens: a
/// body is read up to `MAX_PARSED_BYTES` (SPEC 24.6), which no other engine waits on.
struct Said {
    /// The failure's kind (SPEC 6.2): the caller's, else inferred.
    kind: FailureKind,
    /// What the request skips next (SPEC 24.7).
    skip: Skip,
    /// A pool 429's cap and reset (SPEC 21.2).
    pool: Option<PoolSignal>,
    /// The delay the message states (SPEC 6.2).
    stated_ms: Option<i64>,
    /// The limit the message states (SPEC 7); an auth failure's teaches nothing.
    limit: Option<LearnedLimit>,
}

impl Said {
    fn read(f: &FailureInput, kind: FailureKind) -> Said {
        let message = f.message.as_deref();
        Said {
            kind,
            skip: failure_skip(kind, f.status, message),
            pool: parse_pool_429(f.status, message, &f.headers),
            stated_ms: parse_stated_retry_ms(message),
            limit: if kind == FailureKind::Auth { None } else { parse_provider_limit(message) },
        }
    }
}

/// The kinds whose failure penalizes the model for `headroom` and `spread` (SPEC 24.7).
fn penalizes(kind: FailureKind) -> bool {
    matches!(
        kind,
        FailureKind::ServerError
            | FailureKind::Timeout
            | FailureKind::Transport
            | FailureKind::EmptyCompletion
    )
}

/// A failure-history row of `kind` for the route at `now`.
pub(super) fn history_row(route: &Route, kind: HistoryKind, now: i64) -> Write {
    history_value_row(route, kind, None, now)
}

fn history_value_row(route: &Route, kind: HistoryKind, value: Option<i64>, now: i64) -> Write {
    let model_id = if kind.of_key() { "" } else { route.model_id.as_str() };
    Write::InsertHistory(HistoryRow {
        platform: Arc::from(route.platform.as_str()),
        model_id: Arc::from(model_id),
        key_id: route.key_id,
        kind,
        hit_at_ms: now,
        value,
    })
}

impl Failures<'_> {
    /// A write section whose body decides with the desk (its helpers take `&mut self`).
    fn writing<T>(
        &mut self, f: impl FnOnce(&mut Failures<'_>, i64, &mut Vec<Write>) -> Result<T>,
    ) -> Result<(T, Vec<i64>)> {
        self.unit.run_counted(Access::Write, |tx| {
            let (unit, now, writes) = tx.parts();
            f(&mut Failures { unit }, now, writes)
        })
    }

    // ---- cooldowns ---------------------------------------------------------------

    /// The operator's bench: always overwrites.
    pub fn set_cooldown(&mut self, route: &Route, duration_ms: i64, source: CooldownSource) -> Result<()> {
        check_non_negative("duration_ms", duration_ms)?;
        if source == CooldownSource::Upstream {
            return Err(Error::invalid(
                "source \"upstream\" is the engine's model-wide bench of a congested upstream (SPEC 21.1), \
                 not a key's; use heuristic, authoritative, credit or tier",
            ));
        }
        self.unit
            .run_counted(Access::Write, |tx| {
                let (u, now, writes) = tx.parts();
                writes.push(Write::UpsertCooldown(CooldownRow {
                    platform: Arc::from(route.platform.as_str()),
                    model_id: Arc::from(route.model_id.as_str()),
                    key_id: Some(route.key_id),
                    expires_at_ms: now.saturating_add(duration_ms),
                    source,
                    set_at_ms: now,
                }));
                u.logs.push((
                    log::Level::Info,
                    format!(
                        "cooldown {route} set for {duration_ms} ms ({}, by the operator)",
                        source.as_str()
                    ),
                ));
                Ok(())
            })
            .map(|_| ())
    }

    /// The route's bench (SPEC 21.1): whichever of its own cooldown and its model's
    /// model-wide one ends later.
    pub fn cooldown(&mut self, route: &Route) -> Result<Option<Cooldown>> {
        self.unit.run(Access::Read, |tx| {
            let now = tx.now();
            Ok(tx.mirror().reader().bench(&route.platform, &route.model_id, route.key_id, now))
        })
    }

    /// Active cooldowns, soonest expiry first; `key_ids` filters (and then leaves out
    /// the model-wide benches of SPEC 21.1, which have no key).
    pub fn active_cooldowns(&mut self, key_ids: Option<&[i64]>) -> Result<Vec<Cooldown>> {
        self.unit.run(Access::Read, |tx| {
            let now = tx.now();
            let m = tx.mirror();
            // A filter by key keeps the model-wide benches that block one of its keys:
            // those of a platform the key is registered on or was seen on.
            let platforms: Vec<&str> = match key_ids {
                None => Vec::new(),
                Some(ks) => {
                    let registered = m
                        .config
                        .keys
                        .values()
                        .filter(|k| ks.contains(&k.key_id))
                        .map(|k| k.platform.as_str());
                    let seen =
                        m.routes.iter().filter(|(_, r)| ks.contains(&r.key_id)).map(|(_, r)| &*r.platform);
                    registered.chain(seen).collect()
                }
            };
            let blocks = |c: &Cooldown, ks: &[i64]| {
                if c.model_wide {
                    platforms.contains(&c.route.platform.as_str())
                } else {
                    ks.contains(&c.route.key_id)
                }
            };
            let mut v: Vec<Cooldown> = m
                .reader()
                .held_cooldowns()
                .filter(|c| now < c.expires_at_ms)
                .filter(|c| key_ids.is_none_or(|ks| blocks(c, ks)))
                .collect();
            v.sort_by(|a, b| {
                (a.expires_at_ms, &a.route.platform, &a.route.model_id, a.route.key_id).cmp(&(
                    b.expires_at_ms,
                    &b.route.platform,
                    &b.route.model_id,
                    b.route.key_id,
                ))
            });
            Ok(v)
        })
    }

    pub fn clear_cooldown_early(&mut self, route: &Route) -> Result<bool> {
        let ids = self
            .unit
            .run_counted(Access::Write, |tx| {
                tx.push(Write::DeleteCooldown {
                    platform: Arc::from(route.platform.as_str()),
                    model_id: Arc::from(route.model_id.as_str()),
                    key_id: route.key_id,
                });
                Ok(())
            })
            .map(|((), ids)| ids)?;
        let cleared = ids.first().copied().unwrap_or(0) > 0;
        if cleared {
            self.unit.logs.push((log::Level::Info, format!("cooldown {route} cleared early")));
        }
        Ok(cleared)
    }

    /// Operator reset: the key's cooldowns and all its failure history, learned
    /// concurrency cap included.
    pub fn clear_cooldowns_for_key(&mut self, key_id: i64) -> Result<i64> {
        let ids = self
            .unit
            .run_counted(Access::Write, |tx| {
                tx.push(Write::DeleteCooldownsForKey(key_id));
                tx.push(Write::DeleteHistory {
                    key_id,
                    route: None,
                    kinds: vec![
                        HistoryKind::Ladder,
                        HistoryKind::Unknown,
                        HistoryKind::Auth,
                        HistoryKind::Empty,
                        HistoryKind::Transient,
                        HistoryKind::Concurrency,
                    ],
                });
                Ok(())
            })
            .map(|((), ids)| ids)?;
        Ok(ids.first().copied().unwrap_or(0))
    }

    pub fn cleanup_expired_cooldowns(&mut self) -> Result<i64> {
        let ((), removed) = self.unit.run_counted(Access::Write, |tx| {
            let (_, now, writes) = tx.parts();
            writes.push(Write::DeleteExpiredCooldowns(now));
            Ok(())
        })?;
        Ok(removed.first().copied().unwrap_or(0))
    }

    /// Active heuristic cooldowns (the ones a probe may clear), soonest first.
    /// Claims the probe of `key_id` for this engine (SPEC §7: one prober per fleet).
    /// True when this engine may probe it; also true when the store cannot say.
    pub fn claim_probe(&mut self, key_id: i64, ttl_ms: i64) -> bool {
        self.unit.store_read(|s| s.try_claim(&format!("probe:{key_id}"), ttl_ms)).unwrap_or(true)
    }

    pub fn probeable_cooldowns(&mut self) -> Result<Vec<Cooldown>> {
        Ok(self
            .active_cooldowns(None)?
            .into_iter()
            .filter(|c| c.source == CooldownSource::Heuristic)
            .collect())
    }

    fn is_local(&self, key_id: i64) -> bool {
        self.unit.mirror.reader().key_is_local(key_id)
    }

    /// SPEC §6.1 inside an open write section: decides, and queues the hits and the
    /// ladder step it counts.
    fn limit_decision(
        &mut self, route: &Route, limits: LimitSet, retry_after_ms: Option<i64>, quota_signal: bool,
        now: i64, writes: &mut Vec<Write>,
    ) -> CooldownDecision {
        if self.is_local(route.key_id) {
            return CooldownDecision::new(LOCAL_BENCH_MS, CooldownSource::Heuristic);
        }
        let rid = self.unit.mirror.route_id(&route.platform, &route.model_id, route.key_id);
        self.unit.mirror.prune_route(rid, now);
        let read = self.unit.mirror.reader();
        let day = read.route_day(rid, now);
        let (day_requests, day_tokens) =
            (limits.classic_limit(Metric::Requests, DAY), limits.classic_limit(Metric::Tokens, DAY));
        let daily_exhausted =
            day_requests.is_some_and(|l| day.requests >= l) || day_tokens.is_some_and(|l| day.tokens >= l);
        let mut effectively_exhausted = false;
        if day_requests.is_none() && day_tokens.is_none() && quota_signal {
            let earlier = read.unknown_limit_hits(route, now.saturating_sub(UNKNOWN_HIT_WINDOW_MS));
            writes.push(history_row(route, HistoryKind::Unknown, now));
            effectively_exhausted = earlier + 1 >= 2;
        }
        let facts = LimitFacts {
            daily_exhausted,
            effectively_exhausted,
            ladder_steps: read.ladder_steps(route, now.saturating_sub(DAY_MS)),
            recent_transient: read.transient_benches(route, now.saturating_sub(TRANSIENT_MEMORY_MS)) > 0,
        };
        let next_day = read.next_day_start(rid, now);
        let (decision, stepped) = decide_limit(facts, retry_after_ms, now, next_day);
        // A ladder step, or a transient bench that 15.2 remembers for 10 minutes.
        let kind = if stepped { HistoryKind::Ladder } else { HistoryKind::Transient };
        writes.push(history_row(route, kind, now));
        decision
    }

    /// SPEC §6.1 as a call of its own: decides and counts, sets no cooldown.
    pub fn cooldown_decision_for_limit(
        &mut self, route: &Route, limits: Option<LimitSet>, retry_after_ms: Option<i64>, quota_signal: bool,
    ) -> Result<CooldownDecision> {
        if let Some(ra) = retry_after_ms {
            check_non_negative("retry_after_ms", ra)?;
        }
        self.writing(|e, now, writes| {
            let limits = e.unit.mirror.limits_for(&route.platform, &route.model_id, limits);
            Ok(e.limit_decision(route, limits, retry_after_ms, quota_signal, now, writes))
        })
        .map(|(d, _)| d)
    }

    /// SPEC §7 inside an open write section: the limit a message states, written only
    /// when it tightens the stored one.
    fn learn(
        &mut self, platform: &str, model_id: &str, learned: Option<LearnedLimit>, writes: &mut Vec<Write>,
    ) -> Option<LearnedLimit> {
        let learned = learned?;
        let mut model =
            self.unit.mirror.config.model(platform, model_id).cloned().unwrap_or_else(|| ModelInfo {
                platform: platform.to_string(),
                model_id: model_id.to_string(),
                limits: LimitSet::default(),
                monthly_token_budget: None,
            });
        // A learned kind names the classic window it tightens (a concurrency cap none).
        let (metric, window) = learned.kind.window()?;
        let mut classic = model.limits.classic();
        let slot = &mut classic[classic_slot(metric, window)?];
        if slot.is_some_and(|v| v <= learned.limit) {
            return None;
        }
        *slot = Some(learned.limit);
        model.limits = model.limits.replace_classic(classic);
        self.unit.logs.push((
            log::Level::Info,
            format!(
                "learned {} = {} for {platform}/{model_id} from a provider error",
                learned.kind.as_str(),
                learned.limit
            ),
        ));
        // Apply now so a decision in the same section sees it.
        self.unit.mirror.put_model(model.clone());
        writes.push(Write::UpsertModel(model));
        Some(learned)
    }

    pub fn learn_limit_from_error(
        &mut self, platform: &str, model_id: &str, message: Option<&str>,
    ) -> Result<Option<LearnedLimit>> {
        check_name("platform", platform)?;
        check_name("model_id", model_id)?;
        let Some(learned) = parse_provider_limit(message) else { return Ok(None) };
        self.writing(|e, _, writes| Ok(e.learn(platform, model_id, Some(learned), writes))).map(|(l, _)| l)
    }

    /// SPEC §6.2: one call for any failure. Benches the route (never shortening a
    /// later-expiring cooldown), counts ladder/auth/streak history, learns limits.
    pub fn record_failure(&mut self, route: &Route, f: FailureInput) -> Result<FailureOutcome> {
        self.record_failure_of(route, f, None)
    }

    /// `record_failure`, of lease `lease` when given (SPEC 15.4 does not count the
    /// failing lease among the key's live ones).
    fn record_failure_of(
        &mut self, route: &Route, f: FailureInput, lease: Option<i64>,
    ) -> Result<FailureOutcome> {
        if let Some(RetryAfter::Millis(ms)) = f.retry_after {
            check_non_negative("retry_after", ms)?;
        }
        let kind = f.kind.unwrap_or_else(|| infer_failure_kind(f.status, f.message.as_deref()));
        let said = Said::read(&f, kind);
        self.writing(|e, now, writes| {
            if penalizes(kind) {
                // SPEC 24.7: the model ranks after healthy ones for 5 minutes, in every
                // engine sharing the store (the latest row per key and model says when).
                writes.push(Write::DeleteHistory {
                    key_id: route.key_id,
                    route: Some((Arc::from(route.platform.as_str()), Arc::from(route.model_id.as_str()))),
                    kinds: vec![HistoryKind::Penalty],
                });
                writes.push(history_row(route, HistoryKind::Penalty, now));
            }
            e.record_failure_at(route, f, &said, lease, now, writes)
        })
        .map(|(o, _)| {
            // SPEC 27.1: every failure recorded, by its kind.
            self.unit.counters.failure(&route.platform, kind.as_str());
            o
        })
    }

    fn record_failure_at(
        &mut self, route: &Route, f: FailureInput, said: &Said, lease: Option<i64>, now: i64,
        writes: &mut Vec<Write>,
    ) -> Result<FailureOutcome> {
        let kind = said.kind;
        let skip = said.skip;
        let limits = f.limits.clone();
        // SPEC 21.2: a pool 429's X-RateLimit-Reset is the authoritative retry time.
        let pool = said.pool;
        let pool_retry = pool.and_then(|s| s.reset_at_ms).map(|at| at.saturating_sub(now).clamp(0, DAY_MS));
        let retry_ms = match &f.retry_after {
            Some(RetryAfter::Text(t)) => parse_retry_after_ms(Some(t), now),
            Some(RetryAfter::Millis(ms)) => Some((*ms).min(DAY_MS)),
            None => None,
        }
        .or(pool_retry)
        .or(said.stated_ms);
        if let Some(s) = pool {
            self.learn_pool_cap(route, s, now, writes);
        }
        let learned = self.learn(&route.platform, &route.model_id, said.limit, writes);
        let learned = if kind == FailureKind::Concurrency {
            Some(self.learn_concurrency_cap(route, lease, now, writes))
        } else {
            learned
        };
        let limits = self.unit.mirror.limits_for(&route.platform, &route.model_id, limits);
        let local = self.is_local(route.key_id);
        if kind != FailureKind::EmptyCompletion && self.unit.mirror.reader().empty_streak(route) > 0 {
            // Any other outcome ends the empty-completion streak.
            writes.push(Write::DeleteHistory {
                key_id: route.key_id,
                route: Some((Arc::from(route.platform.as_str()), Arc::from(route.model_id.as_str()))),
                kinds: vec![HistoryKind::Empty],
            });
        }
        let local_bench = CooldownDecision::new(LOCAL_BENCH_MS, CooldownSource::Heuristic);
        let decision = match kind_rule(kind) {
            KindRule::None | KindRule::Concurrency => None,
            KindRule::Upstream if !local => {
                let cooldown = Some(self.bench_upstream(route, retry_ms, now, writes));
                return Ok(FailureOutcome { kind, cooldown, learned, skip });
            }
            // SPEC §6.2: a local endpoint gets 5 s whenever the kind benches at all;
            // nothing escalates (the streak still counts, to know when it benches).
            KindRule::EmptyStreak => {
                let n = self.unit.mirror.reader().empty_streak(route) + 1;
                writes.push(history_row(route, HistoryKind::Empty, now));
                (n >= EMPTY_STREAK_BENCH).then(|| {
                    if local {
                        local_bench
                    } else {
                        self.limit_decision(route, limits, retry_ms, false, now, writes)
                    }
                })
            }
            _ if local => Some(local_bench),
            KindRule::Fixed(d) => Some(d),
            KindRule::AuthLadder => {
                let n = self.unit.mirror.reader().auth_failures(route, now.saturating_sub(DAY_MS)) + 1;
                writes.push(history_row(route, HistoryKind::Auth, now));
                Some(CooldownDecision::new(ladder_step(&AUTH_LADDER_MS, n), CooldownSource::Heuristic))
            }
            // SPEC 21.2: the pool's stated reset is authoritative, whatever the ladder says.
            KindRule::DailyQuota | KindRule::Limit { .. } if pool_retry.is_some() => {
                let ms = pool_retry.unwrap_or_default().max(MIN_STATED_BENCH_MS);
                Some(CooldownDecision::new(ms, CooldownSource::Authoritative))
            }
            KindRule::DailyQuota => Some(self.daily_quota_bench(route, retry_ms, now, writes)),
            KindRule::Limit { quota_signal } => {
                Some(self.limit_decision(route, limits, retry_ms, quota_signal, now, writes))
            }
            // A local endpoint (handled above): the route's 5 s.
            KindRule::Upstream => Some(local_bench),
        };
        let cooldown = decision.map(|d| {
            let rid = self.unit.mirror.route_id(&route.platform, &route.model_id, route.key_id);
            let expires = now.saturating_add(d.duration_ms);
            match self.unit.mirror.reader().own_cooldown(rid, now) {
                // Never shorten: a cooldown that lasts as long or longer stands.
                Some(c) if c.expires_at_ms >= expires => {
                    CooldownDecision::new(c.expires_at_ms.saturating_sub(now), c.source)
                }
                _ => {
                    writes.push(Write::UpsertCooldown(CooldownRow {
                        platform: Arc::from(route.platform.as_str()),
                        model_id: Arc::from(route.model_id.as_str()),
                        key_id: Some(route.key_id),
                        expires_at_ms: expires,
                        source: d.source,
                        set_at_ms: now,
                    }));
                    self.unit.logs.push((
                        log::Level::Info,
                        format!(
                            "cooldown {route} for {} ms ({}, {})",
                            d.duration_ms,
                            d.source.as_str(),
                            kind.as_str()
                        ),
                    ));
                    d
                }
            }
        });
        Ok(FailureOutcome { kind, cooldown, learned, skip })
    }

    /// A probe passed for `key_id` (SPEC §11): clears every heuristic cooldown of the
    /// key, on every model, keeping the ladder history; logs `cooldown_recovered`.
    /// Returns how many cooldowns went.
    pub fn recover_key(&mut self, key_id: i64) -> Result<i64> {
        self.writing(|e, now, writes| Ok(e.recover_key_at(key_id, now, writes))).map(|(n, _)| n)
    }

    fn recover_key_at(&mut self, key_id: i64, now: i64, writes: &mut Vec<Write>) -> i64 {
        let mut cleared = Vec::new();
        for c in self.unit.mirror.reader().held_cooldowns() {
            let r = &c.route;
            if !c.model_wide
                && r.key_id == key_id
                && c.source == CooldownSource::Heuristic
                && now < c.expires_at_ms
            {
                cleared.push(format!("{}/{}", r.platform, r.model_id));
                writes.push(Write::DeleteCooldown {
                    platform: Arc::from(r.platform.as_str()),
                    model_id: Arc::from(r.model_id.as_str()),
                    key_id,
                });
            }
        }
        if writes.is_empty() {
            return 0;
        }
        let n = writes.len() as i64;
        cleared.sort();
        let message =
            format!("cooldown_recovered: key {key_id} passed a probe; cleared {}", cleared.join(", "));
        let platform = cleared.first().and_then(|r| r.split('/').next()).map(str::to_string);
        self.unit.logs.push((log::Level::Info, message.clone()));
        writes.push(Write::Log(LogRow {
            level: "info",
            source: "cooldown-probe".into(),
            provider: platform,
            model: None,
            event: Some("cooldown_recovered".into()),
            message,
            created_at_ms: now,
        }));
        n
    }

    /// SPEC §15.1: a spent daily quota. Without a stated delay, or with one that reaches
    /// the platform's next day start, the bench runs until then (at most 24 h),
    /// authoritative. A shorter stated delay (Gemini's `retryDelay: "17s"` on a
    /// `...PerDay...` quota) is not believed: the route takes the next step of its
    /// ladder, never past the next day start, heuristic, or the delay when it is
    /// longer than that step, authoritative; the step counts on the ladder.
    fn daily_quota_bench(
        &mut self, route: &Route, retry_ms: Option<i64>, now: i64, writes: &mut Vec<Write>,
    ) -> CooldownDecision {
        let rid = self.unit.mirror.route_id(&route.platform, &route.model_id, route.key_id);
        let until_next_day = self.unit.mirror.reader().next_day_start(rid, now).saturating_sub(now);
        let delay = match retry_ms {
            Some(d) if d < until_next_day => d,
            stated => {
                let d = stated.unwrap_or(until_next_day);
                return CooldownDecision::new(d.min(DAY_MS), CooldownSource::Authoritative);
            }
        };
        let steps = self.unit.mirror.reader().ladder_steps(route, now.saturating_sub(DAY_MS));
        writes.push(history_row(route, HistoryKind::Ladder, now));
        let step = ladder_step(&LADDER_MS, steps.saturating_add(1)).min(until_next_day);
        if delay > step {
            CooldownDecision::new(delay, CooldownSource::Authoritative)
        } else {
            CooldownDecision::new(step, CooldownSource::Heuristic)
        }
    }

    /// SPEC 24.2 inside an open write section: a concurrency failure sets the key's
    /// learned cap to the other leases that were live on the key when the failing
    /// lease was admitted (without a lease, or one this engine did not admit: those
    /// live now), at least 1. The key's chain of such failures is kept (never swept)
    /// from the last that set the wait back to 1 h, at most its last few: the cap
    /// rises from it as `learned_concurrency_cap` says, with no write per rise.
    fn learn_concurrency_cap(
        &mut self, route: &Route, lease: Option<i64>, now: i64, writes: &mut Vec<Write>,
    ) -> LearnedLimit {
        let read = self.unit.mirror.reader();
        let others = lease
            .and_then(|id| read.others_at_admission(id))
            .unwrap_or_else(|| read.key_live_leases(&route.platform, route.key_id, lease, now))
            .max(1);
        let mut chain = read.concurrency_chain(&route.platform, route.key_id);
        let before = learned_concurrency_cap(&chain, now);
        chain.push((now, others));
        let start = concurrency_chain_start(&chain);
        if start > 0 {
            // The chain's earlier failures no longer count: its kept part is written again.
            writes.push(Write::DeleteHistory {
                key_id: route.key_id,
                route: Some((Arc::from(route.platform.as_str()), Arc::from(""))),
                kinds: vec![HistoryKind::Concurrency],
            });
            for &(at, cap) in &chain[start..chain.len() - 1] {
                writes.push(history_value_row(route, HistoryKind::Concurrency, Some(cap), at));
            }
        }
        writes.push(history_value_row(route, HistoryKind::Concurrency, Some(others), now));
        if before != Some(others) {
            self.unit.logs.push((
                log::Level::Info,
                format!(
                    "learned a concurrency cap of {others} for {}/key {} from a provider error",
                    route.platform, route.key_id
                ),
            ));
        }
        LearnedLimit { kind: LimitAxis::Concurrency, limit: others }
    }

    /// The key concurrency cap in force (SPEC 15.4, 20, 24.2): the lowest of the env cap,
    /// the key's configured cap and the one learned from concurrency failures.
    pub fn key_concurrency_cap(&mut self, platform: &str, key_id: i64) -> Result<Option<i64>> {
        check_name("platform", platform)?;
        self.unit.run(Access::Read, |tx| {
            let now = tx.now();
            let m = tx.mirror();
            Ok(m.key_concurrency_cap(platform, key_id, now))
        })
    }

    // ---- aggregators (SPEC 21) ---------------------------------------------------

    /// SPEC 21.1 inside an open write section: benches the route's model for every key
    /// of the platform (a cooldown with no key, source "upstream"), 60 s doubling along
    /// a chain of upstream failures each within 10 min of the last, at most 5 min, or
    /// the stated delay. Never shortens a model bench that lasts as long or longer.
    /// The key's own cooldown and ladder are untouched.
    fn bench_upstream(
        &mut self, route: &Route, stated_ms: Option<i64>, now: i64, writes: &mut Vec<Write>,
    ) -> CooldownDecision {
        let (platform, model_id) = (route.platform.as_str(), route.model_id.as_str());
        let chain = upstream_chain(&mut self.unit.mirror.reader().upstream_hits(platform, model_id), now);
        let bench = upstream_bench_ms(chain, stated_ms).min(DAY_MS);
        writes.push(history_row(route, HistoryKind::Upstream, now));
        let expires = now.saturating_add(bench);
        if let Some(c) = self.unit.mirror.reader().model_bench(platform, model_id, now) {
            if c.expires_at_ms >= expires {
                return CooldownDecision::new(c.expires_at_ms.saturating_sub(now), c.source);
            }
        }
        let row = CooldownRow {
            platform: Arc::from(platform),
            model_id: Arc::from(model_id),
            key_id: None,
            expires_at_ms: expires,
            source: CooldownSource::Upstream,
            set_at_ms: now,
        };
        writes.push(Write::UpsertCooldown(row));
        self.unit.logs.push((
            log::Level::Info,
            format!(
                "cooldown {platform}/{model_id} on every key for {bench} ms (upstream, failure {})",
                chain + 1
            ),
        ));
        CooldownDecision::new(bench, CooldownSource::Upstream)
    }

    /// SPEC 21.2, 24.6 inside an open write section: the cap a pool 429 states becomes
    /// the key's account's learned provider cap, only ever lowered by learning; the
    /// reset it states spends the pool of the failing route for the whole account
    /// until then (at most a day ahead). Both rows name the account, not the key.
    fn learn_pool_cap(&mut self, route: &Route, s: PoolSignal, now: i64, writes: &mut Vec<Write>) {
        let kind = match s.axis {
            PoolAxis::Minute => HistoryKind::PoolMinute,
            PoolAxis::Day => HistoryKind::PoolDay,
        };
        let account = self.unit.mirror.config.account_name(&route.platform, route.key_id);
        let axis = if kind == HistoryKind::PoolMinute { "minute" } else { "daily" };
        // One row of each per key and account; the latest replaces the key's earlier one.
        let mut replace = |model_id: String, value: i64| {
            let model_id: Arc<str> = Arc::from(model_id);
            writes.push(Write::DeleteHistory {
                key_id: route.key_id,
                route: Some((Arc::from(route.platform.as_str()), model_id.clone())),
                kinds: vec![kind],
            });
            writes.push(Write::InsertHistory(HistoryRow {
                platform: Arc::from(route.platform.as_str()),
                model_id,
                key_id: route.key_id,
                kind,
                hit_at_ms: now,
                value: Some(value),
            }));
        };
        if let Some(reset) = s.reset_at_ms.filter(|r| *r > now) {
            // History lives a day: a reset further ahead is a day (as the bench is).
            let until = reset.min(now.saturating_add(DAY_MS));
            let pool = infer_quota_pool_key(&route.platform, Some(&route.model_id));
            replace(pool_reset_row(&pool, &account), until);
            self.unit.logs.push((
                log::Level::Info,
                format!(
                    "provider {axis} pool {pool} of {} account {account} spent until {until} \
                     (a pool 429): every route of it refused until then",
                    route.platform
                ),
            ));
        }
        let Some(limit) = s.limit else { return };
        let before = self.unit.mirror.history.learned_pool_cap(&route.platform, &account, kind);
        let cap = before.map_or(limit, |b| b.min(limit));
        replace(pool_cap_row(&account), cap);
        if before != Some(cap) {
            self.unit.logs.push((
                log::Level::Info,
                format!(
                    "learned a provider {axis} request cap of {cap} for {} account {account} from a pool 429",
                    route.platform,
                ),
            ));
        }
    }

    /// The provider caps learned for a key's account from pool 429s (SPEC 21.2).
    pub fn learned_provider_caps(&mut self, platform: &str, key_id: i64) -> Result<LimitSet> {
        check_name("platform", platform)?;
        self.unit.run(Access::Read, |tx| {
            let m = tx.mirror();
            let account = m.config.account_name(platform, key_id);
            Ok(LimitSet::provider(m.history.learned_caps(platform, &account)))
        })
    }
}
