//! Small HTTP/1.1 endpoints beside the gRPC servers (the controller's and the router's
//! `/metrics`, the controller's easy-login `/v1/auth/config`): a bounded accept loop, and
//! hyper serving one request per connection (then closing it).

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

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
                    tracing::warn!("{name} listener: {e}", e = crate::error_chain(&e));
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
    respond_with_headers(io, move |method, path, _headers| route(method, path)).await
}

/// [`respond`], with the request's headers given to `route` too.
pub async fn respond_with_headers<IO, R, Fut>(io: IO, route: R)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    R: Fn(Method, String, &http::HeaderMap) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    let route = Arc::new(route);
    let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let reply = route(
            req.method().clone(),
            req.uri().path().to_owned(),
            req.headers(),
        );
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
        tracing::debug!("HTTP connection: {e}", e = crate::error_chain(&e));
    }
}

/// Produces the OpenMetrics page of one metrics scrape.
pub type MetricsRender =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = String> + Send>> + Send + Sync>;

/// Scrapes served at once; more connections are closed, not queued.
const METRICS_CONNECTIONS: usize = 8;
/// A scrape that takes longer is cut.
const METRICS_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `GET /metrics` on `listener` until `shutdown` resolves: the OpenMetrics page from
/// `render` (see [`crate::metrics`]) to a scraper whose `Accept` header asks for it (Prometheus
/// does), else the same page in the Prometheus text format 0.0.4; another path gets 404,
/// another method 405.
pub async fn serve_metrics(
    listener: TcpListener,
    render: MetricsRender,
    shutdown: impl Future<Output = ()> + Send,
) {
    let handle = move |conn: TcpStream| {
        let render = render.clone();
        respond_with_headers(conn, move |method, path, headers| {
            let render = render.clone();
            let openmetrics = crate::metrics::accepts_openmetrics(
                headers
                    .get(http::header::ACCEPT)
                    .and_then(|v| v.to_str().ok()),
            );
            async move {
                let (status, body) = match (method, path.as_str()) {
                    (Method::GET, "/metrics") if openmetrics => (StatusCode::OK, render().await),
                    (Method::GET, "/metrics") => (
                        StatusCode::OK,
                        crate::metrics::openmetrics_to_text(&render().await),
                    ),
                    (Method::GET, _) => (
                        StatusCode::NOT_FOUND,
                        "not found; metrics are at /metrics\n".to_string(),
                    ),
                    _ => (StatusCode::METHOD_NOT_ALLOWED, String::new()),
                };
                Reply {
                    status,
                    content_type: if openmetrics && status == StatusCode::OK {
                        crate::metrics::OPENMETRICS_CONTENT_TYPE
                    } else {
                        crate::metrics::TEXT_CONTENT_TYPE
                    },
                    body,
                }
            }
        })
    };
    serve(
        "metrics",
        listener,
        METRICS_CONNECTIONS,
        METRICS_TIMEOUT,
        handle,
        shutdown,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn metrics_are_served_and_other_paths_and_methods_are_not() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let render: MetricsRender = Arc::new(|| {
            Box::pin(async {
                "# TYPE x counter\nx_total 1 # {lease_id=\"l\"} 1\n# EOF\n".to_string()
            })
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_metrics(listener, render, async {
            let _ = rx.await;
        }));
        let request = |head: String| async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(head.as_bytes()).await.unwrap();
            let mut s = String::new();
            c.read_to_string(&mut s).await.unwrap();
            s
        };
        let get = |path: &str| request(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"));
        let ok = get("/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        // Without an Accept header for it: the Prometheus text format, no exemplar.
        assert!(ok.contains("text/plain; version=0.0.4"), "{ok}");
        assert!(ok.ends_with("# TYPE x_total counter\nx_total 1\n"), "{ok}");
        let om = request(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;\
             version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\r\n"
                .into(),
        )
        .await;
        assert!(
            om.contains("application/openmetrics-text; version=1.0.0"),
            "{om}"
        );
        assert!(
            om.ends_with("x_total 1 # {lease_id=\"l\"} 1\n# EOF\n"),
            "{om}"
        );
        let nf = get("/nope").await;
        assert!(nf.starts_with("HTTP/1.1 404"), "{nf}");
        assert!(nf.ends_with("not found; metrics are at /metrics\n"), "{nf}");
        let post =
            request("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".into()).await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let junk = request("\x16\x03\x01 not http\r\n\r\n".into()).await;
        assert!(!junk.contains("200 OK"), "{junk}");
        let _ = tx.send(());
        task.await.unwrap();
    }
}
