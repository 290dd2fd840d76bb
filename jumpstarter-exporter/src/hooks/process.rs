//! Runs one hook process, as upstream 0.9.0 does: in a PTY (so its output is line-buffered),
//! with upstream's environment, its output line by line to the session's `LogStream`.
//!
//! **No hook child outlives the exporter.** The hook starts in a process group of its own
//! (apart from the exporter's). On timeout the group gets `SIGTERM`, then `SIGKILL` 5 s
//! later; when the run is dropped (the exporter stops, the lease task is cancelled) the group
//! gets `SIGKILL`. Against a `SIGKILL` of the exporter itself, each hook has a *watcher*: a
//! tiny `/bin/sh`, started before the hook and leading the hook's process group, that blocks
//! reading a pipe whose only writer is the exporter; when the exporter dies the kernel closes
//! the pipe, the read returns and the watcher kills the group. (A parent-death signal, `PR_SET_PDEATHSIG`, would need `unsafe` code between fork
//! and exec, which this workspace forbids, and would reach only the direct child.) When the
//! hook ends by itself the watcher is stopped first, so what the hook left running in the
//! background keeps running, as upstream.

use std::{
    io,
    os::fd::{AsFd, OwnedFd},
    path::PathBuf,
    process::Stdio,
    sync::Arc,
    time::Duration,
};

use rustix::{
    fs::OFlags,
    process::{Pid, Signal},
    pty::OpenptFlags,
};
use tokio::io::unix::AsyncFd;

use jumpstarter_core::Session;
use jumpstarter_proto::v1::LogSource;

use super::{HookKind, HookSpec};

/// How long a timed-out hook gets between `SIGTERM` and `SIGKILL`.
const TERM_GRACE: Duration = Duration::from_secs(5);
/// How long the output of an ended hook is still read (a background child may hold the PTY).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest line passed on; longer output is cut into lines of this size.
const MAX_LINE: usize = 64 * 1024;

/// Who the hook runs for, and where its `j` reaches the session.
#[derive(Debug, Clone)]
pub struct HookEnv {
    /// `LEASE_NAME`.
    pub lease_name: String,
    /// `CLIENT_NAME`.
    pub client_name: String,
    /// `JUMPSTARTER_HOST`: the dedicated Unix socket serving the session to the hook.
    pub socket: PathBuf,
    /// `JMP_MOTD_FILE` (beforeLease hooks only, as upstream main): a file whose text is
    /// appended to the message of the day clients get. Without it, an inherited
    /// `JMP_MOTD_FILE` is removed from the hook's environment.
    pub motd_file: Option<PathBuf>,
}

impl HookEnv {
    /// The variables set for the hook (on top of the exporter's environment; `PS1` is
    /// removed), as upstream.
    ///
    /// Their names are fixed here: nothing a client or the controller sends names a variable,
    /// so nothing they send can set one that changes how the hook's shell behaves (`PS4`,
    /// `SHELLOPTS`, `BASH_ENV`, `LD_PRELOAD`, ...). The two values that come from outside,
    /// `LEASE_NAME` and `CLIENT_NAME` (the controller's names of the lease and of its
    /// client), are passed only when they are plain object names (at most 253 ASCII
    /// letters, digits, `-`, `.` and `_`, starting with a letter or digit); anything else is
    /// passed as the empty string, with a warning.
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            (
                "JUMPSTARTER_HOST",
                self.socket.to_string_lossy().into_owned(),
            ),
            ("JMP_DRIVERS_ALLOW", "UNSAFE".into()),
            ("LEASE_NAME", plain_name("LEASE_NAME", &self.lease_name)),
            ("CLIENT_NAME", plain_name("CLIENT_NAME", &self.client_name)),
            ("TERM", "dumb".into()),
            ("DEBIAN_FRONTEND", "noninteractive".into()),
            ("GIT_TERMINAL_PROMPT", "0".into()),
        ];
        if let Some(motd) = &self.motd_file {
            vars.push((JMP_MOTD_FILE, motd.to_string_lossy().into_owned()));
        }
        vars
    }
}

/// The variable naming the file a beforeLease hook may write motd text to.
pub const JMP_MOTD_FILE: &str = "JMP_MOTD_FILE";

/// The most of a hook's motd file that is read (upstream main's cap).
pub const MAX_MOTD_BYTES: u64 = 64 * 1024;

/// What a hook wrote to its motd file `path` (at most [`MAX_MOTD_BYTES`], trimmed), or
/// `None` (with a warning) when it is not a regular file or cannot be read. Opened without
/// blocking and without following a symlink: the hook controls the path's contents.
pub fn read_motd_file(path: &std::path::Path) -> Option<String> {
    use std::{io::Read, os::unix::fs::OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlags::NONBLOCK | OFlags::NOFOLLOW).bits() as i32)
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(
                "cannot open the hook's motd file {}: {e}",
                path.display(),
                e = jumpstarter_core::error_chain(&e)
            );
            return None;
        }
    };
    match file.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            tracing::warn!(
                "the hook's motd file {} is not a regular file; ignored",
                path.display()
            );
            return None;
        }
        Err(e) => {
            tracing::warn!(
                "cannot read the hook's motd file {}: {e}",
                path.display(),
                e = jumpstarter_core::error_chain(&e)
            );
            return None;
        }
    }
    let mut bytes = Vec::new();
    if let Err(e) = file.take(MAX_MOTD_BYTES).read_to_end(&mut bytes) {
        tracing::warn!(
            "cannot read the hook's motd file {}: {e}",
            path.display(),
            e = jumpstarter_core::error_chain(&e)
        );
        return None;
    }
    Some(String::from_utf8_lossy(&bytes).trim().to_string())
}

/// The longest name passed to a hook (a Kubernetes object name's limit).
const MAX_NAME: usize = 253;

/// `value` when it is a plain object name (what a controller names leases and clients:
/// Kubernetes object names, UUIDs): at most [`MAX_NAME`] ASCII letters, digits, `-`, `.` and
/// `_`, starting with a letter or digit. Anything else (spaces, quotes, `$`, `;`, globs,
/// control characters, a NUL byte, a leading `-` that a command would read as an option) is
/// replaced by the empty string, so that a hook that uses `$CLIENT_NAME` unquoted, in a
/// command line or in a log line cannot be steered by the name. The names come from the
/// controller; an exporter does not trust them to be well formed.
fn plain_name(var: &str, value: &str) -> String {
    let plain = value.len() <= MAX_NAME
        && value
            .chars()
            .next()
            .is_none_or(|c| c.is_ascii_alphanumeric())
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if plain {
        value.to_string()
    } else {
        let shown: String = value.chars().take(80).collect();
        let cut = if shown.len() < value.len() { "..." } else { "" };
        tracing::warn!(
            "{var} {shown:?}{cut} is not a plain object name (letters, digits, '-', '.', \
             '_'); the hook gets {var} empty"
        );
        String::new()
    }
}

/// What one run of a hook left: upstream's verdict and the last lines of its output.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// `Err` carries upstream's failure message (`Hook failed with exit code N`,
    /// `Hook timed out after N seconds`, `Error executing hook: ...`).
    pub result: Result<(), String>,
    /// The last lines of its output (at most [`TAIL_LINES`] lines, [`TAIL_BYTES`] bytes).
    pub last_output: String,
}

impl Outcome {
    fn failed(message: String) -> Self {
        Self {
            result: Err(message),
            last_output: String::new(),
        }
    }
}

/// Lines of output an [`Outcome`] keeps.
pub const TAIL_LINES: usize = 20;
/// Bytes of output an [`Outcome`] keeps.
pub const TAIL_BYTES: usize = 2048;

/// Where a hook's output goes: which hook it is (`key`, for the exporter's log) and the
/// `LogStream` source its lines carry in `session`.
#[derive(Clone)]
pub struct OutputTo {
    /// `beforeLease`, `afterLease` or `healthCheck`.
    pub key: &'static str,
    /// The `LogStream` source.
    pub source: LogSource,
    /// The session whose `LogStream` gets the lines.
    pub session: Arc<Session>,
}

impl OutputTo {
    /// The output of lease hook `kind`, to `session`.
    pub fn hook(kind: HookKind, session: &Arc<Session>) -> Self {
        Self {
            key: kind.key(),
            source: kind.log_source(),
            session: Arc::clone(session),
        }
    }
}

/// Runs `spec`; its output goes to `out` (and the exporter's log).
pub async fn run(spec: &HookSpec, out: OutputTo, env: &HookEnv) -> Outcome {
    if spec.script.trim().is_empty() {
        tracing::debug!("{} hook script is empty; skipped", out.key);
        return Outcome {
            result: Ok(()),
            last_output: String::new(),
        };
    }
    let key = out.key;
    let argv = spec.command_line();
    // The watcher first, and the hook in its process group: an exporter killed at any
    // moment after the hook started leaves a watcher to kill it.
    let mut group = GroupGuard::new();
    let (master, mut child) = match spawn(&argv, spec.path.as_deref(), env, group.pgid) {
        Ok(x) => x,
        Err(e) => {
            group.disarm().await;
            return Outcome::failed(format!(
                "Error executing hook: {}: {e}",
                argv[0],
                e = jumpstarter_core::error_chain(&e)
            ));
        }
    };
    let Some(pid) = child.id().and_then(|id| Pid::from_raw(id as i32)) else {
        group.disarm().await;
        return Outcome::failed("Error executing hook: the hook process vanished at once".into());
    };
    group.pgid.get_or_insert(pid);
    let reader = tokio::spawn(forward_output(master, out));
    let result = match tokio::time::timeout(spec.timeout, child.wait()).await {
        Ok(Ok(status)) => {
            group.disarm().await;
            exit_result(status)
        }
        Ok(Err(e)) => Err(format!(
            "Error executing hook: {e}",
            e = jumpstarter_core::error_chain(&e)
        )),
        Err(_) => {
            let msg = format!("Hook timed out after {} seconds", spec.timeout.as_secs());
            tracing::error!("{key} hook: {msg}");
            group.signal(Signal::TERM);
            if tokio::time::timeout(TERM_GRACE, child.wait())
                .await
                .is_err()
            {
                group.signal(Signal::KILL);
                let _ = child.wait().await;
            }
            Err(msg)
        }
    };
    let mut reader = reader;
    let last_output = match tokio::time::timeout(DRAIN_TIMEOUT, &mut reader).await {
        Ok(Ok(tail)) => tail,
        Ok(Err(_)) => String::new(),
        Err(_) => {
            reader.abort();
            String::new()
        }
    };
    Outcome {
        result,
        last_output,
    }
}

fn exit_result(status: std::process::ExitStatus) -> Result<(), String> {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => Ok(()),
        (Some(c), _) => Err(format!("Hook failed with exit code {c}")),
        // Python's subprocess reports -N for a death by signal N.
        (None, Some(sig)) => Err(format!("Hook failed with exit code -{sig}")),
        (None, None) => Err("Hook failed".into()),
    }
}

/// Opens a PTY and starts the hook on its slave side, in a new process group.
/// Spawns the hook in process group `group` (its watcher's), or in a group of its own.
fn spawn(
    argv: &[String],
    path: Option<&std::ffi::OsStr>,
    env: &HookEnv,
    group: Option<Pid>,
) -> io::Result<(OwnedFd, tokio::process::Child)> {
    // Close-on-exec: later children of the exporter do not inherit the master.
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    let slave_path = PathBuf::from(
        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name.as_bytes()),
    );
    let child = {
        use std::os::unix::fs::OpenOptionsExt;
        let slave: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(OFlags::NOCTTY.bits() as i32)
            .open(&slave_path)?
            .into();
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .envs(env.vars())
            .envs(path.map(|p| ("PATH", p)))
            .env_remove("PS1");
        if env.motd_file.is_none() {
            cmd.env_remove(JMP_MOTD_FILE);
        }
        cmd.stdin(Stdio::from(slave.try_clone()?))
            .stdout(Stdio::from(slave.try_clone()?))
            .stderr(Stdio::from(slave))
            .process_group(group.map_or(0, |g| g.as_raw_nonzero().get()))
            .kill_on_drop(true);
        cmd.spawn()?
        // `cmd` (and with it the parent's copies of the slave) is dropped here, so the
        // master reads EOF/EIO once the hook and its children have closed the PTY.
    };
    // The master is read on the runtime: non-blocking.
    let flags = rustix::fs::fcntl_getfl(&master)?;
    rustix::fs::fcntl_setfl(&master, flags | OFlags::NONBLOCK)?;
    Ok((master, child))
}

/// Reads the PTY master until EOF, passing each non-empty line to the session's `LogStream`
/// and the exporter's log; returns the last lines.
async fn forward_output(master: OwnedFd, out: OutputTo) -> String {
    let mut tail = Tail::default();
    // `AsyncFd::new` is deprecated for fds it does not own; here it owns the `OwnedFd` for
    // the whole registration, which is what I/O safety asks (the safe-by-construction
    // alternative, `register`, is `unsafe`).
    #[allow(deprecated)]
    let master = AsyncFd::new(master);
    let master = match master {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(
                "{} hook: cannot read its output: {e}",
                out.key,
                e = jumpstarter_core::error_chain(&e)
            );
            return String::new();
        }
    };
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 4096];
    let mut emit = |line: &[u8]| {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end();
        if !text.is_empty() {
            tracing::info!(target: "hook", "[{}] {text}", out.key);
            out.session.hook_log(out.source, "INFO", text.to_string());
            tail.push(text);
        }
    };
    loop {
        let Ok(mut ready) = master.readable().await else {
            break;
        };
        match ready.try_io(|fd| {
            rustix::io::read(fd.get_ref().as_fd(), &mut buf[..]).map_err(io::Error::from)
        }) {
            Ok(Ok(0)) | Ok(Err(_)) => break, // EOF, or EIO once every slave fd is closed
            Ok(Ok(n)) => {
                pending.extend_from_slice(&buf[..n]);
                while let Some(i) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=i).collect();
                    emit(&line);
                }
                if pending.len() >= MAX_LINE {
                    emit(&pending);
                    pending.clear();
                }
            }
            Err(_would_block) => continue,
        }
    }
    emit(&pending);
    tail.text()
}

/// The last lines of a hook's output (bounded: [`TAIL_LINES`], [`TAIL_BYTES`]).
#[derive(Default)]
struct Tail {
    lines: std::collections::VecDeque<String>,
    bytes: usize,
}

impl Tail {
    fn push(&mut self, line: &str) {
        let mut line = line.to_string();
        if line.len() > TAIL_BYTES {
            let mut cut = line.len() - TAIL_BYTES;
            while !line.is_char_boundary(cut) {
                cut += 1;
            }
            line.drain(..cut);
        }
        self.bytes += line.len() + 1;
        self.lines.push_back(line);
        while self.lines.len() > TAIL_LINES || self.bytes > TAIL_BYTES {
            match self.lines.pop_front() {
                Some(l) => self.bytes -= l.len() + 1,
                None => break,
            }
        }
    }

    fn text(&self) -> String {
        self.lines
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Kills the hook's process group when dropped (and, through its watcher, when the exporter
/// dies).
///
/// The watcher is started before the hook and leads the process group the hook joins: its
/// pid is the group's id before the hook exists. (Started after the hook, for the hook's own
/// group, a `SIGKILL` of the exporter between the two spawns left the hook without one.)
struct GroupGuard {
    /// The process group: the watcher's, or (without a watcher) the hook's own once spawned.
    pgid: Option<Pid>,
    watcher: Option<(tokio::process::Child, std::io::PipeWriter)>,
    armed: bool,
}

impl GroupGuard {
    fn new() -> Self {
        let (pgid, watcher) = match start_watcher() {
            Ok((pid, child, writer)) => (Some(pid), Some((child, writer))),
            Err(e) => {
                tracing::warn!(
                    "hook watcher: {e}; the hook may outlive a killed exporter",
                    e = jumpstarter_core::error_chain(&e)
                );
                (None, None)
            }
        };
        Self {
            pgid,
            watcher,
            armed: true,
        }
    }

    fn signal(&self, sig: Signal) {
        // The group may be gone already (ESRCH): nothing to do then.
        if let Some(pgid) = self.pgid {
            let _ = rustix::process::kill_process_group(pgid, sig);
        }
    }

    /// The hook ended by itself: stop the watcher without touching the group.
    async fn disarm(&mut self) {
        self.armed = false;
        if let Some((mut child, writer)) = self.watcher.take() {
            let _ = child.kill().await;
            drop(writer);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            self.signal(Signal::KILL);
        }
        // Dropping the writer makes an armed watcher kill the group too; a disarmed one is
        // gone already.
        self.watcher.take();
    }
}

/// Starts a watcher leading a process group of its own (see the module docs): the group's id
/// (its pid), the watcher, and the pipe's only writer. It ignores the `SIGTERM` a timed-out
/// hook's group gets, so that it still guards the grace period before the `SIGKILL`.
fn start_watcher() -> io::Result<(Pid, tokio::process::Child, std::io::PipeWriter)> {
    let (reader, writer) = std::io::pipe()?;
    let child = tokio::process::Command::new("/bin/sh")
        .args([
            "-c",
            "trap '' TERM INT HUP; read _ignored; kill -9 \"-$$\" 2>/dev/null",
            "jumpstarter-hook-watcher",
        ])
        .stdin(Stdio::from(reader))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(Pid::from_raw)
        .ok_or_else(|| io::Error::other("the watcher exited at once"))?;
    Ok((pid, child, writer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_reach_a_hook() {
        for ok in [
            "",
            "standalone",
            "my-client",
            "lab.client_1",
            "0199a3b2-7c4e-7d1a-9f00-123456789abc",
            "Upper",
        ] {
            assert_eq!(plain_name("CLIENT_NAME", ok), ok);
        }
        for bad in [
            "$(touch /tmp/x)",
            "`id`",
            "a b",
            "a;b",
            "a*",
            "a\nb",
            "a\0b",
            "-rf",
            ".hidden",
            "ns/name",
            "\u{1b}[2J",
            "caf\u{e9}",
        ] {
            assert_eq!(plain_name("CLIENT_NAME", bad), "", "{bad:?}");
        }
        assert_eq!(
            plain_name("LEASE_NAME", &"a".repeat(MAX_NAME)).len(),
            MAX_NAME
        );
        assert_eq!(plain_name("LEASE_NAME", &"a".repeat(MAX_NAME + 1)), "");
        let env = HookEnv {
            lease_name: "lease-1".into(),
            client_name: "x; $(reboot)".into(),
            socket: PathBuf::from("/run/hook.sock"),
            motd_file: None,
        };
        let vars: std::collections::BTreeMap<_, _> = env.vars().into_iter().collect();
        assert_eq!(vars["LEASE_NAME"], "lease-1");
        assert_eq!(vars["CLIENT_NAME"], "");
        // Only these fixed names, none of which a shell or the loader reads.
        assert_eq!(
            vars.keys().copied().collect::<Vec<_>>(),
            [
                "CLIENT_NAME",
                "DEBIAN_FRONTEND",
                "GIT_TERMINAL_PROMPT",
                "JMP_DRIVERS_ALLOW",
                "JUMPSTARTER_HOST",
                "LEASE_NAME",
                "TERM"
            ]
        );
    }

    #[test]
    fn tail_keeps_the_last_lines_within_bounds() {
        let mut t = Tail::default();
        for i in 0..50 {
            t.push(&format!("line {i}"));
        }
        let text = t.text();
        assert!(text.starts_with("line 30\n"), "{text}");
        assert!(text.ends_with("line 49"), "{text}");
        let mut t = Tail::default();
        t.push(&"é".repeat(3000));
        assert!(t.text().len() <= TAIL_BYTES);
        t.push("last");
        assert_eq!(t.text(), "last");
    }
}
