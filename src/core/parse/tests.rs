use super::*;
use proptest::prelude::*;

// 2015-10-21T07:28:00Z
const BTTF_MS: i64 = 1_445_412_480_000;

#[test]
fn huge_bodies_are_read_only_so_far() {
    let mut body = "9".repeat(1 << 20);
    body.push_str(" try again in 5s");
    assert_eq!(parse_stated_retry_ms(Some(&body)), None);
    let body = format!("try again in 5s {}", "é".repeat(1 << 20));
    assert_eq!(parse_stated_retry_ms(Some(&body)), Some(5000));
    assert!(head(&body).len() <= MAX_PARSED_BYTES);
}

#[test]
fn every_regex_compiles() {
    // Each parser returns Some on a known-good input only if its regexes compiled.
    assert!(parse_http_date_ms("Wed, 21 Oct 2015 07:28:00 GMT", 0).is_some());
    assert!(parse_http_date_ms("Wed Oct 21 07:28:00 2015", 0).is_some());
    assert!(parse_stated_retry_ms(Some("try again in 1s")).is_some());
    assert!(parse_stated_retry_ms(Some(r#""retryDelay": "1s""#)).is_some());
    assert!(stated_limit("limit 5").is_some());
    for axis in LimitAxis::ALL {
        assert!(axis_regex(axis).is_some(), "{axis}");
    }
}

// ----- parse_retry_after_ms -----

#[test]
fn retry_after_delta_seconds() {
    assert_eq!(parse_retry_after_ms(Some("30"), 0), Some(30_000));
    assert_eq!(parse_retry_after_ms(Some("1.5"), 0), Some(1_500));
    assert_eq!(parse_retry_after_ms(Some("  30 \t"), 0), Some(30_000));
    assert_eq!(parse_retry_after_ms(Some("0"), 0), Some(0));
    assert_eq!(parse_retry_after_ms(Some("0.0004"), 0), Some(0));
    assert_eq!(parse_retry_after_ms(Some("0.0006"), 0), Some(1));
    assert_eq!(parse_retry_after_ms(Some(".5"), 0), Some(500));
    assert_eq!(parse_retry_after_ms(Some("2."), 0), Some(2_000));
    // Independent of now.
    assert_eq!(parse_retry_after_ms(Some("30"), BTTF_MS), Some(30_000));
    assert_eq!(parse_retry_after_ms(Some("30"), i64::MIN), Some(30_000));
}

#[test]
fn retry_after_clamps_to_a_day() {
    assert_eq!(parse_retry_after_ms(Some("86400"), 0), Some(DAY_MS));
    assert_eq!(parse_retry_after_ms(Some("86401"), 0), Some(DAY_MS));
    assert_eq!(parse_retry_after_ms(Some("99999999999999999999999999"), 0), Some(DAY_MS));
    let huge = "9".repeat(400); // parses to +inf as f64
    assert_eq!(parse_retry_after_ms(Some(&huge), 0), Some(DAY_MS));
}

#[test]
fn retry_after_rejects_garbage() {
    for bad in [
        "",
        "   ",
        "-1",
        "-0.5",
        "+5",
        "1e3",
        "inf",
        "NaN",
        "infinity",
        "1.2.3",
        ".",
        "30s",
        "thirty",
        "1,5",
        "0x10",
        "٣٠",
        "30 seconds",
    ] {
        assert_eq!(parse_retry_after_ms(Some(bad), 0), None, "{bad:?}");
    }
    assert_eq!(parse_retry_after_ms(None, 0), None);
}

#[test]
fn retry_after_imf_fixdate() {
    let now = BTTF_MS - 120_000;
    assert_eq!(parse_retry_after_ms(Some("Wed, 21 Oct 2015 07:28:00 GMT"), now), Some(120_000));
    assert_eq!(parse_retry_after_ms(Some("wed, 21 oct 2015 07:28:00 gmt"), now), Some(120_000));
    // The exact moment and the past give 0.
    assert_eq!(parse_retry_after_ms(Some("Wed, 21 Oct 2015 07:28:00 GMT"), BTTF_MS), Some(0));
    assert_eq!(parse_retry_after_ms(Some("Wed, 21 Oct 2015 07:28:00 GMT"), BTTF_MS + 5), Some(0));
    assert_eq!(parse_retry_after_ms(Some("Sun, 06 Nov 1994 08:49:37 GMT"), BTTF_MS), Some(0));
    // Far future clamps.
    assert_eq!(parse_retry_after_ms(Some("Fri, 01 Jan 2100 00:00:00 GMT"), BTTF_MS), Some(DAY_MS));
    // Without the weekday, or with "UTC".
    assert_eq!(parse_retry_after_ms(Some("21 Oct 2015 07:28:00 UTC"), now), Some(120_000));
}

#[test]
fn retry_after_rfc850_and_asctime() {
    let now = BTTF_MS - 1_000;
    assert_eq!(parse_retry_after_ms(Some("Wednesday, 21-Oct-15 07:28:00 GMT"), now), Some(1_000));
    assert_eq!(parse_retry_after_ms(Some("Wed Oct 21 07:28:00 2015"), now), Some(1_000));
    assert_eq!(parse_retry_after_ms(Some("Wed Oct  1 07:28:00 2015"), 0), Some(DAY_MS));
    // Extreme clocks are fine.
    for now in [i64::MIN, i64::MAX, 0, -1] {
        let got = parse_retry_after_ms(Some("Wednesday, 21-Oct-15 07:28:00 GMT"), now);
        assert!(got.is_none() || got.is_some_and(|ms| (0..=DAY_MS).contains(&ms)));
        let got = parse_retry_after_ms(Some("Wed, 21 Oct 2015 07:28:00 GMT"), now);
        assert!(got.is_some_and(|ms| (0..=DAY_MS).contains(&ms)));
    }
    // RFC 850 two-digit year: "99" seen in 2015 is 1999 (in the past).
    assert_eq!(parse_retry_after_ms(Some("Friday, 31-Dec-99 23:59:59 GMT"), now), Some(0));
}

#[test]
fn http_date_arithmetic() {
    assert_eq!(parse_http_date_ms("Thu, 01 Jan 1970 00:00:00 GMT", 0), Some(0));
    assert_eq!(parse_http_date_ms("Wed, 21 Oct 2015 07:28:00 GMT", 0), Some(BTTF_MS));
    assert_eq!(parse_http_date_ms("Sun, 06 Nov 1994 08:49:37 GMT", 0), Some(784_111_777_000));
    assert_eq!(parse_http_date_ms("Tue, 29 Feb 2000 00:00:00 GMT", 0), Some(951_782_400_000));
    assert_eq!(parse_http_date_ms("Wed, 31 Dec 1969 23:59:59 GMT", 0), Some(-1_000));
    // Impossible dates and times.
    for bad in [
        "Mon, 29 Feb 2100 00:00:00 GMT",
        "Mon, 31 Apr 2015 00:00:00 GMT",
        "Mon, 00 Apr 2015 00:00:00 GMT",
        "Mon, 01 Foo 2015 00:00:00 GMT",
        "Mon, 01 Apr 2015 24:00:00 GMT",
        "Mon, 01 Apr 2015 23:60:00 GMT",
        "Mon, 01 Apr 0000 00:00:00 GMT",
        "Mon, 01 Apr 2015 00:00 GMT",
        "Mon, 01 Apr 2015 00:00:00 PST",
        "2015-10-21T07:28:00Z",
    ] {
        assert_eq!(parse_http_date_ms(bad, 0), None, "{bad}");
    }
}

#[test]
fn civil_round_trip() {
    for year in [1, 1600, 1899, 1969, 1970, 2000, 2015, 2100, 9999] {
        for (month, day) in [(1, 1), (2, 28), (3, 1), (12, 31)] {
            let ms = days_from_civil(year, month, day) * DAY_MS;
            assert_eq!(year_of_ms(ms), year, "{year}-{month}-{day}");
            assert_eq!(year_of_ms(ms + DAY_MS - 1), year);
        }
    }
    assert_eq!(days_from_civil(1970, 1, 1), 0);
    assert_eq!(days_from_civil(2000, 3, 1), 11_017);
}

// ----- parse_stated_retry_ms -----

#[test]
fn stated_retry_phrases() {
    let cases = [
        ("Please try again in 7.66s", 7_660),
        ("Please try again in 7.66s.", 7_660),
        ("retry after 30 seconds", 30_000),
        ("try again in 2m", 120_000),
        ("Please try again in 1m26.4s", 86_400),
        ("retry in 250ms", 250),
        ("Try Again In 3 Minutes", 180_000),
        ("try again in 1 hour", 3_600_000),
        ("try again in 1.5 hrs", 5_400_000),
        ("retry in 10 secs", 10_000),
        ("retry in 1 sec", 1_000),
        ("please retry after: 5s", 5_000),
        ("Retrying in 4 min", 240_000),
        ("try again after 45 second", 45_000),
        ("try again in 2 minutes 30 seconds", 150_000),
        ("try again in 1 minute and 30 seconds", 90_000),
        ("try again in 1h2m3s", 3_723_000),
        ("try again in 0s", 0),
        ("try again in 6ms", 6),
        ("try again in 0.4ms", 0),
        ("try\nagain   in\t20s", 20_000),
    ];
    for (text, want) in cases {
        assert_eq!(parse_stated_retry_ms(Some(text)), Some(want), "{text:?}");
    }
}

#[test]
fn stated_retry_fields() {
    let cases = [
        (r#""retryDelay": "17s""#, 17_000),
        (r#""retryDelay":"0.5s""#, 500),
        (r#""retry_after": "0.5s""#, 500),
        ("retry_after: 30", 30_000),
        (r#"{"retry_after": 30}"#, 30_000),
        (r#"{"retry_after":2.5,"x":1}"#, 2_500),
        ("'retryDelay': '3s'", 3_000),
        (r#"{\"retryDelay\": \"9s\"}"#, 9_000),
        ("Retry-After: 12", 12_000),
        ("retry_after=4", 4_000),
        (r#""retry_after_ms": 1500"#, 1_500),
        (r#""retryAfterMs": 250"#, 250),
        (r#""retry_after_seconds": 7"#, 7_000),
        (r#""retryDelay": "1m""#, 60_000),
    ];
    for (text, want) in cases {
        assert_eq!(parse_stated_retry_ms(Some(text)), Some(want), "{text:?}");
    }
}

#[test]
fn stated_retry_needs_a_phrase_or_field() {
    for text in [
        "30",
        "30s",
        "wait 30 seconds",
        "Limit 30, Used 30, Requested 1",
        "try again later",
        "please try again in a few seconds",
        "try again in 5 months",
        "try again in 5",
        "try again in 5 requests",
        "retry in -5s",
        r#""retryDelay": "soon""#,
        r#""retry_after": null"#,
        "retry_after: -3",
        "retry_after: 3x",
        "Retry-After: Wed, 21 Oct 2015 07:28:00 GMT",
        "",
    ] {
        assert_eq!(parse_stated_retry_ms(Some(text)), None, "{text:?}");
    }
    assert_eq!(parse_stated_retry_ms(None), None);
}

#[test]
fn stated_retry_skips_an_unusable_phrase() {
    let text = "try again in a moment (or: try again in 3s)";
    assert_eq!(parse_stated_retry_ms(Some(text)), Some(3_000));
}

#[test]
fn stated_retry_clamps() {
    assert_eq!(parse_stated_retry_ms(Some("try again in 25h")), Some(DAY_MS));
    assert_eq!(parse_stated_retry_ms(Some("try again in 24h")), Some(DAY_MS));
    assert_eq!(parse_stated_retry_ms(Some("retry_after: 100000")), Some(DAY_MS));
    let huge = format!("try again in {}s", "9".repeat(400));
    assert_eq!(parse_stated_retry_ms(Some(&huge)), Some(DAY_MS));
}

#[test]
fn stated_retry_unicode() {
    assert_eq!(parse_stated_retry_ms(Some("⚠️ try again in 2s ✅")), Some(2_000));
    assert_eq!(parse_stated_retry_ms(Some("请稍后 try again in 3秒")), None);
    assert_eq!(parse_stated_retry_ms(Some("try again in ٣s")), None);
    assert_eq!(parse_stated_retry_ms(Some("try again in 2sé")), None);
}

// ----- parse_provider_limit -----

fn learned(kind: LimitAxis, limit: i64) -> Option<LearnedLimit> {
    Some(LearnedLimit { kind, limit })
}

#[test]
fn provider_limit_forms() {
    assert_eq!(parse_provider_limit(Some("TPM limit: 1,000")), learned(LimitAxis::Tpm, 1_000));
    assert_eq!(parse_provider_limit(Some("tpd LIMIT 1,234,567")), learned(LimitAxis::Tpd, 1_234_567));
    assert_eq!(parse_provider_limit(Some("limit of 50 requests per day")), learned(LimitAxis::Rpd, 50));
    assert_eq!(parse_provider_limit(Some("Requests-Per-Minute limit=60")), learned(LimitAxis::Rpm, 60));
    assert_eq!(parse_provider_limit(Some("tokens_per_day limit 9")), learned(LimitAxis::Tpd, 9));
    assert_eq!(parse_provider_limit(Some("rpm_limit ... limit 9")), learned(LimitAxis::Rpm, 9));
    assert_eq!(parse_provider_limit(Some("Limit 6000, RPM")), learned(LimitAxis::Rpm, 6_000));
    // A malformed number is skipped; the next "limit N" is used.
    assert_eq!(parse_provider_limit(Some("limit 30k; TPM limit 500")), learned(LimitAxis::Tpm, 500));
}

#[test]
fn provider_limit_axis_order() {
    // Day before minute, tokens before requests, wherever they appear.
    let text = "requests per minute exceeded; also tokens per day. Limit 10";
    assert_eq!(parse_provider_limit(Some(text)), learned(LimitAxis::Tpd, 10));
    let text = "RPD and TPM: Limit 10";
    assert_eq!(parse_provider_limit(Some(text)), learned(LimitAxis::Tpm, 10));
    let text = "RPM and RPD: Limit 10";
    assert_eq!(parse_provider_limit(Some(text)), learned(LimitAxis::Rpd, 10));
}

#[test]
fn provider_limit_needs_both() {
    for text in [
        "Limit 6000",                              // no axis
        "tokens per minute exceeded",              // no number
        "tokens per minute: 6000",                 // number not after "limit"
        "Rate limited on tokens per minute: 6000", // "limited" is not "limit"
        "TPM Limit 0",                             // zero
        "TPM limit 99999999999999999999",          // overflow
        "TPM limit -5",                            // negative
        "TPM limit 1.5",                           // not an integer
        "TPM limit 30k",                           // a unit glued on
        "TPM limit 6000,123",                      // bad grouping
        "Limit 30 on xrpm",                        // rpm inside a word
        "Limit 30 on rpms",                        // rpm inside a word
        "Limit 30 tokens per hour",                // unknown axis
        "",
    ] {
        assert_eq!(parse_provider_limit(Some(text)), None, "{text:?}");
    }
    assert_eq!(parse_provider_limit(None), None);
    // The largest i64 is fine.
    let max = format!("TPM limit {}", i64::MAX);
    assert_eq!(parse_provider_limit(Some(&max)), learned(LimitAxis::Tpm, i64::MAX));
}

#[test]
fn provider_limit_unicode() {
    assert_eq!(parse_provider_limit(Some("🚦 TPM — Limit 42 ✅")), learned(LimitAxis::Tpm, 42));
    assert_eq!(parse_provider_limit(Some("TPM Limit ٤٢")), None);
    assert_eq!(parse_provider_limit(Some("éTPM Limit 42")), learned(LimitAxis::Tpm, 42));
}

#[test]
fn axis_names_round_trip() {
    for axis in LimitAxis::ALL {
        assert_eq!(axis.as_str().parse::<LimitAxis>(), Ok(axis));
        assert_eq!(axis.to_string(), axis.as_str());
    }
    assert!("TPM".parse::<LimitAxis>().is_err());
    assert!("".parse::<LimitAxis>().unwrap_err().contains("tpd"));
}

// ----- infer_failure_kind -----

fn kind(status: Option<i64>, message: &str) -> FailureKind {
    infer_failure_kind(status, Some(message))
}

#[test]
fn failure_kind_by_status() {
    use FailureKind::*;
    let cases = [
        (402, Payment),
        (403, Forbidden),
        (401, Auth),
        (429, RateLimit),
        (408, Timeout),
        (500, ServerError),
        (502, ServerError),
        (503, ServerError),
        (504, ServerError), // SPEC lists only 408 under timeout
        (599, ServerError),
        (400, Other),
        (404, Other),
        (413, Other),
        (200, Other),
        (600, Other),
        (-1, Other),
    ];
    for (status, want) in cases {
        assert_eq!(infer_failure_kind(Some(status), None), want, "{status}");
        assert_eq!(infer_failure_kind(Some(status), Some("")), want, "{status}");
    }
    assert_eq!(infer_failure_kind(None, None), Other);
    assert_eq!(infer_failure_kind(Some(i64::MAX), None), Other);
    assert_eq!(infer_failure_kind(Some(i64::MIN), None), Other);
}

#[test]
fn failure_kind_by_message() {
    use FailureKind::*;
    let cases = [
        ("Payment Required", Payment),
        ("Insufficient credits on your account", Payment),
        ("insufficient credit", Payment),
        ("Insufficient Balance", Payment),
        ("FORBIDDEN: model not available on your tier", Forbidden),
        ("Too Many Requests", RateLimit),
        ("rate limit exceeded", RateLimit),
        ("Rate-Limit hit", RateLimit),
        ("ratelimit", RateLimit),
        ("rate_limit_exceeded", RateLimit),
        ("RESOURCE_EXHAUSTED", RateLimit),
        ("quota exceeded", RateLimit),
        ("Request timeout", Timeout),
        ("the operation timed out", Timeout),
        ("Deadline Exceeded", Timeout),
        ("DEADLINE_EXCEEDED", Timeout),
        ("504 Gateway Time-out", Timeout),
        ("read ECONNRESET", Transport),
        ("connect ECONNREFUSED 127.0.0.1:443", Transport),
        ("Connection reset by peer", Transport),
        ("connection refused", Transport),
        ("connection aborted", Transport),
        ("socket hang up", Transport),
        ("Broken pipe", Transport),
        ("Network is unreachable", Transport),
        ("Temporary failure in name resolution", Transport),
        ("model not found", Other),
        ("", Other),
    ];
    for (message, want) in cases {
        assert_eq!(kind(None, message), want, "{message:?}");
    }
}

#[test]
fn failure_kind_row_order() {
    use FailureKind::*;
    // Real bodies: `core::providers`' tests.
    // Status rows beat later message rows and vice versa.
    assert_eq!(kind(Some(402), "rate limit"), Payment);
    assert_eq!(kind(Some(500), "forbidden"), Forbidden);
    assert_eq!(kind(Some(401), "quota exceeded for today"), Auth);
    assert_eq!(kind(Some(500), "daily quota exhausted"), DailyQuota);
    assert_eq!(kind(Some(503), "connection reset"), ServerError);
    assert_eq!(kind(Some(500), "upstream timed out"), Timeout);
    assert_eq!(kind(Some(408), "connection reset"), Timeout);
}

#[test]
fn failure_kind_daily_quota_rules() {
    use FailureKind::*;
    assert_eq!(kind(None, "Daily limit reached"), DailyQuota);
    assert_eq!(kind(None, "requests per day limit"), DailyQuota);
    assert_eq!(kind(None, "per_day quota"), DailyQuota);
    assert_eq!(kind(None, "RPD exhausted"), DailyQuota);
    assert_eq!(kind(None, "tpd: limit 5"), DailyQuota);
    assert_eq!(kind(None, "you have used up today's tokens"), DailyQuota);
    // A bare "minutes" is no minute axis.
    assert_eq!(kind(Some(429), "Daily quota exhausted, try again in 30 minutes"), DailyQuota);
    assert_eq!(kind(Some(429), "daily limit reached; retry in 1 minute"), DailyQuota);
    // A minute axis anywhere rules it out.
    assert_eq!(kind(Some(429), "daily quota or per minute limit"), RateLimit);
    assert_eq!(kind(Some(429), "daily limit; RPM exceeded"), RateLimit);
    assert_eq!(kind(Some(429), "TPM limit hit, retry today"), RateLimit);
    assert_eq!(kind(None, "per-minute quota; daily"), RateLimit);
    // A day without a quota word, or a quota without a day, is not daily.
    assert_eq!(kind(Some(429), "try again today"), RateLimit);
    assert_eq!(kind(None, "daily digest"), Other);
    assert_eq!(kind(None, "quota"), RateLimit);
    // rpd/tpd/rpm must be whole words.
    assert_eq!(kind(None, "limit xrpdx"), Other);
    assert_eq!(kind(None, "daily limit; rpms"), DailyQuota);
}

#[test]
fn failure_kind_names_round_trip() {
    for k in FailureKind::ALL {
        assert_eq!(k.as_str().parse::<FailureKind>(), Ok(k));
        assert_eq!(k.to_string(), k.as_str());
    }
    let err = "ratelimit".parse::<FailureKind>().unwrap_err();
    assert!(err.contains("rate_limit") && err.contains("empty_completion"), "{err}");
    assert!("Payment".parse::<FailureKind>().is_err());
}

#[test]
fn failure_kind_never_infers_empty_completion() {
    assert_ne!(kind(None, "empty_completion"), FailureKind::EmptyCompletion);
    assert_ne!(kind(None, "empty completion"), FailureKind::EmptyCompletion);
}

#[test]
fn failure_kind_unicode() {
    assert_eq!(kind(None, "İ TOO MANY REQUESTS 🚦"), FailureKind::RateLimit);
    assert_eq!(kind(None, "ß daily Quota ẞ"), FailureKind::DailyQuota);
}

proptest! {
    #[test]
    fn retry_after_never_panics(s in any::<String>(), now in any::<i64>()) {
        if let Some(ms) = parse_retry_after_ms(Some(&s), now) {
            prop_assert!((0..=DAY_MS).contains(&ms));
        }
    }

    #[test]
    fn retry_after_numbers(secs in 0u32..200_000, frac in 0u32..1000) {
        let text = format!("{secs}.{frac:03}");
        let want = (i64::from(secs) * 1000 + i64::from(frac)).min(DAY_MS);
        prop_assert_eq!(parse_retry_after_ms(Some(&text), 0), Some(want));
    }

    #[test]
    fn retry_after_dates(offset in -2 * DAY_MS..2 * DAY_MS, now_s in 0i64..253_000_000_000) {
        // Whole seconds so the date can be written exactly.
        let now = now_s * 1000;
        let at = now + offset / 1000 * 1000;
        let text = format_imf(at);
        let want = (at - now).clamp(0, DAY_MS);
        prop_assert_eq!(parse_retry_after_ms(Some(&text), now), Some(want), "{}", text);
    }

    #[test]
    fn retry_after_date_like_garbage(s in "[A-Za-z]{0,4},? ?[0-9]{0,3}[ -]?[A-Za-z]{0,4}[ -]?[0-9]{0,5} [0-9]{0,3}:[0-9]{0,3}:[0-9]{0,3} ?[A-Z]{0,4}", now in any::<i64>()) {
        if let Some(ms) = parse_retry_after_ms(Some(&s), now) {
            prop_assert!((0..=DAY_MS).contains(&ms));
        }
    }

    #[test]
    fn stated_retry_never_panics(s in any::<String>()) {
        if let Some(ms) = parse_stated_retry_ms(Some(&s)) {
            prop_assert!((0..=DAY_MS).contains(&ms));
        }
    }

    #[test]
    fn stated_retry_phrase_like(s in "(try again|retry|retry_after|retryDelay)( in| after|\": \"|: )?[0-9.]{0,8}(ms|s|m|h|min|sec|x)?[0-9.]{0,4}(ms|s|m|h)?[ .a-z]{0,3}") {
        if let Some(ms) = parse_stated_retry_ms(Some(&s)) {
            prop_assert!((0..=DAY_MS).contains(&ms));
        }
    }

    #[test]
    fn stated_retry_compound(m in 0i64..60, s in 0i64..60, cs in 0i64..100) {
        let text = format!("Please try again in {m}m{s}.{cs:02}s.");
        prop_assert_eq!(parse_stated_retry_ms(Some(&text)), Some(m * 60_000 + s * 1000 + cs * 10));
    }

    #[test]
    fn bare_numbers_are_never_delays(n in any::<u64>(), f in 0u32..1000) {
        let text = format!("{n}.{f} {n}s {n} seconds");
        prop_assert_eq!(parse_stated_retry_ms(Some(&text)), None);
    }

    #[test]
    fn provider_limit_never_panics(s in any::<String>()) {
        if let Some(learned) = parse_provider_limit(Some(&s)) {
            prop_assert!(learned.limit > 0);
        }
    }

    #[test]
    fn provider_limit_limit_like(s in "(TPM|tpd|rpm|RPD|tokens per day|requests per minute)?[ :(),]{0,3}[Ll]imit[ :=]{0,2}-?[0-9,.]{0,25}[a-z ]{0,3}") {
        if let Some(learned) = parse_provider_limit(Some(&s)) {
            prop_assert!(learned.limit > 0);
        }
    }

    #[test]
    fn provider_limit_round_trip(n in 1i64..=i64::MAX, axis in 0usize..4) {
        let axis = LimitAxis::ALL[axis];
        let text = format!("on {}: Limit {n}, Used 1", axis.as_str().to_uppercase());
        prop_assert_eq!(parse_provider_limit(Some(&text)), Some(LearnedLimit { kind: axis, limit: n }));
    }

    #[test]
    fn failure_kind_never_panics(status in proptest::option::of(any::<i64>()), s in proptest::option::of(any::<String>())) {
        let k = infer_failure_kind(status, s.as_deref());
        prop_assert_ne!(k, FailureKind::EmptyCompletion);
    }
}

/// Formats `ms` (whole seconds, years 1970..=9999) as an IMF-fixdate.
fn format_imf(ms: i64) -> String {
    const MONTHS: [&str; 12] =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    let days = ms.div_euclid(DAY_MS);
    let secs = ms.rem_euclid(DAY_MS) / 1000;
    // civil_from_days
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[usize::try_from(days.rem_euclid(7)).unwrap()],
        d,
        MONTHS[usize::try_from(m - 1).unwrap()],
        y,
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[test]
fn a_failure_says_what_the_request_skips() {
    let skip =
        |status, message: Option<&str>| failure_skip(infer_failure_kind(status, message), status, message);
    assert_eq!(skip(Some(403), None), Skip::Model);
    assert_eq!(skip(Some(404), Some("model not found")), Skip::Model);
    assert_eq!(skip(Some(400), Some("maximum context length is 8192 tokens")), Skip::Model);
    assert_eq!(skip(Some(413), Some("Request Too Large")), Skip::Model);
    assert_eq!(skip(Some(400), Some("bad temperature")), Skip::Route);
    assert_eq!(skip(Some(500), None), Skip::Platform);
    assert_eq!(skip(Some(408), None), Skip::Platform);
    assert_eq!(skip(None, Some("connection refused")), Skip::Platform);
    assert_eq!(skip(Some(429), None), Skip::Route);
    assert_eq!(failure_skip(FailureKind::EmptyCompletion, None, None), Skip::Route);
    assert_eq!(Skip::Platform.as_str(), "platform");
}

/// SPEC 24.6: integers as the provider writes them, whole.
#[test]
fn integers_are_read_whole() {
    use crate::core::text::parse_integer;
    assert_eq!(parse_integer("50"), Some(50));
    assert_eq!(parse_integer(" 0050 "), Some(50));
    assert_eq!(parse_integer("9223372036854775807"), Some(i64::MAX));
    for junk in [
        "",
        " ",
        "2e1",
        "2E1",
        "1.5",
        "20.",
        "-1",
        "+1",
        "0x10",
        "١٢",
        "9223372036854775808",
        "12345678901234567890",
    ] {
        assert_eq!(parse_integer(junk), None, "{junk}");
    }
}
