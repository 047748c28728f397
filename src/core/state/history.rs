//! The mirrored `failure_history` (SPEC 15, 21): rows by key, what the failure
//! ladder counts and what learned caps are read from.
use crate::core::cooldowns::learned_concurrency_cap;
use crate::core::limits::{cap_values, CapValues, Metric, WindowSpec, DAY, MINUTE};
use crate::core::state::{CooldownRec, FastMap, RouteId};
use crate::core::store::{HistoryKind, HistoryRow};
use std::sync::Arc;

/// `failure_history` by key_id, mirrored (pruned after 24 h, cleared by successes).
#[derive(Debug, Default)]
pub struct History {
    pub(super) by_key: FastMap<i64, Vec<HistoryRow>>,
    /// The pool rows (SPEC 21.2, 24.6) of every key again: they belong to an account,
    /// which a decision finds here without walking every key's failures.
    pools: Vec<HistoryRow>,
}

impl History {
    pub fn replace(&mut self, rows: Vec<HistoryRow>) {
        self.by_key.clear();
        self.pools.clear();
        for r in rows {
            self.add(r);
        }
    }

    /// Drops the rows before `before`, but for a learned concurrency cap's (SPEC 24.2:
    /// never forgotten; `clear_cooldowns_for_key` forgets it).
    pub fn prune(&mut self, before: i64) {
        let kept = |h: &HistoryRow| h.hit_at_ms >= before || h.kind == HistoryKind::Concurrency;
        self.by_key.retain(|_, rows| {
            rows.retain(kept);
            !rows.is_empty()
        });
        self.pools.retain(kept);
    }

    pub fn add(&mut self, row: HistoryRow) {
        if is_pool(&row) {
            self.pools.push(row.clone());
        }
        self.by_key.entry(row.key_id).or_default().push(row);
    }

    /// Removes matching history; returns how many rows went.
    pub fn remove(&mut self, key_id: i64, route: Option<(&str, &str)>, kinds: &[HistoryKind]) -> i64 {
        let Some(rows) = self.by_key.get_mut(&key_id) else { return 0 };
        let matches = |h: &HistoryRow| {
            h.key_id == key_id
                && kinds.contains(&h.kind)
                && route.is_none_or(|(p, m)| &*h.platform == p && &*h.model_id == m)
        };
        let before = rows.len();
        rows.retain(|h| !matches(h));
        let removed = (before - rows.len()) as i64;
        if rows.is_empty() {
            self.by_key.remove(&key_id);
        }
        if removed > 0 && kinds.iter().any(|k| matches!(k, HistoryKind::PoolDay | HistoryKind::PoolMinute)) {
            self.pools.retain(|h| !matches(h));
        }
        removed
    }

    /// Hits of one kind on a route (or, for `Auth`, on the key) with `hit_at_ms > since`.
    pub fn count(&self, route: &crate::core::types::Route, kind: HistoryKind, since: i64) -> i64 {
        let Some(rows) = self.by_key.get(&route.key_id) else { return 0 };
        rows.iter()
            .filter(|h| {
                h.kind == kind
                    && h.hit_at_ms > since
                    && (if kind.of_key() {
                        &*h.platform == route.platform.as_str()
                    } else {
                        &*h.platform == route.platform.as_str() && &*h.model_id == route.model_id.as_str()
                    })
            })
            .count() as i64
    }

    /// Whether a success on `route` has history to clear: the route's ladder,
    /// unknown-limit, transient and empty-completion rows, and the key's auth rows (a
    /// learned concurrency cap stays). O(1) for a key without failures (the hot path).
    pub fn has_to_clear(&self, route: &crate::core::types::Route) -> (bool, bool) {
        let Some(rows) = self.by_key.get(&route.key_id) else { return (false, false) };
        let mut route_rows = false;
        let mut auth_rows = false;
        for h in rows {
            match h.kind {
                HistoryKind::Auth => auth_rows = true,
                // Kept: a learned cap, and the upstream chain that decays on its own.
                HistoryKind::Concurrency
                | HistoryKind::PoolMinute
                | HistoryKind::PoolDay
                | HistoryKind::Upstream
                | HistoryKind::Penalty => {}
                _ => {
                    route_rows |=
                        &*h.platform == route.platform.as_str() && &*h.model_id == route.model_id.as_str()
                }
            }
        }
        (route_rows, auth_rows)
    }

    /// The times of the upstream failures of a (platform, model) on any key (SPEC 21.1).
    pub fn upstream_hits(&self, platform: &str, model_id: &str) -> Vec<i64> {
        self.by_key
            .values()
            .flatten()
            .filter(|h| {
                h.kind == HistoryKind::Upstream && &*h.platform == platform && &*h.model_id == model_id
            })
            .map(|h| h.hit_at_ms)
            .collect()
    }

    /// Whether a (platform, model) failed in a way that penalizes it (SPEC 24.7) on any
    /// key at or after `since`. O(1) when no key has failure history (the hot path).
    #[inline]
    pub fn penalized(&self, platform: &str, model_id: &str, since: i64) -> bool {
        !self.by_key.is_empty()
            && self.by_key.values().flatten().any(|h| {
                h.kind == HistoryKind::Penalty
                    && h.hit_at_ms >= since
                    && &*h.platform == platform
                    && &*h.model_id == model_id
            })
    }

    /// The provider cap of one kind (`PoolMinute` or `PoolDay`) learned for an
    /// account from pool 429s (SPEC 21.2, 24.6): the lowest any key learned for it
    /// (its rows name the account, [`pool_cap_row`], so they follow the account and
    /// not the key).
    pub fn learned_pool_cap(&self, platform: &str, account: &str, kind: HistoryKind) -> Option<i64> {
        let name = pool_cap_row(account);
        self.pool_rows(platform, kind, &name).filter_map(|h| h.value).min()
    }

    /// The provider caps learned for an account from pool 429s (SPEC 21.2, 24.6):
    /// requests per day and per minute.
    pub fn learned_caps(&self, platform: &str, account: &str) -> CapValues {
        cap_values(POOL_KINDS.map(|(slot, kind)| (slot, self.learned_pool_cap(platform, account, kind))))
    }

    /// Until when a pool 429 spent a pool of an account, per provider cap (SPEC 24.6):
    /// the latest reset any key was told for it, while it is ahead of `now`.
    pub fn pool_spent(&self, platform: &str, account: &str, pool: &str, now: i64) -> CapValues {
        let name = pool_reset_row(pool, account);
        cap_values(POOL_KINDS.map(|(slot, kind)| {
            (slot, self.pool_rows(platform, kind, &name).filter_map(|h| h.value).filter(|t| *t > now).max())
        }))
    }

    fn pool_rows<'a>(
        &'a self, platform: &'a str, kind: HistoryKind, name: &'a str,
    ) -> impl Iterator<Item = &'a HistoryRow> + 'a {
        self.pools.iter().filter(move |h| h.kind == kind && &*h.platform == platform && &*h.model_id == name)
    }

    /// What pool 429s taught a key's account (SPEC 21.2, 24.6): its learned caps and
    /// until when its pool `pool` is spent. `None` at once, without allocating, when no
    /// account has any (the hot path).
    pub fn pool_state(
        &self, platform: &str, account: impl FnOnce() -> Arc<str>, pool: impl FnOnce() -> String, now: i64,
    ) -> Option<PoolState> {
        if self.pools.is_empty() {
            return None;
        }
        let account = account();
        Some(PoolState {
            caps: self.learned_caps(platform, &account),
            spent: self.pool_spent(platform, &account, &pool(), now),
        })
    }

    /// The key concurrency cap learned from concurrency failures (SPEC 24.2): the
    /// latest failure's cap, risen since as its chain says. Never forgotten.
    pub fn learned_concurrency_cap(&self, platform: &str, key_id: i64, now: i64) -> Option<i64> {
        let rows = self.by_key.get(&key_id)?;
        if !rows.iter().any(|h| h.kind == HistoryKind::Concurrency) {
            return None;
        }
        learned_concurrency_cap(&self.concurrency_chain(platform, key_id), now)
    }

    /// A key's concurrency failures `(hit_at_ms, cap)` in time order (SPEC 24.2).
    pub fn concurrency_chain(&self, platform: &str, key_id: i64) -> Vec<(i64, i64)> {
        let mut chain: Vec<(i64, i64)> = self
            .by_key
            .get(&key_id)
            .into_iter()
            .flatten()
            .filter(|h| h.kind == HistoryKind::Concurrency && &*h.platform == platform)
            .map(|h| (h.hit_at_ms, h.value.unwrap_or(1)))
            .collect();
        chain.sort_by_key(|(at, _)| *at);
        chain
    }
}

/// Whether a row keeps what a pool 429 taught (SPEC 21.2, 24.6).
fn is_pool(h: &HistoryRow) -> bool {
    matches!(h.kind, HistoryKind::PoolDay | HistoryKind::PoolMinute)
}

/// The provider caps a pool 429 teaches, by the history kind that keeps them.
const POOL_KINDS: [((Metric, WindowSpec), HistoryKind); 2] =
    [((Metric::Requests, DAY), HistoryKind::PoolDay), ((Metric::Requests, MINUTE), HistoryKind::PoolMinute)];

/// The `model_id` of a row that keeps an account's learned provider cap (SPEC 21.2,
/// 24.6): the account's name, so that the cap stays with the account when its key
/// moves to another one. (Rows of before, with `model_id` '', are no longer read.)
pub fn pool_cap_row(account: &str) -> String {
    format!("cap|{account}")
}

/// The `model_id` of a row that keeps until when a pool of an account is spent
/// (SPEC 24.6): the pool (SPEC 8.1) and the account; `value` is the reset time.
pub fn pool_reset_row(pool: &str, account: &str) -> String {
    format!("reset|{pool}|{account}")
}

/// What pool 429s taught an account, per provider cap ([`CapValues`] slots).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolState {
    /// The learned caps.
    pub caps: CapValues,
    /// Until when (epoch ms) the pool is spent, refused whatever was counted.
    pub spent: CapValues,
}

/// The mirrored cooldowns: each route's own, and each model's bench for every key
/// (SPEC 21.1).
#[derive(Debug, Default)]
pub struct Cooldowns {
    pub routes: FastMap<RouteId, CooldownRec>,
    /// platform -> model_id -> the model's bench for every key (SPEC 21.1).
    pub models: FastMap<Arc<str>, FastMap<Arc<str>, CooldownRec>>,
}

impl Cooldowns {
    /// The route's own active cooldown (not its model's, SPEC 21.1).
    pub fn of_route(&self, rid: RouteId, now: i64) -> Option<CooldownRec> {
        self.routes.get(&rid).copied().filter(|c| now < c.expires_at_ms)
    }

    /// The active model-wide bench of a (platform, model) (SPEC 21.1).
    #[inline]
    pub fn of_model(&self, platform: &str, model_id: &str, now: i64) -> Option<CooldownRec> {
        if self.models.is_empty() {
            return None;
        }
        self.models.get(platform)?.get(model_id).copied().filter(|c| now < c.expires_at_ms)
    }

    /// Drops the route and model-wide cooldowns that expired at `t`; how many went.
    pub fn remove_expired(&mut self, t: i64) -> i64 {
        let before = self.routes.len();
        self.routes.retain(|_, c| c.expires_at_ms > t);
        let models = self.remove_expired_models(t);
        (before - self.routes.len()) as i64 + models
    }

    /// Drops model-wide benches that expired at `now`; how many went.
    fn remove_expired_models(&mut self, now: i64) -> i64 {
        let mut n = 0i64;
        for models in self.models.values_mut() {
            let before = models.len();
            models.retain(|_, c| c.expires_at_ms > now);
            n += (before - models.len()) as i64;
        }
        self.models.retain(|_, m| !m.is_empty());
        n
    }
}
