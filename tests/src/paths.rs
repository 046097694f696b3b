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
