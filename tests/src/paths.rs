//! Where the build put the binary and the plugin libraries, and scratch
//! folders for each test.

use std::path::{Path, PathBuf};

/// The cargo profile folder the tests were built into (`target/debug`).
///
/// Test executables live in `target/debug/deps/`, so it is two levels up
/// from the running test.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    let deps = exe.parent().expect("the test executable is in a folder");
    let dir = if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().expect("deps/ is inside the profile folder")
    } else {
        deps
    };
    dir.to_path_buf()
}

/// The `socialgate` binary. Panics with the fix when it was not built.
pub fn socialgate_bin() -> PathBuf {
    let bin = target_dir().join(format!("socialgate{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build --workspace` before the tests",
        bin.display()
    );
    bin
}

/// A plugin library by its library name (`shortvideo_primary`).
pub fn plugin_library(name: &str) -> PathBuf {
    let file = format!(
        "{}{name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    target_dir().join(file)
}

/// Panics with the fix when a plugin library was not built.
pub fn require_plugin(name: &str) {
    let path = plugin_library(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace` before the tests",
        path.display()
    );
}

/// A fresh folder for one test, removed when dropped.
///
/// It lives under the target folder, not the system temp folder: the server
/// loads plugin copies from its state folder, and `/tmp` may be `noexec`.
pub fn scratch_dir() -> tempfile::TempDir {
    let base = target_dir().join("sg-tests");
    std::fs::create_dir_all(&base).expect("can create the scratch base folder");
    tempfile::Builder::new()
        .prefix("case-")
        .tempdir_in(&base)
        .expect("can create a scratch folder")
}

/// `path` as a string for a config file.
pub fn display(path: &Path) -> String {
    path.to_str().expect("test paths are UTF-8").to_owned()
}

/// The repository's folder of platform descriptions.
pub fn platforms_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../platforms")
}

/// A description for `platform`, by absolute path: the repository's file
/// where it ships one; otherwise (a platform that exists only in tests,
/// served by a test plugin of plugin-api 1.x) a copy of `shortvideo`'s
/// under the platform's name, written once into the target folder. The
/// copy drops the names `shortvideo` gives its API document (its
/// `openapi_prefix`, `openapi_name`s and `operation_id`s), so it takes the
/// platform's own and serves beside `shortvideo`.
pub fn description(platform: &str) -> PathBuf {
    let shipped = platforms_dir().join(format!("{platform}.toml"));
    if shipped.is_file() {
        return std::path::absolute(&shipped).unwrap_or(shipped);
    }
    let text = std::fs::read_to_string(platforms_dir().join("shortvideo.toml"))
        .expect("the repository ships platforms/shortvideo.toml")
        .replace("name = \"shortvideo\"", &format!("name = \"{platform}\""));
    let text = without_document_names(&text);
    let dir = target_dir().join("sg-tests").join("descriptions");
    std::fs::create_dir_all(&dir).expect("can create the descriptions folder");
    let path = dir.join(format!("{platform}.toml"));
    if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
        // Tests run in parallel processes: each writes aside, then renames.
        let aside = dir.join(format!("{platform}.toml.{}", std::process::id()));
        std::fs::write(&aside, &text).expect("can write a description");
        std::fs::rename(&aside, &path).expect("can put a description in place");
    }
    path
}

/// `text` without its lines (or inline keys) `openapi_prefix`,
/// `openapi_name` and `operation_id`.
fn without_document_names(text: &str) -> String {
    const KEYS: [&str; 3] = ["openapi_prefix", "openapi_name", "operation_id"];
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if KEYS
            .iter()
            .any(|key| line.starts_with(&format!("{key} = ")))
        {
            continue;
        }
        let mut line = line.to_owned();
        for key in KEYS {
            // `, key = "value"` inside an inline table.
            while let Some(at) = line.find(&format!(", {key} = \"")) {
                let value = at + key.len() + 6;
                let end = line[value..]
                    .find('"')
                    .map_or(line.len(), |i| value + i + 1);
                line.replace_range(at..end, "");
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Writes into `dir` a copy of `shortvideo`'s description with `edit`
/// applied, asserting that it changed the text; gives its path.
pub fn description_copy(dir: &Path, edit: impl Fn(&str) -> String) -> PathBuf {
    let shipped = std::fs::read_to_string(description("shortvideo")).expect("the description");
    let edited = edit(&shipped);
    assert_ne!(edited, shipped, "the edit must change the description");
    let path = dir.join("shortvideo.toml");
    std::fs::write(&path, edited).expect("can write a description");
    path
}

/// `shortvideo`'s description with `username` 1-5 characters long, and
/// its rule saying so.
pub fn short_usernames(text: &str) -> String {
    text.replacen("length = [1, 64]", "length = [1, 5]", 1)
        .replacen("rule = \"1-64 characters", "rule = \"1-5 characters", 1)
}
