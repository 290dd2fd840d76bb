//! The lease scheduler as a pure function: a snapshot of the objects and the time in, one
//! decision per live lease out (§4.3 of the protocol spec).
//!
//! Per lease it follows upstream's reconcile order — (1) exporter assignment, (2) begin time and
//! `Ready`, (3) ending — with the same condition types, reasons and messages. Beyond upstream:
//!
//! - competing pending leases are served in a defined order (policy priority descending, then
//!   creation time, then name), so no lease starves behind later ones, and a waiting lease's
//!   `Pending` message says its place in the queue;
//! - one pass sees every lease, so an exporter is never granted to two live leases, and an
//!   exporter freed by a lease ending in this pass can be granted in the same pass;
//! - a pending lease whose requested end has passed ends (`Expired`) instead of being granted,
//!   a released pending lease ends without being granted, and a lease never outlives its end.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::LocalObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

use crate::objects::selector::LabelSelector;
use crate::objects::{
    Client, Exporter, ExporterAccessPolicy, ExporterStatusValue, Lease, LeaseStatus,
    condition_is_true, conditions as c, exporter_online_state, exporter_registered, find_condition,
    lease_labels_with, set_condition,
};

/// How long a waiting lease waits before it is looked at again (upstream: 1 s).
pub const PENDING_REQUEUE: SignedDuration = SignedDuration::from_secs(1);

/// Everything the scheduler looks at. Objects of several namespaces may be mixed; each
/// namespace is scheduled on its own.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot<'a> {
    /// All leases (ended ones are ignored).
    pub leases: &'a [Lease],
    /// All exporters.
    pub exporters: &'a [Exporter],
    /// All access policies.
    pub policies: &'a [ExporterAccessPolicy],
    /// All clients (their labels select policy rules).
    pub clients: &'a [Client],
    /// The labels of the exporters pools (ExporterSets) can make, by namespace: a lease no
    /// enabled exporter matches waits (`NotAvailable`) instead of ending as unsatisfiable
    /// when a pool's exporters would match it.
    pub pools: &'a [(String, BTreeMap<String, String>)],
    /// The current time.
    pub now: Timestamp,
}

/// What happened to a lease in this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Already running; nothing to do but wait for its end.
    Running,
    /// Waiting for an exporter (`Pending=True` with `reason`); `position` is 1-based among the
    /// waiting leases competing for the same exporters.
    Waiting {
        /// The `Pending` reason: `Offline`, `NotAvailable` or `NotReady`.
        reason: &'static str,
        /// Place in the queue (1 = next to be served).
        position: usize,
    },
    /// `spec.beginTime` is in the future; nothing is done before then.
    Deferred,
    /// The exporter was granted in this pass.
    Assigned {
        /// The exporter's name.
        exporter: String,
        /// The granting policy rule's priority.
        priority: i64,
    },
    /// The lease ended in this pass, for `reason` (a condition reason such as `Expired`).
    Ended {
        /// The reason of the condition that ended it.
        reason: &'static str,
    },
}

/// The scheduler's decision for one live lease.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseDecision {
    /// The lease's namespace.
    pub namespace: String,
    /// The lease's name.
    pub name: String,
    /// What happened.
    pub action: Action,
    /// The new status (to write when `status_changed`).
    pub status: LeaseStatus,
    /// Whether `status` differs from the stored one.
    pub status_changed: bool,
    /// The labels the lease should carry (`jumpstarter.dev/lease-ended`, selector matchLabels,
    /// tags); write when `labels_changed`.
    pub labels: BTreeMap<String, String>,
    /// Whether `labels` differ from the stored ones.
    pub labels_changed: bool,
    /// The exporter that should own the lease (controller owner reference), once assigned.
    pub owner_exporter: Option<String>,
    /// When to run the scheduler again for this lease (begin time, expiry, or a retry).
    pub requeue_at: Option<Timestamp>,
}

/// Whether an exporter is online for scheduling at `now`: registered (devices set) and its
/// `Online` condition, as the Exporter reconciler computes it from `lastSeen`, true.
pub fn exporter_is_online(e: &Exporter, now: Timestamp) -> bool {
    let status = e.status.as_ref();
    exporter_registered(status) && exporter_online_state(status, now).online
}

/// Whether an exporter is ready for a new lease: status Available, Unspecified or unset.
pub fn exporter_is_ready(e: &Exporter) -> bool {
    matches!(
        e.status.as_ref().and_then(|s| s.exporter_status),
        None | Some(ExporterStatusValue::Available | ExporterStatusValue::Unspecified)
    )
}

/// The live lease holding each exporter, per namespace: `(namespace, exporter) -> lease`, as the
/// Exporter reconciler's `status.leaseRef` (apply the decisions' statuses first).
pub fn exporter_lease_refs<'a>(
    leases: impl IntoIterator<Item = (&'a str, &'a str, &'a LeaseStatus)>,
) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for (namespace, name, status) in leases {
        if let (false, Some(r)) = (status.ended, status.exporter_ref.as_ref()) {
            out.entry((namespace.to_string(), r.name.clone()))
                .or_insert_with(|| name.to_string());
        }
    }
    out
}

/// Schedule every live lease of the snapshot. Returns one decision per lease that has not
/// ended, ordered by namespace and name.
pub fn schedule(snapshot: &Snapshot<'_>) -> Vec<LeaseDecision> {
    let namespaces: BTreeSet<&str> = snapshot
        .leases
        .iter()
        .filter(|l| !l.is_ended())
        .map(|l| namespace_of(&l.metadata))
        .collect();
    let mut out = Vec::new();
    for ns in namespaces {
        out.extend(schedule_namespace(snapshot, ns));
    }
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

fn namespace_of(m: &metav1::ObjectMeta) -> &str {
    m.namespace.as_deref().unwrap_or_default()
}

fn name_of(m: &metav1::ObjectMeta) -> &str {
    m.name.as_deref().unwrap_or_default()
}

/// Per-lease working state.
struct Work<'a> {
    lease: &'a Lease,
    status: LeaseStatus,
    action: Action,
    requeue_at: Option<Timestamp>,
}

impl Work<'_> {
    fn cond(&mut self, type_: &str, status: bool, reason: &str, message: &str, now: Timestamp) {
        set_condition(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.lease.metadata.generation,
            now,
        );
    }

    fn end(&mut self, reason: &'static str, now: Timestamp) {
        self.status.ended = true;
        self.status.end_time = Some(metav1::Time(now));
        self.action = Action::Ended { reason };
        self.requeue_at = None;
    }

    /// Upstream (3): a True `Unsatisfiable`/`Invalid` condition ends the lease.
    fn end_with(&mut self, type_: &str, reason: &'static str, message: &str, now: Timestamp) {
        self.cond(type_, true, reason, message, now);
        self.end(reason, now);
    }
}

/// One approved exporter for a lease: policy priority and spot access.
#[derive(Debug, Clone, Copy)]
struct Approved<'a> {
    exporter: &'a Exporter,
    priority: i64,
    spot: bool,
}

/// A pending lease that wants an exporter.
struct Candidate<'a> {
    work: usize,
    /// Shared by the leases of a pass that ask the same thing (see `queue_pending`).
    approved: Rc<[Approved<'a>]>,
    /// Best (highest) priority among the non-spot grants, or among all if only spot.
    priority: i64,
}

/// The objects of one namespace a lease may use.
struct Namespace<'a> {
    snapshot_exporters: &'a [Exporter],
    namespace: &'a str,
    /// The namespace's exporters, sorted by name, built when a pending lease first needs
    /// them: a pass in which no lease waits (1,000 held, 10,000 exporters) need not collect
    /// and sort them (about 4% of such a pass, counted with callgrind).
    exporters: std::cell::OnceCell<Vec<&'a Exporter>>,
    policies: Vec<&'a ExporterAccessPolicy>,
    /// Client name -> its labels.
    client_labels: BTreeMap<&'a str, BTreeMap<String, String>>,
    /// The labels of the exporters pools can make in the namespace.
    pools: Vec<&'a BTreeMap<String, String>>,
}

impl<'a> Namespace<'a> {
    /// The exporters of the namespace, sorted by name once per pass, so that sorting each
    /// lease's matching exporters by name (in `candidates`) finds them in order already and
    /// takes one pass.
    fn exporters(&self) -> &[&'a Exporter] {
        self.exporters.get_or_init(|| {
            let mut exporters: Vec<&'a Exporter> = self
                .snapshot_exporters
                .iter()
                .filter(|e| namespace_of(&e.metadata) == self.namespace)
                .collect();
            exporters.sort_by_key(|e| name_of(&e.metadata));
            exporters
        })
    }

    fn of(snap: &Snapshot<'a>, ns: &'a str) -> Self {
        Self {
            snapshot_exporters: snap.exporters,
            namespace: ns,
            exporters: std::cell::OnceCell::new(),
            policies: snap
                .policies
                .iter()
                .filter(|p| namespace_of(&p.metadata) == ns)
                .collect(),
            client_labels: snap
                .clients
                .iter()
                .filter(|c| namespace_of(&c.metadata) == ns)
                .map(|c| {
                    (
                        name_of(&c.metadata),
                        c.metadata.labels.clone().unwrap_or_default(),
                    )
                })
                .collect(),
            pools: snap
                .pools
                .iter()
                .filter(|(n, _)| n == ns)
                .map(|(_, labels)| labels)
                .collect(),
        }
    }

    /// Whether `lease`, which no enabled exporter of the namespace matches, waits for a
    /// pool to make one: it pins no exporter, a pool's exporters match its selector and the
    /// access policies (if any) would grant its client such an exporter.
    fn pool_may_serve(&self, lease: &Lease) -> bool {
        if self.pools.is_empty()
            || lease
                .spec
                .exporter_ref
                .as_ref()
                .is_some_and(|r| !r.name.is_empty())
        {
            return false;
        }
        let Ok(selector) = LabelSelector::from_k8s(&lease.spec.selector) else {
            return false;
        };
        if selector.is_empty()
            || self
                .exporters()
                .iter()
                .any(|e| e.is_enabled() && selector.matches(e.label_map()))
        {
            return false;
        }
        let none = BTreeMap::new();
        let client = self
            .client_labels
            .get(lease.spec.client_ref.name.as_str())
            .unwrap_or(&none);
        self.pools.iter().any(|labels| {
            selector.matches(labels) && policies_grant(lease, labels, &self.policies, client)
        })
    }
}

fn schedule_namespace(snap: &Snapshot<'_>, ns: &str) -> Vec<LeaseDecision> {
    let now = snap.now;
    let objects = Namespace::of(snap, ns);
    let mut leases: Vec<&Lease> = snap
        .leases
        .iter()
        .filter(|l| namespace_of(&l.metadata) == ns && !l.is_ended())
        .collect();
    leases.sort_by_key(|l| name_of(&l.metadata));
    let mut works: Vec<Work<'_>> = leases
        .iter()
        .map(|l| Work {
            lease: l,
            status: l.status.clone().unwrap_or_default(),
            action: Action::Running,
            requeue_at: None,
        })
        .collect();
    let mut busy = run_active(&mut works, now);
    let queue = queue_pending(&mut works, &objects, now);
    let waiting = grant_in_order(&mut works, &queue, &mut busy, now);
    mark_waiting(&mut works, &queue, &waiting, now);
    works.into_iter().map(|w| decision(w, ns)).collect()
}

/// Phase A: running leases — (2) times, (3) ending; ending first frees exporters for the
/// pending ones. Returns exporter name -> lease holding it: the first holder (by name) wins
/// if the stored state is already inconsistent, and the others are treated as pending.
fn run_active(works: &mut [Work<'_>], now: Timestamp) -> BTreeMap<String, String> {
    let mut busy: BTreeMap<String, String> = BTreeMap::new();
    for w in works.iter_mut() {
        if let Some(reason) = terminal_condition(&w.status.conditions) {
            w.end(reason, now);
            continue;
        }
        let Some(exporter) = w.status.exporter_ref.as_ref().map(|r| r.name.clone()) else {
            continue;
        };
        if busy.contains_key(&exporter) {
            // Two live leases on one exporter (corrupt input): the later one starts over.
            w.status.exporter_ref = None;
            w.status.begin_time = None;
            continue;
        }
        begin_and_check_end(w, now);
        if !w.status.ended {
            busy.insert(exporter, name_of(&w.lease.metadata).to_string());
        }
    }
    busy
}

/// Phase B: pending leases — early exits (released, expired, not begun yet), then candidate
/// evaluation (steps 2–4). Returns the queue, in the order it is served: priority desc,
/// creation asc, name asc.
fn queue_pending<'a>(
    works: &mut [Work<'_>],
    objects: &Namespace<'a>,
    now: Timestamp,
) -> Vec<Candidate<'a>> {
    let mut queue: Vec<Candidate<'a>> = Vec::new();
    // Without access policies, what a lease may use depends only on its selector (unless
    // it pins an exporter): leases asking the same share one evaluation per pass, instead
    // of each matching the selector against every exporter again.
    let mut same_ask: HashMap<String, Result<Rc<[Approved<'a>]>, Terminal>> = HashMap::new();
    for (i, w) in works.iter_mut().enumerate() {
        if w.status.ended || w.status.exporter_ref.is_some() || pending_exit(w, now) {
            continue;
        }
        let shareable = objects.policies.is_empty()
            && w.lease
                .spec
                .exporter_ref
                .as_ref()
                .is_none_or(|r| r.name.is_empty());
        let key = shareable
            .then(|| serde_json::to_string(&w.lease.spec.selector).ok())
            .flatten();
        let evaluated = match key.as_ref().and_then(|k| same_ask.get(k)) {
            Some(known) => known.clone(),
            None => {
                let client = objects
                    .client_labels
                    .get(w.lease.spec.client_ref.name.as_str())
                    .cloned()
                    .unwrap_or_default();
                let result = evaluate(w.lease, objects.exporters(), &objects.policies, &client)
                    .map(Rc::from);
                if let Some(k) = key {
                    same_ask.insert(k, result.clone());
                }
                result
            }
        };
        match evaluated {
            // No enabled exporter matches, but a pool can make one: wait for it.
            Err((type_, _, _)) if type_ == c::UNSATISFIABLE && objects.pool_may_serve(w.lease) => {
                queue.push(Candidate {
                    work: i,
                    approved: Rc::from(Vec::new()),
                    priority: 0,
                });
            }
            Err((type_, reason, message)) => w.end_with(type_, reason, &message, now),
            Ok(approved) => {
                let best_non_spot = approved
                    .iter()
                    .filter(|a| !a.spot)
                    .map(|a| a.priority)
                    .max();
                let priority = best_non_spot
                    .or_else(|| approved.iter().map(|a| a.priority).max())
                    .unwrap_or(0);
                queue.push(Candidate {
                    work: i,
                    approved,
                    priority,
                });
            }
        }
    }
    queue.sort_by_key(|q| {
        let m = &works[q.work].lease.metadata;
        (
            Reverse(q.priority),
            m.creation_timestamp
                .as_ref()
                .map(|t| t.0)
                .unwrap_or(Timestamp::MAX),
            name_of(m).to_string(),
        )
    });
    queue
}

/// A pending lease that needs no exporter now: released or expired (ended), or not begun
/// yet (deferred until its begin time). Returns whether it was handled.
fn pending_exit(w: &mut Work<'_>, now: Timestamp) -> bool {
    let spec = &w.lease.spec;
    if spec.release {
        w.cond(
            c::READY,
            false,
            c::REASON_RELEASED,
            "The lease was marked for release",
            now,
        );
        w.end(c::REASON_RELEASED, now);
        return true;
    }
    if let Some(deadline) = pending_deadline(w.lease)
        && deadline <= now
    {
        w.cond(
            c::READY,
            false,
            c::REASON_EXPIRED,
            "The lease has expired (its end time passed before an exporter was acquired)",
            now,
        );
        w.end(c::REASON_EXPIRED, now);
        return true;
    }
    if let Some(begin) = &spec.begin_time
        && begin.0 > now
    {
        w.action = Action::Deferred;
        w.requeue_at = Some(begin.0);
        return true;
    }
    false
}

/// Serves the queue in order: grants a free exporter, ends an unsatisfiable lease, or
/// returns the lease as waiting (work index, reason, message).
fn grant_in_order(
    works: &mut [Work<'_>],
    queue: &[Candidate<'_>],
    busy: &mut BTreeMap<String, String>,
    now: Timestamp,
) -> Vec<(usize, &'static str, String)> {
    let mut waiting: Vec<(usize, &'static str, String)> = Vec::new();
    let mut scans = Scans::new();
    for q in queue {
        let w = &mut works[q.work];
        match pick(q, busy, now, &mut scans) {
            Pick::Grant(a) => {
                let name = name_of(&a.exporter.metadata).to_string();
                w.status.exporter_ref = Some(LocalObjectReference { name: name.clone() });
                w.status.priority = a.priority;
                w.status.spot_access = a.spot;
                begin_and_check_end(w, now);
                if !w.status.ended {
                    busy.insert(name.clone(), name_of(&w.lease.metadata).to_string());
                    w.action = Action::Assigned {
                        exporter: name,
                        priority: a.priority,
                    };
                }
            }
            Pick::Unsatisfiable(reason, message) => {
                w.end_with(c::UNSATISFIABLE, reason, &message, now);
            }
            Pick::Wait(reason, message) => {
                // The priority the queue is ordered by, for those who read the queue.
                w.status.priority = q.priority;
                waiting.push((q.work, reason, message));
            }
        }
    }
    waiting
}

/// Waiting leases: `Pending=True` with the place in the queue among competitors (those
/// approved for at least one same exporter).
fn mark_waiting(
    works: &mut [Work<'_>],
    queue: &[Candidate<'_>],
    waiting: &[(usize, &'static str, String)],
    now: Timestamp,
) {
    if waiting.is_empty() {
        return;
    }
    // Only the waiting leases compete for a place in the queue: their sets alone.
    let waiting_works: BTreeSet<usize> = waiting.iter().map(|(w, _, _)| *w).collect();
    let approved_sets: BTreeMap<usize, BTreeSet<&str>> = queue
        .iter()
        .filter(|q| waiting_works.contains(&q.work))
        .map(|q| {
            (
                q.work,
                q.approved
                    .iter()
                    .map(|a| name_of(&a.exporter.metadata))
                    .collect(),
            )
        })
        .collect();
    for (idx, (work, reason, message)) in waiting.iter().enumerate() {
        let mine = approved_sets.get(work);
        let ahead = waiting[..idx]
            .iter()
            .filter(|(other, _, _)| match (mine, approved_sets.get(other)) {
                (Some(a), Some(b)) => !a.is_disjoint(b),
                _ => false,
            })
            .count();
        let position = ahead + 1;
        let w = &mut works[*work];
        w.cond(
            c::PENDING,
            true,
            reason,
            &format!("{message} (position {position} in queue)"),
            now,
        );
        w.action = Action::Waiting { reason, position };
        w.requeue_at = Some(
            now.saturating_add(PENDING_REQUEUE)
                .unwrap_or(Timestamp::MAX),
        );
    }
}

fn decision(w: Work<'_>, ns: &str) -> LeaseDecision {
    let status_changed = match &w.lease.status {
        Some(stored) => w.status != *stored,
        None => w.status != LeaseStatus::default(),
    };
    let labels = lease_labels_with(w.lease, w.status.ended);
    let labels_changed = match &w.lease.metadata.labels {
        Some(stored) => labels != *stored,
        None => !labels.is_empty(),
    };
    LeaseDecision {
        namespace: ns.to_string(),
        name: name_of(&w.lease.metadata).to_string(),
        owner_exporter: w.status.exporter_ref.as_ref().map(|r| r.name.clone()),
        action: w.action,
        status: w.status,
        status_changed,
        labels,
        labels_changed,
        requeue_at: w.requeue_at,
    }
}

/// The reason of a True `Invalid` or `Unsatisfiable` condition, if any.
fn terminal_condition(conds: &[metav1::Condition]) -> Option<&'static str> {
    for type_ in [c::INVALID, c::UNSATISFIABLE] {
        if condition_is_true(conds, type_) {
            let reason = find_condition(conds, type_).map(|x| x.reason.as_str());
            return Some(match reason {
                Some(c::REASON_INVALID_SELECTOR) => c::REASON_INVALID_SELECTOR,
                Some(c::REASON_EXPORTER_NOT_FOUND) => c::REASON_EXPORTER_NOT_FOUND,
                Some(c::REASON_SELECTOR_MISMATCH) => c::REASON_SELECTOR_MISMATCH,
                Some(c::REASON_EXPORTER_DISABLED) => c::REASON_EXPORTER_DISABLED,
                Some(c::REASON_ALL_DISABLED) => c::REASON_ALL_DISABLED,
                Some(c::REASON_NO_ACCESS) => c::REASON_NO_ACCESS,
                Some(c::REASON_SPOT_ACCESS) => c::REASON_SPOT_ACCESS,
                _ if type_ == c::INVALID => c::INVALID,
                _ => c::UNSATISFIABLE,
            });
        }
    }
    None
}

/// (2) set the begin time and `Ready` once assigned, then (3) release / expiry.
fn begin_and_check_end(w: &mut Work<'_>, now: Timestamp) {
    if w.status.begin_time.is_none() {
        w.status.begin_time = Some(metav1::Time(now));
        w.cond(
            c::READY,
            true,
            c::REASON_READY,
            "An exporter has been acquired for the client",
            now,
        );
    }
    if w.lease.spec.release {
        w.cond(
            c::READY,
            false,
            c::REASON_RELEASED,
            "The lease was marked for release",
            now,
        );
        w.end(c::REASON_RELEASED, now);
        return;
    }
    match w.lease.expiration_with(Some(&w.status)) {
        Some(exp) if exp <= now => {
            w.cond(
                c::READY,
                false,
                c::REASON_EXPIRED,
                "The lease has expired",
                now,
            );
            w.end(c::REASON_EXPIRED, now);
        }
        Some(exp) => w.requeue_at = Some(exp),
        // No duration and no end: upstream never expires such a lease.
        None => w.requeue_at = None,
    }
}

/// The latest end a pending lease can have: `spec.endTime`, else `spec.beginTime + duration`.
fn pending_deadline(l: &Lease) -> Option<Timestamp> {
    if let Some(end) = &l.spec.end_time {
        return Some(end.0);
    }
    let begin = l.spec.begin_time.as_ref()?.0;
    let d = l.spec.duration?.0;
    Some(begin.saturating_add(d).unwrap_or(Timestamp::MAX))
}

type Terminal = (&'static str, &'static str, String);

/// Why a lease change was refused: the condition a direct request with the same client,
/// selector, exporter and duration would end with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessDenied {
    /// The condition type (`Unsatisfiable` or `Invalid`).
    pub type_: &'static str,
    /// The condition reason (e.g. `NoAccess`).
    pub reason: &'static str,
    /// The condition message.
    pub message: String,
}

impl std::fmt::Display for AccessDenied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

/// The duration the access policies judge: the requested one, and for a lease that holds
/// an exporter at least the time from its begin to its expiry (so a later end time cannot
/// stretch a granted lease past a policy's `maximumDuration`).
pub fn policy_duration(lease: &Lease) -> Option<SignedDuration> {
    let requested = lease.requested_duration();
    let held = lease
        .status
        .as_ref()
        .and_then(|s| s.begin_time.as_ref())
        .zip(lease.expiration())
        .map(|(begun, end)| end.duration_since(begun.0));
    match (requested, held) {
        (Some(r), Some(h)) => Some(r.max(h)),
        (r, h) => r.or(h),
    }
}

/// Whether the access policies (none: everything is allowed) grant `lease`'s client an
/// exporter labelled `labels` for the lease's duration: what a pool would make for it.
pub fn policies_grant(
    lease: &Lease,
    labels: &BTreeMap<String, String>,
    policies: &[&ExporterAccessPolicy],
    client_labels: &BTreeMap<String, String>,
) -> bool {
    if policies.is_empty() {
        return true;
    }
    let mut probe = Exporter::new("pool-replica", Default::default());
    probe.metadata.labels = Some(labels.clone());
    best_grant(
        &probe,
        policies,
        client_labels,
        policy_duration(lease),
        &mut BTreeSet::new(),
    )
    .is_some()
}

/// Checks `lease` (as it would be after a change: its client, selector, pinned exporter and
/// duration) with the ExporterAccessPolicy evaluation of a new request. A lease that holds an
/// exporter is judged as a request pinned to that exporter; a waiting lease as a request
/// with its own selector. `exporters`, `policies` and `clients` may span namespaces.
pub fn check_access(
    lease: &Lease,
    exporters: &[Exporter],
    policies: &[ExporterAccessPolicy],
    clients: &[Client],
) -> Result<(), AccessDenied> {
    let ns = namespace_of(&lease.metadata);
    let exporters: Vec<&Exporter> = exporters
        .iter()
        .filter(|e| namespace_of(&e.metadata) == ns)
        .collect();
    let policies: Vec<&ExporterAccessPolicy> = policies
        .iter()
        .filter(|p| namespace_of(&p.metadata) == ns)
        .collect();
    let client = clients
        .iter()
        .find(|c| {
            namespace_of(&c.metadata) == ns && name_of(&c.metadata) == lease.spec.client_ref.name
        })
        .and_then(|c| c.metadata.labels.clone())
        .unwrap_or_default();
    let mut probe = lease.clone();
    if let Some(held) = lease.assigned_exporter().filter(|_| !lease.is_ended()) {
        probe.spec.exporter_ref = Some(LocalObjectReference {
            name: held.to_string(),
        });
        // A running lease keeps its exporter even if it was disabled meanwhile.
        probe.spec.allow_disabled = true;
    }
    evaluate(&probe, &exporters, &policies, &client)
        .map(|_| ())
        .map_err(|(type_, reason, message)| AccessDenied {
            type_,
            reason,
            message,
        })
}

/// Steps 2–4: the exporters this lease may use, with the granting rule's priority and spot flag,
/// or a terminal `Invalid`/`Unsatisfiable` condition.
fn evaluate<'a>(
    lease: &Lease,
    exporters: &[&'a Exporter],
    policies: &[&ExporterAccessPolicy],
    client_labels: &BTreeMap<String, String>,
) -> Result<Vec<Approved<'a>>, Terminal> {
    let selector = LabelSelector::from_k8s(&lease.spec.selector).map_err(|e| {
        (
            c::INVALID,
            c::REASON_INVALID_SELECTOR,
            format!(
                "The lease selector is invalid: {e}",
                e = jumpstarter_core::error_chain(&e)
            ),
        )
    })?;
    let candidates = candidates(&lease.spec, &selector, exporters)?;
    if policies.is_empty() {
        if candidates.is_empty() {
            return Err((
                c::UNSATISFIABLE,
                c::REASON_NO_ACCESS,
                format!("There are no exporters matching the selector {selector}"),
            ));
        }
        return Ok(candidates
            .into_iter()
            .map(|exporter| Approved {
                exporter,
                priority: 0,
                spot: false,
            })
            .collect());
    }
    approve(lease, &candidates, &selector, policies, client_labels)
}

/// Steps 2–3: the enabled exporters the lease asks for: the one its `exporterRef` pins
/// (which must exist, match the selector and be enabled unless `allowDisabled`), else those
/// matching its selector (sorted by name).
fn candidates<'a>(
    spec: &crate::objects::LeaseSpec,
    selector: &LabelSelector,
    exporters: &[&'a Exporter],
) -> Result<Vec<&'a Exporter>, Terminal> {
    let pinned = spec
        .exporter_ref
        .as_ref()
        .map(|r| r.name.as_str())
        .filter(|n| !n.is_empty());
    match pinned {
        None if selector.is_empty() => Err((
            c::INVALID,
            c::REASON_INVALID_SELECTOR,
            "The lease has an empty selector and no exporterRef: one of selector or exporterRef.name is required"
                .to_string(),
        )),
        Some(name) => {
            let Some(e) = exporters.iter().find(|e| name_of(&e.metadata) == name) else {
                return Err((
                    c::UNSATISFIABLE,
                    c::REASON_EXPORTER_NOT_FOUND,
                    format!("The requested exporter {name:?} does not exist"),
                ));
            };
            if !selector.is_empty() && !selector.matches(e.label_map()) {
                return Err((
                    c::UNSATISFIABLE,
                    c::REASON_SELECTOR_MISMATCH,
                    format!(
                        "The requested exporter {name:?} does not match the lease selector {selector}"
                    ),
                ));
            }
            if !e.is_enabled() && !spec.allow_disabled {
                return Err((
                    c::UNSATISFIABLE,
                    c::REASON_EXPORTER_DISABLED,
                    format!(
                        "The requested exporter {name:?} is disabled (set allowDisabled to lease it anyway)"
                    ),
                ));
            }
            Ok(vec![*e])
        }
        None => {
            let mut matching: Vec<&'a Exporter> = exporters
                .iter()
                .copied()
                .filter(|e| selector.matches(e.label_map()))
                .collect();
            // By name (`Namespace::of` sorted the exporters already, so this is one pass).
            matching.sort_by_key(|e| name_of(&e.metadata));
            let enabled: Vec<&'a Exporter> = matching
                .iter()
                .copied()
                .filter(|e| e.is_enabled())
                .collect();
            if !matching.is_empty() && enabled.is_empty() {
                return Err((
                    c::UNSATISFIABLE,
                    c::REASON_ALL_DISABLED,
                    if matching.len() == 1 {
                        format!(
                            "The 1 exporter matching the selector {selector} is disabled (i.e. {})",
                            names(&matching)
                        )
                    } else {
                        format!(
                            "All {} exporters matching the selector {selector} are disabled (i.e. {})",
                            matching.len(),
                            names(&matching)
                        )
                    },
                ));
            }
            Ok(enabled)
        }
    }
}

/// Step 4: the candidates some access policy grants to the lease's client, each with the
/// best grant (non-spot first, then the highest priority); none is `NoAccess`, naming the
/// descriptions of the rules that did not match the client.
fn approve<'a>(
    lease: &Lease,
    candidates: &[&'a Exporter],
    selector: &LabelSelector,
    policies: &[&ExporterAccessPolicy],
    client_labels: &BTreeMap<String, String>,
) -> Result<Vec<Approved<'a>>, Terminal> {
    check_policy_selectors(policies)?;
    let requested = policy_duration(lease);
    let mut approved = Vec::new();
    let mut descriptions: BTreeSet<String> = BTreeSet::new();
    for &e in candidates {
        approved.extend(best_grant(
            e,
            policies,
            client_labels,
            requested,
            &mut descriptions,
        ));
    }
    if approved.is_empty() {
        let mut message = if candidates.is_empty() {
            format!("There are no exporters matching the selector {selector}")
        } else if candidates.len() == 1 {
            "While there is 1 exporter matching the selector, it is not approved by any policy for your client".to_string()
        } else {
            format!(
                "While there are {} exporters matching the selector, none of them are approved by any policy for your client",
                candidates.len()
            )
        };
        if !descriptions.is_empty() {
            let list: Vec<String> = descriptions.into_iter().collect();
            message.push_str(&format!(". Matching policies: {}", list.join(", ")));
        }
        return Err((c::UNSATISFIABLE, c::REASON_NO_ACCESS, message));
    }
    Ok(approved)
}

/// A policy whose exporter or client selector the API server would refuse (an unknown
/// operator in a match expression, a bad key): the lease is `Invalid`, naming the policy and
/// what is wrong, rather than the policy matching nothing (which could hand the lease to an
/// exporter another rule grants with a lower priority, or end it as `NoAccess` for no
/// visible reason). Upstream's reconciler fails on such a policy too.
fn check_policy_selectors(policies: &[&ExporterAccessPolicy]) -> Result<(), Terminal> {
    for p in policies {
        let broken = |field: String, e: crate::objects::selector::SelectorError| {
            (
                c::INVALID,
                c::REASON_INVALID_SELECTOR,
                format!(
                    "ExporterAccessPolicy {}/{}: {field} is invalid: {e}",
                    namespace_of(&p.metadata),
                    name_of(&p.metadata),
                    e = jumpstarter_core::error_chain(&e)
                ),
            )
        };
        LabelSelector::from_k8s(&p.spec.exporter_selector)
            .map_err(|e| broken("spec.exporterSelector".into(), e))?;
        for (i, rule) in p.spec.policies.iter().enumerate() {
            for (j, from) in rule.from.iter().enumerate() {
                LabelSelector::from_k8s(&from.client_selector).map_err(|e| {
                    broken(format!("spec.policies[{i}].from[{j}].clientSelector"), e)
                })?;
            }
        }
    }
    Ok(())
}

/// The best rule granting exporter `e` to a client with `client_labels` for `requested`
/// (non-spot first, then the highest priority); the descriptions of rules that did not match
/// the client are added to `descriptions`.
fn best_grant<'a>(
    e: &'a Exporter,
    policies: &[&ExporterAccessPolicy],
    client_labels: &BTreeMap<String, String>,
    requested: Option<jiff::SignedDuration>,
    descriptions: &mut BTreeSet<String>,
) -> Option<Approved<'a>> {
    let labels = e.label_map();
    let mut best: Option<Approved<'a>> = None;
    for p in policies {
        let Ok(exporter_selector) = LabelSelector::from_k8s(&p.spec.exporter_selector) else {
            continue;
        };
        if !exporter_selector.matches(labels) {
            continue;
        }
        for rule in &p.spec.policies {
            let client_match = rule.from.iter().any(|f| {
                LabelSelector::from_k8s(&f.client_selector).is_ok_and(|s| s.matches(client_labels))
            });
            if !client_match {
                if !rule.description.is_empty() {
                    descriptions.insert(rule.description.clone());
                }
                continue;
            }
            if let (Some(max), Some(req)) = (rule.maximum_duration, requested)
                && req > max.0
            {
                continue;
            }
            let a = Approved {
                exporter: e,
                priority: rule.priority,
                spot: rule.spot_access,
            };
            // Prefer non-spot, then higher priority.
            if best.is_none_or(|b| (!a.spot, a.priority) > (!b.spot, b.priority)) {
                best = Some(a);
            }
        }
    }
    best
}

enum Pick<'a> {
    Grant(Approved<'a>),
    Wait(&'static str, String),
    Unsatisfiable(&'static str, String),
}

/// Steps 5–9 for one queued lease, given the exporters already held.
/// Per approved list of a pass (leases asking the same share one, see `queue_pending`):
/// whether its exporters are all alike (no spot, one priority), and where the scan for a
/// free one starts. Within a pass, `busy` only grows and every other test of an exporter
/// gives the same answer, so the exporters before the last one granted from the list need
/// not be looked at again: a pass of L leases on E exporters costs L + E look-ups instead
/// of about L²/2 (and L × E for the "all alike" test), 60 ms of a 230 ms pass with 1,000
/// leases asking one pool of 10,000.
type Scans<'a> = HashMap<*const Approved<'a>, (bool, usize)>;

fn pick<'a>(
    q: &Candidate<'a>,
    busy: &BTreeMap<String, String>,
    now: Timestamp,
    scans: &mut Scans<'a>,
) -> Pick<'a> {
    if q.approved.is_empty() {
        return Pick::Wait(
            c::REASON_NOT_AVAILABLE,
            "No exporter matching the selector exists yet: a pool (ExporterSet) is making one"
                .to_string(),
        );
    }
    let is_free = |a: &Approved<'_>| !busy.contains_key(name_of(&a.exporter.metadata));
    let grantable = |a: &Approved<'_>| {
        is_free(a)
            && exporter_is_online(a.exporter, now)
            && a.exporter.unhealthy().is_none()
            && exporter_is_ready(a.exporter)
    };
    // The most common queue: every approved exporter alike (no spot, one priority, as with
    // no access policies). `approved` is in name order (see `candidates`), which is then the
    // whole order below, so the first grantable one is the one granted, and the scan stops
    // there: the leases granted before in this pass hold the first names, so a pass of L
    // leases costs about L²/2 look-ups rather than L × exporters.
    let (alike, from) = scans.entry(q.approved.as_ptr()).or_insert_with(|| {
        let alike = q.approved.first().is_some_and(|first| {
            q.approved
                .iter()
                .all(|a| !a.spot && a.priority == first.priority)
        });
        (alike, 0)
    });
    if *alike && let Some(i) = q.approved[*from..].iter().position(grantable) {
        // The granted one is looked at again first next time (one look-up): its lease may
        // end at once and leave it free.
        *from += i;
        return Pick::Grant(q.approved[*from]);
    }
    let approved_names = names_of(q.approved.iter().map(|a| a.exporter));
    let mut online: Vec<Approved<'a>> = q
        .approved
        .iter()
        .copied()
        .filter(|a| exporter_is_online(a.exporter, now))
        .collect();
    if online.is_empty() {
        // Absolute times: the message is stored in the lease's condition, rewritten only
        // when it changes.
        let seen = last_seen_of(q.approved.iter().map(|a| a.exporter));
        return Pick::Wait(
            c::REASON_OFFLINE,
            if q.approved.len() == 1 {
                format!(
                    "While there is 1 available exporter (i.e. {approved_names}), it is not online ({seen})"
                )
            } else {
                format!(
                    "While there are {} available exporters (i.e. {approved_names}), none of them are online ({seen})",
                    q.approved.len()
                )
            },
        );
    }
    let is_busy = |a: &Approved<'_>| busy.contains_key(name_of(&a.exporter.metadata));
    let order = |a: &Approved<'a>| {
        let e: &'a Exporter = a.exporter;
        (
            is_busy(a),
            a.spot,
            Reverse(a.priority),
            name_of(&e.metadata),
        )
    };
    // The usual case, in one pass over the online exporters (a lab of 10,000 sorted for each
    // of 1,000 queued leases took seconds): the best of them is not spot-only, and the best
    // free, healthy and ready one is granted. It is the one the steps below pick, as they
    // take the first in this same order; they run only when none can be granted, for the
    // messages.
    if online
        .iter()
        .min_by_key(|a| order(a))
        .is_some_and(|a| !a.spot)
        && let Some(a) = online
            .iter()
            .filter(|a| {
                !is_busy(a) && a.exporter.unhealthy().is_none() && exporter_is_ready(a.exporter)
            })
            .min_by_key(|a| order(a))
    {
        return Pick::Grant(*a);
    }
    online.sort_by_cached_key(order);
    if online.first().is_some_and(|a| a.spot) {
        return Pick::Unsatisfiable(
            c::REASON_SPOT_ACCESS,
            format!(
                "The best approved exporter ({}) is only granted with spot access, which is not implemented",
                online
                    .first()
                    .map(|a| name_of(&a.exporter.metadata))
                    .unwrap_or_default()
            ),
        );
    }
    let online_names = names_of(online.iter().map(|a| a.exporter));
    let free: Vec<Approved<'a>> = online.iter().copied().filter(|a| !is_busy(a)).collect();
    if free.is_empty() {
        return Pick::Wait(
            c::REASON_NOT_AVAILABLE,
            if online.len() == 1 {
                format!(
                    "There is 1 approved exporter, (i.e. {online_names}) but it is already leased"
                )
            } else {
                format!(
                    "There are {} approved exporters, (i.e. {online_names}) but all of them are already leased",
                    online.len()
                )
            },
        );
    }
    // Quarantine (ours, `docs/hooks.md`): an unhealthy exporter is leased to nobody.
    let free_names = names_of(free.iter().map(|a| a.exporter));
    let free_count = free.len();
    let free: Vec<Approved<'a>> = free
        .into_iter()
        .filter(|a| a.exporter.unhealthy().is_none())
        .collect();
    if free.is_empty() {
        return Pick::Wait(
            c::REASON_UNHEALTHY,
            if free_count == 1 {
                format!(
                    "There is 1 approved and free exporter, (i.e. {free_names}) but it is unhealthy (an admin clears that with `jmp admin clear-health exporter NAME`)"
                )
            } else {
                format!(
                    "There are {free_count} approved and free exporters, (i.e. {free_names}) but all of them are unhealthy (an admin clears that with `jmp admin clear-health exporter NAME`)"
                )
            },
        );
    }
    match free.iter().find(|a| exporter_is_ready(a.exporter)) {
        Some(a) => Pick::Grant(*a),
        None => Pick::Wait(
            c::REASON_NOT_READY,
            if free.len() == 1 {
                format!(
                    "There is 1 approved and free exporter, (i.e. {}) but it is not ready (still cleaning up previous lease)",
                    names_of(free.iter().map(|a| a.exporter))
                )
            } else {
                format!(
                    "There are {} approved and free exporters, (i.e. {}) but none are ready (still cleaning up previous lease)",
                    free.len(),
                    names_of(free.iter().map(|a| a.exporter))
                )
            },
        ),
    }
}

/// At most this many names are listed in a message.
const NAMES_IN_MESSAGE: usize = 5;

fn names(exporters: &[&Exporter]) -> String {
    names_of(exporters.iter().copied())
}

/// When each exporter was last seen (`e1 last seen 2026-12-06 19:40:02 UTC, e2 never
/// seen`), for the first [`NAMES_IN_MESSAGE`].
fn last_seen_of<'a>(exporters: impl Iterator<Item = &'a Exporter>) -> String {
    exporters
        .take(NAMES_IN_MESSAGE)
        .map(|e| {
            let name = name_of(&e.metadata);
            match e.status.as_ref().and_then(|s| s.last_seen.as_ref()) {
                Some(t) => format!("{name} last seen {}", t.0.strftime("%Y-%m-%d %H:%M:%S UTC")),
                None => format!("{name} never seen"),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn names_of<'a>(exporters: impl Iterator<Item = &'a Exporter>) -> String {
    let all: Vec<&str> = exporters.map(|e| name_of(&e.metadata)).collect();
    let mut s = all
        .iter()
        .take(NAMES_IN_MESSAGE)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if all.len() > NAMES_IN_MESSAGE {
        s.push_str(&format!(", and {} more", all.len() - NAMES_IN_MESSAGE));
    }
    s
}

#[cfg(test)]
mod tests;
