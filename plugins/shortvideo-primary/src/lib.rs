//! The `shortvideo` platform's primary provider: a third-party wrapper of the
//! platform's mobile ("aweme") API, authenticated by an `X-Api-Key` header.
//! It serves profiles, posts, one post and comments; it has no user search
//! (its search answers videos), so `search` is left to other providers.
//!
//! # Layout
//!
//! - this file: the [`Provider`] (manifest, settings, one attempt per call)
//!   and `Upstream`, the one place requests are built, so none lacks the
//!   key header.
//! - `wire`: the upstream payloads, how a body's `status_code` and missing
//!   objects are classified, and the mapping to the normalized schema.
//! - `posts`: the two-request `posts` attempt and its cursor.

#![forbid(unsafe_code)]

mod posts;
mod wire;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use plugin_api::{
    attempt, Attempt, Call, Done, Endpoint, ErrorKind, Manifest, Output, Provider, ProviderConfig,
    ProviderError, UpstreamRequest, UpstreamResponse,
};

use wire::{CommentsBody, DetailBody, ProfileBody};

/// P4 answers at most this many comments a call; larger pages take several.
const COMMENTS_PER_CALL: u32 = 50;

/// The primary `shortvideo` provider.
pub struct Primary {
    upstream: Arc<Upstream>,
}

/// The upstream's address and key. Deliberately not `Debug`: it holds the key.
pub(crate) struct Upstream {
    base_url: String,
    api_key: String,
}

impl Upstream {
    fn get(&self, path: &str) -> UpstreamRequest {
        UpstreamRequest::get(&self.base_url, path).header("X-Api-Key", self.api_key.as_str())
    }

    /// P1: a user's profile, and the `sec_uid` P2 needs.
    fn profile(&self, username: &str) -> UpstreamRequest {
        self.get("/v1/user/profile").query("unique_id", username)
    }

    /// P2: a page of a user's videos; `max_cursor` 0 is the first page.
    fn posts(&self, sec_uid: &str, count: u32, max_cursor: u64) -> UpstreamRequest {
        self.get("/v1/user/posts")
            .query("sec_user_id", sec_uid)
            .query("count", count)
            .query("max_cursor", max_cursor)
    }

    /// P3: one video.
    fn detail(&self, id: &str) -> UpstreamRequest {
        self.get("/v1/aweme/detail").query("aweme_id", id)
    }

    /// P4: up to [`COMMENTS_PER_CALL`] comments from offset `cursor`.
    fn comments(&self, id: &str, count: usize, cursor: u64) -> UpstreamRequest {
        self.get("/v1/comment/list")
            .query("aweme_id", id)
            .query("count", count)
            .query("cursor", cursor)
    }
}

impl Provider for Primary {
    fn manifest() -> Manifest {
        Manifest {
            name: "shortvideo-primary".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            platform: "shortvideo".into(),
            endpoints: vec![
                Endpoint::Profile,
                Endpoint::Posts,
                Endpoint::Post,
                Endpoint::Comments,
            ],
        }
    }

    /// Takes no settings. Any key given is refused, so a misplaced or
    /// misspelt setting fails the load instead of being silently ignored.
    fn new(config: ProviderConfig) -> Result<Self, String> {
        let NoSettings {} = config.settings()?;
        Ok(Primary {
            upstream: Arc::new(Upstream {
                base_url: config.base_url,
                api_key: config.api_key,
            }),
        })
    }

    fn begin(&self, call: Call) -> Box<dyn Attempt> {
        let upstream = Arc::clone(&self.upstream);
        match call {
            Call::Profile { username } => attempt::single(upstream.profile(&username), |r| {
                let user = r.json::<ProfileBody>()?.into_user()?;
                Ok(Done::last(Output::Profile(user.into_profile()?)))
            }),
            Call::Posts {
                username,
                count,
                cursor,
            } => posts::begin(upstream, username, count, cursor.as_deref()),
            Call::Post { id } => attempt::single(upstream.detail(&id), |r| {
                let aweme = r.json::<DetailBody>()?.into_aweme()?;
                Ok(Done::last(Output::Post(aweme.into_post()?)))
            }),
            Call::Comments { id, count, cursor } => attempt::offset_paged(
                count,
                COMMENTS_PER_CALL,
                cursor.as_deref(),
                move |offset, size| upstream.comments(&id, size, offset),
                |r: UpstreamResponse<'_>| r.json::<CommentsBody>()?.into_page(),
                Output::Comments,
            ),
            Call::Search { .. } => attempt::fail(ProviderError::new(
                ErrorKind::Unsupported,
                "this upstream has no user search",
            )),
        }
    }
}

/// This provider has no settings; any key is an error naming it.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NoSettings {}

plugin_api::export_provider!(Primary);
