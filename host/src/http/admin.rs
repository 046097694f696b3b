//! The operators' listener (`[server] admin_listen`): `GET /metrics` in
//! Prometheus text format. Kept off the public listener because metrics
//! name providers, which callers must never learn.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::state::App;

/// Serves the admin listener until the task is dropped.
pub async fn run(listener: TcpListener, app: Arc<App>, metrics: PrometheusHandle) {
    // The same defences as the public listener: it shares the process's
    // descriptors, and operators may expose it beyond loopback.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(app.limits.header_timeout)
        .max_buf_size(app.limits.max_header_bytes);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let (app, metrics) = (app.clone(), metrics.clone());
        let service = service_fn(move |request: Request<Incoming>| {
            let response = answer(&app, &metrics, &request);
            async move { Ok::<_, Infallible>(response) }
        });
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}

fn answer(
    app: &App,
    metrics: &PrometheusHandle,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            crate::metrics::render(metrics, &app.snapshot()),
        ),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "use GET\n".into(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try /metrics\n".into(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
