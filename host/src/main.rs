//! The `socialgate` binary; everything lives in the library (see `lib.rs`).

/// mimalloc: the request path allocates many small, short-lived buffers on
/// several threads, where glibc's malloc spent about an eighth of the
/// server's CPU time (see README, "Measured behaviour"). Plugins keep their
/// own allocator: nothing allocated on one side is freed on the other.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    socialgate::cli::main()
}
