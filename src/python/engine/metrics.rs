//! What an engine says of itself for monitoring (SPEC 27): its counters (`stats`) and
//! everything a Prometheus scrape reads, in one call (`_metrics_read`).
use super::PyQuotaEngine;
use crate::core::metrics::{Scrape, FAMILIES};
use crate::core::stats::Stats;

use crate::python::run::on_handle;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};
use std::collections::HashMap;

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

/// The Python str of `s`, made once per distinct text of a read.
fn text<'py, 'a>(
    py: Python<'py>, texts: &mut HashMap<&'a str, Bound<'py, PyString>>, s: &'a str,
) -> Bound<'py, PyString> {
    texts.entry(s).or_insert_with(|| PyString::new(py, s)).clone()
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

    /// SPEC 27.2: everything a scrape reads, read in one call with the GIL released,
    /// shaped as the collector's samples: a dict with `now_ms`; one list of rows per
    /// gauge family, each row its label values (str) then its value (float): `used` and
    /// `limit` `(platform, model_id, key, window, value)` for each window of each route
    /// with usage today, a live lease or a cooldown (keyed as `usage()` keys them; no
    /// `limit` row for a window without a limit), `in_flight` `(platform, model_id,
    /// key, leases)` and `exhausts` `(platform, model_id, key, seconds from now to the
    /// route's earliest forecast)` for those routes (none when it has no forecast),
    /// `cooldown` `(platform, model_id, key or "*" for a model-wide bench, source,
    /// seconds left)` per active cooldown, `tenant_used` and `tenant_limit` `(tenant,
    /// window, value)` per tenant limit in force (`key` is the key id as text, seconds
    /// are never negative); `stats` (as `stats()`); `wait_buckets`, the waits as
    /// cumulative `(upper bound in seconds, count)`; and `degraded`.
    fn _metrics_read<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let scrape = on_handle(py, &self.handle, Scrape::read)?;
        // One Python str per distinct text (a window's name recurs in every route).
        let mut texts: HashMap<&str, Bound<'py, PyString>> = HashMap::new();
        let (used, limit, in_flight, exhausts) =
            (PyList::empty(py), PyList::empty(py), PyList::empty(py), PyList::empty(py));
        for r in scrape.routes() {
            let p = PyString::new(py, r.platform);
            let m = PyString::new(py, r.model);
            let k = PyString::new(py, &r.key);
            for (window, u, l) in r.windows {
                let w = text(py, &mut texts, window);
                if let Some(l) = l {
                    limit.append((&p, &m, &k, &w, l as f64))?;
                }
                used.append((&p, &m, &k, w, u as f64))?;
            }
            in_flight.append((&p, &m, &k, r.in_flight as f64))?;
            if let Some(s) = r.exhausts_in_s {
                exhausts.append((&p, &m, &k, s))?;
            }
        }
        let cooldown = PyList::empty(py);
        for c in scrape.cooldowns() {
            cooldown.append((c.platform, c.model, c.key, c.source, c.remaining_s))?;
        }
        let (tenant_used, tenant_limit) = (PyList::empty(py), PyList::empty(py));
        for t in &scrape.tenants {
            let name = PyString::new(py, &t.tenant);
            let w = text(py, &mut texts, &t.window);
            tenant_used.append((&name, &w, t.used as f64))?;
            tenant_limit.append((name, w, t.limit as f64))?;
        }
        let (now, stats, degraded) = (scrape.now_ms, &scrape.stats, scrape.degraded);
        let d = PyDict::new(py);
        d.set_item("now_ms", now)?;
        d.set_item("used", used)?;
        d.set_item("limit", limit)?;
        d.set_item("in_flight", in_flight)?;
        d.set_item("exhausts", exhausts)?;
        d.set_item("cooldown", cooldown)?;
        d.set_item("tenant_used", tenant_used)?;
        d.set_item("tenant_limit", tenant_limit)?;
        d.set_item("stats", stats_dict(py, stats)?)?;
        // The waits' histogram: (upper bound in seconds, waits at most that long).
        d.set_item("wait_buckets", &stats.wait_buckets)?;
        d.set_item("degraded", degraded)?;
        Ok(d)
    }

    /// SPEC 27.2's families in Prometheus' text format 0.0.4 (UTF-8 bytes): the same
    /// read as `_metrics_read`, written by the `prometheus-client` crate, the GIL
    /// released for both (a panic in either is a `QuotaEngineError`).
    fn _metrics_text<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let text = on_handle(py, &self.handle, |h| h.shielded(|| Scrape::read(h)?.exposition()))?;
        Ok(PyBytes::new(py, text.as_bytes()))
    }
}

/// SPEC 27.2's table, `(key, name, help, type, labels)` per family, for the Python
/// collector (a counter's name without `_total`).
pub(crate) fn metric_families(
) -> Vec<(&'static str, &'static str, &'static str, &'static str, Vec<&'static str>)> {
    FAMILIES.iter().map(|f| (f.key, f.name, f.help, f.kind.as_str(), f.labels.to_vec())).collect()
}
