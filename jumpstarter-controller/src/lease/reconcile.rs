//! The reconcile loop: reads the objects, runs the [`crate::lease::scheduler`], writes what
//! changed (lease statuses and labels, exporters' `leaseRef` and `Online` condition), and
//! sleeps until the next deadline or until a service pokes [`ControllerState::wake`].

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use jiff::Timestamp;
use jumpstarter_core::sync::LockExt;
use k8s_openapi::api::core::v1::LocalObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

use crate::lease::object_view::{ViewSlot, read_view};
use crate::{
    lease::{
        exporter_view::ExporterView,
        scheduler::{Snapshot, exporter_lease_refs, schedule},
    },
    objects::{
        Client, EXPORTER_OFFLINE_AFTER, Exporter, ExporterAccessPolicy, ExporterStatus,
        ExporterStatusValue, LEASE_ENDED_LABEL, Lease, ObjectKey, conditions,
        exporter_online_state, meta_key, selector::LabelSelector, set_condition,
    },
    state::{ControllerState, ExporterChanges},
    store::{ListParams, Parts, Store, StoreError},
};

/// The longest the loop sleeps.
const MAX_SLEEP: Duration = Duration::from_secs(5);

async fn list_all<S: Store, K: crate::store::StoreObject>(store: &S) -> Result<Vec<K>, StoreError> {
    Ok(store
        .list::<K>(None, &LabelSelector::everything(), &ListParams::default())
        .await?
        .items)
}

/// Every object of kind `K`: from the view in `slot` when the store's watch is synchronous,
/// else listed. A view spares a pass a read on the store's reader threads, which it would
/// share with the RPCs' reads (each `ReportStatus` and `Listen` reads its exporter).
async fn current<S: Store, K: crate::store::StoreObject>(
    store: &S,
    slot: &ViewSlot<K>,
) -> Result<Vec<K>, StoreError> {
    if !store.watch_is_synchronous() {
        return list_all(store).await;
    }
    read_view(store, slot, |v| v.objects().cloned().collect()).await
}

/// The leases a pass works on: those that have not ended. Ended leases stay in the store as
/// history (a week by default in the embedded store, see [`crate::lease::gc`]; on Kubernetes
/// until the cluster's own tooling deletes them) and the scheduler ignores them, but every
/// pass copied them (from the view) or listed them (on Kubernetes, where their number has no
/// bound): with 7,000 of them beside 1,000 held leases an idle pass took four times as long.
/// On Kubernetes the API server leaves out those carrying the ended label; an ended lease
/// without it (ended before the label existed) is dropped here.
async fn live_leases<S: Store>(
    store: &S,
    slot: &ViewSlot<Lease>,
) -> Result<Vec<Lease>, StoreError> {
    if !store.watch_is_synchronous() {
        // (The selector is a constant; were it refused, the filter below still holds.)
        let not_ended = LabelSelector::parse(&format!("!{LEASE_ENDED_LABEL}"))
            .unwrap_or_else(|_| LabelSelector::everything());
        let mut leases = store
            .list::<Lease>(None, &not_ended, &ListParams::default())
            .await?
            .items;
        leases.retain(|l| !l.is_ended());
        return Ok(leases);
    }
    read_view(store, slot, |v| {
        v.objects().filter(|l| !l.is_ended()).cloned().collect()
    })
    .await
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
    let started = std::time::Instant::now();
    let leases: Vec<Lease> = live_leases(store, &state.lease_view).await?;
    // Exporters come from the cache the exporter feed keeps when it runs, else from a list.
    let mut view_guard = state.exporter_view.lock().await;
    let listed = refresh_exporters(state, &mut view_guard).await?;
    let exporters: &[Exporter] = match (&listed, view_guard.as_ref()) {
        (Some(items), _) => items,
        (None, Some(view)) => &view.items,
        (None, None) => &[],
    };
    let policies: Vec<ExporterAccessPolicy> = current(store, &state.policy_view).await?;
    // Clients' labels matter only to access policies: without any, a pass need not read
    // (and decode) every client.
    let clients: Vec<Client> = if policies.is_empty() {
        Vec::new()
    } else {
        current(store, state.auth.client_view()).await?
    };
    let now = Timestamp::now();
    let listed_in = started.elapsed();
    let pools = {
        use jumpstarter_core::sync::LockExt;
        state.pool_labels.lock_or_recover().clone()
    };
    let mut decisions = schedule(&Snapshot {
        leases: &leases,
        exporters,
        policies: &policies,
        clients: &clients,
        pools: &pools,
        now,
    });
    if let Some(timeout) = state.pending_client_timeout {
        crate::lease::pending_guard::end_abandoned(
            &mut decisions,
            &leases,
            |ns, client| state.auth.client_activity.last_heard(ns, client),
            timeout,
            now,
        );
    }
    let scheduled_in = started.elapsed();
    let mut next: Option<Timestamp> = None;
    // The exporters that leases name (held or just assigned): the leases' owners.
    let named = exporters_named(
        leases
            .iter()
            .filter_map(|l| Some((l.metadata.namespace.as_deref()?, l.status.as_ref()?)))
            .chain(decisions.iter().map(|d| (d.namespace.as_str(), &d.status)))
            .filter_map(|(ns, st)| Some((ns, st.exporter_ref.as_ref()?.name.as_str()))),
        exporters,
        if listed.is_some() {
            None
        } else {
            view_guard.as_ref()
        },
    );
    let mut leases_written = write_leases(
        store,
        &leases,
        &decisions,
        &named,
        now,
        &mut next,
        state.lease_logs.as_deref(),
    )
    .await?;
    crate::metrics::leases().record_decisions(
        &decisions,
        &leases,
        &leases_written.statuses,
        started,
        now,
    );
    if sync_owners(store, &leases, &leases_written, &named).await {
        next = Some(now);
    }
    // `CreateLease` answers with its lease from these once the pass has ended.
    state
        .passes
        .wrote(std::mem::take(&mut leases_written.rewritten));
    let leases_in = started.elapsed();
    // Before the exporters hear of their leases: their Status messages name the client.
    let clients_of: crate::state::LeaseClients = leases
        .iter()
        .filter_map(|l| {
            let key = meta_key(&l.metadata)?;
            let held = leases_written
                .statuses
                .get(&key)
                .is_some_and(|st| !st.ended && st.exporter_ref.is_some());
            held.then(|| {
                let (ns, name) = key;
                (
                    (ns.to_string(), name.to_string()),
                    crate::state::LeaseHolder {
                        client: l.spec.client_ref.name.clone(),
                        context: l.spec.context.clone(),
                    },
                )
            })
        })
        .collect();
    *state.lease_clients.lock_or_recover() = Arc::new(clients_of);

    // Exporters: who holds them, and whether they are online.
    let refs = exporter_lease_refs(
        leases_written
            .statuses
            .iter()
            .map(|(&(ns, name), &st)| (ns, name, st)),
    );
    let targets: Vec<&Exporter> = match (&listed, view_guard.as_mut()) {
        (Some(items), _) => items.iter().collect(),
        (None, Some(view)) => match view.take_targets(now, &refs) {
            None => view.items.iter().collect(),
            Some(keys) => {
                let view = &*view;
                keys.iter().filter_map(|k| view.get(k)).collect()
            }
        },
        (None, None) => Vec::new(),
    };
    let mut updates: Vec<Exporter> = Vec::new();
    let mut checks: Vec<(ObjectKey, Option<Timestamp>)> = Vec::with_capacity(targets.len());
    for e in targets {
        let Some(key) = meta_key(&e.metadata).map(|(ns, n)| (ns.to_string(), n.to_string())) else {
            continue;
        };
        let seen = state.exporters.seen_at(&key.0, &key.1);
        let (lapses_at, update) = exporter_status_update(e, refs.get(&key), seen, now);
        checks.push((key, lapses_at));
        updates.extend(update);
    }
    let exporter_writes = updates.len();
    let written = write_exporter_statuses(store, updates, now, &mut next).await?;
    tracing::debug!(
        leases = leases.len(),
        changed = decisions
            .iter()
            .filter(|d| d.status_changed || d.labels_changed)
            .count(),
        exporter_writes,
        listed_ms = listed_in.as_secs_f64() * 1e3,
        scheduled_ms = scheduled_in.as_secs_f64() * 1e3,
        leases_written_ms = leases_in.as_secs_f64() * 1e3,
        total_ms = started.elapsed().as_secs_f64() * 1e3,
        "reconcile pass"
    );
    // Our own writes are newer than what the view holds until the feed delivers them.
    if let Some(view) = view_guard.as_mut() {
        for (key, at) in checks {
            view.check_at(&key, at);
        }
        for e in written {
            view.set(e);
        }
        if let Some(t) = view.next_due() {
            earliest(&mut next, t);
        }
    }
    Ok(next)
}

/// The exporters named by `wanted` ((namespace, name) pairs, repeats allowed), by key: looked
/// up in the view's index when the pass has one, else found in `exporters` (a fresh list).
/// A pass must not hash every exporter of the lab: with 10,000 exporters it built two such
/// maps per pass, hashing 20,000 keys to keep about 1,000.
fn exporters_named<'e, 'k>(
    wanted: impl IntoIterator<Item = (&'k str, &'k str)>,
    exporters: &'e [Exporter],
    view: Option<&'e ExporterView>,
) -> HashMap<(&'e str, &'e str), &'e Exporter> {
    let keys: HashSet<(&str, &str)> = wanted.into_iter().collect();
    let found = |e: &'e Exporter| Some((meta_key(&e.metadata)?, e));
    match view {
        Some(view) => keys
            .into_iter()
            .filter_map(|(ns, name)| view.get(&(ns.to_string(), name.to_string())))
            .filter_map(found)
            .collect(),
        None if keys.is_empty() => HashMap::new(),
        None => exporters
            .iter()
            .filter_map(found)
            .filter(|(key, _)| keys.contains(key))
            .collect(),
    }
}

/// Moves `next` to `t` if that is sooner.
fn earliest(next: &mut Option<Timestamp>, t: Timestamp) {
    *next = Some(next.map_or(t, |n| n.min(t)));
}

/// Brings the reconcile view up to date with the exporter cache's changes; returns a fresh
/// list of the exporters instead when the cache cannot serve (not synced, or no view yet).
async fn refresh_exporters<S: Store>(
    state: &ControllerState<S>,
    view: &mut Option<ExporterView>,
) -> Result<Option<Vec<Exporter>>, StoreError> {
    match state.exporters.take_changes(view.is_none()) {
        Some(ExporterChanges::All(items)) => {
            *view = Some(ExporterView::new(items));
            Ok(None)
        }
        Some(ExporterChanges::Some(changes)) => match view.as_mut() {
            Some(view) => {
                for (key, e) in changes {
                    match e {
                        Some(e) => view.set(e),
                        None => view.remove(&key),
                    }
                }
                Ok(None)
            }
            None => Ok(Some(list_all(&state.store).await?)),
        },
        None => {
            *view = None;
            Ok(Some(list_all(&state.store).await?))
        }
    }
}

/// What [`write_leases`] leaves: every lease's status after the pass, and the leases it
/// rewrote (as stored).
struct LeasesWritten<'a> {
    statuses: BTreeMap<(&'a str, &'a str), &'a crate::objects::LeaseStatus>,
    rewritten: HashMap<ObjectKey, Lease>,
}

/// Writes the scheduler's decisions: each changed lease's status, then its labels and owner
/// reference in one write. A conflicting write is left to the next pass (`next` = now).
async fn write_leases<'a, S: Store>(
    store: &S,
    leases: &'a [Lease],
    decisions: &'a [crate::lease::scheduler::LeaseDecision],
    owners: &HashMap<(&str, &str), &Exporter>,
    now: Timestamp,
    next: &mut Option<Timestamp>,
    logs: Option<&crate::lease_logs::LeaseLogs>,
) -> Result<LeasesWritten<'a>, StoreError> {
    // Borrowed, not copied: a pass over 1,000 leases copied every status here.
    static NO_STATUS: std::sync::LazyLock<crate::objects::LeaseStatus> =
        std::sync::LazyLock::new(Default::default);
    let mut statuses: BTreeMap<(&'a str, &'a str), &'a crate::objects::LeaseStatus> = leases
        .iter()
        .filter_map(|l| {
            Some((
                meta_key(&l.metadata)?,
                l.status.as_ref().unwrap_or(&NO_STATUS),
            ))
        })
        .collect();
    let lease_index: HashMap<(&str, &str), &Lease> = leases
        .iter()
        .filter_map(|l| Some((meta_key(&l.metadata)?, l)))
        .collect();
    let mut rewritten: HashMap<ObjectKey, Lease> = HashMap::new();
    // Ends are written before grants: an exporter freed by a lease ending in this pass and
    // granted to another one in the same pass is never named by two live leases in the store,
    // not even between the two writes. When an end could not be written, its exporter's grant
    // waits for the next pass.
    let ends = |d: &crate::lease::scheduler::LeaseDecision| {
        matches!(d.action, crate::lease::scheduler::Action::Ended { .. })
    };
    let mut still_held: HashSet<(String, String)> = HashSet::new();
    for d in decisions {
        if let Some(t) = d.requeue_at {
            earliest(next, t);
        }
    }
    // Each phase is one store call per batch of `crate::store::in_batches` (2,048 leases in
    // the embedded store): the statuses with the labels and owner references (one
    // transaction, one write per lease, in the embedded store; on Kubernetes the statuses,
    // then the rest). Written one lease at a time, 1,000 grants in one pass cost 2,000 writes
    // taking turns on the store's writer (a second and a half of the grant time with 1,000
    // leases asked at once); as two writes per lease, a third of the pass.
    for ending in [true, false] {
        let mut todo: Vec<(&crate::lease::scheduler::LeaseDecision, &Lease, Parts)> = Vec::new();
        let mut objects: Vec<(Lease, Parts)> = Vec::new();
        for d in decisions.iter().filter(|d| ends(d) == ending) {
            let Some(lease) = lease_index.get(&(d.namespace.as_str(), d.name.as_str())) else {
                continue;
            };
            if !d.status_changed && !d.labels_changed {
                continue;
            }
            if let crate::lease::scheduler::Action::Assigned { exporter, .. } = &d.action
                && still_held.contains(&(d.namespace.clone(), exporter.clone()))
            {
                *next = Some(now);
                continue;
            }
            let mut given = (*lease).clone();
            let mut parts = Parts {
                status: d.status_changed,
                metadata: d.labels_changed,
            };
            if d.status_changed {
                given.status = Some(d.status.clone());
            }
            if d.labels_changed {
                given.metadata.labels = (!d.labels.is_empty()).then(|| d.labels.clone());
            }
            match crate::kubernetes::owner_refs::set_lease_owner(&mut given, &d.status, owners) {
                Ok(changed) => parts.metadata |= changed,
                Err(e) => tracing::warn!(
                    "lease owner reference not set: {e}",
                    e = jumpstarter_core::error_chain(&e)
                ),
            }
            todo.push((d, lease, parts));
            objects.push((given, parts));
        }
        if todo.is_empty() {
            continue;
        }
        let results = crate::store::in_batches(store, objects, |batch| {
            store.update_status_and_metadata_many(batch)
        })
        .await?;
        for ((d, lease, parts), result) in todo.into_iter().zip(results) {
            match result {
                Ok(stored) => {
                    if parts.status {
                        statuses.insert((d.namespace.as_str(), d.name.as_str()), &d.status);
                        log_transition(d, lease, logs);
                        trace_transition(d, lease);
                    }
                    rewritten.insert((d.namespace.clone(), d.name.clone()), stored);
                }
                Err(e) if e.is_conflict() || e.is_not_found() => {
                    // Changed (or gone) meanwhile: the next pass sees the new state. An ending
                    // lease whose end was not written (or only in part) still holds its
                    // exporter for this pass.
                    *next = Some(now);
                    if ending
                        && let Some(r) = lease.status.as_ref().and_then(|s| s.exporter_ref.as_ref())
                    {
                        still_held.insert((d.namespace.clone(), r.name.clone()));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(LeasesWritten {
        statuses,
        rewritten,
    })
}

/// The log line of a grant or an end this pass wrote, with the correlation fields and the
/// lease's context, also kept in the lease's log (`logs`).
fn log_transition(
    d: &crate::lease::scheduler::LeaseDecision,
    lease: &Lease,
    logs: Option<&crate::lease_logs::LeaseLogs>,
) {
    let client = lease.spec.client_ref.name.as_str();
    let _context = crate::lease_logs::context_span(&lease.spec.context).entered();
    let facts = |exporter| crate::lease_logs::LeaseFacts {
        namespace: &d.namespace,
        name: &d.name,
        client,
        exporter,
        context: &lease.spec.context,
    };
    match &d.action {
        crate::lease::scheduler::Action::Assigned { exporter, priority } => {
            tracing::info!(
                lease_id = %d.name,
                namespace = %d.namespace,
                client,
                exporter = %exporter,
                priority,
                "lease granted"
            );
            if let Some(logs) = logs {
                logs.event(
                    &facts(exporter),
                    "lease granted",
                    &[("priority", priority.to_string())],
                );
            }
        }
        crate::lease::scheduler::Action::Ended { reason } => {
            let exporter = lease
                .status
                .as_ref()
                .and_then(|s| s.exporter_ref.as_ref())
                .map(|r| r.name.as_str())
                .unwrap_or("");
            tracing::info!(
                lease_id = %d.name,
                namespace = %d.namespace,
                client,
                exporter,
                reason,
                "lease ended"
            );
            if let Some(logs) = logs {
                logs.event(
                    &facts(exporter),
                    "lease ended",
                    &[("reason", reason.to_string())],
                );
            }
        }
        _ => {}
    }
}

/// The span of a grant or an end this pass wrote, in the lease's trace (with traces on);
/// an end also sends the lease's root span, from its creation.
fn trace_transition(d: &crate::lease::scheduler::LeaseDecision, lease: &Lease) {
    use jumpstarter_core::telemetry::{LeaseRef, Step, lease_root, lease_step};
    let mut r = LeaseRef {
        namespace: &d.namespace,
        name: &d.name,
        client: &lease.spec.client_ref.name,
        exporter: "",
    };
    match &d.action {
        crate::lease::scheduler::Action::Assigned { exporter, .. } => {
            r.exporter = exporter;
            lease_step(Step::Grant, &r);
        }
        crate::lease::scheduler::Action::Ended { reason } => {
            r.exporter = lease
                .status
                .as_ref()
                .and_then(|s| s.exporter_ref.as_ref())
                .map_or("", |e| e.name.as_str());
            lease_step(Step::End, &r);
            let created = lease
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or_else(std::time::SystemTime::now, |t| t.0.into());
            lease_root(&r, created, reason);
        }
        _ => {}
    }
}

/// Leases are owned by their exporter, as upstream's (collected with it on a cluster); this
/// catches the leases assigned before (e.g. by an older controller). Returns whether a write
/// conflicted (the next pass must come soon).
async fn sync_owners<S: Store>(
    store: &S,
    leases: &[Lease],
    written: &LeasesWritten<'_>,
    exporters: &HashMap<(&str, &str), &Exporter>,
) -> bool {
    let statuses: Vec<_> = written
        .statuses
        .iter()
        .map(|(&(ns, n), &st)| (ns, n, st))
        .collect();
    // The leases as stored now: the ones this pass rewrote, else as listed (not copied: a
    // pass over 1,000 leases copied every one here).
    let rewritten: HashMap<(&str, &str), &Lease> = written
        .rewritten
        .iter()
        .map(|((ns, n), l)| ((ns.as_str(), n.as_str()), l))
        .collect();
    let latest = leases.iter().map(|l| {
        meta_key(&l.metadata)
            .and_then(|k| rewritten.get(&k).copied())
            .unwrap_or(l)
    });
    crate::kubernetes::owner_refs::sync_lease_owners(store, latest, &statuses, exporters).await
}

/// One exporter's status as this pass wants it: the lease holding it (`want_ref`), its
/// `Online` condition from the latest sighting (`seen`, the Status stream's in-memory
/// heartbeat, newer than the stored `lastSeen`) and its `Registered` condition. Returns when
/// its liveness must be looked at again, and the exporter to write when anything differs.
fn exporter_status_update(
    e: &Exporter,
    want_ref: Option<&String>,
    seen: Option<Timestamp>,
    now: Timestamp,
) -> (Option<Timestamp>, Option<Exporter>) {
    let stored = e.status.as_ref();
    let have_ref = stored.and_then(|s| s.lease_ref.as_ref()).map(|r| &r.name);
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
    // While online, the condition lapses by itself a minute after the last sighting.
    let lapses_at = live
        .and_then(|s| s.last_seen.as_ref())
        .filter(|_| online.online)
        .and_then(|t| t.0.checked_add(EXPORTER_OFFLINE_AFTER).ok())
        .and_then(|t| t.checked_add(jiff::SignedDuration::from_millis(1)).ok());
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
    // An exporter's own report (`ReportStatus`) sets `Online=True` with its words; while it
    // stays online, that condition is left as it is. Rewriting it as "Seen" cost one more
    // exporter write after every report: with 1,000 leases asked at once, the passes after
    // the first grants rewrote the exporters that had reported `LEASE_READY` (859 in one
    // pass), and the pass granting the last leases carried 96 of them.
    let reported_online = online.online
        && conds.iter().any(|c| {
            c.type_ == conditions::ONLINE
                && c.status == conditions::TRUE
                && c.reason == conditions::REASON_STATUS_REPORTED
        });
    let differs = have_ref != want_ref
        || force_offline
        || (!reported_online
            && condition_differs(
                conds,
                conditions::ONLINE,
                online.online,
                online.reason,
                &online.message,
            ))
        || condition_differs(
            conds,
            conditions::REGISTERED,
            registered,
            reg_reason,
            reg_message,
        );
    if !differs {
        return (lapses_at, None);
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
    (lapses_at, Some(updated))
}

/// Writes the exporters' statuses (after a mass registration this is thousands of exporters)
/// in the calls of [`crate::store::in_batches`]; returns them as stored. A conflict or a
/// vanished exporter is left to the next pass (`next` = now).
async fn write_exporter_statuses<S: Store>(
    store: &S,
    updates: Vec<Exporter>,
    now: Timestamp,
    next: &mut Option<Timestamp>,
) -> Result<Vec<Exporter>, StoreError> {
    let mut written = Vec::new();
    for result in
        crate::store::in_batches(store, updates, |batch| store.update_status_many(batch)).await?
    {
        match result {
            Ok(stored) => written.push(stored),
            Err(err) if err.is_conflict() || err.is_not_found() => *next = Some(now),
            Err(err) => return Err(err),
        }
    }
    Ok(written)
}

/// Runs the loop until `shutdown` resolves.
pub async fn run<S: Store>(
    state: Arc<ControllerState<S>>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    state.start_exporter_feed();
    loop {
        state.passes.begin();
        let pass = reconcile_once(&state).await;
        state.passes.end();
        let sleep = match pass {
            Ok(next) => next
                .map(|t| {
                    let ms = t.duration_since(Timestamp::now()).as_millis().max(0);
                    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
                })
                .unwrap_or(MAX_SLEEP)
                .min(MAX_SLEEP),
            Err(e) if e.is_corruption() => {
                let reason = format!(
                    "the store is damaged: {e}; {}",
                    crate::store::sqlite::RECOVERY_STEPS,
                    e = jumpstarter_core::error_chain(&e)
                );
                tracing::error!("{reason}");
                state.fail(reason);
                return;
            }
            Err(e) => {
                tracing::warn!(
                    "reconcile failed: {e}",
                    e = jumpstarter_core::error_chain(&e)
                );
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use jumpstarter_router::RouterTokenKey;

    use crate::auth::TokenIssuer;

    use super::*;
    use crate::objects::{ExporterSpec, conditions as c, find_condition};
    use crate::store::SqliteStore;

    /// The controller state over `store`, with fresh keys.
    fn state_over<S: Store>(store: S) -> Arc<ControllerState<S>> {
        let issuer = Arc::new(TokenIssuer::generate().unwrap());
        let (router_key, _) = RouterTokenKey::generate().unwrap();
        ControllerState::new(store, issuer, router_key, vec![], "localhost:1".into())
    }

    async fn state() -> (tempfile::TempDir, Arc<ControllerState<SqliteStore>>) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).await.unwrap();
        (dir, state_over(store))
    }

    /// A store whose database turns damaged on demand: every `list` then fails as SQLite
    /// does on a damaged file.
    #[derive(Clone)]
    struct Damaged {
        inner: SqliteStore,
        damaged: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Store for Damaged {
        async fn get<K: crate::store::StoreObject>(
            &self,
            namespace: &str,
            name: &str,
        ) -> Result<Option<K>, StoreError> {
            self.inner.get(namespace, name).await
        }
        async fn list<K: crate::store::StoreObject>(
            &self,
            namespace: Option<&str>,
            selector: &LabelSelector,
            params: &ListParams,
        ) -> Result<crate::store::ObjectList<K>, StoreError> {
            if self.damaged.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(StoreError::Database {
                    path: "store.db".into(),
                    source: "database disk image is malformed".into(),
                });
            }
            self.inner.list(namespace, selector, params).await
        }
        async fn create<K: crate::store::StoreObject>(&self, o: &K) -> Result<K, StoreError> {
            self.inner.create(o).await
        }
        async fn update<K: crate::store::StoreObject>(&self, o: &K) -> Result<K, StoreError> {
            self.inner.update(o).await
        }
        async fn update_status<K: crate::store::StoreObject>(
            &self,
            o: &K,
        ) -> Result<K, StoreError> {
            self.inner.update_status(o).await
        }
        async fn delete<K: crate::store::StoreObject>(
            &self,
            namespace: &str,
            name: &str,
            resource_version: Option<&str>,
        ) -> Result<K, StoreError> {
            self.inner.delete(namespace, name, resource_version).await
        }
        async fn watch<K: crate::store::StoreObject>(
            &self,
            namespace: Option<&str>,
            since: Option<&str>,
        ) -> Result<crate::store::WatchStream<K>, StoreError> {
            self.inner.watch(namespace, since).await
        }
    }

    /// Issue 22 item 6: damage found while running stops the controller (its binary exits
    /// with the reason) instead of failing every second.
    #[tokio::test]
    async fn a_store_damaged_while_running_stops_the_controller_with_the_recovery_steps() {
        let dir = tempfile::tempdir().unwrap();
        let damaged = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let store = Damaged {
            inner: SqliteStore::open(dir.path()).await.unwrap(),
            damaged: damaged.clone(),
        };
        let state = state_over(store);
        assert!(
            reconcile_once(&state).await.is_ok(),
            "a sound store reconciles"
        );
        let loop_ = tokio::spawn(run(state.clone(), std::future::pending()));
        damaged.store(true, std::sync::atomic::Ordering::SeqCst);
        state.wake.notify_one();
        let reason = tokio::time::timeout(Duration::from_secs(60), state.failed())
            .await
            .expect("the controller went on with a damaged store");
        assert!(
            reason.contains("damaged") && reason.contains("malformed"),
            "{reason}"
        );
        assert!(reason.contains("restore"), "{reason}");
        tokio::time::timeout(Duration::from_secs(60), loop_)
            .await
            .expect("the reconcile loop went on")
            .unwrap();
        // Any other store error is retried, not fatal.
        let other = StoreError::Database {
            path: "store.db".into(),
            source: "database is locked".into(),
        };
        assert!(!other.is_corruption());
    }

    fn online(e: &Exporter) -> Option<String> {
        let conds = &e.status.as_ref()?.conditions;
        find_condition(conds, c::ONLINE).map(|c| c.status.clone())
    }

    /// A pass looks only at what changed, yet an exporter that falls silent still goes
    /// offline on time: its liveness deadline brings it back into a pass by itself.
    #[tokio::test]
    async fn a_silent_exporter_lapses_offline_on_time_without_any_change() {
        let (_dir, state) = state().await;
        state.start_exporter_feed();
        assert!(state.exporters.synced(Duration::from_secs(5)).await);
        let mut e = Exporter::new("board", ExporterSpec::default());
        e.metadata.namespace = Some("default".into());
        let mut e = state.store.create(&e).await.unwrap();
        // Last seen just under a minute ago (stored to the second): online for 0.5–1.5 s more.
        let seen =
            Timestamp::now() - EXPORTER_OFFLINE_AFTER + jiff::SignedDuration::from_millis(1500);
        e.status = Some(ExporterStatus {
            devices: Some(vec![]),
            last_seen: Some(metav1::Time(seen)),
            ..Default::default()
        });
        state.store.update_status(&e).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;

        let next = reconcile_once(&state).await.unwrap();
        let stored: Exporter = state.store.get("default", "board").await.unwrap().unwrap();
        assert_eq!(online(&stored).as_deref(), Some("True"));
        // The loop is told to come back when the minute is up, not later.
        let stored_seen = stored.status.unwrap().last_seen.unwrap().0;
        let lapse = stored_seen + EXPORTER_OFFLINE_AFTER;
        let next = next.unwrap();
        assert!(next >= lapse, "{next} vs {lapse}");
        assert!(
            next <= lapse + jiff::SignedDuration::from_millis(2),
            "{next} vs {lapse}"
        );

        // The feed delivers that pass's own write; one more pass takes it in.
        tokio::time::sleep(Duration::from_millis(100)).await;
        reconcile_once(&state).await.unwrap();
        // Nothing changes meanwhile; once the deadline passes, a pass marks it offline.
        let wait = lapse.duration_since(Timestamp::now()) + jiff::SignedDuration::from_millis(100);
        tokio::time::sleep(Duration::try_from(wait).unwrap()).await;
        reconcile_once(&state).await.unwrap();
        let stored: Exporter = state.store.get("default", "board").await.unwrap().unwrap();
        assert_eq!(online(&stored).as_deref(), Some("False"));
        let status = stored.status.unwrap();
        assert_eq!(status.exporter_status, Some(ExporterStatusValue::Offline));
    }

    /// One Lease status write: the lease's name, its exporter, whether it ended.
    type LeaseWrite = (String, Option<String>, bool);

    /// One batch call: the kind, the call, how many objects.
    type BatchCall = (String, &'static str, usize);

    /// A store that writes down every Lease status it is asked to write (name, exporter,
    /// ended), every batch call (kind, call, objects) and the names every Lease list
    /// returned, and refuses the status writes of one lease with a conflict on demand. Its
    /// watch is not synchronous (as on Kubernetes), so a pass lists.
    #[derive(Clone)]
    struct Recording {
        inner: SqliteStore,
        writes: Arc<std::sync::Mutex<Vec<LeaseWrite>>>,
        conflict_on: Arc<std::sync::Mutex<Option<String>>>,
        batches: Arc<std::sync::Mutex<Vec<BatchCall>>>,
        lease_lists: Arc<std::sync::Mutex<Vec<Vec<String>>>>,
    }

    impl Recording {
        async fn open(dir: &std::path::Path) -> Self {
            Recording {
                inner: SqliteStore::open(dir).await.unwrap(),
                writes: Arc::default(),
                conflict_on: Arc::default(),
                batches: Arc::default(),
                lease_lists: Arc::default(),
            }
        }
    }

    impl Store for Recording {
        async fn get<K: crate::store::StoreObject>(
            &self,
            namespace: &str,
            name: &str,
        ) -> Result<Option<K>, StoreError> {
            self.inner.get(namespace, name).await
        }
        async fn list<K: crate::store::StoreObject>(
            &self,
            namespace: Option<&str>,
            selector: &LabelSelector,
            params: &ListParams,
        ) -> Result<crate::store::ObjectList<K>, StoreError> {
            let list = self.inner.list::<K>(namespace, selector, params).await?;
            if K::kind(&()) == "Lease" && K::group(&()) == "jumpstarter.dev" {
                let names = list
                    .items
                    .iter()
                    .map(|o| o.meta().name.clone().unwrap_or_default());
                self.lease_lists.lock().unwrap().push(names.collect());
            }
            Ok(list)
        }
        async fn create<K: crate::store::StoreObject>(&self, o: &K) -> Result<K, StoreError> {
            self.inner.create(o).await
        }
        async fn update<K: crate::store::StoreObject>(&self, o: &K) -> Result<K, StoreError> {
            self.inner.update(o).await
        }
        async fn update_status<K: crate::store::StoreObject>(
            &self,
            o: &K,
        ) -> Result<K, StoreError> {
            if K::kind(&()) == "Lease" && K::group(&()) == "jumpstarter.dev" {
                let v = serde_json::to_value(o).unwrap();
                let name = v["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if self.conflict_on.lock().unwrap().as_deref() == Some(name.as_str()) {
                    return Err(StoreError::Conflict {
                        kind: "Lease".into(),
                        namespace: "default".into(),
                        name,
                        given: "1".into(),
                        current: "2".into(),
                    });
                }
                let exporter = v["status"]["exporterRef"]["name"]
                    .as_str()
                    .map(str::to_owned);
                let ended = v["status"]["ended"].as_bool().unwrap_or(false);
                self.writes.lock().unwrap().push((name, exporter, ended));
            }
            self.inner.update_status(o).await
        }
        async fn update_status_many<K: crate::store::StoreObject>(
            &self,
            objects: Vec<K>,
        ) -> Result<Vec<Result<K, StoreError>>, StoreError> {
            let call = (
                K::kind(&()).to_string(),
                "update_status_many",
                objects.len(),
            );
            self.batches.lock().unwrap().push(call);
            let mut out = Vec::new();
            for o in &objects {
                out.push(self.update_status(o).await);
            }
            Ok(out)
        }
        async fn update_many<K: crate::store::StoreObject>(
            &self,
            objects: Vec<K>,
        ) -> Result<Vec<Result<K, StoreError>>, StoreError> {
            let call = (K::kind(&()).to_string(), "update_many", objects.len());
            self.batches.lock().unwrap().push(call);
            let mut out = Vec::new();
            for o in &objects {
                out.push(self.update(o).await);
            }
            Ok(out)
        }
        async fn delete<K: crate::store::StoreObject>(
            &self,
            namespace: &str,
            name: &str,
            resource_version: Option<&str>,
        ) -> Result<K, StoreError> {
            self.inner.delete(namespace, name, resource_version).await
        }
        async fn watch<K: crate::store::StoreObject>(
            &self,
            namespace: Option<&str>,
            since: Option<&str>,
        ) -> Result<crate::store::WatchStream<K>, StoreError> {
            self.inner.watch(namespace, since).await
        }
    }

    /// A [`Recording`] store in `dir` with client `alice` and the exporters `names`, each
    /// labelled `label`, registered and just seen; and the controller state over it.
    async fn recording_lab(
        dir: &std::path::Path,
        names: &[String],
        label: (&str, &str),
    ) -> (Recording, Arc<ControllerState<Recording>>) {
        let store = Recording::open(dir).await;
        let state = state_over(store.clone());
        let mut c = crate::objects::Client::new("alice", Default::default());
        c.metadata.namespace = Some("default".into());
        store.create(&c).await.unwrap();
        for name in names {
            let mut e = Exporter::new(name, ExporterSpec::default());
            e.metadata.namespace = Some("default".into());
            e.metadata.labels = Some([(label.0.to_string(), label.1.to_string())].into());
            let mut e = store.create(&e).await.unwrap();
            e.status = Some(ExporterStatus {
                devices: Some(vec![]),
                last_seen: Some(metav1::Time(Timestamp::now())),
                ..Default::default()
            });
            store.update_status(&e).await.unwrap();
        }
        (store, state)
    }

    /// Issue 27: the grants of a pass go to the store in one status call and one labels and
    /// owners call, whatever their number (one at a time, 1,000 grants took 2,000 writes
    /// taking turns on the store's writer), and the exporters' `leaseRef`s in one more.
    #[tokio::test]
    async fn a_pass_writes_its_grants_in_one_call_per_kind_of_write() {
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<String> = (0..20).map(|i| format!("board-{i:02}")).collect();
        let (store, state) = recording_lab(dir.path(), &names, ("pool", "x")).await;
        // A first pass settles the exporters' conditions.
        reconcile_once(&state).await.unwrap();
        for i in 0..20 {
            store
                .create(&lease_on(&format!("lease-{i:02}"), "pool=x"))
                .await
                .unwrap();
        }
        store.batches.lock().unwrap().clear();
        reconcile_once(&state).await.unwrap();
        let batches = store.batches.lock().unwrap().clone();
        assert_eq!(
            batches,
            vec![
                ("Lease".to_string(), "update_status_many", 20),
                ("Lease".to_string(), "update_many", 20),
                ("Exporter".to_string(), "update_status_many", 20),
            ]
        );
        let mut held = BTreeMap::new();
        for i in 0..20 {
            let l: Lease = store
                .get("default", &format!("lease-{i:02}"))
                .await
                .unwrap()
                .unwrap();
            let exporter = l.assigned_exporter().unwrap().to_string();
            assert!(
                l.metadata
                    .owner_references
                    .as_ref()
                    .is_some_and(|o| o.iter().any(|o| o.name == exporter)),
                "{l:?}"
            );
            held.insert(exporter, l.metadata.name.clone().unwrap());
        }
        assert_eq!(held.len(), 20, "an exporter granted twice: {held:?}");
        for (exporter, lease) in held {
            let e: Exporter = store.get("default", &exporter).await.unwrap().unwrap();
            let lease_ref = e.status.and_then(|s| s.lease_ref).map(|r| r.name);
            assert_eq!(lease_ref.as_deref(), Some(lease.as_str()));
        }
    }

    /// Issue 27: in the embedded store a grant is one write of its lease (status, labels and
    /// owner reference together), not two: one event per lease for the watchers, too.
    #[tokio::test]
    async fn the_embedded_store_writes_a_grant_as_one_lease_write() {
        use futures::{FutureExt, StreamExt};
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<String> = (0..5).map(|i| format!("board-{i}")).collect();
        let (recording, _) = recording_lab(dir.path(), &names, ("pool", "x")).await;
        let store = recording.inner.clone();
        let state = state_over(store.clone());
        reconcile_once(&state).await.unwrap();
        for i in 0..5 {
            store
                .create(&lease_on(&format!("lease-{i}"), "pool=x"))
                .await
                .unwrap();
        }
        let mut events = store.watch::<Lease>(None, None).await.unwrap();
        reconcile_once(&state).await.unwrap();
        let mut writes: BTreeMap<String, usize> = BTreeMap::new();
        while let Some(Some(event)) = events.next().now_or_never() {
            let event = event.unwrap();
            assert!(matches!(event, crate::store::WatchEvent::Modified(_)));
            let lease = event.object();
            assert!(lease.assigned_exporter().is_some(), "{lease:?}");
            assert!(lease.metadata.owner_references.is_some(), "{lease:?}");
            *writes
                .entry(lease.metadata.name.clone().unwrap())
                .or_default() += 1;
        }
        let want: BTreeMap<String, usize> = (0..5).map(|i| (format!("lease-{i}"), 1)).collect();
        assert_eq!(writes, want);
        // The next pass has nothing to write.
        reconcile_once(&state).await.unwrap();
        let again = events.next().now_or_never();
        assert!(again.is_none(), "{again:?}");
    }

    /// The exporters a pass names come from the view's index when it has one, from the list
    /// otherwise, with the same answer: each named exporter once, none that is not named,
    /// nothing for a name no exporter has.
    #[test]
    fn exporters_named_finds_the_same_through_the_view_and_in_a_list() {
        let exporter = |ns: &str, name: &str| {
            let mut e = Exporter::new(name, ExporterSpec::default());
            e.metadata.namespace = Some(ns.into());
            e.metadata.resource_version = Some("1".into());
            e
        };
        let listed: Vec<Exporter> = (0..50)
            .map(|i| exporter(if i % 2 == 0 { "a" } else { "b" }, &format!("e{i:02}")))
            .collect();
        let view = ExporterView::new(listed.clone());
        let wanted = [
            ("a", "e04"),
            ("b", "e07"),
            ("a", "e04"),
            ("a", "e07"),
            ("a", "gone"),
            ("b", "e49"),
        ];
        let keys = |m: HashMap<(&str, &str), &Exporter>| {
            let mut found: Vec<(String, String, String)> = m
                .into_iter()
                .map(|((ns, name), e)| {
                    let (ens, ename) = meta_key(&e.metadata).unwrap();
                    assert_eq!((ns, name), (ens, ename), "keyed by its own name");
                    (ns.to_string(), name.to_string(), ename.to_string())
                })
                .collect();
            found.sort();
            found
        };
        let want: Vec<(String, String, String)> = [("a", "e04"), ("b", "e07"), ("b", "e49")]
            .iter()
            .map(|(ns, n)| (ns.to_string(), n.to_string(), n.to_string()))
            .collect();
        assert_eq!(keys(exporters_named(wanted, &[], Some(&view))), want);
        assert_eq!(keys(exporters_named(wanted, &listed, None)), want);
        assert!(exporters_named([], &listed, None).is_empty());
    }

    /// An exporter's own `Online=True` report stands while it is online: a pass does not
    /// rewrite it as "Seen" (one more write after every report); it still writes a new
    /// `leaseRef`, and `Online=False` once the exporter is no longer seen.
    #[test]
    fn an_exporters_online_report_is_not_rewritten_while_it_is_online() {
        let now = Timestamp::now();
        let mut e = Exporter::new("e", ExporterSpec::default());
        e.metadata.namespace = Some("default".into());
        let mut status = ExporterStatus {
            last_seen: Some(metav1::Time(now)),
            devices: Some(Vec::new()),
            ..Default::default()
        };
        set_condition(
            &mut status.conditions,
            conditions::REGISTERED,
            true,
            "Register",
            "Exporter registered",
            None,
            now,
        );
        set_condition(
            &mut status.conditions,
            conditions::ONLINE,
            true,
            conditions::REASON_STATUS_REPORTED,
            "Exporter reported status: LeaseReady",
            None,
            now,
        );
        e.status = Some(status);
        let (_, update) = exporter_status_update(&e, None, Some(now), now);
        assert!(update.is_none(), "{update:?}");
        let lease = "l".to_string();
        let (_, update) = exporter_status_update(&e, Some(&lease), Some(now), now);
        let written = update.expect("a new leaseRef is written");
        assert_eq!(
            written.status.and_then(|s| s.lease_ref).map(|r| r.name),
            Some(lease)
        );
        let later = now
            .checked_add(EXPORTER_OFFLINE_AFTER)
            .and_then(|t| t.checked_add(jiff::SignedDuration::from_secs(1)))
            .unwrap();
        let (_, update) = exporter_status_update(&e, None, None, later);
        let offline = update.expect("offline is written");
        let online = offline
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == conditions::ONLINE))
            .unwrap();
        assert_eq!(online.status, conditions::FALSE);
    }

    fn lease_on(name: &str, selector: &str) -> Lease {
        let mut l = Lease::new(
            name,
            crate::objects::LeaseSpec {
                client_ref: LocalObjectReference {
                    name: "alice".into(),
                },
                duration: Some(crate::GoDuration::from_secs(600)),
                selector: LabelSelector::parse(selector).unwrap().to_k8s(),
                ..Default::default()
            },
        );
        l.metadata.namespace = Some("default".into());
        l
    }

    /// Leases by name and resourceVersion, to compare what a pass sees with a list.
    fn versions(leases: Vec<Lease>) -> Vec<(String, Option<String>)> {
        leases
            .into_iter()
            .map(|l| (l.metadata.name.unwrap(), l.metadata.resource_version))
            .collect()
    }

    /// The leases as a list gives them (see [`versions`]).
    async fn listed_leases(store: &SqliteStore) -> Vec<(String, Option<String>)> {
        versions(list_all::<_, Lease>(store).await.unwrap())
    }

    /// Three leases: one live, one ended as a pass leaves it (status and label), one ended
    /// without the label (as an older controller left it).
    async fn live_and_ended_leases<S: Store>(store: &S) {
        for (name, ended, labelled) in [
            ("live", false, false),
            ("ended", true, true),
            ("ended-unlabelled", true, false),
        ] {
            let mut l = Lease::new(name, Default::default());
            l.metadata.namespace = Some("default".into());
            if labelled {
                l.metadata.labels =
                    Some([(LEASE_ENDED_LABEL.to_string(), "true".to_string())].into());
            }
            let mut l = store.create(&l).await.unwrap();
            l.status = Some(crate::objects::LeaseStatus {
                ended,
                ..Default::default()
            });
            store.update_status(&l).await.unwrap();
        }
    }

    fn names(leases: &[Lease]) -> Vec<String> {
        leases
            .iter()
            .map(|l| l.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[tokio::test]
    async fn a_pass_works_on_live_leases_only_from_the_view_and_from_a_list() {
        // The embedded store: from the view.
        let (_dir, state) = state().await;
        live_and_ended_leases(&state.store).await;
        let leases = live_leases(&state.store, &state.lease_view).await.unwrap();
        assert_eq!(names(&leases), ["live"]);
        assert!(state.lease_view.lock().await.is_some(), "no view was kept");

        // A store whose watch is not synchronous (Kubernetes): listed, and the ended label
        // is left out by the store itself, so a lab's history is not sent on every pass.
        let dir = tempfile::tempdir().unwrap();
        let store = Recording::open(dir.path()).await;
        live_and_ended_leases(&store).await;
        let lists = store.lease_lists.clone();
        let state = state_over(store);
        let leases = live_leases(&state.store, &state.lease_view).await.unwrap();
        assert_eq!(names(&leases), ["live"]);
        assert_eq!(
            *lists.lock().unwrap(),
            [vec!["ended-unlabelled".to_string(), "live".to_string()]],
            "the list should leave out the leases labelled ended"
        );

        // A whole pass over them changes none of the ended leases.
        reconcile_once(&state).await.unwrap();
        let stored: Lease = state
            .store
            .get("default", "ended-unlabelled")
            .await
            .unwrap()
            .unwrap();
        assert!(stored.is_ended());
        assert!(stored.metadata.labels.unwrap_or_default().is_empty());
    }

    /// Issue 27: with the embedded store a pass takes its leases from the lease view, fed by
    /// the watch, instead of listing them; it must see what a list sees right after any
    /// write returned (creates, changes, deletes), and list again when it fell behind.
    #[tokio::test]
    async fn the_lease_view_sees_what_a_list_sees_and_relists_when_it_fell_behind() {
        let (_dir, state) = state().await;
        let store = &state.store;
        assert!(store.watch_is_synchronous());
        let seen = versions;
        assert!(
            current(&state.store, &state.lease_view)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(state.lease_view.lock().await.is_some(), "no view was kept");
        for i in 0..5 {
            store
                .create(&lease_on(&format!("l-{i}"), "a=b"))
                .await
                .unwrap();
        }
        assert_eq!(
            seen(current(&state.store, &state.lease_view).await.unwrap()),
            listed_leases(store).await
        );
        let mut changed: Lease = store.get("default", "l-2").await.unwrap().unwrap();
        changed.spec.release = true;
        store.update(&changed).await.unwrap();
        store.delete::<Lease>("default", "l-3", None).await.unwrap();
        let now = seen(current(&state.store, &state.lease_view).await.unwrap());
        assert_eq!(now, listed_leases(store).await);
        assert_eq!(now.len(), 4);
        // More events than tokio lets a task take from a channel in one go (its cooperative
        // budget, 128) but fewer than the watch holds: the view drains them all, or it is
        // stale without knowing.
        for i in 0..300 {
            store
                .create(&lease_on(&format!("m-{i}"), "a=b"))
                .await
                .unwrap();
        }
        let now = seen(current(&state.store, &state.lease_view).await.unwrap());
        assert_eq!(now.len(), 304);
        assert_eq!(now, listed_leases(store).await);
        // More changes than a watch holds between two passes: the view lists again.
        let mut l: Lease = store.get("default", "l-0").await.unwrap().unwrap();
        for i in 0..crate::store::WATCH_BUFFER + 10 {
            l.spec.tags.insert("n".into(), i.to_string());
            l = store.update(&l).await.unwrap();
        }
        store.create(&lease_on("l-late", "a=b")).await.unwrap();
        let now = seen(current(&state.store, &state.lease_view).await.unwrap());
        assert_eq!(now, listed_leases(store).await);
        assert!(now.iter().any(|(n, _)| n == "l-late"));
        // And follows the watch again after that.
        store
            .delete::<Lease>("default", "l-late", None)
            .await
            .unwrap();
        assert_eq!(
            seen(current(&state.store, &state.lease_view).await.unwrap()),
            listed_leases(store).await
        );
    }

    /// Issue 27: the access policies and the clients' labels come from views too (embedded
    /// store); a policy or a client label written between two passes decides the next one.
    #[tokio::test]
    async fn policies_and_client_labels_written_between_passes_decide_the_next_pass() {
        use crate::objects::{ExporterAccessPolicySpec, Policy, PolicyFrom};
        let dir = tempfile::tempdir().unwrap();
        let (recording, _) = recording_lab(dir.path(), &["board-0".into()], ("pool", "x")).await;
        let store = recording.inner.clone();
        let state = state_over(store.clone());
        // A first pass keeps its views (no policies yet).
        reconcile_once(&state).await.unwrap();
        assert!(
            state.policy_view.lock().await.is_some(),
            "no policy view was kept"
        );
        let mut p = ExporterAccessPolicy::new(
            "qa-only",
            ExporterAccessPolicySpec {
                exporter_selector: LabelSelector::parse("pool=x").unwrap().to_k8s(),
                policies: vec![Policy {
                    description: "qa".into(),
                    priority: 1,
                    from: vec![PolicyFrom {
                        client_selector: LabelSelector::parse("team=qa").unwrap().to_k8s(),
                    }],
                    maximum_duration: None,
                    spot_access: false,
                }],
            },
        );
        p.metadata.namespace = Some("default".into());
        store.create(&p).await.unwrap();
        let lease_status = |name: &'static str| {
            let store = store.clone();
            async move {
                let l: Lease = store.get("default", name).await.unwrap().unwrap();
                l.status.unwrap_or_default()
            }
        };
        // alice has no labels: the policy written after the first pass refuses her.
        store.create(&lease_on("refused", "pool=x")).await.unwrap();
        reconcile_once(&state).await.unwrap();
        let st = lease_status("refused").await;
        assert!(st.ended && st.exporter_ref.is_none(), "{st:?}");
        let cond = find_condition(&st.conditions, c::UNSATISFIABLE).unwrap();
        assert_eq!(cond.reason, c::REASON_NO_ACCESS);
        // Her label, written now, lets the next lease through.
        let mut alice: Client = store.get("default", "alice").await.unwrap().unwrap();
        alice.metadata.labels = Some([("team".to_string(), "qa".to_string())].into());
        store.update(&alice).await.unwrap();
        store.create(&lease_on("granted", "pool=x")).await.unwrap();
        reconcile_once(&state).await.unwrap();
        let st = lease_status("granted").await;
        assert_eq!(st.exporter_ref.map(|r| r.name).as_deref(), Some("board-0"));
        assert_eq!(st.priority, 1);
        // Deleting the policy is seen as well: a client without the label is served.
        store
            .delete::<ExporterAccessPolicy>("default", "qa-only", None)
            .await
            .unwrap();
        assert!(
            current(&store, &state.policy_view)
                .await
                .unwrap()
                .is_empty(),
            "the deleted policy is still in the view"
        );
    }

    /// Issue 27: a pass records the client of each lease holding an exporter before the
    /// exporter hears of it, so that the Status message names the client without reading
    /// the lease; an ended lease is dropped, a transferred one forgotten.
    #[tokio::test]
    async fn a_pass_records_the_client_of_each_held_lease() {
        let dir = tempfile::tempdir().unwrap();
        let (store, state) = recording_lab(dir.path(), &["board".into()], ("board", "x")).await;
        store.create(&lease_on("held", "board=x")).await.unwrap();
        store.create(&lease_on("waiting", "board=x")).await.unwrap();
        reconcile_once(&state).await.unwrap();
        let holder = ["held", "waiting"]
            .into_iter()
            .find(|n| state.lease_client("default", n).is_some())
            .expect("no lease's client recorded");
        let other = if holder == "held" { "waiting" } else { "held" };
        assert_eq!(
            state.lease_client("default", holder).as_deref(),
            Some("alice")
        );
        assert_eq!(
            state.lease_client("default", other),
            None,
            "not holding an exporter"
        );
        state.forget_lease_client("default", holder);
        assert_eq!(state.lease_client("default", holder), None);
        let mut l: Lease = store.get("default", holder).await.unwrap().unwrap();
        l.spec.release = true;
        store.update(&l).await.unwrap();
        reconcile_once(&state).await.unwrap();
        reconcile_once(&state).await.unwrap();
        assert_eq!(
            state.lease_client("default", holder),
            None,
            "an ended lease"
        );
        assert_eq!(
            state.lease_client("default", other).as_deref(),
            Some("alice")
        );
    }

    /// Issue 29: a pass that ends one lease and grants its exporter to another writes the end
    /// first, so the store never names the exporter in two live leases, not even between the
    /// two writes (the new lease's name sorts first here); when the end cannot be written
    /// (conflict), the grant waits for a later pass.
    #[tokio::test]
    async fn an_end_is_written_before_the_grant_of_the_same_exporter() {
        let dir = tempfile::tempdir().unwrap();
        let (store, state) = recording_lab(dir.path(), &["board".into()], ("board", "x")).await;

        let live_pairs = |writes: &[(String, Option<String>, bool)], names: &[&str]| {
            // Replays the writes from the state after the first pass: `names[0]` holds board.
            let mut live: BTreeMap<String, bool> = names
                .iter()
                .map(|n| (n.to_string(), *n == names[0]))
                .collect();
            for (name, exporter, ended) in writes {
                live.insert(name.clone(), exporter.is_some() && !ended);
                assert!(
                    live.values().filter(|l| **l).count() <= 1,
                    "board named by two live leases after the writes {writes:?}"
                );
            }
        };

        for (old, new, conflict) in [("z-old", "a-new", false), ("z-old2", "a-new2", true)] {
            store.create(&lease_on(old, "board=x")).await.unwrap();
            reconcile_once(&state).await.unwrap();
            let held: Lease = store.get("default", old).await.unwrap().unwrap();
            assert_eq!(held.assigned_exporter(), Some("board"), "{held:?}");
            store.create(&lease_on(new, "board=x")).await.unwrap();
            reconcile_once(&state).await.unwrap();
            let mut released: Lease = store.get("default", old).await.unwrap().unwrap();
            released.spec.release = true;
            store.update(&released).await.unwrap();
            store.writes.lock().unwrap().clear();
            if conflict {
                *store.conflict_on.lock().unwrap() = Some(old.to_string());
                reconcile_once(&state).await.unwrap();
                let waiting: Lease = store.get("default", new).await.unwrap().unwrap();
                assert_eq!(
                    waiting.assigned_exporter(),
                    None,
                    "granted while the old lease's end was not written"
                );
                *store.conflict_on.lock().unwrap() = None;
            }
            reconcile_once(&state).await.unwrap();
            let writes = store.writes.lock().unwrap().clone();
            live_pairs(&writes, &[old, new]);
            let granted: Lease = store.get("default", new).await.unwrap().unwrap();
            assert_eq!(granted.assigned_exporter(), Some("board"), "{writes:?}");
            let ended: Lease = store.get("default", old).await.unwrap().unwrap();
            assert!(ended.is_ended());
            let mut done = granted;
            done.spec.release = true;
            store.update(&done).await.unwrap();
            reconcile_once(&state).await.unwrap();
        }
    }
}
