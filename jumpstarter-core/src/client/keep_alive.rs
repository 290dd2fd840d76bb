//! Keeping a lease alive while it is in use (`jmp shell --keep-alive`): as the lease's end
//! comes near, its duration is extended (`UpdateLease`, as `jmp update lease --duration`),
//! until the access policies refuse a longer lease (their `maximumDuration`).
//!
//! The extension is driven by the caller's future ([`keep_alive`]): when the process that
//! runs it stops (its command ended, it was killed, its machine went away), no extension
//! follows, and the lease ends at its then end time.

use std::time::{Duration, SystemTime};

use jumpstarter_proto::client_v1::Lease;
use tonic::Code;

use crate::client::{ControllerClient, LeaseUpdate, lease_error::LeaseError};

/// What [`keep_alive`] reports.
#[derive(Debug, Clone, PartialEq)]
pub enum KeepAliveEvent {
    /// The lease was extended; it now ends at `until`.
    Extended {
        /// The new end.
        until: SystemTime,
    },
    /// The controller refused a longer lease (the access policy's maximum): it ends at
    /// `until`; no further extension is tried.
    AtMaximum {
        /// The end the lease keeps.
        until: SystemTime,
        /// The controller's reason.
        reason: String,
    },
}

/// When and by how much a lease is extended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAlive {
    /// Each extension makes the lease end this long after the moment of extending.
    pub extend_by: Duration,
    /// Extend once the end is nearer than this.
    pub margin: Duration,
    /// Look at the lease this often.
    pub check_every: Duration,
}

impl KeepAlive {
    /// For a lease of `duration`: each extension gives it `duration` again from that moment,
    /// once its end is within half of `duration` (at least 1 s, at most 5 min ahead),
    /// looking about four times per margin (every 200 ms to 30 s).
    pub fn for_duration(duration: Duration) -> Self {
        let margin = (duration / 2).clamp(Duration::from_secs(1), Duration::from_secs(300));
        Self {
            extend_by: duration.max(margin * 2),
            margin,
            check_every: (margin / 4).clamp(Duration::from_millis(200), Duration::from_secs(30)),
        }
    }
}

fn system_time(t: &prost_types::Timestamp) -> Option<SystemTime> {
    SystemTime::try_from(*t).ok()
}

fn std_duration(d: &prost_types::Duration) -> Option<Duration> {
    Duration::try_from(*d).ok()
}

/// When a running lease began and when it is due to end; `None` until it has begun (or
/// when it has ended).
pub fn lease_window(l: &Lease) -> Option<(SystemTime, SystemTime)> {
    if l.effective_end_time.is_some() {
        return None;
    }
    let begin = system_time(l.effective_begin_time.as_ref()?)?;
    let end = match (&l.end_time, &l.duration) {
        (Some(end), _) => system_time(end)?,
        (None, Some(d)) => begin.checked_add(std_duration(d)?)?,
        (None, None) => return None,
    };
    Some((begin, end))
}

/// The duration to ask for so that a lease begun at `begin`, due to end at `end`, ends
/// `policy.extend_by` after `now`; `None` while its end is further than `policy.margin`.
pub fn extension(
    begin: SystemTime,
    end: SystemTime,
    now: SystemTime,
    policy: &KeepAlive,
) -> Option<Duration> {
    let left = end.duration_since(now).unwrap_or_default();
    if left > policy.margin {
        return None;
    }
    let since_begin = now.duration_since(begin).unwrap_or_default();
    Some(since_begin + policy.extend_by)
}

/// How many failed looks in a row end [`keep_alive`] with the last error.
const MAX_FAILURES: u32 = 3;

/// Extends lease `name` as `policy` says for as long as the returned future runs, telling
/// `on_event` of each extension. Returns when the lease has ended or the controller refuses
/// a longer one (after an [`KeepAliveEvent::AtMaximum`]); fails after `MAX_FAILURES` (3)
/// failed calls in a row. Drop the future to stop extending.
pub async fn keep_alive(
    controller: &ControllerClient,
    name: &str,
    policy: KeepAlive,
    mut on_event: impl FnMut(KeepAliveEvent) + Send,
) -> Result<(), LeaseError> {
    let mut failures = 0;
    loop {
        match step(controller, name, &policy, &mut on_event).await {
            Ok(true) => return Ok(()),
            Ok(false) => failures = 0,
            Err(e) => {
                failures += 1;
                if failures >= MAX_FAILURES {
                    return Err(e);
                }
            }
        }
        tokio::time::sleep(policy.check_every).await;
    }
}

/// One look at the lease, extending it if due; `Ok(true)`: nothing more to do.
async fn step(
    controller: &ControllerClient,
    name: &str,
    policy: &KeepAlive,
    on_event: &mut (impl FnMut(KeepAliveEvent) + Send),
) -> Result<bool, LeaseError> {
    let l = controller.get_lease(name).await?;
    if l.effective_end_time.is_some() {
        return Ok(true);
    }
    let Some((begin, end)) = lease_window(&l) else {
        // Not begun yet.
        return Ok(false);
    };
    let Some(duration) = extension(begin, end, SystemTime::now(), policy) else {
        return Ok(false);
    };
    let update = LeaseUpdate {
        duration: Some(duration),
        ..LeaseUpdate::default()
    };
    match controller.update_lease(name, &update).await {
        Ok(l) => {
            let until = lease_window(&l).map_or(end, |(_, e)| e);
            on_event(KeepAliveEvent::Extended { until });
            Ok(false)
        }
        Err(LeaseError::Rpc {
            code: Code::PermissionDenied,
            message,
            ..
        }) => {
            on_event(KeepAliveEvent::AtMaximum {
                until: end,
                reason: message,
            });
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn the_policy_follows_the_lease_duration() {
        let p = KeepAlive::for_duration(Duration::from_secs(3));
        assert_eq!(p.margin, Duration::from_millis(1500));
        assert_eq!(p.extend_by, Duration::from_secs(3));
        assert_eq!(p.check_every, Duration::from_millis(375));
        let p = KeepAlive::for_duration(Duration::from_secs(1));
        assert_eq!(p.margin, Duration::from_secs(1));
        assert_eq!(p.extend_by, Duration::from_secs(2));
        let p = KeepAlive::for_duration(Duration::from_secs(4 * 3600));
        assert_eq!(p.margin, Duration::from_secs(300));
        assert_eq!(p.check_every, Duration::from_secs(30));
    }

    #[test]
    fn extends_only_within_the_margin() {
        let p = KeepAlive::for_duration(Duration::from_secs(60));
        // Begun at 1000, due at 1060: at 1020 nothing to do; at 1040 (20 s left, margin
        // 30 s) the lease is asked to run 60 s from now, 100 s in all.
        assert_eq!(extension(at(1000), at(1060), at(1020), &p), None);
        assert_eq!(
            extension(at(1000), at(1060), at(1040), &p),
            Some(Duration::from_secs(100))
        );
        // Past its end (a late look): still from now.
        assert_eq!(
            extension(at(1000), at(1060), at(1070), &p),
            Some(Duration::from_secs(130))
        );
    }

    #[test]
    fn the_window_of_a_lease() {
        let ts = |s: i64| prost_types::Timestamp {
            seconds: s,
            nanos: 0,
        };
        let mut l = Lease {
            duration: Some(prost_types::Duration {
                seconds: 60,
                nanos: 0,
            }),
            ..Default::default()
        };
        assert_eq!(lease_window(&l), None, "not begun");
        l.effective_begin_time = Some(ts(1000));
        assert_eq!(lease_window(&l), Some((at(1000), at(1060))));
        l.end_time = Some(ts(1200));
        assert_eq!(lease_window(&l), Some((at(1000), at(1200))));
        l.effective_end_time = Some(ts(1100));
        assert_eq!(lease_window(&l), None, "ended");
    }
}
