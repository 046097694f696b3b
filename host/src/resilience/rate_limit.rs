//! A token bucket per API key: `per_second` tokens a second, up to `burst`
//! saved. Checked right after the key, before any upstream call.
//!
//! Each check also says where the bucket stands, which the answer tells the
//! caller in the `RateLimit-Policy` and `RateLimit` fields of
//! draft-ietf-httpapi-ratelimit-headers (08 and later): the policy is the
//! bucket as a quota of `burst` requests over the window that refills it
//! (`"default";q=10;w=2`), the state is the whole tokens left and the
//! seconds until one more (`"default";r=7;t=1`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hyper::header::HeaderValue;
use tokio::time::Instant;

use serde::Deserialize;

use crate::settings::{ConfigError, Context};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimitConfig {
    pub per_second: f64,
    pub burst: f64,
}

/// `[rate_limit]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "the [rate_limit] table")]
pub struct RawRateLimit {
    per_second: f64,
    burst: Option<f64>,
}

/// The slowest rate a key may be held to: one request in about 11.6 days.
const MIN_PER_SECOND: f64 = 1e-6;

impl RateLimitConfig {
    /// `[rate_limit]`; absent means no limit. `burst` defaults to one
    /// second's worth, and at least 1.
    pub fn from_raw(
        raw: Option<RawRateLimit>,
        cx: &Context,
    ) -> Result<Option<RateLimitConfig>, ConfigError> {
        let Some(raw) = raw else { return Ok(None) };
        let burst = raw.burst.unwrap_or(raw.per_second.max(1.0));
        // A policy floor: far below it (about 5e-20) a wait for the next
        // token overflows a `Duration`, and every request would fail; no
        // operator means a limit slower than this.
        if !(raw.per_second.is_finite() && raw.per_second >= MIN_PER_SECOND) {
            return Err(cx.invalid(
                "[rate_limit] per_second",
                "must be at least 0.000001 (a request in about 11.6 days)",
            ));
        }
        if !(burst.is_finite() && burst >= 1.0) {
            return Err(cx.invalid("[rate_limit] burst", "must be at least 1"));
        }
        Ok(Some(RateLimitConfig {
            per_second: raw.per_second,
            burst,
        }))
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Buckets by key name. Names come from the keys file, so the map is bounded
/// by the number of issued keys.
#[derive(Debug)]
pub struct RateLimiter {
    config: RateLimitConfig,
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// Where a key's bucket stands after a check: the `RateLimit` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// Whole tokens left (`r`).
    pub remaining: u64,
    /// Seconds until one more token (`t`); 0 when the bucket is full.
    pub reset_secs: u64,
}

impl Standing {
    /// A refused request's: nothing left until `wait` has passed.
    pub fn exhausted(wait: Duration) -> Standing {
        Standing {
            remaining: 0,
            reset_secs: retry_after_secs(wait),
        }
    }

    /// The `RateLimit` field value.
    pub fn header(&self) -> HeaderValue {
        let value = format!("\"default\";r={};t={}", self.remaining, self.reset_secs);
        // Digits and ASCII punctuation only: always a valid header value.
        HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

impl RateLimitConfig {
    /// The `RateLimit-Policy` field value: `burst` requests (`q`, whole)
    /// over the seconds an empty bucket takes to fill (`w`, at least 1).
    pub fn policy_field(&self) -> String {
        let quota = self.burst.floor() as u64;
        let window = (self.burst / self.per_second).ceil().max(1.0) as u64;
        format!("\"default\";q={quota};w={window}")
    }
}

impl RateLimiter {
    pub fn new(config: RateLimitConfig) -> RateLimiter {
        RateLimiter {
            config,
            buckets: Mutex::new(HashMap::default()),
        }
    }

    pub fn config(&self) -> RateLimitConfig {
        self.config
    }

    /// The `RateLimit-Policy` field value.
    pub fn policy_header(&self) -> HeaderValue {
        HeaderValue::from_str(&self.config.policy_field())
            .unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// Takes a token for `key` and says where its bucket stands, or says
    /// how long until a token is there.
    pub fn check(&self, key: &str, now: Instant) -> Result<Standing, Duration> {
        let RateLimitConfig { per_second, burst } = self.config;
        let mut buckets = crate::sync::lock(&self.buckets);
        let bucket = match buckets.get_mut(key) {
            Some(bucket) => bucket,
            None => buckets.entry(key.to_owned()).or_insert(Bucket {
                tokens: burst,
                at: now,
            }),
        };
        let refill = now.saturating_duration_since(bucket.at).as_secs_f64() * per_second;
        bucket.tokens = (bucket.tokens + refill).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            let whole = bucket.tokens.floor();
            let reset_secs = if bucket.tokens >= burst {
                0
            } else {
                // Until the fraction grows into one more whole token.
                let wait = (whole + 1.0 - bucket.tokens) / per_second;
                retry_after_secs(Duration::from_secs_f64(wait))
            };
            Ok(Standing {
                remaining: whole as u64,
                reset_secs,
            })
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / per_second))
        }
    }
}

/// `Retry-After` is whole seconds: round up, and never say 0.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let rounded_up = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    rounded_up.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_buckets_fields_count_the_seconds_to_the_next_token() {
        let t = Instant::now();
        // A token every 100 s.
        let slow = RateLimitConfig {
            per_second: 0.01,
            burst: 2.5,
        };
        assert_eq!(slow.policy_field(), "\"default\";q=2;w=250");
        let limiter = RateLimiter::new(slow);
        let left = limiter.check("a", t).unwrap();
        assert_eq!(
            left,
            Standing {
                remaining: 1,
                reset_secs: 50
            },
            "1.5 tokens left: half a token to go"
        );
    }
}
