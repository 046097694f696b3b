//! The floor of bench/run.sh: the plainest reverse proxy that tokio and
//! hyper make, with nothing of socialgate in it.
//!
//! It answers each request by sending the same method, path, query and
//! headers to one upstream over hyper-util's pooled keep-alive client, and
//! streams the answer back, as the bench's nginx proxy does. Measured beside
//! nginx and socialgate, it separates what the stack costs (runtime, HTTP
//! server and client, on this machine) from what socialgate's own work
//! costs.
//!
//! Usage: `floor-proxy UPSTREAM_ORIGIN WORKERS`, e.g.
//! `floor-proxy http://127.0.0.1:8080 2`. It listens on a free port of
//! 127.0.0.1 and prints `listening on http://ADDR` once it accepts.

use std::convert::Infallible;
use std::io::Write;

use bytes::Bytes;
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, HOST};
use hyper::http::uri::{Authority, Scheme};
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

// The allocator socialgate uses, so the two differ only in their code.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Upstream = Client<HttpConnector, Incoming>;
/// The upstream's answer streamed through, or an empty 502.
type Answer = Response<Either<Incoming, Empty<Bytes>>>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(origin), Some(workers), None) = (args.next(), args.next(), args.next()) else {
        return Err("usage: floor-proxy UPSTREAM_ORIGIN WORKERS".into());
    };
    let origin: Uri = origin.parse()?;
    let (Some(scheme), Some(authority)) = (origin.scheme().cloned(), origin.authority().cloned())
    else {
        return Err("UPSTREAM_ORIGIN must be like http://127.0.0.1:8080".into());
    };
    let workers: usize = workers.parse()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        writeln!(
            std::io::stdout(),
            "listening on http://{}",
            listener.local_addr()?
        )?;
        let upstream: Upstream = Client::builder(TokioExecutor::new()).build_http();
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let (upstream, scheme, authority) =
                (upstream.clone(), scheme.clone(), authority.clone());
            let service = hyper::service::service_fn(move |request| {
                forward(upstream.clone(), scheme.clone(), authority.clone(), request)
            });
            tokio::spawn(async move {
                // A client that hangs up mid-request is no concern of the floor's.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

/// Sends `request` on to the upstream and its answer back; 502 when the
/// upstream cannot be reached.
async fn forward(
    upstream: Upstream,
    scheme: Scheme,
    authority: Authority,
    request: Request<Incoming>,
) -> Result<Answer, Infallible> {
    let (mut parts, body) = request.into_parts();
    let mut uri = Uri::builder().scheme(scheme).authority(authority.clone());
    if let Some(path) = parts.uri.path_and_query() {
        uri = uri.path_and_query(path.clone());
    }
    let bad_gateway = || {
        let mut response = Response::new(Either::Right(Empty::new()));
        *response.status_mut() = StatusCode::BAD_GATEWAY;
        response
    };
    let Ok(uri) = uri.build() else {
        return Ok(bad_gateway());
    };
    parts.uri = uri;
    // As nginx's `proxy_set_header Connection ""`: keep-alive is per hop.
    parts.headers.remove(CONNECTION);
    if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
        parts.headers.insert(HOST, host);
    }
    let answer = upstream.request(Request::from_parts(parts, body)).await;
    Ok(answer.map_or_else(|_| bad_gateway(), |response| response.map(Either::Left)))
}
