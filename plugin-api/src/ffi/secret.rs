//! A provider's upstream key, as the host looks for it in what the plugin
//! says: one definition for the host and for the test kit
//! (`plugin_api::testing`), so an author's tests see what callers and logs
//! will.
//!
//! A plugin holds its key, and a hurried one puts it into an error message
//! or a log line; an upstream may echo it into a field the plugin passes
//! on. The host handed the key out, so it can take it out again
//! ([`Redactor`]) and refuse an answer that carries it ([`KeyFinder`]).
//! Only the forms a key takes in URLs and in JSON strings are recognised,
//! not one transformed otherwise (base64 in a `Basic` header, say), and a
//! key shorter than [`SHORTEST_KEY`] is never looked for.

use std::borrow::Cow;
use std::sync::Arc;

use crate::upstream::{is_unreserved, push_encoded};

/// What a key becomes in redacted text.
pub const REDACTED: &str = "[redacted]";

/// Keys shorter than this are not looked for: text would be mangled
/// wherever two or three letters happen to match (no real upstream key is
/// that short, and a test's made-up one may be).
pub const SHORTEST_KEY: usize = 6;

/// The forms of `key` in text a plugin writes or an upstream echoes: as
/// given, as a path segment carries it
/// ([`UpstreamRequest::segment`](crate::UpstreamRequest::segment)), as a
/// query value carries it (form encoding, as
/// [`query`](crate::UpstreamRequest::query) writes it) and with every byte
/// but letters and digits percent-encoded, each escape's hex digits in
/// either case; and each of those as a JSON string carries it (a `"` or
/// `\` escaped), which any client reads back as the key. A key of letters
/// and digits alone has one form. None for a key shorter than
/// [`SHORTEST_KEY`].
pub fn key_forms(key: &str) -> Vec<String> {
    if key.len() < SHORTEST_KEY {
        return Vec::new();
    }
    let encoded = |kept: fn(u8) -> bool| {
        let mut form = String::with_capacity(key.len() * 3);
        push_encoded(&mut form, key, kept);
        form
    };
    let mut forms = vec![
        key.to_owned(),
        encoded(is_unreserved),
        form_urlencoded::byte_serialize(key.as_bytes()).collect(),
        encoded(|b| b.is_ascii_alphanumeric()),
    ];
    let lower_hex: Vec<String> = forms.iter().map(|form| lower_hex_escapes(form)).collect();
    forms.extend(lower_hex);
    let in_json: Vec<String> = forms.iter().map(|form| json_string_body(form)).collect();
    forms.extend(in_json);
    forms.sort();
    forms.dedup();
    forms
}

/// `form` with the hex digits of its `%` escapes in lower case.
fn lower_hex_escapes(form: &str) -> String {
    let mut lowered = String::with_capacity(form.len());
    let mut digits_left = 0;
    for c in form.chars() {
        if digits_left > 0 {
            lowered.push(c.to_ascii_lowercase());
            digits_left -= 1;
        } else {
            lowered.push(c);
            if c == '%' {
                digits_left = 2;
            }
        }
    }
    lowered
}

/// `text` as it stands between the quotes of the JSON string serde_json
/// writes for it.
fn json_string_body(text: &str) -> String {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    quoted
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text)
        .to_owned()
}

/// Takes keys out of text: every form ([`key_forms`]) of every key it
/// knows becomes [`REDACTED`].
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// Longest first, so a form that contains another is taken out whole.
    forms: Vec<Arc<str>>,
}

impl Redactor {
    /// A redactor of `key` alone.
    pub fn of(key: &str) -> Redactor {
        Redactor::default().with(key).unwrap_or_default()
    }

    /// This redactor knowing `key` too; `None` when it adds nothing (known
    /// already, or too short).
    pub fn with(&self, key: &str) -> Option<Redactor> {
        let new: Vec<String> = key_forms(key)
            .into_iter()
            .filter(|form| !self.forms.iter().any(|known| **known == **form))
            .collect();
        if new.is_empty() {
            return None;
        }
        let mut forms = self.forms.clone();
        forms.extend(new.into_iter().map(Arc::from));
        forms.sort_by_key(|form| std::cmp::Reverse(form.len()));
        Some(Redactor { forms })
    }

    /// `text` with every known key taken out.
    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut text = Cow::Borrowed(text);
        for form in &self.forms {
            if text.contains(&**form) {
                text = Cow::Owned(text.replace(&**form, REDACTED));
            }
        }
        text
    }
}

/// One key, to be found in a plugin's answers (JSON text): an upstream
/// that echoes the key into a text field the plugin passes on (a name, a
/// bio, a URL) would hand it to every caller. Looked for in every form
/// ([`key_forms`]); a key shorter than [`SHORTEST_KEY`] is never found.
/// It runs on every answer, so it first looks for the key's longest run of
/// letters and digits, which every form holds as it is, and only where
/// that is found for the forms themselves.
#[derive(Debug, Clone)]
pub struct KeyFinder {
    /// `None` when the key has no run long enough to be worth it.
    anchor: Option<memchr::memmem::Finder<'static>>,
    forms: Vec<memchr::memmem::Finder<'static>>,
}

impl KeyFinder {
    /// The shortest run of letters and digits searched for first.
    const SHORTEST_ANCHOR: usize = 4;

    pub fn new(key: &str) -> KeyFinder {
        let finder = |text: &str| memchr::memmem::Finder::new(text.as_bytes()).into_owned();
        let forms: Vec<_> = key_forms(key).iter().map(|form| finder(form)).collect();
        let anchor = key
            .split(|c: char| !c.is_ascii_alphanumeric())
            .max_by_key(|run| run.len())
            .filter(|run| forms.len() > 1 && run.len() >= KeyFinder::SHORTEST_ANCHOR)
            .map(finder);
        KeyFinder { anchor, forms }
    }

    /// Whether `text` holds the key, in any form.
    pub fn is_in(&self, text: &str) -> bool {
        let text = text.as_bytes();
        if let Some(anchor) = &self.anchor {
            if anchor.find(text).is_none() {
                return false;
            }
        }
        self.forms.iter().any(|form| form.find(text).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_in_an_answer() {
        let finder = KeyFinder::new("finder-test-key");
        assert!(finder.is_in(r#"{"bio":"my key is finder-test-key!"}"#));
        assert!(!finder.is_in(r#"{"bio":"finder-test"}"#));
        assert!(!KeyFinder::new("abc").is_in("abc"));
    }

    /// Abuse sweep: a base64 key echoed URL-encoded into a bio or a URL,
    /// or a key with a `"` JSON-escaped, reached callers.
    #[test]
    fn a_key_is_found_as_urls_and_json_strings_carry_it() {
        let finder = KeyFinder::new("PrimSecret+/=Key~42");
        for answer in [
            r#"{"bio":"PrimSecret%2B%2F%3DKey~42"}"#,
            r#"{"bio":"PrimSecret%2b%2f%3dKey~42"}"#,
            r#"{"avatar_url":"https://cdn/a.jpg?key=PrimSecret%2B%2F%3DKey%7E42"}"#,
            r#"{"text":"PrimSecret+/=Key~42"}"#,
        ] {
            assert!(finder.is_in(answer), "{answer}");
        }
        let quoted = KeyFinder::new(r#"sk"live\key"#);
        let answer = serde_json::json!({ "bio": r#"sk"live\key"# }).to_string();
        assert!(quoted.is_in(&answer), "{answer}");
        assert!(!finder.is_in(r#"{"bio":"PrimSecret Key 42"}"#));
    }

    #[test]
    fn keys_are_taken_out_whole_and_as_urls_carry_them() {
        let redactor = Redactor::of("redact-test-key-1");
        let redactor = redactor.with("redact-test-key-1-longer").unwrap();
        let redactor = redactor.with("redact test/key+2").unwrap();
        assert!(redactor.with("abc").is_none(), "too short");
        assert!(redactor.with("redact-test-key-1").is_none(), "known");
        assert_eq!(
            redactor.text("refused Bearer redact-test-key-1-longer and redact-test-key-1."),
            "refused Bearer [redacted] and [redacted]."
        );
        assert_eq!(
            redactor.text("GET /v1/u?k=redact%20test%2Fkey%2B2 (redact test/key+2)"),
            "GET /v1/u?k=[redacted] ([redacted])"
        );
        let redactor = redactor.with("sk-live/abc.d").unwrap();
        assert_eq!(
            redactor.text("GET /u/sk-live%2Fabc.d?k=sk-live%2Fabc.d&j=redact+test%2Fkey%2B2"),
            "GET /u/[redacted]?k=[redacted]&j=[redacted]"
        );
        assert!(matches!(
            redactor.text("nothing secret, abc"),
            Cow::Borrowed(_)
        ));
        assert_eq!(Redactor::of("abc").text("abc"), "abc");
    }

    #[test]
    fn a_key_s_forms_are_those_urls_carry() {
        assert_eq!(
            key_forms("k y/é"),
            [
                "k y/é",
                "k%20y%2F%C3%A9",
                "k%20y%2f%c3%a9",
                "k+y%2F%C3%A9",
                "k+y%2f%c3%a9"
            ]
            .map(str::to_owned)
        );
        assert_eq!(key_forms("sklive0abc"), ["sklive0abc"]);
        assert!(key_forms(r#"k"ey\1"#).contains(&r#"k\"ey\\1"#.to_owned()));
        assert!(key_forms("short").is_empty());
    }
}
