//! The server-side guard against queue slots held by nobody: a lease still waiting for an
//! exporter whose client has not been heard from (no authenticated call at all) for a
//! bounded time is ended, with a condition saying so. A `jmp shell` killed while queued
//! (SIGKILL, a crash, a lost machine) thereby gives its place back instead of being granted
//! an exporter nobody uses.
//!
//! "Heard from" is kept in memory: after a controller restart every client gets the whole
//! timeout again. A lease that waits for its `beginTime` is not affected (its client may
//! well be away until then).

use std::{collections::HashMap, sync::Mutex, time::Duration};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

use crate::{
    lease::scheduler::{Action, LeaseDecision},
    objects::{Lease, conditions as c, lease_labels_with, set_condition},
};

/// The condition reason of a lease ended by this guard.
pub const REASON_CLIENT_GONE: &str = "ClientGone";

/// The default bound (`--pending-lease-client-timeout`): generous next to a waiting client's
/// polling (every few seconds), short next to the 30 minutes a granted-to-nobody lease
/// wastes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// When each client was last heard from (any authenticated call), since `started`.
#[derive(Debug)]
pub struct ClientActivity {
    started: Timestamp,
    seen: Mutex<HashMap<(String, String), Timestamp>>,
}

impl Default for ClientActivity {
    fn default() -> Self {
        Self {
            started: Timestamp::now(),
            seen: Mutex::default(),
        }
    }
}

impl ClientActivity {
    /// Records a call of client `namespace/name` now.
    pub fn note(&self, namespace: &str, name: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((namespace.to_string(), name.to_string()), Timestamp::now());
    }

    /// When client `namespace/name` was last heard from, or when this controller started
    /// if not since.
    pub fn last_heard(&self, namespace: &str, name: &str) -> Timestamp {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(namespace.to_string(), name.to_string()))
            .copied()
            .unwrap_or(self.started)
    }
}

/// Ends, in `decisions`, every waiting lease whose client was last heard from (per
/// `last_heard`, never earlier than the lease's creation) more than `timeout` before `now`.
/// Returns how many were ended.
pub fn end_abandoned(
    decisions: &mut [LeaseDecision],
    leases: &[Lease],
    last_heard: impl Fn(&str, &str) -> Timestamp,
    timeout: Duration,
    now: Timestamp,
) -> usize {
    let Ok(timeout) = SignedDuration::try_from(timeout) else {
        return 0;
    };
    let mut ended = 0;
    for d in decisions.iter_mut() {
        if !matches!(d.action, Action::Waiting { .. }) {
            continue;
        }
        let Some(lease) = leases.iter().find(|l| {
            l.metadata.namespace.as_deref() == Some(d.namespace.as_str())
                && l.metadata.name.as_deref() == Some(d.name.as_str())
        }) else {
            continue;
        };
        let client = &lease.spec.client_ref.name;
        let mut heard = last_heard(&d.namespace, client);
        if let Some(created) = &lease.metadata.creation_timestamp {
            heard = heard.max(created.0);
        }
        if now.duration_since(heard) <= timeout {
            continue;
        }
        let message = format!(
            "The lease was ended while waiting for an exporter: its client {client} has not \
             been heard from for {}s (the limit is {}s)",
            now.duration_since(heard).as_secs(),
            timeout.as_secs()
        );
        for type_ in [c::PENDING, c::READY] {
            set_condition(
                &mut d.status.conditions,
                type_,
                false,
                REASON_CLIENT_GONE,
                &message,
                lease.metadata.generation,
                now,
            );
        }
        d.status.ended = true;
        d.status.end_time = Some(metav1::Time(now));
        d.action = Action::Ended {
            reason: REASON_CLIENT_GONE,
        };
        d.requeue_at = None;
        d.status_changed = true;
        d.labels = lease_labels_with(lease, true);
        d.labels_changed = d.labels != lease.metadata.labels.clone().unwrap_or_default();
        tracing::info!("lease {}/{}: {message}", d.namespace, d.name);
        ended += 1;
    }
    ended
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        lease::scheduler::{Snapshot, schedule},
        objects::{LeaseSpec, duration::GoDuration, find_condition, selector::LabelSelector},
    };
    use k8s_openapi::api::core::v1::LocalObjectReference;

    fn lease(name: &str, client: &str, created: Timestamp) -> Lease {
        let mut l = Lease::new(
            name,
            LeaseSpec {
                client_ref: LocalObjectReference {
                    name: client.into(),
                },
                duration: Some(GoDuration::from_secs(60)),
                selector: LabelSelector::parse("board=x").unwrap().to_k8s(),
                ..Default::default()
            },
        );
        l.metadata.namespace = Some("lab".into());
        l.metadata.creation_timestamp = Some(metav1::Time(created));
        l
    }

    #[test]
    fn a_waiting_lease_of_a_silent_client_ends_and_says_why() {
        let now: Timestamp = "2026-01-01T10:00:00Z".parse().unwrap();
        let ago = |s: i64| now.checked_sub(SignedDuration::from_secs(s)).unwrap();
        let exporter = {
            let mut e = crate::objects::Exporter::new("e", Default::default());
            e.metadata.namespace = Some("lab".into());
            e.metadata.labels = Some([("board".to_string(), "x".to_string())].into());
            e
        };
        let leases = vec![
            lease("gone", "silent", ago(600)),
            lease("alive", "polling", ago(600)),
            lease("young", "silent", ago(5)),
        ];
        let mut ds = schedule(&Snapshot {
            leases: &leases,
            exporters: std::slice::from_ref(&exporter),
            policies: &[],
            clients: &[],
            pools: &[],
            now,
        });
        assert!(
            ds.iter()
                .all(|d| matches!(d.action, Action::Waiting { .. })),
            "{ds:?}"
        );
        let heard = |_: &str, client: &str| {
            if client == "polling" {
                ago(1)
            } else {
                ago(3600)
            }
        };
        let n = end_abandoned(&mut ds, &leases, heard, Duration::from_secs(60), now);
        assert_eq!(n, 1);
        let gone = ds.iter().find(|d| d.name == "gone").unwrap();
        assert_eq!(
            gone.action,
            Action::Ended {
                reason: REASON_CLIENT_GONE
            }
        );
        assert!(gone.status.ended && gone.status_changed && gone.labels_changed);
        let cond = find_condition(&gone.status.conditions, c::READY).unwrap();
        assert_eq!(cond.reason, REASON_CLIENT_GONE);
        assert!(
            cond.message.contains("silent") && cond.message.contains("60s"),
            "{}",
            cond.message
        );
        for name in ["alive", "young"] {
            let d = ds.iter().find(|d| d.name == name).unwrap();
            assert!(matches!(d.action, Action::Waiting { .. }), "{name}: {d:?}");
        }
    }
}
