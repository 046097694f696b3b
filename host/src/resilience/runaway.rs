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
//! - Every inline call is timed. One that takes longer than [`BUDGET`]
//!   quarantines its provider when it ends.
//! - One that does not end is seen by a watchdog thread, which checks the
//!   calls in progress every [`WATCH_EVERY`] and quarantines a provider whose
//!   call has run past the budget. The thread it holds is lost (the runtime
//!   has one worker more than the machine has cores, so every core keeps a
//!   worker), but that provider's code never runs on a worker again.
//! - A quarantined provider's calls run on the blocking pool, at most
//!   [`MAX_POOLED`] at a time; each holds its slot until its call really
//!   ends. When all are held (by stuck calls), the provider is busy: its
//!   attempts fail at once, without a thread, and its breaker opens. So a
//!   stuck plugin holds a bounded number of threads, whatever the traffic.
//!
//! Quarantine lasts for the life of the provider instance: a reload that
//! sets the provider up anew (a new library, say) starts it clean.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

/// The longest a plugin call may take and still run inline next time.
/// Generous: a debug build parsing a large body can take a few hundred ms,
/// a loop never ends.
pub const BUDGET: Duration = Duration::from_secs(2);
/// How often the watchdog looks at the calls in progress.
pub const WATCH_EVERY: Duration = Duration::from_millis(100);
/// Calls of one quarantined provider that may run at once.
pub const MAX_POOLED: usize = 2;

/// The provider's calls cannot run: every thread it may hold is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("every thread this plugin may use is held by a call that has not ended")]
pub struct Busy;

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

    /// Runs `call`: inline while the provider behaves, on the blocking pool
    /// once it is quarantined.
    pub async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Busy> {
        if !self.is_quarantined() {
            let started = Instant::now();
            let output = {
                let _watched = Watchdog::get().watch(self, started);
                call()
            };
            let took = started.elapsed();
            if took > BUDGET {
                self.quarantine(took);
            }
            return Ok(output);
        }
        let slot = self.pooled.clone().try_acquire_owned().map_err(|_| Busy)?;
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || {
            // Held until the call really ends, stuck or not.
            let _slot = slot;
            span.in_scope(call)
        })
        .await
        // The call panicked outside the plugin's own guard, or the runtime
        // is shutting down: either way there is no answer.
        .map_err(|_| Busy)
    }
}

/// What one thread is running inline, for the watchdog.
type Running = Mutex<Option<(Instant, Arc<StepRunner>)>>;

/// The thread that notices inline calls that do not end.
struct Watchdog {
    /// One entry per thread that ever ran a plugin call inline.
    threads: Mutex<Vec<Arc<Running>>>,
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
            }
        })
    }

    /// Notes that this thread runs a call of `runner` since `started`.
    fn watch(&self, runner: &Arc<StepRunner>, started: Instant) -> Watched {
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

    /// Quarantines the provider of every call running past the budget.
    fn inspect(&self) {
        let threads = lock(&self.threads).clone();
        for running in threads {
            let overdue = lock(&running)
                .as_ref()
                .filter(|(started, _)| started.elapsed() > BUDGET)
                .map(|(started, runner)| (started.elapsed(), runner.clone()));
            if let Some((took, runner)) = overdue {
                runner.quarantine(took);
            }
        }
    }
}

/// The data behind these locks is a plain value: a panic cannot tear it.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
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
        assert_eq!(runner.run(|| ()).await, Err(Busy), "no third thread");
        for _ in 0..MAX_POOLED {
            release.send(()).unwrap();
        }
        for call in stuck {
            assert_eq!(call.await.unwrap(), Ok(()));
        }
        assert_eq!(runner.run(|| 7).await, Ok(7), "slots come back");
    }
}
