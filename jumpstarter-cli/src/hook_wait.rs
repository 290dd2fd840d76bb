//! `jmp shell` around the exporter's lease hooks, as upstream 0.9.0's: print the hooks'
//! output (and, with `--exporter-logs`, every exporter log record) while the shell lives,
//! wait for `LEASE_READY` before the command starts, and after it `EndSession` and wait for
//! the afterLease hook.
//!
//! The exporter side of hooks (running them around a lease) is in `jumpstarter-exporter`.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow};
use jumpstarter_core::{
    client::SessionChannel,
    hooks::wait::{self, Ended, HOOK_WAIT, Ready},
    server::LOG_BACKLOG_HEADER,
};
use jumpstarter_proto::v1::{LogSource, exporter_service_client::ExporterServiceClient};
use tokio::task::JoinHandle;

/// How often the log follower (re)opens `LogStream`, as upstream.
const LOG_STREAM_ATTEMPTS: u32 = 10;
/// How long the last log records get to arrive once the afterLease hook is over.
const LOG_DRAIN: Duration = Duration::from_millis(300);
/// The follower stops once no record has come for this long.
const LOG_QUIET: Duration = Duration::from_millis(50);
/// How long the log stream gets to open, and deliver what the exporter held for it, once
/// the session is over.
const OPEN_DRAIN: Duration = Duration::from_secs(2);
/// How long the record of a hook's failure gets to arrive once its status said so.
const FAILURE_DRAIN: Duration = Duration::from_secs(3);

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
    let failure = Arc::new(AtomicBool::new(false));
    let failure_seen = failure.clone();
    // Records still to come before the follower has what the exporter held when the
    // stream opened; `u64::MAX` until it opened.
    let pending = Arc::new(AtomicU64::new(u64::MAX));
    let pending_left = pending.clone();
    let task = tokio::spawn(async move {
        for _ in 0..LOG_STREAM_ATTEMPTS {
            match ExporterServiceClient::new(channel.clone())
                .log_stream(())
                .await
            {
                Ok(response) => {
                    let held = response
                        .metadata()
                        .get(LOG_BACKLOG_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0);
                    pending_left.store(held, Ordering::Relaxed);
                    let mut records = response.into_inner();
                    while let Ok(Some(r)) = records.message().await {
                        let _ =
                            pending_left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                                n.checked_sub(1)
                            });
                        let (label, hook) = source_label(r.source);
                        if hook || all {
                            // Only what is printed counts for the drain: the backlog the
                            // stream starts with (the lease's start, the exporter's own
                            // lines) would otherwise hold every exit for LOG_QUIET.
                            let at =
                                u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                            seen.store(at.max(1), Ordering::Relaxed);
                            if hook && r.severity == "ERROR" {
                                failure_seen.store(true, Ordering::Relaxed);
                            }
                            if hook && r.severity == "INFO" {
                                eprintln!("[{label}] {}", r.message);
                            } else {
                                eprintln!("[{label}] {} {}", r.severity, r.message);
                            }
                        }
                    }
                    // Cut off (the lease or the connection gone): nothing more to wait for.
                    pending_left.store(0, Ordering::Relaxed);
                }
                Err(status) if status.code() == tonic::Code::Unimplemented => return,
                Err(status) => {
                    // No stream: a later attempt may open one, but the end of the session
                    // does not wait for it.
                    pending_left.store(0, Ordering::Relaxed);
                    tracing::debug!("exporter LogStream: {}", status.message());
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    LogFollower {
        task,
        started,
        last,
        failure,
        pending,
    }
}

/// The log follower of one session (see [`follow_logs`]).
pub struct LogFollower {
    task: JoinHandle<()>,
    started: Instant,
    /// When the last printed record arrived, in milliseconds since `started` (0: none
    /// yet).
    last: Arc<AtomicU64>,
    /// Whether a hook's ERROR record (its failure, logged before its status) was printed.
    failure: Arc<AtomicBool>,
    /// How many of the records held for this client (the exporter's
    /// [`LOG_BACKLOG_HEADER`]) have not arrived yet; `u64::MAX` until the stream opened.
    pending: Arc<AtomicU64>,
}

impl LogFollower {
    /// How long since the last printed record; [`Duration::MAX`] when none was printed: a
    /// session without hook output (and without `--exporter-logs`) has nothing to drain. The
    /// records of an afterLease hook come before its end's status, on the same connection.
    fn quiet_for(&self) -> Duration {
        match self.last.load(Ordering::Relaxed) {
            0 => Duration::MAX,
            last => self
                .started
                .elapsed()
                .saturating_sub(Duration::from_millis(last)),
        }
    }
}

/// Waits for `LEASE_READY` before the command starts. `Ok(None)`: go on; `Ok(Some(code))`:
/// leave with `code`, the command not run (the lease ended during the hook); `Err`: the
/// beforeLease hook failed (`endLease` / `exit`), its status message as the reason, or the
/// exporter could not be reached for the whole wait.
///
/// A status poll that fails does not end the wait while the lease goes on (`lease_over`
/// says when it has ended): the exporter may be restarting, the router or the controller
/// away for a while. When the connection went away, `refusal` says whether the controller
/// refused to connect us for good meanwhile (the hook failed and the exporter is ending the
/// lease, faster than a status poll saw it): that refusal is then the error.
pub async fn before_command<F, Fut>(
    channel: SessionChannel,
    lease_over: F,
    refusal: impl FnOnce() -> Option<String>,
) -> Result<Option<i32>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    on_ready(
        wait::wait_ready_or(channel, HOOK_WAIT, lease_over).await,
        refusal,
    )
}

/// What [`before_command`] does with the end of the wait (also for a wait done by
/// [`jumpstarter_core::LeaseSession::wait_ready_on`]).
pub fn on_ready(ready: Ready, refusal: impl FnOnce() -> Option<String>) -> Result<Option<i32>> {
    match ready {
        Ready::Ready { warning } => {
            if let Some(w) = warning {
                eprintln!("Warning: {w}");
            }
            Ok(None)
        }
        Ready::Failed(reason) => Err(anyhow!(reason)),
        Ready::LeaseEnded => match refusal() {
            Some(refusal) => Err(anyhow!(refusal)),
            None => {
                // Upstream exits 0 here; a script must not take a command that never ran
                // for one that passed.
                eprintln!(
                    "Lease ended while waiting for the beforeLease hook to complete; the \
                     command did not run (exit code {})",
                    crate::lease_end::LEASE_ENDED_EXIT_CODE
                );
                Ok(Some(crate::lease_end::LEASE_ENDED_EXIT_CODE))
            }
        },
    }
}

/// After the command, once `EndSession` was sent and the afterLease hook waited for
/// ([`jumpstarter_core::LeaseSession::end_session_on`]; its output is printed by the log
/// follower meanwhile): says how it went. `Err`: the afterLease hook failed
/// (`endLease`/`exit`).
pub fn on_ended(ended: Ended) -> Result<()> {
    match ended {
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

/// Stops the log follower after letting the last records arrive: once no record to print
/// has come for [`LOG_QUIET`], at most [`LOG_DRAIN`] after the call. (A fixed drain added
/// 300 ms to every `jmp shell`, hooks or not; counting records that are not printed held
/// every exit for [`LOG_QUIET`] after the stream's backlog.)
///
/// With `hook_failed` (a hook's status said it failed), first waits (at most
/// [`FAILURE_DRAIN`]) for the hook's ERROR record: the exporter logs it, after the hook's
/// output, before it sets the failed status, but the log stream may not have delivered it
/// (or even opened) by the time the status poll saw the failure; the user must see the
/// hook's output that explains the failure.
pub async fn stop_logs(logs: LogFollower, hook_failed: bool) {
    // The stream open, with what the exporter held for us (hook output of a hook that ran
    // before the stream opened): a quick command can end before either arrived.
    let deadline = Instant::now() + OPEN_DRAIN;
    while logs.pending.load(Ordering::Relaxed) != 0
        && !logs.task.is_finished()
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    if hook_failed {
        let deadline = Instant::now() + FAILURE_DRAIN;
        while !logs.failure.load(Ordering::Relaxed)
            && !logs.task.is_finished()
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
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
