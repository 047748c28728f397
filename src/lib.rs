//! quotaengine: a quota and cooldown engine for LLM routers.
//!
//! `core` is plain Rust (no Python); `python` is the thin PyO3 binding.
pub mod core;
#[cfg(feature = "python")]
mod python;
