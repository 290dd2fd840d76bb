//! Serving a [`Session`] on a Unix socket (local mode) or TCP (direct mode).

use std::{
    future::Future,
    io,
    path::Path,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use jumpstarter_proto::v1::exporter_service_server::ExporterServiceServer;
use subtle::ConstantTimeEq;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, UnixListener},
};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{
    Request, Status,
    transport::{Server, server::Connected},
};

use crate::{
    CoreError, Session,
    server::{
        TunnelConn,
        listener::{ConnectionGuard, ConnectionLimits, tls_acceptor},
    },
    wire::settings::{CONNECTION_WINDOW, PASSPHRASE_METADATA, STREAM_WINDOW},
};

/// How long a stopping server lets its connections finish what they are doing (a call, a
/// transfer) before it cuts them: a stalled upload or an open console must not keep an
/// exporter from stopping.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How a TCP listener is secured.
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// Certificate chain and private key (PEM) for TLS; `None` serves plaintext HTTP/2.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
    /// A passphrase every RPC must carry in `x-jumpstarter-passphrase`.
    pub passphrase: Option<String>,
    /// Connection limit, handshake and first-frame timeouts, keepalive of the listener.
    pub limits: ConnectionLimits,
}

/// Checks the passphrase of every request, in constant time.
#[derive(Clone)]
struct PassphraseCheck(Option<Arc<[u8]>>);

impl tonic::service::Interceptor for PassphraseCheck {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.0 else {
            return Ok(req);
        };
        let given = req
            .metadata()
            .get(PASSPHRASE_METADATA)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if bool::from(given.ct_eq(expected)) {
            Ok(req)
        } else {
            Err(Status::unauthenticated("invalid or missing passphrase"))
        }
    }
}

fn router(
    session: &Arc<Session>,
    opts: &ServeOptions,
    keepalive: Option<&ConnectionLimits>,
) -> tonic::transport::server::Router {
    let check = PassphraseCheck(opts.passphrase.as_ref().map(|p| Arc::from(p.as_bytes())));
    let svc = session.services();
    // Larger HTTP/2 windows keep bulk transfers (flashing images) flowing at line rate.
    let mut builder = Server::builder()
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(STREAM_WINDOW))
        .initial_connection_window_size(Some(CONNECTION_WINDOW))
        .max_frame_size(Some(crate::wire::frames::MAX_FRAME));
    if let Some(limits) = keepalive {
        builder = limits.keepalive(builder);
    }
    builder
        .add_service(ExporterServiceServer::with_interceptor(
            svc.clone(),
            check.clone(),
        ))
        .add_service(tonic::service::interceptor::InterceptedService::new(
            crate::server::StreamService(svc),
            check,
        ))
}

/// Accepted connections with Nagle's algorithm off. `Server::tcp_nodelay` only applies to
/// listeners tonic binds itself; without this, small replies wait for the peer's delayed ACK
/// (tens of milliseconds) whenever two writes meet on one connection.
pub fn nodelay_incoming(
    listener: TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use futures::StreamExt;
    TcpListenerStream::new(listener).map(|conn| {
        let conn = conn?;
        conn.set_nodelay(true)?;
        Ok(conn)
    })
}

/// Where to put a session socket in the private directory `dir`.
///
/// grpc C-core (the upstream Python client) sends the percent-encoded socket path as the
/// HTTP/2 `:authority`, which servers built on the `http` crate reject unless a `@` follows
/// the last `%` (the part before it then parses as userinfo): hence the `@` in the name.
pub fn local_socket_path(dir: &Path) -> std::path::PathBuf {
    dir.join("exporter@socket")
}

/// Binds a Unix socket at `path` and returns the server future, which serves `session`
/// until `shutdown` resolves. Binding happens before this returns, so clients may connect
/// as soon as it does.
///
/// The socket is created with the process umask; put it in a private directory.
pub fn serve_unix(
    session: Arc<Session>,
    path: &Path,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<impl Future<Output = Result<(), CoreError>> + Send + 'static, CoreError> {
    let listener = UnixListener::bind(path).map_err(|e| CoreError::Listen {
        addr: path.display().to_string(),
        source: e,
    })?;
    let router = router(&session, &ServeOptions::default(), None);
    Ok(serve_bounded(
        router,
        UnixListenerStream::new(listener),
        shutdown,
    ))
}

/// Serves `session` on each connection `tunnels` yields (an exporter's router tunnels,
/// handed over in memory, see [`crate::server::tunnel_conn`]) until `shutdown` resolves.
pub async fn serve_tunnels(
    session: Arc<Session>,
    tunnels: impl futures::Stream<Item = TunnelConn> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), CoreError> {
    use futures::StreamExt;
    router(&session, &ServeOptions::default(), None)
        .serve_with_incoming_shutdown(tunnels.map(Ok::<_, io::Error>), shutdown)
        .await
        .map_err(CoreError::Serve)
}

/// Serves `session` on an already bound TCP listener until `shutdown` resolves.
pub async fn serve_tcp(
    session: Arc<Session>,
    listener: TcpListener,
    opts: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), CoreError> {
    let tls = match &opts.tls {
        None => None,
        Some((cert, key)) => {
            let pem = |b: &[u8], what: &'static str| {
                String::from_utf8(b.to_vec()).map_err(|_| CoreError::NotPem(what))
            };
            let identity = crate::auth::IssuedCert {
                cert_pem: pem(cert, "certificate")?,
                key_pem: pem(key, "key")?,
            };
            Some(tls_acceptor(&identity, None).map_err(CoreError::TlsIdentity)?)
        }
    };
    let guard = ConnectionGuard::new("exporter", opts.limits);
    serve_bounded(
        router(&session, &opts, Some(&opts.limits)),
        guard.incoming(listener, tls),
        shutdown,
    )
    .await
}

/// Serves `incoming` until `shutdown` resolves, then gives open connections
/// [`SHUTDOWN_GRACE`] to finish before cutting them (their calls are cancelled, with the
/// runtime still running, so drivers clean up).
async fn serve_bounded<IO>(
    router: tonic::transport::server::Router,
    incoming: impl futures::Stream<Item = io::Result<IO>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), CoreError>
where
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    use futures::StreamExt;
    let cut = CancellationToken::new();
    let incoming = {
        let cut = cut.clone();
        incoming.map(move |conn| {
            conn.map(|io| Severable::new(io, cut.clone(), "the exporter is shutting down"))
        })
    };
    let (stopping, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = router.serve_with_incoming_shutdown(incoming, async move {
        shutdown.await;
        let _ = stopping.send(());
    });
    tokio::pin!(server);
    let done = tokio::select! {
        r = &mut server => Some(r),
        Ok(()) = stopped => None,
    };
    let r = match done {
        Some(r) => r,
        None => match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
            Ok(r) => r,
            Err(_) => {
                tracing::info!(
                    "connections still busy {}s after the stop: closing them",
                    SHUTDOWN_GRACE.as_secs()
                );
                cut.cancel();
                server.await
            }
        },
    };
    r.map_err(CoreError::Serve)
}

/// A connection that fails (`ConnectionAborted`, saying `why`) as soon as `cut` is
/// cancelled: HTTP/2 then ends at once, cancelling the calls it carries, where a graceful
/// shutdown would wait for long streams.
pub(crate) struct Severable<T> {
    io: T,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    why: &'static str,
}

impl<T> Severable<T> {
    /// Wraps `io`.
    pub(crate) fn new(io: T, cut: CancellationToken, why: &'static str) -> Self {
        Self {
            io,
            cut: Box::pin(cut.cancelled_owned()),
            why,
        }
    }

    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.cut.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(io::ErrorKind::ConnectionAborted, self.why));
        }
        Ok(())
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Severable<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Severable<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: Connected> Connected for Severable<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}
