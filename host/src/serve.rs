//! Starting and running the server: everything between a validated
//! [`Config`] and a process serving it until a shutdown signal. Used by
//! `socialgate serve` and `socialgate demo`.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::http::{admin, server};
use crate::metrics::MetricsError;
use crate::state::{App, StartError};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Loads plugins and keys, binds, announces the address, serves until a
/// shutdown signal.
pub async fn serve(config: Config, listen: Option<SocketAddr>) -> Result<(), ServeError> {
    // Signals and file watches exist before the server announces itself:
    // anything that happens after the `listening on` line is seen.
    let shutdown = server::shutdown_signal()?;
    let hangup = crate::reload::hangup_signal();
    let watch = crate::reload::Watch::start(&config);
    let (listener, app) = start(config, listen).await?;
    let reloader = crate::reload::Reloader::new(app.clone(), listener.local_addr()?, hangup, watch);
    let watching = tokio::spawn(reloader.run());
    server::run(listener, app, shutdown).await;
    watching.abort();
    Ok(())
}

/// Everything up to a bound listener, whose address is printed on stdout
/// (`listening on http://ADDR`), and the admin listener, serving already
/// (`admin listening on http://ADDR`).
pub async fn start(
    config: Config,
    listen: Option<SocketAddr>,
) -> Result<(TcpListener, Arc<App>), ServeError> {
    let addr = listen.unwrap_or(config.server.listen);
    let admin_addr = config.server.admin_listen;
    let metrics = crate::metrics::install()?;
    let app = Arc::new(App::start(config)?);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let local = listener.local_addr()?;
    let admin = match admin_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Bind { addr, source })?,
        ),
        None => None,
    };
    // Only now, so a failed start prints nothing but its one error line.
    let snapshot = app.snapshot();
    tracing::info!(
        platforms = snapshot.routes.platform_count(),
        providers = snapshot.routes.provider_count(),
        keys = snapshot.keys.len(),
        "configuration loaded"
    );
    if snapshot.config.server.cursor_key.is_none() {
        tracing::info!(
            "no cursor_key_env: cursors are sealed with a per-process key and end with the process"
        );
    }
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{local}")?;
    if let Some(admin) = admin {
        writeln!(stdout, "admin listening on http://{}", admin.local_addr()?)?;
        tokio::spawn(admin::run(admin, app.clone(), metrics));
    }
    stdout.flush()?;
    Ok((listener, app))
}
