//! The config parser as a whole: paths, secrets, one-line errors, and
//! which settings need a restart.

use super::*;
use crate::routing::config::PlatformStatus;
use plugin_api::Endpoint;

/// The repository's description of the platform the configs serve.
const SHORTVIDEO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../platforms/shortvideo.toml");

const GOOD: &str = concat!(
    r#"
    [server]
    listen = "127.0.0.1:0"
    plugin_dir = "plugins"

    [platforms.shortvideo]
    status = "live"
    providers = ["a", "b"]
    description = ""#,
    env!("CARGO_MANIFEST_DIR"),
    r#"/../platforms/shortvideo.toml"
    [platforms.shortvideo.endpoints]
    search = ["b"]

    [platforms.later]
    status = "planned"

    [providers.a]
    library = "shortvideo_primary"
    base_url = "http://127.0.0.1:1"
    api_key_env = "KEY_A"
    timeout_ms = 1500
    [providers.b]
    library = "lib/custom.so"
    base_url = "https://example.test/api/"
    api_key_env = "KEY_B"
    [providers.b.settings]
    rapidapi_host = "x.example"
"#
);

fn env(name: &str) -> Option<String> {
    match name {
        "KEY_A" | "KEY_B" => Some(format!("secret-{name}")),
        "KEY_CURSOR" => Some("secret-cursor-key-of-at-least-32-chars".into()),
        "KEY_CURSOR_OLD" => Some("the-previous-cursor-key-of-32-chars".into()),
        "KEY_REDIS" => Some("redis://127.0.0.1:6379".into()),
        "KEY_REDIS_BAD_PORT" => Some("redis://:pw-secret@127.0.0.1:notaport/0".into()),
        "KEY_REDIS_HTTP" => Some("http://127.0.0.1:6379".into()),
        "KEY_BLANK" => Some(" \t".into()),
        _ => None,
    }
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new("/etc/sg/platforms.toml"), text, &env)
}

#[test]
fn resolves_paths_orders_and_secrets() {
    let c = parse(GOOD).unwrap();
    assert_eq!(c.serving.keys_file, Path::new("/etc/sg/keys.toml"));
    assert_eq!(c.process.state_dir, Path::new("/etc/sg/state"));
    assert_eq!(
        c.serving.providers["a"].library,
        Path::new("/etc/sg/plugins/libshortvideo_primary.so")
    );
    assert_eq!(
        c.serving.providers["b"].library,
        Path::new("/etc/sg/lib/custom.so")
    );
    assert_eq!(
        c.serving.providers["a"].timeout,
        Duration::from_millis(1500)
    );
    assert_eq!(
        c.serving.providers["b"].timeout,
        crate::routing::config::DEFAULT_TIMEOUT
    );
    assert_eq!(c.serving.providers["a"].api_key.expose(), "secret-KEY_A");
    assert_eq!(
        c.serving.providers["b"].settings["rapidapi_host"],
        "x.example"
    );
    let sv = &c.serving.platforms["shortvideo"];
    assert_eq!(sv.order(Endpoint::Profile), ["a", "b"]);
    assert_eq!(sv.order(Endpoint::Search), ["b"]);
    assert_eq!(c.serving.platforms["later"].status, PlatformStatus::Planned);
}

/// A description in a scratch folder, `edit` applied to the repository's.
fn description_copy(tag: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sg-description-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("described.toml");
    std::fs::write(&path, edit(std::fs::read_to_string(SHORTVIDEO).unwrap())).unwrap();
    path
}

#[test]
fn each_platform_has_its_description_loaded_and_checked() {
    let c = parse(GOOD).unwrap();
    let sv = &c.serving.platforms["shortvideo"];
    let described = sv
        .description
        .as_ref()
        .expect("a live platform's description");
    assert_eq!(described.description.name(), "shortvideo");
    assert!(described.path.ends_with("platforms/shortvideo.toml"));
    assert!(c.serving.platforms["later"].description.is_none());

    // Relative to the config's folder.
    let copy = description_copy("relative", |text| text);
    let text = GOOD.replace(SHORTVIDEO, "described.toml");
    let at = copy.with_file_name("platforms.toml");
    let c = Config::parse(&at, &text, &env).unwrap();
    let described = c.serving.platforms["shortvideo"]
        .description
        .clone()
        .unwrap();
    assert_eq!(described.path, copy);

    let refused = |text: &str| parse(text).unwrap_err().to_string();
    // Bad: the file, the place and the reason, after the config's key.
    let bad = description_copy("bad", |text| {
        text.replacen("length = [1, 64]", "length = [9, 1]", 1)
    });
    let message = refused(&GOOD.replace(SHORTVIDEO, &bad.display().to_string()));
    assert!(
        message.starts_with("/etc/sg/platforms.toml: [platforms.shortvideo] description: "),
        "{message}"
    );
    assert!(message.contains(&bad.display().to_string()), "{message}");
    assert!(message.contains("parameters.username.length"), "{message}");
    assert!(!message.contains('\n'), "{message}");
    // Another platform's file.
    let other = description_copy("other", |text| {
        text.replace("name = \"shortvideo\"", "name = \"clipgram\"")
    });
    let message = refused(&GOOD.replace(SHORTVIDEO, &other.display().to_string()));
    assert!(message.contains("clipgram"), "{message}");
    // Missing, or not named at all.
    let message = refused(&GOOD.replace(SHORTVIDEO, "/nowhere/sv.toml"));
    assert!(
        message.contains("/nowhere/sv.toml: cannot be read"),
        "{message}"
    );
    let unnamed = GOOD.replace(&format!("description = \"{SHORTVIDEO}\""), "");
    let message = refused(&unnamed);
    assert!(
        message.contains("[platforms.shortvideo]: a live platform needs `description"),
        "{message}"
    );
    // An endpoint order for an endpoint the file does not describe.
    let no_search = description_copy("no-search", |text| {
        let at = text.find("name = \"search\"").unwrap();
        let start = text[..at].rfind("[[endpoints]]").unwrap();
        let end = text[at..].find("[[").map_or(text.len(), |i| at + i);
        format!("{}{}", &text[..start], &text[end..])
    });
    let message = refused(&GOOD.replace(SHORTVIDEO, &no_search.display().to_string()));
    assert!(
        message.contains("[platforms.shortvideo] endpoints.search: the platform's description"),
        "{message}"
    );
}

#[test]
fn errors_are_one_line_naming_file_and_reason() {
    let cases = [
        (GOOD.replace("search = [\"b\"]", "serch = [\"b\"]"), "serch"),
        (GOOD.replace("\"live\"", "\"alive\""), "alive"),
        (GOOD.replace("127.0.0.1:0", "localhost"), "listen"),
        (GOOD.replace("http://127.0.0.1:1", "ftp://x"), "base_url"),
        ("[server\n".to_string(), "platforms.toml:1:"),
        (
            with_server_line("cursor_ttl_s = 0"),
            "cursor_ttl_s: must be 1-",
        ),
        (
            with_server_line("cursor_key_previous_env = \"KEY_CURSOR_OLD\""),
            "cursor_key_previous_env: needs `cursor_key_env` too",
        ),
        (
            with_server_line("cursor_key_env = \"KEY_A\""),
            "`KEY_A` must hold at least 32 characters",
        ),
        (
            GOOD.replace("KEY_B", "sk_live_9f8a7b"),
            "the environment variable it names (not repeated",
        ),
        (GOOD.replace("KEY_B", "KEY_BLANK"), "`KEY_BLANK` is empty"),
        (
            GOOD.replace("KEY_B", "AKIAIOSFODNN7EXAMPLE"),
            "the environment variable it names (not repeated",
        ),
        // An editor's save in place, caught half way.
        (String::new(), "[platforms]: no platform is configured"),
        (
            "[server]\nlisten = \"127.0.0.1:0\"\n".to_string(),
            "no platform is configured",
        ),
    ];
    for (text, needle) in cases {
        let message = parse(&text).unwrap_err().to_string();
        assert!(message.starts_with("/etc/sg/platforms.toml"), "{message}");
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
        assert!(!message.contains('\n'), "{message:?}");
        assert!(!message.contains("secret-"), "{message:?}");
        assert!(!message.contains("sk_live"), "{message:?}");
    }
}

#[test]
fn secrets_are_redacted_in_debug_output() {
    let c = parse(GOOD).unwrap();
    assert!(format!("{c:?}").contains("api_key: <redacted>"), "{c:?}");
    assert!(!format!("{c:?}").contains("secret-"), "{c:?}");
    let bad = GOOD.replace("https://example.test/api/", "ftp://u:topsecret@x");
    assert!(!parse(&bad).unwrap_err().to_string().contains("topsecret"));
}

#[test]
fn a_base_url_takes_no_credentials_query_fragment_or_port_0() {
    for (base_url, part) in [
        ("https://u:topsecret@example.test/", "a user or password"),
        ("https://u@example.test/", "a user or password"),
        ("https://example.test/api?key=topsecret", "a query"),
        ("https://example.test/api#topsecret", "a fragment"),
        ("https://example.test:0/api/", "port 0"),
    ] {
        let bad = GOOD.replace("https://example.test/api/", base_url);
        let message = parse(&bad).unwrap_err().to_string();
        assert!(message.contains("base_url: has "), "{message}");
        assert!(message.contains(part), "{message}");
        assert!(!message.contains("topsecret"), "{message}");
    }
}

/// `GOOD` with `line` added to its `[server]` table.
fn with_server_line(line: &str) -> String {
    GOOD.replacen("[server]\n", &format!("[server]\n{line}\n"), 1)
}

#[test]
fn every_process_setting_needs_a_restart() {
    let cases = [
        (
            "[server] admin_listen",
            with_server_line("admin_listen = \"off\""),
        ),
        (
            "[server] header_timeout_ms",
            with_server_line("header_timeout_ms = 5000"),
        ),
        (
            "[server] max_header_bytes",
            with_server_line("max_header_bytes = 9000"),
        ),
        (
            "[server] shutdown_grace_ms",
            with_server_line("shutdown_grace_ms = 5"),
        ),
        (
            "[server] max_concurrent_requests",
            with_server_line("max_concurrent_requests = 5"),
        ),
        (
            "[server] max_connections",
            with_server_line("max_connections = 5"),
        ),
        (
            "[server] write_timeout_ms",
            with_server_line("write_timeout_ms = 500"),
        ),
        (
            "[server] state_dir",
            with_server_line("state_dir = \"elsewhere\""),
        ),
        (
            "[server] cursor_key_env",
            with_server_line("cursor_key_env = \"KEY_CURSOR\""),
        ),
        (
            "[server] cursor_ttl_s",
            with_server_line("cursor_ttl_s = 60"),
        ),
        (
            "[server] upstream_proxy",
            with_server_line("upstream_proxy = \"http://proxy.example:3128\""),
        ),
        (
            "[server] log_format",
            with_server_line("log_format = \"json\""),
        ),
        (
            "[ledger] path",
            format!("{GOOD}\n[ledger]\npath = \"other.db\"\n"),
        ),
        (
            "[cache] max_bytes",
            format!("{GOOD}\n[cache]\nmax_bytes = 1024\n"),
        ),
    ];
    let base = parse(GOOD).unwrap().process;
    for (key, text) in &cases {
        let changed = parse(text).unwrap().process;
        assert_eq!(base.changed_settings(&changed), [*key], "{key}");
        assert_eq!(changed.changed_settings(&base), [*key], "{key}, back");
    }
    // A redis backend needs a cursor key.
    let keyed = with_server_line("cursor_key_env = \"KEY_CURSOR\"");
    let shared = format!("{keyed}\n[state]\nbackend = \"redis\"\nurl_env = \"KEY_REDIS\"\n");
    let (keyed, shared) = (parse(&keyed).unwrap(), parse(&shared).unwrap());
    assert_eq!(keyed.process.changed_settings(&shared.process), ["[state]"]);
    // The previous cursor key only exists beside a current one.
    let current = parse(&with_server_line("cursor_key_env = \"KEY_CURSOR\"")).unwrap();
    let both = parse(&with_server_line(
        "cursor_key_env = \"KEY_CURSOR\"\ncursor_key_previous_env = \"KEY_CURSOR_OLD\"",
    ))
    .unwrap();
    assert_eq!(
        current.process.changed_settings(&both.process),
        ["[server] cursor_key_previous_env"]
    );
    // TLS files come in pairs; a new path for either needs a restart (their
    // contents are followed while serving).
    let tls = |cert: &str| {
        parse(&with_server_line(&format!(
            "tls_cert = \"{cert}\"\ntls_key = \"key.pem\""
        )))
        .unwrap()
        .process
    };
    assert_eq!(
        base.changed_settings(&tls("cert.pem")),
        ["[server] tls_cert", "[server] tls_key"]
    );
    assert_eq!(
        tls("cert.pem").changed_settings(&tls("other.pem")),
        ["[server] tls_cert"]
    );
    let alone = parse(&with_server_line("tls_cert = \"cert.pem\"")).unwrap_err();
    assert!(alone
        .to_string()
        .contains("tls_cert and tls_key go together"));
}

#[test]
fn no_serving_setting_needs_a_restart() {
    // A live platform needs a description of its own name.
    let later = description_copy("later", |text| {
        text.replace("name = \"shortvideo\"", "name = \"later\"")
    });
    let same_elsewhere = description_copy("elsewhere", |text| text);
    let cases = [
        with_server_line("keys_file = \"other-keys.toml\""),
        with_server_line("request_timeout_ms = 1234"),
        GOOD.replace("plugin_dir = \"plugins\"", "plugin_dir = \"other\""),
        GOOD.replace("providers = [\"a\", \"b\"]", "providers = [\"b\", \"a\"]"),
        GOOD.replace("search = [\"b\"]", "search = [\"a\"]"),
        GOOD.replace(
            "\"planned\"",
            &format!(
                "\"live\"\nproviders = [\"a\"]\ndescription = \"{}\"",
                later.display()
            ),
        ),
        GOOD.replace(SHORTVIDEO, &same_elsewhere.display().to_string()),
        GOOD.replace("timeout_ms = 1500", "timeout_ms = 1600"),
        GOOD.replace(
            "timeout_ms = 1500",
            "timeout_ms = 1500\nbreaker_failures = 2",
        ),
        GOOD.replace(
            "timeout_ms = 1500",
            "timeout_ms = 1500\nbreaker_cooldown_ms = 7",
        ),
        GOOD.replace("timeout_ms = 1500", "timeout_ms = 1500\nmax_body_bytes = 7"),
        GOOD.replace("timeout_ms = 1500", "timeout_ms = 1500\nmax_in_flight = 7"),
        GOOD.replace(
            "rapidapi_host = \"x.example\"",
            "rapidapi_host = \"y.example\"",
        ),
        GOOD.replace("http://127.0.0.1:1", "http://127.0.0.1:2"),
        GOOD.replace("api_key_env = \"KEY_B\"", "api_key_env = \"KEY_A\""),
        format!("{GOOD}\n[rate_limit]\nper_second = 3\n"),
        with_server_line("max_concurrent_requests_per_key = 3"),
        format!("{GOOD}\n[billing]\nenforce = true\n"),
        format!("{GOOD}\n[billing]\nfree_credits = 3\n"),
        format!("{GOOD}\n[cache]\nenabled = false\n"),
        format!("{GOOD}\n[cache]\nnot_found_ttl_s = 0\n"),
        format!("{GOOD}\n[cache]\nstale_if_error_s = 5\n"),
        format!("{GOOD}\n[cache.ttl_s]\ncomments = 0\n"),
        format!("{GOOD}\n[server.cors]\nallowed_origins = [\"*\"]\n"),
    ];
    let base = parse(GOOD).unwrap();
    for text in &cases {
        let changed = parse(text).unwrap();
        assert!(
            changed.serving != base.serving,
            "the case changes the serving part:\n{text}"
        );
        assert_eq!(
            base.process.changed_settings(&changed.process),
            Vec::<&str>::new(),
            "{text}"
        );
    }
}

#[test]
fn a_key_s_cap_on_requests_in_flight_is_above_0_and_said_when_it_changes() {
    let e = parse(&with_server_line("max_concurrent_requests_per_key = 0"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_concurrent_requests_per_key"), "{e}");
    assert!(e.contains("must be above 0"), "{e}");
    let (none, three) = (
        parse(GOOD).unwrap(),
        parse(&with_server_line("max_concurrent_requests_per_key = 3")).unwrap(),
    );
    assert_eq!(none.serving.max_concurrent_requests_per_key, None);
    assert_eq!(three.serving.max_concurrent_requests_per_key, Some(3));
    assert_eq!(
        none.serving.changed_settings(&three.serving),
        ["[server] max_concurrent_requests_per_key"]
    );
}

#[test]
fn a_redis_backend_needs_a_shared_cursor_key() {
    let text = format!("{GOOD}\n[state]\nbackend = \"redis\"\nurl_env = \"KEY_REDIS\"\n");
    let e = parse(&text).unwrap_err().to_string();
    assert!(e.contains("cursor_key_env"), "{e}");
}

/// Scale-out review, defect 4: a URL of the right scheme that does not
/// parse says so, never quoting it (it may hold a password).
#[test]
fn a_redis_url_is_refused_for_what_is_wrong_with_it() {
    for (var, said) in [
        ("KEY_REDIS_HTTP", "must hold a redis:// or rediss:// URL"),
        ("KEY_REDIS_BAD_PORT", "holds a URL that does not parse"),
    ] {
        let keyed = with_server_line("cursor_key_env = \"KEY_CURSOR\"");
        let text = format!("{keyed}\n[state]\nbackend = \"redis\"\nurl_env = \"{var}\"\n");
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains(said), "{var}: {e}");
        assert!(!e.contains("pw-secret") && !e.contains("notaport"), "{e}");
    }
}

/// Abuse sweep: a proxy URL the client cannot use passed `check`, then
/// `serve` failed with "builder error", naming nothing.
#[test]
fn a_proxy_url_the_client_cannot_use_is_refused_without_quoting_it() {
    for proxy in [
        "http://user:PROXYSECRET5@127.0.0.1:99999",
        "http://user:PROXYSECRET5@",
        "socks5://user:PROXYSECRET5@127.0.0.1:1080",
        "http://user:PROXYSECRET5@127.0.0.1:0",
    ] {
        let text = with_server_line(&format!("upstream_proxy = \"{proxy}\""));
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("upstream_proxy"), "{proxy}: {e}");
        assert!(!e.contains("PROXYSECRET5"), "{e}");
    }
    let text = with_server_line("upstream_proxy = \"http://user:pw@127.0.0.1:3128\"");
    assert!(parse(&text).is_ok());
}

/// Cache and billing sweep: a value of the wrong type named a Rust type
/// ("expected struct RawTtls", "expected u32") and no key.
#[test]
fn a_value_of_the_wrong_type_names_its_key_and_what_was_expected() {
    for (text, said) in [
        (
            "[cache]\nttl_s = 5\n",
            "ttl_s: invalid type: integer `5`, expected the [cache.ttl_s] table",
        ),
        (
            "[billing.costs]\ncomments = -1\n",
            "comments: invalid value: integer `-1`",
        ),
        (
            "[billing]\ncosts = { comments = -1 }\n",
            "comments: invalid value",
        ),
        ("[server]\nbogus = 1\n", "unknown field `bogus`"),
    ] {
        let e = RawConfig::parse(Path::new("p.toml"), text)
            .err()
            .unwrap_or_else(|| panic!("{text:?} parsed"))
            .to_string();
        assert!(e.contains(said), "{text:?}: {e}");
        assert!(!e.contains("Raw"), "{e}");
    }
    // Diff review: never a piece of a string (a proxy's password) as a key.
    let text = "[server]\nupstream_proxy = \"http://u:p,zq9=w@h:3128\" x\n";
    let e = RawConfig::parse(Path::new("p.toml"), text)
        .err()
        .unwrap()
        .to_string();
    assert!(!e.contains("zq9"), "{e}");
}

/// A syntax error names the line it is on, the first line of a table's
/// key included (operator review: `bogus` on line 2 was called line 1).
#[test]
fn a_syntax_error_names_its_own_line() {
    for (text, line) in [
        ("[server]\nbogus = 1\n", 2),
        ("bogus = 1\n", 1),
        (
            "[server]\nlisten = \"127.0.0.1:0\"\n\n[cache]\nbogus = 1\n",
            5,
        ),
        ("[server]\nlisten = 1 2\n", 2),
    ] {
        match RawConfig::parse(Path::new("p.toml"), text) {
            Err(ConfigError::Syntax { line: at, .. }) => assert_eq!(at, line, "{text:?}"),
            Err(other) => panic!("{text:?}: {other}"),
            Ok(_) => panic!("{text:?} parsed"),
        }
    }
}

#[test]
fn key_commands_read_their_sections_whatever_is_wrong_elsewhere() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let path = dir.join("platforms.toml");
    let load = |text: &str| {
        std::fs::write(&path, text).unwrap();
        KeyFiles::load(&path)
    };
    let files = load(GOOD).unwrap();
    assert!(files.elsewhere.is_none());
    assert_eq!(files.keys_file, dir.join("keys.toml"));
    // Mid-edit elsewhere (a table cut short): read, and what is wrong is
    // said.
    assert!(
        load(&GOOD.replace("[platforms.shortvideo]\n", ""))
            .unwrap()
            .elsewhere
            .is_some(),
        "a table cut short"
    );
    // Wrong in what the commands read, or not TOML at all: refused.
    assert!(load(&format!("{GOOD}\n[ledger]\npath = 5\n")).is_err());
    assert!(load(&format!("{GOOD}\n[billing]\nfree_credits = \"x\"\n")).is_err());
    assert!(load("[server\n").is_err());
}

/// Operator sweep: `per_second = 1e-300` passed `check`, then every keyed
/// request panicked making a `Duration` of its wait, and answered 500.
#[test]
fn a_rate_too_slow_to_say_when_is_refused_and_the_slowest_allowed_works() {
    for rate in ["0", "-1", "1e-300", "0.0000009", "nan", "inf"] {
        let text = format!("{GOOD}\n[rate_limit]\nper_second = {rate}\nburst = 1\n");
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("[rate_limit] per_second"), "{rate}: {e}");
    }
    let text = format!("{GOOD}\n[rate_limit]\nper_second = 0.000001\nburst = 1\n");
    let limit = parse(&text).unwrap().serving.rate_limit.expect("a limit");
    let limiter = crate::resilience::rate_limit::RateLimiter::new(limit);
    let now = tokio::time::Instant::now();
    limiter.check("a", now).expect("the burst's one token");
    let wait = limiter.check("a", now).expect_err("no token left");
    assert_eq!(wait.as_secs(), 1_000_000);
}

/// Operator sweep: `check` passed a ledger path `serve` then could not
/// open, with an error naming neither the config nor the key.
#[test]
fn a_ledger_path_that_is_empty_or_a_folder_is_refused_naming_the_key() {
    let folder = std::env::temp_dir().display().to_string();
    for path in ["", &folder] {
        let text = format!("{GOOD}\n[ledger]\npath = \"{path}\"\n");
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("[ledger] path"), "{path:?}: {e}");
    }
    let text = format!("{GOOD}\n[ledger]\npath = \"usage-2.db\"\n");
    assert!(parse(&text).is_ok());
}

/// Operator sweep: errors that named no key, or the wrong problem.
#[test]
fn a_config_error_names_the_key_and_the_problem() {
    let cases = [
        (
            GOOD.replace("http://127.0.0.1:1", "http://127.0.0.1:99999"),
            "base_url: not an http:// or https:// URL with a valid host and port",
        ),
        (
            GOOD.replacen("library = \"shortvideo_primary\"", "library = \"\"", 1),
            "library: is empty",
        ),
        (
            format!("{GOOD}\n[billing]\nfree_credits = 99999999999999999999\n"),
            "free_credits: number too large",
        ),
        (
            with_server_line("upstream_proxy = \"http://u:PROXYSECRET6@p:3128/x?y=1\""),
            "upstream_proxy: has a path, query or fragment",
        ),
    ];
    for (text, said) in cases {
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains(said), "{said}: {e}");
        assert!(!e.contains("PROXYSECRET6"), "{e}");
    }
    assert!(parse(&with_server_line(
        "upstream_proxy = \"http://u:pw@p:3128/\""
    ))
    .is_ok());
}

/// Operator sweep: a provider no chain names was loaded without a word.
#[test]
fn providers_in_no_chain_are_found() {
    assert!(parse(GOOD)
        .unwrap()
        .serving
        .unchained_providers()
        .is_empty());
    let text = format!(
        "{GOOD}\n[providers.spare]\nlibrary = \"x\"\nbase_url = \"http://h\"\napi_key_env = \"KEY_A\"\n"
    );
    assert_eq!(
        parse(&text).unwrap().serving.unchained_providers(),
        ["spare"]
    );
    // Named only by an endpoint's own chain: chained.
    let text = GOOD.replace("providers = [\"a\", \"b\"]", "providers = [\"a\"]");
    assert!(parse(&text)
        .unwrap()
        .serving
        .unchained_providers()
        .is_empty());
}

/// Operator sweep: `./state` in a config read by a relative path, then the
/// same folder written in full, read as a change of `state_dir` needing a
/// restart.
#[test]
fn paths_resolve_to_one_spelling() {
    let cwd = std::env::current_dir().unwrap();
    let read = |state_dir: &str| {
        let text = with_server_line(&format!("state_dir = \"{state_dir}\""));
        Config::parse(Path::new("platforms.toml"), &text, &env).unwrap()
    };
    let dotted = read("./state");
    let full = read(&cwd.join("state").display().to_string());
    assert_eq!(dotted.process.state_dir, cwd.join("state"));
    assert!(dotted.process.changed_settings(&full.process).is_empty());
    assert_eq!(read(".").process.state_dir, cwd);
}
