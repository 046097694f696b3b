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
//!
//! A batch whose own answer does not come back (Redis paused past
//! [`OP_TIMEOUT`], a connection that broke) may still run: its script was
//! sent, and a paused Redis runs it when it resumes. Its requests were
//! refused (503), so what it held must not stay held until the holder's
//! lease runs out. So each batch is numbered, and the script keeps, in the
//! replica's record (`{prefix}undo:REPLICA`), what the last batch it ran
//! held. The numbers of the batches whose answer was lost go with the
//! next script this task sends (the next batch, or one sent for that
//! alone, at once and then every `RELEASE_RETRY` until one lands), which
//! first releases what the record says, if it is of one of them, and marks
//! them void: one of them that reaches Redis only later holds nothing. So
//! a lost batch is given back exactly once whether it ran before, after or
//! never, and a release never takes what a lost batch did not hold.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::ScriptInvocation;
use tokio::sync::{mpsc, oneshot};

use super::credits::{Credits, Refusal, GIVE_BACK};
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
/// How long the task waits before asking again, alone, for the release of
/// lost batches whose release did not land either (Redis still away): a
/// paused Redis is not sent a script every few milliseconds to run once it
/// resumes, and the release is sent again soon after it answers.
const RELEASE_RETRY: Duration = Duration::from_millis(200);

/// After [`PRELUDE`]: `KEYS[1]` this replica's record ([`undo_key`]),
/// `ARGV[1]` the hold (ms), `ARGV[2]` the sweep period (ms), `ARGV[3]`
/// this batch's number (0: a release alone, no group), `ARGV[4..5]` the
/// first and last number of the batches whose answer was lost (0 0: none),
/// then one group per key: its bucket, account, leases and legacy
/// reservations as `KEYS[4g-2..4g+1]`, and in `ARGV` its rate a second (0:
/// no limit), burst, free credits (-1: tokens only, no account), holder
/// ([`holder`]) and number of requests, then each request's amount.
///
/// The record is one string, `VOID LAST` then `ACCOUNT LEASES HOLDER
/// AMOUNT` for each account batch `LAST` held on (names hold no spaces),
/// kept for a lease ([`HOLD_FOR`]). First, when lost batches are named:
/// if `LAST` is one of them, what it held is released (no more than its
/// holder still holds, as in settling) and the record forgets it; and
/// `VOID` becomes the last of them. A batch numbered `VOID` or less (a lost
/// one reaching Redis after its release) then does nothing and answers
/// nothing: nobody waits for it. Otherwise the batch runs as follows and,
/// when it held credits, the record becomes its own.
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
/// Answers one entry per request, in order (none for a void batch): `{0,
/// balance, tokens, reset}`
/// (admitted, the amount held; `balance` is free + grants - spent - held
/// before this request, so back-to-back requests see each other's charges,
/// 0 for tokens only; `tokens` and `reset` (ms) where the bucket stands,
/// `tokens` -1 without a limit), `{-1, balance, tokens, reset}` (out of
/// credits: nothing held, the token taken all the same) or `{-2, wait}`
/// (rate limited: nothing held).
const BATCH: &str = r"
local hold, sweep_every = tonumber(ARGV[1]), tonumber(ARGV[2])
local seq, lost_from, lost_to = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local undo = KEYS[1]
local void, rest = string.match(redis.call('GET', undo) or '', '^(%d+) (.*)$')
void, rest = tonumber(void) or 0, rest or '0'
local last = tonumber(string.match(rest, '^%d+')) or 0
local changed = false
if lost_to > void then void, changed = lost_to, true end
if last > 0 and last >= lost_from and last <= lost_to then
  local f = {}
  for word in string.gmatch(rest, '%S+') do f[#f + 1] = word end
  for i = 2, #f - 3, 4 do
    give_back(f[i], f[i + 1], f[i + 2], tonumber(f[i + 3]))
  end
  rest, changed = '0', true
end
if seq <= void then
  if changed then redis.call('SET', undo, void .. ' ' .. rest, 'PX', hold) end
  return {}
end
local out, arg, kept = {}, 6, {}
for g = 1, (#KEYS - 1) / 4 do
  local bucket, account, leases, legacy = KEYS[4 * g - 2], KEYS[4 * g - 1], KEYS[4 * g], KEYS[4 * g + 1]
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
    local balance = limit - held
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
    kept[#kept + 1] = account .. ' ' .. leases .. ' ' .. holder .. ' ' .. added
  end
end
if #kept > 0 then
  redis.call('SET', undo, void .. ' ' .. seq .. ' ' .. table.concat(kept, ' '), 'PX', hold)
elseif changed then
  redis.call('SET', undo, void .. ' ' .. rest, 'PX', hold)
end
return out
";

/// The batch script.
static SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(&format!("{PRELUDE}{GIVE_BACK}{BATCH}")));

/// This replica's record of what its last batch held, and which of its
/// batches are void ([`BATCH`]).
fn undo_key(shared: &Shared) -> String {
    shared.named("undo:", shared.replica())
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
/// no credits were asked; below 0 when more is spent and held than the key
/// has, a lowered `free_credits` say: [`Credits`] settles what it has not
/// written before it clamps), and where its bucket stands when a token was
/// taken.
pub type Granted = (i64, Option<Standing>);

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
///
/// While the release of lost batches is owed (`Numbers`), the next batch
/// carries it; when no ask is waiting it goes alone, at once, then every
/// `RELEASE_RETRY` until it lands. Sent at once, it follows the lost
/// batch on the connection (a timeout does not replace the connection), so
/// a paused Redis runs the release right after the batch when it resumes.
pub async fn send_batches(shared: Weak<Shared>, mut asked: mpsc::UnboundedReceiver<Asked>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut numbers = Numbers::default();
    // How long to wait for asks, while a release is owed, before sending it
    // alone.
    let mut patience = Duration::ZERO;
    loop {
        let received = if numbers.owes_release() {
            let more = asked.recv_many(&mut batch, MAX_BATCH);
            match tokio::time::timeout(patience, more).await {
                Ok(received) => received,
                Err(_) => {
                    let Some(shared) = shared.upgrade() else {
                        return;
                    };
                    let release = invocation(&shared, 0, numbers.lost());
                    let landed = run(&shared, "release", &release).await.is_ok();
                    numbers.after(&shared, 0, false, landed);
                    patience = RELEASE_RETRY;
                    continue;
                }
            }
        } else {
            asked.recv_many(&mut batch, MAX_BATCH).await
        };
        if received == 0 {
            return;
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let seq = numbers.next();
        let (answers, landed) = send(&shared, &batch, seq, numbers.lost()).await;
        let reserved = batch.iter().any(|asked| asked.credits.is_some());
        numbers.after(&shared, seq, reserved, landed);
        if !landed {
            patience = Duration::ZERO;
        }
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

/// The numbers of this task's batches, and which of them were lost: sent
/// (or perhaps sent) without their answer coming back, so Redis may have
/// run them, or may yet. I/O-free: the task asks it what to send and tells
/// it how each script went.
#[derive(Debug, Default, PartialEq)]
struct Numbers {
    /// The last batch's number (the first is 1; 0 names a release alone).
    last: u64,
    /// The lost batches not known to be released, `first..=last` of them:
    /// every script names them all, and one that lands has released them
    /// all, so they are always one run.
    lost: Option<(u64, u64)>,
}

impl Numbers {
    /// The next batch's number.
    fn next(&mut self) -> u64 {
        self.last += 1;
        self.last
    }

    /// The first and last lost batch, for the script: (0, 0) when none.
    fn lost(&self) -> (u64, u64) {
        self.lost.unwrap_or((0, 0))
    }

    fn owes_release(&self) -> bool {
        self.lost.is_some()
    }

    /// How the script numbered `seq` (0: a release alone), which asked for
    /// credits or not (`reserved`), went: a script that `landed` released
    /// every lost batch it named; a batch of credits that did not is lost
    /// itself.
    fn went(&mut self, seq: u64, reserved: bool, landed: bool) {
        if landed {
            self.lost = None;
        } else if reserved && seq > 0 {
            self.lost = Some((self.lost.map_or(seq, |(first, _)| first), seq));
        }
    }

    /// [`Numbers::went`], and a release owed counted as work under way
    /// while it is ([`Shared::asks_answered`] waits for it at shutdown).
    fn after(&mut self, shared: &Shared, seq: u64, reserved: bool, landed: bool) {
        let owed = self.owes_release();
        self.went(seq, reserved, landed);
        match (owed, self.owes_release()) {
            (false, true) => shared.unanswered.add(1),
            (true, false) => {
                shared.answered(1);
                tracing::debug!("reservations whose answer was lost released");
            }
            _ => {}
        }
    }
}

/// The batch script for the batch numbered `seq` (0: none), naming the
/// lost batches `lost` (first and last; (0, 0): none), before its groups.
fn invocation(shared: &Shared, seq: u64, (first, last): (u64, u64)) -> ScriptInvocation<'_> {
    let mut invocation = SCRIPT.prepare_invoke();
    invocation
        .key(undo_key(shared))
        .arg(HOLD_FOR.as_millis() as u64)
        .arg(SWEEP_EVERY.as_millis() as u64)
        .arg(seq)
        .arg(first)
        .arg(last);
    invocation
}

/// Runs `invocation` as operation `name` ([`Shared::run`]); its answers.
async fn run(
    shared: &Shared,
    name: &'static str,
    invocation: &ScriptInvocation<'_>,
) -> Result<Vec<Vec<i64>>, StateError> {
    shared
        .run(name, |mut conn| async move {
            invocation.invoke_async(&mut conn).await
        })
        .await
}

/// One script for `batch`, numbered `seq`, naming the `lost` batches; its
/// answers in the batch's order, and whether it landed (when not, Redis
/// may have run it or may yet).
async fn send(
    shared: &Shared,
    batch: &[Asked],
    seq: u64,
    lost: (u64, u64),
) -> (Vec<Result<Granted, Refusal>>, bool) {
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
    let mut invocation = invocation(shared, seq, lost);
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
    let answers = run(shared, name, &invocation).await;
    let mut outcomes: Vec<Result<Granted, Refusal>> =
        batch.iter().map(|_| Err(Refusal::Unavailable)).collect();
    let landed = answers.is_ok();
    if let Ok(answers) = answers {
        let order = groups.iter().flatten();
        for (&i, answer) in order.zip(answers) {
            outcomes[i] = outcome(&answer, batch[i].rate_limit.is_some());
        }
    }
    (outcomes, landed)
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
            balance: at(1),
            standing,
        }),
        _ => Ok((at(1), standing)),
    }
}
