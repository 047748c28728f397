//! Limits as Python spells them (SPEC §4, §8, §14.1): the `Limit` and `Limits` values,
//! `ProviderCaps`, and the `limits=` argument lowered to the core's `LimitSet`.
use super::convert::{dollars_arg, int_arg, opt_limit, str_arg, Arg};
use super::errors::{shield, type_error};
use crate::core::engine::{SnapshotRow, UsageReport};
use crate::core::limits::{
    cap_values, classic_slot, classic_window, ClassicValues, Limit, LimitSet, Metric, WindowSpec, CAPS,
    CLASSIC, DAY, MINUTE,
};
use crate::core::money::micro_dollars;
use crate::core::types::{check_name, CapSetting};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

/// `None` or the number, as the reprs print an optional int.
pub(crate) fn opt(v: Option<i64>) -> String {
    v.map_or_else(|| "None".to_string(), |v| v.to_string())
}

/// One limit as data (SPEC §14.1): at most `limit` of `metric` per `per`, counted at
/// `scope`. `per` is "minute", "day", "week", "month" or a sliding width "<N>s",
/// "<N>m", "<N>h", "<N>d" from 1s to 31d; `metric` is "requests", "tokens",
/// "input_tokens", "output_tokens" or "cost" (micro-dollars, SPEC 23.1: see
/// `Limit.dollars`); `scope` is "account" (default) or "key".
#[pyclass(frozen, eq, hash, name = "Limit", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyLimit {
    #[pyo3(get)]
    metric: &'static str,
    #[pyo3(get)]
    limit: i64,
    #[pyo3(get)]
    per: String,
    #[pyo3(get)]
    scope: &'static str,
    /// The limit as the core reads it.
    core: Limit,
}

impl From<Limit> for PyLimit {
    fn from(l: Limit) -> Self {
        Self {
            metric: l.metric.as_str(),
            limit: l.limit,
            per: l.per.to_string(),
            scope: l.scope.as_str(),
            core: l,
        }
    }
}

#[pymethods]
impl PyLimit {
    #[new]
    #[pyo3(signature = (metric, limit, per, scope=None), text_signature = "(metric, limit, per, scope='account')")]
    fn new(metric: &Arg, limit: &Arg, per: &Arg, scope: Option<&Arg>) -> PyResult<Self> {
        shield(|| {
            let metric = str_arg(metric, "metric")?;
            let limit = int_arg(limit, "limit")?;
            let per = str_arg(per, "per")?;
            let scope = match scope {
                Some(s) => str_arg(s, "scope")?,
                None => "account",
            };
            Ok(Limit::parse(metric, limit, per, scope)?.into())
        })
    }

    /// SPEC 23.1: a `cost` limit of `amount` dollars per `per` (`round(amount ×
    /// 10^6)` micro-dollars).
    #[staticmethod]
    #[pyo3(signature = (amount, per, scope=None), text_signature = "(amount, per, scope='account')")]
    fn dollars(amount: &Arg, per: &Arg, scope: Option<&Arg>) -> PyResult<Self> {
        let amount = dollars_arg(amount, "amount")?;
        shield(|| {
            let per = str_arg(per, "per")?;
            let scope = match scope {
                Some(s) => str_arg(s, "scope")?,
                None => "account",
            };
            let limit = micro_dollars("amount", amount)?;
            Ok(Limit::parse("cost", limit, per, scope)?.into())
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "Limit(metric={:?}, limit={}, per={:?}, scope={:?})",
            self.metric, self.limit, self.per, self.scope
        )
    }
}

/// A model's window limits; `None` is unlimited.
#[pyclass(frozen, eq, hash, get_all, name = "Limits", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyLimits {
    rpm: Option<i64>,
    rpd: Option<i64>,
    tpm: Option<i64>,
    tpd: Option<i64>,
}

impl From<ClassicValues> for PyLimits {
    fn from([rpm, rpd, tpm, tpd]: ClassicValues) -> Self {
        Self { rpm, rpd, tpm, tpd }
    }
}

impl From<&PyLimits> for ClassicValues {
    fn from(l: &PyLimits) -> Self {
        [l.rpm, l.rpd, l.tpm, l.tpd]
    }
}

#[pymethods]
impl PyLimits {
    #[new]
    #[pyo3(signature = (rpm=None, rpd=None, tpm=None, tpd=None))]
    fn new(rpm: Option<&Arg>, rpd: Option<&Arg>, tpm: Option<&Arg>, tpd: Option<&Arg>) -> PyResult<Self> {
        let get = |v: Option<&Arg>, n: &str| v.map_or(Ok(None), |v| opt_limit(v, n));
        Ok(Self {
            rpm: get(rpm, "rpm")?,
            rpd: get(rpd, "rpd")?,
            tpm: get(tpm, "tpm")?,
            tpd: get(tpd, "tpd")?,
        })
    }

    /// The limits as a dict {"rpm": .., "rpd": .., "tpm": .., "tpd": ..}.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("rpm", self.rpm)?;
        d.set_item("rpd", self.rpd)?;
        d.set_item("tpm", self.tpm)?;
        d.set_item("tpd", self.tpd)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "Limits(rpm={}, rpd={}, tpm={}, tpd={})",
            opt(self.rpm),
            opt(self.rpd),
            opt(self.tpm),
            opt(self.tpd)
        )
    }
}

/// Provider-wide caps of a platform; `None` is no cap.
#[pyclass(frozen, eq, get_all, name = "ProviderCaps", module = "quotaengine")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyProviderCaps {
    daily_requests: Option<i64>,
    minute_requests: Option<i64>,
    daily_tokens: Option<i64>,
}

/// SPEC §8's cap spellings (`ProviderCaps`' fields, `set_provider_caps`' keywords) and
/// the limits at provider scope they stand for.
const CAP_NAMES: [(&str, Metric, WindowSpec); CAPS] = [
    ("daily_requests", Metric::Requests, DAY),
    ("minute_requests", Metric::Requests, MINUTE),
    ("daily_tokens", Metric::Tokens, DAY),
];

impl From<LimitSet> for PyProviderCaps {
    fn from(c: LimitSet) -> Self {
        let [daily_requests, minute_requests, daily_tokens] = CAP_NAMES.map(|(_, m, w)| c.cap(m, w));
        Self { daily_requests, minute_requests, daily_tokens }
    }
}

#[pymethods]
impl PyProviderCaps {
    fn __repr__(&self) -> String {
        format!(
            "ProviderCaps(daily_requests={}, minute_requests={}, daily_tokens={})",
            opt(self.daily_requests),
            opt(self.minute_requests),
            opt(self.daily_tokens)
        )
    }
}

/// `set_provider_caps`' keywords as the core's settings, one per provider cap: an int
/// sets a cap, None means no cap, an omitted keyword keeps what is set.
pub fn cap_settings(caps: Option<&Bound<'_, PyDict>>) -> PyResult<[Option<CapSetting>; CAPS]> {
    let mut given = Vec::new();
    for (k, v) in caps.iter().flat_map(|c| c.iter()) {
        let name: String = k.extract()?;
        let Some(&(_, metric, window)) = CAP_NAMES.iter().find(|c| c.0 == name) else {
            return Err(type_error(format!(
                "set_provider_caps() got an unexpected keyword argument {name:?}"
            )));
        };
        let setting = match opt_limit(&v, &name)? {
            None => CapSetting::NoCap,
            Some(c) => CapSetting::Cap(c),
        };
        given.push(((metric, window), Some(setting)));
    }
    Ok(cap_values(given))
}

/// `set_model_limits`' declaration: the classic keywords and `limits=`, a keyword and a
/// limit for the same window an error (after the names are checked, as the core does).
pub fn declaration(
    platform: &str, model_id: &str, classic: ClassicValues, others: Vec<Limit>,
) -> PyResult<LimitSet> {
    let check = || -> crate::core::error::Result<LimitSet> {
        check_name("platform", platform)?;
        check_name("model_id", model_id)?;
        LimitSet::with_classic(classic, others)
    };
    check().map_err(PyErr::from)
}

/// `limits=`: None, a `Limits`, a dict with keys among rpm, rpd, tpm, tpd, or an
/// iterable of `Limit` (SPEC §14.1).
pub fn limits_arg(obj: Option<&Arg>) -> PyResult<Option<LimitSet>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
    if let Ok(l) = obj.cast::<PyLimits>() {
        return Ok(Some(LimitSet::from_classic(l.get().into())));
    }
    if obj.is_instance_of::<PyDict>() {
        return LimitSet::with_classic(classic_limits_dict(obj)?, Vec::new()).map(Some).map_err(PyErr::from);
    }
    let list = limit_list_arg(obj, "limits")?;
    LimitSet::new(list).map(Some).map_err(PyErr::from)
}

/// An iterable of `Limit` (not a str, not a single `Limit`).
pub fn limit_list_arg(obj: &Arg, name: &str) -> PyResult<Vec<Limit>> {
    let expected = || {
        type_error(format!(
            "{name} must be a Limits, a dict with rpm/rpd/tpm/tpd, an iterable of Limit, or None"
        ))
    };
    if obj.is_instance_of::<PyString>() || obj.cast::<PyLimit>().is_ok() {
        return Err(expected());
    }
    let iter = obj.try_iter().map_err(|_| expected())?;
    let mut out = Vec::new();
    for item in iter {
        let item = item?;
        let l = item.cast::<PyLimit>().map_err(|_| {
            type_error(format!(
                "{name} must hold Limit values, not {}",
                item.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ))
        })?;
        out.push(l.get().core.clone());
    }
    Ok(out)
}

/// A dict with keys among rpm, rpd, tpm, tpd.
fn classic_limits_dict(obj: &Arg) -> PyResult<ClassicValues> {
    let dict = obj
        .cast::<PyDict>()
        .map_err(|_| type_error("limits must be a Limits, a dict with rpm/rpd/tpm/tpd, or None"))?;
    let mut l: ClassicValues = [None; CLASSIC];
    for (k, v) in dict.iter() {
        let key: String = k.extract().map_err(|_| type_error("limits keys must be str"))?;
        let Some(slot) = classic_window(&key).and_then(|(metric, window)| classic_slot(metric, window))
        else {
            return Err(PyValueError::new_err(format!(
                "unknown limit {key:?}; expected rpm, rpd, tpm or tpd"
            )));
        };
        l[slot] = opt_limit(&v, &key)?;
    }
    Ok(l)
}

fn window<'py>(py: Python<'py>, used: i64, limit: Option<i64>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("used", used)?;
    d.set_item("limit", limit)?;
    Ok(d)
}

/// The worst used/limit over the declared windows (a limit of 0 counts as full);
/// `None` without limits (SPEC §9, §12).
fn used_fraction(pairs: &[(i64, Option<i64>)]) -> Option<f64> {
    pairs
        .iter()
        .filter_map(|&(used, limit)| limit.map(|l| if l <= 0 { 1.0 } else { used as f64 / l as f64 }))
        .fold(None, |acc: Option<f64>, f| Some(acc.map_or(f, |a| a.max(f))))
}

/// SPEC §4's `usage()` dict from the core's list of limits: the classic four always
/// (`rpm`, `rpd`, `tpm`, `tpd`), `in_flight`, then every other declared limit by its
/// reason, in gate order.
pub(crate) fn usage_dict<'py>(py: Python<'py>, u: &UsageReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let windows: Vec<_> = u.windows().collect();
    let (classic, others) = windows.split_at(CLASSIC);
    for (reason, w) in classic {
        d.set_item(reason, window(py, w.used, w.limit)?)?;
    }
    d.set_item("in_flight", u.in_flight)?;
    for (reason, w) in others {
        d.set_item(reason, window(py, w.used, w.limit)?)?;
    }
    Ok(d)
}

/// SPEC §9's snapshot row fields of the limits: `rpm_used`, `rpm_limit` … (the route's
/// own use, the model's limit), `used_fraction`, and `declared`.
pub(crate) fn snapshot_limits(d: &Bound<'_, PyDict>, r: &SnapshotRow) -> PyResult<()> {
    // SPEC §9's classic windows (the route's own use, the model's limit), then SPEC
    // §14.1's every other declared limit, as (reason, used, limit).
    let windows = r.windows();
    let (classic, others) = windows.split_at(CLASSIC);
    for (name, used, limit) in classic {
        d.set_item(format!("{name}_used"), used)?;
        d.set_item(format!("{name}_limit"), limit)?;
    }
    let fractions: Vec<(i64, Option<i64>)> = windows.iter().map(|&(_, used, limit)| (used, limit)).collect();
    d.set_item("used_fraction", used_fraction(&fractions))?;
    let others: Vec<(&str, i64, i64)> =
        others.iter().map(|&(reason, used, limit)| (reason, used, limit.unwrap_or_default())).collect();
    d.set_item("declared", others)?;
    Ok(())
}
