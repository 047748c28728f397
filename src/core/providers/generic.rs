//! Any platform the table does not name: each model its own pool, UTC days, no
//! default caps, no host of its own.
use super::{DefaultCaps, Pool, Provider};

pub(super) const PROVIDER: Provider = Provider {
    name: "generic",
    hosts: &[],
    day_zone: "UTC",
    pool: Pool::PerModel,
    caps: DefaultCaps::NONE,
    header_families: &[],
};
