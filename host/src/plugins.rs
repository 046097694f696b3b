//! Loading provider plugins: dynamic libraries exporting a plugin-api root
//! module, checked by `abi_stable` for interface version and layout.
//!
//! A library is never loaded from where the operator keeps it, but from a
//! private copy in the state folder named by its content hash. The dynamic
//! loader de-duplicates by path (a changed file at the same path would be
//! silently ignored), and a mapped library overwritten in place crashes the
//! process; a content-addressed copy avoids both. A library loaded once is
//! reused for the same content, and never unloaded: requests started before
//! a reload may still be running its code.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use abi_stable::std_types::RStr;
use plugin_api::ffi::{elf, HostServices, Library, LoadError, ProviderHandle};
use plugin_api::log::Level;
use plugin_api::ProviderConfig as PluginConfig;
use sha2::{Digest, Sha256};

use crate::redact::Redacted;
use crate::settings::{ConfigError, Context, RawServer};

/// `[server] state_dir`, where private copies of libraries are kept
/// (default `state` beside the config). A process setting: libraries
/// already mapped stay where they are.
pub fn state_dir_from_raw(raw: &RawServer, cx: &Context) -> PathBuf {
    cx.resolve(raw.state_dir.as_deref().unwrap_or(Path::new("state")))
}

/// `[server] plugin_dir`, where bare library names are looked up (default:
/// the executable's folder, where `cargo build` puts plugins too).
pub fn plugin_dir_from_raw(raw: &RawServer, cx: &Context) -> Result<PathBuf, ConfigError> {
    match &raw.plugin_dir {
        Some(dir) => Ok(cx.resolve(dir)),
        None => executable_dir().map_err(|e| {
            cx.invalid(
                "[server] plugin_dir",
                format!("cannot find the executable's folder: {e}"),
            )
        }),
    }
}

/// The folder of the running executable, where `cargo build` puts plugins too.
pub fn executable_dir() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    exe.parent()
        .map(Path::to_owned)
        .ok_or_else(|| std::io::Error::other("the executable has no parent folder"))
}

/// A bare name (`shortvideo_primary`) means `lib<name>.so` (per-OS naming)
/// in the plugin folder; anything with a slash or an extension is a path,
/// relative to `base`.
pub fn library_path(library: &str, plugin_dir: &Path, base: &Path) -> PathBuf {
    let is_path =
        library.contains('/') || library.contains('\\') || Path::new(library).extension().is_some();
    if is_path {
        base.join(library)
    } else {
        plugin_dir.join(library_file_name(library))
    }
}

/// The file a library named `name` is built as: `lib<name>.so` (per-OS
/// naming).
pub fn library_file_name(name: &str) -> String {
    format!(
        "{}{name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("{path}: cannot read plugin library: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: cannot copy into the state folder {state_dir}: {source}")]
    Copy {
        path: PathBuf,
        state_dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a usable plugin: {source}")]
    Load { path: PathBuf, source: LoadError },
    /// The plugin refused what `[providers.NAME]` gives it (its settings,
    /// say): the table is named first, since that is what to fix.
    #[error("{config}: [providers.{provider}] refused by its plugin ({path}): {reason}")]
    Setup {
        config: PathBuf,
        path: PathBuf,
        provider: String,
        reason: String,
    },
}

/// Whether `name` is one [`Loader::private_copy`] writes: `STEM-HASH.EXT`
/// with 16 lower-case hex digits of the library's SHA-256, or the
/// temporary file of one (`.STEM-HASH.EXT.PID.tmp`, from
/// [`crate::files::replace_atomically`]).
fn is_copy_name(name: &str) -> bool {
    let copy = match name
        .strip_prefix('.')
        .and_then(|rest| rest.strip_suffix(".tmp"))
    {
        Some(temporary) => match temporary.rsplit_once('.') {
            Some((copy, pid)) if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) => copy,
            _ => return false,
        },
        None => name,
    };
    let Some((stem_and_hash, extension)) = copy.rsplit_once('.') else {
        return false;
    };
    let Some((stem, hash)) = stem_and_hash.rsplit_once('-') else {
        return false;
    };
    let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    !stem.is_empty() && !extension.is_empty() && hash.len() == 16 && hash.bytes().all(lower_hex)
}

/// A library's SHA-256: what makes two library files the same library.
pub type ContentHash = [u8; 32];

/// What identifies a file's content without reading it: a rename into
/// place changes the inode, an in-place write the size or the time.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    len: u64,
    modified: Option<SystemTime>,
    inode: (u64, u64),
}

impl Fingerprint {
    fn of(meta: &std::fs::Metadata) -> Fingerprint {
        Fingerprint {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode: {
                use std::os::unix::fs::MetadataExt;
                (meta.dev(), meta.ino())
            },
        }
    }
}

#[derive(Default)]
struct Loaded {
    by_hash: HashMap<ContentHash, Library>,
    /// The content last seen at each path, so an unchanged file is not read
    /// and hashed again on every reload.
    by_path: HashMap<PathBuf, (Fingerprint, ContentHash)>,
    /// Private copies this process mapped.
    copies: HashSet<PathBuf>,
}

/// Loads plugin libraries, each distinct content once per process.
pub struct Loader {
    state_dir: PathBuf,
    loaded: Mutex<Loaded>,
}

impl Loader {
    pub fn new(state_dir: PathBuf) -> Loader {
        Loader {
            state_dir,
            loaded: Mutex::new(Loaded::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        crate::sync::lock(&self.loaded)
    }

    /// The library at `path`, loaded from a private copy of its content,
    /// with its content hash.
    pub fn load(&self, path: &Path) -> Result<(Library, ContentHash), PluginError> {
        let read_failed = |source| PluginError::Read {
            path: path.to_owned(),
            source,
        };
        // Metadata and bytes from one open file, so they describe the same
        // content even if the path is replaced meanwhile.
        let mut file = crate::files::open_regular(path).map_err(read_failed)?;
        let fingerprint = Fingerprint::of(&file.metadata().map_err(read_failed)?);
        // Holding the lock while loading keeps two reloads from mapping the
        // same content twice; loads are rare and quick.
        let mut loaded = self.lock();
        if let Some((seen, hash)) = loaded.by_path.get(path) {
            if *seen == fingerprint {
                if let Some(library) = loaded.by_hash.get(hash) {
                    return Ok((library.clone(), *hash));
                }
            }
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(read_failed)?;
        // A library written in place while we read would be torn; mapping a
        // torn library can crash the process. Refuse it: the write's end
        // triggers another reload.
        if Fingerprint::of(&file.metadata().map_err(read_failed)?) != fingerprint {
            return Err(read_failed(std::io::Error::other(
                "the file changed while being read; replace libraries by renaming a finished file into place",
            )));
        }
        let hash: ContentHash = Sha256::digest(&bytes).into();
        let library = match loaded.by_hash.get(&hash) {
            Some(library) => library.clone(),
            None => {
                // Checked before it is copied: a file cut short must leave
                // no library-sized copy behind. (Loading checks it again.)
                let incomplete = |e| PluginError::Load {
                    path: path.to_owned(),
                    source: LoadError::Incomplete(e),
                };
                let len = bytes.len() as u64;
                elf::check(&mut std::io::Cursor::new(&bytes), len).map_err(incomplete)?;
                let copy = self.private_copy(path, &bytes, &hash)?;
                let library = Library::load(&copy).map_err(|source| PluginError::Load {
                    path: path.to_owned(),
                    source,
                })?;
                tracing::debug!(library = %path.display(), copy = %copy.display(), "plugin library loaded");
                loaded.by_hash.insert(hash, library.clone());
                loaded.copies.insert(copy);
                library
            }
        };
        loaded.by_path.insert(path.to_owned(), (fingerprint, hash));
        Ok((library, hash))
    }

    /// Deletes private copies this process has not mapped: left by earlier
    /// runs, each a library-sized file (and their temporary files, left by
    /// a crash mid-copy). Files named otherwise are never touched. Call
    /// once, after the first load.
    /// (Deleting a file another process has mapped is harmless: its mapping
    /// stays until that process ends.)
    pub fn prune(&self) {
        let dir = self.state_dir.join("plugins");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        let loaded = self.lock();
        for entry in entries.flatten() {
            let path = entry.path();
            // Only what this loader writes there: the folder may be one an
            // operator also keeps libraries or notes in.
            let ours = entry.file_name().to_str().is_some_and(is_copy_name);
            if ours
                && entry.file_type().is_ok_and(|t| t.is_file())
                && !loaded.copies.contains(&path)
            {
                match std::fs::remove_file(&path) {
                    Ok(()) => tracing::debug!(copy = %path.display(), "stale plugin copy removed"),
                    Err(e) => {
                        tracing::warn!(copy = %path.display(), "cannot remove stale plugin copy: {e}")
                    }
                }
            }
        }
    }

    /// Writes `bytes` to `<state_dir>/plugins/<stem>-<hash>.so` unless that
    /// file already exists, via a temporary file and a rename, so a
    /// half-written copy is never loaded. The folder is created 0700 and
    /// the copy 0600, exclusively; a symbolic link at either name is never
    /// followed (one at the copy's name is replaced by the copy).
    fn private_copy(
        &self,
        path: &Path,
        bytes: &[u8],
        hash: &[u8; 32],
    ) -> Result<PathBuf, PluginError> {
        let dir = self.state_dir.join("plugins");
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("plugin");
        let short: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .filter(|e| !e.is_empty())
            .unwrap_or("so");
        let copy = dir.join(format!("{stem}-{short}.{extension}"));
        debug_assert!(is_copy_name(&format!("{stem}-{short}.{extension}")));
        // A copy left by an earlier run is used only if it is a whole
        // regular file, not a link to somewhere else.
        let intact = crate::files::open_no_follow(&copy).is_ok_and(|mut file| {
            let mut existing = Vec::new();
            file.metadata().is_ok_and(|m| m.is_file())
                && file.read_to_end(&mut existing).is_ok()
                && Sha256::digest(&existing)[..] == hash[..]
        });
        if intact {
            return Ok(copy);
        }
        let failed = |source| PluginError::Copy {
            path: path.to_owned(),
            state_dir: self.state_dir.clone(),
            source,
        };
        crate::files::create_private_dir_all(&dir).map_err(failed)?;
        crate::files::replace_atomically(&copy, |file| file.write_all(bytes)).map_err(failed)?;
        Ok(copy)
    }
}

/// Sets up the provider `name` from `library` with its configuration (from
/// the config file `config_path`).
pub fn instantiate(
    library: &Library,
    path: &Path,
    name: &str,
    config: &PluginConfig,
    config_path: &Path,
) -> Result<ProviderHandle, PluginError> {
    library
        .instantiate(config, HostServices { log: plugin_log })
        .map_err(|reason| PluginError::Setup {
            config: config_path.to_owned(),
            path: path.to_owned(),
            provider: name.to_owned(),
            reason: crate::redact::text(&reason).into_owned(),
        })
}

/// Where plugins' log lines enter the host's `tracing`.
extern "C" fn plugin_log(level: u8, target: RStr<'_>, message: RStr<'_>) {
    // A panic must not unwind into the plugin's frame.
    let _ = std::panic::catch_unwind(|| {
        // Redacted only when written: a level that is off costs nothing.
        let (plugin, message) = (target.as_str(), Redacted(message.as_str()));
        match Level::from_u8(level) {
            Level::Error => tracing::error!(target: "socialgate::plugin", plugin, "{message}"),
            Level::Warn => tracing::warn!(target: "socialgate::plugin", plugin, "{message}"),
            Level::Info => tracing::info!(target: "socialgate::plugin", plugin, "{message}"),
            Level::Debug => tracing::debug!(target: "socialgate::plugin", plugin, "{message}"),
        }
    });
}
