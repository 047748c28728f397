//! The core without Python: two engines on one file, clock steps, degraded mode,
//! grouped writes, refusing foreign files.
#![allow(clippy::unwrap_used)]

use quotaengine::core::clock::ManualClock;
use quotaengine::core::engine::{Engine, FailureInput, Settings, StoreSpec};
use quotaengine::core::error::{Error, StoreError};
use quotaengine::core::limits::LimitSet;
use quotaengine::core::parse::FailureKind;
use quotaengine::core::types::{CooldownSource, Reason, Route};
use rusqlite::Connection;
use std::sync::Arc;

#[path = "support/quota_feed.rs"]
mod quota_feed;

const T0: i64 = 1_767_261_600_000; // 2026-01-01 10:00 UTC

fn open(path: &str, clock: &Arc<ManualClock>) -> Engine {
    Engine::open(&StoreSpec::Sqlite(path.into()), clock.clone(), Settings::default()).unwrap()
}

fn route() -> Route {
    Route::new("groq", "llama", 1).unwrap()
}

fn rpm(n: i64) -> Option<LimitSet> {
    Some(LimitSet::parse(&format!("requests/minute={n}")).unwrap())
}

/// Two engines on one file in `dir`, on one clock at `T0`.
fn two_engines(dir: &tempfile::TempDir) -> (Arc<ManualClock>, Engine, Engine) {
    let path = dir.path().join("q.db");
    let path = path.to_str().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let (a, b) = (open(path, &clock), open(path, &clock));
    (clock, a, b)
}

#[test]
fn two_engines_share_one_truth() {
    let dir = tempfile::tempdir().unwrap();
    let (_clock, mut a, mut b) = two_engines(&dir);
    a.lease(&route(), 10, rpm(2)).unwrap();
    b.lease(&route(), 10, rpm(2)).unwrap();
    // both leases are visible to both engines
    for e in [&mut a, &mut b] {
        let err = e.lease(&route(), 10, rpm(2)).unwrap_err();
        assert!(matches!(err, Error::Refused(ref r) if r.reason == Reason::declared("rpm")), "{err:?}");
    }
    a.usage().record_request(&Route::new("groq", "other", 1).unwrap()).unwrap();
    assert_eq!(
        b.usage().report(&Route::new("groq", "other", 1).unwrap(), None).unwrap().window("rpm").used,
        1
    );
    // a cooldown set by one engine benches the route in the other
    b.failures().set_cooldown(&route(), 30_000, CooldownSource::Heuristic).unwrap();
    assert_eq!(a.check(&route(), 0, None).unwrap().reason, Some(Reason::Cooldown));
}

/// SPEC 24.1: at a call, the engine's leases are renewed once the oldest live one is
/// half its max age old, and not before, whatever leases of it ended earlier.
#[test]
fn a_call_renews_once_the_oldest_live_lease_is_half_its_max_age_old() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, mut a, mut b) = two_engines(&dir);
    let max_age = Settings::default().lease_max_age_ms;
    let ended = a.lease(&route(), 10, None).unwrap();
    a.finish_lease_success(ended, &route(), Some(1)).unwrap();
    clock.advance(max_age);
    a.lease(&route(), 10, None).unwrap();
    // A quarter of its max age old: nothing is due, the call renews nothing.
    clock.advance(max_age / 4);
    a.renew_leases(false).unwrap();
    clock.advance(max_age * 3 / 4 + 1);
    assert_eq!(b.usage().report(&route(), None).unwrap().in_flight, 0);
    // Past its max age, the holder's next call renews it: it counts again.
    a.renew_leases(false).unwrap();
    assert_eq!(b.usage().report(&route(), None).unwrap().in_flight, 1);
}

#[test]
fn close_ends_the_engines_live_leases_for_every_other_engine() {
    let dir = tempfile::tempdir().unwrap();
    let (_clock, mut a, mut b) = two_engines(&dir);
    let ended = a.lease(&route(), 10, rpm(3)).unwrap();
    a.lease(&route(), 20, rpm(3)).unwrap();
    a.finish_lease_success(ended, &route(), Some(1)).unwrap();
    let dropped = a.lease(&route(), 40, rpm(3)).unwrap();
    a.forget_lease(dropped); // its Lease was garbage-collected: it keeps counting
    let raw = a.acquire_lease(&route(), 80).unwrap(); // the caller's to release
    assert_eq!(b.usage().report(&route(), None).unwrap().in_flight, 3);
    a.close().unwrap();
    let u = b.usage().report(&route(), None).unwrap();
    // The live one is recorded with its estimate (the ended one once, as it was).
    assert_eq!((u.in_flight, u.window("rpm").used, u.window("tpm").used), (2, 2, 21));
    b.release_lease(raw).unwrap();
    b.release_lease(dropped).unwrap();
    assert_eq!(b.usage().report(&route(), None).unwrap().in_flight, 0);
}

#[test]
fn rows_from_a_plain_connection_are_seen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let clock = Arc::new(ManualClock::new(T0));
    let mut e = open(path.to_str().unwrap(), &clock);
    assert_eq!(e.usage().report(&route(), None).unwrap().window("rpd").used, 0);
    let c = Connection::open(&path).unwrap();
    c.execute(
        "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms) \
         VALUES ('groq', 'llama', 1, 'request', 1, ?1)",
        [T0],
    )
    .unwrap();
    c.execute("INSERT INTO models (platform, model_id, rpm_limit) VALUES ('groq', 'llama', 1)", []).unwrap();
    assert_eq!(e.usage().report(&route(), None).unwrap().window("rpd").used, 1);
    assert_eq!(e.check(&route(), 0, None).unwrap().reason, Some(Reason::declared("rpm")));
}

#[test]
fn clock_stepping_back_reloads_the_minute_window() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let clock = Arc::new(ManualClock::new(T0));
    let mut e = open(path.to_str().unwrap(), &clock);
    e.usage().record_request(&route()).unwrap();
    clock.advance(61_000);
    assert_eq!(e.usage().report(&route(), None).unwrap().window("rpm").used, 0);
    clock.advance(-30_000); // back to T0 + 31 s: the event counts again
    assert_eq!(e.usage().report(&route(), None).unwrap().window("rpm").used, 1);
    clock.advance(-60_000); // before the event: it is "in the future" and still counts
    assert_eq!(e.usage().report(&route(), None).unwrap().window("rpm").used, 1);
}

#[test]
fn degraded_mode_buffers_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let clock = Arc::new(ManualClock::new(T0));
    let settings = Settings { busy_timeout_ms: 20, ..Settings::default() };
    let mut e =
        Engine::open(&StoreSpec::Sqlite(path.to_str().unwrap().into()), clock.clone(), settings).unwrap();
    let blocker = Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    for _ in 0..3 {
        e.lease(&route(), 0, rpm(3)).unwrap();
        e.usage().record_request(&Route::new("groq", "m2", 1).unwrap()).unwrap();
        clock.advance(10);
    }
    assert!(e.degraded());
    // limits still hold from memory
    assert!(matches!(e.lease(&route(), 0, rpm(3)), Err(Error::Refused(_))));
    let warnings = e.take_logs().into_iter().filter(|(l, _)| *l == log::Level::Warn).count();
    assert_eq!(warnings, 1);
    blocker.execute_batch("COMMIT").unwrap();
    e.usage().record_request(&Route::new("groq", "m2", 1).unwrap()).unwrap();
    assert!(!e.degraded());
    let rows: Vec<i64> = blocker
        .prepare("SELECT created_at_ms FROM rate_limit_usage WHERE model_id = 'm2' ORDER BY created_at_ms")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows, vec![T0, T0 + 10, T0 + 20, T0 + 30]);
}

#[test]
fn long_outage_memory_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let clock = Arc::new(ManualClock::new(T0));
    let settings = Settings { busy_timeout_ms: 0, ..Settings::default() };
    let mut e =
        Engine::open(&StoreSpec::Sqlite(path.to_str().unwrap().into()), clock.clone(), settings).unwrap();
    let blocker = Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    // 100k events over ~3 hours on one route
    for _ in 0..100_000 {
        e.usage().record_request(&route()).unwrap();
        clock.advance(100);
    }
    assert!(e.pending_writes() < 2 * 4096 + 200, "pending {}", e.pending_writes());
    assert_eq!(e.usage().report(&route(), None).unwrap().window("rpd").used, 100_000);
    blocker.execute_batch("COMMIT").unwrap();
    e.usage().record_request(&route()).unwrap();
    let n: i64 = blocker
        .query_row("SELECT SUM(MAX(tokens, 1)) FROM rate_limit_usage WHERE kind = 'request'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(n, 100_001);
    // and a fresh engine counts them all
    let mut fresh = open(path.to_str().unwrap(), &clock);
    assert_eq!(fresh.usage().report(&route(), None).unwrap().window("rpd").used, 100_001);
}

#[test]
fn grouped_writes_keep_admission_exact_across_engines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let clock = Arc::new(ManualClock::new(T0));
    let grouped = Settings { flush_interval_ms: 60_000, ..Settings::default() };
    let mut a =
        Engine::open(&StoreSpec::Sqlite(path.to_str().unwrap().into()), clock.clone(), grouped).unwrap();
    let mut b = open(path.to_str().unwrap(), &clock);
    let id = a.lease(&route(), 100, rpm(1)).unwrap();
    a.finish_lease_success(id, &route(), Some(80)).unwrap();
    assert!(a.pending_writes() > 0);
    // b still sees the finished lease until a flushes, so it cannot over-admit
    assert!(matches!(b.lease(&route(), 0, rpm(1)), Err(Error::Refused(_))));
    a.flush().unwrap();
    assert_eq!(b.usage().report(&route(), None).unwrap().window("rpm").used, 1);
    assert_eq!(b.usage().report(&route(), None).unwrap().window("tpm").used, 80);
    assert_eq!(b.usage().report(&route(), None).unwrap().in_flight, 0);
}

#[test]
fn foreign_and_newer_files_are_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let clock: Arc<ManualClock> = Arc::new(ManualClock::new(T0));
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, b"this is not a database, just text that is long enough to look like a header")
        .unwrap();
    let newer = dir.path().join("newer.db");
    {
        let c = Connection::open(&newer).unwrap();
        c.execute_batch("CREATE TABLE quotaengine_meta (name TEXT); PRAGMA user_version = 999;").unwrap();
    }
    let foreign = dir.path().join("foreign.db");
    {
        let c = Connection::open(&foreign).unwrap();
        c.execute_batch("CREATE TABLE rate_limit_usage (x INTEGER);").unwrap();
    }
    for p in [&text, &newer, &foreign] {
        let before = std::fs::read(p).unwrap();
        let r =
            Engine::open(&StoreSpec::Sqlite(p.to_str().unwrap().into()), clock.clone(), Settings::default());
        assert!(matches!(r, Err(Error::Store(StoreError::Incompatible(_)))), "{p:?}");
        assert_eq!(std::fs::read(p).unwrap(), before, "{p:?} changed");
    }
}

#[test]
fn ladder_persists_across_engines_and_success_clears_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let clock = Arc::new(ManualClock::new(T0));
    let mut a = open(path.to_str().unwrap(), &clock);
    a.config().set_model_limits("groq", "llama", &model("requests/day=1"), None).unwrap();
    a.usage().record_request(&route()).unwrap(); // the day is spent
    let fail = || FailureInput { status: Some(429), ..FailureInput::default() };
    let d1 = a.failures().record_failure(&route(), fail()).unwrap();
    assert_eq!(d1.kind, FailureKind::RateLimit);
    assert_eq!(d1.cooldown.unwrap().duration_ms, 120_000);
    clock.advance(130_000);
    let mut b = open(path.to_str().unwrap(), &clock); // another worker continues the ladder
    assert_eq!(b.failures().record_failure(&route(), fail()).unwrap().cooldown.unwrap().duration_ms, 600_000);
    b.usage().record_request(&route()).unwrap(); // a success clears it
    clock.advance(700_000);
    assert_eq!(a.failures().record_failure(&route(), fail()).unwrap().cooldown.unwrap().duration_ms, 120_000);
}

#[test]
fn every_commit_of_another_engine_is_seen_by_the_next_read() {
    // Reads skip the store while the WAL index header is unchanged: each engine's own
    // commits change it too, and must not hide the other's.
    let dir = tempfile::tempdir().unwrap();
    let (_clock, mut a, mut b) = two_engines(&dir);
    for i in 0..50 {
        a.usage().record_request(&route()).unwrap();
        assert_eq!(b.usage().report(&route(), None).unwrap().window("rpd").used, 2 * i + 1);
        assert_eq!(b.usage().report(&route(), None).unwrap().window("rpd").used, 2 * i + 1);
        b.usage().record_request(&route()).unwrap();
        assert_eq!(a.usage().report(&route(), None).unwrap().window("rpd").used, 2 * i + 2);
        assert_eq!(b.usage().report(&route(), None).unwrap().window("rpd").used, 2 * i + 2);
    }
}

#[test]
fn a_platforms_calendar_decides_its_day_windows_and_is_shared() {
    // 2026-01-01 07:30 UTC = 2025-12-31 23:30 in Los Angeles; the Pacific day starts at 08:00 UTC.
    let pst_midnight = 1_767_254_400_000;
    let dir = tempfile::tempdir().unwrap();
    let (clock, mut a, mut b) = two_engines(&dir);
    clock.set(pst_midnight - 30 * 60_000);
    let google = Route::new("google", "gemini", 1).unwrap();
    let rpd1 = Some(LimitSet::parse("requests/day=1").unwrap());
    assert_eq!(a.config().platform_calendar("google").unwrap(), "America/Los_Angeles");
    a.usage().record_request(&google).unwrap();
    let refused = b.check(&google, 0, rpd1.clone()).unwrap();
    assert_eq!((refused.reason, refused.retry_at_ms), (Some(Reason::declared("rpd")), Some(pst_midnight)));
    clock.set(pst_midnight);
    assert!(b.check(&google, 0, rpd1.clone()).unwrap().allowed);
    // A zone set by one engine holds in the other at its next call, and its day windows
    // count again: 08:00 UTC is already 09:00 in Warsaw, a day that began at 23:00 UTC.
    a.config().set_platform_calendar("google", Some("Europe/Warsaw")).unwrap();
    assert_eq!(b.config().platform_calendar("google").unwrap(), "Europe/Warsaw");
    assert!(!b.check(&google, 0, rpd1.clone()).unwrap().allowed);
    assert_eq!(b.config().next_day_start_ms("google", None).unwrap(), pst_midnight + 15 * 3_600_000);
    assert!(matches!(
        a.config().set_platform_calendar("google", Some("Nowhere/Land")),
        Err(Error::Invalid(_))
    ));
    assert_eq!(a.config().platform_calendar("google").unwrap(), "Europe/Warsaw");
}

#[test]
fn declared_windows_are_shared_and_count_the_stored_past() {
    use quotaengine::core::limits::Limit;
    let dir = tempfile::tempdir().unwrap();
    let (clock, mut a, mut b) = two_engines(&dir);
    // usage an hour ago, before anyone declared a window that long
    b.usage().record_request(&route()).unwrap();
    clock.advance(3_600_000);
    let five_hours = Limit::parse("requests", 2, "5h", "account").unwrap();
    let one_second = Limit::parse("requests", 1, "1s", "account").unwrap();
    a.config()
        .set_model_limits(
            "groq",
            "llama",
            &LimitSet::new(vec![five_hours.clone(), one_second]).unwrap(),
            None,
        )
        .unwrap();
    b.usage().record_request(&route()).unwrap();
    for e in [&mut a, &mut b] {
        let adm = e.check(&route(), 0, None).unwrap();
        // the request just made fills the 1 s window first
        assert_eq!(adm.reason.as_ref().map(|r| r.as_str()), Some("requests/1s"));
    }
    clock.advance(1_000);
    // the row of an hour ago and the one just made fill the 5 h window, in both engines
    for e in [&mut a, &mut b] {
        let adm = e.check(&route(), 0, None).unwrap();
        assert_eq!(adm.reason.as_ref().map(|r| r.as_str()), Some("requests/5h"));
        let report = e.usage().report(&route(), None).unwrap();
        assert_eq!(report.others().find(|(n, _)| *n == "requests/5h").map(|(_, w)| w.used), Some(2));
    }
    assert_eq!(b.config().model_limit_list("groq", "llama").unwrap()[1], five_hours);
}

fn model(limits: &str) -> LimitSet {
    LimitSet::parse(limits).unwrap()
}

#[test]
fn lease_any_picks_by_strategy_and_refuses_with_every_candidate() {
    use quotaengine::core::state::Estimate;
    use quotaengine::core::types::Strategy;
    let dir = tempfile::tempdir().unwrap();
    let (_clock, mut a, mut b) = two_engines(&dir);
    a.config().set_model_limits("tok", "m", &model("tokens/minute=10000"), None).unwrap();
    a.config().set_model_limits("req", "m", &model("requests/minute=2"), None).unwrap();
    let routes = [Route::new("tok", "m", 1).unwrap(), Route::new("req", "m", 2).unwrap()];
    // A big request hurts the request-metered route least, a small one the other.
    let (id, i) = b.lease_any(&routes, Estimate::tokens(8_000), Strategy::Headroom).unwrap();
    assert_eq!(i, 1);
    b.release_lease(id).unwrap();
    let (id, i) = b.lease_any(&routes, Estimate::tokens(100), Strategy::Headroom).unwrap();
    assert_eq!(i, 0);
    b.release_lease(id).unwrap();
    assert_eq!(b.lease_any(&routes, Estimate::tokens(0), Strategy::Order).unwrap().1, 0);
    // Spread: the one leased least recently (route 0 just was).
    assert_eq!(b.lease_any(&routes, Estimate::tokens(0), Strategy::Spread).unwrap().1, 1);
    // Both full (the other engine sees it): one refusal per candidate, in order.
    b.lease(&routes[1], 0, None).unwrap(); // two requests out on `req`
    let err = a.lease_any(&routes, Estimate::tokens(10_500), Strategy::Headroom).unwrap_err();
    let Error::Refused(r) = err else { panic!("{err:?}") };
    let reasons: Vec<Reason> = r.all().into_iter().map(|c| c.reason).collect();
    assert_eq!(reasons, vec![Reason::declared("tpm"), Reason::declared("rpm")]);
    assert!(matches!(a.lease_any(&[], Estimate::tokens(0), Strategy::Order), Err(Error::Invalid(_))));
}

#[test]
fn a_waiter_is_admitted_when_a_lease_of_its_engine_ends() {
    use quotaengine::core::engine::BatchOp;
    use quotaengine::core::handle::Handle;
    use quotaengine::core::state::Estimate;
    use quotaengine::core::wait::Waiter;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let clock = Arc::new(ManualClock::new(T0));
    let h =
        Handle::open(&StoreSpec::Sqlite(path.to_str().unwrap().into()), clock, Settings::default()).unwrap();
    h.with(|e| e.config().set_model_limits("p", "m", &model("requests/minute=1"), None)).unwrap();
    let r = Route::new("p", "m", 1).unwrap();
    let op = || BatchOp::Lease {
        route: r.clone(),
        est: Estimate::tokens(0),
        limits: None,
        check: true,
        priority: 0,
        tenants: quotaengine::core::tenants::none(),
    };
    let held = h.batch(op()).lease_id().unwrap();
    let h2 = h.clone();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        h2.batch(BatchOp::Release(held)).done().unwrap();
    });
    let t0 = Instant::now();
    let (id, _) = Waiter::new(&h, op(), Duration::from_secs(5)).run(|| Ok(())).unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(150));
    releaser.join().unwrap();
    assert_ne!(id, held);
    // A ManualClock that never moves: the recorded request's retry time (60 s away)
    // lies beyond a 1 s wait, which is refused at once.
    h.batch(BatchOp::Success {
        lease_id: id,
        route: r.clone(),
        tokens: None,
        tenants: quotaengine::core::tenants::none(),
    })
    .done()
    .unwrap();
    let t0 = Instant::now();
    let err = Waiter::new(&h, op(), Duration::from_secs(1)).run(|| Ok(())).unwrap_err();
    assert!(matches!(err, Error::Refused(_)));
    assert!(t0.elapsed() < Duration::from_millis(500));
    h.close().unwrap();
}

#[test]
fn a_pass_called_from_inside_a_pass_is_a_runtime_error() {
    use quotaengine::core::handle::Handle;
    use quotaengine::core::probe::Validator;
    use std::sync::Mutex;

    struct Nested {
        handle: Handle,
        seen: Mutex<Vec<String>>,
    }
    impl Validator for Nested {
        fn probe(&self, _key_id: i64) -> bool {
            let err = self.handle.run_probe_pass(&Always, &mut || 0.0, 3).unwrap_err();
            self.seen.lock().unwrap().push(format!("{err:?}"));
            false
        }
    }
    struct Always;
    impl Validator for Always {
        fn probe(&self, _key_id: i64) -> bool {
            true
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let path = dir.path().join("q.db");
    let handle =
        Handle::open(&StoreSpec::Sqlite(path.to_str().unwrap().into()), clock.clone(), Settings::default())
            .unwrap();
    handle.with(|e| e.failures().set_cooldown(&route(), 86_400_000, CooldownSource::Heuristic)).unwrap();
    clock.advance(43_200_000);
    let v = Nested { handle: handle.clone(), seen: Mutex::new(Vec::new()) };
    handle.run_probe_pass(&v, &mut || 0.0, 3).unwrap(); // the first sighting
    let pass = handle.run_probe_pass(&v, &mut || 0.0, 3).unwrap();
    assert_eq!(pass.probed_key_ids, vec![1]);
    assert_eq!(*v.seen.lock().unwrap(), vec!["Runtime(\"a probe pass is running\")".to_string()]);
    // Outside a pass, a pass runs.
    assert_eq!(handle.run_probe_pass(&Always, &mut || 0.0, 3).unwrap().probed_key_ids, Vec::<i64>::new());
    handle.close().unwrap();
}

#[test]
fn a_quota_observation_of_another_engine_is_seen_at_its_next_call() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, mut a, mut b) = two_engines(&dir);
    quota_feed::another_engines_observation_is_seen_at_once(&mut a, &mut b, &clock, true);
}

#[test]
fn a_reader_of_a_file_no_writer_of_this_version_opened_reads_the_quota_at_each_change() {
    // The file as an engine before the quota's version counter left it: no counter and no
    // triggers for `provider_quota_state`. A read-only engine cannot add them: it reads the
    // quota rows whenever the file changed.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let path = path.to_str().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    drop(open(path, &clock));
    let c = Connection::open(path).unwrap();
    c.execute_batch(
        "DELETE FROM quotaengine_meta WHERE name = 'provider_quota_state';
         DROP TRIGGER qe_bump_provider_quota_state_INSERT;
         DROP TRIGGER qe_bump_provider_quota_state_UPDATE;
         DROP TRIGGER qe_bump_provider_quota_state_DELETE;",
    )
    .unwrap();
    let insert = |platform: &str, remaining: i64| {
        c.execute(
            "INSERT INTO provider_quota_state (platform, key_id, pool_key, metric, limit_value, remaining, \
             source, confidence, observed_at_ms) VALUES (?1, 1, 'pool', 'requests', 100, ?2, 'header', 1.0, ?3)",
            rusqlite::params![platform, remaining, T0],
        )
        .unwrap();
    };
    insert("pa", 40);
    let settings = Settings { readonly: true, ..Settings::default() };
    let mut r = Engine::open(&StoreSpec::Sqlite(path.into()), clock.clone(), settings).unwrap();
    assert_eq!(r.observed().key_quota_headroom("pa").unwrap(), vec![(1, 0.4)]);
    insert("pb", 20);
    assert_eq!(r.observed().key_quota_headroom("pb").unwrap(), vec![(1, 0.2)]);
}

/// SPEC 23.2 without Python: a tenant's limit holds across two engines on one file and
/// across routes; the refusal names the tenant by its own name though a pattern declared
/// the limit.
#[test]
fn a_tenants_limit_holds_across_engines_and_routes() {
    use quotaengine::core::admission::Estimate;
    use quotaengine::core::limits::Limit;
    use quotaengine::core::tenants;
    let dir = tempfile::tempdir().unwrap();
    let (_clock, mut a, mut b) = two_engines(&dir);
    a.set_tenant_limits("team:*", vec![Limit::parse("requests", 2, "minute", "account").unwrap()], None)
        .unwrap();
    let who = tenants::parse(vec!["team:red".into(), "user:1".into()]).unwrap();
    let other = Route::new("groq", "other", 2).unwrap();
    let est = Estimate::tokens(10);
    let id = a.lease_for(&route(), est, None, &who).unwrap();
    b.lease_for(&other, est, None, &who).unwrap();
    for e in [&mut a, &mut b] {
        let err = e.lease_for(&other, est, None, &who).unwrap_err();
        let Error::Refused(r) = err else { panic!("{err:?}") };
        assert_eq!((r.reason.as_str(), r.tenant.as_deref()), ("tenant:requests/minute", Some("team:red")));
    }
    // another team has its own windows; a lease of no tenant is not counted
    let blue = tenants::parse(vec!["team:blue".into()]).unwrap();
    b.lease_for(&other, est, None, &blue).unwrap();
    a.lease(&route(), 0, None).unwrap();
    // ending a lease frees the tenant's slot in the other engine
    a.release_lease(id).unwrap();
    b.lease_for(&other, est, None, &who).unwrap();
    let usage = b.tenant_usage("team:red").unwrap();
    assert_eq!((usage[0].window.as_str(), usage[0].used, usage[0].in_flight), ("requests/minute", 0, 2));
}

/// SPEC 23.2: the zone of a tenant's declaration (its own, else its pattern's) is shared
/// through the file; `None` for UTC or no declaration.
#[test]
fn a_tenants_zone_is_its_declarations() {
    use quotaengine::core::limits::Limit;
    let dir = tempfile::tempdir().unwrap();
    let (_clock, mut a, mut b) = two_engines(&dir);
    let day = || vec![Limit::parse("requests", 5, "day", "account").unwrap()];
    a.set_tenant_limits("team:*", day(), Some("Asia/Tokyo".into())).unwrap();
    a.set_tenant_limits("team:blue", day(), None).unwrap();
    assert_eq!(b.tenant_zone("team:red").unwrap().as_deref(), Some("Asia/Tokyo"));
    assert_eq!(b.tenant_zone("team:*").unwrap().as_deref(), Some("Asia/Tokyo"));
    assert_eq!(b.tenant_zone("team:blue").unwrap(), None);
    assert_eq!(b.tenant_zone("nobody").unwrap(), None);
    assert!(b.tenant_zone("").is_err());
}

/// SPEC 27.1: the engine counts the gated leases that committed, per (platform, model),
/// and the failures recorded per (platform, kind); another engine on the file counts its own.
#[test]
fn stats_count_leases_and_failures_per_engine() {
    let dir = tempfile::tempdir().unwrap();
    let (_clock, mut a, b) = two_engines(&dir);
    a.lease(&route(), 10, rpm(2)).unwrap();
    a.lease(&Route::new("groq", "llama", 2).unwrap(), 0, rpm(2)).unwrap();
    a.lease(&Route::new("groq", "other", 1).unwrap(), 0, None).unwrap();
    assert!(a.lease(&route(), 10, rpm(1)).is_err()); // refused: no lease taken
    let fail = FailureInput { status: Some(500), ..FailureInput::default() };
    a.failures().record_failure(&route(), fail).unwrap();
    let s = a.stats();
    let key = |p: &str, m: &str| (p.to_string(), m.to_string());
    assert_eq!(s.admitted, vec![(key("groq", "llama"), 2), (key("groq", "other"), 1)]);
    assert_eq!(s.failures, vec![(key("groq", "server_error"), 1)]);
    assert_eq!((s.degraded_s, s.buffered_writes), (0.0, 0));
    assert_eq!(b.stats(), Default::default());
}

/// SPEC 27.2 without Python: one read of the engine, written as Prometheus text by the
/// crate: every family of the table in order, its samples' labels escaped as the format
/// says, a window without a limit has `used` and no `limit`, an idle route is left out.
#[test]
fn a_scrape_is_written_as_prometheus_text() {
    use quotaengine::core::handle::Handle;
    use quotaengine::core::metrics::{Scrape, FAMILIES};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let clock = Arc::new(ManualClock::new(T0));
    let h =
        Handle::open(&StoreSpec::Sqlite(path.to_str().unwrap().into()), clock, Settings::default()).unwrap();
    let odd = "say \"hi\"\\n\nü"; // a quote, a backslash, a newline, a non-ASCII letter
    let r = Route::new("groq", odd, 7).unwrap();
    h.with(|e| {
        e.config().set_model_limits("groq", odd, &model("requests/minute=5"), None)?;
        e.config().set_model_limits("groq", "idle", &model("requests/minute=5"), None)?;
        e.usage().record_request(&r)?;
        e.usage().record_request(&r)?;
        e.failures().set_cooldown(&r, 30_000, CooldownSource::Heuristic)
    })
    .unwrap();
    let text = Scrape::read(&h).unwrap().exposition().unwrap();
    let model_label = r#"model="say \"hi\"\\n\nü""#;
    let labels = format!(r#"platform="groq",{model_label},key="7""#);
    for line in [
        format!(r#"quotaengine_window_used{{{labels},window="rpm"}} 2.0"#),
        format!(r#"quotaengine_window_limit{{{labels},window="rpm"}} 5.0"#),
        format!(r#"quotaengine_window_used{{{labels},window="rpd"}} 2.0"#),
        format!(r#"quotaengine_in_flight{{{labels}}} 0.0"#),
        format!(r#"quotaengine_cooldown_remaining_seconds{{{labels},source="heuristic"}} 30.0"#),
        "quotaengine_wait_seconds_bucket{le=\"+Inf\"} 0".to_string(),
        "quotaengine_wait_seconds_count 0".to_string(),
        "quotaengine_degraded 0".to_string(),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
    }
    let rpd_limit = format!(r#"quotaengine_window_limit{{{labels},window="rpd"}}"#);
    assert!(!text.contains(&rpd_limit), "a window without a limit has no limit sample:\n{text}");
    assert!(!text.contains("idle"), "a route with nothing to report is left out:\n{text}");
    // Every family's HELP and TYPE, in the table's order (a counter's name ends in _total).
    let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
    let want: Vec<String> = FAMILIES
        .iter()
        .map(|f| {
            let total = if f.kind.as_str() == "counter" { "_total" } else { "" };
            format!("# TYPE {}{total} {}", f.name, f.kind.as_str())
        })
        .collect();
    assert_eq!(types, want);
}
