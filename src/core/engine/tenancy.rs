//! SPEC 23.2 and 23.4: declaring a tenant's limits and reading what each tenant used.
//! The gates themselves run in the admission (`admit`, `batch.rs`).
use super::unit::Access;
use super::Engine;
use crate::core::clock::DAY_MS;
use crate::core::error::{Error, Result};
use crate::core::forecast::{exhaustion, recent_width, MIN_FORECAST_WIDTH_MS};
use crate::core::limits::{Limit, WindowSpec};
use crate::core::store::{TenantLimitsRow, UsageFilter, Write};
use crate::core::tenants::{self, TenantDecl};
use std::collections::BTreeSet;
use std::sync::Arc;

/// One limit in force for a tenant, as `tenant_usage()` and the snapshot report it:
/// recorded in its window, held in flight by the tenant's live leases, and (for a
/// window of an hour or longer) when it would run out at the recent pace (SPEC 22.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantWindow {
    pub tenant: String,
    /// `"<metric>/<per>"`, e.g. `"cost/day"`.
    pub window: String,
    pub used: i64,
    pub limit: i64,
    pub in_flight: i64,
    pub exhausts_at_ms: Option<i64>,
}

impl Engine {
    /// Replaces the declaration of a tenant or a pattern (a name ending in `*`); empty
    /// `limits` forget it. Limits at scope `"account"` only; calendar periods start at
    /// 00:00 in `tz` (IANA; default UTC). Persisted and shared through the store; bad
    /// input writes nothing.
    pub fn set_tenant_limits(&mut self, tenant: &str, limits: Vec<Limit>, tz: Option<String>) -> Result<()> {
        tenants::check_name(tenant, true)?;
        let decl = TenantDecl::new(limits, tz.clone())?;
        let row = TenantLimitsRow { tenant: tenant.to_string(), limits: decl.limits.declared(), tz };
        self.unit.run(Access::Write, |tx| {
            tx.push(Write::SetTenantLimits(row));
            Ok(())
        })
    }

    /// The limits in force for a tenant (its own declaration, else the longest pattern
    /// that matches it), as declared, in gate order; a pattern's own declaration when
    /// `tenant` is one.
    pub fn tenant_limits(&mut self, tenant: &str) -> Result<Vec<Limit>> {
        tenants::check_name(tenant, true)?;
        self.unit.run(Access::Read, |tx| {
            Ok(tx
                .mirror()
                .config
                .tenants
                .declaration(tenant)
                .map(|d| d.limits.declared())
                .unwrap_or_default())
        })
    }

    /// The IANA zone the calendar periods of the declaration in force for a tenant start
    /// in (its own, else the longest matching pattern's); `None` for UTC or no declaration.
    pub fn tenant_zone(&mut self, tenant: &str) -> Result<Option<String>> {
        tenants::check_name(tenant, true)?;
        self.unit.run(Access::Read, |tx| {
            Ok(tx.mirror().config.tenants.declaration(tenant).and_then(|d| d.tz.clone()))
        })
    }

    /// Every limit in force for a tenant: used, limit and in flight (in the limit's
    /// unit), keyed `"<metric>/<per>"`; empty without limits.
    pub fn tenant_usage(&mut self, tenant: &str) -> Result<Vec<TenantWindow>> {
        tenants::check_name(tenant, false)?;
        let name: Arc<str> = Arc::from(tenant);
        self.unit.run(Access::Read, |tx| {
            let (u, now, _) = tx.parts();
            Ok(tenant_windows(u, &name, None, now))
        })
    }

    /// The tenants named in a declaration (never a pattern) or with usage recorded
    /// since `since_ms` (default: 00:00 UTC today), sorted. While degraded with a store
    /// that does not answer (SPEC §10: served from memory), the tenants this engine
    /// knows: declared, or with windows in memory.
    pub fn tenants(&mut self, since_ms: Option<i64>) -> Result<Vec<String>> {
        let now = self.unit.clock.now_ms();
        let since = since_ms.unwrap_or(now - now.rem_euclid(DAY_MS));
        let mut names: BTreeSet<String> = BTreeSet::new();
        self.unit.run(Access::Read, |tx| {
            names.extend(tx.mirror().config.tenants.named().map(str::to_string));
            Ok(())
        })?;
        let rows = self
            .unit
            .store_read(|s| s.usage_events(&UsageFilter { since_ms: Some(since), ..UsageFilter::default() }));
        match rows {
            Ok(rows) => names.extend(rows.iter().flat_map(|r| r.tenants.iter().map(|t| t.to_string()))),
            Err(_) if self.unit.degraded() => self.unit.run(Access::Read, |tx| {
                names.extend(tx.mirror().tenants.names().map(|n| n.to_string()));
                Ok(())
            })?,
            Err(e) => return Err(e.into()),
        }
        Ok(names.into_iter().collect())
    }

    /// SPEC 23.4: one row per limit in force of each tenant with limits or usage today
    /// (or a live lease), with its exhaustion forecast over `lookback_ms`.
    pub fn tenant_snapshot(&mut self, lookback_ms: i64) -> Result<(i64, Vec<TenantWindow>)> {
        if lookback_ms <= 0 {
            return Err(Error::Invalid(format!("lookback_ms must be a positive int, got {lookback_ms}")));
        }
        let mut names: BTreeSet<String> = self.tenants(None)?.into_iter().collect();
        self.unit.run(Access::Read, |tx| {
            let (u, now, _) = tx.parts();
            names.extend(u.mirror.tenants.names().map(|n| n.to_string()));
            let mut rows = Vec::new();
            for n in &names {
                rows.extend(tenant_windows(u, &Arc::from(n.as_str()), Some(lookback_ms), now));
            }
            Ok((now, rows))
        })
    }
}

/// The windows of one tenant at `now`, made ready (counted from the store when one of
/// them was not kept), with forecasts when `lookback_ms` is given.
fn tenant_windows(
    u: &mut super::unit::Unit, name: &Arc<str>, lookback_ms: Option<i64>, now: i64,
) -> Vec<TenantWindow> {
    let list: tenants::TenantList = Arc::from(vec![name.clone()]);
    let width = lookback_ms.map(recent_width);
    let ready = |u: &mut super::unit::Unit| {
        let gates = u.mirror.prepare_tenants(&list, now);
        let complete = width.is_none_or(|w| u.mirror.tenant_keep(name, WindowSpec::Sliding(w)));
        (gates, complete)
    };
    let (mut gates, complete) = ready(u);
    if !complete || u.mirror.needs_reload {
        u.reload_windows(now);
        gates = ready(u).0;
    }
    let Some((_, set)) = gates.into_iter().next() else { return Vec::new() };
    let Some(t) = u.mirror.tenant_tally(name, now) else { return Vec::new() };
    let cal = t.win.calendar().clone();
    set.iter()
        .map(|d| {
            let l = &d.limit;
            let count = |w: WindowSpec| t.win.counts(w, now).unwrap_or_default().get(l.metric);
            let used = count(l.window);
            let in_flight = t.in_flight.get(l.metric);
            let exhausts_at_ms = match (lookback_ms, width, l.window) {
                (Some(lb), Some(w), WindowSpec::Calendar(p)) => exhaustion(
                    now,
                    l.limit,
                    used.saturating_add(in_flight),
                    count(WindowSpec::Sliding(w)),
                    lb,
                    Some(cal.next_period_start(p, now)),
                ),
                (Some(lb), Some(w), WindowSpec::Sliding(s)) if s >= MIN_FORECAST_WIDTH_MS => exhaustion(
                    now,
                    l.limit,
                    used.saturating_add(in_flight),
                    count(WindowSpec::Sliding(w)),
                    lb,
                    None,
                ),
                _ => None,
            };
            TenantWindow {
                tenant: name.to_string(),
                window: format!("{}/{}", l.metric.as_str(), l.per),
                used,
                limit: l.limit,
                in_flight,
                exhausts_at_ms,
            }
        })
        .collect()
}
