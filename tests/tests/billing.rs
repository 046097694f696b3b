//! Billing as a client and an operator see it: costs per endpoint
//! (`[billing.costs]`, a cached answer's cost, applied by a reload; what
//! `only-if-cached` holds), credit
//! packs (`socialgate credits grant` on a running server, refused for an
//! unknown name or a bad amount; `credits show`), enforcement that never
//! lets a key spend more than free credits plus grants, however many
//! requests race, `GET /v1/account` agreeing with the ledger, the
//! `X-Credits-Remaining` and `RateLimit` headers exactly where documented,
//! and grants and balances surviving a restart.

use std::time::{Duration, Instant};

use serde_json::Value;
use socialgate_tests::config::{standard_env, Config, FALLBACK, PRIMARY};
use socialgate_tests::operator::{credits_per_key, send, signal, usage_json, wait_exit};
use socialgate_tests::{eventually, run_cli, Answer, Api, CliOutput, Server, Stack, StackBuilder};

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";
const POST: &str = "/v1/shortvideo/post?id=7312345678901234567";
const COMMENTS: &str = "/v1/shortvideo/comments?id=7312345678901234567&count=3";
const SEARCH: &str = "/v1/shortvideo/search?query=luna";
const ACCOUNT: &str = "/v1/account";
/// The name of the stack's key.
const KEY: &str = "e2e";

/// A stack of `builder` whose doubles serve the contract's fixtures.
async fn serving(builder: StackBuilder) -> Stack {
    let stack = builder.start().await;
    stack.primary.serve_fixtures().await;
    stack.fallback.serve_fixtures().await;
    stack
}

fn credits(config: &Config, args: &[&str]) -> CliOutput {
    let mut all = vec!["credits"];
    all.extend_from_slice(args);
    run_cli(config, &standard_env(), &all)
}

/// `credits grant NAME AMOUNT`, which must succeed.
fn grant(config: &Config, name: &str, amount: u64) {
    let out = credits(config, &["grant", name, &amount.to_string()]);
    assert!(out.success(), "credits grant {name} {amount}: {out:?}");
}

/// `data` of `GET /v1/account`, checked to be a success costing nothing.
async fn account(api: &Api) -> Value {
    let a = api.get(ACCOUNT).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.json["success"], true, "{a:?}");
    assert!(a.json.get("platform").is_none(), "no platform: {a:?}");
    assert_eq!(a.json["meta"]["credits_used"], 0, "{a:?}");
    a.data().clone()
}

async fn remaining(api: &Api) -> u64 {
    account(api).await["credits_remaining"]
        .as_u64()
        .expect("credits_remaining is an integer")
}

/// Polls `keys usage` until `key` has `credits` in all.
async fn wait_for_credits(config: &Config, key: &str, credits: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let rows = usage_json(config, &[]);
        if credits_per_key(&rows).get(key) == Some(&credits) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "`keys usage` never showed {credits} for {key}: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `keys usage --by endpoint --json`: (endpoint, requests, credits) of `key`.
fn by_endpoint(config: &Config, key: &str) -> Vec<(String, u64, u64)> {
    let out = run_cli(
        config,
        &standard_env(),
        &["keys", "usage", "--by", "endpoint", "--json"],
    );
    assert!(out.success(), "{out:?}");
    let rows: Value = serde_json::from_str(out.stdout.trim()).expect("JSON rows");
    rows.as_array()
        .expect("an array")
        .iter()
        .filter(|r| r["key"] == key)
        .map(|r| {
            (
                r["endpoint"].as_str().expect("an endpoint").to_owned(),
                r["requests"].as_u64().expect("requests"),
                r["credits"].as_u64().expect("credits"),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_cost_of_2_on_comments_is_reported_booked_and_changed_by_a_reload() {
    let stack = serving(Stack::builder().raw("[billing.costs]\ncomments = 2")).await;
    let a = stack.get(COMMENTS).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.json["meta"]["credits_used"], 2, "{a:?}");
    stack.get(POST).await.assert_success(false);
    // Failures still cost nothing.
    let refused = stack.get("/v1/shortvideo/comments?id=x").await;
    refused.assert_invalid("id");

    wait_for_credits(&stack.config, KEY, 3).await;
    assert_eq!(
        by_endpoint(&stack.config, KEY),
        [("comments".into(), 1, 2), ("post".into(), 1, 1)],
        "the ledger books 2 for comments"
    );
    let costs = &account(&stack.api).await["costs"];
    assert_eq!(
        *costs,
        serde_json::json!({"profile": 1, "posts": 1, "post": 1, "comments": 2, "search": 1})
    );

    // A cost change applies on reload.
    let text = stack
        .config
        .text()
        .replace("comments = 2", "comments = 3\nsearch = 4");
    stack.config.rewrite(&text);
    assert!(
        eventually(Duration::from_secs(5), || async {
            account(&stack.api).await["costs"]["search"] == 4
        })
        .await,
        "the reload applied the new costs"
    );
    let a = stack.get(COMMENTS).await;
    assert_eq!(a.json["meta"]["credits_used"], 3, "{a:?}");
    let a = stack.get(SEARCH).await;
    assert_eq!(a.json["meta"]["credits_used"], 4, "{a:?}");
    wait_for_credits(&stack.config, KEY, 10).await;
}

#[tokio::test]
async fn a_cached_answer_costs_what_billing_costs_cached_says() {
    let stack = serving(Stack::builder().cache("enabled = true").raw(
        "[billing]\nenforce = true\nfree_credits = 10\n\n[billing.costs]\nprofile = 3\ncached = 1",
    ))
    .await;
    // The price of a stored answer is one a client can read beforehand.
    assert_eq!(account(&stack.api).await["cached_cost"], 1);
    let fresh = stack.get(PROFILE).await;
    assert_eq!(fresh.json["meta"]["cached"], false, "{fresh:?}");
    assert_eq!(fresh.json["meta"]["credits_used"], 3, "{fresh:?}");
    assert_eq!(fresh.header("x-credits-remaining"), Some("7"));
    let hit = stack.get(PROFILE).await;
    assert_eq!(hit.json["meta"]["cached"], true, "{hit:?}");
    assert_eq!(hit.json["meta"]["credits_used"], 1, "{hit:?}");
    assert_eq!(hit.header("x-credits-remaining"), Some("6"));
    for _ in 0..4 {
        stack.get(PROFILE).await.assert_success(false);
    }
    assert_eq!(remaining(&stack.api).await, 2);

    // 2 left: a plain request may need a fetch (3), so it is refused; one
    // that takes only a stored answer costs what that costs, 1.
    stack
        .get(PROFILE)
        .await
        .assert_error(402, "INSUFFICIENT_CREDITS");
    let only_stored = get_with_cache_control(&stack, PROFILE, "only-if-cached").await;
    only_stored.assert_success(false);
    assert_eq!(only_stored.json["meta"]["cached"], true, "{only_stored:?}");
    assert_eq!(
        only_stored.json["meta"]["credits_used"], 1,
        "{only_stored:?}"
    );
    assert_eq!(only_stored.header("x-credits-remaining"), Some("1"));
    assert_eq!(stack.primary.request_count().await, 1);
    wait_for_credits(&stack.config, KEY, 9).await;
}

/// `GET path` with the stack's key and `Cache-Control: directives`.
async fn get_with_cache_control(stack: &Stack, path: &str, directives: &str) -> Answer {
    let headers = [
        ("X-API-Key", stack.key.as_str()),
        ("Cache-Control", directives),
    ];
    send(&stack.server.base_url(), "GET", path, &headers).await
}

#[tokio::test]
async fn only_if_cached_that_can_only_be_a_504_holds_nothing() {
    let stack = serving(
        Stack::builder()
            .cache("enabled = true\n\n[cache.ttl_s]\npost = 0")
            .raw("[billing]\nenforce = true\nfree_credits = 1"),
    )
    .await;
    stack.get(PROFILE).await.assert_success(false);
    assert_eq!(remaining(&stack.api).await, 0);

    // A stored answer costs 1, which the balance no longer has.
    let refused = get_with_cache_control(&stack, PROFILE, "only-if-cached").await;
    refused.assert_error(402, "INSUFFICIENT_CREDITS");
    // Nothing can be delivered (a refusal of what is stored, a cache that
    // is off for the endpoint), so nothing is held: the answer says why.
    for (path, directives) in [
        (PROFILE, "only-if-cached, no-cache"),
        (POST, "only-if-cached"),
    ] {
        let a = get_with_cache_control(&stack, path, directives).await;
        a.assert_error(504, "NOT_CACHED");
        assert_eq!(a.json["meta"]["credits_used"], 0, "{a:?}");
    }
    assert_eq!(remaining(&stack.api).await, 0);
    assert_eq!(stack.primary.request_count().await, 1, "only the first GET");
}

#[tokio::test]
async fn a_grant_raises_the_balance_on_a_running_server() {
    let stack = serving(
        Stack::builder()
            .extra_key("other")
            .raw("[billing]\nenforce = true\nfree_credits = 1"),
    )
    .await;
    stack.get(POST).await.assert_success(false);
    stack
        .get(POST)
        .await
        .assert_error(402, "INSUFFICIENT_CREDITS");

    let out = credits(&stack.config, &["grant", KEY, "2", "--note", "order 7"]);
    assert!(out.success(), "{out:?}");
    let granted_at = Instant::now();
    assert!(
        eventually(Duration::from_secs(2), || async {
            remaining(&stack.api).await == 2
        })
        .await,
        "the grant reached the running server within 2 s"
    );
    assert!(granted_at.elapsed() < Duration::from_secs(2));
    stack.get(POST).await.assert_success(false);
    stack.get(PROFILE).await.assert_success(false);
    stack
        .get(POST)
        .await
        .assert_error(402, "INSUFFICIENT_CREDITS");
    // Another key's balance is its own.
    assert_eq!(remaining(&stack.api_with_key("other")).await, 1);

    wait_for_credits(&stack.config, KEY, 3).await;
    let out = credits(&stack.config, &["show", KEY, "--json"]);
    assert!(out.success(), "{out:?}");
    let shown: Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(shown["spent"], 3, "{shown}");
    assert_eq!(shown["granted"], 2, "{shown}");
    assert_eq!(shown["balance"], 0, "{shown}");
    assert_eq!(shown["grants"][0]["amount"], 2, "{shown}");
    assert_eq!(shown["grants"][0]["note"], "order 7", "{shown}");
    let out = credits(&stack.config, &["show", KEY]);
    assert!(out.success(), "{out:?}");
    assert!(
        out.stdout.contains("order 7") && out.stdout.contains("balance"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains(&stack.key), "never the key");
}

#[tokio::test]
async fn grants_to_unknown_names_and_bad_amounts_are_refused_in_one_line() {
    let stack = Stack::builder().start().await;
    let out = credits(&stack.config, &["grant", "nobody", "10"]);
    let line = out.refusal_line("credits grant nobody");
    out.assert_one_stderr_line("credits grant nobody");
    assert!(line.contains("nobody"), "{line}");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    for bad in ["0", "-1", "abc", "1.5", "", "+3", "99999999999999999999"] {
        let out = credits(&stack.config, &["grant", KEY, bad]);
        let what = format!("credits grant {KEY} {bad:?}");
        let line = out.refusal_line(&what);
        out.assert_one_stderr_line(&what);
        assert!(line.contains("AMOUNT"), "{what}: {line}");
        assert_eq!(out.status.code(), Some(2), "{what}: {out:?}");
    }
    let out = credits(&stack.config, &["show", "nobody"]);
    out.refusal_line("credits show nobody");
    // Nothing was granted.
    assert_eq!(remaining(&stack.api).await, 150);
}

#[tokio::test]
async fn exactly_free_plus_granted_credits_are_spent_under_concurrency() {
    let stack = serving(
        Stack::builder()
            .breaker_failures(1000)
            // 170 requests at once: no provider may be busy.
            .provider_line(PRIMARY, "max_in_flight = 1000")
            .provider_line(FALLBACK, "max_in_flight = 1000")
            .raw("[billing]\nenforce = true\nfree_credits = 150"),
    )
    .await;
    grant(&stack.config, KEY, 10);
    assert!(
        eventually(Duration::from_secs(2), || async {
            remaining(&stack.api).await == 160
        })
        .await,
        "150 free + 10 granted"
    );
    let tasks: Vec<_> = (0..170)
        .map(|_| {
            let api = stack.api.clone();
            tokio::spawn(async move { api.get(POST).await })
        })
        .collect();
    let mut answers: Vec<Answer> = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("a request task ends"));
    }
    let ok = answers.iter().filter(|a| a.status == 200).count();
    let refused = answers
        .iter()
        .filter(|a| a.status == 402 && a.error_code() == "INSUFFICIENT_CREDITS")
        .count();
    assert_eq!((ok, refused), (160, 10), "exactly 160 succeed");
    let calls = stack.primary.request_count().await + stack.fallback.request_count().await;
    stack
        .get(POST)
        .await
        .assert_error(402, "INSUFFICIENT_CREDITS");
    assert_eq!(
        stack.primary.request_count().await + stack.fallback.request_count().await,
        calls,
        "402 before any upstream call"
    );
    assert_eq!(remaining(&stack.api).await, 0);
    wait_for_credits(&stack.config, KEY, 160).await;
}

#[tokio::test]
async fn a_request_costing_more_than_the_balance_is_refused_with_nothing_spent() {
    let stack = serving(
        Stack::builder()
            .raw("[billing]\nenforce = true\nfree_credits = 3\n\n[billing.costs]\ncomments = 5"),
    )
    .await;
    let a = stack.get(COMMENTS).await;
    a.assert_error(402, "INSUFFICIENT_CREDITS");
    assert_eq!(a.header("x-credits-remaining"), Some("3"), "{a:?}");
    assert_eq!(stack.primary.request_count().await, 0, "no upstream call");
    let statement = account(&stack.api).await;
    assert_eq!(statement["credits_remaining"], 3, "none of it spent");
    assert_eq!(statement["credits_used_total"], 0);
    for left in ["2", "1", "0"] {
        let a = stack.get(POST).await;
        a.assert_success(false);
        assert_eq!(a.header("x-credits-remaining"), Some(left), "{a:?}");
    }
    stack
        .get(POST)
        .await
        .assert_error(402, "INSUFFICIENT_CREDITS");
}

#[tokio::test]
async fn the_account_matches_the_ledger_and_inactive_billing_only_reports() {
    let stack = serving(
        Stack::builder()
            .raw("[billing]\nfree_credits = 2\n\n[billing.costs]\nsearch = 2\n\n[rate_limit]\nper_second = 100\nburst = 50"),
    )
    .await;
    let fresh = account(&stack.api).await;
    assert_eq!(
        fresh,
        serde_json::json!({
            "name": KEY,
            "credits_remaining": 2,
            "credits_used_today": 0,
            "credits_used_total": 0,
            "billing_enforced": false,
            "costs": {"profile": 1, "posts": 1, "post": 1, "comments": 1, "search": 2},
            "cached_cost": null,
            "rate_limit": {"per_second": 100.0, "burst": 50.0},
        })
    );
    // Not enforced: nothing is refused, the balance is reported, never
    // below 0.
    for path in [PROFILE, POST, SEARCH, SEARCH] {
        let a = stack.get(path).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert!(a.header("x-credits-remaining").is_none(), "{a:?}");
    }
    grant(&stack.config, KEY, 10);
    wait_for_credits(&stack.config, KEY, 6).await;
    assert!(
        eventually(Duration::from_secs(2), || async {
            remaining(&stack.api).await == 6
        })
        .await,
        "2 free + 10 granted - 6 spent"
    );
    let statement = account(&stack.api).await;
    let rows = usage_json(&stack.config, &[]);
    let today: u64 = rows
        .iter()
        .filter(|r| {
            r.key == KEY
                && r.day == socialgate_tests::operator::utc_day(std::time::SystemTime::now())
        })
        .map(|r| r.credits)
        .sum();
    assert_eq!(statement["credits_used_total"], credits_per_key(&rows)[KEY]);
    assert_eq!(statement["credits_used_today"], today);
    // Asking costs nothing.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(credits_per_key(&usage_json(&stack.config, &[]))[KEY], 6);
}

#[tokio::test]
async fn standing_headers_appear_exactly_when_documented() {
    // Neither enforced billing nor a rate limit: no such header.
    let plain = serving(Stack::builder()).await;
    for path in [POST, ACCOUNT, "/v1/shortvideo/post?id=x"] {
        let a = plain.get(path).await;
        for name in ["x-credits-remaining", "ratelimit", "ratelimit-policy"] {
            assert!(a.header(name).is_none(), "{name} on {path}: {a:?}");
        }
    }
    drop(plain);

    let stack = serving(Stack::builder().raw(
        "[billing]\nenforce = true\nfree_credits = 2\n\n[rate_limit]\nper_second = 0.5\nburst = 8",
    ))
    .await;
    let policy = Some("\"default\";q=8;w=16");
    let mut expected_r = 8;
    let mut check = |a: &Answer, balance: &str| {
        expected_r -= 1;
        assert_eq!(a.header("x-credits-remaining"), Some(balance), "{a:?}");
        assert_eq!(a.header("ratelimit-policy"), policy, "{a:?}");
        let state = a.header("ratelimit").unwrap_or_else(|| panic!("{a:?}"));
        assert!(
            state.starts_with(&format!("\"default\";r={expected_r};t=")),
            "{state} after {} requests",
            8 - expected_r
        );
        let t: u64 = state.rsplit("t=").next().unwrap().parse().unwrap();
        assert!((1..=2).contains(&t), "a token every 2 s: {state}");
    };
    let a = stack.get(POST).await;
    a.assert_success(false);
    check(&a, "1");
    check(&stack.get(ACCOUNT).await, "1");
    let a = stack.get("/v1/shortvideo/post?id=x").await;
    a.assert_invalid("id");
    check(&a, "1");
    let a = stack.get("/v1/nosuchplatform/profile?username=x").await;
    a.assert_error(404, "PLATFORM_NOT_FOUND");
    check(&a, "1");
    let a = stack.get(PROFILE).await;
    a.assert_success(false);
    check(&a, "0");
    let a = stack.get(POST).await;
    a.assert_error(402, "INSUFFICIENT_CREDITS");
    check(&a, "0");
    // Without an accepted key: none.
    for key in [None, Some("sg_not_a_key")] {
        let a = stack.api.with_key(key).get(POST).await;
        assert_eq!(a.status, 401, "{a:?}");
        for name in ["x-credits-remaining", "ratelimit", "ratelimit-policy"] {
            assert!(a.header(name).is_none(), "{name} on a 401: {a:?}");
        }
    }
    let a = stack.api.with_key(None).get("/healthz").await;
    assert!(a.header("ratelimit").is_none(), "{a:?}");
    // Two tokens left: spend them, then 429 keeps Retry-After.
    stack.get(ACCOUNT).await;
    stack.get(ACCOUNT).await;
    let a = stack.get(POST).await;
    a.assert_error(429, "RATE_LIMITED");
    assert_eq!(a.header("ratelimit-policy"), policy, "{a:?}");
    let state = a.header("ratelimit").expect("RateLimit on a 429");
    let wait = a.header("retry-after").expect("Retry-After on a 429");
    assert_eq!(state, format!("\"default\";r=0;t={wait}"), "{a:?}");
    assert_eq!(a.header("x-credits-remaining"), Some("0"), "{a:?}");
}

#[tokio::test]
async fn grants_and_balances_survive_a_restart() {
    let mut stack =
        serving(Stack::builder().raw("[billing]\nenforce = true\nfree_credits = 2")).await;
    grant(&stack.config, KEY, 3);
    assert!(
        eventually(Duration::from_secs(2), || async {
            remaining(&stack.api).await == 5
        })
        .await
    );
    for _ in 0..4 {
        stack.get(POST).await.assert_success(false);
    }
    let before = account(&stack.api).await;
    assert_eq!(before["credits_remaining"], 1);

    signal(&stack.server, "TERM");
    let status = wait_exit(&mut stack.server, Duration::from_secs(10)).expect("exits");
    assert!(status.success(), "{status}");
    stack.server = Server::start_with(&stack.config, stack.env(), &[]);
    stack.api = Api::new(&stack.server.base_url(), Some(&stack.key));

    assert_eq!(account(&stack.api).await, before, "the same account");
    stack.get(POST).await.assert_success(false);
    stack
        .get(POST)
        .await
        .assert_error(402, "INSUFFICIENT_CREDITS");
}
