//! `[platforms.NAME]` and `[providers.NAME]`: which providers serve which
//! platform, in which order, and how each provider is reached. Part of the
//! serving configuration: every reload applies them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use platform_description::Description;
use plugin_api::Endpoint;
use serde::Deserialize;

use crate::resilience::breaker::BreakerConfig;
use crate::settings::{ConfigError, Context, Secret};
use crate::upstream::Origin;

/// Default `timeout_ms` of a provider.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(4000);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlatformStatus {
    Live,
    Planned,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformConfig {
    pub status: PlatformStatus,
    /// Failover order for every endpoint...
    pub providers: Vec<String>,
    /// ...unless an endpoint has its own.
    pub endpoints: BTreeMap<Endpoint, Vec<String>>,
    /// `description`, loaded: what the platform's endpoints are, what
    /// they read and answer. Always there for a live platform.
    pub description: Option<PlatformDescription>,
}

/// A platform's description file, read and checked.
#[derive(Debug, Clone)]
pub struct PlatformDescription {
    /// The file, resolved against the config's folder.
    pub path: PathBuf,
    /// Its text as read: two loads are the same when path and text are.
    text: Arc<str>,
    pub description: Arc<Description>,
}

impl PartialEq for PlatformDescription {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && self.text == other.text
    }
}

impl Eq for PlatformDescription {}

impl PlatformDescription {
    /// Reads and checks the file `path` names for platform `name`; a
    /// refusal gives the file, the place and the reason.
    fn load(
        name: &str,
        path: &Path,
        key: &str,
        cx: &Context,
    ) -> Result<PlatformDescription, ConfigError> {
        let path = cx.resolve(path);
        let text = std::fs::read_to_string(&path).map_err(|source| {
            let unreadable = platform_description::LoadError::Unreadable {
                file: path.clone(),
                source,
            };
            cx.invalid(key, unreadable)
        })?;
        let description =
            Description::parse(&text, &path, name).map_err(|refused| cx.invalid(key, refused))?;
        Ok(PlatformDescription {
            path,
            text: text.into(),
            description: Arc::new(description),
        })
    }
}

impl PlatformConfig {
    /// The configured failover order for `endpoint`.
    pub fn order(&self, endpoint: Endpoint) -> &[String] {
        self.endpoints.get(&endpoint).unwrap_or(&self.providers)
    }
}

#[derive(Clone, PartialEq)]
pub struct ProviderConfig {
    /// The plugin library file.
    pub library: PathBuf,
    pub base_url: String,
    /// Where the plugin's requests may go: `base_url`'s origin.
    pub origin: Origin,
    pub api_key: Secret,
    /// Bounds the provider's whole attempt, all its steps together.
    pub timeout: Duration,
    /// `[providers.NAME.settings]`, passed to the plugin as-is.
    pub settings: serde_json::Value,
    pub breaker: BreakerConfig,
    /// Larger upstream bodies are bad responses.
    pub max_body_bytes: usize,
    /// Upstream requests in flight at once; past it the provider is busy.
    pub max_in_flight: usize,
}

/// The base URL may carry credentials: print it redacted.
impl fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("library", &self.library)
            .field("base_url", &crate::redact::url(&self.base_url))
            .field("api_key", &self.api_key)
            .field("timeout", &self.timeout)
            .field("settings", &self.settings)
            .field("breaker", &self.breaker)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_in_flight", &self.max_in_flight)
            .finish()
    }
}

/// `[platforms.NAME]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [platforms.NAME] table")]
pub struct RawPlatform {
    status: PlatformStatus,
    #[serde(default)]
    providers: Vec<String>,
    #[serde(default)]
    endpoints: BTreeMap<Endpoint, Vec<String>>,
    description: Option<PathBuf>,
}

/// `[providers.NAME]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [providers.NAME] table")]
pub struct RawProvider {
    library: String,
    base_url: String,
    api_key_env: String,
    timeout_ms: Option<u64>,
    breaker_failures: Option<u32>,
    breaker_cooldown_ms: Option<u64>,
    max_body_bytes: Option<usize>,
    max_in_flight: Option<usize>,
    #[serde(default)]
    settings: Option<toml::Table>,
}

impl PlatformConfig {
    /// Validates `[platforms.NAME]` against the configured `providers`.
    pub fn from_raw(
        name: &str,
        raw: RawPlatform,
        providers: &BTreeMap<String, ProviderConfig>,
        cx: &Context,
    ) -> Result<PlatformConfig, ConfigError> {
        let table = format!("[platforms.{name}]");
        if !valid_segment(name) {
            return Err(cx.invalid(&table, "a platform name is 1-64 of a-z, 0-9, `-` and `_`"));
        }
        let orders = std::iter::once(("providers".to_owned(), &raw.providers)).chain(
            raw.endpoints
                .iter()
                .map(|(e, list)| (format!("endpoints.{e}"), list)),
        );
        for (key, list) in orders {
            let at = format!("{table} {key}");
            for provider in list {
                if !providers.contains_key(provider) {
                    return Err(cx.invalid(&at, format!("unknown provider `{provider}`")));
                }
            }
            if let Some((_, dup)) = list
                .iter()
                .enumerate()
                .find(|(i, p)| list[..*i].contains(p))
            {
                return Err(cx.invalid(&at, format!("provider `{dup}` is listed twice")));
            }
        }
        if raw.status == PlatformStatus::Live
            && raw.providers.is_empty()
            && raw.endpoints.is_empty()
        {
            return Err(cx.invalid(&table, "a live platform needs at least one provider"));
        }
        // A planned platform may name its file ahead; a live one must, as
        // nothing else says what its endpoints are.
        let description = match &raw.description {
            Some(path) => Some(PlatformDescription::load(
                name,
                path,
                &format!("{table} description"),
                cx,
            )?),
            None if raw.status == PlatformStatus::Live => {
                return Err(cx.invalid(
                    &table,
                    "a live platform needs `description = \"FILE.toml\"`, the file describing \
                     its endpoints, parameters and answers (docs/platforms.md)",
                ));
            }
            None => None,
        };
        if let Some(described) = &description {
            let file = described.path.display();
            for endpoint in raw.endpoints.keys() {
                if described.description.endpoint(endpoint.as_str()).is_none() {
                    return Err(cx.invalid(
                        &format!("{table} endpoints.{endpoint}"),
                        format!("the platform's description ({file}) has no endpoint `{endpoint}`"),
                    ));
                }
            }
        }
        Ok(PlatformConfig {
            status: raw.status,
            providers: raw.providers,
            endpoints: raw.endpoints,
            description,
        })
    }
}

impl ProviderConfig {
    /// Validates `[providers.NAME]`; bare library names are looked up in
    /// `plugin_dir`.
    pub fn from_raw(
        name: &str,
        raw: RawProvider,
        plugin_dir: &Path,
        cx: &Context,
    ) -> Result<ProviderConfig, ConfigError> {
        let table = format!("[providers.{name}]");
        let at = |key: &str| format!("{table} {key}");
        // Provider names travel in cursors and metric labels: keep them
        // short and plain.
        if !valid_segment(name) {
            return Err(cx.invalid(&table, "a provider name is 1-64 of a-z, 0-9, `-` and `_`"));
        }
        // Not echoed: a base URL may carry credentials.
        let Some(origin) = Origin::of(&raw.base_url) else {
            return Err(cx.invalid(
                &at("base_url"),
                "not an http:// or https:// URL with a valid host and port",
            ));
        };
        if raw.library.trim().is_empty() {
            return Err(cx.invalid(
                &at("library"),
                "is empty; name the plugin library (`shortvideo_primary`, or a path)",
            ));
        }
        if let Some(part) = unusable_part(&raw.base_url) {
            return Err(cx.invalid(
                &at("base_url"),
                format!(
                    "has {part}; a base URL is scheme://host[:port][/path], \
                     which plugins append their paths and queries to"
                ),
            ));
        }
        let api_key = cx.secret(&at("api_key_env"), &raw.api_key_env)?;
        let timeout = cx.millis(&at("timeout_ms"), raw.timeout_ms, DEFAULT_TIMEOUT)?;
        let settings = match raw.settings {
            None => serde_json::Value::Object(Default::default()),
            Some(table) => {
                serde_json::to_value(table).map_err(|e| cx.invalid(&at("settings"), e))?
            }
        };
        Ok(ProviderConfig {
            library: crate::plugins::library_path(&raw.library, plugin_dir, cx.base()),
            base_url: raw.base_url,
            origin,
            api_key,
            timeout,
            settings,
            breaker: BreakerConfig::from_raw(
                raw.breaker_failures,
                raw.breaker_cooldown_ms,
                &table,
                cx,
            )?,
            max_body_bytes: cx.positive(
                &at("max_body_bytes"),
                raw.max_body_bytes,
                crate::upstream::DEFAULT_MAX_BODY_BYTES,
            )?,
            max_in_flight: cx.positive(
                &at("max_in_flight"),
                raw.max_in_flight,
                crate::resilience::concurrency::DEFAULT_MAX_IN_FLIGHT,
            )?,
        })
    }
}

/// A part of `base_url` no request can be built on: userinfo (requests
/// would go out without it, and the origin check refuses them), a query or
/// a fragment (a plugin's path lands after them, and goes nowhere), or port
/// 0 (nothing listens there).
fn unusable_part(base_url: &str) -> Option<&'static str> {
    let url = url::Url::parse(base_url).ok()?;
    if !url.username().is_empty() || url.password().is_some() {
        Some("a user or password")
    } else if url.query().is_some() {
        Some("a query")
    } else if url.fragment().is_some() {
        Some("a fragment")
    } else if url.port() == Some(0) {
        // Port 0 only means "any" when binding: nothing can be reached there.
        Some("port 0")
    } else {
        None
    }
}

/// Path segments we route on: lowercase, so `/v1/{platform}` is unambiguous.
fn valid_segment(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}
