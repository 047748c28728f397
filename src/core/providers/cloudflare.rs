//! Cloudflare Workers AI: every model draws on the account's pool (SPEC §8.1); its
//! daily allocation is counted in neurons (the corpus, `cloudflare/`).
use super::{pooled, Pool, Provider};

pub(super) const PROVIDER: Provider = pooled("cloudflare", Pool::Fixed("cloudflare::account"));
