//! What every service of a controller shares: the store, credentials, routers, the
//! exporters' Listen queues, and the authentication of callers.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex, MutexGuard, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use jiff::Timestamp;
use jumpstarter_core::auth::ObjectKind;
use jumpstarter_router::RouterTokenKey;

use crate::auth::{AuthMetadata, TokenIssuer};
use jumpstarter_proto::v1::ListenResponse;
use tokio::sync::{Notify, mpsc, watch};
use tonic::{Status, metadata::MetadataMap};

use crate::{
    objects::{Client, Exporter},
    selector::LabelSelector,
    store::{ListParams, Store, StoreError, WatchEvent},
};

/// Capacity of an exporter's Listen queue (as upstream).
pub const LISTEN_QUEUE: usize = 8;

/// A router the controller hands out in `Dial`/`Listen` responses.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterEntry {
    /// Its name (the key of the `router` config map upstream).
    pub name: String,
    /// `host:port` clients and exporters dial.
    pub endpoint: String,
    /// Labels matched against the exporter's labels to choose a router.
    pub labels: std::collections::BTreeMap<String, String>,
}

/// Who called an RPC, after authentication.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    /// Client or Exporter.
    pub kind: ObjectKind,
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
    /// Its uid.
    pub uid: String,
}

type ListenKey = (String, String);

/// (namespace, name) of an object.
pub type ObjectKey = (String, String);

/// The latest state of one exporter, as the store's watch delivered it (`None`: deleted).
pub type ExporterUpdates = watch::Receiver<Option<Arc<Exporter>>>;

/// Every exporter as the store's watch last delivered it, kept by one feed task so that a
/// change is decoded once, not once per Status stream, and so that a reconcile pass does
/// not list and decode every exporter.
#[derive(Default)]
struct ExporterCache {
    /// Whether `objects` holds a full list plus every change after it.
    synced: bool,
    objects: HashMap<ObjectKey, Arc<Exporter>>,
    /// Changed since the reconcile loop last took them.
    dirty: HashSet<ObjectKey>,
    /// Set when the cache was rebuilt from a new list: the reconcile view must start over.
    relisted: bool,
    /// Status streams waiting for changes of one exporter.
    watchers: HashMap<ObjectKey, watch::Sender<Option<Arc<Exporter>>>>,
}

/// What the reconcile loop takes from the exporter cache at the start of a pass.
pub enum ExporterChanges {
    /// Everything (first pass, or the feed had to list again).
    All(Vec<Exporter>),
    /// Only these changed (`None`: deleted).
    Some(Vec<(ObjectKey, Option<Exporter>)>),
}

/// Whether `a`'s resourceVersion is older than `b`'s (both numeric; otherwise unknown, false).
pub fn older_version(a: &Exporter, b: &Exporter) -> bool {
    let rv = |e: &Exporter| {
        e.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    matches!((rv(a), rv(b)), (Some(x), Some(y)) if x < y)
}

fn key_of(e: &Exporter) -> ObjectKey {
    (
        e.metadata.namespace.clone().unwrap_or_default(),
        e.metadata.name.clone().unwrap_or_default(),
    )
}

/// The state shared by the controller's services.
pub struct ControllerState<S: Store> {
    /// Where objects live.
    pub store: S,
    /// Mints and verifies client and exporter tokens.
    pub issuer: Arc<TokenIssuer>,
    /// Signs router tokens.
    pub router_key: RouterTokenKey,
    /// Routers to hand out.
    pub routers: Vec<RouterEntry>,
    /// The endpoint clients and exporters reach this controller at.
    pub endpoint: String,
    /// Maximum number of lease tags.
    pub max_tags: usize,
    /// A waiting lease whose client has not been heard from for this long is ended
    /// ([`crate::pending_guard`]); `None` never ends one.
    pub pending_client_timeout: Option<Duration>,
    /// When each client was last heard from.
    pub client_activity: crate::pending_guard::ClientActivity,
    /// Set once the controller cannot go on (a damaged store): the binary then exits
    /// non-zero with this message instead of failing every second.
    pub fatal: watch::Sender<Option<String>>,
    /// External OIDC issuers (tried before the internal issuer) and Client provisioning.
    pub external_auth: crate::external_auth::ExternalAuth,
    /// Poked whenever something may need rescheduling.
    pub wake: Notify,
    listeners: Mutex<HashMap<ListenKey, (u64, mpsc::Sender<ListenResponse>)>>,
    next_listener: std::sync::atomic::AtomicU64,
    exporters: Mutex<ExporterCache>,
    /// Poked when the exporter cache becomes synced.
    exporters_synced: Notify,
    feed_started: AtomicBool,
    /// Dropped with the state, which ends the feed task.
    feed_stop: watch::Sender<()>,
    /// When a Status stream last saw each exporter (its heartbeat, kept in memory; the
    /// stored `lastSeen` is refreshed less often).
    seen: Mutex<HashMap<ObjectKey, Timestamp>>,
    /// The reconcile loop's own copy of the exporters, updated from the cache's changes.
    pub(crate) exporter_view: tokio::sync::Mutex<Option<crate::reconcile::ExporterView>>,
    /// Records exporter online/offline events (posts them only with the Kubernetes store).
    pub events: crate::events::EventRecorder,
}

/// Maps a store error to the status upstream's Kubernetes errors become.
pub fn store_status(e: StoreError) -> Status {
    match &e {
        StoreError::NotFound { .. } => Status::not_found(e.to_string()),
        StoreError::AlreadyExists { .. } => Status::already_exists(e.to_string()),
        StoreError::Conflict { .. } => Status::aborted(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

impl<S: Store> ControllerState<S> {
    /// State over `store`.
    pub fn new(
        store: S,
        issuer: Arc<TokenIssuer>,
        router_key: RouterTokenKey,
        routers: Vec<RouterEntry>,
        endpoint: String,
    ) -> Arc<Self> {
        Arc::new(Self {
            issuer,
            router_key,
            routers,
            endpoint,
            max_tags: crate::objects::DEFAULT_MAX_TAGS,
            pending_client_timeout: Some(crate::pending_guard::DEFAULT_TIMEOUT),
            client_activity: Default::default(),
            fatal: watch::channel(None).0,
            external_auth: Default::default(),
            wake: Notify::new(),
            listeners: Mutex::new(HashMap::new()),
            next_listener: std::sync::atomic::AtomicU64::new(1),
            exporters: Mutex::new(ExporterCache::default()),
            exporters_synced: Notify::new(),
            feed_started: AtomicBool::new(false),
            feed_stop: watch::channel(()).0,
            seen: Mutex::new(HashMap::new()),
            exporter_view: tokio::sync::Mutex::new(None),
            events: store.event_recorder(),
            store,
        })
    }

    /// Declares the controller unable to go on, for `reason` (the first reason is kept).
    pub fn fail(&self, reason: String) {
        self.fatal.send_if_modified(|f| {
            if f.is_some() {
                return false;
            }
            *f = Some(reason);
            true
        });
    }

    /// Resolves with the reason once [`Self::fail`] was called.
    pub async fn failed(&self) -> String {
        let mut rx = self.fatal.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(r) => r.clone().unwrap_or_default(),
            // The sender lives as long as the state: never.
            Err(_) => std::future::pending().await,
        }
    }

    fn cache(&self) -> MutexGuard<'_, ExporterCache> {
        self.exporters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that a Status stream saw the exporter now (kept in memory).
    pub fn touch(&self, namespace: &str, name: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((namespace.to_string(), name.to_string()), Timestamp::now());
    }

    /// When a Status stream last saw the exporter, if one did since this controller started.
    pub fn seen_at(&self, namespace: &str, name: &str) -> Option<Timestamp> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(namespace.to_string(), name.to_string()))
            .copied()
    }

    /// Starts (once) the task that keeps the exporter cache from the store's watch.
    pub fn start_exporter_feed(self: &Arc<Self>) {
        if self.feed_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(self);
        let store = self.store.clone();
        let mut stop = self.feed_stop.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.changed() => {}
                _ = exporter_feed(weak, store) => {}
            }
        });
    }

    /// Whether the exporter cache is synced (waits up to `wait` for it).
    pub async fn exporters_synced(&self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.exporters_synced.notified();
            if self.cache().synced {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.cache().synced;
            }
        }
    }

    /// The changes of one exporter, starting with its cached state (the cache must be synced,
    /// see [`Self::exporters_synced`]).
    pub fn exporter_updates(&self, namespace: &str, name: &str) -> ExporterUpdates {
        let key = (namespace.to_string(), name.to_string());
        let mut cache = self.cache();
        let current = cache.objects.get(&key).cloned();
        cache
            .watchers
            .entry(key)
            .or_insert_with(|| watch::channel(current).0)
            .subscribe()
    }

    /// The exporter changes since the last call, or `None` when the cache is not synced.
    pub fn take_exporter_changes(&self, restart: bool) -> Option<ExporterChanges> {
        let mut cache = self.cache();
        if !cache.synced {
            return None;
        }
        if restart || cache.relisted {
            cache.relisted = false;
            cache.dirty.clear();
            return Some(ExporterChanges::All(
                cache.objects.values().map(|e| (**e).clone()).collect(),
            ));
        }
        let dirty = std::mem::take(&mut cache.dirty);
        Some(ExporterChanges::Some(
            dirty
                .into_iter()
                .map(|k| {
                    let e = cache.objects.get(&k).map(|e| (**e).clone());
                    (k, e)
                })
                .collect(),
        ))
    }

    fn apply_exporter_event(&self, ev: WatchEvent<Exporter>) {
        let mut cache = self.cache();
        let (key, value) = match ev {
            WatchEvent::Added(e) | WatchEvent::Modified(e) => (key_of(&e), Some(Arc::new(e))),
            WatchEvent::Deleted(e) => (key_of(&e), None),
        };
        let old = match &value {
            Some(e) => cache.objects.insert(key.clone(), e.clone()),
            None => {
                self.seen
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&key);
                cache.objects.remove(&key)
            }
        };
        // Every write of an exporter passes here once: the place to notice transitions.
        if let (Some(old), Some(new)) = (&old, &value) {
            self.events.exporter_changed(old, new);
        }
        cache.dirty.insert(key.clone());
        if let Some(tx) = cache.watchers.get(&key) {
            if tx.receiver_count() == 0 {
                cache.watchers.remove(&key);
            } else {
                tx.send_replace(value);
            }
        }
    }

    fn replace_exporters(&self, items: Vec<Exporter>) {
        let mut guard = self.cache();
        let cache = &mut *guard;
        let items: HashMap<ObjectKey, Arc<Exporter>> = items
            .into_iter()
            .map(|e| (key_of(&e), Arc::new(e)))
            .collect();
        // After a relist, transitions missed while the watch was down.
        for (key, new) in &items {
            if let Some(old) = cache.objects.get(key) {
                self.events.exporter_changed(old, new);
            }
        }
        cache.objects = items;
        cache.relisted = true;
        cache.synced = true;
        cache.dirty.clear();
        cache.watchers.retain(|k, tx| {
            if tx.receiver_count() == 0 {
                return false;
            }
            let now = cache.objects.get(k).cloned();
            tx.send_if_modified(|old| {
                let same = match (&*old, &now) {
                    (Some(a), Some(b)) => {
                        a.metadata.resource_version == b.metadata.resource_version
                    }
                    (None, None) => true,
                    _ => false,
                };
                if !same {
                    *old = now.clone();
                }
                !same
            });
            true
        });
        drop(guard);
        self.exporters_synced.notify_waiters();
    }

    /// Authenticates a caller of the expected kind (§2.1 of the protocol notes).
    ///
    /// - A token whose `iss` is a configured external issuer is verified by it; the object
    ///   is the one named by `jumpstarter-name` or derived from the username, and its
    ///   `spec.username` must equal the username (see `authorize_external`).
    /// - Any other token must be ours: subject matching the `jumpstarter-*` metadata, object
    ///   existing with the token's uid.
    pub async fn authenticate(
        &self,
        md: &MetadataMap,
        expected: ObjectKind,
    ) -> Result<Caller, Status> {
        let caller = self.authenticate_caller(md, expected).await?;
        if caller.kind == ObjectKind::Client {
            self.client_activity.note(&caller.namespace, &caller.name);
        }
        Ok(caller)
    }

    async fn authenticate_caller(
        &self,
        md: &MetadataMap,
        expected: ObjectKind,
    ) -> Result<Caller, Status> {
        let meta = AuthMetadata::from_metadata(md)?;
        if let Some(verifier) = self.external_auth.verifier_for(&meta.token) {
            let username = verifier
                .verify(&meta.token)
                .await
                .map_err(|e| e.to_controller_status())?;
            return self.authorize_external(meta, expected, &username).await;
        }
        let subject = self
            .issuer
            .verify(&meta.token)
            .map_err(|e| e.to_controller_status())?;
        let kind = ObjectKind::from_metadata(&meta.kind).ok_or_else(|| {
            Status::invalid_argument(format!("unknown object kind {:?}", meta.kind))
        })?;
        if kind != expected {
            return Err(Status::invalid_argument("object kind mismatch"));
        }
        let name = meta
            .name
            .ok_or_else(|| Status::invalid_argument("missing metadata: jumpstarter-name"))?;
        let denied = || {
            Status::permission_denied(format!(
                "permission denied for {} {}/{}",
                kind.as_str().to_lowercase(),
                meta.namespace,
                name
            ))
        };
        if subject.kind != kind || subject.namespace != meta.namespace || subject.name != name {
            return Err(denied());
        }
        let uid = match kind {
            ObjectKind::Client => self
                .store
                .get::<Client>(&meta.namespace, &name)
                .await
                .map_err(store_status)?
                .and_then(|c| c.metadata.uid),
            ObjectKind::Exporter => self
                .store
                .get::<Exporter>(&meta.namespace, &name)
                .await
                .map_err(store_status)?
                .and_then(|e| e.metadata.uid),
        };
        match uid {
            Some(uid) if uid == subject.uid => Ok(Caller {
                kind,
                namespace: meta.namespace,
                name,
                uid,
            }),
            _ => Err(denied()),
        }
    }

    /// Authorizes an externally authenticated `username` (upstream's BasicAuthorizer): the
    /// object named by `jumpstarter-name` (or derived from the username) must have
    /// `spec.username == username`. A missing Client is created with that username when
    /// provisioning is on; otherwise a missing object is `NOT_FOUND`.
    async fn authorize_external(
        &self,
        meta: AuthMetadata,
        expected: ObjectKind,
        username: &str,
    ) -> Result<Caller, Status> {
        let kind = ObjectKind::from_metadata(&meta.kind).ok_or_else(|| {
            Status::invalid_argument(format!("unknown object kind {:?}", meta.kind))
        })?;
        if kind != expected {
            return Err(Status::invalid_argument("object kind mismatch"));
        }
        let name = crate::auth::resolve_object_name(
            username,
            crate::auth::INTERNAL_USERNAME_PREFIX,
            meta.name.as_deref(),
        )?;
        let namespace = meta.namespace;
        let denied = || {
            Status::permission_denied(format!(
                "permission denied for {} {namespace}/{name}",
                kind.as_str().to_lowercase(),
            ))
        };
        let not_found = || {
            Status::not_found(format!(
                "{} {namespace}/{name} not found",
                kind.as_str().to_lowercase()
            ))
        };
        let (owner, uid) = match kind {
            ObjectKind::Client => {
                let found = self
                    .store
                    .get::<Client>(&namespace, &name)
                    .await
                    .map_err(store_status)?;
                let client = match found {
                    Some(c) => c,
                    None if self.external_auth.provisioning => {
                        self.provision_client(&namespace, &name, username).await?
                    }
                    None => return Err(not_found()),
                };
                (client.spec.username, client.metadata.uid)
            }
            ObjectKind::Exporter => {
                let e = self
                    .store
                    .get::<Exporter>(&namespace, &name)
                    .await
                    .map_err(store_status)?
                    .ok_or_else(not_found)?;
                (e.spec.username, e.metadata.uid)
            }
        };
        if owner.as_deref() != Some(username) {
            return Err(denied());
        }
        Ok(Caller {
            kind,
            namespace: namespace.clone(),
            name: name.clone(),
            uid: uid.unwrap_or_default(),
        })
    }

    /// Creates the Client `namespace/name` for `username` (provisioning); a concurrent
    /// creation by another call is fine: the stored object is used.
    async fn provision_client(
        &self,
        namespace: &str,
        name: &str,
        username: &str,
    ) -> Result<Client, Status> {
        let mut obj = Client::new(
            name,
            crate::objects::ClientSpec {
                username: Some(username.to_owned()),
            },
        );
        obj.metadata.namespace = Some(namespace.to_owned());
        match self.store.create(&obj).await {
            Ok(c) => {
                tracing::info!("provisioned client {namespace}/{name} for {username}");
                Ok(c)
            }
            Err(StoreError::AlreadyExists { .. }) => self
                .store
                .get::<Client>(namespace, name)
                .await
                .map_err(store_status)?
                .ok_or_else(|| Status::aborted(format!("client {namespace}/{name} vanished"))),
            Err(e) => Err(store_status(e)),
        }
    }

    /// Registers the Listen queue of a lease, replacing (and so ending) an earlier one.
    pub fn listen(&self, namespace: &str, lease: &str) -> (u64, mpsc::Receiver<ListenResponse>) {
        let (tx, rx) = mpsc::channel(LISTEN_QUEUE);
        let id = self
            .next_listener
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lock_listeners()
            .insert((namespace.to_string(), lease.to_string()), (id, tx));
        (id, rx)
    }

    /// Removes a Listen queue if it is still the one registered as `id`.
    pub fn unlisten(&self, namespace: &str, lease: &str, id: u64) {
        let mut l = self.lock_listeners();
        let key = (namespace.to_string(), lease.to_string());
        if l.get(&key).is_some_and(|(i, _)| *i == id) {
            l.remove(&key);
        }
    }

    /// Hands a router connection to the exporter listening on a lease.
    pub fn notify_listener(
        &self,
        namespace: &str,
        lease: &str,
        msg: ListenResponse,
    ) -> Result<(), Status> {
        let l = self.lock_listeners();
        let Some((_, tx)) = l.get(&(namespace.to_string(), lease.to_string())) else {
            return Err(Status::unavailable(format!(
                "exporter is not listening on lease {lease}"
            )));
        };
        tx.try_send(msg).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                Status::resource_exhausted(format!("listen queue of lease {lease} is full"))
            }
            mpsc::error::TrySendError::Closed(_) => {
                Status::unavailable(format!("exporter is not listening on lease {lease}"))
            }
        })
    }

    fn lock_listeners(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<ListenKey, (u64, mpsc::Sender<ListenResponse>)>> {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The router for an exporter with `labels`: highest label score first (upstream's
    /// `MatchLabels`: -1 when a router label is missing or different on the exporter). When
    /// no router matches, the best of the rest is still used rather than failing the dial.
    pub fn choose_router(
        &self,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Option<&RouterEntry> {
        self.routers
            .iter()
            .map(|r| {
                let score = if r.labels.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                    r.labels.len() as i64
                } else {
                    -1
                };
                (score, r)
            })
            .max_by_key(|(s, _)| *s)
            .map(|(_, r)| r)
    }
}

/// Lists the exporters, then follows the store's watch from that list, forever: the cache
/// and the per-exporter watchers see every change once. Ends when the state is dropped.
async fn exporter_feed<S: Store>(state: Weak<ControllerState<S>>, store: S) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let listed = store
            .list::<Exporter>(None, &LabelSelector::everything(), &ListParams::default())
            .await;
        let watch = match &listed {
            Ok(l) => {
                store
                    .watch::<Exporter>(None, Some(&l.resource_version))
                    .await
            }
            Err(_) => Err(StoreError::WatchLagged {
                kind: "Exporter".into(),
                reason: "list failed".into(),
            }),
        };
        let (listed, mut watch) = match (listed, watch) {
            (Ok(l), Ok(w)) => (l, w),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!("exporter cache: {e}; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        match state.upgrade() {
            Some(s) => s.replace_exporters(listed.items),
            None => return,
        }
        while let Some(ev) = watch.next().await {
            let Some(s) = state.upgrade() else { return };
            match ev {
                Ok(ev) => s.apply_exporter_event(ev),
                Err(e) => {
                    tracing::debug!("exporter cache: {e}; listing again");
                    break;
                }
            }
        }
    }
}
