//! Where a platform's day starts (SPEC §4 "midnight", §14.2). Every day boundary the
//! engine uses (the day windows, daily caps, the ladder's cap, a daily quota's bench,
//! retry times and what is loaded at start-up) comes from a [`Calendar`].
//!
//! A calendar is UTC or an IANA zone (the database bundled into the package by `jiff`,
//! so the host's `/usr/share/zoneinfo` does not matter). Days start at 00:00 local time
//! and daylight saving time is honoured (a day may be 23 or 25 hours long); weeks
//! start on Monday 00:00 and months on the 1st 00:00, local time. The start and end
//! of the period last asked for are kept per period kind, so a zone costs a
//! conversion once a period, not once a call.
use crate::core::clock::DAY_MS;
use crate::core::limits::Period;
use std::cell::Cell;
use std::sync::Arc;

/// The zone of a platform whose calendar no one set (SPEC §14.2's built-ins): its
/// provider's (`core::providers`). The name is case-sensitive (SPEC 18.6).
pub fn builtin_zone(platform: &str) -> &'static str {
    crate::core::providers::lookup(platform).day_zone
}

/// The days of one platform.
#[derive(Debug, Clone)]
pub struct Calendar {
    name: Arc<str>,
    /// `None` for UTC (plain arithmetic for days and weeks).
    zone: Option<jiff::tz::TimeZone>,
    /// (start, end) of the period last asked for, per [`Period`].
    cached: [Cell<(i64, i64)>; Period::COUNT],
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
        Calendar { name: Arc::from("UTC"), zone: None, cached: Default::default() }
    }

    /// The calendar of an IANA zone name (`"UTC"` included); `None` when the name is
    /// not in the database.
    pub fn of_zone(name: &str) -> Option<Calendar> {
        if name == "UTC" {
            return Some(Calendar::utc());
        }
        let zone = jiff::tz::db().get(name).ok()?;
        Some(Calendar { name: Arc::from(name), zone: Some(zone), cached: Default::default() })
    }

    /// The zone's name, as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The day holding `t`: its start and the next day's start.
    #[inline]
    fn day(&self, t: i64) -> (i64, i64) {
        if self.zone.is_none() {
            return utc_day(t);
        }
        self.period(Period::Day, t)
    }

    /// The period holding `t`: its start and the next one's start.
    #[inline]
    pub fn period(&self, p: Period, t: i64) -> (i64, i64) {
        if self.zone.is_none() && p == Period::Day {
            return utc_day(t);
        }
        let cache = &self.cached[p.index()];
        let (start, end) = cache.get();
        if start <= t && t < end {
            return (start, end);
        }
        let bounds = match (&self.zone, p) {
            (None, Period::Day) => utc_day(t),
            (None, Period::Week) => utc_week(t),
            (zone, p) => {
                let zone = zone.clone().unwrap_or(jiff::tz::TimeZone::UTC);
                // Outside what the zone can represent: UTC days.
                zoned_period(&zone, p, t).unwrap_or_else(|| utc_day(t))
            }
        };
        cache.set(bounds);
        bounds
    }

    /// Start of the period holding `t`.
    pub fn period_start(&self, p: Period, t: i64) -> i64 {
        self.period(p, t).0
    }

    /// Start of the period after the one holding `t`.
    pub fn next_period_start(&self, p: Period, t: i64) -> i64 {
        self.period(p, t).1
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

/// The UTC week (Monday 00:00 to Monday 00:00) holding `t`.
#[inline]
fn utc_week(t: i64) -> (i64, i64) {
    let day = t.div_euclid(DAY_MS);
    // 1970-01-01 was a Thursday: 3 days after a Monday.
    let start = (day - (day + 3).rem_euclid(7)).saturating_mul(DAY_MS);
    (start, start.saturating_add(7 * DAY_MS))
}

/// Start and end of the local period holding `t` in `zone` (a day starting in a
/// daylight-saving gap starts when the gap ends).
fn zoned_period(zone: &jiff::tz::TimeZone, p: Period, t: i64) -> Option<(i64, i64)> {
    use jiff::{civil::Date, Span};
    let date = jiff::Timestamp::from_millisecond(t).ok()?.to_zoned(zone.clone()).date();
    let (start, next) = match p {
        Period::Day => (date, date.tomorrow().ok()?),
        Period::Week => {
            let monday = date.checked_sub(Span::new().days(date.weekday().to_monday_zero_offset())).ok()?;
            (monday, monday.checked_add(Span::new().weeks(1)).ok()?)
        }
        Period::Month => {
            let first = date.first_of_month();
            (first, first.checked_add(Span::new().months(1)).ok()?)
        }
    };
    let at = |d: Date| d.to_zoned(zone.clone()).ok().map(|z| z.timestamp().as_millisecond());
    Some((at(start)?, at(next)?))
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
    fn weeks_start_monday_and_months_the_first() {
        let utc = Calendar::utc();
        // 2026-12-01 is a Tuesday; its week started Monday 2026-11-30 00:00 UTC.
        let dec1 = 1_796_083_200_000;
        assert_eq!(utc.period_start(Period::Week, dec1 + HOUR), dec1 - DAY_MS);
        assert_eq!(utc.next_period_start(Period::Week, dec1), dec1 + 6 * DAY_MS);
        assert_eq!(utc.period_start(Period::Month, dec1 + 5 * DAY_MS), dec1);
        assert_eq!(utc.next_period_start(Period::Month, dec1), dec1 + 31 * DAY_MS);
        assert_eq!(utc.period_start(Period::Month, dec1 - 1), dec1 - 30 * DAY_MS);
        // In Los Angeles, November 2026 holds the fall-back hour: 30 days and 1 hour.
        let la = Calendar::of_zone("America/Los_Angeles").unwrap_or_default();
        let nov1_la = 1_793_516_400_000; // 2026-11-01 00:00 PDT
        let dec1_la = dec1 + 8 * HOUR; // 2026-12-01 00:00 PST
        assert_eq!(la.period_start(Period::Month, dec1_la - 1), nov1_la);
        assert_eq!(la.next_period_start(Period::Month, nov1_la), dec1_la);
        assert_eq!(dec1_la - nov1_la, 30 * DAY_MS + HOUR);
        // The week of Sunday 2026-11-01 began Monday 2026-10-26 00:00 PDT.
        assert_eq!(la.period_start(Period::Week, nov1_la), nov1_la - 6 * DAY_MS);
        assert_eq!(la.next_period_start(Period::Week, nov1_la), nov1_la + DAY_MS + HOUR);
    }

    #[test]
    fn unknown_zones_are_none_and_builtins() {
        assert!(Calendar::of_zone("Mars/Olympus_Mons").is_none());
    }
}
