//! Values that break naive JSON handling come out exactly: 19- and 20-digit
//! IDs sent as bare integers (beyond 2^53, and beyond u64), counters sent as
//! numeric strings, and text with emoji, quotes, backslashes and newlines.
//! Handles sent with a leading `@` come out without it, as the schema has
//! them.

use serde_json::json;
use socialgate_tests::upstream::{bare_int, fixtures, set, LUNA, LUNA_SEC_UID};
use socialgate_tests::Stack;

/// Text that a lossy or double-escaping path would change.
const TRICKY: &str =
    "say \"hi\" \\ C:\\dir\\ \\\"esc\\\" 🥐👩‍👩‍👧🇯🇵 line\nnext\ttab <b>&amp; \u{2028} end";

/// u64::MAX + 1: 20 digits, above every unsigned 64-bit integer.
const ABOVE_U64: &str = "18446744073709551616";
/// The largest 20-digit number.
const TWENTY_NINES: &str = "99999999999999999999";
/// 19 digits, far above 2^53 (where a float loses digits).
const NINETEEN: &str = "7312345678901234567";

#[tokio::test]
async fn primary_post_with_an_id_above_u64_and_string_counters() {
    let stack = Stack::start().await;
    stack.fallback.fail_all(500).await;
    let mut body = fixtures::primary_aweme_detail();
    set(&mut body, "/aweme_detail/aweme_id", bare_int(ABOVE_U64));
    set(&mut body, "/aweme_detail/desc", json!(TRICKY));
    set(
        &mut body,
        "/aweme_detail/statistics/digg_count",
        json!("1234"),
    );
    set(
        &mut body,
        "/aweme_detail/statistics/comment_count",
        json!("56"),
    );
    set(
        &mut body,
        "/aweme_detail/statistics/play_count",
        json!("9007199254740993"),
    );
    set(
        &mut body,
        "/aweme_detail/statistics/share_count",
        json!("0"),
    );
    // The caller's ID reaches the upstream exactly, digits and all.
    stack.primary.detail(ABOVE_U64, &body).await;

    let a = stack
        .get(&format!("/v1/shortvideo/post?id={ABOVE_U64}"))
        .await;
    a.assert_success(false);
    assert_eq!(a.data()["id"], ABOVE_U64, "{a:?}");
    assert_eq!(a.data()["text"], TRICKY);
    assert_eq!(a.data()["likes"], 1234);
    assert_eq!(a.data()["comments"], 56);
    // 2^53 + 1: a float would make it ...992.
    assert_eq!(a.data()["views"].as_u64(), Some(9_007_199_254_740_993));
    assert_eq!(a.data()["shares"], 0);
    assert!(
        a.text.contains(&format!("\"id\":\"{ABOVE_U64}\"")),
        "the ID is sent as a string: {a:?}"
    );
}

#[tokio::test]
async fn fallback_post_with_a_twenty_digit_id_and_string_counters() {
    let stack = Stack::start().await;
    stack.primary.fail_all(500).await;
    let mut body = fixtures::fallback_video_detail();
    set(&mut body, "/data/id", bare_int(TWENTY_NINES));
    set(&mut body, "/data/title", json!(TRICKY));
    set(&mut body, "/data/digg_count", json!("1234"));
    set(&mut body, "/data/comment_count", json!("56"));
    set(&mut body, "/data/play_count", json!("789"));
    set(&mut body, "/data/share_count", json!("10"));
    stack.fallback.video(TWENTY_NINES, &body).await;

    let a = stack
        .get(&format!("/v1/shortvideo/post?id={TWENTY_NINES}"))
        .await;
    a.assert_success(false);
    assert_eq!(a.data()["id"], TWENTY_NINES, "{a:?}");
    assert_eq!(a.data()["text"], TRICKY);
    assert_eq!(
        [
            &a.data()["likes"],
            &a.data()["comments"],
            &a.data()["views"],
            &a.data()["shares"]
        ],
        [&json!(1234), &json!(56), &json!(789), &json!(10)]
    );
    assert_eq!(a.data()["duration_ms"], 15000);
}

#[tokio::test]
async fn primary_posts_with_bare_nineteen_digit_ids() {
    let stack = Stack::start().await;
    stack.fallback.fail_all(500).await;
    stack
        .primary
        .profile(LUNA, &fixtures::primary_user_profile())
        .await;
    let mut body = fixtures::primary_user_posts();
    set(&mut body, "/aweme_list/0/aweme_id", bare_int(NINETEEN));
    set(&mut body, "/aweme_list/1/aweme_id", bare_int(ABOVE_U64));
    set(&mut body, "/aweme_list/0/desc", json!(TRICKY));
    set(
        &mut body,
        "/aweme_list/0/statistics/digg_count",
        json!("45312"),
    );
    stack.primary.posts(LUNA_SEC_UID, 10, "0", &body).await;

    let a = stack.get("/v1/shortvideo/posts?username=lunabakes").await;
    a.assert_success(true);
    assert_eq!(a.data()[0]["id"], NINETEEN, "{a:?}");
    assert_eq!(a.data()[1]["id"], ABOVE_U64, "{a:?}");
    assert_eq!(a.data()[0]["text"], TRICKY);
    assert_eq!(a.data()[0]["likes"], 45312);
}

#[tokio::test]
async fn primary_profile_with_a_bare_uid_and_string_counters() {
    let stack = Stack::start().await;
    stack.fallback.fail_all(500).await;
    let mut body = fixtures::primary_user_profile();
    set(&mut body, "/user/uid", bare_int("18446744073709551615"));
    set(&mut body, "/user/unique_id", json!("@lunabakes"));
    set(&mut body, "/user/nickname", json!(TRICKY));
    set(&mut body, "/user/signature", json!(TRICKY));
    set(&mut body, "/user/follower_count", json!("5479588"));
    set(&mut body, "/user/following_count", json!("154"));
    set(&mut body, "/user/total_favorited", json!("98989516"));
    set(&mut body, "/user/aweme_count", json!("324"));
    stack.primary.profile(LUNA, &body).await;

    let a = stack.get("/v1/shortvideo/profile?username=lunabakes").await;
    a.assert_success(false);
    assert_eq!(a.data()["id"], "18446744073709551615", "{a:?}");
    assert_eq!(a.data()["username"], "lunabakes");
    assert_eq!(a.data()["display_name"], TRICKY);
    assert_eq!(a.data()["bio"], TRICKY);
    assert_eq!(
        [
            &a.data()["followers"],
            &a.data()["following"],
            &a.data()["likes"],
            &a.data()["videos"]
        ],
        [&json!(5479588), &json!(154), &json!(98989516), &json!(324)]
    );
}

#[tokio::test]
async fn fallback_profile_with_a_bare_id_and_string_stats() {
    let stack = Stack::start().await;
    stack.primary.fail_all(500).await;
    let mut body = fixtures::fallback_user_info();
    set(&mut body, "/data/user/id", bare_int(TWENTY_NINES));
    set(&mut body, "/data/user/uniqueId", json!("@lunabakes"));
    set(&mut body, "/data/user/signature", json!(TRICKY));
    set(&mut body, "/data/stats/followerCount", json!("5500000"));
    set(&mut body, "/data/stats/heartCount", json!("99000000"));
    stack.fallback.user_info(LUNA, &body).await;

    let a = stack.get("/v1/shortvideo/profile?username=lunabakes").await;
    a.assert_success(false);
    assert_eq!(a.data()["id"], TWENTY_NINES, "{a:?}");
    assert_eq!(a.data()["username"], "lunabakes");
    assert_eq!(a.data()["bio"], TRICKY);
    assert_eq!(a.data()["followers"], 5500000);
    assert_eq!(a.data()["likes"], 99000000);
}

#[tokio::test]
async fn comments_with_bare_ids_from_both_providers() {
    let stack = Stack::start().await;
    let mut primary = fixtures::primary_comment_list();
    set(&mut primary, "/comments/0/cid", bare_int(NINETEEN));
    set(&mut primary, "/comments/1/cid", bare_int(TWENTY_NINES));
    set(&mut primary, "/comments/0/text", json!(TRICKY));
    set(
        &mut primary,
        "/comments/0/user/unique_id",
        json!("@crumbqueen"),
    );
    set(&mut primary, "/comments/0/digg_count", json!("1022"));
    set(&mut primary, "/comments/0/reply_comment_total", json!("12"));
    stack.primary.comments(ABOVE_U64, 3, 0, &primary).await;

    let a = stack
        .get(&format!("/v1/shortvideo/comments?id={ABOVE_U64}&count=3"))
        .await;
    a.assert_success(true);
    assert_eq!(a.data()[0]["id"], NINETEEN, "{a:?}");
    assert_eq!(a.data()[1]["id"], TWENTY_NINES);
    assert_eq!(a.data()[0]["text"], TRICKY);
    assert_eq!(a.data()[0]["author"], "crumbqueen");
    assert_eq!(a.data()[0]["likes"], 1022);
    assert_eq!(a.data()[0]["replies"], 12);
    assert_eq!(stack.fallback.request_count().await, 0);

    let mut fallback = fixtures::fallback_comment_list();
    set(&mut fallback, "/data/comments/0/id", bare_int(TWENTY_NINES));
    set(&mut fallback, "/data/comments/0/text", json!(TRICKY));
    set(
        &mut fallback,
        "/data/comments/0/user/unique_id",
        json!("@crumbqueen"),
    );
    set(&mut fallback, "/data/comments/0/digg_count", json!("1022"));
    set(&mut fallback, "/data/comments/0/reply_total", json!("12"));
    stack.fallback.comments(TWENTY_NINES, 3, 0, &fallback).await;
    stack.primary.fail_all(500).await;

    let a = stack
        .get(&format!(
            "/v1/shortvideo/comments?id={TWENTY_NINES}&count=3"
        ))
        .await;
    a.assert_success(true);
    assert_eq!(a.data()[0]["id"], TWENTY_NINES, "{a:?}");
    assert_eq!(a.data()[0]["text"], TRICKY);
    assert_eq!(a.data()[0]["author"], "crumbqueen");
    assert_eq!(a.data()[0]["likes"], 1022);
    assert_eq!(a.data()[0]["replies"], 12);
}

#[tokio::test]
async fn search_results_with_bare_ids_and_string_stats() {
    let stack = Stack::start().await;
    let mut body = fixtures::fallback_user_search();
    set(&mut body, "/data/user_list/0/user/id", bare_int(ABOVE_U64));
    set(&mut body, "/data/user_list/0/user/nickname", json!(TRICKY));
    set(
        &mut body,
        "/data/user_list/0/stats/followerCount",
        json!("5500000"),
    );
    stack.fallback.search("luna", 10, "0", &body).await;

    let a = stack.get("/v1/shortvideo/search?query=luna").await;
    a.assert_success(true);
    assert_eq!(a.data()[0]["id"], ABOVE_U64, "{a:?}");
    assert_eq!(a.data()[0]["display_name"], TRICKY);
    assert_eq!(a.data()[0]["followers"], 5500000);
}

#[tokio::test]
async fn parameters_reach_the_upstream_decoded_and_exact() {
    let stack = Stack::start().await;
    stack
        .primary
        .profile(LUNA, &fixtures::primary_user_profile())
        .await;
    stack
        .fallback
        .search(
            "luna bakes 🥐 \"&=?\"",
            10,
            "0",
            &fixtures::fallback_user_search(),
        )
        .await;
    stack
        .fallback
        .search("luna bakes", 10, "0", &fixtures::fallback_user_search())
        .await;

    // One leading @ is stripped, also when percent-encoded.
    for path in [
        "/v1/shortvideo/profile?username=@lunabakes",
        "/v1/shortvideo/profile?username=%40lunabakes",
    ] {
        let a = stack.get(path).await;
        a.assert_success(false);
        assert_eq!(a.data()["username"], "lunabakes", "{path}");
    }
    // Form decoding: %XX escapes and `+` for a space.
    let a = stack
        .get("/v1/shortvideo/search?query=luna%20bakes%20%F0%9F%A5%90%20%22%26%3D%3F%22")
        .await;
    a.assert_success(true);
    let a = stack.get("/v1/shortvideo/search?query=luna+bakes").await;
    a.assert_success(true);
    assert_eq!(stack.fallback.requests_to("/user/search").await.len(), 2);
}

// Audit finding 9: what an upstream sends is checked against the contract.

#[tokio::test]
async fn unchecked_upstream_data_no_list_answer_exceeds_its_count() {
    let stack = Stack::start().await;
    // Search (the fallback's): 25 profiles for `count=10` are cut to 10,
    // and the next page starts right after them.
    let mut flood = fixtures::fallback_user_search();
    let template = flood["data"]["user_list"][0].clone();
    flood["data"]["user_list"] = (0..25)
        .map(|i| {
            let mut account = template.clone();
            account["user"]["uniqueId"] = json!(format!("user{i}"));
            account
        })
        .collect();
    flood["data"]["cursor"] = json!(25);
    flood["data"]["hasMore"] = json!(true);
    stack.fallback.search("luna", 10, "0", &flood).await;
    stack
        .fallback
        .search("luna", 10, "10", &fixtures::fallback_user_search())
        .await;
    let a = stack.get("/v1/shortvideo/search?query=luna").await;
    a.assert_success(true);
    let names: Vec<_> = a
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["username"].clone())
        .collect();
    assert_eq!(
        names,
        (0..10)
            .map(|i| json!(format!("user{i}")))
            .collect::<Vec<_>>()
    );
    let cursor = a.next_cursor().expect("more profiles exist");
    let next = stack
        .get(&socialgate_tests::api::with_cursor(
            "/v1/shortvideo/search?query=luna",
            &cursor,
        ))
        .await;
    next.assert_success(true);
    assert_eq!(next.data().as_array().unwrap().len(), 2, "{next:?}");

    // Posts (approximate count): the primary sending 40 for `count=10` is a
    // bad response, and the fallback answers instead.
    let mut posts = fixtures::primary_user_posts();
    let template = posts["aweme_list"][0].clone();
    posts["aweme_list"] = (0..40u64)
        .map(|i| {
            let mut post = template.clone();
            post["aweme_id"] = json!((7_312_345_678_901_000_000u64 + i).to_string());
            post
        })
        .collect();
    stack
        .primary
        .profile(LUNA, &fixtures::primary_user_profile())
        .await;
    stack.primary.posts(LUNA_SEC_UID, 10, "0", &posts).await;
    stack
        .fallback
        .user_posts(LUNA, 10, "0", &fixtures::fallback_user_posts())
        .await;
    let a = stack.get("/v1/shortvideo/posts?username=lunabakes").await;
    a.assert_success(true);
    assert_eq!(
        a.data().as_array().unwrap().len(),
        3,
        "the fallback's batch: {a:?}"
    );
    assert_eq!(stack.fallback.requests_to("/user/posts").await.len(), 1);
}

#[tokio::test]
async fn unchecked_upstream_data_ids_that_break_the_contracts_shape_are_a_bad_response() {
    let flood = "7".repeat(100_000);
    let cases = [
        ("-5", json!(-5)),
        ("12a4", json!("12a4")),
        ("23 digits", bare_int("12345678901234567890123")),
        ("100,000 digits", bare_int(&flood)),
    ];
    for (what, bad) in cases {
        let stack = Stack::start().await;
        stack.fallback.serve_fixtures().await;
        let mut post = fixtures::primary_aweme_detail();
        set(&mut post, "/aweme_detail/aweme_id", bad.clone());
        stack.primary.detail(NINETEEN, &post).await;
        let mut profile = fixtures::primary_user_profile();
        set(&mut profile, "/user/uid", bad);
        stack.primary.profile(LUNA, &profile).await;

        let a = stack
            .get(&format!("/v1/shortvideo/post?id={NINETEEN}"))
            .await;
        a.assert_success(false);
        assert_eq!(
            a.data()["id"],
            fixtures::fallback_video_detail()["data"]["id"],
            "{what}: the fallback answers"
        );
        let a = stack.get("/v1/shortvideo/profile?username=lunabakes").await;
        a.assert_success(false);
        assert_eq!(
            a.data()["id"],
            fixtures::fallback_user_info()["data"]["user"]["id"],
            "{what}: the fallback answers"
        );
        assert_eq!(stack.fallback.request_count().await, 2, "{what}");
    }
}
