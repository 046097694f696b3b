//! What a provider author implements: [`Provider`] to set up and to start
//! work, [`Attempt`] to drive one request to an answer one upstream exchange
//! at a time.

use crate::schema::{is_handle, is_id, MAX_ID_DIGITS};
use crate::{Call, Comment, Endpoint, Post, Profile, UpstreamRequest, UpstreamResponse};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// Who a provider is and what it serves. The host routes by it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The provider's name, e.g. `shortvideo-primary`.
    pub name: String,
    /// The provider's own version.
    pub version: String,
    /// The platform it serves, as in `/v1/{platform}/...`.
    pub platform: String,
    /// The endpoints it serves; the host never asks it for any other.
    pub endpoints: Vec<Endpoint>,
}

/// A provider's configuration, from its `[providers.NAME]` table.
#[derive(Clone, Serialize, Deserialize)]
pub struct ProviderConfig {
    /// The upstream's base URL; may or may not end in `/`.
    pub base_url: String,
    /// The upstream key, read by the host from the variable named by
    /// `api_key_env`. Secret: never log it or put it in an error.
    pub api_key: String,
    /// The `[providers.NAME.settings]` table as given, or an empty object.
    pub settings: serde_json::Value,
}

impl ProviderConfig {
    /// The `settings` table read into the provider's own type; an absent
    /// or empty table is `T::default()` (the host passes an absent one as an
    /// empty object). Give `T` `#[serde(deny_unknown_fields)]` so a misspelt
    /// or misplaced setting fails the load instead of being ignored, and
    /// `#[serde(default)]` if a table that sets only some fields should take
    /// the defaults of the others. The error is for the operator and names
    /// the offending key.
    pub fn settings<T: DeserializeOwned + Default>(&self) -> Result<T, String> {
        match &self.settings {
            serde_json::Value::Null => Ok(T::default()),
            serde_json::Value::Object(table) if table.is_empty() => Ok(T::default()),
            value => T::deserialize(value).map_err(|e| format!("settings: {e}")),
        }
    }
}

/// The key is left out.
impl fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("settings", &self.settings)
            .finish()
    }
}

/// A provider plugin. Implement it and export it with
/// [`export_provider!`](crate::export_provider).
///
/// One value serves every request of the process, from many threads at once.
pub trait Provider: Send + Sync + Sized + 'static {
    /// Who this provider is; called once when the library is loaded.
    fn manifest() -> Manifest;

    /// Sets up from configuration. An `Err` fails the load with that reason,
    /// which the operator sees; keep the key out of it.
    fn new(config: ProviderConfig) -> Result<Self, String>;

    /// Starts work on one request. Only calls for endpoints in the manifest
    /// arrive here.
    fn begin(&self, call: Call) -> Box<dyn Attempt>;
}

/// One request being served: the host calls [`step`](Attempt::step) first
/// with `None`, then with the response to each request it returned, until it
/// returns [`Next::Done`] or an error. The host bounds the number of steps
/// and the time they take.
pub trait Attempt: Send {
    fn step(&mut self, response: Option<UpstreamResponse<'_>>) -> Result<Next, ProviderError>;
}

/// What an [`Attempt`] wants next.
#[derive(Debug)]
pub enum Next {
    /// Perform this upstream request and call `step` with its response.
    Fetch(UpstreamRequest),
    /// The answer.
    Done(Done),
}

/// A finished answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Done {
    pub output: Output,
    /// For list endpoints: the upstream cursor of the next page, `None` at
    /// the end. The host wraps it in an opaque token for the caller and
    /// brings it back in [`Call`] only to this provider.
    pub next_cursor: Option<String>,
}

impl Done {
    /// An answer with no further page.
    pub fn last(output: Output) -> Done {
        Done {
            output,
            next_cursor: None,
        }
    }
}

impl From<Done> for Next {
    fn from(done: Done) -> Next {
        Next::Done(done)
    }
}

/// The normalized data of an answer; the variant must match the call's
/// endpoint, or the host treats the answer as a bad response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Output {
    Profile(Profile),
    Posts(Vec<Post>),
    Post(Post),
    Comments(Vec<Comment>),
    Search(Vec<Profile>),
}

impl Output {
    /// The endpoint this output answers.
    pub fn endpoint(&self) -> Endpoint {
        match self {
            Output::Profile(_) => Endpoint::Profile,
            Output::Posts(_) => Endpoint::Posts,
            Output::Post(_) => Endpoint::Post,
            Output::Comments(_) => Endpoint::Comments,
            Output::Search(_) => Endpoint::Search,
        }
    }

    /// The output's value as JSON, without its variant: an answer's `data`
    /// as callers receive it.
    pub fn data_json(&self) -> String {
        let written = match self {
            Output::Profile(profile) => serde_json::to_string(profile),
            Output::Posts(posts) => serde_json::to_string(posts),
            Output::Post(post) => serde_json::to_string(post),
            Output::Comments(comments) => serde_json::to_string(comments),
            Output::Search(profiles) => serde_json::to_string(profiles),
        };
        // Plain structs of strings, numbers and booleans.
        written.expect("the schema's values always serialize")
    }

    /// How many items this page of a list holds; `None` for one item.
    fn page_len(&self) -> Option<usize> {
        match self {
            Output::Posts(posts) => Some(posts.len()),
            Output::Comments(comments) => Some(comments.len()),
            Output::Search(profiles) => Some(profiles.len()),
            Output::Profile(_) | Output::Post(_) => None,
        }
    }

    /// Whether this is a page of a list with nothing on it.
    pub(crate) fn is_empty_page(&self) -> bool {
        self.page_len() == Some(0)
    }

    /// Checks what the schema's types cannot say: every ID has the shape of
    /// one ([`schema::is_id`](crate::schema::is_id)), every profile's
    /// `username` and every post's or comment's `author` is a handle (not
    /// empty since 1.4, [`schema::is_handle`](crate::schema::is_handle) since
    /// 1.6; [`json::handle`](crate::json::handle) takes off the `@` the
    /// schema's handles are without, and gives `None` for no handle), every
    /// `avatar_url` is an `http(s)` URL (since 1.6;
    /// [`json::web_url`](crate::json::web_url) makes one so), and a list
    /// holds at most `most_items` ([`Call::most_items`](crate::Call::most_items)).
    /// The message says what is wrong without quoting upstream data.
    pub fn check(&self, most_items: Option<usize>) -> Result<(), String> {
        let items = self.page_len().unwrap_or(0);
        if let Some(most) = most_items.filter(|&most| items > most) {
            return Err(format!("{items} items where at most {most} were asked"));
        }
        let ids_fit = match self {
            Output::Profile(profile) => profile_ids_fit(profile),
            Output::Search(profiles) => profiles.iter().all(profile_ids_fit),
            Output::Post(post) => is_id(&post.id),
            Output::Posts(posts) => posts.iter().all(|post| is_id(&post.id)),
            Output::Comments(comments) => comments.iter().all(|comment| is_id(&comment.id)),
        };
        if !ids_fit {
            return Err(format!("an ID that is not 1-{MAX_ID_DIGITS} digits"));
        }
        let profiles = match self {
            Output::Profile(profile) => std::slice::from_ref(profile),
            Output::Search(profiles) => profiles,
            Output::Post(_) | Output::Posts(_) | Output::Comments(_) => &[],
        };
        // `is_handle` refuses an empty one too; this says so as 1.4 did.
        if profiles.iter().any(|p| p.username.is_empty()) {
            return Err("an empty username".into());
        }
        if !profiles.iter().all(|p| is_handle(&p.username)) {
            return Err("a username that is not a handle".into());
        }
        let authors_fit = match self {
            Output::Post(post) => author_fits(&post.author),
            Output::Posts(posts) => posts.iter().all(|post| author_fits(&post.author)),
            Output::Comments(comments) => comments.iter().all(|c| author_fits(&c.author)),
            Output::Profile(_) | Output::Search(_) => true,
        };
        if !authors_fit {
            return Err("an author that is not a handle".into());
        }
        let web_links = |p: &Profile| p.avatar_url.as_deref().is_none_or(crate::json::is_web_url);
        if !profiles.iter().all(web_links) {
            return Err("an avatar_url that is not an http(s) URL".into());
        }
        Ok(())
    }
}

fn author_fits(author: &Option<String>) -> bool {
    author.as_deref().is_none_or(is_handle)
}

fn profile_ids_fit(profile: &Profile) -> bool {
    profile.id.as_deref().is_none_or(is_id)
}

/// How an attempt failed, which decides what the host does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The caller's input is invalid for this platform; found before any
    /// upstream request. Ends the chain with a 400.
    InvalidInput,
    /// The user or post does not exist. Authoritative: ends the chain with 404.
    NotFound,
    /// This provider cannot serve the call. The next provider is tried.
    Unsupported,
    /// A passing upstream failure; the next provider is tried.
    Transient,
    /// The upstream's quota is exhausted; the next provider is tried.
    RateLimited,
    /// The upstream refused our key (401/403).
    KeyRejected,
    /// The upstream answered something unusable: unparseable, a soft block,
    /// a required field missing.
    BadResponse,
    /// The plugin panicked; the host recorded it as a failed attempt.
    Panicked,
    /// This upstream cannot decide the call (say, a bare HTTP 404 that may
    /// mean "no such user" or "wrong path"): the next provider is tried, and
    /// it does not count against this provider's breaker. Since plugin-api
    /// 1.1; a host built against 1.0 reads it as a bad response.
    Undecided,
}

impl ErrorKind {
    /// A stable name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Transient => "transient",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::KeyRejected => "key_rejected",
            ErrorKind::BadResponse => "bad_response",
            ErrorKind::Panicked => "panicked",
            ErrorKind::Undecided => "undecided",
        }
    }

    pub(crate) const fn code(self) -> u8 {
        match self {
            ErrorKind::InvalidInput => 1,
            ErrorKind::NotFound => 2,
            ErrorKind::Unsupported => 3,
            ErrorKind::Transient => 4,
            ErrorKind::RateLimited => 5,
            ErrorKind::KeyRejected => 6,
            ErrorKind::BadResponse => 7,
            ErrorKind::Panicked => 8,
            ErrorKind::Undecided => 9,
        }
    }

    /// Unknown codes (a newer plugin) count as a bad response.
    pub(crate) fn from_code(code: u8) -> ErrorKind {
        match code {
            1 => ErrorKind::InvalidInput,
            2 => ErrorKind::NotFound,
            3 => ErrorKind::Unsupported,
            4 => ErrorKind::Transient,
            5 => ErrorKind::RateLimited,
            6 => ErrorKind::KeyRejected,
            8 => ErrorKind::Panicked,
            9 => ErrorKind::Undecided,
            _ => ErrorKind::BadResponse,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A classified failure of one attempt.
///
/// The message goes to the operator's log, never to the caller, except for
/// [`ErrorKind::InvalidInput`], whose message the caller sees: say what is
/// wrong with their parameter and nothing about the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderError {
    kind: ErrorKind,
    message: String,
    retry_after: Option<Duration>,
}

impl ProviderError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ProviderError {
        ProviderError {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The upstream said when to come back (e.g. `Retry-After`).
    pub fn retry_after(mut self, after: Duration) -> ProviderError {
        self.retry_after = Some(after);
        self
    }

    /// The input is invalid for this platform. `parameter` names it.
    pub fn invalid_input(parameter: &str, reason: impl fmt::Display) -> ProviderError {
        ProviderError::new(
            ErrorKind::InvalidInput,
            format!("parameter `{parameter}` {reason}"),
        )
    }

    /// The user or post does not exist.
    pub fn not_found(what: impl Into<String>) -> ProviderError {
        ProviderError::new(ErrorKind::NotFound, what)
    }

    /// The upstream answered something unusable.
    pub fn bad_response(why: impl Into<String>) -> ProviderError {
        ProviderError::new(ErrorKind::BadResponse, why)
    }

    /// A required field is missing from the upstream's answer.
    pub fn missing(field: &str) -> ProviderError {
        ProviderError::bad_response(format!("required field `{field}` missing"))
    }

    /// This upstream cannot decide the call; ask the next provider without
    /// counting it against this one's breaker ([`ErrorKind::Undecided`]).
    pub fn undecided(why: impl Into<String>) -> ProviderError {
        ProviderError::new(ErrorKind::Undecided, why)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn retry_after_hint(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for ProviderError {}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::schema::bare_post as post;

    #[test]
    fn check_bounds_lists_and_ids() {
        let posts = |n: usize| Output::Posts((0..n).map(|i| post(&i.to_string())).collect());
        assert_eq!(posts(3).check(Some(3)), Ok(()));
        assert_eq!(posts(3).check(None), Ok(()));
        assert_eq!(
            posts(4).check(Some(3)),
            Err("4 items where at most 3 were asked".into())
        );
        assert!(Output::Post(post("-5")).check(None).is_err());
        assert!(Output::Posts(vec![post("1"), post("x")])
            .check(None)
            .is_err());
        let profile = |id: Option<&str>| Profile {
            username: "a".into(),
            display_name: "a".into(),
            followers: 0,
            verified: false,
            id: id.map(Into::into),
            bio: None,
            following: None,
            likes: None,
            videos: None,
            avatar_url: None,
        };
        assert_eq!(Output::Profile(profile(None)).check(None), Ok(()));
        assert!(Output::Search(vec![profile(Some(&"9".repeat(21)))])
            .check(Some(1))
            .is_err());
        let mut nameless = profile(None);
        nameless.username = String::new();
        assert_eq!(
            Output::Search(vec![profile(None), nameless.clone()]).check(None),
            Err("an empty username".into())
        );
        assert!(Output::Profile(nameless).check(None).is_err());
        let mut odd = profile(None);
        odd.username = "Prim\\Secret\"Quote42".into();
        assert_eq!(
            Output::Profile(odd).check(None),
            Err("a username that is not a handle".into())
        );
        let mut by = post("1");
        by.author = Some("luna.bakes".into());
        assert_eq!(Output::Post(by.clone()).check(None), Ok(()));
        by.author = Some("luna bakes".into());
        assert_eq!(
            Output::Posts(vec![post("2"), by]).check(None),
            Err("an author that is not a handle".into())
        );
        let mut linked = profile(None);
        linked.avatar_url = Some("https://cdn.example/a.webp".into());
        assert_eq!(Output::Profile(linked.clone()).check(None), Ok(()));
        for link in ["javascript:alert(1)", "https://cdn.example/a\"><b>"] {
            linked.avatar_url = Some(link.into());
            assert_eq!(
                Output::Search(vec![profile(None), linked.clone()]).check(None),
                Err("an avatar_url that is not an http(s) URL".into()),
                "{link}"
            );
        }
    }

    #[test]
    fn absent_or_empty_settings_are_the_default() {
        #[derive(serde::Deserialize, Default, Debug, PartialEq)]
        #[serde(deny_unknown_fields)]
        struct Settings {
            greeting: String,
        }
        let with = |settings: serde_json::Value| {
            ProviderConfig {
                base_url: "http://h".into(),
                api_key: "k".into(),
                settings,
            }
            .settings::<Settings>()
        };
        assert_eq!(with(serde_json::Value::Null), Ok(Settings::default()));
        assert_eq!(with(serde_json::json!({})), Ok(Settings::default()));
        let given = with(serde_json::json!({"greeting": "hi"}));
        assert_eq!(given.unwrap().greeting, "hi");
        let typo = with(serde_json::json!({"greting": "hi"})).unwrap_err();
        assert!(typo.contains("greting"), "{typo}");
    }
}
