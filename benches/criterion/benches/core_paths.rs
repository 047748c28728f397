//! Criterion benches of the core hot paths, without Python:
//!
//!   cd benches/criterion && CARGO_TARGET_DIR=../../target-bench cargo bench
//!
//! `check` on a file, `lease` + `finish_lease_success` on a file (flush 0 and
//! flush 10 ms) and on `:memory:`, and the in-memory `Windows` add + count. The
//! clock is a `ManualClock` advanced 1 ms per operation; limits are set high enough
//! that nothing is refused (every op takes the admitted, writing path).
#![allow(clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use quotaengine::core::clock::ManualClock;
use quotaengine::core::engine::{Engine, Settings, StoreSpec};
use quotaengine::core::limits::LimitSet;
use quotaengine::core::types::{Limits, Route};
use quotaengine::core::windows::Windows;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// 2026-01-01 10:00 UTC.
const T0: i64 = 1_767_261_600_000;
const ROUTES: usize = 1000;

fn limits() -> Option<LimitSet> {
    Some(LimitSet::from_classic(Limits {
        rpm: Some(1 << 40),
        rpd: Some(1 << 40),
        tpm: Some(1 << 50),
        tpd: Some(1 << 50),
    }))
}

fn routes() -> Vec<Route> {
    (0..ROUTES as i64).map(|i| Route::new(format!("p{}", i % 10), format!("m{}", i % 20), i % 5).unwrap()).collect()
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("qe-criterion-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    fn db(&self) -> StoreSpec {
        StoreSpec::Sqlite(self.0.join("bench.db").to_str().unwrap().into())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open(spec: &StoreSpec, clock: &Arc<ManualClock>, flush_ms: i64) -> Engine {
    let settings = Settings { flush_interval_ms: flush_ms, ..Settings::default() };
    Engine::open(spec, clock.clone(), settings).unwrap()
}

fn bench_check(c: &mut Criterion) {
    let dir = TempDir::new("check");
    let clock = Arc::new(ManualClock::new(T0));
    let mut e = open(&dir.db(), &clock, 0);
    let routes = routes();
    // Some usage on every route, so that the windows are not empty.
    for (i, r) in routes.iter().enumerate() {
        clock.set(T0 + i as i64);
        e.usage().record_request(r).unwrap();
        e.usage().record_tokens(r, 500).unwrap();
    }
    let lim = limits();
    let mut g = c.benchmark_group("check");
    g.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    g.bench_function("file", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            black_box(e.check(&routes[i % ROUTES], 600, lim.clone()).unwrap())
        })
    });
    g.finish();
    e.close().unwrap();
}

fn bench_lease_success(c: &mut Criterion) {
    let routes = routes();
    let lim = limits();
    let mut g = c.benchmark_group("lease+success");
    g.throughput(Throughput::Elements(1));
    for (label, flush_ms, memory) in [("file, flush 0", 0, false), ("file, flush 10", 10, false), (":memory:", 0, true)] {
        let dir = TempDir::new(&format!("lease-{flush_ms}-{memory}"));
        let spec = if memory { StoreSpec::Sqlite(":memory:".into()) } else { dir.db() };
        let clock = Arc::new(ManualClock::new(T0));
        let mut e = open(&spec, &clock, flush_ms);
        let mut i = 0usize;
        g.bench_function(label, |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                clock.advance(1);
                let r = &routes[i % ROUTES];
                let id = e.lease(r, 600, lim.clone()).unwrap();
                e.finish_lease_success(id, r, Some(500)).unwrap();
            })
        });
        e.close().unwrap();
    }
    g.finish();
}

fn bench_windows(c: &mut Criterion) {
    let mut g = c.benchmark_group("windows");
    g.throughput(Throughput::Elements(1000));
    // Steady state: one event per ms, so the minute window holds ~60k events.
    g.bench_function("add + minute + day, x1000 (60k events in the minute)", |b| {
        b.iter_batched_ref(
            || {
                let mut w = Windows::default();
                for t in 0..60_000 {
                    w.add(T0 + t, 1, 500, T0 + t);
                }
                (w, T0 + 60_000)
            },
            |(w, t)| {
                for _ in 0..1000 {
                    *t += 1;
                    w.add(*t, 1, 500, *t);
                    black_box(w.minute());
                    black_box(w.day(*t));
                }
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4)).sample_size(30)
}

criterion_group! { name = benches; config = config(); targets = bench_check, bench_lease_success, bench_windows }
criterion_main!(benches);
