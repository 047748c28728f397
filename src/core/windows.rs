//! Incremental window state of one route or one provider account (SPEC §4).
//!
//! The minute window keeps each event of the last 60 s (bounded by the rate a key
//! can sustain); the day windows keep one counter per day of the state's calendar.
//! Both are updated per event, so a gate costs O(1) whatever the size of the history
//! in the database.
use crate::core::calendar::Calendar;
use crate::core::clock::MINUTE_MS;
use std::collections::VecDeque;

/// One recorded event: `requests` requests and `tokens` tokens at `t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Event {
    t: i64,
    requests: i64,
    tokens: i64,
}

/// Counts of one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: i64,
    pub tokens: i64,
}

#[derive(Debug, Default, Clone)]
pub struct Windows {
    /// Events with `t > horizon`, sorted by `t`.
    minute: VecDeque<Event>,
    minute_sum: Counts,
    /// (day index, counts), sorted by day; only days >= the current day are kept.
    days: Vec<(i64, Counts)>,
    /// Where its days start.
    cal: Calendar,
}

impl Windows {
    /// Empty windows whose days are those of `cal`.
    pub fn new(cal: Calendar) -> Windows {
        Windows { cal, ..Windows::default() }
    }

    /// The calendar of the day windows.
    pub fn calendar(&self) -> &Calendar {
        &self.cal
    }

    fn day_of(&self, t: i64) -> i64 {
        self.cal.day_index(t)
    }

    /// Adds an event. An event already outside both windows at `now` is dropped, and
    /// so is whatever has left them: memory stays bounded by the windows' widths even
    /// for a route that is only ever recorded, never checked.
    pub fn add(&mut self, t: i64, requests: i64, tokens: i64, now: i64) {
        self.prune(now);
        if t > now.saturating_sub(MINUTE_MS) {
            let ev = Event { t, requests, tokens };
            // Events arrive almost always in time order: push at the back; otherwise
            // insert in place so that pruning from the front stays correct.
            match self.minute.back() {
                Some(last) if last.t > t => {
                    let at = self.minute.partition_point(|e| e.t <= t);
                    self.minute.insert(at, ev);
                }
                _ => self.minute.push_back(ev),
            }
            self.minute_sum.requests = self.minute_sum.requests.saturating_add(requests);
            self.minute_sum.tokens = self.minute_sum.tokens.saturating_add(tokens);
        }
        let day = self.day_of(t);
        if day >= self.day_of(now) {
            match self.days.binary_search_by_key(&day, |(d, _)| *d) {
                Ok(i) => {
                    let c = &mut self.days[i].1;
                    c.requests = c.requests.saturating_add(requests);
                    c.tokens = c.tokens.saturating_add(tokens);
                }
                Err(i) => self.days.insert(i, (day, Counts { requests, tokens })),
            }
        }
    }

    /// Drops what has left the windows at `now`. Callers rebuild from the store when
    /// the clock steps back, since dropped events may then count again.
    pub fn prune(&mut self, now: i64) {
        let horizon = now.saturating_sub(MINUTE_MS);
        while let Some(front) = self.minute.front() {
            if front.t > horizon {
                break;
            }
            self.minute_sum.requests = self.minute_sum.requests.saturating_sub(front.requests);
            self.minute_sum.tokens = self.minute_sum.tokens.saturating_sub(front.tokens);
            self.minute.pop_front();
        }
        let today = self.day_of(now);
        if self.days.first().is_some_and(|(d, _)| *d < today) {
            self.days.retain(|(d, _)| *d >= today);
        }
    }

    /// Sliding 60 s counts (events with `t > now - 60 000`; call `prune(now)` first).
    pub fn minute(&self) -> Counts {
        self.minute_sum
    }

    /// Counts since the start of the day (events with `t >= day_start(now)`).
    pub fn day(&self, now: i64) -> Counts {
        let today = self.day_of(now);
        let mut c = Counts::default();
        for (_, d) in self.days.iter().filter(|(d, _)| *d >= today) {
            c.requests = c.requests.saturating_add(d.requests);
            c.tokens = c.tokens.saturating_add(d.tokens);
        }
        c
    }

    /// When enough of the oldest events have left the minute window that `excess`
    /// requests (or tokens, with `tokens = true`) are gone; `None` when the recorded
    /// events cannot free that much.
    pub fn minute_release_time(&self, excess: i64, tokens: bool) -> Option<i64> {
        if excess <= 0 {
            return None;
        }
        let mut freed = 0i64;
        for e in &self.minute {
            freed = freed.saturating_add(if tokens { e.tokens } else { e.requests });
            if freed >= excess {
                return Some(e.t.saturating_add(MINUTE_MS));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::clock::DAY_MS;

    const T0: i64 = 1_700_000_000_000;

    #[test]
    fn minute_window_slides_exactly() {
        let mut w = Windows::default();
        w.add(T0, 1, 10, T0);
        w.prune(T0 + 59_999);
        assert_eq!(w.minute(), Counts { requests: 1, tokens: 10 });
        w.prune(T0 + 60_000);
        assert_eq!(w.minute(), Counts::default());
    }

    #[test]
    fn day_window_starts_at_midnight() {
        let midnight = (T0 / DAY_MS + 1) * DAY_MS;
        let mut w = Windows::default();
        w.add(midnight - 1, 1, 5, midnight - 1);
        w.prune(midnight - 1);
        assert_eq!(w.day(midnight - 1).requests, 1);
        w.add(midnight, 1, 7, midnight);
        w.prune(midnight);
        // the event at 00:00:00.000 belongs to the new day; the one before does not
        assert_eq!(w.day(midnight), Counts { requests: 1, tokens: 7 });
        // both are still in the sliding minute
        assert_eq!(w.minute().requests, 2);
    }

    #[test]
    fn out_of_order_events_are_kept_sorted() {
        let mut w = Windows::default();
        w.add(T0 + 500, 1, 0, T0 + 500);
        w.add(T0 + 100, 1, 0, T0 + 500);
        w.add(T0 + 300, 1, 0, T0 + 500);
        w.prune(T0 + 60_100);
        assert_eq!(w.minute().requests, 2);
        w.prune(T0 + 60_300);
        assert_eq!(w.minute().requests, 1);
    }

    #[test]
    fn future_events_count() {
        let mut w = Windows::default();
        w.add(T0 + 10_000, 1, 0, T0 + 10_000);
        w.prune(T0); // clock stepped back: the event stamped later still counts
        assert_eq!(w.minute().requests, 1);
        assert_eq!(w.day(T0).requests, 1);
    }

    #[test]
    fn release_time_walks_oldest_first() {
        let mut w = Windows::default();
        w.add(T0, 1, 100, T0);
        w.add(T0 + 1000, 1, 200, T0 + 1000);
        assert_eq!(w.minute_release_time(1, false), Some(T0 + 60_000));
        assert_eq!(w.minute_release_time(2, false), Some(T0 + 61_000));
        assert_eq!(w.minute_release_time(3, false), None);
        assert_eq!(w.minute_release_time(150, true), Some(T0 + 61_000));
        assert_eq!(w.minute_release_time(301, true), None);
    }

    #[test]
    fn recording_alone_keeps_memory_bounded() {
        let mut w = Windows::default();
        for i in 0..100_000 {
            let t = T0 + i * 10;
            w.add(t, 1, 1, t);
        }
        // 60 s at 10 ms: 6,000 events in the minute window, not 100,000
        assert!(w.minute.len() <= 6_001, "{}", w.minute.len());
        assert_eq!(w.minute().requests, 6_000);
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let mut w = Windows::default();
        w.add(T0, 1, i64::MAX, T0);
        w.add(T0, 1, i64::MAX, T0);
        assert_eq!(w.minute().tokens, i64::MAX);
        assert_eq!(w.day(T0).tokens, i64::MAX);
    }
}
