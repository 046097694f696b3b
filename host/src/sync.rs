//! Locks whose data a panic cannot tear, and counts of work under way
//! that shutdown waits on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Locks `mutex` whether or not a thread panicked holding it. For the
/// locks of this crate that guard plain values (a map, counters, a swap),
/// which every critical section leaves whole: a panic elsewhere must not
/// make them unusable for the rest of the process.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Work under way, counted, so that shutdown can wait (a bounded while)
/// for it to end before what it would still change is written out.
#[derive(Default)]
pub struct Outstanding(AtomicUsize);

impl Outstanding {
    pub const fn new() -> Outstanding {
        Outstanding(AtomicUsize::new(0))
    }

    /// `n` more pieces of work under way.
    pub fn add(&self, n: usize) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` pieces of work ended (or will never run).
    pub fn done(&self, n: usize) {
        self.0.fetch_sub(n, Ordering::Relaxed);
    }

    /// Waits until no work is under way, for at most `within`.
    pub async fn none_within(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.0.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
