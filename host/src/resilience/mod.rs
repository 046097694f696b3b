//! Resilience layers, one concern each: a [`breaker`] per provider, a
//! [`rate_limit`] per API key, [`concurrency`] gates (for the whole server
//! and per provider), the request [`deadline`], what keeps the work of an
//! [`abandon`]ed request inside those limits, and where plugin code runs so
//! that a [`runaway`] plugin stops nothing else. The first four are small
//! state machines without I/O, unit-tested beside them; the last two own
//! tasks or threads (`abandon` finishes a hung-up request's work, `runaway`
//! keeps a watchdog and a small pool). The chain and the request path only
//! ask them "may I?" and report how it went.

pub mod abandon;
pub mod breaker;
pub mod concurrency;
pub mod deadline;
pub mod rate_limit;
pub mod runaway;
