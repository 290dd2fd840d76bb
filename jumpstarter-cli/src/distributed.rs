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
        direct,
        lease::{self, ControllerClient, LeaseRequest, LeaseSource},
        tunnel::{self, RetryPolicy},
    },
    config::{ClientConfig, ExporterConfig},
    server::local_socket_path,
};
use tokio_util::sync::CancellationToken;

use crate::{exporter, shell};

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
        anyhow::anyhow!("{e} (not retried: --retry-timeout 0)")
    } else {
        anyhow::Error::new(e)
    }
}

/// Tells the user on stderr, once per outage, that connections wait for the router, and
/// when a tunnel is lost.
fn retry_events(timeout: Duration) -> tunnel::TunnelEvents {
    let waiting = Arc::new(AtomicBool::new(false));
    Arc::new(move |event| match event {
        tunnel::TunnelEvent::Retrying { error, remaining } => {
            if !waiting.swap(true, Ordering::SeqCst) {
                let secs = (remaining + Duration::from_millis(999))
                    .min(timeout)
                    .as_secs();
                eprintln!("Waiting for the router (retrying for up to {secs}s): {error}");
            }
        }
        tunnel::TunnelEvent::Reconnected { endpoint } => {
            if waiting.swap(false, Ordering::SeqCst) {
                eprintln!("Reconnected through router {endpoint}");
            }
        }
        tunnel::TunnelEvent::Lost { endpoint, reason } => {
            eprintln!(
                "Lost the connection to router {endpoint} ({reason}): calls in flight fail, \
                 new ones reconnect"
            );
        }
    })
}

/// Leases an exporter (or uses the given lease), serves a local socket tunnelled to it,
/// runs `command` (or a shell) there and releases the lease afterwards. Returns the
/// command's exit code.
pub async fn shell(opts: ShellLease, command: &[String]) -> Result<i32> {
    let cfg = ClientConfig::resolve(opts.client_config.as_deref(), opts.client.as_deref())?;
    let existing = opts
        .lease
        .clone()
        .or_else(|| std::env::var("JMP_LEASE").ok())
        .filter(|l| !l.is_empty());
    let source = match existing {
        Some(name) => LeaseSource::Existing(name),
        None => {
            let duration = lease::parse_duration(&opts.duration)?;
            let selector = opts
                .selectors
                .iter()
                .map(|s| s.trim())
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(",");
            LeaseSource::Create(LeaseRequest {
                selector,
                exporter_name: opts.name.clone(),
                duration,
                // Named here, so that a signal arriving while it is being created or queued
                // can still release it.
                lease_id: Some(uuid::Uuid::now_v7().to_string()),
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
    // From here on SIGINT, SIGTERM and SIGHUP no longer end the process on their own: every
    // stage below releases the lease it created first (upstream's "Releasing Lease").
    let mut stop = Box::pin(crate::signals::watch(&crate::signals::STOP));
    let ours = match &source {
        LeaseSource::Create(req) => req.lease_id.clone(),
        LeaseSource::Existing(_) => None,
    };
    let controller = ControllerClient::connect(&cfg).await?;
    let acquired = tokio::select! {
        r = lease::acquire(&controller, source, timeout, |name, why| {
            eprintln!("Waiting for lease {name}: {why}");
        }) => r,
        sig = &mut stop => {
            if let Some(name) = &ours {
                eprintln!("Releasing lease {name}");
                if let Err(e) = controller.release_lease(name).await {
                    eprintln!("Warning: could not release lease {name}: {e}");
                }
            }
            return Ok(128 + sig);
        }
    };
    let mut lease = acquired?;
    lease.set_retry(RetryPolicy::new(retry).with_events(retry_events(retry)));
    tracing::info!(
        "lease {} acquired (exporter {})",
        lease.name,
        lease.exporter
    );

    let outcome = async {
        let dir = shell::private_dir()?;
        let socket = local_socket_path(dir.path());
        let cancel = CancellationToken::new();
        // The exporter is reached once before the command starts: a router that stays
        // unreachable (past --retry-timeout) is one clear error here, not one per command.
        let connect = async {
            if opts.no_direct {
                if let Err(e) = lease.session_channel().await {
                    return Err(unreachable(e, retry));
                }
                Ok(None)
            } else {
                match lease.find_direct(direct::DIRECT_CONNECT_TIMEOUT).await {
                    Ok(d) => Ok(d),
                    Err(e @ lease::LeaseError::Connect(_)) => Err(unreachable(e, retry)),
                    // The tunnel works but the report is unreadable: the commands in the
                    // shell will report the problem.
                    Err(e) => {
                        tracing::warn!("cannot read the exporter's report: {e}");
                        Ok(None)
                    }
                }
            }
        };
        // A signal while connecting ends the shell; the lease is released below.
        let direct = tokio::select! {
            d = connect => d?,
            sig = &mut stop => return Ok(128 + sig),
        };
        match &direct {
            Some(d) => eprintln!(
                "Connected to {} directly ({})",
                lease.exporter,
                d.endpoint()
            ),
            None => eprintln!("Connected to {} via router", lease.exporter),
        }
        let server = tokio::spawn(lease.serve_local_via(&socket, direct, cancel.clone())?);
        let mut env = shell::base_env(&socket.to_string_lossy());
        env.insert("JMP_DRIVERS_ALLOW".into(), drivers_allow(&cfg));
        env.insert("JMP_LEASE".into(), lease.name.clone());
        env.insert("JMP_EXPORTER".into(), lease.exporter.clone());
        env.insert("JMP_EXPORTER_LABELS".into(), lease.labels_env());
        // SIGTERM/SIGHUP end the shell but still release the lease below.
        let code = tokio::select! {
            code = shell::run_child(command, &env, &lease.exporter) => code,
            sig = terminated() => Ok(128 + sig),
        };
        cancel.cancel();
        let _ = server.await;
        drop(dir);
        code
    }
    .await;
    if let Err(e) = lease.release().await {
        eprintln!("Warning: could not release lease {}: {e}", lease.name);
    }
    outcome
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

/// `jmp run` without a listener: register with the controller of `cfg` and serve leases
/// until SIGINT/SIGTERM.
pub async fn run_exporter(cfg: &ExporterConfig) -> Result<i32> {
    let target = exporter::ControllerTarget::from_config(cfg)?;
    let tree = jumpstarter_drivers::stock_registry()
        .build(cfg)
        .with_context(|| format!("exporter {}", cfg.metadata.name))?;
    let options = exporter::ExporterOptions::from_config(cfg)?;
    exporter::run_with_options(target, tree, options, crate::jmp::shutdown_signal()).await?;
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
