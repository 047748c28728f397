//! The engine: admission, accounting and cooldown state over a [`Store`].
//!
//! Every call runs as one *section*: take the store's lock (writes) or notice that
//! nothing changed (reads), read the clock, pull what other processes changed into
//! the in-memory [`Mirror`], decide from the mirror, then write and commit. The mirror
//! is updated per event, so no call scans history. When the store fails, the engine
//! keeps deciding from the mirror and buffers its writes (degraded mode, SPEC §10).
//!
//! Where things live: this file holds the engine's state, its settings and the use
//! cases of admission (the gates, leases); `configuration.rs` the keys, models,
//! calendars and priority reserves ([`Configuration`], `engine.config()`); `usage.rs`
//! recorded requests and tokens and the usage report ([`Usage`], `engine.usage()`);
//! `unit/` the unit of work (`Unit`: the store and the mirror; one door,
//! `Unit::run`; sections, sync, commit, hold, degraded buffering); `batch.rs`
//! the hot path's batches (group commit, optimistic attempts, `lease_any`);
//! `failures.rs` the failure policy and learning, aggregators' upstream benches and
//! learned pool caps included (`Failures`, reached as `engine.failures()`);
//! `observed.rs` the `Observed` desk (`engine.observed()`: provider pools, observed
//! quota, the guardrail, the snapshot, forecasts) and the state only it keeps. The
//! counters are in `windows.rs` and `state/`, what a decision reads besides them (the
//! caps in force, the concurrency cap, the reserve) is prepared by the mirror
//! (`state/prepare.rs`, `Mirror::prepare`), the desks' other questions are asked of
//! its reader in their own words, never by walking its tables (`state/reader/`,
//! `Mirror::reader`: a route's bench, the cooldowns held, what the ladders count, the
//! figures the reports read), what a limit is in `limits.rs`, the gates
//! and the choice among candidates in `admission.rs` (a pure function of one view the
//! mirror builds).
mod batch;
mod configuration;
mod failures;
mod observed;
mod tenancy;
mod unit;
mod usage;

use crate::core::tenants::{self, TenantList};
pub use batch::{BatchOp, BatchOut};
pub use configuration::Configuration;
pub use failures::{FailureInput, FailureOutcome, Failures, RetryAfter};
pub use observed::{source_confidence, Observed, QuotaObservation, SnapshotRow, DEFAULT_LOOKBACK_MS};
pub use tenancy::TenantWindow;
pub use unit::LogRecord;
pub use usage::{TokenUse, Usage, UsageReport, WindowReport};

use crate::core::admission::{self, Can, Verdict};
use crate::core::clock::{Clock, DAY_MS};
use crate::core::env::Env;
use crate::core::error::{Error, Result};
use crate::core::limits::{LimitSet, Scope};
use crate::core::state::{Estimate, FastMap, Mirror, RouteId};
pub use crate::core::store::StoreSpec;
use crate::core::store::{LeaseRow, Store, Write};
use crate::core::types::{check_name, check_non_negative, Admission, Exclusion, Route, Strategy};
use std::sync::Arc;
use std::time::Duration;
use unit::{Access, HOLD_MAX_MS};

/// Construction settings (SPEC §3). The environment is a copy read once.
#[derive(Debug, Clone)]
pub struct Settings {
    pub retention_ms: i64,
    pub lease_max_age_ms: i64,
    pub window_usage_ttl_ms: i64,
    pub busy_timeout_ms: i64,
    pub flush_interval_ms: i64,
    pub readonly: bool,
    pub env: Env,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            retention_ms: DAY_MS,
            lease_max_age_ms: 120_000,
            window_usage_ttl_ms: 5_000,
            busy_timeout_ms: 5_000,
            flush_interval_ms: 0,
            readonly: false,
            env: Env::default(),
        }
    }
}

/// SQLite's longest busy timeout (a C int of milliseconds): a longer one is clamped
/// to it (SPEC 18.1).
pub const MAX_BUSY_TIMEOUT_MS: i64 = i32::MAX as i64;

impl Settings {
    /// The settings as the engine uses them: `busy_timeout_ms` clamped to
    /// [`MAX_BUSY_TIMEOUT_MS`].
    pub fn clamped(mut self) -> Settings {
        self.busy_timeout_ms = self.busy_timeout_ms.min(MAX_BUSY_TIMEOUT_MS);
        self
    }

    fn validate(&self) -> Result<()> {
        check_non_negative("retention_ms", self.retention_ms)?;
        check_non_negative("lease_max_age_ms", self.lease_max_age_ms)?;
        check_non_negative("window_usage_ttl_ms", self.window_usage_ttl_ms)?;
        check_non_negative("busy_timeout_ms", self.busy_timeout_ms)?;
        check_non_negative("flush_interval_ms", self.flush_interval_ms)?;
        Ok(())
    }
}

pub struct Engine {
    /// The store and everything about talking to it (the unit of work's state).
    unit: unit::Unit,
    lease_ids: LeaseIds,
    /// What only the observed desk keeps (the guardrail snapshot, the headroom cache).
    observed: observed::ObservedState,
    /// When this engine last leased each route, as a count of its leases (SPEC 17.1's
    /// `spread`).
    leased_at: FastMap<RouteId, u64>,
    leases_taken: u64,
    /// What the current batch changed in `leased_at` (route, the stamp before), to take
    /// back with its leases when their commit conflicts.
    leased_undo: Vec<(RouteId, Option<u64>)>,
}

impl Engine {
    /// Opens the store and loads today's state.
    pub fn open(spec: &StoreSpec, clock: Arc<dyn Clock>, settings: Settings) -> Result<Engine> {
        let settings = settings.clamped();
        settings.validate()?;
        spec.check()?;
        let store = spec.open(settings.readonly, settings.busy_timeout_ms)?;
        Self::with_store(store, clock, settings)
    }

    /// Builds an engine over any store.
    pub fn with_store(store: Box<dyn Store>, clock: Arc<dyn Clock>, settings: Settings) -> Result<Engine> {
        let settings = settings.clamped();
        settings.validate()?;
        let mirror = Mirror::with_env(settings.env.clone());
        let mut engine = Engine {
            unit: unit::Unit::new(store, clock, settings, mirror),
            lease_ids: LeaseIds::new(),
            observed: observed::ObservedState::default(),
            leased_at: FastMap::default(),
            leases_taken: 0,
            leased_undo: Vec::new(),
        };
        if engine.unit.settings.flush_interval_ms > 0 && !engine.unit.settings.readonly {
            // Half the interval: a held lock ends at most one flusher tick after its
            // period, so nothing waits longer than `flush_interval_ms`.
            let ms = (engine.unit.settings.flush_interval_ms / 2).clamp(1, HOLD_MAX_MS);
            engine.unit.set_hold_for(Duration::from_millis(ms as u64));
        }
        // Load now, so that a broken database is reported by the constructor.
        engine.unit.run(Access::Read, |_| Ok(()))?;
        // What is wrong in the environment is said once, here, and lands in
        // `server_logs` for every other reader of the store (SPEC §12).
        for w in engine.unit.settings.env.warnings() {
            engine.unit.note(log::Level::Warn, Some("config"), w);
        }
        engine.flush()?;
        Ok(engine)
    }

    pub fn now_ms(&self) -> i64 {
        self.unit.clock.now_ms()
    }

    /// True while the store is failing and the engine serves from memory.
    pub fn degraded(&self) -> bool {
        self.unit.degraded()
    }

    /// Log records produced since the last call (emit them outside any lock).
    pub fn take_logs(&mut self) -> Vec<LogRecord> {
        std::mem::take(&mut self.unit.logs)
    }

    /// After a caught panic: abandon any open store section and reload from the store,
    /// so a half-applied change cannot linger in memory.
    pub fn recover_after_panic(&mut self) {
        self.unit.recover_after_panic();
    }

    /// Deliberately panics inside the engine (tests prove a panic becomes an exception
    /// and that `recover_after_panic` follows it).
    pub fn debug_panic(&mut self) -> Result<()> {
        panic!("debug_panic: a deliberate panic inside the engine")
    }

    /// Before `fork()`: ends a held write lock and writes what is buffered, so that no
    /// transaction is open across the fork and the child inherits nothing to write.
    pub fn prepare_fork(&mut self) {
        let _ = self.flush();
    }

    /// In the child just after `fork()`: true when this engine stays usable (its store
    /// is the child's own copy, an in-memory database); otherwise its store has let go
    /// of what the parent still uses, nothing of it is written, and the child opens
    /// the engine anew.
    pub fn after_fork(&mut self) -> bool {
        // The leases taken before the fork are the parent's to end.
        self.unit.drop_all_own().for_each(drop);
        self.unit.after_fork()
    }

    /// Number of writes waiting for the store.
    pub fn pending_writes(&self) -> usize {
        self.unit.pending_len()
    }

    /// SPEC 27.1: the counters this engine keeps under its lock, and its buffered
    /// writes (the handle adds its refusals and waits).
    pub fn stats(&self) -> crate::core::stats::Stats {
        let mut s = crate::core::stats::Stats::default();
        let routes = &self.unit.mirror.routes;
        self.unit.counters.read(&mut s, |rid| {
            let r = &routes[rid as usize];
            (&*r.platform, &*r.model_id)
        });
        s.buffered_writes = self.pending_writes();
        s
    }

    // ---- gates -------------------------------------------------------------------

    /// SPEC §4's `check()`: every gate in order, admitting without taking a lease.
    pub fn check(&mut self, route: &Route, est: i64, limits: Option<LimitSet>) -> Result<Admission> {
        check_non_negative("estimated_tokens", est)?;
        self.unit.run(Access::Read, |tx| {
            let (u, now, _) = tx.parts();
            Ok(admit(u, route, Estimate::tokens(est), limits, 0, &tenants::none(), now)?.1.admission())
        })
    }

    /// One of SPEC §4's `can_*` questions (and `is_on_cooldown`'s gate); true when its
    /// gates admit. Provider gates need no model (`route.model_id` may be empty for
    /// them); the token cap uses it to bill the estimate.
    pub fn check_gate(
        &mut self, can: Can, route: &Route, est: i64, limits: Option<LimitSet>,
    ) -> Result<bool> {
        check_non_negative("estimated_tokens", est)?;
        self.unit.run(Access::Read, |tx| {
            let (u, now, _) = tx.parts();
            // `check()` and the `can_*` gates answer for priority 0 (SPEC 22.1).
            let p = u.prepare(route, limits, 0, now);
            let est = priced(&u.mirror, route, Estimate::tokens(est))?;
            let v = u.mirror.prepared_view(&p, est, now);
            Ok(admission::admit_through(&v, admission::gates(&p.ctx).filter(|g| can.asks(g)))
                .refused
                .is_none())
        })
    }

    // ---- leases ------------------------------------------------------------------

    fn single(&mut self, op: BatchOp) -> BatchOut {
        self.run_batch(vec![op])
            .pop()
            .unwrap_or_else(|| BatchOut::failed(Error::Internal("empty batch".into())))
    }

    /// Takes a lease without checking any gate.
    pub fn acquire_lease(&mut self, route: &Route, est: i64) -> Result<i64> {
        self.single(BatchOp::Lease {
            route: route.clone(),
            est: Estimate::tokens(est),
            limits: None,
            check: false,
            priority: 0,
            tenants: tenants::none(),
        })
        .lease_id()
    }

    /// SPEC §5: every gate of `check()` and the lease, as one atomic step across
    /// threads and processes (the store's write lock is held throughout).
    pub fn lease(&mut self, route: &Route, est: i64, limits: Option<LimitSet>) -> Result<i64> {
        self.lease_estimate(route, Estimate::tokens(est), limits)
    }

    /// `lease()` with an estimate that says how much of it is output (SPEC §14.4).
    pub fn lease_estimate(&mut self, route: &Route, est: Estimate, limits: Option<LimitSet>) -> Result<i64> {
        self.lease_for(route, est, limits, &tenants::none())
    }

    /// `lease()` taken for `tenants` (SPEC 23.2): their gates too, in the one atomic step.
    pub fn lease_for(
        &mut self, route: &Route, est: Estimate, limits: Option<LimitSet>, tenants: &TenantList,
    ) -> Result<i64> {
        let tenants = tenants.clone();
        self.single(BatchOp::Lease { route: route.clone(), est, limits, check: true, priority: 0, tenants })
            .lease_id()
    }

    /// SPEC 17.1: one of `routes` chosen by `strategy` and leased, in one atomic step;
    /// returns the lease and the index of its route in `routes`.
    pub fn lease_any(&mut self, routes: &[Route], est: Estimate, strategy: Strategy) -> Result<(i64, usize)> {
        self.lease_any_for(routes, est, strategy, &tenants::none())
    }

    /// `lease_any()` taken for `tenants` (SPEC 23.2): each candidate with their gates.
    pub fn lease_any_for(
        &mut self, routes: &[Route], est: Estimate, strategy: Strategy, tenants: &TenantList,
    ) -> Result<(i64, usize)> {
        let (routes, tenants) = (routes.to_vec(), tenants.clone());
        let exclude = Vec::new();
        self.single(BatchOp::LeaseAny { routes, est, strategy, priority: 0, tenants, exclude }).chosen()
    }

    /// `lease_any()` for a request that already skipped `exclude` (SPEC 24.7): the
    /// candidates they cover are refused ("excluded") without running their gates.
    pub fn lease_any_excluding(
        &mut self, routes: &[Route], est: Estimate, strategy: Strategy, exclude: &[Exclusion],
    ) -> Result<(i64, usize)> {
        let (routes, exclude) = (routes.to_vec(), exclude.to_vec());
        let tenants = tenants::none();
        self.single(BatchOp::LeaseAny { routes, est, strategy, priority: 0, tenants, exclude }).chosen()
    }

    /// Idempotent.
    pub fn release_lease(&mut self, lease_id: i64) -> Result<()> {
        self.single(BatchOp::Release(lease_id)).done()
    }

    /// [`Engine::renew_leases`] at a call: nothing to do (the common case) decided
    /// inline, without reading the clock.
    #[inline]
    pub fn renew_due_leases(&mut self) -> Result<()> {
        if self.unit.own_leases.is_empty() {
            return Ok(());
        }
        self.renew_leases(false)
    }

    /// SPEC 24.1: renews this engine's live leases (those of its `Lease` objects): every
    /// one when `all` (the background thread, at least every `lease_max_age_ms / 4` of
    /// real time), else only once the oldest is half its max age old by the engine's
    /// clock (at a call). One write for them all; a lease past its max age counts
    /// again from now.
    pub fn renew_leases(&mut self, all: bool) -> Result<()> {
        // Degraded, nothing is renewed (SPEC 24.1: a holder degraded for longer than
        // the max age lets its leases expire); a buffered renewal could also outlive the
        // end of its lease in the buffer.
        if self.unit.own_leases.is_empty() || self.unit.readonly() || self.unit.degraded() {
            return Ok(());
        }
        let now = self.unit.clock.now_ms();
        if !all && now < self.unit.renew_at {
            return Ok(());
        }
        let max_age = self.unit.settings.lease_max_age_ms;
        let expires = now.saturating_add(max_age);
        let mut rows: Vec<LeaseRow> =
            self.unit.own_leases.values().map(|l| LeaseRow { expires_at_ms: expires, ..l.clone() }).collect();
        rows.sort_unstable_by_key(|l| l.id);
        let w = Write::RenewLeases(rows);
        self.unit.run(unit::Access::Append, |tx| {
            tx.push(w);
            Ok(())
        })?;
        for l in self.unit.own_leases.values_mut() {
            l.expires_at_ms = expires;
        }
        self.unit.renew_at = expires.saturating_sub(max_age / 2);
        Ok(())
    }

    /// SPEC 18.5: a live lease whose `Lease` object went away unended is left to count
    /// until `lease_max_age_ms` (its call may still run); `close()` does not end it.
    pub fn forget_lease(&mut self, lease_id: i64) {
        self.unit.drop_own(lease_id);
    }

    /// SPEC 18.5, at `close()`: every live lease of this engine ends as leaving its
    /// `with` block without an outcome does (its estimate recorded, its slot freed).
    pub fn end_own_leases(&mut self) -> Result<()> {
        let mut rows: Vec<LeaseRow> = self.unit.drop_all_own().collect();
        rows.sort_unstable_by_key(|l| l.id);
        let ops: Vec<BatchOp> = rows
            .into_iter()
            .map(|l| {
                // SPEC 23.1: the estimate with its split, so it costs its reservation.
                let est = Estimate { tokens: l.tokens, output: l.output_tokens, cost: l.cost };
                let route = Route {
                    platform: l.platform.to_string(),
                    model_id: l.model_id.to_string(),
                    key_id: l.key_id,
                };
                BatchOp::Success {
                    lease_id: l.id,
                    route,
                    tokens: Some(TokenUse::estimate(est)),
                    tenants: l.tenants,
                }
            })
            .collect();
        if ops.is_empty() {
            return Ok(());
        }
        self.run_batch(ops).into_iter().try_for_each(BatchOut::done)
    }

    /// A lease's success: its request (and tokens, when given) recorded and the lease
    /// released, in one commit.
    pub fn finish_lease_success(&mut self, lease_id: i64, route: &Route, tokens: Option<i64>) -> Result<()> {
        let tokens = tokens.map(TokenUse::total);
        let tenants = tenants::none();
        self.single(BatchOp::Success { lease_id, route: route.clone(), tokens, tenants }).done()
    }
}

/// Every gate on the route's view at `now` for `est` priced at the route's prices: the
/// route it decided on, the verdict, and the estimate as priced.
fn admit(
    unit: &mut unit::Unit, route: &Route, est: Estimate, limits: Option<LimitSet>, priority: i64,
    tenants: &TenantList, now: i64,
) -> Result<(RouteId, Verdict, Estimate)> {
    let est = priced(&unit.mirror, route, est)?;
    // SPEC 23.2: the tenants' limits, resolved and their windows kept before the route
    // is prepared (a window to count from the store reloads them with the route's).
    let mut gates = if tenants.is_empty() { Vec::new() } else { unit.mirror.prepare_tenants(tenants, now) };
    let p = unit.prepare(route, limits, priority, now);
    if !p.complete && !tenants.is_empty() {
        gates = unit.mirror.prepare_tenants(tenants, now);
    }
    let Some(rid) = p.route else {
        // A route names a model (`Route::new` checks it): the same error.
        return Err(check_name("model_id", &route.model_id)
            .err()
            .unwrap_or(Error::Internal("no route".into())));
    };
    let verdict = admission::admit(&unit.mirror.prepared_view(&p, est, now));
    if verdict.refused.is_some() || gates.is_empty() {
        return Ok((rid, verdict, est));
    }
    // Then each tenant in the order given; the headroom score is the route's alone.
    let m = &unit.mirror;
    let tallies = gates.iter().filter_map(|(name, set)| Some((name, set, m.tenant_tally(name, now)?)));
    match admission::admit_tenants(tallies, est, p.ctx.reserve, now) {
        Some(refused) => {
            Ok((rid, Verdict { refused: Some(refused), room: 0.0, scope: Some(Scope::Tenant) }, est))
        }
        None => Ok((rid, verdict, est)),
    }
}

/// SPEC 23.1: `est` with what its lease reserves at the route's prices, the worst case
/// of the estimate (0 unpriced).
fn priced(mirror: &Mirror, route: &Route, est: Estimate) -> Result<Estimate> {
    match mirror.reader().prices(&route.platform, &route.model_id) {
        Some(p) => Ok(Estimate { cost: p.reservation(est.tokens, est.output)?, ..est }),
        None => Ok(est),
    }
}

/// Lease ids: random 63-bit numbers, distinct across processes without coordination
/// (a random 40-bit prefix per engine and a 23-bit counter, re-randomised on wrap).
struct LeaseIds {
    prefix: i64,
    counter: i64,
}

impl LeaseIds {
    fn new() -> Self {
        Self { prefix: Self::prefix(), counter: 0 }
    }
    fn prefix() -> i64 {
        // 40 bits, never zero, so that ids are > 0.
        ((crate::core::random::random_u64() >> 24) as i64 & ((1 << 40) - 1)).max(1)
    }
    fn next(&mut self) -> i64 {
        self.counter += 1;
        if self.counter >= (1 << 23) {
            self.prefix = Self::prefix();
            self.counter = 1;
        }
        (self.prefix << 23) | self.counter
    }
}

/// SPEC 22.1: a priority is an int >= 0.
pub fn check_priority(priority: i64) -> Result<()> {
    if priority < 0 {
        return Err(Error::Invalid(format!("priority must be >= 0 (0 the most important), got {priority}")));
    }
    Ok(())
}
