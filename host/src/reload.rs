//! Hot reload: when `platforms.toml`, the keys file or a plugin library
//! changes (or on SIGHUP), build a whole new [`Snapshot`] and swap it in.
//!
//! The new snapshot is built completely (config parsed and validated,
//! libraries loaded, providers set up, chains assembled, keys read) before
//! anything changes; any failure is logged in one line naming the file and
//! the reason, and the old snapshot keeps serving. Requests already running
//! finish on the snapshot they started with.
//!
//! We watch the folders, not the files: a watch on a file dies when an
//! editor or `mv` replaces it, and never sees a file being created. Events
//! are filtered by name and debounced, since one save is several events.
//! Where the OS watcher cannot start, we poll.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind};
use notify::{Event, EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::auth::KeyStore;
use crate::config::{Config, ConfigError};
use crate::state::{App, Snapshot, StartError};

/// Quiet time after the last event before reloading.
const DEBOUNCE: Duration = Duration::from_millis(250);
/// How often the polling fallback looks.
const POLL_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Build(#[from] StartError),
}

/// Files whose change triggers a reload, as (folder, file name) pairs with
/// the folder canonicalized, which is how watch events name them.
type Watched = Arc<Mutex<HashSet<(PathBuf, std::ffi::OsString)>>>;

/// Watches the files a configuration names. Start it before the server
/// announces itself, so no change made after that is missed.
pub struct Watch {
    events: mpsc::UnboundedReceiver<()>,
    watched: Watched,
    folders: FolderWatcher,
}

impl Watch {
    pub fn start(config: &Config) -> Watch {
        let (tx, events) = mpsc::unbounded_channel();
        let watched: Watched = Arc::default();
        let mut folders = FolderWatcher::start(tx, watched.clone());
        folders.follow(config, &watched);
        Watch {
            events,
            watched,
            folders,
        }
    }
}

pub struct Reloader {
    app: Arc<App>,
    /// Where the server listens; a config asking for another address needs
    /// a restart.
    listening: SocketAddr,
    hangup: Hangup,
    watch: Watch,
}

impl Reloader {
    /// `hangup` and `watch` are set up before the server announces itself.
    pub fn new(app: Arc<App>, listening: SocketAddr, hangup: Hangup, watch: Watch) -> Reloader {
        Reloader {
            app,
            listening,
            hangup,
            watch,
        }
    }

    /// Reloads on every change of a watched file and on SIGHUP, until the
    /// task is dropped.
    pub async fn run(mut self) {
        loop {
            let trigger = tokio::select! {
                event = self.watch.events.recv() => match event {
                    Some(()) => {
                        // Let a burst of events settle into one reload.
                        while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, self.watch.events.recv()).await {}
                        "file change"
                    }
                    None => return,
                },
                () = next_hangup(&mut self.hangup) => "SIGHUP",
            };
            tracing::debug!(trigger, "reloading");
            // Reading files and loading libraries blocks: keep it off the
            // threads that serve requests.
            let (app, listening) = (self.app.clone(), self.listening);
            let result = tokio::task::spawn_blocking(move || reload(&app, listening)).await;
            let result = result.unwrap_or_else(|_| {
                tracing::error!("reload panicked; still serving the previous configuration");
                Ok(())
            });
            crate::metrics::reload(result.is_ok());
            if let Err(e) = result {
                tracing::error!("reload rejected, still serving the previous configuration: {e}");
            }
            self.watch
                .folders
                .follow(&self.app.snapshot().config, &self.watch.watched);
        }
    }
}

/// Rebuilds the snapshot from the files. On error nothing changes, except
/// that the keys file is still re-read: a broken config must not keep a
/// revoked key alive.
pub fn reload(app: &App, listening: SocketAddr) -> Result<(), ReloadError> {
    let current = app.snapshot();
    let config = match Config::load(&current.config.path) {
        Ok(config) => config,
        Err(e) => {
            reload_keys_only(app, &current);
            return Err(e.into());
        }
    };
    warn_about_restart_only_changes(&current.config, &config, listening);
    let next = match Snapshot::build(config, &app.loader, Some(&current)) {
        Ok(next) => next,
        Err(e) => {
            reload_keys_only(app, &current);
            return Err(e.into());
        }
    };
    let changes = next.routes.changes_since(&current.routes);
    tracing::info!(keys = next.keys.len(), "reload applied: {changes}");
    app.replace(next);
    Ok(())
}

fn reload_keys_only(app: &App, current: &Snapshot) {
    match KeyStore::load(&current.config.server.keys_file) {
        Ok(keys) if keys != *current.keys => {
            tracing::info!(keys = keys.len(), "keys reloaded");
            app.replace(Snapshot {
                config: current.config.clone(),
                routes: current.routes.clone(),
                keys: Arc::new(keys),
                rate_limiter: current.rate_limiter.clone(),
            });
        }
        Ok(_) => {}
        Err(e) => tracing::error!("keys not reloaded: {e}"),
    }
}

fn warn_about_restart_only_changes(old: &Config, new: &Config, listening: SocketAddr) {
    if new.server.listen != old.server.listen && new.server.listen != listening {
        tracing::warn!(
            listening = %listening,
            configured = %new.server.listen,
            "[server] listen changed: restart to apply"
        );
    }
    let (o, n) = (&old.server, &new.server);
    let mut fixed = Vec::new();
    if n.limits.header_timeout != o.limits.header_timeout {
        fixed.push("header_timeout_ms");
    }
    if n.limits.max_header_bytes != o.limits.max_header_bytes {
        fixed.push("max_header_bytes");
    }
    if n.limits.max_concurrent_requests != o.limits.max_concurrent_requests {
        fixed.push("max_concurrent_requests");
    }
    if n.limits.shutdown_grace != o.limits.shutdown_grace {
        fixed.push("shutdown_grace_ms");
    }
    if n.state_dir != o.state_dir {
        fixed.push("state_dir");
    }
    if n.cursor_key != o.cursor_key {
        fixed.push("cursor_key_env");
    }
    if n.upstream_proxy != o.upstream_proxy {
        fixed.push("upstream_proxy");
    }
    if n.admin_listen != o.admin_listen {
        fixed.push("admin_listen");
    }
    if n.log_format != o.log_format {
        fixed.push("log_format");
    }
    if !fixed.is_empty() {
        tracing::warn!(settings = ?fixed, "[server] settings changed that apply only after a restart");
    }
}

/// The OS's file watcher, or a poller where it cannot start.
struct FolderWatcher {
    inner: Option<Box<dyn Watcher + Send>>,
    folders: HashSet<PathBuf>,
}

impl FolderWatcher {
    fn start(tx: mpsc::UnboundedSender<()>, watched: Watched) -> FolderWatcher {
        let handler = move |event: notify::Result<Event>| {
            let Ok(event) = event else { return };
            if !is_change(&event.kind) {
                return;
            }
            let files = watched.lock().unwrap_or_else(|e| e.into_inner());
            let relevant = event
                .paths
                .iter()
                .any(|path| match (path.parent(), path.file_name()) {
                    (Some(dir), Some(name)) => files.contains(&(dir.to_owned(), name.to_owned())),
                    _ => false,
                });
            if relevant {
                let _ = tx.send(());
            }
        };
        let inner: Option<Box<dyn Watcher + Send>> =
            match notify::recommended_watcher(handler.clone()) {
                Ok(watcher) => Some(Box::new(watcher)),
                Err(e) => {
                    tracing::warn!(
                        "file watching unavailable ({e}); polling every {} ms",
                        POLL_INTERVAL.as_millis()
                    );
                    let config = notify::Config::default().with_poll_interval(POLL_INTERVAL);
                    match notify::PollWatcher::new(handler, config) {
                        Ok(poller) => Some(Box::new(poller)),
                        Err(e) => {
                            tracing::error!("cannot watch files ({e}); reload with SIGHUP");
                            None
                        }
                    }
                }
            };
        FolderWatcher {
            inner,
            folders: HashSet::new(),
        }
    }

    /// Watches the config file, the keys file and every library `config`
    /// names (their folders, filtered by name).
    fn follow(&mut self, config: &Config, watched: &Watched) {
        let files = std::iter::once(config.path.as_path())
            .chain(std::iter::once(config.server.keys_file.as_path()))
            .chain(config.providers.values().map(|p| p.library.as_path()));
        let mut wanted = HashSet::new();
        for file in files {
            let Some((folder, name)) = split(file) else {
                continue;
            };
            wanted.insert((folder.clone(), name));
            if self.folders.contains(&folder) {
                continue;
            }
            if let Some(inner) = self.inner.as_mut() {
                match inner.watch(&folder, RecursiveMode::NonRecursive) {
                    Ok(()) => {
                        self.folders.insert(folder);
                    }
                    Err(e) => tracing::warn!(folder = %folder.display(), "cannot watch: {e}"),
                }
            }
        }
        *watched.lock().unwrap_or_else(|e| e.into_inner()) = wanted;
    }
}

/// A file as its canonical folder and its name.
fn split(file: &Path) -> Option<(PathBuf, std::ffi::OsString)> {
    let name = file.file_name()?.to_owned();
    let folder = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Some((folder.canonicalize().ok()?, name))
}

/// Whether an event may mean new content. Reads (ours included: we hash
/// the libraries) must not trigger reloads.
fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Create(_) | EventKind::Remove(_) => true,
        EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => false,
        EventKind::Modify(_) => true,
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) | EventKind::Any | EventKind::Other => false,
    }
}

/// SIGHUP, where the platform has it.
#[cfg(unix)]
pub type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
pub type Hangup = Option<()>;

/// Registers for SIGHUP now: before the server announces itself, since an
/// unhandled SIGHUP kills the process.
pub fn hangup_signal() -> Hangup {
    #[cfg(unix)]
    {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
    }
    #[cfg(not(unix))]
    {
        None
    }
}

async fn next_hangup(hangup: &mut Hangup) {
    #[cfg(unix)]
    if let Some(signal) = hangup {
        signal.recv().await;
        return;
    }
    let _ = hangup;
    std::future::pending::<()>().await
}
