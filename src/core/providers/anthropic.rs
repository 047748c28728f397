//! Anthropic: each model its own pool; `anthropic-ratelimit-*` headers, input and
//! output tokens metered apart (SPEC §8.2, §14.4).
use super::{generic, HeaderFamily, Provider};

pub(super) const PROVIDER: Provider = Provider {
    name: "anthropic",
    hosts: &["api.anthropic.com"],
    header_families: &[HeaderFamily::Anthropic],
    ..generic::PROVIDER
};
