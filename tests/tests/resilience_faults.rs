//! Failing upstreams, one fault at a time, and the request deadline (the
//! README's "How a request is served").
//!
//! The primary fails in one way per test; for each, with the fallback
//! healthy, the caller gets the fallback's data with 200 within the
//! primary's timeout plus the fallback's time; with the fallback failing
//! too, 502 `UPSTREAM_UNAVAILABLE`; and the server keeps answering. Faults
//! wiremock cannot express come from a raw-TCP double. Then the deadline:
//! `request_timeout_ms` running out is 504 `UPSTREAM_TIMEOUT` at once, while
//! providers that each fail (fast or by their own timeout) within a live
//! deadline are 502.

use std::time::Duration;

use serde_json::{json, Value};
use socialgate_tests::config::{standard_env, toml_str};
use socialgate_tests::config::{CHAOS, FALLBACK, PRIMARY, PRIMARY_KEY};
use socialgate_tests::raw_upstream::{closed_port, Behaviour, RawUpstream};
use socialgate_tests::tls_upstream::TlsFront;
use socialgate_tests::upstream::{
    fixtures, json_response, render, FALLBACK_FOLLOWERS, LUNA, PRIMARY_FOLLOWERS,
};
use socialgate_tests::{run_cli, Answer, FallbackMock, PrimaryMock, Stack};
use wiremock::ResponseTemplate;

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";
/// The contract's request for that profile (P1).
const P1_TARGET: &str = "/v1/user/profile?unique_id=lunabakes";

/// The primary's `timeout_ms` in the matrix.
const PRIMARY_TIMEOUT_MS: u64 = 600;
/// Slack for a debug build on a busy machine, on top of the timeout.
const MARGIN: Duration = Duration::from_millis(900);

/// How the primary fails in one case of the matrix.
enum Fault {
    /// The wiremock primary answers P1 with this.
    Wire(ResponseTemplate),
    /// The raw-TCP double stands in for the primary.
    Raw(Behaviour),
    /// The primary's `base_url` is a port where nothing listens.
    ConnectionRefused,
    /// The `chaos` plugin, first in the chain, panics in its step.
    PluginPanic,
}

/// What else a case needs.
#[derive(Clone, Copy, Default)]
struct Traits {
    /// Only the primary's timeout ends it.
    slow: bool,
    /// It opens the primary's breaker whatever the threshold (a 429): the
    /// server is restarted between the two halves so both reach it.
    opens_breaker: bool,
    /// The primary's `max_body_bytes`.
    max_body_bytes: Option<usize>,
}

/// The primary's profile fixture, padded past `size` bytes with a field the
/// contract says to ignore: valid, only too large.
fn padded_profile(size: usize) -> Vec<u8> {
    let mut body = fixtures::primary_user_profile();
    body["extra"]["padding"] = Value::String("x".repeat(size));
    render(&body).into_bytes()
}

fn primary_profile_bytes() -> Vec<u8> {
    render(&fixtures::primary_user_profile()).into_bytes()
}

const SMALL_CAP: usize = 16 * 1024;

fn assert_fallback_answered(case: &str, a: &Answer) {
    assert_eq!(a.status, 200, "[{case}] expected the fallback's 200: {a:?}");
    a.assert_success(false);
    assert_eq!(
        a.data()["followers"],
        FALLBACK_FOLLOWERS,
        "[{case}] the fallback's data: {a:?}"
    );
}

/// How many requests reached the primary's upstream; each must be the
/// contract's P1 with the primary's key.
async fn primary_requests(case: &str, stack: &Stack, raw: Option<&RawUpstream>) -> usize {
    match raw {
        Some(raw) => {
            for request in raw.requests() {
                assert_eq!(request.method, "GET", "[{case}] {request:?}");
                assert_eq!(request.target, P1_TARGET, "[{case}] the contract's P1");
                assert_eq!(
                    request.header("x-api-key"),
                    Some(PRIMARY_KEY),
                    "[{case}] {request:?}"
                );
            }
            raw.request_count()
        }
        None => stack.primary.requests_to("/v1/user/profile").await.len(),
    }
}

/// Runs one case of the matrix; every assertion names `case`.
async fn check(case: &str, fault: Fault, traits: Traits) {
    let raw = match &fault {
        Fault::Raw(behaviour) => Some(RawUpstream::start(behaviour.clone())),
        _ => None,
    };
    let refused = closed_port();
    let mut builder = Stack::builder()
        .search_order(None)
        .timeout_ms(PRIMARY, PRIMARY_TIMEOUT_MS)
        // The matrix asks the primary every time: keep failure counts off.
        .breaker(PRIMARY, 1000, 60_000)
        .breaker(FALLBACK, 1000, 60_000);
    builder = match &fault {
        Fault::Wire(_) => builder,
        Fault::Raw(_) => builder.primary_url(&raw.as_ref().expect("started").base_url()),
        Fault::ConnectionRefused => builder.primary_url(&format!("http://{refused}")),
        Fault::PluginPanic => builder
            .providers(&[CHAOS, FALLBACK])
            .chaos("panic_in_step")
            .timeout_ms(CHAOS, PRIMARY_TIMEOUT_MS)
            .breaker(CHAOS, 1000, 60_000),
    };
    if let Some(cap) = traits.max_body_bytes {
        builder = builder.provider_line(PRIMARY, &format!("max_body_bytes = {cap}"));
    }
    let reaches_primary = matches!(&fault, Fault::Wire(_) | Fault::Raw(_));
    let mut stack: Stack = builder.start().await;
    if let Fault::Wire(response) = fault {
        let route = stack
            .primary
            .route("/v1/user/profile", &[("unique_id", LUNA)]);
        stack.primary.respond(route, response).await;
    }
    let bound = Duration::from_millis(PRIMARY_TIMEOUT_MS) + MARGIN;
    let timeout = Duration::from_millis(PRIMARY_TIMEOUT_MS);

    // 1. The fallback answers, within the primary's timeout and its own time.
    stack.fallback.serve_fixtures().await;
    let (a, took) = stack.timed_get(PROFILE).await;
    assert_fallback_answered(case, &a);
    assert!(
        took < bound,
        "[{case}] failover took {took:?}, bound {bound:?}"
    );
    if traits.slow {
        assert!(
            took + Duration::from_millis(50) >= timeout,
            "[{case}] only the primary's timeout should end this fault, it took {took:?}"
        );
    } else {
        assert!(
            took < timeout,
            "[{case}] a failure that is not a timeout must not wait it out: {took:?}"
        );
    }
    if reaches_primary {
        assert_eq!(
            primary_requests(case, &stack, raw.as_ref()).await,
            1,
            "[{case}] the primary was asked once"
        );
    }

    // 2. The fallback fails too: 502, just as fast.
    if traits.opens_breaker {
        stack.restart();
    }
    stack.fallback.reset().await;
    stack.fallback.fail_all(503).await;
    let (a, took) = stack.timed_get(PROFILE).await;
    assert_eq!(
        (a.status, a.error_code()),
        (502, "UPSTREAM_UNAVAILABLE"),
        "[{case}] both failing: {a:?}"
    );
    a.assert_error(502, "UPSTREAM_UNAVAILABLE");
    a.assert_absent_exact(&stack.fallback.base_url());
    assert!(
        took < bound,
        "[{case}] the error took {took:?}, bound {bound:?}"
    );
    if reaches_primary {
        assert_eq!(
            primary_requests(case, &stack, raw.as_ref()).await,
            2,
            "[{case}] the primary was asked again"
        );
    }
    assert_eq!(
        stack.fallback.request_count().await,
        1,
        "[{case}] the fallback was asked"
    );

    // 3. The server stays up and serves again.
    assert!(stack.server.is_running(), "[{case}] the server is alive");
    let health = stack.api.with_key(None).get("/healthz").await;
    assert_eq!(health.status, 200, "[{case}] /healthz: {health:?}");
    stack.fallback.reset().await;
    stack.fallback.serve_fixtures().await;
    let a = stack.get(PROFILE).await;
    assert_fallback_answered(case, &a);
    assert!(stack.server.is_running(), "[{case}] the server is alive");
}

fn fast() -> Traits {
    Traits::default()
}

fn slow() -> Traits {
    Traits {
        slow: true,
        ..Traits::default()
    }
}

#[tokio::test]
async fn http_500() {
    check("HTTP 500", Fault::Wire(ResponseTemplate::new(500)), fast()).await;
}

#[tokio::test]
async fn http_503() {
    let response = ResponseTemplate::new(503)
        .insert_header("Retry-After", "5")
        .set_body_string("service unavailable");
    check("HTTP 503", Fault::Wire(response), fast()).await;
}

#[tokio::test]
async fn http_429_with_retry_after() {
    let response = ResponseTemplate::new(429)
        .insert_header("Retry-After", "30")
        .set_body_raw(r#"{"message":"quota exceeded"}"#, "application/json");
    let traits = Traits {
        opens_breaker: true,
        ..fast()
    };
    check("HTTP 429 with Retry-After", Fault::Wire(response), traits).await;
}

#[tokio::test]
async fn http_401() {
    let response = ResponseTemplate::new(401).set_body_string("invalid api key");
    check("HTTP 401", Fault::Wire(response), fast()).await;
}

#[tokio::test]
async fn connection_refused() {
    check("connection refused", Fault::ConnectionRefused, fast()).await;
}

#[tokio::test]
async fn connection_reset_mid_body() {
    let behaviour = Behaviour::ResetMidBody {
        body: primary_profile_bytes(),
    };
    check("connection reset mid-body", Fault::Raw(behaviour), fast()).await;
}

#[tokio::test]
async fn headers_never_come() {
    check("headers never come", Fault::Raw(Behaviour::Silent), slow()).await;
}

#[tokio::test]
async fn body_trickling_past_the_timeout() {
    // The whole fixture would take minutes at this pace.
    let behaviour = Behaviour::Trickle {
        body: primary_profile_bytes(),
        every: Duration::from_millis(50),
    };
    check(
        "body trickling past the timeout",
        Fault::Raw(behaviour),
        slow(),
    )
    .await;
}

#[tokio::test]
async fn invalid_json() {
    let response = ResponseTemplate::new(200)
        .set_body_raw(r#"{"status_code":0,"user":{"uid":"#, "application/json");
    check("invalid JSON", Fault::Wire(response), fast()).await;
}

#[tokio::test]
async fn html_error_page() {
    let page = "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head>\
                <body><h1>Bad Gateway</h1><hr>nginx</body></html>";
    let response = ResponseTemplate::new(200).set_body_raw(page, "text/html");
    check("HTML error page", Fault::Wire(response), fast()).await;
}

#[tokio::test]
async fn empty_body() {
    let response = ResponseTemplate::new(200).insert_header("content-type", "application/json");
    check("empty body", Fault::Wire(response), fast()).await;
}

#[tokio::test]
async fn body_over_the_cap_with_its_length_declared() {
    let behaviour = Behaviour::Respond {
        body: padded_profile(4 * SMALL_CAP),
    };
    let traits = Traits {
        max_body_bytes: Some(SMALL_CAP),
        ..fast()
    };
    check(
        "body over the cap (Content-Length)",
        Fault::Raw(behaviour),
        traits,
    )
    .await;
}

#[tokio::test]
async fn body_over_the_cap_streamed_without_a_length() {
    let behaviour = Behaviour::Chunked {
        body: padded_profile(4 * SMALL_CAP),
    };
    let traits = Traits {
        max_body_bytes: Some(SMALL_CAP),
        ..fast()
    };
    check("body over the cap (chunked)", Fault::Raw(behaviour), traits).await;
}

/// The control of the two cases above: the same padded body under a larger
/// cap is the primary's valid answer, so the cap alone failed it there.
#[tokio::test]
async fn the_padded_body_is_a_valid_answer_under_a_larger_cap() {
    let raw = RawUpstream::start(Behaviour::Chunked {
        body: padded_profile(4 * SMALL_CAP),
    });
    let stack = Stack::builder()
        .search_order(None)
        .primary_url(&raw.base_url())
        .provider_line(PRIMARY, &format!("max_body_bytes = {}", 16 * SMALL_CAP))
        .start()
        .await;
    let a = stack.get(PROFILE).await;
    a.assert_success(false);
    assert_eq!(
        a.data()["followers"],
        PRIMARY_FOLLOWERS,
        "the primary: {a:?}"
    );
    assert_eq!(stack.fallback.request_count().await, 0);
}

#[tokio::test]
async fn http_200_with_status_code_2098() {
    let response = json_response(&fixtures::primary_try_again());
    check("HTTP 200, status_code 2098", Fault::Wire(response), fast()).await;
}

#[tokio::test]
async fn http_200_with_an_unknown_non_zero_status_code() {
    let body = json!({"status_code": 10_000, "status_msg": "system busy"});
    check(
        "HTTP 200, status_code 10000",
        Fault::Wire(json_response(&body)),
        fast(),
    )
    .await;
}

#[tokio::test]
async fn soft_block_status_0_without_user() {
    let response = json_response(&fixtures::primary_soft_block());
    check(
        "soft block (status_code 0, no user)",
        Fault::Wire(response),
        fast(),
    )
    .await;
}

#[tokio::test]
async fn plugin_panic() {
    check("plugin panic", Fault::PluginPanic, fast()).await;
}

// ---- The request deadline ----

/// A provider that cannot answer within the request's deadline is of no use
/// to the request: the cut counts against its breaker, so a deadline shorter
/// than a hanging provider's own timeout cannot switch failover off.
#[tokio::test]
async fn a_deadline_shorter_than_a_slow_primary_is_504_at_once_and_counts_against_it() {
    let stack = Stack::builder()
        .search_order(None)
        .server_line("request_timeout_ms = 500")
        .timeout_ms(PRIMARY, 3000)
        .breaker(PRIMARY, 1, 60_000)
        .start()
        .await;
    let slow = json_response(&fixtures::primary_user_profile()).set_delay(Duration::from_secs(2));
    let route = stack
        .primary
        .route("/v1/user/profile", &[("unique_id", LUNA)]);
    stack.primary.respond(route, slow).await;
    stack.fallback.serve_fixtures().await;

    let (a, took) = stack.timed_get(PROFILE).await;
    a.assert_error(504, "UPSTREAM_TIMEOUT");
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(500) + MARGIN,
        "504 when the 500 ms deadline ends, not the 2 s answer: took {took:?}"
    );
    assert_eq!(
        stack.fallback.request_count().await,
        0,
        "no attempt starts past the deadline"
    );

    // With its breaker open, the next request goes straight to the fallback.
    let primary_before = stack.primary.request_count().await;
    let (a, took) = stack.timed_get(PROFILE).await;
    a.assert_success(false);
    assert_eq!(a.data()["followers"], FALLBACK_FOLLOWERS, "{a:?}");
    assert!(took < MARGIN, "no wait on the slow primary: took {took:?}");
    assert_eq!(
        stack.primary.request_count().await,
        primary_before,
        "the primary is skipped"
    );
}

#[tokio::test]
async fn a_deadline_running_out_during_the_fallback_is_504() {
    let stack = Stack::builder()
        .search_order(None)
        .server_line("request_timeout_ms = 500")
        .timeout_ms(FALLBACK, 3000)
        .start()
        .await;
    stack.primary.fail_all(500).await;
    let slow = json_response(&fixtures::fallback_user_info()).set_delay(Duration::from_secs(2));
    let route = stack.fallback.route("/user/info", &[("unique_id", LUNA)]);
    stack.fallback.respond(route, slow).await;

    let (a, took) = stack.timed_get(PROFILE).await;
    a.assert_error(504, "UPSTREAM_TIMEOUT");
    assert!(took < Duration::from_millis(500) + MARGIN, "took {took:?}");
    assert_eq!(stack.primary.request_count().await, 1);
    assert_eq!(stack.fallback.request_count().await, 1);
}

#[tokio::test]
async fn providers_failing_fast_within_a_live_deadline_are_502() {
    let stack = Stack::builder()
        .search_order(None)
        .server_line("request_timeout_ms = 3000")
        .start()
        .await;
    stack.primary.fail_all(500).await;
    stack.fallback.fail_all(503).await;
    let (a, took) = stack.timed_get(PROFILE).await;
    a.assert_error(502, "UPSTREAM_UNAVAILABLE");
    assert!(took < MARGIN, "both fail fast: took {took:?}");
    assert_eq!(stack.primary.request_count().await, 1);
    assert_eq!(stack.fallback.request_count().await, 1);
}

#[tokio::test]
async fn providers_timing_out_on_their_own_within_a_live_deadline_are_502() {
    let stack = Stack::builder()
        .search_order(None)
        .server_line("request_timeout_ms = 5000")
        .timeout_ms(PRIMARY, 300)
        .timeout_ms(FALLBACK, 300)
        .start()
        .await;
    let late = Duration::from_secs(3);
    let route = stack
        .primary
        .route("/v1/user/profile", &[("unique_id", LUNA)]);
    let answer = json_response(&fixtures::primary_user_profile()).set_delay(late);
    stack.primary.respond(route, answer).await;
    let route = stack.fallback.route("/user/info", &[("unique_id", LUNA)]);
    let answer = json_response(&fixtures::fallback_user_info()).set_delay(late);
    stack.fallback.respond(route, answer).await;

    let (a, took) = stack.timed_get(PROFILE).await;
    a.assert_error(502, "UPSTREAM_UNAVAILABLE");
    assert!(
        took >= Duration::from_millis(550) && took < Duration::from_millis(600) + MARGIN,
        "two 300 ms timeouts, well inside the 5 s deadline: took {took:?}"
    );
}

/// `[server] upstream_proxy`: upstream requests go to the proxy and nowhere
/// else, in absolute form for an `http://` upstream, with the proxy URL's
/// credentials as `Proxy-Authorization`; the upstream key still reaches the
/// upstream, and the answer is the primary's. (The double plays the proxy
/// and answers as the upstream would; the upstream's host does not resolve,
/// so only the proxy can have reached it.)
#[tokio::test]
async fn upstream_requests_go_through_the_configured_proxy() {
    let proxy = RawUpstream::start(Behaviour::Respond {
        body: render(&fixtures::primary_user_profile()).into_bytes(),
    });
    let upstream = "http://primary.upstream.invalid:8080";
    let stack = Stack::builder()
        .search_order(None)
        .primary_url(upstream)
        .server_line(&format!(
            "upstream_proxy = \"http://gate:s3cret@{}\"",
            proxy.addr()
        ))
        .start()
        .await;
    let a = stack.get(PROFILE).await;
    a.assert_success(false);
    assert_eq!(a.data()["followers"], PRIMARY_FOLLOWERS, "{a:?}");
    assert_eq!(stack.fallback.request_count().await, 0);

    let requests = proxy.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    let request = &requests[0];
    assert_eq!(request.method, "GET");
    assert_eq!(request.target, format!("{upstream}{P1_TARGET}"));
    // base64("gate:s3cret")
    assert_eq!(
        request.header("proxy-authorization"),
        Some("Basic Z2F0ZTpzM2NyZXQ=")
    );
    assert_eq!(request.header("x-api-key"), Some(PRIMARY_KEY));
    // The proxy's credentials are no one else's business.
    assert!(
        !stack.server.stderr().contains("s3cret"),
        "the proxy's password is in the log"
    );
}

/// Operator sweep: a proxy refusing the credentials, or not there, was
/// logged as the upstream's failure ("unexpected upstream HTTP 407",
/// "tcp connect error"); the lines now say the proxy is at fault. (The
/// fallback goes through the same proxy: the answer is a 502.)
#[tokio::test]
async fn a_failing_proxy_is_named_as_the_proxy() {
    let refusing = RawUpstream::start(Behaviour::Refuse {
        status_line: "407 Proxy Authentication Required",
    });
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let gone = closed.local_addr().expect("an address");
    drop(closed);
    for (proxy, said) in [
        (
            refusing.addr().to_string(),
            "the upstream proxy refused its credentials",
        ),
        (
            gone.to_string(),
            "request through the upstream proxy failed",
        ),
    ] {
        let stack = Stack::builder()
            .search_order(None)
            .primary_url("http://primary.upstream.invalid:8080")
            .server_line(&format!("upstream_proxy = \"http://gate:s3cret@{proxy}\""))
            .start()
            .await;
        let a = stack.get(PROFILE).await;
        a.assert_error(502, "UPSTREAM_UNAVAILABLE");
        let line = socialgate_tests::operator::log_line_within(
            &stack.server,
            &["attempt failed", said],
            Duration::from_secs(5),
        )
        .await;
        assert!(line.contains("kind=transient"), "{line}");
        assert!(
            !stack.server.stderr().contains("s3cret"),
            "the proxy's password is in the log"
        );
    }
}

/// An `https://` upstream whose certificate comes from a private CA:
/// trusted once `upstream_ca_file` names that CA, over one TLS connection
/// kept alive; refused without it (the fallback answers, the primary never
/// sees a request). A CA file that cannot be used is a config error.
#[tokio::test]
async fn https_upstreams_under_a_private_ca_are_trusted_through_upstream_ca_file() {
    let primary = PrimaryMock::start().await;
    primary.serve_fixtures().await;
    let front = TlsFront::start(primary.address().parse().expect("an address")).await;
    let ca_dir = tempfile::tempdir().expect("a folder");
    let ca_file = ca_dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, front.ca_pem()).expect("can write");
    let ca_line = format!(
        "upstream_ca_file = {}",
        toml_str(&ca_file.display().to_string())
    );

    let trusting = Stack::builder()
        .search_order(None)
        .primary_url(&front.base_url())
        .server_line(&ca_line)
        .start()
        .await;
    for _ in 0..3 {
        let a = trusting.get(PROFILE).await;
        a.assert_success(false);
        assert_eq!(a.data()["followers"], PRIMARY_FOLLOWERS, "{a:?}");
    }
    assert_eq!(trusting.fallback.request_count().await, 0);
    let requests = primary.requests().await;
    assert_eq!(requests.len(), 3);
    for request in &requests {
        let key = request.headers.get("x-api-key").map(|v| v.as_bytes());
        assert_eq!(key, Some(PRIMARY_KEY.as_bytes()), "{request:?}");
    }
    assert_eq!(front.connections(), 1, "one TLS connection, kept alive");

    let untrusting = Stack::builder()
        .search_order(None)
        .primary_url(&front.base_url())
        .start()
        .await;
    untrusting.fallback.serve_fixtures().await;
    let a = untrusting.get(PROFILE).await;
    a.assert_success(false);
    assert_eq!(a.data()["followers"], FALLBACK_FOLLOWERS, "{a:?}");
    assert_eq!(primary.request_count().await, 3, "no request without trust");
    assert_eq!(front.connections(), 2, "the handshake was tried");

    let fallback = FallbackMock::start().await;
    std::fs::write(ca_dir.path().join("empty.pem"), "not a certificate\n").expect("can write");
    for (file, needle) in [
        ("missing.pem", "cannot read"),
        ("empty.pem", "no PEM certificate"),
    ] {
        let path = ca_dir.path().join(file).display().to_string();
        let config = Stack::builder()
            .server_line(&format!("upstream_ca_file = {}", toml_str(&path)))
            .config(&primary, &fallback)
            .write();
        let check = run_cli(&config, &standard_env(), &["check"]);
        let line = check.refusal_line(file);
        assert!(
            line.contains("upstream_ca_file") && line.contains(needle),
            "{file}: {line}"
        );
    }
}
