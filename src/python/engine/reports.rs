//! What an engine reports (SPEC §4, §8, §9, 22.2): usage and its forecast, the
//! guardrail's fraction, provider counts and quota state, usage events, server logs
//! and the snapshot rows.
use super::args::{account, route};
use super::PyQuotaEngine;
use crate::core::store::UsageFilter;
use crate::python::convert::{count_arg, int_arg, opt_int_arg, str_arg, Arg};
use crate::python::limits::{limits_arg, snapshot_limits, usage_dict};
use crate::python::types::PyQuotaState;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

#[pymethods]
impl PyQuotaEngine {
    #[pyo3(signature = (platform, model_id, key_id, limits=None))]
    fn usage<'py>(
        &self, py: Python<'py>, platform: &Arg, model_id: &Arg, key_id: &Arg, limits: Option<&Arg>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let r = route(platform, model_id, key_id)?;
        let l = limits_arg(limits)?;
        let u = self.run(py, move |e| e.usage().report(&r, l))?;
        usage_dict(py, &u)
    }

    /// SPEC 22.2: for each declared window of an hour or longer (keyed as `usage()`
    /// keys them) and each daily provider cap (keyed `provider_daily_requests`,
    /// `provider_daily_tokens`), the time in epoch ms at which it would run out if
    /// the pace of the last `lookback_ms` went on; `None` when it would not before the
    /// window resets, or nothing was used lately.
    #[pyo3(signature = (platform, model_id, key_id, *, lookback_ms=None), text_signature = "(self, platform, model_id, key_id, *, lookback_ms=600000)")]
    fn forecast<'py>(
        &self, py: Python<'py>, platform: &Arg, model_id: &Arg, key_id: &Arg, lookback_ms: Option<&Arg>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let r = route(platform, model_id, key_id)?;
        let lookback = match lookback_ms.filter(|l| !l.is_none()) {
            None => crate::core::engine::DEFAULT_LOOKBACK_MS,
            Some(l) => int_arg(l, "lookback_ms")?,
        };
        let f = self.run(py, move |e| e.observed().forecast(&r, lookback))?;
        let d = PyDict::new(py);
        for (k, t) in f {
            d.set_item(k, t)?;
        }
        Ok(d)
    }

    /// SPEC §9: the used fraction of the model's windows on its key with the most
    /// headroom, from a snapshot reused for `window_usage_ttl_ms`; None when it has no
    /// window limit, no routable key, or the database cannot be read.
    #[pyo3(signature = (platform, model_id, limits=None, key_id=None))]
    fn model_window_used_fraction(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, limits: Option<&Arg>, key_id: Option<&Arg>,
    ) -> PyResult<Option<f64>> {
        let (p, m) = (str_arg(platform, "platform")?, str_arg(model_id, "model_id")?);
        let l = limits_arg(limits)?;
        let k = opt_int_arg(key_id, "key_id")?;
        self.run(py, |e| e.observed().model_window_used_fraction(p, m, l, k))
    }

    /// Drops the guardrail snapshot so the next call rebuilds it.
    fn invalidate_window_usage(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |e| {
            e.observed().invalidate_window_usage();
            Ok(())
        })
    }

    /// The merged quota rows, one per (platform, key_id, pool_key, metric).
    fn quota_state(&self, py: Python<'_>) -> PyResult<Vec<PyQuotaState>> {
        Ok(self.run(py, |e| e.observed().quota_state())?.into_iter().map(PyQuotaState::from).collect())
    }

    /// SPEC §8.2: key_id -> worst remaining/limit over its confident rows (<= 1.0).
    fn key_quota_headroom<'py>(&self, py: Python<'py>, platform: &Arg) -> PyResult<Bound<'py, PyDict>> {
        let p = str_arg(platform, "platform")?;
        let v = self.run(py, |e| e.observed().key_quota_headroom(p))?;
        let d = PyDict::new(py);
        for (k, h) in v {
            d.set_item(k, h)?;
        }
        Ok(d)
    }

    fn provider_daily_request_count(&self, py: Python<'_>, platform: &Arg, key_id: &Arg) -> PyResult<i64> {
        let a = account(platform, key_id)?;
        self.run(py, move |e| e.observed().provider_daily_request_count(&a.platform, a.key_id))
    }

    fn provider_minute_request_count(&self, py: Python<'_>, platform: &Arg, key_id: &Arg) -> PyResult<i64> {
        let a = account(platform, key_id)?;
        self.run(py, move |e| e.observed().provider_minute_request_count(&a.platform, a.key_id))
    }

    fn provider_daily_token_count(&self, py: Python<'_>, platform: &Arg, key_id: &Arg) -> PyResult<i64> {
        let a = account(platform, key_id)?;
        self.run(py, move |e| e.observed().provider_daily_token_count(&a.platform, a.key_id))
    }

    /// Usage rows with `since_ms <= created_at_ms < until_ms`, oldest first.
    #[pyo3(signature = (since_ms=None, until_ms=None, platform=None, model_id=None, key_id=None))]
    fn usage_events<'py>(
        &self, py: Python<'py>, since_ms: Option<&Arg>, until_ms: Option<&Arg>, platform: Option<String>,
        model_id: Option<String>, key_id: Option<&Arg>,
    ) -> PyResult<Bound<'py, PyList>> {
        let f = UsageFilter {
            since_ms: opt_int_arg(since_ms, "since_ms")?,
            until_ms: opt_int_arg(until_ms, "until_ms")?,
            platform,
            model_id,
            key_id: opt_int_arg(key_id, "key_id")?,
        };
        let rows = self.run(py, move |e| e.observed().usage_events(&f))?;
        let out = PyList::empty(py);
        for r in rows {
            let d = PyDict::new(py);
            d.set_item("platform", &*r.platform)?;
            d.set_item("model_id", &*r.model_id)?;
            d.set_item("key_id", r.key_id)?;
            d.set_item("kind", r.kind.as_str())?;
            d.set_item("tokens", r.tokens)?;
            // SPEC §14.4: what the call reported of its split, None where it did not.
            d.set_item("input_tokens", r.kinds.input)?;
            d.set_item("output_tokens", r.kinds.output)?;
            d.set_item("cached_tokens", r.kinds.cached)?;
            // SPEC 23.1: what the event cost in µ$ at the prices in force then (0 unpriced).
            d.set_item("cost", r.cost)?;
            // SPEC 23.2: whom it was served for, in the order given (empty when none).
            d.set_item("tenants", r.tenants.iter().map(|t| &**t).collect::<Vec<&str>>())?;
            d.set_item("created_at_ms", r.created_at_ms)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// `server_logs` rows, newest first.
    #[pyo3(signature = (limit=None), text_signature = "(self, limit=100)")]
    fn server_logs<'py>(&self, py: Python<'py>, limit: Option<&Arg>) -> PyResult<Bound<'py, PyList>> {
        let n = limit.map_or(Ok(100), |l| count_arg(l, "limit"))?;
        let rows = self.run(py, move |e| e.observed().server_logs(n))?;
        let out = PyList::empty(py);
        for (id, r, request_id) in rows {
            let d = PyDict::new(py);
            d.set_item("id", id)?;
            d.set_item("level", r.level)?;
            d.set_item("source", r.source)?;
            d.set_item("provider", r.provider)?;
            d.set_item("model", r.model)?;
            d.set_item("event", r.event)?;
            d.set_item("request_id", request_id)?;
            d.set_item("message", r.message)?;
            d.set_item("created_at_ms", r.created_at_ms)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Rows of the snapshot as dicts (wrapped by `quotaengine.QuotaSnapshot`).
    fn _snapshot_rows<'py>(&self, py: Python<'py>) -> PyResult<(i64, Bound<'py, PyList>)> {
        let (rows, now) = self.run(py, |e| Ok((e.observed().snapshot()?, e.now_ms())))?;
        let out = PyList::empty(py);
        for r in rows {
            let d = PyDict::new(py);
            d.set_item("platform", &r.route.platform)?;
            d.set_item("model_id", &r.route.model_id)?;
            d.set_item("key_id", r.route.key_id)?;
            snapshot_limits(&d, &r)?;
            d.set_item("in_flight", r.in_flight)?;
            d.set_item("cooldown_source", r.cooldown.map(|c| c.source.as_str()))?;
            d.set_item("cooldown_expires_at_ms", r.cooldown.map(|c| c.expires_at_ms))?;
            d.set_item("exhausts_at_ms", r.exhausts_at_ms)?;
            out.append(d)?;
        }
        Ok((now, out))
    }
}
