//! The behaviours the review fixes of cd23739 promise, against the real
//! server and the real plugins:
//!
//! - a probe whose caller hangs up still ends as a failed probe: the breaker
//!   is not re-probed by every request that follows;
//! - with every provider open, one forced probe at a time reaches the
//!   upstream, and the other requests are answered at once;
//! - an upstream that echoes our key into a field of the wrong type cannot
//!   get it into the log;
//! - a plugin's "invalid input" is the caller's error only before any
//!   upstream request; after one, and "unsupported", fail over;
//! - a parameter an endpoint does not read is ignored however often it is
//!   repeated;
//! - `socialgate check` neither opens the ledger nor prunes plugin copies;
//! - rate-limit buckets survive a reload;
//! - a changed `listen` is logged as needing a restart, and the listener
//!   stays where it was.
//!
//! (Readiness turning 503 before the listener closes is not tested here:
//! once the accept loop stops, nothing accepts a new connection whichever
//! comes first, so the order is only visible for microseconds on a held
//! connection; `operability_readiness.rs` covers what a caller can see.)

use std::path::Path;
use std::time::{Duration, Instant};

use socialgate_tests::config::{
    standard_env, ConfigBuilder, CHAOS, FALLBACK, FALLBACK_KEY, FALLBACK_KEY_ENV, PRIMARY,
    PRIMARY_KEY, PRIMARY_KEY_ENV,
};
use socialgate_tests::process::ADMIN_LISTENING_PREFIX;
use socialgate_tests::raw_upstream::{closed_port, Behaviour, RawUpstream};
use socialgate_tests::reload::{await_watching, log_lines, replace_file, wait_for_log, APPLIED};
use socialgate_tests::rig::{eventually, Rig};
use socialgate_tests::upstream::{LUNA, POST_ID};
use socialgate_tests::{paths, run_cli, Answer, Server, Stack};
use wiremock::{Request, Respond, ResponseTemplate};

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";

/// `followers` in each double's profile fixture: who answered.
const PRIMARY_FOLLOWERS: u64 = 5_479_588;
const FALLBACK_FOLLOWERS: u64 = 5_500_000;

/// A cooldown no test waits out.
const LONG_COOLDOWN_MS: u64 = 60_000;

fn assert_answered_by(a: &Answer, followers: u64, what: &str) {
    a.assert_success(false);
    assert_eq!(a.data()["followers"], followers, "{what}: {a:?}");
}

/// Waits until the server has logged a line holding every one of
/// `needles`, for at most `within`; returns it.
async fn log_line_within(server: &Server, needles: &[&str], within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let stderr = server.stderr();
        if let Some(line) = stderr
            .lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))
        {
            return line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no log line with {needles:?} within {within:?} in:\n{stderr}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---- The breaker: an abandoned probe, forced probes ----

/// The request ID of the probe whose caller gives up.
const ABANDONED_PROBE_ID: &str = "abandoned-probe-1";

/// The primary hangs until its own 4 s timeout. Before the fix, a probe
/// whose caller hung up was dropped unreported and reopened the breaker for
/// no time at all: every following request probed the hanging primary
/// again, and waited on it.
#[tokio::test]
async fn an_abandoned_probe_keeps_the_breaker_open() {
    const PRIMARY_TIMEOUT_MS: u64 = 4000;
    /// Long enough for one request after the probe's failure is logged.
    const COOLDOWN_MS: u64 = 2000;
    /// Well under the primary's timeout: an answer this fast did not wait
    /// on the primary.
    const QUICK: Duration = Duration::from_millis(PRIMARY_TIMEOUT_MS / 2);
    let hanging = RawUpstream::start(Behaviour::Silent);
    let rig = Rig::builder()
        .primary_url(&hanging.base_url())
        .timeout_ms(PRIMARY, PRIMARY_TIMEOUT_MS)
        .breaker(PRIMARY, 1, COOLDOWN_MS)
        .start()
        .await;
    rig.fallback.serve_fixtures().await;

    // One failure, by the primary's own timeout, opens the breaker.
    let a = rig.get(PROFILE).await;
    let opened = Instant::now();
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "the primary timed out");
    assert_eq!(hanging.request_count(), 1);

    // Past the cooldown the next request is the probe; its caller gives up
    // long before the primary's timeout.
    let past_cooldown = Duration::from_millis(COOLDOWN_MS + 700);
    tokio::time::sleep(past_cooldown.saturating_sub(opened.elapsed())).await;
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(500))
        .build()
        .expect("can build an HTTP client");
    let gave_up = impatient
        .get(format!("{}{PROFILE}", rig.server.base_url()))
        .header("X-API-Key", &rig.key)
        .header("X-Request-Id", ABANDONED_PROBE_ID)
        .send()
        .await;
    assert!(
        gave_up.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the probe hangs on the primary, so its caller gives up: {gave_up:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            hanging.request_count() == 2
        })
        .await,
        "the probe reached the primary"
    );

    // Within the next second: the fallback answers at once and the primary
    // is left alone, whether the abandoned probe is still out or over.
    for n in 1..=3 {
        let (a, took) = rig.timed_get(PROFILE).await;
        assert_answered_by(&a, FALLBACK_FOLLOWERS, "after the abandoned probe");
        assert!(
            took < QUICK,
            "request {n} after the abandoned probe waited on the primary: {took:?}"
        );
    }
    assert_eq!(
        hanging.request_count(),
        2,
        "no request re-probes the hanging primary"
    );

    // The abandoned probe runs to the primary's timeout and counts as a
    // failure: the breaker reopens for a whole cooldown.
    let line = log_line_within(
        &rig.server,
        &[ABANDONED_PROBE_ID, "attempt failed"],
        Duration::from_millis(PRIMARY_TIMEOUT_MS) + Duration::from_secs(6),
    )
    .await;
    assert!(line.contains(PRIMARY), "the primary's attempt: {line}");
    let (a, took) = rig.timed_get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "after the probe failed");
    assert!(took < QUICK, "no wait on the primary: {took:?}");
    assert_eq!(
        hanging.request_count(),
        2,
        "the failed probe reopened the breaker"
    );
}

/// A chain of one provider, open, its upstream hanging: each request would
/// be forced to probe it. Before the fix all six did, and each waited the
/// primary's whole timeout.
#[tokio::test]
async fn forced_probes_are_one_at_a_time() {
    const PRIMARY_TIMEOUT_MS: u64 = 5000;
    const QUICK: Duration = Duration::from_millis(PRIMARY_TIMEOUT_MS / 2);
    let hanging = RawUpstream::start(Behaviour::Silent);
    let rig = Rig::builder()
        .providers(&[PRIMARY])
        .primary_url(&hanging.base_url())
        .timeout_ms(PRIMARY, PRIMARY_TIMEOUT_MS)
        .breaker(PRIMARY, 1, LONG_COOLDOWN_MS)
        .start()
        .await;
    rig.get(PROFILE)
        .await
        .assert_error(502, "UPSTREAM_UNAVAILABLE");
    assert_eq!(hanging.request_count(), 1, "the failure that opened it");

    let started = Instant::now();
    let burst: Vec<_> = (0..6)
        .map(|_| {
            let api = rig.api.clone();
            tokio::spawn(async move {
                let a = api.get(PROFILE).await;
                (a, started.elapsed())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for request in burst {
        answers.push(request.await.expect("the request task finished"));
    }
    for (a, _) in &answers {
        a.assert_error(502, "UPSTREAM_UNAVAILABLE");
    }
    assert_eq!(
        hanging.request_count(),
        2,
        "of six requests, one probed the upstream"
    );
    answers.sort_by_key(|(_, took)| *took);
    let (_, probe_took) = answers.pop().expect("six answers");
    assert!(
        probe_took >= Duration::from_millis(PRIMARY_TIMEOUT_MS - 500),
        "the probe waited for the primary's timeout: {probe_took:?}"
    );
    for (_, took) in &answers {
        assert!(
            *took < QUICK,
            "a request that did not probe is answered at once, not after the probe: {took:?}"
        );
    }
}

// ---- Secrets echoed by an upstream ----

/// Answers with `template`, `{key}` replaced by the value of the request
/// header `header`: an upstream echoing our key back.
struct EchoKey {
    header: &'static str,
    template: &'static str,
}

impl Respond for EchoKey {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let key = request
            .headers
            .get(self.header)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("no key received");
        ResponseTemplate::new(200)
            .set_body_raw(self.template.replace("{key}", key), "application/json")
    }
}

#[tokio::test]
async fn a_key_echoed_by_an_upstream_never_reaches_the_log() {
    // Debug logging too: every line the service can write.
    let stack = Stack::builder()
        .breaker_failures(1000)
        .env("SOCIALGATE_LOG", "debug")
        .start()
        .await;
    // Two profiles per upstream: the key where a number is wanted at the
    // top of the body, and deeper, where a list or an object is wanted.
    let cases: [(&str, &str, &str); 2] = [
        (
            LUNA,
            r#"{"status_code":"{key}"}"#,
            r#"{"code":"{key}","msg":"success"}"#,
        ),
        (
            "lunaecho",
            r#"{"status_code":0,"user":{"unique_id":"lunaecho","nickname":"Echo","follower_count":1,"avatar_larger":{"url_list":"{key}"}}}"#,
            r#"{"code":0,"msg":"success","data":{"user":"{key}","stats":{}}}"#,
        ),
    ];
    for (username, primary_body, fallback_body) in cases {
        let route = stack
            .primary
            .route("/v1/user/profile", &[("unique_id", username)]);
        let echo = EchoKey {
            header: "x-api-key",
            template: primary_body,
        };
        stack.primary.respond_with(route, echo).await;
        let route = stack
            .fallback
            .route("/user/info", &[("unique_id", username)]);
        let echo = EchoKey {
            header: "x-rapidapi-key",
            template: fallback_body,
        };
        stack.fallback.respond_with(route, echo).await;
    }
    for (username, _, _) in cases {
        let a = stack
            .get(&format!("/v1/shortvideo/profile?username={username}"))
            .await;
        a.assert_error(502, "UPSTREAM_UNAVAILABLE");
        a.assert_absent_exact(PRIMARY_KEY);
        a.assert_absent_exact(FALLBACK_KEY);
    }
    assert_eq!(stack.primary.requests_to("/v1/user/profile").await.len(), 2);
    assert_eq!(stack.fallback.requests_to("/user/info").await.len(), 2);

    // Each of the four echoes was read and refused, and the log says so
    // without quoting it.
    let failed = || log_lines(&stack.server, "attempt failed").len();
    eventually(Duration::from_secs(5), || async { failed() >= 4 }).await;
    let stderr = stack.server.stderr();
    assert_eq!(failed(), 4, "each echo is a failed attempt:\n{stderr}");
    for key in [PRIMARY_KEY, FALLBACK_KEY] {
        assert!(
            !stderr.contains(key),
            "an upstream key echoed back reached the log: {key}\n{stderr}"
        );
    }
}

// ---- A plugin's invalid input ----

/// The chain `[chaos, fallback]`, chaos in `mode` opening its breaker on
/// one failure, the fallback serving its fixtures.
async fn chaos_first(mode: &str, chaos_url: Option<&str>) -> Rig {
    let mut builder = Rig::builder()
        .providers(&[CHAOS, FALLBACK])
        .chaos(mode)
        .breaker(CHAOS, 1, LONG_COOLDOWN_MS);
    if let Some(url) = chaos_url {
        builder = builder.chaos_url(url);
    }
    let rig = builder.start().await;
    rig.fallback.serve_fixtures().await;
    rig
}

#[tokio::test]
async fn a_plugins_invalid_input_before_any_request_is_the_callers_400() {
    let rig = chaos_first("invalid_input", None).await;
    // Three times, with a breaker that opens on one failure: the refusal
    // is not held against the plugin, which keeps answering.
    for path in [PROFILE, PROFILE, "/v1/shortvideo/posts?username=lunabakes"] {
        let a = rig.get(path).await;
        a.assert_invalid("username");
        assert!(
            a.error_message()
                .contains("is not allowed on this platform"),
            "the plugin's reason: {a:?}"
        );
        a.assert_absent("chaos");
    }
    assert_eq!(
        rig.fallback.request_count().await,
        0,
        "invalid input ends the chain"
    );
}

#[tokio::test]
async fn a_plugins_invalid_input_after_a_request_is_a_failure() {
    let upstream = RawUpstream::start(Behaviour::Respond {
        body: b"{}".to_vec(),
    });
    let rig = chaos_first("invalid_after_fetch", Some(&upstream.base_url())).await;
    let a = rig.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "the fallback after the refusal");
    let asked: Vec<String> = upstream.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(asked, ["/anything"], "the plugin's request came first");
    // It counted as a failure: the plugin's breaker (one failure) is open.
    let a = rig.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "chaos skipped");
    assert_eq!(upstream.request_count(), 1, "an open breaker asks nothing");
}

#[tokio::test]
async fn an_unsupported_call_fails_over() {
    let rig = chaos_first("unsupported", None).await;
    let a = rig.get(PROFILE).await;
    assert_answered_by(&a, FALLBACK_FOLLOWERS, "the fallback");
    let a = rig.get(&format!("/v1/shortvideo/post?id={POST_ID}")).await;
    a.assert_success(false);
    assert_eq!(a.data()["id"], POST_ID, "{a:?}");
    assert_eq!(rig.fallback.request_count().await, 2);
}

// ---- Parameters ----

#[tokio::test]
async fn parameters_an_endpoint_does_not_read_are_ignored_even_repeated() {
    let rig = Rig::builder().start().await;
    rig.primary.serve_fixtures().await;
    let a = rig
        .get(
            "/v1/shortvideo/profile?username=lunabakes&id=1&id=2&count=x&count=y&cursor=a&cursor=b",
        )
        .await;
    assert_answered_by(&a, PRIMARY_FOLLOWERS, "unread parameters ignored");
    let a = rig
        .get(&format!(
            "/v1/shortvideo/post?id={POST_ID}&username=a&username=b&query=q&query=r"
        ))
        .await;
    a.assert_success(false);
    assert_eq!(a.data()["id"], POST_ID, "{a:?}");
    let asked = rig.primary.request_count().await;
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
        rig.get(path).await.assert_invalid(param);
    }
    assert_eq!(
        rig.primary.request_count().await,
        asked,
        "invalid input reaches no upstream"
    );
}

// ---- `socialgate check` ----

/// The names in `dir` starting with `prefix`.
fn entries_named(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn check_opens_no_ledger_and_prunes_no_plugin_copy() {
    paths::require_plugin("shortvideo_primary");
    paths::require_plugin("shortvideo_fallback");
    let config = ConfigBuilder::new()
        .platform("shortvideo", "live", &[PRIMARY, FALLBACK])
        .provider(
            PRIMARY,
            "shortvideo_primary",
            "http://127.0.0.1:9",
            PRIMARY_KEY_ENV,
        )
        .provider(
            FALLBACK,
            "shortvideo_fallback",
            "http://127.0.0.1:9",
            FALLBACK_KEY_ENV,
        )
        .raw("[ledger]\npath = \"usage.db\"")
        .write();
    // A copy left by an earlier run, which a starting server would prune.
    let copies = config.dir().join("state").join("plugins");
    std::fs::create_dir_all(&copies).expect("can create the copies folder");
    let stale = copies.join("libstale_plugin-0123456789abcdef.so");
    std::fs::write(&stale, b"left by an earlier run").expect("can write a stale copy");

    let out = run_cli(&config, &standard_env(), &["check"]);
    assert!(out.success(), "check passes: {out:?}");
    assert!(out.stdout.contains("ok"), "{out:?}");
    assert_eq!(
        entries_named(config.dir(), "usage.db"),
        Vec::<String>::new(),
        "check creates no ledger"
    );
    assert!(stale.exists(), "check prunes no plugin copy");

    // The same config served does both: the test looked in the right place.
    let server = Server::start(&config);
    assert!(
        eventually(Duration::from_secs(10), || async {
            config.dir().join("usage.db").exists() && !stale.exists()
        })
        .await,
        "serve opens the ledger and prunes the stale copy"
    );
    drop(server);
}

// ---- Reloads ----

/// `text` with the value of the `[server]` line `listen = ...` (and only
/// that line, not `admin_listen`) replaced by `addr`.
fn with_listen(text: &str, addr: &str) -> String {
    let mut replaced = 0;
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            if line.starts_with("listen =") {
                replaced += 1;
                format!("listen = \"{addr}\"")
            } else {
                line.to_owned()
            }
        })
        .collect();
    assert_eq!(replaced, 1, "one `listen` line in:\n{text}");
    lines.join("\n") + "\n"
}

#[tokio::test]
async fn rate_limit_buckets_survive_a_reload() {
    // One token every 50 s: none comes back while the test runs.
    let rig = Rig::builder()
        .raw("[rate_limit]\nper_second = 0.02\nburst = 2")
        .start()
        .await;
    rig.primary.serve_fixtures().await;
    let applied = await_watching(&rig.server, &rig.config).await;

    for n in 1..=2 {
        let a = rig.get(PROFILE).await;
        assert_answered_by(&a, PRIMARY_FOLLOWERS, &format!("request {n} of the burst"));
    }
    let limited = rig.get(PROFILE).await;
    limited.assert_error(429, "RATE_LIMITED");
    assert!(limited.header("retry-after").is_some(), "{limited:?}");

    // An unrelated change: the primary's timeout.
    let text = rig.config.text();
    let changed = text.replacen("timeout_ms = 2000", "timeout_ms = 2500", 1);
    assert_ne!(changed, text, "the config has a timeout to change");
    replace_file(rig.config.path(), changed);
    let line = wait_for_log(&rig.server, APPLIED, applied + 1).await;
    assert!(line.contains(APPLIED), "{line}");

    let a = rig.get(PROFILE).await;
    a.assert_error(429, "RATE_LIMITED");
    assert_eq!(
        rig.primary.request_count().await,
        2,
        "only the burst reached the upstream"
    );
}

#[tokio::test]
async fn a_changed_listen_is_logged_as_needing_a_restart() {
    let rig = Rig::builder().start().await;
    rig.primary.serve_fixtures().await;
    let applied = await_watching(&rig.server, &rig.config).await;
    assert!(log_lines(&rig.server, "listen changed").is_empty());

    let elsewhere = closed_port().to_string();
    replace_file(
        rig.config.path(),
        with_listen(&rig.config.text(), &elsewhere),
    );
    wait_for_log(&rig.server, APPLIED, applied + 1).await;
    let warnings: Vec<String> = rig
        .server
        .stderr()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("listen") && l.contains("restart"))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning naming `listen` and a restart:\n{}",
        rig.server.stderr()
    );
    assert!(
        warnings[0].contains(&elsewhere),
        "it names the address asked for: {}",
        warnings[0]
    );
    assert!(
        !warnings[0].contains("admin_listen"),
        "only `listen` changed: {}",
        warnings[0]
    );

    // Still answering where it was, and never bound anew.
    let a = rig.get(PROFILE).await;
    assert_answered_by(&a, PRIMARY_FOLLOWERS, "on the original address");
    let health = rig.api.with_key(None).get("/healthz").await;
    assert_eq!(health.status, 200, "{health:?}");
    let announced: Vec<String> = rig
        .server
        .extra_stdout()
        .into_iter()
        .filter(|l| !l.starts_with(ADMIN_LISTENING_PREFIX))
        .collect();
    assert_eq!(
        announced,
        Vec::<String>::new(),
        "no new `listening on` line"
    );
}
