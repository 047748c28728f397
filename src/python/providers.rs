//! What the core knows of providers, for the package's integrations.
use pyo3::prelude::*;
use std::collections::HashMap;

/// The API hosts the core knows (an `api_base`'s host, lower-case) and the platform
/// each means (`core::providers`).
#[pyfunction]
pub(super) fn provider_hosts() -> HashMap<&'static str, &'static str> {
    crate::core::providers::hosts().collect()
}
