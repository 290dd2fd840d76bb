//! The direct path: a `jmp run` exporter with `--direct-listener` serves its leased client
//! over per-lease mutual TLS, so `jmp shell` traffic bypasses the router (whose byte
//! counter, read from the controller's metrics, stays flat); without it, or with
//! `--no-direct`, or when the advertised endpoint is unreachable, everything goes through
//! the router. The refusals (no client certificate, another lease's certificate, an ended
//! lease's certificate) are checked at the TLS/gRPC level with the library.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::Arc,
    time::Duration,
};

use jumpstarter_controller::{
    ControllerConfig, RunningController,
    objects::{Client, ClientSpec, Exporter, ExporterSpec, ExporterStatusValue},
    start,
    store::Store,
};
use jumpstarter_core::{
    Session,
    auth::{ObjectKind, Subject},
    client::direct::{DIRECT_CONNECT_TIMEOUT, DirectTarget},
    config::{ExporterConfig, encode_ca},
    server::direct::{DirectListenerSpec, DirectServer, LeaseCredentials},
};
use jumpstarter_proto::v1::{Endpoint, exporter_service_client::ExporterServiceClient};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    process::{Child, Command},
};
use tokio_util::sync::CancellationToken;

use crate::{J, JMP, MOCK_CONFIG};

/// 64 MiB: the bulk transfer each way.
const BULK: usize = 64 * 1024 * 1024;

struct Lab {
    ctl: RunningController,
    dir: tempfile::TempDir,
}

async fn lab() -> Lab {
    let dir = tempfile::tempdir().unwrap();
    let ctl = start(ControllerConfig {
        metrics_listen: Some("127.0.0.1:0".into()),
        ..ControllerConfig::loopback(dir.path().join("data"))
    })
    .await
    .unwrap();
    Lab { ctl, dir }
}

impl Lab {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn config_yaml(&self, kind: &str, name: &str, uid: String, object: ObjectKind) -> String {
        let token = self
            .ctl
            .state
            .auth
            .issuer
            .issue(&Subject::new(object, "default", name, uid))
            .unwrap()
            .token;
        format!(
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: {kind}\nmetadata:\n  namespace: default\n  \
             name: {name}\nendpoint: \"localhost:{port}\"\ntoken: \"{token}\"\ntls:\n  ca: \"{ca}\"\n  \
             insecure: false\n",
            port = self.ctl.addr.port(),
            ca = encode_ca(&self.ctl.ca_pem),
        )
    }

    /// An Exporter object with label `board=NAME` and its config (MockPower + storage mux).
    async fn exporter(&self, name: &str) -> PathBuf {
        let mut e = Exporter::new(name, ExporterSpec::default());
        e.metadata.namespace = Some("default".into());
        e.metadata.labels = Some([("board".to_string(), name.to_string())].into());
        let e = self.ctl.state.store.create(&e).await.unwrap();
        let yaml = self.config_yaml(
            "ExporterConfig",
            name,
            e.metadata.uid.unwrap(),
            ObjectKind::Exporter,
        ) + "export:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n  \
               storage:\n    type: jumpstarter_driver_opendal.driver.MockStorageMux\n";
        let path = self.path(&format!("{name}.exporter.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path
    }

    async fn client(&self, name: &str) -> PathBuf {
        let mut c = Client::new(name, ClientSpec::default());
        c.metadata.namespace = Some("default".into());
        let c = self.ctl.state.store.create(&c).await.unwrap();
        let yaml = self.config_yaml(
            "ClientConfig",
            name,
            c.metadata.uid.unwrap(),
            ObjectKind::Client,
        ) + "drivers:\n  allow: []\n  unsafe: true\n";
        let path = self.path(&format!("{name}.client.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path
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
            .env_remove("JMP_GRPC_INSECURE")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    /// `jmp run --exporter-config CONFIG EXTRA...`, logging to `NAME.log`; waits until the
    /// exporter is available.
    async fn run_exporter(&self, name: &str, extra: &[&str]) -> Child {
        let config = self.exporter(name).await;
        let log = std::fs::File::create(self.path(&format!("{name}.log"))).unwrap();
        let child = self
            .cmd(JMP)
            .args(["run", "--exporter-config"])
            .arg(config)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        for _ in 0..300 {
            let e: Option<Exporter> = self.ctl.state.store.get("default", name).await.unwrap();
            let status = e.and_then(|e| e.status).and_then(|s| s.exporter_status);
            if status == Some(ExporterStatusValue::Available) {
                return child;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "exporter {name} never became available:\n{}",
            self.log(name)
        );
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{name}.log"))).unwrap_or_default()
    }

    /// Runs `jmp shell -l board=BOARD ARGS -- sh -c SCRIPT`; returns (code, stdout, stderr).
    async fn shell(&self, board: &str, args: &[&str], script: &str) -> (i32, String, String) {
        let client = self.client(&format!("c-{board}-{}", args.len())).await;
        let child = self
            .cmd(JMP)
            .arg("shell")
            .arg("--client-config")
            .arg(client)
            .args(["-l", &format!("board={board}")])
            .args(args)
            .args(["--", "sh", "-c", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
            .await
            .expect("the shell did not finish in time")
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The router's forwarded-bytes counter, from the controller's metrics.
    async fn router_bytes(&self) -> u64 {
        let addr = self.ctl.metrics_addr.unwrap();
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut text = String::new();
        conn.read_to_string(&mut text).await.unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("jumpstarter_router_bytes_forwarded_total "))
            .unwrap_or_else(|| panic!("no router byte counter in {text}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// Writes the bulk test file (not random, but not compressible to nothing either).
    fn bulk_file(&self) {
        let mut data = vec![0u8; BULK];
        let mut x: u32 = 0x1234_5678;
        for b in data.iter_mut() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = x as u8;
        }
        std::fs::write(self.path("big"), data).unwrap();
    }
}

const ROUND_TRIP: &str = "j power on && j storage write-local-file big && \
                          j storage read-local-file back && cmp big back && echo same";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_listener_carries_calls_and_bulk_data_past_the_router() {
    let lab = lab().await;
    let _exporter = lab
        .run_exporter("dx1", &["--direct-listener", "127.0.0.1:0"])
        .await;
    lab.bulk_file();
    let before = lab.router_bytes().await;
    let (code, out, err) = lab.shell("dx1", &[], ROUND_TRIP).await;
    let after = lab.router_bytes().await;
    assert_eq!(code, 0, "{out}{err}\n{}", lab.log("dx1"));
    assert!(out.contains("same"), "{out}");
    assert!(
        err.contains("Connected to dx1 directly (127.0.0.1:"),
        "{err}"
    );
    // Only the first report went through the router.
    assert!(
        after - before < 1024 * 1024,
        "the router forwarded {} bytes",
        after - before
    );
    assert!(lab.log("dx1").contains("direct listener on 127.0.0.1:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j_takes_the_direct_path_itself_and_the_shells_socket_when_it_cannot() {
    let lab = lab().await;
    let _exporter = lab
        .run_exporter("dx7", &["--direct-listener", "127.0.0.1:0"])
        .await;
    // Past a socket that is not there, `j` can only have used the direct path (and without
    // the direct path file it must fail there); with a direct path file that is not there,
    // only the shell's socket.
    let script = "JUMPSTARTER_HOST=/nonexistent/sock j power on && echo direct-ok; \
                  JMP_DIRECT_ENDPOINT=/nonexistent j power on && echo socket-ok; \
                  env -u JMP_DIRECT_ENDPOINT JUMPSTARTER_HOST=/nonexistent/sock j power on \
                  || echo socket-needed";
    let (code, out, err) = lab.shell("dx7", &[], script).await;
    assert_eq!(code, 0, "{out}{err}\n{}", lab.log("dx7"));
    for want in ["direct-ok", "socket-ok", "socket-needed"] {
        assert!(out.contains(want), "no {want} in {out}{err}");
    }
    let (code, out, err) = lab
        .shell(
            "dx7",
            &["--no-direct"],
            "test -z \"$JMP_DIRECT_ENDPOINT\" && echo unset",
        )
        .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("unset"), "{out}{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_direct_flag_keeps_bulk_data_on_the_router() {
    let lab = lab().await;
    let _exporter = lab
        .run_exporter("dx2", &["--direct-listener", "127.0.0.1:0"])
        .await;
    lab.bulk_file();
    let before = lab.router_bytes().await;
    let (code, out, err) = lab.shell("dx2", &["--no-direct"], ROUND_TRIP).await;
    let after = lab.router_bytes().await;
    assert_eq!(code, 0, "{out}{err}\n{}", lab.log("dx2"));
    assert!(out.contains("same"), "{out}");
    assert!(err.contains("Connected to dx2 via router"), "{err}");
    assert!(
        after - before > 2 * BULK as u64,
        "the router forwarded only {} bytes",
        after - before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_listener_bulk_data_goes_via_the_router() {
    let lab = lab().await;
    let _exporter = lab.run_exporter("dx3", &[]).await;
    lab.bulk_file();
    let before = lab.router_bytes().await;
    let (code, out, err) = lab.shell("dx3", &[], ROUND_TRIP).await;
    let after = lab.router_bytes().await;
    assert_eq!(code, 0, "{out}{err}\n{}", lab.log("dx3"));
    assert!(err.contains("Connected to dx3 via router"), "{err}");
    assert!(
        after - before > 2 * BULK as u64,
        "the router forwarded only {} bytes",
        after - before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_direct_endpoint_falls_back_to_the_router() {
    let lab = lab().await;
    // Advertised on an address nobody listens on: the probe is refused.
    let _exporter = lab
        .run_exporter(
            "dx4",
            &[
                "--direct-listener",
                "127.0.0.1:0",
                "--direct-advertise",
                "127.0.0.2",
            ],
        )
        .await;
    let started = std::time::Instant::now();
    let (code, out, err) = lab.shell("dx4", &[], "j power on && j power read").await;
    assert_eq!(code, 0, "{out}{err}\n{}", lab.log("dx4"));
    assert!(out.contains("voltage=5.0 V"), "{out}");
    assert!(err.contains("Connected to dx4 via router"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_direct_listener_is_a_clear_error() {
    let lab = lab().await;
    let config = lab.exporter("dx5").await;
    let out = lab
        .cmd(JMP)
        .args(["run", "--exporter-config"])
        .arg(&config)
        .args(["--direct-listener", "localhost:notaport"])
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("localhost:notaport") && err.contains("PORT"),
        "{err}"
    );
}

/// The direct listener's address, from the exporter's log.
fn direct_addr(log: &str) -> String {
    log.split("direct listener on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no direct listener address in:\n{log}"))
        .to_string()
}

/// Waits (bounded) until `cond` holds.
async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..600 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} did not happen within a minute");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_its_limit_the_direct_listener_closes_new_connections_and_logs_it() {
    let lab = lab().await;
    let mut exporter = lab
        .run_exporter(
            "dx6",
            &[
                "--direct-listener",
                "127.0.0.1:0",
                "--max-connections",
                "1",
                "--handshake-timeout",
                "120",
            ],
        )
        .await;
    let addr = direct_addr(&lab.log("dx6"));

    // While no lease is served, a connection is closed at once, and the log says why.
    let mut early = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(60), early.read(&mut buf))
        .await
        .expect("a connection while no lease is served was kept open")
        .unwrap_or(0);
    assert_eq!(n, 0, "a connection while no lease is served got bytes");
    let no_lease = "direct listener: closed a connection from 127.0.0.1:";
    wait_for("the no-lease log line", || {
        lab.log("dx6").contains(no_lease) && lab.log("dx6").contains("no lease is being served")
    })
    .await;

    // A client holds a lease (its command waits for `release`): the lease is served on the
    // direct listener.
    let client = lab.client("c-dx6").await;
    let script = "touch held; i=0; while [ ! -e release ] && [ $i -lt 1200 ]; do \
                  sleep 0.1; i=$((i+1)); done";
    let holder = lab
        .cmd(JMP)
        .arg("shell")
        .arg("--client-config")
        .arg(client)
        .args(["-l", "board=dx6", "--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the lease", || lab.path("held").exists()).await;

    // One slot: the lease holder's direct connection or the first of these two (kept in
    // its TLS handshake) takes it, so at least one of them is over the limit and closed at
    // once, and the exporter says so.
    let mut first = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut second = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut b1, mut b2) = ([0u8; 16], [0u8; 16]);
    let n = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::select! {
            r = first.read(&mut b1) => r.unwrap_or(0),
            r = second.read(&mut b2) => r.unwrap_or(0),
        }
    })
    .await
    .expect("no connection over the limit was closed");
    assert_eq!(n, 0, "a connection over the limit got bytes");
    let warning = "direct listener: connection limit of 1 reached; closed 1 new connection(s)";
    wait_for("the limit warning", || lab.log("dx6").contains(warning)).await;

    std::fs::write(lab.path("release"), b"").unwrap();
    let out = tokio::time::timeout(Duration::from_secs(120), holder.wait_with_output())
        .await
        .expect("the lease holder did not finish")
        .unwrap();
    let _ = exporter.kill().await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        lab.log("dx6")
    );
}

/// A session of the mock exporter, ready for calls.
fn mock_session() -> Arc<Session> {
    let cfg = ExporterConfig::parse(MOCK_CONFIG, Path::new("mock.yaml")).unwrap();
    let tree = jumpstarter_drivers::stock_registry().build(&cfg).unwrap();
    Session::new_ready(tree, Default::default())
}

async fn get_report(target: &DirectTarget) -> Result<String, String> {
    let channel = target.channel().await.map_err(|e| e.to_string())?;
    tokio::time::timeout(
        Duration::from_secs(5),
        ExporterServiceClient::new(channel).get_report(()),
    )
    .await
    .map_err(|_| "timed out".to_string())?
    .map(|r| r.into_inner().uuid)
    .map_err(|s| s.message().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_listener_refuses_everyone_but_the_current_lease() {
    let spec = DirectListenerSpec::parse("127.0.0.1:0", None).unwrap();
    let server = DirectServer::bind(&spec).await.unwrap();
    let endpoint = server.advertised_endpoint();
    assert!(endpoint.starts_with("127.0.0.1:"), "{endpoint}");

    let session1 = mock_session();
    // Before any lease: nothing is advertised.
    assert!(session1.report().alternative_endpoints.is_empty());
    let lease1 = CancellationToken::new();
    let task1 = server.serve_lease("l1", &session1, lease1.clone()).unwrap();
    let report = session1.report();
    assert_eq!(report.alternative_endpoints.len(), 1);
    let ep1 = report.alternative_endpoints[0].clone();
    assert_eq!(ep1.endpoint, endpoint);

    // The holder of lease 1 gets through, to the same session.
    let good = DirectTarget::from_endpoint(&ep1).unwrap();
    assert_eq!(get_report(&good).await.unwrap(), report.uuid);
    good.check(&report.uuid, DIRECT_CONNECT_TIMEOUT)
        .await
        .unwrap();
    assert!(
        good.check("another-session", DIRECT_CONNECT_TIMEOUT)
            .await
            .is_err()
    );

    // No client certificate: refused.
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&ep1.certificate))
        .domain_name("127.0.0.1");
    let anonymous = tonic::transport::Endpoint::from_shared(format!("https://{endpoint}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await;
    if let Ok(channel) = anonymous {
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            ExporterServiceClient::new(channel).get_report(()),
        )
        .await
        .expect("the server neither answered nor refused");
        assert!(r.is_err(), "a client without a certificate got a report");
    }

    // A client certificate of another lease's CA (trusting the right server): refused.
    let other = LeaseCredentials::issue("l-other", "127.0.0.1")
        .unwrap()
        .endpoint(&endpoint);
    let foreign = DirectTarget::from_endpoint(&Endpoint {
        client_certificate: other.client_certificate,
        client_private_key: other.client_private_key,
        ..ep1.clone()
    })
    .unwrap();
    assert!(get_report(&foreign).await.is_err());
    // ...and that lease's own advertisement does not even trust this server.
    let stranger = DirectTarget::from_endpoint(
        &LeaseCredentials::issue("x", "127.0.0.1")
            .unwrap()
            .endpoint(&endpoint),
    )
    .unwrap();
    assert!(get_report(&stranger).await.is_err());

    // A long-lived call on lease 1's connection...
    let channel = good.channel().await.unwrap();
    let mut logs = ExporterServiceClient::new(channel)
        .log_stream(())
        .await
        .unwrap()
        .into_inner();

    // ...is cut when lease 1 ends, and its certificate stops working at once.
    lease1.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(5), logs.message())
        .await
        .expect("the direct connection outlived its lease");
    assert!(!matches!(ended, Ok(Some(_))), "{ended:?}");
    tokio::time::timeout(Duration::from_secs(10), task1)
        .await
        .expect("the lease's direct server did not stop")
        .unwrap();
    assert!(get_report(&good).await.is_err());

    // The next lease gets new credentials; the old ones stay refused.
    let session2 = mock_session();
    let lease2 = CancellationToken::new();
    let _task2 = server.serve_lease("l2", &session2, lease2.clone()).unwrap();
    let ep2 = session2.report().alternative_endpoints[0].clone();
    assert_ne!(ep2.certificate, ep1.certificate);
    let next = DirectTarget::from_endpoint(&ep2).unwrap();
    assert_eq!(get_report(&next).await.unwrap(), session2.report().uuid);
    assert!(get_report(&good).await.is_err());
    lease2.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_direct_listener_counts_every_connection_and_the_ones_over_its_limit() {
    let mut spec = DirectListenerSpec::parse("127.0.0.1:0", None).unwrap();
    spec.limits.max_connections = 1;
    spec.limits.handshake_timeout = Duration::from_secs(120);
    let server = DirectServer::bind(&spec).await.unwrap();
    let addr = server.local_addr();
    let stats = server.stats();
    let mut buf = [0u8; 16];

    // No lease served: closed at once, but counted as accepted (never as refused).
    let mut early = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert_eq!(early.read(&mut buf).await.unwrap_or(0), 0);
    wait_for("the early connection to be counted", || {
        stats.accepted() == 1 && stats.open() == 0
    })
    .await;

    // A lease served: a connection kept in its TLS handshake holds the one slot...
    let session = mock_session();
    let lease = CancellationToken::new();
    let task = server.serve_lease("l1", &session, lease.clone()).unwrap();
    let _held = tokio::net::TcpStream::connect(addr).await.unwrap();
    wait_for("the slot to be taken", || stats.open() == 1).await;
    // ...so the next is closed at once and counted as refused.
    let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert_eq!(over.read(&mut buf).await.unwrap_or(0), 0);
    assert_eq!(stats.refused(), 1);
    assert_eq!(stats.accepted(), 2);
    assert!(
        stats
            .prometheus()
            .contains("jumpstarter_listener_refused_total{listener=\"direct\"} 1"),
        "{}",
        stats.prometheus()
    );
    // The lease's end cuts the held connection and gives its slot back.
    lease.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the lease's direct server did not stop")
        .unwrap();
    wait_for("the slot to come back", || stats.open() == 0).await;
}
