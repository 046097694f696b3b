#![forbid(unsafe_code)]
//! The `shortvideo` fallback provider: a RapidAPI-style `{code,msg,data}`
//! wrapper of the platform (fixtures/upstreams/CONTRACT.md, "Fallback").
//!
//! # Layout
//!
//! - this file: configuration, the upstream request of each endpoint and
//!   the reading of its answer.
//! - `wire`: the upstream payloads, the wrapper's error classification,
//!   and the mapping to the normalized schema.

use plugin_api::attempt::{self, Page};
use plugin_api::{
    Attempt, Call, Done, Endpoint, ErrorKind, Manifest, Output, Provider, ProviderConfig,
    ProviderError, UpstreamRequest, UpstreamResponse,
};
use serde::Deserialize;
use std::sync::Arc;

mod wire;
use wire::PostId;

/// F4 gives at most this many comments a call.
const COMMENTS_PER_CALL: u32 = 50;

/// The provider; one value serves every request.
pub struct Fallback {
    upstream: Arc<Upstream>,
}

/// Where requests go and how they authenticate. No `Debug`: it holds the key.
struct Upstream {
    base_url: String,
    api_key: String,
    host: String,
}

impl Upstream {
    /// A GET with the two RapidAPI headers every request needs.
    fn get(&self, path: &str) -> UpstreamRequest {
        UpstreamRequest::get(&self.base_url, path)
            .header("X-RapidAPI-Key", self.api_key.as_str())
            .header("X-RapidAPI-Host", self.host.as_str())
    }
}

/// `[providers.NAME.settings]`; an unknown key is a typo to report, not ignore.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Settings {
    /// The `X-RapidAPI-Host` value, when it differs from the base URL's host.
    rapidapi_host: Option<String>,
}

/// The host of `base_url` without scheme, userinfo, port or path, as RapidAPI
/// expects in `X-RapidAPI-Host`. IPv6 literals keep their brackets.
fn host_of(base_url: &str) -> Option<&str> {
    let (_scheme, rest) = base_url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if host_port.starts_with('[') {
        &host_port[..=host_port.find(']')?]
    } else {
        host_port.split(':').next()?
    };
    (!host.is_empty()).then_some(host)
}

/// `settings.rapidapi_host` as given, if it can be sent: it is a header
/// value on every request, and one the host would refuse would fail every
/// request, so `check` refuses it instead.
fn rapidapi_host(host: String) -> Result<String, String> {
    if host.trim().is_empty() {
        return Err("settings.rapidapi_host is empty".into());
    }
    if !host.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "settings.rapidapi_host must be a host name: no spaces or control characters".into(),
        );
    }
    Ok(host)
}

impl Provider for Fallback {
    fn manifest() -> Manifest {
        Manifest {
            name: "shortvideo-fallback".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            platform: "shortvideo".into(),
            endpoints: Endpoint::ALL.to_vec(),
        }
    }

    fn new(config: ProviderConfig) -> Result<Self, String> {
        let settings: Settings = config.settings()?;
        // The URL is not echoed: it might carry credentials as userinfo.
        let base_host = host_of(&config.base_url).ok_or("base_url has no host")?;
        let host = match settings.rapidapi_host {
            Some(host) => rapidapi_host(host)?,
            None => base_host.to_owned(),
        };
        Ok(Fallback {
            upstream: Arc::new(Upstream {
                base_url: config.base_url,
                api_key: config.api_key,
                host,
            }),
        })
    }

    fn begin(&self, call: Call) -> Box<dyn Attempt> {
        let up = &self.upstream;
        let (subject, start) = (call.subject(), call.cursor());
        // F2 and F5 take the upstream's cursor as is; 0 asks for the first page.
        let cursor = start.unwrap_or("0");
        match &call {
            Call::Profile { .. } => attempt::single(
                up.get("/user/info").query("unique_id", subject),
                read_profile,
            ),
            Call::Posts { count, .. } => {
                let sent = cursor.to_owned();
                attempt::single(
                    up.get("/user/posts")
                        .query("unique_id", subject)
                        .query("count", count)
                        .query("cursor", cursor),
                    move |response: UpstreamResponse<'_>| read_posts(response, &sent),
                )
            }
            Call::Post { .. } => {
                attempt::single(up.get("/").query("url", subject).query("hd", 1), read_post)
            }
            Call::Comments { count, .. } => {
                let (up, id) = (Arc::clone(up), subject.to_owned());
                let request = move |offset: u64, size: usize| {
                    up.get("/comment/list")
                        .query("url", &id)
                        .query("count", size)
                        .query("cursor", offset)
                };
                attempt::offset_paged(
                    *count,
                    COMMENTS_PER_CALL,
                    start,
                    request,
                    read_comments,
                    Output::Comments,
                )
            }
            Call::Search { count, .. } => {
                let (sent, count) = (cursor.to_owned(), *count);
                attempt::single(
                    up.get("/user/search")
                        .query("keywords", subject)
                        .query("count", count)
                        .query("cursor", cursor),
                    move |response: UpstreamResponse<'_>| read_search(response, &sent, count),
                )
            }
        }
    }
}

fn read_profile(response: UpstreamResponse<'_>) -> Result<Done, ProviderError> {
    let account: wire::Account = wire::data(&response)?;
    Ok(Done::last(Output::Profile(account.into_profile()?)))
}

fn read_posts(response: UpstreamResponse<'_>, sent: &str) -> Result<Done, ProviderError> {
    let list: wire::VideoList = wire::data(&response)?;
    let posts = wire::items(list.videos, "videos")?
        .into_iter()
        .map(|v| v.into_post(PostId::VideoId));
    Ok(Done {
        output: Output::Posts(posts.collect::<Result<_, _>>()?),
        next_cursor: wire::fresh_cursor(list.has_more, list.cursor, sent),
    })
}

fn read_post(response: UpstreamResponse<'_>) -> Result<Done, ProviderError> {
    let video: wire::Video = wire::data(&response)?;
    Ok(Done::last(Output::Post(video.into_post(PostId::Id)?)))
}

fn read_comments(
    response: UpstreamResponse<'_>,
) -> Result<Page<plugin_api::Comment>, ProviderError> {
    let list: wire::CommentList = wire::data(&response)?;
    let next = wire::next_cursor(list.has_more, list.cursor)
        .map(|c| c.parse::<u64>())
        .transpose()
        .map_err(|_| ProviderError::bad_response("comment `cursor` is not an offset"))?;
    let items = wire::items(list.comments, "comments")?
        .into_iter()
        .map(wire::CommentItem::into_comment);
    Ok(Page {
        items: items.collect::<Result<_, _>>()?,
        next,
    })
}

/// F5's `cursor` is an offset. A page longer than `count` is cut to it,
/// and the next page starts right after what was kept.
fn read_search(
    response: UpstreamResponse<'_>,
    sent: &str,
    count: u32,
) -> Result<Done, ProviderError> {
    // A search has nothing to be missing: the wrapper's "User doesn't
    // exist" here is an upstream gone off its contract, not an answer.
    let list: wire::AccountList = wire::data(&response).map_err(|e| match e.kind() {
        ErrorKind::NotFound => ProviderError::bad_response(format!("search said {}", e.message())),
        _ => e,
    })?;
    let mut next_offset = wire::further_offset(list.has_more, list.cursor, sent);
    let mut accounts = wire::items(list.user_list, "user_list")?;
    if accounts.len() > count as usize {
        accounts.truncate(count as usize);
        next_offset = sent
            .parse::<u64>()
            .ok()
            .and_then(|offset| offset.checked_add(u64::from(count)));
    }
    // An account whose handle no caller could ask for is left out: one odd
    // account must not cost the page, since search has no other provider.
    let profiles = accounts
        .into_iter()
        .filter(|account| !account.has_odd_handle())
        .map(wire::Account::into_profile);
    Ok(Done {
        output: Output::Search(profiles.collect::<Result<_, _>>()?),
        next_cursor: next_offset.map(|offset| offset.to_string()),
    })
}

plugin_api::export_provider!(Fallback);

#[cfg(test)]
mod tests;
