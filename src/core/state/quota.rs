//! The mirrored observed provider quota (SPEC §8.2): one merged row per (platform,
//! key, pool, metric), kept current from the change feed like the other small tables,
//! so that the headroom a `headroom` pick and `key_quota_headroom` read is the
//! mirror's, not a read of the store.
use crate::core::state::FastMap;
use crate::core::store::QuotaStateRow;

/// The least confidence of a row that counts for the headroom (SPEC §8.2).
const HEADROOM_CONFIDENCE: f64 = 0.7;

/// The observed quota rows, by platform.
#[derive(Debug, Default)]
pub struct Quota {
    by_platform: FastMap<String, Vec<QuotaStateRow>>,
}

impl Quota {
    /// A platform's rows (none when it has no observation).
    pub fn of(&self, platform: &str) -> &[QuotaStateRow] {
        self.by_platform.get(platform).map_or(&[], Vec::as_slice)
    }

    /// Sets one row (a new one, or the merged row of its key, pool and metric).
    pub fn put(&mut self, row: QuotaStateRow) {
        let rows = self.by_platform.entry(row.platform.clone()).or_default();
        match rows
            .iter_mut()
            .find(|r| r.key_id == row.key_id && r.pool_key == row.pool_key && r.metric == row.metric)
        {
            Some(r) => *r = row,
            None => rows.push(row),
        }
    }

    /// Replaces every row with the stored ones (the store's whole table).
    pub fn replace(&mut self, rows: Vec<QuotaStateRow>) {
        self.by_platform.clear();
        for r in rows {
            self.put(r);
        }
    }

    /// SPEC §8.2: per key of the platform, the worst `min(1, remaining / limit)` over
    /// its rows of confidence >= 0.7 with a known remaining and a limit > 0 (a row past
    /// its reset counts 1.0); keys without such a row are absent. Sorted by key.
    pub fn headroom(&self, platform: &str, now: i64) -> Vec<(i64, f64)> {
        let mut worst: Vec<(i64, f64)> = Vec::new();
        for (key_id, h) in
            self.of(platform).iter().filter_map(|r| row_headroom(r, now).map(|h| (r.key_id, h)))
        {
            match worst.iter_mut().find(|(k, _)| *k == key_id) {
                Some((_, w)) => *w = w.min(h),
                None => worst.push((key_id, h)),
            }
        }
        worst.sort_by_key(|(k, _)| *k);
        worst
    }

    /// [`Quota::headroom`] of one key: `None` when it has no row that counts.
    pub fn key_headroom(&self, platform: &str, key_id: i64, now: i64) -> Option<f64> {
        self.of(platform)
            .iter()
            .filter(|r| r.key_id == key_id)
            .filter_map(|r| row_headroom(r, now))
            .reduce(f64::min)
    }
}

/// The headroom one row tells of, when it counts (see [`Quota::headroom`]).
fn row_headroom(r: &QuotaStateRow, now: i64) -> Option<f64> {
    if r.confidence < HEADROOM_CONFIDENCE {
        return None;
    }
    let (Some(remaining), Some(limit)) = (r.remaining, r.limit) else { return None };
    if limit <= 0 {
        return None;
    }
    Some(if r.reset_at_ms.is_some_and(|t| t <= now) {
        1.0
    } else {
        (remaining.max(0) as f64 / limit as f64).min(1.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        key_id: i64, metric: &str, limit: Option<i64>, remaining: Option<i64>, confidence: f64,
    ) -> QuotaStateRow {
        QuotaStateRow {
            platform: "acme".into(),
            key_id,
            pool_key: "acme::account".into(),
            metric: metric.into(),
            limit,
            remaining,
            reset_at_ms: Some(1_000),
            source: "header".into(),
            confidence,
            observed_at_ms: 0,
        }
    }

    #[test]
    fn the_headroom_is_the_worst_counting_row_per_key() {
        let mut q = Quota::default();
        q.put(row(2, "requests", Some(100), Some(80), 1.0));
        q.put(row(1, "requests", Some(100), Some(50), 1.0));
        q.put(row(1, "tokens", Some(1000), Some(100), 1.0));
        q.put(row(3, "requests", Some(100), Some(10), 0.6)); // below the confidence floor
        q.put(row(4, "requests", Some(0), Some(0), 1.0)); // no limit
        q.put(row(5, "requests", Some(100), Some(150), 0.7)); // clamped to 1
        assert_eq!(q.headroom("acme", 0), vec![(1, 0.1), (2, 0.8), (5, 1.0)]);
        assert_eq!(q.key_headroom("acme", 1, 0), Some(0.1));
        assert_eq!(q.key_headroom("acme", 3, 0), None);
        // Past the reset, a row counts 1.0.
        assert_eq!(q.headroom("acme", 1_000), vec![(1, 1.0), (2, 1.0), (5, 1.0)]);
        // A row merged again replaces its old self.
        q.put(row(1, "tokens", Some(1000), Some(900), 1.0));
        assert_eq!(q.key_headroom("acme", 1, 0), Some(0.5));
        assert!(q.headroom("mistral", 0).is_empty());
        q.replace(vec![row(7, "requests", Some(10), Some(5), 1.0)]);
        assert_eq!(q.headroom("acme", 0), vec![(7, 0.5)]);
    }
}
