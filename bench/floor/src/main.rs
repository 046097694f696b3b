//! The floor of bench/run.sh: socialgate's stack forwarding requests, with
//! none of socialgate's work.
//!
//! The same runtimes (as socialgate's serving threads: that many threads,
//! each with a single-threaded runtime accepting from the one listener and
//! serving its own connections), the same HTTP server (hyper's HTTP/1.1
//! connections, `TCP_NODELAY`, writes sent a turn at a time:
//! `socialgate::write_batch`) and the same upstream client (`socialgate::upstream::direct`, which
//! exchanges on the request's own task, with the server's settings and
//! request head) as socialgate, and the same allocator. Each request is
//! sent on to one upstream with its path, query and headers (but
//! `Connection`, and `Host`, which names the upstream);
//! the answer is read whole, as nginx's proxy buffers it, and sent back
//! with its status, headers (but the hop-by-hop ones) and body. No key, no
//! plugin, no parse, no log line: measured beside nginx and socialgate, it
//! separates what the stack costs on a machine from what socialgate's own
//! work costs.
//!
//! Usage: `floor-proxy UPSTREAM_ORIGIN THREADS`, e.g.
//! `floor-proxy http://127.0.0.1:8080 2`. It listens on a free port of
//! 127.0.0.1 and prints `listening on http://ADDR` once it accepts.

use std::convert::Infallible;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, CONNECTION, HOST};
use hyper::http::uri::Authority;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use socialgate::upstream::wire::{Client, Target};
use socialgate::upstream::{direct, request_head, DEFAULT_MAX_BODY_BYTES};
use socialgate::write_batch::{Batched, Flushed};

// The allocator socialgate uses, so the two differ only in their work.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Answer headers that describe the upstream hop, not the answer.
const HOP_BY_HOP: [&str; 4] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
];

/// Where requests go.
struct Upstream {
    client: Client,
    target: Target,
    /// The `Host` every forwarded request names.
    authority: Authority,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(origin), Some(threads), None) = (args.next(), args.next(), args.next()) else {
        return Err("usage: floor-proxy UPSTREAM_ORIGIN THREADS".into());
    };
    let origin: Uri = origin.parse()?;
    let (Some("http"), Some(authority)) = (origin.scheme_str(), origin.authority()) else {
        return Err("UPSTREAM_ORIGIN must be like http://127.0.0.1:8080".into());
    };
    let threads: usize = threads.parse()?;
    if threads == 0 {
        return Err("THREADS must be at least 1".into());
    }
    let upstream = Arc::new(Upstream {
        client: direct(&[])?,
        target: Target {
            https: false,
            host: authority.host().to_owned(),
            port: authority.port_u16().unwrap_or(80),
        },
        authority: authority.clone(),
    });
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let address = listener.local_addr()?;
    let serving: Vec<_> = (0..threads)
        .map(|_| {
            let (listener, upstream) = (listener.try_clone()?, upstream.clone());
            Ok(std::thread::spawn(move || {
                let runtime = socialgate::runtime::serving().expect("a runtime");
                runtime.block_on(serve(listener, upstream))
            }))
        })
        .collect::<std::io::Result<_>>()?;
    writeln!(std::io::stdout(), "listening on http://{address}")?;
    for thread in serving {
        let _ = thread.join();
    }
    Ok(())
}

/// One thread's accept loop; it serves every connection it accepts.
async fn serve(listener: std::net::TcpListener, upstream: Arc<Upstream>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    loop {
        // As socialgate's server: a failed accept (out of descriptors,
        // say) costs that connection, not the server.
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let upstream = upstream.clone();
        let service = hyper::service::service_fn(move |request| {
            let upstream = upstream.clone();
            async move { Ok::<_, Infallible>(forward(&upstream, request).await) }
        });
        tokio::spawn(async move {
            // A client that hangs up mid-request is no concern of the floor's.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(
                    TokioIo::new(Batched::new(stream, Flushed::WhenSent)),
                    service,
                )
                .await;
        });
    }
}

/// Sends `request` on to the upstream and its answer back; a bare 502 when
/// the exchange fails.
async fn forward(upstream: &Upstream, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let bad_gateway = || {
        let mut response = Response::new(Full::default());
        *response.status_mut() = StatusCode::BAD_GATEWAY;
        response
    };
    let mut uri = Uri::builder()
        .scheme("http")
        .authority(upstream.authority.clone());
    if let Some(path) = request.uri().path_and_query() {
        uri = uri.path_and_query(path.clone());
    }
    let Ok(uri) = uri.build() else {
        return bad_gateway();
    };
    let headers: Vec<(&str, &str)> = request
        .headers()
        .iter()
        .filter(|(name, _)| **name != CONNECTION && **name != HOST)
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)))
        .collect();
    let Ok(head) = request_head(&uri, &headers) else {
        return bad_gateway();
    };
    let exchanged = upstream
        .client
        .exchange(&upstream.target, &head, DEFAULT_MAX_BODY_BYTES)
        .await;
    let Ok(answer) = exchanged else {
        return bad_gateway();
    };
    let mut response = Response::new(Full::new(Bytes::from(answer.body)));
    let Ok(status) = StatusCode::from_u16(answer.status) else {
        return bad_gateway();
    };
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for line in answer.header_lines.lines() {
        let Some((name, value)) = line.split_once(": ") else {
            continue;
        };
        if HOP_BY_HOP.contains(&name) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            headers.append(name, value);
        }
    }
    response
}
