//! The upstream HTTP exchange, seen from a plugin: the request a provider asks
//! the host to make, and the response the host feeds back.
//!
//! Plugins never open sockets (sans-IO): the host owns the HTTP client, its
//! timeouts, limits and proxy settings.

use crate::{ErrorKind, ProviderError};
use serde::Deserialize;
use std::fmt;
use std::time::Duration;

/// A GET request for the host to perform.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamRequest {
    pub(crate) method: String,
    pub(crate) url: String,
    pub(crate) headers: Vec<(String, String)>,
    has_query: bool,
}

impl UpstreamRequest {
    /// A GET of `path` under `base_url`.
    ///
    /// `base_url` may or may not end in `/`; `path` may or may not start with
    /// one: `https://h/x` + `/v1/a` and `https://h/x/` + `v1/a` both give
    /// `https://h/x/v1/a`.
    pub fn get(base_url: &str, path: &str) -> UpstreamRequest {
        let base = base_url.trim_end_matches('/');
        let path = path.trim_start_matches('/');
        let url = if path.is_empty() {
            format!("{base}/")
        } else {
            format!("{base}/{path}")
        };
        let has_query = url.contains('?');
        UpstreamRequest {
            method: "GET".into(),
            url,
            headers: Vec::new(),
            has_query,
        }
    }

    pub(crate) fn from_parts(method: String, url: String, headers: Vec<(String, String)>) -> Self {
        let has_query = url.contains('?');
        UpstreamRequest {
            method,
            url,
            headers,
            has_query,
        }
    }

    /// The HTTP method (`GET`).
    pub fn method(&self) -> &str {
        &self.method
    }

    /// Appends a query parameter, percent-encoded.
    pub fn query(mut self, name: &str, value: impl fmt::Display) -> UpstreamRequest {
        self.url.push(if self.has_query { '&' } else { '?' });
        self.has_query = true;
        let value = value.to_string();
        let pair = form_urlencoded::Serializer::new(String::new())
            .append_pair(name, &value)
            .finish();
        self.url.push_str(&pair);
        self
    }

    /// Adds a request header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> UpstreamRequest {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The full URL, query included.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The headers to send. May carry the upstream key: never log them.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }
}

/// Headers are left out: they carry the upstream key.
impl fmt::Debug for UpstreamRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamRequest")
            .field("method", &self.method)
            .field("url", &self.url)
            .field(
                "headers",
                &format_args!("<{} redacted>", self.headers.len()),
            )
            .finish()
    }
}

/// What the upstream answered to the last [`UpstreamRequest`].
#[derive(Debug, Clone, Copy)]
pub struct UpstreamResponse<'a> {
    pub status: u16,
    pub(crate) headers: &'a [(String, String)],
    pub body: &'a [u8],
}

impl<'a> UpstreamResponse<'a> {
    /// A response from its parts (for tests of a provider).
    pub fn new(status: u16, headers: &'a [(String, String)], body: &'a [u8]) -> Self {
        UpstreamResponse {
            status,
            headers,
            body,
        }
    }

    /// A header's value, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&'a str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Classifies gateway-level HTTP statuses the way every upstream of this
    /// kind uses them: 401/403 our key was refused, 429 quota (with
    /// `Retry-After` seconds when given), 5xx transient. Any other non-2xx is a
    /// bad response. Application outcomes come as 200 and are the provider's
    /// to read.
    pub fn check_status(&self) -> Result<(), ProviderError> {
        match self.status {
            200..=299 => Ok(()),
            401 | 403 => Err(ProviderError::new(
                ErrorKind::KeyRejected,
                format!("upstream refused the key (HTTP {})", self.status),
            )),
            429 => {
                let retry_after = self
                    .header("retry-after")
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                let error = ProviderError::new(ErrorKind::RateLimited, "upstream quota (HTTP 429)");
                Err(match retry_after {
                    Some(after) => error.retry_after(after),
                    None => error,
                })
            }
            500..=599 => Err(ProviderError::new(
                ErrorKind::Transient,
                format!("upstream HTTP {}", self.status),
            )),
            other => Err(ProviderError::new(
                ErrorKind::BadResponse,
                format!("unexpected upstream HTTP {other}"),
            )),
        }
    }

    /// Parses the body as JSON into `T` after [`check_status`](Self::check_status).
    ///
    /// Parse straight into typed structs: the exact-ID helpers in
    /// [`json`](crate::json) rely on reading the raw text.
    pub fn json<T: Deserialize<'a>>(&self) -> Result<T, ProviderError> {
        self.check_status()?;
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Err(ProviderError::new(ErrorKind::BadResponse, "empty body"));
        }
        crate::json::parse(self.body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_base_and_path_with_one_slash() {
        for base in ["https://h/x", "https://h/x/"] {
            for path in ["/v1/a", "v1/a"] {
                assert_eq!(UpstreamRequest::get(base, path).url(), "https://h/x/v1/a");
            }
        }
        assert_eq!(UpstreamRequest::get("http://h:1", "/").url(), "http://h:1/");
    }

    #[test]
    fn encodes_query_values() {
        let r = UpstreamRequest::get("http://h", "/s")
            .query("keywords", "luna & \"bakes\" 🥐")
            .query("count", 5);
        assert_eq!(
            r.url(),
            "http://h/s?keywords=luna+%26+%22bakes%22+%F0%9F%A5%90&count=5"
        );
    }

    #[test]
    fn debug_hides_headers() {
        let r = UpstreamRequest::get("http://h", "/").header("X-Api-Key", "sekret");
        assert!(!format!("{r:?}").contains("sekret"));
    }

    #[test]
    fn gateway_statuses_classify() {
        let h = vec![("Retry-After".to_string(), "7".to_string())];
        let e = UpstreamResponse::new(429, &h, b"")
            .check_status()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::RateLimited);
        assert_eq!(e.retry_after_hint(), Some(Duration::from_secs(7)));
        let kind = |s| {
            UpstreamResponse::new(s, &[], b"")
                .check_status()
                .unwrap_err()
                .kind()
        };
        assert_eq!(kind(401), ErrorKind::KeyRejected);
        assert_eq!(kind(403), ErrorKind::KeyRejected);
        assert_eq!(kind(503), ErrorKind::Transient);
        assert_eq!(kind(404), ErrorKind::BadResponse);
        let empty = UpstreamResponse::new(200, &[], b" \n").json::<serde_json::Value>();
        assert_eq!(empty.unwrap_err().kind(), ErrorKind::BadResponse);
        let html = UpstreamResponse::new(200, &[], b"<html>").json::<serde_json::Value>();
        assert_eq!(html.unwrap_err().kind(), ErrorKind::BadResponse);
    }
}
