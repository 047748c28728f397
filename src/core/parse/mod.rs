//! Parsers for provider error bodies and headers (SPEC §6.2, §7).
//!
//! Everything here is pure: no clock (the caller passes `now_ms`), no I/O, and
//! no input can make a parser panic. Regexes are compiled once; a pattern that
//! failed to compile (it cannot: the tests compile each one) would make its
//! parser answer "nothing found" instead of panicking.
//!
//! By what they parse: a `Retry-After` value and the plain numbers it holds
//! (`retry_after`), HTTP dates and civil-calendar arithmetic (`dates`), a delay
//! an error body states (`stated`), a limit an error body states, in words or by a
//! quota id (`learned`), and the kind of a failure (`failure`). What one provider's
//! bodies say in their own dialect is read in that provider's file (`core::providers`).

use crate::core::clock::DAY_MS;

mod dates;
mod failure;
mod learned;
mod retry_after;
mod stated;

pub use crate::core::text::MAX_PARSED_BYTES;
pub(crate) use crate::core::text::{cached, head};
pub(crate) use dates::*;
pub use failure::*;
pub use learned::*;
pub use retry_after::*;
pub use stated::*;

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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
