//! socialgate: a read-only HTTP API over public short-video data, served by
//! failover chains of provider plugins.
//!
//! # Layout
//!
//! A request flows one way through these modules:
//!
//! - [`server`] accepts connections (for every listener, with the same
//!   hardening; HTTP/1.1 and HTTP/2, over [`server::tls`] when configured;
//!   heads hyper refuses made envelopes by [`server::refusal`]) and holds
//!   what every answer is made of: [`server::request_id`], the envelopes
//!   of [`server::response`], and [`server::cors`].
//! - [`http`] is the routes: [`http::head`] refuses what a head hyper read
//!   may still get wrong and gives the path one spelling; [`http::api`]
//!   runs each request's checks in order (method, key, platform, endpoint,
//!   parameters), answers a key's `GET /v1/account`, and answers with
//!   [`server::response`]'s envelopes, represented for the caller by
//!   [`http::encoding`] (codings, entity tags) and [`server::cors`].
//! - [`auth`] recognises API keys (and issues and revokes them);
//!   [`billing`] says what an answer costs, whether a key may spend it
//!   (free credits plus credit packs, less what it spent) and books what
//!   it spent, in the [`ledger`] (credits per key, day and endpoint, and
//!   the packs granted, in SQLite).
//! - [`routing`] is the table from platform and endpoint to a chain of
//!   providers; [`state`] holds the current table as one swappable snapshot.
//! - [`cache`] keeps answers for their time to live and shares one fetch
//!   between callers asking the same at once; [`http::answer`] decides
//!   whether an answer comes from it or from the chain.
//! - [`chain`] asks the chain's providers in order; each attempt drives a
//!   plugin's steps and performs its requests through [`upstream`];
//!   [`chain::decision`] says what a failed attempt means.
//! - [`resilience`] holds the small decisions that keep it fast when things
//!   fail: breakers, the request deadline, the concurrency gates (server and
//!   provider), rate limits, and what keeps an abandoned request's upstream
//!   work inside them.
//! - [`cursor`] seals a provider's upstream cursor into the opaque token
//!   callers page with.
//! - [`error`] is the catalogue of every error a caller can see.
//! - [`metrics`] names and records every exported series, from plain
//!   values its callers pass, served on the operators' own listener by
//!   [`http::admin`].
//! - [`shared`] (`[state] backend = "redis"`) is the Redis connection
//!   replicas share, the global rate limit and the credits and usage
//!   [`billing`] books; the keys ([`auth::shared`]) and the cache's second
//!   level ([`cache::shared`]) are kept there by their owners.
//!
//! Around it: [`config`] reads `platforms.toml` into a process part and a
//! serving part, composing the sections that the modules above own and
//! validate, with [`settings`] (the reading context, the error, secrets,
//! `[server]` as written: a leaf every section imports, so imports flow one
//! way); [`plugins`] loads provider libraries ([`redact`] takes the
//! upstream keys it hands them out of what they say), [`reload`] rebuilds
//! the snapshot when the config, the keys or a library changes (and
//! follows the shared keys), [`lifecycle`] starts the process and shuts it
//! down in one documented order, [`logging`] sets up the log lines,
//! [`runtime`] builds the process's one runtime, [`cli`] is the command
//! line (with [`scaffold`], the provider author's `plugin new` and
//! `plugin inspect`), and [`demo`] runs everything against built-in
//! sandbox upstreams. [`files`] creates the files the process writes for
//! itself (private, exclusive, never through a link) and warns about
//! trusted files others could change.

// Only the CLI is used from outside (main.rs): the rest is crate-private,
// so the compiler reports what nothing uses. This map links them all; CI checks the links with
// `cargo doc -p socialgate --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub(crate) mod auth;
pub(crate) mod billing;
pub(crate) mod cache;
pub(crate) mod chain;
pub mod cli;
pub(crate) mod config;
pub(crate) mod cursor;
pub(crate) mod demo;
pub(crate) mod error;
pub(crate) mod files;
pub(crate) mod http;
pub(crate) mod ledger;
pub(crate) mod lifecycle;
pub(crate) mod logging;
pub(crate) mod metrics;
pub(crate) mod plugins;
pub(crate) mod redact;
pub(crate) mod reload;
pub(crate) mod resilience;
pub(crate) mod routing;
pub(crate) mod runtime;
pub(crate) mod scaffold;
pub(crate) mod server;
pub(crate) mod settings;
pub(crate) mod shared;
pub(crate) mod state;
pub(crate) mod sync;
pub(crate) mod upstream;
