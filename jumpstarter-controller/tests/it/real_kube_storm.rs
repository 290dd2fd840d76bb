//! Leader handover under a lease storm, against a real `kube-apiserver` (ignored unless asked for: `cargo xtask kube-e2e`).
//!
//! Two `jumpstarter-controller --store kubernetes` processes run as the controller's
//! ServiceAccount with a short leader lease; clients keep creating, awaiting and releasing
//! leases on a few exporters (raw gRPC, as upstream's tools speak it) while the leader is
//! killed with SIGKILL. The standby takes over and the storm goes on against it. Checked:
//! - no lease is lost: every lease a client was told was created is in the store at the end,
//!   released and ended, with the exporter its client saw (a lease is never moved to another
//!   exporter);
//! - no exporter is ever granted to two leases at once: replaying every change of every Lease
//!   (a watch from before the first lease on) never shows two live (not ended) leases naming
//!   the same exporter, and the exporters' Status streams only ever name leases the store
//!   assigned to them;
//! - the standby serves within the lease duration plus a renew period or two (the time from
//!   the kill to its ready line is printed).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use jumpstarter_controller::objects::{Client, Exporter, Lease as LeaseObject};
use jumpstarter_core::{
    auth::ObjectKind,
    client::{ConnectOptions, SessionChannel, connect_channel},
    config::AdminConfig,
};
use jumpstarter_proto::{
    admin_v1::admin_service_client::AdminServiceClient,
    client_v1::{
        CreateLeaseRequest, DeleteLeaseRequest, GetLeaseRequest,
        client_service_client::ClientServiceClient,
    },
    v1::{
        DriverInstanceReport, ExporterStatus, RegisterRequest, ReportStatusRequest, StatusRequest,
        controller_service_client::ControllerServiceClient,
    },
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, WatchEvent, WatchParams};
use tokio::sync::watch;

use crate::{
    Identity,
    admin::{create_client, create_exporter, identity, is_ready, lease_spec},
    real_kube::{SERIAL, admin_client, suffix},
    req,
};

const EXPORTERS: usize = 3;
const CLIENTS: usize = 8;
/// The leader lease: short, so that the test is quick (the default is 15 s).
const LEASE_DURATION: &str = "4s";
const RENEW_PERIOD: &str = "1s";
/// How long the storm runs before the kill, and after the standby serves.
const BEFORE_KILL: Duration = Duration::from_secs(4);
const AFTER_HANDOVER: Duration = Duration::from_secs(8);
/// Upper bound for one operation across the handover (retried on transport errors).
const OP_DEADLINE: Duration = Duration::from_secs(40);

/// A controller process (SIGKILL when dropped) and what it printed.
struct Ctl {
    child: Child,
    events: tokio::sync::mpsc::Receiver<String>,
    log: Arc<Mutex<VecDeque<String>>>,
}

impl Drop for Ctl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Ctl {
    fn spawn(dir: &Path, name: &str) -> Ctl {
        let kubeconfig = std::env::var("JMP_TEST_CONTROLLER_KUBECONFIG").unwrap_or_else(|_| {
            panic!("JMP_TEST_CONTROLLER_KUBECONFIG must name the controller's kubeconfig")
        });
        let mut child = Command::new(env!("CARGO_BIN_EXE_jumpstarter-controller"))
            .args(["--store", "kubernetes", "--namespace", "jumpstarter"])
            .args(["--leader-lease-duration", LEASE_DURATION])
            .args(["--leader-renew-period", RENEW_PERIOD])
            .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
            .args(["--metrics-listen", "off"])
            .arg("--data-dir")
            .arg(dir.join(format!("{name}-data")))
            .arg("--admin-config")
            .arg(dir.join(format!("{name}-admin.yaml")))
            .env("KUBECONFIG", kubeconfig)
            .env("HOSTNAME", name)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, events) = tokio::sync::mpsc::channel(4);
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let keep = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains(jumpstarter_controller::cli::READY_LINE_PREFIX)
                    || line.contains("standing by")
                    || line.contains("standby listeners")
                {
                    let _ = tx.try_send(line.clone());
                }
                let mut log = keep.lock().unwrap();
                if log.len() == 200 {
                    log.pop_front();
                }
                log.push_back(line);
            }
        });
        Ctl { child, events, log }
    }

    fn log(&self) -> String {
        let log = self.log.lock().unwrap();
        log.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Waits for a line containing `needle`; returns it.
    async fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(line)) if line.contains(needle) => return line,
                Ok(Some(_)) => {}
                _ => panic!(
                    "the controller did not print {needle:?} within {timeout:?}; its log:\n{}",
                    self.log()
                ),
            }
        }
    }

    /// Waits for the ready line; returns the advertised endpoint.
    async fn wait_ready(&mut self, timeout: Duration) -> String {
        let line = self
            .wait_for(jumpstarter_controller::cli::READY_LINE_PREFIX, timeout)
            .await;
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix("endpoint="))
            .unwrap_or_else(|| panic!("no endpoint in {line:?}"))
            .to_string()
    }
}

async fn channel(endpoint: &str, ca: &[u8]) -> SessionChannel {
    connect_channel(
        endpoint,
        &ConnectOptions {
            insecure: false,
            passphrase: None,
            ca_pem: Some(ca.to_vec()),
        },
    )
    .await
    .unwrap_or_else(|e| panic!("connecting to {endpoint}: {e}"))
}

/// Errors a call may meet while the leader is gone (the connection dies, nobody listens).
fn transient(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::DeadlineExceeded
    )
}

/// Runs `f` on the current controller until it answers with something other than a
/// transport error; each attempt is cut off after 5 s, the whole after [`OP_DEADLINE`].
async fn retry<T, Fut>(
    conn: &watch::Receiver<SessionChannel>,
    what: &str,
    mut f: impl FnMut(SessionChannel) -> Fut,
) -> Result<T, tonic::Status>
where
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = Instant::now() + OP_DEADLINE;
    loop {
        let ch = conn.borrow().clone();
        let last = match tokio::time::timeout(Duration::from_secs(5), f(ch)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(s)) if !transient(&s) => return Err(s),
            Ok(Err(s)) => s.to_string(),
            Err(_) => "no answer within 5 s".to_string(),
        };
        assert!(
            Instant::now() < deadline,
            "{what}: no controller answered within {OP_DEADLINE:?} (last: {last})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What one client saw of one lease.
#[derive(Debug, Default, Clone)]
struct Seen {
    /// The create call answered (now or on a retry: `AlreadyExists` for our own id).
    created: bool,
    /// Every exporter GetLease named while the lease was Ready.
    exporters: BTreeSet<String>,
    /// When the lease was first seen Ready.
    granted_at: Option<Instant>,
    /// The release call answered.
    released: bool,
}

/// One client: create a lease with its own id, wait until it is Ready, hold it a moment,
/// release it; again, until `stop`.
async fn client_loop(
    who: Identity,
    prefix: String,
    selector: String,
    conn: watch::Receiver<SessionChannel>,
    stop: Arc<AtomicBool>,
) -> BTreeMap<String, Seen> {
    let mut seen = BTreeMap::new();
    for round in 0..1000 {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let id = format!("{prefix}-r{round}");
        let name = format!("namespaces/default/leases/{id}");
        let mut s = Seen::default();
        // Written down before the call: a create that failed on the wire may have happened.
        seen.insert(id.clone(), s.clone());
        let created = retry(&conn, &format!("create {id}"), |ch| {
            let (who, id, selector) = (who.clone(), id.clone(), selector.clone());
            async move {
                ClientServiceClient::new(ch)
                    .create_lease(req(
                        &who,
                        CreateLeaseRequest {
                            parent: "namespaces/default".into(),
                            lease_id: id,
                            lease: Some(lease_spec(&selector, 60)),
                        },
                    ))
                    .await
                    .map(drop)
            }
        })
        .await;
        match created {
            Ok(()) => s.created = true,
            // An earlier attempt reached the store before its answer was lost.
            Err(e) if e.code() == tonic::Code::AlreadyExists => s.created = true,
            Err(e) => panic!("create {id}: {e}"),
        }
        // Until Ready (bounded: a lease waits for one of the exporters).
        let wait_until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < wait_until {
            let l = retry(&conn, &format!("get {id}"), |ch| {
                let (who, name) = (who.clone(), name.clone());
                async move {
                    ClientServiceClient::new(ch)
                        .get_lease(req(&who, GetLeaseRequest { name }))
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await
            .unwrap_or_else(|e| panic!("get {id}: {e}"));
            if is_ready(&l) {
                s.granted_at.get_or_insert_with(Instant::now);
                // `namespaces/NS/exporters/NAME`: the store's exporterRef is the bare name.
                let exporter = l.exporter.clone().unwrap_or_default();
                let bare = exporter.rsplit('/').next().unwrap_or_default().to_owned();
                s.exporters.insert(bare);
                if s.exporters.len() > 1 || stop.load(Ordering::SeqCst) {
                    break;
                }
                // Held a moment, looked at again (the exporter must not change).
                tokio::time::sleep(Duration::from_millis(150)).await;
                if s.granted_at
                    .is_some_and(|t| t.elapsed() > Duration::from_millis(300))
                {
                    break;
                }
                continue;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let released = retry(&conn, &format!("release {id}"), |ch| {
            let (who, name) = (who.clone(), name.clone());
            async move {
                ClientServiceClient::new(ch)
                    .delete_lease(req(&who, DeleteLeaseRequest { name }))
                    .await
                    .map(drop)
            }
        })
        .await;
        match released {
            Ok(()) => s.released = true,
            // Released by an earlier attempt whose answer was lost.
            Err(e) if e.code() == tonic::Code::FailedPrecondition => s.released = true,
            Err(e) => panic!("release {id}: {e}"),
        }
        seen.insert(id, s);
    }
    seen
}

/// One exporter: register, report Available, keep the Status stream open and write down the
/// lease each message names; on a broken stream, do it all again with the current
/// controller, until `stop`.
async fn exporter_loop(
    who: Identity,
    conn: watch::Receiver<SessionChannel>,
    stop: Arc<AtomicBool>,
) -> Vec<String> {
    let mut told = Vec::new();
    for _ in 0..1000 {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let stream = retry(&conn, &format!("exporter {} online", who.name), |ch| {
            let who = who.clone();
            async move {
                let mut ctl = ControllerServiceClient::new(ch);
                ctl.register(req(
                    &who,
                    RegisterRequest {
                        labels: Default::default(),
                        reports: vec![DriverInstanceReport {
                            uuid: uuid::Uuid::new_v4().to_string(),
                            ..Default::default()
                        }],
                    },
                ))
                .await?;
                ctl.report_status(req(
                    &who,
                    ReportStatusRequest {
                        status: ExporterStatus::Available as i32,
                        message: Some("available".into()),
                        release_lease: None,
                    },
                ))
                .await?;
                Ok(ctl.status(req(&who, StatusRequest {})).await?.into_inner())
            }
        })
        .await;
        let Ok(mut stream) = stream else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        loop {
            let next = tokio::time::timeout(Duration::from_millis(500), stream.next()).await;
            match next {
                Ok(Some(Ok(msg))) => {
                    if msg.leased
                        && let Some(l) = msg.lease_name
                        && told.last() != Some(&l)
                    {
                        told.push(l);
                    }
                }
                // Broken or ended: the controller went away.
                Ok(Some(Err(_)) | None) => break,
                Err(_) if stop.load(Ordering::SeqCst) => return told,
                Err(_) => {}
            }
        }
    }
    told
}

/// Replays Lease changes in the store's order: which live lease names each exporter.
#[derive(Default)]
struct Replay {
    /// lease -> (exporter, ended) as last written.
    current: HashMap<String, (Option<String>, bool)>,
    /// Every exporter each lease ever named.
    assigned: HashMap<String, BTreeSet<String>>,
    /// Double grants seen: (resourceVersion, exporter, leases).
    doubles: Vec<String>,
    events: usize,
}

impl Replay {
    fn apply(&mut self, l: &LeaseObject, deleted: bool, ours: &str) {
        let name = l.metadata.name.clone().unwrap_or_default();
        let status = l.status.clone().unwrap_or_default();
        let exporter = status.exporter_ref.as_ref().map(|r| r.name.clone());
        if !exporter.as_deref().is_some_and(|e| e.starts_with(ours)) {
            return;
        }
        self.events += 1;
        if deleted {
            self.current.remove(&name);
        } else {
            self.current
                .insert(name.clone(), (exporter.clone(), status.ended));
        }
        if let Some(e) = exporter {
            self.assigned.entry(name).or_default().insert(e);
        }
        let mut live: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (lease, (exporter, ended)) in &self.current {
            if let (Some(e), false) = (exporter, ended) {
                live.entry(e).or_default().push(lease);
            }
        }
        for (e, leases) in live {
            if leases.len() > 1 {
                self.doubles.push(format!(
                    "at resourceVersion {}: exporter {e} held by live leases {leases:?}",
                    l.metadata.resource_version.as_deref().unwrap_or("?")
                ));
            }
        }
    }
}

/// Watches every Lease of namespace `default` from `version` on, until `stop`.
async fn watch_leases(
    api: Api<LeaseObject>,
    mut version: String,
    ours: String,
    stop: Arc<AtomicBool>,
) -> Replay {
    let mut replay = Replay::default();
    // Bounded: each watch lasts up to 10 s (then resumes from the last version seen).
    for _ in 0..100 {
        let mut stream = api
            .watch(&WatchParams::default().timeout(10), &version)
            .await
            .unwrap()
            .boxed();
        while let Some(ev) = stream.next().await {
            match ev.unwrap() {
                WatchEvent::Added(l) | WatchEvent::Modified(l) => {
                    version = l.metadata.resource_version.clone().unwrap_or(version);
                    replay.apply(&l, false, &ours);
                }
                WatchEvent::Deleted(l) => {
                    version = l.metadata.resource_version.clone().unwrap_or(version);
                    replay.apply(&l, true, &ours);
                }
                WatchEvent::Bookmark(b) => version = b.metadata.resource_version,
                WatchEvent::Error(e) => panic!("watching leases: {e:?}"),
            }
        }
        if stop.load(Ordering::SeqCst) {
            return replay;
        }
    }
    panic!("the lease watch ran for too long")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a real API server: cargo xtask kube-e2e runs it"]
async fn real_leader_handover_under_a_lease_storm() {
    let _serial = SERIAL.lock().await;
    let s = suffix();
    let ours = format!("storm{s}");
    let dir = tempfile::tempdir().unwrap();
    let admin_kube = admin_client().await;
    let leases: Api<LeaseObject> = Api::namespaced(admin_kube.clone(), "default");

    // The leader, then the standby.
    let mut a = Ctl::spawn(dir.path(), "ctl-a");
    let endpoint_a = a.wait_ready(Duration::from_secs(60)).await;
    let mut b = Ctl::spawn(dir.path(), "ctl-b");
    b.wait_for("standing by", Duration::from_secs(30)).await;
    let cfg = AdminConfig::load(&dir.path().join("ctl-a-admin.yaml")).unwrap();
    let ca = cfg.ca_pem().unwrap().unwrap().into_bytes();
    let ch = channel(&endpoint_a, &ca).await;
    let mut admin = AdminServiceClient::new(ch.clone());
    let board = format!("storm={ours}");
    let mut exporters = Vec::new();
    for i in 0..EXPORTERS {
        let c = create_exporter(
            &mut admin,
            &cfg.token,
            &format!("{ours}-e{i}"),
            &[("storm", &ours)],
        )
        .await
        .unwrap();
        exporters.push(identity(ObjectKind::Exporter, &c));
    }
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let c = create_client(&mut admin, &cfg.token, &format!("{ours}-c{i}"), &[])
            .await
            .unwrap();
        clients.push(identity(ObjectKind::Client, &c));
    }

    let stop_watch = Arc::new(AtomicBool::new(false));
    let version = leases
        .list_metadata(&ListParams::default().limit(1))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let watcher = tokio::spawn(watch_leases(
        leases.clone(),
        version,
        ours.clone(),
        stop_watch.clone(),
    ));

    let (conn_tx, conn) = watch::channel(ch);
    let stop = Arc::new(AtomicBool::new(false));
    let exporter_tasks: Vec<_> = exporters
        .iter()
        .map(|e| tokio::spawn(exporter_loop(e.clone(), conn.clone(), stop.clone())))
        .collect();
    let client_tasks: Vec<_> = clients
        .iter()
        .map(|c| {
            tokio::spawn(client_loop(
                c.clone(),
                c.name.clone(),
                board.clone(),
                conn.clone(),
                stop.clone(),
            ))
        })
        .collect();

    tokio::time::sleep(BEFORE_KILL).await;
    // SIGKILL: no release of the leader lease, no goodbye to anyone.
    let killed_at = Instant::now();
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let endpoint_b = b.wait_ready(Duration::from_secs(60)).await;
    let handover = killed_at.elapsed();
    conn_tx.send_replace(channel(&endpoint_b, &ca).await);
    let serving = killed_at.elapsed();
    tokio::time::sleep(AFTER_HANDOVER).await;
    stop.store(true, Ordering::SeqCst);

    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    for t in client_tasks {
        seen.extend(
            tokio::time::timeout(Duration::from_secs(120), t)
                .await
                .expect("a client did not finish")
                .unwrap(),
        );
    }
    let mut told: Vec<(String, Vec<String>)> = Vec::new();
    for (t, e) in exporter_tasks.into_iter().zip(&exporters) {
        let list = tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("an exporter did not finish")
            .unwrap();
        told.push((e.name.clone(), list));
    }

    // Every released lease ends (the new leader reconciles them); bounded.
    let mut stored: HashMap<String, LeaseObject> = HashMap::new();
    for _ in 0..150 {
        stored = leases
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|l| l.spec.client_ref.name.starts_with(&ours))
            .map(|l| (l.metadata.name.clone().unwrap_or_default(), l))
            .collect();
        if stored.values().all(|l| l.is_ended()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_watch.store(true, Ordering::SeqCst);
    let replay = tokio::time::timeout(Duration::from_secs(60), watcher)
        .await
        .expect("the lease watch did not end")
        .unwrap();

    // The standby stops cleanly (and gives the leader lease back for the next test).
    let _ = Command::new("kill")
        .args(["-TERM", &b.child.id().to_string()])
        .status();
    for _ in 0..100 {
        if matches!(b.child.try_wait(), Ok(Some(_))) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let granted_before = seen
        .values()
        .filter(|v| v.granted_at.is_some_and(|t| t < killed_at))
        .count();
    let granted_after = seen
        .values()
        .filter(|v| v.granted_at.is_some_and(|t| t > killed_at + handover))
        .count();
    println!(
        "leader handover (lease {LEASE_DURATION}, renew {RENEW_PERIOD}): kill -9 to the standby's \
         ready line {:.2} s, to a client channel on it {:.2} s; {} leases created by {CLIENTS} \
         clients on {EXPORTERS} exporters, {granted_before} granted before the kill, \
         {granted_after} after the handover; {} lease changes replayed",
        handover.as_secs_f64(),
        serving.as_secs_f64(),
        seen.values().filter(|v| v.created).count(),
        replay.events,
    );

    let mut problems = replay.doubles.clone();
    for (id, v) in &seen {
        let Some(l) = stored.get(id) else {
            if v.created {
                problems.push(format!("lease {id} was created but is not in the store"));
            }
            continue;
        };
        let status = l.status.clone().unwrap_or_default();
        let exporter = status.exporter_ref.map(|r| r.name);
        if !l.is_ended() {
            problems.push(format!("lease {id} did not end after its release"));
        }
        if v.released && !l.spec.release {
            problems.push(format!("lease {id}: released, but spec.release is false"));
        }
        if v.exporters.len() > 1 {
            problems.push(format!(
                "lease {id} moved between exporters {:?}",
                v.exporters
            ));
        }
        if let Some(e) = v.exporters.iter().next()
            && exporter.as_ref() != Some(e)
        {
            problems.push(format!(
                "lease {id}: its client saw exporter {e}, the store says {exporter:?}"
            ));
        }
        if let Some(e) = &exporter
            && replay.assigned.get(id).is_none_or(|a| !a.contains(e))
        {
            problems.push(format!("lease {id}: exporter {e} never seen in the watch"));
        }
    }
    for (e, names) in &told {
        for n in names {
            let id = n.rsplit('/').next().unwrap_or(n);
            if replay
                .assigned
                .get(id)
                .is_none_or(|a| a.len() != 1 || !a.contains(e))
            {
                problems.push(format!(
                    "exporter {e} was told it is leased by {id}, which the store assigned to {:?}",
                    replay.assigned.get(id)
                ));
            }
        }
        // Back and forth between leases would mean two at once.
        let distinct: BTreeSet<&String> = names.iter().collect();
        if distinct.len() != names.len() {
            problems.push(format!(
                "exporter {e} went back to an earlier lease: {names:?}"
            ));
        }
    }
    if granted_before == 0 || granted_after == 0 {
        problems.push(format!(
            "the storm did not run on both sides of the handover ({granted_before} granted \
             before, {granted_after} after)"
        ));
    }
    assert!(
        handover < Duration::from_secs(20),
        "the standby took {handover:?} to serve"
    );

    // Clean up our objects (the ended leases, exporters, clients and their Secrets).
    for id in seen.keys() {
        let _ = leases.delete(id, &DeleteParams::default()).await;
    }
    let exporters_api: Api<Exporter> = Api::namespaced(admin_kube.clone(), "default");
    let clients_api: Api<Client> = Api::namespaced(admin_kube.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(admin_kube.clone(), "default");
    for e in &exporters {
        let _ = exporters_api
            .delete(&e.name, &DeleteParams::default())
            .await;
        let _ = secrets
            .delete(&format!("{}-exporter", e.name), &DeleteParams::default())
            .await;
    }
    for c in &clients {
        let _ = clients_api.delete(&c.name, &DeleteParams::default()).await;
        let _ = secrets
            .delete(&format!("{}-client", c.name), &DeleteParams::default())
            .await;
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n{}\nstandby's log:\n{}",
        problems.len(),
        problems.join("\n"),
        b.log()
    );
    drop(b);
}

/// A standby replica listens on the controller's ports and forwards to the leader (so it is
/// Ready, and a Service may send it anything); once the leader is killed it serves on those
/// same ports itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a real API server: cargo xtask kube-e2e runs it"]
async fn real_a_standby_forwards_to_the_leader_then_serves_on_the_same_ports() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut a = Ctl::spawn(dir.path(), "fwd-a");
    a.wait_ready(Duration::from_secs(60)).await;
    let mut b = Ctl::spawn(dir.path(), "fwd-b");
    let line = b
        .wait_for("standby listeners", Duration::from_secs(30))
        .await;
    let port = line
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("grpc="))
        .and_then(|a| a.rsplit(':').next())
        .map(|p| p.to_string())
        .unwrap_or_else(|| panic!("no grpc address in {line:?}"));
    b.wait_for("standing by", Duration::from_secs(30)).await;
    let cfg = AdminConfig::load(&dir.path().join("fwd-a-admin.yaml")).unwrap();
    let ca = cfg.ca_pem().unwrap().unwrap().into_bytes();
    let via_b = format!("localhost:{port}");

    // Through the standby: the leader answers (once the standby has read where it serves).
    let call = |endpoint: String| {
        let (ca, token) = (ca.clone(), cfg.token.clone());
        async move {
            let ch = connect_channel(
                &endpoint,
                &ConnectOptions {
                    insecure: false,
                    passphrase: None,
                    ca_pem: Some(ca),
                },
            )
            .await
            .map_err(|e| e.to_string())?;
            let mut admin = AdminServiceClient::new(ch);
            let mut req = tonic::Request::new(jumpstarter_proto::admin_v1::ListRequest::default());
            req.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().map_err(|_| "token")?,
            );
            tokio::time::timeout(Duration::from_secs(5), admin.list_exporters(req))
                .await
                .map_err(|_| "timed out".to_string())?
                .map(|_| ())
                .map_err(|s| s.to_string())
        }
    };
    let mut last = String::new();
    let mut forwarded = false;
    for _ in 0..60 {
        match call(via_b.clone()).await {
            Ok(()) => {
                forwarded = true;
                break;
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        forwarded,
        "the standby did not forward: {last}\n{}",
        b.log()
    );

    // The leader dies without a word; the standby takes over on the same address.
    let killed_at = Instant::now();
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let mut served = false;
    for _ in 0..120 {
        if call(via_b.clone()).await.is_ok() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        served,
        "the standby never served after the leader died:\n{}",
        b.log()
    );
    eprintln!(
        "leader killed -> the standby's address answered again after {:?}",
        killed_at.elapsed()
    );
}
