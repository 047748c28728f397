//! Parsers for provider error bodies and headers (SPEC §6.2, §7).
//!
//! Everything here is pure: no clock (the caller passes `now_ms`), no I/O, and
//! no input can make a parser panic. Regexes are compiled once; a pattern that
//! failed to compile (it cannot: the tests compile each one) would make its
//! parser answer "nothing found" instead of panicking.
//!
//! By what they parse: a `Retry-After` value and the plain numbers it holds
//! (`retry_after`), HTTP dates and civil-calendar arithmetic (`dates`), a delay
//! an error body states (`stated`), a limit an error body states, by Groq's words
//! or Google's quota ids (`learned`), and the kind of a failure (`failure`).

use crate::core::clock::DAY_MS;
use regex::Regex;
use std::sync::OnceLock;

mod dates;
mod failure;
mod learned;
mod retry_after;
mod stated;

pub(crate) use dates::*;
pub use failure::*;
pub use learned::*;
pub use retry_after::*;
pub use stated::*;

/// Compiles `pattern` once into `cell`; `None` if it does not compile.
pub(crate) fn cached(cell: &'static OnceLock<Option<Regex>>, pattern: &str) -> Option<&'static Regex> {
    cell.get_or_init(|| Regex::new(pattern).ok()).as_ref()
}

/// Rounds a non-negative millisecond amount to the nearest ms and clamps it to
/// `[0, DAY_MS]` (infinity clamps to a day; NaN, which no caller produces, is 0).
fn clamp_ms(ms: f64) -> i64 {
    if ms.is_nan() || ms <= 0.0 {
        return 0;
    }
    let rounded = ms.round();
    if rounded >= DAY_MS as f64 {
        DAY_MS
    } else {
        // In (0, DAY_MS): exact in f64 and in range for i64.
        rounded as i64
    }
}

/// Provider error bodies are small; a hostile multi-megabyte one is read only this far,
/// so that no parser can stall a failure call.
pub const MAX_PARSED_BYTES: usize = 16 * 1024;

/// The first `MAX_PARSED_BYTES` of `text`, cut at a character boundary.
pub(crate) fn head(text: &str) -> &str {
    if text.len() <= MAX_PARSED_BYTES {
        return text;
    }
    let mut end = MAX_PARSED_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
