//! Resilience layers, one concern each: a [`breaker`] per provider, a
//! [`rate_limit`] per API key, a [`concurrency`] gate for the whole server,
//! and the request [`deadline`]. Each decision is a small state machine
//! without I/O, unit-tested beside it; the chain and the request path only
//! ask them "may I?" and report how it went.

pub mod breaker;
pub mod concurrency;
pub mod deadline;
pub mod rate_limit;
pub mod runaway;
