//! Keys and their accounts (SPEC §14.3, 20, 22.1), as the configuration desk asks,
//! and their observed quota (SPEC §8.2), as the observed desk and the `headroom` pick do.
use super::Reader;
use crate::core::pools::is_local_base_url;
use crate::core::store::QuotaStateRow;
use crate::core::types::KeyInfo;
use std::sync::Arc;

impl<'m> Reader<'m> {
    /// The key registered as `key_id`, any platform.
    pub fn registered_key(self, key_id: i64) -> Option<&'m KeyInfo> {
        self.m.config.keys.get(&key_id)
    }

    /// The concurrency cap configured for a key (SPEC 20), `None` when it has none or
    /// is not registered.
    pub fn configured_concurrency_cap(self, key_id: i64) -> Option<i64> {
        self.registered_key(key_id).and_then(|k| k.concurrency_cap)
    }

    /// Whether a key's base URL is a local endpoint (SPEC §6.2's 5 s benches).
    pub fn key_is_local(self, key_id: i64) -> bool {
        self.registered_key(key_id).and_then(|k| k.base_url.as_deref()).is_some_and(is_local_base_url)
    }

    /// The account a key belongs to (SPEC §14.3): the one it was registered with,
    /// else its own, `"key:<key_id>"`.
    pub fn account_name(self, platform: &str, key_id: i64) -> Arc<str> {
        self.m.config.account_name(platform, key_id)
    }

    /// The registered, enabled keys of a platform (SPEC §9's routable keys).
    pub fn routable_keys(self, platform: &str) -> &'m [i64] {
        self.m.config.routable_keys(platform)
    }

    /// The reserve of a call of `priority` (SPEC 22.1): the fraction set for the
    /// largest configured priority `<= priority` (0 when none).
    pub fn reserve_for(self, priority: i64) -> f64 {
        self.m.reserves.for_priority(priority)
    }

    /// The observed quota rows of a platform's keys (SPEC §8.2), as last merged.
    pub fn quota_rows(self, platform: &str) -> &'m [QuotaStateRow] {
        self.m.quota.of(platform)
    }

    /// SPEC §8.2's headroom of the keys of a platform at `now`, sorted by key: per key,
    /// the worst `min(1, remaining / limit)` over its confident rows (a row past its
    /// reset counts 1.0).
    pub fn quota_headroom(self, platform: &str, now: i64) -> Vec<(i64, f64)> {
        self.m.quota.headroom(platform, now)
    }

    /// [`Reader::quota_headroom`] of one key, `None` when nothing observed counts.
    #[inline]
    pub fn key_quota_headroom(self, platform: &str, key_id: i64, now: i64) -> Option<f64> {
        self.m.quota.key_headroom(platform, key_id, now)
    }
}
