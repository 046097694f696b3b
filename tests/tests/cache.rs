//! The response cache, against wiremock upstreams whose request counts say
//! what reached them: repeats within a time to live are answered from the
//! cache, concurrent misses share one fetch (even when the first caller
//! hangs up), "not found" is kept for its own short time and failures not
//! at all, `Cache-Control` is honoured (`no-cache`, `max-age`, `no-store`,
//! `only-if-cached`), an expired answer stands in when the
//! providers fail (within its window only), the cache can be turned off per
//! endpoint or whole, a reload keeps what is stored, and memory stays within
//! `max_bytes`. A caller that hangs up keeps its slot while the shared fetch
//! it waits on runs, so fetches stay within `max_concurrent_requests`.

use std::time::{Duration, Instant};

use socialgate_tests::config::PRIMARY;
use socialgate_tests::operator::{admin_addr, hang_up_after, log_line_within, scrape, send};
use socialgate_tests::raw_upstream::RawUpstream;
use socialgate_tests::reload::{await_watching, replace_file, wait_for_log, Memory, APPLIED};
use socialgate_tests::upstream::{fixtures, json_response, set, POST_ID, PRIMARY_FOLLOWERS};
use socialgate_tests::{eventually, Answer, Stack};

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";
const POST: &str = "/v1/shortvideo/post?id=7312345678901234567";
const COMMENTS: &str = "/v1/shortvideo/comments?id=7312345678901234567&count=3";
const NOBODY: &str = "/v1/shortvideo/profile?username=nobody_here";

/// The primary alone, with the cache configured by `cache` (the body of the
/// `[cache]` table) and a breaker that never opens, so every fetch that
/// reaches the chain reaches the upstream.
async fn cached_stack(cache: &str) -> Stack {
    let stack = Stack::builder()
        .providers(&[PRIMARY])
        .search_order(None)
        .breaker_failures(1000)
        .cache(cache)
        .start()
        .await;
    stack.primary.serve_fixtures().await;
    stack
}

/// Makes the primary answer the post only after `delay`, so requests made
/// meanwhile overlap one fetch.
async fn answer_post_after(stack: &Stack, delay: Duration) {
    stack.primary.reset().await;
    let slow = json_response(&fixtures::primary_aweme_detail()).set_delay(delay);
    let route = stack
        .primary
        .route("/v1/aweme/detail", &[("aweme_id", POST_ID)]);
    stack.primary.respond(route, slow).await;
}

/// `POST` requested on a task of its own (with `cache_control`, if any),
/// once its fetch has reached the upstream: an identical request made now
/// joins it.
async fn post_in_flight(
    stack: &Stack,
    cache_control: Option<&'static str>,
) -> tokio::task::JoinHandle<Answer> {
    let base = stack.server.base_url();
    let key = stack.key.clone();
    let first = tokio::spawn(async move {
        let mut headers = vec![("X-API-Key", key.as_str())];
        headers.extend(cache_control.map(|value| ("Cache-Control", value)));
        send(&base, "GET", POST, &headers).await
    });
    let deadline = Instant::now() + Duration::from_secs(2);
    while stack.primary.request_count().await == 0 {
        assert!(Instant::now() < deadline, "the first fetch went out");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first
}

fn cache_status(a: &Answer) -> &str {
    a.header("cache-status")
        .unwrap_or_else(|| panic!("no Cache-Status: {a:?}"))
}

fn cached(a: &Answer) -> bool {
    a.json["meta"]["cached"]
        .as_bool()
        .unwrap_or_else(|| panic!("meta.cached is a boolean on every success: {a:?}"))
}

#[tokio::test]
async fn a_repeat_within_its_ttl_is_answered_from_the_cache() {
    let stack = cached_stack("enabled = true").await;

    let first = stack.get(PROFILE).await;
    first.assert_success(false);
    assert!(!cached(&first), "{first:?}");
    assert_eq!(
        cache_status(&first),
        "socialgate; fwd=miss; stored; ttl=300"
    );
    assert!(first.header("age").is_none(), "{first:?}");

    for path in [PROFILE, "/v1/shortvideo/profile?username=@lunabakes"] {
        let again = stack.get(path).await;
        again.assert_success(false);
        assert!(cached(&again), "{again:?}");
        assert_eq!(again.data(), first.data(), "the same data");
        let status = cache_status(&again);
        assert!(status.starts_with("socialgate; hit; ttl="), "{status}");
        assert!(again.header("age").is_some(), "{again:?}");
        assert_eq!(
            again.json["meta"]["credits_used"], 1,
            "a hit costs a credit"
        );
    }
    assert_eq!(stack.primary.request_count().await, 1, "one upstream call");

    // `max-age` counts from the fetch, as `Age` does: an HTTP cache takes
    // one off the other, so the pair says how long is left.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let later = stack.get(PROFILE).await;
    let number = |text: Option<&str>, after: &str| -> u64 {
        let text = text.and_then(|t| t.split(after).nth(1)).unwrap_or_default();
        let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("no {after}N: {later:?}"))
    };
    let age = number(later.header("age"), "");
    let left = number(later.header("cache-status"), "ttl=");
    let max_age = number(later.header("cache-control"), "max-age=");
    assert!(age >= 1, "{later:?}");
    assert_eq!(max_age, left + age, "{later:?}");
    assert_eq!(max_age, 300, "the whole ttl, whatever the age: {later:?}");

    // Lists too: the stored page seals its cursor for each caller.
    let page = stack.get(COMMENTS).await;
    page.assert_success(true);
    let again = stack.get(COMMENTS).await;
    assert!(cached(&again), "{again:?}");
    assert_eq!(again.data(), page.data());
    assert!(again.next_cursor().is_some(), "{again:?}");
    assert_eq!(stack.primary.request_count().await, 2);

    let metrics = scrape(admin_addr(&stack.server)).await;
    let hits = metrics.sum(
        "socialgate_cache_requests_total",
        &[("endpoint", "profile"), ("result", "hit")],
    );
    assert_eq!(hits, Some(3.0), "three profile hits counted");
    assert!(metrics.sum("socialgate_cache_bytes", &[]).unwrap_or(0.0) > 0.0);
}

#[tokio::test]
async fn concurrent_misses_share_one_upstream_fetch() {
    let stack = cached_stack("enabled = true").await;
    answer_post_after(&stack, Duration::from_millis(500)).await;

    let answers: Vec<_> = (0..100)
        .map(|_| {
            let api = stack.api.clone();
            tokio::spawn(async move { api.get(POST).await })
        })
        .collect();
    let mut collapsed = 0;
    for answer in answers {
        let a = answer.await.expect("the request task finished");
        a.assert_success(false);
        assert!(!cached(&a), "fresh data for all: {a:?}");
        collapsed += usize::from(cache_status(&a).contains("collapsed"));
    }
    assert_eq!(stack.primary.request_count().await, 1, "exactly one fetch");
    assert!(collapsed >= 50, "most waited on the one fetch: {collapsed}");
}

/// Cache review, defect 1: a request that joins another's fetch has its
/// own time. When that fetch runs out of the starter's time, the joiner,
/// with time left, fetches again and answers by its own deadline.
#[tokio::test]
async fn a_late_joiner_is_not_timed_out_by_the_starters_deadline() {
    let stack = Stack::builder()
        .providers(&[PRIMARY])
        .search_order(None)
        .breaker_failures(1000)
        .cache("enabled = true")
        .server_line("request_timeout_ms = 1000")
        .start()
        .await;
    // The first fetch is slower than one request's time, the next quick.
    stack.primary.reset().await;
    let fetches = std::sync::atomic::AtomicUsize::new(0);
    let first_slow = move |_: &wiremock::Request| {
        let delay = match fetches.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
            0 => Duration::from_millis(1500),
            _ => Duration::ZERO,
        };
        json_response(&fixtures::primary_aweme_detail()).set_delay(delay)
    };
    let route = stack
        .primary
        .route("/v1/aweme/detail", &[("aweme_id", POST_ID)]);
    stack.primary.respond_with(route, first_slow).await;
    let first = tokio::spawn({
        let api = stack.api.clone();
        async move { api.get(POST).await }
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    let joined_at = Instant::now();
    let late = tokio::spawn({
        let api = stack.api.clone();
        async move { api.get(POST).await }
    });
    let first = first.await.expect("the first request finished");
    first.assert_error(504, "UPSTREAM_TIMEOUT");
    // The joiner's own fetch, made when the shared one ran out, delivers.
    let late = late.await.expect("the late request finished");
    late.assert_success(false);
    assert!(
        cache_status(&late).contains("fwd=miss; stored"),
        "fetched by the joiner itself: {late:?}"
    );
    assert!(
        joined_at.elapsed() < Duration::from_millis(1000),
        "within its own time: {:?}",
        joined_at.elapsed()
    );
    assert_eq!(stack.primary.request_count().await, 2);
}

#[tokio::test]
async fn the_first_caller_hanging_up_cancels_nothing() {
    let stack = cached_stack("enabled = true").await;
    answer_post_after(&stack, Duration::from_millis(800)).await;

    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(200))
        .build()
        .expect("an HTTP client");
    let first = impatient
        .get(format!("{}{POST}", stack.server.base_url()))
        .header("X-API-Key", &stack.key)
        .send()
        .await;
    assert!(
        first.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the first caller gave up: {first:?}"
    );
    let answers: Vec<_> = (0..99)
        .map(|_| {
            let api = stack.api.clone();
            tokio::spawn(async move { api.get(POST).await })
        })
        .collect();
    for answer in answers {
        let a = answer.await.expect("the request task finished");
        a.assert_success(false);
    }
    assert_eq!(
        stack.primary.request_count().await,
        1,
        "one fetch, not cancelled"
    );
    let later = stack.get(POST).await;
    assert!(cached(&later), "the fetch was stored: {later:?}");
    assert_eq!(stack.primary.request_count().await, 1);
}

#[tokio::test]
async fn not_found_is_kept_for_its_own_ttl_only() {
    let stack = cached_stack("not_found_ttl_s = 1").await;
    stack
        .primary
        .profile("nobody_here", &fixtures::primary_user_not_found())
        .await;

    let first = stack.get(NOBODY).await;
    first.assert_error(404, "RESOURCE_NOT_FOUND");
    assert_eq!(cache_status(&first), "socialgate; fwd=miss; stored; ttl=1");
    let again = stack.get(NOBODY).await;
    again.assert_error(404, "RESOURCE_NOT_FOUND");
    assert!(cache_status(&again).contains("hit"), "{again:?}");
    assert_eq!(
        again.header("age"),
        Some("0"),
        "a stored \"not found\" says its age as a stored answer does: {again:?}"
    );
    assert!(first.header("age").is_none(), "{first:?}");
    assert_eq!(stack.primary.request_count().await, 1);

    tokio::time::sleep(Duration::from_millis(1100)).await;
    stack
        .get(NOBODY)
        .await
        .assert_error(404, "RESOURCE_NOT_FOUND");
    assert_eq!(
        stack.primary.request_count().await,
        2,
        "asked again after 1 s"
    );
}

#[tokio::test]
async fn a_failure_is_never_cached() {
    let stack = cached_stack("enabled = true").await;
    stack.primary.reset().await;
    stack.primary.fail_all(503).await;
    for n in 1..=3 {
        let a = stack.get(PROFILE).await;
        a.assert_error(502, "UPSTREAM_UNAVAILABLE");
        assert!(a.header("cache-status").is_none(), "{a:?}");
        assert_eq!(stack.primary.request_count().await, n);
    }
}

#[tokio::test]
async fn cache_control_no_cache_refreshes_and_max_age_bounds_the_age() {
    let stack = cached_stack("enabled = true").await;
    let key = stack.key.clone();
    let base = stack.server.base_url();
    let with = |directive: &'static str| {
        let (base, key) = (base.clone(), key.clone());
        async move {
            send(
                &base,
                "GET",
                PROFILE,
                &[("X-API-Key", &key), ("Cache-Control", directive)],
            )
            .await
        }
    };
    stack.get(PROFILE).await.assert_success(false);

    let fresh = with("no-cache").await;
    fresh.assert_success(false);
    assert!(!cached(&fresh), "{fresh:?}");
    assert_eq!(
        cache_status(&fresh),
        "socialgate; fwd=request; stored; ttl=300"
    );
    assert_eq!(
        stack.primary.request_count().await,
        2,
        "no-cache went upstream"
    );
    assert!(cached(&stack.get(PROFILE).await), "and refreshed the entry");

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let young = with("max-age=0").await;
    assert!(!cached(&young), "older than 0 s: fetched: {young:?}");
    assert!(cache_status(&young).contains("fwd=request"), "{young:?}");
    assert_eq!(stack.primary.request_count().await, 3);
    let old_enough = with("max-age=60").await;
    assert!(cached(&old_enough), "{old_enough:?}");
    assert_eq!(stack.primary.request_count().await, 3);
}

/// `GET PROFILE` with `Cache-Control: directives`.
async fn with_cache_control(stack: &Stack, directives: &str) -> Answer {
    send(
        &stack.server.base_url(),
        "GET",
        PROFILE,
        &[("X-API-Key", &stack.key), ("Cache-Control", directives)],
    )
    .await
}

#[tokio::test]
async fn only_if_cached_answers_from_the_cache_or_504_and_never_goes_upstream() {
    let stack = cached_stack("enabled = true").await;
    let not_stored = |a: &Answer| {
        a.assert_error(504, "NOT_CACHED");
        assert_eq!(cache_status(a), "socialgate; detail=only-if-cached");
        assert_eq!(a.json["meta"]["credits_used"], 0, "{a:?}");
    };

    let credits_left = || async {
        stack.get("/v1/account").await.data()["credits_remaining"]
            .as_u64()
            .expect("credits_remaining is a number")
    };
    let before = credits_left().await;
    not_stored(&with_cache_control(&stack, "only-if-cached").await);
    assert_eq!(
        stack.primary.request_count().await,
        0,
        "nothing was fetched"
    );
    assert_eq!(credits_left().await, before, "nothing was charged");

    stack.get(PROFILE).await.assert_success(false);
    let hit = with_cache_control(&stack, "only-if-cached").await;
    hit.assert_success(false);
    assert!(cached(&hit), "{hit:?}");
    assert!(
        cache_status(&hit).starts_with("socialgate; hit; ttl="),
        "{hit:?}"
    );

    // Stored, but older than the request takes: still not fetched.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    not_stored(&with_cache_control(&stack, "max-age=0, only-if-cached").await);
    not_stored(&with_cache_control(&stack, "only-if-cached, no-cache").await);
    assert_eq!(stack.primary.request_count().await, 1, "only the plain GET");

    // An endpoint the cache is off for stores nothing to answer with.
    let off = cached_stack("enabled = false").await;
    not_stored(&with_cache_control(&off, "only-if-cached").await);
    assert_eq!(off.primary.request_count().await, 0);
}

#[tokio::test]
async fn no_store_fetches_without_storing_and_leaves_what_is_stored() {
    let stack = cached_stack("enabled = true").await;

    let first = with_cache_control(&stack, "no-store").await;
    first.assert_success(false);
    assert!(!cached(&first), "{first:?}");
    assert_eq!(
        cache_status(&first),
        "socialgate; fwd=miss",
        "fetched, not stored"
    );
    assert_eq!(first.header("cache-control"), Some("private, max-age=0"));
    let second = stack.get(PROFILE).await;
    assert!(!cached(&second), "nothing was kept: {second:?}");
    assert_eq!(stack.primary.request_count().await, 2);

    // A stored answer may still be served to a no-store request.
    let hit = with_cache_control(&stack, "no-store").await;
    assert!(cached(&hit), "{hit:?}");
    assert_eq!(stack.primary.request_count().await, 2);

    // The upstream's figures change; a refresh that may not store gets
    // them, and what is stored stays the answer it replaced.
    stack.primary.reset().await;
    let mut changed = fixtures::primary_user_profile();
    set(&mut changed, "/user/follower_count", 7.into());
    stack.primary.profile("lunabakes", &changed).await;
    let fresh = with_cache_control(&stack, "no-cache, no-store").await;
    fresh.assert_success(false);
    assert_eq!(fresh.data()["followers"], 7, "{fresh:?}");
    assert_eq!(cache_status(&fresh), "socialgate; fwd=request");
    let stored = stack.get(PROFILE).await;
    assert!(cached(&stored), "{stored:?}");
    assert_eq!(stored.data()["followers"], PRIMARY_FOLLOWERS, "{stored:?}");
    assert_eq!(stack.primary.request_count().await, 1);
}

#[tokio::test]
async fn a_fetch_started_with_no_store_is_shared_and_kept_by_no_one() {
    let stack = cached_stack("enabled = true").await;
    answer_post_after(&stack, Duration::from_millis(400)).await;
    let first = post_in_flight(&stack, Some("no-store")).await;
    let joined = stack.get(POST).await;
    joined.assert_success(false);
    assert_eq!(cache_status(&joined), "socialgate; fwd=miss; collapsed");
    let first = first.await.expect("the request task finished");
    first.assert_success(false);
    assert_eq!(cache_status(&first), "socialgate; fwd=miss");
    assert_eq!(stack.primary.request_count().await, 1, "one fetch for both");

    let after = stack.get(POST).await;
    assert!(!cached(&after), "nothing was kept: {after:?}");
    assert_eq!(stack.primary.request_count().await, 2);
}

#[tokio::test]
async fn an_expired_answer_stands_in_for_a_failure_within_its_window_only() {
    let stack = cached_stack("stale_if_error_s = 2\n[cache.ttl_s]\nprofile = 1").await;
    stack.get(PROFILE).await.assert_success(false);
    stack.primary.reset().await;
    stack.primary.fail_all(503).await;

    tokio::time::sleep(Duration::from_millis(1200)).await;
    let stale = stack.get(PROFILE).await;
    stale.assert_success(false);
    assert!(cached(&stale), "{stale:?}");
    assert_eq!(
        stale.data()["followers"],
        PRIMARY_FOLLOWERS,
        "the stored data"
    );
    let status = cache_status(&stale);
    assert!(
        status.starts_with("socialgate; fwd=stale; ttl=-"),
        "{status}"
    );
    log_line_within(
        &stack.server,
        &["past its time to live"],
        Duration::from_secs(2),
    )
    .await;

    // A no-cache refresh that fails falls back the same way.
    let refused = send(
        &stack.server.base_url(),
        "GET",
        PROFILE,
        &[("X-API-Key", &stack.key), ("Cache-Control", "no-cache")],
    )
    .await;
    assert!(cached(&refused), "{refused:?}");

    // Past ttl + window: the failure shows.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    stack
        .get(PROFILE)
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
}

/// Cache and billing sweep: requests that waited on a shared fetch that
/// failed got the stored answer without `collapsed`, as if each had asked
/// the providers itself.
#[tokio::test]
async fn a_stand_in_for_a_shared_fetch_that_failed_says_collapsed_to_its_joiners() {
    let stack = cached_stack("stale_if_error_s = 30\n[cache.ttl_s]\npost = 1").await;
    stack.get(POST).await.assert_success(false);
    stack.primary.reset().await;
    // Time enough for the second request to join the first's fetch, even
    // on a loaded machine; well inside the request timeout.
    let slow_failure = wiremock::ResponseTemplate::new(503).set_delay(Duration::from_millis(1500));
    stack.primary.respond_all(slow_failure).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let first = post_in_flight(&stack, None).await;
    let joined = stack.get(POST).await;
    joined.assert_success(false);
    assert!(cached(&joined), "{joined:?}");
    let status = cache_status(&joined);
    assert!(
        status.starts_with("socialgate; fwd=stale; ttl=-") && status.ends_with("; collapsed"),
        "{status}"
    );
    let first = first.await.expect("the request task finished");
    first.assert_success(false);
    let status = cache_status(&first);
    assert!(
        status.starts_with("socialgate; fwd=stale; ttl=-") && !status.contains("collapsed"),
        "{status}"
    );
    assert_eq!(stack.primary.request_count().await, 1, "one fetch for both");
}

#[tokio::test]
async fn a_fresh_answer_a_failed_refresh_falls_back_on_is_not_called_stale() {
    let stack = cached_stack("enabled = true").await;
    stack.get(PROFILE).await.assert_success(false);
    stack.primary.reset().await;
    stack.primary.fail_all(503).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let refresh = [
        ("X-API-Key", stack.key.as_str()),
        ("Cache-Control", "no-cache"),
    ];
    let a = send(&stack.server.base_url(), "GET", PROFILE, &refresh).await;
    a.assert_success(false);
    assert!(cached(&a), "{a:?}");
    let status = cache_status(&a);
    let left: i64 = status
        .strip_prefix("socialgate; fwd=request; ttl=")
        .and_then(|ttl| ttl.parse().ok())
        .unwrap_or_else(|| panic!("asked to refresh, stood in while fresh: {status}"));
    assert!((290..300).contains(&left), "{status}");
    // Still fresh: as long as a hit's, counted from the fetch.
    let age: i64 = a
        .header("age")
        .and_then(|t| t.parse().ok())
        .expect("an Age");
    let cache_control = a.header("cache-control").unwrap_or_default();
    assert_eq!(cache_control, format!("private, max-age={}", left + age));
    log_line_within(
        &stack.server,
        &["serving the stored answer the request asked to refresh"],
        Duration::from_secs(2),
    )
    .await;
    assert!(
        !stack.server.stderr().contains("past its time to live"),
        "not called expired"
    );
}

#[tokio::test]
async fn a_ttl_of_zero_or_a_disabled_cache_sends_every_request_upstream() {
    for cache in ["[cache.ttl_s]\nprofile = 0", "enabled = false"] {
        let stack = cached_stack(cache).await;
        for n in 1..=3 {
            let a = stack.get(PROFILE).await;
            a.assert_success(false);
            assert!(!cached(&a), "{cache}: {a:?}");
            assert_eq!(cache_status(&a), "socialgate; fwd=bypass", "{cache}");
            assert_eq!(stack.primary.request_count().await, n, "{cache}");
        }
    }
}

#[tokio::test]
async fn a_reload_keeps_what_is_stored() {
    let stack = cached_stack("enabled = true").await;
    let applied = await_watching(&stack.server, &stack.config).await;
    stack.get(PROFILE).await.assert_success(false);

    // Another time to live for new entries, another provider timeout.
    let text = stack
        .config
        .text()
        .replacen("timeout_ms = 2000", "timeout_ms = 2500", 1)
        .replacen(
            "[cache]\nenabled = true",
            "[cache]\nenabled = true\n[cache.ttl_s]\nprofile = 60",
            1,
        );
    replace_file(stack.config.path(), text);
    wait_for_log(&stack.server, APPLIED, applied + 1).await;

    let a = stack.get(PROFILE).await;
    assert!(cached(&a), "still stored after the reload: {a:?}");
    let status = cache_status(&a);
    let ttl: u64 = status
        .rsplit("ttl=")
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{status}"));
    assert!(
        ttl > 60,
        "the entry keeps the time to live it was stored with: {status}"
    );
    assert_eq!(stack.primary.request_count().await, 1);
}

/// Cache review, defect 2: an answer heavier than the store can hold is
/// not kept, and its `Cache-Status` does not say `stored`.
#[tokio::test]
async fn an_answer_too_big_to_keep_is_not_called_stored() {
    let stack = cached_stack("max_bytes = 300").await;
    for round in 1..=2 {
        let a = stack.get(PROFILE).await;
        a.assert_success(false);
        assert!(!cached(&a), "round {round}: {a:?}");
        assert_eq!(cache_status(&a), "socialgate; fwd=miss", "round {round}");
        assert_eq!(
            a.header("cache-control"),
            Some("private, max-age=0"),
            "round {round}: not kept, so fresh for no time"
        );
        assert_eq!(stack.primary.request_count().await, round);
    }
    let metrics = scrape(admin_addr(&stack.server)).await;
    assert_eq!(metrics.sum("socialgate_cache_bytes", &[]), Some(0.0));
}

#[tokio::test]
async fn a_flood_of_distinct_keys_stays_within_max_bytes() {
    /// What the cache may hold, and what the process may grow by beyond it
    /// (allocator slack, connection buffers, the metrics of a busy minute).
    const MAX_BYTES: u64 = 1024 * 1024;
    const OVERHEAD_KIB: u64 = 16 * 1024;
    let stack = cached_stack(&format!("max_bytes = {MAX_BYTES}")).await;
    stack.primary.reset().await;
    // Every username answers, so each is a new stored entry.
    stack
        .primary
        .respond(
            wiremock::Mock::given(wiremock::matchers::path("/v1/user/profile")),
            json_response(&fixtures::primary_user_profile()),
        )
        .await;
    let flood = |range: std::ops::Range<usize>| {
        let api = stack.api.clone();
        async move {
            for n in range {
                let a = api
                    .get(&format!("/v1/shortvideo/profile?username=user{n}"))
                    .await;
                assert_eq!(a.status, 200, "{a:?}");
            }
        }
    };
    flood(0..200).await;
    let before = Memory::of(stack.server.pid());
    let started = Instant::now();
    let workers: Vec<_> = (0..8)
        .map(|w| tokio::spawn(flood(200 + w * 500..200 + (w + 1) * 500)))
        .collect();
    for worker in workers {
        worker.await.expect("the flood finished");
    }
    let after = Memory::of(stack.server.pid());
    let metrics = scrape(admin_addr(&stack.server)).await;
    let cache_bytes = metrics
        .sum("socialgate_cache_bytes", &[])
        .expect("the gauge");
    assert!(cache_bytes <= MAX_BYTES as f64, "{cache_bytes}");
    let grown = after.rss.saturating_sub(before.rss);
    assert!(
        grown <= MAX_BYTES / 1024 + OVERHEAD_KIB,
        "RSS grew {grown} KiB over 4,000 distinct keys in {:?} ({before:?} -> {after:?})",
        started.elapsed()
    );
    assert_eq!(stack.primary.request_count().await, 4200);
}

#[tokio::test]
async fn an_abandoned_request_keeps_its_slot_while_its_shared_fetch_runs() {
    let upstream = RawUpstream::slow_primary_profile(Duration::from_secs(2));
    let stack = Stack::builder()
        .providers(&[PRIMARY])
        .search_order(None)
        .primary_url(&upstream.base_url())
        .timeout_ms(PRIMARY, 5000)
        .server_line("max_concurrent_requests = 2")
        .cache("enabled = true")
        .start()
        .await;
    let addr = stack.server.addr();
    // Distinct usernames: each request starts a fetch of its own, then its
    // caller hangs up.
    for n in 0..6 {
        let path = format!("/v1/shortvideo/profile?username=gone{n}");
        let headers = [("X-API-Key", stack.key.as_str())];
        hang_up_after(addr, &path, &headers, Duration::from_millis(50)).await;
    }
    stack.get(PROFILE).await.assert_error(503, "OVERLOADED");
    assert_eq!(upstream.in_flight(), 2, "the abandoned fetches still run");
    assert_eq!(upstream.request_count(), 2, "no more fetches than slots");
    assert!(
        eventually(Duration::from_secs(5), || async {
            upstream.in_flight() == 0
        })
        .await,
        "the fetches ended"
    );
    // Stored, though their callers left: answered without a fetch.
    let a = stack.get("/v1/shortvideo/profile?username=gone0").await;
    a.assert_success(false);
    assert!(cached(&a), "{a:?}");
    assert_eq!(upstream.request_count(), 2);
}

/// An endpoint's cache lifetime is its platform's description's
/// `cache_ttl_s`, unless `[cache.ttl_s]` sets one.
#[tokio::test]
async fn the_description_gives_the_default_ttl_and_the_config_overrides_it() {
    let scratch = socialgate_tests::paths::scratch_dir();
    let file = socialgate_tests::paths::description_copy(scratch.path(), |text| {
        text.replacen("cache_ttl_s = 300", "cache_ttl_s = 7", 1)
    });
    for (cache, expected) in [
        ("enabled = true", 7),
        ("enabled = true\n[cache.ttl_s]\nprofile = 9", 9),
    ] {
        let stack = Stack::builder()
            .providers(&[PRIMARY])
            .search_order(None)
            .cache(cache)
            .description(&file)
            .start()
            .await;
        stack.primary.serve_fixtures().await;
        stack.get(PROFILE).await.assert_success(false);
        let again = stack.get(PROFILE).await;
        assert!(cached(&again), "{again:?}");
        let control = again.header("cache-control").unwrap_or_default();
        let max_age: String = control
            .split("max-age=")
            .nth(1)
            .unwrap_or_default()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        assert_eq!(max_age, expected.to_string(), "{cache}: {again:?}");
    }
}
