//! Command line of the `jumpstarter-router` binary.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, Result};
use clap::Parser;
use jumpstarter_core::{
    auth::{IssuedCert, read_cert_pem, read_key_pem},
    server::listener::{ConnectionGuard, ConnectionLimits, DEFAULT_MAX_CONNECTIONS},
};

use crate::{
    router::{Router, RouterConfig, serve},
    token::RouterTokenKey,
};

/// Jumpstarter router: tunnels client<->exporter traffic for leases granted by the
/// controller.
#[derive(Parser, Debug)]
#[command(name = "jumpstarter-router", version)]
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
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:8083", env = "ROUTER_LISTEN")]
    pub listen: String,
    /// Server certificate (PEM).
    #[arg(long, env = "EXTERNAL_CERT_PEM", value_name = "PATH")]
    pub tls_cert: PathBuf,
    /// Server private key (PEM).
    #[arg(long, env = "EXTERNAL_KEY_PEM", value_name = "PATH")]
    pub tls_key: PathBuf,
    /// The key shared with the controller that signs router tokens.
    #[arg(long, env = "ROUTER_KEY", hide_env_values = true)]
    pub router_key: String,
    /// Seconds the first stream of a pair waits for its peer.
    #[arg(long, default_value_t = 120)]
    pub pair_timeout: u64,
    /// Concurrent connections (established or handshaking); more are closed at once, with
    /// a warning in the log.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS, env = "ROUTER_MAX_CONNECTIONS")]
    pub max_connections: usize,
    /// Seconds a connection may take to finish its TLS handshake.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub handshake_timeout: u64,
    /// Seconds after the TLS handshake within which a connection must send the HTTP/2
    /// preface.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub first_frame_timeout: u64,
    /// Seconds between HTTP/2 keepalive pings.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub keepalive_interval: u64,
    /// Seconds a keepalive ping may stay unanswered before the connection is closed.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub keepalive_timeout: u64,
    /// Prometheus metrics listen address (`GET /metrics`: the router's and its listener's
    /// counters, e.g. `jumpstarter_listener_refused_total`); "off" or "" disables.
    #[arg(long, default_value = "off", env = "ROUTER_METRICS_LISTEN")]
    pub metrics_listen: String,
}

impl Args {
    /// The listener's bounds these arguments describe.
    pub fn limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.max_connections,
            handshake_timeout: Duration::from_secs(self.handshake_timeout),
            first_frame_timeout: Duration::from_secs(self.first_frame_timeout),
            keepalive_interval: Duration::from_secs(self.keepalive_interval),
            keepalive_timeout: Duration::from_secs(self.keepalive_timeout),
            ..ConnectionLimits::default()
        }
    }

    /// The metrics listen address, unless switched off.
    pub fn metrics_addr(&self) -> Option<&str> {
        let a = self.metrics_listen.trim();
        (!a.is_empty() && !a.eq_ignore_ascii_case("off")).then_some(a)
    }
}

/// Entry point of the binary.
pub fn main() -> std::process::ExitCode {
    let args = Args::parse();
    jumpstarter_core::tls::install_tls_provider();
    let _traces = match jumpstarter_core::telemetry::start(
        "jumpstarter-router",
        args.otlp_endpoint.as_deref(),
    ) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("Error: {}", jumpstarter_core::error_chain(&e));
            return std::process::ExitCode::FAILURE;
        }
    };
    jumpstarter_core::logging::init("router", args.log_format == "json");
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
    let code = match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            jumpstarter_core::logging::say_error(format!("{e:#}"));
            std::process::ExitCode::FAILURE
        }
    };
    jumpstarter_core::logging::flush();
    code
}

async fn run(args: Args) -> Result<()> {
    let limits = args.limits();
    let key = RouterTokenKey::new(args.router_key.as_bytes().to_vec())?;
    let identity = IssuedCert {
        cert_pem: read_cert_pem(&args.tls_cert)?,
        key_pem: read_key_pem(&args.tls_key)?,
    };
    let guard = ConnectionGuard::new("router", limits);
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let metrics = match args.metrics_addr() {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("--metrics-listen: cannot listen on {a}"))?,
        ),
        None => None,
    };
    let router = Router::new(
        key,
        RouterConfig {
            pair_timeout: Duration::from_secs(args.pair_timeout),
        },
    );
    if let Some(m) = metrics {
        jumpstarter_core::logging::say(format!(
            "Router metrics on http://{}/metrics",
            m.local_addr()?
        ));
        tokio::spawn(crate::metrics::serve(
            m,
            router.stats(),
            guard.stats(),
            std::future::pending(),
        ));
    }
    jumpstarter_core::logging::say(format!("Router listening on {}", listener.local_addr()?));
    serve(router, listener, Some(identity), guard, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
