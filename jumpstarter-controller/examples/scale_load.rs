//! Controller load at lab scale (driven by `cargo xtask bench-scale`).
//!
//! `scale_load CONTROLLER_BIN WORK_DIR EXPORTERS CLIENTS DROP IDLE_SECS PER_CONN`
//!
//! Starts the controller (`CONTROLLER_BIN`, data in `WORK_DIR`, a fixed loopback port so that
//! it can be restarted at the same address), creates EXPORTERS exporters (labels
//! `pool=scale`, `bench-id=N`) and CLIENTS clients through the AdminService, and then speaks
//! the exporter protocol for every exporter from this one process, as our exporter does:
//! `Register`, `ReportStatus(AVAILABLE)`, the `Status` stream, and on a lease `Listen` plus
//! `ReportStatus(LEASE_READY)`; a lost stream is retried with the exporter's backoff (500 ms
//! doubling to 30 s, 50-100% jitter). PER_CONN exporters share one HTTP/2 connection.
//!
//! Then, in order:
//! 1. idle: controller CPU and store commits over IDLE_SECS (heartbeats only), RSS;
//! 2. the floor: every client sends a gRPC health check (no token, no store) at the same
//!    moment, over the connections the grants will use: the answers' p50/p99 and the CPU
//!    both processes used; and what an ES256 check of a new token costs here (each client's
//!    first `CreateLease` pays one);
//! 3. grants: every client creates a lease on `pool=scale` at the same moment; each grant is
//!    timed from its `CreateLease` to the leased message on the chosen exporter's stream;
//!    also when each `CreateLease` was answered, and the CPU both processes used until the
//!    last grant;
//! 4. drop (DROP > 0): DROP exporters end their streams at once; the time until the
//!    AdminService lists all of them offline;
//! 5. restart: SIGTERM, then the same controller again; the time until every remaining
//!    exporter holds a Status stream again.
//!
//! Before the restart and at the end it reads how many times the exporter cache listed every
//! exporter (`jumpstarter_controller_exporter_cache_lists_total`; once means the store's watch
//! never cut it off).
//!
//! Prints one JSON line of figures (the last line of stdout). Exits non-zero when a phase
//! does not complete or a count does not add up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt, stream};
use jumpstarter_core::{
    client::channel::{
        AuthChannel, ControllerAuth, GrpcChannel, TlsSettings, connect_authenticated, connect_tls,
    },
    config::AdminConfig,
};
use jumpstarter_proto::{
    admin_v1::{
        self, CreateClientRequest, CreateExporterRequest, ListRequest,
        admin_service_client::AdminServiceClient,
    },
    client_v1::{
        CreateLeaseRequest, DeleteLeaseRequest, Lease, client_service_client::ClientServiceClient,
    },
    v1::{
        DriverInstanceReport, ExporterStatus, ListenRequest, RegisterRequest, ReportStatusRequest,
        StatusRequest, controller_service_client::ControllerServiceClient,
    },
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    process::{Child, Command},
    sync::oneshot,
};
use tonic::service::interceptor::InterceptedService;

/// Where grants are announced: lease name -> who waits for it.
type Waiters = Arc<Mutex<HashMap<String, oneshot::Sender<Instant>>>>;

struct Shared {
    /// Exporters holding a Status stream now.
    connected: AtomicUsize,
    /// Listen calls open now.
    listening: AtomicUsize,
    waiters: Waiters,
}

/// Counts one while alive.
struct Held<'a>(&'a AtomicUsize);

impl<'a> Held<'a> {
    fn new(c: &'a AtomicUsize) -> Self {
        c.fetch_add(1, Ordering::SeqCst);
        Self(c)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// CPU seconds (user + system) of a process, from /proc (clock ticks of 1/100 s).
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// A `/proc/PID/status` field in MiB (`VmRSS`, `VmHWM`).
fn mem_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim_start_matches(':').split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// A free loopback port (bound and released; the controller binds it right after).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Controller {
    child: Child,
    metrics: String,
}

impl Controller {
    fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// Starts the controller and waits for its ready line.
    async fn start(bin: &Path, work: &Path, port: u16, metrics_port: u16) -> Controller {
        let mut cmd = Command::new(bin);
        cmd.arg("--data-dir")
            .arg(work.join("data"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(["--router-listen", "127.0.0.1:0"])
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .arg("--admin-config")
            .arg(work.join("admin.yaml"))
            .env(
                "RUST_LOG",
                std::env::var("SCALE_LOAD_RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("start the controller");
        // The ready line and the logs go to stderr.
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let ready = tokio::time::timeout(Duration::from_secs(120), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains(jumpstarter_controller::cli::READY_LINE_PREFIX) {
                    return Some(line);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .expect("the controller's ready line");
        // Keep draining stderr so the controller never blocks on a full pipe.
        // Its logs are shown with SCALE_LOAD_VERBOSE set.
        let verbose = std::env::var_os("SCALE_LOAD_VERBOSE").is_some();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if verbose {
                    eprintln!("controller: {line}");
                }
            }
        });
        let metrics = ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix("metrics="))
            .unwrap_or_default()
            .to_string();
        Controller { child, metrics }
    }

    /// SIGTERM, then wait for the exit (SIGKILL after 30 s).
    async fn stop(mut self) {
        let pid = self.pid();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }

    /// A counter or gauge from the controller's `/metrics` (summed over its label sets).
    async fn metric(&self, name: &str) -> Option<f64> {
        let mut s = tokio::net::TcpStream::connect(&self.metrics).await.ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut body = String::new();
        tokio::time::timeout(Duration::from_secs(30), s.read_to_string(&mut body))
            .await
            .ok()?
            .ok()?;
        let mut found = None;
        for line in body.lines() {
            let Some(rest) = line.strip_prefix(name) else {
                continue;
            };
            if !(rest.starts_with(' ') || rest.starts_with('{')) {
                continue;
            }
            let v: f64 = rest.rsplit(' ').next()?.parse().ok()?;
            *found.get_or_insert(0.0) += v;
        }
        found
    }
}

/// Waits until `f` holds, polling every 50 ms, up to `limit`; the time it took.
async fn until(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// A delay of 50-100% of `nominal` (the exporter's jitter).
fn jitter(nominal: Duration) -> Duration {
    let r = (uuid::Uuid::new_v4().as_u128() % 1000) as u32;
    nominal / 2 + nominal * r / 2000
}

/// One exporter, for ever: connect, register, hold the Status stream, follow leases;
/// reconnect with backoff when the stream is lost.
async fn exporter(shared: Arc<Shared>, channel: GrpcChannel, name: String, token: String) {
    let md = ControllerAuth::exporter("default", &name, &token)
        .call_metadata("controller")
        .expect("metadata");
    let ctl: ControllerServiceClient<AuthChannel> =
        ControllerServiceClient::new(InterceptedService::new(channel, md));
    let mut delay = Duration::from_millis(500);
    loop {
        if let Err(e) = session(&shared, ctl.clone(), &mut delay).await {
            tracing_free_log(&name, &e);
        }
        tokio::time::sleep(jitter(delay)).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

fn tracing_free_log(name: &str, e: &tonic::Status) {
    if std::env::var_os("SCALE_LOAD_VERBOSE").is_some() {
        eprintln!("{name}: {} {}", e.code(), e.message());
    }
}

async fn report(
    ctl: &mut ControllerServiceClient<AuthChannel>,
    status: ExporterStatus,
) -> Result<(), tonic::Status> {
    ctl.report_status(ReportStatusRequest {
        status: status as i32,
        message: None,
        release_lease: None,
    })
    .await
    .map(|_| ())
}

async fn session(
    shared: &Arc<Shared>,
    mut ctl: ControllerServiceClient<AuthChannel>,
    delay: &mut Duration,
) -> Result<(), tonic::Status> {
    ctl.register(RegisterRequest {
        labels: Default::default(),
        reports: vec![DriverInstanceReport {
            uuid: uuid::Uuid::new_v4().to_string(),
            ..Default::default()
        }],
    })
    .await?;
    report(&mut ctl, ExporterStatus::Available).await?;
    let mut status = ctl.status(StatusRequest {}).await?.into_inner();
    let _held = Held::new(&shared.connected);
    *delay = Duration::from_millis(500);
    let mut lease: Option<(String, tokio::task::JoinHandle<()>)> = None;
    let ended = loop {
        let msg = match status.message().await {
            Ok(Some(m)) => m,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let now_leased = msg.lease_name.filter(|_| msg.leased);
        if now_leased.as_deref() == lease.as_ref().map(|(n, _)| n.as_str()) {
            continue;
        }
        if let Some((_, listen)) = lease.take() {
            listen.abort();
        }
        match now_leased {
            Some(name) => {
                let tx = shared.waiters.lock().unwrap().remove(&name);
                if let Some(tx) = tx {
                    let _ = tx.send(Instant::now());
                }
                // As the exporter does: Listen for router connections, then say it is ready.
                let mut c = ctl.clone();
                let n = name.clone();
                let sh = shared.clone();
                let listen = tokio::spawn(async move {
                    if let Ok(r) = c.listen(ListenRequest { lease_name: n }).await {
                        let _held = Held::new(&sh.listening);
                        let mut s = r.into_inner();
                        while let Ok(Some(_)) = s.message().await {}
                    }
                });
                lease = Some((name, listen));
                report(&mut ctl, ExporterStatus::LeaseReady).await?;
            }
            None => report(&mut ctl, ExporterStatus::Available).await?,
        }
    };
    if let Some((_, listen)) = lease.take() {
        listen.abort();
    }
    ended
}

/// What [`health_burst`] measured.
struct Floor {
    /// The median round's p50 and p99.
    p50_ms: f64,
    p99_ms: f64,
    /// CPU of the controller (`pid`) and of this process per round.
    ctl_cpu_ms: f64,
    gen_cpu_ms: f64,
}

/// How many times [`health_burst`] sends its calls; it reports the median round and the mean
/// CPU (read in 10 ms ticks, so one round would be too coarse).
const FLOOR_ROUNDS: usize = 5;

/// The floor under the grants: `clients` calls of the cheapest RPC the controller serves
/// (gRPC health: no token, no store), over the same connections and released at the same
/// moment, as the `CreateLease` calls will be; [`FLOOR_ROUNDS`] times.
async fn health_burst(channels: &[GrpcChannel], clients: usize, pid: u32) -> Floor {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let per_channel = clients.div_ceil(channels.len().max(1)).max(1);
    let (mut p50s, mut p99s) = (Vec::new(), Vec::new());
    let ctl_cpu0 = cpu_secs(pid);
    let gen_cpu0 = cpu_secs(std::process::id());
    for _ in 0..FLOOR_ROUNDS {
        let gate = Arc::new(tokio::sync::Barrier::new(clients + 1));
        let tasks: Vec<_> = (0..clients)
            .map(|i| {
                let mut health = HealthClient::new(channels[i / per_channel].clone());
                let gate = gate.clone();
                tokio::spawn(async move {
                    gate.wait().await;
                    let start = Instant::now();
                    health
                        .check(HealthCheckRequest {
                            service: String::new(),
                        })
                        .await
                        .map(|_| start.elapsed().as_secs_f64() * 1000.0)
                })
            })
            .collect();
        gate.wait().await;
        let mut ms = Vec::with_capacity(clients);
        for t in tasks {
            ms.push(t.await.expect("health task").expect("health check"));
        }
        ms.sort_by(|a, b| a.total_cmp(b));
        p50s.push(percentile(&ms, 0.5));
        p99s.push(percentile(&ms, 0.99));
    }
    // The CPU includes spawning the tasks and waiting at the gate (microseconds beside the
    // calls).
    let rounds = FLOOR_ROUNDS as f64;
    let ctl_cpu_ms = (cpu_secs(pid) - ctl_cpu0) * 1000.0 / rounds;
    let gen_cpu_ms = (cpu_secs(std::process::id()) - gen_cpu0) * 1000.0 / rounds;
    p50s.sort_by(|a, b| a.total_cmp(b));
    p99s.sort_by(|a, b| a.total_cmp(b));
    Floor {
        p50_ms: percentile(&p50s, 0.5),
        p99_ms: percentile(&p99s, 0.5),
        ctl_cpu_ms,
        gen_cpu_ms,
    }
}

/// What the ES256 check of a token not seen before costs on this machine (µs, median of
/// `n`), with the controller's own verifier: each client's first call pays it once.
fn es256_check_us(n: usize) -> f64 {
    use jumpstarter_controller::auth::TokenIssuer;
    use jumpstarter_core::auth::{ObjectKind, Subject};
    let issuer = TokenIssuer::generate().expect("key");
    let tokens: Vec<String> = (0..n.max(1))
        .map(|i| {
            let subject = Subject {
                kind: ObjectKind::Client,
                namespace: "default".into(),
                name: format!("es256-{i}"),
                uid: format!("uid-{i}"),
            };
            issuer.issue(&subject).expect("issue").token
        })
        .collect();
    let mut us: Vec<f64> = tokens
        .iter()
        .map(|t| {
            let start = Instant::now();
            issuer.verify(t).expect("verify");
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    us.sort_by(|a, b| a.total_cmp(b));
    percentile(&us, 0.5)
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> T {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("argument {} ({what}) missing or invalid", i + 1))
}

/// A figure for the JSON line (`-1` when it could not be taken).
fn fig(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "-1".into()
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bin = PathBuf::from(args.first().expect("CONTROLLER_BIN"));
    let work = PathBuf::from(args.get(1).expect("WORK_DIR"));
    let n: usize = arg(&args, 2, "EXPORTERS");
    let clients: usize = arg(&args, 3, "CLIENTS");
    let drop_n: usize = arg(&args, 4, "DROP");
    let idle_secs: u64 = arg(&args, 5, "IDLE_SECS");
    let per_conn: usize = arg::<usize>(&args, 6, "PER_CONN").max(1);
    assert!(clients <= n, "more clients than exporters");
    assert!(drop_n <= n, "more to drop than exporters");

    let port = free_port();
    let metrics_port = free_port();
    let controller = Controller::start(&bin, &work, port, metrics_port).await;
    let admin_cfg = AdminConfig::load(&work.join("admin.yaml")).expect("admin config");
    let tls = TlsSettings {
        ca_pem: admin_cfg.ca_pem().expect("ca"),
        insecure: false,
    };
    let endpoint = admin_cfg.endpoint.clone();
    let admin = AdminServiceClient::new(
        connect_authenticated(&endpoint, &tls, &ControllerAuth::bearer(&admin_cfg.token))
            .await
            .expect("connect admin"),
    );

    // Credentials, in bulk through the AdminService (as `jmp admin create` does).
    let t0 = Instant::now();
    let exporters: Vec<(usize, String)> = stream::iter(0..n)
        .map(|i| {
            let mut admin = admin.clone();
            async move {
                let r = admin
                    .create_exporter(CreateExporterRequest {
                        exporter: Some(admin_v1::Exporter {
                            namespace: "default".into(),
                            name: format!("scale-{i}"),
                            labels: [
                                ("pool".to_string(), "scale".to_string()),
                                ("bench-id".to_string(), i.to_string()),
                            ]
                            .into(),
                            ..Default::default()
                        }),
                    })
                    .await?;
                let token = r.into_inner().credentials.map(|c| c.token);
                Ok::<_, tonic::Status>((i, token.unwrap_or_default()))
            }
        })
        .buffer_unordered(32)
        .try_collect()
        .await
        .expect("create exporters");
    let client_tokens: Vec<(usize, String)> = stream::iter(0..clients)
        .map(|i| {
            let mut admin = admin.clone();
            async move {
                let r = admin
                    .create_client(CreateClientRequest {
                        client: Some(admin_v1::Client {
                            namespace: "default".into(),
                            name: format!("scale-client-{i}"),
                            ..Default::default()
                        }),
                    })
                    .await?;
                let token = r.into_inner().credentials.map(|c| c.token);
                Ok::<_, tonic::Status>((i, token.unwrap_or_default()))
            }
        })
        .buffer_unordered(32)
        .try_collect()
        .await
        .expect("create clients");
    let create_secs = t0.elapsed().as_secs_f64();

    // Every exporter connects, registers and holds its Status stream.
    let shared = Arc::new(Shared {
        connected: AtomicUsize::new(0),
        listening: AtomicUsize::new(0),
        waiters: Arc::default(),
    });
    let conns = n.div_ceil(per_conn);
    let mut channels = Vec::with_capacity(conns);
    for _ in 0..conns {
        channels.push(connect_tls(&endpoint, &tls).await.expect("connect"));
    }
    let mut tasks = Vec::with_capacity(n);
    let mut sorted = exporters;
    sorted.sort_by_key(|(i, _)| *i);
    for (i, token) in sorted {
        tasks.push(tokio::spawn(exporter(
            shared.clone(),
            channels[i / per_conn].clone(),
            format!("scale-{i}"),
            token,
        )));
    }
    let registered = until(Duration::from_secs(900), || {
        shared.connected.load(Ordering::SeqCst) == n
    })
    .await;
    let Some(registered) = registered else {
        panic!(
            "only {} of {n} exporters hold a Status stream after 900 s",
            shared.connected.load(Ordering::SeqCst)
        );
    };
    let register_secs = registered.as_secs_f64();
    eprintln!("scale_load: {n} exporters registered in {register_secs:.1} s");

    // Idle: heartbeats only. Let the registration's writes and reconcile passes settle first.
    tokio::time::sleep(Duration::from_secs(idle_secs.min(15))).await;
    let pid = controller.pid();
    let commits0 = controller
        .metric("jumpstarter_controller_store_commits_total")
        .await;
    let cpu0 = cpu_secs(pid);
    let idle_start = Instant::now();
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let cpu1 = cpu_secs(pid);
    let idle_elapsed = idle_start.elapsed().as_secs_f64();
    let commits1 = controller
        .metric("jumpstarter_controller_store_commits_total")
        .await;
    let idle_cpu_pct = (cpu1 - cpu0) / idle_elapsed * 100.0;
    let commits_per_sec = match (commits0, commits1) {
        (Some(a), Some(b)) => (b - a) / idle_elapsed,
        _ => f64::NAN,
    };
    let rss_idle = mem_mib(pid, "VmRSS");
    eprintln!(
        "scale_load: idle {idle_elapsed:.0} s: CPU {idle_cpu_pct:.1}%, {commits_per_sec:.1} commits/s, RSS {rss_idle:.0} MiB"
    );

    // Grants: every client asks for a lease on the pool at the same moment.
    let client_conns = clients.div_ceil(per_conn).max(1);
    let mut client_channels = Vec::with_capacity(client_conns);
    for _ in 0..client_conns {
        client_channels.push(connect_tls(&endpoint, &tls).await.expect("connect"));
    }
    let floor = health_burst(&client_channels, clients, pid).await;
    let es256_us = es256_check_us(clients);
    eprintln!(
        "scale_load: the floor: {clients} gRPC health checks at once ({FLOOR_ROUNDS} rounds, the median) answered p50 {:.1} ms, \
         p99 {:.1} ms, CPU a round: controller {:.0} ms, load generator {:.0} ms; an ES256 check of a \
         new token takes {es256_us:.0} µs here",
        floor.p50_ms, floor.p99_ms, floor.ctl_cpu_ms, floor.gen_cpu_ms
    );

    let gate = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut lease_tasks = Vec::with_capacity(clients);
    for (i, token) in client_tokens {
        let md = ControllerAuth::client("default", &format!("scale-client-{i}"), &token)
            .call_metadata("controller")
            .expect("metadata");
        let mut client = ClientServiceClient::new(InterceptedService::new(
            client_channels[i / per_conn].clone(),
            md,
        ));
        let waiters = shared.waiters.clone();
        let gate = gate.clone();
        lease_tasks.push(tokio::spawn(async move {
            let name = uuid::Uuid::now_v7().to_string();
            let (tx, rx) = oneshot::channel();
            waiters.lock().unwrap().insert(name.clone(), tx);
            gate.wait().await;
            let start = Instant::now();
            client
                .create_lease(CreateLeaseRequest {
                    parent: "namespaces/default".into(),
                    lease_id: name.clone(),
                    lease: Some(Lease {
                        selector: "pool=scale".into(),
                        duration: Some(prost_types::Duration {
                            seconds: 600,
                            nanos: 0,
                        }),
                        ..Default::default()
                    }),
                })
                .await?;
            let created_ms = start.elapsed().as_secs_f64() * 1000.0;
            let granted = tokio::time::timeout(Duration::from_secs(300), rx).await;
            let ms = match granted {
                Ok(Ok(at)) => Some(at.duration_since(start).as_secs_f64() * 1000.0),
                _ => None,
            };
            Ok::<_, tonic::Status>((client, name, created_ms, ms))
        }));
    }
    // CPU of both processes over the burst, from the moment the calls leave to the last
    // grant: what the two cores had to do in that time.
    let ctl_cpu0 = cpu_secs(pid);
    let gen_cpu0 = cpu_secs(std::process::id());
    gate.wait().await;
    let all_start = Instant::now();
    if std::env::var_os("SCALE_LOAD_VERBOSE").is_some() {
        eprintln!("scale_load: grants asked at {}", jiff::Timestamp::now());
    }
    let mut grants = Vec::with_capacity(clients);
    let mut creates = Vec::with_capacity(clients);
    let mut leased = Vec::with_capacity(clients);
    for t in lease_tasks {
        let (client, name, created_ms, ms) = t.await.expect("lease task").expect("create lease");
        grants.extend(ms);
        creates.push(created_ms);
        leased.push((client, name));
    }
    let grant_all_secs = all_start.elapsed().as_secs_f64();
    let grant_ctl_cpu_ms = (cpu_secs(pid) - ctl_cpu0) * 1000.0;
    let grant_gen_cpu_ms = (cpu_secs(std::process::id()) - gen_cpu0) * 1000.0;
    creates.sort_by(|a, b| a.total_cmp(b));
    let granted = grants.len();
    let listening = until(Duration::from_secs(60), || {
        shared.listening.load(Ordering::SeqCst) == clients
    })
    .await
    .is_some();
    let rss_leased = mem_mib(pid, "VmRSS");
    stream::iter(leased)
        .map(|(mut client, name)| async move {
            client
                .delete_lease(DeleteLeaseRequest {
                    name: format!("namespaces/default/leases/{name}"),
                })
                .await
        })
        .buffer_unordered(64)
        .try_collect::<Vec<_>>()
        .await
        .expect("delete leases");
    let released = until(Duration::from_secs(120), || {
        shared.listening.load(Ordering::SeqCst) == 0
    })
    .await
    .is_some();
    grants.sort_by(|a, b| a.total_cmp(b));
    if std::env::var_os("SCALE_LOAD_VERBOSE").is_some() {
        let deciles: Vec<String> = (1..=10)
            .map(|d| format!("{:.0}", percentile(&grants, f64::from(d) / 10.0)))
            .collect();
        eprintln!("scale_load: grant deciles (ms) {}", deciles.join(" "));
    }
    eprintln!(
        "scale_load: {granted} of {clients} leases granted, p50 {:.1} ms, p99 {:.1} ms; \
         CreateLease answered p50 {:.1} ms, p99 {:.1} ms; CPU until the last grant: \
         controller {grant_ctl_cpu_ms:.0} ms, load generator {grant_gen_cpu_ms:.0} ms",
        percentile(&grants, 0.5),
        percentile(&grants, 0.99),
        percentile(&creates, 0.5),
        percentile(&creates, 0.99),
    );

    // Drop: DROP exporters lose their streams at once.
    let mut drop_secs = f64::NAN;
    let mut wrongly_offline = 0usize;
    if drop_n > 0 {
        for t in &tasks[..drop_n] {
            t.abort();
        }
        let t = Instant::now();
        let mut admin = admin.clone();
        let deadline = Duration::from_secs(300);
        while t.elapsed() < deadline {
            let list = admin
                .list_exporters(ListRequest {
                    namespace: "default".into(),
                    selector: "pool=scale".into(),
                })
                .await
                .expect("list exporters")
                .into_inner()
                .exporters;
            let dropped = |name: &str| {
                name.strip_prefix("scale-")
                    .and_then(|i| i.parse::<usize>().ok())
                    .is_some_and(|i| i < drop_n)
            };
            let noticed = list
                .iter()
                .filter(|e| dropped(&e.name) && !e.online)
                .count();
            wrongly_offline = list
                .iter()
                .filter(|e| !dropped(&e.name) && !e.online)
                .count();
            if noticed == drop_n {
                drop_secs = t.elapsed().as_secs_f64();
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!("scale_load: {drop_n} dropped exporters listed offline after {drop_secs:.1} s");
    }
    let rss_hwm = mem_mib(pid, "VmHWM");
    // How often the exporter cache listed every exporter: once at start, more when the
    // store's watch cut it off.
    let cache_lists = controller
        .metric("jumpstarter_controller_exporter_cache_lists_total")
        .await
        .unwrap_or(f64::NAN);

    // Restart: the same controller, same data, same address.
    let remaining = n - drop_n;
    controller.stop().await;
    let _ = until(Duration::from_secs(60), || {
        shared.connected.load(Ordering::SeqCst) == 0
    })
    .await;
    let t = Instant::now();
    let controller = Controller::start(&bin, &work, port, metrics_port).await;
    let restart_ready_secs = t.elapsed().as_secs_f64();
    let back = until(Duration::from_secs(900), || {
        shared.connected.load(Ordering::SeqCst) == remaining
    })
    .await;
    let reregister_secs = back.map_or(f64::NAN, |_| t.elapsed().as_secs_f64());
    let reconnected = shared.connected.load(Ordering::SeqCst);
    eprintln!(
        "scale_load: {reconnected} of {remaining} exporters back after {reregister_secs:.1} s"
    );
    let hwm_after_restart = mem_mib(controller.pid(), "VmHWM");
    let cache_lists_after_restart = controller
        .metric("jumpstarter_controller_exporter_cache_lists_total")
        .await
        .unwrap_or(f64::NAN);
    eprintln!(
        "scale_load: the exporter cache listed every exporter {cache_lists:.0} times \
         (after the restart {cache_lists_after_restart:.0}); once means never cut off"
    );
    for t in &tasks {
        t.abort();
    }
    controller.stop().await;

    let loadgen_cpu = cpu_secs(std::process::id());
    println!(
        "{{\"exporters\": {n}, \"clients\": {clients}, \"dropped\": {drop_n}, \"conns\": {conns}, \
         \"create_secs\": {}, \"register_secs\": {}, \"idle_secs\": {}, \"idle_cpu_pct\": {}, \
         \"store_commits_per_sec\": {}, \"rss_idle_mib\": {}, \"rss_leased_mib\": {}, \
         \"rss_hwm_mib\": {}, \"granted\": {granted}, \"listening\": {listening}, \
         \"released\": {released}, \"grant_p50_ms\": {}, \"grant_p99_ms\": {}, \
         \"grant_max_ms\": {}, \"grant_all_secs\": {}, \"create_p50_ms\": {}, \
         \"create_p99_ms\": {}, \"grant_ctl_cpu_ms\": {}, \"grant_gen_cpu_ms\": {}, \
         \"drop_notice_secs\": {}, \
         \"wrongly_offline\": {wrongly_offline}, \"restart_ready_secs\": {}, \
         \"reconnected\": {reconnected}, \"reregister_secs\": {}, \
         \"hwm_after_restart_mib\": {}, \"loadgen_cpu_secs\": {}, \"cache_lists\": {}, \
         \"cache_lists_after_restart\": {}, \"floor_p50_ms\": {}, \"floor_p99_ms\": {}, \
         \"floor_ctl_cpu_ms\": {}, \"floor_gen_cpu_ms\": {}, \"es256_check_us\": {}}}",
        fig(create_secs),
        fig(register_secs),
        fig(idle_elapsed),
        fig(idle_cpu_pct),
        fig(commits_per_sec),
        fig(rss_idle),
        fig(rss_leased),
        fig(rss_hwm),
        fig(percentile(&grants, 0.5)),
        fig(percentile(&grants, 0.99)),
        fig(grants.last().copied().unwrap_or(f64::NAN)),
        fig(grant_all_secs),
        fig(percentile(&creates, 0.5)),
        fig(percentile(&creates, 0.99)),
        fig(grant_ctl_cpu_ms),
        fig(grant_gen_cpu_ms),
        fig(drop_secs),
        fig(restart_ready_secs),
        fig(reregister_secs),
        fig(hwm_after_restart),
        fig(loadgen_cpu),
        fig(cache_lists),
        fig(cache_lists_after_restart),
        fig(floor.p50_ms),
        fig(floor.p99_ms),
        fig(floor.ctl_cpu_ms),
        fig(floor.gen_cpu_ms),
        fig(es256_us),
    );
    let ok = granted == clients
        && listening
        && released
        && (drop_n == 0 || drop_secs.is_finite())
        && wrongly_offline == 0
        && reconnected == remaining;
    if !ok {
        eprintln!("scale_load: the counts do not add up (see the JSON line)");
        std::process::exit(1);
    }
}
