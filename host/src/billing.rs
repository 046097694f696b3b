//! Credits per key: what each answered request costs, and, once billing is
//! enforced, whether a key may still spend.
//!
//! Billing is announced but inactive: by default credits are only counted
//! (in the ledger). With `[billing] enforce = true`, a key's lifetime credits
//! are capped at `free_credits`: a credit is reserved before the chain runs
//! and refunded if the request fails, so concurrent requests cannot
//! overspend and a failure costs nothing.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::Deserialize;

/// Credits an answered request costs, on every endpoint today.
pub const CREDITS_PER_REQUEST: u32 = 1;

/// `[billing]` as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
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

#[derive(Debug, Default, Clone, Copy)]
struct Account {
    spent: u64,
    reserved: u64,
}

/// Every key's spending since the ledger began, kept in memory.
#[derive(Debug, Default)]
pub struct Accounts {
    accounts: Mutex<HashMap<String, Account>>,
}

/// The key has no credits left.
#[derive(Debug, PartialEq, Eq)]
pub struct OutOfCredits;

/// One credit held for a request: [`commit`](Reservation::commit) it when
/// the answer is delivered; dropping it refunds.
#[must_use]
pub struct Reservation<'a> {
    accounts: &'a Accounts,
    key: String,
    settled: bool,
}

impl Accounts {
    /// Starts from the lifetime credits the ledger recorded.
    pub fn new(spent: HashMap<String, u64>) -> Accounts {
        let accounts = spent
            .into_iter()
            .map(|(key, spent)| (key, Account { spent, reserved: 0 }))
            .collect();
        Accounts {
            accounts: Mutex::new(accounts),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Account>> {
        self.accounts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds one credit of `key`. Under `enforce`, refuses when spent and
    /// held credits already reach `free_credits`.
    pub fn reserve(
        &self,
        key: &str,
        config: BillingConfig,
    ) -> Result<Reservation<'_>, OutOfCredits> {
        let mut accounts = self.lock();
        let account = accounts.entry(key.to_owned()).or_default();
        if config.enforce && account.spent + account.reserved >= config.free_credits {
            return Err(OutOfCredits);
        }
        account.reserved += 1;
        Ok(Reservation {
            accounts: self,
            key: key.to_owned(),
            settled: false,
        })
    }

    /// Credits `key` has spent.
    #[cfg(test)]
    fn spent(&self, key: &str) -> u64 {
        self.lock().get(key).map_or(0, |a| a.spent)
    }
}

impl Reservation<'_> {
    /// The answer was delivered: the credit is spent.
    pub fn commit(mut self) {
        self.settle(true);
    }

    fn settle(&mut self, spend: bool) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        let mut accounts = self.accounts.lock();
        let account = accounts.entry(self.key.clone()).or_default();
        account.reserved = account.reserved.saturating_sub(1);
        if spend {
            account.spent += 1;
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.settle(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENFORCED: BillingConfig = BillingConfig {
        enforce: true,
        free_credits: 3,
    };

    #[test]
    fn reservations_cannot_overspend_and_failures_refund() {
        let accounts = Accounts::new(HashMap::from([("a".to_string(), 1)]));
        let first = accounts.reserve("a", ENFORCED).unwrap();
        let second = accounts.reserve("a", ENFORCED).unwrap();
        assert_eq!(
            accounts.reserve("a", ENFORCED).err(),
            Some(OutOfCredits),
            "held counts"
        );
        drop(second);
        first.commit();
        assert_eq!(accounts.spent("a"), 2);
        accounts.reserve("a", ENFORCED).unwrap().commit();
        assert_eq!(accounts.reserve("a", ENFORCED).err(), Some(OutOfCredits));
        assert!(accounts.reserve("b", ENFORCED).is_ok(), "per key");
    }

    #[test]
    fn without_enforcement_credits_are_only_counted() {
        let accounts = Accounts::default();
        let open = BillingConfig::default();
        for _ in 0..200 {
            accounts.reserve("a", open).unwrap().commit();
        }
        assert_eq!(accounts.spent("a"), 200);
    }
}
