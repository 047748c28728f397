//! Mistral: every model draws on the experiment pool (SPEC §8.1).
use super::{generic, Pool, Provider};

pub(super) const PROVIDER: Provider = Provider {
    name: "mistral",
    hosts: &["api.mistral.ai"],
    pool: Pool::Fixed("mistral::experiment-pool"),
    ..generic::PROVIDER
};
