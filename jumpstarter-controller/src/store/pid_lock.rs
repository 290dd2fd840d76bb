//! One controller per data directory (and per admin config): an advisory lock on a file
//! that holds the PID of the controller holding it, released when the controller stops
//! (or dies: the kernel drops the lock with the process).

use std::{
    fs::{File, OpenOptions, TryLockError},
    io::{Read, Seek, Write},
    path::{Path, PathBuf},
};

/// The lock file in a data directory.
pub const DATA_DIR_LOCK: &str = "controller.lock";

/// Why a lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error("{what} {path} is in use by another jumpstarter-controller ({holder})")]
    Held {
        /// What the lock guards (`data directory`, `admin config`).
        what: &'static str,
        /// What it guards: the directory or file.
        path: PathBuf,
        /// `PID 1234`, or what is known of the holder.
        holder: String,
    },
    /// The lock file could not be used.
    #[error("cannot lock {path}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A held lock; dropping it releases it.
#[derive(Debug)]
pub struct PidLock {
    _file: File,
    #[cfg_attr(not(test), allow(dead_code))]
    path: PathBuf,
}

impl PidLock {
    /// Locks `lock_file` (created if needed) for this process and writes our PID in it;
    /// `what` and `guarded` name what it protects in the error when another process holds
    /// it.
    pub fn acquire(
        lock_file: &Path,
        what: &'static str,
        guarded: &Path,
    ) -> Result<Self, LockError> {
        let io = |source| LockError::Io {
            path: lock_file.to_path_buf(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(lock_file)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let holder = match text.trim().parse::<u32>() {
                    Ok(pid) => format!("PID {pid}"),
                    Err(_) => format!("its PID is not in {} yet", lock_file.display()),
                };
                return Err(LockError::Held {
                    what,
                    path: guarded.to_path_buf(),
                    holder,
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(Self {
            _file: file,
            path: lock_file.to_path_buf(),
        })
    }

    /// Locks the data directory `dir` ([`DATA_DIR_LOCK`] in it).
    pub fn data_dir(dir: &Path) -> Result<Self, LockError> {
        Self::acquire(&dir.join(DATA_DIR_LOCK), "data directory", dir)
    }

    /// Locks the admin config `path` (`PATH.lock` beside it), so that a second controller
    /// does not rewrite the admin config of a running one.
    pub fn admin_config(path: &Path) -> Result<Self, LockError> {
        let mut name = path.as_os_str().to_owned();
        name.push(".lock");
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| LockError::Io {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        Self::acquire(Path::new(&name), "admin config", path)
    }

    /// The lock file.
    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_second_lock_names_the_holders_pid_until_the_first_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let first = PidLock::data_dir(dir.path()).unwrap();
        let text = std::fs::read_to_string(first.path()).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        let e = PidLock::data_dir(dir.path()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "data directory {} is in use by another jumpstarter-controller (PID {})",
                dir.path().display(),
                std::process::id()
            )
        );
        drop(first);
        let again = PidLock::data_dir(dir.path()).unwrap();
        drop(again);
    }

    #[test]
    fn the_admin_config_lock_sits_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let admin = dir.path().join("sub").join("admin.yaml");
        let lock = PidLock::admin_config(&admin).unwrap();
        assert_eq!(lock.path(), dir.path().join("sub").join("admin.yaml.lock"));
        let e = PidLock::admin_config(&admin).unwrap_err().to_string();
        assert!(e.starts_with("admin config "), "{e}");
    }
}
