//! The pure core: no Python, no system clock, no environment reads (the binding
//! passes a clock and a copy of the environment in).
pub mod admission;
pub mod calendar;
pub mod clock;
pub mod cooldowns;
pub mod engine;
pub mod env;
pub mod error;
pub mod forecast;
pub mod fork;
pub mod handle;
pub mod headers;
pub mod limits;
pub mod money;
pub mod parse;
pub mod pools;
pub mod probe;
pub mod providers;
pub mod random;
pub mod state;
pub mod store;
pub mod tenants;
pub mod text;
pub mod types;
pub mod upstream;
pub mod wait;
pub mod windows;
