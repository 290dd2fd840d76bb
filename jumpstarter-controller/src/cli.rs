//! Command line of the `jumpstarter-controller` binary.

use std::{path::PathBuf, time::Duration};

use clap::{Parser, ValueEnum};
use jumpstarter_core::server::listener::{ConnectionLimits, DEFAULT_MAX_CONNECTIONS};

use crate::{
    server::{ControllerConfig, RunningController, start},
    store::Store,
};

/// Where the controller keeps its objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// SQLite in the data directory (one machine).
    Sqlite,
    /// The `jumpstarter.dev` CRDs of a Kubernetes cluster (in-cluster service account or
    /// KUBECONFIG); adds leader election, the `jumpstarter-controller` ConfigMap and
    /// credential Secrets.
    Kubernetes,
}

/// A duration that may be switched off ("0", "off").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalDuration(pub Option<Duration>);

fn parse_optional_duration(s: &str) -> Result<OptionalDuration, String> {
    let t = s.trim();
    if t == "0" || t.eq_ignore_ascii_case("off") {
        return Ok(OptionalDuration(None));
    }
    parse_duration(t).map(|d| OptionalDuration(Some(d)))
}

/// `--ui-public-url`: an `http://` or `https://` URL with a host and no path, query or
/// fragment (a trailing `/` is dropped).
fn parse_public_url(s: &str) -> Result<String, String> {
    let t = s.trim().trim_end_matches('/');
    let uri: http::Uri = t.parse().map_err(|e| format!("{s:?} is not a URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(format!(
            "{s:?} must be an http:// or https:// URL with a host, e.g. https://lab.example.com"
        ));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() || t.contains('#') {
        return Err(format!(
            "{s:?} must be the dashboard's base URL, without a path (the dashboard is under /ui)"
        ));
    }
    Ok(t.to_owned())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = crate::objects::duration::GoDuration::parse(s)
        .map_err(|e| jumpstarter_core::error_chain(&e))?;
    u64::try_from(d.as_nanos())
        .ok()
        .filter(|n| *n > 0)
        .map(Duration::from_nanos)
        .ok_or_else(|| format!("{s:?} must be a positive duration"))
}

/// Jumpstarter controller: inventory, authentication and leases, with an embedded store and
/// an in-process router. With no flags it keeps its data in the user's data directory.
#[derive(Parser, Debug)]
#[command(name = "jumpstarter-controller", version)]
pub struct Args {
    /// Log lines as text for a person, or as JSON for a log store: one object a line with
    /// timestamp, level, component and the correlation fields (lease_id, client, exporter,
    /// namespace).
    #[arg(long, value_name = "FORMAT", env = "JMP_LOG_FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    pub log_format: String,
    /// Export traces of each lease's path (OTLP over gRPC) to this collector, e.g.
    /// `http://127.0.0.1:4317`; `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`)
    /// does the same. Off when none is set.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Where the store, CA and keys live (default: the user's data directory + /jumpstarter).
    #[arg(long, env = "JUMPSTARTER_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// gRPC listen address (controller, client and admin APIs, over TLS). The default
    /// listens on every network interface; `127.0.0.1:8082` keeps it to this machine.
    #[arg(long, default_value = "0.0.0.0:8082", env = "JUMPSTARTER_LISTEN")]
    pub listen: String,
    /// In-process router listen address (every network interface by default, like
    /// `--listen`; exporters and clients must reach it).
    #[arg(
        long,
        default_value = "0.0.0.0:8083",
        env = "JUMPSTARTER_ROUTER_LISTEN"
    )]
    pub router_listen: String,
    /// Host name clients and exporters use to reach this machine (certificate SAN and
    /// advertised endpoints).
    #[arg(long, default_value = "localhost", env = "JUMPSTARTER_ADVERTISE_HOST")]
    pub advertise_host: String,
    /// Where to write the admin config `jmp admin` uses (endpoint, CA, admin token); rewritten
    /// on every start [default: $JMP_ADMIN_CONFIG, else ~/.config/jumpstarter/admin.yaml].
    #[arg(
        long,
        value_name = "PATH",
        env = "JUMPSTARTER_ADMIN_CONFIG",
        conflicts_with = "no_admin_config"
    )]
    pub admin_config: Option<PathBuf>,
    /// Do not write an admin config.
    #[arg(long)]
    pub no_admin_config: bool,
    /// Own server certificate (PEM) instead of one issued by the controller's CA.
    #[arg(
        long,
        value_name = "PATH",
        env = "JUMPSTARTER_TLS_CERT",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// Key of --tls-cert (PEM).
    #[arg(
        long,
        value_name = "PATH",
        env = "JUMPSTARTER_TLS_KEY",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// With --tls-cert: the CA bundle (PEM) to put in the configs handed out (default: none,
    /// clients use their system roots).
    #[arg(
        long,
        value_name = "PATH",
        env = "JUMPSTARTER_TLS_CA",
        requires = "tls_cert"
    )]
    pub tls_ca: Option<PathBuf>,
    /// Prometheus metrics listen address (`GET /metrics`); "off" or "" disables.
    #[arg(
        long,
        default_value = "127.0.0.1:8084",
        env = "JUMPSTARTER_METRICS_LISTEN"
    )]
    pub metrics_listen: String,
    /// Web dashboard listen address (plain HTTP, pages under `/ui`, see docs/dashboard.md);
    /// "off" or "" disables it. Default 127.0.0.1:8086 (when that port is taken, the
    /// controller starts without the dashboard and warns; an address given here must bind).
    #[arg(long, value_name = "ADDR", env = "JUMPSTARTER_UI_LISTEN")]
    pub ui_listen: Option<String>,
    /// The OIDC client id of the dashboard's "Log in with OIDC" buttons, one per external
    /// issuer (a public client: authorization code with PKCE, no secret). Register the
    /// redirect URI `<dashboard URL>/ui/login/oidc/callback` for it with each issuer (see
    /// docs/dashboard.md). Default: `jumpstarter-cli` when the issuer's audiences hold it
    /// (as `jmp login`), else the issuer's first audience.
    #[arg(long, value_name = "ID", env = "JUMPSTARTER_UI_OIDC_CLIENT_ID")]
    pub ui_oidc_client_id: Option<String>,
    /// The dashboard's base URL as browsers reach it, e.g. `https://lab.example.com` behind a
    /// TLS proxy: its OIDC logins send the issuer the redirect URI
    /// `URL/ui/login/oidc/callback`. Default: `http://` + the host and port the browser
    /// asked for (right for a dashboard reached on loopback or through a port-forward).
    #[arg(long, value_name = "URL", env = "JUMPSTARTER_UI_PUBLIC_URL",
          value_parser = parse_public_url)]
    pub ui_public_url: Option<String>,
    /// Exporter labels whose values split the exporters online / leased / quarantined
    /// metrics (comma-separated, e.g. `board,site`; default: one total each). Keep them to
    /// labels with few values: each combination is a series.
    #[arg(
        long,
        value_name = "LABEL,...",
        value_delimiter = ',',
        env = "JUMPSTARTER_METRICS_EXPORTER_LABELS"
    )]
    pub metrics_exporter_labels: Vec<String>,
    /// More names for the server certificate (repeat, or comma-separate), e.g. the
    /// in-cluster Service name `jumpstarter-controller.<ns>.svc`.
    #[arg(
        long = "tls-san",
        value_name = "NAME",
        env = "JUMPSTARTER_TLS_SANS",
        value_delimiter = ','
    )]
    pub tls_sans: Vec<String>,
    /// Object store.
    #[arg(long, value_enum, default_value = "sqlite", env = "JUMPSTARTER_STORE")]
    pub store: StoreKind,
    /// With --store kubernetes: the controller's namespace (ConfigMap, leader Lease).
    #[arg(long, default_value = "default", env = "NAMESPACE")]
    pub namespace: String,
    /// Routers to hand out instead of the in-process one: YAML map `<name>: {endpoint:
    /// host:port, labels: {...}}` as in the `router` key of upstream's ConfigMap (a whole
    /// ConfigMap manifest is accepted too). Overrides the ConfigMap's list.
    #[arg(long, value_name = "FILE", env = "JUMPSTARTER_ROUTERS")]
    pub routers: Option<PathBuf>,
    /// External OIDC issuers (for the SQLite store; with --store kubernetes they come from the
    /// ConfigMap, and this file replaces them). YAML in the shape of upstream's
    /// `authentication:` section, e.g. `jwt: [{issuer: {url: https://dex.example.com,
    /// audiences: [jumpstarter-cli], certificateAuthority: /path/ca.pem}, claimMappings:
    /// {username: {claim: email, prefix: "dex:"}}}]`. The issuer url must equal the tokens'
    /// `iss`, their `aud` must contain one of the audiences, and certificateAuthority (PEM text
    /// or file) is optional. A whole controller `config` document (`authentication:` plus
    /// `provisioning: {enabled: true}`) is accepted too. A token from such an issuer acts as
    /// the Client/Exporter whose `spec.username` equals prefix + claim (see
    /// docs/authentication.md).
    #[arg(long, value_name = "FILE", env = "JUMPSTARTER_AUTHENTICATION_CONFIG")]
    pub authentication_config: Option<PathBuf>,
    /// The controller settings, for the SQLite store: YAML as the `config` key of upstream's
    /// ConfigMap `jumpstarter-controller` (`leasePolicy`, `hiddenLabels`, `deprecatedLabels`,
    /// `grpc.keepalive`, `authentication`, `provisioning`), under the same rules. With
    /// --store kubernetes they come from the ConfigMap. --authentication-config, when given
    /// too, replaces its `authentication` and `provisioning`.
    #[arg(long = "config", value_name = "FILE", env = "JUMPSTARTER_CONFIG")]
    pub config_file: Option<PathBuf>,
    /// Create a Client on the first login of an unknown external OIDC user (upstream's
    /// `provisioning.enabled`).
    #[arg(long, env = "JUMPSTARTER_PROVISIONING")]
    pub provisioning: bool,
    /// Serve "easy login" (`GET https://ADDR/v1/auth/config`, for `jmp login
    /// [client@]host:port`) on this address, with the controller's certificate; off by default.
    #[arg(long, value_name = "ADDR", env = "JUMPSTARTER_LOGIN_LISTEN")]
    pub login_listen: Option<String>,
    /// With --store kubernetes: run without leader election (only ever one replica!).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Leader election: how long the Lease stays valid without renewal.
    #[arg(long, default_value = "15s", value_parser = parse_duration, value_name = "DURATION")]
    pub leader_lease_duration: Duration,
    /// End a lease still waiting for an exporter when its client has not been heard from
    /// (no call at all, e.g. a `jmp shell` killed while queued) for this long; "0" or "off"
    /// never ends one.
    #[arg(
        long,
        default_value = "10m",
        value_parser = parse_optional_duration,
        value_name = "DURATION",
        env = "JUMPSTARTER_PENDING_LEASE_CLIENT_TIMEOUT"
    )]
    pub pending_lease_client_timeout: OptionalDuration,
    /// With the SQLite store: delete an ended lease this long after it ended; "0" or "off"
    /// keeps them all. (With --store kubernetes ended leases stay as objects, as upstream.)
    #[arg(
        long,
        default_value = "168h",
        value_parser = parse_optional_duration,
        value_name = "DURATION",
        env = "JUMPSTARTER_ENDED_LEASE_RETENTION"
    )]
    pub ended_lease_retention: OptionalDuration,
    /// Log gathering: "on" (the default) names this controller as the telemetry endpoint
    /// (GetServiceEndpoints) and keeps what exporters push for each lease (PushLogs), with
    /// its own lease events, for `jmp get lease NAME --logs`; "off" keeps nothing.
    #[arg(long, default_value = "on", value_parser = ["on", "off"], env = "JUMPSTARTER_LEASE_LOGS")]
    pub lease_logs: String,
    /// Log gathering: entries kept per lease (later ones are dropped and counted).
    #[arg(
        long,
        default_value_t = 10_000,
        env = "JUMPSTARTER_LEASE_LOGS_MAX_ENTRIES"
    )]
    pub lease_logs_max_entries: usize,
    /// Log gathering: bytes (encoded entries) kept per lease.
    #[arg(long, default_value_t = 4 * 1024 * 1024, env = "JUMPSTARTER_LEASE_LOGS_MAX_BYTES")]
    pub lease_logs_max_bytes: usize,
    /// Log gathering: leases whose logs are kept (the least recently written goes first).
    #[arg(
        long,
        default_value_t = 1000,
        env = "JUMPSTARTER_LEASE_LOGS_MAX_LEASES"
    )]
    pub lease_logs_max_leases: usize,
    /// Log gathering: a lease's log is removed this long after it was last written.
    #[arg(long, default_value = "24h", value_parser = parse_duration, value_name = "DURATION",
          env = "JUMPSTARTER_LEASE_LOGS_RETENTION")]
    pub lease_logs_retention: Duration,
    /// Start with an empty store although the data directory holds the CA and keys of an
    /// earlier run (refused otherwise: it means store.db was lost; restore a backup instead).
    #[arg(long)]
    pub accept_empty_store: bool,
    /// Concurrent connections on each of the gRPC and router listeners (established or
    /// handshaking); more are closed at once, counted in
    /// `jumpstarter_listener_refused_total` and logged.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS, env = "JUMPSTARTER_MAX_CONNECTIONS")]
    pub max_connections: usize,
    /// Time a connection may take to finish its TLS handshake.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION",
          env = "JUMPSTARTER_HANDSHAKE_TIMEOUT")]
    pub handshake_timeout: Duration,
    /// Time after the TLS handshake within which a connection must send the HTTP/2 preface.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION",
          env = "JUMPSTARTER_FIRST_FRAME_TIMEOUT")]
    pub first_frame_timeout: Duration,
    /// Interval of the HTTP/2 keepalive pings the listeners send [default: 30s, or with
    /// --store kubernetes the ConfigMap's grpc.keepalive.intervalTime].
    #[arg(long, value_parser = parse_duration, value_name = "DURATION",
          env = "JUMPSTARTER_KEEPALIVE_INTERVAL")]
    pub keepalive_interval: Option<Duration>,
    /// A connection whose keepalive ping is unanswered this long is closed [default: 20s, or
    /// with --store kubernetes the ConfigMap's grpc.keepalive.timeout].
    #[arg(long, value_parser = parse_duration, value_name = "DURATION",
          env = "JUMPSTARTER_KEEPALIVE_TIMEOUT")]
    pub keepalive_timeout: Option<Duration>,
    /// Leader election: how often the holder renews (and standbys retry).
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub leader_renew_period: Duration,
    /// Do not run the virtual target pools' engine: ExporterSets are then not scaled (their
    /// replicas are neither started nor stopped).
    #[arg(long, env = "JUMPSTARTER_NO_POOLS")]
    pub no_pools: bool,
    /// The `jmp` binary the `local` pool provisioner runs for each replica (`jmp run`)
    /// [default: `jmp` beside this binary, else the first on PATH; without one the local
    /// provisioner is off].
    #[arg(long, value_name = "PATH", env = "JUMPSTARTER_POOLS_JMP")]
    pub pools_jmp: Option<PathBuf>,
    /// Where the `local` pool provisioner keeps its replicas' directories (config, pid, log)
    /// [default: DATA_DIR/pools].
    #[arg(long, value_name = "DIR", env = "JUMPSTARTER_POOLS_DIR")]
    pub pools_dir: Option<PathBuf>,
    /// Stop the `local` pool replicas when the controller stops (SIGTERM, SIGINT). Without it
    /// they keep serving their leases and the restarted controller adopts them again.
    #[arg(long, env = "JUMPSTARTER_POOLS_STOP_REPLICAS_ON_EXIT")]
    pub pools_stop_replicas_on_exit: bool,
    /// The `local` pool replicas get SIGTERM from the kernel when the controller dies, however
    /// it dies (even SIGKILL): none outlives it, and none is there to adopt after a restart.
    #[arg(long, env = "JUMPSTARTER_POOLS_REPLICAS_EXIT_WITH_CONTROLLER")]
    pub pools_replicas_exit_with_controller: bool,
    /// Instead of serving: back up or restore the SQLite store of --data-dir.
    #[command(subcommand)]
    pub command: Option<StoreCommand>,
}

/// Store maintenance (SQLite store of --data-dir).
#[derive(clap::Subcommand, Debug, Clone)]
pub enum StoreCommand {
    /// Write a consistent copy of the store to FILE (a new file); the controller may run.
    Backup {
        /// The backup file to create.
        file: PathBuf,
    },
    /// Replace the store by the backup FILE (checked first); stop the controller first. The
    /// old store is kept beside it as `store.db.before-restore-<time>`.
    Restore {
        /// The backup file.
        file: PathBuf,
    },
}

impl Args {
    /// The controller configuration these arguments describe.
    pub fn config(&self) -> ControllerConfig {
        let data_dir = self.data_dir.clone().unwrap_or_else(|| {
            dirs::data_dir()
                .unwrap_or_else(|| PathBuf::from("."))
                .join("jumpstarter")
        });
        let admin_config = if self.no_admin_config {
            None
        } else {
            Some(
                self.admin_config
                    .clone()
                    .unwrap_or_else(jumpstarter_core::config::AdminConfig::default_path),
            )
        };
        let metrics = self.metrics_listen.trim();
        let ui = self.ui_listen.as_deref().map(str::trim);
        ControllerConfig {
            listen: self.listen.clone(),
            router_listen: self.router_listen.clone(),
            advertise_host: self.advertise_host.clone(),
            admin_config,
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            tls_ca: self.tls_ca.clone(),
            metrics_listen: (!metrics.is_empty() && !metrics.eq_ignore_ascii_case("off"))
                .then(|| metrics.to_string()),
            metrics_exporter_labels: self
                .metrics_exporter_labels
                .iter()
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
                .collect(),
            routers: None,
            credential_secrets: self.store == StoreKind::Kubernetes,
            max_tags: None,
            label_policy: Default::default(),
            token_lifetime: None,
            extra_sans: self
                .tls_sans
                .iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
            jwt_authenticators: Vec::new(),
            provisioning: self.provisioning,
            login_listen: self.login_listen.clone(),
            ui_listen: match ui {
                None => Some(DEFAULT_UI_LISTEN.to_string()),
                Some(a) if a.is_empty() || a.eq_ignore_ascii_case("off") => None,
                Some(a) => Some(a.to_string()),
            },
            ui_listen_optional: ui.is_none(),
            ui_oidc_client_id: self
                .ui_oidc_client_id
                .as_deref()
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned),
            ui_public_url: self.ui_public_url.clone(),
            login_namespace: self.namespace.clone(),
            pending_client_timeout: self.pending_lease_client_timeout.0,
            accept_empty_store: self.accept_empty_store,
            connection_limits: ConnectionLimits {
                max_connections: self.max_connections,
                handshake_timeout: self.handshake_timeout,
                first_frame_timeout: self.first_frame_timeout,
                keepalive_interval: self
                    .keepalive_interval
                    .unwrap_or(ConnectionLimits::default().keepalive_interval),
                keepalive_timeout: self
                    .keepalive_timeout
                    .unwrap_or(ConnectionLimits::default().keepalive_timeout),
                ..ConnectionLimits::default()
            },
            ended_lease_retention: match self.store {
                StoreKind::Sqlite => self.ended_lease_retention.0,
                StoreKind::Kubernetes => None,
            },
            lease_logs: (self.lease_logs == "on").then_some(crate::lease_logs::LeaseLogLimits {
                max_entries: self.lease_logs_max_entries,
                max_bytes: self.lease_logs_max_bytes,
                max_leases: self.lease_logs_max_leases,
                retention: self.lease_logs_retention,
            }),
            pools: (!self.no_pools).then(|| {
                let mut pools = crate::pools::engine::PoolsConfig::new(&data_dir);
                if let Some(local) = pools.local.as_mut() {
                    local.jmp = self.pools_jmp.clone();
                    local.exit_with_controller = self.pools_replicas_exit_with_controller;
                    if let Some(dir) = &self.pools_dir {
                        local.base_dir = dir.clone();
                    }
                }
                pools.stop_replicas_on_exit = self.pools_stop_replicas_on_exit;
                pools
            }),
            data_dir,
        }
    }

    /// The leader election settings these arguments describe (used with the Kubernetes
    /// store only).
    pub fn leader_config(&self) -> crate::kubernetes::leader::LeaderConfig {
        crate::kubernetes::leader::LeaderConfig {
            lease_duration: self.leader_lease_duration,
            renew_period: self.leader_renew_period,
            ..crate::kubernetes::leader::LeaderConfig::new(&self.namespace)
        }
    }
}

/// The dashboard's address unless `--ui-listen` says otherwise.
pub const DEFAULT_UI_LISTEN: &str = "127.0.0.1:8086";

/// Prefix of the one stderr line that gives the bound addresses, for scripts and tests:
/// `jumpstarter-controller ready: grpc=<addr> router=<addr> metrics=<addr|off> endpoint=<host:port>`.
pub const READY_LINE_PREFIX: &str = "jumpstarter-controller ready:";

/// Entry point of the binary.
pub fn main() -> std::process::ExitCode {
    let args = Args::parse();
    jumpstarter_core::tls::install_tls_provider();
    let _traces = match jumpstarter_core::telemetry::start(
        "jumpstarter-controller",
        args.otlp_endpoint.as_deref(),
    ) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("Error: {}", jumpstarter_core::error_chain(&e));
            return std::process::ExitCode::FAILURE;
        }
    };
    jumpstarter_core::logging::init("controller", args.log_format == "json");
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!(
                "Error: cannot start the async runtime: {e}",
                e = jumpstarter_core::error_chain(&e)
            );
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = rt.block_on(async move {
        match run(args).await {
            Ok(code) => code,
            Err(e) => {
                jumpstarter_core::logging::say_error(e);
                std::process::ExitCode::FAILURE
            }
        }
    });
    jumpstarter_core::logging::flush();
    code
}

/// Resolves on SIGINT or SIGTERM.
/// Resolves once SIGTERM or SIGINT (Ctrl-C) has arrived, at any time since the first call:
/// the handlers are installed once and what they saw is kept, so a signal that comes between
/// two waits (a standby that has just taken the Lease over and not yet serves) is not lost.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    static STOPPED: std::sync::OnceLock<tokio::sync::watch::Receiver<bool>> =
        std::sync::OnceLock::new();
    let mut stopped = STOPPED
        .get_or_init(|| {
            let (tx, rx) = tokio::sync::watch::channel(false);
            // Installed now, not when the task first runs.
            let term = signal(SignalKind::terminate());
            let int = signal(SignalKind::interrupt());
            tokio::spawn(async move {
                let wait = |s: std::io::Result<tokio::signal::unix::Signal>| async move {
                    match s {
                        Ok(mut s) => {
                            s.recv().await;
                        }
                        Err(_) => std::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    _ = wait(term) => {}
                    _ = wait(int) => {}
                }
                let _ = tx.send(true);
                // Keep the sender: a receiver never sees the channel closed.
                std::future::pending::<()>().await
            });
            rx
        })
        .clone();
    let _ = stopped.wait_for(|s| *s).await;
}

async fn run(args: Args) -> Result<std::process::ExitCode, String> {
    // The signal handlers, from the start (a SIGTERM at any later moment stops the process).
    let _ = futures::FutureExt::now_or_never(stop_signal());
    let mut config = args.config();
    if let Some(cmd) = args.command.clone() {
        let data = config.data_dir.clone();
        let done = tokio::task::spawn_blocking(move || match cmd {
            StoreCommand::Backup { file } => crate::store::backup::backup(&data, &file).map(|()| {
                format!(
                    "Store of {} backed up to {}",
                    data.display(),
                    file.display()
                )
            }),
            StoreCommand::Restore { file } => crate::store::backup::restore(&data, &file)
                .map(|db| format!("Store {} restored from {}", db.display(), file.display())),
        })
        .await
        .map_err(|e| {
            format!(
                "store task failed: {e}",
                e = jumpstarter_core::error_chain(&e)
            )
        })?
        .map_err(|e| jumpstarter_core::error_chain(&e))?;
        jumpstarter_core::logging::say(done);
        return Ok(std::process::ExitCode::SUCCESS);
    }
    if let Some(path) = &args.routers {
        config.routers = Some(
            crate::kubernetes::cluster_config::routers_from_file(path)
                .map_err(|e| jumpstarter_core::error_chain(&e))?,
        );
    }
    if let Some(path) = &args.config_file {
        if args.store == StoreKind::Kubernetes {
            return Err(format!(
                "--config {}: with --store kubernetes the settings come from the ConfigMap {}",
                path.display(),
                crate::kubernetes::cluster_config::CONFIG_MAP_NAME
            ));
        }
        apply_settings_file(path, &args, &mut config)?;
    }
    if let Some(path) = &args.authentication_config {
        let (auth, provisioning) = crate::auth::external_auth::read_authentication_file(path)
            .map_err(|e| jumpstarter_core::error_chain(&e))?;
        apply_internal_authentication(&auth, &mut config, &path.display().to_string())?;
        config.jwt_authenticators = auth.jwt;
        config.provisioning |= provisioning;
    }
    match args.store {
        StoreKind::Sqlite => {
            let running = start(config.clone())
                .await
                .map_err(|e| jumpstarter_core::error_chain(&e))?;
            Ok(serve(running, &config, std::future::pending()).await)
        }
        #[cfg(feature = "kubernetes")]
        StoreKind::Kubernetes => run_kubernetes(&args, config).await,
        #[cfg(not(feature = "kubernetes"))]
        StoreKind::Kubernetes => {
            Err("--store kubernetes: this binary was built without the `kubernetes` feature".into())
        }
    }
}

/// `--config FILE`: the ConfigMap's `config` key from a file, applied as the ConfigMap's is.
fn apply_settings_file(
    path: &std::path::Path,
    args: &Args,
    config: &mut ControllerConfig,
) -> Result<(), String> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {source}: {e}"))?;
    let settings = crate::kubernetes::cluster_config::parse_settings(&text, &source)
        .map_err(|e| jumpstarter_core::error_chain(&e))?;
    apply_settings(
        &settings,
        config,
        (
            args.keepalive_interval.is_some(),
            args.keepalive_timeout.is_some(),
        ),
        &source,
    )?;
    let cluster = crate::kubernetes::cluster_config::ClusterConfig {
        settings,
        ..Default::default()
    };
    apply_cluster_authentication(&cluster, config, &source)
}

/// Applies `authentication.internal` (from the ConfigMap or `--authentication-config`) to
/// `config`: `tokenLifetime` sets the lifetime of the tokens issued from now on. What this
/// controller cannot honour is refused, naming the key (`source` says where it came from):
/// a `prefix` other than its own `internal:`, and `k8s.enabled: true` (which upstream 0.9.0
/// parses without applying either).
pub fn apply_internal_authentication(
    auth: &crate::kubernetes::cluster_config::Authentication,
    config: &mut ControllerConfig,
    source: &str,
) -> Result<(), String> {
    let own = crate::auth::INTERNAL_USERNAME_PREFIX;
    if let Some(prefix) = auth.internal.prefix.as_deref()
        && prefix != own
    {
        return Err(format!(
            "{source}: authentication.internal.prefix {prefix:?} is not supported: this \
             controller's own tokens use the prefix {own:?}; set it to that or remove it"
        ));
    }
    if auth.k8s.enabled {
        return Err(format!(
            "{source}: authentication.k8s.enabled is not supported (upstream 0.9.0 does not \
             apply it either): accept service-account tokens with a jwt authenticator for the \
             cluster's issuer (docs/kubernetes.md, CI jobs), and remove the key"
        ));
    }
    if let Some(lifetime) = positive(
        auth.internal.token_lifetime,
        "authentication.internal.tokenLifetime",
        source,
    )? {
        config.token_lifetime = Some(lifetime);
    }
    Ok(())
}

/// The ConfigMap's authentication, as upstream reads it: the legacy `authentication` key,
/// when present, is the authentication configuration (`config.authentication` and
/// `provisioning` are then not used, and provisioning stays off); else `config`'s
/// `authentication` and `provisioning`. (`--authentication-config` replaces both.)
pub fn apply_cluster_authentication(
    cluster: &crate::kubernetes::cluster_config::ClusterConfig,
    config: &mut ControllerConfig,
    source: &str,
) -> Result<(), String> {
    match &cluster.legacy_authentication {
        Some(text) => {
            let (auth, _) = crate::auth::external_auth::parse_authentication_text(
                text,
                source,
                "authentication",
            )
            .map_err(|e| jumpstarter_core::error_chain(&e))?;
            apply_internal_authentication(&auth, config, source)?;
            config.jwt_authenticators = auth.jwt;
        }
        None => {
            let auth = &cluster.settings.authentication;
            apply_internal_authentication(auth, config, source)?;
            config.jwt_authenticators = auth.jwt.clone();
            config.provisioning |= cluster.settings.provisioning.enabled;
        }
    }
    Ok(())
}

/// A Go duration of the ConfigMap as a positive [`Duration`], or an error naming `key`.
fn positive(
    value: Option<crate::GoDuration>,
    key: &str,
    source: &str,
) -> Result<Option<Duration>, String> {
    let Some(value) = value else {
        return Ok(None);
    };
    match u64::try_from(value.as_nanos()).ok().filter(|n| *n > 0) {
        Some(nanos) => Ok(Some(Duration::from_nanos(nanos))),
        None => Err(format!("{source}: {key} must be positive")),
    }
}

/// Applies the ConfigMap's `config` key (all but `authentication` and `provisioning`, which
/// [`apply_internal_authentication`] and the caller handle) to `config`:
///
/// - `leasePolicy.maxTags`;
/// - `hiddenLabels.keys` and `deprecatedLabels.keys`: what `GetExporter`/`ListExporters`
///   show of exporters' labels;
/// - `grpc.keepalive.intervalTime` and `timeout`: the listeners' HTTP/2 keepalive, unless
///   `--keepalive-interval`/`--keepalive-timeout` were given (`flags`);
///   `maxConnectionAge` and `maxConnectionAgeGrace`: connections are closed gracefully at
///   that age, and at once after the grace;
/// - `grpc.keepalive.minTime` and `permitWithoutStream: true` are what the server allows
///   clients: this one never closes a connection for its pings, at any rate, with or
///   without calls, so every such allowance holds.
///
/// Refused, naming the key: `grpc.keepalive.permitWithoutStream: false` and
/// `maxConnectionIdle`, which ask the server to close connections in ways it cannot.
pub fn apply_settings(
    settings: &crate::kubernetes::cluster_config::ControllerSettings,
    config: &mut ControllerConfig,
    flags: (bool, bool),
    source: &str,
) -> Result<(), String> {
    config.max_tags = settings.lease_policy.max_tags;
    config.label_policy = crate::objects::LabelPolicy {
        hidden: settings.hidden_labels.keys.iter().cloned().collect(),
        deprecated: settings
            .deprecated_labels
            .keys
            .clone()
            .into_iter()
            .collect(),
    };
    let k = &settings.grpc.keepalive;
    if k.permit_without_stream == Some(false) {
        return Err(format!(
            "{source}: grpc.keepalive.permitWithoutStream: false is not supported: this \
             controller does not close connections that ping without calls (upstream's \
             Python clients ping every 20 s, calls or not); remove it or set it to true"
        ));
    }
    if k.max_connection_idle.is_some() {
        return Err(format!(
            "{source}: grpc.keepalive.maxConnectionIdle is not supported: this controller \
             does not close idle connections (exporters hold theirs open for their Status \
             streams); remove it"
        ));
    }
    positive(k.min_time, "grpc.keepalive.minTime", source)?;
    let limits = &mut config.connection_limits;
    let (interval_flag, timeout_flag) = flags;
    if let Some(v) = positive(k.interval_time, "grpc.keepalive.intervalTime", source)?
        && !interval_flag
    {
        limits.keepalive_interval = v;
    }
    if let Some(v) = positive(k.timeout, "grpc.keepalive.timeout", source)?
        && !timeout_flag
    {
        limits.keepalive_timeout = v;
    }
    limits.max_connection_age = positive(
        k.max_connection_age,
        "grpc.keepalive.maxConnectionAge",
        source,
    )?;
    limits.max_connection_age_grace = positive(
        k.max_connection_age_grace,
        "grpc.keepalive.maxConnectionAgeGrace",
        source,
    )?;
    Ok(())
}

#[cfg(feature = "kubernetes")]
async fn run_kubernetes(
    args: &Args,
    mut config: ControllerConfig,
) -> Result<std::process::ExitCode, String> {
    use crate::{
        kubernetes::{cluster_config, leader::LeaderElector},
        store::KubeStore,
    };
    let store = KubeStore::from_env()
        .await
        .map_err(|e| jumpstarter_core::error_chain(&e))?;
    // Pools whose class names qemu.jumpstarter.dev run their replicas as Pods here.
    if let Some(pools) = config.pools.as_mut() {
        let pods = crate::pools::kube::KubeProvisioner::new(store.client().clone());
        pools.provisioners.insert(std::sync::Arc::new(pods));
    }
    let cluster = cluster_config::load(&store, &args.namespace)
        .await
        .map_err(|e| jumpstarter_core::error_chain(&e))?;
    if config.routers.is_none() && !cluster.routers.is_empty() {
        config.routers = Some(cluster.routers.clone());
    }
    let source = format!(
        "ConfigMap {}/{}",
        args.namespace,
        cluster_config::CONFIG_MAP_NAME
    );
    apply_settings(
        &cluster.settings,
        &mut config,
        (
            args.keepalive_interval.is_some(),
            args.keepalive_timeout.is_some(),
        ),
        &source,
    )?;
    if args.authentication_config.is_none() {
        apply_cluster_authentication(&cluster, &mut config, &source)?;
    }
    // Where the standby's connections go (the leader, or this process once it leads).
    let forward_to = tokio::sync::watch::Sender::new(None);
    let mut elector = if args.no_leader_election {
        None
    } else {
        let mut e = LeaderElector::new(store.clone(), args.leader_config())
            .map_err(|e| jumpstarter_core::error_chain(&e))?;
        // While another replica leads, this one forwards its ports to it (so that every
        // replica is Ready and rolling updates complete), and serves on the same ports once
        // it leads.
        let grpc = tokio::net::TcpListener::bind(&config.listen)
            .await
            .map_err(|e| {
                format!(
                    "cannot listen on {}: {e}",
                    config.listen,
                    e = jumpstarter_core::error_chain(&e)
                )
            })?;
        let router = tokio::net::TcpListener::bind(&config.router_listen)
            .await
            .map_err(|e| {
                format!(
                    "cannot listen on {}: {e}",
                    config.router_listen,
                    e = jumpstarter_core::error_chain(&e)
                )
            })?;
        for (l, at) in [
            (&grpc, &mut config.listen),
            (&router, &mut config.router_listen),
        ] {
            if let Ok(a) = l.local_addr() {
                *at = a.to_string();
            }
        }
        let (grpc_addr, router_addr) = match (grpc.local_addr(), router.local_addr()) {
            (Ok(g), Ok(r)) => (g, r),
            (Err(e), _) | (_, Err(e)) => {
                return Err(format!(
                    "standby listeners: {e}",
                    e = jumpstarter_core::error_chain(&e)
                ));
            }
        };
        // The dashboard's port too, when this replica serves one once it leads.
        let ui = bind_standby_ui(&mut config).await?;
        let ui_addr = ui.as_ref().and_then(|l| l.local_addr().ok());
        tracing::info!(
            "standby listeners: grpc={} router={} ui={}; forwarded to the leader until this \
             replica leads",
            config.listen,
            config.router_listen,
            ui_addr.map_or_else(|| "off".to_owned(), |a| a.to_string())
        );
        let mut listeners = vec![
            (grpc, crate::kubernetes::standby::Port::Grpc),
            (router, crate::kubernetes::standby::Port::Router),
        ];
        listeners.extend(ui.map(|l| (l, crate::kubernetes::standby::Port::Ui)));
        let standby = crate::kubernetes::standby::forward(listeners, forward_to.subscribe());
        // The leader's endpoints, as the election sees them, while we stand by.
        let mut theirs = e.leader_endpoints();
        let relay = async {
            loop {
                let endpoints = theirs.borrow_and_update().clone();
                forward_to.send_replace(endpoints.map(|endpoints| {
                    crate::kubernetes::standby::Target {
                        endpoints,
                        ours: false,
                    }
                }));
                if theirs.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        // A leader whose process died is taken over at once, not when its Lease expires.
        let holder_gone = crate::kubernetes::leader::HolderGone::new();
        let own = crate::kubernetes::standby::Endpoints::advertised(
            grpc_addr,
            router_addr,
            ui_addr,
            pod_ip(),
        );
        let probe =
            crate::kubernetes::standby::watch_leader(e.leader_endpoints(), own, &holder_gone);
        tokio::select! {
            _ = e.acquire_or_take_over(&holder_gone) => {}
            _ = standby => {}
            _ = relay => {}
            _ = probe => {}
            _ = stop_signal() => return Ok(std::process::ExitCode::SUCCESS),
        }
        // The connections the standby accepted and holds wait for a leader: us, once we
        // serve (below), unless another one shows up first.
        forward_to.send_replace(None);
        Some(e)
    };
    // The leader alone moves key material, so replicas cannot race on the first start.
    crate::kubernetes::key_secret::restore(&store, &args.namespace, &config.data_dir)
        .await
        .map_err(|e| jumpstarter_core::error_chain(&e))?;
    let running = crate::server::start_with_store(config.clone(), store.clone())
        .await
        .map_err(|e| jumpstarter_core::error_chain(&e))?;
    if let Some(e) = elector.as_mut() {
        // Written with the next renewal: the standbys forward here.
        match crate::kubernetes::standby::Endpoints::advertised(
            running.addr,
            running.router_addr,
            running.ui_addr(),
            pod_ip(),
        ) {
            Some(at) => {
                if let Some(ui) = running.ui_addr()
                    && at.ui.is_none()
                {
                    tracing::info!(
                        "the dashboard listens on {ui}, which other pods cannot reach: standby \
                         replicas close dashboard connections (give --ui-listen 0.0.0.0:PORT \
                         to serve it through every replica)"
                    );
                }
                e.set_endpoints(at.annotation());
                forward_to.send_replace(Some(crate::kubernetes::standby::Target {
                    endpoints: at.annotation(),
                    ours: true,
                }));
            }
            None => tracing::warn!(
                "POD_IP is not set and the controller listens on every interface: standby \
                 replicas cannot forward to this one (set POD_IP from status.podIP, as \
                 deploy/kubernetes does)"
            ),
        }
    }
    crate::kubernetes::key_secret::save(&store, &args.namespace, &config.data_dir)
        .await
        .map_err(|e| jumpstarter_core::error_chain(&e))?;
    // The standalone routers (deploy/kubernetes) serve with a certificate from our CA.
    let ca = jumpstarter_core::auth::CertificateAuthority::load(&config.data_dir.join("ca"))
        .map_err(|e| jumpstarter_core::error_chain(&e))?;
    let sans = crate::kubernetes::key_secret::router_sans(&running.state.routers, &args.namespace);
    crate::kubernetes::key_secret::ensure_router_tls(&store, &args.namespace, &ca, &sans)
        .await
        .map_err(|e| jumpstarter_core::error_chain(&e))?;
    let lost = async {
        match elector.as_mut() {
            Some(e) => e.hold().await,
            None => std::future::pending().await,
        }
    };
    let code = serve(running, &config, lost).await;
    if let Some(e) = elector.as_mut()
        && code == std::process::ExitCode::SUCCESS
        && let Err(err) = e.release().await
    {
        tracing::warn!("{err}", err = jumpstarter_core::error_chain(&err));
    }
    Ok(code)
}

/// Binds the dashboard's port for a standby, as the leader's server would bind it: nothing
/// when the dashboard is off; when the address cannot be bound, a warning and nothing if it is
/// the default ([`ControllerConfig::ui_listen_optional`]: another process may have it), an
/// error if it was given. `config.ui_listen` becomes the bound address (a port 0 resolved),
/// which the server binds again once this replica leads and the standby's listener is gone.
#[cfg(feature = "kubernetes")]
async fn bind_standby_ui(
    config: &mut ControllerConfig,
) -> Result<Option<tokio::net::TcpListener>, String> {
    let Some(at) = config.ui_listen.as_mut() else {
        return Ok(None);
    };
    match tokio::net::TcpListener::bind(at.as_str()).await {
        Ok(l) => {
            if let Ok(a) = l.local_addr() {
                *at = a.to_string();
            }
            Ok(Some(l))
        }
        Err(e) if config.ui_listen_optional => {
            tracing::warn!(
                "the dashboard is not forwarded: cannot listen on {at}: {e} (give \
                 --ui-listen ADDR, or off)",
                e = jumpstarter_core::error_chain(&e)
            );
            Ok(None)
        }
        Err(e) => Err(format!(
            "cannot listen on {at}: {e}",
            e = jumpstarter_core::error_chain(&e)
        )),
    }
}

/// `POD_IP` (the downward API's `status.podIP`), when set to an address.
fn pod_ip() -> Option<std::net::IpAddr> {
    std::env::var("POD_IP")
        .ok()
        .and_then(|ip| ip.trim().parse().ok())
}

/// Announces `running`, serves until a signal (success) or until `lost` resolves (failure:
/// leadership lost), then shuts down.
async fn serve<S: Store>(
    running: RunningController<S>,
    config: &ControllerConfig,
    lost: impl std::future::Future<Output = crate::kubernetes::leader::LeaderError>,
) -> std::process::ExitCode {
    if let Some(p) = &running.admin_config {
        jumpstarter_core::logging::say(format!(
            "Admin config (controller endpoint, CA and admin token) written to {}",
            p.display()
        ));
    }
    jumpstarter_core::logging::say(format!(
        "{READY_LINE_PREFIX} grpc={} router={} metrics={} endpoint={} data={}",
        running.addr,
        running.router_addr,
        running
            .metrics_addr
            .map_or_else(|| "off".to_string(), |a| a.to_string()),
        running.endpoint,
        config.data_dir.display()
    ));
    for line in serving_lines(running.addr, running.router_addr, running.metrics_addr) {
        jumpstarter_core::logging::say(line);
    }
    if let Some(a) = running.login_addr {
        jumpstarter_core::logging::say(format!("Easy login served at https://{a}/v1/auth/config"));
    }
    let state = running.state.clone();
    let code = tokio::select! {
        _ = stop_signal() => std::process::ExitCode::SUCCESS,
        reason = state.failed() => {
            jumpstarter_core::logging::say_error(reason);
            std::process::ExitCode::FAILURE
        }
        e = lost => {
            tracing::error!("{e}; stopping so that the new leader serves alone");
            std::process::ExitCode::FAILURE
        }
    };
    tracing::info!("shutting down: ending streams, then stopping");
    running.shutdown().await;
    code
}

/// What the controller serves where, for a person: each address, and whether it is open to
/// the network (an unspecified address listens on every interface).
fn serving_lines(
    grpc: std::net::SocketAddr,
    router: std::net::SocketAddr,
    metrics: Option<std::net::SocketAddr>,
) -> Vec<String> {
    let reach = |a: std::net::SocketAddr, flag: &str| {
        if a.ip().is_unspecified() {
            format!(
                "{a}: all network interfaces (`{flag} 127.0.0.1:{}` keeps it to this machine)",
                a.port()
            )
        } else if a.ip().is_loopback() {
            format!("{a}: this machine only")
        } else {
            a.to_string()
        }
    };
    let mut lines = vec![
        format!(
            "Serving the controller (gRPC over TLS) on {}",
            reach(grpc, "--listen")
        ),
        format!("Serving the router on {}", reach(router, "--router-listen")),
    ];
    if let Some(m) = metrics {
        lines.push(format!(
            "Serving metrics on http://{}",
            reach(m, "--metrics-listen")
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ConfigMap's `config` key as text, applied to a default config.
    fn applied(yaml: &str, flags: (bool, bool)) -> Result<ControllerConfig, String> {
        let settings = crate::kubernetes::cluster_config::parse_settings(yaml, "cm")
            .map_err(|e| e.to_string())?;
        let mut config = ControllerConfig::new("/nonexistent".into());
        apply_settings(&settings, &mut config, flags, "cm")?;
        apply_internal_authentication(&settings.authentication, &mut config, "cm")?;
        Ok(config)
    }

    #[test]
    fn the_legacy_authentication_key_is_the_authentication_configuration() {
        let data = |legacy: Option<&str>| {
            let mut d = std::collections::BTreeMap::new();
            d.insert(
                "config".to_string(),
                "authentication:\n  jwt: []\nprovisioning:\n  enabled: true\n".to_string(),
            );
            if let Some(l) = legacy {
                d.insert("authentication".to_string(), l.to_string());
            }
            d
        };
        let cluster = |legacy: Option<&str>| {
            crate::kubernetes::cluster_config::from_config_map(
                &k8s_openapi::api::core::v1::ConfigMap {
                    metadata: kube::api::ObjectMeta {
                        name: Some("jumpstarter-controller".into()),
                        namespace: Some("lab".into()),
                        ..Default::default()
                    },
                    data: Some(data(legacy)),
                    ..Default::default()
                },
            )
            .unwrap()
        };
        let legacy = "apiVersion: jumpstarter.dev/v1alpha1
kind: AuthenticationConfiguration
internal:
  prefix: 'internal:'
  tokenLifetime: 48h
jwt:
  - issuer:
      url: https://dex.example.com
      audiences: [jumpstarter-cli]
    claimMappings:
      username:
        claim: email
        prefix: 'dex:'
";
        let mut c = ControllerConfig::new("/nonexistent".into());
        apply_cluster_authentication(&cluster(Some(legacy)), &mut c, "cm").unwrap();
        assert_eq!(c.jwt_authenticators.len(), 1);
        assert_eq!(c.token_lifetime, Some(Duration::from_secs(48 * 3600)));
        assert!(!c.provisioning, "provisioning is off under the legacy key");

        let mut c = ControllerConfig::new("/nonexistent".into());
        apply_cluster_authentication(&cluster(None), &mut c, "cm").unwrap();
        assert!(c.jwt_authenticators.is_empty());
        assert!(c.provisioning);

        // A legacy key that is not an AuthenticationConfiguration is refused by name.
        let mut c = ControllerConfig::new("/nonexistent".into());
        let err =
            apply_cluster_authentication(&cluster(Some("- a list")), &mut c, "cm").unwrap_err();
        assert!(err.contains("authentication"), "{err}");
    }

    #[test]
    fn every_configmap_setting_is_applied_or_refused_by_name() {
        // The layout of upstream's ConfigMap (deploy/kubernetes and the tests' sample).
        let c = applied(
            "authentication:
  internal:
    prefix: 'internal:'
    tokenLifetime: 720h
grpc:
  keepalive:
    minTime: 1s
    permitWithoutStream: true
    timeout: 180s
    intervalTime: 45s
    maxConnectionAge: 2h
    maxConnectionAgeGrace: 30s
leasePolicy:
  maxTags: 5
hiddenLabels:
  keys: [internal.example.com/rack]
deprecatedLabels:
  keys: {old-board: use board}
",
            (false, false),
        )
        .unwrap();
        let hours = |h: u64| Duration::from_secs(h * 3600);
        assert_eq!(c.token_lifetime, Some(hours(720)));
        assert_eq!(c.max_tags, Some(5));
        assert_eq!(
            c.connection_limits.keepalive_interval,
            Duration::from_secs(45)
        );
        assert_eq!(
            c.connection_limits.keepalive_timeout,
            Duration::from_secs(180)
        );
        assert_eq!(c.connection_limits.max_connection_age, Some(hours(2)));
        assert_eq!(
            c.connection_limits.max_connection_age_grace,
            Some(Duration::from_secs(30))
        );
        assert!(c.label_policy.hidden.contains("internal.example.com/rack"));
        assert_eq!(c.label_policy.deprecated["old-board"], "use board");

        // The command line's keepalive wins over the ConfigMap's.
        let c = applied(
            "grpc: {keepalive: {intervalTime: 45s, timeout: 180s}}",
            (true, true),
        )
        .unwrap();
        assert_eq!(
            c.connection_limits.keepalive_interval,
            ConnectionLimits::default().keepalive_interval
        );
        assert_eq!(
            c.connection_limits.keepalive_timeout,
            ConnectionLimits::default().keepalive_timeout
        );
        // Nothing set: the defaults.
        let c = applied("", (false, false)).unwrap();
        assert_eq!(c.token_lifetime, None);
        assert_eq!(c.connection_limits, ConnectionLimits::default());
        assert_eq!(c.label_policy, crate::objects::LabelPolicy::default());

        // What cannot be honoured is refused, naming the key.
        for (yaml, key) in [
            (
                "authentication: {internal: {prefix: 'lab:'}}",
                "authentication.internal.prefix",
            ),
            (
                "authentication: {k8s: {enabled: true}}",
                "authentication.k8s.enabled",
            ),
            (
                "authentication: {internal: {tokenLifetime: 0s}}",
                "tokenLifetime",
            ),
            (
                "grpc: {keepalive: {permitWithoutStream: false}}",
                "permitWithoutStream",
            ),
            (
                "grpc: {keepalive: {maxConnectionIdle: 5m}}",
                "maxConnectionIdle",
            ),
            (
                "grpc: {keepalive: {timeout: -1s}}",
                "grpc.keepalive.timeout",
            ),
            (
                "grpc: {keepalive: {maxConnectionAge: 0s}}",
                "maxConnectionAge",
            ),
        ] {
            let err = applied(yaml, (false, false)).expect_err(yaml);
            assert!(
                err.starts_with("cm: ") && err.contains(key),
                "{yaml}: {err}"
            );
        }
    }

    #[test]
    fn the_served_addresses_say_who_can_reach_them() {
        let lines = serving_lines(
            "0.0.0.0:8082".parse().unwrap(),
            "127.0.0.1:8083".parse().unwrap(),
            None,
        );
        assert_eq!(
            lines,
            [
                "Serving the controller (gRPC over TLS) on 0.0.0.0:8082: all network interfaces \
                 (`--listen 127.0.0.1:8082` keeps it to this machine)",
                "Serving the router on 127.0.0.1:8083: this machine only",
            ]
        );
    }

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("jumpstarter-controller").chain(args.iter().copied()))
    }

    #[test]
    fn flags_become_the_config() {
        let c = parse(&[
            "--data-dir",
            "/d",
            "--admin-config",
            "/a.yaml",
            "--metrics-listen",
            "127.0.0.1:0",
            "--tls-cert",
            "/c.pem",
            "--tls-key",
            "/k.pem",
            "--tls-ca",
            "/ca.pem",
        ])
        .unwrap()
        .config();
        assert_eq!(c.data_dir, PathBuf::from("/d"));
        assert_eq!(c.admin_config, Some(PathBuf::from("/a.yaml")));
        assert_eq!(c.metrics_listen.as_deref(), Some("127.0.0.1:0"));
        assert_eq!(c.tls_cert, Some(PathBuf::from("/c.pem")));
        assert_eq!(c.tls_key, Some(PathBuf::from("/k.pem")));
        assert_eq!(c.tls_ca, Some(PathBuf::from("/ca.pem")));

        let c = parse(&["--no-admin-config", "--metrics-listen", "off"])
            .unwrap()
            .config();
        assert_eq!(c.admin_config, None);
        assert_eq!(c.metrics_listen, None);
        let c = parse(&["--metrics-listen", ""]).unwrap().config();
        assert_eq!(c.metrics_listen, None);
        assert!(!c.credential_secrets);
    }

    #[test]
    fn the_dashboard_listens_on_loopback_unless_told_otherwise() {
        let c = parse(&[]).unwrap().config();
        assert_eq!(c.ui_listen.as_deref(), Some("127.0.0.1:8086"));
        assert!(c.ui_listen_optional, "the default address may be taken");
        let c = parse(&["--ui-listen", "0.0.0.0:9000"]).unwrap().config();
        assert_eq!(c.ui_listen.as_deref(), Some("0.0.0.0:9000"));
        assert!(!c.ui_listen_optional, "an address given must bind");
        for off in ["off", "OFF", "", " "] {
            let c = parse(&["--ui-listen", off]).unwrap().config();
            assert_eq!(c.ui_listen, None, "{off:?}");
        }
    }

    #[test]
    fn the_dashboard_s_oidc_flags() {
        let c = parse(&[]).unwrap().config();
        assert_eq!((c.ui_oidc_client_id, c.ui_public_url), (None, None));
        let c = parse(&[
            "--ui-oidc-client-id",
            "dashboard",
            "--ui-public-url",
            "https://lab.example.com/",
        ])
        .unwrap()
        .config();
        assert_eq!(c.ui_oidc_client_id.as_deref(), Some("dashboard"));
        assert_eq!(c.ui_public_url.as_deref(), Some("https://lab.example.com"));
        for bad in [
            "lab.example.com",
            "ftp://lab.example.com",
            "https://lab.example.com/ui",
            "https://lab.example.com?x=1",
        ] {
            let e = parse(&["--ui-public-url", bad]).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn store_and_leader_flags() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.store, StoreKind::Sqlite);
        assert_eq!(a.leader_config().lease_duration, Duration::from_secs(15));
        let a = parse(&[
            "--store",
            "kubernetes",
            "--namespace",
            "lab",
            "--leader-lease-duration",
            "30s",
            "--leader-renew-period",
            "500ms",
            "--routers",
            "/r.yaml",
            "--tls-san",
            "a.svc,b.svc",
            "--tls-san",
            "c",
        ])
        .unwrap();
        assert_eq!(a.store, StoreKind::Kubernetes);
        assert!(a.config().credential_secrets);
        assert_eq!(a.config().extra_sans, ["a.svc", "b.svc", "c"]);
        let l = a.leader_config();
        assert_eq!(l.namespace, "lab");
        assert_eq!(l.lease_duration, Duration::from_secs(30));
        assert_eq!(l.renew_period, Duration::from_millis(500));
        assert_eq!(a.routers, Some(PathBuf::from("/r.yaml")));
        for bad in [
            &["--store", "etcd"][..],
            &["--leader-lease-duration", "0s"][..],
            &["--leader-renew-period", "-1s"][..],
            &["--leader-renew-period", "soon"][..],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn inconsistent_flags_are_refused() {
        for args in [
            &["--tls-cert", "/c.pem"][..],
            &["--tls-key", "/k.pem"][..],
            &["--tls-ca", "/ca.pem"][..],
            &["--admin-config", "/a.yaml", "--no-admin-config"][..],
        ] {
            assert!(parse(args).is_err(), "{args:?} was accepted");
        }
    }

    #[test]
    fn a_settings_file_configures_the_embedded_store_as_the_config_map_does() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("controller.yaml");
        std::fs::write(
            &file,
            "deprecatedLabels:\n  keys:\n    old-board: use board\nhiddenLabels:\n  keys: [rack]\n\
             leasePolicy:\n  maxTags: 3\n",
        )
        .unwrap();
        let path = file.to_string_lossy().into_owned();
        let args = parse(&["--config", &path]).unwrap();
        let mut config = args.config();
        apply_settings_file(&file, &args, &mut config).unwrap();
        assert_eq!(config.label_policy.deprecated["old-board"], "use board");
        assert!(config.label_policy.hidden.contains("rack"));
        assert_eq!(config.max_tags, Some(3));
        // Strict, as the ConfigMap: an unknown key is refused, naming the file.
        std::fs::write(&file, "deprecatedLabel:\n  keys: {}\n").unwrap();
        let e = apply_settings_file(&file, &args, &mut args.config()).unwrap_err();
        assert!(e.contains(&path) && e.contains("deprecatedLabel"), "{e}");
        let e = apply_settings_file(&dir.path().join("nope.yaml"), &args, &mut args.config())
            .unwrap_err();
        assert!(e.contains("nope.yaml"), "{e}");
    }

    #[cfg(feature = "kubernetes")]
    #[tokio::test]
    async fn a_standby_binds_the_dashboard_port_as_the_leader_would() {
        let mut config = ControllerConfig::new("/nonexistent".into());
        // Off: nothing.
        config.ui_listen = None;
        assert!(bind_standby_ui(&mut config).await.unwrap().is_none());
        // Port 0: bound, and the server is to bind the same port once this replica leads.
        config.ui_listen = Some("127.0.0.1:0".into());
        let l = bind_standby_ui(&mut config).await.unwrap().unwrap();
        let bound = l.local_addr().unwrap();
        assert_ne!(bound.port(), 0);
        assert_eq!(config.ui_listen, Some(bound.to_string()));
        // Taken: the default address warns and goes on, one given explicitly fails.
        let taken = bound.to_string();
        config.ui_listen = Some(taken.clone());
        config.ui_listen_optional = true;
        assert!(bind_standby_ui(&mut config).await.unwrap().is_none());
        assert_eq!(config.ui_listen, Some(taken.clone()));
        config.ui_listen_optional = false;
        let e = bind_standby_ui(&mut config).await.unwrap_err();
        assert!(e.contains(&taken), "{e}");
        // Once the standby's listener is gone, the address is free for the server.
        drop(l);
        assert!(bind_standby_ui(&mut config).await.unwrap().is_some());
    }
}
