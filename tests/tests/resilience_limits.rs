//! Limits on the client side (the `[server]` and `[rate_limit]` keys of the
//! README's configuration table): a slow client is closed after
//! `header_timeout_ms` while others are served; a head over
//! `max_header_bytes` is refused; past `max_concurrent_requests` a request
//! is answered 503 `OVERLOADED` at once, and past
//! `max_concurrent_requests_per_key` that key's request 429 `RATE_LIMITED`
//! while other keys are served; a key over its `[rate_limit]` gets
//! 429 `RATE_LIMITED` with no upstream call; SIGTERM lets the request in
//! flight finish, refuses new connections and exits 0. A request whose
//! caller hangs up keeps its slot until its upstream work ends, so hanging
//! up buys no upstream work past `max_concurrent_requests`; a provider with
//! `max_in_flight` attempts running is busy and the next one answers.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use socialgate_tests::config::PRIMARY;
use socialgate_tests::operator::hang_up_after;
use socialgate_tests::raw_upstream::RawUpstream;
use socialgate_tests::upstream::{
    assert_answered_by, fixtures, json_response, FALLBACK_FOLLOWERS, LUNA, PRIMARY_FOLLOWERS,
};
use socialgate_tests::{eventually, Answer, Api, Stack};

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";

/// How a raw connection ended.
#[derive(Debug)]
enum Ending {
    /// The server closed it (EOF or reset) after this long, having sent
    /// these bytes first.
    Closed { after: Duration, sent: String },
    /// Still open when the client gave up.
    StillOpen,
}

/// Connects and sends `head` one byte a second, at most `max_bytes` bytes,
/// watching for the server to close the connection.
fn send_slowly(addr: SocketAddr, head: &[u8], max_bytes: usize) -> Ending {
    let mut stream = TcpStream::connect(addr).expect("can connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("can set a read timeout");
    let started = Instant::now();
    let mut received = Vec::new();
    for byte in head.iter().take(max_bytes) {
        if stream.write_all(std::slice::from_ref(byte)).is_err() {
            return Ending::Closed {
                after: started.elapsed(),
                sent: String::from_utf8_lossy(&received).into_owned(),
            };
        }
        // Up to a second for the server to give up on us.
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => {
                    return Ending::Closed {
                        after: started.elapsed(),
                        sent: String::from_utf8_lossy(&received).into_owned(),
                    }
                }
                Ok(n) => received.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
                Err(_) => {
                    return Ending::Closed {
                        after: started.elapsed(),
                        sent: String::from_utf8_lossy(&received).into_owned(),
                    }
                }
            }
        }
    }
    Ending::StillOpen
}

#[tokio::test]
async fn a_slow_client_is_closed_while_others_are_served() {
    let stack = Stack::builder()
        .search_order(None)
        .server_line("header_timeout_ms = 1000")
        .start()
        .await;
    stack.primary.serve_fixtures().await;
    let addr = stack.server.addr();
    // One byte a second; at most header_timeout / 1 s + 3 bytes.
    let slow = tokio::task::spawn_blocking(move || {
        let head = format!("GET {PROFILE} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        send_slowly(addr, head.as_bytes(), 4)
    });

    // Meanwhile others, each on a new connection, are answered promptly.
    let mut served = 0;
    for _ in 0..40 {
        if slow.is_finished() {
            break;
        }
        let api = Api::new(&stack.server.base_url(), Some(&stack.key));
        let started = Instant::now();
        let a = api.get(PROFILE).await;
        assert_eq!(a.data()["followers"], PRIMARY_FOLLOWERS, "{a:?}");
        let health = api.with_key(None).get("/healthz").await;
        assert_eq!(health.status, 200, "{health:?}");
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(500),
            "served promptly: {took:?}"
        );
        served += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    match slow.await.expect("the slow client finished") {
        Ending::Closed { after, sent } => {
            assert!(
                after < Duration::from_millis(2500),
                "closed within the 1 s header timeout and a margin, after {after:?}"
            );
            assert!(
                sent.is_empty() || sent.starts_with("HTTP/1.1 408"),
                "nothing, or a 408, before closing: {sent:?}"
            );
        }
        Ending::StillOpen => panic!("the server kept a connection sending one byte a second"),
    }
    assert!(served >= 3, "others were served meanwhile ({served})");
    assert_eq!(stack.primary.request_count().await, served);
}

#[tokio::test]
async fn a_head_over_max_header_bytes_is_refused_with_the_json_envelope() {
    let stack = Stack::builder()
        .search_order(None)
        .server_line("max_header_bytes = 8192")
        .start()
        .await;
    let addr = stack.server.addr();
    let exchange = move |filler: usize| {
        let mut stream = TcpStream::connect(addr).expect("can connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(3)))
            .expect("can set a read timeout");
        let head = format!(
            "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(filler)
        );
        // The server may close before taking it all: that is a refusal.
        let _ = stream.write_all(head.as_bytes());
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    };
    let big = tokio::task::spawn_blocking(move || exchange(20_000))
        .await
        .expect("the exchange finished");
    // The JSON envelope, with a request ID, like every other refusal.
    assert!(
        big.starts_with("HTTP/1.1 431"),
        "a 20 kB head: 431, got {big:?}"
    );
    let (head, body) = big.split_once("\r\n\r\n").expect("a head and a body");
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("\r\ncontent-type: application/json"),
        "{big:?}"
    );
    let id = head
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .unwrap_or_else(|| panic!("431 carries X-Request-Id: {big:?}"));
    let json: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(json["error"]["code"], "HEADERS_TOO_LARGE", "{big:?}");
    assert_eq!(json["meta"]["request_id"], id, "{big:?}");
    // A head under the limit is served, and the server carries on.
    let small = tokio::task::spawn_blocking(move || exchange(4_000))
        .await
        .expect("the exchange finished");
    assert!(small.starts_with("HTTP/1.1 200"), "a 4 kB head: {small:?}");
}

/// Makes the primary's profile answer take a second and sends `n` requests
/// with the stack's key, returning once every one has reached the upstream
/// (so each holds its places while the test goes on).
async fn hold_slow_requests(stack: &Stack, n: usize) -> Vec<tokio::task::JoinHandle<Answer>> {
    let slow = json_response(&fixtures::primary_user_profile()).set_delay(Duration::from_secs(1));
    let route = stack
        .primary
        .route("/v1/user/profile", &[("unique_id", LUNA)]);
    stack.primary.respond(route, slow).await;
    let held = (0..n)
        .map(|_| {
            let api = stack.api.clone();
            tokio::spawn(async move { api.get(PROFILE).await })
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(3), || async {
            stack.primary.request_count().await == n
        })
        .await,
        "the {n} held requests reached the upstream"
    );
    held
}

#[tokio::test]
async fn past_max_concurrent_requests_the_answer_is_503_at_once() {
    let stack = Stack::builder()
        .search_order(None)
        .server_line("max_concurrent_requests = 1")
        .timeout_ms(PRIMARY, 5000)
        .start()
        .await;
    let holding = hold_slow_requests(&stack, 1).await;

    let started = Instant::now();
    let a = stack.get(PROFILE).await;
    let took = started.elapsed();
    a.assert_error(503, "OVERLOADED");
    let retry: u64 = a
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("503 needs Retry-After in seconds: {a:?}"));
    assert!(retry >= 1, "{a:?}");
    assert!(
        took < Duration::from_millis(200),
        "at once, not queued: {took:?}"
    );
    // Overload is checked before the key.
    stack
        .api
        .with_key(None)
        .get(PROFILE)
        .await
        .assert_error(503, "OVERLOADED");
    // Public paths skip the gate.
    for path in ["/healthz", "/readyz"] {
        let a = stack.api.with_key(None).get(path).await;
        assert_eq!(a.status, 200, "{path} while full: {a:?}");
    }
    assert_eq!(
        stack.primary.request_count().await,
        1,
        "refused before any upstream call"
    );

    let [first] = <[_; 1]>::try_from(holding).expect("one held request");
    let first: Answer = first.await.expect("the first request finished");
    first.assert_success(false);
    assert_eq!(first.data()["followers"], PRIMARY_FOLLOWERS);
    // The slot is free again.
    stack.primary.reset().await;
    stack.primary.serve_fixtures().await;
    stack.get(PROFILE).await.assert_success(false);
}

#[tokio::test]
async fn past_max_concurrent_requests_per_key_that_key_gets_429_at_once_and_others_are_served() {
    let stack = Stack::builder()
        .search_order(None)
        .server_line("max_concurrent_requests_per_key = 2")
        .timeout_ms(PRIMARY, 5000)
        .extra_key("other")
        // A bucket that does not refill within the test, and credits
        // counted: what the refused request takes of each is seen.
        .raw("[rate_limit]\nper_second = 0.001\nburst = 5\n\n[billing]\nenforce = true")
        .start()
        .await;
    let holding = hold_slow_requests(&stack, 2).await;

    let started = Instant::now();
    let a = stack.get(PROFILE).await;
    let took = started.elapsed();
    a.assert_error(429, "RATE_LIMITED");
    assert!(
        a.error_message().contains("2 requests in flight"),
        "says why: {a:?}"
    );
    assert_eq!(a.header("retry-after"), Some("1"), "{a:?}");
    assert!(
        took < Duration::from_millis(500),
        "at once, not queued behind the upstream's second: {took:?}"
    );
    // It took its rate-limit token, as every request with a key does (5,
    // less the two held and this one), and no credit.
    let standing = a.header("ratelimit").unwrap_or_default();
    assert!(standing.contains("r=2"), "{a:?}");
    assert_eq!(a.header("x-credits-remaining"), Some("150"), "{a:?}");
    // Another key is not held back by this one's requests.
    stack
        .api_with_key("other")
        .get(PROFILE)
        .await
        .assert_success(false);
    assert_eq!(
        stack.primary.request_count().await,
        3,
        "the refused request reached no upstream"
    );
    for request in holding {
        request
            .await
            .expect("the request task ran")
            .assert_success(false);
    }
    // Their places are free again once they are answered; the refused
    // request was never charged (150 free credits, less the three served).
    let after = stack.get(PROFILE).await;
    after.assert_success(false);
    assert_eq!(
        after.header("x-credits-remaining"),
        Some("147"),
        "{after:?}"
    );
}

#[tokio::test]
async fn a_key_over_its_rate_limit_gets_429_without_an_upstream_call() {
    let stack = Stack::builder()
        .search_order(None)
        .raw("[rate_limit]\nper_second = 1\nburst = 2")
        .extra_key("other")
        .start()
        .await;
    stack.primary.serve_fixtures().await;
    let answers = [
        stack.get(PROFILE).await,
        stack.get(PROFILE).await,
        stack.get(PROFILE).await,
    ];
    answers[0].assert_success(false);
    answers[1].assert_success(false);
    let a = &answers[2];
    a.assert_error(429, "RATE_LIMITED");
    let retry: u64 = a
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("429 needs Retry-After in seconds: {a:?}"));
    assert!((1..=2).contains(&retry), "about a second: {a:?}");
    assert_eq!(
        stack.primary.request_count().await,
        2,
        "the limited request reached no upstream"
    );
    assert_eq!(stack.fallback.request_count().await, 0);
    // The limit is checked right after the key, before the platform.
    stack
        .get("/v1/nosuchplatform/profile?username=x")
        .await
        .assert_error(429, "RATE_LIMITED");

    // Another key has its own bucket; public paths are not limited.
    stack
        .api_with_key("other")
        .get(PROFILE)
        .await
        .assert_success(false);
    let health = stack.get("/healthz").await;
    assert_eq!(health.status, 200, "{health:?}");
    assert_eq!(stack.primary.request_count().await, 3);
}

/// Sends SIGTERM to the server's own process (never by name).
fn terminate(pid: u32) {
    let status = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .expect("can run kill");
    assert!(status.success(), "kill -TERM {pid} failed");
}

fn connection_refused(addr: SocketAddr) -> bool {
    matches!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused
    )
}

#[tokio::test]
async fn sigterm_finishes_the_request_in_flight_refuses_new_ones_and_exits_0() {
    const GRACE_MS: u64 = 3000;
    let mut stack = Stack::builder()
        .search_order(None)
        .server_line(&format!("shutdown_grace_ms = {GRACE_MS}"))
        .timeout_ms(PRIMARY, 5000)
        .start()
        .await;
    let slow = json_response(&fixtures::primary_user_profile()).set_delay(Duration::from_secs(1));
    let route = stack
        .primary
        .route("/v1/user/profile", &[("unique_id", LUNA)]);
    stack.primary.respond(route, slow).await;

    let api = stack.api.clone();
    let in_flight = tokio::spawn(async move { api.get(PROFILE).await });
    assert!(
        eventually(Duration::from_secs(3), || async {
            stack.primary.request_count().await == 1
        })
        .await,
        "the request reached the upstream"
    );
    let addr = stack.server.addr();
    terminate(stack.server.pid());
    let signalled = Instant::now();

    assert!(
        eventually(Duration::from_secs(1), || async {
            connection_refused(addr)
        })
        .await,
        "new connections are refused soon after SIGTERM"
    );
    let a = in_flight.await.expect("the request task finished");
    a.assert_success(false);
    assert_eq!(a.data()["followers"], PRIMARY_FOLLOWERS, "{a:?}");

    let bound = Duration::from_millis(GRACE_MS + 1500);
    let mut status = None;
    while status.is_none() && signalled.elapsed() < bound {
        status = stack.server.exit_status();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = status.unwrap_or_else(|| panic!("still running {bound:?} after SIGTERM"));
    assert_eq!(status.code(), Some(0), "a clean exit: {status:?}");
    assert!(
        stack.server.stderr().contains("shutting down"),
        "the drain is logged:\n{}",
        stack.server.stderr()
    );
}

#[tokio::test]
async fn sigterm_stops_waiting_for_a_request_after_the_grace_period() {
    const GRACE_MS: u64 = 500;
    let mut stack = Stack::builder()
        .search_order(None)
        .server_line(&format!("shutdown_grace_ms = {GRACE_MS}"))
        .timeout_ms(PRIMARY, 5000)
        .start()
        .await;
    let slow = json_response(&fixtures::primary_user_profile()).set_delay(Duration::from_secs(4));
    let route = stack
        .primary
        .route("/v1/user/profile", &[("unique_id", LUNA)]);
    stack.primary.respond(route, slow).await;
    let request = reqwest::Client::new()
        .get(format!("{}{PROFILE}", stack.server.base_url()))
        .header("X-API-Key", &stack.key)
        .timeout(Duration::from_secs(6));
    // Its answer never comes: the connection is closed under it.
    let in_flight = tokio::spawn(async move { request.send().await.is_ok() });
    assert!(
        eventually(Duration::from_secs(3), || async {
            stack.primary.request_count().await == 1
        })
        .await,
        "the request reached the upstream"
    );
    terminate(stack.server.pid());
    let signalled = Instant::now();
    let bound = Duration::from_millis(GRACE_MS + 1500);
    let mut status = None;
    while status.is_none() && signalled.elapsed() < bound {
        status = stack.server.exit_status();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = status.unwrap_or_else(|| panic!("still running {bound:?} after SIGTERM"));
    assert_eq!(status.code(), Some(0), "a clean exit: {status:?}");
    let answered = in_flight.await.expect("the request task finished");
    assert!(
        !answered,
        "the request outliving the grace period was cut off"
    );
}

#[tokio::test]
async fn an_abandoned_request_keeps_its_slot_until_its_upstream_work_ends() {
    let upstream = RawUpstream::slow_primary_profile(Duration::from_secs(2));
    let stack = Stack::builder()
        .providers(&[PRIMARY])
        .search_order(None)
        .primary_url(&upstream.base_url())
        .timeout_ms(PRIMARY, 5000)
        .server_line("max_concurrent_requests = 2")
        .start()
        .await;
    let addr = stack.server.addr();

    // Six clients in a row, each hanging up after 50 ms.
    for n in 0..6 {
        let id = format!("gone-{n}");
        let headers = [("X-API-Key", stack.key.as_str()), ("X-Request-Id", &id)];
        hang_up_after(addr, PROFILE, &headers, Duration::from_millis(50)).await;
    }
    // Their upstream work is still running (2 s): it holds both slots.
    stack.get(PROFILE).await.assert_error(503, "OVERLOADED");
    assert_eq!(upstream.in_flight(), 2, "the abandoned work still runs");
    assert_eq!(
        upstream.request_count(),
        2,
        "no more upstream requests than slots"
    );

    // Once it ends, the slots are free again.
    assert!(
        eventually(Duration::from_secs(5), || async {
            upstream.in_flight() == 0
        })
        .await,
        "the abandoned work ended"
    );
    let a = stack.get(PROFILE).await;
    a.assert_success(false);
    assert_eq!(a.data()["followers"], PRIMARY_FOLLOWERS, "{a:?}");
    assert!(
        upstream.max_in_flight() <= 2,
        "at most max_concurrent_requests upstream requests at once: {}",
        upstream.max_in_flight()
    );
}

#[tokio::test]
async fn past_max_in_flight_a_busy_provider_hands_the_request_to_the_next() {
    let stack = Stack::builder()
        .search_order(None)
        .timeout_ms(PRIMARY, 5000)
        .provider_line(PRIMARY, "max_in_flight = 1")
        // One failure would open it: being busy is none.
        .breaker(PRIMARY, 1, 60_000)
        .start()
        .await;
    stack.fallback.serve_fixtures().await;
    let slow = json_response(&fixtures::primary_user_profile()).set_delay(Duration::from_secs(1));
    let route = stack
        .primary
        .route("/v1/user/profile", &[("unique_id", LUNA)]);
    stack.primary.respond(route, slow).await;

    let api = stack.api.clone();
    let first = tokio::spawn(async move { api.get(PROFILE).await });
    assert!(
        eventually(Duration::from_secs(3), || async {
            stack.primary.request_count().await == 1
        })
        .await,
        "the first request reached the primary"
    );
    let (second, took) = stack.timed_get(PROFILE).await;
    assert_answered_by(&second, FALLBACK_FOLLOWERS, "the primary is busy");
    assert!(
        took < Duration::from_millis(500),
        "without waiting for the primary: {took:?}"
    );
    let first = first.await.expect("the first request finished");
    assert_answered_by(&first, PRIMARY_FOLLOWERS, "the first request");
    assert_eq!(stack.primary.request_count().await, 1);

    // Busy was no failure: the primary's breaker is still closed.
    let third = stack.get(PROFILE).await;
    assert_answered_by(&third, PRIMARY_FOLLOWERS, "after the busy spell");
    assert_eq!(stack.primary.request_count().await, 2);
    assert_eq!(stack.fallback.request_count().await, 1);
}
