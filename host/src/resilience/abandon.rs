//! Requests whose caller hangs up. The upstream work such a request started
//! (an attempt, or the shared fetch it waits on) goes on to its end, so a
//! breaker still learns how a probe ended and a fetch is still stored; and
//! it goes on holding what the request held (its overload slot, its credit
//! reservation, its provider's in-flight slot), so hanging up never buys
//! upstream work outside the limits. Each abandonment is one log line with
//! the request's ID and one count of `socialgate_requests_abandoned_total`.
//!
//! [`Detached`] costs nothing while the caller stays: the work runs on the
//! request's own task, and becomes a task of its own only when dropped
//! unfinished.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tracing::instrument::Instrumented;
use tracing::Instrument;

/// A future that, dropped before it ends, goes on as a task of its own,
/// in the span (and so with the request ID) it was made in. Whatever it
/// owns is released only when it ends.
pub struct Detached<F: Future<Output: Send> + Send + 'static> {
    inner: Option<Pin<Box<Instrumented<F>>>>,
}

impl<F: Future<Output: Send> + Send + 'static> Detached<F> {
    pub fn new(future: F) -> Self {
        Detached {
            inner: Some(Box::pin(future.instrument(tracing::Span::current()))),
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
        unfinished.span().in_scope(|| {
            tracing::warn!(
                "caller hung up; its upstream work goes on to its end, holding its slot and credits (none charged)"
            )
        });
        crate::metrics::abandoned();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(unfinished);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn dropped_unfinished_it_runs_on_and_keeps_what_it_holds() {
        let held = Arc::new(());
        let (done, finished) = tokio::sync::oneshot::channel();
        let work = {
            let held = held.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                drop(held);
                let _ = done.send(());
            }
        };
        let caller = tokio::spawn(Detached::new(work));
        tokio::time::sleep(Duration::from_millis(10)).await;
        caller.abort();
        let _ = caller.await;
        assert_eq!(Arc::strong_count(&held), 2, "still held after the hang-up");
        finished.await.expect("the work ran to its end");
        assert_eq!(Arc::strong_count(&held), 1, "released when it ended");
    }
}
