//! `socialgate plugin new` and `plugin inspect`: the provider author's
//! start (a ready crate from the templates in `template/`) and their check
//! of what a built library will look like to the host.
//!
//! The templates are files, included at build time, with `{{placeholders}}`
//! filled in here; the crate they make builds and passes its tests as
//! written, in or out of this repository.

use std::path::{Path, PathBuf};

use plugin_api::ffi::Library;

/// Why a scaffold or an inspection failed.
#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    #[error("plugin name `{0}`: use 1-64 of a-z, 0-9, `-` and `_`, starting with a letter")]
    BadName(String),
    #[error("platform name `{0}`: use 1-64 of a-z, 0-9, `-` and `_`, starting with a letter")]
    BadPlatform(String),
    #[error("{0}: already exists and is not empty; choose another --dir")]
    Exists(PathBuf),
    #[error(
        "cannot find the plugin-api folder of the socialgate source (looked at {0}); \
         pass --plugin-api PATH"
    )]
    NoPluginApi(PathBuf),
    #[error("{0}: --plugin-api names no folder with a Cargo.toml in it")]
    NoPluginApiAt(PathBuf),
    #[error(
        "{0}: not socialgate's plugin-api folder (its Cargo.toml is not package \
         `socialgate-plugin-api`); pass the `plugin-api` folder of the socialgate source"
    )]
    NotPluginApi(PathBuf),
    #[error("{path}: cannot write: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a usable plugin: {reason}")]
    Inspect { path: PathBuf, reason: String },
}

/// What `plugin new` was asked for.
pub struct NewPlugin {
    /// The crate and provider name, e.g. `acme-profiles`.
    pub name: String,
    /// The platform it serves; defaults to the name.
    pub platform: Option<String>,
    /// Where to write the crate; defaults to `./NAME`.
    pub dir: Option<PathBuf>,
    /// The plugin-api folder to depend on; defaults to the one this binary
    /// was built from, if it is still there.
    pub plugin_api: Option<PathBuf>,
}

/// The files of a new crate: (path in the crate, template).
const FILES: [(&str, &str); 7] = [
    ("Cargo.toml", include_str!("template/Cargo.toml.in")),
    ("src/lib.rs", include_str!("template/lib.rs.in")),
    ("src/tests.rs", include_str!("template/tests.rs.in")),
    (
        "fixtures/user.json",
        include_str!("template/fixtures/user.json"),
    ),
    (
        "fixtures/user_not_found.json",
        include_str!("template/fixtures/user_not_found.json"),
    ),
    ("README.md", include_str!("template/README.md.in")),
    (".gitignore", include_str!("template/gitignore.in")),
];

/// A name a crate, a library and the config's tables all take: the
/// config's rule for provider and platform names, starting with a letter.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// `acme-profiles` (or `acme_profiles`) as the provider's type name:
/// `AcmeProfilesProvider`.
/// The suffix keeps it clear of the names the template itself uses
/// (`Profile`, `User`, `Settings`, `Kit`, ...) and of keywords (`self`).
fn type_name(name: &str) -> String {
    let mut type_name: String = name
        .split(['-', '_'])
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect();
    type_name.push_str("Provider");
    type_name
}

/// The crate's (and its library's) name for plugin `name`: `acme-x` is
/// `acme_x`.
fn crate_name(name: &str) -> String {
    name.replace('-', "_")
}

/// The library file `cargo build` makes of plugin `name`'s crate.
pub fn library_file(name: &str) -> String {
    crate::plugins::library_file_name(&crate_name(name))
}

/// Writes the crate; returns its folder and the files written.
pub fn new_plugin(request: NewPlugin) -> Result<(PathBuf, Vec<PathBuf>), ScaffoldError> {
    let name = request.name;
    if !valid_name(&name) {
        return Err(ScaffoldError::BadName(name));
    }
    let platform = request.platform.unwrap_or_else(|| name.clone());
    if !valid_name(&platform) {
        return Err(ScaffoldError::BadPlatform(platform));
    }
    let dir = request.dir.unwrap_or_else(|| PathBuf::from(&name));
    let non_empty = std::fs::read_dir(&dir).is_ok_and(|mut entries| entries.next().is_some());
    if non_empty || dir.is_file() {
        return Err(ScaffoldError::Exists(dir));
    }
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-api");
    let found = |folder: &Path| {
        folder
            .canonicalize()
            .ok()
            .filter(|p| p.join("Cargo.toml").is_file())
    };
    let plugin_api = match request.plugin_api {
        Some(given) => found(&given).ok_or(ScaffoldError::NoPluginApiAt(given))?,
        None => found(&built_from).ok_or(ScaffoldError::NoPluginApi(built_from))?,
    };
    if !is_plugin_api(&plugin_api) {
        return Err(ScaffoldError::NotPluginApi(plugin_api));
    }
    let plugin_api_path =
        serde_json::to_string(&plugin_api.to_string_lossy()).expect("a string always serializes");
    let crate_name = crate_name(&name);
    let env = format!("{}_KEY", crate_name.to_ascii_uppercase());
    let fill = |template: &str| {
        template
            .replace("{{name}}", &name)
            .replace("{{crate}}", &crate_name)
            .replace("{{type}}", &type_name(&name))
            .replace("{{platform}}", &platform)
            .replace("{{env}}", &env)
            .replace("{{plugin_api_path}}", &plugin_api_path)
    };
    let mut written = Vec::new();
    for (file, template) in FILES {
        let path = dir.join(file);
        let write = || -> std::io::Result<()> {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, fill(template))
        };
        write().map_err(|source| ScaffoldError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(path);
    }
    Ok((dir, written))
}

/// Whether `dir`'s Cargo.toml is plugin-api's: the new crate would not
/// build against another (a workspace's root, the host).
fn is_plugin_api(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
        return false;
    };
    text.parse::<toml::Table>().is_ok_and(|manifest| {
        manifest
            .get("package")
            .and_then(|package| package.get("name"))
            .and_then(toml::Value::as_str)
            == Some("socialgate-plugin-api")
    })
}

/// `plugin inspect`: the library's name, version, plugin-api version,
/// platform and endpoints, one per line.
pub fn inspect(path: &Path) -> Result<String, ScaffoldError> {
    let refused = |reason: String| ScaffoldError::Inspect {
        path: path.to_owned(),
        reason,
    };
    // The loader would wait for ever on a FIFO.
    crate::files::open_regular(path).map_err(|e| refused(format!("cannot be loaded: {e}")))?;
    let library = Library::load(path).map_err(|e| refused(e.to_string()))?;
    let manifest = library.manifest();
    Ok(format!(
        "name: {}\nversion: {}\nplugin-api: {}\nplatform: {}\nendpoints: {}",
        manifest.name,
        manifest.version,
        library.plugin_api_version(),
        manifest.platform,
        crate::routing::endpoint_list(&manifest.endpoints)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_types() {
        assert!(valid_name("acme-profiles2"));
        // Provider-author sweep: the config takes `_`, and so does this.
        assert!(valid_name("acme_x"));
        for bad in ["", "Acme", "1acme", "_acme", "a b", "a.b", &"a".repeat(65)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert_eq!(type_name("acme-profiles"), "AcmeProfilesProvider");
        assert_eq!(type_name("x"), "XProvider");
        assert_eq!(type_name("self"), "SelfProvider");
        assert_eq!(type_name("clip_cast-2"), "ClipCast2Provider");
    }

    #[test]
    fn every_placeholder_is_filled() {
        let scratch = tempfile::tempdir().unwrap();
        let (_, files) = new_plugin(NewPlugin {
            name: "acme-x".into(),
            platform: None,
            dir: Some(scratch.path().join("acme-x")),
            plugin_api: None,
        })
        .unwrap();
        assert_eq!(files.len(), FILES.len());
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(!text.contains("{{"), "{}", file.display());
        }
    }

    /// QA sweep: the source's root or the host's folder is no plugin-api,
    /// though each has a Cargo.toml.
    #[test]
    fn only_plugin_api_s_folder_is_taken() {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for wrong in [source.clone(), source.join("host")] {
            let dir =
                std::env::temp_dir().join(format!("sg-scaffold-wrong-{}", std::process::id()));
            let refused = new_plugin(NewPlugin {
                name: "acme-y".into(),
                platform: None,
                dir: Some(dir.clone()),
                plugin_api: Some(wrong.clone()),
            });
            assert!(
                matches!(refused, Err(ScaffoldError::NotPluginApi(_))),
                "{}",
                wrong.display()
            );
            assert!(!dir.exists(), "nothing written");
        }
        assert!(is_plugin_api(&source.join("plugin-api")));
        // A --plugin-api that names nothing says so, not "pass --plugin-api".
        let missing = std::env::temp_dir().join("sg-scaffold-no-such-plugin-api");
        let refused = new_plugin(NewPlugin {
            name: "acme-z".into(),
            platform: None,
            dir: Some(std::env::temp_dir().join("sg-scaffold-unwritten")),
            plugin_api: Some(missing),
        })
        .unwrap_err();
        assert!(
            matches!(refused, ScaffoldError::NoPluginApiAt(_)),
            "{refused}"
        );
        assert!(refused.to_string().contains("names no folder"), "{refused}");
    }
}
