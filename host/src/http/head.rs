//! The request head, before any check of the API's: what hyper has read
//! may still be no request this server should act on (RFC 9112, 3.2: a
//! target in the wrong form, a missing or doubtful `Host`, a body framed
//! in a way a proxy in front may read otherwise, a target past
//! [`MAX_TARGET_BYTES`]), and a path has one spelling for every check
//! after ([`normalize_path`]).

use hyper::body::Incoming;
use hyper::header::{HeaderMap, HOST, TRANSFER_ENCODING};
use hyper::http::uri::Scheme;
use hyper::{Method, Request, Version};

use crate::error::ApiError;

/// The longest request target served (a `query` of 100 characters and a
/// cursor take a few hundred bytes); a longer one is `414`.
const MAX_TARGET_BYTES: usize = 8 * 1024;

/// Admission's first gate: a head past `max_header_bytes` (`431`), then
/// [`check_head`]. hyper refuses most HTTP/1 heads over the limit itself
/// (see `refusal`), but not one that arrives whole in a read buffer grown
/// by earlier requests; HTTP/2 heads are measured only here (hyper's limit
/// for them is above this one: `server::H2_HEADER_LIST_MARGIN`).
pub(super) fn check<B>(request: &Request<B>, max_header_bytes: usize) -> Result<(), ApiError> {
    if head_size(request) > max_header_bytes {
        return Err(ApiError::HeadersTooLarge);
    }
    check_head(request)
}

/// What a head hyper has read may still get wrong (RFC 9112, 3.2 and 3.2.1):
/// a target in a form its method does not take (`GET healthz`, `GET *`),
/// an HTTP/1.1 request without exactly one `Host` (HTTP/2 names the host
/// in `:authority`; no request may name two), a `Host` that is no host
/// and port, a body framed in a way a proxy in front may read otherwise
/// ([`has_odd_transfer_coding`]). And a target longer than
/// [`MAX_TARGET_BYTES`].
fn check_head<B>(request: &Request<B>) -> Result<(), ApiError> {
    let uri = request.uri();
    let target = uri.path_and_query().map_or("", |pq| pq.as_str());
    let form_fits = match *request.method() {
        // Authority-form: refused for its method further on.
        Method::CONNECT => true,
        Method::OPTIONS if target == "*" => true,
        // Origin-form, or absolute-form (as a proxy would send it; every
        // HTTP/2 request has a scheme, and `*` as its `:path`) of an HTTP
        // URI: this server serves no other scheme (`ftp://...` is no
        // request for it).
        _ => {
            let http = |s: &Scheme| *s == Scheme::HTTP || *s == Scheme::HTTPS;
            target != "*"
                && match uri.scheme() {
                    Some(scheme) => http(scheme),
                    None => target.starts_with('/'),
                }
        }
    };
    // HTTP/2 names the host in `:authority` (RFC 9113, 8.3.1): a request
    // needs it or `Host`, and the two must agree. HTTP/1.1 needs `Host` (an
    // absolute-form target's authority wins over it: RFC 9112, 3.2.2).
    let h2 = request.version() == Version::HTTP_2;
    let authority = uri.authority().map(|a| a.as_str().as_bytes());
    let mut hosts = request.headers().get_all(HOST).iter();
    let host_fits = match (hosts.next(), hosts.next()) {
        (Some(host), None) => {
            is_host(host.as_bytes())
                && !(h2
                    && authority
                        .is_some_and(|a| !same_authority(a, host.as_bytes(), uri.scheme_str())))
        }
        (None, _) if h2 => authority.is_some(),
        (None, _) => request.version() != Version::HTTP_11,
        (Some(_), Some(_)) => false,
    };
    // An authority (HTTP/2's `:authority`, an absolute-form target's) is a
    // host as `Host` is: no user or password (RFC 9113, 8.3.1 forbids
    // them), a port of digits.
    let authority_fits = authority.is_none_or(is_host);
    if !(form_fits && host_fits && authority_fits) || has_odd_transfer_coding(request.headers()) {
        return Err(ApiError::MalformedRequest);
    }
    if target_len(uri) > MAX_TARGET_BYTES {
        return Err(ApiError::UriTooLong);
    }
    Ok(())
}

/// Whether `host` names `authority`, compared as RFC 9113 (8.3.1) asks:
/// case aside, and the port `scheme` implies (`:443` for `https`, `:80`
/// otherwise) or an empty one the same as none.
fn same_authority(authority: &[u8], host: &[u8], scheme: Option<&str>) -> bool {
    let implied: &[u8] = match scheme {
        Some("https") => b":443",
        _ => b":80",
    };
    fn bare<'a>(name: &'a [u8], implied: &[u8]) -> &'a [u8] {
        let name = name.strip_suffix(implied).unwrap_or(name);
        name.strip_suffix(b":").unwrap_or(name)
    }
    bare(authority, implied).eq_ignore_ascii_case(bare(host, implied))
}

/// Whether `value` is a `Host` as RFC 9110 (7.2) writes one: a host name
/// (RFC 3986's reg-name) or an IP literal in brackets, and a port of
/// digits. RFC 9112 (3.2) wants any other refused with 400. An empty name
/// is refused too: an `http` URI with an empty host is invalid (RFC 9110,
/// 4.2.1).
fn is_host(value: &[u8]) -> bool {
    let (host, port) = match value.strip_prefix(b"[") {
        Some(rest) => match rest.iter().position(|&b| b == b']') {
            Some(end)
                if rest[..end]
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || b":.".contains(b)) =>
            {
                (&rest[..0], &rest[end + 1..])
            }
            _ => return false,
        },
        None => match value.iter().rposition(|&b| b == b':') {
            Some(colon) => (&value[..colon], &value[colon..]),
            None => (value, &value[..0]),
        },
    };
    let port_fits =
        port.is_empty() || (port[0] == b':' && port[1..].iter().all(u8::is_ascii_digit));
    port_fits
        && (value.starts_with(b"[") || !host.is_empty())
        && host
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%".contains(b))
}

/// A `Transfer-Encoding` other than one `chunked`: no request here has a
/// body, and one framed in a way a proxy in front may read otherwise
/// (`chunked, chunked`, `gzip, chunked`) is refused, its connection
/// closed ([`handle`](super::api::handle)), so nothing after it on the connection is read as a
/// request.
pub(super) fn has_odd_transfer_coding(headers: &HeaderMap) -> bool {
    let mut codings = headers.get_all(TRANSFER_ENCODING).iter();
    match (codings.next(), codings.next()) {
        (None, _) => false,
        (Some(only), None) => !only
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"chunked"),
        (Some(_), Some(_)) => true,
    }
}

/// The bytes of a request's target as sent in HTTP/1.1 (absolute-form
/// counts its authority).
fn target_len(uri: &hyper::Uri) -> usize {
    uri.path_and_query().map_or(0, |pq| pq.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len())
}

/// About the bytes of a request's head as sent in HTTP/1.1.
fn head_size<B>(request: &Request<B>) -> usize {
    let line = request.method().as_str().len() + target_len(request.uri()) + 12;
    request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
        + line
}

/// Decodes the request path's percent-encoded unreserved characters
/// ([`decode_unreserved`]), so that every check, the route, the metrics
/// and the log see one spelling. Left as sent when the head is past a
/// limit: `414` and `431` measure the target as it came.
pub(super) fn normalize_path(request: &mut Request<Incoming>, max_header_bytes: usize) {
    let uri = request.uri();
    if !uri.path().contains('%')
        || target_len(uri) > MAX_TARGET_BYTES
        || head_size(request) > max_header_bytes
    {
        return;
    }
    if let Some(decoded) = decode_unreserved(uri) {
        *request.uri_mut() = decoded;
    }
}

/// `uri` with the percent-encoded unreserved characters of its path
/// decoded and its other escapes' hex digits upper-case (RFC 3986,
/// 6.2.2): `/v1/%73hortvideo/%70rofile` is `/v1/shortvideo/profile`;
/// `%2F` stays what it is, not a `/`. `None` when nothing changes.
fn decode_unreserved(uri: &hyper::Uri) -> Option<hyper::Uri> {
    let bytes = uri.path().as_bytes();
    // Only ASCII escapes are rewritten, to ASCII: every other byte, a
    // UTF-8 sequence's included, is copied as it came.
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes[i] {
            b'%' => bytes
                .get(i + 1..i + 3)
                .filter(|pair| pair.iter().all(u8::is_ascii_hexdigit))
                .and_then(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()),
            _ => None,
        };
        match escaped {
            Some(b) if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') => {
                decoded.push(b);
                i += 3;
            }
            Some(_) => {
                // Two hex digits: upper-casing them is the whole rewrite.
                let (high, low) = (bytes[i + 1], bytes[i + 2]);
                decoded.extend_from_slice(&[
                    b'%',
                    high.to_ascii_uppercase(),
                    low.to_ascii_uppercase(),
                ]);
                i += 3;
            }
            None => {
                decoded.push(bytes[i]);
                i += 1;
            }
        }
    }
    if decoded == bytes {
        return None;
    }
    if let Some(query) = uri.query() {
        decoded.push(b'?');
        decoded.extend_from_slice(query.as_bytes());
    }
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(hyper::http::uri::PathAndQuery::try_from(decoded).ok()?);
    hyper::Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    #[test]
    fn percent_encoded_unreserved_characters_in_the_path_are_decoded() {
        let decoded = |target: &str| {
            let uri: hyper::Uri = target.parse().expect("a target");
            decode_unreserved(&uri).map(|uri| uri.to_string())
        };
        assert_eq!(
            decoded("/v1/p?username=%6Cuna").as_deref(),
            None,
            "the path only: the query is form-decoded later"
        );
        assert_eq!(
            decoded("/%2d%2E%5f%7E%41%7a%30").as_deref(),
            Some("/-._~Az0")
        );
        assert_eq!(
            decoded("/v1/shortvideo%2fprofile").as_deref(),
            Some("/v1/shortvideo%2Fprofile"),
            "a reserved character stays escaped, its digits upper-case"
        );
        assert_eq!(decoded("/v1/a%2Fb"), None, "nothing to change");
        assert_eq!(decoded("/v1/shortvideo/profile"), None);
        assert_eq!(decoded("/%zz%4").as_deref(), None, "not escapes: kept");
        assert_eq!(decoded("/%e2%82%ac").as_deref(), Some("/%E2%82%AC"));
        assert_eq!(
            decoded("/\u{fc}%41").as_deref(),
            Some("/\u{fc}A"),
            "UTF-8 in the path is copied as it came"
        );
        assert_eq!(
            decoded("http://h:1/%70?q").as_deref(),
            Some("http://h:1/p?q"),
            "an absolute target keeps its scheme and authority"
        );
    }

    /// An HTTP/2 request head (no `Host`: `:authority` names the host).
    fn h2_head(method: Method, uri: hyper::Uri) -> Request<()> {
        Request::builder()
            .version(Version::HTTP_2)
            .method(method)
            .uri(uri)
            .body(())
            .expect("a request")
    }

    /// Hardening review, defect 3: every HTTP/2 request has a scheme, so
    /// the scheme alone must not let `*` through for a `GET`.
    #[test]
    fn an_asterisk_target_is_only_for_options_over_http2_too() {
        let star = || {
            hyper::Uri::builder()
                .scheme("http")
                .authority("a")
                .path_and_query("*")
                .build()
                .expect("a URI")
        };
        let get = h2_head(Method::GET, star());
        assert_eq!(check_head(&get), Err(ApiError::MalformedRequest));
        let options = h2_head(Method::OPTIONS, star());
        assert_eq!(check_head(&options), Ok(()));
        let path = hyper::Uri::from_static("http://a/healthz");
        assert_eq!(check_head(&h2_head(Method::GET, path)), Ok(()));
    }

    /// Black-box sweep: an absolute-form target of another scheme is no
    /// request for this server, over HTTP/1.1 as over HTTP/2.
    #[test]
    fn an_absolute_target_is_an_http_uri() {
        for (uri, fits) in [
            ("http://a/healthz", true),
            ("https://a/healthz", true),
            ("HTTP://a/healthz", true),
            ("ftp://a/healthz", false),
            ("gopher://a/healthz", false),
            // HTTP sweep: an authority with a user or password, which a
            // `Host` may not have either.
            ("http://u@a/healthz", false),
            ("http://u:p@a/healthz", false),
        ] {
            let uri: hyper::Uri = uri.parse().expect("a URI");
            let mut h1 = Request::builder()
                .method(Method::GET)
                .uri(uri.clone())
                .body(())
                .expect("a request");
            h1.headers_mut().insert(HOST, HeaderValue::from_static("a"));
            for request in [h1, h2_head(Method::GET, uri.clone())] {
                let expected = if fits {
                    Ok(())
                } else {
                    Err(ApiError::MalformedRequest)
                };
                assert_eq!(
                    check_head(&request),
                    expected,
                    "{uri} {:?}",
                    request.version()
                );
            }
        }
    }

    /// HTTP review, defect 6: an HTTP/2 request names its host in
    /// `:authority` or `Host`, and a `Host` beside `:authority` agrees.
    #[test]
    fn an_http2_request_names_one_host() {
        let with_host = |uri: &'static str, host: Option<&'static str>| {
            let mut request = h2_head(Method::GET, hyper::Uri::from_static(uri));
            if let Some(host) = host {
                request
                    .headers_mut()
                    .insert(HOST, HeaderValue::from_static(host));
            }
            check_head(&request)
        };
        assert_eq!(with_host("http://a:80/healthz", None), Ok(()));
        assert_eq!(with_host("http://a:80/healthz", Some("A:80")), Ok(()));
        assert_eq!(with_host("http://a:80/healthz", Some("a")), Ok(()));
        assert_eq!(with_host("https://a/healthz", Some("a:443")), Ok(()));
        assert_eq!(with_host("http://a:/healthz", Some("a")), Ok(()));
        assert_eq!(with_host("/healthz", Some("a:80")), Ok(()));
        for (uri, host) in [
            ("/healthz", None),
            ("http://a:80/healthz", Some("b:80")),
            ("http://a:8080/healthz", Some("a")),
            ("https://a/healthz", Some("a:80")),
            ("http://a:80/healthz", Some("")),
            // HTTP sweep: userinfo in `:authority`, which HTTP/1.1 refuses in `Host`.
            ("http://u@a/healthz", None),
        ] {
            assert_eq!(
                with_host(uri, host),
                Err(ApiError::MalformedRequest),
                "{uri} {host:?}"
            );
        }
    }

    #[test]
    fn a_host_is_a_name_or_an_ip_literal_and_a_port() {
        for good in [
            "api.example.com",
            "a:80",
            "a:",
            "127.0.0.1:8080",
            "[::1]",
            "[::1]:80",
            "xn--bcher-kva.de",
        ] {
            assert!(is_host(good.as_bytes()), "{good:?}");
        }
        for bad in [
            "a b", "x@y", "x/y", "[::1", "::1", "a:8x", "[::1]x", "a\tb", "x, y", "", ":80",
        ] {
            assert!(!is_host(bad.as_bytes()), "{bad:?}");
        }
    }
}
