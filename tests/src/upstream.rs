//! Doubles of the two upstreams (fixtures/upstreams/CONTRACT.md), on
//! wiremock, answering with the sample payloads beside the contract.
//!
//! Every route matches the exact path, the exact set of query parameters and
//! the provider's auth headers. A request that matches no route is answered
//! 500 by a guard that expects never to be hit: the double then fails the
//! test when it is dropped, listing what it received. Deliberate failures
//! (`fail_all`, `answer_all`) rank below every route and above the guard.

use serde_json::{json, Value};
use wiremock::matchers::{header, method, path};
use wiremock::{Match, Mock, MockBuilder, MockServer, Request, Respond, ResponseTemplate};

use crate::api::Answer;
use crate::config::{FALLBACK_KEY, PRIMARY_KEY};

/// The user every fixture is about.
pub const LUNA: &str = "lunabakes";
/// Her `sec_uid`, which the primary's posts route needs (from P1).
pub const LUNA_SEC_UID: &str =
    "MS4wLjABAAAAUpRG8iW2MhXVncQ_Q6ZPp95JEbGbb3Ud7t6xeNXYqFXc9VkGLe00zpLrZm4Gt2Kl";
/// The post the fixtures describe.
pub const POST_ID: &str = "7312345678901234567";
/// The fallback's opaque media key for that post: never an `id`.
pub const OPAQUE_KEY: &str = "v15044gf0000d724vbfog65ugaj79100";
/// The primary's `max_cursor` after the first page of posts.
pub const POSTS_NEXT_CURSOR: &str = "1762500000000";

/// `followers` in each double's profile fixture: who answered.
pub const PRIMARY_FOLLOWERS: u64 = 5_479_588;
pub const FALLBACK_FOLLOWERS: u64 = 5_500_000;

/// Asserts a profile answer whose `followers` is `followers`: the double
/// with that figure answered. `what` names the moment in the message.
pub fn assert_answered_by(a: &Answer, followers: u64, what: &str) {
    a.assert_success(false);
    assert_eq!(a.data()["followers"], followers, "{what}: {a:?}");
}

/// Priority of deliberate failures: below every route (default 5).
const FAILURE_PRIORITY: u8 = 200;
/// Priority of the guard against requests the contract does not describe.
const GUARD_PRIORITY: u8 = 255;

/// The sample payloads beside CONTRACT.md.
pub mod fixtures {
    use serde_json::{json, Value};

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).expect("fixtures are JSON")
    }

    pub fn primary_user_profile() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/primary/user_profile.json"
        ))
    }
    pub fn primary_user_posts() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/primary/user_posts.json"
        ))
    }
    /// A second page of [`primary_user_posts`]: one post (a copy of the
    /// third with its own ID), the end.
    pub fn primary_posts_page_two() -> Value {
        let mut body = primary_user_posts();
        let mut item = body["aweme_list"][2].clone();
        item["aweme_id"] = json!("7312345678901220000");
        body["aweme_list"] = json!([item]);
        body["max_cursor"] = json!(1761000000000u64);
        body["has_more"] = json!(0);
        body
    }
    pub fn primary_aweme_detail() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/primary/aweme_detail.json"
        ))
    }
    pub fn primary_comment_list() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/primary/comment_list.json"
        ))
    }
    pub fn primary_user_not_found() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/primary/error_user_not_found.json"
        ))
    }
    pub fn primary_video_unavailable() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/primary/error_video_unavailable.json"
        ))
    }
    pub fn primary_detail_null() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/primary/error_detail_null.json"
        ))
    }
    pub fn primary_try_again() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/primary/error_try_again.json"
        ))
    }
    pub fn primary_soft_block() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/primary/error_soft_block.json"
        ))
    }
    pub fn fallback_user_info() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/fallback/user_info.json"
        ))
    }
    pub fn fallback_user_posts() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/fallback/user_posts.json"
        ))
    }
    pub fn fallback_video_detail() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/fallback/video_detail.json"
        ))
    }
    pub fn fallback_comment_list() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/fallback/comment_list.json"
        ))
    }
    pub fn fallback_user_search() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/fallback/user_search.json"
        ))
    }
    pub fn fallback_user_not_found() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/fallback/error_user_not_found.json"
        ))
    }
    pub fn fallback_video_not_found() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/fallback/error_video_not_found.json"
        ))
    }
    pub fn fallback_rate_limit() -> Value {
        parse(include_str!(
            "../../fixtures/upstreams/fallback/error_rate_limit.json"
        ))
    }
}

const BARE_MARK: &str = "@@bare-int@@";

/// A placeholder that [`render`] writes as a bare JSON integer of any size
/// (`serde_json::Value` cannot hold one above `u64::MAX`).
pub fn bare_int(digits: &str) -> Value {
    assert!(
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()),
        "bare_int takes digits, got {digits:?}"
    );
    Value::String(format!("{BARE_MARK}{digits}"))
}

/// `value` as JSON text, with every [`bare_int`] written unquoted.
pub fn render(value: &Value) -> String {
    let text = value.to_string();
    let quoted_mark = format!("\"{BARE_MARK}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(start) = rest.find(&quoted_mark) {
        out.push_str(&rest[..start]);
        let after = &rest[start + quoted_mark.len()..];
        let end = after.find('"').expect("a placeholder ends with a quote");
        out.push_str(&after[..end]);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Replaces the value at the JSON pointer `pointer`; panics if absent.
pub fn set(value: &mut Value, pointer: &str, new: Value) {
    *value
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("no {pointer} in the fixture")) = new;
}

/// A 200 answer with `body` rendered as JSON.
pub fn json_response(body: &Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(render(body), "application/json")
}

/// Matches a request whose query is exactly these pairs, in any order.
struct QueryIs(Vec<(String, String)>);

impl QueryIs {
    fn new(pairs: &[(&str, &str)]) -> QueryIs {
        let mut pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        pairs.sort();
        QueryIs(pairs)
    }
}

impl Match for QueryIs {
    fn matches(&self, request: &Request) -> bool {
        let mut got = query_pairs(request);
        got.sort();
        got == self.0
    }
}

/// A request's decoded query pairs, in order.
pub fn query_pairs(request: &Request) -> Vec<(String, String)> {
    request
        .url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// One decoded query parameter of a request.
pub fn query_param(request: &Request, name: &str) -> Option<String> {
    request
        .url
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// What both doubles share: the server, the guard, the request log.
pub struct Upstream {
    server: MockServer,
}

impl Upstream {
    async fn start() -> Upstream {
        let upstream = Upstream {
            server: MockServer::start().await,
        };
        upstream.mount_guard().await;
        upstream
    }

    async fn mount_guard(&self) {
        Mock::given(wiremock::matchers::any())
            .respond_with(
                ResponseTemplate::new(500).set_body_string("no route of the double matches"),
            )
            .with_priority(GUARD_PRIORITY)
            .named("a request the upstream contract does not describe")
            .expect(0)
            .mount(&self.server)
            .await;
    }

    /// `http://127.0.0.1:PORT`, the provider's `base_url`.
    pub fn base_url(&self) -> String {
        self.server.uri()
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        self.server.address().to_string()
    }

    pub fn port(&self) -> u16 {
        self.server.address().port()
    }

    /// Every request received so far, in order.
    pub async fn requests(&self) -> Vec<Request> {
        self.server
            .received_requests()
            .await
            .expect("request recording is on")
    }

    pub async fn request_count(&self) -> usize {
        self.requests().await.len()
    }

    /// The requests received on `path`, in order.
    pub async fn requests_to(&self, wanted: &str) -> Vec<Request> {
        self.requests()
            .await
            .into_iter()
            .filter(|r| r.url.path() == wanted)
            .collect()
    }

    /// Forgets every route and every request received; the guard stays.
    pub async fn reset(&self) {
        self.server.reset().await;
        self.mount_guard().await;
    }

    /// Answers every request without a route with HTTP `status`, a body and
    /// a header that name the upstream (which must never reach a caller).
    pub async fn fail_all(&self, status: u16) {
        Mock::given(wiremock::matchers::any())
            .respond_with(
                ResponseTemplate::new(status)
                    .insert_header("x-upstream-trace", "upstream-trace-marker")
                    .set_body_string(format!(
                        "upstream-trace-marker: HTTP {status}, Try again later"
                    )),
            )
            .with_priority(FAILURE_PRIORITY)
            .mount(&self.server)
            .await;
    }

    /// Answers every request without a route with HTTP 200 and `body`.
    pub async fn answer_all(&self, body: &Value) {
        Mock::given(wiremock::matchers::any())
            .respond_with(
                json_response(body).insert_header("x-upstream-trace", "upstream-trace-marker"),
            )
            .with_priority(FAILURE_PRIORITY)
            .mount(&self.server)
            .await;
    }

    /// Answers every request without a route with `response`.
    pub async fn respond_all(&self, response: ResponseTemplate) {
        Mock::given(wiremock::matchers::any())
            .respond_with(response)
            .with_priority(FAILURE_PRIORITY)
            .mount(&self.server)
            .await;
    }

    /// Mounts `route` answered by `responder`, which sees each request (to
    /// echo what it received, say).
    pub async fn respond_with(&self, route: MockBuilder, responder: impl Respond + 'static) {
        route.respond_with(responder).mount(&self.server).await;
    }

    /// Mounts a route answering with a response of the test's choice.
    pub async fn respond(&self, route: MockBuilder, response: ResponseTemplate) {
        route.respond_with(response).mount(&self.server).await;
    }
}

/// The primary upstream (mobile API wrapper): `X-Api-Key`, `status_code`.
pub struct PrimaryMock {
    pub upstream: Upstream,
}

impl std::ops::Deref for PrimaryMock {
    type Target = Upstream;
    fn deref(&self) -> &Upstream {
        &self.upstream
    }
}

impl PrimaryMock {
    pub async fn start() -> PrimaryMock {
        PrimaryMock {
            upstream: Upstream::start().await,
        }
    }

    /// A GET of `route` with exactly `query` and the primary's key.
    pub fn route(&self, route: &str, query: &[(&str, &str)]) -> MockBuilder {
        Mock::given(method("GET"))
            .and(path(route))
            .and(header("X-Api-Key", PRIMARY_KEY))
            .and(QueryIs::new(query))
    }

    /// P1 `/v1/user/profile?unique_id=`.
    pub async fn profile(&self, username: &str, body: &Value) {
        let route = self.route("/v1/user/profile", &[("unique_id", username)]);
        self.respond(route, json_response(body)).await;
    }

    /// P2 `/v1/user/posts?sec_user_id=&count=&max_cursor=`.
    pub async fn posts(&self, sec_uid: &str, count: u32, max_cursor: &str, body: &Value) {
        let count = count.to_string();
        let route = self.route(
            "/v1/user/posts",
            &[
                ("sec_user_id", sec_uid),
                ("count", &count),
                ("max_cursor", max_cursor),
            ],
        );
        self.respond(route, json_response(body)).await;
    }

    /// P3 `/v1/aweme/detail?aweme_id=`.
    pub async fn detail(&self, id: &str, body: &Value) {
        let route = self.route("/v1/aweme/detail", &[("aweme_id", id)]);
        self.respond(route, json_response(body)).await;
    }

    /// P4 `/v1/comment/list?aweme_id=&count=&cursor=`.
    pub async fn comments(&self, id: &str, count: u32, cursor: u64, body: &Value) {
        let (count, cursor) = (count.to_string(), cursor.to_string());
        let route = self.route(
            "/v1/comment/list",
            &[("aweme_id", id), ("count", &count), ("cursor", &cursor)],
        );
        self.respond(route, json_response(body)).await;
    }

    /// The fixtures, as asked by the default requests of each endpoint:
    /// profile and posts (count 10) of `lunabakes`, post and comments
    /// (count 3) of [`POST_ID`].
    pub async fn serve_fixtures(&self) {
        self.profile(LUNA, &fixtures::primary_user_profile()).await;
        self.posts(LUNA_SEC_UID, 10, "0", &fixtures::primary_user_posts())
            .await;
        self.detail(POST_ID, &fixtures::primary_aweme_detail())
            .await;
        self.comments(POST_ID, 3, 0, &fixtures::primary_comment_list())
            .await;
    }
}

/// The fallback upstream (`{code,msg,data}` wrapper): RapidAPI headers.
pub struct FallbackMock {
    pub upstream: Upstream,
}

impl std::ops::Deref for FallbackMock {
    type Target = Upstream;
    fn deref(&self) -> &Upstream {
        &self.upstream
    }
}

impl FallbackMock {
    pub async fn start() -> FallbackMock {
        FallbackMock {
            upstream: Upstream::start().await,
        }
    }

    /// A GET of `route` with exactly `query` and both RapidAPI headers; the
    /// host header is the base URL's host without its port.
    pub fn route(&self, route: &str, query: &[(&str, &str)]) -> MockBuilder {
        Mock::given(method("GET"))
            .and(path(route))
            .and(header("X-RapidAPI-Key", FALLBACK_KEY))
            .and(header("X-RapidAPI-Host", "127.0.0.1"))
            .and(QueryIs::new(query))
    }

    /// F1 `/user/info?unique_id=`.
    pub async fn user_info(&self, username: &str, body: &Value) {
        let route = self.route("/user/info", &[("unique_id", username)]);
        self.respond(route, json_response(body)).await;
    }

    /// F2 `/user/posts?unique_id=&count=&cursor=`.
    pub async fn user_posts(&self, username: &str, count: u32, cursor: &str, body: &Value) {
        let count = count.to_string();
        let route = self.route(
            "/user/posts",
            &[
                ("unique_id", username),
                ("count", &count),
                ("cursor", cursor),
            ],
        );
        self.respond(route, json_response(body)).await;
    }

    /// F3 `/?url={id}&hd=1`.
    pub async fn video(&self, id: &str, body: &Value) {
        let route = self.route("/", &[("url", id), ("hd", "1")]);
        self.respond(route, json_response(body)).await;
    }

    /// F4 `/comment/list?url=&count=&cursor=`.
    pub async fn comments(&self, id: &str, count: u32, cursor: u64, body: &Value) {
        let (count, cursor) = (count.to_string(), cursor.to_string());
        let route = self.route(
            "/comment/list",
            &[("url", id), ("count", &count), ("cursor", &cursor)],
        );
        self.respond(route, json_response(body)).await;
    }

    /// F5 `/user/search?keywords=&count=&cursor=`.
    pub async fn search(&self, keywords: &str, count: u32, cursor: &str, body: &Value) {
        let count = count.to_string();
        let route = self.route(
            "/user/search",
            &[
                ("keywords", keywords),
                ("count", &count),
                ("cursor", cursor),
            ],
        );
        self.respond(route, json_response(body)).await;
    }

    /// The fixtures, as asked by the default requests of each endpoint:
    /// profile and posts (count 10) of `lunabakes`, post and comments
    /// (count 3) of [`POST_ID`], search for `luna` (count 10).
    pub async fn serve_fixtures(&self) {
        self.user_info(LUNA, &fixtures::fallback_user_info()).await;
        self.user_posts(LUNA, 10, "0", &fixtures::fallback_user_posts())
            .await;
        self.video(POST_ID, &fixtures::fallback_video_detail())
            .await;
        self.comments(POST_ID, 3, 0, &fixtures::fallback_comment_list())
            .await;
        self.search("luna", 10, "0", &fixtures::fallback_user_search())
            .await;
    }
}

/// The ID of the `i`-th generated comment (0-based across pages).
pub fn comment_id(i: u64) -> String {
    (7_314_000_000_000_000_000u64 + i).to_string()
}

/// The text of the `i`-th generated comment.
pub fn comment_text(i: u64) -> String {
    format!("comment #{i} 💬")
}

/// A primary P4 page of generated comments `offset..offset + n` out of `total`.
pub fn primary_comments_page(aweme_id: &str, offset: u64, n: u64, total: u64) -> Value {
    let mut body = fixtures::primary_comment_list();
    let template = body["comments"][0].clone();
    let items: Vec<Value> = (offset..offset + n)
        .map(|i| {
            let mut c = template.clone();
            c["cid"] = json!(comment_id(i));
            c["text"] = json!(comment_text(i));
            c["aweme_id"] = json!(aweme_id);
            c["digg_count"] = json!(i);
            c
        })
        .collect();
    body["comments"] = Value::Array(items);
    body["cursor"] = json!(offset + n);
    body["has_more"] = json!(u8::from(offset + n < total));
    body["total"] = json!(total);
    body
}

/// A fallback F4 page of generated comments `offset..offset + n` out of `total`.
pub fn fallback_comments_page(offset: u64, n: u64, total: u64) -> Value {
    let mut body = fixtures::fallback_comment_list();
    let template = body["data"]["comments"][0].clone();
    let items: Vec<Value> = (offset..offset + n)
        .map(|i| {
            let mut c = template.clone();
            c["id"] = json!(comment_id(i));
            c["text"] = json!(comment_text(i));
            c["digg_count"] = json!(i);
            c
        })
        .collect();
    body["data"]["comments"] = Value::Array(items);
    body["data"]["cursor"] = json!(offset + n);
    body["data"]["hasMore"] = json!(offset + n < total);
    body["data"]["total"] = json!(total);
    body
}

/// The doubles themselves must be able to fail a test.
#[cfg(test)]
mod tests {
    use super::*;

    async fn get(url: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let mut request = client.get(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    #[test]
    fn render_writes_bare_integers_of_any_size() {
        let body =
            json!({"a": bare_int("99999999999999999999"), "b": ["x", bare_int("7")], "c": "@@"});
        assert_eq!(
            render(&body),
            r#"{"a":99999999999999999999,"b":["x",7],"c":"@@"}"#
        );
    }

    #[tokio::test]
    async fn a_contract_shaped_request_gets_the_fixture() {
        let primary = PrimaryMock::start().await;
        primary.serve_fixtures().await;
        let url = format!("{}/v1/user/profile?unique_id=lunabakes", primary.base_url());
        let (status, body) = get(&url, &[("X-Api-Key", PRIMARY_KEY)]).await;
        assert_eq!(status, 200);
        assert!(body.contains("\"unique_id\":\"lunabakes\""));
    }

    #[tokio::test]
    #[should_panic(expected = "does not describe")]
    async fn a_request_with_the_wrong_key_fails_the_test() {
        let primary = PrimaryMock::start().await;
        primary.serve_fixtures().await;
        let url = format!("{}/v1/user/profile?unique_id=lunabakes", primary.base_url());
        let (status, _) = get(&url, &[("X-Api-Key", "wrong")]).await;
        assert_eq!(status, 500);
        // Dropping the double verifies it and panics.
    }

    #[tokio::test]
    #[should_panic(expected = "does not describe")]
    async fn a_request_with_an_extra_parameter_fails_the_test() {
        let fallback = FallbackMock::start().await;
        fallback.serve_fixtures().await;
        let url = format!(
            "{}/user/info?unique_id=lunabakes&extra=1",
            fallback.base_url()
        );
        let headers = [
            ("X-RapidAPI-Key", FALLBACK_KEY),
            ("X-RapidAPI-Host", "127.0.0.1"),
        ];
        let (status, _) = get(&url, &headers).await;
        assert_eq!(status, 500);
    }

    #[tokio::test]
    async fn generated_comment_pages_count_and_continue() {
        let page = primary_comments_page(POST_ID, 50, 20, 811);
        assert_eq!(page["comments"].as_array().map(Vec::len), Some(20));
        assert_eq!(page["comments"][0]["cid"], comment_id(50));
        assert_eq!(page["cursor"], 70);
        assert_eq!(page["has_more"], 1);
        let last = fallback_comments_page(50, 20, 70);
        assert_eq!(last["data"]["hasMore"], false);
    }
}
