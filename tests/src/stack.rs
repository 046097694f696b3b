//! [`Stack`]: the set-up of one test. Both upstream doubles, a config naming
//! them (plus the `chaos` provider when asked), a key issued through the CLI
//! (and any extra ones), a running server and a client holding the key.
//!
//! The builder's default is the operator's config; each test changes what
//! it is about: the failover order, the primary's address (any upstream: the
//! wiremock double, a [`RawUpstream`](crate::raw_upstream::RawUpstream), a
//! closed port), and the resilience keys per provider and under `[server]`
//! (`timeout_ms`, `breaker_*`, `max_body_bytes`, `request_timeout_ms`, ...).

use std::future::Future;
use std::time::{Duration, Instant};

use crate::api::{Answer, Api};
use crate::config::{
    self, standard_env, Config, ConfigBuilder, CHAOS, CHAOS_KEY_ENV, FALLBACK, PRIMARY,
};
use crate::paths;
use crate::process::{issue_key, Server};
use crate::upstream::{FallbackMock, PrimaryMock};

/// The key every stack issues; [`StackBuilder::extra_key`] adds more.
pub const KEY_NAME: &str = "e2e";

/// Where the `chaos` provider points unless told: a port where nothing
/// listens (most of its modes make no request).
const NOWHERE: &str = "http://127.0.0.1:9";

/// One running server with its doubles. Fields drop in order: the server
/// stops before the doubles check that nothing unexpected reached them.
pub struct Stack {
    pub server: Server,
    pub api: Api,
    pub key: String,
    extra_keys: Vec<(String, String)>,
    pub primary: PrimaryMock,
    pub fallback: FallbackMock,
    pub config: Config,
    env: Vec<(String, String)>,
}

/// How to set up a [`Stack`]. The default is the operator's config:
/// `providers = [primary, fallback]`, `search = [fallback]`, both on their
/// wiremock doubles with 2 s timeouts, defaults for everything else.
pub struct StackBuilder {
    order: Vec<String>,
    search: Option<Vec<String>>,
    primary_url: Option<String>,
    chaos_mode: Option<String>,
    chaos_url: Option<String>,
    chaos_target: Option<String>,
    timeouts: Vec<(String, u64)>,
    breaker_failures: Option<u32>,
    provider_lines: Vec<(String, String)>,
    server_lines: Vec<String>,
    cache: Option<String>,
    raw: Vec<String>,
    env: Vec<(String, String)>,
    extra_keys: Vec<String>,
    /// `shortvideo`'s description; `None`: the repository's.
    description: Option<std::path::PathBuf>,
}

impl Default for StackBuilder {
    fn default() -> StackBuilder {
        StackBuilder {
            order: vec![PRIMARY.into(), FALLBACK.into()],
            search: Some(vec![FALLBACK.into()]),
            primary_url: None,
            chaos_mode: None,
            chaos_url: None,
            chaos_target: None,
            timeouts: Vec::new(),
            breaker_failures: None,
            provider_lines: Vec::new(),
            server_lines: Vec::new(),
            cache: None,
            description: None,
            raw: Vec::new(),
            env: Vec::new(),
            extra_keys: Vec::new(),
        }
    }
}

impl StackBuilder {
    /// The platform's failover order.
    pub fn providers(mut self, order: &[&str]) -> StackBuilder {
        self.order = order.iter().map(|s| s.to_string()).collect();
        self
    }

    /// The per-endpoint order of `search`; `None` leaves it to `providers`.
    pub fn search_order(mut self, order: Option<&[&str]>) -> StackBuilder {
        self.search = order.map(|o| o.iter().map(|s| s.to_string()).collect());
        self
    }

    /// Points the primary at `url` instead of its wiremock double (which
    /// still runs, and must then receive nothing).
    pub fn primary_url(mut self, url: &str) -> StackBuilder {
        self.primary_url = Some(url.into());
        self
    }

    /// Adds the `chaos` provider in `mode` (name it in the order).
    pub fn chaos(mut self, mode: &str) -> StackBuilder {
        self.chaos_mode = Some(mode.into());
        self
    }

    /// Points the `chaos` provider at `url` (default: a port where nothing
    /// listens), for the modes that make a request.
    pub fn chaos_url(mut self, url: &str) -> StackBuilder {
        self.chaos_url = Some(url.into());
        self
    }

    /// The URL the `chaos` provider fetches in mode `fetch_target`.
    pub fn chaos_target(mut self, url: &str) -> StackBuilder {
        self.chaos_target = Some(url.into());
        self
    }

    /// A provider's `timeout_ms`.
    pub fn timeout_ms(mut self, provider: &str, ms: u64) -> StackBuilder {
        self.timeouts.push((provider.into(), ms));
        self
    }

    /// Sets every provider's `breaker_failures`, for tests that make one
    /// provider fail many times in a row and still want it asked each time.
    pub fn breaker_failures(mut self, n: u32) -> StackBuilder {
        self.breaker_failures = Some(n);
        self
    }

    /// A provider's `breaker_failures` and `breaker_cooldown_ms`.
    pub fn breaker(self, provider: &str, failures: u32, cooldown_ms: u64) -> StackBuilder {
        self.provider_line(provider, &format!("breaker_failures = {failures}"))
            .provider_line(provider, &format!("breaker_cooldown_ms = {cooldown_ms}"))
    }

    /// Any `key = value` line of a provider's table.
    pub fn provider_line(mut self, provider: &str, line: &str) -> StackBuilder {
        self.provider_lines.push((provider.into(), line.into()));
        self
    }

    /// The body of `[cache]` (off by default: see [`ConfigBuilder`]).
    pub fn cache(mut self, body: &str) -> StackBuilder {
        self.cache = Some(body.into());
        self
    }

    /// A line of `[server]`.
    /// Serves `shortvideo` as the description `file` says.
    pub fn description(mut self, file: &std::path::Path) -> StackBuilder {
        self.description = Some(file.to_path_buf());
        self
    }

    pub fn server_line(mut self, line: &str) -> StackBuilder {
        self.server_lines.push(line.into());
        self
    }

    /// Raw TOML appended to the file (e.g. a `[rate_limit]` table).
    pub fn raw(mut self, text: &str) -> StackBuilder {
        self.raw.push(text.into());
        self
    }

    /// Sets an environment variable for the server.
    pub fn env(mut self, name: &str, value: &str) -> StackBuilder {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Issues one more key, named `name`, before the server starts.
    pub fn extra_key(mut self, name: &str) -> StackBuilder {
        self.extra_keys.push(name.into());
        self
    }

    /// The config for doubles at these addresses.
    pub fn config(&self, primary: &PrimaryMock, fallback: &FallbackMock) -> ConfigBuilder {
        let order: Vec<&str> = self.order.iter().map(String::as_str).collect();
        let mut b = ConfigBuilder::new().platform("shortvideo", "live", &order);
        if let Some(file) = &self.description {
            b = b.description("shortvideo", file);
        }
        if let Some(search) = &self.search {
            let search: Vec<&str> = search.iter().map(String::as_str).collect();
            b = b.endpoint_order("shortvideo", "search", &search);
        }
        let primary_url = self
            .primary_url
            .clone()
            .unwrap_or_else(|| primary.base_url());
        b = b.primary(&primary_url).fallback(&fallback.base_url());
        if let Some(mode) = &self.chaos_mode {
            paths::require_plugin("chaos_plugin");
            let url = self.chaos_url.as_deref().unwrap_or(NOWHERE);
            let mut settings = format!("mode = {}", config::toml_str(mode));
            if let Some(target) = &self.chaos_target {
                settings += &format!("\ntarget = {}", config::toml_str(target));
            }
            b = b
                .provider(CHAOS, "chaos_plugin", url, CHAOS_KEY_ENV)
                .settings(CHAOS, &settings);
        }
        for (provider, ms) in &self.timeouts {
            b = b.timeout_ms(provider, *ms);
        }
        if let Some(n) = self.breaker_failures {
            let line = format!("breaker_failures = {n}");
            b = b
                .provider_line(PRIMARY, &line)
                .provider_line(FALLBACK, &line);
            if self.chaos_mode.is_some() {
                b = b.provider_line(CHAOS, &line);
            }
        }
        for (provider, line) in &self.provider_lines {
            b = b.provider_line(provider, line);
        }
        for line in &self.server_lines {
            b = b.server_line(line);
        }
        if let Some(cache) = &self.cache {
            b = b.cache(cache);
        }
        for text in &self.raw {
            b = b.raw(text);
        }
        b
    }

    /// Starts both doubles (with no routes), writes the config, issues the
    /// keys and starts the server.
    pub async fn start(self) -> Stack {
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
        let mut env = standard_env();
        env.extend(self.env);
        let server = Server::start_with(&config, &env, &[]);
        let api = Api::new(&server.base_url(), Some(&key));
        Stack {
            server,
            api,
            key,
            extra_keys,
            primary,
            fallback,
            config,
            env,
        }
    }
}

impl Stack {
    /// The default stack.
    pub async fn start() -> Stack {
        StackBuilder::default().start().await
    }

    pub fn builder() -> StackBuilder {
        StackBuilder::default()
    }

    /// `GET path` with the stack's key.
    pub async fn get(&self, path: &str) -> Answer {
        self.api.get(path).await
    }

    /// `GET path` with the stack's key, and how long the answer took.
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
            .unwrap_or_else(|| panic!("no extra key `{name}`: ask StackBuilder::extra_key"));
        self.api.with_key(Some(key))
    }

    /// Stops the server and starts a new one on the same config, keys and
    /// environment: fresh breakers, buckets and counters.
    pub fn restart(&mut self) {
        // The old process is gone before the new one copies its plugins.
        self.server.kill();
        self.server = Server::start_with(&self.config, &self.env, &[]);
        self.api = Api::new(&self.server.base_url(), Some(&self.key));
    }

    /// The environment the server runs with.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }
}

/// Polls `probe` every 10 ms until it is true or `within` has passed;
/// whether it became true.
pub async fn eventually<F, Fut>(within: Duration, mut probe: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
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
