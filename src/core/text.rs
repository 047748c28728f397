//! What every reader of a provider's body shares (`parse`'s generic readers and each
//! provider's own, `providers`): a regex compiled once, and the head of a body that is
//! read at all.
use regex::Regex;
use std::sync::OnceLock;

/// Compiles `pattern` once into `cell`; `None` if it does not compile.
pub(crate) fn cached(cell: &'static OnceLock<Option<Regex>>, pattern: &str) -> Option<&'static Regex> {
    cell.get_or_init(|| Regex::new(pattern).ok()).as_ref()
}

/// Provider error bodies are small; a hostile multi-megabyte one is read only this far,
/// so that no parser can stall a failure call.
pub const MAX_PARSED_BYTES: usize = 16 * 1024;

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
