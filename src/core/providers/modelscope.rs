//! ModelScope: one pool for the account (SPEC §8.1), 1,800 requests a day (SPEC §8).
use super::{generic, DefaultCaps, Pool, Provider};

pub(super) const PROVIDER: Provider = Provider {
    name: "modelscope",
    pool: Pool::Fixed("modelscope::account"),
    caps: DefaultCaps { requests_per_day: Some(1800), ..DefaultCaps::NONE },
    ..generic::PROVIDER
};
