//! Limits on work in flight: the server-wide one on requests
//! (`[server] max_concurrent_requests`; past it a request is answered `503
//! OVERLOADED` at once instead of queueing: a queue only makes every caller
//! wait longer, and the caller can retry elsewhere or later), each key's
//! share of it (`[server] max_concurrent_requests_per_key`; past it that
//! key's request is answered `429 RATE_LIMITED` at once, so one key's burst
//! of slow requests cannot take every place, or every provider's
//! `max_in_flight`, from the others), and each
//! provider's on its upstream requests (`[providers.NAME] max_in_flight`;
//! past it the provider is busy and the chain asks the next).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::sync::lock;

pub const DEFAULT_MAX_CONCURRENT: usize = 1024;
/// Default `[providers.NAME] max_in_flight`.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;

/// `[server] max_concurrent_requests`.
pub fn max_from_raw(
    raw: &crate::settings::RawServer,
    cx: &crate::settings::Context,
) -> Result<usize, crate::settings::ConfigError> {
    cx.positive(
        "[server] max_concurrent_requests",
        raw.max_concurrent_requests,
        DEFAULT_MAX_CONCURRENT,
    )
}

/// `[server] max_concurrent_requests_per_key`; `None`: a key may take every
/// place under `max_concurrent_requests`.
pub fn per_key_max_from_raw(
    raw: &crate::settings::RawServer,
    cx: &crate::settings::Context,
) -> Result<Option<usize>, crate::settings::ConfigError> {
    match raw.max_concurrent_requests_per_key {
        Some(0) => Err(cx.invalid(
            "[server] max_concurrent_requests_per_key",
            "must be above 0",
        )),
        max => Ok(max),
    }
}

#[derive(Debug, Clone)]
pub struct ConcurrencyLimit {
    permits: Arc<Semaphore>,
    max: usize,
}

/// Held for as long as the work it admits runs.
pub type InFlight = OwnedSemaphorePermit;

impl ConcurrencyLimit {
    pub fn new(max: usize) -> ConcurrencyLimit {
        ConcurrencyLimit {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// The limit it was made with.
    pub fn max(&self) -> usize {
        self.max
    }

    /// A slot, or `None` when full.
    pub fn try_enter(&self) -> Option<InFlight> {
        self.permits.clone().try_acquire_owned().ok()
    }
}

/// Each key's requests in flight, by key name, for
/// `[server] max_concurrent_requests_per_key`. Only keys with a request in
/// flight have an entry, so it holds no more names than there are requests
/// in flight. Counted per process: with several replicas a key may have
/// this many in flight at each. Only requests admitted while the setting is
/// on are counted: turned on by a reload, it binds as those end.
#[derive(Debug, Default)]
pub struct InFlightByKey {
    in_flight: Mutex<HashMap<Arc<str>, usize>>,
}

/// One request of a key in flight, while it lasts.
#[derive(Debug)]
pub struct KeyInFlight {
    counts: Arc<InFlightByKey>,
    key: Arc<str>,
}

impl InFlightByKey {
    /// A place for one more request of `key`, or `None` when `max` are in
    /// flight already.
    pub fn try_enter(self: &Arc<Self>, key: &str, max: usize) -> Option<KeyInFlight> {
        let mut in_flight = lock(&self.in_flight);
        let key = match in_flight.get_key_value(key) {
            Some((_, &n)) if n >= max => return None,
            Some((name, _)) => name.clone(),
            None => Arc::from(key),
        };
        *in_flight.entry(key.clone()).or_default() += 1;
        Some(KeyInFlight {
            counts: self.clone(),
            key,
        })
    }
}

impl Drop for KeyInFlight {
    fn drop(&mut self) {
        let mut in_flight = lock(&self.counts.in_flight);
        if let Some(n) = in_flight.get_mut(&*self.key) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&*self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_with_nothing_in_flight_leave_no_entry_behind() {
        let limits = Arc::new(InFlightByKey::default());
        let a = limits.try_enter("alice", 2).unwrap();
        let b = limits.try_enter("alice", 2).unwrap();
        let bob = limits.try_enter("bob", 2).unwrap();
        drop((a, b, bob));
        assert!(lock(&limits.in_flight).is_empty());
    }
}
