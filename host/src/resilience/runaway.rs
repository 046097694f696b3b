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
//! - At most one inline call per core runs at a time (there is one serving
//!   thread more than there are cores: [`crate::http::serving`]), so even
//!   calls that never end leave a thread free; a call that finds every
//!   inline slot taken runs on the blocking pool instead.
//! - Every call is timed. One that takes longer than [`BUDGET`] quarantines
//!   its provider when it ends; one that does not end is seen by a watchdog
//!   thread, which checks the calls in progress every [`WATCH_EVERY`] and
//!   quarantines the provider of any call running past the budget. The
//!   thread a stuck call holds is lost, and so are the requests of the
//!   connections it served; the watchdog tells the thread's owner
//!   ([`when_this_thread_is_stuck`]), which starts another in its place
//!   and hands it the connections the lost one had not begun to serve,
//!   and that provider's code never runs inline again.
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

/// The longest a plugin call may take and still run inline next time
/// (plugin-api's, which its test kit holds plugins to).
pub const BUDGET: Duration = plugin_api::ffi::STEP_BUDGET;
/// How often the watchdog looks at the calls in progress.
pub const WATCH_EVERY: Duration = Duration::from_millis(100);
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
        let limit = *LIMIT.get_or_init(crate::runtime::cores);
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

/// What to do when this thread is seen stuck in a plugin call.
type WhenStuck = Box<dyn Fn() + Send + Sync>;

/// What one thread is running, for the watchdog.
#[derive(Default)]
struct Running {
    /// The call in progress: since when, and whose.
    call: Mutex<Option<(Instant, Arc<StepRunner>)>>,
    /// Set by the thread's owner ([`when_this_thread_is_stuck`]).
    when_stuck: Mutex<Option<Arc<WhenStuck>>>,
    /// The start of the call last said stuck: each is said once.
    said_stuck: Mutex<Option<Instant>>,
}

/// The thread that notices inline calls that do not end.
struct Watchdog {
    /// One entry per living thread that ran a plugin call or asked to be
    /// told when stuck.
    threads: Mutex<Vec<Arc<Running>>>,
}

thread_local! {
    static THIS_THREAD: OnceLock<Arc<Running>> = const { OnceLock::new() };
}

/// Runs `action` (once a call) should a plugin call on this thread be seen
/// past its budget: the thread's owner learns it has lost the thread, and
/// what it served there, for as long as the call runs. Until the returned
/// guard is dropped.
#[must_use]
pub fn when_this_thread_is_stuck(action: impl Fn() + Send + Sync + 'static) -> WhenStuckGuard {
    let running = Watchdog::get().this_thread();
    *lock(&running.when_stuck) = Some(Arc::new(Box::new(action)));
    WhenStuckGuard(running)
}

/// Keeps the action of [`when_this_thread_is_stuck`] set.
pub struct WhenStuckGuard(Arc<Running>);

impl WhenStuckGuard {
    /// The plugin calls of the thread it was made on, to look at from
    /// others.
    pub fn calls(&self) -> ThreadCalls {
        ThreadCalls(self.0.clone())
    }
}

/// One thread's plugin calls, as another thread sees them.
pub struct ThreadCalls(Arc<Running>);

impl ThreadCalls {
    /// How long the call that thread runs now has been running, if any.
    pub fn in_call_for(&self) -> Option<Duration> {
        lock(&self.0.call)
            .as_ref()
            .map(|(started, _)| started.elapsed())
    }
}

impl Drop for WhenStuckGuard {
    fn drop(&mut self) {
        lock(&self.0.when_stuck).take();
    }
}

/// Clears the thread's entry when the call ends (or unwinds).
struct Watched(Arc<Running>);

impl Drop for Watched {
    fn drop(&mut self) {
        *lock(&self.0.call) = None;
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

    /// This thread's entry, made on first use.
    fn this_thread(&self) -> Arc<Running> {
        THIS_THREAD.with(|slot| {
            slot.get_or_init(|| {
                let running = Arc::new(Running::default());
                lock(&self.threads).push(running.clone());
                running
            })
            .clone()
        })
    }

    /// Notes that this thread runs a call of `runner` since `started`.
    fn watch(&self, runner: &Arc<StepRunner>, started: Instant) -> Watched {
        let running = self.this_thread();
        *lock(&running.call) = Some((started, runner.clone()));
        Watched(running)
    }

    /// Quarantines the provider of every call running past the budget,
    /// and tells the owner of each thread stuck so (once a call).
    fn inspect(&self) {
        let threads = {
            let mut threads = lock(&self.threads);
            // An entry only this list holds is a thread's that ended (its
            // thread-local went with it): blocking-pool and replacement
            // threads come and go, and the list must not grow with them.
            threads.retain(|running| Arc::strong_count(running) > 1);
            threads.clone()
        };
        for running in threads {
            let Some((started, took, runner)) = lock(&running.call)
                .as_ref()
                .map(|(started, runner)| (*started, started.elapsed(), runner.clone()))
            else {
                continue;
            };
            if took <= BUDGET {
                continue;
            }
            runner.quarantine(took);
            let first_time = lock(&running.said_stuck).replace(started) != Some(started);
            let when_stuck = lock(&running.when_stuck).clone();
            if let (true, Some(when_stuck)) = (first_time, when_stuck) {
                when_stuck();
            }
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

    /// A thread's owner is told once when a call there is stuck past the
    /// budget, and the provider quarantined; once the owner lets go, it is
    /// told nothing more.
    #[test]
    fn the_owner_of_a_thread_stuck_in_a_call_is_told_once() {
        let runner = StepRunner::new("stuck on its thread");
        let told = Arc::new(AtomicUsize::new(0));
        let (release, released) = std::sync::mpsc::channel::<()>();
        let thread = {
            let (runner, told) = (runner.clone(), told.clone());
            std::thread::spawn(move || {
                let guard = when_this_thread_is_stuck(move || {
                    told.fetch_add(1, Ordering::SeqCst);
                });
                let runtime = crate::runtime::serving().unwrap();
                runtime
                    .block_on(runner.run(move || released.recv()))
                    .unwrap()
                    .unwrap();
                drop(guard);
            })
        };
        let deadline = Instant::now() + BUDGET * 5;
        while told.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::sleep(WATCH_EVERY / 2);
        }
        assert_eq!(told.load(Ordering::SeqCst), 1, "told when past the budget");
        assert!(runner.is_quarantined());
        // More rounds of the watchdog over the same call: told once.
        std::thread::sleep(WATCH_EVERY * 3);
        assert_eq!(told.load(Ordering::SeqCst), 1);
        release.send(()).unwrap();
        thread.join().unwrap();
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
