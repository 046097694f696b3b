//! Limits on work in flight: the server-wide one on requests
//! (`[server] max_concurrent_requests`; past it a request is answered `503
//! OVERLOADED` at once instead of queueing: a queue only makes every caller
//! wait longer, and the caller can retry elsewhere or later), and each
//! provider's on its upstream requests (`[providers.NAME] max_in_flight`;
//! past it the provider is busy and the chain asks the next).

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub const DEFAULT_MAX_CONCURRENT: usize = 1024;
/// Default `[providers.NAME] max_in_flight`.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;

/// `[server] max_concurrent_requests`.
pub fn max_from_raw(
    raw: &crate::config::RawServer,
    cx: &crate::config::Context,
) -> Result<usize, crate::config::ConfigError> {
    cx.positive(
        "[server] max_concurrent_requests",
        raw.max_concurrent_requests,
        DEFAULT_MAX_CONCURRENT,
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_past_the_limit_and_frees_on_drop() {
        let limit = ConcurrencyLimit::new(2);
        let a = limit.try_enter().unwrap();
        let _b = limit.try_enter().unwrap();
        assert!(limit.try_enter().is_none());
        drop(a);
        assert!(limit.try_enter().is_some());
    }
}
