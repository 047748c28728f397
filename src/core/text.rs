//! What every reader of a provider's body shares (`parse`'s generic readers and each
//! provider's own, `providers`): a regex compiled once, and the head of a body that is
//! read at all.
use regex::Regex;
use std::sync::OnceLock;

/// Compiles `pattern` once into `cell`; `None` if it does not compile.
pub(crate) fn cached(cell: &'static OnceLock<Option<Regex>>, pattern: &str) -> Option<&'static Regex> {
    cell.get_or_init(|| Regex::new(pattern).ok()).as_ref()
}

/// How far a provider's body is read (SPEC 24.6: what a provider writes is read
/// whole): 1 MiB, far beyond any error body a provider sends (an aggregator's upstream
/// 429 quoting its upstream's answer in `metadata.raw` included), while a hostile
/// larger one is cut here. Every parser reads it in linear time (the `regex` crate
/// has no backtracking), so a full megabyte costs a failure call milliseconds.
pub const MAX_PARSED_BYTES: usize = 1024 * 1024;

/// The first `MAX_PARSED_BYTES` of `text`, cut at a character boundary.
pub(crate) fn head(text: &str) -> &str {
    if text.len() <= MAX_PARSED_BYTES {
        return text;
    }
    let mut end = MAX_PARSED_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// An integer as a provider writes it (SPEC 24.6): ASCII digits only, surrounding
/// whitespace ignored, read whole. A sign, a fraction, an exponent (`2e1`), anything
/// else, or a value beyond i64 (never cut to fewer digits) is `None`.
pub(crate) fn parse_integer(text: &str) -> Option<i64> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<i64>().ok()
}
