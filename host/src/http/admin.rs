//! The operators' listener (`[server] admin_listen`): `GET /metrics` in
//! Prometheus text format. Kept off the public listener because metrics
//! name providers, which callers must never learn.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::metrics::ProviderGauges;
use crate::state::App;

/// The admin listener's request handler, for [`crate::server::serve`]:
/// the same hardening and drain as the public listener, since it shares
/// the process's descriptors and operators may expose it beyond loopback.
pub fn handler(
    app: Arc<App>,
    metrics: PrometheusHandle,
) -> impl Fn(Request<Incoming>) -> std::future::Ready<Response<Full<Bytes>>> + Clone + Send + Sync {
    move |request| std::future::ready(answer(&app, &metrics, &request))
}

fn answer(
    app: &App,
    metrics: &PrometheusHandle,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        // (hyper sends no body for `HEAD`.)
        (&Method::GET | &Method::HEAD, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            render(app, metrics),
        ),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "use GET or HEAD\n".into(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try /metrics\n".into(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        headers.insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    response
}

/// The metrics page, with the gauges read from `app` now.
fn render(app: &App, metrics: &PrometheusHandle) -> String {
    let snapshot = app.snapshot();
    let providers = snapshot.routes.providers().map(|provider| ProviderGauges {
        name: &provider.name,
        breaker_open: provider.breaker.is_open(),
        quarantined: provider.runner.is_quarantined(),
    });
    crate::metrics::render(
        metrics,
        app.cache.bytes(),
        snapshot.keys_are_current(),
        providers,
    )
}
