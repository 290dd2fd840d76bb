//! The router dies in the middle of a distributed session and comes back: the controller
//! (assembled here from its library parts, so that its router list can name a router this
//! test controls) keeps the lease, and the client's next call succeeds once a router
//! answers again. The router is reached through a TCP front that can be killed (every
//! connection cut, nothing listening) and brought back on the same port, which is what
//! clients and exporters see of a router process that dies and restarts.
//!
//! Covered: a call in flight when the router dies fails within seconds (it does not hang);
//! a call made while no router answers waits and succeeds once the router is back; with
//! `--retry-timeout 0`, an unreachable router is one clear error at once.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use jumpstarter_controller::auth::TokenIssuer;
use jumpstarter_controller::{
    ClientApi, ControllerApi, ControllerState, RouterEntry,
    objects::{Client, ClientSpec, Exporter, ExporterSpec, ExporterStatusValue},
    run_reconcile_loop,
    store::{SqliteStore, Store},
};
use jumpstarter_core::{
    auth::{CertificateAuthority, ObjectKind, Subject},
    config::encode_ca,
    server::nodelay_incoming,
};
use jumpstarter_proto::{
    client_v1::client_service_server::ClientServiceServer,
    v1::controller_service_server::ControllerServiceServer,
};
use jumpstarter_router::RouterTokenKey;
use tokio::{
    net::{TcpListener, TcpStream},
    process::{Child, Command},
    task::JoinHandle,
};
use tonic::transport::{Server, ServerTlsConfig};

use crate::{J, JMP};

/// The router as the outside sees it: `localhost:port`, killable and restartable.
struct RouterFront {
    port: u16,
    target: SocketAddr,
    accept: Option<JoinHandle<()>>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

/// Binds a loopback port below the kernel's ephemeral range, so that while the front is
/// dead no outgoing connection (of this or any other test) can be given its port, and
/// [`RouterFront::restart`] can always listen on it again.
async fn bind_fixed_port() -> TcpListener {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (from, to) = (low.saturating_sub(12_000).max(10_000), low);
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64;
    let span = u64::from(to - from);
    for i in 0..500u64 {
        let port = from + ((seed.wrapping_mul(2_654_435_761).wrapping_add(i * 7919)) % span) as u16;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)).await {
            return l;
        }
    }
    panic!("no free port in {from}..{to}");
}

impl RouterFront {
    async fn start(target: SocketAddr) -> Self {
        let listener = bind_fixed_port().await;
        let port = listener.local_addr().unwrap().port();
        let mut front = Self {
            port,
            target,
            accept: None,
            conns: Arc::default(),
        };
        front.serve(listener);
        front
    }

    fn serve(&mut self, listener: TcpListener) {
        let (target, conns) = (self.target, self.conns.clone());
        self.accept = Some(tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns.lock().unwrap().push(task);
            }
        }));
    }

    /// Every connection is cut and nothing listens any more.
    async fn kill(&mut self) {
        // An aborted task is dropped (closing its sockets) only once the runtime gets to
        // it: wait for that, so that nothing answers when this returns.
        let mut tasks: Vec<JoinHandle<()>> = self.conns.lock().unwrap().drain(..).collect();
        tasks.extend(self.accept.take());
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
    }

    /// Listens again on the same port.
    async fn restart(&mut self) {
        let mut last = None;
        for _ in 0..50 {
            match TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(l) => return self.serve(l),
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("cannot listen on {} again: {last:?}", self.port);
    }
}

impl Drop for RouterFront {
    fn drop(&mut self) {
        if let Some(a) = self.accept.take() {
            a.abort();
        }
        for t in self.conns.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

/// A controller whose only router is behind a [`RouterFront`].
struct Lab {
    dir: tempfile::TempDir,
    state: Arc<ControllerState<SqliteStore>>,
    ca_pem: String,
    port: u16,
    router: RouterFront,
    router_stats: Arc<jumpstarter_router::RouterStats>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn lab() -> Lab {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::generate("router faults CA").unwrap();
    let identity = ca.issue_server_cert(&["localhost", "127.0.0.1"]).unwrap();
    let (key, _) = RouterTokenKey::generate().unwrap();
    let mut tasks = Vec::new();

    let router_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let router_addr = router_listener.local_addr().unwrap();
    let router = jumpstarter_router::Router::new(key.clone(), Default::default());
    let router_stats = router.stats();
    let router_identity = identity.clone();
    tasks.push(tokio::spawn(async move {
        let _ = jumpstarter_router::serve(
            router,
            router_listener,
            Some(router_identity),
            jumpstarter_core::server::listener::ConnectionGuard::new("router", Default::default()),
            std::future::pending(),
        )
        .await;
    }));
    let front = RouterFront::start(router_addr).await;

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let store = SqliteStore::open(dir.path().join("data")).await.unwrap();
    let state = ControllerState::new(
        store,
        Arc::new(TokenIssuer::generate().unwrap()),
        key,
        vec![RouterEntry {
            name: "default".into(),
            endpoint: format!("localhost:{}", front.port),
            labels: Default::default(),
        }],
        format!("localhost:{port}"),
    );
    tasks.push(tokio::spawn(run_reconcile_loop(
        state.clone(),
        std::future::pending(),
    )));
    let server = Server::builder()
        .tls_config(ServerTlsConfig::new().identity(identity.identity()))
        .unwrap()
        .add_service(ControllerServiceServer::new(ControllerApi(state.clone())))
        .add_service(ClientServiceServer::new(ClientApi(state.clone())));
    tasks.push(tokio::spawn(async move {
        let _ = server.serve_with_incoming(nodelay_incoming(listener)).await;
    }));
    Lab {
        dir,
        state,
        ca_pem: ca.cert_pem().to_string(),
        port,
        router: front,
        router_stats,
        tasks,
    }
}

impl Lab {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn config(&self, kind: &str, name: &str, token: &str, rest: &str) -> PathBuf {
        let yaml = format!(
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: {kind}\nmetadata:\n  namespace: default\n  \
             name: {name}\nendpoint: \"localhost:{port}\"\ntoken: \"{token}\"\ntls:\n  ca: \"{ca}\"\n  \
             insecure: false\n{rest}",
            port = self.port,
            ca = encode_ca(&self.ca_pem),
        );
        let path = self.path(&format!("{name}.{kind}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path
    }

    fn token(&self, kind: ObjectKind, name: &str, uid: String) -> String {
        self.state
            .auth
            .issuer
            .issue(&Subject::new(kind, "default", name, uid))
            .unwrap()
            .token
    }

    async fn exporter(&self, name: &str, board: &str) -> PathBuf {
        let mut e = Exporter::new(name, ExporterSpec::default());
        e.metadata.namespace = Some("default".into());
        e.metadata.labels = Some([("board".to_string(), board.to_string())].into());
        let e = self.state.store.create(&e).await.unwrap();
        let token = self.token(ObjectKind::Exporter, name, e.metadata.uid.unwrap());
        self.config(
            "ExporterConfig",
            name,
            &token,
            "export:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n  \
             storage:\n    type: jumpstarter_driver_opendal.driver.MockStorageMux\n",
        )
    }

    async fn client(&self, name: &str) -> PathBuf {
        let mut c = Client::new(name, ClientSpec::default());
        c.metadata.namespace = Some("default".into());
        let c = self.state.store.create(&c).await.unwrap();
        let token = self.token(ObjectKind::Client, name, c.metadata.uid.unwrap());
        self.config(
            "ClientConfig",
            name,
            &token,
            "drivers:\n  allow: []\n  unsafe: true\n",
        )
    }

    fn cmd(&self, bin: &str) -> Command {
        let j_dir = Path::new(J).parent().unwrap();
        let path = format!(
            "{}:{}",
            j_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut c = Command::new(bin);
        c.current_dir(self.dir.path())
            .env("PATH", path)
            .env("JMP_CLIENT_CONFIG_HOME", self.path("config"))
            .env("XDG_CONFIG_HOME", self.dir.path())
            .env("XDG_RUNTIME_DIR", self.dir.path())
            .env("TMPDIR", self.dir.path())
            .env_remove("JMP_LOG")
            .env_remove("JUMPSTARTER_HOST")
            .env_remove("JMP_LEASE")
            .env_remove("JMP_NAME")
            .env_remove("JMP_GRPC_INSECURE")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    async fn wait_available(&self, name: &str) {
        for _ in 0..300 {
            let e: Option<Exporter> = self.state.store.get("default", name).await.unwrap();
            if e.and_then(|e| e.status).and_then(|s| s.exporter_status)
                == Some(ExporterStatusValue::Available)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "{name} never became available:\n{}",
            self.log("exporter.log")
        );
    }

    async fn wait_file(&self, name: &str, child: &mut Child) {
        for _ in 0..600 {
            if self.path(name).exists() {
                return;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the shell exited ({status}) before {name} appeared");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{name} never appeared");
    }
}

/// Sends a signal to a process (`STOP`, `CONT`).
async fn signal(child: &Child, sig: &str) {
    let pid = child.id().expect("the process is gone").to_string();
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &pid])
        .status()
        .await
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid}");
}

impl Lab {
    async fn start_exporter(&self, name: &str, board: &str) -> Child {
        let exporter_cfg = self.exporter(name, board).await;
        let log = std::fs::File::create(self.path("exporter.log")).unwrap();
        let child = self
            .cmd(JMP)
            .args(["run", "--exporter-config"])
            .arg(&exporter_cfg)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.wait_available(name).await;
        child
    }

    async fn wait_until(&self, what: &str, child: &mut Child, ok: impl Fn() -> bool) {
        for _ in 0..600 {
            if ok() {
                return;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the shell exited ({status}) before {what}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{what}: never happened");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_router_mid_session_then_the_next_call_succeeds_once_it_is_back() {
    let mut lab = lab().await;
    let exporter = lab.start_exporter("rf1", "router-faults").await;
    let client = lab.client("hello").await;

    // 1. A call works. 2. `read -n 2 -i 3`: the first reading opens the tunnel, the second
    // is in flight (the exporter is stopped) when the router dies. 3. A call made while the
    // router is down.
    let mut sh = lab
        .cmd(JMP)
        .arg("shell")
        .arg("--client-config")
        .arg(&client)
        .args(["-l", "board=router-faults", "--"])
        .args([
            "sh",
            "-c",
            "j power on && touch step1 && while [ ! -f step2 ]; do sleep 0.1; done && \
             { j power read -n 2 -i 3 > inflight.out 2> inflight.err; echo $? > inflight.rc; } && \
             while [ ! -f step3 ]; do sleep 0.1; done && touch calling && j power read",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    lab.wait_file("step1", &mut sh).await;
    assert!(lab.router_stats.tunnels_total.load(Ordering::Relaxed) >= 1);

    // The call in flight: its tunnel is up (first reading printed), the exporter stops
    // answering, the second read is sent, and then the router dies.
    std::fs::write(lab.path("step2"), "").unwrap();
    lab.wait_until("the first reading", &mut sh, || {
        lab.log("inflight.out").contains("voltage=5.0 V")
    })
    .await;
    signal(&exporter, "STOP").await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(
        !lab.path("inflight.rc").exists(),
        "the in-flight call ended before the router died: {}{}",
        lab.log("inflight.out"),
        lab.log("inflight.err")
    );
    lab.router.kill().await;
    let killed = std::time::Instant::now();
    assert!(
        TcpStream::connect(("127.0.0.1", lab.router.port))
            .await
            .is_err(),
        "the router still answers"
    );
    lab.wait_until("the in-flight call ended", &mut sh, || {
        lab.path("inflight.rc").exists() && !lab.log("inflight.rc").is_empty()
    })
    .await;
    let took = killed.elapsed();
    signal(&exporter, "CONT").await;
    // A correctness bound (it used to hang for over a minute), not a performance claim.
    assert!(
        took < Duration::from_secs(20),
        "the call in flight took {took:?} to fail"
    );
    assert_ne!(
        lab.log("inflight.rc").trim(),
        "0",
        "{}",
        lab.log("inflight.out")
    );
    let err = lab.log("inflight.err");
    assert!(err.contains("Error"), "{err}");

    // A call made while no router answers waits, and succeeds once a router is back.
    std::fs::write(lab.path("step3"), "").unwrap();
    lab.wait_file("calling", &mut sh).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    lab.router.restart().await;
    let out = tokio::time::timeout(Duration::from_secs(90), sh.wait_with_output())
        .await
        .expect("the shell did not finish")
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{stderr}\n{}",
        lab.log("exporter.log")
    );
    assert!(stdout.contains("voltage=5.0 V"), "{stdout}");
    // Said once, not per attempt; and the loss of the router was reported, naming it.
    assert_eq!(
        stderr.matches("Waiting for the router").count(),
        1,
        "{stderr}"
    );
    let endpoint = format!("localhost:{}", lab.router.port);
    assert!(
        stderr.contains(&format!("Lost the connection to router {endpoint}")),
        "{stderr}"
    );
    // The lease outlived the router: still the one the shell started with.
    assert!(stderr.matches("Waiting for lease").count() <= 1, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_retry_fails_at_once_with_one_clear_line_while_the_router_is_down() {
    let mut lab = lab().await;
    let _exporter = lab.start_exporter("rf2", "router-faults-2").await;
    let client = lab.client("hello2").await;
    lab.router.kill().await;

    let started = std::time::Instant::now();
    let out = lab
        .cmd(JMP)
        .arg("shell")
        .arg("--client-config")
        .arg(&client)
        .args([
            "--retry-timeout",
            "0",
            "--no-direct",
            "-l",
            "board=router-faults-2",
            "--",
            "j",
            "power",
            "on",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("jmp shell hung")
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    // No waiting: the lease is granted at once here, and nothing is retried.
    assert!(took < Duration::from_secs(15), "took {took:?}: {stderr}");
    assert!(!stderr.contains("Waiting for the router"), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("Error")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    let endpoint = format!("localhost:{}", lab.router.port);
    assert!(
        errors[0].starts_with("Error: ") && errors[0].contains(&endpoint),
        "{stderr}"
    );
}

#[tokio::test]
async fn bad_retry_timeout_is_refused_naming_the_flag() {
    let lab = lab().await;
    let client = lab.client("hello3").await;
    let out = lab
        .cmd(JMP)
        .arg("shell")
        .arg("--client-config")
        .arg(&client)
        .args(["--retry-timeout", "soon", "-l", "a=b", "--", "true"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr.contains("--retry-timeout") && stderr.contains("soon"),
        "{stderr}"
    );
}
