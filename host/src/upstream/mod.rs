//! Performing the upstream requests providers ask for, with the one shared
//! HTTP client.
//!
//! The client never follows redirects (a redirect would carry the upstream
//! key to wherever it points) and uses a proxy only when the config names
//! one, never from the environment. Bodies are read up to a cap. A plugin
//! may only ask for `GET`s within its provider's [`Origin`]: one that
//! followed an upstream-supplied link would otherwise send the key anywhere.
//!
//! Two transports, one behaviour. Direct requests (no `upstream_proxy`, the
//! common case) are `wire`'s: HTTP/1.1 on the request's own task, over
//! rustls with the webpki roots for `https://`, and the CAs of
//! `upstream_ca_file` when the config names one. Its idle connections are
//! looked over every 15 seconds: those the upstream closed, or that
//! idled past a minute, are closed. Through a proxy (a hop of
//! its own, whose cost dwarfs a client's), reqwest does the proxying, as
//! it always has: absolute-form requests for `http://` upstreams, `CONNECT`
//! tunnels for `https://` ones, credentials from the proxy URL.

// Public, with `direct` and `request_head`, for `bench/floor`, which
// measures the stack with this client and none of the rest.
pub mod wire;

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Body;
use hyper::header::{HeaderName, HeaderValue, CONTENT_LENGTH, USER_AGENT};
use hyper::{Request, Response, Uri};
use plugin_api::{ErrorKind, ProviderError, UpstreamRequest, UpstreamResponse};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::config::{ConfigError, Context, RawServer, Secret};

/// Larger upstream bodies are refused as bad responses.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often idle upstream connections are looked over ([`wire::reap`]).
const REAP_EVERY: Duration = Duration::from_secs(15);
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
    target: wire::Target,
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
            target: wire::Target {
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
    target: &'o wire::Target,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot build the upstream HTTP client: {0}")]
    Proxied(#[from] reqwest::Error),
    #[error("cannot build the upstream HTTP client: {0}")]
    Tls(#[from] rustls::Error),
}

/// How requests reach the upstreams; see the module doc.
enum Transport {
    /// Shared with the task that prunes its idle connections.
    Direct(Arc<wire::Client>),
    /// With the runtime its connections run on: the one it was made on
    /// (the control runtime), not a serving thread's, whose connections a
    /// stuck plugin call would stall for every thread.
    Proxied(reqwest::Client, Option<tokio::runtime::Handle>),
}

/// The host's HTTP client for upstreams. A clone shares the connections
/// (and costs one reference count: each attempt holds one).
#[derive(Clone)]
pub struct UpstreamClient {
    transport: Arc<Transport>,
}

/// A response read in full.
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
        let transport = match proxy {
            None => {
                let client = Arc::new(direct(extra_roots)?);
                // Without a runtime (a unit test), nothing prunes: idle
                // connections are looked over when next used, as always.
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(wire::reap(Arc::downgrade(&client), REAP_EVERY));
                }
                Transport::Direct(client)
            }
            Some(proxy) => {
                let mut builder = reqwest::Client::builder()
                    .no_proxy()
                    .proxy(reqwest::Proxy::all(proxy.expose())?)
                    .redirect(reqwest::redirect::Policy::none())
                    .connect_timeout(CONNECT_TIMEOUT)
                    .pool_idle_timeout(POOL_IDLE_TIMEOUT);
                for root in extra_roots {
                    builder = builder.add_root_certificate(reqwest::Certificate::from_der(root)?);
                }
                Transport::Proxied(builder.build()?, tokio::runtime::Handle::try_current().ok())
            }
        };
        Ok(UpstreamClient {
            transport: Arc::new(transport),
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
        match &*self.transport {
            Transport::Direct(client) => {
                let head = request_head(&url.uri, request.headers())?;
                let answer =
                    client
                        .exchange(url.target, &head, max_body)
                        .await
                        .map_err(|e| match e {
                            wire::WireError::TooLarge(cap) => too_large(cap),
                            wire::WireError::Malformed(_) => {
                                ProviderError::bad_response(e.to_string())
                            }
                            e => transient("request failed", &e),
                        })?;
                Ok(Fetched {
                    status: answer.status,
                    header_lines: answer.header_lines,
                    body: answer.body,
                })
            }
            Transport::Proxied(client, runtime) => {
                let headers = checked_headers(request)?;
                let mut upstream = Request::get(url.uri)
                    .body(reqwest::Body::from(""))
                    .map_err(|_| {
                        ProviderError::bad_response("plugin asked for an invalid request")
                    })?;
                let map = upstream.headers_mut();
                map.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
                for (name, value) in headers {
                    map.append(name, value);
                }
                let upstream = reqwest::Request::try_from(upstream)
                    .map_err(|e| transient("request failed", &e.without_url()))?;
                let exchange = async {
                    // Said as through the proxy: the operator's to look at
                    // first, not the upstream's.
                    let response = client.execute(upstream).await.map_err(|e| {
                        transient(
                            "request through the upstream proxy failed",
                            &e.without_url(),
                        )
                    })?;
                    if response.status() == reqwest::StatusCode::PROXY_AUTHENTICATION_REQUIRED {
                        return Err(ProviderError::new(
                            plugin_api::ErrorKind::Transient,
                            "the upstream proxy refused its credentials (HTTP 407): check [server] upstream_proxy",
                        ));
                    }
                    // Its body errors would name the URL too.
                    let response =
                        Response::from(response).map(|body| body.map_err(|e| e.without_url()));
                    read_in_full(response, max_body).await
                };
                let _ = runtime;
                exchange.await
            }
        }
    }
}

/// The plugin's headers, each a valid name and value that is not
/// [reserved](plugin_api::upstream::RESERVED_HEADERS), for the proxied
/// transport.
fn checked_headers(
    request: &UpstreamRequest,
) -> Result<Vec<(HeaderName, HeaderValue)>, ProviderError> {
    request
        .headers()
        .iter()
        .map(|(name, value)| {
            check_header(name, value)?;
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                (Ok(name), Ok(value)) => Ok((name, value)),
                // What `check_header` let through, these take.
                _ => Err(ProviderError::bad_response(
                    "plugin asked for an invalid request header",
                )),
            }
        })
        .collect()
}

/// Refuses a header a plugin may not send (plugin-api's rule, which the
/// test kit applies too).
fn check_header(name: &str, value: &str) -> Result<(), ProviderError> {
    match plugin_api::upstream::header_refusal(name, value) {
        None => Ok(()),
        Some(reason) => Err(ProviderError::bad_response(reason)),
    }
}

/// A `GET` request head for `uri` (admitted: absolute, no userinfo) with
/// a plugin's `headers`, names in lower case; a header that is invalid,
/// or one the host sets itself, is refused.
pub fn request_head<N: AsRef<str>, V: AsRef<str>>(
    uri: &Uri,
    headers: &[(N, V)],
) -> Result<Vec<u8>, ProviderError> {
    let path = match uri.path() {
        "" => "/",
        path => path,
    };
    let (mark, query) = uri.query().map_or(("", ""), |query| ("?", query));
    let host = uri.authority().map_or("", |a| a.as_str());
    let mut head = Vec::with_capacity(128 + path.len() + query.len() + 64 * headers.len());
    for part in [
        "GET ",
        path,
        mark,
        query,
        " HTTP/1.1\r\nhost: ",
        host,
        "\r\nuser-agent: ",
        USER_AGENT_VALUE,
        "\r\n",
    ] {
        head.extend_from_slice(part.as_bytes());
    }
    for (name, value) in headers {
        let (name, value) = (name.as_ref(), value.as_ref());
        check_header(name, value)?;
        let start = head.len();
        head.extend_from_slice(name.as_bytes());
        head[start..].make_ascii_lowercase();
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    Ok(head)
}

/// The direct transport: `wire` over rustls (ring, webpki roots and
/// `extra_roots`), with the server's connect and idle timeouts.
pub fn direct(extra_roots: &[CertificateDer<'static>]) -> Result<wire::Client, ClientError> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    for root in extra_roots {
        roots.add(root.clone())?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(wire::Client::new(
        Arc::new(tls),
        CONNECT_TIMEOUT,
        POOL_IDLE_TIMEOUT,
    ))
}

/// Reads a proxied `response` whole, refusing a body over `max_body` bytes (by its
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
        if let Ok(value) = value.to_str() {
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
    fn a_request_head_always_has_a_path() {
        let head = |url: &str| {
            let uri: Uri = url.parse().unwrap();
            String::from_utf8(request_head::<&str, &str>(&uri, &[]).unwrap()).unwrap()
        };
        assert!(head("http://h?x=1").starts_with("GET /?x=1 HTTP/1.1\r\nhost: h\r\n"));
        assert!(head("http://h:8080").starts_with("GET / HTTP/1.1\r\nhost: h:8080\r\n"));
        assert!(head("http://h/a/b?c=d&e").starts_with("GET /a/b?c=d&e HTTP/1.1\r\n"));
        assert!(head("http://h/a").ends_with("\r\n\r\n"));
    }

    #[test]
    fn a_plugins_headers_are_written_in_lower_case_or_refused() {
        let uri: Uri = "http://h/p".parse().unwrap();
        let head = request_head(&uri, &[("X-Api-Key", "k\tv"), ("Accept", "*/*")]).unwrap();
        let head = String::from_utf8(head).unwrap();
        assert!(
            head.ends_with("\r\nx-api-key: k\tv\r\naccept: */*\r\n\r\n"),
            "{head}"
        );
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
            assert!(
                request_head(&uri, &[(name, value)]).is_err(),
                "{name}: {value:?}"
            );
            // The proxied transport refuses the same.
            let request = UpstreamRequest::get("http://h", "/p").header(name, value);
            assert!(checked_headers(&request).is_err(), "{name}: {value:?}");
        }
        // Non-ASCII text is a valid value (obs-text), as `HeaderValue` takes it.
        assert!(request_head(&uri, &[("x-name", "café")]).is_ok());
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
        assert_eq!(Origin::of("ftp://x/"), None);
        assert_eq!(Origin::of("http://"), None);
    }
}
