//! API keys: issuing and revoking them in the keys file, and recognising
//! them on requests.
//!
//! The file stores only each key's SHA-256, so a leaked file grants nothing.
//! A change holds an exclusive lock on a lock file beside it (`.NAME.lock`)
//! from reading to renaming, so concurrent commands lose no update; the file
//! is replaced atomically (a private temporary file, synced, renamed, the
//! folder synced) and keeps the owner, group and mode it had (0600 when new):
//! a `keys revoke` run as root must not leave a file the server's user
//! cannot read. A request's key is hashed and looked up by its hash: the
//! same cost with ten keys or a hundred thousand, and with a made-up key.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::FastMap;

/// `[server] keys_file` (default `keys.toml` beside the config). Serving
/// configuration: a reload reads the keys from the file it names.
pub fn keys_file_from_raw(raw: &crate::config::RawServer, cx: &crate::config::Context) -> PathBuf {
    cx.resolve(raw.keys_file.as_deref().unwrap_or(Path::new("keys.toml")))
}

#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: cannot write: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a keys file: {message}")]
    Format { path: PathBuf, message: String },
    #[error("a key named `{0}` already exists")]
    Duplicate(String),
    #[error("no key named `{0}`")]
    Unknown(String),
    #[error("a key name is 1-64 of A-Z, a-z, 0-9, `.`, `_` and `-`; got `{0}`")]
    BadName(String),
    #[error("no randomness available: {0}")]
    Random(String),
    #[error(transparent)]
    Shared(#[from] crate::shared::StateError),
}

/// One issued key, as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeyRecord {
    pub name: String,
    /// Hex SHA-256 of the key.
    pub sha256: String,
    /// When it was issued, `YYYY-MM-DDTHH:MM:SSZ`.
    pub created: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default, rename = "key")]
    keys: Vec<KeyRecord>,
}

impl KeyRecord {
    /// A new key named `name`, and its record: the key is shown only now.
    pub fn issue(name: &str) -> Result<(String, KeyRecord), KeysError> {
        KeyRecord::check_name(name)?;
        let key = new_key()?;
        let record = KeyRecord {
            name: name.to_owned(),
            sha256: hex(&Sha256::digest(key.as_bytes())),
            created: now_utc(),
        };
        Ok((key, record))
    }

    /// 1-64 of `A-Z a-z 0-9 . _ -`: names appear in logs and Redis keys.
    pub fn check_name(name: &str) -> Result<(), KeysError> {
        let valid = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if valid {
            Ok(())
        } else {
            Err(KeysError::BadName(name.to_owned()))
        }
    }
}

/// The keys file at a path.
pub struct KeysFileAt<'a>(pub &'a Path);

impl KeysFileAt<'_> {
    /// Every record; a missing file holds none.
    pub fn records(&self) -> Result<Vec<KeyRecord>, KeysError> {
        let path = self.0;
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(KeysError::Read {
                    path: path.to_owned(),
                    source,
                })
            }
        };
        let file: KeysFile = toml::from_str(&text).map_err(|e| KeysError::Format {
            path: path.to_owned(),
            message: e.message().trim().replace('\n', " "),
        })?;
        Ok(file.keys)
    }

    /// Issues a key named `name`; returns the key, which is shown only now.
    pub fn issue(&self, name: &str) -> Result<String, KeysError> {
        let (key, record) = KeyRecord::issue(name)?;
        self.update(|records| {
            if records.iter().any(|r| r.name == name) {
                return Err(KeysError::Duplicate(name.to_owned()));
            }
            records.push(record);
            Ok(())
        })?;
        Ok(key)
    }

    /// Revokes the key named `name`.
    pub fn revoke(&self, name: &str) -> Result<(), KeysError> {
        self.update(|records| {
            let before = records.len();
            records.retain(|r| r.name != name);
            if records.len() == before {
                return Err(KeysError::Unknown(name.to_owned()));
            }
            Ok(())
        })
    }

    /// The file's folder.
    fn dir(&self) -> &Path {
        self.0
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
    }

    /// The file's name, for the names of its lock and temporary files.
    fn name(&self) -> &str {
        self.0
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("keys")
    }

    /// Applies `change` to the records and writes them back, holding the
    /// lock from the read to the rename; nothing is written if `change`
    /// fails.
    fn update(
        &self,
        change: impl FnOnce(&mut Vec<KeyRecord>) -> Result<(), KeysError>,
    ) -> Result<(), KeysError> {
        let failed = |source| KeysError::Write {
            path: self.0.to_owned(),
            source,
        };
        crate::files::create_private_dir_all(self.dir()).map_err(failed)?;
        let lock = self.dir().join(format!(".{}.lock", self.name()));
        let _held = crate::files::lock_exclusive(&lock).map_err(failed)?;
        let mut records = self.records()?;
        change(&mut records)?;
        self.write(records)
    }

    /// Replaces the file atomically, keeping its owner, group and mode
    /// (a new file is its creator's, mode 0600). Call with the lock held.
    fn write(&self, keys: Vec<KeyRecord>) -> Result<(), KeysError> {
        let path = self.0;
        let failed = |source| KeysError::Write {
            path: path.to_owned(),
            source,
        };
        let body =
            toml::to_string(&KeysFile { keys }).map_err(|e| failed(std::io::Error::other(e)))?;
        let kept = match std::fs::metadata(path) {
            Ok(meta) => Some(meta),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(failed(source)),
        };
        let dir = self.dir();
        let tmp = dir.join(format!(".{}.{}.tmp", self.name(), std::process::id()));
        let result = (|| {
            let mut file = crate::files::create_private(&tmp)?;
            file.write_all(b"# socialgate API keys: names and SHA-256 hashes only.\n")?;
            file.write_all(body.as_bytes())?;
            if let Some(meta) = &kept {
                keep_owner_and_mode(&file, meta)?;
            }
            file.sync_all()?;
            std::fs::rename(&tmp, path)?;
            crate::files::sync_dir(dir)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.map_err(failed)
    }
}

/// Gives `file` the owner, group and permission bits of `meta`. Failing to
/// is an error: a file the server's user cannot read turns it not ready.
fn keep_owner_and_mode(file: &File, meta: &std::fs::Metadata) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let ours = file.metadata()?;
        if (ours.uid(), ours.gid()) != (meta.uid(), meta.gid()) {
            std::os::unix::fs::fchown(file, Some(meta.uid()), Some(meta.gid())).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot keep the file's owner {} and group {}: {e}",
                        meta.uid(),
                        meta.gid()
                    ),
                )
            })?;
        }
        crate::files::set_mode(file, meta.permissions().mode() & 0o777)?;
    }
    #[cfg(not(unix))]
    let _ = (file, meta);
    Ok(())
}

/// The keys a server accepts, loaded from the keys file.
#[derive(Default, PartialEq, Eq)]
pub struct KeyStore {
    /// Key names by the SHA-256 of their key.
    by_hash: FastMap<[u8; 32], String>,
}

impl KeyStore {
    /// Loads the file; a missing file means no key is valid.
    pub fn load(path: &Path) -> Result<KeyStore, KeysError> {
        KeyStore::from_records(KeysFileAt(path).records()?).map_err(|name| KeysError::Format {
            path: path.to_owned(),
            message: format!("key `{name}` has a malformed sha256"),
        })
    }

    /// The keys of `records`; the name of the first with a malformed hash
    /// if one has.
    pub fn from_records(records: Vec<KeyRecord>) -> Result<KeyStore, String> {
        let mut by_hash = FastMap::default();
        for record in records {
            let Some(hash) = unhex(&record.sha256) else {
                return Err(record.name);
            };
            by_hash.insert(hash, record.name);
        }
        Ok(KeyStore { by_hash })
    }

    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The name of the key `presented`, if it is valid.
    ///
    /// A lookup by the key's SHA-256, the same work whatever the number of
    /// keys: what a lookup's timing could reveal is about the hash of the
    /// presented key, and finding a key whose hash is near a stored one is
    /// as hard as guessing a 256-bit key. The final comparison of the found
    /// hash is in constant time all the same.
    pub fn verify(&self, presented: &[u8]) -> Option<&str> {
        let hash: [u8; 32] = Sha256::digest(presented).into();
        let (stored, name) = self.by_hash.get_key_value(&hash)?;
        bool::from(stored.ct_eq(&hash)).then_some(name.as_str())
    }
}

/// A new key: `sg_` and 256 random bits.
fn new_key() -> Result<String, KeysError> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|e| KeysError::Random(e.to_string()))?;
    Ok(format!(
        "sg_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

fn hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(2 * bytes.len());
    crate::hex::push_hex(&mut text, bytes);
    text
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    plugin_api::Timestamp::from_unix(secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_verify_revoke() {
        let dir = std::env::temp_dir().join(format!("sg-keys-{}", std::process::id()));
        let path = dir.join("keys.toml");
        let file = KeysFileAt(&path);
        assert!(
            KeyStore::load(&path).unwrap().is_empty(),
            "missing file: no keys"
        );
        let alice = file.issue("alice").unwrap();
        let bob = file.issue("bob").unwrap();
        assert!(alice.starts_with("sg_") && alice.len() == 46);
        assert!(matches!(file.issue("alice"), Err(KeysError::Duplicate(_))));
        assert!(matches!(
            file.issue("no spaces"),
            Err(KeysError::BadName(_))
        ));

        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains(&alice) && !text.contains(&bob),
            "only hashes are stored"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }

        let store = KeyStore::load(&path).unwrap();
        assert_eq!(store.verify(alice.as_bytes()), Some("alice"));
        assert_eq!(store.verify(bob.as_bytes()), Some("bob"));
        assert_eq!(store.verify(b"sg_guess"), None);

        file.revoke("alice").unwrap();
        assert!(matches!(file.revoke("alice"), Err(KeysError::Unknown(_))));
        let store = KeyStore::load(&path).unwrap();
        assert_eq!(store.verify(alice.as_bytes()), None);
        assert_eq!(store.verify(bob.as_bytes()), Some("bob"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
