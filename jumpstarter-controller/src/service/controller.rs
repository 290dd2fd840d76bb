//! `jumpstarter.v1.ControllerService`: exporter registration, status, Listen and Dial.

use std::{collections::BTreeMap, pin::Pin, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use jiff::Timestamp;
use jumpstarter_core::auth::ObjectKind;
use jumpstarter_proto::v1::{
    AuditStreamRequest, DialRequest, DialResponse, ExporterStatus as PbStatus, GetLeaseRequest,
    GetLeaseResponse, GetServiceEndpointsRequest, GetServiceEndpointsResponse, ListLeasesRequest,
    ListLeasesResponse, ListenRequest, ListenResponse, RegisterRequest, RegisterResponse,
    ReleaseLeaseRequest, ReleaseLeaseResponse, ReportStatusRequest, ReportStatusResponse,
    RequestLeaseRequest, RequestLeaseResponse, StatusRequest, StatusResponse, UnregisterRequest,
    UnregisterResponse, controller_service_server::ControllerService,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use tonic::{Request, Response, Status, Streaming};

use crate::{
    objects::{
        Device, Exporter, ExporterStatus, ExporterStatusValue, LEASE_ENDED_LABEL, Lease,
        RESERVED_LABEL_PREFIX, condition_to_proto, conditions, selector::LabelSelector,
        set_condition, timestamp_to_proto,
    },
    service::{
        limits::{self, MAX_IDENTIFIER, MAX_LABEL_TEXT, MAX_REPORTS, MAX_SELECTOR, MAX_TEXT},
        live_exporters::ConnKey,
    },
    state::{Caller, ControllerState, store_status},
    store::{ListParams, Store},
};

/// How often the Status stream marks its exporter seen (in memory; the reconcile loop
/// computes the `Online` condition from it).
const HEARTBEAT: Duration = Duration::from_secs(10);

/// Every this many heartbeats the stored `lastSeen` is refreshed too (30 s: well within the
/// 1 minute after which an exporter counts as offline, so that a restarted controller or
/// another reader of the store agrees, at a third of the writes). The refreshes of all
/// exporters due within a second are written together (`ExporterCache::persist_seen`).
const PERSIST_EVERY: u32 = 3;

/// How long a Status call waits for the exporter cache to load.
const FEED_SYNC_WAIT: Duration = Duration::from_secs(30);

/// `Dial` for an exporter still AVAILABLE looks again after this long, then doubling (up to
/// 3 s, for up to 30 s in all).
const DIAL_READY_FIRST_WAIT: Duration = Duration::from_millis(10);

/// The ControllerService implementation.
pub struct ControllerApi<S: Store>(pub Arc<ControllerState<S>>);

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// How many times a read-modify-write is tried before it gives up with ABORTED.
const CONFLICT_TRIES: u32 = 16;

/// Waits before the next try of a read-modify-write that met a conflict: 1 ms doubling up
/// to 64 ms, each 50-100% of that at random. Without it, two writers of one object that
/// retry at once (this one and, e.g., the batch that stores when exporters were last seen)
/// can meet each other every time on a loaded machine, and the call fails after 16 tries in
/// a few milliseconds.
async fn conflict_backoff(attempt: u32) {
    let random = (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 1000.0;
    tokio::time::sleep(conflict_delay(attempt, random)).await;
}

/// The wait before try `attempt + 2`, for a `random` number in [0, 1).
fn conflict_delay(attempt: u32, random: f64) -> Duration {
    Duration::from_millis(1u64 << attempt.min(6)).mul_f64(0.5 + random.clamp(0.0, 1.0) / 2.0)
}

/// Re-reads and modifies an exporter until the write does not conflict.
pub async fn update_exporter<S: Store>(
    store: &S,
    namespace: &str,
    name: &str,
    status_only: bool,
    mut f: impl FnMut(&mut Exporter) -> bool,
) -> Result<Exporter, Status> {
    for attempt in 0..CONFLICT_TRIES {
        if attempt > 0 {
            conflict_backoff(attempt - 1).await;
        }
        let mut e: Exporter = store
            .get(namespace, name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("exporter {namespace}/{name} not found")))?;
        if !f(&mut e) {
            return Ok(e);
        }
        let r = if status_only {
            store.update_status(&e).await
        } else {
            store.update(&e).await
        };
        match r {
            Ok(e) => return Ok(e),
            Err(err) if err.is_conflict() => continue,
            Err(err) => return Err(store_status(err)),
        }
    }
    Err(Status::aborted(format!(
        "exporter {namespace}/{name} kept changing; try again"
    )))
}

/// Re-reads and modifies a lease until the write does not conflict.
pub async fn update_lease<S: Store>(
    store: &S,
    namespace: &str,
    name: &str,
    mut f: impl FnMut(&mut Lease) -> Result<bool, Status>,
) -> Result<Lease, Status> {
    for attempt in 0..CONFLICT_TRIES {
        if attempt > 0 {
            conflict_backoff(attempt - 1).await;
        }
        let mut l: Lease = store
            .get(namespace, name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("lease {namespace}/{name} not found")))?;
        if !f(&mut l)? {
            return Ok(l);
        }
        match store.update(&l).await {
            Ok(l) => return Ok(l),
            Err(err) if err.is_conflict() => continue,
            Err(err) => return Err(store_status(err)),
        }
    }
    Err(Status::aborted(format!(
        "lease {namespace}/{name} kept changing; try again"
    )))
}

/// Whether an exporter's `ReportStatus` can change what a reconcile pass decides, so that a
/// pass must run now. The scheduler grants only an exporter that is online and ready
/// (`AVAILABLE` or unspecified), and a quarantine or a release request changes a lease; a
/// report of a lease's progress (`LEASE_READY`, or a hook running) makes no exporter
/// grantable. While 1,000 leases were granted at once, each exporter's `LEASE_READY` woke
/// the loop: a score of passes over all the leases, changing nothing, took CPU from the
/// grants still being made. A waiting lease's `Pending` reason is looked at again within
/// [`crate::lease::scheduler::PENDING_REQUEUE`] either way, and an exporter's lapse into
/// offline is timed by the pass from its `lastSeen`.
fn report_may_change_scheduling(
    value: ExporterStatusValue,
    unhealthy: bool,
    release_lease: Option<bool>,
) -> bool {
    let progress = matches!(
        value,
        ExporterStatusValue::LeaseReady
            | ExporterStatusValue::BeforeLeaseHook
            | ExporterStatusValue::AfterLeaseHook
    );
    !progress || unhealthy || release_lease == Some(true)
}

/// Marks lease `namespace/name` for release (`spec.release`; the scheduler then ends it) and
/// wakes the scheduler: the one write of `jmp delete lease` (the client API's `DeleteLease`),
/// of the admin API releasing a deleted exporter's leases and of the dashboard's End lease.
/// A lease that has ended or is already marked is left as it is. Returns the lease as stored
/// after.
pub(crate) async fn release_lease<S: Store>(
    state: &ControllerState<S>,
    namespace: &str,
    name: &str,
) -> Result<Lease, Status> {
    let l = mark_release(&state.store, namespace, name, |_| Ok(true)).await?;
    state.wake.notify_one();
    Ok(l)
}

/// Sets lease `namespace/name`'s release mark (`spec.release`; the scheduler then ends it)
/// when `may` says so of the lease as stored: `Ok(false)` leaves it as it is, an error is
/// the call's answer. A lease that has ended or is already marked is left as it is. Every
/// release is written here (the caller wakes the scheduler). Returns the lease as stored
/// after.
pub(crate) async fn mark_release<S: Store>(
    store: &S,
    namespace: &str,
    name: &str,
    may: impl Fn(&Lease) -> Result<bool, Status>,
) -> Result<Lease, Status> {
    update_lease(store, namespace, name, |l| {
        if !may(l)? || l.is_ended() || l.spec.release {
            return Ok(false);
        }
        l.spec.release = true;
        Ok(true)
    })
    .await
}

/// The lease `namespace/name`, or NOT_FOUND.
async fn get_lease<S: Store>(store: &S, namespace: &str, name: &str) -> Result<Lease, Status> {
    store
        .get(namespace, name)
        .await
        .map_err(store_status)?
        .ok_or_else(|| Status::not_found(format!("lease {name} not found")))
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn status_mut(e: &mut Exporter) -> &mut ExporterStatus {
    e.status.get_or_insert_with(ExporterStatus::default)
}

impl<S: Store> ControllerApi<S> {
    async fn exporter(&self, req_md: &tonic::metadata::MetadataMap) -> Result<Caller, Status> {
        self.0.auth.authenticate(req_md, ObjectKind::Exporter).await
    }

    /// Refuses a caller that is not the connection holding its exporter identity online
    /// (see [`crate::service::live_exporters`]).
    fn check_live<T>(&self, caller: &Caller, request: &Request<T>) -> Result<(), Status> {
        let (key, _) = conn_key(request);
        self.0
            .live_exporters
            .check(&caller.namespace, &caller.name, &key)
    }

    async fn status_response(&self, e: &Exporter) -> StatusResponse {
        let lease = e
            .status
            .as_ref()
            .and_then(|s| s.lease_ref.as_ref())
            .map(|r| r.name.clone());
        let mut holder = None;
        let namespace = e.metadata.namespace.as_deref().unwrap_or_default();
        if let Some(l) = &lease {
            holder = self.0.lease_holder(namespace, l);
            if holder.is_none()
                && let Ok(Some(lease)) = self.0.store.get::<Lease>(namespace, l).await
            {
                holder = Some(crate::state::LeaseHolder {
                    client: lease.spec.client_ref.name.clone(),
                    context: lease.spec.context.clone(),
                });
            }
        }
        let (client_name, context) = match holder {
            Some(h) => (Some(h.client), h.context.into_iter().collect()),
            None => (None, Default::default()),
        };
        StatusResponse {
            leased: lease.is_some(),
            lease_name: lease,
            client_name,
            context,
        }
    }
}

#[tonic::async_trait]
impl<S: Store> ControllerService for ControllerApi<S> {
    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        let caller = self.exporter(request.metadata()).await?;
        self.check_live(&caller, &request)?;
        let req = request.into_inner();
        limits::check_labels("labels", req.labels.iter(), MAX_LABEL_TEXT)?;
        limits::check_count("reports", req.reports.len(), MAX_REPORTS)?;
        for (i, r) in req.reports.iter().enumerate() {
            limits::check_len(&format!("reports[{i}].uuid"), &r.uuid, MAX_IDENTIFIER)?;
            limits::check_len(
                &format!("reports[{i}].parent_uuid"),
                r.parent_uuid.as_deref().unwrap_or_default(),
                MAX_IDENTIFIER,
            )?;
            limits::check_labels(
                &format!("reports[{i}].labels"),
                r.labels.iter(),
                MAX_LABEL_TEXT,
            )?;
            limits::check_len(
                &format!("reports[{i}].description"),
                r.description.as_deref().unwrap_or_default(),
                MAX_TEXT,
            )?;
            limits::check_labels(
                &format!("reports[{i}].methods_description"),
                r.methods_description.iter(),
                MAX_TEXT,
            )?;
        }
        // Only `jumpstarter.dev/` labels come from the exporter; admins own the rest.
        let reported: BTreeMap<String, String> = req
            .labels
            .into_iter()
            .filter(|(k, _)| k.starts_with(RESERVED_LABEL_PREFIX))
            .collect();
        update_exporter(&self.0.store, &caller.namespace, &caller.name, false, |e| {
            let labels = e.metadata.labels.get_or_insert_with(BTreeMap::new);
            let before = labels.clone();
            labels.retain(|k, _| !k.starts_with(RESERVED_LABEL_PREFIX));
            labels.extend(reported.clone());
            *labels != before
        })
        .await?;
        let devices: Vec<Device> = req
            .reports
            .iter()
            .map(|r| Device {
                uuid: r.uuid.clone(),
                parent_uuid: r.parent_uuid.clone(),
                labels: r.labels.clone().into_iter().collect(),
            })
            .collect();
        let e = update_exporter(&self.0.store, &caller.namespace, &caller.name, true, |e| {
            let t = now();
            let s = status_mut(e);
            s.devices = Some(devices.clone());
            s.last_seen = Some(metav1::Time(t));
            s.endpoint = self.0.endpoint.clone();
            set_condition(
                &mut s.conditions,
                conditions::REGISTERED,
                true,
                "Register",
                "Exporter registered",
                None,
                t,
            );
            true
        })
        .await?;
        self.0.wake.notify_one();
        Ok(Response::new(RegisterResponse {
            uuid: e.metadata.uid.unwrap_or_default(),
        }))
    }

    async fn unregister(
        &self,
        request: Request<UnregisterRequest>,
    ) -> Result<Response<UnregisterResponse>, Status> {
        let caller = self.exporter(request.metadata()).await?;
        // A second instance that stops does not unregister the one online.
        self.check_live(&caller, &request)?;
        update_exporter(&self.0.store, &caller.namespace, &caller.name, true, |e| {
            let t = now();
            let s = status_mut(e);
            s.devices = None;
            set_condition(
                &mut s.conditions,
                conditions::REGISTERED,
                false,
                "Unregister",
                "Exporter unregistered",
                None,
                t,
            );
            true
        })
        .await?;
        self.0.wake.notify_one();
        Ok(Response::new(UnregisterResponse {}))
    }

    async fn report_status(
        &self,
        request: Request<ReportStatusRequest>,
    ) -> Result<Response<ReportStatusResponse>, Status> {
        let caller = self.exporter(request.metadata()).await?;
        let (key, _) = conn_key(&request);
        let req = request.into_inner();
        limits::check_len(
            "message",
            req.message.as_deref().unwrap_or_default(),
            MAX_TEXT,
        )?;
        let status = PbStatus::try_from(req.status).map_err(|_| {
            Status::invalid_argument(format!("unknown exporter status {}", req.status))
        })?;
        let value = ExporterStatusValue::from(status);
        // A second instance that stops takes neither the exporter offline nor its lease
        // away. Other reports are taken from any connection of the identity: behind a
        // proxy an upstream exporter's calls may come from several peers.
        if matches!(
            value,
            ExporterStatusValue::Offline | ExporterStatusValue::Unspecified
        ) || req.release_lease == Some(true)
        {
            self.0
                .live_exporters
                .check(&caller.namespace, &caller.name, &key)?;
        }
        let message = req.message.clone().unwrap_or_default();
        let unhealthy = jumpstarter_core::hooks::Unhealthy::parse(&message);
        let e = update_exporter(&self.0.store, &caller.namespace, &caller.name, true, |e| {
            let t = now();
            let s = status_mut(e);
            if let Some(u) = &unhealthy {
                // Quarantine (ours, `docs/hooks.md`): the status itself is unchanged.
                let reason = match u.kind {
                    "healthCheck" => conditions::REASON_HEALTH_CHECK_FAILED,
                    "beforeLease" | "afterLease" => conditions::REASON_HOOK_FAILED,
                    _ => conditions::REASON_REPORTED_UNHEALTHY,
                };
                let text = message
                    .strip_prefix(jumpstarter_core::hooks::UNHEALTHY_PREFIX)
                    .unwrap_or(&message);
                set_condition(
                    &mut s.conditions,
                    conditions::HEALTHY,
                    false,
                    reason,
                    text,
                    None,
                    t,
                );
                s.last_seen = Some(metav1::Time(t));
                tracing::warn!(
                    "exporter {}/{} is unhealthy: {}",
                    caller.namespace,
                    caller.name,
                    u.reason
                );
                return true;
            }
            s.exporter_status = Some(value);
            s.status_message = message.clone();
            s.last_seen = Some(metav1::Time(t));
            let online = !matches!(
                value,
                ExporterStatusValue::Offline | ExporterStatusValue::Unspecified
            );
            if online {
                set_condition(
                    &mut s.conditions,
                    conditions::ONLINE,
                    true,
                    "StatusReported",
                    &format!("Exporter reported status: {}", value.as_str()),
                    None,
                    t,
                );
            } else {
                set_condition(
                    &mut s.conditions,
                    conditions::ONLINE,
                    false,
                    "Offline",
                    &message,
                    None,
                    t,
                );
            }
            true
        })
        .await?;
        // The dashboard's hook runs and health events (in memory).
        self.0.hook_history.status_reported(
            &caller.namespace,
            &caller.name,
            status,
            &message,
            e.status
                .as_ref()
                .and_then(|s| s.lease_ref.as_ref())
                .map(|r| r.name.as_str()),
            jiff::Timestamp::now(),
        );
        if req.release_lease == Some(true)
            && let Some(lease) = e.status.as_ref().and_then(|s| s.lease_ref.as_ref())
        {
            // Only the lease it holds.
            let r = mark_release(&self.0.store, &caller.namespace, &lease.name, |l| {
                Ok(l.assigned_exporter() == Some(caller.name.as_str()))
            })
            .await;
            if let Err(e) = r {
                tracing::warn!(
                    "release of lease {} requested by exporter failed: {e}",
                    lease.name
                );
            }
        }
        if report_may_change_scheduling(value, unhealthy.is_some(), req.release_lease) {
            self.0.wake.notify_one();
        }
        Ok(Response::new(ReportStatusResponse {}))
    }

    type ListenStream = BoxStream<ListenResponse>;

    async fn listen(
        &self,
        request: Request<ListenRequest>,
    ) -> Result<Response<Self::ListenStream>, Status> {
        let caller = self.exporter(request.metadata()).await?;
        let lease_name = request.into_inner().lease_name;
        limits::check_len("lease_name", &lease_name, MAX_IDENTIFIER)?;
        if lease_name.is_empty() {
            return Err(Status::unknown("empty lease name"));
        }
        let lease = get_lease(&self.0.store, &caller.namespace, &lease_name).await?;
        if lease.assigned_exporter() != Some(caller.name.as_str()) {
            return Err(Status::unknown("permission denied"));
        }
        let (id, rx) = self.0.listeners.listen(&caller.namespace, &lease_name);
        let state = self.0.clone();
        let guard = ListenGuard {
            state,
            namespace: caller.namespace,
            lease: lease_name,
            id,
        };
        let stopping = self.0.clone();
        let out = tokio_stream::wrappers::ReceiverStream::new(rx)
            .map(move |m| {
                let _ = &guard;
                Ok(m)
            })
            .take_until(Box::pin(async move { stopping.stopped().await }));
        Ok(Response::new(Box::pin(out)))
    }

    type StatusStream = BoxStream<StatusResponse>;

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<Self::StatusStream>, Status> {
        let caller = self.exporter(request.metadata()).await?;
        // One stream per exporter identity: another instance's is refused.
        let (key, peer) = conn_key(&request);
        let claim = self
            .0
            .live_exporters
            .claim(&caller.namespace, &caller.name, key, peer)?;
        let store = self.0.store.clone();
        // Seen now; a stale "Offline" from an earlier shutdown is cleared.
        update_exporter(&store, &caller.namespace, &caller.name, true, |e| {
            let s = status_mut(e);
            s.last_seen = Some(metav1::Time(now()));
            if s.exporter_status == Some(ExporterStatusValue::Offline) {
                s.exporter_status = None;
                s.status_message.clear();
            }
            true
        })
        .await?;
        self.0.wake.notify_one();
        self.0.exporters.touch(&caller.namespace, &caller.name);
        // One feed decodes each exporter change once and hands it to this exporter's streams.
        self.0.start_exporter_feed();
        if !self.0.exporters.synced(FEED_SYNC_WAIT).await {
            return Err(Status::unavailable(
                "the controller is still loading exporters; try again",
            ));
        }
        let mut updates = self.0.exporters.updates(&caller.namespace, &caller.name);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<StatusResponse, Status>>(4);
        let api = ControllerApi(self.0.clone());
        tokio::spawn(async move {
            let mut claim = claim;
            let mut last: Option<StatusResponse> = None;
            let mut heartbeat = tokio::time::interval(HEARTBEAT);
            heartbeat.tick().await;
            let mut beats: u32 = 0;
            // The cache may not have seen the connect write yet; the stored state has.
            let cached = updates.borrow_and_update().clone();
            let mut current: Option<Arc<Exporter>> = match cached {
                Some(e) => Some(e),
                None => store
                    .get(&caller.namespace, &caller.name)
                    .await
                    .ok()
                    .flatten()
                    .map(Arc::new),
            };
            loop {
                if let Some(e) = &current {
                    let msg = api.status_response(e).await;
                    if last.as_ref() != Some(&msg) {
                        if tx.send(Ok(msg.clone())).await.is_err() {
                            return;
                        }
                        last = Some(msg);
                    }
                } else {
                    let _ = tx
                        .send(Err(Status::not_found(format!(
                            "exporter {}/{} was deleted",
                            caller.namespace, caller.name
                        ))))
                        .await;
                    return;
                }
                tokio::select! {
                    _ = tx.closed() => return,
                    // The controller stops: the stream ends (the exporter reconnects).
                    _ = api.0.stopped() => return,
                    _ = claim.replaced() => {
                        let _ = tx
                            .send(Err(Status::aborted(
                                "a newer connection of this exporter instance replaced this one",
                            )))
                            .await;
                        return;
                    }
                    _ = heartbeat.tick() => {
                        api.0.exporters.touch(&caller.namespace, &caller.name);
                        beats += 1;
                        if beats.is_multiple_of(PERSIST_EVERY) {
                            // Written with the other exporters due within a second: one
                            // store commit for all of them.
                            api.0.exporters.persist_seen(&store, &caller.namespace, &caller.name);
                        }
                    }
                    changed = updates.changed() => {
                        if changed.is_err() {
                            // The feed dropped this exporter's channel: follow a fresh one.
                            updates = api.0.exporters.updates(&caller.namespace, &caller.name);
                        }
                        current = updates.borrow_and_update().clone();
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn dial(&self, request: Request<DialRequest>) -> Result<Response<DialResponse>, Status> {
        let caller = self
            .0
            .auth
            .authenticate(request.metadata(), ObjectKind::Client)
            .await?;
        let lease_name = request.into_inner().lease_name;
        limits::check_len("lease_name", &lease_name, MAX_IDENTIFIER)?;
        let lease = get_lease(&self.0.store, &caller.namespace, &lease_name).await?;
        // Its owner and the clients it is shared with dial it (upstream's text for others).
        if lease.access_of(&caller.name).is_none() {
            return Err(Status::unknown("permission denied"));
        }
        let Some(exporter_name) = lease.assigned_exporter().map(str::to_string) else {
            return Err(Status::unknown("lease not active"));
        };
        if lease.is_ended() {
            return Err(Status::unknown("lease not active"));
        }
        // The span of this dial in the lease's trace (with traces on): to the answer.
        let _traced = jumpstarter_core::telemetry::lease_step(
            jumpstarter_core::telemetry::Step::Dial,
            &jumpstarter_core::telemetry::LeaseRef {
                namespace: &caller.namespace,
                name: &lease_name,
                client: &caller.name,
                exporter: &exporter_name,
            },
        );
        // Wait briefly for an exporter that has not yet reported it is ready (as upstream).
        // The first look comes soon: an exporter reports LEASE_READY within milliseconds of
        // the grant, and a lease that follows another at once finds it still AVAILABLE, so
        // a first wait of 500 ms added half a second to every back-to-back `jmp shell`.
        let mut delay = DIAL_READY_FIRST_WAIT;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        // Woken when the exporter's status changes (its report of LEASE_READY), rather than
        // only at the end of each wait.
        let mut updates = self.0.exporters.updates(&caller.namespace, &exporter_name);
        let exporter = loop {
            let e: Exporter = self
                .0
                .store
                .get(&caller.namespace, &exporter_name)
                .await
                .map_err(store_status)?
                .ok_or_else(|| Status::not_found(format!("exporter {exporter_name} not found")))?;
            let st = e.status.as_ref().and_then(|s| s.exporter_status);
            match st {
                None
                | Some(ExporterStatusValue::Unspecified)
                | Some(ExporterStatusValue::LeaseReady)
                | Some(ExporterStatusValue::BeforeLeaseHook)
                | Some(ExporterStatusValue::AfterLeaseHook) => break e,
                Some(ExporterStatusValue::Offline) => {
                    return Err(Status::failed_precondition("exporter is offline"));
                }
                Some(ExporterStatusValue::BeforeLeaseHookFailed) => {
                    return Err(Status::failed_precondition(hook_failed("beforeLease", &e)));
                }
                Some(ExporterStatusValue::AfterLeaseHookFailed) => {
                    return Err(Status::failed_precondition(hook_failed("afterLease", &e)));
                }
                Some(ExporterStatusValue::Available) => {
                    if tokio::time::Instant::now() + delay > deadline {
                        return Err(Status::failed_precondition(
                            "exporter is not ready (status: Available)",
                        ));
                    }
                    let changed = tokio::time::timeout(delay, updates.changed()).await;
                    if matches!(changed, Ok(Err(_))) {
                        // No more updates (the cache went away): wait the whole delay.
                        tokio::time::sleep(delay).await;
                    }
                    delay = (delay * 2).min(Duration::from_secs(3));
                }
            }
        };
        let router = self
            .0
            .choose_router(&exporter.labels())
            .ok_or_else(|| Status::unknown("no router available"))?
            .endpoint
            .clone();
        let token = self
            .0
            .router_key
            .issue_for_lease(
                &format!("{}/{lease_name}", caller.namespace),
                &lease.spec.context,
            )
            .map_err(|e| Status::internal(e.to_string()))?
            .token;
        {
            let _context = crate::lease_logs::context_span(&lease.spec.context).entered();
            tracing::info!(
                lease_id = %lease_name,
                namespace = %caller.namespace,
                client = %caller.name,
                exporter = %exporter_name,
                router = %router,
                "dial"
            );
            if let Some(logs) = &self.0.lease_logs {
                let facts = crate::lease_logs::LeaseFacts {
                    namespace: &caller.namespace,
                    name: &lease_name,
                    client: &caller.name,
                    exporter: &exporter_name,
                    context: &lease.spec.context,
                };
                logs.event(&facts, "dial", &[("router", router.clone())]);
            }
        }
        self.0.listeners.notify(
            &caller.namespace,
            &lease_name,
            ListenResponse {
                router_endpoint: router.clone(),
                router_token: token.clone(),
            },
        )?;
        Ok(Response::new(DialResponse {
            router_endpoint: router,
            router_token: token,
        }))
    }

    async fn get_service_endpoints(
        &self,
        request: Request<GetServiceEndpointsRequest>,
    ) -> Result<Response<GetServiceEndpointsResponse>, Status> {
        // Exporters ask after registering, clients after authenticating (JEP-0013).
        let md = request.metadata();
        if self.exporter(md).await.is_err() {
            self.0.auth.authenticate(md, ObjectKind::Client).await?;
        }
        Ok(Response::new(GetServiceEndpointsResponse {
            telemetry_endpoints: crate::service::telemetry::telemetry_endpoints(&self.0),
        }))
    }

    async fn audit_stream(
        &self,
        _: Request<Streaming<AuditStreamRequest>>,
    ) -> Result<Response<()>, Status> {
        Err(Status::unimplemented("AuditStream is not implemented"))
    }

    async fn get_lease(
        &self,
        request: Request<GetLeaseRequest>,
    ) -> Result<Response<GetLeaseResponse>, Status> {
        let caller = self
            .0
            .auth
            .authenticate(request.metadata(), ObjectKind::Client)
            .await?;
        let name = request.into_inner().name;
        limits::check_len("name", &name, MAX_IDENTIFIER)?;
        let lease = get_lease(&self.0.store, &caller.namespace, &name).await?;
        if lease.access_of(&caller.name).is_none() {
            return Err(Status::unknown("GetLease permission denied"));
        }
        let selector = &lease.spec.selector;
        let exporter_uuid = match lease.assigned_exporter() {
            Some(e) => self
                .0
                .store
                .get::<Exporter>(&caller.namespace, e)
                .await
                .ok()
                .flatten()
                .and_then(|e| e.metadata.uid),
            None => None,
        };
        let st = lease.status.clone().unwrap_or_default();
        Ok(Response::new(GetLeaseResponse {
            duration: lease.spec.duration.map(Into::into),
            selector: Some(jumpstarter_proto::v1::LabelSelector {
                match_expressions: selector
                    .match_expressions
                    .iter()
                    .flatten()
                    .map(|r| jumpstarter_proto::v1::LabelSelectorRequirement {
                        key: r.key.clone(),
                        operator: r.operator.clone(),
                        values: r.values.clone().unwrap_or_default(),
                    })
                    .collect(),
                match_labels: selector
                    .match_labels
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .collect(),
            }),
            begin_time: st.begin_time.map(|t| timestamp_to_proto(t.0)),
            end_time: st.end_time.map(|t| timestamp_to_proto(t.0)),
            exporter_uuid,
            conditions: st.conditions.iter().map(condition_to_proto).collect(),
        }))
    }

    async fn request_lease(
        &self,
        request: Request<RequestLeaseRequest>,
    ) -> Result<Response<RequestLeaseResponse>, Status> {
        let caller = self
            .0
            .auth
            .authenticate(request.metadata(), ObjectKind::Client)
            .await?;
        let req = request.into_inner();
        let sel = req.selector.unwrap_or_default();
        limits::check_labels(
            "selector.match_labels",
            sel.match_labels.iter(),
            MAX_SELECTOR,
        )?;
        limits::check_count(
            "selector.match_expressions",
            sel.match_expressions.len(),
            limits::MAX_LABELS,
        )?;
        let mut parts: Vec<String> = sel
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        for r in &sel.match_expressions {
            let vals = r.values.join(",");
            parts.push(match r.operator.as_str() {
                "In" => format!("{} in ({vals})", r.key),
                "NotIn" => format!("{} notin ({vals})", r.key),
                "Exists" => r.key.clone(),
                "DoesNotExist" => format!("!{}", r.key),
                other => {
                    return Err(Status::invalid_argument(format!(
                        "unknown operator {other:?}"
                    )));
                }
            });
        }
        let selector = parts.join(",");
        limits::check_len("selector", &selector, MAX_SELECTOR)?;
        let lease = jumpstarter_proto::client_v1::Lease {
            selector,
            duration: req.duration,
            ..Default::default()
        };
        let name = uuid::Uuid::now_v7().to_string();
        let obj = crate::objects::lease_from_proto(
            &lease,
            &caller.namespace,
            &name,
            &caller.name,
            self.0.max_tags,
        )
        .map_err(|e| Status::unknown(e.to_string()))?;
        self.0.store.create(&obj).await.map_err(store_status)?;
        self.0.wake.notify_one();
        Ok(Response::new(RequestLeaseResponse { name }))
    }

    async fn release_lease(
        &self,
        request: Request<ReleaseLeaseRequest>,
    ) -> Result<Response<ReleaseLeaseResponse>, Status> {
        let md = request.metadata().clone();
        let (key, _) = conn_key(&request);
        let name = request.into_inner().name;
        limits::check_len("name", &name, MAX_IDENTIFIER)?;
        let kind = md
            .get("jumpstarter-kind")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let (caller, exporter_path) = if kind == "Exporter" {
            let caller = self.0.auth.authenticate(&md, ObjectKind::Exporter).await?;
            // Only the process holding the exporter online ends its lease.
            self.0
                .live_exporters
                .check(&caller.namespace, &caller.name, &key)?;
            (caller, true)
        } else {
            (
                self.0.auth.authenticate(&md, ObjectKind::Client).await?,
                false,
            )
        };
        mark_release(&self.0.store, &caller.namespace, &name, |l| {
            let allowed = if exporter_path {
                l.assigned_exporter() == Some(caller.name.as_str())
            } else {
                // Its owner or a client it is shared with.
                l.access_of(&caller.name).is_some()
            };
            if !allowed {
                return Err(Status::permission_denied("permission denied"));
            }
            Ok(true)
        })
        .await?;
        self.0.wake.notify_one();
        Ok(Response::new(ReleaseLeaseResponse {}))
    }

    async fn list_leases(
        &self,
        request: Request<ListLeasesRequest>,
    ) -> Result<Response<ListLeasesResponse>, Status> {
        let caller = self
            .0
            .auth
            .authenticate(request.metadata(), ObjectKind::Client)
            .await?;
        let selector = LabelSelector::parse(&format!("!{LEASE_ENDED_LABEL}"))
            .map_err(|e| Status::internal(e.to_string()))?;
        let list = self
            .0
            .store
            .list::<Lease>(Some(&caller.namespace), &selector, &ListParams::default())
            .await
            .map_err(store_status)?;
        let names = list
            .items
            .into_iter()
            .filter(|l| l.access_of(&caller.name).is_some())
            .filter_map(|l| l.metadata.name)
            .collect();
        Ok(Response::new(ListLeasesResponse { names }))
    }
}

/// Unregisters a Listen queue when its stream ends.
struct ListenGuard<S: Store> {
    state: Arc<ControllerState<S>>,
    namespace: String,
    lease: String,
    id: u64,
}

impl<S: Store> Drop for ListenGuard<S> {
    fn drop(&mut self) {
        self.state
            .listeners
            .unlisten(&self.namespace, &self.lease, self.id);
    }
}

/// Dial's refusal of an exporter whose `which` hook failed: upstream's text ("exporter
/// beforeLease hook failed"), with the exporter's own reason when it reported one (our
/// exporter's message starts with the same words and names the exit code or timeout).
fn hook_failed(which: &str, e: &Exporter) -> String {
    let base = format!("{which} hook failed");
    let message = e
        .status
        .as_ref()
        .map(|s| s.status_message.trim())
        .unwrap_or_default();
    if message.is_empty() {
        format!("exporter {base}")
    } else if message.starts_with(&base) {
        format!("exporter {message}")
    } else {
        format!("exporter {base}: {message}")
    }
}

/// Who is calling (see [`ConnKey`]), and from which TCP peer.
fn conn_key<T>(request: &Request<T>) -> (ConnKey, Option<std::net::SocketAddr>) {
    let peer = request
        .extensions()
        .get::<jumpstarter_core::server::listener::GuardedConnInfo>()
        .and_then(|i| i.peer)
        .or_else(|| request.remote_addr());
    (ConnKey::of(request.metadata(), peer), peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exporter `ex1` in a fresh embedded store, its state, and call metadata with its
    /// token.
    async fn exporter_lab() -> (
        tempfile::TempDir,
        Arc<ControllerState<crate::store::SqliteStore>>,
        tonic::metadata::MetadataMap,
    ) {
        use jumpstarter_core::auth::{KIND_KEY, NAME_KEY, NAMESPACE_KEY, Subject};
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(dir.path()).await.unwrap();
        let issuer = Arc::new(crate::auth::TokenIssuer::generate().unwrap());
        let (router_key, _) = jumpstarter_router::RouterTokenKey::generate().unwrap();
        let mut e = Exporter::new("ex1", Default::default());
        e.metadata.namespace = Some("default".into());
        let uid = store.create(&e).await.unwrap().metadata.uid.unwrap();
        let subject = Subject::new(ObjectKind::Exporter, "default", "ex1", &uid);
        let token = issuer.issue(&subject).unwrap().token;
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert("authorization", format!("Bearer {token}").parse().unwrap());
        md.insert(KIND_KEY, "Exporter".parse().unwrap());
        md.insert(NAMESPACE_KEY, "default".parse().unwrap());
        md.insert(NAME_KEY, "ex1".parse().unwrap());
        let state = ControllerState::new(store, issuer, router_key, vec![], "localhost:1".into());
        (dir, state, md)
    }

    #[tokio::test]
    async fn a_release_mark_is_set_once_on_a_live_lease_that_may_be_released() {
        use crate::store::SqliteStore;
        let (_dir, state, _) = exporter_lab().await;
        let store = &state.store;
        async fn create(store: &SqliteStore, name: &str) -> Lease {
            let mut l = Lease::new(name, Default::default());
            l.metadata.namespace = Some("default".into());
            store.create(&l).await.unwrap()
        }
        async fn mark(store: &SqliteStore, name: &str, may: bool) -> Result<Lease, Status> {
            mark_release(store, "default", name, move |_| Ok(may)).await
        }
        let rv = |l: &Lease| l.metadata.resource_version.clone();
        let created = create(store, "l1").await;
        // Refused, or not to be released: the lease is left as it is.
        let refused = mark_release(store, "default", "l1", |_| {
            Err(Status::permission_denied("permission denied"))
        })
        .await
        .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        let left = mark(store, "l1", false).await.unwrap();
        assert!(!left.spec.release);
        assert_eq!(rv(&left), rv(&created));
        // Marked once; marking again writes nothing.
        let marked = mark(store, "l1", true).await.unwrap();
        assert!(marked.spec.release);
        assert_eq!(rv(&mark(store, "l1", true).await.unwrap()), rv(&marked));
        // An ended lease is not marked.
        let mut ended = create(store, "l2").await;
        ended.status = Some(crate::objects::LeaseStatus {
            ended: true,
            ..Default::default()
        });
        let ended = store.update_status(&ended).await.unwrap();
        let after = mark(store, "l2", true).await.unwrap();
        assert!(!after.spec.release);
        assert_eq!(rv(&after), rv(&ended));
        // A lease that does not exist.
        let missing = mark(store, "nope", true).await.unwrap_err();
        assert_eq!(missing.code(), tonic::Code::NotFound);
    }

    #[tokio::test]
    async fn only_reports_that_can_change_a_grant_wake_the_scheduler() {
        use futures::FutureExt;
        let (_dir, state, md) = exporter_lab().await;
        let api = ControllerApi(state.clone());
        let cases: [(PbStatus, &str, Option<bool>, bool); 9] = [
            (PbStatus::Available, "", None, true),
            (PbStatus::BeforeLeaseHook, "", None, false),
            (PbStatus::LeaseReady, "", None, false),
            (PbStatus::AfterLeaseHook, "", None, false),
            (PbStatus::LeaseReady, "", Some(false), false),
            // The exporter asks for its lease to end.
            (PbStatus::LeaseReady, "", Some(true), true),
            // Quarantine, whatever the status.
            (
                PbStatus::LeaseReady,
                "[UNHEALTHY] healthCheck: disk full",
                None,
                true,
            ),
            (PbStatus::BeforeLeaseHookFailed, "", None, true),
            (PbStatus::Offline, "", None, true),
        ];
        // No permit left from before.
        let _ = state.wake.notified().now_or_never();
        for (status, message, release_lease, wakes) in cases {
            let mut request = Request::new(ReportStatusRequest {
                status: status as i32,
                message: Some(message.into()),
                release_lease,
            });
            *request.metadata_mut() = md.clone();
            api.report_status(request).await.unwrap();
            let woke = state.wake.notified().now_or_never().is_some();
            assert_eq!(
                woke, wakes,
                "{status:?} {message:?} release {release_lease:?}"
            );
        }
        // The reports were stored all the same.
        let e: Exporter = state.store.get("default", "ex1").await.unwrap().unwrap();
        assert_eq!(
            e.status.and_then(|s| s.exporter_status),
            Some(ExporterStatusValue::Offline)
        );
    }

    #[test]
    fn conflicting_writes_wait_longer_each_time_and_long_enough_in_all() {
        // Each wait grows (up to its cap) and stays within 50-100% of its nominal length.
        for attempt in 0..10 {
            let nominal = Duration::from_millis(1 << attempt.min(6));
            assert_eq!(conflict_delay(attempt, 0.0), nominal / 2);
            assert!(conflict_delay(attempt, 0.999) < nominal);
        }
        // Even at the shortest, the tries of one call span a few hundred milliseconds: a
        // busy writer of the same object (a batch waiting for its disk sync on a loaded
        // machine) gets out of the way, where 16 tries in a row took a few milliseconds.
        let shortest: Duration = (0..CONFLICT_TRIES - 1)
            .map(|a| conflict_delay(a, 0.0))
            .sum();
        assert!(shortest >= Duration::from_millis(300), "{shortest:?}");
        assert!(
            (0..CONFLICT_TRIES - 1)
                .map(|a| conflict_delay(a, 0.999))
                .sum::<Duration>()
                < Duration::from_secs(1)
        );
    }
}
