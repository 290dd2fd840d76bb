//! What a standby controller replica does while another one leads: it listens on the
//! controller's own ports and forwards each connection, byte for byte, to the leader.
//!
//! The whole controller (services, Listen queues, the reconcile loop, the in-process router)
//! runs in the leader only. A standby that opened none of its ports would never pass the
//! Deployment's readiness probe, so a Deployment of two replicas would never be Available
//! and every rolling update would stall. Instead every replica is Ready and the Service
//! spreads connections over all of them: a standby forwards its share to the leader, found
//! in the leader election Lease ([`super::leader::ENDPOINTS_ANNOTATION`], `grpc=IP:PORT,
//! router=IP:PORT`, and [`super::leader::UI_ENDPOINT_ANNOTATION`] when the leader serves the
//! web dashboard where standbys can reach it; [`Endpoints`] reads both as one text, with
//! `,ui=IP:PORT` last). TLS passes through untouched (every replica serves the same
//! certificate, from the key Secret), so clients and exporters see the leader itself; the
//! dashboard's plain HTTP goes through the same way, so a browser reaches the leader's pages
//! (and its sessions) on any replica.
//!
//! When the leader goes away its forwarded connections break like its own; clients and
//! exporters reconnect by themselves, and reach the new leader (the standby that took the
//! Lease now serves on the same ports).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use jumpstarter_core::sync::LockExt;
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

/// Where the leader serves: its controller gRPC and router listeners, and its web
/// dashboard's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoints {
    /// The controller's gRPC listener.
    pub grpc: SocketAddr,
    /// The in-process router's listener.
    pub router: SocketAddr,
    /// The web dashboard's listener; `None` when the leader serves none the standbys can
    /// reach (dashboard off, on loopback only, or a leader of a version that did not say).
    pub ui: Option<SocketAddr>,
}

impl Endpoints {
    /// The annotation text: `grpc=IP:PORT,router=IP:PORT`, then `,ui=IP:PORT` with a
    /// dashboard.
    pub fn annotation(self) -> String {
        let mut text = format!("grpc={},router={}", self.grpc, self.router);
        if let Some(ui) = self.ui {
            text.push_str(&format!(",ui={ui}"));
        }
        text
    }

    /// Reads [`Endpoints::annotation`]'s text (with or without `ui`); `None` for anything
    /// else.
    pub fn parse(text: &str) -> Option<Self> {
        let (mut grpc, mut router, mut ui) = (None, None, None);
        for part in text.split(',') {
            let (slot, a) = match part.trim().split_once('=') {
                Some(("grpc", a)) => (&mut grpc, a),
                Some(("router", a)) => (&mut router, a),
                Some(("ui", a)) => (&mut ui, a),
                _ => return None,
            };
            *slot = Some(a.parse::<SocketAddr>().ok()?);
        }
        Some(Self {
            grpc: grpc?,
            router: router?,
            ui,
        })
    }

    /// Where this process serves, for the standbys: the bound addresses, with `pod_ip`
    /// (the downward API's `status.podIP`, as `POD_IP`) in place of an unspecified one.
    /// `None` when the gRPC or router address is unspecified and there is no pod IP: the
    /// standbys could not reach us (and loopback would be their own port). The dashboard
    /// (`ui`) is left out on the same condition, and when it listens on loopback while the
    /// gRPC port does not (the default `127.0.0.1:8086` in a Pod: no other Pod reaches it).
    pub fn advertised(
        grpc: SocketAddr,
        router: SocketAddr,
        ui: Option<SocketAddr>,
        pod_ip: Option<std::net::IpAddr>,
    ) -> Option<Self> {
        let fix = |a: SocketAddr| match (a.ip().is_unspecified(), pod_ip) {
            (false, _) => Some(a),
            (true, Some(ip)) => Some(SocketAddr::new(ip, a.port())),
            (true, None) => None,
        };
        let grpc = fix(grpc)?;
        Some(Self {
            grpc,
            router: fix(router)?,
            ui: ui
                .and_then(fix)
                .filter(|u| !u.ip().is_loopback() || grpc.ip().is_loopback()),
        })
    }

    /// Whether `self` and `other` name the same gRPC and router addresses (the same
    /// process's ports, whatever either says of the dashboard).
    fn same_ports(&self, other: &Self) -> bool {
        self.grpc == other.grpc && self.router == other.router
    }
}

/// Which of the leader's listeners a standby listener stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// The controller's gRPC port.
    Grpc,
    /// The router's port.
    Router,
    /// The web dashboard's port.
    Ui,
}

/// Where a standby forwards to: the leader's [`Endpoints::annotation`], and whether that
/// leader is this very process (once a standby leads, it serves on the addresses its standby
/// listeners had, and the connections they accepted before go there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The leader's `grpc=IP:PORT,router=IP:PORT[,ui=IP:PORT]`.
    pub endpoints: String,
    /// The leader is this process.
    pub ours: bool,
}

/// Forwards every connection `listeners` accept to the matching endpoint of the latest
/// [`Target`] in `leader`. A connection that arrives while no leader is known, or while the
/// known one cannot be reached, waits for one (up to [`LEADER_WAIT`]) and is then closed.
/// A dashboard connection ([`Port::Ui`]) to a leader that names no dashboard is closed at
/// once (logged once per such leader).
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
    // The last leader whose missing dashboard was logged: once per leader, not per request.
    let no_ui_logged: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
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
        let no_ui_logged = Arc::clone(&no_ui_logged);
        // Not tied to this future: accepted connections outlive the listeners.
        tokio::spawn(async move {
            let _slot = slot;
            let mut conn = conn;
            // A leader that has just taken over writes where it serves with its first
            // renewal: a connection that comes before that waits for it (a while).
            let pick = |target: &Option<Target>| {
                let target = target.as_ref()?;
                let e = Endpoints::parse(&target.endpoints)?;
                Some(match port {
                    Port::Grpc => Pick::To(e.grpc),
                    Port::Router => Pick::To(e.router),
                    Port::Ui => e.ui.map_or(Pick::NoUi, Pick::To),
                })
                .filter(|p| match p {
                    Pick::To(t) => target.ours || !own.contains(t),
                    Pick::NoUi => true,
                })
            };
            // A leader that cannot be reached (it has just died) is tried again only once
            // the Lease names another one: the connection waits for that (a while).
            let deadline = tokio::time::Instant::now() + leader_wait;
            let mut failed: Option<SocketAddr> = None;
            let mut upstream = loop {
                let next = tokio::time::timeout_at(
                    deadline,
                    leader.wait_for(|text| match pick(text) {
                        Some(Pick::To(t)) => Some(t) != failed,
                        Some(Pick::NoUi) => true,
                        None => false,
                    }),
                )
                .await;
                let Some((picked, text)) = next
                    .ok()
                    .and_then(Result::ok)
                    .and_then(|t| Some((pick(&t)?, t.as_ref()?.endpoints.clone())))
                else {
                    tracing::debug!(
                        "standby: no reachable leader known for {leader_wait:?}; closed a \
                         connection"
                    );
                    return;
                };
                let target = match picked {
                    Pick::To(target) => target,
                    Pick::NoUi => {
                        let mut logged = no_ui_logged.lock_or_recover();
                        if logged.as_deref() != Some(text.as_str()) {
                            tracing::warn!(
                                "standby: the leader ({text}) serves no dashboard this replica \
                                 can reach (off, or on loopback only): dashboard connections \
                                 to this replica are closed"
                            );
                            *logged = Some(text);
                        }
                        return;
                    }
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

/// Where one forwarded connection goes, as the leader's [`Endpoints`] say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    /// This address.
    To(SocketAddr),
    /// Nowhere: a dashboard connection, and the leader names no dashboard.
    NoUi,
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
        if let (Some(t), Some(o)) = (&theirs, &own)
            && t.same_ports(o)
        {
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
        // A leader without a dashboard, or of a version that did not name one: the old form.
        let e = Endpoints {
            grpc: "10.0.0.7:8082".parse().unwrap(),
            router: "[fd00::1]:8083".parse().unwrap(),
            ui: None,
        };
        assert_eq!(e.annotation(), "grpc=10.0.0.7:8082,router=[fd00::1]:8083");
        assert_eq!(Endpoints::parse(&e.annotation()), Some(e));
        assert_eq!(
            Endpoints::parse("router=[fd00::1]:8083, grpc=10.0.0.7:8082"),
            Some(e)
        );
        // With the dashboard.
        let with_ui = Endpoints {
            ui: Some("10.0.0.7:8086".parse().unwrap()),
            ..e
        };
        assert_eq!(
            with_ui.annotation(),
            "grpc=10.0.0.7:8082,router=[fd00::1]:8083,ui=10.0.0.7:8086"
        );
        assert_eq!(Endpoints::parse(&with_ui.annotation()), Some(with_ui));
        for bad in [
            "",
            "grpc=10.0.0.7:8082",
            "ui=10.0.0.7:8086",
            "grpc=10.0.0.7:8082,ui=10.0.0.7:8086",
            "grpc=x,router=y",
            "grpc=10.0.0.7:8082,router=[fd00::1]:8083,ui=",
            "grpc=10.0.0.7:8082,router=[fd00::1]:8083,ui=10.0.0.7",
            "grpc=10.0.0.7:8082,router=[fd00::1]:8083,ui",
            "grpc=10.0.0.7:8082,router=[fd00::1]:8083,",
            "grpc=10.0.0.7:8082,router=[fd00::1]:8083,web=10.0.0.7:8086",
            "a=b,grpc=1.2.3.4:1",
        ] {
            assert_eq!(Endpoints::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_unspecified_address_is_advertised_only_with_a_pod_ip() {
        let any: SocketAddr = "0.0.0.0:8082".parse().unwrap();
        let router: SocketAddr = "0.0.0.0:8083".parse().unwrap();
        let ui: SocketAddr = "0.0.0.0:8086".parse().unwrap();
        let pod = Some("10.1.2.3".parse().unwrap());
        assert_eq!(Endpoints::advertised(any, router, Some(ui), None), None);
        let e = Endpoints::advertised(any, router, None, pod).unwrap();
        assert_eq!(e.annotation(), "grpc=10.1.2.3:8082,router=10.1.2.3:8083");
        let e = Endpoints::advertised(any, router, Some(ui), pod).unwrap();
        assert_eq!(
            e.annotation(),
            "grpc=10.1.2.3:8082,router=10.1.2.3:8083,ui=10.1.2.3:8086"
        );
        // The default dashboard address, loopback in a Pod: no other Pod reaches it.
        let lo_ui: SocketAddr = "127.0.0.1:8086".parse().unwrap();
        let e = Endpoints::advertised(any, router, Some(lo_ui), pod).unwrap();
        assert_eq!(e.ui, None);
        // Everything on loopback (replicas on one machine): all of it is advertised.
        let lo: SocketAddr = "127.0.0.1:9000".parse().unwrap();
        let e = Endpoints::advertised(lo, lo, Some(lo_ui), None).unwrap();
        assert_eq!((e.grpc, e.ui), (lo, Some(lo_ui)));
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
                ui: None,
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
        let at = |grpc| Endpoints {
            grpc,
            router: grpc,
            ui: None,
        };
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
        let own = Endpoints {
            grpc: g,
            router: r,
            ui: None,
        }
        .annotation();
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

    /// A fake leader's dashboard on a new loopback port (see [`serve_fake_dashboard`]).
    async fn fake_dashboard() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        serve_fake_dashboard(l);
        addr
    }

    /// Answers each HTTP request on `l` with a page naming the leader and the request line.
    fn serve_fake_dashboard(l: TcpListener) {
        tokio::spawn(async move {
            loop {
                let (mut c, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut req = Vec::new();
                    let mut buf = [0u8; 256];
                    while !req.ends_with(b"\r\n\r\n") {
                        let n = c.read(&mut buf).await.unwrap();
                        assert!(n > 0, "request cut short");
                        req.extend_from_slice(&buf[..n]);
                    }
                    let first = String::from_utf8_lossy(&req)
                        .lines()
                        .next()
                        .unwrap()
                        .to_owned();
                    let body = format!("leader's dashboard: {first}");
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    c.write_all(reply.as_bytes()).await.unwrap();
                });
            }
        });
    }

    /// Sends a GET of `path` to `addr`; everything that comes back before the close (nothing
    /// when the connection is closed or reset unanswered).
    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut c = TcpStream::connect(addr).await.unwrap();
        // A connection the standby closes may refuse the request: what comes back says.
        let _ = c
            .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await;
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out))
            .await
            .expect("the standby held the connection")
            .unwrap_or(0);
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn dashboard_connections_reach_the_leaders_dashboard() {
        let dashboard = fake_dashboard().await;
        let (tx, rx) = watch::channel(None);
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ui = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let u = ui.local_addr().unwrap();
        let standby = tokio::spawn(forward_waiting(
            vec![(grpc, Port::Grpc), (ui, Port::Ui)],
            rx,
            Duration::from_secs(5),
        ));
        let unused: SocketAddr = "127.0.0.1:1".parse().unwrap();
        tx.send_replace(Some(Target {
            endpoints: Endpoints {
                grpc: unused,
                router: unused,
                ui: Some(dashboard),
            }
            .annotation(),
            ours: false,
        }));
        let page = get(u, "/ui/login").await;
        assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
        assert!(
            page.ends_with("leader's dashboard: GET /ui/login HTTP/1.1"),
            "{page}"
        );
        standby.abort();
    }

    #[tokio::test]
    async fn a_dashboard_connection_waiting_at_takeover_reaches_this_replicas_dashboard() {
        let (tx, rx) = watch::channel(None);
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let router = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ui = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let own = Endpoints {
            grpc: grpc.local_addr().unwrap(),
            router: router.local_addr().unwrap(),
            ui: Some(ui.local_addr().unwrap()),
        };
        let standby = tokio::spawn(forward(
            vec![(grpc, Port::Grpc), (router, Port::Router), (ui, Port::Ui)],
            rx,
        ));
        // No leader known yet: the browser's request waits.
        let waiting = tokio::spawn(get(own.ui.unwrap(), "/ui/login"));
        tokio::time::sleep(Duration::from_millis(100)).await;

        // This process leads: the standby's dashboard listener closes, the dashboard server
        // binds the same address, and this process names it.
        standby.abort();
        let _ = standby.await;
        serve_fake_dashboard(TcpListener::bind(own.ui.unwrap()).await.unwrap());
        tx.send_replace(Some(Target {
            endpoints: own.annotation(),
            ours: true,
        }));
        let page = waiting.await.unwrap();
        assert!(
            page.ends_with("leader's dashboard: GET /ui/login HTTP/1.1"),
            "{page}"
        );
        // And the next request reaches the server itself.
        let page = get(own.ui.unwrap(), "/ui").await;
        assert!(page.ends_with("GET /ui HTTP/1.1"), "{page}");
    }

    #[tokio::test]
    async fn dashboard_connections_are_closed_at_once_when_the_leader_names_no_dashboard() {
        let (tx, rx) = watch::channel(None);
        let ui = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let u = ui.local_addr().unwrap();
        // Waiting for a leader would take an hour: a close within the test's seconds is the
        // leader's missing dashboard, not the wait running out.
        let standby = tokio::spawn(forward_waiting(
            vec![(ui, Port::Ui)],
            rx,
            Duration::from_secs(3600),
        ));
        let unused: SocketAddr = "127.0.0.1:1".parse().unwrap();
        // The old two-field form (a leader of an earlier version, or with its dashboard off).
        tx.send_replace(Some(Target {
            endpoints: format!("grpc={unused},router={unused}"),
            ours: false,
        }));
        for _ in 0..2 {
            assert_eq!(get(u, "/ui/login").await, "");
        }
        // A connection waiting for a leader is closed as soon as one without a dashboard
        // shows up.
        tx.send_replace(None);
        let waiting = tokio::spawn(get(u, "/ui"));
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.send_replace(Some(Target {
            endpoints: format!("grpc={unused},router={unused}"),
            ours: false,
        }));
        assert_eq!(waiting.await.unwrap(), "");
        standby.abort();
    }
}
