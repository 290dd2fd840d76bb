//! The controller's two small HTTP/1.1 endpoints (`/metrics`, easy login's
//! `/v1/auth/config`) share this: a bounded accept loop and a one-request, `Connection:
//! close` exchange. Nothing here needs a full HTTP stack.

use std::{future::Future, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// Largest request head read.
pub const MAX_REQUEST: usize = 8 * 1024;

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

/// What [`read_request_line`] found.
pub enum Request {
    /// The method and the path (without its query).
    Line(String, String),
    /// The head grew past [`MAX_REQUEST`].
    TooLarge,
    /// The peer closed or failed before a whole head arrived.
    Closed,
}

/// Reads a request head and returns its method and path.
pub async fn read_request_line<S: AsyncRead + Unpin>(conn: &mut S) -> Request {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        if buf.len() >= MAX_REQUEST {
            return Request::TooLarge;
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return Request::Closed,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.lines().next().unwrap_or_default().split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    Request::Line(method.to_string(), path.to_string())
}

/// Writes one response and closes the connection.
pub async fn reply<S: AsyncWrite + Unpin>(
    conn: &mut S,
    status: &str,
    content_type: &str,
    body: &str,
) {
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(response.as_bytes()).await;
    let _ = conn.shutdown().await;
}
