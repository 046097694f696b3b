//! The HTTP surface: every error code of the table in docs/api.md
//! ("Errors") but `INTERNAL_ERROR` with its status, the order of the checks
//! (method, key, platform, endpoint, parameters, chain), the parameter rules
//! (a parameter an endpoint does not read is ignored, even repeated),
//! `/healthz`, and connection handling: each listener holds at most
//! `max_connections` open (past it a new one waits until one closes), and a
//! client that does not read its answers is closed after `write_timeout_ms`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use socialgate_tests::operator::{admin_addr, get_kept_alive, read_to_end};
use socialgate_tests::upstream::{
    assert_answered_by, fixtures, LUNA_SEC_UID, POST_ID, PRIMARY_FOLLOWERS,
};
use socialgate_tests::{Answer, Stack};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";

/// A stack with a planned platform `clipgram` beside the live one.
async fn stack_with_planned_platform() -> Stack {
    Stack::builder()
        .raw("[platforms.clipgram]\nstatus = \"planned\"\nproviders = []")
        .start()
        .await
}

fn assert_json(a: &Answer) {
    let ct = a.header("content-type").unwrap_or_default();
    assert!(
        ct.starts_with("application/json"),
        "content-type {ct:?}: {a:?}"
    );
}

#[tokio::test]
async fn healthz_answers_200_without_a_key() {
    let stack = Stack::start().await;
    let a = stack.api.with_key(None).get("/healthz").await;
    assert_eq!(a.status, 200, "{a:?}");
    let a = stack.api.with_key(Some("not-a-key")).get("/healthz").await;
    assert_eq!(a.status, 200, "{a:?}");
}

#[tokio::test]
async fn a_missing_or_unknown_key_is_401() {
    let stack = Stack::start().await;
    stack.primary.serve_fixtures().await;
    let a = stack.api.with_key(None).get(PROFILE).await;
    a.assert_error(401, "MISSING_API_KEY");
    assert_json(&a);
    let unknown = [
        "sg_live_0000000000000000".to_owned(),
        format!("{}x", stack.key),
        stack.key[..stack.key.len() - 1].to_owned(),
        stack.key.to_uppercase(),
    ];
    for key in unknown.iter().filter(|k| **k != stack.key) {
        let a = stack.api.with_key(Some(key)).get(PROFILE).await;
        a.assert_error(401, "INVALID_API_KEY");
    }
    assert_eq!(
        stack.primary.request_count().await,
        0,
        "nothing reached an upstream"
    );
    stack.get(PROFILE).await.assert_success(false);
}

#[tokio::test]
async fn methods_other_than_get_head_and_options_are_405_with_allow() {
    let stack = Stack::start().await;
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        for path in [PROFILE, "/v1/instagram/profile", "/v1/shortvideo/nope"] {
            // Without a key too: the method is checked first.
            for api in [stack.api.clone(), stack.api.with_key(None)] {
                let a = api.request(method, path).await;
                a.assert_error(405, "METHOD_NOT_ALLOWED");
                assert_eq!(
                    a.header("allow"),
                    Some("GET, HEAD, OPTIONS"),
                    "{method} {path}: {a:?}"
                );
            }
        }
    }
    // OPTIONS is answered on every path, before the key.
    for path in [PROFILE, "/v1/instagram/profile", "/healthz", "/nowhere"] {
        let a = stack.api.with_key(None).request("OPTIONS", path).await;
        assert_eq!(a.status, 204, "OPTIONS {path}: {a:?}");
        assert_eq!(a.header("allow"), Some("GET, HEAD, OPTIONS"), "{a:?}");
        assert!(a.header("x-request-id").is_some(), "{a:?}");
    }
    assert_eq!(stack.primary.request_count().await, 0);
}

#[tokio::test]
async fn an_unknown_platform_is_404_and_a_planned_one_501() {
    let stack = stack_with_planned_platform().await;
    for path in [
        "/v1/instagram/profile?username=lunabakes",
        "/v1/SHORTVIDEO/profile?username=lunabakes",
        "/v1/shortvideo2/profile?username=lunabakes",
    ] {
        let a = stack.get(path).await;
        a.assert_error(404, "PLATFORM_NOT_FOUND");
        assert_json(&a);
    }
    for path in [
        "/v1/clipgram/profile?username=lunabakes",
        "/v1/clipgram/anything",
        "/v1/clipgram/posts?username=bad%20name",
    ] {
        stack
            .get(path)
            .await
            .assert_error(501, "PLATFORM_NOT_AVAILABLE");
    }
}

#[tokio::test]
async fn an_unknown_endpoint_or_any_other_path_is_404() {
    let stack = Stack::start().await;
    for path in [
        "/v1/shortvideo/videos?username=lunabakes",
        "/v1/shortvideo/Profile?username=lunabakes",
        "/v1/shortvideo/profile/?username=lunabakes",
        "/v1/shortvideo/profile/extra?username=lunabakes",
        "/v1/shortvideo",
        "/v1/shortvideo/",
        "/v2/shortvideo/profile?username=lunabakes",
        "/V1/shortvideo/profile?username=lunabakes",
        "/v1",
        "/",
        "/favicon.ico",
    ] {
        let a = stack.get(path).await;
        a.assert_error(404, "ENDPOINT_NOT_FOUND");
        assert_json(&a);
    }
    assert_eq!(stack.primary.request_count().await, 0);
}

#[tokio::test]
async fn invalid_parameters_are_400_naming_the_parameter_before_any_upstream() {
    let stack = Stack::start().await;
    let long_name = "a".repeat(65);
    let long_query = "q".repeat(101);
    let cases: Vec<(String, &str)> = vec![
        ("/v1/shortvideo/profile".into(), "username"),
        ("/v1/shortvideo/profile?username=".into(), "username"),
        ("/v1/shortvideo/profile?username=@".into(), "username"),
        (
            "/v1/shortvideo/profile?username=@@lunabakes".into(),
            "username",
        ),
        (
            "/v1/shortvideo/profile?username=luna%20bakes".into(),
            "username",
        ),
        (
            "/v1/shortvideo/profile?username=luna-bakes".into(),
            "username",
        ),
        (
            "/v1/shortvideo/profile?username=l%C3%BCna".into(),
            "username",
        ),
        (
            format!("/v1/shortvideo/profile?username={long_name}"),
            "username",
        ),
        (
            "/v1/shortvideo/profile?username=a&username=b".into(),
            "username",
        ),
        ("/v1/shortvideo/posts?count=10".into(), "username"),
        (
            "/v1/shortvideo/posts?username=lunabakes&count=0".into(),
            "count",
        ),
        (
            "/v1/shortvideo/posts?username=lunabakes&count=31".into(),
            "count",
        ),
        (
            "/v1/shortvideo/posts?username=lunabakes&count=abc".into(),
            "count",
        ),
        (
            "/v1/shortvideo/posts?username=lunabakes&count=2.5".into(),
            "count",
        ),
        (
            "/v1/shortvideo/posts?username=lunabakes&count=-1".into(),
            "count",
        ),
        (
            "/v1/shortvideo/posts?username=lunabakes&count=99999999999".into(),
            "count",
        ),
        (
            "/v1/shortvideo/posts?username=lunabakes&count=5&count=6".into(),
            "count",
        ),
        ("/v1/shortvideo/post".into(), "id"),
        ("/v1/shortvideo/post?id=".into(), "id"),
        ("/v1/shortvideo/post?id=abc".into(), "id"),
        ("/v1/shortvideo/post?id=-7312345678901234567".into(), "id"),
        ("/v1/shortvideo/post?id=123456789012345678901".into(), "id"),
        ("/v1/shortvideo/post?id=1&id=2".into(), "id"),
        ("/v1/shortvideo/comments?count=5".into(), "id"),
        (
            "/v1/shortvideo/comments?id=7312345678901234567&count=0".into(),
            "count",
        ),
        (
            "/v1/shortvideo/comments?id=7312345678901234567&count=201".into(),
            "count",
        ),
        ("/v1/shortvideo/search".into(), "query"),
        ("/v1/shortvideo/search?query=".into(), "query"),
        (format!("/v1/shortvideo/search?query={long_query}"), "query"),
        // Not UTF-8 once decoded: refused, never patched into another
        // query (U+FFFD) that would be asked, cached and charged.
        ("/v1/shortvideo/search?query=luna%ff".into(), "query"),
        ("/v1/shortvideo/search?query=luna%C3".into(), "query"),
        ("/v1/shortvideo/search?query=%ED%A0%80".into(), "query"),
        ("/v1/shortvideo/search?query=a+%C3".into(), "query"),
        ("/v1/shortvideo/search?query=luna&count=31".into(), "count"),
        ("/v1/shortvideo/search?query=luna&count=0".into(), "count"),
        (
            "/v1/shortvideo/posts?username=lunabakes&cursor=a&cursor=b".into(),
            "cursor",
        ),
    ];
    for (path, param) in &cases {
        let a = stack.get(path).await;
        assert_eq!(a.status, 400, "{path}: {a:?}");
        a.assert_invalid(param);
        assert_json(&a);
    }
    assert_eq!(
        stack.primary.request_count().await,
        0,
        "invalid input never reaches an upstream"
    );
    assert_eq!(stack.fallback.request_count().await, 0);
}

#[tokio::test]
async fn boundary_values_pass_and_unknown_parameters_are_ignored() {
    let stack = Stack::start().await;
    let p = &stack.primary;
    let name64 = format!("a.b_{}", "z".repeat(60));
    let mut profile = fixtures::primary_user_profile();
    profile["user"]["unique_id"] = serde_json::json!(name64);
    p.profile(&name64, &profile).await;
    p.profile("lunabakes", &fixtures::primary_user_profile())
        .await;
    p.posts(LUNA_SEC_UID, 30, "0", &fixtures::primary_user_posts())
        .await;
    p.posts(LUNA_SEC_UID, 1, "0", &fixtures::primary_user_posts())
        .await;
    stack
        .fallback
        .search("l", 30, "0", &fixtures::fallback_user_search())
        .await;
    let query100 = "🥐".repeat(100);
    stack
        .fallback
        .search(&query100, 1, "0", &fixtures::fallback_user_search())
        .await;

    let a = stack
        .get(&format!("/v1/shortvideo/profile?username=@{name64}"))
        .await;
    a.assert_success(false);
    assert_eq!(a.data()["username"], name64.as_str());
    stack
        .get("/v1/shortvideo/profile?username=lunabakes&utm_source=x&utm_source=y&count=abc&ref=%ff&%fe=1")
        .await
        .assert_success(false);
    stack
        .get("/v1/shortvideo/posts?username=lunabakes&count=30")
        .await
        .assert_success(true);
    stack
        .get("/v1/shortvideo/posts?username=lunabakes&count=1")
        .await
        .assert_success(true);
    stack
        .get("/v1/shortvideo/search?query=l&count=30")
        .await
        .assert_success(true);
    let path = format!(
        "/v1/shortvideo/search?query={}&count=1",
        socialgate_tests::api::encode(&query100)
    );
    stack.get(&path).await.assert_success(true);
}

#[tokio::test]
async fn parameters_an_endpoint_does_not_read_are_ignored_even_repeated() {
    let stack = Stack::builder().search_order(None).start().await;
    stack.primary.serve_fixtures().await;
    let a = stack
        .get(
            "/v1/shortvideo/profile?username=lunabakes&id=1&id=2&count=x&count=y&cursor=a&cursor=b",
        )
        .await;
    assert_answered_by(&a, PRIMARY_FOLLOWERS, "unread parameters ignored");
    let a = stack
        .get(&format!(
            "/v1/shortvideo/post?id={POST_ID}&username=a&username=b&query=q&query=r"
        ))
        .await;
    a.assert_success(false);
    assert_eq!(a.data()["id"], POST_ID, "{a:?}");
    let asked = stack.primary.request_count().await;
    assert_eq!(asked, 2);

    // A parameter the endpoint reads, given twice, is still refused.
    for (path, param) in [
        ("/v1/shortvideo/profile?username=a&username=b", "username"),
        (
            "/v1/shortvideo/posts?username=lunabakes&count=1&count=2",
            "count",
        ),
        (
            "/v1/shortvideo/comments?id=7312345678901234567&cursor=a&cursor=b",
            "cursor",
        ),
    ] {
        stack.get(path).await.assert_invalid(param);
    }
    assert_eq!(
        stack.primary.request_count().await,
        asked,
        "invalid input reaches no upstream"
    );
}

#[tokio::test]
async fn checks_run_in_order_method_key_platform_endpoint_parameters() {
    let stack = stack_with_planned_platform().await;
    let no_key = stack.api.with_key(None);
    let bad_key = stack.api.with_key(Some("nope"));
    let bad_params = "/v1/shortvideo/posts?username=bad%20name&count=0";

    // Method before key.
    let a = no_key.request("POST", bad_params).await;
    a.assert_error(405, "METHOD_NOT_ALLOWED");
    // Key before platform, endpoint and parameters.
    no_key
        .get(bad_params)
        .await
        .assert_error(401, "MISSING_API_KEY");
    bad_key
        .get(bad_params)
        .await
        .assert_error(401, "INVALID_API_KEY");
    no_key
        .get("/v1/instagram/profile")
        .await
        .assert_error(401, "MISSING_API_KEY");
    bad_key
        .get("/v1/shortvideo/nope")
        .await
        .assert_error(401, "INVALID_API_KEY");
    no_key
        .get("/v1/clipgram/profile")
        .await
        .assert_error(401, "MISSING_API_KEY");
    // Platform before endpoint and parameters.
    stack
        .get("/v1/instagram/nope?count=0")
        .await
        .assert_error(404, "PLATFORM_NOT_FOUND");
    stack
        .get("/v1/clipgram/nope?count=0")
        .await
        .assert_error(501, "PLATFORM_NOT_AVAILABLE");
    // Endpoint before parameters.
    stack
        .get("/v1/shortvideo/nope?username=bad%20name")
        .await
        .assert_error(404, "ENDPOINT_NOT_FOUND");
    // Parameters before the chain.
    stack.get(bad_params).await.assert_invalid("username");
    assert_eq!(stack.primary.request_count().await, 0);
    assert_eq!(stack.fallback.request_count().await, 0);
}

#[tokio::test]
async fn the_server_prints_one_stdout_line_and_serves_on_it() {
    let stack = Stack::start().await;
    stack.primary.serve_fixtures().await;
    let a = stack.api.with_key(None).get("/healthz").await;
    assert_eq!(a.status, 200);
    stack.get(PROFILE).await.assert_success(false);
    stack
        .get("/v1/shortvideo/nope")
        .await
        .assert_error(404, "ENDPOINT_NOT_FOUND");
    // Logs go to stderr; stdout only announces listeners.
    let extra = stack.server.extra_stdout();
    assert!(
        extra
            .iter()
            .all(|l| l.starts_with("admin listening on http://127.0.0.1:")),
        "stdout holds only the listening lines: {extra:?}"
    );
}

/// Holds `max` connections to `addr` open (each served `path` once, then
/// idle), checks that one more client is not served while they are, and is
/// served once one of them closes.
async fn assert_connections_capped(addr: SocketAddr, path: &str, max: usize) {
    let mut held = Vec::new();
    for n in 0..max {
        let mut stream = TcpStream::connect(addr).await.expect("can connect");
        let a = get_kept_alive(&mut stream, path).await;
        assert_eq!(a.status, 200, "held connection {n}: {a:?}");
        held.push(stream);
    }
    // The kernel's backlog takes the connection; the server must not.
    let mut extra = TcpStream::connect(addr).await.expect("can connect");
    let head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    extra
        .write_all(head.as_bytes())
        .await
        .expect("can send the request");
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_secs(1), extra.read(&mut byte)).await;
    assert!(
        early.is_err(),
        "served (or closed) while {max} connections were open: {early:?}"
    );
    drop(held.pop());
    let started = Instant::now();
    let a = read_to_end(&mut extra).await;
    assert_eq!(a.status, 200, "served once a connection closed: {a:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "promptly: {:?}",
        started.elapsed()
    );
    // The others are still open and served.
    for stream in &mut held {
        assert_eq!(get_kept_alive(stream, path).await.status, 200);
    }
}

#[tokio::test]
async fn past_max_connections_a_new_connection_waits_until_one_closes() {
    let stack = Stack::builder()
        .server_line("max_connections = 4")
        // Idle connections stay open for the whole test.
        .server_line("header_timeout_ms = 60000")
        .start()
        .await;
    assert_connections_capped(stack.server.addr(), "/healthz", 4).await;
}

#[tokio::test]
async fn the_admin_listener_has_the_same_connection_cap() {
    let stack = Stack::builder()
        .server_line("max_connections = 2")
        .server_line("header_timeout_ms = 60000")
        .start()
        .await;
    assert_connections_capped(admin_addr(&stack.server), "/metrics", 2).await;
    // Each listener counts its own: the public one is not full.
    let a = stack.api.with_key(None).get("/healthz").await;
    assert_eq!(a.status, 200, "{a:?}");
}

#[tokio::test]
async fn slow_readers_are_closed_after_write_timeout_while_others_are_served() {
    const PIPELINED: usize = 200;
    const OPENAPI: &str = "/v1/openapi.json";
    let stack = Stack::builder()
        .server_line("write_timeout_ms = 500")
        .start()
        .await;
    stack.primary.serve_fixtures().await;
    let answer_bytes = stack.api.with_key(None).get(OPENAPI).await.text.len();
    let addr = stack.server.addr();

    // Clients with a small receive buffer that pipeline large answers and
    // never read.
    let mut slow = Vec::new();
    for _ in 0..3 {
        let socket = TcpSocket::new_v4().expect("a socket");
        socket
            .set_recv_buffer_size(4096)
            .expect("can shrink the receive buffer");
        let mut stream = socket.connect(addr).await.expect("can connect");
        let head = format!("GET {OPENAPI} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").repeat(PIPELINED);
        stream
            .write_all(head.as_bytes())
            .await
            .expect("can send the requests");
        slow.push(stream);
    }

    // Meanwhile (past the write timeout) others are served promptly.
    let until = Instant::now() + Duration::from_millis(2000);
    let mut served = 0;
    while Instant::now() < until {
        let started = Instant::now();
        let health = stack.api.with_key(None).get("/healthz").await;
        assert_eq!(health.status, 200, "{health:?}");
        stack.get(PROFILE).await.assert_success(false);
        let took = started.elapsed();
        assert!(took < Duration::from_millis(500), "promptly: {took:?}");
        served += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served >= 3, "{served}");

    // Each slow reader's connection was closed: what was sent before runs
    // out (EOF or a reset) well short of every answer it asked for.
    for (n, mut stream) in slow.into_iter().enumerate() {
        let mut received = 0;
        let mut chunk = vec![0u8; 64 * 1024];
        let drained = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(k) => received += k,
                }
            }
        })
        .await;
        assert!(
            drained.is_ok(),
            "slow reader {n}: still open after {received} bytes"
        );
        assert!(
            received < PIPELINED * answer_bytes,
            "slow reader {n}: closed before all its answers ({received} bytes)"
        );
    }
}

/// Sends `head` (a whole request head, as written) on a new connection and
/// reads the answer to its end.
async fn exchange_raw(addr: SocketAddr, head: &str) -> Answer {
    let mut stream = TcpStream::connect(addr).await.expect("can connect");
    stream
        .write_all(head.as_bytes())
        .await
        .expect("can send the request");
    read_to_end(&mut stream).await
}

#[tokio::test]
async fn a_head_rfc_9112_refuses_is_400_and_a_long_target_414() {
    let stack = Stack::start().await;
    let addr = stack.server.addr();
    let key = format!("X-API-Key: {}\r\n", stack.key);
    for (head, status, code) in [
        // HTTP/1.1 names its host exactly once.
        ("GET /healthz HTTP/1.1\r\n", 400, "MALFORMED_REQUEST"),
        (
            "GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
        (
            "GET /healthz HTTP/1.0\r\nHost: a\r\nHost: b\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
        // A `GET` takes an origin-form target (or absolute-form).
        (
            "GET healthz HTTP/1.1\r\nHost: a\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
        ("GET * HTTP/1.1\r\nHost: a\r\n", 400, "MALFORMED_REQUEST"),
        // ... of an HTTP URI: another scheme is no request for this server.
        (
            "GET ftp://a/healthz HTTP/1.1\r\nHost: a\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
        // Hardening review, defect 4: a `Host` that is no host and port.
        (
            "GET /healthz HTTP/1.1\r\nHost: a b\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
        (
            "GET /healthz HTTP/1.1\r\nHost: x@y\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
        (
            "GET /healthz HTTP/1.1\r\nHost: x/y\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
        (
            "GET /healthz HTTP/1.1\r\nHost: [::1\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
        (
            "GET /healthz HTTP/1.1\r\nHost: a:8x\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
        // HTTP review, defect 7: an `http` URI's host is never empty.
        (
            "GET /healthz HTTP/1.1\r\nHost: \r\n",
            400,
            "MALFORMED_REQUEST",
        ),
    ] {
        let a = exchange_raw(addr, &format!("{head}{key}Connection: close\r\n\r\n")).await;
        assert_eq!(a.status, status, "{head:?}: {a:?}");
        a.assert_error(status, code);
    }
    for (head, status) in [
        ("GET /healthz HTTP/1.0\r\n", 200),
        ("GET http://a/healthz HTTP/1.1\r\nHost: a\r\n", 200),
        ("OPTIONS * HTTP/1.1\r\nHost: a\r\n", 204),
        ("GET /healthz HTTP/1.1\r\nHost: [::1]:8080\r\n", 200),
        (
            "GET /healthz HTTP/1.1\r\nHost: api.example.com:443\r\n",
            200,
        ),
        ("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n", 200),
    ] {
        let a = exchange_raw(addr, &format!("{head}Connection: close\r\n\r\n")).await;
        assert_eq!(a.status, status, "{head:?}: {a:?}");
    }
    // Hardening review, defect 5: a body framed twice, or in a coding no
    // request here has, is refused, and nothing after it on the
    // connection is read as a request.
    for coding in ["chunked, chunked", "gzip, chunked"] {
        let smuggled = format!(
            "GET /healthz HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {coding}\r\n\r\n0\r\n\r\n\
             GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        );
        let mut stream = TcpStream::connect(addr).await.expect("can connect");
        stream.write_all(smuggled.as_bytes()).await.expect("sent");
        let mut all = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut all),
        )
        .await;
        assert!(read.is_ok(), "{coding}: the connection was not closed");
        let text = String::from_utf8_lossy(&all);
        assert!(text.starts_with("HTTP/1.1 400"), "{coding}: {text}");
        assert!(text.contains("MALFORMED_REQUEST"), "{coding}: {text}");
        assert_eq!(
            text.matches("HTTP/1.1 ").count(),
            1,
            "{coding}: one answer, the second request never read: {text}"
        );
    }
    // A target past 8 KiB, in a head within `max_header_bytes`.
    let long = format!("/v1/shortvideo/search?query=luna&x={}", "a".repeat(8192));
    let head = format!("GET {long} HTTP/1.1\r\nHost: a\r\n{key}Connection: close\r\n\r\n");
    exchange_raw(addr, &head)
        .await
        .assert_error(414, "URI_TOO_LONG");
    assert_eq!(stack.fallback.request_count().await, 0);
}
