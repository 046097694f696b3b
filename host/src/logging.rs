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
use tracing::Subscriber;
use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
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
    let Filter {
        targets,
        span_filter,
        fault,
    } = filter_from(&spec);
    // The builder's own level cap is INFO: lifted, so `SOCIALGATE_LOG`'s
    // filter alone decides (its default is INFO too). Colours for a
    // terminal only.
    let builder = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer);
    match format {
        LogFormat::Human => install_filtered(builder.finish(), targets, span_filter),
        LogFormat::Json => install_filtered(
            builder.json().with_current_span(true).finish(),
            targets,
            span_filter,
        ),
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

/// Installs `subscriber` as the process's, behind the filter
/// `SOCIALGATE_LOG` sets (one of the two).
fn install_filtered<S>(subscriber: S, targets: Option<Targets>, span_filter: Option<EnvFilter>)
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync + 'static,
{
    subscriber.with(targets).with(span_filter).init();
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

/// The filter `SOCIALGATE_LOG` sets (`info` when unset or unreadable): one
/// of the two. Levels by target (`info`, `socialgate=debug,hyper=warn`) are
/// a [`Targets`], which costs nothing as a request's span is entered and
/// left; only a filter that needs span context (`[request{id=...}]=debug`)
/// takes an [`EnvFilter`], which tracks every span behind a shared lock.
fn filter_from(spec: &str) -> Filter {
    let by_default = |unreadable: bool| Filter {
        targets: Some(Targets::new().with_default(tracing::Level::INFO)),
        span_filter: None,
        fault: unreadable.then_some(FilterFault::Unreadable),
    };
    if spec.trim().is_empty() {
        return by_default(false);
    }
    if let Ok(targets) = spec.parse::<Targets>() {
        // A bare word is a level or a target: as a target (`verbose`, a
        // level misspelt) it turns every other line off, errors included.
        // Unless the filter says `off`, socialgate's errors stay on.
        // (A filter naming socialgate's own targets, or saying `off`, means
        // what it says.)
        let spec_lower = spec.to_ascii_lowercase();
        let deliberate = spec_lower.contains("off") || spec_lower.contains("socialgate");
        if !targets.would_enable("socialgate", &tracing::Level::ERROR) && !deliberate {
            return Filter {
                targets: Some(targets.with_target("socialgate", tracing::Level::ERROR)),
                span_filter: None,
                fault: Some(FilterFault::SilencesErrors),
            };
        }
        return Filter {
            targets: Some(targets),
            span_filter: None,
            fault: None,
        };
    }
    match EnvFilter::try_new(spec) {
        Ok(filter) => Filter {
            targets: None,
            span_filter: Some(filter),
            fault: None,
        },
        Err(_) => by_default(true),
    }
}

/// The filter `SOCIALGATE_LOG` sets: one of the two, and what was wrong
/// with the variable, if anything.
struct Filter {
    targets: Option<Targets>,
    span_filter: Option<EnvFilter>,
    fault: Option<FilterFault>,
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

    #[test]
    fn levels_by_target_filter_without_span_context_and_the_rest_with_it() {
        let Filter {
            targets,
            span_filter,
            fault,
        } = filter_from("socialgate=debug,hyper=warn");
        assert_eq!(fault, None);
        let targets = targets.expect("levels by target");
        assert!(span_filter.is_none());
        assert!(targets.would_enable("socialgate::http::api", &Level::DEBUG));
        assert!(!targets.would_enable("hyper::proto", &Level::INFO));
        let filter = filter_from("info,[request{id=7}]=debug");
        assert!(
            filter.targets.is_none() && filter.span_filter.is_some(),
            "span context"
        );
        assert_eq!(filter.fault, None);
        for unset_or_unreadable in ["", "  ", "socialgate=loud["] {
            let filter = filter_from(unset_or_unreadable);
            let targets = filter.targets.expect("the default");
            assert!(filter.span_filter.is_none());
            assert!(targets.would_enable("socialgate", &Level::INFO));
            assert!(!targets.would_enable("socialgate", &Level::DEBUG));
        }
        assert_eq!(
            filter_from("socialgate=loud[").fault,
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
            assert_eq!(filter_from(kept).fault, None, "{kept}");
        }
        // Operator sweep: `verbose` (read as a target) silenced every line,
        // errors included; they stay on, and the operator is told.
        for silencing in ["verbose", "hyper=debug"] {
            let filter = filter_from(silencing);
            assert_eq!(
                filter.fault,
                Some(FilterFault::SilencesErrors),
                "{silencing}"
            );
            let targets = filter.targets.expect("levels by target");
            assert!(targets.would_enable("socialgate::chain", &Level::ERROR));
            assert!(!targets.would_enable("socialgate::chain", &Level::WARN));
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
