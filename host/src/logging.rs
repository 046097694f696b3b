//! Log lines on stderr, through `tracing`: readable lines or one JSON
//! object per line (`[server] log_format`, `--log-format`), filtered by
//! `SOCIALGATE_LOG` (default `info`).
//!
//! Lines are written by a thread of their own, never by the thread that
//! serves a request: a slow or full stderr (a pipe nobody reads quickly)
//! must not stall requests. A request thread appends its line to a shared
//! buffer (one short lock, no allocation, no wake-up); the writer thread
//! takes the whole buffer at once, at most [`FLUSH_DELAY`] after its first
//! line or as soon as it holds [`WAKE_AT`] bytes, so a busy server pays one
//! `write` and one wake-up per batch, not per line. If stderr falls more
//! than [`MAX_BUFFERED`] bytes behind, further lines are dropped, counted,
//! and the count is written once it catches up.

use std::io::Write;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

/// Bytes of lines the writer may fall behind by before lines are dropped.
pub const MAX_BUFFERED: usize = 16 * 1024 * 1024;
/// A buffer this full wakes the writer at once.
pub const WAKE_AT: usize = 256 * 1024;
/// The longest a line waits in the buffer on a quiet server.
pub const FLUSH_DELAY: Duration = Duration::from_millis(20);
/// The longest an orderly exit waits for the last lines to be written.
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// Keeps the writer thread; dropping it writes the lines still buffered.
/// Hold it until the process ends.
#[must_use]
pub struct Logging {
    sink: Arc<Sink>,
    written: Option<mpsc::Receiver<()>>,
}

impl Drop for Logging {
    fn drop(&mut self) {
        self.sink.lock().closing = true;
        self.sink.wake.notify_one();
        if let Some(written) = self.written.take() {
            // Bounded: a stderr nobody reads must not hold the exit.
            let _ = written.recv_timeout(EXIT_WAIT);
        }
    }
}

/// Installs the process's subscriber; call once, before anything logs.
pub fn init(format: LogFormat) -> Logging {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SOCIALGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let sink = Arc::new(Sink::default());
    let (done, written) = mpsc::channel();
    let writer_sink = sink.clone();
    let spawned = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || {
            writer_sink.write_out(&mut std::io::stderr());
            let _ = done.send(());
        });
    let builder = tracing_subscriber::fmt()
        .with_writer(SinkWriter(sink.clone()))
        .with_env_filter(filter);
    match format {
        LogFormat::Human => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
    if let Err(error) = &spawned {
        tracing::error!(%error, "cannot start the log writer thread; log lines are dropped");
    }
    Logging {
        sink,
        written: spawned.ok().map(|_| written),
    }
}

/// The lines waiting for the writer thread.
#[derive(Default)]
struct Sink {
    buffer: Mutex<Buffer>,
    wake: Condvar,
}

#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    /// Lines dropped since the last batch was written.
    dropped: u64,
    closing: bool,
}

impl Sink {
    fn lock(&self) -> MutexGuard<'_, Buffer> {
        // A panic while appending leaves whole lines or none: still usable.
        self.buffer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends one line (tracing writes each event in one call).
    fn append(&self, line: &[u8]) {
        let mut buffer = self.lock();
        let before = buffer.bytes.len();
        if before + line.len() > MAX_BUFFERED {
            buffer.dropped += 1;
            return;
        }
        buffer.bytes.extend_from_slice(line);
        let after = buffer.bytes.len();
        drop(buffer);
        // Only the first line of a batch, and the one that fills it, wake
        // the writer; every other line costs no system call.
        if before == 0 || (before < WAKE_AT && after >= WAKE_AT) {
            self.wake.notify_one();
        }
    }

    /// The writer thread's loop: batches to `out` until closed and empty.
    fn write_out(&self, out: &mut impl Write) {
        let mut spare = Vec::new();
        loop {
            let mut buffer = self.lock();
            while buffer.bytes.is_empty() && buffer.dropped == 0 && !buffer.closing {
                buffer = self.wake.wait(buffer).unwrap_or_else(|e| e.into_inner());
            }
            // Let the batch grow for a moment, unless it is full already.
            let deadline = Instant::now() + FLUSH_DELAY;
            while buffer.bytes.len() < WAKE_AT && !buffer.closing {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                buffer = self
                    .wake
                    .wait_timeout(buffer, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            std::mem::swap(&mut buffer.bytes, &mut spare);
            let dropped = std::mem::take(&mut buffer.dropped);
            let closing = buffer.closing;
            drop(buffer);
            // A failing stderr has nowhere to report to: the batch is lost.
            let _ = out.write_all(&spare);
            if dropped > 0 {
                let _ = writeln!(
                    out,
                    "socialgate: {dropped} log lines dropped: stderr fell more than {MAX_BUFFERED} bytes behind"
                );
            }
            let _ = out.flush();
            spare.clear();
            if spare.capacity() > 4 * WAKE_AT {
                // Give back what a burst grew.
                spare = Vec::new();
            }
            if closing && self.lock().bytes.is_empty() {
                return;
            }
        }
    }
}

/// The handle `tracing` writes through.
struct SinkWriter(Arc<Sink>);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for SinkWriter {
    type Writer = &'a Sink;

    fn make_writer(&'a self) -> &'a Sink {
        &self.0
    }
}

impl Write for &Sink {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        self.append(line);
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_reach_the_writer_in_order_and_the_overflow_is_counted() {
        let sink = Sink::default();
        sink.append(b"one\n");
        sink.append(b"two\n");
        let big = vec![b'x'; MAX_BUFFERED];
        sink.append(&big);
        sink.lock().closing = true;
        let mut out = Vec::new();
        sink.write_out(&mut out);
        let out = String::from_utf8(out).unwrap();
        assert!(out.starts_with("one\ntwo\n"), "{out}");
        assert!(out.contains("1 log lines dropped"), "{out}");
    }
}
