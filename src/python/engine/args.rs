//! The binding's argument conversions shared by the engine's methods: routes, waits,
//! the lease operations, and the dicts `usage()` answers.
use crate::core::admission::Estimate;
use crate::core::engine::{BatchOp, UsageReport};
use crate::core::types::{CapSetting, Reason, Route, Strategy};
use crate::python::convert::{
    count_arg, duration_arg, int_arg, limits_arg, opt_limit, opt_priority_arg, str_arg,
};
use crate::python::errors::{to_pyerr, type_error};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::time::Duration;

pub(super) fn route(
    platform: &Bound<'_, PyAny>,
    model_id: &Bound<'_, PyAny>,
    key_id: &Bound<'_, PyAny>,
) -> PyResult<Route> {
    Route::new(str_arg(platform, "platform")?, str_arg(model_id, "model_id")?, int_arg(key_id, "key_id")?)
        .map_err(to_pyerr)
}

/// A provider-level route: (platform, key_id) with no model.
pub(super) fn account(platform: &Bound<'_, PyAny>, key_id: &Bound<'_, PyAny>) -> PyResult<Route> {
    let platform = str_arg(platform, "platform")?;
    crate::core::types::check_name("platform", platform).map_err(to_pyerr)?;
    Ok(Route { platform: platform.to_string(), model_id: String::new(), key_id: int_arg(key_id, "key_id")? })
}

pub(super) fn window<'py>(py: Python<'py>, used: i64, limit: Option<i64>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("used", used)?;
    d.set_item("limit", limit)?;
    Ok(d)
}

/// SPEC §4's `usage()` dict from the core's list of limits: the classic four always
/// (`rpm`, `rpd`, `tpm`, `tpd`), `in_flight`, then every other declared limit by its
/// reason, in gate order.
pub(super) fn usage_dict<'py>(py: Python<'py>, u: &UsageReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for r in [Reason::Rpm, Reason::Rpd, Reason::Tpm, Reason::Tpd] {
        let w = u.window(&r);
        d.set_item(r.as_str(), window(py, w.used, w.limit)?)?;
    }
    d.set_item("in_flight", u.in_flight)?;
    for (reason, w) in u.others() {
        d.set_item(reason, window(py, w.used, w.limit)?)?;
    }
    Ok(d)
}

pub(super) fn cap_setting(v: &Bound<'_, PyAny>, name: &str) -> PyResult<CapSetting> {
    Ok(match opt_limit(v, name)? {
        None => CapSetting::NoCap,
        Some(c) => CapSetting::Cap(c),
    })
}

/// `lease()`'s arguments: the operation, its route, the estimate, the wait.
#[allow(clippy::too_many_arguments)]
pub(super) fn lease_op(
    platform: &Bound<'_, PyAny>,
    model_id: &Bound<'_, PyAny>,
    key_id: &Bound<'_, PyAny>,
    estimated_tokens: Option<&Bound<'_, PyAny>>,
    limits: Option<&Bound<'_, PyAny>>,
    estimated_output_tokens: Option<&Bound<'_, PyAny>>,
    wait_s: Option<&Bound<'_, PyAny>>,
    priority: Option<&Bound<'_, PyAny>>,
) -> PyResult<(BatchOp, Route, i64, Duration)> {
    let r = route(platform, model_id, key_id)?;
    let est = estimated_tokens.map_or(Ok(0), |t| count_arg(t, "estimated_tokens"))?;
    let output = estimated_output_tokens.map_or(Ok(0), |t| count_arg(t, "estimated_output_tokens"))?;
    let l = limits_arg(limits)?;
    let wait = wait_arg(wait_s)?;
    let priority = opt_priority_arg(priority)?;
    let op = BatchOp::Lease {
        route: r.clone(),
        est: Estimate { tokens: est, output },
        limits: l,
        check: true,
        priority,
    };
    Ok((op, r, est, wait))
}

/// `wait_s`: seconds, finite and >= 0 (None: 0).
pub(super) fn wait_arg(wait_s: Option<&Bound<'_, PyAny>>) -> PyResult<Duration> {
    match wait_s.filter(|w| !w.is_none()) {
        None => Ok(Duration::ZERO),
        Some(w) => duration_arg(w, "wait_s"),
    }
}

/// `routes`: an iterable of (platform, model_id, key_id).
pub(super) fn routes_arg(routes: &Bound<'_, PyAny>) -> PyResult<Vec<Route>> {
    if routes.is_instance_of::<pyo3::types::PyString>() || routes.is_instance_of::<pyo3::types::PyBytes>() {
        return Err(type_error(
            "routes must be an iterable of (platform, model_id, key_id) tuples, not a str",
        ));
    }
    let it = routes
        .try_iter()
        .map_err(|_| type_error("routes must be an iterable of (platform, model_id, key_id) tuples"))?;
    let mut out = Vec::new();
    for item in it {
        let item = item?;
        let bad = || {
            type_error(format!(
                "each route must be a (platform, model_id, key_id) tuple, got {}",
                item.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        };
        // A tuple (the common case) is read in place; a list is accepted too.
        let r = if let Ok(t) = item.cast::<pyo3::types::PyTuple>() {
            if t.len() != 3 {
                return Err(bad());
            }
            route(&t.get_item(0)?, &t.get_item(1)?, &t.get_item(2)?)?
        } else if let Ok(l) = item.cast::<PyList>() {
            if l.len() != 3 {
                return Err(bad());
            }
            route(&l.get_item(0)?, &l.get_item(1)?, &l.get_item(2)?)?
        } else {
            return Err(bad());
        };
        out.push(r);
    }
    if out.is_empty() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "routes is empty: give at least one (platform, model_id, key_id)",
        ));
    }
    Ok(out)
}

/// `lease_any`'s arguments: the candidates, the estimate, the strategy, the wait.
pub(super) fn lease_any_op(
    routes: &Bound<'_, PyAny>,
    estimated_tokens: Option<&Bound<'_, PyAny>>,
    estimated_output_tokens: Option<&Bound<'_, PyAny>>,
    strategy: Option<&Bound<'_, PyAny>>,
    wait_s: Option<&Bound<'_, PyAny>>,
    priority: Option<&Bound<'_, PyAny>>,
) -> PyResult<(BatchOp, Vec<Route>, i64, Duration)> {
    let rs = routes_arg(routes)?;
    let est = estimated_tokens.map_or(Ok(0), |t| count_arg(t, "estimated_tokens"))?;
    let output = estimated_output_tokens.map_or(Ok(0), |t| count_arg(t, "estimated_output_tokens"))?;
    let strategy: Strategy = match strategy.filter(|s| !s.is_none()) {
        Some(s) => str_arg(s, "strategy")?.parse().map_err(to_pyerr)?,
        None => Strategy::default(),
    };
    let wait = wait_arg(wait_s)?;
    let priority = opt_priority_arg(priority)?;
    let op =
        BatchOp::LeaseAny { routes: rs.clone(), est: Estimate { tokens: est, output }, strategy, priority };
    Ok((op, rs, est, wait))
}
