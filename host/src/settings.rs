//! What every section of the configuration is read with: the reading
//! [`Context`] (the config's folder, the environment, one format for
//! errors), the [`ConfigError`] it refuses with, [`Secret`], and
//! `[server]` as written ([`RawServer`]), one table whose keys several
//! modules own.
//!
//! A leaf: each module that owns a section imports it to parse that
//! section beside its type, and [`crate::config`] composes them. It
//! imports nothing of the host, so the imports flow one way.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// How log lines are written to stderr. A process setting: the subscriber
/// is installed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One readable line per event.
    #[default]
    Human,
    /// One JSON object per line, for log collectors.
    Json,
}

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

/// `[server]` as written: one table, whose keys several modules own.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "the [server] table")]
pub struct RawServer {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    pub header_timeout_ms: Option<u64>,
    pub max_header_bytes: Option<usize>,
    pub shutdown_grace_ms: Option<u64>,
    pub max_connections: Option<usize>,
    pub write_timeout_ms: Option<u64>,
    pub max_concurrent_requests: Option<usize>,
    pub max_concurrent_requests_per_key: Option<usize>,
    pub request_timeout_ms: Option<u64>,
    pub keys_file: Option<PathBuf>,
    pub keys_fail_closed: Option<bool>,
    pub plugin_dir: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub cursor_key_env: Option<String>,
    pub cursor_key_previous_env: Option<String>,
    pub cursor_ttl_s: Option<u64>,
    pub upstream_proxy: Option<String>,
    pub upstream_ca_file: Option<PathBuf>,
    pub log_format: Option<LogFormat>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub cors: Option<RawCors>,
}

/// `[server.cors]` as written; [`crate::server::cors`] reads it.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "the [server.cors] table")]
pub struct RawCors {
    pub allowed_origins: Option<Vec<String>>,
}

/// What a section's `from_raw` needs: where the config is, how to read the
/// environment, and one format for its errors.
pub struct Context<'a> {
    path: &'a Path,
    base: &'a Path,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl<'a> Context<'a> {
    /// A context for the config file at `path` (relative paths resolve
    /// against its folder); `env` looks up variables.
    pub fn new(path: &'a Path, env: &'a dyn Fn(&str) -> Option<String>) -> Context<'a> {
        Context {
            path,
            base: folder_of(path),
            env,
        }
    }

    /// `path` relative to the config file's folder.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        // Absolute (against the working folder, lexically): a path written
        // as `./state` in a config read as `platforms.toml`, then written
        // out in full, is one folder, and a reload must not take the one
        // for the other as a change needing a restart.
        let joined = self.base.join(path);
        std::path::absolute(&joined).unwrap_or(joined)
    }

    /// The folder the config file is in.
    pub fn base(&self) -> &Path {
        self.base
    }

    /// `key: message`, as an error naming the file.
    pub fn invalid(&self, key: &str, message: impl fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_owned(),
            message: format!("{key}: {message}"),
        }
    }

    /// The value of the environment variable `var`, named by the setting
    /// `key`; unset, empty or blank is an error naming the variable. A
    /// name that does not look like one is not repeated: an operator may
    /// have pasted the secret itself there, and errors reach logs and
    /// terminals. A heuristic: a conventional name is `UPPER_CASE` with an
    /// underscore, or short (a secret of capitals and digits, like an AWS
    /// key ID, has neither).
    pub fn secret(&self, key: &str, var: &str) -> Result<Secret, ConfigError> {
        let conventional = var.starts_with(|c: char| c.is_ascii_uppercase() || c == '_')
            && var
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            && (var.contains('_') || var.len() <= 12);
        let named = if conventional {
            format!("environment variable `{var}`")
        } else {
            "the environment variable it names (not repeated: it is not an UPPER_CASE name, \
             and may be the secret itself)"
                .to_owned()
        };
        match (self.env)(var) {
            None => Err(self.invalid(key, format!("{named} is not set"))),
            Some(value) if value.trim().is_empty() => {
                Err(self.invalid(key, format!("{named} is empty")))
            }
            Some(value) => Ok(Secret::new(value)),
        }
    }

    /// A duration in milliseconds above 0, or `default`.
    pub fn millis(
        &self,
        key: &str,
        value: Option<u64>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match value {
            None => Ok(default),
            Some(0) => Err(self.invalid(key, "must be above 0")),
            Some(ms) => Ok(Duration::from_millis(ms)),
        }
    }

    /// A count above 0, or `default`.
    pub fn positive<N: PartialEq + From<u8>>(
        &self,
        key: &str,
        value: Option<N>,
        default: N,
    ) -> Result<N, ConfigError> {
        match value {
            None => Ok(default),
            Some(n) if n == N::from(0) => Err(self.invalid(key, "must be above 0")),
            Some(n) => Ok(n),
        }
    }
}

/// The 1-based line a TOML error in `text` points at (the first without a
/// place).
pub fn syntax_error_line(text: &str, error: &toml::de::Error) -> usize {
    let start = error.span().map_or(0, |s| s.start.min(text.len()));
    text.as_bytes()[..start]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The folder `path` names a file in (`.` for a bare name): the one the
/// config's relative paths resolve against, and the one a file is
/// replaced or locked in.
pub fn folder_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}
