//! The live state a request reads: one immutable [`Snapshot`] (routing table
//! and keys), loaded once per request, so a request finishes on the table it
//! started with even if a new one is swapped in meanwhile.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::auth::{KeyStore, KeysError};
use crate::config::Config;
use crate::cursor::CursorSealer;
use crate::plugins::Loader;
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
        })
    }

    /// The current snapshot; hold it for the whole request.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }
}
