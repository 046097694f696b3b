//! The OpenAPI document cannot drift: it validates as OpenAPI 3.1 against
//! the kept meta-schema, it is served byte for byte without a key, and every
//! endpoint (first pages and next pages), `GET /v1/account`, and every error
//! code but `INTERNAL_ERROR`, answered by running servers, validates against
//! the schema and headers the document gives for its path, method and
//! status (with the billing and rate-limit headers where they are set).
//! The test fails when a code of the document's `ErrorCode` enum, or a status
//! it lists for an operation (but 500), was never answered, and when an
//! error's code is not among its response's examples.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use socialgate_tests::api::with_cursor;
use socialgate_tests::config::{standard_env, ConfigBuilder};
use socialgate_tests::openapi::{self, Contract};
use socialgate_tests::redis::Replicas;
use socialgate_tests::upstream::{
    fixtures, primary_comments_page, LUNA_SEC_UID, POSTS_NEXT_CURSOR, POST_ID,
};
use socialgate_tests::{issue_key, Answer, Api, Server, Stack};
use wiremock::matchers::{path, query_param};
use wiremock::{Mock, ResponseTemplate};

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";
const POSTS: &str = "/v1/shortvideo/posts?username=lunabakes";
const POST: &str = "/v1/shortvideo/post?id=7312345678901234567";
const COMMENTS: &str = "/v1/shortvideo/comments?id=7312345678901234567&count=3";
const SEARCH: &str = "/v1/shortvideo/search?query=luna";
/// The five endpoints with valid parameters.
const ENDPOINTS: [&str; 5] = [PROFILE, POSTS, POST, COMMENTS, SEARCH];
const PUBLIC: [&str; 3] = ["/healthz", "/readyz", "/v1/openapi.json"];
/// The key's own account.
const ACCOUNT: &str = "/v1/account";

/// Sends `method path` and checks the answer against the document, and
/// that `meta.request_id` of an envelope is the `X-Request-Id` header.
///
/// `Cache-Control` is what the document's introduction says (data answers
/// `private` with their freshness, the document `no-cache`, others
/// `no-store`), and the parameters of a successful `/v1` request are ones
/// the document accepts.
async fn check(contract: &Contract, api: &Api, method: &str, path: &str) -> Answer {
    check_with(contract, api, method, path, &[]).await
}

/// [`check`] with request headers.
async fn check_with(
    contract: &Contract,
    api: &Api,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Answer {
    let answer = api.request_with(method, path, headers).await;
    contract.check(method, path, &answer);
    assert_request_id_matches(&answer);
    // Never sniffed, never anything but data to a browser.
    if answer.status != 204 {
        assert_eq!(
            (
                answer.header("x-content-type-options"),
                answer.header("content-security-policy")
            ),
            (Some("nosniff"), Some("default-src 'none'")),
            "{method} {path}: {answer:?}"
        );
    }
    let cache_control = answer.header("cache-control").unwrap_or_default();
    let fresh = matches!(answer.status, 200 | 304);
    let expected = if fresh && path.starts_with("/v1/openapi.json") {
        cache_control == "no-cache"
    } else if fresh && path.starts_with("/v1/shortvideo/") {
        cache_control.starts_with("private, max-age=") || cache_control == "private, no-cache"
    } else {
        cache_control == "no-store"
    };
    assert!(
        expected,
        "{method} {path}: Cache-Control {cache_control:?}: {answer:?}"
    );
    if answer.status == 200 && path.starts_with("/v1/shortvideo/") {
        let errors = contract.parameter_errors(method, path);
        assert!(
            errors.is_empty(),
            "{path} was answered, but the document refuses its parameters: {errors:?}"
        );
    }
    answer
}

fn assert_request_id_matches(answer: &Answer) {
    if let Some(meta) = answer.json.get("meta") {
        assert_eq!(
            meta["request_id"].as_str(),
            answer.header("x-request-id"),
            "meta.request_id is the X-Request-Id header: {answer:?}"
        );
    }
}

/// Checks `method path` answers `status` with `code` (an error) or success.
async fn expect(
    contract: &Contract,
    api: &Api,
    method: &str,
    path: &str,
    status: u16,
    code: Option<&str>,
) -> Answer {
    let answer = check(contract, api, method, path).await;
    match code {
        Some(code) => {
            answer.assert_error(status, code);
        }
        None => assert_eq!(answer.status, status, "{method} {path}: {answer:?}"),
    }
    answer
}

#[test]
fn the_document_validates_as_openapi_3_1_against_the_kept_meta_schema() {
    let contract = Contract::load();
    let document = contract.document().clone();
    let errors = openapi::meta_schema_errors(&document);
    assert!(
        errors.is_empty(),
        "the generated document is not a valid OpenAPI 3.1 document:\n{}",
        errors.join("\n")
    );

    // The meta-schema does refuse broken documents.
    let mut wrong_version = document.clone();
    wrong_version["openapi"] = json!("3.0.3");
    let mut no_info = document.clone();
    no_info.as_object_mut().expect("an object").remove("info");
    let mut bad_response = document.clone();
    bad_response["paths"]["/healthz"]["get"]["responses"]["200"] = json!({"content": {}});
    for (what, broken) in [
        ("openapi 3.0.3", wrong_version),
        ("no info", no_info),
        ("a response without description", bad_response),
    ] {
        assert!(
            !openapi::meta_schema_errors(&broken).is_empty(),
            "the meta-schema must refuse a document with {what}"
        );
    }

    // Every schema is a valid draft 2020-12 schema, and every response
    // schema compiles with its references resolved inside the document.
    let schemas = document["components"]["schemas"]
        .as_object()
        .expect("components/schemas");
    for (name, schema) in schemas {
        assert!(
            jsonschema::draft202012::meta::is_valid(schema),
            "components/schemas/{name} is not a valid draft 2020-12 schema"
        );
        contract.validator(&format!("/components/schemas/{name}"));
    }
    assert_eq!(
        document["jsonSchemaDialect"], "https://json-schema.org/draft/2020-12/schema",
        "the answers' schemas are draft 2020-12"
    );
}

#[test]
fn the_checker_refuses_answers_that_drift() {
    let contract = Contract::load();
    let posts = json!({
        "success": true,
        "platform": "shortvideo",
        "data": [{"id": "7312345678901234567", "text": "t", "likes": 1, "comments": 2,
                  "views": null, "shares": null, "created_at": "2025-11-21T04:40:00Z",
                  "duration_ms": null, "author": "lunabakes"}],
        "meta": {"credits_used": 1, "cached": false, "next_cursor": null, "request_id": "r-1"}
    });
    let schema = "/components/schemas/PostsResponse";
    assert_eq!(contract.errors(schema, &posts), Vec::<String>::new());
    let mut drifted = Vec::new();
    let mut v = posts.clone();
    v["data"][0]["id"] = json!(7312345678901234567u64);
    drifted.push(("a numeric id", v));
    let mut v = posts.clone();
    v["data"][0]["created_at"] = json!("2025-11-21 04:40:00");
    drifted.push(("a malformed created_at", v));
    let mut v = posts.clone();
    v["meta"]
        .as_object_mut()
        .expect("meta")
        .remove("next_cursor");
    drifted.push(("a list without next_cursor", v));
    let mut v = posts.clone();
    v["meta"].as_object_mut().expect("meta").remove("cached");
    drifted.push(("a success without cached", v));
    let mut v = posts.clone();
    v["data"][0]["provider"] = json!("shortvideo-primary");
    drifted.push(("an extra field", v));
    let mut v = posts.clone();
    v["meta"]["request_id"] = json!("has space");
    drifted.push(("an invalid request ID", v));
    for (what, answer) in drifted {
        assert!(
            !contract.errors(schema, &answer).is_empty(),
            "PostsResponse must refuse {what}"
        );
    }
    let error = |code: &str| {
        json!({"success": false, "error": {"code": code, "message": "m"},
               "meta": {"credits_used": 0, "request_id": "r"}})
    };
    let schema = "/components/schemas/Error";
    assert!(contract
        .errors(schema, &error("INVALID_PARAMETER"))
        .is_empty());
    let mut with_param = error("INVALID_PARAMETER");
    with_param["error"]["param"] = json!("count");
    assert!(contract.errors(schema, &with_param).is_empty());
    assert!(!contract.errors(schema, &error("NO_SUCH_CODE")).is_empty());
    let mut charged = error("UPSTREAM_UNAVAILABLE");
    charged["meta"]["credits_used"] = json!(1);
    assert!(!contract.errors(schema, &charged).is_empty());
    // Which codes a status carries: its response's examples.
    let codes = |name: &str| contract.example_codes(&format!("/components/responses/{name}"));
    assert!(codes("BadRequest").contains(&"INVALID_PARAMETER".to_owned()));
    assert!(!codes("BadRequest").contains(&"RESOURCE_NOT_FOUND".to_owned()));
    assert!(!codes("RouteNotFound").contains(&"RESOURCE_NOT_FOUND".to_owned()));
    // Every code has an example.
    let mut examples = Vec::new();
    for name in contract.document()["components"]["responses"]
        .as_object()
        .expect("responses")
        .keys()
    {
        examples.extend(codes(name));
    }
    for code in contract.error_codes() {
        assert!(examples.contains(&code), "{code} has no example");
    }
}

#[tokio::test]
async fn the_document_is_served_without_a_key_byte_for_byte() {
    let stack = Stack::start().await;
    let kept = serde_json::to_string(&openapi::generated()).expect("the document as JSON");
    let contract = Contract::load();
    for key in [None, Some("not-a-key")] {
        let api = stack.api.with_key(key);
        let a = check(&contract, &api, "GET", "/v1/openapi.json").await;
        assert_eq!(a.status, 200, "{a:?}");
        assert!(
            a.text == kept,
            "GET /v1/openapi.json must answer exactly the generated document ({} bytes, it has {})",
            a.text.len(),
            kept.len()
        );
    }
    assert_eq!(stack.primary.request_count().await, 0);
}

/// The fallback's search answer for `baker`: `more` says whether a next
/// page exists (at cursor 2).
fn fallback_search_page(more: bool) -> Value {
    let mut body = fixtures::fallback_user_search();
    body["data"]["hasMore"] = json!(more);
    body["data"]["cursor"] = json!(if more { 2 } else { 4 });
    body
}

/// The operator's config with working upstreams: every endpoint with its
/// next pages, parameters, keys, methods, not found, all providers failing,
/// the public paths, and paths the document does not list.
async fn main_server(contract: &Contract) {
    let stack = Stack::builder().breaker_failures(100).start().await;
    let (p, f) = (&stack.primary, &stack.fallback);
    p.serve_fixtures().await;
    p.posts(
        LUNA_SEC_UID,
        10,
        POSTS_NEXT_CURSOR,
        &fixtures::primary_posts_page_two(),
    )
    .await;
    p.comments(POST_ID, 3, 3, &primary_comments_page(POST_ID, 3, 3, 6))
        .await;
    f.serve_fixtures().await;
    f.search("baker", 10, "0", &fallback_search_page(true))
        .await;
    f.search("baker", 10, "2", &fallback_search_page(false))
        .await;
    // Inputs that every provider fails on (the primary with a 500, the
    // fallback with its catch-all 500); anything else the primary does not
    // know, it says does not exist.
    for (route, name, value) in [
        ("/v1/user/profile", "unique_id", "broken"),
        ("/v1/aweme/detail", "aweme_id", "500500"),
        ("/v1/comment/list", "aweme_id", "500500"),
    ] {
        p.respond(
            Mock::given(path(route)).and(query_param(name, value)),
            ResponseTemplate::new(500),
        )
        .await;
    }
    p.answer_all(&fixtures::primary_user_not_found()).await;
    f.fail_all(500).await;

    let api = &stack.api;
    let anonymous = api.with_key(None);
    let stranger = api.with_key(Some("sg_not_a_key_0000000000000000"));

    // Public paths, with or without a key.
    expect(contract, &anonymous, "GET", "/healthz", 200, None).await;
    let ready = expect(contract, &anonymous, "GET", "/readyz", 200, None).await;
    assert_eq!(ready.json["status"], "ready");
    expect(contract, api, "GET", "/v1/openapi.json", 200, None).await;
    let account = expect(contract, api, "GET", ACCOUNT, 200, None).await;
    assert_eq!(account.data()["name"], "e2e", "{account:?}");
    assert_eq!(account.data()["rate_limit"], Value::Null, "{account:?}");

    // Every endpoint, and the next page of every list.
    for path in [PROFILE, POST] {
        check(contract, api, "GET", path)
            .await
            .assert_success(false);
    }
    for first in [POSTS, COMMENTS, "/v1/shortvideo/search?query=baker"] {
        let a = check(contract, api, "GET", first).await;
        a.assert_success(true);
        let cursor = a
            .next_cursor()
            .unwrap_or_else(|| panic!("{first} has a next page: {a:?}"));
        let next = check(contract, api, "GET", &with_cursor(first, &cursor)).await;
        next.assert_success(true);
        assert_eq!(
            next.next_cursor(),
            None,
            "{first}: the second page is the last"
        );
    }

    // 400: a missing or malformed parameter, a foreign cursor.
    for path in [
        "/v1/shortvideo/profile",
        "/v1/shortvideo/posts?username=lunabakes&count=0",
        "/v1/shortvideo/post?id=abc",
        "/v1/shortvideo/comments?id=7312345678901234567&count=201",
        "/v1/shortvideo/search?query=",
    ] {
        expect(contract, api, "GET", path, 400, Some("INVALID_PARAMETER")).await;
        assert!(
            !contract.parameter_errors("GET", path).is_empty(),
            "{path} was refused, but the document accepts its parameters"
        );
    }
    // A cursor is opaque to the document: refused by the server only.
    let foreign = "/v1/shortvideo/posts?username=lunabakes&cursor=not-a-cursor";
    expect(
        contract,
        api,
        "GET",
        foreign,
        400,
        Some("INVALID_PARAMETER"),
    )
    .await;
    // HEAD is GET without a body; a matching If-None-Match is 304; an
    // If-Match that names another tag is 412, `*` lets the answer through.
    for path in ENDPOINTS.iter().chain(PUBLIC.iter()).chain([&ACCOUNT]) {
        let a = check_with(contract, api, "GET", path, &[("if-match", "\"other\"")]).await;
        a.assert_error(412, "PRECONDITION_FAILED");
        let a = check_with(contract, api, "GET", path, &[("if-match", "*")]).await;
        assert_eq!(a.status, 200, "{path}: {a:?}");
        // Never for `OPTIONS` (RFC 9110, 13.2.1).
        let a = api
            .request_with("OPTIONS", path, &[("if-match", "\"other\"")])
            .await;
        assert_eq!(a.status, 204, "{path}: {a:?}");
        let get = api.get(path).await;
        let head = api.request("HEAD", path).await;
        assert_eq!(head.status, get.status, "HEAD {path}: {head:?}");
        assert!(head.text.is_empty(), "HEAD {path}: {head:?}");
        assert!(
            head.header("x-request-id").is_some(),
            "HEAD {path}: {head:?}"
        );
        if let Some(etag) = get.header("etag") {
            let a = check_with(contract, api, "GET", path, &[("if-none-match", etag)]).await;
            assert_eq!(a.status, 304, "{path}: {a:?}");
            assert_eq!(a.header("etag"), Some(etag), "{path}: {a:?}");
            let a = check_with(contract, api, "GET", path, &[("if-match", etag)]).await;
            assert_eq!(a.status, 200, "{path}: {a:?}");
        }
    }
    // A head the server cannot read: the envelope, on every path.
    let filler = "a".repeat(20_000);
    for path in ENDPOINTS.iter().chain(PUBLIC.iter()).chain([&ACCOUNT]) {
        let a = check_with(contract, api, "GET", path, &[("x-filler", &filler)]).await;
        a.assert_error(431, "HEADERS_TOO_LARGE");
    }
    for path in PUBLIC.into_iter().chain([ACCOUNT]) {
        let raw = raw_exchange(
            stack.server.addr(),
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n"),
        )
        .await;
        let a = Answer::parse_raw(&raw);
        contract.check("GET", path, &a);
        a.assert_error(400, "MALFORMED_REQUEST");
        assert_eq!(a.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(
            a.header("content-security-policy"),
            Some("default-src 'none'")
        );
    }
    // The key sent twice: refused, whichever path.
    let key = api.key().expect("the stack's client has a key").to_owned();
    for path in [PROFILE, ACCOUNT] {
        let a = check_with(contract, api, "GET", path, &[("x-api-key", &key)]).await;
        a.assert_error(400, "INVALID_PARAMETER");
        assert_eq!(a.json["error"]["param"], "X-API-Key", "{a:?}");
    }
    // 401 on every endpoint (with its challenge), 405 on every path.
    for path in ENDPOINTS.into_iter().chain([ACCOUNT]) {
        expect(
            contract,
            &anonymous,
            "GET",
            path,
            401,
            Some("MISSING_API_KEY"),
        )
        .await;
        expect(
            contract,
            &stranger,
            "GET",
            path,
            401,
            Some("INVALID_API_KEY"),
        )
        .await;
    }
    for path in ENDPOINTS.iter().chain(PUBLIC.iter()).chain([&ACCOUNT]) {
        for method in ["POST", "DELETE"] {
            let a = expect(contract, api, method, path, 405, Some("METHOD_NOT_ALLOWED")).await;
            assert_eq!(a.header("allow"), Some("GET, HEAD, OPTIONS"), "{a:?}");
        }
    }
    // 404: the user or post does not exist.
    for path in [
        "/v1/shortvideo/profile?username=ghost_user",
        "/v1/shortvideo/posts?username=ghost_user",
        "/v1/shortvideo/post?id=1",
        "/v1/shortvideo/comments?id=1&count=3",
    ] {
        expect(contract, api, "GET", path, 404, Some("RESOURCE_NOT_FOUND")).await;
    }
    // 502: every provider failed.
    for path in [
        "/v1/shortvideo/profile?username=broken",
        "/v1/shortvideo/posts?username=broken",
        "/v1/shortvideo/post?id=500500",
        "/v1/shortvideo/comments?id=500500&count=3",
        "/v1/shortvideo/search?query=broken",
    ] {
        expect(
            contract,
            api,
            "GET",
            path,
            502,
            Some("UPSTREAM_UNAVAILABLE"),
        )
        .await;
    }
    // Paths the document does not list answer its route 404.
    for (path, code) in [
        (
            "/v1/nosuchplatform/profile?username=lunabakes",
            "PLATFORM_NOT_FOUND",
        ),
        ("/v1/nosuchplatform", "PLATFORM_NOT_FOUND"),
        ("/v1/shortvideo/nosuchendpoint", "ENDPOINT_NOT_FOUND"),
        ("/", "ENDPOINT_NOT_FOUND"),
    ] {
        let a = api.get(path).await;
        a.assert_error(404, code);
        contract.check_as(&format!("GET {path}"), "RouteNotFound", &a);
    }

    // The same endpoints answered by the fallback validate too.
    p.reset().await;
    p.fail_all(503).await;
    for path in [PROFILE, POST] {
        check(contract, api, "GET", path)
            .await
            .assert_success(false);
    }
    for path in [POSTS, COMMENTS, SEARCH] {
        check(contract, api, "GET", path).await.assert_success(true);
    }

    // Nothing stored (this stack's cache is off): `only-if-cached` gets a
    // 504, and nothing is fetched (tests/cache.rs has the hits).
    let only_stored = [("cache-control", "only-if-cached")];
    let asked_upstream = p.request_count().await + f.request_count().await;
    for path in [PROFILE, COMMENTS] {
        check_with(contract, api, "GET", path, &only_stored)
            .await
            .assert_error(504, "NOT_CACHED");
    }
    assert_eq!(
        p.request_count().await + f.request_count().await,
        asked_upstream
    );
}

/// Sends `request` as it is and reads the answer to the end.
async fn raw_exchange(addr: std::net::SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("can connect");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("can send");
    let mut answer = Vec::new();
    let read = stream.read_to_end(&mut answer);
    let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// A target longer than hyper reads (64 KiB), with heads allowed to be
/// that large: 414 on every path.
async fn uri_too_long(contract: &Contract) {
    let (_config, server, _api) = start(
        ConfigBuilder::new()
            .server_line("max_header_bytes = 131072")
            .platform("shortvideo", "planned", &[]),
    );
    let long = "a".repeat(70_000);
    for path in ENDPOINTS.iter().chain(PUBLIC.iter()).chain([&ACCOUNT]) {
        let separator = if path.contains('?') { '&' } else { '?' };
        let request = format!("GET {path}{separator}x={long} HTTP/1.1\r\nHost: x\r\n\r\n");
        let a = Answer::parse_raw(&raw_exchange(server.addr(), &request).await);
        contract.check("GET", path, &a);
        a.assert_error(414, "URI_TOO_LONG");
    }
}

/// A server of `builder`'s config with a fresh key, and its client.
fn start(builder: ConfigBuilder) -> (socialgate_tests::Config, Server, Api) {
    let config = builder.write();
    let key = issue_key(&config, "openapi");
    let server = Server::start_with(&config, &standard_env(), &[]);
    let api = Api::new(&server.base_url(), Some(&key));
    (config, server, api)
}

/// `shortvideo` is planned: 501 on every endpoint.
async fn planned_platform(contract: &Contract) {
    let (_config, _server, api) =
        start(ConfigBuilder::new().platform("shortvideo", "planned", &[]));
    for path in ENDPOINTS {
        expect(
            contract,
            &api,
            "GET",
            path,
            501,
            Some("PLATFORM_NOT_AVAILABLE"),
        )
        .await;
    }
    let a = api.get("/v1/shortvideo").await;
    a.assert_error(501, "PLATFORM_NOT_AVAILABLE");
}

/// No `shortvideo` at all: 404 `PLATFORM_NOT_FOUND` on every endpoint.
async fn no_platform(contract: &Contract) {
    let (_config, _server, api) = start(ConfigBuilder::new().platform("clipgram", "planned", &[]));
    for path in ENDPOINTS {
        expect(contract, &api, "GET", path, 404, Some("PLATFORM_NOT_FOUND")).await;
    }
}

/// `shortvideo` is live but no provider serves any endpoint: 404
/// `ENDPOINT_NOT_FOUND` on every endpoint, and not ready.
async fn empty_chains(contract: &Contract) {
    let (_config, _server, api) = start(
        ConfigBuilder::new()
            .platform("shortvideo", "live", &[])
            .endpoint_order("shortvideo", "search", &[]),
    );
    for path in ENDPOINTS {
        expect(contract, &api, "GET", path, 404, Some("ENDPOINT_NOT_FOUND")).await;
    }
    let a = expect(contract, &api.with_key(None), "GET", "/readyz", 503, None).await;
    assert_eq!(a.json["status"], "not_ready", "{a:?}");
}

/// Upstreams that take 3 s to answer.
async fn slow_stack(server_lines: &[&str]) -> Stack {
    let mut builder = Stack::builder().breaker_failures(100);
    for line in server_lines {
        builder = builder.server_line(line);
    }
    let stack = builder.start().await;
    let slow = ResponseTemplate::new(200).set_delay(Duration::from_secs(3));
    stack.primary.respond_all(slow.clone()).await;
    stack.fallback.respond_all(slow).await;
    stack
}

/// One request at a time: 503 `OVERLOADED` on every endpoint while a slow
/// request is in flight (which then ends at its 2 s deadline).
async fn overload(contract: &Contract) {
    let stack = slow_stack(&["max_concurrent_requests = 1", "request_timeout_ms = 2000"]).await;
    let api = stack.api.clone();
    let in_flight = tokio::spawn(async move { api.get(PROFILE).await });
    let deadline = Instant::now() + Duration::from_secs(2);
    while stack.primary.request_count().await == 0 {
        assert!(
            Instant::now() < deadline,
            "the first request reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for path in ENDPOINTS.into_iter().chain([ACCOUNT]) {
        let a = expect(contract, &stack.api, "GET", path, 503, Some("OVERLOADED")).await;
        assert!(a.header("retry-after").is_some(), "{a:?}");
    }
    // Public paths are not gated.
    expect(contract, &stack.api, "GET", "/healthz", 200, None).await;
    expect(contract, &stack.api, "GET", "/readyz", 200, None).await;
    let first = in_flight.await.expect("the request task ends");
    contract.check("GET", PROFILE, &first);
    first.assert_error(504, "UPSTREAM_TIMEOUT");
}

/// A 500 ms deadline: 504 `UPSTREAM_TIMEOUT` on every endpoint.
async fn deadline(contract: &Contract) {
    let stack = slow_stack(&["request_timeout_ms = 500"]).await;
    let started = Instant::now();
    let answers = ENDPOINTS.map(|path| {
        let api = stack.api.clone();
        tokio::spawn(async move { (path, api.get(path).await) })
    });
    for task in answers {
        let (path, a) = task.await.expect("the request task ends");
        contract.check("GET", path, &a);
        a.assert_error(504, "UPSTREAM_TIMEOUT");
    }
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "the deadline, not the upstream, ended them"
    );
}

/// A rate limit of 7 requests and 1 free credit per key under enforced
/// billing: one success and the account, then 402 on every endpoint (with
/// no upstream call), then 429 on every endpoint and the account; each
/// with the credit and rate-limit headers.
async fn credits_then_rate_limit(contract: &Contract) {
    let stack = Stack::builder()
        .raw("[rate_limit]\nper_second = 0.01\nburst = 7\n\n[billing]\nenforce = true\nfree_credits = 1")
        .start()
        .await;
    stack.primary.serve_fixtures().await;
    stack.fallback.serve_fixtures().await;
    let api = &stack.api;
    let standing = |a: &Answer| {
        for name in ["x-credits-remaining", "ratelimit-policy", "ratelimit"] {
            assert!(a.header(name).is_some(), "{name} missing: {a:?}");
        }
    };
    let first = check(contract, api, "GET", PROFILE).await;
    first.assert_success(false);
    standing(&first);
    let account = expect(contract, api, "GET", ACCOUNT, 200, None).await;
    standing(&account);
    assert_eq!(account.data()["credits_remaining"], 0, "{account:?}");
    let upstream_calls = stack.primary.request_count().await + stack.fallback.request_count().await;
    for path in ENDPOINTS {
        let a = expect(
            contract,
            api,
            "GET",
            path,
            402,
            Some("INSUFFICIENT_CREDITS"),
        )
        .await;
        standing(&a);
    }
    assert_eq!(
        stack.primary.request_count().await + stack.fallback.request_count().await,
        upstream_calls,
        "402 is answered before any upstream call"
    );
    for path in ENDPOINTS.into_iter().chain([ACCOUNT]) {
        let a = expect(contract, api, "GET", path, 429, Some("RATE_LIMITED")).await;
        standing(&a);
        let wait: u64 = a
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("429 needs Retry-After in seconds: {a:?}"));
        assert!(wait >= 1, "{a:?}");
    }
}

/// Billing enforced on a shared store that went away: 503
/// `SERVICE_UNAVAILABLE` with `Retry-After` on every endpoint, and `/readyz`
/// still 200.
async fn shared_store_away(contract: &Contract) {
    let mut replica = Replicas::start(1, "\n[billing]\nenforce = true\nfree_credits = 10\n").await;
    let api = replica.api(0, &replica.issue_everywhere("k").await);
    replica.redis.kill();
    for path in ENDPOINTS {
        let a = expect(
            contract,
            &api,
            "GET",
            path,
            503,
            Some("SERVICE_UNAVAILABLE"),
        )
        .await;
        assert!(a.header("retry-after").is_some(), "{a:?}");
    }
    expect(contract, &api, "GET", "/readyz", 200, None).await;
}

#[tokio::test]
async fn every_endpoint_and_every_error_code_answers_as_the_document_says() {
    let contract = Contract::load();
    main_server(&contract).await;
    planned_platform(&contract).await;
    no_platform(&contract).await;
    empty_chains(&contract).await;
    overload(&contract).await;
    deadline(&contract).await;
    credits_then_rate_limit(&contract).await;
    shared_store_away(&contract).await;
    uri_too_long(&contract).await;

    let seen = contract.codes_seen();
    let documented = contract.error_codes();
    let not_exercised: Vec<&String> = documented
        .iter()
        .filter(|c| *c != "INTERNAL_ERROR" && !seen.contains_key(*c))
        .collect();
    assert!(
        not_exercised.is_empty(),
        "error codes of the document never answered: {not_exercised:?} (seen: {seen:?})"
    );
    let undocumented: Vec<&String> = seen.keys().filter(|c| !documented.contains(c)).collect();
    assert!(
        undocumented.is_empty(),
        "codes answered that the document lacks: {undocumented:?}"
    );
    let not_seen = contract.statuses_not_seen(&["500"]);
    assert!(
        not_seen.is_empty(),
        "statuses the document lists that no answer exercised: {not_seen:?} ({} answers checked)",
        contract.answers_checked()
    );
}
