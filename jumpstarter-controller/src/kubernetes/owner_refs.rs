//! Owner references as upstream's reconcilers set them (§4.3 of the protocol notes):
//!
//! - a Lease gets a controller reference to the Exporter assigned to it (upstream's lease
//!   reconciler calls `SetControllerReference(exporter, lease)` whenever `status.exporterRef`
//!   is set), so that on a cluster deleting an Exporter garbage-collects its leases;
//! - a credential Secret gets one to its Client or Exporter ([`crate::store::credentials`]).
//!
//! Nothing else is owned: CreateLease gives a Lease no reference to its Client. The references
//! are plain metadata, so the SQLite store keeps them as well, but only a Kubernetes API server
//! acts on them (its garbage collector).

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::objects::{Exporter, Lease, LeaseStatus};
use crate::store::Store;
use crate::store::controller_reference;

/// How many times [`sync_lease_owners`] re-reads a lease after a conflicting write before it
/// leaves it to the next pass.
const CONFLICT_RETRIES: usize = 3;

/// Setting a controller reference failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnerRefError {
    /// Another object already is the controller (Kubernetes allows only one).
    #[error("{object} is already controlled by {owner}, not {wanted}")]
    AlreadyControlled {
        /// The owned object (`Lease lab/l1`).
        object: String,
        /// The present controller (`Exporter board-1`).
        owner: String,
        /// The owner that was to be set.
        wanted: String,
    },
}

/// The API group of an `apiVersion` (`""` for the core group's `v1`).
fn group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

/// Whether two references name the same object (group, kind and name, as Kubernetes compares
/// them; the version and uid may differ).
fn same_object(a: &OwnerReference, b: &OwnerReference) -> bool {
    group(&a.api_version) == group(&b.api_version) && a.kind == b.kind && a.name == b.name
}

/// Adds `owner` as the controller of the object with metadata `meta` (of kind `kind`, for
/// errors), replacing a reference to the same object (e.g. with an old uid). Fails, leaving
/// `meta` unchanged, when another object is the controller. Returns whether `meta` changed.
pub fn set_controller_reference(
    kind: &str,
    meta: &mut ObjectMeta,
    owner: OwnerReference,
) -> Result<bool, OwnerRefError> {
    if let Some(other) = meta
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true) && !same_object(r, &owner))
    {
        let err = OwnerRefError::AlreadyControlled {
            object: format!(
                "{kind} {}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            ),
            owner: format!("{} {}", other.kind, other.name),
            wanted: format!("{} {}", owner.kind, owner.name),
        };
        return Err(err);
    }
    let refs = meta.owner_references.get_or_insert_with(Vec::new);
    match refs.iter_mut().find(|r| same_object(r, &owner)) {
        Some(r) if *r == owner => Ok(false),
        Some(r) => {
            *r = owner;
            Ok(true)
        }
        None => {
            refs.push(owner);
            Ok(true)
        }
    }
}

/// Makes the exporter that `status` assigns (looked up by name in `exporters`, within the
/// lease's namespace) the controller of `lease`. Returns whether `lease` changed; `Ok(false)`
/// when nothing is assigned or the exporter is not among `exporters` (e.g. deleted).
pub fn set_lease_owner(
    lease: &mut Lease,
    status: &LeaseStatus,
    exporters: &HashMap<(&str, &str), &Exporter>,
) -> Result<bool, OwnerRefError> {
    match wanted_lease_owner(lease, status, exporters) {
        Some(owner) => set_controller_reference("Lease", &mut lease.metadata, owner),
        None => Ok(false),
    }
}

/// The controller reference `status` asks `lease` to have: to its assigned exporter, looked
/// up in `exporters` within the lease's namespace (`None`: nothing assigned, or not found).
fn wanted_lease_owner(
    lease: &Lease,
    status: &LeaseStatus,
    exporters: &HashMap<(&str, &str), &Exporter>,
) -> Option<OwnerReference> {
    let namespace = lease.metadata.namespace.as_deref()?;
    let assigned = status.exporter_ref.as_ref()?;
    exporters
        .get(&(namespace, assigned.name.as_str()))
        .and_then(|e| controller_reference(*e))
}

/// Whether `lease` already holds exactly the reference [`set_lease_owner`] would give it (or
/// there is none to give).
fn has_lease_owner(
    lease: &Lease,
    status: &LeaseStatus,
    exporters: &HashMap<(&str, &str), &Exporter>,
) -> bool {
    wanted_lease_owner(lease, status, exporters).is_none_or(|owner| {
        lease
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|r| *r == owner)
    })
}

/// Gives every lease with an assigned exporter its controller reference to that exporter,
/// writing only the leases that lack it. `leases` are the stored leases (for their metadata);
/// `statuses` the latest (namespace, name, status) of each, as just written; `exporters` at
/// least the exporters those statuses name, by (namespace, name). Failures are
/// logged, never returned: an owner reference must not stop scheduling. Returns whether a
/// write conflicted (look again soon).
pub async fn sync_lease_owners<'a, S: Store>(
    store: &S,
    leases: impl IntoIterator<Item = &'a Lease>,
    statuses: &[(&str, &str, &LeaseStatus)],
    exporters: &HashMap<(&str, &str), &Exporter>,
) -> bool {
    if statuses.iter().all(|(_, _, st)| st.exporter_ref.is_none()) {
        return false;
    }
    let leases: HashMap<(&str, &str), &Lease> = leases
        .into_iter()
        .filter_map(|l| Some((crate::objects::meta_key(&l.metadata)?, l)))
        .collect();
    let mut retry = false;
    for &(namespace, name, status) in statuses {
        if status.exporter_ref.is_none() {
            continue;
        }
        let Some(stored) = leases.get(&(namespace, name)) else {
            continue;
        };
        // Checked on the listed copy first, so that only leases that need it are re-read;
        // the common case, a lease that has it, without copying the lease.
        if has_lease_owner(stored, status, exporters) {
            continue;
        }
        let mut probe = (*stored).clone();
        match set_lease_owner(&mut probe, status, exporters) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(e) => {
                tracing::warn!(
                    "lease owner reference not set: {e}",
                    e = jumpstarter_core::error_chain(&e)
                );
                continue;
            }
        }
        retry |= write_lease_owner(store, namespace, name, status, exporters).await;
    }
    retry
}

/// Re-reads the lease, sets its owner and writes it; returns whether conflicts persisted.
async fn write_lease_owner<S: Store>(
    store: &S,
    namespace: &str,
    name: &str,
    status: &LeaseStatus,
    exporters: &HashMap<(&str, &str), &Exporter>,
) -> bool {
    for _ in 0..CONFLICT_RETRIES {
        let mut lease: Lease = match store.get(namespace, name).await {
            Ok(Some(l)) => l,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(
                    "lease owner reference not set: {e}",
                    e = jumpstarter_core::error_chain(&e)
                );
                return false;
            }
        };
        match set_lease_owner(&mut lease, status, exporters) {
            Ok(true) => {}
            Ok(false) => return false,
            Err(e) => {
                tracing::warn!(
                    "lease owner reference not set: {e}",
                    e = jumpstarter_core::error_chain(&e)
                );
                return false;
            }
        }
        match store.update(&lease).await {
            Ok(_) => return false,
            Err(e) if e.is_conflict() => continue,
            Err(e) => {
                tracing::warn!(
                    "lease owner reference not set: {e}",
                    e = jumpstarter_core::error_chain(&e)
                );
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::LocalObjectReference;

    use super::*;
    use crate::objects::{Client, ClientSpec, ExporterSpec, LeaseSpec};
    use crate::store::SqliteStore;

    fn exporter(name: &str, uid: &str) -> Exporter {
        let mut e = Exporter::new(name, ExporterSpec::default());
        e.metadata.namespace = Some("lab".into());
        e.metadata.uid = Some(uid.into());
        e
    }

    fn assigned(name: &str) -> LeaseStatus {
        LeaseStatus {
            exporter_ref: Some(LocalObjectReference { name: name.into() }),
            ..LeaseStatus::default()
        }
    }

    fn index(exporters: &[Exporter]) -> HashMap<(&str, &str), &Exporter> {
        exporters
            .iter()
            .map(|e| {
                (
                    (
                        e.metadata.namespace.as_deref().unwrap(),
                        e.metadata.name.as_deref().unwrap(),
                    ),
                    e,
                )
            })
            .collect()
    }

    fn lease(name: &str) -> Lease {
        let mut l = Lease::new(name, LeaseSpec::default());
        l.metadata.namespace = Some("lab".into());
        l
    }

    #[test]
    fn lease_is_controlled_by_its_exporter() {
        let exporters = vec![exporter("board-1", "u1"), exporter("board-2", "u2")];
        let mut l = lease("l1");
        assert!(set_lease_owner(&mut l, &assigned("board-2"), &index(&exporters)).unwrap());
        let refs = l.metadata.owner_references.clone().unwrap();
        assert_eq!(
            refs,
            vec![OwnerReference {
                api_version: "jumpstarter.dev/v1alpha1".into(),
                kind: "Exporter".into(),
                name: "board-2".into(),
                uid: "u2".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]
        );
        // Idempotent.
        assert!(!set_lease_owner(&mut l, &assigned("board-2"), &index(&exporters)).unwrap());
        assert_eq!(l.metadata.owner_references.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn unassigned_or_unknown_exporters_set_nothing() {
        let exporters = vec![exporter("board-1", "u1")];
        let mut l = lease("l1");
        assert!(!set_lease_owner(&mut l, &LeaseStatus::default(), &index(&exporters)).unwrap());
        assert!(!set_lease_owner(&mut l, &assigned("gone"), &index(&exporters)).unwrap());
        // Another namespace's exporter of the same name is not ours.
        let mut other = exporter("board-1", "u9");
        other.metadata.namespace = Some("elsewhere".into());
        let mut l2 = lease("l2");
        l2.metadata.namespace = Some("third".into());
        assert!(!set_lease_owner(&mut l2, &assigned("board-1"), &index(&[other])).unwrap());
        assert_eq!(l.metadata.owner_references, None);
        assert_eq!(l2.metadata.owner_references, None);
        // Not stored (no uid): no reference can be made.
        let mut unsaved = exporter("board-3", "x");
        unsaved.metadata.uid = None;
        assert!(!set_lease_owner(&mut l, &assigned("board-3"), &index(&[unsaved])).unwrap());
    }

    #[test]
    fn recreated_exporter_replaces_the_stale_uid_and_keeps_other_owners() {
        let mut l = lease("l1");
        let c = {
            let mut c = Client::new("alice", ClientSpec::default());
            c.metadata.uid = Some("c1".into());
            c
        };
        let mut plain = controller_reference(&c).unwrap();
        plain.controller = None;
        l.metadata.owner_references = Some(vec![plain.clone()]);
        let old = vec![exporter("board-1", "old")];
        assert!(set_lease_owner(&mut l, &assigned("board-1"), &index(&old)).unwrap());
        let new = vec![exporter("board-1", "new")];
        assert!(set_lease_owner(&mut l, &assigned("board-1"), &index(&new)).unwrap());
        let refs = l.metadata.owner_references.unwrap();
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[0], plain);
        assert_eq!(
            (refs[1].name.as_str(), refs[1].uid.as_str()),
            ("board-1", "new")
        );
    }

    #[test]
    fn a_second_controller_is_refused_and_nothing_changes() {
        let mut l = lease("l1");
        let exporters = vec![exporter("board-1", "u1"), exporter("board-2", "u2")];
        set_lease_owner(&mut l, &assigned("board-1"), &index(&exporters)).unwrap();
        let before = l.clone();
        let err = set_lease_owner(&mut l, &assigned("board-2"), &index(&exporters)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Lease lab/l1 is already controlled by Exporter board-1, not Exporter board-2"
        );
        assert_eq!(l, before);
        // Also when the object had no references list before.
        let mut meta = ObjectMeta::default();
        let mut a = controller_reference(&exporters[0]).unwrap();
        set_controller_reference("Lease", &mut meta, a.clone()).unwrap();
        a.name = "board-2".into();
        assert!(set_controller_reference("Lease", &mut meta, a).is_err());
        assert_eq!(meta.owner_references.unwrap().len(), 1);
    }

    #[test]
    fn references_compare_by_group_not_version() {
        let e = exporter("board-1", "u1");
        let mut meta = ObjectMeta::default();
        let mut old_version = controller_reference(&e).unwrap();
        old_version.api_version = "jumpstarter.dev/v1alpha0".into();
        set_controller_reference("Lease", &mut meta, old_version).unwrap();
        assert!(
            set_controller_reference("Lease", &mut meta, controller_reference(&e).unwrap())
                .unwrap()
        );
        let refs = meta.owner_references.unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].api_version, "jumpstarter.dev/v1alpha1");
        assert_eq!(group("v1"), "");
    }

    #[tokio::test]
    async fn sync_writes_only_leases_that_lack_their_owner() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).await.unwrap();
        let e = store.create(&exporter("board-1", "ignored")).await.unwrap();
        let l1 = store.create(&lease("l1")).await.unwrap();
        let l2 = store.create(&lease("l2")).await.unwrap();
        let leases = vec![l1.clone(), l2.clone()];
        let (s1, s2) = (assigned("board-1"), LeaseStatus::default());
        let statuses = [("lab", "l1", &s1), ("lab", "l2", &s2)];
        let retry =
            sync_lease_owners(&store, &leases, &statuses, &index(std::slice::from_ref(&e))).await;
        assert!(!retry);
        let stored: Lease = store.get("lab", "l1").await.unwrap().unwrap();
        let refs = stored.metadata.owner_references.clone().unwrap();
        assert_eq!(refs[0].uid, e.metadata.uid.clone().unwrap());
        assert_eq!(refs[0].kind, "Exporter");
        let untouched: Lease = store.get("lab", "l2").await.unwrap().unwrap();
        assert_eq!(
            untouched.metadata.resource_version,
            l2.metadata.resource_version
        );
        // A second pass over the updated list writes nothing.
        let leases = vec![stored.clone(), untouched];
        sync_lease_owners(&store, &leases, &statuses, &index(std::slice::from_ref(&e))).await;
        let again: Lease = store.get("lab", "l1").await.unwrap().unwrap();
        assert_eq!(
            again.metadata.resource_version,
            stored.metadata.resource_version
        );
        // A stale listed copy is re-read, not written blindly; a deleted lease is skipped.
        let stale = vec![l1];
        store.delete::<Lease>("lab", "l1", None).await.unwrap();
        assert!(!sync_lease_owners(&store, &stale, &statuses, &index(&[e])).await);
        assert!(store.get::<Lease>("lab", "l1").await.unwrap().is_none());
    }
}
