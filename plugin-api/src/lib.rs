//! The stable interface between the socialgate host and its provider plugins.
//!
//! A provider is a small crate built as a `cdylib` that turns one upstream
//! API into the normalized [`schema`]. It never does I/O itself: the host
//! asks it for its next [`Step`](Next) — an [`UpstreamRequest`] to perform, or
//! the finished [`Done`] answer, or a classified [`ProviderError`] — performs
//! each request with its own HTTP client, timeouts and limits, and feeds the
//! [`UpstreamResponse`] back. This keeps sockets, runtimes and secrets'
//! transport in one place and makes a provider a pure, testable function of
//! the bytes it is given.
//!
//! # Layout
//!
//! - [`call`]: the endpoint kinds, their parameters and validation.
//! - [`schema`]: [`Profile`], [`Post`], [`Comment`]; the one definition of
//!   what callers receive.
//! - [`provider`]: the [`Provider`] and [`Attempt`] traits a plugin
//!   implements, and [`ProviderError`] with its [`ErrorKind`]s.
//! - [`upstream`]: the request and response types of the upstream exchange.
//! - [`attempt`]: ready-made attempts (one request; offset-paged lists).
//! - [`json`]: lenient readers for upstream JSON (exact big IDs, string
//!   counters, 0/1 flags).
//! - [`canonical`]: JSON in serde_json's one exact form, as the boundary
//!   carries it: written fast, read back strictly.
//! - [`log`]: logging through the host.
//! - [`ffi`]: the `abi_stable` boundary. Plugins only use
//!   [`export_provider!`] from it.
//! - `testing` (cargo feature `testing`): the test kit that drives a
//!   provider through that boundary against scripted upstream replies, and
//!   the conformance suite of the host's rules.
//!
//! # Writing a provider
//!
//! ```
//! use plugin_api::{attempt, json, Attempt, Call, Done, Endpoint, ErrorKind, Manifest, Output,
//!                  Profile, Provider, ProviderConfig, ProviderError, UpstreamRequest};
//! use serde::Deserialize;
//!
//! pub struct Example {
//!     config: ProviderConfig,
//! }
//!
//! #[derive(Deserialize)]
//! struct User {
//!     handle: String,
//!     name: String,
//!     fans: json::Count,
//! }
//!
//! impl Provider for Example {
//!     fn manifest() -> Manifest {
//!         Manifest {
//!             name: "example".into(),
//!             version: env!("CARGO_PKG_VERSION").into(),
//!             platform: "example".into(),
//!             endpoints: vec![Endpoint::Profile],
//!         }
//!     }
//!
//!     fn new(config: ProviderConfig) -> Result<Self, String> {
//!         Ok(Example { config })
//!     }
//!
//!     fn begin(&self, call: Call) -> Box<dyn Attempt> {
//!         let Call::Profile { username } = call else {
//!             return attempt::fail(ProviderError::new(ErrorKind::Unsupported, "profile only"));
//!         };
//!         let request = UpstreamRequest::get(&self.config.base_url, "/users")
//!             .query("handle", &username)
//!             .bearer(&self.config.api_key);
//!         attempt::single(request, |response| {
//!             let user: User = response.json()?;
//!             Ok(Done::last(Output::Profile(Profile {
//!                 // Without a leading `@`, and only a handle.
//!                 username: json::required_handle(Some(user.handle), "handle")?,
//!                 display_name: user.name,
//!                 followers: user.fans.0,
//!                 verified: false,
//!                 id: None,
//!                 bio: None,
//!                 following: None,
//!                 likes: None,
//!                 videos: None,
//!                 avatar_url: None,
//!             })))
//!         })
//!     }
//! }
//!
//! plugin_api::export_provider!(Example);
//! ```
//!
//! With `crate-type = ["cdylib"]` in its `Cargo.toml`, the crate builds
//! `libexample.so`; name it in `platforms.toml` and the host serves
//! `/v1/example/profile` with no change to the host.
//!
//! Rules the host relies on:
//! - Return [`ErrorKind::NotFound`] only when the upstream says the user or
//!   post does not exist: it ends the failover chain. A soft block or an
//!   empty answer is [`ErrorKind::BadResponse`], so the next provider tries.
//! - Never put the upstream key in a log line or an error message.
//! - A panic is caught at the boundary and counts as one failed attempt,
//!   but it is still a bug: return errors instead.
//!
//! # Versioning
//!
//! This crate is versioned 1.x: `abi_stable` refuses a plugin built against
//! another major version, and checks the layout of every type that crosses.
//! Minor versions add items, never a change to the interface's layout: a
//! new module function or trait method would make a host refuse every
//! library built before it, so it waits for a major version.

pub mod attempt;
pub mod call;
pub mod canonical;
pub mod ffi;
pub mod json;
pub mod log;
pub mod provider;
pub mod schema;
#[cfg(feature = "testing")]
pub mod testing;
pub mod upstream;

pub use call::{Call, Endpoint, ParamError};
pub use provider::{
    Attempt, Done, ErrorKind, Manifest, Next, Output, Provider, ProviderConfig, ProviderError,
};
pub use schema::{Comment, Post, Profile, Timestamp};
pub use upstream::{UpstreamRequest, UpstreamResponse};
