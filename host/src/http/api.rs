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
    CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, ETAG, HOST, LINK, TRANSFER_ENCODING,
};
use hyper::http::uri::Scheme;
use hyper::{Method, Request, Response, StatusCode, Version};
use plugin_api::{Call, Endpoint};
use tracing::Instrument;

use super::answer::{self, Ask, Unanswered};
use super::encoding::{self, Precompressed};
use super::response::{self, Body};
use super::{cors, request_id};
use crate::billing::{NoCredit, Reservation, Source};
use crate::cache::freshness::Directives;
use crate::cache::status::{CacheStatus, Forward};
use crate::chain::Journal;
use crate::cursor::{Listing, Position};
use crate::error::{subject_param, ApiError};
use crate::logging::RequestLine;
use crate::metrics::{self, RouteLabels};
use crate::resilience::concurrency::InFlight;
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
    normalize_path(
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
    if response.status().is_client_error() && has_odd_transfer_coding(request.headers()) {
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
        id: &id,
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

/// Decodes the request path's percent-encoded unreserved characters
/// ([`decode_unreserved`]), so that every check, the route, the metrics
/// and the log see one spelling. Left as sent when the head is past a
/// limit: `414` and `431` measure the target as it came.
fn normalize_path(request: &mut Request<Incoming>, max_header_bytes: usize) {
    let uri = request.uri();
    if !uri.path().contains('%')
        || target_len(uri) > MAX_TARGET_BYTES
        || head_size(request) > max_header_bytes
    {
        return;
    }
    if let Some(decoded) = decode_unreserved(uri) {
        *request.uri_mut() = decoded;
    }
}

/// `uri` with the percent-encoded unreserved characters of its path
/// decoded and its other escapes' hex digits upper-case (RFC 3986,
/// 6.2.2): `/v1/%73hortvideo/%70rofile` is `/v1/shortvideo/profile`;
/// `%2F` stays what it is, not a `/`. `None` when nothing changes.
fn decode_unreserved(uri: &hyper::Uri) -> Option<hyper::Uri> {
    let bytes = uri.path().as_bytes();
    // Only ASCII escapes are rewritten, to ASCII: every other byte, a
    // UTF-8 sequence's included, is copied as it came.
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes[i] {
            b'%' => bytes
                .get(i + 1..i + 3)
                .and_then(|pair| crate::hex::byte_of(pair[0], pair[1])),
            _ => None,
        };
        match escaped {
            Some(b) if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') => {
                decoded.push(b);
                i += 3;
            }
            Some(_) => {
                // Two hex digits: upper-casing them is the whole rewrite.
                let (high, low) = (bytes[i + 1], bytes[i + 2]);
                decoded.extend_from_slice(&[
                    b'%',
                    high.to_ascii_uppercase(),
                    low.to_ascii_uppercase(),
                ]);
                i += 3;
            }
            None => {
                decoded.push(bytes[i]);
                i += 1;
            }
        }
    }
    if decoded == bytes {
        return None;
    }
    if let Some(query) = uri.query() {
        decoded.push(b'?');
        decoded.extend_from_slice(query.as_bytes());
    }
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(hyper::http::uri::PathAndQuery::try_from(decoded).ok()?);
    hyper::Uri::from_parts(parts).ok()
}

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
    if head_size(request) > app.process.listener.hardening.max_header_bytes {
        return Err(ApiError::HeadersTooLarge);
    }
    check_head(request)?;
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
    let credits = match reserved {
        Ok(reserved) => {
            if reserved.standing.is_some() {
                report.rate = reserved.standing;
            }
            report.remaining = reserved.balance;
            reserved.reservation
        }
        Err(refused) => {
            return Err(match refused {
                NoCredit::OutOfCredits(standing) => {
                    if standing.is_some() {
                        report.rate = standing;
                    }
                    ApiError::InsufficientCredits
                }
                NoCredit::Unavailable => ApiError::store_unavailable(),
                NoCredit::RateLimited(wait) => {
                    report.rate = Some(Standing::exhausted(wait));
                    ApiError::rate_limited(wait)
                }
            })
        }
    };

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
        credits,
    };
    let (found, Held { _slot, credits }) =
        answer::find(app, snapshot, ask, &mut report.journal, held).await;
    let found = match found {
        Ok(found) => found,
        Err(Unanswered { error, status, age }) => {
            report.cache = status;
            let mut response = response::error(&ApiError::unanswered(error, endpoint), id);
            if let Some(status) = status {
                set_cache_headers(&mut response, &status, age);
            }
            return Ok(response);
        }
    };
    let data = found.data();
    report.provider = Some(data.provider.clone());
    report.cache = Some(found.status);

    let next_cursor = endpoint.is_list().then(|| {
        data.next_cursor.as_ref().map(|upstream| {
            let position = Position {
                provider: data.provider.to_string(),
                upstream: upstream.clone(),
            };
            app.cursors.seal(listing_of(platform, &call), &position)
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
        if let Some(link) = next_page_link(platform, &call, token) {
            response.headers_mut().insert(LINK, link);
        }
    }
    set_cache_headers(&mut response, &found.status, age);
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
        Err(wait) => {
            report.rate = Some(Standing::exhausted(wait));
            Err(ApiError::rate_limited(wait))
        }
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
            cached_cost: billing.costs,
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
    if let (Some(limiter), Some(standing)) = (&snapshot.rate_limiter, report.rate) {
        headers.insert(RATELIMIT_POLICY, limiter.policy_header().clone());
        headers.insert(RATELIMIT, standing.header());
    }
}

/// The longest request target served (a `query` of 100 characters and a
/// cursor take a few hundred bytes); a longer one is `414`.
const MAX_TARGET_BYTES: usize = 8 * 1024;

/// What a head hyper has read may still get wrong (RFC 9112, 3.2 and 3.2.1):
/// a target in a form its method does not take (`GET healthz`, `GET *`),
/// an HTTP/1.1 request without exactly one `Host` (HTTP/2 names the host
/// in `:authority`; no request may name two), a `Host` that is no host
/// and port, a body framed in a way a proxy in front may read otherwise
/// ([`has_odd_transfer_coding`]). And a target longer than
/// [`MAX_TARGET_BYTES`].
fn check_head<B>(request: &Request<B>) -> Result<(), ApiError> {
    let uri = request.uri();
    let target = uri.path_and_query().map_or("", |pq| pq.as_str());
    let form_fits = match *request.method() {
        // Authority-form: refused for its method further on.
        Method::CONNECT => true,
        Method::OPTIONS if target == "*" => true,
        // Origin-form, or absolute-form (as a proxy would send it; every
        // HTTP/2 request has a scheme, and `*` as its `:path`) of an HTTP
        // URI: this server serves no other scheme (`ftp://...` is no
        // request for it).
        _ => {
            let http = |s: &Scheme| *s == Scheme::HTTP || *s == Scheme::HTTPS;
            target != "*"
                && match uri.scheme() {
                    Some(scheme) => http(scheme),
                    None => target.starts_with('/'),
                }
        }
    };
    // HTTP/2 names the host in `:authority` (RFC 9113, 8.3.1): a request
    // needs it or `Host`, and the two must agree. HTTP/1.1 needs `Host` (an
    // absolute-form target's authority wins over it: RFC 9112, 3.2.2).
    let h2 = request.version() == Version::HTTP_2;
    let authority = uri.authority().map(|a| a.as_str().as_bytes());
    let mut hosts = request.headers().get_all(HOST).iter();
    let host_fits = match (hosts.next(), hosts.next()) {
        (Some(host), None) => {
            is_host(host.as_bytes())
                && !(h2
                    && authority
                        .is_some_and(|a| !same_authority(a, host.as_bytes(), uri.scheme_str())))
        }
        (None, _) if h2 => authority.is_some(),
        (None, _) => request.version() != Version::HTTP_11,
        (Some(_), Some(_)) => false,
    };
    if !(form_fits && host_fits) || has_odd_transfer_coding(request.headers()) {
        return Err(ApiError::MalformedRequest);
    }
    if target_len(uri) > MAX_TARGET_BYTES {
        return Err(ApiError::UriTooLong);
    }
    Ok(())
}

/// Whether `host` names `authority`, compared as RFC 9113 (8.3.1) asks:
/// case aside, and the port `scheme` implies (`:443` for `https`, `:80`
/// otherwise) or an empty one the same as none.
fn same_authority(authority: &[u8], host: &[u8], scheme: Option<&str>) -> bool {
    let implied: &[u8] = match scheme {
        Some("https") => b":443",
        _ => b":80",
    };
    fn bare<'a>(name: &'a [u8], implied: &[u8]) -> &'a [u8] {
        let name = name.strip_suffix(implied).unwrap_or(name);
        name.strip_suffix(b":").unwrap_or(name)
    }
    bare(authority, implied).eq_ignore_ascii_case(bare(host, implied))
}

/// Whether `value` is a `Host` as RFC 9110 (7.2) writes one: a host name
/// (RFC 3986's reg-name) or an IP literal in brackets, and a port of
/// digits. RFC 9112 (3.2) wants any other refused with 400. An empty name
/// is refused too: an `http` URI with an empty host is invalid (RFC 9110,
/// 4.2.1).
fn is_host(value: &[u8]) -> bool {
    let (host, port) = match value.strip_prefix(b"[") {
        Some(rest) => match rest.iter().position(|&b| b == b']') {
            Some(end)
                if rest[..end]
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || b":.".contains(b)) =>
            {
                (&rest[..0], &rest[end + 1..])
            }
            _ => return false,
        },
        None => match value.iter().rposition(|&b| b == b':') {
            Some(colon) => (&value[..colon], &value[colon..]),
            None => (value, &value[..0]),
        },
    };
    let port_fits =
        port.is_empty() || (port[0] == b':' && port[1..].iter().all(u8::is_ascii_digit));
    port_fits
        && (value.starts_with(b"[") || !host.is_empty())
        && host
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%".contains(b))
}

/// A `Transfer-Encoding` other than one `chunked`: no request here has a
/// body, and one framed in a way a proxy in front may read otherwise
/// (`chunked, chunked`, `gzip, chunked`) is refused, its connection
/// closed ([`handle`]), so nothing after it on the connection is read as a
/// request.
fn has_odd_transfer_coding(headers: &HeaderMap) -> bool {
    let mut codings = headers.get_all(TRANSFER_ENCODING).iter();
    match (codings.next(), codings.next()) {
        (None, _) => false,
        (Some(only), None) => !only
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"chunked"),
        (Some(_), Some(_)) => true,
    }
}

/// The bytes of a request's target as sent in HTTP/1.1 (absolute-form
/// counts its authority).
fn target_len(uri: &hyper::Uri) -> usize {
    uri.path_and_query().map_or(0, |pq| pq.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len())
}

/// About the bytes of a request's head as sent in HTTP/1.1.
fn head_size<B>(request: &Request<B>) -> usize {
    let line = request.method().as_str().len() + target_len(request.uri()) + 12;
    request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
        + line
}

/// What a request holds while upstream work runs for it.
struct Held {
    _slot: InFlight,
    credits: Reservation,
}

/// `Cache-Status`, and `Age` for an answer from the cache. A data
/// answer's `Cache-Control` says how long it stays fresh here (`private`:
/// it was asked for with a key); errors stay `no-store`. With `Age`, that
/// is counted from the fetch, as HTTP caches count it: they take `Age` off
/// `max-age`, so a hit's is its remaining time plus its age.
fn set_cache_headers(response: &mut Response<Body>, status: &CacheStatus, age: Option<Duration>) {
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
    query.append_pair(subject_param(endpoint), call.subject());
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
        // them all out of the load balancer at once. Serve, and say so.
        if app
            .shared
            .as_ref()
            .is_some_and(|shared| !shared.is_healthy())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoded_unreserved_characters_in_the_path_are_decoded() {
        let decoded = |target: &str| {
            let uri: hyper::Uri = target.parse().expect("a target");
            decode_unreserved(&uri).map(|uri| uri.to_string())
        };
        assert_eq!(
            decoded("/v1/%73hortvideo/%70rofile?username=%6Cuna").as_deref(),
            Some("/v1/shortvideo/profile?username=%6Cuna"),
            "the path only: the query is form-decoded later"
        );
        assert_eq!(
            decoded("/%2d%2E%5f%7E%41%7a%30").as_deref(),
            Some("/-._~Az0")
        );
        assert_eq!(
            decoded("/v1/shortvideo%2fprofile").as_deref(),
            Some("/v1/shortvideo%2Fprofile"),
            "a reserved character stays escaped"
        );
        assert_eq!(decoded("/v1/a%2Fb"), None, "nothing to change");
        assert_eq!(decoded("/v1/shortvideo/profile"), None);
        assert_eq!(decoded("/%zz%4").as_deref(), None, "not escapes: kept");
        assert_eq!(decoded("/%e2%82%ac").as_deref(), Some("/%E2%82%AC"));
        assert_eq!(
            decoded("/\u{fc}%41").as_deref(),
            Some("/\u{fc}A"),
            "UTF-8 in the path is copied as it came"
        );
        assert_eq!(
            decoded("http://h:1/%70?q").as_deref(),
            Some("http://h:1/p?q"),
            "an absolute target keeps its scheme and authority"
        );
    }

    /// An HTTP/2 request head (no `Host`: `:authority` names the host).
    fn h2_head(method: Method, uri: hyper::Uri) -> Request<()> {
        Request::builder()
            .version(Version::HTTP_2)
            .method(method)
            .uri(uri)
            .body(())
            .expect("a request")
    }

    /// Hardening review, defect 3: every HTTP/2 request has a scheme, so
    /// the scheme alone must not let `*` through for a `GET`.
    #[test]
    fn an_asterisk_target_is_only_for_options_over_http2_too() {
        let star = || {
            hyper::Uri::builder()
                .scheme("http")
                .authority("a")
                .path_and_query("*")
                .build()
                .expect("a URI")
        };
        let get = h2_head(Method::GET, star());
        assert_eq!(check_head(&get), Err(ApiError::MalformedRequest));
        let options = h2_head(Method::OPTIONS, star());
        assert_eq!(check_head(&options), Ok(()));
        let path = hyper::Uri::from_static("http://a/healthz");
        assert_eq!(check_head(&h2_head(Method::GET, path)), Ok(()));
    }

    /// Black-box sweep: an absolute-form target of another scheme is no
    /// request for this server, over HTTP/1.1 as over HTTP/2.
    #[test]
    fn an_absolute_target_is_an_http_uri() {
        for (uri, fits) in [
            ("http://a/healthz", true),
            ("https://a/healthz", true),
            ("HTTP://a/healthz", true),
            ("ftp://a/healthz", false),
            ("gopher://a/healthz", false),
        ] {
            let uri: hyper::Uri = uri.parse().expect("a URI");
            let mut h1 = Request::builder()
                .method(Method::GET)
                .uri(uri.clone())
                .body(())
                .expect("a request");
            h1.headers_mut().insert(HOST, HeaderValue::from_static("a"));
            for request in [h1, h2_head(Method::GET, uri.clone())] {
                let expected = if fits {
                    Ok(())
                } else {
                    Err(ApiError::MalformedRequest)
                };
                assert_eq!(
                    check_head(&request),
                    expected,
                    "{uri} {:?}",
                    request.version()
                );
            }
        }
    }

    /// HTTP review, defect 6: an HTTP/2 request names its host in
    /// `:authority` or `Host`, and a `Host` beside `:authority` agrees.
    #[test]
    fn an_http2_request_names_one_host() {
        let with_host = |uri: &'static str, host: Option<&'static str>| {
            let mut request = h2_head(Method::GET, hyper::Uri::from_static(uri));
            if let Some(host) = host {
                request
                    .headers_mut()
                    .insert(HOST, HeaderValue::from_static(host));
            }
            check_head(&request)
        };
        assert_eq!(with_host("http://a:80/healthz", None), Ok(()));
        assert_eq!(with_host("http://a:80/healthz", Some("A:80")), Ok(()));
        assert_eq!(with_host("http://a:80/healthz", Some("a")), Ok(()));
        assert_eq!(with_host("https://a/healthz", Some("a:443")), Ok(()));
        assert_eq!(with_host("http://a:/healthz", Some("a")), Ok(()));
        assert_eq!(with_host("/healthz", Some("a:80")), Ok(()));
        for (uri, host) in [
            ("/healthz", None),
            ("http://a:80/healthz", Some("b:80")),
            ("http://a:8080/healthz", Some("a")),
            ("https://a/healthz", Some("a:80")),
            ("http://a:80/healthz", Some("")),
        ] {
            assert_eq!(
                with_host(uri, host),
                Err(ApiError::MalformedRequest),
                "{uri} {host:?}"
            );
        }
    }

    #[test]
    fn a_host_is_a_name_or_an_ip_literal_and_a_port() {
        for good in [
            "a",
            "api.example.com",
            "a:80",
            "a:",
            "127.0.0.1:8080",
            "[::1]",
            "[::1]:80",
            "xn--bcher-kva.de",
        ] {
            assert!(is_host(good.as_bytes()), "{good:?}");
        }
        for bad in [
            "a b", "x@y", "x/y", "[::1", "::1", "a:8x", "[::1]x", "a\tb", "x, y", "", ":80",
        ] {
            assert!(!is_host(bad.as_bytes()), "{bad:?}");
        }
    }
}
