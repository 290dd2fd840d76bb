//! Network drivers end to end: real TCP, UDP and Unix echo servers behind a served session.

use std::{path::Path, sync::Arc, time::Duration};

use jumpstarter_core::{ClientError, DriverError};
use jumpstarter_drivers::{EchoNetwork, NetworkClient, TcpNetwork, UdpNetwork, UnixNetwork};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::Served;

/// A TCP echo server on `addr` (port 0); returns its port.
async fn tcp_echo(addr: &str) -> u16 {
    let l = tokio::net::TcpListener::bind(addr).await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = c.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

/// A UDP server answering each datagram with itself, upper-cased.
async fn udp_echo() -> u16 {
    let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = s.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = s.recv_from(&mut buf).await {
            let up = buf[..n].to_ascii_uppercase();
            let _ = s.send_to(&up, from).await;
        }
    });
    port
}

fn unix_echo(path: &Path) {
    let l = tokio::net::UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = c.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
}

async fn round_trip<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, msg: &[u8]) -> Vec<u8> {
    s.write_all(msg).await.unwrap();
    let mut got = vec![0u8; msg.len()];
    s.read_exact(&mut got).await.unwrap();
    got
}

async fn net_client(served: &Served, name: &str) -> NetworkClient {
    NetworkClient(served.client().await.driver(name).unwrap())
}

#[tokio::test]
async fn tcp_connect_reaches_a_real_echo_server_v4_and_v6() {
    let port4 = tcp_echo("127.0.0.1:0").await;
    let mut children: Vec<(&str, Arc<dyn jumpstarter_core::Driver>)> =
        vec![("tcp", Arc::new(TcpNetwork::new("127.0.0.1", port4, true)))];
    let v6 = tokio::net::TcpListener::bind("[::1]:0").await.is_ok();
    let port6 = if v6 { tcp_echo("[::1]:0").await } else { 0 };
    if v6 {
        children.push(("tcp6", Arc::new(TcpNetwork::new("::1", port6, true))));
    }
    let served = Served::start(children);
    let tcp = net_client(&served, "tcp").await;
    let mut s = tcp.connect().await.unwrap();
    assert_eq!(round_trip(&mut s, b"hello").await, b"hello");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let (mut r, mut w) = tokio::io::split(s);
    let send = {
        let big = big.clone();
        tokio::spawn(async move { w.write_all(&big).await.unwrap() })
    };
    let mut got = vec![0u8; big.len()];
    r.read_exact(&mut got).await.unwrap();
    send.await.unwrap();
    assert!(got == big, "300 kB came back changed");
    assert_eq!(
        tcp.address().await.unwrap(),
        format!("tcp://127.0.0.1:{port4}")
    );
    if v6 {
        let tcp6 = net_client(&served, "tcp6").await;
        let mut s = tcp6.connect().await.unwrap();
        assert_eq!(round_trip(&mut s, b"six").await, b"six");
        assert_eq!(
            tcp6.address().await.unwrap(),
            format!("tcp://[::1]:{port6}")
        );
    }
}

#[tokio::test]
async fn a_refused_connection_is_a_clear_error_and_address_can_be_disabled() {
    // A port just released: nothing listens there.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let served = Served::start(vec![(
        "tcp",
        Arc::new(TcpNetwork::new("127.0.0.1", port, false)),
    )]);
    let tcp = net_client(&served, "tcp").await;
    let e = tcp.connect().await.err().unwrap().to_string();
    assert!(
        e.contains("cannot connect to TCP") && e.contains(&port.to_string()),
        "{e}"
    );
    match tcp.address().await {
        Err(ClientError::Call {
            error: DriverError::InvalidArgument(m),
            ..
        }) => assert!(m.contains("enable_address"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn udp_frames_are_datagrams() {
    let port = udp_echo().await;
    let served = Served::start(vec![(
        "udp",
        Arc::new(UdpNetwork::new("127.0.0.1", port, true)),
    )]);
    let udp = net_client(&served, "udp").await;
    let mut s = udp.connect().await.unwrap();
    s.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"PING");
    assert_eq!(
        udp.address().await.unwrap(),
        format!("udp://127.0.0.1:{port}")
    );
}

#[tokio::test]
async fn unix_and_echo_streams_echo() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("echo.sock");
    unix_echo(&sock);
    let served = Served::start(vec![
        ("unix", Arc::new(UnixNetwork::new(&sock))),
        ("echo", Arc::new(EchoNetwork)),
        (
            "missing",
            Arc::new(UnixNetwork::new(dir.path().join("nothing.sock"))),
        ),
    ]);
    let mut s = net_client(&served, "unix").await.connect().await.unwrap();
    assert_eq!(round_trip(&mut s, b"over unix").await, b"over unix");
    let mut s = net_client(&served, "echo").await.connect().await.unwrap();
    assert_eq!(round_trip(&mut s, b"echo").await, b"echo");
    let e = net_client(&served, "missing")
        .await
        .connect()
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("nothing.sock"), "{e}");
    // Unix sockets have no address method, as upstream.
    assert!(net_client(&served, "unix").await.address().await.is_err());
}

/// A TCP echo server behind a served `TcpNetwork` named `tcp`, and a forward of it on a
/// loopback port: the session, its client and the forward.
async fn forwarded_echo() -> (Served, NetworkClient, jumpstarter_drivers::Forwarder) {
    let port = tcp_echo("127.0.0.1:0").await;
    let served = Served::start(vec![(
        "tcp",
        Arc::new(TcpNetwork::new("127.0.0.1", port, true)),
    )]);
    let tcp = net_client(&served, "tcp").await;
    let fwd = tcp
        .forward_tcp("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    (served, tcp, fwd)
}

#[tokio::test]
async fn tcp_and_unix_port_forwards_relay_each_connection() {
    let (_served, tcp, fwd) = forwarded_echo().await;
    let local = fwd.local_address().to_string();
    assert!(local.starts_with("127.0.0.1:"), "{local}");
    let mut a = tokio::net::TcpStream::connect(&local).await.unwrap();
    let mut b = tokio::net::TcpStream::connect(&local).await.unwrap();
    assert_eq!(round_trip(&mut a, b"first").await, b"first");
    assert_eq!(round_trip(&mut b, b"second").await, b"second");
    assert_eq!(round_trip(&mut a, b"again").await, b"again");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fwd.sock");
    let ufwd = tcp.forward_unix(Some(&path)).await.unwrap();
    assert_eq!(ufwd.local_address(), path.display().to_string());
    let mut u = tokio::net::UnixStream::connect(&path).await.unwrap();
    assert_eq!(round_trip(&mut u, b"via unix").await, b"via unix");
    drop(ufwd);
    assert!(
        !path.exists(),
        "the socket file is removed with the forwarder"
    );

    // A temporary socket path when none is given.
    let tmp = tcp.forward_unix(None).await.unwrap();
    let mut u = tokio::net::UnixStream::connect(tmp.local_address())
        .await
        .unwrap();
    assert_eq!(round_trip(&mut u, b"tmp").await, b"tmp");

    drop(fwd);
    tokio::task::yield_now().await;
    // Once dropped, nothing listens any more (a connect is refused or reset).
    let after = tokio::net::TcpStream::connect(&local).await;
    if let Ok(mut s) = after {
        let mut buf = [0u8; 1];
        let _ = s.write_all(b"x").await;
        assert!(matches!(s.read(&mut buf).await, Ok(0) | Err(_)));
    }
}

/// A forward carries more than a stream chunk each way, in pieces of any size, and an end of
/// file from the local side reaches the remote end (the echo server then closes, and that
/// end of file comes back): every byte arrives, in order, and the connection ends.
#[tokio::test]
async fn a_forward_carries_many_chunks_and_passes_end_of_file_both_ways() {
    let (_served, _tcp, fwd) = forwarded_echo().await;
    let conn = tokio::net::TcpStream::connect(fwd.local_address())
        .await
        .unwrap();
    let (mut rd, mut wr) = conn.into_split();
    // 3 MiB and a bit: twelve stream chunks and a remainder, written in uneven pieces.
    let sent: Vec<u8> = (0..3 * 1024 * 1024 + 12_345)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let writing = {
        let sent = sent.clone();
        tokio::spawn(async move {
            for piece in sent.chunks(70_001) {
                wr.write_all(piece).await.unwrap();
            }
            wr.shutdown().await.unwrap();
            wr
        })
    };
    let mut back = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), rd.read_to_end(&mut back))
        .await
        .expect("the echoed bytes and the end of file come back")
        .unwrap();
    assert_eq!(back.len(), sent.len());
    assert!(back == sent, "the bytes come back in order");
    let _wr = writing.await.unwrap();
}

/// What the WebSocket echo server does with each message.
const WS_BYE: &[u8] = b"close please";

/// A real WebSocket server on loopback: binary messages come back as they are, `text:X`
/// comes back as the text message `X`, [`WS_BYE`] makes it close the connection. Each
/// connection's path is sent first, as a text message.
// The handshake callback's error type is the library's (an HTTP response).
#[allow(clippy::result_large_err)]
async fn ws_echo() -> u16 {
    ws_echo_on(None).await
}

/// [`ws_echo`], over TLS with `tls` when given (a `wss://` server).
#[allow(clippy::result_large_err)]
async fn ws_echo_on(tls: Option<tokio_rustls::TlsAcceptor>) -> u16 {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{
        Message,
        handshake::server::{Request, Response},
    };
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let tls = tls.clone();
            tokio::spawn(async move {
                let c: Box<dyn jumpstarter_core::driver::Duplex> = match tls {
                    None => Box::new(c),
                    Some(tls) => match tls.accept(c).await {
                        Ok(c) => Box::new(c),
                        // A client that does not trust the certificate gives up here.
                        Err(_) => return,
                    },
                };
                let mut path = String::new();
                let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(c, |req: &Request, resp| {
                    path = req.uri().path().to_string();
                    Ok::<Response, _>(resp)
                })
                .await
                else {
                    return;
                };
                let _ = ws.send(Message::text(format!("path {path}"))).await;
                while let Some(Ok(m)) = ws.next().await {
                    let reply = match m {
                        Message::Binary(b) if b.as_ref() == WS_BYE => {
                            let _ = ws.close(None).await;
                            return;
                        }
                        Message::Binary(b) => match b.strip_prefix(b"text:") {
                            Some(t) => Message::text(String::from_utf8_lossy(t).to_string()),
                            None => Message::Binary(b),
                        },
                        Message::Close(_) => return,
                        _ => continue,
                    };
                    if ws.send(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn websocket_frames_are_messages_to_a_real_server() {
    use jumpstarter_drivers::WebsocketNetwork;
    let port = ws_echo().await;
    let url = format!("ws://127.0.0.1:{port}/echo");
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let served = Served::start(vec![
        ("ws", Arc::new(WebsocketNetwork::new(&url, true).unwrap())),
        (
            "nobody",
            Arc::new(WebsocketNetwork::new(&format!("ws://127.0.0.1:{closed}/"), false).unwrap()),
        ),
    ]);
    let ws = net_client(&served, "ws").await;
    assert_eq!(ws.address().await.unwrap(), url);
    let mut s = ws.connect().await.unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(
        &buf[..n],
        b"path /echo",
        "the URL's path reaches the server"
    );
    // One write, one message, one frame back.
    s.write_all(b"hello").await.unwrap();
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"hello");
    // A text message arrives as its UTF-8 bytes.
    s.write_all("text:grüß".as_bytes()).await.unwrap();
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], "grüß".as_bytes());
    // A message bigger than one DATA frame arrives whole, in order.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    s.write_all(&big).await.unwrap();
    let mut got = vec![0u8; big.len()];
    s.read_exact(&mut got).await.unwrap();
    assert!(got == big, "200 kB came back changed");
    // The server closing the connection ends the stream.
    s.write_all(WS_BYE).await.unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest).await;
    assert!(rest.is_empty(), "{rest:?}");

    let nobody = net_client(&served, "nobody").await;
    let e = nobody.connect().await.err().unwrap().to_string();
    assert!(
        e.contains("cannot connect to WebSocket") && e.contains(&closed.to_string()),
        "{e}"
    );
    match nobody.address().await {
        Err(ClientError::Call {
            error: DriverError::InvalidArgument(m),
            ..
        }) => assert!(m.contains("enable_address"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// A TLS acceptor for 127.0.0.1 with a certificate of a fresh test CA; returns it and the
/// CA's certificate.
fn test_tls() -> (
    tokio_rustls::TlsAcceptor,
    tokio_rustls::rustls::pki_types::CertificateDer<'static>,
) {
    use jumpstarter_core::auth::{CertificateAuthority, pem};
    use tokio_rustls::rustls;
    let ca = CertificateAuthority::generate("wss test CA").unwrap();
    let leaf = ca.issue_server_cert(&["127.0.0.1"]).unwrap();
    let certs = pem::certificates(&leaf.cert_pem).unwrap();
    let key = pem::private_key(&leaf.key_pem).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let ca_der = pem::certificates(ca.cert_pem()).unwrap().remove(0);
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), ca_der)
}

#[tokio::test]
async fn websocket_over_tls_reaches_a_real_wss_server_and_checks_its_certificate() {
    use jumpstarter_drivers::WebsocketNetwork;
    let (acceptor, ca) = test_tls();
    let port = ws_echo_on(Some(acceptor)).await;
    let url = format!("wss://127.0.0.1:{port}/secure");
    let served = Served::start(vec![
        (
            "wss",
            Arc::new(
                WebsocketNetwork::new(&url, true)
                    .unwrap()
                    .with_root_certificates([ca])
                    .unwrap(),
            ),
        ),
        // The same server, but only the system's roots: its certificate is not trusted.
        (
            "untrusted",
            Arc::new(WebsocketNetwork::new(&url, true).unwrap()),
        ),
    ]);
    let wss = net_client(&served, "wss").await;
    assert_eq!(wss.address().await.unwrap(), url);
    let mut s = wss.connect().await.unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"path /secure");
    s.write_all(b"over tls").await.unwrap();
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"over tls");
    // More than one TLS record each way, in order.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    s.write_all(&big).await.unwrap();
    let mut got = vec![0u8; big.len()];
    s.read_exact(&mut got).await.unwrap();
    assert!(got == big, "300 kB came back changed over wss://");
    s.write_all(WS_BYE).await.unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest).await;
    assert!(rest.is_empty(), "{rest:?}");

    let untrusted = net_client(&served, "untrusted").await;
    let e = untrusted.connect().await.err().unwrap().to_string();
    assert!(
        e.contains("cannot connect to WebSocket") && e.contains("TLS") && e.contains(&url),
        "{e}"
    );
}

#[test]
fn a_bad_extra_root_certificate_is_refused() {
    use jumpstarter_drivers::WebsocketNetwork;
    let e = WebsocketNetwork::new("wss://127.0.0.1:1/", true)
        .unwrap()
        .with_root_certificates([tokio_rustls::rustls::pki_types::CertificateDer::from(
            b"not a certificate".to_vec(),
        )])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("CA certificate"), "{e}");
}

/// A stand-in VNC server: sends the RFB banner, then echoes; [`WS_BYE`] makes it hang up.
async fn vnc_like() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                c.write_all(b"RFB 003.008\n").await.unwrap();
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    if &buf[..n] == WS_BYE {
                        return;
                    }
                    if c.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn novnc_relays_a_browsers_websocket_to_the_vnc_stream() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let port = vnc_like().await;
    let served = Served::start(vec![(
        "vnc",
        Arc::new(TcpNetwork::new("127.0.0.1", port, true)),
    )]);
    let vnc = net_client(&served, "vnc").await;
    let bridge = vnc.novnc(true).await.unwrap();
    let local = bridge.local_addr();
    assert!(local.ip().is_loopback(), "{local}");
    assert_eq!(
        bridge.url(),
        format!(
            "https://novnc.com/noVNC/vnc.html?encrypt=1&autoconnect=1&reconnect=1&host=127.0.0.1&port={}",
            local.port()
        )
    );
    let ws_url = format!("ws://{local}/websockify");
    // Two viewers at once, each with its own stream to the server.
    for _ in 0..2 {
        let tcp = tokio::net::TcpStream::connect(local).await.unwrap();
        let (mut ws, _) = tokio_tungstenite::client_async(ws_url.as_str(), tcp)
            .await
            .unwrap();
        let Some(Ok(Message::Binary(banner))) = ws.next().await else {
            panic!("no banner");
        };
        assert_eq!(banner.as_ref(), b"RFB 003.008\n");
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        ws.send(Message::Binary(big.clone().into())).await.unwrap();
        let mut got = Vec::new();
        while got.len() < big.len() {
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => got.extend_from_slice(&b),
                other => panic!("expected the echo, got {other:?}"),
            }
        }
        assert!(got == big, "the echo differs");
        // The server hanging up closes the browser's WebSocket.
        ws.send(Message::Binary(WS_BYE.to_vec().into()))
            .await
            .unwrap();
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            }
        }
    }
    // Something that is no WebSocket handshake is dropped; the bridge keeps serving.
    let mut junk = tokio::net::TcpStream::connect(local).await.unwrap();
    junk.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    let mut rest = Vec::new();
    let _ = junk.read_to_end(&mut rest).await;
    let tcp = tokio::net::TcpStream::connect(local).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(ws_url.as_str(), tcp)
        .await
        .unwrap();
    assert!(matches!(ws.next().await, Some(Ok(Message::Binary(_)))));
    drop(bridge);
}
