//! The client half of network drivers: port forwarding and the `j NAME ...` commands.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use clap::{Arg, ArgAction, ArgMatches, Command};
use jumpstarter_core::{ClientError, client::DriverClient};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    task::JoinHandle,
};

use crate::command::{CliFuture, DriverCommand};

/// Connections one forwarder relays at once; more wait in the listener's backlog.
const MAX_FORWARDED: usize = 64;

/// `host:port`, an IPv6 host in brackets.
pub fn format_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// An address without its URL scheme (`tcp://[::1]:80` -> `[::1]:80`), as upstream's
/// `j NAME address` prints it.
pub fn strip_scheme(addr: &str) -> &str {
    addr.split_once("://").map_or(addr, |(_, rest)| rest)
}

/// Splits `host:port` / `[v6]:port` / `scheme://host:port` into host and port.
fn split_host_port(addr: &str) -> (String, String) {
    let rest = strip_scheme(addr);
    if let Some(v6) = rest.strip_prefix('[')
        && let Some((host, port)) = v6.split_once(']')
    {
        return (host.to_string(), port.trim_start_matches(':').to_string());
    }
    match rest.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h.to_string(), p.to_string()),
        _ => (rest.to_string(), String::new()),
    }
}

/// Typed client for drivers reporting `jumpstarter_driver_network.client.NetworkClient`.
#[derive(Clone)]
pub struct NetworkClient(pub DriverClient);

/// A running port forward: accepts local connections and relays each through its own
/// byte stream to the driver. Dropping it stops listening and cuts the relayed connections.
pub struct Forwarder {
    local: String,
    task: JoinHandle<()>,
    cleanup: Option<PathBuf>,
}

impl Forwarder {
    /// Where it listens: `host:port` (IPv6 in brackets) or a socket path.
    pub fn local_address(&self) -> &str {
        &self.local
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(path) = self.cleanup.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Relays one accepted connection through a new stream to `method`.
async fn relay<C>(client: DriverClient, method: Arc<str>, conn: C)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    match client.open_stream_ends(&method).await {
        Ok(remote) => {
            // Reads of up to a whole stream chunk, each sent as it was read: tokio's
            // default of 8 KiB made every 8 KiB a message of its own, and the per-message
            // work of the stream (channel hops, HTTP/2 frames, wake-ups on both ends) bounded
            // forwarding at a tenth of loopback TCP; a copying relay copied every byte once
            // more each way.
            if let Err(e) = remote.splice(conn).await {
                tracing::debug!(
                    "forwarded connection ended: {e}",
                    e = jumpstarter_core::error_chain(&e)
                );
            }
        }
        Err(e) => tracing::warn!(
            "cannot open {method} stream: {e}",
            e = jumpstarter_core::error_chain(&e)
        ),
    }
}

impl NetworkClient {
    /// The address the exporter reaches (`tcp://HOST:PORT`, `udp://...`, or a URL); fails
    /// with `INVALID_ARGUMENT` when the exporter config disables it.
    pub async fn address(&self) -> Result<String, ClientError> {
        self.0.call("address", ()).await
    }

    /// Opens one byte stream to the remote end (the `connect` method).
    pub async fn connect(
        &self,
    ) -> Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static, ClientError> {
        self.0.open_stream("connect").await
    }

    /// Listens on `local` (port 0 picks a free one) and forwards every connection to the
    /// driver's `connect`; returns once listening. Upstream's `TcpPortforwardAdapter`.
    ///
    /// ```no_run
    /// # async fn f(net: jumpstarter_drivers::NetworkClient) -> Result<(), jumpstarter_core::ClientError> {
    /// let fwd = net.forward_tcp("127.0.0.1:0".parse().unwrap()).await?;
    /// println!("ssh -p {} root@127.0.0.1", fwd.local_address().rsplit(':').next().unwrap_or(""));
    /// # Ok(()) }
    /// ```
    pub async fn forward_tcp(&self, local: SocketAddr) -> Result<Forwarder, ClientError> {
        self.forward_tcp_method(local, "connect").await
    }

    /// As [`NetworkClient::forward_tcp`], to any `@exportstream` method of the driver.
    pub async fn forward_tcp_method(
        &self,
        local: SocketAddr,
        method: &str,
    ) -> Result<Forwarder, ClientError> {
        forward_tcp(self.0.clone(), local, method).await
    }

    /// Listens on a Unix socket at `path` (a fresh one in a private temporary directory when
    /// `None`) and forwards every connection to `connect`. Upstream's
    /// `UnixPortforwardAdapter`. The socket file is removed when the forwarder is dropped.
    pub async fn forward_unix(&self, path: Option<&Path>) -> Result<Forwarder, ClientError> {
        forward_unix(self.0.clone(), path, "connect").await
    }

    /// Serves this stream (a VNC server's) to a browser's noVNC page: listens on a free
    /// loopback port for WebSocket connections and returns the page's link. Upstream's
    /// `NovncAdapter`; `encrypt` goes into the link (`encrypt=1`, upstream's default).
    pub async fn novnc(&self, encrypt: bool) -> Result<super::Novnc, ClientError> {
        super::novnc(self.0.clone(), "connect", encrypt).await
    }
}

/// Forwards TCP connections accepted on `local` to `method` of `client`.
pub async fn forward_tcp(
    client: DriverClient,
    local: SocketAddr,
    method: &str,
) -> Result<Forwarder, ClientError> {
    let listener = tokio::net::TcpListener::bind(local).await.map_err(|e| {
        ClientError::Io(std::io::Error::new(
            e.kind(),
            jumpstarter_core::Because::boxed(format!("cannot listen on {local}"), e),
        ))
    })?;
    let bound = listener.local_addr()?;
    let method: Arc<str> = method.into();
    let task = super::accept::serve(listener, MAX_FORWARDED, move |conn, _| {
        relay(client.clone(), method.clone(), conn)
    });
    Ok(Forwarder {
        local: format_host_port(&bound.ip().to_string(), bound.port()),
        task,
        cleanup: None,
    })
}

/// Forwards Unix-socket connections accepted at `path` to `method` of `client`.
pub async fn forward_unix(
    client: DriverClient,
    path: Option<&Path>,
    method: &str,
) -> Result<Forwarder, ClientError> {
    let (path, tmp) = match path {
        Some(p) => (p.to_path_buf(), None),
        None => {
            let base = std::env::var_os("XDG_RUNTIME_DIR")
                .map(PathBuf::from)
                .filter(|d| d.is_dir())
                .unwrap_or_else(std::env::temp_dir);
            let dir = tempfile::Builder::new()
                .prefix("jumpstarter-")
                .tempdir_in(base)?;
            (dir.path().join("socket"), Some(dir))
        }
    };
    let listener = tokio::net::UnixListener::bind(&path).map_err(|e| {
        ClientError::Io(std::io::Error::new(
            e.kind(),
            jumpstarter_core::Because::boxed(format!("cannot listen on {}", path.display()), e),
        ))
    })?;
    let method: Arc<str> = method.into();
    let task = super::accept::serve(listener, MAX_FORWARDED, move |conn, _| {
        // The temporary directory lives as long as the listener's task.
        let _tmp = &tmp;
        relay(client.clone(), method.clone(), conn)
    });
    Ok(Forwarder {
        local: path.display().to_string(),
        task,
        cleanup: Some(path),
    })
}

/// The `j NAME` commands of network drivers, as upstream's.
pub fn cli() -> DriverCommand {
    DriverCommand {
        about: "Generic Network Connection",
        build,
        run,
    }
}

fn build(cmd: Command) -> Command {
    cmd.subcommand_required(true)
        .subcommand(
            Command::new("forward-tcp")
                .about("Forward local TCP port to remote network")
                .long_about(
                    "Forward local TCP port to remote network\n\nPORT is the TCP port to listen \
                     on (0 picks a free one), optionally as ADDRESS:PORT.",
                )
                .arg(
                    Arg::new("address")
                        .long("address")
                        .default_value("localhost")
                        .help("Local address to listen on"),
                )
                .arg(Arg::new("port").required(true).value_name("[ADDRESS:]PORT")),
        )
        .subcommand(
            Command::new("forward-unix")
                .about("Forward local Unix domain socket to remote network")
                .long_about(
                    "Forward local Unix domain socket to remote network\n\nPATH is the path of \
                     the Unix domain socket to listen on, defaults to a random path under \
                     $XDG_RUNTIME_DIR.",
                )
                .arg(Arg::new("path").required(false)),
        )
        .subcommand(
            Command::new("address")
                .about("Direct TCP connection to remote network")
                .arg(Arg::new("host").long("host").action(ArgAction::SetTrue))
                .arg(Arg::new("port").long("port").action(ArgAction::SetTrue)),
        )
}

/// Resolves `--address` and `[ADDRESS:]PORT` to the one address to listen on.
async fn listen_address(address: &str, port: &str) -> Result<SocketAddr, ClientError> {
    let bad = || ClientError::Value(format!("invalid port {port:?}: expected [ADDRESS:]PORT"));
    let (host, port) = match port.parse::<u16>() {
        Ok(p) => (address.to_string(), p),
        Err(_) => {
            let (h, p) = split_host_port(port);
            (h, p.parse::<u16>().map_err(|_| bad())?)
        }
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| ClientError::encoding_because(format!("cannot resolve {host:?}"), e))?
        .next()
        .ok_or_else(|| ClientError::Value(format!("{host:?} has no address")))
}

async fn wait_forever() {
    std::future::pending::<()>().await
}

fn run(client: DriverClient, matches: ArgMatches) -> CliFuture {
    Box::pin(async move {
        let net = NetworkClient(client);
        match matches.subcommand() {
            Some(("forward-tcp", m)) => {
                let address = m.get_one::<String>("address").map_or("localhost", |s| s);
                let port = m.get_one::<String>("port").map_or("", |s| s);
                let local = listen_address(address, port).await?;
                let fwd = net.forward_tcp(local).await?;
                println!("{}", fwd.local_address());
                wait_forever().await;
                Ok(())
            }
            Some(("forward-unix", m)) => {
                let path = m.get_one::<String>("path").map(PathBuf::from);
                let fwd = net.forward_unix(path.as_deref()).await?;
                println!("{}", fwd.local_address());
                wait_forever().await;
                Ok(())
            }
            Some(("address", m)) => {
                let addr = net.address().await.map_err(|e| match e {
                    ClientError::Call {
                        error: jumpstarter_core::DriverError::InvalidArgument(msg),
                        ..
                    } => ClientError::Value(format!(
                        "enable_address mode is not true in the exporter configuration: {msg}"
                    )),
                    ClientError::Call {
                        error: jumpstarter_core::DriverError::MethodNotFound(_),
                        ..
                    } => ClientError::Value(
                        "This exporter does not support direct connection yet".into(),
                    ),
                    other => other,
                })?;
                let (host, port) = (m.get_flag("host"), m.get_flag("port"));
                if host == port {
                    println!("{}", strip_scheme(&addr));
                } else {
                    let (h, p) = split_host_port(&addr);
                    println!("{}", if host { h } else { p });
                }
                Ok(())
            }
            _ => Err(ClientError::Value("missing network command".into())),
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn addresses_split_and_strip_as_upstream() {
        assert_eq!(strip_scheme("tcp://127.0.0.1:8080"), "127.0.0.1:8080");
        assert_eq!(strip_scheme("udp://[::1]:8080"), "[::1]:8080");
        assert_eq!(strip_scheme("127.0.0.1:8080"), "127.0.0.1:8080");
        assert_eq!(
            split_host_port("tcp://[::1]:8080"),
            ("::1".into(), "8080".into())
        );
        assert_eq!(
            split_host_port("localhost:22"),
            ("localhost".into(), "22".into())
        );
        assert_eq!(split_host_port("ws://h/x"), ("h/x".into(), String::new()));
        assert_eq!(format_host_port("::1", 5), "[::1]:5");
        assert_eq!(format_host_port("10.0.0.1", 5), "10.0.0.1:5");
    }

    #[tokio::test]
    async fn listen_addresses_take_both_forms() {
        let a = listen_address("127.0.0.1", "0").await.unwrap();
        assert_eq!(a, "127.0.0.1:0".parse().unwrap());
        let a = listen_address("localhost", "[::1]:7").await.unwrap();
        assert_eq!(a, "[::1]:7".parse().unwrap());
        let a = listen_address("localhost", "127.0.0.1:9").await.unwrap();
        assert_eq!(a, "127.0.0.1:9".parse().unwrap());
        for bad in ["x", "70000", "h:", "127.0.0.1:port"] {
            assert!(listen_address("127.0.0.1", bad).await.is_err(), "{bad}");
        }
    }
}
