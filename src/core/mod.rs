//! The pure core: no Python, no system clock, no environment reads.
pub mod parse;
pub mod pools;
