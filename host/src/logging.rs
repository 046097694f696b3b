//! Log lines on stderr, through `tracing`: readable lines or one JSON
//! object per line (`[server] log_format`, `--log-format`), filtered by
//! `SOCIALGATE_LOG` (default `info`).
//!
//! Lines are written by a thread of their own, never by the thread that
//! serves a request: a slow or full stderr (a pipe nobody reads quickly)
//! must not stall requests. If it falls more than [`BUFFERED_LINES`]
//! behind, further lines are dropped rather than waited for.

use serde::Deserialize;

/// How log lines are written to stderr. A process setting: the subscriber
/// is installed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One readable line per event.
    #[default]
    Human,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Lines the writer thread may fall behind by.
pub const BUFFERED_LINES: usize = 128_000;

/// Keeps the writer thread; dropping it writes the lines still queued.
/// Hold it until the process ends.
#[must_use]
pub struct Logging {
    _writer: tracing_appender::non_blocking::WorkerGuard,
}

/// Installs the process's subscriber; call once, before anything logs.
pub fn init(format: LogFormat) -> Logging {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SOCIALGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(BUFFERED_LINES)
        .lossy(true)
        .thread_name("log-writer")
        // Buffered: the writer thread flushes whenever it has caught up, so a
        // burst of lines costs one write, not one each.
        .finish(std::io::BufWriter::with_capacity(
            64 * 1024,
            std::io::stderr(),
        ));
    let builder = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_env_filter(filter);
    match format {
        LogFormat::Human => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
    Logging { _writer: guard }
}
