//! Where a day starts (SPEC §4: "midnight"). Every day boundary the engine uses (the
//! day windows, daily caps, the ladder's cap, a daily quota's bench, retry times and
//! what is loaded at start-up) comes from a [`Calendar`], so that a platform's own
//! calendar (SPEC §14.2) has one place to live.
use crate::core::clock::DAY_MS;

/// The days of one platform. Today every platform counts UTC days.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Calendar {}

impl Calendar {
    /// UTC days: 00:00:00.000 UTC to the next.
    pub const UTC: Calendar = Calendar {};

    /// A number per day: equal for two times of one day, one more for the next day.
    pub fn day_index(&self, t: i64) -> i64 {
        t.div_euclid(DAY_MS)
    }

    /// Start of the day holding `t` (an event at that instant belongs to that day).
    pub fn day_start(&self, t: i64) -> i64 {
        self.day_index(t).saturating_mul(DAY_MS)
    }

    /// Start of the day after the one holding `t`.
    pub fn next_day_start(&self, t: i64) -> i64 {
        self.day_start(t).saturating_add(DAY_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_day_edges() {
        let c = Calendar::UTC;
        assert_eq!(c.day_start(0), 0);
        assert_eq!(c.day_start(DAY_MS - 1), 0);
        assert_eq!(c.day_start(DAY_MS), DAY_MS);
        assert_eq!(c.day_start(-1), -DAY_MS);
        assert_eq!(c.next_day_start(DAY_MS), 2 * DAY_MS);
        assert_eq!(c.day_index(DAY_MS - 1) + 1, c.day_index(DAY_MS));
    }
}
