//! Readiness, request IDs and log lines: `/readyz` is 200 once loaded and
//! 503 `draining` after SIGTERM while a slow request finishes, 503
//! `not_ready` while the keys file cannot be read or parsed (the last good
//! keys answering meanwhile); a sane
//! `X-Request-Id` is echoed in the header and `meta.request_id` of every
//! answer (errors and public paths too) and an insane one replaced by a fresh
//! UUID v4; the ID is on every log line of its request, in the human format
//! and in JSON (`--log-format json` or `[server] log_format = "json"`), whose
//! request line names method, path, status, latency, provider, attempts and
//! the key's name, never the key.
//!
//! (Readiness turning 503 before the listener closes is not tested: once
//! the accept loop stops, nothing accepts a new connection whichever comes
//! first, so the order is only visible for microseconds on a held
//! connection; the tests here cover what a caller can see.)

use std::time::{Duration, Instant};

use serde_json::Value;
use socialgate_tests::config::{standard_env, FALLBACK, FALLBACK_KEY, PRIMARY_KEY};
use socialgate_tests::openapi::Contract;
use socialgate_tests::operator::{
    admin_addr, finish_get_on, log_line_within, scrape, send, signal, start_get_on, wait_exit,
};
use socialgate_tests::reload::{await_watching, log_lines, replace_file, wait_for_log, wait_until};
use socialgate_tests::upstream::{fixtures, json_response, LUNA};
use socialgate_tests::{issue_key, Answer, FallbackMock, PrimaryMock, Server, Stack};
use tokio::net::TcpStream;

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";

/// A request that passes the key check and then fails on its parameters, so
/// it tells an accepted key (400) from a refused one (401) with no upstream.
const AUTH_PROBE: &str = "/v1/shortvideo/profile";

/// What the server logs, at every reload, while its keys file is unusable.
const KEYS_UNUSABLE: &str = "keys file unusable";
/// The gauge that says the same: 1 usable, 0 not.
const KEYS_FILE_USABLE: &str = "socialgate_keys_file_usable";

fn is_uuid_v4(id: &str) -> bool {
    let parts: Vec<&str> = id.split('-').collect();
    parts.iter().map(|p| p.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && id
            .bytes()
            .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && parts[2].starts_with('4')
        && matches!(&parts[3][..1], "8" | "9" | "a" | "b")
}

/// Waits up to 5 s until the server's stderr has a line containing every
/// one of `needles`, and returns that line.
async fn log_line(server: &Server, needles: &[&str]) -> String {
    log_line_within(server, needles, Duration::from_secs(5)).await
}

#[tokio::test]
async fn readyz_is_200_when_loaded_and_503_while_draining_at_sigterm() {
    let mut stack = Stack::start().await;
    // Slow, but within the provider's 2 s timeout: it will succeed.
    let slow =
        json_response(&fixtures::primary_user_profile()).set_delay(Duration::from_millis(1500));
    stack
        .primary
        .respond(
            stack
                .primary
                .route("/v1/user/profile", &[("unique_id", LUNA)]),
            slow,
        )
        .await;
    let contract = Contract::load();
    let anonymous = stack.api.with_key(None);
    let ready = anonymous.get("/readyz").await;
    contract.check("GET", "/readyz", &ready);
    assert_eq!(
        (ready.status, ready.json["status"].as_str()),
        (200, Some("ready"))
    );

    // A connection accepted before the signal, in the middle of a request
    // head: graceful shutdown lets it finish that request (a connection that
    // has sent nothing yet is closed at once).
    let mut held = TcpStream::connect(stack.server.addr())
        .await
        .expect("can connect");
    start_get_on(&mut held, "/readyz").await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let api = stack.api.clone();
    let in_flight = tokio::spawn(async move { api.get(PROFILE).await });
    let deadline = Instant::now() + Duration::from_secs(5);
    while stack.primary.request_count().await == 0 {
        assert!(
            Instant::now() < deadline,
            "the slow request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let admin = admin_addr(&stack.server);
    assert!(
        TcpStream::connect(admin).await.is_ok(),
        "the admin listener is up"
    );
    signal(&stack.server, "TERM");
    log_line(&stack.server, &["shutting down"]).await;
    assert!(
        TcpStream::connect(stack.server.addr()).await.is_err(),
        "no new connection is accepted while draining"
    );
    assert!(
        TcpStream::connect(admin).await.is_err(),
        "the admin listener drains with the public one"
    );
    assert!(
        !in_flight.is_finished(),
        "the slow request is still in flight"
    );
    let draining = finish_get_on(&mut held, &[("X-Request-Id", "drain-probe-1")]).await;
    contract.check("GET", "/readyz", &draining);
    assert_eq!(draining.status, 503, "{draining:?}");
    assert_eq!(draining.json["status"], "draining", "{draining:?}");
    assert_eq!(draining.header("x-request-id"), Some("drain-probe-1"));

    let finished = in_flight.await.expect("the request task ends");
    finished.assert_success(false);
    let status = wait_exit(&mut stack.server, Duration::from_secs(10))
        .expect("the server exits once its requests are done");
    assert!(status.success(), "a graceful stop exits 0: {status}");
}

/// Sends `method path` with the stack's key (or none) and `X-Request-Id: id`
/// (or none).
async fn with_id(stack: &Stack, key: bool, method: &str, path: &str, id: Option<&str>) -> Answer {
    let mut headers = Vec::new();
    if key {
        headers.push(("X-API-Key", stack.key.as_str()));
    }
    if let Some(id) = id {
        headers.push(("X-Request-Id", id));
    }
    send(&stack.server.base_url(), method, path, &headers).await
}

#[tokio::test]
async fn request_ids_are_echoed_when_sane_and_replaced_otherwise() {
    let stack = Stack::start().await;
    stack.primary.serve_fixtures().await;
    let long_valid: String = "aZ09._:-".chars().cycle().take(128).collect();
    let too_long = "a".repeat(129);

    for id in ["trace-42:abc_DEF.1", "a", long_valid.as_str()] {
        let a = with_id(&stack, true, "GET", PROFILE, Some(id)).await;
        a.assert_success(false);
        assert_eq!(a.header("x-request-id"), Some(id), "{a:?}");
        assert_eq!(a.json["meta"]["request_id"], id, "{a:?}");
    }
    let mut generated = Vec::new();
    for id in [
        Some(too_long.as_str()),
        Some("has space"),
        Some("semi;colon"),
        Some("a/b"),
        Some(""),
        None,
    ] {
        let a = with_id(&stack, true, "GET", PROFILE, id).await;
        a.assert_success(false);
        let got = a.header("x-request-id").unwrap_or_default().to_owned();
        assert!(
            is_uuid_v4(&got),
            "{id:?} must be replaced by a UUID v4, got {got:?}"
        );
        assert_eq!(a.json["meta"]["request_id"], got.as_str(), "{a:?}");
        generated.push(got);
    }
    generated.sort();
    generated.dedup();
    assert_eq!(generated.len(), 6, "every generated ID is fresh");

    // Errors, before and after the key check, and public paths.
    let errors: [(bool, &str, &str, u16); 5] = [
        (false, "GET", PROFILE, 401),
        (true, "POST", PROFILE, 405),
        (true, "GET", "/v1/nosuchplatform/profile", 404),
        (true, "GET", "/v1/shortvideo/profile", 400),
        (true, "GET", "/nothing/here", 404),
    ];
    for (key, method, path, status) in errors {
        let a = with_id(&stack, key, method, path, Some("err-probe.7")).await;
        assert_eq!(a.status, status, "{a:?}");
        assert_eq!(a.header("x-request-id"), Some("err-probe.7"), "{a:?}");
        assert_eq!(a.json["meta"]["request_id"], "err-probe.7", "{a:?}");
        let b = with_id(&stack, key, method, path, Some("bad id")).await;
        assert!(
            is_uuid_v4(b.header("x-request-id").unwrap_or_default()),
            "{b:?}"
        );
        assert_eq!(
            b.json["meta"]["request_id"].as_str(),
            b.header("x-request-id")
        );
    }
    for path in ["/healthz", "/readyz", "/v1/openapi.json"] {
        let a = with_id(&stack, false, "GET", path, Some("public-probe")).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.header("x-request-id"), Some("public-probe"), "{path}");
        let b = with_id(&stack, false, "GET", path, None).await;
        assert!(
            is_uuid_v4(b.header("x-request-id").unwrap_or_default()),
            "{path}: {b:?}"
        );
        let c = with_id(&stack, false, "POST", path, Some("public-405")).await;
        assert_eq!(
            (c.status, c.header("x-request-id")),
            (405, Some("public-405"))
        );
    }
}

#[tokio::test]
async fn the_request_id_is_on_every_human_log_line_of_its_request() {
    let stack = Stack::builder().breaker_failures(100).start().await;
    stack.primary.fail_all(500).await;
    stack.fallback.serve_fixtures().await;

    let before = stack.server.stderr().lines().count();
    let a = with_id(&stack, true, "GET", PROFILE, Some("human-probe-1")).await;
    a.assert_success(false);
    let line = log_line(&stack.server, &["human-probe-1", "status=200"]).await;
    for field in [
        "method=GET",
        "path=\"/v1/shortvideo/profile\"",
        "status=200",
        "latency_ms=",
        &format!("provider=\"{FALLBACK}\""),
        "attempts=2",
        "key=\"e2e\"",
    ] {
        assert!(
            line.contains(field),
            "the request line lacks {field}: {line}"
        );
    }
    // Milliseconds to the microsecond, not every digit of a float.
    let latency = line
        .split("latency_ms=")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_default();
    let decimals = latency.split_once('.').map_or(0, |(_, d)| d.len());
    assert!(
        latency.parse::<f64>().is_ok() && decimals <= 3,
        "latency_ms={latency}: {line}"
    );
    // The lines the request made (its modules; a reload, say, may log in
    // between): every one carries its ID.
    let stderr = stack.server.stderr();
    let new: Vec<&str> = stderr
        .lines()
        .skip(before)
        .filter(|l| {
            [
                "socialgate::http::",
                "socialgate::chain",
                "socialgate::upstream",
            ]
            .iter()
            .any(|m| l.contains(m))
        })
        .collect();
    assert!(new.len() >= 2, "{new:#?}");
    assert!(
        new.iter().any(|l| l.contains("attempt failed")),
        "the primary's failure is logged: {new:#?}"
    );
    for l in &new {
        assert!(
            l.contains("human-probe-1"),
            "a line of the request without its ID: {l}"
        );
    }
    // An error answer logs its ID too, with no key name before the key check.
    with_id(&stack, false, "GET", PROFILE, Some("human-probe-2")).await;
    let line = log_line(&stack.server, &["human-probe-2", "status=401"]).await;
    assert!(line.contains("key=\"-\""), "{line}");
    for secret in [stack.key.as_str(), PRIMARY_KEY, FALLBACK_KEY] {
        assert!(
            !stack.server.stderr().contains(secret),
            "the log holds a secret: {secret}"
        );
    }
}

/// Starts a server whose logs are JSON, by `[server] log_format` or by the
/// command line, makes a failover request and checks its log lines.
async fn json_logs(by_flag: bool) {
    let primary = PrimaryMock::start().await;
    let fallback = FallbackMock::start().await;
    primary.fail_all(500).await;
    fallback.serve_fixtures().await;
    let mut builder = Stack::builder();
    if !by_flag {
        builder = builder.server_line("log_format = \"json\"");
    }
    let config = builder.config(&primary, &fallback).write();
    let key = issue_key(&config, "json-logs");
    let extra: &[&str] = if by_flag {
        &["--log-format", "json"]
    } else {
        &[]
    };
    let server = Server::start_with(&config, &standard_env(), extra);
    let base = server.base_url();
    let id = if by_flag {
        "json-flag-1"
    } else {
        "json-config-1"
    };
    let a = send(
        &base,
        "GET",
        PROFILE,
        &[("X-API-Key", &key), ("X-Request-Id", id)],
    )
    .await;
    a.assert_success(false);
    send(&base, "GET", PROFILE, &[("X-Request-Id", "json-401")])
        .await
        .assert_error(401, "MISSING_API_KEY");
    log_line(&server, &["json-401", "\"status\":401"]).await;

    let stderr = server.stderr();
    let mut lines = Vec::new();
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a stderr line is not JSON ({e}): {line}"));
        assert!(v.is_object(), "{line}");
        assert!(!line.contains(&key), "a log line holds the API key: {line}");
        lines.push(v);
    }
    let span_id = |v: &Value| v["span"]["id"].as_str().map(str::to_owned);
    let of_request: Vec<&Value> = lines
        .iter()
        .filter(|v| span_id(v).as_deref() == Some(id))
        .collect();
    assert!(
        of_request.iter().any(|v| v["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("attempt failed"))),
        "the failed attempt is logged with the request's ID: {stderr}"
    );
    let request = of_request
        .iter()
        .find(|v| v["fields"]["message"] == "request")
        .unwrap_or_else(|| panic!("no request line with span id {id}: {stderr}"));
    let f = &request["fields"];
    assert_eq!(f["method"], "GET", "{request}");
    assert_eq!(f["path"], "/v1/shortvideo/profile", "{request}");
    assert_eq!(f["status"], 200, "{request}");
    assert!(
        f["latency_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
        "{request}"
    );
    assert_eq!(f["provider"], FALLBACK, "{request}");
    assert_eq!(f["attempts"], 2, "{request}");
    assert_eq!(f["key"], "json-logs", "{request}");
    let unauthorized = lines
        .iter()
        .find(|v| span_id(v).as_deref() == Some("json-401") && v["fields"]["message"] == "request")
        .unwrap_or_else(|| panic!("no request line for json-401: {stderr}"));
    assert_eq!(unauthorized["fields"]["status"], 401);
    assert_eq!(unauthorized["fields"]["key"], "-");
}

#[tokio::test]
async fn json_logs_by_config_are_one_object_per_line_with_the_request_fields() {
    json_logs(false).await;
}

#[tokio::test]
async fn json_logs_by_flag_are_one_object_per_line_with_the_request_fields() {
    json_logs(true).await;
}

/// `/readyz`'s status and `status` field, checked against the contract.
async fn readiness(stack: &Stack, contract: &Contract) -> (u16, String) {
    let a = stack.api.with_key(None).get("/readyz").await;
    contract.check("GET", "/readyz", &a);
    (a.status, a.json["status"].as_str().unwrap_or("").to_owned())
}

/// Audit finding 4 (revocation failed open): a keys file that exists but
/// cannot be read or parsed turns the instance not ready and is logged as
/// an error at every reload until fixed, while the last good keys keep
/// answering (refusing every key would turn a typo into an outage). A
/// folder standing at the keys file's path is the unreadable case: its read
/// fails as a root-owned 0600 file's does for the server's user (these
/// tests run as root, which reads any file).
#[tokio::test]
async fn revocation_fails_closed_an_unusable_keys_file_turns_not_ready_while_the_last_good_keys_answer(
) {
    let stack = Stack::start().await;
    await_watching(&stack.server, &stack.config).await;
    let contract = Contract::load();
    let keys_file = stack.config.keys_file();
    let good = std::fs::read(&keys_file).expect("the stack issued a key");
    assert_eq!(readiness(&stack, &contract).await, (200, "ready".into()));

    // Unparseable: a syntax error.
    replace_file(&keys_file, b"[[key]\nname = \"e2e\"\nsha256 = ");
    wait_until("not ready with an unparseable keys file", || async {
        readiness(&stack, &contract).await == (503, "not_ready".into())
    })
    .await;
    let line = wait_for_log(&stack.server, KEYS_UNUSABLE, 1).await;
    assert!(
        line.contains("ERROR") && line.contains(&keys_file.display().to_string()),
        "an error naming the file: {line}"
    );
    stack.get(AUTH_PROBE).await.assert_invalid("username");
    let admin = admin_addr(&stack.server);
    let usable = || async { scrape(admin).await.sum(KEYS_FILE_USABLE, &[]) };
    assert_eq!(usable().await, Some(0.0), "the metric says so too");
    // Every reload says it again.
    let seen = log_lines(&stack.server, KEYS_UNUSABLE).len();
    signal(&stack.server, "HUP");
    wait_for_log(&stack.server, KEYS_UNUSABLE, seen + 1).await;
    assert_eq!(readiness(&stack, &contract).await.0, 503);

    // Fixed: ready again.
    replace_file(&keys_file, &good);
    wait_until("ready once the keys file is fixed", || async {
        readiness(&stack, &contract).await == (200, "ready".into())
    })
    .await;
    assert_eq!(usable().await, Some(1.0));
    stack.get(AUTH_PROBE).await.assert_invalid("username");

    // Unreadable: a folder where the file should be.
    std::fs::remove_file(&keys_file).expect("can remove the keys file");
    std::fs::create_dir(&keys_file).expect("can put a folder in its place");
    wait_until("not ready with an unreadable keys file", || async {
        readiness(&stack, &contract).await == (503, "not_ready".into())
    })
    .await;
    log_line(&stack.server, &[KEYS_UNUSABLE, "cannot read"]).await;
    stack.get(AUTH_PROBE).await.assert_invalid("username");
    std::fs::remove_dir(&keys_file).expect("can remove the folder");
    replace_file(&keys_file, &good);
    wait_until("ready once the keys file is back", || async {
        readiness(&stack, &contract).await == (200, "ready".into())
    })
    .await;

    // A missing keys file is no error: ready, and no key is valid.
    std::fs::remove_file(&keys_file).expect("can remove the keys file");
    wait_until("the key refused once the keys file is gone", || async {
        stack.get(AUTH_PROBE).await.status == 401
    })
    .await;
    assert_eq!(readiness(&stack, &contract).await, (200, "ready".into()));
    assert!(
        !stack.server.stderr().contains(&stack.key),
        "no key in the log"
    );
}

/// Audit finding 7: with `[server] keys_fail_closed = true`, a keys file
/// that cannot be read or parsed refuses every key (401) until a good file
/// is read, and `/readyz` names the keys file as why it is not ready.
#[tokio::test]
async fn keys_fail_closed_refuses_every_key_while_the_keys_file_is_unusable_and_readyz_says_why() {
    let stack = Stack::builder()
        .server_line("keys_fail_closed = true")
        .start()
        .await;
    await_watching(&stack.server, &stack.config).await;
    let contract = Contract::load();
    let keys_file = stack.config.keys_file();
    let good = std::fs::read(&keys_file).expect("the stack issued a key");
    stack.get(AUTH_PROBE).await.assert_invalid("username");

    replace_file(&keys_file, b"[[key]\nname = \"e2e\"\nsha256 = ");
    wait_until("not ready with an unparseable keys file", || async {
        readiness(&stack, &contract).await == (503, "not_ready".into())
    })
    .await;
    let why = stack.api.with_key(None).get("/readyz").await;
    assert_eq!(why.json["reason"], "keys_file_unusable", "{why:?}");
    stack
        .get(AUTH_PROBE)
        .await
        .assert_error(401, "INVALID_API_KEY");
    log_line(&stack.server, &[KEYS_UNUSABLE, "every key is refused"]).await;

    // A good file read again: the key answers, ready.
    replace_file(&keys_file, &good);
    wait_until("ready once the keys file is fixed", || async {
        readiness(&stack, &contract).await == (200, "ready".into())
    })
    .await;
    stack.get(AUTH_PROBE).await.assert_invalid("username");
}
