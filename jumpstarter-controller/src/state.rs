//! What every service of a controller shares: the store, the routers, and three parts with
//! one job each: [`Authenticator`] (who is calling), [`ExporterCache`] (the exporters as the
//! store's watch delivers them) and [`ListenQueues`] (the exporters' Listen queues).

mod authenticate;
mod errors;
mod exporters;
mod listen;

use std::{sync::Arc, time::Duration};

use jumpstarter_router::RouterTokenKey;

use crate::auth::TokenIssuer;
use tokio::sync::{Notify, watch};

pub use self::{
    authenticate::{Authenticator, Caller},
    errors::store_status,
    exporters::{ExporterCache, ExporterChanges},
    listen::ListenQueues,
};
pub use crate::kubernetes::cluster_config::RouterEntry;
use crate::{lease::exporter_view::ExporterView, store::Store};

/// The state shared by the controller's services.
pub struct ControllerState<S: Store> {
    /// Where objects live.
    pub store: S,
    /// Authenticates callers (our tokens and external OIDC issuers).
    pub auth: Authenticator<S>,
    /// Every exporter as the store's watch last delivered it, and their heartbeats.
    pub exporters: Arc<ExporterCache>,
    /// The exporters' Listen queues.
    pub listeners: ListenQueues,
    /// Signs router tokens.
    pub router_key: RouterTokenKey,
    /// Routers to hand out.
    pub routers: Vec<RouterEntry>,
    /// The endpoint clients and exporters reach this controller at.
    pub endpoint: String,
    /// Maximum number of lease tags.
    pub max_tags: usize,
    /// Which exporter labels clients are shown (`hiddenLabels`, `deprecatedLabels`).
    pub label_policy: crate::objects::LabelPolicy,
    /// A waiting lease whose client has not been heard from for this long is ended
    /// (the `lease::pending_guard` module); `None` never ends one.
    pub pending_client_timeout: Option<Duration>,
    /// Set once the controller cannot go on (a damaged store): the binary then exits
    /// non-zero with this message instead of failing every second.
    pub fatal: watch::Sender<Option<String>>,
    /// Set when the controller stops: the long-lived streams (exporters' Listen and Status)
    /// end then, so that a stopping controller is gone at once (and a leader gives its Lease
    /// up without waiting for them).
    pub stopping: watch::Sender<bool>,
    /// Poked whenever something may need rescheduling.
    pub wake: Notify,
    /// The reconcile loop's passes (`CreateLease` waits for the one that sees its lease).
    pub passes: crate::lease::passes::ReconcilePasses,
    /// The reconcile loop's own copy of the exporters, updated from the cache's changes.
    pub(crate) exporter_view: tokio::sync::Mutex<Option<ExporterView>>,
    /// The reconcile loop's copy of the leases, fed by the store's watch (only for a store
    /// whose watch is synchronous, see [`crate::lease::object_view`]).
    pub(crate) lease_view: tokio::sync::Mutex<Option<crate::lease::object_view::LeaseView>>,
    /// The reconcile loop's copy of the access policies (as `lease_view`).
    pub(crate) policy_view:
        crate::lease::object_view::ViewSlot<crate::objects::ExporterAccessPolicy>,
    /// The client of every lease holding an exporter, as of the last reconcile pass (which
    /// builds it before it writes the exporters' `leaseRef`): a Status message names the
    /// lease's client without reading the lease from the store.
    pub(crate) lease_clients: std::sync::Mutex<Arc<LeaseClients>>,
    /// The connection holding each online exporter identity (one per identity).
    pub live_exporters: Arc<crate::service::live_exporters::LiveExporters>,
    /// The leases' logs (log gathering); `None` when it is off.
    pub lease_logs: Option<Arc<crate::lease_logs::LeaseLogs>>,
    /// The pool engine's recent scaling decisions (for `jmp admin describe exporterset`).
    pub pool_decisions: Arc<crate::pools::decisions::Decisions>,
    /// Each exporter's recent hook runs and health events (the dashboard's exporter page).
    pub hook_history: crate::hook_history::HookHistory,
    /// The labels of the replicas each valid ExporterSet can make, by namespace (published by
    /// the pool engine): a waiting lease that only such a replica could serve waits for it
    /// instead of ending as unsatisfiable.
    pub pool_labels: std::sync::Mutex<Arc<[PoolLabels]>>,
}

/// A namespace and the labels of the replicas an ExporterSet there can make.
pub type PoolLabels = (String, std::collections::BTreeMap<String, String>);

/// Lease (namespace, name) -> its client's name.
pub(crate) type LeaseClients = std::collections::HashMap<crate::objects::ObjectKey, LeaseHolder>;

/// Who holds a granted lease, and its context (for the exporter's status stream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseHolder {
    /// The client's name.
    pub client: String,
    /// The lease's `spec.context`.
    pub context: std::collections::BTreeMap<String, String>,
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
        let exporters = Arc::new(ExporterCache::new(store.event_recorder()));
        let mut auth = Authenticator::new(store.clone(), issuer);
        auth.exporters = Some(exporters.clone());
        Arc::new(Self {
            auth,
            exporters,
            listeners: ListenQueues::default(),
            router_key,
            routers,
            endpoint,
            max_tags: crate::objects::DEFAULT_MAX_TAGS,
            label_policy: Default::default(),
            pending_client_timeout: Some(crate::lease::pending_guard::DEFAULT_TIMEOUT),
            fatal: watch::channel(None).0,
            stopping: watch::channel(false).0,
            wake: Notify::new(),
            passes: Default::default(),
            exporter_view: tokio::sync::Mutex::new(None),
            lease_view: tokio::sync::Mutex::new(None),
            policy_view: Default::default(),
            lease_clients: std::sync::Mutex::new(Arc::default()),
            live_exporters: Arc::default(),
            lease_logs: Some(Arc::new(crate::lease_logs::LeaseLogs::new(
                Default::default(),
            ))),
            pool_decisions: Arc::default(),
            hook_history: Default::default(),
            pool_labels: std::sync::Mutex::new(Arc::from(Vec::new())),
            store,
        })
    }

    /// The client of lease `namespace/name` as the last reconcile pass saw it, when it holds
    /// an exporter (`None`: read the lease).
    #[cfg(test)]
    pub(crate) fn lease_client(&self, namespace: &str, name: &str) -> Option<String> {
        self.lease_holder(namespace, name).map(|h| h.client)
    }

    /// The client and context of granted lease `namespace/name`, as of the last pass.
    pub(crate) fn lease_holder(&self, namespace: &str, name: &str) -> Option<LeaseHolder> {
        use jumpstarter_core::sync::LockExt;
        let clients = self.lease_clients.lock_or_recover().clone();
        clients
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Forgets the client of lease `namespace/name` (it was transferred), until the next pass.
    pub(crate) fn forget_lease_client(&self, namespace: &str, name: &str) {
        use jumpstarter_core::sync::LockExt;
        let mut clients = self.lease_clients.lock_or_recover();
        let key = (namespace.to_string(), name.to_string());
        if clients.contains_key(&key) {
            Arc::make_mut(&mut clients).remove(&key);
        }
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

    /// Resolves once the controller is stopping ([`Self::stopping`]).
    pub async fn stopped(&self) {
        let mut rx = self.stopping.subscribe();
        if rx.wait_for(|s| *s).await.is_err() {
            // The sender lives as long as the state: never.
            std::future::pending::<()>().await;
        }
    }

    /// Starts (once) the task that keeps the exporter cache from the store's watch.
    pub fn start_exporter_feed(&self) {
        self.exporters.start_feed(&self.store);
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
