//! The endpoint kinds every platform can serve, their parameters, and the rules
//! that decide whether a caller's parameters are valid.
//!
//! The host applies these rules before any provider is asked, so invalid input
//! never reaches an upstream; a provider may refuse more (a platform-specific
//! format) with [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput)
//! before its first request.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::RangeInclusive;

/// One of the read endpoints. A platform serves any subset of them; a
/// provider's [`Manifest`](crate::Manifest) lists the ones it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// A creator's profile, by `username`.
    Profile,
    /// A creator's posts, by `username`; paged.
    Posts,
    /// One post, by `id`.
    Post,
    /// Comments on a post, by `id`; paged.
    Comments,
    /// Creators matching `query`; paged.
    Search,
}

impl Endpoint {
    /// Every endpoint, in the order the documentation lists them.
    pub const ALL: [Endpoint; 5] = [
        Endpoint::Profile,
        Endpoint::Posts,
        Endpoint::Post,
        Endpoint::Comments,
        Endpoint::Search,
    ];

    /// The path segment, as in `/v1/{platform}/{segment}`.
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Profile => "profile",
            Endpoint::Posts => "posts",
            Endpoint::Post => "post",
            Endpoint::Comments => "comments",
            Endpoint::Search => "search",
        }
    }

    /// The endpoint of an exact, case-sensitive path segment.
    pub fn from_segment(segment: &str) -> Option<Endpoint> {
        Endpoint::ALL.into_iter().find(|e| e.as_str() == segment)
    }

    /// The query parameter that names what this endpoint is about (its
    /// [`Call::subject`]): the one a provider's refusal of the input is
    /// about, and the one a next page's request repeats. Since 1.6.
    pub fn subject_param(self) -> &'static str {
        match self {
            Endpoint::Profile | Endpoint::Posts => "username",
            Endpoint::Post | Endpoint::Comments => "id",
            Endpoint::Search => "query",
        }
    }

    /// Whether this endpoint reads the query parameter `name`; it ignores
    /// any other.
    pub fn reads(self, name: &str) -> bool {
        match name {
            "username" | "id" | "query" => self.subject_param() == name,
            // `cursor` is the host's to resolve, but a duplicate is refused
            // here all the same.
            "count" | "cursor" => self.is_list(),
            _ => false,
        }
    }

    /// Whether answers are lists that carry a `next_cursor`.
    pub fn is_list(self) -> bool {
        matches!(
            self,
            Endpoint::Posts | Endpoint::Comments | Endpoint::Search
        )
    }

    /// Whether the endpoint names one resource (a user or a post) that may
    /// not exist. Search does not: no match is an empty list, never "not
    /// found".
    pub fn names_a_resource(self) -> bool {
        !matches!(self, Endpoint::Search)
    }

    /// The `count` parameter's allowed range and default, for list endpoints.
    pub fn count_rule(self) -> Option<(RangeInclusive<u32>, u32)> {
        match self {
            Endpoint::Posts | Endpoint::Search => Some((1..=30, 10)),
            Endpoint::Comments => Some((1..=200, 20)),
            Endpoint::Profile | Endpoint::Post => None,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many posts beyond `count` a posts answer may hold; see
/// [`Call::most_items`].
pub const POSTS_COUNT_SLACK: usize = 4;

/// A validated request for one endpoint, as a provider receives it.
///
/// `cursor` is the provider's own upstream cursor from an earlier
/// [`Done::next_cursor`](crate::Done::next_cursor); the host only hands a
/// cursor back to the provider that issued it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "endpoint", rename_all = "lowercase", deny_unknown_fields)]
pub enum Call {
    Profile {
        /// 1-64 of `[A-Za-z0-9._]`, without `@`.
        username: String,
    },
    Posts {
        username: String,
        /// Requested page size, 1-30. Approximate: providers may give more or fewer.
        count: u32,
        cursor: Option<String>,
    },
    Post {
        /// 1-20 ASCII digits. May exceed `u64`; keep it a string.
        id: String,
    },
    Comments {
        id: String,
        /// Exact page size, 1-200: page the upstream as needed.
        count: u32,
        cursor: Option<String>,
    },
    Search {
        /// 1-100 characters of free text.
        query: String,
        /// Requested page size, 1-30.
        count: u32,
        cursor: Option<String>,
    },
}

/// Why a caller's parameters were refused. `Display` is safe to show the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError {
    /// The parameter at fault.
    pub name: &'static str,
    /// What is wrong with it, in words a caller can act on.
    pub reason: String,
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "parameter `{}` {}", self.name, self.reason)
    }
}

impl std::error::Error for ParamError {}

impl Call {
    /// The endpoint this call is for.
    pub fn endpoint(&self) -> Endpoint {
        match self {
            Call::Profile { .. } => Endpoint::Profile,
            Call::Posts { .. } => Endpoint::Posts,
            Call::Post { .. } => Endpoint::Post,
            Call::Comments { .. } => Endpoint::Comments,
            Call::Search { .. } => Endpoint::Search,
        }
    }

    /// The value that names what is asked for: the username, post ID or query.
    /// A cursor is only valid for the same endpoint and subject.
    pub fn subject(&self) -> &str {
        match self {
            Call::Profile { username } | Call::Posts { username, .. } => username,
            Call::Post { id } | Call::Comments { id, .. } => id,
            Call::Search { query, .. } => query,
        }
    }

    /// The upstream cursor this call continues from, if any.
    pub fn cursor(&self) -> Option<&str> {
        match self {
            Call::Posts { cursor, .. }
            | Call::Comments { cursor, .. }
            | Call::Search { cursor, .. } => cursor.as_deref(),
            Call::Profile { .. } | Call::Post { .. } => None,
        }
    }

    /// The page size asked for (`count`, or its default); `None` for
    /// single-object endpoints.
    pub fn count(&self) -> Option<u32> {
        match self {
            Call::Posts { count, .. }
            | Call::Comments { count, .. }
            | Call::Search { count, .. } => Some(*count),
            Call::Profile { .. } | Call::Post { .. } => None,
        }
    }

    /// The most items a list answer to this call may hold; `None` for
    /// single-object endpoints.
    ///
    /// `count` for comments and search. Posts `count` is approximate (the
    /// spec lets small pages come back slightly larger, and the fallback
    /// upstream answers a fixed batch of up to five whatever is asked), so
    /// posts may hold [`POSTS_COUNT_SLACK`] more. The host refuses a longer
    /// answer as a bad response: an upstream that floods a page must not
    /// flood the caller.
    pub fn most_items(&self) -> Option<usize> {
        let count = self.count()? as usize;
        Some(match self {
            Call::Posts { .. } => count + POSTS_COUNT_SLACK,
            _ => count,
        })
    }

    /// The same call continuing from another upstream cursor.
    pub fn with_cursor(mut self, upstream: Option<String>) -> Call {
        match &mut self {
            Call::Posts { cursor, .. }
            | Call::Comments { cursor, .. }
            | Call::Search { cursor, .. } => *cursor = upstream,
            Call::Profile { .. } | Call::Post { .. } => {}
        }
        self
    }

    /// Validates a caller's query-string parameters for `endpoint`.
    ///
    /// `params` are already form-decoded. An empty value counts as missing; a
    /// parameter given twice is refused; unknown parameters are ignored;
    /// numbers out of range are refused, never clamped. `cursor` is not
    /// looked at: it is the host's opaque token, resolved separately.
    pub fn from_params<'a, I>(endpoint: Endpoint, params: I) -> Result<Call, ParamError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let params = Params::collect(endpoint, params)?;
        let count = |endpoint: Endpoint| -> Result<u32, ParamError> {
            let (range, default) = endpoint.count_rule().expect("list endpoint");
            params.count(range, default)
        };
        Ok(match endpoint {
            Endpoint::Profile => Call::Profile {
                username: params.username()?,
            },
            Endpoint::Posts => Call::Posts {
                username: params.username()?,
                count: count(endpoint)?,
                cursor: None,
            },
            Endpoint::Post => Call::Post { id: params.id()? },
            Endpoint::Comments => Call::Comments {
                id: params.id()?,
                count: count(endpoint)?,
                cursor: None,
            },
            Endpoint::Search => Call::Search {
                query: params.query()?,
                count: count(endpoint)?,
                cursor: None,
            },
        })
    }
}

/// The parameters this module knows, each seen at most once.
#[derive(Default)]
struct Params<'a> {
    username: Option<&'a str>,
    id: Option<&'a str>,
    query: Option<&'a str>,
    count: Option<&'a str>,
}

impl<'a> Params<'a> {
    /// Collects the parameters `endpoint` reads. A parameter given twice is
    /// refused only if the endpoint reads it; any other is ignored, however
    /// often it appears.
    fn collect<I>(endpoint: Endpoint, params: I) -> Result<Params<'a>, ParamError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut seen = Params::default();
        let mut cursor_seen = false;
        for (name, value) in params.into_iter().filter(|(name, _)| endpoint.reads(name)) {
            let (slot, name): (&mut Option<&'a str>, &'static str) = match name {
                "username" => (&mut seen.username, "username"),
                "id" => (&mut seen.id, "id"),
                "query" => (&mut seen.query, "query"),
                "count" => (&mut seen.count, "count"),
                _ => {
                    if std::mem::replace(&mut cursor_seen, true) {
                        return Err(duplicate("cursor"));
                    }
                    continue;
                }
            };
            if slot.replace(value).is_some() {
                return Err(duplicate(name));
            }
        }
        Ok(seen)
    }

    fn required(value: Option<&'a str>, name: &'static str) -> Result<&'a str, ParamError> {
        value.filter(|v| !v.is_empty()).ok_or(ParamError {
            name,
            reason: "is required".into(),
        })
    }

    fn username(&self) -> Result<String, ParamError> {
        let raw = Self::required(self.username, "username")?;
        let handle = raw.strip_prefix('@').unwrap_or(raw);
        if crate::schema::is_handle(handle) {
            return Ok(handle.to_owned());
        }
        let reason = if !handle.is_empty() && handle.bytes().all(|b| b == b'.') {
            "must not be made of dots only"
        } else {
            "must be 1-64 characters of A-Z, a-z, 0-9, `.` and `_`, \
             optionally after one leading `@`"
        };
        Err(ParamError {
            name: "username",
            reason: reason.into(),
        })
    }

    fn id(&self) -> Result<String, ParamError> {
        let id = Self::required(self.id, "id")?;
        if !(1..=20).contains(&id.len()) || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParamError {
                name: "id",
                reason: "must be 1-20 digits".into(),
            });
        }
        Ok(id.to_owned())
    }

    fn query(&self) -> Result<String, ParamError> {
        let query = Self::required(self.query, "query")?;
        let chars = query.chars().count();
        if chars > 100 || query.chars().any(char::is_control) {
            return Err(ParamError {
                name: "query",
                reason: "must be 1-100 characters with no control characters".into(),
            });
        }
        Ok(query.to_owned())
    }

    fn count(&self, range: RangeInclusive<u32>, default: u32) -> Result<u32, ParamError> {
        let Some(text) = self.count.filter(|v| !v.is_empty()) else {
            return Ok(default);
        };
        let out_of_range = || ParamError {
            name: "count",
            reason: format!(
                "must be an integer from {} to {}",
                range.start(),
                range.end()
            ),
        };
        if !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(out_of_range());
        }
        match text.parse::<u32>() {
            Ok(n) if range.contains(&n) => Ok(n),
            _ => Err(out_of_range()),
        }
    }
}

fn duplicate(name: &'static str) -> ParamError {
    ParamError {
        name,
        reason: "is given more than once".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(
        endpoint: Endpoint,
        query: &[(&'static str, &'static str)],
    ) -> Result<Call, ParamError> {
        Call::from_params(endpoint, query.iter().copied())
    }

    #[test]
    fn username_strips_one_at_and_checks_charset() {
        let ok = call(Endpoint::Profile, &[("username", "@luna.bakes_1")]).unwrap();
        assert_eq!(ok.subject(), "luna.bakes_1");
        for dotted in [".a", "a..", "_.", "._"] {
            let dotted: &'static str = Box::leak(dotted.to_string().into_boxed_str());
            assert!(
                call(Endpoint::Profile, &[("username", dotted)]).is_ok(),
                "{dotted}"
            );
        }
        for bad in [
            "@@luna",
            "luna bakes",
            "lüna",
            "@",
            "",
            &"a".repeat(65),
            ".",
            "..",
            "@..",
            "....",
        ] {
            let bad: &'static str = Box::leak(bad.to_string().into_boxed_str());
            let err = call(Endpoint::Profile, &[("username", bad)]).unwrap_err();
            assert_eq!(err.name, "username", "{bad:?}");
        }
        assert!(call(
            Endpoint::Profile,
            &[("username", Box::leak("a".repeat(64).into_boxed_str()))]
        )
        .is_ok());
    }

    #[test]
    fn ids_are_digits_and_may_exceed_u64() {
        let big = "99999999999999999999";
        assert_eq!(call(Endpoint::Post, &[("id", big)]).unwrap().subject(), big);
        for bad in ["", "12a", "-1", "123456789012345678901", " 1"] {
            let bad: &'static str = Box::leak(bad.to_string().into_boxed_str());
            assert_eq!(call(Endpoint::Post, &[("id", bad)]).unwrap_err().name, "id");
        }
    }

    #[test]
    fn count_defaults_and_bounds_per_endpoint() {
        let posts = call(Endpoint::Posts, &[("username", "a")]).unwrap();
        assert!(matches!(posts, Call::Posts { count: 10, .. }));
        let comments = call(Endpoint::Comments, &[("id", "1"), ("count", "200")]).unwrap();
        assert!(matches!(comments, Call::Comments { count: 200, .. }));
        for (endpoint, subject, bad) in [
            (Endpoint::Posts, ("username", "a"), "31"),
            (Endpoint::Posts, ("username", "a"), "0"),
            (Endpoint::Comments, ("id", "1"), "201"),
            (Endpoint::Search, ("query", "x"), "2.5"),
            (Endpoint::Search, ("query", "x"), "+3"),
            (Endpoint::Search, ("query", "x"), "99999999999"),
        ] {
            let err = call(endpoint, &[subject, ("count", bad)]).unwrap_err();
            assert_eq!(err.name, "count", "{endpoint} {bad}");
        }
    }

    #[test]
    fn duplicates_refused_unknown_ignored_empty_is_missing() {
        let err = call(Endpoint::Profile, &[("username", "a"), ("username", "b")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "parameter `username` is given more than once"
        );
        let err = call(
            Endpoint::Posts,
            &[("username", "a"), ("cursor", "x"), ("cursor", "y")],
        )
        .unwrap_err();
        assert_eq!(err.name, "cursor");
        assert!(call(
            Endpoint::Profile,
            &[("username", "a"), ("utm", "1"), ("utm", "2")]
        )
        .is_ok());
        let err = call(Endpoint::Search, &[("query", "")]).unwrap_err();
        assert_eq!(err.to_string(), "parameter `query` is required");
    }

    #[test]
    fn query_counts_characters_not_bytes() {
        let emoji: &'static str = Box::leak("🥐".repeat(100).into_boxed_str());
        assert!(call(Endpoint::Search, &[("query", emoji)]).is_ok());
        let long: &'static str = Box::leak("🥐".repeat(101).into_boxed_str());
        assert_eq!(
            call(Endpoint::Search, &[("query", long)]).unwrap_err().name,
            "query"
        );
    }

    #[test]
    fn calls_cross_the_boundary_as_json() {
        let c = Call::Comments {
            id: "18446744073709551616".into(),
            count: 120,
            cursor: Some("50".into()),
        };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Call>(&json).unwrap(), c);
    }
}
