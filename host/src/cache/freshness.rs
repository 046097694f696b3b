//! Whether a stored answer may be served: a pure function of its age, its
//! time to live, what the caller's `Cache-Control` allows, and, when the
//! providers could not answer, how stale an answer may still be served.

use std::time::Duration;

/// What a caller's `Cache-Control` asks of the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Directives {
    /// `no-cache`: fetch fresh (and refresh the stored answer).
    pub no_cache: bool,
    /// `max-age=N`: accept a stored answer at most N seconds old.
    pub max_age: Option<Duration>,
    /// `no-store`: keep nothing of this request's answer (a stored one
    /// may still be served).
    pub no_store: bool,
    /// `only-if-cached`: answer from the cache or not at all (`504`),
    /// never from the providers.
    pub only_if_cached: bool,
}

impl Directives {
    /// Whether no stored answer may answer, however fresh (`no-cache`):
    /// [`judge`] refuses each, and `only-if-cached` can then only be a
    /// `504`, which billing needs to know before the lookup.
    pub fn refuses_every_stored(&self) -> bool {
        self.no_cache
    }

    /// Reads the `Cache-Control` request header's values. Unknown
    /// directives are ignored, as RFC 9111 asks; a malformed `max-age` is
    /// ignored too (the default freshness applies).
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a str>) -> Directives {
        let mut directives = Directives::default();
        for directive in values.into_iter().flat_map(|v| v.split(',')) {
            let directive = directive.trim();
            let (name, value) = match directive.split_once('=') {
                Some((name, value)) => (name.trim(), Some(value.trim().trim_matches('"'))),
                None => (directive, None),
            };
            if name.eq_ignore_ascii_case("no-cache") {
                directives.no_cache = true;
            } else if name.eq_ignore_ascii_case("no-store") {
                directives.no_store = true;
            } else if name.eq_ignore_ascii_case("only-if-cached") {
                directives.only_if_cached = true;
            } else if name.eq_ignore_ascii_case("max-age") {
                if let Some(secs) = value.and_then(|v| v.parse::<u64>().ok()) {
                    let max_age = Duration::from_secs(secs);
                    // Several: the strictest wins.
                    directives.max_age =
                        Some(directives.max_age.map_or(max_age, |m| m.min(max_age)));
                }
            }
        }
        directives
    }
}

/// What to do with a stored answer for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Serve it.
    Fresh,
    /// Its time to live has passed: fetch anew (`fwd=stale`).
    Stale,
    /// The caller asked for a fresh one (`no-cache`) or a younger one
    /// (`max-age`): fetch anew (`fwd=request`).
    Refused,
}

/// The verdict on an answer `age` old, stored to live `ttl`.
pub fn judge(age: Duration, ttl: Duration, directives: Directives) -> Verdict {
    if directives.refuses_every_stored() {
        return Verdict::Refused;
    }
    if age >= ttl {
        return Verdict::Stale;
    }
    // In whole seconds, as the `Age` header counts it (RFC 9111, 4.2.3):
    // an answer sent with `Age: 0` is one `max-age=0` takes.
    match directives.max_age {
        Some(max_age) if age.as_secs() > max_age.as_secs() => Verdict::Refused,
        _ => Verdict::Fresh,
    }
}

/// Whether an answer `age` old, stored to live `ttl`, may stand in for one
/// the providers could not give: expired no longer than `window` ago.
pub fn usable_when_failing(age: Duration, ttl: Duration, window: Duration) -> bool {
    age.saturating_sub(ttl) <= window
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_freshness_table() {
        let none = Directives::default();
        let no_cache = Directives {
            no_cache: true,
            ..none
        };
        let max_age = |s| Directives {
            max_age: Some(S(s)),
            ..none
        };
        // (age, ttl, directives) => verdict
        let table = [
            (S(299), S(300), none, Verdict::Fresh),
            (S(300), S(300), none, Verdict::Stale),
            (S(400), S(300), no_cache, Verdict::Refused),
            (S(10), S(300), max_age(10), Verdict::Fresh),
            (S(11), S(300), max_age(10), Verdict::Refused),
            (S(0), S(300), max_age(0), Verdict::Fresh),
            (
                Duration::from_millis(900),
                S(300),
                max_age(0),
                Verdict::Fresh,
            ),
            (
                Duration::from_millis(10_900),
                S(300),
                max_age(10),
                Verdict::Fresh,
            ),
            (S(1), S(300), max_age(0), Verdict::Refused),
            (S(400), S(300), max_age(1000), Verdict::Stale),
        ];
        for (age, ttl, directives, verdict) in table {
            assert_eq!(
                judge(age, ttl, directives),
                verdict,
                "{age:?} {ttl:?} {directives:?}"
            );
        }
    }

    #[test]
    fn cache_control_is_read_leniently() {
        assert_eq!(Directives::parse([]), Directives::default());
        assert!(Directives::parse(["no-cache"]).no_cache);
        assert!(Directives::parse(["max-age=5, No-Cache"]).no_cache);
        assert_eq!(
            Directives::parse(["max-age=60", "max-age=\"30\""]).max_age,
            Some(S(30))
        );
        assert_eq!(
            Directives::parse(["max-age=x, private"]),
            Directives::default()
        );
        assert_eq!(
            Directives::parse(["x-private, nope"]),
            Directives::default()
        );
        let both = Directives::parse(["No-Store", "only-if-cached"]);
        assert!(both.no_store && both.only_if_cached && !both.no_cache);
    }
}
