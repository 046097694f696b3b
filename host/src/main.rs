//! The `socialgate` binary; everything lives in the library (see `lib.rs`).

/// mimalloc: the request path allocates many small, short-lived buffers on
/// several threads, where it does better than glibc's malloc
/// (docs/performance.md). Plugins keep their own allocator: the host
/// copies what a plugin allocated rather than adopting it, so nothing
/// allocated on one side is freed on the other.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    socialgate::cli::main()
}
