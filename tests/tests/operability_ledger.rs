//! The usage ledger and billing: credits of answered requests are counted
//! per key and UTC day, written at SIGTERM and found after a restart;
//! `socialgate keys usage` reads them while the server runs (a table, or
//! JSON, `--since` a day). With `[billing] enforce = true`, a fresh key's
//! 151st paid request answers 402 `INSUFFICIENT_CREDITS` without any
//! upstream call, a request every provider failed cost nothing, concurrent
//! requests cannot overspend, and spent credits survive a restart. A key
//! cannot get more upstream work than its credits by hanging up: the
//! abandoned request keeps its credit until its work ends, and is charged
//! nothing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use socialgate_tests::config::{standard_env, Config};
use socialgate_tests::config::{FALLBACK, PRIMARY};
use socialgate_tests::operator::{
    admin_addr, credits_per_key, hang_up_after, scrape, signal, usage_json, utc_day, wait_exit,
    UsageRow,
};
use socialgate_tests::raw_upstream::RawUpstream;
use socialgate_tests::{eventually, StackBuilder};
use socialgate_tests::{issue_key, run_cli, Api, FallbackMock, PrimaryMock, Server, Stack};
use wiremock::matchers::{path, query_param};
use wiremock::{Mock, ResponseTemplate};

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";
const POSTS: &str = "/v1/shortvideo/posts?username=lunabakes";
const POST: &str = "/v1/shortvideo/post?id=7312345678901234567";
const COMMENTS: &str = "/v1/shortvideo/comments?id=7312345678901234567&count=3";
const SEARCH: &str = "/v1/shortvideo/search?query=luna";
/// A post every provider fails on.
const BROKEN_POST: &str = "/v1/shortvideo/post?id=500500";

/// Doubles serving the fixtures, a config, keys issued before the server
/// starts (so it knows them without a reload), and the server.
struct Setup {
    server: Server,
    keys: Vec<String>,
    primary: PrimaryMock,
    fallback: FallbackMock,
    config: Config,
}

impl Setup {
    async fn start(builder: StackBuilder, names: &[&str]) -> Setup {
        let primary = PrimaryMock::start().await;
        let fallback = FallbackMock::start().await;
        primary.serve_fixtures().await;
        primary
            .respond(
                Mock::given(path("/v1/aweme/detail")).and(query_param("aweme_id", "500500")),
                ResponseTemplate::new(500),
            )
            .await;
        fallback.serve_fixtures().await;
        fallback.fail_all(500).await;
        let config = builder.config(&primary, &fallback).write();
        let keys = names.iter().map(|n| issue_key(&config, n)).collect();
        let server = Server::start_with(&config, &standard_env(), &[]);
        Setup {
            server,
            keys,
            primary,
            fallback,
            config,
        }
    }

    fn api(&self, key: usize) -> Api {
        Api::new(&self.server.base_url(), Some(&self.keys[key]))
    }

    /// Stops the server with SIGTERM and waits for a clean exit.
    fn terminate(&mut self) {
        signal(&self.server, "TERM");
        let status = wait_exit(&mut self.server, Duration::from_secs(10))
            .expect("the server exits after SIGTERM");
        assert!(
            status.success(),
            "SIGTERM ends the server cleanly: {status}"
        );
    }

    fn restart(&mut self) {
        self.server = Server::start_with(&self.config, &standard_env(), &[]);
    }

    async fn upstream_calls(&self) -> usize {
        self.primary.request_count().await + self.fallback.request_count().await
    }
}

/// Today's UTC day, or yesterday's too when the test runs across midnight.
fn today_or_just_before(started: SystemTime) -> [String; 2] {
    [utc_day(started), utc_day(SystemTime::now())]
}

fn assert_per_key(rows: &[UsageRow], want: &[(&str, u64)], days: &[String; 2]) {
    let want: BTreeMap<String, u64> = want.iter().map(|(k, n)| (k.to_string(), *n)).collect();
    assert_eq!(credits_per_key(rows), want, "credits per key: {rows:?}");
    for row in rows {
        assert_eq!(
            row.requests, row.credits,
            "one credit per answered request: {row:?}"
        );
        assert!(days.contains(&row.day), "a UTC day of this test: {row:?}");
    }
}

/// Polls `keys usage --json` until the credits per key are `want`: the
/// server writes its counts in the background, about once a second.
async fn wait_for_usage(config: &Config, want: &[(&str, u64)]) -> Vec<UsageRow> {
    let want_map: BTreeMap<String, u64> = want.iter().map(|(k, n)| (k.to_string(), *n)).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let rows = usage_json(config, &[]);
        if credits_per_key(&rows) == want_map {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "`keys usage` never showed {want_map:?}; last: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn credits_of_seven_requests_survive_sigterm_and_a_restart_per_key() {
    let started = SystemTime::now();
    let mut s = Setup::start(Stack::builder(), &["alpha", "beta"]).await;
    let (alpha, beta) = (s.api(0), s.api(1));
    for path in [PROFILE, POSTS, POST, COMMENTS] {
        let a = alpha.get(path).await;
        assert_eq!(a.status, 200, "{a:?}");
    }
    for path in [SEARCH, POST, PROFILE] {
        let a = beta.get(path).await;
        assert_eq!(a.status, 200, "{a:?}");
    }
    // Errors cost nothing and are not counted.
    alpha
        .get(BROKEN_POST)
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
    alpha
        .get("/v1/shortvideo/post?id=x")
        .await
        .assert_invalid("id");
    alpha
        .with_key(None)
        .get(POST)
        .await
        .assert_error(401, "MISSING_API_KEY");

    s.terminate();
    let days = today_or_just_before(started);
    let rows = usage_json(&s.config, &[]);
    assert_per_key(&rows, &[("alpha", 4), ("beta", 3)], &days);

    // After a restart, the ledger still holds all seven, and counts on.
    s.restart();
    assert_per_key(
        &usage_json(&s.config, &[]),
        &[("alpha", 4), ("beta", 3)],
        &days,
    );
    let a = s.api(1).get(POST).await;
    assert_eq!(a.status, 200, "{a:?}");
    s.terminate();
    assert_per_key(
        &usage_json(&s.config, &[]),
        &[("alpha", 4), ("beta", 4)],
        &days,
    );
}

#[tokio::test]
async fn keys_usage_reads_the_ledger_while_the_server_runs() {
    let started = SystemTime::now();
    let s = Setup::start(Stack::builder(), &["gamma", "delta"]).await;
    assert_eq!(
        usage_json(&s.config, &[]),
        Vec::new(),
        "nothing counted yet"
    );
    let out = run_cli(&s.config, &standard_env(), &["keys", "usage"]);
    assert!(out.success(), "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "no usage recorded");

    for path in [PROFILE, POST] {
        assert_eq!(s.api(0).get(path).await.status, 200);
    }
    assert_eq!(s.api(1).get(SEARCH).await.status, 200);
    let rows = wait_for_usage(&s.config, &[("gamma", 2), ("delta", 1)]).await;
    let days = today_or_just_before(started);
    assert_per_key(&rows, &[("gamma", 2), ("delta", 1)], &days);

    // The table: a header, a line per key and day, a total per key.
    let out = run_cli(&s.config, &standard_env(), &["keys", "usage"]);
    assert!(out.success(), "{}", out.stderr);
    let lines: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["key", "day", "requests", "credits"],
        "{}",
        out.stdout
    );
    for (key, n) in [("gamma", "2"), ("delta", "1")] {
        assert!(
            lines.iter().any(|l| l.len() == 4
                && l[0] == key
                && days.contains(&l[1].to_string())
                && l[2] == n
                && l[3] == n),
            "no row of {key} with {n}:\n{}",
            out.stdout
        );
    }
    assert_eq!(
        lines.iter().filter(|l| l.first() == Some(&"total")).count(),
        2,
        "a total per key:\n{}",
        out.stdout
    );
    for key in &s.keys {
        assert!(
            !out.stdout.contains(key.as_str()),
            "the table shows key names, never keys"
        );
    }

    // --since: a day is inclusive; a later day filters everything out.
    assert_eq!(usage_json(&s.config, &["--since", &days[0]]), rows);
    assert_eq!(usage_json(&s.config, &["--since", "2000-01-01"]), rows);
    assert_eq!(
        usage_json(&s.config, &["--since", "2999-12-31"]),
        Vec::new()
    );
    let out = run_cli(
        &s.config,
        &standard_env(),
        &["keys", "usage", "--since", "2999-12-31"],
    );
    assert!(out.success(), "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "no usage recorded");

    for bad in ["2025-13-01", "2025-02-30", "yesterday", "2025-1-1", ""] {
        for json in [false, true] {
            let mut args = vec!["keys", "usage", "--since", bad];
            if json {
                args.push("--json");
            }
            let out = run_cli(&s.config, &standard_env(), &args);
            let line = out.refusal_line(&format!("keys usage --since {bad:?}"));
            out.assert_one_stderr_line(&format!("keys usage --since {bad:?}"));
            assert!(
                line.contains("YYYY-MM-DD"),
                "the line says what a date is: {line}"
            );
            assert!(out.stdout.is_empty(), "nothing on stdout: {:?}", out.stdout);
        }
    }
}

#[tokio::test]
async fn enforced_billing_refuses_the_151st_paid_request_and_failures_cost_nothing() {
    let mut s = Setup::start(
        Stack::builder()
            .breaker_failures(1000)
            // 160 requests at once: no provider may be busy.
            .provider_line(PRIMARY, "max_in_flight = 1000")
            .provider_line(FALLBACK, "max_in_flight = 1000")
            .raw("[billing]\nenforce = true"),
        &["fresh", "racer"],
    )
    .await;
    let admin = admin_addr(&s.server);
    let api = s.api(0);

    for i in 0..149 {
        let a = api.get(POST).await;
        assert_eq!(a.status, 200, "paid request {}: {a:?}", i + 1);
    }
    // Every provider fails: the reserved credit is refunded.
    let failed = api.get(BROKEN_POST).await;
    failed.assert_error(502, "UPSTREAM_UNAVAILABLE");
    api.get(POST).await.assert_success(false); // the 150th paid request

    let calls = s.upstream_calls().await;
    for path in [POST, PROFILE, POSTS, COMMENTS, SEARCH, BROKEN_POST] {
        api.get(path)
            .await
            .assert_error(402, "INSUFFICIENT_CREDITS");
    }
    assert_eq!(
        s.upstream_calls().await,
        calls,
        "402 comes before any upstream call"
    );
    // Parameters are checked before credits.
    api.get("/v1/shortvideo/post?id=x")
        .await
        .assert_invalid("id");

    // Concurrent requests of another fresh key cannot overspend.
    let racer = s.api(1);
    let answers = futures_join_all((0..160).map(|_| {
        let racer = racer.clone();
        async move { racer.get(POST).await }
    }))
    .await;
    let ok = answers.iter().filter(|a| a.status == 200).count();
    let refused = answers
        .iter()
        .filter(|a| a.status == 402 && a.error_code() == "INSUFFICIENT_CREDITS")
        .count();
    assert_eq!(
        (ok, refused),
        (150, 10),
        "exactly the free credits are spent"
    );

    let m = scrape(admin).await;
    assert_eq!(
        m.sum("socialgate_credits_total", &[]),
        Some(300.0),
        "{}",
        m.text
    );
    wait_for_usage(&s.config, &[("fresh", 150), ("racer", 150)]).await;

    // Spent credits are the ledger's: a restart does not refill them.
    s.terminate();
    s.restart();
    let calls = s.upstream_calls().await;
    s.api(0)
        .get(POST)
        .await
        .assert_error(402, "INSUFFICIENT_CREDITS");
    assert_eq!(s.upstream_calls().await, calls);
}

#[tokio::test]
async fn an_abandoned_request_keeps_its_credit_reservation_and_is_not_charged() {
    let upstream = RawUpstream::slow_primary_profile(Duration::from_millis(1500));
    let stack = Stack::builder()
        .providers(&[PRIMARY])
        .search_order(None)
        .primary_url(&upstream.base_url())
        .timeout_ms(PRIMARY, 5000)
        .raw("[billing]\nenforce = true\nfree_credits = 1")
        .start()
        .await;
    let addr = stack.server.addr();

    // A key with one credit sends several requests, hanging up on each.
    for _ in 0..5 {
        let headers = [("X-API-Key", stack.key.as_str())];
        hang_up_after(addr, PROFILE, &headers, Duration::from_millis(50)).await;
    }
    // The first one's work still holds the credit.
    stack
        .get(PROFILE)
        .await
        .assert_error(402, "INSUFFICIENT_CREDITS");
    assert_eq!(upstream.in_flight(), 1, "the abandoned work still runs");
    assert_eq!(
        upstream.request_count(),
        1,
        "one upstream call for one credit"
    );

    // Once it ends the credit is refunded, not spent: it buys one answer.
    assert!(
        eventually(Duration::from_secs(5), || async {
            upstream.in_flight() == 0
        })
        .await,
        "the abandoned work ended"
    );
    // The double counts its answer sent a moment before the server reads it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stack.get(PROFILE).await.assert_success(false);
    stack
        .get(PROFILE)
        .await
        .assert_error(402, "INSUFFICIENT_CREDITS");
    assert!(
        upstream.max_in_flight() <= 1,
        "never more upstream calls at once than credits: {}",
        upstream.max_in_flight()
    );
    wait_for_usage(&stack.config, &[("e2e", 1)]).await;
}

/// Awaits every future of `futures` concurrently, in order.
async fn futures_join_all<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("a request task ends"));
    }
    out
}
