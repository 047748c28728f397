//! Navy: an aggregator with one free pool (SPEC §8.1) and a daily token cap (SPEC §8).
use super::{generic, DefaultCaps, Pool, Provider};

pub(super) const PROVIDER: Provider = Provider {
    name: "navy",
    pool: Pool::Free,
    caps: DefaultCaps { tokens_per_day: Some(150_000), ..DefaultCaps::NONE },
    ..generic::PROVIDER
};
