//! Groq: one pool for the organisation (SPEC §8.1) and OpenAI-style headers (SPEC
//! §8.2). Its error bodies state the limit and the axis in words ("on tokens per day
//! (TPD): Limit 100000") and a compound delay ("try again in 1m26.4s"), both read by
//! `parse`'s generic readers; its per-minute 429 upsells "today" but names the minute
//! axis, so it is no daily quota (the corpus, `groq/`).
use super::{generic, HeaderFamily, Pool, Provider};

pub(super) const PROVIDER: Provider = Provider {
    name: "groq",
    hosts: &["api.groq.com"],
    pool: Pool::Fixed("groq::account"),
    header_families: &[HeaderFamily::Plain],
    ..generic::PROVIDER
};
