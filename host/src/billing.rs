//! Credits per key: what each answered request costs, how many credits a
//! key has (free credits plus the packs granted to it, less what it spent),
//! whether it may still spend once billing is enforced, and booking what was
//! spent.
//!
//! Billing is announced but inactive: by default credits are only counted
//! (in the ledger) and reported. With `[billing] enforce = true`, a key may
//! spend at most its balance: `free_credits` plus its grants, less what it
//! spent. A request's cost is reserved before the chain runs and refunded if
//! the request fails, so concurrent requests cannot overspend and a failure
//! costs nothing. A reservation is owned, not borrowed: the upstream work of
//! a request whose caller hung up keeps it until that work ends, then
//! refunds it (nothing was delivered).
//!
//! The accounts live in memory (the request path never reads the ledger):
//! they start from the ledger's counts and grants, and grants written later
//! by `socialgate credits grant` arrive through the ledger's writer thread.
//!
//! Where the books are kept is the backend's: this process's accounts and
//! the SQLite [`Ledger`] (`local`, as above), or the accounts every replica
//! shares ([`crate::shared::credits`], `redis`: costs reserved and charged,
//! grants, usage per day and endpoint, all in Redis). A reservation is the
//! same seam for both: [`Billing::reserve_for`], then
//! [`Reservation::commit`] or a drop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use plugin_api::Endpoint;
use serde::Deserialize;

use crate::ledger::{Ledger, LedgerError, Statement};
use crate::resilience::rate_limit::{RateLimitConfig, Standing};
use crate::settings::{ConfigError, Context};
use crate::shared::credits::{Credits, Held, Refusal};
use crate::sync::lock;

/// Credits an answer costs when the config says nothing else.
const DEFAULT_COST: u32 = 1;

/// Where a request's answer may come from, which bounds what it may cost
/// and so what is held for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Fetched only: the cache is off for the endpoint.
    Fetch,
    /// Fetched, or from the cache.
    FetchOrCache,
    /// From the cache only (`Cache-Control: only-if-cached`).
    Cache,
    /// Nowhere: `only-if-cached` on an endpoint the cache does not keep
    /// (or with `no-cache`, which refuses what it keeps).
    Nowhere,
}

impl Source {
    /// The source of a request that a stored answer may answer or not
    /// (`stored`: the cache keeps the endpoint, and the request takes one),
    /// asking for a stored answer only or not.
    pub fn of(stored: bool, only_if_cached: bool) -> Source {
        match (stored, only_if_cached) {
            (false, false) => Source::Fetch,
            (true, false) => Source::FetchOrCache,
            (true, true) => Source::Cache,
            (false, true) => Source::Nowhere,
        }
    }

    /// What to hold for an answer from here, of those costs.
    fn most(self, fresh: u32, cached: u32) -> u32 {
        match self {
            Source::Fetch => fresh,
            Source::FetchOrCache => fresh.max(cached),
            Source::Cache => cached,
            Source::Nowhere => 0,
        }
    }
}

/// `[billing]` as configured. Serving configuration: a reload applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BillingConfig {
    /// Refuse requests that cost more than the key's balance.
    pub enforce: bool,
    /// Credits each key has for its lifetime, before any grant.
    pub free_credits: u64,
    /// `[billing.costs]`.
    pub costs: Costs,
}

impl Default for BillingConfig {
    fn default() -> Self {
        BillingConfig {
            enforce: false,
            free_credits: 150,
            costs: Costs::default(),
        }
    }
}

/// What a delivered answer costs, per endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Costs {
    /// In [`Endpoint::ALL`] order.
    fresh: [u32; Endpoint::ALL.len()],
    /// What an answer from the cache costs (stale ones too); `None`: what a
    /// fresh one does.
    cached: Option<u32>,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            fresh: [DEFAULT_COST; Endpoint::ALL.len()],
            cached: None,
        }
    }
}

impl Costs {
    fn slot(endpoint: Endpoint) -> usize {
        Endpoint::ALL
            .iter()
            .position(|e| *e == endpoint)
            .unwrap_or_default()
    }

    /// What an answer of `endpoint` fetched for the request costs.
    pub fn fresh(&self, endpoint: Endpoint) -> u32 {
        self.fresh[Costs::slot(endpoint)]
    }

    /// What an answer of `endpoint` from the cache costs.
    pub fn cached(&self, endpoint: Endpoint) -> u32 {
        self.cached.unwrap_or_else(|| self.fresh(endpoint))
    }

    /// What an answer from the cache costs when the operator set it
    /// (`[billing.costs] cached`); `None`: what its endpoint costs.
    pub fn cached_override(&self) -> Option<u32> {
        self.cached
    }

    /// Every endpoint with its cost, in [`Endpoint::ALL`] order.
    pub fn per_endpoint(&self) -> impl Iterator<Item = (Endpoint, u32)> + '_ {
        Endpoint::ALL.into_iter().map(|e| (e, self.fresh(e)))
    }
}

/// `[billing]` as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "the [billing] table")]
pub struct RawBilling {
    enforce: Option<bool>,
    free_credits: Option<u64>,
    costs: Option<RawCosts>,
}

/// `[billing.costs]` as written.
#[derive(Deserialize, Default)]
#[serde(
    deny_unknown_fields,
    expecting = "the [billing.costs] table: credits by endpoint"
)]
struct RawCosts {
    profile: Option<u32>,
    posts: Option<u32>,
    post: Option<u32>,
    comments: Option<u32>,
    search: Option<u32>,
    cached: Option<u32>,
}

impl BillingConfig {
    pub fn from_raw(raw: RawBilling, _cx: &Context) -> Result<BillingConfig, ConfigError> {
        let default = BillingConfig::default();
        let costs = raw.costs.unwrap_or_default();
        let mut fresh = default.costs.fresh;
        for endpoint in Endpoint::ALL {
            let written = match endpoint {
                Endpoint::Profile => costs.profile,
                Endpoint::Posts => costs.posts,
                Endpoint::Post => costs.post,
                Endpoint::Comments => costs.comments,
                Endpoint::Search => costs.search,
            };
            if let Some(cost) = written {
                fresh[Costs::slot(endpoint)] = cost;
            }
        }
        Ok(BillingConfig {
            enforce: raw.enforce.unwrap_or(default.enforce),
            free_credits: raw.free_credits.unwrap_or(default.free_credits),
            costs: Costs {
                fresh,
                cached: costs.cached,
            },
        })
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Account {
    spent: u64,
    reserved: u64,
    granted: u64,
    /// The UTC day (days since 1970) `spent_today` counts.
    day: u64,
    spent_today: u64,
}

impl Account {
    /// `free_credits` + grants - spent, never below 0 (`free_credits` may
    /// have been lowered since).
    fn remaining(&self, free_credits: u64) -> u64 {
        free_credits
            .saturating_add(self.granted)
            .saturating_sub(self.spent)
    }
}

type Accounts = HashMap<String, Account>;

/// Every key's account since the ledger began, kept in memory, and the
/// ledger that keeps it. The one place credits are booked.
pub struct Billing {
    /// Every key's account (`local` books; empty with `redis`, whose
    /// accounts are the store's).
    accounts: Arc<Mutex<Accounts>>,
    books: Books,
}

/// Where credits are booked.
enum Books {
    Local(Ledger),
    Shared {
        credits: Arc<Credits>,
        /// The balance each key had when this replica last asked the
        /// store, for the answers that reserve nothing.
        last_balance: Mutex<HashMap<String, u64>>,
    },
}

/// The key has not enough credits left.
#[derive(Debug, PartialEq, Eq)]
pub struct OutOfCredits;

/// Why a credit could not be reserved ([`Billing::reserve_for`]).
#[derive(Debug, PartialEq, Eq)]
pub enum NoCredit {
    /// The key has not enough credits left (and, when the shared bucket was
    /// taken in the same round trip, where it stands).
    OutOfCredits(Option<Standing>),
    /// The shared store cannot say (it is away): refuse rather than let a
    /// key spend what it may not have.
    Unavailable,
    /// The rate limit checked with the reservation refused first.
    RateLimited(std::time::Duration),
}

/// A reservation and, when the shared bucket was taken in the same round
/// trip, where that bucket stands.
pub struct Reserved {
    pub reservation: Reservation,
    pub standing: Option<Standing>,
    /// The key's balance before this request's charge, when the store said.
    pub balance: Option<u64>,
}

/// Credits held for a request: [`commit`](Reservation::commit) them when
/// the answer is delivered; dropping the reservation refunds them.
#[must_use]
pub struct Reservation {
    billing: Arc<Billing>,
    key: String,
    endpoint: Endpoint,
    /// The most the answer can cost (fresh or cached).
    held: u32,
    fresh: u32,
    cached: u32,
    free_credits: u64,
    settled: bool,
    /// `redis`: the generation of the holder `held` is held under in the
    /// shared store, to release it there.
    in_store: Option<u64>,
    /// `redis`: the key's balance before this charge (less what else is
    /// held), as the store said.
    balance: u64,
}

/// What a delivered answer was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    /// For `meta.credits_used`.
    pub credits: u32,
    /// The key's balance after this charge.
    pub remaining: u64,
}

/// Days since 1970 of `now`, the UTC day.
fn day_of(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400)
}

impl Billing {
    /// Starts from the credits `ledger` recorded and the grants it holds,
    /// and follows the grants written from now on. Blocking.
    pub fn open(ledger: Ledger) -> Result<Billing, LedgerError> {
        let now = SystemTime::now();
        let day = day_of(now);
        let accounts: Accounts = ledger
            .spent(&crate::ledger::utc_day(now))?
            .into_iter()
            .map(|(key, spent)| {
                let account = Account {
                    spent: spent.total,
                    day,
                    spent_today: spent.today,
                    ..Account::default()
                };
                (key, account)
            })
            .collect();
        let accounts = Arc::new(Mutex::new(accounts));
        let credited = Arc::clone(&accounts);
        ledger.watch_grants(move |grants| {
            let mut accounts = lock(&credited);
            for grant in grants {
                let account = accounts.entry(grant.key.clone()).or_default();
                account.granted = account.granted.saturating_add(grant.amount);
            }
        })?;
        Ok(Billing {
            accounts,
            books: Books::Local(ledger),
        })
    }

    /// Books kept in the shared store.
    pub fn shared(credits: Arc<Credits>) -> Billing {
        Billing {
            accounts: Arc::default(),
            books: Books::Shared {
                credits,
                last_balance: Mutex::default(),
            },
        }
    }

    /// The shared accounts (`redis`), whose settling task the lifecycle runs.
    pub fn shared_credits(&self) -> Option<Arc<Credits>> {
        match &self.books {
            Books::Local(_) => None,
            Books::Shared { credits, .. } => Some(credits.clone()),
        }
    }

    /// Whether a request's rate limit is best checked by
    /// [`Billing::reserve_for`] (shared books: one round trip for both)
    /// rather than on its own.
    pub fn checks_rate_limit(&self, config: BillingConfig) -> bool {
        config.enforce && matches!(self.books, Books::Shared { .. })
    }

    /// Writes what is counted but not yet written: the last step of a
    /// graceful shutdown (`local`: the ledger; `redis`: the settling task
    /// does it when the shutdown token fires). Blocking.
    pub fn close(&self) -> Result<(), LedgerError> {
        match &self.books {
            Books::Local(ledger) => ledger.close(),
            Books::Shared { .. } => Ok(()),
        }
    }

    /// [`Billing::reserve`] on whichever books are kept. With shared books
    /// and billing enforced, one script holds the cost in the store (and
    /// takes a token of the key's global bucket first when `rate_limit`
    /// says so); not enforced, nothing is checked, so nothing is asked.
    pub async fn reserve_for(
        self: &Arc<Self>,
        key: &str,
        endpoint: Endpoint,
        source: Source,
        config: BillingConfig,
        rate_limit: Option<RateLimitConfig>,
    ) -> Result<Reserved, NoCredit> {
        let credits = match &self.books {
            Books::Local(_) => {
                return self
                    .reserve(key, endpoint, source, config)
                    .map(|reservation| Reserved {
                        reservation,
                        standing: None,
                        balance: None,
                    })
                    .map_err(|OutOfCredits| NoCredit::OutOfCredits(None));
            }
            Books::Shared { credits, .. } => credits,
        };
        let mut reservation = self.reservation(key, endpoint, source, config);
        if !config.enforce {
            return Ok(Reserved {
                reservation,
                standing: None,
                balance: None,
            });
        }
        // Boxed: the local path's future stays as small as it was.
        let outcome =
            Box::pin(credits.reserve(key, reservation.held, config.free_credits, rate_limit)).await;
        match outcome {
            Ok(Held {
                generation,
                balance,
                standing,
            }) => {
                self.know(key, balance);
                reservation.in_store = Some(generation);
                reservation.balance = balance;
                Ok(Reserved {
                    reservation,
                    standing,
                    balance: Some(balance),
                })
            }
            Err(refusal) => {
                reservation.forget();
                Err(match refusal {
                    Refusal::Exhausted { balance, standing } => {
                        self.know(key, u64::try_from(balance).unwrap_or(0));
                        NoCredit::OutOfCredits(standing)
                    }
                    Refusal::Unavailable => NoCredit::Unavailable,
                    Refusal::RateLimited(wait) => NoCredit::RateLimited(wait),
                })
            }
        }
    }

    /// Remembers `key`'s balance as the shared store last said it.
    fn know(&self, key: &str, balance: u64) {
        if let Books::Shared { last_balance, .. } = &self.books {
            *lock(last_balance).entry(key.to_owned()).or_default() = balance;
        }
    }

    /// `key`'s account as the shared store keeps it (`redis`: one round
    /// trip); `None` with local books.
    pub async fn shared_statement(
        &self,
        key: &str,
        config: BillingConfig,
    ) -> Option<Result<Statement, crate::shared::StateError>> {
        let Books::Shared { credits, .. } = &self.books else {
            return None;
        };
        let statement = credits.statement(key, config.free_credits).await;
        if let Ok(statement) = &statement {
            self.know(key, statement.remaining);
        }
        Some(statement)
    }

    /// A reservation of what an answer of `endpoint` may cost, not yet
    /// booked anywhere.
    fn reservation(
        self: &Arc<Self>,
        key: &str,
        endpoint: Endpoint,
        source: Source,
        config: BillingConfig,
    ) -> Reservation {
        let fresh = config.costs.fresh(endpoint);
        let cached = config.costs.cached(endpoint);
        let held = source.most(fresh, cached);
        Reservation {
            billing: self.clone(),
            key: key.to_owned(),
            endpoint,
            held,
            fresh,
            cached,
            free_credits: config.free_credits,
            settled: false,
            in_store: None,
            balance: config.free_credits,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Accounts> {
        lock(&self.accounts)
    }

    /// Holds what an answer of `endpoint` from `source` may cost `key`: the
    /// larger of its fresh and cached costs when it may be either, the one
    /// it can be otherwise, nothing when no answer can be delivered. Under
    /// `enforce`, refuses when that is more than the balance left after
    /// what is already held. Local books only: [`Billing::reserve_for`]
    /// chooses the books.
    fn reserve(
        self: &Arc<Self>,
        key: &str,
        endpoint: Endpoint,
        source: Source,
        config: BillingConfig,
    ) -> Result<Reservation, OutOfCredits> {
        let reservation = self.reservation(key, endpoint, source, config);
        let held = reservation.held;
        let mut accounts = self.lock();
        let account = account_of(&mut accounts, key);
        let available = account
            .remaining(config.free_credits)
            .saturating_sub(account.reserved);
        if config.enforce && held > 0 && u64::from(held) > available {
            // Never booked: dropping it must give nothing back.
            reservation.forget();
            return Err(OutOfCredits);
        }
        account.reserved += u64::from(held);
        Ok(reservation)
    }

    /// `key`'s balance now (`redis`: as this replica last heard it).
    pub fn remaining(&self, key: &str, config: BillingConfig) -> u64 {
        if let Books::Shared { last_balance, .. } = &self.books {
            return lock(last_balance)
                .get(key)
                .copied()
                .unwrap_or(config.free_credits);
        }
        self.lock()
            .get(key)
            .map_or(config.free_credits, |a| a.remaining(config.free_credits))
    }

    /// `key`'s account now.
    pub fn statement(&self, key: &str, config: BillingConfig) -> Statement {
        let today = day_of(SystemTime::now());
        let accounts = self.lock();
        let account = accounts.get(key).copied().unwrap_or_default();
        Statement {
            remaining: account.remaining(config.free_credits),
            used_today: if account.day == today {
                account.spent_today
            } else {
                0
            },
            used_total: account.spent,
        }
    }
}

/// `key`'s account, created empty.
fn account_of<'a>(accounts: &'a mut Accounts, key: &str) -> &'a mut Account {
    accounts.entry(key.to_owned()).or_default()
}

impl Reservation {
    /// The answer was delivered (from the cache when `cached`): its cost is
    /// spent, in the account, the ledger and the metric alike, and the rest
    /// of what was held is released.
    pub fn commit(mut self, cached: bool) -> Charge {
        let credits = if cached { self.cached } else { self.fresh };
        // What was held is all the balance was checked for (a `Cache`
        // reservation is never committed as fetched).
        debug_assert!(
            credits <= self.held,
            "charged {credits}, held {}",
            self.held
        );
        let billing = self.billing.clone();
        let remaining = match &billing.books {
            Books::Local(ledger) => {
                let remaining = self.settle(Some(credits));
                ledger.record(&self.key, self.endpoint, credits);
                remaining
            }
            Books::Shared {
                credits: credits_in_store,
                ..
            } => {
                self.settled = true;
                credits_in_store.commit(
                    &self.key,
                    self.endpoint,
                    self.in_store.take().map(|g| (g, self.held)),
                    credits,
                );
                let remaining = self.balance.saturating_sub(u64::from(credits));
                self.billing.know(&self.key, remaining);
                remaining
            }
        };
        crate::metrics::credits(u64::from(credits));
        Charge { credits, remaining }
    }

    /// Releases what was held, spending `spend` of it; the balance after.
    fn settle(&mut self, spend: Option<u32>) -> u64 {
        let mut accounts = self.billing.lock();
        let account = account_of(&mut accounts, &self.key);
        if std::mem::replace(&mut self.settled, true) {
            return account.remaining(self.free_credits);
        }
        account.reserved = account.reserved.saturating_sub(u64::from(self.held));
        if let Some(spend) = spend {
            let spend = u64::from(spend);
            let today = day_of(SystemTime::now());
            if account.day != today {
                account.day = today;
                account.spent_today = 0;
            }
            account.spent += spend;
            account.spent_today += spend;
        }
        account.remaining(self.free_credits)
    }
}

impl Reservation {
    /// Drops a reservation that was never booked: nothing to give back.
    fn forget(mut self) {
        self.settled = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Books::Shared { credits, .. } = &self.billing.books {
            self.settled = true;
            if let Some(generation) = self.in_store.take() {
                credits.refund(&self.key, generation, self.held);
            }
            return;
        }
        if !self.settled {
            self.settle(None);
        }
    }
}
