//! [`Stack`]: the usual set-up of one test. Both upstream doubles, a config
//! naming them (plus the `chaos` provider when asked), a key issued through
//! the CLI, a running server and a client holding the key.

use crate::api::{Answer, Api};
use crate::config::{
    self, standard_env, Config, ConfigBuilder, CHAOS, CHAOS_KEY_ENV, FALLBACK, FALLBACK_KEY_ENV,
    PRIMARY, PRIMARY_KEY_ENV,
};
use crate::paths;
use crate::process::{issue_key, Server};
use crate::upstream::{FallbackMock, PrimaryMock};

/// One running server with its doubles. Fields drop in order: the server
/// stops before the doubles check that nothing unexpected reached them.
pub struct Stack {
    pub server: Server,
    pub api: Api,
    pub key: String,
    pub primary: PrimaryMock,
    pub fallback: FallbackMock,
    pub config: Config,
    env: Vec<(String, String)>,
}

/// How to set up a [`Stack`]. The default is the operator's config:
/// `providers = [primary, fallback]`, `search = [fallback]`.
pub struct StackBuilder {
    order: Vec<String>,
    search: Option<Vec<String>>,
    chaos_mode: Option<String>,
    primary_timeout_ms: Option<u64>,
    breaker_failures: Option<u32>,
    server_lines: Vec<String>,
    raw: Vec<String>,
    env: Vec<(String, String)>,
}

impl Default for StackBuilder {
    fn default() -> StackBuilder {
        StackBuilder {
            order: vec![PRIMARY.into(), FALLBACK.into()],
            search: Some(vec![FALLBACK.into()]),
            chaos_mode: None,
            primary_timeout_ms: None,
            breaker_failures: None,
            server_lines: Vec::new(),
            raw: Vec::new(),
            env: Vec::new(),
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

    /// Adds the `chaos` provider with this `mode` (name it in the order).
    pub fn chaos(mut self, mode: &str) -> StackBuilder {
        self.chaos_mode = Some(mode.into());
        self
    }

    pub fn primary_timeout_ms(mut self, ms: u64) -> StackBuilder {
        self.primary_timeout_ms = Some(ms);
        self
    }

    /// Sets every provider's `breaker_failures`, for tests that make one
    /// provider fail many times in a row and still want it asked each time.
    pub fn breaker_failures(mut self, n: u32) -> StackBuilder {
        self.breaker_failures = Some(n);
        self
    }

    /// Adds a line to `[server]`.
    pub fn server_line(mut self, line: &str) -> StackBuilder {
        self.server_lines.push(line.into());
        self
    }

    /// Appends raw TOML to the config.
    pub fn raw(mut self, text: &str) -> StackBuilder {
        self.raw.push(text.into());
        self
    }

    /// Sets an environment variable for the server.
    pub fn env(mut self, name: &str, value: &str) -> StackBuilder {
        self.env.push((name.into(), value.into()));
        self
    }

    /// The config for doubles at these addresses.
    pub fn config(&self, primary: &PrimaryMock, fallback: &FallbackMock) -> ConfigBuilder {
        let order: Vec<&str> = self.order.iter().map(String::as_str).collect();
        let mut b = ConfigBuilder::new().platform("shortvideo", "live", &order);
        if let Some(search) = &self.search {
            let search: Vec<&str> = search.iter().map(String::as_str).collect();
            b = b.endpoint_order("shortvideo", "search", &search);
        }
        b = b
            .provider(
                PRIMARY,
                "shortvideo_primary",
                &primary.base_url(),
                PRIMARY_KEY_ENV,
            )
            .provider(
                FALLBACK,
                "shortvideo_fallback",
                &fallback.base_url(),
                FALLBACK_KEY_ENV,
            );
        if let Some(ms) = self.primary_timeout_ms {
            b = b.timeout_ms(PRIMARY, ms);
        }
        if let Some(mode) = &self.chaos_mode {
            paths::require_plugin("chaos_plugin");
            b = b
                .provider(CHAOS, "chaos_plugin", "http://127.0.0.1:9", CHAOS_KEY_ENV)
                .settings(CHAOS, &format!("mode = {}", config::toml_str(mode)));
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
        for line in &self.server_lines {
            b = b.server_line(line);
        }
        for text in &self.raw {
            b = b.raw(text);
        }
        b
    }

    /// Starts the doubles (with no routes), writes the config, issues a key
    /// and starts the server.
    pub async fn start(self) -> Stack {
        paths::require_plugin("shortvideo_primary");
        paths::require_plugin("shortvideo_fallback");
        let primary = PrimaryMock::start().await;
        let fallback = FallbackMock::start().await;
        let config = self.config(&primary, &fallback).write();
        let key = issue_key(&config, "e2e");
        let mut env = standard_env();
        env.extend(self.env);
        let server = Server::start_with(&config, &env, &[]);
        let api = Api::new(&server.base_url(), Some(&key));
        Stack {
            server,
            api,
            key,
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

    /// Stops the server and starts a new one on the same config and keys.
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
