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
//!
//! A file is taken whole or not at all: one record that `keys issue` could
//! not have written (a name outside the rule, a hash that is not 64 hex
//! digits, a date that is not one, a name or a hash twice) makes the whole
//! file unusable, as a syntax error does, so a hand edit's mistake turns
//! the instance not ready instead of serving a key under the wrong account,
//! one that can never match, or a name that prints as a line of its own.
//!
//! With `[state] backend = "redis"` the keys live in the shared store
//! instead ([`shared`]).

pub mod shared;

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// `[server] keys_file` (default `keys.toml` beside the config). Serving
/// configuration: a reload reads the keys from the file it names.
pub fn keys_file_from_raw(keys_file: Option<&Path>, cx: &crate::settings::Context) -> PathBuf {
    cx.resolve(keys_file.unwrap_or(Path::new("keys.toml")))
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
    #[error("{path}: line {line}: not a keys file: {message}")]
    Format {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path}: key `{}` has a malformed or repeated sha256", .name.escape_debug())]
    BadHash { path: PathBuf, name: String },
    #[error("a key named `{}` already exists", .0.escape_debug())]
    Duplicate(String),
    #[error("no key named `{}`", .0.escape_debug())]
    Unknown(String),
    /// A record that `keys issue` could not have written. The name is
    /// escaped (a file may hold a newline in it, which would fake a log or
    /// terminal line); the hash is never shown.
    #[error("{path}: line {line}: key `{}`: {problem}", .name.escape_debug())]
    Record {
        path: PathBuf,
        line: usize,
        name: String,
        problem: RecordError,
    },
    #[error("a key name is 1-64 of A-Z, a-z, 0-9, `.`, `_` and `-`; got `{}`", .0.escape_debug())]
    BadName(String),
    /// `keys import` found the key of a record already in the shared store
    /// under another name.
    #[error("key `{}` is the key of `{}`, already in the shared store", .name.escape_debug(), .owner.escape_debug())]
    SameKeyShared { name: String, owner: String },
    /// Why `keys import` wrote nothing: it imports a file whole or not at
    /// all, so an operator never has to work out which half went in.
    #[error("keys import: nothing imported: {0}")]
    NothingImported(Box<KeysError>),
    #[error("no randomness available: {0}")]
    Random(String),
    /// `keys export` from a store without keys: most likely a Redis that
    /// came back empty, when the file it would replace is the backup.
    #[error(
        "keys export: the shared store holds no keys (a Redis that came back empty?): \
         nothing written; --allow-empty writes an empty keys file"
    )]
    NothingToExport,
    /// `keys export` onto a file that is not a keys file: a mistyped path.
    #[error("keys export: nothing written: {0}; export to a new file or to a keys file")]
    NotAKeysFile(Box<KeysError>),
    #[error(transparent)]
    Shared(#[from] crate::shared::StateError),
}

/// What is wrong with one record of a keys file.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("a key name is 1-64 of A-Z, a-z, 0-9, `.`, `_` and `-`")]
    BadName,
    #[error("the same name as the key at line {0}")]
    NameTwice(usize),
    #[error("sha256 is not 64 hex digits")]
    BadSha256,
    /// Two names for one key: whichever came last would answer for it,
    /// with that account's credits.
    #[error("the same sha256 as key `{}` at line {line}: one key cannot be two accounts", .name.escape_debug())]
    SameKey { name: String, line: usize },
    #[error("created is not a time as YYYY-MM-DDTHH:MM:SSZ")]
    BadCreated,
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

/// The keys file as written.
#[derive(Serialize)]
struct KeysFile {
    #[serde(rename = "key")]
    keys: Vec<KeyRecord>,
}

/// The keys file as read: each name with where it stands, so a mistake is
/// reported by its line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadKeysFile {
    #[serde(default)]
    key: Vec<ReadRecord>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadRecord {
    name: toml::Spanned<String>,
    sha256: String,
    created: String,
}

/// A record at fault: its line, its name and what is wrong.
struct BadRecord {
    line: usize,
    name: String,
    problem: RecordError,
}

/// The records of a file read from `text`, each checked as `keys issue`
/// would have written it (hashes in lower case); the first at fault
/// otherwise.
fn checked_records(text: &str, read: Vec<ReadRecord>) -> Result<Vec<KeyRecord>, BadRecord> {
    let mut lines = LineCounter::new(text);
    let mut names: HashMap<String, usize> = HashMap::default();
    let mut hashes: HashMap<[u8; 32], (String, usize)> = HashMap::default();
    let mut records = Vec::with_capacity(read.len());
    for record in read {
        let line = lines.line_at(record.name.span().start);
        let name = record.name.into_inner();
        let fault = |problem| BadRecord {
            line,
            name: name.clone(),
            problem,
        };
        if KeyRecord::check_name(&name).is_err() {
            return Err(fault(RecordError::BadName));
        }
        if let Some(&first) = names.get(&name) {
            return Err(fault(RecordError::NameTwice(first)));
        }
        let hash = unhex(&record.sha256).ok_or_else(|| fault(RecordError::BadSha256))?;
        if let Some((other, at)) = hashes.get(&hash) {
            return Err(fault(RecordError::SameKey {
                name: other.clone(),
                line: *at,
            }));
        }
        if plugin_api::Timestamp::parse(&record.created).is_none() {
            return Err(fault(RecordError::BadCreated));
        }
        names.insert(name.clone(), line);
        hashes.insert(hash, (name.clone(), line));
        records.push(KeyRecord {
            name,
            sha256: hex(&hash),
            created: record.created,
        });
    }
    Ok(records)
}

/// Line numbers of byte offsets met in increasing order, counted once: a
/// file of a hundred thousand keys is not rescanned per key.
struct LineCounter<'a> {
    text: &'a str,
    offset: usize,
    line: usize,
}

impl<'a> LineCounter<'a> {
    fn new(text: &'a str) -> Self {
        LineCounter {
            text,
            offset: 0,
            line: 1,
        }
    }

    /// The 1-based line of byte `offset`.
    fn line_at(&mut self, offset: usize) -> usize {
        let offset = offset.min(self.text.len());
        if offset < self.offset {
            // Not in order (the parser's spans are): count from the start.
            self.offset = 0;
            self.line = 1;
        }
        let between = self.text.as_bytes().get(self.offset..offset).unwrap_or(&[]);
        self.line += between.iter().filter(|&&b| b == b'\n').count();
        self.offset = offset;
        self.line
    }
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

/// The largest keys file read: about a million keys. Anything larger (a
/// wrong file) is refused unread, as is what is not a regular file (a
/// device, a FIFO).
pub const MAX_KEYS_FILE_BYTES: u64 = 256 * 1024 * 1024;

impl KeysFileAt<'_> {
    /// Every record; a missing file holds none. A record `keys issue` could
    /// not have written fails the whole file (see the module's doc).
    pub fn records(&self) -> Result<Vec<KeyRecord>, KeysError> {
        match self.text()? {
            Some(text) => self.parse(&text),
            None => Ok(Vec::new()),
        }
    }

    /// [`records`](Self::records) of a file that must exist (one named to
    /// be read, not the server's own).
    pub fn existing_records(&self) -> Result<Vec<KeyRecord>, KeysError> {
        match self.text()? {
            Some(text) => self.parse(&text),
            None => Err(KeysError::Read {
                path: self.0.to_owned(),
                source: std::io::ErrorKind::NotFound.into(),
            }),
        }
    }

    /// The file's text, `None` when it does not exist.
    fn text(&self) -> Result<Option<String>, KeysError> {
        use std::io::Read;
        let path = self.0;
        let failed = |source| KeysError::Read {
            path: path.to_owned(),
            source,
        };
        // Looked at before it is opened: opening a FIFO would wait for a
        // writer, and a device may never end.
        let too_big = || {
            std::io::Error::other(format!(
                "larger than {} MiB: not a keys file",
                MAX_KEYS_FILE_BYTES >> 20
            ))
        };
        match std::fs::metadata(path) {
            Ok(meta) if !meta.is_file() => {
                return Err(failed(std::io::Error::other("not a regular file")))
            }
            Ok(meta) if meta.len() > MAX_KEYS_FILE_BYTES => return Err(failed(too_big())),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(failed(source)),
        }
        let file = match File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(failed(source)),
        };
        // Bounded still: it may have grown since.
        let mut bytes = Vec::new();
        file.take(MAX_KEYS_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(failed)?;
        if bytes.len() as u64 > MAX_KEYS_FILE_BYTES {
            return Err(failed(too_big()));
        }
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| failed(std::io::ErrorKind::InvalidData.into()))
    }

    fn parse(&self, text: &str) -> Result<Vec<KeyRecord>, KeysError> {
        let path = self.0;
        let file: ReadKeysFile = toml::from_str(text).map_err(|e| KeysError::Format {
            path: path.to_owned(),
            line: crate::settings::syntax_error_line(text, &e),
            message: e.message().trim().replace('\n', " "),
        })?;
        checked_records(text, file.key).map_err(|bad| KeysError::Record {
            path: path.to_owned(),
            line: bad.line,
            name: bad.name,
            problem: bad.problem,
        })
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

    /// Applies `change` to the records and writes them back, holding the
    /// lock from the read to the rename; nothing is written if `change`
    /// fails.
    fn update(
        &self,
        change: impl FnOnce(&mut Vec<KeyRecord>) -> Result<(), KeysError>,
    ) -> Result<(), KeysError> {
        self.locked(|at| {
            let mut records = self.records()?;
            change(&mut records)?;
            write_keys(at, records)
        })
    }

    /// Makes `records` the whole file (`keys export` writes the shared
    /// store's keys this way); refused, with nothing written, when the file
    /// there does not read as a keys file (a mistyped path). A missing file
    /// reads as one without keys.
    pub fn replace_all(&self, records: Vec<KeyRecord>) -> Result<(), KeysError> {
        self.locked(|at| {
            self.records()
                .map_err(|e| KeysError::NotAKeysFile(Box::new(e)))?;
            write_keys(at, records)
        })
    }

    /// Runs `work` on the file to write ([`written_at`](Self::written_at))
    /// holding its lock, beside it (its folder made first).
    fn locked<T>(&self, work: impl FnOnce(&Path) -> Result<T, KeysError>) -> Result<T, KeysError> {
        let at = self.written_at()?;
        let failed = |source| KeysError::Write {
            path: at.clone(),
            source,
        };
        let dir = crate::settings::folder_of(&at);
        crate::files::create_private_dir_all(dir).map_err(failed)?;
        let name = at.file_name().and_then(|n| n.to_str()).unwrap_or("keys");
        let lock = dir.join(format!(".{name}.lock"));
        let _held = crate::files::lock_exclusive(&lock).map_err(failed)?;
        work(&at)
    }

    /// The file a change is written to: this path, or, when it is a
    /// symbolic link (the README allows one), the regular file it leads
    /// to, so the file the operator keeps is the one changed. Only a link
    /// of the caller's own or root's is followed: one planted by another
    /// user in the folder must not make `keys revoke`, run as root, write
    /// wherever it points.
    fn written_at(&self) -> Result<PathBuf, KeysError> {
        let path = self.0;
        let link = match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => meta,
            // A file, or none yet: written where it is.
            _ => return Ok(path.to_owned()),
        };
        let refused = |why: &str| KeysError::Write {
            path: path.to_owned(),
            source: std::io::Error::other(format!(
                "a symbolic link {why}; set keys_file to the file itself"
            )),
        };
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let caller = unsafe { libc::geteuid() };
        let owner = link.uid();
        if owner != caller && owner != 0 {
            return Err(refused("owned by another user"));
        }
        match std::fs::canonicalize(path) {
            Ok(target) if target.is_file() => Ok(target),
            _ => Err(refused("that leads to no regular file")),
        }
    }
}

/// Replaces the keys file at `path` atomically, keeping its owner, group
/// and mode (a new file is its creator's, mode 0600). Call with its lock
/// held.
fn write_keys(path: &Path, keys: Vec<KeyRecord>) -> Result<(), KeysError> {
    let failed = |source| KeysError::Write {
        path: path.to_owned(),
        source,
    };
    let body = toml::to_string(&KeysFile { keys }).map_err(|e| failed(std::io::Error::other(e)))?;
    let kept = match std::fs::metadata(path) {
        Ok(meta) => Some(meta),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(failed(source)),
    };
    crate::files::replace_atomically(path, |file| {
        file.write_all(b"# socialgate API keys: names and SHA-256 hashes only.\n")?;
        file.write_all(body.as_bytes())?;
        match &kept {
            Some(meta) => keep_owner_and_mode(file, meta),
            None => Ok(()),
        }
    })
    .map_err(failed)
}

/// Gives `file` the owner, group and permission bits of `meta`. Failing to
/// is an error: a file the server's user cannot read turns it not ready.
fn keep_owner_and_mode(file: &File, meta: &std::fs::Metadata) -> std::io::Result<()> {
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
    Ok(())
}

/// The keys a server accepts, loaded from the keys file.
#[derive(Default, PartialEq, Eq)]
pub struct KeyStore {
    /// Key names by the SHA-256 of their key.
    by_hash: HashMap<[u8; 32], String>,
}

impl KeyStore {
    /// Loads the file; a missing file means no key is valid.
    pub fn load(path: &Path) -> Result<KeyStore, KeysError> {
        // `records` has checked every hash already; this cannot fail.
        KeyStore::from_records(KeysFileAt(path).records()?).map_err(|name| KeysError::BadHash {
            path: path.to_owned(),
            name,
        })
    }

    /// The keys of `records`; the name of the first whose hash is malformed
    /// or an earlier record's, if one is: a key with two names must not
    /// answer as whichever came last.
    pub fn from_records(records: Vec<KeyRecord>) -> Result<KeyStore, String> {
        let mut by_hash = HashMap::default();
        for record in records {
            let Some(hash) = unhex(&record.sha256) else {
                return Err(record.name);
            };
            if by_hash.contains_key(&hash) {
                return Err(record.name);
            }
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
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 64 hex digits (either case) as 32 bytes; anything else (a sign, which
/// `from_str_radix` would take, a space, a 63rd digit) is `None`.
fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
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

    /// A record as `keys issue` writes it, with `sha256` and `created` as
    /// given; its name is on the third line of its text.
    fn record(name: &str, sha256: &str, created: &str) -> String {
        let quoted = |text: &str| toml::Value::String(text.to_owned()).to_string();
        format!(
            "\n[[key]]\nname = {}\nsha256 = {}\ncreated = {}\n",
            quoted(name),
            quoted(sha256),
            quoted(created)
        )
    }

    const WHEN: &str = "2026-01-02T03:04:05Z";

    /// Loads `text` as a keys file in a folder of its own.
    fn load_text(text: &str) -> Result<KeyStore, KeysError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        std::fs::write(&path, text).unwrap();
        KeyStore::load(&path)
    }

    /// The line, name and problem of a refused file; its message is one
    /// line that never holds a hash of the file.
    fn refusal(test: &str, text: &str, hashes: &[&str]) -> (usize, String, RecordError) {
        let Err(e) = load_text(text) else {
            panic!("{test}: the file must be refused");
        };
        let message = e.to_string();
        assert!(!message.contains('\n'), "{test}: one line: {message:?}");
        for hash in hashes.iter().filter(|h| !h.is_empty()) {
            assert!(!message.contains(hash), "{test}: no hash: {message}");
        }
        match e {
            KeysError::Record {
                line,
                name,
                problem,
                ..
            } => (line, name, problem),
            other => panic!("{test}: not a record's fault: {other}"),
        }
    }

    fn sha(key: &str) -> String {
        hex(&Sha256::digest(key.as_bytes()))
    }

    #[test]
    fn one_key_under_two_names_in_either_case_refuses_the_file() {
        let a = sha("sg_a");
        let text = [
            record("alice", &a, WHEN),
            record("alice2", &a.to_uppercase(), WHEN),
        ]
        .concat();
        let (line, name, problem) = refusal("same-key", &text, &[&a, &a.to_uppercase()]);
        assert_eq!((line, name.as_str()), (8, "alice2"));
        assert!(
            matches!(&problem, RecordError::SameKey { name, line: 3 } if name == "alice"),
            "{problem:?}"
        );
    }

    #[test]
    fn a_hash_that_is_not_64_hex_digits_refuses_the_file() {
        let good = sha("sg_a");
        let bad = [
            format!("XYZ{}", &good[3..]),
            "+f".repeat(32),
            good[1..].to_owned(),
            format!("{good}0"),
            format!(" {}", &good[1..]),
            String::new(),
        ];
        for (i, hash) in bad.iter().enumerate() {
            let text = [record("alice", &good, WHEN), record("bob", hash, WHEN)].concat();
            let (line, name, problem) = refusal(&format!("bad-hash-{i}"), &text, &[&good, hash]);
            assert_eq!((line, name.as_str()), (8, "bob"), "{hash:?}");
            assert!(matches!(problem, RecordError::BadSha256), "{hash:?}");
        }
        // Upper case is hex too, and the key still matches.
        let store = load_text(&record("alice", &good.to_uppercase(), WHEN)).unwrap();
        assert_eq!(store.verify(b"sg_a"), Some("alice"));
    }

    #[test]
    fn a_name_outside_the_rule_or_twice_refuses_the_file() {
        let (a, b) = (sha("sg_a"), sha("sg_b"));
        for (i, name) in ["", &"x".repeat(65), "caf\u{e9}"].into_iter().enumerate() {
            let text = [record("alice", &a, WHEN), record(name, &b, WHEN)].concat();
            let (line, got, problem) = refusal(&format!("bad-name-{i}"), &text, &[&a, &b]);
            assert_eq!((line, got.as_str()), (8, name));
            assert!(matches!(problem, RecordError::BadName), "{name:?}");
        }

        let text = [record("alice", &a, WHEN), record("alice", &b, WHEN)].concat();
        let (line, name, problem) = refusal("name-twice", &text, &[&a, &b]);
        assert_eq!((line, name.as_str()), (8, "alice"));
        assert!(matches!(problem, RecordError::NameTwice(3)), "{problem:?}");
    }

    #[test]
    fn a_created_that_is_not_a_time_refuses_the_file() {
        let a = sha("sg_a");
        for (i, created) in ["2026-01-02", "2026-13-02T03:04:05Z", "x\ny"]
            .iter()
            .enumerate()
        {
            let (line, _, problem) = refusal(
                &format!("created-{i}"),
                &record("alice", &a, created),
                &[&a],
            );
            assert_eq!(line, 3);
            assert!(matches!(problem, RecordError::BadCreated), "{created:?}");
        }
    }

    #[test]
    fn a_good_file_loads_whole_and_lines_count_from_one() {
        let text = format!(
            "# a comment\nkey = [{{ name = \"a\", sha256 = \"{}\", created = \"{WHEN}\" }}]\n",
            sha("sg_a")
        );
        assert_eq!(load_text(&text).unwrap().len(), 1);
        let text = format!("{}\n\n{}", text, record("a", &sha("sg_b"), WHEN));
        // An inline array and a table array are one TOML error, not ours.
        assert!(load_text(&text).is_err());

        let mut lines = LineCounter::new("a\nb\nc");
        assert_eq!(lines.line_at(0), 1);
        assert_eq!(lines.line_at(2), 2);
        assert_eq!(lines.line_at(4), 3);
        assert_eq!(lines.line_at(1), 1, "back in the text: counted afresh");
        assert_eq!(lines.line_at(99), 3);
    }

    #[test]
    fn the_shared_store_refuses_one_key_under_two_names_too() {
        let a = sha("sg_a");
        let records = |second: &str| {
            vec![
                KeyRecord {
                    name: "alice".into(),
                    sha256: a.clone(),
                    created: WHEN.into(),
                },
                KeyRecord {
                    name: "alice2".into(),
                    sha256: second.to_owned(),
                    created: WHEN.into(),
                },
            ]
        };
        assert_eq!(
            KeyStore::from_records(records(&a)).err().as_deref(),
            Some("alice2")
        );
        assert_eq!(
            KeyStore::from_records(records(&"+f".repeat(32)))
                .err()
                .as_deref(),
            Some("alice2")
        );
        assert_eq!(
            KeyStore::from_records(records(&sha("sg_b"))).unwrap().len(),
            2
        );
    }
}
