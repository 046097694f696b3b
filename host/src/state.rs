//! The live state a request reads: one immutable [`Snapshot`] (routing table
//! and keys), loaded once per request, so a request finishes on the table it
//! started with even if a new one is swapped in meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::auth::{KeyStore, KeysError};
use crate::config::{Config, ServerLimits};
use crate::cursor::CursorSealer;
use crate::plugins::Loader;
use crate::resilience::concurrency::ConcurrencyLimit;
use crate::resilience::rate_limit::RateLimiter;
use crate::routing::{BuildError, Routes};
use crate::upstream::{ClientError, UpstreamClient};

/// What one request is served from.
pub struct Snapshot {
    pub routes: Routes,
    pub keys: KeyStore,
}

/// Everything the server shares between requests.
pub struct App {
    snapshot: ArcSwap<Snapshot>,
    pub cursors: CursorSealer,
    pub upstream: UpstreamClient,
    pub loader: Loader,
    pub limits: ServerLimits,
    pub in_flight: ConcurrencyLimit,
    pub rate_limiter: Option<RateLimiter>,
    draining: AtomicBool,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Routes(#[from] BuildError),
    #[error(transparent)]
    Keys(#[from] KeysError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("no randomness for the cursor key: {0}")]
    Random(String),
}

impl App {
    /// Loads every plugin and the keys of `config`.
    pub fn start(config: &Config) -> Result<App, StartError> {
        let loader = Loader::new(config.server.state_dir.clone());
        let routes = Routes::build(config, &loader)?;
        let keys = KeyStore::load(&config.server.keys_file)?;
        let cursors = CursorSealer::new(config.server.cursor_key.as_ref())
            .map_err(|e| StartError::Random(e.to_string()))?;
        if config.server.cursor_key.is_none() {
            tracing::info!("no cursor_key_env: cursors are sealed with a per-process key and end with the process");
        }
        let upstream = UpstreamClient::new(config.server.upstream_proxy.as_deref())?;
        tracing::info!(
            platforms = routes.platform_count(),
            providers = routes.provider_count(),
            keys = keys.len(),
            "configuration loaded"
        );
        Ok(App {
            snapshot: ArcSwap::from_pointee(Snapshot { routes, keys }),
            cursors,
            upstream,
            loader,
            limits: config.server.limits,
            in_flight: ConcurrencyLimit::new(config.server.limits.max_concurrent_requests),
            rate_limiter: config.rate_limit.map(RateLimiter::new),
            draining: AtomicBool::new(false),
        })
    }

    /// Marks the server as shutting down.
    pub fn begin_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The current snapshot; hold it for the whole request.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }
}
