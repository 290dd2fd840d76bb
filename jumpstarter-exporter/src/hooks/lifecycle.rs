//! One lease's hooks and the statuses around them, as upstream 0.9.0 orders them:
//!
//! - lease assigned: `BEFORE_LEASE_HOOK` ("Running beforeLease hook"); driver calls of
//!   clients wait; the hook's own `j` reaches the drivers on a dedicated Unix socket; then
//!   `LEASE_READY` ("Ready for commands", or `[HOOK_WARNING] beforeLease hook warning: ...`
//!   after a failure with `onFailure: warn`), or `BEFORE_LEASE_HOOK_FAILED` (`endLease`,
//!   `exit`: the afterLease hook will not run);
//! - session ended (`EndSession`) or lease ended: `AFTER_LEASE_HOOK` ("Running afterLease
//!   hooks"), then `AVAILABLE` ("Available for new lease", or a hook warning), or
//!   `AFTER_LEASE_HOOK_FAILED`.
//!
//! With `exit`, the controller is also told `OFFLINE` at once (the client keeps seeing the
//! `*_FAILED` status), and the caller shuts the exporter down once the lease is released.

use std::{path::PathBuf, sync::Arc, time::Duration};

use futures::future::BoxFuture;
use jumpstarter_proto::v1::ExporterStatus;
use tokio::sync::{OnceCell, watch};
use tokio_util::sync::CancellationToken;

use jumpstarter_core::{DriverNode, Session, hooks::HOOK_WARNING_PREFIX, server as serve};

use super::{
    HookKind, HookSpec, LeaseHooks, OnFailure,
    process::{self, HookEnv},
};

/// Where status changes go besides the session (the controller, in controller mode).
pub trait StatusSink: Send + Sync {
    /// Reports `status` with `message`; must not fail (log instead).
    fn report<'a>(&'a self, status: ExporterStatus, message: &'a str) -> BoxFuture<'a, ()>;

    /// A hook of `kind` ran (for health tracking); by default nothing happens.
    fn hook_outcome<'a>(
        &'a self,
        _kind: HookKind,
        _outcome: &'a process::Outcome,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// A sink for exporters without a controller (standalone): statuses stay in the session.
pub struct NoController;

impl StatusSink for NoController {
    fn report<'a>(&'a self, _: ExporterStatus, _: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// What the lease should do after a hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Go on (the hook succeeded, or failed with `warn`).
    Proceed,
    /// End the lease (`onFailure: endLease`).
    EndLease,
    /// End the lease and shut the exporter down with exit code 1 (`onFailure: exit`).
    Exit,
}

/// A hook socket that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HookSocketError {
    /// Its private directory could not be created.
    #[error("cannot create the hook socket's directory in {dir}")]
    Dir {
        /// Where it was to be made.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The socket could not be served.
    #[error("cannot serve the hook socket in {dir}")]
    Serve {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: jumpstarter_core::CoreError,
    },
}

/// The kind of hook socket directories: named `jumpstarter-hook-PID-RANDOM`
/// ([`jumpstarter_core::leftovers`]).
const HOOK_DIR_KIND: &str = "jumpstarter-hook";

/// Where hook socket directories go: `$XDG_RUNTIME_DIR` when usable, else the temp directory.
fn hook_base() -> PathBuf {
    std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty() && std::path::Path::new(d).is_dir())
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// Removes the hook socket directories an exporter killed without a chance to clean up
/// (SIGKILL) left behind: ours (same owner), named `jumpstarter-hook-PID-...`, whose PID no
/// longer runs. Called when an exporter with hooks starts.
pub fn sweep_stale_hook_dirs() {
    sweep_stale_hook_dirs_in(&hook_base());
}

fn sweep_stale_hook_dirs_in(base: &std::path::Path) {
    jumpstarter_core::leftovers::sweep_in(base, HOOK_DIR_KIND);
}

/// A private Unix socket serving a driver tree to a hook's `j` (`JUMPSTARTER_HOST`); removed
/// when dropped.
pub struct HookSocket {
    session: Arc<Session>,
    path: PathBuf,
    dir: PathBuf,
    stop: CancellationToken,
}

impl HookSocket {
    /// Serves `tree` (always ready: whatever the clients' session says) with `labels` on a
    /// socket in a fresh 0700 directory under `$XDG_RUNTIME_DIR` (or the temp directory).
    pub fn start(
        tree: DriverNode,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Result<Self, HookSocketError> {
        let base = hook_base();
        // Kept until `drop` (which removes it); the sweep at start removes it after a kill.
        let dir = jumpstarter_core::leftovers::private_dir_in(&base, HOOK_DIR_KIND)
            .map_err(|source| HookSocketError::Dir {
                dir: base.clone(),
                source,
            })?
            .keep();
        let path = serve::local_socket_path(&dir);
        let hook_session = Session::new_ready(tree, labels);
        let stop = CancellationToken::new();
        let server = match serve::serve_unix(
            Arc::clone(&hook_session),
            &path,
            stop.clone().cancelled_owned(),
        ) {
            Ok(server) => server,
            Err(source) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(HookSocketError::Serve { dir, source });
            }
        };
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::warn!("hook socket: {e}", e = jumpstarter_core::error_chain(&e));
            }
        });
        Ok(Self {
            session: hook_session,
            path,
            dir,
            stop,
        })
    }

    /// The session the socket serves.
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// The socket's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The private (0700) directory the socket is in, removed with it.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}

impl Drop for HookSocket {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The hooks of one lease: the dedicated socket their `j` uses, and each hook's run.
pub struct LeaseHookRun {
    hooks: Arc<LeaseHooks>,
    session: Arc<Session>,
    env: HookEnv,
    _socket: HookSocket,
    before_done: watch::Sender<bool>,
    after: OnceCell<Verdict>,
    skip_after: std::sync::atomic::AtomicBool,
    lease_ended: std::sync::atomic::AtomicBool,
    exiting: std::sync::atomic::AtomicBool,
}

impl LeaseHookRun {
    /// Prepares the hooks of lease `lease_name` (held by `client_name`) over `session`:
    /// serves the same drivers (`tree`) on a private Unix socket for the hooks' `j`.
    pub fn start(
        hooks: Arc<LeaseHooks>,
        tree: DriverNode,
        session: Arc<Session>,
        lease_name: &str,
        client_name: &str,
    ) -> Result<Arc<Self>, HookSocketError> {
        // A session of its own over the same driver instances: always ready for the hook,
        // whatever the clients' session says.
        let socket = HookSocket::start(tree, session.labels().clone())?;
        Ok(Arc::new(Self {
            hooks,
            session,
            env: HookEnv {
                lease_name: lease_name.to_string(),
                client_name: client_name.to_string(),
                socket: socket.path().to_path_buf(),
                motd_file: None,
            },
            _socket: socket,
            before_done: watch::channel(false).0,
            after: OnceCell::new(),
            skip_after: std::sync::atomic::AtomicBool::new(false),
            lease_ended: std::sync::atomic::AtomicBool::new(false),
            exiting: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// Whether a beforeLease hook is configured (clients must wait for it).
    pub fn has_before(&self) -> bool {
        self.hooks.before.is_some()
    }

    /// The lease ended (the controller says so): a beforeLease hook still running finishes,
    /// but `LEASE_READY` is no longer reported after it.
    pub fn mark_lease_ended(&self) {
        self.lease_ended
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether a hook failed with `onFailure: exit`.
    pub fn exiting(&self) -> bool {
        self.exiting.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn set(&self, sink: &dyn StatusSink, status: ExporterStatus, message: &str) {
        self.session.set_status(status, Some(message.to_string()));
        sink.report(status, message).await;
    }

    /// Reports `kind` running (`status` is the message upstream shows), logs it and runs
    /// `spec` to its end.
    async fn run_hook(
        &self,
        sink: &dyn StatusSink,
        kind: HookKind,
        spec: &HookSpec,
        status: &str,
        name: &str,
    ) -> process::Outcome {
        self.set(sink, kind.running(), status).await;
        tracing::info!("Executing {name} hook for lease {}", self.env.lease_name);
        // A beforeLease hook may add to the message of the day through `$JMP_MOTD_FILE`
        // (upstream main): an empty file in the hook's private directory, read once the
        // hook is over, whatever its outcome.
        let motd_file = (kind == HookKind::BeforeLease)
            .then(|| self._socket.dir().join("motd"))
            .filter(|p| match std::fs::File::create(p) {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(
                        "no $JMP_MOTD_FILE for the hook: {}: {e}",
                        p.display(),
                        e = jumpstarter_core::error_chain(&e)
                    );
                    false
                }
            });
        let env = HookEnv {
            motd_file: motd_file.clone(),
            ..self.env.clone()
        };
        let outcome = process::run(spec, process::OutputTo::hook(kind, &self.session), &env).await;
        if let Some(path) = motd_file {
            if let Some(text) = process::read_motd_file(&path) {
                self.session.append_motd(&text);
            }
            let _ = std::fs::remove_file(&path);
        }
        outcome
    }

    fn log(&self, kind: HookKind, severity: &str, message: String) {
        self.session
            .hook_log(kind.log_source(), severity, message.clone());
        match severity {
            "ERROR" => tracing::error!("{} hook: {message}", kind.key()),
            _ => tracing::warn!("{} hook: {message}", kind.key()),
        }
    }

    /// Runs the beforeLease hook (if any) and reports the statuses around it; ends in
    /// `LEASE_READY` unless the hook failed with `endLease` / `exit`.
    pub async fn before_lease(&self, sink: &dyn StatusSink) -> Verdict {
        let verdict = self.before_lease_inner(sink).await;
        self.before_done.send_replace(true);
        verdict
    }

    async fn before_lease_inner(&self, sink: &dyn StatusSink) -> Verdict {
        let kind = HookKind::BeforeLease;
        let Some(spec) = self.hooks.before.clone() else {
            self.set(sink, ExporterStatus::LeaseReady, "Ready for commands")
                .await;
            return Verdict::Proceed;
        };
        self.session.block_driver_calls(true);
        let outcome = self
            .run_hook(
                sink,
                kind,
                &spec,
                "Running beforeLease hook",
                "before-lease",
            )
            .await;
        self.session.block_driver_calls(false);
        sink.hook_outcome(kind, &outcome).await;
        let result = outcome.result;
        let ended = self.lease_ended.load(std::sync::atomic::Ordering::SeqCst);
        let msg = match result {
            Ok(()) if ended => {
                tracing::info!(
                    "Lease {} ended during beforeLease hook, skipping LEASE_READY transition",
                    self.env.lease_name
                );
                return Verdict::Proceed;
            }
            Ok(()) => {
                self.set(sink, ExporterStatus::LeaseReady, "Ready for commands")
                    .await;
                return Verdict::Proceed;
            }
            Err(msg) => msg,
        };
        match spec.on_failure {
            OnFailure::Warn if ended => {
                self.log(
                    kind,
                    "WARNING",
                    format!("{msg} (on_failure=warn, continuing)"),
                );
                Verdict::Proceed
            }
            OnFailure::Warn => {
                self.log(
                    kind,
                    "WARNING",
                    format!("{msg} (on_failure=warn, continuing)"),
                );
                let status = format!("{HOOK_WARNING_PREFIX}beforeLease hook warning: {msg}");
                self.set(sink, ExporterStatus::LeaseReady, &status).await;
                Verdict::Proceed
            }
            OnFailure::EndLease => {
                self.log(kind, "ERROR", format!("{msg} (on_failure=endLease)"));
                self.skip_after();
                let status = format!("beforeLease hook failed (on_failure=endLease): {msg}");
                self.set(sink, kind.failed(), &status).await;
                Verdict::EndLease
            }
            OnFailure::Exit => {
                self.log(kind, "ERROR", format!("{msg} (on_failure=exit)"));
                self.skip_after();
                self.exiting
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                let status =
                    format!("beforeLease hook failed (on_failure=exit, shutting down): {msg}");
                self.set(sink, kind.failed(), &status).await;
                sink.report(
                    ExporterStatus::Offline,
                    "Exporter shutting down due to beforeLease hook failure",
                )
                .await;
                Verdict::Exit
            }
        }
    }

    /// The afterLease hook will not run (the beforeLease hook failed with `endLease`/`exit`).
    pub fn skip_after(&self) {
        self.skip_after
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Runs the afterLease hook once (later calls wait for the first one's verdict), after
    /// a beforeLease hook still running has ended; ends in `AVAILABLE` unless the hook failed
    /// with `endLease` / `exit`.
    pub async fn after_lease(&self, sink: &dyn StatusSink) -> Verdict {
        *self
            .after
            .get_or_init(|| async {
                // The beforeLease hook finishes first (bounded, as upstream: its timeout
                // plus 30 s).
                let bound = self
                    .hooks
                    .before
                    .as_ref()
                    .map(|b| b.timeout + Duration::from_secs(30))
                    .unwrap_or(Duration::from_secs(15));
                let mut done = self.before_done.subscribe();
                let _ = tokio::time::timeout(bound, done.wait_for(|d| *d)).await;
                self.after_lease_inner(sink).await
            })
            .await
    }

    async fn after_lease_inner(&self, sink: &dyn StatusSink) -> Verdict {
        let kind = HookKind::AfterLease;
        let skip = self.skip_after.load(std::sync::atomic::Ordering::SeqCst);
        let spec = match self.hooks.after.clone() {
            Some(spec) if !skip => spec,
            _ => {
                if skip {
                    tracing::info!("Skipping afterLease hook: beforeLease hook failed");
                }
                // An exporter shutting down does not say AVAILABLE first.
                if !self.exiting() {
                    self.set(sink, ExporterStatus::Available, "Available for new lease")
                        .await;
                }
                return Verdict::Proceed;
            }
        };
        let outcome = self
            .run_hook(sink, kind, &spec, "Running afterLease hooks", "after-lease")
            .await;
        sink.hook_outcome(kind, &outcome).await;
        let msg = match outcome.result {
            Ok(()) => {
                self.set(sink, ExporterStatus::Available, "Available for new lease")
                    .await;
                return Verdict::Proceed;
            }
            Err(msg) => msg,
        };
        match spec.on_failure {
            OnFailure::Warn => {
                self.log(
                    kind,
                    "WARNING",
                    format!("{msg} (on_failure=warn, continuing)"),
                );
                let status = format!("{HOOK_WARNING_PREFIX}afterLease hook warning: {msg}");
                self.set(sink, ExporterStatus::Available, &status).await;
                Verdict::Proceed
            }
            OnFailure::EndLease => {
                self.log(kind, "ERROR", format!("{msg} (on_failure=endLease)"));
                let status = format!("afterLease hook failed (on_failure=endLease): {msg}");
                self.set(sink, kind.failed(), &status).await;
                Verdict::EndLease
            }
            OnFailure::Exit => {
                self.log(kind, "ERROR", format!("{msg} (on_failure=exit)"));
                self.exiting
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                let status =
                    format!("afterLease hook failed (on_failure=exit, shutting down): {msg}");
                self.set(sink, kind.failed(), &status).await;
                sink.report(
                    ExporterStatus::Offline,
                    "Exporter shutting down due to afterLease hook failure",
                )
                .await;
                Verdict::Exit
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_hook_dirs_of_dead_processes_are_swept_and_others_kept() {
        let base = tempfile::tempdir().unwrap();
        let dead = base.path().join("jumpstarter-hook-4294967294-abc");
        let live = base
            .path()
            .join(format!("jumpstarter-hook-{}-def", std::process::id()));
        let old = base.path().join("jumpstarter-hook-0123456789abcdef");
        let other = base.path().join("something-4294967294-x");
        for d in [&dead, &live, &old, &other] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(dead.join("sock"), b"").unwrap();
        sweep_stale_hook_dirs_in(base.path());
        assert!(!dead.exists());
        assert!(live.exists() && old.exists() && other.exists());
    }
}
