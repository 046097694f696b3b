//! Metrics on the admin listener: after a failover, `/metrics` counts it
//! with the provider that failed as `from_provider`, next to the request,
//! attempt, breaker, reload, latency and credit series; caller input is
//! never a label (an unknown path segment is `unknown`), and no secret and
//! no username appears anywhere in the text. The public listener never
//! serves them. A request whose caller hangs up while its upstream work
//! runs is logged once with its request ID and counted.

use std::time::{Duration, Instant};

use socialgate_tests::config::{FALLBACK, FALLBACK_KEY, PRIMARY, PRIMARY_KEY};
use socialgate_tests::operator::{
    admin_addr, admin_get, hang_up_after, log_line_within, scrape, signal, Metrics,
};
use socialgate_tests::upstream::{fixtures, json_response, LUNA};
use socialgate_tests::Stack;

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";
const SEARCH: &str = "/v1/shortvideo/search?query=luna";
/// A username that only ever appears in a request.
const SECRET_USER: &str = "zq_private_handle_7";

fn at_least(m: &Metrics, name: &str, labels: &[(&str, &str)], min: f64) -> f64 {
    let value = m
        .sum(name, labels)
        .unwrap_or_else(|| panic!("no {name} with {labels:?} in:\n{}", m.text));
    assert!(
        value >= min,
        "{name}{labels:?} is {value}, expected at least {min}:\n{}",
        m.text
    );
    value
}

#[tokio::test]
async fn a_failover_is_counted_with_the_failed_provider_and_no_secret_is_exported() {
    let stack = Stack::start().await;
    stack.primary.fail_all(500).await;
    stack.fallback.serve_fixtures().await;
    stack.fallback.fail_all(500).await;
    let admin = admin_addr(&stack.server);

    // Five failovers open the primary's breaker (5 consecutive failures).
    for _ in 0..5 {
        stack.get(PROFILE).await.assert_success(false);
    }
    stack.get(SEARCH).await.assert_success(true);
    stack
        .get(&format!("/v1/shortvideo/profile?username={SECRET_USER}"))
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
    stack
        .get("/v1/nosuchplatform/profile?username=lunabakes")
        .await
        .assert_error(404, "PLATFORM_NOT_FOUND");
    stack
        .get("/v1/shortvideo/nosuchendpoint")
        .await
        .assert_error(404, "ENDPOINT_NOT_FOUND");
    stack
        .get("/v1/shortvideo/posts?username=lunabakes&count=999")
        .await
        .assert_invalid("count");
    assert_eq!(stack.get("/v1/account").await.status, 200);

    let m = scrape(admin).await;
    let profile = [("platform", "shortvideo"), ("endpoint", "profile")];
    at_least(
        &m,
        "socialgate_failovers_total",
        &[
            ("platform", "shortvideo"),
            ("endpoint", "profile"),
            ("from_provider", PRIMARY),
        ],
        5.0,
    );
    assert_eq!(
        m.sum("socialgate_failovers_total", &[("from_provider", FALLBACK)]),
        None,
        "the fallback answered or was last: never a failover from it"
    );
    at_least(
        &m,
        "socialgate_requests_total",
        &[profile[0], profile[1], ("status", "200")],
        5.0,
    );
    at_least(
        &m,
        "socialgate_requests_total",
        &[profile[0], profile[1], ("status", "502")],
        1.0,
    );
    at_least(
        &m,
        "socialgate_requests_total",
        &[
            ("platform", "shortvideo"),
            ("endpoint", "posts"),
            ("status", "400"),
        ],
        1.0,
    );
    // A key's account is of no platform, and not an unknown path.
    at_least(
        &m,
        "socialgate_requests_total",
        &[
            ("platform", "-"),
            ("endpoint", "account"),
            ("status", "200"),
        ],
        1.0,
    );
    // Unknown path segments are `unknown`, never the caller's text.
    at_least(
        &m,
        "socialgate_requests_total",
        &[
            ("platform", "unknown"),
            ("endpoint", "profile"),
            ("status", "404"),
        ],
        1.0,
    );
    at_least(
        &m,
        "socialgate_requests_total",
        &[
            ("platform", "shortvideo"),
            ("endpoint", "unknown"),
            ("status", "404"),
        ],
        1.0,
    );
    assert_eq!(
        m.sum(
            "socialgate_upstream_attempts_total",
            &[("provider", PRIMARY), ("outcome", "transient")]
        ),
        Some(5.0),
        "five failed attempts of the primary, then its breaker skips it:\n{}",
        m.text
    );
    at_least(
        &m,
        "socialgate_upstream_attempts_total",
        &[("provider", FALLBACK), ("outcome", "ok")],
        6.0,
    );
    assert_eq!(
        m.sum("socialgate_breaker_open", &[("provider", PRIMARY)]),
        Some(1.0),
        "the primary's breaker is open:\n{}",
        m.text
    );
    assert_eq!(
        m.sum("socialgate_breaker_open", &[("provider", FALLBACK)]),
        Some(0.0),
        "the fallback's breaker is closed:\n{}",
        m.text
    );
    // Latency histograms: buckets up to +Inf, with a count per series.
    at_least(
        &m,
        "socialgate_request_duration_seconds_bucket",
        &[profile[0], profile[1], ("le", "+Inf")],
        5.0,
    );
    at_least(
        &m,
        "socialgate_request_duration_seconds_count",
        &profile,
        5.0,
    );
    at_least(
        &m,
        "socialgate_upstream_attempt_duration_seconds_bucket",
        &[("provider", PRIMARY), ("le", "+Inf")],
        5.0,
    );
    assert!(
        m.matching("socialgate_upstream_attempt_duration_seconds_bucket", &[])
            .len()
            > 2,
        "an attempt histogram has several buckets:\n{}",
        m.text
    );
    // Six answers were delivered, one credit each.
    assert_eq!(
        m.sum("socialgate_credits_total", &[]),
        Some(6.0),
        "{}",
        m.text
    );
    // Log lines dropped because stderr fell behind: none, to a file.
    assert_eq!(
        m.sum("socialgate_log_lines_dropped_total", &[]),
        Some(0.0),
        "{}",
        m.text
    );

    // A reload by SIGHUP is counted.
    signal(&stack.server, "HUP");
    let deadline = Instant::now() + Duration::from_secs(5);
    let m = loop {
        let m = scrape(admin).await;
        if m.sum("socialgate_reloads_total", &[("result", "ok")]) >= Some(1.0) {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "no socialgate_reloads_total{{result=\"ok\"}} after SIGHUP:\n{}",
            m.text
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // Nothing secret, nothing a caller typed.
    for needle in [
        stack.key.as_str(),
        PRIMARY_KEY,
        FALLBACK_KEY,
        "lunabakes",
        SECRET_USER,
        "nosuchplatform",
        "nosuchendpoint",
    ] {
        assert!(
            !m.text.contains(needle),
            "/metrics must not contain {needle:?}:\n{}",
            m.text
        );
    }
    for sample in &m.samples {
        for (name, value) in &sample.labels {
            assert!(
                !matches!(
                    name.as_str(),
                    "key" | "api_key" | "username" | "user" | "query"
                ),
                "label `{name}` on {}",
                sample.name
            );
            assert_ne!(
                value, "e2e",
                "the key's name is a label value of {}",
                sample.name
            );
        }
    }
    let names: std::collections::BTreeSet<&str> =
        m.samples.iter().map(|s| s.name.as_str()).collect();
    for wanted in [
        "socialgate_requests_total",
        "socialgate_upstream_attempts_total",
        "socialgate_failovers_total",
        "socialgate_breaker_open",
        "socialgate_reloads_total",
        "socialgate_credits_total",
        "socialgate_request_duration_seconds_bucket",
        "socialgate_upstream_attempt_duration_seconds_bucket",
    ] {
        assert!(names.contains(wanted), "{wanted} is missing: {names:?}");
    }
}

#[tokio::test]
async fn metrics_are_served_only_on_the_admin_listener() {
    let stack = Stack::start().await;
    stack.primary.serve_fixtures().await;
    let admin = admin_addr(&stack.server);
    assert_ne!(admin.port(), stack.server.addr().port());
    stack.get(PROFILE).await.assert_success(false);

    for key in [None, Some(stack.key.as_str())] {
        let a = stack.api.with_key(key).get("/metrics").await;
        assert!(
            matches!(a.status, 401 | 404),
            "the public listener must not serve /metrics: {a:?}"
        );
        assert!(!a.text.contains("socialgate_"), "{a:?}");
        a.assert_absent(PRIMARY);
    }
    let (status, text) = admin_get(admin, "GET", "/metrics").await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("socialgate_requests_total"), "{text}");
    let refused =
        socialgate_tests::operator::send(&format!("http://{admin}"), "POST", "/metrics", &[]).await;
    assert_eq!(refused.status, 405);
    assert_eq!(refused.header("allow"), Some("GET, HEAD"), "{refused:?}");
    let (status, text) = admin_get(admin, "HEAD", "/metrics").await;
    assert_eq!(
        (status, text.as_str()),
        (200, ""),
        "HEAD is GET without a body"
    );
    let (status, _) = admin_get(admin, "GET", "/v1/shortvideo/profile").await;
    assert_eq!(status, 404, "the admin listener serves no API");
}

#[tokio::test]
async fn an_abandoned_request_is_logged_with_its_request_id_and_counted() {
    const ID: &str = "gone-7f3a9c";
    let stack = Stack::builder()
        .search_order(None)
        .timeout_ms(PRIMARY, 5000)
        .start()
        .await;
    let slow = json_response(&fixtures::primary_user_profile()).set_delay(Duration::from_secs(1));
    let route = stack
        .primary
        .route("/v1/user/profile", &[("unique_id", LUNA)]);
    stack.primary.respond(route, slow).await;
    let admin = admin_addr(&stack.server);
    // A caller that waits for its answer is not abandoned.
    stack.get(PROFILE).await.assert_success(false);

    let headers = [("X-API-Key", stack.key.as_str()), ("X-Request-Id", ID)];
    hang_up_after(
        stack.server.addr(),
        PROFILE,
        &headers,
        Duration::from_millis(50),
    )
    .await;
    let line = log_line_within(&stack.server, &[ID, "hung up"], Duration::from_secs(5)).await;
    assert!(!line.contains(&stack.key), "no key in the log: {line}");
    let m = scrape(admin).await;
    assert_eq!(
        m.sum("socialgate_requests_abandoned_total", &[]),
        Some(1.0),
        "{}",
        m.text
    );
    assert_eq!(
        stack.server.stderr().matches(ID).count(),
        1,
        "one line: {}",
        stack.server.stderr()
    );
}
