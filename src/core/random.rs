//! Random numbers where nothing stronger is needed (lease ids, a Redis writer's id):
//! std's per-process random hasher keys, plus the process id, so that a forked child
//! (which inherits the parent's keys) draws other numbers.

/// 64 random bits.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}
