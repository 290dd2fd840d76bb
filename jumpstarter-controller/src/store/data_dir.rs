//! The controller's data directory and its `ca/` and `server/` subdirectories: created
//! 0700 whatever the umask, and refused when an existing one is writable by group or others
//! (another local user could then replace `ca.key` or the signing key).

use std::{
    os::unix::fs::{DirBuilderExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// Where the CA-issued server certificate is kept (in the data directory).
pub const SERVER_CERT_DIR: &str = "server";

/// The subdirectories holding keys.
pub const KEY_DIRS: [&str; 2] = ["ca", SERVER_CERT_DIR];

/// Why the data directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// A directory is writable by group or others.
    #[error(
        "{path} is writable by {who} (mode {mode:04o}): another local user could replace the \
         controller's keys; run `chmod 0700 {path}` and start again",
        path = path.display()
    )]
    Unsafe {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// "group", "others" or "group and others".
        who: &'static str,
    },
    /// A directory could not be created or inspected.
    #[error("{what} {}", path.display())]
    Io {
        /// What we were doing.
        what: &'static str,
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Creates `dir`, `dir/ca` and `dir/server` as needed (mode 0700, set explicitly so that
/// the umask does not matter), and checks that none of them is writable by group or others.
pub fn prepare(dir: &Path) -> Result<(), DataDirError> {
    ensure_private_dir(dir)?;
    for sub in KEY_DIRS {
        ensure_private_dir(&dir.join(sub))?;
    }
    Ok(())
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DataDirError {
    let path = path.to_path_buf();
    move |source| DataDirError::Io { what, path, source }
}

/// Creates `path` 0700 (with missing parents, also 0700) if it does not exist; refuses an
/// existing one that is group- or other-writable.
fn ensure_private_dir(path: &Path) -> Result<(), DataDirError> {
    match std::fs::metadata(path) {
        Ok(m) => check_mode(path, m.permissions().mode()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(io("cannot create", path))?;
            // The umask may have taken bits away; none can have been added, but set the
            // mode explicitly so that the result never depends on it.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
                .map_err(io("cannot set the mode of", path))
        }
        Err(e) => Err(io("cannot inspect", path)(e)),
    }
}

fn check_mode(path: &Path, mode: u32) -> Result<(), DataDirError> {
    let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (false, false) => return Ok(()),
        (true, false) => "group",
        (false, true) => "others",
        (true, true) => "group and others",
    };
    Err(DataDirError::Unsafe {
        path: path.to_path_buf(),
        mode: mode & 0o7777,
        who,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn new_directories_are_private_and_unsafe_ones_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("a/data");
        prepare(&data).unwrap();
        for p in [
            tmp.path().join("a"),
            data.clone(),
            data.join("ca"),
            data.join("server"),
        ] {
            assert_eq!(mode(&p), 0o700, "{}", p.display());
        }
        // Idempotent.
        prepare(&data).unwrap();

        for (m, who) in [
            (0o777, "group and others"),
            (0o770, "group"),
            (0o703, "others"),
        ] {
            std::fs::set_permissions(data.join("ca"), std::fs::Permissions::from_mode(m)).unwrap();
            let e = prepare(&data).unwrap_err().to_string();
            assert!(e.contains(&data.join("ca").display().to_string()), "{e}");
            assert!(e.contains(&format!("{m:04o}")), "{e}");
            assert!(e.contains(who), "{e}");
            assert!(e.contains("chmod 0700"), "{e}");
        }
        // Readable by others is fine (0755 is a common default); writable is not.
        std::fs::set_permissions(data.join("ca"), std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare(&data).unwrap();
    }
}
