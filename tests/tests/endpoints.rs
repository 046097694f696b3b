//! Each of the five endpoints answered through the primary, and through the
//! fallback when the primary fails: the same keys in the same order, and the
//! values of CONTRACT.md's mapping from the sample payloads.

use serde_json::{json, Value};
use socialgate_tests::config::FALLBACK;
use socialgate_tests::config::PRIMARY;
use socialgate_tests::upstream::OPAQUE_KEY;
use socialgate_tests::{Answer, Stack, COMMENT_KEYS, POST_KEYS, PROFILE_KEYS};

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";
const POSTS: &str = "/v1/shortvideo/posts?username=lunabakes";
const POST: &str = "/v1/shortvideo/post?id=7312345678901234567";
const COMMENTS: &str = "/v1/shortvideo/comments?id=7312345678901234567&count=3";
const SEARCH: &str = "/v1/shortvideo/search?query=luna";

const CAPTION: &str = "#baking croissants at 3am 🥐 \"lamination\" is a lifestyle";
const BIO: &str = "Pastry chef • new recipe every Tuesday\n#baking #dessert";

/// A stack whose primary serves the fixtures; the fallback serves them too,
/// so an answer from the wrong provider shows in the values.
async fn primary_up() -> Stack {
    let stack = Stack::start().await;
    stack.primary.serve_fixtures().await;
    stack.fallback.serve_fixtures().await;
    stack
}

/// A stack whose primary answers HTTP 500 to everything.
async fn primary_down() -> Stack {
    let stack = Stack::start().await;
    stack.primary.fail_all(500).await;
    stack.fallback.serve_fixtures().await;
    stack
}

fn assert_item_keys(answer: &Answer, expected: &[&str]) {
    let items = answer.data().as_array().expect("data is an array");
    assert!(!items.is_empty(), "{answer:?}");
    for i in 0..items.len() {
        assert_eq!(answer.keys_at(&format!("/data/{i}")), expected, "item {i}");
    }
}

fn post(id: &str, text: &str, counters: [u64; 4], created_at: &str, duration_ms: u64) -> Value {
    let [likes, comments, views, shares] = counters;
    json!({
        "id": id, "text": text, "likes": likes, "comments": comments, "views": views,
        "shares": shares, "created_at": created_at, "duration_ms": duration_ms,
        "author": "lunabakes",
    })
}

/// The three fixture posts; durations in milliseconds as the provider gives them.
fn fixture_posts(durations: [u64; 3]) -> Value {
    json!([
        post(
            "7312345678901234567",
            CAPTION,
            [45312, 811, 1203344, 530],
            "2025-11-21T04:40:00Z",
            durations[0]
        ),
        post(
            "7312345678901234001",
            "Tuesday recipe: matcha tart 🍵✨ #dessert #matcha",
            [9120, 233, 310200, 88],
            "2025-11-14T06:00:00Z",
            durations[1],
        ),
        post(
            "7312345678901230002",
            "reply to @sam: yes you can freeze the dough\nlink in bio",
            [1200, 45, 40021, 3],
            "2025-11-07T07:20:00Z",
            durations[2],
        ),
    ])
}

fn fixture_comments() -> Value {
    json!([
        {"id": "7313000000000000001", "text": "this is art 😭🥐", "likes": 1022, "replies": 12,
         "created_at": "2025-11-21T04:48:20Z", "author": "crumbqueen"},
        {"id": "7313000000000000002", "text": "recipe??", "likes": 87, "replies": 1,
         "created_at": "2025-11-21T04:50:00Z", "author": "hungry.dev"},
        {"id": "7313000000000000003", "text": r#"the \"sound\" of that crust"#, "likes": 5, "replies": 0,
         "created_at": "2025-11-21T04:51:40Z", "author": "asmr_tim"},
    ])
}

#[tokio::test]
async fn profile_via_primary() {
    let stack = primary_up().await;
    let a = stack.get(PROFILE).await;
    a.assert_success(false);
    assert_eq!(a.keys_at("/data"), PROFILE_KEYS);
    assert_eq!(
        a.data(),
        &json!({
            "username": "lunabakes",
            "display_name": "Luna Bakes 🍰",
            "followers": 5479588,
            // enterprise_verify_reason is non-empty; verification_type is not a flag.
            "verified": true,
            "id": "6613926240453148678",
            "bio": BIO,
            "following": 154,
            "likes": 98989516,
            "videos": 324,
            "avatar_url": "https://p16-sign-va.cdn.example/tos-maliva-avt-0068/a9e9abbd~c5_1080x1080.webp?x-expires=1763876400&x-signature=abc",
        })
    );
    assert_eq!(
        stack.fallback.request_count().await,
        0,
        "the primary answered"
    );
}

#[tokio::test]
async fn profile_via_fallback() {
    let stack = primary_down().await;
    let a = stack.get(PROFILE).await;
    a.assert_success(false);
    assert_eq!(a.keys_at("/data"), PROFILE_KEYS);
    assert_eq!(
        a.data(),
        &json!({
            "username": "lunabakes",
            "display_name": "Luna Bakes 🍰",
            "followers": 5500000,
            "verified": true,
            "id": "6613926240453148678",
            "bio": BIO,
            "following": 154,
            "likes": 99000000,
            "videos": 324,
            "avatar_url": "https://p16-sign-sg.cdn.example/aweme/1080x1080/a9e9.jpeg?x-expires=1763876400",
        })
    );
    assert!(
        stack.primary.request_count().await >= 1,
        "the primary was tried first"
    );
}

#[tokio::test]
async fn primary_verified_comes_from_custom_verify_or_enterprise_reason_only() {
    let stack = Stack::start().await;
    stack.fallback.fail_all(500).await;
    let cases = [
        ("custom.only", "Official creator", "", 0, true),
        ("typed.only", "", "", 1, false),
        ("neither", "", "", 0, false),
    ];
    for (username, custom, enterprise, verification_type, _) in cases {
        let mut body = socialgate_tests::upstream::fixtures::primary_user_profile();
        body["user"]["unique_id"] = json!(username);
        body["user"]["custom_verify"] = json!(custom);
        body["user"]["enterprise_verify_reason"] = json!(enterprise);
        body["user"]["verification_type"] = json!(verification_type);
        stack.primary.profile(username, &body).await;
    }
    for (username, _, _, _, verified) in cases {
        let a = stack
            .get(&format!("/v1/shortvideo/profile?username={username}"))
            .await;
        a.assert_success(false);
        assert_eq!(a.data()["username"], username);
        assert_eq!(a.data()["verified"], verified, "{username}: {a:?}");
    }
}

/// Abuse sweep: an upstream's avatar link is passed on only when it is an
/// `http(s)` URL a page may hold as it is; one that would end an HTML
/// attribute, or a line, is `null`, and the rest of the profile is kept.
#[tokio::test]
async fn an_avatar_that_is_no_clean_web_url_is_null() {
    let stack = Stack::start().await;
    stack.fallback.fail_all(500).await;
    let links = [
        (
            "quoted",
            "https://cdn.example/a.webp\"><script>alert(1)</script>",
        ),
        ("spaced", "https://cdn.example/a b.webp"),
        ("broken", "https://cdn.example/a.webp\r\nX: y"),
        ("hostless", "https:///a.webp"),
        ("scripted", "javascript:alert(1)"),
    ];
    for (username, link) in links {
        let mut body = socialgate_tests::upstream::fixtures::primary_user_profile();
        body["user"]["unique_id"] = json!(username);
        body["user"]["avatar_larger"]["url_list"] = json!([link]);
        stack.primary.profile(username, &body).await;
    }
    for (username, _) in links {
        let a = stack
            .get(&format!("/v1/shortvideo/profile?username={username}"))
            .await;
        a.assert_success(false);
        assert_eq!(a.data()["username"], username);
        assert_eq!(a.data()["followers"], 5479588, "{username}: {a:?}");
        assert_eq!(a.data()["avatar_url"], Value::Null, "{username}: {a:?}");
    }
    assert_eq!(
        stack.fallback.request_count().await,
        0,
        "the primary answered"
    );
}

/// Abuse sweep: a username outside the handle rule (one a caller could
/// not ask for again) is never passed on. A profile's makes the answer a
/// bad one, and the next provider answers; an embedded author's is `null`,
/// and the rest of the page is kept.
#[tokio::test]
async fn a_username_that_is_no_handle_is_never_passed_on() {
    let stack = Stack::start().await;
    stack.fallback.serve_fixtures().await;
    let mut profile = socialgate_tests::upstream::fixtures::primary_user_profile();
    profile["user"]["unique_id"] = json!("Prim\\Secret\"Quote42");
    stack.primary.profile("lunabakes", &profile).await;
    let a = stack.get(PROFILE).await;
    socialgate_tests::upstream::assert_answered_by(
        &a,
        socialgate_tests::upstream::FALLBACK_FOLLOWERS,
        "the fallback, the primary's username being no handle",
    );
    assert_eq!(a.data()["username"], "lunabakes");
    a.assert_absent("Quote42");

    let mut page = socialgate_tests::upstream::fixtures::primary_comment_list();
    page["comments"][1]["user"]["unique_id"] = json!("hungry dev");
    stack
        .primary
        .comments("7312345678901234567", 3, 0, &page)
        .await;
    let fallback_asked = stack.fallback.request_count().await;
    let a = stack.get(COMMENTS).await;
    a.assert_success(true);
    let mut expected = fixture_comments();
    expected[1]["author"] = Value::Null;
    assert_eq!(a.data(), &expected);
    assert_eq!(
        stack.fallback.request_count().await,
        fallback_asked,
        "the primary answered the comments"
    );
}

#[tokio::test]
async fn posts_via_primary() {
    let stack = primary_up().await;
    let a = stack.get(POSTS).await;
    a.assert_success(true);
    assert_item_keys(&a, &POST_KEYS);
    assert_eq!(a.data(), &fixture_posts([15379, 31000, 58123]));
    assert!(
        a.next_cursor().is_some(),
        "has_more 1 gives a cursor: {a:?}"
    );
    assert_eq!(
        stack.fallback.request_count().await,
        0,
        "the primary answered"
    );
}

#[tokio::test]
async fn posts_via_fallback_use_video_id_and_seconds() {
    let stack = primary_down().await;
    let a = stack.get(POSTS).await;
    a.assert_success(true);
    assert_item_keys(&a, &POST_KEYS);
    // The ID trap: `aweme_id` is an opaque media key, the post ID is `video_id`.
    assert_eq!(a.data(), &fixture_posts([15000, 31000, 58000]));
    a.assert_absent("v15044gf0000d724vbfog65ugaj791");
    assert!(
        a.next_cursor().is_some(),
        "hasMore true gives a cursor: {a:?}"
    );
    assert!(stack.primary.request_count().await >= 1);
}

#[tokio::test]
async fn post_via_primary() {
    let stack = primary_up().await;
    let a = stack.get(POST).await;
    a.assert_success(false);
    assert_eq!(a.keys_at("/data"), POST_KEYS);
    assert_eq!(a.data(), &fixture_posts([15379, 0, 0])[0]);
    assert_eq!(
        stack.fallback.request_count().await,
        0,
        "the primary answered"
    );
}

#[tokio::test]
async fn post_via_fallback_uses_id_not_the_opaque_key() {
    let stack = primary_down().await;
    let a = stack.get(POST).await;
    a.assert_success(false);
    assert_eq!(a.keys_at("/data"), POST_KEYS);
    assert_eq!(a.data(), &fixture_posts([15000, 0, 0])[0]);
    a.assert_absent(OPAQUE_KEY);
    assert!(stack.primary.request_count().await >= 1);
}

#[tokio::test]
async fn comments_via_primary() {
    let stack = primary_up().await;
    let a = stack.get(COMMENTS).await;
    a.assert_success(true);
    assert_item_keys(&a, &COMMENT_KEYS);
    assert_eq!(a.data(), &fixture_comments());
    assert!(a.next_cursor().is_some(), "811 comments exist: {a:?}");
    assert_eq!(
        stack.fallback.request_count().await,
        0,
        "the primary answered"
    );
}

#[tokio::test]
async fn comments_via_fallback() {
    let stack = primary_down().await;
    let a = stack.get(COMMENTS).await;
    a.assert_success(true);
    assert_item_keys(&a, &COMMENT_KEYS);
    assert_eq!(a.data(), &fixture_comments());
    assert!(a.next_cursor().is_some(), "811 comments exist: {a:?}");
    assert!(stack.primary.request_count().await >= 1);
}

#[tokio::test]
async fn search_goes_to_the_fallback_without_asking_the_primary_even_when_it_is_first() {
    // No per-endpoint order: the chain is [primary, fallback] and the
    // primary's manifest has no search, so it must be skipped untouched.
    let stack = Stack::builder()
        .providers(&[PRIMARY, FALLBACK])
        .search_order(None)
        .start()
        .await;
    stack.primary.serve_fixtures().await;
    stack.fallback.serve_fixtures().await;
    let a = stack.get(SEARCH).await;
    a.assert_success(true);
    assert_item_keys(&a, &PROFILE_KEYS);
    assert_eq!(
        a.data(),
        &json!([
            {
                "username": "lunabakes", "display_name": "Luna Bakes 🍰", "followers": 5500000,
                "verified": true, "id": "6613926240453148678", "bio": BIO, "following": 154,
                "likes": 99000000, "videos": 324,
                "avatar_url": "https://p16-sign-sg.cdn.example/aweme/1080x1080/a9e9.jpeg?x-expires=1763876400",
            },
            {
                "username": "lunabakes.fan", "display_name": "luna fan page", "followers": 1200,
                // An empty signature is no bio: null, as from the primary.
                "verified": false, "id": "7000000000000000001", "bio": null, "following": 20,
                "likes": 5000, "videos": 12,
                "avatar_url": "https://p16-sign-sg.cdn.example/aweme/1080x1080/a9e9.jpeg?x-expires=1763876400",
            },
        ])
    );
    assert_eq!(a.next_cursor(), None, "hasMore false ends the list");
    assert_eq!(
        stack.primary.request_count().await,
        0,
        "search never touches the primary"
    );
    assert_eq!(stack.fallback.requests_to("/user/search").await.len(), 1);
}

#[tokio::test]
async fn the_same_keys_in_the_same_order_whichever_provider_answered() {
    // One server, both providers in turn: the primary answers, then fails.
    let stack = primary_up().await;
    let mut via_primary = Vec::new();
    for path in [PROFILE, POSTS, POST, COMMENTS] {
        via_primary.push(stack.get(path).await);
    }
    assert_eq!(
        stack.fallback.request_count().await,
        0,
        "the primary answered"
    );
    stack.primary.reset().await;
    stack.primary.fail_all(503).await;
    for (path, first) in [PROFILE, POSTS, POST, COMMENTS]
        .into_iter()
        .zip(&via_primary)
    {
        let before = stack.fallback.request_count().await;
        let second = stack.get(path).await;
        assert_eq!(first.status, 200, "{first:?}");
        assert_eq!(second.status, 200, "{second:?}");
        assert!(
            stack.fallback.request_count().await > before,
            "{path}: the second answer came from the fallback"
        );
        assert_eq!(first.keys_at(""), second.keys_at(""), "{path}");
        assert_eq!(first.keys_at("/meta"), second.keys_at("/meta"), "{path}");
        let pointer = if first.data().is_array() {
            "/data/0"
        } else {
            "/data"
        };
        assert_eq!(first.keys_at(pointer), second.keys_at(pointer), "{path}");
    }
}
