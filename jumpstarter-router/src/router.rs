//! Pairing streams by router-token subject and forwarding their frames.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures::{Stream, StreamExt};
use jumpstarter_core::sync::LockExt;
use jumpstarter_core::{auth::bearer_token, server::listener::ConnectionGuard, wire::stream_rpc};
use jumpstarter_proto::v1::{StreamRequest, StreamResponse};
use tokio::sync::{mpsc, oneshot};
use tonic::{Status, body::Body, metadata::MetadataMap};

use crate::token::RouterTokenKey;

/// Frames in flight per direction before the sender waits.
const FORWARD_BUFFER: usize = 8;

/// Router settings.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// How long the first stream of a pair waits for its peer.
    pub pair_timeout: Duration,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            pair_timeout: Duration::from_secs(120),
        }
    }
}

/// Counters of a router (exported as metrics).
#[derive(Debug, Default)]
pub struct RouterStats {
    /// Tunnels currently forwarding.
    pub active_tunnels: AtomicU64,
    /// Streams waiting for their peer.
    pub waiting_streams: AtomicU64,
    /// Tunnels paired since start.
    pub tunnels_total: AtomicU64,
    /// Payload bytes forwarded (both directions).
    pub bytes_forwarded: AtomicU64,
    /// Streams refused (bad token, reused token, timeout).
    pub refused_total: AtomicU64,
}

impl RouterStats {
    /// Prometheus text exposition of the counters.
    pub fn prometheus(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "# HELP jumpstarter_router_active_tunnels Tunnels forwarding now.\n\
             # TYPE jumpstarter_router_active_tunnels gauge\njumpstarter_router_active_tunnels {}\n\
             # HELP jumpstarter_router_waiting_streams Streams waiting for their peer.\n\
             # TYPE jumpstarter_router_waiting_streams gauge\njumpstarter_router_waiting_streams {}\n\
             # HELP jumpstarter_router_tunnels_total Tunnels paired since start.\n\
             # TYPE jumpstarter_router_tunnels_total counter\njumpstarter_router_tunnels_total {}\n\
             # HELP jumpstarter_router_bytes_forwarded_total Payload bytes forwarded, both \
             directions together.\n\
             # TYPE jumpstarter_router_bytes_forwarded_total counter\njumpstarter_router_bytes_forwarded_total {}\n\
             # HELP jumpstarter_router_refused_total Streams refused: bad or reused token, no \
             peer in time.\n\
             # TYPE jumpstarter_router_refused_total counter\njumpstarter_router_refused_total {}\n",
            g(&self.active_tunnels),
            g(&self.waiting_streams),
            g(&self.tunnels_total),
            g(&self.bytes_forwarded),
            g(&self.refused_total),
        )
    }
}

type Inbound = Pin<Box<dyn Stream<Item = Result<StreamRequest, Status>> + Send>>;

/// One side of a tunnel: its incoming frames and where its outgoing frames go.
struct Side {
    inbound: Inbound,
    outbound: mpsc::Sender<Result<StreamResponse, Status>>,
}

/// A stream waiting for its peer.
struct Waiting {
    side: Side,
    /// Dropped (or fired) once the wait is over; the waiter's timer watches it.
    paired: oneshot::Sender<()>,
}

#[derive(Default)]
struct Pairing {
    waiting: HashMap<String, Waiting>,
    /// Subjects already paired, with when their record may be forgotten.
    used: HashMap<String, Instant>,
}

/// The router service: pairs streams and forwards frames.
#[derive(Clone)]
pub struct Router {
    key: RouterTokenKey,
    config: RouterConfig,
    pairing: Arc<Mutex<Pairing>>,
    stats: Arc<RouterStats>,
}

impl Router {
    /// A router verifying tokens with `key`.
    pub fn new(key: RouterTokenKey, config: RouterConfig) -> Self {
        Self {
            key,
            config,
            pairing: Arc::default(),
            stats: Arc::default(),
        }
    }

    /// The router's counters.
    pub fn stats(&self) -> Arc<RouterStats> {
        self.stats.clone()
    }

    /// The gRPC service (`jumpstarter.v1.RouterService`) to add to a tonic server.
    pub fn service(self) -> RouterStreamService {
        RouterStreamService(self)
    }

    fn refuse(&self, status: Status) -> Status {
        self.stats.refused_total.fetch_add(1, Ordering::Relaxed);
        status
    }
}

/// `jumpstarter.v1.RouterService` as a tower service for a tonic server: its one method,
/// `Stream`, spoken straight over HTTP/2.
#[derive(Clone)]
pub struct RouterStreamService(Router);

impl tonic::server::NamedService for RouterStreamService {
    const NAME: &'static str = "jumpstarter.v1.RouterService";
}

impl tower::Service<http::Request<Body>> for RouterStreamService {
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let router = self.0.clone();
        Box::pin(async move {
            Ok(match router.stream(req) {
                Ok(response) => response,
                Err(status) => status.into_http(),
            })
        })
    }
}

impl Router {
    /// Handles one `Stream` call: checks its token, then pairs it or parks it.
    fn stream(&self, req: http::Request<Body>) -> Result<http::Response<Body>, Status> {
        let token = bearer_token(&MetadataMap::from_headers(req.headers().clone()))
            .map_err(|s| self.refuse(s))?;
        let verified = self
            .key
            .verify_stream(&token)
            .map_err(|e| self.refuse(e.to_router_status()))?;
        let subject = verified.stream_id;
        let lease = verified.lease.unwrap_or_default();
        let context = verified.context;
        stream_rpc::check_request(&req).map_err(|s| self.refuse(s))?;
        let (tx, rx) = mpsc::channel(FORWARD_BUFFER);
        let side = Side {
            inbound: Box::pin(stream_rpc::FrameDecoder::<_, StreamRequest>::new(
                req.into_body(),
                stream_rpc::Side::Server,
            )),
            outbound: tx,
        };
        let response = stream_rpc::response(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            http::HeaderMap::new(),
        );

        let mut pairing = self.pairing.lock_or_recover();
        let now = Instant::now();
        pairing.used.retain(|_, until| *until > now);
        if pairing.used.contains_key(&subject) {
            drop(pairing);
            return Err(self.refuse(Status::already_exists(
                "router token already used: this stream is paired already",
            )));
        }
        match pairing.waiting.remove(&subject) {
            Some(first) => {
                // Remember the subject for as long as a token can live (30 minutes).
                pairing
                    .used
                    .insert(subject.clone(), now + Duration::from_secs(31 * 60));
                drop(pairing);
                let _ = first.paired.send(());
                self.stats.waiting_streams.fetch_sub(1, Ordering::Relaxed);
                tokio::spawn(forward(
                    first.side,
                    side,
                    self.stats.clone(),
                    subject,
                    lease,
                    context,
                ));
            }
            None => {
                let (paired_tx, paired_rx) = oneshot::channel();
                let outbound = side.outbound.clone();
                pairing.waiting.insert(
                    subject.clone(),
                    Waiting {
                        side,
                        paired: paired_tx,
                    },
                );
                drop(pairing);
                self.stats.waiting_streams.fetch_add(1, Ordering::Relaxed);
                let this = self.clone();
                let timeout = self.config.pair_timeout;
                tokio::spawn(async move {
                    let outcome = tokio::select! {
                        r = paired_rx => r.is_ok(),
                        _ = tokio::time::sleep(timeout) => false,
                        _ = outbound.closed() => false,
                    };
                    if outcome {
                        return;
                    }
                    // Timed out or the waiter went away: forget it unless it was just paired.
                    let removed = this.pairing.lock_or_recover().waiting.remove(&subject);
                    if let Some(w) = removed {
                        this.stats.waiting_streams.fetch_sub(1, Ordering::Relaxed);
                        this.stats.refused_total.fetch_add(1, Ordering::Relaxed);
                        let _ = w
                            .side
                            .outbound
                            .send(Err(Status::deadline_exceeded(format!(
                                "no peer connected within {}s",
                                timeout.as_secs()
                            ))))
                            .await;
                    }
                });
            }
        }
        Ok(response)
    }
}

/// Copies frames between two sides until either ends; then ends both.
async fn forward(
    a: Side,
    b: Side,
    stats: Arc<RouterStats>,
    subject: String,
    lease: String,
    context: std::collections::BTreeMap<String, String>,
) {
    stats.active_tunnels.fetch_add(1, Ordering::Relaxed);
    stats.tunnels_total.fetch_add(1, Ordering::Relaxed);
    // `lease` is `namespace/name` when our controller issued the token, else empty.
    let (namespace, lease_id) = lease.split_once('/').unwrap_or(("", lease.as_str()));
    let opened = Instant::now();
    // Its span in the lease's trace (with traces on), to the end of the tunnel.
    let _traced = jumpstarter_core::telemetry::tunnel(namespace, lease_id, &subject);
    // The lease's context (from the token) on both of the tunnel's lines.
    let context = jumpstarter_core::logging::context_span(&context);
    context.in_scope(|| tracing::info!(stream = %subject, lease_id, namespace, "tunnel open"));
    let Side {
        inbound: a_in,
        outbound: a_out,
    } = a;
    let Side {
        inbound: b_in,
        outbound: b_out,
    } = b;
    let a_to_b = pipe(a_in, b_out.clone(), stats.clone());
    let b_to_a = pipe(b_in, a_out.clone(), stats.clone());
    let ended = tokio::select! {
        r = a_to_b => r,
        r = b_to_a => r,
    };
    // One side ended: end both response streams (with the error, if there was one).
    if let Err(status) = ended {
        let _ = a_out.try_send(Err(status.clone()));
        let _ = b_out.try_send(Err(status));
    }
    drop(a_out);
    drop(b_out);
    stats.active_tunnels.fetch_sub(1, Ordering::Relaxed);
    context.in_scope(|| {
        tracing::info!(
            stream = %subject,
            lease_id,
            namespace,
            duration_ms = opened.elapsed().as_secs_f64() * 1e3,
            "tunnel closed"
        )
    });
}

async fn pipe(
    mut from: Inbound,
    to: mpsc::Sender<Result<StreamResponse, Status>>,
    stats: Arc<RouterStats>,
) -> Result<(), Status> {
    loop {
        match from.next().await {
            Some(Ok(frame)) => {
                stats
                    .bytes_forwarded
                    .fetch_add(frame.payload.len() as u64, Ordering::Relaxed);
                let out = StreamResponse {
                    payload: frame.payload,
                    frame_type: frame.frame_type,
                };
                if to.send(Ok(out)).await.is_err() {
                    return Ok(());
                }
            }
            Some(Err(status)) => {
                return Err(Status::unavailable(format!(
                    "peer stream failed: {}",
                    status.message()
                )));
            }
            None => return Ok(()),
        }
    }
}

/// Serves the router on an already bound listener (TLS when an identity is given) until
/// `shutdown` resolves, accepting through `guard` (connection limit, handshake and
/// first-frame timeouts, keepalive).
pub async fn serve(
    router: Router,
    listener: tokio::net::TcpListener,
    tls: Option<jumpstarter_core::auth::IssuedCert>,
    guard: ConnectionGuard,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), RouterError> {
    let tls = tls
        .map(|id| jumpstarter_core::server::listener::tls_acceptor(&id, None))
        .transpose()
        .map_err(RouterError::Tls)?;
    // The same HTTP/2 windows and frame size as an exporter's own server: the router passes
    // bulk transfers along, and gRPC's 64 KiB default windows would stall them.
    guard
        .limits()
        .keepalive(tonic::transport::Server::builder())
        .initial_stream_window_size(Some(jumpstarter_core::wire::settings::STREAM_WINDOW))
        .initial_connection_window_size(Some(jumpstarter_core::wire::settings::CONNECTION_WINDOW))
        .max_frame_size(Some(jumpstarter_core::wire::frames::MAX_FRAME))
        .add_service(router.service())
        .serve_with_incoming_shutdown(guard.incoming(listener, tls), shutdown)
        .await
        .map_err(RouterError::Serve)
}

/// Errors of the router server.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The TLS settings are unusable.
    #[error("unusable TLS configuration")]
    Tls(#[source] jumpstarter_core::auth::TlsError),
    /// The server stopped with an error.
    #[error("the router server failed")]
    Serve(#[source] tonic::transport::Error),
}
