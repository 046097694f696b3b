//! The operator's configuration (`platforms.toml`): reading the file,
//! refusing anything doubtful with one line that names the file and the
//! reason, and composing the two parts the rest of the host uses.
//!
//! # Two parts, two lifetimes
//!
//! - [`ProcessConfig`]: listeners (and the paths of their TLS files),
//!   connection limits, state folder, ledger, cursor key, proxy, log
//!   format, where shared state lives. Fixed for the life of a process: a
//!   reload that changes one logs "restart to apply" (see
//!   [`ProcessConfig::changed_settings`]) and otherwise ignores it.
//! - [`ServingConfig`]: platforms, providers, keys file, request deadline,
//!   rate limits, billing, the cache's times to live, CORS origins.
//!   Swapped whole by every reload.
//!
//! Which part a setting lives in is the one place that says whether a
//! reload applies it.
//!
//! # Who validates what
//!
//! This module reads the file (syntax, unknown keys) and composes; each
//! section is validated by the module that uses it, through a `from_raw`
//! beside its type: [`crate::server::ListenerConfig`],
//! [`crate::server::cors`], [`crate::resilience`]'s breaker, rate limit,
//! concurrency gate and deadline, [`crate::cursor`], [`crate::upstream`],
//! [`crate::logging`], [`crate::plugins`], [`crate::ledger`],
//! [`crate::auth`], [`crate::billing`], [`crate::cache`],
//! [`crate::shared`] and [`crate::routing::config`]. [`Context`] gives
//! them the config's folder, the environment, and errors in one format;
//! it and [`ConfigError`] are [`crate::settings`]'s, a leaf, so a section's
//! module never imports this one, which only imports downward.
//!
//! Relative paths resolve against the config file's folder, so a config
//! means the same thing whatever the working directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::billing::{BillingConfig, RawBilling};
use crate::cache::{CacheConfig, RawCache};
use crate::cursor::CursorConfig;
use crate::ledger::{LedgerConfig, RawLedger};
use crate::resilience::rate_limit::{RateLimitConfig, RawRateLimit};
use crate::routing::config::{PlatformConfig, ProviderConfig, RawPlatform, RawProvider};
use crate::server::cors::CorsConfig;
use crate::server::ListenerConfig;
use crate::settings::LogFormat;
use crate::settings::{syntax_error_line, ConfigError, Context, RawServer, Secret};
use crate::shared::{RawState, StateConfig};

/// A validated configuration with every path resolved and every secret read.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from.
    pub path: PathBuf,
    pub process: ProcessConfig,
    pub serving: ServingConfig,
}

/// What is fixed for the life of a process. Comparing two of these is how
/// a reload finds settings that need a restart.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessConfig {
    /// `listen`, `admin_listen` and how connections are hardened and drained.
    pub listener: ListenerConfig,
    /// `max_concurrent_requests`: past it, 503 at once.
    pub max_concurrent_requests: usize,
    /// `state_dir`: where private copies of plugin libraries are kept.
    pub state_dir: PathBuf,
    /// `cursor_key_env`, `cursor_key_previous_env`, `cursor_ttl_s`.
    pub cursor: CursorConfig,
    /// `upstream_proxy`: the only proxy upstream requests may use. A secret:
    /// it may carry credentials.
    pub upstream_proxy: Option<Secret>,
    /// `upstream_ca_file`, read: CAs trusted for upstreams besides the
    /// public roots.
    pub upstream_roots: Vec<rustls_pki_types::CertificateDer<'static>>,
    pub log_format: LogFormat,
    pub ledger: LedgerConfig,
    /// `[cache] max_bytes`: the store is built once.
    pub cache_max_bytes: u64,
    /// `[state]`: in the process, or shared by replicas in Redis.
    pub state: StateConfig,
}

/// What a reload swaps in whole.
#[derive(Debug, Clone, PartialEq)]
pub struct ServingConfig {
    pub keys_file: PathBuf,
    /// `keys_fail_closed`: an unusable keys file refuses every key rather
    /// than keeping the last good ones answering.
    pub keys_fail_closed: bool,
    /// All attempts of one request together.
    pub request_timeout: Duration,
    /// Requests one key may have in flight; `None`: no cap of its own.
    pub max_concurrent_requests_per_key: Option<usize>,
    pub platforms: BTreeMap<String, PlatformConfig>,
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Per-key request rate; `None`: no limit.
    pub rate_limit: Option<RateLimitConfig>,
    pub billing: BillingConfig,
    /// `[cache]` but `max_bytes`.
    pub cache: CacheConfig,
    /// `[server.cors]`: which origins browsers may read answers from.
    pub cors: CorsConfig,
}

impl ServingConfig {
    /// Every provider's library, as configured.
    pub fn libraries(&self) -> impl Iterator<Item = &Path> {
        self.providers.values().map(|p| p.library.as_path())
    }

    /// Providers no platform's chain names: loaded (their `api_key_env`
    /// required), yet never asked. Likely a name left out of a chain.
    pub fn unchained_providers(&self) -> Vec<&str> {
        let chained = |name: &str| {
            self.platforms.values().any(|platform| {
                platform.providers.iter().any(|p| p == name)
                    || platform.endpoints.values().flatten().any(|p| p == name)
            })
        };
        self.providers
            .keys()
            .map(String::as_str)
            .filter(|name| !chained(name))
            .collect()
    }

    /// The sections (as written in the file) whose values differ in `new`,
    /// for the reload log: applied at once, yet otherwise unsaid when no
    /// provider is set up anew. Platforms and providers are named one by
    /// one; those added or removed are the routing table's to say.
    ///
    /// The destructuring below has no `..`: a field added to this struct does
    /// not compile until it is compared here too.
    pub fn changed_settings(&self, new: &ServingConfig) -> Vec<String> {
        let ServingConfig {
            keys_file,
            keys_fail_closed,
            request_timeout,
            max_concurrent_requests_per_key,
            platforms,
            providers,
            rate_limit,
            billing,
            cache,
            cors,
        } = self;
        let mut changed: Vec<String> = [
            ("[server] keys_file", *keys_file != new.keys_file),
            (
                "[server] keys_fail_closed",
                *keys_fail_closed != new.keys_fail_closed,
            ),
            (
                "[server] request_timeout_ms",
                *request_timeout != new.request_timeout,
            ),
            (
                "[server] max_concurrent_requests_per_key",
                *max_concurrent_requests_per_key != new.max_concurrent_requests_per_key,
            ),
        ]
        .into_iter()
        .filter(|(_, c)| *c)
        .map(|(key, _)| key.to_owned())
        .collect();
        let differs = |then: Option<bool>| then.unwrap_or(false);
        changed.extend(
            platforms
                .iter()
                .filter(|(name, was)| differs(new.platforms.get(*name).map(|now| now != *was)))
                .map(|(name, _)| format!("[platforms.{name}]")),
        );
        changed.extend(
            providers
                .iter()
                .filter(|(name, was)| differs(new.providers.get(*name).map(|now| now != *was)))
                .map(|(name, _)| format!("[providers.{name}]")),
        );
        let sections = [
            ("[rate_limit]", *rate_limit != new.rate_limit),
            ("[billing]", *billing != new.billing),
            ("[cache]", *cache != new.cache),
            ("[server.cors]", *cors != new.cors),
        ];
        changed.extend(
            sections
                .into_iter()
                .filter(|(_, c)| *c)
                .map(|(key, _)| key.to_owned()),
        );
        changed
    }
}

impl ProcessConfig {
    /// The settings (as written in the file) whose values differ in `new`.
    ///
    /// The destructuring below has no `..`: a field added to this struct does
    /// not compile until it is compared here too.
    pub fn changed_settings(&self, new: &ProcessConfig) -> Vec<&'static str> {
        let ProcessConfig {
            listener,
            max_concurrent_requests,
            state_dir,
            cursor,
            upstream_proxy,
            upstream_roots,
            log_format,
            ledger,
            cache_max_bytes,
            state,
        } = self;
        let mut changed = listener.changed_settings(&new.listener);
        let others = [
            (
                "[server] max_concurrent_requests",
                *max_concurrent_requests != new.max_concurrent_requests,
            ),
            ("[server] state_dir", *state_dir != new.state_dir),
            (
                "[server] upstream_proxy",
                *upstream_proxy != new.upstream_proxy,
            ),
            (
                "[server] upstream_ca_file",
                *upstream_roots != new.upstream_roots,
            ),
            ("[server] log_format", *log_format != new.log_format),
            // Where it is, not whether the file named it (a new field is
            // to be compared, or not, here too).
            ("[ledger] path", {
                let crate::ledger::LedgerConfig { path, written: _ } = ledger;
                *path != new.ledger.path
            }),
            ("[cache] max_bytes", *cache_max_bytes != new.cache_max_bytes),
            ("[state]", *state != new.state),
        ];
        changed.extend(others.into_iter().filter(|(_, c)| *c).map(|(key, _)| key));
        changed.extend(cursor.changed_settings(&new.cursor));
        changed
    }
}

// The file as written. Every table refuses unknown keys; each section's
// type is its owner's.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
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
    billing: RawBilling,
    #[serde(default)]
    cache: RawCache,
    #[serde(default)]
    state: RawState,
}

impl RawConfig {
    /// Reads `text` as if from `path`: syntax and unknown keys only.
    pub fn parse(path: &Path, text: &str) -> Result<RawConfig, ConfigError> {
        toml::from_str(text).map_err(|e| syntax_error(path, text, &e))
    }
}

/// A TOML error in the file at `path`, whose text is `text`.
fn syntax_error(path: &Path, text: &str, error: &toml::de::Error) -> ConfigError {
    let message = error.message().trim().replace('\n', " ");
    // A value's error ("expected u32") names no key; the line does.
    let of_a_value = message.starts_with("invalid type")
        || message.starts_with("invalid value")
        || message.starts_with("number too large");
    let key = error
        .span()
        .filter(|_| of_a_value)
        .and_then(|span| key_of_value_at(text, span.start));
    ConfigError::Syntax {
        path: path.to_owned(),
        line: syntax_error_line(text, error),
        message: match key {
            Some(key) => format!("{key}: {message}"),
            None => message,
        },
    }
}

/// The key whose value starts at byte `at` of `text` (`comments` in
/// `comments = -1` and in `costs = { comments = -1 }`); `None` when `at`
/// is not in a value, or the text before it is not a plain key. Never a
/// piece of a string: a line with a quote before `at` names no key.
fn key_of_value_at(text: &str, at: usize) -> Option<&str> {
    let before = text.get(..at)?;
    let line = &before[before.rfind('\n').map_or(0, |i| i + 1)..];
    if line.contains(['"', '\'']) {
        return None;
    }
    let (key, _) = line.rsplit_once('=')?;
    let key = key.rsplit(['{', ',']).next()?.trim();
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"_-. ".contains(&b);
    (!key.is_empty() && key.bytes().all(plain)).then_some(key)
}

/// Reads the file at `path`.
fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })
}

fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl Config {
    /// Reads and validates the file at `path`, reading secrets from the
    /// process environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::parse(path, &read(path)?, &process_env)
    }

    /// Validates `text` as if read from `path`; `env` looks up variables.
    pub fn parse(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let raw = RawConfig::parse(path, text)?;
        let cx = Context::new(path, env);
        let server = &raw.server;
        let process = ProcessConfig {
            listener: ListenerConfig::from_raw(server, &cx)?,
            max_concurrent_requests: crate::resilience::concurrency::max_from_raw(server, &cx)?,
            state_dir: crate::plugins::state_dir_from_raw(server, &cx),
            cursor: CursorConfig::from_raw(server, &cx)?,
            upstream_proxy: crate::upstream::proxy_from_raw(server, &cx)?,
            upstream_roots: crate::upstream::ca_file_from_raw(server, &cx)?,
            log_format: server.log_format.unwrap_or_default(),
            ledger: LedgerConfig::from_raw(&raw.ledger, &cx)?,
            cache_max_bytes: crate::cache::max_bytes_from_raw(&raw.cache, &cx)?,
            state: StateConfig::from_raw(&raw.state, &cx)?,
        };
        // Replicas must open each other's cursors: one shared secret.
        if process.state.is_redis() && process.cursor.key.is_none() {
            return Err(cx.invalid(
                "[state] backend",
                "\"redis\" needs [server] cursor_key_env: replicas must share the cursor key",
            ));
        }
        let plugin_dir = crate::plugins::plugin_dir_from_raw(server, &cx)?;
        let providers = named_tables(raw.providers, |name, p| {
            ProviderConfig::from_raw(name, p, &plugin_dir, &cx)
        })?;
        // An empty or cut-short file (an editor saving in place) would
        // otherwise answer every request 404 while it looked ready.
        if raw.platforms.is_empty() {
            return Err(cx.invalid(
                "[platforms]",
                "no platform is configured, so nothing would be served (an empty or cut-short file?)",
            ));
        }
        let platforms = named_tables(raw.platforms, |name, p| {
            PlatformConfig::from_raw(name, p, &providers, &cx)
        })?;
        let serving = ServingConfig {
            keys_file: crate::auth::keys_file_from_raw(server.keys_file.as_deref(), &cx),
            keys_fail_closed: server.keys_fail_closed.unwrap_or(false),
            request_timeout: crate::resilience::deadline::request_timeout_from_raw(server, &cx)?,
            max_concurrent_requests_per_key: crate::resilience::concurrency::per_key_max_from_raw(
                server, &cx,
            )?,
            platforms,
            providers,
            rate_limit: RateLimitConfig::from_raw(raw.rate_limit, &cx)?,
            billing: BillingConfig::from_raw(raw.billing, &cx)?,
            cache: CacheConfig::from_raw(&raw.cache, &cx)?,
            cors: CorsConfig::from_raw(server.cors.as_ref(), &cx)?,
        };
        Ok(Config {
            path: path.to_owned(),
            process,
            serving,
        })
    }
}

/// Validates each `[section.NAME]` table with `from_raw`.
fn named_tables<R, T>(
    raw: BTreeMap<String, R>,
    from_raw: impl Fn(&str, R) -> Result<T, ConfigError>,
) -> Result<BTreeMap<String, T>, ConfigError> {
    raw.into_iter()
        .map(|(name, table)| {
            let valid = from_raw(&name, table)?;
            Ok((name, valid))
        })
        .collect()
}

/// The files the `keys` and `credits` commands work on, needing neither
/// secrets nor plugins: key commands must work where the server's
/// environment is absent. Only their sections are read (`[server]
/// keys_file`, `[ledger]`, `[state]`, `[billing]`), each checked as its
/// owner checks it: an operator halfway through an edit elsewhere must
/// still be able to revoke a leaked key. A wrong type or an unknown key
/// elsewhere comes back as [`KeyFiles::elsewhere`], to be shown; a file
/// that is not TOML at all (a syntax error anywhere) is refused, as
/// nothing in it can be read.
pub struct KeyFiles {
    pub keys_file: PathBuf,
    pub ledger: LedgerConfig,
    /// With `redis`, keys and usage are in the shared store, not the files.
    pub state: StateConfig,
    /// For the balances `credits show` prints.
    pub billing: BillingConfig,
    /// Why the whole file would be refused, if it would: a wrong type or
    /// an unknown key in a section not read here.
    pub elsewhere: Option<ConfigError>,
}

/// The sections [`KeyFiles`] reads; the others are left unread.
#[derive(Deserialize)]
struct RawKeyFiles {
    #[serde(default)]
    server: RawKeysServer,
    #[serde(default)]
    ledger: RawLedger,
    #[serde(default)]
    billing: RawBilling,
    #[serde(default)]
    state: RawState,
}

/// `[server] keys_file`; the table's other keys are the server's.
#[derive(Deserialize, Default)]
struct RawKeysServer {
    keys_file: Option<PathBuf>,
}

impl KeyFiles {
    pub fn load(path: &Path) -> Result<KeyFiles, ConfigError> {
        let text = read(path)?;
        let elsewhere = RawConfig::parse(path, &text).err();
        let raw: RawKeyFiles = toml::from_str(&text).map_err(|e| syntax_error(path, &text, &e))?;
        let cx = Context::new(path, &process_env);
        Ok(KeyFiles {
            keys_file: crate::auth::keys_file_from_raw(raw.server.keys_file.as_deref(), &cx),
            ledger: LedgerConfig::unchecked(&raw.ledger, &cx),
            state: StateConfig::from_raw(&raw.state, &cx)?,
            billing: BillingConfig::from_raw(raw.billing, &cx)?,
            elsewhere,
        })
    }
}

/// `value` as a TOML string literal, for configs written by code (the demo).
pub fn toml_string(value: &str) -> String {
    toml::Value::String(value.to_owned()).to_string()
}

#[cfg(test)]
mod tests;
