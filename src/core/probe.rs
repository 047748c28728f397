//! Early recovery of heuristic cooldowns (SPEC §11): which keys a pass probes, and
//! each key's pacing. Pure logic; the engine supplies cooldowns and the clock, the
//! caller runs the validator outside every lock.
use crate::core::types::{Cooldown, CooldownSource};
use std::collections::{BTreeMap, BTreeSet};

/// A cooldown is ripe when at least this much of it remains...
pub const RIPE_MIN_REMAINING_MS: i64 = 60_000;
/// ...and at least half of its bench has been served.
pub const FIRST_PROBE_JITTER_MS: f64 = 45_000.0;
/// Backoff after failed probes: 2, 4, 8, then 15 min.
pub const BACKOFF_MS: [i64; 4] = [120_000, 240_000, 480_000, 900_000];
/// Pacing of a key that no longer holds a probeable cooldown is dropped after this.
pub const PACING_FORGET_MS: i64 = 900_000;

/// Says whether a key works. Implementations must not touch the engine lock.
pub trait Validator: Send + Sync {
    fn probe(&self, key_id: i64) -> bool;
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Pacing {
    /// When the key may be probed next.
    next_probe_at_ms: i64,
    /// Failed probes in a row.
    failures: u32,
    /// When the key's last probeable cooldown went (or will go: its latest expiry
    /// while it still holds one).
    gone_at_ms: i64,
}

/// Per-key pacing across passes.
#[derive(Debug, Default)]
pub struct ProbeState {
    keys: BTreeMap<i64, Pacing>,
}

/// Whether a cooldown may be probed at `now` (SPEC §11).
pub fn is_ripe(c: &Cooldown, now: i64) -> bool {
    let remaining = c.expires_at_ms.saturating_sub(now);
    let bench = c.expires_at_ms.saturating_sub(c.set_at_ms);
    let served = now.saturating_sub(c.set_at_ms);
    c.source == CooldownSource::Heuristic
        && remaining >= RIPE_MIN_REMAINING_MS
        && served.saturating_mul(2) >= bench
}

impl ProbeState {
    /// Plans one pass: updates sightings and first-probe schedules, and returns the
    /// keys to probe now (at most `budget`, lowest key id first).
    pub fn plan(
        &mut self, probeable: &[Cooldown], now: i64, budget: usize, jitter: &mut dyn FnMut() -> f64,
    ) -> Vec<i64> {
        let mut holding: BTreeMap<i64, i64> = BTreeMap::new();
        for c in probeable {
            let e = holding.entry(c.route.key_id).or_insert(c.expires_at_ms);
            *e = (*e).max(c.expires_at_ms);
        }
        for (k, p) in self.keys.iter_mut() {
            match holding.get(k) {
                Some(expires) => p.gone_at_ms = *expires,
                // Cleared before its expiry (a probe, the operator): it went by now.
                None if p.gone_at_ms > now => p.gone_at_ms = now,
                None => {}
            }
        }
        // Forget keys whose last probeable cooldown went 15 min ago; a key benched
        // again sooner keeps its backoff.
        self.keys
            .retain(|k, p| holding.contains_key(k) || now.saturating_sub(p.gone_at_ms) < PACING_FORGET_MS);
        let ripe: BTreeSet<i64> =
            probeable.iter().filter(|c| is_ripe(c, now)).map(|c| c.route.key_id).collect();
        let mut due = Vec::new();
        for k in ripe {
            match self.keys.get(&k) {
                None => {
                    // First sighting: schedule, spend no budget.
                    let j = jitter();
                    let j = if j.is_finite() { j.clamp(0.0, 1.0) } else { 0.0 };
                    let delay = (j * FIRST_PROBE_JITTER_MS).floor() as i64;
                    self.keys.insert(
                        k,
                        Pacing {
                            next_probe_at_ms: now.saturating_add(delay),
                            failures: 0,
                            gone_at_ms: holding.get(&k).copied().unwrap_or(now),
                        },
                    );
                }
                Some(p) if now >= p.next_probe_at_ms && due.len() < budget => due.push(k),
                Some(_) => {}
            }
        }
        due
    }

    /// Records a probe's result: a failure backs the key off.
    pub fn record(&mut self, key_id: i64, passed: bool, now: i64) {
        let p = self.keys.entry(key_id).or_insert(Pacing { gone_at_ms: now, ..Pacing::default() });
        if passed {
            p.failures = 0;
            p.next_probe_at_ms = now;
        } else {
            let i = (p.failures as usize).min(BACKOFF_MS.len() - 1);
            p.failures = p.failures.saturating_add(1);
            p.next_probe_at_ms = now.saturating_add(BACKOFF_MS[i]);
        }
    }

    /// When a key may be probed next (tests, status).
    pub fn next_probe_at(&self, key_id: i64) -> Option<i64> {
        self.keys.get(&key_id).map(|p| p.next_probe_at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::types::Route;

    const T: i64 = 1_767_268_800_000;

    fn cd(key: i64, set_at: i64, expires: i64) -> Cooldown {
        Cooldown {
            route: Route::new("acme", "m", key).unwrap_or_else(|_| unreachable!()),
            expires_at_ms: expires,
            source: CooldownSource::Heuristic,
            set_at_ms: set_at,
            model_wide: false,
        }
    }

    #[test]
    fn ripeness_needs_half_served_and_a_minute_left() {
        let c = cd(1, T, T + 600_000);
        assert!(!is_ripe(&c, T + 299_999));
        assert!(is_ripe(&c, T + 300_000));
        assert!(is_ripe(&c, T + 540_000));
        assert!(!is_ripe(&c, T + 540_001));
    }

    #[test]
    fn first_sighting_is_scheduled_then_probed_within_budget() {
        let mut s = ProbeState::default();
        let cds: Vec<Cooldown> = (1..=5).map(|k| cd(k, T, T + 3_600_000)).collect();
        let now = T + 2_000_000;
        assert!(s.plan(&cds, now, 3, &mut || 0.5).is_empty());
        assert_eq!(s.next_probe_at(1), Some(now + 22_500));
        assert!(s.plan(&cds, now + 22_499, 3, &mut || 0.5).is_empty());
        assert_eq!(s.plan(&cds, now + 22_500, 3, &mut || 0.5), vec![1, 2, 3]);
    }

    #[test]
    fn failures_back_off_and_pacing_is_forgotten_after_fifteen_minutes() {
        let mut s = ProbeState::default();
        let now = T;
        for (i, want) in [120_000, 240_000, 480_000, 900_000, 900_000].into_iter().enumerate() {
            let t = now + i as i64;
            s.record(7, false, t);
            assert_eq!(s.next_probe_at(7), Some(t + want));
        }
        // no probeable cooldown for 15 min: forgotten
        s.plan(&[], now + PACING_FORGET_MS - 1, 3, &mut || 0.0);
        assert!(s.next_probe_at(7).is_some());
        s.plan(&[], now + PACING_FORGET_MS, 3, &mut || 0.0);
        assert!(s.next_probe_at(7).is_none());
    }
}
