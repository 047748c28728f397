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

#[cfg(test)]
mod tests {
    use super::*;
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
