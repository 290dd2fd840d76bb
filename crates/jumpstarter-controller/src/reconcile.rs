//! The reconcile loop: reads the objects, runs the [`crate::scheduler`], writes what changed
//! (lease statuses and labels, exporters' `leaseRef` and `Online` condition), and sleeps until
//! the next deadline or until a service pokes [`ControllerState::wake`].

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::LocalObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

use crate::{
    objects::{
        Client, Exporter, ExporterAccessPolicy, ExporterStatusValue, Lease, conditions,
        exporter_online_state, set_condition,
    },
    scheduler::{Snapshot, exporter_lease_refs, schedule},
    selector::LabelSelector,
    state::ControllerState,
    store::{ListParams, Store, StoreError},
};

/// The longest the loop sleeps (exporter liveness is re-evaluated at least this often).
const MAX_SLEEP: Duration = Duration::from_secs(5);

async fn list_all<S: Store, K: crate::store::StoreObject>(store: &S) -> Result<Vec<K>, StoreError> {
    Ok(store
        .list::<K>(None, &LabelSelector::everything(), &ListParams::default())
        .await?
        .items)
}

/// One pass; returns the earliest time something must be looked at again.
pub async fn reconcile_once<S: Store>(
    state: &ControllerState<S>,
) -> Result<Option<Timestamp>, StoreError> {
    let store = &state.store;
    let leases: Vec<Lease> = list_all(store).await?;
    let exporters: Vec<Exporter> = list_all(store).await?;
    let policies: Vec<ExporterAccessPolicy> = list_all(store).await?;
    let clients: Vec<Client> = list_all(store).await?;
    let now = Timestamp::now();
    let decisions = schedule(&Snapshot {
        leases: &leases,
        exporters: &exporters,
        policies: &policies,
        clients: &clients,
        now,
    });
    let mut next: Option<Timestamp> = None;
    let mut final_status: BTreeMap<(String, String), crate::objects::LeaseStatus> = leases
        .iter()
        .filter_map(|l| {
            Some((
                (l.metadata.namespace.clone()?, l.metadata.name.clone()?),
                l.status.clone().unwrap_or_default(),
            ))
        })
        .collect();
    for d in &decisions {
        if let Some(t) = d.requeue_at {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        let key = (d.namespace.clone(), d.name.clone());
        let Some(lease) = leases.iter().find(|l| {
            l.metadata.namespace.as_deref() == Some(&d.namespace)
                && l.metadata.name.as_deref() == Some(&d.name)
        }) else {
            continue;
        };
        let mut current = lease.clone();
        if d.status_changed {
            current.status = Some(d.status.clone());
            match store.update_status(&current).await {
                Ok(stored) => {
                    final_status.insert(key.clone(), d.status.clone());
                    current = stored;
                }
                Err(e) if e.is_conflict() => {
                    // Changed meanwhile: the next pass sees the new state.
                    next = Some(now);
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        if d.labels_changed {
            current.metadata.labels = (!d.labels.is_empty()).then(|| d.labels.clone());
            match store.update(&current).await {
                Ok(_) => {}
                Err(e) if e.is_conflict() => next = Some(now),
                Err(e) => return Err(e),
            }
        }
    }

    // Exporters: who holds them, and whether they are online.
    let refs = exporter_lease_refs(
        final_status
            .iter()
            .map(|((ns, name), st)| (ns.as_str(), name.as_str(), st)),
    );
    for e in &exporters {
        let (Some(ns), Some(name)) = (e.metadata.namespace.clone(), e.metadata.name.clone()) else {
            continue;
        };
        let want_ref = refs.get(&(ns.clone(), name.clone())).cloned();
        let mut status = e.status.clone().unwrap_or_default();
        let mut changed = false;
        let have_ref = status.lease_ref.as_ref().map(|r| r.name.clone());
        if have_ref != want_ref {
            status.lease_ref = want_ref.map(|name| LocalObjectReference { name });
            changed = true;
        }
        let online = exporter_online_state(Some(&status), now);
        if let Some(msg) = online.force_offline_message
            && status.exporter_status != Some(ExporterStatusValue::Offline)
        {
            status.exporter_status = Some(ExporterStatusValue::Offline);
            status.status_message = msg.to_string();
            changed = true;
        }
        changed |= set_condition(
            &mut status.conditions,
            conditions::ONLINE,
            online.online,
            online.reason,
            &online.message,
            None,
            now,
        );
        let registered = status.devices.is_some();
        changed |= set_condition(
            &mut status.conditions,
            conditions::REGISTERED,
            registered,
            if registered { "Register" } else { "Unregister" },
            if registered {
                "Exporter registered"
            } else {
                "Exporter not registered"
            },
            None,
            now,
        );
        if changed {
            let mut updated = e.clone();
            updated.status = Some(status);
            match store.update_status(&updated).await {
                Ok(_) => {}
                Err(err) if err.is_conflict() => next = Some(now),
                Err(err) => return Err(err),
            }
        }
    }
    let _ = metav1::Time(now);
    Ok(next)
}

/// Runs the loop until `shutdown` resolves.
pub async fn run<S: Store>(
    state: Arc<ControllerState<S>>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let sleep = match reconcile_once(&state).await {
            Ok(next) => next
                .map(|t| {
                    let ms = t.duration_since(Timestamp::now()).as_millis().max(0);
                    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
                })
                .unwrap_or(MAX_SLEEP)
                .min(MAX_SLEEP),
            Err(e) => {
                tracing::warn!("reconcile failed: {e}");
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            _ = &mut shutdown => return,
            _ = state.wake.notified() => {}
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}
