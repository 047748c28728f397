//! The engine's semantics in Rust, over the memory twin of the stores and a manual
//! clock: the gates, degraded mode, grouped writes (hold and group commit), the
//! optimistic attempts of the hot path, and `lease_any`. No file, no server, no Python.
#![allow(clippy::unwrap_used)]

use quotaengine::core::clock::ManualClock;
use quotaengine::core::engine::{Engine, Settings, TokenUse};
use quotaengine::core::error::{Error, StoreError};
use quotaengine::core::limits::LimitSet;
use quotaengine::core::state::Estimate;
use quotaengine::core::store::memory::{Control, MemoryStore};
use quotaengine::core::types::{CooldownSource, Reason, Route, Strategy};
use std::sync::Arc;

const T0: i64 = 1_767_261_600_000; // 2026-01-01 10:00 UTC
const MINUTE: i64 = 60_000;

fn route() -> Route {
    Route::new("p", "m", 1).unwrap()
}

fn route_of(key_id: i64) -> Route {
    Route::new("p", "m", key_id).unwrap()
}

fn settings(flush_interval_ms: i64) -> Settings {
    Settings { flush_interval_ms, ..Settings::default() }
}

/// An engine on a fresh memory store, the store's control and the clock.
fn engine(flush_interval_ms: i64) -> (Engine, Control, Arc<ManualClock>) {
    let store = MemoryStore::new();
    let control = store.control();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::with_store(Box::new(store), clock.clone(), settings(flush_interval_ms)).unwrap();
    (e, control, clock)
}

/// Another engine on the same store (another process), on the same clock.
fn another(control: &Control, clock: &Arc<ManualClock>) -> Engine {
    Engine::with_store(Box::new(control.connect()), clock.clone(), settings(0)).unwrap()
}

/// Requests and tokens per minute (the classic four's first and third).
fn limits(per_minute: Option<i64>, tokens_per_minute: Option<i64>) -> LimitSet {
    LimitSet::from_classic([per_minute, None, tokens_per_minute, None])
}

fn refusal(err: Error) -> Reason {
    match err {
        Error::Refused(r) => r.reason,
        other => panic!("not a refusal: {other:?}"),
    }
}

// ---- gates -----------------------------------------------------------------------

#[test]
fn the_request_gate_refuses_at_the_limit_until_the_minute_has_passed() {
    let (mut e, _, clock) = engine(0);
    e.config().set_model_limits("p", "m", &limits(Some(2), None), None).unwrap();
    let first = e.lease(&route(), 10, None).unwrap();
    e.finish_lease_success(first, &route(), Some(10)).unwrap();
    e.lease(&route(), 10, None).unwrap();
    let err = e.lease(&route(), 10, None).unwrap_err();
    let Error::Refused(r) = err else { panic!("{err:?}") };
    assert_eq!(r.reason, Reason::declared("rpm"));
    assert_eq!(r.retry_at_ms, Some(T0 + MINUTE), "the first request leaves the window then");
    clock.advance(MINUTE);
    e.lease(&route(), 10, None).unwrap();
}

#[test]
fn the_token_gate_counts_live_estimates_and_frees_them_on_release() {
    let (mut e, _, _) = engine(0);
    e.config().set_model_limits("p", "m", &limits(None, Some(1_000)), None).unwrap();
    let big = e.lease(&route(), 600, None).unwrap();
    assert_eq!(refusal(e.lease(&route(), 500, None).unwrap_err()), Reason::declared("tpm"));
    assert_eq!(e.usage().report(&route(), None).unwrap().in_flight, 1);
    e.release_lease(big).unwrap();
    e.lease(&route(), 500, None).unwrap();
    // Recorded tokens count like estimates did.
    e.usage().record_token_use(&route(), TokenUse::total(400)).unwrap();
    assert_eq!(refusal(e.lease(&route(), 200, None).unwrap_err()), Reason::declared("tpm"));
}

#[test]
fn a_cooldown_benches_the_route_until_it_expires() {
    let (mut e, _, clock) = engine(0);
    e.failures().set_cooldown(&route(), 30_000, CooldownSource::Authoritative).unwrap();
    assert_eq!(e.check(&route(), 0, None).unwrap().reason, Some(Reason::Cooldown));
    assert_eq!(refusal(e.lease(&route(), 1, None).unwrap_err()), Reason::Cooldown);
    // Another key of the model is not benched.
    e.lease(&route_of(2), 1, None).unwrap();
    clock.advance(30_000);
    assert!(e.check(&route(), 0, None).unwrap().allowed);
}

#[test]
fn a_key_concurrency_cap_counts_live_leases_across_engines() {
    let (mut a, control, clock) = engine(0);
    let mut b = another(&control, &clock);
    a.config().set_key_concurrency_cap("p", 1, Some(1)).unwrap();
    let id = a.lease(&route(), 1, None).unwrap();
    // The other engine's lease on another model of the key is refused too.
    let other_model = Route::new("p", "n", 1).unwrap();
    assert_eq!(refusal(b.lease(&other_model, 1, None).unwrap_err()), Reason::KeyConcurrency);
    a.release_lease(id).unwrap();
    b.lease(&other_model, 1, None).unwrap();
}

// ---- degraded mode ------------------------------------------------------------------

#[test]
fn an_outage_is_served_from_memory_and_its_writes_land_when_the_store_answers() {
    let (mut a, control, clock) = engine(0);
    let mut b = another(&control, &clock);
    a.config().set_model_limits("p", "m", &limits(Some(3), None), None).unwrap();
    control.set_down(true);
    a.usage().record_request(&route()).unwrap();
    let id = a.lease(&route(), 5, None).unwrap();
    assert!(a.degraded());
    assert!(a.pending_writes() >= 2);
    // Decided from memory: the limit still holds.
    a.lease(&route(), 5, None).unwrap();
    assert_eq!(refusal(a.lease(&route(), 5, None).unwrap_err()), Reason::declared("rpm"));
    a.release_lease(id).unwrap();
    control.set_down(false);
    a.flush().unwrap();
    assert!(!a.degraded());
    assert_eq!(a.pending_writes(), 0);
    // The other engine counts what was buffered: one request and one live lease (the
    // lease taken and released while both waited never reached the store).
    let u = b.usage().report(&route(), None).unwrap();
    assert_eq!((u.window("rpm").used, u.in_flight), (1, 1));
    assert_eq!(control.leases(), 1);
}

#[test]
fn a_refused_commit_fails_its_call_and_is_not_an_outage() {
    let (mut e, control, _) = engine(0);
    control.reject_commits(1);
    let err = e.lease(&route(), 5, None).unwrap_err();
    assert!(matches!(err, Error::Store(StoreError::Rejected(_))), "{err:?}");
    assert!(!e.degraded());
    // Nothing of it stays, in the store or in memory.
    assert_eq!(control.leases(), 0);
    assert_eq!(e.usage().report(&route(), None).unwrap().in_flight, 0);
    e.lease(&route(), 5, None).unwrap();
    assert_eq!(control.leases(), 1);
}

#[test]
fn a_commit_whose_reply_was_lost_counts_as_committed() {
    let (mut e, control, _) = engine(0);
    control.lose_replies(1);
    let id = e.lease(&route(), 5, None).unwrap();
    // The store applied it; the engine serves from memory until the store answers.
    assert_eq!(control.leases(), 1);
    assert!(e.degraded());
    e.finish_lease_success(id, &route(), Some(3)).unwrap();
    e.flush().unwrap();
    assert!(!e.degraded());
    assert_eq!(control.leases(), 0);
    assert_eq!(e.usage().report(&route(), None).unwrap().window("rpm").used, 1);
}

// ---- grouped writes: hold and group commit -----------------------------------------------

/// Commits it takes one engine alone on its store to run `n` lease + success pairs.
fn commits_for(flush_interval_ms: i64, n: i64) -> (u64, Control, Engine) {
    let (mut e, control, clock) = engine(flush_interval_ms);
    let before = control.commits();
    for _ in 0..n {
        clock.advance(10);
        let id = e.lease(&route(), 5, None).unwrap();
        e.finish_lease_success(id, &route(), Some(4)).unwrap();
    }
    (control.commits() - before, control, e)
}

#[test]
fn grouped_writes_wait_for_a_flush_and_take_fewer_commits() {
    let n = 40;
    let (plain, control, _) = commits_for(0, n);
    // Every lease and every success is its own commit.
    assert_eq!(plain, 2 * n as u64);
    assert_eq!(control.usage_rows(), 2 * n as usize);
    let (grouped, control, mut e) = commits_for(10, n);
    // Successes wait in the buffer (and, alone on the store, leases in the held
    // lock): at most one commit per lease, however the hold periods fall.
    assert!(grouped <= n as u64, "{grouped} commits for {n} pairs");
    assert!(e.pending_writes() > 0);
    assert!(control.usage_rows() < 2 * n as usize, "the last success waits");
    e.flush().unwrap();
    assert_eq!(e.pending_writes(), 0);
    assert_eq!(control.usage_rows(), 2 * n as usize);
    assert_eq!(control.leases(), 0);
}

#[test]
fn a_second_engine_on_the_store_ends_holding_the_lock_across_calls() {
    let (mut a, control, clock) = engine(10);
    let id = a.lease(&route(), 5, None).unwrap();
    a.finish_lease_success(id, &route(), Some(4)).unwrap();
    a.flush().unwrap();
    let mut b = another(&control, &clock);
    // With another writer open, each of `a`'s leases is committed at once (no lock
    // is kept from one call to the next), so `b` counts it without waiting.
    for n in 1..=3 {
        a.lease(&route(), 5, None).unwrap();
        assert_eq!(b.usage().report(&route(), None).unwrap().in_flight, n);
    }
}

#[test]
fn a_batch_of_several_callers_is_one_commit() {
    use quotaengine::core::engine::BatchOp;
    let (mut e, control, _) = engine(0);
    e.config().set_model_limits("p", "m", &limits(Some(3), None), None).unwrap();
    let before = control.commits();
    let lease = |k| BatchOp::Lease {
        route: route_of(k),
        est: Estimate::tokens(5),
        limits: None,
        check: true,
        priority: 0,
        tenants: quotaengine::core::tenants::none(),
    };
    let outs = e.run_batch(vec![lease(1), lease(1), lease(1), lease(1)]);
    assert_eq!(control.commits() - before, 1);
    let results: Vec<Result<i64, Error>> = outs.into_iter().map(|o| o.lease_id()).collect();
    // Each sees the ones before it: the fourth is refused.
    assert!(results[..3].iter().all(Result::is_ok));
    assert_eq!(refusal(results[3].clone().unwrap_err()), Reason::declared("rpm"));
    assert_eq!(control.leases(), 3);
}

// ---- optimistic attempts ----------------------------------------------------------------

#[test]
fn a_decision_another_engine_made_stale_is_taken_back_and_made_again() {
    let (mut a, control, clock) = engine(0);
    let mut b = another(&control, &clock);
    a.config().set_model_limits("p", "m", &limits(Some(1), None), None).unwrap();
    b.check(&route(), 0, None).unwrap();
    // `a` takes the only slot; `b` decides on what it knew (room for one), and its
    // commit conflicts: taken back, decided again on what changed, refused.
    a.lease(&route(), 5, None).unwrap();
    assert_eq!(refusal(b.lease(&route(), 5, None).unwrap_err()), Reason::declared("rpm"));
    assert_eq!(control.leases(), 1);
    assert_eq!(b.usage().report(&route(), None).unwrap().in_flight, 1);
}

#[test]
fn a_refusal_on_stale_data_is_confirmed_on_fresh_data() {
    let (mut a, control, clock) = engine(0);
    let mut b = another(&control, &clock);
    a.config().set_model_limits("p", "m", &limits(None, Some(1_000)), None).unwrap();
    let id = a.lease(&route(), 800, None).unwrap();
    assert_eq!(b.usage().report(&route(), None).unwrap().in_flight, 1);
    // `a` frees the room; `b`'s first decision, on what it knew, refuses, and is
    // confirmed on a fresh read, which admits.
    a.release_lease(id).unwrap();
    b.lease(&route(), 800, None).unwrap();
    assert_eq!(control.leases(), 1);
}

#[test]
fn engines_racing_on_threads_admit_exactly_the_limit() {
    let (mut a, control, clock) = engine(0);
    a.config().set_model_limits("p", "m", &limits(Some(25), None), None).unwrap();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (control, clock) = (control.clone(), clock.clone());
            std::thread::spawn(move || {
                let mut e = another(&control, &clock);
                let mut admitted = 0;
                while e.lease(&route(), 1, None).is_ok() {
                    admitted += 1;
                }
                admitted
            })
        })
        .collect();
    let admitted: i64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(admitted, 25);
    assert_eq!(control.leases(), 25);
}

// ---- lease_any -----------------------------------------------------------------------

fn routes() -> Vec<Route> {
    vec![route_of(1), route_of(2), route_of(3)]
}

#[test]
fn lease_any_in_order_takes_the_first_candidate_that_passes() {
    let (mut e, _, _) = engine(0);
    e.failures().set_cooldown(&route_of(1), 60_000, CooldownSource::Heuristic).unwrap();
    let (_, i) = e.lease_any(&routes(), Estimate::tokens(5), Strategy::Order).unwrap();
    assert_eq!(i, 1);
    let (_, i) = e.lease_any(&routes(), Estimate::tokens(5), Strategy::Order).unwrap();
    assert_eq!(i, 1, "order does not rotate");
}

#[test]
fn lease_any_spread_takes_the_least_recently_leased() {
    let (mut e, _, _) = engine(0);
    let picks: Vec<usize> =
        (0..6).map(|_| e.lease_any(&routes(), Estimate::tokens(5), Strategy::Spread).unwrap().1).collect();
    assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
}

#[test]
fn lease_any_headroom_takes_the_candidate_with_the_most_room() {
    let (mut e, _, _) = engine(0);
    e.config().set_model_limits("p", "m", &limits(None, Some(1_000)), None).unwrap();
    e.lease(&route_of(1), 700, None).unwrap();
    e.lease(&route_of(3), 200, None).unwrap();
    let (_, i) = e.lease_any(&routes(), Estimate::tokens(100), Strategy::Headroom).unwrap();
    assert_eq!(i, 1);
}

#[test]
fn lease_any_refused_everywhere_carries_every_candidates_refusal() {
    let (mut e, control, _) = engine(0);
    e.config().set_model_limits("p", "m", &limits(Some(1), None), None).unwrap();
    e.lease(&route_of(1), 5, None).unwrap();
    e.failures().set_cooldown(&route_of(2), 10_000, CooldownSource::Authoritative).unwrap();
    e.lease(&route_of(3), 5, None).unwrap();
    let err = e.lease_any(&routes(), Estimate::tokens(5), Strategy::Headroom).unwrap_err();
    let Error::Refused(r) = err else { panic!("{err:?}") };
    let reasons: Vec<(i64, Reason)> = r.candidates.iter().map(|c| (c.key_id, c.reason.clone())).collect();
    assert_eq!(
        reasons,
        vec![(1, Reason::declared("rpm")), (2, Reason::Cooldown), (3, Reason::declared("rpm"))]
    );
    // The earliest known retry heads the refusal.
    assert_eq!(r.retry_at_ms, Some(T0 + 10_000));
    assert_eq!(control.leases(), 2);
}

#[test]
fn lease_any_across_engines_does_not_take_a_candidate_another_engine_filled() {
    let (mut a, control, clock) = engine(0);
    let mut b = another(&control, &clock);
    a.config().set_model_limits("p", "m", &limits(Some(1), None), None).unwrap();
    b.check(&route_of(1), 0, None).unwrap();
    a.lease(&route_of(1), 5, None).unwrap();
    // `b` knew key 1 empty; its pick conflicts and is made again on what changed.
    let (_, i) = b.lease_any(&routes(), Estimate::tokens(5), Strategy::Order).unwrap();
    assert_eq!(i, 1);
    assert_eq!(control.leases(), 2);
}

// ---- prices (SPEC 23.1) ------------------------------------------------------------

#[test]
fn model_prices_are_shared_replaced_and_forgotten() {
    use quotaengine::core::money::Prices;
    let (mut a, control, clock) = engine(0);
    let mut b = another(&control, &clock);
    let p = Prices::from_dollars(0.15, 0.6, None, 0.0).unwrap();
    assert_eq!(b.config().model_prices("p", "m").unwrap(), None);
    a.config().set_model_prices("p", "m", Some(p)).unwrap();
    assert_eq!(a.config().model_prices("p", "m").unwrap(), Some(p));
    // The other engine sees them at its next call; other models stay unpriced.
    assert_eq!(b.config().model_prices("p", "m").unwrap(), Some(p));
    assert_eq!(b.config().model_prices("p", "n").unwrap(), None);
    assert_eq!(b.config().model_prices("q", "m").unwrap(), None);
    // Replaced by either engine, forgotten with None.
    let dearer = Prices::from_dollars(3.0, 15.0, Some(0.3), 0.001).unwrap();
    b.config().set_model_prices("p", "m", Some(dearer)).unwrap();
    assert_eq!(a.config().model_prices("p", "m").unwrap(), Some(dearer));
    a.config().set_model_prices("p", "m", None).unwrap();
    assert_eq!(b.config().model_prices("p", "m").unwrap(), None);
    // Names are checked as for set_model_limits: nothing is written.
    let before = control.commits();
    for (platform, model_id) in [("", "m"), ("p", "")] {
        let err = a.config().set_model_prices(platform, model_id, Some(p)).unwrap_err();
        assert!(matches!(err, Error::Invalid(_)), "{err:?}");
    }
    assert_eq!(control.commits(), before);
    assert_eq!(b.config().model_prices("p", "m").unwrap(), None);
}

#[test]
fn model_prices_set_during_an_outage_hold_and_land_when_the_store_answers() {
    use quotaengine::core::money::Prices;
    let (mut a, control, clock) = engine(0);
    let mut b = another(&control, &clock);
    let p = Prices::from_dollars(1.25, 10.0, Some(0.125), 0.0).unwrap();
    control.set_down(true);
    a.config().set_model_prices("p", "m", Some(p)).unwrap();
    assert!(a.degraded());
    assert_eq!(a.config().model_prices("p", "m").unwrap(), Some(p));
    control.set_down(false);
    // Another engine's change to another table while ours waits does not undo ours.
    b.config().set_model_limits("p", "m", &limits(Some(3), None), None).unwrap();
    assert_eq!(a.config().model_prices("p", "m").unwrap(), Some(p));
    a.flush().unwrap();
    assert!(!a.degraded());
    assert_eq!(b.config().model_prices("p", "m").unwrap(), Some(p));
}

// ---- retention and the clock (SPEC 24.3) -----------------------------------------

/// The times (seconds from T0) of the usage rows in the store, in order.
fn stored_seconds(e: &mut Engine) -> Vec<i64> {
    let filter = quotaengine::core::store::UsageFilter::default();
    let mut t: Vec<i64> =
        e.observed().usage_events(&filter).unwrap().iter().map(|u| (u.created_at_ms - T0) / 1_000).collect();
    t.sort_unstable();
    t
}

#[test]
fn the_sweep_runs_again_at_the_first_write_after_every_step_back_of_the_clock() {
    // SPEC 24.3 on the memory twin: a row stamped before `now - retention_ms` that was
    // written after the clock stepped back (here by an engine whose clock is behind) is
    // gone after the next writing call that follows a step back; otherwise the sweep
    // runs at most once a minute, counted from the last sweep by the clock as it now reads.
    let hour = 60 * MINUTE;
    let store = MemoryStore::new();
    let control = store.control();
    let (ca, cb) = (Arc::new(ManualClock::new(T0)), Arc::new(ManualClock::new(T0 - 3 * hour)));
    let retention = Settings { retention_ms: hour, ..Settings::default() };
    let mut a = Engine::with_store(Box::new(store), ca.clone(), retention.clone()).unwrap();
    let mut b = Engine::with_store(Box::new(control.connect()), cb.clone(), retention).unwrap();
    a.usage().record_request(&route()).unwrap(); // 10:00, a sweep
    b.usage().record_request(&route()).unwrap(); // 07:00, b's own sweep keeps it
    ca.advance(40_000);
    a.usage().record_request(&route()).unwrap(); // 40 s after a's last sweep: none
    assert_eq!(stored_seconds(&mut a), vec![-3 * 3_600, 0, 40]);
    ca.advance(-5_000); // a's clock steps back 5 s: its next write sweeps
    a.usage().record_request(&route()).unwrap();
    assert_eq!(stored_seconds(&mut a), vec![0, 35, 40]);
    // Twice more: after the step back a's own writes go on once a minute from that sweep.
    cb.set(T0 - 2 * hour);
    b.usage().record_request(&route()).unwrap(); // 08:00 (b's clock moved on: no step back)
    ca.advance(50_000); // 10:01:25, 50 s after the sweep at 10:00:35
    a.usage().record_request(&route()).unwrap();
    assert_eq!(stored_seconds(&mut a), vec![-2 * 3_600, 0, 35, 40, 85]);
    ca.advance(10_000); // a minute after it: the 08:00 row goes
    a.usage().record_request(&route()).unwrap();
    assert_eq!(stored_seconds(&mut a), vec![0, 35, 40, 85, 95]);
}
