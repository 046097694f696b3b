//! The global rate limit: one token bucket per key in Redis, taken from by
//! every replica, so together they admit the configured rate. One round
//! trip, in a script shared with the other requests of the moment
//! ([`super::batches`]); the bucket's clock is Redis's own (`TIME`), so
//! replicas' clocks need not agree.
//!
//! Fails open: when Redis is away the request is admitted (and the failure
//! counted). Refusing every request for a missing counter would turn a
//! Redis outage into a full outage; the local limit it replaces admitted
//! N times the rate across N replicas anyway.

use std::sync::Arc;
use std::time::Duration;

use super::batches;
use super::credits::Refusal;
use super::Shared;
use crate::resilience::rate_limit::{RateLimitConfig, Standing};

/// What every script that takes a token starts with: Redis's clock, in
/// milliseconds, as `now`, and the functions over a bucket. A bucket is one
/// string, `"TOKENS MS"` (what was left, and when), read with `GET` and
/// written with `SET PX`: one write, its expiry included. It expires once
/// it would be full again, so idle keys cost no memory; a value that does
/// not parse counts as a full bucket. The batch script
/// ([`super::batches`]) starts with it, so a request that needs a token
/// and a credit is one round trip.
///
/// - `bucket_read(key, rate, burst)`: the tokens in the bucket now, refilled
///   at `rate` a millisecond for the time since it was written, at most
///   `burst`.
/// - `bucket_take(tokens, rate)`: takes one token if there is one; answers
///   what is left and how many milliseconds until one is there (0: taken).
/// - `bucket_reset(tokens, rate, burst)`: milliseconds until one more whole
///   token (0 when full), for the `RateLimit` field's `t`.
/// - `bucket_write(key, tokens, rate, burst)`: stores what is left.
pub const PRELUDE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function bucket_read(key, rate, burst)
  local was, at = string.match(redis.call('GET', key) or '', '^(%S+) (%d+)$')
  local tokens = tonumber(was) or burst
  return math.min(burst, tokens + math.max(0, now - (tonumber(at) or now)) * rate)
end
local function bucket_take(tokens, rate)
  if tokens >= 1 then return tokens - 1, 0 end
  return tokens, math.ceil((1 - tokens) / rate)
end
local function bucket_reset(tokens, rate, burst)
  if tokens < burst then return math.ceil((math.floor(tokens) + 1 - tokens) / rate) end
  return 0
end
local function bucket_write(key, tokens, rate, burst)
  redis.call('SET', key, tokens .. ' ' .. now, 'PX', math.ceil(burst / rate) + 1000)
end
";

/// Takes a token of `key`'s global bucket and says where it stands, or
/// says how long until one is there. Admits when Redis cannot answer (then
/// no standing is known).
pub async fn take(
    shared: &Arc<Shared>,
    key: &str,
    config: RateLimitConfig,
) -> Result<Option<Standing>, Duration> {
    match batches::ask(shared, key, Some(config), None).await {
        Ok((_, standing)) => Ok(standing),
        Err(Refusal::RateLimited(wait)) => Err(wait),
        Err(_) => Ok(None),
    }
}

/// The Redis key of `key`'s bucket. (Buckets were hashes at `rl:NAME`
/// before they became strings; the new name keeps replicas of both
/// versions from reading each other's bucket as the wrong type during a
/// rolling upgrade. The old hashes expire by themselves.)
pub fn bucket_key(shared: &Shared, key: &str) -> String {
    shared.named("bucket:", key)
}
