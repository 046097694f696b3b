//! The threads that serve the public API: one per core and one more, each
//! with a single-threaded runtime of its own ([`crate::runtime`]) that
//! serves the connections handed to it, each to its end.
//!
//! Why not one runtime with a pool of workers: a request wakes up twice
//! (its head arrives, then its upstream's answer), and a multi-threaded
//! runtime runs each wake-up on whichever worker read the socket, so a
//! request's state moves from core to core and the workers keep waking
//! each other. On two cores that cost about a tenth of a request's CPU
//! (`bench/RESULTS.md`, "What moved it"). Here a connection stays on one thread
//! from its first byte to its last; the threads share only what requests
//! share.
//!
//! Connections are accepted on the control runtime and each handed to the
//! thread with the fewest open, passing over a thread that is in a plugin
//! call for longer than a normal call takes ([`PASS_OVER_AFTER`]): a call
//! that never ends holds its thread, and the connections that thread
//! serves with it. At most one plugin call per core holds an inline slot
//! on these threads ([`crate::resilience::runaway`]), and there is one
//! thread more, so a thread is always free to serve. That one stands by:
//! while the others are free, new connections go to one thread per core,
//! so that threads vying for the slots are rare. When the watchdog sees a
//! call stuck past its budget, its thread is given up: it gets no more
//! connections, a new thread takes its place, the connections still
//! waiting in its inbox are handed to the others, and should its call ever
//! end it finishes what it holds and ends. What is lost with it are the
//! connections it had begun to serve: their state is on its stack.

use std::future::poll_fn;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::api;
use super::server::{self, Accepted, Connections, Listening, StdAccepted};
use crate::resilience::{abandon, runaway};
use crate::state::App;
use crate::sync::{lock, Outstanding};
use crate::write_batch;

/// A thread in a plugin call this long gets no new connection while the
/// call lasts, if another thread is free: calls take microseconds.
pub const PASS_OVER_AFTER: Duration = Duration::from_millis(10);

/// The public listener's acceptor and its serving threads.
pub struct Serving {
    shared: Arc<Shared>,
    acceptor: JoinHandle<()>,
    stopped_accepting: oneshot::Receiver<()>,
}

/// What the acceptor and the serving threads share.
struct Shared {
    listening: Listening,
    /// Fires at shutdown: the acceptor stops, and every thread drains.
    shutdown: CancellationToken,
    app: Arc<App>,
    /// Threads started so far, to number them.
    started: AtomicUsize,
    /// The threads connections may be handed to: not given up, running.
    threads: Mutex<Vec<Arc<Thread>>>,
    /// Threads not yet ended; a given-up thread no longer counts.
    running: Outstanding,
}

/// A serving thread, as the acceptor sees it.
struct Thread {
    /// Where it is handed connections (they wait there until it starts);
    /// dropped, it drains and ends.
    inbox: mpsc::UnboundedSender<StdAccepted>,
    /// The connections waiting in its inbox, which it takes as it can.
    /// Shared, not the thread's own: when it is given up, what it has not
    /// taken is handed to the others instead of being lost with it.
    waiting: Waiting,
    /// Its connections now open.
    open: Arc<AtomicUsize>,
    /// Its plugin calls, to pass it over while it is in a long one; set
    /// once it runs.
    calls: OnceLock<runaway::ThreadCalls>,
}

/// The receiving end of a thread's inbox. Locked only to take what waits
/// (never across an await), so a thread stuck in a plugin call never holds
/// it.
type Waiting = Arc<Mutex<mpsc::UnboundedReceiver<StdAccepted>>>;

impl Serving {
    /// Accepts connections on `listener` on this runtime, and starts
    /// `threads` threads to serve them with the API, until `shutdown`
    /// fires.
    pub fn start(
        listener: TcpListener,
        listening: Listening,
        threads: usize,
        shutdown: CancellationToken,
        app: Arc<App>,
    ) -> io::Result<Serving> {
        let shared = Arc::new(Shared {
            listening,
            shutdown,
            app,
            started: AtomicUsize::new(0),
            threads: Mutex::new(Vec::new()),
            running: Outstanding::new(),
        });
        for _ in 0..threads.max(1) {
            Shared::spawn(&shared)?;
        }
        let (stopped, stopped_accepting) = oneshot::channel();
        let acceptor = {
            let shared = shared.clone();
            tokio::spawn(async move {
                let shutdown = shared.shutdown.clone();
                server::accept(
                    &shared.listening,
                    listener,
                    &shutdown,
                    |accepted| match accepted.into_std() {
                        Ok(accepted) => shared.hand_over(accepted),
                        Err(e) => tracing::debug!("cannot hand over a connection: {e}"),
                    },
                )
                .await;
                let _ = stopped.send(());
                // Every thread's inbox closes: each drains and ends.
                lock(&shared.threads).clear();
            })
        };
        Ok(Serving {
            shared,
            acceptor,
            stopped_accepting,
        })
    }

    /// Waits until the listener is closed (at shutdown): new connections
    /// are refused from then on.
    pub async fn stopped_accepting(&mut self) {
        let _ = (&mut self.stopped_accepting).await;
    }

    /// Waits until every thread ended (their connections drained), for at
    /// most `within` (a thread stuck in a plugin call the watchdog has not
    /// seen yet never does).
    pub async fn finished(self, within: Duration) {
        let _ = self.acceptor.await;
        self.shared.running.none_within(within).await;
    }
}

impl Shared {
    /// Hands `accepted` to the thread with the fewest connections open
    /// among the first one per core not deep in a plugin call (or among
    /// all, if every one is).
    ///
    /// The thread beyond one per core stands by: it gets connections only
    /// while another is passed over. Were it handed its share at all times,
    /// three threads on two cores would vie for the two inline slots, and a
    /// call waiting for one is woken from another thread: 40% of the
    /// throughput of comment pages at 256 connections (bench/RESULTS.md).
    fn hand_over(&self, accepted: StdAccepted) {
        let cores = crate::runtime::cores();
        let threads = lock(&self.threads);
        let free = |thread: &&Arc<Thread>| {
            thread
                .calls
                .get()
                .and_then(runaway::ThreadCalls::in_call_for)
                .is_none_or(|took| took < PASS_OVER_AFTER)
        };
        let fewest = |thread: &&Arc<Thread>| thread.open.load(Ordering::Relaxed);
        let chosen = threads
            .iter()
            .filter(free)
            .take(cores)
            .min_by_key(fewest)
            .or_else(|| threads.iter().min_by_key(fewest));
        let Some(thread) = chosen else {
            // No thread serves (shutting down): the connection is closed.
            return;
        };
        // Sent under the lock `forget` takes: once a thread is forgotten,
        // nothing more arrives in its inbox.
        let _ = thread.inbox.send(accepted.counted_in(&thread.open));
    }

    /// Starts a thread, which connections may be handed to at once; none
    /// once shutdown has begun (`false`).
    fn spawn(shared: &Arc<Shared>) -> io::Result<bool> {
        let number = shared.started.fetch_add(1, Ordering::Relaxed);
        let (inbox, handed) = mpsc::unbounded_channel();
        let handed = Arc::new(Mutex::new(handed));
        let thread = Arc::new(Thread {
            inbox,
            waiting: handed.clone(),
            open: Arc::new(AtomicUsize::new(0)),
            calls: OnceLock::new(),
        });
        let ended = Ended {
            shared: shared.clone(),
            counted: Arc::new(AtomicBool::new(true)),
        };
        {
            let mut threads = lock(&shared.threads);
            // Checked under the lock the acceptor clears the list under, at
            // shutdown, for good: a thread added after would never end.
            if shared.shutdown.is_cancelled() {
                return Ok(false);
            }
            shared.running.add(1);
            threads.push(thread.clone());
        }
        let started = {
            let (shared, thread, ended) = (shared.clone(), thread.clone(), ended.clone());
            std::thread::Builder::new()
                .name(format!("serving-{number}"))
                .spawn(move || {
                    crate::runtime::pin_serving_thread(number);
                    let gone = Gone {
                        shared: shared.clone(),
                        thread: Arc::downgrade(&thread),
                        ended,
                    };
                    shared.serve(thread, handed, &gone.ended);
                })
        };
        if let Err(e) = started {
            shared.forget(&Arc::downgrade(&thread));
            ended.count();
            return Err(e);
        }
        Ok(true)
    }

    /// One serving thread's life: the connections handed to it, until its
    /// inbox closes, then their drain. `thread` is its own entry, held only
    /// to start: it holds the inbox's sender.
    fn serve(self: &Arc<Self>, thread: Arc<Thread>, handed: Waiting, ended: &Ended) {
        let runtime = match crate::runtime::serving() {
            Ok(runtime) => runtime,
            Err(e) => {
                tracing::error!("cannot start a serving thread's runtime: {e}");
                self.forget(&Arc::downgrade(&thread));
                return;
            }
        };
        let stuck = {
            let (shared, ended) = (self.clone(), ended.clone());
            let thread = Arc::downgrade(&thread);
            let unsent = write_batch::Unsent::of_this_thread();
            runaway::when_this_thread_is_stuck(move || {
                // What its connections wrote before the call that holds it.
                if let Some(unsent) = &unsent {
                    unsent.send_now();
                }
                shared.give_up(&thread, &ended)
            })
        };
        let _ = thread.calls.set(stuck.calls());
        drop(thread);
        runtime.block_on(async {
            let app = self.app.clone();
            let connections = Connections::new(
                self.listening.clone(),
                self.shutdown.clone(),
                move |request| {
                    let app = app.clone();
                    async move { api::handle(&app, request).await }
                },
            );
            while let Some(accepted) = poll_fn(|cx| lock(&handed).poll_recv(cx)).await {
                match Accepted::from_std(accepted) {
                    Ok(accepted) => connections.serve(accepted),
                    Err(e) => tracing::debug!("cannot serve a connection handed over: {e}"),
                }
            }
            connections.drain().await;
            // What callers who hung up left running here ends here too.
            abandon::finished(self.app.process.listener.hardening.shutdown_grace).await;
        });
        drop(stuck);
        // Plugin calls of quarantined providers may still hold this
        // runtime's blocking threads: do not wait on them.
        runtime.shutdown_timeout(Duration::from_millis(100));
    }

    /// Hands `thread` no more connections: its inbox closes. `false` when
    /// it was no longer handed any.
    fn forget(&self, thread: &Weak<Thread>) -> bool {
        let mut threads = lock(&self.threads);
        let before = threads.len();
        threads.retain(|other| !std::ptr::eq(Arc::as_ptr(other), thread.as_ptr()));
        threads.len() < before
    }

    /// The watchdog saw a plugin call stuck on `thread`. It gets no more
    /// connections (and ends, should its call ever end); a new thread
    /// serves in its place, unless the server is shutting down; and the
    /// connections waiting in its inbox are handed to the others. Once a
    /// thread: should its call end and a later one stick there too, no
    /// second thread is started for it.
    fn give_up(self: &Arc<Self>, thread: &Weak<Thread>, ended: &Ended) {
        ended.count();
        // Taken before `forget` drops the list's hold on the thread.
        let Some(waiting) = thread.upgrade().map(|thread| thread.waiting.clone()) else {
            return;
        };
        // `false`: given up before, or shutting down.
        if self.forget(thread) {
            match Shared::spawn(self) {
                Ok(false) => {}
                Ok(true) => tracing::warn!(
                    "a serving thread has been in one plugin call for over a second (stuck, or very slow), with the connections it served; a new thread serves in its place, and this one ends when its call does"
                ),
                Err(e) => tracing::error!(
                    "a serving thread has been in one plugin call for over a second (stuck, or very slow), and no thread could be started in its place: {e}"
                ),
            }
        }
        // Forgotten, it is sent nothing more: what waits is all there is.
        // At shutdown no thread is left to take them, and they are closed.
        let mut handed_again = 0;
        loop {
            let next = lock(&waiting).try_recv();
            let Ok(accepted) = next else { break };
            self.hand_over(accepted);
            handed_again += 1;
        }
        if handed_again > 0 {
            tracing::warn!(
                connections = handed_again,
                "connections waiting for the stuck serving thread are handed to the others"
            );
        }
    }
}

/// A serving thread's end, also should it unwind: it is handed no more
/// connections (the acceptor would otherwise keep choosing it, with none
/// open) and counted as ended.
struct Gone {
    shared: Arc<Shared>,
    thread: Weak<Thread>,
    ended: Ended,
}

impl Drop for Gone {
    fn drop(&mut self) {
        self.shared.forget(&self.thread);
        self.ended.count();
    }
}

/// Says a thread ended, once: when it ends, or when it is given up.
#[derive(Clone)]
struct Ended {
    shared: Arc<Shared>,
    counted: Arc<AtomicBool>,
}

impl Ended {
    fn count(&self) {
        if self.counted.swap(false, Ordering::Relaxed) {
            self.shared.running.done(1);
        }
    }
}
