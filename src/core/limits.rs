//! A limit as data (SPEC §14.1): a metric counted in a window at a scope.
//!
//! A window is a [`WindowSpec`]: a sliding width, or a calendar period of the
//! platform's calendar. A model's declaration is a [`LimitSet`], kept in gate order
//! with each limit's reason decided once, when it is declared. A new window kind is
//! one more [`WindowSpec`] variant here and its counter in `windows.rs`.
use crate::core::clock::{DAY_MS, MINUTE_MS};
use crate::core::error::{Error, Reason, Result};
use std::fmt;
use std::sync::Arc;

/// How many classic limits SPEC §4 names (requests and tokens per minute and per day,
/// at account scope: the first rows of [`NAMED`]).
pub const CLASSIC: usize = 4;

/// The classic windows as SPEC §4 and §9 key them, in [`NAMED`]'s order.
pub const CLASSIC_NAMES: [&str; CLASSIC] = ["rpm", "rpd", "tpm", "tpd"];

/// One value per classic limit, in their gate order (the classic rows of [`NAMED`]);
/// `None` is no limit. The form the models' stored columns and `Limits` take.
pub type ClassicValues = [Option<i64>; CLASSIC];

/// The slot of the classic limit of `metric` per `window` in [`ClassicValues`].
pub fn classic_slot(metric: Metric, window: WindowSpec) -> Option<usize> {
    NAMED[..CLASSIC].iter().position(|n| (n.1, n.2) == (metric, window))
}

/// How many provider caps SPEC §8 names.
pub const CAPS: usize = 3;

/// One value per provider cap, in their gate order (requests per day, requests per
/// minute, tokens per day: the provider rows of [`NAMED`]); `None` is no cap. The form
/// caps are merged in (`Mirror::prepare`); [`LimitSet::provider`] makes them limits.
pub type CapValues = [Option<i64>; CAPS];

/// One value per provider cap (as [`CapValues`]) from `(metric, window)` pairs; a pair
/// that is no provider cap is ignored, a cap not given is `T::default()`.
pub fn cap_values<T: Copy + Default>(
    pairs: impl IntoIterator<Item = ((Metric, WindowSpec), T)>,
) -> [T; CAPS] {
    let mut caps = [T::default(); CAPS];
    for (slot, v) in pairs {
        if let Some(c) = cap_slot(slot).and_then(|i| caps.get_mut(i)) {
            *c = v;
        }
    }
    caps
}

/// The [`CapValues`] slot of a provider cap of `metric` per `window`, if there is one.
pub fn cap_slot((metric, window): (Metric, WindowSpec)) -> Option<usize> {
    NAMED[4..].iter().position(|n| (n.1, n.2) == (metric, window))
}

/// What a limit counts. Declared in gate order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    Requests,
    Tokens,
    /// Input tokens, cached input excluded (SPEC §14.4).
    InputTokens,
    OutputTokens,
    /// Micro-dollars (µ$) spent at the model's prices (SPEC 23.1).
    Cost,
}

impl Metric {
    /// In gate order.
    pub const ALL: [Metric; 5] =
        [Metric::Requests, Metric::Tokens, Metric::InputTokens, Metric::OutputTokens, Metric::Cost];

    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Requests => "requests",
            Metric::Tokens => "tokens",
            Metric::InputTokens => "input_tokens",
            Metric::OutputTokens => "output_tokens",
            Metric::Cost => "cost",
        }
    }

    pub fn parse(s: &str) -> Result<Metric> {
        Ok(match s {
            "requests" => Metric::Requests,
            "tokens" => Metric::Tokens,
            "input_tokens" => Metric::InputTokens,
            "output_tokens" => Metric::OutputTokens,
            "cost" => Metric::Cost,
            _ => {
                return Err(Error::invalid(format!(
                    "unknown metric {s:?}; expected \"requests\", \"tokens\", \"input_tokens\", \"output_tokens\" or \"cost\""
                )))
            }
        })
    }

    /// Whether an admission's estimate counts in this metric's windows (its tokens, or
    /// for cost its reservation: a request metric counts the request itself instead).
    pub fn is_tokens(self) -> bool {
        self != Metric::Requests
    }
}

/// A calendar period of the platform's calendar (SPEC §14.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Period {
    Day,
    /// Monday 00:00 to Monday 00:00.
    Week,
    /// The 1st 00:00 to the next 1st.
    Month,
}

impl Period {
    /// How many period kinds there are: the length of a per-period array.
    pub const COUNT: usize = 3;
    pub const ALL: [Period; Period::COUNT] = [Period::Day, Period::Week, Period::Month];

    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A window. Ordered as gates run: sliding ones by width, then day, week, month.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WindowSpec {
    /// Events with `t > now - width`.
    Sliding(i64),
    /// Events with `t >=` the start of the current period.
    Calendar(Period),
}

/// The RPM/TPM window.
pub const MINUTE: WindowSpec = WindowSpec::Sliding(MINUTE_MS);
/// The RPD/TPD window.
pub const DAY: WindowSpec = WindowSpec::Calendar(Period::Day);

/// Widths a sliding window may have.
pub const MIN_WIDTH_MS: i64 = 1_000;
pub const MAX_WIDTH_MS: i64 = 31 * DAY_MS;

const PER_FORMS: &str = "\"minute\", \"day\", \"week\", \"month\", or a sliding width \"<N>s\", \"<N>m\", \
                         \"<N>h\" or \"<N>d\" (N a positive integer, 1s to 31d)";

impl WindowSpec {
    /// Parses a `per` (SPEC §14.1's table).
    pub fn parse(per: &str) -> Result<WindowSpec> {
        match per {
            "minute" => return Ok(MINUTE),
            "day" => return Ok(DAY),
            "week" => return Ok(WindowSpec::Calendar(Period::Week)),
            "month" => return Ok(WindowSpec::Calendar(Period::Month)),
            _ => {}
        }
        let unknown = || Error::invalid(format!("unknown window per={per:?}; expected {PER_FORMS}"));
        // SPEC 18.1: every accepted form is ASCII (and the split below needs it).
        if !per.is_ascii() {
            return Err(unknown());
        }
        let (digits, unit) = per.split_at(per.len().saturating_sub(1));
        let unit_ms = match unit {
            "s" => 1_000,
            "m" => MINUTE_MS,
            "h" => 3_600_000,
            "d" => DAY_MS,
            _ => return Err(unknown()),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(unknown());
        }
        // SPEC 18.1: a width beyond 2^63 - 1 ms cannot be represented at all.
        let width =
            digits.parse::<i64>().ok().and_then(|n| n.checked_mul(unit_ms)).ok_or_else(|| {
                Error::Overflow(format!("window per={per:?} is beyond 2^63 - 1 milliseconds"))
            })?;
        if !(MIN_WIDTH_MS..=MAX_WIDTH_MS).contains(&width) {
            return Err(Error::invalid(format!(
                "window per={per:?} is outside the sliding widths accepted: 1s to 31d"
            )));
        }
        Ok(WindowSpec::Sliding(width))
    }

    pub fn width(self) -> Option<i64> {
        match self {
            WindowSpec::Sliding(w) => Some(w),
            WindowSpec::Calendar(_) => None,
        }
    }
}

/// Whose usage a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// The key's own usage and leases.
    Key,
    /// Every key of the key's account (SPEC §14.3); a key is its own account by default.
    Account,
    /// Every model of every key of the key's account: SPEC §8's provider caps (never
    /// declared on a model).
    Provider,
    /// Every model of the key alone: a platform limit at scope `"key"` (SPEC 23.3).
    PlatformKey,
    /// Every model of every key of the key's account: a platform limit at scope
    /// `"account"` (SPEC 23.3).
    PlatformAccount,
    /// Every route a tenant is served on: a tenant's limit (SPEC 23.2), declared at
    /// scope `"account"`.
    Tenant,
}

impl Scope {
    /// As a user writes it: a platform limit's scope is spelled as a model's.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Key | Scope::PlatformKey => "key",
            Scope::Account | Scope::PlatformAccount | Scope::Tenant => "account",
            Scope::Provider => "provider",
        }
    }

    /// Whether it counts the key alone (a model's or a platform's limit at scope `"key"`).
    pub fn is_key(self) -> bool {
        matches!(self, Scope::Key | Scope::PlatformKey)
    }

    /// Whether it is a model's own scope (a limit declared on a model, SPEC §14.1).
    pub fn is_model(self) -> bool {
        matches!(self, Scope::Key | Scope::Account)
    }

    /// Whether it counts every model of a platform (SPEC 23.3's platform limits).
    pub fn is_platform(self) -> bool {
        matches!(self, Scope::PlatformKey | Scope::PlatformAccount)
    }

    /// The same scope over every model of the platform (SPEC 23.3); a scope that is
    /// none of a model's stays as it is.
    pub fn platform_wide(self) -> Scope {
        match self {
            Scope::Key => Scope::PlatformKey,
            Scope::Account => Scope::PlatformAccount,
            s => s,
        }
    }

    /// The scope a user declared (a platform limit's as a model's).
    pub fn declared(self) -> Scope {
        match self {
            Scope::PlatformKey => Scope::Key,
            Scope::PlatformAccount | Scope::Tenant => Scope::Account,
            s => s,
        }
    }

    pub fn parse(s: &str) -> Result<Scope> {
        match s {
            "account" => Ok(Scope::Account),
            "key" => Ok(Scope::Key),
            _ => Err(Error::invalid(format!("unknown scope {s:?}; expected \"account\" or \"key\""))),
        }
    }
}

/// One declared limit: at most `limit` of `metric` per `window`, at `scope`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Limit {
    pub metric: Metric,
    pub limit: i64,
    pub window: WindowSpec,
    /// The window as written (`"5h"`, `"minute"`): it names the limit's reason.
    pub per: Arc<str>,
    pub scope: Scope,
}

impl Limit {
    /// Validates a limit as a user writes it.
    pub fn parse(metric: &str, limit: i64, per: &str, scope: &str) -> Result<Limit> {
        let metric = Metric::parse(metric)?;
        let window = WindowSpec::parse(per)?;
        let scope = Scope::parse(scope)?;
        if limit < 0 {
            return Err(Error::invalid(format!("limit must be >= 0, got {limit}")));
        }
        Ok(Limit { metric, limit, window, per: Arc::from(per), scope })
    }

    /// One of the classic four, as `rpm=` and the like declare it.
    pub fn classic(metric: Metric, window: WindowSpec, limit: i64) -> Limit {
        let per = if window == MINUTE { "minute" } else { "day" };
        Limit { metric, limit, window, per: Arc::from(per), scope: Scope::Account }
    }

    /// Which classic limit this is, by name: requests or tokens per minute or per day
    /// at account scope (`model_limits()` shows it, learning tightens it).
    pub fn classic_axis(&self) -> Option<&'static str> {
        named(self.metric, self.window, self.scope).filter(|_| self.scope == Scope::Account)
    }

    /// The metric and window it counts.
    pub fn slot(&self) -> (Metric, WindowSpec) {
        (self.metric, self.window)
    }

    /// What makes two limits the same window (a duplicate).
    fn key(&self) -> (Metric, WindowSpec, Scope) {
        (self.metric, self.window, self.scope)
    }
}

/// The limits SPEC §4 and §8 name, each by the reason a refusal by it gives: the
/// classic four at account scope (`rpm=` and the like) and the provider caps, in gate
/// order. Any other limit is named by its metric and window (SPEC §14.1).
const NAMED: [(&str, Metric, WindowSpec, Scope); 7] = [
    ("rpm", Metric::Requests, MINUTE, Scope::Account),
    ("rpd", Metric::Requests, DAY, Scope::Account),
    ("tpm", Metric::Tokens, MINUTE, Scope::Account),
    ("tpd", Metric::Tokens, DAY, Scope::Account),
    ("provider_daily_requests", Metric::Requests, DAY, Scope::Provider),
    ("provider_minute_requests", Metric::Requests, MINUTE, Scope::Provider),
    ("provider_daily_tokens", Metric::Tokens, DAY, Scope::Provider),
];

/// The name SPEC §4 or §8 gives the limit of `metric` per `window` at `scope`; a
/// key-scope limit goes by its account-scope name.
fn named(metric: Metric, window: WindowSpec, scope: Scope) -> Option<&'static str> {
    let scope = if scope == Scope::Key { Scope::Account } else { scope };
    NAMED.iter().find(|n| (n.1, n.2, n.3) == (metric, window, scope)).map(|n| n.0)
}

/// The classic window a name stands for (`"rpm"`: requests per minute), if it is one
/// of the classic four.
pub fn classic_window(name: &str) -> Option<(Metric, WindowSpec)> {
    NAMED[..4].iter().find(|n| n.0 == name).map(|n| (n.1, n.2))
}

/// A route's own use of the classic window `name` (SPEC §4, §9): its sliding minute's or
/// its calendar day's count of the window's metric; 0 for a name that is not one.
pub fn classic_use(
    name: &str, minute: &crate::core::windows::Counts, day: &crate::core::windows::Counts,
) -> i64 {
    match classic_window(name) {
        Some((metric, MINUTE)) => minute.get(metric),
        Some((metric, _)) => day.get(metric),
        None => 0,
    }
}

/// The name of the classic window of `metric` per `window` (as `usage()` keys it).
pub fn classic_name(metric: Metric, window: WindowSpec) -> Option<&'static str> {
    NAMED[..4].iter().find(|n| (n.1, n.2) == (metric, window)).map(|n| n.0)
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} per {} ({} scope)", self.limit, self.metric.as_str(), self.per, self.scope.as_str())
    }
}

/// Whose limits a set holds: a model's, a platform's (SPEC 23.3) or a tenant's (23.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Model,
    Platform,
    Tenant,
}

/// One limit of a set, with the reason a refusal by it gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    pub limit: Limit,
    pub reason: Reason,
}

/// The limits a decision applies, in gate order (metric, then window, then scope).
/// Cheap to clone: a model's set is built once, when it is declared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitSet {
    gates: Arc<[Declared]>,
}

impl LimitSet {
    /// A set from limits in any order; two for one (metric, window, scope) are an error.
    pub fn new(list: Vec<Limit>) -> Result<LimitSet> {
        LimitSet::build(list, Kind::Model)
    }

    /// SPEC 23.3: a platform's limits, declared at scope `"account"` or `"key"` and
    /// counted over every model of the platform; each reason is
    /// `"platform:<metric>/<per>"` (`:key` appended as SPEC 14.1 appends it). Two for
    /// one (metric, window, scope) are an error. A new metric (cost) is one more
    /// [`Metric`]: its platform limit needs nothing here.
    pub fn platform(list: Vec<Limit>) -> Result<LimitSet> {
        let list = list.into_iter().map(|l| Limit { scope: l.scope.platform_wide(), ..l }).collect();
        LimitSet::build(list, Kind::Platform)
    }

    /// SPEC 23.2: a tenant's limits, declared at scope `"account"` (any other is an
    /// error) and counted over every route the tenant is served on; each reason is
    /// `"tenant:<metric>/<per>"`. Two for one (metric, window) are an error.
    pub fn tenant(list: Vec<Limit>) -> Result<LimitSet> {
        if let Some(l) = list.iter().find(|l| l.scope != Scope::Account) {
            return Err(Error::invalid(format!(
                "{l}: a tenant's limits are declared at scope \"account\" (the tenant's own), not {:?}",
                l.scope.as_str()
            )));
        }
        let list = list.into_iter().map(|l| Limit { scope: Scope::Tenant, ..l }).collect();
        LimitSet::build(list, Kind::Tenant)
    }

    /// A platform's limits as a store keeps them; a stored set that is no longer valid
    /// (a duplicate written by hand) declares nothing.
    pub fn platform_stored(list: Vec<Limit>) -> LimitSet {
        LimitSet::platform(list).unwrap_or_default()
    }

    /// The limits as their user declared them (a platform limit's scope as a
    /// model's), in gate order: what `platform_limits()` returns and the store keeps.
    pub fn declared(&self) -> Vec<Limit> {
        self.gates.iter().map(|d| Limit { scope: d.limit.scope.declared(), ..d.limit.clone() }).collect()
    }

    fn build(mut list: Vec<Limit>, kind: Kind) -> Result<LimitSet> {
        let platform = kind == Kind::Platform;
        let tenant = kind == Kind::Tenant;
        if let Some(l) = list.iter().find(|l| {
            l.scope.is_platform() != platform
                || (l.scope == Scope::Tenant) != tenant
                || l.scope == Scope::Provider
        }) {
            return Err(Error::invalid(format!("{l} cannot be declared here")));
        }
        list.sort_by_key(Limit::key);
        if let Some(w) = list.windows(2).find(|w| w[0].key() == w[1].key()) {
            return Err(Error::invalid(format!(
                "two limits for {} per {} at {} scope ({:?} and {:?}): declare each window once",
                w[0].metric.as_str(),
                w[0].per,
                w[0].scope.as_str(),
                w[0].per,
                w[1].per
            )));
        }
        let gates = list
            .iter()
            .map(|l| {
                let also_account = l.scope.is_key()
                    && list.iter().any(|o| !o.scope.is_key() && (o.metric, o.window) == (l.metric, l.window));
                let classic = if kind == Kind::Model { classic_name(l.metric, l.window) } else { None };
                let base = match classic {
                    Some(r) => r.to_string(),
                    None if platform => format!("platform:{}/{}", l.metric.as_str(), l.per),
                    None if tenant => format!("tenant:{}/{}", l.metric.as_str(), l.per),
                    None => format!("{}/{}", l.metric.as_str(), l.per),
                };
                let reason = match classic {
                    Some(r) if !also_account => Reason::declared(r),
                    _ if also_account => Reason::declared(&format!("{base}:key")),
                    _ => Reason::declared(&base),
                };
                Declared { limit: l.clone(), reason }
            })
            .collect();
        Ok(LimitSet { gates })
    }

    /// SPEC §8's provider caps as limits at provider scope, in their gate order (daily
    /// requests, minute requests, daily tokens), each with its reason. A new provider
    /// cap is one more row here.
    pub fn provider(caps: CapValues) -> LimitSet {
        let gates = NAMED[4..]
            .iter()
            .zip(caps)
            .filter_map(|(&(name, metric, window, scope), cap)| {
                let per = if window == MINUTE { "minute" } else { "day" };
                let limit = Limit { metric, limit: cap?, window, per: Arc::from(per), scope };
                Some(Declared { limit, reason: Reason::declared(name) })
            })
            .collect();
        LimitSet { gates }
    }

    /// Its provider caps, one per [`CapValues`] slot.
    pub fn cap_values(&self) -> CapValues {
        cap_values(
            self.gates
                .iter()
                .filter(|d| d.limit.scope == Scope::Provider)
                .map(|d| (d.limit.slot(), Some(d.limit.limit))),
        )
    }

    /// Its provider cap of `metric` per `window`, if it has one.
    pub fn cap(&self, metric: Metric, window: WindowSpec) -> Option<i64> {
        let d = self
            .gates
            .iter()
            .find(|d| d.limit.scope == Scope::Provider && d.limit.slot() == (metric, window));
        d.map(|d| d.limit.limit)
    }

    /// The classic four as limits.
    pub fn from_classic(l: ClassicValues) -> LimitSet {
        LimitSet::with_classic(l, Vec::new()).unwrap_or_default()
    }

    /// A declaration in its text form (`"requests/minute=2 tokens/month:key=9"`, as
    /// [`encode_limits`] writes it).
    pub fn parse(text: &str) -> Result<LimitSet> {
        LimitSet::new(decode_limits(text)?)
    }

    /// A declaration as a store keeps it (the classic four and the others beside); a
    /// stored other for a classic window yields to the classic one.
    pub fn stored(classic: ClassicValues, others: Vec<Limit>) -> LimitSet {
        LimitSet::with_classic(classic, others).unwrap_or_else(|_| LimitSet::from_classic(classic))
    }

    /// The classic keywords and a list of limits; a keyword and a limit for the same
    /// window are an error.
    pub fn with_classic(classic: ClassicValues, extra: Vec<Limit>) -> Result<LimitSet> {
        let mut list = Vec::with_capacity(extra.len() + CLASSIC);
        for (&(name, metric, window, _), v) in NAMED[..CLASSIC].iter().zip(classic) {
            let Some(v) = v else { continue };
            if v < 0 {
                return Err(Error::invalid(format!("{name} must be >= 0, got {v}")));
            }
            let l = Limit::classic(metric, window, v);
            if let Some(dup) = extra.iter().find(|e| e.key() == l.key()) {
                return Err(Error::invalid(format!(
                    "{name}= and Limit({:?}, {}, {:?}) are the same window: give one of them",
                    dup.metric.as_str(),
                    dup.limit,
                    &*dup.per
                )));
            }
            list.push(l);
        }
        list.extend(extra);
        LimitSet::new(list)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Declared> {
        self.gates.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.gates.is_empty()
    }

    /// The very same set (one declaration, shared), not merely an equal one.
    pub fn same(&self, other: &LimitSet) -> bool {
        Arc::ptr_eq(&self.gates, &other.gates)
    }

    /// The classic four (`model_limits()`, learning, the guardrail's figures).
    pub fn classic(&self) -> ClassicValues {
        let mut l = [None; CLASSIC];
        for d in self.gates.iter().filter(|d| d.limit.scope == Scope::Account) {
            if let Some(i) = classic_slot(d.limit.metric, d.limit.window) {
                l[i] = Some(d.limit.limit);
            }
        }
        l
    }

    /// The classic limit of `metric` per `window`, if the set declares it.
    pub fn classic_limit(&self, metric: Metric, window: WindowSpec) -> Option<i64> {
        let d =
            self.gates.iter().find(|d| d.limit.scope == Scope::Account && d.limit.slot() == (metric, window));
        d.map(|d| d.limit.limit)
    }

    /// Every limit that is not one of the classic four (stored beside them).
    pub fn others(&self) -> Vec<Limit> {
        self.gates.iter().filter(|d| d.limit.classic_axis().is_none()).map(|d| d.limit.clone()).collect()
    }

    /// The same set with the classic four replaced (learning tightened one).
    pub fn replace_classic(&self, classic: ClassicValues) -> LimitSet {
        LimitSet::stored(classic, self.others())
    }

    /// The windows the set reads.
    pub fn windows(&self) -> impl Iterator<Item = WindowSpec> + '_ {
        self.gates.iter().map(|d| d.limit.window)
    }
}

/// The stored form of a list of limits (the `limits` column of `models`, the Redis
/// `models` hash): space-separated `metric/per=limit`, `:key` after `per` for scope
/// `key`, e.g. `requests/1s=1 tokens/month=1000000 requests/minute:key=5`.
pub fn encode_limits(list: &[Limit]) -> String {
    let one = |l: &Limit| {
        let scope = if l.scope.is_key() { ":key" } else { "" };
        format!("{}/{}{scope}={}", l.metric.as_str(), l.per, l.limit)
    };
    list.iter().map(one).collect::<Vec<_>>().join(" ")
}

/// Reads [`encode_limits`]' form back.
pub fn decode_limits(text: &str) -> Result<Vec<Limit>> {
    text.split_whitespace()
        .map(|item| {
            let bad = || Error::invalid(format!("malformed stored limit {item:?}"));
            let (window, limit) = item.rsplit_once('=').ok_or_else(bad)?;
            let (metric, per) = window.split_once('/').ok_or_else(bad)?;
            let (per, scope) = match per.strip_suffix(":key") {
                Some(p) => (p, "key"),
                None => (per, "account"),
            };
            Limit::parse(metric, limit.parse().map_err(|_| bad())?, per, scope)
        })
        .collect()
}

/// One cap setting as persisted by `set_provider_caps`: not set (env/defaults apply),
/// explicitly no cap, or a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CapSetting {
    #[default]
    Inherit,
    NoCap,
    Cap(i64),
}

/// What `set_provider_caps` persisted for a platform: one setting per provider cap,
/// in the order of [`CapValues`].
pub type CapOverrides = [CapSetting; CAPS];

/// The stored form of what `set_provider_caps` persisted for a platform (the `caps`
/// column of `provider_caps`, the Redis caps hash): the caps set, in their gate order,
/// as `metric/per=limit` like [`encode_limits`], `none` for no cap; a cap not listed is
/// not set (the environment and the defaults apply). E.g. `requests/day=1000
/// tokens/day=none`.
pub fn encode_caps(caps: &CapOverrides) -> String {
    let one = |(&(_, metric, window, _), s): (&(&str, Metric, WindowSpec, Scope), &CapSetting)| {
        let per = if window == MINUTE { "minute" } else { "day" };
        let value = match s {
            CapSetting::Inherit => return None,
            CapSetting::NoCap => "none".to_string(),
            CapSetting::Cap(v) => v.to_string(),
        };
        Some(format!("{}/{per}={value}", metric.as_str()))
    };
    NAMED[4..].iter().zip(caps).filter_map(one).collect::<Vec<_>>().join(" ")
}

/// Reads [`encode_caps`]' form back.
pub fn decode_caps(text: &str) -> Result<CapOverrides> {
    let pairs = text
        .split_whitespace()
        .map(|item| {
            let bad = || Error::invalid(format!("malformed stored provider cap {item:?}"));
            let (window, value) = item.rsplit_once('=').ok_or_else(bad)?;
            let (metric, per) = window.split_once('/').ok_or_else(bad)?;
            let slot = (Metric::parse(metric)?, WindowSpec::parse(per)?);
            let setting = match value {
                "none" => CapSetting::NoCap,
                v => CapSetting::Cap(v.parse().ok().filter(|v: &i64| *v >= 0).ok_or_else(bad)?),
            };
            Ok((slot, setting))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(cap_values(pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim(metric: &str, n: i64, per: &str, scope: &str) -> Limit {
        Limit::parse(metric, n, per, scope).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn per_forms() {
        assert_eq!(WindowSpec::parse("1s").ok(), Some(WindowSpec::Sliding(1_000)));
        assert_eq!(WindowSpec::parse("60s").ok(), Some(MINUTE));
        assert_eq!(WindowSpec::parse("1m").ok(), Some(MINUTE));
        assert_eq!(WindowSpec::parse("5h").ok(), Some(WindowSpec::Sliding(5 * 3_600_000)));
        assert_eq!(WindowSpec::parse("31d").ok(), Some(WindowSpec::Sliding(MAX_WIDTH_MS)));
        assert_eq!(WindowSpec::parse("24h").ok(), Some(WindowSpec::Sliding(DAY_MS)));
        assert_eq!(WindowSpec::parse("week").ok(), Some(WindowSpec::Calendar(Period::Week)));
        for bad in [
            "",
            "s",
            "0s",
            "32d",
            "-1s",
            "+1s",
            "1.5h",
            "1 s",
            "1S",
            "hour",
            "999s9",
            "99999999999999999999d",
        ] {
            assert!(WindowSpec::parse(bad).is_err(), "{bad:?}");
        }
        assert!(WindowSpec::parse("0s").err().is_some_and(|e| e.to_string().contains("1s to 31d")));
        assert!(WindowSpec::parse("hour").err().is_some_and(|e| e.to_string().contains("\"minute\"")));
        // SPEC 18.1: a non-ASCII form is invalid (never a panic), a width beyond
        // 2^63 - 1 ms an overflow, one within it but past 31 d invalid.
        for bad in ["5é", "é", "éééé", "1ś", "\u{1F600}s"] {
            assert!(matches!(WindowSpec::parse(bad), Err(Error::Invalid(_))), "{bad:?}");
        }
        for huge in ["99999999999999999999s", "9223372036854775807s", "106751991168d"] {
            assert!(matches!(WindowSpec::parse(huge), Err(Error::Overflow(_))), "{huge:?}");
        }
        assert!(matches!(WindowSpec::parse("9223372036854775s"), Err(Error::Invalid(_))));
    }

    #[test]
    fn gate_order_and_reasons() {
        let set = LimitSet::new(vec![
            lim("tokens", 9, "month", "account"),
            lim("requests", 5, "minute", "key"),
            lim("requests", 7, "60s", "account"),
            lim("requests", 1, "1s", "account"),
            lim("output_tokens", 3, "minute", "account"),
            lim("requests", 100, "week", "account"),
            lim("tokens", 50, "day", "key"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let reasons: Vec<&str> = set.iter().map(|d| d.reason.as_str()).collect();
        assert_eq!(
            reasons,
            ["requests/1s", "rpm:key", "rpm", "requests/week", "tpd", "tokens/month", "output_tokens/minute"]
        );
        assert_eq!(set.classic(), [Some(7), None, None, None]);
        assert_eq!(set.others().len(), 6);
    }

    #[test]
    fn platform_limits_are_named_for_the_platform_and_kept_as_declared() {
        let declared = vec![
            lim("tokens", 9, "month", "account"),
            lim("requests", 5, "minute", "key"),
            lim("requests", 20, "minute", "account"),
            lim("requests", 1000, "day", "key"),
        ];
        let set = LimitSet::platform(declared).unwrap_or_else(|e| panic!("{e}"));
        let reasons: Vec<&str> = set.iter().map(|d| d.reason.as_str()).collect();
        // no classic names: a key-scope one beside an account-scope twin gets ":key"
        assert_eq!(
            reasons,
            [
                "platform:requests/minute:key",
                "platform:requests/minute",
                "platform:requests/day",
                "platform:tokens/month"
            ]
        );
        assert!(set.iter().all(|d| d.limit.scope.is_platform()));
        assert_eq!(set.classic(), [None; CLASSIC]);
        // read back as declared, in gate order, and through the stored form
        let back = set.declared();
        assert_eq!(back[0], lim("requests", 5, "minute", "key"));
        assert!(back.iter().all(|l| l.scope.is_model()));
        assert_eq!(decode_limits(&encode_limits(&back)).ok(), Some(back.clone()));
        assert_eq!(LimitSet::platform_stored(back), set);
        // a duplicate is refused; a platform limit is not a model's, nor the reverse
        assert!(LimitSet::platform(vec![lim("requests", 1, "1m", "key"), lim("requests", 2, "60s", "key")])
            .err()
            .is_some_and(|e| e.to_string().contains("declare each window once")));
        assert!(LimitSet::new(set.iter().map(|d| d.limit.clone()).collect()).is_err());
        assert!(LimitSet::platform_stored(vec![
            lim("tokens", 1, "day", "key"),
            lim("tokens", 2, "day", "key")
        ])
        .is_empty());
    }

    #[test]
    fn stored_caps_round_trip() {
        let caps = [CapSetting::Cap(1000), CapSetting::Inherit, CapSetting::NoCap];
        let text = encode_caps(&caps);
        assert_eq!(text, "requests/day=1000 tokens/day=none");
        assert_eq!(decode_caps(&text).ok(), Some(caps));
        assert_eq!(decode_caps("").ok(), Some([CapSetting::Inherit; CAPS]));
        assert!(decode_caps("requests/day=-2").is_err());
        assert!(decode_caps("requests/day").is_err());
    }

    #[test]
    fn duplicates_are_refused() {
        let e =
            LimitSet::new(vec![lim("requests", 1, "minute", "account"), lim("requests", 2, "1m", "account")]);
        assert!(e.is_err());
        let e = LimitSet::with_classic([None, None, Some(5), None], vec![lim("tokens", 6, "60s", "account")]);
        assert!(e.err().is_some_and(|e| e.to_string().contains("tpm=")));
        // a sliding day is not the calendar day
        assert!(LimitSet::new(vec![lim("tokens", 1, "day", "account"), lim("tokens", 1, "24h", "account")])
            .is_ok());
    }

    #[test]
    fn stored_form_round_trips() {
        let list = vec![lim("requests", 1, "1s", "account"), lim("tokens", 5, "month", "key")];
        assert_eq!(encode_limits(&list), "requests/1s=1 tokens/month:key=5");
        assert_eq!(decode_limits(&encode_limits(&list)).ok(), Some(list));
        assert_eq!(decode_limits("").ok(), Some(vec![]));
        assert!(decode_limits("requests/1s").is_err());
    }

    #[test]
    fn bad_metric_scope_and_limit() {
        assert!(Limit::parse("calls", 1, "minute", "account").is_err());
        assert!(Limit::parse("requests", 1, "minute", "org").is_err());
        assert!(Limit::parse("requests", -1, "minute", "account").is_err());
    }
}
