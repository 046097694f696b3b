//! Performing the upstream requests providers ask for, with the one shared
//! HTTP client.
//!
//! The client never follows redirects (a redirect would carry the upstream
//! key to wherever it points) and uses a proxy only when the config names
//! one, never from the environment. Bodies are read up to a cap. A plugin
//! may only ask for `GET`s within its provider's [`Origin`]: one that
//! followed an upstream-supplied link would otherwise send the key anywhere.
//!
//! HTTP/1.1 through hyper's connection API, over rustls with the webpki
//! roots (and the CAs of `upstream_ca_file`) for `https://`. Each exchange
//! polls its connection on the request's own task, from sending to the
//! body's end, then leaves it in a small pool per target: a client whose
//! connections run on tasks of their own hands every answer across tasks,
//! and on the multi-threaded runtime across threads (see
//! docs/performance.md). Through `upstream_proxy`, `http://` upstreams get
//! absolute-form requests and `https://` ones `CONNECT` tunnels, with
//! credentials from the proxy URL.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt::Write as _;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper::header::{
    HeaderName, HeaderValue, CONTENT_LENGTH, HOST, PROXY_AUTHORIZATION, USER_AGENT,
};
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use plugin_api::{ErrorKind, ProviderError, UpstreamRequest, UpstreamResponse};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::settings::{ConfigError, Context, RawServer, Secret};
use crate::sync::lock;

/// Larger upstream bodies are refused as bad responses.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle connections kept per target, at most.
const MAX_IDLE_PER_TARGET: usize = 1024;
/// How often idle connections are looked over.
const REAP_EVERY: Duration = Duration::from_secs(15);
/// The longest answer head a proxy may give to `CONNECT`.
const MAX_TUNNEL_HEAD: usize = 8 * 1024;
const USER_AGENT_VALUE: &str = concat!("socialgate/", env!("CARGO_PKG_VERSION"));

/// `[server] upstream_proxy`: `http://` or `https://` only, since the client
/// speaks no SOCKS, and a URL the client can use (checked
/// here as the client will read it, so `check` refuses what `serve` could
/// not start with). Never echoed: it may carry credentials.
pub fn proxy_from_raw(raw: &RawServer, cx: &Context) -> Result<Option<Secret>, ConfigError> {
    const FIELD: &str = "[server] upstream_proxy";
    let Some(proxy) = &raw.upstream_proxy else {
        return Ok(None);
    };
    if !(proxy.starts_with("http://") || proxy.starts_with("https://")) {
        return Err(cx.invalid(FIELD, "not an http:// or https:// URL"));
    }
    let url = match url::Url::parse(proxy) {
        Ok(url) if Proxy::of(proxy).is_some() => url,
        _ => {
            return Err(cx.invalid(
                FIELD,
                "does not parse as a URL (is its host or port valid?)",
            ))
        }
    };
    // A path, query or fragment would be dropped: what was meant?
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(cx.invalid(
            FIELD,
            "has a path, query or fragment; a proxy is scheme://[user:password@]host:port",
        ));
    }
    // Port 0 only means "any" when binding: no proxy listens there.
    if url.port() == Some(0) {
        return Err(cx.invalid(FIELD, "has port 0, where no proxy can listen"));
    }
    Ok(Some(Secret::new(proxy.clone())))
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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
    /// The request for this URL: origin-form, or absolute-form when it goes
    /// to `proxy` in the clear. Host and URI are the origin's spelling.
    fn request(self, proxy: Option<&Proxy>) -> Result<Request<Empty<Bytes>>, ProviderError> {
        let target = self.target;
        let default_port = if target.https { 443 } else { 80 };
        let host = match target.port == default_port {
            true => target.host.clone(),
            false => format!("{}:{}", target.host, target.port),
        };
        let path = self.uri.path_and_query().map_or("/", |p| p.as_str());
        let uri = match proxy {
            Some(_) if !target.https => Uri::try_from(format!("http://{host}{path}")),
            _ => Uri::try_from(path),
        };
        let mut request = Request::new(Empty::new());
        *request.uri_mut() = uri.map_err(|_| outside())?;
        let headers = request.headers_mut();
        headers.insert(HOST, HeaderValue::try_from(host).map_err(|_| outside())?);
        headers.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        if let Some(Proxy {
            authorization: Some(credentials),
            ..
        }) = proxy.filter(|_| !target.https)
        {
            headers.insert(PROXY_AUTHORIZATION, credentials.clone());
        }
        Ok(request)
    }
}

fn outside() -> ProviderError {
    ProviderError::bad_response(
        "plugin asked for a URL outside its provider's base_url origin; refused",
    )
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot build the upstream HTTP client: {0}")]
    Tls(#[from] rustls::Error),
    #[error("cannot build the upstream HTTP client: [server] upstream_proxy is not a proxy URL")]
    Proxy,
}

/// The host's HTTP client for upstreams. A clone shares the connections
/// (and costs one reference count: each attempt holds one).
#[derive(Clone)]
pub struct UpstreamClient {
    inner: Arc<Inner>,
}

struct Inner {
    /// Idle connections by target, oldest first.
    idle: Mutex<HashMap<Target, Vec<Link>>>,
    tls: TlsConnector,
    /// `[server] upstream_proxy`, whose failures are then said to be the
    /// proxy's.
    proxy: Option<Proxy>,
}

/// `[server] upstream_proxy`, parsed.
struct Proxy {
    target: Target,
    /// `Basic` credentials from the URL's userinfo.
    authorization: Option<HeaderValue>,
}

/// Any byte stream a connection runs over: TCP, TLS, TLS in a tunnel.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// Boxed: a request's future holds its connection while it is in flight and
/// the pool holds it between requests; boxed, it stays put instead of being
/// copied in and out of the pool at every request.
type Connection = Box<http1::Connection<TokioIo<Box<dyn Stream>>, Empty<Bytes>>>;

/// One HTTP/1.1 connection: its sender, and the connection future that the
/// task using it polls.
struct Link {
    sender: http1::SendRequest<Empty<Bytes>>,
    connection: Connection,
    since: Instant,
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
        let proxy = match proxy {
            Some(url) => Some(Proxy::of(url.expose()).ok_or(ClientError::Proxy)?),
            None => None,
        };
        let inner = Arc::new(Inner {
            idle: Mutex::default(),
            tls: TlsConnector::from(Arc::new(tls)),
            proxy,
        });
        // Without a runtime (a unit test), idle connections are only looked
        // over when next used.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(reap(Arc::downgrade(&inner)));
        }
        Ok(UpstreamClient { inner })
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
        let inner = &*self.inner;
        let target = url.target;
        let mut upstream = url.request(inner.proxy.as_ref())?;
        let headers = upstream.headers_mut();
        for (name, value) in checked_headers(request)? {
            headers.append(name, value);
        }
        let mut pooled = true;
        let (sender, mut connection, response) = loop {
            let link = match pooled.then(|| inner.checkout(target)).flatten() {
                Some(link) => link,
                None => {
                    pooled = false;
                    // Boxed: opening a connection (DNS, TCP, TLS, a proxy's
                    // tunnel) holds far more state than a pooled exchange,
                    // and unboxed every request's future would carry room
                    // for it.
                    Box::pin(inner.connect(target)).await?
                }
            };
            let (mut sender, mut connection) = (link.sender, Some(link.connection));
            let sent = driving(&mut connection, sender.try_send_request(upstream)).await;
            match sent {
                Ok(response) => break (sender, connection, response),
                // Closed while idle, before taking the request: once more,
                // on a new connection.
                Err(mut e) => match e.take_message() {
                    Some(unsent) if pooled => {
                        upstream = unsent;
                        pooled = false;
                    }
                    _ => return Err(inner.failed(&e.into_error())),
                },
            }
        };
        if inner.proxy.is_some() && response.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
            return Err(proxy_refused());
        }
        let fetched = read_in_full(response, max_body, &mut connection).await?;
        // One more turn lets the connection take up its next request.
        let alive = poll_fn(|cx| {
            Poll::Ready(
                connection
                    .as_mut()
                    .is_some_and(|c| Pin::new(c).poll(cx).is_pending()),
            )
        })
        .await;
        if let Some(connection) = connection.filter(|_| alive && sender.is_ready()) {
            inner.checkin(
                target,
                Link {
                    sender,
                    connection,
                    since: Instant::now(),
                },
            );
        }
        Ok(fetched)
    }
}

/// Awaits `future` while polling `connection` on the same task, so an
/// exchange takes no hand-over between tasks (hyper's pooled client drives
/// each connection from a task of its own). A connection that ends is
/// dropped, which fails a request it had not answered.
async fn driving<F: Future>(connection: &mut Option<Connection>, future: F) -> F::Output {
    let mut future = pin!(future);
    poll_fn(|cx| {
        if connection
            .as_mut()
            .is_some_and(|c| Pin::new(c).poll(cx).is_ready())
        {
            *connection = None;
        }
        future.as_mut().poll(cx)
    })
    .await
}

impl Inner {
    /// The newest idle connection to `target`, if one is fresh.
    fn checkout(&self, target: &Target) -> Option<Link> {
        let mut idle = lock(&self.idle);
        let links = idle.get_mut(target)?;
        let link = links.pop()?;
        if link.since.elapsed() < POOL_IDLE_TIMEOUT && link.sender.is_ready() {
            return Some(link);
        }
        // The newest is stale: so are the older ones.
        let stale = std::mem::take(links);
        drop(idle);
        drop(stale);
        None
    }

    fn checkin(&self, target: &Target, link: Link) {
        let mut idle = lock(&self.idle);
        let links = idle.entry(target.clone()).or_default();
        if links.len() < MAX_IDLE_PER_TARGET {
            links.push(link);
        }
    }

    /// Drops the connections idle past the timeout.
    fn prune(&self) {
        let mut idle = lock(&self.idle);
        idle.retain(|_, links| {
            links.retain(|link| link.since.elapsed() < POOL_IDLE_TIMEOUT);
            !links.is_empty()
        });
    }

    /// A new connection to `target`, through the proxy if there is one.
    async fn connect(&self, target: &Target) -> Result<Link, ProviderError> {
        match tokio::time::timeout(CONNECT_TIMEOUT, self.open(target)).await {
            Ok(Ok(link)) => Ok(link),
            Ok(Err(Failure::ProxyRefused)) => Err(proxy_refused()),
            Ok(Err(e)) => Err(self.failed(&e)),
            Err(_) => Err(self.failed(&Failure::TimedOut)),
        }
    }

    async fn open(&self, target: &Target) -> Result<Link, Failure> {
        let hop = self.proxy.as_ref().map_or(target, |proxy| &proxy.target);
        let mut stream = self.stream_to(hop).await?;
        if let Some(proxy) = self.proxy.as_ref().filter(|_| target.https) {
            tunnel(&mut stream, target, proxy).await?;
            stream = Box::new(self.tls(target, stream).await?);
        }
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(Failure::Http)?;
        Ok(Link {
            sender,
            connection: Box::new(connection),
            since: Instant::now(),
        })
    }

    /// TCP to `hop`, with TLS when it is `https://`.
    async fn stream_to(&self, hop: &Target) -> Result<Box<dyn Stream>, Failure> {
        let mut last = None;
        for address in tokio::net::lookup_host((bare(&hop.host), hop.port))
            .await
            .map_err(Failure::Resolve)?
        {
            match TcpStream::connect(address).await {
                Ok(tcp) => {
                    tcp.set_nodelay(true).map_err(Failure::Connect)?;
                    return Ok(match hop.https {
                        true => Box::new(self.tls(hop, tcp).await?),
                        false => Box::new(tcp),
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(Failure::Connect(last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "no address")
        })))
    }

    async fn tls<S: Stream>(
        &self,
        to: &Target,
        stream: S,
    ) -> Result<tokio_rustls::client::TlsStream<S>, Failure> {
        let name = ServerName::try_from(bare(&to.host).to_owned())
            .map_err(|e| Failure::Tls(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        self.tls.connect(name, stream).await.map_err(Failure::Tls)
    }

    /// A transport failure, said as through the proxy when there is one:
    /// the operator's to look at first, not the upstream's.
    fn failed(&self, error: &(dyn StdError + 'static)) -> ProviderError {
        let what = match self.proxy {
            Some(_) => "request through the upstream proxy failed",
            None => "request failed",
        };
        transient(what, error)
    }
}

/// A host as name resolution and TLS take it: an IPv6 address unbracketed.
fn bare(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Asks the proxy for a tunnel to `target` over `stream`.
async fn tunnel(
    stream: &mut Box<dyn Stream>,
    target: &Target,
    proxy: &Proxy,
) -> Result<(), Failure> {
    let authority = format!("{}:{}", target.host, target.port);
    let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n").into_bytes();
    if let Some(credentials) = &proxy.authorization {
        head.extend_from_slice(b"Proxy-Authorization: ");
        head.extend_from_slice(credentials.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    stream.write_all(&head).await.map_err(Failure::Tunnel)?;
    stream.flush().await.map_err(Failure::Tunnel)?;
    // The answer's head; nothing follows a 200 until the TLS handshake.
    let mut answer = Vec::with_capacity(128);
    let mut chunk = [0; 512];
    while !answer.ends_with(b"\r\n\r\n") {
        if answer.len() > MAX_TUNNEL_HEAD {
            return Err(Failure::TunnelAnswer);
        }
        match stream.read(&mut chunk).await.map_err(Failure::Tunnel)? {
            0 => return Err(Failure::TunnelAnswer),
            n => answer.extend_from_slice(&chunk[..n]),
        }
    }
    let status = answer
        .strip_prefix(b"HTTP/1.")
        .and_then(|rest| std::str::from_utf8(rest.get(2..5)?).ok()?.parse().ok());
    match status {
        Some(200) => Ok(()),
        Some(407) => Err(Failure::ProxyRefused),
        Some(status) => Err(Failure::TunnelRefused(status)),
        None => Err(Failure::TunnelAnswer),
    }
}

/// Drops idle connections past their time, every [`REAP_EVERY`], while the
/// client lives.
async fn reap(client: Weak<Inner>) {
    let mut ticks = tokio::time::interval(REAP_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(client) = client.upgrade() else {
            return;
        };
        client.prune();
    }
}

impl Proxy {
    /// An `http://` or `https://` proxy URL with a host, and nothing but
    /// userinfo and a port besides.
    fn of(url: &str) -> Option<Proxy> {
        let url = url::Url::parse(url).ok()?;
        let https = match url.scheme() {
            "http" => false,
            "https" => true,
            _ => return None,
        };
        let decode = |s| percent_encoding::percent_decode_str(s).decode_utf8_lossy();
        let authorization = match (url.username(), url.password()) {
            ("", None) => None,
            (user, password) => {
                let pair = format!("{}:{}", decode(user), decode(password.unwrap_or("")));
                let mut value = HeaderValue::try_from(format!("Basic {}", BASE64.encode(pair)))
                    .expect("base64 is a header value");
                value.set_sensitive(true);
                Some(value)
            }
        };
        Some(Proxy {
            target: Target {
                https,
                host: url.host()?.to_string(),
                port: url.port_or_known_default()?,
            },
            authorization,
        })
    }
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("connecting timed out")]
    TimedOut,
    #[error("cannot resolve the host")]
    Resolve(#[source] io::Error),
    #[error("cannot connect")]
    Connect(#[source] io::Error),
    #[error("TLS handshake failed")]
    Tls(#[source] io::Error),
    #[error("CONNECT through the proxy failed")]
    Tunnel(#[source] io::Error),
    #[error("the proxy's answer to CONNECT is not an HTTP/1 head")]
    TunnelAnswer,
    #[error("the proxy refused the tunnel (HTTP {0})")]
    TunnelRefused(u16),
    #[error("the proxy refused its credentials")]
    ProxyRefused,
    #[error("HTTP handshake failed")]
    Http(#[source] hyper::Error),
}

fn proxy_refused() -> ProviderError {
    ProviderError::new(
        ErrorKind::Transient,
        "the upstream proxy refused its credentials (HTTP 407): check [server] upstream_proxy",
    )
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

/// Reads `response` whole while driving its `connection`, refusing a body
/// over `max_body` bytes (by its `Content-Length` before reading, or as it
/// arrives).
async fn read_in_full(
    response: Response<Incoming>,
    max_body: usize,
    connection: &mut Option<Connection>,
) -> Result<Fetched, ProviderError> {
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
    let mut body = body;
    while let Some(frame) = driving(connection, body.frame()).await {
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
/// URL or a header).
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
        let request = upper.request(None).unwrap();
        assert_eq!(request.uri(), "/x");
        assert_eq!(request.headers()[HOST], "api.example.test");
        assert_eq!(Origin::of("ftp://x/"), None);
        assert_eq!(Origin::of("http://"), None);
    }
}

#[cfg(test)]
mod exchange_tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A connection is kept for the next request; one the upstream closed
    /// while idle is replaced without failing the request.
    #[tokio::test]
    async fn connections_are_reused_and_a_closed_idle_one_is_replaced() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut tcp, _) = listener.accept().await.unwrap();
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    // Two answers, then closed while idle.
                    for _ in 0..2 {
                        let mut head = Vec::new();
                        let mut chunk = [0; 1024];
                        while !head.ends_with(b"\r\n\r\n") {
                            match tcp.read(&mut chunk).await.unwrap() {
                                0 => return,
                                n => head.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        tcp.write_all(answer).await.unwrap();
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                });
            }
        });
        let origin = Origin::of(&base).unwrap();
        let client = UpstreamClient::new(None, &[]).unwrap();
        for _ in 0..3 {
            let request = UpstreamRequest::get(&base, "/p");
            let url = origin.admit("GET", &format!("{base}/p")).unwrap();
            let fetched = client.fetch(url, &request, 1024).await.unwrap();
            assert_eq!((fetched.status, &fetched.body[..]), (200, &b"ok"[..]));
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
