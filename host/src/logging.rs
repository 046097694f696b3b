//! Log lines on stderr, through `tracing`: readable lines or one JSON
//! object per line (`[server] log_format`, `--log-format`), filtered by
//! `SOCIALGATE_LOG` (default `info`).
//!
//! Lines are written by tracing-appender's non-blocking writer, on a
//! thread of its own, never by the thread that serves a request: a slow
//! or full stderr (a pipe nobody reads quickly) must not stall requests.
//! It is lossy: should stderr fall [`BUFFERED_LINES`] lines behind,
//! further lines are dropped and counted
//! (`socialgate_log_lines_dropped_total`, read by [`dropped_lines`]).

use std::io::{IsTerminal, Write};
use std::sync::OnceLock;
use std::time::Duration;

use crate::settings::LogFormat;
use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::EnvFilter;

/// Bytes of lines the writer thread gathers before a write.
const STDERR_BUFFER: usize = 64 * 1024;

/// Lines the writer may fall behind by before lines are dropped.
pub const BUFFERED_LINES: usize = tracing_appender::non_blocking::DEFAULT_BUFFERED_LINES_LIMIT;

/// The dropped lines' count of the process's writer, once [`init`] made it.
static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Log lines dropped so far because stderr fell behind.
pub fn dropped_lines() -> u64 {
    DROPPED
        .get()
        .map_or(0, |counter| counter.dropped_lines() as u64)
}

/// Keeps the writer thread; dropping it writes the lines still buffered
/// (waiting a second at most: a stderr nobody reads must not hold the
/// exit). Hold it until the process ends.
#[must_use]
pub struct Logging {
    _guard: WorkerGuard,
}

/// Installs the process's subscriber; call once, before anything logs.
pub fn init(format: LogFormat) -> Logging {
    // Buffered: the writer thread flushes whenever it has emptied its queue,
    // so a busy server writes many lines per system call, a quiet one each
    // line at once.
    let stderr = std::io::BufWriter::with_capacity(STDERR_BUFFER, std::io::stderr());
    let (writer, guard) = non_blocking(stderr, BUFFERED_LINES);
    let _ = DROPPED.set(writer.error_counter());
    let spec = std::env::var("SOCIALGATE_LOG").unwrap_or_default();
    let (filter, fault) = filter_from(&spec);
    // Colours for a terminal only.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
    // A typo must not silence the server: say so, at a level still on.
    match fault {
        Some(FilterFault::Unreadable) => tracing::warn!(
            SOCIALGATE_LOG = %spec,
            "not a log filter (levels: error, warn, info, debug, trace, off; or target=level, comma-separated); logging at info"
        ),
        Some(FilterFault::SilencesErrors) => tracing::error!(
            SOCIALGATE_LOG = %spec,
            "this filter turns off socialgate's own lines (a level misspelt?); its errors are logged anyway (say `off` to silence them)"
        ),
        None => {}
    }
    Logging { _guard: guard }
}

/// A writer to `out` on a thread of its own, dropping (and counting) the
/// lines past `buffered_lines` it has not written yet.
fn non_blocking(
    out: impl Write + Send + 'static,
    buffered_lines: usize,
) -> (NonBlocking, WorkerGuard) {
    NonBlockingBuilder::default()
        .buffered_lines_limit(buffered_lines)
        .lossy(true)
        .thread_name("log-writer")
        .finish(out)
}

/// The target of every request's line: `http::api`'s, where the request
/// is answered.
pub const REQUEST_TARGET: &str = "socialgate::http::api";

/// What a request's log line says: the event `http::api` logs at INFO,
/// in the request's span (`request{id=…}`), with the message `request`.
pub struct RequestLine<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub latency: Duration,
    /// The provider that answered, or `-`.
    pub provider: &'a str,
    /// What the cache did, or `-`.
    pub cache: &'a str,
    pub attempts: usize,
    /// The accepted key's name, or `-`.
    pub key: &'a str,
}

impl RequestLine<'_> {
    /// The latency in milliseconds, to the microsecond: `1.277`, not
    /// `1.2771359999999998`.
    pub fn latency_ms(&self) -> f64 {
        self.latency.as_micros() as f64 / 1000.0
    }

    /// Logs the line in the request's `span`, which carries its ID.
    pub fn log(&self, span: &tracing::Span) {
        span.in_scope(|| {
            tracing::info!(
                target: REQUEST_TARGET,
                method = %self.method,
                path = self.path,
                status = self.status,
                latency_ms = self.latency_ms(),
                provider = self.provider,
                cache = %self.cache,
                attempts = self.attempts,
                key = self.key,
                "request"
            )
        });
    }
}

/// The filter `SOCIALGATE_LOG` sets (`info` when unset or unreadable),
/// and what was wrong with the variable, if anything.
fn filter_from(spec: &str) -> (EnvFilter, Option<FilterFault>) {
    let info = || EnvFilter::new("info");
    if spec.trim().is_empty() {
        return (info(), None);
    }
    let Ok(filter) = EnvFilter::try_new(spec) else {
        return (info(), Some(FilterFault::Unreadable));
    };
    // A bare word is a level or a target: as a target (`verbose`, a level
    // misspelt) it turns every other line off, errors included. Unless the
    // filter says `off`, socialgate's errors stay on. (A filter naming
    // socialgate's own targets, or saying `off`, means what it says.)
    let spec_lower = spec.to_ascii_lowercase();
    let deliberate = spec_lower.contains("off") || spec_lower.contains("socialgate");
    let silences = spec
        .parse::<Targets>()
        .is_ok_and(|targets| !targets.would_enable("socialgate", &tracing::Level::ERROR));
    if silences && !deliberate {
        let errors = "socialgate=error".parse().expect("a valid directive");
        return (
            filter.add_directive(errors),
            Some(FilterFault::SilencesErrors),
        );
    }
    (filter, None)
}

/// What an operator is told of a `SOCIALGATE_LOG` that cannot mean what
/// was meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FilterFault {
    /// Not a filter: the default (`info`) is used.
    Unreadable,
    /// A filter turning off socialgate's own lines without saying `off`:
    /// its errors are kept.
    SilencesErrors,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use tracing::Level;

    /// Whether `filter` lets an event of `target` at `level` through.
    macro_rules! lets_through {
        ($filter:expr, $target:literal, $level:expr) => {{
            use tracing_subscriber::layer::SubscriberExt;
            let subscriber = tracing_subscriber::registry().with($filter);
            tracing::subscriber::with_default(subscriber, || {
                tracing::enabled!(target: $target, $level)
            })
        }};
    }

    #[test]
    fn levels_by_target_or_span_and_what_is_wrong_with_a_filter() {
        let by_target = || filter_from("socialgate=debug,hyper=warn");
        assert_eq!(by_target().1, None);
        assert!(lets_through!(
            by_target().0,
            "socialgate::http::api",
            Level::DEBUG
        ));
        assert!(!lets_through!(by_target().0, "hyper::proto", Level::INFO));
        assert_eq!(filter_from("info,[request{id=7}]=debug").1, None);
        for unset_or_unreadable in ["", "  ", "socialgate=loud["] {
            let filter = || filter_from(unset_or_unreadable).0;
            assert!(lets_through!(filter(), "socialgate", Level::INFO));
            assert!(!lets_through!(filter(), "socialgate", Level::DEBUG));
        }
        assert_eq!(
            filter_from("socialgate=loud[").1,
            Some(FilterFault::Unreadable)
        );
        // A bare target is a filter (`socialgate`), and so is `off`.
        for kept in [
            "socialgate",
            "socialgate::http",
            "WARN",
            "off",
            "socialgate=off",
        ] {
            assert_eq!(filter_from(kept).1, None, "{kept}");
        }
        // Operator sweep: `verbose` (read as a target) silenced every line,
        // errors included; they stay on, and the operator is told.
        for silencing in ["verbose", "hyper=debug"] {
            let filter = || filter_from(silencing);
            assert_eq!(filter().1, Some(FilterFault::SilencesErrors), "{silencing}");
            assert!(lets_through!(filter().0, "socialgate::chain", Level::ERROR));
            assert!(!lets_through!(filter().0, "socialgate::chain", Level::WARN));
        }
    }

    /// A stderr that takes one line, then blocks until told to go on.
    struct Stuck(mpsc::Receiver<()>);

    impl Write for Stuck {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.recv();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_past_the_buffer_of_a_stuck_stderr_are_dropped_and_counted() {
        let (go_on, wait) = mpsc::channel();
        let (mut writer, guard) = non_blocking(Stuck(wait), 2);
        for _ in 0..10 {
            writer.write_all(b"line\n").unwrap();
        }
        // At most one line taken by the writer thread and two buffered.
        let dropped = writer.error_counter().dropped_lines();
        assert!((7..=8).contains(&dropped), "{dropped} dropped");
        drop(go_on);
        drop(guard);
    }
}
