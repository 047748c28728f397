//! Ollama: every model of its cloud draws on one pool (SPEC §8.1). A local server's
//! answer when its request queue is full (SPEC 15.4) is in the corpus, `ollama/`.
use super::{pooled, Pool, Provider};

pub(super) const PROVIDER: Provider = pooled("ollama", Pool::Fixed("ollama::cloud"));
