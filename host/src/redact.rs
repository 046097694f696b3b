//! Upstream keys taken out of what plugins say.
//!
//! A plugin holds its upstream key, and a hurried one puts it into an error
//! message or a log line (the kit's `no-key-in-errors` rule catches that in
//! the author's tests, for the answers the tests try). The host handed each
//! key out, so it can take it out again: a plugin's error messages (logged,
//! or shown to a caller as a refusal's reason), its set-up errors, its log
//! lines and the upstream URLs it builds (logged at debug) pass through
//! here first. What is found is the key as given and as URLs carry it:
//! percent-encoded as a path segment (as `UpstreamRequest::segment` writes
//! it), as a query value (`query`, form encoding) and with every character
//! but letters and digits encoded. A key transformed otherwise (base64 in a
//! `Basic` header, say) is not recognised.
//!
//! Keys are remembered for the life of the process, not only while their
//! provider is configured: an instance set up before a reload may still be
//! finishing a request, and a retired key is still a secret.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::sync::lock;

/// What a key becomes.
pub const REDACTED: &str = "[redacted]";

/// What a path segment leaves as it is: RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Keys shorter than this are not searched for: text would be mangled
/// wherever two or three letters happen to match (no real upstream key is
/// that short, and a test's made-up one may be).
const SHORTEST: usize = 6;

/// The forms of every key handed to a plugin so far, longest first (so a
/// form that contains another is taken out whole). Read without a lock:
/// plugin log lines may be many.
static FORMS: std::sync::LazyLock<ArcSwap<Vec<Arc<str>>>> =
    std::sync::LazyLock::new(|| ArcSwap::from_pointee(Vec::new()));
/// Held while [`FORMS`] is replaced, so two keys remembered at once both
/// stay.
static REMEMBERING: Mutex<()> = Mutex::new(());

/// Remembers `key`, handed to a plugin, to be taken out of its text.
pub fn remember(key: &str) {
    if key.len() < SHORTEST {
        return;
    }
    let forms = [
        key.to_owned(),
        utf8_percent_encode(key, SEGMENT).to_string(),
        form_urlencoded::byte_serialize(key.as_bytes()).collect(),
        utf8_percent_encode(key, NON_ALPHANUMERIC).to_string(),
    ];
    let _held = lock(&REMEMBERING);
    let known = FORMS.load();
    let new: Vec<&str> = forms
        .iter()
        .map(String::as_str)
        .filter(|form| !known.iter().any(|k| &**k == *form))
        .collect();
    if new.is_empty() {
        return;
    }
    let mut forms: Vec<Arc<str>> = known.iter().cloned().collect();
    forms.extend(new.into_iter().map(Arc::from));
    forms.sort_by_key(|form| std::cmp::Reverse(form.len()));
    forms.dedup();
    FORMS.store(Arc::new(forms));
}

/// `text` with every remembered key replaced by [`REDACTED`].
pub fn text(text: &str) -> Cow<'_, str> {
    let forms = FORMS.load();
    let mut text = Cow::Borrowed(text);
    for form in forms.iter() {
        if text.contains(&**form) {
            text = Cow::Owned(text.replace(&**form, REDACTED));
        }
    }
    text
}

/// One provider's upstream key, to be found in its answers: an upstream
/// that echoes the key into a text field the plugin passes on (a name, a
/// bio) would hand it to every caller. Searched for as given (a JSON string
/// carries a key of URL-safe characters as it is); a key shorter than
/// `SHORTEST` (six bytes) is not searched for.
pub struct KeyFinder(Option<memchr::memmem::Finder<'static>>);

impl KeyFinder {
    pub fn new(key: &str) -> KeyFinder {
        KeyFinder(
            (key.len() >= SHORTEST)
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

/// `text`, redacted when it is written: for log lines, whose arguments are
/// formatted only when their level is on.
pub struct Redacted<'a>(pub &'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&text(self.0))
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
    fn remembered_keys_are_taken_out_whole_and_as_urls_carry_them() {
        remember("redact-test-key-1");
        remember("redact-test-key-1-longer");
        remember("redact test/key+2");
        remember("abc");
        assert_eq!(
            text("refused Bearer redact-test-key-1-longer and redact-test-key-1."),
            "refused Bearer [redacted] and [redacted]."
        );
        assert_eq!(
            text("GET /v1/u?k=redact%20test%2Fkey%2B2 (redact test/key+2)"),
            "GET /v1/u?k=[redacted] ([redacted])"
        );
        remember("sk-live/abc.d");
        assert_eq!(
            text("GET /u/sk-live%2Fabc.d?k=sk-live%2Fabc.d&j=redact+test%2Fkey%2B2"),
            "GET /u/[redacted]?k=[redacted]&j=[redacted]"
        );
        assert!(matches!(text("nothing secret, abc"), Cow::Borrowed(_)));
        assert_eq!(
            Redacted("a redact-test-key-1 b").to_string(),
            "a [redacted] b"
        );
    }
}
