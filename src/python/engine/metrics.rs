//! What an engine says of itself for monitoring (SPEC 27): its counters (`stats`) and
//! everything a Prometheus scrape reads, in one call (`_metrics_read`).
use super::PyQuotaEngine;
use crate::core::stats::Stats;
use crate::python::limits::route_windows;
use crate::python::run::on_handle;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// The forecasts' lookback (SPEC 22.2's default).
const LOOKBACK_MS: i64 = crate::core::engine::DEFAULT_LOOKBACK_MS;

/// SPEC 27.1's dict.
fn stats_dict<'py>(py: Python<'py>, s: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let admitted = PyDict::new(py);
    for ((p, m), n) in &s.admitted {
        admitted.set_item((p, m), n)?;
    }
    let refused = PyDict::new(py);
    for (r, n) in &s.refused {
        refused.set_item(r, n)?;
    }
    let failures = PyDict::new(py);
    for ((p, k), n) in &s.failures {
        failures.set_item((p, k), n)?;
    }
    let waits = PyDict::new(py);
    waits.set_item("count", s.waits)?;
    waits.set_item("seconds", s.wait_s)?;
    d.set_item("admitted", admitted)?;
    d.set_item("refused", refused)?;
    d.set_item("failures", failures)?;
    d.set_item("waits", waits)?;
    d.set_item("degraded_s", s.degraded_s)?;
    d.set_item("buffered_writes", s.buffered_writes)?;
    Ok(d)
}

#[pymethods]
impl PyQuotaEngine {
    /// SPEC 27.1: this engine's counters since it was opened, kept in memory with no
    /// I/O (so per process): `admitted` {(platform, model_id): leases taken by `lease`,
    /// `lease_any` and their async forms}, `refused` {reason: `QuotaExceeded` raised
    /// to a caller}, `failures` {(platform, kind): failures recorded by `failure`,
    /// `observe` and `record_failure`}, `waits` {"count": calls that waited (a
    /// `wait_s` > 0, not admitted at once), "seconds": how long they waited in all},
    /// `degraded_s` (seconds spent degraded) and `buffered_writes` (writes buffered now).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = on_handle(py, &self.handle, |h| h.stats())?;
        stats_dict(py, &s)
    }

    /// SPEC 27.2: everything a scrape reads, read in one call with the GIL released:
    /// a dict with `now_ms`; `routes`, one `(platform, model_id, key_id, windows,
    /// in_flight, exhausts_at_ms)` per route with usage today, a live lease or a
    /// cooldown (`windows` a list of `(key, used, limit or None)`, keyed as `usage()`
    /// keys them); `cooldowns`, one `(platform, model_id, key_id or None for a
    /// model-wide bench, source, expires_at_ms)` per active cooldown; `tenants`, one
    /// `(tenant, window, used, limit)` per tenant limit in force; `stats` (as
    /// `stats()`); `wait_buckets`, the waits as cumulative `(upper bound in seconds,
    /// count)`; and `degraded`.
    fn _metrics_read<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (now, rows, cooldowns, tenants, stats, degraded) = on_handle(py, &self.handle, |h| {
            let out = h.with(|e| {
                let rows = e.observed().snapshot()?;
                let cooldowns = e.failures().active_cooldowns(None)?;
                let (_, tenants) = e.tenant_snapshot(LOOKBACK_MS)?;
                Ok((e.now_ms(), rows, cooldowns, tenants, e.stats(), e.degraded()))
            })?;
            let (now, rows, cooldowns, tenants, stats, degraded) = out;
            Ok((now, rows, cooldowns, tenants, h.complete_stats(stats), degraded))
        })?;
        let routes = PyList::empty(py);
        for r in &rows {
            let windows = route_windows(r);
            let t = (
                &r.route.platform,
                &r.route.model_id,
                r.route.key_id,
                windows,
                r.in_flight,
                r.exhausts_at_ms,
            );
            routes.append(t.into_pyobject(py)?)?;
        }
        let cds = PyList::empty(py);
        for c in &cooldowns {
            let key = (!c.model_wide).then_some(c.route.key_id);
            let t = (&c.route.platform, &c.route.model_id, key, c.source.as_str(), c.expires_at_ms);
            cds.append(t.into_pyobject(py)?)?;
        }
        let ts = PyList::empty(py);
        for t in &tenants {
            ts.append((&t.tenant, &t.window, t.used, t.limit).into_pyobject(py)?)?;
        }
        let d = PyDict::new(py);
        d.set_item("now_ms", now)?;
        d.set_item("routes", routes)?;
        d.set_item("cooldowns", cds)?;
        d.set_item("tenants", ts)?;
        d.set_item("stats", stats_dict(py, &stats)?)?;
        // The waits' histogram: (upper bound in seconds, waits at most that long).
        d.set_item("wait_buckets", &stats.wait_buckets)?;
        d.set_item("degraded", degraded)?;
        Ok(d)
    }
}
