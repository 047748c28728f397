//! What the core knows of each provider (STYLE §13): one file per dialect, one
//! [`Provider`] value each, looked up by platform name with [`generic`] as the fallback.
//!
//! A provider's file holds everything the engine knows of it: the API hosts that mean
//! it, the zone its day starts in (SPEC §14.2), the quota pool its models draw on
//! (SPEC §8.1), its default caps (SPEC §8), the header families it sends (SPEC §8.2),
//! and the phrases and extractors its error bodies need (SPEC §7, §15, §21), written
//! with `parse`'s generic readers. Real bodies of each provider sit in the corpus
//! `python/quotaengine/_bodies/<provider>/`, read by the tests here, by pytest and by
//! the demo. A new provider is one file here and one folder there.
//!
//! Platform names are case-sensitive (SPEC 18.6): the table names lower-case
//! platforms, and `"Google"` is [`generic`].
mod anthropic;
mod cerebras;
mod cloudflare;
mod cohere;
mod free_pools;
mod generic;
mod github;
mod google;
mod groq;
mod huggingface;
mod mistral;
mod modelscope;
mod navy;
mod nvidia;
mod ollama;
mod openai;
mod openrouter;
mod sambanova;
mod zhipu;

pub use google::{quota_id_pattern, stated_quota_value};
pub use openrouter::{parse_pool_429, pool_axis, upstream_provider_name, UPSTREAM_PHRASES};

use crate::core::limits::{cap_values, CapValues, Metric, DAY, MINUTE};

/// What the engine knows of one provider.
#[derive(Debug)]
pub struct Provider {
    /// The platform as the tables spell it (SPEC 18.6: case-sensitive).
    pub name: &'static str,
    /// The API hosts (an `api_base`'s host, lower-case) that mean this platform.
    pub hosts: &'static [&'static str],
    /// The IANA zone its day starts in when no one set a calendar (SPEC §14.2).
    pub day_zone: &'static str,
    /// The quota pool its models draw on (SPEC §8.1).
    pub pool: Pool,
    /// Its caps before any setting or environment override (SPEC §8).
    pub caps: DefaultCaps,
    /// The rate-limit header families it sends (SPEC §8.2): documentation, and what
    /// its tests check; the header parser reads every family for every platform.
    pub header_families: &'static [HeaderFamily],
}

/// The bucket a provider's models draw their quota from (SPEC §8.1).
#[derive(Debug, Clone, Copy)]
pub enum Pool {
    /// Each model its own: `<platform>::<model_id>`, `<platform>::account` without one.
    PerModel,
    /// Every model draws on one fixed pool.
    Fixed(&'static str),
    /// An aggregator with one free pool: `<platform>::free`.
    Free,
    /// A rule of the provider's own, from the (trimmed, non-empty) model id; its pools
    /// span the whole account.
    Rule(fn(Option<&str>) -> &'static str),
}

/// A family of rate-limit headers (SPEC §8.2), per metric in the header parser's order
/// of preference:
///
/// | family    | requests                                       | tokens                          |
/// |-----------|------------------------------------------------|---------------------------------|
/// | plain     | `x-ratelimit-{limit,remaining,reset}-requests` | `x-ratelimit-{..}-tokens`       |
/// | windowed  | `x-ratelimit-{..}-requests-day`                | `x-ratelimit-{..}-tokens-minute` |
/// | anthropic | `anthropic-ratelimit-requests-{..}`            | `anthropic-ratelimit-tokens-{..}` |
/// | bare      | `x-ratelimit-{limit,remaining,reset}`          | -                               |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderFamily {
    Plain,
    Windowed,
    Anthropic,
    Bare,
}

/// Which provider-wide cap an aggregator's pool 429 names (SPEC 21.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolAxis {
    /// Requests per minute of the account (`free-models-per-min`).
    Minute,
    /// Requests per day of the account (`free-models-per-day`).
    Day,
}

/// What a 429 naming a provider-wide pool states: which cap, its limit
/// (`X-RateLimit-Limit`) and when it resets (`X-RateLimit-Reset`, epoch ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSignal {
    pub axis: PoolAxis,
    pub limit: Option<i64>,
    pub reset_at_ms: Option<i64>,
}

/// A provider's caps before any override (SPEC §8): `None` is no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DefaultCaps {
    pub requests_per_day: Option<i64>,
    pub requests_per_minute: Option<i64>,
    pub tokens_per_day: Option<i64>,
}

impl DefaultCaps {
    /// No default cap.
    pub const NONE: DefaultCaps =
        DefaultCaps { requests_per_day: None, requests_per_minute: None, tokens_per_day: None };

    /// The caps as the mirror merges them.
    pub fn values(&self) -> CapValues {
        cap_values([
            ((Metric::Requests, DAY), self.requests_per_day),
            ((Metric::Requests, MINUTE), self.requests_per_minute),
            ((Metric::Tokens, DAY), self.tokens_per_day),
        ])
    }
}

/// A provider that differs from the generic one in nothing but its pool.
const fn pooled(name: &'static str, pool: Pool) -> Provider {
    Provider { pool, name, ..generic::PROVIDER }
}

/// Every provider the table names, sorted by name (a lookup is a binary search); the
/// generic one is the fallback, not in the table.
pub const ALL: &[&Provider] = &[
    &free_pools::AION,
    &anthropic::PROVIDER,
    &free_pools::ANYAPI,
    &free_pools::BAZAARLINK,
    &cerebras::PROVIDER,
    &cloudflare::PROVIDER,
    &cohere::PROVIDER,
    &github::PROVIDER,
    &google::PROVIDER,
    &groq::PROVIDER,
    &huggingface::PROVIDER,
    &mistral::PROVIDER,
    &modelscope::PROVIDER,
    &free_pools::NARA,
    &navy::PROVIDER,
    &nvidia::PROVIDER,
    &ollama::PROVIDER,
    &openai::PROVIDER,
    &openrouter::PROVIDER,
    &free_pools::ORCAROUTER,
    &free_pools::REQUESTY,
    &free_pools::ROUTEWAY,
    &sambanova::PROVIDER,
    &free_pools::SEALION,
    &free_pools::UNOROUTER,
    &free_pools::XKIRO,
    &zhipu::PROVIDER,
];

/// The provider of `platform` (case-sensitive, SPEC 18.6); [`generic`] for any
/// platform the table does not name.
pub fn lookup(platform: &str) -> &'static Provider {
    let found = ALL.binary_search_by(|p| p.name.cmp(platform)).ok().and_then(|i| ALL.get(i));
    found.copied().unwrap_or(&generic::PROVIDER)
}

/// Every API host the table knows and the platform it means (an `api_base`'s host,
/// lower-case).
pub fn hosts() -> impl Iterator<Item = (&'static str, &'static str)> {
    ALL.iter().flat_map(|p| p.hosts.iter().map(move |h| (*h, p.name)))
}

/// The platform whose built-in day starts in `zone` (tests that need a calendar
/// other than UTC without naming a provider).
#[cfg(test)]
pub(crate) fn with_day_zone(zone: &str) -> &'static str {
    ALL.iter().find(|p| p.day_zone == zone).map_or(generic::PROVIDER.name, |p| p.name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
