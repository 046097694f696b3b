//! The response cache: normalized answers kept in memory, bounded by bytes,
//! each for its endpoint's time to live, and one upstream fetch for any
//! number of callers asking for the same thing at once.
//!
//! - **What is stored** is the answer's `data`, serialized once, with the
//!   provider that gave it and its upstream cursor, never a sealed token:
//!   every answer seals its `next_cursor` when it is delivered. "Not found"
//!   is stored for `not_found_ttl_s`; no other error is.
//! - **The key** is the platform, the call as validated (so `@lunabakes`
//!   and `lunabakes`, an absent `count` and its default, are one entry),
//!   and for a later page the provider whose cursor it continues. Never the
//!   API key: the data is public and the same for every caller.
//! - **Coalescing**: the first caller to miss starts a fetch that belongs to
//!   no caller (a task of its own); everyone who misses the same key
//!   meanwhile waits for it. A caller that hangs up cancels nothing: the
//!   others still get the answer, and it is still stored. Every caller's
//!   wait keeps what the caller holds (its overload slot and credits) until
//!   the fetch lands, even if the caller hangs up: so the fetch always runs
//!   inside the limits of the caller that started it, and a caller never
//!   frees its slot early by hanging up (see [`crate::resilience::abandon`]).
//!   A wait ends at the caller's deadline and [`LANDING_GRACE`] more: a
//!   fetch runs on the thread of the caller that started it, and one that
//!   has not landed by then is held by a thread stuck in a plugin call and
//!   never will; its flight is ended so that the next caller starts anew.
//! - **Freshness** is [`freshness`]'s: the caller's `Cache-Control` may ask
//!   for a fresh answer (`no-cache`) or a young one (`max-age`); an answer
//!   whose time is up may still stand in, for `stale_if_error_s`, when the
//!   providers fail.
//!
//! The store survives reloads (an entry keeps the time to live it was
//! stored with) and is bounded by `[cache] max_bytes`, a process setting.
//!
//! With `[state] backend = "redis"`, a second level shared by replicas sits
//! behind it ([`shared`]): asked on a local miss, written when
//! a fetch stores an answer.

pub mod freshness;
pub mod shared;
pub mod status;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use plugin_api::{Call, Endpoint};
use serde::Deserialize;
use tokio::sync::watch;

use self::shared::SharedCache;
use crate::chain::{ChainError, Journal};
use crate::resilience::abandon::Detached;
use crate::resilience::deadline::Deadline;
use crate::settings::{ConfigError, Context};
use crate::sync::lock;

/// Default `[cache] max_bytes`.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// The longest time to live a config may set: a year.
const MAX_TTL_S: u64 = 365 * 24 * 3600;
/// What an entry costs beyond its strings: the map's slot, the `Arc`, the
/// entry's fields. Counted so that many tiny entries cannot outgrow
/// `max_bytes`.
const ENTRY_OVERHEAD: u64 = 256;

/// How long past its deadline a caller waits for a shared fetch to land.
/// A fetch stops at its deadline and lands moments later; one still out a
/// second after is held by a thread stuck in a plugin call.
pub const LANDING_GRACE: Duration = Duration::from_secs(1);

/// `[cache]`, but `max_bytes`: serving settings, applied by a reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    pub enabled: bool,
    /// `[cache.ttl_s]`, by endpoint, where the operator set one; zero:
    /// not cached.
    ttls: [(Endpoint, Option<Duration>); 5],
    pub not_found_ttl: Duration,
    pub stale_if_error: Duration,
}

impl CacheConfig {
    /// How long answers of `endpoint` are stored: the operator's
    /// `[cache.ttl_s]`, else `described`, the platform's description's
    /// default; `None`: not at all.
    pub fn ttl(&self, endpoint: Endpoint, described: Duration) -> Option<Duration> {
        let set = self
            .ttls
            .iter()
            .find(|(e, _)| *e == endpoint)
            .and_then(|(_, ttl)| *ttl);
        let ttl = set.unwrap_or(described);
        (self.enabled && !ttl.is_zero()).then_some(ttl)
    }
}

/// `[cache]` as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "the [cache] table")]
pub struct RawCache {
    enabled: Option<bool>,
    max_bytes: Option<u64>,
    not_found_ttl_s: Option<u64>,
    stale_if_error_s: Option<u64>,
    #[serde(default)]
    ttl_s: RawTtls,
}

/// `[cache.ttl_s]` as written.
#[derive(Deserialize, Default)]
#[serde(
    deny_unknown_fields,
    expecting = "the [cache.ttl_s] table: seconds by endpoint"
)]
struct RawTtls {
    profile: Option<u64>,
    posts: Option<u64>,
    post: Option<u64>,
    comments: Option<u64>,
    search: Option<u64>,
}

impl CacheConfig {
    pub fn from_raw(raw: &RawCache, cx: &Context) -> Result<CacheConfig, ConfigError> {
        let set = |key: &str, value: Option<u64>| match value {
            Some(s) if s > MAX_TTL_S => {
                Err(cx.invalid(key, format!("must be at most {MAX_TTL_S} (a year)")))
            }
            value => Ok(value.map(Duration::from_secs)),
        };
        let seconds = |key: &str, value: Option<u64>, default: u64| {
            set(key, value).map(|s| s.unwrap_or(Duration::from_secs(default)))
        };
        // Unset, an endpoint's lifetime is its description's default.
        let t = &raw.ttl_s;
        Ok(CacheConfig {
            enabled: raw.enabled.unwrap_or(true),
            ttls: [
                (Endpoint::Profile, set("[cache.ttl_s] profile", t.profile)?),
                (Endpoint::Posts, set("[cache.ttl_s] posts", t.posts)?),
                (Endpoint::Post, set("[cache.ttl_s] post", t.post)?),
                (
                    Endpoint::Comments,
                    set("[cache.ttl_s] comments", t.comments)?,
                ),
                (Endpoint::Search, set("[cache.ttl_s] search", t.search)?),
            ],
            not_found_ttl: seconds("[cache] not_found_ttl_s", raw.not_found_ttl_s, 30)?,
            stale_if_error: seconds("[cache] stale_if_error_s", raw.stale_if_error_s, 3600)?,
        })
    }
}

/// `[cache] max_bytes`: a process setting, since the store is built once.
pub fn max_bytes_from_raw(raw: &RawCache, cx: &Context) -> Result<u64, ConfigError> {
    cx.positive("[cache] max_bytes", raw.max_bytes, DEFAULT_MAX_BYTES)
}

/// What an answer is stored under; see the module doc.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Key {
    platform: String,
    call: Call,
    /// For a later page: the provider whose upstream cursor `call` holds.
    issuer: Option<String>,
}

impl Key {
    pub fn new(platform: &str, call: &Call, issuer: Option<&str>) -> Key {
        Key {
            platform: platform.to_owned(),
            call: call.clone(),
            issuer: issuer.map(str::to_owned),
        }
    }

    /// Roughly what the key's strings take.
    fn weight(&self) -> u64 {
        let text = self.platform.len()
            + self.call.subject().len()
            + self.call.cursor().map_or(0, str::len)
            + self.issuer.as_ref().map_or(0, String::len);
        text as u64
    }
}

/// A stored answer.
#[derive(Debug)]
pub struct Entry {
    stored_at: Instant,
    ttl: Duration,
    pub answer: Stored,
    weight: u64,
}

/// What was stored.
#[derive(Debug)]
pub enum Stored {
    Data(Data),
    /// The user or post does not exist.
    NotFound,
}

/// An answer's data and where its next page is.
#[derive(Debug)]
pub struct Data {
    /// The `data` of the answer, serialized.
    pub json: Bytes,
    /// The provider that gave it: the only one that can continue its listing.
    pub provider: Arc<str>,
    /// The provider's upstream cursor of the next page.
    pub next_cursor: Option<String>,
}

impl Entry {
    fn new(key: &Key, answer: Stored, ttl: Duration) -> Entry {
        let strings = match &answer {
            Stored::Data(data) => {
                data.json.len()
                    + data.provider.len()
                    + data.next_cursor.as_ref().map_or(0, String::len)
            }
            Stored::NotFound => 0,
        };
        Entry {
            stored_at: Instant::now(),
            ttl,
            answer,
            weight: ENTRY_OVERHEAD + key.weight() + strings as u64,
        }
    }

    /// An entry read from the shared level, stored `age` ago by a replica.
    pub fn restored(key: &Key, answer: Stored, ttl: Duration, age: Duration) -> Entry {
        let mut entry = Entry::new(key, answer, ttl);
        entry.stored_at = Instant::now().checked_sub(age).unwrap_or(entry.stored_at);
        entry
    }

    /// An answer that is not stored: the cache is off for its endpoint.
    pub fn unstored(answer: Stored) -> Entry {
        Entry {
            stored_at: Instant::now(),
            ttl: Duration::ZERO,
            answer,
            weight: 0,
        }
    }

    /// How long ago it was stored.
    pub fn age(&self) -> Duration {
        self.stored_at.elapsed()
    }

    /// How long it was stored to live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// Weighs entries by their bytes, so `max_bytes` bounds memory.
#[derive(Clone)]
struct ByBytes;

impl quick_cache::Weighter<Key, Arc<Entry>> for ByBytes {
    fn weight(&self, _key: &Key, entry: &Arc<Entry>) -> u64 {
        entry.weight
    }
}

/// How a fetch ended: what the chain answered, and what it did (for the
/// log line and metrics of the request that started it).
#[derive(Clone)]
pub struct Landing {
    pub outcome: Result<Arc<Entry>, ChainError>,
    pub journal: Arc<Journal>,
    /// Whether the answer was kept: not with a ttl of zero, nor when it
    /// weighs more than the store can hold.
    pub stored: bool,
}

/// What a fetch hands the cache before it is stored.
pub struct Fetched {
    pub outcome: Result<Stored, ChainError>,
    pub journal: Journal,
}

/// The store and the fetches in flight.
pub struct Cache {
    store: quick_cache::sync::Cache<Key, Arc<Entry>, ByBytes>,
    flights: Mutex<HashMap<Key, watch::Receiver<Option<Landing>>>>,
    /// The level replicas share (`redis`), behind this one.
    shared: Option<Arc<SharedCache>>,
}

impl Cache {
    #[cfg(test)]
    pub fn new(max_bytes: u64) -> Arc<Cache> {
        Cache::with_shared(max_bytes, None)
    }

    /// A cache with `shared` as its second level.
    pub fn with_shared(max_bytes: u64, shared: Option<Arc<SharedCache>>) -> Arc<Cache> {
        // quick_cache sizes its tables from an item estimate; answers are
        // about a few KiB.
        let estimated_items = usize::try_from(max_bytes / 4096)
            .unwrap_or(usize::MAX)
            .max(16);
        Arc::new(Cache {
            store: quick_cache::sync::Cache::with_weighter(estimated_items, max_bytes, ByBytes),
            flights: Mutex::new(HashMap::new()),
            shared,
        })
    }

    /// The stored answer for `key`, fresh or not: this replica's, then (on
    /// a miss) the shared level's, which is kept here too.
    pub async fn lookup(&self, key: &Key) -> Option<Arc<Entry>> {
        if let Some(entry) = self.store.get(key) {
            return Some(entry);
        }
        // Boxed: the local path's future stays as small as it was.
        let entry = Arc::new(Box::pin(self.shared.as_ref()?.get(key)).await?);
        self.store.insert(key.clone(), entry.clone());
        Some(entry)
    }

    /// Forgets the first page of `later`'s listing if `issuer` answered it.
    /// Its cursor leads only back to `issuer`, which has just failed to give
    /// a later page: a caller told to start the listing again must not be
    /// handed that cursor once more (until the page expires) when another
    /// provider could start it. Here and, with a shared level, for every
    /// replica.
    pub fn forget_first_page(&self, platform: &str, later: &Call, issuer: &str) {
        let key = Key::new(platform, &later.clone().with_cursor(None), None);
        let by_other = match self.store.peek(&key) {
            Some(entry) => match &entry.answer {
                Stored::Data(data) => *data.provider != *issuer,
                Stored::NotFound => true,
            },
            None => false,
        };
        if by_other {
            return;
        }
        self.store.remove(&key);
        if let Some(shared) = &self.shared {
            shared.forget(&key);
        }
    }

    /// Bytes the stored entries take, as weighed.
    pub fn bytes(&self) -> u64 {
        self.store.weight()
    }

    /// The answer for `key` from one fetch shared by every caller that asks
    /// meanwhile. The first caller's `fetch` runs as a task of its own;
    /// its answer is stored for `ttl` ("not found" for `not_found_ttl`;
    /// nothing else). `held` (what the caller holds) is kept until the
    /// fetch lands, even if the caller hangs up, and handed back; or until
    /// `deadline` and [`LANDING_GRACE`] have passed, when the flight is
    /// given up as dead and the caller's deadline is exceeded. Returns the
    /// landing and whether this caller joined a fetch another had started.
    pub async fn fetch_shared<F, H>(
        self: &Arc<Self>,
        key: Key,
        ttl: Duration,
        not_found_ttl: Duration,
        deadline: Deadline,
        fetch: F,
        held: H,
    ) -> (Landing, bool, H)
    where
        F: Future<Output = Fetched> + Send + 'static,
        H: Send + 'static,
    {
        let (mut landed, collapsed) = {
            let mut flights = lock(&self.flights);
            match flights.get(&key) {
                Some(landed) => (landed.clone(), true),
                None => {
                    let (land, landed) = watch::channel(None);
                    flights.insert(key.clone(), landed.clone());
                    let (cache, key) = (self.clone(), key.clone());
                    tokio::spawn(async move {
                        let Fetched { outcome, journal } = fetch.await;
                        let mut stored = false;
                        let outcome = outcome.map(|answer| {
                            let ttl = match answer {
                                Stored::Data(_) => ttl,
                                Stored::NotFound => not_found_ttl,
                            };
                            let entry = Arc::new(Entry::new(&key, answer, ttl));
                            if !ttl.is_zero() {
                                cache.store.insert(key.clone(), entry.clone());
                                // The store refuses what is heavier than its
                                // share of `max_bytes`, without a word; and
                                // it is shared, so it is asked for this entry.
                                stored = cache
                                    .store
                                    .peek(&key)
                                    .is_some_and(|kept| Arc::ptr_eq(&kept, &entry));
                                // The shared level keeps what this one does.
                                if let (true, Some(shared)) = (stored, &cache.shared) {
                                    shared.put(&key, &entry);
                                }
                            }
                            entry
                        });
                        // The flight ends before it lands: a request that
                        // comes after its waiters were answered must not
                        // join it and get its (maybe failed) landing.
                        lock(&cache.flights).remove(&key);
                        let _ = land.send(Some(Landing {
                            outcome,
                            journal: Arc::new(journal),
                            stored,
                        }));
                    });
                    (landed, false)
                }
            }
        };
        let cache = self.clone();
        let wait = async move {
            let give_up_at = deadline.at() + LANDING_GRACE;
            let waited = tokio::time::timeout_at(give_up_at, landed.wait_for(Option::is_some))
                .await
                .map(|landing| landing.map(|landing| landing.clone()));
            let landing = match waited {
                Ok(Ok(landing)) => landing,
                // The fetch task ended without landing (a bug: it panicked).
                Ok(Err(_)) => None,
                Err(_) => {
                    cache.end_dead_flight(&key, &landed);
                    Some(Landing {
                        outcome: Err(ChainError::DeadlineExceeded),
                        journal: Arc::default(),
                        stored: false,
                    })
                }
            };
            (landing, held)
        };
        let (landing, held) = Detached::new(wait).await;
        let landing = landing.unwrap_or_else(|| Landing {
            outcome: Err(ChainError::Exhausted),
            journal: Arc::default(),
            stored: false,
        });
        (landing, collapsed, held)
    }

    /// Ends the flight of `key` that `landed` waits on, if it is still
    /// the one there: it will never land, and the next caller fetches anew.
    fn end_dead_flight(&self, key: &Key, landed: &watch::Receiver<Option<Landing>>) {
        let mut flights = lock(&self.flights);
        if flights.get(key).is_some_and(|f| f.same_channel(landed)) {
            flights.remove(key);
        }
        drop(flights);
        tracing::warn!(
            "a shared fetch did not land by its caller's deadline; it is given up and the next caller fetches anew"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(username: &str) -> Key {
        let call = Call::from_params(Endpoint::Profile, [("username", username)]).unwrap();
        Key::new("shortvideo", &call, None)
    }

    /// A fetch that lands `outcome` at once.
    fn fetched(outcome: Result<Stored, ChainError>) -> std::future::Ready<Fetched> {
        std::future::ready(Fetched {
            outcome,
            journal: Journal::default(),
        })
    }

    fn data(json: &str) -> Stored {
        Stored::Data(Data {
            json: Bytes::from(json.to_owned()),
            provider: "p".into(),
            next_cursor: None,
        })
    }

    #[test]
    fn a_validated_call_is_one_key() {
        let call = |params: &[(&str, &str)]| {
            Key::new(
                "shortvideo",
                &Call::from_params(Endpoint::Comments, params.iter().copied()).unwrap(),
                None,
            )
        };
        assert_eq!(
            call(&[("id", "1")]),
            call(&[("id", "1"), ("count", "20")]),
            "an absent count and its default"
        );
        assert_ne!(call(&[("id", "1")]), call(&[("id", "1"), ("count", "21")]));
    }

    /// A fetch held by a thread stuck in a plugin call never lands: its
    /// callers wait until their deadline and the grace, no longer, and the
    /// next caller fetches anew instead of joining it.
    #[tokio::test(start_paused = true)]
    async fn a_fetch_that_never_lands_is_given_up_after_the_deadline() {
        /// A caller of the same key as every other here, with a 2 s deadline.
        async fn ask(
            cache: &Arc<Cache>,
            fetch: impl Future<Output = Fetched> + Send + 'static,
        ) -> (Landing, bool, ()) {
            cache
                .fetch_shared(
                    profile("stuck"),
                    Duration::from_secs(60),
                    Duration::ZERO,
                    Deadline::after(Duration::from_secs(2)),
                    fetch,
                    (),
                )
                .await
        }
        let cache = Cache::new(1 << 20);
        let started = tokio::time::Instant::now();
        let (landing, joined, ()) = ask(&cache, std::future::pending()).await;
        assert!(!joined);
        assert_eq!(landing.outcome.err(), Some(ChainError::DeadlineExceeded));
        assert_eq!(started.elapsed(), Duration::from_secs(2) + LANDING_GRACE);

        let (landing, joined, ()) = ask(&cache, fetched(Ok(data("{\"a\":1}")))).await;
        assert!(!joined, "a fresh fetch, not the dead one");
        assert!(landing.outcome.is_ok());
    }
}
