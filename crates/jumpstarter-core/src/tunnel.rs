//! The router tunnel: one `RouterService.Stream` carrying a whole plaintext HTTP/2
//! connection in DATA frames, presented as a byte stream.
//!
//! Both ends of a distributed session do what the upstream tools do: the exporter splices
//! each tunnel to a fresh connection to its session socket, the client runs its gRPC
//! channel (or a local socket that `j` connects to) through it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), jumpstarter_core::tunnel::TunnelError> {
//! use jumpstarter_core::{channel::TlsSettings, tunnel};
//! // What the exporter does with a ListenResponse{router_endpoint, router_token}:
//! let session = tokio::net::UnixStream::connect("/run/session@socket").await?;
//! tunnel::attach("router.example.com:443", &TlsSettings::default(), "jwt", session, std::future::pending()).await?;
//! # Ok(()) }
//! ```

use std::{future::Future, sync::Arc};

use futures::{StreamExt, stream::BoxStream};
use hyper_util::rt::TokioIo;
use jumpstarter_proto::v1::{
    StreamRequest, StreamResponse, router_service_client::RouterServiceClient,
};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream};
use tonic::{
    Status,
    transport::{Channel, Endpoint, Uri},
};

use crate::{
    channel::{ControllerAuth, TlsSettings, connect_authenticated},
    client::{CallMetadata, ClientError, SessionChannel},
    frames::{CHUNK, splice},
    serve::{CONNECTION_WINDOW, STREAM_WINDOW},
};

/// Bytes buffered between a [`open`]ed tunnel and its user, per direction.
pub const TUNNEL_BUFFER: usize = 4 * CHUNK;

/// Why a tunnel could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// The router could not be reached (TLS, DNS, connection refused...).
    #[error("router {endpoint}: {source}")]
    Router {
        /// The router endpoint.
        endpoint: String,
        /// Why.
        source: ClientError,
    },
    /// Local I/O failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Opens a router stream with `token` and splices it to `io` in the background.
///
/// Returns once the TLS connection to the router is up; the tunnel then lives until either
/// side ends it, the router refuses or drops it, or `cancel` resolves (which half-closes our
/// side, and the router then ends the pair). When it ends, `io` is shut down or dropped, so
/// whoever holds its other end sees the end of the connection.
///
/// Outgoing bytes flow at once, without waiting for the router's response headers: a Go
/// router sends those only with the first frame from the peer, and the HTTP/2 client inside
/// the tunnel speaks first.
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
    let channel = connect_authenticated(endpoint, tls, &ControllerAuth::bearer(token))
        .await
        .map_err(|source| TunnelError::Router {
            endpoint: endpoint.to_string(),
            source,
        })?;
    let (inbound_tx, inbound_rx) =
        tokio::sync::oneshot::channel::<Result<tonic::Streaming<StreamResponse>, Status>>();
    // The response stream exists only once the router answers: feed it to the splice lazily.
    let inbound: BoxStream<'static, Result<StreamResponse, Status>> =
        futures::stream::once(inbound_rx)
            .flat_map(|answer| match answer {
                Ok(Ok(stream)) => stream.boxed(),
                Ok(Err(status)) => futures::stream::iter([Err(status)]).boxed(),
                Err(_) => futures::stream::iter([Err(Status::cancelled("tunnel closed"))]).boxed(),
            })
            .boxed();
    // `keep`: the channel lives as long as the request stream, i.e. the tunnel.
    let mut outbound: BoxStream<'static, StreamRequest> =
        splice::<_, StreamRequest, _, _, _, _>(inbound, io, channel.clone())
            .take_until(cancel)
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
    let endpoint = endpoint.to_string();
    tokio::spawn(async move {
        let mut client = RouterServiceClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let answer = client
            .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map(|r| r.into_inner());
        if let Err(status) = &answer {
            tracing::warn!(
                "router {endpoint} refused the stream: {} ({:?})",
                status.message(),
                status.code()
            );
        }
        let _ = inbound_tx.send(answer);
    });
    Ok(())
}

/// Opens a tunnel and returns its local end: what is written there reaches the peer, what
/// the peer sends can be read from it. Buffers are bounded ([`TUNNEL_BUFFER`]).
pub async fn open(
    endpoint: &str,
    tls: &TlsSettings,
    token: &str,
    cancel: impl Future<Output = ()> + Send + 'static,
) -> Result<DuplexStream, TunnelError> {
    let (ours, theirs) = tokio::io::duplex(TUNNEL_BUFFER);
    attach(endpoint, tls, token, theirs, cancel).await?;
    Ok(ours)
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
    fn ticket(&self) -> impl Future<Output = Result<TunnelTicket, ClientError>> + Send;
}

/// A gRPC channel to an exporter session whose every connection is a new tunnel, with a
/// new ticket from `source`: if the tunnel drops, the channel's next connection redials.
pub async fn session_channel<S: TicketSource>(
    source: Arc<S>,
    tls: TlsSettings,
) -> Result<SessionChannel, ClientError> {
    let endpoint = Endpoint::from_static("http://jumpstarter-tunnel")
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW);
    let channel: Channel = endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let source = source.clone();
            let tls = tls.clone();
            async move {
                let t = source.ticket().await.map_err(std::io::Error::other)?;
                let io = open(
                    &t.router_endpoint,
                    &tls,
                    &t.router_token,
                    std::future::pending(),
                )
                .await
                .map_err(std::io::Error::other)?;
                Ok::<_, std::io::Error>(TokioIo::new(io))
            }
        }))
        .await
        .map_err(|e| ClientError::Connect {
            target: "exporter (through the router)".into(),
            message: crate::client::error_chain(&e),
        })?;
    Ok(tonic::service::interceptor::InterceptedService::new(
        channel,
        CallMetadata::default(),
    ))
}
