//! podman as the container image steps run it ([`crate::images_run`], and the comparison
//! with the Dockerfiles, [`crate::images_layout`]): a store of its own, runc, cgroupfs.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::procs;

/// The OCI runtime (crun fails on hybrid cgroup hierarchies).
const RUNC: &str = "/usr/sbin/runc";

/// The images' user and group.
pub const NONROOT: u32 = 65532;

/// Installs podman and runc with `apt-get` when either is missing (once: a later run finds
/// them).
pub fn ensure_podman() -> Result<()> {
    let have_podman = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if have_podman && Path::new(RUNC).is_file() {
        return Ok(());
    }
    crate::workspace::apt_install(
        &["podman", "runc"],
        true,
        "the container images are run with them",
    )?;
    ensure!(
        Path::new(RUNC).is_file(),
        "apt-get installed runc, but {RUNC} is not there"
    );
    Ok(())
}

/// podman with this step's store and runtime settings.
pub struct Podman {
    root: PathBuf,
    runroot: PathBuf,
}

impl Podman {
    pub fn new() -> Self {
        let root = crate::cache_root().join("podman");
        // Run state (locks, pids) belongs in a directory a reboot clears; one per store.
        let runroot = std::env::temp_dir().join(format!(
            "jumpstarter-rs-podman-{}",
            crate::workspace::short_hash(&root.display().to_string())
        ));
        Self { root, runroot }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("podman");
        c.arg("--root")
            .arg(&self.root)
            .arg("--runroot")
            .arg(&self.runroot)
            .args(["--runtime", RUNC, "--cgroup-manager", "cgroupfs"])
            .args(["--events-backend", "file"])
            .args(args);
        c
    }

    /// Runs podman to completion; its stdout, or an error with its output.
    pub fn run(&self, args: &[&str], timeout: Duration) -> Result<String> {
        self.run_cmd(self.command(args), timeout)
    }

    pub fn run_cmd(&self, cmd: Command, timeout: Duration) -> Result<String> {
        let what = format!("{cmd:?}");
        let out = procs::run(cmd, timeout)?;
        ensure!(
            out.code == 0,
            "{what} exited with {}:\n{}{}",
            out.code,
            out.stdout,
            out.stderr
        );
        Ok(out.stdout)
    }

    /// A container's log so far (stdout and stderr).
    pub fn logs(&self, name: &str) -> String {
        procs::run(self.command(&["logs", name]), Duration::from_secs(30))
            .map(|o| format!("{}{}", o.stdout, o.stderr))
            .unwrap_or_else(|e| format!("(podman logs {name}: {e:#})"))
    }

    /// Waits until the log of the running container `name` contains `needle`.
    pub fn wait_for_log(&self, name: &str, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let logs = self.logs(name);
            if logs.contains(needle) {
                return Ok(());
            }
            let state = self
                .run(
                    &["inspect", "--format", "{{.State.Status}}", name],
                    Duration::from_secs(30),
                )
                .unwrap_or_default();
            if state.trim() != "running" {
                bail!(
                    "container {name} is {} before it printed {needle:?}; its log:\n{logs}",
                    state.trim()
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "container {name} did not print {needle:?} within {timeout:?}; its log:\n{logs}"
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Checks that the running container `name` has a read-only root file system and that
    /// its process runs as 65532:65532.
    pub fn check_confined(&self, name: &str) -> Result<()> {
        let out = self.run(
            &[
                "inspect",
                "--format",
                "{{.State.Pid}} {{.HostConfig.ReadonlyRootfs}}",
                name,
            ],
            Duration::from_secs(30),
        )?;
        let (pid, read_only) = out
            .trim()
            .split_once(' ')
            .with_context(|| format!("podman inspect {name}: {out}"))?;
        ensure!(
            read_only == "true",
            "container {name}: the root file system is not read-only"
        );
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("container {name}: its process {pid}"))?;
        for key in ["Uid:", "Gid:"] {
            let ids: Vec<&str> = status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .unwrap_or_default()
                .split_whitespace()
                .collect();
            ensure!(
                ids.len() == 4 && ids.iter().all(|id| *id == NONROOT.to_string()),
                "container {name}: its process {pid} runs with {key} {ids:?}, not {NONROOT}"
            );
        }
        Ok(())
    }
}
