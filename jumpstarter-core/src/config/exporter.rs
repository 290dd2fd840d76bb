//! Exporter config files (`kind: ExporterConfig`), in upstream's format.
//!
//! ```yaml
//! apiVersion: jumpstarter.dev/v1alpha1
//! kind: ExporterConfig
//! metadata: {namespace: default, name: demo}
//! endpoint: ""
//! token: ""
//! export:
//!   power:
//!     type: jumpstarter_driver_power.driver.MockPower
//! ```
//!
//! Each entry of `export` (and of any `children`) is one of: `{type, config?, children?,
//! description?, methods_description?}`, `{children}` (an implicit Composite), or
//! `{ref: "a.b"}` (the node at that dotted path, reported again under this name).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

/// The API version of every config file.
pub const API_VERSION: &str = "jumpstarter.dev/v1alpha1";

/// A config file could not be used; the message names the file, line and field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file could not be written.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The YAML is malformed or a field has the wrong type.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// No config has this alias.
    #[error("no {kind} config named {alias:?} in {}{}", dir.display(), known_aliases(alias, known))]
    UnknownAlias {
        /// `client` or `exporter`.
        kind: &'static str,
        /// The alias asked for.
        alias: String,
        /// Where configs with aliases live.
        dir: PathBuf,
        /// The aliases that exist, sorted.
        known: Vec<String>,
    },
    /// A field has an invalid value.
    #[error("{path}:{line}: {field}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based line (0 when unknown).
        line: u64,
        /// Dotted path of the field.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// `; known: a, b (did you mean "a"?)` for [`ConfigError::UnknownAlias`].
fn known_aliases(alias: &str, known: &[String]) -> String {
    if known.is_empty() {
        return " (there are none yet)".into();
    }
    let close = known
        .iter()
        .map(|k| (edit_distance(alias, k), k))
        .filter(|(d, _)| *d <= 2)
        .min();
    let mut text = format!("; known: {}", known.join(", "));
    if let Some((_, k)) = close {
        text.push_str(&format!(" (did you mean {k:?}?)"));
    }
    text
}

/// Levenshtein distance, for "did you mean".
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// `metadata` of a config file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// Namespace on the controller.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Name on the controller.
    #[serde(default)]
    pub name: String,
}

/// `tls` of a config file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TlsConfig {
    /// Base64 of a PEM CA bundle ("" = system roots).
    #[serde(default)]
    pub ca: String,
    /// Trust whatever certificate the server presents.
    #[serde(default)]
    pub insecure: bool,
}

/// One lease hook (`beforeLease` / `afterLease`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hook {
    /// Interpreter to run the script with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<String>,
    /// The script.
    pub script: String,
    /// Seconds before the hook is stopped.
    #[serde(default = "default_hook_timeout")]
    pub timeout: u64,
    /// `warn`, `endLease` or `exit`.
    #[serde(default = "default_on_failure", rename = "onFailure")]
    pub on_failure: String,
}

fn default_hook_timeout() -> u64 {
    120
}
fn default_on_failure() -> String {
    "warn".into()
}

/// `hooks` of an exporter config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hooks {
    /// Runs before a lease is handed to the client.
    #[serde(default, rename = "beforeLease")]
    pub before_lease: Option<Hook>,
    /// Runs after a lease ends.
    #[serde(default, rename = "afterLease")]
    pub after_lease: Option<Hook>,
}

/// `healthCheck` of an exporter config (ours, not upstream's; see `docs/hooks.md`): a script
/// run between leases every `interval` seconds, and the quarantine threshold: after
/// `threshold` failures in a row (of the health check or of a lease hook) the exporter tells
/// the controller it is unhealthy and is leased to nobody until an admin clears it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthCheck {
    /// Interpreter to run the script with (auto-detected as for hooks when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<String>,
    /// The script, inline or a file path; absent: only hook failures count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// Seconds between two runs (counted from the end of the previous run or lease).
    #[serde(default = "default_health_interval")]
    pub interval: u64,
    /// Seconds before a run is stopped (and counts as failed).
    #[serde(default = "default_hook_timeout")]
    pub timeout: u64,
    /// Failures in a row that make the exporter unhealthy.
    #[serde(default = "default_health_threshold")]
    pub threshold: u32,
}

fn default_health_interval() -> u64 {
    300
}
fn default_health_threshold() -> u32 {
    3
}

/// `consoleTranscripts` of an exporter config (ours, not upstream's; see
/// `docs/consoles-and-networks.md`): keep a transcript of each console per lease in `dir`.
/// A console driver with `transcript: false` is never recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleTranscripts {
    /// The directory: one subdirectory per lease, one file per console.
    pub dir: PathBuf,
    /// Bytes each console's transcript may grow to (then it says it was cut).
    #[serde(rename = "maxBytes", default = "default_transcript_bytes")]
    pub max_bytes: u64,
    /// Leases whose transcripts are kept (the oldest beyond are removed).
    #[serde(rename = "keepLeases", default = "default_transcript_leases")]
    pub keep_leases: usize,
    /// Days a lease's transcripts are kept.
    #[serde(rename = "maxAgeDays", default = "default_transcript_days")]
    pub max_age_days: u64,
}

fn default_transcript_bytes() -> u64 {
    4 << 20
}
fn default_transcript_leases() -> usize {
    50
}
fn default_transcript_days() -> u64 {
    30
}

/// `failureDetection` of an exporter config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureDetection {
    /// Restarts within the window before `jmp run` gives up.
    #[serde(rename = "maxRapidFailures", default = "default_max_failures")]
    pub max_rapid_failures: u32,
    /// The window, in seconds.
    #[serde(rename = "rapidFailureWindow", default = "default_failure_window")]
    pub rapid_failure_window: u32,
}

fn default_max_failures() -> u32 {
    5
}
fn default_failure_window() -> u32 {
    60
}

impl Default for FailureDetection {
    fn default() -> Self {
        Self {
            max_rapid_failures: default_max_failures(),
            rapid_failure_window: default_failure_window(),
        }
    }
}

/// One node of the `export` tree, as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverInstance {
    /// The driver type, e.g. `jumpstarter_driver_power.driver.MockPower`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub driver_type: Option<Spanned<String>>,
    /// A dotted path to another node (a proxy).
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<Spanned<String>>,
    /// Description (help text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Help text per CLI command.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub methods_description: BTreeMap<String, String>,
    /// Constructor arguments of the driver.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub config: serde_json::Value,
    /// Child drivers, in order.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub children: IndexMap<String, DriverInstance>,
}

/// An exporter config file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExporterConfig {
    /// Always `jumpstarter.dev/v1alpha1`.
    #[serde(rename = "apiVersion", default = "api_version")]
    pub api_version: String,
    /// Always `ExporterConfig`.
    #[serde(default = "exporter_kind")]
    pub kind: String,
    /// Name and namespace on the controller.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Controller endpoint (`host:port`), for controller mode.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// TLS settings towards the controller.
    #[serde(default)]
    pub tls: TlsConfig,
    /// Bearer token for the controller.
    #[serde(default)]
    pub token: Option<String>,
    /// gRPC channel options.
    #[serde(rename = "grpcOptions", default)]
    pub grpc_options: BTreeMap<String, serde_json::Value>,
    /// Description of the root driver.
    #[serde(default)]
    pub description: Option<String>,
    /// The driver tree (`export:` with nothing under it is an empty tree, as generated
    /// configs have it: see [`EMPTY_EXPORT`]).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub export: IndexMap<String, DriverInstance>,
    /// Lease hooks.
    #[serde(default)]
    pub hooks: Hooks,
    /// `jmp run` restart policy.
    #[serde(rename = "failureDetection", default)]
    pub failure_detection: FailureDetection,
    /// Health checks and quarantine (ours, not upstream): see [`HealthCheck`].
    #[serde(
        rename = "healthCheck",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub health_check: Option<HealthCheck>,
    /// Direct path (ours, not upstream): serve leased clients on this `[HOST:]PORT` too, over
    /// per-lease mutual TLS (see [`crate::client::direct`]). Absent: router only.
    #[serde(
        rename = "directListener",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub direct_listener: Option<String>,
    /// The host name clients use for the direct listener (default: the listener's host,
    /// or this machine's name when it listens on all addresses).
    #[serde(
        rename = "directAdvertise",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub direct_advertise: Option<String>,
    /// `motd` (upstream main): a message of the day, returned to clients in `GetReport` and
    /// printed by `jmp shell` before an interactive shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub motd: Option<String>,
    /// `exitOnLeaseEnd` (upstream main): in controller mode, exit (code 0) once the first
    /// lease ends, after its afterLease hook, instead of waiting for the next lease.
    #[serde(rename = "exitOnLeaseEnd", default, skip_serializing_if = "is_false")]
    pub exit_on_lease_end: bool,
    /// Console transcripts per lease (ours, not upstream): see [`ConsoleTranscripts`].
    #[serde(
        rename = "consoleTranscripts",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub console_transcripts: Option<ConsoleTranscripts>,
    /// Where it was loaded from (not part of the file).
    #[serde(skip)]
    pub path: Option<PathBuf>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The `export:` of a generated config without drivers: empty, and ready to be extended by
/// hand (a line `export: {}` cannot be; YAML refuses entries under it).
pub const EMPTY_EXPORT: &str = "export:
  # The drivers, two spaces in, e.g.:
  # power:
  #   type: jumpstarter_driver_power.driver.MockPower
";

/// `export:` with nothing under it (YAML null) reads as no drivers.
fn null_as_empty<'de, D>(d: D) -> Result<IndexMap<String, DriverInstance>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(Option::<IndexMap<String, DriverInstance>>::deserialize(d)?.unwrap_or_default())
}

fn api_version() -> String {
    API_VERSION.into()
}
fn exporter_kind() -> String {
    "ExporterConfig".into()
}

impl ExporterConfig {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg = Self::parse(&text, path)?;
        cfg.path = Some(path.to_path_buf());
        Ok(cfg)
    }

    /// Parses and validates config text; `path` is used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let cfg: ExporterConfig = serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: crate::error_chain(&e),
        })?;
        let invalid = |line: u64, field: &str, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            line,
            field: field.to_string(),
            message,
        };
        if cfg.kind != "ExporterConfig" {
            return Err(invalid(
                0,
                "kind",
                format!("expected ExporterConfig, found {:?}", cfg.kind),
            ));
        }
        if cfg.api_version != API_VERSION {
            return Err(invalid(
                0,
                "apiVersion",
                format!("expected {API_VERSION}, found {:?}", cfg.api_version),
            ));
        }
        for (name, inst) in &cfg.export {
            validate(&format!("export.{name}"), inst, &invalid)?;
        }
        crate::config::keys::warn_unknown(path, &crate::config::keys::unknown_exporter_keys(text));
        Ok(cfg)
    }

    /// The YAML text of this config; an empty `export` is written as [`EMPTY_EXPORT`], so
    /// that drivers can be added under it by hand.
    pub fn to_yaml(&self) -> Result<String, ConfigError> {
        let text = serde_saphyr::to_string(self).map_err(|e| ConfigError::Parse {
            path: self.path.clone().unwrap_or_default(),
            message: crate::error_chain(&e),
        })?;
        Ok(match text.find("\nexport: {}\n") {
            Some(i) if self.export.is_empty() => format!(
                "{}\n{EMPTY_EXPORT}{}",
                &text[..i],
                &text[i + "\nexport: {}\n".len()..]
            ),
            _ => text,
        })
    }
}

fn validate(
    field: &str,
    inst: &DriverInstance,
    invalid: &dyn Fn(u64, &str, String) -> ConfigError,
) -> Result<(), ConfigError> {
    if let (Some(t), Some(_)) = (&inst.driver_type, &inst.reference) {
        return Err(invalid(
            t.referenced.line(),
            field,
            "give either `type` or `ref`, not both".into(),
        ));
    }
    if inst.driver_type.is_none() && inst.reference.is_none() && inst.children.is_empty() {
        return Err(invalid(
            0,
            field,
            "a driver needs `type`, `ref` or `children`".into(),
        ));
    }
    if let Some(t) = &inst.driver_type
        && t.value.trim().is_empty()
    {
        return Err(invalid(
            t.referenced.line(),
            &format!("{field}.type"),
            "empty driver type".into(),
        ));
    }
    if !matches!(
        inst.config,
        serde_json::Value::Null | serde_json::Value::Object(_)
    ) {
        return Err(invalid(
            0,
            &format!("{field}.config"),
            "expected a mapping of driver arguments".into(),
        ));
    }
    for (name, child) in &inst.children {
        validate(&format!("{field}.children.{name}"), child, invalid)?;
    }
    Ok(())
}

/// The user config directory: `$JMP_CLIENT_CONFIG_HOME`, else `$XDG_CONFIG_HOME/jumpstarter`
/// (default `~/.config/jumpstarter`).
pub fn config_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("JMP_CLIENT_CONFIG_HOME").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| dirs::home_dir().map(|h| h.join(".config")))
        .unwrap_or_else(|| PathBuf::from(".config"));
    base.join("jumpstarter")
}

/// The system exporter config directory.
pub const SYSTEM_EXPORTER_DIR: &str = "/etc/jumpstarter/exporters";

/// Finds the exporter config for an alias: the user directory first, then `/etc`.
pub fn exporter_config_path(alias: &str) -> Result<PathBuf, ConfigError> {
    if alias.is_empty() || alias.contains(['/', '\\']) || alias == "." || alias == ".." {
        return Err(ConfigError::Invalid {
            path: PathBuf::from(alias),
            line: 0,
            field: "alias".into(),
            message: "an alias may not be empty or contain '/', '\\', '.' or '..'".into(),
        });
    }
    let user = config_dir().join("exporters").join(format!("{alias}.yaml"));
    if user.exists() {
        return Ok(user);
    }
    let system = Path::new(SYSTEM_EXPORTER_DIR).join(format!("{alias}.yaml"));
    if system.exists() {
        return Ok(system);
    }
    Err(ConfigError::Read {
        path: user,
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no exporter config named {alias:?} (also looked in {SYSTEM_EXPORTER_DIR})"),
        ),
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_unknown_alias_lists_the_known_ones_and_suggests_the_closest() {
        let e = ConfigError::UnknownAlias {
            kind: "client",
            alias: "helo".into(),
            dir: PathBuf::from("/c/clients"),
            known: vec!["hello".into(), "lab".into()],
        };
        assert_eq!(
            e.to_string(),
            "no client config named \"helo\" in /c/clients; known: hello, lab (did you mean \"hello\"?)"
        );
        let none = ConfigError::UnknownAlias {
            kind: "client",
            alias: "x".into(),
            dir: PathBuf::from("/c"),
            known: vec![],
        };
        assert_eq!(
            none.to_string(),
            "no client config named \"x\" in /c (there are none yet)"
        );
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "ab"), 2);
    }

    #[test]
    fn a_generated_config_without_drivers_takes_drivers_added_by_hand() {
        let cfg = ExporterConfig::parse("kind: ExporterConfig\n", Path::new("x.yaml")).unwrap();
        let text = cfg.to_yaml().unwrap();
        assert!(text.contains(EMPTY_EXPORT), "{text}");
        assert!(!text.contains("export: {}"), "{text}");
        let back = ExporterConfig::parse(&text, Path::new("x.yaml")).unwrap();
        assert!(back.export.is_empty());
        // What docs/quickstart.md says to do: add the drivers under `export:`.
        let edited = text.replace(
            EMPTY_EXPORT,
            &format!(
                "{EMPTY_EXPORT}  power:\n    type: jumpstarter_driver_power.driver.MockPower\n"
            ),
        );
        let edited = ExporterConfig::parse(&edited, Path::new("x.yaml")).unwrap();
        assert_eq!(edited.export.keys().collect::<Vec<_>>(), ["power"]);
    }

    use super::*;

    const DEMO: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: demo
endpoint: \"\"
token: \"\"
export:
  storage:
    type: jumpstarter_driver_opendal.driver.MockStorageMux
  power:
    type: jumpstarter_driver_power.driver.MockPower
    description: the bench supply
    config:
      voltage: 5
  group:
    children:
      inner:
        ref: power
";

    #[test]
    fn parses_upstream_config_in_order() {
        let cfg = ExporterConfig::parse(DEMO, Path::new("demo.yaml")).unwrap();
        let names: Vec<_> = cfg.export.keys().cloned().collect();
        assert_eq!(names, ["storage", "power", "group"]);
        let power = &cfg.export["power"];
        assert_eq!(
            power.driver_type.as_ref().unwrap().value,
            "jumpstarter_driver_power.driver.MockPower"
        );
        assert_eq!(power.driver_type.as_ref().unwrap().referenced.line(), 12);
        assert_eq!(power.config["voltage"], 5);
        assert_eq!(cfg.failure_detection.max_rapid_failures, 5);
    }

    #[test]
    fn malformed_yaml_names_file_and_line() {
        let e = ExporterConfig::parse("export:\n  power: [\n", Path::new("bad.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("bad.yaml: "), "{e}");
        assert!(
            e.contains("line") || e.contains(":2") || e.contains("2:"),
            "{e}"
        );
    }

    #[test]
    fn unknown_field_in_driver_is_named() {
        let e = ExporterConfig::parse(
            "kind: ExporterConfig\nexport:\n  power:\n    typ: x.Y\n",
            Path::new("c.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("typ"), "{e}");
    }

    #[test]
    fn wrong_kind_and_empty_node_are_rejected() {
        let e = ExporterConfig::parse("kind: ClientConfig\n", Path::new("c.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("kind") && e.contains("ClientConfig"), "{e}");
        let e = ExporterConfig::parse(
            "kind: ExporterConfig\nexport:\n  power: {}\n",
            Path::new("c.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("export.power"), "{e}");
    }

    #[test]
    fn round_trips_through_yaml() {
        let cfg = ExporterConfig::parse(DEMO, Path::new("demo.yaml")).unwrap();
        let text = cfg.to_yaml().unwrap();
        let again = ExporterConfig::parse(&text, Path::new("again.yaml")).unwrap();
        assert_eq!(
            again.export.keys().collect::<Vec<_>>(),
            cfg.export.keys().collect::<Vec<_>>()
        );
        assert_eq!(again.export["power"].config, cfg.export["power"].config);
    }
    #[test]
    fn direct_listener_is_optional_and_round_trips() {
        let cfg = ExporterConfig::parse(DEMO, Path::new("demo.yaml")).unwrap();
        assert_eq!(cfg.direct_listener, None);
        assert!(!cfg.to_yaml().unwrap().contains("direct"));
        let text = format!("{DEMO}directListener: \"0.0.0.0:7000\"\ndirectAdvertise: lab1\n");
        let cfg = ExporterConfig::parse(&text, Path::new("d.yaml")).unwrap();
        assert_eq!(cfg.direct_listener.as_deref(), Some("0.0.0.0:7000"));
        assert_eq!(cfg.direct_advertise.as_deref(), Some("lab1"));
        let again = ExporterConfig::parse(&cfg.to_yaml().unwrap(), Path::new("a.yaml")).unwrap();
        assert_eq!(again.direct_listener, cfg.direct_listener);
        assert_eq!(again.direct_advertise, cfg.direct_advertise);
    }

    #[test]
    fn exit_on_lease_end_is_upstreams_key_off_by_default_and_round_trips() {
        let cfg = ExporterConfig::parse(DEMO, Path::new("demo.yaml")).unwrap();
        assert!(!cfg.exit_on_lease_end);
        assert!(!cfg.to_yaml().unwrap().contains("exitOnLeaseEnd"));
        let text = format!("{DEMO}exitOnLeaseEnd: true\n");
        let cfg = ExporterConfig::parse(&text, Path::new("x.yaml")).unwrap();
        assert!(cfg.exit_on_lease_end);
        assert!(crate::config::keys::unknown_exporter_keys(&text).is_empty());
        let again = ExporterConfig::parse(&cfg.to_yaml().unwrap(), Path::new("a.yaml")).unwrap();
        assert!(again.exit_on_lease_end);
        let e = ExporterConfig::parse(
            &format!("{DEMO}exitOnLeaseEnd: maybe\n"),
            Path::new("b.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("b.yaml"), "{e}");
    }
}
