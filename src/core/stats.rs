//! SPEC 27.1: an engine's counters since it was opened, kept in memory with no I/O
//! (so per process). What the engine counts under its lock lives in
//! [`EngineCounters`] (leases taken, per interned route id: a `Vec` index on the hot
//! path, grouped by (platform, model) only when read; failures; time degraded); what
//! the binding's doors count without it (refusals raised, waits) in
//! [`HandleCounters`].
use crate::core::state::RouteId;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `stats()` as read: every map sorted by its key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Leases taken by `lease`, `lease_any` and their async forms, per (platform, model_id).
    pub admitted: Vec<((String, String), u64)>,
    /// `QuotaExceeded` raised to a caller, per reason.
    pub refused: Vec<(String, u64)>,
    /// Failures recorded, per (platform, kind).
    pub failures: Vec<((String, String), u64)>,
    /// Calls that waited (a wait given, not admitted at once) and the seconds they waited.
    pub waits: u64,
    pub wait_s: f64,
    /// The waits by how long they took: per bound of [`WAIT_BUCKETS`], how many took
    /// at most that long (cumulative, as a Prometheus histogram counts).
    pub wait_buckets: Vec<(f64, u64)>,
    /// Seconds spent degraded (the current stretch included).
    pub degraded_s: f64,
    /// Writes buffered now.
    pub buffered_writes: usize,
}

/// The upper bounds (seconds) of the waits' histogram (SPEC 27.2's
/// `quotaengine_wait_seconds`); `+Inf` is the count of them all.
pub const WAIT_BUCKETS: [f64; 13] =
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The counters kept under the engine's lock.
#[derive(Debug, Default)]
pub struct EngineCounters {
    /// Leases taken, by route id.
    admitted: Vec<u64>,
    /// The gated leases of the batch attempt running: counted once it commits.
    pending: Vec<RouteId>,
    failures: BTreeMap<(String, &'static str), u64>,
    degraded_since: Option<Instant>,
    degraded_for: Duration,
}

impl EngineCounters {
    /// A gated lease taken by the running batch attempt.
    #[inline]
    pub fn lease_taken(&mut self, rid: RouteId) {
        self.pending.push(rid);
    }

    /// The running batch attempt is taken back (or a new one starts).
    #[inline]
    pub fn forget_pending(&mut self) {
        self.pending.clear();
    }

    /// The running batch attempt committed: its leases count.
    #[inline]
    pub fn commit_pending(&mut self) {
        for rid in self.pending.drain(..) {
            let i = rid as usize;
            if i >= self.admitted.len() {
                self.admitted.resize(i + 1, 0);
            }
            self.admitted[i] += 1;
        }
    }

    pub fn failure(&mut self, platform: &str, kind: &'static str) {
        *self.failures.entry((platform.to_string(), kind)).or_insert(0) += 1;
    }

    /// The engine went degraded (`true`) or answers again (`false`).
    pub fn degraded(&mut self, on: bool) {
        match (on, self.degraded_since) {
            (true, None) => self.degraded_since = Some(Instant::now()),
            (false, Some(t)) => {
                self.degraded_for += t.elapsed();
                self.degraded_since = None;
            }
            _ => {}
        }
    }

    /// Fills `s`'s engine-side fields; `route` names a route id's (platform, model_id).
    pub fn read<'a>(&self, s: &mut Stats, route: impl Fn(RouteId) -> (&'a str, &'a str)) {
        let mut admitted: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for (rid, n) in self.admitted.iter().enumerate().filter(|(_, n)| **n > 0) {
            *admitted.entry(route(rid as RouteId)).or_insert(0) += n;
        }
        s.admitted = admitted.into_iter().map(|((p, m), n)| ((p.to_string(), m.to_string()), n)).collect();
        s.failures = self.failures.iter().map(|((p, k), n)| ((p.clone(), (*k).to_string()), *n)).collect();
        let current = self.degraded_since.map_or(Duration::ZERO, |t| t.elapsed());
        s.degraded_s = (self.degraded_for + current).as_secs_f64();
    }
}

/// The counters the binding's doors keep without the engine's lock.
#[derive(Debug, Default)]
pub struct HandleCounters {
    refused: Mutex<BTreeMap<String, u64>>,
    waits: AtomicU64,
    wait_ns: AtomicU64,
    /// Per bound of `WAIT_BUCKETS`, the waits that took at most that long (not cumulative).
    wait_buckets: [AtomicU64; WAIT_BUCKETS.len()],
}

impl HandleCounters {
    /// A `QuotaExceeded` raised to a caller.
    pub fn refused(&self, reason: &str) {
        let mut m = self.refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match m.get_mut(reason) {
            Some(n) => *n += 1,
            None => {
                m.insert(reason.to_string(), 1);
            }
        }
    }

    /// A call that waited, for `waited`.
    pub fn waited(&self, waited: Duration) {
        self.waits.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.wait_ns.fetch_add(ns, Ordering::Relaxed);
        let secs = waited.as_secs_f64();
        if let Some(i) = WAIT_BUCKETS.iter().position(|b| secs <= *b) {
            self.wait_buckets[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Fills `s`'s fields of the handle.
    pub fn read(&self, s: &mut Stats) {
        let m = self.refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        s.refused = m.iter().map(|(r, n)| (r.clone(), *n)).collect();
        s.waits = self.waits.load(Ordering::Relaxed);
        s.wait_s = self.wait_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let mut below = 0;
        s.wait_buckets = WAIT_BUCKETS
            .iter()
            .zip(&self.wait_buckets)
            .map(|(b, n)| {
                below += n.load(Ordering::Relaxed);
                (*b, below)
            })
            .collect();
    }

    /// In a forked child: the parent's counts are the parent's.
    pub fn reset(&self) {
        self.refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
        self.waits.store(0, Ordering::Relaxed);
        self.wait_ns.store(0, Ordering::Relaxed);
        for b in &self.wait_buckets {
            b.store(0, Ordering::Relaxed);
        }
    }
}
