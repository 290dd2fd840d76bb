//! The HTTP client of opendal's `http` service: requests go through the exporter's own
//! HTTP(S) client ([`jumpstarter_core::wire::presigned::request`]: hyper on rustls with
//! ring, the system's roots, redirects of `GET`/`HEAD` followed by hand, URLs kept as
//! written), so the `http` scheme needs no other HTTP stack.
//!
//! A response body streams through a bounded channel: at most [`BODY_QUEUE`] pieces wait
//! for the reader, and a server that sends nothing for [`IDLE_TIMEOUT`] fails the read.

use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use futures::Stream;
use http::{Request, Response};
use http_body_util::BodyExt;
use jumpstarter_core::wire::presigned;
use opendal::{Buffer, Error, ErrorKind, HttpBody, HttpTransport, HttpTransporter};
use tokio::sync::mpsc;

/// A response body that sends nothing for this long fails the read.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Pieces of a response body that wait for the reader at most.
const BODY_QUEUE: usize = 4;

/// opendal's HTTP transport on the exporter's HTTP client.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ExporterHttp;

impl ExporterHttp {
    /// The transport as opendal takes it.
    pub(super) fn transporter() -> HttpTransporter {
        HttpTransporter::new(Self)
    }
}

impl HttpTransport for ExporterHttp {
    async fn fetch(&self, req: Request<Buffer>) -> opendal::Result<Response<HttpBody>> {
        let (parts, body) = req.into_parts();
        let url = parts.uri.to_string();
        let resp = presigned::request(parts.method, &url, &parts.headers, body.to_bytes())
            .await
            .map_err(|e| {
                let kind = match e.kind() {
                    std::io::ErrorKind::InvalidInput => ErrorKind::ConfigInvalid,
                    _ => ErrorKind::Unexpected,
                };
                let temporary = matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::TimedOut
                );
                let e = Error::new(kind, "HTTP request failed")
                    .with_context("url", presigned::redact(&url))
                    .set_source(e);
                if temporary { e.set_temporary() } else { e }
            })?;
        let (parts, incoming) = resp.into_parts();
        let (tx, rx) = mpsc::channel(BODY_QUEUE);
        tokio::spawn(pump(incoming, tx, presigned::redact(&url)));
        Ok(Response::from_parts(
            parts,
            HttpBody::new(BodyStream(rx), None),
        ))
    }
}

/// Moves a response body into the channel; stops when the reader is gone.
async fn pump(
    mut body: hyper::body::Incoming,
    tx: mpsc::Sender<opendal::Result<Buffer>>,
    url: String,
) {
    loop {
        let piece = match tokio::time::timeout(IDLE_TIMEOUT, body.frame()).await {
            Err(_) => Err(Error::new(
                ErrorKind::Unexpected,
                format!(
                    "HTTP response body from {url} sent nothing for {}s",
                    IDLE_TIMEOUT.as_secs()
                ),
            )
            .set_temporary()),
            Ok(None) => return,
            Ok(Some(Err(e))) => Err(Error::new(
                ErrorKind::Unexpected,
                format!("HTTP response body from {url} broke off"),
            )
            .set_source(e)
            .set_temporary()),
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Ok(Buffer::from(data)),
                // Trailers carry no bytes.
                Err(_) => continue,
            },
        };
        let failed = piece.is_err();
        if tx.send(piece).await.is_err() || failed {
            return;
        }
    }
}

/// The reading end of a body channel, as a stream (`Send + Sync + Unpin`, as opendal's
/// [`HttpBody`] needs).
struct BodyStream(mpsc::Receiver<opendal::Result<Buffer>>);

impl Stream for BodyStream {
    type Item = opendal::Result<Buffer>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}
