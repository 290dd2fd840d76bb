//! Child processes that are stopped when dropped, and small helpers to wait for them.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// A running background process, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Background {
    name: String,
    child: Child,
    /// Lines the process printed on stderr, as they come.
    pub lines: mpsc::Receiver<String>,
}

impl Background {
    /// Starts `cmd` with stderr captured line by line (stdout is discarded).
    pub fn start(name: &str, mut cmd: Command) -> Result<Self> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let (tx, rx) = mpsc::channel();
        if let Some(err) = child.stderr.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(Self {
            name: name.to_string(),
            child,
            lines: rx,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a stderr line containing `needle`; returns it.
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return Ok(line),
                Ok(line) => seen.push(line),
                Err(_) => bail!(
                    "{} did not print {needle:?} within {timeout:?}; it printed:\n{}",
                    self.name,
                    seen.join("\n")
                ),
            }
        }
    }

    /// Stops the process now (nothing to do if it has exited and been reaped already:
    /// its pid may belong to another process by now).
    pub fn stop(&mut self) {
        self.stop_within(Duration::from_secs(5));
    }

    /// [`Background::stop`], giving the process `grace` to end after SIGTERM (a process
    /// under valgrind writes its profile out first).
    pub fn stop_within(&mut self, grace: Duration) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts our `jmp run --exporter-config CONFIG --tls-grpc-listener 127.0.0.1:0
/// --tls-grpc-insecure EXTRA...` and returns it with the port it reports.
pub fn start_our_exporter(
    mut cmd: Command,
    config: &Path,
    extra: &[&str],
) -> Result<(Background, u16)> {
    cmd.args(["run", "--exporter-config"])
        .arg(config)
        .args(["--tls-grpc-listener", "127.0.0.1:0", "--tls-grpc-insecure"])
        .args(extra);
    let mut bg = Background::start("jmp run", cmd)?;
    let line = bg.wait_for_line("listening on", Duration::from_secs(30))?;
    Ok((bg, listening_port(&line)?))
}

/// The port of `jmp run`'s `listening on ADDR` line.
pub fn listening_port(line: &str) -> Result<u16> {
    line.split("listening on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|addr| addr.rsplit(':').next())
        .and_then(|p| p.parse::<u16>().ok())
        .with_context(|| format!("no port in {line:?}"))
}

/// A TCP port that was free a moment ago (for tools that cannot listen on port 0).
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Waits until something accepts connections on 127.0.0.1:`port`.
pub fn wait_port(port: u16, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("nothing listens on 127.0.0.1:{port} after {timeout:?}")
}

/// Waits until a path exists.
pub fn wait_path(path: &Path, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if path.exists() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{} did not appear within {timeout:?}", path.display())
}

/// Output of a finished command.
pub struct Output {
    /// Exit code (-1 when killed).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs a command to completion with a timeout.
pub fn run(mut cmd: Command, timeout: Duration) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    let pid = child.id().to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => {
            let out = out?;
            Ok(Output {
                code: out.status.code().unwrap_or(-1),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            bail!("{cmd:?} did not finish within {timeout:?}")
        }
    }
}
