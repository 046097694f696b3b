//! The circuit breaker per provider, with short cooldowns: it opens after
//! `breaker_failures` consecutive failures, and while open the provider's
//! upstream receives nothing and the fallback answers; after the cooldown
//! exactly one probe reaches it, and a successful probe closes it. A 429
//! opens it at once, for its `Retry-After` (a second without one);
//! a 401 counts as a failure, "not found" does not. A probe whose caller
//! hangs up still ends, and counts, as a failed probe. When every provider
//! of a chain is open, the one whose cooldown ends first is still tried, by
//! one request at a time while the others are answered at once, at most
//! once a second, and never a provider whose 429 asked for more time.

use std::time::{Duration, Instant};

use socialgate_tests::config::{FALLBACK, PRIMARY};
use socialgate_tests::operator::log_line_within;
use socialgate_tests::raw_upstream::{Behaviour, RawUpstream};
use socialgate_tests::upstream::{
    assert_answered_by, fixtures, FALLBACK_FOLLOWERS, LUNA, PRIMARY_FOLLOWERS,
};
use socialgate_tests::{eventually, Stack};
use wiremock::ResponseTemplate;

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";
const GHOST: &str = "/v1/shortvideo/profile?username=ghost";

/// A cooldown no test waits out.
const LONG_COOLDOWN_MS: u64 = 60_000;

/// A cooldown tests do wait out: long enough that a debug build on a busy
/// two-core machine makes its next requests well inside it.
const SHORT_COOLDOWN_MS: u64 = 2000;

/// Requests for P1 the primary's double received.
async fn primary_p1(stack: &Stack) -> usize {
    stack.primary.requests_to("/v1/user/profile").await.len()
}

/// Requests for P1 of `ghost` the primary's double received.
async fn ghost_requests(stack: &Stack) -> usize {
    stack
        .primary
        .requests()
        .await
        .iter()
        .filter(|r| r.url.query() == Some("unique_id=ghost"))
        .count()
}

/// The primary answers P1 of `lunabakes` with `response`.
async fn primary_answers(stack: &Stack, response: ResponseTemplate) {
    stack.primary.reset().await;
    let route = stack
        .primary
        .route("/v1/user/profile", &[("unique_id", LUNA)]);
    stack.primary.respond(route, response).await;
}

#[tokio::test]
async fn opens_after_the_threshold_and_then_the_primary_receives_nothing() {
    let stack = Stack::builder()
        .search_order(None)
        .breaker(PRIMARY, 3, LONG_COOLDOWN_MS)
        .start()
        .await;
    primary_answers(&stack, ResponseTemplate::new(500)).await;
    stack.fallback.serve_fixtures().await;

    for n in 1..=3 {
        let a = stack.get(PROFILE).await;
        assert_answered_by(&a, FALLBACK_FOLLOWERS, "a failure below the threshold");
        assert_eq!(
            primary_p1(&stack).await,
            n,
            "failure {n} reached the primary"
        );
    }
    // Open: a healthy primary would not be asked either.
    for _ in 0..5 {
        let a = stack.get(PROFILE).await;
        assert_answered_by(&a, FALLBACK_FOLLOWERS, "while open");
    }
    assert_eq!(
        primary_p1(&stack).await,
        3,
        "no request reaches an open provider"
    );
    assert_eq!(stack.fallback.request_count().await, 8);
}

#[tokio::test]
async fn after_the_cooldown_exactly_one_probe_reaches_the_primary() {
    let stack = Stack::builder()
        .search_order(None)
        .breaker(PRIMARY, 2, SHORT_COOLDOWN_MS)
        .start()
        .await;
    stack.fallback.serve_fixtures().await;
    primary_answers(&stack, ResponseTemplate::new(500)).await;
    for _ in 0..2 {
        stack.get(PROFILE).await.assert_success(false);
    }
    let opened = Instant::now();
    assert_eq!(primary_p1(&stack).await, 2);

    // A slow failing probe, so the others arrive while it is out.
    primary_answers(
        &stack,
        ResponseTemplate::new(500).set_delay(Duration::from_millis(300)),
    )
    .await;
    let past_cooldown = Duration::from_millis(SHORT_COOLDOWN_MS + 300);
    tokio::time::sleep(past_cooldown.saturating_sub(opened.elapsed())).await;
    let burst: Vec<_> = (0..4)
        .map(|_| {
            let api = stack.api.clone();
            tokio::spawn(async move { api.get(PROFILE).await })
        })
        .collect();
    for request in burst {
        let a = request.await.expect("the request task finished");
        assert_answered_by(&a, FALLBACK_FOLLOWERS, "during and after the probe");
    }
    assert_eq!(
        primary_p1(&stack).await,
        1,
        "of four requests after the cooldown, one probed"
    );

    // The probe failed: open again for a whole cooldown.
    let a = stack.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "after a failed probe");
    assert_eq!(primary_p1(&stack).await, 1, "a failed probe reopens it");
}

#[tokio::test]
async fn a_successful_probe_closes_the_breaker() {
    let cooldown = Duration::from_millis(SHORT_COOLDOWN_MS);
    let stack = Stack::builder()
        .search_order(None)
        .breaker(PRIMARY, 2, SHORT_COOLDOWN_MS)
        .start()
        .await;
    stack.fallback.serve_fixtures().await;
    primary_answers(&stack, ResponseTemplate::new(503)).await;
    stack.get(PROFILE).await.assert_success(false);
    // The second failure opens it: somewhere between these two instants.
    let opening = Instant::now();
    stack.get(PROFILE).await.assert_success(false);
    let opened = Instant::now();
    // Operator sweep: traffic moved to the fallback with no line saying why.
    let line = log_line_within(&stack.server, &["breaker opened"], Duration::from_secs(5)).await;
    assert!(line.contains("WARN") && line.contains(PRIMARY), "{line}");

    // The primary recovers, but the breaker is open until the cooldown ends.
    stack.primary.reset().await;
    stack.primary.serve_fixtures().await;
    let a = stack.get(PROFILE).await;
    assert!(
        opening.elapsed() < cooldown,
        "test too slow: not open any more"
    );
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "open, even though healthy");
    assert_eq!(primary_p1(&stack).await, 0);

    let past_cooldown = cooldown + Duration::from_millis(300);
    tokio::time::sleep(past_cooldown.saturating_sub(opened.elapsed())).await;
    let a = stack.get(PROFILE).await;
    assert_answered_by(&a, PRIMARY_FOLLOWERS, "the probe");
    assert_eq!(primary_p1(&stack).await, 1);
    let fallback_before = stack.fallback.request_count().await;
    for n in 2..=4 {
        let a = stack.get(PROFILE).await;
        assert_answered_by(&a, PRIMARY_FOLLOWERS, "closed again");
        assert_eq!(primary_p1(&stack).await, n);
    }
    assert_eq!(
        stack.fallback.request_count().await,
        fallback_before,
        "closed: the fallback is not needed"
    );
    let line = log_line_within(&stack.server, &["breaker closed"], Duration::from_secs(5)).await;
    assert!(line.contains(PRIMARY), "{line}");
    let stderr = stack.server.stderr();
    assert_eq!(stderr.matches("breaker opened").count(), 1, "{stderr}");
    assert_eq!(stderr.matches("breaker closed").count(), 1, "{stderr}");
}

#[tokio::test]
async fn a_429_opens_it_at_once_for_its_retry_after() {
    // A threshold of 5 and a 300 ms cooldown; the 429 says 3 s, so a busy
    // machine has seconds, not milliseconds, to look between the two.
    let retry_after = Duration::from_secs(3);
    let stack = Stack::builder()
        .search_order(None)
        .breaker(PRIMARY, 5, 300)
        .start()
        .await;
    stack.fallback.serve_fixtures().await;
    primary_answers(
        &stack,
        ResponseTemplate::new(429).insert_header("Retry-After", "3"),
    )
    .await;
    // The 429 opens it somewhere between these two instants.
    let asked = Instant::now();
    let a = stack.get(PROFILE).await;
    let limited = Instant::now();
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "after a 429");
    assert_eq!(primary_p1(&stack).await, 1);

    let a = stack.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "open after one 429");
    assert_eq!(primary_p1(&stack).await, 1, "one 429 opened it");

    // Past the cooldown, not past Retry-After: still open (a Retry-After
    // shorter than the cooldown counts as well: the unit tests).
    tokio::time::sleep(Duration::from_millis(800).saturating_sub(limited.elapsed())).await;
    let a = stack.get(PROFILE).await;
    assert!(
        asked.elapsed() < retry_after,
        "test too slow: Retry-After is over"
    );
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "inside Retry-After");
    assert_eq!(
        primary_p1(&stack).await,
        1,
        "Retry-After outlasts the cooldown"
    );

    // Past Retry-After: one probe.
    stack.primary.reset().await;
    stack.primary.serve_fixtures().await;
    let past_retry_after = retry_after + Duration::from_millis(300);
    tokio::time::sleep(past_retry_after.saturating_sub(limited.elapsed())).await;
    let a = stack.get(PROFILE).await;
    assert_answered_by(&a, PRIMARY_FOLLOWERS, "the probe after Retry-After");
}

#[tokio::test]
async fn a_401_counts_as_a_failure() {
    let stack = Stack::builder()
        .search_order(None)
        .breaker(PRIMARY, 2, LONG_COOLDOWN_MS)
        .start()
        .await;
    stack.fallback.serve_fixtures().await;
    primary_answers(&stack, ResponseTemplate::new(401)).await;
    for _ in 0..4 {
        let a = stack.get(PROFILE).await;
        assert_answered_by(&a, FALLBACK_FOLLOWERS, "key refused");
    }
    assert_eq!(primary_p1(&stack).await, 2, "two 401s opened it");
}

#[tokio::test]
async fn not_found_does_not_count_and_resets_the_count() {
    let stack = Stack::builder()
        .search_order(None)
        .breaker(PRIMARY, 2, LONG_COOLDOWN_MS)
        .start()
        .await;
    stack.fallback.serve_fixtures().await;
    stack
        .fallback
        .user_info("ghost", &fixtures::fallback_user_not_found())
        .await;
    stack
        .primary
        .profile("ghost", &fixtures::primary_user_not_found())
        .await;
    let route = stack
        .primary
        .route("/v1/user/profile", &[("unique_id", LUNA)]);
    stack
        .primary
        .respond(route, ResponseTemplate::new(500))
        .await;
    // Five "not found" in a row: each is the primary's word, none opens it.
    for n in 1..=5 {
        stack
            .get(GHOST)
            .await
            .assert_error(404, "RESOURCE_NOT_FOUND");
        assert_eq!(ghost_requests(&stack).await, n);
    }
    // Failure, not found, failure: never two failures in a row.
    stack.get(PROFILE).await.assert_success(false);
    stack
        .get(GHOST)
        .await
        .assert_error(404, "RESOURCE_NOT_FOUND");
    stack.get(PROFILE).await.assert_success(false);
    assert_eq!(ghost_requests(&stack).await, 6, "still closed");
    // The second failure in a row opens it.
    stack.get(PROFILE).await.assert_success(false);
    assert_eq!(
        primary_p1(&stack).await,
        9,
        "the third lunabakes failure was asked"
    );
    // Open: the fallback says "not found" instead.
    stack
        .get(GHOST)
        .await
        .assert_error(404, "RESOURCE_NOT_FOUND");
    assert_eq!(primary_p1(&stack).await, 9, "open now");
    assert_eq!(stack.fallback.requests_to("/user/info").await.len(), 4);
}

/// Both providers fail once (threshold 1), so both are open; the next
/// request must still try the one whose cooldown ends first.
async fn every_provider_open(primary_cooldown_ms: u64, fallback_cooldown_ms: u64) -> Stack {
    let stack = Stack::builder()
        .search_order(None)
        .breaker(PRIMARY, 1, primary_cooldown_ms)
        .breaker(FALLBACK, 1, fallback_cooldown_ms)
        .start()
        .await;
    stack.primary.fail_all(500).await;
    stack.fallback.fail_all(500).await;
    stack
        .get(PROFILE)
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
    assert_eq!(stack.primary.request_count().await, 1);
    assert_eq!(stack.fallback.request_count().await, 1);
    stack
}

#[tokio::test]
async fn with_every_provider_open_the_fallback_ending_first_is_still_tried() {
    let stack = every_provider_open(LONG_COOLDOWN_MS, LONG_COOLDOWN_MS / 2).await;
    stack.fallback.reset().await;
    stack.fallback.serve_fixtures().await;
    let a = stack.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "both open: the soonest is tried");
    assert_eq!(stack.primary.request_count().await, 1, "not the later one");
    assert_eq!(stack.fallback.request_count().await, 1);
    // It succeeded, so it is closed: the primary, open, is skipped.
    let a = stack.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "fallback closed again");
    assert_eq!(stack.primary.request_count().await, 1);
}

#[tokio::test]
async fn with_every_provider_open_the_primary_ending_first_is_still_tried() {
    let stack = every_provider_open(LONG_COOLDOWN_MS / 2, LONG_COOLDOWN_MS).await;
    // Still failing: a forced attempt that fails is 502, not a refusal.
    stack
        .get(PROFILE)
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
    assert_eq!(
        stack.primary.request_count().await,
        2,
        "the soonest was tried"
    );
    assert_eq!(stack.fallback.request_count().await, 1, "not the later one");
    stack.primary.reset().await;
    stack.primary.serve_fixtures().await;
    // Forced probes of one provider are at least a second apart.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let a = stack.get(PROFILE).await;
    assert_answered_by(&a, PRIMARY_FOLLOWERS, "both open: the soonest is tried");
    assert_eq!(stack.fallback.request_count().await, 1);
}

#[tokio::test]
async fn an_open_breaker_costs_no_time() {
    // A primary that answers its 500 after 2 s (within its 4 s timeout): an
    // open breaker skips it, so no answer comes near that.
    let delay = Duration::from_secs(2);
    let stack = Stack::builder()
        .search_order(None)
        .timeout_ms(PRIMARY, 4000)
        .breaker(PRIMARY, 1, LONG_COOLDOWN_MS)
        .start()
        .await;
    stack.fallback.serve_fixtures().await;
    primary_answers(&stack, ResponseTemplate::new(500).set_delay(delay)).await;
    let started = Instant::now();
    stack.get(PROFILE).await.assert_success(false);
    assert!(started.elapsed() >= delay);
    for _ in 0..3 {
        let started = Instant::now();
        let a = stack.get(PROFILE).await;
        let took = started.elapsed();
        assert_answered_by(&a, FALLBACK_FOLLOWERS, "open");
        assert!(
            took < delay / 2,
            "an open provider is skipped, not waited for: {took:?}"
        );
    }
    assert_eq!(primary_p1(&stack).await, 1);
}

/// The request ID of the probe whose caller gives up.
const ABANDONED_PROBE_ID: &str = "abandoned-probe-1";

/// The primary hangs until its own 4 s timeout. A probe whose caller hangs
/// up must still be reported: dropped unreported, it would reopen the
/// breaker for no time at all, and every following request would probe the
/// hanging primary again, and wait on it.
#[tokio::test]
async fn an_abandoned_probe_keeps_the_breaker_open() {
    const PRIMARY_TIMEOUT_MS: u64 = 4000;
    /// Long enough for one request after the probe's failure is logged.
    const COOLDOWN_MS: u64 = 2000;
    /// Well under the primary's timeout: an answer this fast did not wait
    /// on the primary.
    const QUICK: Duration = Duration::from_millis(PRIMARY_TIMEOUT_MS / 2);
    let hanging = RawUpstream::start(Behaviour::Silent);
    let stack = Stack::builder()
        .search_order(None)
        .primary_url(&hanging.base_url())
        .timeout_ms(PRIMARY, PRIMARY_TIMEOUT_MS)
        .breaker(PRIMARY, 1, COOLDOWN_MS)
        .start()
        .await;
    stack.fallback.serve_fixtures().await;

    // One failure, by the primary's own timeout, opens the breaker.
    let a = stack.get(PROFILE).await;
    let opened = Instant::now();
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "the primary timed out");
    assert_eq!(hanging.request_count(), 1);

    // Past the cooldown the next request is the probe; its caller gives up
    // long before the primary's timeout.
    let past_cooldown = Duration::from_millis(COOLDOWN_MS + 700);
    tokio::time::sleep(past_cooldown.saturating_sub(opened.elapsed())).await;
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(500))
        .build()
        .expect("can build an HTTP client");
    let gave_up = impatient
        .get(format!("{}{PROFILE}", stack.server.base_url()))
        .header("X-API-Key", &stack.key)
        .header("X-Request-Id", ABANDONED_PROBE_ID)
        .send()
        .await;
    assert!(
        gave_up.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the probe hangs on the primary, so its caller gives up: {gave_up:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            hanging.request_count() == 2
        })
        .await,
        "the probe reached the primary"
    );

    // Within the next second: the fallback answers at once and the primary
    // is left alone, whether the abandoned probe is still out or over.
    for n in 1..=3 {
        let (a, took) = stack.timed_get(PROFILE).await;
        assert_answered_by(&a, FALLBACK_FOLLOWERS, "after the abandoned probe");
        assert!(
            took < QUICK,
            "request {n} after the abandoned probe waited on the primary: {took:?}"
        );
    }
    assert_eq!(
        hanging.request_count(),
        2,
        "no request re-probes the hanging primary"
    );

    // The abandoned probe runs to the primary's timeout and counts as a
    // failure: the breaker reopens for a whole cooldown.
    let line = log_line_within(
        &stack.server,
        &[ABANDONED_PROBE_ID, "attempt failed"],
        Duration::from_millis(PRIMARY_TIMEOUT_MS) + Duration::from_secs(6),
    )
    .await;
    assert!(line.contains(PRIMARY), "the primary's attempt: {line}");
    let (a, took) = stack.timed_get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "after the probe failed");
    assert!(took < QUICK, "no wait on the primary: {took:?}");
    assert_eq!(
        hanging.request_count(),
        2,
        "the failed probe reopened the breaker"
    );
}

/// A chain of one provider, open, its upstream hanging: each request would
/// be forced to probe it. Of six at once, one probes it; the other five are
/// answered at once, not after the primary's whole timeout.
#[tokio::test]
async fn forced_probes_are_one_at_a_time() {
    const PRIMARY_TIMEOUT_MS: u64 = 5000;
    const QUICK: Duration = Duration::from_millis(PRIMARY_TIMEOUT_MS / 2);
    let hanging = RawUpstream::start(Behaviour::Silent);
    let stack = Stack::builder()
        .search_order(None)
        .providers(&[PRIMARY])
        .primary_url(&hanging.base_url())
        .timeout_ms(PRIMARY, PRIMARY_TIMEOUT_MS)
        .breaker(PRIMARY, 1, LONG_COOLDOWN_MS)
        .start()
        .await;
    stack
        .get(PROFILE)
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
    assert_eq!(hanging.request_count(), 1, "the failure that opened it");

    let started = Instant::now();
    let burst: Vec<_> = (0..6)
        .map(|_| {
            let api = stack.api.clone();
            tokio::spawn(async move {
                let a = api.get(PROFILE).await;
                (a, started.elapsed())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for request in burst {
        answers.push(request.await.expect("the request task finished"));
    }
    for (a, _) in &answers {
        a.assert_error(502, "UPSTREAM_UNAVAILABLE");
    }
    assert_eq!(
        hanging.request_count(),
        2,
        "of six requests, one probed the upstream"
    );
    answers.sort_by_key(|(_, took)| *took);
    let (_, probe_took) = answers.pop().expect("six answers");
    assert!(
        probe_took >= Duration::from_millis(PRIMARY_TIMEOUT_MS - 500),
        "the probe waited for the primary's timeout: {probe_took:?}"
    );
    for (_, took) in &answers {
        assert!(
            *took < QUICK,
            "a request that did not probe is answered at once, not after the probe: {took:?}"
        );
    }
}

const SEARCH: &str = "/v1/shortvideo/search?query=luna";

/// Search is served by the fallback alone: after its 429 with
/// `Retry-After: 3600`, no request may reach it for an hour, forced probe or
/// not; each is answered at once with 502 and a `Retry-After` saying so.
#[tokio::test]
async fn a_rate_limited_provider_is_never_asked_before_its_retry_after() {
    let stack = Stack::start().await;
    stack
        .fallback
        .respond_all(ResponseTemplate::new(429).insert_header("Retry-After", "3600"))
        .await;
    stack
        .get(SEARCH)
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
    assert_eq!(stack.fallback.request_count().await, 1, "the 429");

    for n in 1..=6 {
        let started = Instant::now();
        let a = stack.get(SEARCH).await;
        a.assert_error(502, "UPSTREAM_UNAVAILABLE");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "request {n} answered at once"
        );
        let wait: u64 = a
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("request {n}: Retry-After in seconds: {a:?}"));
        assert!((3500..=3600).contains(&wait), "request {n}: {wait}");
    }
    assert_eq!(
        stack.fallback.request_count().await,
        1,
        "nothing reached the rate-limited upstream before its Retry-After"
    );
}

/// Paging review, defect 2: the fallback's "1 request/second" limit took
/// it out for the whole cooldown (30 s by default), and search, which it
/// serves alone, with it. A rate limit without `Retry-After` keeps the
/// provider out for a second.
#[tokio::test]
async fn a_per_second_rate_limit_keeps_a_provider_out_for_a_second_not_the_cooldown() {
    let stack = Stack::builder()
        .breaker(FALLBACK, 5, LONG_COOLDOWN_MS)
        .start()
        .await;
    stack
        .fallback
        .answer_all(&socialgate_tests::upstream::fixtures::fallback_rate_limit())
        .await;
    let first = stack.get(SEARCH).await;
    first.assert_error(502, "UPSTREAM_UNAVAILABLE");
    let limited = Instant::now();
    assert_eq!(stack.fallback.request_count().await, 1, "the limit");
    // The request that met the limit is told when to come back too.
    assert_eq!(first.header("retry-after"), Some("1"), "{first:?}");
    stack.fallback.reset().await;
    stack.fallback.serve_fixtures().await;
    let a = stack.get(SEARCH).await;
    if limited.elapsed() < Duration::from_millis(900) {
        a.assert_error(502, "UPSTREAM_UNAVAILABLE");
        assert_eq!(stack.fallback.request_count().await, 0, "out for now");
    }
    tokio::time::sleep(Duration::from_millis(1200).saturating_sub(limited.elapsed())).await;
    stack.get(SEARCH).await.assert_success(true);
    assert_eq!(
        stack.fallback.request_count().await,
        1,
        "back after a second"
    );
}

/// A chain whose every provider failed keeps being probed, so it recovers
/// quickly, but at most once a second per provider, not once per request.
#[tokio::test]
async fn forced_probes_of_a_failing_provider_are_paced() {
    let stack = Stack::builder()
        .breaker(FALLBACK, 1, LONG_COOLDOWN_MS)
        .start()
        .await;
    stack.fallback.fail_all(503).await;
    stack
        .get(SEARCH)
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
    assert_eq!(
        stack.fallback.request_count().await,
        1,
        "the failure that opened it"
    );

    let started = Instant::now();
    let mut answered_at_once = 0;
    while started.elapsed() < Duration::from_millis(800) {
        let a = stack.get(SEARCH).await;
        a.assert_error(502, "UPSTREAM_UNAVAILABLE");
        answered_at_once += usize::from(a.header("retry-after") == Some("1"));
    }
    let probed = stack.fallback.request_count().await - 1;
    assert!(
        probed <= 1,
        "one forced probe in under a second, not {probed}"
    );
    assert!(
        answered_at_once >= 3,
        "the others were told to come back in a second"
    );

    // A second on, the next request probes again: a recovered upstream is
    // found without waiting out the cooldown.
    stack.fallback.reset().await;
    stack.fallback.serve_fixtures().await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let a = stack.get(SEARCH).await;
    a.assert_success(true);
}
