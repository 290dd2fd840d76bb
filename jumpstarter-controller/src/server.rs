//! A whole controller on one machine: SQLite store and CA in a data directory, the
//! ControllerService, ClientService and AdminService over TLS (with gRPC health and reflection),
//! the reconcile loop, an in-process router, and Prometheus metrics.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use jumpstarter_core::{
    auth::{CertificateAuthority, load_identity, read_cert_pem},
    config::AdminConfig,
    server::listener::{ConnectionGuard, ConnectionLimits, ListenerStats, tls_acceptor},
};
use jumpstarter_proto::{
    admin_v1::admin_service_server::AdminServiceServer,
    client_v1::client_service_server::ClientServiceServer,
    ext_v1::client_extension_service_server::ClientExtensionServiceServer,
    v1::controller_service_server::ControllerServiceServer,
    v1::telemetry_service_server::TelemetryServiceServer,
};
use jumpstarter_router::RouterTokenKey;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tonic::transport::{Identity, Server};

use crate::{
    auth::{
        TokenIssuer,
        admin_token::{ADMIN_TOKEN_FILE, AdminToken},
    },
    metrics::{RpcMetrics, RpcMetricsLayer},
    service::{
        admin::AdminApi, client::ClientApi, controller::ControllerApi, devices::ClientExtApi,
    },
    state::{ControllerState, RouterEntry},
    store::{
        SqliteStore, Store,
        pid_lock::{LockError, PidLock},
    },
};

/// Errors starting or running a controller.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A file in the data directory could not be used.
    #[error("data directory {path}")]
    DataDir {
        /// The file or directory.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `store.db` is missing or empty beside the CA and keys of an earlier run.
    #[error(
        "the store {} is missing or empty, but {} holds the CA and keys of an earlier run: \
         starting would forget every client, exporter and lease (their tokens would then be \
         refused). Restore the store from a backup (`jumpstarter-controller --data-dir {} \
         restore FILE`), or pass --accept-empty-store to start with an empty one on purpose",
        store.display(), data_dir.display(), data_dir.display()
    )]
    StoreMissing {
        /// The store file.
        store: PathBuf,
        /// The data directory.
        data_dir: PathBuf,
    },
    /// The data directory (or its `ca/`, `server/`) is unsafe or cannot be created.
    #[error(transparent)]
    UnsafeDataDir(#[from] crate::store::data_dir::DataDirError),
    /// A listener could not be opened.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TLS settings are unusable (files, or a certificate without its key).
    #[error("TLS: {0}")]
    Tls(String),
    /// A certificate or key file is unusable, or the server certificate cannot be issued.
    #[error("TLS: {}", if what.is_empty() { "unusable certificate or key" } else { what.trim_end_matches(": ") })]
    TlsFile {
        /// What was being done (`server certificate: `), or empty.
        what: &'static str,
        /// Why.
        #[source]
        source: jumpstarter_core::auth::TlsError,
    },
    /// The gRPC server rejects the TLS identity.
    #[error("TLS: the gRPC server refuses the certificate or key")]
    TlsConfig(#[source] tonic::transport::Error),
    /// The listener's address cannot be read.
    #[error("cannot read the listener's address")]
    LocalAddr(#[source] std::io::Error),
    /// The reflection service cannot be built.
    #[error("the reflection service cannot be built")]
    Reflection(#[source] tonic_reflection::server::Error),
    /// The login listener's certificate or key is unusable.
    #[error(transparent)]
    LoginTls(#[from] crate::service::login::AcceptorError),
    /// The admin config could not be written.
    #[error(
        "cannot write the admin config {path} (choose another place with --admin-config, \
         or --no-admin-config)"
    )]
    AdminConfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: jumpstarter_core::config::ConfigError,
    },
    /// The external OIDC settings are unusable.
    #[error("unusable authentication settings")]
    Authentication(#[source] jumpstarter_core::oidc::OidcError),
    /// Anything else, with its cause.
    #[error("{0}")]
    Other(String),
}

/// How to run a controller.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Where the store, CA and keys live.
    pub data_dir: PathBuf,
    /// Address of the controller's gRPC listener.
    pub listen: String,
    /// Address of the in-process router's listener.
    pub router_listen: String,
    /// Host name (or IP) clients and exporters use to reach this machine; goes into the
    /// server certificate and the advertised endpoints.
    pub advertise_host: String,
    /// Where to write the admin config (endpoint, CA, admin token) for `jmp admin`,
    /// rewritten on every start; `None` writes none.
    pub admin_config: Option<PathBuf>,
    /// Own server certificate (PEM, may be a chain) instead of one issued by our CA; needs
    /// [`ControllerConfig::tls_key`].
    pub tls_cert: Option<PathBuf>,
    /// Key of [`ControllerConfig::tls_cert`].
    pub tls_key: Option<PathBuf>,
    /// CA bundle to hand out in configs when [`ControllerConfig::tls_cert`] is used (without
    /// it, configs carry no CA and rely on system roots).
    pub tls_ca: Option<PathBuf>,
    /// Address of the Prometheus metrics HTTP listener; `None` serves no metrics.
    pub metrics_listen: Option<String>,
    /// The exporter labels whose values split the exporters online / leased / quarantined
    /// gauges (empty: one series each).
    pub metrics_exporter_labels: Vec<String>,
    /// The routers handed out in `Dial`/`Listen` responses (from `--routers` or the
    /// `router` key of the Kubernetes ConfigMap); `None` hands out the in-process router
    /// only. The in-process router runs either way.
    pub routers: Option<Vec<RouterEntry>>,
    /// Also keep issued client/exporter tokens in the credential Secrets `<name>-client` /
    /// `<name>-exporter` (key `token`), as upstream does on Kubernetes.
    pub credential_secrets: bool,
    /// Maximum number of lease tags (`leasePolicy.maxTags` of the ConfigMap); `None` keeps
    /// the default.
    pub max_tags: Option<usize>,
    /// Which exporter labels clients are shown (`hiddenLabels` and `deprecatedLabels` of the
    /// ConfigMap); the default shows them all.
    pub label_policy: crate::objects::LabelPolicy,
    /// How long the tokens issued from now on are valid (`authentication.internal.tokenLifetime`
    /// of the ConfigMap); `None` keeps the default (a year).
    pub token_lifetime: Option<std::time::Duration>,
    /// More names for the CA-issued server certificate, beyond the advertised host,
    /// `localhost` and `127.0.0.1` (e.g. the in-cluster Service name).
    pub extra_sans: Vec<String>,
    /// External OIDC issuers: the `jwt` entries of upstream's `authentication` section
    /// (Kubernetes `JWTAuthenticator` documents). Empty: controller tokens only.
    pub jwt_authenticators: Vec<serde_json::Value>,
    /// Create a Client on the first login of an unknown external user (`provisioning.enabled`).
    pub provisioning: bool,
    /// Address of the "easy login" HTTPS listener (`GET /v1/auth/config`, for
    /// `jmp login [client@]host:port`); `None` serves none.
    pub login_listen: Option<String>,
    /// The namespace `/v1/auth/config` tells clients to use.
    pub login_namespace: String,
    /// A lease still waiting for an exporter whose client has not been heard from for this
    /// long is ended (see the `lease::pending_guard` module); `None` never ends one.
    pub pending_client_timeout: Option<std::time::Duration>,
    /// Ended leases are deleted this long after they ended (`lease::gc`); `None`
    /// keeps them (the binary sets `None` with the Kubernetes store, which keeps them as
    /// upstream does).
    pub ended_lease_retention: Option<std::time::Duration>,
    /// Start with an empty SQLite store even though the data directory holds a CA and keys
    /// of an earlier run (which otherwise means the store was lost, and is refused).
    pub accept_empty_store: bool,
    /// Bounds of each of the gRPC and router listeners: concurrent connections, TLS
    /// handshake and first-frame timeouts, HTTP/2 keepalive.
    pub connection_limits: ConnectionLimits,
    /// Log gathering (the controller as telemetry sink, see [`crate::lease_logs`]) within
    /// these bounds; `None` gathers nothing and names no telemetry endpoint.
    pub lease_logs: Option<crate::lease_logs::LeaseLogLimits>,
    /// Virtual target pools: the engine scaling ExporterSets and its provisioners (see
    /// [`crate::pools::engine`]); `None` runs no engine.
    pub pools: Option<crate::pools::engine::PoolsConfig>,
    /// Address of the web dashboard's plain-HTTP listener (pages under `/ui`, see
    /// `docs/dashboard.md`); `None` serves none. The binary's default is `127.0.0.1:8086`.
    pub ui_listen: Option<String>,
    /// When [`ControllerConfig::ui_listen`] cannot be bound (e.g. another controller on this
    /// machine has the port), start without the dashboard and warn instead of failing: the
    /// binary sets it when the address is its default rather than one given explicitly.
    pub ui_listen_optional: bool,
    /// The OIDC client id of the dashboard's "Log in with OIDC" (`None`: `jumpstarter-cli`
    /// when the issuer accepts that audience, else its first audience).
    pub ui_oidc_client_id: Option<String>,
    /// The dashboard's public base URL (e.g. `https://lab.example.com`), for the redirect
    /// URI of its OIDC logins (`<url>/ui/login/oidc/callback`); `None`: `http://` + the
    /// request's `Host`.
    pub ui_public_url: Option<String>,
}

impl ControllerConfig {
    /// The binary's defaults with data in `data_dir`: gRPC on `0.0.0.0:8082`, router on
    /// `0.0.0.0:8083`, endpoint `localhost`, no admin config, no metrics, own CA.
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            listen: "0.0.0.0:8082".into(),
            router_listen: "0.0.0.0:8083".into(),
            advertise_host: "localhost".into(),
            admin_config: None,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            metrics_listen: None,
            metrics_exporter_labels: Vec::new(),
            routers: None,
            credential_secrets: false,
            max_tags: None,
            label_policy: Default::default(),
            token_lifetime: None,
            extra_sans: Vec::new(),
            jwt_authenticators: Vec::new(),
            provisioning: false,
            login_listen: None,
            login_namespace: "default".into(),
            pending_client_timeout: Some(crate::lease::pending_guard::DEFAULT_TIMEOUT),
            ended_lease_retention: Some(crate::lease::gc::DEFAULT_RETENTION),
            accept_empty_store: false,
            connection_limits: ConnectionLimits::default(),
            lease_logs: Some(Default::default()),
            pools: Some(crate::pools::engine::PoolsConfig::new(&data_dir)),
            ui_listen: None,
            ui_listen_optional: false,
            ui_oidc_client_id: None,
            ui_public_url: None,
            data_dir,
        }
    }

    /// Everything on loopback with OS-chosen ports (tests, examples).
    pub fn loopback(data_dir: PathBuf) -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            router_listen: "127.0.0.1:0".into(),
            ..Self::new(data_dir)
        }
    }
}

/// A running controller (over [`SqliteStore`] unless started with [`start_with_store`]).
pub struct RunningController<S: Store = SqliteStore> {
    /// The controller's address.
    pub addr: SocketAddr,
    /// The in-process router's address.
    pub router_addr: SocketAddr,
    /// The endpoint advertised to clients (`host:port`).
    pub endpoint: String,
    /// PEM of the CA clients must trust, as configs carry it (empty: system roots, when an
    /// own certificate is used without `tls_ca`).
    pub ca_pem: String,
    /// The Prometheus metrics listener's address, when serving metrics.
    pub metrics_addr: Option<SocketAddr>,
    /// The easy-login listener's address (`GET /v1/auth/config`), when serving it.
    pub login_addr: Option<SocketAddr>,
    /// The admin bearer token AdminService accepts.
    pub admin_token: String,
    /// The dashboard listener's address, when serving it (see [`RunningController::ui_addr`]).
    ui: Option<SocketAddr>,
    /// Where the admin config was written, if anywhere.
    pub admin_config: Option<PathBuf>,
    /// The shared state (store, issuer...).
    pub state: Arc<ControllerState<S>>,
    health: tonic_health::server::HealthReporter,
    /// The data directory's lock and the admin config's, held while it runs.
    _locks: (PidLock, Option<PidLock>),
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// The local pool provisioner, when its replicas are stopped with the controller.
    stop_local_replicas: Option<Arc<crate::pools::local::LocalProvisioner>>,
}

impl<S: Store> RunningController<S> {
    /// The web dashboard's address (`http://ADDR/ui`), when serving it.
    pub fn ui_addr(&self) -> Option<SocketAddr> {
        self.ui
    }

    /// Stops serving: open streams (exporters' Status, Listen) get a few seconds to end
    /// gracefully, then everything is cut.
    pub async fn shutdown(mut self) {
        self.health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        let _ = self.stop.send(true);
        self.state.stopping.send_replace(true);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        for mut t in self.tasks.drain(..) {
            if tokio::time::timeout_at(deadline, &mut t).await.is_err() {
                t.abort();
            }
        }
        if let Some(local) = self.stop_local_replicas.take() {
            local.shutdown().await;
        }
    }
}

fn data_err(
    path: impl Into<PathBuf>,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> ServerError {
    ServerError::DataDir {
        path: path.into(),
        source: e.into(),
    }
}

async fn bind(addr: &str) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Listen {
            addr: addr.to_string(),
            source,
        })
}

use crate::store::data_dir::SERVER_CERT_DIR;
/// A kept server certificate is re-issued once it is this old (it is valid for a year).
const SERVER_CERT_RENEW_AFTER: std::time::Duration =
    std::time::Duration::from_secs(300 * 24 * 3600);

/// What a kept server certificate was issued for; it is reused only when all of it still
/// holds (same SANs, same CA, young enough).
fn server_cert_stamp(ca: &CertificateAuthority, sans: &[String], issued: u64) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, ca.cert_pem().as_bytes());
    let ca_hash: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("issued={issued}\nsans={}\nca={ca_hash}\n", sans.join(","))
}

/// The server certificate in `dir`, or a new one issued by `ca` and kept there, so that
/// clients see the same certificate across restarts.
fn server_cert(
    dir: &std::path::Path,
    ca: &CertificateAuthority,
    sans: &[String],
) -> Result<jumpstarter_core::auth::IssuedCert, ServerError> {
    let (cert_path, key_path, stamp_path) =
        (dir.join("tls.crt"), dir.join("tls.key"), dir.join("issued"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    if let (Ok(stamp), Ok(cert_pem), Ok(key_pem)) = (
        std::fs::read_to_string(&stamp_path),
        read_cert_pem(&cert_path),
        jumpstarter_core::auth::read_key_pem(&key_path),
    ) {
        let issued = stamp
            .lines()
            .find_map(|l| l.strip_prefix("issued="))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let young = now.saturating_sub(issued) < SERVER_CERT_RENEW_AFTER.as_secs();
        if young && stamp == server_cert_stamp(ca, sans, issued) {
            return Ok(jumpstarter_core::auth::IssuedCert { cert_pem, key_pem });
        }
    }
    let cert = ca
        .issue_server_cert(sans)
        .map_err(|source| ServerError::TlsFile {
            what: "server certificate: ",
            source,
        })?;
    std::fs::create_dir_all(dir).map_err(|e| data_err(dir, e))?;
    // The stamp goes last: a crash in between leaves a certificate that is not reused.
    let _ = std::fs::remove_file(&stamp_path);
    cert.save(&cert_path, &key_path)
        .map_err(|e| data_err(&cert_path, e))?;
    std::fs::write(&stamp_path, server_cert_stamp(ca, sans, now))
        .map_err(|e| data_err(&stamp_path, e))?;
    Ok(cert)
}

/// The identity the listeners present, the CA PEM that configs carry, and the identity's
/// certificate and key PEMs (for the easy-login listener).
fn server_identity(
    config: &ControllerConfig,
    ca: &CertificateAuthority,
) -> Result<(Identity, String, jumpstarter_core::auth::IssuedCert), ServerError> {
    let tls = |source| ServerError::TlsFile { what: "", source };
    match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => {
            let identity = load_identity(cert, key).map_err(tls)?;
            let pems = jumpstarter_core::auth::IssuedCert {
                cert_pem: read_cert_pem(cert).map_err(tls)?,
                key_pem: jumpstarter_core::auth::read_key_pem(key).map_err(tls)?,
            };
            let ca_pem = match &config.tls_ca {
                Some(p) => read_cert_pem(p).map_err(tls)?,
                None => String::new(),
            };
            Ok((identity, ca_pem, pems))
        }
        (None, None) => {
            if config.tls_ca.is_some() {
                return Err(ServerError::Tls(
                    "--tls-ca is only meaningful with --tls-cert and --tls-key (our own CA is \
                     handed out otherwise)"
                        .into(),
                ));
            }
            let mut sans = vec![
                config.advertise_host.clone(),
                "localhost".to_string(),
                "127.0.0.1".to_string(),
            ];
            sans.extend(config.extra_sans.iter().cloned());
            let mut seen = std::collections::HashSet::new();
            sans.retain(|s| seen.insert(s.clone()));
            let cert = server_cert(&config.data_dir.join(SERVER_CERT_DIR), ca, &sans)?;
            Ok((cert.identity(), ca.cert_pem().to_string(), cert))
        }
        (Some(_), None) => Err(ServerError::Tls(
            "a TLS certificate was given without its key (--tls-key)".into(),
        )),
        (None, Some(_)) => Err(ServerError::Tls(
            "a TLS key was given without its certificate (--tls-cert)".into(),
        )),
    }
}

/// Files that only exist after a controller ran in the data directory.
const EARLIER_RUN_FILES: [&str; 2] = ["ca/ca.key", "signing-key.pem"];

/// Refuses a missing or empty `store.db` beside the keys of an earlier run, unless `accept`.
fn check_store_present(dir: &std::path::Path, accept: bool) -> Result<(), ServerError> {
    let store = dir.join(crate::store::sqlite::DB_FILE);
    let empty = std::fs::metadata(&store).map_or(true, |m| m.len() == 0);
    let earlier_run = EARLIER_RUN_FILES.iter().any(|f| dir.join(f).exists());
    if empty && earlier_run {
        if accept {
            tracing::warn!(
                "starting with an empty store beside the keys of an earlier run \
                 (--accept-empty-store): earlier clients and exporters are forgotten"
            );
            // An empty file is not a database SQLite would create over.
            let _ = std::fs::remove_file(&store);
            return Ok(());
        }
        return Err(ServerError::StoreMissing {
            store,
            data_dir: dir.to_path_buf(),
        });
    }
    Ok(())
}

/// Starts a controller (and its router) as configured, with the SQLite store of the data
/// directory.
/// One controller per data directory: a second one is refused, naming the PID of the first.
pub async fn start(config: ControllerConfig) -> Result<RunningController, ServerError> {
    let dir = &config.data_dir;
    crate::store::data_dir::prepare(dir)?;
    let lock = lock_data_dir(dir)?;
    check_store_present(dir, config.accept_empty_store)?;
    let store = SqliteStore::open(dir.clone())
        .await
        .map_err(|e| data_err(dir, e))?;
    start_locked(config, store, lock).await
}

/// Starts a controller (and its router) as configured, over `store` (e.g. a `KubeStore`);
/// the CA and keys still come from the data directory, which is locked as in [`start`].
pub async fn start_with_store<S: Store>(
    config: ControllerConfig,
    store: S,
) -> Result<RunningController<S>, ServerError> {
    let dir = &config.data_dir;
    crate::store::data_dir::prepare(dir)?;
    let lock = lock_data_dir(dir)?;
    start_locked(config, store, lock).await
}

fn lock_data_dir(dir: &std::path::Path) -> Result<PidLock, ServerError> {
    PidLock::data_dir(dir).map_err(|e| match e {
        LockError::Held { .. } => ServerError::Other(format!(
            "{e}: stop it, or give this one another --data-dir",
            e = jumpstarter_core::error_chain(&e)
        )),
        LockError::Io { .. } => data_err(dir, e),
    })
}

/// The admin config's lock, or `None` (with a warning) when another controller holds it:
/// the admin config of a running controller is never rewritten.
fn lock_admin_config(path: &std::path::Path) -> Result<Option<PidLock>, ServerError> {
    match PidLock::admin_config(path) {
        Ok(l) => Ok(Some(l)),
        Err(e @ LockError::Held { .. }) => {
            tracing::warn!(
                "not writing the admin config: {e}; `jmp admin` keeps talking to that one \
                 (give this one its own --admin-config PATH)",
                e = jumpstarter_core::error_chain(&e)
            );
            Ok(None)
        }
        Err(e) => Err(data_err(path, e)),
    }
}

async fn start_locked<S: Store>(
    config: ControllerConfig,
    store: S,
    data_lock: PidLock,
) -> Result<RunningController<S>, ServerError> {
    let dir = &config.data_dir;
    let secrets = load_secrets(&config)?;
    let external_auth = crate::auth::external_auth::ExternalAuth::from_documents(
        &config.jwt_authenticators,
        config.provisioning,
    )
    .map_err(ServerError::Authentication)?;
    let listeners = Listeners::bind(&config).await?;
    let addr = local_addr(&listeners.grpc)?;
    let router_addr = local_addr(&listeners.router)?;
    let metrics_addr = listeners.metrics.as_ref().map(local_addr).transpose()?;
    let login_addr = listeners.login.as_ref().map(local_addr).transpose()?;
    let ui_addr = listeners.ui.as_ref().map(local_addr).transpose()?;
    let endpoint = format!("{}:{}", config.advertise_host, addr.port());
    let router_endpoint = format!("{}:{}", config.advertise_host, router_addr.port());

    // Written before serving, so that whoever waits for the listener finds it complete;
    // not when another running controller holds it.
    let admin_lock = match &config.admin_config {
        Some(path) => lock_admin_config(path)?,
        None => None,
    };
    let admin_config = admin_lock.as_ref().and(config.admin_config.clone());
    if let Some(path) = &admin_config {
        AdminConfig::new(
            endpoint.clone(),
            &secrets.ca_pem,
            secrets.admin_token.as_str(),
        )
        .save(path)
        .map_err(|source| ServerError::AdminConfig {
            path: path.clone(),
            source,
        })?;
    }

    let routers = match &config.routers {
        Some(list) if !list.is_empty() => list.clone(),
        _ => vec![RouterEntry {
            name: "default".into(),
            endpoint: router_endpoint,
            labels: Default::default(),
        }],
    };
    let login_document = crate::service::login::LoginDocument {
        grpc_endpoint: endpoint.clone(),
        router_endpoint: routers.first().map(|r| r.endpoint.clone()),
        namespace: config.login_namespace.clone(),
        ca_bundle: secrets.ca_pem.clone(),
        issuers: external_auth
            .issuers()
            .map(|v| (v.issuer().to_owned(), v.audiences().to_vec()))
            .collect(),
    };
    let mut state = ControllerState::new(
        store,
        Arc::new(secrets.issuer),
        secrets.router_key.clone(),
        routers,
        endpoint.clone(),
    );
    if let Some(s) = Arc::get_mut(&mut state) {
        if let Some(max) = config.max_tags {
            s.max_tags = max;
        }
        s.label_policy = config.label_policy.clone();
        s.auth.external_auth = external_auth;
        s.pending_client_timeout = config.pending_client_timeout;
        s.lease_logs = config
            .lease_logs
            .map(|limits| Arc::new(crate::lease_logs::LeaseLogs::new(limits)));
    }

    let (stop, stopped) = watch::channel(false);
    let mut tasks = Vec::new();
    let router = jumpstarter_router::Router::new(secrets.router_key, Default::default());
    let router_stats = router.stats();
    let grpc_guard = ConnectionGuard::new("controller", config.connection_limits);
    let router_guard = ConnectionGuard::new("router", config.connection_limits);
    let listener_stats = [grpc_guard.stats(), router_guard.stats()];
    tasks.push(spawn_router(
        router,
        listeners.router,
        secrets.identity_pem.clone(),
        router_guard,
        stopped.clone(),
    ));

    if let Some(retention) = config.ended_lease_retention {
        let gc_state = state.clone();
        let rx = stopped.clone();
        tasks.push(tokio::spawn(async move {
            crate::lease::gc::run(&gc_state.store, retention, until_stopped(rx)).await;
        }));
    }
    tasks.push(tokio::spawn(crate::lease::reconcile::run(
        state.clone(),
        until_stopped(stopped.clone()),
    )));
    {
        // Clients' `TokenExpiring` conditions follow the clock.
        let store = state.store.clone();
        let rx = stopped.clone();
        tasks.push(tokio::spawn(async move {
            tokio::select! {
                _ = crate::service::token_expiry::run(store) => {}
                _ = until_stopped(rx) => {}
            }
        }));
    }
    let stop_local_replicas = match &config.pools {
        Some(pools) => {
            let (engine, local) = pool_engine(&config, pools, &secrets.ca_pem).await?;
            tasks.push(tokio::spawn(crate::pools::engine::run(
                state.clone(),
                engine,
                until_stopped(stopped.clone()),
            )));
            local.filter(|_| pools.stop_replicas_on_exit)
        }
        None => None,
    };
    let rpc_metrics = Arc::new(RpcMetrics::default());
    if let Some(l) = listeners.metrics {
        let render = metrics_render(
            state.clone(),
            rpc_metrics.clone(),
            router_stats,
            listener_stats,
            config.metrics_exporter_labels.clone(),
        );
        tasks.push(tokio::spawn(
            jumpstarter_core::server::http1::serve_metrics(
                l,
                render,
                until_stopped(stopped.clone()),
            ),
        ));
    }
    if let Some(l) = listeners.login {
        let acceptor = crate::service::login::acceptor(&secrets.identity_pem)?;
        tasks.push(tokio::spawn(crate::service::login::serve(
            l,
            acceptor,
            Arc::new(login_document),
            until_stopped(stopped.clone()),
        )));
    }
    if let Some(l) = listeners.ui {
        let ui = crate::ui::dashboard(
            state.clone(),
            secrets.admin_token.clone(),
            secrets.ca_pem.clone(),
            stopped.clone(),
            crate::ui::UiOidc {
                client_id: config.ui_oidc_client_id.clone(),
                public_url: config.ui_public_url.clone(),
                namespace: config.login_namespace.clone(),
            },
        );
        if let Some(a) = ui_addr {
            tracing::info!("dashboard listening on http://{a}/ui");
        }
        tasks.push(tokio::spawn(crate::ui::serve(
            l,
            ui,
            until_stopped(stopped.clone()),
        )));
    }
    let (health, grpc) = grpc_server(
        &config,
        &state,
        &secrets.admin_token,
        &secrets.ca_pem,
        rpc_metrics,
    )
    .await?;
    let tls = tls_acceptor(&secrets.identity_pem, None)
        .map_err(|e| ServerError::Tls(jumpstarter_core::error_chain(&e)))?;
    let incoming = grpc_guard.incoming(listeners.grpc, Some(tls));
    tasks.push(tokio::spawn(async move {
        if let Err(e) = grpc
            .serve_with_incoming_shutdown(incoming, until_stopped(stopped))
            .await
        {
            tracing::error!("controller server stopped: {e}");
        }
    }));
    tracing::info!(
        "controller serving on {addr} (endpoint {endpoint}), router on {router_addr}, data in {}",
        dir.display()
    );

    Ok(RunningController {
        addr,
        router_addr,
        endpoint,
        ca_pem: secrets.ca_pem,
        metrics_addr,
        login_addr,
        ui: ui_addr,
        admin_token: secrets.admin_token.as_str().to_string(),
        admin_config,
        _locks: (data_lock, admin_lock),
        state,
        health,
        stop,
        tasks,
        stop_local_replicas,
    })
}

/// The pool engine's settings: the configured provisioners plus the local one. A local
/// provisioner that cannot start (no `jmp` found) is left out with a warning, unless its `jmp`
/// was named explicitly: then the controller does not start.
async fn pool_engine(
    config: &ControllerConfig,
    pools: &crate::pools::engine::PoolsConfig,
    ca_pem: &str,
) -> Result<
    (
        crate::pools::engine::EngineConfig,
        Option<Arc<crate::pools::local::LocalProvisioner>>,
    ),
    ServerError,
> {
    let mut provisioners = pools.provisioners.clone();
    let mut local = None;
    if let Some(options) = &pools.local {
        match crate::pools::local::LocalProvisioner::new(options.clone()).await {
            Ok(p) => {
                let p = Arc::new(p);
                provisioners.insert(p.clone());
                local = Some(p);
            }
            Err(e) if options.jmp.is_some() => {
                return Err(ServerError::Other(format!(
                    "the local pool provisioner: {}",
                    jumpstarter_core::error_chain(&e)
                )));
            }
            Err(e) => tracing::warn!(
                "the local pool provisioner is off: {}",
                jumpstarter_core::error_chain(&e)
            ),
        }
    }
    let mut engine = crate::pools::engine::EngineConfig::new(provisioners);
    engine.ca_pem = ca_pem.to_string();
    engine.credential_secrets = config.credential_secrets;
    Ok((engine, local))
}

/// What the data directory keeps (created on first start).
struct Secrets {
    /// PEM of the CA clients must trust (empty: system roots).
    ca_pem: String,
    /// The gRPC, router and login servers' certificate and key (PEM).
    identity_pem: jumpstarter_core::auth::IssuedCert,
    /// Mints and verifies client and exporter tokens.
    issuer: TokenIssuer,
    /// The AdminService bearer token.
    admin_token: AdminToken,
    /// Signs router tokens.
    router_key: RouterTokenKey,
}

/// Loads (creating on first start) the CA, the server identity, the token signing key, the
/// admin token and the router key from the data directory.
fn load_secrets(config: &ControllerConfig) -> Result<Secrets, ServerError> {
    let dir = &config.data_dir;
    std::fs::create_dir_all(dir).map_err(|e| data_err(dir, e))?;
    // The CA is kept even when an own certificate is used, so that switching back keeps the
    // configs already handed out working.
    let ca = CertificateAuthority::load_or_create(&dir.join("ca"), "jumpstarter controller CA")
        .map_err(|e| data_err(dir.join("ca"), e))?;
    // The tonic identity is not served (the listeners do TLS themselves), but loading it
    // checks that the certificate and key belong together.
    let (_identity, ca_pem, identity_pem) = server_identity(config, &ca)?;
    let mut issuer = TokenIssuer::load_or_generate(&dir.join("signing-key.pem"))
        .map_err(|e| data_err(dir.join("signing-key.pem"), e))?;
    if let Some(lifetime) = config.token_lifetime {
        issuer = issuer.with_lifetime(lifetime);
    }
    let admin_token = AdminToken::load_or_create(&dir.join(ADMIN_TOKEN_FILE))
        .map_err(|e| data_err(dir.join(ADMIN_TOKEN_FILE), e))?;
    let router_key = load_router_key(&dir.join("router-key"))?;
    Ok(Secrets {
        ca_pem,
        identity_pem,
        issuer,
        admin_token,
        router_key,
    })
}

/// The router key kept at `path` (hex), generated and written (mode 0600) when absent.
fn load_router_key(path: &Path) -> Result<RouterTokenKey, ServerError> {
    match std::fs::read_to_string(path) {
        Ok(k) => RouterTokenKey::new(k.trim().as_bytes().to_vec()).map_err(|e| data_err(path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let (key, hex) = RouterTokenKey::generate().map_err(|e| data_err(path, e))?;
            jumpstarter_core::private_file::write_private_file(path, hex.as_bytes())
                .map_err(|e| data_err(path, e))?;
            Ok(key)
        }
        Err(e) => Err(data_err(path, e)),
    }
}

/// The controller's listeners, all bound before anything is served.
struct Listeners {
    grpc: TcpListener,
    router: TcpListener,
    metrics: Option<TcpListener>,
    login: Option<TcpListener>,
    ui: Option<TcpListener>,
}

impl Listeners {
    async fn bind(config: &ControllerConfig) -> Result<Self, ServerError> {
        Ok(Self {
            grpc: bind(&config.listen).await?,
            router: bind(&config.router_listen).await?,
            metrics: match &config.metrics_listen {
                Some(a) => Some(bind(a).await?),
                None => None,
            },
            login: match &config.login_listen {
                Some(a) => Some(bind(a).await?),
                None => None,
            },
            ui: match &config.ui_listen {
                Some(a) => match bind(a).await {
                    Ok(l) => Some(l),
                    Err(e) if config.ui_listen_optional => {
                        tracing::warn!(
                            "the dashboard is off: {e} (give --ui-listen ADDR, or off)",
                            e = jumpstarter_core::error_chain(&e)
                        );
                        None
                    }
                    Err(e) => return Err(e),
                },
                None => None,
            },
        })
    }
}

fn local_addr(l: &TcpListener) -> Result<SocketAddr, ServerError> {
    l.local_addr().map_err(ServerError::LocalAddr)
}

/// Resolves once `stop` says true (or its sender is gone).
async fn until_stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Runs the in-process router on `listener` until stopped.
fn spawn_router(
    router: jumpstarter_router::Router,
    listener: TcpListener,
    identity: jumpstarter_core::auth::IssuedCert,
    guard: ConnectionGuard,
    stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = jumpstarter_router::serve(
            router,
            listener,
            Some(identity),
            guard,
            until_stopped(stopped),
        )
        .await
        {
            tracing::error!("router stopped: {e}");
        }
    })
}

/// One scrape: the objects' gauges, the RPC latencies and the router's counters.
fn metrics_render<S: Store>(
    state: Arc<ControllerState<S>>,
    rpc: Arc<RpcMetrics>,
    router: Arc<jumpstarter_router::RouterStats>,
    listeners: [Arc<ListenerStats>; 2],
    exporter_labels: Vec<String>,
) -> jumpstarter_core::server::http1::MetricsRender {
    let exporter_labels = Arc::new(exporter_labels);
    Arc::new(move || {
        let (state, rpc, router) = (state.clone(), rpc.clone(), router.clone());
        let listeners = listeners.clone();
        let exporter_labels = exporter_labels.clone();
        Box::pin(async move {
            let (mut text, exporters) =
                crate::metrics::object_metrics_and_gauges(&state, &exporter_labels).await;
            text.push_str(&router.prometheus());
            text.push_str(&jumpstarter_core::server::listener::prometheus(&[
                &listeners[0],
                &listeners[1],
            ]));
            jumpstarter_core::metrics::openmetrics_page(
                &[
                    rpc.registry(),
                    crate::metrics::leases().registry(),
                    &exporters,
                ],
                &text,
            )
        })
    })
}

/// The gRPC server: the three services over TLS, with health (all serving) and reflection.
async fn grpc_server<S: Store>(
    config: &ControllerConfig,
    state: &Arc<ControllerState<S>>,
    admin_token: &AdminToken,
    ca_pem: &str,
    rpc_metrics: Arc<RpcMetrics>,
) -> Result<
    (
        tonic_health::server::HealthReporter,
        tonic::transport::server::Router<
            tower::layer::util::Stack<RpcMetricsLayer, tower::layer::util::Identity>,
        >,
    ),
    ServerError,
> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<ControllerServiceServer<ControllerApi<S>>>()
        .await;
    health
        .set_serving::<ClientServiceServer<ClientApi<S>>>()
        .await;
    health
        .set_serving::<AdminServiceServer<AdminApi<S>>>()
        .await;
    health
        .set_serving::<ClientExtensionServiceServer<ClientExtApi<S>>>()
        .await;
    health
        .set_serving::<TelemetryServiceServer<crate::service::telemetry::TelemetryApi<S>>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(jumpstarter_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(jumpstarter_proto::ADMIN_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(ServerError::Reflection)?;
    // TLS is done by the listener's guard (with its handshake timeout), not by tonic.
    let server = config
        .connection_limits
        .keepalive(Server::builder())
        .layer(RpcMetricsLayer(rpc_metrics))
        .add_service(ControllerServiceServer::new(ControllerApi(state.clone())))
        .add_service(ClientServiceServer::new(ClientApi(state.clone())))
        .add_service(ClientExtensionServiceServer::new(ClientExtApi(
            state.clone(),
        )))
        .add_service(AdminServiceServer::new(
            AdminApi::new(state.clone(), admin_token.clone(), ca_pem.to_owned())
                .with_credential_secrets(config.credential_secrets),
        ))
        .add_service(TelemetryServiceServer::new(
            crate::service::telemetry::TelemetryApi(state.clone()),
        ))
        .add_service(health_service)
        .add_service(reflection);
    Ok((health, server))
}
