//! Money as Python spells it (SPEC 23.1): the `Prices` value, in dollars, over the
//! core's prices held exactly in pico-dollars.
use super::convert::{dollars_arg, Arg};
use super::errors::shield;
use crate::core::money::Prices;
use pyo3::prelude::*;
use pyo3::types::PyFloat;
use std::hash::{Hash, Hasher};

/// A model's prices (SPEC 23.1): `input`, `output` and `cached_input` in dollars per
/// million tokens (`cached_input`, cache reads, defaults to `input`; `input` excludes
/// them), `per_request` in dollars per request. Held exactly as integer pico-dollars
/// (`round(x * 10**6)` per token, `round(per_request * 10**12)` per request) and read
/// back as held. A negative, NaN or infinite price is a ValueError, a bool or a
/// non-number a TypeError, one beyond 2**63 - 1 pico-dollars an OverflowError.
#[pyclass(frozen, eq, hash, name = "Prices", module = "quotaengine")]
#[derive(Clone)]
pub struct PyPrices {
    #[pyo3(get)]
    input: f64,
    #[pyo3(get)]
    output: f64,
    #[pyo3(get)]
    cached_input: f64,
    #[pyo3(get)]
    per_request: f64,
    /// The prices as the core holds them (equality and hash are theirs).
    pub(crate) core: Prices,
}

impl From<Prices> for PyPrices {
    fn from(p: Prices) -> Self {
        Self {
            input: p.input_dollars(),
            output: p.output_dollars(),
            cached_input: p.cached_input_dollars(),
            per_request: p.per_request_dollars(),
            core: p,
        }
    }
}

impl PartialEq for PyPrices {
    fn eq(&self, other: &Self) -> bool {
        self.core == other.core
    }
}

impl Eq for PyPrices {}

impl Hash for PyPrices {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.core.hash(state);
    }
}

#[pymethods]
impl PyPrices {
    #[new]
    #[pyo3(signature = (input, output, *, cached_input=None, per_request=None),
           text_signature = "(input, output, *, cached_input=None, per_request=0.0)")]
    fn new(
        input: &Arg, output: &Arg, cached_input: Option<&Arg>, per_request: Option<&Arg>,
    ) -> PyResult<Self> {
        shield(|| {
            let input = dollars_arg(input, "input")?;
            let output = dollars_arg(output, "output")?;
            let cached_input = match cached_input.filter(|c| !c.is_none()) {
                Some(c) => Some(dollars_arg(c, "cached_input")?),
                None => None,
            };
            let per_request = match per_request {
                Some(r) => dollars_arg(r, "per_request")?,
                None => 0.0,
            };
            Ok(Prices::from_dollars(input, output, cached_input, per_request)?.into())
        })
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let f = |v: f64| PyFloat::new(py, v).repr().map(|r| r.to_string());
        Ok(format!(
            "Prices(input={}, output={}, cached_input={}, per_request={})",
            f(self.input)?,
            f(self.output)?,
            f(self.cached_input)?,
            f(self.per_request)?
        ))
    }
}
