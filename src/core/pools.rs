//! Quota pool keys (SPEC §8.1) and local endpoints (SPEC §6.1 step 1).
