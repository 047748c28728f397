//! Where a platform's day starts (SPEC §4 "midnight", §14.2). Every day boundary the
//! engine uses (the day windows, daily caps, the ladder's cap, a daily quota's bench,
//! retry times and what is loaded at start-up) comes from a [`Calendar`].
//!
//! A calendar is UTC or an IANA zone (the database bundled into the package by `jiff`,
//! so the host's `/usr/share/zoneinfo` does not matter). Days start at 00:00 local time
//! and daylight saving time is honoured (a day may be 23 or 25 hours long). The start
//! and end of the day last asked for are kept, so a zone costs a conversion once a day,
//! not once a call.
use crate::core::clock::DAY_MS;
use std::cell::Cell;
use std::sync::Arc;

/// The zone of a platform whose calendar no one set (SPEC §14.2's built-ins).
pub fn builtin_zone(platform: &str) -> &'static str {
    match platform.to_ascii_lowercase().as_str() {
        // Gemini's daily quotas reset at midnight Pacific time.
        "google" => "America/Los_Angeles",
        _ => "UTC",
    }
}

/// The days of one platform.
#[derive(Debug, Clone)]
pub struct Calendar {
    name: Arc<str>,
    /// `None` for UTC (plain arithmetic).
    zone: Option<jiff::tz::TimeZone>,
    /// (start, end) of the day last asked for.
    day: Cell<(i64, i64)>,
}

impl Default for Calendar {
    fn default() -> Calendar {
        Calendar::utc()
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Calendar) -> bool {
        self.name == other.name
    }
}

impl Calendar {
    /// UTC days: 00:00:00.000 UTC to the next.
    pub fn utc() -> Calendar {
        Calendar { name: Arc::from("UTC"), zone: None, day: Cell::new((0, 0)) }
    }

    /// The calendar of an IANA zone name (`"UTC"` included); `None` when the name is
    /// not in the database.
    pub fn of_zone(name: &str) -> Option<Calendar> {
        if name == "UTC" {
            return Some(Calendar::utc());
        }
        let zone = jiff::tz::db().get(name).ok()?;
        Some(Calendar { name: Arc::from(name), zone: Some(zone), day: Cell::new((0, 0)) })
    }

    /// The zone's name, as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The day holding `t`: its start and the next day's start.
    #[inline]
    fn day(&self, t: i64) -> (i64, i64) {
        let Some(zone) = &self.zone else { return utc_day(t) };
        let (start, end) = self.day.get();
        if start <= t && t < end {
            return (start, end);
        }
        // Outside what the zone can represent: UTC days.
        let day = zoned_day(zone, t).unwrap_or_else(|| utc_day(t));
        self.day.set(day);
        day
    }

    /// A number per day, equal for two times of one day and growing with the days
    /// (the day's start).
    pub fn day_index(&self, t: i64) -> i64 {
        self.day(t).0
    }

    /// Start of the day holding `t` (an event at that instant belongs to that day).
    pub fn day_start(&self, t: i64) -> i64 {
        self.day(t).0
    }

    /// Start of the day after the one holding `t`.
    pub fn next_day_start(&self, t: i64) -> i64 {
        self.day(t).1
    }
}

#[inline]
fn utc_day(t: i64) -> (i64, i64) {
    let start = t.div_euclid(DAY_MS).saturating_mul(DAY_MS);
    (start, start.saturating_add(DAY_MS))
}

/// Start and end of the local day holding `t` in `zone`.
fn zoned_day(zone: &jiff::tz::TimeZone, t: i64) -> Option<(i64, i64)> {
    let now = jiff::Timestamp::from_millisecond(t).ok()?.to_zoned(zone.clone());
    let start = now.start_of_day().ok()?;
    let next = now.tomorrow().ok()?.start_of_day().ok()?;
    Some((start.timestamp().as_millisecond(), next.timestamp().as_millisecond()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: i64 = 3_600_000;

    #[test]
    fn utc_day_edges() {
        let c = Calendar::utc();
        assert_eq!(c.day_start(0), 0);
        assert_eq!(c.day_start(DAY_MS - 1), 0);
        assert_eq!(c.day_start(DAY_MS), DAY_MS);
        assert_eq!(c.day_start(-1), -DAY_MS);
        assert_eq!(c.next_day_start(DAY_MS), 2 * DAY_MS);
        assert!(c.day_index(DAY_MS - 1) < c.day_index(DAY_MS));
    }

    #[test]
    fn pacific_days_follow_daylight_saving_time() {
        let la = Calendar::of_zone("America/Los_Angeles").unwrap_or_default();
        assert_eq!(la.name(), "America/Los_Angeles");
        // 2026-01-15 00:00 PST = 08:00 UTC.
        let jan15 = 1_768_464_000_000;
        assert_eq!(la.day_start(jan15 + 5 * HOUR), jan15);
        assert_eq!(la.next_day_start(jan15), jan15 + DAY_MS);
        // 2026-03-08 (spring forward) is 23 h long, 2026-11-01 (fall back) 25 h.
        let mar8 = 1_772_956_800_000; // 2026-03-08 08:00 UTC = 00:00 PST
        assert_eq!(la.day_start(mar8 + HOUR), mar8);
        assert_eq!(la.next_day_start(mar8 + HOUR) - mar8, 23 * HOUR);
        let nov1 = 1_793_516_400_000; // 2026-11-01 07:00 UTC = 00:00 PDT
        assert_eq!(la.day_start(nov1 + 20 * HOUR), nov1);
        assert_eq!(la.next_day_start(nov1) - nov1, 25 * HOUR);
        // An event at the start belongs to the new day.
        assert_eq!(la.day_start(nov1), nov1);
        assert_eq!(la.day_start(nov1 - 1), nov1 - 24 * HOUR);
    }

    #[test]
    fn unknown_zones_are_none_and_builtins() {
        assert!(Calendar::of_zone("Mars/Olympus_Mons").is_none());
        assert_eq!(builtin_zone("google"), "America/Los_Angeles");
        assert_eq!(builtin_zone("groq"), "UTC");
    }
}
