//! Runs one shell method in its own process group and streams its output.

use std::{collections::BTreeMap, path::Path, process::Stdio, time::Duration};

use futures::StreamExt;
use jumpstarter_core::{CallContext, DriverError, driver::ValueStream, value};
use rustix::process::{Pid, Signal, kill_process_group};
use tokio::{
    io::{AsyncRead, AsyncReadExt},
    process::Command,
    sync::mpsc,
    time::Instant,
};

/// The exit code upstream reports when a method's timeout expired.
pub const TIMEOUT_EXIT_CODE: i64 = 199;

/// Bytes read from a pipe at a time.
const CHUNK: usize = 8192;
/// Output items queued for the client before the process is made to wait.
const QUEUE: usize = 16;
/// How long SIGTERM has to end a timed-out method before SIGKILL (as upstream).
const TERM_GRACE: Duration = Duration::from_secs(5);
/// After the method exits, how long its output pipes may stay open (held by a process it
/// left in the background) before the call ends without the rest.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// One `[stdout, stderr, returncode]` item.
type Item = (String, String, Option<i64>);

/// Kills the method's process group unless it was reaped normally.
struct GroupGuard {
    pid: Option<Pid>,
}

impl GroupGuard {
    fn signal(&self, sig: Signal) {
        if let Some(pid) = self.pid {
            // The group may be gone already: nothing to do then.
            let _ = kill_process_group(pid, sig);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.signal(Signal::KILL);
    }
}

/// Starts `argv` (shell, its flags, the script, `$0`, the arguments) and streams its output.
pub(super) fn start(
    method: &str,
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&Path>,
    timeout: Duration,
    ctx: CallContext,
) -> Result<ValueStream, DriverError> {
    let (program, rest) = argv
        .split_first()
        .ok_or_else(|| DriverError::failed("the shell names no program"))?;
    let mut cmd = Command::new(program);
    cmd.args(rest)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| DriverError::because(format!("cannot start {program}"), e))?;
    let guard = GroupGuard {
        pid: child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw),
    };
    let (stdout, stderr) = match (child.stdout.take(), child.stderr.take()) {
        (Some(o), Some(e)) => (o, e),
        _ => return Err(DriverError::failed("the method's output pipes are missing")),
    };
    let (tx, rx) = mpsc::channel::<Result<jumpstarter_core::value::Value, DriverError>>(QUEUE);
    let method = method.to_string();
    let shown = format!("{argv:?}");
    tokio::spawn(async move {
        let mut guard = guard;
        let deadline = Instant::now() + timeout;
        let send = |item: Item| {
            let tx = tx.clone();
            async move {
                let v = value::to_value(&item).map_err(DriverError::from);
                tx.send(v).await.is_ok()
            }
        };
        let mut out = Pipe::new(stdout);
        let mut err = Pipe::new(stderr);
        let mut status = None;
        let mut drain_until = None;
        loop {
            if out.eof && err.eof && status.is_some() {
                break;
            }
            let until = drain_until.unwrap_or(deadline).min(deadline);
            tokio::select! {
                text = out.read(), if !out.eof => {
                    if !text.is_empty() && !send((text, String::new(), None)).await {
                        return; // the client went away: the guard kills the group
                    }
                }
                text = err.read(), if !err.eof => {
                    if !text.is_empty() && !send((String::new(), text, None)).await {
                        return;
                    }
                }
                s = child.wait(), if status.is_none() => {
                    status = Some(s);
                    drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
                }
                _ = tokio::time::sleep_until(until) => {
                    if status.is_some() {
                        break; // exited; a background process holds the pipes
                    }
                    guard.signal(Signal::TERM);
                    if tokio::time::timeout(TERM_GRACE, child.wait()).await.is_err() {
                        ctx.log_warning(format!("{method}: SIGTERM did not end it, sending SIGKILL"));
                        guard.signal(Signal::KILL);
                        let _ = child.wait().await;
                    }
                    guard.pid = None;
                    let secs = timeout.as_secs_f64();
                    let msg = format!(
                        "\nTimeout expired while running {method}: Command '{shown}' timed out after {secs} seconds\n"
                    );
                    ctx.log_warning(msg.trim().to_string());
                    send((String::new(), msg, Some(TIMEOUT_EXIT_CODE))).await;
                    return;
                }
                _ = tx.closed() => return,
            }
        }
        guard.pid = None;
        let code = match status {
            Some(Ok(s)) => exit_code(s),
            Some(Err(e)) => {
                let _ = tx
                    .send(Err(DriverError::because(
                        format!("waiting for {method}"),
                        e,
                    )))
                    .await;
                return;
            }
            None => return,
        };
        if code != 0 {
            ctx.log_info(format!("{method} return code: {code}"));
        }
        send((out.rest(), err.rest(), Some(code))).await;
    });
    Ok(
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
            .boxed(),
    )
}

/// The exit code as Python's `returncode`: the status, or minus the signal that killed it.
fn exit_code(s: std::process::ExitStatus) -> i64 {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => i64::from(c),
        (None, Some(sig)) => -i64::from(sig),
        (None, None) => -1,
    }
}

/// One output pipe, decoded as UTF-8 across chunk boundaries.
struct Pipe<R> {
    reader: R,
    pending: Vec<u8>,
    eof: bool,
}

impl<R: AsyncRead + Unpin> Pipe<R> {
    fn new(reader: R) -> Self {
        Self {
            reader,
            pending: Vec::new(),
            eof: false,
        }
    }

    /// Reads a chunk and returns the text it completes (empty at EOF or mid-character).
    async fn read(&mut self) -> String {
        let mut buf = [0u8; CHUNK];
        match self.reader.read(&mut buf).await {
            Ok(0) | Err(_) => {
                self.eof = true;
                String::new()
            }
            Ok(n) => {
                self.pending.extend_from_slice(&buf[..n]);
                decode(&mut self.pending, false)
            }
        }
    }

    /// What is left once the pipe ended.
    fn rest(&mut self) -> String {
        decode(&mut self.pending, true)
    }
}

/// Decodes `buf` as UTF-8 (invalid bytes become U+FFFD, as upstream's `errors='replace'`),
/// keeping an incomplete last character for the next chunk unless `eof`.
fn decode(buf: &mut Vec<u8>, eof: bool) -> String {
    let mut out = String::new();
    let mut start = 0;
    while start < buf.len() {
        match std::str::from_utf8(&buf[start..]) {
            Ok(s) => {
                out.push_str(s);
                start = buf.len();
            }
            Err(e) => {
                let valid = start + e.valid_up_to();
                out.push_str(&String::from_utf8_lossy(&buf[start..valid]));
                match e.error_len() {
                    Some(n) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        start = valid + n;
                    }
                    None if eof => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        start = buf.len();
                    }
                    None => {
                        start = valid;
                        break;
                    }
                }
            }
        }
    }
    buf.drain(..start);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_across_chunks_is_kept_whole() {
        let snow = "é".as_bytes();
        let mut buf = vec![b'a', snow[0]];
        assert_eq!(decode(&mut buf, false), "a");
        assert_eq!(buf, [snow[0]]);
        buf.push(snow[1]);
        assert_eq!(decode(&mut buf, false), "é");
        assert!(buf.is_empty());
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut buf = vec![b'a', 0xff, b'b'];
        assert_eq!(decode(&mut buf, false), "a\u{FFFD}b");
        let mut tail = vec![b'x', 0xc3];
        assert_eq!(decode(&mut tail, true), "x\u{FFFD}");
        assert!(tail.is_empty());
    }
}
