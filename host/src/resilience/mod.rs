//! Resilience layers, one concern each: a [`breaker`] per provider, a
//! [`rate_limit`] per API key, [`concurrency`] gates (for the whole server
//! and per provider), the request [`deadline`], and what keeps the work of
//! an [`abandon`]ed request inside those limits. Each decision is a small state machine
//! without I/O, unit-tested beside it; the chain and the request path only
//! ask them "may I?" and report how it went.

pub mod abandon;
pub mod breaker;
pub mod concurrency;
pub mod deadline;
pub mod rate_limit;
pub mod runaway;
