//! One accept path for every network listener that serves gRPC (the controller's, the
//! router's and the exporter's direct listener): a bound on concurrent connections, a bound
//! on the TLS handshake, a bound on the time to the first HTTP/2 frame, and HTTP/2
//! keepalive pings, with counters for the metrics and a rate-limited warning when the limit
//! is hit.
//!
//! A connection counts against the limit from `accept` until it is closed. One that does
//! not finish its TLS handshake within [`ConnectionLimits::handshake_timeout`], or whose
//! first bytes after it are not the HTTP/2 client preface and a SETTINGS frame header
//! within [`ConnectionLimits::first_frame_timeout`], is closed, so idle sockets cannot hold
//! file descriptors or slots. A connection over the limit is closed at once (the
//! established ones keep working).

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, BufReader, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore, mpsc},
};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        self, RootCertStore,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
        server::WebPkiClientVerifier,
    },
};
use tonic::transport::server::Connected;

use crate::auth::{IssuedCert, TlsError};

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The preface plus the header of the SETTINGS frame that must follow it.
const PREFACE_AND_SETTINGS_HEADER: usize = 24 + 9;
/// The HTTP/2 frame type of SETTINGS.
const SETTINGS: u8 = 0x4;
/// At most one "limit reached" warning per listener this often.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// Established connections waiting for the HTTP/2 server to take them.
const READY_QUEUE: usize = 64;

/// Bounds of one listener (see the module documentation). The binaries expose each as a
/// flag; `docs/security.md` lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Concurrent connections (established or still handshaking); more are closed at once.
    pub max_connections: usize,
    /// Time from `accept` to the end of the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time from the end of the TLS handshake (or `accept`, without TLS) to the HTTP/2
    /// preface and the header of the first frame.
    pub first_frame_timeout: Duration,
    /// HTTP/2 PING interval on an established connection.
    pub keepalive_interval: Duration,
    /// A connection whose PING is not answered within this long is closed.
    pub keepalive_timeout: Duration,
    /// A connection this old is asked to close (HTTP/2 GOAWAY; its calls in flight finish);
    /// `None`: connections live as long as their peers keep them.
    pub max_connection_age: Option<Duration>,
    /// After [`ConnectionLimits::max_connection_age`], how long calls in flight may take
    /// before the connection is closed anyway.
    pub max_connection_age_grace: Option<Duration>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: Duration::from_secs(10),
            first_frame_timeout: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
            max_connection_age: None,
            max_connection_age_grace: None,
        }
    }
}

/// The default of [`ConnectionLimits::max_connections`]: far above a lab's exporters and
/// clients, and below the usual 1024 open files of a process started from a shell only
/// when combined with the files a server keeps open anyway.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1000;

impl ConnectionLimits {
    /// Applies the keepalive settings to a tonic server builder.
    pub fn keepalive<L>(
        &self,
        builder: tonic::transport::Server<L>,
    ) -> tonic::transport::Server<L> {
        let mut builder = builder
            .http2_keepalive_interval(Some(self.keepalive_interval))
            .http2_keepalive_timeout(Some(self.keepalive_timeout));
        if let Some(age) = self.max_connection_age {
            builder = builder.max_connection_age(age);
        }
        if let Some(grace) = self.max_connection_age_grace {
            builder = builder.max_connection_age_grace(grace);
        }
        builder
    }
}

/// Counters of one listener, for the metrics.
#[derive(Debug, Default)]
pub struct ListenerStats {
    name: &'static str,
    open: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    handshake_timeouts: AtomicU64,
    handshake_failures: AtomicU64,
    first_frame_timeouts: AtomicU64,
    not_http2: AtomicU64,
    limit: AtomicU64,
}

impl ListenerStats {
    /// The listener's name (the `listener` label).
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// Connections open now (handshaking or established).
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }
    /// Connections accepted within the limit since start.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
    /// Connections closed at once because the limit was reached.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
    /// Connections closed for not finishing the TLS handshake in time.
    pub fn handshake_timeouts(&self) -> u64 {
        self.handshake_timeouts.load(Ordering::Relaxed)
    }
    /// Connections whose TLS handshake failed.
    pub fn handshake_failures(&self) -> u64 {
        self.handshake_failures.load(Ordering::Relaxed)
    }
    /// Connections closed for not sending the HTTP/2 preface and first frame in time.
    pub fn first_frame_timeouts(&self) -> u64 {
        self.first_frame_timeouts.load(Ordering::Relaxed)
    }
    /// Connections closed because their first bytes were not HTTP/2.
    pub fn not_http2(&self) -> u64 {
        self.not_http2.load(Ordering::Relaxed)
    }

    /// The counters in Prometheus text format, labelled `listener="NAME"`.
    pub fn prometheus(&self) -> String {
        prometheus(&[self])
    }
}

/// The counters of several listeners in Prometheus text format (each metric's HELP and
/// TYPE once, one sample per listener, labelled `listener="NAME"`).
pub fn prometheus(listeners: &[&ListenerStats]) -> String {
    type Get = fn(&ListenerStats) -> u64;
    let metrics: [(&str, &str, &str, Get); 8] = [
        (
            "jumpstarter_listener_connections",
            "gauge",
            "Connections open now (handshaking or established).",
            ListenerStats::open,
        ),
        (
            "jumpstarter_listener_max_connections",
            "gauge",
            "The concurrent connection limit.",
            |s| s.limit.load(Ordering::Relaxed),
        ),
        (
            "jumpstarter_listener_accepted_total",
            "counter",
            "Connections accepted within the limit.",
            ListenerStats::accepted,
        ),
        (
            "jumpstarter_listener_refused_total",
            "counter",
            "Connections closed at once because the limit was reached.",
            ListenerStats::refused,
        ),
        (
            "jumpstarter_listener_handshake_timeouts_total",
            "counter",
            "Connections closed for not finishing the TLS handshake in time.",
            ListenerStats::handshake_timeouts,
        ),
        (
            "jumpstarter_listener_handshake_failures_total",
            "counter",
            "Connections whose TLS handshake failed.",
            ListenerStats::handshake_failures,
        ),
        (
            "jumpstarter_listener_first_frame_timeouts_total",
            "counter",
            "Connections closed for not sending the HTTP/2 preface in time.",
            ListenerStats::first_frame_timeouts,
        ),
        (
            "jumpstarter_listener_not_http2_total",
            "counter",
            "Connections closed because they did not speak HTTP/2.",
            ListenerStats::not_http2,
        ),
    ];
    let mut s = String::new();
    for (metric, kind, help, get) in metrics {
        s.push_str(&format!("# HELP {metric} {help}\n# TYPE {metric} {kind}\n"));
        for l in listeners {
            s.push_str(&format!("{metric}{{listener=\"{}\"}} {}\n", l.name, get(l)));
        }
    }
    s
}

/// The limits, counters and slots of one listener; cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct ConnectionGuard {
    inner: Arc<GuardInner>,
}

#[derive(Debug)]
struct GuardInner {
    limits: ConnectionLimits,
    stats: Arc<ListenerStats>,
    slots: Arc<Semaphore>,
    /// When the last "limit reached" warning was logged.
    last_warning: Mutex<Option<Instant>>,
    /// Refusals since that warning.
    refused_since_warning: AtomicU64,
}

/// An accepted connection holding one of the listener's slots, before its handshake.
#[derive(Debug)]
pub struct Admitted<T> {
    io: T,
    peer: Option<SocketAddr>,
    slot: Slot,
}

impl<T> Admitted<T> {
    /// The same admission (slot and peer) for the connection wrapped by `f`.
    pub fn map_io<U>(self, f: impl FnOnce(T) -> U) -> Admitted<U> {
        Admitted {
            io: f(self.io),
            peer: self.peer,
            slot: self.slot,
        }
    }
}

/// A slot of the limit, given back (and the gauge lowered) when dropped.
#[derive(Debug)]
struct Slot {
    _permit: OwnedSemaphorePermit,
    stats: Arc<ListenerStats>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a connection was closed before reaching the HTTP/2 server.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The TLS handshake took longer than allowed.
    #[error("TLS handshake not finished within {0:?}")]
    TlsTimeout(Duration),
    /// The TLS handshake failed.
    #[error("TLS handshake failed")]
    Tls(#[source] io::Error),
    /// The HTTP/2 preface did not arrive in time.
    #[error("no HTTP/2 preface within {0:?}")]
    FirstFrameTimeout(Duration),
    /// The connection closed or failed before the preface.
    #[error("connection lost before the HTTP/2 preface")]
    Read(#[source] io::Error),
    /// The first bytes were not the HTTP/2 preface and a SETTINGS frame.
    #[error("not HTTP/2 (no client preface)")]
    NotHttp2,
}

impl ConnectionGuard {
    /// A guard named `name` (the metrics' `listener` label and the log lines).
    pub fn new(name: &'static str, limits: ConnectionLimits) -> Self {
        let stats = Arc::new(ListenerStats {
            name,
            limit: AtomicU64::new(limits.max_connections as u64),
            ..Default::default()
        });
        Self {
            inner: Arc::new(GuardInner {
                limits,
                stats,
                slots: Arc::new(Semaphore::new(limits.max_connections)),
                last_warning: Mutex::new(None),
                refused_since_warning: AtomicU64::new(0),
            }),
        }
    }

    /// The limits.
    pub fn limits(&self) -> &ConnectionLimits {
        &self.inner.limits
    }

    /// The counters.
    pub fn stats(&self) -> Arc<ListenerStats> {
        self.inner.stats.clone()
    }

    /// Takes a slot for `io`, or closes it (counted, with a rate-limited warning) when the
    /// limit is reached.
    pub fn admit<T>(&self, io: T, peer: Option<SocketAddr>) -> Option<Admitted<T>> {
        let g = &self.inner;
        match g.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                g.stats.open.fetch_add(1, Ordering::Relaxed);
                g.stats.accepted.fetch_add(1, Ordering::Relaxed);
                Some(Admitted {
                    io,
                    peer,
                    slot: Slot {
                        _permit: permit,
                        stats: g.stats.clone(),
                    },
                })
            }
            Err(_) => {
                g.stats.refused.fetch_add(1, Ordering::Relaxed);
                g.refused_since_warning.fetch_add(1, Ordering::Relaxed);
                let mut last = g.last_warning.lock().unwrap_or_else(|p| p.into_inner());
                if last.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                    *last = Some(Instant::now());
                    let n = g.refused_since_warning.swap(0, Ordering::Relaxed);
                    tracing::warn!(
                        "{} listener: connection limit of {} reached; closed {n} new \
                         connection(s) (latest from {}); raise the limit with the \
                         listener's --max-connections flag if this is legitimate load",
                        g.stats.name,
                        g.limits.max_connections,
                        peer.map_or_else(|| "?".to_string(), |p| p.to_string()),
                    );
                }
                None
            }
        }
    }

    /// The TLS handshake (when `tls` is given) and the HTTP/2 preface of an admitted
    /// connection, each within its timeout; the error closes the connection.
    pub async fn establish<T>(
        &self,
        admitted: Admitted<T>,
        tls: Option<&TlsAcceptor>,
    ) -> Result<GuardedConn<T>, HandshakeError>
    where
        T: AsyncRead + AsyncWrite + Unpin,
    {
        let limits = self.inner.limits;
        let stats = &self.inner.stats;
        let Admitted { io, peer, slot } = admitted;
        let mut io = match tls {
            None => Transport::Plain(io),
            Some(acceptor) => {
                let buffered = BufReader::with_capacity(crate::wire::settings::TLS_READ_BUFFER, io);
                match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(buffered))
                    .await
                {
                    Err(_) => {
                        stats.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
                        return Err(HandshakeError::TlsTimeout(limits.handshake_timeout));
                    }
                    Ok(Err(e)) => {
                        stats.handshake_failures.fetch_add(1, Ordering::Relaxed);
                        return Err(HandshakeError::Tls(e));
                    }
                    Ok(Ok(s)) => Transport::Tls(Box::new(s)),
                }
            }
        };
        let mut prefix = [0u8; PREFACE_AND_SETTINGS_HEADER];
        match tokio::time::timeout(limits.first_frame_timeout, io.read_exact(&mut prefix)).await {
            Err(_) => {
                stats.first_frame_timeouts.fetch_add(1, Ordering::Relaxed);
                return Err(HandshakeError::FirstFrameTimeout(
                    limits.first_frame_timeout,
                ));
            }
            Ok(Err(e)) => {
                stats.not_http2.fetch_add(1, Ordering::Relaxed);
                return Err(HandshakeError::Read(e));
            }
            Ok(Ok(_)) => {}
        }
        if !is_http2_start(&prefix) {
            stats.not_http2.fetch_add(1, Ordering::Relaxed);
            return Err(HandshakeError::NotHttp2);
        }
        Ok(GuardedConn {
            io,
            prefix,
            replayed: 0,
            peer,
            _slot: slot,
        })
    }

    /// Accepts on `listener` until the returned stream is dropped: each connection is
    /// admitted (or closed over the limit), handshaken in its own task and handed over once
    /// it has sent the HTTP/2 preface. Use with tonic's `serve_with_incoming*`.
    pub fn incoming(
        &self,
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
    ) -> impl futures::Stream<Item = io::Result<GuardedConn<TcpStream>>> + Send + 'static {
        let (ready, rx) = mpsc::channel(READY_QUEUE);
        let guard = self.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    () = ready.closed() => return,
                };
                let (conn, peer) = match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(
                            "{} listener: accept: {e}",
                            guard.inner.stats.name,
                            e = crate::error_chain(&e)
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let _ = conn.set_nodelay(true);
                let Some(admitted) = guard.admit(conn, Some(peer)) else {
                    continue;
                };
                let (guard, tls, ready) = (guard.clone(), tls.clone(), ready.clone());
                tokio::spawn(async move {
                    match guard.establish(admitted, tls.as_ref()).await {
                        Ok(conn) => {
                            let _ = ready.send(Ok(conn)).await;
                        }
                        Err(e) => tracing::debug!(
                            "{} listener: closed {peer}: {e}",
                            guard.inner.stats.name,
                            e = crate::error_chain(&e)
                        ),
                    }
                });
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}

fn is_http2_start(prefix: &[u8; PREFACE_AND_SETTINGS_HEADER]) -> bool {
    // Frame header: 24-bit length, type, flags, 31-bit stream id (0 for SETTINGS).
    prefix[..24] == PREFACE[..]
        && prefix[24 + 3] == SETTINGS
        && prefix[24 + 5..24 + 9] == [0, 0, 0, 0]
}

/// A TLS acceptor for an HTTP/2 (gRPC) listener presenting `identity` (certificate chain
/// and key, PEM); with `client_ca_pem`, clients must present a certificate it issued.
pub fn tls_acceptor(
    identity: &IssuedCert,
    client_ca_pem: Option<&str>,
) -> Result<TlsAcceptor, TlsError> {
    let invalid = |reason: String| TlsError::Invalid {
        path: "<memory>".into(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(identity.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            invalid(format!(
                "server certificate: {e}",
                e = crate::error_chain(&e)
            ))
        })?;
    let key = PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes())
        .map_err(|e| invalid(format!("server key: {e}", e = crate::error_chain(&e))))?;
    let provider = Arc::new(crate::tls::tls_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(crate::error_chain(&e)))?;
    let builder = match client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                let cert = cert
                    .map_err(|e| invalid(format!("client CA: {e}", e = crate::error_chain(&e))))?;
                roots
                    .add(cert)
                    .map_err(|e| invalid(format!("client CA: {e}", e = crate::error_chain(&e))))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| invalid(format!("client CA: {e}", e = crate::error_chain(&e))))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        invalid(format!(
            "server certificate and key: {e}",
            e = crate::error_chain(&e)
        ))
    })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

enum Transport<T> {
    Plain(T),
    /// TLS over a read buffer (see [`crate::wire::settings::TLS_READ_BUFFER`]).
    Tls(Box<tokio_rustls::server::TlsStream<BufReader<T>>>),
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Transport<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(t) => Pin::new(t).poll_read(cx, buf),
            Transport::Tls(t) => Pin::new(t).poll_read(cx, buf),
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Transport<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(t) => Pin::new(t).poll_write(cx, buf),
            Transport::Tls(t) => Pin::new(t).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(t) => Pin::new(t).poll_flush(cx),
            Transport::Tls(t) => Pin::new(t).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(t) => Pin::new(t).poll_shutdown(cx),
            Transport::Tls(t) => Pin::new(t).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(t) => Pin::new(t).poll_write_vectored(cx, bufs),
            Transport::Tls(t) => Pin::new(t).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Transport::Plain(t) => t.is_write_vectored(),
            Transport::Tls(t) => t.is_write_vectored(),
        }
    }
}

/// A connection past its handshake and preface, holding its slot until dropped; the bytes
/// read to check the preface are handed to the HTTP/2 server first.
pub struct GuardedConn<T> {
    io: Transport<T>,
    prefix: [u8; PREFACE_AND_SETTINGS_HEADER],
    replayed: usize,
    peer: Option<SocketAddr>,
    _slot: Slot,
}

impl<T> std::fmt::Debug for GuardedConn<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedConn")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for GuardedConn<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.replayed < this.prefix.len() {
            let rest = &this.prefix[this.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for GuardedConn<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// What a [`GuardedConn`] tells the server about its peer.
#[derive(Debug, Clone, Copy)]
pub struct GuardedConnInfo {
    /// The peer's address.
    pub peer: Option<SocketAddr>,
}

impl<T: Send + 'static> Connected for GuardedConn<T> {
    type ConnectInfo = GuardedConnInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        GuardedConnInfo { peer: self.peer }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preface_and_a_settings_header_are_http2() {
        let mut p = [0u8; PREFACE_AND_SETTINGS_HEADER];
        p[..24].copy_from_slice(PREFACE);
        p[24 + 3] = SETTINGS;
        assert!(is_http2_start(&p));
        p[24 + 3] = 0x1; // HEADERS first
        assert!(!is_http2_start(&p));
        let mut junk = [b'G'; PREFACE_AND_SETTINGS_HEADER];
        junk[..4].copy_from_slice(b"GET ");
        assert!(!is_http2_start(&junk));
    }

    #[tokio::test]
    async fn over_the_limit_a_connection_is_refused_and_a_slot_comes_back_on_close() {
        let guard = ConnectionGuard::new(
            "test",
            ConnectionLimits {
                max_connections: 2,
                ..Default::default()
            },
        );
        let a = guard.admit((), None).expect("first within the limit");
        let _b = guard.admit((), None).expect("second within the limit");
        assert!(guard.admit((), None).is_none(), "third over the limit");
        assert_eq!(guard.stats().refused(), 1);
        assert_eq!(guard.stats().open(), 2);
        drop(a);
        assert_eq!(guard.stats().open(), 1);
        assert!(guard.admit((), None).is_some(), "a closed slot is reusable");
        assert!(
            guard
                .stats()
                .prometheus()
                .contains("jumpstarter_listener_refused_total{listener=\"test\"} 1")
        );
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_after_the_first_frame_timeout() {
        let guard = ConnectionGuard::new(
            "test",
            ConnectionLimits {
                first_frame_timeout: Duration::from_millis(200),
                ..Default::default()
            },
        );
        let (a, _b) = tokio::io::duplex(64);
        let admitted = guard.admit(a, None).expect("slot");
        let err = guard.establish(admitted, None).await.unwrap_err();
        assert!(matches!(err, HandshakeError::FirstFrameTimeout(_)), "{err}");
        assert_eq!(guard.stats().first_frame_timeouts(), 1);
        assert_eq!(guard.stats().open(), 0, "the slot is given back");
    }

    #[tokio::test]
    async fn the_preface_is_replayed_to_the_server() {
        use tokio::io::AsyncWriteExt as _;
        let guard = ConnectionGuard::new("test", ConnectionLimits::default());
        let (a, mut b) = tokio::io::duplex(256);
        let mut hello = PREFACE.to_vec();
        hello.extend_from_slice(&[0, 0, 0, SETTINGS, 0, 0, 0, 0, 0, b'x']);
        b.write_all(&hello).await.unwrap();
        let admitted = guard.admit(a, None).expect("slot");
        let mut conn = guard.establish(admitted, None).await.unwrap();
        let mut got = vec![0u8; hello.len()];
        conn.read_exact(&mut got).await.unwrap();
        assert_eq!(got, hello);
    }
}
