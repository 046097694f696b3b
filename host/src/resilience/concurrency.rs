//! The server-wide limit on requests in flight. Past it a request is
//! answered `503 OVERLOADED` at once instead of queueing: a queue only makes
//! every caller wait longer, and the caller can retry elsewhere or later.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub const DEFAULT_MAX_CONCURRENT: usize = 1024;

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
}

/// Held for as long as the request runs.
pub type InFlight = OwnedSemaphorePermit;

impl ConcurrencyLimit {
    pub fn new(max: usize) -> ConcurrencyLimit {
        ConcurrencyLimit {
            permits: Arc::new(Semaphore::new(max)),
        }
    }

    /// A slot, or `None` when the server is full.
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
