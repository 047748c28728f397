//! OpenAI: each model its own pool; `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`
//! headers (SPEC §8.2); the corpus, `openai/`, holds its rate-limit and quota bodies.
use super::{generic, HeaderFamily, Provider};

pub(super) const PROVIDER: Provider = Provider {
    name: "openai",
    hosts: &["api.openai.com"],
    header_families: &[HeaderFamily::Plain],
    ..generic::PROVIDER
};
