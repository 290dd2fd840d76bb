//! The router tunnel: one `RouterService.Stream` carrying a whole plaintext HTTP/2
//! connection in DATA frames, presented as a byte stream.
//!
//! The client runs its gRPC channel (or a local socket that `j` connects to) through a
//! tunnel; the exporter serves its session on each tunnel it is told of. Upstream's exporter
//! splices each tunnel to a connection to a session socket (what [`attach`] does with any
//! byte stream); ours hands the tunnel to its session's server in memory
//! ([`attach_frames`] with a [`crate::server::tunnel_conn`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), jumpstarter_core::client::tunnel::TunnelError> {
//! use jumpstarter_core::{client::{channel::TlsSettings, tunnel}, server::tunnel_conn};
//! // What our exporter does with a ListenResponse{router_endpoint, router_token}:
//! let (conn, sink, source) = tunnel_conn();
//! tunnel::attach_frames("router.example.com:443", &TlsSettings::default(), "jwt", sink, source, std::future::pending()).await?;
//! // ...and `conn` goes to `server::serve_tunnels`.
//! # drop(conn);
//! # Ok(()) }
//! ```

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, OnceLock},
    task::{Context, Poll},
    time::Duration,
};

use futures::{StreamExt, stream::BoxStream};
use hyper_util::rt::TokioIo;
use jumpstarter_proto::v1::{StreamRequest, StreamResponse};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{
    Status,
    transport::{Channel, Endpoint, Uri},
};

use crate::{
    client::{
        CallMetadata, ClientError, SessionChannel,
        channel::{
            AuthChannel, ControllerAuth, Keepalive, TlsSettings, connect_authenticated_with,
        },
    },
    wire::settings::{CONNECTION_WINDOW, STREAM_WINDOW},
    wire::{
        frames::{CHUNK, EndOfStream, FrameSink, FrameSource, IoSink, IoSource, splice_with},
        stream_rpc,
    },
};

/// Bytes buffered between a [`open`]ed tunnel and its user, per direction.
pub const TUNNEL_BUFFER: usize = 4 * CHUNK;

/// Keepalive of the connection to a router: a router that vanishes without closing its
/// connections (host down, network cut) is noticed within interval + timeout. The timeout is
/// not shorter because a ping answer can queue behind a full send buffer on a slow uplink
/// (e.g. while flashing an image).
pub const ROUTER_KEEPALIVE: Keepalive = Keepalive {
    interval: Duration::from_secs(10),
    timeout: Duration::from_secs(10),
};

/// Keepalive of a gRPC channel run through a tunnel (end to end, to the exporter's session):
/// the backstop for a tunnel that stops carrying bytes without ending.
pub const TUNNELED_KEEPALIVE: Keepalive = Keepalive {
    interval: Duration::from_secs(10),
    timeout: Duration::from_secs(10),
};

/// How long [`attach`] keeps trying to reach the router with the same token (the peer may
/// reach it a moment earlier or later; the token stays valid).
pub const ATTACH_RETRY: Duration = Duration::from_secs(10);

/// How long [`connect_retrying`] tries one ticket before asking for a new one: shorter than
/// [`ATTACH_RETRY`], so that the exporter is still trying the same token.
const SAME_TICKET_WINDOW: Duration = Duration::from_secs(7);

/// First and largest wait between two attempts to reach a router.
const FIRST_DELAY: Duration = Duration::from_millis(250);
const MAX_DELAY: Duration = Duration::from_secs(4);

/// Default of `jmp shell --retry-timeout` (`JMP_RETRY_TIMEOUT`), as upstream.
pub const DEFAULT_RETRY_TIMEOUT: Duration = Duration::from_secs(300);

/// Why a tunnel could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// The router could not be reached (TLS, DNS, connection refused...).
    #[error("cannot reach router {endpoint}")]
    Router {
        /// The router endpoint.
        endpoint: String,
        /// Why.
        source: ClientError,
    },
    /// No ticket for a new tunnel (e.g. `Dial` failed).
    #[error(transparent)]
    Ticket(TicketError),
    /// Retrying did not help within the retry timeout.
    #[error("gave up after {waited_secs}s: {last}")]
    GaveUp {
        /// How long it was tried.
        waited_secs: u64,
        /// The last failure.
        last: Box<TunnelError>,
    },
    /// Given up on because the caller cancelled.
    #[error("cancelled while connecting to router {endpoint}")]
    Cancelled {
        /// The router endpoint.
        endpoint: String,
    },
    /// Local I/O failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl TunnelError {
    /// Whether the failure may go away by itself (router restarting, exporter reconnecting),
    /// so that trying again later makes sense. Bad TLS settings or certificates, refused
    /// tickets (lease ended, permission denied, not found) are final.
    pub fn is_transient(&self) -> bool {
        match self {
            TunnelError::Router { source, .. } => {
                let text = crate::error_chain(&source).to_ascii_lowercase();
                ![
                    "certificate",
                    "host:port",
                    "bad host name",
                    "printable ascii",
                ]
                .iter()
                .any(|bad| text.contains(bad))
            }
            TunnelError::Ticket(t) => t.transient,
            TunnelError::GaveUp { .. } | TunnelError::Cancelled { .. } | TunnelError::Io(_) => {
                false
            }
        }
    }
}

/// Why a [`TicketSource`] has no ticket, and whether asking again later may help. It says
/// what [`TicketError::error`] says, causes included (its `Display` and `source` are the
/// error's own).
#[derive(Debug)]
pub struct TicketError {
    /// What failed.
    pub error: ClientError,
    /// Whether it may go away by itself (exporter not listening yet, controller restarting).
    pub transient: bool,
}

impl TicketError {
    /// A failure that asking again later may cure.
    pub fn transient(error: ClientError) -> Self {
        Self {
            error,
            transient: true,
        }
    }

    /// A failure that will not go away (lease ended, permission denied...).
    pub fn permanent(error: ClientError) -> Self {
        Self {
            error,
            transient: false,
        }
    }
}

impl std::fmt::Display for TicketError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for TicketError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl From<ClientError> for TicketError {
    fn from(error: ClientError) -> Self {
        Self::permanent(error)
    }
}

impl From<std::io::Error> for TicketError {
    fn from(error: std::io::Error) -> Self {
        Self::permanent(error.into())
    }
}

/// What happens to tunnels, for telling the user.
#[derive(Debug)]
pub enum TunnelEvent<'a> {
    /// Opening a tunnel failed with a transient error; trying again in a moment.
    Retrying {
        /// The failure.
        error: &'a TunnelError,
        /// How much of the retry timeout is left.
        remaining: Duration,
    },
    /// A tunnel opened after one or more retries.
    Reconnected {
        /// The router endpoint.
        endpoint: &'a str,
    },
    /// A tunnel's router connection broke (or the router refused the stream): whatever
    /// used the tunnel sees its connection end.
    Lost {
        /// The router endpoint.
        endpoint: &'a str,
        /// What happened.
        reason: &'a str,
    },
}

/// Receives [`TunnelEvent`]s.
pub type TunnelEvents = Arc<dyn Fn(TunnelEvent<'_>) + Send + Sync>;

/// How [`connect_retrying`] handles transient failures.
#[derive(Clone)]
pub struct RetryPolicy {
    /// How long to keep trying (zero: fail at the first error).
    pub timeout: Duration,
    /// Told about retries, reconnections and lost tunnels.
    pub events: Option<TunnelEvents>,
    /// HTTP/2 keepalive of the router channels (a client config's `grpcOptions`; default
    /// [`ROUTER_KEEPALIVE`]).
    pub keepalive: Keepalive,
}

impl std::fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("timeout", &self.timeout)
            .field("events", &self.events.is_some())
            .field("keepalive", &self.keepalive)
            .finish()
    }
}

impl Default for RetryPolicy {
    /// No retries, [`ROUTER_KEEPALIVE`].
    fn default() -> Self {
        Self::new(Duration::ZERO)
    }
}

impl RetryPolicy {
    /// Retry for up to `timeout` (zero disables retrying).
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            events: None,
            keepalive: ROUTER_KEEPALIVE,
        }
    }

    /// Use `keepalive` on the router channels (a client config's `grpcOptions`).
    pub fn with_keepalive(mut self, keepalive: Keepalive) -> Self {
        self.keepalive = keepalive;
        self
    }

    /// Also report [`TunnelEvent`]s to `events`.
    pub fn with_events(mut self, events: TunnelEvents) -> Self {
        self.events = Some(events);
        self
    }

    fn emit(&self, event: TunnelEvent<'_>) {
        if let Some(events) = &self.events {
            events(event);
        }
    }
}

/// A TLS connection to a router, authenticated with one stream's token; the stream itself
/// is opened by [`RouterLink::splice`].
pub struct RouterLink {
    endpoint: String,
    channel: AuthChannel,
}

impl std::fmt::Debug for RouterLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterLink")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

/// Connects to the router at `endpoint` with the stream token `token` (one attempt).
pub async fn connect(
    endpoint: &str,
    tls: &TlsSettings,
    token: &str,
) -> Result<RouterLink, TunnelError> {
    connect_with(endpoint, tls, token, ROUTER_KEEPALIVE).await
}

/// [`connect`] with the given HTTP/2 keepalive (an exporter's `grpcOptions` apply to its
/// router channels too, as upstream's exporter applies them).
pub async fn connect_with(
    endpoint: &str,
    tls: &TlsSettings,
    token: &str,
    keepalive: Keepalive,
) -> Result<RouterLink, TunnelError> {
    let _step = crate::client::timings::step("router connection (TCP, TLS, HTTP/2)");
    let channel =
        connect_authenticated_with(endpoint, tls, &ControllerAuth::bearer(token), keepalive)
            .await
            .map_err(|source| TunnelError::Router {
                endpoint: endpoint.to_string(),
                source,
            })?;
    Ok(RouterLink {
        endpoint: endpoint.to_string(),
        channel,
    })
}

/// Gets a ticket from `source` and connects to its router, retrying transient failures
/// (router unreachable, exporter not listening) with capped exponential backoff for up to
/// `policy.timeout`. A ticket is tried for a few seconds (its exporter side tries as long,
/// see [`attach`]), then a new one is asked for.
pub async fn connect_retrying<S: TicketSource + ?Sized>(
    source: &S,
    tls: &TlsSettings,
    policy: &RetryPolicy,
) -> Result<RouterLink, TunnelError> {
    let start = Instant::now();
    let deadline = start + policy.timeout;
    let mut delay = FIRST_DELAY;
    let mut retried = false;
    loop {
        let attempt = match source.ticket().await {
            Err(e) => Err(TunnelError::Ticket(e)),
            Ok(ticket) => {
                let ticket_deadline = Instant::now() + SAME_TICKET_WINDOW;
                loop {
                    match connect_with(
                        &ticket.router_endpoint,
                        tls,
                        &ticket.router_token,
                        policy.keepalive,
                    )
                    .await
                    {
                        Ok(link) => break Ok(link),
                        Err(e) => {
                            let now = Instant::now();
                            if !e.is_transient() || now >= ticket_deadline || now + delay > deadline
                            {
                                break Err(e);
                            }
                            policy.emit(TunnelEvent::Retrying {
                                error: &e,
                                remaining: deadline - now,
                            });
                            retried = true;
                            tokio::time::sleep(delay).await;
                            delay = (delay * 2).min(MAX_DELAY);
                        }
                    }
                }
            }
        };
        let e = match attempt {
            Ok(link) => {
                if retried {
                    policy.emit(TunnelEvent::Reconnected {
                        endpoint: &link.endpoint,
                    });
                }
                return Ok(link);
            }
            Err(e) => e,
        };
        let now = Instant::now();
        if !e.is_transient() || now + delay > deadline {
            return Err(if policy.timeout.is_zero() || !e.is_transient() {
                e
            } else {
                TunnelError::GaveUp {
                    waited_secs: (now - start).as_secs(),
                    last: Box::new(e),
                }
            });
        }
        policy.emit(TunnelEvent::Retrying {
            error: &e,
            remaining: deadline - now,
        });
        retried = true;
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_DELAY);
    }
}

impl RouterLink {
    /// The router endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Opens the router stream and splices it to `io` in the background.
    ///
    /// The tunnel lives until either side ends it, the router refuses or drops it, or
    /// `cancel` resolves (which half-closes our side, and the router then ends the pair).
    /// When the peer ends cleanly, `io`'s write side is shut down. When the router
    /// connection breaks or the router refuses the stream, `io` is dropped at once (both
    /// directions), so whoever holds its other end sees the connection end promptly instead
    /// of waiting for an answer that cannot come; `events` is told ([`TunnelEvent::Lost`]).
    ///
    /// Outgoing bytes flow at once, without waiting for the router's response headers: a Go
    /// router sends those only with the first frame from the peer, and the HTTP/2 client
    /// inside the tunnel speaks first.
    pub fn splice<IO>(
        self,
        io: IO,
        cancel: impl Future<Output = ()> + Send + 'static,
        events: Option<TunnelEvents>,
    ) where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        self.splice_noting(io, cancel, events, Arc::default());
    }

    fn splice_noting<IO>(
        self,
        io: IO,
        cancel: impl Future<Output = ()> + Send + 'static,
        events: Option<TunnelEvents>,
        lost: Arc<OnceLock<String>>,
    ) where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (reader, writer) = tokio::io::split(io);
        self.splice_ends(IoSink(writer), IoSource::new(reader), cancel, events, lost);
    }

    /// Like [`RouterLink::splice`], with the peer's bytes going to `sink` and the bytes for
    /// the peer coming from `source` rather than an I/O object (see
    /// [`crate::server::tunnel_conn`]). When the router link breaks, `sink` is failed and `source`
    /// dropped.
    pub fn splice_frames<Snk: FrameSink, Src: FrameSource>(
        self,
        sink: Snk,
        source: Src,
        cancel: impl Future<Output = ()> + Send + 'static,
    ) {
        self.splice_ends(sink, source, cancel, None, Arc::default());
    }

    fn splice_ends<Snk: FrameSink, Src: FrameSource>(
        self,
        sink: Snk,
        source: Src,
        cancel: impl Future<Output = ()> + Send + 'static,
        events: Option<TunnelEvents>,
        lost: Arc<OnceLock<String>>,
    ) {
        let RouterLink { endpoint, channel } = self;
        let (inbound_tx, inbound_rx) =
            tokio::sync::oneshot::channel::<Result<stream_rpc::ResponseFrames, Status>>();
        // The response stream exists only once the router answers: feed it to the splice
        // lazily. Errors become one line naming what failed.
        let inbound: BoxStream<'static, Result<StreamResponse, String>> =
            futures::stream::once(inbound_rx)
                .flat_map(|answer| match answer {
                    Ok(Ok(stream)) => stream.boxed(),
                    Ok(Err(status)) => futures::stream::iter([Err(status)]).boxed(),
                    Err(_) => {
                        futures::stream::iter([Err(Status::cancelled("tunnel closed"))]).boxed()
                    }
                })
                .map(|r| r.map_err(|s| status_text(&s)))
                .boxed();
        let broken = CancellationToken::new();
        let sink = LinkSink {
            inner: sink,
            endpoint: endpoint.clone(),
            events,
            lost,
            broken: broken.clone(),
        };
        // `keep`: the channel lives as long as the request stream, i.e. the tunnel. When the
        // router link breaks, the outbound side stops too, which drops the reading half.
        let mut outbound: BoxStream<'static, StreamRequest> =
            splice_with::<_, StreamRequest, _, _, _, _, _>(
                inbound,
                sink,
                source,
                EndOfStream::Lenient,
                channel.clone(),
            )
            .scan((), |_, item: io::Result<StreamRequest>| {
                futures::future::ready(match item {
                    Ok(frame) => Some(frame),
                    Err(e) => {
                        tracing::debug!("tunnel source failed: {e}", e = crate::error_chain(&e));
                        None
                    }
                })
            })
            .take_until(cancel)
            .take_until(broken.cancelled_owned())
            .boxed();
        // The request body is a bounded queue fed by the splice (backpressure: one frame).
        let (tx, rx) = tokio::sync::mpsc::channel::<StreamRequest>(1);
        tokio::spawn(async move {
            while let Some(frame) = outbound.next().await {
                if tx.send(frame).await.is_err() {
                    break;
                }
            }
        });
        tokio::spawn(async move {
            // Spoken straight over HTTP/2 (see `stream_rpc`): no copy of the payloads.
            let answer = stream_rpc::call(
                channel,
                http::HeaderMap::new(),
                tokio_stream::wrappers::ReceiverStream::new(rx),
            )
            .await
            .map(|(_, frames)| frames);
            if let Err(status) = &answer {
                tracing::debug!(
                    "router {endpoint} refused the stream: {}",
                    status_text(status)
                );
            }
            let _ = inbound_tx.send(answer);
        });
    }
}

/// The status message (without tonic's "h2 protocol error" prefix), or the code when
/// there is none.
fn status_text(s: &Status) -> String {
    let message = s.message();
    let message = message
        .strip_prefix("h2 protocol error: ")
        .unwrap_or(message);
    if message.is_empty() {
        format!("{:?}", s.code())
    } else {
        message.to_string()
    }
}

/// Where the peer's bytes go: a clean end finishes `inner`; a broken router link records
/// why, tells `events`, fails `inner` and stops the whole tunnel.
struct LinkSink<S> {
    inner: S,
    endpoint: String,
    events: Option<TunnelEvents>,
    lost: Arc<OnceLock<String>>,
    broken: CancellationToken,
}

impl<S: FrameSink> FrameSink for LinkSink<S> {
    async fn write_chunk(&mut self, data: bytes::Bytes) -> io::Result<()> {
        self.inner.write_chunk(data).await
    }

    async fn finish(self) -> io::Result<()> {
        self.inner.finish().await
    }

    fn fail(self, error: io::Error) {
        let LinkSink {
            inner,
            endpoint,
            events,
            lost,
            broken,
        } = self;
        let text = crate::error_chain(&error);
        let detail = text.strip_prefix("transfer broken: ").unwrap_or(&text);
        let reason = detail.to_string();
        tracing::debug!("router {endpoint}: tunnel lost: {reason}");
        let _ = lost.set(format!(
            "lost the connection to router {endpoint}: {reason}"
        ));
        if let Some(events) = &events {
            events(TunnelEvent::Lost {
                endpoint: &endpoint,
                reason: &reason,
            });
        }
        inner.fail(error);
        broken.cancel();
    }
}

/// Connects to the router at `endpoint` with `token` and splices the stream to `io` in the
/// background (see [`RouterLink::splice`]): what an exporter does with each
/// `ListenResponse` (ours hands the tunnel to its session without a socket, see
/// [`attach_frames`]).
///
/// Returns once the TLS connection to the router is up. A router that cannot be reached is
/// tried again for up to [`ATTACH_RETRY`] (the client may be trying the same token while a
/// restarted router comes back), unless `cancel` resolves first.
pub async fn attach<IO>(
    endpoint: &str,
    tls: &TlsSettings,
    token: &str,
    io: IO,
    cancel: impl Future<Output = ()> + Send + 'static,
) -> Result<(), TunnelError>
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut cancel = Box::pin(cancel);
    let link = reach(endpoint, tls, token, ROUTER_KEEPALIVE, &mut cancel).await?;
    link.splice(io, cancel, None);
    Ok(())
}

/// [`attach`] with the peer's bytes going to `sink` and the bytes for it coming from
/// `source` (see [`RouterLink::splice_frames`]): what the exporter does with each
/// `ListenResponse`, `sink` and `source` being a [`crate::server::tunnel_conn`] to its session.
pub async fn attach_frames<Snk: FrameSink, Src: FrameSource>(
    endpoint: &str,
    tls: &TlsSettings,
    token: &str,
    sink: Snk,
    source: Src,
    cancel: impl Future<Output = ()> + Send + 'static,
) -> Result<(), TunnelError> {
    attach_frames_with(endpoint, tls, token, ROUTER_KEEPALIVE, sink, source, cancel).await
}

/// [`attach_frames`] with the given HTTP/2 keepalive on the router channel (the exporter's
/// `grpcOptions`).
pub async fn attach_frames_with<Snk: FrameSink, Src: FrameSource>(
    endpoint: &str,
    tls: &TlsSettings,
    token: &str,
    keepalive: Keepalive,
    sink: Snk,
    source: Src,
    cancel: impl Future<Output = ()> + Send + 'static,
) -> Result<(), TunnelError> {
    let mut cancel = Box::pin(cancel);
    let link = reach(endpoint, tls, token, keepalive, &mut cancel).await?;
    link.splice_frames(sink, source, cancel);
    Ok(())
}

/// Connects to the router, trying again for up to [`ATTACH_RETRY`] unless `cancel`
/// resolves first.
async fn reach(
    endpoint: &str,
    tls: &TlsSettings,
    token: &str,
    keepalive: Keepalive,
    cancel: &mut Pin<Box<impl Future<Output = ()> + Send + 'static>>,
) -> Result<RouterLink, TunnelError> {
    let deadline = Instant::now() + ATTACH_RETRY;
    let mut delay = FIRST_DELAY;
    loop {
        match connect_with(endpoint, tls, token, keepalive).await {
            Ok(link) => return Ok(link),
            Err(e) => {
                if !e.is_transient() || Instant::now() + delay > deadline {
                    return Err(e);
                }
                tracing::debug!("{e}; trying again", e = crate::error_chain(&e));
                tokio::select! {
                    _ = &mut *cancel => {
                        return Err(TunnelError::Cancelled { endpoint: endpoint.to_string() });
                    }
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(MAX_DELAY);
            }
        }
    }
}

/// The local end of an [`open`]ed tunnel: what is written reaches the peer, what the peer
/// sends can be read. When the router link breaks, reading fails with an error naming the
/// router (rather than a plain end of file).
#[derive(Debug)]
pub struct TunnelStream {
    inner: DuplexStream,
    lost: Arc<OnceLock<String>>,
}

impl AsyncRead for TunnelStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                match this.lost.get() {
                    Some(reason) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        reason.clone(),
                    ))),
                    None => Poll::Ready(Ok(())),
                }
            }
            other => other,
        }
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl RouterLink {
    /// Opens the stream and returns its local end (buffers bounded by [`TUNNEL_BUFFER`]).
    pub fn open(
        self,
        cancel: impl Future<Output = ()> + Send + 'static,
        events: Option<TunnelEvents>,
    ) -> TunnelStream {
        let (ours, theirs) = tokio::io::duplex(TUNNEL_BUFFER);
        let lost: Arc<OnceLock<String>> = Arc::default();
        self.splice_noting(theirs, cancel, events, lost.clone());
        TunnelStream { inner: ours, lost }
    }
}

/// Opens a tunnel (one connection attempt) and returns its local end: what is written there
/// reaches the peer, what the peer sends can be read from it. Buffers are bounded
/// ([`TUNNEL_BUFFER`]).
pub async fn open(
    endpoint: &str,
    tls: &TlsSettings,
    token: &str,
    cancel: impl Future<Output = ()> + Send + 'static,
) -> Result<TunnelStream, TunnelError> {
    Ok(connect(endpoint, tls, token).await?.open(cancel, None))
}

/// Where a tunnel goes: the router endpoint and the token of one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct TunnelTicket {
    /// Router `host:port`.
    pub router_endpoint: String,
    /// The router token (bearer) naming the stream.
    pub router_token: String,
}

/// Gets a fresh [`TunnelTicket`] for every new connection (e.g. by calling `Dial`).
pub trait TicketSource: Send + Sync + 'static {
    /// A ticket for one new tunnel.
    fn ticket(&self) -> impl Future<Output = Result<TunnelTicket, TicketError>> + Send;
}

/// A gRPC channel to an exporter session whose every connection is a new tunnel, with a
/// new ticket from `source`: if the tunnel drops, the channel's next connection redials.
/// No retrying: see [`session_channel_with`].
pub async fn session_channel<S: TicketSource>(
    source: Arc<S>,
    tls: TlsSettings,
) -> Result<SessionChannel, ClientError> {
    session_channel_with(source, tls, RetryPolicy::default()).await
}

/// [`session_channel`], opening each tunnel with [`connect_retrying`] under `policy`. Calls
/// in flight when a tunnel's router link breaks fail at once (UNAVAILABLE, naming the
/// router); HTTP/2 keepalive ([`TUNNELED_KEEPALIVE`]) catches a tunnel that silently stops.
pub async fn session_channel_with<S: TicketSource>(
    source: Arc<S>,
    tls: TlsSettings,
    policy: RetryPolicy,
) -> Result<SessionChannel, ClientError> {
    let endpoint = Endpoint::from_static("http://jumpstarter-tunnel")
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .http2_keep_alive_interval(TUNNELED_KEEPALIVE.interval)
        .keep_alive_timeout(TUNNELED_KEEPALIVE.timeout);
    // Why the first tunnel could not be opened, for an error that says it plainly.
    let failure: Arc<std::sync::Mutex<Option<TunnelError>>> = Arc::default();
    let failed = failure.clone();
    let channel: Channel = endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let source = source.clone();
            let tls = tls.clone();
            let policy = policy.clone();
            let failed = failed.clone();
            async move {
                let link = match connect_retrying(&*source, &tls, &policy).await {
                    Ok(link) => link,
                    Err(e) => {
                        let reason = crate::error_chain(&e);
                        if let Ok(mut f) = failed.lock() {
                            *f = Some(e);
                        }
                        return Err(std::io::Error::other(reason));
                    }
                };
                let io = link.open(std::future::pending(), policy.events.clone());
                Ok::<_, std::io::Error>(TokioIo::new(io))
            }
        }))
        .await
        .map_err(|e| {
            let failure = failure.lock().ok().and_then(|mut f| f.take());
            match failure {
                Some(reason) => ClientError::connect("the exporter", reason),
                None => ClientError::connect("the exporter", e),
            }
        })?;
    Ok(tonic::service::interceptor::InterceptedService::new(
        crate::client::channel::GrpcChannel::new(channel),
        CallMetadata::default(),
    ))
}

#[cfg(test)]
mod ticket_error_tests {
    use super::*;

    #[test]
    fn a_refused_ticket_says_why_through_the_tunnel_error() {
        let refused = ClientError::connect(
            "the exporter of lease l1",
            "Dial: beforeLease hook failed: Hook failed with exit code 5",
        );
        let e = TunnelError::Ticket(TicketError::permanent(refused));
        let said = crate::error_chain(&e);
        assert!(
            said.starts_with("cannot connect to the exporter of lease l1: Dial: "),
            "{said}"
        );
        assert!(said.contains("Hook failed with exit code 5"), "{said}");
    }
}
