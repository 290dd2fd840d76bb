//! A QEMU process in a process group of its own that never outlives the exporter.
//!
//! The group is killed when the board is switched off, when the [`ProcessGroup`] is dropped
//! (the session ended, the exporter stopped) and, against a `SIGKILL` of the exporter, by a
//! *watcher*: a tiny `/bin/sh` in its own process group that blocks reading a pipe whose only
//! writer is the exporter. When the exporter dies the kernel closes the pipe, the read
//! returns and the watcher kills the group. (`PR_SET_PDEATHSIG` would need `unsafe` code
//! between fork and exec, which this workspace forbids; the hooks of the exporter runtime
//! use the same watcher.)

use std::{io, process::ExitStatus, time::Duration};

use rustix::process::{Pid, Signal};

/// A running QEMU: its process group and the cloud-init directory it serves.
pub struct Vm {
    /// QEMU's process group.
    pub group: ProcessGroup,
    /// The cloud-init `CIDATA` directory, kept while QEMU serves it.
    pub _cidata: tempfile::TempDir,
}

/// A spawned process leading its own group, with its watcher.
pub struct ProcessGroup {
    child: tokio::process::Child,
    pgid: Option<Pid>,
    watcher: Option<(tokio::process::Child, std::io::PipeWriter)>,
}

impl ProcessGroup {
    /// Spawns `cmd` as the leader of a new process group and starts its watcher.
    pub fn spawn(cmd: &mut tokio::process::Command) -> io::Result<Self> {
        let child = cmd.process_group(0).kill_on_drop(true).spawn()?;
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw);
        let watcher = match pgid.map(start_watcher).transpose() {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(
                    "QEMU process group: no watcher ({e}); QEMU may outlive a killed exporter",
                    e = jumpstarter_core::error_chain(&e)
                );
                None
            }
        };
        Ok(Self {
            child,
            pgid,
            watcher,
        })
    }

    /// The leader's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The exit status if the leader has exited.
    pub fn try_exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    fn signal(&self, sig: Signal) {
        if let Some(pgid) = self.pgid {
            // The group may be gone already (ESRCH): nothing to do then.
            let _ = rustix::process::kill_process_group(pgid, sig);
        }
    }

    /// `SIGTERM` to the group, `SIGKILL` after `grace`; waits for the leader.
    pub async fn stop(mut self, grace: Duration) {
        self.signal(Signal::TERM);
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            self.signal(Signal::KILL);
            let _ = self.child.wait().await;
        }
        // Anything else left in the group goes too.
        self.signal(Signal::KILL);
        self.pgid = None;
        self.disarm().await;
    }

    /// Stops the watcher without touching the group.
    async fn disarm(&mut self) {
        if let Some((mut w, writer)) = self.watcher.take() {
            let _ = w.kill().await;
            drop(writer);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.signal(Signal::KILL);
        if let Some((mut w, writer)) = self.watcher.take() {
            let _ = w.start_kill();
            drop(writer);
        }
    }
}

/// Starts the watcher of process group `pgid` (see the module docs).
fn start_watcher(pgid: Pid) -> io::Result<(tokio::process::Child, std::io::PipeWriter)> {
    let (reader, writer) = std::io::pipe()?;
    let child = tokio::process::Command::new("/bin/sh")
        .args([
            "-c",
            "read _ignored; kill -9 \"-$1\" 2>/dev/null",
            "jumpstarter-qemu-watcher",
        ])
        .arg(pgid.as_raw_nonzero().to_string())
        .stdin(std::process::Stdio::from(reader))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    Ok((child, writer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: u32) -> bool {
        rustix::process::test_kill_process(Pid::from_raw(i32::try_from(pid).unwrap()).unwrap())
            .is_ok()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
    }

    async fn gone_within(pid: u32) -> bool {
        for _ in 0..100 {
            if !alive(pid) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    #[tokio::test]
    async fn stop_and_drop_kill_the_whole_group() {
        // A leader with a child of its own that ignores SIGTERM.
        let script = "trap '' TERM; sleep 600 & echo $!; wait";
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", script])
            .stdout(std::process::Stdio::piped());
        let mut g = ProcessGroup::spawn(&mut cmd).unwrap();
        let leader = g.pid().unwrap();
        let mut out = tokio::io::BufReader::new(g.child.stdout.take().unwrap());
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
            .await
            .unwrap();
        let grandchild: u32 = line.trim().parse().unwrap();
        assert!(alive(grandchild));
        g.stop(Duration::from_millis(200)).await;
        assert!(gone_within(leader).await);
        assert!(
            gone_within(grandchild).await,
            "the group's other member survived stop"
        );

        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", "sleep 600"]);
        let g = ProcessGroup::spawn(&mut cmd).unwrap();
        let leader = g.pid().unwrap();
        drop(g);
        assert!(gone_within(leader).await, "drop left the group running");
    }
}
