//! The Kubernetes backend: objects are the `jumpstarter.dev/v1alpha1` custom resources (and
//! core Secrets) of a cluster, read and written with kube-rs `Api<K>`.
//!
//! How the [`Store`] semantics map onto the API server:
//! - label selectors are evaluated by the server (`labelSelector=` in the canonical string
//!   form), paging is the server's `limit`/`continue`;
//! - `update` is a PUT of the object with its `resourceVersion` (HTTP 409 becomes
//!   [`StoreError::Conflict`]); the `uid` is left for the server to keep, as the trait
//!   promises that server-owned fields come from the stored object; `update_status` is a PUT
//!   to the `status` subresource;
//! - `delete` reads the object, then deletes it with its `resourceVersion` and `uid` as
//!   preconditions and returns what it read: a real API server answers the delete of a custom
//!   resource or a Secret with `Status{Success}`, not the object;
//! - `watch` is the raw watch API, re-issued from the last seen `resourceVersion` (bookmarks
//!   included) whenever the server closes it; `410 Gone` becomes
//!   [`StoreError::WatchLagged`]. Without `since`, a one-item list gives the current
//!   `resourceVersion` to start from, so only later changes are delivered.
//!
//! The CRDs must be installed (`cargo xtask crds | kubectl apply -f -`).

use std::time::{Duration, Instant};

use futures::{StreamExt, stream::BoxStream};
use kube::{
    Api,
    api::{DeleteParams, ListParams as KubeListParams, PostParams, Preconditions, WatchParams},
    core::{Status, WatchEvent as KubeWatchEvent},
};

use super::{
    Because, BoxError, ListParams, ObjectList, Store, StoreError, StoreObject, WatchEvent,
    WatchStream,
};
use crate::objects::selector::{LabelSelector, validate_dns1123_subdomain};

/// How long one watch request may last before the server ends it (and we re-issue it), by
/// default.
pub const WATCH_TIMEOUT_SECS: u32 = 290;
/// A watch request that ends sooner than this without any event waits this long before the
/// next one, so a server that closes watches at once is not hammered.
const REWATCH_PAUSE: Duration = Duration::from_millis(500);
/// How many status writes of one `update_status_many` are in flight at once (each is its own
/// request: the API has no batch write).
pub const STATUS_WRITES_IN_FLIGHT: usize = 16;
/// How often `delete` without a caller's version re-reads an object that changed between its
/// read and its delete.
const DELETE_ATTEMPTS: usize = 5;

/// The Kubernetes-backed [`Store`]; cloning gives another handle on the same client.
#[derive(Clone)]
pub struct KubeStore {
    client: kube::Client,
    watch_timeout: u32,
}

impl std::fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStore")
            .field("default_namespace", &self.client.default_namespace())
            .finish_non_exhaustive()
    }
}

/// What a request is about, for error messages.
#[derive(Debug, Clone)]
struct Target {
    operation: &'static str,
    kind: String,
    namespace: String,
    name: String,
}

impl Target {
    fn new<K: StoreObject>(operation: &'static str, namespace: &str, name: &str) -> Self {
        Self {
            operation,
            kind: K::kind(&()).into_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    fn of<K: StoreObject>(operation: &'static str, object: &K) -> Self {
        let meta = object.meta();
        let name = meta
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| meta.generate_name.clone().map(|g| format!("{g}*")))
            .unwrap_or_default();
        Self::new::<K>(
            operation,
            meta.namespace.as_deref().unwrap_or_default(),
            &name,
        )
    }

    fn invalid(&self, source: impl Into<BoxError>) -> StoreError {
        StoreError::Invalid {
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source: source.into(),
        }
    }

    /// Checks the namespace (it becomes part of the URL) and, when `name` is set, the name.
    fn check_key(&self, check_name: bool) -> Result<(), StoreError> {
        let ns = &self.namespace;
        let ns_ok = !ns.is_empty()
            && ns.len() <= 63
            && ns
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !ns.starts_with('-')
            && !ns.ends_with('-');
        if !ns_ok {
            return Err(self.invalid(
                "metadata.namespace must be a DNS-1123 label (lowercase letters, digits, '-', at most 63)",
            ));
        }
        if check_name && let Err(e) = validate_dns1123_subdomain(&self.name) {
            return Err(self.invalid(format!("metadata.name: {e}")));
        }
        Ok(())
    }

    /// Maps a kube-rs error; `given` is the resourceVersion the caller sent, for conflicts.
    fn error(&self, err: kube::Error, given: Option<&str>) -> StoreError {
        match err {
            kube::Error::Api(status) => self.status_error(&status, given),
            other => self.kubernetes(other),
        }
    }

    fn status_error(&self, status: &Status, given: Option<&str>) -> StoreError {
        let (kind, namespace, name) =
            (self.kind.clone(), self.namespace.clone(), self.name.clone());
        match status.code {
            404 => StoreError::NotFound {
                kind,
                namespace,
                name,
            },
            409 if status.is_already_exists() => StoreError::AlreadyExists {
                kind,
                namespace,
                name,
            },
            409 => StoreError::Conflict {
                kind,
                namespace,
                name,
                given: given.unwrap_or_default().to_owned(),
                current: "newer on the API server".to_owned(),
            },
            410 => StoreError::WatchLagged {
                kind,
                reason: status.message.clone(),
            },
            400 | 422 => self.invalid(status.message.clone()),
            code => self.kubernetes(format!("{} ({code} {})", status.message, status.reason)),
        }
    }

    fn kubernetes(&self, source: impl Into<BoxError>) -> StoreError {
        StoreError::Kubernetes {
            operation: self.operation.to_owned(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source: source.into(),
        }
    }
}

impl KubeStore {
    /// A store over `client` (see [`KubeStore::from_env`] for the usual way to get one).
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            watch_timeout: WATCH_TIMEOUT_SECS,
        }
    }

    /// The same store with watch requests lasting at most `secs` (at least 1) before they are
    /// re-issued; the stream the caller sees does not end.
    pub fn with_watch_timeout(mut self, secs: u32) -> Self {
        self.watch_timeout = secs.max(1);
        self
    }

    /// A store for the cluster this process is configured for: the in-cluster service
    /// account when running in a pod, else `KUBECONFIG` / `~/.kube/config`.
    pub async fn from_env() -> Result<Self, StoreError> {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| StoreError::Kubernetes {
                operation: "connect".into(),
                kind: "*".into(),
                namespace: "*".into(),
                name: "*".into(),
                source: Because::boxed(
                    "no usable cluster configuration (in-cluster service account or KUBECONFIG)",
                    e,
                ),
            })?;
        Ok(Self::new(client))
    }

    /// The underlying client (for Secrets, events or leader election).
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    fn api<K: StoreObject>(&self, namespace: Option<&str>) -> Api<K> {
        match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }
}

fn kube_list_params(selector: &LabelSelector, params: &ListParams) -> KubeListParams {
    let mut lp = KubeListParams::default();
    if !selector.is_empty() {
        lp.label_selector = Some(selector.to_selector_string());
    }
    lp.limit = params
        .limit
        .filter(|l| *l > 0)
        .map(|l| u32::try_from(l).unwrap_or(u32::MAX));
    lp.continue_token = params.continue_token.clone().filter(|t| !t.is_empty());
    lp
}

impl Store for KubeStore {
    fn event_recorder(&self) -> crate::kubernetes::events::EventRecorder {
        crate::kubernetes::events::EventRecorder::kubernetes(self.client.clone())
    }

    async fn get<K: StoreObject>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<K>, StoreError> {
        let t = Target::new::<K>("get", namespace, name);
        t.check_key(true)?;
        self.api::<K>(Some(namespace))
            .get_opt(name)
            .await
            .map_err(|e| t.error(e, None))
    }

    async fn list<K: StoreObject>(
        &self,
        namespace: Option<&str>,
        selector: &LabelSelector,
        params: &ListParams,
    ) -> Result<ObjectList<K>, StoreError> {
        let t = Target::new::<K>("list", namespace.unwrap_or("*"), "*");
        if namespace.is_some() {
            t.check_key(false)?;
        }
        let list = self
            .api::<K>(namespace)
            .list(&kube_list_params(selector, params))
            .await
            .map_err(|e| t.error(e, None))?;
        Ok(ObjectList {
            items: list.items,
            resource_version: list.metadata.resource_version.unwrap_or_default(),
            continue_token: list.metadata.continue_.filter(|c| !c.is_empty()),
        })
    }

    async fn create<K: StoreObject>(&self, object: &K) -> Result<K, StoreError> {
        let t = Target::of("create", object);
        let meta = object.meta();
        let named = meta.name.as_deref().is_some_and(|n| !n.is_empty());
        if !named && meta.generate_name.as_deref().unwrap_or_default().is_empty() {
            return Err(t.invalid("metadata.name or metadata.generateName is required"));
        }
        t.check_key(named)?;
        let mut object = object.clone();
        // Server-owned: a create must not carry them.
        let meta = object.meta_mut();
        meta.resource_version = None;
        meta.uid = None;
        meta.creation_timestamp = None;
        meta.generation = None;
        self.api::<K>(Some(&t.namespace))
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| t.error(e, None))
    }

    async fn update<K: StoreObject>(&self, object: &K) -> Result<K, StoreError> {
        let t = Target::of("update", object);
        t.check_key(true)?;
        let rv = required_resource_version(&t, object)?;
        let mut object = object.clone();
        // The server keeps the stored uid when none is sent (a different one is an error).
        object.meta_mut().uid = None;
        self.api::<K>(Some(&t.namespace))
            .replace(&t.name, &PostParams::default(), &object)
            .await
            .map_err(|e| t.error(e, Some(&rv)))
    }

    async fn update_status<K: StoreObject>(&self, object: &K) -> Result<K, StoreError> {
        let t = Target::of("update_status", object);
        t.check_key(true)?;
        let rv = required_resource_version(&t, object)?;
        let mut object = object.clone();
        object.meta_mut().uid = None;
        self.api::<K>(Some(&t.namespace))
            .replace_status(&t.name, &PostParams::default(), &object)
            .await
            .map_err(|e| t.error(e, Some(&rv)))
    }

    /// The Kubernetes API has no batch write: the PUTs go out concurrently, at most
    /// [`STATUS_WRITES_IN_FLIGHT`] at a time, and the results come back in order.
    async fn update_status_many<K: StoreObject>(
        &self,
        objects: Vec<K>,
    ) -> Result<Vec<Result<K, StoreError>>, StoreError> {
        Ok(futures::stream::iter(objects)
            .map(|object| async move { self.update_status(&object).await })
            .buffered(STATUS_WRITES_IN_FLIGHT)
            .collect()
            .await)
    }

    /// As [`KubeStore::update_status_many`]: concurrent PUTs, results in order.
    async fn update_many<K: StoreObject>(
        &self,
        objects: Vec<K>,
    ) -> Result<Vec<Result<K, StoreError>>, StoreError> {
        Ok(futures::stream::iter(objects)
            .map(|object| async move { self.update(&object).await })
            .buffered(STATUS_WRITES_IN_FLIGHT)
            .collect()
            .await)
    }

    async fn delete<K: StoreObject>(
        &self,
        namespace: &str,
        name: &str,
        resource_version: Option<&str>,
    ) -> Result<K, StoreError> {
        let t = Target::new::<K>("delete", namespace, name);
        t.check_key(true)?;
        let api = self.api::<K>(Some(namespace));
        // A real API server answers the immediate delete of a custom resource or a Secret with
        // `Status{Success}`, not the object; only some built-in kinds return it. So the object
        // is read first and deleted on the precondition that it is still that version (and
        // uid): what was read is then exactly its last state. When the caller gave no version
        // and somebody writes in between, read again (bounded).
        for _ in 0..DELETE_ATTEMPTS {
            let Some(current) = api.get_opt(name).await.map_err(|e| t.error(e, None))? else {
                return Err(StoreError::NotFound {
                    kind: t.kind.clone(),
                    namespace: t.namespace.clone(),
                    name: t.name.clone(),
                });
            };
            let current_rv = current.meta().resource_version.clone().unwrap_or_default();
            if let Some(given) = resource_version
                && given != current_rv
            {
                return Err(StoreError::Conflict {
                    kind: t.kind.clone(),
                    namespace: t.namespace.clone(),
                    name: t.name.clone(),
                    given: given.to_owned(),
                    current: current_rv,
                });
            }
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(current_rv.clone()),
                    uid: current.meta().uid.clone(),
                }),
                ..DeleteParams::default()
            };
            match api.delete(name, &dp).await {
                Ok(answer) => return Ok(answer.left_or(current)),
                Err(kube::Error::Api(status))
                    if status.code == 409 && resource_version.is_none() =>
                {
                    continue;
                }
                Err(e) => return Err(t.error(e, resource_version)),
            }
        }
        Err(t.kubernetes(format!(
            "the object changed during each of {DELETE_ATTEMPTS} attempts to delete it"
        )))
    }

    async fn watch<K: StoreObject>(
        &self,
        namespace: Option<&str>,
        since: Option<&str>,
    ) -> Result<WatchStream<K>, StoreError> {
        let t = Target::new::<K>("watch", namespace.unwrap_or("*"), "*");
        if namespace.is_some() {
            t.check_key(false)?;
        }
        // An etcd-backed server's versions are decimal revisions; anything else is refused
        // here rather than handed to the server (which answers it unlike a bad request).
        if let Some(s) = since.filter(|s| !s.is_empty())
            && !s.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(t.invalid(format!(
                "resourceVersion {s:?} to watch from is not a revision number"
            )));
        }
        let api = self.api::<K>(namespace);
        let start = match since.filter(|s| !s.is_empty()) {
            Some(s) => s.to_owned(),
            None => {
                let lp = KubeListParams::default().limit(1);
                let list = api.list(&lp).await.map_err(|e| t.error(e, None))?;
                list.metadata.resource_version.unwrap_or_default()
            }
        };
        let mut wp = WatchParams::default().timeout(self.watch_timeout);
        wp.bookmarks = true;
        // The first request is made here, so a stale or malformed version fails the call.
        let first = api.watch(&wp, &start).await.map_err(|e| t.error(e, None))?;
        let state = WatchState {
            api,
            params: wp,
            target: t,
            resource_version: start,
            current: Some(first.boxed()),
            started: Instant::now(),
            delivered: false,
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(state, next_event)))
    }
}

fn required_resource_version<K: StoreObject>(t: &Target, object: &K) -> Result<String, StoreError> {
    object
        .meta()
        .resource_version
        .clone()
        .filter(|rv| !rv.is_empty())
        .ok_or_else(|| t.invalid("metadata.resourceVersion must be set for an update"))
}

struct WatchState<K: StoreObject> {
    api: Api<K>,
    params: WatchParams,
    target: Target,
    /// The last version seen (event or bookmark): where a re-issued watch starts.
    resource_version: String,
    current: Option<BoxStream<'static, kube::Result<KubeWatchEvent<K>>>>,
    started: Instant,
    delivered: bool,
    done: bool,
}

async fn next_event<K: StoreObject>(
    mut st: WatchState<K>,
) -> Option<(Result<WatchEvent<K>, StoreError>, WatchState<K>)> {
    loop {
        if st.done {
            return None;
        }
        let Some(current) = st.current.as_mut() else {
            if !st.delivered && st.started.elapsed() < REWATCH_PAUSE {
                tokio::time::sleep(REWATCH_PAUSE).await;
            }
            match st.api.watch(&st.params, &st.resource_version).await {
                Ok(s) => {
                    st.current = Some(s.boxed());
                    st.started = Instant::now();
                    st.delivered = false;
                }
                Err(e) => {
                    st.done = true;
                    let err = st.target.error(e, None);
                    return Some((Err(err), st));
                }
            }
            continue;
        };
        let event = match current.next().await {
            // The server ended this request (timeout, restart, slow reader): continue from
            // the last version seen.
            None => {
                st.current = None;
                continue;
            }
            Some(Ok(event)) => event,
            Some(Err(e)) => {
                st.done = true;
                let err = st.target.error(e, None);
                return Some((Err(err), st));
            }
        };
        let item = match event {
            KubeWatchEvent::Added(o) => WatchEvent::Added(o),
            KubeWatchEvent::Modified(o) => WatchEvent::Modified(o),
            KubeWatchEvent::Deleted(o) => WatchEvent::Deleted(o),
            KubeWatchEvent::Bookmark(b) => {
                st.resource_version = b.metadata.resource_version;
                continue;
            }
            KubeWatchEvent::Error(status) => {
                st.done = true;
                let err = st.target.status_error(&status, None);
                return Some((Err(err), st));
            }
        };
        if let Some(rv) = item.object().meta().resource_version.clone() {
            st.resource_version = rv;
        }
        st.delivered = true;
        return Some((Ok(item), st));
    }
}
