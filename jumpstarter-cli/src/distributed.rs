//! Distributed mode: `jmp shell` with a client config (lease through the controller, reach
//! the exporter through the router) and `jmp run` registering with a controller.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result};
use jumpstarter_core::{
    client::{
        ControllerClient, LeaseRequest, LeaseSession,
        direct::DIRECT_ENV,
        lease::{self, LeaseError, LeaseSource},
        timings,
        tunnel::{self, RetryPolicy},
    },
    config::{ClientConfig, ExporterConfig},
    hooks::wait::{Ended, Ready},
    server::local_socket_path,
};
use tokio_util::sync::CancellationToken;

use crate::{lease_end, shell};

/// What `jmp shell` needs to lease an exporter.
#[derive(Debug, Clone, Default)]
pub struct ShellLease {
    /// `--client-config PATH`.
    pub client_config: Option<PathBuf>,
    /// `--client ALIAS`.
    pub client: Option<String>,
    /// `--lease NAME` (or `JMP_LEASE`): use this lease, do not release it.
    pub lease: Option<String>,
    /// `-l/--selector`, each possibly comma-separated.
    pub selectors: Vec<String>,
    /// `-n/--name`: a specific exporter.
    pub name: Option<String>,
    /// `--duration`.
    pub duration: String,
    /// `--acquisition-timeout` (default: the client config's `leases.acquisition_timeout`).
    pub acquisition_timeout: Option<String>,
    /// `--no-direct`: stay on the router even when the exporter offers a direct path.
    pub no_direct: bool,
    /// `--retry-timeout` (or `JMP_RETRY_TIMEOUT`): how long a new connection waits for an
    /// unreachable router or exporter; `0` disables waiting. Default: 5m.
    pub retry_timeout: Option<String>,
    /// `--exporter-logs`: print every exporter log record, not only the hooks' output.
    pub exporter_logs: bool,
    /// `--keep-alive`: extend the lease while the command runs (see [`keep_lease_alive`]).
    pub keep_alive: bool,
    /// `--context key=value`, repeated: the new lease's context.
    pub context: Vec<String>,
}

/// Parses `--retry-timeout` (default [`tunnel::DEFAULT_RETRY_TIMEOUT`]).
fn retry_timeout(text: Option<&str>) -> Result<Duration> {
    match text.map(str::trim).filter(|t| !t.is_empty()) {
        None => Ok(tunnel::DEFAULT_RETRY_TIMEOUT),
        Some(t) => lease::parse_duration(t).with_context(|| format!("--retry-timeout {t:?}")),
    }
}

/// The exporter could not be reached through the router: one line, saying when retrying
/// was disabled.
fn unreachable(e: lease::LeaseError, retry: Duration) -> anyhow::Error {
    if retry.is_zero() {
        anyhow::anyhow!(
            "{e} (not retried: --retry-timeout 0)",
            e = jumpstarter_core::error_chain(&e)
        )
    } else {
        anyhow::Error::new(e)
    }
}

/// Tells the user on stderr, once per outage, that connections wait for the router, and
/// when a tunnel is lost (unless the loss is the lease's end, see [`lease_end::EndSeen`]).
fn retry_events(timeout: Duration, seen: lease_end::EndSeen) -> tunnel::TunnelEvents {
    let waiting = Arc::new(AtomicBool::new(false));
    Arc::new(move |event| match event {
        tunnel::TunnelEvent::Retrying { error, remaining } => {
            if !waiting.swap(true, Ordering::SeqCst) {
                let secs = (remaining + Duration::from_millis(999))
                    .min(timeout)
                    .as_secs();
                eprintln!(
                    "Waiting for the router (retrying for up to {secs}s): {error}",
                    error = jumpstarter_core::error_chain(&error)
                );
            }
        }
        tunnel::TunnelEvent::Reconnected { endpoint } => {
            if waiting.swap(false, Ordering::SeqCst) {
                eprintln!("Reconnected through router {endpoint}");
            }
        }
        tunnel::TunnelEvent::Lost { endpoint, reason } => {
            // The router also fails the tunnel when the lease ends (the exporter closes its
            // side): that is said once as the lease's end, not as a lost connection.
            seen.warn_unless_ended(format!(
                "Lost the connection to router {endpoint} ({reason}): calls in flight fail, \
                 new ones reconnect"
            ));
        }
    })
}

/// Leases an exporter (or uses the given lease), serves a local socket tunnelled to it,
/// runs `command` (or a shell) there and releases the lease afterwards. Returns the
/// command's exit code.
pub async fn shell(toolkit: &crate::Toolkit, opts: ShellLease, command: &[String]) -> Result<i32> {
    let seen = lease_end::EndSeen::default();
    let result = leased_shell(toolkit, opts, command, &seen).await;
    // A lost tunnel's warning still held back is said (or dropped) before the shell exits.
    seen.flush().await;
    result
}

/// [`shell`], telling `seen` when the lease is known to have ended.
async fn leased_shell(
    toolkit: &crate::Toolkit,
    opts: ShellLease,
    command: &[String],
    seen: &lease_end::EndSeen,
) -> Result<i32> {
    let step = timings::step("client config loaded");
    let cfg = ClientConfig::resolve(opts.client_config.as_deref(), opts.client.as_deref())?;
    step.end();
    let existing = opts
        .lease
        .clone()
        .or_else(|| std::env::var("JMP_LEASE").ok())
        .filter(|l| !l.is_empty());
    let source = match existing {
        Some(name) => {
            anyhow::ensure!(
                opts.context.is_empty(),
                "--context sets the context of a new lease; lease {name} exists and its context is fixed"
            );
            LeaseSource::Existing(name)
        }
        None => {
            let duration = lease::parse_duration(&opts.duration)?;
            LeaseSource::Create(LeaseRequest {
                selector: crate::values::join_selectors(&opts.selectors),
                exporter_name: opts.name.clone(),
                duration,
                // Named here, so that a signal arriving while it is being created or queued
                // can still release it.
                lease_id: Some(uuid::Uuid::now_v7().to_string()),
                context: crate::values::parse_context(&opts.context)?,
                ..LeaseRequest::default()
            })
        }
    };
    let timeout = match &opts.acquisition_timeout {
        Some(t) => {
            let d = lease::parse_duration(t)?;
            anyhow::ensure!(
                d >= Duration::from_secs(5),
                "--acquisition-timeout must be at least 5 seconds (got {t:?})"
            );
            d
        }
        None => Duration::from_secs(cfg.leases.acquisition_timeout),
    };
    let retry = retry_timeout(opts.retry_timeout.as_deref())?;
    // Check the request before connecting, so bad input fails fast and clearly.
    if let LeaseSource::Create(req) = &source {
        req.check()?;
    }
    // Only a lease this shell created is ended (`EndSession`) when the command exits, as
    // upstream: an existing lease stays ready for the next shell.
    let end_session = matches!(source, LeaseSource::Create(_));
    // From here on SIGINT, SIGTERM and SIGHUP no longer end the process on their own: every
    // stage below releases the lease it created first (upstream's "Releasing Lease").
    let mut stop = Box::pin(crate::signals::watch(&crate::signals::STOP));
    let ours = match &source {
        LeaseSource::Create(req) => req.lease_id.clone(),
        LeaseSource::Existing(_) => None,
    };
    let step = timings::step("controller connection (TCP, TLS, HTTP/2)");
    let controller = ControllerClient::connect(&cfg)
        .await
        .map_err(|e| crate::hints::controller_error(&cfg, e.into()))?;
    step.end();
    // `grpcOptions` apply to the router channels too, as upstream's client applies them
    // (already checked when the controller channel was opened).
    let router_keepalive = jumpstarter_core::client::grpc_options::keepalive(
        &cfg.grpc_options,
        tunnel::ROUTER_KEEPALIVE,
    )
    .unwrap_or(tunnel::ROUTER_KEEPALIVE);
    let waiting = QuietWait::new(WAIT_NOTICE_DELAY);
    // The exporter is reached once before the command starts: a router that stays
    // unreachable (past --retry-timeout) is one clear error here, not one per command.
    let acquiring = timings::step("lease acquired, exporter reached");
    let opened = tokio::select! {
        r = LeaseSession::from_source(&controller, source)
            .acquisition_timeout(timeout)
            .direct(!opts.no_direct)
            .retry(
                RetryPolicy::new(retry)
                    .with_events(retry_events(retry, seen.clone()))
                    .with_keepalive(router_keepalive),
            )
            .on_wait(|name, why| waiting.say(format!("Waiting for lease {name}: {why}")))
            .acquire() => r,
        sig = &mut stop => {
            waiting.stop();
            if let Some(name) = &ours {
                eprintln!("Releasing lease {name}");
                if let Err(e) = controller.release_lease(name).await {
                    eprintln!("Warning: could not release lease {name}: {e}", e = jumpstarter_core::error_chain(&e));
                }
            }
            return Ok(128 + sig);
        }
    };
    waiting.stop();
    acquiring.end();
    let session = match opened {
        Ok(session) => session,
        Err(e @ LeaseError::Connect(_)) => return Err(unreachable(e, retry)),
        Err(e) => return Err(e.into()),
    };
    let lease = session.lease();
    tracing::info!(
        "lease {} acquired (exporter {})",
        lease.name,
        lease.exporter
    );
    if lease.owned {
        // The deprecated labels its selector uses, as upstream main warns of them.
        crate::resources::warn_deprecated_selector_labels(None, &lease.deprecated_labels);
    }

    // Extensions come from this process only: they stop when the command is done (below) or
    // when jmp itself goes away.
    let keeper = opts
        .keep_alive
        .then(|| tokio::spawn(keep_lease_alive(controller.clone(), lease.name.clone())));
    let mut ended = false;
    let outcome = async {
        let dir = shell::private_dir()?;
        let socket = local_socket_path(dir.path());
        let cancel = CancellationToken::new();
        let direct = session.direct_path().cloned();
        match &direct {
            Some(d) => eprintln!(
                "Connected to {} directly ({})",
                lease.exporter,
                d.endpoint()
            ),
            None => eprintln!("Connected to {} via router", lease.exporter),
        }
        let step = timings::step("local socket served");
        let server =
            tokio::spawn(lease.serve_local_via(&socket, direct.clone(), cancel.clone())?);
        let mut env = shell::base_env(&socket.to_string_lossy());
        env.insert("JMP_DRIVERS_ALLOW".into(), drivers_allow(&cfg));
        env.insert("JMP_LEASE".into(), lease.name.clone());
        env.insert("JMP_EXPORTER".into(), lease.exporter.clone());
        env.insert("JMP_EXPORTER_LABELS".into(), lease.labels_env());
        if let Some(d) = &direct {
            // `j` then takes the direct path itself, sparing the socket's relay.
            let path = dir.path().join("direct-endpoint");
            match d.save(&path) {
                Ok(()) => {
                    env.insert(DIRECT_ENV.into(), path.to_string_lossy().into_owned());
                }
                Err(e) => tracing::warn!("cannot keep the direct path for j: {e}"),
            }
        }
        step.end();
        // The hooks: their output shows while the shell lives; the command starts once the
        // beforeLease hook is over, and the afterLease hook runs when it exits. Over the
        // session's own channel (the tunnel that reached the exporter, or the direct path),
        // not a second tunnel through the local socket.
        let channel = session.channel().await?;
        let logs = crate::hook_wait::follow_logs(channel.clone(), opts.exporter_logs);
        let mut server = Some(server);
        let mut watch = RunWatch::default();
        let step = timings::step("exporter ready (GetStatus)");
        // Whether a hook said it failed: the log follower then waits for its output.
        let mut hook_failed = false;
        let ready = async {
            let ready = session.wait_ready_on(channel.clone()).await;
            step.end();
            ready
        };
        let (code, end) = tokio::select! {
            ready = ready => {
                hook_failed = matches!(ready, Ready::Failed(_));
                match crate::hook_wait::on_ready(ready, || lease.refusal()) {
                Ok(None) => {
                    let (code, end) = run_until_end(
                        lease, (command, &env, toolkit.j_program()), &socket, &cancel,
                        &mut server, &mut watch, seen,
                    )
                    .await;
                    // EndSession (and the afterLease output) only while the lease lives.
                    if end_session && end.is_none() {
                        let _step = timings::step("EndSession, afterLease hook awaited");
                        let ended = session.end_session_on(channel).await;
                        hook_failed = matches!(ended, Ended::Failed(_));
                        match crate::hook_wait::on_ended(ended) {
                            Ok(()) => (code, end),
                            Err(e) => (Err(e), end),
                        }
                    } else {
                        (code, end)
                    }
                }
                Ok(Some(code)) => (Ok(code), None),
                Err(e) => (Err(e), None),
            }},
            sig = terminated() => (Ok(128 + sig), None),
        };
        let step = timings::step("log follower stopped");
        crate::hook_wait::stop_logs(logs, hook_failed).await;
        step.end();
        let step = timings::step("tunnels closed");
        cancel.cancel();
        if let Some(server) = server {
            let _ = server.await;
        }
        watch.stop().await;
        drop(dir);
        step.end();
        match end {
            Some(end) => {
                ended = true;
                // The lease ended under the command: a code of its own, whatever the
                // command's (docs/quickstart.md, "Exit codes").
                let code = code?;
                eprintln!(
                    "Lease {} ended while the command ran ({}); exiting with {} (the \
                     command's own exit code was {code})",
                    lease.name,
                    end.reason,
                    lease_end::LEASE_ENDED_EXIT_CODE,
                );
                Ok(lease_end::LEASE_ENDED_EXIT_CODE)
            }
            None => code,
        }
    }
    .await;
    if let Some(k) = keeper {
        k.abort();
    }
    if ended {
        // The lease ended by itself: nothing to end or release.
        session.detach();
    } else {
        let name = lease.name.clone();
        // EndSession was sent above when the command ran to its end; after a signal or a
        // failed hook the lease is released at once.
        match session.release_now().await {
            Ok(()) => {}
            // Released by someone else (an admin, the dashboard) while the command ran, and
            // the command ended before the shell saw the lease end: it ended under the
            // command all the same.
            Err(LeaseError::Rpc {
                code: tonic::Code::FailedPrecondition,
                ..
            }) => {
                seen.mark_ended();
                if let Ok(code) = outcome {
                    eprintln!(
                        "Lease {name} ended while the command ran (it was released elsewhere, \
                         e.g. by an admin); exiting with {} (the command's own exit code was \
                         {code})",
                        lease_end::LEASE_ENDED_EXIT_CODE,
                    );
                    return Ok(lease_end::LEASE_ENDED_EXIT_CODE);
                }
                eprintln!("Lease {name} had already been released elsewhere (e.g. by an admin)");
            }
            Err(e) => eprintln!(
                "Warning: could not release lease {name}: {e}",
                e = jumpstarter_core::error_chain(&e)
            ),
        }
    }
    outcome
}

/// `--keep-alive`: extends lease `name` as its end nears, by its own duration each time, until
/// the access policies refuse (said once on stderr, as is the start); runs until aborted.
async fn keep_lease_alive(controller: ControllerClient, name: String) {
    use jumpstarter_core::client::keep_alive::{KeepAlive, KeepAliveEvent, keep_alive};
    let duration = match controller.get_lease(&name).await {
        Ok(l) => l
            .duration
            .and_then(|d| Duration::try_from(d).ok())
            .filter(|d| !d.is_zero()),
        Err(e) => {
            eprintln!(
                "Warning: lease {name} is not kept alive: {e}",
                e = jumpstarter_core::error_chain(&e)
            );
            return;
        }
    };
    let policy = KeepAlive::for_duration(duration.unwrap_or(Duration::from_secs(1800)));
    eprintln!(
        "Keeping lease {name} alive while the command runs: extended by {} as its end nears, \
         up to the access policy's maximum duration",
        crate::output::format_timedelta(policy.extend_by.as_secs_f64())
    );
    let when = |t: std::time::SystemTime| {
        jiff::Timestamp::try_from(t).map_or_else(|_| "?".to_string(), |t| t.to_string())
    };
    let result = keep_alive(&controller, &name, policy, |event| match event {
        KeepAliveEvent::Extended { until } => {
            tracing::info!("lease {name} extended; it now ends at {}", when(until));
        }
        KeepAliveEvent::AtMaximum { until, reason } => eprintln!(
            "Lease {name} has reached the longest duration the access policy allows and is no \
             longer extended; it ends at {} ({reason})",
            when(until)
        ),
    })
    .await;
    if let Err(e) = result {
        eprintln!(
            "Warning: lease {name} is no longer kept alive: {e}",
            e = jumpstarter_core::error_chain(&e)
        );
    }
}

/// Runs the command until it exits (or SIGTERM/SIGHUP, which still release the lease)
/// while watching the lease: when it ends, says when and why, stops the tunnel `server` and
/// answers the command's later calls with UNAVAILABLE "the lease ended". Returns the exit
/// code and, when the lease ended first, its end.
async fn run_until_end(
    lease: &lease::AcquiredLease,
    (command, env, j_program): (&[String], &shell::ShellEnv, &str),
    socket: &std::path::Path,
    cancel: &CancellationToken,
    server: &mut Option<tokio::task::JoinHandle<()>>,
    watch: &mut RunWatch,
    seen: &lease_end::EndSeen,
) -> (Result<i32>, Option<lease_end::LeaseEnd>) {
    let announced = shell::ChildOptions {
        exporter_logs: false,
        announced: true,
        j_program,
    };
    let step = timings::step("command ran");
    let child = async {
        let code = shell::run_child(command, env, &lease.exporter, announced).await;
        step.end();
        code
    };
    let signal = terminated();
    let ends = lease_end::watch(lease, seen);
    tokio::pin!(child, signal, ends);
    let mut end = None;
    let code = loop {
        tokio::select! {
            code = &mut child => break code,
            sig = &mut signal => break Ok(128 + sig),
            e = &mut ends, if end.is_none() => {
                // Before anything is said or closed: the tunnels the router fails now (or
                // failed a moment ago) are the lease's end, not lost connections.
                seen.mark_ended();
                eprintln!("{}", e.message(&lease.name));
                cancel.cancel();
                if let Some(server) = server.take() {
                    let _ = server.await;
                }
                let message = e.status_message(&lease.name);
                let socket = socket.to_path_buf();
                let stop = watch.stop_ended.clone();
                watch.responder = Some(tokio::spawn(async move {
                    lease_end::serve_ended(&socket, message, stop).await;
                }));
                end = Some(e);
            }
        }
    };
    (code, end)
}

/// What [`run_until_end`] leaves running once the lease ended: the responder that answers
/// the command's later calls with "the lease ended".
#[derive(Default)]
struct RunWatch {
    stop_ended: CancellationToken,
    responder: Option<tokio::task::JoinHandle<()>>,
}

impl RunWatch {
    async fn stop(self) {
        self.stop_ended.cancel();
        if let Some(responder) = self.responder {
            let _ = responder.await;
        }
    }
}

/// How long a lease may take before `jmp shell` says what it is waiting for: a free board
/// is ready well within it, so a piped run says nothing.
const WAIT_NOTICE_DELAY: Duration = Duration::from_secs(2);

/// Waiting messages held back for a short delay: shown (the latest one) once the delay has
/// passed, then as they come; never when the wait ends first.
struct QuietWait {
    started: std::time::Instant,
    delay: Duration,
    held: Arc<std::sync::Mutex<Option<String>>>,
    timer: tokio::task::JoinHandle<()>,
}

impl QuietWait {
    fn new(delay: Duration) -> Self {
        let held = Arc::new(std::sync::Mutex::new(None::<String>));
        let timer = tokio::spawn({
            let held = held.clone();
            async move {
                tokio::time::sleep(delay).await;
                if let Some(message) = held.lock().ok().and_then(|mut h| h.take()) {
                    eprintln!("{message}");
                }
            }
        });
        Self {
            started: std::time::Instant::now(),
            delay,
            held,
            timer,
        }
    }

    fn say(&self, message: String) {
        if self.started.elapsed() >= self.delay {
            // The timer may not have run yet: what it holds comes first.
            if let Some(held) = self.held.lock().ok().and_then(|mut h| h.take()) {
                eprintln!("{held}");
            }
            eprintln!("{message}");
        } else if let Ok(mut h) = self.held.lock() {
            *h = Some(message);
        }
    }

    fn stop(self) {
        self.timer.abort();
    }
}

/// Resolves with the signal number on SIGTERM or SIGHUP.
async fn terminated() -> i32 {
    crate::signals::first_of(&[libc::SIGTERM, libc::SIGHUP]).await
}

/// `JMP_DRIVERS_ALLOW` for the shell: `UNSAFE`, or the config's allow-list.
fn drivers_allow(cfg: &ClientConfig) -> String {
    if cfg.allows_unsafe() {
        "UNSAFE".into()
    } else {
        cfg.drivers.allow.join(",")
    }
}

/// `jmp run` in controller mode: the exporter of `cfg` until a signal, counting its driver
/// calls in `metrics` when given.
pub async fn run_exporter(
    toolkit: &crate::Toolkit,
    cfg: &ExporterConfig,
    limits: jumpstarter_core::server::listener::ConnectionLimits,
    metrics: Option<Arc<jumpstarter_exporter::metrics::ExporterMetrics>>,
) -> Result<i32> {
    let exporter = toolkit.exporter(cfg).with_connection_limits(limits);
    let exporter = match metrics {
        Some(m) => exporter.with_metrics(m),
        None => exporter,
    };
    exporter.run(crate::signals::shutdown_signal()).await?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_timeouts_in_upstream_formats() {
        assert_eq!(retry_timeout(None).unwrap(), Duration::from_secs(300));
        assert_eq!(retry_timeout(Some("")).unwrap(), Duration::from_secs(300));
        assert_eq!(retry_timeout(Some("0")).unwrap(), Duration::ZERO);
        assert_eq!(retry_timeout(Some("30s")).unwrap(), Duration::from_secs(30));
        assert_eq!(retry_timeout(Some("5m")).unwrap(), Duration::from_secs(300));
    }

    #[test]
    fn bad_retry_timeout_names_the_flag_and_the_value() {
        let e = format!("{:#}", retry_timeout(Some("soon")).unwrap_err());
        assert!(e.contains("--retry-timeout") && e.contains("soon"), "{e}");
    }
}
