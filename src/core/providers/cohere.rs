//! Cohere: every model draws on the trial key's pool (SPEC §8.1).
use super::{pooled, Pool, Provider};

pub(super) const PROVIDER: Provider = pooled("cohere", Pool::Fixed("cohere::trial-pool"));
