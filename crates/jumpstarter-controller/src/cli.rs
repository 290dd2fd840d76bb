//! Command line of the `jumpstarter-controller` binary.

use std::path::PathBuf;

use clap::Parser;

use crate::server::{ControllerConfig, start};

/// Jumpstarter controller: inventory, authentication and leases, with an embedded store and
/// an in-process router. With no flags it keeps its data in the user's data directory.
#[derive(Parser, Debug)]
#[command(name = "jumpstarter-controller", version)]
pub struct Args {
    /// Where the store, CA and keys live (default: the user's data directory + /jumpstarter).
    #[arg(long, env = "JUMPSTARTER_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// gRPC listen address.
    #[arg(long, default_value = "0.0.0.0:8082", env = "JUMPSTARTER_LISTEN")]
    pub listen: String,
    /// In-process router listen address.
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
    let data_dir = args.data_dir.clone().unwrap_or_else(|| {
        dirs::data_dir()
            .unwrap_or_else(|| PathBuf::from("."))
            .join("jumpstarter")
    });
    let config = ControllerConfig {
        data_dir,
        listen: args.listen,
        router_listen: args.router_listen,
        advertise_host: args.advertise_host,
    };
    rt.block_on(async move {
        let running = match start(config.clone()).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("Error: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        eprintln!(
            "Controller listening on {} (endpoint {}), router on {}, data in {}",
            running.addr,
            running.endpoint,
            running.router_addr,
            config.data_dir.display()
        );
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
        running.shutdown().await;
        std::process::ExitCode::SUCCESS
    })
}
