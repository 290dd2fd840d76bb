//! The controller settings upstream keeps in the ConfigMap `jumpstarter-controller` of the
//! controller's namespace (§4.6 of the protocol notes), so a cluster configured for the
//! upstream controller keeps working:
//!
//! - key `router`: YAML map `<name>: {endpoint: "host:port", labels: {...}}`, the routers
//!   handed out in `Dial`/`Listen` (chosen by label score, see
//!   [`crate::state::ControllerState::choose_router`]);
//! - key `config`: YAML, strict (unknown fields are errors, as upstream): `authentication`,
//!   `provisioning`, `grpc.keepalive`, `leasePolicy.maxTags`, `hiddenLabels`,
//!   `deprecatedLabels`;
//! - legacy key `authentication`: kept as text; the binary reads it as upstream does
//!   (authentication from it instead of `config`, provisioning off).
//!
//! `--routers FILE` reads the same `router` map from a file (or a whole ConfigMap manifest),
//! for one-machine setups with several routers.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use serde::Deserialize;

use crate::{
    objects::duration::GoDuration,
    store::{Store, StoreError},
};

/// A router the controller hands out in `Dial`/`Listen` responses.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterEntry {
    /// Its name (the key of the `router` config map upstream).
    pub name: String,
    /// `host:port` clients and exporters dial.
    pub endpoint: String,
    /// Labels matched against the exporter's labels to choose a router.
    pub labels: std::collections::BTreeMap<String, String>,
}

/// Name of the ConfigMap upstream's operator writes.
pub const CONFIG_MAP_NAME: &str = "jumpstarter-controller";

/// The ConfigMap or routers file is unusable; names the source and the field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ClusterConfigError {
    /// The YAML does not parse or has fields of the wrong type / unknown fields.
    #[error("{source_name}: key {key:?}")]
    Yaml {
        /// Where the text came from (ConfigMap `ns/name` or a file path).
        source_name: String,
        /// The ConfigMap key (`router`, `config`) or `file`.
        key: String,
        /// The parser's error, or a message.
        #[source]
        source: jumpstarter_core::BoxError,
    },
    /// A value parses but is not acceptable.
    #[error("{source_name}: {field}: {reason}")]
    Invalid {
        /// Where the text came from.
        source_name: String,
        /// The field (e.g. `router.r1.endpoint`).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The routers file (or the authentication file) cannot be read.
    #[error("cannot read {what} {path}")]
    Read {
        /// `the routers file` or `the authentication file`.
        what: &'static str,
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The ConfigMap cannot be read from the store.
    #[error("ConfigMap {namespace}/{name}")]
    Store {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The store's error.
        source: Box<StoreError>,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouterValue {
    endpoint: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// `authentication.internal`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InternalAuthentication {
    /// Username prefix of internal tokens (`internal:` upstream).
    #[serde(default)]
    pub prefix: Option<String>,
    /// Lifetime of issued tokens (Go duration).
    #[serde(default)]
    pub token_lifetime: Option<GoDuration>,
}

/// `authentication.k8s` (not wired up upstream either).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct K8sAuthentication {
    /// Whether service-account tokens are accepted.
    #[serde(default)]
    pub enabled: bool,
}

/// `authentication`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Authentication {
    /// Controller-issued tokens.
    #[serde(default)]
    pub internal: InternalAuthentication,
    /// Kubernetes service-account tokens.
    #[serde(default)]
    pub k8s: K8sAuthentication,
    /// External OIDC issuers (JWTAuthenticator documents, kept as given).
    #[serde(default)]
    pub jwt: Vec<serde_json::Value>,
}

/// `provisioning`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provisioning {
    /// Auto-create Clients on first authentication.
    #[serde(default)]
    pub enabled: bool,
}

/// `grpc.keepalive` (Go durations).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Keepalive {
    /// Minimum interval between client pings.
    #[serde(default)]
    pub min_time: Option<GoDuration>,
    /// Allow pings without active streams.
    #[serde(default)]
    pub permit_without_stream: Option<bool>,
    /// Ping ack timeout.
    #[serde(default)]
    pub timeout: Option<GoDuration>,
    /// Server ping interval.
    #[serde(default)]
    pub interval_time: Option<GoDuration>,
    /// Close idle connections after this long.
    #[serde(default)]
    pub max_connection_idle: Option<GoDuration>,
    /// Close connections after this long.
    #[serde(default)]
    pub max_connection_age: Option<GoDuration>,
    /// Grace period after `maxConnectionAge`.
    #[serde(default)]
    pub max_connection_age_grace: Option<GoDuration>,
}

/// `grpc`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grpc {
    /// Keepalive policy.
    #[serde(default)]
    pub keepalive: Keepalive,
}

/// `leasePolicy`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LeasePolicy {
    /// Maximum number of lease tags.
    #[serde(default)]
    pub max_tags: Option<usize>,
}

/// `hiddenLabels`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HiddenLabels {
    /// Label keys not shown to clients.
    #[serde(default)]
    pub keys: Vec<String>,
}

/// `deprecatedLabels`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeprecatedLabels {
    /// Label key → deprecation message.
    #[serde(default)]
    pub keys: BTreeMap<String, String>,
}

/// The `config` key of the ConfigMap.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ControllerSettings {
    /// Authentication settings.
    #[serde(default)]
    pub authentication: Authentication,
    /// Client provisioning.
    #[serde(default)]
    pub provisioning: Provisioning,
    /// gRPC server settings.
    #[serde(default)]
    pub grpc: Grpc,
    /// Lease limits.
    #[serde(default)]
    pub lease_policy: LeasePolicy,
    /// Hidden labels.
    #[serde(default)]
    pub hidden_labels: HiddenLabels,
    /// Deprecated labels.
    #[serde(default)]
    pub deprecated_labels: DeprecatedLabels,
}

/// Everything the controller takes from the ConfigMap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterConfig {
    /// The `router` key (empty when absent), ordered by name.
    pub routers: Vec<RouterEntry>,
    /// The `config` key (defaults when absent).
    pub settings: ControllerSettings,
    /// The legacy `authentication` key, when present (an `AuthenticationConfiguration`
    /// document; upstream then takes authentication from it instead of `config`, and turns
    /// provisioning off).
    pub legacy_authentication: Option<String>,
}

fn yaml_err(
    source_name: &str,
    key: &str,
    e: impl Into<jumpstarter_core::BoxError>,
) -> ClusterConfigError {
    ClusterConfigError::Yaml {
        source_name: source_name.to_owned(),
        key: key.to_owned(),
        source: e.into(),
    }
}

/// Parses the `router` map (`<name>: {endpoint, labels}`); `source_name` goes into errors.
pub fn parse_routers(
    text: &str,
    source_name: &str,
) -> Result<Vec<RouterEntry>, ClusterConfigError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let map: BTreeMap<String, RouterValue> =
        serde_saphyr::from_str(text).map_err(|e| yaml_err(source_name, "router", e))?;
    map.into_iter()
        .map(|(name, r)| {
            let invalid = |reason: &str| ClusterConfigError::Invalid {
                source_name: source_name.to_owned(),
                field: format!("router.{name}.endpoint"),
                reason: reason.to_owned(),
            };
            let endpoint = r.endpoint.trim();
            match endpoint.rsplit_once(':') {
                None => return Err(invalid("must be host:port")),
                Some((host, port)) => {
                    if host.is_empty() || port.parse::<u16>().is_err() {
                        return Err(invalid(&format!("{endpoint:?} is not host:port")));
                    }
                }
            }
            Ok(RouterEntry {
                name,
                endpoint: endpoint.to_owned(),
                labels: r.labels,
            })
        })
        .collect()
}

/// Parses the `config` key (strict); `source_name` goes into errors.
pub fn parse_settings(
    text: &str,
    source_name: &str,
) -> Result<ControllerSettings, ClusterConfigError> {
    if text.trim().is_empty() {
        return Ok(ControllerSettings::default());
    }
    let s: ControllerSettings =
        serde_saphyr::from_str(text).map_err(|e| yaml_err(source_name, "config", e))?;
    if let Some(d) = s.authentication.internal.token_lifetime
        && d.as_nanos() <= 0
    {
        return Err(ClusterConfigError::Invalid {
            source_name: source_name.to_owned(),
            field: "config.authentication.internal.tokenLifetime".into(),
            reason: "must be positive".into(),
        });
    }
    Ok(s)
}

/// Reads the `router`, `config` and `authentication` keys of a ConfigMap.
pub fn from_config_map(cm: &ConfigMap) -> Result<ClusterConfig, ClusterConfigError> {
    let source_name = format!(
        "ConfigMap {}/{}",
        cm.metadata.namespace.as_deref().unwrap_or_default(),
        cm.metadata.name.as_deref().unwrap_or_default()
    );
    let data = cm.data.clone().unwrap_or_default();
    Ok(ClusterConfig {
        routers: parse_routers(data.get("router").map_or("", String::as_str), &source_name)?,
        settings: parse_settings(data.get("config").map_or("", String::as_str), &source_name)?,
        legacy_authentication: data.get("authentication").cloned(),
    })
}

/// Reads `--routers FILE`: either the `router` map itself or a whole ConfigMap manifest
/// (whose `data.router` is used).
pub fn routers_from_file(path: &std::path::Path) -> Result<Vec<RouterEntry>, ClusterConfigError> {
    let source_name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ClusterConfigError::Read {
        what: "the routers file",
        path: source_name.clone(),
        source,
    })?;
    let value: serde_json::Value =
        serde_saphyr::from_str(&text).map_err(|e| yaml_err(&source_name, "file", e))?;
    if value.get("kind").and_then(|k| k.as_str()) == Some("ConfigMap") {
        let cm: ConfigMap =
            serde_json::from_value(value).map_err(|e| yaml_err(&source_name, "file", e))?;
        return Ok(from_config_map(&cm)?.routers);
    }
    let routers = parse_routers(&text, &source_name)?;
    if routers.is_empty() {
        return Err(ClusterConfigError::Invalid {
            source_name,
            field: "router".into(),
            reason: "no routers are listed".into(),
        });
    }
    Ok(routers)
}

/// The ConfigMap [`CONFIG_MAP_NAME`] in `namespace`, or defaults when it does not exist.
pub async fn load<S: Store>(
    store: &S,
    namespace: &str,
) -> Result<ClusterConfig, ClusterConfigError> {
    let cm = store
        .get::<ConfigMap>(namespace, CONFIG_MAP_NAME)
        .await
        .map_err(|source| ClusterConfigError::Store {
            namespace: namespace.to_owned(),
            name: CONFIG_MAP_NAME.to_owned(),
            source: Box::new(source),
        })?;
    match cm {
        Some(cm) => from_config_map(&cm),
        None => Ok(ClusterConfig::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As upstream's operator writes it.
    const SAMPLE: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: jumpstarter-controller
  namespace: jumpstarter-lab
data:
  config: |
    authentication:
      internal:
        prefix: "internal:"
        tokenLifetime: 8760h
      jwt: []
    provisioning:
      enabled: false
    grpc:
      keepalive:
        minTime: 1s
        permitWithoutStream: true
        timeout: 180s
    leasePolicy:
      maxTags: 5
    hiddenLabels:
      keys: ["internal.example.com/rack"]
  router: |
    router-0:
      endpoint: router-0.jumpstarter.example.com:443
      labels:
        router-index: "0"
    router-1:
      endpoint: router-1.jumpstarter.example.com:443
      labels:
        router-index: "1"
"#;

    #[test]
    fn sample_config_map_parses() {
        let cm: ConfigMap = serde_saphyr::from_str(SAMPLE).unwrap();
        let c = from_config_map(&cm).unwrap();
        assert_eq!(c.routers.len(), 2);
        assert_eq!(c.routers[0].name, "router-0");
        assert_eq!(
            c.routers[1].endpoint,
            "router-1.jumpstarter.example.com:443"
        );
        assert_eq!(c.routers[1].labels["router-index"], "1");
        assert_eq!(c.settings.lease_policy.max_tags, Some(5));
        assert_eq!(
            c.settings.authentication.internal.prefix.as_deref(),
            Some("internal:")
        );
        assert_eq!(
            c.settings.authentication.internal.token_lifetime,
            Some(GoDuration::from_secs(8760 * 3600))
        );
        assert_eq!(c.settings.grpc.keepalive.permit_without_stream, Some(true));
        assert_eq!(c.settings.hidden_labels.keys.len(), 1);
        assert!(c.legacy_authentication.is_none());
    }

    #[test]
    fn missing_keys_give_defaults() {
        let c = from_config_map(&ConfigMap::default()).unwrap();
        assert_eq!(c, ClusterConfig::default());
    }

    #[test]
    fn bad_config_names_the_key_and_field() {
        let base: ConfigMap = serde_saphyr::from_str(SAMPLE).unwrap();
        let with = |key: &str, value: &str| {
            let mut cm = base.clone();
            cm.data
                .as_mut()
                .unwrap()
                .insert(key.to_owned(), value.to_owned());
            from_config_map(&cm).map_err(|e| jumpstarter_core::error_chain(&e))
        };
        let e = with("config", "leasePolicy:\n  maxTagz: 3\n").unwrap_err();
        assert!(e.contains("jumpstarter-lab/jumpstarter-controller"), "{e}");
        assert!(e.contains("\"config\"") && e.contains("maxTagz"), "{e}");
        let e = with(
            "config",
            "authentication:\n  internal:\n    tokenLifetime: 0s\n",
        )
        .unwrap_err();
        assert!(e.contains("tokenLifetime"), "{e}");
        let e = with("config", "leasePolicy:\n  maxTags: many\n").unwrap_err();
        assert!(e.contains("\"config\""), "{e}");
        let e = with("router", "r1:\n  endpoint: nohostport\n").unwrap_err();
        assert!(e.contains("router.r1.endpoint"), "{e}");
        let e = with("router", "r1:\n  endpoint: h:99999\n").unwrap_err();
        assert!(e.contains("router.r1.endpoint"), "{e}");
        let e = with("router", "r1:\n  endpoint: h:1\n  extra: 1\n").unwrap_err();
        assert!(e.contains("\"router\""), "{e}");
        assert!(with("router", "- not a map\n").is_err());
        assert_eq!(
            with("authentication", "x")
                .unwrap()
                .legacy_authentication
                .as_deref(),
            Some("x")
        );
    }

    #[test]
    fn routers_file_takes_a_map_or_a_config_map() {
        let dir = tempfile::tempdir().unwrap();
        let map = dir.path().join("routers.yaml");
        std::fs::write(
            &map,
            "a:\n  endpoint: 10.0.0.1:8083\nb:\n  endpoint: lab2:8083\n  labels: {site: lab2}\n",
        )
        .unwrap();
        let r = routers_from_file(&map).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].labels["site"], "lab2");
        let cm = dir.path().join("cm.yaml");
        std::fs::write(&cm, SAMPLE).unwrap();
        assert_eq!(routers_from_file(&cm).unwrap().len(), 2);
        let empty = dir.path().join("empty.yaml");
        std::fs::write(&empty, "{}\n").unwrap();
        assert!(routers_from_file(&empty).is_err());
        let e = jumpstarter_core::error_chain(
            &routers_from_file(&dir.path().join("missing.yaml")).unwrap_err(),
        );
        assert!(e.contains("missing.yaml"), "{e}");
    }

    #[tokio::test]
    async fn load_reads_the_config_map_from_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(dir.path()).await.unwrap();
        assert_eq!(
            load(&store, "jumpstarter-lab").await.unwrap(),
            ClusterConfig::default()
        );
        let cm: ConfigMap = serde_saphyr::from_str(SAMPLE).unwrap();
        store.create(&cm).await.unwrap();
        let c = load(&store, "jumpstarter-lab").await.unwrap();
        assert_eq!(c.routers.len(), 2);
    }
}
