//! Lenient readers for upstream JSON, where the same field arrives in more than
//! one shape: IDs as strings or bare integers beyond 2^53, counters as
//! integers or numeric strings, flags as booleans or 0/1.
//!
//! Deserialize upstream bodies straight from bytes into typed structs (as
//! [`UpstreamResponse::json`](crate::UpstreamResponse::json) does): [`Id`]
//! reads the raw number text so no digit is lost through a float, which only
//! works on serde_json's own deserializer, not through `serde_json::Value`,
//! `#[serde(flatten)]` or untagged enums.
//!
//! Their errors never quote the offending value: an upstream may echo
//! anything into a field, our key included, and errors reach the log.

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::fmt;

use crate::{ProviderError, Timestamp};

/// Parses upstream JSON into `T`; the error says where it went wrong, never
/// what the text was (an upstream may echo our key into any field).
pub fn parse<'a, T: Deserialize<'a>>(text: &'a [u8]) -> Result<T, ProviderError> {
    // A body is nearly always valid UTF-8 as a whole. Checked once, in one
    // pass, the parser need not check each string it reads again (a fifth
    // of a parse's instructions); a body that is not goes the slower way,
    // which fails only where a string the parse reads is not UTF-8.
    let parsed = match std::str::from_utf8(text) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(text),
    };
    parsed.map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Io => "unreadable",
            serde_json::error::Category::Syntax => "not JSON",
            serde_json::error::Category::Data => "JSON of an unexpected shape",
            serde_json::error::Category::Eof => "truncated JSON",
        };
        ProviderError::bad_response(format!(
            "body is {what} (line {}, column {})",
            e.line(),
            e.column()
        ))
    })
}

/// An identifier or cursor that arrives as a JSON string or a bare integer
/// of any length, kept exactly as text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Id(pub String);

impl Id {
    /// The text, or `None` when empty. One of another shape than the
    /// schema's then makes the answer a bad response (the next provider is
    /// asked): an upstream sending it is suspect.
    pub fn non_empty(self) -> Option<String> {
        (!self.0.is_empty()).then_some(self.0)
    }

    /// The text when it has the shape of the schema's IDs
    /// ([`schema::is_id`](crate::schema::is_id): 1-20 digits), else `None`.
    /// For an optional ID (a profile's `id`) of a provider that would rather
    /// answer without an odd one upstream (`-5`, `u-123`) than have the
    /// whole answer refused. Since 1.6.
    pub fn valid(self) -> Option<String> {
        crate::schema::is_id(&self.0).then_some(self.0)
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        let text = raw.get();
        if let Some(quoted) = text.strip_prefix('"') {
            // A string without escapes is its text between the quotes.
            return match quoted.strip_suffix('"') {
                Some(plain) if !plain.contains('\\') => Ok(Id(plain.to_owned())),
                _ => serde_json::from_str(text)
                    .map(Id)
                    .map_err(de::Error::custom),
            };
        }
        let digits = text.strip_prefix('-').unwrap_or(text);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(Id(text.to_owned()));
        }
        // Never quote the value: upstream text may echo anything, keys included.
        Err(de::Error::custom("expected an ID as a string or integer"))
    }
}

/// A non-negative counter sent as an integer, an integral float, or a string
/// of digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Count(pub u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CountVisitor;
        impl Visitor<'_> for CountVisitor {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a non-negative integer or a string of digits")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
                Ok(Count(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
                u64::try_from(v)
                    .map(Count)
                    .map_err(|_| E::custom("negative counter"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Count, E> {
                // 2^64 is exactly representable; anything from it up overflows.
                if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 18_446_744_073_709_551_616.0
                {
                    Ok(Count(v as u64))
                } else {
                    Err(E::custom("not an integral counter"))
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Count, E> {
                let t = v.trim();
                if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
                    t.parse()
                        .map(Count)
                        .map_err(|_| E::custom("counter out of range"))
                } else {
                    Err(E::custom(
                        "a string counter holds something other than digits",
                    ))
                }
            }
        }
        deserializer.deserialize_any(CountVisitor)
    }
}

/// A flag sent as a boolean, 0/1, or `"true"`/`"false"`/`"0"`/`"1"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flag(pub bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FlagVisitor;
        impl Visitor<'_> for FlagVisitor {
            type Value = Flag;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a boolean or 0/1")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Flag, E> {
                Ok(Flag(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Flag, E> {
                match v {
                    0 => Ok(Flag(false)),
                    1 => Ok(Flag(true)),
                    _ => Err(E::custom("a numeric flag other than 0 or 1")),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Flag, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom("a negative flag"))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Flag, E> {
                match v {
                    "true" | "1" => Ok(Flag(true)),
                    "false" | "0" => Ok(Flag(false)),
                    _ => Err(E::custom("a string flag other than true/false/0/1")),
                }
            }
        }
        deserializer.deserialize_any(FlagVisitor)
    }
}

/// A duration in seconds, sent as an integer, a float (`15.379`) or a
/// numeric string; see [`Seconds::millis`].
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Seconds(pub f64);

impl Seconds {
    /// Whole milliseconds, rounded; `None` for a negative, infinite or
    /// absurdly large value (so garbage becomes `null`, not a wrapped number).
    pub fn millis(self) -> Option<u64> {
        Millis(self.0 * 1000.0).whole()
    }
}

/// A duration in milliseconds, in any shape [`Seconds`] takes (`15379`,
/// `15379.5`, `"15379"`); see [`Millis::whole`].
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Millis(pub f64);

impl Millis {
    /// Whole milliseconds, rounded; `None` for a negative, infinite or
    /// absurdly large value (so garbage becomes `null`, not a wrapped number).
    pub fn whole(self) -> Option<u64> {
        let ms = self.0.round();
        // 2^53: beyond it a float no longer holds every integer.
        (ms.is_finite() && (0.0..=9_007_199_254_740_992.0).contains(&ms)).then_some(ms as u64)
    }
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Seconds::deserialize(deserializer).map(|Seconds(ms)| Millis(ms))
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SecondsVisitor;
        impl Visitor<'_> for SecondsVisitor {
            type Value = Seconds;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number of seconds")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Seconds, E> {
                Ok(Seconds(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Seconds, E> {
                Ok(Seconds(v as f64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Seconds, E> {
                Ok(Seconds(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Seconds, E> {
                let t = v.trim();
                let numeric = !t.is_empty()
                    && t.bytes()
                        .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-');
                match t.parse::<f64>() {
                    Ok(s) if numeric => Ok(Seconds(s)),
                    _ => Err(E::custom(
                        "a string duration holds something other than a number",
                    )),
                }
            }
        }
        deserializer.deserialize_any(SecondsVisitor)
    }
}

/// Float seconds to whole milliseconds (see [`Seconds::millis`]); `None`
/// when absent or not a sane duration.
pub fn millis(seconds: Option<Seconds>) -> Option<u64> {
    seconds.and_then(Seconds::millis)
}

/// A field whose absence means something else than its `null`. Upstreams
/// send `"comments": null` for an empty page, while a body without the
/// field at all is not the answer asked for (a soft block, say). Give the
/// field `#[serde(default)]` so that leaving it out reads as [`Field::Absent`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Field<T> {
    /// Not in the body.
    #[default]
    Absent,
    /// `null`.
    Null,
    /// Anything else, read as `T`.
    Value(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Option::<T>::deserialize(deserializer)?.map_or(Field::Null, Field::Value))
    }
}

impl<T> Field<Vec<T>> {
    /// A page's items, none for `null`; `None` when the field is absent,
    /// for the provider to say what that means.
    pub fn items(self) -> Option<Vec<T>> {
        match self {
            Field::Value(items) => Some(items),
            Field::Null => Some(Vec::new()),
            Field::Absent => None,
        }
    }
}

/// Required fields with a clear error: `user.handle.required("user.handle")?`
/// is the value, or a [`ProviderError::missing`] naming the field (a bad
/// response: the next provider is tried).
pub trait Required<T> {
    /// The value, or the error naming `field`.
    fn required(self, field: &str) -> Result<T, ProviderError>;
}

impl<T> Required<T> for Option<T> {
    fn required(self, field: &str) -> Result<T, ProviderError> {
        self.ok_or_else(|| ProviderError::missing(field))
    }
}

/// Unix seconds (any [`Count`] shape) as a [`Timestamp`]; `None` when absent
/// or not writable as a date.
pub fn unix_time(seconds: Option<Count>) -> Option<Timestamp> {
    seconds
        .and_then(|Count(s)| i64::try_from(s).ok())
        .and_then(Timestamp::from_unix)
}

/// `None` for an absent or empty string.
pub fn non_empty(text: Option<String>) -> Option<String> {
    text.filter(|t| !t.is_empty())
}

/// A link callers may follow or show (an `avatar_url`): an `http://` or
/// `https://` URL with a host, written only with characters a URL may
/// hold; any other (`javascript:`, `data:`, a bare path, one with a space,
/// a quote, an angle bracket or a control character in it) `None`, since
/// a client may put it straight into a page. The host refuses a profile
/// whose `avatar_url` is anything else. Since 1.6.
pub fn web_url(url: Option<String>) -> Option<String> {
    url.filter(|url| is_web_url(url))
}

/// Whether `url` is an `http://` or `https://` URL with a host, and none of
/// the ASCII characters RFC 3986 leaves out of every URL that could end a
/// double-quoted HTML attribute, a tag or a line: controls, space, `"`,
/// `<`, `>`, `\` and `` ` ``. (`'` is a URL's, and characters beyond ASCII
/// stay: browsers take them, percent-encoded. Clients must still escape
/// what they show.)
pub(crate) fn is_web_url(url: &str) -> bool {
    let unfit = |byte: u8| {
        (byte <= b' ')
            | (byte == 0x7f)
            | (byte == b'"')
            | (byte == b'<')
            | (byte == b'>')
            | (byte == b'\\')
            | (byte == b'`')
    };
    // The host: what the authority holds after any user and before any
    // port (`https://:80/a` and `https://@/a` have none).
    let has_host = |rest: &str| {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let host_and_port = authority
            .rsplit_once('@')
            .map_or(authority, |(_, after)| after);
        !host_and_port.is_empty() && !host_and_port.starts_with(':')
    };
    match url.split_once("://") {
        Some((scheme, rest)) => {
            (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"))
                && has_host(rest)
                // Every byte looked at, with no early exit and no branch,
                // so it compiles to vector compares: a seventh of the
                // instructions of `all` on a typical avatar link.
                && !url.bytes().fold(false, |found, byte| found | unfit(byte))
        }
        None => false,
    }
}

/// A required handle ([`handle`]): the error says whether `field` is
/// missing or is there but no handle, without quoting it (upstream text).
/// Since 1.6.
pub fn required_handle(text: Option<String>, field: &str) -> Result<String, ProviderError> {
    let sent = text.is_some();
    handle(text).ok_or_else(|| {
        if sent {
            ProviderError::bad_response(format!(
                "`{field}` is not a handle (1-64 of A-Z a-z 0-9 . _, not dots only)"
            ))
        } else {
            ProviderError::missing(field)
        }
    })
}

/// A user's handle as the schema has it: without the leading `@`s some
/// upstreams write (no handle begins with one); `None` when absent, when
/// nothing is left, or (since 1.6) when what is left is no handle
/// ([`schema::is_handle`](crate::schema::is_handle)), which the host would
/// refuse: a required `username` is then missing (the next provider is
/// asked), an optional `author` `null`. Since plugin-api 1.4.
pub fn handle(text: Option<String>) -> Option<String> {
    let text = text?;
    match text.trim_start_matches('@') {
        rest if rest.len() == text.len() => Some(text),
        rest => Some(rest.to_owned()),
    }
    .filter(|handle| crate::schema::is_handle(handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Sample {
        id: Id,
        n: Option<Count>,
        f: Option<Flag>,
    }

    fn parse(json: &str) -> Result<Sample, serde_json::Error> {
        serde_json::from_slice(json.as_bytes())
    }

    #[test]
    fn ids_keep_every_digit() {
        for (json, want) in [
            (r#"{"id":"7312345678901234567"}"#, "7312345678901234567"),
            (r#"{"id":7312345678901234567}"#, "7312345678901234567"),
            (r#"{"id":99999999999999999999}"#, "99999999999999999999"),
            (r#"{"id":9007199254740993}"#, "9007199254740993"),
            (r#"{"id":"a\"b\\c"}"#, "a\"b\\c"),
        ] {
            assert_eq!(parse(json).unwrap().id.0, want, "{json}");
        }
        for bad in [
            r#"{"id":1.5}"#,
            r#"{"id":true}"#,
            r#"{"id":{}}"#,
            r#"{"id":1e3}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn counters_take_numbers_and_numeric_strings() {
        let n = |json: &str| parse(json).map(|s| s.n);
        assert_eq!(n(r#"{"id":"1","n":1234}"#).unwrap(), Some(Count(1234)));
        assert_eq!(n(r#"{"id":"1","n":"1234"}"#).unwrap(), Some(Count(1234)));
        assert_eq!(
            n(r#"{"id":"1","n":1400000.0}"#).unwrap(),
            Some(Count(1_400_000))
        );
        assert_eq!(n(r#"{"id":"1","n":null}"#).unwrap(), None);
        assert_eq!(n(r#"{"id":"1"}"#).unwrap(), None);
        for bad in [r#""12a""#, "-1", "1.5", r#""""#, r#""-3""#] {
            assert!(n(&format!(r#"{{"id":"1","n":{bad}}}"#)).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_take_bools_and_bits() {
        let f = |v: &str| parse(&format!(r#"{{"id":"1","f":{v}}}"#)).map(|s| s.f);
        assert_eq!(f("true").unwrap(), Some(Flag(true)));
        assert_eq!(f("0").unwrap(), Some(Flag(false)));
        assert_eq!(f("1").unwrap(), Some(Flag(true)));
        assert!(f("2").is_err());
    }

    #[test]
    fn parse_errors_never_quote_the_text() {
        #[derive(Debug, Deserialize)]
        struct Wrapper {
            #[allow(dead_code)]
            code: i64,
        }
        let echoed = br#"{"code":"echo sk_live_SECRET"}"#;
        let error = super::parse::<Wrapper>(echoed).unwrap_err();
        assert!(!error.message().contains("SECRET"), "{error}");
        assert!(error.message().contains("unexpected shape"), "{error}");
        let error = super::parse::<Wrapper>(b"<html>sk_live_SECRET").unwrap_err();
        assert!(!error.message().contains("SECRET"), "{error}");
    }

    #[test]
    fn valid_ids_have_the_schemas_shape() {
        let valid = |text: &str| Id(text.to_owned()).valid();
        assert_eq!(
            valid("7312345678901234567").as_deref(),
            Some("7312345678901234567")
        );
        for odd in ["", "-5", "u-123", "1.5", "123456789012345678901"] {
            assert_eq!(valid(odd), None, "{odd}");
        }
    }

    /// Abuse sweep: an upstream's `javascript:` avatar reached callers.
    #[test]
    fn only_web_urls_are_links() {
        let web_url = |text: &str| web_url(Some(text.to_owned()));
        for kept in [
            "https://cdn.example/a.webp?x=1",
            "http://h",
            "HTTPS://H/a",
            "https://p16.cdn.example/tos~tplv-0:100:100.jpeg?x-expires=1&sig=a%2Bb%3D&f=a|b",
            "https://cdn.example/café.jpg",
            "https://cdn.example/it's(1)[2]{3}^.jpg",
        ] {
            assert_eq!(web_url(kept).as_deref(), Some(kept));
        }
        for dropped in [
            "javascript:alert(1)//https://x",
            "data:image/png;base64,AAAA",
            "//cdn.example/a.webp",
            "/a.webp",
            "https://",
            "ftp://h/a",
            "",
            // No host.
            "https:///a.webp",
            "http://?x",
            "https://:80/a.png",
            "https://@/a.png",
            "https://user@:443/a.png",
            // What could end an HTML attribute or a header line.
            "https://cdn.example/a.webp\"><script>alert(1)</script>",
            "https://cdn.example/a<b",
            "https://cdn.example/a\u{0}b",
            "https://cdn.example/a\r\nSet-Cookie: x",
            "https://cdn.example/a b",
            "https://cdn.example/a`b",
            "https://cdn.example\\@evil/",
        ] {
            assert_eq!(web_url(dropped), None, "{dropped}");
        }
        assert_eq!(super::web_url(None), None);
    }

    #[test]
    fn handles_lose_their_leading_ats() {
        let handle = |text: Option<&str>| handle(text.map(str::to_owned));
        assert_eq!(handle(Some("@luna")).as_deref(), Some("luna"));
        assert_eq!(handle(Some("luna")).as_deref(), Some("luna"));
        assert_eq!(handle(Some("@@luna")).as_deref(), Some("luna"));
        assert_eq!(
            handle(Some("luna.bakes_1")).as_deref(),
            Some("luna.bakes_1")
        );
        // What is left must be a handle.
        assert_eq!(handle(Some("lu@na")), None);
        assert_eq!(handle(Some("@luna bakes")), None);
        assert_eq!(handle(Some("..")), None);
        let required = |text: Option<&str>| required_handle(text.map(str::to_owned), "user.h");
        assert_eq!(required(Some("@luna")).as_deref(), Ok("luna"));
        let odd = required(Some("Prim\\Secret\"Quote42")).unwrap_err();
        assert_eq!(odd.kind(), crate::ErrorKind::BadResponse);
        assert!(odd.message().contains("`user.h` is not a handle"), "{odd}");
        assert!(!odd.message().contains("Quote42"), "{odd}");
        assert_eq!(
            required(None).unwrap_err().message(),
            "required field `user.h` missing"
        );
        assert_eq!(handle(Some("@")), None);
        assert_eq!(handle(Some("@@")), None);
        assert_eq!(handle(Some("")), None);
        assert_eq!(handle(None), None);
    }

    #[test]
    fn seconds_become_milliseconds() {
        #[derive(Deserialize)]
        struct D {
            d: Option<Seconds>,
        }
        let ms = |json: &str| {
            serde_json::from_str::<D>(&format!(r#"{{"d":{json}}}"#)).map(|d| millis(d.d))
        };
        assert_eq!(ms("15.379").unwrap(), Some(15_379));
        assert_eq!(ms("15").unwrap(), Some(15_000));
        assert_eq!(ms(r#""0.5""#).unwrap(), Some(500));
        assert_eq!(ms("null").unwrap(), None);
        assert_eq!(ms("-1").unwrap(), None);
        assert_eq!(ms("1e300").unwrap(), None);
        assert!(ms(r#""15s""#).is_err());
        let whole = |json: &str| {
            serde_json::from_str::<Millis>(json)
                .ok()
                .and_then(Millis::whole)
        };
        assert_eq!(whole("15379"), Some(15_379));
        assert_eq!(whole("15379.5"), Some(15_380));
        assert_eq!(whole(r#""15379""#), Some(15_379));
        assert_eq!(whole("-1"), None);
        let field: Option<u8> = None;
        assert_eq!(
            field.required("user.handle").unwrap_err(),
            ProviderError::missing("user.handle")
        );
        assert_eq!(Some(3).required("x"), Ok(3));
    }

    #[test]
    fn bodies_that_are_not_utf8_read_as_before() {
        #[derive(Deserialize, Debug)]
        struct Named {
            name: String,
        }
        let body = |name: &[u8], skipped: &[u8]| {
            [
                br#"{"skipped":""#,
                skipped,
                br#"","name":""#,
                name,
                br#""}"#,
            ]
            .concat()
        };
        let read = super::parse::<Named>(&body(b"luna", "caf\\u00e9 \u{1f370}".as_bytes()));
        assert_eq!(read.unwrap().name, "luna");
        // Only a string the parse reads must be UTF-8, as with `from_slice`.
        let read = super::parse::<Named>(&body(b"luna", b"\xff\xfe"));
        assert_eq!(read.unwrap().name, "luna");
        let bad = super::parse::<Named>(&body(b"lu\xffna", b""));
        assert_eq!(bad.unwrap_err().kind(), crate::ErrorKind::BadResponse);
    }

    #[test]
    fn a_list_field_tells_absent_from_null() {
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            items: Field<Vec<u8>>,
        }
        let items = |json: &str| serde_json::from_str::<Page>(json).unwrap().items.items();
        assert_eq!(items(r#"{"items":[1,2]}"#), Some(vec![1, 2]));
        assert_eq!(items(r#"{"items":[]}"#), Some(vec![]));
        assert_eq!(items(r#"{"items":null}"#), Some(vec![]));
        assert_eq!(items("{}"), None);
    }

    #[test]
    fn unix_time_formats() {
        assert_eq!(
            unix_time(Some(Count(1_763_700_000))).unwrap().to_string(),
            "2025-11-21T04:40:00Z"
        );
        assert_eq!(unix_time(Some(Count(u64::MAX))), None);
        assert_eq!(unix_time(None), None);
    }
}
