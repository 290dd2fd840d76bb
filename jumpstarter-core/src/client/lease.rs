//! The client in distributed mode: lease an exporter through the controller and reach it
//! through the router. The steps one by one; [`crate::LeaseSession`] does them all (and the
//! hooks and the release) for most callers.
//!
//! ```no_run
//! # async fn demo(cfg: jumpstarter_core::config::ClientConfig) -> Result<(), jumpstarter_core::client::lease::LeaseError> {
//! use std::time::Duration;
//! use jumpstarter_core::client::{ControllerClient, ExporterSession, LeaseRequest, lease::*};
//! let controller = ControllerClient::connect(&cfg).await?;
//! let request = LeaseRequest::new("board=rpi4", Duration::from_secs(1800));
//! let lease = acquire(&controller, LeaseSource::Create(request), Duration::from_secs(600), |name, why| {
//!     eprintln!("Waiting for lease {name}: {why}");
//! }).await?;
//! let session = ExporterSession::from_channel(lease.session_channel().await?).await
//!     .map_err(LeaseError::Connect)?;
//! session.driver("power").map_err(LeaseError::Connect)?.call::<()>("on", ()).await
//!     .map_err(LeaseError::Connect)?;
//! lease.release().await?;
//! # Ok(()) }
//! ```

use std::{collections::BTreeMap, future::Future, path::Path, sync::Arc, time::Duration};

use jumpstarter_proto::{
    client_v1::Lease,
    v1::{
        Condition, DialRequest, controller_service_client::ControllerServiceClient,
        exporter_service_client::ExporterServiceClient,
    },
};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tonic::Code;

pub use crate::client::lease_error::LeaseError;

use crate::{
    client::{
        ClientError, SessionChannel,
        channel::AuthChannel,
        controller::{ControllerClient, LeaseRequest},
        direct::{self, DIRECT_CONNECT_TIMEOUT, DIRECT_COPY_BUFFER, DirectTarget},
        timings,
        tunnel::{self, RetryPolicy, TicketError, TicketSource, TunnelTicket},
    },
    sync::LockExt,
};

/// Create a lease, or use one that exists (`--lease` / `JMP_LEASE`).
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseSource {
    /// Create a new lease (released again by [`AcquiredLease::release`]).
    Create(LeaseRequest),
    /// Use this lease (short or `namespaces/NS/leases/NAME`); never released by us.
    Existing(String),
}

/// The last path segment of a resource name (`namespaces/ns/leases/x` → `x`).
fn short_name(resource: &str) -> &str {
    resource.rsplit('/').next().unwrap_or(resource)
}

fn condition<'a>(lease: &'a Lease, kind: &str) -> Option<&'a Condition> {
    lease
        .conditions
        .iter()
        .find(|c| c.r#type.as_deref() == Some(kind))
}

fn is_true(c: Option<&Condition>) -> bool {
    c.is_some_and(|c| c.status.as_deref() == Some("True"))
}

fn condition_text(c: &Condition) -> String {
    c.message
        .clone()
        .filter(|m| !m.is_empty())
        .or_else(|| c.reason.clone())
        .unwrap_or_default()
}

/// Where a lease stands.
enum LeaseState {
    Ready,
    Waiting(String),
    Failed(&'static str, String),
}

fn lease_state(lease: &Lease) -> LeaseState {
    if is_true(condition(lease, "Ready")) {
        return LeaseState::Ready;
    }
    for (kind, state) in [
        ("Unsatisfiable", "cannot be satisfied"),
        ("Invalid", "is invalid"),
    ] {
        if let Some(c) = condition(lease, kind).filter(|c| is_true(Some(c))) {
            return LeaseState::Failed(state, condition_text(c));
        }
    }
    if let Some(c) = condition(lease, "Ready").filter(|c| c.status.as_deref() == Some("False"))
        && matches!(c.reason.as_deref(), Some("Released") | Some("Expired"))
    {
        return LeaseState::Failed("has ended", condition_text(c));
    }
    match condition(lease, "Pending") {
        Some(c) if is_true(Some(c)) => LeaseState::Waiting(condition_text(c)),
        _ => LeaseState::Waiting("waiting for the controller to schedule it".into()),
    }
}

/// The first poll of a waiting lease comes this soon after the request: the controller
/// schedules a lease for a free exporter within milliseconds of `CreateLease`, so a fixed
/// one-second poll made every `jmp shell` wait a second for nothing.
const FIRST_POLL: Duration = Duration::from_millis(10);

/// Polls of a waiting lease back off (doubling) up to this interval.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The generic "waiting" line is only shown once a lease has waited this long; a `Pending`
/// condition from the controller (the place in the queue) is shown at once.
const QUIET_WAIT: Duration = Duration::from_millis(500);

/// A wait whose reason does not change is announced again after this long, then after
/// twice as long each time, up to [`REMIND_MAX`] (so a long wait says it is still waiting
/// without a line per poll).
const REMIND_FIRST: Duration = Duration::from_secs(30);

/// The longest time between two announcements of the same wait.
const REMIND_MAX: Duration = Duration::from_secs(300);

/// When a wait whose reason did not change is announced again.
struct Reminder {
    at: tokio::time::Instant,
    gap: Duration,
}

impl Reminder {
    fn new(now: tokio::time::Instant) -> Self {
        Self {
            at: now + REMIND_FIRST,
            gap: REMIND_FIRST,
        }
    }

    /// The reason changed (and was announced): the next reminder is one gap away.
    fn reset(&mut self, now: tokio::time::Instant) {
        self.at = now + self.gap;
    }

    /// Whether to announce the same reason again at `now`.
    fn due(&mut self, now: tokio::time::Instant) -> bool {
        if now < self.at {
            return false;
        }
        self.gap = (self.gap * 2).min(REMIND_MAX);
        self.at = now + self.gap;
        true
    }
}

/// `1h2m`, `5m30s`, `45s`: a wait's length for a person.
fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    match (h, m, s) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, _) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

/// The next poll interval after `current`: doubled, at most [`POLL_INTERVAL`].
fn next_poll(current: Duration) -> Duration {
    (current * 2).min(POLL_INTERVAL)
}

/// Creates (or looks up) a lease and waits until it is ready, calling `on_wait(lease, why)`
/// whenever the reason for waiting changes (the `Pending` condition's message, which says
/// the place in the queue). A lease we created is released again if acquiring fails.
pub async fn acquire(
    controller: &ControllerClient,
    source: LeaseSource,
    acquisition_timeout: Duration,
    mut on_wait: impl FnMut(&str, &str),
) -> Result<AcquiredLease, LeaseError> {
    // A controller of ours answers `CreateLease` once its scheduler has looked at the new
    // lease: a lease granted at once comes back ready, and needs no `GetLease` poll.
    let mut granted = None;
    let (resource, owned) = match &source {
        LeaseSource::Create(req) => {
            req.check()?;
            let step = timings::step("CreateLease");
            let lease = controller.create_lease(req).await?;
            step.end();
            let name = lease.name.clone();
            if matches!(lease_state(&lease), LeaseState::Ready) && lease.exporter.is_some() {
                granted = Some(lease);
            }
            (name, true)
        }
        LeaseSource::Existing(name) => {
            if name.trim().is_empty() {
                return Err(LeaseError::Invalid("the lease name is empty".into()));
            }
            (controller.lease_resource(name.trim()), false)
        }
    };
    let name = short_name(&resource).to_string();
    let mut step = timings::step("lease granted");
    let waited = match granted {
        Some(lease) => Ok((lease, 0)),
        None => {
            wait_ready(
                controller,
                &resource,
                &name,
                acquisition_timeout,
                &mut on_wait,
            )
            .await
        }
    };
    let lease = match waited {
        Ok((l, polls)) => {
            step.detail(|| format!("{polls} GetLease"));
            step.end();
            l
        }
        Err(e) => {
            if owned && let Err(d) = controller.delete_lease(&resource).await {
                tracing::debug!("releasing lease {name} after a failure: {d}");
            }
            return Err(e);
        }
    };
    let exporter_resource = lease.exporter.clone().unwrap_or_default();
    let step = timings::step("GetExporter (labels)");
    let exporter_labels = controller
        .get_exporter(&exporter_resource, false)
        .await
        .map(|e| e.labels.into_iter().collect())
        .unwrap_or_else(|e| {
            tracing::debug!(
                "GetExporter {exporter_resource}: {e}",
                e = crate::error_chain(&e)
            );
            BTreeMap::new()
        });
    step.end();
    Ok(AcquiredLease {
        dialer: Arc::new(LeaseDialer {
            channel: controller.channel.clone(),
            lease: name.clone(),
            refused: std::sync::Mutex::new(None),
        }),
        controller: controller.clone(),
        retry: RetryPolicy::new(tunnel::DEFAULT_RETRY_TIMEOUT),
        exporter: short_name(&exporter_resource).to_string(),
        exporter_labels,
        deprecated_labels: lease.deprecated_labels.into_iter().collect(),
        name,
        resource,
        owned,
    })
}

async fn wait_ready(
    controller: &ControllerClient,
    resource: &str,
    name: &str,
    timeout: Duration,
    on_wait: &mut impl FnMut(&str, &str),
) -> Result<(Lease, u32), LeaseError> {
    let start = tokio::time::Instant::now();
    let mut polls = 0;
    let deadline = start + timeout;
    let mut last = String::new();
    let mut interval = FIRST_POLL;
    let mut reminder = Reminder::new(start);
    loop {
        polls += 1;
        let lease = match controller.get_lease(resource).await {
            Ok(lease) => lease,
            // The controller restarting, or away for a moment: the lease is still queued
            // there, so keep waiting (a client that left would leave it queued for nobody).
            Err(
                e @ LeaseError::Rpc {
                    code: Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted,
                    ..
                },
            ) => {
                let now = tokio::time::Instant::now();
                if now + interval > deadline {
                    return Err(e);
                }
                let why = format!(
                    "the controller cannot be reached ({e}); retrying",
                    e = crate::error_chain(&e)
                );
                if why != last {
                    on_wait(name, &why);
                    last = why;
                    reminder.reset(now);
                }
                tokio::time::sleep(interval).await;
                interval = next_poll(interval);
                continue;
            }
            Err(e) => return Err(e),
        };
        let why = match lease_state(&lease) {
            LeaseState::Ready => return Ok((lease, polls)),
            LeaseState::Failed(state, message) => {
                return Err(LeaseError::Failed {
                    lease: name.to_string(),
                    state,
                    message,
                });
            }
            LeaseState::Waiting(why) => why,
        };
        let from_controller = condition(&lease, "Pending").is_some_and(|c| is_true(Some(c)));
        let now = tokio::time::Instant::now();
        if why != last && (from_controller || start.elapsed() >= QUIET_WAIT) {
            on_wait(name, &why);
            last.clone_from(&why);
            reminder.reset(now);
        } else if !last.is_empty() && reminder.due(now) {
            on_wait(
                name,
                &format!(
                    "{why} (still waiting after {}; giving up after {})",
                    short_duration(start.elapsed()),
                    short_duration(timeout)
                ),
            );
        }
        if tokio::time::Instant::now() + interval > deadline {
            return Err(LeaseError::Timeout {
                lease: name.to_string(),
                secs: timeout.as_secs(),
                last: why,
            });
        }
        tokio::time::sleep(interval).await;
        interval = next_poll(interval);
    }
}

/// Dials the exporter of one lease through the controller (`Dial`).
pub struct LeaseDialer {
    channel: AuthChannel,
    lease: String,
    /// The controller's last final refusal to dial for the exporter's state
    /// (FAILED_PRECONDITION, e.g. a failed hook): what a connection dropped for it could not
    /// say.
    refused: std::sync::Mutex<Option<String>>,
}

/// How long `Dial` is retried while the exporter is not ready or not listening.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a `Dial` failure may pass by itself: the exporter not listening (yet) or not ready,
/// offline for a moment (restarting), the controller unreachable or busy. A lease that ended
/// or was transferred, permission denied, not found and the like are final.
fn dial_is_transient(s: &tonic::Status) -> bool {
    match s.code() {
        Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded | Code::Aborted => {
            true
        }
        Code::FailedPrecondition => {
            s.message().contains("not ready") || s.message().contains("offline")
        }
        _ => false,
    }
}

impl TicketSource for LeaseDialer {
    /// `Dial{lease}`, retrying FAILED_PRECONDITION "not ready" and UNAVAILABLE (backoff
    /// 0.3 s doubling up to 2 s) for up to [`DIAL_TIMEOUT`], as upstream. The error says
    /// whether retrying later may help (`dial_is_transient`).
    async fn ticket(&self) -> Result<TunnelTicket, TicketError> {
        let mut ctl = ControllerServiceClient::new(self.channel.clone());
        let deadline = tokio::time::Instant::now() + DIAL_TIMEOUT;
        let mut delay = Duration::from_millis(300);
        let mut step = timings::step("Dial");
        let mut tries = 0;
        loop {
            tries += 1;
            let r = ctl
                .dial(DialRequest {
                    lease_name: self.lease.clone(),
                })
                .await;
            match r {
                Ok(r) => {
                    if tries > 1 {
                        step.detail(|| format!("{tries} tries"));
                    }
                    let r = r.into_inner();
                    return Ok(TunnelTicket {
                        router_endpoint: r.router_endpoint,
                        router_token: r.router_token,
                    });
                }
                Err(s) => {
                    let retry = s.code() == Code::Unavailable
                        || (s.code() == Code::FailedPrecondition
                            && s.message().contains("not ready"));
                    if !retry || tokio::time::Instant::now() + delay > deadline {
                        let error = ClientError::connect(
                            format!("the exporter of lease {}", self.lease),
                            format!("Dial: {}", s.message()),
                        );
                        return Err(if dial_is_transient(&s) {
                            TicketError::transient(error)
                        } else {
                            // The exporter's own state (a failed hook), not the lease's end
                            // (UNKNOWN "lease not active"): worth telling the user.
                            if s.code() == Code::FailedPrecondition {
                                *self.refused.lock_or_recover() = Some(crate::error_chain(&error));
                            }
                            TicketError::permanent(error)
                        });
                    }
                    tracing::debug!("dial {}: {}; retrying", self.lease, s.message());
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

/// A ready lease.
#[derive(Clone)]
pub struct AcquiredLease {
    controller: ControllerClient,
    dialer: Arc<LeaseDialer>,
    retry: RetryPolicy,
    /// The lease name (short form, what `JMP_LEASE` holds).
    pub name: String,
    /// `namespaces/NS/leases/NAME`.
    pub resource: String,
    /// The exporter's name.
    pub exporter: String,
    /// The exporter's labels.
    pub exporter_labels: BTreeMap<String, String>,
    /// The deprecated labels the lease's selector uses, each with what to use instead, as
    /// the controller said when the lease became ready (upstream main's warnings).
    pub deprecated_labels: BTreeMap<String, String>,
    /// Whether we created it (and so release it).
    pub owned: bool,
}

impl AcquiredLease {
    /// The controller's last final refusal to connect to the exporter for its state (`Dial`
    /// refused with FAILED_PRECONDITION, e.g. because its beforeLease hook failed), as the
    /// error says it; not a refusal because the lease ended. A local connection that was
    /// refused is only dropped; this says why.
    pub fn refusal(&self) -> Option<String> {
        self.dialer.refused.lock_or_recover().clone()
    }

    /// How tunnels are retried while the router (or the exporter) is unreachable; by default
    /// for [`tunnel::DEFAULT_RETRY_TIMEOUT`], without events.
    pub fn set_retry(&mut self, policy: RetryPolicy) {
        self.retry = policy;
    }

    /// A gRPC channel to the exporter's session; each connection is a new `Dial` and tunnel,
    /// retried as [`AcquiredLease::set_retry`] says.
    pub async fn session_channel(&self) -> Result<SessionChannel, LeaseError> {
        tunnel::session_channel_with(
            self.dialer.clone(),
            self.controller.tls.clone(),
            self.retry.clone(),
        )
        .await
        .map_err(LeaseError::Connect)
    }

    /// `JMP_EXPORTER_LABELS`: `k=v` pairs sorted by key, comma-separated.
    pub fn labels_env(&self) -> String {
        self.exporter_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Binds a Unix socket at `path` and returns the future that serves it until `cancel`:
    /// every connection is `Dial`ed and tunnelled to the exporter's session, so a client
    /// that reconnects after a dropped tunnel gets a fresh one. This is what
    /// `JUMPSTARTER_HOST` points at inside `jmp shell`.
    ///
    /// While the router is unreachable, a new connection waits (retrying as
    /// [`AcquiredLease::set_retry`] says) and goes through once a router answers; a
    /// connection whose tunnel breaks is closed at once, so the call in flight fails
    /// instead of hanging.
    pub fn serve_local(
        &self,
        path: &Path,
        cancel: CancellationToken,
    ) -> Result<impl Future<Output = ()> + Send + 'static, LeaseError> {
        self.serve_local_via(path, None, cancel)
    }

    /// Finds a direct path to the exporter: reads the session's report through the router
    /// and returns the first advertised endpoint that answers for the same session within
    /// `timeout` ([`crate::client::direct`]); `None` when there is none (stay on the router).
    pub async fn find_direct(&self, timeout: Duration) -> Result<Option<DirectTarget>, LeaseError> {
        let step = timings::step("tunnel to the exporter");
        let channel = self.session_channel().await?;
        step.end();
        self.find_direct_on(channel, timeout).await
    }

    /// [`AcquiredLease::find_direct`] over `channel`, a channel to the lease's session
    /// through the router that the caller keeps for its own calls.
    pub async fn find_direct_on(
        &self,
        channel: SessionChannel,
        timeout: Duration,
    ) -> Result<Option<DirectTarget>, LeaseError> {
        let step = timings::step("GetReport (direct endpoints)");
        let report = ExporterServiceClient::new(channel)
            .get_report(())
            .await
            .map_err(|s| LeaseError::rpc("GetReport", s))?
            .into_inner();
        step.end();
        let _step = timings::step("direct endpoints probed");
        Ok(direct::probe(&report.alternative_endpoints, &report.uuid, timeout).await)
    }

    /// [`AcquiredLease::serve_local`], forwarding each local connection over `direct` (raw
    /// bytes over the lease's mutual-TLS connection) when given; a connection the direct
    /// endpoint does not take goes through the router instead.
    pub fn serve_local_via(
        &self,
        path: &Path,
        direct: Option<DirectTarget>,
        cancel: CancellationToken,
    ) -> Result<impl Future<Output = ()> + Send + 'static, LeaseError> {
        let listener = UnixListener::bind(path).map_err(|source| LeaseError::Listen {
            path: path.display().to_string(),
            source,
        })?;
        let dialer = self.dialer.clone();
        let tls = self.controller.tls.clone();
        let retry = self.retry.clone();
        Ok(async move {
            loop {
                let conn = tokio::select! {
                    _ = cancel.cancelled() => return,
                    c = listener.accept() => c,
                };
                let conn = match conn {
                    Ok((conn, _)) => conn,
                    Err(e) => {
                        tracing::warn!("local socket: {e}", e = crate::error_chain(&e));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let dialer = dialer.clone();
                let tls = tls.clone();
                let cancel = cancel.clone();
                let direct = direct.clone();
                let retry = retry.clone();
                tokio::spawn(async move {
                    let mut conn = conn;
                    if let Some(direct) = direct {
                        let connected =
                            tokio::time::timeout(DIRECT_CONNECT_TIMEOUT, direct.connect_stream())
                                .await;
                        match connected {
                            Ok(Ok(mut remote)) => {
                                tokio::select! {
                                    _ = cancel.cancelled() => {}
                                    // Large buffers: tokio's default 8 KiB means a
                                    // syscall and a TLS record per 8 KiB of an image.
                                    r = tokio::io::copy_bidirectional_with_sizes(
                                        &mut conn,
                                        &mut remote,
                                        DIRECT_COPY_BUFFER,
                                        DIRECT_COPY_BUFFER,
                                    ) => {
                                        if let Err(e) = r {
                                            tracing::debug!("direct connection {}: {e}", direct.endpoint(), e = crate::error_chain(&e));
                                        }
                                    }
                                }
                                return;
                            }
                            Ok(Err(e)) => tracing::warn!(
                                "direct endpoint {}: {e}; using the router",
                                direct.endpoint(),
                                e = crate::error_chain(&e)
                            ),
                            Err(_) => tracing::warn!(
                                "direct endpoint {} did not answer; using the router",
                                direct.endpoint()
                            ),
                        }
                    }
                    let link = tokio::select! {
                        _ = cancel.cancelled() => return,
                        l = tunnel::connect_retrying(&*dialer, &tls, &retry) => l,
                    };
                    match link {
                        // Dropping `conn` tells the client at once.
                        Err(e) => tracing::warn!(
                            "lease {}: {e}",
                            dialer.lease,
                            e = crate::error_chain(&e)
                        ),
                        Ok(link) => link.splice(conn, cancel.cancelled_owned(), retry.events),
                    }
                });
            }
        })
    }

    /// The lease as the controller sees it now (`GetLease`): its conditions say whether it
    /// has ended, and why.
    pub async fn status(&self) -> Result<Lease, LeaseError> {
        self.controller.get_lease(&self.resource).await
    }

    /// Whether the lease has ended (expired, released, or gone from the controller), as the
    /// controller says now; a controller that cannot be reached says nothing (`false`).
    pub async fn has_ended(&self) -> bool {
        match self.status().await {
            Ok(lease) => matches!(lease_state(&lease), LeaseState::Failed("has ended", _)),
            Err(LeaseError::Rpc {
                code: Code::NotFound,
                ..
            }) => true,
            Err(e) => {
                tracing::debug!(
                    "checking lease {}: {e}",
                    self.name,
                    e = crate::error_chain(&e)
                );
                false
            }
        }
    }

    /// Releases the lease (`DeleteLease`) if we created it.
    pub async fn release(&self) -> Result<(), LeaseError> {
        if !self.owned {
            return Ok(());
        }
        let _step = timings::step("DeleteLease");
        self.controller.delete_lease(&self.resource).await
    }
}

/// Parses a duration in the formats upstream's `jmp` accepts: seconds (`90`, `1.5`), human
/// (`30m`, `3h30m`, `1d3h40m`, `2 days`), ISO 8601 (`PT1H30M`, `P1DT2H`) and clock time
/// (`01:30:00`, `2 days, 01:30:00`, `4:13` = minutes:seconds). Exact to the nanosecond:
/// decimals are read as decimals, never through a float.
pub fn parse_duration(text: &str) -> Result<Duration, LeaseError> {
    let bad = |why: &str| LeaseError::Invalid(format!("invalid duration {text:?}: {why}"));
    let s = text.trim();
    if s.is_empty() {
        return Err(bad("empty"));
    }
    let nanos = if is_decimal(s) {
        decimal_times(s, NANOS_PER_SEC).ok_or_else(|| bad("out of range"))?
    } else if let Some(iso) = s.strip_prefix(['P', 'p']) {
        parse_iso(iso).ok_or_else(|| bad("not an ISO 8601 duration (e.g. PT1H30M)"))?
    } else if s.contains(':') {
        let (days, clock) = match s.rsplit_once(',') {
            Some((d, c)) => (
                parse_human(d.trim()).ok_or_else(|| bad("bad day count"))?,
                c,
            ),
            None => (0, s),
        };
        let parts: Vec<&str> = clock.trim().split(':').map(str::trim).collect();
        let units: &[u128] = match parts.len() {
            2 => &[60, 1],
            3 => &[3600, 60, 1],
            _ => return Err(bad("expected HH:MM:SS")),
        };
        let mut total = days;
        for (part, unit) in parts.iter().zip(units) {
            let n = decimal_times(part, unit * NANOS_PER_SEC)
                .filter(|_| is_decimal(part))
                .ok_or_else(|| bad("expected HH:MM:SS"))?;
            total = total.checked_add(n).ok_or_else(|| bad("out of range"))?;
        }
        total
    } else {
        parse_human(s).ok_or_else(|| bad("expected e.g. 30m, 3h30m, 1d, PT1H30M or 01:30:00"))?
    };
    if nanos >= MAX_SECS * NANOS_PER_SEC {
        return Err(bad("out of range"));
    }
    let secs = u64::try_from(nanos / NANOS_PER_SEC).map_err(|_| bad("out of range"))?;
    let sub = u32::try_from(nanos % NANOS_PER_SEC).map_err(|_| bad("out of range"))?;
    Ok(Duration::new(secs, sub))
}

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Durations of this many seconds (some 30 000 years) or more are refused.
const MAX_SECS: u128 = 1_000_000_000_000;

/// `90`, `1.5`, `.5`: digits with at most one dot.
fn is_decimal(s: &str) -> bool {
    let mut dots = 0;
    let ok = s.chars().all(|c| {
        if c == '.' {
            dots += 1;
        }
        c.is_ascii_digit() || c == '.'
    });
    ok && dots <= 1 && s.chars().any(|c| c.is_ascii_digit())
}

/// A decimal number (`90`, `1.5`, `.5`) times `unit_nanos`, in nanoseconds, exactly (digits
/// past the 18th decimal are dropped); `None` when it is not one or overflows.
fn decimal_times(text: &str, unit_nanos: u128) -> Option<u128> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut total = int.checked_mul(unit_nanos)?;
    let digits = &frac[..frac.len().min(18)];
    if !digits.is_empty() {
        let num: u128 = digits.parse().ok()?;
        let den = 10u128.checked_pow(u32::try_from(digits.len()).ok()?)?;
        total = total.checked_add(num.checked_mul(unit_nanos)? / den)?;
    }
    Some(total)
}

/// `1d3h40m`, `2 days 3 hours`, `90s`: a sum of number+unit terms, in nanoseconds.
fn parse_human(s: &str) -> Option<u128> {
    let mut total: u128 = 0;
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..num_len];
        if !is_decimal(number) {
            return None;
        }
        rest = rest[num_len..].trim_start();
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit = rest[..unit_len].to_ascii_lowercase();
        rest = rest[unit_len..].trim_start_matches([' ', ',']);
        let unit_nanos: u128 = match unit.as_str() {
            "w" | "wk" | "wks" | "week" | "weeks" => 604_800 * NANOS_PER_SEC,
            "d" | "day" | "days" => 86_400 * NANOS_PER_SEC,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3600 * NANOS_PER_SEC,
            "m" | "min" | "mins" | "minute" | "minutes" => 60 * NANOS_PER_SEC,
            "s" | "sec" | "secs" | "second" | "seconds" | "" => NANOS_PER_SEC,
            "ms" => 1_000_000,
            _ => return None,
        };
        total = total.checked_add(decimal_times(number, unit_nanos)?)?;
    }
    Some(total)
}

/// The part of an ISO 8601 duration after `P`: `[nY][nW][nD][T[nH][nM][nS]]`, in
/// nanoseconds.
fn parse_iso(s: &str) -> Option<u128> {
    let (date, time) = match s.split_once(['T', 't']) {
        Some((d, t)) => (d, Some(t)),
        None => (s, None),
    };
    let mut total: u128 = 0;
    let mut any = false;
    let mut take = |part: &str, units: &[(char, u128)]| -> Option<()> {
        let mut rest = part;
        while !rest.is_empty() {
            let end = rest.find(|c: char| c.is_ascii_alphabetic())?;
            let number = &rest[..end];
            let unit = rest[end..].chars().next()?.to_ascii_uppercase();
            let secs = units.iter().find(|(u, _)| *u == unit)?.1;
            if !is_decimal(number) {
                return None;
            }
            total = total.checked_add(decimal_times(number, secs * NANOS_PER_SEC)?)?;
            any = true;
            rest = &rest[end + 1..];
        }
        Some(())
    };
    take(date, &[('Y', 365 * 86_400), ('W', 604_800), ('D', 86_400)])?;
    if let Some(t) = time {
        if t.is_empty() {
            return None;
        }
        take(t, &[('H', 3600), ('M', 60), ('S', 1)])?;
    }
    any.then_some(total)
}

#[cfg(test)]
mod tests {
    #[test]
    fn waits_are_announced_again_less_and_less_often() {
        let t0 = tokio::time::Instant::now();
        let mut r = super::Reminder::new(t0);
        let s = std::time::Duration::from_secs;
        let due: Vec<u64> = (0..=1200).filter(|&t| r.due(t0 + s(t))).collect();
        assert_eq!(due, [30, 90, 210, 450, 750, 1050]);
        assert_eq!(super::short_duration(s(45)), "45s");
        assert_eq!(super::short_duration(s(90)), "1m30s");
        assert_eq!(super::short_duration(s(600)), "10m");
        assert_eq!(super::short_duration(s(7200)), "2h");
        assert_eq!(super::short_duration(s(3720)), "1h2m");
    }

    use super::*;

    fn secs(s: &str) -> u64 {
        parse_duration(s).unwrap().as_secs()
    }

    #[test]
    fn polls_start_fast_and_back_off_to_the_interval() {
        let mut d = FIRST_POLL;
        let mut waited = Duration::ZERO;
        let mut polls = 0;
        while d < POLL_INTERVAL {
            waited += d;
            polls += 1;
            d = next_poll(d);
        }
        assert_eq!(d, POLL_INTERVAL);
        assert_eq!(next_poll(POLL_INTERVAL), POLL_INTERVAL);
        // A handful of extra polls in the first second, then once a second as before.
        assert!(polls <= 7, "{polls} polls before reaching the interval");
        assert!(waited < Duration::from_millis(1300), "{waited:?}");
    }

    #[test]
    fn durations_in_upstream_formats() {
        assert_eq!(secs("90"), 90);
        assert_eq!(secs("30m"), 1800);
        assert_eq!(secs("3h30m"), 12_600);
        assert_eq!(secs("1d3h40m"), 99_600);
        assert_eq!(secs("2 days"), 172_800);
        assert_eq!(secs("PT1H30M"), 5400);
        assert_eq!(secs("P1DT2H30M"), 95_400);
        assert_eq!(secs("P1W"), 604_800);
        assert_eq!(secs("00:30:00"), 1800);
        assert_eq!(secs("01:30:00"), 5400);
        assert_eq!(secs("4:13"), 253);
        assert_eq!(secs("2 days, 01:30:00"), 178_200);
        assert_eq!(secs("0"), 0);
    }

    #[test]
    fn fractional_durations_are_exact() {
        let d = |s: &str| parse_duration(s).unwrap();
        assert_eq!(d("0.1"), Duration::from_millis(100));
        assert_eq!(d("1.5h"), Duration::from_secs(5400));
        assert_eq!(d("PT0.3S"), Duration::from_millis(300));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("0:00.7"), Duration::from_millis(700));
        assert_eq!(d(".5"), Duration::from_millis(500));
        assert_eq!(d("1.000000001"), Duration::new(1, 1));
        assert!(parse_duration("1e3").is_err());
        assert!(parse_duration("1..2").is_err());
        assert!(parse_duration("99999999999999999999999999999999999999999").is_err());
    }

    #[test]
    fn bad_durations_are_refused_with_the_input_named() {
        for bad in [
            "",
            "abc",
            "5 parsecs",
            "P",
            "PT",
            "1:2:3:4",
            "-5",
            "1h-",
            "Px1D",
        ] {
            let e = parse_duration(bad).unwrap_err().to_string();
            assert!(e.contains("invalid duration"), "{bad}: {e}");
        }
    }

    fn cond(kind: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            r#type: Some(kind.into()),
            status: Some(status.into()),
            reason: Some(reason.into()),
            message: Some(message.into()),
            ..Default::default()
        }
    }

    #[test]
    fn lease_states_from_conditions() {
        let mut l = Lease::default();
        assert!(matches!(lease_state(&l), LeaseState::Waiting(_)));
        l.conditions = vec![cond(
            "Pending",
            "True",
            "NotAvailable",
            "all busy (position 2 in queue)",
        )];
        match lease_state(&l) {
            LeaseState::Waiting(w) => assert!(w.contains("position 2"), "{w}"),
            _ => panic!("expected waiting"),
        }
        l.conditions
            .push(cond("Ready", "True", "Ready", "acquired"));
        assert!(matches!(lease_state(&l), LeaseState::Ready));
        l.conditions = vec![cond("Unsatisfiable", "True", "NoAccess", "no policy")];
        assert!(matches!(
            lease_state(&l),
            LeaseState::Failed("cannot be satisfied", m) if m == "no policy"
        ));
        l.conditions = vec![cond("Ready", "False", "Released", "released by client")];
        assert!(matches!(
            lease_state(&l),
            LeaseState::Failed("has ended", _)
        ));
        assert_eq!(short_name("namespaces/a/leases/x"), "x");
    }
}
