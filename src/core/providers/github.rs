//! GitHub Models: every model draws on the account's pool (SPEC §8.1).
use super::{pooled, Pool, Provider};

pub(super) const PROVIDER: Provider = pooled("github", Pool::Fixed("github::account"));
