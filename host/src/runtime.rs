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
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::runtime::{Builder, Handle, Runtime};

use crate::write_batch;

/// The cores this process may run on: as many plugin calls may hold an
/// inline slot on the serving threads at once
/// ([`crate::resilience::runaway`]), and there is one serving thread more.
/// Read once: finding out reads the cgroup's files, and the count is asked
/// for each connection handed to a serving thread.
pub fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
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

/// Pins this thread, a serving thread numbered `number`, to a core of its
/// own: serving threads 0 to one fewer than the cores, each to the one of
/// that rank among the CPUs the process may run on. Not the threads beyond
/// (the one standing by, and those started in a stuck thread's place),
/// nor when the process may run on more CPUs than it has cores to use (a
/// CPU quota), nor when `SOCIALGATE_PIN_SERVING_THREADS=0`.
///
/// Why: on a machine whose cores the server shares (with a load generator
/// and an upstream on the same two cores, in bench/run.sh), the scheduler
/// otherwise moves the serving threads around and now and then stacks both
/// on one core, and a thread waiting for its core holds its connections'
/// answers: p99 at `profile@32` 1.24-4.32 ms unpinned against 1.31-2.16
/// pinned in 21 interleaved lab rounds, throughput the same or a few
/// percent more (bench/RESULTS.md).
pub fn pin_serving_thread(number: usize) {
    if number >= cores() || std::env::var("SOCIALGATE_PIN_SERVING_THREADS").is_ok_and(|v| v == "0")
    {
        return;
    }
    affinity::pin_to_rank(number);
}

/// Lets this thread run on every CPU the process may: for threads a
/// pinned serving thread starts (they inherit its one CPU), which must not
/// crowd it, a plugin call stuck on one least of all.
pub fn unpin_this_thread() {
    affinity::unpin();
}

#[cfg(target_os = "linux")]
mod affinity {
    use std::sync::OnceLock;

    /// The CPUs the process may run on, as the first thread to ask found
    /// them (before any serving thread pinned itself: each is started by an
    /// unpinned thread, and asks before it pins itself).
    fn process_cpus() -> Option<&'static libc::cpu_set_t> {
        static CPUS: OnceLock<Option<libc::cpu_set_t>> = OnceLock::new();
        CPUS.get_or_init(|| {
            // SAFETY: a zeroed cpu_set_t is a valid empty set, and the call
            // writes at most its size.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            let got = unsafe {
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set)
            };
            (got == 0).then_some(set)
        })
        .as_ref()
    }

    pub fn pin_to_rank(rank: usize) {
        let Some(cpus) = process_cpus() else {
            return;
        };
        let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `cpu` is within the set's size.
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, cpus) })
            .collect();
        // More CPUs than cores to use: a quota; the scheduler knows better.
        if allowed.len() != super::cores() {
            return;
        }
        let Some(&cpu) = allowed.get(rank) else {
            return;
        };
        // SAFETY: as above.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        unsafe { libc::CPU_SET(cpu, &mut one) };
        set(&one, &format!("pinned to CPU {cpu}"));
    }

    pub fn unpin() {
        if let Some(cpus) = process_cpus() {
            set(cpus, "unpinned");
        }
    }

    fn set(cpus: &libc::cpu_set_t, what: &str) {
        // SAFETY: `cpus` is a valid set of the size given.
        let done =
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), cpus) };
        if done == 0 {
            tracing::debug!("this thread is {what}");
        } else {
            let e = std::io::Error::last_os_error();
            tracing::warn!("this thread could not be {what}: {e}");
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod affinity {
    pub fn pin_to_rank(_rank: usize) {}
    pub fn unpin() {}
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
    let runtime = Builder::new_current_thread()
        .enable_all()
        // Its blocking pool's threads (plugin calls off the serving
        // threads) must not share a pinned serving thread's core.
        .on_thread_start(unpin_this_thread)
        .build()?;
    runtime.spawn(keep_next_wake_near());
    write_batch::start_on_this_thread(&runtime);
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
