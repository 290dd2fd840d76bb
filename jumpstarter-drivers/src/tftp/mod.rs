//! A boot server over TFTP: upstream's `jumpstarter_driver_tftp.driver.Tftp` (client class
//! `jumpstarter_driver_tftp.client.TftpServerClient`).
//!
//! The driver serves the files under `root_dir` read-only over TFTP ([`server`]: RFC 1350
//! read requests with the `blksize`, `tsize` and `timeout` options), for boot ROMs and
//! bootloaders (PXE, U-Boot) that fetch kernels, device trees and configs. At most 64
//! transfers run at once, 8 of them to one client address; a transfer whose first packet
//! is not acknowledged within 6 s is abandoned, and gives way sooner when every slot is
//! taken (see [`server`]), so requests from forged addresses cannot lock the server. Its
//! `storage` child is an `Opendal` driver on `root_dir` (scheme `fs`), as upstream's: what
//! a client writes through it is what the board fetches.
//!
//! Config fields as upstream: `root_dir` (`/var/lib/tftpboot`, created if missing), `host`
//! (the address to listen on; default: this machine's address on its default route),
//! `port` (`69`; `0` picks a free one), `remove_created_on_close` (`true`: files written
//! through `storage` are removed when the session ends).
//!
//! Methods: `start` (a port that cannot be bound, e.g. already in use, is an error naming
//! `port`; the exporter and its other drivers go on; starting a running server only warns,
//! as upstream), `stop`, `get_host`, `get_port` (the configured port, or the bound one while
//! running when `port` is `0`). The server stops when the session ends.

mod client;
mod server;

pub(crate) use server::client_key;

use std::{path::PathBuf, sync::Arc};

use jumpstarter_core::{CallContext, Driver, DriverError, driver, driver::DriverArgs};
use serde::Deserialize;

pub use client::{TftpServerClient, cli};

use crate::boot_server::{ServerSlot, default_host, make_root, storage_child};

/// Upstream client class of the TFTP boot server.
pub const TFTP_CLIENT: &str = "jumpstarter_driver_tftp.client.TftpServerClient";

fn default_root() -> PathBuf {
    "/var/lib/tftpboot".into()
}
fn default_port() -> u16 {
    69
}
fn default_true() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_root")]
    root_dir: PathBuf,
    #[serde(default)]
    host: String,
    #[serde(default = "default_port")]
    port: u16,
    #[serde(default = "default_true")]
    remove_created_on_close: bool,
}

/// The TFTP boot server (`jumpstarter_driver_tftp.driver.Tftp`).
pub struct Tftp {
    root: PathBuf,
    host: String,
    port: u16,
    storage: Arc<dyn Driver>,
    server: ServerSlot,
}

#[driver(
    client = "jumpstarter_driver_tftp.client.TftpServerClient",
    children = built_in,
    session_end = stop_at_session_end
)]
impl Tftp {
    /// Starts serving `root_dir` (a warning when already running, as upstream).
    #[export]
    async fn start(&self, ctx: &CallContext) -> Result<(), DriverError> {
        if self.server.is_running() {
            ctx.log_warning("TFTP server is already running");
            return Ok(());
        }
        let bind = if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let socket = tokio::net::UdpSocket::bind(&bind).await.map_err(|e| {
            DriverError::because(
                format!("Tftp cannot listen on UDP {bind} (fields host, port)"),
                e,
            )
        })?;
        let addr = socket
            .local_addr()
            .map_err(|e| DriverError::because(format!("Tftp {bind}"), e))?;
        let task = server::start(socket, self.root.clone());
        if !self.server.start(addr, task) {
            // Another start won the race: keep that one.
            return Ok(());
        }
        ctx.log_info(format!(
            "TFTP server started on {}:{}",
            self.host,
            addr.port()
        ));
        Ok(())
    }

    /// Stops the server (a warning, not an error, when it is not running).
    #[export]
    async fn stop(&self, ctx: &CallContext) -> Result<(), DriverError> {
        if self.server.stop().await {
            ctx.log_info("TFTP server stopped successfully");
        } else {
            ctx.log_warning("stop called - TFTP server is not running");
        }
        Ok(())
    }

    /// The address the server listens on.
    #[export]
    async fn get_host(&self) -> Result<String, DriverError> {
        Ok(self.host.clone())
    }

    /// The port: the configured one, or the bound one while running with `port: 0`.
    #[export]
    async fn get_port(&self) -> Result<u16, DriverError> {
        Ok(self.server.port().unwrap_or(self.port))
    }
}

impl Tftp {
    fn built_in(&self) -> Vec<(String, Arc<dyn Driver>)> {
        vec![("storage".into(), self.storage.clone())]
    }

    async fn stop_at_session_end(&self) {
        self.server.stop().await;
    }

    /// Constructor for the registry: upstream's fields (see the module docs).
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        let c: Config = args.parse()?;
        make_root("Tftp", &c.root_dir)?;
        let storage = storage_child(&c.root_dir, c.remove_created_on_close)?;
        Ok(Arc::new(Self {
            host: if c.host.is_empty() {
                default_host()
            } else {
                c.host
            },
            root: c.root_dir,
            port: c.port,
            storage,
            server: ServerSlot::default(),
        }))
    }
}
