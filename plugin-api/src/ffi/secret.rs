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

/// The whole forms of `key` in text a plugin writes: as given, as a path
/// segment carries it
/// ([`UpstreamRequest::segment`](crate::UpstreamRequest::segment)), as a
/// query value carries it (form encoding, as
/// [`query`](crate::UpstreamRequest::query) writes it) and with every byte
/// but letters and digits percent-encoded. A key of letters and digits
/// alone has one form. None for a key shorter than [`SHORTEST_KEY`].
/// [`KeyFinder`] finds each of these, and any mix of them.
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

/// Takes keys out of text: every spelling of every key it knows (see
/// [`KeyFinder`]) becomes [`REDACTED`].
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// Longest key first, so a key that contains another is taken out
    /// whole.
    keys: Vec<Arc<KeyFinder>>,
}

impl Redactor {
    /// A redactor of `key` alone.
    pub fn of(key: &str) -> Redactor {
        Redactor::default().with(key).unwrap_or_default()
    }

    /// This redactor knowing `key` too; `None` when it adds nothing (known
    /// already, or too short).
    pub fn with(&self, key: &str) -> Option<Redactor> {
        if key.len() < SHORTEST_KEY || self.keys.iter().any(|known| *known.key == *key.as_bytes()) {
            return None;
        }
        let mut keys = self.keys.clone();
        keys.push(Arc::new(KeyFinder::new(key)));
        keys.sort_by_key(|known| std::cmp::Reverse(known.key.len()));
        Some(Redactor { keys })
    }

    /// `text` with every known key taken out.
    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut text = Cow::Borrowed(text);
        for key in &self.keys {
            let Some(first) = key.find(&text) else {
                continue;
            };
            let mut redacted = String::with_capacity(text.len());
            let mut rest = &text[..];
            let mut found = Some(first);
            while let Some(span) = found {
                redacted.push_str(&rest[..span.start]);
                redacted.push_str(REDACTED);
                rest = &rest[span.end..];
                found = key.find(rest);
            }
            redacted.push_str(rest);
            text = Cow::Owned(redacted);
        }
        text
    }
}

/// One key, to be found in text: in a plugin's answers (an upstream that
/// echoes the key into a text field the plugin passes on, a name, a bio, a
/// URL, would hand it to every caller) and in what it says (a [`Redactor`]).
///
/// The key is found however each of its bytes is written: as it is, `%HH`
/// in either case (whatever an encoder chose to leave as it is: every
/// [`key_forms`] form, and any mix of them), `+` for a space, or as JSON
/// strings escape it (`\"`, `\\`, `\/`, `\u00HH`), a JSON string within a
/// JSON string too (up to eight backslashes before a byte).
/// A key shorter than [`SHORTEST_KEY`] is never found. It runs on every
/// answer, so it first looks for the key's longest run of letters and
/// digits, which those spellings keep as it is (no URL encoder escapes a
/// letter or a digit), and reads the rest of the key around that only
/// where it is found: a key whose letters were escaped on purpose is not
/// found, as a key transformed otherwise (base64, reversed) is not.
#[derive(Debug, Clone)]
pub struct KeyFinder {
    key: Box<[u8]>,
    /// The longest run of letters and digits and where it starts in the
    /// key; `None` when the key has no run that long (every place a
    /// spelling of its first byte may begin is then tried).
    anchor: Option<(memchr::memmem::Finder<'static>, usize)>,
}

impl KeyFinder {
    /// The shortest run of letters and digits searched for first.
    const SHORTEST_ANCHOR: usize = 4;

    pub fn new(key: &str) -> KeyFinder {
        let bytes = key.as_bytes();
        let mut longest = (0, 0);
        let mut start = 0;
        for (i, byte) in bytes.iter().chain([&b'-']).enumerate() {
            if !byte.is_ascii_alphanumeric() {
                if i - start > longest.1 - longest.0 {
                    longest = (start, i);
                }
                start = i + 1;
            }
        }
        let anchor = (longest.1 - longest.0 >= KeyFinder::SHORTEST_ANCHOR).then(|| {
            let run = &bytes[longest.0..longest.1];
            (memchr::memmem::Finder::new(run).into_owned(), longest.0)
        });
        let key = if key.len() < SHORTEST_KEY {
            Box::default()
        } else {
            bytes.into()
        };
        KeyFinder { key, anchor }
    }

    /// Whether `text` holds the key, in any spelling.
    pub fn is_in(&self, text: &str) -> bool {
        self.find(text).is_some()
    }

    /// Where in `text` the key first stands, in any spelling.
    pub fn find(&self, text: &str) -> Option<std::ops::Range<usize>> {
        if self.key.is_empty() {
            return None;
        }
        let text = text.as_bytes();
        match &self.anchor {
            Some((run, offset)) => run.find_iter(text).find_map(|at| {
                let end = self.spelled_forward(text, at, *offset)?;
                let start = self.spelled_backward(text, at, *offset)?;
                Some(start..end)
            }),
            None => {
                // Only where a spelling of the first byte may begin.
                let first = self.key[0];
                let begins = |&at: &usize| {
                    let b = text[at];
                    b == first || b == b'%' || b == b'\\' || (first == b' ' && b == b'+')
                };
                (0..text.len()).filter(begins).find_map(|at| {
                    let end = self.spelled_forward(text, at, 0)?;
                    Some(at..end)
                })
            }
        }
    }

    /// Where the key's bytes from `from` on, spelled any way, end when
    /// they start at `at`; the farthest end when several spellings fit.
    fn spelled_forward(&self, text: &[u8], at: usize, from: usize) -> Option<usize> {
        let mut ends = Readings::at(at);
        for &byte in &self.key[from..] {
            let mut next = Readings::default();
            for at in ends.iter() {
                byte_ends(text, at, byte, &mut next);
            }
            ends = next.nonempty()?;
        }
        ends.iter().max()
    }

    /// Where the key's bytes before `upto`, spelled any way, start when
    /// they end at `end`; the earliest start when several spellings fit.
    fn spelled_backward(&self, text: &[u8], end: usize, upto: usize) -> Option<usize> {
        let mut starts = Readings::at(end);
        for &byte in self.key[..upto].iter().rev() {
            let mut next = Readings::default();
            for end in starts.iter() {
                byte_starts(text, end, byte, &mut next);
            }
            starts = next.nonempty()?;
        }
        starts.iter().min()
    }
}

/// Escape layers (backslashes before a byte, a JSON string within a JSON
/// string) read through; deeper ones are not a spelling anyone writes.
const MOST_BACKSLASHES: usize = 8;

/// Where the key may have been read to so far, without allocating: its
/// readings rarely differ, and a few more than ever do are kept.
#[derive(Default, Clone, Copy)]
struct Readings {
    at: [usize; 8],
    len: usize,
}

impl Readings {
    fn at(position: usize) -> Readings {
        let mut readings = Readings::default();
        readings.push(position);
        readings
    }

    fn push(&mut self, position: usize) {
        if self.len < self.at.len() && !self.at[..self.len].contains(&position) {
            self.at[self.len] = position;
            self.len += 1;
        }
    }

    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.at[..self.len].iter().copied()
    }

    fn nonempty(self) -> Option<Readings> {
        (self.len > 0).then_some(self)
    }
}

/// The byte two hex digits (either case) write.
fn hex_byte(digits: &[u8]) -> Option<u8> {
    let digit = |b: u8| char::from(b).to_digit(16);
    match digits {
        [high, low] => Some((digit(*high)? * 16 + digit(*low)?) as u8),
        _ => None,
    }
}

/// Where `byte`, spelled any way, ends in `text` when it starts at `at`:
/// behind up to [`MOST_BACKSLASHES`] escaping backslashes, as it is, `%HH`,
/// `+` for a space, or (behind one backslash at least) `u00HH`.
fn byte_ends(text: &[u8], at: usize, byte: u8, ends: &mut Readings) {
    let backslashes = backslash_run(text.get(at..).unwrap_or_default().iter());
    for escaped in 0..=backslashes {
        let p = at + escaped;
        if text.get(p) == Some(&byte) || (byte == b' ' && text.get(p) == Some(&b'+')) {
            ends.push(p + 1);
        }
        if text.get(p) == Some(&b'%') && text.get(p + 1..p + 3).and_then(hex_byte) == Some(byte) {
            ends.push(p + 3);
        }
        if escaped > 0
            && text.get(p..p + 3) == Some(b"u00")
            && text.get(p + 3..p + 5).and_then(hex_byte) == Some(byte)
        {
            ends.push(p + 5);
        }
    }
}

/// Where `byte`, spelled any way ([`byte_ends`], the one definition of
/// the spellings), starts in `text` when it ends at `end`: each place no
/// farther back than the longest spelling (`\\u00HH`) that reads forward to
/// `end`, and behind it any further escaping backslashes.
fn byte_starts(text: &[u8], end: usize, byte: u8, starts: &mut Readings) {
    const LONGEST: usize = 6;
    for start in end.saturating_sub(LONGEST)..end {
        let mut ends = Readings::default();
        byte_ends(text, start, byte, &mut ends);
        if ends.iter().any(|reached| reached == end) {
            for escaped in 0..=backslash_run(text[..start].iter().rev()) {
                starts.push(start - escaped);
            }
        }
    }
}

/// How many backslashes `bytes` begin with, up to [`MOST_BACKSLASHES`].
fn backslash_run<'a>(bytes: impl Iterator<Item = &'a u8>) -> usize {
    bytes
        .take(MOST_BACKSLASHES)
        .take_while(|&&b| b == b'\\')
        .count()
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
        // Encoders that leave other bytes as they are, and mixed cases.
        for answer in [
            "PrimSecret%2B/%3DKey~42",
            "PrimSecret+%2F=Key~42",
            "PrimSecret%2b%2F%3dKey%7e42",
            r"PrimSecret\u002B\/=Key~42",
        ] {
            assert!(finder.is_in(answer), "{answer}");
        }
        let quoted = KeyFinder::new(r#"sk"live\key"#);
        let answer = serde_json::json!({ "bio": r#"sk"live\key"# }).to_string();
        assert!(quoted.is_in(&answer), "{answer}");
        // A JSON string within a JSON string (its value holds `\/`), and
        // `\u00HH` in a value: what callers read is one decoding away.
        let nested = serde_json::json!({ "bio": r"PrimSecret+\/=Key\u007e42" }).to_string();
        assert!(finder.is_in(&nested), "{nested}");
        let twice = serde_json::json!({ "debug": serde_json::json!({ "k": "x\"PrimSecret+/=Key~42" }).to_string() });
        assert!(finder.is_in(&twice.to_string()), "{twice}");
        assert!(quoted.is_in(&serde_json::json!({ "d": answer }).to_string()));
        // Near misses are not the key.
        for near in [
            "PrimSecret+/=Key~43",
            "PrimSecret+/Key~42",
            "PrimSecre+/=Key~42",
        ] {
            assert!(!finder.is_in(near), "{near}");
        }
        // Every form `key_forms` lists, for keys with and without a run of
        // letters long enough to look for first.
        for key in ["PrimSecret+/=Key~42", "a+b/c=d.e f", r#"sk"live\key"#] {
            let finder = KeyFinder::new(key);
            for form in key_forms(key) {
                let text = format!("before {form} after");
                let span = finder
                    .find(&text)
                    .unwrap_or_else(|| panic!("{key}: {form}"));
                assert_eq!(&text[span], form, "{key}");
            }
        }
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
            ["k y/é", "k%20y%2F%C3%A9", "k+y%2F%C3%A9"].map(str::to_owned)
        );
        assert_eq!(key_forms("sklive0abc"), ["sklive0abc"]);
        assert!(key_forms("short").is_empty());
    }
}
