//! The failover chain: any failure moves to the next provider, "not found"
//! ends the chain with 404, every provider failing is 502, a provider whose
//! manifest lacks the endpoint is skipped, and one library can back two
//! providers. A plugin's "invalid input" is the caller's 400 only before it
//! asked its upstream anything; after a request it is a failure, and so is
//! "unsupported": both fail over.

use std::time::{Duration, Instant};

use serde_json::json;
use socialgate_tests::config::{
    standard_env, ConfigBuilder, CHAOS, FALLBACK, FALLBACK_KEY_ENV, PRIMARY, PRIMARY_KEY_ENV,
};
use socialgate_tests::paths;
use socialgate_tests::raw_upstream::{Behaviour, RawUpstream};
use socialgate_tests::upstream::{
    assert_answered_by, fixtures, json_response, set, FALLBACK_FOLLOWERS, LUNA, LUNA_SEC_UID,
    POST_ID,
};
use socialgate_tests::{issue_key, Api, FallbackMock, PrimaryMock, Server, Stack, StackBuilder};
use wiremock::ResponseTemplate;

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";
const POSTS: &str = "/v1/shortvideo/posts?username=lunabakes";
const POST: &str = "/v1/shortvideo/post?id=7312345678901234567";
const COMMENTS: &str = "/v1/shortvideo/comments?id=7312345678901234567&count=3";
const SEARCH: &str = "/v1/shortvideo/search?query=luna";

#[tokio::test]
async fn primary_user_not_found_ends_the_chain() {
    let stack = Stack::start().await;
    stack
        .primary
        .profile(LUNA, &fixtures::primary_user_not_found())
        .await;
    stack.fallback.serve_fixtures().await;
    for path in [PROFILE, POSTS] {
        stack
            .get(path)
            .await
            .assert_error(404, "RESOURCE_NOT_FOUND");
    }
    assert!(stack.primary.request_count().await >= 2);
    assert_eq!(
        stack.fallback.request_count().await,
        0,
        "not found is authoritative"
    );
}

#[tokio::test]
async fn primary_video_not_found_ends_the_chain() {
    let stack = Stack::start().await;
    stack
        .primary
        .detail(POST_ID, &fixtures::primary_detail_null())
        .await;
    stack
        .primary
        .comments(POST_ID, 3, 0, &fixtures::primary_video_unavailable())
        .await;
    stack.fallback.serve_fixtures().await;
    stack
        .get(POST)
        .await
        .assert_error(404, "RESOURCE_NOT_FOUND");
    stack
        .get(COMMENTS)
        .await
        .assert_error(404, "RESOURCE_NOT_FOUND");
    assert_eq!(stack.primary.request_count().await, 2);
    assert_eq!(
        stack.fallback.request_count().await,
        0,
        "not found is authoritative"
    );
}

#[tokio::test]
async fn fallback_user_not_found_after_the_primary_failed() {
    let stack = Stack::start().await;
    stack.primary.fail_all(500).await;
    let gone = fixtures::fallback_user_not_found();
    stack.fallback.user_info(LUNA, &gone).await;
    stack.fallback.user_posts(LUNA, 10, "0", &gone).await;
    for path in [PROFILE, POSTS] {
        stack
            .get(path)
            .await
            .assert_error(404, "RESOURCE_NOT_FOUND");
    }
    assert!(
        stack.primary.request_count().await >= 2,
        "the primary was tried first"
    );
    assert_eq!(stack.fallback.request_count().await, 2);
}

#[tokio::test]
async fn fallback_video_not_found_after_the_primary_failed() {
    let stack = Stack::start().await;
    stack.primary.fail_all(500).await;
    let gone = fixtures::fallback_video_not_found();
    stack.fallback.video(POST_ID, &gone).await;
    stack.fallback.comments(POST_ID, 3, 0, &gone).await;
    for path in [POST, COMMENTS] {
        stack
            .get(path)
            .await
            .assert_error(404, "RESOURCE_NOT_FOUND");
    }
    assert_eq!(stack.fallback.request_count().await, 2);
}

/// An answer plugin-api takes but the platform's description refuses (here
/// a `bio` its rule forbids) is a failed attempt, and the next provider
/// answers; the shipped description takes the same answer.
#[tokio::test]
async fn an_answer_the_description_refuses_fails_over_to_the_next_provider() {
    let scratch = paths::scratch_dir();
    let file = paths::description_copy(scratch.path(), |text| {
        text.replacen(
            "name = \"bio\"\ntype = \"string\"\nnullable = true\n",
            "name = \"bio\"\ntype = \"string\"\nnullable = true\npattern = '[^<]*'\n",
            1,
        )
    });
    let marked_up = || {
        let mut body = fixtures::primary_user_profile();
        set(&mut body, "/user/signature", json!("<b>Pastry chef</b>"));
        body
    };
    let stack = Stack::builder().description(&file).start().await;
    stack.primary.profile(LUNA, &marked_up()).await;
    stack.fallback.serve_fixtures().await;
    let a = stack.get(PROFILE).await;
    assert_answered_by(
        &a,
        FALLBACK_FOLLOWERS,
        "the fallback, after the refused answer",
    );
    assert_eq!(stack.primary.request_count().await, 1);
    assert!(
        stack
            .server
            .stderr()
            .contains("plugin answer does not fit the description: data.bio"),
        "{}",
        stack.server.stderr()
    );

    // The shipped description has no such rule: the primary's answer is taken.
    let stack = Stack::start().await;
    stack.primary.profile(LUNA, &marked_up()).await;
    stack.fallback.serve_fixtures().await;
    let a = stack.get(PROFILE).await;
    a.assert_success(false);
    assert_eq!(a.data()["bio"], "<b>Pastry chef</b>", "{a:?}");
    assert_eq!(stack.fallback.request_count().await, 0);
}

#[tokio::test]
async fn every_provider_failing_is_502_for_every_endpoint() {
    let stack = Stack::start().await;
    stack.primary.fail_all(500).await;
    stack.fallback.fail_all(503).await;
    for path in [PROFILE, POSTS, POST, COMMENTS, SEARCH] {
        stack
            .get(path)
            .await
            .assert_error(502, "UPSTREAM_UNAVAILABLE");
    }
    // Search never asks the primary; the other four asked both.
    assert!(stack.primary.request_count().await >= 4);
    assert!(stack.fallback.request_count().await >= 5);
}

#[tokio::test]
async fn application_level_failures_of_both_are_502_not_404() {
    let stack = Stack::builder().breaker_failures(100).start().await;
    stack
        .primary
        .answer_all(&fixtures::primary_try_again())
        .await;
    stack
        .fallback
        .answer_all(&fixtures::fallback_rate_limit())
        .await;
    for path in [PROFILE, POSTS, POST, COMMENTS, SEARCH] {
        stack
            .get(path)
            .await
            .assert_error(502, "UPSTREAM_UNAVAILABLE");
    }
    stack.primary.reset().await;
    stack
        .primary
        .answer_all(&fixtures::primary_soft_block())
        .await;
    stack.fallback.reset().await;
    stack
        .fallback
        .respond_all(ResponseTemplate::new(200).set_body_string("<html>gateway</html>"))
        .await;
    stack
        .get(PROFILE)
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
}

#[tokio::test]
async fn each_kind_of_primary_failure_fails_over_to_the_fallback() {
    // Ten failures in a row: keep the primary's breaker from skipping it.
    let stack = Stack::builder().breaker_failures(100).start().await;
    stack.fallback.serve_fixtures().await;
    let failures: Vec<(&str, ResponseTemplate)> = vec![
        ("HTTP 500", ResponseTemplate::new(500)),
        (
            "HTTP 503",
            ResponseTemplate::new(503).set_body_string("maintenance"),
        ),
        (
            "2098 try again later",
            json_response(&fixtures::primary_try_again()),
        ),
        (
            "soft block: status 0, no user",
            json_response(&fixtures::primary_soft_block()),
        ),
        (
            "unknown status_code",
            json_response(&json!({"status_code": 9, "status_msg": "odd"})),
        ),
        ("empty body", ResponseTemplate::new(200)),
        (
            "not JSON",
            ResponseTemplate::new(200).set_body_string("<html>oops</html>"),
        ),
        // Last: a 429 may open the breaker whatever its threshold.
        (
            "HTTP 401 (key refused)",
            ResponseTemplate::new(401).set_body_string("bad key"),
        ),
        ("HTTP 403 (quota)", ResponseTemplate::new(403)),
        (
            "HTTP 429 with Retry-After",
            ResponseTemplate::new(429).insert_header("Retry-After", "30"),
        ),
    ];
    for (what, failure) in failures {
        stack.primary.reset().await;
        stack.primary.respond_all(failure).await;
        let a = stack.get(PROFILE).await;
        a.assert_success(false);
        assert_eq!(
            a.data()["followers"],
            5500000,
            "{what}: the fallback answered: {a:?}"
        );
        assert_eq!(
            stack.primary.request_count().await,
            1,
            "{what}: the primary was tried once"
        );
    }
}

#[tokio::test]
async fn a_primary_failing_midway_through_posts_fails_over() {
    // P1 answers, P2 asks to try again: the whole attempt failed.
    let stack = Stack::start().await;
    stack
        .primary
        .profile(LUNA, &fixtures::primary_user_profile())
        .await;
    stack
        .primary
        .posts(LUNA_SEC_UID, 10, "0", &fixtures::primary_try_again())
        .await;
    stack.fallback.serve_fixtures().await;
    let a = stack.get(POSTS).await;
    a.assert_success(true);
    assert_eq!(
        a.data()[0]["duration_ms"],
        15000,
        "the fallback answered: {a:?}"
    );
    assert_eq!(stack.primary.requests_to("/v1/user/posts").await.len(), 1);
}

#[tokio::test]
async fn a_slow_primary_is_cut_off_by_its_timeout() {
    let stack = Stack::builder().timeout_ms(PRIMARY, 500).start().await;
    stack
        .primary
        .respond_all(
            json_response(&fixtures::primary_user_profile()).set_delay(Duration::from_secs(8)),
        )
        .await;
    stack.fallback.serve_fixtures().await;
    let started = Instant::now();
    let a = stack.get(PROFILE).await;
    let took = started.elapsed();
    a.assert_success(false);
    assert_eq!(
        a.data()["followers"],
        5500000,
        "the fallback answered: {a:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "the 500 ms timeout held: took {took:?}"
    );
}

#[tokio::test]
async fn per_endpoint_order_replaces_the_platform_order() {
    // Only the primary serves the platform; search names the fallback alone.
    let stack = Stack::builder()
        .providers(&[PRIMARY])
        .search_order(Some(&[FALLBACK]))
        .start()
        .await;
    stack.primary.fail_all(500).await;
    stack.fallback.serve_fixtures().await;
    stack.get(SEARCH).await.assert_success(true);
    stack
        .get(PROFILE)
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
    assert_eq!(
        stack.fallback.requests_to("/user/info").await.len(),
        0,
        "not in the chain"
    );
}

#[tokio::test]
async fn one_library_backs_two_providers_each_with_its_own_upstream() {
    // Two providers from `shortvideo_fallback`: a loader that caches one
    // module per type would send both to the first base_url.
    let first = FallbackMock::start().await;
    let second = FallbackMock::start().await;
    let primary = PrimaryMock::start().await;
    first.fail_all(500).await;
    second.serve_fixtures().await;
    let config = ConfigBuilder::new()
        .platform("shortvideo", "live", &["fallback-a", "fallback-b"])
        .provider(
            "fallback-a",
            "shortvideo_fallback",
            &first.base_url(),
            FALLBACK_KEY_ENV,
        )
        .provider(
            "fallback-b",
            "shortvideo_fallback",
            &second.base_url(),
            FALLBACK_KEY_ENV,
        )
        .provider(
            PRIMARY,
            "shortvideo_primary",
            &primary.base_url(),
            PRIMARY_KEY_ENV,
        )
        .write();
    let key = issue_key(&config, "e2e");
    let server = Server::start_with(&config, &standard_env(), &[]);
    let api = Api::new(&server.base_url(), Some(&key));

    let a = api.get(PROFILE).await;
    a.assert_success(false);
    assert_eq!(a.data()["username"], "lunabakes");
    assert_eq!(
        first.request_count().await,
        1,
        "the first provider was tried"
    );
    assert_eq!(
        second.request_count().await,
        1,
        "the second provider answered"
    );
    assert_eq!(primary.request_count().await, 0, "not in the chain");
}

#[tokio::test]
async fn plugins_run_from_private_copies_so_rewriting_a_library_file_is_harmless() {
    // The libraries in a folder of our own, which we then overwrite in place.
    let plugins = socialgate_tests::paths::scratch_dir();
    for lib in ["shortvideo_primary", "shortvideo_fallback"] {
        let from = socialgate_tests::paths::plugin_library(lib);
        std::fs::copy(&from, plugins.path().join(from.file_name().unwrap())).unwrap();
    }
    let primary = PrimaryMock::start().await;
    let fallback = FallbackMock::start().await;
    primary.serve_fixtures().await;
    fallback.serve_fixtures().await;
    // The standard configuration, loading from that folder.
    let config = StackBuilder::default()
        .config(&primary, &fallback)
        .plugin_dir(plugins.path())
        .write();
    let key = issue_key(&config, "e2e");
    let mut server = Server::start_with(&config, &standard_env(), &[]);
    let api = Api::new(&server.base_url(), Some(&key));
    api.get(PROFILE).await.assert_success(false);

    // Rewrite both files in place (same inode), as a careless deploy would.
    let primary_lib = socialgate_tests::paths::plugin_library("shortvideo_primary");
    let fallback_lib = socialgate_tests::paths::plugin_library("shortvideo_fallback");
    let primary_bytes = std::fs::read(&primary_lib).unwrap();
    let fallback_bytes = std::fs::read(&fallback_lib).unwrap();
    std::fs::write(
        plugins.path().join(primary_lib.file_name().unwrap()),
        &fallback_bytes,
    )
    .unwrap();
    std::fs::write(
        plugins.path().join(fallback_lib.file_name().unwrap()),
        &primary_bytes,
    )
    .unwrap();

    for _ in 0..3 {
        let a = api.get(PROFILE).await;
        a.assert_success(false);
        assert_eq!(
            a.data()["followers"],
            5479588,
            "still the primary's answer: {a:?}"
        );
    }
    assert!(server.is_running(), "the host survived");
    assert_eq!(fallback.request_count().await, 0);
}

/// A search names no resource, so an upstream saying "User doesn't exist"
/// to one has left its contract: that is a failed attempt, not a 404.
#[tokio::test]
async fn not_found_from_a_search_is_a_failure_not_a_404() {
    let stack = Stack::start().await;
    stack
        .fallback
        .search("luna", 10, "0", &fixtures::fallback_user_not_found())
        .await;
    stack
        .get(SEARCH)
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
    assert_eq!(
        stack.primary.request_count().await,
        0,
        "search never asks the primary"
    );
}

/// A cooldown no test waits out.
const LONG_COOLDOWN_MS: u64 = 60_000;

/// The chain `[chaos, fallback]`, chaos in `mode` opening its breaker on
/// one failure, the fallback serving its fixtures.
async fn chaos_before_the_fallback(mode: &str, chaos_url: Option<&str>) -> Stack {
    let mut builder = Stack::builder()
        .search_order(None)
        .providers(&[CHAOS, FALLBACK])
        .chaos(mode)
        .breaker(CHAOS, 1, LONG_COOLDOWN_MS);
    if let Some(url) = chaos_url {
        builder = builder.chaos_url(url);
    }
    let stack = builder.start().await;
    stack.fallback.serve_fixtures().await;
    stack
}

#[tokio::test]
async fn a_plugins_invalid_input_before_any_request_is_the_callers_400() {
    let stack = chaos_before_the_fallback("invalid_input", None).await;
    // Three times, with a breaker that opens on one failure: the refusal
    // is not held against the plugin, which keeps answering.
    for path in [PROFILE, PROFILE, "/v1/shortvideo/posts?username=lunabakes"] {
        let a = stack.get(path).await;
        a.assert_invalid("username");
        assert!(
            a.error_message()
                .contains("is not allowed on this platform"),
            "the plugin's reason: {a:?}"
        );
        a.assert_absent("chaos");
    }
    assert_eq!(
        stack.fallback.request_count().await,
        0,
        "invalid input ends the chain"
    );
}

#[tokio::test]
async fn a_plugins_invalid_input_after_a_request_is_a_failure() {
    let upstream = RawUpstream::start(Behaviour::Respond {
        body: b"{}".to_vec(),
    });
    let stack = chaos_before_the_fallback("invalid_after_fetch", Some(&upstream.base_url())).await;
    let a = stack.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "the fallback after the refusal");
    let asked: Vec<String> = upstream.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(asked, ["/anything"], "the plugin's request came first");
    // It counted as a failure: the plugin's breaker (one failure) is open.
    let a = stack.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "chaos skipped");
    assert_eq!(upstream.request_count(), 1, "an open breaker asks nothing");
}

#[tokio::test]
async fn an_unsupported_call_fails_over() {
    let stack = chaos_before_the_fallback("unsupported", None).await;
    let a = stack.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "the fallback");
    let a = stack
        .get(&format!("/v1/shortvideo/post?id={POST_ID}"))
        .await;
    a.assert_success(false);
    assert_eq!(a.data()["id"], POST_ID, "{a:?}");
    assert_eq!(stack.fallback.request_count().await, 2);
}
