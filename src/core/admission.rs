//! Admission (SPEC §4, §8, §14.1, 17.1): whether one more request may go, as a pure
//! function of one complete [`View`].
//!
//! A decision reads a [`View`] built once per candidate (`Mirror::view`): the windows
//! and live leases of each scope, the billed tokens of the provider account, the
//! cooldown and the limits in force. The gates are one enum, [`Gate`]; each one's
//! [`Gate::check`] reads only the view and gives a [`Verdict`]: its refusal, and the room
//! it leaves for this request. [`admit`] runs every gate in SPEC 14.1's order, the first
//! refusal deciding; [`choose`] picks among the candidates that passed (`lease_any`).
//!
//! The verbs: *check* is one gate ([`Gate::check`], `Engine::check_gate` for the
//! `can_*` questions); *admit* is every gate in order ([`admit`], `Engine::admit`);
//! *choose* picks a candidate. `Engine::check` keeps SPEC §4's name for `check()`: it
//! admits without taking a lease.
//!
//! Every limit is a [`Limit`](crate::core::limits::Limit): the model's declared ones at
//! key or account scope, and the provider caps of SPEC §8 at provider scope (every model
//! of the key's account). A new kind of limit is a declaration, not a new gate.
use crate::core::limits::{cap_slot, CapValues, Declared, LimitSet, Metric, Scope, WindowSpec, DAY, MINUTE};
use crate::core::types::{Admission, Reason, Strategy};
use crate::core::windows::Windows;

/// An admission's estimate: `tokens` in all, `output` of them output, and `cost` the
/// µ$ its lease reserves (SPEC 23.1: the worst case of the estimate at the route's
/// prices, 0 unpriced).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Estimate {
    pub tokens: i64,
    pub output: i64,
    pub cost: i64,
}

impl Estimate {
    pub fn tokens(tokens: i64) -> Estimate {
        Estimate { tokens, ..Estimate::default() }
    }

    /// How much of `requests` requests of this estimate counts in a metric's windows
    /// (SPEC §14.4, 23.1): the requests in a request window, the estimate in
    /// total-token windows, the estimate less its output in input windows, the output
    /// in output windows, the reservation in cost windows.
    pub fn count_in(&self, metric: Metric, requests: i64) -> i64 {
        match metric {
            Metric::Requests => requests,
            Metric::Tokens => self.tokens,
            Metric::InputTokens => self.tokens.saturating_sub(self.output).max(0),
            Metric::OutputTokens => self.output,
            Metric::Cost => self.cost,
        }
    }
}

/// Live in-flight totals: how many leases, and the sum of their estimates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlight {
    pub count: i64,
    pub est: Estimate,
}

impl InFlight {
    /// What the live leases hold in a metric's windows.
    pub fn get(&self, metric: Metric) -> i64 {
        self.est.count_in(metric, self.count)
    }

    /// One more live lease of estimate `est`.
    pub fn add(&mut self, est: Estimate) {
        self.count += 1;
        self.est.tokens = self.est.tokens.saturating_add(est.tokens);
        self.est.output = self.est.output.saturating_add(est.output);
        self.est.cost = self.est.cost.saturating_add(est.cost);
    }
}

/// The limits in force for one decision, besides the windows: the model's (or the
/// call's `limits=`), the provider caps as limits at provider scope, and the key's
/// concurrency cap.
#[derive(Debug, Clone, Default)]
pub struct GateContext {
    /// In SPEC 14.1's gate order.
    pub limits: LimitSet,
    /// SPEC §8's caps in force, in gate order (daily requests, minute requests, daily
    /// tokens): `LimitSet::provider`.
    pub provider: LimitSet,
    /// SPEC 24.6: until when a pool 429 spent the route's pool of the account, per
    /// provider cap (the slots of `provider`): its cap's gate refuses until then,
    /// whatever was counted; `None` while no pool is spent (boxed: it is rare, and
    /// what every decision carries stays small).
    pub pool_spent: Option<Box<CapValues>>,
    /// SPEC 23.3: the platform's limits, at platform scope (every model of the key, or
    /// of its account), in gate order.
    pub platform: LimitSet,
    pub concurrency_cap: Option<i64>,
    /// SPEC 22.1: the fraction of every limit the call's priority leaves free (0: none).
    pub reserve: f64,
}

/// What one scope has recorded (its windows) and has in flight (its live leases).
#[derive(Debug, Clone, Copy)]
pub struct Tally<'a> {
    pub win: &'a Windows,
    pub in_flight: InFlight,
}

/// SPEC §8's billed tokens of the provider account in one window: each model's raw
/// tokens at its multiplier, rounded up per model; the in-flight ones are in the
/// provider tally, billed per lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Billed {
    pub window: WindowSpec,
    pub used: i64,
    /// This request's estimate at its model's multiplier.
    pub estimate: i64,
}

/// Everything one decision on one route (or, for a provider gate asked alone, one
/// account) reads, gathered once; no gate reads anything else.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    pub now: i64,
    pub est: Estimate,
    pub ctx: &'a GateContext,
    /// When the route's active cooldown ends.
    pub cooldown_until: Option<i64>,
    /// The route's own windows and leases (`None`: no model, a provider gate alone).
    pub key: Option<Tally<'a>>,
    /// The key's account on the model (SPEC §14.3): the route's own when the key is
    /// its own account.
    pub account: Option<Tally<'a>>,
    /// Every model of the key's account (SPEC §8): requests recorded and leases in
    /// flight, their tokens billed per lease (0 without a provider token limit).
    pub provider: Tally<'a>,
    /// The account's billed tokens, for the provider token limit when there is one.
    pub billed: Option<Billed>,
    /// Live leases on the key, every model (the key concurrency cap is the key's).
    pub key_leases: i64,
    /// SPEC 23.3: every model of the key alone, raw tokens (`None` without platform
    /// limits).
    pub platform_key: Option<Tally<'a>>,
    /// SPEC 23.3: every model of every key of the key's account, raw tokens.
    pub platform_account: Option<Tally<'a>>,
}

impl<'a> View<'a> {
    /// The tally a limit at `scope` counts.
    pub fn tally(&self, scope: Scope) -> Option<&Tally<'a>> {
        match scope {
            Scope::Key => self.key.as_ref(),
            Scope::Account => self.account.as_ref(),
            Scope::Provider => Some(&self.provider),
            Scope::PlatformKey => self.platform_key.as_ref(),
            Scope::PlatformAccount => self.platform_account.as_ref(),
            // A tenant's limits read the tenant's own tally (`admit_tenants`).
            Scope::Tenant => None,
        }
    }
}

/// One gate's answer: its refusal, or `None`; and the room it leaves for this request,
/// `(limit - used - in_flight - this request) / limit` (SPEC 17.1), 1.0 for a gate
/// without a limit to share.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub refused: Option<Admission>,
    pub room: f64,
    /// The scope of the declared limit that refused (SPEC 24.5: what a waiter waits
    /// for); `None` when it passed, or for the cooldown and the concurrency cap.
    pub scope: Option<Scope>,
}

impl Verdict {
    /// Passes and leaves all the room (a gate with nothing to say).
    pub const PASS: Verdict = Verdict { refused: None, room: 1.0, scope: None };

    fn refused(reason: Reason, retry_at_ms: Option<i64>) -> Verdict {
        Verdict { refused: Some(Admission::refused(reason, retry_at_ms)), room: 0.0, scope: None }
    }

    /// As `check()` answers.
    pub fn admission(self) -> Admission {
        self.refused.unwrap_or(Admission::ALLOWED)
    }
}

/// One gate of SPEC 14.1's chain.
#[derive(Debug, Clone, Copy)]
pub enum Gate<'a> {
    /// Refuses while the route's cooldown runs.
    Cooldown,
    /// One limit, at its scope.
    Limit(&'a Declared),
    /// The key's live leases against its concurrency cap.
    Concurrency,
}

impl Gate<'_> {
    /// This gate on `v`: a pure read of the view.
    pub fn check(&self, v: &View) -> Verdict {
        match self {
            Gate::Cooldown => {
                v.cooldown_until.map_or(Verdict::PASS, |t| Verdict::refused(Reason::Cooldown, Some(t)))
            }
            Gate::Limit(d) => check_limit(d, v),
            Gate::Concurrency => match v.ctx.concurrency_cap {
                Some(cap) if v.key_leases >= fillable(cap, v) => {
                    Verdict::refused(Reason::KeyConcurrency, None)
                }
                _ => Verdict::PASS,
            },
        }
    }
}

/// One of SPEC §4's single-gate questions (`can_make_request`, `can_use_tokens`,
/// `can_use_provider`, `can_use_provider_minute`, `can_use_provider_tokens`,
/// `can_use_key_concurrency`, `is_on_cooldown`): which gates of the chain it asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Can {
    /// The model's request limits.
    Request,
    /// The model's token limits.
    Tokens,
    ProviderDaily,
    ProviderMinute,
    ProviderTokens,
    KeyConcurrency,
    Cooldown,
}

impl Can {
    /// Whether this question asks `gate`.
    pub fn asks(self, gate: &Gate) -> bool {
        match gate {
            Gate::Cooldown => self == Can::Cooldown,
            Gate::Concurrency => self == Can::KeyConcurrency,
            Gate::Limit(d) => match self {
                Can::Request | Can::Tokens => {
                    d.limit.scope.is_model() && d.limit.metric.is_tokens() == (self == Can::Tokens)
                }
                Can::ProviderDaily => {
                    d.limit.scope == Scope::Provider && d.limit.slot() == (Metric::Requests, DAY)
                }
                Can::ProviderMinute => {
                    d.limit.scope == Scope::Provider && d.limit.slot() == (Metric::Requests, MINUTE)
                }
                Can::ProviderTokens => {
                    d.limit.scope == Scope::Provider && d.limit.slot() == (Metric::Tokens, DAY)
                }
                Can::KeyConcurrency | Can::Cooldown => false,
            },
        }
    }
}

/// Every gate of `ctx` in SPEC 14.1's order: cooldown; the model's limits; the provider
/// caps; the platform's limits (SPEC 23.3); key concurrency.
pub fn gates(ctx: &GateContext) -> impl Iterator<Item = Gate<'_>> {
    std::iter::once(Gate::Cooldown)
        .chain(ctx.limits.iter().map(Gate::Limit))
        .chain(ctx.provider.iter().map(Gate::Limit))
        .chain(ctx.platform.iter().map(Gate::Limit))
        .chain(std::iter::once(Gate::Concurrency))
}

/// Every gate in order on one view: the first refusal, or the smallest room they
/// leave.
pub fn admit(v: &View) -> Verdict {
    admit_through(v, gates(v.ctx))
}

/// [`admit`] over some of the gates (in the order given).
pub fn admit_through<'a>(v: &View, gates: impl Iterator<Item = Gate<'a>>) -> Verdict {
    let mut room = 1.0f64;
    for g in gates {
        // Taken apart: a gate that passed leaves nothing to drop.
        let Verdict { refused, room: r, scope } = g.check(v);
        if let Some(adm) = refused {
            return Verdict { refused: Some(adm), room: r, scope };
        }
        room = room.min(r);
    }
    Verdict { refused: None, room, scope: None }
}

/// How much of a limit this call may fill: all of it but SPEC 22.1's priority
/// reserve, for every limit and the concurrency cap alike.
fn fillable(limit: i64, v: &View) -> i64 {
    reserved_limit(limit, v.ctx.reserve)
}

/// SPEC 22.1: the limit a call of a priority with `reserve` may fill,
/// `limit - floor(limit * reserve)` (the floor in double precision).
#[inline]
pub fn reserved_limit(limit: i64, reserve: f64) -> i64 {
    if reserve <= 0.0 {
        return limit;
    }
    limit.saturating_sub((limit as f64 * reserve).floor() as i64)
}

/// SPEC 23.2: the tenant gates of a call after its route's passed, for each tenant in
/// the order given and each of its limits in gate order: the first refusal, naming the
/// tenant. Priority reserves apply as to the route's.
pub fn admit_tenants<'a>(
    tallies: impl Iterator<Item = (&'a std::sync::Arc<str>, &'a LimitSet, Tally<'a>)>, est: Estimate,
    reserve: f64, now: i64,
) -> Option<Admission> {
    for (name, set, t) in tallies {
        for d in set.iter() {
            let l = &d.limit;
            let Some(c) = t.win.counts(l.window, now) else { continue };
            let limit = reserved_limit(l.limit, reserve);
            let verdict = window_verdict(d, &t, c.get(l.metric), est.count_in(l.metric, 1), limit, now);
            if let Some(mut adm) = verdict.refused {
                adm.tenant = Some(name.clone());
                return Some(adm);
            }
        }
    }
    None
}

/// One limit for one more request: a request window refuses when recorded requests
/// and live leases reach the limit; a token window when they and the estimate exceed
/// it. A provider token limit counts billed tokens. A window the scope does not keep
/// (or a scope the view has not, e.g. a model's limit when a provider gate is asked
/// alone) passes.
fn check_limit(d: &Declared, v: &View) -> Verdict {
    let l = &d.limit;
    if l.scope == Scope::Provider {
        let spent = v.ctx.pool_spent.as_ref().and_then(|s| s.get(cap_slot(l.slot())?).copied().flatten());
        if let Some(until) = spent.filter(|t| *t > v.now) {
            return Verdict::refused(d.reason.clone(), Some(until));
        }
    }
    let Some(t) = v.tally(l.scope) else { return Verdict::PASS };
    let (recorded, this) = match v.billed {
        Some(b) if l.scope == Scope::Provider && l.metric.is_tokens() => {
            if b.window != l.window {
                return Verdict::PASS;
            }
            (b.used, b.estimate)
        }
        _ => {
            let Some(c) = t.win.counts(l.window, v.now) else { return Verdict::PASS };
            (c.get(l.metric), v.est.count_in(l.metric, 1))
        }
    };
    window_verdict(d, t, recorded, this, fillable(l.limit, v), v.now)
}

/// One window of a scope for one more request of `this`, with `recorded` in it and
/// the scope's leases in flight, against `limit` (the priority's share of it).
fn window_verdict(d: &Declared, t: &Tally, recorded: i64, this: i64, limit: i64, now: i64) -> Verdict {
    let l = &d.limit;
    let used = recorded.saturating_add(t.in_flight.get(l.metric));
    let (over, excess) = if l.metric.is_tokens() {
        let total = used.saturating_add(this);
        (total > limit, total.saturating_sub(limit))
    } else {
        (used >= limit, used.saturating_sub(limit).saturating_add(1))
    };
    if over {
        let retry = t.win.release_time(l.window, l.metric, excess, now);
        return Verdict { scope: Some(l.scope), ..Verdict::refused(d.reason.clone(), retry) };
    }
    // SPEC 22.1: headroom is scored with the priority's limit.
    Verdict { refused: None, room: room(limit, used.saturating_add(this)), scope: None }
}

/// The room a limit leaves once `taken` counts in it: `(limit - taken) / limit`.
pub fn room(limit: i64, taken: i64) -> f64 {
    if limit <= 0 {
        0.0
    } else {
        limit.saturating_sub(taken) as f64 / limit as f64
    }
}

/// A candidate of `lease_any` that passed every gate, with what its strategy reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Passed {
    /// The room its gates leave (`Verdict::room`).
    pub room: f64,
    /// Its key's observed quota headroom (SPEC 8.2), when known.
    pub key_headroom: Option<f64>,
    /// When this engine last leased it, as a count of its leases (0: never).
    pub leased_at: u64,
    /// Its model failed server-side in the last 5 minutes (SPEC 24.7): `headroom` and
    /// `spread` rank it after every candidate that is not penalized.
    pub penalized: bool,
}

/// SPEC 17.1: which of the candidates that passed `strategy` picks (its position in
/// `passed`, given in the candidates' order); ties go to the given order.
pub fn choose<'a>(strategy: Strategy, passed: impl IntoIterator<Item = &'a Passed>) -> Option<usize> {
    let score = |p: &Passed| match strategy {
        Strategy::Order => 0.0,
        Strategy::Headroom => p.key_headroom.map_or(p.room, |k| p.room.min(k)),
        // Least recently leased first; never leased before all.
        Strategy::Spread => -(p.leased_at as f64),
    };
    // SPEC 24.7: a penalized model after every healthy one; `order` keeps the order.
    let healthy = |p: &Passed| strategy == Strategy::Order || !p.penalized;
    let mut best: Option<(usize, (bool, f64))> = None;
    for (i, p) in passed.into_iter().enumerate() {
        let s = (healthy(p), score(p));
        if best.is_none_or(|(_, b)| (s.0 && !b.0) || (s.0 == b.0 && s.1 > b.1)) {
            best = Some((i, s));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::limits::Limit;

    const T0: i64 = 1_767_268_800_000;

    fn ctx(limits: &str) -> GateContext {
        GateContext { limits: LimitSet::parse(limits).unwrap_or_default(), ..GateContext::default() }
    }

    /// A route of its own account with `win` recorded and `in_flight` live.
    fn view<'a>(ctx: &'a GateContext, win: &'a Windows, in_flight: InFlight, est: Estimate) -> View<'a> {
        let tally = Tally { win, in_flight };
        View {
            now: T0,
            est,
            ctx,
            cooldown_until: None,
            key: Some(tally),
            account: Some(tally),
            provider: tally,
            billed: None,
            key_leases: in_flight.count,
            platform_key: None,
            platform_account: None,
        }
    }

    fn reason(v: Verdict) -> Option<String> {
        v.refused.and_then(|a| a.reason).map(|r| r.as_str().to_string())
    }

    #[test]
    fn a_request_window_refuses_at_the_limit_a_token_window_past_it() {
        let c = ctx("requests/minute=3 tokens/minute=100");
        let mut win = Windows::default();
        win.add(T0 - 1_000, 2, 60, T0);
        let one = InFlight { count: 1, est: Estimate::tokens(30) };
        // 2 recorded + 1 in flight = 3: the request window is full.
        assert_eq!(reason(admit(&view(&c, &win, one, Estimate::tokens(0)))), Some("rpm".into()));
        // 2 recorded: room for one more request; 60 + 40 tokens fill tpm exactly.
        let v = view(&c, &win, InFlight::default(), Estimate::tokens(40));
        let out = admit(&v);
        assert_eq!(out.refused, None);
        assert_eq!(out.room, 0.0);
        let v = view(&c, &win, InFlight::default(), Estimate::tokens(41));
        let refused = admit(&v).admission();
        assert_eq!(refused.reason, Some(Reason::declared("tpm")));
        // one token too many leaves when the recorded event leaves the minute
        assert_eq!(refused.retry_at_ms, Some(T0 - 1_000 + 60_000));
    }

    #[test]
    fn room_is_the_smallest_share_left_after_this_request() {
        let c = ctx("requests/minute=10 tokens/minute=1000");
        let mut win = Windows::default();
        win.add(T0, 4, 100, T0);
        // requests: (10 - 4 - 1) / 10 = 0.5; tokens: (1000 - 100 - 300) / 1000 = 0.6
        let out = admit(&view(&c, &win, InFlight::default(), Estimate::tokens(300)));
        assert_eq!(out, Verdict { refused: None, room: 0.5, scope: None });
        // nothing declared: all the room
        let none = GateContext::default();
        assert_eq!(admit(&view(&none, &win, InFlight::default(), Estimate::tokens(300))), Verdict::PASS);
    }

    #[test]
    fn gates_run_in_order_and_the_first_refusal_decides() {
        let mut c = ctx("requests/minute=0");
        c.provider = LimitSet::provider([Some(0), None, None]);
        c.concurrency_cap = Some(0);
        let win = Windows::default();
        let mut v = view(&c, &win, InFlight::default(), Estimate::default());
        v.cooldown_until = Some(T0 + 5);
        let refused = admit(&v).admission();
        assert_eq!((refused.reason, refused.retry_at_ms), (Some(Reason::Cooldown), Some(T0 + 5)));
        v.cooldown_until = None;
        assert_eq!(reason(admit(&v)), Some("rpm".into()));
        let only = |g: &Gate| !matches!(g, Gate::Limit(d) if d.limit.scope != Scope::Provider);
        let refused = admit_through(&v, gates(&c).filter(only)).admission();
        // a daily cap opens at the next day
        assert_eq!(refused.reason, Some(Reason::declared("provider_daily_requests")));
        assert_eq!(refused.retry_at_ms, Some(crate::core::calendar::Calendar::utc().next_day_start(T0)));
        let last = admit_through(&v, gates(&c).filter(|g| matches!(g, Gate::Concurrency))).admission();
        assert_eq!((last.reason, last.retry_at_ms), (Some(Reason::KeyConcurrency), None));
    }

    #[test]
    fn provider_caps_are_limits_at_provider_scope() {
        let set = LimitSet::provider([Some(5), Some(2), Some(1_000)]);
        let reasons: Vec<&str> = set.iter().map(|d| d.reason.as_str()).collect();
        assert_eq!(reasons, ["provider_daily_requests", "provider_minute_requests", "provider_daily_tokens"]);
        assert!(set.iter().all(|d| d.limit.scope == Scope::Provider));
        let c = GateContext { provider: set, ..GateContext::default() };
        // The route's own windows are empty; the account's (every model) are not.
        let own = Windows::default();
        let mut account = Windows::default();
        account.add(T0 - 10_000, 1, 0, T0);
        let mut v = view(&c, &own, InFlight::default(), Estimate::tokens(100));
        v.provider = Tally { win: &account, in_flight: InFlight { count: 1, est: Estimate::tokens(300) } };
        v.billed = Some(Billed { window: DAY, used: 600, estimate: 100 });
        // 1 recorded + 1 in flight of 2 per minute
        let refused = admit(&v).admission();
        assert_eq!(refused.reason, Some(Reason::declared("provider_minute_requests")));
        assert_eq!(refused.retry_at_ms, Some(T0 - 10_000 + 60_000));
        v.provider.in_flight.count = 0;
        // billed: 600 recorded + 300 in flight + 100 estimated = the cap, exactly
        let out = admit(&v);
        assert_eq!(out.refused, None);
        assert_eq!(out.room, 0.0);
        v.billed = Some(Billed { window: DAY, used: 600, estimate: 101 });
        assert_eq!(reason(admit(&v)), Some("provider_daily_tokens".into()));
        // the raw estimate counts nowhere at provider scope: only the billed one
        v.billed = Some(Billed { window: DAY, used: 0, estimate: 0 });
        v.est = Estimate::tokens(10_000);
        assert_eq!(admit(&v).refused, None);
    }

    /// SPEC 24.6: a spent pool refuses through its cap's gate until its reset, whatever
    /// was counted; the other caps' gates are untouched.
    #[test]
    fn a_spent_pool_refuses_through_its_gate_until_its_reset() {
        let until = T0 + 6 * 3_600_000;
        let c = GateContext {
            provider: LimitSet::provider([Some(1_000), Some(0), None]),
            pool_spent: Some(Box::new([Some(until), None, None])),
            ..GateContext::default()
        };
        let empty = Windows::default();
        let mut v = view(&c, &empty, InFlight::default(), Estimate::tokens(1));
        let refused = admit(&v).admission();
        assert_eq!(refused.reason, Some(Reason::declared("provider_daily_requests")));
        assert_eq!(refused.retry_at_ms, Some(until));
        assert_eq!(admit(&v).room, 0.0);
        // At the reset the day's gate counts again (nothing counted: it passes), and the
        // minute cap of 0 refuses as it would have.
        v.now = until;
        assert_eq!(reason(admit(&v)), Some("provider_minute_requests".into()));
        let c = GateContext { provider: LimitSet::provider([Some(1_000), None, None]), ..c };
        let mut v = view(&c, &empty, InFlight::default(), Estimate::tokens(1));
        v.now = until;
        assert_eq!(admit(&v).refused, None);
        // A spent minute pool names the minute gate.
        let c = GateContext {
            provider: LimitSet::provider([Some(1_000), Some(0), None]),
            pool_spent: Some(Box::new([None, Some(T0 + 40_000), None])),
            ..GateContext::default()
        };
        let v = view(&c, &empty, InFlight::default(), Estimate::tokens(1));
        let refused = admit(&v).admission();
        assert_eq!(refused.reason, Some(Reason::declared("provider_minute_requests")));
        assert_eq!(refused.retry_at_ms, Some(T0 + 40_000));
    }

    #[test]
    fn platform_limits_run_after_the_provider_caps_and_before_key_concurrency() {
        let platform = LimitSet::platform(vec![
            Limit::parse("requests", 3, "minute", "account").unwrap_or_else(|e| panic!("{e}")),
            Limit::parse("tokens", 100, "minute", "key").unwrap_or_else(|e| panic!("{e}")),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let c = GateContext { platform, concurrency_cap: Some(0), ..GateContext::default() };
        let own = Windows::default();
        // the key over every model: 2 requests, 50 tokens; its account: 3 requests
        let mut key = Windows::default();
        key.add(T0 - 20_000, 2, 50, T0);
        let mut account = Windows::default();
        account.add(T0 - 30_000, 1, 0, T0);
        account.add(T0 - 20_000, 2, 50, T0);
        let mut v = view(&c, &own, InFlight::default(), Estimate::tokens(10));
        let check = |v: &View| admit(v).admission();
        // without the platform's tallies (no limits read them) nothing counts there
        assert_eq!(check(&v).reason, Some(Reason::KeyConcurrency));
        v.platform_key =
            Some(Tally { win: &key, in_flight: InFlight { count: 0, est: Estimate::tokens(40) } });
        v.platform_account = Some(Tally { win: &account, in_flight: InFlight::default() });
        // the account's three requests fill its limit; its oldest leaves the minute first
        let refused = check(&v);
        assert_eq!(refused.reason, Some(Reason::declared("platform:requests/minute")));
        assert_eq!(refused.retry_at_ms, Some(T0 - 30_000 + 60_000));
        // with a provider cap full too, the cap refuses first
        let capped = GateContext { provider: LimitSet::provider([None, Some(0), None]), ..c.clone() };
        let v2 = View { ctx: &capped, ..v };
        assert_eq!(check(&v2).reason, Some(Reason::declared("provider_minute_requests")));
        // the key's tokens: 50 recorded + 40 in flight + 11 estimated > 100
        v.platform_account = Some(Tally { win: &own, in_flight: InFlight::default() });
        v.est = Estimate::tokens(11);
        assert_eq!(check(&v).reason, Some(Reason::declared("platform:tokens/minute")));
        // SPEC 22.1: a priority's reserve applies as to any other limit
        v.est = Estimate::tokens(10);
        let reserved = GateContext { reserve: 0.1, ..v.ctx.clone() };
        let v3 = View { ctx: &reserved, ..v };
        assert_eq!(check(&v3).reason, Some(Reason::declared("platform:tokens/minute")));
        // room at both: key concurrency decides
        assert_eq!(check(&v).reason, Some(Reason::KeyConcurrency));
        // the model's single-gate questions do not ask the platform's limits
        let asked = gates(v.ctx).filter(|g| Can::Request.asks(g) || Can::Tokens.asks(g)).count();
        assert_eq!(asked, 0);
    }

    #[test]
    fn a_scope_the_view_lacks_or_a_window_it_does_not_keep_passes() {
        let five_s = Limit::parse("requests", 0, "5s", "key").unwrap_or_else(|e| panic!("{e}"));
        let c = GateContext {
            limits: LimitSet::new(vec![five_s, Limit::classic(Metric::Requests, MINUTE, 0)])
                .unwrap_or_else(|e| panic!("{e}")),
            ..GateContext::default()
        };
        let win = Windows::default();
        let mut v = view(&c, &win, InFlight::default(), Estimate::default());
        // the 5 s window is not kept by these windows: only the minute refuses
        assert_eq!(reason(admit(&v)), Some("rpm".into()));
        // a provider gate asked alone: no route, so no model limit applies
        v.key = None;
        v.account = None;
        assert_eq!(admit(&v), Verdict::PASS);
    }

    #[test]
    fn input_and_output_windows_count_their_part_of_the_estimate() {
        let input = Limit::parse("input_tokens", 100, "minute", "account").unwrap_or_else(|e| panic!("{e}"));
        let output = Limit::parse("output_tokens", 10, "minute", "account").unwrap_or_else(|e| panic!("{e}"));
        let c = GateContext {
            limits: LimitSet::new(vec![input, output]).unwrap_or_else(|e| panic!("{e}")),
            ..GateContext::default()
        };
        let win = Windows::default();
        let est = Estimate { tokens: 110, output: 10, cost: 0 };
        assert_eq!(admit(&view(&c, &win, InFlight::default(), est)).refused, None);
        let est = Estimate { tokens: 111, output: 10, cost: 0 };
        assert_eq!(
            reason(admit(&view(&c, &win, InFlight::default(), est))),
            Some("input_tokens/minute".into())
        );
        let est = Estimate { tokens: 111, output: 11, cost: 0 };
        assert_eq!(
            reason(admit(&view(&c, &win, InFlight::default(), est))),
            Some("output_tokens/minute".into())
        );
    }

    #[test]
    fn choose_by_strategy_ties_to_the_given_order() {
        let p = |room, key_headroom, leased_at| Passed { room, key_headroom, leased_at, penalized: false };
        let passed = [p(0.2, None, 3), p(0.9, Some(0.1), 0), p(0.5, None, 0), p(0.5, None, 1)];
        assert_eq!(choose(Strategy::Order, &passed), Some(0));
        // the key's observed headroom bounds the second one's room
        assert_eq!(choose(Strategy::Headroom, &passed), Some(2));
        // never leased first, the first of them
        assert_eq!(choose(Strategy::Spread, &passed), Some(1));
        assert_eq!(choose(Strategy::Headroom, &[]), None);
    }

    #[test]
    fn a_penalized_model_ranks_last_for_headroom_and_spread_not_for_order() {
        let p = |room, leased_at, penalized| Passed { room, key_headroom: None, leased_at, penalized };
        let passed = [p(0.9, 0, true), p(0.1, 5, false), p(0.2, 9, false)];
        assert_eq!(choose(Strategy::Order, &passed), Some(0));
        assert_eq!(choose(Strategy::Headroom, &passed), Some(2));
        assert_eq!(choose(Strategy::Spread, &passed), Some(1));
        // Penalized all: ranked among themselves as usual.
        let all = [p(0.1, 3, true), p(0.5, 1, true)];
        assert_eq!(choose(Strategy::Headroom, &all), Some(1));
        assert_eq!(choose(Strategy::Spread, &all), Some(1));
    }
}
