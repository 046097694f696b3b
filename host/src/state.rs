//! The live state a request reads: [`App`], what the process holds for its
//! whole life, and one immutable [`Snapshot`] of the serving configuration
//! (routing table, keys, rate limiter), loaded once per request, so a
//! request finishes on the table it started with even if a reload swaps in
//! another.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::auth::{KeyStore, KeysError};
use crate::billing::Billing;
use crate::cache::Cache;
use crate::config::{ProcessConfig, ServingConfig};
use crate::cursor::CursorSealer;
use crate::http::openapi::{ApiDocument, ApiDocumentError};
use crate::plugins::Loader;
use crate::resilience::concurrency::{ConcurrencyLimit, InFlightByKey};
use crate::resilience::rate_limit::RateLimiter;
use crate::routing::{BuildError, Routes};
use crate::shared::Shared;
use crate::upstream::UpstreamClient;

/// Why a snapshot could not be built; the previous one keeps serving.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Routes(#[from] BuildError),
    #[error(transparent)]
    Keys(#[from] KeysError),
    #[error(transparent)]
    Document(#[from] ApiDocumentError),
}

/// What one request is served from.
#[derive(Clone)]
pub struct Snapshot {
    pub serving: Arc<ServingConfig>,
    pub routes: Arc<Routes>,
    pub keys: Arc<KeyStore>,
    /// Why `keys` is not what the keys file holds: the file exists but
    /// cannot be read or parsed, so `keys` is the last good set and the
    /// instance is not ready. `None` when `keys` is the file's.
    pub keys_fault: Option<Arc<KeysError>>,
    pub rate_limiter: Option<Arc<RateLimiter>>,
    /// `GET /v1/openapi.json`: the document of the live platforms.
    pub document: Arc<ApiDocument>,
}

impl Snapshot {
    /// A snapshot of `serving` read from the config at `config_path`,
    /// reusing what `previous` has that is unchanged. `shared_keys`: the
    /// keys when they live in the shared store (then the keys file is not
    /// read); `None`: the keys file's.
    pub fn build(
        config_path: &std::path::Path,
        serving: ServingConfig,
        loader: &Loader,
        previous: Option<&Snapshot>,
        shared_keys: Option<Arc<KeyStore>>,
    ) -> Result<Snapshot, SnapshotError> {
        let routes = Routes::build(
            config_path,
            &serving.platforms,
            &serving.providers,
            loader,
            previous.map(|p| &*p.routes),
        )?;
        let document = Arc::new(ApiDocument::build(&serving.platforms)?);
        let (keys, keys_fault) = match shared_keys {
            Some(keys) => (keys, None),
            None => Snapshot::keys(&serving.keys_file, serving.keys_fail_closed, previous)?,
        };
        // Buckets survive a reload unless the limits changed.
        let rate_limiter = match (
            serving.rate_limit,
            previous.and_then(|p| p.rate_limiter.as_ref()),
        ) {
            (Some(wanted), Some(current)) if current.config() == wanted => Some(current.clone()),
            (Some(wanted), _) => Some(Arc::new(RateLimiter::new(wanted))),
            (None, _) => None,
        };
        Ok(Snapshot {
            serving: Arc::new(serving),
            routes: Arc::new(routes),
            keys,
            keys_fault,
            rate_limiter,
            document,
        })
    }

    /// This snapshot with the keys file read again, by the same rule as
    /// [`Snapshot::build`].
    pub fn with_keys_reread(&self) -> Snapshot {
        let (keys, keys_fault) = match Snapshot::keys(
            &self.serving.keys_file,
            self.serving.keys_fail_closed,
            Some(self),
        ) {
            Ok(read) => read,
            // Unreachable with a previous snapshot; keep what serves.
            Err(e) => (self.keys.clone(), Some(Arc::new(e))),
        };
        Snapshot {
            keys,
            keys_fault,
            ..self.clone()
        }
    }

    /// This snapshot with `keys` (from the shared store) answering.
    pub fn with_keys(&self, keys: Arc<KeyStore>) -> Snapshot {
        Snapshot {
            keys,
            keys_fault: None,
            ..self.clone()
        }
    }

    /// The keys at `path`, and why they are not the file's if they are not.
    ///
    /// A keys file that exists but cannot be read or parsed fails a start
    /// (there is no good set yet). On a running server, `previous`'s keys
    /// keep answering, with the fault (which makes the instance not ready):
    /// refusing every key would turn an operator's typo into an outage,
    /// and serving on silently would keep a revoked key alive unnoticed.
    /// With `fail_closed` (`[server] keys_fail_closed`) no key answers
    /// instead, until a good file is read.
    fn keys(
        path: &Path,
        fail_closed: bool,
        previous: Option<&Snapshot>,
    ) -> Result<(Arc<KeyStore>, Option<Arc<KeysError>>), KeysError> {
        match (KeyStore::load(path), previous) {
            (Ok(keys), _) => Ok((Arc::new(keys), None)),
            (Err(e), Some(_)) if fail_closed => {
                Ok((Arc::new(KeyStore::default()), Some(Arc::new(e))))
            }
            (Err(e), Some(previous)) => Ok((previous.keys.clone(), Some(Arc::new(e)))),
            (Err(e), None) => Err(e),
        }
    }

    /// Whether the keys answering are the keys file's (or the shared
    /// store's).
    pub fn keys_are_current(&self) -> bool {
        self.keys_fault.is_none()
    }
}

/// Everything the server shares between requests, for the life of the
/// process. Built by [`crate::lifecycle`].
pub struct App {
    /// The config file a reload reads.
    pub config_path: PathBuf,
    /// The settings the process started with; a reload cannot change them.
    pub process: ProcessConfig,
    /// The snapshot new requests see ([`App::snapshot`], [`App::replace`]).
    pub snapshot: ArcSwap<Snapshot>,
    pub cursors: CursorSealer,
    pub upstream: UpstreamClient,
    pub loader: Loader,
    pub in_flight: ConcurrencyLimit,
    /// Each key's requests in flight; survives reloads.
    pub in_flight_by_key: Arc<InFlightByKey>,
    /// Credits: reservations, and the ledger they are booked in.
    pub billing: Arc<Billing>,
    /// Answers kept for their time to live; survives reloads.
    pub cache: Arc<Cache>,
    /// The store replicas share (`[state] backend = "redis"`); `None`: all
    /// state is this process's.
    pub shared: Option<Arc<Shared>>,
    /// This process created the local ledger: none was at `[ledger] path`
    /// (said at start: a typo there starts every key's spending at 0).
    pub new_ledger: bool,
    /// Set at shutdown ([`App::begin_draining`]).
    pub draining: AtomicBool,
}

impl App {
    /// The current snapshot; hold it for the whole request.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Makes `snapshot` the one new requests see.
    pub fn replace(&self, snapshot: Snapshot) {
        self.snapshot.store(Arc::new(snapshot));
    }

    /// Marks the server as shutting down: `/readyz` answers 503 from now on.
    pub fn begin_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}
