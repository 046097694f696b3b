//! `failover-bench`: what a request costs when the primary is down and its
//! breaker is open, against a chain that has only the fallback (README,
//! "Failover cost with the primary down", has the method and the figures).
//!
//! Two real servers share one fallback double: (a) `providers = [fallback]`;
//! (b) `providers = [primary, fallback]`, the primary's double answering 503
//! to everything after 25 ms (a dying upstream is slow to fail; without the
//! breaker each request would pay that), `breaker_failures = 3` and a
//! 10-minute cooldown. A few
//! warm-up requests open (b)'s breaker; then N requests per server are
//! timed, alternating between the servers (and which goes first) so drift on
//! a busy machine hits both alike. It prints the median, p90 and p99 of
//! each, the difference of the medians, and how many requests the primary
//! received while measured.
//!
//! Exit status: 0 when both hold, 1 if the primary received any request
//! during measurement, 2 if the medians differ by more than 1 ms.
//!
//! Build first: `cargo build --workspace && cargo run -p socialgate-tests
//! --bin failover-bench` (the profile of the build is the one measured).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use socialgate_tests::config::{standard_env, Config, ConfigBuilder, FALLBACK, PRIMARY};
use socialgate_tests::{issue_key, paths, FallbackMock, PrimaryMock, Server, StackBuilder};
use wiremock::ResponseTemplate;

/// Timed requests per scenario.
const N: usize = 500;
/// Untimed requests per scenario before measuring (after the breaker opened).
const WARM_UP: usize = 50;
/// Failures that open the primary's breaker.
const BREAKER_FAILURES: u32 = 3;
/// Long enough that no probe happens during the run.
const COOLDOWN_MS: u64 = 600_000;
/// How long the down primary takes to answer its 503.
const PRIMARY_FAILS_AFTER: Duration = Duration::from_millis(25);
/// The criterion: an open breaker costs a request no measurable time.
const MAX_MEDIAN_DIFFERENCE: Duration = Duration::from_millis(1);

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";
/// `followers` in the fallback's profile fixture: the fallback answered.
const FALLBACK_FOLLOWERS: &str = "\"followers\":5500000";

struct Scenario {
    name: &'static str,
    server: Server,
    client: reqwest::Client,
    url: String,
    key: String,
    samples: Vec<Duration>,
    _config: Config,
}

impl Scenario {
    fn start(name: &'static str, config: Config) -> Scenario {
        let key = issue_key(&config, "bench");
        let server = Server::start_with(&config, &standard_env(), &[]);
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("can build an HTTP client");
        let url = format!("{}{PROFILE}", server.base_url());
        Scenario {
            name,
            server,
            client,
            url,
            key,
            samples: Vec::with_capacity(N),
            _config: config,
        }
    }

    /// One request, checked to be the fallback's answer; its latency.
    async fn request(&self) -> Duration {
        let started = Instant::now();
        let response = self
            .client
            .get(&self.url)
            .header("X-API-Key", &self.key)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{}: request failed: {e}", self.name));
        let status = response.status().as_u16();
        let body = response.text().await.expect("can read the body");
        let took = started.elapsed();
        assert!(
            status == 200 && body.contains(FALLBACK_FOLLOWERS),
            "{}: expected the fallback's answer, got HTTP {status} {body}",
            self.name
        );
        took
    }
}

struct Summary {
    median: Duration,
    p90: Duration,
    p99: Duration,
    min: Duration,
    max: Duration,
}

fn summarize(samples: &[Duration]) -> Summary {
    let mut sorted = samples.to_vec();
    sorted.sort();
    // Nearest rank.
    let rank =
        |p: f64| sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
    let mid = sorted.len() / 2;
    let median = if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2
    };
    Summary {
        median,
        p90: rank(0.90),
        p99: rank(0.99),
        min: sorted[0],
        max: sorted[sorted.len() - 1],
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    paths::require_plugin("shortvideo_primary");
    paths::require_plugin("shortvideo_fallback");
    let primary = PrimaryMock::start().await;
    let fallback = FallbackMock::start().await;
    primary
        .respond_all(ResponseTemplate::new(503).set_delay(PRIMARY_FAILS_AFTER))
        .await;
    fallback.serve_fixtures().await;

    let fallback_only = ConfigBuilder::new()
        .platform("shortvideo", "live", &[FALLBACK])
        .fallback(&fallback.base_url())
        .write();
    // The standard chain, with no per-endpoint order.
    let primary_down = StackBuilder::default()
        .search_order(None)
        .breaker(PRIMARY, BREAKER_FAILURES, COOLDOWN_MS)
        .config(&primary, &fallback)
        .write();
    let mut a = Scenario::start("fallback only", fallback_only);
    let mut b = Scenario::start("primary down, breaker open", primary_down);

    // Open (b)'s breaker: each of these asks the primary, then the fallback.
    for _ in 0..BREAKER_FAILURES {
        b.request().await;
    }
    let opened_with = primary.request_count().await;
    for _ in 0..WARM_UP {
        a.request().await;
        b.request().await;
    }
    let before = primary.request_count().await;
    let skipped_in_warm_up = before == opened_with;

    let started = Instant::now();
    for i in 0..N {
        // Alternate which goes first.
        if i % 2 == 1 {
            let t = b.request().await;
            b.samples.push(t);
            let t = a.request().await;
            a.samples.push(t);
        } else {
            let t = a.request().await;
            a.samples.push(t);
            let t = b.request().await;
            b.samples.push(t);
        }
    }
    let measured_for = started.elapsed();
    let during = primary.request_count().await - before;

    let profile = if cfg!(debug_assertions) {
        "debug (unoptimized) build"
    } else {
        "release build"
    };
    println!("failover-bench: {N} sequential requests per scenario, interleaved, one keep-alive client each");
    println!(
        "server: {} ({profile}); upstream doubles: wiremock on 127.0.0.1; GET {PROFILE}",
        paths::socialgate_bin().display()
    );
    println!(
        "(b): primary answers 503 after {} ms, breaker_failures = {BREAKER_FAILURES}, breaker_cooldown_ms = {COOLDOWN_MS}; \
         opened by {opened_with} warm-up requests, then {WARM_UP} more per scenario",
        PRIMARY_FAILS_AFTER.as_millis()
    );
    println!();
    println!(
        "{:<30} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "scenario", "median", "p90", "p99", "min", "max"
    );
    let mut medians = Vec::new();
    for s in [&a, &b] {
        let sum = summarize(&s.samples);
        println!(
            "{:<30} {:>10} {:>10} {:>10} {:>10} {:>10}",
            s.name,
            ms(sum.median),
            ms(sum.p90),
            ms(sum.p99),
            ms(sum.min),
            ms(sum.max)
        );
        medians.push(sum.median);
    }
    let difference = medians[1].as_secs_f64() - medians[0].as_secs_f64();
    println!();
    println!(
        "difference of medians (b - a): {:+.3} ms (criterion: within {} ms)",
        difference * 1000.0,
        MAX_MEDIAN_DIFFERENCE.as_millis()
    );
    println!(
        "requests the primary received: {opened_with} while opening the breaker, \
         {} during warm-up after it opened, {during} during the {:.1} s measured phase",
        before - opened_with,
        measured_for.as_secs_f64()
    );

    let alive = a.server.is_running() && b.server.is_running();
    let mut code = 0;
    if during != 0 || !skipped_in_warm_up {
        println!("FAIL: the primary received requests while its breaker was open");
        code = 1;
    } else if difference.abs() > MAX_MEDIAN_DIFFERENCE.as_secs_f64() {
        println!("FAIL: the medians differ by more than 1 ms");
        code = 2;
    } else if !alive {
        println!("FAIL: a server exited during the run");
        code = 1;
    } else {
        println!(
            "OK: same median within 1 ms, and no request reached the primary during the cooldown"
        );
    }
    drop(a);
    drop(b);
    ExitCode::from(code)
}
