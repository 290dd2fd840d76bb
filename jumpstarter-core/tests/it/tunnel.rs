//! The router tunnel: gRPC sessions carried in router frames through a minimal TLS router.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, stream::BoxStream};
use jumpstarter_core::{
    ClientError,
    client::{
        ExporterSession,
        channel::TlsSettings,
        tunnel::{self, RetryPolicy, TicketError, TicketSource, TunnelTicket},
    },
};
use jumpstarter_proto::v1::{
    StreamRequest, StreamResponse,
    router_service_server::{RouterService, RouterServiceServer},
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::{serve_ready, thermostat::ThermostatStatus};

type Reply = mpsc::Sender<Result<StreamResponse, Status>>;

struct Waiting {
    inbound: Streaming<StreamRequest>,
    reply: Reply,
    paired: oneshot::Sender<()>,
}

/// Pairs two streams with the same bearer token and copies frames between them. The first
/// stream gets no response headers until its peer arrives (a Go router sends them even
/// later), so a tunnel must not wait for them before sending.
#[derive(Clone, Default)]
struct PairRouter(Arc<Mutex<HashMap<String, Waiting>>>);

async fn forward(mut from: Streaming<StreamRequest>, to: Reply) {
    while let Some(Ok(f)) = from.next().await {
        let out = StreamResponse {
            payload: f.payload,
            frame_type: f.frame_type,
        };
        if to.send(Ok(out)).await.is_err() {
            return;
        }
    }
}

#[tonic::async_trait]
impl RouterService for PairRouter {
    type StreamStream = BoxStream<'static, Result<StreamResponse, Status>>;

    async fn stream(
        &self,
        request: Request<Streaming<StreamRequest>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| Status::unauthenticated("no token"))?
            .to_string();
        let inbound = request.into_inner();
        let (reply, rx) = mpsc::channel(4);
        let first = self.0.lock().unwrap().remove(&token);
        match first {
            Some(w) => {
                let _ = w.paired.send(());
                tokio::spawn(forward(w.inbound, reply.clone()));
                tokio::spawn(forward(inbound, w.reply));
            }
            None => {
                let (paired, wait) = oneshot::channel();
                self.0.lock().unwrap().insert(
                    token,
                    Waiting {
                        inbound,
                        reply,
                        paired,
                    },
                );
                let _ = wait.await;
            }
        }
        Ok(Response::new(
            tokio_stream::wrappers::ReceiverStream::new(rx).boxed(),
        ))
    }
}

/// Starts the router on loopback with TLS for `localhost`; returns its endpoint and the
/// TLS settings that trust it.
async fn start_router() -> (String, TlsSettings) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let identity = tonic::transport::Identity::from_pem(cert.pem(), key.serialize_pem());
    let server = tonic::transport::Server::builder()
        .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
        .unwrap()
        .add_service(RouterServiceServer::new(PairRouter::default()));
    tokio::spawn(server.serve_with_incoming(jumpstarter_core::server::nodelay_incoming(listener)));
    (
        format!("localhost:{port}"),
        TlsSettings {
            ca_pem: Some(cert.pem()),
            insecure: false,
        },
    )
}

/// Plays controller: every ticket gets a fresh token, and the "exporter" (a splice to the
/// session socket) joins that stream, with a handle to cut it later.
struct Dialer {
    router: String,
    tls: TlsSettings,
    socket: std::path::PathBuf,
    dialed: AtomicUsize,
    cuts: Mutex<Vec<CancellationToken>>,
}

impl TicketSource for Dialer {
    async fn ticket(&self) -> Result<TunnelTicket, TicketError> {
        let n = self.dialed.fetch_add(1, Ordering::SeqCst);
        let token = format!("stream-{n}");
        let conn = tokio::net::UnixStream::connect(&self.socket).await?;
        let cut = CancellationToken::new();
        self.cuts.lock().unwrap().push(cut.clone());
        tunnel::attach(&self.router, &self.tls, &token, conn, cut.cancelled_owned())
            .await
            .map_err(|e| ClientError::connect("router", e))?;
        Ok(TunnelTicket {
            router_endpoint: self.router.clone(),
            router_token: token,
        })
    }
}

#[tokio::test]
async fn grpc_session_through_the_router_and_redial_after_a_cut() {
    let served = serve_ready();
    let (router, tls) = start_router().await;
    let dialer = Arc::new(Dialer {
        router,
        tls: tls.clone(),
        socket: served.socket.clone(),
        dialed: AtomicUsize::new(0),
        cuts: Mutex::new(Vec::new()),
    });
    let channel = tunnel::session_channel(dialer.clone(), tls).await.unwrap();
    let session = ExporterSession::from_channel(channel).await.unwrap();
    assert_eq!(session.labels().get("board").map(String::as_str), Some("x"));
    let thermostat = session.driver("thermostat").unwrap();
    let st: ThermostatStatus = thermostat.call("status", ()).await.unwrap();
    let again: ThermostatStatus = thermostat.call("status", ()).await.unwrap();
    assert_eq!(format!("{st:?}"), format!("{again:?}"));
    assert_eq!(dialer.dialed.load(Ordering::SeqCst), 1);

    // The exporter side cuts the tunnel: the channel dials a new one on the next calls.
    for cut in dialer.cuts.lock().unwrap().iter() {
        cut.cancel();
    }
    let mut ok = false;
    for _ in 0..50 {
        if thermostat
            .call::<ThermostatStatus>("status", ())
            .await
            .is_ok()
            && dialer.dialed.load(Ordering::SeqCst) >= 2
        {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "no call succeeded through a redialled tunnel");
    assert_eq!(dialer.dialed.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn unreachable_router_is_named_in_the_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("localhost:{}", listener.local_addr().unwrap().port());
    drop(listener);
    let e = tunnel::open(
        &endpoint,
        &TlsSettings::default(),
        "token",
        std::future::pending(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(e.contains(&endpoint), "{e}");
}

/// A TCP front for the router whose connections can all be cut at once, as when the router
/// process dies.
async fn killable_front(target: String) -> (String, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let kill = CancellationToken::new();
    let killed = kill.clone();
    tokio::spawn(async move {
        loop {
            let (mut inbound, _) = tokio::select! {
                _ = killed.cancelled() => return,
                c = listener.accept() => c.unwrap(),
            };
            let target = target.clone();
            let killed = killed.clone();
            tokio::spawn(async move {
                let mut outbound = tokio::net::TcpStream::connect(target).await.unwrap();
                tokio::select! {
                    _ = killed.cancelled() => {}
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                }
            });
        }
    });
    (format!("localhost:{port}"), kill)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_when_the_router_dies_fails_at_once_naming_the_router() {
    let served = serve_ready();
    let (router, tls) = start_router().await;
    let target = router.replace("localhost", "127.0.0.1");
    let (front, kill) = killable_front(target).await;
    let dialer = Arc::new(Dialer {
        router: front.clone(),
        tls: tls.clone(),
        socket: served.socket.clone(),
        dialed: AtomicUsize::new(0),
        cuts: Mutex::new(Vec::new()),
    });
    let channel = tunnel::session_channel(dialer.clone(), tls).await.unwrap();
    let session = ExporterSession::from_channel(channel).await.unwrap();
    let thermostat = session.driver("thermostat").unwrap();
    // A stream that would run for hours: in flight when the router dies.
    let mut readings = thermostat
        .streaming_call::<f64>("readings", (u32::MAX,))
        .await
        .unwrap();
    let (got_some, mut first) = tokio::sync::mpsc::channel::<()>(1);
    let reader = tokio::spawn(async move {
        let mut n = 0u64;
        while let Some(item) = readings.next().await {
            match item {
                Ok(_) => n += 1,
                Err(e) => return e.to_string(),
            }
            if n == 100 {
                let _ = got_some.try_send(());
            }
        }
        panic!("the stream ended without an error after {n} items");
    });
    first.recv().await.unwrap();
    kill.cancel();
    let killed = std::time::Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(20), reader)
        .await
        .expect("the call in flight hung")
        .unwrap();
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "{:?}",
        killed.elapsed()
    );
    assert!(e.contains(&front), "{e}");
}

#[tokio::test]
async fn unreachable_router_with_retry_disabled_is_one_plain_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("localhost:{}", listener.local_addr().unwrap().port());
    drop(listener);
    let dialer = Arc::new(FixedTicket(TunnelTicket {
        router_endpoint: endpoint.clone(),
        router_token: "t".into(),
    }));
    let e = tunnel::session_channel_with(
        dialer,
        TlsSettings::default(),
        RetryPolicy::new(Duration::ZERO),
    )
    .await
    .unwrap_err();
    let e = jumpstarter_core::error_chain(&e);
    assert!(
        e.contains(&format!("cannot reach router {endpoint}")),
        "{e}"
    );
}

/// Always the same ticket.
struct FixedTicket(TunnelTicket);

impl TicketSource for FixedTicket {
    async fn ticket(&self) -> Result<TunnelTicket, TicketError> {
        Ok(self.0.clone())
    }
}
