//! The audit's soak: one minute of normal traffic mixed with every abuse the
//! hardening findings describe, at once, against one server.
//!
//! - normal clients asking for profiles (a slow primary, 200 ms an answer,
//!   and the fallback when the primary is busy) and for the health check;
//! - clients that hang up 50 ms into each request (finding 2);
//! - slow readers: connections that pipeline requests for the OpenAPI
//!   document and never read (finding 3);
//! - searches, whose only provider answers 429 with `Retry-After` (finding
//!   1).
//!
//! It shows that the server keeps answering the normal clients, that
//! upstream work stays within `max_in_flight` however many callers hang up,
//! that the rate-limited provider is never asked before its `Retry-After`,
//! and that threads and open files come back to their baseline after.
//! Every loop ends at the soak's deadline; everything is on 127.0.0.1.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use wiremock::matchers::{method, path};
use wiremock::{Mock, Request, Respond, ResponseTemplate};

use socialgate_tests::config::{FALLBACK_KEY_ENV, PRIMARY};
use socialgate_tests::operator::{admin_addr, scrape};
use socialgate_tests::raw_upstream::RawUpstream;
use socialgate_tests::reload::{open_fd_count, thread_count};
use socialgate_tests::upstream::{fixtures, render};
use socialgate_tests::{Api, FallbackMock, Stack};

const SOAK: Duration = Duration::from_secs(60);
/// How long the primary takes to answer.
const PRIMARY_DELAY: Duration = Duration::from_millis(200);
/// `[providers.shortvideo-primary] max_in_flight`.
const PRIMARY_IN_FLIGHT: usize = 4;
/// `[server] max_concurrent_requests`.
const MAX_CONCURRENT: usize = 32;
/// What the search provider's 429 asks for.
const RETRY_AFTER_S: u64 = 3;
const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";
const SEARCH: &str = "/v1/shortvideo/search?query=luna";
/// The provider that serves search alone, and answers 429.
const SEARCH_PROVIDER: &str = "search-only";

/// Answers 429 `Retry-After: 3` and notes when each request arrived.
#[derive(Clone, Default)]
struct RateLimited {
    arrivals: Arc<Mutex<Vec<Instant>>>,
}

impl Respond for RateLimited {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        self.arrivals.lock().unwrap().push(Instant::now());
        ResponseTemplate::new(429)
            .insert_header("Retry-After", RETRY_AFTER_S.to_string())
            .set_body_raw(render(&fixtures::fallback_rate_limit()), "application/json")
    }
}

/// What the normal clients saw.
#[derive(Default)]
struct Seen {
    answered: usize,
    /// Anything but a 200: status and body.
    wrong: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_normal_clients_are_served_through_a_minute_of_abuse() {
    let primary = RawUpstream::slow_primary_profile(PRIMARY_DELAY);
    // Search has a provider of its own, so its 429 (which holds back the
    // whole provider) leaves the profile chain alone.
    let search_upstream = FallbackMock::start().await;
    let search_provider = format!(
        "[providers.{SEARCH_PROVIDER}]\nlibrary = \"shortvideo_fallback\"\n\
         base_url = \"{}\"\napi_key_env = \"{FALLBACK_KEY_ENV}\"\n",
        search_upstream.base_url()
    );
    let stack = Stack::builder()
        .primary_url(&primary.base_url())
        .search_order(Some(&[SEARCH_PROVIDER]))
        .raw(&search_provider)
        .server_line(&format!("max_concurrent_requests = {MAX_CONCURRENT}"))
        .server_line("write_timeout_ms = 1000")
        .provider_line(PRIMARY, &format!("max_in_flight = {PRIMARY_IN_FLIGHT}"))
        .extra_key("hangs-up")
        .start()
        .await;
    stack
        .fallback
        .user_info("lunabakes", &fixtures::fallback_user_info())
        .await;
    let rate_limited = RateLimited::default();
    search_upstream
        .respond_with(
            Mock::given(method("GET")).and(path("/user/search")),
            rate_limited.clone(),
        )
        .await;

    // Warm up every path once, then take the baseline.
    assert_eq!(stack.get(PROFILE).await.status, 200);
    assert_eq!(stack.get(SEARCH).await.status, 502);
    let pid = stack.server.pid();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (threads_before, fds_before) = (thread_count(pid), open_fd_count(pid));

    let deadline = Instant::now() + SOAK;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (api, seen) = (stack.api.clone(), Arc::clone(&seen));
        tasks.push(tokio::spawn(normal_client(api, seen, deadline)));
    }
    let hang_up_key = stack.api_with_key("hangs-up");
    for _ in 0..3 {
        let url = format!("{}{PROFILE}", stack.server.base_url());
        let key = hang_up_key.key().expect("a key").to_owned();
        tasks.push(tokio::spawn(hanging_up_client(url, key, deadline)));
    }
    let slow_readers: Vec<_> = (0..8)
        .map(|_| tokio::spawn(slow_reader(stack.server.addr(), deadline)))
        .collect();
    {
        let api = stack.api.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let a = api.get(SEARCH).await;
                assert_eq!(
                    a.status, 502,
                    "search while its provider is rate limited: {a:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }

    // Watch the upstream work while the soak runs.
    let mut most_at_primary = 0;
    while Instant::now() < deadline {
        most_at_primary = most_at_primary.max(primary.in_flight());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for task in tasks {
        task.await.expect("a client task panicked");
    }

    // The normal clients were answered, every time.
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(seen.answered > 100, "only {} normal answers", seen.answered);
    assert!(
        seen.wrong.is_empty(),
        "{} of {} normal requests went wrong, first: {:?}",
        seen.wrong.len(),
        seen.answered,
        seen.wrong.first()
    );

    // Upstream work stayed within its bounds.
    assert!(
        primary.max_in_flight() <= PRIMARY_IN_FLIGHT,
        "the primary held {} requests at once (watched: {most_at_primary})",
        primary.max_in_flight()
    );
    let metrics = scrape(admin_addr(&stack.server)).await;
    let abandoned = metrics
        .sum("socialgate_requests_abandoned_total", &[])
        .unwrap_or(0.0);
    assert!(abandoned > 10.0, "hang-ups counted: {abandoned}");

    // The rate-limited provider was never asked before its Retry-After.
    let arrivals = rate_limited.arrivals.lock().unwrap().clone();
    assert!(arrivals.len() >= 2, "{arrivals:?}");
    for pair in arrivals.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= Duration::from_millis(RETRY_AFTER_S * 1000 - 100),
            "asked again {gap:?} after a 429 with Retry-After: {RETRY_AFTER_S}"
        );
    }

    // Threads and files come back, the slow readers' sockets included
    // (closed by the server's write timeout while their clients still hold
    // them open). Idle connections the upstream client keeps for reuse (at
    // most a minute) are not a leak: they are counted apart, at most one
    // per request that was in flight at once.
    let fallback_port = stack.fallback.port();
    let files_now = || open_fd_count(pid) - pooled_connections_to(fallback_port);
    let settled = Instant::now() + Duration::from_secs(30);
    let (mut threads, mut fds) = (thread_count(pid), files_now());
    while (threads > threads_before + 2 || fds > fds_before + 2) && Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(250)).await;
        (threads, fds) = (thread_count(pid), files_now());
    }
    let pooled = pooled_connections_to(fallback_port);
    assert!(
        threads <= threads_before + 2,
        "threads: {threads_before} before, {threads} after"
    );
    assert!(
        fds <= fds_before + 2,
        "open files: {fds_before} before, {fds} after (not counting {pooled} pooled upstream connections)"
    );
    assert!(
        pooled <= MAX_CONCURRENT,
        "{pooled} idle upstream connections kept for at most {MAX_CONCURRENT} requests at once"
    );
    for reader in slow_readers {
        reader.abort();
    }
    assert_eq!(stack.get("/healthz").await.status, 200);
}

/// Established TCP connections to `port` on 127.0.0.1, from
/// `/proc/net/tcp`: the server's pooled connections to that upstream (only
/// the server connects to it).
fn pooled_connections_to(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("can read /proc/net/tcp");
    let remote = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // `rem_address` is field 2, `st` field 3; 01 is ESTABLISHED.
            fields.get(2) == Some(&remote.as_str()) && fields.get(3) == Some(&"01")
        })
        .count()
}

/// Profiles back to back until `deadline`; notes every answer.
async fn normal_client(api: Api, seen: Arc<Mutex<Seen>>, deadline: Instant) {
    while Instant::now() < deadline {
        let a = api.get(PROFILE).await;
        let mut seen = seen.lock().unwrap();
        seen.answered += 1;
        if a.status != 200 || a.data()["username"] != "lunabakes" {
            seen.wrong.push(format!("{} {}", a.status, a.text));
        }
    }
}

/// Requests that hang up 50 ms in, back to back, until `deadline`.
async fn hanging_up_client(url: String, key: String, deadline: Instant) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(50))
        .build()
        .expect("a client");
    while Instant::now() < deadline {
        // Whatever comes back (usually nothing) is of no interest.
        let _ = client.get(&url).header("X-API-Key", &key).send().await;
    }
}

/// Connections that pipeline requests for the OpenAPI document and never
/// read an answer, one after another until `deadline`.
async fn slow_reader(addr: std::net::SocketAddr, deadline: Instant) {
    let requests = "GET /v1/openapi.json HTTP/1.1\r\nHost: soak\r\n\r\n".repeat(200);
    let mut held: Vec<TcpStream> = Vec::new();
    while Instant::now() < deadline {
        let socket = TcpSocket::new_v4().expect("a socket");
        // A small receive window, so the server's writes stall soon.
        let _ = socket.set_recv_buffer_size(4096);
        let Ok(mut stream) = socket.connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        // Stalls once the server stops reading; the server then gives up.
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            stream.write_all(requests.as_bytes()),
        )
        .await;
        held.push(stream);
        // Keep at most a few open: the point is stalled writes, not a flood.
        if held.len() > 3 {
            held.remove(0);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Held until the task is aborted, after the server's side is counted.
    std::future::pending::<()>().await;
}
