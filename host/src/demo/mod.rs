//! `socialgate demo`: the real host and the real plugins, pointed at
//! in-process [`sandbox`] upstreams that imitate both providers, with a
//! fresh demo key, so a newcomer sees the whole service with one command.

pub mod sandbox;

use std::net::SocketAddr;
use std::path::Path;

use crate::auth::KeysFileAt;
use crate::config::{executable_dir, toml_string, Config};
use crate::lifecycle::{self, RunError};
use sandbox::Sandbox;

const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The variables the demo's config names for the sandbox upstreams' keys.
const PRIMARY_KEY_ENV: &str = "SANDBOX_PRIMARY_KEY";
const FALLBACK_KEY_ENV: &str = "SANDBOX_FALLBACK_KEY";

/// Sets the variables the demo's config names to the sandbox's keys. Call
/// it before any thread starts: the environment is process-wide, and a
/// reload of the demo's config reads it like any other.
pub fn set_sandbox_keys() {
    std::env::set_var(PRIMARY_KEY_ENV, sandbox::PRIMARY_KEY);
    std::env::set_var(FALLBACK_KEY_ENV, sandbox::FALLBACK_KEY);
}

/// Serves the demo until SIGTERM or ctrl-c; [`set_sandbox_keys`] first.
pub async fn run(listen: Option<SocketAddr>, fail_primary: bool) -> Result<(), RunError> {
    let sandbox = Sandbox::start(fail_primary).await?;
    let exe_dir = executable_dir()?;
    // Beside the executable, not /tmp, which may forbid mapping libraries.
    let state_dir = exe_dir.join("socialgate-demo");
    std::fs::create_dir_all(&state_dir)?;
    let config_path = state_dir.join("platforms.toml");
    std::fs::write(&config_path, demo_config(&sandbox, &exe_dir, listen))?;
    let config = Config::load(&config_path)?;

    let keys_file = &config.serving.keys_file;
    match std::fs::remove_file(keys_file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let key = KeysFileAt(keys_file).issue("demo")?;

    lifecycle::serve(config, None, |addr| {
        print_welcome(&format!("http://{addr}"), &key, fail_primary)
    })
    .await?;
    drop(sandbox);
    Ok(())
}

/// The demo's `platforms.toml`: the operator's own config, pointed at the
/// sandbox, with a short breaker cooldown so `--fail-primary` shows the
/// breaker opening and closing. Everything else is the parser's defaults.
fn demo_config(sandbox: &Sandbox, plugin_dir: &Path, listen: Option<SocketAddr>) -> String {
    let listen = listen.map_or(DEFAULT_LISTEN.to_owned(), |a| a.to_string());
    let plugin_dir = toml_string(&plugin_dir.display().to_string());
    let providers = [
        ("shortvideo-primary", &sandbox.primary_url, PRIMARY_KEY_ENV),
        (
            "shortvideo-fallback",
            &sandbox.fallback_url,
            FALLBACK_KEY_ENV,
        ),
    ]
    .map(|(name, url, key_env)| {
        format!(
            "[providers.{name}]\nlibrary = \"{library}\"\nbase_url = {url}\n\
             api_key_env = \"{key_env}\"\nbreaker_failures = 3\nbreaker_cooldown_ms = 10000\n",
            library = name.replace('-', "_"),
            url = toml_string(url),
        )
    })
    .join("\n");
    format!(
        r#"# Written by `socialgate demo` for this run; changes to it are reloaded.
[server]
listen = "{listen}"
admin_listen = "127.0.0.1:0"
plugin_dir = {plugin_dir}

[platforms.shortvideo]
status = "live"
providers = ["shortvideo-primary", "shortvideo-fallback"]

[platforms.shortvideo.endpoints]
search = ["shortvideo-fallback"]

{providers}"#
    )
}

fn print_welcome(base: &str, key: &str, fail_primary: bool) {
    let user = Sandbox::known_usernames()[0];
    let post = Sandbox::known_post_ids()[0];
    let lines = [
        String::new(),
        format!("demo API key: {key}"),
        if fail_primary {
            "the sandbox primary is failing: every answer comes from the fallback".into()
        } else {
            "run with --fail-primary to watch failover".into()
        },
        String::new(),
        "try:".into(),
        format!("  curl -s -H 'X-API-Key: {key}' '{base}/v1/shortvideo/profile?username={user}'"),
        format!(
            "  curl -s -H 'X-API-Key: {key}' '{base}/v1/shortvideo/posts?username={user}&count=5'"
        ),
        format!("  curl -s -H 'X-API-Key: {key}' '{base}/v1/shortvideo/post?id={post}'"),
        format!(
            "  curl -s -H 'X-API-Key: {key}' '{base}/v1/shortvideo/comments?id={post}&count=60'"
        ),
        format!("  curl -s -H 'X-API-Key: {key}' '{base}/v1/shortvideo/search?query=luna'"),
        format!(
            "  curl -s -H 'X-API-Key: {key}' '{base}/v1/shortvideo/profile?username=nobody_here'"
        ),
        String::new(),
    ];
    let mut stdout = std::io::stdout().lock();
    for line in lines {
        let _ = std::io::Write::write_all(&mut stdout, format!("{line}\n").as_bytes());
    }
    let _ = std::io::Write::flush(&mut stdout);
}
