//! `jumpstarter.client.v1.ClientService`: exporters and leases as a client sees them.
//!
//! Unlike upstream 0.9.0, a client reads and lists only its own leases and those shared with
//! it (`spec.sharedWith`); who may do what is [`crate::objects::sharing`]'s rules.

use std::sync::Arc;

use jiff::Timestamp;
use jumpstarter_core::auth::ObjectKind;
use jumpstarter_proto::client_v1::{
    CreateLeaseRequest, DeleteLeaseRequest, Exporter as PbExporter, GetExporterRequest,
    GetLeaseRequest, Lease as PbLease, ListExportersRequest, ListExportersResponse,
    ListLeasesRequest, ListLeasesResponse, RotateTokenRequest, RotateTokenResponse,
    UpdateLeaseRequest, client_service_server::ClientService,
};
use tonic::{Request, Response, Status};

use crate::{
    lease::update::{AccessView, LeaseChange, apply_change},
    objects::{
        Client, Exporter, LEASE_ENDED_LABEL, Lease, TAG_LABEL_PREFIX, exporter_to_proto,
        lease_from_proto, lease_times_from_proto, lease_to_proto,
        selector::{LabelSelector, validate_dns1123_subdomain},
        sharing::{self, LeaseAccess},
    },
    service::{
        controller::update_lease,
        limits::{self, MAX_IDENTIFIER, MAX_LABEL_TEXT, MAX_NAME, MAX_SELECTOR, MAX_TEXT},
    },
    state::{Caller, ControllerState, store_status},
    store::{ListParams, Store},
};

/// The ClientService implementation.
pub struct ClientApi<S: Store>(pub Arc<ControllerState<S>>);

/// Splits `namespaces/<ns>` (parent) or `namespaces/<ns>/<kind>/<name>` with upstream's
/// error text.
fn parse_name(name: &str, segments: usize) -> Result<Vec<&str>, Status> {
    let parts: Vec<&str> = name.split('/').collect();
    if parts.len() != segments * 2 {
        return Err(Status::invalid_argument(format!(
            "invalid number of segments in identifier \"{name}\", expecting {}, got {}",
            segments * 2,
            parts.len()
        )));
    }
    Ok(parts)
}

pub(super) fn check_namespace(caller: &Caller, ns: &str) -> Result<(), Status> {
    if caller.namespace != ns {
        return Err(Status::permission_denied("namespace mismatch"));
    }
    Ok(())
}

pub(super) fn object_name<'a>(name: &'a str, kind: &str) -> Result<(&'a str, &'a str), Status> {
    let parts = parse_name(name, 2)?;
    if parts[0] != "namespaces" || parts[2] != kind || parts[1].is_empty() || parts[3].is_empty() {
        return Err(Status::invalid_argument(format!(
            "invalid identifier \"{name}\", expecting namespaces/<namespace>/{kind}/<name>"
        )));
    }
    Ok((parts[1], parts[3]))
}

fn parent_namespace(parent: &str) -> Result<&str, Status> {
    let parts = parse_name(parent, 1)?;
    if parts[0] != "namespaces" || parts[1].is_empty() {
        return Err(Status::invalid_argument(format!(
            "invalid parent \"{parent}\", expecting namespaces/<namespace>"
        )));
    }
    Ok(parts[1])
}

fn selector(s: &str) -> Result<LabelSelector, Status> {
    LabelSelector::parse(s).map_err(|e| Status::invalid_argument(format!("invalid selector: {e}")))
}

/// The size limits of a lease message from a client ([`crate::service::limits`]).
fn check_lease_limits(pb: &PbLease) -> Result<(), Status> {
    limits::check_len("lease.name", &pb.name, MAX_IDENTIFIER)?;
    limits::check_len("lease.selector", &pb.selector, MAX_SELECTOR)?;
    for (field, v) in [
        ("lease.client", &pb.client),
        ("lease.exporter", &pb.exporter),
        ("lease.exporter_name", &pb.exporter_name),
    ] {
        limits::check_len(field, v.as_deref().unwrap_or_default(), MAX_IDENTIFIER)?;
    }
    limits::check_labels("lease.tags", pb.tags.iter(), MAX_LABEL_TEXT)?;
    limits::check_labels("lease.context", pb.context.iter(), MAX_LABEL_TEXT)?;
    limits::check_labels(
        "lease.deprecated_labels",
        pb.deprecated_labels.iter(),
        MAX_LABEL_TEXT,
    )?;
    limits::check_count("lease.conditions", pb.conditions.len(), limits::MAX_LABELS)?;
    check_names_limits("lease.shared_with", &pb.shared_with)
}

/// The size limits of a list of client names (shared_with and its changes).
fn check_names_limits(field: &str, names: &[String]) -> Result<(), Status> {
    limits::check_count(field, names.len(), limits::MAX_LABELS)?;
    for n in names {
        limits::check_len(field, n, MAX_IDENTIFIER)?;
    }
    Ok(())
}

fn sharing_status(e: sharing::SharingError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The size limits of a list request's parent, filter and page token.
fn check_list_limits(parent: &str, filter: &str, page_token: &str) -> Result<(), Status> {
    limits::check_len("parent", parent, MAX_IDENTIFIER)?;
    limits::check_len("filter", filter, MAX_SELECTOR)?;
    limits::check_len("page_token", page_token, MAX_TEXT)
}

fn page(size: i32, token: &str) -> ListParams {
    ListParams {
        limit: usize::try_from(size).ok().filter(|s| *s > 0),
        continue_token: (!token.is_empty()).then(|| token.to_string()),
    }
}

impl<S: Store> ClientApi<S> {
    /// A lease as the client API returns it: with the deprecated labels its selector uses
    /// (`deprecatedLabels.keys`), as upstream main.
    fn lease_out(&self, lease: &Lease, now: Timestamp) -> PbLease {
        let mut pb = lease_to_proto(lease, now);
        self.0.label_policy.annotate_lease(&mut pb);
        pb
    }

    async fn client(&self, md: &tonic::metadata::MetadataMap) -> Result<Caller, Status> {
        self.0.auth.authenticate(md, ObjectKind::Client).await
    }

    /// Refuses (INVALID_ARGUMENT) a client of `names` that does not exist in `ns`.
    async fn check_clients_exist(&self, ns: &str, names: &[String]) -> Result<(), Status> {
        for n in names {
            if self
                .0
                .store
                .get::<Client>(ns, n)
                .await
                .map_err(store_status)?
                .is_none()
            {
                return Err(Status::invalid_argument(format!(
                    "cannot share the lease with {n:?}: there is no client {n:?} in namespace {ns:?}"
                )));
            }
        }
        Ok(())
    }

    /// The lease `name` and how the caller stands to it; NOT_FOUND when the caller is neither
    /// its owner nor a client it is shared with (not revealing that it exists).
    async fn accessible_lease(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<(Lease, LeaseAccess), Status> {
        let (ns, lease_name) = object_name(name, "leases")?;
        check_namespace(caller, ns)?;
        let lease: Lease = self
            .0
            .store
            .get(ns, lease_name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("lease {lease_name} not found")))?;
        match lease.access_of(&caller.name) {
            Some(access) => Ok((lease, access)),
            // Not revealing whether another client's lease exists.
            None => Err(Status::not_found(format!("lease {lease_name} not found"))),
        }
    }
}

#[tonic::async_trait]
impl<S: Store> ClientService for ClientApi<S> {
    async fn get_exporter(
        &self,
        request: Request<GetExporterRequest>,
    ) -> Result<Response<PbExporter>, Status> {
        let caller = self.client(request.metadata()).await?;
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
        let mut pb = exporter_to_proto(&e);
        self.0.label_policy.apply(&mut pb, req.show_hidden_labels);
        Ok(Response::new(pb))
    }

    async fn list_exporters(
        &self,
        request: Request<ListExportersRequest>,
    ) -> Result<Response<ListExportersResponse>, Status> {
        let caller = self.client(request.metadata()).await?;
        let req = request.into_inner();
        check_list_limits(&req.parent, &req.filter, &req.page_token)?;
        let ns = parent_namespace(&req.parent)?;
        check_namespace(&caller, ns)?;
        let list = self
            .0
            .store
            .list::<Exporter>(
                Some(ns),
                &selector(&req.filter)?,
                &page(req.page_size, &req.page_token),
            )
            .await
            .map_err(store_status)?;
        let policy = &self.0.label_policy;
        Ok(Response::new(ListExportersResponse {
            exporters: list
                .items
                .iter()
                .map(|e| {
                    let mut pb = exporter_to_proto(e);
                    policy.apply(&mut pb, req.show_hidden_labels);
                    pb
                })
                .collect(),
            next_page_token: list.continue_token.unwrap_or_default(),
        }))
    }

    async fn get_lease(
        &self,
        request: Request<GetLeaseRequest>,
    ) -> Result<Response<PbLease>, Status> {
        let caller = self.client(request.metadata()).await?;
        let name = request.into_inner().name;
        limits::check_len("name", &name, MAX_IDENTIFIER)?;
        let (lease, _) = self.accessible_lease(&caller, &name).await?;
        Ok(Response::new(self.lease_out(&lease, Timestamp::now())))
    }

    async fn list_leases(
        &self,
        request: Request<ListLeasesRequest>,
    ) -> Result<Response<ListLeasesResponse>, Status> {
        let caller = self.client(request.metadata()).await?;
        let req = request.into_inner();
        check_list_limits(&req.parent, &req.filter, &req.page_token)?;
        limits::check_len("tag_filter", &req.tag_filter, MAX_SELECTOR)?;
        let ns = parent_namespace(&req.parent)?;
        check_namespace(&caller, ns)?;
        let mut parts: Vec<String> = Vec::new();
        if !req.filter.trim().is_empty() {
            selector(&req.filter)?;
            parts.push(req.filter.clone());
        }
        if !req.tag_filter.trim().is_empty() {
            let tags = selector(&req.tag_filter)?;
            for r in tags.requirements() {
                let mut text = selector(&r.to_string())?.to_string();
                text = text.replacen(&r.key, &format!("{TAG_LABEL_PREFIX}{}", r.key), 1);
                parts.push(text);
            }
        }
        if req.only_active.unwrap_or(true) {
            parts.push(format!("!{LEASE_ENDED_LABEL}"));
        }
        let sel = selector(&parts.join(","))?;
        let list = self
            .0
            .store
            .list::<Lease>(Some(ns), &sel, &page(req.page_size, &req.page_token))
            .await
            .map_err(store_status)?;
        let now = Timestamp::now();
        Ok(Response::new(ListLeasesResponse {
            leases: list
                .items
                .iter()
                .filter(|l| l.access_of(&caller.name).is_some())
                .map(|l| self.lease_out(l, now))
                .collect(),
            next_page_token: list.continue_token.unwrap_or_default(),
        }))
    }

    async fn create_lease(
        &self,
        request: Request<CreateLeaseRequest>,
    ) -> Result<Response<PbLease>, Status> {
        let caller = self.client(request.metadata()).await?;
        let req = request.into_inner();
        limits::check_len("parent", &req.parent, MAX_IDENTIFIER)?;
        limits::check_len("lease_id", &req.lease_id, MAX_NAME)?;
        if let Some(pb) = &req.lease {
            check_lease_limits(pb)?;
        }
        let ns = parent_namespace(&req.parent)?;
        check_namespace(&caller, ns)?;
        let pb = req
            .lease
            .ok_or_else(|| Status::invalid_argument("lease is required"))?;
        let name = if req.lease_id.is_empty() {
            uuid::Uuid::now_v7().to_string()
        } else {
            // The lease's object name: refused here, not by the store (which said INTERNAL).
            validate_dns1123_subdomain(&req.lease_id).map_err(|e| {
                Status::invalid_argument(format!("lease_id {:?}: {e}", req.lease_id))
            })?;
            req.lease_id.clone()
        };
        let shared_with =
            sharing::shared_names(&pb.shared_with, ns, &caller.name).map_err(sharing_status)?;
        self.check_clients_exist(ns, &shared_with).await?;
        let mut lease =
            lease_from_proto(&pb, ns, &name, &caller.name, self.0.max_tags).map_err(|e| {
                use crate::objects::ObjectError;
                match e {
                    ObjectError::SelectorOrExporterRequired | ObjectError::InvalidTags(_) => {
                        Status::invalid_argument(e.to_string())
                    }
                    other => Status::invalid_argument(other.to_string()),
                }
            })?;
        lease.spec.shared_with = shared_with;
        let traced = jumpstarter_core::telemetry::lease_step(
            jumpstarter_core::telemetry::Step::Create,
            &jumpstarter_core::telemetry::LeaseRef {
                namespace: ns,
                name: &name,
                client: &caller.name,
                exporter: "",
            },
        );
        let created = self.0.store.create(&lease).await;
        jumpstarter_core::telemetry::record_result(&traced, &created);
        drop(traced);
        let created = created.map_err(store_status)?;
        {
            let _context = crate::lease_logs::context_span(&created.spec.context).entered();
            let lease_id = created.metadata.name.as_deref().unwrap_or("");
            tracing::info!(
                lease_id,
                namespace = %caller.namespace,
                client = %caller.name,
                "lease created"
            );
            if let Some(logs) = &self.0.lease_logs {
                let facts = crate::lease_logs::LeaseFacts {
                    namespace: &caller.namespace,
                    name: lease_id,
                    client: &caller.name,
                    exporter: "",
                    context: &created.spec.context,
                };
                logs.event(&facts, "lease created", &[]);
            }
        }
        // Answer once the scheduler has looked at the lease: granted at once, it goes back
        // ready, and the client need not poll for the grant (a client that polls anyway, as
        // upstream's does, finds the same). A loop that does not get to it in time (busy,
        // or not running here) leaves the answer as it was stored.
        // The pass hands over the leases it wrote: a lease granted (or left waiting) by it
        // is answered from there, without reading it back.
        let pass = self.0.passes.after_now();
        self.0.wake.notify_one();
        let mut out = created;
        if let Some(written) = self
            .0
            .passes
            .wait_written(pass, crate::lease::passes::GRANT_WAIT)
            .await
        {
            let name = out.metadata.name.clone().unwrap_or(name);
            if let Some(l) = written.get(&(ns.to_string(), name.clone())) {
                out = l.clone();
            } else if let Ok(Some(now)) = self.0.store.get::<Lease>(ns, &name).await {
                // Not written by the last pass (which may be a later one): as stored.
                out = now;
            }
        }
        Ok(Response::new(self.lease_out(&out, Timestamp::now())))
    }

    async fn update_lease(
        &self,
        request: Request<UpdateLeaseRequest>,
    ) -> Result<Response<PbLease>, Status> {
        let caller = self.client(request.metadata()).await?;
        let req = request.into_inner();
        let pb = req
            .lease
            .ok_or_else(|| Status::invalid_argument("lease is required"))?;
        check_lease_limits(&pb)?;
        check_names_limits("add_shared_with", &req.add_shared_with)?;
        check_names_limits("remove_shared_with", &req.remove_shared_with)?;
        let (current, access) = self.accessible_lease(&caller, &pb.name).await?;
        let (ns, name) = object_name(&pb.name, "leases")?;
        // Immutable once set: an update that names a context must name the same one.
        let context: std::collections::BTreeMap<String, String> =
            pb.context.clone().into_iter().collect();
        if !context.is_empty() && context != current.spec.context {
            return Err(Status::invalid_argument(format!(
                "lease {name}: its context is immutable once set (it is {:?})",
                current.spec.context
            )));
        }
        let owner = current.spec.client_ref.name.clone();
        let sharing_change = !req.add_shared_with.is_empty() || !req.remove_shared_with.is_empty();
        if (sharing_change || pb.client.as_ref().is_some_and(|c| !c.is_empty()))
            && !access.may_manage()
        {
            return Err(Status::permission_denied(format!(
                "only the lease's owner (client {owner:?}) may transfer lease {name} or change whom it is shared with"
            )));
        }
        let add =
            sharing::shared_names(&req.add_shared_with, ns, &owner).map_err(sharing_status)?;
        let remove =
            sharing::shared_names(&req.remove_shared_with, ns, &owner).map_err(sharing_status)?;
        self.check_clients_exist(ns, &add).await?;
        let times_given = pb.begin_time.is_some() || pb.duration.is_some() || pb.end_time.is_some();
        let times = if times_given {
            Some(lease_times_from_proto(&pb).map_err(|e| Status::invalid_argument(e.to_string()))?)
        } else {
            None
        };
        let new_client = match &pb.client {
            Some(c) if !c.is_empty() => {
                let (cns, cname) = object_name(c, "clients")?;
                if cns != ns {
                    return Err(Status::invalid_argument(
                        "a lease can only be transferred within its namespace",
                    ));
                }
                if self
                    .0
                    .store
                    .get::<Client>(cns, cname)
                    .await
                    .map_err(store_status)?
                    .is_none()
                {
                    return Err(Status::not_found(format!("client {cname} not found")));
                }
                Some(cname.to_string())
            }
            _ => None,
        };
        let change = LeaseChange { times, new_client };
        let view = AccessView::load(&self.0.store, ns).await?;
        let updated = update_lease(&self.0.store, ns, name, |l| {
            // Re-checked on every read: the lease may have been transferred or unshared since.
            let Some(access) = l.access_of(&caller.name) else {
                return Err(Status::not_found(format!("lease {name} not found")));
            };
            if l.spec.client_ref.name != owner {
                // Transferred meanwhile: a change meant for the old owner's lease stops.
                return Err(Status::aborted(format!(
                    "lease {name} was transferred meanwhile; try again"
                )));
            }
            let mut changed = false;
            if sharing_change {
                if !access.may_manage() {
                    return Err(Status::permission_denied(format!(
                        "only the lease's owner may change whom lease {name} is shared with"
                    )));
                }
                let next = sharing::apply_share_changes(&l.spec.shared_with, &add, &remove)
                    .map_err(sharing_status)?;
                if next != l.spec.shared_with {
                    l.spec.shared_with = next;
                    changed = true;
                }
            }
            Ok(apply_change(l, &change, &view)? || changed)
        })
        .await?;
        if change.new_client.is_some() {
            self.0.forget_lease_client(ns, name);
        }
        self.0.wake.notify_one();
        Ok(Response::new(self.lease_out(&updated, Timestamp::now())))
    }

    async fn delete_lease(
        &self,
        request: Request<DeleteLeaseRequest>,
    ) -> Result<Response<()>, Status> {
        let caller = self.client(request.metadata()).await?;
        let name = request.into_inner().name;
        limits::check_len("name", &name, MAX_IDENTIFIER)?;
        let (lease, _) = self.accessible_lease(&caller, &name).await?;
        let (ns, lease_name) = object_name(&name, "leases")?;
        if lease.spec.release {
            return Err(Status::failed_precondition(format!(
                "lease \"{lease_name}\" has already been released"
            )));
        }
        super::controller::release_lease(&self.0, ns, lease_name).await?;
        Ok(Response::new(()))
    }

    async fn rotate_token(
        &self,
        request: Request<RotateTokenRequest>,
    ) -> Result<Response<RotateTokenResponse>, Status> {
        let caller = self.client(request.metadata()).await?;
        let req = request.into_inner();
        limits::check_len("parent", &req.parent, MAX_IDENTIFIER)?;
        let ns = parent_namespace(&req.parent)?;
        check_namespace(&caller, ns)?;
        let subject = jumpstarter_core::auth::Subject::new(
            ObjectKind::Client,
            caller.namespace.clone(),
            caller.name.clone(),
            caller.uid.clone(),
        );
        let issued = self
            .0
            .auth
            .issuer
            .issue(&subject)
            .map_err(|e| Status::internal(e.to_string()))?;
        if let Err(e) = crate::service::token_expiry::record(
            &self.0.store,
            &caller.namespace,
            &caller.name,
            issued.expires_at,
        )
        .await
        {
            tracing::warn!(
                "client {}/{}: cannot record its token's expiry: {e}",
                caller.namespace,
                caller.name
            );
        }
        Ok(Response::new(RotateTokenResponse {
            token: issued.token,
            expiry: Some(prost_types::Timestamp::from(issued.expires_at)),
        }))
    }
}
