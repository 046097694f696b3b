//! A provider's upstream key, as the host looks for it in what the plugin
//! says: one definition for the host and for the test kit
//! (`plugin_api::testing`), so an author's tests see what callers and logs
//! will.
//!
//! A plugin holds its key, and a hurried one puts it into an error message
//! or a log line; an upstream may echo it into a field the plugin passes
//! on. The host handed the key out, so it can take it out again
//! ([`Redactor`]) and refuse an answer that carries it ([`KeyFinder`]).
//! Only the forms a key takes in URLs are recognised, not one transformed
//! otherwise (base64 in a `Basic` header, say), and a key shorter than
//! [`SHORTEST_KEY`] is never looked for.

use std::borrow::Cow;
use std::sync::Arc;

use crate::upstream::{is_unreserved, push_encoded};

/// What a key becomes in redacted text.
pub const REDACTED: &str = "[redacted]";

/// Keys shorter than this are not looked for: text would be mangled
/// wherever two or three letters happen to match (no real upstream key is
/// that short, and a test's made-up one may be).
pub const SHORTEST_KEY: usize = 6;

/// The forms of `key` in text a plugin writes: as given, as a path segment
/// carries it ([`UpstreamRequest::segment`](crate::UpstreamRequest::segment)),
/// as a query value carries it (form encoding, as
/// [`query`](crate::UpstreamRequest::query) writes it) and with every byte
/// but letters and digits percent-encoded. None for a key shorter than
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
    forms.sort();
    forms.dedup();
    forms
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

/// One key, to be found in a plugin's answers: an upstream that echoes the
/// key into a text field the plugin passes on (a name, a bio) would hand it
/// to every caller. Looked for as given (a JSON string carries a key of
/// URL-safe characters as it is); a key shorter than [`SHORTEST_KEY`] is
/// never found.
#[derive(Debug, Clone)]
pub struct KeyFinder(Option<memchr::memmem::Finder<'static>>);

impl KeyFinder {
    pub fn new(key: &str) -> KeyFinder {
        KeyFinder(
            (key.len() >= SHORTEST_KEY)
                .then(|| memchr::memmem::Finder::new(key.as_bytes()).into_owned()),
        )
    }

    /// Whether `text` holds the key.
    pub fn is_in(&self, text: &str) -> bool {
        self.0
            .as_ref()
            .is_some_and(|finder| finder.find(text.as_bytes()).is_some())
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
            ["k y/é", "k%20y%2F%C3%A9", "k+y%2F%C3%A9"].map(str::to_owned)
        );
        assert!(key_forms("short").is_empty());
    }
}
