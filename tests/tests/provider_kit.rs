//! The provider author's kit, end to end: `plugin new` writes a crate that
//! builds and passes its tests out of tree and is then served by a real
//! server; `plugin inspect` names what a library is or why it cannot load;
//! `check` names each provider's plugin and version, and refuses a provider
//! listed for an endpoint it does not serve; a username of dots is refused
//! before any plugin sees it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use socialgate_tests::config::{standard_env, ConfigBuilder, FALLBACK, PRIMARY};
use socialgate_tests::operator::log_line_within;
use socialgate_tests::paths::{self, display};
use socialgate_tests::{issue_key, run_cli, Api, Server, Stack};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// The name of the crate the test makes.
const NAME: &str = "acme-kit";
const KEY_ENV: &str = "ACME_KIT_KEY";
const KEY: &str = "ak-test-acme-0c9d2e";
/// The out-of-tree build may take this long (dependencies come from the
/// shared target folder, so it is mostly the plugin and plugin-api).
const BUILD_TIMEOUT: Duration = Duration::from_secs(240);

/// The repository's root (this crate is `tests/`).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

/// Runs `cargo ARGS` in `dir` with a target folder shared between runs, so
/// dependencies compile once; fails the test with its output on error.
fn cargo(dir: &Path, args: &[&str]) {
    let target = paths::target_dir()
        .parent()
        .expect("the profile folder is inside target/")
        .join("plugin-kit");
    let log = dir.join(format!("cargo-{}.log", args[0]));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut child = Command::new(cargo)
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .stdout(std::fs::File::create(&log).expect("can create the log"))
        .stderr(std::fs::File::create(dir.join("cargo.err")).expect("can create the log"))
        .spawn()
        .expect("can run cargo");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("can poll cargo") {
            break status;
        }
        if started.elapsed() > BUILD_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`cargo {}` took longer than {BUILD_TIMEOUT:?}",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = std::fs::read_to_string(dir.join("cargo.err")).unwrap_or_default();
    let stdout = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.success(),
        "`cargo {}` failed: {status}\n{stdout}\n{stderr}",
        args.join(" ")
    );
    eprintln!("cargo {} took {:?}", args.join(" "), started.elapsed());
}

/// The made-up REST upstream the template is written for.
async fn acme_upstream(fixtures: &Path) -> MockServer {
    let server = MockServer::start().await;
    let user = std::fs::read(fixtures.join("user.json")).expect("the template has its fixture");
    Mock::given(method("GET"))
        .and(path("/v1/users/lunabakes"))
        .and(header("Authorization", format!("Bearer {KEY}")))
        .respond_with(ResponseTemplate::new(200).set_body_raw(user, "application/json"))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/users/nobody"))
        .respond_with(ResponseTemplate::new(404).set_body_json(json!({"error": "not_found"})))
        .mount(&server)
        .await;
    server
}

#[tokio::test]
async fn plugin_new_builds_and_tests_out_of_tree_and_is_served() {
    let scratch = paths::scratch_dir();
    let crate_dir = scratch.path().join(NAME);
    let cli_config = ConfigBuilder::new().write();
    let out = run_cli(
        &cli_config,
        &standard_env(),
        &[
            "plugin",
            "new",
            NAME,
            "--dir",
            &display(&crate_dir),
            "--plugin-api",
            &display(&repo_root().join("plugin-api")),
        ],
    );
    assert!(out.success(), "{out:?}");
    for file in ["Cargo.toml", "src/lib.rs", "src/tests.rs", "README.md"] {
        assert!(crate_dir.join(file).is_file(), "{file}: {}", out.stdout);
        assert!(out.stdout.contains(file), "names {file}: {}", out.stdout);
    }
    let again = run_cli(
        &cli_config,
        &standard_env(),
        &["plugin", "new", NAME, "--dir", &display(&crate_dir)],
    );
    assert!(again
        .refusal_line("plugin new twice")
        .contains("already exists"));
    // A name outside its rule is a usage error, as a bad argument is.
    let bad = run_cli(&cli_config, &standard_env(), &["plugin", "new", "Acme"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");

    // This repository's lock pins the versions its target folder already
    // built, so the new crate needs no download and little compiling.
    std::fs::copy(repo_root().join("Cargo.lock"), crate_dir.join("Cargo.lock"))
        .expect("can copy the lock file");
    cargo(&crate_dir, &["test", "--offline", "--quiet"]);
    cargo(&crate_dir, &["build", "--offline", "--quiet"]);
    let library = paths::target_dir()
        .parent()
        .unwrap()
        .join("plugin-kit/debug")
        .join(format!(
            "{}acme_kit{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        ));
    assert!(library.is_file(), "{}", library.display());

    let inspect = run_cli(
        &cli_config,
        &standard_env(),
        &["plugin", "inspect", &display(&library)],
    );
    assert!(inspect.success(), "{inspect:?}");
    for line in [
        "name: acme-kit",
        "version: 0.1.0",
        "plugin-api: 1.6.0",
        "platform: acme-kit",
        "endpoints: profile",
    ] {
        assert!(inspect.stdout.contains(line), "{line}: {}", inspect.stdout);
    }

    let upstream = acme_upstream(&crate_dir.join("fixtures")).await;
    let config = ConfigBuilder::new()
        .platform(NAME, "live", &[NAME])
        .provider(NAME, &display(&library), &upstream.uri(), KEY_ENV)
        .write();
    let env = vec![(KEY_ENV.to_owned(), KEY.to_owned())];
    let check = run_cli(&config, &env, &["check"]);
    assert!(check.success(), "{check:?}");
    assert!(
        check.stdout.contains(
            "provider acme-kit: plugin acme-kit 0.1.0 (plugin-api 1.6.0), serves profile"
        ),
        "{}",
        check.stdout
    );
    let key = issue_key(&config, "author");
    let server = Server::start_with(&config, &env, &[]);
    let api = Api::new(&server.base_url(), Some(&key));
    let a = api.get("/v1/acme-kit/profile?username=lunabakes").await;
    assert_eq!((a.status, &a.json["success"]), (200, &json!(true)), "{a:?}");
    assert_eq!(a.json["platform"], NAME, "{a:?}");
    assert_eq!(a.data()["username"], "lunabakes", "{a:?}");
    assert_eq!(a.data()["followers"], 5_479_588, "{a:?}");
    assert_eq!(a.data()["id"], "6613926240453148678", "{a:?}");
    a.assert_absent(KEY);
    api.get("/v1/acme-kit/profile?username=nobody")
        .await
        .assert_error(404, "RESOURCE_NOT_FOUND");
    api.get("/v1/acme-kit/posts?username=lunabakes")
        .await
        .assert_error(404, "ENDPOINT_NOT_FOUND");
    // Log lines are written by a thread of their own, moments later.
    log_line_within(
        &server,
        &["provider ready: plugin acme-kit 0.1.0"],
        Duration::from_secs(5),
    )
    .await;
}

#[test]
fn inspect_names_a_library_or_why_it_cannot_load() {
    paths::require_plugin("shortvideo_primary");
    paths::require_plugin("incompatible_plugin");
    let config = ConfigBuilder::new().write();
    let primary = paths::plugin_library("shortvideo_primary");
    let out = run_cli(
        &config,
        &standard_env(),
        &["plugin", "inspect", &display(&primary)],
    );
    assert!(out.success(), "{out:?}");
    assert_eq!(
        out.stdout.trim(),
        "name: shortvideo-primary\nversion: 1.0.0\nplugin-api: 1.6.0\n\
         platform: shortvideo\nendpoints: profile, posts, post, comments"
    );
    let incompatible = paths::plugin_library("incompatible_plugin");
    let out = run_cli(
        &config,
        &standard_env(),
        &["plugin", "inspect", &display(&incompatible)],
    );
    let line = out.refusal_line("inspect incompatible");
    assert!(
        line.contains("libincompatible_plugin") && line.contains("incompatible plugin-api"),
        "{line}"
    );
    let missing = config.dir().join("libnothing.so");
    let out = run_cli(
        &config,
        &standard_env(),
        &["plugin", "inspect", &display(&missing)],
    );
    assert!(out
        .refusal_line("inspect missing")
        .contains("cannot be loaded"));
}

#[tokio::test]
async fn check_names_plugin_versions_and_refuses_an_endpoint_not_served() {
    let stack = Stack::start().await;
    let out = run_cli(&stack.config, &standard_env(), &["check"]);
    assert!(out.success(), "{out:?}");
    for provider in [PRIMARY, FALLBACK] {
        let line = format!("provider {provider}: plugin {provider} 1.0.0 (plugin-api 1.6.0)");
        assert!(out.stdout.contains(&line), "{line}: {}", out.stdout);
    }
    assert!(!out.stdout.contains("no provider serves"), "{}", out.stdout);

    // Kit review, problem 4: a reorder that leaves an endpoint to no one
    // is legal, and `check` says what it leaves.
    let original = stack.config.text();
    let unserved = stack
        .config
        .text()
        .replace("search = [\"shortvideo-fallback\"]", "")
        .replace(
            "providers = [\"shortvideo-primary\", \"shortvideo-fallback\"]",
            "providers = [\"shortvideo-primary\"]",
        );
    stack.config.rewrite(&unserved);
    let out = run_cli(&stack.config, &standard_env(), &["check"]);
    assert!(out.success(), "{out:?}");
    assert!(
        out.stdout.contains(
            "platform shortvideo: no provider serves search (answered 404 ENDPOINT_NOT_FOUND)"
        ),
        "{}",
        out.stdout
    );

    stack.config.rewrite(&original);
    let wrong = stack.config.text().replace(
        "search = [\"shortvideo-fallback\"]",
        "search = [\"shortvideo-primary\", \"shortvideo-fallback\"]",
    );
    assert_ne!(wrong, stack.config.text(), "the stack orders search");
    stack.config.rewrite(&wrong);
    let out = run_cli(&stack.config, &standard_env(), &["check"]);
    let line = out.refusal_line("check");
    assert!(
        line.contains("lists provider `shortvideo-primary` for `search`")
            && line.contains("plugin shortvideo-primary 1.0.0")
            && line.contains("it serves: profile, posts, post, comments"),
        "{line}"
    );
}

#[tokio::test]
async fn usernames_of_dots_only_are_refused() {
    let stack = Stack::start().await;
    for username in [".", "..", "@..", "...", "%2e%2e"] {
        for endpoint in ["profile", "posts"] {
            let a = stack
                .get(&format!("/v1/shortvideo/{endpoint}?username={username}"))
                .await;
            a.assert_invalid("username");
        }
    }
    let a = stack.get("/v1/shortvideo/profile?username=..").await;
    assert!(a.error_message().contains("dots only"), "{a:?}");
    assert_eq!(stack.primary.request_count().await, 0);
    assert_eq!(stack.fallback.request_count().await, 0);
}
