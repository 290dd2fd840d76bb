//! The `jumpstarter-router` binary: over its connection limit it closes new connections,
//! logs it and counts it on its metrics endpoint (`--metrics-listen`); a bad metrics address
//! is a clear error.

use std::{process::Stdio, time::Duration};

use jumpstarter_core::auth::CertificateAuthority;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
    process::{Child, ChildStderr, Command},
    sync::mpsc,
};

const ROUTER: &str = env!("CARGO_BIN_EXE_jumpstarter-router");

/// The router binary with a fresh certificate, `extra` flags and stderr piped.
fn router(dir: &tempfile::TempDir, extra: &[&str]) -> Child {
    let ca = CertificateAuthority::generate("test ca").unwrap();
    let cert = ca.issue_server_cert(&["localhost"]).unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&crt, &cert.cert_pem).unwrap();
    std::fs::write(&key, &cert.key_pem).unwrap();
    Command::new(ROUTER)
        .args(["--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&crt)
        .arg("--tls-key")
        .arg(&key)
        .args(extra)
        .env(
            "ROUTER_KEY",
            "0123456789abcdef0123456789abcdef0123456789abcdef",
        )
        .env_remove("ROUTER_METRICS_LISTEN")
        .env_remove("ROUTER_MAX_CONNECTIONS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Forwards stderr lines to a channel.
fn lines(err: ChildStderr) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut l = BufReader::new(err).lines();
        while let Ok(Some(line)) = l.next_line().await {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits (bounded) for a line containing `needle`; the text after it.
async fn after(rx: &mut mpsc::UnboundedReceiver<String>, needle: &str) -> String {
    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = rx.recv().await {
            if let Some(i) = line.find(needle) {
                return Some(line[i + needle.len()..].trim().to_string());
            }
            seen.push(line);
        }
        None
    })
    .await;
    match found {
        Ok(Some(rest)) => rest,
        _ => panic!("no line with {needle:?}; stderr was:\n{}", seen.join("\n")),
    }
}

async fn scrape(addr: &str) -> String {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut s = String::new();
    c.read_to_string(&mut s).await.unwrap();
    s
}

#[tokio::test]
async fn over_the_limit_the_router_closes_logs_and_counts_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = router(
        &dir,
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--max-connections",
            "1",
            "--handshake-timeout",
            "60",
        ],
    );
    let mut rx = lines(child.stderr.take().unwrap());
    let metrics = after(&mut rx, "Router metrics on http://").await;
    let metrics = metrics.trim_end_matches("/metrics").to_string();
    let addr = after(&mut rx, "Router listening on").await;

    let before = scrape(&metrics).await;
    assert!(before.starts_with("HTTP/1.1 200 OK"), "{before}");
    assert!(
        before.contains("jumpstarter_listener_max_connections{listener=\"router\"} 1"),
        "{before}"
    );
    assert!(
        before.contains("jumpstarter_listener_refused_total{listener=\"router\"} 0"),
        "{before}"
    );
    assert!(
        before.contains("jumpstarter_router_active_tunnels 0"),
        "{before}"
    );

    // The first connection takes the one slot (it stays in its TLS handshake); the second
    // is closed at once.
    let _first = TcpStream::connect(&addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut second = TcpStream::connect(&addr).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), second.read(&mut buf))
        .await
        .expect("the connection over the limit was not closed")
        .unwrap_or(0);
    assert_eq!(n, 0, "the connection over the limit got bytes");
    after(&mut rx, "router listener: connection limit of 1 reached").await;
    let text = scrape(&metrics).await;
    assert!(
        text.contains("jumpstarter_listener_refused_total{listener=\"router\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("jumpstarter_listener_connections{listener=\"router\"} 1"),
        "{text}"
    );
    let _ = child.kill().await;
}

#[tokio::test]
async fn metrics_are_off_by_default_and_a_bad_address_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = router(&dir, &[]);
    let mut rx = lines(child.stderr.take().unwrap());
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = rx.recv().await {
            let ready = line.contains("Router listening on");
            seen.push(line);
            if ready {
                break;
            }
        }
    })
    .await
    .unwrap();
    assert!(
        !seen.iter().any(|l| l.contains("metrics")),
        "metrics were served by default: {seen:?}"
    );
    let _ = child.kill().await;

    let mut bad = router(&dir, &["--metrics-listen", "not an address"]);
    let mut err = String::new();
    bad.stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .await
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), bad.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(!status.success());
    assert!(
        err.contains("--metrics-listen") && err.contains("not an address"),
        "{err}"
    );
}
