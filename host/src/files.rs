//! Files the server writes and files it trusts.
//!
//! What the process writes for itself (private copies of plugin libraries,
//! the keys file's temporary file, their folders) is created exclusively,
//! never through a symbolic link, with mode 0600 (folders 0700) whatever the
//! umask: a link or a file planted at that name by someone else is removed,
//! never written through. What it only reads but trusts (the config file,
//! the keys file, the plugin libraries and their folders) is checked at
//! start and at every reload, and one warning names each that someone other
//! than its owner could change.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// Mode of the files the process creates for itself.
const PRIVATE_FILE: u32 = 0o600;
/// Mode of the folders the process creates for itself.
const PRIVATE_DIR: u32 = 0o700;

/// Creates `path` for writing: exclusively, not through a link, mode 0600.
///
/// Something already there (a temporary file a crashed run with the same
/// process ID left, or a link someone planted) is removed and the creation
/// tried once more; removing a link removes the link, never its target.
pub fn create_private(path: &Path) -> io::Result<File> {
    match open_new(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(path)?;
            open_new(path)
        }
        other => other,
    }
}

/// Creates `path` empty, exclusively and mode 0600, unless something is
/// there already (which is left as it is).
pub fn create_private_if_absent(path: &Path) -> io::Result<()> {
    match open_new(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

fn open_new(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    use std::os::unix::fs::OpenOptionsExt;
    options.mode(PRIVATE_FILE).custom_flags(libc::O_NOFOLLOW);
    let file = options.open(path)?;
    // The umask may have taken bits away; the mode is exact either way.
    set_mode(&file, PRIVATE_FILE)?;
    Ok(file)
}

/// Replaces `path` with a file `write` fills, so that a reader sees the old
/// file or the new one, never half of one: written to a private temporary
/// file beside it (`.NAME.PID.tmp`), synced, renamed into place, and the
/// folder synced so the rename survives a crash. On failure the temporary
/// file is removed and `path` is untouched.
pub fn replace_atomically(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let dir = crate::settings::folder_of(path);
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    // Removed on failure only once this call made it: a file it could not
    // make is not its own.
    let mut file = create_private(&tmp)?;
    let result = write(&mut file)
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path))
        .and_then(|()| sync_dir(dir));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Opens `path` for reading if it is a regular file (through links), and
/// refuses anything else at once: opening a FIFO for reading would wait
/// for a writer for ever, and a device or a folder is no library.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    use std::os::unix::fs::OpenOptionsExt;
    options.custom_flags(libc::O_NONBLOCK);
    let file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// Opens `path` for reading, refusing a symbolic link at its last component.
pub fn open_no_follow(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    use std::os::unix::fs::OpenOptionsExt;
    options.custom_flags(libc::O_NOFOLLOW);
    options.open(path)
}

/// Opens (creating it if needed) the lock file `path` and takes an
/// exclusive lock on it, held until the returned file is dropped. The lock
/// file itself is never removed: removing it would let two processes lock
/// two different files.
pub fn lock_exclusive(path: &Path) -> io::Result<File> {
    let file = open_lock_file(path)?;
    file.lock()?;
    Ok(file)
}

/// [`lock_exclusive`] without the wait: `None` at once while another
/// process (or another open of the file) holds the lock.
pub fn try_lock_exclusive(path: &Path) -> io::Result<Option<File>> {
    let file = open_lock_file(path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

fn open_lock_file(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(false);
    use std::os::unix::fs::OpenOptionsExt;
    options.mode(PRIVATE_FILE).custom_flags(libc::O_NOFOLLOW);
    options.open(path)
}

/// Creates `dir` and any missing parent, each with mode 0700.
pub fn create_private_dir_all(dir: &Path) -> io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, PRIVATE_DIR);
    builder.create(dir)
}

/// Makes a rename or a creation in `dir` durable: without it, a crash may
/// bring back the folder's old entry even though the file was synced.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Sets `file`'s permission bits to exactly `mode`.
pub fn set_mode(file: &File, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Who other than its owner may write to something with permission bits
/// `mode`, or `None` when nobody may.
pub fn loose_writers(mode: u32) -> Option<&'static str> {
    match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => Some("group and others"),
        (true, false) => Some("group"),
        (false, true) => Some("others"),
        (false, false) => None,
    }
}

/// Logs one warning for each trusted file or folder that its group or
/// others may write to: the config file at `config_path`, the keys file,
/// and each plugin library in `libraries` with its folder. Missing ones
/// are skipped (the load says what is missing).
pub fn warn_if_loose<'a>(
    config_path: &Path,
    keys_file: &Path,
    libraries: impl IntoIterator<Item = &'a Path>,
) {
    let mut paths: Vec<(PathBuf, &str)> = vec![
        (config_path.to_owned(), "config file"),
        (keys_file.to_owned(), "keys file"),
    ];
    for library in libraries {
        if let Some(folder) = library.parent().filter(|p| !p.as_os_str().is_empty()) {
            paths.push((folder.to_owned(), "plugin folder"));
        }
        paths.push((library.to_owned(), "plugin library"));
    }
    let mut seen = std::collections::HashSet::new();
    for (path, what) in paths {
        if !seen.insert(path.clone()) {
            continue;
        }
        use std::os::unix::fs::PermissionsExt;
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        let mode = meta.permissions().mode() & 0o7777;
        if let Some(writers) = loose_writers(mode) {
            tracing::warn!(
                path = %path.display(),
                "{what} is writable by {writers} (mode {mode:04o}): whoever can change it controls the server; make it writable by its owner only"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_may_write_besides_the_owner() {
        for (mode, expected) in [
            (0o600, None),
            (0o644, None),
            (0o755, None),
            (0o640, None),
            (0o660, Some("group")),
            (0o620, Some("group")),
            (0o775, Some("group")),
            (0o646, Some("others")),
            (0o602, Some("others")),
            (0o666, Some("group and others")),
            (0o1777, Some("group and others")),
        ] {
            assert_eq!(loose_writers(mode), expected, "mode {mode:o}");
        }
    }

    #[test]
    fn only_a_regular_file_is_opened_and_a_fifo_at_once() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let fifo = dir.join("fifo");
        let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "made");
        assert!(open_regular(&fifo).is_err(), "refused, not waited on");
        assert!(open_regular(dir).is_err(), "a folder");
        let file = dir.join("lib.so");
        std::fs::write(&file, b"x").unwrap();
        assert!(open_regular(&file).is_ok());
    }

    #[test]
    fn a_replacement_that_fails_leaves_the_old_file_and_no_temporary_one() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let path = dir.join("keys.toml");
        replace_atomically(&path, |file| std::io::Write::write_all(file, b"old")).unwrap();

        let refused = replace_atomically(&path, |file| {
            std::io::Write::write_all(file, b"half")?;
            Err(io::Error::other("disk full"))
        });
        assert!(refused.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        let names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["keys.toml"], "no temporary file is left");

        replace_atomically(&path, |file| std::io::Write::write_all(file, b"new")).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
    }
}
