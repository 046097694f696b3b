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
//! - At most one call per core holds an inline slot (there is one serving
//!   thread more than there are cores: [`crate::http::serving`]), so even
//!   calls that never end leave a thread free. A call that finds every
//!   slot taken waits for one while its thread serves other requests; only
//!   when no slot has come free for [`PATIENCE`] (their holders are slow
//!   or stuck) does it run on the blocking pool instead. Sending every
//!   such call to the pool at once made the pool the busiest place under
//!   load: hundreds of short-lived threads, each leaving its allocator
//!   pages behind, and a process slower for minutes afterwards
//!   (bench/RESULTS.md).
//! - Every call is timed. One that takes longer than [`BUDGET`] quarantines
//!   its provider when it ends; one that does not end is seen by a watchdog
//!   thread, which checks the calls in progress every [`WATCH_EVERY`],
//!   quarantines the provider of any call running past the budget and
//!   then frees the inline slot the call holds. The thread a stuck call
//!   holds is lost, and so are the requests of the connections it served
//!   (the answers they had written go out: the owner sends the thread's
//!   queue of writes, [`crate::write_batch::Unsent`]);
//!   the watchdog tells the thread's owner ([`when_this_thread_is_stuck`]),
//!   which starts another in its place and hands it the connections the
//!   lost one had not begun to serve, and that provider's code never runs
//!   inline again.
//! - A quarantined provider's calls run on the blocking pool, at most
//!   [`MAX_POOLED`] at a time; each holds its pool place until it really
//!   ends, and a call waits for a place within its attempt's timeout. So a
//!   stuck plugin holds a bounded number of threads whatever the traffic,
//!   its attempts fail by their timeout, and its breaker opens.
//!
//! Quarantine lasts for the life of the provider instance: a reload that
//! sets the provider up anew (a new library, say) starts it clean.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};

use crate::sync::lock;

/// The longest a plugin call may take and still run inline next time
/// (plugin-api's, which its test kit holds plugins to).
pub const BUDGET: Duration = plugin_api::ffi::STEP_BUDGET;
/// How often the watchdog looks at the calls in progress.
pub const WATCH_EVERY: Duration = Duration::from_millis(100);
/// Calls of one quarantined provider that may run at once.
pub const MAX_POOLED: usize = 2;
/// How long a call waits for an inline slot while none comes free before
/// it runs on the blocking pool: far longer than healthy calls hold one
/// (microseconds, a few at worst), short enough that a request waiting
/// behind stuck calls is still answered promptly.
pub const PATIENCE: Duration = Duration::from_millis(50);

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
    inline: &'static InlineSlots,
}

impl StepRunner {
    pub fn new(provider: &str) -> Arc<StepRunner> {
        StepRunner::sharing(provider, InlineSlots::process_wide())
    }

    fn sharing(provider: &str, inline: &'static InlineSlots) -> Arc<StepRunner> {
        Arc::new(StepRunner {
            provider: provider.to_owned(),
            quarantined: AtomicBool::new(false),
            pooled: Arc::new(Semaphore::new(MAX_POOLED)),
            inline,
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

    /// Runs `call`: inline while the provider behaves and an inline slot
    /// comes free, on the blocking pool otherwise.
    pub async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, NotRun> {
        if !self.is_quarantined() {
            let slot = match self.inline.take() {
                Some(slot) => Some(slot),
                None => self.inline.wait().await,
            };
            // Quarantined while this call waited: not inline after all.
            if let (Some(slot), false) = (slot, self.is_quarantined()) {
                return Ok(self.timed(call, Some(slot)));
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
            span.in_scope(|| runner.timed(call, None))
        })
        .await
        .map_err(|_| NotRun)
    }

    /// Runs `call` here, watched: the provider is quarantined if it took
    /// too long ([`Watched`]). The inline slot, if any, is the watchdog's to
    /// free should the call not end.
    fn timed<T>(self: &Arc<Self>, call: impl FnOnce() -> T, slot: Option<InlineSlot>) -> T {
        let _watched = Watchdog::get().watch(self, Instant::now(), slot);
        call()
    }
}

/// The inline slots: one per core, so that calls that never end cannot
/// hold every worker.
///
/// Not a semaphore that hands a freed slot to the first call in line: a
/// call in line on a thread that is stuck would hold the slot it was
/// handed for ever. A waiting call is only woken here, and takes a slot
/// itself when its thread runs it.
struct InlineSlots {
    limit: usize,
    taken: AtomicUsize,
    /// Calls waiting for a slot (for good, those on a stuck thread):
    /// freeing one wakes a call only when one waits.
    waiting: AtomicUsize,
    one_freed: Notify,
    /// Slots freed so far, for a waiting call to tell a line that moves
    /// from holders that are slow or stuck.
    freed: AtomicU64,
    /// How long a waiting call bears with no slot freed ([`PATIENCE`]).
    patience: Duration,
}

impl InlineSlots {
    /// The process's: every provider's calls share the serving threads.
    fn process_wide() -> &'static InlineSlots {
        static SLOTS: OnceLock<InlineSlots> = OnceLock::new();
        SLOTS.get_or_init(|| InlineSlots::new(crate::runtime::cores(), PATIENCE))
    }

    fn new(limit: usize, patience: Duration) -> InlineSlots {
        InlineSlots {
            limit,
            taken: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            one_freed: Notify::new(),
            freed: AtomicU64::new(0),
            patience,
        }
    }

    /// A slot, if one is free.
    fn take(&'static self) -> Option<InlineSlot> {
        // SeqCst here, in `wait` and in `InlineSlot::drop`: a freed slot
        // is seen by a waiting call's next try, or wakes one. (One woken on
        // a thread now stuck takes the wake-up with it: the call behind it
        // finds the slot when its patience runs out.)
        self.taken
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |taken| {
                (taken < self.limit).then_some(taken + 1)
            })
            .ok()
            .map(|_| InlineSlot { slots: self })
    }

    /// Waits for a slot, for as long as slots keep coming free; `None` once
    /// none has for its patience.
    async fn wait(&'static self) -> Option<InlineSlot> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _counted = Waiting(&self.waiting);
        let mut freed_before = self.freed.load(Ordering::Relaxed);
        loop {
            let woken = self.one_freed.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if let Some(slot) = self.take() {
                return Some(slot);
            }
            tokio::select! {
                biased;
                () = &mut woken => {}
                () = tokio::time::sleep(self.patience) => {
                    let freed = self.freed.load(Ordering::Relaxed);
                    if freed == freed_before {
                        return self.take();
                    }
                    freed_before = freed;
                }
            }
        }
    }
}

/// Counts a call in [`InlineSlots::wait`] until it stops waiting, however
/// it stops.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One of the [`InlineSlots`], freed when dropped.
struct InlineSlot {
    slots: &'static InlineSlots,
}

impl Drop for InlineSlot {
    fn drop(&mut self) {
        let slots = self.slots;
        slots.freed.fetch_add(1, Ordering::Relaxed);
        slots.taken.fetch_sub(1, Ordering::SeqCst);
        if slots.waiting.load(Ordering::SeqCst) > 0 {
            slots.one_freed.notify_one();
        }
    }
}

/// What to do when this thread is seen stuck in a plugin call.
type WhenStuck = Box<dyn Fn() + Send + Sync>;

/// A plugin call in progress, as the watchdog sees it.
struct Call {
    started: Instant,
    runner: Arc<StepRunner>,
    /// Held until the call ends, or the watchdog sees it stuck.
    slot: Option<InlineSlot>,
}

/// What one thread is running, for the watchdog.
#[derive(Default)]
struct Running {
    /// The call in progress.
    call: Mutex<Option<Call>>,
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
            .map(|call| call.started.elapsed())
    }
}

impl Drop for WhenStuckGuard {
    fn drop(&mut self) {
        lock(&self.0.when_stuck).take();
    }
}

/// Ends the thread's call when it returns (or unwinds): clears the entry,
/// quarantines the provider if the call took too long, and only then frees
/// its inline slot (unless the watchdog has), so that a call waiting for
/// the slot finds the provider quarantined.
struct Watched(Arc<Running>);

impl Drop for Watched {
    fn drop(&mut self) {
        // Taken out under the lock, dropped once it is let go: freeing a
        // slot wakes a call.
        let call = lock(&self.0.call).take();
        if let Some(call) = call {
            let took = call.started.elapsed();
            if took > BUDGET {
                call.runner.quarantine(took);
            }
        }
    }
}

impl Watchdog {
    fn get() -> &'static Watchdog {
        static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();
        WATCHDOG.get_or_init(|| {
            let spawned = std::thread::Builder::new()
                .name("plugin-watchdog".into())
                .spawn(|| {
                    // Started by whichever thread first needs it: a pinned
                    // serving thread, perhaps.
                    crate::runtime::unpin_this_thread();
                    loop {
                        std::thread::sleep(WATCH_EVERY);
                        Watchdog::get().inspect();
                    }
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

    /// Notes that this thread runs a call of `runner` since `started`,
    /// holding `slot`.
    fn watch(
        &self,
        runner: &Arc<StepRunner>,
        started: Instant,
        slot: Option<InlineSlot>,
    ) -> Watched {
        let running = self.this_thread();
        *lock(&running.call) = Some(Call {
            started,
            runner: runner.clone(),
            slot,
        });
        Watched(running)
    }

    /// Quarantines the provider of every call running past the budget,
    /// tells the owner of each thread stuck so (once a call), then frees
    /// the inline slot the call holds.
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
            let (started, took, runner, slot) = {
                let mut call = lock(&running.call);
                let Some(call) = call.as_mut() else {
                    continue;
                };
                let took = call.started.elapsed();
                if took <= BUDGET {
                    continue;
                }
                // Taken under the lock: freed once, by whoever comes first.
                (call.started, took, call.runner.clone(), call.slot.take())
            };
            runner.quarantine(took);
            let first_time = lock(&running.said_stuck).replace(started) != Some(started);
            let when_stuck = lock(&running.when_stuck).clone();
            if let (true, Some(when_stuck)) = (first_time, when_stuck) {
                when_stuck();
            }
            // Freed last: whoever takes it finds the provider quarantined
            // and the stuck thread given up.
            drop(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inline slots of a test's own, so that tests running at once in this
    /// process do not take each other's.
    fn own_slots(slots: usize) -> &'static InlineSlots {
        Box::leak(Box::new(InlineSlots::new(slots, PATIENCE)))
    }

    /// Slots whose waiting calls bear a long time with none freed: for
    /// tests that free one when they choose, on a machine however busy.
    fn patient_slots(slots: usize) -> &'static InlineSlots {
        Box::leak(Box::new(InlineSlots::new(slots, Duration::from_secs(30))))
    }

    /// Takes every one of `slots` with a call of `runner`'s on a thread of
    /// its own, each until it is sent `()`.
    fn hold_every_slot(
        runner: &Arc<StepRunner>,
        slots: usize,
    ) -> (
        std::sync::mpsc::Sender<()>,
        Vec<std::thread::JoinHandle<()>>,
    ) {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let holders = (0..slots)
            .map(|_| {
                let (runner, released) = (runner.clone(), released.clone());
                std::thread::spawn(move || {
                    let runtime = crate::runtime::serving().unwrap();
                    runtime
                        .block_on(runner.run(move || lock(&released).recv()))
                        .unwrap()
                        .unwrap();
                })
            })
            .collect();
        let started = Instant::now();
        while runner.inline.taken.load(Ordering::SeqCst) < slots
            && started.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            runner.inline.taken.load(Ordering::SeqCst),
            slots,
            "every slot held"
        );
        (release, holders)
    }

    /// Under load every slot is often taken for a moment: a call waits for
    /// one rather than start a thread of its own.
    #[tokio::test]
    async fn a_call_finding_every_slot_taken_waits_for_one_to_come_free() {
        let runner = StepRunner::sharing("busy", patient_slots(2));
        let (release, holders) = hold_every_slot(&runner, 2);
        let here = std::thread::current().id();
        // Well within the patience: the freed slot wakes the call.
        let waited = tokio::time::timeout(
            Duration::from_secs(5),
            runner.run(|| std::thread::current().id()),
        );
        let (ran_on, ()) = tokio::join!(waited, async {
            tokio::time::sleep(PATIENCE / 10).await;
            release.send(()).unwrap();
        });
        let ran_on = ran_on.expect("woken when the slot came free");
        assert_eq!(ran_on.unwrap(), here, "inline, once a slot came free");
        release.send(()).unwrap();
        for holder in holders {
            holder.join().unwrap();
        }
        assert!(!runner.is_quarantined());
    }

    /// A call waiting for a slot on a thread that then gets stuck (in
    /// another call, say) takes no slot with it: a slot freed meanwhile
    /// goes to a call whose thread runs.
    #[tokio::test]
    async fn a_call_waiting_on_a_stuck_thread_keeps_no_slot() {
        let slots = patient_slots(1);
        let runner = StepRunner::sharing("busy", slots);
        let (release, holder) = hold_every_slot(&runner, 1);
        let (unstick, stuck) = std::sync::mpsc::channel::<()>();
        let (now_stuck, is_stuck) = std::sync::mpsc::channel::<()>();
        let stuck_thread = {
            let runner = runner.clone();
            std::thread::spawn(move || {
                let runtime = crate::runtime::serving().unwrap();
                runtime.block_on(async move {
                    let waiting = tokio::spawn(async move { runner.run(|| ()).await });
                    let since = Instant::now();
                    while slots.waiting.load(Ordering::SeqCst) == 0
                        && since.elapsed() < Duration::from_secs(5)
                    {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    // The thread is held from here: its waiting call is
                    // not run.
                    now_stuck.send(()).unwrap();
                    let _ = stuck.recv();
                    waiting.await
                })
            })
        };
        is_stuck
            .recv_timeout(Duration::from_secs(10))
            .expect("the other thread is held");
        assert_eq!(
            slots.waiting.load(Ordering::SeqCst),
            1,
            "a call waits there"
        );
        release.send(()).unwrap();
        for holder in holder {
            holder.join().unwrap();
        }
        let here = std::thread::current().id();
        let ran_on = tokio::time::timeout(
            Duration::from_secs(5),
            runner.run(|| std::thread::current().id()),
        )
        .await
        .expect("the freed slot, not a wait for it")
        .unwrap();
        assert_eq!(ran_on, here);
        unstick.send(()).unwrap();
        let waited = stuck_thread.join().unwrap();
        assert_eq!(
            waited.unwrap(),
            Ok(()),
            "the waiting call ran once its thread did"
        );
    }

    /// Holders that do not let go (slow, or stuck before the watchdog can
    /// tell): a call waits no longer than [`PATIENCE`] for them.
    #[tokio::test]
    async fn a_call_behind_slots_that_stay_taken_runs_off_the_serving_thread() {
        let runner = StepRunner::sharing("slow", own_slots(2));
        let (release, holders) = hold_every_slot(&runner, 2);
        let here = std::thread::current().id();
        let started = Instant::now();
        let ran_on = runner.run(|| std::thread::current().id()).await.unwrap();
        assert_ne!(ran_on, here, "on the blocking pool");
        assert!(started.elapsed() >= PATIENCE, "after waiting its patience");
        for _ in 0..2 {
            release.send(()).unwrap();
        }
        for holder in holders {
            holder.join().unwrap();
        }
    }

    /// A stuck call's slot is freed when the watchdog sees it: calls that
    /// never end do not leave the others without slots for good.
    #[tokio::test]
    async fn the_slot_of_a_stuck_call_is_freed_for_the_others() {
        let stuck = StepRunner::sharing("stuck", own_slots(1));
        let (release, holder) = hold_every_slot(&stuck, 1);
        let quick = StepRunner::sharing("quick", stuck.inline);
        let started = Instant::now();
        while stuck.inline.taken.load(Ordering::SeqCst) > 0 && started.elapsed() < BUDGET * 5 {
            tokio::time::sleep(WATCH_EVERY / 2).await;
        }
        assert!(
            stuck.is_quarantined(),
            "quarantined before its slot is freed"
        );
        let here = std::thread::current().id();
        let ran_on = quick.run(|| std::thread::current().id()).await.unwrap();
        assert_eq!(ran_on, here, "inline, in the stuck call's slot");
        release.send(()).unwrap();
        for holder in holder {
            holder.join().unwrap();
        }
        assert_eq!(stuck.inline.taken.load(Ordering::SeqCst), 0, "freed once");
    }

    #[tokio::test]
    async fn a_well_behaved_provider_runs_inline() {
        let runner = StepRunner::sharing("quick", own_slots(1));
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
        let runner = StepRunner::sharing("stuck on its thread", own_slots(1));
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
        let runner = StepRunner::sharing("stuck", own_slots(1));
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
