//! `jmp shell` around the exporter's lease hooks, as upstream 0.9.0's: print the hooks'
//! output (and, with `--exporter-logs`, every exporter log record) while the shell lives,
//! wait for `LEASE_READY` before the command starts, and after it `EndSession` and wait for
//! the afterLease hook.
//!
//! Also `jmp run --tls-grpc-listener` (standalone) with hooks: the beforeLease hook runs once
//! at start, the afterLease hook at shutdown, as upstream.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow};
use jumpstarter_core::{
    DriverNode, Session,
    client::SessionChannel,
    config::ExporterConfig,
    hooks::wait::{self, Ended, HOOK_WAIT, Ready},
};
use jumpstarter_proto::v1::{LogSource, exporter_service_client::ExporterServiceClient};
use tokio::task::JoinHandle;

use crate::hooks::{
    LeaseHooks,
    lifecycle::{LeaseHookRun, NoController, Verdict},
};

/// How often the log follower (re)opens `LogStream`, as upstream.
const LOG_STREAM_ATTEMPTS: u32 = 10;
/// How long the last log records get to arrive once the afterLease hook is over.
const LOG_DRAIN: Duration = Duration::from_millis(300);
/// The follower stops once no record has come for this long.
const LOG_QUIET: Duration = Duration::from_millis(50);

/// The label of a log record's source.
fn source_label(source: Option<i32>) -> (&'static str, bool) {
    match source.and_then(|s| LogSource::try_from(s).ok()) {
        Some(LogSource::BeforeLeaseHook) => ("beforeLease", true),
        Some(LogSource::AfterLeaseHook) => ("afterLease", true),
        Some(LogSource::Driver) => ("driver", false),
        _ => ("exporter", false),
    }
}

/// Prints the exporter's log records on stderr until aborted: hook output always, the rest
/// only when `all` (`--exporter-logs`).
pub fn follow_logs(channel: SessionChannel, all: bool) -> LogFollower {
    let started = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let seen = last.clone();
    let task = tokio::spawn(async move {
        for _ in 0..LOG_STREAM_ATTEMPTS {
            match ExporterServiceClient::new(channel.clone())
                .log_stream(())
                .await
            {
                Ok(response) => {
                    let mut records = response.into_inner();
                    while let Ok(Some(r)) = records.message().await {
                        let at = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                        seen.store(at.max(1), Ordering::Relaxed);
                        let (label, hook) = source_label(r.source);
                        if hook || all {
                            if hook && r.severity == "INFO" {
                                eprintln!("[{label}] {}", r.message);
                            } else {
                                eprintln!("[{label}] {} {}", r.severity, r.message);
                            }
                        }
                    }
                }
                Err(status) if status.code() == tonic::Code::Unimplemented => return,
                Err(status) => tracing::debug!("exporter LogStream: {}", status.message()),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    LogFollower {
        task,
        started,
        last,
    }
}

/// The log follower of one session (see [`follow_logs`]).
pub struct LogFollower {
    task: JoinHandle<()>,
    started: Instant,
    /// When the last record arrived, in milliseconds since `started` (0: none yet).
    last: Arc<AtomicU64>,
}

impl LogFollower {
    /// How long the stream has been quiet.
    fn quiet_for(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }
}

/// Waits for `LEASE_READY` before the command starts. `Ok(None)`: go on; `Ok(Some(code))`:
/// leave with `code` (the lease ended during the hook: a clean end, as upstream); `Err`:
/// the beforeLease hook failed (`endLease` / `exit`), its status message as the reason.
pub async fn before_command(channel: SessionChannel) -> Result<Option<i32>> {
    match wait::wait_ready(channel, HOOK_WAIT).await {
        Ready::Ready { warning } => {
            if let Some(w) = warning {
                eprintln!("Warning: {w}");
            }
            Ok(None)
        }
        Ready::Failed(reason) => Err(anyhow!(reason)),
        Ready::LeaseEnded => {
            eprintln!("Lease ended while waiting for the beforeLease hook to complete");
            Ok(Some(0))
        }
    }
}

/// After the command: `EndSession` and wait for the afterLease hook (its output is printed
/// by the log follower meanwhile). `Err`: the afterLease hook failed (`endLease`/`exit`).
pub async fn after_command(channel: SessionChannel) -> Result<()> {
    match wait::end_session(channel, HOOK_WAIT).await {
        Ended::Done { warning } => {
            if let Some(w) = warning {
                eprintln!("Warning: {w}");
            }
        }
        Ended::Failed(reason) => return Err(anyhow!(reason)),
        Ended::TimedOut => eprintln!("Warning: timeout waiting for afterLease hook to complete"),
        Ended::Unsupported | Ended::LeaseEnded => {}
    }
    Ok(())
}

/// Stops the log follower after letting the last records arrive: once the stream has been
/// quiet for [`LOG_QUIET`], at most [`LOG_DRAIN`] after the call. (A fixed drain added
/// 300 ms to every `jmp shell`, hooks or not.)
pub async fn stop_logs(logs: LogFollower) {
    let deadline = Instant::now() + LOG_DRAIN;
    loop {
        let quiet = logs.quiet_for();
        let now = Instant::now();
        if quiet >= LOG_QUIET || now >= deadline {
            break;
        }
        tokio::time::sleep((LOG_QUIET - quiet).min(deadline - now)).await;
    }
    logs.task.abort();
}

/// The hooks of a standalone exporter (`jmp run --tls-grpc-listener`).
pub struct Standalone {
    run: Arc<LeaseHookRun>,
    exit: tokio::sync::watch::Receiver<bool>,
}

/// The session of a standalone exporter, and its hooks when the config has some: the
/// beforeLease hook starts at once (clients may connect; their driver calls wait for it).
pub fn standalone(
    cfg: &ExporterConfig,
    tree: DriverNode,
) -> Result<(Arc<Session>, Option<Standalone>)> {
    let hooks = LeaseHooks::from_config(&cfg.hooks).map_err(|e| {
        let path = cfg
            .path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "exporter config".into());
        anyhow!("{path}: {e}")
    })?;
    let Some(hooks) = hooks else {
        return Ok((Session::new_ready(tree, Default::default()), None));
    };
    // Hook sockets of an earlier run killed with SIGKILL.
    crate::hooks::lifecycle::sweep_stale_hook_dirs();
    let session = Session::new(tree.clone(), Default::default());
    if hooks.before.is_some() {
        session.block_driver_calls(true);
    }
    let run = LeaseHookRun::start(
        Arc::new(hooks),
        tree,
        Arc::clone(&session),
        "standalone",
        "",
    )?;
    let (tx, exit) = tokio::sync::watch::channel(false);
    let before = Arc::clone(&run);
    tokio::spawn(async move {
        if before.before_lease(&NoController).await == Verdict::Exit {
            let _ = tx.send(true);
        }
    });
    Ok((session, Some(Standalone { run, exit })))
}

impl Standalone {
    /// Resolves when a hook failed with `onFailure: exit`.
    pub async fn exit_requested(&mut self) {
        if self.exit.wait_for(|e| *e).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// At shutdown: the afterLease hook (unless the beforeLease hook failed with
    /// `endLease`/`exit`). Returns whether the exporter must exit with code 1.
    pub async fn finish(&self) -> bool {
        let verdict = self.run.after_lease(&NoController).await;
        verdict == Verdict::Exit || self.run.exiting()
    }
}
