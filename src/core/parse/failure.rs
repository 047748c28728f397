//! The kind of a failure (SPEC §6.2), by status and provider error body, and
//! the upstream an aggregator's body blames (SPEC 21.1).
use super::head;
use super::learned::LimitAxis;
use crate::core::limits::{DAY, MINUTE};
use crate::core::providers::UPSTREAM_PHRASES;
use std::fmt;
use std::str::FromStr;

// Read by the failure rules, defined with the aggregator that sends it.
pub use crate::core::providers::upstream_provider_name;

/// What went wrong with an upstream call; decides the bench (SPEC §6.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureKind {
    Payment,
    Forbidden,
    Auth,
    /// SPEC 21.1: an aggregator's upstream for one model is congested, for every key.
    Upstream,
    DailyQuota,
    /// SPEC 15.4: the provider refused for too many requests at once.
    Concurrency,
    RateLimit,
    Timeout,
    ServerError,
    Transport,
    EmptyCompletion,
    Other,
}

impl FailureKind {
    /// Every kind, in SPEC table order.
    pub const ALL: [FailureKind; 12] = [
        FailureKind::Payment,
        FailureKind::Forbidden,
        FailureKind::Auth,
        FailureKind::Upstream,
        FailureKind::DailyQuota,
        FailureKind::Concurrency,
        FailureKind::RateLimit,
        FailureKind::Timeout,
        FailureKind::ServerError,
        FailureKind::Transport,
        FailureKind::EmptyCompletion,
        FailureKind::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Payment => "payment",
            FailureKind::Forbidden => "forbidden",
            FailureKind::Auth => "auth",
            FailureKind::Upstream => "upstream",
            FailureKind::DailyQuota => "daily_quota",
            FailureKind::Concurrency => "concurrency",
            FailureKind::RateLimit => "rate_limit",
            FailureKind::Timeout => "timeout",
            FailureKind::ServerError => "server_error",
            FailureKind::Transport => "transport",
            FailureKind::EmptyCompletion => "empty_completion",
            FailureKind::Other => "other",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FailureKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FailureKind::ALL.into_iter().find(|kind| kind.as_str() == s).ok_or_else(|| {
            let names: Vec<&str> = FailureKind::ALL.iter().map(|k| k.as_str()).collect();
            format!("unknown failure kind {s:?}; expected one of {}", names.join(", "))
        })
    }
}

const PAYMENT_PHRASES: &[&str] = &[
    "payment required",
    "insufficient_quota",
    "insufficient credit", // also "credits"
    "insufficient balance",
];
const DAY_PHRASES: &[&str] = &["daily", "per day", "per-day", "perday", "per_day", "today"];
const QUOTA_PHRASES: &[&str] = &["quota", "limit", "allocation", "exhaust", "used up"];
const MINUTE_PHRASES: &[&str] = &["per minute", "per-minute", "perminute", "per_minute"];
const CONCURRENCY_PHRASES: &[&str] = &[
    "concurrent",
    "concurrency",
    "parallel requests",
    "pending requests",
    "simultaneous",
    "too many connections",
];
const RATE_LIMIT_PHRASES: &[&str] = &[
    "rate limit",
    "rate-limit",
    "rate_limit",
    "ratelimit",
    "too many requests",
    "resource_exhausted",
    "quota",
];
const TIMEOUT_PHRASES: &[&str] =
    &["timeout", "timed out", "time-out", "deadline exceeded", "deadline_exceeded", "etimedout"];
const TRANSPORT_PHRASES: &[&str] = &[
    "connection reset",
    "connection refused",
    "connection aborted",
    "econnreset",
    "econnrefused",
    "econnaborted",
    "socket hang up",
    "broken pipe",
    "network is unreachable",
    "name resolution",
];

fn contains_any(haystack: &str, needles: &[&str]) -> bool {
    needles.iter().any(|n| haystack.contains(n))
}

/// `word` occurs in `haystack` with no ASCII letter or digit on either side.
fn contains_word(haystack: &str, word: &str) -> bool {
    let bytes = haystack.as_bytes();
    haystack.match_indices(word).any(|(start, _)| {
        let before = start.checked_sub(1).and_then(|i| bytes.get(i));
        let after = start.checked_add(word.len()).and_then(|i| bytes.get(i));
        !before.is_some_and(u8::is_ascii_alphanumeric) && !after.is_some_and(u8::is_ascii_alphanumeric)
    })
}

/// Infers the failure kind from a status and a message (SPEC §6.2 table):
/// the first matching row wins, phrases match case-insensitively.
///
/// Rows: payment (402, "payment required", "insufficient_quota", "insufficient
/// credit(s)/balance"), forbidden (403, "forbidden"), auth (401), upstream (SPEC
/// 21.1: a 429 or 503 saying "rate-limited upstream" / "overloaded upstream", or
/// whose JSON body's `error.metadata.provider_name` names the upstream), daily_quota
/// (a day AND a quota named, and no minute axis), concurrency (a 429 or 503, or
/// no status, whose message names concurrency: "concurrent", "pending requests",
/// ...), rate_limit (429, "rate
/// limit", "too many requests", "resource_exhausted", "quota"), timeout (408,
/// "timeout", "timed out", "deadline exceeded"), server_error (5xx, so 504
/// too), transport (connection reset/refused/aborted, ...), else other.
/// `empty_completion` is never inferred.
pub fn infer_failure_kind(status: Option<i64>, message: Option<&str>) -> FailureKind {
    let text = message.map(|m| head(m).to_lowercase()).unwrap_or_default();
    let text = text.as_str();
    let has = |phrases: &[&str]| contains_any(text, phrases);

    if status == Some(402) || has(PAYMENT_PHRASES) {
        return FailureKind::Payment;
    }
    if status == Some(403) || has(&["forbidden"]) {
        return FailureKind::Forbidden;
    }
    if status == Some(401) {
        return FailureKind::Auth;
    }
    if matches!(status, Some(429 | 503))
        && (has(UPSTREAM_PHRASES) || message.is_some_and(|m| upstream_provider_name(m).is_some()))
    {
        return FailureKind::Upstream;
    }
    // The classic limits' names count as words of their window ("rpd", "tpm").
    let names_window = |window| {
        LimitAxis::ALL
            .into_iter()
            .any(|axis| axis.window().is_some_and(|(_, w)| w == window) && contains_word(text, axis.as_str()))
    };
    let names_day = has(DAY_PHRASES) || names_window(DAY);
    let names_minute_axis = has(MINUTE_PHRASES) || names_window(MINUTE);
    if names_day && has(QUOTA_PHRASES) && !names_minute_axis {
        return FailureKind::DailyQuota;
    }
    if matches!(status, None | Some(429 | 503)) && has(CONCURRENCY_PHRASES) {
        return FailureKind::Concurrency;
    }
    if status == Some(429) || has(RATE_LIMIT_PHRASES) {
        return FailureKind::RateLimit;
    }
    if status == Some(408) || has(TIMEOUT_PHRASES) {
        return FailureKind::Timeout;
    }
    if status.is_some_and(|s| (500..=599).contains(&s)) {
        return FailureKind::ServerError;
    }
    if has(TRANSPORT_PHRASES) {
        return FailureKind::Transport;
    }
    FailureKind::Other
}

/// What the rest of a failed request skips (SPEC 24.7): the key route, the model on
/// every key (its key would not help: 403, 404, a context too large), or the platform
/// (the provider is unwell: 5xx, timeouts, transport).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Skip {
    Route,
    Model,
    Platform,
}

impl Skip {
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::Route => "route",
            Skip::Model => "model",
            Skip::Platform => "platform",
        }
    }
}

/// A 400 or 413 message that says the context or request is too large (SPEC 24.7).
const TOO_LARGE_PHRASES: &[&str] =
    &["context length", "context_length_exceeded", "too large", "maximum context"];

/// SPEC 24.7: what a failure of `kind` (with its status and message) skips. `"model"`
/// for `forbidden`, a 404, or a 400/413 saying the context or request is too large;
/// `"platform"` for `server_error`, `timeout` and `transport`; `"route"` otherwise.
pub fn failure_skip(kind: FailureKind, status: Option<i64>, message: Option<&str>) -> Skip {
    let too_large = || {
        let text = message.map(|m| head(m).to_lowercase()).unwrap_or_default();
        contains_any(&text, TOO_LARGE_PHRASES)
    };
    if kind == FailureKind::Forbidden
        || status == Some(404)
        || (matches!(status, Some(400 | 413)) && too_large())
    {
        return Skip::Model;
    }
    match kind {
        FailureKind::ServerError | FailureKind::Timeout | FailureKind::Transport => Skip::Platform,
        _ => Skip::Route,
    }
}
