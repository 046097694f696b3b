//! The HTTP server under the routes ([`crate::http`]): the listeners, and
//! what every answer is made of, whichever route made it: request IDs
//! ([`request_id`]), the JSON envelopes ([`response`]) and CORS
//! ([`cors`]). Nothing here reads the live state ([`crate::state`]), so
//! [`crate::config`] can compose the listener's and CORS's sections from
//! below it.
//!
//! Accepting connections and serving them with hyper: one helper, with the
//! same hardening and the same drain, for every listener the process opens
//! (the public API, the operators' listener, the demo's sandbox upstreams).
//!
//! Connections are hardened against slow and greedy clients: the whole
//! request head must arrive within `header_timeout_ms` and fit in
//! `max_header_bytes`, or the connection is closed (over HTTP/2, a head too
//! large ends only its own stream); an answer whose writing
//! makes no progress for `write_timeout_ms` (a client that does not read)
//! closes its connection; and a listener holds at most `max_connections`
//! open at once: past it, it stops accepting until one closes, so new
//! connections wait in the kernel's backlog instead of taking descriptors
//! the whole process needs. When the shutdown token
//! fires, the listener stops accepting, every connection is told to finish
//! its current request, and [`serve`] waits up to `shutdown_grace_ms` for
//! them.
//!
//! Every connection speaks HTTP/1.1 or HTTP/2 (told apart by its first
//! bytes: ALPN is not needed, so h2c with prior knowledge works too), over
//! TLS when the listener has it ([`tls`]). An HTTP/1 request head
//! hyper refuses by itself is answered with the JSON envelope
//! ([`refusal`]), and the time limits of HTTP/2 connections are
//! [`h2_limits`]'s.

pub mod cors;
pub mod h2_limits;
pub mod refusal;
pub mod request_id;
pub mod response;
pub mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::{service_fn, Service};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use self::h2_limits::{Activity, WatchedIo};
use self::refusal::Refusals;
use self::response::Body;
use self::tls::TlsFiles;
use crate::settings::{ConfigError, Context, RawServer};

const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);
const DEFAULT_ADMIN_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9464);

/// The listeners and how their connections are treated. Process settings:
/// a listener is never bound anew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    /// `listen`: the public API.
    pub listen: SocketAddr,
    /// `tls_cert` and `tls_key`: the public listener serves HTTPS with
    /// them. Their contents are followed while serving; their paths are
    /// fixed.
    pub tls: Option<TlsFiles>,
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
    /// `max_connections`: connections open at once, per listener; past it
    /// the listener stops accepting until one closes.
    pub max_connections: usize,
    /// `write_timeout_ms`: a connection whose answer makes no progress
    /// (the client does not read) for this long is closed.
    pub write_timeout: Duration,
}

impl Default for Hardening {
    fn default() -> Self {
        Hardening {
            header_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            shutdown_grace: Duration::from_secs(10),
            max_connections: 10_000,
            write_timeout: Duration::from_secs(30),
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
        let tls = match (&raw.tls_cert, &raw.tls_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cx.resolve(cert),
                key: cx.resolve(key),
            }),
            _ => {
                return Err(cx.invalid(
                    "[server] tls_cert",
                    "tls_cert and tls_key go together: set both or neither",
                ))
            }
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
            tls,
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
                max_connections: cx.positive(
                    "[server] max_connections",
                    raw.max_connections,
                    defaults.max_connections,
                )?,
                write_timeout: cx.millis(
                    "[server] write_timeout_ms",
                    raw.write_timeout_ms,
                    defaults.write_timeout,
                )?,
            },
        })
    }

    /// The settings (as written) whose values differ in `new`. No `..` in
    /// the patterns: a new field must be compared here to compile.
    pub fn changed_settings(&self, new: &ListenerConfig) -> Vec<&'static str> {
        let ListenerConfig {
            listen,
            tls,
            admin_listen,
            hardening:
                Hardening {
                    header_timeout,
                    max_header_bytes,
                    shutdown_grace,
                    max_connections,
                    write_timeout,
                },
        } = self;
        [
            ("[server] listen", *listen != new.listen),
            ("[server] admin_listen", *admin_listen != new.admin_listen),
            (
                "[server] tls_cert",
                tls.as_ref().map(|t| &t.cert) != new.tls.as_ref().map(|t| &t.cert),
            ),
            (
                "[server] tls_key",
                tls.as_ref().map(|t| &t.key) != new.tls.as_ref().map(|t| &t.key),
            ),
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
            (
                "[server] max_connections",
                *max_connections != new.hardening.max_connections,
            ),
            (
                "[server] write_timeout_ms",
                *write_timeout != new.hardening.write_timeout,
            ),
        ]
        .into_iter()
        .filter(|(_, changed)| *changed)
        .map(|(key, _)| key)
        .collect()
    }
}

/// How often, at most, a listener at its connection cap says so.
const FULL_WARNING_EVERY: Duration = Duration::from_secs(60);

/// HTTP/2's own header limit, as a multiple of `max_header_bytes`. The
/// service measures every head as HTTP/1 does and refuses one over
/// `max_header_bytes` with the JSON envelope and a request ID; h2 counts
/// 32 bytes more per field (RFC 9113, 6.5.2), and answers what passes its
/// own limit itself: a bare 431 with no body or request ID (past four times
/// its limit, it closes the connection). With this margin a head the
/// service refuses reaches the service, and one it serves is not refused
/// by h2's count unless it is mostly tiny fields (under 24 bytes each).
const H2_HEADER_LIST_MARGIN: usize = 2;

/// Header fields an HTTP/1 head may have, however small; more is `431`.
/// hyper's default, set here so the documented limit cannot move with it.
const MAX_HEADER_FIELDS: usize = 100;

/// What a client sends first on an HTTP/2 connection (RFC 9113, 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A listener's settings, and its cap on open connections.
pub struct Listening {
    /// Which listener, in logs.
    name: &'static str,
    hardening: Hardening,
    /// With it, every connection is TLS first.
    tls: Option<TlsAcceptor>,
    /// `max_connections` slots, one per open connection.
    slots: Arc<Semaphore>,
}

impl Listening {
    pub fn new(name: &'static str, hardening: Hardening, tls: Option<TlsAcceptor>) -> Listening {
        Listening {
            name,
            hardening,
            tls,
            slots: Arc::new(Semaphore::new(hardening.max_connections)),
        }
    }
}

/// Serves `listener` with `handler` on this runtime until `shutdown`
/// fires, then drains: no new connections (this handle of the socket is
/// closed, and `stopped_accepting`, if any, told so), each open one
/// finishes its request in flight, for at most the grace period. HTTP/1.1
/// and HTTP/2 (by ALPN or prior knowledge) are served on every connection.
pub async fn serve<H, F>(
    listening: Listening,
    listener: TcpListener,
    shutdown: CancellationToken,
    stopped_accepting: Option<oneshot::Sender<()>>,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let connections = Connections::new(listening, shutdown, handler);
    connections.accept(listener).await;
    if let Some(stopped_accepting) = stopped_accepting {
        let _ = stopped_accepting.send(());
    }
    connections.drain().await;
}

/// Serves accepted connections on the runtime it is used on, each to its
/// end, and drains them at shutdown.
struct Connections<H> {
    listening: Listening,
    builders: Arc<(http1::Builder, http2::Builder<TokioExecutor>)>,
    graceful: GracefulShutdown,
    shutdown: CancellationToken,
    handler: H,
}

impl<H, F> Connections<H>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    /// Connections of `listening` served with `handler`; `shutdown` tells
    /// each to finish its request in flight.
    fn new(listening: Listening, shutdown: CancellationToken, handler: H) -> Connections<H> {
        let hardening = listening.hardening;
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(hardening.header_timeout)
            .max_buf_size(hardening.max_header_bytes)
            .max_headers(MAX_HEADER_FIELDS);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2.timer(TokioTimer::new()).max_header_list_size(
            u32::try_from(
                hardening
                    .max_header_bytes
                    .saturating_mul(H2_HEADER_LIST_MARGIN),
            )
            .unwrap_or(u32::MAX),
        );
        Connections {
            listening,
            builders: Arc::new((http1, http2)),
            graceful: GracefulShutdown::new(),
            shutdown,
            handler,
        }
    }

    /// Accepts connections on `listener` until `shutdown` fires, each within
    /// the listener's cap (at the cap it stops accepting until one closes:
    /// new connections wait in the kernel's backlog), and hands each to
    /// [`Connections::serve`]; then closes this handle of the socket.
    async fn accept(&self, listener: TcpListener) {
        let (name, hardening, slots) = (
            self.listening.name,
            self.listening.hardening,
            &self.listening.slots,
        );
        let shutdown = &self.shutdown;
        let mut warned_full: Option<Instant> = None;
        loop {
            // A slot first: at the cap, stop accepting (new connections wait in
            // the backlog) rather than accept and hold what cannot be served.
            let slot = match slots.clone().try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    if warned_full.is_none_or(|at| at.elapsed() >= FULL_WARNING_EVERY) {
                        warned_full = Some(Instant::now());
                        tracing::warn!(
                            listener = name,
                            max_connections = hardening.max_connections,
                            "connection limit reached; new connections wait until one closes"
                        );
                    }
                    tokio::select! {
                        slot = slots.clone().acquire_owned() => match slot {
                            Ok(slot) => slot,
                            // Never closed: this listener owns the semaphore.
                            Err(_) => break,
                        },
                        () = shutdown.cancelled() => break,
                    }
                }
            };
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
            // An answer is written whole, at once: Nagle's algorithm could only
            // hold its last segment back for the client's delayed ACK.
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(listener = name, %peer, "cannot set TCP_NODELAY: {e}");
            }
            self.serve(stream, peer, slot);
        }
    }

    /// Serves `stream`, from `peer`, as a task of this runtime; `slot` is
    /// its place under the listener's cap, held while it is open.
    fn serve(&self, stream: TcpStream, peer: SocketAddr, slot: OwnedSemaphorePermit) {
        let (name, hardening) = (self.listening.name, self.listening.hardening);
        // The TLS handshake and the first bytes are part of the head's
        // time, so a silent client cannot hold its slot either.
        let deadline = Instant::now() + hardening.header_timeout;
        let handler = self.handler.clone();
        // Boxed: hyper keeps room for one request's future beside every
        // connection for the connection's whole life, and the API's is a
        // few KiB, so unboxed it would be held by each idle keep-alive
        // connection rather than only by requests in flight. Boxed as it is
        // made, and wrapped boxed: each move of it copies those KiB.
        let service = service_fn(move |request| {
            let response = Box::pin(handler(request));
            async move { Ok::<_, Infallible>(response.await) }
        });
        let stream = WriteTimeout::new(stream, hardening.write_timeout);
        let opening = Opening {
            builders: self.builders.clone(),
            watcher: self.graceful.watcher(),
            deadline,
            shutdown: self.shutdown.clone(),
            hardening,
        };
        let tls = self.listening.tls.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let served = match tls {
                None => opening.serve(stream, service).await,
                // Boxed, as the connections are in `serve`: a TLS session
                // is large, and a plain connection need not hold its room.
                Some(acceptor) => {
                    Box::pin(async move {
                        let handshake = acceptor.accept(stream);
                        match tokio::time::timeout_at(opening.deadline, handshake).await {
                            Ok(Ok(stream)) => opening.serve(stream, service).await,
                            Ok(Err(e)) => Err(Box::new(e) as BoxError),
                            Err(_) => Ok(()),
                        }
                    })
                    .await
                }
            };
            if let Err(e) = served {
                tracing::debug!(listener = name, %peer, "connection ended: {e}");
            }
        });
    }

    /// Waits, for at most the grace period, until every connection served
    /// here finished the request it had in flight when `shutdown` fired.
    async fn drain(self) {
        let (name, hardening) = (self.listening.name, self.listening.hardening);
        let open = self.graceful.count();
        if open > 0 {
            tracing::info!(
                listener = name,
                connections = open,
                "no new connections; finishing requests in flight"
            );
        }
        if tokio::time::timeout(hardening.shutdown_grace, self.graceful.shutdown())
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
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connection accepted and not yet handed to hyper.
struct Opening {
    builders: Arc<(http1::Builder, http2::Builder<TokioExecutor>)>,
    watcher: Watcher,
    /// When the first bytes must have arrived.
    deadline: Instant,
    shutdown: CancellationToken,
    /// What bounds an HTTP/2 connection ([`h2_limits`]).
    hardening: Hardening,
}

impl Opening {
    /// Reads enough to tell HTTP/2 from HTTP/1, then serves the connection
    /// with the right protocol (HTTP/1 with hyper's bare refusals made into
    /// envelopes) until it closes or the listener drains.
    async fn serve<I, S>(self, mut io: I, service: S) -> Result<(), BoxError>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: Service<Request<Incoming>, Response = Response<Body>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        let mut first = Vec::with_capacity(H2_PREFACE.len());
        let sniffed = tokio::select! {
            read = tokio::time::timeout_at(self.deadline, sniff(&mut io, &mut first)) => read,
            () = self.shutdown.cancelled() => return Ok(()),
        };
        match sniffed {
            Ok(Ok(())) if !first.is_empty() => {}
            // Silent past the deadline, or gone before a byte.
            Ok(Ok(())) | Err(_) => return Ok(()),
            Ok(Err(e)) => return Err(Box::new(e)),
        }
        let (http1, http2) = &*self.builders;
        let io = Prefixed { first, at: 0, io };
        // Each protocol's connection is boxed, so a connection holds only
        // the one it speaks, not room for the larger of the two.
        if io.first == H2_PREFACE {
            let activity = Activity::new();
            let io = WatchedIo::new(io, activity.clone());
            let service = h2_limits::Watched::new(service, activity.clone());
            let connection = http2.serve_connection(TokioIo::new(io), service);
            let (idle, stall) = (self.hardening.header_timeout, self.hardening.write_timeout);
            tokio::select! {
                // The connection first: an answer it is about to write
                // is activity the limit must see.
                biased;
                served = Box::pin(self.watcher.watch(connection)) => served.map_err(Into::into),
                // Dropping the connection closes it, and drops what it holds.
                limit = activity.limit(idle, stall) => {
                    tracing::debug!(?limit, "HTTP/2 connection closed");
                    Ok(())
                }
            }
        } else {
            let connection = http1.serve_connection(TokioIo::new(Refusals::new(io)), service);
            Box::pin(self.watcher.watch(connection))
                .await
                .map_err(Into::into)
        }
    }
}

/// Reads into `first` while what came is the start of the HTTP/2 preface,
/// and no further: a byte that differs means HTTP/1.
async fn sniff<I: AsyncRead + Unpin>(io: &mut I, first: &mut Vec<u8>) -> io::Result<()> {
    let mut buf = [0u8; 24];
    while first.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(first) {
        let want = H2_PREFACE.len() - first.len();
        let n = io.read(&mut buf[..want]).await?;
        if n == 0 {
            return Ok(());
        }
        first.extend_from_slice(&buf[..n]);
    }
    Ok(())
}

/// A connection's IO with the bytes read to tell its protocol put back in
/// front.
struct Prefixed<T> {
    first: Vec<u8>,
    at: usize,
    io: T,
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.first.len() {
            let n = (self.first.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.first[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A connection's IO whose writes fail with `TimedOut` once they have made
/// no progress for `limit`: a client that stops reading cannot hold its
/// connection (and the answer's buffers) forever. The timer is made on the
/// first write that has to wait and re-armed only then, so a client that
/// reads costs nothing.
struct WriteTimeout<T> {
    io: T,
    limit: Duration,
    /// Fires when the write waiting since it was armed has waited too long.
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl<T> WriteTimeout<T> {
    fn new(io: T, limit: Duration) -> WriteTimeout<T> {
        WriteTimeout {
            io,
            limit,
            timer: None,
            armed: false,
        }
    }

    /// Passes a write's progress through, timing how long it waits.
    fn timed<R>(
        &mut self,
        cx: &mut TaskContext<'_>,
        poll: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if poll.is_ready() {
            self.armed = false;
            return poll;
        }
        let deadline = Instant::now() + self.limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.armed {
            timer.as_mut().reset(deadline);
            self.armed = true;
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {} ms", self.limit.as_millis()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.timed(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.timed(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.timed(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_shutdown(cx);
        self.timed(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_write_that_waits_past_the_limit_fails_and_progress_resets_it() {
        // A pipe with room for 4 bytes that nobody reads.
        let (client, mut server) = tokio::io::duplex(4);
        let mut io = WriteTimeout::new(client, Duration::from_millis(500));
        io.write_all(b"abcd").await.unwrap();
        let started = Instant::now();
        let stalled = io.write_all(b"e").await.unwrap_err();
        assert_eq!(stalled.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_millis(500));

        // A reader that takes a byte every 300 ms keeps it going.
        let mut io = WriteTimeout::new(io.io, Duration::from_millis(500));
        let reader = tokio::spawn(async move {
            let mut byte = [0u8; 1];
            for _ in 0..8 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                tokio::io::AsyncReadExt::read_exact(&mut server, &mut byte)
                    .await
                    .unwrap();
            }
        });
        io.write_all(b"fghi").await.unwrap();
        reader.await.unwrap();
    }
}
