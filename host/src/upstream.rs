//! Performing the upstream requests providers ask for, with the one shared
//! HTTP client.
//!
//! The client never follows redirects (a redirect would carry the upstream
//! key to wherever it points) and uses a proxy only when the config names
//! one, never from the environment. Bodies are read up to a cap.

use std::time::Duration;

use plugin_api::{ErrorKind, ProviderError, UpstreamRequest, UpstreamResponse};

use crate::config::{ConfigError, Context, RawServer, Secret};

/// Larger upstream bodies are refused as bad responses.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// `[server] upstream_proxy`: `http://` or `https://` only, since the client
/// is built without SOCKS support. Never echoed: it may carry credentials.
pub fn proxy_from_raw(raw: &RawServer, cx: &Context) -> Result<Option<Secret>, ConfigError> {
    match &raw.upstream_proxy {
        None => Ok(None),
        Some(proxy) if proxy.starts_with("http://") || proxy.starts_with("https://") => {
            Ok(Some(Secret::new(proxy.clone())))
        }
        Some(_) => Err(cx.invalid("[server] upstream_proxy", "not an http:// or https:// URL")),
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot build the upstream HTTP client: {0}")]
pub struct ClientError(#[from] reqwest::Error);

/// The host's HTTP client for upstreams.
#[derive(Clone)]
pub struct UpstreamClient {
    client: reqwest::Client,
}

/// A response read in full.
pub struct Fetched {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Fetched {
    pub fn as_response(&self) -> UpstreamResponse<'_> {
        UpstreamResponse::new(self.status, &self.headers, &self.body)
    }
}

impl UpstreamClient {
    pub fn new(proxy: Option<&Secret>) -> Result<UpstreamClient, ClientError> {
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(60))
            .user_agent(concat!("socialgate/", env!("CARGO_PKG_VERSION")));
        if let Some(proxy) = proxy {
            builder = builder.proxy(reqwest::Proxy::all(proxy.expose())?);
        }
        Ok(UpstreamClient {
            client: builder.build()?,
        })
    }

    /// Performs `request`. Transport failures are transient; a body over
    /// `max_body` bytes is a bad response. Errors never carry the request
    /// headers.
    pub async fn fetch(
        &self,
        request: &UpstreamRequest,
        max_body: usize,
    ) -> Result<Fetched, ProviderError> {
        let transient = |what: &str, e: reqwest::Error| {
            // Without the URL: it is logged once by the caller, and the
            // error's source chain may say more than we want repeated.
            ProviderError::new(ErrorKind::Transient, format!("{what}: {}", e.without_url()))
        };
        let method = reqwest::Method::from_bytes(request.method().as_bytes())
            .map_err(|_| ProviderError::bad_response("plugin asked for an invalid HTTP method"))?;
        let mut builder = self.client.request(method, request.url());
        for (name, value) in request.headers() {
            builder = builder.header(name, value);
        }
        let mut response = builder
            .send()
            .await
            .map_err(|e| transient("request failed", e))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        if response
            .content_length()
            .is_some_and(|len| len > max_body as u64)
        {
            return Err(too_large(max_body));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| transient("reading the body failed", e))?
        {
            if body.len() + chunk.len() > max_body {
                return Err(too_large(max_body));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Fetched {
            status,
            headers,
            body,
        })
    }
}

fn too_large(cap: usize) -> ProviderError {
    ProviderError::bad_response(format!("body larger than {cap} bytes"))
}
