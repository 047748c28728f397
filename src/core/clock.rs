//! Time sources. The core reads time only through [`Clock`] (SPEC §2).
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of UTC time in milliseconds since the Unix epoch. It may go backwards.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> i64;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
            // A wall clock before 1970: report negative milliseconds rather than fail.
            Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
        }
    }
}

/// A clock that moves only when told to; shared by an engine and its background threads.
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(now_ms: i64) -> Self {
        Self(AtomicI64::new(now_ms))
    }
    pub fn set(&self, now_ms: i64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }
    /// Moves the clock by `ms` (negative moves it back), saturating at the i64 range.
    pub fn advance(&self, ms: i64) {
        let _ = self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| Some(t.saturating_add(ms)));
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

pub const MINUTE_MS: i64 = 60_000;
pub const DAY_MS: i64 = 86_400_000;

/// 00:00:00.000 UTC of the day that holds `t`.
pub fn midnight(t: i64) -> i64 {
    t.div_euclid(DAY_MS).saturating_mul(DAY_MS)
}

/// The next midnight strictly after `t`.
pub fn next_midnight(t: i64) -> i64 {
    midnight(t).saturating_add(DAY_MS)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn midnight_edges() {
        assert_eq!(midnight(0), 0);
        assert_eq!(midnight(DAY_MS - 1), 0);
        assert_eq!(midnight(DAY_MS), DAY_MS);
        assert_eq!(midnight(-1), -DAY_MS);
        assert_eq!(next_midnight(DAY_MS), 2 * DAY_MS);
    }
    #[test]
    fn manual_clock_moves_both_ways() {
        let c = ManualClock::new(1000);
        c.advance(500);
        assert_eq!(c.now_ms(), 1500);
        c.advance(-2000);
        assert_eq!(c.now_ms(), -500);
        c.set(i64::MAX);
        c.advance(1);
        assert_eq!(c.now_ms(), i64::MAX);
    }
}
