//! Aggregators with one free pool each, `<platform>::free` (SPEC §8.1), and nothing
//! else the engine knows of them.
use super::{pooled, Pool, Provider};

pub(super) const ROUTEWAY: Provider = pooled("routeway", Pool::Free);
pub(super) const BAZAARLINK: Provider = pooled("bazaarlink", Pool::Free);
pub(super) const UNOROUTER: Provider = pooled("unorouter", Pool::Free);
pub(super) const ORCAROUTER: Provider = pooled("orcarouter", Pool::Free);
pub(super) const XKIRO: Provider = pooled("xkiro", Pool::Free);
pub(super) const ANYAPI: Provider = pooled("anyapi", Pool::Free);
pub(super) const NARA: Provider = pooled("nara", Pool::Free);
pub(super) const SEALION: Provider = pooled("sealion", Pool::Free);
pub(super) const AION: Provider = pooled("aion", Pool::Free);
pub(super) const REQUESTY: Provider = pooled("requesty", Pool::Free);
