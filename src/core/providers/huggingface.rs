//! Hugging Face: every model draws on the router's pool (SPEC §8.1).
use super::{pooled, Pool, Provider};

pub(super) const PROVIDER: Provider = pooled("huggingface", Pool::Fixed("huggingface::router"));
