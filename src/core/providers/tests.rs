//! Each provider's behaviour, checked on its real bodies (the corpus,
//! `python/quotaengine/_bodies/<provider>/`) and headers.
use super::*;
use crate::core::calendar::builtin_zone;
use crate::core::env::Env;
use crate::core::headers::{family_of, parse_quota_headers, HeaderQuota, Metric, ParsedHeaders};
use crate::core::limits::{LimitSet, Metric as Counted, DAY, MINUTE};
use crate::core::parse::{infer_failure_kind, parse_provider_limit, parse_stated_retry_ms, FailureKind};
use crate::core::parse::{LearnedLimit, LimitAxis};
use crate::core::pools::{infer_quota_pool_key, is_shared_pool};

/// One body of the corpus, as the provider sent it.
macro_rules! body {
    ($path:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/python/quotaengine/_bodies/", $path))
    };
}

const GROQ_413: &str = body!("groq/tpm_413.txt");
const GROQ_429_TPD: &str = body!("groq/tpd_429.txt");
const GROQ_429_RPM: &str = body!("groq/rpm_429.txt");
const GEMINI_PER_DAY: &str = body!("google/per_day_50.json");
const OPENAI_QUOTA: &str = body!("openai/insufficient_quota.json");
const CLOUDFLARE_NEURONS: &str = body!("cloudflare/neurons_4006.txt");
const OPENROUTER_UPSTREAM: &str = body!("openrouter/upstream_429.json");
const OPENROUTER_PER_DAY: &str = body!("openrouter/free_per_day_429.json");
const OPENROUTER_402: &str = body!("openrouter/credits_402.json");

// ----- the table -----

#[test]
fn names_are_sorted_and_unique_and_the_generic_one_is_the_fallback() {
    for pair in ALL.windows(2) {
        assert!(pair[0].name < pair[1].name, "{} {}", pair[0].name, pair[1].name);
    }
    for p in ALL {
        assert_eq!(lookup(p.name).name, p.name);
    }
    assert_eq!(lookup("no-such-platform").name, "generic");
    assert_eq!(with_day_zone("UTC"), ALL[0].name);
}

#[test]
fn hosts_name_one_platform_each() {
    let hosts: Vec<(&str, &str)> = hosts().collect();
    for (i, (host, _)) in hosts.iter().enumerate() {
        assert!(hosts.iter().skip(i + 1).all(|(h, _)| h != host), "{host}");
        assert_eq!(host.to_ascii_lowercase(), *host);
    }
    assert!(hosts.contains(&("api.groq.com", "groq")));
    assert!(hosts.contains(&("generativelanguage.googleapis.com", "google")));
    assert!(hosts.contains(&("openrouter.ai", "openrouter")));
}

// ----- calendars (SPEC §14.2) -----

#[test]
fn builtin_zones() {
    assert_eq!(builtin_zone("google"), "America/Los_Angeles");
    assert_eq!(builtin_zone("groq"), "UTC");
    assert_eq!(builtin_zone("Google"), "UTC");
    assert_eq!(builtin_zone("GOOGLE"), "UTC");
    assert_eq!(with_day_zone("America/Los_Angeles"), "google");
}

// ----- pools (SPEC §8.1) -----

#[test]
fn openrouter_pools() {
    let key = infer_quota_pool_key;
    assert_eq!(key("openrouter", Some("meta-llama/llama-3.3-70b-instruct:free")), "openrouter::free");
    assert_eq!(key("openrouter", Some("x:FREE")), "openrouter::free");
    assert_eq!(key("openrouter", Some("openai/gpt-4o")), "openrouter::account");
    assert_eq!(key("openrouter", Some("free")), "openrouter::account");
    assert_eq!(key("openrouter", None), "openrouter::account");
    assert_eq!(key("OpenRouter", Some("a:free")), "OpenRouter::a:free"); // SPEC 18.6
}

#[test]
fn fixed_pools() {
    let cases = [
        ("google", "google::project"),
        ("groq", "groq::account"),
        ("cerebras", "cerebras::shared"),
        ("sambanova", "sambanova::shared"),
        ("nvidia", "nvidia::account"),
        ("mistral", "mistral::experiment-pool"),
        ("github", "github::account"),
        ("cohere", "cohere::trial-pool"),
        ("cloudflare", "cloudflare::account"),
        ("zhipu", "zhipu::account"),
        ("ollama", "ollama::cloud"),
        ("huggingface", "huggingface::router"),
        ("modelscope", "modelscope::account"),
    ];
    for (platform, want) in cases {
        assert_eq!(infer_quota_pool_key(platform, Some("any-model")), want);
        assert_eq!(infer_quota_pool_key(platform, None), want);
        // SPEC 18.6: another spelling is another platform.
        let upper = platform.to_uppercase();
        assert_eq!(infer_quota_pool_key(&upper, Some("m")), format!("{upper}::m"));
        assert!(is_shared_pool(platform), "{platform}");
        assert!(!is_shared_pool(&upper), "{platform}");
    }
}

#[test]
fn free_pools() {
    for platform in [
        "routeway",
        "bazaarlink",
        "unorouter",
        "orcarouter",
        "xkiro",
        "anyapi",
        "navy",
        "nara",
        "sealion",
        "aion",
        "requesty",
    ] {
        let want = format!("{platform}::free");
        assert_eq!(infer_quota_pool_key(platform, Some("some/model")), want);
        assert_eq!(infer_quota_pool_key(platform, None), want);
        let upper = platform.to_uppercase();
        assert_eq!(infer_quota_pool_key(&upper, None), format!("{upper}::account"));
        assert!(is_shared_pool(platform), "{platform}");
        assert!(!is_shared_pool(&upper), "{platform}");
    }
}

#[test]
fn other_platforms() {
    assert_eq!(infer_quota_pool_key("together", Some("meta/llama-3")), "together::meta/llama-3");
    assert_eq!(infer_quota_pool_key("Together", Some("Meta/Llama-3")), "Together::Meta/Llama-3");
    assert_eq!(infer_quota_pool_key("together", Some("  m  ")), "together::m");
    assert_eq!(infer_quota_pool_key("together", None), "together::account");
    assert_eq!(infer_quota_pool_key("together", Some("")), "together::account");
    assert_eq!(infer_quota_pool_key("together", Some("   ")), "together::account");
    assert_eq!(infer_quota_pool_key("ünï", Some("módel")), "ünï::módel");
    assert_eq!(infer_quota_pool_key("", None), "::account");
    assert!(!is_shared_pool("together"));
    assert!(!is_shared_pool(""));
    assert!(!is_shared_pool("googlex"));
    assert!(is_shared_pool("openrouter"));
    assert!(!is_shared_pool("Google"));
}

// ----- default caps (SPEC §8) -----

fn env(pairs: &[(&str, &str)]) -> Env {
    Env::new(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

#[test]
fn caps_defaults_and_overrides() {
    assert_eq!(env(&[]).provider_caps("openrouter").cap(Counted::Requests, DAY), Some(1000));
    assert_eq!(env(&[]).provider_caps("nvidia").cap(Counted::Requests, MINUTE), Some(40));
    assert_eq!(env(&[]).provider_caps("navy").cap(Counted::Tokens, DAY), Some(150_000));
    assert_eq!(env(&[]).provider_caps("groq"), LimitSet::default());
    assert_eq!(env(&[]).provider_caps("OpenRouter"), LimitSet::default()); // SPEC 18.6
    assert_eq!(env(&[]).provider_caps("NVIDIA"), LimitSet::default());
    let e = env(&[("PROVIDER_DAILY_REQUEST_CAP_OPENROUTER", "0"), ("PROVIDER_MINUTE_REQUEST_CAP_GROQ", "7")]);
    assert_eq!(e.provider_caps("openrouter").cap(Counted::Requests, DAY), None);
    assert_eq!(e.provider_caps("groq").cap(Counted::Requests, MINUTE), Some(7));
    assert!(e.warnings().is_empty());
    let e = env(&[
        ("PROVIDER_DAILY_REQUEST_CAP_OPENROUTER", "lots"),
        ("PROVIDER_DAILY_TOKEN_CAP_NEVERSEEN", "-3"),
        ("PROVIDER_DAILY_TOKEN_CAP_", "x"), // no platform: not an override
        ("OTHER", "x"),
    ]);
    assert_eq!(e.provider_caps("openrouter").cap(Counted::Requests, DAY), Some(1000));
    let w = e.warnings();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("PROVIDER_DAILY_REQUEST_CAP_OPENROUTER=\"lots\""), "{w:?}");
    assert!(w[1].contains("PROVIDER_DAILY_TOKEN_CAP_NEVERSEEN"), "{w:?}");
}

// ----- headers (SPEC §8.2) -----

/// 2026-01-01T12:00:00Z.
const NOW: i64 = 1_767_268_800_000;

fn hs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

fn q(metric: Metric, limit: Option<i64>, remaining: Option<i64>, reset_at_ms: Option<i64>) -> HeaderQuota {
    HeaderQuota { metric, limit, remaining, reset_at_ms }
}

#[test]
fn header_families_are_the_ones_each_provider_sends() {
    let sent = [
        ("openai", "x-ratelimit-limit-requests"),
        ("groq", "x-ratelimit-remaining-tokens"),
        ("cerebras", "x-ratelimit-limit-requests-day"),
        ("anthropic", "anthropic-ratelimit-requests-limit"),
        ("openrouter", "x-ratelimit-limit-requests"),
        ("openrouter", "X-RateLimit-Limit"),
    ];
    for (platform, header) in sent {
        let family = family_of(header).unwrap();
        assert!(lookup(platform).header_families.contains(&family), "{platform} {header}");
    }
}

#[test]
fn openai() {
    let p = parse_quota_headers(
        &hs(&[
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-remaining-tokens", "149984"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]),
        NOW,
    );
    assert_eq!(
        p,
        ParsedHeaders {
            quotas: vec![
                q(Metric::Requests, Some(60), Some(59), Some(NOW + 1_000)),
                q(Metric::Tokens, Some(150_000), Some(149_984), Some(NOW + 360_000)),
            ],
            retry_after_ms: None,
        }
    );
}

#[test]
fn groq_429() {
    let p = parse_quota_headers(
        &hs(&[
            ("x-ratelimit-limit-requests", "14400"),
            ("x-ratelimit-limit-tokens", "18000"),
            ("x-ratelimit-remaining-requests", "14370"),
            ("x-ratelimit-remaining-tokens", "17997"),
            ("x-ratelimit-reset-requests", "2m59.56s"),
            ("x-ratelimit-reset-tokens", "7.66s"),
            ("retry-after", "2"),
        ]),
        NOW,
    );
    assert_eq!(
        p.quotas,
        vec![
            q(Metric::Requests, Some(14_400), Some(14_370), Some(NOW + 179_560)),
            q(Metric::Tokens, Some(18_000), Some(17_997), Some(NOW + 7_660)),
        ]
    );
    assert_eq!(p.retry_after_ms, Some(2_000));
}

#[test]
fn openrouter_bare_headers_are_requests() {
    let p = parse_quota_headers(
        &hs(&[
            ("X-RateLimit-Limit", "20"),
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", "1741305600000"),
        ]),
        NOW,
    );
    assert_eq!(p.quotas, vec![q(Metric::Requests, Some(20), Some(0), Some(1_741_305_600_000))]);
    assert_eq!(p.retry_after_ms, None);
}

#[test]
fn cerebras_windowed() {
    let p = parse_quota_headers(
        &hs(&[
            ("x-ratelimit-limit-requests-day", "14400"),
            ("x-ratelimit-remaining-requests-day", "14399"),
            ("x-ratelimit-reset-requests-day", "33011.382867097855"),
            ("x-ratelimit-limit-tokens-minute", "60000"),
            ("x-ratelimit-remaining-tokens-minute", "59980"),
            ("x-ratelimit-reset-tokens-minute", "11.382867097855"),
        ]),
        NOW,
    );
    assert_eq!(
        p.quotas,
        vec![
            q(Metric::Requests, Some(14_400), Some(14_399), Some(NOW + 33_011_383)),
            q(Metric::Tokens, Some(60_000), Some(59_980), Some(NOW + 11_383)),
        ]
    );
}

// ----- error bodies (SPEC §6.2, §7, §15) -----

fn learned(kind: LimitAxis, limit: i64) -> Option<LearnedLimit> {
    Some(LearnedLimit { kind, limit })
}

fn kind(status: Option<i64>, message: &str) -> FailureKind {
    infer_failure_kind(status, Some(message))
}

#[test]
fn stated_retry_real_bodies() {
    let groq_tpd = body!("groq/tpd_429_upsell.txt");
    assert_eq!(parse_stated_retry_ms(Some(groq_tpd)), Some(723_840));
    let openai = body!("openai/tpm_1200ms.txt");
    assert_eq!(parse_stated_retry_ms(Some(openai)), Some(1_200));
    let gemini = body!("google/per_day_50_pretty.json");
    assert_eq!(parse_stated_retry_ms(Some(gemini)), Some(17_000));
    // Gemini also states it in prose; the phrase is tried first.
    let gemini_prose = "* Quota exceeded for metric: x, limit: 50\nPlease retry in 17.382649323s.";
    assert_eq!(parse_stated_retry_ms(Some(gemini_prose)), Some(17_383));
}

#[test]
fn provider_limit_groq() {
    assert_eq!(parse_provider_limit(Some(GROQ_413)), learned(LimitAxis::Tpm, 6_000));
    assert_eq!(parse_provider_limit(Some(GROQ_429_TPD)), learned(LimitAxis::Tpd, 100_000));
    assert_eq!(parse_provider_limit(Some(GROQ_429_RPM)), learned(LimitAxis::Rpm, 30));
    let rpd =
        "Rate limit reached for model `x` on requests per day (RPD): Limit 14400, Used 14400, Requested 1.";
    assert_eq!(parse_provider_limit(Some(rpd)), learned(LimitAxis::Rpd, 14_400));
    let seed = "...on tokens per minute (TPM): Limit 30000, Requested 33476";
    assert_eq!(parse_provider_limit(Some(seed)), learned(LimitAxis::Tpm, 30_000));
}

#[test]
fn provider_limit_from_google_quota_ids() {
    // SPEC §15.3: the quota id names the axis, `limit:` or `quotaValue` the number.
    let rpd = "GenerateRequestsPerDayPerProjectPerModel limit: 50";
    assert_eq!(parse_provider_limit(Some(rpd)), learned(LimitAxis::Rpd, 50));
    assert_eq!(parse_provider_limit(Some(GEMINI_PER_DAY)), learned(LimitAxis::Rpd, 50));
    let per_minute = GEMINI_PER_DAY.replace("PerDay", "PerMinute");
    assert_eq!(parse_provider_limit(Some(&per_minute)), learned(LimitAxis::Rpm, 50));
    let tpm =
        r#"{"quotaId": "GenerateContentInputTokensPerModelPerMinute-FreeTier", "quotaValue": "250000"}"#;
    assert_eq!(parse_provider_limit(Some(tpm)), learned(LimitAxis::Tpm, 250_000));
    let tpd = r#"{"quotaId": "GenerateContentInputTokensPerModelPerDay", "quotaValue": 1000000}"#;
    assert_eq!(parse_provider_limit(Some(tpd)), learned(LimitAxis::Tpd, 1_000_000));
    // "Per" must follow the noun inside one identifier; no number, no result.
    assert_eq!(parse_provider_limit(Some(r#"{"quotaId": "PerDayRequests", "quotaValue": "5"}"#)), None);
    assert_eq!(parse_provider_limit(Some(r#"{"quotaId": "GenerateRequestsPerDay"}"#)), None);
    assert_eq!(
        parse_provider_limit(Some(r#"{"quotaId": "GenerateRequestsPerDay", "quotaValue": "0"}"#)),
        None
    );
}

#[test]
fn failure_kinds_of_real_bodies() {
    use FailureKind::*;
    // OpenAI 429 insufficient_quota is a payment failure, not a rate limit.
    assert_eq!(kind(Some(429), OPENAI_QUOTA), Payment);
    // Cloudflare's daily allocation is a daily quota despite the 429.
    assert_eq!(kind(Some(429), CLOUDFLARE_NEURONS), DailyQuota);
    // Groq per-minute 429 says "today" but names the minute axis.
    assert_eq!(kind(Some(429), GROQ_429_RPM), RateLimit);
    assert_eq!(kind(Some(429), GROQ_429_TPD), DailyQuota);
    assert_eq!(kind(Some(413), GROQ_413), Other);
    // Gemini quota ids.
    assert_eq!(kind(Some(429), GEMINI_PER_DAY), DailyQuota);
    let per_minute = GEMINI_PER_DAY.replace("PerDay", "PerMinute");
    assert_eq!(kind(Some(429), &per_minute), RateLimit);
}

// ----- aggregators (SPEC 21) -----

#[test]
fn provider_name_is_read_and_null_names_none() {
    assert_eq!(upstream_provider_name(OPENROUTER_UPSTREAM), Some("Google AI Studio"));
    assert_eq!(upstream_provider_name(OPENROUTER_402), None);
    assert_eq!(upstream_provider_name("no json"), None);
}

#[test]
fn pool_429s_state_cap_and_reset_in_body_or_headers() {
    let s = parse_pool_429(Some(429), Some(OPENROUTER_PER_DAY), &[]);
    assert_eq!(
        s,
        Some(PoolSignal { axis: PoolAxis::Day, limit: Some(50), reset_at_ms: Some(1_745_971_200_000) })
    );
    let hs = vec![
        ("x-ratelimit-limit".to_string(), "20".to_string()),
        ("X-RateLimit-Reset".to_string(), "1745971260".to_string()),
    ];
    let s = parse_pool_429(Some(429), Some("Rate limit exceeded: free-models-per-min. "), &hs);
    assert_eq!(
        s,
        Some(PoolSignal { axis: PoolAxis::Minute, limit: Some(20), reset_at_ms: Some(1_745_971_260_000) })
    );
    // Headers win over the body; another status or no pool named: nothing.
    assert_eq!(parse_pool_429(Some(429), Some(OPENROUTER_PER_DAY), &hs).and_then(|s| s.limit), Some(20));
    assert_eq!(parse_pool_429(Some(503), Some(OPENROUTER_PER_DAY), &[]), None);
    assert_eq!(parse_pool_429(Some(429), Some("Rate limit exceeded"), &hs), None);
    let bare = parse_pool_429(Some(429), Some("Rate limit exceeded: free-models-per-day-high-balance."), &[]);
    assert_eq!(bare, Some(PoolSignal { axis: PoolAxis::Day, limit: None, reset_at_ms: None }));
}

/// SPEC 24.6: a number in `error.metadata.headers` is read as the provider wrote it,
/// whole: `2e1` is not an integer, and 20 digits are never cut to 18.
#[test]
fn pool_numbers_are_read_whole_or_not_at_all() {
    let body = |limit: &str, reset: &str| {
        format!(
            r#"{{"error":{{"message":"Rate limit exceeded: free-models-per-day. ","code":429,"metadata":{{"headers":{{"X-RateLimit-Limit":{limit},"X-RateLimit-Remaining":"0","X-RateLimit-Reset":{reset}}}}}}}}}"#
        )
    };
    let signal = |limit: &str, reset: &str| parse_pool_429(Some(429), Some(&body(limit, reset)), &[]);
    let read = signal(r#""50""#, r#""1745971200000""#);
    assert_eq!(
        read,
        Some(PoolSignal { axis: PoolAxis::Day, limit: Some(50), reset_at_ms: Some(1_745_971_200_000) })
    );
    // JSON numbers as well as strings.
    assert_eq!(signal("50", "1745971200").and_then(|s| s.limit), Some(50));
    assert_eq!(signal("50", "1745971200").and_then(|s| s.reset_at_ms), Some(1_745_971_200_000));
    for junk in [r#""2e1""#, "2e1", r#""20.0""#, "20.5", r#""-20""#, r#""+20""#, r#""20 per day""#, r#""""#] {
        assert_eq!(signal(junk, r#""1745971200000""#).and_then(|s| s.limit), None, "{junk}");
        assert_eq!(signal(r#""50""#, junk).and_then(|s| s.reset_at_ms), None, "{junk}");
    }
    // 20 digits: beyond i64, refused, never truncated to a number that fits.
    let twenty = "12345678901234567890";
    assert_eq!(signal(&format!(r#""{twenty}""#), "1").and_then(|s| s.limit), None);
    assert_eq!(signal(twenty, "1").and_then(|s| s.limit), None);
    assert_eq!(signal(r#""50""#, &format!(r#""{twenty}""#)).and_then(|s| s.reset_at_ms), None);
    // 19 digits that fit are read whole.
    assert_eq!(
        signal(r#""1000000000000000000""#, "1").and_then(|s| s.limit),
        Some(1_000_000_000_000_000_000)
    );
    // The response headers too.
    let hs = |v: &str| vec![("X-RateLimit-Limit".to_string(), v.to_string())];
    let msg = Some("Rate limit exceeded: free-models-per-min");
    assert_eq!(parse_pool_429(Some(429), msg, &hs(" 20 ")).and_then(|s| s.limit), Some(20));
    for junk in ["2e1", "+20", twenty, "20.0"] {
        assert_eq!(parse_pool_429(Some(429), msg, &hs(junk)).and_then(|s| s.limit), None, "{junk}");
    }
}

/// SPEC 24.6 and 15.3: Google's `quotaValue` is read whole too.
#[test]
fn quota_values_are_read_whole_or_not_at_all() {
    let body =
        |v: &str| format!(r#"{{"quotaId": "GenerateRequestsPerDayPerProjectPerModel", "quotaValue": {v}}}"#);
    let learned = |v: &str| parse_provider_limit(Some(&body(v))).map(|l| l.limit);
    assert_eq!(learned(r#""250""#), Some(250));
    assert_eq!(learned("250"), Some(250));
    for junk in [r#""2e1""#, "2e1", r#""12345678901234567890""#, "10000000000000000000", r#""1.5""#] {
        assert_eq!(learned(junk), None, "{junk}");
    }
}

/// SPEC 24.6: what a provider writes is read: an upstream 429 whose `metadata.raw`
/// quotes a long upstream answer still names its upstream after it.
#[test]
fn a_long_upstream_answer_is_read_to_its_provider_name() {
    let raw = "x".repeat(200 * 1024);
    let body = format!(
        r#"{{"error":{{"message":"Provider returned error","code":429,"metadata":{{"raw":"{raw} is temporarily rate-limited upstream","provider_name":"Google AI Studio"}}}}}}"#
    );
    assert_eq!(upstream_provider_name(&body), Some("Google AI Studio"));
    assert_eq!(infer_failure_kind(Some(429), Some(&body)), FailureKind::Upstream);
}
