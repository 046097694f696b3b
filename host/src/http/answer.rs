//! Where a data answer comes from, once a request has passed its checks:
//! the cache, a fetch shared with others asking the same, or (when the
//! cache is off for the endpoint) the failover chain directly. Also where
//! an expired answer stands in when the providers fail.

use std::sync::Arc;
use std::time::Duration;

use plugin_api::{Call, Endpoint};
use tracing::Instrument;

use crate::cache::freshness::{self, Directives, Verdict};
use crate::cache::status::{seconds_left, CacheStatus, Forward};
use crate::cache::{CacheConfig, Data, Entry, Fetched, Key, Stored};
use crate::chain::{self, ChainError, Job, Journal, Served};
use crate::error::ApiError;
use crate::metrics;
use crate::resilience::deadline::Deadline;
use crate::resilience::rate_limit;
use crate::routing::Provider;
use crate::state::{App, Snapshot};

/// An answer with data.
pub struct Found {
    pub entry: Arc<Entry>,
    /// How old the stored answer is, read once, when it came from the
    /// cache (`meta.cached`): its `Age` and its `ttl` must agree.
    pub age: Option<Duration>,
    pub status: CacheStatus,
}

impl Found {
    /// The answer's data; every `Found` holds some.
    pub fn data(&self) -> &Data {
        match &self.entry.answer {
            Stored::Data(data) => data,
            Stored::NotFound => unreachable!("a found answer holds data"),
        }
    }
}

/// No data: why, and what the cache did (for "not found", which carries
/// `Cache-Status` too).
pub struct Unanswered {
    pub error: NoData,
    pub status: Option<CacheStatus>,
    /// How old the stored "not found" is, when the cache answered with it.
    pub age: Option<Duration>,
}

/// Why a request has no data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoData {
    /// The providers' verdict (or a stored "not found").
    Chain(ChainError),
    /// The request took only a stored answer (`only-if-cached`), and no
    /// fresh one was stored.
    NotStored,
}

impl NoData {
    /// Why a request to `endpoint` got no data, as its caller is told:
    /// the catalogue's error for it.
    pub fn into_api_error(self, endpoint: Endpoint) -> ApiError {
        match self {
            NoData::NotStored => ApiError::NotCached,
            NoData::Chain(ChainError::NotFound) => ApiError::ResourceNotFound,
            // A provider refuses the value of the endpoint's subject.
            NoData::Chain(ChainError::InvalidInput(message)) => ApiError::InvalidParameter {
                param: endpoint.subject_param().to_owned(),
                message,
            },
            NoData::Chain(ChainError::Exhausted) => ApiError::UpstreamUnavailable {
                retry_after_secs: None,
            },
            NoData::Chain(ChainError::Unavailable { retry_after }) => {
                ApiError::UpstreamUnavailable {
                    retry_after_secs: Some(rate_limit::retry_after_secs(retry_after)),
                }
            }
            NoData::Chain(ChainError::DeadlineExceeded) => ApiError::UpstreamTimeout,
            NoData::Chain(ChainError::Busy) => ApiError::overloaded(),
        }
    }
}

/// Shared fetches a request may join that end by their starter's deadline
/// before its own (see [`find_cached`]).
const MAX_JOINS: u32 = 3;

/// What one request needs to find its answer.
pub struct Ask<'a> {
    pub platform: &'a str,
    /// Shared with the attempts that serve it.
    pub call: &'a Arc<Call>,
    /// The providers to ask, in order.
    pub providers: &'a [Arc<Provider>],
    /// For a later page: the provider whose cursor the call continues.
    pub issuer: Option<&'a str>,
    pub directives: Directives,
    pub deadline: Deadline,
}

/// Finds the answer to `ask`, noting in `journal` what the chain did for
/// this request (nothing when another request's fetch answered it).
///
/// `held` is what the request holds while upstream work runs for it (its
/// overload slot, its key's slot and credits): the chain's attempt, or the wait for a
/// shared fetch, keeps it to its end even if the caller hangs up. It is
/// handed back with the answer.
pub async fn find<H: Send + 'static>(
    app: &App,
    snapshot: &Snapshot,
    ask: Ask<'_>,
    journal: &mut Journal,
    held: H,
) -> (Result<Found, Unanswered>, H) {
    let endpoint = ask.call.endpoint();
    let config = &snapshot.serving.cache;
    let Some(ttl) = config.ttl(endpoint) else {
        if ask.directives.only_if_cached {
            return (Err(not_stored(endpoint)), held);
        }
        metrics::cache(endpoint, "bypass");
        let job = Job {
            call: ask.call,
            client: &app.upstream,
            deadline: ask.deadline,
        };
        let (served, held) = chain::serve(ask.providers, job, journal, held).await;
        let found = served
            .map(|served| Found {
                entry: Arc::new(Entry::unstored(Stored::Data(data_of(served)))),
                age: None,
                status: CacheStatus::bypass(),
            })
            .map_err(|error| Unanswered {
                status: (error == ChainError::NotFound).then(CacheStatus::bypass),
                error: NoData::Chain(error),
                age: None,
            });
        return (found, held);
    };
    find_cached(app, config, ask, journal, ttl, held).await
}

/// [`find`] for an endpoint the cache keeps.
async fn find_cached<H: Send + 'static>(
    app: &App,
    config: &CacheConfig,
    ask: Ask<'_>,
    journal: &mut Journal,
    ttl: Duration,
    held: H,
) -> (Result<Found, Unanswered>, H) {
    let endpoint = ask.call.endpoint();

    let key = Key::new(ask.platform, ask.call, ask.issuer);
    let stored = app.cache.lookup(&key).await;
    // Read once: the verdict, `ttl` and `Age` must agree.
    let age = stored.as_ref().map_or(Duration::ZERO, |entry| entry.age());
    let forward = match &stored {
        None => Forward::Miss,
        Some(entry) => match freshness::judge(age, entry.ttl(), ask.directives) {
            Verdict::Fresh => {
                metrics::cache(endpoint, "hit");
                let status = CacheStatus::Hit {
                    ttl: seconds_left(entry.ttl(), age),
                };
                let hit = match entry.answer {
                    Stored::Data(_) => Ok(Found {
                        entry: entry.clone(),
                        age: Some(age),
                        status,
                    }),
                    Stored::NotFound => Err(Unanswered {
                        error: NoData::Chain(ChainError::NotFound),
                        status: Some(status),
                        age: Some(age),
                    }),
                };
                return (hit, held);
            }
            Verdict::Stale => Forward::Stale,
            Verdict::Refused => Forward::Request,
        },
    };
    if ask.directives.only_if_cached {
        return (Err(not_stored(endpoint)), held);
    }

    let fetch = || {
        let (providers, call, client) = (
            ask.providers.to_vec(),
            ask.call.clone(),
            app.upstream.clone(),
        );
        let deadline = ask.deadline;
        async move {
            let mut journal = Journal::default();
            // No caller owns the fetch, so it holds nothing of its own:
            // the wait of the caller that started it holds that caller's
            // slot and credits until it lands.
            let job = Job {
                call: &call,
                client: &client,
                deadline,
            };
            let (served, ()) = chain::serve(&providers, job, &mut journal, ()).await;
            let outcome = match served {
                Ok(served) => Ok(Stored::Data(data_of(served))),
                Err(ChainError::NotFound) => Ok(Stored::NotFound),
                Err(error) => Err(error),
            };
            Fetched { outcome, journal }
        }
        // The fetch's log lines carry the ID of the request that started it.
        .instrument(tracing::Span::current())
    };
    // `no-store`: a fetch this request starts keeps nothing. It may still
    // join an identical fetch in flight: what that one keeps is the answer
    // to the request that started it.
    let (keep_for, keep_not_found_for) = if ask.directives.no_store {
        (Duration::ZERO, Duration::ZERO)
    } else {
        (ttl, config.not_found_ttl)
    };
    let mut joined = 0;
    let mut held = held;
    let (landing, collapsed, held) = loop {
        let (landing, collapsed, back) = app
            .cache
            .fetch_shared(
                key.clone(),
                keep_for,
                keep_not_found_for,
                ask.deadline,
                fetch(),
                held,
            )
            .await;
        // The fetch this request joined ran out of the time of the request
        // that started it, not of this one's: with time left, fetch again.
        // Bounded, though each round ends at a later deadline.
        let theirs_ran_out = collapsed
            && matches!(landing.outcome, Err(ChainError::DeadlineExceeded))
            && !ask.deadline.expired();
        joined += 1;
        if theirs_ran_out && joined < MAX_JOINS {
            held = back;
            continue;
        }
        break (landing, collapsed, back);
    };
    metrics::cache(endpoint, if collapsed { "collapsed" } else { "miss" });
    if !collapsed {
        journal.attempts = landing.journal.attempts.clone();
    }
    let fetched = |stored: Duration| CacheStatus::Fetched {
        forward,
        stored: landing.stored.then_some(stored.as_secs()),
        collapsed,
    };
    let result = match landing.outcome {
        Ok(entry) => match entry.answer {
            Stored::Data(_) => Ok(Found {
                status: fetched(ttl),
                entry,
                age: None,
            }),
            Stored::NotFound => Err(Unanswered {
                error: NoData::Chain(ChainError::NotFound),
                status: Some(fetched(config.not_found_ttl)),
                age: None,
            }),
        },
        Err(
            error @ (ChainError::Exhausted
            | ChainError::DeadlineExceeded
            | ChainError::Unavailable { .. }
            | ChainError::Busy),
        ) => {
            if let (Some(issuer), false) = (ask.issuer, error == ChainError::Busy) {
                app.cache.forget_first_page(ask.platform, ask.call, issuer);
            }
            let landed = Landed { forward, collapsed };
            stand_in(stored, landed, config.stale_if_error, endpoint).ok_or(Unanswered {
                error: NoData::Chain(error),
                status: None,
                age: None,
            })
        }
        Err(error) => Err(Unanswered {
            error: NoData::Chain(error),
            status: None,
            age: None,
        }),
    };
    (result, held)
}

/// How a fetch this request waited on went: why it was forwarded, and
/// whether it was another request's.
#[derive(Clone, Copy)]
struct Landed {
    forward: Forward,
    collapsed: bool,
}

/// The stored answer that stands in when the providers could not answer,
/// if `stored` (read before the fetch; its age is read again now) holds
/// data still within `stale_if_error` of its time to live.
fn stand_in(
    stored: Option<Arc<Entry>>,
    landed: Landed,
    stale_if_error: Duration,
    endpoint: Endpoint,
) -> Option<Found> {
    let entry = stored.filter(|entry| matches!(entry.answer, Stored::Data(_)))?;
    let age = entry.age();
    if !freshness::usable_when_failing(age, entry.ttl(), stale_if_error) {
        return None;
    }
    let ttl = seconds_left(entry.ttl(), age);
    // Stored and still fresh, yet fetched: the request asked for a fresher
    // answer than the one it gets.
    let forward = if landed.forward == Forward::Request && age < entry.ttl() {
        tracing::warn!(
            ttl,
            "the providers could not answer; serving the stored answer the request asked to refresh"
        );
        Forward::Request
    } else {
        tracing::warn!(
            expired_secs = -ttl,
            "the providers could not answer; serving a stored answer past its time to live"
        );
        Forward::Stale
    };
    let status = CacheStatus::StoodIn {
        forward,
        ttl,
        collapsed: landed.collapsed,
    };
    metrics::cache(endpoint, status.log_value());
    Some(Found {
        status,
        entry,
        age: Some(age),
    })
}

/// What `only-if-cached` gets when no fresh answer is stored.
fn not_stored(endpoint: Endpoint) -> Unanswered {
    metrics::cache(endpoint, "not_stored");
    Unanswered {
        error: NoData::NotStored,
        status: Some(CacheStatus::NotStored),
        age: None,
    }
}

/// What a provider's answer is stored as.
fn data_of(served: Served) -> Data {
    Data {
        json: served.answer.data.into(),
        provider: served.provider.name.clone(),
        next_cursor: served.answer.next_cursor,
    }
}
