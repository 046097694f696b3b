//! The caller never learns which provider answered: no provider name,
//! upstream address, upstream status or upstream message in any body or
//! header, in answers and in errors alike.

use socialgate_tests::api::with_cursor;
use socialgate_tests::config::{FALLBACK_KEY, PRIMARY_KEY};
use socialgate_tests::upstream::{fixtures, LUNA, POST_ID};
use socialgate_tests::{Answer, Stack};

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
