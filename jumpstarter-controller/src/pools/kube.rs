//! The `qemu.jumpstarter.dev` provisioner on Kubernetes: each replica of a pool is a Pod named
//! after its Exporter, in the set's namespace, laid out as upstream's JEP-0014 sketches it
//! ("Container-Backed Targets: Sidecar Pattern").
//!
//! - **Containers:** the exporter is the main container (`exporter`: `jmp run
//!   --exporter-config` [`CONFIG_PATH`]), so its exit completes the Pod (`restartPolicy:
//!   Never`, the `ExitAndReplace` recycle strategy) and `kubectl logs POD` shows it. The target
//!   runtime (QEMU) is a native sidecar init container (`target-runtime`, `restartPolicy:
//!   Always`): it starts before the exporter and Kubernetes stops it once the exporter has
//!   exited. Both mount an `emptyDir` at [`SHARED_MOUNT`] for their Unix sockets (QMP, serial,
//!   launcher) and another at `/tmp`; their root file systems are read-only.
//! - **Exporter config:** the complete config the engine made (with the exporter's token) is
//!   the key [`CONFIG_KEY`] of the Secret `<name>-exporter-config` ([`secret_name`]), mounted
//!   read-only into the exporter container only. The Secret is owned by the ExporterSet.
//! - **Parameters:** the class's `parameters` with the set's deep-merged over them
//!   ([`Parameters::merged_over`]) reach the runtime as JSON in the environment variable
//!   [`PARAMETERS_ENV`] (not secret: they are in the ExporterSet for anyone who can read it).
//! - **Images:** the set's `images` over the class's over the defaults: the exporter
//!   [`DEFAULT_EXPORTER_IMAGE`] (`jmp:dev`, the image `cargo xtask images` builds from
//!   `deploy/docker/jmp.Dockerfile`), the runtime [`DEFAULT_RUNTIME_IMAGE`] (upstream's QEMU
//!   runtime image: this project builds none). Each field (image, pull policy) is taken from
//!   the first of set, class that sets it.
//! - **Scheduling:** the class's `scheduling` (`nodeSelector`, `tolerations`, and `resources`
//!   of the runtime container, which runs the target).
//! - **Ownership:** the Pod and the Secret have the ExporterSet as their controller owner
//!   (`blockOwnerDeletion`), so deleting the set collects them; their labels are the
//!   replica's labels (the set label among them), which is how [`KubeProvisioner::observe`]
//!   finds them (a label selector: bounded lists).
//! - **Security:** as the controller's own Deployment: non-root (65532), no privilege
//!   escalation, no capabilities, read-only root, the runtime's default seccomp profile, and
//!   no ServiceAccount token (the exporter talks to the controller with its own token).
//!
//! [`render`] is a pure function (bad input is an error naming the field, before anything is
//! sent); [`KubeProvisioner`] sends what it renders to the API server.

use std::collections::BTreeMap;

use k8s_openapi::{
    ByteString,
    api::core::v1::{
        Capabilities, Container, EmptyDirVolumeSource, EnvVar, Pod, PodSecurityContext, PodSpec,
        SeccompProfile, Secret, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};

use super::provisioner::{
    ProvisionError, ProvisionFuture, Provisioner, ReplicaObservation, ReplicaPhase, ReplicaRequest,
};
use crate::objects::selector::{validate_label_value, validate_qualified_name};
use crate::objects::virtualtarget::{
    ExporterSet, ImageSpec, LABEL_EXPORTER_SET, PROVISIONER_QEMU, Parameters, PullPolicy,
};

/// The exporter image when neither the set nor the class names one: `jmp` (the image `cargo
/// xtask images` builds from `deploy/docker/jmp.Dockerfile`, tag `dev`; push it and name it
/// in the class's `images.exporter.image` on a real cluster).
pub const DEFAULT_EXPORTER_IMAGE: &str = "jmp:dev";
/// The runtime image when neither the set nor the class names one: upstream's QEMU runtime
/// (this project builds no runtime image).
pub const DEFAULT_RUNTIME_IMAGE: &str = "quay.io/jumpstarter-dev/virtual/qemu-runtime:latest";
/// The main container: `jmp run`.
pub const EXPORTER_CONTAINER: &str = "exporter";
/// The native sidecar init container that runs the target.
pub const RUNTIME_CONTAINER: &str = "target-runtime";
/// Where both containers share a directory (an `emptyDir`) for their sockets.
pub const SHARED_MOUNT: &str = "/shared";
/// Where the exporter config Secret is mounted in the exporter container.
pub const CONFIG_MOUNT: &str = "/etc/jumpstarter/exporter";
/// The Secret's key holding the exporter config.
pub const CONFIG_KEY: &str = "exporter.yaml";
/// The exporter config's path in the exporter container.
pub const CONFIG_PATH: &str = "/etc/jumpstarter/exporter/exporter.yaml";
/// The runtime container's environment variable with the merged parameters (JSON).
pub const PARAMETERS_ENV: &str = "JUMPSTARTER_PARAMETERS";
/// The user and group the containers run as (`nonroot` of the distroless images).
pub const RUN_AS: i64 = 65532;
/// The most Pods one page of [`KubeProvisioner::observe`]'s list asks for.
const LIST_PAGE: u32 = 500;
/// The most pages [`KubeProvisioner::observe`] reads (a bound on a set's Pods).
const LIST_PAGES: usize = 20;

/// The Secret holding replica `name`'s exporter config.
pub fn secret_name(name: &str) -> String {
    format!("{name}-exporter-config")
}

/// A replica request that cannot be rendered; names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct RenderError {
    /// The field at fault (e.g. `ExporterSet spec.images.exporter.image`).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> RenderError {
    RenderError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The cluster holds something that keeps a replica from being started or observed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterStateError {
    /// An object of the replica's name exists and another owner controls it.
    #[error("{kind} {name} exists and is not owned by ExporterSet {set}")]
    NotOurs {
        /// `Pod` or `Secret`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// The set the replica is of.
        set: String,
    },
    /// The replica's Pod is being deleted (a stop in progress): start it again later.
    #[error("Pod {name} is being deleted")]
    BeingDeleted {
        /// The Pod's name.
        name: String,
    },
    /// The set has more Pods than one observation reads.
    #[error("more than {limit} Pods labelled {selector}")]
    TooManyPods {
        /// The label selector.
        selector: String,
        /// How many are read at most.
        limit: usize,
    },
}

/// A replica as the API server gets it: its Secret, then its Pod.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedReplica {
    /// `<name>-exporter-config`, with the exporter config under [`CONFIG_KEY`].
    pub secret: Secret,
    /// The Pod named after the replica.
    pub pod: Pod,
}

/// Checks a DNS-1123 label (a namespace, a Pod name used as a host name).
fn check_dns_label(field: &str, value: &str) -> Result<(), RenderError> {
    let b = value.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-';
    if ok {
        Ok(())
    } else {
        Err(bad(
            field,
            format!(
                "{value:?} is not a DNS-1123 label (at most 63 lowercase letters, digits and \
                 '-', starting and ending with a letter or digit)"
            ),
        ))
    }
}

/// The image of one container: `over`'s fields over `base`'s over the default.
fn pick_image(
    container: &str,
    set: Option<&ImageSpec>,
    class: Option<&ImageSpec>,
    default: &str,
) -> Result<(String, Option<PullPolicy>), RenderError> {
    let (image, from) = match (
        set.and_then(|i| i.image.as_ref()),
        class.and_then(|i| i.image.as_ref()),
    ) {
        (Some(i), _) => (i.clone(), "ExporterSet"),
        (None, Some(i)) => (i.clone(), "VirtualTargetClass"),
        (None, None) => (default.to_string(), "default"),
    };
    if image.trim().is_empty() || image.chars().any(char::is_whitespace) {
        return Err(bad(
            format!("{from} spec.images.{container}.image"),
            format!("{image:?} is not an image reference (empty or with spaces)"),
        ));
    }
    let policy = set
        .and_then(|i| i.image_pull_policy)
        .or_else(|| class.and_then(|i| i.image_pull_policy));
    Ok((image, policy))
}

fn pull_policy(p: Option<PullPolicy>) -> Option<String> {
    p.map(|p| {
        match p {
            PullPolicy::Always => "Always",
            PullPolicy::Never => "Never",
            PullPolicy::IfNotPresent => "IfNotPresent",
        }
        .to_string()
    })
}

/// The security context of both containers (as `deploy/kubernetes/base/controller.yaml`).
fn container_security() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS),
        run_as_group: Some(RUN_AS),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

/// The set's controller owner reference (needs its name and uid, as the API server gave it).
fn owner_of(set: &ExporterSet) -> Result<OwnerReference, RenderError> {
    if set.metadata.uid.as_deref().is_none_or(str::is_empty) {
        return Err(bad(
            "ExporterSet metadata.uid",
            "missing: the set must be read from the API server (its uid is its owner reference)",
        ));
    }
    let mut owner = set
        .controller_owner_ref(&())
        .ok_or_else(|| bad("ExporterSet metadata.name", "missing"))?;
    // Deleting the set (foreground) waits for its Pods to go.
    owner.block_owner_deletion = Some(true);
    Ok(owner)
}

/// Renders replica `req` as its Secret and Pod (see the module docs); checks everything the
/// API server would refuse that comes from the set, the class or the request, naming the
/// field.
pub fn render(req: &ReplicaRequest) -> Result<RenderedReplica, RenderError> {
    check_dns_label("namespace", &req.namespace)?;
    check_dns_label("replica name", &req.name)?;
    let set_name = req.set.metadata.name.as_deref().unwrap_or_default();
    let owner = owner_of(&req.set)?;
    if req.set.metadata.namespace.as_deref() != Some(req.namespace.as_str()) {
        return Err(bad(
            "ExporterSet metadata.namespace",
            format!(
                "{:?} is not the replica's namespace {:?} (owners must be in the same namespace)",
                req.set.metadata.namespace.as_deref().unwrap_or_default(),
                req.namespace
            ),
        ));
    }
    let mut labels = req.labels.clone();
    labels.insert(LABEL_EXPORTER_SET.to_string(), set_name.to_string());
    for (k, v) in &labels {
        validate_qualified_name(k).map_err(|e| bad(format!("label key {k:?}"), e))?;
        validate_label_value(v).map_err(|e| bad(format!("label {k:?} value {v:?}"), e))?;
    }
    let set_images = req.set.spec.images.as_ref();
    let class_images = req.class.spec.images.as_ref();
    let (exporter_image, exporter_pull) = pick_image(
        "exporter",
        set_images.and_then(|i| i.exporter.as_ref()),
        class_images.and_then(|i| i.exporter.as_ref()),
        DEFAULT_EXPORTER_IMAGE,
    )?;
    let (runtime_image, runtime_pull) = pick_image(
        "runtime",
        set_images.and_then(|i| i.runtime.as_ref()),
        class_images.and_then(|i| i.runtime.as_ref()),
        DEFAULT_RUNTIME_IMAGE,
    )?;
    let empty = Parameters::default();
    let parameters = req
        .set
        .spec
        .parameters
        .as_ref()
        .unwrap_or(&empty)
        .merged_over(req.class.spec.parameters.as_ref().unwrap_or(&empty));
    let parameters = match parameters.0 {
        serde_json::Value::Null => serde_json::json!({}),
        v => v,
    };
    let scheduling = req.class.spec.scheduling.clone().unwrap_or_default();

    let metadata = |name: String| ObjectMeta {
        name: Some(name),
        namespace: Some(req.namespace.clone()),
        labels: Some(labels.clone()),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    };
    let secret = Secret {
        metadata: metadata(secret_name(&req.name)),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            CONFIG_KEY.to_string(),
            ByteString(req.exporter_config.clone().into_bytes()),
        )])),
        ..Default::default()
    };
    let runtime = Container {
        name: RUNTIME_CONTAINER.into(),
        image: Some(runtime_image),
        image_pull_policy: pull_policy(runtime_pull),
        // A native sidecar: started before the exporter, stopped after it.
        restart_policy: Some("Always".into()),
        env: Some(vec![EnvVar {
            name: PARAMETERS_ENV.into(),
            value: Some(parameters.to_string()),
            value_from: None,
        }]),
        resources: scheduling.resources,
        security_context: Some(container_security()),
        volume_mounts: Some(vec![
            mount("shared", SHARED_MOUNT, false),
            mount("tmp", "/tmp", false),
        ]),
        ..Default::default()
    };
    let exporter = Container {
        name: EXPORTER_CONTAINER.into(),
        image: Some(exporter_image),
        image_pull_policy: pull_policy(exporter_pull),
        command: Some(vec![
            "jmp".into(),
            "run".into(),
            "--exporter-config".into(),
            CONFIG_PATH.into(),
        ]),
        security_context: Some(container_security()),
        volume_mounts: Some(vec![
            mount("exporter-config", CONFIG_MOUNT, true),
            mount("shared", SHARED_MOUNT, false),
            mount("tmp", "/tmp", false),
        ]),
        ..Default::default()
    };
    let pod = Pod {
        metadata: metadata(req.name.clone()),
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            node_selector: scheduling.node_selector,
            tolerations: scheduling.tolerations,
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(RUN_AS),
                run_as_group: Some(RUN_AS),
                fs_group: Some(RUN_AS),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            init_containers: Some(vec![runtime]),
            containers: vec![exporter],
            volumes: Some(vec![
                empty_dir("shared"),
                empty_dir("tmp"),
                Volume {
                    name: "exporter-config".into(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some(secret_name(&req.name)),
                        // Readable by the containers' group (fsGroup) only.
                        default_mode: Some(0o440),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        status: None,
    };
    Ok(RenderedReplica { secret, pod })
}

/// What a Pod's status says, as a replica's phase and the reason worth showing.
pub fn observe_pod(pod: &Pod) -> ReplicaObservation {
    let status = pod.status.as_ref();
    let phase = match status.and_then(|s| s.phase.as_deref()) {
        None | Some("Pending") => ReplicaPhase::Pending,
        Some("Running") => ReplicaPhase::Running,
        Some("Succeeded") => ReplicaPhase::Succeeded,
        Some("Failed") => ReplicaPhase::Failed,
        Some(_) => ReplicaPhase::Unknown,
    };
    let join = |reason: Option<&str>, message: Option<&str>| -> Option<String> {
        match (
            reason.filter(|r| !r.is_empty()),
            message.filter(|m| !m.is_empty()),
        ) {
            (Some(r), Some(m)) => Some(format!("{r}: {m}")),
            (Some(r), None) => Some(r.to_string()),
            (None, Some(m)) => Some(m.to_string()),
            (None, None) => None,
        }
    };
    // The Pod's own reason first (Evicted, DeadlineExceeded...), then the exporter's (its
    // exit, or why it waits), then the runtime's, then why it is not scheduled.
    let pod_reason = status.and_then(|s| join(s.reason.as_deref(), s.message.as_deref()));
    let container = |statuses: Option<&Vec<k8s_openapi::api::core::v1::ContainerStatus>>,
                     name: &str| {
        let cs = statuses?.iter().find(|c| c.name == name)?;
        let state = cs.state.as_ref()?;
        if let Some(t) = &state.terminated {
            let what = format!("{name} exited with code {}", t.exit_code);
            return Some(match join(t.reason.as_deref(), t.message.as_deref()) {
                Some(why) => format!("{what} ({why})"),
                None => what,
            });
        }
        if let Some(w) = &state.waiting {
            return join(w.reason.as_deref(), w.message.as_deref()).map(|m| format!("{name}: {m}"));
        }
        None
    };
    let unscheduled = || {
        status?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .and_then(|c| join(c.reason.as_deref(), c.message.as_deref()))
    };
    let message = pod_reason
        .or_else(|| {
            container(
                status.and_then(|s| s.container_statuses.as_ref()),
                EXPORTER_CONTAINER,
            )
        })
        .or_else(|| {
            container(
                status.and_then(|s| s.init_container_statuses.as_ref()),
                RUNTIME_CONTAINER,
            )
        })
        .or_else(unscheduled);
    ReplicaObservation {
        name: pod.name_any(),
        phase,
        message,
    }
}

/// The `qemu.jumpstarter.dev` provisioner over a Kubernetes client (see the module docs).
#[derive(Clone)]
pub struct KubeProvisioner {
    client: kube::Client,
}

impl std::fmt::Debug for KubeProvisioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeProvisioner").finish_non_exhaustive()
    }
}

impl KubeProvisioner {
    /// A provisioner acting with `client` (the controller's: its ServiceAccount needs pods
    /// create/get/list/watch/delete and secrets create/get/update/delete, as
    /// `deploy/kubernetes/base/rbac.yaml` grants).
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    async fn start_replica(&self, req: &ReplicaRequest) -> Result<(), jumpstarter_core::BoxError> {
        let rendered = render(req)?;
        let owner_uid = req.set.metadata.uid.clone().unwrap_or_default();
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &req.namespace);
        let secret_name = secret_name(&req.name);
        match secrets
            .create(&PostParams::default(), &rendered.secret)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_already_exists() => {
                let current = secrets.get(&secret_name).await?;
                if !owned_by(&current.metadata, &owner_uid) {
                    return Err(ClusterStateError::NotOurs {
                        kind: "Secret",
                        name: secret_name,
                        set: req.set.name_any(),
                    }
                    .into());
                }
                let mut next = rendered.secret.clone();
                next.metadata.resource_version = current.metadata.resource_version;
                secrets
                    .replace(&secret_name, &PostParams::default(), &next)
                    .await?;
            }
            Err(e) => return Err(e.into()),
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &req.namespace);
        match pods.create(&PostParams::default(), &rendered.pod).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_already_exists() => {
                let current = pods.get(&req.name).await?;
                if !owned_by(&current.metadata, &owner_uid) {
                    // The config is not left behind for a Pod that is not ours.
                    ignore_not_found(secrets.delete(&secret_name, &DeleteParams::default()).await)?;
                    return Err(ClusterStateError::NotOurs {
                        kind: "Pod",
                        name: req.name.clone(),
                        set: req.set.name_any(),
                    }
                    .into());
                }
                if current.metadata.deletion_timestamp.is_some() {
                    return Err(ClusterStateError::BeingDeleted {
                        name: req.name.clone(),
                    }
                    .into());
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn stop_replica(&self, namespace: &str, name: &str) -> Result<(), kube::Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        // The Pod's own grace period: the exporter gets SIGTERM and time for its afterLease
        // hook; the kubelet stops the runtime sidecar after it.
        ignore_not_found(pods.delete(name, &DeleteParams::default()).await)?;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        ignore_not_found(
            secrets
                .delete(&secret_name(name), &DeleteParams::default())
                .await,
        )?;
        Ok(())
    }

    async fn observe_set(
        &self,
        set: &ExporterSet,
    ) -> Result<Vec<ReplicaObservation>, jumpstarter_core::BoxError> {
        let namespace = set.namespace().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let uid = set.metadata.uid.clone().unwrap_or_default();
        let selector = format!("{LABEL_EXPORTER_SET}={}", set.name_any());
        let mut lp = ListParams::default().labels(&selector).limit(LIST_PAGE);
        let mut out = Vec::new();
        for _ in 0..LIST_PAGES {
            let page = pods.list(&lp).await?;
            for pod in &page.items {
                // Stopped (being deleted) Pods are no longer replicas; another set of the
                // same name before this one left Pods that its deletion collects.
                if pod.metadata.deletion_timestamp.is_some()
                    || (!uid.is_empty() && !owned_by(&pod.metadata, &uid))
                {
                    continue;
                }
                out.push(observe_pod(pod));
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => lp = lp.continue_token(&token),
                None => return Ok(out),
            }
        }
        Err(ClusterStateError::TooManyPods {
            selector,
            limit: LIST_PAGE as usize * LIST_PAGES,
        }
        .into())
    }
}

fn owned_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid && o.controller == Some(true))
}

fn ignore_not_found<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

impl Provisioner for KubeProvisioner {
    fn name(&self) -> &'static str {
        PROVISIONER_QEMU
    }

    fn start<'a>(&'a self, req: &'a ReplicaRequest) -> ProvisionFuture<'a, ()> {
        Box::pin(async move {
            self.start_replica(req)
                .await
                .map_err(|source| ProvisionError::Replica {
                    namespace: req.namespace.clone(),
                    name: req.name.clone(),
                    operation: "start",
                    source,
                })
        })
    }

    fn stop<'a>(&'a self, namespace: &'a str, name: &'a str) -> ProvisionFuture<'a, ()> {
        Box::pin(async move {
            self.stop_replica(namespace, name)
                .await
                .map_err(|e| ProvisionError::Replica {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    operation: "stop",
                    source: e.into(),
                })
        })
    }

    fn observe<'a>(&'a self, set: &'a ExporterSet) -> ProvisionFuture<'a, Vec<ReplicaObservation>> {
        Box::pin(async move {
            self.observe_set(set)
                .await
                .map_err(|source| ProvisionError::Replica {
                    namespace: set.namespace().unwrap_or_default(),
                    name: set.name_any(),
                    operation: "observe",
                    source,
                })
        })
    }
}

#[cfg(test)]
mod tests;
