//! The time limits of an HTTP/2 connection, which hyper does not set.
//!
//! An HTTP/1 connection is bounded by hyper's header timeout (a head must
//! arrive whole in time, the wait of an idle keep-alive connection
//! included) and by the server's write timeout (a write that waits too
//! long). An HTTP/2 connection has neither: hyper's header timeout is
//! HTTP/1's, and a client that grants no flow-control window never makes a
//! write wait: its answers stay in memory, built and never sent. So each
//! HTTP/2 connection is watched ([`Activity::limit`]) and closed when it is
//!
//! - *idle*: no request being worked on, no answer waiting to be taken,
//!   and not a byte read or written for `header_timeout` (a client that
//!   sent the preface, or half a head, and then nothing);
//! - *stalled*: an answer built and not taken by the connection, whole,
//!   within `write_timeout` (its client opens no window for it, or it
//!   queues that long behind others), as an HTTP/1 answer whose write
//!   makes no progress that long.
//!
//! An answer the connection has taken is sent as the client's window
//! allows; a slow client that keeps reading is neither idle nor stalled.
//! A client that keeps sending frames (pings) keeps its connection, as an
//! HTTP/1 client that keeps sending requests does: `max_connections`
//! bounds those.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::service::Service;
use hyper::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::response::Body;
use crate::sync::lock;

/// Why a connection was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Idle,
    Stalled,
}

/// What one HTTP/2 connection is doing, as its limits need to know.
pub struct Activity {
    born: Instant,
    /// When a byte last moved either way, in milliseconds since `born`.
    last_io: AtomicU64,
    /// Requests whose answer is not built yet.
    working: AtomicUsize,
    /// Answers built and not yet taken whole, by when they were built.
    waiting: Mutex<Waiting>,
    /// Wakes [`Activity::limit`] when an answer starts waiting: its limit
    /// may be due before the one being slept on.
    answer_built: Notify,
}

/// Answers by number; numbers and build times both grow, so the first
/// is the oldest.
#[derive(Default)]
struct Waiting {
    next: u64,
    built: BTreeMap<u64, Instant>,
}

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            born: Instant::now(),
            last_io: AtomicU64::new(0),
            working: AtomicUsize::new(0),
            waiting: Mutex::default(),
            answer_built: Notify::new(),
        })
    }

    fn touch(&self) {
        let millis = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_io.store(millis, Ordering::Relaxed);
    }

    fn last_io(&self) -> Instant {
        self.born + Duration::from_millis(self.last_io.load(Ordering::Relaxed))
    }

    /// Resolves when the connection passes a limit (see the module doc).
    /// Each round sleeps until a limit could be due, then looks again.
    pub async fn limit(&self, idle: Duration, stall: Duration) -> Limit {
        loop {
            let now = Instant::now();
            let oldest = lock(&self.waiting)
                .built
                .first_key_value()
                .map(|(_, at)| *at);
            let due = match oldest {
                Some(built) if now >= built + stall => return Limit::Stalled,
                Some(built) => built + stall,
                // A request's work is bounded by its own deadline.
                None if self.working.load(Ordering::Relaxed) > 0 => now + idle,
                None if now >= self.last_io() + idle => return Limit::Idle,
                None => self.last_io() + idle,
            };
            tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                () = self.answer_built.notified() => {}
            }
        }
    }

    fn wait_for_taking(self: &Arc<Self>) -> Taken {
        let mut waiting = lock(&self.waiting);
        let id = waiting.next;
        waiting.next += 1;
        waiting.built.insert(id, Instant::now());
        self.answer_built.notify_one();
        Taken {
            activity: self.clone(),
            id,
        }
    }
}

/// Held by an answer until the connection has taken it whole.
struct Taken {
    activity: Arc<Activity>,
    id: u64,
}

impl Drop for Taken {
    fn drop(&mut self) {
        lock(&self.activity.waiting).built.remove(&self.id);
        // Handed over: its bytes go out from now, and the time until they
        // start to must not count as idle.
        self.activity.touch();
    }
}

/// Held by a request while its answer is built.
struct Working(Arc<Activity>);

impl Working {
    fn new(activity: &Arc<Activity>) -> Working {
        activity.working.fetch_add(1, Ordering::Relaxed);
        Working(activity.clone())
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        self.0.working.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// An answer's body, telling the connection's [`Activity`] when it is
/// taken (dropped: hyper drops a body once it has handed its last frame
/// to the connection, or the stream is gone).
pub struct WatchedBody {
    body: Body,
    _taken: Taken,
}

impl HttpBody for WatchedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A service whose requests and answers are counted in an [`Activity`].
#[derive(Clone)]
pub struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, activity: Arc<Activity>) -> Watched<S> {
        Watched { inner, activity }
    }
}

impl<S> Service<Request<Incoming>> for Watched<S>
where
    S: Service<Request<Incoming>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<WatchedBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let working = Working::new(&self.activity);
        let activity = self.activity.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            drop(working);
            let taken = activity.wait_for_taking();
            Ok(response.map(|body| WatchedBody {
                body,
                _taken: taken,
            }))
        })
    }
}

/// A connection's IO, noting in its [`Activity`] when bytes move.
pub struct WatchedIo<I> {
    io: I,
    activity: Arc<Activity>,
}

impl<I> WatchedIo<I> {
    pub fn new(io: I, activity: Arc<Activity>) -> WatchedIo<I> {
        WatchedIo { io, activity }
    }

    fn moved<T>(&self, poll: Poll<io::Result<T>>, bytes: bool) -> Poll<io::Result<T>> {
        if bytes {
            self.activity.touch();
        }
        poll
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WatchedIo<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.io).poll_read(cx, buf);
        let read = matches!(poll, Poll::Ready(Ok(()))) && buf.filled().len() > before;
        self.moved(poll, read)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WatchedIo<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, data);
        let wrote = matches!(poll, Poll::Ready(Ok(n)) if n > 0);
        self.moved(poll, wrote)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
