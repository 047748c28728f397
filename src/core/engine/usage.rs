//! Usage recording and reporting (SPEC §4, §14.1, §14.4): a call's request and
//! tokens as usage rows (committed now, or grouped when `flush_interval_ms > 0`), a
//! success clearing the route's failure history, and `usage()`'s report of what each
//! window used. The lease path's success (`batch.rs`) builds its rows here too.
use super::unit::Access;
use super::{unit, Engine};
use crate::core::admission::Estimate;
use crate::core::error::{Error, Result};
use crate::core::limits::{classic_use, classic_window, Declared, LimitSet, CLASSIC_NAMES};
use crate::core::money::Prices;
use crate::core::store::{HistoryKind, TokenKinds, UsageKind, UsageRow, Write};
use crate::core::tenants::{self, TenantList};
use crate::core::types::{check_non_negative, Route};
use crate::core::windows::Counts;
use std::sync::Arc;

/// The tokens one call reports (SPEC §14.4): the total, or input and output apart
/// (the total is then their sum), and the cached part of the input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUse {
    pub tokens: Option<i64>,
    pub kinds: TokenKinds,
}

impl TokenUse {
    /// A total only.
    pub fn total(tokens: i64) -> TokenUse {
        TokenUse { tokens: Some(tokens), kinds: TokenKinds::default() }
    }

    /// A lease's estimate recorded as used (leaving a `with` block without an outcome,
    /// `close()`): with its split, `tokens - output` input and `output` output tokens,
    /// so that it costs exactly what the lease reserved (SPEC 23.1).
    pub fn estimate(est: Estimate) -> TokenUse {
        let kinds = TokenKinds {
            input: Some(est.tokens.saturating_sub(est.output).max(0)),
            output: Some(est.output),
            cached: None,
        };
        TokenUse { tokens: Some(est.tokens), kinds }
    }

    /// Validated: every count >= 0 and at least one given. Returns the total.
    pub fn validate(&self) -> Result<i64> {
        let k = &self.kinds;
        for (name, v) in [
            ("tokens", self.tokens),
            ("input_tokens", k.input),
            ("output_tokens", k.output),
            ("cached_tokens", k.cached),
        ] {
            if let Some(v) = v {
                check_non_negative(name, v)?;
            }
        }
        if self.tokens.is_none() && k.is_empty() {
            return Err(Error::invalid("give tokens, input_tokens, output_tokens or cached_tokens"));
        }
        Ok(self.tokens.unwrap_or_else(|| k.input.unwrap_or(0).saturating_add(k.output.unwrap_or(0))))
    }
}

/// One window of a usage report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowReport {
    pub used: i64,
    pub limit: Option<i64>,
}

/// `usage()` (SPEC §4, §14.1): every declared limit with what its scope recorded in its
/// window, in gate order; the route's own minute and day beside them (what a classic
/// window reports when it is not declared); live leases apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageReport {
    pub limits: Vec<(Declared, i64)>,
    /// The route's own counts in the sliding minute and the calendar day.
    pub minute: Counts,
    pub day: Counts,
    pub in_flight: i64,
}

impl UsageReport {
    /// One window as SPEC §4 reports it, by its reason: a declared limit's use and
    /// value; a classic window not declared, the route's own use and no limit.
    pub fn window(&self, reason: &str) -> WindowReport {
        if let Some((d, used)) = self.limits.iter().find(|(d, _)| d.reason.as_str() == reason) {
            return WindowReport { used: *used, limit: Some(d.limit.limit) };
        }
        WindowReport { used: classic_use(reason, &self.minute, &self.day), limit: None }
    }

    /// Every declared limit but the classic four, by reason (SPEC §14.1's added keys).
    pub fn others(&self) -> impl Iterator<Item = (&str, WindowReport)> {
        self.limits
            .iter()
            .filter(|(d, _)| classic_window(d.reason.as_str()).is_none())
            .map(|(d, used)| (d.reason.as_str(), WindowReport { used: *used, limit: Some(d.limit.limit) }))
    }

    /// Every window `usage()` reports, in its order, as `(key, report)`: the classic
    /// four, then [`others`](Self::others) (the platform's limits, SPEC 23.3, last).
    pub fn windows(&self) -> impl Iterator<Item = (&str, WindowReport)> {
        CLASSIC_NAMES.into_iter().map(|name| (name, self.window(name))).chain(self.others())
    }
}

/// What a route used: recording requests and tokens, and the report of each window
/// (SPEC §4, §14), reached as [`Engine::usage`].
pub struct Usage<'e> {
    unit: &'e mut unit::Unit,
}

impl Engine {
    /// Usage: recording requests and tokens, and what each window used.
    pub fn usage(&mut self) -> Usage<'_> {
        Usage { unit: &mut self.unit }
    }
}

impl Usage<'_> {
    /// The route's names as the mirror holds them (shared, not copied per write).
    fn route_names(&mut self, route: &Route) -> (Arc<str>, Arc<str>) {
        let rid = self.unit.mirror.route_id(&route.platform, &route.model_id, route.key_id);
        self.unit.mirror.reader().route_names(rid)
    }

    /// One event: a request (`tokens` 0), or `tokens` tokens split as `kinds` says,
    /// costed at the route's prices in force now (SPEC 23.1; an overflow records
    /// nothing).
    pub(super) fn usage_row(
        &mut self, route: &Route, kind: UsageKind, tokens: i64, kinds: TokenKinds, tenants: &TenantList,
        t: i64,
    ) -> Result<Write> {
        let cost = match self.unit.mirror.reader().prices(&route.platform, &route.model_id) {
            Some(p) => event_cost(&p, kind, tokens, kinds)?,
            None => 0,
        };
        let (platform, model_id) = self.route_names(route);
        Ok(Write::Usage(UsageRow {
            tenants: tenants.clone(),
            platform,
            model_id,
            key_id: route.key_id,
            kind,
            tokens,
            count: 1,
            created_at_ms: t,
            kinds,
            cost,
        }))
    }

    /// Usage writes: committed now, or grouped when `flush_interval_ms > 0` (applied
    /// to the mirror and buffered).
    fn write_usage(&mut self, writes: Vec<Write>) -> Result<()> {
        if self.unit.groups_usage() {
            let now = self.unit.clock.now_ms();
            for w in writes {
                self.unit.apply_local(&w, 0, now);
                self.unit.buffer(w, now);
            }
            return Ok(());
        }
        self.unit.run(Access::Append, |tx| {
            writes.into_iter().for_each(|w| tx.push(w));
            Ok(())
        })
    }

    pub fn record_request(&mut self, route: &Route) -> Result<()> {
        self.record_request_for(route, &tenants::none())
    }

    /// A request served for `tenants` (SPEC 23.2): it counts for each of them too.
    pub fn record_request_for(&mut self, route: &Route, tenants: &TenantList) -> Result<()> {
        let now = self.unit.clock.now_ms();
        let mut writes =
            vec![self.usage_row(route, UsageKind::Request, 0, TokenKinds::default(), tenants, now)?];
        self.clear_history_on_success(route, &mut writes);
        self.write_usage(writes)
    }

    /// SPEC §4/§6: a success clears the route's ladder, unknown-limit, transient
    /// (15.2) and empty-completion history and its key's auth ladder. Only when there is some,
    /// so the hot path writes nothing extra.
    pub(super) fn clear_history_on_success(&self, route: &Route, writes: &mut Vec<Write>) {
        let (route_rows, auth_rows) = self.unit.mirror.reader().history_to_clear(route);
        if route_rows {
            writes.push(Write::DeleteHistory {
                key_id: route.key_id,
                route: Some((Arc::from(route.platform.as_str()), Arc::from(route.model_id.as_str()))),
                kinds: vec![
                    HistoryKind::Ladder,
                    HistoryKind::Unknown,
                    HistoryKind::Empty,
                    HistoryKind::Transient,
                ],
            });
        }
        if auth_rows {
            writes.push(Write::DeleteHistory {
                key_id: route.key_id,
                route: None,
                kinds: vec![HistoryKind::Auth],
            });
        }
    }

    pub fn record_tokens(&mut self, route: &Route, tokens: i64) -> Result<()> {
        self.record_token_use(route, TokenUse::total(tokens))
    }

    /// SPEC §14.4: one call's tokens, the total and (when reported) the split.
    pub fn record_token_use(&mut self, route: &Route, used: TokenUse) -> Result<()> {
        self.record_token_use_for(route, used, &tenants::none())
    }

    /// One call's tokens served for `tenants` (SPEC 23.2): they count for each of them too.
    pub fn record_token_use_for(
        &mut self, route: &Route, used: TokenUse, tenants: &TenantList,
    ) -> Result<()> {
        let total = used.validate()?;
        let now = self.unit.clock.now_ms();
        let row = self.usage_row(route, UsageKind::Tokens, total, used.kinds, tenants, now)?;
        self.write_usage(vec![row])
    }

    /// SPEC §4/§14.1: recorded usage in each window, the classic four always, and
    /// every other declared limit by its reason.
    pub fn report(&mut self, route: &Route, limits: Option<LimitSet>) -> Result<UsageReport> {
        self.unit.run(Access::Read, |tx| {
            let (unit, now, _) = tx.parts();
            Ok(Usage { unit }.report_at(route, limits, now))
        })
    }

    /// [`report`](Self::report) of each route with its declared limits, in one read.
    pub fn reports(&mut self, routes: &[Route]) -> Result<Vec<UsageReport>> {
        self.unit.run(Access::Read, |tx| {
            let (unit, now, _) = tx.parts();
            let mut usage = Usage { unit };
            Ok(routes.iter().map(|r| usage.report_at(r, None, now)).collect())
        })
    }

    /// `report()` inside a section, at `now`.
    fn report_at(&mut self, route: &Route, limits: Option<LimitSet>, now: i64) -> UsageReport {
        let limits = self.unit.mirror.limits_for(&route.platform, &route.model_id, limits);
        let rid = self.unit.ready_route(route, &limits, now);
        let m = &self.unit.mirror;
        let read = m.reader();
        // SPEC 23.3: the platform's limits after the model's, each counting its scope
        // over every model.
        let platform = m.config.platform_set(&route.platform);
        let (account, key_id) = (m.routes.get(rid).account(), route.key_id);
        let platform_used = platform.iter().map(|d| {
            let used = m
                .platform_tally(account, key_id, d.limit.scope, now)
                .and_then(|t| t.win.counts(d.limit.window, now));
            (d.clone(), used.unwrap_or_default().get(d.limit.metric))
        });
        UsageReport {
            // A declared limit reports its scope's usage (a shared account's, SPEC §14.3).
            limits: limits
                .iter()
                .map(|d| (d.clone(), m.scoped_counts(rid, &d.limit, now).get(d.limit.metric)))
                .chain(platform_used)
                .collect(),
            minute: read.route_minute(rid),
            day: read.route_day(rid, now),
            in_flight: m.route_in_flight(rid, now).count,
        }
    }
}

/// What one event costs in µ$ at `p` (SPEC 23.1): a request its price per request;
/// tokens with a split (input or output reported) at each kind's price, cached input
/// at its own, and any of the total the split leaves out at the dearer price; a bare
/// total at the dearer price.
fn event_cost(p: &Prices, kind: UsageKind, tokens: i64, kinds: TokenKinds) -> Result<i64> {
    if kind == UsageKind::Request {
        return p.request_cost();
    }
    if kinds.input.is_none() && kinds.output.is_none() {
        return p.total_cost(tokens);
    }
    let (input, output) = (kinds.input.unwrap_or(0).max(0), kinds.output.unwrap_or(0).max(0));
    let split = p.tokens_cost(input, kinds.cached.unwrap_or(0).max(0), output)?;
    let rest = tokens.saturating_sub(input.saturating_add(output));
    if rest <= 0 {
        return Ok(split);
    }
    split
        .checked_add(p.total_cost(rest)?)
        .ok_or_else(|| Error::Overflow("a cost beyond 2^63 - 1 micro-dollars".to_string()))
}
