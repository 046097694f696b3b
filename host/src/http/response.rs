//! The JSON envelopes of every answer: success and error (see
//! `docs/api.md`).

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Response, StatusCode};
use plugin_api::Output;
use serde::ser::{Serialize, Serializer};

use crate::error::ApiError;

pub type Body = Full<Bytes>;

#[derive(serde::Serialize)]
struct Meta<'a> {
    credits_used: u32,
    /// Present on list endpoints only: a token, or `null` at the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<Option<&'a str>>,
    request_id: &'a str,
}

/// The data of an output without its variant tag.
struct Data<'a>(&'a Output);

impl Serialize for Data<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Output::Profile(profile) => profile.serialize(s),
            Output::Posts(posts) => posts.serialize(s),
            Output::Post(post) => post.serialize(s),
            Output::Comments(comments) => comments.serialize(s),
            Output::Search(profiles) => profiles.serialize(s),
        }
    }
}

#[derive(serde::Serialize)]
struct Success<'a> {
    success: bool,
    platform: &'a str,
    data: Data<'a>,
    meta: Meta<'a>,
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
}

/// A success answer. `next_cursor` is `Some` exactly for list endpoints.
pub fn success(
    platform: &str,
    output: &Output,
    credits_used: u32,
    next_cursor: Option<Option<&str>>,
    request_id: &str,
) -> Response<Body> {
    let body = Success {
        success: true,
        platform,
        data: Data(output),
        meta: Meta {
            credits_used,
            next_cursor,
            request_id,
        },
    };
    match serde_json::to_vec(&body) {
        Ok(json) => json_response(StatusCode::OK, json),
        Err(e) => {
            tracing::error!("cannot serialize an answer: {e}");
            error(&ApiError::Internal, request_id)
        }
    }
}

/// An error answer; failures cost no credits.
pub fn error(error: &ApiError, request_id: &str) -> Response<Body> {
    let body = Failure {
        success: false,
        error: ErrorBody {
            code: error.code(),
            message: error.to_string(),
        },
        meta: Meta {
            credits_used: 0,
            next_cursor: None,
            request_id,
        },
    };
    let json = serde_json::to_vec(&body).expect("error envelopes always serialize");
    let mut response = json_response(error.status(), json);
    if *error == ApiError::MethodNotAllowed {
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
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
    json_response(status, json.as_bytes().to_vec())
}

fn json_response(status: StatusCode, json: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(json)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
