//! The login listener's landing page (`GET /`, as upstream main's): over HTTPS and, as
//! upstream serves it behind an ingress, over plain HTTP on the same port; `/healthz` too.

use jumpstarter_core::oidc::HttpsClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::lab_configured;

/// A plain-HTTP `GET path` to `addr`: the whole response.
async fn plain_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut s = String::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), c.read_to_string(&mut s))
        .await
        .expect("the login listener did not answer")
        .unwrap();
    s
}

#[tokio::test]
async fn the_landing_page_names_jumpstarter_and_jmp_login_over_http_and_https() {
    let lab = lab_configured(|c| c.login_listen = Some("127.0.0.1:0".into())).await;
    let addr = lab.ctl.login_addr.unwrap();

    let page = plain_get(addr, "/").await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("text/html"), "{page}");
    assert!(
        page.contains("Jumpstarter") && page.contains("jmp login"),
        "{page}"
    );
    let health = plain_get(addr, "/healthz").await;
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok"),
        "{health}"
    );
    let doc = plain_get(addr, "/v1/auth/config").await;
    assert!(doc.contains("\"grpcEndpoint\""), "{doc}");

    let https = HttpsClient::new(Some(&lab.ctl.ca_pem), false).unwrap();
    let r = https
        .get(&format!("https://localhost:{}/", addr.port()))
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200);
    let body = String::from_utf8_lossy(&r.body).into_owned();
    assert!(
        body.contains("Jumpstarter") && body.contains("jmp login"),
        "{body}"
    );
}
