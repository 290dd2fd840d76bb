//! Writing files only their owner may read: tokens, keys, and configs holding credentials.

use std::{
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

/// Distinguishes the temporary files of concurrent writers in one process.
static NEXT_TMP: AtomicU64 = AtomicU64::new(0);

/// Writes `contents` to `path` atomically with mode 0600, creating the directory if needed.
///
/// The bytes go to a new temporary file in the same directory (created with mode 0600, never
/// an existing file or link), which is synced to disk and then renamed over `path`: readers
/// see the old file or the whole new one, never a part, and a crash never leaves a
/// half-written secret. On failure the temporary file is removed and `path` is unchanged.
pub fn write_private_file(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = temporary_path(dir, path);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return written;
    }
    // The rename itself survives a crash once the directory is synced (best effort: some
    // filesystems refuse to sync a directory).
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// `.<name>.<pid>.<n>.tmp` beside `path`.
fn temporary_path(dir: &Path, path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = NEXT_TMP.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn writes_a_new_file_0600_creating_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/secret");
        write_private_file(&path, b"token").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"token");
        assert_eq!(mode(&path), 0o600);
        // Nothing but the file is left in its directory.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("a/b"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("secret")]);
    }

    #[test]
    fn replaces_a_readable_file_with_a_private_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, "old, longer contents").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private_file(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(mode(&path), 0o600);
    }

    #[test]
    fn a_failed_write_leaves_the_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        // The target is a directory: the rename fails.
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), "x").unwrap();
        assert!(write_private_file(&path, b"data").is_err());
        assert!(path.is_dir());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("taken")]);
    }
}
