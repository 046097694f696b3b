//! Log lines on stderr, through `tracing`: readable lines or one JSON
//! object per line (`[server] log_format`, `--log-format`), filtered by
//! `SOCIALGATE_LOG` (default `info`).
//!
//! Lines are written by a thread of their own, never by the thread that
//! serves a request: a slow or full stderr (a pipe nobody reads quickly)
//! must not stall requests. A request thread appends its line to a shared
//! buffer (one short lock, no allocation, no wake-up); the writer thread
//! takes the whole buffer at once. On a quiet server it writes a line as
//! soon as it comes; within [`FLUSH_DELAY`] of its last write it lets the
//! buffer fill until then (or until it holds [`WAKE_AT`] bytes), so a busy
//! server pays one `write` and one wake-up per batch, not per line. If
//! stderr falls more than [`MAX_BUFFERED`] bytes behind, further lines are
//! dropped, counted, and the count is written once it catches up.
//!
//! Every request ends in one line ([`RequestLine`]), the one line a busy
//! server writes most. In the formats written here, with levels set by
//! target, it goes straight into that buffer, the same bytes the
//! subscriber would write for its event, without `tracing`'s dispatch and
//! field visitors (most of what a request's line cost); otherwise it is an
//! ordinary event.

use std::cell::RefCell;
use std::io::Write;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use plugin_api::Timestamp;
use serde::Deserialize;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::{self, DefaultVisitor, FormatEvent, FormatFields};
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

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
/// The least time between two writes under load: the longest a line
/// waits in the buffer.
pub const FLUSH_DELAY: Duration = Duration::from_millis(5);
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
    let sink = Arc::new(Sink::default());
    let (done, written) = mpsc::channel();
    let writer_sink = sink.clone();
    let spawned = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || {
            writer_sink.write_out(&mut std::io::stderr());
            let _ = done.send(());
        });
    let spec = std::env::var("SOCIALGATE_LOG").unwrap_or_default();
    let Filter {
        targets,
        span_filter,
        fault,
    } = filter_from(&spec);
    // The builder's own level cap is INFO: lifted, so `SOCIALGATE_LOG`'s
    // filter alone decides (its default is INFO too).
    let builder = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
        .with_writer(SinkWriter(sink.clone()));
    let direct_format = match format {
        // Colours for a terminal; otherwise the same lines, written by
        // `PlainLine` at a fraction of the cost.
        LogFormat::Human if std::io::IsTerminal::is_terminal(&std::io::stderr()) => {
            install_filtered(
                builder.with_ansi(true).finish(),
                targets.clone(),
                span_filter,
            );
            None
        }
        LogFormat::Human => {
            install_filtered(
                builder
                    .with_ansi(false)
                    .fmt_fields(PlainFields)
                    .event_format(PlainLine)
                    .finish(),
                targets.clone(),
                span_filter,
            );
            Some(LogFormat::Human)
        }
        LogFormat::Json => {
            install_filtered(
                builder.json().with_current_span(true).finish(),
                targets.clone(),
                span_filter,
            );
            Some(LogFormat::Json)
        }
    };
    // Levels by target say once and for all whether request lines are on.
    if let (Some(format), Some(targets)) = (direct_format, targets) {
        let _ = DIRECT_REQUEST_LINES.set(DirectLines {
            sink: sink.clone(),
            format,
            enabled: targets.would_enable(REQUEST_TARGET, &tracing::Level::INFO),
        });
    }
    if let Err(error) = &spawned {
        tracing::error!(%error, "cannot start the log writer thread; log lines are dropped");
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
    Logging {
        sink,
        written: spawned.ok().map(|_| written),
    }
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

/// Where request lines go when they skip `tracing` (see [`RequestLine`]);
/// unset for a terminal's colours and for filters by span.
static DIRECT_REQUEST_LINES: OnceLock<DirectLines> = OnceLock::new();

struct DirectLines {
    sink: Arc<Sink>,
    format: LogFormat,
    /// Whether the filter lets INFO lines of [`REQUEST_TARGET`] through.
    enabled: bool,
}

/// What a request's log line says: the event `http::api` logs at INFO,
/// in the request's span (`request{id=…}`), with the message `request`.
pub struct RequestLine<'a> {
    pub id: &'a str,
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

    /// Logs the line, in the request's `span`: straight into the log
    /// buffer when [`init`] set that up (the span is not entered: the line
    /// carries its id), as an event through the subscriber otherwise (the
    /// same bytes either way).
    pub fn log(&self, span: &tracing::Span) {
        if !self.write_direct() {
            span.in_scope(|| self.emit());
        }
    }

    /// The line as an event through the subscriber.
    fn emit(&self) {
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
    }

    /// Writes the line straight into the log buffer, as the subscriber
    /// would have written its event, when [`init`] set that up (nothing
    /// when the filter drops it). `false` when it must go through the
    /// subscriber as an event.
    fn write_direct(&self) -> bool {
        let Some(direct) = DIRECT_REQUEST_LINES.get() else {
            return false;
        };
        if direct.enabled {
            thread_local! {
                static LINE: RefCell<String> = const { RefCell::new(String::new()) };
            }
            LINE.with_borrow_mut(|line| {
                line.clear();
                let written = match direct.format {
                    LogFormat::Human => self.write_plain(line),
                    LogFormat::Json => self.write_json(line),
                };
                if written.is_ok() {
                    direct.sink.append(line.as_bytes());
                }
                // A burst's long line should not keep its room.
                if line.capacity() > 4096 {
                    *line = String::new();
                }
            });
        }
        true
    }

    /// [`PlainLine`]'s line for the event, with [`PlainFields`]' fields.
    fn write_plain(&self, out: &mut String) -> std::fmt::Result {
        write_timestamp(out, SystemTime::now())?;
        out.push_str("  INFO request{id=");
        out.push_str(self.id);
        out.push_str("}: ");
        out.push_str(REQUEST_TARGET);
        out.push_str(": request method=");
        out.push_str(self.method);
        out.push_str(" path=");
        write_quoted(out, self.path)?;
        out.push_str(" status=");
        out.push_str(itoa::Buffer::new().format(self.status));
        out.push_str(" latency_ms=");
        write_millis(out, self.latency);
        out.push_str(" provider=");
        write_quoted(out, self.provider)?;
        out.push_str(" cache=");
        out.push_str(self.cache);
        out.push_str(" attempts=");
        out.push_str(itoa::Buffer::new().format(self.attempts));
        out.push_str(" key=");
        write_quoted(out, self.key)?;
        out.push('\n');
        Ok(())
    }

    /// tracing-subscriber's JSON line for the event (current span and span
    /// list on, as [`init`] sets it up).
    fn write_json(&self, out: &mut String) -> std::fmt::Result {
        let json = plugin_api::canonical::write_str::<String>;
        out.push_str("{\"timestamp\":\"");
        write_timestamp(out, SystemTime::now())?;
        out.push_str("\",\"level\":\"INFO\",\"fields\":{\"message\":\"request\",\"method\":");
        json(out, self.method);
        out.push_str(",\"path\":");
        json(out, self.path);
        out.push_str(",\"status\":");
        out.push_str(itoa::Buffer::new().format(self.status));
        out.push_str(",\"latency_ms\":");
        write_millis(out, self.latency);
        out.push_str(",\"provider\":");
        json(out, self.provider);
        out.push_str(",\"cache\":");
        json(out, self.cache);
        out.push_str(",\"attempts\":");
        out.push_str(itoa::Buffer::new().format(self.attempts));
        out.push_str(",\"key\":");
        json(out, self.key);
        out.push_str("},\"target\":");
        json(out, REQUEST_TARGET);
        let span = |out: &mut String| {
            out.push_str("{\"id\":");
            json(out, self.id);
            out.push_str(",\"name\":\"request\"}");
        };
        out.push_str(",\"span\":");
        span(out);
        out.push_str(",\"spans\":[");
        span(out);
        out.push_str("]}\n");
        Ok(())
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

/// tracing-subscriber's default ("full") line without colours, byte for
/// byte: `TIMESTAMP LEVEL span{fields}:span{fields}: target: fields`. Its
/// own formatter spends a third of a request log line's cost on styling
/// that writes nothing when colours are off, and on formatting the date of
/// every line; this one formats the date once a second per thread.
struct PlainLine;

impl<S, N> FormatEvent<S, N> for PlainLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: format::Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        write_timestamp(&mut writer, SystemTime::now())?;
        let meta = event.metadata();
        write!(writer, " {:>5} ", meta.level().as_str())?;
        if let Some(scope) = ctx.event_scope() {
            let mut seen = false;
            for span in scope.from_root() {
                writer.write_str(span.metadata().name())?;
                seen = true;
                let extensions = span.extensions();
                if let Some(fields) = extensions.get::<FormattedFields<N>>() {
                    if !fields.is_empty() {
                        write!(writer, "{{{fields}}}")?;
                    }
                }
                writer.write_char(':')?;
            }
            if seen {
                writer.write_char(' ')?;
            }
        }
        write!(writer, "{}: ", meta.target())?;
        ctx.format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// tracing-subscriber's `DefaultFields` without colours, byte for byte:
/// `name=value` pairs, values as `Debug` writes them, one space apart. Its
/// own visitor runs every name and `=` through the styling machinery even
/// when colours are off, which is most of a request line's field cost; this
/// one writes ordinary fields directly and hands the message, `r#` names
/// and errors (which it escapes or spells out) to that visitor.
struct PlainFields;

impl<'w> FormatFields<'w> for PlainFields {
    fn format_fields<R: RecordFields>(
        &self,
        writer: format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut visitor = PlainVisitor {
            writer,
            is_empty: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct PlainVisitor<'w> {
    writer: format::Writer<'w>,
    /// Whether nothing was written yet: no space before the first field.
    is_empty: bool,
    result: std::fmt::Result,
}

/// What a field gets from [`PlainVisitor`].
enum Treatment {
    /// `log.` metadata: already on the line.
    Skipped,
    /// The message, an `r#` name: the default visitor writes it.
    ByDefault,
    /// ` name=` is written; the value follows.
    Value,
}

impl PlainVisitor<'_> {
    /// Starts `field`: writes ` name=` when it is an ordinary one.
    fn begin(&mut self, field: &Field) -> Treatment {
        if self.result.is_err() {
            return Treatment::Skipped;
        }
        let name = field.name();
        // Metadata of events from the `log` crate: already on the line.
        if name.starts_with("log.") {
            return Treatment::Skipped;
        }
        if name == "message" || name.starts_with("r#") {
            return Treatment::ByDefault;
        }
        let space = if self.is_empty { "" } else { " " };
        self.is_empty = false;
        self.result = self
            .writer
            .write_str(space)
            .and_then(|()| self.writer.write_str(name))
            .and_then(|()| self.writer.write_char('='));
        if self.result.is_ok() {
            Treatment::Value
        } else {
            Treatment::Skipped
        }
    }

    /// Writes `value` as `name=value` when `field` is an ordinary one;
    /// otherwise does what the default visitor does with it.
    fn write(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.write_as(field, value, |writer| write!(writer, "{value:?}"));
    }

    /// [`write`](Self::write), with `fast` writing an ordinary field's
    /// value: what `Debug` of `value` writes, without its machinery.
    fn write_as(
        &mut self,
        field: &Field,
        value: &dyn std::fmt::Debug,
        fast: impl FnOnce(&mut format::Writer<'_>) -> std::fmt::Result,
    ) {
        match self.begin(field) {
            Treatment::Value => self.result = fast(&mut self.writer),
            Treatment::ByDefault => self.by_default(|default| default.record_debug(field, value)),
            Treatment::Skipped => {}
        }
    }

    /// Writes an integer field; `Debug` of an integer is its digits, which
    /// `itoa` writes.
    fn write_integer(&mut self, field: &Field, value: impl itoa::Integer + std::fmt::Debug) {
        self.write_as(field, &value, |writer| {
            writer.write_str(itoa::Buffer::new().format(value))
        });
    }

    /// Hands one field to tracing-subscriber's own visitor, which writes it
    /// (with the space before it) exactly as the default format does.
    fn by_default(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        let mut default = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut default);
        self.result = tracing_subscriber::field::VisitOutput::finish(default);
        self.is_empty = false;
    }
}

/// A latency in milliseconds to the microsecond, as `Debug` (and
/// serde_json, in JSON) writes [`RequestLine::latency_ms`]'s float:
/// `1.277`, `4.0`, `0.001`; a float's formatting is most of that field's
/// cost. Past `MAX_PLAIN_MICROS` (31 years), through the float itself.
fn write_millis(out: &mut String, latency: Duration) {
    const MAX_PLAIN_MICROS: u128 = 1_000_000_000_000_000;
    let micros = latency.as_micros();
    if micros >= MAX_PLAIN_MICROS {
        use std::fmt::Write as _;
        let _ = write!(out, "{:?}", micros as f64 / 1000.0);
        return;
    }
    out.push_str(itoa::Buffer::new().format(micros / 1000));
    out.push('.');
    // Below 1000: fits.
    let fraction = (micros % 1000) as u32;
    let digits = [fraction / 100, fraction / 10 % 10, fraction % 10];
    let shown = match digits {
        [_, 0, 0] => 1,
        [_, _, 0] => 2,
        _ => 3,
    };
    for digit in &digits[..shown] {
        out.push(char::from_digit(*digit, 10).unwrap_or('0'));
    }
}

/// `value` as `Debug` writes a `str`: quoted, escaped. Printable ASCII other
/// than `"` and `\` is written as it is, so a string of only that (a path,
/// a key's name) skips the per-character escaping.
fn write_quoted(writer: &mut impl std::fmt::Write, value: &str) -> std::fmt::Result {
    let plain = value
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\');
    if plain {
        writer.write_char('"')?;
        writer.write_str(value)?;
        writer.write_char('"')
    } else {
        write!(writer, "{value:?}")
    }
}

impl Visit for PlainVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.write(field, &format_args!("{value}"));
            return;
        }
        self.write_as(field, &value, |writer| write_quoted(writer, value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.write_integer(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.write_integer(field, value);
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.result.is_ok() {
            self.by_default(|default| default.record_error(field, value));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.write(field, value);
    }
}

/// `2026-11-25T11:15:55.598305Z`, as tracing-subscriber's `SystemTime`
/// timer writes it; the part up to the seconds is formatted once a second
/// per thread.
fn write_timestamp(writer: &mut impl std::fmt::Write, now: SystemTime) -> std::fmt::Result {
    thread_local! {
        static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since_epoch.as_secs();
    SECOND.with_borrow_mut(|(cached, text)| {
        if *cached != seconds {
            let formatted = i64::try_from(seconds)
                .ok()
                .and_then(Timestamp::from_unix)
                .map_or_else(|| "9999-12-31T23:59:59Z".to_owned(), |t| t.to_string());
            *text = formatted.trim_end_matches('Z').to_owned();
            *cached = seconds;
        }
        write!(writer, "{text}.{:06}Z", since_epoch.subsec_micros())
    })
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
        crate::sync::lock(&self.buffer)
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
        // No write yet: the first line goes out at once.
        let mut last_write: Option<Instant> = None;
        loop {
            let mut buffer = self.lock();
            while buffer.bytes.is_empty() && buffer.dropped == 0 && !buffer.closing {
                buffer = self.wake.wait(buffer).unwrap_or_else(|e| e.into_inner());
            }
            // Busy (a write moments ago): let the batch grow until
            // FLUSH_DELAY after that write, unless it is full already.
            let deadline = last_write.map_or_else(Instant::now, |at| at + FLUSH_DELAY);
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
            last_write = Some(Instant::now());
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

    /// What a subscriber writes, kept in memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A subscriber builder without colours writing into the [`Captured`]
    /// it returns.
    fn capture() -> (
        Captured,
        tracing_subscriber::fmt::SubscriberBuilder<
            tracing_subscriber::fmt::format::DefaultFields,
            tracing_subscriber::fmt::format::Format,
            tracing_subscriber::filter::LevelFilter,
            impl for<'w> tracing_subscriber::fmt::MakeWriter<'w> + 'static,
        >,
    ) {
        let captured = Captured::default();
        let sink = captured.clone();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || sink.clone());
        (captured, builder)
    }

    /// What a subscriber writes for one event in two nested spans.
    fn one_line(plain: bool) -> String {
        let (captured, builder) = capture();
        let emit = || {
            let outer = tracing::info_span!("request", id = %"abc-1", n = 2u64);
            let _outer = outer.enter();
            let inner = tracing::info_span!("empty");
            let _inner = inner.enter();
            tracing::warn!(
                path = "/v1/x",
                status = 200u16,
                ms = 1.5f64,
                delta = -3i64,
                tiny = 1e-9f64,
                ok = true,
                shown = %"a \"b\"",
                debugged = ?Some("c\td"),
                r#type = "t",
                error = &std::io::Error::other("broke") as &(dyn std::error::Error + 'static),
                "said \"this\" \u{1b}[31m"
            );
            tracing::info!("no fields");
            tracing::info!(first = 1u64, "message last");
            // The fast paths: strings and integers of every shape.
            tracing::info!(
                plain = "/v1/shortvideo/profile",
                quoted = "say \"hi\"",
                slash = "a\\b",
                tab = "a\tb",
                unicode = "caf\u{e9} \u{200b}",
                edges = " it's ~ fine ",
                del = "a\u{7f}b",
                nul = "a\u{0}b",
                cr = "a\rb",
                empty = "",
                r#loop = "kept",
                max = u64::MAX,
                min = i64::MIN,
                small = 7u8,
                negative = -1i32,
                usize = 12usize,
                "fields"
            );
        };
        if plain {
            let subscriber = builder.fmt_fields(PlainFields).event_format(PlainLine);
            tracing::subscriber::with_default(subscriber.finish(), emit);
        } else {
            tracing::subscriber::with_default(builder.finish(), emit);
        }
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn plain_lines_are_the_default_formatters_without_colours() {
        let (plain, default) = (one_line(true), one_line(false));
        let without_time = |text: &str| -> Vec<String> {
            text.lines()
                .map(|l| l.split_once(' ').expect("a timestamp first").1.to_owned())
                .collect()
        };
        assert_eq!(without_time(&plain), without_time(&default));
        assert_eq!(plain.lines().count(), 4);
        for line in plain.lines() {
            let stamp = line.split(' ').next().unwrap();
            assert_eq!(stamp.len(), "2026-11-25T11:15:55.598305Z".len(), "{line}");
            assert!(
                stamp.ends_with('Z') && stamp.as_bytes()[19] == b'.',
                "{line}"
            );
        }
    }

    #[test]
    fn timestamps_match_the_default_timers() {
        let at = UNIX_EPOCH + Duration::new(1_764_069_355, 598_305_123);
        let mut text = String::new();
        write_timestamp(&mut text, at).unwrap();
        assert_eq!(text, "2025-11-25T11:15:55.598305Z");
        text.clear();
        write_timestamp(&mut text, at + Duration::from_millis(1)).unwrap();
        assert_eq!(text, "2025-11-25T11:15:55.599305Z");
    }

    /// Request lines that test every field's writing: plain and escaped
    /// strings, latencies of every shape.
    fn request_lines() -> Vec<RequestLine<'static>> {
        let mut lines = Vec::new();
        for (n, latency) in [0u64, 1, 10, 100, 999, 1000, 1001, 1_277, 12_000, 4_616_123]
            .into_iter()
            .enumerate()
        {
            lines.push(RequestLine {
                id: ["5ddcccd4-7057-41e3-a7dc-e626f51f0182", "trace-42:abc_DEF.1"][n % 2],
                method: ["GET", "HEAD", "OPTIONS"][n % 3],
                path: [
                    "/v1/shortvideo/profile",
                    "/v1/say \"hi\"\\",
                    "/v1/caf\u{e9}\u{200b}\t\u{7f}",
                    "",
                ][n % 4],
                status: [200, 404, 503][n % 3],
                latency: Duration::from_micros(latency),
                provider: ["shortvideo-primary", "-", "odd \"name\""][n % 3],
                cache: ["bypass", "-", "hit"][n % 3],
                attempts: n,
                key: ["bench", "-", "k\u{1}y"][n % 3],
            });
        }
        lines
    }

    /// What the subscriber writes for each line's event, in its span, as
    /// [`init`] sets it up for `format`; without the timestamps.
    fn through_tracing(format: LogFormat, lines: &[RequestLine<'_>]) -> Vec<String> {
        let (captured, builder) = capture();
        let emit = || {
            for line in lines {
                let span = tracing::info_span!("request", id = %line.id);
                span.in_scope(|| line.emit());
            }
        };
        match format {
            LogFormat::Human => {
                let subscriber = builder.fmt_fields(PlainFields).event_format(PlainLine);
                tracing::subscriber::with_default(subscriber.finish(), emit);
            }
            LogFormat::Json => {
                let subscriber = builder.json().with_current_span(true);
                tracing::subscriber::with_default(subscriber.finish(), emit);
            }
        }
        let bytes = captured.0.lock().unwrap().clone();
        let text = String::from_utf8(bytes).unwrap();
        text.lines().map(without_timestamp).collect()
    }

    /// A line without its timestamp, in either format.
    fn without_timestamp(line: &str) -> String {
        match line.strip_prefix("{\"timestamp\":\"") {
            Some(json) => json
                .split_once('"')
                .expect("the timestamp ends")
                .1
                .to_owned(),
            None => line
                .split_once(' ')
                .expect("a timestamp first")
                .1
                .to_owned(),
        }
    }

    #[test]
    fn request_lines_written_directly_are_the_subscribers_lines() {
        let lines = request_lines();
        for format in [LogFormat::Human, LogFormat::Json] {
            let direct: Vec<String> = lines
                .iter()
                .map(|line| {
                    let mut text = String::new();
                    match format {
                        LogFormat::Human => line.write_plain(&mut text),
                        LogFormat::Json => line.write_json(&mut text),
                    }
                    .unwrap();
                    assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
                    without_timestamp(text.trim_end())
                })
                .collect();
            assert_eq!(direct, through_tracing(format, &lines), "{format:?}");
        }
    }

    #[test]
    fn latencies_are_written_as_their_float_is() {
        let check = |micros: u64| {
            let line = RequestLine {
                latency: Duration::from_micros(micros),
                ..request_lines().remove(0)
            };
            let mut text = String::new();
            write_millis(&mut text, line.latency);
            assert_eq!(text, format!("{:?}", line.latency_ms()), "{micros} µs");
            assert_eq!(
                text,
                serde_json::to_string(&line.latency_ms()).unwrap(),
                "{micros} µs in JSON"
            );
        };
        (0..200_000).for_each(check);
        // Then a sparser walk up past a year.
        let mut micros = 200_000u64;
        while micros < 40_000_000_000_000 {
            check(micros);
            check(micros + 1);
            micros = micros * 11 / 10 + 7;
        }
    }
}
