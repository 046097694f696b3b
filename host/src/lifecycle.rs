//! The process's life, in one place: how `serve`, `demo` and `check` start,
//! and how a server shuts down.
//!
//! # Start
//!
//! `check` runs the first step only; `serve` and `demo` run them all.
//!
//! 1. [`load`]: a warning for each trusted file others could change (see
//!    [`crate::files`]), plugins loaded and providers set up, chains
//!    assembled, keys read, the TLS certificate and key read. Touches nothing a running server owns (no
//!    ledger, no pruning).
//! 2. Signals (SIGTERM, ctrl-c, SIGHUP) are registered and file watches
//!    set: before anything is announced, since a signal that arrives
//!    before its handler kills the process outright, and a change made
//!    after the announcement must be seen.
//! 3. The ledger is opened (or, with `[state] backend = "redis"`, the
//!    shared store connected and the keys read from it: a start without
//!    them fails), stale plugin copies pruned, the listeners bound, and
//!    `listening on http://ADDR` (`https://` with TLS) printed (then the
//!    admin listener's line).
//!
//! # Shutdown
//!
//! One [`CancellationToken`] is what the public listener, the admin
//! listener, the reloader, the TLS files' follower and (with `redis`) the
//! shared keys' follower wait on. On SIGTERM or ctrl-c, in this order:
//!
//! 1. The server stops being ready (`/readyz` answers 503), for load
//!    balancers still probing over open connections.
//! 2. The token fires: both listeners stop accepting, and their open
//!    connections finish the request in flight, for at most
//!    `shutdown_grace_ms`; the reloader and the two followers stop.
//! 3. Work that callers who hung up left running ends, for at most
//!    `shutdown_grace_ms` more: it holds credits until it ends.
//! 4. The ledger writes what is pending and its writer thread ends (with
//!    `redis`: the settling task, on a token of its own, writes what it
//!    holds): last, once no request can count a credit any more.

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::auth::shared::SharedKeys;
use crate::auth::KeysError;
use crate::billing::Billing;
use crate::cache::shared::SharedCache;
use crate::config::Config;
use crate::cursor::CursorSealer;
use crate::http::{admin, api};
use crate::ledger::{Ledger, LedgerError};
use crate::metrics::MetricsError;
use crate::plugins::Loader;
use crate::reload::{Reloader, Watch};
use crate::resilience::concurrency::ConcurrencyLimit;
use crate::server::tls::{Tls, TlsError};
use crate::server::{self, Listening};
use crate::settings::ConfigError;
use crate::shared::credits::Credits;
use crate::shared::{Shared, StateConfig, StateError};
use crate::state::{App, Snapshot, SnapshotError};
use crate::upstream::{ClientError, UpstreamClient};

/// How often counted credits are written to the ledger: a crash loses at
/// most that much, and one transaction a second costs nothing.
const LEDGER_FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Why a command failed. Each is one line naming its cause.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Keys(#[from] KeysError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("no randomness for the cursor key: {0}")]
    Random(String),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        addr: SocketAddr,
        /// Which listener, and where its address was set.
        what: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Plugin(#[from] crate::scaffold::ScaffoldError),
    /// A command used wrongly (a bad argument): exit code 2.
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// `keys issue` could not print the key it made, and revoked it (or
    /// says why it could not).
    #[error("keys issue: cannot print the new key of `{name}` ({source}); {then}")]
    Unprinted {
        name: String,
        source: std::io::Error,
        /// What became of the key.
        then: String,
    },
}

impl RunError {
    /// The command was used wrongly (exit code 2): a bad argument, or a
    /// plugin or platform name outside its rule.
    pub fn is_usage(&self) -> bool {
        use crate::scaffold::ScaffoldError;
        matches!(
            self,
            RunError::Usage(_)
                | RunError::Plugin(ScaffoldError::BadName(_) | ScaffoldError::BadPlatform(_))
        )
    }
}

/// What a successful [`load`] found, for `check`'s report.
pub struct Loaded {
    pub snapshot: Snapshot,
    pub loader: Loader,
    /// The public listener's TLS, when configured.
    pub tls: Option<Tls>,
}

/// Step 1: everything a start loads from `config`, and nothing a running
/// server owns. Blocking.
pub fn load(config: &Config) -> Result<Loaded, RunError> {
    crate::files::warn_if_loose(
        &config.path,
        &config.serving.keys_file,
        config.serving.libraries(),
    );
    let loader = Loader::new(config.process.state_dir.clone());
    // Shared keys are read by `serve` once connected; `check` needs none.
    let shared_keys = config
        .process
        .state
        .is_redis()
        .then(|| Arc::new(crate::auth::KeyStore::default()));
    let snapshot = Snapshot::build(
        &config.path,
        config.serving.clone(),
        &loader,
        None,
        shared_keys,
    )?;
    let tls = config
        .process
        .listener
        .tls
        .as_ref()
        .map(Tls::load)
        .transpose()?;
    Ok(Loaded {
        snapshot,
        loader,
        tls,
    })
}

/// `socialgate check`: [`load`], then what it found: a line for the whole,
/// one per provider (its plugin), one per live platform with endpoints no
/// provider serves.
pub fn check(config: &Config) -> Result<String, RunError> {
    let Loaded { snapshot, .. } = load(config)?;
    let counted = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let mut report = format!(
        "{}: ok: {}, {}",
        config.path.display(),
        counted(snapshot.routes.platform_count(), "platform"),
        counted(snapshot.routes.provider_count(), "provider")
    );
    // Which plugin, in which version, serves each provider: what an
    // operator checks after building or swapping a library.
    for provider in snapshot.routes.providers_by_name() {
        let plugin = &provider.plugin;
        report.push_str(&format!(
            "\nprovider {}: {plugin} (plugin-api {}), serves {}, from {}",
            provider.name,
            plugin.plugin_api,
            crate::routing::endpoint_list(&plugin.endpoints),
            plugin.library.display()
        ));
    }
    for name in config.serving.unchained_providers() {
        report.push_str(&format!(
            "\nprovider {name}: in no platform's chain (loaded, never asked)"
        ));
    }
    // An endpoint left out by a reorder answers 404: say so, it may not be
    // what was meant.
    let mut platforms: Vec<&str> = snapshot.routes.live_platforms().collect();
    platforms.sort_unstable();
    for platform in platforms {
        let unserved = snapshot.routes.unserved(platform);
        if !unserved.is_empty() {
            report.push_str(&format!(
                "\nplatform {platform}: no provider serves {} (answered 404 ENDPOINT_NOT_FOUND)",
                unserved.join(", ")
            ));
        }
    }
    Ok(report)
}

/// Serves `config` until SIGTERM or ctrl-c, then shuts down in the order
/// the module doc gives. `listen` overrides the configured address;
/// `on_ready` runs once the listeners are announced (the demo prints its
/// welcome there).
pub async fn serve(
    config: Config,
    listen: Option<SocketAddr>,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), RunError> {
    let Loaded {
        mut snapshot,
        loader,
        tls,
    } = load(&config)?;

    let mut signals = Signals::register()?;
    let watch = Watch::start(&config);

    let metrics = crate::metrics::install()?;
    tokio::spawn(crate::metrics::keep_up(metrics.clone()));
    let listener = config.process.listener.clone();
    let shared = match &config.process.state {
        StateConfig::Local => None,
        StateConfig::Redis(redis) => {
            let shared = Arc::new(Shared::connect(redis)?);
            let keys = SharedKeys(&shared).store().await.map_err(KeysError::from)?;
            snapshot.keys = Arc::new(keys);
            Some(shared)
        }
    };
    let config_path = config.path.display().to_string();
    let app = Arc::new(build_app(config, snapshot, loader, shared.clone())?);
    let public_addr = listen.unwrap_or(listener.listen);
    let public_set_in = match listen {
        Some(_) => "the public listener, --listen".to_owned(),
        None => format!("the public listener, [server] listen in {config_path}"),
    };
    let public = bind(public_addr, public_set_in).await?;
    let admin = match listener.admin_listen {
        Some(addr) => Some(
            bind(
                addr,
                format!("the admin listener, [server] admin_listen in {config_path}"),
            )
            .await?,
        ),
        None => None,
    };
    // The public listener's cap: the admin listener's is a safety limit,
    // not traffic to plan files for.
    if let OpenFiles::TooFew { limit, wanted } =
        raise_open_file_limit(listener.hardening.max_connections)
    {
        tracing::warn!(
            open_files = limit,
            wanted,
            "the open-file limit is below max_connections plus a margin for upstream connections and files: accept will fail before the cap is reached; raise the hard limit (ulimit -Hn) or lower max_connections"
        );
    }
    let local = public.local_addr()?;
    announce(&app, local, tls.is_some(), admin.as_ref())?;
    on_ready(local);

    let shutdown = CancellationToken::new();
    let mut listeners = Vec::new();
    let mut stopped_accepting = Vec::new();
    {
        let (stopped, stopped_public) = oneshot::channel();
        stopped_accepting.push(stopped_public);
        let app = app.clone();
        listeners.push(tokio::spawn(server::serve(
            Listening::new(
                "public",
                listener.hardening,
                tls.as_ref().map(Tls::acceptor),
            ),
            public,
            shutdown.clone(),
            Some(stopped),
            move |request| {
                let app = app.clone();
                async move { api::handle(&app, request).await }
            },
        )));
    }
    if let Some(admin) = admin {
        let (stopped, stopped_admin) = oneshot::channel();
        stopped_accepting.push(stopped_admin);
        listeners.push(tokio::spawn(server::serve(
            Listening::new("admin", listener.hardening, None),
            admin,
            shutdown.clone(),
            Some(stopped),
            admin::handler(app.clone(), metrics),
        )));
    }
    if let Some(tls) = tls {
        let shutdown = shutdown.clone();
        listeners.push(tokio::spawn(
            async move { tls.follow_files(shutdown).await },
        ));
    }
    let reloads = signals.forward_hangups(shutdown.clone());
    let reloader =
        tokio::spawn(Reloader::new(app.clone(), local, reloads, watch).run(shutdown.clone()));
    let mut followers = Vec::new();
    if let Some(shared) = shared {
        followers.push(tokio::spawn(crate::reload::follow_shared_keys(
            app.clone(),
            shared,
            shutdown.clone(),
        )));
    }
    // Its own token: it writes last, once no request can settle a credit.
    let settled = CancellationToken::new();
    if let Some(credits) = app.billing.shared_credits() {
        followers.push(tokio::spawn(credits.write(settled.clone())));
    }

    signals.terminate.await;
    // 1.
    app.begin_draining();
    // 2. Said once it is true: whoever reads the line may rely on it.
    shutdown.cancel();
    for stopped in stopped_accepting {
        let _ = stopped.await;
    }
    tracing::info!("shutting down: not ready, no new connections; finishing requests in flight");
    for listener in listeners {
        let _ = listener.await;
    }
    let _ = reloader.await;
    // 3. What hung-up callers left running still holds credits: given back
    // before the last settling, within a second grace period at most.
    crate::resilience::abandon::finished(listener.hardening.shutdown_grace).await;
    // 4. Counted credits must survive the process.
    settled.cancel();
    for follower in followers {
        let _ = follower.await;
    }
    let closing = tokio::task::spawn_blocking(move || app.billing.close()).await;
    match closing {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!("usage not written at shutdown: {e}"),
        Err(e) => tracing::error!("usage not written at shutdown: {e}"),
    }
    Ok(())
}

/// Raises the soft open-file limit to the hard one, as servers commonly do
/// (a default soft limit of 1024 is below the default `max_connections`),
/// and says whether that leaves enough for `connections`: see
/// [`OpenFiles::for_connections`].
fn raise_open_file_limit(connections: usize) -> OpenFiles {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read or write the struct given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return OpenFiles::Enough;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    if limit.rlim_cur == libc::RLIM_INFINITY {
        return OpenFiles::Enough;
    }
    OpenFiles::for_connections(limit.rlim_cur, connections)
}

#[derive(Debug, PartialEq, Eq)]
enum OpenFiles {
    Enough,
    TooFew { limit: u64, wanted: u64 },
}

impl OpenFiles {
    /// Upstream connections, libraries, the ledger, logs.
    const MARGIN: u64 = 1024;

    /// Whether `limit` open files hold `connections` client connections
    /// plus [`Self::MARGIN`]: if not, `accept` fails before the connection
    /// cap is reached.
    fn for_connections(limit: u64, connections: usize) -> OpenFiles {
        let wanted = u64::try_from(connections)
            .unwrap_or(u64::MAX)
            .saturating_add(Self::MARGIN);
        if limit < wanted {
            OpenFiles::TooFew { limit, wanted }
        } else {
            OpenFiles::Enough
        }
    }
}

/// Step 3's process-wide parts, around the loaded snapshot.
fn build_app(
    config: Config,
    snapshot: Snapshot,
    loader: Loader,
    shared: Option<Arc<Shared>>,
) -> Result<App, RunError> {
    let process = config.process;
    let cursors =
        CursorSealer::new(&process.cursor).map_err(|e| RunError::Random(e.to_string()))?;
    let upstream = UpstreamClient::new(process.upstream_proxy.as_ref(), &process.upstream_roots)?;
    let new_ledger = shared.is_none() && !process.ledger.path.exists();
    let billing = match &shared {
        None => Billing::open(Ledger::open(&process.ledger.path, LEDGER_FLUSH_EVERY)?)?,
        Some(shared) => Billing::shared(Arc::new(Credits::new(shared.clone()))),
    };
    let billing = Arc::new(billing);
    // Only a server prunes: `check` must not delete copies a running
    // server still maps.
    loader.prune();
    let shared_cache = shared
        .as_ref()
        .map(|shared| Arc::new(SharedCache::new(shared.clone())));
    let cache = crate::cache::Cache::with_shared(process.cache_max_bytes, shared_cache);
    Ok(App {
        in_flight: ConcurrencyLimit::new(process.max_concurrent_requests),
        in_flight_by_key: Arc::default(),
        cache,
        config_path: config.path,
        process,
        snapshot: ArcSwap::from_pointee(snapshot),
        cursors,
        upstream,
        loader,
        billing,
        shared,
        new_ledger,
        draining: AtomicBool::default(),
    })
}

/// A listener on `addr`; `what` says which, for the error.
async fn bind(addr: SocketAddr, what: String) -> Result<TcpListener, RunError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Bind { addr, what, source })
}

/// Logs what was loaded and prints the addresses on stdout. Only now, so a
/// failed start prints nothing but its one error line.
fn announce(
    app: &App,
    public: SocketAddr,
    tls: bool,
    admin: Option<&TcpListener>,
) -> std::io::Result<()> {
    let snapshot = app.snapshot();
    tracing::info!(
        platforms = snapshot.routes.platform_count(),
        providers = snapshot.routes.provider_count(),
        keys = snapshot.keys.len(),
        "configuration loaded"
    );
    for provider in snapshot.routes.providers_by_name() {
        tracing::info!(
            provider = %provider.name,
            plugin = %provider.plugin.name,
            version = %provider.plugin.version,
            plugin_api = %provider.plugin.plugin_api,
            "provider ready: {}",
            provider.plugin
        );
    }
    for name in snapshot.serving.unchained_providers() {
        tracing::warn!(
            provider = name,
            "in no platform's chain: loaded, never asked"
        );
    }
    if app.process.cursor.key.is_none() {
        tracing::info!(
            "no cursor_key_env: cursors are sealed with a per-process key and end with the process"
        );
    }
    if app.shared.is_none() {
        let path = app.process.ledger.path.display();
        if app.new_ledger && app.process.ledger.written {
            tracing::warn!(
                path = %path,
                "no usage ledger was there: a new, empty one was created (every key's spending starts at 0; if one existed, check [ledger] path)"
            );
        } else if app.new_ledger {
            tracing::info!(path = %path, "usage ledger created");
        } else {
            tracing::info!(path = %path, "usage ledger opened");
        }
    }
    let mut stdout = std::io::stdout().lock();
    let scheme = if tls { "https" } else { "http" };
    writeln!(stdout, "listening on {scheme}://{public}")?;
    if let Some(admin) = admin {
        writeln!(stdout, "admin listening on http://{}", admin.local_addr()?)?;
    }
    stdout.flush()
}

/// The signals a server answers: SIGTERM and ctrl-c shut it down, SIGHUP
/// reloads it.
struct Signals {
    terminate: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    hangup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Registers the handlers now; see the module doc for why before the
    /// server announces itself.
    fn register() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        Ok(Signals {
            terminate: Box::pin(async move {
                tokio::select! {
                    _ = terminate.recv() => {},
                    _ = interrupt.recv() => {},
                }
            }),
            hangup: signal(SignalKind::hangup()).ok(),
        })
    }

    /// Each SIGHUP as a reload request, until `shutdown` fires.
    fn forward_hangups(&mut self, shutdown: CancellationToken) -> mpsc::UnboundedReceiver<()> {
        let (requests, received) = mpsc::unbounded_channel();
        if let Some(mut hangup) = self.hangup.take() {
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        Some(()) = hangup.recv() => {
                            if requests.send(()).is_err() {
                                return;
                            }
                        }
                        () = shutdown.cancelled() => return,
                    }
                }
            });
        }
        received
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_few_open_files_for_the_connections_are_reported() {
        assert_eq!(
            OpenFiles::for_connections(1024, 10_000),
            OpenFiles::TooFew {
                limit: 1024,
                wanted: 11_024
            }
        );
        assert_eq!(
            OpenFiles::for_connections(11_024, 10_000),
            OpenFiles::Enough
        );
        assert_eq!(
            OpenFiles::for_connections(1_048_576, 10_000),
            OpenFiles::Enough
        );
        assert_eq!(
            OpenFiles::for_connections(u64::MAX - 1, usize::MAX),
            OpenFiles::TooFew {
                limit: u64::MAX - 1,
                wanted: u64::MAX
            }
        );
    }
}
