//! `jumpstarter.admin.v1.AdminService` (ours, not upstream): clients, exporters and access
//! policies managed over gRPC, for controllers that do not run on Kubernetes.
//!
//! Every RPC needs `authorization: Bearer <admin token>` (the secret in the data directory,
//! see [`crate::auth::admin_token`]). A client or exporter token is refused with
//! PERMISSION_DENIED; anything else with UNAUTHENTICATED.
//!
//! Names follow Kubernetes: object names are DNS-1123 subdomains, namespaces DNS-1123 labels,
//! label keys qualified names and label values label values. An empty namespace means
//! `default` (in a [`ListRequest`], all namespaces). Bad input is INVALID_ARGUMENT and changes
//! nothing.

use std::{collections::BTreeMap, sync::Arc};

use jumpstarter_core::auth::{ObjectKind, Subject, bearer_token};
use jumpstarter_proto::admin_v1::{
    AccessPolicy, AccessRule, ApplyRequest, ApplyResponse, ApplyResult, Client as PbClient,
    CreateClientRequest, CreateClientResponse, CreateExporterRequest, CreateExporterResponse,
    Credentials, Device as PbDevice, Exporter as PbExporter, ExporterSet as PbExporterSet,
    ListAccessPoliciesResponse, ListClientsResponse, ListExporterSetsResponse,
    ListExportersResponse, ListRequest, ListVirtualTargetClassesResponse, ObjectRef,
    VirtualTargetClass as PbClass, admin_service_server::AdminService,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use tonic::{Request, Response, Status, metadata::MetadataMap};

use crate::{
    auth::admin_token::AdminToken,
    objects::virtualtarget::{ExporterSet, VirtualTargetClass},
    objects::{
        Client, ClientSpec, Exporter, ExporterAccessPolicy, ExporterAccessPolicySpec, ExporterSpec,
        Lease, Policy, PolicyFrom, RESERVED_LABEL_PREFIX, conditions,
        duration::GoDuration,
        exporter_status_to_proto, find_condition,
        selector::{LabelSelector, validate_dns1123_subdomain},
        timestamp_to_proto,
    },
    service::{
        admin_apply::{Desired, parse_documents},
        admin_pools::{class_to_admin, exporter_set_to_admin},
        controller::{release_lease, update_exporter},
        limits::{self, MAX_LABELS, MAX_RULES, MAX_SELECTOR, MAX_TEXT},
    },
    state::{ControllerState, store_status},
    store::{ListParams, Store, StoreError, StoreObject},
};

/// Annotations under this prefix are written by the pool engine (a replica being retired):
/// `Apply` keeps them when the document does not name them, as it keeps system labels.
pub const SYSTEM_ANNOTATION_PREFIX: &str = "virtualtarget.jumpstarter.dev/";

pub use super::admin_checks::DEFAULT_NAMESPACE;
pub(crate) use super::admin_checks::{created, label_problem, validate_namespace};

/// The AdminService implementation.
pub struct AdminApi<S: Store> {
    state: Arc<ControllerState<S>>,
    token: AdminToken,
    ca_pem: String,
    credential_secrets: bool,
}

impl<S: Store> AdminApi<S> {
    /// The service over `state`, accepting `token`; `ca_pem` (may be empty) goes into the
    /// credentials it hands out.
    pub fn new(state: Arc<ControllerState<S>>, token: AdminToken, ca_pem: String) -> Self {
        Self {
            state,
            token,
            ca_pem,
            credential_secrets: false,
        }
    }

    /// With `on`, every token handed out is also kept in the owner's credential Secret
    /// (`<name>-client` / `<name>-exporter`, key `token`), where upstream's `jmp admin
    /// create` and in-cluster jobs read it.
    pub fn with_credential_secrets(mut self, on: bool) -> Self {
        self.credential_secrets = on;
        self
    }

    /// Keeps `token` in `owner`'s credential Secret when [`Self::with_credential_secrets`]
    /// is on.
    async fn keep_credential<K: StoreObject>(&self, owner: &K, token: &str) -> Result<(), Status> {
        keep_credential(&self.state, owner, token, self.credential_secrets).await
    }

    /// Issues the credentials of a just-created client or exporter and keeps the token in its
    /// credential Secret when that is on: what CreateClient, CreateExporter and Apply do.
    async fn issue_for_new<K: StoreObject>(
        &self,
        kind: ObjectKind,
        stored: &K,
    ) -> Result<Credentials, Status> {
        let meta = stored.meta();
        let credentials = self
            .credentials(
                kind,
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default(),
                meta.uid.clone(),
            )
            .await?;
        self.keep_credential(stored, &credentials.token).await?;
        Ok(credentials)
    }

    /// Creates `desired`, or updates the stored object of its name to its spec, labels and
    /// annotations (keeping the stored labels `keep` selects and the annotations under
    /// [`SYSTEM_ANNOTATION_PREFIX`], which are the system's);
    /// `created`, `configured` or `unchanged` and the object as stored. A write that meets
    /// another one (the pool engine writing a set's status) is tried again, a few times.
    async fn apply_object<K: StoreObject>(
        &self,
        desired: &K,
        keep: impl Fn(&str) -> bool,
    ) -> Result<(&'static str, K), Status> {
        const TRIES: usize = 5;
        for _ in 1..TRIES {
            match self.apply_object_once(desired, &keep).await {
                Err(ApplyError::Conflict) => continue,
                Err(ApplyError::Status(s)) => return Err(s),
                Ok(done) => return Ok(done),
            }
        }
        self.apply_object_once(desired, &keep)
            .await
            .map_err(|e| match e {
                ApplyError::Conflict => Status::aborted(
                    "it kept changing while being applied (other writers); try again",
                ),
                ApplyError::Status(s) => s,
            })
    }

    async fn apply_object_once<K: StoreObject>(
        &self,
        desired: &K,
        keep: &impl Fn(&str) -> bool,
    ) -> Result<(&'static str, K), ApplyError> {
        let meta = desired.meta();
        let ns = meta.namespace.as_deref().unwrap_or_default();
        let name = meta.name.as_deref().unwrap_or_default();
        let old = self
            .state
            .store
            .get::<K>(ns, name)
            .await
            .map_err(store_status)?;
        let Some(old) = old else {
            return match self.state.store.create(desired).await {
                Ok(stored) => Ok(("created", stored)),
                Err(StoreError::AlreadyExists { .. }) => Err(ApplyError::Conflict),
                Err(e) => Err(store_status(e).into()),
            };
        };
        let json = |o: &K| {
            serde_json::to_value(o).map_err(|e| {
                Status::internal(format!(
                    "{} {ns}/{name}: cannot encode it: {e}",
                    K::kind(&())
                ))
            })
        };
        let (before, want) = (json(&old)?, json(desired)?);
        let mut next = before.clone();
        match want.get("spec") {
            Some(spec) => next["spec"] = spec.clone(),
            None => {
                if let Some(o) = next.as_object_mut() {
                    o.remove("spec");
                }
            }
        }
        let mut labels = desired.meta().labels.clone().unwrap_or_default();
        for (k, v) in old.meta().labels.iter().flatten() {
            if keep(k) {
                labels.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        // The pool engine's annotations (a replica being retired) are the system's too.
        let mut annotations = desired.meta().annotations.clone().unwrap_or_default();
        for (k, v) in old.meta().annotations.iter().flatten() {
            if k.starts_with(SYSTEM_ANNOTATION_PREFIX) {
                annotations.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        if let Some(m) = next.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            for (field, map) in [("labels", labels), ("annotations", annotations)] {
                if map.is_empty() {
                    m.remove(field);
                } else {
                    m.insert(field.into(), serde_json::json!(map));
                }
            }
        }
        if next == before {
            return Ok(("unchanged", old));
        }
        let next: K = serde_json::from_value(next).map_err(|e| {
            Status::internal(format!(
                "{} {ns}/{name}: cannot decode it: {e}",
                K::kind(&())
            ))
        })?;
        match self.state.store.update(&next).await {
            Ok(stored) => Ok(("configured", stored)),
            Err(e) if e.is_conflict() || e.is_not_found() => Err(ApplyError::Conflict),
            Err(e) => Err(store_status(e).into()),
        }
    }

    /// Where the token of a client or exporter created by Apply can be had.
    fn token_note(&self, word: &str, ns: &str, name: &str) -> String {
        let secret = if self.credential_secrets {
            format!(" It is also kept in Secret {name}-{word} (key token).")
        } else {
            String::new()
        };
        format!(
            "a token was issued for {word} {ns}/{name}: `jmp admin import {word} {name} -n {ns}`              writes its config with a freshly issued one.{secret}"
        )
    }

    fn authorize(&self, md: &MetadataMap) -> Result<(), Status> {
        let presented = bearer_token(md).map_err(|e| {
            if e.code() == tonic::Code::Unauthenticated {
                Status::unauthenticated(
                    "the admin API needs \"authorization: Bearer <admin token>\" (the token is in \
                     the controller's data directory and admin config)",
                )
            } else {
                e
            }
        })?;
        if self.token.matches(&presented) {
            return Ok(());
        }
        if let Ok(subject) = self.state.auth.issuer.verify(&presented) {
            return Err(Status::permission_denied(format!(
                "permission denied: {} tokens cannot use the admin API",
                subject.kind.as_str().to_lowercase()
            )));
        }
        Err(Status::unauthenticated("invalid admin token"))
    }

    async fn credentials(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
        uid: Option<String>,
    ) -> Result<Credentials, Status> {
        issue_credentials(&self.state, &self.ca_pem, kind, namespace, name, uid).await
    }

    async fn get_object<K: StoreObject>(
        &self,
        what: &str,
        r: &ObjectRef,
    ) -> Result<(String, String, K), Status> {
        let (ns, name) = object_ref(what, r)?;
        let obj = self
            .state
            .store
            .get::<K>(&ns, &name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("{what} {ns}/{name} not found")))?;
        Ok((ns, name, obj))
    }

    async fn list_objects<K: StoreObject>(&self, req: &ListRequest) -> Result<Vec<K>, Status> {
        let ns = if req.namespace.is_empty() {
            None
        } else {
            validate_namespace(&req.namespace)
                .map_err(|e| Status::invalid_argument(format!("namespace: {e}")))?;
            Some(req.namespace.as_str())
        };
        limits::check_len("selector", &req.selector, MAX_SELECTOR)?;
        let sel = LabelSelector::parse(&req.selector).map_err(|e| {
            Status::invalid_argument(format!(
                "selector {:?}: {e}",
                req.selector,
                e = jumpstarter_core::error_chain(&e)
            ))
        })?;
        Ok(self
            .state
            .store
            .list::<K>(ns, &sel, &ListParams::default())
            .await
            .map_err(store_status)?
            .items)
    }

    /// Checks the admin token in `md` and reads the `what` named `namespace/name` (the first
    /// steps of each of the admin's changes below).
    async fn authorized_object<K: StoreObject>(
        &self,
        md: &MetadataMap,
        what: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(String, String, K), Status> {
        self.authorize(md)?;
        let r = ObjectRef {
            namespace: namespace.into(),
            name: name.into(),
        };
        self.get_object::<K>(what, &r).await
    }

    /// Sets the `Healthy` condition of exporter `namespace/name` to `healthy` with `message`
    /// unless it already is (an exporter with no status yet is healthy): cleared
    /// ([`conditions::REASON_CLEARED`]) or quarantined by an admin
    /// ([`REASON_QUARANTINED_BY_ADMIN`]). Checks the admin token in `md` first; records the
    /// change in the exporter's health history, logs it as done by `by` and wakes the
    /// scheduler.
    async fn set_exporter_health(
        &self,
        md: &MetadataMap,
        namespace: &str,
        name: &str,
        healthy: bool,
        message: &str,
        by: &str,
    ) -> Result<Exporter, Status> {
        use crate::hook_history::HealthKind;
        let (ns, name, _) = self
            .authorized_object::<Exporter>(md, "exporter", namespace, name)
            .await?;
        let (reason, kind) = if healthy {
            (conditions::REASON_CLEARED, HealthKind::Cleared)
        } else {
            (REASON_QUARANTINED_BY_ADMIN, HealthKind::QuarantinedByAdmin)
        };
        let mut changed = false;
        let e = update_exporter(&self.state.store, &ns, &name, true, |e| {
            changed = false;
            if e.unhealthy().is_none() == healthy {
                return false;
            }
            let st = e.status.get_or_insert_with(Default::default);
            changed = crate::objects::set_condition(
                &mut st.conditions,
                conditions::HEALTHY,
                healthy,
                reason,
                message,
                None,
                jiff::Timestamp::now(),
            );
            changed
        })
        .await?;
        if changed {
            self.state.hook_history.health(
                &ns,
                &name,
                crate::hook_history::HealthEvent {
                    time: jiff::Timestamp::now(),
                    kind,
                    source: by.to_string(),
                    message: message.to_string(),
                    check: None,
                },
            );
        }
        if healthy {
            tracing::info!(who = %by, "admin: {by} cleared the health of exporter {ns}/{name}");
        } else {
            tracing::info!(who = %by, "admin: {by} quarantined exporter {ns}/{name}");
        }
        self.state.wake.notify_one();
        Ok(e)
    }

    /// Marks for release every lease in `namespace` that `pick` selects and that has not ended.
    async fn release_leases(
        &self,
        namespace: &str,
        pick: impl Fn(&Lease) -> bool,
    ) -> Result<usize, Status> {
        let leases = self
            .state
            .store
            .list::<Lease>(
                Some(namespace),
                &LabelSelector::everything(),
                &ListParams::default(),
            )
            .await
            .map_err(store_status)?
            .items;
        let mut n = 0;
        for l in leases
            .iter()
            .filter(|l| !l.is_ended() && !l.spec.release && pick(l))
        {
            let Some(name) = l.metadata.name.as_deref() else {
                continue;
            };
            let r = release_lease(&self.state, namespace, name).await;
            match r {
                Ok(_) => n += 1,
                // Deleted meanwhile: nothing to release.
                Err(e) if e.code() == tonic::Code::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }
}

/// Reason of the `Healthy=False` condition an admin sets ([`AdminApi::quarantine_exporter`]).
pub const REASON_QUARANTINED_BY_ADMIN: &str = "QuarantinedByAdmin";

/// The admin's changes to one lease or exporter that the dashboard makes too: each checks the
/// admin token as the RPCs do (`md` carries it), writes through one code path, wakes the
/// scheduler and logs who did it (`by`: `admin API`, or the dashboard's login).
impl<S: Store> AdminApi<S> {
    /// Ends lease `namespace/name` (marks it for release, as `jmp delete lease` does);
    /// FAILED_PRECONDITION when it has already ended or been released.
    pub(crate) async fn end_lease(
        &self,
        md: &MetadataMap,
        namespace: &str,
        name: &str,
        by: &str,
    ) -> Result<Lease, Status> {
        let (ns, name, lease) = self
            .authorized_object::<Lease>(md, "lease", namespace, name)
            .await?;
        if lease.is_ended() {
            return Err(Status::failed_precondition(format!(
                "lease {ns}/{name} has already ended"
            )));
        }
        if lease.spec.release {
            return Err(Status::failed_precondition(format!(
                "lease {ns}/{name} has already been released"
            )));
        }
        let l = release_lease(&self.state, &ns, &name).await?;
        tracing::info!(who = %by, "admin: {by} ended lease {ns}/{name}");
        Ok(l)
    }

    /// Clears the quarantine of exporter `namespace/name` (`ClearExporterHealth`, `jmp admin
    /// clear-health exporter`).
    pub(crate) async fn clear_health(
        &self,
        md: &MetadataMap,
        namespace: &str,
        name: &str,
        by: &str,
    ) -> Result<Exporter, Status> {
        self.set_exporter_health(md, namespace, name, true, "Cleared by an admin", by)
            .await
    }

    /// Quarantines exporter `namespace/name` (`Healthy=False`, reason
    /// [`REASON_QUARANTINED_BY_ADMIN`], naming `by`): it is leased to nobody until its health
    /// is cleared. An exporter already quarantined is left as it is.
    pub(crate) async fn quarantine_exporter(
        &self,
        md: &MetadataMap,
        namespace: &str,
        name: &str,
        by: &str,
    ) -> Result<Exporter, Status> {
        let message = format!("Quarantined by an admin ({by})");
        self.set_exporter_health(md, namespace, name, false, &message, by)
            .await
    }

    /// Enables or disables exporter `namespace/name` (`spec.enabled`; a disabled exporter
    /// keeps its running lease but gets no new one).
    pub(crate) async fn set_exporter_enabled(
        &self,
        md: &MetadataMap,
        namespace: &str,
        name: &str,
        enabled: bool,
        by: &str,
    ) -> Result<Exporter, Status> {
        let (ns, name, _) = self
            .authorized_object::<Exporter>(md, "exporter", namespace, name)
            .await?;
        let e = update_exporter(&self.state.store, &ns, &name, false, |e| {
            if e.is_enabled() == enabled {
                return false;
            }
            e.spec.enabled = Some(enabled);
            true
        })
        .await?;
        let done = if enabled { "enabled" } else { "disabled" };
        tracing::info!(who = %by, "admin: {by} {done} exporter {ns}/{name}");
        self.state.wake.notify_one();
        Ok(e)
    }
}

/// Why one try of [`AdminApi::apply_object`] failed.
enum ApplyError {
    /// Another write came first: read again and retry.
    Conflict,
    /// Anything else.
    Status(Status),
}

impl From<Status> for ApplyError {
    fn from(s: Status) -> Self {
        Self::Status(s)
    }
}

/// The namespace (default when empty) and name of a request, validated.
fn names(what: &str, namespace: &str, name: &str) -> Result<(String, String), Status> {
    let ns = if namespace.is_empty() {
        DEFAULT_NAMESPACE
    } else {
        namespace
    };
    validate_namespace(ns)
        .map_err(|e| Status::invalid_argument(format!("{what} {ns}/{name}: namespace {e}")))?;
    if name.is_empty() {
        return Err(Status::invalid_argument(format!(
            "{what} in namespace {ns}: name is required"
        )));
    }
    validate_dns1123_subdomain(name)
        .map_err(|e| Status::invalid_argument(format!("{what} {ns}/{name}: name {e}")))?;
    Ok((ns.to_string(), name.to_string()))
}

fn object_ref(what: &str, r: &ObjectRef) -> Result<(String, String), Status> {
    names(what, &r.namespace, &r.name)
}

/// Checks labels as the API server does; `reserved` rejects the `jumpstarter.dev/` keys an
/// exporter manages itself.
fn labels(
    what: &str,
    ns: &str,
    name: &str,
    labels: &std::collections::HashMap<String, String>,
    reserved: bool,
) -> Result<BTreeMap<String, String>, Status> {
    limits::check_count(
        &format!("{what} {ns}/{name}: labels"),
        labels.len(),
        MAX_LABELS,
    )?;
    let mut out = BTreeMap::new();
    for (k, v) in labels {
        label_problem(k, v, reserved)
            .map_err(|e| Status::invalid_argument(format!("{what} {ns}/{name}: {e}")))?;
        out.insert(k.clone(), v.clone());
    }
    Ok(out)
}

fn meta(ns: &str, name: &str, labels: BTreeMap<String, String>) -> metav1::ObjectMeta {
    metav1::ObjectMeta {
        namespace: Some(ns.to_string()),
        name: Some(name.to_string()),
        labels: (!labels.is_empty()).then_some(labels),
        ..Default::default()
    }
}

/// A Client as the admin API shows it.
pub fn client_to_admin(c: &Client) -> PbClient {
    PbClient {
        namespace: c.metadata.namespace.clone().unwrap_or_default(),
        name: c.metadata.name.clone().unwrap_or_default(),
        labels: c
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        username: c.spec.username.clone().unwrap_or_default(),
        created: created(&c.metadata),
        token_expires_at: c
            .status
            .as_ref()
            .and_then(|s| s.token_expires_at.as_ref())
            .map(|t| timestamp_to_proto(t.0)),
        token_expiring_reason: token_expiring(c)
            .map(|t| t.reason.clone())
            .unwrap_or_default(),
        token_expiring_message: token_expiring(c)
            .map(|t| t.message.clone())
            .unwrap_or_default(),
    }
}

/// The `TokenExpiring` condition of a client, if any.
fn token_expiring(c: &Client) -> Option<&metav1::Condition> {
    c.status
        .as_ref()
        .and_then(|s| find_condition(&s.conditions, crate::objects::TOKEN_EXPIRING))
}

/// An Exporter as the admin API shows it.
pub fn exporter_to_admin(e: &Exporter) -> PbExporter {
    let status = e.status.as_ref();
    PbExporter {
        namespace: e.metadata.namespace.clone().unwrap_or_default(),
        name: e.metadata.name.clone().unwrap_or_default(),
        labels: e.labels().into_iter().collect(),
        username: e.spec.username.clone().unwrap_or_default(),
        enabled: e.is_enabled(),
        online: e.condition_is_true(conditions::ONLINE),
        status: exporter_status_to_proto(status.and_then(|s| s.exporter_status)) as i32,
        status_message: status.map(|s| s.status_message.clone()).unwrap_or_default(),
        unhealthy: e.unhealthy().is_some(),
        health_reason: e.unhealthy().map(|c| c.reason.clone()).unwrap_or_default(),
        health_message: e.unhealthy().map(|c| c.message.clone()).unwrap_or_default(),
        lease: status
            .and_then(|s| s.lease_ref.as_ref())
            .map(|r| r.name.clone())
            .unwrap_or_default(),
        created: created(&e.metadata),
        devices: status
            .and_then(|s| s.devices.as_ref())
            .map(|devices| {
                devices
                    .iter()
                    .map(|d| PbDevice {
                        uuid: d.uuid.clone(),
                        parent_uuid: d.parent_uuid.clone().unwrap_or_default(),
                        labels: d.labels.clone().into_iter().collect(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn selector_string(sel: &metav1::LabelSelector) -> String {
    // Stored selectors were validated on the way in; an unreadable one is shown as empty
    // rather than failing the whole listing.
    LabelSelector::from_k8s(sel)
        .map(|s| s.to_selector_string())
        .unwrap_or_default()
}

/// An ExporterAccessPolicy as the admin API shows it.
pub fn policy_to_admin(p: &ExporterAccessPolicy) -> AccessPolicy {
    AccessPolicy {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        exporter_selector: selector_string(&p.spec.exporter_selector),
        rules: p
            .spec
            .policies
            .iter()
            .map(|r| AccessRule {
                description: r.description.clone(),
                priority: i32::try_from(r.priority).unwrap_or(if r.priority < 0 {
                    i32::MIN
                } else {
                    i32::MAX
                }),
                from_client_selectors: r
                    .from
                    .iter()
                    .map(|f| selector_string(&f.client_selector))
                    .collect(),
                maximum_duration: r.maximum_duration.map(Into::into),
                spot_access: r.spot_access,
            })
            .collect(),
    }
}

/// Builds the stored policy from the admin message, naming the field at fault.
pub fn policy_from_admin(p: &AccessPolicy) -> Result<ExporterAccessPolicy, Status> {
    let (ns, name) = names("access policy", &p.namespace, &p.name)?;
    let bad = |field: String, e: String| {
        Status::invalid_argument(format!("access policy {ns}/{name}: {field}: {e}"))
    };
    let too_big =
        |e: Status| Status::invalid_argument(format!("access policy {ns}/{name}: {}", e.message()));
    limits::check_len("exporter_selector", &p.exporter_selector, MAX_SELECTOR).map_err(too_big)?;
    limits::check_count("rules", p.rules.len(), MAX_RULES).map_err(too_big)?;
    for (i, r) in p.rules.iter().enumerate() {
        limits::check_len(&format!("rules[{i}].description"), &r.description, MAX_TEXT)
            .map_err(too_big)?;
        limits::check_count(
            &format!("rules[{i}].from_client_selectors"),
            r.from_client_selectors.len(),
            MAX_RULES,
        )
        .map_err(too_big)?;
        for (j, sel) in r.from_client_selectors.iter().enumerate() {
            limits::check_len(
                &format!("rules[{i}].from_client_selectors[{j}]"),
                sel,
                MAX_SELECTOR,
            )
            .map_err(too_big)?;
        }
    }
    let exporter_selector = LabelSelector::parse(&p.exporter_selector).map_err(|e| {
        bad(
            "exporter_selector".into(),
            jumpstarter_core::error_chain(&e),
        )
    })?;
    let mut policies = Vec::new();
    for (i, r) in p.rules.iter().enumerate() {
        let mut from = Vec::new();
        for (j, s) in r.from_client_selectors.iter().enumerate() {
            let sel = LabelSelector::parse(s).map_err(|e| {
                bad(
                    format!("rules[{i}].from_client_selectors[{j}]"),
                    jumpstarter_core::error_chain(&e),
                )
            })?;
            from.push(PolicyFrom {
                client_selector: sel.to_k8s(),
            });
        }
        let maximum_duration = match &r.maximum_duration {
            None => None,
            Some(d) => {
                let d = GoDuration::try_from(d).map_err(|e| {
                    bad(
                        format!("rules[{i}].maximum_duration"),
                        jumpstarter_core::error_chain(&e),
                    )
                })?;
                if !d.0.is_positive() {
                    return Err(bad(
                        format!("rules[{i}].maximum_duration"),
                        format!("must be positive, got {d}"),
                    ));
                }
                Some(d)
            }
        };
        policies.push(Policy {
            description: r.description.clone(),
            priority: i64::from(r.priority),
            from,
            maximum_duration,
            spot_access: r.spot_access,
        });
    }
    let mut obj = ExporterAccessPolicy::new(
        &name,
        ExporterAccessPolicySpec {
            exporter_selector: exporter_selector.to_k8s(),
            policies,
        },
    );
    obj.metadata = meta(&ns, &name, BTreeMap::new());
    Ok(obj)
}

fn username(u: &str) -> Result<Option<String>, Status> {
    limits::check_len("username", u, MAX_TEXT)?;
    Ok((!u.trim().is_empty()).then(|| u.trim().to_string()))
}

#[tonic::async_trait]
impl<S: Store> AdminService for AdminApi<S> {
    async fn create_client(
        &self,
        request: Request<CreateClientRequest>,
    ) -> Result<Response<CreateClientResponse>, Status> {
        self.authorize(request.metadata())?;
        let c = request
            .into_inner()
            .client
            .ok_or_else(|| Status::invalid_argument("client is required"))?;
        let (ns, name) = names("client", &c.namespace, &c.name)?;
        let labels = labels("client", &ns, &name, &c.labels, false)?;
        let mut obj = Client::new(
            &name,
            ClientSpec {
                username: username(&c.username)?,
            },
        );
        obj.metadata = meta(&ns, &name, labels);
        let stored = self.state.store.create(&obj).await.map_err(store_status)?;
        let credentials = self.issue_for_new(ObjectKind::Client, &stored).await?;
        tracing::info!("admin: created client {ns}/{name}");
        self.state.wake.notify_one();
        Ok(Response::new(CreateClientResponse {
            client: Some(client_to_admin(&stored)),
            credentials: Some(credentials),
        }))
    }

    async fn get_client(&self, request: Request<ObjectRef>) -> Result<Response<PbClient>, Status> {
        self.authorize(request.metadata())?;
        let (_, _, c) = self
            .get_object::<Client>("client", request.get_ref())
            .await?;
        Ok(Response::new(client_to_admin(&c)))
    }

    async fn list_clients(
        &self,
        request: Request<ListRequest>,
    ) -> Result<Response<ListClientsResponse>, Status> {
        self.authorize(request.metadata())?;
        let items = self.list_objects::<Client>(request.get_ref()).await?;
        Ok(Response::new(ListClientsResponse {
            clients: items.iter().map(client_to_admin).collect(),
        }))
    }

    async fn delete_client(&self, request: Request<ObjectRef>) -> Result<Response<()>, Status> {
        self.authorize(request.metadata())?;
        let (ns, name, _) = self
            .get_object::<Client>("client", request.get_ref())
            .await?;
        // Its leases end first, so no exporter stays held by a client that no longer exists.
        let released = self
            .release_leases(&ns, |l| l.spec.client_ref.name == name)
            .await?;
        self.state
            .store
            .delete::<Client>(&ns, &name, None)
            .await
            .map_err(store_status)?;
        tracing::info!("admin: deleted client {ns}/{name} (released {released} lease(s))");
        self.state.wake.notify_one();
        Ok(Response::new(()))
    }

    async fn rotate_client(
        &self,
        request: Request<ObjectRef>,
    ) -> Result<Response<Credentials>, Status> {
        self.authorize(request.metadata())?;
        let (ns, name, c) = self
            .get_object::<Client>("client", request.get_ref())
            .await?;
        let creds = self
            .credentials(ObjectKind::Client, &ns, &name, c.metadata.uid.clone())
            .await?;
        self.keep_credential(&c, &creds.token).await?;
        tracing::info!("admin: issued a new token for client {ns}/{name}");
        Ok(Response::new(creds))
    }

    async fn create_exporter(
        &self,
        request: Request<CreateExporterRequest>,
    ) -> Result<Response<CreateExporterResponse>, Status> {
        self.authorize(request.metadata())?;
        let e = request
            .into_inner()
            .exporter
            .ok_or_else(|| Status::invalid_argument("exporter is required"))?;
        let (ns, name) = names("exporter", &e.namespace, &e.name)?;
        let labels = labels("exporter", &ns, &name, &e.labels, true)?;
        // `enabled` is not read: proto3 cannot tell "false" from "not set", and a new
        // exporter that nobody can lease would surprise more than it helps.
        let mut obj = Exporter::new(
            &name,
            ExporterSpec {
                username: username(&e.username)?,
                enabled: None,
            },
        );
        obj.metadata = meta(&ns, &name, labels);
        let stored = self.state.store.create(&obj).await.map_err(store_status)?;
        let credentials = self.issue_for_new(ObjectKind::Exporter, &stored).await?;
        tracing::info!("admin: created exporter {ns}/{name}");
        self.state.wake.notify_one();
        Ok(Response::new(CreateExporterResponse {
            exporter: Some(exporter_to_admin(&stored)),
            credentials: Some(credentials),
        }))
    }

    async fn get_exporter(
        &self,
        request: Request<ObjectRef>,
    ) -> Result<Response<PbExporter>, Status> {
        self.authorize(request.metadata())?;
        let (_, _, e) = self
            .get_object::<Exporter>("exporter", request.get_ref())
            .await?;
        Ok(Response::new(exporter_to_admin(&e)))
    }

    async fn list_exporters(
        &self,
        request: Request<ListRequest>,
    ) -> Result<Response<ListExportersResponse>, Status> {
        self.authorize(request.metadata())?;
        let items = self.list_objects::<Exporter>(request.get_ref()).await?;
        Ok(Response::new(ListExportersResponse {
            exporters: items.iter().map(exporter_to_admin).collect(),
        }))
    }

    async fn delete_exporter(&self, request: Request<ObjectRef>) -> Result<Response<()>, Status> {
        self.authorize(request.metadata())?;
        let (ns, name, _) = self
            .get_object::<Exporter>("exporter", request.get_ref())
            .await?;
        let holds = |l: &Lease| l.assigned_exporter() == Some(name.as_str());
        let mut released = self.release_leases(&ns, holds).await?;
        self.state
            .store
            .delete::<Exporter>(&ns, &name, None)
            .await
            .map_err(store_status)?;
        // A reconcile pass that read the exporter before the delete may have granted it
        // meanwhile: end such a lease too. (Leases pinned to it become ExporterNotFound.)
        released += self.release_leases(&ns, holds).await?;
        tracing::info!("admin: deleted exporter {ns}/{name} (released {released} lease(s))");
        self.state.wake.notify_one();
        Ok(Response::new(()))
    }

    async fn clear_exporter_health(
        &self,
        request: Request<ObjectRef>,
    ) -> Result<Response<PbExporter>, Status> {
        let r = request.get_ref();
        let e = self
            .clear_health(request.metadata(), &r.namespace, &r.name, "admin API")
            .await?;
        Ok(Response::new(exporter_to_admin(&e)))
    }

    async fn rotate_exporter(
        &self,
        request: Request<ObjectRef>,
    ) -> Result<Response<Credentials>, Status> {
        self.authorize(request.metadata())?;
        let (ns, name, e) = self
            .get_object::<Exporter>("exporter", request.get_ref())
            .await?;
        let creds = self
            .credentials(ObjectKind::Exporter, &ns, &name, e.metadata.uid.clone())
            .await?;
        self.keep_credential(&e, &creds.token).await?;
        tracing::info!("admin: issued a new token for exporter {ns}/{name}");
        Ok(Response::new(creds))
    }

    async fn create_access_policy(
        &self,
        request: Request<AccessPolicy>,
    ) -> Result<Response<AccessPolicy>, Status> {
        self.authorize(request.metadata())?;
        let obj = policy_from_admin(request.get_ref())?;
        let stored = self.state.store.create(&obj).await.map_err(store_status)?;
        tracing::info!(
            "admin: created access policy {}/{}",
            stored.metadata.namespace.as_deref().unwrap_or_default(),
            stored.metadata.name.as_deref().unwrap_or_default()
        );
        self.state.wake.notify_one();
        Ok(Response::new(policy_to_admin(&stored)))
    }

    async fn get_access_policy(
        &self,
        request: Request<ObjectRef>,
    ) -> Result<Response<AccessPolicy>, Status> {
        self.authorize(request.metadata())?;
        let (_, _, p) = self
            .get_object::<ExporterAccessPolicy>("access policy", request.get_ref())
            .await?;
        Ok(Response::new(policy_to_admin(&p)))
    }

    async fn list_access_policies(
        &self,
        request: Request<ListRequest>,
    ) -> Result<Response<ListAccessPoliciesResponse>, Status> {
        self.authorize(request.metadata())?;
        let items = self
            .list_objects::<ExporterAccessPolicy>(request.get_ref())
            .await?;
        Ok(Response::new(ListAccessPoliciesResponse {
            policies: items.iter().map(policy_to_admin).collect(),
        }))
    }

    async fn get_lease_logs(
        &self,
        request: Request<ObjectRef>,
    ) -> Result<Response<jumpstarter_proto::ext_v1::LeaseLogs>, Status> {
        self.authorize(request.metadata())?;
        let (ns, name) = object_ref("lease", request.get_ref())?;
        let known: Option<crate::objects::Lease> = self
            .state
            .store
            .get(&ns, &name)
            .await
            .map_err(store_status)?;
        let full = format!("namespaces/{ns}/leases/{name}");
        // An admin reads all of it, the console transcripts too (jmp admin logs sorts them).
        let all = crate::lease_logs::Part::All;
        let out = crate::service::devices::lease_logs(&self.state, &ns, &name, full, all)?;
        if known.is_none() && out.get_ref().entries.is_empty() {
            return Err(Status::not_found(format!("lease {name} not found")));
        }
        Ok(out)
    }

    async fn delete_access_policy(
        &self,
        request: Request<ObjectRef>,
    ) -> Result<Response<()>, Status> {
        self.authorize(request.metadata())?;
        let (ns, name) = object_ref("access policy", request.get_ref())?;
        self.state
            .store
            .delete::<ExporterAccessPolicy>(&ns, &name, None)
            .await
            .map_err(|e| {
                if e.is_not_found() {
                    Status::not_found(format!("access policy {ns}/{name} not found"))
                } else {
                    store_status(e)
                }
            })?;
        tracing::info!("admin: deleted access policy {ns}/{name}");
        self.state.wake.notify_one();
        Ok(Response::new(()))
    }

    async fn apply(
        &self,
        request: Request<ApplyRequest>,
    ) -> Result<Response<ApplyResponse>, Status> {
        self.authorize(request.metadata())?;
        let req = request.into_inner();
        if !req.namespace.is_empty() {
            validate_namespace(&req.namespace)
                .map_err(|e| Status::invalid_argument(format!("namespace: {e}")))?;
        }
        // Every document is checked before the first is written.
        let documents = parse_documents(&req.documents, &req.namespace)?;
        let mut results = Vec::with_capacity(documents.len());
        for (i, doc) in documents.iter().enumerate() {
            let d = &doc.desired;
            let (ns, name) = (d.namespace().to_string(), d.name().to_string());
            let not_system = |_: &str| false;
            // An exporter's reported labels, and the set label of a pool's replica, are the
            // system's: a document does not remove them.
            let reserved = |k: &str| {
                k.starts_with(RESERVED_LABEL_PREFIX)
                    || k == crate::objects::virtualtarget::LABEL_EXPORTER_SET
            };
            let applied = async {
                let mut credentials = None;
                let mut note = String::new();
                let action = match d {
                    Desired::Client(o) => {
                        let (action, stored) = self.apply_object(o, not_system).await?;
                        if action == "created" {
                            credentials =
                                Some(self.issue_for_new(ObjectKind::Client, &stored).await?);
                            note = self.token_note("client", &ns, &name);
                        }
                        action
                    }
                    Desired::Exporter(o) => {
                        let (action, stored) = self.apply_object(o, reserved).await?;
                        if action == "created" {
                            credentials =
                                Some(self.issue_for_new(ObjectKind::Exporter, &stored).await?);
                            note = self.token_note("exporter", &ns, &name);
                        }
                        action
                    }
                    Desired::Policy(o) => self.apply_object(o, not_system).await?.0,
                    Desired::Set(o) => self.apply_object(o, not_system).await?.0,
                    Desired::Class(o) => self.apply_object(o, not_system).await?.0,
                };
                Ok::<_, Status>((action, credentials, note))
            }
            .await;
            let (action, credentials, mut note) = applied.map_err(|e| {
                let done = if i == 0 {
                    "nothing was applied".to_string()
                } else {
                    format!("documents 1 to {i} were applied")
                };
                Status::new(
                    e.code(),
                    format!(
                        "document {n} ({kind} {ns}/{name}): {msg} ({done})",
                        n = i + 1,
                        kind = d.kind(),
                        msg = e.message()
                    ),
                )
            })?;
            if doc.status_ignored {
                if !note.is_empty() {
                    note.push(' ');
                }
                note.push_str("Its status was ignored: the controller writes it.");
            }
            tracing::info!("admin: applied {} {ns}/{name}: {action}", d.kind());
            results.push(ApplyResult {
                api_version: d.api_version().into(),
                kind: d.kind().into(),
                namespace: ns,
                name,
                action: action.into(),
                credentials,
                note,
            });
        }
        self.state.wake.notify_one();
        Ok(Response::new(ApplyResponse { results }))
    }

    async fn get_exporter_set(
        &self,
        request: Request<ObjectRef>,
    ) -> Result<Response<PbExporterSet>, Status> {
        self.authorize(request.metadata())?;
        let (ns, name, s) = self
            .get_object::<ExporterSet>("exporter set", request.get_ref())
            .await?;
        let decisions = self.state.pool_decisions.recent(&ns, &name);
        Ok(Response::new(exporter_set_to_admin(&s, &decisions)))
    }

    async fn list_exporter_sets(
        &self,
        request: Request<ListRequest>,
    ) -> Result<Response<ListExporterSetsResponse>, Status> {
        self.authorize(request.metadata())?;
        let items = self.list_objects::<ExporterSet>(request.get_ref()).await?;
        Ok(Response::new(ListExporterSetsResponse {
            exporter_sets: items
                .iter()
                .map(|s| exporter_set_to_admin(s, &[]))
                .collect(),
        }))
    }

    async fn delete_exporter_set(
        &self,
        request: Request<ObjectRef>,
    ) -> Result<Response<()>, Status> {
        self.authorize(request.metadata())?;
        let (ns, name, _) = self
            .get_object::<ExporterSet>("exporter set", request.get_ref())
            .await?;
        self.state
            .store
            .delete::<ExporterSet>(&ns, &name, None)
            .await
            .map_err(store_status)?;
        self.state.pool_decisions.forget(&ns, &name);
        tracing::info!("admin: deleted exporter set {ns}/{name}");
        self.state.wake.notify_one();
        Ok(Response::new(()))
    }

    async fn get_virtual_target_class(
        &self,
        request: Request<ObjectRef>,
    ) -> Result<Response<PbClass>, Status> {
        self.authorize(request.metadata())?;
        let (_, _, c) = self
            .get_object::<VirtualTargetClass>("virtual target class", request.get_ref())
            .await?;
        Ok(Response::new(class_to_admin(&c)))
    }

    async fn list_virtual_target_classes(
        &self,
        request: Request<ListRequest>,
    ) -> Result<Response<ListVirtualTargetClassesResponse>, Status> {
        self.authorize(request.metadata())?;
        let items = self
            .list_objects::<VirtualTargetClass>(request.get_ref())
            .await?;
        Ok(Response::new(ListVirtualTargetClassesResponse {
            classes: items.iter().map(class_to_admin).collect(),
        }))
    }

    async fn delete_virtual_target_class(
        &self,
        request: Request<ObjectRef>,
    ) -> Result<Response<()>, Status> {
        self.authorize(request.metadata())?;
        let (ns, name, _) = self
            .get_object::<VirtualTargetClass>("virtual target class", request.get_ref())
            .await?;
        let users: Vec<String> = self
            .state
            .store
            .list::<ExporterSet>(
                Some(&ns),
                &LabelSelector::everything(),
                &ListParams::default(),
            )
            .await
            .map_err(store_status)?
            .items
            .into_iter()
            .filter(|s| s.spec.virtual_target_class_name == name)
            .filter_map(|s| s.metadata.name)
            .collect();
        if !users.is_empty() {
            return Err(Status::failed_precondition(format!(
                "virtual target class {ns}/{name} is used by exporter set(s) {}: delete them \
                 first (jmp admin delete exporterset NAME)",
                users.join(", ")
            )));
        }
        self.state
            .store
            .delete::<VirtualTargetClass>(&ns, &name, None)
            .await
            .map_err(store_status)?;
        tracing::info!("admin: deleted virtual target class {ns}/{name}");
        Ok(Response::new(()))
    }
}

/// Issues a token for the `kind` `namespace/name` whose uid is `uid` (recording a client
/// token's expiry): the credentials `CreateClient`/`CreateExporter` hand out and the pool
/// engine gives each replica it makes; `ca_pem` (may be empty) goes into them.
pub(crate) async fn issue_credentials<S: Store>(
    state: &ControllerState<S>,
    ca_pem: &str,
    kind: ObjectKind,
    namespace: &str,
    name: &str,
    uid: Option<String>,
) -> Result<Credentials, Status> {
    let uid = uid.ok_or_else(|| {
        Status::internal(format!("{kind} {namespace}/{name} has no uid in the store"))
    })?;
    let issued = state
        .auth
        .issuer
        .issue(&Subject::new(kind, namespace, name, uid))
        .map_err(|e| {
            Status::internal(format!(
                "cannot issue a token: {e}",
                e = jumpstarter_core::error_chain(&e)
            ))
        })?;
    if kind == ObjectKind::Client
        && let Err(e) =
            crate::service::token_expiry::record(&state.store, namespace, name, issued.expires_at)
                .await
    {
        tracing::warn!(
            "client {namespace}/{name}: cannot record its token's expiry: {e}",
            e = jumpstarter_core::error_chain(&e)
        );
    }
    Ok(Credentials {
        endpoint: state.endpoint.clone(),
        ca_pem: ca_pem.to_string(),
        token: issued.token,
        expiry: Some(prost_types::Timestamp::from(issued.expires_at)),
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

/// Keeps `token` in `owner`'s credential Secret (`<name>-client` / `<name>-exporter`, key
/// `token`) when `credential_secrets` is on, as upstream does on Kubernetes.
pub(crate) async fn keep_credential<S: Store, K: StoreObject>(
    state: &ControllerState<S>,
    owner: &K,
    token: &str,
    credential_secrets: bool,
) -> Result<(), Status> {
    if !credential_secrets {
        return Ok(());
    }
    crate::store::credentials::put_credential(&state.store, owner, token)
        .await
        .map(|_| ())
        .map_err(store_status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_kubernetes_rules() {
        assert_eq!(
            names("client", "", "alice").unwrap(),
            ("default".to_string(), "alice".to_string())
        );
        names("client", "lab-1", "a.b-c").unwrap();
        for (ns, name) in [
            ("default", ""),
            ("default", "Alice"),
            ("default", "a_b"),
            ("default", "-a"),
            ("default", "a:b"),
            ("Default", "a"),
            ("a.b", "a"),
        ] {
            let e = names("client", ns, name).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{ns}/{name}");
            assert!(e.message().contains("client"), "{}", e.message());
        }
        let long = "a".repeat(254);
        assert!(names("client", "default", &long).is_err());
        assert!(names("client", &"a".repeat(64), "a").is_err());
    }

    #[test]
    fn labels_are_validated_and_reserved_prefix_refused_for_exporters() {
        let ok: std::collections::HashMap<String, String> = [
            ("board".into(), "rpi4".into()),
            ("example.com/x".into(), "".into()),
        ]
        .into();
        assert_eq!(labels("exporter", "d", "e", &ok, true).unwrap().len(), 2);
        for (k, v) in [
            ("bad key", "v"),
            ("k", "bad value"),
            ("k", &*"v".repeat(64)),
        ] {
            let m = [(k.to_string(), v.to_string())].into();
            let e = labels("exporter", "d", "e", &m, true).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains("exporter d/e"), "{}", e.message());
        }
        let reserved = [("jumpstarter.dev/name".to_string(), "x".to_string())].into();
        assert!(labels("exporter", "d", "e", &reserved, true).is_err());
        assert!(labels("client", "d", "e", &reserved, false).is_ok());
    }

    #[test]
    fn policy_round_trips_and_bad_fields_are_named() {
        let p = AccessPolicy {
            namespace: "default".into(),
            name: "lab".into(),
            exporter_selector: "board in (rpi4,rpi5)".into(),
            rules: vec![AccessRule {
                description: "ci".into(),
                priority: 10,
                from_client_selectors: vec!["team=ci".into(), "env!=prod".into()],
                maximum_duration: Some(prost_types::Duration {
                    seconds: 3600,
                    nanos: 0,
                }),
                spot_access: false,
            }],
        };
        let obj = policy_from_admin(&p).unwrap();
        let back = policy_to_admin(&obj);
        assert_eq!(back.exporter_selector, "board in (rpi4,rpi5)");
        assert_eq!(back.rules[0].from_client_selectors[0], "team=ci");
        assert_eq!(back.rules[0].from_client_selectors[1], "env notin (prod)");
        assert_eq!(back.rules[0].priority, 10);
        assert_eq!(back.rules[0].maximum_duration.unwrap().seconds, 3600);

        let mut bad = p.clone();
        bad.rules[0].from_client_selectors[1] = "a in (".into();
        let e = policy_from_admin(&bad).unwrap_err();
        assert!(
            e.message().contains("rules[0].from_client_selectors[1]"),
            "{}",
            e.message()
        );
        let mut bad = p.clone();
        bad.exporter_selector = "==x".into();
        let e = policy_from_admin(&bad).unwrap_err();
        assert!(e.message().contains("exporter_selector"), "{}", e.message());
        let mut bad = p;
        bad.rules[0].maximum_duration = Some(prost_types::Duration {
            seconds: -1,
            nanos: 0,
        });
        let e = policy_from_admin(&bad).unwrap_err();
        assert!(e.message().contains("maximum_duration"), "{}", e.message());
    }
}
