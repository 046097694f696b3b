//! The JSON envelopes of every answer: success and error (see
//! `docs/api.md`).

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{
    HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, RETRY_AFTER,
    WWW_AUTHENTICATE, X_CONTENT_TYPE_OPTIONS,
};
use hyper::{Response, StatusCode};
use plugin_api::canonical;
use serde::ser::{Serialize, Serializer};

use crate::billing::Costs;
use crate::error::ApiError;
use crate::resilience::rate_limit::RateLimitConfig;

pub type Body = Full<Bytes>;

/// The methods every path answers (`Allow`).
pub const ALLOWED_METHODS: &str = "GET, HEAD, OPTIONS";
/// `X-Content-Type-Options` of every JSON answer.
pub const NOSNIFF: &str = "nosniff";
/// `Content-Security-Policy` of every JSON answer: nothing may be loaded,
/// run or framed by it.
pub const NO_CONTENT_ALLOWED: &str = "default-src 'none'";
/// The challenge of a 401 (RFC 9110 requires one): a key in `X-API-Key`.
const CHALLENGE: &str = r#"ApiKey realm="socialgate", header="X-API-Key""#;

#[derive(serde::Serialize)]
struct Meta<'a> {
    credits_used: u32,
    /// Present on successes only: whether the data came from the cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    cached: Option<bool>,
    /// Present on list endpoints only: a token, or `null` at the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<Option<&'a str>>,
    request_id: &'a str,
}

impl Meta<'_> {
    /// The `meta` of an answer that costs nothing and holds no data.
    fn free(request_id: &str) -> Meta<'_> {
        Meta {
            credits_used: 0,
            cached: None,
            next_cursor: None,
            request_id,
        }
    }
}

#[derive(serde::Serialize)]
struct Failure<'a> {
    success: bool,
    error: ErrorBody<'a>,
    meta: Meta<'a>,
}

#[derive(serde::Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: String,
    /// For `INVALID_PARAMETER`: the parameter at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    param: Option<&'a str>,
}

/// A success answer around `data`, already serialized. `next_cursor` is
/// `Some` exactly for list endpoints.
pub fn success(
    platform: &str,
    data: &[u8],
    credits_used: u32,
    cached: bool,
    next_cursor: Option<Option<&str>>,
    request_id: &str,
) -> Response<Body> {
    let meta = Meta {
        credits_used,
        cached: Some(cached),
        next_cursor,
        request_id,
    };
    // Written by hand around the stored bytes, in the documented key order.
    let mut json = Vec::with_capacity(data.len() + 160);
    json.extend_from_slice(b"{\"success\":true,\"platform\":");
    canonical::write_str(&mut json, platform);
    json.extend_from_slice(b",\"data\":");
    json.extend_from_slice(data);
    json.extend_from_slice(b",\"meta\":");
    match canonical::write(&mut json, &meta) {
        Ok(()) => {
            json.push(b'}');
            json_response(StatusCode::OK, json)
        }
        Err(e) => {
            tracing::error!("cannot serialize an answer: {e}");
            error(&ApiError::Internal, request_id)
        }
    }
}

/// `data` of `GET /v1/account`, in the documented key order.
#[derive(serde::Serialize)]
pub struct Account<'a> {
    pub name: &'a str,
    pub credits_remaining: u64,
    pub credits_used_today: u64,
    pub credits_used_total: u64,
    pub billing_enforced: bool,
    #[serde(serialize_with = "costs_json")]
    pub costs: Costs,
    /// What an answer from the cache costs (stale ones too), whatever its
    /// endpoint; `null`: what its endpoint costs.
    pub cached_cost: Option<u32>,
    /// `null` when no rate limit is set.
    #[serde(serialize_with = "rate_limit_json")]
    pub rate_limit: Option<RateLimitConfig>,
}

/// `{"profile": 1, ...}`, in endpoint order.
fn costs_json<S: Serializer>(costs: &Costs, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(plugin_api::Endpoint::ALL.len()))?;
    for (endpoint, cost) in costs.per_endpoint() {
        map.serialize_entry(endpoint.as_str(), &cost)?;
    }
    map.end()
}

fn rate_limit_json<S: Serializer>(
    limit: &Option<RateLimitConfig>,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(serde::Serialize)]
    struct Limit {
        per_second: f64,
        burst: f64,
    }
    limit
        .map(|l| Limit {
            per_second: l.per_second,
            burst: l.burst,
        })
        .serialize(s)
}

/// The answer to `GET /v1/account`: the success envelope without
/// `platform`; it costs nothing.
pub fn account(account: &Account<'_>, request_id: &str) -> Response<Body> {
    #[derive(serde::Serialize)]
    struct Envelope<'a> {
        success: bool,
        data: &'a Account<'a>,
        meta: Meta<'a>,
    }
    let envelope = Envelope {
        success: true,
        data: account,
        meta: Meta::free(request_id),
    };
    match serde_json::to_vec(&envelope) {
        Ok(json) => json_response(StatusCode::OK, json),
        Err(e) => {
            tracing::error!("cannot serialize an account answer: {e}");
            error(&ApiError::Internal, request_id)
        }
    }
}

/// The error envelope of `error`, serialized.
pub fn error_json(error: &ApiError, request_id: &str) -> Vec<u8> {
    failure_json(error, Meta::free(request_id))
}

fn failure_json(error: &ApiError, meta: Meta<'_>) -> Vec<u8> {
    let body = Failure {
        success: false,
        error: ErrorBody {
            code: error.code(),
            message: error.to_string(),
            param: error.param(),
        },
        meta,
    };
    serde_json::to_vec(&body).expect("error envelopes always serialize")
}

/// An error answer; failures cost no credits.
pub fn error(error: &ApiError, request_id: &str) -> Response<Body> {
    error_costing(error, request_id, 0)
}

/// An error answer that cost `credits_used`: a `412` whose answer was
/// fetched on the request's demand (see [`crate::http::answer::answer`]).
pub fn error_costing(error: &ApiError, request_id: &str, credits_used: u32) -> Response<Body> {
    let meta = Meta {
        credits_used,
        ..Meta::free(request_id)
    };
    let mut response = json_response(error.status(), failure_json(error, meta));
    match error {
        ApiError::MethodNotAllowed => {
            response
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static(ALLOWED_METHODS));
        }
        ApiError::MissingApiKey | ApiError::InvalidApiKey => {
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static(CHALLENGE));
        }
        _ => {}
    }
    if let Some(secs) = error.retry_after_secs() {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// A small JSON answer for public paths such as `/healthz`.
pub fn plain_json(status: StatusCode, json: &'static str) -> Response<Body> {
    json_response(status, Bytes::from_static(json.as_bytes()))
}

/// The answer to `OPTIONS`: no content, the methods allowed, and
/// `no-store` as every answer but data and the document (a browser keeps
/// a preflight by `Access-Control-Max-Age`, not by this).
pub fn options() -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    let headers = response.headers_mut();
    headers.insert(ALLOW, HeaderValue::from_static(ALLOWED_METHODS));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A JSON answer of `json`; `Cache-Control: no-store` until the caller
/// says otherwise.
///
/// A browser pointed at an answer (an error message quotes what the caller
/// sent, a post's text what its author wrote) must never take it for
/// anything but JSON, nor run or load anything from it: `nosniff` and an
/// empty content security policy, as GitHub's API sends.
pub fn json_response(status: StatusCode, json: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(json.into()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static(NOSNIFF));
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(NO_CONTENT_ALLOWED),
    );
    response
}
