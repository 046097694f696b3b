//! Accepting connections and handing each request to [`api::handle`].
//!
//! Connections are hardened against slow and greedy clients: the whole
//! request head must arrive within `header_timeout_ms` and fit in
//! `max_header_bytes`, or the connection is closed. On shutdown the
//! listener stops accepting, every connection is told to finish its current
//! request, and the server waits up to `shutdown_grace_ms` for them.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use super::api;
use crate::state::App;

/// Serves `listener` until `shutdown` resolves, then drains.
pub async fn run(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) {
    let limits = app.limits;
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors and the like: pause rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service_app = app.clone();
        let service = service_fn(move |request| {
            let app = service_app.clone();
            async move { Ok::<_, Infallible>(api::handle(&app, request).await) }
        });
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, "connection ended: {e}");
            }
        });
    }
    // Not ready from now on (for load balancers still probing over open
    // connections), then no new connections.
    app.begin_draining();
    drop(listener);
    tracing::info!(
        connections = graceful.count(),
        "shutting down: no new connections; finishing requests in flight"
    );
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_ms = limits.shutdown_grace.as_millis() as u64,
            "requests still in flight after the grace period; closing them"
        );
    }
    // Counted credits must survive the process.
    if let Err(e) = app.ledger.flush() {
        tracing::error!("usage not written at shutdown: {e}");
    }
}

/// Registers for ctrl-c and SIGTERM now, and resolves on either.
///
/// Registration must happen before the server announces itself: a signal
/// that arrives before a handler exists kills the process outright, with
/// no drain.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = terminate.recv() => {},
                _ = interrupt.recv() => {},
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}
