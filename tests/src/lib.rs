//! The end-to-end harness: the real `socialgate` binary and the real plugin
//! libraries, started against wiremock doubles of the two upstreams.
//!
//! Build everything first (`cargo build --workspace`): `cargo test` alone
//! builds no `cdylib` plugin and not the binary the tests start.
//!
//! # Layout
//!
//! - [`paths`]: where the built binary and plugin libraries are; scratch
//!   folders beside them (not `/tmp`, which may forbid loading a library).
//! - [`config`]: a builder that writes `platforms.toml` into a scratch folder.
//! - [`process`]: running the binary: `serve` as a [`Server`] killed on drop,
//!   one-shot commands (`keys`, `check`) with a bounded wait, either one
//!   after a shell prelude in the same process (a umask, a file planted at a
//!   name holding its PID).
//! - [`api`]: an HTTP client for the service and [`Answer`], a response read
//!   with its JSON, its headers and the order of its keys.
//! - [`upstream`]: [`PrimaryMock`] and [`FallbackMock`], contract-shaped
//!   doubles of the two upstreams, and the fixture bodies they answer with.
//! - [`stack`]: [`Stack`], the set-up of one test: both doubles (or any
//!   upstream as the primary), a config with the test's failover order and
//!   resilience keys, keys, a running server and a client; and
//!   [`eventually`], a bounded poll.
//! - [`raw_upstream`]: a raw-TCP upstream double for the faults wiremock
//!   cannot express (reset mid-body, silence, trickling, chunked bodies) and
//!   a closed port.
//! - [`openapi`]: [`openapi::Contract`], the generated API document as a contract:
//!   answers checked against the schema and headers of their path, method and
//!   status, and what was exercised.
//! - [`operator`]: the operator's side: signals, the admin listener and its
//!   Prometheus text, requests with chosen headers or on a held connection,
//!   and `keys usage`.
//! - [`redis`]: a real `redis-server` (AOF, killable with SIGKILL and
//!   restartable from its AOF; installed by `scripts/install-redis.sh` when
//!   missing) and [`redis::Replicas`], several servers sharing it.
//! - [`reload`]: changing a running server's files as an operator does
//!   (renamed into place, library copies with appended bytes), waiting for
//!   lines of its log, and its memory from `/proc`.

pub mod api;
pub mod config;
pub mod openapi;
pub mod operator;
pub mod paths;
pub mod process;
pub mod raw_upstream;
pub mod redis;
pub mod reload;
pub mod stack;
pub mod tls_upstream;
pub mod upstream;

pub use api::{Answer, Api};
pub use config::{Config, ConfigBuilder};
pub use process::{issue_key, run_cli, run_cli_after, CliOutput, Server};
pub use stack::{eventually, Stack, StackBuilder};
pub use upstream::{FallbackMock, PrimaryMock};

/// The normalized profile's keys, in answer order (docs/api.md, "Objects").
pub const PROFILE_KEYS: [&str; 10] = [
    "username",
    "display_name",
    "followers",
    "verified",
    "id",
    "bio",
    "following",
    "likes",
    "videos",
    "avatar_url",
];

/// The normalized post's keys, in answer order (docs/api.md, "Objects").
pub const POST_KEYS: [&str; 9] = [
    "id",
    "text",
    "likes",
    "comments",
    "views",
    "shares",
    "created_at",
    "duration_ms",
    "author",
];

/// The normalized comment's keys, in answer order (docs/api.md, "Objects").
pub const COMMENT_KEYS: [&str; 6] = ["id", "text", "likes", "replies", "created_at", "author"];
