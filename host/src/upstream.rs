//! Performing the upstream requests providers ask for, with the one shared
//! HTTP client.
//!
//! The client never follows redirects (a redirect would carry the upstream
//! key to wherever it points) and uses a proxy only when the config names
//! one, never from the environment. Bodies are read up to a cap. A plugin
//! may only ask for `GET`s within its provider's [`Origin`]: one that
//! followed an upstream-supplied link would otherwise send the key anywhere.

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

/// Where a provider's requests may go: its `base_url`'s scheme, host and
/// port, compared as the HTTP client will resolve them. Holds no userinfo
/// or path, so it prints without credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin(url::Origin);

impl Origin {
    /// The origin of an `http://` or `https://` base URL; `None` for
    /// anything else.
    pub fn of(base_url: &str) -> Option<Origin> {
        let url = reqwest::Url::parse(base_url).ok()?;
        (matches!(url.scheme(), "http" | "https") && url.has_host()).then(|| Origin(url.origin()))
    }

    /// Refuses a request the provider may not make: any method but `GET`, or
    /// a URL outside this origin. The message quotes neither, since a URL may
    /// carry the key. An admitted URL comes back parsed, for
    /// [`UpstreamClient::fetch`]: it is parsed once.
    pub fn admit(&self, method: &str, url: &str) -> Result<Admitted, ProviderError> {
        if method != "GET" {
            return Err(ProviderError::bad_response(
                "plugin asked for a request that is not a GET; refused",
            ));
        }
        match reqwest::Url::parse(url) {
            Ok(url) if url.origin() == self.0 => Ok(Admitted(url)),
            _ => Err(ProviderError::bad_response(
                "plugin asked for a URL outside its provider's base_url origin; refused",
            )),
        }
    }
}

/// A URL [`Origin::admit`] let through.
#[derive(Debug)]
pub struct Admitted(reqwest::Url);

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

    /// Performs `request`, at the URL its provider's origin admitted.
    /// Transport failures are transient; a body over `max_body` bytes is a
    /// bad response. Errors never carry the request headers.
    pub async fn fetch(
        &self,
        url: Admitted,
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
        let mut builder = self.client.request(method, url.0);
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(Origin::of("ftp://x/"), None);
        assert_eq!(Origin::of("http://"), None);
    }
}
