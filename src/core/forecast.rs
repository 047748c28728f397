//! SPEC 22.2: when each long window of a route would run out at the recent pace.
//!
//! What a window has used and holds in flight is read from the mirror's windows (as
//! `usage()` and the gates read them); the pace is the usage recorded in the window's
//! metric and scope over the last `lookback_ms`, from the rows the caller read.
use crate::core::limits::{Metric, Scope, WindowSpec};
use crate::core::state::{estimate_in, GateContext, Mirror, Multiplier, RouteId};
use crate::core::store::{UsageKind, UsageRow};
use crate::core::types::Reason;

/// Windows this long or longer are forecast (calendar windows always).
pub const MIN_FORECAST_WIDTH_MS: i64 = 3_600_000;

/// `now + (limit - taken) / rate` rounded down, the rate being `recent / lookback_ms`:
/// `now` when nothing is left; `None` when nothing was used lately, or when that time
/// lies at or after the window's next reset (`None` for a sliding window: never).
pub fn exhaustion(
    now: i64,
    limit: i64,
    taken: i64,
    recent: i64,
    lookback_ms: i64,
    reset: Option<i64>,
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

/// What one usage row counts in a metric (SPEC §14.4; a request row its requests).
fn row_amount(row: &UsageRow, metric: Metric) -> i64 {
    match (row.kind, metric) {
        (UsageKind::Request, Metric::Requests) => row.requests(),
        (UsageKind::Request, _) | (UsageKind::Tokens, Metric::Requests) => 0,
        (UsageKind::Tokens, Metric::Tokens) => row.tokens.max(0),
        (UsageKind::Tokens, Metric::InputTokens) => row.kinds.metered_input(),
        (UsageKind::Tokens, Metric::OutputTokens) => row.kinds.output.unwrap_or(0).max(0),
    }
}

/// SPEC 22.2 for one route: per declared window of an hour or longer (keyed by its
/// reason, as `usage()` keys it) and per daily provider cap (keyed by its gate reason),
/// when it would run out. `recent` holds the platform's usage rows stamped after
/// `now - lookback_ms` (more is filtered out here). Call `prune_route` and
/// `keep_windows` first.
pub fn forecast(
    m: &Mirror,
    rid: RouteId,
    ctx: &GateContext,
    recent: &[UsageRow],
    lookback_ms: i64,
    now: i64,
) -> Vec<(String, Option<i64>)> {
    let r = m.route(rid);
    let (platform, model_id, key_id) = (&*r.platform, &*r.model_id, r.key_id);
    let a = m.account_of_route(rid);
    let v = m.view(Some(rid), a, key_id, ctx, now);
    let since = now.saturating_sub(lookback_ms);
    let account_keys = m.account_keys(platform, key_id);
    let in_window = |row: &&UsageRow| row.created_at_ms > since && &*row.platform == platform;
    let cal = m.route_calendar(rid);
    let mut out = Vec::new();
    for d in ctx.limits.iter() {
        let l = &d.limit;
        let reset = match l.window {
            WindowSpec::Sliding(w) if w < MIN_FORECAST_WIDTH_MS => continue,
            WindowSpec::Sliding(_) => None,
            WindowSpec::Calendar(p) => Some(cal.next_period_start(p, now)),
        };
        let shared = l.scope == Scope::Account && v.group.is_some();
        let in_flight = match v.group {
            Some((_, f)) if shared => f,
            _ => v.route,
        };
        let used = m.scoped_counts(rid, l, now).get(l.metric);
        let taken = used.saturating_add(estimate_in(
            l.metric,
            in_flight.count,
            in_flight.tokens,
            in_flight.output_tokens,
        ));
        let pace: i64 = recent
            .iter()
            .filter(in_window)
            .filter(|row| {
                &*row.model_id == model_id
                    && if shared { account_keys.contains(&row.key_id) } else { row.key_id == key_id }
            })
            .map(|row| row_amount(row, l.metric))
            .fold(0i64, i64::saturating_add);
        out.push((d.reason.as_str().to_string(), exhaustion(now, l.limit, taken, pace, lookback_ms, reset)));
    }
    let next_day = cal.next_day_start(now);
    let on_account = |row: &&UsageRow| account_keys.contains(&row.key_id);
    if let Some(cap) = ctx.caps.daily_requests {
        let taken = m.provider_day_requests(platform, key_id, now).saturating_add(v.account_count);
        let pace = recent
            .iter()
            .filter(in_window)
            .filter(on_account)
            .map(|row| row_amount(row, Metric::Requests))
            .fold(0i64, i64::saturating_add);
        out.push((
            Reason::ProviderDailyRequests.as_str().to_string(),
            exhaustion(now, cap, taken, pace, lookback_ms, Some(next_day)),
        ));
    }
    if let Some(cap) = ctx.caps.daily_tokens {
        let taken = m.provider_day_tokens(platform, key_id, Some(cap), now).saturating_add(v.account_billed);
        // Billed per model, as the cap counts them (SPEC §8).
        let mut raw: Vec<(&str, i64, i64)> = Vec::new();
        for row in recent.iter().filter(in_window).filter(on_account) {
            let t = row_amount(row, Metric::Tokens);
            match raw.iter_mut().find(|(mm, k, _)| *mm == &*row.model_id && *k == row.key_id) {
                Some(e) => e.2 = e.2.saturating_add(t),
                None => raw.push((&row.model_id, row.key_id, t)),
            }
        }
        let pace = raw
            .iter()
            .map(|(mm, k, t)| {
                let mult =
                    m.find_route(platform, mm, *k).map_or(Multiplier::ONE, |rid| m.multiplier(rid, cap));
                mult.bill(*t)
            })
            .fold(0i64, i64::saturating_add);
        out.push((
            Reason::ProviderDailyTokens.as_str().to_string(),
            exhaustion(now, cap, taken, pace, lookback_ms, Some(next_day)),
        ));
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
