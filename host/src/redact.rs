//! Upstream keys taken out of what plugins say, process-wide, and URLs
//! stripped of their user info and query for logs ([`url()`]).
//!
//! A plugin holds its upstream key, and a hurried one puts it into an error
//! message or a log line (the kit's `no-key-in-errors` rule catches that in
//! the author's tests, for the answers the tests try). The host handed each
//! key out, so it can take it out again: a plugin's error messages (logged,
//! or shown to a caller as a refusal's reason), its set-up errors, its log
//! lines and the upstream URLs it builds (logged at debug) pass through
//! here first. Which forms of a key are found, and how they are replaced,
//! is plugin-api's [`Redactor`] (the test kit shows authors the same);
//! this module keeps every key handed out.
//!
//! Keys are remembered for the life of the process, not only while their
//! provider is configured: an instance set up before a reload may still be
//! finishing a request, and a retired key is still a secret.

use std::borrow::Cow;
use std::fmt;
use std::sync::{LazyLock, PoisonError, RwLock};

use plugin_api::ffi::secret::Redactor;

/// Every key handed to a plugin so far.
static KNOWN: LazyLock<RwLock<Redactor>> = LazyLock::new(RwLock::default);

/// Remembers `key`, handed to a plugin, to be taken out of its text.
pub fn remember(key: &str) {
    let mut known = KNOWN.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(more) = known.with(key) {
        *known = more;
    }
}

/// `text` with every remembered key replaced by
/// [`REDACTED`](plugin_api::ffi::secret::REDACTED).
pub fn text(text: &str) -> Cow<'_, str> {
    KNOWN
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .text(text)
}

/// `text`, redacted when it is written: for log lines, whose arguments are
/// formatted only when their level is on.
pub struct Redacted<'a>(pub &'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&text(self.0))
    }
}

/// A URL without what may be secret in it (user info, query), for logs.
pub fn url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let query = if url.contains('?') { "?…" } else { "" };
    format!("{scheme}://{host}{path}{query}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_user_info_and_query() {
        assert_eq!(
            url("https://user:pw@api.example:8443/v1/x?key=sk&u=1#f"),
            "https://api.example:8443/v1/x?…"
        );
        assert_eq!(url("http://127.0.0.1:9"), "http://127.0.0.1:9");
    }
}
