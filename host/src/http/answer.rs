//! A data answer, once a request is admitted: where it comes from (the
//! cache, a fetch shared with others asking the same, or, when the cache is
//! off for the endpoint, the failover chain directly; an expired answer
//! stands in when the providers fail), then what its caller is told: the
//! data with its `ETag`, preconditions and charge, or the error.

use std::sync::Arc;
use std::time::Duration;

use hyper::header::{HeaderMap, HeaderName, HeaderValue, AGE, CACHE_CONTROL, ETAG, LINK};
use hyper::{Response, StatusCode};
use plugin_api::{Call, Endpoint};
use tracing::Instrument;

use super::encoding::{self, NotModified};
use super::response::{self, Body};
use crate::billing::Reservation;
use crate::cache::freshness::{self, Directives, Verdict};
use crate::cache::status::{seconds_left, CacheStatus, Forward};
use crate::cache::{CacheConfig, Data, Entry, Fetched, Key, Stored};
use crate::chain::{self, ChainError, Job, Journal, Served};
use crate::cursor::{Listing, Position, Trail};
use crate::error::ApiError;
use crate::metrics;
use crate::resilience::concurrency::{InFlight, KeyInFlight};
use crate::resilience::deadline::Deadline;
use crate::resilience::rate_limit::{self, Standing};
use crate::routing::{DescribedEndpoint, Provider};
use crate::state::{App, Snapshot};

/// RFC 9211.
const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// What a request did, for its headers, its log line and its metrics.
#[derive(Default)]
pub struct Report<'s> {
    /// The name (never the value) of the key that was accepted.
    pub key: Option<&'s str>,
    pub provider: Option<Arc<str>>,
    /// What the cache did, for data answers.
    pub cache: Option<CacheStatus>,
    pub journal: Journal,
    /// Where the key's rate-limit bucket stands, once checked.
    pub rate: Option<Standing>,
    /// The key's balance after the answer's charge, once charged.
    pub remaining: Option<u64>,
}

/// What admission took for a data request: the server's slot, the key's,
/// and the credits held for its answer. Moved by value into the upstream
/// work (the chain's attempt, or the wait on a shared fetch), so a caller
/// who hangs up keeps it until that work ends; dropped, on any exit, it
/// gives each back (the credits refunded: nothing was delivered), so no
/// exit gives anything back by hand.
pub struct Admitted {
    pub _places: (InFlight, Option<KeyInFlight>),
    pub credits: Reservation,
}

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

/// What one request asks, as admission checked it.
pub struct Ask<'a> {
    pub platform: &'a str,
    /// The endpoint in the platform's description: what answers must be.
    pub described: DescribedEndpoint,
    /// Shared with the attempts that serve it.
    pub call: Arc<Call>,
    /// The providers to ask, in order.
    pub providers: &'a [Arc<Provider>],
    /// For a later page: the provider whose cursor the call continues.
    pub issuer: Option<&'a str>,
    /// Where the listing has been ([`Trail::then`] ends it).
    pub trail: Trail,
    pub directives: Directives,
}

/// The answer to an admitted request: found (`find`) while `admitted`
/// is held, then its `ETag`, the preconditions (`If-Match`, then
/// `If-None-Match`), the charge (none for a `304` or `412`, whose
/// reservation is refunded, unless the request forced a fetch) and its
/// headers; or the error it came to, with what the
/// cache did.
pub async fn answer(
    app: &App,
    snapshot: &Snapshot,
    request: &HeaderMap,
    ask: Ask<'_>,
    admitted: Admitted,
    report: &mut Report<'_>,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    let deadline = Deadline::after(snapshot.serving.request_timeout);
    let (found, admitted) =
        find(app, snapshot, &ask, deadline, &mut report.journal, admitted).await;
    let (platform, call) = (ask.platform, &*ask.call);
    let endpoint = call.endpoint();
    let found = match found {
        Ok(found) => found,
        Err(Unanswered { error, status, age }) => {
            report.cache = status;
            let mut response = response::error(&error.into_api_error(endpoint), id);
            if let Some(status) = status {
                set_cache_headers(&mut response, &status, age, None);
            }
            return Ok(response);
        }
    };
    let data = found.data();
    report.provider = Some(data.provider.clone());
    report.cache = Some(found.status);

    let next_cursor = endpoint.is_list().then(|| {
        data.next_cursor.as_ref().and_then(|upstream| {
            let trail = ask.trail.then(upstream)?;
            let position = Position {
                provider: data.provider.to_string(),
                upstream: upstream.clone(),
                trail,
            };
            Some(app.cursors.seal(listing_of(platform, call), &position))
        })
    });
    // The tag covers what the answer says (its data, and where its next
    // page starts, while its token lasts), not `meta`'s per-request facts.
    let etag = match &data.next_cursor {
        None => encoding::etag(&[platform.as_bytes(), &data.json]),
        // Keyed: it covers the hidden upstream cursor.
        Some(position) => encoding::etag_of(app.cursors.page_tag(&[
            platform.as_bytes(),
            &data.json,
            position.as_bytes(),
        ])),
    };
    let (age, cached) = (found.age, found.age.is_some());
    // The request's `Cache-Control` refused the stored answer and had it
    // fetched anew: its `304` or `412` costs that fetch, or one credit
    // would buy fetches forever.
    let fetched_on_demand = matches!(
        found.status,
        CacheStatus::Fetched {
            forward: Forward::Request,
            ..
        }
    );
    // `If-Match` first (RFC 9110, 13.2.2), and before the charge: a `412`
    // delivers nothing, and the dropped reservation is refunded.
    if !encoding::if_match_holds(request, Some(&etag)) {
        if !fetched_on_demand {
            return Err(ApiError::PreconditionFailed);
        }
        let charge = admitted.credits.commit(cached);
        report.remaining = Some(charge.remaining);
        let refused = ApiError::PreconditionFailed;
        return Ok(response::error_costing(&refused, id, charge.credits));
    }
    let not_modified = encoding::not_modified(request, &etag);
    let credits_used = if not_modified && !fetched_on_demand {
        // Nothing is delivered: the reservation is refunded when dropped.
        drop(admitted.credits);
        0
    } else {
        let charge = admitted.credits.commit(cached);
        report.remaining = Some(charge.remaining);
        charge.credits
    };
    // A `304` is made from the `200` it stands for (see `represent`).
    let mut response = response::success(
        platform,
        &data.json,
        credits_used,
        cached,
        next_cursor.as_ref().map(|c| c.as_deref()),
        id,
    );
    response.headers_mut().insert(ETAG, etag);
    if let Some(Some(token)) = &next_cursor {
        if let Some(link) = next_page_link(platform, call, token) {
            response.headers_mut().insert(LINK, link);
        }
    }
    // A page's token is sealed now: no cache may keep the page past it.
    let reusable_for = data
        .next_cursor
        .is_some()
        .then(|| app.cursors.reusable_for());
    set_cache_headers(&mut response, &found.status, age, reusable_for);
    if not_modified {
        response.extensions_mut().insert(NotModified);
    }
    Ok(response)
}

/// Finds the answer to `ask` by `deadline`, noting in `journal` what the
/// chain did for this request (nothing when another request's fetch
/// answered it).
///
/// `held` is what the request holds while upstream work runs for it
/// ([`Admitted`]): the chain's attempt, or the wait for a shared fetch,
/// keeps it to its end even if the caller hangs up. It is handed back with
/// the answer.
async fn find<H: Send + 'static>(
    app: &App,
    snapshot: &Snapshot,
    ask: &Ask<'_>,
    deadline: Deadline,
    journal: &mut Journal,
    held: H,
) -> (Result<Found, Unanswered>, H) {
    let endpoint = ask.call.endpoint();
    let config = &snapshot.serving.cache;
    let Some(ttl) = config.ttl(endpoint, ask.described.cache_ttl()) else {
        if ask.directives.only_if_cached {
            return (Err(not_stored(endpoint)), held);
        }
        metrics::cache(endpoint, "bypass");
        let job = Job {
            call: &ask.call,
            described: &ask.described,
            client: &app.upstream,
            deadline,
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
    find_cached(app, config, ask, deadline, journal, ttl, held).await
}

/// [`find`] for an endpoint the cache keeps.
async fn find_cached<H: Send + 'static>(
    app: &App,
    config: &CacheConfig,
    ask: &Ask<'_>,
    deadline: Deadline,
    journal: &mut Journal,
    ttl: Duration,
    held: H,
) -> (Result<Found, Unanswered>, H) {
    let endpoint = ask.call.endpoint();

    let key = Key::new(ask.platform, &ask.call, ask.issuer);
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
        let (providers, call, described, client) = (
            ask.providers.to_vec(),
            ask.call.clone(),
            ask.described.clone(),
            app.upstream.clone(),
        );
        async move {
            let mut journal = Journal::default();
            // No caller owns the fetch, so it holds nothing of its own:
            // the wait of the caller that started it holds that caller's
            // slot and credits until it lands.
            let job = Job {
                call: &call,
                described: &described,
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
                deadline,
                fetch(),
                held,
            )
            .await;
        // The fetch this request joined ran out of the time of the request
        // that started it, not of this one's: with time left, fetch again.
        // Bounded, though each round ends at a later deadline.
        let theirs_ran_out = collapsed
            && matches!(landing.outcome, Err(ChainError::DeadlineExceeded))
            && !deadline.expired();
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
                app.cache.forget_first_page(ask.platform, &ask.call, issuer);
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

/// `Cache-Status`, and `Age` for an answer from the cache. A data
/// answer's `Cache-Control` says how long it stays fresh here (`private`:
/// it was asked for with a key), but no longer than `reusable_for` seconds
/// from now (a page's next token); errors stay `no-store`. With `Age`,
/// that is counted from the fetch, as HTTP caches count it: they take `Age`
/// off `max-age`, so a hit's is its remaining time plus its age.
fn set_cache_headers(
    response: &mut Response<Body>,
    status: &CacheStatus,
    age: Option<Duration>,
    reusable_for: Option<u64>,
) {
    let data = matches!(response.status(), StatusCode::OK | StatusCode::NOT_MODIFIED);
    let headers = response.headers_mut();
    headers.insert(CACHE_STATUS, status.header_value());
    let age = age.map(|age| age.as_secs());
    if data {
        let fresh_for = match *status {
            CacheStatus::Fetched {
                forward: Forward::Bypass,
                ..
            } => None,
            CacheStatus::Fetched { stored, .. } => Some(stored.unwrap_or(0)),
            // Never on data.
            CacheStatus::NotStored => None,
            // Expired: to be revalidated at once.
            CacheStatus::StoodIn {
                forward: Forward::Stale,
                ..
            } => Some(0),
            // Stored and fresh: its time left, counted from the fetch.
            CacheStatus::Hit { ttl } | CacheStatus::StoodIn { ttl, .. } => {
                Some(ttl.max(0) as u64 + age.unwrap_or(0))
            }
        };
        let fresh_for = match (fresh_for, reusable_for) {
            (Some(secs), Some(limit)) => Some(secs.min(age.unwrap_or(0) + limit)),
            (fresh_for, _) => fresh_for,
        };
        let value = match fresh_for {
            Some(secs) => HeaderValue::try_from(format!("private, max-age={secs}")),
            None => Ok(HeaderValue::from_static("private, no-cache")),
        };
        if let Ok(value) = value {
            headers.insert(CACHE_CONTROL, value);
        }
    }
    if let Some(age) = age {
        headers.insert(AGE, HeaderValue::from(age));
    }
}

/// The listing a cursor belongs to: the same endpoint and subject.
pub(super) fn listing_of<'a>(platform: &'a str, call: &'a Call) -> Listing<'a> {
    Listing {
        platform,
        endpoint: call.endpoint().as_str(),
        subject: call.subject(),
    }
}

/// `Link: <...>; rel="next"` (RFC 8288) to the page after this one: the
/// same listing with `cursor` set to `token`. A reference relative to the
/// request's own origin (the `Host` a client sent is not to be trusted),
/// written from the request as checked: the subject, the page size and the
/// token, nothing else the client sent.
fn next_page_link(platform: &str, call: &Call, token: &str) -> Option<HeaderValue> {
    let endpoint = call.endpoint();
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair(endpoint.subject_param(), call.subject());
    if let Some(count) = call.count() {
        query.append_pair("count", itoa::Buffer::new().format(count));
    }
    query.append_pair("cursor", token);
    let link = format!(
        "</v1/{platform}/{}?{}>; rel=\"next\"",
        endpoint.as_str(),
        query.finish()
    );
    // Every part but the configured platform name is URL-encoded.
    HeaderValue::try_from(link).ok()
}
