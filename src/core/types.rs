//! Domain values shared by the core: routes, limits, admissions, cooldown sources.
use crate::core::error::{Error, Result};
// Defined beside the error that carries it, so `error` names no other core module.
pub use crate::core::error::{check_name, check_non_negative, Reason};
// Defined beside `Limit`, so `limits` names no `types`.
use crate::core::limits::LimitSet;
pub use crate::core::limits::{CapOverrides, CapSetting};
use std::fmt;
use std::str::FromStr;

/// One (platform, model_id, key_id): the unit every window and cooldown is kept for.
/// Ordered by those fields, in that order (how reports list routes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Route {
    pub platform: String,
    pub model_id: String,
    pub key_id: i64,
}

impl Route {
    /// Validates and builds a route: platform and model_id must be non-empty.
    pub fn new(platform: impl Into<String>, model_id: impl Into<String>, key_id: i64) -> Result<Self> {
        let (platform, model_id) = (platform.into(), model_id.into());
        check_name("platform", &platform)?;
        check_name("model_id", &model_id)?;
        Ok(Self { platform, model_id, key_id })
    }
}

/// What a request already skipped (SPEC 24.7, `lease_any(..., exclude=)`): a route, a
/// model on every key of its platform, or a platform.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Exclusion {
    Route(Route),
    Model { platform: String, model_id: String },
    Platform(String),
}

impl Exclusion {
    /// A model on a platform, the names checked.
    pub fn model(platform: impl Into<String>, model_id: impl Into<String>) -> Result<Self> {
        let (platform, model_id) = (platform.into(), model_id.into());
        check_name("platform", &platform)?;
        check_name("model_id", &model_id)?;
        Ok(Exclusion::Model { platform, model_id })
    }

    /// A platform, the name checked.
    pub fn platform(platform: impl Into<String>) -> Result<Self> {
        let platform = platform.into();
        check_name("platform", &platform)?;
        Ok(Exclusion::Platform(platform))
    }

    /// Whether it covers `route`.
    pub fn covers(&self, route: &Route) -> bool {
        match self {
            Exclusion::Route(r) => r == route,
            Exclusion::Model { platform, model_id } => {
                *platform == route.platform && *model_id == route.model_id
            }
            Exclusion::Platform(p) => *p == route.platform,
        }
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.platform, self.model_id, self.key_id)
    }
}

/// The answer of `check()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub allowed: bool,
    pub reason: Option<Reason>,
    pub retry_at_ms: Option<i64>,
    /// The tenant whose limit refused, by its own name (SPEC 23.2); `None` for the
    /// route's own gates.
    pub tenant: Option<std::sync::Arc<str>>,
}

impl Admission {
    pub const ALLOWED: Admission = Admission { allowed: true, reason: None, retry_at_ms: None, tenant: None };
    pub fn refused(reason: Reason, retry_at_ms: Option<i64>) -> Self {
        Admission { allowed: false, reason: Some(reason), retry_at_ms, tenant: None }
    }
}

/// Who decided a cooldown's expiry (SPEC §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CooldownSource {
    Heuristic,
    Authoritative,
    Credit,
    Tier,
    /// A model-wide bench of an aggregator's congested upstream (SPEC 21.1).
    Upstream,
}

impl CooldownSource {
    pub fn as_str(self) -> &'static str {
        match self {
            CooldownSource::Heuristic => "heuristic",
            CooldownSource::Authoritative => "authoritative",
            CooldownSource::Credit => "credit",
            CooldownSource::Tier => "tier",
            CooldownSource::Upstream => "upstream",
        }
    }
}

/// How `lease_any` picks among the candidates that pass (SPEC 17.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// The first that passes, in the given order (failover).
    Order,
    /// The one that keeps the most room after this request.
    #[default]
    Headroom,
    /// The one this engine leased least recently (never leased first).
    Spread,
}

impl FromStr for Strategy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "order" => Strategy::Order,
            "headroom" => Strategy::Headroom,
            "spread" => Strategy::Spread,
            _ => {
                return Err(Error::invalid(format!(
                    "unknown strategy {s:?}; expected order, headroom or spread"
                )))
            }
        })
    }
}

impl FromStr for CooldownSource {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "heuristic" => CooldownSource::Heuristic,
            "authoritative" => CooldownSource::Authoritative,
            "credit" => CooldownSource::Credit,
            "tier" => CooldownSource::Tier,
            "upstream" => CooldownSource::Upstream,
            _ => {
                return Err(Error::invalid(format!(
                "unknown cooldown source {s:?}; expected heuristic, authoritative, credit, tier or upstream"
            )))
            }
        })
    }
}

/// An active bench of one route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cooldown {
    /// The benched route; of a model-wide bench (`model_wide`), `key_id` is 0 and
    /// stands for no key.
    pub route: Route,
    pub expires_at_ms: i64,
    pub source: CooldownSource,
    pub set_at_ms: i64,
    /// A bench of the model for every key of the platform (SPEC 21.1): `key_id` None.
    pub model_wide: bool,
}

/// A registered API key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    pub key_id: i64,
    pub platform: String,
    pub base_url: Option<String>,
    pub label: Option<String>,
    pub enabled: bool,
    /// The provider-side unit that meters the key (SPEC §14.3); `None`: its own.
    pub account: Option<String>,
    /// The configured key concurrency cap (`set_key_concurrency_cap`, SPEC 20);
    /// `None`: none configured (the env cap and a learned cap still apply).
    pub concurrency_cap: Option<i64>,
}

/// A model's stored limits and budget label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub platform: String,
    pub model_id: String,
    /// Its declaration (SPEC §4, §14.1): the classic four and every other limit.
    pub limits: LimitSet,
    pub monthly_token_budget: Option<String>,
}
