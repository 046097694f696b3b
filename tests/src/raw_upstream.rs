//! [`RawUpstream`]: an upstream double on raw TCP, for the faults wiremock
//! cannot express: a connection reset in the middle of the body, headers
//! that never come, a body that trickles in, a body streamed without a
//! length. [`closed_port`] gives an address where nothing listens.
//!
//! It reads each request head, records it (so a test can check it was the
//! contract's request and count it, and how many were in flight at once),
//! then misbehaves as told. Every answer
//! carries `Connection: close`, so no client reuses a connection and every
//! request is one connection. It runs on a thread of its own with its own
//! runtime, whatever the test's runtime; dropping it stops it and ends every
//! connection it holds.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The largest request head it reads; a larger one is dropped unanswered.
const MAX_HEAD: usize = 64 * 1024;

/// What the double does once it has read a request head.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// A complete `200` with `body` and its `Content-Length`.
    Respond { body: Vec<u8> },
    /// The same, after a pause of `after`: a slow upstream.
    Delayed { body: Vec<u8>, after: Duration },
    /// A `200` with `body` in chunked encoding, no `Content-Length`.
    Chunked { body: Vec<u8> },
    /// The head with the full `Content-Length` of `body`, the first half of
    /// the body, then a TCP reset (`SO_LINGER` 0).
    ResetMidBody { body: Vec<u8> },
    /// Never answers: holds the connection until the client leaves or the
    /// double is dropped.
    Silent,
    /// A bodiless answer with this status line (`407 Proxy Authentication
    /// Required`, say): a proxy refusing.
    Refuse { status_line: &'static str },
    /// The head with the full `Content-Length` of `body`, then the body one
    /// byte every `every`, until it is sent or the client leaves.
    Trickle { body: Vec<u8>, every: Duration },
}

/// Requests received and not yet answered (or given up on): now and at most.
#[derive(Debug, Default)]
struct InFlight {
    now: AtomicUsize,
    max: AtomicUsize,
}

/// Counts one request in flight while it lives.
struct Counted<'a>(&'a InFlight);

impl<'a> Counted<'a> {
    fn new(in_flight: &'a InFlight) -> Counted<'a> {
        let now = in_flight.now.fetch_add(1, Ordering::SeqCst) + 1;
        in_flight.max.fetch_max(now, Ordering::SeqCst);
        Counted(in_flight)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One request head as received.
#[derive(Debug, Clone)]
pub struct RawRequest {
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    /// Names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
}

impl RawRequest {
    /// A header's value by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::api::header_value(&self.headers, name)
    }
}

/// A running raw double; stopped when dropped.
pub struct RawUpstream {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<RawRequest>>>,
    in_flight: Arc<InFlight>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RawUpstream {
    /// Listens on `127.0.0.1:0` and treats every request with `behaviour`.
    pub fn start(behaviour: Behaviour) -> RawUpstream {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("can bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("can make the listener non-blocking");
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(InFlight::default());
        let (stop, stopped) = watch::channel(false);
        let recorded = Arc::clone(&requests);
        let counted = Arc::clone(&in_flight);
        let behaviour = Arc::new(behaviour);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("can build the double's runtime");
            runtime.block_on(accept_loop(listener, behaviour, recorded, counted, stopped));
            // Dropping the runtime ends every connection task still running.
        });
        RawUpstream {
            addr,
            requests,
            in_flight,
            stop,
            thread: Some(thread),
        }
    }

    /// A slow primary: every request answered with the primary's profile
    /// fixture after `after`.
    pub fn slow_primary_profile(after: Duration) -> RawUpstream {
        let body = crate::upstream::render(&crate::upstream::fixtures::primary_user_profile());
        RawUpstream::start(Behaviour::Delayed {
            body: body.into_bytes(),
            after,
        })
    }

    /// `http://127.0.0.1:PORT`, a provider's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request head received so far, in order.
    pub fn requests(&self) -> Vec<RawRequest> {
        self.requests.lock().expect("not poisoned").clone()
    }

    pub fn request_count(&self) -> usize {
        self.requests.lock().expect("not poisoned").len()
    }

    /// Requests received and not yet answered (or given up on).
    pub fn in_flight(&self) -> usize {
        self.in_flight.now.load(Ordering::SeqCst)
    }

    /// The most requests that were ever in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.in_flight.max.load(Ordering::SeqCst)
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An address on 127.0.0.1 where nothing listens: a connection to it is
/// refused. (Bound, then released; nothing else here binds it meanwhile.)
pub fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("can bind 127.0.0.1:0");
    listener
        .local_addr()
        .expect("a bound listener has an address")
}

async fn accept_loop(
    listener: std::net::TcpListener,
    behaviour: Arc<Behaviour>,
    requests: Arc<Mutex<Vec<RawRequest>>>,
    in_flight: Arc<InFlight>,
    mut stopped: watch::Receiver<bool>,
) {
    let listener = TcpListener::from_std(listener).expect("can hand the listener to tokio");
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
            _ = stopped.changed() => return,
        };
        let behaviour = Arc::clone(&behaviour);
        let requests = Arc::clone(&requests);
        let in_flight = Arc::clone(&in_flight);
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = serve(stream, &behaviour, &requests, &in_flight) => {}
                _ = stopped.changed() => {}
            }
        });
    }
}

/// One connection: one request, treated with `behaviour`.
async fn serve(
    mut stream: TcpStream,
    behaviour: &Behaviour,
    requests: &Mutex<Vec<RawRequest>>,
    in_flight: &InFlight,
) {
    let Some(request) = read_head(&mut stream).await else {
        return;
    };
    let _counted = Counted::new(in_flight);
    requests.lock().expect("not poisoned").push(request);
    // Write errors mean the client left: the fault has done its work.
    match behaviour {
        Behaviour::Refuse { status_line } => {
            let refusal =
                format!("HTTP/1.1 {status_line}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            let _ = stream.write_all(refusal.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        Behaviour::Respond { body } => {
            let _ = stream.write_all(&head(Some(body.len()))).await;
            let _ = stream.write_all(body).await;
            let _ = stream.shutdown().await;
        }
        Behaviour::Delayed { body, after } => {
            tokio::time::sleep(*after).await;
            let _ = stream.write_all(&head(Some(body.len()))).await;
            let _ = stream.write_all(body).await;
            let _ = stream.shutdown().await;
        }
        Behaviour::Chunked { body } => {
            let _ = stream.write_all(&head(None)).await;
            for chunk in body.chunks(4096) {
                let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
                framed.extend_from_slice(chunk);
                framed.extend_from_slice(b"\r\n");
                if stream.write_all(&framed).await.is_err() {
                    return;
                }
            }
            let _ = stream.write_all(b"0\r\n\r\n").await;
            let _ = stream.shutdown().await;
        }
        Behaviour::ResetMidBody { body } => {
            let _ = stream.write_all(&head(Some(body.len()))).await;
            let _ = stream.write_all(&body[..body.len() / 2]).await;
            let _ = stream.flush().await;
            // Let the head and the first half arrive before the reset.
            tokio::time::sleep(Duration::from_millis(30)).await;
            let _ = stream.set_zero_linger();
            drop(stream);
        }
        Behaviour::Silent => {
            // Until the client closes; whatever it sends is ignored.
            let mut buf = [0u8; 1024];
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        }
        Behaviour::Trickle { body, every } => {
            if stream.write_all(&head(Some(body.len()))).await.is_err() {
                return;
            }
            for byte in body {
                tokio::time::sleep(*every).await;
                if stream.write_all(std::slice::from_ref(byte)).await.is_err() {
                    return;
                }
            }
            let _ = stream.shutdown().await;
        }
    }
}

/// A `200` head, with `Content-Length` or chunked.
fn head(content_length: Option<usize>) -> Vec<u8> {
    let framing = match content_length {
        Some(n) => format!("content-length: {n}\r\n"),
        None => "transfer-encoding: chunked\r\n".to_owned(),
    };
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{framing}connection: close\r\n\r\n"
    )
    .into_bytes()
}

/// Reads up to the blank line that ends a request head and parses it.
async fn read_head(stream: &mut TcpStream) -> Option<RawRequest> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let text = String::from_utf8_lossy(&buf[..end]);
    let mut lines = text.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let target = request_line.next()?.to_owned();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(RawRequest {
        method,
        target,
        headers,
    })
}
