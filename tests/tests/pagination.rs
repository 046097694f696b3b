//! Exact comment counts through several upstream pages, and cursors: a
//! `meta.next_cursor` followed to the next page goes back to the provider
//! that issued it (also as the `Link` header names it), and a tampered,
//! foreign or misplaced one is refused.

use serde_json::json;
use socialgate_tests::api::with_cursor;
use socialgate_tests::upstream::{
    comment_id, comment_text, fallback_comments_page, fixtures, primary_comments_page, query_param,
    set, LUNA, LUNA_SEC_UID, POSTS_NEXT_CURSOR, POST_ID,
};
use socialgate_tests::{Answer, Stack};

const POSTS: &str = "/v1/shortvideo/posts?username=lunabakes";
const COMMENTS_120: &str = "/v1/shortvideo/comments?id=7312345678901234567&count=120";
const COMMENTS_20: &str = "/v1/shortvideo/comments?id=7312345678901234567&count=20";

/// Asserts the answer holds generated comments `from..to`, in order.
fn assert_comments(a: &Answer, from: u64, to: u64) {
    a.assert_success(true);
    let items = a.data().as_array().expect("an array");
    assert_eq!(items.len() as u64, to - from, "exactly the count asked for");
    for (item, i) in items.iter().zip(from..to) {
        assert_eq!(item["id"], comment_id(i), "item {i}");
        assert_eq!(item["text"], comment_text(i), "item {i}");
    }
}

/// The (count, cursor) of each comment page an upstream was asked for.
async fn pages_asked(
    upstream: &socialgate_tests::upstream::Upstream,
    path: &str,
) -> Vec<(String, String)> {
    upstream
        .requests_to(path)
        .await
        .iter()
        .map(|r| {
            (
                query_param(r, "count").unwrap_or_default(),
                query_param(r, "cursor").unwrap_or_default(),
            )
        })
        .collect()
}

fn pages(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test]
async fn comments_count_120_through_three_primary_pages_then_the_next_page() {
    let stack = Stack::start().await;
    let p = &stack.primary;
    p.comments(POST_ID, 50, 0, &primary_comments_page(POST_ID, 0, 50, 811))
        .await;
    p.comments(
        POST_ID,
        50,
        50,
        &primary_comments_page(POST_ID, 50, 50, 811),
    )
    .await;
    p.comments(
        POST_ID,
        20,
        100,
        &primary_comments_page(POST_ID, 100, 20, 811),
    )
    .await;
    p.comments(
        POST_ID,
        20,
        120,
        &primary_comments_page(POST_ID, 120, 20, 811),
    )
    .await;
    stack.fallback.serve_fixtures().await;

    let first = stack.get(COMMENTS_120).await;
    assert_comments(&first, 0, 120);
    assert_eq!(
        pages_asked(p, "/v1/comment/list").await,
        pages(&[("50", "0"), ("50", "50"), ("20", "100")])
    );
    let cursor = first.next_cursor().expect("811 comments exist");

    let second = stack.get(&with_cursor(COMMENTS_20, &cursor)).await;
    assert_comments(&second, 120, 140);
    assert_eq!(
        pages_asked(p, "/v1/comment/list").await[3..],
        pages(&[("20", "120")])[..],
        "the next page starts where the first ended"
    );
    assert_eq!(stack.fallback.request_count().await, 0);
}

#[tokio::test]
async fn comments_count_120_through_three_fallback_pages_then_the_next_page() {
    let stack = Stack::start().await;
    stack.primary.fail_all(500).await;
    let f = &stack.fallback;
    f.comments(POST_ID, 50, 0, &fallback_comments_page(0, 50, 811))
        .await;
    f.comments(POST_ID, 50, 50, &fallback_comments_page(50, 50, 811))
        .await;
    f.comments(POST_ID, 20, 100, &fallback_comments_page(100, 20, 811))
        .await;
    f.comments(POST_ID, 20, 120, &fallback_comments_page(120, 20, 811))
        .await;

    let first = stack.get(COMMENTS_120).await;
    assert_comments(&first, 0, 120);
    assert_eq!(
        pages_asked(f, "/comment/list").await,
        pages(&[("50", "0"), ("50", "50"), ("20", "100")])
    );
    let cursor = first.next_cursor().expect("811 comments exist");

    // The primary is healthy now: the cursor must still go to the fallback.
    stack.primary.reset().await;
    for (count, cursor) in [(20, 0), (20, 120)] {
        let page = primary_comments_page(POST_ID, cursor, 20, 811);
        stack.primary.comments(POST_ID, count, cursor, &page).await;
    }
    let second = stack.get(&with_cursor(COMMENTS_20, &cursor)).await;
    assert_comments(&second, 120, 140);
    assert_eq!(
        pages_asked(f, "/comment/list").await[3..],
        pages(&[("20", "120")])[..]
    );
    assert_eq!(
        stack.primary.request_count().await,
        0,
        "the cursor went to its issuer"
    );
}

/// The request a `Link: <...>; rel="next"` names.
fn next_link(a: &Answer) -> Option<&str> {
    let link = a.header("link")?;
    let next = link
        .strip_prefix('<')
        .and_then(|rest| rest.strip_suffix(">; rel=\"next\""));
    Some(next.unwrap_or_else(|| panic!("one link, to the next page: {link}")))
}

#[tokio::test]
async fn a_page_with_a_next_one_links_to_it_and_the_last_does_not() {
    let stack = Stack::start().await;
    let p = &stack.primary;
    p.comments(POST_ID, 7, 0, &primary_comments_page(POST_ID, 0, 7, 10))
        .await;
    p.comments(POST_ID, 7, 7, &primary_comments_page(POST_ID, 7, 3, 10))
        .await;
    p.detail(POST_ID, &fixtures::primary_aweme_detail()).await;
    let f = &stack.fallback;
    f.serve_fixtures().await;
    let mut more = fixtures::fallback_user_search();
    more["data"]["hasMore"] = json!(true);
    f.search("café au lait", 7, "0", &more).await;
    f.search("café au lait", 7, "2", &fixtures::fallback_user_search())
        .await;

    // The page size asked for is carried; a parameter the endpoint
    // ignores is not.
    let first = stack
        .get(&format!(
            "/v1/shortvideo/comments?id={POST_ID}&count=7&utm_source=x"
        ))
        .await;
    assert_comments(&first, 0, 7);
    let cursor = first.next_cursor().expect("10 comments exist");
    let next = next_link(&first).expect("a next page is linked");
    assert_eq!(
        next,
        format!("/v1/shortvideo/comments?id={POST_ID}&count=7&cursor={cursor}")
    );
    let last = stack.get(next).await;
    assert_comments(&last, 7, 10);
    assert_eq!(last.next_cursor(), None);
    assert_eq!(next_link(&last), None, "no page after the last");

    // Free text is encoded so that the link asks for the same query.
    let found = stack
        .get("/v1/shortvideo/search?query=caf%C3%A9%20au%20lait&count=7")
        .await;
    found.assert_success(true);
    let cursor = found.next_cursor().expect("the upstream has more");
    let next = next_link(&found).expect("a next page is linked");
    assert_eq!(
        next,
        format!("/v1/shortvideo/search?query=caf%C3%A9+au+lait&count=7&cursor={cursor}")
    );
    let second = stack.get(next).await;
    second.assert_success(true);
    assert_eq!(second.next_cursor(), None);
    assert_eq!(next_link(&second), None);

    // An item endpoint is never paged.
    let post = stack
        .get(&format!("/v1/shortvideo/post?id={POST_ID}"))
        .await;
    post.assert_success(false);
    assert_eq!(post.header("link"), None);
}

#[tokio::test]
async fn comments_stop_at_the_end_when_fewer_exist() {
    let stack = Stack::start().await;
    stack.primary.fail_all(500).await;
    let f = &stack.fallback;
    f.comments(POST_ID, 50, 0, &fallback_comments_page(0, 50, 70))
        .await;
    f.comments(POST_ID, 50, 50, &fallback_comments_page(50, 20, 70))
        .await;
    let a = stack.get(COMMENTS_120).await;
    assert_comments(&a, 0, 70);
    assert_eq!(a.next_cursor(), None, "no more comments");
}

/// The fallback's second page of posts: one post, the end.
fn fallback_posts_page_two() -> serde_json::Value {
    let mut body = fixtures::fallback_user_posts();
    let mut item = body["data"]["videos"][2].clone();
    set(&mut item, "/video_id", json!("7312345678901220001"));
    body["data"]["videos"] = json!([item]);
    body["data"]["cursor"] = json!("1761000000000");
    body["data"]["hasMore"] = json!(false);
    body
}

async fn serve_primary_posts(stack: &Stack) {
    let p = &stack.primary;
    p.profile(LUNA, &fixtures::primary_user_profile()).await;
    p.posts(LUNA_SEC_UID, 10, "0", &fixtures::primary_user_posts())
        .await;
    p.posts(
        LUNA_SEC_UID,
        10,
        POSTS_NEXT_CURSOR,
        &fixtures::primary_posts_page_two(),
    )
    .await;
}

async fn serve_fallback_posts(stack: &Stack) {
    let f = &stack.fallback;
    f.user_posts(LUNA, 10, "0", &fixtures::fallback_user_posts())
        .await;
    f.user_posts(LUNA, 10, POSTS_NEXT_CURSOR, &fallback_posts_page_two())
        .await;
}

#[tokio::test]
async fn a_posts_cursor_goes_back_to_the_primary() {
    let stack = Stack::start().await;
    serve_primary_posts(&stack).await;
    serve_fallback_posts(&stack).await;

    let first = stack.get(POSTS).await;
    first.assert_success(true);
    let cursor = first.next_cursor().expect("has_more 1");
    assert!(
        !cursor.contains(POSTS_NEXT_CURSOR),
        "the token is opaque: {cursor}"
    );
    assert!(
        !cursor.to_lowercase().contains("primary"),
        "the token is opaque: {cursor}"
    );

    let second = stack.get(&with_cursor(POSTS, &cursor)).await;
    second.assert_success(true);
    assert_eq!(
        second.data().as_array().map(Vec::len),
        Some(1),
        "{second:?}"
    );
    assert_eq!(second.data()[0]["id"], "7312345678901220000");
    assert_eq!(second.next_cursor(), None, "has_more 0 ends the list");

    let asked: Vec<String> = stack
        .primary
        .requests_to("/v1/user/posts")
        .await
        .iter()
        .map(|r| query_param(r, "max_cursor").unwrap_or_default())
        .collect();
    assert_eq!(asked, ["0", POSTS_NEXT_CURSOR]);
    assert_eq!(stack.fallback.request_count().await, 0);
}

#[tokio::test]
async fn a_posts_cursor_goes_back_to_the_fallback_that_issued_it() {
    let stack = Stack::start().await;
    stack.primary.fail_all(500).await;
    serve_fallback_posts(&stack).await;
    let first = stack.get(POSTS).await;
    first.assert_success(true);
    assert_eq!(
        first.data()[0]["duration_ms"],
        15000,
        "the fallback answered"
    );
    let cursor = first.next_cursor().expect("hasMore true");

    // The primary is healthy now, and first in the chain.
    stack.primary.reset().await;
    serve_primary_posts(&stack).await;
    let second = stack.get(&with_cursor(POSTS, &cursor)).await;
    second.assert_success(true);
    assert_eq!(second.data()[0]["id"], "7312345678901220001", "{second:?}");
    assert_eq!(second.next_cursor(), None);
    assert_eq!(
        stack.primary.request_count().await,
        0,
        "the cursor went to its issuer"
    );
    let asked: Vec<String> = stack
        .fallback
        .requests_to("/user/posts")
        .await
        .iter()
        .map(|r| query_param(r, "cursor").unwrap_or_default())
        .collect();
    assert_eq!(asked, ["0", POSTS_NEXT_CURSOR]);
}

/// A later page goes to the provider that issued its cursor, or fails.
/// And (paging review, defect 1) with the cache on, the listing's first
/// page, whose cursor leads to that provider, was handed out again to a
/// caller who started the listing again, as told, for the page's whole
/// time in the cache. The failed later page forgets it: the listing starts
/// again with a provider that answers, and goes on with it.
#[tokio::test]
async fn the_issuer_of_a_cursor_failing_is_502_and_starting_again_reaches_another() {
    let stack = Stack::builder().cache("enabled = true").start().await;
    serve_primary_posts(&stack).await;
    let cursor = stack.get(POSTS).await.next_cursor().expect("has_more 1");
    let hit = stack.get(POSTS).await;
    assert!(hit
        .header("cache-status")
        .is_some_and(|s| s.contains("hit")));
    stack.primary.reset().await;
    stack.primary.fail_all(500).await;
    serve_fallback_posts(&stack).await;
    stack
        .get(&with_cursor(POSTS, &cursor))
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
    assert_eq!(
        stack.fallback.request_count().await,
        0,
        "upstream cursors do not transfer"
    );

    let again = stack.get(POSTS).await;
    again.assert_success(true);
    let status = again.header("cache-status").unwrap_or_default();
    assert!(status.contains("fwd=miss"), "fetched anew: {status}");
    assert_eq!(
        again.data()[0]["duration_ms"],
        15000,
        "the fallback answered"
    );
    let next = again.next_cursor().expect("hasMore true");
    let second = stack.get(&with_cursor(POSTS, &next)).await;
    second.assert_success(true);
    assert_eq!(second.data()[0]["id"], "7312345678901220001", "{second:?}");
}

/// `token` with the character at `at` replaced by another of its alphabet.
fn flip(token: &str, at: usize) -> String {
    let mut chars: Vec<char> = token.chars().collect();
    chars[at] = if chars[at] == 'A' { 'B' } else { 'A' };
    chars.into_iter().collect()
}

#[tokio::test]
async fn a_tampered_or_made_up_cursor_is_refused() {
    let stack = Stack::start().await;
    serve_primary_posts(&stack).await;
    let cursor = stack.get(POSTS).await.next_cursor().expect("has_more 1");
    let before = stack.primary.request_count().await;
    let n = cursor.chars().count();
    let mut bad = vec![
        flip(&cursor, n / 2),
        flip(&cursor, 0),
        flip(&cursor, n * 3 / 4),
        cursor.chars().take(n - 4).collect::<String>(),
        format!("{cursor}AAAA"),
        "not-a-cursor".to_owned(),
        POSTS_NEXT_CURSOR.to_owned(),
    ];
    bad.dedup();
    for token in bad {
        let a = stack.get(&with_cursor(POSTS, &token)).await;
        a.assert_invalid("cursor");
    }
    assert_eq!(
        stack.primary.request_count().await,
        before,
        "refused before any upstream"
    );
    assert_eq!(stack.fallback.request_count().await, 0);
}

#[tokio::test]
async fn a_cursor_only_continues_its_own_endpoint_and_subject() {
    let stack = Stack::start().await;
    serve_primary_posts(&stack).await;
    stack
        .primary
        .comments(POST_ID, 3, 0, &fixtures::primary_comment_list())
        .await;
    let posts_cursor = stack.get(POSTS).await.next_cursor().expect("has_more 1");
    let comments = stack
        .get("/v1/shortvideo/comments?id=7312345678901234567&count=3")
        .await;
    let comments_cursor = comments.next_cursor().expect("811 comments exist");
    let before = stack.primary.request_count().await;

    let misplaced = [
        ("/v1/shortvideo/posts?username=someoneelse", &posts_cursor),
        (
            "/v1/shortvideo/comments?id=7312345678901234567&count=3",
            &posts_cursor,
        ),
        ("/v1/shortvideo/search?query=lunabakes", &posts_cursor),
        (
            "/v1/shortvideo/comments?id=7312345678901234568&count=3",
            &comments_cursor,
        ),
        ("/v1/shortvideo/posts?username=lunabakes", &comments_cursor),
    ];
    for (path, token) in misplaced {
        let a = stack.get(&with_cursor(path, token)).await;
        a.assert_invalid("cursor");
    }
    assert_eq!(
        stack.primary.request_count().await,
        before,
        "refused before any upstream"
    );
    assert_eq!(stack.fallback.request_count().await, 0);
}

#[tokio::test]
async fn an_empty_cursor_is_the_first_page() {
    let stack = Stack::start().await;
    serve_primary_posts(&stack).await;
    let a = stack.get(&format!("{POSTS}&cursor=")).await;
    a.assert_success(true);
    assert_eq!(a.data().as_array().map(Vec::len), Some(3), "{a:?}");
}

#[tokio::test]
async fn a_cursor_from_another_server_process_is_refused() {
    // Without cursor_key_env each process seals cursors with its own key.
    let mut stack = Stack::start().await;
    serve_primary_posts(&stack).await;
    let cursor = stack.get(POSTS).await.next_cursor().expect("has_more 1");
    stack.restart();
    stack
        .get(&with_cursor(POSTS, &cursor))
        .await
        .assert_invalid("cursor");
}

#[tokio::test]
async fn with_cursor_key_env_a_cursor_survives_a_restart() {
    let mut stack = Stack::builder()
        .server_line("cursor_key_env = \"SG_TEST_CURSOR_KEY\"")
        .env(
            "SG_TEST_CURSOR_KEY",
            "c3VwZXItc2VjcmV0LWN1cnNvci1rZXktZm9yLXRlc3Q=",
        )
        .start()
        .await;
    serve_primary_posts(&stack).await;
    let cursor = stack.get(POSTS).await.next_cursor().expect("has_more 1");
    stack.restart();
    let a = stack.get(&with_cursor(POSTS, &cursor)).await;
    a.assert_success(true);
    assert_eq!(a.data()[0]["id"], "7312345678901220000", "{a:?}");
}

// Audit finding 9: upstream numbers and cursors are checked, never trusted.

#[tokio::test]
async fn unchecked_upstream_data_an_offset_at_u64_max_ends_the_listing_instead_of_wrapping() {
    let stack = Stack::start().await;
    stack.fallback.fail_all(500).await;
    let p = &stack.primary;
    // The first page jumps the offset to u64::MAX; the next one floods.
    let mut first = primary_comments_page(POST_ID, 0, 50, 811);
    first["cursor"] = json!(u64::MAX);
    p.comments(POST_ID, 50, 0, &first).await;
    let mut flood = primary_comments_page(POST_ID, 50, 20, 811);
    flood["cursor"] = json!(u64::MAX);
    p.comments(POST_ID, 10, u64::MAX, &flood).await;

    let a = stack
        .get("/v1/shortvideo/comments?id=7312345678901234567&count=60")
        .await;
    assert_comments(&a, 0, 60);
    assert_eq!(
        a.next_cursor(),
        None,
        "no offset lies past u64::MAX: the listing ends rather than restarting"
    );
}

#[tokio::test]
async fn unchecked_upstream_data_a_cursor_that_does_not_advance_ends_the_listing() {
    let stack = Stack::start().await;
    stack.fallback.fail_all(500).await;
    let p = &stack.primary;
    // Comments: `"cursor": 0, "has_more": 1` on the first page.
    let mut stuck = primary_comments_page(POST_ID, 0, 20, 811);
    stuck["cursor"] = json!(0);
    p.comments(POST_ID, 20, 0, &stuck).await;
    let a = stack.get(COMMENTS_20).await;
    assert_comments(&a, 0, 20);
    assert_eq!(a.next_cursor(), None, "comments: {a:?}");

    // Posts: the `max_cursor` asked for comes back.
    p.profile(LUNA, &fixtures::primary_user_profile()).await;
    let mut posts = fixtures::primary_user_posts();
    posts["max_cursor"] = json!(0);
    posts["has_more"] = json!(1);
    p.posts(LUNA_SEC_UID, 10, "0", &posts).await;
    let a = stack.get(POSTS).await;
    a.assert_success(true);
    assert_eq!(a.next_cursor(), None, "primary posts: {a:?}");

    // The fallback's posts and search: the cursor asked for comes back.
    stack.primary.fail_all(500).await;
    stack.fallback.reset().await;
    let f = &stack.fallback;
    let mut posts = fixtures::fallback_user_posts();
    posts["data"]["cursor"] = json!("0");
    posts["data"]["hasMore"] = json!(true);
    f.user_posts(LUNA, 10, "0", &posts).await;
    let a = stack.get(POSTS).await;
    a.assert_success(true);
    assert_eq!(a.next_cursor(), None, "fallback posts: {a:?}");
    let mut search = fixtures::fallback_user_search();
    search["data"]["cursor"] = json!(0);
    search["data"]["hasMore"] = json!(true);
    f.search("luna", 10, "0", &search).await;
    let a = stack.get("/v1/shortvideo/search?query=luna").await;
    a.assert_success(true);
    assert_eq!(a.next_cursor(), None, "fallback search: {a:?}");
}

#[tokio::test]
async fn unchecked_upstream_data_an_empty_page_that_claims_more_ends_the_listing() {
    // Each upstream page empty, "more" claimed, the cursor moving on: a
    // caller following next_cursor would get empty pages for ever, each
    // one paid for.
    let stack = Stack::start().await;
    stack.primary.fail_all(500).await;
    let f = &stack.fallback;
    let mut posts = fixtures::fallback_user_posts();
    posts["data"]["videos"] = json!([]);
    posts["data"]["cursor"] = json!("1761000000000");
    posts["data"]["hasMore"] = json!(true);
    f.user_posts(LUNA, 10, "0", &posts).await;
    let a = stack.get(POSTS).await;
    a.assert_success(true);
    assert_eq!(a.json["data"], json!([]), "fallback posts: {a:?}");
    assert_eq!(a.next_cursor(), None, "fallback posts: {a:?}");
    assert_eq!(next_link(&a), None, "fallback posts: {a:?}");

    let mut search = fixtures::fallback_user_search();
    search["data"]["user_list"] = json!([]);
    search["data"]["cursor"] = json!(10);
    search["data"]["hasMore"] = json!(true);
    f.search("luna", 10, "0", &search).await;
    let a = stack.get("/v1/shortvideo/search?query=luna").await;
    a.assert_success(true);
    assert_eq!(a.json["data"], json!([]), "fallback search: {a:?}");
    assert_eq!(a.next_cursor(), None, "fallback search: {a:?}");
}

// Audit finding 6: cursor crypto fit for a key that lives for years.

const CURSOR_KEY_A: &str = "the-first-cursor-secret-of-32-chars-or-more";
const CURSOR_KEY_B: &str = "the-second-cursor-secret-of-32-chars-or-more";

#[tokio::test]
async fn cursor_crypto_for_long_lived_keys_tokens_expire_after_cursor_ttl_s() {
    let stack = Stack::builder()
        .server_line("cursor_ttl_s = 1")
        .start()
        .await;
    serve_primary_posts(&stack).await;
    let cursor = stack.get(POSTS).await.next_cursor().expect("has_more 1");
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let a = stack.get(&with_cursor(POSTS, &cursor)).await;
    a.assert_invalid("cursor");
    assert!(a.error_message().contains("has expired"), "{a:?}");
}

/// HTTP sweep: with a `cursor_ttl_s` shorter than the cache's TTL, a page
/// said `max-age` past its token's life, so a client's own cache handed
/// out a cursor refused as expired. A page with a next cursor is fresh for
/// at most half the token's life; one without keeps the cache's TTL.
#[tokio::test]
async fn a_pages_max_age_never_outlives_its_cursor() {
    let stack = Stack::builder()
        .server_line("cursor_ttl_s = 6")
        .cache("enabled = true")
        .start()
        .await;
    serve_primary_posts(&stack).await;
    stack.primary.serve_fixtures().await;
    let page = stack.get(POSTS).await;
    assert!(page.next_cursor().is_some(), "{page:?}");
    assert_eq!(
        page.header("cache-control"),
        Some("private, max-age=3"),
        "{page:?}"
    );
    let profile = stack.get("/v1/shortvideo/profile?username=lunabakes").await;
    let said = profile.header("cache-control").unwrap_or_default();
    assert!(
        said.starts_with("private, max-age=") && said != "private, max-age=3",
        "{said}"
    );
}

/// Paging review, defect 4: a `304` for a page confirmed a stored body
/// whose token had expired, so a client revalidating page one was stuck
/// with a cursor refused as expired. A page is confirmed only while its
/// token has half its life left; after that it comes whole, with a new
/// token that opens.
#[tokio::test]
async fn a_304_never_confirms_a_page_whose_cursor_has_expired() {
    let stack = Stack::builder()
        .server_line("cursor_ttl_s = 2")
        .start()
        .await;
    serve_primary_posts(&stack).await;
    let revalidate = |tag: String| {
        let api = stack.api.clone();
        async move {
            api.request_with("GET", POSTS, &[("if-none-match", &tag)])
                .await
        }
    };
    // At once: confirmed (tried thrice, in case one crossed a second).
    let mut confirmed = false;
    for _ in 0..3 {
        let page = stack.get(POSTS).await;
        let tag = page.header("etag").expect("an ETag").to_owned();
        if revalidate(tag).await.status == 304 {
            confirmed = true;
            break;
        }
    }
    assert!(confirmed, "a fresh page is confirmed by its tag");

    let page = stack.get(POSTS).await;
    let tag = page.header("etag").expect("an ETag").to_owned();
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let again = revalidate(tag).await;
    again.assert_success(true);
    let cursor = again.next_cursor().expect("a new token");
    stack
        .get(&with_cursor(POSTS, &cursor))
        .await
        .assert_success(true);
}

#[tokio::test]
async fn cursor_crypto_for_long_lived_keys_the_previous_key_still_opens_after_a_rotation() {
    let mut stack = Stack::builder()
        .server_line("cursor_key_env = \"SG_CURSOR_KEY_A\"")
        .env("SG_CURSOR_KEY_A", CURSOR_KEY_A)
        .env("SG_CURSOR_KEY_B", CURSOR_KEY_B)
        .start()
        .await;
    serve_primary_posts(&stack).await;
    let cursor = stack.get(POSTS).await.next_cursor().expect("has_more 1");

    // Rotate: B seals from now on, A still opens.
    let text = stack.config.text();
    let rotated = text.replace(
        "cursor_key_env = \"SG_CURSOR_KEY_A\"",
        "cursor_key_env = \"SG_CURSOR_KEY_B\"\ncursor_key_previous_env = \"SG_CURSOR_KEY_A\"",
    );
    assert_ne!(text, rotated);
    std::fs::write(stack.config.path(), &rotated).unwrap();
    stack.restart();
    let a = stack.get(&with_cursor(POSTS, &cursor)).await;
    a.assert_success(true);
    assert_eq!(a.data()[0]["id"], "7312345678901220000", "{a:?}");
    let fresh = stack.get(POSTS).await.next_cursor().expect("has_more 1");

    // A retired: its tokens are refused, B's still open.
    let retired = text.replace("SG_CURSOR_KEY_A", "SG_CURSOR_KEY_B");
    std::fs::write(stack.config.path(), retired).unwrap();
    stack.restart();
    stack
        .get(&with_cursor(POSTS, &cursor))
        .await
        .assert_invalid("cursor");
    stack
        .get(&with_cursor(POSTS, &fresh))
        .await
        .assert_success(true);
}

#[tokio::test]
async fn cursor_crypto_for_long_lived_keys_tokens_of_either_provider_have_one_length() {
    let stack = Stack::start().await;
    serve_primary_posts(&stack).await;
    serve_fallback_posts(&stack).await;
    let primary = stack.get(POSTS).await.next_cursor().expect("has_more 1");
    stack.primary.reset().await;
    stack.primary.fail_all(500).await;
    let fallback = stack.get(POSTS).await.next_cursor().expect("hasMore true");
    assert_eq!(stack.fallback.requests_to("/user/posts").await.len(), 1);
    assert_eq!(
        primary.len(),
        fallback.len(),
        "the length says nothing of the issuer: {primary} {fallback}"
    );
}

/// The first bytes of an URL-safe base64 string (no padding), enough to
/// read a token's key ID.
fn base64url_prefix(text: &str, bytes: usize) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'-' => 62,
        b'_' => 63,
        _ => panic!("not base64url: {c}"),
    };
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0);
    for c in text.bytes() {
        acc = (acc << 6) | u32::from(value(c));
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            if out.len() == bytes {
                break;
            }
        }
    }
    out
}

/// Audit finding 9: a page's ETag is keyed, so a caller who guesses the
/// hidden upstream cursor cannot confirm the guess offline by hashing what
/// the answer shows (platform, data, the token's key ID, the time) with it.
#[tokio::test]
async fn a_listing_etag_does_not_confirm_a_guessed_upstream_cursor_offline() {
    let stack = Stack::start().await;
    serve_primary_posts(&stack).await;
    let page = stack.get(POSTS).await;
    page.assert_success(true);
    let tag = page.header("etag").expect("an ETag").to_owned();
    let token = page.next_cursor().expect("a next page");
    let data = {
        let start = page.text.find("\"data\":").expect("data") + "\"data\":".len();
        let end = page.text.rfind(",\"meta\":").expect("meta");
        &page.text[start..end]
    };
    let key_id = base64url_prefix(&token, 4);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    // The default cursor_ttl_s is a day; its half is the tag's epoch.
    let half = 43_200;
    let offline = |cursor: &str, epoch: u64| {
        let mut stamp = key_id.clone();
        stamp.extend_from_slice(&epoch.to_le_bytes());
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        for part in [
            b"shortvideo".as_slice(),
            data.as_bytes(),
            cursor.as_bytes(),
            &stamp,
        ] {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        format!("\"{:032x}\"", hasher.digest128())
    };
    for epoch in [now / half, now / half - 1] {
        // The plugin's cursor: P2's `max_cursor` and the `sec_uid`.
        let guess = format!("{POSTS_NEXT_CURSOR}:{LUNA_SEC_UID}");
        assert_ne!(
            offline(&guess, epoch),
            tag,
            "the upstream cursor is confirmed offline by the ETag"
        );
    }
    // Revalidation is unchanged.
    let again = stack
        .api
        .request_with("GET", POSTS, &[("if-none-match", &tag)])
        .await;
    assert_eq!(again.status, 304, "{again:?}");
}

/// Audit finding 11: an upstream whose cursors cycle A -> B -> A ends the
/// listing (no next cursor) when it comes back to A, rather than paging
/// (and charging) forever.
#[tokio::test]
async fn an_upstream_cycling_its_cursors_a_b_a_ends_the_listing() {
    let stack = Stack::start().await;
    let p = &stack.primary;
    let (a, b) = (POSTS_NEXT_CURSOR, "1762400000000");
    let page_to = |next: &str| {
        let mut body = fixtures::primary_user_posts();
        body["max_cursor"] = json!(next.parse::<u64>().expect("digits"));
        body["has_more"] = json!(1);
        body
    };
    p.profile(LUNA, &fixtures::primary_user_profile()).await;
    p.posts(LUNA_SEC_UID, 10, "0", &page_to(a)).await;
    p.posts(LUNA_SEC_UID, 10, a, &page_to(b)).await;
    p.posts(LUNA_SEC_UID, 10, b, &page_to(a)).await;

    let first = stack.get(POSTS).await;
    first.assert_success(true);
    let to_b = first.next_cursor().expect("page A follows");
    let second = stack.get(&with_cursor(POSTS, &to_b)).await;
    second.assert_success(true);
    let to_a = second.next_cursor().expect("page B follows");
    let third = stack.get(&with_cursor(POSTS, &to_a)).await;
    third.assert_success(true);
    assert_eq!(
        third.json["meta"]["next_cursor"],
        serde_json::Value::Null,
        "back at A: the listing ends {third:?}"
    );
}
