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
/// A learned key concurrency cap is forgotten this long after the last failure that
/// taught or confirmed it (SPEC 15.4).
pub const LEARNED_CAP_TTL_MS: i64 = 3_600_000;
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
    /// Benches nothing; learns a key concurrency cap (SPEC 15.4).
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
}
