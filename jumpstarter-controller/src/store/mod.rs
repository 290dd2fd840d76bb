//! Where the controller keeps its objects (Client, Exporter, Lease, ExporterAccessPolicy).
//!
//! [`Store`] is the interface the services and the scheduler use; it follows Kubernetes API
//! semantics so that a Kubernetes backend can implement it too:
//!
//! - objects are keyed by (kind, namespace, name); every object is namespaced;
//! - `create` sets `uid`, `resourceVersion`, `creationTimestamp` and `generation = 1`, and
//!   drops `status` (all kinds have a status subresource, whose content only
//!   [`Store::update_status`] writes);
//! - `update` needs the `resourceVersion` the caller read (optimistic concurrency): a stale
//!   one fails with [`StoreError::Conflict`] and the caller re-reads and retries. It keeps the
//!   stored `status`, `uid`, `creationTimestamp`, and bumps `generation` when anything outside
//!   `metadata` and `status` changed. An update that changes nothing is not written;
//! - `update_status` replaces only `status`, with the same `resourceVersion` check;
//! - `resourceVersion` is a store-wide revision counter (like etcd's): it increases with every
//!   write of any object, so a list's `resource_version` can be handed to [`Store::watch`] to
//!   receive exactly the changes after that list;
//! - a `watch` delivers Added/Modified/Deleted events of one kind (optionally one namespace)
//!   in commit order through a bounded buffer. Writers never wait for watchers: a watcher that
//!   falls more than [`Store::watch_buffer`] events behind gets one [`StoreError::WatchLagged`] and
//!   its stream ends; it must list again and watch from the new list's `resource_version`
//!   (the Kubernetes "410 Gone, relist" rule).
//!
//! The trait has generic methods, so it is not object-safe: write services generic over
//! `S: Store` (backends are cheap to clone handles).
//!
//! Backends: [`SqliteStore`] (embedded, the default) and, with the `kubernetes` feature,
//! `KubeStore` (the CRDs of a cluster; `KubeStore::from_env()`); the `test-util` feature adds
//! an in-memory API server for tests (`testing::FakeApiServer`). [`credentials`] keeps tokens in Secrets as upstream does.

pub(crate) mod backup;
pub mod credentials;
pub(crate) mod data_dir;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
pub(crate) mod pid_lock;
pub mod sqlite;

use jumpstarter_core::{Because, BoxError};
use std::{future::Future, pin::Pin};

use futures::Stream;
use k8s_openapi::NamespaceResourceScope;
use serde::{Serialize, de::DeserializeOwned};

#[cfg(feature = "kubernetes")]
pub use kubernetes::KubeStore;
pub use sqlite::SqliteStore;

use crate::objects::selector::LabelSelector;

/// How many events a watcher may fall behind, at least, before it is cut off with
/// [`StoreError::WatchLagged`]; also how many recent events per kind are kept, at least, so a
/// watch can start from a slightly old `resource_version`. A backend may keep more
/// ([`Store::watch_buffer`]).
pub const WATCH_BUFFER: usize = 1024;

/// `write` of `objects` in calls of at most a quarter of the store's watch buffer
/// ([`Store::watch_buffer`]), each awaited before the next; the results in the order of
/// `objects`. The outer error is the first failure of a call: the calls before it were
/// written.
///
/// The events of a write are published together when it commits, so one call of more objects
/// than the watch buffer cuts off every watcher of that kind at once: after 10,000 exporters
/// registered, the reconcile pass wrote their statuses in one call, and once a second the
/// `lastSeen` refreshes of more than a thousand exporters were one call; each time the
/// exporter cache listed all 10,000 exporters again. Bulk writers of the controller write
/// through this.
pub async fn in_batches<S, T, R, F, Fut>(
    store: &S,
    mut objects: Vec<T>,
    mut write: F,
) -> Result<Vec<R>, StoreError>
where
    S: Store,
    F: FnMut(Vec<T>) -> Fut,
    Fut: Future<Output = Result<Vec<R>, StoreError>>,
{
    let batch = (store.watch_buffer() / 4).max(1);
    let mut out = Vec::with_capacity(objects.len());
    while !objects.is_empty() {
        let rest = objects.split_off(objects.len().min(batch));
        out.extend(write(objects).await?);
        objects = rest;
    }
    Ok(out)
}

/// `given` as stored, if its `resourceVersion` is still the stored one (else
/// [`StoreError::Conflict`], or [`StoreError::NotFound`]).
async fn read_as_given<S: Store, K: StoreObject>(store: &S, given: &K) -> Result<K, StoreError> {
    let meta = given.meta();
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let given_rv = meta.resource_version.clone().unwrap_or_default();
    let kind = K::kind(&()).into_owned();
    let stored = store
        .get::<K>(&namespace, &name)
        .await?
        .ok_or_else(|| StoreError::NotFound {
            kind: kind.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
        })?;
    let current = stored.meta().resource_version.clone().unwrap_or_default();
    if current != given_rv {
        return Err(StoreError::Conflict {
            kind,
            namespace,
            name,
            given: given_rv,
            current,
        });
    }
    Ok(stored)
}

/// Which parts of an object [`Store::update_status_and_metadata_many`] writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Parts {
    /// Its `status`.
    pub status: bool,
    /// Its metadata labels, annotations, owner references and finalizers.
    pub metadata: bool,
}

/// The metadata fields [`Store::update_status_and_metadata_many`] writes, by their JSON names
/// (the fields [`copy_written_metadata`] copies and [`take_written_metadata`] moves).
pub(crate) const WRITTEN_METADATA: [&str; 4] =
    ["labels", "annotations", "ownerReferences", "finalizers"];

/// The metadata [`Store::update_status_and_metadata_many`] writes, from `given` into `into`.
pub(crate) fn copy_written_metadata(
    given: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    into: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) {
    into.labels.clone_from(&given.labels);
    into.annotations.clone_from(&given.annotations);
    into.owner_references.clone_from(&given.owner_references);
    into.finalizers.clone_from(&given.finalizers);
}

/// [`copy_written_metadata`] moving the fields out of `given`, and only when they differ
/// from those of `into`; whether they did.
pub(crate) fn take_written_metadata(
    given: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    into: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> bool {
    let same = into.labels == given.labels
        && into.annotations == given.annotations
        && into.owner_references == given.owner_references
        && into.finalizers == given.finalizers;
    if !same {
        into.labels = given.labels.take();
        into.annotations = given.annotations.take();
        into.owner_references = given.owner_references.take();
        into.finalizers = given.finalizers.take();
    }
    !same
}

/// A type the store can hold: a namespaced Kubernetes-style object (the `kube::CustomResource`
/// types of [`crate::objects`]).
pub trait StoreObject:
    kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> StoreObject for K where
    K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// The controller reference to `owner` (`controller` and `blockOwnerDeletion` true, as
/// `SetControllerReference` writes it); `None` when `owner` has no name or uid (not stored).
pub fn controller_reference<K: StoreObject>(
    owner: &K,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    let meta = owner.meta();
    Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            name: meta.name.clone()?,
            uid: meta.uid.clone()?,
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
    )
}

/// A store operation failed; every variant names the object (kind, namespace, name) at fault.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such object.
    #[error("{kind} {namespace}/{name} not found")]
    NotFound {
        /// Object kind.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// `create` of a name that exists.
    #[error("{kind} {namespace}/{name} already exists")]
    AlreadyExists {
        /// Object kind.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The caller's `resourceVersion` is stale: somebody else wrote the object since it was
    /// read. Re-read and retry. (The message is Kubernetes' own.)
    #[error(
        "Operation cannot be fulfilled on {kind} {namespace}/{name}: the object has been modified; please apply your changes to the latest version and try again (have resourceVersion {given}, current is {current})"
    )]
    Conflict {
        /// Object kind.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The resourceVersion the caller sent.
        given: String,
        /// The stored resourceVersion.
        current: String,
    },
    /// The request is unusable (missing or malformed name, namespace, resourceVersion,
    /// continue token, or an object that does not serialize).
    #[error("invalid {kind} {namespace}/{name}")]
    Invalid {
        /// Object kind.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// What is wrong: the error that found it, or a message.
        #[source]
        source: BoxError,
    },
    /// A stored row cannot be decoded into the object type.
    #[error("stored {kind} {namespace}/{name} is corrupt")]
    Corrupt {
        /// Object kind.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The decoder's error, or a message.
        #[source]
        source: BoxError,
    },
    /// A watch fell too far behind (or asked to start before the retained history); list
    /// again and watch from the new `resource_version`.
    #[error("watch of {kind} cannot continue: {reason}; list again and re-watch")]
    WatchLagged {
        /// Object kind.
        kind: String,
        /// Why (how many events were missed, or how old the requested version is).
        reason: String,
    },
    /// The Kubernetes API server could not be reached or refused the request for a reason
    /// other than the ones above (authorization, server error, unexpected answer).
    #[error("Kubernetes API, {operation} {kind} {namespace}/{name}")]
    Kubernetes {
        /// What was attempted (get, list, create, update, update_status, delete, watch).
        operation: String,
        /// Object kind.
        kind: String,
        /// Namespace (`*` for all).
        namespace: String,
        /// Name (`*` for collections).
        name: String,
        /// The client's error, or the API server's message.
        #[source]
        source: BoxError,
    },
    /// The database failed (I/O, locking, full disk, schema).
    #[error("store database {path}")]
    Database {
        /// The database file.
        path: String,
        /// What failed: SQLite's error, or a message.
        #[source]
        source: BoxError,
    },
}

impl StoreError {
    /// Whether the database file itself is damaged (SQLite's "database disk image is
    /// malformed", "file is not a database"): no retry can help, the store must be restored.
    pub fn is_corruption(&self) -> bool {
        match self {
            StoreError::Database { source, .. } => {
                let r = jumpstarter_core::error_chain(&**source).to_ascii_lowercase();
                r.contains("malformed") || r.contains("not a database") || r.contains("is damaged")
            }
            _ => false,
        }
    }

    /// Whether this is [`StoreError::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::NotFound { .. })
    }

    /// Whether this is [`StoreError::Conflict`] (retry after re-reading).
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict { .. })
    }
}

/// Paging of [`Store::list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListParams {
    /// At most this many items (`None` or 0: all).
    pub limit: Option<usize>,
    /// The `continue_token` of the previous page.
    pub continue_token: Option<String>,
}

/// One page of [`Store::list`]: items ordered by (namespace, name).
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectList<K> {
    /// The matching objects.
    pub items: Vec<K>,
    /// The store revision this page was read at; pass it to [`Store::watch`] to receive the
    /// changes after it.
    pub resource_version: String,
    /// Set when more items may follow: pass it in [`ListParams::continue_token`]. Pages are
    /// each consistent, but not one snapshot together (objects written between pages may be
    /// seen in their newer state or missed if they move before the cursor).
    pub continue_token: Option<String>,
}

/// A change seen by [`Store::watch`]. Each object carries the `resourceVersion` of the change
/// (for `Deleted`, the revision of the deletion and the last stored state).
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent<K> {
    /// The object was created.
    Added(K),
    /// The object was updated (spec, metadata or status).
    Modified(K),
    /// The object was deleted.
    Deleted(K),
}

impl<K> WatchEvent<K> {
    /// The object of the event.
    pub fn object(&self) -> &K {
        match self {
            WatchEvent::Added(k) | WatchEvent::Modified(k) | WatchEvent::Deleted(k) => k,
        }
    }
}

/// The events of a watch; an `Err` item is the last one.
pub type WatchStream<K> = Pin<Box<dyn Stream<Item = Result<WatchEvent<K>, StoreError>> + Send>>;

/// The controller's object store (see the [module docs](self) for the semantics).
pub trait Store: Clone + Send + Sync + 'static {
    /// The object `namespace/name`, or `None`.
    fn get<K: StoreObject>(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<K>, StoreError>> + Send;

    /// The objects of kind `K` in `namespace` (all namespaces when `None`) whose labels match
    /// `selector` (an empty selector matches all), paged by `params`.
    fn list<K: StoreObject>(
        &self,
        namespace: Option<&str>,
        selector: &LabelSelector,
        params: &ListParams,
    ) -> impl Future<Output = Result<ObjectList<K>, StoreError>> + Send;

    /// Creates `object` (its `metadata.namespace` and `metadata.name` or `generateName` are
    /// required) and returns it as stored. [`StoreError::AlreadyExists`] if the name is taken.
    fn create<K: StoreObject>(
        &self,
        object: &K,
    ) -> impl Future<Output = Result<K, StoreError>> + Send;

    /// Replaces `object` (everything but `status`) if its `metadata.resourceVersion` is the
    /// stored one, else [`StoreError::Conflict`]. Returns the object as stored.
    fn update<K: StoreObject>(
        &self,
        object: &K,
    ) -> impl Future<Output = Result<K, StoreError>> + Send;

    /// Replaces the `status` of `object` if its `metadata.resourceVersion` is the stored one,
    /// else [`StoreError::Conflict`]. Returns the object as stored.
    fn update_status<K: StoreObject>(
        &self,
        object: &K,
    ) -> impl Future<Output = Result<K, StoreError>> + Send;

    /// [`Store::update_status`] of each object, in one write where the backend can (one disk
    /// sync for SQLite). Each object succeeds or fails on its own; the outer error means the
    /// backend failed (for SQLite: then none was written).
    fn update_status_many<K: StoreObject>(
        &self,
        objects: Vec<K>,
    ) -> impl Future<Output = Result<Vec<Result<K, StoreError>>, StoreError>> + Send {
        async move {
            let mut out = Vec::with_capacity(objects.len());
            for object in &objects {
                out.push(self.update_status(object).await);
            }
            Ok(out)
        }
    }

    /// [`Store::update`] of each object, in one write where the backend can, as
    /// [`Store::update_status_many`].
    fn update_many<K: StoreObject>(
        &self,
        objects: Vec<K>,
    ) -> impl Future<Output = Result<Vec<Result<K, StoreError>>, StoreError>> + Send {
        async move {
            let mut out = Vec::with_capacity(objects.len());
            for object in &objects {
                out.push(self.update(object).await);
            }
            Ok(out)
        }
    }

    /// Writes what `parts` names of each object: its `status` (as [`Store::update_status`])
    /// and its metadata labels, annotations, owner references and finalizers (as
    /// [`Store::update`], the spec untouched). The embedded store makes that one write per
    /// object, all in one transaction; elsewhere (a Kubernetes status subresource) it is the
    /// status write, then the metadata write with the `resourceVersion` the first returned.
    /// Each object succeeds or fails on its own (a failure of either write fails it); the
    /// outer error means the backend failed.
    fn update_status_and_metadata_many<K: StoreObject>(
        &self,
        objects: Vec<(K, Parts)>,
    ) -> impl Future<Output = Result<Vec<Result<K, StoreError>>, StoreError>> + Send {
        async move {
            let mut out: Vec<Option<Result<K, StoreError>>> = Vec::with_capacity(objects.len());
            out.resize_with(objects.len(), || None);
            let mut current: Vec<K> = objects.iter().map(|(o, _)| o.clone()).collect();
            let status_of: Vec<usize> = (0..objects.len())
                .filter(|&i| objects[i].1.status)
                .collect();
            let written = match status_of.is_empty() {
                true => Vec::new(),
                false => {
                    let given = status_of.iter().map(|&i| objects[i].0.clone()).collect();
                    self.update_status_many(given).await?
                }
            };
            for (&i, result) in status_of.iter().zip(written) {
                match result {
                    Ok(stored) => current[i] = stored,
                    Err(e) => out[i] = Some(Err(e)),
                }
            }
            // Without a status write, the metadata goes onto the object as stored (read here,
            // the resourceVersion checked), so that nothing else of the given one is written;
            // with no part to write, that is the answer.
            for i in 0..objects.len() {
                if !objects[i].1.status {
                    match read_as_given(self, &objects[i].0).await {
                        Ok(stored) => current[i] = stored,
                        Err(e) => out[i] = Some(Err(e)),
                    }
                }
            }
            let meta_of: Vec<usize> = (0..objects.len())
                .filter(|&i| out[i].is_none() && objects[i].1.metadata)
                .collect();
            let given: Vec<K> = meta_of
                .iter()
                .map(|&i| {
                    let mut next = current[i].clone();
                    copy_written_metadata(objects[i].0.meta(), next.meta_mut());
                    next
                })
                .collect();
            let written = match given.is_empty() {
                true => Vec::new(),
                false => self.update_many(given).await?,
            };
            for (&i, result) in meta_of.iter().zip(written) {
                out[i] = Some(result);
            }
            Ok(out
                .into_iter()
                .zip(current)
                .map(|(result, current)| result.unwrap_or(Ok(current)))
                .collect())
        }
    }

    /// Deletes `namespace/name` and returns its last state. With `resource_version`, deletes
    /// only if it is the stored one, else [`StoreError::Conflict`].
    fn delete<K: StoreObject>(
        &self,
        namespace: &str,
        name: &str,
        resource_version: Option<&str>,
    ) -> impl Future<Output = Result<K, StoreError>> + Send;

    /// Watches kind `K` in `namespace` (all when `None`). With `since` (a `resource_version`
    /// from a list or an object), the stream starts with the retained changes after it, or
    /// fails with [`StoreError::WatchLagged`] if they are no longer retained; without, it
    /// starts with the next change.
    fn watch<K: StoreObject>(
        &self,
        namespace: Option<&str>,
        since: Option<&str>,
    ) -> impl Future<Output = Result<WatchStream<K>, StoreError>> + Send;

    /// Write transactions committed since this handle's store was opened (each one disk sync
    /// for SQLite), for the metrics; `None` where the backend does not count them.
    fn commits(&self) -> Option<u64> {
        None
    }

    /// How many events a watcher of this store may fall behind before it is cut off with
    /// [`StoreError::WatchLagged`] (and how much history a watch can start from): at least
    /// [`WATCH_BUFFER`].
    fn watch_buffer(&self) -> usize {
        WATCH_BUFFER
    }

    /// Whether a write's watch event is in every open watch stream by the time the write
    /// returns (the embedded store: it publishes before answering). Then a stream drained
    /// after a write returned holds that write, and a cache fed by the watch is as fresh as a
    /// list; otherwise (Kubernetes: events come later) only a list is.
    fn watch_is_synchronous(&self) -> bool {
        false
    }

    /// Where Kubernetes Events about exporters go: nowhere, unless the backend is a cluster
    /// (see the `kubernetes::events` module). Called once per controller.
    fn event_recorder(&self) -> crate::kubernetes::events::EventRecorder {
        crate::kubernetes::events::EventRecorder::disabled()
    }
}

#[cfg(test)]
pub(crate) mod tests;
