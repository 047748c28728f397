//! What an engine reports: forecasts, usage events, server logs, quota headers,
//! cooldown lists and the snapshot rows.
use super::args::route;
use super::PyQuotaEngine;
use crate::core::store::UsageFilter;
use crate::python::convert::{count_arg, int_arg, opt_int_arg, str_arg};
use crate::python::types::PyCooldown;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

pub(super) fn forecast<'py>(
    this: &PyQuotaEngine,
    py: Python<'py>,
    platform: &Bound<'py, PyAny>,
    model_id: &Bound<'py, PyAny>,
    key_id: &Bound<'py, PyAny>,
    lookback_ms: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let r = route(platform, model_id, key_id)?;
    let lookback = match lookback_ms.filter(|l| !l.is_none()) {
        None => crate::core::engine::DEFAULT_LOOKBACK_MS,
        Some(l) => int_arg(l, "lookback_ms")?,
    };
    let f = this.run(py, move |e| e.observed().forecast(&r, lookback))?;
    let d = PyDict::new(py);
    for (k, t) in f {
        d.set_item(k, t)?;
    }
    Ok(d)
}

pub(super) fn active_cooldowns(
    this: &PyQuotaEngine,
    py: Python<'_>,
    key_ids: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<PyCooldown>> {
    let ids: Option<Vec<i64>> = match key_ids {
        Some(k) if !k.is_none() => {
            Some(k.try_iter()?.map(|i| int_arg(&i?, "key_ids[]")).collect::<PyResult<Vec<i64>>>()?)
        }
        _ => None,
    };
    let (v, now) = this.run(py, move |e| Ok((e.failures().active_cooldowns(ids.as_deref())?, e.now_ms())))?;
    Ok(v.into_iter().map(|c| PyCooldown::new(c, now)).collect())
}

pub(super) fn record_quota_headers(
    this: &PyQuotaEngine,
    py: Python<'_>,
    platform: &Bound<'_, PyAny>,
    key_id: &Bound<'_, PyAny>,
    headers: &Bound<'_, PyAny>,
    model_id: Option<&Bound<'_, PyAny>>,
    status: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<crate::python::types::PyQuotaObservation>> {
    let p = str_arg(platform, "platform")?;
    let k = int_arg(key_id, "key_id")?;
    let m = match model_id.filter(|m| !m.is_none()) {
        Some(m) => Some(str_arg(m, "model_id")?),
        None => None,
    };
    let st = opt_int_arg(status, "status")?.unwrap_or(200);
    let hs = crate::python::convert::headers_arg(headers)?;
    let obs = this.run(py, |e| e.observed().record_quota_headers(p, k, &hs, m, st))?;
    Ok(obs.into_iter().map(crate::python::types::PyQuotaObservation).collect())
}

pub(super) fn key_quota_headroom<'py>(
    this: &PyQuotaEngine,
    py: Python<'py>,
    platform: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let p = str_arg(platform, "platform")?;
    let v = this.run(py, |e| e.observed().key_quota_headroom(p))?;
    let d = PyDict::new(py);
    for (k, h) in v {
        d.set_item(k, h)?;
    }
    Ok(d)
}

pub(super) fn usage_events<'py>(
    this: &PyQuotaEngine,
    py: Python<'py>,
    since_ms: Option<&Bound<'py, PyAny>>,
    until_ms: Option<&Bound<'py, PyAny>>,
    platform: Option<String>,
    model_id: Option<String>,
    key_id: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    let f = UsageFilter {
        since_ms: opt_int_arg(since_ms, "since_ms")?,
        until_ms: opt_int_arg(until_ms, "until_ms")?,
        platform,
        model_id,
        key_id: opt_int_arg(key_id, "key_id")?,
    };
    let rows = this.run(py, move |e| e.observed().usage_events(&f))?;
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
        d.set_item("created_at_ms", r.created_at_ms)?;
        out.append(d)?;
    }
    Ok(out)
}

pub(super) fn server_logs<'py>(
    this: &PyQuotaEngine,
    py: Python<'py>,
    limit: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    let n = limit.map_or(Ok(100), |l| count_arg(l, "limit"))?;
    let rows = this.run(py, move |e| e.observed().server_logs(n))?;
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

pub(super) fn snapshot_rows<'py>(
    this: &PyQuotaEngine,
    py: Python<'py>,
) -> PyResult<(i64, Bound<'py, PyList>)> {
    let (rows, now) = this.run(py, |e| Ok((e.observed().snapshot()?, e.now_ms())))?;
    let out = PyList::empty(py);
    for r in rows {
        let d = PyDict::new(py);
        d.set_item("platform", &r.route.platform)?;
        d.set_item("model_id", &r.route.model_id)?;
        d.set_item("key_id", r.route.key_id)?;
        d.set_item("rpm_used", r.rpm_used)?;
        d.set_item("rpm_limit", r.limits.rpm)?;
        d.set_item("rpd_used", r.rpd_used)?;
        d.set_item("rpd_limit", r.limits.rpd)?;
        d.set_item("tpm_used", r.tpm_used)?;
        d.set_item("tpm_limit", r.limits.tpm)?;
        d.set_item("tpd_used", r.tpd_used)?;
        d.set_item("tpd_limit", r.limits.tpd)?;
        d.set_item("used_fraction", r.used_fraction())?;
        // SPEC §14.1: every other declared limit, as (reason, used, limit).
        d.set_item("declared", r.others.clone())?;
        d.set_item("in_flight", r.in_flight)?;
        d.set_item("cooldown_source", r.cooldown.map(|c| c.source.as_str()))?;
        d.set_item("cooldown_expires_at_ms", r.cooldown.map(|c| c.expires_at_ms))?;
        d.set_item("exhausts_at_ms", r.exhausts_at_ms)?;
        out.append(d)?;
    }
    Ok((now, out))
}
