//! `jmp get`, `jmp describe`, `jmp create lease`, `jmp update lease` and `jmp delete leases`:
//! exporters and leases as a client sees them, over the controller's `ClientService`.

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use jiff::{Timestamp, tz::TimeZone};
use jumpstarter_core::{
    client::{
        ControllerClient, ExporterQuery, LeaseQuery, LeaseRequest, LeaseUpdate,
        lease::{LeaseError, parse_duration},
    },
    config::{ClientConfig, UserConfig},
};
use jumpstarter_proto::{
    client_v1::{Exporter, Lease},
    ext_v1::{
        ExporterDevices, GetExporterDevicesRequest,
        client_extension_service_client::ClientExtensionServiceClient,
    },
    v1::{Condition, ExporterStatus},
};
use serde::Serialize;

use crate::{
    output::{
        Describe, OutputMode, Table, duration_secs, format_hours_minutes, format_time,
        format_timedelta, format_utc, jwt_expiry, labels_text, name_namespace, print_structured,
        short_name, timestamp, token_status, yes_no,
    },
    values::{join_selectors, parse_begin_time, parse_key_values},
};

/// Which client config to use (upstream's `--client-config` / `--client`).
#[derive(Args, Debug, Clone, Default)]
pub struct ClientSelect {
    /// Path to client config
    #[arg(long, value_name = "PATH")]
    pub client_config: Option<PathBuf>,
    /// Alias of client config
    #[arg(long, value_name = "TEXT", conflicts_with = "client_config",
          add = crate::completion::client_aliases())]
    pub client: Option<String>,
}

/// A gRPC error as one line naming what failed (no status debug dump).
pub fn rpc_error(what: &str, status: tonic::Status) -> anyhow::Error {
    rpc_error_text(what, status.code(), status.message())
}

fn rpc_error_text(what: &str, code: tonic::Code, msg: &str) -> anyhow::Error {
    use tonic::Code;
    match code {
        Code::Unavailable => anyhow::anyhow!("{what}: the controller is unreachable: {msg}"),
        Code::Unauthenticated | Code::PermissionDenied => anyhow::anyhow!(
            "{what}: {msg} (check the credentials in your config, e.g. with `jmp describe client`)"
        ),
        Code::DeadlineExceeded => anyhow::anyhow!("{what}: the controller did not answer: {msg}"),
        _ => anyhow::anyhow!("{what}: {msg}"),
    }
}

/// A failed [`ControllerClient`] call as one line naming what failed, with the same hints
/// as [`rpc_error`].
pub fn api_error(what: &str, e: LeaseError) -> anyhow::Error {
    match e {
        LeaseError::Rpc { code, message, .. } => rpc_error_text(what, code, &message),
        other => anyhow::Error::new(other).context(what.to_string()),
    }
}

/// Resolves the client config as upstream does and connects to its controller.
pub async fn connect(select: &ClientSelect) -> Result<ControllerClient> {
    let cfg = ClientConfig::resolve(select.client_config.as_deref(), select.client.as_deref())?;
    ControllerClient::connect(&cfg)
        .await
        .map_err(|e| crate::hints::controller_error(&cfg, e.into()))
}

/// The caller's active leases (what `--with leases` and `describe exporter` show).
pub async fn active_leases(api: &ControllerClient) -> Result<Vec<Lease>> {
    api.list_leases(&LeaseQuery::default())
        .await
        .map_err(|e| api_error("cannot list leases", e))
}

/// Parses a lease duration in the formats upstream accepts, refusing zero.
pub fn parse_lease_duration(text: &str) -> Result<std::time::Duration> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        bail!("invalid duration {text:?}: a lease duration must be greater than zero");
    }
    Ok(d)
}

// ---------------------------------------------------------------------------------------
// Views (JSON/YAML shapes follow upstream's pydantic models)

/// An exporter as `-o json` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ExporterView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Deprecated label keys and their messages.
    pub deprecated_labels: BTreeMap<String, String>,
    /// Connected (with `--with online`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub online: Option<bool>,
    /// Status name (with `--with status`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Enabled (with `--allow-disabled`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// The lease holding it (with `--with leases`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseView>,
    /// Its drivers from its last registration (`describe exporter`, from a controller of
    /// ours; `None` when the controller does not say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drivers: Option<Vec<DriverView>>,
    /// Why `drivers` is `None` (`describe exporter`).
    #[serde(skip)]
    pub drivers_note: Option<String>,
    #[serde(skip)]
    status_message: String,
    /// The wire status, for telling a lease we cannot see (another client's).
    #[serde(skip)]
    raw_status: i32,
}

impl ExporterView {
    /// Whether the exporter serves a lease that is not among the caller's own (the
    /// controller shows clients only their own leases).
    fn leased_by_someone_else(&self) -> bool {
        self.lease.is_none()
            && [ExporterStatus::LeaseReady, ExporterStatus::BeforeLeaseHook]
                .iter()
                .any(|s| *s as i32 == self.raw_status)
    }
}

/// The status name upstream shows (`AVAILABLE`, `LEASE_READY`...).
pub fn status_name(status: i32) -> String {
    ExporterStatus::try_from(status)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("EXPORTER_STATUS_")
                .to_string()
        })
        .unwrap_or_else(|_| format!("UNKNOWN({status})"))
}

impl ExporterView {
    /// From the wire, with every optional field filled.
    // `online` is deprecated on the wire but is what upstream's CLI shows.
    #[allow(deprecated)]
    pub fn from_proto(e: &Exporter) -> Self {
        Self {
            namespace: name_namespace(&e.name).unwrap_or_default().to_string(),
            name: short_name(&e.name).to_string(),
            labels: e.labels.clone().into_iter().collect(),
            deprecated_labels: e.deprecated_labels.clone().into_iter().collect(),
            online: Some(e.online),
            // A never-connected exporter has no status yet; it is offline. A quarantined one
            // says so in its message (the `[UNHEALTHY]` convention of `docs/hooks.md`).
            status: Some(
                if jumpstarter_core::hooks::Unhealthy::parse(&e.status_message).is_some() {
                    "UNHEALTHY".into()
                } else if e.status == ExporterStatus::Unspecified as i32 && !e.online {
                    status_name(ExporterStatus::Offline as i32)
                } else {
                    status_name(e.status)
                },
            ),
            enabled: Some(e.enabled.unwrap_or(true)),
            lease: None,
            drivers: None,
            drivers_note: None,
            status_message: e.status_message.clone(),
            raw_status: e.status,
        }
    }
}

/// One driver instance of an exporter as `describe exporter` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DriverView {
    /// Its path in the driver tree (`power`, `storage`, `serial.console`); empty for the root.
    pub path: String,
    /// Its client class (label `jumpstarter.dev/client`).
    pub client: String,
    /// Its other labels.
    pub labels: BTreeMap<String, String>,
    /// Its uuid (fresh each time the exporter starts).
    pub uuid: String,
}

/// The drivers of a registration, parents before children, each named by its path.
pub fn driver_views(reg: &ExporterDevices) -> Vec<DriverView> {
    use jumpstarter_core::driver::{CLIENT_LABEL, NAME_LABEL};
    let mut paths: BTreeMap<&str, String> = BTreeMap::new();
    let mut out = Vec::new();
    for d in &reg.devices {
        let name = d.labels.get(NAME_LABEL).cloned().unwrap_or_default();
        // Reports list parents first; a child of an unknown parent keeps its own name.
        let path = match paths.get(d.parent_uuid.as_str()) {
            Some(parent) if !parent.is_empty() => format!("{parent}.{name}"),
            _ => name,
        };
        paths.insert(&d.uuid, path.clone());
        out.push(DriverView {
            path,
            client: d.labels.get(CLIENT_LABEL).cloned().unwrap_or_default(),
            labels: d
                .labels
                .iter()
                .filter(|(k, _)| *k != CLIENT_LABEL && *k != NAME_LABEL)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            uuid: d.uuid.clone(),
        });
    }
    out
}

/// A lease condition as `-o json` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ConditionView {
    /// Condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Generation it was computed for.
    #[serde(rename = "observedGeneration", skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the status last changed.
    #[serde(rename = "lastTransitionTime")]
    pub last_transition_time: Option<Timestamp>,
    /// Machine-readable reason.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

impl ConditionView {
    fn from_proto(c: &Condition) -> Self {
        Self {
            type_: c.r#type.clone().unwrap_or_default(),
            status: c.status.clone().unwrap_or_default(),
            observed_generation: c.observed_generation,
            last_transition_time: c
                .last_transition_time
                .as_ref()
                .and_then(|t| Timestamp::new(t.seconds.unwrap_or(0), t.nanos.unwrap_or(0)).ok()),
            reason: c.reason.clone().unwrap_or_default(),
            message: c.message.clone().unwrap_or_default(),
        }
    }
}

/// A lease as `-o json` shows it (upstream's field names; durations in seconds).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LeaseView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Label selector.
    pub selector: String,
    /// Requested exporter, if pinned.
    pub exporter_name: Option<String>,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Requested duration, seconds.
    pub duration: Option<f64>,
    /// Duration so far, seconds.
    pub effective_duration: Option<f64>,
    /// Requested begin time.
    pub begin_time: Option<Timestamp>,
    /// Holder (client name).
    pub client: String,
    /// Assigned exporter name.
    pub exporter: String,
    /// Conditions.
    pub conditions: Vec<ConditionView>,
    /// When it started.
    pub effective_begin_time: Option<Timestamp>,
    /// When it ended.
    pub effective_end_time: Option<Timestamp>,
    /// Requested end time.
    pub end_time: Option<Timestamp>,
    /// Deprecated label keys in the selector.
    pub deprecated_labels: BTreeMap<String, String>,
    /// Derived status word (`In-Use`, `Waiting`...).
    pub status: String,
    /// The other clients the holder shares the lease with (shown only when there are any).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shared_with: Vec<String>,
    /// What the lease is for (shown only when set).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub context: BTreeMap<String, String>,
}

impl LeaseView {
    /// From the wire; `now` decides `Scheduled`.
    pub fn from_proto(l: &Lease, now: Timestamp) -> Self {
        let ts = |t: &Option<prost_types::Timestamp>| t.as_ref().and_then(timestamp);
        Self {
            namespace: name_namespace(&l.name).unwrap_or_default().to_string(),
            name: short_name(&l.name).to_string(),
            selector: l.selector.clone(),
            exporter_name: l.exporter_name.clone().filter(|s| !s.is_empty()),
            tags: l.tags.clone().into_iter().collect(),
            duration: l.duration.as_ref().map(duration_secs),
            effective_duration: l.effective_duration.as_ref().map(duration_secs),
            begin_time: ts(&l.begin_time),
            client: l
                .client
                .as_deref()
                .map(short_name)
                .unwrap_or_default()
                .to_string(),
            exporter: l
                .exporter
                .as_deref()
                .map(short_name)
                .unwrap_or_default()
                .to_string(),
            conditions: l.conditions.iter().map(ConditionView::from_proto).collect(),
            effective_begin_time: ts(&l.effective_begin_time),
            effective_end_time: ts(&l.effective_end_time),
            end_time: ts(&l.end_time),
            deprecated_labels: l.deprecated_labels.clone().into_iter().collect(),
            status: lease_status(l, now).to_string(),
            shared_with: l.shared_with.clone(),
            context: l.context.clone().into_iter().collect(),
        }
    }

    /// When it ends or is expected to end.
    pub fn expected_end(&self) -> Option<Timestamp> {
        if let Some(end) = self.effective_end_time {
            return Some(end);
        }
        if let Some(end) = self.end_time {
            return Some(end);
        }
        let begin = self.effective_begin_time.or(self.begin_time)?;
        let secs = self.duration?;
        begin
            .checked_add(jiff::SignedDuration::from_secs_f64(secs))
            .ok()
    }

    /// The selector as shown (`<none>` for a lease pinned by name only).
    fn selector_text(&self) -> String {
        if self.selector.is_empty() {
            "<none>".into()
        } else {
            self.selector.clone()
        }
    }
}

/// The status word of a lease: `In-Use`, `Waiting`, `Scheduled`, `Released`, `Expired`,
/// `Ended`, `Unsatisfiable` or `Invalid`.
pub fn lease_status(l: &Lease, now: Timestamp) -> &'static str {
    let find = |t: &str| l.conditions.iter().find(|c| c.r#type.as_deref() == Some(t));
    let is_true = |t: &str| find(t).is_some_and(|c| c.status.as_deref() == Some("True"));
    if is_true("Invalid") {
        return "Invalid";
    }
    if is_true("Unsatisfiable") {
        return "Unsatisfiable";
    }
    if let Some(ready) = find("Ready") {
        if ready.status.as_deref() == Some("True") && l.effective_end_time.is_none() {
            return "In-Use";
        }
        match ready.reason.as_deref() {
            Some("Released") => return "Released",
            Some("Expired") => return "Expired",
            _ => {}
        }
    }
    if l.effective_end_time.is_some() {
        return "Ended";
    }
    if l.begin_time
        .as_ref()
        .and_then(timestamp)
        .is_some_and(|b| b > now)
    {
        return "Scheduled";
    }
    "Waiting"
}

fn opt_time(t: Option<Timestamp>, tz: &TimeZone) -> String {
    t.map(|t| format_time(t, tz))
        .unwrap_or_else(|| "<none>".into())
}

/// The `describe lease` view, times in `tz`.
pub fn describe_lease(v: &LeaseView, tz: &TimeZone) -> String {
    let mut d = Describe::new();
    let or_none = |s: &str| {
        if s.is_empty() {
            "<none>".to_string()
        } else {
            s.to_string()
        }
    };
    let mut fields = vec![
        ("Name", v.name.clone()),
        ("Namespace", or_none(&v.namespace)),
        ("Selector", v.selector_text()),
    ];
    if let Some(pinned) = &v.exporter_name {
        fields.push(("Exporter Name", pinned.clone()));
    }
    fields.extend([
        ("Exporter", or_none(&v.exporter)),
        ("Client", or_none(&v.client)),
    ]);
    if !v.shared_with.is_empty() {
        fields.push(("Shared With", v.shared_with.join(", ")));
    }
    fields.extend([
        ("Status", v.status.clone()),
        (
            "Duration",
            v.duration
                .map(format_timedelta)
                .unwrap_or_else(|| "<none>".into()),
        ),
    ]);
    if let Some(begin) = v.begin_time {
        fields.push(("Begin Time", format_time(begin, tz)));
    }
    fields.push(("Effective Begin Time", opt_time(v.effective_begin_time, tz)));
    fields.push(("Effective End Time", opt_time(v.effective_end_time, tz)));
    d.fields(0, &fields);
    d.map_section("Tags", &v.tags);
    // Upstream's seed output has the (then always empty) context here.
    d.map_section("Context", &v.context);
    if v.conditions.is_empty() {
        d.fields(0, &[("Conditions", "<none>".into())]);
    } else {
        d.line(0, "Conditions:");
        let mut t = Table::new([
            "Type",
            "Status",
            "Reason",
            "Message",
            "Last Transition Time",
        ]);
        for c in &v.conditions {
            t.row([
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                c.message.clone(),
                c.last_transition_time
                    .map(format_utc)
                    .unwrap_or_else(|| "<none>".into()),
            ]);
        }
        d.raw(&t.render_underlined(2));
    }
    d.finish()
}

/// The `describe exporter` view, times in `tz`.
pub fn describe_exporter(v: &ExporterView, tz: &TimeZone) -> String {
    let mut d = Describe::new();
    d.fields(
        0,
        &[("Name", v.name.clone()), ("Namespace", v.namespace.clone())],
    );
    d.map_section("Labels", &v.labels);
    let mut status = vec![
        ("Online", yes_no(v.online.unwrap_or(false))),
        (
            "Status",
            v.status.clone().unwrap_or_else(|| "UNKNOWN".into()),
        ),
    ];
    status.push(("Enabled", yes_no(v.enabled.unwrap_or(true))));
    d.fields(0, &status);
    // The message matters when a hook failed; otherwise it repeats the status.
    let failed = [
        ExporterStatus::BeforeLeaseHookFailed,
        ExporterStatus::AfterLeaseHookFailed,
    ]
    .iter()
    .any(|s| *s as i32 == v.raw_status);
    if failed && !v.status_message.is_empty() {
        d.fields(0, &[("Status Message", v.status_message.clone())]);
    }
    if let Some(u) = jumpstarter_core::hooks::Unhealthy::parse(&v.status_message) {
        let what = if u.kind.is_empty() {
            u.reason.to_string()
        } else {
            format!("{}: {}", u.kind, u.reason)
        };
        d.fields(
            0,
            &[
                (
                    "Health",
                    "Unhealthy (leased to nobody until an admin clears it)".into(),
                ),
                ("Health Reason", what),
            ],
        );
        if !u.output.is_empty() {
            d.line(0, "Last Output:");
            for line in u.output.lines() {
                d.line(2, line);
            }
        }
    }
    describe_lease_of_exporter(&mut d, v, tz);
    match (&v.drivers, &v.drivers_note) {
        (Some(drivers), _) if !drivers.is_empty() => {
            d.line(0, "Drivers:");
            let mut t = Table::new(["Name", "Client", "Labels"]);
            for dr in drivers {
                t.row([
                    if dr.path.is_empty() {
                        "(root)".to_string()
                    } else {
                        dr.path.clone()
                    },
                    dr.client.clone(),
                    if dr.labels.is_empty() {
                        "<none>".to_string()
                    } else {
                        labels_text(&dr.labels)
                    },
                ]);
            }
            d.raw(&t.render_underlined(2));
        }
        (Some(_), _) => d.fields(0, &[("Drivers", "<none>".into())]),
        (None, Some(note)) => d.fields(0, &[("Drivers", format!("<unknown> ({note})"))]),
        (None, None) => {}
    }
    d.finish()
}

/// The `Lease` part of `describe exporter`.
fn describe_lease_of_exporter(d: &mut Describe, v: &ExporterView, tz: &TimeZone) {
    match &v.lease {
        None if v.leased_by_someone_else() => {
            d.fields(0, &[("Lease", "held by another client".into())])
        }
        None => d.fields(0, &[("Lease", "<none>".into())]),
        Some(l) => {
            d.line(0, "Lease:");
            d.fields(
                2,
                &[
                    ("Name", l.name.clone()),
                    ("Client", l.client.clone()),
                    ("Status", l.status.clone()),
                    ("Begin Time", opt_time(l.effective_begin_time, tz)),
                    ("Expected Release", opt_time(l.expected_end(), tz)),
                ],
            );
        }
    }
}

/// What `describe client` reports about a local client config.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClientView {
    /// Alias (file base name).
    pub alias: String,
    /// The file.
    pub path: String,
    /// Whether it is the current client.
    pub current: bool,
    /// Client name.
    pub name: String,
    /// Namespace.
    pub namespace: Option<String>,
    /// Controller endpoint.
    pub endpoint: Option<String>,
    /// TLS settings.
    pub tls: ClientTlsView,
    /// Driver allow-list.
    pub drivers: ClientDriversView,
    /// Token expiry and status.
    pub token: ClientTokenView,
    /// Whether a refresh token is stored.
    pub refresh_token_stored: bool,
}

/// `tls` of [`ClientView`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClientTlsView {
    /// Whether a CA is configured.
    pub ca_configured: bool,
    /// Whether verification is off.
    pub insecure: bool,
}

/// `drivers` of [`ClientView`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClientDriversView {
    /// Allowed driver client patterns.
    pub allow: Vec<String>,
    /// All allowed.
    #[serde(rename = "unsafe")]
    pub allow_unsafe: bool,
}

/// `token` of [`ClientView`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClientTokenView {
    /// The `exp` claim, if the token is a JWT with one.
    pub expiry: Option<Timestamp>,
    /// `Valid (... remaining)`, `EXPIRED (... ago)`, `not set` or `unknown expiry`.
    pub status: String,
    /// Seconds until expiry (negative when expired).
    pub remaining_seconds: Option<i64>,
}

impl ClientView {
    /// Builds the view of a loaded config.
    pub fn new(cfg: &ClientConfig, current: Option<&str>, now: Timestamp) -> Self {
        let alias = cfg.alias().unwrap_or_default();
        let token = cfg.token.as_deref().filter(|t| !t.is_empty());
        let expiry = token.and_then(jwt_expiry);
        let status = match (token, expiry) {
            (None, _) => "not set".to_string(),
            (Some(_), None) => "unknown expiry (not a JWT)".to_string(),
            (Some(_), Some(exp)) => token_status(exp, now),
        };
        Self {
            current: current == Some(alias.as_str()),
            alias,
            path: cfg
                .path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            name: cfg.metadata.name.clone(),
            namespace: cfg.metadata.namespace.clone(),
            endpoint: cfg.endpoint.clone(),
            tls: ClientTlsView {
                ca_configured: !cfg.tls.ca.trim().is_empty(),
                insecure: cfg.tls.insecure,
            },
            drivers: ClientDriversView {
                allow: cfg.drivers.allow.clone(),
                allow_unsafe: cfg.allows_unsafe(),
            },
            token: ClientTokenView {
                expiry,
                status,
                remaining_seconds: expiry.map(|e| e.as_second() - now.as_second()),
            },
            refresh_token_stored: cfg.refresh_token.as_deref().is_some_and(|t| !t.is_empty()),
        }
    }
}

/// The `describe client` view.
pub fn describe_client(v: &ClientView) -> String {
    let none = |s: &Option<String>| {
        s.clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "<none>".into())
    };
    let mut d = Describe::new();
    d.fields(
        0,
        &[
            ("Alias", v.alias.clone()),
            ("Path", v.path.clone()),
            ("Current", yes_no(v.current)),
            ("Name", v.name.clone()),
            ("Namespace", none(&v.namespace)),
            ("Endpoint", none(&v.endpoint)),
        ],
    );
    d.line(0, "TLS:");
    d.fields(
        2,
        &[
            (
                "CA",
                if v.tls.ca_configured {
                    "configured".into()
                } else {
                    "<none> (system roots)".into()
                },
            ),
            ("Insecure", yes_no(v.tls.insecure)),
        ],
    );
    d.line(0, "Drivers:");
    let allow = if v.drivers.allow.is_empty() {
        "<none>".to_string()
    } else {
        v.drivers.allow.join(",")
    };
    d.fields(
        2,
        &[("Allow", allow), ("Unsafe", yes_no(v.drivers.allow_unsafe))],
    );
    d.line(0, "Token:");
    d.fields(
        2,
        &[
            (
                "Expiry",
                v.token
                    .expiry
                    .map(format_utc)
                    .unwrap_or_else(|| "<none>".into()),
            ),
            ("Status", v.token.status.clone()),
        ],
    );
    d.fields(
        0,
        &[("Refresh Token Stored", yes_no(v.refresh_token_stored))],
    );
    d.finish()
}

// ---------------------------------------------------------------------------------------
// Commands

/// `-o` of the client's commands. Their `-o name` prints bare names, one per line, as
/// upstream's does (its help says `resource/name`, which only `jmp admin` prints).
const OUTPUT_HELP: &str =
    "Output mode. Use \"-o name\" for shorter output (the names, one per line).";

/// `-o` of `jmp get`: also `wide`, as kubectl's.
const GET_OUTPUT_HELP: &str = "Output mode. Use \"-o name\" for shorter output (the names, one per \
     line), \"-o wide\" for more columns (exporters: online, status and the lease; leases: \
     status, begin time and duration).";

/// The output mode of a `jmp get` command and whether `-o wide` asked for more columns.
fn get_mode(flag: Option<&str>) -> Result<(OutputMode, bool)> {
    match flag {
        Some("wide") => Ok((OutputMode::Plain, true)),
        other => Ok((OutputMode::from_flag(other)?, false)),
    }
}

/// `jmp get`.
#[derive(Subcommand, Debug)]
pub enum GetCommand {
    /// Display one or many exporters
    #[command(alias = "exporter", alias = "e")]
    Exporters(GetExportersArgs),
    /// Display one or many leases
    #[command(alias = "lease", alias = "l")]
    Leases(GetLeasesArgs),
}

/// `jmp get exporters`.
#[derive(Args, Debug)]
pub struct GetExportersArgs {
    #[command(flatten)]
    client: ClientSelect,
    /// Selector (label query) to filter on, supports '=', '==', and '!=' (e.g. -l
    /// key1=value1,key2=value2). Can be specified multiple times.
    #[arg(short = 'l', long = "selector", value_name = "TEXT")]
    selector: Vec<String>,
    #[arg(short, long, value_parser = ["json", "yaml", "name", "wide"], help = GET_OUTPUT_HELP)]
    output: Option<String>,
    /// Include fields: leases, online, status (comma-separated or repeated)
    #[arg(long = "with", value_name = "TEXT")]
    with: Vec<String>,
    /// Show labels hidden by controller config, and those under hidden.jumpstarter.dev/
    #[arg(long, visible_alias = "show-hidden")]
    show_hidden_labels: bool,
    /// Include disabled exporters in the listing
    #[arg(long)]
    allow_disabled: bool,
    /// Number of results per page for pagination
    #[arg(long, value_name = "INTEGER", default_value_t = DEFAULT_PAGE_SIZE,
          value_parser = clap::value_parser!(i32).range(1..))]
    page_size: i32,
}

/// `--page-size` of `jmp get exporters|leases` when not given (upstream main's).
const DEFAULT_PAGE_SIZE: i32 = 100;

/// `Warning: ...` on stderr for each deprecated label an exporter carries, in upstream
/// main's words.
fn warn_deprecated_exporter_labels(exporter: &str, deprecated: &BTreeMap<String, String>) {
    for (key, message) in deprecated {
        let mut warning = format!("label '{key}' on exporter '{exporter}' is deprecated");
        if !message.is_empty() {
            warning.push_str(&format!(": {message}"));
        }
        eprintln!("Warning: {warning}");
    }
}

/// `Warning: ...` on stderr for each deprecated label a lease's selector uses (`lease`:
/// which lease, when there are several), in upstream main's words.
pub(crate) fn warn_deprecated_selector_labels(
    lease: Option<&str>,
    deprecated: &BTreeMap<String, String>,
) {
    for (key, message) in deprecated {
        let mut warning = match lease {
            Some(name) => format!("selector label '{key}' on lease '{name}' is deprecated"),
            None => format!("selector label '{key}' is deprecated"),
        };
        if !message.is_empty() {
            warning.push_str(&format!(": {message}"));
        }
        eprintln!("Warning: {warning}");
    }
}

/// `jmp get leases`.
#[derive(Args, Debug)]
pub struct GetLeasesArgs {
    #[command(flatten)]
    client: ClientSelect,
    /// The lease (with --logs or --console)
    #[arg(value_name = "NAME")]
    name: Option<String>,
    /// Print the lease's gathered log (ours): the controller's events and the exporter's
    /// driver calls and driver lines, oldest first; text, or with -o json one object a line
    #[arg(long, requires = "name")]
    logs: bool,
    /// Print the lease's console transcripts (ours), both directions, oldest first: time,
    /// console, direction and the bytes; only for the lease's own client
    #[arg(long, requires = "name", conflicts_with = "logs")]
    console: bool,
    /// Selector (label query) to filter on, supports '=', '==', and '!=' (e.g. -l
    /// key1=value1,key2=value2). Can be specified multiple times.
    #[arg(short = 'l', long = "selector", value_name = "TEXT")]
    selector: Vec<String>,
    #[arg(short, long, value_parser = ["json", "yaml", "name", "wide"], help = GET_OUTPUT_HELP)]
    output: Option<String>,
    /// Include expired leases
    #[arg(short = 'a', long)]
    all: bool,
    /// Include leases from all clients
    #[arg(short = 'A', long)]
    all_clients: bool,
    /// Filter leases by tags (label selector syntax, e.g. build=1234)
    #[arg(long, value_name = "TEXT")]
    tag_filter: Option<String>,
    /// Number of results per page for pagination
    #[arg(long, value_name = "INTEGER", default_value_t = DEFAULT_PAGE_SIZE,
          value_parser = clap::value_parser!(i32).range(1..))]
    page_size: i32,
}

/// `jmp describe`.
#[derive(Subcommand, Debug)]
pub enum DescribeCommand {
    /// Show one exporter in full: labels, status, the lease holding it and its drivers
    #[command(alias = "exporters", alias = "e")]
    Exporter(DescribeExporterArgs),
    /// Show one lease in full, with its conditions
    #[command(alias = "leases", alias = "l")]
    Lease(DescribeLeaseArgs),
    /// Show a local client config: endpoint, TLS, drivers and token expiry
    #[command(alias = "clients", alias = "c")]
    Client(DescribeClientArgs),
}

/// `jmp describe exporter NAME`.
#[derive(Args, Debug)]
pub struct DescribeExporterArgs {
    #[command(flatten)]
    client: ClientSelect,
    /// Name of the resource
    #[arg(add = crate::completion::exporter_names())]
    name: String,
    /// Output mode
    #[arg(short, long, value_parser = ["json", "yaml"])]
    output: Option<String>,
}

/// `jmp describe lease NAME`.
#[derive(Args, Debug)]
pub struct DescribeLeaseArgs {
    #[command(flatten)]
    client: ClientSelect,
    /// Name of the resource
    #[arg(add = crate::completion::lease_names())]
    name: String,
    /// Output mode
    #[arg(short, long, value_parser = ["json", "yaml"])]
    output: Option<String>,
}

/// `jmp describe client [ALIAS]`.
#[derive(Args, Debug)]
pub struct DescribeClientArgs {
    /// Alias of the client config (default: the current client)
    #[arg(add = crate::completion::client_aliases())]
    name: Option<String>,
    /// Path to client config
    #[arg(long, value_name = "PATH", conflicts_with = "name")]
    client_config: Option<PathBuf>,
    /// Output mode
    #[arg(short, long, value_parser = ["json", "yaml"])]
    output: Option<String>,
}

/// `jmp create`.
#[derive(Subcommand, Debug)]
pub enum CreateCommand {
    /// Create a lease
    #[command(alias = "leases", alias = "l")]
    Lease(CreateLeaseArgs),
}

/// `jmp create lease`.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("target").required(true).multiple(true).args(["selector", "name"])))]
pub struct CreateLeaseArgs {
    #[command(flatten)]
    client: ClientSelect,
    /// Selector (label query) to filter on, supports '=', '==', and '!=' (e.g. -l
    /// key1=value1,key2=value2). Can be specified multiple times.
    #[arg(short = 'l', long = "selector", value_name = "TEXT")]
    selector: Vec<String>,
    /// Target a specific exporter/device name directly.
    #[arg(short = 'n', long, value_name = "TEXT", add = crate::completion::exporter_names())]
    name: Option<String>,
    /// Lease duration: 30m, 3h30m, 1d, PT1H30M, 01:30:00, ...
    #[arg(long, value_name = "DURATION", required = true)]
    duration: String,
    /// Begin time for the lease in ISO 8601 format (e.g., 2024-01-01T12:00:00 or
    /// 2024-01-01T12:00:00Z). If not specified, the lease tries to be acquired immediately.
    #[arg(long, value_name = "DATETIME")]
    begin_time: Option<String>,
    /// Optional lease ID to request (if not provided, server will generate one)
    #[arg(long, value_name = "TEXT")]
    lease_id: Option<String>,
    /// Tag to set on the lease (key=value format, can be specified multiple times)
    #[arg(long, value_name = "TEXT")]
    tag: Vec<String>,
    /// Allow leasing a disabled exporter (only effective with --name/-n)
    #[arg(long)]
    allow_disabled: bool,
    /// Share the lease with these clients of the same namespace (comma-separated or
    /// repeated): they may use, extend and release it.
    #[arg(long, value_name = "CLIENTS", value_delimiter = ',')]
    share: Vec<String>,
    /// What the lease is for, as key=value (repeatable, at most 8): e.g. build_id=123.
    /// Immutable once set; on every log line of the lease.
    #[arg(long, value_name = "KEY=VALUE")]
    context: Vec<String>,
    #[arg(short, long, value_parser = ["json", "yaml", "name"], help = OUTPUT_HELP)]
    output: Option<String>,
}

/// `jmp update`.
#[derive(Subcommand, Debug)]
pub enum UpdateCommand {
    /// Update a lease
    #[command(alias = "leases", alias = "l")]
    Lease(UpdateLeaseArgs),
}

/// `jmp update lease NAME`.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("change").required(true).multiple(true).args(["duration", "begin_time", "to_client", "share_add", "share_remove"])))]
pub struct UpdateLeaseArgs {
    #[command(flatten)]
    client: ClientSelect,
    /// The lease
    #[arg(add = crate::completion::lease_names())]
    name: String,
    /// New lease duration: 30m, 3h30m, 1d, PT1H30M, 01:30:00, ...
    #[arg(long, value_name = "DURATION")]
    duration: Option<String>,
    /// New begin time (ISO 8601); not allowed once the lease has started.
    #[arg(long, value_name = "DATETIME")]
    begin_time: Option<String>,
    /// Transfer lease to a different client in the same namespace
    #[arg(long, value_name = "TEXT")]
    to_client: Option<String>,
    /// Also share the lease with these clients (comma-separated or repeated; owner only)
    #[arg(long, value_name = "CLIENTS", value_delimiter = ',')]
    share_add: Vec<String>,
    /// Stop sharing the lease with these clients (comma-separated or repeated; owner only)
    #[arg(long, value_name = "CLIENTS", value_delimiter = ',')]
    share_remove: Vec<String>,
    #[arg(short, long, value_parser = ["json", "yaml", "name"], help = OUTPUT_HELP)]
    output: Option<String>,
}

/// `jmp delete`.
#[derive(Subcommand, Debug)]
pub enum DeleteCommand {
    /// Delete leases
    #[command(alias = "lease", alias = "l")]
    Leases(DeleteLeasesArgs),
}

/// `jmp delete leases`.
#[derive(Args, Debug)]
pub struct DeleteLeasesArgs {
    #[command(flatten)]
    client: ClientSelect,
    /// Names of the leases
    #[arg(add = crate::completion::lease_names())]
    names: Vec<String>,
    /// Selector (label query) to filter on, supports '=', '==', and '!=' (e.g. -l
    /// key1=value1,key2=value2). Can be specified multiple times.
    #[arg(short = 'l', long = "selector", value_name = "TEXT")]
    selector: Vec<String>,
    /// Delete all your active leases
    #[arg(short = 'a', long)]
    all: bool,
    /// Delete active leases from all clients
    #[arg(short = 'A', long)]
    all_clients: bool,
    #[arg(short, long, value_parser = ["name"], help = OUTPUT_HELP)]
    output: Option<String>,
}

/// What an empty table prints instead, as upstream (and kubectl).
pub const NO_RESOURCES: &str = "No resources found.";

fn parse_with(items: &[String]) -> Result<(bool, bool, bool)> {
    let (mut leases, mut online, mut status) = (false, false, false);
    for item in items {
        // Case-insensitive, as upstream's (`--with Online,STATUS`).
        for w in item.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match w.to_ascii_lowercase().as_str() {
                "leases" | "lease" => leases = true,
                "online" => online = true,
                "status" => status = true,
                other => bail!("unknown --with field {other:?} (use leases, online, status)"),
            }
        }
    }
    Ok((leases, online, status))
}

/// The lease currently holding each exporter, by exporter name.
fn leases_by_exporter(leases: &[Lease], now: Timestamp) -> BTreeMap<String, LeaseView> {
    let mut out = BTreeMap::new();
    for l in leases {
        let v = LeaseView::from_proto(l, now);
        if !v.exporter.is_empty() && v.effective_end_time.is_none() {
            out.insert(v.exporter.clone(), v);
        }
    }
    out
}

/// Runs `jmp get ...`.
pub async fn get(cmd: GetCommand) -> Result<i32> {
    match cmd {
        GetCommand::Exporters(args) => get_exporters(args).await,
        GetCommand::Leases(args) => get_leases(args).await,
    }
}

#[derive(Serialize)]
struct ExporterList {
    exporters: Vec<ExporterView>,
}

#[derive(Serialize)]
struct LeaseList {
    leases: Vec<LeaseView>,
}

async fn get_exporters(args: GetExportersArgs) -> Result<i32> {
    let (mode, wide) = get_mode(args.output.as_deref())?;
    let (with_leases, with_online, with_status) = parse_with(&args.with)?;
    // `-o wide` shows every optional column (it changes the table only).
    let (with_leases, with_online, with_status) = (
        with_leases || wide,
        with_online || wide,
        with_status || wide,
    );
    let api = connect(&args.client).await?;
    let query = ExporterQuery {
        selector: join_selectors(&args.selector),
        show_hidden_labels: args.show_hidden_labels,
        page_size: args.page_size,
    };
    let exporters = api
        .list_exporters(&query)
        .await
        .map_err(|e| api_error("cannot list exporters", e))?;
    let now = Timestamp::now();
    let leases = if with_leases {
        leases_by_exporter(&active_leases(&api).await?, now)
    } else {
        BTreeMap::new()
    };
    let mut views: Vec<ExporterView> = exporters
        .iter()
        .map(ExporterView::from_proto)
        .filter(|v| args.allow_disabled || v.enabled != Some(false))
        .map(|mut v| {
            if !args.show_hidden_labels {
                // Also from a controller that does not hide them itself.
                v.labels
                    .retain(|k, _| !jumpstarter_core::labels::is_hidden_label(k));
            }
            v.lease = leases.get(&v.name).cloned();
            if !with_online {
                v.online = None;
            }
            if !with_status {
                v.status = None;
            }
            if !args.allow_disabled {
                v.enabled = None;
            }
            v
        })
        .collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    for v in &views {
        warn_deprecated_exporter_labels(&v.name, &v.deprecated_labels);
    }
    match mode {
        OutputMode::Json | OutputMode::Yaml => {
            print_structured(mode, &ExporterList { exporters: views })?
        }
        OutputMode::Name => {
            for v in &views {
                println!("{}", v.name);
            }
        }
        _ if views.is_empty() => println!("{NO_RESOURCES}"),
        _ => print!(
            "{}",
            exporters_table(
                &views,
                with_online,
                with_status,
                with_leases,
                args.allow_disabled,
                &TimeZone::system(),
            )
            .render(0)
        ),
    }
    Ok(0)
}

/// The `get exporters` table: `NAME [ENABLED] [ONLINE] [STATUS] LABELS [LEASED BY, LEASE
/// STATUS, RELEASE TIME]`.
pub fn exporters_table(
    views: &[ExporterView],
    online: bool,
    status: bool,
    leases: bool,
    enabled: bool,
    tz: &TimeZone,
) -> Table {
    let mut headers = vec!["NAME"];
    if enabled {
        headers.push("ENABLED");
    }
    if online {
        headers.push("ONLINE");
    }
    if status {
        headers.push("STATUS");
    }
    headers.push("LABELS");
    if leases {
        headers.extend(["LEASED BY", "LEASE STATUS", "RELEASE TIME"]);
    }
    let mut t = Table::new(headers);
    for v in views {
        let mut row = vec![v.name.clone()];
        if enabled {
            row.push(yes_no(v.enabled.unwrap_or(true)));
        }
        if online {
            row.push(yes_no(v.online.unwrap_or(false)));
        }
        if status {
            row.push(v.status.clone().unwrap_or_default());
        }
        row.push(labels_text(&v.labels));
        if leases {
            match &v.lease {
                Some(l) => {
                    row.push(l.client.clone());
                    row.push(l.status.clone());
                    row.push(
                        l.expected_end()
                            .map(|t| format_time(t, tz))
                            .unwrap_or_default(),
                    );
                }
                None if v.leased_by_someone_else() => {
                    row.extend(["(another client)".into(), "In-Use".into(), String::new()])
                }
                // Nobody holds it, but an offline exporter is not there to lease.
                None if v.online == Some(false)
                    || v.status
                        .as_deref()
                        .is_some_and(|s| s.eq_ignore_ascii_case("OFFLINE")) =>
                {
                    row.extend([String::new(), "Offline".into(), String::new()])
                }
                None => row.extend([String::new(), "Available".into(), String::new()]),
            }
        }
        t.row(row);
    }
    t
}

/// The `get leases` table: `NAME SELECTOR EXPIRES AT REMAINING CLIENT EXPORTER TAGS`, then
/// `SHARED WITH` when a lease is shared, and with `wide` also `STATUS BEGIN TIME DURATION`.
pub fn leases_table(views: &[LeaseView], now: Timestamp, tz: &TimeZone, wide: bool) -> Table {
    let shared = views.iter().any(|v| !v.shared_with.is_empty());
    let mut headers = vec![
        "NAME",
        "SELECTOR",
        "EXPIRES AT",
        "REMAINING",
        "CLIENT",
        "EXPORTER",
        "TAGS",
    ];
    if shared {
        headers.push("SHARED WITH");
    }
    if wide {
        headers.extend(["STATUS", "BEGIN TIME", "DURATION"]);
    }
    let mut t = Table::new(headers);
    for v in views {
        let end = v.expected_end();
        let remaining = match end {
            Some(e) if v.effective_end_time.is_none() && v.effective_begin_time.is_some() => {
                format_hours_minutes(e.as_second() - now.as_second())
            }
            _ => String::new(),
        };
        let mut row = vec![
            v.name.clone(),
            v.selector_text(),
            end.map(|t| format_time(t, tz)).unwrap_or_default(),
            remaining,
            v.client.clone(),
            v.exporter.clone(),
            labels_text(&v.tags),
        ];
        if shared {
            row.push(v.shared_with.join(","));
        }
        if wide {
            row.push(v.status.clone());
            // When it began, else when it was asked to begin.
            row.push(
                v.effective_begin_time
                    .or(v.begin_time)
                    .map(|t| format_time(t, tz))
                    .unwrap_or_default(),
            );
            row.push(v.duration.map(format_timedelta).unwrap_or_default());
        }
        t.row(row);
    }
    t
}

fn print_leases(mode: OutputMode, views: Vec<LeaseView>, now: Timestamp, wide: bool) -> Result<()> {
    match mode {
        OutputMode::Json | OutputMode::Yaml => print_structured(mode, &LeaseList { leases: views }),
        OutputMode::Name => {
            for v in &views {
                println!("{}", v.name);
            }
            Ok(())
        }
        _ if views.is_empty() => {
            println!("{NO_RESOURCES}");
            Ok(())
        }
        _ => {
            print!(
                "{}",
                leases_table(&views, now, &TimeZone::system(), wide).render(0)
            );
            Ok(())
        }
    }
}

fn print_lease(mode: OutputMode, view: LeaseView, now: Timestamp) -> Result<()> {
    match mode {
        OutputMode::Json | OutputMode::Yaml => print_structured(mode, &view),
        _ => print_leases(mode, vec![view], now, false),
    }
}

async fn get_leases(args: GetLeasesArgs) -> Result<i32> {
    if args.logs || args.console {
        return get_lease_logs(&args).await;
    }
    if let Some(name) = &args.name {
        anyhow::bail!(
            "jmp get leases lists leases; for lease {name:?} pass --logs or --console, \
             or use jmp describe lease {name}"
        );
    }
    let (mode, wide) = get_mode(args.output.as_deref())?;
    let api = connect(&args.client).await?;
    let query = LeaseQuery {
        selector: join_selectors(&args.selector),
        include_ended: args.all,
        tag_filter: args.tag_filter.clone().unwrap_or_default(),
        page_size: args.page_size,
    };
    let leases = api
        .list_leases(&query)
        .await
        .map_err(|e| api_error("cannot list leases", e))?;
    let now = Timestamp::now();
    let views: Vec<LeaseView> = leases
        .iter()
        .filter(|l| args.all_clients || api.may_use(l))
        .map(|l| LeaseView::from_proto(l, now))
        .collect();
    for v in &views {
        warn_deprecated_selector_labels(Some(&v.name), &v.deprecated_labels);
    }
    print_leases(mode, views, now, wide)?;
    Ok(0)
}

/// `jmp get lease NAME --logs`: the lease's gathered log, from our extension API.
async fn get_lease_logs(args: &GetLeasesArgs) -> Result<i32> {
    let format = crate::lease_logs::LogFormat::from_flag(args.output.as_deref())?;
    let name = args.name.as_deref().unwrap_or_default();
    let api = connect(&args.client).await?;
    let what = format!("cannot get the logs of lease {name:?}");
    let logs = ClientExtensionServiceClient::new(api.channel())
        .get_lease_logs(jumpstarter_proto::ext_v1::GetLeaseLogsRequest {
            name: format!("namespaces/{}/leases/{name}", api.namespace()),
            console: args.console,
        })
        .await
        .map_err(|s| match s.code() {
            tonic::Code::Unimplemented => anyhow::anyhow!(
                "{what}: the controller does not gather logs (an upstream controller)"
            ),
            code => rpc_error_text(&what, code, s.message()),
        })?
        .into_inner();
    if args.console {
        crate::lease_logs::print_console(&logs, format)?;
    } else {
        crate::lease_logs::print(&logs, format)?;
    }
    Ok(0)
}

/// Runs `jmp describe ...`.
pub async fn describe(cmd: DescribeCommand) -> Result<i32> {
    match cmd {
        DescribeCommand::Exporter(args) => {
            let mode = OutputMode::from_flag(args.output.as_deref())?;
            let api = connect(&args.client).await?;
            let e = api
                .get_exporter(&args.name, false)
                .await
                .map_err(|e| api_error(&format!("cannot get exporter {:?}", args.name), e))?;
            let now = Timestamp::now();
            let mut view = ExporterView::from_proto(&e);
            // Only the caller's own leases are visible; another client's lease shows in
            // the status (LEASE_READY) but not here.
            let leases = active_leases(&api).await.unwrap_or_default();
            view.lease = leases_by_exporter(&leases, now).remove(&view.name);
            // The drivers come from our extension API; an upstream controller does not have
            // it, and describing the rest must not fail for want of them.
            match ClientExtensionServiceClient::new(api.channel())
                .get_exporter_devices(GetExporterDevicesRequest {
                    name: e.name.clone(),
                })
                .await
            {
                Ok(reg) if reg.get_ref().registered => {
                    view.drivers = Some(driver_views(reg.get_ref()))
                }
                // The controller forgets an exporter's drivers when it stops; one that never
                // reported a status never registered.
                Ok(_)
                    if e.status == ExporterStatus::Offline as i32
                        || (!view.online.unwrap_or(true)
                            && e.status != ExporterStatus::Unspecified as i32) =>
                {
                    view.drivers_note =
                        Some("the exporter is offline; they are known while it runs".into())
                }
                Ok(_) => view.drivers_note = Some("the exporter has not registered yet".into()),
                Err(s) if s.code() == tonic::Code::Unimplemented => {
                    view.drivers_note = Some("the controller does not report drivers".into())
                }
                Err(s) => view.drivers_note = Some(format!("cannot get them: {}", s.message())),
            }
            match mode {
                OutputMode::Plain => print!("{}", describe_exporter(&view, &TimeZone::system())),
                m => print_structured(m, &view)?,
            }
            Ok(0)
        }
        DescribeCommand::Lease(args) => {
            let mode = OutputMode::from_flag(args.output.as_deref())?;
            let api = connect(&args.client).await?;
            let l = api
                .get_lease(&args.name)
                .await
                .map_err(|e| api_error(&format!("cannot get lease {:?}", args.name), e))?;
            let view = LeaseView::from_proto(&l, Timestamp::now());
            match mode {
                OutputMode::Plain => print!("{}", describe_lease(&view, &TimeZone::system())),
                m => print_structured(m, &view)?,
            }
            Ok(0)
        }
        DescribeCommand::Client(args) => {
            let mode = OutputMode::from_flag(args.output.as_deref())?;
            let cfg = match (&args.client_config, &args.name) {
                (Some(p), _) => ClientConfig::load(p)?,
                (None, Some(alias)) => ClientConfig::load_alias(alias)?,
                (None, None) => ClientConfig::resolve(None, None)?,
            };
            let user = UserConfig::load_or_default(&UserConfig::default_path())?;
            let view = ClientView::new(
                &cfg,
                user.config.current_client.as_deref(),
                Timestamp::now(),
            );
            match mode {
                OutputMode::Plain => print!("{}", describe_client(&view)),
                m => print_structured(m, &view)?,
            }
            Ok(0)
        }
    }
}

/// Runs `jmp create lease`.
pub async fn create(cmd: CreateCommand) -> Result<i32> {
    let CreateCommand::Lease(args) = cmd;
    let mode = OutputMode::from_flag(args.output.as_deref())?;
    // Check everything before talking to the controller, so bad input changes nothing.
    let request = LeaseRequest {
        selector: join_selectors(&args.selector),
        exporter_name: args.name.clone(),
        duration: parse_lease_duration(&args.duration)?,
        begin_time: args
            .begin_time
            .as_deref()
            .map(|b| parse_begin_time(b, &TimeZone::system()))
            .transpose()?
            .map(std::time::SystemTime::from),
        tags: parse_key_values(&args.tag, "tag")?,
        lease_id: args.lease_id.clone(),
        allow_disabled: args.allow_disabled,
        shared_with: args.share.clone(),
        context: crate::values::parse_context(&args.context)?,
    };
    request.check()?;
    let api = connect(&args.client).await?;
    let created = api
        .create_lease(&request)
        .await
        .map_err(|e| api_error("cannot create the lease", e))?;
    let now = Timestamp::now();
    let view = LeaseView::from_proto(&created, now);
    warn_deprecated_selector_labels(None, &view.deprecated_labels);
    print_lease(mode, view, now)?;
    Ok(0)
}

/// Runs `jmp update lease`.
pub async fn update(cmd: UpdateCommand) -> Result<i32> {
    let UpdateCommand::Lease(args) = cmd;
    let mode = OutputMode::from_flag(args.output.as_deref())?;
    if let Some(c) = &args.to_client
        && (c.is_empty() || c.contains('/'))
    {
        bail!("invalid --to-client {c:?}: give the name of a client in the same namespace");
    }
    let update = LeaseUpdate {
        duration: args
            .duration
            .as_deref()
            .map(parse_lease_duration)
            .transpose()?,
        begin_time: args
            .begin_time
            .as_deref()
            .map(|b| parse_begin_time(b, &TimeZone::system()))
            .transpose()?
            .map(std::time::SystemTime::from),
        to_client: args.to_client.clone(),
        share_add: args.share_add.clone(),
        share_remove: args.share_remove.clone(),
    };
    let api = connect(&args.client).await?;
    let updated = api
        .update_lease(&args.name, &update)
        .await
        .map_err(|e| api_error(&format!("cannot update lease {:?}", args.name), e))?;
    let now = Timestamp::now();
    print_lease(mode, LeaseView::from_proto(&updated, now), now)?;
    Ok(0)
}

/// Runs `jmp delete leases`.
pub async fn delete(cmd: DeleteCommand) -> Result<i32> {
    let DeleteCommand::Leases(args) = cmd;
    let mode = OutputMode::from_flag(args.output.as_deref())?;
    let by_query = !args.selector.is_empty() || args.all || args.all_clients;
    if args.names.is_empty() && !by_query {
        bail!("no leases given: name them, or use -l SELECTOR, --all or --all-clients");
    }
    if !args.names.is_empty() && by_query {
        bail!("give lease names, or -l/--all/--all-clients, not both");
    }
    let api = connect(&args.client).await?;
    let names: Vec<String> = if by_query {
        let query = LeaseQuery {
            selector: join_selectors(&args.selector),
            ..LeaseQuery::default()
        };
        api.list_leases(&query)
            .await
            .map_err(|e| api_error("cannot list leases", e))?
            .iter()
            .filter(|l| args.all_clients || api.owns(l))
            .map(|l| short_name(&l.name).to_string())
            .collect()
    } else {
        args.names.clone()
    };
    for name in &names {
        api.delete_lease(name)
            .await
            .map_err(|e| api_error(&format!("cannot delete lease {name:?}"), e))?;
        match mode {
            OutputMode::Name => println!("{name}"),
            _ => println!("lease \"{name}\" deleted"),
        }
    }
    if names.is_empty() && mode != OutputMode::Name {
        eprintln!("No leases to delete.");
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use jumpstarter_proto::v1::Time;

    use super::*;

    fn seed_lease() -> Lease {
        let ts = |s: &str| {
            let t: Timestamp = s.parse().unwrap();
            prost_types::Timestamp {
                seconds: t.as_second(),
                nanos: 0,
            }
        };
        Lease {
            name: "namespaces/jumpstarter-lab/leases/01a05822-e378-71cc-a98c-a216ad4a9432".into(),
            selector: "foo=bar".into(),
            duration: Some(prost_types::Duration {
                seconds: 300,
                nanos: 0,
            }),
            effective_begin_time: Some(ts("2026-08-31T14:04:36Z")),
            client: Some("namespaces/jumpstarter-lab/clients/hello".into()),
            exporter: Some("namespaces/jumpstarter-lab/exporters/example-distributed".into()),
            conditions: vec![Condition {
                r#type: Some("Ready".into()),
                status: Some("True".into()),
                observed_generation: Some(1),
                last_transition_time: Some(Time {
                    seconds: Some(ts("2026-08-31T14:04:36Z").seconds),
                    nanos: Some(0),
                }),
                reason: Some("Ready".into()),
                message: Some("An exporter has been acquired for the client".into()),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn describe_lease_matches_the_seed() {
        let now: Timestamp = "2026-08-31T14:05:00Z".parse().unwrap();
        let view = LeaseView::from_proto(&seed_lease(), now);
        assert_eq!(view.status, "In-Use");
        // The seed was made in New York.
        let ny = TimeZone::get("America/New_York").unwrap();
        let text = describe_lease(&view, &ny);
        assert_eq!(
            text,
            "Name:                  01a05822-e378-71cc-a98c-a216ad4a9432
Namespace:             jumpstarter-lab
Selector:              foo=bar
Exporter:              example-distributed
Client:                hello
Status:                In-Use
Duration:              0:05:00
Effective Begin Time:  2026-08-31 10:04:36 EDT
Effective End Time:    <none>
Tags:  <none>
Context:  <none>
Conditions:
  Type   Status  Reason  Message                                       Last Transition Time
  ----   ------  ------  -------                                       --------------------
  Ready  True    Ready   An exporter has been acquired for the client  2026-08-31 14:04:36 UTC
"
        );
    }

    #[allow(deprecated)]
    fn seed_exporter() -> Exporter {
        Exporter {
            name: "namespaces/jumpstarter-lab/exporters/example-distributed".into(),
            labels: HashMap::from([("foo".to_string(), "bar".to_string())]),
            online: true,
            status: ExporterStatus::Available as i32,
            enabled: Some(true),
            ..Default::default()
        }
    }

    #[test]
    fn describe_exporter_matches_the_seed() {
        let view = ExporterView::from_proto(&seed_exporter());
        assert_eq!(
            describe_exporter(&view, &TimeZone::UTC),
            "Name:       example-distributed
Namespace:  jumpstarter-lab
Labels:
  foo=bar
Online:   yes
Status:   AVAILABLE
Enabled:  yes
Lease:  <none>
"
        );
        let json = crate::output::to_json(&view).unwrap();
        assert!(json.starts_with("{\n    \"namespace\": \"jumpstarter-lab\",\n    \"name\": \"example-distributed\",\n    \"labels\": {\n        \"foo\": \"bar\"\n    },"), "{json}");
    }

    #[test]
    fn an_unhealthy_exporter_shows_its_reason_and_last_output() {
        let mut e = seed_exporter();
        e.status_message =
            "[UNHEALTHY] healthCheck: failed 3 times in a row (last: Hook failed with exit code 1)\nno answer\npower rail low"
                .into();
        let view = ExporterView::from_proto(&e);
        assert_eq!(view.status.as_deref(), Some("UNHEALTHY"));
        assert_eq!(
            describe_exporter(&view, &TimeZone::UTC),
            "Name:       example-distributed
Namespace:  jumpstarter-lab
Labels:
  foo=bar
Online:   yes
Status:   UNHEALTHY
Enabled:  yes
Health:         Unhealthy (leased to nobody until an admin clears it)
Health Reason:  healthCheck: failed 3 times in a row (last: Hook failed with exit code 1)
Last Output:
  no answer
  power rail low
Lease:  <none>
"
        );
    }

    #[test]
    fn get_exporters_table_matches_the_seed() {
        let mut view = ExporterView::from_proto(&seed_exporter());
        assert_eq!(
            exporters_table(
                std::slice::from_ref(&view),
                false,
                false,
                false,
                false,
                &TimeZone::UTC
            )
            .render(0),
            "NAME                 LABELS\nexample-distributed  foo=bar\n"
        );
        let t = exporters_table(
            std::slice::from_ref(&view),
            true,
            true,
            true,
            false,
            &TimeZone::UTC,
        )
        .render(0);
        assert!(
            t.starts_with(
                "NAME                 ONLINE  STATUS     LABELS   LEASED BY  LEASE STATUS  RELEASE TIME\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("yes     AVAILABLE  foo=bar             Available"),
            "{t}"
        );
        // An offline exporter nobody holds is not shown as available for a lease.
        let mut offline = seed_exporter();
        offline.status = ExporterStatus::Offline as i32;
        #[allow(deprecated)]
        {
            offline.online = false;
        }
        let t = exporters_table(
            &[ExporterView::from_proto(&offline)],
            true,
            true,
            true,
            false,
            &TimeZone::UTC,
        )
        .render(0);
        assert!(
            t.contains("no      OFFLINE  foo=bar             Offline"),
            "{t}"
        );
        assert!(!t.contains("Available"), "{t}");
        let mut leased = seed_exporter();
        leased.status = ExporterStatus::LeaseReady as i32;
        let other = ExporterView::from_proto(&leased);
        let t = exporters_table(
            std::slice::from_ref(&other),
            false,
            false,
            true,
            false,
            &TimeZone::UTC,
        )
        .render(0);
        assert!(t.contains("(another client)  In-Use"), "{t}");
        assert!(
            describe_exporter(&other, &TimeZone::UTC).ends_with("Lease:  held by another client\n")
        );
        view.lease = Some(LeaseView::from_proto(&seed_lease(), Timestamp::now()));
        let t = exporters_table(&[view], false, false, true, false, &TimeZone::UTC).render(0);
        assert!(t.contains("hello      In-Use"), "{t}");
    }

    #[test]
    fn get_leases_table_has_upstreams_columns() {
        let now: Timestamp = "2026-08-31T14:05:36Z".parse().unwrap();
        let mut lease = seed_lease();
        lease.tags.insert("build".into(), "7".into());
        let view = LeaseView::from_proto(&lease, now);
        assert_eq!(
            leases_table(std::slice::from_ref(&view), now, &TimeZone::UTC, false).render(0),
            "NAME                                  SELECTOR  EXPIRES AT               REMAINING  CLIENT  EXPORTER             TAGS
01a05822-e378-71cc-a98c-a216ad4a9432  foo=bar   2026-08-31 14:09:36 UTC  0h 4m      hello   example-distributed  build=7
"
        );
    }

    #[test]
    fn wide_lease_table_adds_status_begin_and_duration() {
        let now: Timestamp = "2026-08-31T14:05:36Z".parse().unwrap();
        let view = LeaseView::from_proto(&seed_lease(), now);
        insta::assert_snapshot!(
            leases_table(&[view], now, &TimeZone::UTC, true).render(0),
            @r"
        NAME                                  SELECTOR  EXPIRES AT               REMAINING  CLIENT  EXPORTER             TAGS  STATUS  BEGIN TIME               DURATION
        01a05822-e378-71cc-a98c-a216ad4a9432  foo=bar   2026-08-31 14:09:36 UTC  0h 4m      hello   example-distributed        In-Use  2026-08-31 14:04:36 UTC  0:05:00
        "
        );
    }

    #[test]
    fn describe_exporter_lists_the_drivers_by_path_with_their_client_classes() {
        use jumpstarter_proto::ext_v1::Device;
        let device = |uuid: &str, parent: &str, labels: &[(&str, &str)]| Device {
            uuid: uuid.into(),
            parent_uuid: parent.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let reg = ExporterDevices {
            name: "namespaces/jumpstarter-lab/exporters/example-distributed".into(),
            registered: true,
            devices: vec![
                device(
                    "u0",
                    "",
                    &[(
                        "jumpstarter.dev/client",
                        "jumpstarter_driver_composite.client.CompositeClient",
                    )],
                ),
                device(
                    "u1",
                    "u0",
                    &[
                        (
                            "jumpstarter.dev/client",
                            "jumpstarter_driver_power.client.PowerClient",
                        ),
                        ("jumpstarter.dev/name", "power"),
                    ],
                ),
                device(
                    "u2",
                    "u0",
                    &[
                        (
                            "jumpstarter.dev/client",
                            "jumpstarter_driver_composite.client.CompositeClient",
                        ),
                        ("jumpstarter.dev/name", "serial"),
                    ],
                ),
                device(
                    "u3",
                    "u2",
                    &[
                        (
                            "jumpstarter.dev/client",
                            "jumpstarter_driver_pyserial.client.PySerialClient",
                        ),
                        ("jumpstarter.dev/name", "console"),
                        ("baud", "115200"),
                    ],
                ),
            ],
        };
        let mut view = ExporterView::from_proto(&seed_exporter());
        view.drivers = Some(driver_views(&reg));
        insta::assert_snapshot!(describe_exporter(&view, &TimeZone::UTC), @r"
        Name:       example-distributed
        Namespace:  jumpstarter-lab
        Labels:
          foo=bar
        Online:   yes
        Status:   AVAILABLE
        Enabled:  yes
        Lease:  <none>
        Drivers:
          Name            Client                                               Labels
          ----            ------                                               ------
          (root)          jumpstarter_driver_composite.client.CompositeClient  <none>
          power           jumpstarter_driver_power.client.PowerClient          <none>
          serial          jumpstarter_driver_composite.client.CompositeClient  <none>
          serial.console  jumpstarter_driver_pyserial.client.PySerialClient    baud=115200
        ");
        // An upstream controller: the rest is described, and why the drivers are not.
        view.drivers = None;
        view.drivers_note = Some("the controller does not report drivers".into());
        assert!(
            describe_exporter(&view, &TimeZone::UTC)
                .ends_with("Drivers:  <unknown> (the controller does not report drivers)\n")
        );
    }

    #[test]
    fn lease_status_words() {
        let now = Timestamp::now();
        let mut l = seed_lease();
        assert_eq!(lease_status(&l, now), "In-Use");
        l.conditions[0].status = Some("False".into());
        l.conditions[0].reason = Some("Released".into());
        assert_eq!(lease_status(&l, now), "Released");
        l.conditions[0].reason = Some("Expired".into());
        assert_eq!(lease_status(&l, now), "Expired");
        l.conditions = vec![Condition {
            r#type: Some("Pending".into()),
            status: Some("True".into()),
            ..Default::default()
        }];
        assert_eq!(lease_status(&l, now), "Waiting");
        l.begin_time = Some(prost_types::Timestamp {
            seconds: now.as_second() + 3600,
            nanos: 0,
        });
        assert_eq!(lease_status(&l, now), "Scheduled");
        l.conditions.push(Condition {
            r#type: Some("Unsatisfiable".into()),
            status: Some("True".into()),
            ..Default::default()
        });
        assert_eq!(lease_status(&l, now), "Unsatisfiable");
    }

    #[test]
    fn describe_client_matches_the_seed() {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let token = format!(
            "{}.{}.sig",
            b64(r#"{"alg":"ES256"}"#),
            b64(r#"{"exp":1819591256}"#)
        );
        let cfg = ClientConfig {
            metadata: jumpstarter_core::config::ObjectMeta {
                namespace: Some("jumpstarter-lab".into()),
                name: "hello".into(),
            },
            endpoint: Some("grpc.jumpstarter.example.com:443".into()),
            tls: jumpstarter_core::config::TlsConfig {
                ca: "LS0tLS1CRUdJTg==".into(),
                insecure: true,
            },
            token: Some(token),
            drivers: jumpstarter_core::config::DriversConfig {
                allow: vec![],
                allow_unsafe: true,
            },
            path: Some("/home/user/.config/jumpstarter/clients/hello.yaml".into()),
            ..ClientConfig::default()
        };
        let now = Timestamp::from_second(1819591256 - (8723 * 3600 + 53 * 60 + 30)).unwrap();
        let view = ClientView::new(&cfg, Some("hello"), now);
        assert_eq!(
            describe_client(&view),
            "Alias:      hello
Path:       /home/user/.config/jumpstarter/clients/hello.yaml
Current:    yes
Name:       hello
Namespace:  jumpstarter-lab
Endpoint:   grpc.jumpstarter.example.com:443
TLS:
  CA:        configured
  Insecure:  yes
Drivers:
  Allow:   <none>
  Unsafe:  yes
Token:
  Expiry:  2027-08-30 02:00:56 UTC
  Status:  Valid (8723h 53m remaining)
Refresh Token Stored:  no
"
        );
    }

    #[test]
    fn with_fields_are_checked() {
        assert_eq!(
            parse_with(&["leases,online".into(), "status".into()]).unwrap(),
            (true, true, true)
        );
        assert!(parse_with(&["bogus".into()]).is_err());
        // Upstream lowercases and accepts repeats.
        assert_eq!(
            parse_with(&["Online, STATUS".into(), "online".into()]).unwrap(),
            (false, true, true)
        );
    }
}
