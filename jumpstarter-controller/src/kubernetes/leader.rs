//! Leader election with a `coordination.k8s.io/v1` Lease, as client-go does it: one
//! controller holds the Lease and renews it; standbys watch it and take over once it has not
//! changed for its `leaseDurationSeconds`.
//!
//! Expiry is judged by when *this* process last saw the Lease change (its resourceVersion),
//! not by the `renewTime` written in it, so clock skew between nodes does not matter. The
//! holder gives up (and the process stops serving) when it could not renew for
//! [`LeaderConfig::renew_deadline`], which is shorter than the lease duration, so two
//! controllers never serve at once. The whole controller (services, Listen queues, reconcile
//! loop) runs only in the leader: Listen queues live in its memory.
//!
//! Works over any [`Store`] (the Lease is an ordinary namespaced object); on SQLite there is
//! nobody to elect against, so the binary skips it there.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use tokio::time::Instant;

use jumpstarter_core::sync::LockExt;

use crate::store::{Store, StoreError};

/// Name of the Lease object the controllers compete for.
pub const LEASE_NAME: &str = "jumpstarter-controller-leader";

/// Annotation of the Lease where its holder says where it serves (see
/// [`crate::kubernetes::standby`]), for the standbys to forward connections to.
pub const ENDPOINTS_ANNOTATION: &str = "jumpstarter.dev/leader-endpoints";

/// Annotation of the Lease where its holder says where its web dashboard serves
/// (`IP:PORT`), when the standbys can reach it. Apart from [`ENDPOINTS_ANNOTATION`] so that a
/// standby of a version that forwards no dashboard, which refuses any part it does not know
/// there, keeps forwarding the other ports during a rolling update.
pub const UI_ENDPOINT_ANNOTATION: &str = "jumpstarter.dev/leader-ui-endpoint";

/// The part of the endpoints text ([`crate::kubernetes::standby::Endpoints::annotation`])
/// that names the dashboard, kept in [`UI_ENDPOINT_ANNOTATION`].
const UI_PART: &str = ",ui=";

/// The endpoints text `endpoints` as the Lease's two annotations: the gRPC and router part
/// ([`ENDPOINTS_ANNOTATION`]) and the dashboard's address ([`UI_ENDPOINT_ANNOTATION`]).
fn split_endpoints(endpoints: &str) -> (&str, Option<&str>) {
    match endpoints.split_once(UI_PART) {
        Some((ports, ui)) => (ports, Some(ui)),
        None => (endpoints, None),
    }
}

/// The endpoints text of a Lease's annotations (see [`split_endpoints`]). A dashboard
/// address that is not `IP:PORT` is left out: it costs the dashboard, not the other ports.
fn joined_endpoints(annotations: &std::collections::BTreeMap<String, String>) -> Option<String> {
    let ports = annotations.get(ENDPOINTS_ANNOTATION)?;
    Some(
        match annotations
            .get(UI_ENDPOINT_ANNOTATION)
            .filter(|ui| ui.parse::<std::net::SocketAddr>().is_ok())
        {
            Some(ui) => format!("{ports}{UI_PART}{ui}"),
            None => ports.clone(),
        },
    )
}

/// Leader election failed in a way that retrying cannot fix, or leadership was lost.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The settings are inconsistent.
    #[error("leader election: {0}")]
    Config(String),
    /// The Lease could not be read or written.
    #[error("leader election Lease {namespace}/{name}")]
    Store {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The store's error.
        source: Box<StoreError>,
    },
    /// Another controller holds the Lease now, or it could not be renewed in time.
    #[error("lost leadership of Lease {namespace}/{name}: {reason}")]
    Lost {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why.
        reason: String,
    },
}

/// How to elect.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaderConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// Who we are (unique per process).
    pub identity: String,
    /// How long a Lease stays valid without renewal (`leaseDurationSeconds`).
    pub lease_duration: Duration,
    /// How often the holder renews, and standbys retry.
    pub renew_period: Duration,
}

impl LeaderConfig {
    /// Settings with the client-go defaults (15 s lease, 2 s renew) and an identity made of
    /// the host name (the pod name in a cluster) and a random suffix.
    pub fn new(namespace: &str) -> Self {
        let host = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "jumpstarter-controller".into());
        Self {
            namespace: namespace.to_owned(),
            name: LEASE_NAME.to_owned(),
            identity: format!("{host}_{}", uuid::Uuid::new_v4().simple()),
            lease_duration: Duration::from_secs(15),
            renew_period: Duration::from_secs(2),
        }
    }

    /// How long the holder keeps serving without a successful renewal: two thirds of the
    /// lease duration, so it stops before any standby may take over.
    pub fn renew_deadline(&self) -> Duration {
        self.lease_duration * 2 / 3
    }

    fn check(&self) -> Result<(), LeaderError> {
        if self.lease_duration < Duration::from_secs(1) {
            return Err(LeaderError::Config(
                "the lease duration must be at least 1s".into(),
            ));
        }
        if self.renew_period.is_zero() || self.renew_period >= self.renew_deadline() {
            return Err(LeaderError::Config(format!(
                "the renew period ({:?}) must be above zero and below two thirds of the lease \
                 duration ({:?})",
                self.renew_period, self.lease_duration
            )));
        }
        if self.identity.is_empty() {
            return Err(LeaderError::Config("the identity is empty".into()));
        }
        Ok(())
    }
}

/// What a standby's watch of the leader tells its elector: the holder that serves where a
/// Lease's [`ENDPOINTS_ANNOTATION`] says is gone (its address refuses connections). The
/// endpoints come with it, so that a report about a holder that has already been replaced
/// (a new leader, elsewhere) never takes the Lease from the new one.
#[derive(Debug, Default)]
pub struct HolderGone {
    notify: tokio::sync::Notify,
    /// The last report not yet taken: the annotation the watch found refusing.
    endpoints: std::sync::Mutex<Option<Option<String>>>,
}

impl HolderGone {
    /// No report yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The holder whose Lease names `endpoints` (the [`ENDPOINTS_ANNOTATION`] value, `None`
    /// when it names none) is gone.
    pub fn report(&self, endpoints: Option<String>) {
        *self.endpoints.lock_or_recover() = Some(endpoints);
        self.notify.notify_one();
    }

    /// Waits for the next report; the endpoints it names.
    pub async fn wait(&self) -> Option<String> {
        loop {
            if let Some(e) = self.endpoints.lock_or_recover().take() {
                return e;
            }
            self.notify.notified().await;
        }
    }
}

/// One participant in the election.
pub struct LeaderElector<S: Store> {
    store: S,
    config: LeaderConfig,
    /// The Lease's resourceVersion when we last saw it change, and when that was.
    observed: Option<(String, Instant)>,
    /// What we write to [`ENDPOINTS_ANNOTATION`] while we hold the Lease.
    endpoints: Option<String>,
    /// The current holder's [`ENDPOINTS_ANNOTATION`], while another controller validly
    /// holds the Lease.
    leader_endpoints: tokio::sync::watch::Sender<Option<String>>,
    /// When the Lease another controller holds expires unless renewed, as last seen.
    expires: Option<Instant>,
    /// The Lease's resourceVersion when we were told its holder is gone, and the endpoints
    /// found refusing connections: the Lease unchanged since and naming those endpoints, it
    /// is taken without waiting for expiry.
    holder_gone: Option<(Option<String>, Option<String>)>,
}

fn micro_now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

fn duration_secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

impl<S: Store> LeaderElector<S> {
    /// A participant; fails when `config` is inconsistent.
    pub fn new(store: S, config: LeaderConfig) -> Result<Self, LeaderError> {
        config.check()?;
        Ok(Self {
            store,
            config,
            observed: None,
            endpoints: None,
            leader_endpoints: tokio::sync::watch::channel(None).0,
            expires: None,
            holder_gone: None,
        })
    }

    /// Where we serve, written to the Lease with each renewal while we hold it.
    pub fn set_endpoints(&mut self, endpoints: String) {
        self.endpoints = Some(endpoints);
    }

    /// Where the controller holding the Lease serves, as its [`ENDPOINTS_ANNOTATION`] said
    /// when we last looked; `None` while nobody else validly holds it.
    pub fn leader_endpoints(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.leader_endpoints.subscribe()
    }

    fn annotate(&self, meta: &mut ObjectMeta) {
        if let Some(e) = &self.endpoints {
            let (ports, ui) = split_endpoints(e);
            let a = meta.annotations.get_or_insert_with(Default::default);
            a.insert(ENDPOINTS_ANNOTATION.to_owned(), ports.to_owned());
            match ui {
                Some(ui) => a.insert(UI_ENDPOINT_ANNOTATION.to_owned(), ui.to_owned()),
                None => a.remove(UI_ENDPOINT_ANNOTATION),
            };
        }
    }

    fn store_err(&self, source: StoreError) -> LeaderError {
        LeaderError::Store {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            source: Box::new(source),
        }
    }

    /// One attempt to take or renew the Lease; `Ok(true)` when we hold it afterwards.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, LeaderError> {
        let (ns, name) = (self.config.namespace.clone(), self.config.name.clone());
        let now = Instant::now();
        let current = self
            .store
            .get::<Lease>(&ns, &name)
            .await
            .map_err(|e| self.store_err(e))?;
        let Some(mut lease) = current else {
            self.leader_endpoints.send_replace(None);
            let mut metadata = ObjectMeta {
                name: Some(name),
                namespace: Some(ns),
                ..ObjectMeta::default()
            };
            self.annotate(&mut metadata);
            let lease = Lease {
                metadata,
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.config.identity.clone()),
                    lease_duration_seconds: Some(duration_secs(self.config.lease_duration)),
                    acquire_time: Some(micro_now()),
                    renew_time: Some(micro_now()),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.store.create(&lease).await {
                Ok(stored) => {
                    self.observe(&stored, Instant::now());
                    Ok(true)
                }
                // Somebody else created it first.
                Err(StoreError::AlreadyExists { .. }) => Ok(false),
                Err(e) => Err(self.store_err(e)),
            };
        };
        self.observe(&lease, now);
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let ours = holder == self.config.identity;
        if !ours && !holder.is_empty() {
            let valid_for = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(self.config.lease_duration, Duration::from_secs);
            let seen_at = self.observed.as_ref().map_or(now, |(_, at)| *at);
            let theirs = lease
                .metadata
                .annotations
                .as_ref()
                .and_then(joined_endpoints);
            let gone = self.holder_gone.as_ref().is_some_and(|(rv, endpoints)| {
                *rv == lease.metadata.resource_version && *endpoints == theirs
            });
            if gone {
                tracing::info!(
                    "leader election: {holder} refuses connections where it said it serves \
                     and has not renewed since: taking Lease {ns}/{name} over without waiting \
                     for its expiry"
                );
            }
            if now < seen_at + valid_for && !gone {
                self.expires = Some(seen_at + valid_for);
                self.leader_endpoints.send_if_modified(|e| {
                    let changed = *e != theirs;
                    *e = theirs;
                    changed
                });
                return Ok(false);
            }
        }
        self.expires = None;
        self.leader_endpoints
            .send_if_modified(|e| e.take().is_some());
        let mut next = spec;
        if !ours {
            next.acquire_time = Some(micro_now());
            next.lease_transitions = Some(next.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        next.holder_identity = Some(self.config.identity.clone());
        next.lease_duration_seconds = Some(duration_secs(self.config.lease_duration));
        next.renew_time = Some(micro_now());
        lease.spec = Some(next);
        self.annotate(&mut lease.metadata);
        match self.store.update(&lease).await {
            Ok(stored) => {
                self.observe(&stored, Instant::now());
                Ok(true)
            }
            // Written by someone else meanwhile: look again next time.
            Err(e) if e.is_conflict() => Ok(false),
            Err(e) => Err(self.store_err(e)),
        }
    }

    fn observe(&mut self, lease: &Lease, at: Instant) {
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        if self.observed.as_ref().is_none_or(|(seen, _)| *seen != rv) {
            self.observed = Some((rv, at));
        }
    }

    /// Waits until we hold the Lease (retrying every renew period; store errors are logged
    /// and retried).
    ///
    /// Also tries at once when `holder_gone` is notified (the holder's endpoints refuse
    /// connections: its process is gone, [`super::standby::watch_leader`]); the Lease is then
    /// taken over, without waiting for its expiry, unless its holder renewed it since we last
    /// saw it.
    pub async fn acquire_or_take_over(&mut self, holder_gone: &HolderGone) {
        let mut logged = false;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(
                        "leader election: {} now holds Lease {}/{}",
                        self.config.identity,
                        self.config.namespace,
                        self.config.name
                    );
                    return;
                }
                Ok(false) if !logged => {
                    tracing::info!(
                        "leader election: Lease {}/{} is held by another controller; standing by",
                        self.config.namespace,
                        self.config.name
                    );
                    logged = true;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!("{e}; retrying", e = jumpstarter_core::error_chain(&e)),
            }
            self.holder_gone = None;
            tokio::select! {
                _ = tokio::time::sleep(self.next_attempt_in()) => {}
                endpoints = holder_gone.wait() => {
                    self.holder_gone = self
                        .observed
                        .as_ref()
                        .map(|(rv, _)| (Some(rv.clone()), endpoints));
                }
            }
        }
    }

    /// How long a standby waits before its next attempt: a renew period, or less when the
    /// holder's Lease expires sooner (so a dead leader is replaced as soon as it may be).
    fn next_attempt_in(&self) -> Duration {
        let period = self.config.renew_period;
        self.expires.map_or(period, |at| {
            let left = at.saturating_duration_since(Instant::now()) + Duration::from_millis(20);
            left.min(period)
        })
    }

    /// Renews the Lease every renew period while we hold it; returns (with
    /// [`LeaderError::Lost`]) once another controller took it or it could not be renewed
    /// for [`LeaderConfig::renew_deadline`]. Call after [`Self::acquire`].
    pub async fn hold(&mut self) -> LeaderError {
        let mut renewed = Instant::now();
        // The first renewal at once: it writes where we serve (set since `acquire`), which
        // the standbys wait for before they forward.
        let mut first = true;
        loop {
            if !std::mem::take(&mut first) {
                tokio::time::sleep(self.config.renew_period).await;
            }
            let outcome = self.try_acquire_or_renew().await;
            match outcome {
                Ok(true) => renewed = Instant::now(),
                Ok(false) => {
                    return self.lost("another controller holds it now".into());
                }
                Err(e) => {
                    tracing::warn!(
                        "leader election: renewal failed: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    );
                }
            }
            if renewed.elapsed() >= self.config.renew_deadline() {
                return self.lost(format!(
                    "not renewed for {:?}",
                    self.config.renew_deadline()
                ));
            }
        }
    }

    fn lost(&self, reason: String) -> LeaderError {
        LeaderError::Lost {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            reason,
        }
    }

    /// Gives the Lease up (empty holder) if we still hold it, so a standby takes over at
    /// its next attempt instead of after the lease duration.
    pub async fn release(&mut self) -> Result<(), LeaderError> {
        let (ns, name) = (self.config.namespace.clone(), self.config.name.clone());
        let Some(mut lease) = self
            .store
            .get::<Lease>(&ns, &name)
            .await
            .map_err(|e| self.store_err(e))?
        else {
            return Ok(());
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        if let Some(a) = lease.metadata.annotations.as_mut() {
            a.remove(ENDPOINTS_ANNOTATION);
            a.remove(UI_ENDPOINT_ANNOTATION);
        }
        spec.renew_time = Some(micro_now());
        lease.spec = Some(spec);
        match self.store.update(&lease).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_conflict() => Ok(()),
            Err(e) => Err(self.store_err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(identity: &str) -> LeaderConfig {
        LeaderConfig {
            namespace: "lab".into(),
            name: LEASE_NAME.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(1),
            renew_period: Duration::from_millis(100),
        }
    }

    #[test]
    fn inconsistent_settings_are_refused() {
        let bad = [
            LeaderConfig {
                lease_duration: Duration::from_millis(500),
                ..config("a")
            },
            LeaderConfig {
                renew_period: Duration::from_secs(1),
                ..config("a")
            },
            LeaderConfig {
                renew_period: Duration::ZERO,
                ..config("a")
            },
            config(""),
        ];
        for c in bad {
            assert!(c.check().is_err(), "{c:?} accepted");
        }
        assert!(config("a").check().is_ok());
        assert!(LeaderConfig::new("ns").check().is_ok());
    }

    async fn elect_and_take_over<S: Store>(store: S) {
        let mut a = LeaderElector::new(store.clone(), config("a")).unwrap();
        let mut b = LeaderElector::new(store.clone(), config("b")).unwrap();
        assert!(a.try_acquire_or_renew().await.unwrap());
        assert!(!b.try_acquire_or_renew().await.unwrap());
        // Renewals keep b out, even past the lease duration.
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            assert!(a.try_acquire_or_renew().await.unwrap());
            assert!(!b.try_acquire_or_renew().await.unwrap());
        }
        // a stops renewing: b takes over once the lease has not changed for its duration.
        let started = Instant::now();
        tokio::time::timeout(
            Duration::from_secs(5),
            b.acquire_or_take_over(&HolderGone::new()),
        )
        .await
        .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(700));
        let lease = store
            .get::<Lease>("lab", LEASE_NAME)
            .await
            .unwrap()
            .unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(1));
        // a notices at its next renewal.
        let lost = tokio::time::timeout(Duration::from_secs(5), a.hold())
            .await
            .unwrap();
        assert!(matches!(lost, LeaderError::Lost { .. }), "{lost}");
        // A released lease is taken at once.
        b.release().await.unwrap();
        assert!(a.try_acquire_or_renew().await.unwrap());
    }

    #[tokio::test]
    async fn a_standby_tries_again_when_the_lease_expires_not_a_renew_period_later() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(dir.path()).await.unwrap();
        let cfg = |id: &str| LeaderConfig {
            lease_duration: Duration::from_secs(1),
            renew_period: Duration::from_millis(600),
            ..config(id)
        };
        let mut a = LeaderElector::new(store.clone(), cfg("a")).unwrap();
        let mut b = LeaderElector::new(store.clone(), cfg("b")).unwrap();
        // Nobody seen yet: a renew period.
        assert_eq!(b.next_attempt_in(), Duration::from_millis(600));
        assert!(a.try_acquire_or_renew().await.unwrap());
        assert!(!b.try_acquire_or_renew().await.unwrap());
        assert!(b.next_attempt_in() <= Duration::from_millis(600));
        // 700 ms into the 1 s lease: b's next attempt is at its expiry (plus 20 ms), not
        // 600 ms later.
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(
            b.next_attempt_in() <= Duration::from_millis(320),
            "{:?}",
            b.next_attempt_in()
        );
    }

    #[tokio::test]
    async fn a_standby_told_the_holder_is_gone_takes_over_unless_it_renewed() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(dir.path()).await.unwrap();
        let cfg = |id: &str| LeaderConfig {
            lease_duration: Duration::from_secs(30),
            renew_period: Duration::from_millis(500),
            ..config(id)
        };
        let mut a = LeaderElector::new(store.clone(), cfg("a")).unwrap();
        let mut b = LeaderElector::new(store.clone(), cfg("b")).unwrap();
        assert!(a.try_acquire_or_renew().await.unwrap());
        assert!(!b.try_acquire_or_renew().await.unwrap());

        // The holder renews after b looked, then b hears it is gone: it is not (it renewed).
        let gone = std::sync::Arc::new(HolderGone::new());
        let waiting = {
            let gone = gone.clone();
            tokio::spawn(async move {
                b.acquire_or_take_over(&gone).await;
                b
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(a.try_acquire_or_renew().await.unwrap());
        gone.report(None);
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(
            !waiting.is_finished(),
            "took a Lease its holder had just renewed"
        );
        waiting.abort();

        // Told the holder is gone, with no renewal since: taken at once, 30 s before expiry.
        let mut c = LeaderElector::new(store.clone(), cfg("c")).unwrap();
        assert!(!c.try_acquire_or_renew().await.unwrap());
        let gone = HolderGone::new();
        gone.report(None);
        tokio::time::timeout(Duration::from_secs(5), c.acquire_or_take_over(&gone))
            .await
            .expect("the Lease of a gone holder was not taken over");
        let lease = store
            .get::<Lease>("lab", LEASE_NAME)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("c"));
        // And a, renewing, learns it lost.
        assert!(!a.try_acquire_or_renew().await.unwrap());
    }

    #[tokio::test]
    async fn a_report_about_a_replaced_holder_does_not_take_the_lease_from_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(dir.path()).await.unwrap();
        let cfg = |id: &str| LeaderConfig {
            lease_duration: Duration::from_secs(30),
            renew_period: Duration::from_millis(200),
            ..config(id)
        };
        let (old, new) = (
            "grpc=127.0.0.4:8082,router=127.0.0.4:8083".to_string(),
            "grpc=127.0.0.8:8082,router=127.0.0.8:8083".to_string(),
        );
        let mut a = LeaderElector::new(store.clone(), cfg("a")).unwrap();
        a.set_endpoints(old.clone());
        assert!(a.try_acquire_or_renew().await.unwrap());
        let mut b = LeaderElector::new(store.clone(), cfg("b")).unwrap();
        assert!(!b.try_acquire_or_renew().await.unwrap());
        // A rolling update: a gives the Lease up, c (elsewhere) takes it, and b sees c
        // before its watch reports that a's old address refuses connections.
        a.release().await.unwrap();
        let mut c = LeaderElector::new(store.clone(), cfg("c")).unwrap();
        c.set_endpoints(new.clone());
        assert!(c.try_acquire_or_renew().await.unwrap());
        assert!(!b.try_acquire_or_renew().await.unwrap());
        let gone = std::sync::Arc::new(HolderGone::new());
        let waiting = {
            let gone = gone.clone();
            tokio::spawn(async move {
                b.acquire_or_take_over(&gone).await;
                b
            })
        };
        gone.report(Some(old));
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(
            !waiting.is_finished(),
            "took the Lease from a new leader on a report about the one it replaced"
        );
        // A report about c's own address (c not renewing since) takes it.
        gone.report(Some(new));
        let _b = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the Lease of a gone holder was not taken over")
            .unwrap();
        let lease = store
            .get::<Lease>("lab", LEASE_NAME)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("b"));
    }

    #[tokio::test]
    async fn the_dashboard_is_named_in_an_annotation_of_its_own() {
        use crate::kubernetes::standby::Endpoints;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(dir.path()).await.unwrap();
        let cfg = |id: &str| LeaderConfig {
            lease_duration: Duration::from_secs(30),
            ..config(id)
        };
        let with_ui = "grpc=10.0.0.4:8082,router=10.0.0.4:8083,ui=10.0.0.4:8086";
        let mut a = LeaderElector::new(store.clone(), cfg("a")).unwrap();
        a.set_endpoints(with_ui.to_string());
        assert!(a.try_acquire_or_renew().await.unwrap());
        let annotations = || async {
            store
                .get::<Lease>("lab", LEASE_NAME)
                .await
                .unwrap()
                .unwrap()
                .metadata
                .annotations
                .unwrap_or_default()
        };
        let written = annotations().await;
        // What a standby that knows no dashboard reads: the two ports alone, in the
        // grammar it accepts (`grpc=`, `router=`; it refuses any other part).
        let ports = &written[ENDPOINTS_ANNOTATION];
        assert_eq!(ports, "grpc=10.0.0.4:8082,router=10.0.0.4:8083");
        assert!(
            ports
                .split(',')
                .all(|p| p.starts_with("grpc=") || p.starts_with("router="))
        );
        assert_eq!(written[UI_ENDPOINT_ANNOTATION], "10.0.0.4:8086");
        // A standby of this version sees all three.
        let mut b = LeaderElector::new(store.clone(), cfg("b")).unwrap();
        assert!(!b.try_acquire_or_renew().await.unwrap());
        let seen = b.leader_endpoints().borrow().clone().unwrap();
        assert_eq!(seen, with_ui);
        let e = Endpoints::parse(&seen).unwrap();
        assert_eq!(e.ui, Some("10.0.0.4:8086".parse().unwrap()));
        // The dashboard no longer reachable: its annotation goes.
        a.set_endpoints("grpc=10.0.0.4:8082,router=10.0.0.4:8083".to_string());
        assert!(a.try_acquire_or_renew().await.unwrap());
        assert!(!annotations().await.contains_key(UI_ENDPOINT_ANNOTATION));
        // A dashboard address that does not parse costs only the dashboard.
        let mut bad = annotations().await;
        bad.insert(UI_ENDPOINT_ANNOTATION.into(), "not an address".into());
        assert_eq!(
            joined_endpoints(&bad).as_deref(),
            Some("grpc=10.0.0.4:8082,router=10.0.0.4:8083")
        );
        // And both go when the Lease is given up.
        a.set_endpoints(with_ui.to_string());
        assert!(a.try_acquire_or_renew().await.unwrap());
        a.release().await.unwrap();
        let left = annotations().await;
        assert!(!left.contains_key(ENDPOINTS_ANNOTATION), "{left:?}");
        assert!(!left.contains_key(UI_ENDPOINT_ANNOTATION), "{left:?}");
    }

    #[tokio::test]
    async fn standby_takes_over_when_the_lease_expires_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(dir.path()).await.unwrap();
        elect_and_take_over(store).await;
    }

    #[cfg(feature = "kubernetes")]
    #[tokio::test]
    async fn standby_takes_over_when_the_lease_expires_fake_api() {
        let api = crate::testing::FakeApiServer::new();
        let store = crate::store::KubeStore::new(api.client());
        elect_and_take_over(store).await;
    }
}
