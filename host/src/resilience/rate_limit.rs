//! A token bucket per API key: `per_second` tokens a second, up to `burst`
//! saved. Checked right after the key, before any upstream call.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use serde::Deserialize;

use crate::config::{ConfigError, Context};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimitConfig {
    pub per_second: f64,
    pub burst: f64,
}

/// `[rate_limit]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimit {
    per_second: f64,
    burst: Option<f64>,
}

impl RateLimitConfig {
    /// `[rate_limit]`; absent means no limit. `burst` defaults to one
    /// second's worth, and at least 1.
    pub fn from_raw(
        raw: Option<RawRateLimit>,
        cx: &Context,
    ) -> Result<Option<RateLimitConfig>, ConfigError> {
        let Some(raw) = raw else { return Ok(None) };
        let burst = raw.burst.unwrap_or(raw.per_second.max(1.0));
        if !(raw.per_second.is_finite() && raw.per_second > 0.0) {
            return Err(cx.invalid("[rate_limit] per_second", "must be above 0"));
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

impl RateLimiter {
    pub fn new(config: RateLimitConfig) -> RateLimiter {
        RateLimiter {
            config,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn config(&self) -> RateLimitConfig {
        self.config
    }

    /// Takes a token for `key`, or says how long until one is there.
    pub fn check(&self, key: &str, now: Instant) -> Result<(), Duration> {
        let RateLimitConfig { per_second, burst } = self.config;
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let refill = now.saturating_duration_since(bucket.at).as_secs_f64() * per_second;
        bucket.tokens = (bucket.tokens + refill).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
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
    fn burst_then_steady_rate_per_key() {
        let limiter = RateLimiter::new(RateLimitConfig {
            per_second: 2.0,
            burst: 3.0,
        });
        let t = Instant::now();
        for _ in 0..3 {
            assert!(limiter.check("a", t).is_ok());
        }
        let wait = limiter.check("a", t).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert!(limiter.check("b", t).is_ok(), "keys have their own buckets");
        assert!(limiter.check("a", t + Duration::from_millis(500)).is_ok());
        assert!(limiter.check("a", t + Duration::from_millis(500)).is_err());
        assert!(
            limiter.check("a", t + Duration::from_secs(60)).is_ok(),
            "refills"
        );
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(3)), 3);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
