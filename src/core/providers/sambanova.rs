//! SambaNova: every model draws on one shared pool (SPEC §8.1).
use super::{pooled, Pool, Provider};

pub(super) const PROVIDER: Provider = pooled("sambanova", Pool::Fixed("sambanova::shared"));
