//! The command line: `keys issue/list/revoke` (concurrent runs lose no
//! update; the keys file keeps its owner, group and mode; its temporary
//! file is never written through a planted link); a keys file with a
//! record `keys issue` could not have written refused whole, by `serve`,
//! `check`, `keys list` and a running server alike; `keys import` checking
//! the whole file and importing all or nothing; `keys usage` refusing a bad
//! `--since` as a usage error (exit 2); `check`, which touches
//! nothing a running server owns (no ledger, no pruning of plugin copies);
//! `serve` refusing a bad config, a failing plugin or a busy port with
//! one stderr line that says which file and why; and `demo` runs, each in
//! its own folder (several at once, none seeing another's config, keys or
//! usage), removed at exit or, after a crash, at the next start.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use socialgate_tests::api::with_cursor;
use socialgate_tests::config::{
    standard_env, toml_str, ConfigBuilder, FALLBACK_KEY, PRIMARY, PRIMARY_KEY, PRIMARY_KEY_ENV,
};
use socialgate_tests::operator::{admin_addr, scrape, send};
use socialgate_tests::process::PROCESS_TIMEOUT;
use socialgate_tests::redis::{RedisServer, REDIS_URL_ENV};
use socialgate_tests::reload::{await_watching, replace_file, wait_for_log, wait_until};
use socialgate_tests::{
    eventually, issue_key, paths, run_cli, run_cli_after, Api, CliOutput, Config, Server,
};

/// A request that passes the key check and then fails on its parameters,
/// so it tells an accepted key (400) from a refused one (401) without any
/// upstream.
const AUTH_PROBE: &str = "/v1/shortvideo/profile";

async fn assert_key_accepted(server: &Server, key: &str) {
    let a = Api::new(&server.base_url(), Some(key))
        .get(AUTH_PROBE)
        .await;
    a.assert_invalid("username");
}

async fn assert_key_refused(server: &Server, key: &str) {
    let a = Api::new(&server.base_url(), Some(key))
        .get(AUTH_PROBE)
        .await;
    a.assert_error(401, "INVALID_API_KEY");
}

fn keys(config: &Config, args: &[&str]) -> CliOutput {
    let mut all = vec!["keys"];
    all.extend_from_slice(args);
    run_cli(config, &standard_env(), &all)
}

#[tokio::test]
async fn keys_are_issued_listed_and_revoked() {
    let config = ConfigBuilder::unreached().write();
    let alice = issue_key(&config, "alice");
    let bob = issue_key(&config, "bob");
    assert_ne!(alice, bob);
    assert!(
        alice.starts_with("sg_") && alice.len() == 46,
        "`sg_` and 256 random bits: {alice}"
    );

    let stored = std::fs::read_to_string(config.keys_file()).expect("keys_file was written");
    assert!(
        !stored.contains(&alice) && !stored.contains(&bob),
        "only hashes are stored"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(config.keys_file())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "keys_file is private");
    }

    let list = keys(&config, &["list"]);
    assert!(list.success(), "{list:?}");
    assert!(
        list.stdout.contains("alice") && list.stdout.contains("bob"),
        "{list:?}"
    );
    assert!(!list.stdout.contains(&alice), "list never shows a key");
    let list = keys(&config, &["list", "--json"]);
    assert!(list.success(), "{list:?}");
    let json: serde_json::Value =
        serde_json::from_str(&list.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {list:?}"));
    let text = json.to_string();
    assert!(
        text.contains("\"alice\"") && text.contains("\"bob\""),
        "{text}"
    );
    assert!(
        !text.contains(&alice) && !text.contains(&bob),
        "list never shows a key"
    );

    let server = Server::start(&config);
    assert_key_accepted(&server, &alice).await;
    assert_key_accepted(&server, &bob).await;
    drop(server);

    let revoke = keys(&config, &["revoke", "bob"]);
    assert!(revoke.success(), "{revoke:?}");
    let server = Server::start(&config);
    assert_key_refused(&server, &bob).await;
    assert_key_accepted(&server, &alice).await;
}

#[tokio::test]
async fn a_duplicate_name_or_an_unknown_revoke_fails() {
    let config = ConfigBuilder::unreached().write();
    let alice = issue_key(&config, "alice");
    let before = std::fs::read_to_string(config.keys_file()).unwrap();

    let dup = keys(&config, &["issue", "--name", "alice"]);
    assert!(!dup.success(), "a duplicate name must fail: {dup:?}");
    assert!(dup.stdout.trim().is_empty(), "no key is printed: {dup:?}");
    assert!(!dup.stderr.trim().is_empty(), "says why: {dup:?}");

    let unknown = keys(&config, &["revoke", "carol"]);
    assert!(!unknown.success(), "an unknown name must fail: {unknown:?}");
    assert!(!unknown.stderr.trim().is_empty(), "says why: {unknown:?}");

    let after = std::fs::read_to_string(config.keys_file()).unwrap();
    assert_eq!(before, after, "failed commands change nothing");
    let server = Server::start(&config);
    assert_key_accepted(&server, &alice).await;
}

/// Operator QA sweep: halfway through an edit of another section, a
/// leaked key can still be revoked; the command says what is wrong.
#[test]
fn keys_commands_work_while_another_section_is_broken() {
    let config = ConfigBuilder::unreached().write();
    issue_key(&config, "gina");
    let good = std::fs::read_to_string(config.path()).unwrap();
    std::fs::write(
        config.path(),
        format!("{good}\n[platforms.later]\nstatus = 5\n"),
    )
    .unwrap();
    let revoked = keys(&config, &["revoke", "gina"]);
    assert!(revoked.success(), "{revoked:?}");
    assert!(
        revoked.stderr.contains("warning:") && revoked.stderr.contains("platforms.toml:"),
        "says what is wrong elsewhere: {revoked:?}"
    );
    assert!(key_names(&config).is_empty(), "revoked");
    let check = run_cli(&config, &standard_env(), &["check"]);
    assert!(!check.success(), "the server would refuse it: {check:?}");
}

/// Operator QA sweep: a typo in `[ledger] path` must not pass for "no
/// usage": a new ledger is said at start, and `keys usage` and `credits
/// show` (which would print a full, unspent balance) say when they find
/// none.
#[tokio::test]
async fn a_missing_ledger_is_said_not_taken_for_no_usage() {
    let config = ConfigBuilder::unreached()
        .raw("[ledger]\npath = \"usage.db\"")
        .write();
    issue_key(&config, "gina");
    let usage = keys(&config, &["usage"]);
    assert!(usage.success(), "{usage:?}");
    assert_eq!(usage.stdout.trim(), "no usage recorded");
    assert!(usage.stderr.contains("no usage ledger at "), "{usage:?}");
    let show = run_cli(&config, &standard_env(), &["credits", "show", "gina"]);
    assert!(show.success(), "{show:?}");
    assert!(show.stderr.contains("no usage ledger at "), "{show:?}");

    let server = Server::start(&config);
    let line = socialgate_tests::operator::log_line_within(
        &server,
        &["no usage ledger was there", "a new, empty one was created"],
        Duration::from_secs(5),
    )
    .await;
    assert!(line.contains("usage.db"), "names the path: {line}");
    drop(server);
    let server = Server::start(&config);
    socialgate_tests::operator::log_line_within(
        &server,
        &["usage ledger opened"],
        Duration::from_secs(5),
    )
    .await;
    let usage = keys(&config, &["usage"]);
    assert!(!usage.stderr.contains("no usage ledger"), "{usage:?}");
    let show = run_cli(&config, &standard_env(), &["credits", "show", "gina"]);
    assert!(!show.stderr.contains("no usage ledger"), "{show:?}");
}

#[tokio::test]
async fn without_a_keys_file_no_key_is_valid() {
    let config = ConfigBuilder::unreached().write();
    assert!(!config.keys_file().exists());
    let server = Server::start(&config);
    assert_key_refused(&server, "sg_anything").await;
    let a = Api::new(&server.base_url(), None).get(AUTH_PROBE).await;
    a.assert_error(401, "MISSING_API_KEY");
}

/// A `[[key]]` record with `sha256` as given, appended to a keys file that
/// ends in a newline: its name is on the file's line count + 3.
fn key_record(name: &str, sha256: &str) -> String {
    format!(
        "\n[[key]]\nname = {}\nsha256 = {}\ncreated = \"2026-01-02T03:04:05Z\"\n",
        toml_str(name),
        toml_str(sha256)
    )
}

/// The `sha256` of the key named `name` in a keys file's `text`.
fn stored_sha256(text: &str, name: &str) -> String {
    let mut lines = text.lines();
    let wanted = format!("name = {}", toml_str(name));
    lines
        .by_ref()
        .find(|l| l.trim() == wanted)
        .unwrap_or_else(|| panic!("no key {name} in:\n{text}"));
    let line = lines.next().expect("the sha256 line follows the name");
    line.trim()
        .strip_prefix("sha256 = \"")
        .and_then(|l| l.strip_suffix('"'))
        .unwrap_or_else(|| panic!("not a sha256 line: {line}"))
        .to_owned()
}

/// A name built to fake a log line of its own if printed raw.
const FAKED: &str = "evil\n2026-01-01T00:00:00Z ERROR socialgate: all is well";

/// Operator review, defect 1: a hand-edited keys file with a record that
/// `keys issue` could not have written (one key under two names, a hash
/// that can never match, a name outside the rule) was taken silently. It
/// is refused whole, as a syntax error is: `serve` and `check` do not
/// start on it, `keys list` says which line and why, and a running server
/// turns not ready (and its gauge 0) while the last good keys answer, each
/// under its own name. No message shows a hash or prints a name's newline.
#[tokio::test]
async fn a_keys_file_with_a_record_keys_issue_could_not_write_is_refused_whole() {
    let config = ConfigBuilder::unreached().write();
    let alice = issue_key(&config, "alice");
    let keys_file = config.keys_file();
    let good = std::fs::read_to_string(&keys_file).expect("keys_file was written");
    assert!(good.ends_with('\n'), "{good:?}");
    let alice_sha = stored_sha256(&good, "alice");
    let other = "ab".repeat(32);
    let at = format!("line {}", good.lines().count() + 3);
    let broken = [
        (
            "one key under two names",
            key_record("alice2", &alice_sha),
            "`alice2`",
        ),
        (
            "a sha256 that is not 64 hex digits",
            key_record("bob", &format!("XYZ{}", &other[3..])),
            "`bob`",
        ),
        (
            "a name with a space",
            key_record("bob smith", &other),
            "`bob smith`",
        ),
        (
            // Operator review, defect 7: a syntax error names its line too.
            "a syntax error",
            "\n[[key]]\nname = \"bob\" oops\n".to_owned(),
            "not a keys file",
        ),
        (
            "a name with a newline",
            key_record(FAKED, &other),
            "`evil\\n2026-01-01T00:00:00Z ERROR",
        ),
    ];
    for (what, record, shown) in &broken {
        replace_file(&keys_file, format!("{good}{record}"));
        let list = keys(&config, &["list"]);
        let line = list.refusal_line(what);
        list.assert_one_stderr_line(what);
        for word in ["keys.toml", &at, shown] {
            assert!(line.contains(word), "{what}: names {word:?}: {line}");
        }
        assert!(!list.stderr.contains(&alice_sha), "{what}: shows no hash");
        assert!(list.stdout.is_empty(), "{what}: lists nothing: {list:?}");
    }
    // The last one (a newline) fails a start, one line naming where.
    assert_refused(&config, &standard_env(), "keys.toml", &[&at, "evil\\n2026"]);

    replace_file(&keys_file, &good);
    let server = Server::start(&config);
    await_watching(&server, &config).await;
    let admin = admin_addr(&server);
    let base = server.base_url();
    let state = || async {
        let ready = send(&base, "GET", "/readyz", &[]).await.status;
        let usable = scrape(admin).await.sum("socialgate_keys_file_usable", &[]);
        (ready, usable)
    };
    assert_eq!(state().await, (200, Some(1.0)));
    let account = Api::new(&base, Some(&alice));
    for (i, (what, record, _)) in broken.iter().enumerate() {
        replace_file(&keys_file, format!("{good}{record}"));
        wait_until(&format!("not ready with {what}"), || async {
            state().await == (503, Some(0.0))
        })
        .await;
        let logged = wait_for_log(&server, "keys file unusable", i + 1).await;
        assert!(
            logged.contains("ERROR") && logged.contains(&at),
            "{what}: an error naming the line: {logged}"
        );
        assert!(
            logged.contains("last_good_keys="),
            "{what}: says the count is the last good file's: {logged}"
        );
        let me = account.get("/v1/account").await;
        assert_eq!(me.status, 200, "{what}: the last good keys answer: {me:?}");
        assert_eq!(me.data()["name"], "alice", "{what}: under their own name");
        replace_file(&keys_file, &good);
        wait_until(&format!("ready once {what} is mended"), || async {
            state().await == (200, Some(1.0))
        })
        .await;
    }
    let log = server.stderr();
    assert!(
        !log.lines()
            .any(|l| l.starts_with("2026-01-01T00:00:00Z ERROR socialgate: all is well")),
        "a name's newline never makes a log line:\n{log}"
    );
    assert!(!log.contains(&alice_sha), "no hash in the log");
}

/// A name outside the rule is `keys issue` used wrongly: exit 2, one line
/// saying what a name is, no key printed and no keys file written.
#[test]
fn keys_issue_refuses_a_bad_name_as_a_usage_error() {
    let config = ConfigBuilder::unreached().write();
    let before = std::fs::read_to_string(config.keys_file()).ok();
    for bad in ["bad name", "", "a/b", "evil\nline", &"x".repeat(65)] {
        let out = keys(&config, &["issue", &format!("--name={bad}")]);
        let what = format!("keys issue --name {bad:?}");
        let line = out.refusal_line(&what);
        out.assert_one_stderr_line(&what);
        assert_eq!(out.status.code(), Some(2), "{what}: {out:?}");
        assert!(line.contains("1-64 of"), "{what}: {line}");
        assert!(out.stdout.is_empty(), "{what}: {out:?}");
    }
    let after = std::fs::read_to_string(config.keys_file()).ok();
    assert_eq!(before, after, "no keys file was written");
    assert!(keys(&config, &["issue", "--name", "good.name-1"]).success());
    // Operator sweep: the other commands naming a key said so with exit 1.
    for args in [
        &["keys", "revoke", "bad name"][..],
        &["credits", "grant", "bad name", "5"],
        &["credits", "show", "bad name"],
    ] {
        let out = run_cli(&config, &standard_env(), args);
        let what = args.join(" ");
        out.assert_one_stderr_line(&what);
        assert_eq!(out.status.code(), Some(2), "{what}: {out:?}");
        assert!(
            out.refusal_line(&what).contains("1-64 of"),
            "{what}: {out:?}"
        );
    }
}

/// Operator sweep: with stdout full, `keys issue` failed yet kept the key
/// nobody saw, and its name was taken.
#[test]
fn a_key_that_cannot_be_printed_is_not_kept() {
    let config = ConfigBuilder::unreached().write();
    let out = run_cli_after(
        &config,
        &standard_env(),
        Some("exec >/dev/full"),
        &["keys", "issue", "--name", "alice"],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("it was not kept"), "{out:?}");
    assert_eq!(key_names(&config), Vec::<String>::new());
    assert!(
        keys(&config, &["issue", "--name", "alice"]).success(),
        "the name is free"
    );
}

/// Second reading: a `[ledger] path` that `check` refuses must not stop
/// the key commands, which revoke a leaked key mid-edit.
#[test]
fn a_bad_ledger_path_leaves_the_key_commands_working() {
    let config = ConfigBuilder::unreached()
        .raw("[ledger]\npath = \"\"")
        .write();
    assert!(!run_cli(&config, &standard_env(), &["check"]).success());
    assert!(keys(&config, &["issue", "--name", "alice"]).success());
    assert!(keys(&config, &["revoke", "alice"]).success());
}

/// Operator QA sweep: `demo` writes its own config; a `--config` given to
/// it is a usage error, not silently ignored (the harness passes one).
#[test]
fn demo_refuses_a_config_it_would_ignore() {
    let out = run_cli(
        &ConfigBuilder::unreached().write(),
        &standard_env(),
        &["demo"],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("drop --config"), "{out:?}");
}

/// Operator review, defect 3: a bad `--since` day is the command used
/// wrongly, as a bad `AMOUNT` is: exit 2 and one line saying what a day
/// is, whatever else the command is asked.
#[test]
fn keys_usage_refuses_a_bad_day_as_a_usage_error() {
    let config = ConfigBuilder::unreached().write();
    for bad in ["2026-13-45", "2025-02-30", "yesterday", "2025-1-1", ""] {
        for extra in [&[][..], &["--json"], &["--by", "endpoint"]] {
            let mut args = vec!["usage", "--since", bad];
            args.extend_from_slice(extra);
            let what = format!("keys {}", args.join(" "));
            let out = keys(&config, &args);
            let line = out.refusal_line(&what);
            out.assert_one_stderr_line(&what);
            assert_eq!(out.status.code(), Some(2), "{what}: {out:?}");
            assert!(line.contains("YYYY-MM-DD"), "{what}: {line}");
            assert!(out.stdout.is_empty(), "{what}: {out:?}");
        }
    }
    let out = keys(&config, &["usage", "--since", "2026-01-31"]);
    assert!(out.success(), "a good day: {out:?}");
}

/// The variable the shared-store config below reads its cursor key from.
const CURSOR_KEY_ENV: &str = "SG_TEST_IMPORT_CURSOR_KEY";

/// Operator review, defect 2: `keys import` copied the records before a
/// bad one and stopped there, without saying what it had copied. It checks
/// the whole file first (every rule the server's loader has), and a key
/// already in the store under another name, then writes all or nothing,
/// naming each key imported or skipped. Also: `keys list` on the store
/// escapes what no command wrote, and a bad `--since` there is exit 2 too.
#[test]
fn keys_import_checks_the_whole_file_and_imports_all_or_nothing() {
    let redis = RedisServer::start();
    let mut env = standard_env();
    env.push((REDIS_URL_ENV.into(), redis.url()));
    env.push((
        CURSOR_KEY_ENV.into(),
        "an-import-test-cursor-key-0123456789".into(),
    ));
    let config = ConfigBuilder::unreached()
        .server_line(&format!("cursor_key_env = \"{CURSOR_KEY_ENV}\""))
        .raw(&format!(
            "[state]\nbackend = \"redis\"\nurl_env = \"{REDIS_URL_ENV}\""
        ))
        .write();
    let shared = |args: &[&str]| {
        let mut all = vec!["keys"];
        all.extend_from_slice(args);
        run_cli(&config, &env, &all)
    };
    let listed = || listed_names(&shared(&["list", "--json"]));

    let local = ConfigBuilder::unreached().write();
    for name in ["alice", ".dot", "-dash"] {
        let out = keys(&local, &["issue", &format!("--name={name}")]);
        assert!(out.success(), "{out:?}");
    }
    // `keys export` is for the shared store: a keys file is its own record.
    let out = keys(&local, &["export", "--to", "copy.toml"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        out.refusal_line("export without a store")
            .contains("it needs [state] backend = \"redis\""),
        "{out:?}"
    );
    let from = local.keys_file();
    let from_arg = from.to_str().expect("a UTF-8 path");
    let good = std::fs::read_to_string(&from).expect("keys_file was written");
    let alice_sha = stored_sha256(&good, "alice");
    let other = "ab".repeat(32);

    // One bad name after three good ones: nothing imported, and why.
    replace_file(&from, format!("{good}{}", key_record("bob smith", &other)));
    let out = shared(&["import", "--from", from_arg]);
    let line = out.refusal_line("a bad name");
    out.assert_one_stderr_line("a bad name");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let at = format!("line {}", good.lines().count() + 3);
    for word in ["nothing imported", "`bob smith`", &at] {
        assert!(line.contains(word), "names {word:?}: {line}");
    }
    assert!(out.stdout.is_empty(), "{out:?}");
    assert_eq!(listed(), Vec::<String>::new(), "nothing was copied");

    // The good file: every key, each named.
    replace_file(&from, &good);
    let out = shared(&["import", "--from", from_arg]);
    assert!(out.success(), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "imported alice",
            "imported .dot",
            "imported -dash",
            "imported 3 of 3 keys"
        ],
        "{out:?}"
    );
    assert_eq!(listed(), ["-dash", ".dot", "alice"]);

    // A new name for a key the store has: nothing imported, carol neither.
    replace_file(
        &from,
        format!(
            "{good}{}{}",
            key_record("carol", &other),
            key_record("alice2", &alice_sha)
        ),
    );
    let out = shared(&["import", "--from", from_arg]);
    let line = out.refusal_line("a known key under a new name");
    out.assert_one_stderr_line("a known key under a new name");
    for word in ["nothing imported", "`alice2`", "`alice`"] {
        assert!(line.contains(word), "names {word:?}: {line}");
    }
    assert!(!line.contains(&alice_sha), "shows no hash: {line}");
    assert_eq!(listed(), ["-dash", ".dot", "alice"]);

    // Again: every name is there, so every one is skipped.
    replace_file(&from, &good);
    let out = shared(&["import", "--from", from_arg]);
    assert!(out.success(), "{out:?}");
    assert!(
        out.stdout.contains("skipped alice: ") && out.stdout.contains("imported 0 of 3 keys"),
        "{out:?}"
    );

    // A record no command wrote, put in the store by hand: listed escaped.
    redis.command(&[
        "HSET",
        "socialgate:keys",
        FAKED,
        &format!("{other} 2026-01-01T00:00:00Z"),
    ]);
    let out = shared(&["list"]);
    assert!(out.success(), "{out:?}");
    assert_eq!(out.stdout.lines().count(), 4, "one line a key: {out:?}");
    assert!(out.stdout.contains("evil\\n2026"), "{out:?}");

    let out = shared(&["usage", "--since", "2026-13-45"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    // Operator review, defect 4: a file that is not there imports nothing
    // and says so.
    let out = shared(&["import", "--from", "/nonexistent/keys.toml"]);
    let line = out.refusal_line("import of a missing file");
    out.assert_one_stderr_line("import of a missing file");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(line.contains("/nonexistent/keys.toml"), "{line}");

    // Operator review, defect 6: with the store away, one line, the
    // command's own (no log line of the store's health beside it).
    let mut away = env.clone();
    away.retain(|(name, _)| name != REDIS_URL_ENV);
    away.push((REDIS_URL_ENV.into(), "redis://127.0.0.1:9".into()));
    for args in [&["list"][..], &["issue", "--name", "zed"], &["usage"]] {
        let mut all = vec!["keys"];
        all.extend_from_slice(args);
        let out = run_cli(&config, &away, &all);
        out.assert_one_stderr_line(&format!("keys {args:?} with the store away"));
        assert_eq!(out.status.code(), Some(1), "{out:?}");
    }

    // Operator review, defect 3: nothing to show is not a store failure.
    for args in [
        &["usage"][..],
        &["usage", "--json"],
        &["usage", "--since", "2099-01-01", "--by", "endpoint"],
    ] {
        let out = shared(args);
        assert!(out.success(), "keys {args:?}: {out:?}");
        assert!(out.stderr.is_empty(), "keys {args:?}: {out:?}");
    }
}

/// The names in the keys file, sorted.
fn key_names(config: &Config) -> Vec<String> {
    listed_names(&keys(config, &["list", "--json"]))
}

/// The names a successful `keys list --json` printed, sorted.
fn listed_names(list: &CliOutput) -> Vec<String> {
    assert!(list.success(), "{list:?}");
    let json: serde_json::Value =
        serde_json::from_str(&list.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {list:?}"));
    let mut names: Vec<String> = json
        .as_array()
        .expect("a list")
        .iter()
        .map(|k| k["name"].as_str().expect("a name").to_owned())
        .collect();
    names.sort();
    names
}

/// Audit finding 4: `keys issue` and `keys revoke` run at the same time
/// lose no update (each holds the keys file's lock from its read to its
/// rename). Three rounds of ten issues and five revokes at once.
#[test]
fn revocation_fails_closed_concurrent_issues_and_revokes_lose_no_update() {
    let config = ConfigBuilder::unreached().write();
    let mut expected = Vec::new();
    for round in 0..3 {
        let doomed: Vec<String> = (0..5).map(|i| format!("old-{round}-{i}")).collect();
        for name in &doomed {
            issue_key(&config, name);
        }
        let fresh: Vec<String> = (0..10).map(|i| format!("new-{round}-{i}")).collect();
        std::thread::scope(|scope| {
            let mut runs = Vec::new();
            for name in &fresh {
                let config = &config;
                runs.push(scope.spawn(move || keys(config, &["issue", "--name", name])));
            }
            for name in &doomed {
                let config = &config;
                runs.push(scope.spawn(move || keys(config, &["revoke", name])));
            }
            for run in runs {
                let out = run.join().expect("the command thread ends");
                assert!(out.success(), "{out:?}");
            }
        });
        expected.extend(fresh);
        expected.sort();
        assert_eq!(
            key_names(&config),
            expected,
            "round {round}: no update lost"
        );
    }
}

/// Audit finding 4: the keys commands keep the keys file's owner, group and
/// mode (a `keys revoke` run as root must not leave a file the server's user
/// cannot read). The owner part needs root, which these tests run as.
#[tokio::test]
async fn revocation_fails_closed_keys_commands_keep_the_files_owner_group_and_mode() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let config = ConfigBuilder::unreached().write();
    let alice = issue_key(&config, "alice");
    let path = config.keys_file();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    // `nobody`: any owner but the one running the commands.
    let owner = std::os::unix::fs::chown(&path, Some(65534), Some(65534))
        .map(|()| (65534, 65534))
        .map_err(|e| eprintln!("not root ({e}): the owner is not checked"))
        .ok();
    let kept = |what: &str| {
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o640, "{what} keeps the mode");
        if let Some(owner) = owner {
            assert_eq!(
                (meta.uid(), meta.gid()),
                owner,
                "{what} keeps owner and group"
            );
        }
    };
    let bob = issue_key(&config, "bob");
    kept("keys issue");
    let revoke = keys(&config, &["revoke", "alice"]);
    assert!(revoke.success(), "{revoke:?}");
    kept("keys revoke");

    let server = Server::start(&config);
    assert_key_accepted(&server, &bob).await;
    assert_key_refused(&server, &alice).await;
}

/// Operator sweep: with the keys file a symbolic link (which the README
/// allows), `keys revoke` replaced the link with a file, and the file it
/// led to, the one the operator keeps, still held the revoked key.
#[test]
fn a_keys_file_that_is_a_link_is_updated_where_it_leads() {
    let config = ConfigBuilder::unreached().write();
    let real = config.dir().join("real");
    std::fs::create_dir_all(&real).unwrap();
    let target = real.join("keys-v1.toml");
    assert!(keys(&config, &["issue", "--name", "alice"]).success());
    assert!(keys(&config, &["issue", "--name", "bob"]).success());
    std::fs::rename(config.keys_file(), &target).unwrap();
    std::os::unix::fs::symlink(&target, config.keys_file()).unwrap();

    assert!(keys(&config, &["revoke", "alice"]).success());
    assert!(keys(&config, &["issue", "--name", "carol"]).success());
    let link = std::fs::symlink_metadata(config.keys_file()).unwrap();
    assert!(link.file_type().is_symlink(), "the link stays a link");
    let kept = std::fs::read_to_string(&target).unwrap();
    assert!(
        !kept.contains("alice") && kept.contains("bob") && kept.contains("carol"),
        "{kept}"
    );
    assert_eq!(key_names(&config), ["bob", "carol"]);
    // Its lock is beside the file written.
    assert!(real.join(".keys-v1.toml.lock").exists());

    // Second reading: a link leading nowhere is refused, not replaced.
    std::fs::remove_file(config.keys_file()).unwrap();
    std::os::unix::fs::symlink(real.join("gone.toml"), config.keys_file()).unwrap();
    let out = keys(&config, &["issue", "--name", "dave"]);
    assert!(!out.success(), "{out:?}");
    assert!(out.stderr.contains("leads to no regular file"), "{out:?}");
    let link = std::fs::symlink_metadata(config.keys_file()).unwrap();
    assert!(link.file_type().is_symlink(), "the link stays a link");

    // ...and one another user planted is not followed (checked where this
    // test may give the link away: as root).
    std::fs::remove_file(config.keys_file()).unwrap();
    std::os::unix::fs::symlink(&target, config.keys_file()).unwrap();
    if std::os::unix::fs::lchown(config.keys_file(), Some(65534), Some(65534)).is_ok() {
        let out = keys(&config, &["revoke", "bob"]);
        assert!(!out.success(), "{out:?}");
        assert!(out.stderr.contains("owned by another user"), "{out:?}");
        assert!(std::fs::read_to_string(&target).unwrap().contains("bob"));
    }
}

/// Audit finding 8: the keys file's temporary file is created exclusively
/// and not through a link: one planted at its name (which holds the
/// command's PID) is removed, not written through, and the keys file is a
/// file of mode 0600 whatever the umask, not the planted link.
#[test]
fn trusted_files_the_keys_temp_file_is_never_written_through_a_planted_link() {
    use std::os::unix::fs::PermissionsExt;
    let config = ConfigBuilder::unreached().write();
    let victim = config.dir().join("victim.txt");
    std::fs::write(&victim, "not the keys file\n").unwrap();
    let planted = config.dir().join(".keys.toml.$$.tmp");
    let prelude = format!(
        "umask 000\nln -s '{}' \"{}\"",
        paths::display(&victim),
        paths::display(&planted)
    );
    let out = run_cli_after(
        &config,
        &standard_env(),
        Some(&prelude),
        &["keys", "issue", "--name", "alice"],
    );
    assert!(out.success(), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "not the keys file\n",
        "the link's target is untouched"
    );
    let meta = std::fs::symlink_metadata(config.keys_file()).unwrap();
    assert!(
        meta.file_type().is_file(),
        "the keys file is a file, not the planted link"
    );
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(key_names(&config), ["alice"]);
}

#[test]
fn check_accepts_a_good_config() {
    let config = ConfigBuilder::unreached().write();
    let out = run_cli(&config, &standard_env(), &["check"]);
    assert!(out.success(), "{out:?}");
}

/// The README is the manual: its sample `platforms.toml` is one `check`
/// accepts (with this machine's plugin folder, and without the TLS and CA
/// files it names as examples).
#[test]
fn the_readmes_sample_config_passes_check() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("the README");
    let section = &readme[readme.find("### Configuration").expect("the section")..];
    let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let end = start + section[start..].find("```").expect("its end");
    let plugin_dir = format!(
        "plugin_dir = {}",
        toml_str(&socialgate_tests::paths::display(&paths::target_dir()))
    );
    let text: Vec<String> = section[start..end]
        .lines()
        .filter(|line| !line.starts_with("tls_") && !line.starts_with("upstream_ca_file"))
        .map(|line| match line.starts_with("plugin_dir") {
            true => plugin_dir.clone(),
            false => line.replace("https://...", "https://upstream.example"),
        })
        .collect();
    let config = Config::from_toml(&text.join("\n"));
    // Its description where the sample names it, beside the config, as an
    // operator copies the repository's folder.
    let platforms = config.dir().join("platforms");
    std::fs::create_dir_all(&platforms).unwrap();
    std::fs::copy(
        paths::description("shortvideo"),
        platforms.join("shortvideo.toml"),
    )
    .unwrap();
    let mut env = standard_env();
    for (name, value) in [
        ("SHORTVIDEO_PRIMARY_KEY", "readme-primary-key"),
        ("SHORTVIDEO_FALLBACK_KEY", "readme-fallback-key"),
        (
            "SOCIALGATE_CURSOR_KEY",
            "a-cursor-key-of-at-least-32-characters",
        ),
        (
            "SOCIALGATE_CURSOR_KEY_OLD",
            "the-old-cursor-key-of-32-characters-too",
        ),
    ] {
        env.push((name.into(), value.into()));
    }
    let out = run_cli(&config, &env, &["check"]);
    assert!(out.success(), "{out:?}");
    assert!(
        out.stdout.contains("ok: 1 platform, 2 providers"),
        "{out:?}"
    );
}

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
    let config = ConfigBuilder::unreached()
        .raw("[ledger]\npath = \"usage.db\"")
        .write();
    // A copy left by an earlier run, which a starting server would prune.
    let copies = config.dir().join("state").join("plugins");
    std::fs::create_dir_all(&copies).expect("can create the copies folder");
    let stale = copies.join("libstale_plugin-0123456789abcdef.so");
    std::fs::write(&stale, b"left by an earlier run").expect("can write a stale copy");
    let half_copied = copies.join(".libstale_plugin-0123456789abcdef.so.4242.tmp");
    std::fs::write(&half_copied, b"a crash mid-copy").expect("can write a temporary copy");
    // Operator sweep: the same folder used as the plugin folder lost the
    // operator's own libraries, and anything else in it, at start.
    let theirs = ["libtheir_plugin.so", "README.txt", "libx-0123.so"];
    for name in theirs {
        std::fs::write(copies.join(name), b"the operator's").expect("can write a file");
    }

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
            config.dir().join("usage.db").exists() && !stale.exists() && !half_copied.exists()
        })
        .await,
        "serve opens the ledger and prunes the stale copy"
    );
    for name in theirs {
        assert!(copies.join(name).exists(), "{name} is not a copy: kept");
    }
    drop(server);
}

/// Asserts `serve` and `check` both refuse `config` with one stderr line
/// naming `file` (the config, or the library at fault) and each of `words`.
fn assert_refused(config: &Config, env: &[(String, String)], file: &str, words: &[&str]) {
    let serve = match Server::try_start(config, env, &[]) {
        Ok(_) => panic!("serve must refuse this config:\n{}", config.text()),
        Err(out) => out,
    };
    let check = run_cli(config, env, &["check"]);
    for (what, out) in [("check", &check), ("serve", &serve)] {
        let line = out.refusal_line(what);
        assert!(line.contains(file), "{what}: names {file}: {line}");
        for word in words {
            assert!(line.contains(word), "{what}: names {word:?}: {line}");
        }
        for secret in [PRIMARY_KEY, FALLBACK_KEY] {
            assert!(
                !out.stderr.contains(secret),
                "{what}: leaks an upstream key"
            );
        }
    }
    // Last, so a stray log line does not hide a wrong reason.
    check.assert_one_stderr_line("check");
    serve.assert_one_stderr_line("serve");
}

const CONFIG_FILE: &str = "platforms.toml";

/// A platform's description is part of the config: a bad one is refused
/// by `check` and at start, with the file, the place in it and the reason;
/// a live platform without one is refused, never served by a default.
#[test]
fn a_bad_or_missing_description_is_refused_with_file_place_and_reason() {
    let scratch = paths::scratch_dir();
    let bad = paths::description_copy(scratch.path(), |text| {
        text.replacen("length = [1, 64]", "length = [64, 1]", 1)
    });
    let config = ConfigBuilder::unreached()
        .description("shortvideo", &bad)
        .write();
    assert_refused(
        &config,
        &standard_env(),
        &paths::display(&bad),
        &[
            CONFIG_FILE,
            "[platforms.shortvideo] description",
            "parameters.username.length",
            "[64, 1] is not in order",
        ],
    );

    let misnamed = paths::description_copy(scratch.path(), |text| {
        text.replacen("name = \"shortvideo\"", "name = \"clipgram\"", 1)
    });
    let config = ConfigBuilder::unreached()
        .description("shortvideo", &misnamed)
        .write();
    assert_refused(
        &config,
        &standard_env(),
        &paths::display(&misnamed),
        &[
            "name",
            "\"clipgram\" is not the platform that names this file",
        ],
    );

    let text = ConfigBuilder::unreached().to_toml();
    let line = format!(
        "description = {}\n",
        toml_str(&paths::display(&paths::description("shortvideo")))
    );
    assert!(text.contains(&line), "{text}");
    assert_refused(
        &Config::from_toml(&text.replace(&line, "")),
        &standard_env(),
        CONFIG_FILE,
        &["[platforms.shortvideo]: a live platform needs `description"],
    );
}

/// The API document is made by `check` and at start: a description that
/// takes a name the document already gives (here the base's `getAccount`)
/// is refused before anything serves, naming the platform and the name.
#[test]
fn a_name_the_api_document_already_has_is_refused() {
    let scratch = paths::scratch_dir();
    let taken = paths::description_copy(scratch.path(), |text| {
        text.replacen(
            "operation_id = \"getProfile\"",
            "operation_id = \"getAccount\"",
            1,
        )
    });
    let config = ConfigBuilder::unreached()
        .description("shortvideo", &taken)
        .write();
    assert_refused(
        &config,
        &standard_env(),
        "the API document (GET /v1/openapi.json) cannot be made",
        &[
            "platform \"shortvideo\"",
            "the operationId \"getAccount\" is already another's",
            "openapi_prefix",
        ],
    );
}

#[test]
fn an_unknown_key_in_the_config_is_refused_by_name() {
    let text = ConfigBuilder::unreached().to_toml().replace(
        "state_dir = \"state\"\n",
        "state_dir = \"state\"\nlisten_backlog = 5\n",
    );
    assert_refused(
        &Config::from_toml(&text),
        &standard_env(),
        CONFIG_FILE,
        &["listen_backlog"],
    );

    let text = ConfigBuilder::unreached().to_toml().replace(
        "timeout_ms = 2000\n",
        "timeout_ms = 2000\ntimeout_seconds = 2\n",
    );
    assert_refused(
        &Config::from_toml(&text),
        &standard_env(),
        CONFIG_FILE,
        &["timeout_seconds"],
    );
}

#[test]
fn an_unset_api_key_variable_is_refused_by_name() {
    let config = ConfigBuilder::unreached()
        .provider(
            "extra",
            "shortvideo_fallback",
            "http://127.0.0.1:9",
            "SG_TEST_NEVER_SET_VAR",
        )
        .write();
    assert_refused(
        &config,
        &standard_env(),
        CONFIG_FILE,
        &["SG_TEST_NEVER_SET_VAR"],
    );
}

#[test]
fn a_missing_plugin_library_is_refused_by_name() {
    let config = ConfigBuilder::unreached()
        .provider(
            "extra",
            "no_such_plugin_lib",
            "http://127.0.0.1:9",
            PRIMARY_KEY_ENV,
        )
        .write();
    // The line names the library file it could not load.
    assert_refused(&config, &standard_env(), "libno_such_plugin_lib", &[]);
}

#[test]
fn a_chain_naming_an_undefined_provider_is_refused_by_name() {
    let config = ConfigBuilder::new()
        .platform("shortvideo", "live", &[PRIMARY, "ghost-provider"])
        .provider(
            PRIMARY,
            "shortvideo_primary",
            "http://127.0.0.1:9",
            PRIMARY_KEY_ENV,
        )
        .write();
    assert_refused(&config, &standard_env(), CONFIG_FILE, &["ghost-provider"]);
}

#[test]
fn a_syntax_error_or_a_missing_file_is_refused() {
    let text = format!("{}\n[server\n", ConfigBuilder::unreached().to_toml());
    assert_refused(&Config::from_toml(&text), &standard_env(), CONFIG_FILE, &[]);
    let config = ConfigBuilder::unreached().write();
    std::fs::remove_file(config.path()).unwrap();
    assert_refused(&config, &standard_env(), CONFIG_FILE, &[]);
}

#[test]
fn a_busy_port_fails_the_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().to_string();
    let config = ConfigBuilder::unreached().write();
    let out = match Server::try_start(&config, &standard_env(), &["--listen", &busy]) {
        Ok(_) => panic!("serve must not start on a busy port"),
        Err(out) => out,
    };
    let line = out.refusal_line("serve");
    assert!(line.contains(&busy), "says which address is busy: {line}");
    assert!(line.contains("public listener, --listen"), "{line}");
    out.assert_one_stderr_line("serve");
    // The admin listener's: named, with the file that sets it.
    let config = ConfigBuilder::unreached().write();
    config.rewrite(&config.text().replace(
        "admin_listen = \"127.0.0.1:0\"",
        &format!("admin_listen = \"{busy}\""),
    ));
    let out = match Server::try_start(&config, &standard_env(), &[]) {
        Ok(_) => panic!("serve must not start on a busy admin port"),
        Err(out) => out,
    };
    let line = out.refusal_line("serve");
    assert!(
        line.contains(&busy) && line.contains("admin listener, [server] admin_listen in "),
        "says which listener, set where: {line}"
    );
}

#[test]
fn listen_on_the_command_line_overrides_the_config() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().to_string();
    let config = ConfigBuilder::unreached().write();
    // The busy address in the file, a free one on the command line.
    config.rewrite(&config.text().replace(
        "\nlisten = \"127.0.0.1:0\"",
        &format!("\nlisten = \"{busy}\""),
    ));
    assert!(
        Server::try_start(&config, &standard_env(), &[]).is_err(),
        "the file's address is busy"
    );
    let server = Server::start_with(&config, &standard_env(), &["--listen", "127.0.0.1:0"]);
    assert_ne!(server.addr().to_string(), busy);
}

/// A running `socialgate demo`, killed when dropped.
struct Demo {
    child: Child,
    base: String,
    key: String,
    /// Holds its stderr; the demo's own files are beside the binary.
    scratch: tempfile::TempDir,
}

/// The demo tests start, kill and look at every demo's folder, and a demo
/// starting removes the folders of dead runs: one test at a time, so what
/// one test left for a start to find is not removed by another's start.
static DEMOS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Where a demo with process ID `pid` keeps its files.
fn demo_dir(pid: u32) -> PathBuf {
    paths::target_dir()
        .join("socialgate-demo")
        .join(format!("run-{pid}"))
}

impl Demo {
    /// Starts `socialgate demo ARGS` on a free port; [`Demo::ready`] waits
    /// for it, so several can start at once.
    fn spawn(args: &[&str]) -> (Child, mpsc::Receiver<String>, tempfile::TempDir) {
        let scratch = paths::scratch_dir();
        let stderr = std::fs::File::create(scratch.path().join("demo-stderr.log"))
            .expect("can create the stderr file");
        let mut child = Command::new(paths::socialgate_bin())
            .arg("demo")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .current_dir(scratch.path())
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("can start socialgate demo");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (lines_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        (child, lines, scratch)
    }

    /// Waits (at most [`PROCESS_TIMEOUT`]) for the address and the key the
    /// demo prints.
    fn ready(
        (mut child, lines, scratch): (Child, mpsc::Receiver<String>, tempfile::TempDir),
    ) -> Demo {
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        let (mut base, mut key) = (None, None);
        while base.is_none() || key.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = lines.recv_timeout(left) else {
                let _ = child.kill();
                let _ = child.wait();
                let stderr = std::fs::read_to_string(scratch.path().join("demo-stderr.log"));
                panic!(
                    "the demo printed no address and key within {PROCESS_TIMEOUT:?}\nstderr: {}",
                    stderr.unwrap_or_default()
                );
            };
            if let Some(addr) = line.strip_prefix("listening on ") {
                base = Some(addr.to_owned());
            } else if let Some(k) = line.strip_prefix("demo API key: ") {
                key = Some(k.trim().to_owned());
            }
        }
        Demo {
            child,
            base: base.expect("set above"),
            key: key.expect("set above"),
            scratch,
        }
    }

    fn start(args: &[&str]) -> Demo {
        Demo::ready(Demo::spawn(args))
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn api(&self, key: &str) -> Api {
        Api::new(&self.base, Some(key))
    }

    /// `GET /v1/account` with the demo's own key: its credits used so far.
    async fn credits_used_total(&self) -> u64 {
        let a = self.api(&self.key).get("/v1/account").await;
        assert_eq!(a.status, 200, "the demo's key reads its account: {a:?}");
        a.json["data"]["credits_used_total"]
            .as_u64()
            .unwrap_or_else(|| panic!("no credits_used_total: {a:?}"))
    }

    /// A profile with the demo's own key answers 200.
    async fn assert_serves_its_key(&self) {
        let a = self
            .api(&self.key)
            .get("/v1/shortvideo/profile?username=lunabakes")
            .await;
        a.assert_success(false);
        assert_eq!(a.data()["username"], "lunabakes", "{a:?}");
    }

    /// Sends SIGTERM (to this process only) and waits, bounded, for it to end.
    fn terminate(mut self) -> ExitStatus {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .stdin(Stdio::null())
            .status()
            .expect("can run kill");
        assert!(status.success(), "kill -TERM {} failed", self.pid());
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("can poll the demo") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the demo did not end within {PROCESS_TIMEOUT:?} of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the process outright, as a crash would, leaving its files.
    fn crash(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let stderr = std::fs::read_to_string(self.scratch.path().join("demo-stderr.log"));
            eprintln!(
                "--- demo {} stderr ---\n{}\n--- end ---",
                self.base,
                stderr.unwrap_or_default()
            );
        }
    }
}

#[tokio::test]
async fn two_demos_run_at_once_each_with_its_own_key_config_and_usage() {
    let _one_at_a_time = DEMOS.lock().await;
    let (a, b) = (Demo::spawn(&[]), Demo::spawn(&["--fail-primary"]));
    let (a, b) = (Demo::ready(a), Demo::ready(b));
    assert_ne!(a.key, b.key);
    assert_ne!(demo_dir(a.pid()), demo_dir(b.pid()));
    for demo in [&a, &b] {
        assert!(demo_dir(demo.pid()).join("platforms.toml").is_file());
        // A fresh key of a fresh ledger: nothing used yet.
        assert_eq!(demo.credits_used_total().await, 0, "{}", demo.base);
    }
    // Longer than a reload takes to notice a file (debounced, or polled
    // every 500 ms): a shared config would have been reloaded by now.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.assert_serves_its_key().await;
    b.assert_serves_its_key().await;
    a.api(&b.key)
        .get("/v1/account")
        .await
        .assert_error(401, "INVALID_API_KEY");
    b.api(&a.key)
        .get("/v1/account")
        .await
        .assert_error(401, "INVALID_API_KEY");
    // Each counts only its own use.
    for demo in [&a, &b] {
        let counted = eventually(Duration::from_secs(5), || async {
            demo.credits_used_total().await == 1
        })
        .await;
        assert!(counted, "{} counts its one request alone", demo.base);
    }
}

#[tokio::test]
async fn a_demo_removes_its_folder_at_exit_and_a_crashed_runs_at_the_next_start() {
    let _one_at_a_time = DEMOS.lock().await;
    let live = Demo::start(&[]);

    let ended = Demo::start(&[]);
    ended.assert_serves_its_key().await;
    let ended_dir = demo_dir(ended.pid());
    assert!(ended_dir.is_dir());
    let status = ended.terminate();
    assert!(status.success(), "SIGTERM ends the demo cleanly: {status}");
    assert!(!ended_dir.exists(), "an ended demo removes its folder");

    let crashed = Demo::start(&[]);
    let crashed_dir = demo_dir(crashed.pid());
    crashed.crash();
    assert!(crashed_dir.is_dir(), "a crash leaves the folder");

    let next = Demo::start(&[]);
    assert!(
        !crashed_dir.exists(),
        "the next start removes a crashed run's folder"
    );
    assert!(
        demo_dir(live.pid()).join("platforms.toml").is_file(),
        "a running demo's folder is never touched"
    );
    live.assert_serves_its_key().await;
    // What the ended run used is not the next run's.
    assert_eq!(next.credits_used_total().await, 0);

    let next_dir = demo_dir(next.pid());
    let live_dir = demo_dir(live.pid());
    for demo in [next, live] {
        let status = demo.terminate();
        assert!(status.success(), "SIGTERM ends the demo cleanly: {status}");
    }
    assert!(!next_dir.exists() && !live_dir.exists());
}

/// Every item of a listing a demo answers, page after page (each page
/// checked), in order.
async fn every_page(api: &Api, listing: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut path = listing.to_owned();
    loop {
        let a = api.get(&path).await;
        a.assert_success(true);
        items.extend(a.data().as_array().expect("a list").iter().cloned());
        match a.next_cursor() {
            Some(token) => path = with_cursor(listing, &token),
            None => return items,
        }
    }
}

/// The demo's sandbox upstreams imitate both providers' contracts, traps
/// included (the fallback's opaque media key beside the post ID, a batch
/// of five whatever `count` asks, rounded counters, an escaped quote in a
/// comment): the real plugins read the same users, posts and comments
/// from either, page after page, and what does not exist is 404 from both.
#[tokio::test]
async fn a_demo_answers_alike_from_either_provider() {
    let _one_at_a_time = DEMOS.lock().await;
    let (primary, fallback) = (Demo::spawn(&[]), Demo::spawn(&["--fail-primary"]));
    let demos = [Demo::ready(primary), Demo::ready(fallback)];
    let mut seen = Vec::new();
    for demo in &demos {
        let api = demo.api(&demo.key);
        let mut answers = Vec::new();
        for user in ["lunabakes", "trailrunner.mo", "lunabakes.fan"] {
            let a = api
                .get(&format!("/v1/shortvideo/profile?username={user}"))
                .await;
            a.assert_success(false);
            let shared = ["username", "display_name", "bio", "following", "videos"];
            answers.push(json!(shared.map(|field| a.data()[field].clone())));
            assert_eq!(a.data()["verified"], user == "lunabakes", "{a:?}");
        }
        let posts = every_page(&api, "/v1/shortvideo/posts?username=lunabakes&count=2").await;
        let ids: Vec<&Value> = posts.iter().map(|post| &post["id"]).collect();
        assert_eq!(ids.len(), 5, "{posts:?}");
        answers.push(json!(ids));
        let post = api.get("/v1/shortvideo/post?id=7312345678901234567").await;
        post.assert_success(false);
        let fields = ["id", "text", "comments", "author"];
        answers.push(json!(fields.map(|field| post.data()[field].clone())));
        let comments = every_page(
            &api,
            "/v1/shortvideo/comments?id=7312345678901234567&count=50",
        )
        .await;
        let mut ids: Vec<&Value> = comments.iter().map(|c| &c["id"]).collect();
        answers.push(json!(ids));
        ids.sort_by_key(|id| id.to_string());
        ids.dedup();
        assert_eq!(ids.len(), 120, "every comment once");
        assert_eq!(comments[0]["author"], "crumbqueen");
        assert_eq!(comments[2]["text"], r#"the \"sound\" of that crust"#);
        let found = every_page(&api, "/v1/shortvideo/search?query=LUNA").await;
        let names: Vec<&Value> = found.iter().map(|user| &user["username"]).collect();
        assert_eq!(names, ["lunabakes", "lunabakes.fan"], "{found:?}");
        for missing in [
            "/v1/shortvideo/profile?username=nosuchuser",
            "/v1/shortvideo/posts?username=nosuchuser",
            "/v1/shortvideo/post?id=7000000000000000000",
            "/v1/shortvideo/comments?id=7000000000000000000",
        ] {
            api.get(missing)
                .await
                .assert_error(404, "RESOURCE_NOT_FOUND");
        }
        let luna = api.get("/v1/shortvideo/profile?username=lunabakes").await;
        answers.push(luna.data()["followers"].clone());
        seen.push(answers);
    }
    // The fallback rounds large counters: 5,479,588 followers say 5.5M.
    let (via_primary, via_fallback) = (seen.remove(0), seen.remove(0));
    let last = via_primary.len() - 1;
    assert_eq!(via_primary[..last], via_fallback[..last]);
    assert_eq!(
        (&via_primary[last], &via_fallback[last]),
        (&json!(5_479_588), &json!(5_500_000))
    );
}
