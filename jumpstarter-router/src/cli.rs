//! Command line of the `jumpstarter-router` binary.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, Result};
use clap::Parser;
use jumpstarter_core::auth::load_identity;

use crate::{
    router::{Router, RouterConfig, serve},
    token::RouterTokenKey,
};

/// Jumpstarter router: tunnels client<->exporter traffic for leases granted by the
/// controller.
#[derive(Parser, Debug)]
#[command(name = "jumpstarter-router", version)]
pub struct Args {
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
}

/// Entry point of the binary.
pub fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    let key = RouterTokenKey::new(args.router_key.into_bytes())?;
    let identity = load_identity(&args.tls_cert, &args.tls_key)?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    eprintln!("Router listening on {}", listener.local_addr()?);
    let router = Router::new(
        key,
        RouterConfig {
            pair_timeout: Duration::from_secs(args.pair_timeout),
        },
    );
    serve(router, listener, Some(identity), async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
