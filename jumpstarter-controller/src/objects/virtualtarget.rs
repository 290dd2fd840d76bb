//! Virtual target pools (`virtualtarget.jumpstarter.dev/v1alpha1`, upstream's JEP-0014):
//! [`VirtualTargetClass`], a backend profile naming a provisioner, and [`ExporterSet`], a pool
//! of exporters made from a template that the controller scales between `minReplicas` and
//! `maxReplicas`, keeping `minAvailableReplicas` ready and unleased.
//!
//! Field names, defaults and status follow upstream's CRDs; the objects live in the same store
//! as the `jumpstarter.dev` kinds on both backends.

use std::collections::BTreeMap;

use jiff::SignedDuration;
use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::duration::GoDuration;

/// The API group of the virtual target kinds.
pub const GROUP: &str = "virtualtarget.jumpstarter.dev";
/// The API version of the virtual target kinds.
pub const VERSION: &str = "v1alpha1";

/// The provisioner that runs each replica as a `jmp run` child process of the controller
/// (ours; the one-machine default).
pub const PROVISIONER_LOCAL: &str = "local";
/// The provisioner that renders each replica as a Kubernetes Pod (upstream's reference one).
pub const PROVISIONER_QEMU: &str = "qemu.jumpstarter.dev";

/// Label set on every Exporter a pool makes: the ExporterSet's name.
pub const LABEL_EXPORTER_SET: &str = "virtualtarget.jumpstarter.dev/exporterset";

// ---------------------------------------------------------------------------------------------
// Shared parts

/// A container image and its pull policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    /// The image reference (e.g. `"quay.io/org/repo:tag"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// `Always`, `Never` or `IfNotPresent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
}

/// A container image pull policy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    /// Pull every time.
    Always,
    /// Never pull.
    Never,
    /// Pull when absent.
    IfNotPresent,
}

/// Image overrides for the provisioner's containers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Images {
    /// The exporter (`jmp run`) container's image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter: Option<ImageSpec>,
    /// The provisioner-specific runtime container's image (e.g. QEMU's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<ImageSpec>,
}

/// Free-form parameters a provisioner interprets (`x-kubernetes-preserve-unknown-fields`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(transparent)]
pub struct Parameters(pub serde_json::Value);

impl JsonSchema for Parameters {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Parameters".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
    }

    fn inline_schema() -> bool {
        true
    }
}

impl Parameters {
    /// `self` deep-merged over `base` (objects merge key by key, anything else replaces), as
    /// the JEP merges an ExporterSet's parameters over its class's.
    pub fn merged_over(&self, base: &Parameters) -> Parameters {
        fn merge(base: &serde_json::Value, over: &serde_json::Value) -> serde_json::Value {
            match (base, over) {
                (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
                    let mut out = b.clone();
                    for (k, v) in o {
                        let merged = match b.get(k) {
                            Some(bv) => merge(bv, v),
                            None => v.clone(),
                        };
                        out.insert(k.clone(), merged);
                    }
                    serde_json::Value::Object(out)
                }
                (_, serde_json::Value::Null) => base.clone(),
                (_, o) => o.clone(),
            }
        }
        Parameters(merge(&base.0, &self.0))
    }
}

// ---------------------------------------------------------------------------------------------
// VirtualTargetClass

/// Desired state of a VirtualTargetClass: which provisioner makes a pool's replicas, and how.
#[allow(clippy::duplicated_attributes)] // repeated printcolumn(...) keys are by design
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "virtualtarget.jumpstarter.dev",
    version = "v1alpha1",
    kind = "VirtualTargetClass",
    plural = "virtualtargetclasses",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    doc = "VirtualTargetClass is a backend profile for virtual exporters: the provisioner that makes them and its parameters",
    printcolumn(
        name = "Provisioner",
        type_ = "string",
        json_path = ".spec.provisioner"
    ),
    printcolumn(name = "Binding", type_ = "string", json_path = ".spec.bindingMode")
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualTargetClassSpec {
    /// The provisioner: `local` (ours: child processes of the controller) or
    /// `qemu.jumpstarter.dev` (Pods on Kubernetes).
    #[schemars(length(min = 1))]
    pub provisioner: String,
    /// `Immediate` (warm pool) or `WaitForFirstConsumer` (on demand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding_mode: Option<BindingMode>,
    /// `Delete` or `Retain`: what happens to a replica's resources when it goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_policy: Option<ReclaimPolicy>,
    /// A ConfigMap with the CA bundle the replicas trust.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle_config_map_ref: Option<ConfigMapKeyRef>,
    /// A Secret with backend credentials, injected into the replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretRef>,
    /// Image overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Images>,
    /// Parameters the provisioner interprets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Parameters>,
    /// Scheduling fields copied into the replicas' Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<Scheduling>,
}

/// When replicas are made.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BindingMode {
    /// Keep the warm pool (`minAvailableReplicas`) ready.
    #[default]
    Immediate,
    /// Make replicas only for waiting leases.
    WaitForFirstConsumer,
}

/// What happens to a replica's resources when it goes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ReclaimPolicy {
    /// Delete them.
    #[default]
    Delete,
    /// Keep them.
    Retain,
}

/// A key of a ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyRef {
    /// The ConfigMap's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The key (default `ca-bundle.crt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// A Secret by name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// The Secret's name.
    #[serde(default)]
    pub name: String,
}

/// Scheduling fields for the replicas' Pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Scheduling {
    /// Node labels the Pods must run on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Tolerations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Resource requests and limits of the runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

// ---------------------------------------------------------------------------------------------
// ExporterSet

/// Desired state of an ExporterSet: a pool of exporters made from `template` by the class's
/// provisioner.
#[allow(clippy::duplicated_attributes)] // repeated printcolumn(...) keys are by design
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "virtualtarget.jumpstarter.dev",
    version = "v1alpha1",
    kind = "ExporterSet",
    namespaced,
    status = "ExporterSetStatus",
    scale(
        spec_replicas_path = ".spec.maxReplicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    derive = "PartialEq",
    derive = "Default",
    doc = "ExporterSet is the Schema for the exportersets API. It manages a scalable set of virtual exporter instances backed by a VirtualTargetClass.",
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Available",
        type_ = "integer",
        json_path = ".status.availableReplicas"
    ),
    printcolumn(
        name = "Unavailable",
        type_ = "integer",
        json_path = ".status.unavailableReplicas"
    ),
    printcolumn(
        name = "Leased",
        type_ = "integer",
        json_path = ".status.leasedReplicas"
    ),
    printcolumn(
        name = "Class",
        type_ = "string",
        json_path = ".spec.virtualTargetClassName"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "message": "minReplicas must be less than or equal to maxReplicas (when maxReplicas is not 0)",
        "rule": "self.maxReplicas == 0 || self.minReplicas <= self.maxReplicas",
    },
    {
        "message": "minAvailableReplicas must be less than or equal to maxReplicas (when maxReplicas is not 0)",
        "rule": "self.maxReplicas == 0 || self.minAvailableReplicas <= self.maxReplicas",
    },
]))]
pub struct ExporterSetSpec {
    /// The VirtualTargetClass (same namespace) whose provisioner makes the replicas.
    #[schemars(length(min = 1))]
    pub virtual_target_class_name: String,
    /// Selects the exporters owned by this set; must match the template's labels.
    pub selector: metav1::LabelSelector,
    /// What each replica is: labels and the drivers of its exporter config.
    pub template: ExporterTemplate,
    /// The floor (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_replicas: Option<i32>,
    /// The ceiling (default 4; 0 means no upper bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_replicas: Option<i32>,
    /// How many replicas are kept ready and unleased (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_available_replicas: Option<i32>,
    /// How long an excess replica stays idle before it goes (default `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_cooldown: Option<String>,
    /// `ExitAndReplace` (default: a fresh exporter for every lease) or `InPlaceReuse`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recycle_strategy: Option<RecycleStrategy>,
    /// Image overrides (over the class's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Images>,
    /// Parameters deep-merged over the class's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Parameters>,
}

/// What happens to a replica after its lease.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RecycleStrategy {
    /// The exporter exits after its afterLease hook and a fresh one replaces it.
    #[default]
    ExitAndReplace,
    /// The exporter stays and serves the next lease.
    InPlaceReuse,
}

/// The template of a pool's replicas.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExporterTemplate {
    /// Labels and annotations of each replica's Exporter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// The replica's exporter config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<ExporterTemplateSpec>,
}

/// Labels and annotations of a template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The exporter config of a template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExporterTemplateSpec {
    /// The drivers: each becomes an entry of the exporter config's `export` map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drivers: Option<Vec<DriverConfig>>,
}

/// One driver of a template (upstream's `DriverConfig`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"message": "either type or ref must be set", "rule": "has(self.type) || has(self.ref)"},
    {"message": "type and ref are mutually exclusive", "rule": "!(has(self.type) && has(self.ref))"},
    {"message": "ref entries must not have config", "rule": "!has(self.ref) || !has(self.config)"},
    {"message": "name is required", "rule": "has(self.name) && size(self.name) > 0"},
]))]
pub struct DriverConfig {
    /// The key in the exporter config's `export` map; unique in the template.
    pub name: String,
    /// The driver's type (e.g. `jumpstarter_driver_power.driver.MockPower`); or `ref`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    #[schemars(length(min = 1))]
    pub type_: Option<String>,
    /// Another driver of the template, by name, instead of `type`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "ref")]
    #[schemars(pattern(r"^[^.]+([.][^.]+)*$"))]
    pub ref_: Option<String>,
    /// The driver's config (an object, unlike the free-form `parameters`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("type" = "object"))]
    pub config: Option<Parameters>,
}

/// Observed state of an ExporterSet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExporterSetStatus {
    /// Replicas made by this set.
    #[serde(default)]
    pub replicas: i32,
    /// Replicas whose exporter is online and registered.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Ready, enabled and not leased replicas (the warm pool).
    #[serde(default)]
    pub available_replicas: i32,
    /// Replicas not available.
    #[serde(default)]
    pub unavailable_replicas: i32,
    /// Replicas serving a lease.
    #[serde(default)]
    pub leased_replicas: i32,
    /// Exporters serving a lease.
    #[serde(default)]
    pub exporters_active: i32,
    /// Exporters disabled (draining).
    #[serde(default)]
    pub exporters_disabled: i32,
    /// Exporters online, enabled and not leased.
    #[serde(default)]
    pub exporters_idle: i32,
    /// Exporters not online.
    #[serde(default)]
    pub exporters_offline: i32,
    /// Replica processes or Pods failed.
    #[serde(default)]
    pub pods_failed: i32,
    /// Replica processes or Pods starting.
    #[serde(default)]
    pub pods_pending: i32,
    /// Replica processes or Pods running.
    #[serde(default)]
    pub pods_running: i32,
    /// Replica processes or Pods in no known phase.
    #[serde(default)]
    pub pods_unknown: i32,
    /// The selector as a string (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Conditions (`Ready`, `ScalingLimited`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<metav1::Condition>,
}

/// Why an ExporterSet or VirtualTargetClass is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// A field of an ExporterSet is out of range or malformed.
    #[error("ExporterSet {name}: {field}: {reason}")]
    Field {
        /// The set's name.
        name: String,
        /// The field at fault (e.g. `spec.minReplicas`).
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A field of a VirtualTargetClass asks for what this controller does not do.
    #[error("VirtualTargetClass {name}: {field}: {reason}")]
    ClassField {
        /// The class's name.
        name: String,
        /// The field at fault (e.g. `spec.reclaimPolicy`).
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl PoolError {
    /// The field at fault and what is wrong with it (without the object's name).
    pub fn field_and_reason(&self) -> String {
        match self {
            Self::Field { field, reason, .. } | Self::ClassField { field, reason, .. } => {
                format!("{field}: {reason}")
            }
        }
    }
}

impl VirtualTargetClassSpec {
    /// `bindingMode` is `WaitForFirstConsumer`: replicas are made only for waiting leases.
    pub fn waits_for_first_consumer(&self) -> bool {
        self.binding_mode == Some(BindingMode::WaitForFirstConsumer)
    }

    /// Refuses what no provisioner here honours, naming the field: `reclaimPolicy: Retain`
    /// (a replica's process or Pod and its config always go with it), `caBundleConfigMapRef`
    /// and `credentialsSecretRef` (no provisioner here injects them), and, for the `local`
    /// provisioner, which runs `jmp run` processes, `images`, `scheduling` and `parameters`.
    pub fn validate(&self, name: &str) -> Result<(), PoolError> {
        let bad = |field: &'static str, reason: &str| PoolError::ClassField {
            name: name.to_string(),
            field,
            reason: reason.to_string(),
        };
        if self.provisioner.is_empty() {
            return Err(bad("spec.provisioner", "must not be empty"));
        }
        if self.reclaim_policy == Some(ReclaimPolicy::Retain) {
            return Err(bad(
                "spec.reclaimPolicy",
                "Retain is not supported: a removed replica's process or Pod and its config \
                 are always deleted (Delete)",
            ));
        }
        if self.ca_bundle_config_map_ref.is_some() {
            return Err(bad(
                "spec.caBundleConfigMapRef",
                "not supported: each replica's exporter config carries the CA of the \
                 controller's endpoint; remove the field",
            ));
        }
        if self.credentials_secret_ref.is_some() {
            return Err(bad(
                "spec.credentialsSecretRef",
                "not supported: no provisioner here injects backend credentials; remove the \
                 field",
            ));
        }
        if self.provisioner == PROVISIONER_LOCAL {
            for (field, set) in [
                ("spec.images", self.images.is_some()),
                ("spec.scheduling", self.scheduling.is_some()),
                ("spec.parameters", self.parameters.is_some()),
            ] {
                if set {
                    return Err(bad(
                        field,
                        "the local provisioner runs `jmp run` processes on the controller's \
                         machine and has no use for it; remove the field",
                    ));
                }
            }
        }
        Ok(())
    }
}

impl ExporterSetSpec {
    /// What [`Self::validate`] cannot check alone: fields of the set that its class's
    /// provisioner has no use for (`images` and `parameters` with the `local` provisioner).
    pub fn validate_with_class(
        &self,
        name: &str,
        class: &VirtualTargetClassSpec,
    ) -> Result<(), PoolError> {
        if class.provisioner == PROVISIONER_LOCAL {
            for (field, set) in [
                ("spec.images", self.images.is_some()),
                ("spec.parameters", self.parameters.is_some()),
            ] {
                if set {
                    return Err(PoolError::Field {
                        name: name.to_string(),
                        field,
                        reason: "its class's local provisioner runs `jmp run` processes and \
                                 has no use for it; remove the field"
                            .to_string(),
                    });
                }
            }
        }
        Ok(())
    }
}

impl ExporterSetSpec {
    /// `minReplicas` (default 0).
    pub fn min(&self) -> i32 {
        self.min_replicas.unwrap_or(0)
    }

    /// `maxReplicas` (default 4; 0 means no bound, returned as `i32::MAX`).
    pub fn max(&self) -> i32 {
        match self.max_replicas.unwrap_or(4) {
            0 => i32::MAX,
            n => n,
        }
    }

    /// `minAvailableReplicas` (default 0).
    pub fn min_available(&self) -> i32 {
        self.min_available_replicas.unwrap_or(0)
    }

    /// `recycleStrategy` (default `ExitAndReplace`).
    pub fn recycle(&self) -> RecycleStrategy {
        self.recycle_strategy.unwrap_or_default()
    }

    /// `scaleDownCooldown` (default 5 minutes); a malformed one is an error naming it.
    pub fn cooldown(&self, name: &str) -> Result<SignedDuration, PoolError> {
        match &self.scale_down_cooldown {
            None => Ok(SignedDuration::from_mins(5)),
            Some(s) => GoDuration::parse(s)
                .map(|d| d.0)
                .map_err(|e| PoolError::Field {
                    name: name.to_string(),
                    field: "spec.scaleDownCooldown",
                    reason: e.to_string(),
                })
                .and_then(|d| {
                    if d.is_negative() {
                        Err(PoolError::Field {
                            name: name.to_string(),
                            field: "spec.scaleDownCooldown",
                            reason: format!("{s:?} is negative"),
                        })
                    } else {
                        Ok(d)
                    }
                }),
        }
    }

    /// Checks what upstream's CRD checks (ranges, min <= max, names, type xor ref) plus that
    /// the selector matches the template's labels; the first problem found, naming its field.
    pub fn validate(&self, name: &str) -> Result<(), PoolError> {
        let bad = |field: &'static str, reason: String| PoolError::Field {
            name: name.to_string(),
            field,
            reason,
        };
        if self.virtual_target_class_name.is_empty() {
            return Err(bad(
                "spec.virtualTargetClassName",
                "must not be empty".into(),
            ));
        }
        for (field, v) in [
            ("spec.minReplicas", self.min_replicas),
            ("spec.maxReplicas", self.max_replicas),
            ("spec.minAvailableReplicas", self.min_available_replicas),
        ] {
            if let Some(n) = v
                && n < 0
            {
                return Err(bad(field, format!("{n} is negative")));
            }
        }
        if self.min() > self.max() {
            return Err(bad(
                "spec.minReplicas",
                "minReplicas must be less than or equal to maxReplicas (when maxReplicas is not 0)"
                    .into(),
            ));
        }
        if self.min_available() > self.max() {
            return Err(bad(
                "spec.minAvailableReplicas",
                "minAvailableReplicas must be less than or equal to maxReplicas (when maxReplicas is not 0)"
                    .into(),
            ));
        }
        self.cooldown(name)?;
        let mut seen = std::collections::BTreeSet::new();
        let drivers = self
            .template
            .spec
            .as_ref()
            .and_then(|s| s.drivers.as_deref())
            .unwrap_or(&[]);
        for d in drivers {
            if d.name.is_empty() {
                return Err(bad("spec.template.spec.drivers", "name is required".into()));
            }
            if !seen.insert(d.name.as_str()) {
                return Err(bad(
                    "spec.template.spec.drivers",
                    format!("driver name {:?} is used twice", d.name),
                ));
            }
            match (&d.type_, &d.ref_) {
                (None, None) => {
                    return Err(bad(
                        "spec.template.spec.drivers",
                        format!("driver {:?}: either type or ref must be set", d.name),
                    ));
                }
                (Some(_), Some(_)) => {
                    return Err(bad(
                        "spec.template.spec.drivers",
                        format!("driver {:?}: type and ref are mutually exclusive", d.name),
                    ));
                }
                (None, Some(_)) if d.config.is_some() => {
                    return Err(bad(
                        "spec.template.spec.drivers",
                        format!("driver {:?}: ref entries must not have config", d.name),
                    ));
                }
                _ => {}
            }
        }
        let labels = self
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        let selector = super::selector::LabelSelector::from_k8s(&self.selector)
            .map_err(|e| bad("spec.selector", e.to_string()))?;
        if selector.is_empty() {
            return Err(bad(
                "spec.selector",
                "must select something (an empty selector would own every exporter)".into(),
            ));
        }
        if !selector.matches(&labels) {
            return Err(bad(
                "spec.selector",
                "does not match the template's labels (spec.template.metadata.labels)".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(yaml: &str) -> ExporterSet {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const POOL: &str = r#"
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata:
  name: mock-pool
  namespace: default
spec:
  virtualTargetClassName: local
  maxReplicas: 3
  minAvailableReplicas: 1
  scaleDownCooldown: 10s
  selector:
    matchLabels:
      pool: mock
  template:
    metadata:
      labels:
        pool: mock
    spec:
      drivers:
        - name: power
          type: jumpstarter_driver_power.driver.MockPower
"#;

    #[test]
    fn upstream_yaml_reads_with_defaults() {
        let s = set(POOL);
        assert_eq!(s.spec.max(), 3);
        assert_eq!(s.spec.min(), 0);
        assert_eq!(s.spec.min_available(), 1);
        assert_eq!(s.spec.recycle(), RecycleStrategy::ExitAndReplace);
        assert_eq!(
            s.spec.cooldown("mock-pool").unwrap(),
            SignedDuration::from_secs(10)
        );
        s.spec.validate("mock-pool").unwrap();
    }

    #[test]
    fn bad_sets_are_refused_naming_the_field() {
        let mut s = set(POOL).spec;
        s.min_replicas = Some(5);
        assert!(
            matches!(s.validate("p"), Err(PoolError::Field { field, .. }) if field == "spec.minReplicas")
        );
        let mut s = set(POOL).spec;
        s.max_replicas = Some(0);
        s.min_replicas = Some(5);
        s.validate("p").unwrap(); // 0 means no upper bound
        let mut s = set(POOL).spec;
        s.scale_down_cooldown = Some("soon".into());
        assert!(s.validate("p").is_err());
        let mut s = set(POOL).spec;
        s.selector.match_labels = Some([("pool".to_string(), "other".to_string())].into());
        assert!(
            matches!(s.validate("p"), Err(PoolError::Field { field, .. }) if field == "spec.selector")
        );
        let mut s = set(POOL).spec;
        s.template.spec.as_mut().unwrap().drivers.as_mut().unwrap()[0].ref_ = Some("x".into());
        assert!(s.validate("p").is_err());
    }

    #[test]
    fn class_fields_no_provisioner_honours_are_refused_naming_them() {
        let class =
            |yaml: &str| -> VirtualTargetClassSpec { serde_saphyr::from_str(yaml).unwrap() };
        let field = |r: Result<(), PoolError>| match r {
            Err(PoolError::ClassField { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        class("provisioner: local\nbindingMode: WaitForFirstConsumer\nreclaimPolicy: Delete")
            .validate("c")
            .unwrap();
        assert_eq!(
            field(class("provisioner: local\nreclaimPolicy: Retain").validate("c")),
            "spec.reclaimPolicy"
        );
        assert_eq!(
            field(
                class("provisioner: qemu.jumpstarter.dev\ncredentialsSecretRef: {name: x}")
                    .validate("c")
            ),
            "spec.credentialsSecretRef"
        );
        assert_eq!(
            field(
                class("provisioner: qemu.jumpstarter.dev\ncaBundleConfigMapRef: {name: x}")
                    .validate("c")
            ),
            "spec.caBundleConfigMapRef"
        );
        assert_eq!(
            field(class("provisioner: local\nparameters: {a: 1}").validate("c")),
            "spec.parameters"
        );
        class("provisioner: qemu.jumpstarter.dev\nparameters: {a: 1}\nscheduling: {nodeSelector: {a: b}}")
            .validate("c")
            .unwrap();
        let mut s = set(POOL).spec;
        s.parameters = Some(Parameters(serde_json::json!({"a": 1})));
        assert!(
            s.validate_with_class("p", &class("provisioner: local"))
                .is_err()
        );
        s.validate_with_class("p", &class("provisioner: qemu.jumpstarter.dev"))
            .unwrap();
    }

    #[test]
    fn set_parameters_merge_over_the_class() {
        let class =
            Parameters(serde_json::json!({"resources": {"cpu": 4, "memory": "4Gi"}, "a": 1}));
        let set = Parameters(serde_json::json!({"resources": {"memory": "8Gi"}}));
        assert_eq!(
            set.merged_over(&class).0,
            serde_json::json!({"resources": {"cpu": 4, "memory": "8Gi"}, "a": 1})
        );
    }
}
