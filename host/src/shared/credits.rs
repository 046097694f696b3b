//! Credits and usage in the shared store: what [`crate::billing`] books
//! when `[state] backend = "redis"`.
//!
//! - **Accounts** (`{prefix}acct:NAME`: `spent`, `reserved`, `granted`,
//!   `sweep_at`, and `h:HOLDER`, what each holder holds of `reserved`, a
//!   holder being one replica's name for its reservations of a few
//!   minutes, [`batches::holder`]) and the holders' leases on them
//!   (`{prefix}leases:NAME`, a sorted set of holders by expiry). A
//!   reservation is made by a script that frees what holders no longer in
//!   use held (a replica killed mid-request, or a name its replica retired
//!   with a hold it lost track of), checks `spent + reserved + amount`
//!   against `free_credits + granted`, and holds the amount; the
//!   reservations asked at the same time share one script
//!   ([`super::batches`]). So a key never spends more than its balance,
//!   whatever the replicas and the concurrency, as long as Redis keeps
//!   what it acknowledged (with `appendfsync everysec`, a crash can lose a
//!   second of writes: holds lost that way are released from the holds
//!   that remain, so up to a second's reservations may be spent twice).
//!   When Redis cannot answer, no credit can be reserved: billing fails
//!   closed, and a reservation Redis made whose answer came too late is
//!   given back by the replica's next script ([`super::batches`]).
//! - **Settling** (a delivered answer's credits spent and its usage
//!   counted, or a failed request's reservation released) is not on the
//!   request path: it is queued here and written by one task every
//!   [`FLUSH_EVERY`], in one script per batch. A held reservation counts
//!   until it is released, so the delay never lets a key overspend.
//! - **Usage** (`{prefix}usage:DAY:NAME`: `requests`, `credits`, and the
//!   same per endpoint as `requests:ENDPOINT`, `credits:ENDPOINT`; indexed
//!   in `{prefix}usage:index`) is counted in the same script.
//! - **Grants** (`socialgate credits grant` with a redis config) add to the
//!   account's `granted` and are listed in `{prefix}grants:NAME`, in one
//!   transaction: the next reservation on any replica counts them.
//!
//! What a reservation holds is what the answer may cost
//! ([`crate::billing::Source`]: the larger of the endpoint's fresh and
//! cached costs when it may come from either); what is
//! settled is what the delivered answer cost. The script answers the key's
//! balance (`free_credits` + grants - spent) and, when it took a token,
//! where the bucket stands, for the answer's `X-Credits-Remaining` and
//! `RateLimit` fields: no extra round trip.
//!
//! While Redis is away, settled credits wait in memory (bounded by
//! [`MAX_PENDING`] entries; past it new ones are dropped, logged and
//! counted) and are written when it returns. Never twice: each batch
//! carries this process's sequence number, and the script skips a batch
//! whose number it has already applied (a batch whose answer was lost is
//! retried as it was).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{AsyncCommands, Script};
use tokio_util::sync::CancellationToken;

use plugin_api::Endpoint;

use super::batches::{self, CreditAsk};
use super::{Shared, StateError};
use crate::ledger::{Book, EndpointUsageRow, Grant, Statement, UsageRow};
use crate::resilience::rate_limit::{RateLimitConfig, Standing};

/// How often settled credits are written.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Settled entries kept while Redis is away, at most (an entry is a key's
/// usage of one day, or what to release of its hold under one holder;
/// adding to an entry is never refused).
pub const MAX_PENDING: usize = 100_000;
/// An account's statement, read only. KEYS: the account, its leases, its
/// usage today, the reservations earlier versions kept one by one
/// (`held:NAME`). Answers `{spent, granted, reserved, credits today}`,
/// leaving out of `reserved` what the next reservation's sweep will free:
/// the holds of leases run out (a replica gone), expired old reservations.
const STATEMENT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local a = redis.call('HMGET', KEYS[1], 'spent', 'granted', 'reserved')
local reserved = tonumber(a[3]) or 0
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  reserved = reserved - (tonumber(redis.call('HGET', KEYS[1], 'h:' .. gone)) or 0)
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do
  reserved = reserved - (tonumber(string.match(m, '^(%d+):')) or 0)
end
return {tonumber(a[1]) or 0, tonumber(a[2]) or 0, reserved,
  tonumber(redis.call('HGET', KEYS[3], 'credits')) or 0}
";

/// [`STATEMENT`], its digest worked out once.
static STATEMENT_SCRIPT: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(STATEMENT));

/// `KEYS[1]`: this process's last applied batch number. `ARGV[1]`: the
/// prefix, `ARGV[2]`: this batch's number, then groups of six: `u NAME DAY
/// ENDPOINT REQUESTS CREDITS` (usage) or `r NAME HOLDER AMOUNT - -` (what
/// to release of the holder's hold on the account). A release takes no
/// more than the holder holds: once a sweep freed an expired hold there is
/// nothing left to release, and a holder name is not used again by then.
const SETTLE: &str = r"
local seq = tonumber(ARGV[2])
if seq <= tonumber(redis.call('GET', KEYS[1]) or '0') then return 0 end
redis.call('SET', KEYS[1], seq, 'EX', 604800)
local p = ARGV[1]
for i = 3, #ARGV, 6 do
  local name = ARGV[i + 1]
  if ARGV[i] == 'u' then
    local day, ep = ARGV[i + 2], ARGV[i + 3]
    local requests, credits = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])
    local u = p .. 'usage:' .. day .. ':' .. name
    redis.call('HINCRBY', u, 'requests', requests)
    redis.call('HINCRBY', u, 'credits', credits)
    redis.call('HINCRBY', u, 'requests:' .. ep, requests)
    redis.call('HINCRBY', u, 'credits:' .. ep, credits)
    redis.call('SADD', p .. 'usage:index', day .. ' ' .. name)
    redis.call('HINCRBY', p .. 'acct:' .. name, 'spent', credits)
  else
    give_back(p .. 'acct:' .. name, p .. 'leases:' .. name, ARGV[i + 2], tonumber(ARGV[i + 3]))
  end
end
return 1
";

/// Lua: gives back up to `amount` of what `holder` holds on `account`,
/// never more than it holds (a sweep may have freed an expired hold
/// already), dropping its lease in `leases` once it holds nothing. Shared
/// by the settling script and the reservation batch's release of lost
/// batches.
pub const GIVE_BACK: &str = r"
local function give_back(account, leases, holder, amount)
  local mine = 'h:' .. holder
  local held = tonumber(redis.call('HGET', account, mine)) or 0
  amount = math.min(held, amount or 0)
  if amount <= 0 then return end
  if amount == held then
    redis.call('HDEL', account, mine)
    redis.call('ZREM', leases, holder)
  else
    redis.call('HINCRBY', account, mine, -amount)
  end
  redis.call('HINCRBY', account, 'reserved', -amount)
end
";

/// Credits held in the store.
#[derive(Debug)]
pub struct Held {
    /// The generation of the holder name it is held under, to release it.
    pub generation: u64,
    /// The key's balance (free + grants - spent) before this request.
    pub balance: u64,
    /// Where the key's global bucket stands, when a token was taken.
    pub standing: Option<Standing>,
}

/// Why a credit could not be reserved.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The key's balance (`balance` left, below 0 when more is spent
    /// and held than it has) is less than the cost; the bucket's token
    /// was taken all the same (`standing`).
    Exhausted {
        balance: i64,
        standing: Option<Standing>,
    },
    /// Redis did not answer: no credit can be checked.
    Unavailable,
    /// The key's global rate limit refused it first (checked in the same
    /// round trip): wait this long.
    RateLimited(Duration),
}

/// Settled but not yet written.
#[derive(Default)]
struct Pending {
    /// (day, name, endpoint) -> (requests, credits).
    usage: HashMap<(String, String, Endpoint), (u64, u64)>,
    /// (name, holder generation) -> what to release of that hold.
    releases: HashMap<(String, u64), u64>,
    /// name -> what all its entries above will release and spend: what
    /// the store does not know yet of its balance ([`Credits::reserve`]).
    by_name: HashMap<String, Unsettled>,
    /// Whether the drop past [`MAX_PENDING`] was logged, for this outage.
    overflow_logged: bool,
    /// How many times the entries above were taken to be written (kept
    /// across takes): a key's entries seen twice with the same number were
    /// not taken in between.
    taken: u64,
}

/// One key's settled entries not yet written.
#[derive(Default, Clone, Copy)]
struct Unsettled {
    /// Held in the store, to be released.
    released: u64,
    /// To be spent.
    spent: u64,
}

impl Unsettled {
    /// `balance`, as the store counts it, once these entries are written.
    fn settled(self, balance: i64) -> i64 {
        balance
            .saturating_add(signed(self.released))
            .saturating_sub(signed(self.spent))
    }
}

/// A count as a balance's term (the store's balances are signed).
fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Pending {
    fn len(&self) -> usize {
        self.usage.len() + self.releases.len()
    }
}

/// Shared credit accounts and the queue of what was settled.
pub struct Credits {
    shared: Arc<Shared>,
    settle: Script,
    pending: Mutex<Pending>,
    /// Wakes the writer before its time ([`Credits::settle_now`]).
    wake: tokio::sync::Notify,
    /// The number of the last take ([`Pending::taken`]) whose entries
    /// landed, with all before it: batches land in order.
    written: tokio::sync::watch::Sender<u64>,
}

impl Credits {
    pub fn new(shared: Arc<Shared>) -> Credits {
        Credits {
            shared,
            settle: Script::new(&format!("{GIVE_BACK}{SETTLE}")),
            pending: Mutex::new(Pending::default()),
            wake: tokio::sync::Notify::new(),
            written: tokio::sync::watch::Sender::new(0),
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        // A plain map: a panic cannot tear it.
        crate::sync::lock(&self.pending)
    }

    /// Holds `amount` of `name`'s credits (at most `free_credits` plus its
    /// grants, ever), after taking a token of its global bucket when
    /// `rate_limit` says so: one round trip for both, shared with the
    /// requests of the moment ([`batches`]).
    pub async fn reserve(
        self: &Arc<Self>,
        name: &str,
        amount: u32,
        free_credits: u64,
        rate_limit: Option<RateLimitConfig>,
    ) -> Result<Held, Refusal> {
        let generation = batches::generation();
        let credits = || CreditAsk {
            amount,
            free_credits,
            generation,
            owner: Arc::downgrade(self),
        };
        let first = self.unsettled(name);
        let asked = batches::ask(&self.shared, name, rate_limit, Some(credits())).await;
        // Refused for credits where what this replica settled but has not
        // written may be why (a request before, refunded or charged less
        // than it held): written now, and asked again once, so one request
        // at a time is never refused for the one before. (The first ask
        // took the bucket's token: this one takes none.)
        let (asked, before) = match asked {
            Err(Refusal::Exhausted { balance, standing })
                if self.unwritten_may_cover(balance, amount, first) =>
            {
                self.settle_now().await;
                let before = self.unsettled(name);
                let mut again = batches::ask(&self.shared, name, None, Some(credits())).await;
                // Where the bucket stands is the first ask's to say.
                if let Ok((_, at)) | Err(Refusal::Exhausted { standing: at, .. }) = &mut again {
                    *at = standing;
                }
                (again, before)
            }
            asked => (asked, first),
        };
        let known = |balance: i64| self.known_balance(balance, before);
        match asked {
            Ok((balance, standing)) => Ok(Held {
                generation,
                balance: u64::try_from(known(balance)).unwrap_or(0),
                standing,
            }),
            Err(Refusal::Exhausted { balance, standing }) => Err(Refusal::Exhausted {
                balance: known(balance),
                standing,
            }),
            Err(refusal) => Err(refusal),
        }
    }

    /// `name`'s settled entries not yet written, and how many times the
    /// queue had been taken then.
    fn unsettled(&self, name: &str) -> (u64, Unsettled) {
        let pending = self.pending();
        (
            pending.taken,
            pending.by_name.get(name).copied().unwrap_or_default(),
        )
    }

    /// How many times the queue has been taken.
    fn taken(&self) -> u64 {
        self.pending().taken
    }

    /// `balance`, as the store said it (what this replica settled but has
    /// not written yet still held there), with those entries settled: a
    /// client asking one request at a time sees each answer's own charge,
    /// not the holds of the answers before it. Only when nothing was
    /// written in between (`before` is still all that is unsettled of
    /// them): then the store had their holds and not their release, and
    /// the balance is never overstated. Signed, as the store counts it
    /// (below 0 when more is spent and held than the key has).
    fn known_balance(&self, balance: i64, before: (u64, Unsettled)) -> i64 {
        let (taken, unsettled) = before;
        if self.taken() == taken {
            unsettled.settled(balance)
        } else {
            balance
        }
    }

    /// Whether writing what this replica settled may let a refused ask of
    /// `amount` through: the balance with those entries covers it, or they
    /// were being written meanwhile (`before` no longer all there is) and
    /// free more than they spend.
    fn unwritten_may_cover(&self, balance: i64, amount: u32, before: (u64, Unsettled)) -> bool {
        let (taken, unsettled) = before;
        if self.taken() == taken {
            unsettled.settled(balance) >= i64::from(amount)
        } else {
            unsettled.released > unsettled.spent
        }
    }

    /// Writes what is settled now, rather than at the writer's next turn,
    /// and waits (at most a second) until everything settled before this
    /// call is written.
    pub async fn settle_now(&self) {
        // Entries settled before now were taken already (a take numbered
        // up to `taken`), or will be by the next take: once the writes of
        // the takes up to the next one have landed, they are written.
        let taken = self.taken();
        let mut written = self.written.subscribe();
        self.wake.notify_one();
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            written.wait_for(|landed| *landed > taken),
        )
        .await;
    }

    /// A delivered answer of `endpoint` costing `amount` credits: counted
    /// in `name`'s usage of today and spent; its reservation (`held`: its
    /// holder's generation and what it held) released.
    pub fn commit(&self, name: &str, endpoint: Endpoint, held: Option<(u64, u32)>, amount: u32) {
        let usage = (super::utc_day(), name.to_owned(), endpoint);
        let mut pending = self.pending();
        if pending.usage.contains_key(&usage) || !self.full(&mut pending) {
            let counts = pending.usage.entry(usage).or_default();
            counts.0 += 1;
            counts.1 += u64::from(amount);
            pending.by_name.entry(name.to_owned()).or_default().spent += u64::from(amount);
        }
        if let Some((generation, held)) = held {
            self.release(&mut pending, name, generation, held);
        }
    }

    /// `name`'s account as the store keeps it, in one round trip: its
    /// balance (less what is held: a request in flight counts, a hold
    /// whose lease ran out does not, though only the next reservation
    /// frees it; what this replica settled but has not written is taken as
    /// settled, as for [`Credits::reserve`]), what it spent today and in
    /// all (as written, at most [`FLUSH_EVERY`] behind).
    pub async fn statement(&self, name: &str, free_credits: u64) -> Result<Statement, StateError> {
        let account = self.shared.named("acct:", name);
        let leases = self.shared.named("leases:", name);
        let legacy = self.shared.named("held:", name);
        let today = self
            .shared
            .key(&format!("usage:{}:{name}", super::utc_day()));
        let before = self.unsettled(name);
        let (spent, granted, reserved, today): (u64, u64, i64, u64) = self
            .shared
            .run("statement", |mut conn| async move {
                STATEMENT_SCRIPT
                    .key(account)
                    .key(leases)
                    .key(today)
                    .key(legacy)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        let in_store = signed(free_credits)
            .saturating_add(signed(granted))
            .saturating_sub(signed(spent))
            .saturating_sub(reserved.max(0));
        Ok(Statement {
            remaining: u64::try_from(self.known_balance(in_store, before)).unwrap_or(0),
            used_today: today,
            used_total: spent,
        })
    }

    /// Grants `amount` credits to `name`: its account's `granted` raised
    /// and the grant listed, in one transaction.
    pub async fn grant(
        &self,
        name: &str,
        amount: u64,
        note: Option<&str>,
    ) -> Result<Grant, StateError> {
        let grant = Grant {
            amount,
            at: crate::ledger::now_timestamp(),
            note: note.map(str::to_owned),
        };
        let entry =
            serde_json::json!({"amount": amount, "at": grant.at, "note": grant.note}).to_string();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HINCRBY")
            .arg(self.shared.named("acct:", name))
            .arg("granted")
            .arg(amount)
            .ignore()
            .cmd("RPUSH")
            .arg(self.shared.named("grants:", name))
            .arg(entry)
            .ignore();
        self.shared
            .run("grant", |mut conn| async move {
                pipe.query_async::<()>(&mut conn).await
            })
            .await?;
        Ok(grant)
    }

    /// What the store holds for `name`: its grants, oldest first, and the
    /// credits it spent (as settled).
    pub async fn book(&self, name: &str) -> Result<Book, StateError> {
        let mut pipe = redis::pipe();
        pipe.cmd("LRANGE")
            .arg(self.shared.named("grants:", name))
            .arg(0)
            .arg(-1)
            .cmd("HGET")
            .arg(self.shared.named("acct:", name))
            .arg("spent");
        let (entries, spent): (Vec<String>, Option<u64>) = self
            .shared
            .run("book", |mut conn| async move {
                pipe.query_async(&mut conn).await
            })
            .await?;
        let grants = entries
            .iter()
            .filter_map(|e| serde_json::from_str::<serde_json::Value>(e).ok())
            .map(|v| Grant {
                amount: v["amount"].as_u64().unwrap_or(0),
                at: v["at"].as_str().unwrap_or_default().to_owned(),
                note: v["note"].as_str().map(str::to_owned),
            })
            .collect();
        Ok(Book {
            grants,
            spent: spent.unwrap_or(0),
        })
    }

    /// A reservation given back: nothing was delivered.
    pub fn refund(&self, name: &str, generation: u64, amount: u32) {
        let mut pending = self.pending();
        self.release(&mut pending, name, generation, amount);
    }

    /// Adds `amount` to what the next batch releases of `name`'s hold
    /// under the holder of `generation`: a busy key's releases are one
    /// entry however many, and adding to an entry is never refused.
    fn release(&self, pending: &mut Pending, name: &str, generation: u64, amount: u32) {
        let key = (name.to_owned(), generation);
        if pending.releases.contains_key(&key) || !self.full(pending) {
            *pending.releases.entry(key).or_default() += u64::from(amount);
            pending.by_name.entry(name.to_owned()).or_default().released += u64::from(amount);
        }
    }

    /// Whether the queue is full (then logged once and counted).
    fn full(&self, pending: &mut Pending) -> bool {
        if pending.len() < MAX_PENDING {
            return false;
        }
        crate::metrics::state_error("settle_dropped");
        if !std::mem::replace(&mut pending.overflow_logged, true) {
            tracing::error!(
                max = MAX_PENDING,
                "shared state away too long: settled credits past the buffer are not counted"
            );
        }
        true
    }

    /// Writes what was settled every [`FLUSH_EVERY`] until `shutdown`,
    /// then once more (trying for a second), once the reservations still
    /// at Redis are answered. Run as one task.
    pub async fn write(self: Arc<Self>, shutdown: CancellationToken) {
        let mut writer = Writer {
            credits: self,
            seq: 0,
            failed: None,
        };
        loop {
            tokio::select! {
                () = tokio::time::sleep(FLUSH_EVERY) => {}
                () = writer.credits.wake.notified() => {}
                () = shutdown.cancelled() => break,
            }
            let _ = writer.flush().await;
        }
        writer.credits.shared.asks_answered().await;
        // A batch that failed before goes first, then what is pending: each
        // is a flush of its own.
        for _ in 0..10 {
            match writer.flush().await {
                Ok(()) if writer.failed.is_none() && writer.credits.pending().len() == 0 => return,
                Ok(()) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        tracing::error!("shared state away at shutdown: settled credits not written");
    }

    /// Every usage hash on or after `since`, by (key, day), in that order.
    async fn usage_hashes(
        &self,
        since: Option<&str>,
    ) -> Result<Vec<((String, String), HashMap<String, u64>)>, StateError> {
        let index = self.shared.key("usage:index");
        let entries: Vec<String> = self
            .shared
            .run(
                "usage",
                |mut conn| async move { conn.smembers(index).await },
            )
            .await?;
        let mut wanted: Vec<(String, String)> = entries
            .iter()
            .filter_map(|e| e.split_once(' '))
            .filter(|(day, _)| since.is_none_or(|since| *day >= since))
            .map(|(day, key)| (key.to_owned(), day.to_owned()))
            .collect();
        wanted.sort();
        // redis refuses an empty pipeline ("empty command").
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for (key, day) in &wanted {
            pipe.cmd("HGETALL")
                .arg(self.shared.key(&format!("usage:{day}:{key}")));
        }
        let counts: Vec<HashMap<String, u64>> = self
            .shared
            .run("usage", |mut conn| async move {
                pipe.query_async(&mut conn).await
            })
            .await?;
        // A day deleted by hand leaves its index entry: no row for it.
        Ok(wanted
            .into_iter()
            .zip(counts)
            .filter(|(_, counts)| !counts.is_empty())
            .collect())
    }

    /// Usage on or after `since`, ordered by key then day.
    pub async fn usage(&self, since: Option<&str>) -> Result<Vec<UsageRow>, StateError> {
        Ok(self
            .usage_hashes(since)
            .await?
            .into_iter()
            .map(|((key, day), counts)| UsageRow {
                key,
                day,
                requests: counts.get("requests").copied().unwrap_or(0),
                credits: counts.get("credits").copied().unwrap_or(0),
            })
            .collect())
    }

    /// [`Credits::usage`] per endpoint, ordered by key, day, then endpoint.
    pub async fn usage_by_endpoint(
        &self,
        since: Option<&str>,
    ) -> Result<Vec<EndpointUsageRow>, StateError> {
        let mut rows = Vec::new();
        for ((key, day), counts) in self.usage_hashes(since).await? {
            let mut endpoints: Vec<&str> = counts
                .keys()
                .filter_map(|field| field.strip_prefix("requests:"))
                .collect();
            endpoints.sort_unstable();
            for endpoint in endpoints {
                rows.push(EndpointUsageRow {
                    key: key.clone(),
                    day: day.clone(),
                    endpoint: Some(endpoint.to_owned()),
                    requests: counts[&format!("requests:{endpoint}")],
                    credits: counts
                        .get(&format!("credits:{endpoint}"))
                        .copied()
                        .unwrap_or(0),
                });
            }
        }
        Ok(rows)
    }
}

/// The task that writes batches, in order, each until it lands.
struct Writer {
    credits: Arc<Credits>,
    seq: u64,
    /// A batch that did not land: sent again, as it was, before any other.
    failed: Option<Batch>,
}

/// One write: its number (the script skips one it applied), the take its
/// entries came from, and the script's arguments.
struct Batch {
    seq: u64,
    take: u64,
    args: Vec<String>,
}

impl Writer {
    /// Sends the batch that failed before, if any, then what is pending.
    async fn flush(&mut self) -> Result<(), StateError> {
        if let Some(failed) = self.failed.take() {
            self.send(failed).await?;
        }
        let (take, args) = self.take();
        let Some(args) = args else {
            // Nothing in this take, and every take before it landed.
            self.landed(take);
            return Ok(());
        };
        self.seq += 1;
        let seq = self.seq;
        self.send(Batch { seq, take, args }).await
    }

    /// Says the entries of takes up to `take` are written.
    fn landed(&self, take: u64) {
        self.credits.written.send_if_modified(|landed| {
            let later = take > *landed;
            if later {
                *landed = take;
            }
            later
        });
    }

    /// Sends `batch` until it lands or fails; a failed one is kept, to be
    /// sent again first.
    async fn send(&mut self, batch: Batch) -> Result<(), StateError> {
        let Batch { seq, take, args } = batch;
        let shared = &self.credits.shared;
        let marker = shared.named("batch:", shared.replica());
        let script = &self.credits.settle;
        let sent = args.clone();
        let result = shared
            .run("settle", |mut conn| async move {
                let mut invocation = script.key(marker);
                invocation.arg(shared.prefix()).arg(seq);
                for arg in &sent {
                    invocation.arg(arg);
                }
                invocation.invoke_async::<i64>(&mut conn).await
            })
            .await;
        match result {
            Ok(_) => {
                self.credits.pending().overflow_logged = false;
                self.landed(take);
                Ok(())
            }
            Err(e) => {
                self.failed = Some(Batch { seq, take, args });
                Err(e)
            }
        }
    }

    /// What is pending, as the script's arguments (`None` when nothing
    /// is), with the number of this take.
    fn take(&self) -> (u64, Option<Vec<String>>) {
        let (
            take,
            Pending {
                usage, releases, ..
            },
        ) = {
            let mut pending = self.credits.pending();
            let take = pending.taken + 1;
            let taken = std::mem::take(&mut *pending);
            pending.taken = take;
            (take, taken)
        };
        if usage.is_empty() && releases.is_empty() {
            return (take, None);
        }
        let mut args = Vec::with_capacity((usage.len() + releases.len()) * 6);
        for ((day, name, endpoint), (requests, credits)) in usage {
            args.extend([
                "u".to_owned(),
                name,
                day,
                endpoint.as_str().to_owned(),
                requests.to_string(),
                credits.to_string(),
            ]);
        }
        for ((name, generation), amount) in releases {
            args.extend([
                "r".to_owned(),
                name,
                batches::holder(&self.credits.shared, generation),
                amount.to_string(),
                "-".to_owned(),
                "-".to_owned(),
            ]);
        }
        (take, Some(args))
    }
}
