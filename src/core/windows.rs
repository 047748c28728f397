//! Incremental window state of one route or one provider account (SPEC §4, §14.1).
//!
//! One structure serves every window a route declares. Sliding windows share one
//! list of the events of the longest of them (bounded by the rate a key can sustain
//! over that width), each keeping a running sum and where its window starts in the
//! list; calendar windows keep one counter per period of the state's calendar. All
//! are updated per event, so a gate costs O(1) whatever the size of the history in
//! the database.
use crate::core::calendar::Calendar;
use crate::core::clock::MINUTE_MS;
use crate::core::limits::{Metric, Period, WindowSpec, DAY, MINUTE};
use std::collections::VecDeque;

/// Counts of one window, per metric.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: i64,
    /// Total tokens.
    pub tokens: i64,
    /// Input tokens, cached input excluded.
    pub input_tokens: i64,
    pub output_tokens: i64,
    /// Micro-dollars spent (SPEC 23.1).
    pub cost: i64,
}

impl Counts {
    /// `requests` requests and `tokens` tokens (no split into input and output).
    pub fn of(requests: i64, tokens: i64) -> Counts {
        Counts { requests, tokens, ..Counts::default() }
    }

    pub fn get(&self, m: Metric) -> i64 {
        match m {
            Metric::Requests => self.requests,
            Metric::Tokens => self.tokens,
            Metric::InputTokens => self.input_tokens,
            Metric::OutputTokens => self.output_tokens,
            Metric::Cost => self.cost,
        }
    }

    fn add(&mut self, o: &Counts) {
        self.requests = self.requests.saturating_add(o.requests);
        self.tokens = self.tokens.saturating_add(o.tokens);
        self.input_tokens = self.input_tokens.saturating_add(o.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(o.output_tokens);
        self.cost = self.cost.saturating_add(o.cost);
    }

    fn sub(&mut self, o: &Counts) {
        self.requests = self.requests.saturating_sub(o.requests);
        self.tokens = self.tokens.saturating_sub(o.tokens);
        self.input_tokens = self.input_tokens.saturating_sub(o.input_tokens);
        self.output_tokens = self.output_tokens.saturating_sub(o.output_tokens);
        self.cost = self.cost.saturating_sub(o.cost);
    }
}

/// One recorded event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Event {
    t: i64,
    c: Counts,
}

/// A sliding window over the shared event list.
#[derive(Debug, Clone)]
struct Slide {
    width: i64,
    /// Position (counted since the list began, pops included) of its first event.
    first: u64,
    sum: Counts,
}

#[derive(Debug, Clone)]
pub struct Windows {
    /// Events with `t > now - ` the longest width, sorted by `t`.
    events: VecDeque<Event>,
    /// Events popped from the front so far (positions stay stable).
    popped: u64,
    /// Sorted by width; the 60 s window is always there.
    slides: Vec<Slide>,
    /// Per calendar period kept (the day always): (period start, counts), sorted by
    /// start; only the current period and later ones are kept.
    periods: [Option<Vec<(i64, Counts)>>; Period::COUNT],
    /// Where its periods start.
    cal: Calendar,
    /// The `now` of the last prune: what the windows count is as of then.
    at: i64,
    /// Per period kind, (start, end) of the period holding the last prune's `now`:
    /// while `now` stays inside, no period boundary is computed again.
    current: [(i64, i64); Period::COUNT],
}

impl Default for Windows {
    fn default() -> Windows {
        Windows::new(Calendar::default())
    }
}

impl Windows {
    /// The minute and the day of `cal`, empty.
    pub fn new(cal: Calendar) -> Windows {
        Windows {
            events: VecDeque::new(),
            popped: 0,
            slides: vec![Slide { width: MINUTE_MS, first: 0, sum: Counts::default() }],
            periods: [Some(Vec::new()), None, None],
            cal,
            at: i64::MIN,
            current: [(0, 0); Period::COUNT],
        }
    }

    /// The same windows, empty, with periods of `cal` (after a reload or a calendar
    /// change).
    pub fn cleared(&self, cal: Calendar) -> Windows {
        let mut w = Windows::new(cal);
        for s in &self.slides {
            w.slides_insert(s.width);
        }
        for p in Period::ALL {
            if self.periods[p.index()].is_some() {
                w.periods[p.index()].get_or_insert_with(Vec::new);
            }
        }
        w
    }

    /// The calendar of the period windows.
    pub fn calendar(&self) -> &Calendar {
        &self.cal
    }

    /// Whether this state keeps `spec`.
    pub fn keeps(&self, spec: WindowSpec) -> bool {
        match spec {
            WindowSpec::Sliding(w) => self.slides.iter().any(|s| s.width == w),
            WindowSpec::Calendar(p) => self.periods[p.index()].is_some(),
        }
    }

    /// Starts keeping `spec`. True when its count is already complete: a sliding
    /// window no wider than the longest kept counts from the event list; a wider one
    /// or a new period starts empty, and the caller reloads the state's history.
    pub fn keep(&mut self, spec: WindowSpec) -> bool {
        let now = self.at;
        if self.keeps(spec) {
            return true;
        }
        match spec {
            WindowSpec::Sliding(width) => {
                let complete = width <= self.horizon();
                let at = self.slides_insert(width);
                let boundary = now.saturating_sub(width);
                let skip = self.events.partition_point(|e| e.t <= boundary);
                let mut sum = Counts::default();
                for e in self.events.iter().skip(skip) {
                    sum.add(&e.c);
                }
                self.slides[at].first = self.popped + skip as u64;
                self.slides[at].sum = sum;
                complete
            }
            WindowSpec::Calendar(p) => {
                self.periods[p.index()] = Some(Vec::new());
                false
            }
        }
    }

    fn slides_insert(&mut self, width: i64) -> usize {
        match self.slides.binary_search_by_key(&width, |s| s.width) {
            Ok(i) => i,
            Err(i) => {
                self.slides.insert(i, Slide { width, first: self.popped, sum: Counts::default() });
                i
            }
        }
    }

    /// The oldest event time any kept window counts at `now`.
    pub fn oldest_counted(&self, now: i64) -> i64 {
        let mut from = now.saturating_sub(self.horizon() - 1);
        for p in Period::ALL {
            if self.periods[p.index()].is_some() {
                from = from.min(self.cal.period_start(p, now));
            }
        }
        from
    }

    /// The longest sliding width kept.
    fn horizon(&self) -> i64 {
        self.slides.last().map_or(MINUTE_MS, |s| s.width)
    }

    /// Adds an event. An event already outside every window at `now` is dropped, and
    /// so is whatever has left them: memory stays bounded by the windows' widths even
    /// for a route that is only ever recorded, never checked.
    pub fn add(&mut self, t: i64, requests: i64, tokens: i64, now: i64) {
        self.add_counts(t, Counts::of(requests, tokens), now);
    }

    pub fn add_counts(&mut self, t: i64, c: Counts, now: i64) {
        self.prune(now);
        if t > now.saturating_sub(self.horizon()) {
            let ev = Event { t, c };
            // Events arrive almost always in time order: push at the back; otherwise
            // insert in place so that pruning from the front stays correct.
            match self.events.back() {
                Some(last) if last.t > t => {
                    let at = self.events.partition_point(|e| e.t <= t);
                    self.events.insert(at, ev);
                }
                _ => self.events.push_back(ev),
            }
            // Inside a window the event counts; before its start it shifts the start.
            for s in &mut self.slides {
                if t > now.saturating_sub(s.width) {
                    s.sum.add(&c);
                } else {
                    s.first += 1;
                }
            }
        }
        for p in Period::ALL {
            let Some(buckets) = &mut self.periods[p.index()] else { continue };
            // `prune(now)` above made `current` the period holding `now`.
            let (cur_start, cur_end) = self.current[p.index()];
            let start = if cur_start <= t && t < cur_end {
                cur_start
            } else if t < cur_start {
                continue; // a period already over
            } else {
                self.cal.period_start(p, t) // stamped in a later period
            };
            match buckets.last_mut() {
                Some((s, b)) if *s == start => b.add(&c),
                _ => match buckets.binary_search_by_key(&start, |(s, _)| *s) {
                    Ok(i) => buckets[i].1.add(&c),
                    Err(i) => buckets.insert(i, (start, c)),
                },
            }
        }
    }

    /// Drops what has left the windows at `now`. Callers rebuild from the store when
    /// the clock steps back, since dropped events may then count again.
    pub fn prune(&mut self, now: i64) {
        self.at = now;
        let end = self.popped + self.events.len() as u64;
        for s in &mut self.slides {
            let boundary = now.saturating_sub(s.width);
            while s.first < end {
                let e = &self.events[(s.first - self.popped) as usize];
                if e.t > boundary {
                    break;
                }
                s.sum.sub(&e.c);
                s.first += 1;
            }
        }
        // The longest window's start is the list's.
        let keep_from = self.slides.last().map_or(end, |s| s.first);
        while self.popped < keep_from {
            self.events.pop_front();
            self.popped += 1;
        }
        for p in Period::ALL {
            let Some(buckets) = &mut self.periods[p.index()] else { continue };
            let cur = &mut self.current[p.index()];
            if cur.0 <= now && now < cur.1 {
                continue;
            }
            *cur = self.cal.period(p, now);
            let current = cur.0;
            if buckets.first().is_some_and(|(first, _)| *first < current) {
                buckets.retain(|(s, _)| *s >= current);
            }
        }
    }

    /// Counts of a window kept at `now` (call `prune(now)` first); `None` when it is
    /// not kept.
    pub fn counts(&self, spec: WindowSpec, now: i64) -> Option<Counts> {
        match spec {
            WindowSpec::Sliding(w) => self.slides.iter().find(|s| s.width == w).map(|s| s.sum),
            WindowSpec::Calendar(p) => {
                let buckets = self.periods[p.index()].as_ref()?;
                let (cur_start, cur_end) = self.current[p.index()];
                let current =
                    if cur_start <= now && now < cur_end { cur_start } else { self.cal.period_start(p, now) };
                let mut c = Counts::default();
                for (_, b) in buckets.iter().filter(|(s, _)| *s >= current) {
                    c.add(b);
                }
                Some(c)
            }
        }
    }

    /// Every kept window with its counts at `now` (call `prune(now)` first).
    pub fn all_counts(&self, now: i64) -> Vec<(WindowSpec, Counts)> {
        let sliding = self.slides.iter().map(|s| (WindowSpec::Sliding(s.width), s.sum));
        let periods = Period::ALL.into_iter().filter_map(|p| {
            let spec = WindowSpec::Calendar(p);
            self.counts(spec, now).map(|c| (spec, c))
        });
        sliding.chain(periods).collect()
    }

    /// Sliding 60 s counts (events with `t > now - 60 000`; call `prune(now)` first).
    pub fn minute(&self) -> Counts {
        self.counts(MINUTE, 0).unwrap_or_default()
    }

    /// Counts since the start of the day (events with `t >= day_start(now)`).
    pub fn day(&self, now: i64) -> Counts {
        self.counts(DAY, now).unwrap_or_default()
    }

    /// When a window frees enough that `excess` of `metric` is gone: for a sliding
    /// window, when enough of its oldest events have left it (`None` when the recorded
    /// events cannot free that much); for a calendar window, the next period's start.
    pub fn release_time(&self, spec: WindowSpec, metric: Metric, excess: i64, now: i64) -> Option<i64> {
        let WindowSpec::Sliding(width) = spec else {
            let WindowSpec::Calendar(p) = spec else { return None };
            return Some(self.cal.next_period_start(p, now));
        };
        if excess <= 0 {
            return None;
        }
        let s = self.slides.iter().find(|s| s.width == width)?;
        let mut freed = 0i64;
        for e in self.events.iter().skip((s.first - self.popped) as usize) {
            freed = freed.saturating_add(e.c.get(metric));
            if freed >= excess {
                return Some(e.t.saturating_add(width));
            }
        }
        None
    }

    /// The minute window's [`release_time`](Self::release_time) of requests, or of
    /// tokens with `tokens = true`.
    pub fn minute_release_time(&self, excess: i64, tokens: bool) -> Option<i64> {
        let m = if tokens { Metric::Tokens } else { Metric::Requests };
        self.release_time(MINUTE, m, excess, 0)
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
        assert_eq!(w.minute(), Counts::of(1, 10));
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
        assert_eq!(w.day(midnight), Counts::of(1, 7));
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
        assert!(w.events.len() <= 6_001, "{}", w.events.len());
        assert_eq!(w.minute().requests, 6_000);
    }

    #[test]
    fn many_sliding_widths_share_one_list() {
        let mut w = Windows::default();
        assert!(w.keep(WindowSpec::Sliding(1_000)));
        assert!(!w.keep(WindowSpec::Sliding(5 * 3_600_000))); // wider: reload
        for i in 0..20 {
            let t = T0 + i * 500; // 2 per second for 10 s
            w.add(t, 1, 10, t);
        }
        let now = T0 + 9_500;
        w.prune(now);
        // 1 s: events with t > now - 1000, i.e. at now - 500 and now
        assert_eq!(w.counts(WindowSpec::Sliding(1_000), now), Some(Counts::of(2, 20)));
        assert_eq!(w.minute().requests, 20);
        // out of order, inside the minute but before the 1 s window
        w.add(now - 5_000, 1, 0, now);
        assert_eq!(w.counts(WindowSpec::Sliding(1_000), now).map(|c| c.requests), Some(2));
        assert_eq!(w.minute().requests, 21);
        let later = T0 + 3_600_000;
        w.prune(later);
        assert_eq!(w.minute().requests, 0);
        assert_eq!(w.counts(WindowSpec::Sliding(5 * 3_600_000), later).map(|c| c.requests), Some(21));
        assert_eq!(
            w.release_time(WindowSpec::Sliding(5 * 3_600_000), Metric::Requests, 1, later),
            Some(T0 + 5 * 3_600_000)
        );
        // a narrower window added later counts what the list holds
        assert!(w.keep(WindowSpec::Sliding(2 * 3_600_000)));
        assert_eq!(w.counts(WindowSpec::Sliding(2 * 3_600_000), later).map(|c| c.requests), Some(21));
    }

    #[test]
    fn calendar_periods_count_since_their_start() {
        let mut w = Windows::default();
        assert!(!w.keep(WindowSpec::Calendar(Period::Month)));
        let month_start = Calendar::utc().period_start(Period::Month, T0);
        let next = Calendar::utc().next_period_start(Period::Month, T0);
        w.add(month_start, 1, 3, T0);
        w.add(month_start - 1, 1, 3, T0); // last month
        w.prune(T0);
        assert_eq!(w.counts(WindowSpec::Calendar(Period::Month), T0), Some(Counts::of(1, 3)));
        assert_eq!(w.release_time(WindowSpec::Calendar(Period::Month), Metric::Tokens, 1, T0), Some(next));
        w.prune(next);
        assert_eq!(w.counts(WindowSpec::Calendar(Period::Month), next), Some(Counts::default()));
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
