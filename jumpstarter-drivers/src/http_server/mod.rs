//! A boot server over HTTP: upstream's `jumpstarter_driver_http.driver.HttpServer`
//! (client class `jumpstarter_driver_http.client.HttpServerClient`).
//!
//! The driver serves the files under `root_dir` over HTTP/1.1 (`GET` and `HEAD`) to the
//! board, for bootloaders and installers that fetch kernels and images by URL. Its `storage`
//! child is an `Opendal` driver on `root_dir` (scheme `fs`), as upstream's: what a client
//! writes through it (`j NAME storage write-from-path ...`) is what the board downloads.
//!
//! Config fields as upstream: `root_dir` (`/var/www`, created if missing), `host` (the
//! address to listen on and to put in URLs; default: this machine's address on its default
//! route), `port` (`8080`; `0` picks a free one), `timeout` (seconds a connection may stay
//! silent, `600`), `remove_created_on_close` (`true`: files written through `storage` are
//! removed when the session ends).
//!
//! Whatever `timeout` says, a request head must arrive whole within 10 s, and one client
//! address holds at most 8 of the 64 connections served at once (see [`serve`]), so
//! half-sent requests cannot keep a board from its files.
//!
//! Methods: `start` (a port that cannot be bound is an error naming `port`; the exporter
//! and its other drivers go on), `stop`, `get_url`, `get_host`, `get_port` (the bound port
//! while running, `0` when stopped, as upstream). The server stops when the session ends.

mod client;
mod serve;

use std::{path::PathBuf, sync::Arc, time::Duration};

use jumpstarter_core::{CallContext, Driver, DriverError, driver, driver::DriverArgs};
use serde::Deserialize;

pub use client::{HttpServerClient, cli};

use crate::boot_server::{ServerSlot, default_host, make_root, storage_child};

/// Upstream client class of the HTTP boot server.
pub const HTTP_SERVER_CLIENT: &str = "jumpstarter_driver_http.client.HttpServerClient";

fn default_root() -> PathBuf {
    "/var/www".into()
}
fn default_port() -> u16 {
    8080
}
fn default_timeout() -> u64 {
    600
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
    host: Option<String>,
    #[serde(default = "default_port")]
    port: u16,
    #[serde(default = "default_timeout")]
    timeout: u64,
    #[serde(default = "default_true")]
    remove_created_on_close: bool,
}

/// The HTTP boot server (`jumpstarter_driver_http.driver.HttpServer`).
pub struct HttpServer {
    root: PathBuf,
    host: String,
    port: u16,
    timeout: Duration,
    storage: Arc<dyn Driver>,
    server: ServerSlot,
}

#[driver(
    client = "jumpstarter_driver_http.client.HttpServerClient",
    children = built_in,
    session_end = stop_at_session_end
)]
impl HttpServer {
    /// Starts serving `root_dir` (restarting if already running, as upstream).
    #[export]
    async fn start(&self, ctx: &CallContext) -> Result<(), DriverError> {
        if self.server.stop().await {
            ctx.log_warning("Cleaning up stale HTTP server runner before starting.");
        }
        let bind = format!("{}:{}", self.host, self.port);
        let listener = tokio::net::TcpListener::bind(&bind).await.map_err(|e| {
            DriverError::because(
                format!("HttpServer cannot listen on {bind} (fields host, port)"),
                e,
            )
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| DriverError::because(format!("HttpServer {bind}"), e))?;
        let task = serve::start(listener, self.root.clone(), self.timeout);
        self.server.replace(addr, task);
        ctx.log_info(format!(
            "HTTP server started at http://{}:{}",
            self.host,
            addr.port()
        ));
        Ok(())
    }

    /// Stops the server (a warning, not an error, when it is not running).
    #[export]
    async fn stop(&self, ctx: &CallContext) -> Result<(), DriverError> {
        if self.server.stop().await {
            ctx.log_info("HTTP server stopped.");
        } else {
            ctx.log_warning("HTTP server is not running.");
        }
        Ok(())
    }

    /// The base URL, `http://HOST:PORT` (port `0` when stopped, as upstream).
    #[export]
    async fn get_url(&self) -> Result<String, DriverError> {
        Ok(format!(
            "http://{}:{}",
            url_host(&self.host),
            self.bound_port()
        ))
    }

    /// The address the server listens on and puts in URLs.
    #[export]
    async fn get_host(&self) -> Result<String, DriverError> {
        Ok(self.host.clone())
    }

    /// The bound port (`0` when stopped).
    #[export]
    async fn get_port(&self) -> Result<u16, DriverError> {
        Ok(self.bound_port())
    }
}

/// A host as it goes in a URL (IPv6 addresses in brackets).
fn url_host(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

impl HttpServer {
    fn built_in(&self) -> Vec<(String, Arc<dyn Driver>)> {
        vec![("storage".into(), self.storage.clone())]
    }

    fn bound_port(&self) -> u16 {
        self.server.port().unwrap_or(0)
    }

    async fn stop_at_session_end(&self) {
        self.server.stop().await;
    }

    /// Constructor for the registry: upstream's fields (see the module docs).
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        let c: Config = args.parse()?;
        if c.timeout == 0 {
            return Err(DriverError::InvalidArgument(
                "HttpServer timeout: must be at least 1 second".into(),
            ));
        }
        make_root("HttpServer", &c.root_dir)?;
        let storage = storage_child(&c.root_dir, c.remove_created_on_close)?;
        Ok(Arc::new(Self {
            host: c
                .host
                .filter(|h| !h.is_empty())
                .unwrap_or_else(default_host),
            root: c.root_dir,
            port: c.port,
            timeout: Duration::from_secs(c.timeout),
            storage,
            server: ServerSlot::default(),
        }))
    }
}
