//! Accepting connections and serving them with hyper: one helper, with the
//! same hardening and the same drain, for every listener the process opens
//! (the public API, the operators' listener, the demo's sandbox upstreams).
//!
//! Connections are hardened against slow and greedy clients: the whole
//! request head must arrive within `header_timeout_ms` and fit in
//! `max_header_bytes`, or the connection is closed. When the shutdown token
//! fires, the listener stops accepting, every connection is told to finish
//! its current request, and [`serve`] waits up to `shutdown_grace_ms` for
//! them.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::response::Body;
use crate::config::{ConfigError, Context, RawServer};

const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);
const DEFAULT_ADMIN_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9464);

/// The listeners and how their connections are treated. Process settings:
/// a listener is never bound anew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerConfig {
    /// `listen`: the public API.
    pub listen: SocketAddr,
    /// `admin_listen`: the operators' listener; `None` when `"off"`.
    pub admin_listen: Option<SocketAddr>,
    pub hardening: Hardening,
}

/// What every listener does to protect itself and to end cleanly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hardening {
    /// `header_timeout_ms`: a client must send its whole request head
    /// within this.
    pub header_timeout: Duration,
    /// `max_header_bytes`: larger request heads are refused.
    pub max_header_bytes: usize,
    /// `shutdown_grace_ms`: how long requests in flight may finish after
    /// the shutdown token fires.
    pub shutdown_grace: Duration,
}

impl Default for Hardening {
    fn default() -> Self {
        Hardening {
            header_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// hyper's read buffer cannot be smaller.
const MIN_HEADER_BYTES: usize = 8192;

impl ListenerConfig {
    /// The listener keys of `[server]`.
    pub fn from_raw(raw: &RawServer, cx: &Context) -> Result<ListenerConfig, ConfigError> {
        let listen = match raw.listen.as_deref() {
            None => DEFAULT_LISTEN,
            Some(addr) => addr.parse().map_err(|_| {
                cx.invalid(
                    "[server] listen",
                    format!("`{addr}` is not an IP:port address"),
                )
            })?,
        };
        let admin_listen = match raw.admin_listen.as_deref() {
            None => Some(DEFAULT_ADMIN_LISTEN),
            Some("off") => None,
            Some(addr) => Some(addr.parse().map_err(|_| {
                cx.invalid(
                    "[server] admin_listen",
                    format!("`{addr}` is not an IP:port address or \"off\""),
                )
            })?),
        };
        let defaults = Hardening::default();
        let max_header_bytes = match raw.max_header_bytes {
            None => defaults.max_header_bytes,
            Some(n) if n < MIN_HEADER_BYTES => {
                return Err(cx.invalid(
                    "[server] max_header_bytes",
                    format!("must be at least {MIN_HEADER_BYTES}"),
                ))
            }
            Some(n) => n,
        };
        Ok(ListenerConfig {
            listen,
            admin_listen,
            hardening: Hardening {
                header_timeout: cx.millis(
                    "[server] header_timeout_ms",
                    raw.header_timeout_ms,
                    defaults.header_timeout,
                )?,
                max_header_bytes,
                shutdown_grace: cx.millis(
                    "[server] shutdown_grace_ms",
                    raw.shutdown_grace_ms,
                    defaults.shutdown_grace,
                )?,
            },
        })
    }

    /// The settings (as written) whose values differ in `new`. No `..` in
    /// the patterns: a new field must be compared here to compile.
    pub fn changed_settings(&self, new: &ListenerConfig) -> Vec<&'static str> {
        let ListenerConfig {
            listen,
            admin_listen,
            hardening:
                Hardening {
                    header_timeout,
                    max_header_bytes,
                    shutdown_grace,
                },
        } = self;
        [
            ("[server] listen", *listen != new.listen),
            ("[server] admin_listen", *admin_listen != new.admin_listen),
            (
                "[server] header_timeout_ms",
                *header_timeout != new.hardening.header_timeout,
            ),
            (
                "[server] max_header_bytes",
                *max_header_bytes != new.hardening.max_header_bytes,
            ),
            (
                "[server] shutdown_grace_ms",
                *shutdown_grace != new.hardening.shutdown_grace,
            ),
        ]
        .into_iter()
        .filter(|(_, changed)| *changed)
        .map(|(key, _)| key)
        .collect()
    }
}

/// Serves `listener` with `handler` until `shutdown` fires, then drains:
/// no new connections, each open one finishes its request in flight, for
/// at most the grace period. `name` says which listener, in logs.
pub async fn serve<H, F>(
    name: &'static str,
    listener: TcpListener,
    hardening: Hardening,
    shutdown: CancellationToken,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(hardening.header_timeout)
        .max_buf_size(hardening.max_header_bytes);
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors and the like: pause rather than spin.
                    tracing::warn!(listener = name, "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let handler = handler.clone();
        let service = service_fn(move |request| {
            let response = handler(request);
            async move { Ok::<_, Infallible>(response.await) }
        });
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(listener = name, %peer, "connection ended: {e}");
            }
        });
    }
    drop(listener);
    let open = graceful.count();
    if open > 0 {
        tracing::info!(
            listener = name,
            connections = open,
            "no new connections; finishing requests in flight"
        );
    }
    if tokio::time::timeout(hardening.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            listener = name,
            grace_ms = hardening.shutdown_grace.as_millis() as u64,
            "requests still in flight after the grace period; closing them"
        );
    }
}
