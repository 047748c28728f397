//! The mirror's own tests: retention, reserves, gates over a view, lease expiry.
use super::*;
use crate::core::admission::admit;
use crate::core::types::{Admission, Reason};

/// Every gate on the route's view (`check()`'s answer).
fn evaluate(m: &Mirror, rid: RouteId, est: Estimate, ctx: &GateContext, now: i64) -> Admission {
    admit(&m.route_view(rid, ctx, est, now)).admission()
}

#[test]
fn multiplier_from_label() {
    assert_eq!(parse_multiplier("150K/day · 2x"), Some(Multiplier { num: 2, den: 1 }));
    assert_eq!(parse_multiplier("1.5x"), Some(Multiplier { num: 15, den: 10 }));
    assert_eq!(parse_multiplier("150K/day"), None);
    assert_eq!(parse_multiplier("0x"), None);
    assert_eq!(Multiplier { num: 15, den: 10 }.bill(3), 5);
    assert_eq!(Multiplier { num: 2, den: 1 }.bill(i64::MAX), i64::MAX);
}

#[test]
#[allow(clippy::unwrap_used)]
fn retention_keeps_each_model_from_its_own_cut_off() {
    // SPEC 14.2: only the models with a week, month or wide sliding window keep
    // rows past the retention, each from its own window in its own calendar.
    let model = |platform: &str, model_id: &str, limits: &str| ModelInfo {
        platform: platform.into(),
        model_id: model_id.into(),
        limits: LimitSet::parse(limits).unwrap(),
        monthly_token_budget: None,
    };
    let mut m = Mirror::default();
    m.put_model(model("mistral", "month", "requests/month=3"));
    m.put_model(model("mistral", "week", "tokens/week=3"));
    m.put_model(model("mistral", "slide", "requests/7d=3"));
    m.put_model(model("mistral", "day", "requests/minute=1 requests/day=5"));
    // A platform whose days start at midnight Pacific time.
    let pacific = crate::core::providers::with_day_zone("America/Los_Angeles");
    m.put_model(model(pacific, "month", "requests/month=3"));
    m.put_model(model("mistral", "minute", "requests/1m=3"));
    let dec10 = 1_796_083_200_000 + 9 * 86_400_000 + 10 * 3_600_000; // Thursday 2026-12-10 10:00 UTC
    let before = dec10 - 3_600_000;
    let kept: Vec<(String, String, i64)> = m
        .retained_usage(dec10, before, false)
        .into_iter()
        .map(|k| (k.platform.to_string(), k.model_id.to_string(), k.before))
        .collect();
    let dec1 = 1_796_083_200_000;
    assert_eq!(
        kept,
        vec![
            (pacific.into(), "month".into(), dec1 + 8 * 3_600_000), // 00:00 Pacific
            ("mistral".into(), "month".into(), dec1),
            ("mistral".into(), "slide".into(), dec10 - 7 * 86_400_000 + 1),
            ("mistral".into(), "week".into(), dec1 + 6 * 86_400_000), // Monday Dec 7
        ]
    );
    // The degraded buffer also keeps today of a model declaring a day window.
    let buffered = m.retained_usage(dec10, before, true);
    let day_model = buffered.iter().find(|k| &*k.model_id == "day").unwrap();
    assert_eq!(day_model.before, dec1 + 9 * 86_400_000);
    // A window that reaches back less than the retention keeps nothing more.
    assert!(m.retained_usage(dec10, dec10 - 30 * 86_400_000, true).is_empty());
}

#[test]
fn a_reserve_keeps_the_floor_of_its_fraction() {
    assert_eq!(crate::core::admission::reserved_limit(10, 0.0), 10);
    assert_eq!(crate::core::admission::reserved_limit(10, 0.2), 8);
    assert_eq!(crate::core::admission::reserved_limit(10, 0.15), 9); // floor(1.5)
    assert_eq!(crate::core::admission::reserved_limit(100, 0.29), 72); // 100 * 0.29 = 28.999999999999996
    assert_eq!(crate::core::admission::reserved_limit(0, 0.5), 0);
    assert_eq!(
        crate::core::admission::reserved_limit(i64::MAX, 0.5),
        i64::MAX - (i64::MAX as f64 * 0.5).floor() as i64
    );
    let mut m = Mirror::default();
    assert_eq!(m.reserves.for_priority(3), 0.0);
    m.reserves.replace(vec![(3, 0.5), (1, 0.2)]);
    assert_eq!([0, 1, 2, 3, 9].map(|p| m.reserves.for_priority(p)), [0.0, 0.2, 0.2, 0.5, 0.5]);
    m.reserves.put(0, 0.1);
    assert_eq!(m.reserves.for_priority(0), 0.1);
}

#[test]
fn gates_refuse_at_limit_and_report_retry() {
    let mut m = Mirror::default();
    let rid = m.route_id("acme", "llama", 1);
    let ctx =
        GateContext { limits: LimitSet::parse("requests/minute=2").expect("limits"), ..Default::default() };
    let t0 = 1_000_000;
    m.add_counts(rid, Counts::of(1, 0), t0, t0);
    assert_eq!(evaluate(&m, rid, Estimate::default(), &ctx, t0), Admission::ALLOWED);
    m.add_counts(rid, Counts::of(1, 0), t0 + 10, t0 + 10);
    let a = evaluate(&m, rid, Estimate::default(), &ctx, t0 + 10);
    assert_eq!(a, Admission::refused(Reason::declared("rpm"), Some(t0 + 60_000)));
    m.prune_route(rid, t0 + 60_000);
    assert!(evaluate(&m, rid, Estimate::default(), &ctx, t0 + 60_000).allowed);
}

#[test]
fn leases_count_until_they_expire() {
    let mut m = Mirror::default();
    let rid = m.route_id("acme", "llama", 1);
    let ctx =
        GateContext { limits: LimitSet::parse("requests/minute=1").expect("limits"), ..Default::default() };
    m.add_lease(
        7,
        LeaseRec {
            route: rid,
            tokens: 5,
            output_tokens: 0,
            cost: 0,
            created_at_ms: 0,
            expires_at_ms: 100,
            tenants: crate::core::tenants::none(),
            others_at_admission: None,
        },
    );
    // only the lease blocks: no retry time for a sliding window
    assert_eq!(
        evaluate(&m, rid, Estimate::default(), &ctx, 50),
        Admission::refused(Reason::declared("rpm"), None)
    );
    // at exactly its max age it still counts; one millisecond later it does not
    m.prune_route(rid, 100);
    assert_eq!(
        evaluate(&m, rid, Estimate::default(), &ctx, 100),
        Admission::refused(Reason::declared("rpm"), None)
    );
    m.prune_route(rid, 101);
    assert!(evaluate(&m, rid, Estimate::default(), &ctx, 101).allowed);
}

#[test]
#[allow(clippy::unwrap_used)]
fn platform_limits_count_the_key_and_its_account_over_every_model() {
    // SPEC 23.3: a write of platform limits reaches the gates at once; the account's
    // counters hold every key's usage over every model, each key's its own.
    use crate::core::limits::Limit;
    use crate::core::store::{TokenKinds, UsageKind, UsageRow};
    use crate::core::types::{KeyInfo, Route};
    let now = 1_796_119_200_000;
    let mut m = Mirror::default();
    for key_id in [1, 2] {
        let key = KeyInfo {
            key_id,
            platform: "p".into(),
            base_url: None,
            label: None,
            enabled: true,
            account: Some("org".into()),
            concurrency_cap: None,
        };
        m.apply(&Write::UpsertKey(key), 0, now);
    }
    let limits = vec![
        Limit::parse("requests", 3, "minute", "account").unwrap(),
        Limit::parse("requests", 2, "minute", "key").unwrap(),
    ];
    m.apply(&Write::SetPlatformLimits { platform: "p".into(), limits }, 0, now);
    let row = |model: &str, key_id: i64, t: i64| UsageRow {
        platform: "p".into(),
        model_id: model.into(),
        key_id,
        kind: UsageKind::Request,
        tokens: 0,
        count: 1,
        created_at_ms: t,
        kinds: TokenKinds::default(),
        cost: 0,
        tenants: crate::core::tenants::none(),
    };
    m.add_usage_row(&row("a", 1, now - 30_000), now);
    m.add_usage_row(&row("b", 1, now - 20_000), now);
    let decide = |m: &mut Mirror, model: &str, key_id: i64| {
        let route = Route { platform: "p".into(), model_id: model.into(), key_id };
        let p = m.prepare(&route, None, 0, now);
        assert!(p.complete);
        admit(&m.prepared_view(&p, Estimate::default(), now)).admission()
    };
    // key 1 has used its two (models a and b): its key-scope limit, which reads ":key"
    let refused = decide(&mut m, "c", 1);
    assert_eq!(refused.reason, Some(Reason::declared("platform:requests/minute:key")));
    assert_eq!(refused.retry_at_ms, Some(now - 30_000 + 60_000));
    // key 2 has used none; the account two of three
    assert_eq!(decide(&mut m, "c", 2), Admission::ALLOWED);
    m.add_usage_row(&row("c", 2, now - 10_000), now);
    let refused = decide(&mut m, "a", 2);
    assert_eq!(refused.reason, Some(Reason::declared("platform:requests/minute")));
    // forgotten: nothing refuses
    m.apply(&Write::SetPlatformLimits { platform: "p".into(), limits: vec![] }, 0, now);
    assert_eq!(decide(&mut m, "a", 2), Admission::ALLOWED);
}

/// SPEC 21.2, 24.6: a pool 429's rows belong to the account they name, whichever key
/// wrote them; a removal or the day's pruning drops them from the account's view too.
#[test]
fn pool_rows_belong_to_the_account_they_name() {
    use crate::core::store::{HistoryKind, HistoryRow};
    const T0: i64 = 1_767_268_800_000;
    let row = |key_id: i64, model_id: String, kind: HistoryKind, at: i64, value: i64| HistoryRow {
        platform: "openrouter".into(),
        model_id: model_id.into(),
        key_id,
        kind,
        hit_at_ms: at,
        value: Some(value),
    };
    let mut h = History::default();
    let (account, pool) = (|| Arc::<str>::from("team"), || "openrouter::free".to_string());
    assert_eq!(h.pool_state("openrouter", account, pool, T0), None);
    h.add(row(4, pool_cap_row("team"), HistoryKind::PoolDay, T0, 50));
    h.add(row(5, pool_cap_row("team"), HistoryKind::PoolDay, T0, 40));
    h.add(row(1, pool_cap_row("key:1"), HistoryKind::PoolDay, T0, 7));
    h.add(row(4, pool_reset_row("openrouter::free", "team"), HistoryKind::PoolMinute, T0, T0 + 30_000));
    let state = h.pool_state("openrouter", account, pool, T0).unwrap_or_default();
    assert_eq!(state, PoolState { caps: [Some(40), None, None], spent: [None, Some(T0 + 30_000), None] });
    // Another pool of the account, another account, another platform: none of it.
    let other =
        h.pool_state("openrouter", account, || "openrouter::account".to_string(), T0).unwrap_or_default();
    assert_eq!(other.spent, [None, None, None]);
    assert_eq!(h.learned_caps("openrouter", "key:1"), [Some(7), None, None]);
    assert_eq!(h.learned_caps("groq", "team"), [None, None, None]);
    // At the reset the pool is no longer spent.
    assert_eq!(h.pool_spent("openrouter", "team", "openrouter::free", T0 + 30_000), [None, None, None]);
    // A key's removal takes its rows from the account; a day later all are pruned.
    assert_eq!(h.remove(5, Some(("openrouter", &pool_cap_row("team"))), &[HistoryKind::PoolDay]), 1);
    assert_eq!(h.learned_caps("openrouter", "team"), [Some(50), None, None]);
    h.prune(T0 + 1);
    assert_eq!(h.pool_state("openrouter", account, pool, T0 + 1), None);
}
