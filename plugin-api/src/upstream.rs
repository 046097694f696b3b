//! The upstream HTTP exchange, seen from a plugin: the request a provider asks
//! the host to make, and the response the host feeds back.
//!
//! Plugins never open sockets (sans-IO): the host owns the HTTP client, its
//! timeouts, limits and proxy settings.

use crate::{ErrorKind, ProviderError};
use abi_stable::std_types::{RString, Tuple2};
use serde::Deserialize;
use std::fmt;
use std::time::Duration;

/// Headers the host writes itself, or that would change how the request
/// or its connection is framed: a plugin may not set them. Public since
/// 1.6.
pub const RESERVED_HEADERS: [&str; 9] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
];

/// What the host (and the test kit) make of a header a plugin asks to
/// send: `None` when it may, else why not. A name must be an HTTP token
/// and not [reserved](RESERVED_HEADERS); a value may hold no control
/// character but a tab. The reason names the header (never its value,
/// which may carry the key). Since 1.6.
pub fn header_refusal(name: &str, value: &str) -> Option<String> {
    let is_token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(is_token) {
        return Some("plugin asked for a request header whose name is not an HTTP token".into());
    }
    if RESERVED_HEADERS
        .iter()
        .any(|reserved| name.eq_ignore_ascii_case(reserved))
    {
        return Some(format!(
            "plugin asked for the request header `{name}`, which the host sets itself"
        ));
    }
    let value_ok = value
        .bytes()
        .all(|b| b == b'\t' || (b >= b' ' && b != 0x7f));
    (!value_ok).then(|| {
        format!(
            "plugin asked for the request header `{name}` with a control character in its value"
        )
    })
}

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
        // Room for a query or two: they are appended in place.
        let mut url = String::with_capacity(base.len() + 1 + path.len() + 64);
        url.push_str(base);
        url.push('/');
        url.push_str(path);
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

    /// Appends one path segment, percent-encoded (everything but
    /// `A-Z a-z 0-9 - . _ ~`, so `/`, `?`, `#` and `%` stay inside it).
    ///
    /// Use it for every caller-given value in a path: a raw `..` in a URL
    /// is resolved away (`/v2/creators/..` reaches the upstream as `/v2/`),
    /// and so is its encoded form `%2e%2e`. A segment that is empty, `.` or
    /// `..` is refused with [`ErrorKind::InvalidInput`], before any request.
    /// Segments go before the query: one added after [`query`](Self::query)
    /// is still put in the path.
    ///
    /// ```
    /// # use plugin_api::UpstreamRequest;
    /// let r = UpstreamRequest::get("https://h/api", "/v2/creators")
    ///     .segment("luna bakes/2")?
    ///     .query("full", 1);
    /// assert_eq!(r.url(), "https://h/api/v2/creators/luna%20bakes%2F2?full=1");
    /// assert!(UpstreamRequest::get("https://h", "/v2").segment("..").is_err());
    /// # Ok::<(), plugin_api::ProviderError>(())
    /// ```
    pub fn segment(mut self, segment: &str) -> Result<UpstreamRequest, ProviderError> {
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err(ProviderError::new(
                ErrorKind::InvalidInput,
                "a value that is empty, `.` or `..` cannot name anything here",
            ));
        }
        let mut encoded = String::with_capacity(segment.len() * 3 + 1);
        encoded.push('/');
        push_encoded(&mut encoded, segment, is_unreserved);
        let path_end = self.url.find(['?', '#']).unwrap_or(self.url.len());
        // `get` leaves a trailing `/` for an empty path; do not double it.
        let start = if self.url[..path_end].ends_with('/') {
            path_end - 1
        } else {
            path_end
        };
        self.url.replace_range(start..path_end, &encoded);
        Ok(self)
    }

    /// Adds `Authorization: Bearer <token>`. The header is never logged.
    pub fn bearer(self, token: &str) -> UpstreamRequest {
        self.header("Authorization", format!("Bearer {token}"))
    }

    /// Appends a query parameter, percent-encoded.
    pub fn query(mut self, name: &str, value: impl fmt::Display) -> UpstreamRequest {
        self.url.push(if self.has_query { '&' } else { '?' });
        self.has_query = true;
        let value = value.to_string();
        let end = self.url.len();
        form_urlencoded::Serializer::for_suffix(&mut self.url, end).append_pair(name, &value);
        self
    }

    /// Adds a request header. The host refuses a request with a header it
    /// writes itself or that frames the request or its connection (`Host`,
    /// `Content-Length`, `Transfer-Encoding`, `Connection` and the other
    /// hop-by-hop ones).
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

/// RFC 3986's unreserved characters: what a path segment carries as it is.
pub(crate) fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// Appends `text` to `out`: each byte `kept` allows as it is, the others
/// percent-encoded (upper-case hex, as RFC 3986 advises).
pub(crate) fn push_encoded(out: &mut String, text: &str, kept: impl Fn(u8) -> bool) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for byte in text.bytes() {
        if kept(byte) {
            out.push(char::from(byte));
        } else {
            out.extend([
                '%',
                HEX[usize::from(byte >> 4)].into(),
                HEX[usize::from(byte & 15)].into(),
            ]);
        }
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
    pub(crate) headers: HeaderList<'a>,
    pub body: &'a [u8],
}

/// A response's headers where they are: a test's pairs, the host's
/// `name: value` lines, or the copies lent across the plugin boundary.
/// A header is looked up far more rarely than a response arrives, so none
/// is copied or split up front.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HeaderList<'a> {
    Pairs(&'a [(String, String)]),
    Lines(&'a str),
    Lent(&'a [Tuple2<RString, RString>]),
}

impl<'a> HeaderList<'a> {
    /// Every header, in order.
    pub(crate) fn iter(self) -> impl Iterator<Item = (&'a str, &'a str)> {
        // One kind is set, the other two empty: chained, they need no box.
        let (pairs, lines, lent) = match self {
            HeaderList::Pairs(pairs) => (pairs, "", &[][..]),
            HeaderList::Lines(lines) => (&[][..], lines, &[][..]),
            HeaderList::Lent(lent) => (&[][..], "", lent),
        };
        let pairs = pairs.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        let lines = header_lines(lines);
        let lent = lent.iter().map(|t| (t.0.as_str(), t.1.as_str()));
        pairs.chain(lines).chain(lent)
    }
}

/// The headers of `name: value` lines, split on bytes: `\n` and `:` are
/// ASCII, so every cut falls between characters. (`str::lines` and
/// `split_once(':')` go through the general pattern searcher, whose set-up
/// costs more than the search on lines this short.) A line without a colon
/// is skipped; a value loses the whitespace around it (`\r` included), as
/// `str::trim` has it.
fn header_lines(text: &str) -> impl Iterator<Item = (&str, &str)> {
    let mut rest = text;
    std::iter::from_fn(move || {
        while !rest.is_empty() {
            let end = rest.bytes().position(|b| b == b'\n').unwrap_or(rest.len());
            let line = &rest[..end];
            rest = rest.get(end + 1..).unwrap_or_default();
            if let Some(colon) = line.bytes().position(|b| b == b':') {
                return Some((&line[..colon], line[colon + 1..].trim()));
            }
        }
        None
    })
}

impl<'a> UpstreamResponse<'a> {
    /// A response from its parts (for tests of a provider).
    pub fn new(status: u16, headers: &'a [(String, String)], body: &'a [u8]) -> Self {
        UpstreamResponse {
            status,
            headers: HeaderList::Pairs(headers),
            body,
        }
    }

    /// A response whose headers are `name: value` lines, one header a line
    /// (as the host holds them), read where they are.
    pub fn with_header_lines(status: u16, header_lines: &'a str, body: &'a [u8]) -> Self {
        UpstreamResponse {
            status,
            headers: HeaderList::Lines(header_lines),
            body,
        }
    }

    /// A response as the host lends it across the boundary.
    pub(crate) fn lent(
        status: u16,
        headers: &'a [Tuple2<RString, RString>],
        body: &'a [u8],
    ) -> Self {
        UpstreamResponse {
            status,
            headers: HeaderList::Lent(headers),
            body,
        }
    }

    /// A header's value, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&'a str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
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

    /// "Not found by status": an upstream that says "no such user" with an
    /// HTTP status (typically 404) instead of a body. When the response has
    /// `status`, this is [`ErrorKind::NotFound`] with `what` as the message;
    /// otherwise the response itself, for [`json`](Self::json) and the rest:
    ///
    /// ```
    /// # use plugin_api::{ErrorKind, UpstreamResponse};
    /// let r = UpstreamResponse::new(404, &[], b"{}");
    /// let e = r.not_found_on(404, "user").and_then(|r| r.json::<serde_json::Value>());
    /// assert_eq!(e.unwrap_err().kind(), ErrorKind::NotFound);
    /// ```
    ///
    /// Use it only for calls that name a resource (not `search`, where
    /// nothing is ever "not found"), and only when the status cannot also
    /// mean a wrong path or base URL: if it can, read the body first, and
    /// answer [`ProviderError::undecided`] when it does not say. Without
    /// this, [`check_status`](Self::check_status) calls a 404 a bad response.
    pub fn not_found_on(&self, status: u16, what: &str) -> Result<&Self, ProviderError> {
        if self.status == status {
            Err(ProviderError::not_found(what))
        } else {
            Ok(self)
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
    fn segments_are_encoded_and_dot_segments_refused() {
        let r = UpstreamRequest::get("https://h/x/", "/v2/creators")
            .segment("luna.bakes_1")
            .unwrap();
        assert_eq!(r.url(), "https://h/x/v2/creators/luna.bakes_1");
        for (raw, encoded) in [
            ("a/b", "a%2Fb"),
            ("%2e%2e", "%252e%252e"),
            ("a?b#c", "a%3Fb%23c"),
            ("...", "..."),
            ("🥐 x", "%F0%9F%A5%90%20x"),
        ] {
            let r = UpstreamRequest::get("http://h", "/u").segment(raw).unwrap();
            assert_eq!(r.url(), format!("http://h/u/{encoded}"), "{raw}");
        }
        for bad in ["", ".", ".."] {
            let e = UpstreamRequest::get("http://h", "/u")
                .segment(bad)
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad:?}");
        }
        let r = UpstreamRequest::get("http://h", "/")
            .query("q", 1)
            .segment("u")
            .unwrap()
            .segment("7")
            .unwrap();
        assert_eq!(r.url(), "http://h/u/7?q=1");
        let r = UpstreamRequest::get("http://h", "").bearer("t0k");
        assert_eq!(r.headers(), [("Authorization".into(), "Bearer t0k".into())]);
    }

    #[test]
    fn not_found_by_status() {
        let missing = UpstreamResponse::new(404, &[], b"{}");
        let e = missing.not_found_on(404, "user").unwrap_err();
        assert_eq!((e.kind(), e.message()), (ErrorKind::NotFound, "user"));
        let found = UpstreamResponse::new(200, &[], b"{}");
        assert!(found.not_found_on(404, "user").is_ok());
        let other = UpstreamResponse::new(410, &[], b"{}");
        let e = other
            .not_found_on(404, "user")
            .unwrap()
            .json::<serde_json::Value>();
        assert_eq!(e.unwrap_err().kind(), ErrorKind::BadResponse);
    }

    #[test]
    fn headers_are_found_by_any_case_in_pairs_and_in_lines() {
        let pairs = [("Retry-After".to_owned(), "7".to_owned())];
        let lines = "content-type: application/json\r\nretry-after:  7 \nno colon\nx-note: a: b";
        for r in [
            UpstreamResponse::new(429, &pairs, b""),
            UpstreamResponse::with_header_lines(429, lines, b""),
        ] {
            assert_eq!(r.header("retry-after"), Some("7"));
            assert_eq!(r.header("RETRY-AFTER"), Some("7"));
            assert_eq!(r.header("etag"), None);
            let e = r.check_status().unwrap_err();
            assert_eq!(e.retry_after_hint(), Some(Duration::from_secs(7)));
        }
        let r = UpstreamResponse::with_header_lines(200, lines, b"");
        assert_eq!(r.header("x-note"), Some("a: b"), "a value may hold colons");
        assert_eq!(r.header("content-type"), Some("application/json"));
        let names: Vec<_> = r.headers.iter().map(|(name, _)| name).collect();
        assert_eq!(names, ["content-type", "retry-after", "x-note"]);
        let padded = UpstreamResponse::with_header_lines(200, "retry-after: 7\u{a0}\n", b"");
        assert_eq!(padded.header("retry-after"), Some("7"), "as str::trim");
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
