//! The operator's configuration (`platforms.toml`): reading it, resolving
//! its paths and secrets, and refusing anything doubtful with one line that
//! names the file and the reason.
//!
//! Relative paths resolve against the config file's folder, so a config
//! means the same thing whatever the working directory.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plugin_api::Endpoint;
use serde::Deserialize;

use crate::billing::BillingConfig;
use crate::resilience::breaker::BreakerConfig;
use crate::resilience::rate_limit::RateLimitConfig;

/// Why a configuration was refused. `Display` is one line naming the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Syntax {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// A secret read from the environment. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A validated configuration with every path resolved and every secret read.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from (or a made-up name for the demo).
    pub path: PathBuf,
    pub server: ServerConfig,
    pub platforms: BTreeMap<String, PlatformConfig>,
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Per-key request rate; `None`: no limit.
    pub rate_limit: Option<RateLimitConfig>,
    /// The usage ledger's SQLite file.
    pub ledger_path: PathBuf,
    pub billing: BillingConfig,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub keys_file: PathBuf,
    pub plugin_dir: PathBuf,
    /// Where private copies of plugin libraries are kept.
    pub state_dir: PathBuf,
    /// Key for sealing cursors; `None`: a random key per process.
    pub cursor_key: Option<Secret>,
    /// The only proxy upstream requests may use; never taken from the
    /// environment. A secret: it may carry credentials.
    pub upstream_proxy: Option<Secret>,
    pub limits: ServerLimits,
    /// The operators' listener (metrics); `None` when set to `"off"`.
    pub admin_listen: Option<SocketAddr>,
    pub log_format: LogFormat,
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One readable line per event.
    #[default]
    Human,
    /// One JSON object per line, for log collectors.
    Json,
}

/// How the server protects itself from slow, large or too many requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// All attempts of one request together.
    pub request_timeout: Duration,
    /// A client must send its whole request head within this.
    pub header_timeout: Duration,
    pub max_header_bytes: usize,
    /// Past this many requests in flight, answer 503 at once.
    pub max_concurrent_requests: usize,
    /// How long requests in flight may finish after a shutdown signal.
    pub shutdown_grace: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            request_timeout: crate::resilience::deadline::DEFAULT_REQUEST_TIMEOUT,
            header_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            max_concurrent_requests: crate::resilience::concurrency::DEFAULT_MAX_CONCURRENT,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlatformStatus {
    Live,
    Planned,
}

#[derive(Debug, Clone)]
pub struct PlatformConfig {
    pub status: PlatformStatus,
    /// Failover order for every endpoint...
    pub providers: Vec<String>,
    /// ...unless an endpoint has its own.
    pub endpoints: BTreeMap<Endpoint, Vec<String>>,
}

impl PlatformConfig {
    /// The configured failover order for `endpoint`.
    pub fn order(&self, endpoint: Endpoint) -> &[String] {
        self.endpoints.get(&endpoint).unwrap_or(&self.providers)
    }
}

#[derive(Clone)]
pub struct ProviderConfig {
    /// The plugin library file.
    pub library: PathBuf,
    pub base_url: String,
    pub api_key: Secret,
    /// Bounds the provider's whole attempt, all its steps together.
    pub timeout: Duration,
    /// `[providers.NAME.settings]`, passed to the plugin as-is.
    pub settings: serde_json::Value,
    pub breaker: BreakerConfig,
    /// Larger upstream bodies are bad responses.
    pub max_body_bytes: usize,
}

/// The base URL may carry credentials: print it redacted.
impl fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("library", &self.library)
            .field("base_url", &redacted_url(&self.base_url))
            .field("api_key", &self.api_key)
            .field("timeout", &self.timeout)
            .field("settings", &self.settings)
            .field("breaker", &self.breaker)
            .field("max_body_bytes", &self.max_body_bytes)
            .finish()
    }
}

/// A URL without what may be secret in it (user info, query), for logs.
pub fn redacted_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let query = if url.contains('?') { "?…" } else { "" };
    format!("{scheme}://{host}{path}{query}")
}

/// Default file names, beside the config.
pub const DEFAULT_KEYS_FILE: &str = "keys.toml";
pub const DEFAULT_LEDGER_FILE: &str = "usage.db";

const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9464";
const DEFAULT_TIMEOUT_MS: u64 = 4000;

// The file as written. Every table refuses unknown keys.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    platforms: BTreeMap<String, RawPlatform>,
    #[serde(default)]
    providers: BTreeMap<String, RawProvider>,
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    ledger: RawLedger,
    #[serde(default)]
    billing: BillingConfig,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLedger {
    path: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    per_second: f64,
    burst: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    keys_file: Option<PathBuf>,
    plugin_dir: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    cursor_key_env: Option<String>,
    upstream_proxy: Option<String>,
    request_timeout_ms: Option<u64>,
    header_timeout_ms: Option<u64>,
    max_header_bytes: Option<usize>,
    max_concurrent_requests: Option<usize>,
    shutdown_grace_ms: Option<u64>,
    admin_listen: Option<String>,
    log_format: Option<LogFormat>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlatform {
    status: PlatformStatus,
    #[serde(default)]
    providers: Vec<String>,
    #[serde(default)]
    endpoints: BTreeMap<Endpoint, Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    library: String,
    base_url: String,
    api_key_env: String,
    timeout_ms: Option<u64>,
    breaker_failures: Option<u32>,
    breaker_cooldown_ms: Option<u64>,
    max_body_bytes: Option<usize>,
    #[serde(default)]
    settings: Option<toml::Table>,
}

impl Config {
    /// Reads and validates the file at `path`, reading secrets from the
    /// process environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(path, &text, &|name| std::env::var(name).ok())
    }

    /// Validates `text` as if read from `path`; `env` looks up variables.
    pub fn parse(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_owned(),
            line: e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1))
                .unwrap_or(1),
            message: e.message().trim().replace('\n', " "),
        })?;
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        };
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let resolve = |p: &Path| base.join(p);

        let listen = raw.server.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        let listen: SocketAddr = listen.parse().map_err(|_| {
            invalid(format!(
                "[server] listen: `{listen}` is not an IP:port address"
            ))
        })?;
        let admin_listen = match raw
            .server
            .admin_listen
            .as_deref()
            .unwrap_or(DEFAULT_ADMIN_LISTEN)
        {
            "off" => None,
            addr => Some(addr.parse::<SocketAddr>().map_err(|_| {
                invalid(format!(
                    "[server] admin_listen: `{addr}` is not an IP:port address or \"off\""
                ))
            })?),
        };
        let plugin_dir = match raw.server.plugin_dir {
            Some(dir) => resolve(&dir),
            None => executable_dir().map_err(|e| {
                invalid(format!(
                    "cannot find the executable's folder for plugin_dir: {e}"
                ))
            })?,
        };
        let cursor_key = match raw.server.cursor_key_env {
            None => None,
            Some(name) => {
                let value = env(&name).filter(|v| !v.is_empty()).ok_or_else(|| {
                    invalid(format!(
                        "[server] cursor_key_env: environment variable `{name}` is not set"
                    ))
                })?;
                if value.len() < 32 {
                    return Err(invalid(format!(
                        "[server] cursor_key_env: `{name}` must hold at least 32 characters"
                    )));
                }
                Some(Secret::new(value))
            }
        };
        if let Some(proxy) = &raw.server.upstream_proxy {
            // The client is built without SOCKS support. The value is not
            // echoed: it may carry credentials.
            if !(proxy.starts_with("http://") || proxy.starts_with("https://")) {
                return Err(invalid(
                    "[server] upstream_proxy: not an http:// or https:// URL".into(),
                ));
            }
        }
        let defaults = ServerLimits::default();
        let millis = |value: Option<u64>, key: &str, default: Duration| match value {
            None => Ok(default),
            Some(0) => Err(invalid(format!("[server] {key}: must be above 0"))),
            Some(ms) => Ok(Duration::from_millis(ms)),
        };
        let limits = ServerLimits {
            request_timeout: millis(
                raw.server.request_timeout_ms,
                "request_timeout_ms",
                defaults.request_timeout,
            )?,
            header_timeout: millis(
                raw.server.header_timeout_ms,
                "header_timeout_ms",
                defaults.header_timeout,
            )?,
            shutdown_grace: millis(
                raw.server.shutdown_grace_ms,
                "shutdown_grace_ms",
                defaults.shutdown_grace,
            )?,
            max_header_bytes: match raw.server.max_header_bytes {
                None => defaults.max_header_bytes,
                // hyper's read buffer cannot be smaller.
                Some(n) if n < 8192 => {
                    return Err(invalid(
                        "[server] max_header_bytes: must be at least 8192".into(),
                    ))
                }
                Some(n) => n,
            },
            max_concurrent_requests: match raw.server.max_concurrent_requests {
                None => defaults.max_concurrent_requests,
                Some(0) => {
                    return Err(invalid(
                        "[server] max_concurrent_requests: must be above 0".into(),
                    ))
                }
                Some(n) => n,
            },
        };
        let rate_limit = match raw.rate_limit {
            None => None,
            Some(r) => {
                let burst = r.burst.unwrap_or(r.per_second.max(1.0));
                if !(r.per_second.is_finite() && r.per_second > 0.0) {
                    return Err(invalid("[rate_limit] per_second: must be above 0".into()));
                }
                if !(burst.is_finite() && burst >= 1.0) {
                    return Err(invalid("[rate_limit] burst: must be at least 1".into()));
                }
                Some(RateLimitConfig {
                    per_second: r.per_second,
                    burst,
                })
            }
        };
        let server = ServerConfig {
            listen,
            keys_file: resolve(
                raw.server
                    .keys_file
                    .as_deref()
                    .unwrap_or(Path::new(DEFAULT_KEYS_FILE)),
            ),
            plugin_dir: plugin_dir.clone(),
            state_dir: resolve(
                raw.server
                    .state_dir
                    .as_deref()
                    .unwrap_or(Path::new("state")),
            ),
            cursor_key,
            upstream_proxy: raw.server.upstream_proxy.map(Secret::new),
            limits,
            admin_listen,
            log_format: raw.server.log_format.unwrap_or_default(),
        };

        let mut providers = BTreeMap::new();
        for (name, p) in raw.providers {
            let at = |what: &str| format!("[providers.{name}] {what}");
            // Provider names travel in cursors and metric labels: keep them
            // short and plain.
            if !valid_segment(&name) {
                return Err(invalid(at(
                    ": a provider name is 1-64 of a-z, 0-9, `-` and `_`",
                )));
            }
            // Not echoed: a base URL may carry credentials.
            if !(p.base_url.starts_with("http://") || p.base_url.starts_with("https://")) {
                return Err(invalid(at("base_url: not an http:// or https:// URL")));
            }
            let api_key = env(&p.api_key_env)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| {
                    invalid(at(&format!(
                        "api_key_env: environment variable `{}` is not set",
                        p.api_key_env
                    )))
                })?;
            let timeout_ms = p.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
            if timeout_ms == 0 {
                return Err(invalid(at("timeout_ms: must be above 0")));
            }
            let settings = match p.settings {
                None => serde_json::Value::Object(Default::default()),
                Some(table) => serde_json::to_value(table)
                    .map_err(|e| invalid(at(&format!("settings: {e}"))))?,
            };
            let breaker = BreakerConfig {
                failures: match p.breaker_failures {
                    Some(0) => return Err(invalid(at("breaker_failures: must be above 0"))),
                    Some(n) => n,
                    None => BreakerConfig::default().failures,
                },
                cooldown: p
                    .breaker_cooldown_ms
                    .map(Duration::from_millis)
                    .unwrap_or(BreakerConfig::default().cooldown),
            };
            let max_body_bytes = match p.max_body_bytes {
                Some(0) => return Err(invalid(at("max_body_bytes: must be above 0"))),
                Some(n) => n,
                None => crate::upstream::DEFAULT_MAX_BODY_BYTES,
            };
            let library = library_path(&p.library, &plugin_dir, base);
            providers.insert(
                name,
                ProviderConfig {
                    library,
                    base_url: p.base_url,
                    api_key: Secret::new(api_key),
                    timeout: Duration::from_millis(timeout_ms),
                    settings,
                    breaker,
                    max_body_bytes,
                },
            );
        }

        let mut platforms = BTreeMap::new();
        for (name, p) in raw.platforms {
            if !valid_segment(&name) {
                return Err(invalid(format!(
                    "[platforms.{name}]: a platform name is 1-64 of a-z, 0-9, `-` and `_`"
                )));
            }
            let orders = std::iter::once(("providers".to_owned(), &p.providers)).chain(
                p.endpoints
                    .iter()
                    .map(|(e, list)| (format!("endpoints.{e}"), list)),
            );
            for (key, list) in orders {
                for provider in list {
                    if !providers.contains_key(provider) {
                        return Err(invalid(format!(
                            "[platforms.{name}] {key}: unknown provider `{provider}`"
                        )));
                    }
                }
                if let Some(dup) = list
                    .iter()
                    .enumerate()
                    .find(|(i, p)| list[..*i].contains(p))
                {
                    return Err(invalid(format!(
                        "[platforms.{name}] {key}: provider `{}` is listed twice",
                        dup.1
                    )));
                }
            }
            if p.status == PlatformStatus::Live && p.providers.is_empty() && p.endpoints.is_empty()
            {
                return Err(invalid(format!(
                    "[platforms.{name}]: a live platform needs at least one provider"
                )));
            }
            platforms.insert(
                name,
                PlatformConfig {
                    status: p.status,
                    providers: p.providers,
                    endpoints: p.endpoints,
                },
            );
        }

        Ok(Config {
            path: path.to_owned(),
            server,
            platforms,
            providers,
            rate_limit,
            ledger_path: resolve(
                raw.ledger
                    .path
                    .as_deref()
                    .unwrap_or(Path::new(DEFAULT_LEDGER_FILE)),
            ),
            billing: raw.billing,
        })
    }
}

/// Path segments we route on: lowercase, so `/v1/{platform}` is unambiguous.
fn valid_segment(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// A bare name (`shortvideo_primary`) means `lib<name>.so` (per-OS naming)
/// in the plugin folder; anything with a slash or an extension is a path,
/// relative to `base`.
pub fn library_path(library: &str, plugin_dir: &Path, base: &Path) -> PathBuf {
    let is_path =
        library.contains('/') || library.contains('\\') || Path::new(library).extension().is_some();
    if is_path {
        base.join(library)
    } else {
        plugin_dir.join(format!(
            "{}{library}{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        ))
    }
}

/// The folder of the running executable, where `cargo build` puts plugins too.
pub fn executable_dir() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    exe.parent()
        .map(Path::to_owned)
        .ok_or_else(|| std::io::Error::other("the executable has no parent folder"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        [server]
        listen = "127.0.0.1:0"
        plugin_dir = "plugins"

        [platforms.shortvideo]
        status = "live"
        providers = ["a", "b"]
        [platforms.shortvideo.endpoints]
        search = ["b"]

        [platforms.later]
        status = "planned"

        [providers.a]
        library = "shortvideo_primary"
        base_url = "http://127.0.0.1:1"
        api_key_env = "KEY_A"
        timeout_ms = 1500
        [providers.b]
        library = "lib/custom.so"
        base_url = "https://example.test/api/"
        api_key_env = "KEY_B"
        [providers.b.settings]
        rapidapi_host = "x.example"
    "#;

    fn env(name: &str) -> Option<String> {
        matches!(name, "KEY_A" | "KEY_B").then(|| format!("secret-{name}"))
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/etc/sg/platforms.toml"), text, &env)
    }

    #[test]
    fn resolves_paths_orders_and_secrets() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.server.keys_file, Path::new("/etc/sg/keys.toml"));
        assert_eq!(c.server.state_dir, Path::new("/etc/sg/state"));
        assert_eq!(
            c.providers["a"].library,
            Path::new("/etc/sg/plugins/libshortvideo_primary.so")
        );
        assert_eq!(c.providers["b"].library, Path::new("/etc/sg/lib/custom.so"));
        assert_eq!(c.providers["a"].timeout, Duration::from_millis(1500));
        assert_eq!(
            c.providers["b"].timeout,
            Duration::from_millis(DEFAULT_TIMEOUT_MS)
        );
        assert_eq!(c.providers["a"].api_key.expose(), "secret-KEY_A");
        assert_eq!(c.providers["b"].settings["rapidapi_host"], "x.example");
        let sv = &c.platforms["shortvideo"];
        assert_eq!(sv.order(Endpoint::Profile), ["a", "b"]);
        assert_eq!(sv.order(Endpoint::Search), ["b"]);
        assert_eq!(c.platforms["later"].status, PlatformStatus::Planned);
    }

    #[test]
    fn errors_are_one_line_naming_file_and_reason() {
        let cases = [
            (
                GOOD.replace("timeout_ms = 1500", "timeout_ms = 1500\ncolour = 1"),
                "unknown field `colour`",
            ),
            (
                GOOD.replace("KEY_B", "KEY_MISSING"),
                "environment variable `KEY_MISSING` is not set",
            ),
            (
                GOOD.replace("providers = [\"a\", \"b\"]", "providers = [\"a\", \"zz\"]"),
                "unknown provider `zz`",
            ),
            (GOOD.replace("search = [\"b\"]", "serch = [\"b\"]"), "serch"),
            (GOOD.replace("\"live\"", "\"alive\""), "alive"),
            (GOOD.replace("127.0.0.1:0", "localhost"), "listen"),
            (GOOD.replace("http://127.0.0.1:1", "ftp://x"), "base_url"),
            ("[server\n".to_string(), "platforms.toml:1:"),
        ];
        for (text, needle) in cases {
            let message = parse(&text).unwrap_err().to_string();
            assert!(message.starts_with("/etc/sg/platforms.toml"), "{message}");
            assert!(message.contains(needle), "{needle:?} not in {message:?}");
            assert!(!message.contains('\n'), "{message:?}");
            assert!(!message.contains("secret-"), "{message:?}");
        }
    }

    #[test]
    fn urls_are_redacted_for_logs() {
        assert_eq!(
            redacted_url("https://user:pw@api.example:8443/v1/x?key=sk&u=1#f"),
            "https://api.example:8443/v1/x?…"
        );
        assert_eq!(redacted_url("http://127.0.0.1:9"), "http://127.0.0.1:9");
        let c = parse(&GOOD.replace(
            "https://example.test/api/",
            "https://u:topsecret@example.test/",
        ))
        .unwrap();
        assert!(!format!("{c:?}").contains("topsecret"));
        let bad = GOOD.replace("https://example.test/api/", "ftp://u:topsecret@x");
        assert!(!parse(&bad).unwrap_err().to_string().contains("topsecret"));
    }

    #[test]
    fn secrets_do_not_debug_print() {
        let c = parse(GOOD).unwrap();
        assert!(!format!("{c:?}").contains("secret-"));
    }
}
