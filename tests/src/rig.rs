//! [`Rig`]: the set-up of a resilience test. Like a [`Stack`](crate::Stack),
//! but the primary may be any upstream (the wiremock double, a
//! [`RawUpstream`](crate::raw_upstream::RawUpstream), a closed port), and
//! each provider and `[server]` take the resilience keys under test
//! (`timeout_ms`, `breaker_*`, `max_body_bytes`, `request_timeout_ms`, ...).

use std::time::{Duration, Instant};

use crate::api::{Answer, Api};
use crate::config::{
    self, standard_env, Config, ConfigBuilder, CHAOS, CHAOS_KEY_ENV, FALLBACK, FALLBACK_KEY_ENV,
    PRIMARY, PRIMARY_KEY_ENV,
};
use crate::paths;
use crate::process::{issue_key, Server};
use crate::upstream::{FallbackMock, PrimaryMock};

/// The key every rig issues; [`RigBuilder::extra_key`] adds more.
pub const KEY_NAME: &str = "e2e";

/// How to set up a [`Rig`]. The default: `providers = [primary, fallback]`
/// on the two wiremock doubles, 2 s timeouts, defaults for the rest.
pub struct RigBuilder {
    order: Vec<String>,
    primary_url: Option<String>,
    chaos_mode: Option<String>,
    chaos_url: Option<String>,
    timeouts: Vec<(String, u64)>,
    provider_lines: Vec<(String, String)>,
    server_lines: Vec<String>,
    raw: Vec<String>,
    extra_keys: Vec<String>,
}

impl Default for RigBuilder {
    fn default() -> RigBuilder {
        RigBuilder {
            order: vec![PRIMARY.into(), FALLBACK.into()],
            primary_url: None,
            chaos_mode: None,
            chaos_url: None,
            timeouts: Vec::new(),
            provider_lines: Vec::new(),
            server_lines: Vec::new(),
            raw: Vec::new(),
            extra_keys: Vec::new(),
        }
    }
}

impl RigBuilder {
    /// The platform's failover order (every endpoint).
    pub fn providers(mut self, order: &[&str]) -> RigBuilder {
        self.order = order.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Points the primary at `url` instead of its wiremock double (which
    /// still runs, and must then receive nothing).
    pub fn primary_url(mut self, url: &str) -> RigBuilder {
        self.primary_url = Some(url.into());
        self
    }

    /// Adds the `chaos` provider in `mode` (name it in the order).
    pub fn chaos(mut self, mode: &str) -> RigBuilder {
        self.chaos_mode = Some(mode.into());
        self
    }

    /// Points the `chaos` provider at `url` (default: a port where nothing
    /// listens), for the modes that make a request.
    pub fn chaos_url(mut self, url: &str) -> RigBuilder {
        self.chaos_url = Some(url.into());
        self
    }

    /// A provider's `timeout_ms`.
    pub fn timeout_ms(mut self, provider: &str, ms: u64) -> RigBuilder {
        self.timeouts.push((provider.into(), ms));
        self
    }

    /// A provider's `breaker_failures` and `breaker_cooldown_ms`.
    pub fn breaker(self, provider: &str, failures: u32, cooldown_ms: u64) -> RigBuilder {
        self.provider_line(provider, &format!("breaker_failures = {failures}"))
            .provider_line(provider, &format!("breaker_cooldown_ms = {cooldown_ms}"))
    }

    /// Any `key = value` line of a provider's table.
    pub fn provider_line(mut self, provider: &str, line: &str) -> RigBuilder {
        self.provider_lines.push((provider.into(), line.into()));
        self
    }

    /// A line of `[server]`.
    pub fn server_line(mut self, line: &str) -> RigBuilder {
        self.server_lines.push(line.into());
        self
    }

    /// Raw TOML appended to the file (e.g. a `[rate_limit]` table).
    pub fn raw(mut self, text: &str) -> RigBuilder {
        self.raw.push(text.into());
        self
    }

    /// Issues one more key, named `name`, before the server starts.
    pub fn extra_key(mut self, name: &str) -> RigBuilder {
        self.extra_keys.push(name.into());
        self
    }

    fn config(&self, primary: &PrimaryMock, fallback: &FallbackMock) -> ConfigBuilder {
        let order: Vec<&str> = self.order.iter().map(String::as_str).collect();
        let primary_url = self
            .primary_url
            .clone()
            .unwrap_or_else(|| primary.base_url());
        let mut b = ConfigBuilder::new()
            .platform("shortvideo", "live", &order)
            .provider(PRIMARY, "shortvideo_primary", &primary_url, PRIMARY_KEY_ENV)
            .provider(
                FALLBACK,
                "shortvideo_fallback",
                &fallback.base_url(),
                FALLBACK_KEY_ENV,
            );
        if let Some(mode) = &self.chaos_mode {
            paths::require_plugin("chaos_plugin");
            let url = self.chaos_url.as_deref().unwrap_or("http://127.0.0.1:9");
            b = b
                .provider(CHAOS, "chaos_plugin", url, CHAOS_KEY_ENV)
                .settings(CHAOS, &format!("mode = {}", config::toml_str(mode)));
        }
        for (provider, ms) in &self.timeouts {
            b = b.timeout_ms(provider, *ms);
        }
        for (provider, line) in &self.provider_lines {
            b = b.provider_line(provider, line);
        }
        for line in &self.server_lines {
            b = b.server_line(line);
        }
        for text in &self.raw {
            b = b.raw(text);
        }
        b
    }

    /// Starts both wiremock doubles (no routes), writes the config, issues
    /// the keys and starts the server.
    pub async fn start(self) -> Rig {
        paths::require_plugin("shortvideo_primary");
        paths::require_plugin("shortvideo_fallback");
        let primary = PrimaryMock::start().await;
        let fallback = FallbackMock::start().await;
        let config = self.config(&primary, &fallback).write();
        let key = issue_key(&config, KEY_NAME);
        let extra_keys = self
            .extra_keys
            .iter()
            .map(|name| (name.clone(), issue_key(&config, name)))
            .collect();
        let server = Server::start_with(&config, &standard_env(), &[]);
        let api = Api::new(&server.base_url(), Some(&key));
        Rig {
            server,
            api,
            key,
            extra_keys,
            primary,
            fallback,
            config,
        }
    }
}

/// A running server for a resilience test. Fields drop in order: the server
/// stops before the doubles check that nothing unexpected reached them.
pub struct Rig {
    pub server: Server,
    pub api: Api,
    pub key: String,
    extra_keys: Vec<(String, String)>,
    pub primary: PrimaryMock,
    pub fallback: FallbackMock,
    pub config: Config,
}

impl Rig {
    pub fn builder() -> RigBuilder {
        RigBuilder::default()
    }

    /// `GET path` with the rig's key.
    pub async fn get(&self, path: &str) -> Answer {
        self.api.get(path).await
    }

    /// `GET path` with the rig's key, and how long the answer took.
    pub async fn timed_get(&self, path: &str) -> (Answer, Duration) {
        let started = Instant::now();
        let answer = self.api.get(path).await;
        (answer, started.elapsed())
    }

    /// A client holding the extra key `name`.
    pub fn api_with_key(&self, name: &str) -> Api {
        let key = self
            .extra_keys
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, k)| k.as_str())
            .unwrap_or_else(|| panic!("no extra key `{name}`: ask RigBuilder::extra_key"));
        self.api.with_key(Some(key))
    }

    /// Stops the server and starts a new one on the same config and keys:
    /// fresh breakers, buckets and counters.
    pub fn restart(&mut self) {
        self.server.kill();
        self.server = Server::start_with(&self.config, &standard_env(), &[]);
        self.api = Api::new(&self.server.base_url(), Some(&self.key));
    }
}

/// Polls `probe` every 10 ms until it is true or `within` has passed;
/// whether it became true.
pub async fn eventually<F, Fut>(within: Duration, mut probe: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if probe().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
