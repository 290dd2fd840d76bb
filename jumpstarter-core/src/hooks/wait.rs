//! The client side of the lease lifecycle, as upstream 0.9.0's `jmp shell` does it: poll
//! `GetStatus` until the beforeLease hook is over (`LEASE_READY`, or a failure), and at the
//! end `EndSession`, then poll until the afterLease hook is over (`AVAILABLE`, or a failure).
//!
//! Exporters without `GetStatus` count as ready, and without `EndSession` as done, as
//! upstream's client treats them.

use std::time::Duration;

use jumpstarter_proto::v1::{
    EndSessionRequest, ExporterStatus, GetStatusRequest,
    exporter_service_client::ExporterServiceClient,
};
use tonic::Code;

use super::HOOK_WARNING_PREFIX;
use crate::client::SessionChannel;

/// How often the status is polled while waiting, as upstream, once a wait has lasted.
const POLL_INTERVAL: Duration = Duration::from_millis(300);
/// The first re-poll comes this soon: without hooks the exporter changes state within
/// milliseconds, and a fixed 300 ms poll added up to 600 ms to every `jmp shell`.
const FIRST_POLL: Duration = Duration::from_millis(5);

/// The next interval after `current`: doubled, at most [`POLL_INTERVAL`].
fn next_poll(current: Duration) -> Duration {
    (current * 2).min(POLL_INTERVAL)
}
/// How long one `GetStatus` may take before the connection counts as lost.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a hook may keep the client waiting, as upstream.
pub const HOOK_WAIT: Duration = Duration::from_secs(300);

/// How the wait for `LEASE_READY` ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Ready {
    /// Ready for commands; `warning` after a beforeLease hook that failed with `warn`.
    Ready {
        /// The hook warning (without its prefix).
        warning: Option<String>,
    },
    /// The beforeLease hook failed (`endLease` / `exit`): the status message.
    Failed(String),
    /// The connection went away while waiting and the lease has ended (during the hook).
    LeaseEnded,
}

/// How the session ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    /// The afterLease hook (if any) is over; `warning` after a failure with `warn`.
    Done {
        /// The hook warning (without its prefix).
        warning: Option<String>,
    },
    /// The afterLease hook failed (`endLease` / `exit`): the status message.
    Failed(String),
    /// The exporter has no `EndSession` (or no lease context): nothing to wait for.
    Unsupported,
    /// The connection went away (the lease ended).
    LeaseEnded,
    /// The hook did not end within [`HOOK_WAIT`].
    TimedOut,
}

enum Poll {
    Status(ExporterStatus, String),
    Unimplemented,
    Lost,
}

async fn poll(client: &mut ExporterServiceClient<SessionChannel>) -> Poll {
    match tokio::time::timeout(CALL_TIMEOUT, client.get_status(GetStatusRequest {})).await {
        Ok(Ok(r)) => {
            let r = r.into_inner();
            let status = ExporterStatus::try_from(r.status).unwrap_or(ExporterStatus::Unspecified);
            Poll::Status(status, r.message.unwrap_or_default())
        }
        Ok(Err(s)) if s.code() == Code::Unimplemented => Poll::Unimplemented,
        Ok(Err(s)) => {
            tracing::debug!("GetStatus: {}", s.message());
            Poll::Lost
        }
        Err(_) => Poll::Lost,
    }
}

fn warning(message: &str) -> Option<String> {
    message.strip_prefix(HOOK_WARNING_PREFIX).map(String::from)
}

/// Waits until the exporter is ready for commands (at most `limit`), taking a status poll
/// that fails for the end of the lease (as upstream 0.9.0's client does). Prefer
/// [`wait_ready_or`] where the lease's state can be asked for.
pub async fn wait_ready(channel: SessionChannel, limit: Duration) -> Ready {
    wait_ready_or(channel, limit, || std::future::ready(true)).await
}

/// How often a lost exporter is polled again while the lease goes on.
const LOST_POLL: Duration = Duration::from_secs(1);

/// Waits until the exporter is ready for commands (at most `limit`). A status poll that
/// fails (the exporter restarting, a router or the controller away for a while) is not the
/// end of the wait: `lease_over` says whether the lease has ended; until it says so, the
/// polls go on, and a wait that runs out says the exporter could not be reached.
pub async fn wait_ready_or<F, Fut>(
    channel: SessionChannel,
    limit: Duration,
    mut lease_over: F,
) -> Ready
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut client = ExporterServiceClient::new(channel);
    let deadline = tokio::time::Instant::now() + limit;
    let mut last = String::new();
    let mut hook_seen = false;
    let mut interval = FIRST_POLL;
    loop {
        let mut lost = false;
        match poll(&mut client).await {
            Poll::Unimplemented => return Ready::Ready { warning: None },
            Poll::Lost => {
                if lease_over().await {
                    return Ready::LeaseEnded;
                }
                lost = true;
                last = "the exporter could not be reached".into();
            }
            Poll::Status(ExporterStatus::LeaseReady, msg) => {
                return Ready::Ready {
                    warning: warning(&msg),
                };
            }
            Poll::Status(ExporterStatus::BeforeLeaseHookFailed, msg) => {
                return Ready::Failed(if msg.is_empty() {
                    "beforeLease hook failed".into()
                } else {
                    msg
                });
            }
            // An upstream exporter shutting down after a failed hook (`exit`) says OFFLINE.
            Poll::Status(ExporterStatus::Offline, msg) if hook_seen => {
                return Ready::Failed(if msg.is_empty() { last } else { msg });
            }
            Poll::Status(status, msg) => {
                hook_seen |= status == ExporterStatus::BeforeLeaseHook;
                last = msg;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Ready::Failed(if last.is_empty() {
                "Timeout waiting for beforeLease hook".into()
            } else {
                format!("Timeout waiting for beforeLease hook ({last})")
            });
        }
        if lost {
            tokio::time::sleep(LOST_POLL.min(deadline - tokio::time::Instant::now())).await;
        } else {
            tokio::time::sleep(interval).await;
            interval = next_poll(interval);
        }
    }
}

/// Ends the session (`EndSession`) and waits until the afterLease hook is over (at most
/// `limit`).
pub async fn end_session(channel: SessionChannel, limit: Duration) -> Ended {
    let mut client = ExporterServiceClient::new(channel);
    let r = tokio::time::timeout(CALL_TIMEOUT, client.end_session(EndSessionRequest {})).await;
    match r {
        Ok(Ok(r)) if r.get_ref().success => {}
        Ok(Ok(_)) => return Ended::Unsupported,
        Ok(Err(s)) if s.code() == Code::Unimplemented => return Ended::Unsupported,
        Ok(Err(_)) | Err(_) => return Ended::LeaseEnded,
    }
    let deadline = tokio::time::Instant::now() + limit;
    let mut interval = FIRST_POLL;
    loop {
        match poll(&mut client).await {
            Poll::Unimplemented => return Ended::Unsupported,
            Poll::Lost => return Ended::LeaseEnded,
            Poll::Status(ExporterStatus::Available, msg) => {
                return Ended::Done {
                    warning: warning(&msg),
                };
            }
            Poll::Status(ExporterStatus::AfterLeaseHookFailed, msg) => {
                return Ended::Failed(if msg.is_empty() {
                    "afterLease hook failed".into()
                } else {
                    msg
                });
            }
            Poll::Status(_, _) => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Ended::TimedOut;
        }
        tokio::time::sleep(interval).await;
        interval = next_poll(interval);
    }
}
