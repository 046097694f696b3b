//! The `Cache-Status` header (RFC 9211) of every data answer: whether the
//! cache answered and, if not, why it went to the providers. The cache is
//! named `socialgate`, never after a provider.

use std::time::Duration;

use hyper::header::HeaderValue;

/// Why the request went to the providers (`fwd=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    /// Nothing was stored.
    Miss,
    /// What was stored had expired.
    Stale,
    /// The caller's `Cache-Control` refused what was stored.
    Request,
    /// The cache is off for this endpoint.
    Bypass,
}

impl Forward {
    /// The `fwd=` token.
    fn token(self) -> &'static str {
        match self {
            Forward::Miss => "miss",
            Forward::Stale => "stale",
            Forward::Request => "request",
            Forward::Bypass => "bypass",
        }
    }
}

/// What the cache did for one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    /// Served from the cache, `ttl` seconds before it expires.
    Hit { ttl: i64 },
    /// Fetched: why, whether it was stored (and for how long), and whether
    /// this request waited on another's fetch.
    Fetched {
        forward: Forward,
        stored: Option<u64>,
        collapsed: bool,
    },
    /// The providers failed and the stored answer stood in: one that had
    /// expired (`forward` is `Stale`, `ttl` how long ago, negative), or one
    /// still fresh that the request asked to refresh (`Request`, `ttl` how
    /// long it has left); `collapsed` when the failed fetch was another
    /// request's, which this one waited on.
    StoodIn {
        forward: Forward,
        ttl: i64,
        collapsed: bool,
    },
    /// Not answered: the request took only a stored answer
    /// (`only-if-cached`), and no fresh one was stored.
    NotStored,
}

impl CacheStatus {
    pub fn bypass() -> CacheStatus {
        CacheStatus::Fetched {
            forward: Forward::Bypass,
            stored: None,
            collapsed: false,
        }
    }

    /// The header's value.
    pub fn header_value(&self) -> HeaderValue {
        // An answer of an endpoint the cache is off for: the most common.
        if *self == CacheStatus::bypass() {
            return HeaderValue::from_static("socialgate; fwd=bypass");
        }
        let text = match *self {
            CacheStatus::Hit { ttl } => format!("socialgate; hit; ttl={ttl}"),
            CacheStatus::Fetched {
                forward,
                stored,
                collapsed,
            } => {
                let mut value = format!("socialgate; fwd={}", forward.token());
                if let Some(ttl) = stored {
                    value.push_str(&format!("; stored; ttl={ttl}"));
                }
                if collapsed {
                    value.push_str("; collapsed");
                }
                value
            }
            CacheStatus::StoodIn {
                forward,
                ttl,
                collapsed,
            } => {
                let mut value = format!("socialgate; fwd={}; ttl={ttl}", forward.token());
                if collapsed {
                    value.push_str("; collapsed");
                }
                value
            }
            // Nothing went forward, so no `fwd`: RFC 9211's `detail` says why.
            CacheStatus::NotStored => {
                return HeaderValue::from_static("socialgate; detail=only-if-cached")
            }
        };
        HeaderValue::try_from(text).expect("visible ASCII")
    }
}

impl CacheStatus {
    /// A short word for the request's log line.
    pub fn log_value(&self) -> &'static str {
        match self {
            CacheStatus::Hit { .. } => "hit",
            CacheStatus::Fetched {
                forward: Forward::Bypass,
                ..
            } => "bypass",
            CacheStatus::Fetched {
                collapsed: true, ..
            } => "collapsed",
            CacheStatus::Fetched { .. } => "miss",
            CacheStatus::StoodIn {
                forward: Forward::Stale,
                ..
            } => "stale",
            CacheStatus::StoodIn { .. } => "stood_in",
            CacheStatus::NotStored => "not_stored",
        }
    }
}

/// `ttl` minus the `Age` the answer carries (its age in whole seconds,
/// rounded down as RFC 9111 asks), so that `Age` plus this is the `ttl`
/// the answer was stored with, and a client taking `Age` off `max-age`
/// finds the same time left. Negative once expired (-1 in the second
/// after, when the whole seconds alone would say 0).
pub fn seconds_left(ttl: Duration, age: Duration) -> i64 {
    let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    let left = secs(ttl).saturating_sub(secs(age));
    if age < ttl {
        left
    } else {
        left.min(-1)
    }
}
