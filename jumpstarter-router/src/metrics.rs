//! The standalone router's Prometheus endpoint (`GET /metrics` over HTTP/1.1, one request
//! per connection): the router's counters and its listener's (connections open, limit,
//! refused over the limit, handshake and first-frame timeouts), the same metrics the
//! controller serves for its in-process router.

use std::{future::Future, sync::Arc};

use jumpstarter_core::server::{http1, listener::ListenerStats};
use tokio::net::TcpListener;

use crate::router::RouterStats;

/// The OpenMetrics page of one scrape.
pub fn render(router: &RouterStats, listener: &ListenerStats) -> String {
    let mut text = router.prometheus();
    text.push_str(&listener.prometheus());
    jumpstarter_core::metrics::openmetrics_page(&[], &text)
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves; anything else gets 404
/// (405 for another method).
pub async fn serve(
    listener: TcpListener,
    router: Arc<RouterStats>,
    stats: Arc<ListenerStats>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let render: http1::MetricsRender = Arc::new(move || {
        let text = render(&router, &stats);
        Box::pin(async move { text })
    });
    http1::serve_metrics(listener, render, shutdown).await;
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
        assert!(
            ok.contains("# TYPE jumpstarter_router_tunnels_total counter"),
            "{ok}"
        );
        let om = request(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\n\r\n",
        )
        .await;
        assert!(
            om.contains("# TYPE jumpstarter_router_tunnels counter\n"),
            "{om}"
        );
        assert!(om.ends_with("# EOF\n"), "{om}");
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
