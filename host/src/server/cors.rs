//! Cross-origin requests from browsers (`[server.cors] allowed_origins`):
//! which origins may read answers, the headers they may send and read, and
//! the answer to a preflight. No origin is allowed unless the operator
//! lists it (`["*"]` allows any); the OpenAPI document is readable from any
//! origin whatever the setting, so hosted viewers can load it by URL.
//!
//! Keys travel in `X-API-Key`, never in cookies, so credentials are never
//! allowed (`Access-Control-Allow-Credentials` is not sent).

use hyper::header::{
    HeaderMap, HeaderValue, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};

use crate::settings::{ConfigError, Context, RawCors};

/// What a browser script may send.
const ALLOWED_HEADERS: &str = "X-API-Key, X-Request-Id, Cache-Control, If-None-Match, If-Match";
/// What a browser script may read beyond the CORS-safelisted headers.
const EXPOSED_HEADERS: &str = "X-Request-Id, Cache-Status, Age, ETag, Retry-After, RateLimit, \
     RateLimit-Policy, RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset, X-Credits-Remaining, Link";
/// How long a browser may keep a preflight's answer, in seconds.
const PREFLIGHT_MAX_AGE: &str = "600";

/// Which origins may read answers. A serving setting: a reload applies it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CorsConfig {
    /// No cross-origin reads (the default).
    #[default]
    Off,
    /// `["*"]`: any origin.
    Any,
    /// These origins (`scheme://host[:port]`), exactly.
    Origins(Vec<String>),
}

impl CorsConfig {
    /// `[server.cors]`.
    pub fn from_raw(raw: Option<&RawCors>, cx: &Context) -> Result<CorsConfig, ConfigError> {
        let key = "[server.cors] allowed_origins";
        let Some(origins) = raw.and_then(|r| r.allowed_origins.as_ref()) else {
            return Ok(CorsConfig::Off);
        };
        if origins.iter().any(|o| o == "*") {
            if origins.len() > 1 {
                return Err(cx.invalid(key, "\"*\" allows every origin: list it alone"));
            }
            return Ok(CorsConfig::Any);
        }
        for origin in origins {
            if !is_origin(origin) {
                return Err(cx.invalid(
                    key,
                    format!("`{origin}` is not an origin (scheme://host[:port], no path)"),
                ));
            }
        }
        Ok(match origins.is_empty() {
            true => CorsConfig::Off,
            false => CorsConfig::Origins(origins.clone()),
        })
    }

    /// The `Access-Control-Allow-Origin` for a request from `origin`, if
    /// it may read the answer.
    fn allow(&self, origin: &HeaderValue) -> Option<HeaderValue> {
        match self {
            CorsConfig::Off => None,
            CorsConfig::Any => Some(HeaderValue::from_static("*")),
            CorsConfig::Origins(list) => list
                .iter()
                .any(|o| o.as_bytes() == origin.as_bytes())
                .then(|| origin.clone()),
        }
    }
}

/// `scheme://host[:port]` as a browser sends it in `Origin`.
fn is_origin(origin: &str) -> bool {
    let Some((scheme, host)) = origin.split_once("://") else {
        return false;
    };
    !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        && !host.is_empty()
        && !host.contains(['/', '?', '#', '@', ' '])
        && !origin.ends_with(':')
}

/// Adds the CORS headers for the request with `request` headers to an
/// answer's `headers`: a preflight's (for an `OPTIONS` request) or an
/// actual request's. `public` answers (the OpenAPI document) allow any
/// origin. Nothing is added for a request from an origin not allowed.
///
/// Where any origin may read the answer (`public`, or `["*"]`), the
/// headers go on every answer, `Origin` or not: a shared cache that stored
/// an answer to a request without `Origin` (the document may be cached)
/// then serves one a browser can read, and nothing needs `Vary: Origin`.
pub fn decorate(config: &CorsConfig, public: bool, request: &HeaderMap, headers: &mut HeaderMap) {
    let origin = request.get(ORIGIN);
    let allowed = if public || *config == CorsConfig::Any {
        Some(HeaderValue::from_static("*"))
    } else if let CorsConfig::Origins(_) = config {
        // The answer depends on `Origin`: only some origins may read it.
        headers.append(VARY, HeaderValue::from_static("origin"));
        origin.and_then(|origin| config.allow(origin))
    } else {
        None
    };
    let Some(allowed) = allowed else { return };
    headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
    if origin.is_some() && request.contains_key(ACCESS_CONTROL_REQUEST_METHOD) {
        headers.insert(
            ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(super::response::ALLOWED_METHODS),
        );
        headers.insert(
            ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOWED_HEADERS),
        );
        headers.insert(
            ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(PREFLIGHT_MAX_AGE),
        );
    } else {
        headers.insert(
            ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSED_HEADERS),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(origins: &[&str]) -> Result<CorsConfig, ConfigError> {
        let raw = RawCors {
            allowed_origins: Some(origins.iter().map(|o| o.to_string()).collect()),
        };
        let env = |_: &str| None;
        let cx = Context::new(Path::new("platforms.toml"), &env);
        CorsConfig::from_raw(Some(&raw), &cx)
    }

    fn request(origin: Option<&str>, preflight: bool) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(origin) = origin {
            h.insert(ORIGIN, HeaderValue::from_str(origin).unwrap());
        }
        if preflight {
            h.insert(
                ACCESS_CONTROL_REQUEST_METHOD,
                HeaderValue::from_static("GET"),
            );
        }
        h
    }

    fn answered(config: &CorsConfig, public: bool, request: &HeaderMap) -> HeaderMap {
        let mut headers = HeaderMap::new();
        decorate(config, public, request, &mut headers);
        headers
    }

    #[test]
    fn origins_are_validated() {
        assert_eq!(parse(&["*"]).unwrap(), CorsConfig::Any);
        assert_eq!(parse(&[]).unwrap(), CorsConfig::Off);
        assert!(parse(&["https://app.example", "http://localhost:3000"]).is_ok());
        for bad in [
            &["*", "https://a.example"][..],
            &["app.example"],
            &["https://app.example/"],
            &["https://app.example/path"],
            &["https://"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_listed_origins_answer_varies_on_origin_and_cors_off_says_nothing() {
        let config = parse(&["https://app.example"]).unwrap();
        let ok = answered(&config, false, &request(Some("https://app.example"), false));
        assert_eq!(ok[VARY], "origin");
        let off = answered(
            &CorsConfig::Off,
            false,
            &request(Some("https://a.b"), false),
        );
        assert!(off.is_empty());
    }

    #[test]
    fn answers_any_origin_may_read_carry_cors_headers_without_origin() {
        // A shared cache may store them for the next caller, a browser.
        for (config, public) in [(CorsConfig::Off, true), (CorsConfig::Any, false)] {
            let plain = answered(&config, public, &request(None, false));
            assert_eq!(plain[ACCESS_CONTROL_ALLOW_ORIGIN], "*", "{config:?}");
            assert!(plain.contains_key(ACCESS_CONTROL_EXPOSE_HEADERS));
            assert!(!plain.contains_key(VARY), "{config:?}");
        }
        let listed = parse(&["https://app.example"]).unwrap();
        let plain = answered(&listed, false, &request(None, false));
        assert!(!plain.contains_key(ACCESS_CONTROL_ALLOW_ORIGIN));
        assert_eq!(plain[VARY], "origin");
        assert!(answered(&CorsConfig::Off, false, &request(None, false)).is_empty());
    }
}
