//! The `socialgate` binary; everything lives in the library (see `lib.rs`).

/// mimalloc: the request path allocates many small, short-lived buffers on
/// several threads, where it costs less CPU and memory than glibc's malloc
/// (docs/performance.md). Plugins keep their own allocator: the host
/// copies what a plugin allocated rather than adopting it, so nothing
/// allocated on one side is freed on the other.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_arena_eager_commit` (4 in mimalloc's `mi_option_e`).
const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

/// Commits arena memory as it is used, not in advance: eagerly committed
/// arenas keep freed pages counted in the process's RSS, about twice the
/// memory per connection under load (docs/performance.md). It must be set
/// before mimalloc reserves its first arena, which happens before `main`:
/// so it runs as an ELF constructor, as `MIMALLOC_ARENA_EAGER_COMMIT=0`
/// in the environment would.
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array.00099")]
static LAZY_ARENA_COMMIT: extern "C" fn() = {
    extern "C" fn lazy_arena_commit() {
        // SAFETY: a plain write of an option, before any other thread runs.
        unsafe { libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0) };
    }
    lazy_arena_commit
};

fn main() -> std::process::ExitCode {
    socialgate::cli::main()
}
