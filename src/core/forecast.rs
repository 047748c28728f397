//! SPEC 22.2: when each long window of a route would run out at the recent pace.
//!
//! Everything is read from the mirror's windows: what a window has used and holds in
//! flight (as `usage()` and the gates read them), and the pace, the usage recorded in
//! the window's metric and scope over the last `lookback_ms`, from a sliding window of
//! that width the forecast makes the route's windows keep (`Mirror::keep_recent`).
use crate::core::admission::{Estimate, GateContext};
use crate::core::limits::{Limit, Metric, WindowSpec, DAY, MAX_WIDTH_MS};
use crate::core::state::{Mirror, RouteId};

/// Windows this long or longer are forecast (calendar windows always).
pub const MIN_FORECAST_WIDTH_MS: i64 = 3_600_000;

/// `now + (limit - taken) / rate` rounded down, the rate being `recent / lookback_ms`:
/// `now` when nothing is left; `None` when nothing was used lately, or when that time
/// lies at or after the window's next reset (`None` for a sliding window: never).
pub fn exhaustion(
    now: i64, limit: i64, taken: i64, recent: i64, lookback_ms: i64, reset: Option<i64>,
) -> Option<i64> {
    let left = limit.saturating_sub(taken);
    if left <= 0 {
        return Some(now);
    }
    if recent <= 0 || lookback_ms <= 0 {
        return None;
    }
    let dt = i128::from(left) * i128::from(lookback_ms) / i128::from(recent);
    let at = i64::try_from(i128::from(now) + dt).unwrap_or(i64::MAX);
    match reset {
        Some(r) if at >= r => None,
        _ => Some(at),
    }
}

/// The sliding width that holds a lookback's usage: the lookback, at most the longest
/// window a limit may declare (31 days: older usage is not kept).
pub fn recent_width(lookback_ms: i64) -> i64 {
    lookback_ms.clamp(1, MAX_WIDTH_MS)
}

/// SPEC 22.2 for one route: per declared window of an hour or longer (keyed by its
/// reason, as `usage()` keys it) and per daily provider cap (keyed by its gate reason),
/// when it would run out. Call `prune_route`, `keep_windows` and
/// `keep_recent(rid, recent_width(lookback_ms))` first: the pace is read from the
/// windows of the last `lookback_ms`.
pub fn forecast(
    m: &Mirror, rid: RouteId, ctx: &GateContext, lookback_ms: i64, now: i64,
) -> Vec<(String, Option<i64>)> {
    let r = m.routes.get(rid);
    let v = m.route_view(rid, ctx, Estimate::default(), now);
    let width = recent_width(lookback_ms);
    let cal = m.routes.calendar(rid);
    let mut out = Vec::new();
    for d in ctx.limits.iter() {
        let l = &d.limit;
        let reset = match l.window {
            WindowSpec::Sliding(w) if w < MIN_FORECAST_WIDTH_MS => continue,
            WindowSpec::Sliding(_) => None,
            WindowSpec::Calendar(p) => Some(cal.next_period_start(p, now)),
        };
        let in_flight = v.tally(l.scope).map_or(0, |t| t.in_flight.get(l.metric));
        let used = m.scoped_counts(rid, l, now).get(l.metric);
        let taken = used.saturating_add(in_flight);
        // The pace: what the same scope recorded in the same metric in the last `width`.
        let recent = Limit { window: WindowSpec::Sliding(width), ..l.clone() };
        let pace = m.scoped_counts(rid, &recent, now).get(l.metric);
        out.push((d.reason.as_str().to_string(), exhaustion(now, l.limit, taken, pace, lookback_ms, reset)));
    }
    // The daily provider caps (SPEC §8): the account's requests, its tokens billed per
    // model; in flight as the provider gates count it.
    let daily =
        |metric: Metric| ctx.provider.iter().find(|d| d.limit.window == DAY && (d.limit.metric == metric));
    let next_day = cal.next_day_start(now);
    let token_cap = daily(Metric::Tokens).map(|d| d.limit.limit);
    let (requests, billed) = m.recent_account(rid, token_cap, width, now);
    if let Some(d) = daily(Metric::Requests) {
        let taken = m
            .provider_day_requests(&r.platform, r.key_id, now)
            .saturating_add(v.provider.in_flight.get(Metric::Requests));
        out.push((
            d.reason.as_str().to_string(),
            exhaustion(now, d.limit.limit, taken, requests, lookback_ms, Some(next_day)),
        ));
    }
    if let Some(d) = daily(Metric::Tokens) {
        let cap = d.limit.limit;
        let taken = m
            .provider_day_tokens(&r.platform, r.key_id, Some(cap), now)
            .saturating_add(v.provider.in_flight.get(Metric::Tokens));
        out.push((
            d.reason.as_str().to_string(),
            exhaustion(now, cap, taken, billed, lookback_ms, Some(next_day)),
        ));
    }
    // SPEC 23.3: the platform's limits, each over every model of its scope, keyed by
    // their reasons like the model's.
    for d in ctx.platform.iter() {
        let l = &d.limit;
        let reset = match l.window {
            WindowSpec::Sliding(w) if w < MIN_FORECAST_WIDTH_MS => continue,
            WindowSpec::Sliding(_) => None,
            WindowSpec::Calendar(p) => Some(cal.next_period_start(p, now)),
        };
        let Some(t) = m.platform_tally(r.account(), r.key_id, l.scope, now) else { continue };
        let count = |w: WindowSpec| t.win.counts(w, now).unwrap_or_default().get(l.metric);
        let taken = count(l.window).saturating_add(t.in_flight.get(l.metric));
        let pace = count(WindowSpec::Sliding(width));
        out.push((d.reason.as_str().to_string(), exhaustion(now, l.limit, taken, pace, lookback_ms, reset)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhaustion_follows_the_pace() {
        // 100 left at 10 per 1000 ms: 10 000 ms from now.
        assert_eq!(exhaustion(5_000, 150, 50, 10, 1_000, None), Some(15_000));
        // rounded down
        assert_eq!(exhaustion(0, 10, 0, 3, 1_000, None), Some(3_333));
        // nothing left: now, whatever the pace
        assert_eq!(exhaustion(7, 10, 10, 0, 1_000, Some(8)), Some(7));
        // no pace
        assert_eq!(exhaustion(7, 10, 0, 0, 1_000, None), None);
        // at or after the reset
        assert_eq!(exhaustion(0, 10, 0, 1, 1_000, Some(10_000)), None);
        assert_eq!(exhaustion(0, 10, 0, 1, 1_000, Some(10_001)), Some(10_000));
    }
}
