//! Keys, models and provider caps (SPEC §4, §8, §14): what `register_key`,
//! `set_model_limits` and `set_provider_caps` convert.
use super::args::cap_setting;
use super::PyQuotaEngine;
use crate::core::types::{CapSetting, KeyInfo, ModelInfo};
use crate::python::convert::{int_arg, limit_list_arg, opt_limit, str_arg};
use pyo3::prelude::*;
use pyo3::types::PyDict;

#[allow(clippy::too_many_arguments)]
pub(super) fn register_key(
    this: &PyQuotaEngine,
    py: Python<'_>,
    key_id: &Bound<'_, PyAny>,
    platform: &Bound<'_, PyAny>,
    base_url: Option<String>,
    label: Option<String>,
    enabled: bool,
    account: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let account = match account.filter(|a| !a.is_none()) {
        Some(a) => Some(str_arg(a, "account")?.to_string()),
        None => None,
    };
    let key = KeyInfo {
        key_id: int_arg(key_id, "key_id")?,
        platform: str_arg(platform, "platform")?.to_string(),
        base_url,
        label,
        enabled,
        account,
        concurrency_cap: None, // the engine keeps the key's configured cap
    };
    this.run(py, move |e| e.config().register_key(key))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn set_model_limits(
    this: &PyQuotaEngine,
    py: Python<'_>,
    platform: &Bound<'_, PyAny>,
    model_id: &Bound<'_, PyAny>,
    rpm: Option<&Bound<'_, PyAny>>,
    rpd: Option<&Bound<'_, PyAny>>,
    tpm: Option<&Bound<'_, PyAny>>,
    tpd: Option<&Bound<'_, PyAny>>,
    monthly_token_budget: Option<String>,
    limits: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let others = match limits.filter(|l| !l.is_none()) {
        Some(l) => limit_list_arg(l, "limits")?,
        None => Vec::new(),
    };
    let get = |v: Option<&Bound<'_, PyAny>>, n: &str| v.map_or(Ok(None), |v| opt_limit(v, n));
    let model = ModelInfo {
        platform: str_arg(platform, "platform")?.to_string(),
        model_id: str_arg(model_id, "model_id")?.to_string(),
        limits: crate::core::types::Limits {
            rpm: get(rpm, "rpm")?,
            rpd: get(rpd, "rpd")?,
            tpm: get(tpm, "tpm")?,
            tpd: get(tpd, "tpd")?,
        },
        others,
        monthly_token_budget,
    };
    this.run(py, move |e| e.config().set_model_limits(model))
}

pub(super) fn set_provider_caps(
    this: &PyQuotaEngine,
    py: Python<'_>,
    platform: &Bound<'_, PyAny>,
    caps: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    let mut slots: [Option<CapSetting>; 3] = [None; 3];
    if let Some(caps) = caps {
        for (k, v) in caps.iter() {
            let name: String = k.extract()?;
            let i = match name.as_str() {
                "daily_requests" => 0,
                "minute_requests" => 1,
                "daily_tokens" => 2,
                _ => {
                    return Err(crate::python::errors::type_error(format!(
                        "set_provider_caps() got an unexpected keyword argument {name:?}"
                    )))
                }
            };
            slots[i] = Some(cap_setting(&v, &name)?);
        }
    }
    let p = str_arg(platform, "platform")?;
    this.run(py, |e| e.observed().set_provider_caps(p, slots[0], slots[1], slots[2]))
}

pub(super) fn set_platform_calendar(
    this: &PyQuotaEngine,
    py: Python<'_>,
    platform: &Bound<'_, PyAny>,
    tz: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let p = str_arg(platform, "platform")?;
    let z = match tz {
        Some(t) if !t.is_none() => Some(str_arg(t, "tz")?),
        _ => None,
    };
    this.run(py, |e| e.config().set_platform_calendar(p, z))
}
