//! Cerebras: one shared pool (SPEC §8.1); its headers carry the window in the name,
//! `x-ratelimit-{..}-requests-day` and `x-ratelimit-{..}-tokens-minute` (SPEC §8.2).
use super::{generic, HeaderFamily, Pool, Provider};

pub(super) const PROVIDER: Provider = Provider {
    name: "cerebras",
    hosts: &["api.cerebras.ai"],
    pool: Pool::Fixed("cerebras::shared"),
    header_families: &[HeaderFamily::Windowed],
    ..generic::PROVIDER
};
