//! One request, through its checks in a fixed order: public paths first,
//! then overload, method, key, rate limit, platform, endpoint, parameters,
//! and finally the failover chain. Each check answers from the error
//! catalogue; nothing after a failed check runs, so invalid input never
//! reaches an upstream.

use std::borrow::Cow;
use std::panic::AssertUnwindSafe;
use std::time::Instant;

use futures_util::FutureExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use plugin_api::Call;

use super::response::{self, Body};
use crate::chain::{self, ChainError};
use crate::cursor::{Listing, Position};
use crate::error::ApiError;
use crate::resilience::deadline::Deadline;
use crate::resilience::rate_limit::retry_after_secs;
use crate::state::{App, Snapshot};

const API_KEY_HEADER: &str = "x-api-key";

/// Answers one request; never fails, never panics out.
pub async fn handle(app: &App, request: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let outcome = AssertUnwindSafe(route(app, &request)).catch_unwind().await;
    let (response, served_by) = match outcome {
        Ok(Ok(answer)) => (answer.response, answer.provider),
        Ok(Err(error)) => (response::error(&error), None),
        Err(_) => {
            tracing::error!(%method, path, "request handler panicked");
            (response::error(&ApiError::Internal), None)
        }
    };
    tracing::info!(
        %method,
        path,
        status = response.status().as_u16(),
        latency_ms = started.elapsed().as_secs_f64() * 1000.0,
        provider = served_by.as_deref().unwrap_or("-"),
        "request"
    );
    response
}

struct Answer {
    response: Response<Body>,
    /// For the log only.
    provider: Option<String>,
}

impl From<Response<Body>> for Answer {
    fn from(response: Response<Body>) -> Answer {
        Answer {
            response,
            provider: None,
        }
    }
}

async fn route(app: &App, request: &Request<Incoming>) -> Result<Answer, ApiError> {
    let path = request.uri().path();
    let method = request.method();

    if path == "/healthz" {
        return match *method {
            Method::GET => Ok(response::plain_json(StatusCode::OK, r#"{"status":"ok"}"#).into()),
            _ => Err(ApiError::MethodNotAllowed),
        };
    }
    // Held until the answer is built; past the limit, refuse at once.
    let _in_flight = app.in_flight.try_enter().ok_or(ApiError::Overloaded {
        retry_after_secs: 1,
    })?;
    if *method != Method::GET {
        return Err(ApiError::MethodNotAllowed);
    }

    let snapshot = app.snapshot();
    let key_name = authenticate(&snapshot, request)?;
    if let Some(limiter) = &snapshot.rate_limiter {
        limiter
            .check(key_name, tokio::time::Instant::now())
            .map_err(|wait| ApiError::RateLimited {
                retry_after_secs: retry_after_secs(wait),
            })?;
    }

    let (platform, endpoint) = match path.strip_prefix("/v1/").map(|rest| rest.split_once('/')) {
        Some(Some((platform, endpoint))) => (platform, endpoint),
        Some(None) => {
            // `/v1/{platform}` alone: an unknown platform is still named.
            let platform = &path["/v1/".len()..];
            if !platform.is_empty() {
                snapshot.routes.check_platform(platform)?;
            }
            return Err(ApiError::EndpointNotFound);
        }
        None => return Err(ApiError::EndpointNotFound),
    };
    let (endpoint, chain) = snapshot.routes.route(platform, endpoint)?;

    let query = request.uri().query().unwrap_or("");
    let params: Vec<(Cow<str>, Cow<str>)> = form_urlencoded::parse(query.as_bytes()).collect();
    let mut call = Call::from_params(
        endpoint,
        params.iter().map(|(k, v)| (k.as_ref(), v.as_ref())),
    )
    .map_err(|e| ApiError::InvalidParameter(e.to_string()))?;

    let listing = Listing {
        platform,
        endpoint: endpoint.as_str(),
        subject: call.subject(),
    };
    let token = params
        .iter()
        .find(|(k, v)| k == "cursor" && !v.is_empty())
        .map(|(_, v)| v.as_ref());
    let resume = match token {
        Some(token) if endpoint.is_list() => Some(
            app.cursors
                .open(listing, token)
                .map_err(|e| ApiError::InvalidParameter(e.to_string()))?,
        ),
        _ => None,
    };

    let deadline = Deadline::after(snapshot.config.server.limits.request_timeout);
    let served = match &resume {
        None => chain::serve(chain, &call, &app.upstream, deadline).await,
        Some(Position { provider, upstream }) => {
            // Only the issuer can continue its listing. If the operator has
            // since removed it from this chain, the token is dead.
            let issuer = chain.iter().find(|p| p.name == *provider).ok_or_else(|| {
                ApiError::InvalidParameter(
                    "parameter `cursor` has expired; start the listing again".into(),
                )
            })?;
            call = call.with_cursor(Some(upstream.clone()));
            chain::serve(std::slice::from_ref(issuer), &call, &app.upstream, deadline).await
        }
    };
    let served = served.map_err(|e| match e {
        ChainError::NotFound => ApiError::ResourceNotFound,
        ChainError::InvalidInput(message) => ApiError::InvalidParameter(message),
        ChainError::Exhausted => ApiError::UpstreamUnavailable,
        ChainError::DeadlineExceeded => ApiError::UpstreamTimeout,
    })?;
    for failed in &served.failed {
        tracing::info!(from_provider = %failed.name, to_provider = %served.provider.name, "failover");
    }

    let next_cursor = endpoint.is_list().then(|| {
        served.done.next_cursor.as_ref().map(|upstream| {
            app.cursors.seal(
                Listing {
                    platform,
                    endpoint: endpoint.as_str(),
                    subject: call.subject(),
                },
                &Position {
                    provider: served.provider.name.clone(),
                    upstream: upstream.clone(),
                },
            )
        })
    });
    let response = response::success(
        platform,
        &served.done.output,
        next_cursor.as_ref().map(|c| c.as_deref()),
    );
    Ok(Answer {
        response,
        provider: Some(served.provider.name.clone()),
    })
}

/// The name of the presented key.
fn authenticate<'s>(
    snapshot: &'s Snapshot,
    request: &Request<Incoming>,
) -> Result<&'s str, ApiError> {
    let presented = request
        .headers()
        .get(API_KEY_HEADER)
        .filter(|v| !v.is_empty())
        .ok_or(ApiError::MissingApiKey)?;
    snapshot
        .keys
        .verify(presented.as_bytes())
        .ok_or(ApiError::InvalidApiKey)
}
