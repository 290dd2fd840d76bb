//! Issue 22 item 3: idle connections (raw TCP, and TLS that never speaks HTTP/2) are closed
//! after the handshake / first-frame timeouts on the controller's and the router's
//! listeners; over the connection limit a new connection is closed while an established
//! client keeps working; a legitimate call succeeds while hundreds of idle connections are
//! open.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use jumpstarter_controller::{ControllerConfig, start};
use jumpstarter_core::server::listener::ConnectionLimits;
use jumpstarter_proto::client_v1::{
    ListExportersRequest, client_service_client::ClientServiceClient,
};
use tokio::{io::AsyncReadExt as _, net::TcpStream};
use tokio_rustls::{
    TlsConnector,
    rustls::{
        self, RootCertStore,
        pki_types::{CertificateDer, ServerName, pem::PemObject},
    },
};

use crate::{Identity, Lab, req};

async fn lab_with(limits: ConnectionLimits) -> Lab {
    let dir = tempfile::tempdir().unwrap();
    let ctl = start(ControllerConfig {
        metrics_listen: Some("127.0.0.1:0".into()),
        connection_limits: limits,
        ..ControllerConfig::loopback(dir.path().join("data"))
    })
    .await
    .unwrap();
    Lab { ctl, dir }
}

/// Waits (bounded) until the peer closes `conn`: true when it did.
async fn closed_by_peer<S: tokio::io::AsyncRead + Unpin>(conn: &mut S, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // Server bytes (a TLS alert, HTTP/2 GOAWAY): keep reading until the close.
            Ok(Ok(_)) => {}
        }
    }
}

fn tls_connector(ca_pem: &str) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    TlsConnector::from(Arc::new(config))
}

async fn list_exporters(lab: &Lab, who: &Identity) -> Result<usize, tonic::Status> {
    let mut cli = ClientServiceClient::new(lab.channel().await);
    list_on(&mut cli, who).await
}

async fn list_on(
    cli: &mut ClientServiceClient<jumpstarter_core::client::SessionChannel>,
    who: &Identity,
) -> Result<usize, tonic::Status> {
    let mut r = req(
        who,
        ListExportersRequest {
            parent: "namespaces/default".into(),
            ..Default::default()
        },
    );
    r.set_timeout(Duration::from_secs(10));
    Ok(cli.list_exporters(r).await?.into_inner().exporters.len())
}

async fn metrics(lab: &Lab) -> String {
    use tokio::io::AsyncWriteExt as _;
    let mut c = TcpStream::connect(lab.ctl.metrics_addr.unwrap())
        .await
        .unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut s = String::new();
    c.read_to_string(&mut s).await.unwrap();
    s
}

fn counter(text: &str, metric: &str, listener: &str) -> u64 {
    let prefix = format!("{metric}{{listener=\"{listener}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in {text}"))
}

#[tokio::test]
async fn idle_tcp_and_tls_connections_are_closed_after_the_timeouts() {
    let lab = lab_with(ConnectionLimits {
        handshake_timeout: Duration::from_secs(1),
        first_frame_timeout: Duration::from_secs(1),
        ..Default::default()
    })
    .await;
    let connector = tls_connector(&lab.ctl.ca_pem);
    let ports: [SocketAddr; 2] = [lab.ctl.addr, lab.ctl.router_addr];
    let mut raw = Vec::new();
    let mut tls = Vec::new();
    for addr in ports {
        for _ in 0..10 {
            raw.push(TcpStream::connect(addr).await.unwrap());
        }
        for _ in 0..5 {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let name = ServerName::try_from("localhost").unwrap();
            // The handshake completes; the client then never sends the HTTP/2 preface.
            tls.push(connector.connect(name, tcp).await.unwrap());
        }
    }
    for (i, c) in raw.iter_mut().enumerate() {
        assert!(
            closed_by_peer(c, Duration::from_secs(15)).await,
            "raw TCP connection {i} still open"
        );
    }
    for (i, c) in tls.iter_mut().enumerate() {
        assert!(
            closed_by_peer(c, Duration::from_secs(15)).await,
            "TLS connection {i} without HTTP/2 still open"
        );
    }
    let text = metrics(&lab).await;
    for listener in ["controller", "router"] {
        assert_eq!(
            counter(
                &text,
                "jumpstarter_listener_handshake_timeouts_total",
                listener
            ),
            10,
            "{listener}"
        );
        assert_eq!(
            counter(
                &text,
                "jumpstarter_listener_first_frame_timeouts_total",
                listener
            ),
            5,
            "{listener}"
        );
        assert_eq!(
            counter(&text, "jumpstarter_listener_connections", listener),
            0,
            "{listener}: every slot given back"
        );
    }
    // A client connecting now is served.
    let alice = lab.client("alice").await;
    assert_eq!(list_exporters(&lab, &alice).await.unwrap(), 0);
}

/// A peer that sends the HTTP/2 preface and then never answers the server's keepalive
/// PINGs (a vanished machine, a stuck proxy) is closed after the keepalive interval and
/// timeout (here 1 s each; the defaults, 30 s and 20 s, would not close it within the
/// bound), and its slot is given back.
#[tokio::test]
async fn a_peer_that_never_answers_keepalive_pings_is_closed() {
    use tokio::io::AsyncWriteExt as _;
    let lab = lab_with(ConnectionLimits {
        keepalive_interval: Duration::from_secs(1),
        keepalive_timeout: Duration::from_secs(1),
        ..Default::default()
    })
    .await;
    let connector = tls_connector(&lab.ctl.ca_pem);
    let tcp = TcpStream::connect(lab.ctl.addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    // The client preface and an empty SETTINGS frame; then no frame at all (no SETTINGS
    // or PING acknowledgement).
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    assert!(
        closed_by_peer(&mut tls, Duration::from_secs(30)).await,
        "a connection that never answered a PING is still open"
    );
    let mut open = u64::MAX;
    for _ in 0..100 {
        open = counter(
            &metrics(&lab).await,
            "jumpstarter_listener_connections",
            "controller",
        );
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(open, 0, "the slot was not given back");
}

#[tokio::test]
async fn over_the_limit_a_new_connection_is_closed_and_an_established_client_keeps_working() {
    let lab = lab_with(ConnectionLimits {
        max_connections: 4,
        // Idle connections hold their slots for the whole test.
        handshake_timeout: Duration::from_secs(120),
        ..Default::default()
    })
    .await;
    let alice = lab.client("alice").await;
    lab.exporter("ex1", &[("board", "x")]).await;
    let mut cli = ClientServiceClient::new(lab.channel().await);
    assert_eq!(list_on(&mut cli, &alice).await.unwrap(), 1);
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(TcpStream::connect(lab.ctl.addr).await.unwrap());
    }
    // Wait until the listener has taken all of them (the gauge counts them).
    for _ in 0..100 {
        if counter(
            &metrics(&lab).await,
            "jumpstarter_listener_connections",
            "controller",
        ) == 4
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut extra = TcpStream::connect(lab.ctl.addr).await.unwrap();
    assert!(
        closed_by_peer(&mut extra, Duration::from_secs(5)).await,
        "a connection over the limit is closed at once"
    );
    // The established client keeps working.
    for _ in 0..3 {
        assert_eq!(list_on(&mut cli, &alice).await.unwrap(), 1);
    }
    let text = metrics(&lab).await;
    assert!(
        counter(&text, "jumpstarter_listener_refused_total", "controller") >= 1,
        "{text}"
    );
    assert_eq!(
        counter(&text, "jumpstarter_listener_max_connections", "controller"),
        4
    );
    // The idle ones are still open (their handshake timeout is long), the limit holds.
    for c in &mut idle {
        assert!(!closed_by_peer(c, Duration::from_millis(100)).await);
    }
    drop(idle);
    // Their slots come back: a new client is served.
    let mut served = false;
    for _ in 0..50 {
        if list_exporters(&lab, &alice).await.is_ok() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "a new client is served once slots are free");
}

#[tokio::test]
async fn list_exporters_succeeds_while_hundreds_of_idle_connections_are_open() {
    let lab = lab_with(ConnectionLimits::default()).await;
    let alice = lab.client("alice").await;
    lab.exporter("ex1", &[("board", "x")]).await;
    let mut idle = Vec::new();
    for _ in 0..320 {
        idle.push(TcpStream::connect(lab.ctl.addr).await.unwrap());
    }
    let listed = tokio::time::timeout(Duration::from_secs(20), list_exporters(&lab, &alice))
        .await
        .expect("ListExporters within 20 s");
    assert_eq!(listed.unwrap(), 1);
    let text = metrics(&lab).await;
    assert!(
        counter(&text, "jumpstarter_listener_connections", "controller") >= 300,
        "the idle connections were open meanwhile: {text}"
    );
}

/// `grpc.keepalive.maxConnectionAge` and `maxConnectionAgeGrace` of the ConfigMap: a
/// connection that old is asked to go away (GOAWAY), a call still open after the grace ends
/// with it, and the client's next call goes over a new connection.
#[tokio::test]
async fn a_connection_past_its_max_age_is_closed_after_the_grace() {
    use futures::StreamExt as _;
    use jumpstarter_proto::v1::{
        RegisterRequest, StatusRequest, controller_service_client::ControllerServiceClient,
    };
    let lab = lab_with(ConnectionLimits {
        max_connection_age: Some(Duration::from_secs(1)),
        max_connection_age_grace: Some(Duration::from_secs(1)),
        ..Default::default()
    })
    .await;
    let alice = lab.client("alice").await;
    let ex = lab.exporter("ex1", &[("board", "x")]).await;
    let ch = lab.channel().await;
    let mut ctl = ControllerServiceClient::new(ch.clone());
    ctl.register(req(&ex, RegisterRequest::default()))
        .await
        .unwrap();
    // The Status stream sends a message at once and then heartbeats; it has no end of its
    // own while the exporter is connected.
    let mut status = ctl
        .status(req(&ex, StatusRequest {}))
        .await
        .unwrap()
        .into_inner();
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(Ok(_)) = status.next().await {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the Status stream outlived its connection's max age and grace"
    );
    let mut cli = ClientServiceClient::new(ch);
    assert_eq!(list_on(&mut cli, &alice).await.unwrap(), 1);
}
