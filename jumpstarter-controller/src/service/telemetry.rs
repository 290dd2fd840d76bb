//! The controller as the sink of upstream main's `TelemetryService` (JEP-0013): exporters
//! push their leases' entries (driver calls, driver log lines) with `PushLogs`,
//! authenticated as for the other exporter calls, and the controller keeps them per lease
//! ([`crate::lease_logs`]) for `jmp get lease NAME --logs`. Ours too: entries without a
//! lease that are runs of the exporter's health check (`stream=health`), each kept as a
//! health event of the pushing exporter ([`crate::hook_history`]) for its dashboard page,
//! not with any lease's entries.

use std::{collections::HashMap, sync::Arc};

use jumpstarter_core::auth::ObjectKind;
use jumpstarter_proto::v1::{
    LogEntry, PushLogsRequest, PushLogsResponse, TelemetryEndpoint,
    telemetry_service_server::TelemetryService,
};
use tonic::{Request, Response, Status};

use crate::{
    hook_history,
    lease_logs::check_batch,
    objects::Lease,
    state::{ControllerState, store_status},
    store::Store,
};

/// `TelemetryService` over the controller's state.
pub struct TelemetryApi<S: Store>(pub Arc<ControllerState<S>>);

/// What `GetServiceEndpoints` answers: the controller itself when it gathers logs (its
/// certificate is the one the caller already trusts, so none is sent), else nothing.
pub fn telemetry_endpoints<S: Store>(state: &ControllerState<S>) -> Vec<TelemetryEndpoint> {
    if state.lease_logs.is_none() {
        return Vec::new();
    }
    vec![TelemetryEndpoint {
        endpoint: state.endpoint.clone(),
        certificate: String::new(),
        min_severity: String::new(),
    }]
}

#[tonic::async_trait]
impl<S: Store> TelemetryService for TelemetryApi<S> {
    async fn push_logs(
        &self,
        request: Request<PushLogsRequest>,
    ) -> Result<Response<PushLogsResponse>, Status> {
        let caller = self
            .0
            .auth
            .authenticate(request.metadata(), ObjectKind::Exporter)
            .await?;
        let Some(logs) = &self.0.lease_logs else {
            return Err(Status::unavailable(
                "this controller gathers no logs (--lease-logs off)",
            ));
        };
        let mut entries = request.into_inner().entries;
        check_batch(&entries).map_err(Status::invalid_argument)?;
        // Every entry must be the pushing exporter's, and every lease named one it serves
        // (or served); the only entries without a lease (`check_batch`) are its health
        // checks' runs. Checked for the whole batch before anything is kept.
        let mut clients: HashMap<String, String> = HashMap::new();
        for e in &entries {
            if !e.exporter.is_empty() && e.exporter != caller.name {
                return Err(Status::permission_denied(format!(
                    "entry for exporter {:?} pushed by exporter {:?}",
                    e.exporter, caller.name
                )));
            }
            if !e.namespace.is_empty() && e.namespace != caller.namespace {
                return Err(Status::permission_denied(format!(
                    "entry for namespace {:?} pushed by an exporter of {:?}",
                    e.namespace, caller.namespace
                )));
            }
            if hook_history::is_health_check(e) || clients.contains_key(&e.lease) {
                continue;
            }
            let lease: Option<Lease> = self
                .0
                .store
                .get(&caller.namespace, &e.lease)
                .await
                .map_err(store_status)?;
            match lease {
                Some(l) if l.assigned_exporter() == Some(caller.name.as_str()) => {
                    clients.insert(e.lease.clone(), l.spec.client_ref.name.clone());
                }
                _ => {
                    return Err(Status::permission_denied(format!(
                        "lease {:?} is not held by exporter {:?}",
                        e.lease, caller.name
                    )));
                }
            }
        }
        // Names come from the authenticated identity and the lease, never from the entry.
        let mut by_lease: HashMap<String, Vec<LogEntry>> = HashMap::new();
        let mut checks = 0u32;
        let now = jiff::Timestamp::now();
        for mut e in entries.drain(..) {
            if hook_history::is_health_check(&e) {
                let ev = hook_history::health_check_event(&e, now);
                self.0
                    .hook_history
                    .health(&caller.namespace, &caller.name, ev);
                checks = checks.saturating_add(1);
                continue;
            }
            e.exporter = caller.name.clone();
            e.namespace = caller.namespace.clone();
            if let Some(client) = clients.get(&e.lease) {
                e.client = client.clone();
            }
            if e.component.is_empty() {
                e.component = "exporter".into();
            }
            by_lease.entry(e.lease.clone()).or_default().push(e);
        }
        // Hook output shows on the dashboard's exporter page: tell it.
        let hook_output = by_lease
            .values()
            .flatten()
            .any(hook_history::is_any_hook_output);
        let (mut accepted, mut dropped) = (checks, 0u32);
        for (lease, entries) in by_lease {
            let (a, d) = logs.append(&caller.namespace, &lease, entries);
            accepted = accepted.saturating_add(a);
            dropped = dropped.saturating_add(d);
        }
        if hook_output {
            self.0.hook_history.touch();
        }
        Ok(Response::new(PushLogsResponse { accepted, dropped }))
    }
}
