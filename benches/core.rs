//! Core hot paths without Python: `cargo bench --no-default-features --bench core`.
//!
//! Times `check`, `lease` + `finish_lease_success`, `record_request` and a grouped
//! batch of 8 leases on `:memory:` and on a file (a plain harness: no extra crates),
//! and one renewal of 1,000 live leases (SPEC 24.1), also on a Redis server when
//! `QE_BENCH_REDIS` names one (`redis://127.0.0.1:6379/0?prefix=bench`; the bench
//! needs the `redis` feature then: `cargo bench --bench core`).
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use quotaengine::core::clock::ManualClock;
use quotaengine::core::engine::{BatchOp, Engine, Settings, StoreSpec};
use quotaengine::core::types::Route;
use std::sync::Arc;
use std::time::Instant;

const T0: i64 = 1_767_261_600_000;

fn engine(spec: &StoreSpec, clock: &Arc<ManualClock>) -> Engine {
    Engine::open(spec, clock.clone(), Settings::default()).unwrap()
}

/// Runs `f` `n` times; each run does `ops` operations.
fn time<F: FnMut(usize)>(name: &str, n: usize, ops: usize, mut f: F) {
    let t = Instant::now();
    for i in 0..n {
        f(i);
    }
    let per = t.elapsed().as_secs_f64() / (n * ops) as f64 * 1e6;
    println!("{name:<44} {per:>9.2} µs/op  {:>10.0} ops/s", 1e6 / per);
}

fn main() {
    let dir = std::env::temp_dir().join(format!("qe-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bench.db");
    // Requests per minute and per day, tokens per minute and per day: none is reached.
    let limits = Some(quotaengine::core::limits::LimitSet::from_classic([
        Some(1 << 40),
        Some(1 << 40),
        Some(1 << 50),
        Some(1 << 50),
    ]));
    let routes: Vec<Route> = (0..1000)
        .map(|i| Route::new(format!("p{}", i % 10), format!("m{}", i % 20), i % 5).unwrap())
        .collect();
    for (label, spec) in [
        ("memory", StoreSpec::Sqlite(":memory:".into())),
        ("file", StoreSpec::Sqlite(file.to_str().unwrap().into())),
    ] {
        let clock = Arc::new(ManualClock::new(T0));
        let mut e = engine(&spec, &clock);
        let n = 20_000;
        time(&format!("[{label}] record_request"), n, 1, |i| {
            clock.advance(1);
            e.usage().record_request(&routes[i % routes.len()]).unwrap();
        });
        time(&format!("[{label}] check"), n * 5, 1, |i| {
            e.check(&routes[i % routes.len()], 600, limits.clone()).unwrap();
        });
        time(&format!("[{label}] lease + success"), n, 1, |i| {
            clock.advance(1);
            let r = &routes[i % routes.len()];
            let id = e.lease(r, 600, limits.clone()).unwrap();
            e.finish_lease_success(id, r, Some(500)).unwrap();
        });
        time(&format!("[{label}] lease + success, 8 callers grouped"), n / 8, 8, |i| {
            clock.advance(1);
            let ops: Vec<BatchOp> = (0..8)
                .map(|j| BatchOp::Lease {
                    route: routes[(i * 8 + j) % routes.len()].clone(),
                    est: quotaengine::core::state::Estimate::tokens(600),
                    limits: limits.clone(),
                    check: true,
                    priority: 0,
                    tenants: quotaengine::core::tenants::none(),
                })
                .collect();
            let ids: Vec<i64> = e.run_batch(ops).into_iter().map(|o| o.lease_id().unwrap()).collect();
            let ops: Vec<BatchOp> = ids
                .iter()
                .enumerate()
                .map(|(j, id)| BatchOp::Success {
                    lease_id: *id,
                    route: routes[(i * 8 + j) % routes.len()].clone(),
                    tokens: Some(quotaengine::core::engine::TokenUse::total(500)),
                    tenants: quotaengine::core::tenants::none(),
                })
                .collect();
            e.run_batch(ops);
        });
    }
    let mut stores = vec![
        ("memory", StoreSpec::Sqlite(":memory:".into())),
        ("file", StoreSpec::Sqlite(dir.join("renew.db").to_str().unwrap().into())),
    ];
    if let Ok(url) = std::env::var("QE_BENCH_REDIS") {
        stores.push(("redis", StoreSpec::Redis(url)));
    }
    for (label, spec) in stores {
        renewal(label, &spec, &routes, &limits);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// SPEC 24.1: one renewal of an engine's 1,000 live leases (the background thread's,
/// every `lease_max_age_ms / 4`): one transaction or round trip for them all. Prints
/// the time of one renewal and what it costs at the default max age (2 min: a renewal
/// every 30 s).
fn renewal(
    label: &str, spec: &StoreSpec, routes: &[Route], limits: &Option<quotaengine::core::limits::LimitSet>,
) {
    let clock = Arc::new(ManualClock::new(T0));
    let mut e = engine(spec, &clock);
    for r in routes.iter().take(1000) {
        e.lease(r, 600, limits.clone()).unwrap();
    }
    let n = 50;
    let t = Instant::now();
    for _ in 0..n {
        clock.advance(1);
        e.renew_leases(true).unwrap();
    }
    let per = t.elapsed().as_secs_f64() / n as f64;
    let every = Settings::default().lease_max_age_ms as f64 / 4.0 / 1000.0;
    let name = format!("[{label}] renew 1,000 live leases");
    println!(
        "{name:<44} {:>9.2} ms/renewal {:>9.0} rows/s; every {every:.0} s by default: {:.0} rows/s, busy {:.3}% of the time",
        per * 1e3,
        1000.0 / per,
        1000.0 / every,
        per / every * 100.0
    );
}
