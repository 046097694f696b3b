//! Locks whose data a panic cannot tear.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex` whether or not a thread panicked holding it. For the
/// locks of this crate that guard plain values (a map, counters, a swap),
/// which every critical section leaves whole: a panic elsewhere must not
/// make them unusable for the rest of the process.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
