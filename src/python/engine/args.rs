//! The argument conversions the engine's topics share: a route, a provider-level
//! route, the candidates of `lease_any`, a wait.
use crate::core::types::{check_name, Exclusion, Route};
use crate::python::convert::{duration_arg, int_arg, str_arg, Arg};
use crate::python::errors::type_error;
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::time::Duration;

pub(super) fn route(platform: &Arg, model_id: &Arg, key_id: &Arg) -> PyResult<Route> {
    Ok(Route::new(
        str_arg(platform, "platform")?,
        str_arg(model_id, "model_id")?,
        int_arg(key_id, "key_id")?,
    )?)
}

/// A provider-level route: (platform, key_id) with no model.
pub(super) fn account(platform: &Arg, key_id: &Arg) -> PyResult<Route> {
    let platform = str_arg(platform, "platform")?;
    check_name("platform", platform)?;
    Ok(Route { platform: platform.to_string(), model_id: String::new(), key_id: int_arg(key_id, "key_id")? })
}

/// `wait_s`: seconds, finite and >= 0 (None: 0).
pub(super) fn wait_arg(wait_s: Option<&Arg>) -> PyResult<Duration> {
    match wait_s.filter(|w| !w.is_none()) {
        None => Ok(Duration::ZERO),
        Some(w) => duration_arg(w, "wait_s"),
    }
}

/// `routes`: an iterable of (platform, model_id, key_id).
pub(super) fn routes_arg(routes: &Arg) -> PyResult<Vec<Route>> {
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

/// `exclude` of `lease_any` (SPEC 24.7): None, or an iterable of routes
/// (platform, model_id, key_id), models (platform, model_id) and platforms (platform,).
pub(super) fn exclude_arg(exclude: Option<&Arg>) -> PyResult<Vec<Exclusion>> {
    let Some(exclude) = exclude.filter(|x| !x.is_none()) else { return Ok(Vec::new()) };
    let what = "exclude must be an iterable of (platform, model_id, key_id), (platform, model_id) or \
                (platform,) tuples";
    if exclude.is_instance_of::<pyo3::types::PyString>() || exclude.is_instance_of::<pyo3::types::PyBytes>() {
        return Err(type_error(format!("{what}, not a str")));
    }
    let it = exclude.try_iter().map_err(|_| type_error(what))?;
    let mut out = Vec::new();
    for item in it {
        let item = item?;
        let bad = || {
            type_error(format!(
                "each exclusion must be a (platform, model_id, key_id), (platform, model_id) or (platform,) \
                 tuple, got {}",
                item.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        };
        let parts: Vec<Bound<'_, PyAny>> = if let Ok(t) = item.cast::<pyo3::types::PyTuple>() {
            t.iter().collect()
        } else if let Ok(l) = item.cast::<PyList>() {
            l.iter().collect()
        } else {
            return Err(bad());
        };
        let x = match parts.as_slice() {
            [p, m, k] => Exclusion::Route(route(p, m, k)?),
            [p, m] => Exclusion::model(str_arg(p, "platform")?, str_arg(m, "model_id")?)?,
            [p] => Exclusion::platform(str_arg(p, "platform")?)?,
            _ => return Err(bad()),
        };
        if !out.contains(&x) {
            out.push(x);
        }
    }
    Ok(out)
}
