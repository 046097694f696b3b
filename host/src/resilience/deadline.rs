//! The request deadline: all attempts of one request together must finish
//! within `request_timeout_ms`, whatever each provider's own timeout.

use std::time::Duration;

use tokio::time::Instant;

pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `[server] request_timeout_ms`.
pub fn request_timeout_from_raw(
    raw: &crate::settings::RawServer,
    cx: &crate::settings::Context,
) -> Result<Duration, crate::settings::ConfigError> {
    cx.millis(
        "[server] request_timeout_ms",
        raw.request_timeout_ms,
        DEFAULT_REQUEST_TIMEOUT,
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    at: Instant,
}

impl Deadline {
    pub fn after(budget: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + budget,
        }
    }

    /// When it passes.
    pub fn at(self) -> Instant {
        self.at
    }

    pub fn expired(self) -> bool {
        Instant::now() >= self.at
    }

    /// The time an attempt allowed `limit` may take: its own limit, cut
    /// short by the deadline.
    pub fn bound(self, limit: Duration) -> Duration {
        limit.min(self.at.saturating_duration_since(Instant::now()))
    }
}
