//! `socialgate demo`: the real host and the real plugins, pointed at
//! in-process [`sandbox`] upstreams that imitate both providers, with a
//! fresh demo key, so a newcomer sees the whole service with one command.

pub mod sandbox;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use plugin_api::Endpoint;

use crate::auth::{KeysError, KeysFileAt};
use crate::config::{
    executable_dir, library_path, Config, PlatformConfig, PlatformStatus, ProviderConfig, Secret,
    ServerConfig, ServerLimits,
};
use crate::http::server;
use crate::resilience::breaker::BreakerConfig;
use crate::serve::{self, ServeError};
use sandbox::Sandbox;

const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    Keys(#[from] KeysError),
    #[error("demo: {0}")]
    Io(#[from] std::io::Error),
}

pub async fn run(listen: Option<SocketAddr>, fail_primary: bool) -> Result<(), DemoError> {
    let sandbox = Sandbox::start(fail_primary).await?;
    let exe_dir = executable_dir()?;
    // Beside the executable, not /tmp, which may forbid mapping libraries.
    let state_dir = exe_dir.join("socialgate-demo");
    let keys_file = state_dir.join(crate::config::DEFAULT_KEYS_FILE);
    match std::fs::remove_file(&keys_file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let key = KeysFileAt(&keys_file).issue("demo")?;

    let config = demo_config(&sandbox, exe_dir, state_dir, keys_file, listen);
    let shutdown = server::shutdown_signal()?;
    let (listener, app) = serve::start(config, None).await?;
    let base = format!("http://{}", listener.local_addr()?);
    print_welcome(&base, &key, fail_primary);
    server::run(listener, app, shutdown).await;
    drop(sandbox);
    Ok(())
}

fn demo_config(
    sandbox: &Sandbox,
    plugin_dir: PathBuf,
    state_dir: PathBuf,
    keys_file: PathBuf,
    listen: Option<SocketAddr>,
) -> Config {
    let provider = |library: &str, base_url: &str, key: &str| ProviderConfig {
        library: library_path(library, &plugin_dir, &plugin_dir),
        base_url: base_url.to_owned(),
        api_key: Secret::new(key.to_owned()),
        timeout: Duration::from_secs(4),
        settings: serde_json::json!({}),
        // Short, so `--fail-primary` shows the breaker opening and closing.
        breaker: BreakerConfig {
            failures: 3,
            cooldown: Duration::from_secs(10),
        },
        max_body_bytes: crate::upstream::DEFAULT_MAX_BODY_BYTES,
    };
    let providers = BTreeMap::from([
        (
            "shortvideo-primary".to_owned(),
            provider(
                "shortvideo_primary",
                &sandbox.primary_url,
                sandbox::PRIMARY_KEY,
            ),
        ),
        (
            "shortvideo-fallback".to_owned(),
            provider(
                "shortvideo_fallback",
                &sandbox.fallback_url,
                sandbox::FALLBACK_KEY,
            ),
        ),
    ]);
    let platforms = BTreeMap::from([(
        "shortvideo".to_owned(),
        PlatformConfig {
            status: PlatformStatus::Live,
            providers: vec!["shortvideo-primary".into(), "shortvideo-fallback".into()],
            endpoints: BTreeMap::from([(Endpoint::Search, vec!["shortvideo-fallback".into()])]),
        },
    )]);
    let ledger_path = state_dir.join(crate::config::DEFAULT_LEDGER_FILE);
    Config {
        path: PathBuf::from("(demo)"),
        server: ServerConfig {
            listen: listen.unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("a valid address")),
            keys_file,
            plugin_dir,
            state_dir,
            cursor_key: None,
            upstream_proxy: None,
            limits: ServerLimits::default(),
            admin_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            log_format: Default::default(),
        },
        platforms,
        providers,
        rate_limit: None,
        ledger_path,
        billing: Default::default(),
    }
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
