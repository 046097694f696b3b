//! Where plugin code runs, and what stops a runaway plugin.
//!
//! A plugin's `begin` and `step` are sans-IO: parsing a capped body and
//! building the next request, microseconds of work. Handing each to another
//! thread would cost more than the work (two context switches a step), so
//! they run inline, on the request's own task. The price is that a plugin
//! stuck in a loop holds the thread it runs on, and nothing can take it
//! back. The defence is to notice, and never to run that provider's code
//! inline again:
//!
//! - At most one inline call per core runs at a time (the runtime has one
//!   worker more than there are cores), so even calls that never end leave
//!   a worker free; a call that finds every inline slot taken runs on the
//!   blocking pool instead.
//! - Every call is timed. One that takes longer than [`BUDGET`] quarantines
//!   its provider when it ends; one that does not end is seen by a watchdog
//!   thread, which checks the calls in progress every [`WATCH_EVERY`] and
//!   quarantines the provider of any call running past the budget. The
//!   thread a stuck call holds is lost, and so is the answer to the request
//!   it served (and, rarely, to one whose connection that thread had
//!   already queued behind it: tokio cannot hand that one to another
//!   worker), but that provider's code never runs inline again.
//! - A quarantined provider's calls run on the blocking pool, at most
//!   [`MAX_POOLED`] at a time; each holds its slot until it really ends, and
//!   a call waits for a slot within its attempt's timeout. So a stuck plugin
//!   holds a bounded number of threads whatever the traffic, its attempts
//!   fail by their timeout, and its breaker opens.
//!
//! Quarantine lasts for the life of the provider instance: a reload that
//! sets the provider up anew (a new library, say) starts it clean.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::sync::lock;

/// The longest a plugin call may take and still run inline next time.
/// Generous: a debug build parsing a large body can take a few hundred ms,
/// a loop never ends.
pub const BUDGET: Duration = Duration::from_secs(1);
/// How often the watchdog looks at the calls in progress.
pub const WATCH_EVERY: Duration = Duration::from_millis(100);
/// An inline call running longer than this makes the watchdog wake an idle
/// worker, so a worker stuck off the I/O driver cannot stall the server.
pub const NUDGE_AFTER: Duration = Duration::from_millis(50);
/// Calls of one quarantined provider that may run at once.
pub const MAX_POOLED: usize = 2;

/// The call could not run: the runtime is shutting down, or it panicked
/// outside the plugin's own guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the plugin call did not run to its end")]
pub struct NotRun;

/// Runs one provider's plugin calls; see the module doc.
pub struct StepRunner {
    provider: String,
    quarantined: AtomicBool,
    pooled: Arc<Semaphore>,
}

impl StepRunner {
    pub fn new(provider: &str) -> Arc<StepRunner> {
        Arc::new(StepRunner {
            provider: provider.to_owned(),
            quarantined: AtomicBool::new(false),
            pooled: Arc::new(Semaphore::new(MAX_POOLED)),
        })
    }

    /// Whether this provider's calls are kept off the request threads.
    pub fn is_quarantined(&self) -> bool {
        self.quarantined.load(Ordering::Relaxed)
    }

    fn quarantine(&self, took: Duration) {
        if !self.quarantined.swap(true, Ordering::Relaxed) {
            tracing::error!(
                provider = %self.provider,
                took_ms = took.as_millis() as u64,
                budget_ms = BUDGET.as_millis() as u64,
                "a plugin call ran past its budget; this provider's calls now run off the request threads, {MAX_POOLED} at most"
            );
        }
    }

    /// Runs `call`: inline while the provider behaves and an inline slot is
    /// free, on the blocking pool otherwise.
    pub async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, NotRun> {
        if !self.is_quarantined() {
            if let Some(_slot) = InlineSlot::take() {
                return Ok(self.timed(call));
            }
        }
        let slot = if self.is_quarantined() {
            // Waits, within the attempt's timeout, for a call to end.
            Some(
                self.pooled
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| NotRun)?,
            )
        } else {
            None
        };
        let span = tracing::Span::current();
        let runner = self.clone();
        tokio::task::spawn_blocking(move || {
            // Held until the call really ends, stuck or not.
            let _slot = slot;
            span.in_scope(|| runner.timed(call))
        })
        .await
        .map_err(|_| NotRun)
    }

    /// Runs `call` here, watched, and quarantines the provider if it took
    /// too long.
    fn timed<T>(self: &Arc<Self>, call: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let output = {
            let _watched = Watchdog::get().watch(self, started);
            call()
        };
        let took = started.elapsed();
        if took > BUDGET {
            self.quarantine(took);
        }
        output
    }
}

/// One of the inline slots: one per core, so that calls that never end
/// cannot hold every worker.
struct InlineSlot;

static INLINE_NOW: AtomicUsize = AtomicUsize::new(0);

impl InlineSlot {
    fn take() -> Option<InlineSlot> {
        static LIMIT: OnceLock<usize> = OnceLock::new();
        let limit =
            *LIMIT.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from));
        INLINE_NOW
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |now| {
                (now < limit).then_some(now + 1)
            })
            .ok()
            .map(|_| InlineSlot)
    }
}

impl Drop for InlineSlot {
    fn drop(&mut self) {
        INLINE_NOW.fetch_sub(1, Ordering::Release);
    }
}

/// What one thread is running, for the watchdog.
type Running = Mutex<Option<(Instant, Arc<StepRunner>)>>;

/// The thread that notices inline calls that do not end.
struct Watchdog {
    /// One entry per thread that ever ran a plugin call.
    threads: Mutex<Vec<Arc<Running>>>,
    /// The runtime whose workers run calls inline.
    runtime: OnceLock<tokio::runtime::Handle>,
}

thread_local! {
    static THIS_THREAD: OnceLock<Arc<Running>> = const { OnceLock::new() };
}

/// Clears the thread's entry when the call ends (or unwinds).
struct Watched(Arc<Running>);

impl Drop for Watched {
    fn drop(&mut self) {
        *lock(&self.0) = None;
    }
}

impl Watchdog {
    fn get() -> &'static Watchdog {
        static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();
        WATCHDOG.get_or_init(|| {
            let spawned = std::thread::Builder::new()
                .name("plugin-watchdog".into())
                .spawn(|| loop {
                    std::thread::sleep(WATCH_EVERY);
                    Watchdog::get().inspect();
                });
            if let Err(e) = spawned {
                tracing::error!(
                    "no plugin watchdog thread ({e}): a stuck plugin call goes unnoticed"
                );
            }
            Watchdog {
                threads: Mutex::new(Vec::new()),
                runtime: OnceLock::new(),
            }
        })
    }

    /// Notes that this thread runs a call of `runner` since `started`.
    fn watch(&self, runner: &Arc<StepRunner>, started: Instant) -> Watched {
        if self.runtime.get().is_none() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let _ = self.runtime.set(runtime);
            }
        }
        let running = THIS_THREAD.with(|slot| {
            slot.get_or_init(|| {
                let running = Arc::new(Mutex::new(None));
                lock(&self.threads).push(running.clone());
                running
            })
            .clone()
        });
        *lock(&running) = Some((started, runner.clone()));
        Watched(running)
    }

    /// Quarantines the provider of every call running past the budget, and
    /// wakes an idle worker while any call runs long.
    ///
    /// The wake matters: a tokio worker that leaves the I/O driver to run a
    /// task is the one that polls the driver when it parks again. If that
    /// task never ends and the other workers sleep waiting for work, nobody
    /// polls for I/O and the whole server stalls. A task spawned from here
    /// wakes a sleeping worker, which then parks on the driver.
    fn inspect(&self) {
        let threads = lock(&self.threads).clone();
        let mut long_running = false;
        for running in threads {
            let Some((took, runner)) = lock(&running)
                .as_ref()
                .map(|(started, runner)| (started.elapsed(), runner.clone()))
            else {
                continue;
            };
            long_running |= took > NUDGE_AFTER;
            if took > BUDGET {
                runner.quarantine(took);
            }
        }
        if let (true, Some(runtime)) = (long_running, self.runtime.get()) {
            runtime.spawn(async {});
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_well_behaved_provider_runs_inline() {
        let runner = StepRunner::new("quick");
        let here = std::thread::current().id();
        let ran_on = runner.run(|| std::thread::current().id()).await.unwrap();
        assert_eq!(ran_on, here);
        assert!(!runner.is_quarantined());
    }

    #[tokio::test]
    async fn a_quarantined_provider_holds_at_most_its_threads() {
        let runner = StepRunner::new("stuck");
        runner.quarantine(BUDGET);
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let mut stuck = Vec::new();
        for _ in 0..MAX_POOLED {
            let released = released.clone();
            let runner = runner.clone();
            stuck.push(tokio::spawn(async move {
                runner
                    .run(move || {
                        let _ = lock(&released).recv();
                    })
                    .await
            }));
        }
        // Let both calls start and take their slots.
        let started = Instant::now();
        while runner.pooled.available_permits() > 0 && started.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let third = tokio::time::timeout(Duration::from_millis(300), runner.run(|| ())).await;
        assert!(third.is_err(), "no third thread: the call waits for a slot");
        for _ in 0..MAX_POOLED {
            release.send(()).unwrap();
        }
        for call in stuck {
            assert_eq!(call.await.unwrap(), Ok(()));
        }
        assert_eq!(runner.run(|| 7).await, Ok(7), "slots come back");
    }
}
