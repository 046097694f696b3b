//! A serving thread's socket writes, sent together once per turn of its
//! runtime, in one `io_uring` submission.
//!
//! Why: each `writev` of an answer (or `send` of an upstream request) wakes
//! the peer waiting for it, wrk or the upstream, and on a busy machine the
//! woken peer takes the writer's core at the return from that system call,
//! so a thread with 16 answers ready switched out and back up to 16 times.
//! Sent in one submission, the peers are woken during one system call, the
//! thread switches once, and each peer finds a batch to read
//! (bench/RESULTS.md, "batched writes", has the measurements).
//!
//! How: [`Batched`] wraps a socket. Its writes copy into the connection's
//! outbox and report success; the outbox joins this thread's queue, which
//! a task of the serving runtime sends when the runtime gets to it: after
//! the tasks that were ready before it, so everything they wrote goes in
//! the same submission. What the kernel did not take (a client not
//! reading) the connection writes itself, with tokio's readiness, as it
//! would without the queue. A flush reports success when every byte is
//! sent ([`Flushed`]), so hyper's timers and the write timeout see what
//! they saw before; the upstream client, which reads the answer next under
//! its own deadline, counts a flush done once its request is queued.
//!
//! Every send is `MSG_DONTWAIT`, so it completes within its submission,
//! never parked in the kernel on a full socket; [`Ring::new`] checks that
//! the kernel does so before any connection uses it. Where there is no
//! `io_uring` (another OS, a kernel or sandbox without it, a runtime that
//! is not a serving thread's), [`Batched`] passes every call straight
//! through. `SOCIALGATE_BATCH_WRITES=0` turns it off, for comparison.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::sync::lock;

/// Writes this large into an empty outbox go straight to the socket: the
/// copy would cost more than the batch saves, and an outbox never holds
/// more than this (a write past it waits for the queue).
const OUTBOX_LIMIT: usize = 64 * 1024;

/// Whether `SOCIALGATE_BATCH_WRITES` leaves batching on (anything but `0`).
fn enabled() -> bool {
    std::env::var("SOCIALGATE_BATCH_WRITES").map_or(true, |v| v != "0")
}

/// One connection's bytes written and not yet sent.
struct Outbox {
    /// The socket; -1 once its connection is gone, so the queue skips it.
    fd: i32,
    bytes: Vec<u8>,
    /// How much of `bytes` the kernel has taken.
    sent: usize,
    /// In a queue, to be sent on this turn.
    queued: bool,
    /// The queue left bytes unsent: the connection writes them itself.
    direct: bool,
    /// A flush, a shutdown or a write past [`OUTBOX_LIMIT`] waits for the
    /// queue.
    wake_when_sent: bool,
    error: Option<io::Error>,
    /// The task that last used the connection, woken when the queue needs
    /// it to act.
    waker: Option<Waker>,
}

impl Outbox {
    fn unsent(&self) -> &[u8] {
        &self.bytes[self.sent..]
    }

    /// Records what the kernel took of the unsent bytes; forgets them all,
    /// with their memory (most connections sit idle between answers),
    /// once every byte is sent.
    fn took(&mut self, n: usize) {
        self.sent += n;
        if self.sent >= self.bytes.len() {
            self.bytes = Vec::new();
            self.sent = 0;
        }
    }

    fn remember(&mut self, cx: &Context<'_>) {
        remember(&mut self.waker, cx);
    }

    fn wake(&mut self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }
}

/// Keeps `cx`'s waker in `slot`, cloning it only when it is another.
fn remember(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(waker) if waker.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

type SharedOutbox = Arc<Mutex<Outbox>>;

/// A serving thread's queue. Shared, behind locks no other thread takes
/// in normal running, so that the watchdog can send it for a thread stuck
/// in a plugin call ([`Unsent`]): what that thread's other connections
/// wrote before the call are answers their callers are owed.
struct Queue {
    /// Taken before any outbox's lock, and never while `waiting` is.
    ring: Mutex<Ring>,
    /// Taken after an outbox's (a write queues its outbox), and held only
    /// for a push or a swap.
    waiting: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    outboxes: Vec<SharedOutbox>,
    /// The flusher, parked until an outbox is queued.
    flusher: Option<Waker>,
}

thread_local! {
    /// This thread's queue, while its runtime's flusher runs.
    static QUEUE: RefCell<Option<Arc<Queue>>> = const { RefCell::new(None) };
}

/// Sets this thread up to batch its sockets' writes, sent by a task of
/// `runtime`: the thread's own current-thread runtime, whose tasks all run
/// here. Does nothing where the thread cannot have a ring, or when
/// `SOCIALGATE_BATCH_WRITES=0`.
pub fn start_on_this_thread(runtime: &tokio::runtime::Runtime) {
    if !enabled() {
        say_once(|| {
            tracing::info!("socket writes: each its own system call (SOCIALGATE_BATCH_WRITES=0)")
        });
        return;
    }
    let ring = match Ring::new() {
        Ok(ring) => ring,
        Err(e) => {
            say_once(|| tracing::info!("socket writes: each its own system call ({e})"));
            return;
        }
    };
    say_once(|| {
        tracing::info!("socket writes: a serving thread's of one turn in one io_uring submission")
    });
    let queue = Arc::new(Queue {
        ring: Mutex::new(ring),
        waiting: Mutex::new(Waiting::default()),
    });
    QUEUE.with(|this| *this.borrow_mut() = Some(queue.clone()));
    runtime.spawn(flush_each_turn(queue));
}

/// Runs `say` the first time the process calls it: the serving threads
/// all find the same kernel, and an operator wants to be told once.
fn say_once(say: impl FnOnce()) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(say);
}

/// Sends `queue` once a turn, for as long as its runtime runs.
async fn flush_each_turn(queue: Arc<Queue>) {
    let _ended = Ended(queue.clone());
    loop {
        std::future::poll_fn(|cx| {
            let mut waiting = lock(&queue.waiting);
            if !waiting.outboxes.is_empty() {
                return Poll::Ready(());
            }
            remember(&mut waiting.flusher, cx);
            Poll::Pending
        })
        .await;
        queue.send();
    }
}

/// Takes the queue down with its runtime: the outboxes still in it are
/// left to their connections to write.
struct Ended(Arc<Queue>);

impl Drop for Ended {
    fn drop(&mut self) {
        // `try_with`: the runtime may be dropped as its thread ends.
        let _ = QUEUE.try_with(|this| {
            let mut this = this.borrow_mut();
            if this
                .as_ref()
                .is_some_and(|queue| Arc::ptr_eq(queue, &self.0))
            {
                *this = None;
            }
        });
        let left = std::mem::take(&mut lock(&self.0.waiting).outboxes);
        for outbox in left {
            let mut outbox = lock(&outbox);
            outbox.queued = false;
            outbox.direct = true;
            outbox.wake();
        }
    }
}

impl Queue {
    /// Sends every waiting outbox, as many a submission as the ring holds.
    fn send(&self) {
        let mut ring = lock(&self.ring);
        let waiting = std::mem::take(&mut lock(&self.waiting).outboxes);
        for group in waiting.chunks(Ring::ENTRIES as usize) {
            let mut outboxes: Vec<MutexGuard<'_, Outbox>> = group.iter().map(|o| lock(o)).collect();
            // Locked until their sends completed: a connection dropped
            // meanwhile (on another thread) waits to close its socket.
            let results = ring.send_all(outboxes.iter().map(|o| (o.fd, o.unsent())));
            for (outbox, result) in outboxes.iter_mut().zip(results) {
                outbox.queued = false;
                match result {
                    Ok(n) => outbox.took(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => outbox.error = Some(e),
                }
                if outbox.fd >= 0 && (outbox.sent < outbox.bytes.len() || outbox.error.is_some()) {
                    outbox.direct = true;
                    outbox.wake_when_sent = false;
                    outbox.wake();
                } else if std::mem::take(&mut outbox.wake_when_sent) {
                    outbox.wake();
                }
            }
        }
        // Its allocation back, for the next turn.
        let mut waiting = waiting;
        waiting.clear();
        let mut now = lock(&self.waiting);
        if now.outboxes.is_empty() {
            now.outboxes = waiting;
        }
    }
}

/// Puts `outbox` in this thread's queue; false when the thread has none.
fn enqueue(outbox: &SharedOutbox) -> bool {
    QUEUE.with(|this| {
        let this = this.borrow();
        let Some(queue) = this.as_ref() else {
            return false;
        };
        let mut waiting = lock(&queue.waiting);
        waiting.outboxes.push(outbox.clone());
        if waiting.outboxes.len() == 1 {
            if let Some(flusher) = waiting.flusher.take() {
                flusher.wake();
            }
        }
        true
    })
}

/// A serving thread's queue, for another thread to send it.
#[derive(Clone)]
pub struct Unsent(Arc<Queue>);

impl Unsent {
    /// This thread's queue, if it has one.
    pub fn of_this_thread() -> Option<Unsent> {
        QUEUE.with(|this| this.borrow().clone().map(Unsent))
    }

    /// Sends what the thread's connections have queued, now, from the
    /// calling thread: for a thread held by a call that may never return.
    pub fn send_now(&self) {
        self.0.send();
    }
}

/// When a flush of a [`Batched`] socket reports success.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Flushed {
    /// When the kernel has taken every byte: what hyper's header timer,
    /// the write timeout and HTTP/2's activity watch take a flush to mean.
    /// An answer costs its task one more poll, after the queue sent it.
    WhenSent,
    /// As soon as the bytes are queued: for a caller that reads the answer
    /// next, within a deadline of its own; what the queue leaves unsent is
    /// written before each read.
    WhenQueued,
}

/// A socket whose writes join its thread's queue (see the module's doc).
pub struct Batched<T> {
    io: T,
    /// `None` where the thread has no queue: every call passes through.
    outbox: Option<SharedOutbox>,
    flushed: Flushed,
}

impl<T: AsRawSocket> Batched<T> {
    pub fn new(io: T, flushed: Flushed) -> Batched<T> {
        let batching = QUEUE.with(|this| this.borrow().is_some());
        let outbox = batching.then(|| {
            Arc::new(Mutex::new(Outbox {
                fd: io.raw_socket(),
                bytes: Vec::new(),
                sent: 0,
                queued: false,
                direct: false,
                wake_when_sent: false,
                error: None,
                waker: None,
            }))
        });
        Batched {
            io,
            outbox,
            flushed,
        }
    }
}

/// A socket's descriptor, under whatever wraps it.
pub trait AsRawSocket {
    fn raw_socket(&self) -> i32;
}

#[cfg(unix)]
impl AsRawSocket for tokio::net::TcpStream {
    fn raw_socket(&self) -> i32 {
        std::os::fd::AsRawFd::as_raw_fd(self)
    }
}

#[cfg(not(unix))]
impl AsRawSocket for tokio::net::TcpStream {
    fn raw_socket(&self) -> i32 {
        -1
    }
}

impl<T> Drop for Batched<T> {
    /// Makes one last try to send what is unsent, as the write the caller
    /// was told had happened would have, before the socket closes.
    fn drop(&mut self) {
        if let Some(outbox) = &self.outbox {
            let mut outbox = lock(outbox);
            if !outbox.unsent().is_empty() {
                let _ = sys::send_now(outbox.fd, outbox.unsent());
            }
            outbox.fd = -1;
            outbox.bytes = Vec::new();
            outbox.waker = None;
        }
    }
}

impl<T: AsyncWrite + Unpin> Batched<T> {
    /// Writes what the queue could not send, and reports its error.
    fn poll_unsent(io: &mut T, outbox: &mut Outbox, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = outbox.error.take() {
            return Poll::Ready(Err(e));
        }
        if !outbox.direct {
            return Poll::Ready(Ok(()));
        }
        while !outbox.unsent().is_empty() {
            match Pin::new(&mut *io).poll_write(cx, outbox.unsent()) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => outbox.took(n),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        outbox.direct = false;
        Poll::Ready(Ok(()))
    }

    /// Waits until the queue has sent the outbox, then writes what it left.
    fn poll_sent(io: &mut T, outbox: &mut Outbox, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if outbox.queued {
            outbox.remember(cx);
            outbox.wake_when_sent = true;
            return Poll::Pending;
        }
        Batched::poll_unsent(io, outbox, cx)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Batched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(outbox) = &this.outbox {
            let mut outbox = lock(outbox);
            if outbox.queued || outbox.direct {
                // The task to wake if the queue leaves bytes unsent.
                outbox.remember(cx);
            }
            // The bytes the peer waits for before it says more.
            if let Poll::Ready(Err(e)) = Batched::poll_unsent(&mut this.io, &mut outbox, cx) {
                return Poll::Ready(Err(e));
            }
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Batched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(shared) = &this.outbox else {
            return Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        };
        let mut outbox = lock(shared);
        std::task::ready!(Batched::poll_unsent(&mut this.io, &mut outbox, cx))?;
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if outbox.unsent().is_empty() && len >= OUTBOX_LIMIT {
            return Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        }
        if outbox.queued && outbox.unsent().len() + len > OUTBOX_LIMIT {
            // Full: on once the queue has sent it.
            outbox.remember(cx);
            outbox.wake_when_sent = true;
            return Poll::Pending;
        }
        outbox.bytes.reserve(len);
        for buf in bufs {
            outbox.bytes.extend_from_slice(buf);
        }
        outbox.remember(cx);
        if !outbox.queued && len > 0 {
            if enqueue(shared) {
                outbox.queued = true;
            } else {
                // The queue is gone (its runtime is shutting down).
                outbox.direct = true;
            }
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(outbox) = &this.outbox {
            let mut outbox = lock(outbox);
            match this.flushed {
                Flushed::WhenSent => {
                    std::task::ready!(Batched::poll_sent(&mut this.io, &mut outbox, cx))?;
                }
                Flushed::WhenQueued => {
                    std::task::ready!(Batched::poll_unsent(&mut this.io, &mut outbox, cx))?;
                }
            }
        }
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(outbox) = &this.outbox {
            let mut outbox = lock(outbox);
            std::task::ready!(Batched::poll_sent(&mut this.io, &mut outbox, cx))?;
        }
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

pub use sys::Ring;

#[cfg(target_os = "linux")]
mod sys {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use io_uring::{opcode, squeue, types, IoUring};

    const FLAGS: i32 = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
    /// `IORING_ENTER_GETEVENTS`: wait for completions.
    const GETEVENTS: u32 = 1;
    /// Submissions tried before the ring is given up for good.
    const TRIES: usize = 8;

    /// A thread's `io_uring`, for sends that complete within their
    /// submission.
    pub struct Ring {
        ring: IoUring,
        /// Numbers each submission, so that a completion can never be
        /// taken for another's.
        round: u32,
        /// The kernel stopped taking submissions: entries it did not take
        /// are still in the ring, and a later submission would send them
        /// after their bytes were freed. So there is none: every send is
        /// left to its connection.
        broken: bool,
    }

    impl Ring {
        pub const ENTRIES: u32 = 256;

        /// A ring, if this kernel lets us have one and completes a
        /// `MSG_DONTWAIT` send that cannot go through at once with
        /// `EAGAIN` in its submission, rather than waiting for room.
        pub fn new() -> io::Result<Ring> {
            let ring = IoUring::new(Ring::ENTRIES)?;
            // Spares the kernel a descriptor lookup a submission, where
            // it can (Linux 5.18 and later).
            let _ = ring.submitter().register_ring_fd();
            let mut ring = Ring {
                ring,
                round: 0,
                broken: false,
            };
            let (full, _peer) = full_socket()?;
            // Static: were the kernel to keep the send, it reads from here
            // until the ring is closed.
            static PROBE: [u8; 4096] = [0; 4096];
            let entry = send(full.as_raw_fd(), &PROBE);
            // SAFETY: the bytes are static.
            unsafe { ring.ring.submission().push(&entry) }
                .map_err(|_| io::Error::other("a new ring has no room"))?;
            ring.ring.submit()?;
            let probed = ring.ring.completion().next().map(|done| done.result());
            match probed {
                Some(result) if result == -libc::EAGAIN => Ok(ring),
                _ => Err(io::Error::other(
                    "the kernel's io_uring would wait to send on a full socket",
                )),
            }
        }

        /// Sends each `(socket, bytes)` (a negative socket is skipped) in
        /// one submission; what each send took, in the same order
        /// (`WouldBlock` for a send not made).
        pub fn send_all<'a>(
            &mut self,
            sends: impl Iterator<Item = (i32, &'a [u8])>,
        ) -> Vec<io::Result<usize>> {
            let not_made = || Err(io::ErrorKind::WouldBlock.into());
            self.round = self.round.wrapping_add(1);
            let mut results = Vec::new();
            let mut pushed = 0;
            {
                let mut queue = self.ring.submission();
                for (i, (fd, bytes)) in sends.enumerate() {
                    results.push(Ok(0));
                    if fd < 0 || bytes.is_empty() {
                        continue;
                    }
                    results[i] = not_made();
                    if self.broken {
                        continue;
                    }
                    let entry = send(fd, bytes).user_data((u64::from(self.round) << 32) | i as u64);
                    // SAFETY: `bytes` outlives the send: the kernel takes
                    // every entry before this returns (or the ring is
                    // broken, and no later submission takes it), and each
                    // completes within its submission (`Ring::new` checked)
                    // or is waited for below.
                    if unsafe { queue.push(&entry) }.is_ok() {
                        pushed += 1;
                    }
                }
            }
            if pushed == 0 {
                return results;
            }
            #[cfg(test)]
            super::tests::SUBMITTED.with(|s| s.set((s.get().0 + 1, s.get().1 + pushed)));
            let mut taken = 0;
            for _ in 0..TRIES {
                match self.ring.submit() {
                    Ok(n) => taken += n,
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                        ) => {}
                    Err(e) => {
                        tracing::warn!("io_uring refused a submission: {e}");
                        break;
                    }
                }
                if taken >= pushed {
                    break;
                }
            }
            if taken < pushed {
                self.broken = true;
                tracing::warn!("io_uring stopped taking sends: this thread's connections write for themselves from now on");
            }
            let mut completed = 0;
            while completed < taken {
                for completion in self.ring.completion() {
                    let tag = completion.user_data();
                    if (tag >> 32) as u32 != self.round {
                        continue;
                    }
                    let Some(result) = results.get_mut(tag as u32 as usize) else {
                        continue;
                    };
                    completed += 1;
                    let n = completion.result();
                    *result = if n >= 0 {
                        Ok(n as usize)
                    } else {
                        Err(io::Error::from_raw_os_error(-n))
                    };
                }
                if completed < taken {
                    // Not expected (`Ring::new` checked): wait rather than
                    // free bytes a send may still read. Submits nothing.
                    // SAFETY: no argument is passed.
                    let waited = unsafe {
                        self.ring.submitter().enter::<libc::sigset_t>(
                            0,
                            (taken - completed) as u32,
                            GETEVENTS,
                            None,
                        )
                    };
                    if let Err(e) = waited {
                        if e.raw_os_error() != Some(libc::EINTR) {
                            // Neither wait nor return is safe: the bytes
                            // would be freed under a send in progress.
                            tracing::error!("io_uring cannot wait for its sends: {e}");
                            std::process::abort();
                        }
                    }
                }
            }
            results
        }
    }

    /// A `MSG_DONTWAIT` send of `bytes` (at most 4 GiB of them) to `fd`.
    fn send(fd: i32, bytes: &[u8]) -> squeue::Entry {
        let len = bytes.len().min(u32::MAX as usize) as u32;
        opcode::Send::new(types::Fd(fd), bytes.as_ptr(), len)
            .flags(FLAGS)
            .build()
    }

    /// A socket whose peer reads nothing, filled until a send would block.
    fn full_socket() -> io::Result<(OwnedFd, OwnedFd)> {
        let mut fds = [0; 2];
        let kind = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
        // SAFETY: `fds` has room for the two descriptors it writes.
        if unsafe { libc::socketpair(libc::AF_UNIX, kind, 0, fds.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both were just opened, and are owned by nothing else.
        let (full, peer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let chunk = [0u8; 4096];
        // Bounded: a socket's buffer is at most a few MiB.
        for _ in 0..4096 {
            if send_now(full.as_raw_fd(), &chunk).is_err() {
                return Ok((full, peer));
            }
        }
        Err(io::Error::other("could not fill a socket"))
    }

    /// One non-blocking `send`.
    pub fn send_now(fd: i32, bytes: &[u8]) -> io::Result<usize> {
        // SAFETY: `bytes` is valid for its length; a closed or foreign
        // descriptor only makes the call fail.
        let n = unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), FLAGS) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::io;

    /// No `io_uring` here: [`super::Batched`] passes writes through.
    pub struct Ring;

    impl Ring {
        pub const ENTRIES: u32 = 1;

        pub fn new() -> io::Result<Ring> {
            Err(io::Error::other("io_uring is Linux's"))
        }

        pub fn send_all<'a>(
            &mut self,
            _sends: impl Iterator<Item = (i32, &'a [u8])>,
        ) -> Vec<io::Result<usize>> {
            Vec::new()
        }
    }

    pub fn send_now(_fd: i32, _bytes: &[u8]) -> io::Result<usize> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    thread_local! {
        /// Submissions and the sends in them, on this thread.
        pub(super) static SUBMITTED: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    }

    /// Runs `test` on a runtime set up as a serving thread's is.
    fn on_a_serving_thread<F: std::future::Future<Output = ()>>(test: F) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        start_on_this_thread(&runtime);
        assert!(
            Unsent::of_this_thread().is_some(),
            "this kernel gives no io_uring that sends without waiting: {:?}",
            Ring::new().err()
        );
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), test)
                .await
                .expect("the test finished in time");
        });
    }

    /// `n` connected pairs: the server's side batched, the client's plain.
    async fn pairs(n: usize, flushed: Flushed) -> Vec<(Batched<TcpStream>, TcpStream)> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut pairs = Vec::new();
        for _ in 0..n {
            let client = TcpStream::connect(address).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            pairs.push((Batched::new(server, flushed), client));
        }
        pairs
    }

    async fn read_to_end(mut client: TcpStream) -> Vec<u8> {
        let mut bytes = Vec::new();
        client.read_to_end(&mut bytes).await.unwrap();
        bytes
    }

    fn submitted() -> (usize, usize) {
        SUBMITTED.with(Cell::get)
    }

    #[test]
    fn answers_written_in_one_turn_go_out_in_one_submission_each_to_its_own_peer() {
        on_a_serving_thread(async {
            let (mut servers, clients): (Vec<_>, Vec<_>) =
                pairs(8, Flushed::WhenSent).await.into_iter().unzip();
            let before = submitted();
            for (i, server) in servers.iter_mut().enumerate() {
                assert!(server.outbox.is_some(), "the write is batched");
                server
                    .write_all(format!("answer {i}\n").as_bytes())
                    .await
                    .unwrap();
            }
            for server in &mut servers {
                server.flush().await.unwrap();
            }
            let after = submitted();
            assert_eq!((after.0 - before.0, after.1 - before.1), (1, 8));
            for (i, client) in clients.iter().enumerate() {
                // Flushed means in the peer's socket: read without waiting.
                let mut got = [0u8; 64];
                let n = client.try_read(&mut got).unwrap();
                assert_eq!(&got[..n], format!("answer {i}\n").as_bytes());
            }
        });
    }

    #[test]
    fn a_flush_when_queued_returns_before_the_send_and_the_bytes_follow() {
        on_a_serving_thread(async {
            let (mut server, mut client) = pairs(1, Flushed::WhenQueued).await.pop().unwrap();
            server.write_all(b"request").await.unwrap();
            server.flush().await.unwrap();
            let mut got = [0u8; 7];
            let early = client.try_read(&mut got);
            assert!(
                matches!(&early, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
                "{early:?}"
            );
            client.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"request");
        });
    }

    #[test]
    fn what_a_full_socket_cannot_take_is_written_later_in_order_and_shutdown_waits_for_it() {
        on_a_serving_thread(async {
            let (mut server, client) = pairs(1, Flushed::WhenSent).await.pop().unwrap();
            // Past every socket buffer: most of it waits for the reader.
            let data: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
            let reader = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                read_to_end(client).await
            });
            let before = submitted();
            for piece in data[..4 * 1024 * 1024].chunks(3000) {
                server.write_all(piece).await.unwrap();
            }
            assert!(submitted().0 > before.0, "the small writes were batched");
            server.flush().await.unwrap();
            // A large write to an empty outbox goes straight to the socket.
            let half = 4 * 1024 * 1024;
            let direct = submitted();
            let n = server
                .write(&data[half..half + OUTBOX_LIMIT])
                .await
                .unwrap();
            assert_eq!(submitted(), direct, "the large write was not queued");
            for piece in data[half + n..].chunks(3000) {
                server.write_all(piece).await.unwrap();
            }
            server.shutdown().await.unwrap();
            assert!(reader.await.unwrap() == data, "every byte, in order");
        });
    }

    #[test]
    fn bytes_written_just_before_the_connection_is_dropped_still_go_out() {
        on_a_serving_thread(async {
            let (mut server, client) = pairs(1, Flushed::WhenQueued).await.pop().unwrap();
            server.write_all(b"last words").await.unwrap();
            server.flush().await.unwrap();
            drop(server);
            assert_eq!(read_to_end(client).await, b"last words");
        });
    }

    #[test]
    fn a_peer_that_reset_the_connection_fails_the_writes_after_it() {
        on_a_serving_thread(async {
            let (mut server, client) = pairs(1, Flushed::WhenQueued).await.pop().unwrap();
            client.set_zero_linger().unwrap();
            drop(client);
            let mut failed = None;
            for _ in 0..50 {
                let written = async {
                    server.write_all(b"anyone there?").await?;
                    server.flush().await
                };
                if let Err(e) = written.await {
                    failed = Some(e);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let e = failed.expect("a write fails");
            assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                ),
                "{e}"
            );
        });
    }

    #[test]
    fn what_a_thread_held_in_a_call_had_queued_is_sent_by_another_thread() {
        use std::io::Read;

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let (queued, queue) = std::sync::mpsc::channel();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let serving = std::thread::spawn(move || {
            let runtime = crate::runtime::serving().unwrap();
            runtime.block_on(async move {
                let stream = TcpStream::from_std(server).unwrap();
                let mut server = Batched::new(stream, Flushed::WhenQueued);
                server.write_all(b"answered before the call").await.unwrap();
                server.flush().await.unwrap();
                queued.send(Unsent::of_this_thread()).unwrap();
                // A plugin call that does not return: this turn never ends.
                let _ = held.recv_timeout(Duration::from_secs(20));
                drop(server);
            });
        });
        let unsent = queue.recv().unwrap().expect("serving threads batch");
        client
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut byte = [0u8; 1];
        let early = client.read(&mut byte);
        assert!(
            matches!(&early, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            "nothing is sent while the thread is held: {early:?}"
        );
        unsent.send_now();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut got = vec![0u8; b"answered before the call".len()];
        client.read_exact(&mut got).unwrap();
        assert_eq!(got, b"answered before the call");
        release.send(()).unwrap();
        serving.join().unwrap();
    }

    #[tokio::test]
    async fn off_a_serving_thread_writes_pass_straight_through() {
        let (mut server, client) = pairs(1, Flushed::WhenSent).await.pop().unwrap();
        assert!(server.outbox.is_none());
        server.write_all(b"unbatched").await.unwrap();
        server.shutdown().await.unwrap();
        drop(server);
        assert_eq!(read_to_end(client).await, b"unbatched");
    }
}
