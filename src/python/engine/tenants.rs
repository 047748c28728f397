//! Tenants (SPEC 23.2, 23.4): declaring their limits and reading what each used.
use super::PyQuotaEngine;
use crate::python::convert::{opt_int_arg, str_arg, Arg};
use crate::python::limits::{limit_list_arg, PyLimit};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The default pace of a forecast (SPEC 22.2).
const LOOKBACK_MS: i64 = 600_000;

#[pymethods]
impl PyQuotaEngine {
    /// SPEC 23.2: replaces the limits of a tenant, or of each tenant a pattern matches
    /// (a name ending in `*`: `"*"`, `"team:*"`; each matching tenant has its own
    /// windows, the longest pattern wins, a tenant's own declaration wins over any
    /// pattern); an empty `limits` forgets it. Every metric, `cost` included, with any
    /// `per`, at scope `"account"`; calendar periods start at 00:00 in `tz` (an IANA
    /// name; default UTC). Persisted and shared through the store; bad input is a
    /// `ValueError`/`TypeError` with nothing written.
    #[pyo3(signature = (tenant, limits, *, tz=None))]
    fn set_tenant_limits(
        &self, py: Python<'_>, tenant: &Arg, limits: &Arg, tz: Option<&Arg>,
    ) -> PyResult<()> {
        let t = str_arg(tenant, "tenant")?.to_string();
        if limits.is_none() || limits.cast::<PyDict>().is_ok() {
            return Err(pyo3::exceptions::PyTypeError::new_err("limits must be an iterable of Limit"));
        }
        let list = limit_list_arg(limits, "limits")?;
        let tz = match tz.filter(|z| !z.is_none()) {
            Some(z) => Some(str_arg(z, "tz")?.to_string()),
            None => None,
        };
        self.run(py, move |e| e.set_tenant_limits(&t, list, tz))
    }

    /// SPEC 23.2: the limits in force for that name (its own declaration, else the
    /// longest matching pattern's), as declared, in gate order; a pattern's own
    /// declaration when given one; `[]` when none.
    #[pyo3(signature = (tenant))]
    fn tenant_limits(&self, py: Python<'_>, tenant: &Arg) -> PyResult<Vec<PyLimit>> {
        let t = str_arg(tenant, "tenant")?;
        Ok(self.run(py, |e| e.tenant_limits(t))?.into_iter().map(PyLimit::from).collect())
    }

    /// SPEC 23.2: `{"<metric>/<per>": {"used", "limit", "in_flight"}}`, one entry per
    /// limit in force for the tenant (µ$ for `cost`; in flight: its live leases, their
    /// estimated tokens or the µ$ they reserve); `{}` without limits.
    #[pyo3(signature = (tenant))]
    fn tenant_usage<'py>(&self, py: Python<'py>, tenant: &Arg) -> PyResult<Bound<'py, PyDict>> {
        let t = str_arg(tenant, "tenant")?;
        let rows = self.run(py, |e| e.tenant_usage(t))?;
        let out = PyDict::new(py);
        for r in rows {
            let d = PyDict::new(py);
            d.set_item("used", r.used)?;
            d.set_item("limit", r.limit)?;
            d.set_item("in_flight", r.in_flight)?;
            out.set_item(r.window, d)?;
        }
        Ok(out)
    }

    /// The IANA zone of the calendar periods of the declaration in force for a tenant
    /// (SPEC 23.2's `tz`; its own, else its pattern's), `None` for UTC or none: where the
    /// LiteLLM proxy's `x-ratelimit-reset-*` count to (SPEC 25.3) and where
    /// `analysis.plot_usage` starts a tenant's calendar windows.
    #[pyo3(signature = (tenant))]
    fn _tenant_zone(&self, py: Python<'_>, tenant: &Arg) -> PyResult<Option<String>> {
        let t = str_arg(tenant, "tenant")?;
        self.run(py, |e| e.tenant_zone(t))
    }

    /// SPEC 23.2: the tenants named in a declaration (never a pattern) or with usage
    /// recorded since `since_ms` (default: 00:00 UTC today), sorted.
    #[pyo3(signature = (since_ms=None))]
    fn tenants(&self, py: Python<'_>, since_ms: Option<&Arg>) -> PyResult<Vec<String>> {
        let since = opt_int_arg(since_ms, "since_ms")?;
        self.run(py, move |e| e.tenants(since))
    }

    /// SPEC 23.4's rows of `snapshot().tenants`: `(taken_at_ms, rows)`, one dict per
    /// limit in force of each tenant with limits or usage today (`tenant`, `window`,
    /// `used`, `limit`, `in_flight`, `used_fraction`, `exhausts_at_ms`).
    fn _tenant_rows<'py>(&self, py: Python<'py>) -> PyResult<(i64, Vec<Bound<'py, PyDict>>)> {
        let (now, rows) = self.run(py, |e| e.tenant_snapshot(LOOKBACK_MS))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let d = PyDict::new(py);
            let fraction =
                if r.limit > 0 { r.used.saturating_add(r.in_flight) as f64 / r.limit as f64 } else { 1.0 };
            d.set_item("tenant", r.tenant)?;
            d.set_item("window", r.window)?;
            d.set_item("used", r.used)?;
            d.set_item("limit", r.limit)?;
            d.set_item("in_flight", r.in_flight)?;
            d.set_item("used_fraction", fraction)?;
            d.set_item("exhausts_at_ms", r.exhausts_at_ms)?;
            out.push(d);
        }
        Ok((now, out))
    }
}
