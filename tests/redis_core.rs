//! The core on the Redis backend, without Python: a real `redis-server` started on a
//! free loopback port for each test (Debian's package; `.ci/run` installs it).
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use quotaengine::core::clock::ManualClock;
use quotaengine::core::engine::{Engine, FailureInput, Settings, StoreSpec};
use quotaengine::core::error::Error;
use quotaengine::core::limits::LimitSet;
use quotaengine::core::types::{CooldownSource, Reason, Route};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[path = "support/quota_feed.rs"]
mod quota_feed;

const T0: i64 = 1_767_261_600_000; // 2026-01-01 10:00 UTC

struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (apt-get install redis-server)");
        let server = Server { child, port, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn url(&self, prefix: &str) -> String {
        format!("redis://127.0.0.1:{}/0?prefix={prefix}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn open(url: &str, clock: &Arc<ManualClock>) -> Engine {
    Engine::open(&StoreSpec::from_path(url), clock.clone(), Settings::default()).unwrap()
}

fn route() -> Route {
    Route::new("groq", "llama", 1).unwrap()
}

fn rpm(n: i64) -> Option<LimitSet> {
    Some(LimitSet::parse(&format!("requests/minute={n}")).unwrap())
}

#[test]
fn two_engines_share_one_truth() {
    let server = Server::start();
    let url = server.url("share");
    let clock = Arc::new(ManualClock::new(T0));
    let mut a = open(&url, &clock);
    let mut b = open(&url, &clock);
    a.lease(&route(), 10, rpm(2)).unwrap();
    b.lease(&route(), 10, rpm(2)).unwrap();
    for e in [&mut a, &mut b] {
        let err = e.lease(&route(), 10, rpm(2)).unwrap_err();
        assert!(matches!(err, Error::Refused(ref r) if r.reason == Reason::declared("rpm")), "{err:?}");
    }
    b.failures().set_cooldown(&route(), 3_600_000, CooldownSource::Heuristic).unwrap();
    assert_eq!(a.check(&route(), 0, None).unwrap().reason, Some(Reason::Cooldown));
    // The ladder's history is shared: a 429 in one engine, the next step in the other.
    let other = Route::new("groq", "other", 1).unwrap();
    let f = || FailureInput { status: Some(429), ..FailureInput::default() };
    let first = a.failures().record_failure(&other, f()).unwrap().cooldown.unwrap();
    clock.advance(first.duration_ms);
    let second = b.failures().record_failure(&other, f()).unwrap().cooldown.unwrap();
    assert!(second.duration_ms > first.duration_ms, "{first:?} then {second:?}");
    // A third engine opened later loads all of it.
    let mut c = open(&url, &clock);
    assert_eq!(c.usage().report(&route(), None).unwrap().in_flight, 2);
    assert!(c.failures().cooldown(&route()).unwrap().is_some());
}

#[test]
fn threads_with_engines_of_their_own_admit_exactly_the_limit() {
    let server = Server::start();
    let url = server.url("race");
    let clock = Arc::new(ManualClock::new(T0));
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (url, clock, barrier) = (url.clone(), clock.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut e = open(&url, &clock);
                barrier.wait();
                let mut admitted = 0;
                loop {
                    match e.lease(&route(), 10, rpm(50)) {
                        Ok(id) => {
                            e.finish_lease_success(id, &route(), Some(10)).unwrap();
                            admitted += 1;
                        }
                        Err(Error::Refused(_)) => return admitted,
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        })
        .collect();
    let counts: Vec<i64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(counts.iter().sum::<i64>(), 50, "{counts:?}");
    let mut check = open(&url, &clock);
    let u = check.usage().report(&route(), rpm(50)).unwrap();
    assert_eq!((u.window("rpm").used, u.window("tpm").used, u.in_flight), (50, 500, 0));
}

#[test]
fn usage_since_midnight_is_loaded_and_retention_trims_the_feed() {
    let server = Server::start();
    let url = server.url("days");
    let clock = Arc::new(ManualClock::new(T0));
    let mut a = open(&url, &clock);
    for _ in 0..3 {
        a.usage().record_request(&route()).unwrap();
    }
    clock.set(T0 + 86_400_000); // the next day, same time
    a.usage().record_request(&route()).unwrap();
    let mut b = open(&url, &clock);
    let u = b.usage().report(&route(), None).unwrap();
    assert_eq!((u.window("rpd").used, u.window("rpm").used), (1, 1));
    // Retention (one day by default): a sweep a day later drops the first day's rows.
    clock.set(T0 + 2 * 86_400_000 - 60_000);
    b.usage().record_request(&route()).unwrap();
    let all = b.observed().usage_events(&Default::default()).unwrap();
    assert!(all.iter().all(|r| r.created_at_ms >= T0 + 86_400_000), "{all:?}");
    assert_eq!(all.len(), 2);
}

#[test]
fn a_quota_observation_of_another_engine_is_seen_at_its_next_call() {
    let server = Server::start();
    let url = server.url("quota");
    let clock = Arc::new(ManualClock::new(T0));
    let (mut a, mut b) = (open(&url, &clock), open(&url, &clock));
    quota_feed::another_engines_observation_is_seen_at_once(&mut a, &mut b, &clock, false);
}

/// A TCP proxy in front of `port`: it forwards both ways until a client sends a request
/// holding `marker` (once); that request goes to the server, whose reply is thrown away,
/// and the client's connection is cut (the server ran the request; only its answer is
/// lost). Later connections are forwarded as they come.
fn cut_reply_to(port: u16, marker: &'static [u8]) -> u16 {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpStream};
    use std::sync::atomic::{AtomicU8, Ordering};
    const ARMED: u8 = 0;
    const CUTTING: u8 = 1;
    const DONE: u8 = 2;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_port = listener.local_addr().unwrap().port();
    let state = Arc::new(AtomicU8::new(ARMED));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let Ok(mut server) = TcpStream::connect(("127.0.0.1", port)) else { continue };
            let (mut to_client, mut from_server) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            // This connection's requests; the flag says its next reply is the one lost.
            let mine = Arc::new(AtomicU8::new(0));
            let (armed, mine2) = (state.clone(), mine.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(n @ 1..) = client.read(&mut buf) {
                    let hit = buf[..n].windows(marker.len()).any(|w| w == marker);
                    if hit
                        && armed.compare_exchange(ARMED, CUTTING, Ordering::AcqRel, Ordering::Acquire).is_ok()
                    {
                        mine.store(1, Ordering::Release);
                    }
                    if server.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
            let done = state.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(n @ 1..) = from_server.read(&mut buf) {
                    if mine2.load(Ordering::Acquire) == 1 {
                        done.store(DONE, Ordering::Release);
                        break; // the reply, lost
                    }
                    if to_client.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to_client.shutdown(Shutdown::Both);
                let _ = from_server.shutdown(Shutdown::Both);
            });
        }
    });
    proxy_port
}

#[test]
fn a_lock_whose_reply_was_lost_is_dropped_at_its_owners_next_call() {
    let server = Server::start();
    let proxy = cut_reply_to(server.port, b"$5\r\nbegin\r\n");
    let clock = Arc::new(ManualClock::new(T0));
    let mut a = open(&format!("redis://127.0.0.1:{proxy}/0?prefix=lost"), &clock);
    a.usage().record_request(&route()).unwrap();
    a.usage().record_request(&route()).unwrap();
    // The failure's first round trip takes the lock; its reply is lost.
    let other = Route::new("groq", "llama", 2).unwrap();
    a.failures()
        .record_failure(&other, FailureInput { status: Some(500), ..FailureInput::default() })
        .unwrap();
    assert!(a.degraded());
    a.usage().record_request(&route()).unwrap(); // reconnects: drops the lock first
    assert!(!a.degraded());
    // Another engine waits at most 2 s for the lock, well under its 10 s time to live:
    // it is not degraded, and counts the first engine's 3 requests.
    let settings = Settings { busy_timeout_ms: 2_000, ..Settings::default() };
    let mut b = Engine::open(&StoreSpec::from_path(&server.url("lost")), clock.clone(), settings).unwrap();
    let err = b.lease(&route(), 10, rpm(3)).unwrap_err();
    assert!(!b.degraded());
    assert!(matches!(err, Error::Refused(ref r) if r.reason == Reason::declared("rpm")), "{err:?}");
    assert!(b.failures().cooldown(&other).unwrap().is_some());
}

/// SPEC 24.4: a `FLUSHALL` under two engines lifts no limit. Each finds the loss, logs an
/// error and writes back what it knows (once: one copy of the declared limit and the
/// cooldown, each request counted once), and a third engine opened afterwards sees it all.
#[test]
fn a_flushed_store_is_written_back_and_lifts_no_limit() {
    let server = Server::start();
    let url = server.url("lost");
    let clock = Arc::new(ManualClock::new(T0));
    let mut a = open(&url, &clock);
    let mut b = open(&url, &clock);
    a.config()
        .set_model_limits("groq", "llama", &LimitSet::parse("requests/minute=5").unwrap(), None)
        .unwrap();
    let benched = Route::new("groq", "benched", 1).unwrap();
    a.failures().set_cooldown(&benched, 3_600_000, CooldownSource::Heuristic).unwrap();
    a.lease(&route(), 10, None).unwrap();
    b.lease(&route(), 10, None).unwrap();
    assert_eq!(a.usage().report(&route(), None).unwrap().in_flight, 2);
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/0", server.port)).unwrap();
    let mut con = client.get_connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    let mut admitted = 0;
    for _ in 0..5 {
        for e in [&mut a, &mut b] {
            admitted += i32::from(e.lease(&route(), 10, None).is_ok());
        }
    }
    assert_eq!(admitted, 3);
    for e in [&mut a, &mut b] {
        assert!(!e.degraded());
        assert_eq!(e.check(&benched, 0, None).unwrap().reason, Some(Reason::Cooldown));
        let logs = e.take_logs();
        assert!(logs.iter().any(|(l, m)| *l == log::Level::Error && m.contains("lost its data")), "{logs:?}");
    }
    let mut c = open(&url, &clock);
    assert_eq!(c.usage().report(&route(), None).unwrap().in_flight, 5);
    assert!(c.failures().cooldown(&benched).unwrap().is_some());
    let err = c.lease(&route(), 10, None).unwrap_err();
    assert!(matches!(err, Error::Refused(ref r) if r.reason == Reason::declared("rpm")), "{err:?}");
    let lost = c
        .observed()
        .server_logs(100)
        .unwrap()
        .into_iter()
        .filter(|(_, r, _)| r.event.as_deref() == Some("store_lost"));
    assert_eq!(lost.count(), 2);
}

/// SPEC 24.4: an engine's usage of the day goes back whole after a flush, however many
/// rows it wrote (past the first minute they go back merged per route and minute), and
/// once even when two engines write back at once.
#[test]
fn a_day_of_usage_is_written_back_once() {
    let server = Server::start();
    let url = server.url("day");
    let clock = Arc::new(ManualClock::new(T0));
    let mut a = open(&url, &clock);
    let mut b = open(&url, &clock);
    for i in 0..6_000 {
        let e = if i % 3 == 0 { &mut b } else { &mut a };
        e.usage().record_request(&route()).unwrap();
        e.usage().record_tokens(&route(), 2).unwrap();
        clock.advance(100); // ten minutes in all
    }
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/0", server.port)).unwrap();
    let mut con = client.get_connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    for e in [&mut a, &mut b] {
        e.usage().record_request(&route()).unwrap();
    }
    // b had not read a's last rows before the flush: it counts them from a's write-back.
    for e in [&mut a, &mut b] {
        let day = e.usage().report(&route(), None).unwrap().day;
        assert_eq!((day.requests, day.tokens), (6_002, 12_000));
    }
    let mut c = open(&url, &clock);
    let day = c.usage().report(&route(), None).unwrap().day;
    assert_eq!((day.requests, day.tokens), (6_002, 12_000));
}
