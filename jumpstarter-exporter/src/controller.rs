//! The exporter in controller mode: register with a controller, wait for leases and serve
//! each lease's client through the router.
//!
//! [`run`] is what `jmp run --exporter-config FILE` does without `--tls-grpc-listener`:
//!
//! 1. `Register{labels: {}, reports}` (the driver tree's reports), `ReportStatus(AVAILABLE)`;
//! 2. hold the `Status` stream; when it says `leased` with a lease name, start a fresh
//!    [`Session`], open `Listen{lease_name}`, report `LEASE_READY`, and serve the session
//!    on every `ListenResponse`'s router stream (handed to the session's server in memory,
//!    see [`jumpstarter_core::server::tunnel_conn`]; upstream's exporter connects each to a Unix socket);
//! 3. when the lease ends, end its tunnels and session and report `AVAILABLE` again;
//! 4. after any drop of the controller connection, reconnect with a capped, jittered backoff
//!    (a lease in progress keeps being served meanwhile);
//! 5. on shutdown, report `OFFLINE` and `Unregister` (within 10 s).
//!
//! With a direct listener ([`ExporterOptions::direct`]), each lease's session is also served
//! there, over mutual TLS with credentials only that lease's client gets ([`jumpstarter_core::client::direct`]).

use std::{collections::BTreeMap, future::Future, sync::Arc, time::Duration};
use tracing::Instrument as _;

use futures::StreamExt;
use jumpstarter_proto::v1::{
    DriverInstanceReport, ExporterStatus, ListenRequest, RegisterRequest, ReleaseLeaseRequest,
    ReportStatusRequest, StatusRequest, StatusResponse, UnregisterRequest,
    controller_service_client::ControllerServiceClient,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use jumpstarter_core::{
    DriverNode, Session,
    client::{
        ClientError,
        channel::{
            AuthChannel, CONTROLLER_KEEPALIVE, ControllerAuth, Keepalive, TlsSettings,
            connect_authenticated_with,
        },
        tunnel,
    },
    config::ExporterConfig,
    server::direct::{DirectError, DirectListenerSpec, DirectServer},
    server::{TunnelConn, serve_tunnels, tunnel_conn},
};

use crate::hooks::{
    HookKind, LeaseHooks,
    health::{self, HealthPolicy, HealthTracker},
    lifecycle::{LeaseHookRun, StatusSink, Verdict},
    process::Outcome,
};
use crate::transcript::TranscriptStore;

/// Why the exporter runtime stopped (it retries everything else).
#[derive(Debug, thiserror::Error)]
pub enum ExporterError {
    /// The config lacks what controller mode needs.
    #[error(
        "{path}: `{field}` is not set (controller mode needs the controller endpoint and the exporter token)"
    )]
    MissingField {
        /// The config file.
        path: String,
        /// The missing field.
        field: &'static str,
    },
    /// The config's TLS block is unusable.
    #[error("{path}: {message}")]
    Config {
        /// The config file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The controller refused this exporter's credentials or request for good.
    #[error("controller {endpoint} refused exporter {namespace}/{name}: {message} ({code:?})")]
    Refused {
        /// The controller endpoint.
        endpoint: String,
        /// The exporter namespace.
        namespace: String,
        /// The exporter name.
        name: String,
        /// The gRPC code.
        code: Code,
        /// The controller's message.
        message: String,
    },
    /// Another process of this exporter identity is online at the controller.
    #[error("{message} (controller {endpoint})")]
    AlreadyOnline {
        /// The controller endpoint.
        endpoint: String,
        /// The controller's message (where the other process connected from, and since).
        message: String,
    },
    /// The direct listener could not be set up.
    #[error(transparent)]
    Direct(#[from] DirectError),
    /// The driver tree could not be built (the exporter's name comes first when it has
    /// one).
    #[error("{}", if name.is_empty() { "the drivers cannot be built".to_owned() } else { format!("exporter {name}") })]
    Build {
        /// The exporter's name.
        name: String,
        /// Why.
        #[source]
        source: Box<crate::bridge::BuildError>,
    },
    /// The private socket lease hooks reach the drivers through could not be set up.
    #[error("lease hooks: their socket cannot be set up")]
    HookSocket(#[source] Box<crate::hooks::lifecycle::HookSocketError>),
    /// Serving the session failed (a listener could not be bound, or it failed).
    #[error(transparent)]
    Serve(Box<jumpstarter_core::CoreError>),
    /// A lease hook failed with `onFailure: exit`: the exporter shut down (exit code 1).
    #[error("exporter shut down: {0}")]
    HookExit(String),
    /// `failureDetection`: the controller connection failed too often, each time soon after
    /// it started (a service manager may restart the exporter).
    #[error(
        "controller {endpoint}: {failures} connection attempts in a row failed within {window}s \
         each (failureDetection: maxRapidFailures {max} x {per} attempts); giving up: {last}"
    )]
    RapidFailures {
        /// The controller endpoint.
        endpoint: String,
        /// The failed attempts.
        failures: u32,
        /// `rapidFailureWindow`.
        window: u32,
        /// `maxRapidFailures`.
        max: u32,
        /// Attempts per upstream exporter process.
        per: u32,
        /// The last failure.
        last: String,
    },
}

impl From<jumpstarter_core::CoreError> for ExporterError {
    fn from(e: jumpstarter_core::CoreError) -> Self {
        Self::Serve(Box::new(e))
    }
}

impl From<crate::hooks::lifecycle::HookSocketError> for ExporterError {
    fn from(e: crate::hooks::lifecycle::HookSocketError) -> Self {
        Self::HookSocket(Box::new(e))
    }
}

/// The config file's path as errors name it.
pub(crate) fn config_path(cfg: &ExporterConfig) -> String {
    cfg.path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "exporter config".into())
}

/// Where and as whom the exporter reaches its controller.
#[derive(Debug, Clone)]
pub struct ControllerTarget {
    /// Controller `host:port`.
    pub endpoint: String,
    /// TLS settings towards the controller and the routers.
    pub tls: TlsSettings,
    /// The exporter's credentials.
    pub auth: ControllerAuth,
}

impl ControllerTarget {
    /// From an exporter config (`endpoint`, `token`, `tls`, `metadata`); errors name the file
    /// and the missing field.
    pub fn from_config(cfg: &ExporterConfig) -> Result<Self, ExporterError> {
        let path = config_path(cfg);
        let missing = |field| ExporterError::MissingField {
            path: path.clone(),
            field,
        };
        let endpoint = cfg
            .endpoint
            .clone()
            .filter(|e| !e.is_empty())
            .ok_or_else(|| missing("endpoint"))?;
        let token = cfg
            .token
            .clone()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| missing("token"))?;
        let tls = TlsSettings::from_config(&cfg.tls, cfg.path.as_deref()).map_err(|e| {
            ExporterError::Config {
                path: path.clone(),
                message: jumpstarter_core::error_chain(&e),
            }
        })?;
        let namespace = cfg.metadata.namespace.as_deref().unwrap_or("default");
        Ok(Self {
            endpoint,
            tls,
            auth: ControllerAuth::exporter(namespace, &cfg.metadata.name, &token),
        })
    }
}

/// Optional features of the exporter runtime.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExporterOptions {
    /// Also serve each lease on this direct listener (clients on the exporter's network
    /// then bypass the router).
    pub direct: Option<DirectListenerSpec>,
    /// The config's lease hooks (see [`crate::hooks`]).
    pub hooks: Option<Arc<LeaseHooks>>,
    /// The controller channel's keepalive from `grpcOptions` (default: upstream's).
    pub keepalive: Option<Keepalive>,
    /// The router channels' keepalive from `grpcOptions` (default
    /// [`tunnel::ROUTER_KEEPALIVE`]): upstream's exporter applies `grpcOptions` to both.
    pub router_keepalive: Option<Keepalive>,
    /// `failureDetection`: (`maxRapidFailures`, `rapidFailureWindow` seconds); `None`:
    /// retry forever.
    pub failure_detection: Option<(u32, u32)>,
    /// `healthCheck` (ours): health checks between leases and quarantine (see
    /// [`crate::hooks::health`]).
    pub health: Option<HealthPolicy>,
    /// `exitOnLeaseEnd`: stop (and [`run_with_options`] return `Ok`) once the first lease
    /// has ended and its afterLease hook is done, instead of waiting for the next lease.
    /// The exporter is not reported available in between, so it gets no second lease.
    pub exit_on_lease_end: bool,
    /// `motd`: the message of the day each lease's session starts with (a beforeLease hook
    /// may add to it).
    pub motd: Option<String>,
    /// `consoleTranscripts` (ours): keep each lease's console transcripts (see
    /// [`crate::transcript`]).
    pub transcripts: Option<jumpstarter_core::config::ConsoleTranscripts>,
    /// Count each lease's driver calls and sessions here (`jmp run --metrics-listen`).
    pub metrics: Option<Arc<crate::metrics::ExporterMetrics>>,
}

impl ExporterOptions {
    /// Runs lease hooks and health checks with `PATH` set to `path` (see
    /// [`crate::Exporter::with_hook_path`]).
    pub fn set_hook_path(&mut self, path: &std::ffi::OsStr) {
        if let Some(hooks) = self.hooks.as_mut() {
            Arc::make_mut(hooks).set_path(path);
        }
        if let Some(check) = self.health.as_mut().and_then(|h| h.check.as_mut()) {
            check.path = Some(path.to_owned());
        }
    }

    /// From a config's `directListener` / `directAdvertise`.
    pub fn from_config(cfg: &ExporterConfig) -> Result<Self, ExporterError> {
        let config_error = |message: String| ExporterError::Config {
            path: config_path(cfg),
            message,
        };
        let hooks = LeaseHooks::from_config(&cfg.hooks)
            .map_err(|e| config_error(jumpstarter_core::error_chain(&e)))?
            .map(Arc::new);
        let health = cfg
            .health_check
            .as_ref()
            .map(HealthPolicy::from_config)
            .transpose()
            .map_err(|e| config_error(jumpstarter_core::error_chain(&e)))?;
        let keepalive = jumpstarter_core::client::grpc_options::keepalive(
            &cfg.grpc_options,
            CONTROLLER_KEEPALIVE,
        )
        .map_err(|e| config_error(jumpstarter_core::error_chain(&e)))?;
        let router_keepalive = jumpstarter_core::client::grpc_options::keepalive(
            &cfg.grpc_options,
            tunnel::ROUTER_KEEPALIVE,
        )
        .map_err(|e| config_error(jumpstarter_core::error_chain(&e)))?;
        let direct = match cfg.direct_listener.as_deref() {
            Some(spec) => Some(
                DirectListenerSpec::parse(spec, cfg.direct_advertise.as_deref()).map_err(|e| {
                    config_error(format!(
                        "directListener: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    ))
                })?,
            ),
            None => None,
        };
        Ok(Self {
            direct,
            hooks,
            health,
            keepalive: Some(keepalive),
            router_keepalive: Some(router_keepalive),
            failure_detection: Some((
                cfg.failure_detection.max_rapid_failures,
                cfg.failure_detection.rapid_failure_window,
            )),
            exit_on_lease_end: cfg.exit_on_lease_end,
            motd: cfg.motd.clone(),
            transcripts: cfg.console_transcripts.clone(),
            metrics: None,
        })
    }
}

/// Exponential backoff with a cap and jitter (each delay is 50–100% of the nominal one).
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `base`, doubles up to `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            next: base,
        }
    }

    /// The next delay (jittered); the nominal delay doubles.
    pub fn next_delay(&mut self) -> Duration {
        let nominal = self.next;
        self.next = (self.next * 2).min(self.cap);
        // Jitter from fresh random bits (uuid v4 is backed by the OS RNG).
        let r = (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 1000.0;
        nominal.mul_f64(0.5 + r / 2.0)
    }

    /// Back to the base delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.base;
    }
}

/// Controller connection attempts an upstream exporter process makes before it exits (and
/// `jmp run` counts a failure of `failureDetection`).
const UPSTREAM_ATTEMPTS: u32 = 6;

/// How long a departing exporter may spend saying goodbye.
const GOODBYE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a lease's session may take to stop once its tunnels are cut.
const SESSION_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the exporter (its driver tree already built as `tree`) in controller mode until
/// `shutdown` resolves; then ends any lease session, reports `OFFLINE` and unregisters.
/// Returns an error only for what retrying cannot fix (bad config, refused credentials).
pub async fn run_with_options(
    target: ControllerTarget,
    tree: DriverNode,
    options: ExporterOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ExporterError> {
    let direct = match &options.direct {
        Some(spec) => {
            let server = DirectServer::bind(spec).await?;
            tracing::info!(
                "direct listener on {} (advertised as {})",
                server.local_addr(),
                server.advertised_endpoint()
            );
            Some(server)
        }
        None => None,
    };
    let (exit_tx, mut exit_rx) = tokio::sync::watch::channel(None::<String>);
    let mut rt = Runtime {
        keepalive: options.keepalive.unwrap_or(CONTROLLER_KEEPALIVE),
        router_keepalive: options.router_keepalive.unwrap_or(tunnel::ROUTER_KEEPALIVE),
        hooks: options.hooks.clone(),
        health: options
            .health
            .as_ref()
            .map(|h| Arc::new(HealthTracker::new(h.threshold))),
        health_check: options
            .health
            .as_ref()
            .and_then(|h| h.check.clone().map(|c| (c, h.interval))),
        next_check: tokio::time::Instant::now(),
        exit: exit_tx,
        direct,
        reports: Session::new(tree.clone(), BTreeMap::new()).report().reports,
        target,
        tree,
        lease: None,
        backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
        channel: None,
        exit_on_lease_end: options.exit_on_lease_end,
        served_its_lease: false,
        motd: options.motd.clone().unwrap_or_default(),
        transcripts: options.transcripts.clone().map(|cfg| {
            let store = TranscriptStore::new(cfg);
            for removed in store.prune(std::time::SystemTime::now()) {
                tracing::info!(
                    "console transcripts {} removed (retention)",
                    removed.display()
                );
            }
            store
        }),
        metrics: options.metrics.clone(),
        telemetry: None,
    };
    tokio::pin!(shutdown);
    let mut rapid = 0u32;
    // Since when another process of this exporter is online, refusing this one.
    let mut duplicate: Option<tokio::time::Instant> = None;
    let outcome = loop {
        let attempt = tokio::time::Instant::now();
        let r = tokio::select! {
            _ = &mut shutdown => break Ok(()),
            why = exit_rx.wait_for(Option::is_some) => {
                let why = why.map(|w| w.clone().unwrap_or_default()).unwrap_or_default();
                break Err(ExporterError::HookExit(why))
            }
            r = rt.connected_once() => r,
        };
        if rt.served_its_lease {
            // `exitOnLeaseEnd`: the lease is over and its afterLease hook done (a hook that
            // failed with `onFailure: exit` still makes this an error).
            match exit_rx.borrow().clone() {
                Some(why) => break Err(ExporterError::HookExit(why)),
                None => {
                    tracing::info!("the lease has ended: exiting (exitOnLeaseEnd)");
                    break Ok(());
                }
            }
        }
        if !matches!(r, Err(Failure::Duplicate(_))) {
            duplicate = None;
        }
        let e = match r {
            Ok(()) => "the controller ended the status stream".to_string(),
            Err(Failure::Fatal(e)) => break Err(e),
            Err(Failure::Duplicate(e)) => {
                let since = *duplicate.get_or_insert_with(|| {
                    tracing::error!(
                        "{e}. This process keeps trying for {} s (in case that is a \
                         connection of an earlier run whose host went down), then stops.",
                        DUPLICATE_GRACE.as_secs()
                    );
                    tokio::time::Instant::now()
                });
                if since.elapsed() >= DUPLICATE_GRACE {
                    break Err(e);
                }
                jumpstarter_core::error_chain(&e)
            }
            Err(Failure::Retry(e)) => e,
        };
        // failureDetection, as upstream's `jmp run` applies it: its exporter process makes
        // 1 + 5 attempts before it exits and is restarted, and `maxRapidFailures` restarts in a
        // row, each within `rapidFailureWindow` seconds, end `jmp run` (exit code 1).
        if let Some((max, window)) = options.failure_detection {
            if attempt.elapsed() < Duration::from_secs(u64::from(window)) {
                rapid += 1;
            } else {
                rapid = 0;
            }
            if max > 0 && rapid >= max.saturating_mul(UPSTREAM_ATTEMPTS) {
                break Err(ExporterError::RapidFailures {
                    endpoint: rt.target.endpoint.clone(),
                    failures: rapid,
                    window,
                    max,
                    per: UPSTREAM_ATTEMPTS,
                    last: e,
                });
            }
        }
        let delay = rt.backoff.next_delay();
        tracing::warn!(
            "controller {}: {e}; reconnecting in {:.1}s",
            rt.target.endpoint,
            delay.as_secs_f64()
        );
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            _ = tokio::time::sleep(delay) => {}
        }
    };
    // A lease whose hook said `exit` has been released already; the afterLease hook of a
    // lease in progress still runs (as upstream, even at shutdown).
    rt.end_lease(LeaseEnd::Shutdown).await;
    // An exporter refused because another process of its identity is online says no
    // goodbye: the controller would refuse it anyway, as it is that one's to say.
    if let Some(channel) = rt.channel.clone().filter(|_| duplicate.is_none()) {
        let bye = async {
            report_status(&channel, ExporterStatus::Offline, "Exporter shutting down").await;
            let r = ControllerServiceClient::new(channel)
                .unregister(UnregisterRequest {
                    reason: "Exporter shutdown".into(),
                })
                .await;
            if let Err(s) = r {
                tracing::warn!("unregister failed: {}", s.message());
            }
        };
        if tokio::time::timeout(GOODBYE_TIMEOUT, bye).await.is_err() {
            tracing::warn!("the controller did not answer the unregistration in time");
        }
    }
    tracing::info!("exporter stopped");
    outcome
}

enum Failure {
    Retry(String),
    Fatal(ExporterError),
    /// Another process of this exporter identity is online (`ALREADY_EXISTS`).
    Duplicate(ExporterError),
}

/// How long an exporter refused because another process of its identity is online keeps
/// trying before it stops: long enough for the controller to notice (by its keepalive) that
/// a connection of an earlier run of this exporter is gone, when its host went down without
/// closing it.
const DUPLICATE_GRACE: Duration = Duration::from_secs(75);

struct ActiveLease {
    name: String,
    session: Arc<Session>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
    hooks: Option<Arc<LeaseHookRun>>,
    /// Counts the lease's session as active until the lease ends.
    _metrics: Option<crate::metrics::LeaseMetrics>,
}

struct Runtime {
    keepalive: Keepalive,
    router_keepalive: Keepalive,
    hooks: Option<Arc<LeaseHooks>>,
    /// Failures in a row, with `healthCheck`.
    health: Option<Arc<HealthTracker>>,
    /// The health-check script and its interval.
    health_check: Option<(crate::hooks::HookSpec, Duration)>,
    /// When the next health check is due (while no lease is active).
    next_check: tokio::time::Instant,
    /// Set (with the reason) when a hook failed with `onFailure: exit`.
    exit: tokio::sync::watch::Sender<Option<String>>,
    direct: Option<DirectServer>,
    target: ControllerTarget,
    tree: DriverNode,
    reports: Vec<DriverInstanceReport>,
    lease: Option<ActiveLease>,
    backoff: Backoff,
    channel: Option<AuthChannel>,
    /// `exitOnLeaseEnd`.
    exit_on_lease_end: bool,
    /// With `exitOnLeaseEnd`: a lease has been served and has ended; the exporter stops.
    served_its_lease: bool,
    /// `motd`.
    motd: String,
    /// `consoleTranscripts`.
    transcripts: Option<TranscriptStore>,
    /// `jmp run --metrics-listen`.
    metrics: Option<Arc<crate::metrics::ExporterMetrics>>,
    /// Where the leases' and health checks' entries are pushed (the telemetry sink the
    /// controller names; started at the first registration, kept between leases).
    telemetry: Option<crate::telemetry::TelemetrySink>,
}

/// Why a lease's session ends on the exporter's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseEnd {
    /// The controller ended it; the exporter is available for the next lease.
    Ended,
    /// The controller ended it and the exporter stops after it (`exitOnLeaseEnd`): it is
    /// not reported available, so that it gets no other lease meanwhile.
    EndedLast,
    /// The exporter is shutting down: it releases the lease itself.
    Shutdown,
}

impl Runtime {
    fn refused(&self, status: &Status) -> Failure {
        let fatal = matches!(
            status.code(),
            Code::Unauthenticated | Code::PermissionDenied | Code::InvalidArgument | Code::NotFound
        ) || status.message().contains("token is expired");
        let refused = || ExporterError::Refused {
            endpoint: self.target.endpoint.clone(),
            namespace: self.target.auth.namespace.clone(),
            name: self.target.auth.name.clone(),
            code: status.code(),
            message: status.message().to_string(),
        };
        if status.code() == Code::AlreadyExists {
            Failure::Duplicate(ExporterError::AlreadyOnline {
                endpoint: self.target.endpoint.clone(),
                message: status.message().to_string(),
            })
        } else if fatal {
            Failure::Fatal(refused())
        } else {
            Failure::Retry(format!("{} ({:?})", status.message(), status.code()))
        }
    }

    /// One controller connection: register, report, follow the status stream until it drops.
    async fn connected_once(&mut self) -> Result<(), Failure> {
        let channel = match &self.channel {
            Some(c) => c.clone(),
            None => {
                let c = connect_authenticated_with(
                    &self.target.endpoint,
                    &self.target.tls,
                    &self.target.auth,
                    self.keepalive,
                )
                .await
                .map_err(|e: ClientError| Failure::Retry(jumpstarter_core::error_chain(&e)))?;
                // tonic channels reconnect by themselves: keep this one for good.
                self.channel = Some(c.clone());
                c
            }
        };
        let mut ctl = ControllerServiceClient::new(channel.clone());
        ctl.register(RegisterRequest {
            labels: Default::default(),
            reports: self.reports.clone(),
        })
        .await
        .map_err(|s| self.refused(&s))?;
        let mut status = ctl
            .status(StatusRequest {})
            .await
            .map_err(|s| self.refused(&s))?
            .into_inner();
        tracing::info!(
            "registered with controller {} as {}/{}",
            self.target.endpoint,
            self.target.auth.namespace,
            self.target.auth.name
        );
        self.backoff.reset();
        if self.telemetry.is_none() {
            self.start_telemetry(&channel).await;
        }
        match &self.lease {
            None => {
                report_status(
                    &channel,
                    ExporterStatus::Available,
                    "Exporter registered and available",
                )
                .await
            }
            Some(_) => {
                report_status(&channel, ExporterStatus::LeaseReady, "Ready for commands").await
            }
        }
        // A health check runs only between leases; a lease that starts stops it (its
        // process group is killed) and it does not count.
        let mut check: Option<futures::future::BoxFuture<'static, (Outcome, Duration)>> = None;
        loop {
            let due = match &self.health_check {
                Some(_) if self.lease.is_none() && check.is_none() => Some(self.next_check),
                _ => None,
            };
            tokio::select! {
                msg = status.next() => match msg {
                    Some(Ok(msg)) => {
                        self.on_status(msg, &channel).await;
                        if self.served_its_lease {
                            return Ok(());
                        }
                        if self.lease.is_some() && check.take().is_some() {
                            tracing::info!("health check stopped: a lease started");
                        }
                    }
                    Some(Err(s)) => return Err(self.refused(&s)),
                    None => return Ok(()),
                },
                (outcome, took) = async {
                    match check.as_mut() {
                        Some(running) => running.await,
                        None => std::future::pending().await,
                    }
                }, if check.is_some() => {
                    check = None;
                    self.health_checked(&outcome, took, &channel).await;
                }
                _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)),
                    if due.is_some() => {
                    if let Some((spec, _)) = &self.health_check {
                        let (spec, tree) = (spec.clone(), self.tree.clone());
                        tracing::info!("running health check");
                        check = Some(Box::pin(async move {
                            let start = tokio::time::Instant::now();
                            let outcome = health::run_check(&spec, tree).await;
                            (outcome, start.elapsed())
                        }));
                    }
                }
            }
        }
    }

    /// Asks the controller for its telemetry sink and, when it names one, starts pushing the
    /// leases' entries there (see [`crate::telemetry`]).
    async fn start_telemetry(&mut self, channel: &AuthChannel) {
        let Some(endpoint) = crate::telemetry::discover(channel).await else {
            return;
        };
        // The controller naming itself: the same connection. Another endpoint: the same
        // credentials and TLS settings (with its CA when it sends one).
        let sink_channel = if endpoint.endpoint == self.target.endpoint {
            channel.clone()
        } else {
            let mut tls = self.target.tls.clone();
            if !endpoint.certificate.is_empty() {
                tls.ca_pem = Some(endpoint.certificate.clone());
            }
            match connect_authenticated_with(
                &endpoint.endpoint,
                &tls,
                &self.target.auth,
                self.keepalive,
            )
            .await
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(
                        "telemetry endpoint {}: {}; not pushing logs",
                        endpoint.endpoint,
                        jumpstarter_core::error_chain(&e)
                    );
                    return;
                }
            }
        };
        tracing::info!("pushing the leases' logs to {}", endpoint.endpoint);
        let (sink, _task) = crate::telemetry::TelemetrySink::start(
            jumpstarter_proto::v1::telemetry_service_client::TelemetryServiceClient::new(
                sink_channel,
            ),
        );
        self.telemetry = Some(sink);
    }

    /// A health check ended after `took`: count it, push its entry (with log gathering),
    /// schedule the next one, and tell the controller when the exporter became unhealthy.
    async fn health_checked(&mut self, outcome: &Outcome, took: Duration, channel: &AuthChannel) {
        if let Some((_, interval)) = &self.health_check {
            self.next_check = tokio::time::Instant::now() + *interval;
        }
        match &outcome.result {
            Ok(()) => tracing::info!("health check passed"),
            Err(e) => tracing::warn!("health check failed: {e}"),
        }
        let Some(tracker) = &self.health else {
            return;
        };
        let exporter = (
            self.target.auth.name.as_str(),
            self.target.auth.namespace.as_str(),
        );
        if let Some(message) =
            health::checked(tracker, self.telemetry.as_ref(), exporter, outcome, took)
        {
            tracing::error!("exporter unhealthy: {message}");
            report_status(channel, ExporterStatus::Available, &message).await;
        }
    }

    async fn on_status(&mut self, msg: StatusResponse, channel: &AuthChannel) {
        let wanted = msg.lease_name.filter(|n| msg.leased && !n.is_empty());
        let current = self.lease.as_ref().map(|l| l.name.clone());
        if wanted == current {
            return;
        }
        if current.is_some() {
            if self.exit_on_lease_end {
                self.end_lease(LeaseEnd::EndedLast).await;
                self.served_its_lease = true;
                return;
            }
            self.end_lease(LeaseEnd::Ended).await;
        }
        if let Some(name) = wanted {
            let context: BTreeMap<String, String> = msg.context.into_iter().collect();
            self.start_lease(name, msg.client_name.unwrap_or_default(), &context, channel);
        }
    }

    fn start_lease(
        &mut self,
        name: String,
        client: String,
        context: &BTreeMap<String, String>,
        channel: &AuthChannel,
    ) {
        // Every line of this lease (its driver calls, hooks and tunnels) carries these, and
        // with JSON logs each entry of the lease's context as a field of its own.
        let span = tracing::info_span!(
            "lease",
            lease_id = %name,
            client = %client,
            exporter = %self.target.auth.name,
            namespace = %self.target.auth.namespace,
            { jumpstarter_core::logging::LEASE_CONTEXT_FIELD } = tracing::field::Empty,
        );
        if !context.is_empty() {
            span.record(
                jumpstarter_core::logging::LEASE_CONTEXT_FIELD,
                jumpstarter_core::logging::context_field(context).as_str(),
            );
        }
        let _in_lease = span.enter();
        tracing::info!("lease {name} started (client {client})");
        let cancel = CancellationToken::new();
        let session = Session::new(self.tree.clone(), BTreeMap::new());
        // With traces on, the lease's `lease.serve` span (in this one) holds its driver calls.
        let traced =
            jumpstarter_core::telemetry::lease_serve(&jumpstarter_core::telemetry::LeaseRef {
                namespace: &self.target.auth.namespace,
                name: &name,
                client: &client,
                exporter: &self.target.auth.name,
            });
        session.set_log_span(if traced.is_none() {
            span.clone()
        } else {
            traced
        });
        let lease_metrics = self.metrics.as_ref().map(|m| {
            let l = m.lease(&client, &name, context);
            session.set_call_observer(l.observer());
            session.set_stream_observer(l.stream_observer());
            l
        });
        // The lease's driver calls, driver log lines and console transcripts go to the
        // telemetry sink too.
        let pushed = self.telemetry.as_ref().map(|sink| {
            Arc::new(crate::telemetry::LeaseTelemetry::new(
                sink.clone(),
                &name,
                &client,
                &self.target.auth.name,
                &self.target.auth.namespace,
                context,
            ))
        });
        if let Some(pushed) = pushed.clone() {
            session.set_log_observer(pushed.clone());
            let mut calls: Vec<Arc<dyn jumpstarter_core::metrics::CallObserver>> = vec![pushed];
            calls.extend(lease_metrics.as_ref().map(|l| l.observer()));
            session.set_call_observer(Arc::new(crate::telemetry::CallObservers(calls)));
        }
        session.set_motd(&self.motd);
        if let Some(store) = &self.transcripts {
            match store.for_lease(&name, &client, &self.tree, pushed) {
                Ok(t) => session.set_transcripts(t),
                Err(e) => tracing::warn!(
                    "lease {name}: no console transcripts: {}",
                    jumpstarter_core::error_chain(&e)
                ),
            }
        }
        let hooks = self.hooks.clone().and_then(|hooks| {
            LeaseHookRun::start(
                hooks,
                self.tree.clone(),
                Arc::clone(&session),
                &name,
                &client,
            )
            .inspect_err(|e| {
                // With its causes: the reason (e.g. a socket path too long) is in them.
                let mut why = jumpstarter_core::error_chain(&e);
                let mut cause = std::error::Error::source(e);
                while let Some(c) = cause {
                    why.push_str(&format!(": {c}"));
                    cause = c.source();
                }
                tracing::error!("lease {name}: hooks cannot run: {why}")
            })
            .ok()
        });
        if let Some(run) = &hooks
            && run.has_before()
        {
            // Until the beforeLease hook is over, clients may connect but not call drivers.
            session.block_driver_calls(true);
        }
        if let Some(direct) = &self.direct {
            // The direct server stops by itself when `cancel` fires.
            if let Err(e) = direct.serve_lease(&name, &session, cancel.clone()) {
                tracing::warn!(
                    "lease {name}: no direct path: {e}",
                    e = jumpstarter_core::error_chain(&e)
                );
            }
        }
        let task = tokio::spawn(serve_lease(LeaseContext {
            name: name.clone(),
            session: Arc::clone(&session),
            channel: channel.clone(),
            tls: self.target.tls.clone(),
            router_keepalive: self.router_keepalive,
            cancel: cancel.clone(),
            hooks: hooks.clone(),
            health: self.health.clone(),
            exit: self.exit.clone(),
        }));
        self.lease = Some(ActiveLease {
            name,
            session,
            cancel,
            task,
            hooks,
            _metrics: lease_metrics,
        });
    }

    /// Ends the current lease's tunnels and session; reports `AVAILABLE` after
    /// [`LeaseEnd::Ended`].
    async fn end_lease(&mut self, how: LeaseEnd) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        // From now on the lease's clients call nothing (their open streams are cut), also
        // while the afterLease hook runs: its own `j` is served by a session of its own.
        lease.session.revoke(format!(
            "lease {} has ended: the exporter refuses its driver calls",
            lease.name
        ));
        if let (Some(run), Some(channel)) = (&lease.hooks, &self.channel) {
            // The afterLease hook runs while the session is still served (once: it may
            // have run already after `EndSession`).
            run.mark_lease_ended();
            let sink = ControllerSink {
                channel: channel.clone(),
                health: self.health.clone(),
            };
            let verdict = run.after_lease(&sink).await;
            if how == LeaseEnd::Shutdown {
                // Shutting down: nobody else will release the lease.
                release_lease(channel, &lease.name, lease.session.status().status).await;
            }
            if verdict == Verdict::Exit || run.exiting() {
                request_exit(&self.exit, "a lease hook failed with onFailure: exit");
            }
        }
        lease.cancel.cancel();
        let mut task = lease.task;
        if tokio::time::timeout(SESSION_STOP_TIMEOUT, &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
        lease.session.close().await;
        // Ends the lease's `lease.serve` span (with traces on).
        lease.session.set_log_span(tracing::Span::none());
        tracing::info!(
            lease_id = %lease.name,
            exporter = %self.target.auth.name,
            namespace = %self.target.auth.namespace,
            "lease {} ended",
            lease.name
        );
        if let Some((_, interval)) = &self.health_check {
            self.next_check = tokio::time::Instant::now() + *interval;
        }
        let exiting = self.exit.borrow().is_some();
        if how == LeaseEnd::Ended
            && !exiting
            && let Some(channel) = &self.channel
        {
            report_status(
                channel,
                ExporterStatus::Available,
                "Available for new lease",
            )
            .await;
        }
    }
}

struct LeaseContext {
    name: String,
    session: Arc<Session>,
    channel: AuthChannel,
    tls: TlsSettings,
    /// `grpcOptions` applied to the router channels.
    router_keepalive: Keepalive,
    cancel: CancellationToken,
    hooks: Option<Arc<LeaseHookRun>>,
    health: Option<Arc<HealthTracker>>,
    exit: tokio::sync::watch::Sender<Option<String>>,
}

/// Statuses of a lease's hooks, to the controller; hook failures counted for health.
struct ControllerSink {
    channel: AuthChannel,
    health: Option<Arc<HealthTracker>>,
}

impl StatusSink for ControllerSink {
    fn report<'a>(
        &'a self,
        status: ExporterStatus,
        message: &'a str,
    ) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(report_status(&self.channel, status, message))
    }

    fn hook_outcome<'a>(
        &'a self,
        kind: HookKind,
        outcome: &'a Outcome,
    ) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(async move {
            let Some(tracker) = &self.health else {
                return;
            };
            if let Some(message) = tracker.record(kind.key(), outcome) {
                tracing::error!("exporter unhealthy: {message}");
                report_status(&self.channel, kind.running(), &message).await;
            }
        })
    }
}

fn request_exit(exit: &tokio::sync::watch::Sender<Option<String>>, why: &str) {
    exit.send_if_modified(|e| {
        if e.is_none() {
            *e = Some(why.to_string());
            true
        } else {
            false
        }
    });
}

/// What a hook's verdict does to the lease once its status is out: `endLease` and `exit`
/// release it (after 1 s, so that the client sees the failure, as upstream), `exit` then
/// shuts the exporter down.
async fn after_verdict(
    verdict: Verdict,
    run: &LeaseHookRun,
    name: &str,
    session: &Session,
    channel: &AuthChannel,
    exit: &tokio::sync::watch::Sender<Option<String>>,
    always_release: bool,
) {
    if verdict == Verdict::Proceed && !always_release {
        return;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    release_lease(channel, name, session.status().status).await;
    if verdict == Verdict::Exit || run.exiting() {
        request_exit(exit, "a lease hook failed with onFailure: exit");
    }
}

/// Asks the controller to end lease `name` (`ReleaseLease`; controllers that refuse it to
/// exporters get upstream's older `ReportStatus(release_lease=true)`).
async fn release_lease(channel: &AuthChannel, name: &str, status: ExporterStatus) {
    let mut ctl = ControllerServiceClient::new(channel.clone());
    let r = ctl
        .release_lease(ReleaseLeaseRequest { name: name.into() })
        .await;
    match r {
        Ok(_) => tracing::info!("Released lease {name}"),
        Err(s)
            if matches!(
                s.code(),
                Code::Unimplemented | Code::PermissionDenied | Code::Unauthenticated
            ) =>
        {
            let status = if status == ExporterStatus::Available {
                ExporterStatus::AfterLeaseHook
            } else {
                status
            };
            let r = ctl
                .report_status(ReportStatusRequest {
                    status: status as i32,
                    message: Some(
                        "Lease released (compat: ReportStatus with release_lease)".into(),
                    ),
                    release_lease: Some(true),
                })
                .await;
            if let Err(s) = r {
                tracing::warn!("lease {name}: release failed: {}", s.message());
            }
        }
        Err(s) => tracing::warn!("lease {name}: release failed: {}", s.message()),
    }
}

/// How long the exporter waits for the controller's answer to `Listen` before it reports
/// itself ready anyway (see [`serve_lease`]): our controller answers at once.
const LISTEN_HEADERS_GRACE: Duration = Duration::from_millis(300);

/// The lease's session is listening: runs the beforeLease hook (which reports the statuses
/// around it, clients may dial in meanwhile), or without one reports `LEASE_READY`.
async fn lease_ready(
    name: &str,
    session: &Arc<Session>,
    channel: &AuthChannel,
    hooks: Option<&Arc<LeaseHookRun>>,
    health: Option<&Arc<HealthTracker>>,
    exit: &tokio::sync::watch::Sender<Option<String>>,
) {
    match hooks {
        Some(run) => spawn_hook(run, HookPhase::Before, name, session, channel, health, exit),
        None => {
            session.set_status(
                ExporterStatus::LeaseReady,
                Some("Ready for commands".into()),
            );
            report_status(channel, ExporterStatus::LeaseReady, "Ready for commands").await;
        }
    }
}

/// Serves one lease: its session, the `Listen` stream (reopened when it drops) and a
/// tunnel per `ListenResponse`; everything ends when `cancel` fires.
async fn serve_lease(cx: LeaseContext) {
    let LeaseContext {
        name,
        session,
        channel,
        tls,
        router_keepalive,
        cancel,
        hooks,
        health,
        exit,
    } = cx;
    let (tunnels, tunnels_rx) = tokio::sync::mpsc::channel(4);
    let server = tokio::spawn(
        serve_tunnels(
            session.clone(),
            tokio_stream::wrappers::ReceiverStream::new(tunnels_rx),
            cancel.clone().cancelled_owned(),
        )
        .in_current_span(),
    );
    let mut ctl = ControllerServiceClient::new(channel.clone());
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    let mut ready = false;
    let mut end_session = session.on_end_session();
    'listen: while !cancel.is_cancelled() {
        let listen = ctl.listen(ListenRequest {
            lease_name: name.clone(),
        });
        tokio::pin!(listen);
        let answer = tokio::select! {
            _ = cancel.cancelled() => break,
            r = &mut listen => r,
            // Upstream's Go controller sends Listen's response headers only with its first
            // message, which comes after a client dials, which it lets a client do only once
            // the exporter is ready: waiting for the headers would wait forever. The request
            // is on its way by now; become ready and go on waiting.
            _ = tokio::time::sleep(LISTEN_HEADERS_GRACE), if !ready => {
                ready = true;
                lease_ready(&name, &session, &channel, hooks.as_ref(), health.as_ref(), &exit).await;
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    r = &mut listen => r,
                }
            }
        };
        match answer {
            Ok(stream) => {
                backoff.reset();
                let mut stream = stream.into_inner();
                if !ready {
                    ready = true;
                    lease_ready(
                        &name,
                        &session,
                        &channel,
                        hooks.as_ref(),
                        health.as_ref(),
                        &exit,
                    )
                    .await;
                }
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => break 'listen,
                        _ = &mut end_session => {
                            end_session = session.on_end_session();
                            on_end_session(&name, &session, &channel, hooks.as_ref(), health.as_ref(), &exit).await;
                        }
                        msg = stream.next() => match msg {
                            Some(Ok(resp)) => {
                                let tunnels = tunnels.clone();
                                let tls = tls.clone();
                                let cancel = cancel.clone();
                                let name = name.clone();
                                tokio::spawn(async move {
                                    if let Err(e) = connect_tunnel(&tunnels, &resp.router_endpoint, &resp.router_token, &tls, router_keepalive, cancel).await {
                                        tracing::warn!("lease {name}: tunnel failed: {e}", e = jumpstarter_core::error_chain(&e));
                                    }
                                }.in_current_span());
                            }
                            Some(Err(s)) => {
                                tracing::warn!("lease {name}: listen stream broke: {}", s.message());
                                break;
                            }
                            None => {
                                tracing::debug!("lease {name}: listen stream ended");
                                break;
                            }
                        }
                    }
                }
            }
            Err(s) => tracing::warn!("lease {name}: listen failed: {}", s.message()),
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
    session.set_status(ExporterStatus::Available, None);
    match tokio::time::timeout(SESSION_STOP_TIMEOUT, server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::warn!(
            "lease {name}: session server: {e}",
            e = jumpstarter_core::error_chain(&e)
        ),
        Ok(Err(e)) => tracing::warn!(
            "lease {name}: session server task: {e}",
            e = jumpstarter_core::error_chain(&e)
        ),
        Err(_) => tracing::warn!("lease {name}: session server did not stop in time"),
    }
}

/// A client called `EndSession`. With hooks, the afterLease hook runs now (the session is
/// still served), then the exporter releases the lease itself, as upstream; without, the
/// exporter is free again at once.
async fn on_end_session(
    name: &str,
    session: &Arc<Session>,
    channel: &AuthChannel,
    hooks: Option<&Arc<LeaseHookRun>>,
    health: Option<&Arc<HealthTracker>>,
    exit: &tokio::sync::watch::Sender<Option<String>>,
) {
    tracing::info!("lease {name}: the client ended the session");
    // The session is over for its clients, though the lease lasts until the afterLease
    // hook is done: their driver calls are refused from now on.
    session.revoke(format!(
        "the session of lease {name} was ended (EndSession): the exporter refuses its driver calls"
    ));
    let Some(run) = hooks else {
        session.set_status(
            ExporterStatus::Available,
            Some("Available for new lease".into()),
        );
        report_status(
            channel,
            ExporterStatus::Available,
            "Available for new lease",
        )
        .await;
        return;
    };
    spawn_hook(run, HookPhase::After, name, session, channel, health, exit);
}

/// Which lease hook [`spawn_hook`] runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HookPhase {
    Before,
    After,
}

/// Runs the beforeLease or afterLease hook of `run` in a task of the lease's span (it reports
/// the statuses around it), then acts on its verdict.
fn spawn_hook(
    run: &Arc<LeaseHookRun>,
    phase: HookPhase,
    name: &str,
    session: &Arc<Session>,
    channel: &AuthChannel,
    health: Option<&Arc<HealthTracker>>,
    exit: &tokio::sync::watch::Sender<Option<String>>,
) {
    let run = Arc::clone(run);
    let (name, session, channel, exit, health) = (
        name.to_string(),
        Arc::clone(session),
        channel.clone(),
        exit.clone(),
        health.cloned(),
    );
    tokio::spawn(
        async move {
            let sink = ControllerSink {
                channel: channel.clone(),
                health,
            };
            let after = phase == HookPhase::After;
            let verdict = if after {
                run.after_lease(&sink).await
            } else {
                run.before_lease(&sink).await
            };
            after_verdict(verdict, &run, &name, &session, &channel, &exit, after).await;
        }
        .in_current_span(),
    );
}

/// Opens the tunnel a `ListenResponse` names and hands it to the session server.
async fn connect_tunnel(
    tunnels: &tokio::sync::mpsc::Sender<TunnelConn>,
    endpoint: &str,
    token: &str,
    tls: &TlsSettings,
    keepalive: Keepalive,
    cancel: CancellationToken,
) -> Result<(), tunnel::TunnelError> {
    let (conn, sink, source) = tunnel_conn();
    tunnel::attach_frames_with(
        endpoint,
        tls,
        token,
        keepalive,
        sink,
        source,
        cancel.cancelled_owned(),
    )
    .await?;
    if tunnels.send(conn).await.is_err() {
        tracing::debug!("tunnel from {endpoint} arrived after the session ended");
    }
    Ok(())
}

/// Reports a status, retrying a few times while the controller is unreachable; tolerates
/// controllers without `ReportStatus` (UNIMPLEMENTED).
async fn report_status(channel: &AuthChannel, status: ExporterStatus, message: &str) {
    let mut ctl = ControllerServiceClient::new(channel.clone());
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
    for _ in 0..5 {
        let r = ctl
            .report_status(ReportStatusRequest {
                status: status as i32,
                message: Some(message.into()),
                release_lease: None,
            })
            .await;
        match r {
            Ok(_) => return,
            Err(s) if s.code() == Code::Unimplemented => return,
            Err(s) if matches!(s.code(), Code::Unavailable | Code::DeadlineExceeded) => {
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(s) => {
                tracing::warn!(
                    "reporting status {} failed: {}",
                    status.as_str_name(),
                    s.message()
                );
                return;
            }
        }
    }
    tracing::warn!(
        "reporting status {}: controller unreachable",
        status.as_str_name()
    );
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    #[test]
    fn backoff_is_capped_and_jittered() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let d: Vec<Duration> = (0..6).map(|_| b.next_delay()).collect();
        assert!(d[0] >= Duration::from_millis(50) && d[0] <= Duration::from_millis(100));
        assert!(d[5] >= Duration::from_millis(200) && d[5] <= Duration::from_millis(400));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn missing_endpoint_or_token_names_the_field() {
        let mut cfg = ExporterConfig::parse(
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: ExporterConfig\nmetadata:\n  namespace: default\n  name: e\ntoken: t\n",
            Path::new("/x/e.yaml"),
        )
        .unwrap();
        cfg.path = Some(PathBuf::from("/x/e.yaml"));
        let e = ControllerTarget::from_config(&cfg).unwrap_err().to_string();
        assert!(e.contains("/x/e.yaml") && e.contains("endpoint"), "{e}");
        cfg.endpoint = Some("localhost:1".into());
        cfg.token = None;
        let e = ControllerTarget::from_config(&cfg).unwrap_err().to_string();
        assert!(e.contains("token"), "{e}");
        cfg.token = Some("t".into());
        let t = ControllerTarget::from_config(&cfg).unwrap();
        assert_eq!(t.auth.kind, Some("Exporter"));
        assert_eq!(t.auth.name, "e");
    }

    fn options(extra: &str) -> Result<ExporterOptions, ExporterError> {
        let text = format!(
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: ExporterConfig\nmetadata:\n  namespace: default\n  name: e\nendpoint: localhost:1\ntoken: t\n{extra}"
        );
        let cfg = ExporterConfig::parse(&text, Path::new("/x/e.yaml")).unwrap();
        ExporterOptions::from_config(&cfg)
    }

    #[test]
    fn grpc_options_apply_to_the_controller_and_router_channels() {
        let o = options("").unwrap();
        assert_eq!(o.keepalive, Some(CONTROLLER_KEEPALIVE));
        assert_eq!(o.router_keepalive, Some(tunnel::ROUTER_KEEPALIVE));
        let o = options(
            "grpcOptions:\n  grpc.keepalive_time_ms: 7000\n  grpc.keepalive_timeout_ms: 3000\n",
        )
        .unwrap();
        let want = Keepalive {
            interval: Duration::from_secs(7),
            timeout: Duration::from_secs(3),
        };
        assert_eq!(o.keepalive, Some(want));
        assert_eq!(o.router_keepalive, Some(want));
        let e = options("grpcOptions:\n  grpc.keepalive_time_ms: -1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("grpc.keepalive_time_ms"), "{e}");
    }
}
