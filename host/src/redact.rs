//! Upstream keys taken out of what plugins say.
//!
//! A plugin holds its upstream key, and a hurried one puts it into an error
//! message or a log line (the kit's `no-key-in-errors` rule catches that in
//! the author's tests, for the answers the tests try). The host handed each
//! key out, so it can take it out again: every text a plugin sends towards a
//! log line or a caller passes through [`text`] first.
//!
//! Keys are remembered for the life of the process, not only while their
//! provider is configured: an instance set up before a reload may still be
//! finishing a request, and a retired key is still a secret.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use crate::sync::lock;

/// What a key becomes.
pub const REDACTED: &str = "[redacted]";

/// Keys shorter than this are not searched for: text would be mangled
/// wherever two or three letters happen to match (no real upstream key is
/// that short, and a test's made-up one may be).
const SHORTEST: usize = 6;

/// Every key handed to a plugin so far, longest first (so a key that
/// contains another is taken out whole).
static KEYS: Mutex<Vec<Arc<str>>> = Mutex::new(Vec::new());

/// Remembers `key`, handed to a plugin, to be taken out of its text.
pub fn remember(key: &str) {
    if key.len() < SHORTEST {
        return;
    }
    let mut keys = lock(&KEYS);
    if !keys.iter().any(|k| &**k == key) {
        keys.push(key.into());
        keys.sort_by_key(|k| std::cmp::Reverse(k.len()));
    }
}

/// `text` with every remembered key replaced by [`REDACTED`].
pub fn text(text: &str) -> Cow<'_, str> {
    let keys = lock(&KEYS);
    let mut text = Cow::Borrowed(text);
    for key in keys.iter() {
        if text.contains(&**key) {
            text = Cow::Owned(text.replace(&**key, REDACTED));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_keys_are_taken_out_whole() {
        remember("redact-test-key-1");
        remember("redact-test-key-1-longer");
        remember("abc");
        assert_eq!(
            text("refused Bearer redact-test-key-1-longer and redact-test-key-1."),
            "refused Bearer [redacted] and [redacted]."
        );
        assert!(matches!(text("nothing secret, abc"), Cow::Borrowed(_)));
    }
}
