//! What a standby controller replica does while another one leads: it listens on the
//! controller's own ports and forwards each connection, byte for byte, to the leader.
//!
//! The whole controller (services, Listen queues, the reconcile loop, the in-process router)
//! runs in the leader only. A standby that opened none of its ports would never pass the
//! Deployment's readiness probe, so a Deployment of two replicas would never be Available
//! and every rolling update would stall. Instead every replica is Ready and the Service
//! spreads connections over all of them: a standby forwards its share to the leader, found
//! in the leader election Lease ([`super::leader::ENDPOINTS_ANNOTATION`], `grpc=IP:PORT,
//! router=IP:PORT`). TLS passes through untouched (every replica serves the same
//! certificate, from the key Secret), so clients and exporters see the leader itself.
//!
//! When the leader goes away its forwarded connections break like its own; clients and
//! exporters reconnect by themselves, and reach the new leader (the standby that took the
//! Lease now serves on the same ports).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::{Semaphore, watch},
    task::JoinSet,
};

/// Connections forwarded at once by one standby; more are closed at once.
pub const MAX_FORWARDED: usize = 4096;

/// How long a standby tries to reach the leader for one connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a connection waits for a reachable leader to be known (one that has just taken
/// over writes where it serves with its first renewal; one that died is replaced once its
/// Lease expires) before it is closed.
const LEADER_WAIT: Duration = Duration::from_secs(10);

/// Where the leader serves: its controller gRPC and router listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoints {
    /// The controller's gRPC listener.
    pub grpc: SocketAddr,
    /// The in-process router's listener.
    pub router: SocketAddr,
}

impl Endpoints {
    /// The annotation text: `grpc=IP:PORT,router=IP:PORT`.
    pub fn annotation(self) -> String {
        format!("grpc={},router={}", self.grpc, self.router)
    }

    /// Reads [`Endpoints::annotation`]'s text; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let (mut grpc, mut router) = (None, None);
        for part in text.split(',') {
            match part.trim().split_once('=') {
                Some(("grpc", a)) => grpc = a.parse().ok(),
                Some(("router", a)) => router = a.parse().ok(),
                _ => return None,
            }
        }
        Some(Self {
            grpc: grpc?,
            router: router?,
        })
    }

    /// Where this process serves, for the standbys: the bound addresses, with `pod_ip`
    /// (the downward API's `status.podIP`, as `POD_IP`) in place of an unspecified one.
    /// `None` when an address is unspecified and there is no pod IP: the standbys could not
    /// reach us (and loopback would be their own port).
    pub fn advertised(
        grpc: SocketAddr,
        router: SocketAddr,
        pod_ip: Option<std::net::IpAddr>,
    ) -> Option<Self> {
        let fix = |a: SocketAddr| match (a.ip().is_unspecified(), pod_ip) {
            (false, _) => Some(a),
            (true, Some(ip)) => Some(SocketAddr::new(ip, a.port())),
            (true, None) => None,
        };
        Some(Self {
            grpc: fix(grpc)?,
            router: fix(router)?,
        })
    }
}

/// Which of the leader's listeners a standby listener stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// The controller's gRPC port.
    Grpc,
    /// The router's port.
    Router,
}

/// Where a standby forwards to: the leader's [`Endpoints::annotation`], and whether that
/// leader is this very process (once a standby leads, it serves on the addresses its standby
/// listeners had, and the connections they accepted before go there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The leader's `grpc=IP:PORT,router=IP:PORT`.
    pub endpoints: String,
    /// The leader is this process.
    pub ours: bool,
}

/// Forwards every connection `listeners` accept to the matching endpoint of the latest
/// [`Target`] in `leader`. A connection that arrives while no leader is known, or while the
/// known one cannot be reached, waits for one (up to [`LEADER_WAIT`]) and is then closed.
/// Runs until dropped; dropping it closes the listeners, while the connections accepted so
/// far go on: forwarded, or still waiting (this process may be the leader they reach).
pub async fn forward(listeners: Vec<(TcpListener, Port)>, leader: watch::Receiver<Option<Target>>) {
    forward_waiting(listeners, leader, LEADER_WAIT).await;
}

/// [`forward`], with a connection waiting `leader_wait` at most for a leader to be known.
async fn forward_waiting(
    listeners: Vec<(TcpListener, Port)>,
    leader: watch::Receiver<Option<Target>>,
    leader_wait: Duration,
) {
    // Never forward to our own addresses while another process is said to serve there (a
    // stale annotation): only to this process once it leads.
    let own: Arc<Vec<SocketAddr>> = Arc::new(
        listeners
            .iter()
            .filter_map(|(l, _)| l.local_addr().ok())
            .collect(),
    );
    let slots = Arc::new(Semaphore::new(MAX_FORWARDED));
    let mut accepts = JoinSet::new();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(TcpStream, Port)>(64);
    for (listener, port) in listeners {
        let tx = tx.clone();
        accepts.spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((conn, _)) => {
                        if tx.send((conn, port)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::debug!(
                            "standby: accept failed: {e}",
                            e = jumpstarter_core::error_chain(&e)
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
    }
    drop(tx);
    while let Some((conn, port)) = rx.recv().await {
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::warn!(
                "standby: {MAX_FORWARDED} connections forwarded already; closed a new one"
            );
            continue;
        };
        let (mut leader, own) = (leader.clone(), Arc::clone(&own));
        // Not tied to this future: accepted connections outlive the listeners.
        tokio::spawn(async move {
            let _slot = slot;
            let mut conn = conn;
            // A leader that has just taken over writes where it serves with its first
            // renewal: a connection that comes before that waits for it (a while).
            let pick = |target: &Option<Target>| {
                let target = target.as_ref()?;
                Endpoints::parse(&target.endpoints)
                    .map(|e| match port {
                        Port::Grpc => e.grpc,
                        Port::Router => e.router,
                    })
                    .filter(|t| target.ours || !own.contains(t))
            };
            // A leader that cannot be reached (it has just died) is tried again only once
            // the Lease names another one: the connection waits for that (a while).
            let deadline = tokio::time::Instant::now() + leader_wait;
            let mut failed: Option<SocketAddr> = None;
            let mut upstream = loop {
                let next = tokio::time::timeout_at(
                    deadline,
                    leader.wait_for(|text| pick(text).is_some_and(|t| Some(t) != failed)),
                )
                .await;
                let Some(target) = next.ok().and_then(Result::ok).and_then(|t| pick(&t)) else {
                    tracing::debug!(
                        "standby: no reachable leader known for {leader_wait:?}; closed a \
                         connection"
                    );
                    return;
                };
                match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
                    Ok(Ok(u)) => break u,
                    Ok(Err(e)) => tracing::debug!(
                        "standby: leader at {target}: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    ),
                    Err(_) => tracing::debug!("standby: leader at {target} did not answer"),
                }
                failed = Some(target);
            };
            let _ = conn.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
        });
    }
}

/// How often a standby checks that the leader still listens.
const PROBE_PERIOD: Duration = Duration::from_millis(250);

/// Refused connections in a row that make the leader count as gone.
const REFUSALS: u32 = 2;

/// Checks, every [`PROBE_PERIOD`], that the leader named in `leader` still accepts
/// connections on its gRPC endpoint, and notifies `gone` after [`REFUSALS`] refusals in a
/// row: its process has died (a killed container's address answers with a reset; a node that
/// is gone does not answer at all, and is replaced when its Lease expires). A leader that
/// serves where this process serves (`own`: a container started again in the same pod, on
/// ports it could bind) is gone for sure: `gone` is notified at once. Runs until dropped.
pub async fn watch_leader(
    leader: watch::Receiver<Option<String>>,
    own: Option<Endpoints>,
    gone: &super::leader::HolderGone,
) {
    let mut refused = 0;
    loop {
        let annotation = leader.borrow().clone();
        let theirs = annotation.as_deref().and_then(Endpoints::parse);
        if theirs.is_some() && theirs == own {
            tracing::info!(
                "standby: the Lease names this pod's own address: its holder was an earlier \
                 run of this container"
            );
            gone.report(annotation.clone());
        }
        tokio::time::sleep(PROBE_PERIOD).await;
        let Some(target) = theirs.map(|e| e.grpc) else {
            refused = 0;
            continue;
        };
        match tokio::time::timeout(PROBE_PERIOD * 2, TcpStream::connect(target)).await {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                refused += 1;
                if refused >= REFUSALS {
                    tracing::info!("standby: the leader at {target} refuses connections");
                    gone.report(annotation.clone());
                    refused = 0;
                }
            }
            _ => refused = 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn endpoints_round_trip_and_bad_text_is_none() {
        let e = Endpoints {
            grpc: "10.0.0.7:8082".parse().unwrap(),
            router: "[fd00::1]:8083".parse().unwrap(),
        };
        assert_eq!(e.annotation(), "grpc=10.0.0.7:8082,router=[fd00::1]:8083");
        assert_eq!(Endpoints::parse(&e.annotation()), Some(e));
        for bad in [
            "",
            "grpc=10.0.0.7:8082",
            "grpc=x,router=y",
            "a=b,grpc=1.2.3.4:1",
        ] {
            assert_eq!(Endpoints::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_unspecified_address_is_advertised_only_with_a_pod_ip() {
        let any: SocketAddr = "0.0.0.0:8082".parse().unwrap();
        let router: SocketAddr = "0.0.0.0:8083".parse().unwrap();
        assert_eq!(Endpoints::advertised(any, router, None), None);
        let e = Endpoints::advertised(any, router, Some("10.1.2.3".parse().unwrap())).unwrap();
        assert_eq!(e.annotation(), "grpc=10.1.2.3:8082,router=10.1.2.3:8083");
        let lo: SocketAddr = "127.0.0.1:9000".parse().unwrap();
        assert_eq!(
            Endpoints::advertised(lo, lo, None).map(|e| e.grpc),
            Some(lo)
        );
    }

    #[tokio::test]
    async fn connections_reach_the_leader_named_in_the_lease() {
        // The "leader": echoes what it gets, prefixed with which port it is.
        let mut leader = Vec::new();
        for tag in ["grpc", "router"] {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            tokio::spawn(async move {
                loop {
                    let (mut c, _) = l.accept().await.unwrap();
                    tokio::spawn(async move {
                        let mut buf = [0u8; 5];
                        c.read_exact(&mut buf).await.unwrap();
                        c.write_all(tag.as_bytes()).await.unwrap();
                        c.write_all(&buf).await.unwrap();
                    });
                }
            });
            leader.push(addr);
        }
        let (tx, rx) = watch::channel(None);
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let router = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (g, r) = (grpc.local_addr().unwrap(), router.local_addr().unwrap());
        let standby = tokio::spawn(forward_waiting(
            vec![(grpc, Port::Grpc), (router, Port::Router)],
            rx,
            Duration::from_millis(300),
        ));

        // No leader known for a while: the connection is closed.
        let mut c = TcpStream::connect(g).await.unwrap();
        let mut out = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0);

        // A connection made before the leader is known waits for it, then reaches it.
        let mut early = TcpStream::connect(g).await.unwrap();
        early.write_all(b"hello").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        tx.send_replace(Some(Target {
            endpoints: Endpoints {
                grpc: leader[0],
                router: leader[1],
            }
            .annotation(),
            ours: false,
        }));
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), early.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "grpchello");
        for (addr, want) in [(g, "grpchello"), (r, "routerhello")] {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"hello").await.unwrap();
            let mut out = Vec::new();
            tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
        standby.abort();
    }

    #[tokio::test]
    async fn a_leader_gone_is_noticed_by_its_refusals_or_its_own_address() {
        // A leader whose port refuses connections (nothing listens there any more).
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead = closed.local_addr().unwrap();
        drop(closed);
        let alive = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live = alive.local_addr().unwrap();
        let at = |grpc| Endpoints { grpc, router: grpc };
        let (_tx, rx) = watch::channel(Some(at(dead).annotation()));
        let gone = super::super::leader::HolderGone::new();
        tokio::time::timeout(Duration::from_secs(5), async {
            tokio::select! {
                _ = watch_leader(rx, None, &gone) => {}
                _ = gone.wait() => {}
            }
        })
        .await
        .expect("a leader refusing connections was not noticed");

        // One that accepts them is not gone.
        let (_tx, rx) = watch::channel(Some(at(live).annotation()));
        let gone = super::super::leader::HolderGone::new();
        let quiet = tokio::time::timeout(Duration::from_millis(1500), async {
            tokio::select! {
                _ = watch_leader(rx, None, &gone) => {}
                _ = gone.wait() => {}
            }
        })
        .await;
        assert!(quiet.is_err(), "a listening leader counted as gone");

        // The Lease names our own address (an earlier run of this container): gone at once.
        let (_tx, rx) = watch::channel(Some(at(live).annotation()));
        let gone = super::super::leader::HolderGone::new();
        tokio::time::timeout(Duration::from_secs(1), async {
            tokio::select! {
                _ = watch_leader(rx, Some(at(live)), &gone) => {}
                _ = gone.wait() => {}
            }
        })
        .await
        .expect("a Lease naming our own address was not taken for a gone holder");
        drop(alive);
    }

    #[tokio::test]
    async fn connections_waiting_when_the_standby_leads_reach_it() {
        let (tx, rx) = watch::channel(None);
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let router = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (g, r) = (grpc.local_addr().unwrap(), router.local_addr().unwrap());
        let own = Endpoints { grpc: g, router: r }.annotation();
        let standby = tokio::spawn(forward(
            vec![(grpc, Port::Grpc), (router, Port::Router)],
            rx,
        ));
        // A stale annotation naming our own addresses: never forwarded to (a loop).
        tx.send_replace(Some(Target {
            endpoints: own.clone(),
            ours: false,
        }));
        let mut early = TcpStream::connect(g).await.unwrap();
        early.write_all(b"hello").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;

        // This process leads: the standby listeners close, the server binds the same
        // address, and says it serves there.
        standby.abort();
        let _ = standby.await;
        let server = TcpListener::bind(g).await.unwrap();
        tokio::spawn(async move {
            let (mut c, _) = server.accept().await.unwrap();
            let mut buf = [0u8; 5];
            c.read_exact(&mut buf).await.unwrap();
            c.write_all(b"leader:").await.unwrap();
            c.write_all(&buf).await.unwrap();
        });
        tx.send_replace(Some(Target {
            endpoints: own,
            ours: true,
        }));
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), early.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "leader:hello");
    }
}
