//! The error catalogue: every error a caller can receive, with its code,
//! HTTP status and message. Nothing else in the host makes one up: what an
//! internal failure becomes is said beside the failure's own type (a
//! refused cursor in `cursor`, why a request got no data in
//! `http::answer`), naming one of these, so this module imports none of
//! them.
//!
//! Messages never name a provider, an upstream host, an upstream status or
//! an upstream message: the caller must not learn who answered.

use std::time::Duration;

use hyper::StatusCode;

use crate::resilience::rate_limit;

/// What a caller refused for a passing condition (the server busy, the
/// shared store out of reach) is told to wait, in seconds.
const RETRY_SOON_SECS: u64 = 1;

/// An error answered to an API caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("the X-API-Key header is required")]
    MissingApiKey,
    #[error("the API key is not valid")]
    InvalidApiKey,
    /// A parameter (or request header) is missing or malformed: `param`
    /// names it (`error.param`), and so does the message.
    #[error("{message}")]
    InvalidParameter { param: String, message: String },
    #[error("no platform named `{0}`")]
    PlatformNotFound(String),
    #[error("platform `{0}` is planned but not available yet")]
    PlatformNotAvailable(String),
    #[error("no such endpoint; see GET /v1/{{platform}}/{{endpoint}}")]
    EndpointNotFound,
    #[error("only GET, HEAD and OPTIONS are allowed")]
    MethodNotAllowed,
    #[error("the requested user or post does not exist")]
    ResourceNotFound,
    /// What is set aside is the most the answer may cost (a fetch, unless
    /// the request takes only a stored answer): see `billing`.
    #[error("this key's balance does not cover what this request may cost")]
    InsufficientCredits,
    /// Every provider failed, or none may be asked now (then the caller is
    /// told when to retry).
    #[error("the data could not be fetched right now; try again later")]
    UpstreamUnavailable { retry_after_secs: Option<u64> },
    #[error("the data could not be fetched in time; try again later")]
    UpstreamTimeout,
    /// The request's `If-Match` names no tag of the current answer.
    #[error("the request's If-Match lists no ETag of the current answer")]
    PreconditionFailed,
    /// `Cache-Control: only-if-cached`, and no fresh answer was stored.
    #[error("no stored answer is fresh enough, and the request's Cache-Control (only-if-cached) allows no other")]
    NotCached,
    /// Too many requests in flight on this server.
    #[error("the service is busy; retry after {retry_after_secs} s")]
    Overloaded { retry_after_secs: u64 },
    /// The shared store this request needs (credits, with billing
    /// enforced) cannot answer; retry.
    #[error(
        "the service cannot check this key's credits right now; retry after {retry_after_secs} s"
    )]
    ServiceUnavailable { retry_after_secs: u64 },
    /// This key's request rate is exceeded.
    #[error("too many requests for this key; retry after {retry_after_secs} s")]
    RateLimited { retry_after_secs: u64 },
    /// This key has `max_concurrent_requests_per_key` requests in flight.
    #[error(
        "this key already has {max} {} in flight, its most at once; retry after {RETRY_SOON_SECS} s",
        if *max == 1 { "request" } else { "requests" }
    )]
    KeyBusy { max: usize },
    /// A bug. Logged with detail where it happens, answered without.
    #[error("internal error")]
    Internal,
    /// The request head was larger than `max_header_bytes` (refused before
    /// any check; see `server::refusal`).
    #[error("the request's headers are too large")]
    HeadersTooLarge,
    /// The request target was longer than the server reads.
    #[error("the request's URI is too long")]
    UriTooLong,
    /// The request line or a header could not be parsed as HTTP.
    #[error("the request is not well-formed HTTP")]
    MalformedRequest,
}

impl ApiError {
    /// The stable, documented error code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::MissingApiKey => "MISSING_API_KEY",
            ApiError::InvalidApiKey => "INVALID_API_KEY",
            ApiError::InvalidParameter { .. } => "INVALID_PARAMETER",
            ApiError::PlatformNotFound(_) => "PLATFORM_NOT_FOUND",
            ApiError::PlatformNotAvailable(_) => "PLATFORM_NOT_AVAILABLE",
            ApiError::EndpointNotFound => "ENDPOINT_NOT_FOUND",
            ApiError::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            ApiError::ResourceNotFound => "RESOURCE_NOT_FOUND",
            ApiError::InsufficientCredits => "INSUFFICIENT_CREDITS",
            ApiError::UpstreamUnavailable { .. } => "UPSTREAM_UNAVAILABLE",
            ApiError::UpstreamTimeout => "UPSTREAM_TIMEOUT",
            ApiError::PreconditionFailed => "PRECONDITION_FAILED",
            ApiError::NotCached => "NOT_CACHED",
            ApiError::Overloaded { .. } => "OVERLOADED",
            ApiError::ServiceUnavailable { .. } => "SERVICE_UNAVAILABLE",
            ApiError::RateLimited { .. } | ApiError::KeyBusy { .. } => "RATE_LIMITED",
            ApiError::Internal => "INTERNAL_ERROR",
            ApiError::HeadersTooLarge => "HEADERS_TOO_LARGE",
            ApiError::UriTooLong => "URI_TOO_LONG",
            ApiError::MalformedRequest => "MALFORMED_REQUEST",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MissingApiKey | ApiError::InvalidApiKey => StatusCode::UNAUTHORIZED,
            ApiError::InvalidParameter { .. } | ApiError::MalformedRequest => {
                StatusCode::BAD_REQUEST
            }
            ApiError::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::UriTooLong => StatusCode::URI_TOO_LONG,
            ApiError::PlatformNotFound(_)
            | ApiError::EndpointNotFound
            | ApiError::ResourceNotFound => StatusCode::NOT_FOUND,
            ApiError::PlatformNotAvailable(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::InsufficientCredits => StatusCode::PAYMENT_REQUIRED,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PreconditionFailed => StatusCode::PRECONDITION_FAILED,
            ApiError::UpstreamUnavailable { .. } => StatusCode::BAD_GATEWAY,
            // RFC 9111's answer to `only-if-cached` with nothing stored.
            ApiError::UpstreamTimeout | ApiError::NotCached => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Overloaded { .. } | ApiError::ServiceUnavailable { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::RateLimited { .. } | ApiError::KeyBusy { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Seconds for a `Retry-After` header, where the caller should wait.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            ApiError::Overloaded { retry_after_secs }
            | ApiError::ServiceUnavailable { retry_after_secs }
            | ApiError::RateLimited { retry_after_secs } => Some(*retry_after_secs),
            ApiError::UpstreamUnavailable { retry_after_secs } => *retry_after_secs,
            ApiError::KeyBusy { .. } => Some(RETRY_SOON_SECS),
            _ => None,
        }
    }

    /// Parameter `param` refused for `reason` ("is required", ...).
    pub fn invalid(param: &str, reason: impl std::fmt::Display) -> ApiError {
        ApiError::InvalidParameter {
            param: param.to_owned(),
            message: format!("parameter `{param}` {reason}"),
        }
    }

    /// The parameter an error is about (`error.param`), for
    /// `INVALID_PARAMETER`.
    pub fn param(&self) -> Option<&str> {
        match self {
            ApiError::InvalidParameter { param, .. } => Some(param),
            _ => None,
        }
    }

    /// `X-API-Key` sent more than once: refused rather than reduced to one
    /// of them, as a repeated query parameter is.
    pub fn repeated_api_key() -> ApiError {
        ApiError::InvalidParameter {
            param: "X-API-Key".into(),
            message: "the X-API-Key header must be sent once".into(),
        }
    }

    /// The error hyper's own refusal of a request head with `status` stands
    /// for, if it is one hyper answers by itself.
    pub fn of_unparsed_head(status: u16) -> Option<ApiError> {
        match status {
            400 => Some(ApiError::MalformedRequest),
            414 => Some(ApiError::UriTooLong),
            431 => Some(ApiError::HeadersTooLarge),
            _ => None,
        }
    }

    /// A `cursor` that this listing did not issue (tampered, foreign, or
    /// from before a restart without `cursor_key_env`).
    pub fn bad_cursor() -> ApiError {
        ApiError::invalid("cursor", "is not a cursor this listing issued")
    }

    /// A `cursor` whose provider is no longer in the chain.
    pub fn expired_cursor() -> ApiError {
        ApiError::invalid("cursor", "has expired; start the listing again")
    }

    /// Too many requests in flight: retry soon.
    pub fn overloaded() -> ApiError {
        ApiError::Overloaded {
            retry_after_secs: RETRY_SOON_SECS,
        }
    }

    /// The shared store this request needs cannot answer: retry soon.
    pub fn store_unavailable() -> ApiError {
        ApiError::ServiceUnavailable {
            retry_after_secs: RETRY_SOON_SECS,
        }
    }

    /// This key's rate is exceeded; its bucket has room again in `wait`.
    pub fn rate_limited(wait: Duration) -> ApiError {
        ApiError::RateLimited {
            retry_after_secs: rate_limit::retry_after_secs(wait),
        }
    }

    /// A platform name echoed back, cut to a sane length.
    pub fn platform_not_found(name: &str) -> ApiError {
        ApiError::PlatformNotFound(name.chars().take(64).collect())
    }
}

/// A description's verdict on a call's parameters, which names the one at
/// fault; its words are the caller's.
impl From<platform_description::ParamError> for ApiError {
    fn from(error: platform_description::ParamError) -> ApiError {
        ApiError::InvalidParameter {
            param: error.name().to_owned(),
            message: error.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_error_is_500_and_says_nothing_of_its_cause() {
        let e = ApiError::Internal;
        assert_eq!((e.code(), e.status().as_u16()), ("INTERNAL_ERROR", 500));
        assert_eq!(e.to_string(), "internal error");
    }

    #[test]
    fn echoed_platform_names_are_bounded() {
        let ApiError::PlatformNotFound(name) = ApiError::platform_not_found(&"x".repeat(500))
        else {
            unreachable!()
        };
        assert_eq!(name.len(), 64);
    }
}
