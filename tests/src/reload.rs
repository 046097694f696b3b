//! Changing a running server's files the way an operator does, and watching
//! it react: files replaced atomically (a temporary file renamed into place),
//! plugin library copies that differ by appended bytes, bounded polls, the
//! reload lines of the server's log, and the process's memory. (SIGHUP is
//! [`crate::operator::signal`].)

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::paths;
use crate::process::Server;

/// How long a test waits for a change to apply. The service promises about
/// a second; the rest is slack for a loaded machine.
pub const RELOAD_WAIT: Duration = Duration::from_secs(5);

/// How often a bounded poll looks.
pub const POLL_EVERY: Duration = Duration::from_millis(100);

/// What the server logs when a reload is applied.
pub const APPLIED: &str = "reload applied";

/// What the server logs when a reload is rejected; the reason follows.
pub const REJECTED: &str = "reload rejected";

static TEMP_FILES: AtomicUsize = AtomicUsize::new(0);

/// Replaces `path` with `bytes` the way an operator should: a temporary file
/// in the same folder, renamed into place, so the server never reads a
/// half-written file. The folder is created if missing.
pub fn replace_file(path: &Path, bytes: impl AsRef<[u8]>) {
    let dir = path.parent().expect("a file has a folder");
    std::fs::create_dir_all(dir).expect("can create the folder");
    let name = path
        .file_name()
        .expect("a file has a name")
        .to_string_lossy();
    let n = TEMP_FILES.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes).expect("can write the temporary file");
    std::fs::rename(&tmp, path).expect("can rename the temporary file into place");
}

/// Puts a copy of the built plugin library `name` (`shortvideo_fallback`)
/// at `dest` with `extra` bytes appended. Appended bytes change the content
/// hash and nothing else, so each distinct `extra` is a distinct library to
/// the server.
pub fn library_copy(name: &str, dest: &Path, extra: &[u8]) {
    paths::require_plugin(name);
    let mut bytes = std::fs::read(paths::plugin_library(name)).expect("can read the library");
    bytes.extend_from_slice(extra);
    replace_file(dest, bytes);
}

/// Polls `check` every [`POLL_EVERY`] until it holds, for at most
/// [`RELOAD_WAIT`]; returns how long it took. Panics naming `what`.
pub async fn wait_until<F, Fut>(what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < RELOAD_WAIT,
            "{what}: not within {RELOAD_WAIT:?}"
        );
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// The server's stderr lines that contain `needle`, in order.
pub fn log_lines(server: &Server, needle: &str) -> Vec<String> {
    server
        .stderr()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// Waits until the server has logged `count` lines containing `needle`
/// (counted from its start) and returns the last of them.
pub async fn wait_for_log(server: &Server, needle: &str, count: usize) -> String {
    let what = format!("the server logging {needle:?} {count} time(s)");
    wait_until(&what, || async { log_lines(server, needle).len() >= count }).await;
    log_lines(server, needle)
        .pop()
        .expect("at least one line was seen")
}

/// Waits until the server reacts to changes of its files, and returns how
/// many reloads it has applied by then (at least one). Call it before the
/// first change a test makes.
///
/// The server starts watching its files only some time after it prints its
/// `listening on` line (its reloader task sets the watches up), and a change
/// made in between is never applied. So this rewrites the config with its
/// own text until a reload is applied, then waits for the log to settle.
pub async fn await_watching(server: &Server, config: &Config) -> usize {
    let start = Instant::now();
    let before = log_lines(server, APPLIED).len();
    let text = config.text();
    let mut rewrites = 0;
    'rewrite: loop {
        assert!(
            start.elapsed() < RELOAD_WAIT,
            "the server applied no reload of its own config within {RELOAD_WAIT:?}"
        );
        replace_file(config.path(), &text);
        rewrites += 1;
        let attempt = Instant::now();
        while attempt.elapsed() < Duration::from_millis(1500) {
            tokio::time::sleep(POLL_EVERY).await;
            if log_lines(server, APPLIED).len() > before {
                break 'rewrite;
            }
        }
    }
    let mut count = log_lines(server, APPLIED).len();
    if rewrites == 1 {
        return count;
    }
    // An earlier rewrite may have been seen late and still be applying:
    // wait until the count holds.
    loop {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let now = log_lines(server, APPLIED).len();
        if now == count {
            return count;
        }
        count = now;
    }
}

/// The resident memory of a process, from `/proc/<pid>/status`, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// `VmSize`: everything mapped, resident or not.
    pub size: u64,
    /// `VmRSS`: everything resident.
    pub rss: u64,
    /// `RssAnon`: heap, stacks, anonymous mappings.
    pub anon: u64,
    /// `RssFile`: resident pages of mapped files (libraries).
    pub file: u64,
}

impl Memory {
    /// Reads the process's figures now (Linux only).
    pub fn of(pid: u32) -> Memory {
        let path = PathBuf::from(format!("/proc/{pid}/status"));
        let status = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().strip_suffix("kB"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {}", path.display()))
        };
        Memory {
            size: field("VmSize"),
            rss: field("VmRSS"),
            anon: field("RssAnon"),
            file: field("RssFile"),
        }
    }
}

/// The files the process has mapped, from `/proc/<pid>/maps`.
pub fn mapped_files(pid: u32) -> Vec<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("can read maps");
    let mut files: Vec<PathBuf> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/'))
        .map(PathBuf::from)
        .collect();
    files.dedup();
    files
}

/// How many threads the process has, from `/proc/<pid>/task`.
pub fn thread_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("can read the task folder")
        .count()
}

/// How many file descriptors the process has open, from `/proc/<pid>/fd`.
pub fn open_fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("can read the fd folder")
        .count()
}
