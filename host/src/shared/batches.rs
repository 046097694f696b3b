//! The per-request work on Redis, in batches: a token of a key's global
//! bucket ([`super::limits`]), or a reservation of its credits
//! ([`super::credits`]) with a token taken in the same go when the key is
//! limited. What is asked while a batch is at Redis goes together in the
//! next one, as one script that reads and writes each key's bucket and
//! account once for all of its requests.
//!
//! Why: under load many requests of a key arrive together, and a script
//! per request costs Redis a script call, a clock read, a bucket (and
//! account) read and the writes each time. A batch costs that once per key.
//! Nothing waits to fill a batch: what is asked while none is at Redis goes
//! at once, alone, so a quiet server's latency is one round trip as before;
//! under load the batches grow by themselves. The script takes the tokens
//! and checks the reservations of a batch one after the other, exactly as
//! it would have one script each: the limit admits what it would have, and
//! a key never spends more than its balance.
//!
//! The batches belong to one task, not to a request: a request that stops
//! waiting (its client hung up, or [`OP_TIMEOUT`] passed) leaves what it
//! asked to the task, which gives a held reservation back.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};

use super::credits::{Credits, Refusal};
use super::limits::PRELUDE;
use super::{Shared, StateError, OP_TIMEOUT};
use crate::resilience::rate_limit::{retry_after_secs, RateLimitConfig, Standing};

/// The most requests in one batch.
pub const MAX_BATCH: usize = 64;

/// A holder's lease: how long after its last reservation on an account
/// what it holds there may be freed by any replica. Far longer than a
/// request may run, so only a holder no longer used (its replica died, or
/// renamed its holds) loses what it holds.
const HOLD_FOR: Duration = Duration::from_secs(10 * 60);
/// How long one name of this replica's holds is used for new reservations.
/// A name no longer used is no longer renewed, so its lease runs out
/// [`HOLD_FOR`] after its last reservation and what it still holds comes
/// back: that is how a hold the replica itself lost track of (a
/// reservation made as its answer was lost, which nothing will release) is
/// freed while the replica lives on, within `HOLD_FOR + RENAME_EVERY`.
const RENAME_EVERY: Duration = Duration::from_secs(5 * 60);
// A name is never used again once its lease could have run out, so a late
// release never takes from a newer hold under the same name (as long as
// Redis's clock does not jump ahead by a lease).
const _: () = assert!(RENAME_EVERY.as_secs() < HOLD_FOR.as_secs());
/// How often a reservation looks for expired leases on its account: a
/// dead holder's credits come back a moment later, and the request path
/// is spared a sorted-set scan each time.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// After [`PRELUDE`]: `ARGV[1]` the hold (ms), `ARGV[2]` the sweep period
/// (ms), then one group per key: its bucket, account, leases and legacy
/// reservations as `KEYS[4g-3..4g]`, and in `ARGV` its rate a second (0: no
/// limit), burst, free credits (-1: tokens only, no account), holder
/// ([`holder`]) and number of requests, then each request's amount.
///
/// What a holder holds on an account is one sum, the account's field
/// `h:HOLDER`, under a lease (the holder's score in the sorted set of
/// leases) renewed by each of its reservations: so a batch costs Redis the
/// same whatever its size, and a release is one sum per key. For each group
/// with an account: frees what holders hold whose lease ran out (a replica
/// that died, or a name it no longer uses), and the expired reservations
/// of the sorted set `held:NAME` earlier versions kept one per request (so
/// none is stranded by a rolling upgrade), at most every sweep period
/// (`sweep_at`). Then for each request in turn: takes a token when there is
/// a limit and, unless the group is tokens only, holds the amount, unless
/// `spent + reserved + amount` would pass the free credits plus the
/// account's grants.
///
/// Answers one entry per request, in order: `{0, balance, tokens, reset}`
/// (admitted, the amount held; `balance` is free + grants - spent - held
/// before this request, so back-to-back requests see each other's charges,
/// 0 for tokens only; `tokens` and `reset` (ms) where the bucket stands,
/// `tokens` -1 without a limit), `{-1, balance, tokens, reset}` (out of
/// credits: nothing held, the token taken all the same) or `{-2, wait}`
/// (rate limited: nothing held).
const BATCH: &str = r"
local hold, sweep_every = tonumber(ARGV[1]), tonumber(ARGV[2])
local out, arg = {}, 3
for g = 1, #KEYS / 4 do
  local bucket, account, leases, legacy = KEYS[4 * g - 3], KEYS[4 * g - 2], KEYS[4 * g - 1], KEYS[4 * g]
  local rate, burst = tonumber(ARGV[arg]) / 1000, tonumber(ARGV[arg + 1])
  local free, holder, n = tonumber(ARGV[arg + 2]), ARGV[arg + 3], tonumber(ARGV[arg + 4])
  arg = arg + 5
  local tokens
  if rate > 0 then tokens = bucket_read(bucket, rate, burst) end
  local held, limit, added = 0, 0, 0
  if free >= 0 then
    local a = redis.call('HMGET', account, 'spent', 'reserved', 'granted', 'sweep_at')
    local reserved = tonumber(a[2]) or 0
    if now >= (tonumber(a[4]) or 0) then
      local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
      if #expired > 0 then
        for _, dead in ipairs(expired) do
          local field = 'h:' .. dead
          reserved = reserved - (tonumber(redis.call('HGET', account, field)) or 0)
          redis.call('HDEL', account, field)
        end
        redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
      end
      local stranded = redis.call('ZRANGEBYSCORE', legacy, '-inf', now)
      if #stranded > 0 then
        for _, m in ipairs(stranded) do reserved = reserved - (tonumber(string.match(m, '^(%d+):')) or 0) end
        redis.call('ZREMRANGEBYSCORE', legacy, '-inf', now)
      end
      redis.call('HSET', account, 'reserved', reserved, 'sweep_at', now + sweep_every)
    end
    held = (tonumber(a[1]) or 0) + reserved
    limit = free + (tonumber(a[3]) or 0)
  end
  for _ = 1, n do
    local amount = tonumber(ARGV[arg])
    arg = arg + 1
    local wait, left, reset = 0, -1, 0
    if tokens then
      tokens, wait = bucket_take(tokens, rate)
      left, reset = math.floor(tokens), bucket_reset(tokens, rate, burst)
    end
    local balance = math.max(0, limit - held)
    if wait > 0 then
      out[#out + 1] = {-2, wait}
    elseif free < 0 then
      out[#out + 1] = {0, 0, left, reset}
    elseif amount > 0 and held + amount > limit then
      out[#out + 1] = {-1, balance, left, reset}
    else
      held, added = held + amount, added + amount
      out[#out + 1] = {0, balance, left, reset}
    end
  end
  if tokens then bucket_write(bucket, tokens, rate, burst) end
  if added > 0 then
    redis.call('HINCRBY', account, 'reserved', added)
    redis.call('HINCRBY', account, 'h:' .. holder, added)
    redis.call('ZADD', leases, now + hold, holder)
  end
end
return out
";

/// The batch script, hashed once.
pub fn script() -> redis::Script {
    redis::Script::new(&format!("{PRELUDE}{BATCH}"))
}

/// The name this replica's reservations of `generation` are held under:
/// `REPLICA.GENERATION`.
pub fn holder(shared: &Shared, generation: u64) -> String {
    format!("{}.{generation:x}", shared.replica())
}

/// The generation of holder names new reservations use now.
pub fn generation() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / RENAME_EVERY.as_secs())
}

/// What an admitted request learned: its key's balance before it (0 when
/// no credits were asked), and where its bucket stands when a token was
/// taken.
pub type Granted = (u64, Option<Standing>);

/// One request's ask, waiting for its batch.
pub struct Asked {
    pub name: String,
    pub rate_limit: Option<RateLimitConfig>,
    /// The credits to hold; `None`: a token only.
    pub credits: Option<CreditAsk>,
    pub answer: oneshot::Sender<Result<Granted, Refusal>>,
}

/// The credits part of an ask.
pub struct CreditAsk {
    pub amount: u32,
    pub free_credits: u64,
    /// Which of this replica's holder names holds it ([`generation`]).
    pub generation: u64,
    /// Where a reservation nobody waits for any more is given back.
    pub owner: Weak<Credits>,
}

/// Sends what is asked through `asked` to Redis, a batch at a time, until
/// every sender is gone (its [`Shared`] dropped).
pub async fn send_batches(shared: Weak<Shared>, mut asked: mpsc::UnboundedReceiver<Asked>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while asked.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let answers = send(&shared, &batch).await;
        let n = batch.len();
        for (asked, answer) in batch.drain(..).zip(answers) {
            let held = answer.is_ok();
            if asked.answer.send(answer).is_err() && held {
                // Nobody waits for it any more: nothing will be delivered.
                if let Some(credits) = asked.credits {
                    if let Some(owner) = credits.owner.upgrade() {
                        owner.refund(&asked.name, credits.generation, credits.amount);
                    }
                }
            }
        }
        shared.answered(n);
    }
}

/// Asks the next batch for a token of `name`'s bucket (when `rate_limit`
/// says so) and for `credits`, and waits for the answer at most
/// [`OP_TIMEOUT`]: a request waits no longer for shared state, whatever the
/// queue.
pub async fn ask(
    shared: &Arc<Shared>,
    name: &str,
    rate_limit: Option<RateLimitConfig>,
    credits: Option<CreditAsk>,
) -> Result<Granted, Refusal> {
    let op = if credits.is_some() {
        "reserve"
    } else {
        "rate_limit"
    };
    let (answer, answered) = oneshot::channel();
    let asked = Asked {
        name: name.to_owned(),
        rate_limit,
        credits,
        answer,
    };
    if !shared.queue(asked) {
        return Err(Refusal::Unavailable);
    }
    match tokio::time::timeout(OP_TIMEOUT, answered).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => Err(Refusal::Unavailable),
        Err(_) => {
            shared.note(op, Some(&StateError::Timeout));
            Err(Refusal::Unavailable)
        }
    }
}

/// One script for `batch`; its answers in the batch's order.
async fn send(shared: &Shared, batch: &[Asked]) -> Vec<Result<Granted, Refusal>> {
    // The asks of one key (with the same settings, and all for credits or
    // all for tokens only) form one group, in the order they were asked.
    // What a group's asks for credits share: the free credits, and the
    // generation of the holder they are held under.
    let credit_terms = |asked: &Asked| {
        asked
            .credits
            .as_ref()
            .map(|c| (c.free_credits, c.generation))
    };
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, asked) in batch.iter().enumerate() {
        let same = |g: &Vec<usize>| {
            let first = &batch[g[0]];
            first.name == asked.name
                && credit_terms(first) == credit_terms(asked)
                && first.rate_limit == asked.rate_limit
        };
        match groups.iter_mut().find(|g| same(g)) {
            Some(group) => group.push(i),
            None => groups.push(vec![i]),
        }
    }
    let mut invocation = shared.batch_script().prepare_invoke();
    invocation
        .arg(HOLD_FOR.as_millis() as u64)
        .arg(SWEEP_EVERY.as_millis() as u64);
    for group in &groups {
        let first = &batch[group[0]];
        let (rate, burst) = first
            .rate_limit
            .map_or((0.0, 0.0), |r| (r.per_second, r.burst));
        let (free, holder_name) = match credit_terms(first) {
            Some((free, generation)) => (free.to_string(), holder(shared, generation)),
            None => ("-1".to_owned(), "-".to_owned()),
        };
        invocation
            .key(super::limits::bucket_key(shared, &first.name))
            .key(shared.named("acct:", &first.name))
            .key(shared.named("leases:", &first.name))
            .key(shared.named("held:", &first.name))
            .arg(rate)
            .arg(burst)
            .arg(free)
            .arg(holder_name)
            .arg(group.len());
        for &i in group {
            invocation.arg(batch[i].credits.as_ref().map_or(0, |c| c.amount));
        }
    }
    let name = if groups.iter().all(|g| batch[g[0]].credits.is_none()) {
        "rate_limit"
    } else {
        "reserve"
    };
    let answers: Result<Vec<Vec<i64>>, StateError> = shared
        .run(name, |mut conn| async move {
            invocation.invoke_async(&mut conn).await
        })
        .await;
    let mut outcomes: Vec<Result<Granted, Refusal>> =
        batch.iter().map(|_| Err(Refusal::Unavailable)).collect();
    if let Ok(answers) = answers {
        let order = groups.iter().flatten();
        for (&i, answer) in order.zip(answers) {
            outcomes[i] = outcome(&answer, batch[i].rate_limit.is_some());
        }
    }
    outcomes
}

/// One request's answer from the script.
fn outcome(answer: &[i64], limited: bool) -> Result<Granted, Refusal> {
    let at = |i: usize| answer.get(i).copied().unwrap_or(0);
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let standing = (limited && at(2) >= 0).then(|| Standing {
        remaining: count(at(2)),
        reset_secs: match count(at(3)) {
            0 => 0,
            ms => retry_after_secs(Duration::from_millis(ms)),
        },
    });
    match at(0) {
        -2 => Err(Refusal::RateLimited(Duration::from_millis(count(at(1))))),
        -1 => Err(Refusal::Exhausted {
            balance: count(at(1)),
            standing,
        }),
        _ => Ok((count(at(1)), standing)),
    }
}
