//! SPEC 21: what an aggregator's errors teach beyond the failing route. An upstream
//! congested for one model benches the model on every key (21.1); a pool 429 teaches
//! the account a provider cap (21.2), which the gates read through `effective_caps`.
use super::*;
use crate::core::upstream::{upstream_bench_ms, upstream_chain, PoolAxis, PoolSignal};

impl Engine {
    /// SPEC 21.1 inside an open write section: benches the route's model for every key
    /// of the platform (a cooldown with no key, source "upstream"), 60 s doubling along
    /// a chain of upstream failures each within 10 min of the last, at most 5 min, or
    /// the stated delay. Never shortens a model bench that lasts as long or longer.
    /// The key's own cooldown and ladder are untouched.
    pub(super) fn bench_upstream(
        &mut self,
        route: &Route,
        stated_ms: Option<i64>,
        now: i64,
        writes: &mut Vec<Write>,
    ) -> CooldownDecision {
        let (platform, model_id) = (route.platform.as_str(), route.model_id.as_str());
        let chain = upstream_chain(&mut self.unit.mirror.history.upstream_hits(platform, model_id), now);
        let bench = upstream_bench_ms(chain, stated_ms).min(DAY_MS);
        writes.push(Self::history_row(route, HistoryKind::Upstream, now));
        let expires = now.saturating_add(bench);
        if let Some(c) = self.unit.mirror.cooldowns.of_model(platform, model_id, now) {
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

    /// SPEC 21.2 inside an open write section: the cap a pool 429 states becomes the
    /// key's account's learned provider cap, only ever lowered by learning.
    pub(super) fn learn_pool_cap(&mut self, route: &Route, s: PoolSignal, now: i64, writes: &mut Vec<Write>) {
        let Some(limit) = s.limit else { return };
        let kind = match s.axis {
            PoolAxis::Minute => HistoryKind::PoolMinute,
            PoolAxis::Day => HistoryKind::PoolDay,
        };
        let keys = self.unit.mirror.account_keys(&route.platform, route.key_id);
        let before = self.unit.mirror.history.learned_pool_cap(&route.platform, &keys, kind);
        let cap = before.map_or(limit, |b| b.min(limit));
        // One row per key; the latest confirms the cap (history lives a day).
        writes.push(Write::DeleteHistory {
            key_id: route.key_id,
            route: Some((Arc::from(route.platform.as_str()), Arc::from(""))),
            kinds: vec![kind],
        });
        writes.push(Write::InsertHistory(HistoryRow {
            platform: Arc::from(route.platform.as_str()),
            model_id: Arc::from(""),
            key_id: route.key_id,
            kind,
            hit_at_ms: now,
            value: Some(cap),
        }));
        if before != Some(cap) {
            let axis = if kind == HistoryKind::PoolMinute { "minute" } else { "daily" };
            self.unit.logs.push((
                log::Level::Info,
                format!(
                    "learned a provider {axis} request cap of {cap} for {} account {} from a pool 429",
                    route.platform,
                    self.unit.mirror.config.account_name(&route.platform, route.key_id)
                ),
            ));
        }
    }

    /// The provider caps learned for a key's account from pool 429s (SPEC 21.2).
    pub fn learned_provider_caps(&mut self, platform: &str, key_id: i64) -> Result<ProviderCaps> {
        check_name("platform", platform)?;
        self.unit.read(|m, _| {
            let keys = m.account_keys(platform, key_id);
            ProviderCaps {
                daily_requests: m.history.learned_pool_cap(platform, &keys, HistoryKind::PoolDay),
                minute_requests: m.history.learned_pool_cap(platform, &keys, HistoryKind::PoolMinute),
                daily_tokens: None,
            }
        })
    }
}
