//! Cooldown decisions (SPEC §6.1, §6.2): pure rules over counts the engine supplies.
use crate::core::clock::DAY_MS;
use crate::core::parse::FailureKind;
use crate::core::types::CooldownSource;

/// A bench chosen for a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CooldownDecision {
    pub duration_ms: i64,
    pub source: CooldownSource,
}

impl CooldownDecision {
    pub const fn new(duration_ms: i64, source: CooldownSource) -> Self {
        Self { duration_ms, source }
    }
}

/// A local endpoint's bench: whatever the failure (SPEC §6.1 step 1).
pub const LOCAL_BENCH_MS: i64 = 5_000;
/// A transient rate-limit bench; takes no ladder step.
pub const TRANSIENT_BENCH_MS: i64 = 90_000;
/// The cap of a step taken only because limits are unknown.
pub const UNKNOWN_LIMIT_MAX_MS: i64 = 600_000;
/// Ladder steps per (platform, model_id, key_id) over a rolling 24 h.
pub const LADDER_MS: [i64; 4] = [120_000, 600_000, 3_600_000, DAY_MS];
/// A key's 401 ladder over a rolling 24 h.
pub const AUTH_LADDER_MS: [i64; 4] = [300_000, 1_800_000, 7_200_000, DAY_MS];
/// Window of the unknown-limit heuristic.
pub const UNKNOWN_HIT_WINDOW_MS: i64 = 3_600_000;
/// Empty completions in a row before the route is benched.
pub const EMPTY_STREAK_BENCH: i64 = 3;
/// A short stated delay is believed only on a route's first transient bench in
/// this long (SPEC 15.2).
pub const TRANSIENT_MEMORY_MS: i64 = 600_000;
/// The shortest bench a short stated delay gives (SPEC 15.2).
pub const MIN_STATED_BENCH_MS: i64 = 1_000;
/// A learned key concurrency cap's first wait before it rises by one (SPEC 24.2).
pub const CONCURRENCY_WAIT_MS: i64 = 3_600_000;
/// The longest wait of a learned key concurrency cap (SPEC 24.2).
pub const CONCURRENCY_WAIT_MAX_MS: i64 = DAY_MS;
/// The concurrency failures of a key kept at most (see [`concurrency_chain_start`]).
pub const CONCURRENCY_CHAIN_KEPT: usize = 6;

/// The wait in force after each failure of a chain of concurrency failures
/// `(hit_at_ms, cap)` in time order (SPEC 24.2): 1 h after the first; after a later
/// one, double the previous wait (at most 24 h) when the cap rose since the previous
/// failure (its wait had passed), else 1 h again.
pub fn concurrency_waits(chain: &[(i64, i64)]) -> Vec<i64> {
    let mut waits = Vec::with_capacity(chain.len());
    let mut prev: Option<(i64, i64)> = None;
    for &(at, _) in chain {
        let wait = match prev {
            Some((t, w)) if at.saturating_sub(t) >= w => w.saturating_mul(2).min(CONCURRENCY_WAIT_MAX_MS),
            _ => CONCURRENCY_WAIT_MS,
        };
        waits.push(wait);
        prev = Some((at, wait));
    }
    waits
}

/// The key concurrency cap a chain of concurrency failures `(hit_at_ms, cap)` in time
/// order holds at `now` (SPEC 24.2): the latest failure's cap, plus one for each wait
/// passed since it (a rise starts the next wait). Never forgotten; `None` without
/// failures.
pub fn learned_concurrency_cap(chain: &[(i64, i64)], now: i64) -> Option<i64> {
    let &(at, cap) = chain.last()?;
    let wait = *concurrency_waits(chain).last()?;
    let rises = now.saturating_sub(at).max(0) / wait.max(1);
    Some(cap.max(1).saturating_add(rises))
}

/// Where the part of a chain of concurrency failures worth keeping starts: from the
/// last failure that set the wait back to 1 h (the earlier ones no longer count), and
/// at most the last [`CONCURRENCY_CHAIN_KEPT`] (a chain of doublings that long is at
/// 24 h whatever came before). The kept part gives the same cap at every later time.
pub fn concurrency_chain_start(chain: &[(i64, i64)]) -> usize {
    let reset = concurrency_waits(chain).iter().rposition(|w| *w == CONCURRENCY_WAIT_MS).unwrap_or_default();
    reset.max(chain.len().saturating_sub(CONCURRENCY_CHAIN_KEPT))
}
/// A model that failed server-side ranks after healthy ones for this long (SPEC 24.7).
pub const MODEL_PENALTY_MS: i64 = 300_000;

/// The `n`-th step (1-based) of a ladder; later steps stay on the last rung.
pub fn ladder_step(ladder: &[i64; 4], n: i64) -> i64 {
    let i = usize::try_from(n.saturating_sub(1).clamp(0, 3)).unwrap_or(3);
    ladder[i]
}

/// What step 2-5 of SPEC §6.1 need to know.
#[derive(Debug, Clone, Copy, Default)]
pub struct LimitFacts {
    /// RPD used >= rpd, or TPD used >= tpd.
    pub daily_exhausted: bool,
    /// rpd and tpd both unknown, with a quota signal, and >= 2 unknown-limit hits
    /// in the last hour (this one included).
    pub effectively_exhausted: bool,
    /// Ladder steps already taken in the last 24 h.
    pub ladder_steps: i64,
    /// The route had a transient bench in the last 10 minutes (SPEC 15.2).
    pub recent_transient: bool,
}

/// SPEC §6.1 steps 4-5 (with 15.2's short delay), `next_day_start` the start of the
/// route's next day. Returns the decision and whether a ladder step was taken.
pub fn decide_limit(
    facts: LimitFacts, retry_after_ms: Option<i64>, now: i64, next_day_start: i64,
) -> (CooldownDecision, bool) {
    let mut bench = TRANSIENT_BENCH_MS;
    let mut stepped = false;
    if facts.daily_exhausted || facts.effectively_exhausted {
        bench = ladder_step(&LADDER_MS, facts.ladder_steps.saturating_add(1));
        stepped = true;
        if facts.daily_exhausted {
            // The day windows that exhausted it reset at the start of the next day.
            bench = bench.min(next_day_start.saturating_sub(now));
        } else {
            bench = bench.min(UNKNOWN_LIMIT_MAX_MS);
        }
    }
    let decision = match retry_after_ms {
        Some(ra) if ra > bench => CooldownDecision::new(ra.min(DAY_MS), CooldownSource::Authoritative),
        // 15.2: the route's first transient bench in 10 minutes believes a short delay
        // (a minute window that frees in 3 s should not idle 90 s); a repeat does not.
        Some(ra) if ra < bench && !stepped && !facts.recent_transient => {
            CooldownDecision::new(ra.max(MIN_STATED_BENCH_MS), CooldownSource::Authoritative)
        }
        _ => CooldownDecision::new(bench, CooldownSource::Heuristic),
    };
    (decision, stepped)
}

/// How a kind benches (SPEC §6.2), before the local-endpoint override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindRule {
    Fixed(CooldownDecision),
    AuthLadder,
    DailyQuota,
    /// Benches nothing; learns a key concurrency cap (SPEC 15.4, 24.2).
    Concurrency,
    /// Benches the model for every key of the platform (SPEC 21.1).
    Upstream,
    Limit {
        quota_signal: bool,
    },
    EmptyStreak,
    None,
}

pub fn kind_rule(kind: FailureKind) -> KindRule {
    match kind {
        FailureKind::Payment => KindRule::Fixed(CooldownDecision::new(DAY_MS, CooldownSource::Credit)),
        FailureKind::Forbidden => KindRule::Fixed(CooldownDecision::new(DAY_MS, CooldownSource::Tier)),
        FailureKind::Auth => KindRule::AuthLadder,
        FailureKind::Upstream => KindRule::Upstream,
        FailureKind::DailyQuota => KindRule::DailyQuota,
        FailureKind::Concurrency => KindRule::Concurrency,
        FailureKind::RateLimit => KindRule::Limit { quota_signal: true },
        FailureKind::Timeout | FailureKind::ServerError | FailureKind::Transport => {
            KindRule::Limit { quota_signal: false }
        }
        FailureKind::EmptyCompletion => KindRule::EmptyStreak,
        FailureKind::Other => KindRule::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOON: i64 = 1_767_268_800_000; // 2026-01-01 12:00 UTC
    const NEXT_DAY: i64 = NOON + DAY_MS / 2;

    #[test]
    fn transient_bench_takes_no_step() {
        let (d, stepped) = decide_limit(LimitFacts::default(), None, NOON, NEXT_DAY);
        assert_eq!(d, CooldownDecision::new(90_000, CooldownSource::Heuristic));
        assert!(!stepped);
    }

    #[test]
    fn ladder_climbs_and_stays_on_last_rung() {
        let steps: Vec<i64> = (0..6)
            .map(|n| {
                decide_limit(
                    LimitFacts { daily_exhausted: true, ladder_steps: n, ..Default::default() },
                    None,
                    NOON,
                    NEXT_DAY,
                )
                .0
                .duration_ms
            })
            .collect();
        // 24 h would pass midnight: capped at the 12 h left.
        assert_eq!(steps, vec![120_000, 600_000, 3_600_000, 43_200_000, 43_200_000, 43_200_000]);
    }

    #[test]
    fn unknown_limits_cap_at_ten_minutes() {
        let f = LimitFacts { effectively_exhausted: true, ladder_steps: 3, ..Default::default() };
        assert_eq!(decide_limit(f, None, NOON, NEXT_DAY).0.duration_ms, 600_000);
    }

    #[test]
    fn longer_retry_after_wins_and_is_authoritative() {
        let (d, _) = decide_limit(LimitFacts::default(), Some(120_000), NOON, NEXT_DAY);
        assert_eq!(d, CooldownDecision::new(120_000, CooldownSource::Authoritative));
        // Shorter than the bench: 6.1 step 5 keeps the bench on a repeat (15.2).
        let repeat = LimitFacts { recent_transient: true, ..Default::default() };
        let (d, _) = decide_limit(repeat, Some(30_000), NOON, NEXT_DAY);
        assert_eq!(d, CooldownDecision::new(90_000, CooldownSource::Heuristic));
        let (d, _) = decide_limit(LimitFacts::default(), Some(10 * DAY_MS), NOON, NEXT_DAY);
        assert_eq!(d.duration_ms, DAY_MS);
    }

    #[test]
    fn a_short_delay_is_believed_on_the_first_transient_bench_only() {
        let first = LimitFacts::default();
        let (d, stepped) = decide_limit(first, Some(3_000), NOON, NEXT_DAY);
        assert_eq!(d, CooldownDecision::new(3_000, CooldownSource::Authoritative));
        assert!(!stepped);
        // At least 1 s, also for "0" or a date in the past.
        let (d, _) = decide_limit(first, Some(0), NOON, NEXT_DAY);
        assert_eq!(d, CooldownDecision::new(1_000, CooldownSource::Authoritative));
        let (d, _) = decide_limit(first, Some(20), NOON, NEXT_DAY);
        assert_eq!(d.duration_ms, 1_000);
        // No stated delay: the transient bench.
        assert_eq!(decide_limit(first, None, NOON, NEXT_DAY).0.duration_ms, 90_000);
        // A repeat within 10 minutes gets 90 s, heuristic, whatever it says.
        let repeat = LimitFacts { recent_transient: true, ..Default::default() };
        let (d, _) = decide_limit(repeat, Some(2_000), NOON, NEXT_DAY);
        assert_eq!(d, CooldownDecision::new(90_000, CooldownSource::Heuristic));
        // A ladder step is not a transient bench: a short delay never shortens it.
        let daily = LimitFacts { daily_exhausted: true, ..Default::default() };
        let (d, _) = decide_limit(daily, Some(2_000), NOON, NEXT_DAY);
        assert_eq!(d, CooldownDecision::new(120_000, CooldownSource::Heuristic));
    }

    #[test]
    fn auth_ladder_steps() {
        assert_eq!(ladder_step(&AUTH_LADDER_MS, 1), 300_000);
        assert_eq!(ladder_step(&AUTH_LADDER_MS, 4), DAY_MS);
        assert_eq!(ladder_step(&AUTH_LADDER_MS, 9), DAY_MS);
    }

    const H: i64 = 3_600_000;

    /// SPEC 24.2: a chain of concurrency failures `(hour, cap)` -> the cap at hours.
    #[test]
    fn a_learned_concurrency_cap_settles() {
        let at = |chain: &[(i64, i64)], hours: &[i64]| -> Vec<Option<i64>> {
            let chain: Vec<(i64, i64)> = chain.iter().map(|&(t, c)| (NOON + t * H, c)).collect();
            hours.iter().map(|h| learned_concurrency_cap(&chain, NOON + h * H)).collect()
        };
        // (failures (hour, cap), hours, caps at those hours)
        type Row<'a> = (&'a [(i64, i64)], &'a [i64], &'a [i64]);
        let table: &[Row] = &[
            // One failure: 2, then one more each hour, never forgotten.
            (&[(0, 2)], &[0, 1, 2, 72], &[2, 3, 4, 74]),
            // A failure after a rise doubles the wait: 2 h, then 4 h.
            (&[(0, 2), (1, 2)], &[1, 2, 3, 4, 5], &[2, 2, 3, 3, 4]),
            (&[(0, 2), (1, 2), (3, 2)], &[3, 6, 7, 11], &[2, 2, 3, 4]),
            // A failure with no rise in between sets it back to 1 h.
            (&[(0, 2), (1, 2), (2, 2)], &[2, 3, 4], &[2, 3, 4]),
            // The wait is at most 24 h: 1, 2, 4, 8, 16, 24, 24.
            (&[(0, 2), (1, 2), (3, 2), (7, 2), (15, 2), (31, 2), (55, 2)], &[55, 78, 79, 103], &[2, 2, 3, 4]),
            // A failure sets the cap, even above the cap in force (it is what was live).
            (&[(0, 1), (0, 3)], &[0, 1], &[3, 4]),
            // A cap of 0 is 1.
            (&[(0, 0)], &[0], &[1]),
        ];
        for (chain, hours, caps) in table {
            let want: Vec<Option<i64>> = caps.iter().map(|c| Some(*c)).collect();
            assert_eq!(at(chain, hours), want, "{chain:?}");
        }
        let one = [(NOON, 2)];
        assert_eq!(learned_concurrency_cap(&one, NOON + H - 1), Some(2));
        assert_eq!(learned_concurrency_cap(&one, NOON + H), Some(3));
        // A clock before the failure: its cap.
        assert_eq!(learned_concurrency_cap(&one, NOON - 5 * H), Some(2));
        assert_eq!(learned_concurrency_cap(&[], NOON), None);
    }

    /// The kept part of a chain gives the same wait as the whole, so the same caps.
    #[test]
    fn a_kept_concurrency_chain_holds_the_same_cap() {
        let hours = |hs: &[i64]| -> Vec<(i64, i64)> { hs.iter().map(|h| (NOON + h * H, 2)).collect() };
        let doubling = hours(&[0, 1, 3, 7, 15, 31, 55, 79, 103]);
        assert_eq!(concurrency_waits(&doubling)[8], DAY_MS);
        for n in 1..=doubling.len() {
            let chain = &doubling[..n];
            let start = concurrency_chain_start(chain);
            assert!(chain.len() - start <= CONCURRENCY_CHAIN_KEPT);
            for later in [0, 1, 5, 25, 49, 200] {
                let now = chain[n - 1].0 + later * H;
                assert_eq!(
                    learned_concurrency_cap(&chain[start..], now),
                    learned_concurrency_cap(chain, now)
                );
            }
        }
        // After a reset only the reset on counts.
        let reset = hours(&[0, 1, 3, 4, 5]);
        assert_eq!(concurrency_waits(&reset), vec![H, 2 * H, 4 * H, H, 2 * H]);
        assert_eq!(concurrency_chain_start(&reset), 3);
    }
}
