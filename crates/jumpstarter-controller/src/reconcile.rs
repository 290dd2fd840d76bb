//! The reconcile loop: reads the objects, runs the [`crate::scheduler`], writes what changed
//! (lease statuses and labels, exporters' `leaseRef` and `Online` condition), and sleeps until
//! the next deadline or until a service pokes [`ControllerState::wake`].

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::LocalObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

use crate::{
    objects::{
        Client, Exporter, ExporterAccessPolicy, ExporterStatus, ExporterStatusValue, Lease,
        conditions, exporter_online_state, set_condition,
    },
    scheduler::{Snapshot, exporter_lease_refs, schedule},
    selector::LabelSelector,
    state::{ControllerState, ExporterChanges, ObjectKey, older_version},
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

/// The reconcile loop's copy of the exporters: updated from the exporter cache's changes
/// (and from its own writes) instead of listing and decoding every exporter on every pass.
pub struct ExporterView {
    items: Vec<Exporter>,
    index: HashMap<ObjectKey, usize>,
}

impl ExporterView {
    fn new(items: Vec<Exporter>) -> Self {
        let mut view = ExporterView {
            items: Vec::with_capacity(items.len()),
            index: HashMap::with_capacity(items.len()),
        };
        for e in items {
            view.set(e);
        }
        view
    }

    fn key(e: &Exporter) -> ObjectKey {
        (
            e.metadata.namespace.clone().unwrap_or_default(),
            e.metadata.name.clone().unwrap_or_default(),
        )
    }

    /// Stores `e` unless the view already holds a newer version of it.
    fn set(&mut self, e: Exporter) {
        let key = Self::key(&e);
        match self.index.get(&key) {
            Some(&i) => {
                if !older_version(&e, &self.items[i]) {
                    self.items[i] = e;
                }
            }
            None => {
                self.index.insert(key, self.items.len());
                self.items.push(e);
            }
        }
    }

    fn remove(&mut self, key: &ObjectKey) {
        if let Some(i) = self.index.remove(key) {
            self.items.swap_remove(i);
            if let Some(moved) = self.items.get(i) {
                self.index.insert(Self::key(moved), i);
            }
        }
    }
}

/// Whether `set_condition` with these arguments would change `conds`.
fn condition_differs(
    conds: &[metav1::Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
) -> bool {
    let status = if status {
        conditions::TRUE
    } else {
        conditions::FALSE
    };
    match conds.iter().find(|c| c.type_ == type_) {
        Some(c) => {
            c.status != status
                || c.reason != reason
                || c.message != message
                || c.observed_generation.is_some()
        }
        None => true,
    }
}

/// One pass; returns the earliest time something must be looked at again.
pub async fn reconcile_once<S: Store>(
    state: &ControllerState<S>,
) -> Result<Option<Timestamp>, StoreError> {
    let store = &state.store;
    let leases: Vec<Lease> = list_all(store).await?;
    // Exporters come from the cache the exporter feed keeps when it runs, else from a list.
    let mut view_guard = state.exporter_view.lock().await;
    let listed: Vec<Exporter>;
    let exporters: &[Exporter] = match state.take_exporter_changes(view_guard.is_none()) {
        Some(ExporterChanges::All(items)) => &view_guard.insert(ExporterView::new(items)).items,
        Some(ExporterChanges::Some(changes)) => match view_guard.as_mut() {
            Some(view) => {
                for (key, e) in changes {
                    match e {
                        Some(e) => view.set(e),
                        None => view.remove(&key),
                    }
                }
                &view.items
            }
            None => {
                listed = list_all(store).await?;
                &listed
            }
        },
        None => {
            *view_guard = None;
            listed = list_all(store).await?;
            &listed
        }
    };
    let policies: Vec<ExporterAccessPolicy> = list_all(store).await?;
    let clients: Vec<Client> = list_all(store).await?;
    let now = Timestamp::now();
    let decisions = schedule(&Snapshot {
        leases: &leases,
        exporters,
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
    let lease_index: HashMap<(&str, &str), &Lease> = leases
        .iter()
        .filter_map(|l| {
            Some((
                (
                    l.metadata.namespace.as_deref()?,
                    l.metadata.name.as_deref()?,
                ),
                l,
            ))
        })
        .collect();
    for d in &decisions {
        if let Some(t) = d.requeue_at {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        let key = (d.namespace.clone(), d.name.clone());
        let Some(lease) = lease_index.get(&(d.namespace.as_str(), d.name.as_str())) else {
            continue;
        };
        if !d.status_changed && !d.labels_changed {
            continue;
        }
        let mut current = (*lease).clone();
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
    let mut written: Vec<Exporter> = Vec::new();
    for e in exporters {
        let (Some(ns), Some(name)) = (e.metadata.namespace.as_deref(), e.metadata.name.as_deref())
        else {
            continue;
        };
        let want_ref = refs.get(&(ns.to_string(), name.to_string()));
        let stored = e.status.as_ref();
        let have_ref = stored.and_then(|s| s.lease_ref.as_ref()).map(|r| &r.name);
        // The Status stream's heartbeat lives in memory; the stored lastSeen lags behind it.
        let seen = state.seen_at(ns, name);
        let stored_seen = stored.and_then(|s| s.last_seen.as_ref()).map(|t| t.0);
        let newer_seen = seen.filter(|s| stored_seen.is_none_or(|t| *s > t));
        let merged;
        let live: Option<&ExporterStatus> = match newer_seen {
            Some(t) => {
                merged = ExporterStatus {
                    last_seen: Some(metav1::Time(t)),
                    exporter_status: stored.and_then(|s| s.exporter_status),
                    status_message: stored.map(|s| s.status_message.clone()).unwrap_or_default(),
                    ..Default::default()
                };
                Some(&merged)
            }
            None => stored,
        };
        let online = exporter_online_state(live, now);
        let registered = stored.is_some_and(|s| s.devices.is_some());
        let empty = Vec::new();
        let conds = stored.map(|s| &s.conditions).unwrap_or(&empty);
        let force_offline = online.force_offline_message.is_some()
            && stored.and_then(|s| s.exporter_status) != Some(ExporterStatusValue::Offline);
        let (reg_reason, reg_message) = if registered {
            ("Register", "Exporter registered")
        } else {
            ("Unregister", "Exporter not registered")
        };
        let differs = have_ref != want_ref
            || force_offline
            || condition_differs(
                conds,
                conditions::ONLINE,
                online.online,
                online.reason,
                &online.message,
            )
            || condition_differs(
                conds,
                conditions::REGISTERED,
                registered,
                reg_reason,
                reg_message,
            );
        if !differs {
            continue;
        }
        let mut status = e.status.clone().unwrap_or_default();
        status.lease_ref = want_ref.map(|name| LocalObjectReference { name: name.clone() });
        if let Some(msg) = online.force_offline_message
            && status.exporter_status != Some(ExporterStatusValue::Offline)
        {
            status.exporter_status = Some(ExporterStatusValue::Offline);
            status.status_message = msg.to_string();
        }
        if let Some(t) = newer_seen {
            status.last_seen = Some(metav1::Time(t));
        }
        set_condition(
            &mut status.conditions,
            conditions::ONLINE,
            online.online,
            online.reason,
            &online.message,
            None,
            now,
        );
        set_condition(
            &mut status.conditions,
            conditions::REGISTERED,
            registered,
            reg_reason,
            reg_message,
            None,
            now,
        );
        let mut updated = e.clone();
        updated.status = Some(status);
        match store.update_status(&updated).await {
            Ok(stored) => written.push(stored),
            Err(err) if err.is_conflict() => next = Some(now),
            Err(err) => return Err(err),
        }
    }
    // Our own writes are newer than what the view holds until the feed delivers them.
    if let Some(view) = view_guard.as_mut() {
        for e in written {
            view.set(e);
        }
    }
    Ok(next)
}

/// Runs the loop until `shutdown` resolves.
pub async fn run<S: Store>(
    state: Arc<ControllerState<S>>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    state.start_exporter_feed();
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
