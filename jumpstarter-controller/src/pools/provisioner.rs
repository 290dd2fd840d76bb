//! The contract between the pool engine and the provisioners that run a pool's replicas.
//!
//! The engine owns the Exporter objects (names, labels, credentials, scaling decisions); a
//! [`Provisioner`] only runs, observes and stops the process (or Pod) behind each replica. A
//! replica is named after its Exporter, so the engine, the provisioner and the logs agree on one
//! name.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use crate::objects::virtualtarget::{ExporterSet, VirtualTargetClass};

/// A boxed future, so that provisioners can be chosen at run time by the class's
/// `spec.provisioner`.
pub type ProvisionFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, ProvisionError>> + Send + 'a>>;

/// What the engine asks a provisioner to run: one replica of `set`.
#[derive(Debug, Clone)]
pub struct ReplicaRequest {
    /// The namespace of the set, its class and the replica's Exporter.
    pub namespace: String,
    /// The replica's name: its Exporter's name (`<set>-<suffix>`).
    pub name: String,
    /// The complete exporter config (YAML, upstream's `ExporterConfig`: `endpoint`, `token`,
    /// `tls`, `export` from the template's drivers, `exitOnLeaseEnd` from the recycle
    /// strategy). It holds the exporter's token: keep it private (mode 0600, a Secret).
    pub exporter_config: String,
    /// The replica's Exporter labels (the template's plus the set label).
    pub labels: BTreeMap<String, String>,
    /// The set (for owner references, images and parameters).
    pub set: ExporterSet,
    /// The set's class (for scheduling fields, images and parameters).
    pub class: VirtualTargetClass,
}

/// The phase of a replica's process or Pod, as Kubernetes names a Pod's phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplicaPhase {
    /// Started but not yet running (Pod scheduled or process spawning).
    Pending,
    /// Running.
    Running,
    /// Exited with success (an `exitOnLeaseEnd` exporter after its lease).
    Succeeded,
    /// Exited with failure, killed, or could not start.
    Failed,
    /// The provisioner cannot tell.
    Unknown,
}

/// One replica as its provisioner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaObservation {
    /// The replica's (and its Exporter's) name.
    pub name: String,
    /// Its phase.
    pub phase: ReplicaPhase,
    /// Why it is in that phase, when there is something to say (exit status, Pod reason).
    pub message: Option<String>,
}

/// A provisioner could not do what it was asked; each variant names the replica or set.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// The class names a provisioner this controller does not have (or not on this backend).
    #[error(
        "VirtualTargetClass {namespace}/{class}: provisioner {provisioner:?} is not available here ({reason})"
    )]
    Unavailable {
        /// The class's namespace.
        namespace: String,
        /// The class's name.
        class: String,
        /// Its `spec.provisioner`.
        provisioner: String,
        /// Which provisioners are, and why this one is not.
        reason: String,
    },
    /// Starting, observing or stopping a replica failed.
    #[error("replica {namespace}/{name}: {operation} failed")]
    Replica {
        /// The replica's namespace.
        namespace: String,
        /// The replica's name.
        name: String,
        /// `start`, `stop` or `observe`.
        operation: &'static str,
        /// The cause.
        #[source]
        source: jumpstarter_core::BoxError,
    },
}

/// Runs a pool's replicas. Implementations must be idempotent: `start` of a replica that
/// already runs and `stop` of one that is gone succeed.
pub trait Provisioner: Send + Sync + 'static {
    /// The `spec.provisioner` value this provisioner serves (e.g. `local`).
    fn name(&self) -> &'static str;

    /// Starts the replica `req.name`; returns once it is started (not once its exporter has
    /// registered: the engine sees that in the store).
    fn start<'a>(&'a self, req: &'a ReplicaRequest) -> ProvisionFuture<'a, ()>;

    /// Stops the replica `name` of `namespace` (gracefully: the exporter gets SIGTERM and time
    /// to run its afterLease hook) and releases what it held.
    fn stop<'a>(&'a self, namespace: &'a str, name: &'a str) -> ProvisionFuture<'a, ()>;

    /// The replicas of `set` this provisioner runs or has run and not yet stopped, with their
    /// phases (including ones started before a controller restart: re-adopted).
    fn observe<'a>(&'a self, set: &'a ExporterSet) -> ProvisionFuture<'a, Vec<ReplicaObservation>>;
}
