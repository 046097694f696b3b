//! Hot reload: when `platforms.toml`, the keys file or a plugin library
//! changes (or on SIGHUP, which [`crate::lifecycle`] turns into a request
//! here), build a whole new [`Snapshot`] and swap it in.
//!
//! With `[state] backend = "redis"` the keys are not a file's: a reload
//! keeps the snapshot's, and [`follow_shared_keys`] swaps in the
//! shared store's when they change.
//!
//! The new snapshot is built completely (config parsed and validated,
//! libraries loaded, providers set up, chains assembled, keys read) before
//! anything changes; any failure is logged in one line naming the file and
//! the reason, and the old snapshot keeps serving. Requests already running
//! finish on the snapshot they started with. Only the serving part of the
//! config is applied; a changed process setting is logged as needing a
//! restart.
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
use tokio_util::sync::CancellationToken;

use crate::auth::shared::{SharedKeys, POLL_EVERY};
use crate::config::{Config, ServingConfig};
use crate::settings::ConfigError;
use crate::shared::Shared;
use crate::state::{App, Snapshot, SnapshotError};

/// Quiet time after the last event before reloading.
const DEBOUNCE: Duration = Duration::from_millis(250);
/// How often the polling fallback looks.
const POLL_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Build(#[from] SnapshotError),
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
        folders.follow(&config.path, &config.serving, &watched);
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
    /// Reloads asked for from outside (SIGHUP).
    requests: mpsc::UnboundedReceiver<()>,
    watch: Watch,
}

impl Reloader {
    /// `watch` is set up before the server announces itself.
    pub fn new(
        app: Arc<App>,
        listening: SocketAddr,
        requests: mpsc::UnboundedReceiver<()>,
        watch: Watch,
    ) -> Reloader {
        Reloader {
            app,
            listening,
            requests,
            watch,
        }
    }

    /// Reloads on every change of a watched file and on every request,
    /// until `shutdown` fires.
    pub async fn run(mut self, shutdown: CancellationToken) {
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
                Some(()) = self.requests.recv() => "SIGHUP",
                () = shutdown.cancelled() => return,
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
            self.watch.folders.follow(
                &self.app.config_path,
                &self.app.snapshot().serving,
                &self.watch.watched,
            );
        }
    }
}

/// Rebuilds the snapshot from the files. On error nothing changes, except
/// that the keys file is still re-read: a broken config must not keep a
/// revoked key alive.
///
/// A keys file that exists but cannot be read or parsed does not stop the
/// rest of a reload: the last good keys keep answering, the instance turns
/// not ready (so a load balancer sends traffic elsewhere), and every reload
/// logs the error until the file is fixed.
pub fn reload(app: &App, listening: SocketAddr) -> Result<(), ReloadError> {
    let current = app.snapshot();
    let config = match Config::load(&app.config_path) {
        Ok(config) => config,
        Err(e) => {
            crate::files::warn_if_loose(
                &app.config_path,
                &current.serving.keys_file,
                current.serving.libraries(),
            );
            reload_keys_only(app, &current);
            return Err(e.into());
        }
    };
    crate::files::warn_if_loose(
        &config.path,
        &config.serving.keys_file,
        config.serving.libraries(),
    );
    warn_about_restart_only_changes(app, &config, listening);
    let settings = current.serving.changed_settings(&config.serving);
    // Shared keys are followed by their own task, never read from a file.
    let shared_keys = app.shared.as_ref().map(|_| current.keys.clone());
    let next = match Snapshot::build(
        &config.path,
        config.serving,
        &app.loader,
        Some(&current),
        shared_keys,
    ) {
        Ok(next) => next,
        Err(e) => {
            reload_keys_only(app, &current);
            return Err(e.into());
        }
    };
    log_keys_fault(&next);
    warn_if_no_keys_left(&current, &next);
    let changes = next.routes.changes_since(&current.routes);
    // What changed, in words: the routes' changes, settings, keys.
    let mut said = Vec::new();
    if !changes.is_empty() {
        said.push(changes.to_string());
    }
    if !settings.is_empty() {
        said.push(format!("settings changed: {}", settings.join(", ")));
    }
    if *next.keys != *current.keys {
        said.push("keys changed".to_owned());
    }
    if !next.keys_are_current() {
        said.push(if next.serving.keys_fail_closed {
            "every key refused (the keys file is unusable: see the error)".to_owned()
        } else {
            "the last good keys kept (the keys file is unusable: see the error)".to_owned()
        });
    }
    if said.is_empty() {
        said.push("nothing changed".to_owned());
    }
    tracing::info!(
        keys = next.keys.len(),
        "reload applied: {}",
        said.join("; ")
    );
    app.replace(next);
    Ok(())
}

fn reload_keys_only(app: &App, current: &Snapshot) {
    if app.shared.is_some() {
        return;
    }
    let next = current.with_keys_reread();
    log_keys_fault(&next);
    warn_if_no_keys_left(current, &next);
    let changed = !Arc::ptr_eq(&next.keys, &current.keys) && *next.keys != *current.keys;
    if changed || next.keys_are_current() != current.keys_are_current() {
        if changed {
            tracing::info!(keys = next.keys.len(), "keys reloaded");
        }
        app.replace(next);
    }
}

/// A warning when the last key goes: a keys file deleted or emptied by
/// mistake refuses every caller, and an info line would hide it.
fn warn_if_no_keys_left(current: &Snapshot, next: &Snapshot) {
    // An unusable file has its own error line.
    if next.keys.is_empty() && !current.keys.is_empty() && next.keys_are_current() {
        tracing::warn!(
            last_keys = current.keys.len(),
            keys_file = %next.serving.keys_file.display(),
            "no key is valid now (the keys file is empty or gone): every key is refused"
        );
    }
}

/// The error line of a keys file that cannot be used, at every reload
/// until it is fixed.
fn log_keys_fault(snapshot: &Snapshot) {
    if let Some(e) = &snapshot.keys_fault {
        if snapshot.serving.keys_fail_closed {
            tracing::error!(
                "keys file unusable, not ready until it is fixed; every key is refused \
                 (keys_fail_closed): {e}"
            );
            return;
        }
        tracing::error!(
            last_good_keys = snapshot.keys.len(),
            "keys file unusable, not ready until it is fixed; the last good keys still answer: {e}"
        );
    }
}

/// Process settings are what the server started with: any that `new`
/// changes is logged, and waits for a restart.
fn warn_about_restart_only_changes(app: &App, new: &Config, listening: SocketAddr) {
    for setting in app.process.changed_settings(&new.process) {
        let configured = new.process.listener.listen;
        if setting == "[server] listen" {
            // Back to where it listens (say, port 0 then the port it got):
            // nothing to apply.
            if configured != listening {
                tracing::warn!(
                    listening = %listening,
                    configured = %configured,
                    "{setting} changed: restart to apply"
                );
            }
        } else if setting == "[server] admin_listen" {
            let address = |a: Option<SocketAddr>| a.map_or("off".to_owned(), |a| a.to_string());
            tracing::warn!(
                started_with = %address(app.process.listener.admin_listen),
                configured = %address(new.process.listener.admin_listen),
                "{setting} changed: restart to apply"
            );
        } else {
            tracing::warn!("{setting} changed: restart to apply");
        }
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
            let files = crate::sync::lock(&watched);
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

    /// Watches the config file, the keys file, every library and every
    /// platform description `serving` names (their folders, filtered by
    /// name).
    fn follow(&mut self, config_path: &Path, serving: &ServingConfig, watched: &Watched) {
        let descriptions = serving
            .platforms
            .values()
            .filter_map(|p| p.description.as_ref())
            .map(|d| d.path.as_path());
        let files = std::iter::once(config_path)
            .chain(std::iter::once(serving.keys_file.as_path()))
            .chain(serving.providers.values().map(|p| p.library.as_path()))
            .chain(descriptions);
        let mut wanted = HashSet::new();
        for (folder, name) in files.flat_map(names_to_watch) {
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
        // Folders no file is followed in any more (a `..data` swap leaves
        // the old version's behind, soon deleted) are let go.
        let gone: Vec<PathBuf> = self
            .folders
            .iter()
            .filter(|folder| !wanted.iter().any(|(f, _)| f == *folder))
            .cloned()
            .collect();
        for folder in gone {
            // A folder already deleted took its watch with it (and the
            // watcher would log a warning for asking).
            if let (Some(inner), true) = (self.inner.as_mut(), folder.exists()) {
                let _ = inner.unwatch(&folder);
            }
            self.folders.remove(&folder);
        }
        *crate::sync::lock(watched) = wanted;
    }
}

/// Symbolic links followed from one watched file, at most.
const MAX_LINKS: usize = 16;

/// The names whose change may change what `file` reads: its own and,
/// where it is reached through symbolic links, each link's, down to the
/// file at the end. Kubernetes updates a mounted ConfigMap or Secret that
/// way: `platforms.toml` links to `..data/platforms.toml`, and a new
/// version is a new folder that `..data` is renamed to point at, with no
/// event on `platforms.toml` itself.
fn names_to_watch(file: &Path) -> Vec<(PathBuf, std::ffi::OsString)> {
    let is_link = |path: &Path| {
        path.symlink_metadata()
            .is_ok_and(|meta| meta.file_type().is_symlink())
    };
    let mut names = Vec::new();
    let mut path = file.to_path_buf();
    for _ in 0..MAX_LINKS {
        names.extend(split(&path));
        // A link among its folders: `..data` in `..data/platforms.toml`.
        for folder in path.ancestors().skip(1).filter(|f| is_link(f)) {
            names.extend(split(folder));
        }
        let Ok(target) = std::fs::read_link(&path) else {
            break;
        };
        // A relative target is relative to the link's folder (an absolute
        // one replaces it in `join`).
        path = match path.parent() {
            Some(folder) => folder.join(target),
            None => target,
        };
    }
    names
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

/// Follows the shared keys until `shutdown`: every [`POLL_EVERY`], the
/// version and the stamp; when either moved (or a reload swapped in a
/// snapshot with other keys), the set. Failures keep the last set serving.
pub async fn follow_shared_keys(app: Arc<App>, shared: Arc<Shared>, shutdown: CancellationToken) {
    let keys = SharedKeys(&shared);
    let mut seen = None;
    let mut applied = app.snapshot().keys.clone();
    loop {
        tokio::select! {
            () = tokio::time::sleep(POLL_EVERY) => {}
            () = shutdown.cancelled() => return,
        }
        let Ok(now) = keys.seen().await else {
            continue;
        };
        if seen.as_ref() != Some(&now) {
            match keys.store().await {
                Ok(store) => {
                    if store != *applied {
                        if store.is_empty() {
                            // A Redis restarted without persistence looks
                            // like this: every key now answers 401.
                            tracing::warn!(
                                last_keys = applied.len(),
                                "the shared store holds no keys now: every key is refused"
                            );
                        } else {
                            tracing::info!(
                                keys = store.len(),
                                "keys reloaded from the shared store"
                            );
                        }
                    }
                    applied = Arc::new(store);
                    seen = Some(now);
                }
                Err(e) => {
                    tracing::error!("shared keys unreadable, the last set still answers: {e}");
                    continue;
                }
            }
        }
        if !Arc::ptr_eq(&app.snapshot().keys, &applied) {
            swap_in(&app.snapshot, |current| current.with_keys(applied.clone()));
        }
    }
}

/// Replaces what `cell` holds with `next` of it, by compare and swap: a
/// reload that lands while `next` is built is built upon, not undone.
fn swap_in<T>(cell: &arc_swap::ArcSwap<T>, mut next: impl FnMut(&T) -> T) {
    cell.rcu(|current| next(current));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arc_swap::ArcSwap;

    use super::swap_in;

    /// What the swap sees of a snapshot: its config generation and its keys.
    #[derive(Clone, Debug, PartialEq)]
    struct Held {
        config: u32,
        keys: u32,
    }

    #[test]
    fn shared_keys_swap_keeps_a_reload_that_lands_while_it_builds() {
        let cell = ArcSwap::from_pointee(Held { config: 1, keys: 1 });
        let mut reloaded = false;
        swap_in(&cell, |current| {
            if !reloaded {
                // A reload swaps in config 2 between the follower's read and
                // its write.
                reloaded = true;
                cell.store(Arc::new(Held {
                    config: 2,
                    ..current.clone()
                }));
            }
            Held {
                keys: 2,
                ..current.clone()
            }
        });
        assert_eq!(**cell.load(), Held { config: 2, keys: 2 });
    }
}
