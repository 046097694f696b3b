//! A small HTTP/1.1 client for upstream `GET`s, run on the request's own
//! task.
//!
//! Why not hyper's client: it drives each connection from a task of its
//! own and passes requests, answers and body chunks to it through
//! channels, so every upstream request wakes two tasks back and forth. On
//! a multi-threaded runtime those wake-ups, and the idle workers they stir,
//! cost a large share of a request's CPU (this client took the benchmark
//! from 0.34-0.43x the nginx proxy to 0.51x: `bench/RESULTS.md`). Here
//! the request's task writes the request and reads the answer itself, as
//! nginx's upstream module does: the only wake-ups are the socket's.
//!
//! It speaks what upstream `GET`s need and refuses the rest: one request
//! at a time per connection; keep-alive, with idle connections pooled per
//! target and per thread (the most recently used first, none kept longer
//! than the idle timeout); bodies framed by `Content-Length`, chunked, or by the end of
//! the connection; 1xx answers skipped. A request on a pooled connection
//! that the upstream had closed meanwhile is sent again once on a new one
//! (a `GET` may be).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls_pki_types::ServerName;
use thread_local::ThreadLocal;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::sync::lock;

use crate::FastMap;

/// The longest answer head read.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Headers of one answer head, at most.
const MAX_HEADERS: usize = 128;
/// A chunk-size or trailer line, at most.
const MAX_LINE_BYTES: usize = 8 * 1024;
/// Idle connections kept per target, at most.
const MAX_IDLE_PER_TARGET: usize = 1024;
/// Interim (1xx) answers before the final one, at most.
const MAX_INTERIM_ANSWERS: usize = 8;
/// How much a read asks for at a time.
const READ_CHUNK: usize = 16 * 1024;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("cannot resolve the upstream host: {0}")]
    Resolve(io::Error),
    #[error("connecting failed: {0}")]
    Connect(io::Error),
    #[error("connecting timed out")]
    ConnectTimeout,
    #[error("TLS handshake failed: {0}")]
    Tls(io::Error),
    #[error("the connection failed: {0}")]
    Io(#[from] io::Error),
    #[error("the upstream closed the connection before its answer was complete")]
    Closed,
    /// The answer is not HTTP/1.1 as this client reads it.
    #[error("malformed answer: {0}")]
    Malformed(&'static str),
    #[error("body larger than {0} bytes")]
    TooLarge(usize),
}

/// Where a connection goes: a URL's scheme, host (as its provider's origin
/// spells it: lower case, brackets around an IPv6 address) and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub https: bool,
    pub host: String,
    pub port: u16,
}

/// An answer read in full.
pub struct Answer {
    pub status: u16,
    /// `name: value` lines, names in lower case; values that are not UTF-8
    /// are left out.
    pub header_lines: String,
    pub body: Vec<u8>,
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

struct Connection {
    io: Box<dyn Io>,
    /// What was read and not yet used.
    buffer: Vec<u8>,
    /// Whether the current exchange has read anything at all.
    received: bool,
    idle_since: Instant,
}

impl Connection {
    /// Whether an idle connection can carry a request: nothing arrived on
    /// it while idle. An upstream that closed it, or said something
    /// unasked (a `408` before closing, say), would otherwise have that
    /// taken for the answer to the next request.
    fn is_quiet(&mut self) -> bool {
        let mut byte = [0u8; 1];
        // One poll: `None` means nothing to read, the only good answer.
        // Unconstrained: a task that spent its budget of I/O results would
        // otherwise be told "nothing yet" without the socket being read.
        let read = tokio::task::unconstrained(self.io.read(&mut byte));
        futures_util::FutureExt::now_or_never(read).is_none()
    }
}

/// One thread's idle connections, by target.
#[derive(Default)]
struct Pool {
    /// The thread they belong to ([`this_thread`]): a thread's slot
    /// outlives it, and a later thread may be given the same one.
    thread: u64,
    idle: FastMap<Target, Vec<Connection>>,
}

/// A number for this thread, never given to another: a thread-local read,
/// where `thread::current().id()` would clone the thread's handle on every
/// checkout and checkin.
fn this_thread() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    thread_local! {
        static THIS: u64 = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    THIS.with(|this| *this)
}

/// Opens connections, keeps the idle ones, and runs exchanges on them.
pub struct Client {
    /// A pool per thread: a connection belongs to the runtime of the
    /// thread that opened it, and each serving thread runs one of its own
    /// ([`crate::http::serving`]); nor do the threads contend for a lock.
    idle: ThreadLocal<Mutex<Pool>>,
    tls: TlsConnector,
    connect_timeout: Duration,
    idle_timeout: Duration,
}

impl Client {
    pub fn new(
        tls: Arc<rustls::ClientConfig>,
        connect_timeout: Duration,
        idle_timeout: Duration,
    ) -> Client {
        Client {
            idle: ThreadLocal::new(),
            tls: TlsConnector::from(tls),
            connect_timeout,
            idle_timeout,
        }
    }

    /// Sends `request` (a whole request head) to `target` and reads the
    /// answer, its body up to `max_body` bytes.
    pub async fn exchange(
        &self,
        target: &Target,
        request: &[u8],
        max_body: usize,
    ) -> Result<Answer, WireError> {
        if let Some(mut connection) = self.checkout(target) {
            match exchange(&mut connection, request, max_body).await {
                Ok((answer, reusable)) => {
                    self.checkin(target, connection, reusable);
                    return Ok(answer);
                }
                // Closed while idle: a new connection gets the request.
                Err(Failed {
                    nothing_read: true, ..
                }) => {}
                Err(Failed { error, .. }) => return Err(error),
            }
        }
        let mut connection = self.connect(target).await?;
        let (answer, reusable) = exchange(&mut connection, request, max_body)
            .await
            .map_err(|failed| failed.error)?;
        self.checkin(target, connection, reusable);
        Ok(answer)
    }

    /// The most recently used idle connection to `target` that is not too
    /// old and said nothing while idle; the others are closed.
    fn checkout(&self, target: &Target) -> Option<Connection> {
        // Each turn takes one connection out of the pool: bounded by its
        // size. The look at the socket is made outside the pool's lock.
        loop {
            let mut connection = self.pop_recent(target)?;
            if connection.is_quiet() {
                return Some(connection);
            }
        }
    }

    /// The most recently used idle connection to `target`, unless it is
    /// too old, and then so is every other: all are closed.
    fn pop_recent(&self, target: &Target) -> Option<Connection> {
        let mut pool = self.this_threads_pool();
        let connections = pool.idle.get_mut(target)?;
        let connection = connections.pop()?;
        if self.expired(&connection) {
            connections.clear();
            return None;
        }
        Some(connection)
    }

    /// This thread's idle connections. Those of a thread that ended (its
    /// runtime gone with it) are closed.
    fn this_threads_pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        let mut pool = lock(self.idle.get_or_default());
        let this = this_thread();
        if pool.thread != this {
            pool.idle.clear();
            pool.thread = this;
        }
        pool
    }

    fn expired(&self, connection: &Connection) -> bool {
        connection.idle_since.elapsed() >= self.idle_timeout
    }

    fn checkin(&self, target: &Target, mut connection: Connection, reusable: bool) {
        if !reusable {
            return;
        }
        connection.idle_since = Instant::now();
        let mut pool = self.this_threads_pool();
        // The target is copied only for its first connection.
        let connections = crate::entry_or_default(&mut pool.idle, target);
        // The oldest are first: those past the idle timeout go now, so a
        // quiet target does not keep them open until its next request.
        let expired = connections.iter().take_while(|c| self.expired(c)).count();
        connections.drain(..expired);
        if connections.len() < MAX_IDLE_PER_TARGET {
            connections.push(connection);
        }
    }

    /// Closes the idle connections that are past the idle timeout or were
    /// closed (or spoke) while idle, in every target's pool, and forgets
    /// the targets left without any. Run every so often by [`reap`]: an
    /// upstream that closed its side would otherwise leave our socket
    /// half-closed (`CLOSE_WAIT`) until the target's next request, and a
    /// target that goes quiet for good would keep its sockets for ever.
    pub fn prune(&self) {
        for pool in self.idle.iter() {
            self.prune_pool(pool);
        }
    }

    /// [`prune`](Self::prune) for one thread's pool. Its sockets belong to
    /// that thread's runtime; looking at one or closing it from here is
    /// safe, as those looked at are first taken out of the pool, under its
    /// lock, where that thread cannot take them meanwhile.
    fn prune_pool(&self, pool: &Mutex<Pool>) {
        // The connections idle for a while, the oldest of each pool: the
        // recent ones stay where requests take them from meanwhile.
        let checked: Vec<(Target, Vec<Connection>)> = {
            let mut pool = lock(pool);
            pool.idle.retain(|_, connections| !connections.is_empty());
            pool.idle
                .iter_mut()
                .map(|(target, connections)| {
                    let settled = connections
                        .iter()
                        .take_while(|c| c.idle_since.elapsed() >= SETTLED)
                        .count();
                    (target.clone(), connections.drain(..settled).collect())
                })
                .collect()
        };
        // The look at each socket is made outside the pool's lock.
        for (target, connections) in checked {
            let mut kept: Vec<Connection> = connections
                .into_iter()
                .filter(|c| !self.expired(c))
                .filter_map(|mut c| c.is_quiet().then_some(c))
                .collect();
            let mut pool = lock(pool);
            let connections = pool.idle.entry(target).or_default();
            // Older than those left in the pool.
            kept.append(connections);
            let excess = kept.len().saturating_sub(MAX_IDLE_PER_TARGET);
            kept.drain(..excess);
            *connections = kept;
        }
        lock(pool)
            .idle
            .retain(|_, connections| !connections.is_empty());
    }

    /// Idle connections, in every target's pool of every thread.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle
            .iter()
            .map(|pool| lock(pool).idle.values().map(Vec::len).sum::<usize>())
            .sum()
    }

    async fn connect(&self, target: &Target) -> Result<Connection, WireError> {
        let connecting = async {
            let host = target.host.trim_start_matches('[').trim_end_matches(']');
            let tcp = match host.parse::<IpAddr>() {
                Ok(ip) => TcpStream::connect(SocketAddr::new(ip, target.port))
                    .await
                    .map_err(WireError::Connect)?,
                Err(_) => connect_by_name(host, target.port).await?,
            };
            tcp.set_nodelay(true).map_err(WireError::Connect)?;
            // The answer is read next, under the attempt's deadline: a flush is
            // done once the request is queued.

            if !target.https {
                return Ok::<Box<dyn Io>, WireError>(Box::new(tcp));
            }
            let name = ServerName::try_from(host.to_owned())
                .map_err(|_| WireError::Malformed("the host is not a valid TLS server name"))?;
            let tls = self.tls.connect(name, tcp).await.map_err(WireError::Tls)?;
            Ok(Box::new(tls))
        };
        let io = tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| WireError::ConnectTimeout)??;
        Ok(Connection {
            io,
            buffer: Vec::new(),
            received: false,
            idle_since: Instant::now(),
        })
    }
}

/// How long a connection must have been idle before [`Client::prune`]
/// looks at it: the ones just put back are left for the next request.
const SETTLED: Duration = Duration::from_secs(1);

/// Prunes `client`'s idle connections every `every` ([`Client::prune`])
/// for as long as the client is in use.
pub async fn reap(client: std::sync::Weak<Client>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(client) = client.upgrade() else {
            return;
        };
        client.prune();
    }
}

/// Tries each address the name resolves to, in order.
async fn connect_by_name(host: &str, port: u16) -> Result<TcpStream, WireError> {
    let mut last = None;
    for address in tokio::net::lookup_host((host, port))
        .await
        .map_err(WireError::Resolve)?
    {
        match TcpStream::connect(address).await {
            Ok(tcp) => return Ok(tcp),
            Err(e) => last = Some(e),
        }
    }
    Err(WireError::Connect(last.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, "no address")
    })))
}

/// A failed exchange, and whether the upstream had sent nothing at all
/// (on a pooled connection: it had closed it while idle).
struct Failed {
    error: WireError,
    nothing_read: bool,
}

/// One request and its answer on `connection`; the answer, and whether
/// the connection may carry another request.
async fn exchange(
    connection: &mut Connection,
    request: &[u8],
    max_body: usize,
) -> Result<(Answer, bool), Failed> {
    let sent = async {
        connection.io.write_all(request).await?;
        connection.io.flush().await
    };
    if let Err(e) = sent.await {
        return Err(Failed {
            error: WireError::Io(e),
            nothing_read: true,
        });
    }
    connection.buffer.clear();
    connection.received = false;
    let (head, head_len) = match read_head(connection).await {
        Ok(read) => read,
        Err(error) => {
            let closed = match &error {
                WireError::Closed => true,
                // (UnexpectedEof: a TLS peer closing without close_notify.)
                WireError::Io(e) => matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::UnexpectedEof
                        // The request's send failing, reported at the read
                        // (its write was queued: `Flushed::WhenQueued`).
                        | io::ErrorKind::BrokenPipe
                ),
                _ => false,
            };
            return Err(Failed {
                error,
                nothing_read: closed && !connection.received,
            });
        }
    };
    let failed = |error| Failed {
        error,
        nothing_read: false,
    };
    connection.buffer.drain(..head_len);
    let (body, framed) = match head.framing {
        Framing::Empty => (Vec::new(), true),
        Framing::Length(length) => {
            if length > max_body as u64 {
                return Err(failed(WireError::TooLarge(max_body)));
            }
            (
                read_length(connection, length as usize)
                    .await
                    .map_err(failed)?,
                true,
            )
        }
        Framing::Chunked => (
            read_chunked(connection, max_body).await.map_err(failed)?,
            true,
        ),
        Framing::UntilClose => (
            read_to_end(connection, max_body).await.map_err(failed)?,
            false,
        ),
    };
    // Anything after the body is not an answer to anything: the
    // connection is not trusted with another request.
    let reusable = framed && head.keep_alive && connection.buffer.is_empty();
    Ok((
        Answer {
            status: head.status,
            header_lines: head.header_lines,
            body,
        },
        reusable,
    ))
}

/// How an answer's body ends (RFC 9112, section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilClose,
}

struct Head {
    status: u16,
    header_lines: String,
    framing: Framing,
    keep_alive: bool,
}

/// Reads until a final (non-1xx) answer head is complete; its length in
/// the buffer comes back with it.
async fn read_head(connection: &mut Connection) -> Result<(Head, usize), WireError> {
    let mut interim = 0;
    // A head ends with a line end: parsing again waits for a new one, so
    // a head sent a byte at a time is not parsed once per byte.
    let mut new_line = !connection.buffer.is_empty();
    loop {
        if new_line {
            if let Some((head, len)) = parse_head(&connection.buffer)? {
                if !(100..200).contains(&head.status) {
                    return Ok((head, len));
                }
                // An interim answer (100 Continue, 103 Early Hints): the
                // final one follows, after a few of them at most.
                interim += 1;
                if interim > MAX_INTERIM_ANSWERS {
                    return Err(WireError::Malformed("too many interim answers"));
                }
                connection.buffer.drain(..len);
                continue;
            }
        }
        if connection.buffer.len() >= MAX_HEAD_BYTES {
            return Err(WireError::Malformed("answer head too large"));
        }
        let before = connection.buffer.len();
        if read_more(connection).await? == 0 {
            return Err(WireError::Closed);
        }
        new_line = connection.buffer[before..].contains(&b'\n');
    }
}

/// Parses an answer head at the start of `bytes`: `None` while it is
/// incomplete.
fn parse_head(bytes: &[u8]) -> Result<Option<(Head, usize)>, WireError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut slots);
    let len = match response.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(WireError::Malformed("too many headers"))
        }
        Err(_) => return Err(WireError::Malformed("not an HTTP/1 answer head")),
    };
    let status = response.code.unwrap_or(0);
    let http11 = response.version == Some(1);
    let mut close = !http11;
    let mut chunked = false;
    let mut transfer_encoding = false;
    let mut length: Option<u64> = None;
    // One string for every header: a plugin reads them in place, if at all.
    let mut header_lines = String::with_capacity(len);
    for header in response.headers.iter() {
        let name = header.name;
        let Ok(value) = std::str::from_utf8(header.value) else {
            if ["connection", "transfer-encoding", "content-length"]
                .iter()
                .any(|framing| name.eq_ignore_ascii_case(framing))
            {
                // Read one way or another, it would frame the body wrong.
                return Err(WireError::Malformed("a framing header that is not text"));
            }
            continue;
        };
        let start = header_lines.len();
        header_lines.push_str(name);
        header_lines[start..].make_ascii_lowercase();
        match &header_lines[start..] {
            "connection" => {
                for token in value.split(',').map(str::trim) {
                    if token.eq_ignore_ascii_case("close") {
                        close = true;
                    } else if token.eq_ignore_ascii_case("keep-alive") && !http11 {
                        close = false;
                    }
                }
            }
            "transfer-encoding" => {
                transfer_encoding = true;
                chunked = value
                    .rsplit(',')
                    .next()
                    .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
            }
            "content-length" => {
                let parsed = value
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| WireError::Malformed("invalid Content-Length"))?;
                if length.is_some_and(|earlier| earlier != parsed) {
                    return Err(WireError::Malformed("conflicting Content-Length"));
                }
                length = Some(parsed);
            }
            _ => {}
        }
        header_lines.push_str(": ");
        header_lines.push_str(value);
        header_lines.push('\n');
    }
    let framing = if (100..200).contains(&status) || status == 204 || status == 304 {
        Framing::Empty
    } else if transfer_encoding {
        // With both, Transfer-Encoding wins, and the connection ends
        // with the answer (RFC 9112, 6.3).
        if length.is_some() {
            close = true;
        }
        if chunked && http11 {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else {
        length.map_or(Framing::UntilClose, Framing::Length)
    };
    Ok(Some((
        Head {
            status,
            header_lines,
            framing,
            keep_alive: !close,
        },
        len,
    )))
}

/// Reads more into the connection's buffer; 0 at the end of the stream.
async fn read_more(connection: &mut Connection) -> io::Result<usize> {
    connection.buffer.reserve(READ_CHUNK);
    let read = connection.io.read_buf(&mut connection.buffer).await?;
    connection.received |= read > 0;
    Ok(read)
}

async fn read_length(connection: &mut Connection, length: usize) -> Result<Vec<u8>, WireError> {
    while connection.buffer.len() < length {
        if read_more(connection).await? == 0 {
            return Err(WireError::Closed);
        }
    }
    let rest = connection.buffer.split_off(length);
    Ok(std::mem::replace(&mut connection.buffer, rest))
}

async fn read_to_end(connection: &mut Connection, max_body: usize) -> Result<Vec<u8>, WireError> {
    loop {
        if connection.buffer.len() > max_body {
            return Err(WireError::TooLarge(max_body));
        }
        match read_more(connection).await {
            Ok(0) => return Ok(std::mem::take(&mut connection.buffer)),
            Ok(_) => {}
            // Over TLS, an end without close_notify may be an attacker's
            // cut, not the body's end (RFC 9112, 9.8): an error.
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads a chunked body (RFC 9112, section 7.1); trailers are read and
/// dropped. The buffer is consumed through a cursor and compacted only
/// before a read, so many tiny chunks cost no more than one large one.
async fn read_chunked(connection: &mut Connection, max_body: usize) -> Result<Vec<u8>, WireError> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let line = next_line(connection, &mut at).await?;
        let size = chunk_size(&connection.buffer[line])?;
        if size == 0 {
            break;
        }
        if size > max_body - body.len() {
            return Err(WireError::TooLarge(max_body));
        }
        while connection.buffer.len() < at + size + 2 {
            refill(connection, &mut at).await?;
        }
        if &connection.buffer[at + size..at + size + 2] != b"\r\n" {
            return Err(WireError::Malformed("chunk not followed by CRLF"));
        }
        body.extend_from_slice(&connection.buffer[at..at + size]);
        at += size + 2;
    }
    // Trailers, up to the empty line, within the bounds of a head.
    let mut trailers = 0;
    loop {
        let line = next_line(connection, &mut at).await?;
        if line.is_empty() {
            break;
        }
        trailers += line.len() + 2;
        if trailers > MAX_HEAD_BYTES {
            return Err(WireError::Malformed("trailers too large"));
        }
    }
    connection.buffer.drain(..at);
    Ok(body)
}

/// The range of the next line from `at` in the buffer, without its CRLF;
/// `at` moves past it.
async fn next_line(
    connection: &mut Connection,
    at: &mut usize,
) -> Result<std::ops::Range<usize>, WireError> {
    let mut searched = *at;
    loop {
        if let Some(found) = connection.buffer[searched..]
            .windows(2)
            .position(|pair| pair == b"\r\n")
        {
            let line = *at..searched + found;
            *at = line.end + 2;
            return Ok(line);
        }
        if connection.buffer.len() - *at > MAX_LINE_BYTES {
            return Err(WireError::Malformed("chunk or trailer line too long"));
        }
        // A CR at the end may be half of the CRLF.
        searched = connection.buffer.len().saturating_sub(1).max(*at);
        let moved = *at;
        refill(connection, at).await?;
        searched -= moved - *at;
    }
}

/// Drops what the cursor has passed, then reads more; the end of the
/// stream here means the body was cut short.
async fn refill(connection: &mut Connection, at: &mut usize) -> Result<(), WireError> {
    connection.buffer.drain(..*at);
    *at = 0;
    if read_more(connection).await? == 0 {
        return Err(WireError::Closed);
    }
    Ok(())
}

/// A chunk-size line: hex digits, then optional extensions after `;`.
fn chunk_size(line: &[u8]) -> Result<usize, WireError> {
    let digits = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return Err(WireError::Malformed("invalid chunk size"));
    }
    let text =
        std::str::from_utf8(digits).map_err(|_| WireError::Malformed("invalid chunk size"))?;
    usize::from_str_radix(text, 16).map_err(|_| WireError::Malformed("invalid chunk size"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::net::TcpListener;

    /// An upstream on 127.0.0.1 that answers each request head it reads
    /// with the next of `answers` (raw bytes), closing the connection after
    /// an answer when told to. Counts the connections it accepted.
    async fn scripted(answers: Vec<(&'static str, bool)>) -> (Target, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            let mut answers = answers.into_iter();
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let mut seen = Vec::new();
                loop {
                    let mut buffer = [0u8; 4096];
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => seen.extend_from_slice(&buffer[..n]),
                    }
                    if !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        continue;
                    }
                    seen.clear();
                    let Some((answer, close)) = answers.next() else {
                        return;
                    };
                    socket.write_all(answer.as_bytes()).await.unwrap();
                    if close {
                        break;
                    }
                }
            }
        });
        let target = Target {
            https: false,
            host: "127.0.0.1".into(),
            port,
        };
        (target, accepted)
    }

    fn client() -> Client {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        Client::new(
            Arc::new(tls),
            Duration::from_secs(5),
            Duration::from_secs(60),
        )
    }

    const GET: &[u8] = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";

    #[tokio::test]
    async fn a_kept_alive_connection_carries_the_next_request() {
        let (target, accepted) = scripted(vec![
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst", false),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nsec\r\n3\r\nond\r\n0\r\nX-Trailer: t\r\n\r\n",
                false,
            ),
            ("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", false),
        ])
        .await;
        let client = client();
        let first = client.exchange(&target, GET, 1024).await.unwrap();
        assert_eq!((first.status, &first.body[..]), (200, &b"first"[..]));
        let second = client.exchange(&target, GET, 1024).await.unwrap();
        assert_eq!(second.body, b"second");
        let third = client.exchange(&target, GET, 1024).await.unwrap();
        assert_eq!((third.status, third.body.len()), (204, 0));
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for all three"
        );
    }

    #[tokio::test]
    async fn a_body_of_many_tiny_chunks_comes_out_whole() {
        let mut answer = String::from("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        for n in 0..20_000 {
            answer.push_str(&format!("1\r\n{}\r\n", n % 10));
        }
        answer.push_str("0\r\n\r\n");
        let (target, _) = scripted(vec![(answer.leak(), false)]).await;
        let body = client().exchange(&target, GET, 1 << 20).await.unwrap().body;
        assert_eq!(body.len(), 20_000);
        assert!(body
            .iter()
            .enumerate()
            .all(|(n, b)| *b == b'0' + (n % 10) as u8));
    }

    #[tokio::test]
    async fn a_connection_closed_while_idle_or_by_its_answer_is_not_reused() {
        let (target, accepted) = scripted(vec![
            // Kept alive, then closed by the upstream while idle: the next
            // request goes again on a new connection.
            ("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na", true),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\nb",
                false,
            ),
            // Framed by the end of the connection.
            ("HTTP/1.1 200 OK\r\n\r\nuntil the end", true),
            ("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nd", false),
        ])
        .await;
        let client = client();
        for expected in [&b"a"[..], b"b", b"until the end", b"d"] {
            let answer = client.exchange(&target, GET, 1024).await.unwrap();
            assert_eq!(answer.body, expected);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 4);
    }

    /// Pruning closes what the upstream closed while idle, and keeps what
    /// is still open.
    #[tokio::test]
    async fn pruning_closes_idle_connections_the_upstream_closed() {
        let (closing, _) = scripted(vec![(
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na",
            true,
        )])
        .await;
        let (open, _) = scripted(vec![(
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb",
            false,
        )])
        .await;
        let client = client();
        client.exchange(&closing, GET, 1024).await.unwrap();
        client.exchange(&open, GET, 1024).await.unwrap();
        assert_eq!(
            client.idle_count(),
            2,
            "both kept alive after their answers"
        );
        // Pruning looks only at connections idle for a while.
        tokio::time::sleep(SETTLED).await;
        let mut pruned = false;
        for _ in 0..100 {
            client.prune();
            if client.idle_count() == 1 {
                pruned = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(pruned, "the closed one is gone: {}", client.idle_count());
        // A current-thread test runtime: this thread's pool is the one.
        let pool = client.this_threads_pool();
        assert!(pool.idle.contains_key(&open), "the open one stays");
        assert!(!pool.idle.contains_key(&closing), "its target forgotten");
    }

    /// A connection opened on one thread is reused there, never on another
    /// (each serving thread has a runtime of its own), nor by a thread
    /// given the slot of one that ended.
    #[test]
    fn each_thread_keeps_its_own_idle_connections() {
        // An upstream that keeps every connection open, answering each
        // request head with the same short answer.
        let upstream = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let listener = upstream.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let target = Target {
            https: false,
            host: "127.0.0.1".into(),
            port: listener.local_addr().unwrap().port(),
        };
        let counter = accepted.clone();
        upstream.spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buffer = [0u8; 4096];
                    while let Ok(1..) = socket.read(&mut buffer).await {
                        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na";
                        if socket.write_all(answer).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let client = Arc::new(client());
        // Two exchanges on a thread of its own, which waits at `until`
        // before it ends.
        let exchanging = |until: Arc<std::sync::Barrier>| {
            let (client, target) = (client.clone(), target.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    for _ in 0..2 {
                        client.exchange(&target, GET, 1024).await.unwrap();
                    }
                });
                until.wait();
            })
        };
        let both_done = Arc::new(std::sync::Barrier::new(3));
        let threads = [exchanging(both_done.clone()), exchanging(both_done.clone())];
        // Both threads exchanged and still run.
        let deadline = Instant::now() + Duration::from_secs(10);
        while (accepted.load(Ordering::SeqCst) < 2 || client.idle_count() < 2)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(client.idle_count(), 2, "one idle on each thread");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "one connection a thread"
        );
        both_done.wait();
        for thread in threads {
            thread.join().unwrap();
        }
        // A thread after them opens its own, whatever slot it is given.
        let last = Arc::new(std::sync::Barrier::new(1));
        exchanging(last).join().unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    /// Every pooled connection is looked at, however many: more than one
    /// task's budget of I/O results (tokio's is 128 a poll).
    #[tokio::test]
    async fn pruning_looks_at_every_idle_connection() {
        const MANY: usize = 300;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            // Each connection: one answer, kept alive, then closed.
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 4096];
                    let _ = socket.read(&mut buffer).await;
                    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx";
                    let _ = socket.write_all(answer).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                });
            }
        });
        let target = Target {
            https: false,
            host: "127.0.0.1".into(),
            port,
        };
        let client = Arc::new(client());
        let exchanges: Vec<_> = (0..MANY)
            .map(|_| {
                let (client, target) = (client.clone(), target.clone());
                tokio::spawn(async move { client.exchange(&target, GET, 1024).await })
            })
            .collect();
        for exchange in exchanges {
            assert_eq!(exchange.await.unwrap().unwrap().body, b"x");
        }
        assert_eq!(client.idle_count(), MANY, "each kept alive");
        // All closed by the upstream, and idle long enough to be looked at.
        tokio::time::sleep(SETTLED + Duration::from_millis(200)).await;
        client.prune();
        assert_eq!(client.idle_count(), 0, "every closed one seen in one go");
    }

    /// An upstream that says something unasked on an idle connection (here
    /// a 408 before it closes it): that is not the next request's answer.
    #[tokio::test]
    async fn a_connection_that_spoke_while_idle_is_not_reused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for body in ["first", "fresh"] {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut buffer = [0u8; 4096];
                let _ = socket.read(&mut buffer).await;
                let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{body}");
                socket.write_all(answer.as_bytes()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n")
                    .await;
                // Held open: only the unasked answer says it is done.
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    drop(socket);
                });
            }
        });
        let target = Target {
            https: false,
            host: "127.0.0.1".into(),
            port,
        };
        let client = client();
        let first = client.exchange(&target, GET, 1024).await.unwrap();
        assert_eq!(first.body, b"first");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let second = client.exchange(&target, GET, 1024).await.unwrap();
        assert_eq!((second.status, &second.body[..]), (200, &b"fresh"[..]));
    }

    #[tokio::test]
    async fn bodies_past_the_cap_or_cut_short_fail() {
        let (target, _) = scripted(vec![
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789",
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n0\r\n\r\n",
                false,
            ),
            ("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", true),
        ])
        .await;
        let client = client();
        for _ in 0..2 {
            let error = client.exchange(&target, GET, 9).await.err().unwrap();
            assert!(matches!(error, WireError::TooLarge(9)), "{error}");
        }
        let error = client.exchange(&target, GET, 1024).await.err().unwrap();
        assert!(matches!(error, WireError::Closed), "{error}");
    }

    fn head(text: &str) -> Head {
        parse_head(text.as_bytes()).unwrap().unwrap().0
    }

    #[test]
    fn framing_follows_rfc_9112() {
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n").framing,
            Framing::Length(5)
        );
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").framing,
            Framing::Chunked
        );
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n").framing,
            Framing::UntilClose
        );
        assert_eq!(head("HTTP/1.1 200 OK\r\n\r\n").framing, Framing::UntilClose);
        assert_eq!(
            head("HTTP/1.1 204 No Content\r\n\r\n").framing,
            Framing::Empty
        );
        assert_eq!(
            head("HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n").framing,
            Framing::Empty
        );
        let both =
            head("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(both.framing, Framing::Chunked);
        assert!(!both.keep_alive, "an answer with both ends its connection");
    }

    #[test]
    fn keep_alive_is_http_1_1_without_close() {
        assert!(head("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").keep_alive);
        assert!(
            !head("HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n").keep_alive
        );
        assert!(!head("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n").keep_alive);
        assert!(
            head("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n")
                .keep_alive
        );
    }

    #[test]
    fn bad_heads_are_malformed_and_partial_ones_wait() {
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Le")
            .unwrap()
            .is_none());
        for bad in [
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "<html>\r\n\r\n",
        ] {
            assert!(parse_head(bad.as_bytes()).is_err(), "{bad}");
        }
        let lines = head("HTTP/1.1 200 OK\r\nX-Thing: a\r\nContent-Length: 0\r\n\r\n").header_lines;
        assert_eq!(lines, "x-thing: a\ncontent-length: 0\n");
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(chunk_size(b"1a").unwrap(), 26);
        assert_eq!(chunk_size(b"0").unwrap(), 0);
        assert_eq!(chunk_size(b"A ; name=value").unwrap(), 10);
        for bad in [&b""[..], b"x", b"-1", b"1 2", b"ffffffffffffffff"] {
            assert!(chunk_size(bad).is_err(), "{bad:?}");
        }
    }
}
