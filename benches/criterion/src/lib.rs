//! Empty: the benches live in `benches/`.
