//! The `local` provisioner: each replica of a pool is a `jmp run` child process of the
//! controller, on the controller's machine (the one-machine default).
//!
//! # Files
//!
//! Every replica has a private directory `<base>/<namespace>/<name>/` (mode 0700; the base
//! is [`default_pools_dir`] of the controller's data directory unless the caller says
//! otherwise) holding:
//!
//! - `replica.json`: its namespace, name and set, so [`Provisioner::observe`] finds a set's
//!   replicas by directory;
//! - `exporter.yaml` (mode 0600: it holds the exporter's token): the config the engine made;
//!   `jmp run --exporter-config` reads its hooks and `exitOnLeaseEnd` from it;
//! - `jmp.pid`: `PID STARTTIME` (the start time in clock ticks after boot, field 22 of
//!   `/proc/PID/stat`), so that a pid is never mistaken for a later process that reused it;
//! - `exporter.log` (stdout and stderr, appended) and `exporter.log.1`: when the log grows past
//!   [`LocalOptions::max_log_bytes`] it is copied to `exporter.log.1` and truncated, so a
//!   replica keeps at most about twice that on disk;
//! - `home/` and `run/`: the replica's `HOME` and `XDG_*` directories, so nothing of the
//!   controller user's own configuration is read or written. `JMP_*` and `JUMPSTARTER_*`
//!   variables of the controller are not passed on either.
//!
//! Each replica runs in a process group of its own, so a Ctrl-C meant for a controller run in
//! a terminal does not reach it.
//!
//! # Phases
//!
//! `Pending` while a [`Provisioner::start`] is spawning it, `Running` while its process lives,
//! `Succeeded` after exit status 0 (an `exitOnLeaseEnd` exporter after its lease), `Failed`
//! after a non-zero status or a signal (the message says which). Exited children are reaped at
//! once: a watcher task per replica waits for it.
//!
//! # The controller stopping, and starting again
//!
//! - A graceful stop of the controller may call [`LocalProvisioner::shutdown`]: every replica
//!   gets SIGTERM (so its afterLease hook runs), then SIGKILL after
//!   [`LocalOptions::stop_timeout`], and its directory is removed.
//! - Dropping the provisioner, or the controller dying (even by SIGKILL), leaves the replicas
//!   running by default. A held lease then survives a controller restart: `jmp run` reconnects
//!   by itself. A new provisioner over the same base directory ([`LocalProvisioner::new`])
//!   re-adopts every replica whose `jmp.pid` names a live process that is really that replica
//!   (same start time, and `--exporter-config` of that replica's file on its command line), and
//!   reaps the rest: their directories are removed, and a pid that names another process is
//!   never signalled. An adopted replica is not a child: it is watched and signalled through a
//!   pidfd, which keeps naming that process even if its pid is reused. Its exit status cannot
//!   be known: when it exits it is `Failed`, with a message saying so.
//! - With [`LocalOptions::exit_with_controller`], each `jmp run` is started with
//!   `JMP_RUN_EXIT_WITH_PARENT` set to the controller's pid: it asks the kernel for SIGTERM
//!   when the controller dies, however it dies (and stops at once if the controller is already
//!   gone). The kernel ties that signal to the thread that spawned the child, not to the
//!   process, so these replicas are spawned by a thread of the provisioner's own that lives as
//!   long as the provisioner (a runtime thread could end before the controller does): with
//!   this option, dropping the provisioner stops the replicas too (except one dropped in the
//!   milliseconds between its exec and `jmp run` setting the signal: the thread's end cannot
//!   be seen afterwards, while the controller's is, through `getppid`).

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jumpstarter_core::sync::LockExt;
use rustix::process::{Pid, PidfdFlags, Signal};
use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::provisioner::{
    ProvisionError, ProvisionFuture, Provisioner, ReplicaObservation, ReplicaPhase, ReplicaRequest,
};
use crate::objects::virtualtarget::{ExporterSet, LABEL_EXPORTER_SET, PROVISIONER_LOCAL};

/// The variable `jmp run` reads to stop with its parent (`jumpstarter-cli`'s
/// `EXIT_WITH_PARENT_ENV`).
pub const EXIT_WITH_PARENT_ENV: &str = "JMP_RUN_EXIT_WITH_PARENT";

/// The replica's metadata file.
const META_FILE: &str = "replica.json";
/// The replica's exporter config.
const CONFIG_FILE: &str = "exporter.yaml";
/// The replica's pid file.
const PID_FILE: &str = "jmp.pid";
/// The replica's log.
const LOG_FILE: &str = "exporter.log";
/// The previous part of the replica's log.
const OLD_LOG_FILE: &str = "exporter.log.1";
/// How often a replica's log size is checked.
const LOG_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long to wait for a process after SIGKILL before giving up on it (a process in
/// uninterruptible sleep).
const KILL_WAIT: Duration = Duration::from_secs(5);

/// The default base directory of the local provisioner: `pools/` in the controller's data
/// directory (`--data-dir`).
pub fn default_pools_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("pools")
}

/// How the local provisioner runs replicas.
///
/// ```
/// use jumpstarter_controller::pools::local::{LocalOptions, default_pools_dir};
/// let mut options = LocalOptions::new(default_pools_dir("/var/lib/jumpstarter".as_ref()));
/// options.exit_with_controller = true;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalOptions {
    /// Where the replicas' directories are made (see [`default_pools_dir`]).
    pub base_dir: PathBuf,
    /// The `jmp` binary to run. `None`: `jmp` beside the controller's own executable, else
    /// the first on `PATH`.
    pub jmp: Option<PathBuf>,
    /// Replicas get SIGTERM from the kernel when the controller dies, however it dies. Off by
    /// default: replicas outlive the controller and a restarted one re-adopts them.
    pub exit_with_controller: bool,
    /// How long a stopped replica has between SIGTERM and SIGKILL (its afterLease hook runs
    /// in this time). Default 10 s.
    pub stop_timeout: Duration,
    /// The size past which a replica's log is rotated. Default 10 MiB.
    pub max_log_bytes: u64,
}

impl LocalOptions {
    /// The defaults, with replicas under `base_dir`.
    pub fn new(base_dir: PathBuf) -> Self {
        Self {
            base_dir,
            jmp: None,
            exit_with_controller: false,
            stop_timeout: Duration::from_secs(10),
            max_log_bytes: 10 << 20,
        }
    }
}

/// Why the local provisioner cannot do what it was asked; each variant names what is at
/// fault.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// No `jmp` binary where it was looked for.
    #[error("cannot find the jmp binary (tried {})", tried_list(.tried))]
    JmpNotFound {
        /// The paths tried (and `PATH` when it was searched).
        tried: Vec<String>,
    },
    /// A namespace, set or replica name that is not a DNS-1123 subdomain (and so could escape
    /// the base directory).
    #[error("{what} {value:?} is not a valid name: {reason}")]
    InvalidName {
        /// `namespace`, `set` or `replica`.
        what: &'static str,
        /// The name given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file or directory operation failed.
    #[error("cannot {what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The `jmp run` process could not be started.
    #[error("cannot start {}", program.display())]
    Spawn {
        /// The binary.
        program: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The task doing it ended early (the runtime shutting down, or a bug).
    #[error("the task doing it ended early")]
    Cancelled,
}

fn tried_list(tried: &[String]) -> String {
    tried.join(", ")
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> LocalError {
    let path = path.to_path_buf();
    move |source| LocalError::Io { what, path, source }
}

fn replica_error(
    namespace: &str,
    name: &str,
    operation: &'static str,
) -> impl FnOnce(LocalError) -> ProvisionError {
    let (namespace, name) = (namespace.to_string(), name.to_string());
    move |e| ProvisionError::Replica {
        namespace,
        name,
        operation,
        source: Box::new(e),
    }
}

fn validate(what: &'static str, value: &str) -> Result<(), LocalError> {
    jumpstarter_core::labels::validate_dns1123_subdomain(value).map_err(|reason| {
        LocalError::InvalidName {
            what,
            value: value.to_string(),
            reason,
        }
    })
}

/// Runs `f` on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, LocalError> + Send + 'static,
) -> Result<T, LocalError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| LocalError::Cancelled)?
}

/// The `jmp` to run: `explicit` when given (it must exist), else beside `own_exe`, else on
/// `path`.
fn resolve_jmp(
    explicit: Option<&Path>,
    own_exe: Option<&Path>,
    path: Option<&std::ffi::OsStr>,
) -> Result<PathBuf, LocalError> {
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if let Some(p) = explicit {
        return if runnable(p) {
            Ok(p.to_path_buf())
        } else {
            Err(LocalError::JmpNotFound {
                tried: vec![p.display().to_string()],
            })
        };
    }
    let mut tried = Vec::new();
    if let Some(dir) = own_exe.and_then(Path::parent) {
        let p = dir.join("jmp");
        if runnable(&p) {
            return Ok(p);
        }
        tried.push(p.display().to_string());
    }
    if let Some(path) = path {
        for dir in std::env::split_paths(path) {
            let p = dir.join("jmp");
            if runnable(&p) {
                return Ok(p);
            }
        }
    }
    tried.push("jmp on PATH".to_string());
    Err(LocalError::JmpNotFound { tried })
}

/// What `replica.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct ReplicaMeta {
    namespace: String,
    name: String,
    set: String,
}

/// A replica's process as the watcher last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Status {
    Pending,
    Running {
        pid: i32,
        adopted: bool,
    },
    Exited {
        phase: ReplicaPhase,
        message: String,
    },
}

/// A replica this provisioner knows.
struct Replica {
    set: String,
    status: Arc<Mutex<Status>>,
    watcher: Option<Watcher>,
}

/// What a watcher task needs besides the process.
struct Watched {
    /// `namespace/name`, for the log.
    replica: String,
    /// Where it reports the process's state.
    status: Arc<Mutex<Status>>,
    /// The replica's log, and its bound.
    log: PathBuf,
    max_log: u64,
    /// Between SIGTERM and SIGKILL.
    grace: Duration,
}

/// The task that owns a replica's process.
struct Watcher {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

type Key = (String, String);

struct Inner {
    options: LocalOptions,
    jmp: PathBuf,
    replicas: Mutex<HashMap<Key, Replica>>,
    /// One lock per replica, so that a start and a stop of the same replica do not interleave
    /// (replicas of their own go on in parallel).
    ops: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>,
    /// With `exit_with_controller`: the thread that spawns the replicas.
    spawner: Option<Spawner>,
}

/// A spawn request: the command, and where its child goes.
type SpawnRequest = (
    tokio::process::Command,
    oneshot::Sender<std::io::Result<tokio::process::Child>>,
);

/// A thread that spawns children and lives until the provisioner is dropped (when its queue
/// closes).
struct Spawner {
    queue: tokio::sync::mpsc::Sender<SpawnRequest>,
}

impl Spawner {
    /// How many spawn requests may wait (each caller waits for its own).
    const QUEUE: usize = 16;

    fn start() -> Result<Self, LocalError> {
        let (queue, mut requests) = tokio::sync::mpsc::channel::<SpawnRequest>(Self::QUEUE);
        let runtime = tokio::runtime::Handle::current();
        std::thread::Builder::new()
            .name("pool-spawner".to_string())
            .spawn(move || {
                // tokio's child handling needs the runtime's context.
                let _context = runtime.enter();
                while let Some((mut cmd, reply)) = requests.blocking_recv() {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .map_err(|source| LocalError::Spawn {
                program: PathBuf::from("the pool-spawner thread"),
                source,
            })?;
        Ok(Self { queue })
    }

    async fn spawn(&self, cmd: tokio::process::Command) -> std::io::Result<tokio::process::Child> {
        let (reply, child) = oneshot::channel();
        let gone = || std::io::Error::other("the pool-spawner thread has stopped");
        self.queue.send((cmd, reply)).await.map_err(|_| gone())?;
        child.await.map_err(|_| gone())?
    }
}

/// The `local` provisioner (see the module documentation).
pub struct LocalProvisioner {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LocalProvisioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalProvisioner")
            .field("options", &self.inner.options)
            .field("jmp", &self.inner.jmp)
            .finish_non_exhaustive()
    }
}

impl Drop for LocalProvisioner {
    /// Stops watching; the replicas go on running, for a new provisioner to re-adopt.
    fn drop(&mut self) {
        for r in self.inner.replicas.lock_or_recover().values() {
            if let Some(w) = &r.watcher {
                w.task.abort();
            }
        }
    }
}

impl LocalProvisioner {
    /// A provisioner running `options.jmp` under `options.base_dir` (created 0700). Replicas
    /// left there by an earlier provisioner are re-adopted when they still run, and their
    /// directories removed when they do not.
    pub async fn new(options: LocalOptions) -> Result<Self, LocalError> {
        let (explicit, base) = (options.jmp.clone(), options.base_dir.clone());
        let (jmp, leftovers) = blocking(move || {
            let jmp = resolve_jmp(
                explicit.as_deref(),
                std::env::current_exe().ok().as_deref(),
                std::env::var_os("PATH").as_deref(),
            )?;
            private_dir(&base)?;
            Ok((jmp, find_leftovers(&base)))
        })
        .await?;
        let spawner = match options.exit_with_controller {
            true => Some(Spawner::start()?),
            false => None,
        };
        let inner = Arc::new(Inner {
            options,
            jmp,
            replicas: Mutex::new(HashMap::new()),
            ops: Mutex::new(HashMap::new()),
            spawner,
        });
        for (dir, meta) in leftovers {
            let found = {
                let dir = dir.clone();
                blocking(move || Ok(verified_process(&dir))).await?
            };
            match (meta, found) {
                (Some(meta), Some(pidfd)) => {
                    let (pid, pidfd) = pidfd;
                    tracing::info!(
                        "pool replica {}/{} (pid {pid}) re-adopted",
                        meta.namespace,
                        meta.name
                    );
                    let replica = inner.watch_adopted(&dir, pid, pidfd, meta.set.clone());
                    inner
                        .replicas
                        .lock_or_recover()
                        .insert((meta.namespace, meta.name), replica);
                }
                (None, Some((pid, pidfd))) => {
                    // Ours beyond doubt, but with no record of which set it serves: stop it.
                    tracing::info!(
                        "pool replica {} (pid {pid}) has no readable replica.json: stopped",
                        dir.display()
                    );
                    if let Some(w) = inner.watch_adopted(&dir, pid, pidfd, String::new()).watcher {
                        let _ = w.stop.send(());
                        let _ = w.task.await;
                    }
                    let d = dir.clone();
                    if let Err(e) = blocking(move || remove_replica_dir(&d)).await {
                        tracing::warn!("{}", jumpstarter_core::error_chain(&e));
                    }
                }
                (meta, None) => {
                    tracing::info!(
                        "pool replica {} is not running: its directory is removed{}",
                        dir.display(),
                        if meta.is_none() {
                            " (no readable replica.json)"
                        } else {
                            ""
                        }
                    );
                    let d = dir.clone();
                    if let Err(e) = blocking(move || remove_replica_dir(&d)).await {
                        tracing::warn!("{}", jumpstarter_core::error_chain(&e));
                    }
                }
            }
        }
        // Namespaces' directories left empty by the reaping go too.
        let base = inner.options.base_dir.clone();
        blocking(move || {
            for ns in std::fs::read_dir(&base).into_iter().flatten().flatten() {
                let _ = std::fs::remove_dir(ns.path());
            }
            Ok(())
        })
        .await?;
        Ok(Self { inner })
    }

    /// The `jmp` binary this provisioner runs.
    pub fn jmp(&self) -> &Path {
        &self.inner.jmp
    }

    /// The directory of replica `name` of `namespace`.
    pub fn replica_dir(&self, namespace: &str, name: &str) -> PathBuf {
        self.inner.replica_dir(namespace, name)
    }

    /// Stops every replica (SIGTERM, then SIGKILL after the stop timeout, all in parallel) and
    /// removes their directories: for the controller's graceful stop when replicas must not
    /// outlive it.
    pub async fn shutdown(&self) {
        let keys: Vec<Key> = self
            .inner
            .replicas
            .lock_or_recover()
            .keys()
            .cloned()
            .collect();
        let stops = keys.iter().map(|(ns, name)| async move {
            if let Err(e) = self.inner.stop(ns, name).await {
                tracing::warn!(
                    "pool replica {ns}/{name}: {}",
                    jumpstarter_core::error_chain(&e)
                );
            }
        });
        futures::future::join_all(stops).await;
    }
}

impl Provisioner for LocalProvisioner {
    fn name(&self) -> &'static str {
        PROVISIONER_LOCAL
    }

    /// Runs in a task of its own, so that a caller giving up (a timeout) cannot leave a
    /// process spawned and not watched.
    fn start<'a>(&'a self, req: &'a ReplicaRequest) -> ProvisionFuture<'a, ()> {
        let (inner, owned) = (self.inner.clone(), req.clone());
        Box::pin(async move {
            tokio::spawn(async move { inner.start(&owned).await })
                .await
                .unwrap_or(Err(LocalError::Cancelled))
                .map_err(replica_error(&req.namespace, &req.name, "start"))
        })
    }

    /// Runs in a task of its own, so that a caller giving up cannot leave the replica half
    /// stopped.
    fn stop<'a>(&'a self, namespace: &'a str, name: &'a str) -> ProvisionFuture<'a, ()> {
        let (inner, ns, n) = (self.inner.clone(), namespace.to_string(), name.to_string());
        Box::pin(async move {
            tokio::spawn(async move { inner.stop(&ns, &n).await })
                .await
                .unwrap_or(Err(LocalError::Cancelled))
                .map_err(replica_error(namespace, name, "stop"))
        })
    }

    fn observe<'a>(&'a self, set: &'a ExporterSet) -> ProvisionFuture<'a, Vec<ReplicaObservation>> {
        Box::pin(async move {
            let namespace = set.metadata.namespace.clone().unwrap_or_default();
            let name = set.metadata.name.clone().unwrap_or_default();
            self.inner
                .observe(&namespace, &name)
                .await
                .map_err(replica_error(&namespace, &name, "observe"))
        })
    }
}

impl Inner {
    fn replica_dir(&self, namespace: &str, name: &str) -> PathBuf {
        self.options.base_dir.join(namespace).join(name)
    }

    fn op_lock(&self, key: &Key) -> Arc<tokio::sync::Mutex<()>> {
        self.ops
            .lock_or_recover()
            .entry(key.clone())
            .or_default()
            .clone()
    }

    /// Forgets `key`'s lock when nobody else holds or waits for it.
    fn release_op_lock(&self, key: &Key, lock: Arc<tokio::sync::Mutex<()>>) {
        let mut ops = self.ops.lock_or_recover();
        drop(lock);
        if ops.get(key).is_some_and(|l| Arc::strong_count(l) == 1) {
            ops.remove(key);
        }
    }

    async fn start(&self, req: &ReplicaRequest) -> Result<(), LocalError> {
        validate("namespace", &req.namespace)?;
        validate("replica", &req.name)?;
        let set = req
            .set
            .metadata
            .name
            .clone()
            .or_else(|| req.labels.get(LABEL_EXPORTER_SET).cloned())
            .unwrap_or_default();
        validate("set", &set)?;
        let key = (req.namespace.clone(), req.name.clone());
        let lock = self.op_lock(&key);
        let result = {
            let _guard = lock.lock().await;
            self.start_locked(req, &key, set).await
        };
        self.release_op_lock(&key, lock);
        result
    }

    async fn start_locked(
        &self,
        req: &ReplicaRequest,
        key: &Key,
        set: String,
    ) -> Result<(), LocalError> {
        let status = {
            let mut replicas = self.replicas.lock_or_recover();
            if let Some(r) = replicas.get(key)
                && !matches!(*r.status.lock_or_recover(), Status::Exited { .. })
            {
                return Ok(());
            }
            let status = Arc::new(Mutex::new(Status::Pending));
            replicas.insert(
                key.clone(),
                Replica {
                    set: set.clone(),
                    status: status.clone(),
                    watcher: None,
                },
            );
            status
        };
        match self.spawn(req, &set, status).await {
            Ok(watcher) => {
                if let Some(r) = self.replicas.lock_or_recover().get_mut(key) {
                    r.watcher = Some(watcher);
                }
                Ok(())
            }
            Err(e) => {
                self.replicas.lock_or_recover().remove(key);
                let dir = self.replica_dir(&req.namespace, &req.name);
                if let Err(e) = blocking(move || remove_replica_dir(&dir)).await {
                    tracing::warn!("{}", jumpstarter_core::error_chain(&e));
                }
                Err(e)
            }
        }
    }

    /// Prepares the replica's directory, starts its `jmp run` and its watcher.
    async fn spawn(
        &self,
        req: &ReplicaRequest,
        set: &str,
        status: Arc<Mutex<Status>>,
    ) -> Result<Watcher, LocalError> {
        let dir = self.replica_dir(&req.namespace, &req.name);
        let meta = ReplicaMeta {
            namespace: req.namespace.clone(),
            name: req.name.clone(),
            set: set.to_string(),
        };
        let (base, d, config, max_log) = (
            self.options.base_dir.clone(),
            dir.clone(),
            req.exporter_config.clone(),
            self.options.max_log_bytes,
        );
        let log = blocking(move || prepare_replica_dir(&base, &d, &meta, &config, max_log)).await?;

        let home = dir.join("home");
        let mut cmd = tokio::process::Command::new(&self.jmp);
        cmd.arg("run")
            .arg("--exporter-config")
            .arg(dir.join(CONFIG_FILE))
            .current_dir(&dir)
            .stdin(std::process::Stdio::null())
            .stdout(
                log.try_clone()
                    .map_err(io("duplicate", &dir.join(LOG_FILE)))?,
            )
            .stderr(log)
            .process_group(0);
        for (k, _) in std::env::vars_os() {
            if k.to_str()
                .is_some_and(|k| k.starts_with("JMP_") || k.starts_with("JUMPSTARTER_"))
            {
                cmd.env_remove(k);
            }
        }
        cmd.env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_DATA_HOME", home.join(".local/share"))
            .env("XDG_STATE_HOME", home.join(".local/state"))
            .env("XDG_CACHE_HOME", home.join(".cache"))
            .env("XDG_RUNTIME_DIR", dir.join("run"));
        if self.options.exit_with_controller {
            cmd.env(EXIT_WITH_PARENT_ENV, std::process::id().to_string());
        }
        let spawned = match &self.spawner {
            Some(spawner) => spawner.spawn(cmd).await,
            None => cmd.spawn(),
        };
        let child = spawned.map_err(|source| LocalError::Spawn {
            program: self.jmp.clone(),
            source,
        })?;
        // Not yet waited for, so the pid cannot have been reused.
        let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) else {
            return Err(LocalError::Spawn {
                program: self.jmp.clone(),
                source: std::io::Error::other("the child exited before its pid was read"),
            });
        };
        let start_time = read_stat(pid).map(|s| s.start_time).unwrap_or(0);
        let pid_file = dir.join(PID_FILE);
        if let Err(e) = tokio::fs::write(&pid_file, format!("{pid} {start_time}\n")).await {
            let mut child = child;
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(io("write", &pid_file)(e));
        }
        tracing::info!(
            "pool replica {}/{} started (pid {pid}): {}",
            req.namespace,
            req.name,
            dir.display()
        );
        *status.lock_or_recover() = Status::Running {
            pid,
            adopted: false,
        };
        let (stop_tx, stop_rx) = oneshot::channel();
        let watched = self.watched(format!("{}/{}", req.namespace, req.name), &dir, status);
        let task = tokio::spawn(watch_child(watched, child, pid, stop_rx));
        Ok(Watcher {
            stop: stop_tx,
            task,
        })
    }

    fn watched(&self, replica: String, dir: &Path, status: Arc<Mutex<Status>>) -> Watched {
        Watched {
            replica,
            status,
            log: dir.join(LOG_FILE),
            max_log: self.options.max_log_bytes,
            grace: self.options.stop_timeout,
        }
    }

    fn watch_adopted(&self, dir: &Path, pid: i32, pidfd: OwnedFd, set: String) -> Replica {
        let status = Arc::new(Mutex::new(Status::Running { pid, adopted: true }));
        let (stop_tx, stop_rx) = oneshot::channel();
        // `<base>/<namespace>/<name>`: named `namespace/name` in the log.
        let mut parts = dir.iter().rev().take(2).map(|c| c.to_string_lossy());
        let name = parts.next().unwrap_or_default();
        let replica = format!("{}/{name}", parts.next().unwrap_or_default());
        let watched = self.watched(replica, dir, status.clone());
        let task = tokio::spawn(watch_adopted(watched, pid, pidfd, stop_rx));
        Replica {
            set,
            status,
            watcher: Some(Watcher {
                stop: stop_tx,
                task,
            }),
        }
    }

    async fn stop(&self, namespace: &str, name: &str) -> Result<(), LocalError> {
        validate("namespace", namespace)?;
        validate("replica", name)?;
        let key = (namespace.to_string(), name.to_string());
        let lock = self.op_lock(&key);
        let result = {
            let _guard = lock.lock().await;
            self.stop_locked(&key).await
        };
        self.release_op_lock(&key, lock);
        result
    }

    async fn stop_locked(&self, key: &Key) -> Result<(), LocalError> {
        let dir = self.replica_dir(&key.0, &key.1);
        let known = self.replicas.lock_or_recover().remove(key);
        let watcher = match known {
            Some(r) => r.watcher,
            // Not known (should not happen: `new` adopts or reaps everything), but a process
            // may still run there: stop it as an adopted one.
            None => {
                let d = dir.clone();
                match blocking(move || Ok(verified_process(&d))).await? {
                    Some((pid, pidfd)) => Some(self.watch_adopted(&dir, pid, pidfd, String::new()))
                        .and_then(|r| r.watcher),
                    None => None,
                }
            }
        };
        if let Some(w) = watcher {
            // The watcher stops the process and returns; it also returns by itself once the
            // process has exited (then the send fails, which is fine).
            let _ = w.stop.send(());
            let _ = w.task.await;
            tracing::info!("pool replica {}/{} stopped", key.0, key.1);
        }
        let base = self.options.base_dir.clone();
        blocking(move || {
            remove_replica_dir(&dir)?;
            // The namespace's directory goes with its last replica.
            if let Some(ns) = dir.parent()
                && ns != base
            {
                let _ = std::fs::remove_dir(ns);
            }
            Ok(())
        })
        .await
    }

    async fn observe(
        &self,
        namespace: &str,
        set: &str,
    ) -> Result<Vec<ReplicaObservation>, LocalError> {
        validate("namespace", namespace)?;
        validate("set", set)?;
        let ns_dir = self.options.base_dir.join(namespace);
        let on_disk = blocking(move || Ok(read_namespace(&ns_dir))).await?;
        let mut out: BTreeMap<String, ReplicaObservation> = BTreeMap::new();
        let replicas = self.replicas.lock_or_recover();
        for meta in on_disk.into_iter().filter(|m| m.set == set) {
            let key = (namespace.to_string(), meta.name.clone());
            let obs = match replicas.get(&key) {
                Some(r) => observation(&meta.name, &r.status.lock_or_recover()),
                None => ReplicaObservation {
                    name: meta.name.clone(),
                    phase: ReplicaPhase::Unknown,
                    message: Some(
                        "its directory exists but this controller did not start or adopt it"
                            .to_string(),
                    ),
                },
            };
            out.insert(meta.name, obs);
        }
        // Known replicas whose directory went missing.
        for ((ns, name), r) in replicas.iter() {
            if ns == namespace && r.set == set && !out.contains_key(name) {
                out.insert(name.clone(), observation(name, &r.status.lock_or_recover()));
            }
        }
        Ok(out.into_values().collect())
    }
}

fn observation(name: &str, status: &Status) -> ReplicaObservation {
    let (phase, message) = match status {
        Status::Pending => (ReplicaPhase::Pending, None),
        Status::Running { pid, adopted } => (
            ReplicaPhase::Running,
            Some(if *adopted {
                format!("pid {pid}, re-adopted after a controller restart")
            } else {
                format!("pid {pid}")
            }),
        ),
        Status::Exited { phase, message } => (*phase, Some(message.clone())),
    };
    ReplicaObservation {
        name: name.to_string(),
        phase,
        message,
    }
}

/// The phase and message of an exit status.
fn exit_phase(status: std::process::ExitStatus) -> (ReplicaPhase, String) {
    match (status.code(), status.signal()) {
        (Some(0), _) => (ReplicaPhase::Succeeded, "exited with status 0".to_string()),
        (Some(code), _) => (ReplicaPhase::Failed, format!("exited with status {code}")),
        (None, Some(sig)) => (
            ReplicaPhase::Failed,
            match signal_name(sig) {
                Some(n) => format!("killed by signal {sig} ({n})"),
                None => format!("killed by signal {sig}"),
            },
        ),
        (None, None) => (ReplicaPhase::Failed, format!("exited: {status}")),
    }
}

fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => return None,
    })
}

/// Owns a child replica until it exits (reaping it) or is told to stop (SIGTERM, then
/// SIGKILL after the grace time); keeps its log bounded meanwhile.
async fn watch_child(
    w: Watched,
    mut child: tokio::process::Child,
    pid: i32,
    mut stop: oneshot::Receiver<()>,
) {
    let mut tick = tokio::time::interval(LOG_CHECK_INTERVAL);
    let exited = loop {
        tokio::select! {
            r = child.wait() => break r,
            asked = &mut stop => {
                if asked.is_err() {
                    // The provisioner was dropped: the replica runs on, for the next one.
                    return;
                }
                if let Some(p) = Pid::from_raw(pid) {
                    // The child is not yet reaped, so `pid` is still this child.
                    let _ = rustix::process::kill_process(p, Signal::TERM);
                }
                break match tokio::time::timeout(w.grace, child.wait()).await {
                    Ok(r) => r,
                    Err(_) => {
                        let _ = child.start_kill();
                        match tokio::time::timeout(KILL_WAIT, child.wait()).await {
                            Ok(r) => r,
                            Err(_) => Err(std::io::Error::other("still running after SIGKILL")),
                        }
                    }
                };
            }
            _ = tick.tick() => cap_log(&w.log, w.max_log).await,
        }
    };
    let (phase, message) = match exited {
        Ok(s) => exit_phase(s),
        Err(e) => (
            ReplicaPhase::Unknown,
            format!("cannot wait for pid {pid}: {e}"),
        ),
    };
    tracing::info!("pool replica {} (pid {pid}) {message}", w.replica);
    *w.status.lock_or_recover() = Status::Exited { phase, message };
}

/// Watches a re-adopted replica (not a child) through its pidfd until it exits or is told to
/// stop (SIGTERM, then SIGKILL after the grace time, both through the pidfd); keeps its log
/// bounded.
async fn watch_adopted(w: Watched, pid: i32, pidfd: OwnedFd, mut stop: oneshot::Receiver<()>) {
    // Registered through a copy, so that the pidfd is kept when registering fails.
    let registered = pidfd.try_clone().ok().and_then(|copy| {
        // `AsyncFd::new` is deprecated because a type could change the descriptor it reports
        // while registered; an `OwnedFd` never does, so this use is sound (`register`, its
        // replacement, is `unsafe`, which this workspace forbids).
        #[allow(deprecated)]
        AsyncFd::new(copy).ok()
    });
    let pidfd = match registered {
        Some(fd) => PidWatch::Ready(fd),
        None => PidWatch::Polled {
            pidfd,
            start_time: read_stat(pid).map_or(0, |s| s.start_time),
        },
    };
    let mut tick = tokio::time::interval(LOG_CHECK_INTERVAL);
    let message = loop {
        tokio::select! {
            _ = pidfd.exited(pid) => break "exited after a controller restart; its exit status \
                                           is unknown (it was re-adopted, not a child)",
            asked = &mut stop => {
                if asked.is_err() {
                    // The provisioner was dropped: the replica runs on, for the next one.
                    return;
                }
                let _ = rustix::process::pidfd_send_signal(pidfd.fd(), Signal::TERM);
                if tokio::time::timeout(w.grace, pidfd.exited(pid)).await.is_err() {
                    let _ = rustix::process::pidfd_send_signal(pidfd.fd(), Signal::KILL);
                    let _ = tokio::time::timeout(KILL_WAIT, pidfd.exited(pid)).await;
                }
                break "stopped";
            }
            _ = tick.tick() => cap_log(&w.log, w.max_log).await,
        }
    };
    tracing::info!("pool replica {} (pid {pid}) {message}", w.replica);
    *w.status.lock_or_recover() = Status::Exited {
        phase: ReplicaPhase::Failed,
        message: message.to_string(),
    };
}

/// A re-adopted replica's pidfd, waited on through the runtime, or by looking at `/proc`
/// when it cannot be registered there.
enum PidWatch {
    Ready(AsyncFd<OwnedFd>),
    Polled { pidfd: OwnedFd, start_time: u64 },
}

impl PidWatch {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        match self {
            Self::Ready(fd) => fd.get_ref().as_fd(),
            Self::Polled { pidfd, .. } => pidfd.as_fd(),
        }
    }

    /// Resolves once the process has exited (a pidfd becomes readable then).
    async fn exited(&self, pid: i32) {
        match self {
            Self::Ready(fd) => {
                let _ = fd.readable().await;
            }
            Self::Polled { start_time, .. } => {
                while read_stat(pid).is_some_and(|s| s.alive() && s.start_time == *start_time) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

/// Copies the log to `exporter.log.1` and truncates it once it is larger than `max`. The
/// child appends (O_APPEND), so it goes on writing at the new end.
async fn cap_log(log: &Path, max: u64) {
    let Ok(m) = tokio::fs::metadata(log).await else {
        return;
    };
    if m.len() <= max {
        return;
    }
    let old = log.with_file_name(OLD_LOG_FILE);
    let rotated = async {
        tokio::fs::copy(log, &old).await?;
        tokio::fs::OpenOptions::new()
            .write(true)
            .open(log)
            .await?
            .set_len(0)
            .await
    };
    if let Err(e) = rotated.await {
        tracing::warn!("cannot rotate {}: {e}", log.display());
    }
}

/// Creates `path` 0700 if missing, and sets 0700 on it either way.
fn private_dir(path: &Path) -> Result<(), LocalError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(io("create", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .map_err(io("set the mode of", path))
}

/// Makes the replica's directory and files; returns its log, opened to append.
fn prepare_replica_dir(
    base: &Path,
    dir: &Path,
    meta: &ReplicaMeta,
    config: &str,
    max_log: u64,
) -> Result<std::fs::File, LocalError> {
    use std::io::Write;
    private_dir(base)?;
    if let Some(ns) = dir.parent() {
        private_dir(ns)?;
    }
    private_dir(dir)?;
    private_dir(&dir.join("home"))?;
    private_dir(&dir.join("run"))?;
    let write_private = |name: &str, text: &[u8]| -> Result<(), LocalError> {
        let path = dir.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(io("create", &path))?;
        // An existing file keeps its mode on open: set it.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io("set the mode of", &path))?;
        f.write_all(text).map_err(io("write", &path))
    };
    let meta_json = serde_json::to_vec(meta).map_err(|e| LocalError::Io {
        what: "encode",
        path: dir.join(META_FILE),
        source: std::io::Error::other(e),
    })?;
    write_private(META_FILE, &meta_json)?;
    write_private(CONFIG_FILE, config.as_bytes())?;
    let log = dir.join(LOG_FILE);
    if std::fs::metadata(&log).is_ok_and(|m| m.len() > max_log) {
        let _ = std::fs::rename(&log, dir.join(OLD_LOG_FILE));
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&log)
        .map_err(io("open", &log))
}

/// Removes a replica's directory (gone already is fine).
fn remove_replica_dir(dir: &Path) -> Result<(), LocalError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", dir)(e)),
        _ => Ok(()),
    }
}

fn read_meta(dir: &Path) -> Option<ReplicaMeta> {
    let bytes = std::fs::read(dir.join(META_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The replica directories under `base` with their metadata (`None` when unreadable or not
/// matching the directory's place).
fn find_leftovers(base: &Path) -> Vec<(PathBuf, Option<ReplicaMeta>)> {
    let mut out = Vec::new();
    let Ok(namespaces) = std::fs::read_dir(base) else {
        return out;
    };
    for ns in namespaces.flatten() {
        let ns_name = ns.file_name();
        let Some(ns_name) = ns_name
            .to_str()
            .filter(|n| validate("namespace", n).is_ok())
        else {
            continue;
        };
        if !ns.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(replicas) = std::fs::read_dir(ns.path()) else {
            continue;
        };
        for r in replicas.flatten() {
            let name = r.file_name();
            let Some(name) = name.to_str().filter(|n| validate("replica", n).is_ok()) else {
                continue;
            };
            if !r.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let meta = read_meta(&r.path()).filter(|m| {
                m.namespace == ns_name && m.name == name && validate("set", &m.set).is_ok()
            });
            out.push((r.path(), meta));
        }
    }
    out
}

/// The metadata of every replica directory of a namespace's directory.
fn read_namespace(ns_dir: &Path) -> Vec<ReplicaMeta> {
    let Ok(entries) = std::fs::read_dir(ns_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let meta = read_meta(&e.path())?;
            (e.file_name().to_str() == Some(meta.name.as_str())).then_some(meta)
        })
        .collect()
}

/// What `/proc/PID/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    /// The state letter (`R`, `S`, `Z`...).
    state: char,
    /// Clock ticks after boot when it started.
    start_time: u64,
}

impl ProcStat {
    fn alive(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

fn read_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses `/proc/PID/stat`: the command name in parentheses may hold anything, so the fields
/// are counted after its last `)`.
fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4..=21 are skipped; field 22 is the start time.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(ProcStat { state, start_time })
}

/// The pid and start time a pid file holds.
fn parse_pid_file(text: &str) -> Option<(i32, u64)> {
    let mut it = text.split_whitespace();
    let pid = it.next()?.parse().ok().filter(|p: &i32| *p > 0)?;
    let start = it.next()?.parse().ok()?;
    Some((pid, start))
}

/// The live process that is the replica of `dir`, with a pidfd naming it: the pid of its
/// pid file, alive, started at the recorded time and running `--exporter-config` of this
/// directory's config. The pidfd is opened before the checks, so a pid reused after them is
/// never signalled through it.
fn verified_process(dir: &Path) -> Option<(i32, OwnedFd)> {
    let (pid, start_time) = parse_pid_file(&std::fs::read_to_string(dir.join(PID_FILE)).ok()?)?;
    let pidfd = rustix::process::pidfd_open(Pid::from_raw(pid)?, PidfdFlags::empty()).ok()?;
    let stat = read_stat(pid)?;
    if !stat.alive() || stat.start_time != start_time {
        return None;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let config: OsString = dir.join(CONFIG_FILE).into_os_string();
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let ours = args
        .windows(2)
        .any(|w| w[0] == b"--exporter-config" && w[1] == config.as_encoded_bytes());
    ours.then_some((pid, pidfd))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::objects::virtualtarget::VirtualTargetClass;

    /// `jmp` of this build: the test binary is `<target>/debug/deps/NAME-HASH`.
    fn jmp_bin() -> PathBuf {
        let exe = std::env::current_exe().unwrap();
        let jmp = exe.ancestors().nth(2).unwrap().join("jmp");
        assert!(
            jmp.is_file(),
            "{} is missing: run `cargo build -p jumpstarter-cli --bins` first",
            jmp.display()
        );
        jmp
    }

    /// Processes SIGKILLed when the test ends, passed or failed (only while still the same
    /// process).
    #[derive(Default)]
    struct Procs(Mutex<Vec<(i32, u64)>>);

    impl Procs {
        fn add(&self, pid: i32) {
            if let Some(s) = read_stat(pid) {
                self.0.lock_or_recover().push((pid, s.start_time));
            }
        }
    }

    impl Drop for Procs {
        fn drop(&mut self) {
            for (pid, start) in self.0.lock_or_recover().drain(..) {
                if read_stat(pid).is_some_and(|s| s.start_time == start && s.alive()) {
                    let _ =
                        rustix::process::kill_process(Pid::from_raw(pid).unwrap(), Signal::KILL);
                }
            }
        }
    }

    fn alive(pid: i32) -> bool {
        read_stat(pid).is_some_and(|s| s.alive())
    }

    fn set(ns: &str, name: &str) -> ExporterSet {
        let mut s = ExporterSet::default();
        s.metadata.namespace = Some(ns.to_string());
        s.metadata.name = Some(name.to_string());
        s
    }

    fn request(ns: &str, set_name: &str, name: &str) -> ReplicaRequest {
        ReplicaRequest {
            namespace: ns.to_string(),
            name: name.to_string(),
            // Port 1 refuses: `jmp run` keeps retrying.
            exporter_config: format!(
                "apiVersion: jumpstarter.dev/v1alpha1\nkind: ExporterConfig\nmetadata:\n  \
                 namespace: {ns}\n  name: {name}\nendpoint: 127.0.0.1:1\ntoken: secret-token\n\
                 export: {{}}\n"
            ),
            labels: [(LABEL_EXPORTER_SET.to_string(), set_name.to_string())].into(),
            set: set(ns, set_name),
            class: VirtualTargetClass::default(),
        }
    }

    fn options(base: &Path, jmp: PathBuf) -> LocalOptions {
        let mut o = LocalOptions::new(base.to_path_buf());
        o.jmp = Some(jmp);
        o
    }

    /// Waits (bounded) until `f` holds; fails naming `what` otherwise.
    async fn until<F: AsyncFnMut() -> bool>(what: &str, mut f: F) {
        for _ in 0..600 {
            if f().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("never happened: {what}");
    }

    async fn observed(p: &LocalProvisioner, ns: &str, s: &str) -> Vec<ReplicaObservation> {
        p.observe(&set(ns, s)).await.unwrap()
    }

    /// The pid of a running replica.
    async fn running_pid(p: &LocalProvisioner, ns: &str, s: &str, name: &str) -> i32 {
        let obs = observed(p, ns, s).await;
        let o = obs.iter().find(|o| o.name == name).unwrap();
        assert_eq!(o.phase, ReplicaPhase::Running, "{o:?}");
        o.message
            .as_deref()
            .and_then(|m| m.strip_prefix("pid "))
            .and_then(|m| m.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|m| m.parse().ok())
            .unwrap()
    }

    /// The replica's process has exec'd `jmp run` (before that it is a copy of this test).
    async fn wait_exec(pid: i32) {
        until("the replica exec'd", async || {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(17).any(|w| w == b"--exporter-config"))
        })
        .await;
    }

    /// A fake `jmp` running `body` with sh (ready to run: a fork of another test may hold
    /// its file open for writing a moment, so it is tried until it runs).
    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        for _ in 0..100 {
            match std::process::Command::new(&path)
                .arg("--probe")
                .env("PROBE", "1")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
            {
                Err(e) if e.raw_os_error() == Some(26) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => return path,
            }
        }
        panic!("{} stays busy", path.display());
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[tokio::test]
    async fn start_observe_stop() {
        let tmp = tempfile::tempdir().unwrap();
        let procs = Procs::default();
        let base = tmp.path().join("pools");
        let mut o = options(&base, jmp_bin());
        o.exit_with_controller = true;
        let p = LocalProvisioner::new(o).await.unwrap();
        let req = request("lab", "pool", "pool-a1");
        p.start(&req).await.unwrap();
        let pid = running_pid(&p, "lab", "pool", "pool-a1").await;
        procs.add(pid);
        wait_exec(pid).await;

        let dir = p.replica_dir("lab", "pool-a1");
        assert_eq!(dir, base.join("lab/pool-a1"));
        for d in [&base, &base.join("lab"), &dir] {
            assert_eq!(mode(d), 0o700, "{}", d.display());
        }
        assert_eq!(mode(&dir.join(CONFIG_FILE)), 0o600);
        assert_eq!(
            std::fs::read_to_string(dir.join(CONFIG_FILE)).unwrap(),
            req.exporter_config
        );
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let env: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
        let home = format!("HOME={}", dir.join("home").display());
        assert!(env.contains(&home.as_bytes()), "{home}");
        let parent = format!("{EXIT_WITH_PARENT_ENV}={}", std::process::id());
        assert!(env.contains(&parent.as_bytes()), "{parent}");

        // Another set of the namespace sees nothing of it.
        assert!(observed(&p, "lab", "other").await.is_empty());
        // Starting it again is a no-op.
        p.start(&req).await.unwrap();
        assert_eq!(running_pid(&p, "lab", "pool", "pool-a1").await, pid);
        // `jmp run` logs its retries.
        until("jmp run logged", async || {
            std::fs::metadata(dir.join(LOG_FILE)).is_ok_and(|m| m.len() > 0)
        })
        .await;

        p.stop("lab", "pool-a1").await.unwrap();
        assert!(!alive(pid), "pid {pid} still runs");
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "not reaped");
        assert!(!dir.exists());
        assert!(!base.join("lab").exists());
        assert!(observed(&p, "lab", "pool").await.is_empty());
        p.stop("lab", "pool-a1").await.unwrap();
    }

    #[tokio::test]
    async fn a_start_given_up_by_its_caller_still_completes() {
        use futures::FutureExt;
        let tmp = tempfile::tempdir().unwrap();
        let procs = Procs::default();
        let p = LocalProvisioner::new(options(&tmp.path().join("pools"), jmp_bin()))
            .await
            .unwrap();
        // Polled once and dropped: the caller gave up before anything was spawned.
        assert!(
            p.start(&request("lab", "pool", "pool-g"))
                .now_or_never()
                .is_none()
        );
        until("the replica runs", async || {
            observed(&p, "lab", "pool")
                .await
                .first()
                .is_some_and(|o| o.phase == ReplicaPhase::Running)
        })
        .await;
        let pid = running_pid(&p, "lab", "pool", "pool-g").await;
        procs.add(pid);
        p.stop("lab", "pool-g").await.unwrap();
        assert!(!alive(pid));
    }

    #[tokio::test]
    async fn killed_and_exited_replicas_have_their_phase() {
        let tmp = tempfile::tempdir().unwrap();
        let procs = Procs::default();
        let base = tmp.path().join("pools");
        let p = LocalProvisioner::new(options(&base, jmp_bin()))
            .await
            .unwrap();
        p.start(&request("lab", "pool", "pool-k")).await.unwrap();
        let pid = running_pid(&p, "lab", "pool", "pool-k").await;
        procs.add(pid);
        rustix::process::kill_process(Pid::from_raw(pid).unwrap(), Signal::KILL).unwrap();
        until("the killed replica failed", async || {
            observed(&p, "lab", "pool").await[0].phase != ReplicaPhase::Running
        })
        .await;
        let o = &observed(&p, "lab", "pool").await[0];
        assert_eq!(o.phase, ReplicaPhase::Failed);
        assert_eq!(o.message.as_deref(), Some("killed by signal 9 (SIGKILL)"));
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "not reaped");
        // Started again, it runs again.
        p.start(&request("lab", "pool", "pool-k")).await.unwrap();
        let again = running_pid(&p, "lab", "pool", "pool-k").await;
        procs.add(again);
        assert_ne!(again, pid);
        p.stop("lab", "pool-k").await.unwrap();
        assert!(!alive(again));

        for (code, phase, message) in [
            (0, ReplicaPhase::Succeeded, "exited with status 0"),
            (3, ReplicaPhase::Failed, "exited with status 3"),
        ] {
            let jmp = script(tmp.path(), &format!("exit{code}"), &format!("exit {code}"));
            let p = LocalProvisioner::new(options(&tmp.path().join(format!("b{code}")), jmp))
                .await
                .unwrap();
            p.start(&request("lab", "pool", "pool-e")).await.unwrap();
            until("the replica exited", async || {
                !matches!(
                    observed(&p, "lab", "pool").await[0].phase,
                    ReplicaPhase::Running | ReplicaPhase::Pending
                )
            })
            .await;
            let o = &observed(&p, "lab", "pool").await[0];
            assert_eq!((o.phase, o.message.as_deref()), (phase, Some(message)));
            p.stop("lab", "pool-e").await.unwrap();
            assert!(observed(&p, "lab", "pool").await.is_empty());
        }
    }

    #[tokio::test]
    async fn a_new_provisioner_adopts_running_replicas_and_reaps_dead_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let procs = Procs::default();
        let base = tmp.path().join("pools");
        let first = LocalProvisioner::new(options(&base, jmp_bin()))
            .await
            .unwrap();
        first
            .start(&request("lab", "pool", "pool-live"))
            .await
            .unwrap();
        first
            .start(&request("lab", "pool", "pool-dead"))
            .await
            .unwrap();
        let live = running_pid(&first, "lab", "pool", "pool-live").await;
        let dead = running_pid(&first, "lab", "pool", "pool-dead").await;
        procs.add(live);
        procs.add(dead);
        wait_exec(live).await;
        rustix::process::kill_process(Pid::from_raw(dead).unwrap(), Signal::KILL).unwrap();
        until("the killed replica failed", async || {
            observed(&first, "lab", "pool")
                .await
                .iter()
                .any(|o| o.phase == ReplicaPhase::Failed)
        })
        .await;
        // The controller goes away without stopping its replicas.
        drop(first);
        assert!(alive(live));

        let second = LocalProvisioner::new(options(&base, jmp_bin()))
            .await
            .unwrap();
        let obs = observed(&second, "lab", "pool").await;
        assert_eq!(obs.len(), 1, "{obs:?}");
        assert_eq!(obs[0].name, "pool-live");
        assert_eq!(obs[0].phase, ReplicaPhase::Running);
        assert_eq!(
            obs[0].message.as_deref(),
            Some(format!("pid {live}, re-adopted after a controller restart").as_str())
        );
        assert!(!base.join("lab/pool-dead").exists());
        // Starting it again keeps the adopted process.
        second
            .start(&request("lab", "pool", "pool-live"))
            .await
            .unwrap();
        assert_eq!(running_pid(&second, "lab", "pool", "pool-live").await, live);

        second.stop("lab", "pool-live").await.unwrap();
        assert!(!alive(live), "pid {live} still runs");
        assert!(!base.join("lab/pool-live").exists());
        assert!(observed(&second, "lab", "pool").await.is_empty());
    }

    #[tokio::test]
    async fn a_pid_file_naming_another_process_is_neither_adopted_nor_signalled() {
        let tmp = tempfile::tempdir().unwrap();
        let procs = Procs::default();
        let base = tmp.path().join("pools");
        let mut other = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let pid = other.id() as i32;
        procs.add(pid);
        let start = read_stat(pid).unwrap().start_time;
        // Its true start time, and a wrong one.
        for (name, start) in [("pool-x", start), ("pool-y", start + 1)] {
            let dir = base.join("lab").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let meta = ReplicaMeta {
                namespace: "lab".into(),
                name: name.into(),
                set: "pool".into(),
            };
            std::fs::write(dir.join(META_FILE), serde_json::to_vec(&meta).unwrap()).unwrap();
            std::fs::write(dir.join(PID_FILE), format!("{pid} {start}\n")).unwrap();
        }
        let p = LocalProvisioner::new(options(&base, jmp_bin()))
            .await
            .unwrap();
        assert!(observed(&p, "lab", "pool").await.is_empty());
        assert!(!base.join("lab").exists());
        // A stop of that name does not touch it either.
        p.stop("lab", "pool-x").await.unwrap();
        assert!(alive(pid));
        assert!(other.try_wait().unwrap().is_none(), "sleep was signalled");
        other.kill().unwrap();
        other.wait().unwrap();
    }

    #[tokio::test]
    async fn bad_names_are_refused_and_change_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("pools");
        let p = LocalProvisioner::new(options(&base, jmp_bin()))
            .await
            .unwrap();
        std::fs::write(tmp.path().join("keep"), "x").unwrap();
        for (ns, name) in [
            ("lab", "../keep"),
            ("lab", "a/b"),
            ("lab", ".."),
            ("..", "x"),
            ("lab/x", "y"),
            ("lab", ""),
            ("lab", "UPPER"),
        ] {
            let e = p.start(&request(ns, "pool", name)).await.unwrap_err();
            let text = jumpstarter_core::error_chain(&e);
            assert!(text.contains("is not a valid name"), "{text}");
            assert!(text.contains(&format!("{ns}/{name}")), "{text}");
            p.stop(ns, name).await.unwrap_err();
        }
        let e = p.observe(&set("lab", "a/b")).await.unwrap_err();
        assert!(
            jumpstarter_core::error_chain(&e).contains("set \"a/b\" is not a valid name"),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(&base).unwrap().count(), 0);
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("keep")).unwrap(),
            "x"
        );
    }

    #[tokio::test]
    async fn a_missing_jmp_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("no-such-jmp");
        let e = LocalProvisioner::new(options(tmp.path(), missing.clone()))
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains(&missing.display().to_string()),
            "{e}"
        );
        // Without an explicit path: beside the executable, then on PATH.
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let exe = bin.join("jumpstarter-controller");
        let e = resolve_jmp(None, Some(&exe), Some(tmp.path().as_os_str())).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&bin.join("jmp").display().to_string()),
            "{text}"
        );
        assert!(text.contains("jmp on PATH"), "{text}");
        let on_path = script(tmp.path(), "jmp", "exit 0");
        assert_eq!(
            resolve_jmp(None, Some(&exe), Some(tmp.path().as_os_str())).unwrap(),
            on_path
        );
        let beside = script(&bin, "jmp", "exit 0");
        assert_eq!(
            resolve_jmp(None, Some(&exe), Some(tmp.path().as_os_str())).unwrap(),
            beside
        );
    }

    #[tokio::test]
    async fn the_log_is_rotated_past_its_bound() {
        let tmp = tempfile::tempdir().unwrap();
        let procs = Procs::default();
        let jmp = script(
            tmp.path(),
            "chatty",
            "[ \"$PROBE\" = 1 ] && exit 0\nhead -c 200000 /dev/zero | tr '\\0' x\nexec sleep 600",
        );
        let mut o = options(&tmp.path().join("pools"), jmp);
        o.max_log_bytes = 64 << 10;
        let p = LocalProvisioner::new(o).await.unwrap();
        p.start(&request("lab", "pool", "pool-c")).await.unwrap();
        procs.add(running_pid(&p, "lab", "pool", "pool-c").await);
        let dir = p.replica_dir("lab", "pool-c");
        // Rotated once the log passed the bound (a rotation while the child still writes
        // copies part of its output, and the next one the rest: each copy is past the bound).
        until("the log was rotated", async || {
            std::fs::metadata(dir.join(OLD_LOG_FILE)).is_ok_and(|m| m.len() > 64 << 10)
        })
        .await;
        until("the log was truncated", async || {
            std::fs::metadata(dir.join(LOG_FILE)).is_ok_and(|m| m.len() <= 64 << 10)
        })
        .await;
        p.stop("lab", "pool-c").await.unwrap();
    }

    #[tokio::test]
    async fn replicas_told_to_exit_with_the_controller_stop_when_it_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let procs = Procs::default();
        let mut o = options(&tmp.path().join("pools"), jmp_bin());
        o.exit_with_controller = true;
        let p = LocalProvisioner::new(o).await.unwrap();
        p.start(&request("lab", "pool", "pool-d")).await.unwrap();
        let pid = running_pid(&p, "lab", "pool", "pool-d").await;
        procs.add(pid);
        // Once it logs, it has asked for the parent-death signal (that comes first).
        let log = p.replica_dir("lab", "pool-d").join(LOG_FILE);
        until("jmp run logged", async || {
            std::fs::metadata(&log).is_ok_and(|m| m.len() > 0)
        })
        .await;
        // The thread that spawned it ends with the provisioner: the kernel sends SIGTERM.
        drop(p);
        until("the replica stopped with its provisioner", async || {
            !alive(pid)
        })
        .await;
    }

    /// `jmp run` with the variable stops once the process that started it is gone.
    #[tokio::test]
    async fn jmp_run_exits_with_its_parent_when_asked() {
        let tmp = tempfile::tempdir().unwrap();
        let procs = Procs::default();
        let config = tmp.path().join(CONFIG_FILE);
        std::fs::write(&config, request("lab", "pool", "pool-o").exporter_config).unwrap();
        // The shell starts `jmp run` in the background and exits at once.
        let out = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{EXIT_WITH_PARENT_ENV}=$$ \"$0\" run --exporter-config \"$1\" >/dev/null 2>&1 & \
                 echo $!"
            ))
            .arg(jmp_bin())
            .arg(&config)
            .output()
            .await
            .unwrap();
        let pid: i32 = String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        procs.add(pid);
        until("the orphaned jmp run stopped", async || !alive(pid)).await;

        // A value that is no pid is refused, naming the variable.
        let out = tokio::process::Command::new(jmp_bin())
            .args(["run", "--exporter-config"])
            .arg(&config)
            .env(EXIT_WITH_PARENT_ENV, "controller")
            .output()
            .await
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "{EXIT_WITH_PARENT_ENV}=\"controller\" is not a process id"
            )),
            "{err}"
        );
    }

    /// Both ways of waiting for a re-adopted replica see it exit, and not before.
    #[tokio::test]
    async fn a_pid_watch_sees_its_process_exit() {
        use futures::FutureExt;
        for polled in [false, true] {
            let procs = Procs::default();
            let mut sleep = std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .unwrap();
            let pid = sleep.id() as i32;
            procs.add(pid);
            let pidfd =
                rustix::process::pidfd_open(Pid::from_raw(pid).unwrap(), PidfdFlags::empty())
                    .unwrap();
            let watch = if polled {
                PidWatch::Polled {
                    pidfd,
                    start_time: read_stat(pid).unwrap().start_time,
                }
            } else {
                #[allow(deprecated)]
                PidWatch::Ready(AsyncFd::new(pidfd).unwrap())
            };
            assert!(
                watch.exited(pid).now_or_never().is_none(),
                "polled: {polled}"
            );
            rustix::process::pidfd_send_signal(watch.fd(), Signal::KILL).unwrap();
            sleep.wait().unwrap();
            watch.exited(pid).await;
        }
    }

    #[test]
    fn proc_stat_and_pid_files_parse() {
        let s = parse_stat("42 (a) b) (c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 19")
            .unwrap();
        assert_eq!(
            s,
            ProcStat {
                state: 'S',
                start_time: 777
            }
        );
        assert!(parse_stat("42 (x) Z").is_none());
        assert_eq!(parse_pid_file("12 345\n"), Some((12, 345)));
        for bad in ["", "12", "-1 3", "0 3", "x 3", "12 y"] {
            assert_eq!(parse_pid_file(bad), None, "{bad:?}");
        }
        let own = read_stat(std::process::id() as i32).unwrap();
        assert!(own.alive());
    }
}
