//! The caller never learns which provider answered: no provider name,
//! upstream address, upstream status or upstream message in any body or
//! header, in answers and in errors alike. An upstream key that an upstream
//! echoes back, or a plugin quotes, reaches neither the caller nor the log.

use std::time::Duration;

use socialgate_tests::api::with_cursor;
use socialgate_tests::config::{ConfigBuilder, FALLBACK_KEY, PRIMARY_KEY};
use socialgate_tests::operator::log_line_within;
use socialgate_tests::paths::{self, display};
use socialgate_tests::reload::log_lines;
use socialgate_tests::upstream::{fixtures, LUNA, POST_ID};
use socialgate_tests::{eventually, issue_key, Answer, Api, Server, Stack};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

const PATHS: [&str; 5] = [
    "/v1/shortvideo/profile?username=lunabakes",
    "/v1/shortvideo/posts?username=lunabakes",
    "/v1/shortvideo/post?id=7312345678901234567",
    "/v1/shortvideo/comments?id=7312345678901234567&count=3",
    "/v1/shortvideo/search?query=luna",
];

/// Names and addresses that would give a provider away, in any case.
fn names(stack: &Stack) -> Vec<String> {
    let mut t: Vec<String> = [
        "primary",
        "fallback",
        "shortvideo-primary",
        "shortvideo_fallback",
        "rapidapi",
        "127.0.0.1",
        "upstream-trace-marker",
        "status_code",
        "status_msg",
        "processed_time",
        PRIMARY_KEY,
        FALLBACK_KEY,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for upstream in [&*stack.primary, &*stack.fallback] {
        t.push(upstream.address());
        t.push(format!("localhost:{}", upstream.port()));
    }
    t
}

/// The upstreams' own messages, exactly as they send them.
const UPSTREAM_MESSAGES: [&str; 5] = [
    "Try again later.",
    "User doesn't exist",
    "This video is unavailable",
    "Url parsing is failed",
    "Free Api Limit",
];

fn assert_no_trace(stack: &Stack, answers: &[Answer]) {
    let names = names(stack);
    for a in answers {
        for name in &names {
            a.assert_absent(name);
        }
        for message in UPSTREAM_MESSAGES {
            a.assert_absent_exact(message);
        }
        if matches!(
            a.error_code(),
            "RESOURCE_NOT_FOUND" | "UPSTREAM_UNAVAILABLE"
        ) {
            // Upstream statuses are not passed on in words either.
            let message = a.error_message();
            for status in ["500", "503", "429", "401", "2065", "2053", "2098"] {
                assert!(!message.contains(status), "message names {status}: {a:?}");
            }
        }
    }
}

#[tokio::test]
async fn answers_from_either_provider_carry_no_trace() {
    let stack = Stack::start().await;
    stack.primary.serve_fixtures().await;
    stack.fallback.serve_fixtures().await;
    let mut answers = Vec::new();
    for path in PATHS {
        answers.push(stack.get(path).await);
    }
    stack.primary.reset().await;
    stack.primary.fail_all(500).await;
    for path in PATHS {
        answers.push(stack.get(path).await);
    }
    for a in &answers {
        assert_eq!(a.status, 200, "{a:?}");
    }
    assert_no_trace(&stack, &answers);
}

#[tokio::test]
async fn not_found_from_either_provider_carries_no_trace() {
    let stack = Stack::start().await;
    stack
        .primary
        .profile(LUNA, &fixtures::primary_user_not_found())
        .await;
    stack
        .primary
        .detail(POST_ID, &fixtures::primary_detail_null())
        .await;
    stack
        .primary
        .comments(POST_ID, 3, 0, &fixtures::primary_video_unavailable())
        .await;
    let mut answers = Vec::new();
    for path in &PATHS[..4] {
        answers.push(stack.get(path).await);
    }
    stack.primary.reset().await;
    stack.primary.fail_all(500).await;
    let user_gone = fixtures::fallback_user_not_found();
    let video_gone = fixtures::fallback_video_not_found();
    stack.fallback.user_info(LUNA, &user_gone).await;
    stack.fallback.user_posts(LUNA, 10, "0", &user_gone).await;
    stack.fallback.video(POST_ID, &video_gone).await;
    stack.fallback.comments(POST_ID, 3, 0, &video_gone).await;
    stack.fallback.search("luna", 10, "0", &user_gone).await;
    for path in &PATHS[..4] {
        answers.push(stack.get(path).await);
    }
    for a in &answers {
        a.assert_error(404, "RESOURCE_NOT_FOUND");
    }
    answers.push(stack.get(PATHS[4]).await);
    assert_no_trace(&stack, &answers);
}

#[tokio::test]
async fn upstream_failures_carry_no_trace() {
    let stack = Stack::builder().breaker_failures(100).start().await;
    let mut answers = Vec::new();
    stack
        .primary
        .answer_all(&fixtures::primary_try_again())
        .await;
    stack
        .fallback
        .answer_all(&fixtures::fallback_rate_limit())
        .await;
    for path in PATHS {
        answers.push(stack.get(path).await);
    }
    for (p, f) in [(500, 503), (429, 401), (503, 500)] {
        stack.primary.reset().await;
        stack.fallback.reset().await;
        stack.primary.fail_all(p).await;
        stack.fallback.fail_all(f).await;
        for path in PATHS {
            answers.push(stack.get(path).await);
        }
    }
    for a in &answers {
        a.assert_error(502, "UPSTREAM_UNAVAILABLE");
    }
    assert_no_trace(&stack, &answers);
}

#[tokio::test]
async fn refusals_and_cursors_carry_no_trace() {
    let stack = Stack::start().await;
    stack.primary.serve_fixtures().await;
    let mut answers = vec![
        stack.api.with_key(None).get(PATHS[0]).await,
        stack.api.with_key(Some("bogus")).get(PATHS[0]).await,
        stack.api.request("POST", PATHS[0]).await,
        stack.get("/v1/instagram/profile?username=x").await,
        stack.get("/v1/shortvideo/nope").await,
        stack
            .get("/v1/shortvideo/profile?username=bad%20name")
            .await,
        stack
            .get("/v1/shortvideo/posts?username=lunabakes&cursor=forged")
            .await,
    ];
    let comments = stack.get(PATHS[3]).await;
    let cursor = comments.next_cursor().expect("811 comments exist");
    for name in names(&stack) {
        assert!(
            !cursor.to_lowercase().contains(&name.to_lowercase()),
            "{name:?} in {cursor}"
        );
    }
    // The issuer of a cursor failing: 502, still without a trace.
    stack.primary.reset().await;
    stack.primary.fail_all(500).await;
    answers.push(stack.get(&with_cursor(PATHS[3], &cursor)).await);
    assert_eq!(answers.last().map(|a| a.status), Some(502));
    answers.push(comments);
    assert_no_trace(&stack, &answers);
}

/// Answers with `template`, `{key}` replaced by the value of the request
/// header `header`: an upstream echoing our key back.
struct EchoKey {
    header: &'static str,
    template: &'static str,
}

impl Respond for EchoKey {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let key = request
            .headers
            .get(self.header)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("no key received");
        ResponseTemplate::new(200)
            .set_body_raw(self.template.replace("{key}", key), "application/json")
    }
}

#[tokio::test]
async fn a_key_echoed_by_an_upstream_never_reaches_the_log() {
    // Debug logging too: every line the service can write.
    let stack = Stack::builder()
        .breaker_failures(1000)
        .env("SOCIALGATE_LOG", "debug")
        .start()
        .await;
    // Two profiles per upstream: the key where a number is wanted at the
    // top of the body, and deeper, where a list or an object is wanted.
    let cases: [(&str, &str, &str); 2] = [
        (
            LUNA,
            r#"{"status_code":"{key}"}"#,
            r#"{"code":"{key}","msg":"success"}"#,
        ),
        (
            "lunaecho",
            r#"{"status_code":0,"user":{"unique_id":"lunaecho","nickname":"Echo","follower_count":1,"avatar_larger":{"url_list":"{key}"}}}"#,
            r#"{"code":0,"msg":"success","data":{"user":"{key}","stats":{}}}"#,
        ),
    ];
    for (username, primary_body, fallback_body) in cases {
        let route = stack
            .primary
            .route("/v1/user/profile", &[("unique_id", username)]);
        let echo = EchoKey {
            header: "x-api-key",
            template: primary_body,
        };
        stack.primary.respond_with(route, echo).await;
        let route = stack
            .fallback
            .route("/user/info", &[("unique_id", username)]);
        let echo = EchoKey {
            header: "x-rapidapi-key",
            template: fallback_body,
        };
        stack.fallback.respond_with(route, echo).await;
    }
    for (username, _, _) in cases {
        let a = stack
            .get(&format!("/v1/shortvideo/profile?username={username}"))
            .await;
        a.assert_error(502, "UPSTREAM_UNAVAILABLE");
        a.assert_absent_exact(PRIMARY_KEY);
        a.assert_absent_exact(FALLBACK_KEY);
    }
    assert_eq!(stack.primary.requests_to("/v1/user/profile").await.len(), 2);
    assert_eq!(stack.fallback.requests_to("/user/info").await.len(), 2);

    // Each of the four echoes was read and refused, and the log says so
    // without quoting it.
    let failed = || log_lines(&stack.server, "attempt failed").len();
    eventually(Duration::from_secs(5), || async { failed() >= 4 }).await;
    let stderr = stack.server.stderr();
    assert_eq!(failed(), 4, "each echo is a failed attempt:\n{stderr}");
    assert!(
        !log_lines(&stack.server, "upstream request").is_empty(),
        "debug lines are written (each upstream URL):\n{stderr}"
    );
    for key in [PRIMARY_KEY, FALLBACK_KEY] {
        assert!(
            !stderr.contains(key),
            "an upstream key echoed back reached the log: {key}\n{stderr}"
        );
    }
}

/// A plugin that quotes its own key in an error message (the `leaky` test
/// plugin does, when its upstream refuses it) gets no further: the host
/// takes every key it handed out of what plugins say.
#[tokio::test]
async fn a_key_a_plugin_quotes_in_its_error_never_reaches_the_log() {
    const LEAKY_KEY_ENV: &str = "LEAKY_UPSTREAM_KEY";
    const LEAKY_KEY: &str = "lk-test-quoted-4f1e9a";
    paths::require_plugin("leaky_plugin");
    let upstream = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(401))
        .mount(&upstream)
        .await;
    let library = paths::plugin_library("leaky_plugin");
    let config = ConfigBuilder::new()
        .platform("leaky", "live", &["leaky"])
        .provider("leaky", &display(&library), &upstream.uri(), LEAKY_KEY_ENV)
        .write();
    let env = vec![(LEAKY_KEY_ENV.to_owned(), LEAKY_KEY.to_owned())];
    let key = issue_key(&config, "caller");
    let server = Server::start_with(&config, &env, &[]);
    let api = Api::new(&server.base_url(), Some(&key));

    let a = api.get("/v1/leaky/profile?username=luna").await;
    a.assert_error(502, "UPSTREAM_UNAVAILABLE");
    a.assert_absent_exact(LEAKY_KEY);
    let line = log_line_within(
        &server,
        &["attempt failed", "upstream refused Bearer [redacted]"],
        Duration::from_secs(5),
    )
    .await;
    assert!(!line.contains(LEAKY_KEY), "{line}");
    let stderr = server.stderr();
    assert!(
        !stderr.contains(LEAKY_KEY),
        "a key a plugin quoted reached the log:\n{stderr}"
    );
}

/// An upstream that echoes our key into a text field the plugin passes on
/// (here the nickname) would hand it to the caller: that answer is refused
/// as a bad response, and the next provider answers.
#[tokio::test]
async fn a_key_echoed_into_an_answer_never_reaches_the_caller() {
    let stack = Stack::start().await;
    stack.fallback.serve_fixtures().await;
    let mut body = fixtures::primary_user_profile();
    body["user"]["nickname"] = serde_json::json!("{key}");
    let template: &'static str = Box::leak(body.to_string().into_boxed_str());
    let route = stack
        .primary
        .route("/v1/user/profile", &[("unique_id", LUNA)]);
    let echo = EchoKey {
        header: "x-api-key",
        template,
    };
    stack.primary.respond_with(route, echo).await;

    let a = stack.get(PATHS[0]).await;
    a.assert_success(false);
    a.assert_absent_exact(PRIMARY_KEY);
    assert_eq!(stack.primary.requests_to("/v1/user/profile").await.len(), 1);
    assert_eq!(
        stack.fallback.request_count().await,
        1,
        "the fallback answered"
    );
    let line = log_line_within(
        &stack.server,
        &["attempt failed", "holds the upstream key"],
        Duration::from_secs(5),
    )
    .await;
    assert!(!line.contains(PRIMARY_KEY), "{line}");
}

/// Abuse sweep: the key echoed URL-encoded (into a URL the plugin passes
/// on) reached callers. (Every other spelling, JSON escapes included, is
/// plugin-api's `secret` tests'.)
#[tokio::test]
async fn a_key_echoed_url_encoded_into_an_answer_never_reaches_the_caller() {
    let stack = Stack::start().await;
    stack.fallback.serve_fixtures().await;
    let encoded = PRIMARY_KEY.replace('-', "%2d");
    let mut body = fixtures::primary_user_profile();
    body["user"]["avatar_larger"]["url_list"] =
        serde_json::json!([format!("https://cdn.example/a.webp?k={encoded}")]);
    stack.primary.profile(LUNA, &body).await;

    let a = stack.get(PATHS[0]).await;
    a.assert_success(false);
    a.assert_absent_exact(&encoded);
    assert_eq!(
        stack.fallback.request_count().await,
        1,
        "the fallback answered"
    );
}
