//! The circuit breaker per provider, with short cooldowns: it opens after
//! `breaker_failures` consecutive failures, and while open the provider's
//! upstream receives nothing and the fallback answers; after the cooldown
//! exactly one probe reaches it, and a successful probe closes it. A 429
//! opens it at once, for the longer of the cooldown and its `Retry-After`;
//! a 401 counts as a failure, "not found" does not. When every provider of
//! a chain is open, the one whose cooldown ends first is still tried.

use std::time::{Duration, Instant};

use socialgate_tests::config::{FALLBACK, PRIMARY};
use socialgate_tests::rig::Rig;
use socialgate_tests::upstream::{fixtures, LUNA};
use socialgate_tests::Answer;
use wiremock::ResponseTemplate;

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";
const GHOST: &str = "/v1/shortvideo/profile?username=ghost";

/// `followers` in each double's profile fixture: who answered.
const PRIMARY_FOLLOWERS: u64 = 5_479_588;
const FALLBACK_FOLLOWERS: u64 = 5_500_000;

/// A cooldown no test waits out.
const LONG_COOLDOWN_MS: u64 = 60_000;

/// A cooldown tests do wait out: long enough that a debug build on a busy
/// two-core machine makes its next requests well inside it.
const SHORT_COOLDOWN_MS: u64 = 2000;

fn assert_answered_by(a: &Answer, followers: u64, what: &str) {
    a.assert_success(false);
    assert_eq!(a.data()["followers"], followers, "{what}: {a:?}");
}

/// Requests for P1 the primary's double received.
async fn primary_p1(rig: &Rig) -> usize {
    rig.primary.requests_to("/v1/user/profile").await.len()
}

/// Requests for P1 of `ghost` the primary's double received.
async fn ghost_requests(rig: &Rig) -> usize {
    rig.primary
        .requests()
        .await
        .iter()
        .filter(|r| r.url.query() == Some("unique_id=ghost"))
        .count()
}

/// The primary answers P1 of `lunabakes` with `response`.
async fn primary_answers(rig: &Rig, response: ResponseTemplate) {
    rig.primary.reset().await;
    let route = rig
        .primary
        .route("/v1/user/profile", &[("unique_id", LUNA)]);
    rig.primary.respond(route, response).await;
}

#[tokio::test]
async fn opens_after_the_threshold_and_then_the_primary_receives_nothing() {
    let rig = Rig::builder()
        .breaker(PRIMARY, 3, LONG_COOLDOWN_MS)
        .start()
        .await;
    primary_answers(&rig, ResponseTemplate::new(500)).await;
    rig.fallback.serve_fixtures().await;

    for n in 1..=3 {
        let a = rig.get(PROFILE).await;
        assert_answered_by(&a, FALLBACK_FOLLOWERS, "a failure below the threshold");
        assert_eq!(primary_p1(&rig).await, n, "failure {n} reached the primary");
    }
    // Open: a healthy primary would not be asked either.
    for _ in 0..5 {
        let a = rig.get(PROFILE).await;
        assert_answered_by(&a, FALLBACK_FOLLOWERS, "while open");
    }
    assert_eq!(
        primary_p1(&rig).await,
        3,
        "no request reaches an open provider"
    );
    assert_eq!(rig.fallback.request_count().await, 8);
}

#[tokio::test]
async fn after_the_cooldown_exactly_one_probe_reaches_the_primary() {
    let rig = Rig::builder()
        .breaker(PRIMARY, 2, SHORT_COOLDOWN_MS)
        .start()
        .await;
    rig.fallback.serve_fixtures().await;
    primary_answers(&rig, ResponseTemplate::new(500)).await;
    for _ in 0..2 {
        rig.get(PROFILE).await.assert_success(false);
    }
    let opened = Instant::now();
    assert_eq!(primary_p1(&rig).await, 2);

    // A slow failing probe, so the others arrive while it is out.
    primary_answers(
        &rig,
        ResponseTemplate::new(500).set_delay(Duration::from_millis(300)),
    )
    .await;
    let past_cooldown = Duration::from_millis(SHORT_COOLDOWN_MS + 300);
    tokio::time::sleep(past_cooldown.saturating_sub(opened.elapsed())).await;
    let burst: Vec<_> = (0..4)
        .map(|_| {
            let api = rig.api.clone();
            tokio::spawn(async move { api.get(PROFILE).await })
        })
        .collect();
    for request in burst {
        let a = request.await.expect("the request task finished");
        assert_answered_by(&a, FALLBACK_FOLLOWERS, "during and after the probe");
    }
    assert_eq!(
        primary_p1(&rig).await,
        1,
        "of four requests after the cooldown, one probed"
    );

    // The probe failed: open again for a whole cooldown.
    let a = rig.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "after a failed probe");
    assert_eq!(primary_p1(&rig).await, 1, "a failed probe reopens it");
}

#[tokio::test]
async fn a_successful_probe_closes_the_breaker() {
    let cooldown = Duration::from_millis(SHORT_COOLDOWN_MS);
    let rig = Rig::builder()
        .breaker(PRIMARY, 2, SHORT_COOLDOWN_MS)
        .start()
        .await;
    rig.fallback.serve_fixtures().await;
    primary_answers(&rig, ResponseTemplate::new(503)).await;
    rig.get(PROFILE).await.assert_success(false);
    // The second failure opens it: somewhere between these two instants.
    let opening = Instant::now();
    rig.get(PROFILE).await.assert_success(false);
    let opened = Instant::now();

    // The primary recovers, but the breaker is open until the cooldown ends.
    rig.primary.reset().await;
    rig.primary.serve_fixtures().await;
    let a = rig.get(PROFILE).await;
    assert!(
        opening.elapsed() < cooldown,
        "test too slow: not open any more"
    );
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "open, even though healthy");
    assert_eq!(primary_p1(&rig).await, 0);

    let past_cooldown = cooldown + Duration::from_millis(300);
    tokio::time::sleep(past_cooldown.saturating_sub(opened.elapsed())).await;
    let a = rig.get(PROFILE).await;
    assert_answered_by(&a, PRIMARY_FOLLOWERS, "the probe");
    assert_eq!(primary_p1(&rig).await, 1);
    let fallback_before = rig.fallback.request_count().await;
    for n in 2..=4 {
        let a = rig.get(PROFILE).await;
        assert_answered_by(&a, PRIMARY_FOLLOWERS, "closed again");
        assert_eq!(primary_p1(&rig).await, n);
    }
    assert_eq!(
        rig.fallback.request_count().await,
        fallback_before,
        "closed: the fallback is not needed"
    );
}

#[tokio::test]
async fn a_429_opens_it_at_once_for_the_longer_of_cooldown_and_retry_after() {
    // A threshold of 5 and a 300 ms cooldown; the 429 says 3 s, so a busy
    // machine has seconds, not milliseconds, to look between the two.
    let retry_after = Duration::from_secs(3);
    let rig = Rig::builder().breaker(PRIMARY, 5, 300).start().await;
    rig.fallback.serve_fixtures().await;
    primary_answers(
        &rig,
        ResponseTemplate::new(429).insert_header("Retry-After", "3"),
    )
    .await;
    // The 429 opens it somewhere between these two instants.
    let asked = Instant::now();
    let a = rig.get(PROFILE).await;
    let limited = Instant::now();
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "after a 429");
    assert_eq!(primary_p1(&rig).await, 1);

    let a = rig.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "open after one 429");
    assert_eq!(primary_p1(&rig).await, 1, "one 429 opened it");

    // Past the cooldown, not past Retry-After: still open.
    tokio::time::sleep(Duration::from_millis(800).saturating_sub(limited.elapsed())).await;
    let a = rig.get(PROFILE).await;
    assert!(
        asked.elapsed() < retry_after,
        "test too slow: Retry-After is over"
    );
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "inside Retry-After");
    assert_eq!(
        primary_p1(&rig).await,
        1,
        "Retry-After outlasts the cooldown"
    );

    // Past Retry-After: one probe.
    rig.primary.reset().await;
    rig.primary.serve_fixtures().await;
    let past_retry_after = retry_after + Duration::from_millis(300);
    tokio::time::sleep(past_retry_after.saturating_sub(limited.elapsed())).await;
    let a = rig.get(PROFILE).await;
    assert_answered_by(&a, PRIMARY_FOLLOWERS, "the probe after Retry-After");
}

#[tokio::test]
async fn a_401_counts_as_a_failure() {
    let rig = Rig::builder()
        .breaker(PRIMARY, 2, LONG_COOLDOWN_MS)
        .start()
        .await;
    rig.fallback.serve_fixtures().await;
    primary_answers(&rig, ResponseTemplate::new(401)).await;
    for _ in 0..4 {
        let a = rig.get(PROFILE).await;
        assert_answered_by(&a, FALLBACK_FOLLOWERS, "key refused");
    }
    assert_eq!(primary_p1(&rig).await, 2, "two 401s opened it");
}

#[tokio::test]
async fn not_found_does_not_count_and_resets_the_count() {
    let rig = Rig::builder()
        .breaker(PRIMARY, 2, LONG_COOLDOWN_MS)
        .start()
        .await;
    rig.fallback.serve_fixtures().await;
    rig.fallback
        .user_info("ghost", &fixtures::fallback_user_not_found())
        .await;
    rig.primary
        .profile("ghost", &fixtures::primary_user_not_found())
        .await;
    let route = rig
        .primary
        .route("/v1/user/profile", &[("unique_id", LUNA)]);
    rig.primary.respond(route, ResponseTemplate::new(500)).await;
    // Five "not found" in a row: each is the primary's word, none opens it.
    for n in 1..=5 {
        rig.get(GHOST).await.assert_error(404, "RESOURCE_NOT_FOUND");
        assert_eq!(ghost_requests(&rig).await, n);
    }
    // Failure, not found, failure: never two failures in a row.
    rig.get(PROFILE).await.assert_success(false);
    rig.get(GHOST).await.assert_error(404, "RESOURCE_NOT_FOUND");
    rig.get(PROFILE).await.assert_success(false);
    assert_eq!(ghost_requests(&rig).await, 6, "still closed");
    // The second failure in a row opens it.
    rig.get(PROFILE).await.assert_success(false);
    assert_eq!(
        primary_p1(&rig).await,
        9,
        "the third lunabakes failure was asked"
    );
    // Open: the fallback says "not found" instead.
    rig.get(GHOST).await.assert_error(404, "RESOURCE_NOT_FOUND");
    assert_eq!(primary_p1(&rig).await, 9, "open now");
    assert_eq!(rig.fallback.requests_to("/user/info").await.len(), 4);
}

/// Both providers fail once (threshold 1), so both are open; the next
/// request must still try the one whose cooldown ends first.
async fn every_provider_open(primary_cooldown_ms: u64, fallback_cooldown_ms: u64) -> Rig {
    let rig = Rig::builder()
        .breaker(PRIMARY, 1, primary_cooldown_ms)
        .breaker(FALLBACK, 1, fallback_cooldown_ms)
        .start()
        .await;
    rig.primary.fail_all(500).await;
    rig.fallback.fail_all(500).await;
    rig.get(PROFILE)
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
    assert_eq!(rig.primary.request_count().await, 1);
    assert_eq!(rig.fallback.request_count().await, 1);
    rig
}

#[tokio::test]
async fn with_every_provider_open_the_fallback_ending_first_is_still_tried() {
    let rig = every_provider_open(LONG_COOLDOWN_MS, LONG_COOLDOWN_MS / 2).await;
    rig.fallback.reset().await;
    rig.fallback.serve_fixtures().await;
    let a = rig.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "both open: the soonest is tried");
    assert_eq!(rig.primary.request_count().await, 1, "not the later one");
    assert_eq!(rig.fallback.request_count().await, 1);
    // It succeeded, so it is closed: the primary, open, is skipped.
    let a = rig.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "fallback closed again");
    assert_eq!(rig.primary.request_count().await, 1);
}

#[tokio::test]
async fn with_every_provider_open_the_primary_ending_first_is_still_tried() {
    let rig = every_provider_open(LONG_COOLDOWN_MS / 2, LONG_COOLDOWN_MS).await;
    // Still failing: a forced attempt that fails is 502, not a refusal.
    rig.get(PROFILE)
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
    assert_eq!(
        rig.primary.request_count().await,
        2,
        "the soonest was tried"
    );
    assert_eq!(rig.fallback.request_count().await, 1, "not the later one");
    rig.primary.reset().await;
    rig.primary.serve_fixtures().await;
    let a = rig.get(PROFILE).await;
    assert_answered_by(&a, PRIMARY_FOLLOWERS, "both open: the soonest is tried");
    assert_eq!(rig.fallback.request_count().await, 1);
}

#[tokio::test]
async fn an_open_breaker_costs_no_time() {
    // A primary that answers its 500 after 2 s (within its 4 s timeout): an
    // open breaker skips it, so no answer comes near that.
    let delay = Duration::from_secs(2);
    let rig = Rig::builder()
        .timeout_ms(PRIMARY, 4000)
        .breaker(PRIMARY, 1, LONG_COOLDOWN_MS)
        .start()
        .await;
    rig.fallback.serve_fixtures().await;
    primary_answers(&rig, ResponseTemplate::new(500).set_delay(delay)).await;
    let started = Instant::now();
    rig.get(PROFILE).await.assert_success(false);
    assert!(started.elapsed() >= delay);
    for _ in 0..3 {
        let started = Instant::now();
        let a = rig.get(PROFILE).await;
        let took = started.elapsed();
        assert_answered_by(&a, FALLBACK_FOLLOWERS, "open");
        assert!(
            took < delay / 2,
            "an open provider is skipped, not waited for: {took:?}"
        );
    }
    assert_eq!(primary_p1(&rig).await, 1);
}
