//! The process's one runtime: a tokio multi-thread runtime that serves
//! every listener and runs what the process does for itself (reloads,
//! signals, the shared store's connection, shutdown).

use tokio::runtime::{Builder, Runtime};

/// The runtime's workers: one per core, and never fewer than two, so that a
/// plugin call stuck on one worker leaves another to serve
/// ([`crate::resilience::runaway`] lets calls run inline on all workers but
/// one).
pub fn workers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .max(2)
}

/// The runtime, with its [`workers`].
pub fn build() -> std::io::Result<Runtime> {
    Builder::new_multi_thread()
        .worker_threads(workers())
        .thread_name("worker")
        .enable_all()
        .build()
}
