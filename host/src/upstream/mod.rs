//! Performing the upstream requests providers ask for, with the one shared
//! HTTP client.
//!
//! The client never follows redirects (a redirect would carry the upstream
//! key to wherever it points) and uses a proxy only when the config names
//! one, never from the environment. Bodies are read up to a cap. A plugin
//! may only ask for `GET`s within its provider's [`Origin`]: one that
//! followed an upstream-supplied link would otherwise send the key anywhere.
//!
//! One transport, reqwest, for direct and proxied requests alike: HTTP/1.1
//! over rustls with the webpki roots for `https://`, and the CAs of
//! `upstream_ca_file` when the config names one. Its pool keeps idle
//! connections per host and closes those idle past a minute. Through
//! `upstream_proxy`, `http://` upstreams get absolute-form requests and
//! `https://` ones `CONNECT` tunnels, with credentials from the proxy URL.

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Body;
use hyper::header::{HeaderName, HeaderValue, CONTENT_LENGTH, USER_AGENT};
use hyper::{Response, Uri};
use plugin_api::{ErrorKind, ProviderError, UpstreamRequest, UpstreamResponse};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::settings::{ConfigError, Context, RawServer, Secret};

/// Larger upstream bodies are refused as bad responses.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle connections kept per upstream host, at most.
const MAX_IDLE_PER_HOST: usize = 1024;
const USER_AGENT_VALUE: &str = concat!("socialgate/", env!("CARGO_PKG_VERSION"));

/// `[server] upstream_proxy`: `http://` or `https://` only, since the client
/// is built without SOCKS support, and a URL the client can use (checked
/// here as the client will read it, so `check` refuses what `serve` could
/// not start with). Never echoed: it may carry credentials.
pub fn proxy_from_raw(raw: &RawServer, cx: &Context) -> Result<Option<Secret>, ConfigError> {
    const FIELD: &str = "[server] upstream_proxy";
    match &raw.upstream_proxy {
        None => Ok(None),
        Some(proxy) if !(proxy.starts_with("http://") || proxy.starts_with("https://")) => {
            Err(cx.invalid(FIELD, "not an http:// or https:// URL"))
        }
        Some(proxy) if reqwest::Proxy::all(proxy.as_str()).is_err() => Err(cx.invalid(
            FIELD,
            "does not parse as a URL (is its host or port valid?)",
        )),
        // A path, query or fragment would be dropped: what was meant?
        Some(proxy)
            if url::Url::parse(proxy).is_ok_and(|url| {
                url.path() != "/" || url.query().is_some() || url.fragment().is_some()
            }) =>
        {
            Err(cx.invalid(
                FIELD,
                "has a path, query or fragment; a proxy is scheme://[user:password@]host:port",
            ))
        }
        // Port 0 only means "any" when binding: no proxy listens there.
        Some(proxy) if url::Url::parse(proxy).is_ok_and(|url| url.port() == Some(0)) => {
            Err(cx.invalid(FIELD, "has port 0, where no proxy can listen"))
        }
        Some(proxy) => Ok(Some(Secret::new(proxy.clone()))),
    }
}

/// `[server] upstream_ca_file`: a PEM file of CA certificates `https://`
/// upstreams (and an `https://` proxy) are trusted under besides the public
/// roots, for providers behind a private CA. Read and checked at load
/// (sections other than certificates are skipped): a file that cannot be
/// read, holds no certificate or one that does not parse is a config
/// error.
pub fn ca_file_from_raw(
    raw: &RawServer,
    cx: &Context,
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    const KEY: &str = "[server] upstream_ca_file";
    let Some(path) = &raw.upstream_ca_file else {
        return Ok(Vec::new());
    };
    let path = cx.resolve(path);
    let certs = CertificateDer::pem_file_iter(&path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| cx.invalid(KEY, format!("cannot read {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(cx.invalid(KEY, format!("{} holds no PEM certificate", path.display())));
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in &certs {
        roots.add(cert.clone()).map_err(|e| {
            cx.invalid(
                KEY,
                format!("{}: not a usable CA certificate: {e}", path.display()),
            )
        })?;
    }
    Ok(certs)
}

/// Where a provider's requests may go: its `base_url`'s scheme, host and
/// port, as the HTTP client will connect to them. Holds no userinfo or
/// path, so it prints without credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The host is ASCII, lower case (IDNA applied), with brackets around
    /// an IPv6 address: the spelling every admitted request connects with.
    target: Target,
}

/// Where a connection goes: a URL's scheme, host (as its provider's origin
/// spells it: lower case, brackets around an IPv6 address) and port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    https: bool,
    host: String,
    port: u16,
}

impl Origin {
    /// The origin of an `http://` or `https://` base URL; `None` for
    /// anything else.
    pub fn of(base_url: &str) -> Option<Origin> {
        let url = url::Url::parse(base_url).ok()?;
        let https = match url.scheme() {
            "http" => false,
            "https" => true,
            _ => return None,
        };
        Some(Origin {
            target: Target {
                https,
                host: url.host()?.to_string(),
                port: url.port_or_known_default()?,
            },
        })
    }

    /// Refuses a request the provider may not make: any method but `GET`, or
    /// a URL outside this origin. The message quotes neither, since a URL may
    /// carry the key. An admitted URL comes back parsed, for
    /// [`UpstreamClient::fetch`]: it is parsed once.
    ///
    /// The URL is compared as the client will use it: the literal host it
    /// connects to (so `127.1` is not `127.0.0.1`, and a host that is not
    /// plain ASCII is refused rather than translated), the port or the
    /// scheme's default, and no userinfo, which would only confuse a
    /// reader of the URL about where it goes.
    pub fn admit(&self, method: &str, url: &str) -> Result<Admitted<'_>, ProviderError> {
        if method != "GET" {
            return Err(ProviderError::bad_response(
                "plugin asked for a request that is not a GET; refused",
            ));
        }
        url.parse::<Uri>()
            .ok()
            .and_then(|uri| self.target_of(uri))
            .ok_or_else(|| {
                ProviderError::bad_response(
                    "plugin asked for a URL outside its provider's base_url origin; refused",
                )
            })
    }

    /// `uri` with where it leads, when that is this origin.
    fn target_of(&self, uri: Uri) -> Option<Admitted<'_>> {
        let https = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("http") => false,
            Some(s) if s.eq_ignore_ascii_case("https") => true,
            _ => return None,
        };
        let authority = uri.authority()?;
        if authority.as_str().contains('@') {
            // Userinfo: refused, it only hides where the URL goes.
            return None;
        }
        let host = authority.host();
        // The authority is the host, then the port if any.
        let port = match &authority.as_str()[host.len()..] {
            "" => {
                if https {
                    443
                } else {
                    80
                }
            }
            _ => authority.port_u16()?,
        };
        let target = &self.target;
        let inside =
            https == target.https && host.eq_ignore_ascii_case(&target.host) && port == target.port;
        // The origin's spelling of the host: one pool of connections
        // whatever case the plugin writes it in.
        inside.then_some(Admitted { uri, target })
    }
}

/// A URL [`Origin::admit`] let through, and where it leads.
#[derive(Debug)]
pub struct Admitted<'o> {
    uri: Uri,
    target: &'o Target,
}

impl Admitted<'_> {
    /// The URL as reqwest takes it, checked to lead where the origin
    /// admitted: parsed again by another parser, it must not go elsewhere.
    fn into_url(self) -> Result<reqwest::Url, ProviderError> {
        reqwest::Url::parse(&self.uri.to_string())
            .ok()
            .filter(|url| {
                url.scheme() == if self.target.https { "https" } else { "http" }
                    && url
                        .host_str()
                        .is_some_and(|host| host.eq_ignore_ascii_case(&self.target.host))
                    && url.port_or_known_default() == Some(self.target.port)
                    && url.username().is_empty()
                    && url.password().is_none()
            })
            .ok_or_else(|| {
                ProviderError::bad_response(
                    "plugin asked for a URL outside its provider's base_url origin; refused",
                )
            })
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot build the upstream HTTP client: {0}")]
pub struct ClientError(#[from] reqwest::Error);

/// The host's HTTP client for upstreams. A clone shares the connections
/// (and costs one reference count: each attempt holds one).
#[derive(Clone)]
pub struct UpstreamClient {
    client: reqwest::Client,
    /// Whether requests go through `[server] upstream_proxy`, whose
    /// failures are then said to be the proxy's.
    proxied: bool,
}

/// An upstream's answer, read in full.
pub struct Fetched {
    status: u16,
    /// `name: value` lines, as the plugin reads them.
    header_lines: String,
    body: Vec<u8>,
}

impl Fetched {
    pub fn as_response(&self) -> UpstreamResponse<'_> {
        UpstreamResponse::with_header_lines(self.status, &self.header_lines, &self.body)
    }
}

impl UpstreamClient {
    /// A client through `proxy` when set, trusting `extra_roots` (see
    /// [`ca_file_from_raw`]) besides the public roots.
    pub fn new(
        proxy: Option<&Secret>,
        extra_roots: &[CertificateDer<'static>],
    ) -> Result<UpstreamClient, ClientError> {
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .http1_only()
            .tcp_nodelay(true)
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(MAX_IDLE_PER_HOST);
        if let Some(proxy) = proxy {
            builder = builder.proxy(reqwest::Proxy::all(proxy.expose())?);
        }
        for root in extra_roots {
            builder = builder.add_root_certificate(reqwest::Certificate::from_der(root)?);
        }
        Ok(UpstreamClient {
            client: builder.build()?,
            proxied: proxy.is_some(),
        })
    }

    /// Performs `request`, at the URL its provider's origin admitted.
    /// Transport failures are transient; a body over `max_body` bytes is a
    /// bad response. Errors never carry the request's URL or headers.
    pub async fn fetch(
        &self,
        url: Admitted<'_>,
        request: &UpstreamRequest,
        max_body: usize,
    ) -> Result<Fetched, ProviderError> {
        let mut upstream = reqwest::Request::new(reqwest::Method::GET, url.into_url()?);
        let map = upstream.headers_mut();
        map.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        for (name, value) in checked_headers(request)? {
            map.append(name, value);
        }
        let response = self.client.execute(upstream).await.map_err(|e| {
            // Said as through the proxy: the operator's to look at first,
            // not the upstream's.
            let what = match self.proxied {
                true => "request through the upstream proxy failed",
                false => "request failed",
            };
            transient(what, &e.without_url())
        })?;
        if self.proxied && response.status() == reqwest::StatusCode::PROXY_AUTHENTICATION_REQUIRED {
            return Err(ProviderError::new(
                ErrorKind::Transient,
                "the upstream proxy refused its credentials (HTTP 407): check [server] upstream_proxy",
            ));
        }
        // Its body errors would name the URL too.
        let response = Response::from(response).map(|body| body.map_err(|e| e.without_url()));
        read_in_full(response, max_body).await
    }
}

/// The plugin's headers, each a valid name and value that is not
/// [reserved](plugin_api::upstream::RESERVED_HEADERS) (plugin-api's rule,
/// which the test kit applies too).
fn checked_headers(
    request: &UpstreamRequest,
) -> Result<Vec<(HeaderName, HeaderValue)>, ProviderError> {
    request
        .headers()
        .iter()
        .map(|(name, value)| {
            if let Some(reason) = plugin_api::upstream::header_refusal(name, value) {
                return Err(ProviderError::bad_response(reason));
            }
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                (Ok(name), Ok(value)) => Ok((name, value)),
                // What `header_refusal` let through, these take.
                _ => Err(ProviderError::bad_response(
                    "plugin asked for an invalid request header",
                )),
            }
        })
        .collect()
}

/// Reads `response` whole, refusing a body over `max_body` bytes (by its
/// `Content-Length` before reading, or as it arrives).
async fn read_in_full<B>(response: Response<B>, max_body: usize) -> Result<Fetched, ProviderError>
where
    B: Body<Data = Bytes>,
    B::Error: StdError + 'static,
{
    let (parts, body) = response.into_parts();
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max_body as u64) {
        return Err(too_large(max_body));
    }
    let mut header_lines = String::new();
    for (name, value) in &parts.headers {
        // Text beyond ASCII (obs-text) is kept; bytes that are not UTF-8 are not.
        if let Ok(value) = std::str::from_utf8(value.as_bytes()) {
            header_lines.push_str(name.as_str());
            header_lines.push_str(": ");
            header_lines.push_str(value);
            header_lines.push('\n');
        }
    }
    let mut bytes = Vec::with_capacity(declared.map_or(0, |len| len as usize));
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| transient("reading the body failed", &e))?;
        if let Ok(chunk) = frame.into_data() {
            if bytes.len() + chunk.len() > max_body {
                return Err(too_large(max_body));
            }
            bytes.extend_from_slice(&chunk);
        }
    }
    Ok(Fetched {
        status: parts.status.as_u16(),
        header_lines,
        body: bytes,
    })
}

/// A transport failure, with the error's causes (none of which names the
/// URL: hyper's errors never do, and reqwest's are stripped of it).
fn transient(what: &str, error: &(dyn StdError + 'static)) -> ProviderError {
    let mut message = format!("{what}: {error}");
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(message, ": {cause}");
        source = cause.source();
    }
    ProviderError::new(ErrorKind::Transient, message)
}

fn too_large(cap: usize) -> ProviderError {
    ProviderError::bad_response(format!("body larger than {cap} bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugins_headers_are_sent_in_lower_case_or_refused() {
        let request = UpstreamRequest::get("http://h", "/p")
            .header("X-Api-Key", "k\tv")
            .header("Accept", "*/*");
        let headers = checked_headers(&request).unwrap();
        let sent: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes()))
            .collect();
        assert_eq!(sent, [("x-api-key", &b"k\tv"[..]), ("accept", &b"*/*"[..])]);
        for (name, value) in [
            ("Host", "evil"),
            ("content-LENGTH", "5"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "close"),
            ("x bad", "v"),
            ("x:bad", "v"),
            ("", "v"),
            ("x-ok", "a\r\nx-injected: 1"),
            ("x-ok", "nul\0"),
            ("x-ok", "del\u{7f}"),
        ] {
            let request = UpstreamRequest::get("http://h", "/p").header(name, value);
            assert!(checked_headers(&request).is_err(), "{name}: {value:?}");
        }
        // Non-ASCII text is a valid value (obs-text), as `HeaderValue` takes it.
        let request = UpstreamRequest::get("http://h", "/p").header("x-name", "café");
        assert!(checked_headers(&request).is_ok());
    }

    #[test]
    fn a_provider_may_only_get_within_its_base_url_origin() {
        let origin = Origin::of("https://api.example.test/v1/").unwrap();
        for url in [
            "https://api.example.test/v1/user?x=1",
            "https://api.example.test:443/other/path",
            "https://API.example.test/v1/",
        ] {
            assert!(origin.admit("GET", url).is_ok(), "{url}");
        }
        for url in [
            "http://api.example.test/v1/",
            "https://api.example.test:8443/v1/",
            "https://evil.test/v1/",
            "https://api.example.test.evil.test/v1/",
            "https://api.example.test@evil.test/v1/",
            "https://evil.test\\@api.example.test/",
            "not a url",
            "/relative",
        ] {
            assert!(origin.admit("GET", url).is_err(), "{url}");
        }
        for method in ["POST", "get", "DELETE", ""] {
            assert!(origin
                .admit(method, "https://api.example.test/v1/")
                .is_err());
        }
        // The literal host the client connects to is what is compared.
        let local = Origin::of("http://127.0.0.1:8080/base").unwrap();
        assert!(local.admit("GET", "http://127.0.0.1:8080/v1/x").is_ok());
        for url in [
            "http://127.1:8080/v1/x",
            "http://localhost:8080/v1/x",
            "http://127.0.0.1/v1/x",
            "http://127.0.0.1:8080.evil.test/",
        ] {
            assert!(local.admit("GET", url).is_err(), "{url}");
        }
        let v6 = Origin::of("http://[::1]:9000").unwrap();
        assert!(v6.admit("GET", "http://[::1]:9000/p").is_ok());
        assert!(v6.admit("GET", "http://[::2]:9000/p").is_err());
        let idn = Origin::of("https://bücher.example/").unwrap();
        assert!(idn.admit("GET", "https://xn--bcher-kva.example/p").is_ok());
        assert!(idn.admit("GET", "https://bücher.example/p").is_err());
        for url in [
            "http://127.0.0.1:99999/v1/x",
            "http://127.0.0.1:/v1/x",
            "http://127.0.0.1:80a/v1/x",
        ] {
            assert!(local.admit("GET", url).is_err(), "{url}");
        }
        // One pool whatever the spelling of the host.
        let upper = origin.admit("GET", "https://API.example.test/x").unwrap();
        assert_eq!(upper.target.host, "api.example.test");
        assert_eq!(upper.target.port, 443);
        let url = upper.into_url().unwrap();
        assert_eq!(url.as_str(), "https://api.example.test/x");
        assert_eq!(Origin::of("ftp://x/"), None);
        assert_eq!(Origin::of("http://"), None);
    }
}
