//! The write lock kept across calls (grouped writes): while this engine is the
//! store's only one, a hot-path section takes the write lock and keeps it for at most
//! a hold period; calls meanwhile neither read nor write the store, their writes wait
//! in the buffer for the commit that ends it.
use crate::core::store::Store;
use std::time::{Duration, Instant};

/// Longest a sole engine keeps the write lock across calls (grouped writes): another
/// engine opening the file waits at most this long for it.
pub(crate) const HOLD_MAX_MS: i64 = 10;

#[derive(Default)]
pub(super) struct Hold {
    /// With grouped writes, how long the write lock may be kept from one call to the
    /// next while this engine is the store's only one (`None`: never).
    period: Option<Duration>,
    /// Since when this engine keeps the store's write lock (an open transaction)
    /// across calls.
    since: Option<Instant>,
    /// When to ask the store again whether this engine is its only one.
    next_sole_check: Option<Instant>,
}

impl Hold {
    pub(super) fn set_period(&mut self, period: Duration) {
        self.period = Some(period);
    }

    pub(super) fn period(&self) -> Option<Duration> {
        self.period
    }

    /// The write lock is kept across calls.
    pub(super) fn held(&self) -> bool {
        self.since.is_some()
    }

    /// From now on the write lock is kept across calls.
    pub(super) fn start(&mut self) {
        self.since = Some(Instant::now());
    }

    /// The write lock is no longer kept; true when it was.
    pub(super) fn end(&mut self) -> bool {
        self.since.take().is_some()
    }

    /// Whether a hot-path section may take the write lock and keep it across calls:
    /// grouped writes are on and no other engine has the store open (asked at most
    /// once per hold period while others do).
    pub(super) fn may_start(&mut self, store: &mut dyn Store) -> bool {
        let Some(period) = self.period else { return false };
        let now = Instant::now();
        if self.next_sole_check.is_some_and(|t| now < t) {
            return false;
        }
        if store.sole_writer() {
            return true;
        }
        self.next_sole_check = Some(now + period);
        false
    }

    /// No write lock is kept across calls, or its period ran out.
    pub(super) fn period_over(&self) -> bool {
        self.since.zip(self.period).is_none_or(|(t, period)| t.elapsed() >= period)
    }
}
