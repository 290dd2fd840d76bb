//! `jumpstarter.ext.v1.ClientExtensionService` (ours, not upstream's): what `jmp describe
//! exporter` needs beyond the client API, without adding fields to upstream's messages.

use std::sync::Arc;

use jumpstarter_core::auth::ObjectKind;
use jumpstarter_proto::ext_v1::{
    Device as PbDevice, ExporterDevices, GetExporterDevicesRequest, GetLeaseLogsRequest, LeaseLogs,
    client_extension_service_server::ClientExtensionService,
};
use tonic::{Request, Response, Status};

use crate::{
    objects::{Exporter, Lease, sharing::LeaseAccess},
    service::{
        client::{check_namespace, object_name},
        limits::{self, MAX_IDENTIFIER},
    },
    state::{ControllerState, store_status},
    store::Store,
};

/// The ClientExtensionService implementation.
pub struct ClientExtApi<S: Store>(pub Arc<ControllerState<S>>);

/// The devices of an exporter as the extension API shows them.
pub fn exporter_devices(e: &Exporter, name: String) -> ExporterDevices {
    let devices = e.status.as_ref().and_then(|s| s.devices.as_ref());
    ExporterDevices {
        name,
        registered: devices.is_some(),
        devices: devices
            .into_iter()
            .flatten()
            .map(|d| PbDevice {
                uuid: d.uuid.clone(),
                parent_uuid: d.parent_uuid.clone().unwrap_or_default(),
                labels: d.labels.clone().into_iter().collect(),
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl<S: Store> ClientExtensionService for ClientExtApi<S> {
    async fn get_exporter_devices(
        &self,
        request: Request<GetExporterDevicesRequest>,
    ) -> Result<Response<ExporterDevices>, Status> {
        let caller = self
            .0
            .auth
            .authenticate(request.metadata(), ObjectKind::Client)
            .await?;
        let req = request.into_inner();
        limits::check_len("name", &req.name, MAX_IDENTIFIER)?;
        let (ns, name) = object_name(&req.name, "exporters")?;
        check_namespace(&caller, ns)?;
        let e: Exporter = self
            .0
            .store
            .get(ns, name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("exporter {name} not found")))?;
        Ok(Response::new(exporter_devices(&e, req.name)))
    }

    async fn get_lease_logs(
        &self,
        request: Request<GetLeaseLogsRequest>,
    ) -> Result<Response<LeaseLogs>, Status> {
        let caller = self
            .0
            .auth
            .authenticate(request.metadata(), ObjectKind::Client)
            .await?;
        let req = request.into_inner();
        limits::check_len("name", &req.name, MAX_IDENTIFIER)?;
        let (ns, name) = object_name(&req.name, "leases")?;
        check_namespace(&caller, ns)?;
        let lease: Option<Lease> = self.0.store.get(ns, name).await.map_err(store_status)?;
        // Its holder and the clients it is shared with; not revealing another's lease. The
        // console transcripts only to its holder: what was typed on a console (passwords
        // among it) is not the business of a client that was only let watch.
        let access = lease.and_then(|l| l.access_of(&caller.name));
        let allowed = match access {
            Some(LeaseAccess::Owner) => true,
            Some(LeaseAccess::Shared) => !req.console,
            None => false,
        };
        if !allowed {
            return Err(Status::not_found(format!("lease {name} not found")));
        }
        let part = if req.console {
            crate::lease_logs::Part::Console
        } else {
            crate::lease_logs::Part::Story
        };
        lease_logs(&self.0, ns, name, req.name.clone(), part)
    }
}

/// The gathered log of lease `ns/name`, `part` of it (FAILED_PRECONDITION when logs are not
/// gathered).
pub fn lease_logs<S: Store>(
    state: &ControllerState<S>,
    ns: &str,
    name: &str,
    full_name: String,
    part: crate::lease_logs::Part,
) -> Result<Response<LeaseLogs>, Status> {
    let Some(logs) = &state.lease_logs else {
        return Err(Status::failed_precondition(
            "this controller gathers no lease logs (it runs with --lease-logs off)",
        ));
    };
    let story = logs.read_part(ns, name, part);
    Ok(Response::new(LeaseLogs {
        name: full_name,
        entries: story.entries,
        dropped: story.dropped,
    }))
}
