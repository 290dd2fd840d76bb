//! The controller's two small HTTP/1.1 endpoints (`/metrics`, easy login's
//! `/v1/auth/config`) share this: a bounded accept loop, and hyper serving one request per
//! connection (then closing it).

use std::{future::Future, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Method, Response, StatusCode, header::CONTENT_TYPE};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
};

/// Largest request head read (hyper's smallest buffer limit); a larger one gets
/// `431 Request Header Fields Too Large`.
pub const MAX_REQUEST: usize = 8 * 1024;

/// What a route answers.
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The `Content-Type` of `body`.
    pub content_type: &'static str,
    /// The body.
    pub body: String,
}

/// Accepts connections on `listener` until `shutdown` resolves, running `handle` on each
/// with at most `max_connections` at once (further connections are closed, not queued) and
/// cutting any that takes longer than `timeout`. `name` appears in log lines.
pub async fn serve<F, Fut>(
    name: &'static str,
    listener: TcpListener,
    max_connections: usize,
    timeout: Duration,
    handle: F,
    shutdown: impl Future<Output = ()> + Send,
) where
    F: Fn(TcpStream) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    tokio::pin!(shutdown);
    loop {
        let (conn, peer) = tokio::select! {
            _ = &mut shutdown => return,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("{name} listener: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // Busy: close rather than queue.
            drop(conn);
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if tokio::time::timeout(timeout, handle(conn)).await.is_err() {
                tracing::debug!("{name} request from {peer} timed out");
            }
        });
    }
}

/// Serves one request on `io` with hyper: `route` gets its method and path (without the
/// query) and says what to answer; the connection is closed after the response.
pub async fn respond<IO, R, Fut>(io: IO, route: R)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    R: Fn(Method, String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    let route = Arc::new(route);
    let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let reply = route(req.method().clone(), req.uri().path().to_owned());
        async move {
            let Reply {
                status,
                content_type,
                body,
            } = reply.await;
            let mut response = Response::new(Full::new(Bytes::from(body)));
            *response.status_mut() = status;
            response
                .headers_mut()
                .insert(CONTENT_TYPE, http::HeaderValue::from_static(content_type));
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .max_buf_size(MAX_REQUEST)
        .serve_connection(TokioIo::new(io), service)
        .await;
    if let Err(e) = served {
        tracing::debug!("HTTP connection: {e}");
    }
}
