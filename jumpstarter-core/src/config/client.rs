//! Client, user and admin config files.
//!
//! - `ClientConfig` (`CONFIG_DIR/clients/<alias>.yaml`, upstream's format): how a client
//!   reaches the controller and which driver clients it may load.
//! - `UserConfig` (`CONFIG_DIR/config.yaml`, upstream's format): the current client.
//! - `AdminConfig` (`CONFIG_DIR/admin.yaml`, ours): what `jmp admin` uses; the controller
//!   writes it on start, the way k3s leaves a kubeconfig.
//!
//! All of them are written atomically (temporary file + rename) with mode 0600, because
//! they hold bearer tokens.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use base64::Engine;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::config::{API_VERSION, ConfigError, ObjectMeta, TlsConfig, config_dir};

fn api_version() -> String {
    API_VERSION.into()
}

/// `drivers` of a client config: which driver client classes may be loaded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DriversConfig {
    /// Glob patterns of allowed client class paths; `UNSAFE` in the list allows all.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Allow every driver client.
    #[serde(default, rename = "unsafe")]
    pub allow_unsafe: bool,
}

/// `shell` of a client config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShellConfig {
    /// Load the user's shell profile in `jmp shell`.
    #[serde(default)]
    pub use_profiles: bool,
}

/// `leases` of a client config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeasesConfig {
    /// Seconds to wait for a lease to become ready.
    #[serde(default = "default_acquisition_timeout")]
    pub acquisition_timeout: u64,
    /// Seconds to keep retrying a dropped connection.
    #[serde(default = "default_retry_timeout")]
    pub retry_timeout: f64,
}

fn default_acquisition_timeout() -> u64 {
    7200
}
fn default_retry_timeout() -> f64 {
    300.0
}

impl Default for LeasesConfig {
    fn default() -> Self {
        Self {
            acquisition_timeout: default_acquisition_timeout(),
            retry_timeout: default_retry_timeout(),
        }
    }
}

impl LeasesConfig {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// A client config file (`kind: ClientConfig`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientConfig {
    /// Always `jumpstarter.dev/v1alpha1`.
    #[serde(rename = "apiVersion", default = "api_version")]
    pub api_version: String,
    /// Always `ClientConfig`.
    #[serde(default = "client_kind")]
    pub kind: String,
    /// Name and namespace of the Client object on the controller.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Controller endpoint (`host:port`).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// TLS settings towards the controller and routers.
    #[serde(default)]
    pub tls: TlsConfig,
    /// Bearer token.
    #[serde(default)]
    pub token: Option<String>,
    /// OIDC refresh token (omitted when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// gRPC channel options.
    #[serde(rename = "grpcOptions", default)]
    pub grpc_options: BTreeMap<String, serde_json::Value>,
    /// Driver client allow-list.
    #[serde(default)]
    pub drivers: DriversConfig,
    /// `jmp shell` settings.
    #[serde(default)]
    pub shell: ShellConfig,
    /// Lease timeouts (omitted when default).
    #[serde(default, skip_serializing_if = "LeasesConfig::is_default")]
    pub leases: LeasesConfig,
    /// Where it was loaded from (not part of the file).
    #[serde(skip)]
    pub path: Option<PathBuf>,
}

fn client_kind() -> String {
    "ClientConfig".into()
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            api_version: api_version(),
            kind: client_kind(),
            metadata: ObjectMeta::default(),
            endpoint: None,
            tls: TlsConfig::default(),
            token: None,
            refresh_token: None,
            grpc_options: BTreeMap::new(),
            drivers: DriversConfig::default(),
            shell: ShellConfig::default(),
            leases: LeasesConfig::default(),
            path: None,
        }
    }
}

impl ClientConfig {
    /// The directory of client configs: `CONFIG_DIR/clients`.
    pub fn dir() -> PathBuf {
        config_dir().join("clients")
    }

    /// The path of the client config with this alias.
    pub fn path_for(alias: &str) -> Result<PathBuf, ConfigError> {
        check_alias(alias)?;
        Ok(Self::dir().join(format!("{alias}.yaml")))
    }

    /// The alias of a config file: its base name without `.yaml`.
    pub fn alias(&self) -> Option<String> {
        self.path
            .as_ref()
            .and_then(|p| p.file_stem())
            .map(|s| s.to_string_lossy().into_owned())
    }

    /// Reads and validates a client config.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let mut cfg: Self = load_yaml(path, "ClientConfig", |c: &Self| (&c.kind, &c.api_version))?;
        cfg.path = Some(path.to_path_buf());
        Ok(cfg)
    }

    /// Loads the config with this alias; an alias without a config is an error that lists
    /// the known ones.
    pub fn load_alias(alias: &str) -> Result<Self, ConfigError> {
        let path = Self::path_for(alias)?;
        if !path.exists() {
            return Err(ConfigError::UnknownAlias {
                kind: "client",
                alias: alias.to_string(),
                dir: Self::dir(),
                known: Self::aliases(),
            });
        }
        Self::load(&path)
    }

    /// The aliases of the saved client configs (`*.yaml` in [`Self::dir`]), sorted.
    pub fn aliases() -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(Self::dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".yaml").map(str::to_string)
            })
            .filter(|n| !n.is_empty())
            .collect();
        names.sort();
        names
    }

    /// The client config a command should use, as upstream picks it: `--client-config PATH`,
    /// else `--client ALIAS`, else one built from `JMP_*` variables ([`Self::from_env`]),
    /// else the user config's `current-client`.
    pub fn resolve(path: Option<&Path>, alias: Option<&str>) -> Result<Self, ConfigError> {
        if let Some(path) = path {
            return Self::load(path);
        }
        if let Some(alias) = alias {
            return Self::load_alias(alias);
        }
        if let Some(cfg) = Self::from_env() {
            return Ok(cfg);
        }
        let user_path = UserConfig::default_path();
        let user = UserConfig::load_or_default(&user_path)?;
        match user.config.current_client {
            Some(alias) => Self::load_alias(&alias),
            None => Err(ConfigError::Invalid {
                path: user_path,
                line: 0,
                field: "config.current-client".into(),
                message: "no client selected: pass --client ALIAS or --client-config PATH, or \
                          create one with `jmp admin create client NAME --save`"
                    .into(),
            }),
        }
    }

    /// Builds a config from `JMP_NAME`, `JMP_NAMESPACE`, `JMP_ENDPOINT`, `JMP_TOKEN`,
    /// `JMP_DRIVERS_ALLOW` and `JMP_DRIVERS_UNSAFE`, as upstream does before looking at
    /// files. `None` when `JMP_NAME` is not set.
    pub fn from_env() -> Option<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let name = var("JMP_NAME")?;
        let mut cfg = Self {
            metadata: ObjectMeta {
                namespace: var("JMP_NAMESPACE"),
                name,
            },
            endpoint: var("JMP_ENDPOINT"),
            token: var("JMP_TOKEN"),
            ..Self::default()
        };
        if let Some(allow) = var("JMP_DRIVERS_ALLOW") {
            cfg.drivers.allow = allow.split(',').map(|s| s.trim().to_string()).collect();
        }
        cfg.drivers.allow_unsafe = var("JMP_DRIVERS_UNSAFE")
            .is_some_and(|v| matches!(v.as_str(), "1" | "true" | "True" | "yes"));
        Some(cfg)
    }

    /// Whether every driver client may be loaded (`unsafe: true` or `UNSAFE` in `allow`).
    pub fn allows_unsafe(&self) -> bool {
        self.drivers.allow_unsafe || self.drivers.allow.iter().any(|a| a == "UNSAFE")
    }

    /// The CA PEM from `tls.ca` (base64), `None` when empty.
    pub fn ca_pem(&self) -> Result<Option<String>, ConfigError> {
        decode_ca(&self.tls, self.path.as_deref())
    }

    /// Writes the config atomically with mode 0600.
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        save_yaml(self, path)
    }
}

/// `config` of the user config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UserConfigBody {
    /// Alias of the client config used when none is named.
    #[serde(rename = "current-client", default)]
    pub current_client: Option<String>,
}

/// The user config (`CONFIG_DIR/config.yaml`, `kind: UserConfig`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserConfig {
    /// Always `jumpstarter.dev/v1alpha1`.
    #[serde(rename = "apiVersion", default = "api_version")]
    pub api_version: String,
    /// Always `UserConfig`.
    #[serde(default = "user_kind")]
    pub kind: String,
    /// The settings.
    #[serde(default)]
    pub config: UserConfigBody,
}

fn user_kind() -> String {
    "UserConfig".into()
}

impl Default for UserConfig {
    fn default() -> Self {
        Self {
            api_version: api_version(),
            kind: user_kind(),
            config: UserConfigBody::default(),
        }
    }
}

impl UserConfig {
    /// `CONFIG_DIR/config.yaml`.
    pub fn default_path() -> PathBuf {
        config_dir().join("config.yaml")
    }

    /// Reads the user config; a missing file is an empty config.
    pub fn load_or_default(path: &Path) -> Result<Self, ConfigError> {
        if !path.exists() {
            return Ok(Self::default());
        }
        load_yaml(path, "UserConfig", |c: &Self| (&c.kind, &c.api_version))
    }

    /// Writes the user config atomically.
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        save_yaml(self, path)
    }
}

/// The admin config (`CONFIG_DIR/admin.yaml`, `kind: AdminConfig`): where `jmp admin`
/// finds the controller and the admin token. Ours; upstream manages objects through
/// Kubernetes instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdminConfig {
    /// Always `jumpstarter.dev/v1alpha1`.
    #[serde(rename = "apiVersion", default = "api_version")]
    pub api_version: String,
    /// Always `AdminConfig`.
    #[serde(default = "admin_kind")]
    pub kind: String,
    /// Controller endpoint (`host:port`).
    pub endpoint: String,
    /// TLS settings towards the controller.
    #[serde(default)]
    pub tls: TlsConfig,
    /// The admin bearer token.
    pub token: String,
    /// Where it was loaded from (not part of the file).
    #[serde(skip)]
    pub path: Option<PathBuf>,
}

fn admin_kind() -> String {
    "AdminConfig".into()
}

impl AdminConfig {
    /// A config for this endpoint, CA PEM (may be empty) and token.
    pub fn new(endpoint: impl Into<String>, ca_pem: &str, token: impl Into<String>) -> Self {
        Self {
            api_version: api_version(),
            kind: admin_kind(),
            endpoint: endpoint.into(),
            tls: TlsConfig {
                ca: encode_ca(ca_pem),
                insecure: false,
            },
            token: token.into(),
            path: None,
        }
    }

    /// `$JMP_ADMIN_CONFIG`, else `CONFIG_DIR/admin.yaml`.
    pub fn default_path() -> PathBuf {
        std::env::var_os("JMP_ADMIN_CONFIG")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| config_dir().join("admin.yaml"))
    }

    /// Reads and validates an admin config.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let mut cfg: Self = load_yaml(path, "AdminConfig", |c: &Self| (&c.kind, &c.api_version))?;
        cfg.path = Some(path.to_path_buf());
        Ok(cfg)
    }

    /// The CA PEM from `tls.ca` (base64), `None` when empty.
    pub fn ca_pem(&self) -> Result<Option<String>, ConfigError> {
        decode_ca(&self.tls, self.path.as_deref())
    }

    /// Writes the config atomically with mode 0600.
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        save_yaml(self, path)
    }
}

/// Base64 of a CA PEM, as `tls.ca` holds it ("" for none).
pub fn encode_ca(pem: &str) -> String {
    if pem.is_empty() {
        String::new()
    } else {
        base64::engine::general_purpose::STANDARD.encode(pem.as_bytes())
    }
}

/// Decodes `tls.ca`; `None` when empty.
pub fn decode_ca(tls: &TlsConfig, path: Option<&Path>) -> Result<Option<String>, ConfigError> {
    let ca = tls.ca.trim();
    if ca.is_empty() {
        return Ok(None);
    }
    let invalid = |message: String| ConfigError::Invalid {
        path: path.map(Path::to_path_buf).unwrap_or_default(),
        line: 0,
        field: "tls.ca".into(),
        message,
    };
    // Tolerate a PEM pasted as is.
    if ca.starts_with("-----BEGIN") {
        return Ok(Some(ca.to_string()));
    }
    let compact: String = ca.split_whitespace().collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|e| invalid(format!("not base64: {e}", e = crate::error_chain(&e))))?;
    let pem = String::from_utf8(bytes).map_err(|_| invalid("not a PEM certificate".into()))?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(invalid("not a PEM certificate".into()));
    }
    Ok(Some(pem))
}

fn check_alias(alias: &str) -> Result<(), ConfigError> {
    if alias.is_empty() || alias.contains(['/', '\\']) || alias == "." || alias == ".." {
        return Err(ConfigError::Invalid {
            path: PathBuf::from(alias),
            line: 0,
            field: "alias".into(),
            message: "an alias may not be empty or contain '/', '\\', '.' or '..'".into(),
        });
    }
    Ok(())
}

fn load_yaml<T: DeserializeOwned>(
    path: &Path,
    kind: &str,
    header: impl Fn(&T) -> (&String, &String),
) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let cfg: T = serde_saphyr::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: crate::error_chain(&e),
    })?;
    if kind == "ClientConfig" {
        crate::config::keys::warn_unknown(path, &crate::config::keys::unknown_client_keys(&text));
    }
    let (found_kind, found_version) = header(&cfg);
    let invalid = |field: &str, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        line: 0,
        field: field.into(),
        message,
    };
    if found_kind != kind {
        return Err(invalid(
            "kind",
            format!("expected {kind}, found {found_kind:?}"),
        ));
    }
    if found_version != API_VERSION {
        return Err(invalid(
            "apiVersion",
            format!("expected {API_VERSION}, found {found_version:?}"),
        ));
    }
    Ok(cfg)
}

fn save_yaml<T: Serialize>(value: &T, path: &Path) -> Result<(), ConfigError> {
    let text = serde_saphyr::to_string(value).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: crate::error_chain(&e),
    })?;
    write_private(path, text.as_bytes())
}

/// Writes a file atomically with mode 0600, creating the directory if needed (see
/// [`crate::private_file::write_private_file`]).
pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), ConfigError> {
    crate::private_file::write_private_file(path, contents).map_err(|source| ConfigError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn client_config_round_trips_and_keeps_upstream_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clients/hello.yaml");
        let cfg = ClientConfig {
            metadata: ObjectMeta {
                namespace: Some("default".into()),
                name: "hello".into(),
            },
            endpoint: Some("localhost:8082".into()),
            tls: TlsConfig {
                ca: encode_ca(CA),
                insecure: false,
            },
            token: Some("tok".into()),
            drivers: DriversConfig {
                allow: vec![],
                allow_unsafe: true,
            },
            ..ClientConfig::default()
        };
        cfg.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("kind: ClientConfig"), "{text}");
        assert!(text.contains("unsafe: true"), "{text}");
        assert!(text.contains("grpcOptions"), "{text}");
        assert!(!text.contains("refresh_token"), "{text}");
        assert!(!text.contains("acquisition_timeout"), "{text}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let back = ClientConfig::load(&path).unwrap();
        assert_eq!(back.alias().as_deref(), Some("hello"));
        assert_eq!(back.ca_pem().unwrap().as_deref(), Some(CA));
        assert!(back.allows_unsafe());
        assert_eq!(back.leases.acquisition_timeout, 7200);
    }

    #[test]
    fn reads_a_config_written_by_upstream() {
        let text = "apiVersion: jumpstarter.dev/v1alpha1\nkind: ClientConfig\nmetadata:\n  namespace: lab\n  name: hello\nendpoint: grpc.example.com:443\ntls:\n  ca: ''\n  insecure: true\ntoken: abc\ngrpcOptions: {}\ndrivers:\n  allow: []\n  unsafe: true\nshell:\n  use_profiles: false\nleases:\n  acquisition_timeout: 60\n  retry_timeout: 5.0\n";
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hello.yaml");
        std::fs::write(&path, text).unwrap();
        let cfg = ClientConfig::load(&path).unwrap();
        assert!(cfg.tls.insecure);
        assert_eq!(cfg.ca_pem().unwrap(), None);
        assert_eq!(cfg.leases.acquisition_timeout, 60);
        assert_eq!(cfg.metadata.namespace.as_deref(), Some("lab"));
    }

    #[test]
    fn bad_files_name_file_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.yaml");
        std::fs::write(&path, "kind: ExporterConfig\n").unwrap();
        let e = ClientConfig::load(&path).unwrap_err().to_string();
        assert!(e.contains("x.yaml") && e.contains("kind"), "{e}");
        std::fs::write(
            &path,
            "kind: ClientConfig\ntls:\n  ca: '%%%'\nmetadata: {name: a}\n",
        )
        .unwrap();
        let e = ClientConfig::load(&path)
            .unwrap()
            .ca_pem()
            .unwrap_err()
            .to_string();
        assert!(e.contains("tls.ca"), "{e}");
        assert!(ClientConfig::path_for("../x").is_err());
        let e = AdminConfig::load(&dir.path().join("missing.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.yaml"), "{e}");
    }

    #[test]
    fn admin_and_user_configs_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.yaml");
        AdminConfig::new("localhost:8082", CA, "secret")
            .save(&path)
            .unwrap();
        let cfg = AdminConfig::load(&path).unwrap();
        assert_eq!(cfg.ca_pem().unwrap().as_deref(), Some(CA));
        assert_eq!(cfg.token, "secret");

        let upath = dir.path().join("config.yaml");
        let mut user = UserConfig::load_or_default(&upath).unwrap();
        assert_eq!(user.config.current_client, None);
        user.config.current_client = Some("hello".into());
        user.save(&upath).unwrap();
        let text = std::fs::read_to_string(&upath).unwrap();
        assert!(text.contains("current-client: hello"), "{text}");
    }
}
