//! The writes waiting for the store: applied to the mirror, not yet committed
//! (degraded mode, SPEC 18.2, or grouped by `flush_interval_ms`), compacted so that
//! however long an outage lasts the buffer holds about the windows' width of events.
use super::retention::Retention;
use crate::core::clock::MINUTE_MS;
use crate::core::store::{LeaseRow, UsageMergeKey, UsageRow, Write};
use std::collections::{HashMap, HashSet};

/// Above this many buffered writes the buffer is compacted (`compact_pending`).
const COMPACT_MIN: usize = 4096;

/// SPEC 18.2: buffered `server_logs` rows kept while the store fails.
pub(super) const MAX_BUFFERED_LOGS: usize = 10_000;

/// The writes applied to the mirror but not yet to the store, in order, with the
/// leases among them taken or ended while they waited.
pub(super) struct Buffer {
    pub(super) writes: Vec<Write>,
    /// Stored leases whose deletion is in `writes`.
    pub(super) deleted: HashSet<i64>,
    /// Leases whose insertion is in `writes` (taken while degraded).
    pub(super) inserted: HashSet<i64>,
    compact_at: usize,
    /// Engine time of the oldest write in `writes`.
    pub(super) since: Option<i64>,
    /// Buffered `server_logs` rows were dropped during this outage (warned once).
    logs_dropped: bool,
}

impl Buffer {
    pub(super) fn new() -> Buffer {
        Buffer {
            writes: Vec::new(),
            deleted: HashSet::new(),
            inserted: HashSet::new(),
            compact_at: COMPACT_MIN,
            since: None,
            logs_dropped: false,
        }
    }

    /// What a flush writes: less a lease taken and finished while both waited here
    /// (it never reaches the store), and a usage row buffered past the retention.
    pub(super) fn live(&self, retention: Option<&Retention>) -> Vec<&Write> {
        let (inserted, deleted) = (&self.inserted, &self.deleted);
        self.writes
            .iter()
            .filter(|w| match w {
                Write::InsertLease(l) => !deleted.contains(&l.id),
                Write::DeleteLease(id) => !inserted.contains(id),
                Write::Usage(u) => retention.is_none_or(|r| r.keeps(u)),
                _ => true,
            })
            .collect()
    }

    /// After a commit that took the buffer with it: nothing waits any more.
    #[inline]
    pub(super) fn flushed(&mut self) {
        self.writes.clear();
        self.deleted.clear();
        self.inserted.clear();
        self.since = None;
        self.compact_at = COMPACT_MIN;
        self.logs_dropped = false;
    }

    /// Keeps a write for the store; true when the buffer is due for compaction.
    pub(super) fn push(&mut self, w: Write, now: i64, held: bool) -> bool {
        if self.since.is_none() {
            self.since = Some(now);
        }
        match w {
            Write::Sweep { .. } => return false,
            // A lease taken while degraded is written when the store answers again,
            // so that other processes count it from then on.
            Write::InsertLease(LeaseRow { id, .. }) => {
                self.inserted.insert(id);
                self.writes.push(w);
            }
            Write::DeleteLease(id) => {
                self.deleted.insert(id);
                self.writes.push(w);
            }
            w => self.writes.push(w),
        }
        // A held lock's writes are committed within its period: nothing to merge.
        self.writes.len() >= self.compact_at && !held
    }

    /// After a compaction: the next one when the buffer has doubled.
    pub(super) fn compacted(&mut self) {
        self.compact_at = (self.writes.len() * 2).max(COMPACT_MIN);
    }

    /// Compacts the buffer (see `Unit::compact_pending`): usage `retention` does
    /// not keep goes, older than a minute is merged per (route, kind, UTC minute).
    /// True when `server_logs` rows were dropped for the first time in this outage.
    pub(super) fn compact(&mut self, now: i64, retention: &Retention) -> bool {
        let logs = self.writes.iter().filter(|w| matches!(w, Write::Log(_))).count();
        let mut logs_to_drop = logs.saturating_sub(MAX_BUFFERED_LOGS);
        let horizon = now.saturating_sub(MINUTE_MS);
        let mut merged: HashMap<UsageMergeKey, UsageRow> = HashMap::new();
        let mut kept = Vec::with_capacity(self.writes.len());
        let mut order = Vec::new();
        let mut quota_at: HashMap<(String, i64, String, String), usize> = HashMap::new();
        let (inserted, deleted) = (&self.inserted, &self.deleted);
        let mut ended = Vec::new();
        for w in self.writes.drain(..) {
            match w {
                Write::Usage(u) if !retention.keeps(&u) => {}
                Write::Usage(u) if u.created_at_ms <= horizon => {
                    let key = u.merge_key();
                    match merged.get_mut(&key) {
                        Some(m) => m.absorb(&u),
                        None => {
                            order.push(key.clone());
                            merged.insert(key, u);
                        }
                    }
                }
                Write::InsertLease(l) if deleted.contains(&l.id) => ended.push(l.id),
                Write::DeleteLease(id) if inserted.contains(&id) => {}
                Write::Log(_) if logs_to_drop > 0 => logs_to_drop -= 1,
                Write::UpsertQuotaState(q) => {
                    let key = (q.platform.clone(), q.key_id, q.pool_key.clone(), q.metric.clone());
                    match quota_at.get(&key) {
                        Some(&i) => kept[i] = Write::UpsertQuotaState(q),
                        None => {
                            quota_at.insert(key, kept.len());
                            kept.push(Write::UpsertQuotaState(q));
                        }
                    }
                }
                w => kept.push(w),
            }
        }
        for id in ended {
            self.inserted.remove(&id);
            self.deleted.remove(&id);
        }
        self.writes =
            order.into_iter().filter_map(|k| merged.remove(&k)).map(Write::Usage).chain(kept).collect();
        let first_drop = logs > MAX_BUFFERED_LOGS && !self.logs_dropped;
        self.logs_dropped |= first_drop;
        first_drop
    }
}
