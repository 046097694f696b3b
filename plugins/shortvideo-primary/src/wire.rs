//! The primary upstream's JSON payloads as serde structs, and how each one
//! becomes a normalized value or a classified error.
//!
//! Every field is optional here so that a missing one is ours to classify (a
//! required field becomes [`ProviderError::missing`], an extra one `None`)
//! instead of making the whole body unreadable. IDs are [`Id`] and counters
//! [`Count`] because either may arrive as a string or a bare integer; bodies
//! are read straight from bytes, never through `serde_json::Value`, so IDs
//! beyond 2^53 keep every digit. Fields not named here are ignored.

use plugin_api::attempt::Page;
use plugin_api::json::{self, Count, Field, Flag, Id, Millis, Required};
use plugin_api::{Comment, ErrorKind, Post, Profile, ProviderError};
use serde::Deserialize;

/// Fails unless the body's `status_code` is 0 (ok).
///
/// `status_msg` is left out of every message on purpose: it is upstream text
/// we do not control, and the numeric code is what the contract defines.
fn check(status_code: Option<i64>) -> Result<(), ProviderError> {
    match status_code {
        Some(0) => Ok(()),
        Some(2065) => Err(ProviderError::not_found(
            "user does not exist (status_code 2065)",
        )),
        Some(2053) => Err(ProviderError::not_found(
            "video does not exist (status_code 2053)",
        )),
        Some(2098) => Err(ProviderError::new(
            ErrorKind::Transient,
            "upstream asks to try again later (status_code 2098)",
        )),
        Some(code) => Err(ProviderError::bad_response(format!(
            "upstream status_code {code}"
        ))),
        None => Err(ProviderError::bad_response("answer has no status_code")),
    }
}

/// `status_code` 0 without the object asked for: the upstream is quietly
/// blocking us. Never "not found", so the next provider gets its turn.
fn soft_block(object: &str) -> ProviderError {
    ProviderError::bad_response(format!("soft block: status_code 0 without `{object}`"))
}

/// A page's items: absent is a soft block, `null` an empty page.
fn items<T>(field: Field<Vec<T>>, name: &str) -> Result<Vec<T>, ProviderError> {
    field.items().ok_or_else(|| soft_block(name))
}

/// The next page's cursor when `has_more` says there is one. An empty page
/// ends the list whatever `has_more` claims, so no caller is sent round the
/// same cursor for ever.
fn next_cursor(
    has_more: Option<Flag>,
    cursor: Option<Count>,
    empty: bool,
    name: &str,
) -> Result<Option<u64>, ProviderError> {
    if empty || !has_more.is_some_and(|Flag(more)| more) {
        return Ok(None);
    }
    cursor.required(name).map(|Count(c)| Some(c))
}

/// P1 `/v1/user/profile`.
#[derive(Deserialize)]
pub struct ProfileBody {
    status_code: Option<i64>,
    user: Option<User>,
}

impl ProfileBody {
    pub fn into_user(self) -> Result<User, ProviderError> {
        check(self.status_code)?;
        self.user.ok_or_else(|| soft_block("user"))
    }
}

/// P1's `user`: the only place with a user's real counters and `sec_uid`.
#[derive(Deserialize)]
pub struct User {
    uid: Option<Id>,
    unique_id: Option<String>,
    nickname: Option<String>,
    signature: Option<String>,
    /// The key P2 wants instead of the username.
    pub sec_uid: Option<String>,
    custom_verify: Option<String>,
    enterprise_verify_reason: Option<String>,
    follower_count: Option<Count>,
    following_count: Option<Count>,
    total_favorited: Option<Count>,
    aweme_count: Option<Count>,
    avatar_larger: Option<Image>,
}

impl User {
    pub fn into_profile(self) -> Result<Profile, ProviderError> {
        Ok(Profile {
            username: json::required_handle(self.unique_id, "user.unique_id")?,
            display_name: self.nickname.required("user.nickname")?,
            followers: self.follower_count.required("user.follower_count")?.0,
            // `verification_type` is not a verified flag; these two are.
            verified: json::non_empty(self.custom_verify).is_some()
                || json::non_empty(self.enterprise_verify_reason).is_some(),
            id: self.uid.and_then(Id::non_empty),
            bio: json::non_empty(self.signature),
            following: self.following_count.map(|Count(n)| n),
            likes: self.total_favorited.map(|Count(n)| n),
            videos: self.aweme_count.map(|Count(n)| n),
            avatar_url: json::web_url(
                self.avatar_larger
                    .and_then(|image| image.url_list?.into_iter().next()),
            ),
        })
    }
}

#[derive(Deserialize)]
struct Image {
    url_list: Option<Vec<String>>,
}

/// The `author` of a post or `user` of a comment. Only the handle is read:
/// the upstream zeroes the counters of embedded users.
#[derive(Deserialize)]
struct Handle {
    unique_id: Option<String>,
}

fn handle(embedded: Option<Handle>) -> Option<String> {
    embedded.and_then(|h| json::handle(h.unique_id))
}

/// P2 `/v1/user/posts`.
#[derive(Deserialize)]
pub struct PostsBody {
    status_code: Option<i64>,
    #[serde(default)]
    aweme_list: Field<Vec<Aweme>>,
    max_cursor: Option<Count>,
    has_more: Option<Flag>,
}

impl PostsBody {
    /// The posts and, when there are more, the `max_cursor` that asks for them.
    pub fn into_page(self) -> Result<Page<Post>, ProviderError> {
        check(self.status_code)?;
        let items = items(self.aweme_list, "aweme_list")?
            .into_iter()
            .map(Aweme::into_post)
            .collect::<Result<Vec<_>, _>>()?;
        let next = next_cursor(
            self.has_more,
            self.max_cursor,
            items.is_empty(),
            "max_cursor",
        )?;
        Ok(Page { items, next })
    }
}

/// P3 `/v1/aweme/detail`.
#[derive(Deserialize)]
pub struct DetailBody {
    status_code: Option<i64>,
    #[serde(default)]
    aweme_detail: Field<Aweme>,
    filter_detail: Option<FilterDetail>,
}

/// Present (as an object) when the upstream filtered the video out: deleted,
/// private or banned. Its contents are not needed.
#[derive(Deserialize)]
struct FilterDetail {}

impl DetailBody {
    pub fn into_aweme(self) -> Result<Aweme, ProviderError> {
        check(self.status_code)?;
        match (self.aweme_detail, self.filter_detail) {
            (Field::Value(aweme), _) => Ok(aweme),
            (Field::Null, Some(FilterDetail {})) => Err(ProviderError::not_found(
                "video does not exist (aweme_detail null with filter_detail)",
            )),
            _ => Err(soft_block("aweme_detail")),
        }
    }
}

/// A video, as P2 lists them and P3 details one.
#[derive(Deserialize)]
pub struct Aweme {
    aweme_id: Option<Id>,
    desc: Option<String>,
    create_time: Option<Count>,
    author: Option<Handle>,
    statistics: Option<Statistics>,
    video: Option<Video>,
}

#[derive(Deserialize, Default)]
struct Statistics {
    digg_count: Option<Count>,
    comment_count: Option<Count>,
    play_count: Option<Count>,
    share_count: Option<Count>,
}

#[derive(Deserialize)]
struct Video {
    /// Already milliseconds; a fraction is rounded.
    duration: Option<Millis>,
}

impl Aweme {
    pub fn into_post(self) -> Result<Post, ProviderError> {
        let stats = self.statistics.unwrap_or_default();
        Ok(Post {
            id: self.aweme_id.and_then(Id::non_empty).required("aweme_id")?,
            text: self.desc.required("desc")?,
            likes: stats.digg_count.required("statistics.digg_count")?.0,
            comments: stats.comment_count.required("statistics.comment_count")?.0,
            views: stats.play_count.map(|Count(n)| n),
            shares: stats.share_count.map(|Count(n)| n),
            created_at: json::unix_time(self.create_time),
            duration_ms: self.video.and_then(|v| v.duration).and_then(Millis::whole),
            author: handle(self.author),
        })
    }
}

/// P4 `/v1/comment/list`.
#[derive(Deserialize)]
pub struct CommentsBody {
    status_code: Option<i64>,
    #[serde(default)]
    comments: Field<Vec<CommentItem>>,
    /// The offset of the next page.
    cursor: Option<Count>,
    has_more: Option<Flag>,
}

impl CommentsBody {
    pub fn into_page(self) -> Result<Page<Comment>, ProviderError> {
        check(self.status_code)?;
        let items = items(self.comments, "comments")?
            .into_iter()
            .map(CommentItem::into_comment)
            .collect::<Result<Vec<_>, _>>()?;
        let next = next_cursor(self.has_more, self.cursor, items.is_empty(), "cursor")?;
        Ok(Page { items, next })
    }
}

#[derive(Deserialize)]
struct CommentItem {
    cid: Option<Id>,
    text: Option<String>,
    digg_count: Option<Count>,
    reply_comment_total: Option<Count>,
    create_time: Option<Count>,
    user: Option<Handle>,
}

impl CommentItem {
    fn into_comment(self) -> Result<Comment, ProviderError> {
        Ok(Comment {
            id: self.cid.and_then(Id::non_empty).required("cid")?,
            text: self.text.required("text")?,
            likes: self.digg_count.required("digg_count")?.0,
            replies: self.reply_comment_total.map(|Count(n)| n),
            created_at: json::unix_time(self.create_time),
            author: handle(self.user),
        })
    }
}
