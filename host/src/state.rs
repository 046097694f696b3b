//! The live state a request reads: one immutable [`Snapshot`] (config,
//! routing table, keys, rate limiter), loaded once per request, so a request
//! finishes on the table it started with even if a reload swaps in another.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::auth::{KeyStore, KeysError};
use crate::billing::Accounts;
use crate::config::{Config, ServerLimits};
use crate::cursor::CursorSealer;
use crate::ledger::{Ledger, LedgerError};
use crate::plugins::Loader;
use crate::resilience::concurrency::ConcurrencyLimit;
use crate::resilience::rate_limit::RateLimiter;
use crate::routing::{BuildError, Routes};
use crate::upstream::{ClientError, UpstreamClient};

/// What one request is served from.
pub struct Snapshot {
    pub config: Arc<Config>,
    pub routes: Arc<Routes>,
    pub keys: Arc<KeyStore>,
    pub rate_limiter: Option<Arc<RateLimiter>>,
}

impl Snapshot {
    /// A snapshot of `config`, reusing what `previous` has that is unchanged.
    pub fn build(
        config: Config,
        loader: &Loader,
        previous: Option<&Snapshot>,
    ) -> Result<Snapshot, StartError> {
        let routes = Routes::build(&config, loader, previous.map(|p| &*p.routes))?;
        let keys = KeyStore::load(&config.server.keys_file)?;
        // Buckets survive a reload unless the limits changed.
        let rate_limiter = match (
            config.rate_limit,
            previous.and_then(|p| p.rate_limiter.as_ref()),
        ) {
            (Some(wanted), Some(current)) if current.config() == wanted => Some(current.clone()),
            (Some(wanted), _) => Some(Arc::new(RateLimiter::new(wanted))),
            (None, _) => None,
        };
        Ok(Snapshot {
            config: Arc::new(config),
            routes: Arc::new(routes),
            keys: Arc::new(keys),
            rate_limiter,
        })
    }
}

/// How often counted credits are written to the ledger.
const LEDGER_FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Everything the server shares between requests.
pub struct App {
    snapshot: ArcSwap<Snapshot>,
    pub cursors: CursorSealer,
    pub upstream: UpstreamClient,
    pub loader: Loader,
    /// Fixed for the life of the listener; a reload cannot change them.
    pub limits: ServerLimits,
    pub in_flight: ConcurrencyLimit,
    /// Where delivered credits are counted; fixed for the process.
    pub ledger: Ledger,
    pub accounts: Accounts,
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
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl App {
    /// Loads every plugin and the keys of `config`.
    pub fn start(config: Config) -> Result<App, StartError> {
        let loader = Loader::new(config.server.state_dir.clone());
        let cursors = CursorSealer::new(config.server.cursor_key.as_ref())
            .map_err(|e| StartError::Random(e.to_string()))?;
        let upstream =
            UpstreamClient::new(config.server.upstream_proxy.as_ref().map(|p| p.expose()))?;
        let limits = config.server.limits;
        let ledger = Ledger::open(&config.ledger_path, LEDGER_FLUSH_EVERY)?;
        let accounts = Accounts::new(ledger.lifetime_credits()?);
        let snapshot = Snapshot::build(config, &loader, None)?;
        loader.prune();
        Ok(App {
            snapshot: ArcSwap::from_pointee(snapshot),
            cursors,
            upstream,
            loader,
            limits,
            in_flight: ConcurrencyLimit::new(limits.max_concurrent_requests),
            ledger,
            accounts,
            draining: AtomicBool::new(false),
        })
    }

    /// The current snapshot; hold it for the whole request.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Makes `snapshot` the one new requests see.
    pub fn replace(&self, snapshot: Snapshot) {
        self.snapshot.store(Arc::new(snapshot));
    }

    /// Marks the server as shutting down.
    pub fn begin_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}
