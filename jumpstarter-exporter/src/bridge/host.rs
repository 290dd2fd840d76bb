//! The Python child: started with the exporter, restarted when it dies, never left behind.
//!
//! The child is `bootstrap.py` (shipped in the binary, written to a private 0700 directory)
//! run by `$JMP_PYTHON` or `python3` from `PATH`, in its own process group. It reads its
//! subtrees as one JSON line on stdin and keeps reading stdin afterwards: when the exporter
//! exits (kill -9 included) the kernel closes the pipe and the child kills its process
//! group. Dropping the [`Running`] child kills the group too.

use std::{
    collections::{BTreeMap, VecDeque},
    path::PathBuf,
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use jumpstarter_core::{
    CallContext,
    client::{ConnectOptions, ExporterSession, SessionChannel, connect_channel},
};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    process::{Child, ChildStdin, Command},
    task::JoinHandle,
};

use super::{
    fast::{self, FastPool},
    plan::{PYTHON_ENV, Subtree, package_of},
};

/// The bootstrap script the child runs.
const BOOTSTRAP: &str = include_str!("bootstrap.py");

/// How long the child may take to import and build its drivers.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Lines of the child's stderr kept for error messages.
const STDERR_TAIL: usize = 20;

/// How long a stopping exporter lets the child close its drivers before killing its group.
const STOP_GRACE: Duration = Duration::from_secs(8);

/// The kind of the hosts' private directories (the bootstrap script, the child's sockets):
/// `jmp-python-PID-RANDOM` (0700, in the temporary directory;
/// [`jumpstarter_core::leftovers`]), so those of a killed exporter are removed when the next
/// host starts.
const DIR_KIND: &str = "jmp-python";

/// Longest wait between two restarts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Why the Python drivers could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No interpreter at that name.
    #[error(
        "Python driver {types}: cannot run the Python interpreter {python:?} (install \
         Python 3 with the {packages} package(s), or name an interpreter that has them with \
         {PYTHON_ENV}=/path/to/python)"
    )]
    NoInterpreter {
        /// The types (and their config fields) that need Python.
        types: String,
        /// The interpreter tried.
        python: String,
        /// The packages that provide them.
        packages: String,
        /// Why it could not run.
        #[source]
        source: std::io::Error,
    },
    /// A driver module is not importable.
    #[error(
        "driver type {type_name:?} ({field}) has no Rust implementation and the Python \
         interpreter {python:?} cannot import it: {message}; install it there \
         (pip install {package}) or name another interpreter with {PYTHON_ENV}"
    )]
    Import {
        /// The type.
        type_name: String,
        /// Its config field.
        field: String,
        /// The interpreter tried.
        python: String,
        /// The package to install.
        package: String,
        /// Python's error.
        message: String,
    },
    /// Upstream's runtime itself (`jumpstarter`) is missing.
    #[error(
        "Python driver {types}: the Python interpreter {python:?} cannot import upstream's \
         driver runtime: {message}; install it there (pip install jumpstarter {packages}) or \
         name another interpreter with {PYTHON_ENV}"
    )]
    Runtime {
        /// The types that need it.
        types: String,
        /// The interpreter tried.
        python: String,
        /// The packages that provide the types.
        packages: String,
        /// Python's error.
        message: String,
    },
    /// A driver's constructor failed.
    #[error("Python driver {type_name:?} ({field}) failed to start: {message}\n{traceback}")]
    Build {
        /// The type.
        type_name: String,
        /// Its config field.
        field: String,
        /// Python's error.
        message: String,
        /// Python's traceback.
        traceback: String,
    },
    /// The child died or misbehaved before serving.
    #[error("the Python driver host ({python}) for {types} {what}{stderr}")]
    Child {
        /// The interpreter.
        python: String,
        /// The types it was to serve.
        types: String,
        /// What happened.
        what: String,
        /// The tail of its stderr (with a leading newline), if any.
        stderr: String,
    },
    /// Reading its report or connecting to it failed.
    #[error("the Python driver host for {types}: cannot connect to its session")]
    Connect {
        /// The types it serves.
        types: String,
        /// Why.
        #[source]
        source: jumpstarter_core::ClientError,
    },
    /// Writing the bootstrap script or spec failed.
    #[error("cannot prepare the Python driver host")]
    Io(#[source] std::io::Error),
}

/// Whether the child serves, with its connection, or why not.
#[derive(Clone)]
pub(crate) enum State {
    Up(Conn),
    Down(String),
}

/// A connection to the child's session.
#[derive(Clone)]
pub(crate) struct Conn {
    pub channel: SessionChannel,
    pub session: ExporterSession,
    /// Its fast path for unary calls (`fast.rs`), unless turned off.
    pub fast: Option<Arc<FastPool>>,
}

/// What the proxies share: the child's state and where its logs go.
pub(crate) struct Host {
    python: String,
    script: PathBuf,
    dir: tempfile::TempDir,
    subtrees: Vec<Subtree>,
    state: Mutex<State>,
    /// The uuids of each subtree's nodes by path (`""` the subtree's root), asked of a
    /// restarted child so that clients keep calling the same uuids.
    uuids: Mutex<Vec<BTreeMap<String, String>>>,
    /// Per subtree, the paths (names from the subtree's root) of the descendants the child
    /// left to Rust drivers.
    rust_paths: Mutex<Vec<Vec<Vec<String>>>>,
    /// The context of the latest call: the session whose `LogStream` gets the child's logs.
    log_target: Arc<Mutex<Option<CallContext>>>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

/// A running child and the tasks reading it.
pub(crate) struct Running {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        let group = child
            .id()
            .and_then(|p| rustix::process::Pid::from_raw(p as i32));
        let kill_group = move || {
            if let Some(pid) = group {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
        };
        match child.try_wait() {
            // Alive: closing its stdin asks it to close its drivers (so that they clean up,
            // a flasher its temporary files) and to exit with its process group; the group
            // is killed if it has not within the grace period.
            Ok(None) => {
                drop(self.stdin.take());
                std::thread::spawn(move || {
                    let deadline = Instant::now() + STOP_GRACE;
                    while Instant::now() < deadline {
                        if !matches!(child.try_wait(), Ok(None)) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    kill_group();
                    let _ = child.start_kill();
                });
            }
            // Gone: what it left in its group goes too.
            _ => kill_group(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Host {
    /// A host for `subtrees`, not started: writes the bootstrap script to a private
    /// directory (after removing those killed exporters left) and picks the interpreter ([`PYTHON_ENV`], else `python3`).
    pub(crate) fn new(subtrees: Vec<Subtree>) -> Result<Self, StartError> {
        let python = std::env::var(PYTHON_ENV)
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "python3".into());
        // 0700 whatever the umask: the script is run again at each restart and the sockets
        // take no credentials.
        let dir = jumpstarter_core::leftovers::private_dir_in(&std::env::temp_dir(), DIR_KIND)
            .map_err(StartError::Io)?;
        let script = dir.path().join("bootstrap.py");
        std::fs::write(&script, BOOTSTRAP).map_err(StartError::Io)?;
        Ok(Host {
            python,
            script,
            dir,
            uuids: Mutex::new(vec![BTreeMap::new(); subtrees.len()]),
            subtrees,
            state: Mutex::new(State::Down("starting".into())),
            rust_paths: Mutex::default(),
            log_target: Arc::default(),
            stderr_tail: Arc::default(),
        })
    }

    /// The subtrees it serves.
    pub(crate) fn subtrees(&self) -> &[Subtree] {
        &self.subtrees
    }

    /// The descendants of subtree `i` the child left to Rust drivers, by path.
    pub(crate) fn rust_paths(&self, i: usize) -> Vec<Vec<String>> {
        lock(&self.rust_paths).get(i).cloned().unwrap_or_default()
    }

    /// Records the uuids of subtree `i` by path, for restarts.
    pub(crate) fn set_uuids(&self, i: usize, uuids: BTreeMap<String, String>) {
        if let Some(slot) = lock(&self.uuids).get_mut(i) {
            *slot = uuids;
        }
    }

    pub(crate) fn set(&self, state: State) {
        *lock(&self.state) = state;
    }

    /// The connection to the child, or the error calls get while it is down.
    pub(crate) fn conn(&self, type_name: &str) -> Result<Conn, jumpstarter_core::DriverError> {
        match &*lock(&self.state) {
            State::Up(c) => Ok(c.clone()),
            State::Down(why) => Err(jumpstarter_core::DriverError::Failed(format!(
                "Python driver {type_name} is unavailable: its host process {why}"
            ))),
        }
    }

    /// Sends the child's logs to the session `ctx` belongs to from now on.
    pub(crate) fn log_to(&self, ctx: &CallContext) {
        *lock(&self.log_target) = Some(ctx.clone());
    }

    /// The interpreter running the bootstrap script, its three pipes captured; killed if
    /// dropped.
    fn bootstrap_command(&self) -> Command {
        let mut c = Command::new(&self.python);
        c.arg(&self.script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("PYTHONUNBUFFERED", "1")
            .kill_on_drop(true);
        c
    }

    /// The error for an interpreter that could not be started.
    fn no_interpreter(&self, source: std::io::Error) -> StartError {
        StartError::NoInterpreter {
            types: self.types(),
            python: self.python.clone(),
            packages: self.packages(),
            source,
        }
    }

    fn types(&self) -> String {
        self.subtrees
            .iter()
            .map(|s| format!("{} ({})", s.type_name, s.field))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn packages(&self) -> String {
        let mut p: Vec<String> = self
            .subtrees
            .iter()
            .map(|s| package_of(&s.type_name))
            .collect();
        p.sort();
        p.dedup();
        p.join(" ")
    }

    pub(crate) fn child_error(&self, what: String) -> StartError {
        let tail: Vec<String> = lock(&self.stderr_tail).iter().cloned().collect();
        StartError::Child {
            python: self.python.clone(),
            types: self.types(),
            what,
            stderr: if tail.is_empty() {
                String::new()
            } else {
                format!("; its stderr ends with:\n{}", tail.join("\n"))
            },
        }
    }

    /// Starts one child and connects to it.
    pub(crate) async fn spawn(&self, generation: u64) -> Result<(Running, Conn), StartError> {
        let socket = self.dir.path().join(format!("python-{generation}.sock"));
        let fast_socket = fast::enabled().then(|| {
            self.dir
                .path()
                .join(format!("python-{generation}.fast.sock"))
        });
        let uuids = lock(&self.uuids).clone();
        let spec = serde_json::json!({
            "socket": socket,
            "fast_socket": fast_socket,
            "subtrees": self.subtrees.iter().zip(uuids).map(|(s, u)| serde_json::json!({
                "key": s.key,
                "instance": s.instance,
                "uuids": u,
                "rust_types": s.rust_types,
            })).collect::<Vec<_>>(),
        });
        let mut command = self.bootstrap_command();
        let mut child = command
            .process_group(0)
            .spawn()
            .map_err(|e| self.no_interpreter(e))?;
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(StartError::Io(std::io::Error::other("child pipes missing")));
        };
        let mut running_tasks = Vec::new();
        lock(&self.stderr_tail).clear();
        let tail = self.stderr_tail.clone();
        running_tasks.push(tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(target: "python", "{line}");
                let mut t = lock(&tail);
                if t.len() == STDERR_TAIL {
                    t.pop_front();
                }
                t.push_back(line);
            }
        }));
        let mut line = spec.to_string();
        line.push('\n');
        stdin.write_all(line.as_bytes()).await.map_err(|e| {
            self.child_error(format!(
                "did not take its spec ({e})",
                e = jumpstarter_core::error_chain(&e)
            ))
        })?;
        let mut stdout = BufReader::new(stdout).lines();
        let first = match tokio::time::timeout(READY_TIMEOUT, stdout.next_line()).await {
            Err(_) => {
                return Err(self.child_error(format!("was not ready within {READY_TIMEOUT:?}")));
            }
            Ok(Ok(Some(l))) => l,
            Ok(_) => {
                let status = child
                    .wait()
                    .await
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                // Let the stderr reader take the last lines.
                tokio::time::sleep(Duration::from_millis(100)).await;
                return Err(self.child_error(format!("exited before serving ({status})")));
            }
        };
        // Then its drivers' log records, one a line (what they print goes to stderr).
        let log_target = self.log_target.clone();
        running_tasks.push(tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                relay_log(&log_target, &line);
            }
        }));
        let answer: serde_json::Value = serde_json::from_str(&first)
            .map_err(|_| self.child_error(format!("answered {first:?}")))?;
        if let Some(err) = answer.get("error") {
            return Err(self.start_error(err));
        }
        *lock(&self.rust_paths) = self
            .subtrees
            .iter()
            .map(|s| {
                answer
                    .get("rust")
                    .and_then(|r| r.get(&s.key))
                    .and_then(|paths| serde_json::from_value(paths.clone()).ok())
                    .unwrap_or_default()
            })
            .collect();
        // The child serves the fast path when it was asked to and says so.
        let fast = fast_socket
            .filter(|p| answer.get("fast").and_then(|f| f.as_str()) == p.to_str())
            .map(|p| Arc::new(FastPool::new(p)));
        let channel = connect_channel(&socket.to_string_lossy(), &ConnectOptions::default())
            .await
            .map_err(|source| StartError::Connect {
                types: self.types(),
                source,
            })?;
        let session = ExporterSession::from_channel(channel.clone())
            .await
            .map_err(|source| StartError::Connect {
                types: self.types(),
                source,
            })?;
        Ok((
            Running {
                child: Some(child),
                stdin: Some(stdin),
                tasks: running_tasks,
            },
            Conn {
                channel,
                session,
                fast,
            },
        ))
    }

    /// Asks a child only to import the subtrees' types, building and serving nothing (how
    /// `jmp config exporter edit` checks a config); the errors are those of [`Host::spawn`].
    pub(crate) async fn check(&self) -> Result<(), StartError> {
        let spec = serde_json::json!({
            "check": true,
            "subtrees": self.subtrees.iter().map(|s| serde_json::json!({
                "key": s.key,
                "instance": s.instance,
                "rust_types": s.rust_types,
            })).collect::<Vec<_>>(),
        });
        let mut child = self
            .bootstrap_command()
            .spawn()
            .map_err(|e| self.no_interpreter(e))?;
        if let Some(mut stdin) = child.stdin.take() {
            let mut line = spec.to_string();
            line.push('\n');
            // A child that exits at once (no such module) may not read it: its answer says why.
            let _ = stdin.write_all(line.as_bytes()).await;
        }
        let out = match tokio::time::timeout(READY_TIMEOUT, child.wait_with_output()).await {
            Err(_) => {
                return Err(self.child_error(format!("did not answer within {READY_TIMEOUT:?}")));
            }
            Ok(Err(e)) => {
                return Err(self.child_error(format!(
                    "could not be read ({e})",
                    e = jumpstarter_core::error_chain(&e)
                )));
            }
            Ok(Ok(out)) => out,
        };
        {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let mut tail = lock(&self.stderr_tail);
            tail.clear();
            let lines: Vec<&str> = stderr.lines().collect();
            let from = lines.len().saturating_sub(STDERR_TAIL);
            tail.extend(lines[from..].iter().map(|l| l.to_string()));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let first = stdout.lines().next().unwrap_or_default();
        let answer = serde_json::from_str::<serde_json::Value>(first).unwrap_or_default();
        if answer.get("checked").is_some() {
            return Ok(());
        }
        match answer.get("error") {
            Some(err) => Err(self.start_error(err)),
            None => {
                Err(self.child_error(format!("answered {first:?} and exited ({})", out.status)))
            }
        }
    }

    fn start_error(&self, err: &serde_json::Value) -> StartError {
        let s = |k: &str| {
            err.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        };
        let type_name = s("type");
        let field = self
            .subtrees
            .iter()
            .find(|st| st.type_name == type_name || st.instance.to_string().contains(&type_name))
            .map(|st| st.field.clone())
            .unwrap_or_default();
        match s("kind").as_str() {
            "import" => StartError::Import {
                package: package_of(&type_name),
                type_name,
                field,
                python: self.python.clone(),
                message: s("message"),
            },
            "runtime" => StartError::Runtime {
                types: self.types(),
                python: self.python.clone(),
                packages: self.packages(),
                message: s("message"),
            },
            _ => StartError::Build {
                type_name,
                field,
                message: s("message"),
                traceback: s("traceback"),
            },
        }
    }
}

/// One line of the child's stdout after its answer: a log record (`{"log": [LEVEL,
/// DRIVER, MESSAGE]}`, see `bootstrap.py`) goes to the session of the latest call when a
/// driver logged it, as upstream's `LogStream` would send it, else to our own log.
fn relay_log(target: &Mutex<Option<CallContext>>, line: &str) {
    let Some(LogLine {
        log: (severity, driver, message),
    }) = serde_json::from_str::<LogLine>(line).ok()
    else {
        tracing::info!(target: "python", "{line}");
        return;
    };
    if !driver {
        tracing::debug!(target: "python", "{severity}: {message}");
        return;
    }
    let ctx = lock(target).clone();
    match ctx {
        Some(ctx) => ctx.log(&severity, message),
        None => tracing::info!(target: "python", "{severity}: {message}"),
    }
}

/// A log record on the child's stdout: level, whether a driver logged it, message.
#[derive(Debug, PartialEq, serde::Deserialize)]
struct LogLine {
    log: (String, bool, String),
}

/// Waits for the child to die and starts another, with the same uuids, until dropped.
pub(crate) async fn supervise(host: Arc<Host>, mut running: Running) {
    let mut generation = 0;
    let mut backoff = Duration::from_secs(1);
    loop {
        let started = Instant::now();
        let status = match running.child.as_mut() {
            Some(c) => c
                .wait()
                .await
                .map(|s| s.to_string())
                .unwrap_or_else(|e| jumpstarter_core::error_chain(&e)),
            None => "gone".into(),
        };
        let why = format!("exited ({status}); restarting it");
        tracing::warn!("the Python driver host for {} {why}", host.types());
        host.set(State::Down(why.clone()));
        drop(running);
        if started.elapsed() > MAX_BACKOFF {
            backoff = Duration::from_secs(1);
        }
        running = loop {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            generation += 1;
            match host.spawn(generation).await {
                Ok((r, conn)) => {
                    tracing::info!("the Python driver host for {} restarted", host.types());
                    host.set(State::Up(conn));
                    break r;
                }
                Err(e) => {
                    tracing::warn!(
                        "restarting the Python driver host failed: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    );
                    host.set(State::Down(format!(
                        "{why}; restarting failed: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    )));
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_from_the_bootstrap_parse() {
        // As bootstrap.py's LogRelay writes them (json.dumps, ASCII with escapes).
        let line = r#"{"log": ["WARNING", true, "flash at 50%\n\u00e9t\u00e9"]}"#;
        assert_eq!(
            serde_json::from_str::<LogLine>(line).unwrap(),
            LogLine {
                log: ("WARNING".into(), true, "flash at 50%\nété".into())
            }
        );
        for other in ["ready", r#"{"log": ["INFO", "x"]}"#, r#"{"ready": "/s"}"#] {
            assert!(serde_json::from_str::<LogLine>(other).is_err(), "{other}");
        }
    }

    #[test]
    fn the_host_directory_is_private_and_a_killed_exporters_is_removed_at_start() {
        use std::os::unix::fs::PermissionsExt as _;
        // As a process killed with SIGKILL leaves it: named after a PID that no longer runs.
        let stale = std::env::temp_dir().join(format!(
            "{DIR_KIND}-4294967294-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("bootstrap.py"), BOOTSTRAP).unwrap();
        let host = Host::new(Vec::new()).unwrap();
        assert!(!stale.exists(), "{} is still there", stale.display());
        let dir = host.dir.path().to_path_buf();
        assert_eq!(host.script.parent(), Some(dir.as_path()));
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(
            jumpstarter_core::leftovers::owner_pid(&name, DIR_KIND),
            Some(std::process::id()),
            "{name}"
        );
        drop(host);
        assert!(!dir.exists());
    }
}
