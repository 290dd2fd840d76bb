//! What every service of a controller shares: the store, credentials, routers, the
//! exporters' Listen queues, and the authentication of callers.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use jumpstarter_core::auth::{AuthMetadata, ObjectKind, RouterTokenKey, TokenIssuer};
use jumpstarter_proto::v1::ListenResponse;
use tokio::sync::{Notify, mpsc};
use tonic::{Status, metadata::MetadataMap};

use crate::{
    objects::{Client, Exporter},
    store::{Store, StoreError},
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
    /// Poked whenever something may need rescheduling.
    pub wake: Notify,
    listeners: Mutex<HashMap<ListenKey, (u64, mpsc::Sender<ListenResponse>)>>,
    next_listener: std::sync::atomic::AtomicU64,
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
            store,
            issuer,
            router_key,
            routers,
            endpoint,
            max_tags: crate::objects::DEFAULT_MAX_TAGS,
            wake: Notify::new(),
            listeners: Mutex::new(HashMap::new()),
            next_listener: std::sync::atomic::AtomicU64::new(1),
        })
    }

    /// Authenticates a caller of the expected kind (§2.1 of the protocol notes): bearer
    /// token signed by us, subject matching the `jumpstarter-*` metadata, object existing
    /// with the token's uid.
    pub async fn authenticate(
        &self,
        md: &MetadataMap,
        expected: ObjectKind,
    ) -> Result<Caller, Status> {
        let meta = AuthMetadata::from_metadata(md)?;
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
