//! The standalone router's Prometheus endpoint (`GET /metrics` over HTTP/1.1, one request
//! per connection): the router's counters and its listener's (connections open, limit,
//! refused over the limit, handshake and first-frame timeouts), the same metrics the
//! controller serves for its in-process router.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Method, Response, StatusCode, header::CONTENT_TYPE};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use jumpstarter_core::server::listener::ListenerStats;
use tokio::net::TcpListener;

use crate::router::RouterStats;

/// Scrapes served at once; more connections are closed, not queued.
const MAX_CONNECTIONS: usize = 8;
/// A scrape that takes longer is cut.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head read.
const MAX_REQUEST: usize = 8 * 1024;

/// The text of one scrape.
pub fn render(router: &RouterStats, listener: &ListenerStats) -> String {
    let mut text = router.prometheus();
    text.push_str(&listener.prometheus());
    text
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves; anything else gets 404
/// (405 for another method).
pub async fn serve(
    listener: TcpListener,
    router: Arc<RouterStats>,
    stats: Arc<ListenerStats>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let conn = tokio::select! {
            _ = &mut shutdown => return,
            r = listener.accept() => match r {
                Ok((conn, _)) => conn,
                Err(e) => {
                    tracing::warn!("metrics listener: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(conn);
            continue;
        };
        let (router, stats) = (router.clone(), stats.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let service =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (status, body) = match (req.method(), req.uri().path()) {
                        (&Method::GET, "/metrics") => (StatusCode::OK, render(&router, &stats)),
                        (&Method::GET, _) => (
                            StatusCode::NOT_FOUND,
                            "not found; metrics are at /metrics\n".to_string(),
                        ),
                        _ => (StatusCode::METHOD_NOT_ALLOWED, String::new()),
                    };
                    let mut response = Response::new(Full::new(Bytes::from(body)));
                    *response.status_mut() = status;
                    response.headers_mut().insert(
                        CONTENT_TYPE,
                        http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                    );
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
            let served = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .max_buf_size(MAX_REQUEST)
                .serve_connection(TokioIo::new(conn), service);
            match tokio::time::timeout(REQUEST_TIMEOUT, served).await {
                Ok(Err(e)) => tracing::debug!("metrics connection: {e}"),
                Err(_) => tracing::debug!("metrics request timed out"),
                Ok(Ok(())) => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Router, RouterConfig, RouterTokenKey};
    use jumpstarter_core::server::listener::{ConnectionGuard, ConnectionLimits};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn metrics_are_served_and_other_paths_are_not_found() {
        let (key, _) = RouterTokenKey::generate().unwrap();
        let router = Router::new(key, RouterConfig::default());
        let guard = ConnectionGuard::new(
            "router",
            ConnectionLimits {
                max_connections: 7,
                ..ConnectionLimits::default()
            },
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, router.stats(), guard.stats(), async {
            let _ = rx.await;
        }));
        let request = |head: &'static str| async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(head.as_bytes()).await.unwrap();
            let mut s = String::new();
            c.read_to_string(&mut s).await.unwrap();
            s
        };
        let ok = request("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(
            ok.contains("jumpstarter_listener_max_connections{listener=\"router\"} 7"),
            "{ok}"
        );
        assert!(ok.contains("jumpstarter_router_tunnels_total 0"), "{ok}");
        let nf = request("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(nf.starts_with("HTTP/1.1 404"), "{nf}");
        let post = request("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let junk = request("\x16\x03\x01 not http\r\n\r\n").await;
        assert!(!junk.contains("200 OK"), "{junk}");
        let _ = tx.send(());
        task.await.unwrap();
    }
}
