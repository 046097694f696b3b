//! The normalized schema: the one definition of what a profile, a post and a
//! comment look like to callers, whichever provider answered.
//!
//! Field order is answer order: the required fields (`docs/api.md`) come first,
//! then the extras the service adds. Every field is always present; an extra a
//! provider cannot give is `null`. Unknown fields are refused when the host
//! reads a plugin's answer, so a provider cannot return another shape.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// The most digits an ID may have: the upstream contract's IDs are decimal
/// integers of up to 20 digits (beyond 2^64 at the top of the range).
pub const MAX_ID_DIGITS: usize = 20;

/// Whether `text` has the shape of a platform ID: 1-20 ASCII digits, no
/// sign. An answer holding any other ID is a bad response: it would be an
/// opaque key, garbage, or a flood of digits, and callers pass IDs back.
pub fn is_id(text: &str) -> bool {
    (1..=MAX_ID_DIGITS).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit())
}

/// The most characters a handle may have.
pub const MAX_HANDLE_LEN: usize = 64;

/// Whether `text` has the shape of a user's handle, as the schema gives one
/// and as `username` is asked for: 1-64 of `A-Z a-z 0-9 . _`, not dots
/// alone (`.` and `..` would be resolved away as URL path segments, and no
/// platform has such a handle). A caller passes a handle it was given back
/// as `username`, so an answer may hold no other. Since 1.6.
pub fn is_handle(text: &str) -> bool {
    (1..=MAX_HANDLE_LEN).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_')
        && !text.bytes().all(|b| b == b'.')
}

/// A creator's public profile (the `profile` endpoint, and items of `search`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Handle without a leading `@` ([`is_handle`]).
    pub username: String,
    pub display_name: String,
    pub followers: u64,
    pub verified: bool,
    /// The platform's numeric user ID, carried exactly as a string.
    pub id: Option<String>,
    pub bio: Option<String>,
    pub following: Option<u64>,
    /// Total likes the creator's posts received.
    pub likes: Option<u64>,
    /// Number of posts.
    pub videos: Option<u64>,
    /// An `http://` or `https://` URL ([`json::web_url`](crate::json::web_url)).
    pub avatar_url: Option<String>,
}

/// A post (video), from `posts` and `post`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Post {
    /// The numeric post ID as a string. Never an opaque media key.
    pub id: String,
    /// Caption; may hold hashtags, emoji and newlines.
    pub text: String,
    pub likes: u64,
    pub comments: u64,
    pub views: Option<u64>,
    pub shares: Option<u64>,
    pub created_at: Option<Timestamp>,
    pub duration_ms: Option<u64>,
    /// The author's handle.
    pub author: Option<String>,
}

/// A comment on a post, from `comments`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Comment {
    pub id: String,
    pub text: String,
    pub likes: u64,
    pub replies: Option<u64>,
    pub created_at: Option<Timestamp>,
    /// The commenter's handle.
    pub author: Option<String>,
}

/// A point in time with second precision, written `YYYY-MM-DDTHH:MM:SSZ`.
///
/// Only years 0000-9999 can be written that way; [`Timestamp::from_unix`]
/// refuses anything else so a garbage upstream value becomes `null`, not a
/// malformed date.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

/// Seconds from 1970-01-01 to 10000-01-01, the first instant we cannot write.
const END_OF_YEAR_9999: i64 = 253_402_300_800;
/// Seconds from 0000-01-01 to 1970-01-01.
const START_OF_YEAR_0: i64 = -62_167_219_200;

impl Timestamp {
    /// From Unix seconds; `None` outside years 0000-9999.
    pub fn from_unix(seconds: i64) -> Option<Timestamp> {
        (START_OF_YEAR_0..END_OF_YEAR_9999)
            .contains(&seconds)
            .then_some(Timestamp(seconds))
    }

    /// Unix seconds.
    pub fn unix(self) -> i64 {
        self.0
    }

    /// Parses exactly `YYYY-MM-DDTHH:MM:SSZ`.
    pub fn parse(text: &str) -> Option<Timestamp> {
        let b = text.as_bytes();
        let shape_ok = b.len() == 20
            && b[4] == b'-'
            && b[7] == b'-'
            && b[10] == b'T'
            && b[13] == b':'
            && b[16] == b':'
            && b[19] == b'Z';
        if !shape_ok {
            return None;
        }
        let num = |range: std::ops::Range<usize>| -> Option<i64> {
            let digits = &text[range];
            digits
                .bytes()
                .all(|c| c.is_ascii_digit())
                .then(|| digits.parse().ok())
                .flatten()
        };
        let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if !(1..=12).contains(&month)
            || day < 1
            || day > days_in_month(year, month)
            || hour > 23
            || minute > 59
            || second > 59
        {
            return None;
        }
        let days = days_from_civil(year, month, day);
        Timestamp::from_unix(days * 86_400 + hour * 3_600 + minute * 60 + second)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let days = self.0.div_euclid(86_400);
        let secs = self.0.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
            secs / 3_600,
            secs / 60 % 60,
            secs % 60
        )
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Timestamp::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format_args!("not a YYYY-MM-DDTHH:MM:SSZ time: {text:?}"))
        })
    }
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A post with an ID and nothing else, for this crate's tests.
#[cfg(test)]
pub(crate) fn bare_post(id: &str) -> Post {
    Post {
        id: id.into(),
        text: String::new(),
        likes: 0,
        comments: 0,
        views: None,
        shares: None,
        created_at: None,
        duration_ms: None,
        author: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_one_to_twenty_digits() {
        for good in ["0", "7301234567890123456", "99999999999999999999"] {
            assert!(is_id(good), "{good}");
        }
        let flood = "1".repeat(8_000_000);
        for bad in [
            "",
            "-5",
            "+5",
            " 5",
            "5 ",
            "1e5",
            "v15044gf0000d724",
            "123456789012345678901",
            flood.as_str(),
        ] {
            assert!(!is_id(bad), "{}", &bad[..bad.len().min(30)]);
        }
    }

    #[test]
    fn handles_are_one_to_sixty_four_of_letters_digits_dots_and_underscores() {
        for good in ["a", "luna.bakes_1", "_", "a..", &"x".repeat(64)] {
            assert!(is_handle(good), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            "@luna",
            "lu@na",
            "luna bakes",
            "luna-bakes",
            "Prim\\Secret\"Quote42",
            "lüna",
            &"x".repeat(65),
        ] {
            assert!(!is_handle(bad), "{bad}");
        }
    }

    #[test]
    fn formats_known_instants() {
        let cases = [
            (0, "1970-01-01T00:00:00Z"),
            (1_763_700_000, "2025-11-21T04:40:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (-1, "1969-12-31T23:59:59Z"),
            (END_OF_YEAR_9999 - 1, "9999-12-31T23:59:59Z"),
            (START_OF_YEAR_0, "0000-01-01T00:00:00Z"),
        ];
        for (secs, text) in cases {
            let t = Timestamp::from_unix(secs).unwrap();
            assert_eq!(t.to_string(), text);
            assert_eq!(Timestamp::parse(text), Some(t), "{text}");
        }
    }

    #[test]
    fn refuses_unwritable_years_and_bad_text() {
        assert_eq!(Timestamp::from_unix(END_OF_YEAR_9999), None);
        assert_eq!(Timestamp::from_unix(START_OF_YEAR_0 - 1), None);
        for bad in [
            "2025-02-29T00:00:00Z",
            "2025-13-01T00:00:00Z",
            "2025-11-21 04:40:00Z",
            "2025-11-21T24:00:00Z",
            "2025-11-21T04:40:00",
            "+025-11-21T04:40:00Z",
        ] {
            assert_eq!(Timestamp::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_day_of_four_centuries_round_trips() {
        let start = days_from_civil(1900, 1, 1);
        for days in start..start + 146_097 {
            let (y, m, d) = civil_from_days(days);
            assert!(d >= 1 && d <= days_in_month(y, m));
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
