//! Credits per key: what each answered request costs, whether a key may
//! still spend once billing is enforced, and booking what was spent.
//!
//! Billing is announced but inactive: by default credits are only counted
//! (in the ledger). With `[billing] enforce = true`, a key's lifetime credits
//! are capped at `free_credits`: a credit is reserved before the chain runs
//! and refunded if the request fails, so concurrent requests cannot
//! overspend and a failure costs nothing. A reservation is owned, not
//! borrowed: the upstream work of a request whose caller hung up keeps it
//! until that work ends, then refunds it (nothing was delivered).
//!
//! Where the books are kept is the backend's: this process's accounts and
//! the SQLite [`Ledger`] (`local`), or the accounts every replica shares
//! ([`crate::shared::credits`], `redis`). A reservation is the same seam for
//! both: [`Billing::reserve`], then [`Reservation::commit`] or a drop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use plugin_api::Endpoint;
use serde::Deserialize;

use crate::config::{ConfigError, Context};
use crate::ledger::Ledger;
use crate::resilience::rate_limit::RateLimitConfig;
use crate::shared::credits::{Credits, Refusal};

/// Credits an answer costs when the config says nothing else.
const DEFAULT_COST: u32 = 1;

/// `[billing]` as configured. Serving configuration: a reload applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BillingConfig {
    /// Refuse requests of keys with no credits left.
    pub enforce: bool,
    /// Credits each key has for its lifetime.
    pub free_credits: u64,
}

impl Default for BillingConfig {
    fn default() -> Self {
        BillingConfig {
            enforce: false,
            free_credits: 150,
        }
    }
}

/// `[billing]` as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawBilling {
    enforce: Option<bool>,
    free_credits: Option<u64>,
}

impl BillingConfig {
    pub fn from_raw(raw: RawBilling, _cx: &Context) -> Result<BillingConfig, ConfigError> {
        let default = BillingConfig::default();
        Ok(BillingConfig {
            enforce: raw.enforce.unwrap_or(default.enforce),
            free_credits: raw.free_credits.unwrap_or(default.free_credits),
        })
    }

    /// What an answer of `endpoint` costs.
    pub fn cost(&self, _endpoint: Endpoint) -> u32 {
        DEFAULT_COST
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Account {
    spent: u64,
    reserved: u64,
}

/// Every key's spending, and where it is booked. The one place credits
/// are booked.
pub struct Billing {
    /// Every key's spending since the ledger began (`local` only).
    accounts: Mutex<HashMap<String, Account>>,
    books: Books,
}

/// Where credits are booked.
enum Books {
    Local(Ledger),
    Shared(Arc<Credits>),
}

/// Why a credit could not be reserved.
#[derive(Debug, PartialEq, Eq)]
pub enum NoCredit {
    /// The key has not enough credits left.
    OutOfCredits,
    /// The shared store cannot say (it is away): refuse rather than let a
    /// key spend what it may not have.
    Unavailable,
    /// The rate limit checked with the reservation refused first.
    RateLimited(std::time::Duration),
}

/// Credits held for a request: [`commit`](Reservation::commit) them when
/// the answer is delivered; dropping the reservation refunds them.
#[must_use]
pub struct Reservation {
    billing: Arc<Billing>,
    key: String,
    amount: u32,
    settled: bool,
    /// The shared store's name for the reservation (`redis`, enforced).
    held: Option<String>,
}

impl Billing {
    /// Starts from the lifetime credits `ledger` recorded. Blocking.
    pub fn open(ledger: Ledger) -> Result<Billing, crate::ledger::LedgerError> {
        let accounts = ledger
            .lifetime_credits()?
            .into_iter()
            .map(|(key, spent)| (key, Account { spent, reserved: 0 }))
            .collect();
        Ok(Billing {
            accounts: Mutex::new(accounts),
            books: Books::Local(ledger),
        })
    }

    /// Books kept in the shared store.
    pub fn shared(credits: Arc<Credits>) -> Billing {
        Billing {
            accounts: Mutex::default(),
            books: Books::Shared(credits),
        }
    }

    /// The shared accounts (`redis`), whose settling task the lifecycle runs.
    pub fn shared_credits(&self) -> Option<Arc<Credits>> {
        match &self.books {
            Books::Local(_) => None,
            Books::Shared(credits) => Some(credits.clone()),
        }
    }

    /// The ledger credits are counted in (`local`).
    pub fn ledger(&self) -> Option<&Ledger> {
        match &self.books {
            Books::Local(ledger) => Some(ledger),
            Books::Shared(_) => None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Account>> {
        self.accounts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds `amount` credits of `key`. Under `enforce`, refuses when spent
    /// and held credits plus `amount` would pass `free_credits`.
    ///
    /// `rate_limit`: a rate limit not checked yet, to check first in the
    /// same round trip (shared books, enforced: see
    /// [`Billing::checks_rate_limit`]); `None` otherwise.
    pub async fn reserve(
        self: &Arc<Self>,
        key: &str,
        amount: u32,
        config: BillingConfig,
        rate_limit: Option<RateLimitConfig>,
    ) -> Result<Reservation, NoCredit> {
        let held = match &self.books {
            Books::Local(_) => {
                let mut accounts = self.lock();
                let account = accounts.entry(key.to_owned()).or_default();
                let held = account.spent + account.reserved;
                if config.enforce && held + u64::from(amount) > config.free_credits {
                    return Err(NoCredit::OutOfCredits);
                }
                account.reserved += u64::from(amount);
                None
            }
            // Not enforced: nothing to check, so no round trip; the credits
            // are counted when committed.
            Books::Shared(_) if !config.enforce => None,
            // Boxed: the local path's future stays as small as it was.
            Books::Shared(credits) => Some(
                Box::pin(credits.reserve(key, amount, config.free_credits, rate_limit))
                    .await
                    .map_err(|refusal| match refusal {
                        Refusal::Exhausted => NoCredit::OutOfCredits,
                        Refusal::Unavailable => NoCredit::Unavailable,
                        Refusal::RateLimited(wait) => NoCredit::RateLimited(wait),
                    })?,
            ),
        };
        Ok(Reservation {
            billing: self.clone(),
            key: key.to_owned(),
            amount,
            settled: false,
            held,
        })
    }

    /// Whether a request's rate limit is best checked by [`Billing::reserve`]
    /// (shared books, billing enforced: one round trip for both) rather
    /// than on its own.
    pub fn checks_rate_limit(&self, config: BillingConfig) -> bool {
        config.enforce && matches!(self.books, Books::Shared(_))
    }

    /// Writes what is counted but not yet written: the last step of a
    /// graceful shutdown (`local`: the ledger; `redis`: the settling task
    /// does it when the shutdown token fires). Blocking.
    pub fn close(&self) -> Result<(), crate::ledger::LedgerError> {
        match &self.books {
            Books::Local(ledger) => ledger.close(),
            Books::Shared(_) => Ok(()),
        }
    }

    /// Credits `key` has spent.
    #[cfg(test)]
    fn spent(&self, key: &str) -> u64 {
        self.lock().get(key).map_or(0, |a| a.spent)
    }
}

impl Reservation {
    /// The answer was delivered: its credits are spent, in the account, the
    /// ledger and the metric alike. Returns the amount, for the answer's
    /// `meta.credits_used`.
    pub fn commit(mut self) -> u32 {
        if let Books::Shared(credits) = &self.billing.books {
            self.settled = true;
            credits.commit(&self.key, self.held.take(), self.amount);
        } else {
            self.settle(true);
            if let Books::Local(ledger) = &self.billing.books {
                ledger.record(&self.key, self.amount);
            }
        }
        crate::metrics::credits(u64::from(self.amount));
        self.amount
    }

    fn settle(&mut self, spend: bool) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        if let Books::Shared(credits) = &self.billing.books {
            if let Some(member) = self.held.take() {
                credits.refund(&self.key, member, self.amount);
            }
            return;
        }
        let amount = u64::from(self.amount);
        let mut accounts = self.billing.lock();
        let account = accounts.entry(self.key.clone()).or_default();
        account.reserved = account.reserved.saturating_sub(amount);
        if spend {
            account.spent += amount;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.settle(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const ENFORCED: BillingConfig = BillingConfig {
        enforce: true,
        free_credits: 3,
    };

    /// A billing on a fresh ledger in a scratch folder of the target dir.
    fn billing(name: &str) -> (Arc<Billing>, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("socialgate-billing-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ledger = Ledger::open(&dir.join("usage.db"), Duration::from_secs(3600)).unwrap();
        (Arc::new(Billing::open(ledger).unwrap()), dir)
    }

    #[tokio::test]
    async fn reservations_cannot_overspend_and_failures_refund() {
        let (billing, dir) = billing("overspend");
        billing
            .reserve("a", 1, ENFORCED, None)
            .await
            .unwrap()
            .commit();
        let first = billing.reserve("a", 1, ENFORCED, None).await.unwrap();
        let second = billing.reserve("a", 1, ENFORCED, None).await.unwrap();
        assert_eq!(
            billing.reserve("a", 1, ENFORCED, None).await.err(),
            Some(NoCredit::OutOfCredits),
            "held counts"
        );
        drop(second);
        assert_eq!(first.commit(), 1);
        assert_eq!(billing.spent("a"), 2);
        assert_eq!(
            billing.reserve("a", 2, ENFORCED, None).await.err(),
            Some(NoCredit::OutOfCredits),
            "more than what is left"
        );
        billing
            .reserve("a", 1, ENFORCED, None)
            .await
            .unwrap()
            .commit();
        assert_eq!(
            billing.reserve("a", 1, ENFORCED, None).await.err(),
            Some(NoCredit::OutOfCredits)
        );
        assert!(
            billing.reserve("b", 1, ENFORCED, None).await.is_ok(),
            "per key"
        );
        billing.close().unwrap();
        let spent = billing.ledger().unwrap().lifetime_credits().unwrap();
        assert_eq!(spent.get("a"), Some(&3), "the ledger booked what was spent");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn without_enforcement_credits_are_only_counted() {
        let (billing, dir) = billing("counted");
        let open = BillingConfig::default();
        for _ in 0..200 {
            billing.reserve("a", 1, open, None).await.unwrap().commit();
        }
        assert_eq!(billing.spent("a"), 200);
        let _ = std::fs::remove_dir_all(dir);
    }
}
