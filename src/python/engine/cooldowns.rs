//! Cooldowns (SPEC §6): benching a route by hand, reading the benches, clearing them.
use super::args::route;
use super::PyQuotaEngine;
use crate::core::types::{Cooldown, CooldownSource};
use crate::python::convert::{count_arg, int_arg, Arg};
use crate::python::types::PyCooldown;
use pyo3::prelude::*;

/// The benches as read at `now`.
fn read(v: Vec<Cooldown>, now: i64) -> Vec<PyCooldown> {
    v.into_iter().map(|c| PyCooldown::new(c, now)).collect()
}

#[pymethods]
impl PyQuotaEngine {
    #[pyo3(signature = (platform, model_id, key_id, duration_ms=None, source="heuristic"), text_signature = "(self, platform, model_id, key_id, duration_ms=60000, source='heuristic')")]
    fn set_cooldown(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, key_id: &Arg, duration_ms: Option<&Arg>,
        source: &str,
    ) -> PyResult<()> {
        let r = route(platform, model_id, key_id)?;
        let d = duration_ms.map_or(Ok(60_000), |d| count_arg(d, "duration_ms"))?;
        let s: CooldownSource = source.parse()?;
        self.run(py, move |e| e.failures().set_cooldown(&r, d, s))
    }

    /// The route's bench: whichever of its own cooldown and its model's model-wide one
    /// (key_id None, SPEC 21.1) ends later; None when neither is active.
    fn cooldown(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, key_id: &Arg,
    ) -> PyResult<Option<PyCooldown>> {
        let r = route(platform, model_id, key_id)?;
        let (cd, now) = self.run(py, move |e| Ok((e.failures().cooldown(&r)?, e.now_ms())))?;
        Ok(cd.map(|c| PyCooldown::new(c, now)))
    }

    /// Active cooldowns, soonest expiry first; the model-wide ones (key_id None) only
    /// when `key_ids` is None.
    #[pyo3(signature = (key_ids=None))]
    fn active_cooldowns(&self, py: Python<'_>, key_ids: Option<&Arg>) -> PyResult<Vec<PyCooldown>> {
        let ids: Option<Vec<i64>> = match key_ids {
            Some(k) if !k.is_none() => {
                Some(k.try_iter()?.map(|i| int_arg(&i?, "key_ids[]")).collect::<PyResult<Vec<i64>>>()?)
            }
            _ => None,
        };
        let (v, now) =
            self.run(py, move |e| Ok((e.failures().active_cooldowns(ids.as_deref())?, e.now_ms())))?;
        Ok(read(v, now))
    }

    /// Every stored cooldown, expired ones included until cleaned up, by route.
    fn stored_cooldowns(&self, py: Python<'_>) -> PyResult<Vec<PyCooldown>> {
        let (v, now) = self.run(py, |e| Ok((e.observed().stored_cooldowns()?, e.now_ms())))?;
        Ok(read(v, now))
    }

    /// Active heuristic cooldowns (those a probe may clear), soonest first.
    fn probeable_cooldowns(&self, py: Python<'_>) -> PyResult<Vec<PyCooldown>> {
        let (v, now) = self.run(py, |e| Ok((e.failures().probeable_cooldowns()?, e.now_ms())))?;
        Ok(read(v, now))
    }

    fn soonest_cooldown_expiry(&self, py: Python<'_>) -> PyResult<Option<i64>> {
        self.run(py, |e| Ok(e.failures().active_cooldowns(None)?.first().map(|c| c.expires_at_ms)))
    }

    /// Operator reset of a key: deletes its cooldowns; returns how many.
    fn clear_cooldowns_for_key(&self, py: Python<'_>, key_id: &Arg) -> PyResult<i64> {
        let k = int_arg(key_id, "key_id")?;
        self.run(py, move |e| e.failures().clear_cooldowns_for_key(k))
    }

    fn clear_cooldown_early(
        &self, py: Python<'_>, platform: &Arg, model_id: &Arg, key_id: &Arg,
    ) -> PyResult<()> {
        let r = route(platform, model_id, key_id)?;
        self.run(py, move |e| e.failures().clear_cooldown_early(&r).map(|_| ()))
    }

    fn cleanup_expired_cooldowns(&self, py: Python<'_>) -> PyResult<i64> {
        self.run(py, |e| e.failures().cleanup_expired_cooldowns())
    }
}
