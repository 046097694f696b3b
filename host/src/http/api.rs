//! One request, from its head to its answer: [`handle`] runs admission
//! (the gates below, in order), then the answer ([`answer`]), then its
//! representation ([`encoding::represent`]), and ends in one log line and
//! its metrics.
//!
//! Admission is one ordered list of gates, each a small function that
//! returns what it took or the refusal: the head (`head::check`);
//! `OPTIONS` and the public paths (`/healthz`, `/readyz`,
//! `/v1/openapi.json`); overload; method; key; rate limit; the key's slot;
//! `/v1/account`, or the platform, endpoint and parameters; credits. The
//! first refusal is the answer, so invalid input never reaches an
//! upstream. What the gates took is one [`Admitted`], moved by value into
//! the fetch: dropped, on whatever exit, it gives everything back.
//!
//! `HEAD` is `GET` without the body: it passes the same checks and costs
//! what the `GET` would. A data answer carries a strong `ETag` over its
//! data; a request whose `If-None-Match` matches it gets `304` and is not
//! charged, and one whose `If-Match` does not gets `412` and is not charged
//! either (`If-Match` is evaluated on every answer that would be a `2xx`),
//! unless its `Cache-Control` had the answer fetched anew.
//!
//! `GET /v1/account` answers right after the key's slot, with what the key
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
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONNECTION, ETAG};
use hyper::{Method, Request, Response, StatusCode};
use plugin_api::Call;
use tracing::Instrument;

use super::answer::{self, listing_of, Admitted, Ask, Report};
use super::encoding;
use super::response::{self, Body};
use super::{head, request_id};
use crate::billing::{NoCredit, Reservation, Source};
use crate::cache::freshness::Directives;
use crate::cache::status::CacheStatus;
use crate::cursor::{Position, Trail};
use crate::error::ApiError;
use crate::logging::RequestLine;
use crate::metrics::{self, RouteLabels};
use crate::resilience::concurrency::KeyInFlight;
use crate::resilience::rate_limit::{RateLimitConfig, RateLimiter, Standing};
use crate::routing::{Chain, Provider};
use crate::state::{App, Snapshot};

const API_KEY_HEADER: HeaderName = HeaderName::from_static("x-api-key");
/// The key's balance after this answer's charge, when billing is enforced.
const CREDITS_REMAINING: HeaderName = HeaderName::from_static("x-credits-remaining");
/// draft-ietf-httpapi-ratelimit-headers.
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The path of a key's own account.
const ACCOUNT_PATH: &str = "/v1/account";

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
        // `If-Match` before it was charged (see [`answer::answer`]); here it holds
        // again, and the other answers (`/v1/account`, the public paths)
        // are evaluated.
        Ok(Ok(response))
            if response.status().is_success()
                && reads(request.method())
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
    let cors = &snapshot.serving.cors;
    let response = encoding::represent(cors, &request, path == OPENAPI_PATH, response);

    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    if !is_public(path) {
        let labels = match path {
            ACCOUNT_PATH => RouteLabels::ACCOUNT,
            _ => RouteLabels::of(&snapshot.serving.platforms, path),
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

/// The API document ([`super::openapi`]).
const OPENAPI_PATH: &str = "/v1/openapi.json";

fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | OPENAPI_PATH)
}

/// Admission: the gates, in the order of the module doc, then the answer.
async fn route<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    request: &'s Request<Incoming>,
    id: &str,
    report: &mut Report<'s>,
) -> Result<Response<Body>, ApiError> {
    head::check(request, app.process.listener.hardening.max_header_bytes)?;
    if let Some(answer) = unkeyed(app, snapshot, request)? {
        return Ok(answer);
    }
    // Held until the answer is built, or while the upstream work of an
    // abandoned request runs; past the limit, refuse at once.
    let slot = app.in_flight.try_enter().ok_or_else(ApiError::overloaded)?;
    if !reads(request.method()) {
        return Err(ApiError::MethodNotAllowed);
    }
    let key = authenticate(snapshot, request)?;
    report.key = Some(key);
    let owed = rate_limit(app, snapshot, key, report).await?;
    let key_slot = key_slot(app, snapshot, key);
    let parsed = match key_slot {
        Ok(_) if request.uri().path() != ACCOUNT_PATH => Some(parse(app, snapshot, request)),
        _ => None,
    };
    // A request that will not reach its credits takes the token it owes
    // now, before the refusal or the account: a refusal of the rate limit
    // comes first, as it would have without the deferral.
    if let (Some(limiter), false) = (owed, matches!(parsed, Some(Ok(_)))) {
        take_token(app, limiter, key, report).await?;
    }
    let places = (slot, key_slot?);
    let Some(parsed) = parsed else {
        return account(app, snapshot, key, id).await;
    };
    let ask = parsed?;
    let owed = owed.map(RateLimiter::config);
    let credits = credits(app, snapshot, key, &ask, owed, report).await?;
    let admitted = Admitted {
        _places: places,
        credits,
    };
    answer::answer(app, snapshot, request.headers(), ask, admitted, report, id).await
}

fn reads(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD)
}

/// `OPTIONS` on every path (a browser's preflight carries no key) and the
/// public paths: answered before anything is spent on them.
fn unkeyed(
    app: &App,
    snapshot: &Snapshot,
    request: &Request<Incoming>,
) -> Result<Option<Response<Body>>, ApiError> {
    let path = request.uri().path();
    if *request.method() == Method::OPTIONS {
        return Ok(Some(response::options()));
    }
    if !is_public(path) {
        return Ok(None);
    }
    if !reads(request.method()) {
        return Err(ApiError::MethodNotAllowed);
    }
    Ok(Some(match path {
        "/healthz" => response::plain_json(StatusCode::OK, r#"{"status":"ok"}"#),
        "/readyz" => readiness(app, snapshot),
        _ => snapshot.document.answer(request.headers()),
    }))
}

/// The key's rate limit: a token taken now, or owed (its limiter comes
/// back). With shared books and billing enforced, the credits take it in
/// the same round trip, or [`take_token`] does for a request that will not
/// reach them: the same answers in the same order, for one round trip in
/// the common case.
async fn rate_limit<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    key: &str,
    report: &mut Report<'_>,
) -> Result<Option<&'s RateLimiter>, ApiError> {
    let Some(limiter) = snapshot.rate_limiter.as_deref() else {
        return Ok(None);
    };
    if app.shared.is_some() && app.billing.checks_rate_limit(snapshot.serving.billing) {
        return Ok(Some(limiter));
    }
    take_token(app, limiter, key, report).await.map(|()| None)
}

/// Takes a token of `key`'s bucket, here or in the shared store: where the
/// bucket stands goes in the report (nothing when the store could not say:
/// the limit failed open), or the refusal comes back.
async fn take_token(
    app: &App,
    limiter: &RateLimiter,
    key: &str,
    report: &mut Report<'_>,
) -> Result<(), ApiError> {
    let verdict = match &app.shared {
        None => limiter.check(key, tokio::time::Instant::now()).map(Some),
        // Boxed: the local path's future stays as small as it was.
        Some(shared) => Box::pin(crate::shared::limits::take(shared, key, limiter.config())).await,
    };
    match verdict {
        Ok(standing) => {
            report.rate = standing;
            Ok(())
        }
        Err(wait) => Err(rate_limited(wait, report)),
    }
}

/// A place among the key's requests in flight, when they are limited.
/// After the rate limit: every request with a key takes a token, this
/// refusal's included, so `[rate_limit]` bounds how often a key may ask
/// whatever the answer.
fn key_slot(app: &App, snapshot: &Snapshot, key: &str) -> Result<Option<KeyInFlight>, ApiError> {
    let Some(max) = snapshot.serving.max_concurrent_requests_per_key else {
        return Ok(None);
    };
    let slot = app.in_flight_by_key.try_enter(key, max).ok_or_else(|| {
        metrics::key_busy();
        ApiError::KeyBusy { max }
    })?;
    Ok(Some(slot))
}

/// The credits held for the answer, and where the key stands, in the
/// report: what an answer from where this one may come can cost, refunded
/// unless it is delivered. `only-if-cached` with `no-cache` can only end
/// in `504 NOT_CACHED`, as where the cache is off.
async fn credits(
    app: &App,
    snapshot: &Snapshot,
    key: &str,
    ask: &Ask<'_>,
    owed: Option<RateLimitConfig>,
    report: &mut Report<'_>,
) -> Result<Reservation, ApiError> {
    let (endpoint, directives) = (ask.call.endpoint(), ask.directives);
    let stored_may_answer = snapshot
        .serving
        .cache
        .ttl(endpoint, ask.described.cache_ttl())
        .is_some()
        && !(directives.only_if_cached && directives.refuses_every_stored());
    let source = Source::of(stored_may_answer, directives.only_if_cached);
    let billing = snapshot.serving.billing;
    match app
        .billing
        .reserve_for(key, endpoint, source, billing, owed)
        .await
    {
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

/// What the request asks: platform, endpoint, parameters, then the cursor
/// (and the cache directives, which refuse nothing).
fn parse<'a>(
    app: &App,
    snapshot: &'a Snapshot,
    request: &'a Request<Incoming>,
) -> Result<Ask<'a>, ApiError> {
    let path = request.uri().path();
    let (platform, endpoint) = match path.strip_prefix("/v1/").map(|rest| rest.split_once('/')) {
        Some(Some((platform, endpoint))) => (platform, endpoint),
        Some(None) => {
            // `/v1/{platform}` alone: an unknown platform is still named.
            let platform = &path["/v1/".len()..];
            if !platform.is_empty() {
                snapshot.routes.check_live(platform)?;
            }
            return Err(ApiError::EndpointNotFound);
        }
        None => return Err(ApiError::EndpointNotFound),
    };
    let route = snapshot.routes.route(platform, endpoint)?;
    let (chain, described) = (route.chain, route.described.get());

    let params = query_params(request.uri().query().unwrap_or(""), described)?;
    let asked = described
        .validate(params.iter().map(|(k, v)| (k.as_ref(), v.as_ref())))
        .map_err(ApiError::from)?;
    let mut call = crate::routing::call_1x(route.endpoint, &asked);
    let token = described.cursor().and_then(|cursor| {
        params
            .iter()
            .find(|(k, v)| k == cursor.name() && !v.is_empty())
            .map(|(_, v)| v.as_ref())
    });
    let (providers, issuer, trail) = match token {
        Some(token) => {
            let (issuer, continued, trail) = resume(app, chain, platform, &call, token)?;
            call = continued;
            (issuer, Some(&*issuer[0].name), trail)
        }
        _ => (&chain[..], None, Trail::default()),
    };
    let directives = Directives::parse(
        request
            .headers()
            .get_all(CACHE_CONTROL)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    Ok(Ask {
        platform,
        described: route.described,
        call: Arc::new(call),
        providers,
        issuer,
        trail,
        directives,
    })
}

/// A query parameter's name and value, decoded.
type Param<'a> = (Cow<'a, str>, Cow<'a, str>);

/// The query's name/value pairs, decoded as an HTML form's are (`+` is a
/// space, `%XX` a byte). A parameter the endpoint reads whose value is not
/// UTF-8 once decoded is refused: patched with U+FFFD, as form decoding
/// does, two different inputs would read (and be cached and charged) as
/// one. Any other parameter is ignored, so its value may be anything.
fn query_params<'q>(
    query: &'q str,
    endpoint: &platform_description::Endpoint,
) -> Result<Vec<Param<'q>>, ApiError> {
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
        headers.insert(RATELIMIT_POLICY, limiter.policy_header());
        if let Some(standing) = report.rate {
            headers.insert(RATELIMIT, standing.header());
        }
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
) -> Result<(&'c [Arc<Provider>], Call, Trail), ApiError> {
    let Position {
        provider,
        upstream,
        trail,
    } = app
        .cursors
        .open(listing_of(platform, call), token)
        .map_err(ApiError::from)?;
    // If the operator has since removed the issuer from this chain, the
    // token is dead.
    let issuer = chain
        .iter()
        .find(|p| *p.name == *provider)
        .ok_or_else(ApiError::expired_cursor)?;
    let trail = trail.at(&upstream);
    Ok((
        std::slice::from_ref(issuer),
        call.clone().with_cursor(Some(upstream)),
        trail,
    ))
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
    } else if !snapshot.keys_are_current() {
        response::plain_json(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"status":"not_ready","reason":"keys_file_unusable"}"#,
        )
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
