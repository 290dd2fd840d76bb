//! The controller's objects (`jumpstarter.dev/v1alpha1` Client, Exporter, Lease and
//! ExporterAccessPolicy), field-compatible with the upstream CRDs, plus the pure conversions the
//! services need: object ↔ protobuf, lease time reconciliation and tag validation.

pub(crate) mod duration;
pub(crate) mod selector;
pub mod sharing;
pub mod virtualtarget;

use std::collections::{BTreeMap, HashMap};

use jiff::{SignedDuration, Timestamp};
use jumpstarter_proto::{client_v1, v1 as pb};
use k8s_openapi::api::core::v1::LocalObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use duration::GoDuration;
use selector::{LabelSelector, SelectorError};

/// The API group of every kind here.
pub const GROUP: &str = "jumpstarter.dev";
/// The API version of every kind here.
pub const VERSION: &str = "v1alpha1";

/// Lease condition types and reasons, and exporter condition types and reasons (upstream's).
pub mod conditions {
    /// Lease condition: waiting for an exporter.
    pub const PENDING: &str = "Pending";
    /// Lease condition: an exporter is assigned (True) or the lease ended (False).
    pub const READY: &str = "Ready";
    /// Lease condition: the request can never be satisfied; the lease ends.
    pub const UNSATISFIABLE: &str = "Unsatisfiable";
    /// Lease condition: the request is malformed; the lease ends.
    pub const INVALID: &str = "Invalid";

    /// `Invalid`: neither a selector nor an exporter name was given.
    pub const REASON_INVALID_SELECTOR: &str = "InvalidSelector";
    /// `Unsatisfiable`: the pinned exporter does not exist.
    pub const REASON_EXPORTER_NOT_FOUND: &str = "ExporterNotFound";
    /// `Unsatisfiable`: the pinned exporter does not match the selector.
    pub const REASON_SELECTOR_MISMATCH: &str = "SelectorMismatch";
    /// `Unsatisfiable`: the pinned exporter is disabled.
    pub const REASON_EXPORTER_DISABLED: &str = "ExporterDisabled";
    /// `Unsatisfiable`: every matching exporter is disabled.
    pub const REASON_ALL_DISABLED: &str = "AllDisabled";
    /// `Unsatisfiable`: no access policy lets this client use a matching exporter.
    pub const REASON_NO_ACCESS: &str = "NoAccess";
    /// `Unsatisfiable`: the best grant is spot access, which is not implemented.
    pub const REASON_SPOT_ACCESS: &str = "SpotAccess";
    /// `Pending`: no approved exporter is online.
    pub const REASON_OFFLINE: &str = "Offline";
    /// `Pending`: every approved exporter is leased.
    pub const REASON_NOT_AVAILABLE: &str = "NotAvailable";
    /// `Pending`: free exporters are still cleaning up after a previous lease.
    pub const REASON_NOT_READY: &str = "NotReady";
    /// `Pending`: every approved, online and free exporter is unhealthy (quarantined).
    pub const REASON_UNHEALTHY: &str = "Unhealthy";
    /// `Ready=True`: an exporter was acquired.
    pub const REASON_READY: &str = "Ready";
    /// `Ready=False`: the lease was released.
    pub const REASON_RELEASED: &str = "Released";
    /// `Ready=False`: the lease reached its end time.
    pub const REASON_EXPIRED: &str = "Expired";

    /// Exporter condition: the exporter is connected.
    pub const ONLINE: &str = "Online";
    /// Exporter condition: the exporter has registered its devices.
    pub const REGISTERED: &str = "Registered";
    /// `Online`: computed from `status.lastSeen`.
    pub const REASON_SEEN: &str = "Seen";
    /// `Online`: set by `ReportStatus`.
    pub const REASON_STATUS_REPORTED: &str = "StatusReported";
    /// `Registered=True`.
    pub const REASON_REGISTER: &str = "Register";
    /// `Registered=False`.
    pub const REASON_UNREGISTER: &str = "Unregister";
    /// Exporter condition (ours, not upstream's): `False` once the exporter reported itself
    /// unhealthy (`[UNHEALTHY] ...` status message, see `docs/hooks.md`); the scheduler
    /// leases it to nobody until an admin clears it. Absent: healthy.
    pub const HEALTHY: &str = "Healthy";
    /// `Healthy=False`: the health check failed too often in a row.
    pub const REASON_HEALTH_CHECK_FAILED: &str = "HealthCheckFailed";
    /// `Healthy=False`: the lease hooks failed too often in a row.
    pub const REASON_HOOK_FAILED: &str = "HookFailed";
    /// `Healthy=False`: the exporter said it is unhealthy, for another reason.
    pub const REASON_REPORTED_UNHEALTHY: &str = "ReportedUnhealthy";
    /// `Healthy=True`: an admin cleared the quarantine.
    pub const REASON_CLEARED: &str = "Cleared";

    /// Condition status `True`.
    pub const TRUE: &str = "True";
    /// Condition status `False`.
    pub const FALSE: &str = "False";
}

/// Label set on a lease once it has ended.
pub const LEASE_ENDED_LABEL: &str = "jumpstarter.dev/lease-ended";
/// Prefix of the labels that mirror a lease's tags.
pub const TAG_LABEL_PREFIX: &str = "metadata.jumpstarter.dev/";
/// Prefix of the exporter labels that the exporter itself manages (via `Register`).
pub const RESERVED_LABEL_PREFIX: &str = "jumpstarter.dev/";
/// Default `leasePolicy.maxTags`.
pub const DEFAULT_MAX_TAGS: usize = 10;
/// An exporter not seen for longer than this is offline.
pub const EXPORTER_OFFLINE_AFTER: SignedDuration = SignedDuration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Client

/// Desired state of a Client.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "jumpstarter.dev",
    version = "v1alpha1",
    kind = "Client",
    namespaced,
    status = "ClientStatus",
    printcolumn = r#"{"name":"Token Expires","type":"string","jsonPath":".status.tokenExpiresAt"}"#,
    derive = "PartialEq",
    derive = "Default",
    doc = "Client is the Schema for the clients API"
)]
#[serde(rename_all = "camelCase")]
pub struct ClientSpec {
    /// The identity of the client, used for authentication and authorization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
}

/// Observed state of a Client.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientStatus {
    /// Conditions (upstream main: `TokenExpiring`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<metav1::Condition>,
    /// The Secret holding the client's credentials (`<name>-client`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<LocalObjectReference>,
    /// The controller gRPC endpoint assigned to this client.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
    /// When the token this controller last issued to the client expires (upstream main).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_expires_at: Option<metav1::Time>,
}

/// The `TokenExpiring` condition of a Client (upstream main's `reconcileTokenExpiry`).
pub const TOKEN_EXPIRING: &str = "TokenExpiring";

/// Records that the client's token expires at `expires` (the one just issued, or the one
/// recorded) and sets `TokenExpiring` as upstream main does at `now`: True with reason
/// `Expired`, `ExpiresWithin7Days` or `ExpiresWithin30Days`, else False (`Valid`); the
/// message gives the date and the days left. Returns whether the status changed.
pub fn set_token_expiry(
    status: &mut ClientStatus,
    expires: Timestamp,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let at = Some(metav1::Time(expires));
    let mut changed = status.token_expires_at != at;
    status.token_expires_at = at;
    let when = expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let remaining = expires.duration_since(now);
    let days = remaining.as_secs() / 86_400;
    let (expiring, reason, message) = if remaining <= SignedDuration::ZERO {
        (true, "Expired", format!("Token expired on {when}"))
    } else if remaining <= SignedDuration::from_hours(7 * 24) {
        (
            true,
            "ExpiresWithin7Days",
            format!("Token expires on {when} ({days} days remaining)"),
        )
    } else if remaining <= SignedDuration::from_hours(30 * 24) {
        (
            true,
            "ExpiresWithin30Days",
            format!("Token expires on {when} ({days} days remaining)"),
        )
    } else {
        (
            false,
            "Valid",
            format!("Token expires on {when} ({days} days remaining)"),
        )
    };
    changed |= set_condition(
        &mut status.conditions,
        TOKEN_EXPIRING,
        expiring,
        reason,
        &message,
        generation,
        now,
    );
    changed
}

// ---------------------------------------------------------------------------------------------
// Exporter

/// Desired state of an Exporter.
#[allow(clippy::duplicated_attributes)] // repeated printcolumn(...) keys are by design
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "jumpstarter.dev",
    version = "v1alpha1",
    kind = "Exporter",
    namespaced,
    status = "ExporterStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Exporter is the Schema for the exporters API",
    printcolumn(name = "Enabled", type_ = "boolean", json_path = ".spec.enabled"),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.exporterStatus"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.statusMessage",
        priority = "1"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ExporterSpec {
    /// The identity of the exporter, used for authentication and authorization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Whether the exporter may be leased; unset counts as enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = true))]
    pub enabled: Option<bool>,
}

/// The status an exporter reports (`status.exporterStatus`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ExporterStatusValue {
    /// Not reported (old exporters never report).
    Unspecified,
    /// Shut down or connection lost.
    Offline,
    /// Free for a new lease.
    Available,
    /// Running the beforeLease hook.
    BeforeLeaseHook,
    /// Leased and ready for commands.
    LeaseReady,
    /// Running the afterLease hook.
    AfterLeaseHook,
    /// The beforeLease hook failed.
    BeforeLeaseHookFailed,
    /// The afterLease hook failed.
    AfterLeaseHookFailed,
}

impl ExporterStatusValue {
    /// The CRD string (PascalCase).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "Unspecified",
            Self::Offline => "Offline",
            Self::Available => "Available",
            Self::BeforeLeaseHook => "BeforeLeaseHook",
            Self::LeaseReady => "LeaseReady",
            Self::AfterLeaseHook => "AfterLeaseHook",
            Self::BeforeLeaseHookFailed => "BeforeLeaseHookFailed",
            Self::AfterLeaseHookFailed => "AfterLeaseHookFailed",
        }
    }

    /// Parse the CRD string; `None` for anything else (including `""`).
    pub fn from_str_opt(s: &str) -> Option<Self> {
        Some(match s {
            "Unspecified" => Self::Unspecified,
            "Offline" => Self::Offline,
            "Available" => Self::Available,
            "BeforeLeaseHook" => Self::BeforeLeaseHook,
            "LeaseReady" => Self::LeaseReady,
            "AfterLeaseHook" => Self::AfterLeaseHook,
            "BeforeLeaseHookFailed" => Self::BeforeLeaseHookFailed,
            "AfterLeaseHookFailed" => Self::AfterLeaseHookFailed,
            _ => return None,
        })
    }
}

impl From<pb::ExporterStatus> for ExporterStatusValue {
    fn from(s: pb::ExporterStatus) -> Self {
        match s {
            pb::ExporterStatus::Unspecified => Self::Unspecified,
            pb::ExporterStatus::Offline => Self::Offline,
            pb::ExporterStatus::Available => Self::Available,
            pb::ExporterStatus::BeforeLeaseHook => Self::BeforeLeaseHook,
            pb::ExporterStatus::LeaseReady => Self::LeaseReady,
            pb::ExporterStatus::AfterLeaseHook => Self::AfterLeaseHook,
            pb::ExporterStatus::BeforeLeaseHookFailed => Self::BeforeLeaseHookFailed,
            pb::ExporterStatus::AfterLeaseHookFailed => Self::AfterLeaseHookFailed,
        }
    }
}

impl From<ExporterStatusValue> for pb::ExporterStatus {
    fn from(s: ExporterStatusValue) -> Self {
        match s {
            ExporterStatusValue::Unspecified => Self::Unspecified,
            ExporterStatusValue::Offline => Self::Offline,
            ExporterStatusValue::Available => Self::Available,
            ExporterStatusValue::BeforeLeaseHook => Self::BeforeLeaseHook,
            ExporterStatusValue::LeaseReady => Self::LeaseReady,
            ExporterStatusValue::AfterLeaseHook => Self::AfterLeaseHook,
            ExporterStatusValue::BeforeLeaseHookFailed => Self::BeforeLeaseHookFailed,
            ExporterStatusValue::AfterLeaseHookFailed => Self::AfterLeaseHookFailed,
        }
    }
}

/// The proto enum for an optional status (`None`, i.e. `""`, is UNSPECIFIED).
pub fn exporter_status_to_proto(s: Option<ExporterStatusValue>) -> pb::ExporterStatus {
    s.map_or(pb::ExporterStatus::Unspecified, Into::into)
}

/// The status for a raw proto enum number; unknown numbers are an error naming the number.
pub fn exporter_status_from_proto(n: i32) -> Result<ExporterStatusValue, ObjectError> {
    pb::ExporterStatus::try_from(n)
        .map(Into::into)
        .map_err(|_| ObjectError::UnknownExporterStatus(n))
}

/// Observed state of an Exporter.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExporterStatus {
    /// Conditions (`Online`, `Registered`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<metav1::Condition>,
    /// The Secret holding the exporter's credentials (`<name>-exporter`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<LocalObjectReference>,
    /// The devices registered by the exporter; `None` when unregistered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<Device>>,
    /// The active lease assigned to this exporter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ref: Option<LocalObjectReference>,
    /// When the exporter was last seen (status stream heartbeat or report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<metav1::Time>,
    /// The controller endpoint the exporter is reachable through.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
    /// The status the exporter reported; `None` is upstream's `""`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "empty_status_as_none"
    )]
    pub exporter_status: Option<ExporterStatusValue>,
    /// Human-readable detail of the status.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status_message: String,
}

/// `""` (written by other implementations for "no status") deserialises as `None`.
fn empty_status_as_none<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<ExporterStatusValue>, D::Error> {
    let s = Option::<String>::deserialize(d)?;
    match s.as_deref() {
        None | Some("") => Ok(None),
        Some(v) => ExporterStatusValue::from_str_opt(v)
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown exporterStatus {v:?}"))),
    }
}

/// One device (driver instance) an exporter registered.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Device {
    /// The driver instance's uuid.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    /// The parent instance's uuid, for child devices (JSON name `parent_uuid`, as upstream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_uuid: Option<String>,
    /// The driver instance's labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl Exporter {
    /// `spec.enabled` unset or true.
    pub fn is_enabled(&self) -> bool {
        self.spec.enabled.unwrap_or(true)
    }

    /// The labels (empty when unset).
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.metadata.labels.clone().unwrap_or_default()
    }

    /// The labels, borrowed (empty when unset): for matching without copying.
    pub fn label_map(&self) -> &BTreeMap<String, String> {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        self.metadata.labels.as_ref().unwrap_or(&NONE)
    }

    /// Whether the stored condition `type_` is True.
    pub fn condition_is_true(&self, type_: &str) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| condition_is_true(&s.conditions, type_))
    }

    /// The `Healthy=False` condition of a quarantined exporter (`None`: healthy).
    pub fn unhealthy(&self) -> Option<&metav1::Condition> {
        self.status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, conditions::HEALTHY))
            .filter(|c| c.status == conditions::FALSE)
    }
}

/// The `Online` condition (and forced status) that the Exporter reconciler derives from
/// `status.lastSeen` and `status.exporterStatus` at `now` (§4.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnlineState {
    /// Condition status.
    pub online: bool,
    /// Condition reason.
    pub reason: &'static str,
    /// Condition message.
    pub message: String,
    /// Set when the reconciler must force `exporterStatus=Offline` with this status message.
    pub force_offline_message: Option<&'static str>,
}

/// Compute the exporter's `Online` condition at `now` (§4.2).
pub fn exporter_online_state(status: Option<&ExporterStatus>, now: Timestamp) -> OnlineState {
    let last_seen = status.and_then(|s| s.last_seen.as_ref()).map(|t| t.0);
    match last_seen {
        None => OnlineState {
            online: false,
            reason: conditions::REASON_SEEN,
            message: "Never seen".into(),
            force_offline_message: None,
        },
        Some(seen) if now.duration_since(seen) > EXPORTER_OFFLINE_AFTER => OnlineState {
            online: false,
            reason: conditions::REASON_SEEN,
            message: "Last seen more than 1 minute ago".into(),
            force_offline_message: Some("Connection lost - last seen more than 1 minute ago"),
        },
        Some(_) if status.and_then(|s| s.exporter_status) == Some(ExporterStatusValue::Offline) => {
            OnlineState {
                online: false,
                reason: conditions::REASON_OFFLINE,
                message: status.map(|s| s.status_message.clone()).unwrap_or_default(),
                force_offline_message: None,
            }
        }
        Some(_) => OnlineState {
            online: true,
            reason: conditions::REASON_SEEN,
            message: "Last seen less than 1 minute ago".into(),
            force_offline_message: None,
        },
    }
}

/// An object's `(namespace, name)`, borrowed; `None` when either is unset.
pub fn meta_key(m: &metav1::ObjectMeta) -> Option<(&str, &str)> {
    Some((m.namespace.as_deref()?, m.name.as_deref()?))
}

/// (namespace, name) of an object.
pub type ObjectKey = (String, String);

/// The [`ObjectKey`] of an exporter (empty strings for unset fields).
pub fn exporter_key(e: &Exporter) -> ObjectKey {
    (
        e.metadata.namespace.clone().unwrap_or_default(),
        e.metadata.name.clone().unwrap_or_default(),
    )
}

/// Whether `a`'s resourceVersion is older than `b`'s (both numeric; otherwise unknown, false).
pub fn older_version(a: &Exporter, b: &Exporter) -> bool {
    let rv = |e: &Exporter| {
        e.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    matches!((rv(a), rv(b)), (Some(x), Some(y)) if x < y)
}

/// Whether the exporter is registered (`status.devices` set; §4.2 `Registered`).
pub fn exporter_registered(status: Option<&ExporterStatus>) -> bool {
    status.is_some_and(|s| s.devices.is_some())
}

// ---------------------------------------------------------------------------------------------
// Lease

/// Desired state of a Lease.
#[allow(clippy::duplicated_attributes)] // repeated printcolumn(...) keys are by design
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "jumpstarter.dev",
    version = "v1alpha1",
    kind = "Lease",
    namespaced,
    status = "LeaseStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Lease is the Schema for the leases API",
    printcolumn(name = "Ended", type_ = "boolean", json_path = ".status.ended"),
    printcolumn(name = "Client", type_ = "string", json_path = ".spec.clientRef.name"),
    printcolumn(
        name = "Exporter",
        type_ = "string",
        json_path = ".status.exporterRef.name"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "message": "one of selector or exporterRef.name is required",
        "rule": "((has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || (has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)) || (has(self.exporterRef) && has(self.exporterRef.name) && size(self.exporterRef.name) > 0)"
    },
    {
        "message": "tags are immutable after creation",
        "rule": "!has(oldSelf.tags) || self.tags == oldSelf.tags"
    },
    {
        "message": "context is immutable once set",
        "rule": "!has(oldSelf.context) || self.context == oldSelf.context"
    }
]))]
pub struct LeaseSpec {
    /// The client that is requesting the lease.
    pub client_ref: LocalObjectReference,
    /// The requested duration; may be omitted when both beginTime and endTime are given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<GoDuration>,
    /// The selector for the exporter to be used.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub selector: metav1::LabelSelector,
    /// Optionally pin this lease to a specific exporter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter_ref: Option<LocalObjectReference>,
    /// User metadata, immutable once set.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 10))]
    pub tags: BTreeMap<String, String>,
    /// With exporterRef: allow leasing a disabled exporter.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_disabled: bool,
    /// Requests the controller to end the lease now.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub release: bool,
    /// Requested start time (the lease is not scheduled before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin_time: Option<metav1::Time>,
    /// Requested end time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<metav1::Time>,
    /// Other clients of the lease's namespace that may use the lease as its owner does (dial,
    /// extend, release); only the owner changes this list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 10))]
    pub shared_with: Vec<String>,
    /// What the client says the lease is for (build id, image digest, VCS ref: at most
    /// [`MAX_CONTEXT_ENTRIES`] entries), immutable once set; bound into every log line of
    /// the lease (upstream main's `spec.context`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 8))]
    pub context: BTreeMap<String, String>,
}

/// Observed state of a Lease.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = require_ended)]
pub struct LeaseStatus {
    /// The actual start time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin_time: Option<metav1::Time>,
    /// The actual end time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<metav1::Time>,
    /// The exporter assigned to this lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter_ref: Option<LocalObjectReference>,
    /// Whether the lease has been terminated (always serialised; required in the schema).
    #[serde(default)]
    pub ended: bool,
    /// The effective priority from the access policy.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(schema_with = "integer_schema")]
    pub priority: i64,
    /// Whether the lease was granted with spot (preemptible) access.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spot_access: bool,
    /// Conditions (`Pending`, `Ready`, `Unsatisfiable`, `Invalid`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<metav1::Condition>,
}

/// Upstream's schema requires `ended`; ours reads a missing one as false, so mark it by hand.
fn require_ended(schema: &mut schemars::Schema) {
    schema.insert("required".to_string(), serde_json::json!(["ended"]));
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Go `int`: `type: integer` without a format, as controller-gen writes it.
fn integer_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "integer" })
}

impl Lease {
    /// `status.ended`.
    pub fn is_ended(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.ended)
    }

    /// The assigned exporter's name, if any.
    pub fn assigned_exporter(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.exporter_ref.as_ref())
            .map(|r| r.name.as_str())
    }

    /// The requested duration, or `spec.endTime - spec.beginTime` when both are set.
    pub fn requested_duration(&self) -> Option<SignedDuration> {
        self.spec.duration.map(|d| d.0).or_else(|| {
            match (&self.spec.begin_time, &self.spec.end_time) {
                (Some(b), Some(e)) => Some(e.0.duration_since(b.0)),
                _ => None,
            }
        })
    }

    /// When the lease expires once begun (§4.3 (3)): `spec.endTime`, else
    /// `spec.beginTime + duration`, else `status.beginTime + duration`. `None` if not begun.
    pub fn expiration(&self) -> Option<Timestamp> {
        self.expiration_with(self.status.as_ref())
    }

    /// [`Self::expiration`] as if the lease had `status` (the scheduler's new status of it,
    /// without copying the lease).
    pub fn expiration_with(&self, status: Option<&LeaseStatus>) -> Option<Timestamp> {
        let begun = status.and_then(|s| s.begin_time.as_ref())?;
        if let Some(end) = &self.spec.end_time {
            return Some(end.0);
        }
        let duration = self.spec.duration?.0;
        let base = self.spec.begin_time.as_ref().unwrap_or(begun).0;
        Some(base.saturating_add(duration).unwrap_or(Timestamp::MAX))
    }
}

// ---------------------------------------------------------------------------------------------
// ExporterAccessPolicy

/// Desired state of an ExporterAccessPolicy.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "jumpstarter.dev",
    version = "v1alpha1",
    kind = "ExporterAccessPolicy",
    plural = "exporteraccesspolicies",
    namespaced,
    status = "ExporterAccessPolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "ExporterAccessPolicy defines which clients may lease which exporters, with which priority and maximum duration"
)]
#[serde(rename_all = "camelCase")]
pub struct ExporterAccessPolicySpec {
    /// The exporters this policy applies to.
    #[serde(default)]
    pub exporter_selector: metav1::LabelSelector,
    /// The rules, each granting some clients access.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<Policy>,
}

/// One access rule of a policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    /// Shown in "no access" messages.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Higher values win.
    #[serde(default)]
    #[schemars(schema_with = "integer_schema")]
    pub priority: i64,
    /// The clients this rule applies to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<PolicyFrom>,
    /// Leases asking for longer are not granted by this rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum_duration: Option<GoDuration>,
    /// Grants preemptible access (not implemented upstream: such grants are unsatisfiable).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spot_access: bool,
}

/// A client match of a policy rule (upstream's `From`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyFrom {
    /// Selects clients by their labels.
    #[serde(default)]
    pub client_selector: metav1::LabelSelector,
}

/// Observed state of an ExporterAccessPolicy (empty).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ExporterAccessPolicyStatus {}

// ---------------------------------------------------------------------------------------------
// Errors

/// Why an object could not be built or converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// CreateLease without selector and exporter name (gRPC INVALID_ARGUMENT upstream).
    #[error("one of selector or exporter_name is required")]
    SelectorOrExporterRequired,
    /// A bad lease context (INVALID_ARGUMENT).
    #[error("invalid lease context: {0}")]
    InvalidContext(String),
    /// Bad tags (gRPC INVALID_ARGUMENT upstream).
    #[error("invalid lease tags: {0}")]
    InvalidTags(String),
    /// The selector string does not parse (plain error, UNKNOWN upstream).
    #[error(transparent)]
    Selector(#[from] SelectorError),
    /// Inconsistent begin/end/duration (plain error, UNKNOWN upstream).
    #[error("invalid lease times: {0}")]
    Time(String),
    /// A proto enum number that is not an ExporterStatus.
    #[error("unknown exporter status {0}")]
    UnknownExporterStatus(i32),
}

// ---------------------------------------------------------------------------------------------
// Conditions

/// Whether the condition `type_` is present with status True.
pub fn condition_is_true(conds: &[metav1::Condition], type_: &str) -> bool {
    conds.iter().any(|c| c.type_ == type_ && c.status == "True")
}

/// Find the condition `type_`.
pub fn find_condition<'a>(
    conds: &'a [metav1::Condition],
    type_: &str,
) -> Option<&'a metav1::Condition> {
    conds.iter().find(|c| c.type_ == type_)
}

/// Set a condition like `meta.SetStatusCondition`: the transition time only changes when the
/// status does. Returns whether anything changed.
pub fn set_condition(
    conds: &mut Vec<metav1::Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let status = if status {
        conditions::TRUE
    } else {
        conditions::FALSE
    };
    match conds.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let before = c.clone();
            if c.status != status {
                c.status = status.to_string();
                c.last_transition_time = metav1::Time(now);
            }
            c.reason = reason.to_string();
            c.message = message.to_string();
            c.observed_generation = observed_generation;
            *c != before
        }
        None => {
            conds.push(metav1::Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message: message.to_string(),
                observed_generation,
                last_transition_time: metav1::Time(now),
            });
            true
        }
    }
}

/// Convert a condition to the protobuf form (every optional field set, as upstream).
pub fn condition_to_proto(c: &metav1::Condition) -> pb::Condition {
    pb::Condition {
        r#type: Some(c.type_.clone()),
        status: Some(c.status.clone()),
        observed_generation: Some(c.observed_generation.unwrap_or(0)),
        last_transition_time: Some(pb::Time {
            seconds: Some(c.last_transition_time.0.as_second()),
            nanos: Some(c.last_transition_time.0.subsec_nanosecond()),
        }),
        reason: Some(c.reason.clone()),
        message: Some(c.message.clone()),
    }
}

// ---------------------------------------------------------------------------------------------
// Names and times

/// `namespaces/<ns>/leases/<name>`.
pub fn lease_resource_name(namespace: &str, name: &str) -> String {
    format!("namespaces/{namespace}/leases/{name}")
}

/// `namespaces/<ns>/exporters/<name>`.
pub fn exporter_resource_name(namespace: &str, name: &str) -> String {
    format!("namespaces/{namespace}/exporters/{name}")
}

/// `namespaces/<ns>/clients/<name>`.
pub fn client_resource_name(namespace: &str, name: &str) -> String {
    format!("namespaces/{namespace}/clients/{name}")
}

/// A Kubernetes time as a protobuf timestamp.
pub fn timestamp_to_proto(t: Timestamp) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.as_second(),
        nanos: t.subsec_nanosecond(),
    }
}

/// A protobuf timestamp as a time, truncated to whole seconds (what Kubernetes stores), or an
/// error naming `field` when out of range.
pub fn timestamp_from_proto(
    t: &prost_types::Timestamp,
    field: &str,
) -> Result<Timestamp, ObjectError> {
    Timestamp::from_second(t.seconds)
        .map_err(|e| ObjectError::Time(format!("{field} {}s is out of range: {e}", t.seconds)))
}

fn signed_to_proto(d: SignedDuration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs(),
        nanos: d.subsec_nanos(),
    }
}

// ---------------------------------------------------------------------------------------------
// Protobuf conversions

/// `Exporter.ToProtobuf()`: name, labels, online, status, message, enabled. Hidden and deprecated
/// label handling is the service's job.
pub fn exporter_to_proto(e: &Exporter) -> client_v1::Exporter {
    let namespace = e.metadata.namespace.as_deref().unwrap_or_default();
    let name = e.metadata.name.as_deref().unwrap_or_default();
    let status = e.status.as_ref();
    #[allow(deprecated)] // `online` is deprecated in the proto but still filled upstream.
    client_v1::Exporter {
        name: exporter_resource_name(namespace, name),
        labels: e.labels().into_iter().collect(),
        online: e.condition_is_true(conditions::ONLINE),
        status: exporter_status_to_proto(status.and_then(|s| s.exporter_status)) as i32,
        // A quarantined exporter's message says so (the `[UNHEALTHY]` convention of
        // `docs/hooks.md`): the client API has no field for it.
        status_message: match e.unhealthy() {
            Some(c) => format!("{}{}", jumpstarter_core::hooks::UNHEALTHY_PREFIX, c.message),
            None => status.map(|s| s.status_message.clone()).unwrap_or_default(),
        },
        enabled: Some(e.is_enabled()),
        deprecated_labels: HashMap::new(),
    }
}

/// What clients are shown of exporters' labels: the ConfigMap's `hiddenLabels.keys` and
/// `deprecatedLabels.keys` (key → message). Empty (the default) shows every label as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelPolicy {
    /// Label keys not shown to clients unless they ask (`show_hidden_labels`).
    pub hidden: std::collections::BTreeSet<String>,
    /// Label keys being phased out, each with the message that says what to use instead.
    pub deprecated: BTreeMap<String, String>,
}

impl LabelPolicy {
    /// Applies the policy to an exporter as the client API returns it, in upstream's order:
    /// each deprecated key the exporter carries is reported in `deprecated_labels` with its
    /// message; then, unless `show_hidden`, the hidden and the deprecated keys, and every key
    /// under `hidden.jumpstarter.dev/` (ours), are taken out of `labels`. The labels stay on the object: selectors still match them.
    pub fn apply(&self, exporter: &mut client_v1::Exporter, show_hidden: bool) {
        for (key, message) in &self.deprecated {
            if exporter.labels.contains_key(key) {
                exporter
                    .deprecated_labels
                    .insert(key.clone(), message.clone());
            }
        }
        if !show_hidden {
            exporter.labels.retain(|k, _| {
                !self.hidden.contains(k)
                    && !self.deprecated.contains_key(k)
                    && !jumpstarter_core::labels::is_hidden_label(k)
            });
        }
    }

    /// Reports in `deprecated_labels` each deprecated key the lease's selector uses, with
    /// its message (upstream main's `annotateLeaseDeprecatedLabels`).
    pub fn annotate_lease(&self, lease: &mut client_v1::Lease) {
        if self.deprecated.is_empty() {
            return;
        }
        let Ok(selector) = LabelSelector::parse(&lease.selector) else {
            return;
        };
        for r in selector.requirements() {
            if let Some(message) = self.deprecated.get(&r.key) {
                lease
                    .deprecated_labels
                    .insert(r.key.clone(), message.clone());
            }
        }
    }
}

/// `Lease.ToProtobuf()` (§2.7 table). `now` is used for the effective duration of a running
/// lease.
pub fn lease_to_proto(l: &Lease, now: Timestamp) -> client_v1::Lease {
    let namespace = l.metadata.namespace.as_deref().unwrap_or_default();
    let name = l.metadata.name.as_deref().unwrap_or_default();
    let status = l.status.as_ref();
    let selector = LabelSelector::from_k8s(&l.spec.selector)
        .map_or_else(|_| "<error>".to_string(), |s| s.to_string());
    let begin = status.and_then(|s| s.begin_time.as_ref()).map(|t| t.0);
    let end = status.and_then(|s| s.end_time.as_ref()).map(|t| t.0);
    client_v1::Lease {
        name: lease_resource_name(namespace, name),
        selector,
        duration: l.spec.duration.map(Into::into),
        effective_duration: begin.map(|b| signed_to_proto(end.unwrap_or(now).duration_since(b))),
        begin_time: l.spec.begin_time.as_ref().map(|t| timestamp_to_proto(t.0)),
        effective_begin_time: begin.map(timestamp_to_proto),
        end_time: l.spec.end_time.as_ref().map(|t| timestamp_to_proto(t.0)),
        effective_end_time: end.map(timestamp_to_proto),
        client: Some(client_resource_name(namespace, &l.spec.client_ref.name)),
        exporter: status
            .and_then(|s| s.exporter_ref.as_ref())
            .map(|r| exporter_resource_name(namespace, &r.name)),
        conditions: status
            .map(|s| s.conditions.iter().map(condition_to_proto).collect())
            .unwrap_or_default(),
        exporter_name: l.spec.exporter_ref.as_ref().map(|r| r.name.clone()),
        tags: l.spec.tags.clone().into_iter().collect(),
        allow_disabled: l.spec.allow_disabled,
        deprecated_labels: HashMap::new(),
        shared_with: l.spec.shared_with.clone(),
        context: l.spec.context.clone().into_iter().collect(),
    }
}

/// Lease times after `ReconcileLeaseTimeFields`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseTimes {
    /// Requested begin.
    pub begin: Option<Timestamp>,
    /// Requested end.
    pub end: Option<Timestamp>,
    /// Requested duration (always set and > 0 after reconciliation).
    pub duration: Option<SignedDuration>,
}

/// `ReconcileLeaseTimeFields`: begin+end give the duration (an explicit, different duration is a
/// conflict); end+duration give the begin; afterwards a positive duration must exist.
pub fn reconcile_lease_times(t: LeaseTimes) -> Result<LeaseTimes, ObjectError> {
    let mut t = t;
    if let Some(d) = t.duration
        && d.is_negative()
    {
        return Err(ObjectError::Time(format!(
            "duration must be positive, got {}",
            GoDuration(d)
        )));
    }
    match (t.begin, t.end, t.duration) {
        (Some(b), Some(e), d) => {
            if e <= b {
                return Err(ObjectError::Time(format!(
                    "end_time {e} must be after begin_time {b}"
                )));
            }
            let span = e.duration_since(b);
            if let Some(d) = d
                && !d.is_zero()
                && d != span
            {
                return Err(ObjectError::Time(format!(
                    "duration {} conflicts with begin_time {b} and end_time {e} (which give {})",
                    GoDuration(d),
                    GoDuration(span)
                )));
            }
            t.duration = Some(span);
        }
        (None, Some(e), Some(d)) if !d.is_zero() => {
            let begin = e.checked_sub(d).map_err(|err| {
                ObjectError::Time(format!(
                    "end_time {e} minus duration {} is out of range: {err}",
                    GoDuration(d)
                ))
            })?;
            t.begin = Some(begin);
        }
        _ => {}
    }
    match t.duration {
        Some(d) if !d.is_zero() => Ok(t),
        _ => Err(ObjectError::Time(
            "duration is required and must be positive (give duration, or both begin_time and end_time)"
                .to_string(),
        )),
    }
}

/// Entries a lease's context may have.
pub const MAX_CONTEXT_ENTRIES: usize = 8;
/// Characters a context key may have.
pub const MAX_CONTEXT_KEY: usize = 32;
/// Characters a context value may have.
pub const MAX_CONTEXT_VALUE: usize = 64;

/// A lease's `spec.context`: at most [`MAX_CONTEXT_ENTRIES`] entries; keys of 1 to
/// [`MAX_CONTEXT_KEY`] letters, digits, `_`, `-` or `.` starting with a letter or digit (they
/// become field names of JSON log lines); values up to [`MAX_CONTEXT_VALUE`] characters
/// without control characters.
pub fn validate_lease_context(context: &BTreeMap<String, String>) -> Result<(), ObjectError> {
    let bad = |m: String| Err(ObjectError::InvalidContext(m));
    if context.len() > MAX_CONTEXT_ENTRIES {
        return bad(format!(
            "{} entries (at most {MAX_CONTEXT_ENTRIES})",
            context.len()
        ));
    }
    for (k, v) in context {
        let key_ok = (1..=MAX_CONTEXT_KEY).contains(&k.chars().count())
            && k.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !key_ok {
            return bad(format!(
                "key {k:?}: 1 to {MAX_CONTEXT_KEY} letters, digits, '_', '-' or '.', starting \
                 with a letter or digit"
            ));
        }
        if v.chars().count() > MAX_CONTEXT_VALUE {
            return bad(format!(
                "value of {k:?}: {} characters (at most {MAX_CONTEXT_VALUE})",
                v.chars().count()
            ));
        }
        if v.chars().any(char::is_control) {
            return bad(format!("value of {k:?}: control characters"));
        }
    }
    Ok(())
}

/// CreateLease step 2: at most `max_tags`; keys not under `jumpstarter.dev/` or
/// `metadata.jumpstarter.dev/`, without `/`, and `metadata.jumpstarter.dev/<k>` a qualified
/// name; values valid label values.
pub fn validate_lease_tags(
    tags: &BTreeMap<String, String>,
    max_tags: usize,
) -> Result<(), ObjectError> {
    let bad = |m: String| Err(ObjectError::InvalidTags(m));
    if tags.len() > max_tags {
        return bad(format!(
            "too many tags: {} (at most {max_tags} allowed)",
            tags.len()
        ));
    }
    for (k, v) in tags {
        if k.starts_with(RESERVED_LABEL_PREFIX) || k.starts_with(TAG_LABEL_PREFIX) {
            return bad(format!(
                "tag key {k:?} must not start with {RESERVED_LABEL_PREFIX:?} or {TAG_LABEL_PREFIX:?}"
            ));
        }
        if k.contains('/') {
            return bad(format!("tag key {k:?} must not contain '/'"));
        }
        if let Err(e) = selector::validate_qualified_name(&format!("{TAG_LABEL_PREFIX}{k}")) {
            return bad(format!("tag key {k:?}: {e}"));
        }
        if let Err(e) = selector::validate_label_value(v) {
            return bad(format!("tag {k:?} value {v:?}: {e}"));
        }
    }
    Ok(())
}

/// The labels a lease carries: its own, plus the selector's matchLabels (except
/// `metadata.jumpstarter.dev/*`), the tags as `metadata.jumpstarter.dev/<k>`, and
/// `jumpstarter.dev/lease-ended=true` once ended.
pub fn lease_labels(l: &Lease) -> BTreeMap<String, String> {
    lease_labels_with(l, l.is_ended())
}

/// [`lease_labels`] as if the lease's status said `ended`: the scheduler asks this of every
/// lease on every pass, and copying the lease to put its new status in cost more than the
/// rest of the decision.
pub fn lease_labels_with(l: &Lease, ended: bool) -> BTreeMap<String, String> {
    let mut labels = l.metadata.labels.clone().unwrap_or_default();
    for (k, v) in l.spec.selector.match_labels.iter().flatten() {
        if !k.starts_with(TAG_LABEL_PREFIX) {
            labels.insert(k.clone(), v.clone());
        }
    }
    for (k, v) in &l.spec.tags {
        labels.insert(format!("{TAG_LABEL_PREFIX}{k}"), v.clone());
    }
    if ended {
        labels.insert(LEASE_ENDED_LABEL.to_string(), "true".to_string());
    }
    labels
}

/// `LeaseFromProtobuf` for CreateLease: validates (steps 1–2 of §2.7 CreateLease), parses the
/// selector, reconciles the times and builds the Lease `namespace/name` for `client`, with its
/// labels. The status is empty.
pub fn lease_from_proto(
    req: &client_v1::Lease,
    namespace: &str,
    name: &str,
    client: &str,
    max_tags: usize,
) -> Result<Lease, ObjectError> {
    let exporter_name = req.exporter_name.as_deref().unwrap_or_default();
    if req.selector.trim().is_empty() && exporter_name.is_empty() {
        return Err(ObjectError::SelectorOrExporterRequired);
    }
    let tags: BTreeMap<String, String> = req
        .tags
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    validate_lease_tags(&tags, max_tags)?;
    let context: BTreeMap<String, String> = req
        .context
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    validate_lease_context(&context)?;
    let selector = LabelSelector::parse(&req.selector)?;
    let times = lease_times_from_proto(req)?;
    let mut lease = Lease::new(
        name,
        LeaseSpec {
            client_ref: LocalObjectReference {
                name: client.to_string(),
            },
            duration: times.duration.map(GoDuration),
            selector: selector.to_k8s(),
            exporter_ref: (!exporter_name.is_empty()).then(|| LocalObjectReference {
                name: exporter_name.to_string(),
            }),
            tags,
            allow_disabled: req.allow_disabled,
            release: false,
            begin_time: times.begin.map(metav1::Time),
            end_time: times.end.map(metav1::Time),
            shared_with: Vec::new(),
            context,
        },
    );
    lease.metadata.namespace = Some(namespace.to_string());
    let labels = lease_labels(&lease);
    lease.metadata.labels = (!labels.is_empty()).then_some(labels);
    Ok(lease)
}

/// The reconciled begin/end/duration of a protobuf lease (also for UpdateLease).
pub fn lease_times_from_proto(req: &client_v1::Lease) -> Result<LeaseTimes, ObjectError> {
    let duration = req
        .duration
        .as_ref()
        .map(|d| {
            GoDuration::try_from(d)
                .map(|g| g.0)
                .map_err(|e| ObjectError::Time(e.to_string()))
        })
        .transpose()?;
    reconcile_lease_times(LeaseTimes {
        begin: req
            .begin_time
            .as_ref()
            .map(|t| timestamp_from_proto(t, "begin_time"))
            .transpose()?,
        end: req
            .end_time
            .as_ref()
            .map(|t| timestamp_from_proto(t, "end_time"))
            .transpose()?,
        duration,
    })
}

#[cfg(test)]
mod tests;
