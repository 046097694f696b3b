//! Where plugin code runs, and what stops a runaway plugin.
//!
//! A plugin's `begin` and `step` are sans-IO: parsing a capped body and
//! building the next request, microseconds of work. Handing each to another
//! thread would cost more than the work (two context switches a step), so
//! they run inline, on the request's own task and the runtime worker that
//! polls it. The price is that a plugin stuck in a loop holds that worker,
//! and nothing can take it back. What was weighed: with every step inline,
//! two stuck steps on a two-worker runtime freeze the server; with every
//! step handed to a pool, every request pays the hand-off
//! (docs/performance.md). So steps run inline, but never on every worker at
//! once, and a provider whose call ran too long never runs inline again:
//!
//! - At most one call per worker but one holds an inline slot
//!   ([`crate::runtime::workers`]), so calls that never end always leave a
//!   worker to serve the others. A call that finds every slot taken waits
//!   for one (holders take microseconds); only when none has come free for
//!   [`PATIENCE`] (their holders are slow or stuck) does it run on the
//!   blocking pool instead.
//! - A worker held by a call must not hold up the others. Tokio's workers
//!   take turns polling the sockets, and one that has gone idle while
//!   another took its turn sleeps until woken: with the worker that would
//!   wake it held in a call, no socket is read again. So the watchdog wakes
//!   the runtime (a task of nothing) when it sees an inline call running
//!   longer than [`WATCH_EVERY`]: an idle worker wakes and polls in its
//!   place.
//! - Every call is timed. One that takes longer than [`BUDGET`] quarantines
//!   its provider when it ends; one that does not end is seen by a watchdog
//!   thread, which looks at the calls in progress every [`WATCH_EVERY`]. It
//!   quarantines the provider of a call past the budget and retires the
//!   inline slot that call holds, with the worker it holds: one call fewer
//!   runs inline from then on (none, on two workers), until the call ends.
//! - Calls off the workers (a quarantined provider's, or those that found
//!   no slot) run on the blocking pool, at most [`MAX_POOLED`] of one
//!   provider at a time; each holds its place until it really ends, and a
//!   call waits for a place within its attempt's timeout. So a stuck plugin
//!   holds at most the inline slots and [`MAX_POOLED`] threads, whatever
//!   the traffic, before and after its quarantine; its attempts fail by
//!   their timeout, and its breaker opens.
//!
//! Quarantine lasts for the life of the provider instance (a reload that
//! sets the provider up anew, with a new library say, starts it clean), and
//! is shown on `/readyz` and in `socialgate_provider_quarantined`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};

use crate::sync::lock;

/// The longest a plugin call may take and still run inline next time
/// (plugin-api's, which its test kit holds plugins to).
pub const BUDGET: Duration = plugin_api::ffi::STEP_BUDGET;
/// How often the watchdog looks at the calls in progress.
pub const WATCH_EVERY: Duration = Duration::from_millis(50);
/// Calls of one provider that may run off the workers at once.
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

    /// Whether this provider's calls are kept off the runtime's workers.
    pub fn is_quarantined(&self) -> bool {
        self.quarantined.load(Ordering::Relaxed)
    }

    fn quarantine(&self, took: Duration) {
        if !self.quarantined.swap(true, Ordering::Relaxed) {
            tracing::error!(
                provider = %self.provider,
                took_ms = took.as_millis() as u64,
                budget_ms = BUDGET.as_millis() as u64,
                "a plugin call ran past its budget; this provider's calls now run off the runtime's workers, {MAX_POOLED} at most"
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
                self.inline
                    .runtime
                    .get_or_init(tokio::runtime::Handle::current);
                return Ok(self.timed(call, Some(slot)));
            }
        }
        // Waits, within the attempt's timeout, for a call to end.
        let place = self
            .pooled
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| NotRun)?;
        let span = tracing::Span::current();
        let runner = self.clone();
        tokio::task::spawn_blocking(move || {
            // Held until the call really ends, stuck or not.
            let _place = place;
            span.in_scope(|| runner.timed(call, None))
        })
        .await
        .map_err(|_| NotRun)
    }

    /// Runs `call` here, watched: the provider is quarantined if it took
    /// too long ([`Watched`]).
    fn timed<T>(self: &Arc<Self>, call: impl FnOnce() -> T, slot: Option<InlineSlot>) -> T {
        let _watched = Watchdog::get().watch(self, slot);
        call()
    }
}

/// The inline slots: one per worker but one, so that calls that never end
/// cannot hold every worker.
///
/// Not a semaphore that hands a freed slot to the first call in line: a
/// call in line on a worker that is stuck would hold the slot it was
/// handed for ever. A waiting call is only woken here, and takes a slot
/// itself when its worker runs it.
struct InlineSlots {
    /// Slots not retired with a stuck call.
    limit: AtomicUsize,
    taken: AtomicUsize,
    /// Calls waiting for a slot: freeing one wakes a call only when one
    /// waits.
    waiting: AtomicUsize,
    one_freed: Notify,
    /// Slots freed so far, for a waiting call to tell a line that moves
    /// from holders that are slow or stuck.
    freed: AtomicU64,
    /// How long a waiting call bears with no slot freed ([`PATIENCE`]).
    patience: Duration,
    /// The runtime whose workers the slots are on, to wake when one is
    /// held too long (see the module doc).
    runtime: OnceLock<tokio::runtime::Handle>,
}

impl InlineSlots {
    /// The process's: every provider's calls share the workers.
    fn process_wide() -> &'static InlineSlots {
        static SLOTS: OnceLock<InlineSlots> = OnceLock::new();
        SLOTS.get_or_init(|| InlineSlots::new(crate::runtime::workers() - 1, PATIENCE))
    }

    fn new(limit: usize, patience: Duration) -> InlineSlots {
        InlineSlots {
            limit: AtomicUsize::new(limit),
            taken: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            one_freed: Notify::new(),
            freed: AtomicU64::new(0),
            patience,
            runtime: OnceLock::new(),
        }
    }

    /// A slot, if one is free.
    fn take(&'static self) -> Option<InlineSlot> {
        // SeqCst here, in `wait` and in `InlineSlot::drop`: a freed slot
        // is seen by a waiting call's next try, or wakes one. (One woken on
        // a worker now stuck takes the wake-up with it: the call behind it
        // finds the slot when its patience runs out.)
        let limit = self.limit.load(Ordering::SeqCst);
        self.taken
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |taken| {
                (taken < limit).then_some(taken + 1)
            })
            .ok()
            .map(|_| InlineSlot {
                slots: self,
                retired: false,
            })
    }

    /// Waits for a slot, for as long as slots keep coming free; `None` once
    /// none has for its patience, or at once when every slot is retired.
    async fn wait(&'static self) -> Option<InlineSlot> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _counted = Waiting(&self.waiting);
        let mut freed_before = self.freed.load(Ordering::Relaxed);
        loop {
            if self.limit.load(Ordering::SeqCst) == 0 {
                return None;
            }
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

    /// Wakes a waiting call, if any, to try for a slot.
    fn wake_one(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.one_freed.notify_one();
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
    /// Taken out of use with its stuck call ([`InlineSlot::retire`]).
    retired: bool,
}

impl InlineSlot {
    /// Takes this slot out of use while its call is stuck: the slot is
    /// free, but there is one fewer until the call ends.
    fn retire(&mut self) {
        if std::mem::replace(&mut self.retired, true) {
            return;
        }
        let slots = self.slots;
        slots.limit.fetch_sub(1, Ordering::SeqCst);
        slots.taken.fetch_sub(1, Ordering::SeqCst);
        // Those waiting for a slot that may now never come go elsewhere.
        slots.one_freed.notify_waiters();
    }
}

impl Drop for InlineSlot {
    fn drop(&mut self) {
        let slots = self.slots;
        slots.freed.fetch_add(1, Ordering::Relaxed);
        if self.retired {
            // The call ended after all: its slot is back in use.
            slots.limit.fetch_add(1, Ordering::SeqCst);
        } else {
            slots.taken.fetch_sub(1, Ordering::SeqCst);
        }
        slots.wake_one();
    }
}

/// A plugin call in progress, as the watchdog sees it.
struct Call {
    started: Instant,
    runner: Arc<StepRunner>,
    /// Held until the call ends; retired by the watchdog should it not.
    slot: Option<InlineSlot>,
}

/// The thread that notices calls that do not end.
struct Watchdog {
    /// One entry per living thread that ran a plugin call: each thread runs
    /// one call at a time, so its entry is locked by it and the watchdog
    /// only.
    threads: Mutex<Vec<Arc<Mutex<Option<Call>>>>>,
}

thread_local! {
    static THIS_THREAD: OnceLock<Arc<Mutex<Option<Call>>>> = const { OnceLock::new() };
}

/// Ends the thread's call when it returns (or unwinds): clears the entry
/// and quarantines the provider if the call took too long, before its
/// inline slot is freed, so that a call waiting for the slot finds the
/// provider quarantined.
struct Watched(Arc<Mutex<Option<Call>>>);

impl Drop for Watched {
    fn drop(&mut self) {
        // Taken out under the lock, dropped once it is let go: freeing a
        // slot wakes a call.
        let call = lock(&self.0).take();
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

    /// Notes that this thread runs a call of `runner` from now, holding
    /// `slot`.
    fn watch(&self, runner: &Arc<StepRunner>, slot: Option<InlineSlot>) -> Watched {
        let entry = THIS_THREAD.with(|entry| {
            entry
                .get_or_init(|| {
                    let entry = Arc::new(Mutex::new(None));
                    lock(&self.threads).push(entry.clone());
                    entry
                })
                .clone()
        });
        *lock(&entry) = Some(Call {
            started: Instant::now(),
            runner: runner.clone(),
            slot,
        });
        Watched(entry)
    }

    /// Wakes the runtime of every inline call running longer than
    /// [`WATCH_EVERY`]; quarantines the provider of every call running past
    /// the budget, and retires the inline slot such a call holds.
    fn inspect(&self) {
        let threads = {
            let mut threads = lock(&self.threads);
            // An entry only this list holds is a thread's that ended (its
            // thread-local went with it): blocking-pool threads come and
            // go, and the list must not grow with them.
            threads.retain(|entry| Arc::strong_count(entry) > 1);
            threads.clone()
        };
        for entry in threads {
            let mut call = lock(&entry);
            let Some(call) = call.as_mut() else {
                continue;
            };
            let took = call.started.elapsed();
            if took > WATCH_EVERY {
                let runtime = (call.slot.as_ref()).and_then(|slot| slot.slots.runtime.get());
                if let Some(runtime) = runtime {
                    runtime.spawn(async {});
                }
            }
            if took <= BUDGET {
                continue;
            }
            // Quarantined before the slot is retired: a call woken by the
            // change finds it so.
            call.runner.quarantine(took);
            if let Some(slot) = call.slot.as_mut() {
                slot.retire();
            }
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

    /// A runtime on this thread alone, as a worker would poll a task.
    fn one_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
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
                    one_thread()
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

    /// A call waiting for a slot on a worker that then gets stuck (in
    /// another call, say) takes no slot with it: a slot freed meanwhile
    /// goes to a call whose worker runs.
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
                one_thread().block_on(async move {
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

    /// A stuck call's slot is retired when the watchdog sees it: the
    /// others run on the blocking pool at once, without waiting for it,
    /// and the slot is back once the call ends.
    #[tokio::test]
    async fn the_slot_of_a_stuck_call_is_retired_until_it_ends() {
        let slots = own_slots(1);
        let stuck = StepRunner::sharing("stuck", slots);
        let (release, holder) = hold_every_slot(&stuck, 1);
        let quick = StepRunner::sharing("quick", slots);
        let started = Instant::now();
        while slots.limit.load(Ordering::SeqCst) > 0 && started.elapsed() < BUDGET * 5 {
            tokio::time::sleep(WATCH_EVERY / 2).await;
        }
        assert!(stuck.is_quarantined(), "quarantined");
        assert_eq!(slots.limit.load(Ordering::SeqCst), 0, "its slot retired");
        let here = std::thread::current().id();
        let waited = Instant::now();
        let ran_on = quick.run(|| std::thread::current().id()).await.unwrap();
        assert_ne!(ran_on, here, "off the worker: no slot is left");
        assert!(waited.elapsed() < PATIENCE, "without waiting for one");
        release.send(()).unwrap();
        for holder in holder {
            holder.join().unwrap();
        }
        assert_eq!(slots.limit.load(Ordering::SeqCst), 1, "back once it ended");
        assert_eq!(slots.taken.load(Ordering::SeqCst), 0);
        let ran_on = quick.run(|| std::thread::current().id()).await.unwrap();
        assert_eq!(ran_on, here, "inline again");
    }

    /// Audit finding: calls that found no inline slot went to the blocking
    /// pool with no bound, so a provider stuck on some input took a thread
    /// per request before its quarantine. Now a provider holds at most
    /// [`MAX_POOLED`] pool threads, quarantined or not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stuck_provider_holds_a_bounded_number_of_threads_before_quarantine() {
        // No inline slot: every call goes to the pool, as when the slots
        // are held.
        let runner = StepRunner::sharing("stuck on some input", own_slots(0));
        let running = Arc::new(AtomicUsize::new(0));
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let calls: Vec<_> = (0..20)
            .map(|_| {
                let (runner, running, released) =
                    (runner.clone(), running.clone(), released.clone());
                tokio::spawn(async move {
                    runner
                        .run(move || {
                            running.fetch_add(1, Ordering::SeqCst);
                            let _ = lock(&released).recv();
                        })
                        .await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!runner.is_quarantined(), "not yet past its budget");
        assert_eq!(
            running.load(Ordering::SeqCst),
            MAX_POOLED,
            "20 calls, {MAX_POOLED} threads"
        );
        for _ in 0..20 {
            release.send(()).unwrap();
        }
        for call in calls {
            assert_eq!(call.await.unwrap(), Ok(()));
        }
        assert_eq!(running.load(Ordering::SeqCst), 20, "each ran in turn");
    }
}
