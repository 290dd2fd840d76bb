//! Distributed mode: `jmp shell` with a client config (lease through the controller, reach
//! the exporter through the router) and `jmp run` registering with a controller.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, Result};
use jumpstarter_core::{
    config::{ClientConfig, ExporterConfig},
    direct, exporter,
    lease::{self, ControllerClient, LeaseRequest, LeaseSource},
    serve::local_socket_path,
};
use tokio_util::sync::CancellationToken;

use crate::shell;

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
    // Check the request before connecting, so bad input fails fast and clearly.
    if let LeaseSource::Create(req) = &source {
        req.check()?;
    }
    let controller = ControllerClient::connect(&cfg).await?;
    let lease = lease::acquire(&controller, source, timeout, |name, why| {
        eprintln!("Waiting for lease {name}: {why}");
    })
    .await?;
    tracing::info!(
        "lease {} acquired (exporter {})",
        lease.name,
        lease.exporter
    );

    let outcome = async {
        let dir = shell::private_dir()?;
        let socket = local_socket_path(dir.path());
        let cancel = CancellationToken::new();
        let direct = if opts.no_direct {
            None
        } else {
            // Without an answer through the router there is nothing to learn; the commands
            // in the shell will report the problem.
            lease
                .find_direct(direct::DIRECT_CONNECT_TIMEOUT)
                .await
                .unwrap_or_else(|e| {
                    tracing::warn!("cannot read the exporter's report: {e}");
                    None
                })
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
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => libc::SIGTERM,
        _ = hup.recv() => libc::SIGHUP,
    }
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
