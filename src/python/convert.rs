//! Argument conversion with the SPEC §13 rules: a bool or a float where an int is
//! asked is a TypeError, an int outside int64 an OverflowError, NaN a ValueError.
//! The value types and the limits build on these; none of them is imported here.
use super::errors::{overflow_error, type_error};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};

/// An argument as Python passed it, converted in the method's body by the rules above
/// (so that its errors name it as the SPEC says).
pub type Arg<'py> = Bound<'py, PyAny>;

/// An `int` argument (not a bool, not a float), within int64.
pub fn int_arg(obj: &Arg, name: &str) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        return Err(type_error(format!(
            "{name} must be an int, not {}",
            obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        )));
    }
    obj.extract::<i64>()
        .map_err(|_| overflow_error(format!("{name} does not fit in a signed 64-bit integer")))
}

pub fn opt_int_arg(obj: Option<&Arg>, name: &str) -> PyResult<Option<i64>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => int_arg(o, name).map(Some),
    }
}

/// A non-negative int argument.
pub fn count_arg(obj: &Arg, name: &str) -> PyResult<i64> {
    let v = int_arg(obj, name)?;
    if v < 0 {
        return Err(PyValueError::new_err(format!("{name} must be >= 0, got {v}")));
    }
    Ok(v)
}

/// A `str` argument.
pub fn str_arg<'a>(obj: &'a Bound<'_, PyAny>, name: &str) -> PyResult<&'a str> {
    let s = obj.cast::<PyString>().map_err(|_| {
        type_error(format!(
            "{name} must be a str, not {}",
            obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        ))
    })?;
    s.to_str()
}

/// SPEC 23.2: `tenant=`: a name, a sequence of up to 16 names (a name given twice
/// counts once; empty is None), or None. A value that is not a str or a sequence of
/// str is a TypeError; an empty name, one with a NUL, a pattern or 17 names a
/// ValueError.
pub fn tenants_arg(obj: Option<&Arg>) -> PyResult<crate::core::tenants::TenantList> {
    use crate::core::tenants;
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(tenants::none()) };
    let names: Vec<String> = if let Ok(s) = obj.cast::<PyString>() {
        vec![s.to_str()?.to_string()]
    } else if obj.is_instance_of::<pyo3::types::PyBytes>() || obj.is_instance_of::<pyo3::types::PyDict>() {
        return Err(type_error("tenant must be a str, a sequence of str or None"));
    } else {
        let iter =
            obj.try_iter().map_err(|_| type_error("tenant must be a str, a sequence of str or None"))?;
        let mut out = Vec::new();
        for item in iter {
            let item = item?;
            out.push(str_arg(&item, "tenant")?.to_string());
            if out.len() > 4 * tenants::MAX_TENANTS {
                break;
            }
        }
        out
    };
    Ok(tenants::parse(names)?)
}

/// A number of seconds (int or float), finite and non-negative.
pub fn seconds_arg(obj: &Arg, name: &str) -> PyResult<f64> {
    if obj.is_instance_of::<PyBool>() || !(obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyFloat>()) {
        return Err(type_error(format!("{name} must be a number of seconds")));
    }
    let v: f64 = obj.extract()?;
    if !v.is_finite() {
        return Err(PyValueError::new_err(format!("{name} must be finite")));
    }
    if v < 0.0 {
        return Err(PyValueError::new_err(format!("{name} must be >= 0")));
    }
    Ok(v)
}

/// An amount of dollars (SPEC 23.1's prices): a number (an int, a float, or any value
/// Python turns into a float with `__float__` or `__index__`: `Decimal`, `Fraction`,
/// numpy's), not a bool. The core refuses a negative, NaN or infinite one
/// (ValueError); an int too large for a float is an OverflowError.
pub fn dollars_arg(obj: &Arg, name: &str) -> PyResult<f64> {
    let not_a_number = || {
        type_error(format!(
            "{name} must be a number of dollars, not {}",
            obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        ))
    };
    if obj.is_instance_of::<PyBool>() || obj.is_instance_of::<PyString>() {
        return Err(not_a_number());
    }
    obj.extract::<f64>().map_err(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py()) {
            overflow_error(format!("{name} is beyond what a float can hold"))
        } else {
            not_a_number()
        }
    })
}

/// A fraction in `[0, 1)` (int or float, not a bool; SPEC 22.1's reserve).
pub fn fraction_arg(obj: &Arg, name: &str) -> PyResult<f64> {
    if obj.is_instance_of::<PyBool>() || !(obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyFloat>()) {
        return Err(type_error(format!(
            "{name} must be a float in [0, 1), not {}",
            obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        )));
    }
    // An int too large for a float is out of the range all the same (a ValueError).
    let v: f64 = obj.extract().map_err(|_| PyValueError::new_err(format!("{name} must be in [0, 1)")))?;
    if !v.is_finite() || !(0.0..1.0).contains(&v) {
        return Err(PyValueError::new_err(format!("{name} must be in [0, 1), got {v}")));
    }
    Ok(v)
}

/// SPEC 22.1's `priority`: an int >= 0.
pub fn priority_arg(obj: &Arg) -> PyResult<i64> {
    let v = int_arg(obj, "priority")?;
    if v < 0 {
        return Err(PyValueError::new_err(format!("priority must be >= 0 (0 the most important), got {v}")));
    }
    Ok(v)
}

/// `priority=` of a lease: as [`priority_arg`], None meaning 0.
pub fn opt_priority_arg(obj: Option<&Arg>) -> PyResult<i64> {
    obj.filter(|p| !p.is_none()).map_or(Ok(0), priority_arg)
}

/// The longest wait or probe interval the engine takes, in seconds (SPEC 18.1):
/// beyond it an `OverflowError`.
pub const MAX_SECONDS: f64 = 1e12;

/// A span of seconds (int or float), finite, non-negative and at most `MAX_SECONDS`.
pub fn duration_arg(obj: &Arg, name: &str) -> PyResult<std::time::Duration> {
    let v = seconds_arg(obj, name)?;
    if v > MAX_SECONDS {
        return Err(overflow_error(format!("{name} must be at most 10**12 seconds")));
    }
    std::time::Duration::try_from_secs_f64(v).map_err(|e| overflow_error(format!("{name}: {e}")))
}

/// One limit: None or an int >= 0.
pub fn opt_limit(v: &Arg, name: &str) -> PyResult<Option<i64>> {
    if v.is_none() {
        return Ok(None);
    }
    if v.is_instance_of::<PyFloat>() {
        let f: f64 = v.extract()?;
        if !f.is_finite() {
            return Err(PyValueError::new_err(format!("{name} must be finite")));
        }
    }
    count_arg(v, name).map(Some)
}

/// The tokens of a call (SPEC §14.4): `None` when none of the four is given.
pub fn token_use_arg(
    tokens: Option<&Arg>, input: Option<&Arg>, output: Option<&Arg>, cached: Option<&Arg>,
) -> PyResult<Option<crate::core::engine::TokenUse>> {
    let get = |v: Option<&Arg>, name: &str| match v.filter(|v| !v.is_none()) {
        Some(v) => count_arg(v, name).map(Some),
        None => Ok(None),
    };
    let used = crate::core::engine::TokenUse {
        tokens: get(tokens, "tokens")?,
        kinds: crate::core::store::TokenKinds {
            input: get(input, "input_tokens")?,
            output: get(output, "output_tokens")?,
            cached: get(cached, "cached_tokens")?,
        },
    };
    Ok((used.tokens.is_some() || !used.kinds.is_empty()).then_some(used))
}

/// `retry_after=`: header text, or a number of seconds.
pub fn retry_after_arg(obj: Option<&Arg>) -> PyResult<Option<crate::core::engine::RetryAfter>> {
    use crate::core::engine::RetryAfter;
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Some(RetryAfter::Text(s.to_str()?.to_string())));
    }
    let secs = seconds_arg(obj, "retry_after")?;
    let ms = (secs * 1000.0).round().min(crate::core::clock::DAY_MS as f64);
    Ok(Some(RetryAfter::Millis(ms as i64)))
}

/// `kind=`: one of the SPEC §6.2 kinds.
pub fn kind_arg(obj: Option<&Arg>) -> PyResult<Option<crate::core::parse::FailureKind>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
    let s = str_arg(obj, "kind")?;
    s.parse().map(Some).map_err(PyValueError::new_err)
}

/// A failure's keyword arguments (`record_failure` sets its `limits=` after them).
pub fn failure_args(
    status: Option<&Arg>, retry_after: Option<&Arg>, message: Option<&Arg>, kind: Option<&Arg>,
) -> PyResult<crate::core::engine::FailureInput> {
    Ok(crate::core::engine::FailureInput {
        status: opt_int_arg(status, "status")?,
        retry_after: retry_after_arg(retry_after)?,
        message: match message.filter(|m| !m.is_none()) {
            Some(m) => Some(str_arg(m, "message")?.to_string()),
            None => None,
        },
        kind: kind_arg(kind)?,
        limits: None,
        headers: Vec::new(),
    })
}

/// `headers`: a mapping of str to str (httpx, requests and SDK header objects too).
pub fn headers_arg(headers: &Arg) -> PyResult<Vec<(String, String)>> {
    let mapping = headers
        .cast::<pyo3::types::PyMapping>()
        .map_err(|_| type_error("headers must be a mapping of str to str"))?;
    let mut hs: Vec<(String, String)> = Vec::new();
    for item in mapping.items()?.iter() {
        let (name, value): (String, String) =
            item.extract().map_err(|_| type_error("headers must map str to str"))?;
        hs.push((name, value));
    }
    Ok(hs)
}
