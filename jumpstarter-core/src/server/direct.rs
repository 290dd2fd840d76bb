//! The exporter side of the direct path: clients on the exporter's network bypass the
//! router.
//!
//! An exporter started with a direct listener ([`DirectServer`]) serves each lease's
//! session on a TLS port too. For every lease it makes a fresh in-memory CA, a server
//! certificate for the advertised host and one client certificate
//! ([`LeaseCredentials`]), and advertises them in `GetReportResponse.alternative_endpoints`
//! — which only the lease holder can read, through its authenticated router tunnel. The
//! listener accepts only TLS clients presenting that lease's client certificate; when the
//! lease ends, the CA is dropped and every direct connection of the lease is cut, so the
//! credentials stop working at once. The client side is `client::direct`.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt as _;
use jumpstarter_proto::v1::{Endpoint, exporter_service_server::ExporterServiceServer};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
    task::JoinHandle,
};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::{
    Session,
    auth::{CertificateAuthority, IssuedCert, TlsError},
    error_chain,
    server::{
        Severable,
        listener::{ConnectionGuard, ConnectionLimits, GuardedConn, ListenerStats, tls_acceptor},
    },
    wire::settings::{CONNECTION_WINDOW, STREAM_WINDOW},
};

/// Accepted connections waiting for the lease's server (more are refused).
const ACCEPT_QUEUE: usize = 16;

/// Why the exporter's direct listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DirectError {
    /// `--direct-listener` / `directListener` is not `[HOST:]PORT`.
    #[error("invalid direct listener {spec:?}: {reason}")]
    Spec {
        /// What was given.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// The listener could not be bound.
    #[error("cannot listen on {addr} for direct connections")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The lease's certificates could not be made.
    #[error("cannot issue direct-path certificates for {host}")]
    Certificates {
        /// The advertised host.
        host: String,
        /// Why.
        source: TlsError,
    },
}

/// Where the exporter listens for direct clients and the host it tells them to use.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectListenerSpec {
    /// Address to bind (`host:port`, IPv6 in brackets).
    pub bind: String,
    /// Host clients connect to; goes into the server certificate.
    pub advertise_host: String,
    /// Connection limit, handshake and first-frame timeouts, keepalive.
    pub limits: ConnectionLimits,
}

impl DirectListenerSpec {
    /// Parses `[HOST:]PORT` (default host `0.0.0.0`). The advertised host is `advertise`,
    /// else the listener host, else (a wildcard address) this machine's host name.
    pub fn parse(spec: &str, advertise: Option<&str>) -> Result<Self, DirectError> {
        let bad = |reason: &str| DirectError::Spec {
            spec: spec.to_string(),
            reason: reason.to_string(),
        };
        let s = spec.trim();
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            rest.split_once("]:")
                .ok_or_else(|| bad("expected [IPv6]:PORT"))?
        } else {
            match s.rsplit_once(':') {
                Some((h, _)) if h.contains(':') => {
                    return Err(bad("put an IPv6 address in brackets, e.g. [::1]:7000"));
                }
                Some((h, p)) => (h, p),
                None => ("", s),
            }
        };
        let port: u16 = port
            .parse()
            .map_err(|_| bad("expected [HOST:]PORT with a port number 0-65535"))?;
        let host = if host.is_empty() { "0.0.0.0" } else { host };
        if host.chars().any(|c| c.is_whitespace() || c == '/') {
            return Err(bad("the host contains spaces or '/'"));
        }
        let bind = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let wildcard = host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_unspecified());
        let advertise_host = match advertise.map(str::trim).filter(|a| !a.is_empty()) {
            Some(a) => a.trim_start_matches('[').trim_end_matches(']').to_string(),
            None if wildcard => machine_host_name(),
            None => host.to_string(),
        };
        if advertise_host
            .chars()
            .any(|c| c.is_whitespace() || c == '/')
        {
            return Err(bad("the advertised host contains spaces or '/'"));
        }
        Ok(Self {
            bind,
            advertise_host,
            limits: ConnectionLimits::default(),
        })
    }
}

/// This machine's host name, or `127.0.0.1` when it cannot be found.
fn machine_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "127.0.0.1".into())
}

/// `host:port` for an endpoint string (IPv6 hosts in brackets).
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// One lease's direct-path credentials: a fresh CA, the server certificate for the
/// advertised host and the client certificate handed to the lease holder.
pub struct LeaseCredentials {
    ca_pem: String,
    server: IssuedCert,
    client: IssuedCert,
}

impl std::fmt::Debug for LeaseCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseCredentials")
            .field("ca_pem", &self.ca_pem)
            .finish_non_exhaustive()
    }
}

impl LeaseCredentials {
    /// Issues new credentials for `lease`, with a server certificate for `host`. The CA's
    /// key is dropped here: nothing else can ever be signed by it.
    pub fn issue(lease: &str, host: &str) -> Result<Self, DirectError> {
        let err = |source| DirectError::Certificates {
            host: host.to_string(),
            source,
        };
        let ca = CertificateAuthority::generate(&format!("jumpstarter lease {lease} direct CA"))
            .map_err(err)?;
        let server = ca.issue_server_cert(&[host]).map_err(err)?;
        let client = ca
            .issue_client_cert(&format!("jumpstarter lease {lease} client"))
            .map_err(err)?;
        Ok(Self {
            ca_pem: ca.cert_pem().to_string(),
            server,
            client,
        })
    }

    /// The CA certificate (PEM) both sides trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The advertisement for `endpoint` (`host:port`): CA to trust, client identity.
    pub fn endpoint(&self, endpoint: &str) -> Endpoint {
        Endpoint {
            endpoint: endpoint.to_string(),
            certificate: self.ca_pem.clone(),
            client_certificate: self.client.cert_pem.clone(),
            client_private_key: self.client.key_pem.clone(),
        }
    }

    /// Server TLS that requires a client certificate issued by this lease's CA.
    pub(crate) fn server_tls(&self) -> Result<TlsAcceptor, TlsError> {
        tls_acceptor(&self.server, Some(&self.ca_pem))
    }
}

/// A direct connection, cut as soon as its lease ends, so that none outlives the lease (a
/// graceful HTTP/2 shutdown would wait for long streams).
type LeaseBound = Severable<TcpStream>;

/// The lease currently served: where accepted connections go, its TLS, and its end.
struct ActiveLease {
    queue: mpsc::Sender<GuardedConn<LeaseBound>>,
    tls: TlsAcceptor,
    ended: CancellationToken,
}

/// The exporter's direct listener: bound once, it hands each accepted connection to the
/// current lease's TLS server, and drops it when no lease is being served.
pub struct DirectServer {
    addr: SocketAddr,
    advertise_host: String,
    current: Arc<Mutex<Option<ActiveLease>>>,
    guard: ConnectionGuard,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for DirectServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectServer")
            .field("addr", &self.addr)
            .field("advertise_host", &self.advertise_host)
            .finish_non_exhaustive()
    }
}

impl Drop for DirectServer {
    fn drop(&mut self) {
        self.accept.abort();
        if let Some(lease) = self.slot().take() {
            lease.ended.cancel();
        }
    }
}

impl DirectServer {
    /// Binds the listener of `spec` (must run inside a tokio runtime).
    pub async fn bind(spec: &DirectListenerSpec) -> Result<Self, DirectError> {
        let listener =
            TcpListener::bind(&spec.bind)
                .await
                .map_err(|source| DirectError::Listen {
                    addr: spec.bind.clone(),
                    source,
                })?;
        let addr = listener
            .local_addr()
            .map_err(|source| DirectError::Listen {
                addr: spec.bind.clone(),
                source,
            })?;
        let current: Arc<Mutex<Option<ActiveLease>>> = Arc::default();
        let guard = ConnectionGuard::new("direct", spec.limits);
        let accept = tokio::spawn(accept_loop(listener, current.clone(), guard.clone()));
        Ok(Self {
            addr,
            advertise_host: spec.advertise_host.clone(),
            current,
            guard,
            accept,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The listener's connection counters.
    pub fn stats(&self) -> Arc<ListenerStats> {
        self.guard.stats()
    }

    /// What clients are told to connect to (`host:port`).
    pub fn advertised_endpoint(&self) -> String {
        host_port(&self.advertise_host, self.addr.port())
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<ActiveLease>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves `session` of `lease` on the direct listener until `ended` fires: issues the
    /// lease's credentials, sets them as the session's alternative endpoint, and starts a
    /// TLS server accepting only that lease's client certificate. A lease served before
    /// is cut off first.
    pub fn serve_lease(
        &self,
        lease: &str,
        session: &Arc<Session>,
        ended: CancellationToken,
    ) -> Result<JoinHandle<()>, DirectError> {
        let creds = LeaseCredentials::issue(lease, &self.advertise_host)?;
        let (queue, incoming) = mpsc::channel::<GuardedConn<LeaseBound>>(ACCEPT_QUEUE);
        let tls = creds
            .server_tls()
            .map_err(|source| DirectError::Certificates {
                host: self.advertise_host.clone(),
                source,
            })?;
        let svc = session.services();
        let server = self
            .guard
            .limits()
            .keepalive(Server::builder())
            .tcp_nodelay(true)
            .initial_stream_window_size(Some(STREAM_WINDOW))
            .initial_connection_window_size(Some(CONNECTION_WINDOW))
            .max_frame_size(Some(crate::wire::frames::MAX_FRAME))
            .add_service(ExporterServiceServer::new(svc.clone()))
            .add_service(crate::server::StreamService(svc));
        session.set_alternative_endpoints(vec![creds.endpoint(&self.advertised_endpoint())]);
        if let Some(old) = self.slot().replace(ActiveLease {
            queue,
            tls,
            ended: ended.clone(),
        }) {
            old.ended.cancel();
        }
        let name = lease.to_string();
        let incoming =
            tokio_stream::wrappers::ReceiverStream::new(incoming).map(Ok::<_, std::io::Error>);
        let stop = ended.clone().cancelled_owned();
        let current = self.current.clone();
        Ok(tokio::spawn(async move {
            if let Err(e) = server.serve_with_incoming_shutdown(incoming, stop).await {
                tracing::warn!("lease {name}: direct listener: {}", error_chain(&e));
            }
            // Forget this lease (unless a newer one took its place already).
            let mut slot = current.lock().unwrap_or_else(|p| p.into_inner());
            if slot.as_ref().is_some_and(|l| l.ended.is_cancelled()) {
                *slot = None;
            }
            tracing::debug!("lease {name}: direct listener closed");
        }))
    }
}

/// At most one "no lease is being served" line this often.
const NO_LEASE_WARN_EVERY: Duration = Duration::from_secs(10);

async fn accept_loop(
    listener: TcpListener,
    current: Arc<Mutex<Option<ActiveLease>>>,
    guard: ConnectionGuard,
) {
    // When the last "no lease" line was logged, and the connections closed since.
    let mut no_lease_warned: Option<std::time::Instant> = None;
    let mut no_lease_closed = 0u64;
    loop {
        let (conn, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("direct listener: {e}", e = crate::error_chain(&e));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = conn.set_nodelay(true);
        // Every connection counts against the limit from `accept` (and in the counters),
        // whatever happens to it next.
        let Some(admitted) = guard.admit(conn, Some(peer)) else {
            continue;
        };
        let target = {
            let slot = current.lock().unwrap_or_else(|p| p.into_inner());
            slot.as_ref()
                .filter(|l| !l.ended.is_cancelled())
                .map(|l| (l.queue.clone(), l.tls.clone(), l.ended.clone()))
        };
        let Some((queue, tls, ended)) = target else {
            // Nothing to serve it: closed at once (dropping it gives its slot back). Said
            // in the log, as a client that expected a lease's endpoint here wants to know.
            drop(admitted);
            no_lease_closed += 1;
            if no_lease_warned.is_none_or(|t| t.elapsed() >= NO_LEASE_WARN_EVERY) {
                no_lease_warned = Some(std::time::Instant::now());
                tracing::warn!(
                    "direct listener: closed a connection from {peer}: no lease is being \
                     served ({no_lease_closed} such connection(s) since the last report)"
                );
                no_lease_closed = 0;
            }
            continue;
        };
        let admitted = admitted.map_io(|conn| {
            Severable::new(conn, ended, "the lease of this direct connection ended")
        });
        let guard = guard.clone();
        tokio::spawn(async move {
            match guard.establish(admitted, Some(&tls)).await {
                Ok(conn) => {
                    if queue.try_send(conn).is_err() {
                        tracing::debug!(
                            "direct listener: refused {peer}: too many pending connections"
                        );
                    }
                }
                Err(e) => tracing::debug!(
                    "direct listener: closed {peer}: {e}",
                    e = crate::error_chain(&e)
                ),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::direct::DirectTarget;

    #[test]
    fn listener_specs() {
        let s = DirectListenerSpec::parse("127.0.0.1:0", None).unwrap();
        assert_eq!(s.bind, "127.0.0.1:0");
        assert_eq!(s.advertise_host, "127.0.0.1");
        let s = DirectListenerSpec::parse("7000", Some("lab.example")).unwrap();
        assert_eq!(s.bind, "0.0.0.0:7000");
        assert_eq!(s.advertise_host, "lab.example");
        let s = DirectListenerSpec::parse("0.0.0.0:7000", None).unwrap();
        assert!(!s.advertise_host.is_empty() && s.advertise_host != "0.0.0.0");
        let s = DirectListenerSpec::parse("[::1]:7000", None).unwrap();
        assert_eq!(s.bind, "[::1]:7000");
        assert_eq!(s.advertise_host, "::1");
    }

    #[test]
    fn bad_listener_specs_name_the_input() {
        for bad in ["", "x", "host:", "host:99999", "::1:7000", "a b:1"] {
            let e = DirectListenerSpec::parse(bad, None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
        let e = DirectListenerSpec::parse("1", Some("a/b"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("advertised"), "{e}");
    }

    #[test]
    fn advertisement_carries_a_usable_client_identity() {
        let creds = LeaseCredentials::issue("l1", "127.0.0.1").unwrap();
        let ep = creds.endpoint("127.0.0.1:7000");
        assert_eq!(ep.endpoint, "127.0.0.1:7000");
        assert_eq!(ep.certificate, creds.ca_pem());
        assert!(ep.certificate.contains("BEGIN CERTIFICATE"));
        assert!(ep.client_certificate.contains("BEGIN CERTIFICATE"));
        assert!(ep.client_private_key.contains("PRIVATE KEY"));
        assert_ne!(ep.client_certificate, creds.server.cert_pem);
        let target = DirectTarget::from_endpoint(&ep).unwrap();
        assert_eq!(target.endpoint(), "127.0.0.1:7000");
        // Every lease gets its own CA.
        let other = LeaseCredentials::issue("l2", "127.0.0.1").unwrap();
        assert_ne!(other.ca_pem(), creds.ca_pem());
    }
}
