//! State that several replicas share: `[state] backend = "redis"` puts API
//! keys, rate-limit buckets, credit accounts, usage counts and a second
//! level of the response cache in one Redis (or Valkey) server, so replicas
//! behind a load balancer act as one service. `"local"` (the default) keeps
//! all of it in the process and the SQLite ledger, and none of this module
//! runs.
//!
//! This module owns the `[state]` section, the one connection (the `redis`
//! crate's connection manager, which reconnects by itself) and how a Redis
//! failure is seen: every operation is bounded by [`OP_TIMEOUT`], counted in
//! `socialgate_state_errors_total{op}` when it fails, and turns the replica
//! `degraded` (`/readyz` still 200) until one succeeds again. What each kind
//! of state does when Redis is away is its own module's decision: [`limits`]
//! fails open, [`credits`] fails closed for a reservation and buffers what
//! was delivered, the keys ([`crate::auth::shared`]) keep the last known
//! set, the cache's second level ([`crate::cache::shared`]) is a miss.
//!
//! Updates that belong together are one Lua script (one round trip, atomic).
//! Every Redis key starts with `[state] prefix`. A standalone server, not
//! Redis Cluster: scripts touch keys they build from the prefix.

pub mod batches;
pub mod credits;
pub mod limits;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::settings::{ConfigError, Context, Secret};

/// The longest any one Redis operation may take before it counts as failed:
/// a request waits at most this for shared state.
pub const OP_TIMEOUT: Duration = Duration::from_millis(500);
/// Default `[state] prefix`.
const DEFAULT_PREFIX: &str = "socialgate:";

/// `[state]`: where the state replicas share lives. A process setting: the
/// backend is chosen once, at start.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum StateConfig {
    /// In the process, and the SQLite ledger.
    #[default]
    Local,
    Redis(RedisConfig),
}

/// `[state] backend = "redis"`.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisConfig {
    /// The `redis://` or `rediss://` URL, read from `url_env`: it may carry
    /// a password, so it is never in the config file, a log or an error.
    pub url: Secret,
    /// What every Redis key starts with.
    pub prefix: String,
}

/// `[state]` as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "the [state] table")]
pub struct RawState {
    backend: Option<String>,
    url_env: Option<String>,
    prefix: Option<String>,
}

impl StateConfig {
    pub fn from_raw(raw: &RawState, cx: &Context) -> Result<StateConfig, ConfigError> {
        match raw.backend.as_deref().unwrap_or("local") {
            "local" => {
                if raw.url_env.is_some() || raw.prefix.is_some() {
                    return Err(cx.invalid(
                        "[state]",
                        "`url_env` and `prefix` are for `backend = \"redis\"`",
                    ));
                }
                Ok(StateConfig::Local)
            }
            "redis" => {
                let var = raw.url_env.as_deref().ok_or_else(|| {
                    cx.invalid("[state] url_env", "required with `backend = \"redis\"`")
                })?;
                let url = cx.secret("[state] url_env", var)?;
                let scheme_ok = ["redis://", "rediss://"]
                    .iter()
                    .any(|s| url.expose().starts_with(s));
                // The value is never echoed: it may hold a password.
                if !scheme_ok {
                    return Err(cx.invalid(
                        "[state] url_env",
                        format!("`{var}` must hold a redis:// or rediss:// URL"),
                    ));
                }
                if redis::Client::open(url.expose()).is_err() {
                    return Err(cx.invalid(
                        "[state] url_env",
                        format!(
                            "`{var}` holds a URL that does not parse: \
                             redis://[:PASSWORD@]HOST[:PORT][/DB] (a port and a DB of digits)"
                        ),
                    ));
                }
                let prefix = raw.prefix.clone().unwrap_or(DEFAULT_PREFIX.to_owned());
                let prefix_ok = (1..=64).contains(&prefix.len())
                    && prefix.bytes().all(|b| b.is_ascii_graphic());
                if !prefix_ok {
                    return Err(cx.invalid(
                        "[state] prefix",
                        "must be 1-64 printable characters, no spaces",
                    ));
                }
                Ok(StateConfig::Redis(RedisConfig { url, prefix }))
            }
            other => Err(cx.invalid(
                "[state] backend",
                format!("must be \"local\" or \"redis\", not `{other}`"),
            )),
        }
    }

    pub fn is_redis(&self) -> bool {
        matches!(self, StateConfig::Redis(_))
    }
}

/// Why shared state could not be used. Never carries the URL.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("shared state (redis): {0}")]
    Redis(#[from] redis::RedisError),
    #[error("shared state (redis): no answer within {} ms", OP_TIMEOUT.as_millis())]
    Timeout,
    #[error("shared state (redis): cannot connect: {0}")]
    Connect(String),
    #[error("shared state (redis): malformed value at `{0}`")]
    Malformed(String),
}

/// The connection to the shared store, and whether it answers.
pub struct Shared {
    conn: ConnectionManager,
    prefix: String,
    /// Whether the last operation succeeded; `/readyz` says `degraded`
    /// while it did not.
    healthy: AtomicBool,
    /// Whether a change of health is logged: a server's operators follow
    /// it; a one-shot command reports its own failure, once.
    logs_health: bool,
    /// Where requests' asks wait for their batch; the task that sends them
    /// starts with the first ([`batches`]).
    batches: OnceLock<mpsc::UnboundedSender<batches::Asked>>,
    /// Asks queued or at Redis, not yet answered, and the release of
    /// batches whose answer was lost, while one is owed ([`batches`]): at
    /// shutdown the last settling batch waits for them, since an ask whose
    /// requester left gives back what it was granted only once its answer
    /// comes, and a lost batch only once its release lands.
    unanswered: crate::sync::Outstanding,
    /// This process's name in the store: what it holds on accounts
    /// ([`batches`]) and the numbers of its settled batches ([`credits`])
    /// are under it. Random, so a restarted process is a new replica and
    /// what the old one held expires with its lease.
    replica: String,
}

impl Shared {
    /// A connection to `config`'s server, made on first use and remade
    /// after every failure by the connection manager. Needs a tokio
    /// runtime; does no I/O.
    pub fn connect(config: &RedisConfig) -> Result<Shared, StateError> {
        let client = redis::Client::open(config.url.expose())
            .map_err(|e| StateError::Connect(format!("{:?}", e.kind())))?;
        // Short timeouts and one retry: a request must not wait on a Redis
        // that is away; the next operation tries again.
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(OP_TIMEOUT))
            .set_response_timeout(Some(OP_TIMEOUT))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let conn = ConnectionManager::new_lazy_with_config(client, manager)?;
        Ok(Shared {
            conn,
            prefix: config.prefix.clone(),
            healthy: AtomicBool::new(true),
            logs_health: true,
            batches: OnceLock::new(),
            unanswered: crate::sync::Outstanding::new(),
            replica: replica_id(),
        })
    }

    /// Queues `asked` for the next batch (starting the task that sends
    /// them with the first); false when that task is gone.
    fn queue(self: &Arc<Self>, asked: batches::Asked) -> bool {
        let batches = self.batches.get_or_init(|| {
            let (batches, asked) = mpsc::unbounded_channel();
            tokio::spawn(batches::send_batches(Arc::downgrade(self), asked));
            batches
        });
        self.unanswered.add(1);
        let queued = batches.send(asked).is_ok();
        if !queued {
            self.answered(1);
        }
        queued
    }

    /// `n` asks were answered (or will never be).
    fn answered(&self, n: usize) {
        self.unanswered.done(n);
    }

    /// Waits until every ask queued so far has its answer, and what those
    /// nobody waited for held is queued to be given back (and what batches
    /// whose answer was lost held is released): at most as long as the
    /// batch at Redis and the one queued behind it may take.
    pub async fn asks_answered(&self) {
        let within = 2 * OP_TIMEOUT + Duration::from_millis(100);
        self.unanswered.none_within(within).await;
    }

    /// `prefix` + `rest`: the name of a Redis key.
    pub fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// `prefix` + `kind` + `name` (`kind` ends in `:`): the name of a key
    /// of one kind.
    pub fn named(&self, kind: &str, name: &str) -> String {
        format!("{}{kind}{name}", self.prefix)
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// This process's name in the store.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// Whether the last operation succeeded.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Runs `op` (named `name` in metrics and logs) on a connection,
    /// bounded by [`OP_TIMEOUT`]; a failure is counted, and the first of a
    /// run of failures logged (an outage is one warning, not one per
    /// request), as is the recovery.
    pub async fn run<T, F, Fut>(&self, name: &'static str, op: F) -> Result<T, StateError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let result = match tokio::time::timeout(OP_TIMEOUT, op(self.conn.clone())).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(StateError::Redis(e)),
            Err(_) => Err(StateError::Timeout),
        };
        self.note(name, result.as_ref().err());
        result
    }

    /// [`Shared::connect`] for a command that ends with its one operation:
    /// its failure is the command's error, not also a log line.
    pub fn connect_for_command(config: &RedisConfig) -> Result<Shared, StateError> {
        Ok(Shared {
            logs_health: false,
            ..Shared::connect(config)?
        })
    }

    /// Records how an operation named `name` went.
    pub fn note(&self, name: &'static str, error: Option<&StateError>) {
        if !self.logs_health {
            return;
        }
        match error {
            None => {
                if !self.healthy.swap(true, Ordering::Relaxed) {
                    tracing::info!("shared state (redis) answers again");
                }
            }
            Some(e) => {
                crate::metrics::state_error(name);
                if self.healthy.swap(false, Ordering::Relaxed) {
                    tracing::warn!(op = name, "shared state unavailable, degraded: {e}");
                } else {
                    tracing::debug!(op = name, "{e}");
                }
            }
        }
    }
}

/// A random name for this process in the store.
fn replica_id() -> String {
    let mut id = [0u8; 8];
    let _ = getrandom::getrandom(&mut id);
    format!("{:016x}", u64::from_le_bytes(id))
}

/// The current UTC day, `YYYY-MM-DD`, as the ledger counts days.
pub fn utc_day() -> String {
    crate::ledger::utc_day(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(text: &str) -> Result<StateConfig, ConfigError> {
        let env = |name: &str| match name {
            "R" => Some("redis://:pw@127.0.0.1:6379/0".to_owned()),
            "BAD" => Some("http://pw@example".to_owned()),
            _ => None,
        };
        let raw: RawState = toml::from_str(text).unwrap();
        let cx = Context::new(Path::new("/etc/sg/platforms.toml"), &env);
        StateConfig::from_raw(&raw, &cx)
    }

    #[test]
    fn backends_and_their_settings() {
        assert_eq!(parse("").unwrap(), StateConfig::Local);
        let StateConfig::Redis(redis) = parse("backend = \"redis\"\nurl_env = \"R\"").unwrap()
        else {
            panic!("redis")
        };
        assert_eq!(redis.prefix, "socialgate:");
        let cases = [
            ("backend = \"redis\"", "url_env"),
            ("backend = \"redis\"\nurl_env = \"UNSET\"", "UNSET"),
            ("backend = \"redis\"\nurl_env = \"BAD\"", "redis://"),
            (
                "backend = \"redis\"\nurl_env = \"R\"\nprefix = \"a b\"",
                "prefix",
            ),
            ("backend = \"memcached\"", "backend"),
            ("url_env = \"R\"", "for `backend = \"redis\"`"),
        ];
        for (text, needle) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
            assert!(!e.contains("pw"), "never the URL: {e}");
        }
    }
}
