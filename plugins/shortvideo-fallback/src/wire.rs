//! The upstream's payloads: the `{code,msg,data}` wrapper, the typed `data`
//! of each request, and how each maps to the normalized schema.
//!
//! Every field is an `Option` so a missing or `null` one is ours to judge:
//! a required normalized field becomes [`ProviderError::missing`], an extra
//! becomes `None`. Unlisted fields are ignored, and `aweme_id` is never
//! declared, so the opaque media key cannot leak out as a post ID.

use plugin_api::json::{
    self, millis, non_empty, unix_time, Count, Field, Flag, Id, Required, Seconds,
};
use plugin_api::{Comment, ErrorKind, Post, Profile, ProviderError, UpstreamResponse};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::time::Duration;

/// The wrapper around every answer. `data` is kept as raw text until `code`
/// is read, so an error body whose `data` has an odd shape is still
/// classified by its `msg`; raw text keeps every digit of big IDs.
#[derive(Deserialize)]
struct Envelope<'a> {
    code: Option<i64>,
    msg: Option<String>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
}

/// Checks the wrapper and reads its `data` as `T`.
pub fn data<'a, T: Deserialize<'a>>(response: &UpstreamResponse<'a>) -> Result<T, ProviderError> {
    let envelope: Envelope<'a> = response.json()?;
    match envelope.code {
        Some(0) => {}
        Some(code) => return Err(refusal(code, envelope.msg.as_deref().unwrap_or(""))),
        None => return Err(ProviderError::bad_response("body has no `code`")),
    }
    // `code` 0 without the expected object is a soft block, never "not found".
    let data = envelope
        .data
        .ok_or_else(|| ProviderError::bad_response("`code` 0 without `data`"))?;
    plugin_api::json::parse(data.get().as_bytes())
}

/// Classifies a non-zero `code` by its `msg`, the only place the upstream
/// says what went wrong.
fn refusal(code: i64, msg: &str) -> ProviderError {
    match (code, msg.trim()) {
        (-1, "User doesn't exist") => ProviderError::not_found("user doesn't exist"),
        (-1, "Url parsing is failed! Please check url.") => {
            ProviderError::not_found("video doesn't exist")
        }
        (-1, "Free Api Limit: 1 request/second.") => {
            ProviderError::new(ErrorKind::RateLimited, "upstream limit of 1 request/second")
                .retry_after(Duration::from_secs(1))
        }
        // The message text is not logged: an upstream may echo anything
        // into it, our key included.
        _ => ProviderError::bad_response(format!(
            "upstream code {code} with an unrecognised message"
        )),
    }
}

/// Whether a list goes on: the upstream's `cursor` when `hasMore` is true.
pub fn next_cursor(has_more: Option<Flag>, cursor: Option<Id>) -> Option<String> {
    has_more.filter(|f| f.0).and(cursor).and_then(Id::non_empty)
}

/// F2's next cursor: none when it is the cursor just asked for (the next
/// page would repeat this one) or the first page's `0` (the list would
/// start again). Either would send a caller following `next_cursor` round
/// for ever.
pub fn fresh_cursor(has_more: Option<Flag>, cursor: Option<Id>, sent: &str) -> Option<String> {
    next_cursor(has_more, cursor).filter(|next| next != sent && next != "0")
}

/// F5's next offset: none unless it is further on than the one just asked
/// for, for the same reason.
pub fn further_offset(has_more: Option<Flag>, cursor: Option<Id>, sent: &str) -> Option<u64> {
    let sent = sent.parse::<u64>().ok()?;
    let next = next_cursor(has_more, cursor)?.parse::<u64>().ok()?;
    (next > sent).then_some(next)
}

fn count(value: Option<Count>) -> Option<u64> {
    value.map(|c| c.0)
}

/// F1 `data`, and each F5 `user_list` item.
#[derive(Deserialize)]
pub struct Account {
    user: User,
    stats: Stats,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct User {
    id: Option<Id>,
    unique_id: Option<String>,
    nickname: Option<String>,
    verified: Option<Flag>,
    signature: Option<String>,
    avatar_larger: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stats {
    follower_count: Option<Count>,
    following_count: Option<Count>,
    heart_count: Option<Count>,
    video_count: Option<Count>,
}

impl Account {
    /// Whether the account names its user by something that is no handle
    /// ([`json::handle`]): one a caller could never ask for.
    pub fn has_odd_handle(&self) -> bool {
        self.user.unique_id.is_some() && json::handle(self.user.unique_id.clone()).is_none()
    }

    pub fn into_profile(self) -> Result<Profile, ProviderError> {
        let (user, stats) = (self.user, self.stats);
        Ok(Profile {
            username: json::required_handle(user.unique_id, "user.uniqueId")?,
            display_name: user.nickname.required("user.nickname")?,
            followers: stats.follower_count.required("stats.followerCount")?.0,
            verified: user.verified.required("user.verified")?.0,
            id: user.id.and_then(Id::non_empty),
            bio: non_empty(user.signature),
            following: count(stats.following_count),
            likes: count(stats.heart_count),
            videos: count(stats.video_count),
            avatar_url: json::web_url(user.avatar_larger),
        })
    }
}

/// A page's items: `null` is an empty page, absent a bad response.
pub fn items<T>(field: Field<Vec<T>>, name: &str) -> Result<Vec<T>, ProviderError> {
    field.items().ok_or_else(|| ProviderError::missing(name))
}

/// F5 `data`.
#[derive(Deserialize)]
pub struct AccountList {
    #[serde(default)]
    pub user_list: Field<Vec<Account>>,
    pub cursor: Option<Id>,
    #[serde(rename = "hasMore")]
    pub has_more: Option<Flag>,
}

/// F2 `data`.
#[derive(Deserialize)]
pub struct VideoList {
    #[serde(default)]
    pub videos: Field<Vec<Video>>,
    pub cursor: Option<Id>,
    #[serde(rename = "hasMore")]
    pub has_more: Option<Flag>,
}

/// Which field holds the post ID: the only difference between an F2 item
/// and F3 `data`.
#[derive(Clone, Copy)]
pub enum PostId {
    /// F2 items: `video_id`.
    VideoId,
    /// F3: `id`.
    Id,
}

/// An F2 item or F3 `data`.
#[derive(Deserialize)]
pub struct Video {
    id: Option<Id>,
    video_id: Option<Id>,
    title: Option<String>,
    digg_count: Option<Count>,
    comment_count: Option<Count>,
    play_count: Option<Count>,
    share_count: Option<Count>,
    create_time: Option<Count>,
    /// Seconds, maybe with a fraction.
    duration: Option<Seconds>,
    author: Option<Author>,
}

/// The embedded author of a video or comment; only the handle is used.
#[derive(Deserialize)]
struct Author {
    unique_id: Option<String>,
}

fn handle(author: Option<Author>) -> Option<String> {
    json::handle(author.and_then(|a| a.unique_id))
}

impl Video {
    pub fn into_post(self, which: PostId) -> Result<Post, ProviderError> {
        let (id, field) = match which {
            PostId::VideoId => (self.video_id, "video_id"),
            PostId::Id => (self.id, "id"),
        };
        Ok(Post {
            id: id.and_then(Id::non_empty).required(field)?,
            text: self.title.required("title")?,
            likes: self.digg_count.required("digg_count")?.0,
            comments: self.comment_count.required("comment_count")?.0,
            views: count(self.play_count),
            shares: count(self.share_count),
            created_at: unix_time(self.create_time),
            duration_ms: millis(self.duration),
            author: handle(self.author),
        })
    }
}

/// F4 `data`.
#[derive(Deserialize)]
pub struct CommentList {
    #[serde(default)]
    pub comments: Field<Vec<CommentItem>>,
    /// The next offset.
    pub cursor: Option<Id>,
    #[serde(rename = "hasMore")]
    pub has_more: Option<Flag>,
}

#[derive(Deserialize)]
pub struct CommentItem {
    id: Option<Id>,
    text: Option<String>,
    digg_count: Option<Count>,
    reply_total: Option<Count>,
    create_time: Option<Count>,
    user: Option<Author>,
}

impl CommentItem {
    pub fn into_comment(self) -> Result<Comment, ProviderError> {
        Ok(Comment {
            id: self.id.and_then(Id::non_empty).required("id")?,
            text: self.text.required("text")?,
            likes: self.digg_count.required("digg_count")?.0,
            replies: count(self.reply_total),
            created_at: unix_time(self.create_time),
            author: handle(self.user),
        })
    }
}
