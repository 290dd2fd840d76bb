//! Temporary directories named after the process that made them, so that what a killed
//! process left behind can be found and removed by the next one.
//!
//! A process killed with SIGKILL runs no destructor: the socket directories of `jmp shell`
//! and of exporter hooks, and the medium of a `MockStorageMux` without `file:`, stay in the
//! temporary directory for good. Each is therefore named `NAME-PID-RANDOM` (PID: the
//! process that made it), and [`sweep_in`] removes the ones of a `NAME` whose PID no longer
//! runs and that belong to this user. Whoever makes a directory of a kind sweeps that kind
//! first ([`private_dir_in`]), so leftovers do not accumulate.
//!
//! The PID is looked up in this process's `/proc`: a process of another PID namespace
//! sharing the same temporary directory (and user) is not seen, so containers should not
//! share one.

use std::{
    io,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

/// `NAME-PID-`: how the names this process gives to directories of kind `name` start.
fn own_prefix(name: &str) -> String {
    format!("{name}-{}-", std::process::id())
}

/// The PID in a leftover's file name `NAME-PID-REST` of kind `name` (`None`: not one).
pub fn owner_pid(file_name: &str, name: &str) -> Option<u32> {
    let rest = file_name.strip_prefix(name)?.strip_prefix('-')?;
    let (pid, tail) = rest.split_once('-')?;
    if tail.is_empty() || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Whether a process `pid` runs (as this process sees it).
fn running(pid: u32) -> bool {
    pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists()
}

/// Makes a fresh directory `NAME-PID-RANDOM` in `base` (mode 0700), removed when the
/// returned value is dropped, after sweeping the leftovers of kind `name` ([`sweep_in`]).
pub fn private_dir_in(base: &Path, name: &str) -> io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt as _;
    sweep_in(base, name);
    // tempfile's default follows the umask (0755 under the usual 022).
    tempfile::Builder::new()
        .prefix(&own_prefix(name))
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(base)
}

/// Removes what a killed process left in `base` of kind `name`: entries named
/// `NAME-PID-...` whose PID no longer runs, owned by this user (directories with their
/// content, files; never a symbolic link). Returns what was removed. Errors are logged, not
/// returned: a leftover that cannot be removed must not stop the caller.
pub fn sweep_in(base: &Path, name: &str) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(base) else {
        return removed;
    };
    let uid = rustix::process::geteuid().as_raw();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name.to_str().and_then(|n| owner_pid(n, name)) else {
            continue;
        };
        if running(pid) {
            continue;
        }
        let path = entry.path();
        let result = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.uid() != uid => continue,
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
            Ok(m) if m.is_file() => std::fs::remove_file(&path),
            _ => continue,
        };
        match result {
            Ok(()) => {
                tracing::info!(
                    "removed {} (left by process {pid}, which no longer runs)",
                    path.display()
                );
                removed.push(path);
            }
            Err(e) => tracing::warn!(
                "cannot remove the leftover {}: {e}",
                path.display(),
                e = crate::error_chain(&e)
            ),
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PID no process has (above the kernel's maximum).
    const DEAD: u32 = 4_294_967_294;

    #[test]
    fn owner_pids_are_read_from_our_names_only() {
        assert_eq!(
            owner_pid("jumpstarter-shell-12-abc", "jumpstarter-shell"),
            Some(12)
        );
        assert_eq!(
            owner_pid("jumpstarter-shell-12-", "jumpstarter-shell"),
            None
        );
        assert_eq!(
            owner_pid("jumpstarter-shell-abc", "jumpstarter-shell"),
            None
        );
        assert_eq!(
            owner_pid("jumpstarter-shell-+1-x", "jumpstarter-shell"),
            None
        );
        assert_eq!(
            owner_pid("jumpstarter-shellx-12-a", "jumpstarter-shell"),
            None
        );
        assert_eq!(
            owner_pid("jumpstarter-hook-12-a", "jumpstarter-shell"),
            None
        );
        // Another kind whose name starts like this one.
        assert_eq!(
            owner_pid("jumpstarter-hook-watcher-1-a", "jumpstarter-hook"),
            None
        );
        assert_eq!(
            owner_pid("jumpstarter-shell-99999999999-a", "jumpstarter-shell"),
            None
        );
    }

    #[test]
    fn leftovers_of_dead_processes_are_removed_and_others_kept() {
        let base = tempfile::tempdir().unwrap();
        let p = |n: &str| base.path().join(n);
        let dead_dir = p(&format!("kind-{DEAD}-abc"));
        std::fs::create_dir(&dead_dir).unwrap();
        std::fs::write(dead_dir.join("socket"), b"").unwrap();
        let dead_file = p(&format!("kind-{DEAD}-file"));
        std::fs::write(&dead_file, b"medium").unwrap();
        let live = p(&format!("kind-{}-def", std::process::id()));
        std::fs::create_dir(&live).unwrap();
        let other_kind = p(&format!("other-{DEAD}-x"));
        std::fs::create_dir(&other_kind).unwrap();
        let unnumbered = p("kind-abcdef");
        std::fs::create_dir(&unnumbered).unwrap();
        // A link named like ours: not followed, not removed.
        let target = tempfile::tempdir().unwrap();
        std::fs::write(target.path().join("keep"), b"").unwrap();
        let link = p(&format!("kind-{DEAD}-link"));
        std::os::unix::fs::symlink(target.path(), &link).unwrap();

        let mut removed = sweep_in(base.path(), "kind");
        removed.sort();
        let mut want = vec![dead_dir.clone(), dead_file.clone()];
        want.sort();
        assert_eq!(removed, want);
        assert!(!dead_dir.exists() && !dead_file.exists());
        assert!(live.exists() && other_kind.exists() && unnumbered.exists());
        assert!(link.symlink_metadata().is_ok() && target.path().join("keep").exists());
    }

    #[test]
    fn a_private_dir_is_named_after_this_process_and_sweeps_first() {
        use std::os::unix::fs::PermissionsExt as _;
        let base = tempfile::tempdir().unwrap();
        let stale = base.path().join(format!("kind-{DEAD}-old"));
        std::fs::create_dir(&stale).unwrap();
        let dir = private_dir_in(base.path(), "kind").unwrap();
        assert!(!stale.exists());
        let name = dir
            .path()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(owner_pid(&name, "kind"), Some(std::process::id()), "{name}");
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // This process's own directory survives a sweep; dropped, it is gone.
        assert!(sweep_in(base.path(), "kind").is_empty());
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn a_missing_base_is_nothing_to_sweep() {
        assert!(sweep_in(Path::new("/nonexistent/jumpstarter-leftovers"), "kind").is_empty());
    }
}
