//! Hot reload, against a running server: the operator edits `platforms.toml`,
//! the keys file or a plugin library (or sends SIGHUP), and the server picks
//! the change up within about a second without dropping a request. A bad
//! change is refused with one log line naming the file and the reason, and
//! the previous table keeps answering. Breakers and rate-limit buckets
//! outlive an unrelated change; a changed `listen` is only logged as needing
//! a restart, and the listener stays where it was.
//!
//! Every change is made as an operator should make it: a new file renamed
//! into place. Tests wait for a change with a bounded poll.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use socialgate_tests::config::{
    standard_env, toml_str, ConfigBuilder, FALLBACK, FALLBACK_KEY, FALLBACK_KEY_ENV, PRIMARY,
    PRIMARY_KEY,
};
use socialgate_tests::operator::{admin_addr, scrape, signal};
use socialgate_tests::paths;
use socialgate_tests::process::ADMIN_LISTENING_PREFIX;
use socialgate_tests::raw_upstream::closed_port;
use socialgate_tests::reload::{
    await_watching, library_copy, log_lines, mapped_files, replace_file, wait_for_log, wait_until,
    APPLIED, REJECTED,
};
use socialgate_tests::upstream::{assert_answered_by, LUNA, PRIMARY_FOLLOWERS};
use socialgate_tests::{issue_key, run_cli, Api, Config, Server, Stack, StackBuilder};
use socialgate_tests::{FallbackMock, PrimaryMock, PROFILE_KEYS};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const PROFILE: &str = "/v1/shortvideo/profile?username=lunabakes";

/// The API document, public.
const DOCUMENT: &str = "/v1/openapi.json";
/// A request that passes the key check and then fails on its parameters, so
/// it tells an accepted key (400) from a refused one (401) with no upstream.
const AUTH_PROBE: &str = "/v1/shortvideo/profile";

/// How soon a key change must apply. The service promises about a second;
/// the keys file change triggers a full reload, which re-reads and hashes
/// every configured library: about 0.75 s alone in the debug build, more
/// when other tests share the two cores.
const KEY_CHANGE_BOUND: Duration = Duration::from_secs(2);

/// The made-up platform's provider, its key and the variable carrying it.
const MADEUP: &str = "madeup";
const MADEUP_KEY_ENV: &str = "SG_TEST_MADEUP_KEY";
const MADEUP_KEY: &str = "mk-test-madeup-3c4f21";
const MADEUP_PROFILE: &str = "/v1/madeup/profile?username=zed";

/// A stack with every fixture served by both doubles, its server watching
/// its files, and how many reloads it has applied so far.
async fn serving_stack(builder: StackBuilder) -> (Stack, usize) {
    let stack = builder.start().await;
    stack.primary.serve_fixtures().await;
    stack.fallback.serve_fixtures().await;
    let applied = await_watching(&stack.server, &stack.config).await;
    (stack, applied)
}

/// Asserts a 200 profile answer of `shortvideo` with the normalized keys.
fn assert_profile(a: &socialgate_tests::Answer) {
    a.assert_success(false);
    assert_eq!(a.keys_at("/data"), PROFILE_KEYS, "{a:?}");
    assert_eq!(a.data()["username"], LUNA, "{a:?}");
}

/// The one line the server logged for its `n`-th rejected reload, after
/// waiting for it; it must name `file` and each of `words`.
async fn assert_rejected(server: &Server, n: usize, file: &str, words: &[&str]) -> String {
    let line = wait_for_log(server, REJECTED, n).await;
    assert!(line.contains(file), "the log line names {file}: {line}");
    for word in words {
        assert!(line.contains(word), "the log line names {word:?}: {line}");
    }
    assert_eq!(
        log_lines(server, REJECTED).len(),
        n,
        "one line per rejected change:\n{}",
        server.stderr()
    );
    line
}

/// Asserts `socialgate check` refuses the config on disk with the same
/// reason the server logged in `logged`.
fn assert_check_agrees(config: &Config, logged: &str) {
    let out = run_cli(config, &standard_env(), &["check"]);
    let line = out.refusal_line("check");
    out.assert_one_stderr_line("check");
    let reason = line.strip_prefix("socialgate: ").unwrap_or(line);
    assert!(
        logged.ends_with(reason),
        "check and the server give the same reason:\n check: {line}\nserver: {logged}"
    );
}

#[tokio::test]
async fn reordering_providers_changes_which_upstream_is_asked_first() {
    let (stack, applied) = serving_stack(Stack::builder()).await;
    assert_profile(&stack.get(PROFILE).await);
    assert_eq!(stack.primary.request_count().await, 1, "primary first");
    assert_eq!(stack.fallback.request_count().await, 0);

    let swapped = Stack::builder()
        .providers(&[FALLBACK, PRIMARY])
        .config(&stack.primary, &stack.fallback)
        .to_toml();
    replace_file(stack.config.path(), swapped);
    let took = wait_until("the fallback asked first", || async {
        assert_profile(&stack.get(PROFILE).await);
        stack.fallback.request_count().await > 0
    })
    .await;
    eprintln!("reorder applied after {took:?}");

    // From now on the fallback answers and the primary is never asked.
    let primary_before = stack.primary.request_count().await;
    let fallback_before = stack.fallback.request_count().await;
    for _ in 0..3 {
        let a = stack.get(PROFILE).await;
        assert_profile(&a);
        assert_eq!(
            a.data()["followers"],
            5500000,
            "the fallback's figure: {a:?}"
        );
    }
    assert_eq!(stack.primary.request_count().await, primary_before);
    assert_eq!(stack.fallback.request_count().await, fallback_before + 3);
    let line = wait_for_log(&stack.server, APPLIED, applied + 1).await;
    assert!(
        !line.contains("added") && !line.contains("set up anew"),
        "{line}"
    );
    assert!(
        line.contains("settings changed: [platforms.shortvideo]"),
        "{line}"
    );
    let stderr = stack.server.stderr();
    for secret in [PRIMARY_KEY, FALLBACK_KEY, stack.key.as_str()] {
        assert!(!stderr.contains(secret), "no secret in the log");
    }
}

#[tokio::test]
async fn a_revoked_key_is_refused_and_a_new_key_accepted_within_a_second() {
    let stack = Stack::start().await;
    await_watching(&stack.server, &stack.config).await;
    let api = |key: &str| Api::new(&stack.server.base_url(), Some(key));
    api(&stack.key)
        .get(AUTH_PROBE)
        .await
        .assert_invalid("username");

    let bob = issue_key(&stack.config, "bob");
    let took = wait_until("the new key accepted", || async {
        api(&bob).get(AUTH_PROBE).await.status == 400
    })
    .await;
    eprintln!("issued key accepted after {took:?}");
    assert!(took < KEY_CHANGE_BOUND, "took {took:?}");
    api(&bob).get(AUTH_PROBE).await.assert_invalid("username");

    let revoke = run_cli(&stack.config, &standard_env(), &["keys", "revoke", "e2e"]);
    assert!(revoke.success(), "{revoke:?}");
    let took = wait_until("the revoked key refused", || async {
        api(&stack.key).get(AUTH_PROBE).await.status == 401
    })
    .await;
    eprintln!("revoked key refused after {took:?}");
    assert!(took < KEY_CHANGE_BOUND, "took {took:?}");
    api(&stack.key)
        .get(AUTH_PROBE)
        .await
        .assert_error(401, "INVALID_API_KEY");
    api(&bob).get(AUTH_PROBE).await.assert_invalid("username");

    let stderr = stack.server.stderr();
    assert!(
        !stderr.contains(&bob) && !stderr.contains(&stack.key),
        "no key in the log"
    );
    // Operator sweep: a keys-only reload said "no provider or library changed".
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("reload applied: keys changed")),
        "{stderr}"
    );
}

/// A keys file deleted on a running server refuses every key, as
/// documented, and says so as a warning, not in an info line.
#[tokio::test]
async fn a_deleted_keys_file_is_warned_about() {
    let stack = Stack::start().await;
    await_watching(&stack.server, &stack.config).await;
    std::fs::remove_file(stack.config.keys_file()).expect("removed");
    let line = wait_for_log(&stack.server, "no key is valid now", 1).await;
    assert!(
        line.contains("WARN") && line.contains("last_keys=1"),
        "{line}"
    );
    wait_until("the key refused", || async {
        stack.api.get(AUTH_PROBE).await.status == 401
    })
    .await;
}

/// Operator review, defect 2: a keys file reached through a symbolic link
/// whose target folder is swapped by a rename, the way Kubernetes updates
/// a mounted Secret (`keys.toml -> ..data/keys.toml`, `..data -> ..v1`),
/// is followed: the swap alone applies, with no event on `keys.toml`.
#[tokio::test]
async fn a_keys_file_behind_a_swapped_symbolic_link_is_followed() {
    use std::os::unix::fs::symlink;
    let stack = Stack::start().await;
    let applied = await_watching(&stack.server, &stack.config).await;
    let api = |key: &str| Api::new(&stack.server.base_url(), Some(key));
    let dir = stack.config.dir();
    let keys = stack.config.keys_file();
    let version = |name: &str, text: &str| {
        std::fs::create_dir(dir.join(name)).unwrap();
        std::fs::write(dir.join(name).join("keys.toml"), text).unwrap();
    };
    let swap_data_to = |name: &str| {
        symlink(name, dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    };
    // The same keys, now behind the links.
    version("..v1", &std::fs::read_to_string(&keys).unwrap());
    swap_data_to("..v1");
    symlink("..data/keys.toml", dir.join("keys.toml.tmp")).unwrap();
    std::fs::rename(dir.join("keys.toml.tmp"), &keys).unwrap();
    wait_for_log(&stack.server, APPLIED, applied + 1).await;
    api(&stack.key)
        .get(AUTH_PROBE)
        .await
        .assert_invalid("username");

    // A new version without the key: only `..data` changes.
    version("..v2", "");
    swap_data_to("..v2");
    let took = wait_until("the key refused after the swap", || async {
        api(&stack.key).get(AUTH_PROBE).await.status == 401
    })
    .await;
    eprintln!("swap applied after {took:?}");
    assert!(took < KEY_CHANGE_BOUND, "took {took:?}");
}

/// A platform's description is watched and reloaded like the config: a
/// bad one is rejected (the file, the place, the reason) while the old one
/// keeps serving; a good one's rules apply at once, without a rebuild.
#[tokio::test]
async fn a_bad_description_is_rejected_while_the_old_one_serves_and_a_good_one_applies() {
    let scratch = paths::scratch_dir();
    let file = paths::description_copy(scratch.path(), |text| format!("# A copy.\n{text}"));
    let (stack, applied) = serving_stack(Stack::builder().description(&file)).await;
    assert_profile(&stack.get(PROFILE).await);
    let shipped = std::fs::read_to_string(&file).unwrap();

    replace_file(
        &file,
        shipped.replacen("length = [1, 64]", "length = [64, 1]", 1),
    );
    let line = assert_rejected(
        &stack.server,
        1,
        &paths::display(&file),
        &["parameters.username.length", "[64, 1] is not in order"],
    )
    .await;
    // The old rules: `lunabakes` is a username.
    for _ in 0..3 {
        assert_profile(&stack.get(PROFILE).await);
    }
    assert_check_agrees(&stack.config, &line);

    // `lunabakes` is too long for the new rule, in the new rule's words.
    replace_file(&file, paths::short_usernames(&shipped));
    wait_for_log(&stack.server, APPLIED, applied + 1).await;
    let refused = stack.get(PROFILE).await;
    refused.assert_invalid("username");
    assert!(
        refused
            .error_message()
            .contains("must be 1-5 characters of A-Z"),
        "{refused:?}"
    );
}

/// The API document is made anew at a reload: a description with another
/// summary and another parameter rule is in the served document once
/// applied, under another `ETag`, and the old tag no longer matches.
#[tokio::test]
async fn a_reloaded_description_changes_the_served_document_and_its_tag() {
    let scratch = paths::scratch_dir();
    let file = paths::description_copy(scratch.path(), |text| format!("# A copy.\n{text}"));
    let (stack, applied) = serving_stack(Stack::builder().description(&file)).await;
    let public = stack.api.with_key(None);
    let before = public.get(DOCUMENT).await;
    assert_eq!(before.status, 200, "{before:?}");
    assert_eq!(before.header("cache-control"), Some("no-cache"));
    let tag = before
        .header("etag")
        .expect("the document has an ETag")
        .to_owned();
    let profile = "/paths/~1v1~1shortvideo~1profile/get/summary";
    let username = "/components/parameters/Username/schema/pattern";
    assert_eq!(
        before.json.pointer(username),
        Some(&json!("^@?[A-Za-z0-9._]{1,64}$")),
        "{before:?}"
    );
    // Unchanged while nothing changes, and revalidated with its tag.
    let again = public
        .request_with("GET", DOCUMENT, &[("if-none-match", tag.as_str())])
        .await;
    assert_eq!(again.status, 304, "{again:?}");

    let shipped = std::fs::read_to_string(&file).unwrap();
    let old_summary = before
        .json
        .pointer(profile)
        .and_then(Value::as_str)
        .unwrap();
    let edited = paths::short_usernames(&shipped).replacen(
        &format!("summary = \"{old_summary}\""),
        "summary = \"A creator's profile, described anew\"",
        1,
    );
    assert!(
        edited.contains("described anew"),
        "the summary edit applies"
    );
    replace_file(&file, edited);
    wait_for_log(&stack.server, APPLIED, applied + 1).await;

    let after = public.get(DOCUMENT).await;
    assert_eq!(after.status, 200, "{after:?}");
    assert_eq!(
        after.json.pointer(profile),
        Some(&json!("A creator's profile, described anew"))
    );
    assert_eq!(
        after.json.pointer(username),
        Some(&json!("^@?[A-Za-z0-9._]{1,5}$")),
        "{after:?}"
    );
    let new_tag = after.header("etag").expect("the document has an ETag");
    assert_ne!(new_tag, tag, "a changed document has another tag");
    let stale = public
        .request_with("GET", DOCUMENT, &[("if-none-match", tag.as_str())])
        .await;
    assert_eq!(
        stale.status, 200,
        "the old tag no longer matches: {stale:?}"
    );
    assert_eq!(stale.header("etag"), Some(new_tag));
}

#[tokio::test]
async fn a_broken_config_is_rejected_while_the_old_table_answers() {
    let (stack, applied) = serving_stack(Stack::builder().providers(&[FALLBACK])).await;
    let good = stack.config.text();
    // (what, the broken text, words the reason must hold)
    let broken: [(&str, String, &[&str]); 3] = [
        ("syntax error", format!("{good}\n[server\n"), &[]),
        (
            "unknown provider",
            good.replace(
                "providers = [\"shortvideo-fallback\"]",
                "providers = [\"shortvideo-fallback\", \"ghost-provider\"]",
            ),
            &["ghost-provider"],
        ),
        (
            "unknown key",
            good.replace(
                "state_dir = \"state\"\n",
                "state_dir = \"state\"\nlisten_backlog = 5\n",
            ),
            &["listen_backlog"],
        ),
    ];
    for (n, (what, text, words)) in broken.iter().enumerate() {
        assert_ne!(*text, good, "{what}: the edit applies");
        replace_file(stack.config.path(), text);
        let line = assert_rejected(&stack.server, n + 1, "platforms.toml", words).await;
        eprintln!("{what}: {line}");
        // The previous table keeps answering, from the fallback.
        for _ in 0..3 {
            assert_profile(&stack.get(PROFILE).await);
        }
        assert_check_agrees(&stack.config, &line);
    }
    assert_eq!(stack.primary.request_count().await, 0);

    // Fixed, the file applies again: the primary first now.
    let fixed = Stack::builder()
        .providers(&[PRIMARY, FALLBACK])
        .config(&stack.primary, &stack.fallback)
        .to_toml();
    replace_file(stack.config.path(), fixed);
    wait_for_log(&stack.server, APPLIED, applied + 1).await;
    assert_profile(&stack.get(PROFILE).await);
    assert_eq!(stack.primary.request_count().await, 1, "the fixed order");
    assert_eq!(log_lines(&stack.server, REJECTED).len(), broken.len());
}

/// A config whose fallback loads its library from `library` (a file the
/// config owns), the fallback alone in the chain; and how many reloads the
/// server has applied.
async fn owned_library_stack(library: &Path) -> (Stack, usize) {
    let (stack, applied) = serving_stack(Stack::builder().providers(&[FALLBACK])).await;
    library_copy("shortvideo_fallback", library, b"");
    let text = stack.config.text().replace(
        "library = \"shortvideo_fallback\"",
        &format!(
            "library = {}",
            socialgate_tests::config::toml_str(&library.display().to_string())
        ),
    );
    assert_ne!(text, stack.config.text());
    replace_file(stack.config.path(), text);
    wait_for_log(&stack.server, APPLIED, applied + 1).await;
    assert_profile(&stack.get(PROFILE).await);
    (stack, applied + 1)
}

#[tokio::test]
async fn an_incompatible_library_is_rejected_while_the_old_table_answers() {
    socialgate_tests::paths::require_plugin("incompatible_plugin");
    let scratch = socialgate_tests::paths::scratch_dir();
    let library = scratch.path().join("libs/libshortvideo_fallback.so");
    let (mut stack, applied) = owned_library_stack(&library).await;
    let good_config = stack.config.text();

    // The configured library file replaced by an incompatible one.
    let incompatible = socialgate_tests::paths::plugin_library("incompatible_plugin");
    replace_file(&library, std::fs::read(&incompatible).unwrap());
    let line = assert_rejected(&stack.server, 1, "libshortvideo_fallback", &["plugin"]).await;
    eprintln!("replaced library: {line}");
    for _ in 0..3 {
        assert_profile(&stack.get(PROFILE).await);
    }
    assert_check_agrees(&stack.config, &line);

    // The good file back: it applies (the same content, loaded before).
    library_copy("shortvideo_fallback", &library, b"");
    wait_for_log(&stack.server, APPLIED, applied + 1).await;
    assert_profile(&stack.get(PROFILE).await);

    // Operator review, defect 1: a library cut short (a copy of an
    // unfinished file renamed into place) used to kill the server with
    // SIGBUS as the loader mapped it. It is refused like any unusable one.
    let whole = std::fs::read(&library).unwrap();
    let copies = || {
        std::fs::read_dir(stack.config.dir().join("state/plugins"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let copies_before = copies();
    assert!(copies_before > 0, "the private copies are where this looks");
    for (round, keep) in [100_000, whole.len() / 2, whole.len() - 1]
        .into_iter()
        .enumerate()
    {
        replace_file(&library, &whole[..keep]);
        let line = assert_rejected(
            &stack.server,
            2 + round,
            "libshortvideo_fallback",
            &["incomplete library file"],
        )
        .await;
        assert!(stack.server.is_running(), "cut to {keep} bytes: {line}");
        assert_profile(&stack.get(PROFILE).await);
    }
    assert_eq!(copies(), copies_before, "no copy of a cut-short library");
    let out = run_cli(&stack.config, &standard_env(), &["check"]);
    out.assert_one_stderr_line("check of a cut-short library");
    assert!(out.stderr.contains("incomplete library file"), "{out:?}");
    library_copy("shortvideo_fallback", &library, b"");
    wait_for_log(&stack.server, APPLIED, applied + 2).await;
    assert_profile(&stack.get(PROFILE).await);
    let rejected = 5;

    // The config pointing at the incompatible library by name.
    let text = good_config.replace(
        &socialgate_tests::config::toml_str(&library.display().to_string()),
        "\"incompatible_plugin\"",
    );
    assert_ne!(text, good_config);
    replace_file(stack.config.path(), text);
    let line = assert_rejected(
        &stack.server,
        rejected,
        "libincompatible_plugin",
        &["plugin"],
    )
    .await;
    eprintln!("configured library: {line}");
    for _ in 0..3 {
        assert_profile(&stack.get(PROFILE).await);
    }
    assert_check_agrees(&stack.config, &line);
    assert!(stack.server.stderr().lines().all(|l| !l.contains("panic")));
}

/// `check` names the library, but its reason for a library built against
/// another plugin interface must say so in one line, not abi_stable's
/// multi-line layout dump.
#[test]
fn an_incompatible_library_is_refused_with_a_clear_reason() {
    socialgate_tests::paths::require_plugin("incompatible_plugin");
    let config = ConfigBuilder::new()
        .platform("shortvideo", "live", &[FALLBACK])
        .provider(
            FALLBACK,
            "incompatible_plugin",
            "http://127.0.0.1:9",
            FALLBACK_KEY_ENV,
        )
        .write();
    let out = run_cli(&config, &standard_env(), &["check"]);
    let line = out.refusal_line("check");
    out.assert_one_stderr_line("check");
    let (_, reason) = line
        .split_once("libincompatible_plugin.so: ")
        .unwrap_or_else(|| panic!("names the library: {line}"));
    let reason = reason.to_lowercase();
    assert!(
        ["incompatible", "layout", "interface", "version"]
            .iter()
            .any(|w| reason.contains(w)),
        "says the interface does not match: {line}"
    );
    assert!(
        !reason.contains("<this>") && !reason.contains("---"),
        "{line}"
    );
}

/// The made-up platform's tables, with `status`.
fn madeup_tables(base_url: &str, status: &str) -> String {
    let description = toml_str(&paths::display(&paths::description("madeup")));
    format!(
        "[platforms.madeup]\nstatus = \"{status}\"\nproviders = [\"{MADEUP}\"]\n\
         description = {description}\n\n\
         [providers.{MADEUP}]\nlibrary = \"madeup_plugin\"\nbase_url = \"{base_url}\"\n\
         api_key_env = \"{MADEUP_KEY_ENV}\"\n"
    )
}

/// A double of the made-up platform's upstream: `zed` exists, `nobody` not.
async fn madeup_upstream() -> MockServer {
    let server = MockServer::start().await;
    let user = |name: &str| {
        Mock::given(method("GET"))
            .and(path(format!("/users/{name}")))
            .and(header("Authorization", format!("Bearer {MADEUP_KEY}")))
    };
    user("zed")
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "handle": "zed", "name": "Zed Made-Up", "fans": "1234"
        })))
        .mount(&server)
        .await;
    user("nobody")
        .respond_with(ResponseTemplate::new(404).set_body_json(json!({"error": "not found"})))
        .mount(&server)
        .await;
    server
}

#[tokio::test]
async fn a_new_platform_goes_live_and_is_removed_on_a_running_server() {
    socialgate_tests::paths::require_plugin("madeup_plugin");
    let upstream = madeup_upstream().await;
    let (stack, _) = serving_stack(Stack::builder().env(MADEUP_KEY_ENV, MADEUP_KEY)).await;
    let base = stack.config.text();
    let with = |status: &str| format!("{base}\n{}", madeup_tables(&upstream.uri(), status));

    stack
        .get(MADEUP_PROFILE)
        .await
        .assert_error(404, "PLATFORM_NOT_FOUND");

    replace_file(stack.config.path(), with("live"));
    let took = wait_until("madeup live", || async {
        stack.get(MADEUP_PROFILE).await.status == 200
    })
    .await;
    eprintln!("madeup live after {took:?}");
    let a = stack.get(MADEUP_PROFILE).await;
    assert_eq!(a.json["success"], true, "{a:?}");
    assert_eq!(a.json["platform"], "madeup", "{a:?}");
    assert_eq!(a.json["meta"]["credits_used"], 1, "{a:?}");
    assert_eq!(a.keys_at("/data"), PROFILE_KEYS, "{a:?}");
    let expected = json!({
        "username": "zed", "display_name": "Zed Made-Up", "followers": 1234, "verified": false,
        "id": null, "bio": null, "following": null, "likes": null, "videos": null,
        "avatar_url": null
    });
    assert_eq!(*a.data(), expected, "{a:?}");
    a.assert_absent(MADEUP_KEY);
    stack
        .get("/v1/madeup/profile?username=nobody")
        .await
        .assert_error(404, "RESOURCE_NOT_FOUND");
    stack
        .get("/v1/madeup/posts?username=zed")
        .await
        .assert_error(404, "ENDPOINT_NOT_FOUND");
    assert_profile(&stack.get(PROFILE).await);
    let line = wait_for_log(&stack.server, "platforms added: madeup", 1).await;
    assert!(line.contains(APPLIED), "{line}");

    replace_file(stack.config.path(), &base);
    wait_until("madeup removed", || async {
        stack.get(MADEUP_PROFILE).await.status == 404
    })
    .await;
    stack
        .get(MADEUP_PROFILE)
        .await
        .assert_error(404, "PLATFORM_NOT_FOUND");

    replace_file(stack.config.path(), with("planned"));
    wait_until("madeup planned", || async {
        stack.get(MADEUP_PROFILE).await.status == 501
    })
    .await;
    stack
        .get(MADEUP_PROFILE)
        .await
        .assert_error(501, "PLATFORM_NOT_AVAILABLE");

    replace_file(stack.config.path(), with("live"));
    wait_until("madeup live again", || async {
        stack.get(MADEUP_PROFILE).await.status == 200
    })
    .await;
    assert_eq!(stack.get(MADEUP_PROFILE).await.data()["username"], "zed");
    assert_profile(&stack.get(PROFILE).await);
    assert!(log_lines(&stack.server, REJECTED).is_empty());
    let stderr = stack.server.stderr();
    assert!(!stderr.contains(MADEUP_KEY), "no upstream key in the log");
}

#[tokio::test]
async fn sighup_reloads() {
    let (mut stack, applied) = serving_stack(Stack::builder()).await;
    for n in 1..=2 {
        signal(&stack.server, "HUP");
        let line = wait_for_log(&stack.server, APPLIED, applied + n).await;
        assert!(line.contains("reload applied: nothing changed"), "{line}");
        assert_profile(&stack.get(PROFILE).await);
    }
    assert!(stack.server.is_running());
}

#[tokio::test]
async fn a_library_swapped_by_rename_is_loaded_from_a_private_copy() {
    let scratch = socialgate_tests::paths::scratch_dir();
    let library = scratch.path().join("libs/libshortvideo_fallback.so");
    let (stack, applied) = owned_library_stack(&library).await;
    let state = stack.config.dir().join("state/plugins");
    let copies = || -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&state)
            .expect("the state folder holds the copies")
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "so"))
            .collect();
        files.sort();
        files
    };
    let before = copies();

    library_copy("shortvideo_fallback", &library, b"\0swap-1");
    let line = wait_for_log(&stack.server, APPLIED, applied + 1).await;
    assert!(
        line.contains("libraries changed") && line.contains(&library.display().to_string()),
        "names the library as changed: {line}"
    );
    assert!(
        line.contains("providers set up anew: shortvideo-fallback"),
        "{line}"
    );
    assert_profile(&stack.get(PROFILE).await);
    let after = copies();
    assert_eq!(after.len(), before.len() + 1, "{before:?} -> {after:?}");

    // The process maps the private copies, never the operator's file, so
    // the operator may delete or overwrite it.
    let mapped = mapped_files(stack.server.pid());
    assert!(
        !mapped.iter().any(|m| m.starts_with(scratch.path())),
        "the operator's file is not mapped: {mapped:?}"
    );
    let new_copy = after.iter().find(|c| !before.contains(c)).unwrap();
    assert!(
        mapped.contains(new_copy),
        "{} is mapped: {mapped:?}",
        new_copy.display()
    );
    std::fs::write(&library, b"not a library any more").unwrap();
    let rejected = wait_for_log(&stack.server, REJECTED, 1).await;
    assert!(rejected.contains("libshortvideo_fallback"), "{rejected}");
    for _ in 0..3 {
        assert_profile(&stack.get(PROFILE).await);
    }
}

#[tokio::test]
async fn a_breaker_survives_an_unrelated_reload() {
    let primary = PrimaryMock::start().await;
    let fallback = FallbackMock::start().await;
    fallback.serve_fixtures().await;
    primary.fail_all(503).await;
    let builder = Stack::builder().breaker_failures(1);
    let cooldown = "breaker_cooldown_ms = 600000";
    let config = builder
        .config(&primary, &fallback)
        .provider_line(PRIMARY, cooldown)
        .write();
    let key = issue_key(&config, "e2e");
    let server = Server::start(&config);
    let applied = await_watching(&server, &config).await;
    let api = Api::new(&server.base_url(), Some(&key));

    // One failure opens the primary's breaker; then it is skipped.
    assert_profile(&api.get(PROFILE).await);
    assert_eq!(primary.request_count().await, 1);
    assert_profile(&api.get(PROFILE).await);
    assert_eq!(primary.request_count().await, 1, "the breaker is open");

    // An unrelated change: the fallback's timeout.
    let text = builder
        .config(&primary, &fallback)
        .provider_line(PRIMARY, cooldown)
        .timeout_ms(FALLBACK, 2500)
        .to_toml();
    replace_file(config.path(), text);
    let line = wait_for_log(&server, APPLIED, applied + 1).await;
    assert!(!line.contains("set up anew"), "{line}");
    assert!(
        line.contains(&format!("settings changed: [providers.{FALLBACK}]")),
        "{line}"
    );
    for _ in 0..3 {
        assert_profile(&api.get(PROFILE).await);
    }
    assert_eq!(
        primary.request_count().await,
        1,
        "the primary's breaker is still open after the reload"
    );

    // QA sweep: the primary's own breaker settings changed (a longer
    // cooldown, as in an incident): still open, the dead upstream not asked.
    let text = builder
        .config(&primary, &fallback)
        .provider_line(PRIMARY, "breaker_cooldown_ms = 600001")
        .timeout_ms(FALLBACK, 2500)
        .to_toml();
    replace_file(config.path(), text);
    let line = wait_for_log(&server, APPLIED, applied + 2).await;
    assert!(
        line.contains(&format!("settings changed: [providers.{PRIMARY}]")),
        "{line}"
    );
    for _ in 0..3 {
        assert_profile(&api.get(PROFILE).await);
    }
    assert_eq!(
        primary.request_count().await,
        1,
        "the primary's breaker is still open under its new settings"
    );

    // Operator review, defect 5: the primary removed, its breaker's gauge
    // leaves the metrics page (it showed 1, its last value, for ever).
    let admin = admin_addr(&server);
    let open = |m: &socialgate_tests::operator::Metrics| {
        m.sum("socialgate_breaker_open", &[("provider", PRIMARY)])
    };
    assert_eq!(open(&scrape(admin).await), Some(1.0));
    let text = ConfigBuilder::new()
        .platform("shortvideo", "live", &[FALLBACK])
        .fallback(&fallback.base_url())
        .to_toml();
    assert!(!text.contains(PRIMARY), "{text}");
    replace_file(config.path(), text);
    let line = wait_for_log(&server, APPLIED, applied + 3).await;
    assert!(line.contains("removed"), "{line}");
    wait_until("the removed provider's gauge gone", || async {
        open(&scrape(admin).await).is_none()
    })
    .await;
    let m = scrape(admin).await;
    assert_eq!(
        m.sum("socialgate_breaker_open", &[("provider", FALLBACK)]),
        Some(0.0),
        "the provider still there keeps its gauge:\n{}",
        m.text
    );
}

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
    let stack = Stack::builder()
        .search_order(None)
        .raw("[rate_limit]\nper_second = 0.02\nburst = 2")
        .start()
        .await;
    stack.primary.serve_fixtures().await;
    let applied = await_watching(&stack.server, &stack.config).await;

    for n in 1..=2 {
        let a = stack.get(PROFILE).await;
        assert_answered_by(&a, PRIMARY_FOLLOWERS, &format!("request {n} of the burst"));
    }
    let limited = stack.get(PROFILE).await;
    limited.assert_error(429, "RATE_LIMITED");
    assert!(limited.header("retry-after").is_some(), "{limited:?}");

    // An unrelated change: the primary's timeout.
    let text = stack.config.text();
    let changed = text.replacen("timeout_ms = 2000", "timeout_ms = 2500", 1);
    assert_ne!(changed, text, "the config has a timeout to change");
    replace_file(stack.config.path(), changed);
    let line = wait_for_log(&stack.server, APPLIED, applied + 1).await;
    assert!(line.contains(APPLIED), "{line}");

    let a = stack.get(PROFILE).await;
    a.assert_error(429, "RATE_LIMITED");
    assert_eq!(
        stack.primary.request_count().await,
        2,
        "only the burst reached the upstream"
    );
}

#[tokio::test]
async fn a_changed_listen_is_logged_as_needing_a_restart() {
    let stack = Stack::builder().search_order(None).start().await;
    stack.primary.serve_fixtures().await;
    let applied = await_watching(&stack.server, &stack.config).await;
    assert!(log_lines(&stack.server, "listen changed").is_empty());

    let elsewhere = closed_port().to_string();
    replace_file(
        stack.config.path(),
        with_listen(&stack.config.text(), &elsewhere),
    );
    wait_for_log(&stack.server, APPLIED, applied + 1).await;
    let warnings: Vec<String> = stack
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
        stack.server.stderr()
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
    let a = stack.get(PROFILE).await;
    assert_answered_by(&a, PRIMARY_FOLLOWERS, "on the original address");
    let health = stack.api.with_key(None).get("/healthz").await;
    assert_eq!(health.status, 200, "{health:?}");
    let announced: Vec<String> = stack
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
