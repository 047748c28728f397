//! The engine's configuration as mirrored: the priority reserves (SPEC 22.1).

/// SPEC 22.1: (priority, reserve fraction) as stored, by priority.
#[derive(Debug, Default)]
pub struct Reserves {
    rows: Vec<(i64, f64)>,
}

impl Reserves {
    /// SPEC 22.1: the reserve of a call of `priority`, the fraction set for the largest
    /// configured priority `<= priority` (0 when none).
    #[inline]
    pub fn for_priority(&self, priority: i64) -> f64 {
        if self.rows.is_empty() {
            return 0.0;
        }
        self.rows.iter().rev().find(|(p, _)| *p <= priority).map_or(0.0, |(_, f)| *f)
    }

    /// Replaces the stored reserves (the store's whole table).
    pub fn replace(&mut self, mut rows: Vec<(i64, f64)>) {
        rows.sort_by_key(|(p, _)| *p);
        rows.dedup_by_key(|(p, _)| *p);
        self.rows = rows;
    }

    /// Sets one priority's reserve.
    pub fn put(&mut self, priority: i64, fraction: f64) {
        match self.rows.binary_search_by_key(&priority, |(p, _)| *p) {
            Ok(i) => self.rows[i].1 = fraction,
            Err(i) => self.rows.insert(i, (priority, fraction)),
        }
    }
}
