//! The process's runtimes: the control runtime, and the single-threaded
//! runtimes of the threads that serve the public API.
//!
//! The control runtime runs what the process does for itself: the admin
//! listener, reloads, signals, shutdown, and the connections it keeps to
//! others that every request shares (the shared store's, a proxy's). The
//! public API is served by threads of their own ([`crate::http::serving`]),
//! each with a runtime that runs only its own connections. Work that
//! outlives one request and that every thread relies on must not live on
//! one of those: a plugin call stuck on that thread would stop it. So such
//! work is started with the control runtime entered ([`on`]), wherever it
//! is asked for: what it spawns, its timers and its sockets belong to the
//! control runtime, whichever thread polls the future itself.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::runtime::{Builder, Handle, Runtime};

/// The cores this process may run on: as many plugin calls may hold an
/// inline slot on the serving threads at once
/// ([`crate::resilience::runaway`]), and there is one serving thread more.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Serving threads, when `SOCIALGATE_SERVING_THREADS` does not say: one per
/// core and one more, so that calls stuck in plugins (one per core at
/// most; see [`crate::resilience::runaway`]) always leave one to accept.
/// Threads beyond one per core stand by while the others are free
/// ([`crate::http::serving`]), whatever the count.
pub fn serving_threads() -> usize {
    let cores = cores();
    // For measuring (bench/run.sh): a count set by hand wins.
    std::env::var("SOCIALGATE_SERVING_THREADS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(cores + 1)
}

/// The control runtime: two workers (one may be busy starting a reload's
/// plugins while the other keeps the shared store's connection going).
pub fn control() -> std::io::Result<Runtime> {
    Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("control")
        .enable_all()
        .build()
}

/// A serving thread's runtime: this thread alone runs its tasks.
pub fn serving() -> std::io::Result<Runtime> {
    let runtime = Builder::new_current_thread().enable_all().build()?;
    runtime.spawn(keep_next_wake_near());
    Ok(runtime)
}

/// How far ahead a serving runtime's next timer wake-up is kept: less
/// than an attempt's timeout (4 s by default), so arming one is cheap.
const NEXT_WAKE_WITHIN: Duration = Duration::from_secs(1);

/// Keeps a timer pending within [`NEXT_WAKE_WITHIN`], for ever.
///
/// Why: tokio wakes a runtime's driver (a `write` to its eventfd)
/// whenever a timer is armed sooner than the earliest the driver knew of
/// when it last parked, even when the thread arming it is that runtime's
/// own, running. Every attempt arms its provider's timeout, while the
/// other timers pending on a serving thread are mostly connections'
/// header timeouts, further out: under load about every second request
/// paid that `write` (measured with `perf record -e
/// syscalls:sys_enter_write`). With this timer always nearer, an
/// attempt's timer a second or more out is never the earliest. It costs
/// one wake-up a second per serving thread.
async fn keep_next_wake_near() {
    let mut ticks = tokio::time::interval(NEXT_WAKE_WITHIN);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
    }
}

/// `future`, polled with `runtime` entered: the tasks it spawns, the
/// timers it sets and the sockets it opens belong to `runtime`, whichever
/// runtime polls the future itself.
pub fn on<F: Future>(runtime: &Handle, future: F) -> On<F> {
    On {
        runtime: runtime.clone(),
        future: Box::pin(future),
    }
}

/// See [`on`].
pub struct On<F> {
    runtime: Handle,
    future: Pin<Box<F>>,
}

impl<F: Future> Future for On<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let _entered = this.runtime.enter();
        this.future.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_future_on_another_runtime_spawns_runs_there() {
        let control = control().unwrap();
        let serving = serving().unwrap();
        let spawned_on = serving.block_on(on(control.handle(), async {
            tokio::spawn(async { std::thread::current().name().map(str::to_owned) })
                .await
                .unwrap()
        }));
        assert_eq!(spawned_on.as_deref(), Some("control"));
    }
}
