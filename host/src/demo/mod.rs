//! `socialgate demo`: the real host and the real plugins, pointed at
//! in-process [`sandbox`] upstreams that imitate both providers, with a
//! fresh demo key, so a newcomer sees the whole service with one command.
//! Each run writes its files in a folder of its own (`RunDir`), so runs
//! side by side never share a config, a key or a ledger.

pub mod sandbox;

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::auth::KeysFileAt;
use crate::config::{toml_string, Config};
use crate::lifecycle::{self, RunError};
use crate::plugins::executable_dir;
use sandbox::Sandbox;

const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The variables the demo's config names for the sandbox upstreams' keys.
const PRIMARY_KEY_ENV: &str = "SANDBOX_PRIMARY_KEY";
const FALLBACK_KEY_ENV: &str = "SANDBOX_FALLBACK_KEY";

/// The folder of platform descriptions the repository ships, and the
/// description the demo serves from it.
const PLATFORMS_DIR: &str = "platforms";
const DESCRIPTION: &str = "shortvideo.toml";

/// The folder beside the executable that holds one folder per demo run.
const RUNS_DIR: &str = "socialgate-demo";
/// A run's folder is this prefix and the run's process ID: a name that
/// says, to the next start, whether its owner is still alive.
const RUN_PREFIX: &str = "run-";

/// Sets the variables the demo's config names to the sandbox's keys. Call
/// it before any thread starts: the environment is process-wide, and a
/// reload of the demo's config reads it like any other.
pub fn set_sandbox_keys() {
    std::env::set_var(PRIMARY_KEY_ENV, sandbox::PRIMARY_KEY);
    std::env::set_var(FALLBACK_KEY_ENV, sandbox::FALLBACK_KEY);
}

/// Why the demo could not set up its files.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{path}: cannot create the demo's folder: {source}")]
    Folder { path: PathBuf, source: io::Error },
    #[error("{path}: cannot remove what an earlier demo run left there: {source}")]
    Leftover { path: PathBuf, source: io::Error },
    #[error("{path}: cannot write the demo's config: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error(
        "no `{PLATFORMS_DIR}/{DESCRIPTION}` in {from} or a folder above it: the demo serves the \
         description the repository ships; run a build inside the repository (target/debug), \
         or put the repository's `{PLATFORMS_DIR}` folder beside the executable"
    )]
    NoDescription { from: PathBuf },
    #[error("{path}: cannot copy the platform's description for the demo: {source}")]
    CopyDescription { path: PathBuf, source: io::Error },
}

impl From<DemoError> for RunError {
    fn from(e: DemoError) -> RunError {
        RunError::Io(io::Error::other(e))
    }
}

/// Serves the demo until SIGTERM or ctrl-c; [`set_sandbox_keys`] first.
pub async fn run(listen: Option<SocketAddr>, fail_primary: bool) -> Result<(), RunError> {
    let sandbox = Sandbox::start(fail_primary).await?;
    let exe_dir = executable_dir()?;
    // Beside the executable, not /tmp, which may forbid mapping libraries
    // (the run's folder holds the private copies of the plugins).
    let run_dir = RunDir::create(&exe_dir.join(RUNS_DIR))?;
    copy_description(&exe_dir, &run_dir.path)?;
    let config_path = run_dir.path.join("platforms.toml");
    std::fs::write(&config_path, demo_config(&sandbox, &exe_dir, listen)).map_err(|source| {
        DemoError::Write {
            path: config_path.clone(),
            source,
        }
    })?;
    let config = Config::load(&config_path)?;
    // The run's folder is new, so the keys file holds this key alone.
    let key = KeysFileAt(&config.serving.keys_file).issue("demo")?;

    // `--listen` given: named as such if its port is taken (the run's own
    // config is no file the operator wrote).
    lifecycle::serve(config, listen, |addr| {
        print_welcome(&format!("http://{addr}"), &key, fail_primary)
    })
    .await?;
    drop(sandbox);
    drop(run_dir);
    Ok(())
}

/// Copies the platform's description into the run's folder, from the
/// nearest `platforms` folder holding it at the executable's folder or
/// above it: a build's executable is in the repository's `target/debug`,
/// and the description is data the repository ships, never compiled in.
/// A copy, so the run's files are one folder, like its config.
fn copy_description(exe_dir: &Path, run_dir: &Path) -> Result<(), DemoError> {
    let found = exe_dir
        .ancestors()
        .map(|dir| dir.join(PLATFORMS_DIR).join(DESCRIPTION))
        .find(|file| file.is_file())
        .ok_or_else(|| DemoError::NoDescription {
            from: exe_dir.to_owned(),
        })?;
    let to = run_dir.join(DESCRIPTION);
    std::fs::copy(&found, &to)
        .map(|_| ())
        .map_err(|source| DemoError::CopyDescription {
            path: found,
            source,
        })
}

/// One run's own folder: its config, keys file, usage ledger and plugin
/// copies. Shared with another run, each would reload the other's config
/// and count into the other's ledger; kept after the run, the next one
/// would start with credits already used. So each run has its own, named
/// after its process ID, and removes it when it ends (dropped, on every
/// way out of [`run`] but a crash); the next start removes what crashed
/// runs left.
struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Removes the folders of runs whose process is gone, then creates
    /// this run's in `runs`.
    fn create(runs: &Path) -> Result<RunDir, DemoError> {
        let folder = |path: &Path| {
            let path = path.to_owned();
            move |source| DemoError::Folder { path, source }
        };
        crate::files::create_private_dir_all(runs).map_err(folder(runs))?;
        remove_dead_runs(runs);
        let pid = std::process::id();
        let path = runs.join(run_name(pid));
        // A folder with this process's ID was left by a run that died: the
        // ID has been reused since.
        remove_all(&path).map_err(|source| DemoError::Leftover {
            path: path.clone(),
            source,
        })?;
        crate::files::create_private_dir_all(&path).map_err(folder(&path))?;
        tracing::info!(folder = %path.display(), "the demo's files, removed when it ends");
        Ok(RunDir { path })
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if let Err(e) = remove_all(&self.path) {
            tracing::warn!(folder = %self.path.display(), "cannot remove the demo's folder: {e}");
        }
    }
}

fn run_name(pid: u32) -> String {
    format!("{RUN_PREFIX}{pid}")
}

/// The process ID a run folder's name holds, for names [`run_name`] makes
/// and nothing else (no sign, no leading zero): anything else in `runs` is
/// not ours to remove.
fn run_pid(name: &str) -> Option<u32> {
    let pid: u32 = name.strip_prefix(RUN_PREFIX)?.parse().ok()?;
    (pid != 0 && run_name(pid) == name).then_some(pid)
}

/// Removes the run folders in `runs` whose process no longer exists. A
/// folder that cannot be removed is logged and left: it costs disk space,
/// not this run's start.
fn remove_dead_runs(runs: &Path) {
    let entries = match std::fs::read_dir(runs) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(folder = %runs.display(), "cannot list earlier demo runs: {e}");
            return;
        }
    };
    let me = std::process::id();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(run_pid) else {
            continue;
        };
        // Never through a link: only a real folder is a run's.
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if pid == me || !is_dir || process_exists(pid) {
            continue;
        }
        let path = entry.path();
        match remove_all(&path) {
            Ok(()) => tracing::info!(folder = %path.display(), "removed a dead demo run's folder"),
            Err(e) => {
                tracing::warn!(folder = %path.display(), "cannot remove a dead demo run's folder: {e}")
            }
        }
    }
}

/// Removes `path` and everything in it; already gone is success (another
/// demo starting at the same time may be removing it too).
fn remove_all(path: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(_) if !path_exists(path) => Ok(()),
        Err(e) => Err(e),
    }
}

fn path_exists(path: &Path) -> bool {
    !matches!(std::fs::symlink_metadata(path), Err(e) if e.kind() == io::ErrorKind::NotFound)
}

/// Whether a process with ID `pid` exists (a zombie counts). Any doubt
/// answers yes: a leftover folder kept costs disk space, a running demo's
/// folder removed breaks that demo.
fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    if pid == 0 {
        // To kill, 0 is this process's group, not one process.
        return true;
    }
    // SAFETY: signal 0 is never delivered: kill only checks that the
    // process exists and may be signalled.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    // EPERM: it exists, and belongs to someone else.
    io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
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
        r#"# Written by `socialgate demo` for this run and removed when it ends;
# changes to it are reloaded.
[server]
listen = "{listen}"
admin_listen = "127.0.0.1:0"
plugin_dir = {plugin_dir}

[platforms.shortvideo]
status = "live"
providers = ["shortvideo-primary", "shortvideo-fallback"]
description = "{DESCRIPTION}"   # copied from the repository's platforms folder

[platforms.shortvideo.endpoints]
search = ["shortvideo-fallback"]

{providers}"#
    )
}

fn print_welcome(base: &str, key: &str, fail_primary: bool) {
    let (user, post) = Sandbox::example();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_a_run_makes_hold_a_process_id() {
        let table: &[(&str, Option<u32>)] = &[
            ("run-1", Some(1)),
            ("run-4194304", Some(4_194_304)),
            ("run-0", None),
            ("run-042", None),
            ("run-+42", None),
            ("run--42", None),
            ("run-", None),
            ("run-42x", None),
            ("run-4294967296", None),
            ("42", None),
            ("platforms.toml", None),
            ("Run-42", None),
        ];
        for (name, pid) in table {
            assert_eq!(run_pid(name), *pid, "{name}");
        }
        assert_eq!(
            run_pid(&run_name(std::process::id())),
            Some(std::process::id())
        );
    }

    #[test]
    fn ids_that_are_no_one_process_count_as_alive() {
        // Beyond pid_t (as one, -1: every process), and 0 (this process's
        // group): never asked about.
        assert!(process_exists(u32::MAX));
        assert!(process_exists(0));
    }
}
