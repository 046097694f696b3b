//! Requests whose caller hangs up. The upstream work such a request started
//! (an attempt, or the shared fetch it waits on) goes on to its end, so a
//! breaker still learns how a probe ended and a fetch is still stored; and
//! it goes on holding what the request held (its overload slot, its credit
//! reservation, its provider's in-flight slot), so hanging up never buys
//! upstream work outside the limits. Each abandonment counts in
//! `socialgate_requests_abandoned_total` and is logged with the request's
//! ID, one line a second at most.
//!
//! [`Detached`] costs nothing while the caller stays: the work runs on the
//! request's own task, and becomes a task of its own only when dropped
//! unfinished. Shutdown waits for such tasks ([`finished`], up to a bound)
//! before the last settling of credits, so what those that end in time
//! hold is given back, not left held in shared state until it expires.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tracing::Instrument;

use crate::sync::Outstanding;

/// A future that, dropped before it ends, goes on as a task of its own,
/// in the span (and so with the request ID) it was made in. Whatever it
/// owns is released only when it ends.
pub struct Detached<F: Future<Output: Send> + Send + 'static> {
    /// Boxed, so that it can move to a task of its own after being polled.
    inner: Option<Pin<Box<F>>>,
}

impl<F: Future<Output: Send> + Send + 'static> Detached<F> {
    /// Made and polled in the request's span, and dropped in it too (an
    /// instrumented future enters its span to drop what it holds): the
    /// task it goes on as takes the span current at the drop.
    pub fn new(future: F) -> Self {
        Detached {
            inner: Some(Box::pin(future)),
        }
    }
}

impl<F: Future<Output: Send> + Send + 'static> Future for Detached<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Pending;
        };
        let output = std::task::ready!(inner.as_mut().poll(cx));
        self.inner = None;
        Poll::Ready(output)
    }
}

impl<F: Future<Output: Send> + Send + 'static> Drop for Detached<F> {
    fn drop(&mut self) {
        let Some(unfinished) = self.inner.take() else {
            return;
        };
        let span = tracing::Span::current();
        // Counted before it is logged: whoever reads the line then finds
        // it counted.
        crate::metrics::abandoned();
        log_abandoned(&span);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let running = Running::start();
            runtime.spawn(
                async move {
                    let _running = running;
                    unfinished.await
                }
                .instrument(span),
            );
        }
    }
}

/// Abandoned work still running, in the process.
static RUNNING: Outstanding = Outstanding::new();

/// One abandoned task counted in [`RUNNING`] until it ends (or panics).
struct Running;

impl Running {
    fn start() -> Running {
        RUNNING.add(1);
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.done(1);
    }
}

/// Waits until no abandoned work runs, for at most `within`.
pub async fn finished(within: Duration) {
    RUNNING.none_within(within).await;
}

/// One line a second at most: a client that hangs up in a loop must not
/// flood the log. Each line says how many went unlogged before it; the
/// metric counts every one.
fn log_abandoned(span: &tracing::Span) {
    static NEXT_LINE_AT: AtomicU64 = AtomicU64::new(0);
    static UNLOGGED: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let next = NEXT_LINE_AT.load(Ordering::Relaxed);
    let mine = now >= next
        && NEXT_LINE_AT
            .compare_exchange(next, now + 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
    if !mine {
        UNLOGGED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let unlogged_before = UNLOGGED.swap(0, Ordering::Relaxed);
    span.in_scope(|| {
        tracing::warn!(
            unlogged_before,
            "caller hung up; its upstream work goes on to its end, holding its slot and credits (none charged)"
        )
    });
}
