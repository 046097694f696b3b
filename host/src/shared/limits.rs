//! The global rate limit: one token bucket per key in Redis, taken from by
//! every replica, so together they admit the configured rate. One script,
//! one round trip; the bucket's clock is Redis's own (`TIME`), so replicas'
//! clocks need not agree.
//!
//! Fails open: when Redis is away the request is admitted (and the failure
//! counted). Refusing every request for a missing counter would turn a
//! Redis outage into a full outage; the local limit it replaces admitted
//! N times the rate across N replicas anyway.

use std::time::Duration;

use redis::Script;

use super::Shared;
use crate::resilience::rate_limit::{retry_after_secs, RateLimitConfig, Standing};

/// What every script that takes a token starts with: Redis's clock, in
/// milliseconds, as `now`, and the bucket's verdict, `wait` and `tokens`.
pub const PRELUDE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wait, tokens = 0, 0
";

/// Refills the bucket `KEYS[1]` (rate `ARGV[1]` a second, at most
/// `ARGV[2]`) for the time since it was last touched and takes a token if
/// there is one; sets `wait`, how many milliseconds until one is there (0:
/// admitted), and `tokens`, what is left. The bucket expires once it would
/// be full again, so idle keys cost no memory. A fragment after
/// [`PRELUDE`]: the reservation script ([`super::credits`]) runs it too, so
/// a request that needs both is one round trip.
pub const BUCKET: &str = r"
local rate = tonumber(ARGV[1]) / 1000
local burst = tonumber(ARGV[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
tokens = tonumber(b[1]) or burst
local at = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = math.ceil((1 - tokens) / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate) + 1000)
";

/// After [`BUCKET`]: `reset`, the milliseconds until one more whole token
/// (0 when the bucket is full), for the `RateLimit` field's `t`.
pub const STANDING: &str = r"
local reset = 0
if tokens < burst then reset = math.ceil((math.floor(tokens) + 1 - tokens) / rate) end
";

/// The bucket script, hashed once.
pub struct Limits {
    take: Script,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            take: Script::new(&format!(
                "{PRELUDE}{BUCKET}\n{STANDING}\nreturn {{wait, math.floor(tokens), reset}}"
            )),
        }
    }
}

impl Limits {
    /// Takes a token of `key`'s global bucket and says where it stands, or
    /// says how long until one is there. Admits when Redis cannot answer
    /// (then no standing is known).
    pub async fn check(
        &self,
        shared: &Shared,
        key: &str,
        config: RateLimitConfig,
    ) -> Result<Option<Standing>, Duration> {
        let bucket = shared.key(&format!("rl:{key}"));
        let outcome = shared
            .run("rate_limit", |mut conn| async move {
                self.take
                    .key(bucket)
                    .arg(config.per_second)
                    .arg(config.burst)
                    .invoke_async::<(u64, u64, u64)>(&mut conn)
                    .await
            })
            .await;
        match outcome {
            Ok((0, tokens, reset_ms)) => Ok(Some(Standing {
                remaining: tokens,
                reset_secs: match reset_ms {
                    0 => 0,
                    ms => retry_after_secs(Duration::from_millis(ms)),
                },
            })),
            Err(_) => Ok(None),
            Ok((wait_ms, _, _)) => Err(Duration::from_millis(wait_ms)),
        }
    }
}
