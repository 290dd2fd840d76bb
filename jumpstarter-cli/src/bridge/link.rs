//! The connection the proxies' driver calls take to the Python child: hyper's HTTP/2
//! client on the child's Unix socket, with nothing in between.
//!
//! A tonic `Channel` puts a `Buffer` in front of hyper: one more task that every request
//! crosses on its way to the connection's task, often waking the runtime's other worker
//! thread. On the 2-core machine the bridge benchmark runs on, that hop was a good part of
//! the exporter's ~250 µs of CPU per forwarded call (`docs/performance.md`). Calls handed
//! straight to hyper's `SendRequest` skip it. Byte streams and resources keep the session's
//! tonic channel ([`super::host::Conn::session`]): they are long-lived, so the hop does not
//! matter there.

use std::{
    future::Future,
    path::Path,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use jumpstarter_core::wire::{
    frames::MAX_FRAME,
    settings::{CONNECTION_WINDOW, STREAM_WINDOW},
};
use tokio::task::JoinHandle;

/// One HTTP/2 connection to the child, shared by every call (HTTP/2 multiplexes them).
#[derive(Clone, Debug)]
pub(crate) struct ChildLink {
    send: http2::SendRequest<tonic::body::Body>,
}

impl ChildLink {
    /// Connects to the child's socket; the returned task drives the connection (abort it to
    /// close it; it ends by itself when the child goes).
    pub(crate) async fn connect(path: &Path) -> Result<(Self, JoinHandle<()>), LinkError> {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(LinkError::Connect)?;
        let (send, conn) = http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(MAX_FRAME)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(LinkError::Handshake)?;
        let task = tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("the connection to the Python driver host ended: {e}");
            }
        });
        Ok((ChildLink { send }, task))
    }
}

/// Why [`ChildLink::connect`] failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error("cannot connect to its socket")]
    Connect(#[source] std::io::Error),
    #[error("HTTP/2 handshake failed")]
    Handshake(#[source] hyper::Error),
}

impl tower::Service<http::Request<tonic::body::Body>> for ChildLink {
    type Response = http::Response<ScrubbedBody>;
    type Error = hyper::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<tonic::body::Body>) -> Self::Future {
        // tonic's generated clients send a path only; HTTP/2 wants the scheme and authority
        // too (a tonic Channel adds them). The path is a gRPC method's, always valid.
        let mut parts = req.uri().clone().into_parts();
        parts.scheme = Some(http::uri::Scheme::HTTP);
        parts.authority = Some(http::uri::Authority::from_static("localhost"));
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
        let answer = self.send.send_request(req);
        Box::pin(async move {
            let (mut parts, body) = answer.await?.into_parts();
            parts.headers.remove(tonic::Status::GRPC_STATUS_DETAILS);
            Ok(http::Response::from_parts(parts, ScrubbedBody(body)))
        })
    }
}

/// A response body without `grpc-status-details-bin` in its trailers: tonic 0.14 panics on
/// one that is not base64 (as `jumpstarter_core::client::channel::GrpcChannel` explains);
/// nothing here reads status details.
pub(crate) struct ScrubbedBody(hyper::body::Incoming);

impl http_body::Body for ScrubbedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.0).poll_frame(cx).map(|frame| {
            frame.map(|frame| {
                frame.map(|frame| match frame.into_trailers() {
                    Ok(mut trailers) => {
                        trailers.remove(tonic::Status::GRPC_STATUS_DETAILS);
                        http_body::Frame::trailers(trailers)
                    }
                    Err(frame) => frame,
                })
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0.size_hint()
    }
}
