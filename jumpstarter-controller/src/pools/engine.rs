//! The pool engine: keeps each ExporterSet's replicas between its floors and its ceiling
//! (upstream's JEP-0014 reconcile loop).
//!
//! Every pass (woken by changes of ExporterSets, classes, Exporters and Leases, and at least
//! every [`DEFAULT_TICK`]) looks at each set's replicas (the Exporters labelled
//! [`LABEL_EXPORTER_SET`] and controlled by the set) and what its provisioner runs, then:
//!
//! - keeps `minAvailableReplicas` available (online, registered, enabled, healthy, unleased),
//!   counting replicas still starting as on their way;
//! - starts one replica per waiting lease whose selector the template's labels match (not
//!   pinned to an exporter, not begun in the future), up to `maxReplicas`, at most
//!   [`DEFAULT_MAX_STARTS`] per pass;
//! - keeps at least `minReplicas`;
//! - scales an idle excess replica down once it has been idle for `scaleDownCooldown`:
//!   disabled first (so no lease is granted to it meanwhile), removed once unleased;
//! - removes a replica whose process ended (after its lease with `ExitAndReplace`, or killed),
//!   that was quarantined, or that has nothing running behind it (after a restart, when its
//!   provisioner did not adopt it again), and stops what a provisioner runs without an Exporter.
//!
//! What to do is decided by [`decide`], a pure function of the replicas' states; the pass
//! carries it out. With `ExitAndReplace` a replica is disabled as soon as it is leased, so
//! that between its lease's end and its exit no other lease is granted to it.
//!
//! The engine runs with the reconcile loop (on Kubernetes, only while this controller leads).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use jumpstarter_core::{
    auth::ObjectKind,
    config::{DriverInstance, ExporterConfig, ObjectMeta as ConfigMeta, TlsConfig, encode_ca},
};
use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1 as metav1};
use tokio::sync::Notify;

use super::{
    decisions::{Action, Decision},
    provisioner::{ProvisionError, Provisioner, ReplicaObservation, ReplicaPhase, ReplicaRequest},
};
use crate::{
    lease::scheduler::{exporter_is_online, exporter_is_ready, policies_grant},
    objects::{
        Client, Exporter, ExporterAccessPolicy, ExporterSpec, LEASE_ENDED_LABEL, Lease, ObjectKey,
        selector::LabelSelector,
        set_condition,
        virtualtarget::{
            ExporterSet, ExporterSetSpec, ExporterSetStatus, LABEL_EXPORTER_SET, RecycleStrategy,
            VirtualTargetClass,
        },
    },
    state::ControllerState,
    store::{ListParams, Store, StoreError, StoreObject, controller_reference},
};

/// How often a pass runs when nothing changes.
pub const DEFAULT_TICK: Duration = Duration::from_secs(1);
/// Replicas started per set in one pass, at most (no scaling storm).
pub const DEFAULT_MAX_STARTS: usize = 4;
/// The shortest time between two passes (a busy store's changes wake the engine often).
const MIN_PASS_INTERVAL: Duration = Duration::from_millis(200);
/// How long an `ExitAndReplace` replica may keep running after its lease before it is
/// stopped (its afterLease hook runs in that time).
pub const EXIT_GRACE: SignedDuration = SignedDuration::from_secs(60);
/// How long a new Exporter may go unseen by its provisioner before it counts as orphaned.
pub const START_GRACE: SignedDuration = SignedDuration::from_secs(30);
/// How long a new replica may take to come online and register before it is replaced.
pub const START_TIMEOUT: SignedDuration = SignedDuration::from_mins(5);
/// The longest wait before starting again after replicas failed before becoming ready (the
/// wait doubles from 1 s with each such failure in a row).
pub const MAX_START_BACKOFF: SignedDuration = SignedDuration::from_mins(5);
/// Annotation the engine puts on a replica it disabled: why (`ScaleDown` or
/// `ExitAndReplace`). A replica disabled without it (by an admin) is left alone.
pub const ANNOTATION_RETIRING: &str = "virtualtarget.jumpstarter.dev/retiring";
const RETIRING_SCALE_DOWN: &str = "ScaleDown";
const RETIRING_EXIT: &str = "ExitAndReplace";

/// ExporterSet condition types.
pub mod condition {
    /// Enough replicas are available (`minAvailableReplicas`) and there are `minReplicas`.
    pub const READY: &str = "Ready";
    /// Leases wait but the set is at `maxReplicas`.
    pub const SCALING_LIMITED: &str = "ScalingLimited";
    /// The class's provisioner is unknown here or failed.
    pub const PROVISIONER_UNAVAILABLE: &str = "ProvisionerUnavailable";
    /// The set (or its class reference) is invalid: nothing is scaled.
    pub const INVALID: &str = "Invalid";
}

// ---------------------------------------------------------------------------------------------
// Provisioners

/// The provisioners a controller has, by the `spec.provisioner` value each serves.
#[derive(Clone, Default)]
pub struct Provisioners(BTreeMap<String, Arc<dyn Provisioner>>);

impl Provisioners {
    /// Adds (or replaces) `p` under its [`Provisioner::name`].
    pub fn insert(&mut self, p: Arc<dyn Provisioner>) {
        self.0.insert(p.name().to_string(), p);
    }

    /// The provisioner named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Provisioner>> {
        self.0.get(name)
    }

    /// The names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Provisioners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The provisioners, by name.
    pub provisioners: Provisioners,
    /// PEM of the CA the replicas trust (empty: system roots), as `jmp admin create exporter`
    /// writes it into an exporter config.
    pub ca_pem: String,
    /// Keep each replica's token in its credential Secret too (`<name>-exporter`).
    pub credential_secrets: bool,
    /// How often a pass runs when nothing changes.
    pub tick: Duration,
    /// Replicas started per set in one pass, at most.
    pub max_starts_per_pass: usize,
}

impl EngineConfig {
    /// The defaults with `provisioners`.
    pub fn new(provisioners: Provisioners) -> Self {
        Self {
            provisioners,
            ca_pem: String::new(),
            credential_secrets: false,
            tick: DEFAULT_TICK,
            max_starts_per_pass: DEFAULT_MAX_STARTS,
        }
    }
}

/// What a controller runs the pool engine with (`ControllerConfig::pools`).
#[derive(Debug, Clone)]
pub struct PoolsConfig {
    /// Provisioners besides the local one (e.g. `qemu.jumpstarter.dev` on Kubernetes).
    pub provisioners: Provisioners,
    /// The `local` provisioner's options; `None`: no local provisioner.
    pub local: Option<super::local::LocalOptions>,
    /// When the controller stops gracefully, stop the local replicas too (SIGTERM, their
    /// afterLease hooks run). Off by default: they keep serving their leases and a restarted
    /// controller adopts them again.
    pub stop_replicas_on_exit: bool,
}

impl PoolsConfig {
    /// The defaults for a controller with data in `data_dir`: the local provisioner with its
    /// replicas under `<data_dir>/pools`, `jmp` beside the controller or on `PATH`.
    pub fn new(data_dir: &std::path::Path) -> Self {
        Self {
            provisioners: Provisioners::default(),
            local: Some(super::local::LocalOptions::new(
                super::local::default_pools_dir(data_dir),
            )),
            stop_replicas_on_exit: false,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The decision (pure)

/// One replica as [`decide`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaState {
    /// Started; its exporter is not yet online and registered.
    Starting,
    /// Online, registered, enabled, healthy, ready and unleased: the warm pool.
    Available,
    /// Holding a lease.
    Leased,
    /// Online but not leasable for a reason that is not the engine's (disabled by an admin,
    /// running a hook).
    Unavailable,
    /// Disabled by the engine to scale down; `leased` while a lease granted before still
    /// holds it.
    Draining {
        /// Still leased.
        leased: bool,
    },
    /// `ExitAndReplace`: it served a lease and is to exit; `overdue` once unleased for longer
    /// than [`EXIT_GRACE`].
    Retiring {
        /// Still leased.
        leased: bool,
        /// Unleased and still running after the grace.
        overdue: bool,
    },
    /// Its process or Pod ended (`Succeeded` or `Failed`).
    Ended {
        /// It failed (killed, crashed, could not start).
        failed: bool,
    },
    /// Quarantined by the health check (`Healthy=False`).
    Quarantined {
        /// Still leased.
        leased: bool,
    },
    /// Nothing runs behind it (e.g. after a restart, not adopted again by its provisioner).
    Orphaned,
    /// Started [`START_TIMEOUT`] ago and never online and registered.
    NeverReady,
}

/// A replica and its state, for [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaView {
    /// The replica's (Exporter's) name.
    pub name: String,
    /// Its state.
    pub state: ReplicaState,
    /// Since when it has been available (for the cooldown).
    pub idle_since: Option<Timestamp>,
}

/// A set's scaling bounds, for [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scaling {
    /// `minReplicas`.
    pub min: usize,
    /// `maxReplicas` (`usize::MAX` for no bound).
    pub max: usize,
    /// `minAvailableReplicas`.
    pub min_available: usize,
    /// `scaleDownCooldown`.
    pub cooldown: SignedDuration,
    /// `recycleStrategy` is `ExitAndReplace`.
    pub exit_and_replace: bool,
    /// Replicas started in one pass, at most.
    pub max_starts: usize,
}

impl Scaling {
    /// The bounds of `spec` (which must be valid), starting at most `max_starts` per pass.
    pub fn of(spec: &ExporterSetSpec, cooldown: SignedDuration, max_starts: usize) -> Self {
        let n = |v: i32| usize::try_from(v).unwrap_or(0);
        Self {
            min: n(spec.min()),
            max: if spec.max() == i32::MAX {
                usize::MAX
            } else {
                n(spec.max())
            },
            min_available: n(spec.min_available()),
            cooldown,
            exit_and_replace: spec.recycle() == RecycleStrategy::ExitAndReplace,
            max_starts,
        }
    }
}

/// A replica to remove, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// The replica's name.
    pub name: String,
    /// `ScaleDown` or `Replace`.
    pub action: Action,
    /// Why, in words.
    pub reason: String,
}

/// What [`decide`] wants done in a pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Replicas to start.
    pub start: usize,
    /// Why they are started, in words.
    pub start_reason: String,
    /// Replicas to disable because their lease means they are to exit (`ExitAndReplace`).
    pub retire: Vec<String>,
    /// Idle replicas to disable to scale down (removed once unleased).
    pub drain: Vec<String>,
    /// Replicas to remove (stop, delete their Exporter).
    pub remove: Vec<Removal>,
    /// Set when more replicas are wanted than `maxReplicas` allows while leases wait.
    pub limited: Option<String>,
}

/// What to do for one set: `replicas` in their states, `pending` leases waiting that a
/// replica could serve, at `now`.
pub fn decide(s: &Scaling, replicas: &[ReplicaView], pending: usize, now: Timestamp) -> Plan {
    let mut plan = Plan::default();
    let mut remaining: Vec<&ReplicaView> = Vec::new();
    for r in replicas {
        let removal = |action, reason: &str| Removal {
            name: r.name.clone(),
            action,
            reason: reason.to_string(),
        };
        match r.state {
            ReplicaState::Ended { failed: false } => plan
                .remove
                .push(removal(Action::Replace, "its exporter exited")),
            ReplicaState::Ended { failed: true } => plan
                .remove
                .push(removal(Action::Replace, "its process failed")),
            ReplicaState::Quarantined { leased: false } => plan
                .remove
                .push(removal(Action::Replace, "quarantined by its health check")),
            ReplicaState::Orphaned => plan
                .remove
                .push(removal(Action::Replace, "nothing runs behind it")),
            ReplicaState::NeverReady => plan.remove.push(removal(
                Action::Replace,
                "not online and registered within 5m of its start",
            )),
            ReplicaState::Draining { leased: false } => plan
                .remove
                .push(removal(Action::ScaleDown, "idle beyond the warm pool")),
            ReplicaState::Retiring {
                leased: false,
                overdue: true,
            } => plan.remove.push(removal(
                Action::Replace,
                "did not exit after its lease (stopped)",
            )),
            _ => remaining.push(r),
        }
    }
    let count = |f: fn(&ReplicaState) -> bool| remaining.iter().filter(|r| f(&r.state)).count();
    let total = remaining.len();
    let available = count(|s| *s == ReplicaState::Available);
    let starting = count(|s| *s == ReplicaState::Starting);
    let going = count(|s| matches!(s, ReplicaState::Draining { .. }));
    if s.exit_and_replace {
        plan.retire = remaining
            .iter()
            .filter(|r| r.state == ReplicaState::Leased)
            .map(|r| r.name.clone())
            .collect();
    }
    // Unleased replicas wanted: the warm pool plus one per waiting lease.
    let wanted = s.min_available.saturating_add(pending);
    let coming = available + starting;
    let deficit = wanted
        .saturating_sub(coming)
        .max(s.min.saturating_sub(total - going));
    let room = s.max.saturating_sub(total);
    if deficit > 0 {
        plan.start = deficit.min(room).min(s.max_starts);
        plan.start_reason = format!(
            "{pending} lease(s) waiting, {available} available, {starting} starting, \
             minAvailableReplicas {}, minReplicas {}",
            s.min_available, s.min
        );
        if deficit > room && pending > 0 {
            plan.limited = Some(format!(
                "{pending} lease(s) waiting and {total} replica(s): maxReplicas {} reached",
                s.max
            ));
        }
        return plan;
    }
    // Scale down the idle excess, longest idle first, never below the floors.
    let excess = available
        .saturating_sub(wanted)
        .min((total - going).saturating_sub(s.min));
    if excess > 0 {
        let mut idle: Vec<(Timestamp, &str)> = remaining
            .iter()
            .filter(|r| r.state == ReplicaState::Available)
            .filter_map(|r| Some((r.idle_since?, r.name.as_str())))
            .filter(|(since, _)| since.saturating_add(s.cooldown).is_ok_and(|t| t <= now))
            .collect();
        idle.sort();
        plan.drain = idle
            .into_iter()
            .take(excess)
            .map(|(_, n)| n.to_string())
            .collect();
    }
    plan
}

// ---------------------------------------------------------------------------------------------
// Replica names and configs

/// Why a replica's exporter config cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaConfigError {
    /// Two drivers of the template have one name.
    #[error("ExporterSet {set}: spec.template.spec.drivers: driver name {name:?} is used twice")]
    DuplicateDriver {
        /// The set.
        set: String,
        /// The name.
        name: String,
    },
    /// A driver has neither `type` nor `ref`, or both.
    #[error("ExporterSet {set}: spec.template.spec.drivers: driver {name:?}: {reason}")]
    BadDriver {
        /// The set.
        set: String,
        /// The driver's name.
        name: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The config does not serialize.
    #[error("ExporterSet {set}: the exporter config of replica {replica} cannot be written")]
    Write {
        /// The set.
        set: String,
        /// The replica.
        replica: String,
        /// Why.
        #[source]
        source: Box<jumpstarter_core::ConfigError>,
    },
}

/// The labels of `set`'s replicas: the template's plus [`LABEL_EXPORTER_SET`].
pub fn replica_labels(set: &ExporterSet) -> BTreeMap<String, String> {
    let mut labels = set
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(LABEL_EXPORTER_SET.to_string(), set_name(set).to_string());
    labels
}

/// A new replica name for set `set`: `<set>-<5 random lowercase alphanumerics>`, a valid DNS
/// label (dots become dashes; the set part is cut to fit 63 characters).
pub fn replica_name(set: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = [0u8; 5];
    let random = ring::rand::SystemRandom::new();
    if ring::rand::SecureRandom::fill(&random, &mut bytes).is_err() {
        // No system randomness: the uuid's (also random) bytes.
        bytes.copy_from_slice(&uuid::Uuid::new_v4().as_bytes()[..5]);
    }
    let suffix: String = bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect();
    let mut base: String = set
        .chars()
        .map(|c| if c == '.' { '-' } else { c })
        .take(63 - 6)
        .collect();
    while base.ends_with('-') {
        base.pop();
    }
    format!("{base}-{suffix}")
}

/// The exporter config of replica `namespace/name` of `set`: upstream's `ExporterConfig`
/// with `endpoint`, `token`, `tls` (the CA as `jmp admin create exporter` writes it),
/// `export` from the template's drivers (a `ref` names another driver of the template) and
/// `exitOnLeaseEnd` from the recycle strategy.
pub fn replica_config(
    set: &ExporterSet,
    namespace: &str,
    name: &str,
    endpoint: &str,
    token: &str,
    ca_pem: &str,
) -> Result<String, ReplicaConfigError> {
    let set_name = set_name(set).to_string();
    let mut cfg = ExporterConfig {
        api_version: jumpstarter_core::config::API_VERSION.into(),
        kind: "ExporterConfig".into(),
        metadata: ConfigMeta {
            namespace: Some(namespace.to_string()),
            name: name.to_string(),
        },
        endpoint: Some(endpoint.to_string()),
        tls: TlsConfig {
            ca: encode_ca(ca_pem),
            insecure: false,
        },
        token: Some(token.to_string()),
        grpc_options: BTreeMap::new(),
        description: None,
        export: Default::default(),
        hooks: Default::default(),
        failure_detection: Default::default(),
        health_check: None,
        direct_listener: None,
        direct_advertise: None,
        motd: None,
        exit_on_lease_end: set.spec.recycle() == RecycleStrategy::ExitAndReplace,
        console_transcripts: None,
        path: None,
    };
    let drivers = set
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.drivers.as_deref())
        .unwrap_or(&[]);
    let spanned = |v: &str| {
        serde_saphyr::Spanned::new(
            v.to_string(),
            serde_saphyr::Location::UNKNOWN,
            serde_saphyr::Location::UNKNOWN,
        )
    };
    for d in drivers {
        let bad = |reason| ReplicaConfigError::BadDriver {
            set: set_name.clone(),
            name: d.name.clone(),
            reason,
        };
        let instance = match (&d.type_, &d.ref_) {
            (Some(t), None) => DriverInstance {
                driver_type: Some(spanned(t)),
                config: d
                    .config
                    .as_ref()
                    .map(|c| c.0.clone())
                    .unwrap_or(serde_json::Value::Null),
                ..Default::default()
            },
            (None, Some(r)) => DriverInstance {
                reference: Some(spanned(r)),
                ..Default::default()
            },
            (None, None) => return Err(bad("either type or ref must be set")),
            (Some(_), Some(_)) => return Err(bad("type and ref are mutually exclusive")),
        };
        if cfg.export.insert(d.name.clone(), instance).is_some() {
            return Err(ReplicaConfigError::DuplicateDriver {
                set: set_name,
                name: d.name.clone(),
            });
        }
    }
    cfg.to_yaml().map_err(|source| ReplicaConfigError::Write {
        set: set_name,
        replica: name.to_string(),
        source: Box::new(source),
    })
}

fn set_name(set: &ExporterSet) -> &str {
    set.metadata.name.as_deref().unwrap_or_default()
}

fn set_namespace(set: &ExporterSet) -> &str {
    set.metadata.namespace.as_deref().unwrap_or_default()
}

fn name_of(m: &metav1::ObjectMeta) -> &str {
    m.name.as_deref().unwrap_or_default()
}

/// Whether `lease` waits for an exporter that a replica with `labels` in `namespace` could
/// serve: not ended or released, not granted, not pinned to an exporter, begun, and its
/// selector (not empty) matches.
pub fn lease_waits_for(
    lease: &Lease,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    now: Timestamp,
) -> bool {
    if lease.metadata.namespace.as_deref() != Some(namespace)
        || lease.is_ended()
        || lease.spec.release
        || lease.assigned_exporter().is_some()
        || lease
            .spec
            .exporter_ref
            .as_ref()
            .is_some_and(|r| !r.name.is_empty())
        || lease.spec.begin_time.as_ref().is_some_and(|b| b.0 > now)
    {
        return false;
    }
    match LabelSelector::from_k8s(&lease.spec.selector) {
        Ok(sel) => !sel.is_empty() && sel.matches(labels),
        Err(_) => false,
    }
}

// ---------------------------------------------------------------------------------------------
// The engine

/// Why a replica could not be made or removed.
#[derive(Debug, thiserror::Error)]
enum ReplicaError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Status(String),
    #[error(transparent)]
    Config(#[from] ReplicaConfigError),
    #[error(transparent)]
    Provision(#[from] ProvisionError),
}

fn status_error(s: tonic::Status) -> ReplicaError {
    ReplicaError::Status(s.message().to_string())
}

/// The engine's memory between passes (lost on restart, which only restarts the cooldowns).
struct Engine<S: Store> {
    state: Arc<ControllerState<S>>,
    config: EngineConfig,
    /// Since when each replica has been available.
    idle_since: HashMap<ObjectKey, Timestamp>,
    /// Since when each retiring replica has been unleased.
    unleased_since: HashMap<ObjectKey, Timestamp>,
    /// Replicas this engine started or adopted.
    known: BTreeSet<ObjectKey>,
    /// The last "limited" message recorded per set (recorded again only when it changes).
    limited: HashMap<ObjectKey, String>,
    /// Each set as last seen, with its provisioner's name (to clean up after it goes).
    sets: HashMap<ObjectKey, (ExporterSet, Option<String>)>,
    /// Replicas seen online and registered at least once.
    ever_ready: BTreeSet<ObjectKey>,
    /// Per set: replicas in a row that failed before becoming ready, and when the next start
    /// may be (no crash loop when a template's exporter cannot start).
    backoff: HashMap<ObjectKey, (u32, Timestamp)>,
    /// Whether there is any pool (or leftover replica): Exporter and Lease changes wake the
    /// engine only then.
    active: Arc<AtomicBool>,
    /// The last pass found no set and no replica: until a set appears, a pass reads the sets
    /// only (one list, not four, on a controller without pools).
    swept: bool,
}

/// Everything a pass reads.
struct World {
    sets: Vec<ExporterSet>,
    classes: HashMap<ObjectKey, VirtualTargetClass>,
    /// Pool replicas (every Exporter carrying [`LABEL_EXPORTER_SET`]).
    replicas: Vec<Exporter>,
    leases: Vec<Lease>,
    /// (namespace, exporter) -> the live lease holding it.
    holders: HashMap<ObjectKey, String>,
    /// The access policies, read only while some lease waits (a lease its client may not
    /// have a pool's exporter for makes no replica).
    policies: Vec<ExporterAccessPolicy>,
    /// (namespace, client) -> its labels, read with the policies.
    client_labels: HashMap<ObjectKey, BTreeMap<String, String>>,
}

/// Runs the engine until `shutdown` resolves.
pub async fn run<S: Store>(
    state: Arc<ControllerState<S>>,
    config: EngineConfig,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let wake = Arc::new(Notify::new());
    // Exporter and Lease changes matter only while there are pools (or their leftovers).
    let active = Arc::new(AtomicBool::new(true));
    let watchers = vec![
        spawn_set_watch(state.clone(), wake.clone()),
        spawn_watch::<S, VirtualTargetClass>(state.store.clone(), wake.clone(), active.clone()),
        spawn_watch::<S, Exporter>(state.store.clone(), wake.clone(), active.clone()),
        spawn_watch::<S, Lease>(state.store.clone(), wake.clone(), active.clone()),
    ];
    tracing::info!(
        "pool engine running with provisioners {:?}",
        config.provisioners
    );
    let tick = config.tick;
    let mut engine = Engine {
        state,
        config,
        idle_since: HashMap::new(),
        unleased_since: HashMap::new(),
        known: BTreeSet::new(),
        limited: HashMap::new(),
        sets: HashMap::new(),
        ever_ready: BTreeSet::new(),
        backoff: HashMap::new(),
        active,
        swept: false,
    };
    loop {
        if let Err(e) = engine.pass().await {
            tracing::warn!(
                "pool engine pass failed: {e}",
                e = jumpstarter_core::error_chain(&e)
            );
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(MIN_PASS_INTERVAL) => {}
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = wake.notified() => {}
            _ = tokio::time::sleep(tick) => {}
        }
    }
    for w in watchers {
        w.abort();
    }
}

/// A task that pokes `wake` on every change of kind `K` (watching again after an error).
fn spawn_watch<S: Store, K: StoreObject>(
    store: S,
    wake: Arc<Notify>,
    active: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Ok(mut events) = store.watch::<K>(None, None).await {
                while let Some(Ok(_)) = events.next().await {
                    if active.load(Ordering::Relaxed) {
                        wake.notify_one();
                    }
                }
            }
            wake.notify_one();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// As [`spawn_watch`] for ExporterSets, also publishing a new or changed valid set's replica
/// labels at once, so that a lease asked for right after the set was made waits for its
/// replicas rather than ending before the next pass (which then corrects the labels).
fn spawn_set_watch<S: Store>(
    state: Arc<ControllerState<S>>,
    wake: Arc<Notify>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Ok(mut events) = state.store.watch::<ExporterSet>(None, None).await {
                while let Some(Ok(event)) = events.next().await {
                    if let crate::store::WatchEvent::Added(set)
                    | crate::store::WatchEvent::Modified(set) = &event
                        && set.spec.validate(set_name(set)).is_ok()
                    {
                        use jumpstarter_core::sync::LockExt;
                        let entry = (set_namespace(set).to_string(), replica_labels(set));
                        let mut slot = state.pool_labels.lock_or_recover();
                        if !slot.contains(&entry) {
                            let mut next = slot.to_vec();
                            next.push(entry);
                            *slot = next.into();
                        }
                    }
                    wake.notify_one();
                }
            }
            wake.notify_one();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

async fn list_all<S: Store, K: StoreObject>(
    store: &S,
    selector: &LabelSelector,
) -> Result<Vec<K>, StoreError> {
    Ok(store
        .list::<K>(None, selector, &ListParams::default())
        .await?
        .items)
}

fn key_of(m: &metav1::ObjectMeta) -> ObjectKey {
    (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

/// Whether `e` is controlled by `set` (its controller reference names the set's uid, or its
/// name when the set has no uid).
fn controlled_by(e: &Exporter, set: &ExporterSet) -> bool {
    e.metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|r| {
            r.kind == "ExporterSet"
                && r.controller == Some(true)
                && match set.metadata.uid.as_deref() {
                    Some(uid) => r.uid == uid,
                    None => Some(r.name.as_str()) == set.metadata.name.as_deref(),
                }
        })
}

impl<S: Store> Engine<S> {
    async fn read(&mut self) -> Result<World, StoreError> {
        let store = &self.state.store;
        let everything = LabelSelector::everything();
        let sets: Vec<ExporterSet> = list_all(store, &everything).await?;
        let idle = sets.is_empty() && self.sets.is_empty();
        self.active.store(!(idle && self.swept), Ordering::Relaxed);
        if idle && self.swept {
            return Ok(World {
                sets,
                classes: HashMap::new(),
                replicas: Vec::new(),
                leases: Vec::new(),
                holders: HashMap::new(),
                policies: Vec::new(),
                client_labels: HashMap::new(),
            });
        }
        let classes: Vec<VirtualTargetClass> = list_all(store, &everything).await?;
        let pooled =
            LabelSelector::parse(LABEL_EXPORTER_SET).unwrap_or_else(|_| everything.clone());
        let mut replicas: Vec<Exporter> = list_all(store, &pooled).await?;
        replicas.retain(|e| e.label_map().contains_key(LABEL_EXPORTER_SET));
        self.swept = idle && replicas.is_empty();
        if idle && replicas.is_empty() {
            // No pool: the leases (the long list) need not be read.
            return Ok(World {
                sets,
                classes: HashMap::new(),
                replicas,
                leases: Vec::new(),
                holders: HashMap::new(),
                policies: Vec::new(),
                client_labels: HashMap::new(),
            });
        }
        let not_ended = LabelSelector::parse(&format!("!{LEASE_ENDED_LABEL}"))
            .unwrap_or_else(|_| everything.clone());
        let mut leases: Vec<Lease> = list_all(store, &not_ended).await?;
        leases.retain(|l| !l.is_ended());
        let mut holders = HashMap::new();
        for l in &leases {
            if let Some(e) = l.assigned_exporter() {
                holders.insert(
                    (
                        l.metadata.namespace.clone().unwrap_or_default(),
                        e.to_string(),
                    ),
                    name_of(&l.metadata).to_string(),
                );
            }
        }
        // Policies matter only for leases that wait for an exporter.
        let (policies, client_labels) = if leases.iter().any(|l| l.assigned_exporter().is_none()) {
            let policies: Vec<ExporterAccessPolicy> = list_all(store, &everything).await?;
            let client_labels = if policies.is_empty() {
                HashMap::new()
            } else {
                list_all::<S, Client>(store, &everything)
                    .await?
                    .into_iter()
                    .map(|c| (key_of(&c.metadata), c.metadata.labels.unwrap_or_default()))
                    .collect()
            };
            (policies, client_labels)
        } else {
            (Vec::new(), HashMap::new())
        };
        Ok(World {
            sets,
            classes: classes
                .into_iter()
                .map(|c| (key_of(&c.metadata), c))
                .collect(),
            replicas,
            leases,
            holders,
            policies,
            client_labels,
        })
    }

    async fn pass(&mut self) -> Result<(), StoreError> {
        let world = self.read().await?;
        let mut live: BTreeSet<ObjectKey> = BTreeSet::new();
        let mut pools = Vec::new();
        for set in &world.sets {
            let key = key_of(&set.metadata);
            live.insert(key.clone());
            if let Some(labels) = self.reconcile_set(set, &world).await {
                pools.push((key.0.clone(), labels));
            }
        }
        self.publish(pools);
        // Replicas of sets that are gone (or were made by an earlier set of the same name).
        for e in &world.replicas {
            let ns = e.metadata.namespace.clone().unwrap_or_default();
            let set_label = e.label_map().get(LABEL_EXPORTER_SET).cloned();
            let Some(set_label) = set_label else { continue };
            let owner = world
                .sets
                .iter()
                .find(|s| set_namespace(s) == ns && set_name(s) == set_label);
            if owner.is_some_and(|s| controlled_by(e, s)) {
                continue;
            }
            if !has_set_controller(e) {
                // Labelled like a set's replica but not made by a set: not ours to remove.
                continue;
            }
            let name = name_of(&e.metadata).to_string();
            let provisioner = self
                .sets
                .get(&(ns.clone(), set_label.clone()))
                .and_then(|(_, p)| p.clone());
            let reason = if owner.is_some() {
                "made by an earlier ExporterSet of this name"
            } else {
                "its ExporterSet was deleted"
            };
            match self
                .remove_replica(&ns, &name, provisioner.as_deref(), &world)
                .await
            {
                Ok(()) => {
                    tracing::info!("pool {ns}/{set_label}: removed replica {name}: {reason}")
                }
                Err(e) => tracing::warn!(
                    "pool {ns}/{set_label}: cannot remove replica {name}: {e}",
                    e = jumpstarter_core::error_chain(&e)
                ),
            }
        }
        // Sets that are gone: stop what their provisioner still runs, forget them.
        let gone: Vec<ObjectKey> = self
            .sets
            .keys()
            .filter(|k| !live.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            if let Some((set, Some(p))) = self.sets.remove(&key)
                && let Some(p) = self.config.provisioners.get(&p).cloned()
                && let Ok(obs) = p.observe(&set).await
            {
                for o in obs {
                    if let Err(e) = p.stop(&key.0, &o.name).await {
                        tracing::warn!(
                            "pool {}/{}: cannot stop replica {}: {e}",
                            key.0,
                            key.1,
                            o.name,
                            e = jumpstarter_core::error_chain(&e)
                        );
                    }
                }
            }
            self.state.pool_decisions.forget(&key.0, &key.1);
            self.limited.remove(&key);
        }
        Ok(())
    }

    /// Publishes the label sets of the replicas that valid sets can make, so that the
    /// scheduler keeps a lease only they could serve waiting rather than unsatisfiable.
    fn publish(&self, pools: Vec<(String, BTreeMap<String, String>)>) {
        use jumpstarter_core::sync::LockExt;
        let mut slot = self.state.pool_labels.lock_or_recover();
        if slot.as_ref() != pools.as_slice() {
            *slot = pools.into();
        }
    }

    fn record(&self, set: &ExporterSet, action: Action, replica: Option<&str>, reason: &str) {
        let (ns, name) = (set_namespace(set), set_name(set));
        match action {
            Action::Blocked => tracing::warn!(
                "pool {ns}/{name}: {} {}: {reason}",
                action.as_str(),
                replica.unwrap_or_default()
            ),
            _ => tracing::info!(
                "pool {ns}/{name}: {} {}: {reason}",
                action.as_str(),
                replica.unwrap_or_default()
            ),
        }
        self.state.pool_decisions.record(
            ns,
            name,
            Decision {
                time: Timestamp::now(),
                action,
                replica: replica.map(str::to_string),
                reason: reason.to_string(),
            },
        );
    }

    /// One set's pass; returns its replicas' labels when the set is valid (it can make
    /// replicas).
    async fn reconcile_set(
        &mut self,
        set: &ExporterSet,
        world: &World,
    ) -> Option<BTreeMap<String, String>> {
        let now = Timestamp::now();
        let (ns, name) = (set_namespace(set).to_string(), set_name(set).to_string());
        let key = (ns.clone(), name.clone());
        let owned: Vec<&Exporter> = world
            .replicas
            .iter()
            .filter(|e| {
                e.metadata.namespace.as_deref() == Some(ns.as_str())
                    && e.label_map().get(LABEL_EXPORTER_SET) == Some(&name)
                    && controlled_by(e, set)
            })
            .collect();
        let mut status = set.status.clone().unwrap_or_default();
        let generation = set.metadata.generation;
        let cond =
            |status: &mut ExporterSetStatus, type_: &str, on: bool, reason: &str, message: &str| {
                set_condition(
                    &mut status.conditions,
                    type_,
                    on,
                    reason,
                    message,
                    generation,
                    now,
                );
            };
        // Invalid sets and missing classes: nothing is scaled.
        let invalid = match set.spec.validate(&name) {
            Err(e) => Some(("InvalidSpec", e.to_string())),
            Ok(()) => match world
                .classes
                .get(&(ns.clone(), set.spec.virtual_target_class_name.clone()))
            {
                None => Some((
                    "ClassNotFound",
                    format!(
                        "ExporterSet {name}: spec.virtualTargetClassName: VirtualTargetClass \
                         {ns}/{} not found",
                        set.spec.virtual_target_class_name
                    ),
                )),
                Some(class) => class
                    .spec
                    .validate(name_of(&class.metadata))
                    .and_then(|()| set.spec.validate_with_class(&name, &class.spec))
                    .err()
                    .map(|e| ("InvalidSpec", e.to_string())),
            },
        };
        if let Some((reason, message)) = invalid {
            cond(&mut status, condition::INVALID, true, reason, &message);
            cond(&mut status, condition::READY, false, reason, &message);
            fill_counts(&mut status, set, &owned, &[], &world.holders, now);
            self.write_status(set, status).await;
            self.sets.insert(key, (set.clone(), None));
            return None;
        }
        cond(&mut status, condition::INVALID, false, "Valid", "");
        let labels = replica_labels(set);
        let class = world
            .classes
            .get(&(ns.clone(), set.spec.virtual_target_class_name.clone()))?;
        let provisioner_name = class.spec.provisioner.clone();
        self.sets
            .insert(key.clone(), (set.clone(), Some(provisioner_name.clone())));
        let Some(provisioner) = self.config.provisioners.get(&provisioner_name).cloned() else {
            let available = self.config.provisioners.names();
            let message = format!(
                "VirtualTargetClass {ns}/{}: provisioner {provisioner_name:?} is not available \
                 here (available: {})",
                set.spec.virtual_target_class_name,
                if available.is_empty() {
                    "none".to_string()
                } else {
                    available.join(", ")
                }
            );
            cond(
                &mut status,
                condition::PROVISIONER_UNAVAILABLE,
                true,
                "UnknownProvisioner",
                &message,
            );
            cond(
                &mut status,
                condition::READY,
                false,
                "ProvisionerUnavailable",
                &message,
            );
            cond(
                &mut status,
                condition::SCALING_LIMITED,
                false,
                "ProvisionerUnavailable",
                "",
            );
            fill_counts(&mut status, set, &owned, &[], &world.holders, now);
            self.write_status(set, status).await;
            return Some(labels);
        };
        let observed = match provisioner.observe(set).await {
            Ok(o) => o,
            Err(e) => {
                let message = jumpstarter_core::error_chain(&e);
                cond(
                    &mut status,
                    condition::PROVISIONER_UNAVAILABLE,
                    true,
                    "ObserveFailed",
                    &message,
                );
                cond(
                    &mut status,
                    condition::READY,
                    false,
                    "ProvisionerUnavailable",
                    &message,
                );
                fill_counts(&mut status, set, &owned, &[], &world.holders, now);
                self.write_status(set, status).await;
                return Some(labels);
            }
        };
        let by_name: HashMap<&str, &ReplicaObservation> =
            observed.iter().map(|o| (o.name.as_str(), o)).collect();

        // What the provisioner runs without an Exporter: stop it.
        let owned_names: BTreeSet<&str> = owned.iter().map(|e| name_of(&e.metadata)).collect();
        for o in &observed {
            if !owned_names.contains(o.name.as_str()) {
                match provisioner.stop(&ns, &o.name).await {
                    Ok(()) => self.record(set, Action::Reap, Some(&o.name), "it has no Exporter"),
                    Err(e) => tracing::warn!(
                        "pool {ns}/{name}: cannot stop replica {}: {e}",
                        o.name,
                        e = jumpstarter_core::error_chain(&e)
                    ),
                }
                self.known.remove(&(ns.clone(), o.name.clone()));
            }
        }

        // Each replica's state.
        let mut views = Vec::with_capacity(owned.len());
        for e in &owned {
            let rname = name_of(&e.metadata).to_string();
            let rkey = (ns.clone(), rname.clone());
            let obs = by_name.get(rname.as_str());
            if obs.is_some_and(|o| matches!(o.phase, ReplicaPhase::Pending | ReplicaPhase::Running))
                && self.known.insert(rkey.clone())
            {
                self.record(
                    set,
                    Action::Adopt,
                    Some(&rname),
                    "running since before this controller started",
                );
            }
            let started_here = self.known.contains(&rkey);
            let mut state = replica_state(
                e,
                obs.copied(),
                &world.holders,
                now,
                started_here,
                |leased| {
                    if leased {
                        self.unleased_since.remove(&rkey);
                        false
                    } else {
                        let since = *self.unleased_since.entry(rkey.clone()).or_insert(now);
                        since.saturating_add(EXIT_GRACE).is_ok_and(|t| t <= now)
                    }
                },
            );
            match state {
                ReplicaState::Available | ReplicaState::Leased | ReplicaState::Unavailable => {
                    self.ever_ready.insert(rkey.clone());
                }
                ReplicaState::Starting
                    if !self.ever_ready.contains(&rkey)
                        && e.metadata
                            .creation_timestamp
                            .as_ref()
                            .and_then(|t| t.0.saturating_add(START_TIMEOUT).ok())
                            .is_some_and(|t| t <= now) =>
                {
                    state = ReplicaState::NeverReady;
                }
                _ => {}
            }
            let idle_since = if state == ReplicaState::Available {
                Some(*self.idle_since.entry(rkey.clone()).or_insert(now))
            } else {
                self.idle_since.remove(&rkey);
                None
            };
            views.push(ReplicaView {
                name: rname,
                state,
                idle_since,
            });
        }
        if views.iter().any(|v| v.state == ReplicaState::Available) {
            self.backoff.remove(&key);
        }
        let policies: Vec<&ExporterAccessPolicy> = world
            .policies
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
            .collect();
        let no_labels = BTreeMap::new();
        let pending = world
            .leases
            .iter()
            .filter(|l| {
                lease_waits_for(l, &ns, &labels, now)
                    && policies_grant(
                        l,
                        &labels,
                        &policies,
                        world
                            .client_labels
                            .get(&(ns.clone(), l.spec.client_ref.name.clone()))
                            .unwrap_or(&no_labels),
                    )
            })
            .count();
        let cooldown = set.spec.cooldown(&name).unwrap_or_default();
        let mut scaling = Scaling::of(&set.spec, cooldown, self.config.max_starts_per_pass);
        if class.spec.waits_for_first_consumer() {
            // No warm pool: replicas are made for waiting leases (and minReplicas) only.
            scaling.min_available = 0;
        }
        let mut plan = decide(&scaling, &views, pending, now);

        let mut changed = false;
        for r in &plan.retire {
            changed |= self.disable(&ns, r, RETIRING_EXIT).await;
        }
        for r in &plan.drain {
            if self.disable(&ns, r, RETIRING_SCALE_DOWN).await {
                changed = true;
                self.record(
                    set,
                    Action::ScaleDown,
                    Some(r),
                    &format!("idle for {cooldown:#}; disabled, removed once unleased"),
                );
            }
        }
        for r in &plan.remove {
            let rkey = (ns.clone(), r.name.clone());
            let failed_start = !self.ever_ready.contains(&rkey)
                && views.iter().any(|v| {
                    v.name == r.name
                        && matches!(
                            v.state,
                            ReplicaState::Ended { failed: true } | ReplicaState::NeverReady
                        )
                });
            let reason = match by_name
                .get(r.name.as_str())
                .and_then(|o| o.message.as_deref())
            {
                Some(m) if !m.is_empty() => format!("{} ({m})", r.reason),
                _ => r.reason.clone(),
            };
            match self
                .remove_replica(&ns, &r.name, Some(&provisioner_name), world)
                .await
            {
                Ok(()) => {
                    changed = true;
                    self.record(set, r.action, Some(&r.name), &reason);
                    if failed_start {
                        let failures = self.backoff.get(&key).map_or(0, |b| b.0) + 1;
                        let wait =
                            SignedDuration::from_secs(1i64 << failures.saturating_sub(1).min(16))
                                .min(MAX_START_BACKOFF);
                        let until = now.saturating_add(wait).unwrap_or(now);
                        self.backoff.insert(key.clone(), (failures, until));
                        self.record(
                            set,
                            Action::Blocked,
                            None,
                            &format!(
                                "{failures} replica(s) in a row failed before becoming ready; \
                                 the next start waits {wait:#}"
                            ),
                        );
                    }
                }
                Err(e) => tracing::warn!(
                    "pool {ns}/{name}: cannot remove replica {}: {e}",
                    r.name,
                    e = jumpstarter_core::error_chain(&e)
                ),
            }
        }
        let mut start_failed = None;
        if let Some((failures, until)) = self.backoff.get(&key).copied()
            && until > now
            && plan.start > 0
        {
            plan.start = 0;
            start_failed = Some(format!(
                "{failures} replica(s) in a row failed before becoming ready (see the \
                 replicas' logs); starting again after {until}"
            ));
        }
        for _ in 0..plan.start {
            match self.start_replica(set, class, &provisioner, &labels).await {
                Ok(rname) => {
                    changed = true;
                    self.record(set, Action::ScaleUp, Some(&rname), &plan.start_reason);
                }
                Err(e) => {
                    let message = jumpstarter_core::error_chain(&e);
                    self.record(
                        set,
                        Action::Blocked,
                        None,
                        &format!("cannot start: {message}"),
                    );
                    start_failed = Some(message);
                    break;
                }
            }
        }
        match &plan.limited {
            Some(m) if self.limited.get(&key) != Some(m) => {
                self.record(set, Action::Blocked, None, m);
                self.limited.insert(key.clone(), m.clone());
            }
            Some(_) => {}
            None => {
                self.limited.remove(&key);
            }
        }
        if changed {
            // A new or removed exporter changes what the scheduler can grant.
            self.state.wake.notify_one();
        }

        cond(&mut status, condition::INVALID, false, "Valid", "");
        match &start_failed {
            Some(m) => cond(
                &mut status,
                condition::PROVISIONER_UNAVAILABLE,
                true,
                "StartFailed",
                m,
            ),
            None => cond(
                &mut status,
                condition::PROVISIONER_UNAVAILABLE,
                false,
                "Available",
                "",
            ),
        }
        match &plan.limited {
            Some(m) => cond(
                &mut status,
                condition::SCALING_LIMITED,
                true,
                "MaxReplicas",
                m,
            ),
            None => cond(
                &mut status,
                condition::SCALING_LIMITED,
                false,
                "WithinLimits",
                "",
            ),
        }
        let available = views
            .iter()
            .filter(|v| v.state == ReplicaState::Available)
            .count();
        let ready = available >= scaling.min_available && views.len() >= scaling.min;
        cond(
            &mut status,
            condition::READY,
            ready,
            if ready { "Ready" } else { "ScalingUp" },
            &format!(
                "{available} of minAvailableReplicas {} available, {} replica(s) of minReplicas {}",
                scaling.min_available,
                views.len(),
                scaling.min
            ),
        );
        fill_counts(&mut status, set, &owned, &observed, &world.holders, now);
        self.write_status(set, status).await;
        Some(labels)
    }

    /// Disables replica `namespace/name` and marks why; whether it was written.
    async fn disable(&self, namespace: &str, name: &str, why: &str) -> bool {
        let r = crate::service::controller::update_exporter(
            &self.state.store,
            namespace,
            name,
            false,
            |e| {
                let marked = e
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ANNOTATION_RETIRING))
                    .is_some();
                if !e.is_enabled() && marked {
                    return false;
                }
                e.spec.enabled = Some(false);
                e.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(ANNOTATION_RETIRING.to_string(), why.to_string());
                true
            },
        )
        .await;
        match r {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(
                    "pool: cannot disable replica {namespace}/{name}: {}",
                    e.message()
                );
                false
            }
        }
    }

    /// Stops replica `namespace/name`, releases a lease still holding it, deletes its
    /// credential Secret and Exporter.
    async fn remove_replica(
        &mut self,
        namespace: &str,
        name: &str,
        provisioner: Option<&str>,
        world: &World,
    ) -> Result<(), ReplicaError> {
        let key = (namespace.to_string(), name.to_string());
        match provisioner.and_then(|p| self.config.provisioners.get(p)) {
            Some(p) => p.stop(namespace, name).await?,
            // The set (and so its class) is gone: whichever provisioner runs it stops it
            // (stopping what one does not run succeeds).
            None => {
                for p in self.config.provisioners.0.values() {
                    p.stop(namespace, name).await?;
                }
            }
        }
        if let Some(lease) = world.holders.get(&key) {
            let r = crate::service::controller::mark_release(
                &self.state.store,
                namespace,
                lease,
                |_| Ok(true),
            )
            .await;
            if let Err(e) = r
                && e.code() != tonic::Code::NotFound
            {
                return Err(status_error(e));
            }
        }
        let secret = format!("{name}-exporter");
        match self
            .state
            .store
            .delete::<Secret>(namespace, &secret, None)
            .await
        {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        match self
            .state
            .store
            .delete::<Exporter>(namespace, name, None)
            .await
        {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        self.known.remove(&key);
        self.ever_ready.remove(&key);
        self.idle_since.remove(&key);
        self.unleased_since.remove(&key);
        Ok(())
    }

    /// Makes one replica of `set`: its Exporter, credentials and config, then starts it.
    async fn start_replica(
        &mut self,
        set: &ExporterSet,
        class: &VirtualTargetClass,
        provisioner: &Arc<dyn Provisioner>,
        labels: &BTreeMap<String, String>,
    ) -> Result<String, ReplicaError> {
        let ns = set_namespace(set).to_string();
        let mut stored = None;
        for _ in 0..3 {
            let name = replica_name(set_name(set));
            let mut e = Exporter::new(
                &name,
                ExporterSpec {
                    username: None,
                    enabled: None,
                },
            );
            e.metadata.namespace = Some(ns.clone());
            e.metadata.labels = Some(labels.clone());
            e.metadata.annotations = set
                .spec
                .template
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.clone());
            e.metadata.owner_references = controller_reference(set).map(|r| vec![r]);
            match self.state.store.create(&e).await {
                Ok(s) => {
                    stored = Some(s);
                    break;
                }
                Err(StoreError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let Some(stored) = stored else {
            return Err(ReplicaError::Status(
                "three random replica names were all taken".into(),
            ));
        };
        let name = name_of(&stored.metadata).to_string();
        let made = async {
            let creds = crate::service::admin::issue_credentials(
                &self.state,
                &self.config.ca_pem,
                ObjectKind::Exporter,
                &ns,
                &name,
                stored.metadata.uid.clone(),
            )
            .await
            .map_err(status_error)?;
            crate::service::admin::keep_credential(
                &self.state,
                &stored,
                &creds.token,
                self.config.credential_secrets,
            )
            .await
            .map_err(status_error)?;
            let exporter_config = replica_config(
                set,
                &ns,
                &name,
                &self.state.endpoint,
                &creds.token,
                &self.config.ca_pem,
            )?;
            let req = ReplicaRequest {
                namespace: ns.clone(),
                name: name.clone(),
                exporter_config,
                labels: labels.clone(),
                set: set.clone(),
                class: class.clone(),
            };
            provisioner.start(&req).await?;
            Ok::<(), ReplicaError>(())
        }
        .await;
        match made {
            Ok(()) => {
                self.known.insert((ns, name.clone()));
                Ok(name)
            }
            Err(e) => {
                // Nothing half-made stays behind.
                let _ = provisioner.stop(&ns, &name).await;
                let _ = self
                    .state
                    .store
                    .delete::<Secret>(&ns, &format!("{name}-exporter"), None)
                    .await;
                let _ = self.state.store.delete::<Exporter>(&ns, &name, None).await;
                Err(e)
            }
        }
    }

    /// Writes `status` when it differs from the stored one.
    async fn write_status(&self, set: &ExporterSet, status: ExporterSetStatus) {
        if set.status.as_ref() == Some(&status) {
            return;
        }
        let mut next = set.clone();
        next.status = Some(status);
        match self.state.store.update_status(&next).await {
            Ok(_) => {}
            // Changed meanwhile: the next pass writes it.
            Err(e) if e.is_conflict() || e.is_not_found() => {}
            Err(e) => tracing::warn!(
                "pool {}/{}: cannot write its status: {e}",
                set_namespace(set),
                set_name(set),
                e = jumpstarter_core::error_chain(&e)
            ),
        }
    }
}

/// Whether `e` has an ExporterSet controller reference (any set).
fn has_set_controller(e: &Exporter) -> bool {
    e.metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|r| r.kind == "ExporterSet" && r.controller == Some(true))
}

/// The state of replica `e` whose process is `obs` (`None`: not seen by its provisioner; an
/// Exporter this engine made less than [`START_GRACE`] ago (`started_here`) is then still
/// starting, for a provisioner whose lists lag); `overdue(leased)` says whether a retiring
/// replica has been unleased past its grace.
fn replica_state(
    e: &Exporter,
    obs: Option<&ReplicaObservation>,
    holders: &HashMap<ObjectKey, String>,
    now: Timestamp,
    started_here: bool,
    overdue: impl FnOnce(bool) -> bool,
) -> ReplicaState {
    let leased = holders.contains_key(&key_of(&e.metadata))
        || e.status.as_ref().is_some_and(|s| s.lease_ref.is_some());
    let retiring = e
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_RETIRING))
        .map(String::as_str);
    match obs.map(|o| o.phase) {
        Some(ReplicaPhase::Succeeded) => return ReplicaState::Ended { failed: false },
        Some(ReplicaPhase::Failed) => return ReplicaState::Ended { failed: true },
        None => {
            let young = started_here
                && e.metadata
                    .creation_timestamp
                    .as_ref()
                    .and_then(|t| t.0.saturating_add(START_GRACE).ok())
                    .is_some_and(|t| t > now);
            if !young {
                return ReplicaState::Orphaned;
            }
        }
        _ => {}
    }
    match retiring {
        Some(RETIRING_SCALE_DOWN) if !e.is_enabled() => return ReplicaState::Draining { leased },
        Some(RETIRING_EXIT) if !e.is_enabled() => {
            return ReplicaState::Retiring {
                leased,
                overdue: overdue(leased),
            };
        }
        _ => {}
    }
    if e.unhealthy().is_some() {
        return ReplicaState::Quarantined { leased };
    }
    if leased {
        return ReplicaState::Leased;
    }
    if !exporter_is_online(e, now) {
        return ReplicaState::Starting;
    }
    if e.is_enabled() && exporter_is_ready(e) {
        ReplicaState::Available
    } else {
        ReplicaState::Unavailable
    }
}

/// Fills the counters and selector of `status` from `owned` and `observed`.
fn fill_counts(
    status: &mut ExporterSetStatus,
    set: &ExporterSet,
    owned: &[&Exporter],
    observed: &[ReplicaObservation],
    holders: &HashMap<ObjectKey, String>,
    now: Timestamp,
) {
    let n = |c: usize| i32::try_from(c).unwrap_or(i32::MAX);
    let count = |f: &dyn Fn(&Exporter) -> bool| n(owned.iter().filter(|e| f(e)).count());
    let leased = |e: &Exporter| {
        holders.contains_key(&key_of(&e.metadata))
            || e.status.as_ref().is_some_and(|s| s.lease_ref.is_some())
    };
    let online = |e: &Exporter| exporter_is_online(e, now);
    let available =
        |e: &Exporter| online(e) && e.is_enabled() && !leased(e) && e.unhealthy().is_none();
    status.replicas = n(owned.len());
    status.ready_replicas = count(&online);
    status.available_replicas = count(&available);
    status.unavailable_replicas = status.replicas - status.available_replicas;
    status.leased_replicas = count(&leased);
    status.exporters_active = status.leased_replicas;
    status.exporters_disabled = count(&|e: &Exporter| !e.is_enabled());
    status.exporters_idle = count(&|e: &Exporter| online(e) && e.is_enabled() && !leased(e));
    status.exporters_offline = count(&|e: &Exporter| !online(e));
    let phases = |p: ReplicaPhase| n(observed.iter().filter(|o| o.phase == p).count());
    status.pods_pending = phases(ReplicaPhase::Pending);
    status.pods_running = phases(ReplicaPhase::Running);
    status.pods_failed = phases(ReplicaPhase::Failed);
    status.pods_unknown = phases(ReplicaPhase::Unknown);
    status.selector = LabelSelector::from_k8s(&set.spec.selector)
        .ok()
        .map(|s| s.to_selector_string());
}

#[cfg(test)]
mod tests;
