//! NVIDIA NIM: one pool for the account (SPEC §8.1), 40 requests a minute (SPEC §8).
use super::{generic, DefaultCaps, Pool, Provider};

pub(super) const PROVIDER: Provider = Provider {
    name: "nvidia",
    hosts: &["integrate.api.nvidia.com"],
    pool: Pool::Fixed("nvidia::account"),
    caps: DefaultCaps { requests_per_minute: Some(40), ..DefaultCaps::NONE },
    ..generic::PROVIDER
};
