//! Files the server trusts (audit finding 8): the private copies of plugin
//! libraries are created 0600 in a 0700 folder whatever the umask, and a
//! link planted where a copy or its temporary file goes is never followed;
//! a config file, keys file or plugin folder that its group or others may
//! write to is warned about at start and at every reload. (The keys file's
//! own temporary file is the `keys` commands' concern: see `cli.rs`.)

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use socialgate_tests::config::{standard_env, ConfigBuilder};
use socialgate_tests::operator::{log_line_within, signal};
use socialgate_tests::reload::{log_lines, mapped_files, wait_for_log, APPLIED};
use socialgate_tests::{issue_key, paths, Api, Config, Server};

/// What the server logs about a file others could change.
const LOOSE: &str = "is writable by";

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// The entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a folder entry").path())
        .collect();
    all.sort();
    all
}

/// The private copy in `dir` of the library whose file name starts `stem`.
fn copy_of(dir: &Path, stem: &str) -> PathBuf {
    entries(dir)
        .into_iter()
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{stem}-")) && n.ends_with(".so"))
        })
        .unwrap_or_else(|| panic!("no copy of {stem} in {}", dir.display()))
}

#[tokio::test]
async fn trusted_files_private_copies_are_0600_in_a_0700_folder_whatever_the_umask() {
    paths::require_plugin("shortvideo_primary");
    paths::require_plugin("shortvideo_fallback");
    let config = ConfigBuilder::unreached().write();
    let server = Server::start_after(&config, &standard_env(), "umask 000");
    let state = config.dir().join("state");
    let copies = state.join("plugins");
    assert_eq!(mode(&state), 0o700, "the state folder");
    assert_eq!(mode(&copies), 0o700, "the copies' folder");
    let all = entries(&copies);
    assert_eq!(all.len(), 2, "one copy per library: {all:?}");
    for copy in &all {
        assert_eq!(mode(copy), 0o600, "{}", copy.display());
    }
    let ready = Api::new(&server.base_url(), None).get("/readyz").await;
    assert_eq!(ready.status, 200, "{ready:?}");
}

#[tokio::test]
async fn trusted_files_a_link_planted_where_a_private_copy_goes_is_not_followed() {
    paths::require_plugin("shortvideo_primary");
    paths::require_plugin("shortvideo_fallback");
    let config = ConfigBuilder::unreached().write();
    let copies = config.dir().join("state/plugins");
    // A first run names the copies (their names hold a content hash).
    let mut first = Server::start(&config);
    let primary_copy = copy_of(&copies, "libshortvideo_primary");
    let fallback_copy = copy_of(&copies, "libshortvideo_fallback");
    first.kill();
    std::fs::remove_file(&primary_copy).unwrap();
    std::fs::remove_file(&fallback_copy).unwrap();

    // Where the primary's copy goes, a link to a file with the very same
    // content, outside the state folder: it must not be trusted (whoever
    // owns its target could change the code the server maps).
    let elsewhere = config.dir().join("elsewhere.so");
    std::fs::copy(paths::plugin_library("shortvideo_primary"), &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &primary_copy).unwrap();
    // Where the fallback's temporary file goes (its name holds the server's
    // PID), a link to a file that must not be overwritten.
    let victim = config.dir().join("victim.txt");
    std::fs::write(&victim, "keep me\n").unwrap();
    let fallback_name = fallback_copy.file_name().unwrap().to_str().unwrap();
    let stem = fallback_name.strip_suffix(".so").unwrap();
    let prelude = format!(
        "ln -s '{}' '{}'/.{stem}.$$.tmp",
        paths::display(&victim),
        paths::display(&copies)
    );
    let server = Server::start_after(&config, &standard_env(), &prelude);

    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"keep me\n",
        "the planted temporary link's target is untouched"
    );
    assert_eq!(
        std::fs::read(&elsewhere).unwrap(),
        std::fs::read(paths::plugin_library("shortvideo_primary")).unwrap(),
        "the planted copy link's target is untouched"
    );
    for copy in [&primary_copy, &fallback_copy] {
        let meta = std::fs::symlink_metadata(copy).unwrap();
        assert!(
            meta.file_type().is_file(),
            "{} is the server's own file, not a link",
            copy.display()
        );
        assert_eq!(mode(copy), 0o600, "{}", copy.display());
    }
    let mapped = mapped_files(server.pid());
    assert!(
        !mapped.contains(&elsewhere),
        "the link's target is not mapped: {mapped:?}"
    );
    assert!(mapped.contains(&primary_copy), "{mapped:?}");
    let ready = Api::new(&server.base_url(), None).get("/readyz").await;
    assert_eq!(ready.status, 200, "the load still works: {ready:?}");
}

#[tokio::test]
async fn trusted_files_group_writable_config_keys_and_plugin_folder_are_warned_at_start_and_on_reload(
) {
    let plugins = paths::scratch_dir();
    for name in ["shortvideo_primary", "shortvideo_fallback"] {
        paths::require_plugin(name);
        let library = paths::plugin_library(name);
        std::fs::copy(&library, plugins.path().join(library.file_name().unwrap())).unwrap();
    }
    let config: Config = ConfigBuilder::unreached()
        .plugin_dir(plugins.path())
        .write();
    let key = issue_key(&config, "alice");
    let loose = [
        (config.path().to_owned(), 0o664),
        (config.keys_file(), 0o620),
        (plugins.path().to_owned(), 0o775),
    ];
    for (path, mode) in &loose {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode)).unwrap();
    }

    let server = Server::start(&config);
    let within = Duration::from_secs(5);
    for (path, _) in &loose {
        let path = path.display().to_string();
        let line = log_line_within(&server, &[LOOSE, "group", &path], within).await;
        assert!(line.contains("WARN"), "a warning: {line}");
    }

    signal(&server, "HUP");
    wait_for_log(&server, APPLIED, 1).await;
    for (path, _) in &loose {
        let path = path.display().to_string();
        let seen = log_lines(&server, LOOSE)
            .iter()
            .filter(|l| l.contains(&path))
            .count();
        assert_eq!(seen, 2, "{path}: warned at start and on the reload");
    }
    let stderr = server.stderr();
    assert_eq!(
        log_lines(&server, LOOSE).len(),
        6,
        "nothing else is warned about:\n{stderr}"
    );
    assert!(!stderr.contains(&key), "no key in the log");
}
