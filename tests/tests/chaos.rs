//! A plugin that panics costs one failed attempt, never the host: the
//! `chaos` test provider placed first in the chain yields the fallback's
//! answer, and the server keeps serving. A plugin that fails to set up fails
//! the start with a reason, never with a crash. A plugin stuck in a step
//! costs the request it was serving, and is then kept off the request
//! threads and out of the chain.

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use socialgate_tests::config::{CHAOS, FALLBACK};
use socialgate_tests::operator::{admin_addr, log_line_within, scrape, signal, wait_exit};
use socialgate_tests::reload::thread_count;
use socialgate_tests::{FallbackMock, PrimaryMock, Server, Stack};

/// The library file a set-up failure names.
const CHAOS_LIBRARY: &str = "libchaos_plugin";

const PATHS: [&str; 5] = [
    "/v1/shortvideo/profile?username=lunabakes",
    "/v1/shortvideo/posts?username=lunabakes",
    "/v1/shortvideo/post?id=7312345678901234567",
    "/v1/shortvideo/comments?id=7312345678901234567&count=3",
    "/v1/shortvideo/search?query=luna",
];

/// `GET path` with the stack's key, on a connection of its own (a new
/// client), in a task of its own: it may never be answered.
fn get_on_a_new_connection(
    stack: &Stack,
    path: &str,
    timeout: Duration,
) -> JoinHandle<reqwest::Result<reqwest::Response>> {
    let url = format!("{}{path}", stack.server.base_url());
    let key = stack.key.clone();
    tokio::spawn(async move {
        reqwest::Client::new()
            .get(url)
            .header("X-API-Key", key)
            .timeout(timeout)
            .send()
            .await
    })
}

/// Chaos first for every endpoint (search included), then the fallback.
async fn chaos_first(mode: &str) -> Stack {
    let stack = Stack::builder()
        .providers(&[CHAOS, FALLBACK])
        .search_order(None)
        .chaos(mode)
        // Every request reaches the panicking plugin, not a breaker.
        .breaker_failures(1000)
        .start()
        .await;
    stack.fallback.serve_fixtures().await;
    stack
}

async fn assert_fallback_answers_and_host_survives(mut stack: Stack) {
    for round in 0..3 {
        for path in PATHS {
            let a = stack.get(path).await;
            a.assert_success(
                path.contains("posts") || path.contains("comments") || path.contains("search"),
            );
            assert!(!a.data().is_null(), "round {round} {path}: {a:?}");
        }
    }
    // The fallback's own values, so the answer is not something the chaos made up.
    let a = stack.get(PATHS[0]).await;
    assert_eq!(a.data()["followers"], 5500000, "{a:?}");
    let a = stack.get(PATHS[2]).await;
    assert_eq!(a.data()["duration_ms"], 15000, "{a:?}");

    // Many at once: each panics inside the plugin, each is answered.
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let api = stack.api.clone();
            tokio::spawn(async move { api.get(PATHS[i % PATHS.len()]).await })
        })
        .collect();
    for handle in handles {
        let a = handle.await.expect("the request task finished");
        assert_eq!(a.status, 200, "{a:?}");
    }
    assert!(stack.server.is_running(), "the host is alive");
    let health = stack.api.with_key(None).get("/healthz").await;
    assert_eq!(health.status, 200);
    assert_eq!(stack.primary.request_count().await, 0, "not in the chain");
}

#[tokio::test]
async fn a_plugin_panicking_in_step_yields_the_fallbacks_answer() {
    assert_fallback_answers_and_host_survives(chaos_first("panic_in_step").await).await;
}

#[tokio::test]
async fn a_plugin_panicking_in_begin_yields_the_fallbacks_answer() {
    assert_fallback_answers_and_host_survives(chaos_first("panic_in_begin").await).await;
}

#[tokio::test]
async fn a_panicking_plugin_alone_is_502_and_the_host_keeps_serving() {
    let mut stack = Stack::builder()
        .providers(&[CHAOS])
        .search_order(None)
        .chaos("panic_in_step")
        .start()
        .await;
    for path in PATHS {
        let a = stack.get(path).await;
        a.assert_error(502, "UPSTREAM_UNAVAILABLE");
        a.assert_absent("panic");
        a.assert_absent("chaos");
    }
    assert!(stack.server.is_running(), "the host is alive");
    // A caught panic is the attempt's log line, saying where it happened,
    // and nothing else: std's own message would land in the log's stream.
    log_line_within(
        &stack.server,
        &["plugin panicked: chaos panics in step() (mode panic_in_step) (at "],
        Duration::from_secs(5),
    )
    .await;
    let stderr = stack.server.stderr();
    assert!(!stderr.contains("panicked at"), "{stderr}");
}

/// Starts a server whose chain begins with chaos in `mode`; it must refuse.
async fn start_refused(mode: &str) -> (socialgate_tests::Config, socialgate_tests::CliOutput) {
    let primary = PrimaryMock::start().await;
    let fallback = FallbackMock::start().await;
    let config = Stack::builder()
        .providers(&[CHAOS, FALLBACK])
        .chaos(mode)
        .config(&primary, &fallback)
        .write();
    match Server::try_start(&config, &socialgate_tests::config::standard_env(), &[]) {
        Ok(_) => panic!("a provider that cannot set up must fail the start ({mode})"),
        Err(out) => (config, out),
    }
}

#[tokio::test]
async fn a_provider_refusing_to_set_up_fails_the_start_with_its_reason() {
    let (config, out) = start_refused("fail_setup").await;
    let check = socialgate_tests::run_cli(
        &config,
        &socialgate_tests::config::standard_env(),
        &["check"],
    );
    for (what, out) in [("check", &check), ("serve", &out)] {
        let line = out.refusal_line(what);
        assert!(
            line.contains(CHAOS_LIBRARY),
            "{what}: names the library: {line}"
        );
        assert!(
            line.contains("chaos refuses to set up"),
            "{what}: the plugin's reason: {line}"
        );
        // What to fix is the provider's table, in this file.
        let file = config.path().display().to_string();
        assert!(
            line.contains(&format!(
                "{file}: [providers.{CHAOS}] refused by its plugin"
            )),
            "{what}: names the config and its table first: {line}"
        );
    }
    check.assert_one_stderr_line("check");
    out.assert_one_stderr_line("serve");
}

#[tokio::test]
async fn a_provider_panicking_in_set_up_fails_the_start_without_crashing() {
    let (_config, out) = start_refused("panic_on_setup").await;
    // A clean non-zero exit, not an abort; the host's reason is the last
    // line, and the plugin's copy of std prints no panic message of its own.
    assert!(!out.stderr.contains("panicked at"), "{}", out.stderr);
    let last = out.refusal_line("serve");
    assert!(
        last.contains(CHAOS_LIBRARY),
        "names the library: {}",
        out.stderr
    );
    assert!(last.contains("panic"), "says it panicked: {}", out.stderr);
}

/// A plugin stuck in `step` for ever: the request it was serving is lost,
/// but the server keeps answering the others, the provider is taken off the
/// request threads and stops being asked, and SIGTERM still ends the
/// process within its grace period.
#[tokio::test]
async fn a_plugin_stuck_in_step_stops_being_used_and_others_are_answered() {
    const CHAOS_TIMEOUT_MS: u64 = 300;
    let mut stack = Stack::builder()
        .providers(&[CHAOS, FALLBACK])
        .chaos("hang_in_step")
        .timeout_ms(CHAOS, CHAOS_TIMEOUT_MS)
        .breaker(CHAOS, 2, 600_000)
        .server_line("shutdown_grace_ms = 1000")
        .start()
        .await;
    stack.fallback.serve_fixtures().await;
    let profile = PATHS[0];
    let search = PATHS[4];

    // The first request runs the plugin's step on a request thread, where
    // it never returns.
    let stuck = get_on_a_new_connection(&stack, profile, Duration::from_secs(30));

    // Everything else is answered, while the call is stuck: many at once,
    // on the fallback-only search chain and the public paths.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let answers: Vec<_> = (0..12)
        .map(|_| {
            let api = stack.api.clone();
            tokio::spawn(async move { api.get(search).await })
        })
        .collect();
    for answer in answers {
        let a = answer.await.expect("the request task finished");
        assert_eq!(a.status, 200, "{a:?}");
    }
    let health = stack.api.with_key(None).get("/healthz").await;
    assert_eq!(health.status, 200, "{health:?}");

    // The watchdog sees the call that does not end.
    let line = log_line_within(
        &stack.server,
        &["ran past its budget", CHAOS],
        Duration::from_secs(5),
    )
    .await;
    assert!(line.contains("ERROR"), "{line}");

    // From now on its calls run off the request threads and time out; two
    // failures open its breaker, and then it is not asked at all.
    let mut took = Vec::new();
    for _ in 0..6 {
        let started = Instant::now();
        let a = stack.get(profile).await;
        took.push(started.elapsed());
        a.assert_success(false);
        assert_eq!(a.data()["followers"], 5500000, "the fallback's: {a:?}");
    }
    for (n, took) in took.iter().enumerate().skip(3) {
        assert!(
            *took < Duration::from_millis(CHAOS_TIMEOUT_MS),
            "request {n} waited on the stuck provider: {took:?}"
        );
    }
    let metrics = scrape(admin_addr(&stack.server)).await;
    assert_eq!(
        metrics.sum("socialgate_breaker_open", &[("provider", CHAOS)]),
        Some(1.0),
        "the stuck provider's breaker is open"
    );
    assert_eq!(
        metrics.sum("socialgate_provider_quarantined", &[("provider", CHAOS)]),
        Some(1.0),
        "the stuck provider is shown quarantined"
    );
    assert_eq!(
        metrics.sum("socialgate_provider_quarantined", &[("provider", FALLBACK)]),
        Some(0.0)
    );
    let ready = stack.api.with_key(None).get("/readyz").await;
    assert_eq!(ready.status, 200, "still serving: {ready:?}");
    assert_eq!(ready.json["status"], "degraded", "{ready:?}");
    assert!(!stuck.is_finished(), "the first request is still stuck");

    // Threads that can never finish do not hold the process at shutdown.
    signal(&stack.server, "TERM");
    assert!(
        wait_exit(&mut stack.server, Duration::from_secs(6)).is_some(),
        "SIGTERM ended the process despite the stuck plugin call"
    );
    stuck.abort();
}

/// Steps stuck on every worker would freeze the server: several requests
/// reaching a plugin that loops, at once and before the watchdog has seen
/// any, leave a worker free (calls run inline on all workers but one, and
/// off them at most `MAX_POOLED` of a provider at a time), so new
/// connections are answered throughout.
#[tokio::test]
async fn several_steps_stuck_at_once_never_stop_the_server_answering() {
    let stack = Stack::builder()
        .providers(&[CHAOS, FALLBACK])
        .chaos("hang_in_step")
        .timeout_ms(CHAOS, 300)
        .breaker_failures(1000)
        .start()
        .await;
    stack.fallback.serve_fixtures().await;
    // Each on a connection of its own, all at once: more than there are
    // workers and pool places.
    let stuck: Vec<_> = (0..6)
        .map(|_| get_on_a_new_connection(&stack, PATHS[0], Duration::from_secs(30)))
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    for round in 0..10 {
        let answer = get_on_a_new_connection(&stack, PATHS[4], Duration::from_secs(5))
            .await
            .expect("the request task finished")
            .unwrap_or_else(|e| panic!("round {round}: not answered: {e}"));
        assert_eq!(answer.status(), 200, "round {round}: {answer:?}");
    }
    let health = stack.api.with_key(None).get("/healthz").await;
    assert_eq!(health.status, 200, "{health:?}");
    for request in stuck {
        request.abort();
    }
}

/// Audit finding 5: a plugin stuck in a step must not make the host leak a
/// thread per request. Once its first call is seen stuck, its calls run at
/// most `MAX_POOLED` (2) at a time off the request threads, and each waits
/// for a slot within its attempt's timeout; so however many requests ask
/// it, the threads its code holds stay bounded, and every request is still
/// answered by the fallback.
#[tokio::test]
async fn a_plugin_stuck_in_a_step_holds_a_bounded_number_of_threads() {
    let stack = Stack::builder()
        .providers(&[CHAOS, FALLBACK])
        .chaos("hang_in_step")
        .timeout_ms(CHAOS, 200)
        // Never skipped by its breaker: every request asks the stuck plugin.
        .breaker_failures(1000)
        .start()
        .await;
    stack.fallback.serve_fixtures().await;
    let search = PATHS[4];
    for _ in 0..3 {
        assert_eq!(stack.get(search).await.status, 200);
    }
    // The first call runs inline and never returns: that request is lost,
    // and the watchdog quarantines the provider a budget (1 s) later.
    let first = {
        let api = stack.api.clone();
        tokio::spawn(async move { api.get(PATHS[0]).await })
    };
    log_line_within(
        &stack.server,
        &["ran past its budget", CHAOS],
        Duration::from_secs(5),
    )
    .await;
    let pid = stack.server.pid();
    let before = threads_of(pid);
    let baseline = before.len();

    for round in 0..15 {
        let a = stack.get(PATHS[0]).await;
        assert_eq!(a.status, 200, "round {round}: {a:?}");
        assert_eq!(a.data()["followers"], 5500000, "the fallback's: {a:?}");
    }
    // Two in the quarantine pool, and a little room for the runtime's own
    // idle blocking threads.
    let now = threads_of(pid);
    let after = now.len();
    assert!(
        after <= baseline + 2 + 2,
        "15 calls into a stuck plugin grew the threads from {baseline} to {after}"
    );
    assert!(
        now.keys().any(|tid| !before.contains_key(tid)),
        "no thread started for the quarantined calls: {now:?}"
    );
    first.abort();
}

/// Healthy plugins under load: a call that finds every inline slot taken
/// waits for one, so no thread is started for a plugin call. (Each such call once ran on a
/// blocking-pool thread: hundreds of threads under a heavy load, and
/// hundreds of MiB held after it.)
#[tokio::test]
async fn healthy_plugins_under_load_start_no_threads_for_their_calls() {
    let stack = Stack::builder().start().await;
    stack.primary.serve_fixtures().await;
    let pid = stack.server.pid();
    assert_eq!(stack.get(PATHS[0]).await.status, 200);
    let before = thread_count(pid);

    const CLIENTS: usize = 48;
    const EACH: usize = 25;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let api = stack.api.clone();
            tokio::spawn(async move {
                for _ in 0..EACH {
                    let a = api.get(PATHS[0]).await;
                    assert_eq!(a.status, 200, "{a:?}");
                }
            })
        })
        .collect();
    for client in clients {
        client.await.expect("the client finished");
    }
    // A blocking-pool thread lives on for 10 s after its last call: any
    // started for the load is still there. (Room for two: a call that
    // waits 50 ms for holders a busy machine does not run goes there.)
    let after = thread_count(pid);
    assert!(
        after <= before + 2,
        "{} requests, {CLIENTS} at a time, grew the threads from {before} to {after}",
        CLIENTS * EACH
    );
}

/// Each of `pid`'s threads, by its id, with its name.
fn threads_of(pid: u32) -> std::collections::BTreeMap<u32, String> {
    let mut threads = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap();
        let tid = task.file_name().unwrap().to_string_lossy().parse().unwrap();
        threads.insert(tid, name.trim().to_owned());
    }
    threads
}

/// Audit finding 7: a plugin that follows an upstream-supplied link would
/// send its provider's key wherever the link points. The host refuses any
/// request outside the provider's `base_url` origin: a failed attempt of
/// kind `bad_response`, logged, and the next provider answers.
#[tokio::test]
async fn the_host_trusts_no_plugin_request_outside_its_base_url_origin() {
    let home = FallbackMock::start().await;
    let elsewhere = FallbackMock::start().await;
    elsewhere.serve_fixtures().await;
    let stack = Stack::builder()
        .providers(&[CHAOS, FALLBACK])
        .search_order(None)
        .chaos("fetch_target")
        .chaos_url(&home.base_url())
        // Same host, another port: another origin.
        .chaos_target(&format!(
            "{}/user/info?unique_id=lunabakes",
            elsewhere.base_url()
        ))
        .breaker_failures(1000)
        .start()
        .await;
    stack.fallback.serve_fixtures().await;

    for _ in 0..3 {
        let a = stack.get(PATHS[0]).await;
        assert_eq!(
            a.data()["followers"],
            5500000,
            "the fallback answers: {a:?}"
        );
    }
    assert_eq!(
        elsewhere.request_count().await,
        0,
        "nothing left the origin"
    );
    assert_eq!(home.request_count().await, 0);
    let line = log_line_within(
        &stack.server,
        &["outside its provider's base_url origin"],
        Duration::from_secs(5),
    )
    .await;
    assert!(line.contains("bad_response"), "{line}");
    assert!(
        !line.contains(&elsewhere.base_url()),
        "the URL is not quoted: {line}"
    );
}
