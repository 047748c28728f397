//! Parsers for provider error bodies and headers (SPEC §6.2, §7).
