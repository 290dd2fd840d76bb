//! Network drivers: a byte stream to a TCP, UDP or Unix socket reachable from the exporter.
//!
//! Upstream's `jumpstarter_driver_network.driver.{TcpNetwork, UdpNetwork, UnixNetwork,
//! EchoNetwork, WebsocketNetwork}`, with the same config fields and the client class
//! `jumpstarter_driver_network.client.NetworkClient`:
//!
//! - `connect` (`@exportstream`): opens a connection from the exporter and relays its bytes;
//!   for UDP each DATA frame is one datagram each way, for WebSocket one message;
//! - `address` (unary, TCP, UDP and WebSocket): `tcp://HOST:PORT` / `udp://HOST:PORT` with
//!   the host name resolved on the exporter (IPv6 in brackets), the configured `url` for
//!   WebSocket, or an `INVALID_ARGUMENT` error when the config says `enable_address: false`.
//!
//! [`NetworkClient`] is the client half: port forwarding ([`NetworkClient::forward_tcp`],
//! [`NetworkClient::forward_unix`]) and the `j NAME forward-tcp|forward-unix|address`
//! commands.

mod accept;
mod client;
mod novnc;
mod udp;
mod websocket;

use std::{net::IpAddr, path::PathBuf, sync::Arc};

use jumpstarter_core::{CallContext, Driver, DriverError, driver, driver::DriverArgs};
use serde::Deserialize;

pub use client::{Forwarder, NetworkClient, cli, format_host_port};
pub use novnc::{Novnc, novnc};
pub use udp::UdpStream;
pub use websocket::WebsocketNetwork;

/// Upstream client class of network drivers.
pub const NETWORK_CLIENT: &str = "jumpstarter_driver_network.client.NetworkClient";

/// The error `address` returns when the config disables it (upstream's wording).
const ADDRESS_DISABLED: &str = "enable_address mode is not true in the exporter configuration";

fn default_true() -> bool {
    true
}

/// Config of [`TcpNetwork`] and [`UdpNetwork`] (upstream's fields).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostPortConfig {
    host: String,
    port: u16,
    #[serde(default = "default_true")]
    enable_address: bool,
}

fn check_host(host: &str) -> Result<(), DriverError> {
    if host.is_empty() {
        return Err(DriverError::InvalidArgument(
            "host: must not be empty".into(),
        ));
    }
    Ok(())
}

/// `host:port`, resolved on the exporter when `host` is a name (the first address the
/// resolver gives, as upstream), IPv6 addresses in brackets. A name that does not resolve
/// is kept as it is.
pub async fn resolved_address(host: &str, port: u16) -> String {
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) => Some(ip),
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .ok()
            .and_then(|mut addrs| addrs.next())
            .map(|a| a.ip()),
    };
    match ip {
        Some(ip) => format_host_port(&ip.to_string(), port),
        None => format_host_port(host, port),
    }
}

/// A TCP connection from the exporter (`jumpstarter_driver_network.driver.TcpNetwork`).
#[derive(Debug, Clone)]
pub struct TcpNetwork {
    host: String,
    port: u16,
    enable_address: bool,
}

#[driver(client = "jumpstarter_driver_network.client.NetworkClient")]
impl TcpNetwork {
    /// Connects to `host:port` and relays the connection's bytes.
    #[export(stream)]
    async fn connect(&self, ctx: &CallContext) -> Result<tokio::net::TcpStream, DriverError> {
        ctx.log_info(format!(
            "Connecting TCP host={} port={}",
            self.host, self.port
        ));
        let stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| {
                DriverError::because(
                    format!(
                        "cannot connect to TCP {}",
                        format_host_port(&self.host, self.port)
                    ),
                    e,
                )
            })?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// `tcp://HOST:PORT`, the host resolved on the exporter.
    #[export]
    async fn address(&self) -> Result<String, DriverError> {
        if !self.enable_address {
            return Err(DriverError::InvalidArgument(ADDRESS_DISABLED.into()));
        }
        Ok(format!(
            "tcp://{}",
            resolved_address(&self.host, self.port).await
        ))
    }
}

impl TcpNetwork {
    /// A driver connecting to `host:port`.
    pub fn new(host: impl Into<String>, port: u16, enable_address: bool) -> Self {
        Self {
            host: host.into(),
            port,
            enable_address,
        }
    }

    /// Constructor for the registry: `host`, `port`, `enable_address` (default true).
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        let c: HostPortConfig = args.parse()?;
        check_host(&c.host)?;
        Ok(Arc::new(Self::new(c.host, c.port, c.enable_address)))
    }
}

/// A connected UDP socket on the exporter (`jumpstarter_driver_network.driver.UdpNetwork`).
#[derive(Debug, Clone)]
pub struct UdpNetwork {
    host: String,
    port: u16,
    enable_address: bool,
}

#[driver(client = "jumpstarter_driver_network.client.NetworkClient")]
impl UdpNetwork {
    /// Connects a UDP socket to `host:port`: each DATA frame the client sends is one
    /// datagram, each datagram received is one DATA frame back.
    #[export(stream)]
    async fn connect(&self, ctx: &CallContext) -> Result<UdpStream, DriverError> {
        ctx.log_info(format!(
            "Connecting UDP host={} port={}",
            self.host, self.port
        ));
        UdpStream::connect(&self.host, self.port)
            .await
            .map_err(|e| {
                DriverError::because(
                    format!(
                        "cannot connect to UDP {}",
                        format_host_port(&self.host, self.port)
                    ),
                    e,
                )
            })
    }

    /// `udp://HOST:PORT`, the host resolved on the exporter.
    #[export]
    async fn address(&self) -> Result<String, DriverError> {
        if !self.enable_address {
            return Err(DriverError::InvalidArgument(ADDRESS_DISABLED.into()));
        }
        Ok(format!(
            "udp://{}",
            resolved_address(&self.host, self.port).await
        ))
    }
}

impl UdpNetwork {
    /// A driver sending datagrams to `host:port`.
    pub fn new(host: impl Into<String>, port: u16, enable_address: bool) -> Self {
        Self {
            host: host.into(),
            port,
            enable_address,
        }
    }

    /// Constructor for the registry: `host`, `port`, `enable_address` (default true).
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        let c: HostPortConfig = args.parse()?;
        check_host(&c.host)?;
        Ok(Arc::new(Self::new(c.host, c.port, c.enable_address)))
    }
}

/// A Unix socket connection from the exporter
/// (`jumpstarter_driver_network.driver.UnixNetwork`). It has no `address` method, as
/// upstream.
#[derive(Debug, Clone)]
pub struct UnixNetwork {
    path: PathBuf,
}

#[driver(client = "jumpstarter_driver_network.client.NetworkClient")]
impl UnixNetwork {
    /// Connects to the socket at `path` and relays its bytes.
    #[export(stream)]
    async fn connect(&self, ctx: &CallContext) -> Result<tokio::net::UnixStream, DriverError> {
        ctx.log_info(format!("Connecting UDS path={}", self.path.display()));
        tokio::net::UnixStream::connect(&self.path)
            .await
            .map_err(|e| {
                DriverError::because(
                    format!("cannot connect to Unix socket {}", self.path.display()),
                    e,
                )
            })
    }
}

impl UnixNetwork {
    /// A driver connecting to the Unix socket at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// Constructor for the registry: `path`.
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Config {
            path: PathBuf,
        }
        let c: Config = args.parse()?;
        if c.path.as_os_str().is_empty() {
            return Err(DriverError::InvalidArgument(
                "path: must not be empty".into(),
            ));
        }
        Ok(Arc::new(Self::new(c.path)))
    }
}

/// Bytes buffered by one [`EchoNetwork`] connection before its writer waits.
const ECHO_BUFFER: usize = 64 * 1024;

/// A stream that sends back what it is sent (`jumpstarter_driver_network.driver.EchoNetwork`),
/// for tests without a network.
#[derive(Debug, Clone, Default)]
pub struct EchoNetwork;

#[driver(client = "jumpstarter_driver_network.client.NetworkClient")]
impl EchoNetwork {
    /// A loopback byte stream.
    #[export(stream)]
    async fn connect(
        &self,
        ctx: &CallContext,
    ) -> Result<
        tokio::io::Join<
            tokio::io::ReadHalf<tokio::io::SimplexStream>,
            tokio::io::WriteHalf<tokio::io::SimplexStream>,
        >,
        DriverError,
    > {
        ctx.log_info("Connecting Echo");
        let (r, w) = tokio::io::simplex(ECHO_BUFFER);
        Ok(tokio::io::join(r, w))
    }
}

impl EchoNetwork {
    /// Constructor for the registry (takes no config).
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct NoConfig {}
        let _: NoConfig = args.parse()?;
        Ok(Arc::new(EchoNetwork))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn args(v: serde_json::Value) -> DriverArgs {
        DriverArgs { config: v }
    }

    #[tokio::test]
    async fn addresses_are_resolved_and_bracketed() {
        assert_eq!(resolved_address("127.0.0.1", 80).await, "127.0.0.1:80");
        assert_eq!(resolved_address("::1", 22).await, "[::1]:22");
        let local = resolved_address("localhost", 5).await;
        assert!(
            local == "127.0.0.1:5" || local == "[::1]:5",
            "localhost resolved to {local}"
        );
        assert_eq!(
            resolved_address("no-such-host.invalid", 7).await,
            "no-such-host.invalid:7"
        );
    }

    #[tokio::test]
    async fn address_honours_enable_address() {
        let on = TcpNetwork::new("::1", 8080, true);
        assert_eq!(on.address().await.unwrap(), "tcp://[::1]:8080");
        let off = UdpNetwork::new("127.0.0.1", 53, false);
        match off.address().await {
            Err(DriverError::InvalidArgument(m)) => assert!(m.contains("enable_address"), "{m}"),
            other => panic!("{other:?}"),
        }
        let udp = UdpNetwork::new("127.0.0.1", 53, true);
        assert_eq!(udp.address().await.unwrap(), "udp://127.0.0.1:53");
    }

    #[test]
    fn bad_configs_are_refused_naming_the_field() {
        let err = |r: Result<Arc<dyn Driver>, DriverError>| match r {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        };
        let e = err(TcpNetwork::from_args(&args(
            serde_json::json!({"host": "h"}),
        )));
        assert!(e.contains("port"), "{e}");
        let e = err(TcpNetwork::from_args(&args(
            serde_json::json!({"host": "h", "port": 70000}),
        )));
        assert!(e.contains("70000"), "{e}");
        let e = err(UdpNetwork::from_args(&args(
            serde_json::json!({"host": "h", "port": 1, "colour": "red"}),
        )));
        assert!(e.contains("colour"), "{e}");
        let e = err(TcpNetwork::from_args(&args(
            serde_json::json!({"host": "", "port": 1}),
        )));
        assert!(e.contains("host"), "{e}");
        let e = err(UnixNetwork::from_args(&args(serde_json::json!({}))));
        assert!(e.contains("path"), "{e}");
        let e = err(EchoNetwork::from_args(&args(serde_json::json!({"x": 1}))));
        assert!(e.contains('x'), "{e}");
        assert!(
            TcpNetwork::from_args(&args(
                serde_json::json!({"host": "h", "port": 1, "enable_address": false})
            ))
            .is_ok()
        );
    }
}
