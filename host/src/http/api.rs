//! One request, through its checks in a fixed order: `OPTIONS` and the
//! public paths first (`/healthz`, `/readyz`, `/v1/openapi.json`), then
//! overload, method, key, rate limit, platform, endpoint, parameters,
//! credits, and finally the failover chain. Each check answers from the
//! error catalogue; nothing after a failed check runs, so invalid input
//! never reaches an upstream.
//!
//! `HEAD` is `GET` without the body: it passes the same checks and costs
//! what the `GET` would. A data answer carries a strong `ETag` over its
//! data; a request whose `If-None-Match` matches it gets `304` and is not
//! charged, and one whose `If-Match` does not gets `412` and is not charged
//! either (`If-Match` is evaluated on every answer that would be a `2xx`).
//! Then every answer is represented for its caller: CORS headers
//! ([`super::cors`]), a content coding ([`super::encoding`]), no body for
//! `HEAD`.
//!
//! `GET /v1/account` answers right after the rate limit, with what the key
//! may read of its own account; it costs nothing.
//!
//! Every answer carries the request's ID, and every answer to a request
//! whose key was accepted says where the key stands: `X-Credits-Remaining`
//! when billing is enforced, `RateLimit-Policy` and `RateLimit` when a rate
//! limit is set. Every request ends in one log line and its metrics.

use std::borrow::Cow;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use hyper::header::{
    HeaderMap, HeaderName, HeaderValue, ACCEPT_ENCODING, AGE, CACHE_CONTROL, CONNECTION,
    CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, ETAG, LINK,
};
use hyper::{Method, Request, Response, StatusCode};
use plugin_api::{Call, Endpoint};
use tracing::Instrument;

use super::answer::{self, Ask, Found, Unanswered};
use super::encoding::{self, Precompressed};
use super::response::{self, Body};
use super::{cors, head, request_id};
use crate::billing::{NoCredit, Reservation, Reserved, Source};
use crate::cache::freshness::Directives;
use crate::cache::status::{CacheStatus, Forward};
use crate::chain::Journal;
use crate::cursor::{Listing, Position};
use crate::error::ApiError;
use crate::logging::RequestLine;
use crate::metrics::{self, RouteLabels};
use crate::resilience::concurrency::{InFlight, KeyInFlight};
use crate::resilience::deadline::Deadline;
use crate::resilience::rate_limit::{RateLimitConfig, Standing};
use crate::routing::{Chain, Provider};
use crate::state::{App, Snapshot};

const API_KEY_HEADER: HeaderName = HeaderName::from_static("x-api-key");
/// RFC 9211.
const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");
/// The key's balance after this answer's charge, when billing is enforced.
const CREDITS_REMAINING: HeaderName = HeaderName::from_static("x-credits-remaining");
/// draft-ietf-httpapi-ratelimit-headers.
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The path of a key's own account.
const ACCOUNT_PATH: &str = "/v1/account";
/// The OpenAPI document changes only with the binary: caches may keep it a
/// while, and revalidate with its `ETag`.
const DOCUMENT_CACHE_CONTROL: &str = "public, max-age=300";

/// What a request did, for its log line.
#[derive(Default)]
struct Report<'s> {
    /// The name (never the value) of the key that was accepted.
    key: Option<&'s str>,
    provider: Option<Arc<str>>,
    /// What the cache did, for data answers.
    cache: Option<CacheStatus>,
    journal: Journal,
    /// Where the key's rate-limit bucket stands, once checked.
    rate: Option<Standing>,
    /// The key's balance after the answer's charge, once charged.
    remaining: Option<u64>,
}

/// Answers one request; never fails, never panics out.
pub async fn handle(app: &App, mut request: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    head::normalize_path(
        &mut request,
        app.process.listener.hardening.max_header_bytes,
    );
    let id = request_id::accept_or_generate(request.headers().get(request_id::HEADER));
    let span = tracing::info_span!("request", id = %id);
    let mut report = Report::default();
    // One snapshot serves the whole request, its metrics labels included.
    let snapshot = app.snapshot();
    // Boxed as it is made: the wrappers move it, and it is a few KiB.
    let outcome = AssertUnwindSafe(Box::pin(route(app, &snapshot, &request, &id, &mut report)))
        .catch_unwind()
        .instrument(span.clone())
        .await;
    let mut response = match outcome {
        // RFC 9110, 13.2.1: a precondition counts for an answer that would
        // be a `2xx`, and never for `CONNECT`, `OPTIONS` or `TRACE`: here,
        // for what `GET` and `HEAD` select. A data answer evaluated its
        // `If-Match` before it was charged (see `route`); here it holds
        // again, and the other answers (`/v1/account`, the public paths)
        // are evaluated.
        Ok(Ok(response))
            if response.status().is_success()
                && matches!(*request.method(), Method::GET | Method::HEAD)
                && !encoding::if_match_holds(request.headers(), response.headers().get(ETAG)) =>
        {
            response::error(&ApiError::PreconditionFailed, &id)
        }
        Ok(Ok(response)) => response,
        Ok(Err(error)) => response::error(&error, &id),
        Err(_) => {
            span.in_scope(|| tracing::error!("request handler panicked"));
            response::error(&ApiError::Internal, &id)
        }
    };
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(request_id::HEADER, value);
    }
    if response.status().is_client_error() && head::has_odd_transfer_coding(request.headers()) {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(key) = report.key {
        set_standing_headers(app, &snapshot, key, &report, &mut response);
    }
    let path = request.uri().path();
    let response = represent(&snapshot, &request, path == OPENAPI_PATH, response);

    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    if !is_public(path) {
        let labels = match path {
            ACCOUNT_PATH => RouteLabels::ACCOUNT,
            _ => RouteLabels::of(&snapshot, path),
        };
        metrics::request(&labels, status, elapsed);
        for attempt in &report.journal.attempts {
            metrics::attempt(&attempt.provider, attempt.outcome, attempt.elapsed);
        }
        for from in report.journal.failovers() {
            metrics::failover(&labels, from);
        }
    }
    let line = RequestLine {
        method: request.method().as_str(),
        path,
        status,
        latency: elapsed,
        provider: report.provider.as_deref().unwrap_or("-"),
        cache: report.cache.as_ref().map_or("-", CacheStatus::log_value),
        attempts: report.journal.attempts.len(),
        key: report.key.unwrap_or("-"),
    };
    line.log(&span);
    response
}

/// The OpenAPI 3.1 description of this API, kept in the repository, in
/// every coding.
static OPENAPI: Precompressed = Precompressed::new(include_bytes!("../../../openapi/openapi.json"));
const OPENAPI_PATH: &str = "/v1/openapi.json";

fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | OPENAPI_PATH)
}

/// Marks a `200` answer whose validator the request's `If-None-Match`
/// matched: [`represent`] sends it as `304 Not Modified`, with the headers
/// the `200` would have had (its coding's `ETag`, `Vary`).
#[derive(Clone, Copy)]
struct NotModified;

/// The answer as its caller takes it: CORS headers, a content coding when
/// asked for and worth it, no body for `HEAD` (its `Content-Length` stays
/// what the `GET` would have), and a `304` for one marked [`NotModified`].
fn represent(
    snapshot: &Snapshot,
    request: &Request<Incoming>,
    public: bool,
    response: Response<Body>,
) -> Response<Body> {
    let (mut parts, body) = response.into_parts();
    cors::decorate(
        &snapshot.serving.cors,
        public,
        request.headers(),
        &mut parts.headers,
    );
    let head = *request.method() == Method::HEAD;
    let length = body.size_hint().exact().unwrap_or(0);
    let compressible = length >= encoding::MIN_COMPRESSED_BYTES as u64
        && !parts.headers.contains_key(CONTENT_ENCODING)
        && parts
            .headers
            .get(CONTENT_TYPE)
            .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if parts.extensions.remove::<NotModified>().is_some() {
        if compressible {
            encoding::mark_negotiated(request.headers(), &mut parts.headers);
        }
        // No body, and nothing that would describe one.
        parts.status = StatusCode::NOT_MODIFIED;
        for describes_the_body in [CONTENT_TYPE, CONTENT_LENGTH, CONTENT_ENCODING] {
            parts.headers.remove(describes_the_body);
        }
        return Response::from_parts(parts, Full::default());
    }
    if !compressible && !head {
        return Response::from_parts(parts, body);
    }
    // A `Full` body is one ready frame: collecting it does not wait.
    let Some(Ok(collected)) = body.collect().now_or_never() else {
        return Response::from_parts(parts, Full::default());
    };
    let mut bytes = collected.to_bytes();
    if compressible {
        if let Some(coding) = encoding::mark_negotiated(request.headers(), &mut parts.headers) {
            bytes = coding.encode(&bytes, true);
        }
    }
    if head {
        parts
            .headers
            .insert(CONTENT_LENGTH, HeaderValue::from(bytes.len()));
        return Response::from_parts(parts, Full::default());
    }
    Response::from_parts(parts, Full::new(bytes))
}

/// `/v1/openapi.json`: cacheable, with an `ETag`, in the coding asked for.
fn openapi_document(request: &HeaderMap) -> Response<Body> {
    static TAG: std::sync::LazyLock<HeaderValue> =
        std::sync::LazyLock::new(|| encoding::etag(&[OPENAPI.identity()]));
    let coding = encoding::negotiate(request.get_all(ACCEPT_ENCODING).iter());
    let mut response = response::json_response(StatusCode::OK, OPENAPI.get(coding));
    let headers = response.headers_mut();
    encoding::vary_on_encoding(headers);
    headers.insert(ETAG, TAG.clone());
    if let Some(coding) = coding {
        encoding::mark_encoded(headers, coding);
    }
    headers.insert(
        CACHE_CONTROL,
        HeaderValue::from_static(DOCUMENT_CACHE_CONTROL),
    );
    if encoding::not_modified(request, &TAG) {
        response.extensions_mut().insert(NotModified);
    }
    response
}

async fn route<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    request: &Request<Incoming>,
    id: &str,
    report: &mut Report<'s>,
) -> Result<Response<Body>, ApiError> {
    let path = request.uri().path();
    let method = request.method();
    // hyper refuses most HTTP/1 heads over the limit itself (see
    // `refusal`), but not one that arrives whole in a read buffer grown by
    // earlier requests; HTTP/2 heads are measured only here (hyper's limit
    // for them is above this one: `server::H2_HEADER_LIST_MARGIN`).
    if head::head_size(request) > app.process.listener.hardening.max_header_bytes {
        return Err(ApiError::HeadersTooLarge);
    }
    head::check_head(request)?;
    // `OPTIONS` (and a browser's preflight, which carries no key) is
    // answered on every path, before anything is spent on it.
    if *method == Method::OPTIONS {
        return Ok(response::options());
    }
    let reads = matches!(*method, Method::GET | Method::HEAD);

    if is_public(path) {
        if !reads {
            return Err(ApiError::MethodNotAllowed);
        }
        return Ok(match path {
            "/healthz" => response::plain_json(StatusCode::OK, r#"{"status":"ok"}"#),
            "/readyz" => readiness(app, snapshot),
            _ => openapi_document(request.headers()),
        });
    }
    // Held until the answer is built, or while the upstream work of an
    // abandoned request runs; past the limit, refuse at once.
    let slot = app.in_flight.try_enter().ok_or_else(ApiError::overloaded)?;
    if !reads {
        return Err(ApiError::MethodNotAllowed);
    }

    let key = authenticate(snapshot, request)?;
    report.key = Some(key);
    let billing = snapshot.serving.billing;
    // With shared books and billing enforced, the rate limit is taken in
    // the same round trip as the credit, or, for a request refused before
    // it reaches its credit, just before answering that: the same answers
    // in the same order, for one round trip in the common case.
    let deferred_limit = match &snapshot.rate_limiter {
        Some(limiter) if app.shared.is_some() && app.billing.checks_rate_limit(billing) => {
            Some(limiter.config())
        }
        Some(limiter) => {
            let verdict = match &app.shared {
                None => limiter.check(key, tokio::time::Instant::now()).map(Some),
                // Boxed: the local path's future stays as small as it was.
                Some(shared) => Box::pin(shared.rate_limit(key, limiter.config())).await,
            };
            take_verdict(verdict, report)?;
            None
        }
        None => None,
    };
    // After the rate limit: every request with a key takes a token, this
    // refusal's included, so `[rate_limit]` bounds how often a key may ask
    // whatever the answer.
    let key_slot = match snapshot.serving.max_concurrent_requests_per_key {
        None => None,
        Some(max) => match app.in_flight_by_key.try_enter(key, max) {
            Some(slot) => Some(slot),
            None => {
                metrics::key_busy();
                take_deferred_limit(app, key, deferred_limit, report).await?;
                return Err(ApiError::KeyBusy { max });
            }
        },
    };
    if path == ACCOUNT_PATH {
        take_deferred_limit(app, key, deferred_limit, report).await?;
        return account(app, snapshot, key, id).await;
    }

    let parsed = match parse(app, snapshot, request) {
        Ok(parsed) => parsed,
        Err(error) => {
            take_deferred_limit(app, key, deferred_limit, report).await?;
            return Err(error);
        }
    };
    let Parsed {
        platform,
        endpoint,
        call,
        providers,
        issuer,
    } = parsed;

    let directives = Directives::parse(
        request
            .headers()
            .get_all(CACHE_CONTROL)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    // Held before any upstream call, refunded unless the answer is
    // delivered: what an answer from where this one may come can cost.
    // `only-if-cached` with `no-cache` can only end in `504 NOT_CACHED`,
    // as where the cache is off.
    let stored_may_answer = snapshot.serving.cache.ttl(endpoint).is_some()
        && !(directives.only_if_cached && directives.refuses_every_stored());
    let source = Source::of(stored_may_answer, directives.only_if_cached);
    let reserved = app
        .billing
        .reserve_for(key, endpoint, source, billing, deferred_limit)
        .await;
    let credits = take_reservation(reserved, report)?;

    let ask = Ask {
        platform,
        call: &call,
        providers,
        issuer,
        directives,
        deadline: Deadline::after(snapshot.serving.request_timeout),
    };
    // Whoever runs the upstream work holds the slot and the credits: if
    // the caller hangs up, they are released only when that work ends, and
    // the credits refunded (nothing was delivered).
    let held = Held {
        _slot: slot,
        _key_slot: key_slot,
        credits,
    };
    let (
        found,
        Held {
            _slot,
            _key_slot,
            credits,
        },
    ) = answer::find(app, snapshot, ask, &mut report.journal, held).await;
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
    deliver(
        app,
        request,
        Delivery {
            platform,
            call: &call,
            found,
            credits,
        },
        report,
        id,
    )
}

/// The held credits, and where the key stands, in the report; or the
/// refusal the reservation came back with.
fn take_reservation(
    reserved: Result<Reserved, NoCredit>,
    report: &mut Report<'_>,
) -> Result<Reservation, ApiError> {
    match reserved {
        Ok(reserved) => {
            if reserved.standing.is_some() {
                report.rate = reserved.standing;
            }
            report.remaining = reserved.balance;
            Ok(reserved.reservation)
        }
        Err(NoCredit::OutOfCredits(standing)) => {
            if standing.is_some() {
                report.rate = standing;
            }
            Err(ApiError::InsufficientCredits)
        }
        Err(NoCredit::Unavailable) => Err(ApiError::store_unavailable()),
        Err(NoCredit::RateLimited(wait)) => Err(rate_limited(wait, report)),
    }
}

/// A request refused by its key's rate limit, `wait` before a token is
/// there: the empty bucket in the report (its `RateLimit` header), and the
/// `429`.
fn rate_limited(wait: Duration, report: &mut Report<'_>) -> ApiError {
    report.rate = Some(Standing::exhausted(wait));
    ApiError::rate_limited(wait)
}

/// A data answer found for a request, and the credits held for it.
struct Delivery<'a> {
    platform: &'a str,
    call: &'a Call,
    found: Found,
    credits: Reservation,
}

/// The answer to a request that found data: its next page's cursor
/// sealed, its `ETag`, then the preconditions (`If-Match`, then
/// `If-None-Match`), the charge (none for a `304`, whose reservation is
/// refunded), and its headers.
fn deliver(
    app: &App,
    request: &Request<Incoming>,
    delivery: Delivery<'_>,
    report: &mut Report<'_>,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    let Delivery {
        platform,
        call,
        found,
        credits,
    } = delivery;
    let endpoint = call.endpoint();
    let data = found.data();
    report.provider = Some(data.provider.clone());
    report.cache = Some(found.status);

    let next_cursor = endpoint.is_list().then(|| {
        data.next_cursor.as_ref().map(|upstream| {
            let position = Position {
                provider: data.provider.to_string(),
                upstream: upstream.clone(),
            };
            app.cursors.seal(listing_of(platform, call), &position)
        })
    });
    // The tag covers what the answer says (its data, and where its next
    // page starts, while its token lasts), not `meta`'s per-request facts.
    let etag = match &data.next_cursor {
        None => encoding::etag(&[platform.as_bytes(), &data.json]),
        Some(position) => {
            let epoch = app.cursors.tag_epoch();
            encoding::etag(&[platform.as_bytes(), &data.json, position.as_bytes(), &epoch])
        }
    };
    // `If-Match` first (RFC 9110, 13.2.2), and before the charge: a `412`
    // delivers nothing, and the dropped reservation is refunded.
    if !encoding::if_match_holds(request.headers(), Some(&etag)) {
        return Err(ApiError::PreconditionFailed);
    }
    let (age, cached) = (found.age, found.age.is_some());
    let not_modified = encoding::not_modified(request.headers(), &etag);
    let credits_used = if not_modified {
        // Nothing is delivered: the reservation is refunded when dropped.
        drop(credits);
        0
    } else {
        let charge = credits.commit(cached);
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

/// A rate limiter's verdict: where the bucket stands, in the report (none
/// when the shared store could not say: it failed open), or a refusal.
fn take_verdict(
    verdict: Result<Option<Standing>, Duration>,
    report: &mut Report<'_>,
) -> Result<(), ApiError> {
    match verdict {
        Ok(standing) => {
            report.rate = standing;
            Ok(())
        }
        Err(wait) => Err(rate_limited(wait, report)),
    }
}

/// Takes the token a request left for its reservation to take, when it
/// will not reach one (refused before, or the account).
async fn take_deferred_limit(
    app: &App,
    key: &str,
    deferred: Option<RateLimitConfig>,
    report: &mut Report<'_>,
) -> Result<(), ApiError> {
    if let (Some(config), Some(shared)) = (deferred, &app.shared) {
        take_verdict(Box::pin(shared.rate_limit(key, config)).await, report)?;
    }
    Ok(())
}

/// A request's platform, endpoint and parameters, as checked.
struct Parsed<'a> {
    platform: &'a str,
    endpoint: plugin_api::Endpoint,
    call: Arc<Call>,
    /// The providers to ask, in order.
    providers: &'a [Arc<Provider>],
    /// For a later page: the provider whose cursor the call continues.
    issuer: Option<&'a str>,
}

/// The checks between the rate limit and the credits: platform, endpoint,
/// parameters, then the cursor.
fn parse<'a>(
    app: &App,
    snapshot: &'a Snapshot,
    request: &'a Request<Incoming>,
) -> Result<Parsed<'a>, ApiError> {
    let path = request.uri().path();
    let (platform, endpoint) = match path.strip_prefix("/v1/").map(|rest| rest.split_once('/')) {
        Some(Some((platform, endpoint))) => (platform, endpoint),
        Some(None) => {
            // `/v1/{platform}` alone: an unknown platform is still named.
            let platform = &path["/v1/".len()..];
            if !platform.is_empty() {
                snapshot.routes.live(platform)?;
            }
            return Err(ApiError::EndpointNotFound);
        }
        None => return Err(ApiError::EndpointNotFound),
    };
    let (endpoint, chain) = snapshot.routes.route(platform, endpoint)?;

    let params = query_params(request.uri().query().unwrap_or(""), endpoint)?;
    let mut call = Call::from_params(
        endpoint,
        params.iter().map(|(k, v)| (k.as_ref(), v.as_ref())),
    )
    .map_err(ApiError::from)?;
    let token = params
        .iter()
        .find(|(k, v)| k == "cursor" && !v.is_empty())
        .map(|(_, v)| v.as_ref());
    let (providers, issuer) = match token {
        Some(token) if endpoint.is_list() => {
            let (issuer, continued) = resume(app, chain, platform, &call, token)?;
            call = continued;
            (issuer, Some(&*issuer[0].name))
        }
        _ => (&chain[..], None),
    };
    Ok(Parsed {
        platform,
        endpoint,
        call: Arc::new(call),
        providers,
        issuer,
    })
}

/// A query parameter's name and value, decoded.
type Param<'a> = (Cow<'a, str>, Cow<'a, str>);

/// The query's name/value pairs, decoded as an HTML form's are (`+` is a
/// space, `%XX` a byte). A parameter the endpoint reads whose value is not
/// UTF-8 once decoded is refused: patched with U+FFFD, as form decoding
/// does, two different inputs would read (and be cached and charged) as
/// one. Any other parameter is ignored, so its value may be anything.
fn query_params(query: &str, endpoint: Endpoint) -> Result<Vec<Param<'_>>, ApiError> {
    let mut params = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        // A name that is not UTF-8 is no name an endpoint reads.
        let name = form_decoded(name).unwrap_or_else(|text| text);
        let value = match form_decoded(value) {
            Ok(value) => value,
            Err(_) if endpoint.reads(&name) => {
                return Err(ApiError::invalid(
                    &name,
                    "is not UTF-8 once percent-decoded",
                ))
            }
            Err(patched) => patched,
        };
        params.push((name, value));
    }
    Ok(params)
}

/// One form-encoded name or value, decoded; what is not UTF-8 comes back
/// as the error, patched with U+FFFD.
fn form_decoded(text: &str) -> Result<Cow<'_, str>, Cow<'_, str>> {
    fn decode(text: &str) -> Result<Cow<'_, str>, Cow<'_, str>> {
        let bytes = percent_encoding::percent_decode_str(text);
        bytes
            .clone()
            .decode_utf8()
            .map_err(|_| bytes.decode_utf8_lossy())
    }
    if !text.contains('+') {
        return decode(text);
    }
    let spaced = text.replace('+', " ");
    let owned = |text: Cow<'_, str>| Cow::Owned(text.into_owned());
    decode(&spaced).map(owned).map_err(owned)
}

/// `GET /v1/account`: the key's balance, usage, costs and rate limit (with
/// shared books, read from the store: one round trip).
async fn account(
    app: &App,
    snapshot: &Snapshot,
    key: &str,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    let billing = snapshot.serving.billing;
    let statement = match Box::pin(app.billing.shared_statement(key, billing)).await {
        None => app.billing.statement(key, billing),
        Some(Ok(statement)) => statement,
        Some(Err(_)) => return Err(ApiError::store_unavailable()),
    };
    Ok(response::account(
        &response::Account {
            name: key,
            credits_remaining: statement.remaining,
            credits_used_today: statement.used_today,
            credits_used_total: statement.used_total,
            billing_enforced: billing.enforce,
            costs: billing.costs,
            cached_cost: billing.costs.cached_override(),
            rate_limit: snapshot.serving.rate_limit,
        },
        id,
    ))
}

/// `X-Credits-Remaining` when billing is enforced, `RateLimit-Policy` and
/// `RateLimit` when a rate limit is set, on an answer to `key`.
fn set_standing_headers(
    app: &App,
    snapshot: &Snapshot,
    key: &str,
    report: &Report<'_>,
    response: &mut Response<Body>,
) {
    let headers = response.headers_mut();
    let billing = snapshot.serving.billing;
    if billing.enforce {
        // A charged answer knows its balance; any other was charged nothing.
        let remaining = report
            .remaining
            .unwrap_or_else(|| app.billing.remaining(key, billing));
        headers.insert(CREDITS_REMAINING, HeaderValue::from(remaining));
    }
    // The policy is the config's, always said; where the bucket stands is
    // not known when the shared store could not say (the limit failed
    // open), and then left out.
    if let Some(limiter) = &snapshot.rate_limiter {
        headers.insert(RATELIMIT_POLICY, limiter.policy_header().clone());
        if let Some(standing) = report.rate {
            headers.insert(RATELIMIT, standing.header());
        }
    }
}

/// What a request holds while upstream work runs for it.
struct Held {
    _slot: InFlight,
    _key_slot: Option<KeyInFlight>,
    credits: Reservation,
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

/// Opens a caller's cursor: the provider that issued it (only it can
/// continue the listing, since upstream cursors do not transfer) and the
/// call continuing from its upstream cursor.
fn resume<'c>(
    app: &App,
    chain: &'c Chain,
    platform: &str,
    call: &Call,
    token: &str,
) -> Result<(&'c [Arc<Provider>], Call), ApiError> {
    let Position { provider, upstream } = app
        .cursors
        .open(listing_of(platform, call), token)
        .map_err(ApiError::from)?;
    // If the operator has since removed the issuer from this chain, the
    // token is dead.
    let issuer = chain
        .iter()
        .find(|p| *p.name == *provider)
        .ok_or_else(ApiError::expired_cursor)?;
    Ok((
        std::slice::from_ref(issuer),
        call.clone().with_cursor(Some(upstream)),
    ))
}

/// The listing a cursor belongs to: the same endpoint and subject.
fn listing_of<'a>(platform: &'a str, call: &'a Call) -> Listing<'a> {
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

/// Ready when serving from a valid configuration in which every live
/// platform has a provider for at least one endpoint, with the keys the
/// keys file holds (not while it cannot be read or parsed); not while
/// draining.
fn readiness(app: &App, snapshot: &Snapshot) -> Response<Body> {
    if app.is_draining() {
        return response::plain_json(StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"draining"}"#);
    }
    let every_live_platform_served = snapshot
        .routes
        .live_platforms()
        .all(|platform| snapshot.routes.serves_anything(platform));
    if every_live_platform_served && snapshot.keys_are_current() {
        // Every replica shares a Redis outage: failing readiness would take
        // them all out of the load balancer at once. Serve, and say so; a
        // provider quarantined for a stuck plugin call likewise (its
        // chains fail over, and a restart would not mend the plugin).
        let quarantined = || {
            snapshot
                .routes
                .providers()
                .any(|provider| provider.runner.is_quarantined())
        };
        if app
            .shared
            .as_ref()
            .is_some_and(|shared| !shared.is_healthy())
            || quarantined()
        {
            return response::plain_json(StatusCode::OK, r#"{"status":"degraded"}"#);
        }
        response::plain_json(StatusCode::OK, r#"{"status":"ready"}"#)
    } else {
        response::plain_json(StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"not_ready"}"#)
    }
}

/// The name of the presented key.
fn authenticate<'s>(
    snapshot: &'s Snapshot,
    request: &Request<Incoming>,
) -> Result<&'s str, ApiError> {
    let mut sent = request.headers().get_all(API_KEY_HEADER).iter();
    let presented = sent.next();
    if sent.next().is_some() {
        return Err(ApiError::repeated_api_key());
    }
    let presented = presented
        .filter(|v| !v.is_empty())
        .ok_or(ApiError::MissingApiKey)?;
    snapshot
        .keys
        .verify(presented.as_bytes())
        .ok_or(ApiError::InvalidApiKey)
}
