//! Distributed mode end to end: an in-process controller (with its router), the real
//! `jmp run` exporter registering with it, and `jmp shell` clients leasing by selector and
//! driving the exporter with `j` through the router.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use jumpstarter_controller::{
    ControllerConfig, RunningController,
    objects::{Client, ClientSpec, Exporter, ExporterSpec, ExporterStatusValue, Lease},
    start,
    store::Store,
};
use jumpstarter_core::{
    auth::{ObjectKind, Subject},
    config::encode_ca,
};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

use crate::{J, JMP};

/// A controller on loopback and a scratch directory for configs, sockets and logs.
pub(crate) struct Lab {
    ctl: Option<RunningController>,
    dir: tempfile::TempDir,
}

async fn start_controller(dir: &Path, listen: String, router_listen: String) -> RunningController {
    start(ControllerConfig {
        listen,
        router_listen,
        advertise_host: "localhost".into(),
        ..ControllerConfig::new(dir.join("data"))
    })
    .await
    .unwrap()
}

pub(crate) async fn lab() -> Lab {
    let dir = tempfile::tempdir().unwrap();
    let ctl = start_controller(dir.path(), "127.0.0.1:0".into(), "127.0.0.1:0".into()).await;
    Lab {
        ctl: Some(ctl),
        dir,
    }
}

/// A lab whose controller has `settings` applied to its config (a label policy, say).
pub(crate) async fn lab_with(settings: impl FnOnce(&mut ControllerConfig)) -> Lab {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ControllerConfig {
        listen: "127.0.0.1:0".into(),
        router_listen: "127.0.0.1:0".into(),
        advertise_host: "localhost".into(),
        ..ControllerConfig::new(dir.path().join("data"))
    };
    settings(&mut config);
    Lab {
        ctl: Some(start(config).await.unwrap()),
        dir,
    }
}

impl Lab {
    pub(crate) fn ctl(&self) -> &RunningController {
        self.ctl.as_ref().unwrap()
    }

    /// Stops the controller gracefully and starts it again over the same data directory and
    /// addresses, with `settings` applied to its config.
    pub(crate) async fn restart_with(&mut self, settings: impl FnOnce(&mut ControllerConfig)) {
        let addresses = self.stop().await;
        self.start_again(addresses, settings).await;
    }

    /// Stops the controller gracefully; returns its gRPC and router addresses, for
    /// [`Lab::start_again`].
    pub(crate) async fn stop(&mut self) -> (String, String) {
        let old = self.ctl.take().unwrap();
        let addresses = (old.addr.to_string(), old.router_addr.to_string());
        old.shutdown().await;
        addresses
    }

    /// Starts a controller over the data directory of the stopped one, on its `addresses`.
    pub(crate) async fn start_again(
        &mut self,
        (listen, router_listen): (String, String),
        settings: impl FnOnce(&mut ControllerConfig),
    ) {
        let mut config = ControllerConfig {
            listen,
            router_listen,
            advertise_host: "localhost".into(),
            ..ControllerConfig::new(self.dir.path().join("data"))
        };
        settings(&mut config);
        self.ctl = Some(start(config).await.unwrap());
    }

    /// Stops the controller gracefully.
    pub(crate) async fn shutdown(&mut self) {
        if let Some(ctl) = self.ctl.take() {
            ctl.shutdown().await;
        }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn token(&self, kind: ObjectKind, name: &str, uid: String) -> String {
        self.ctl()
            .state
            .auth
            .issuer
            .issue(&Subject::new(kind, "default", name, uid))
            .unwrap()
            .token
    }

    fn common_yaml(&self, kind: &str, name: &str, token: &str) -> String {
        format!(
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: {kind}\nmetadata:\n  namespace: default\n  \
             name: {name}\nendpoint: \"localhost:{port}\"\ntoken: \"{token}\"\ntls:\n  ca: \"{ca}\"\n  \
             insecure: false\n",
            port = self.ctl().addr.port(),
            ca = encode_ca(&self.ctl().ca_pem),
        )
    }

    /// Creates the Exporter object and writes its config (MockPower + MockStorageMux).
    pub(crate) async fn exporter(&self, name: &str, labels: &[(&str, &str)]) -> PathBuf {
        self.exporter_via(name, labels, self.ctl().addr.port())
            .await
    }

    /// As [`Lab::exporter`], reaching the controller at `localhost:port` (a proxy).
    async fn exporter_via(&self, name: &str, labels: &[(&str, &str)], port: u16) -> PathBuf {
        let mut e = Exporter::new(name, ExporterSpec::default());
        e.metadata.namespace = Some("default".into());
        e.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        let e = self.ctl().state.store.create(&e).await.unwrap();
        let token = self.token(ObjectKind::Exporter, name, e.metadata.uid.unwrap());
        let yaml = self.common_yaml("ExporterConfig", name, &token).replace(
            &format!("localhost:{}", self.ctl().addr.port()),
            &format!("localhost:{port}"),
        ) + "export:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n  \
               storage:\n    type: jumpstarter_driver_opendal.driver.MockStorageMux\n";
        let path = self.path(&format!("{name}.exporter.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path
    }

    /// Creates the Client object and writes its config.
    pub(crate) async fn client(&self, name: &str) -> PathBuf {
        let mut c = Client::new(name, ClientSpec::default());
        c.metadata.namespace = Some("default".into());
        let c = self.ctl().state.store.create(&c).await.unwrap();
        let token = self.token(ObjectKind::Client, name, c.metadata.uid.unwrap());
        let yaml = self.common_yaml("ClientConfig", name, &token)
            + "drivers:\n  allow: []\n  unsafe: true\n";
        let path = self.path(&format!("{name}.client.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path
    }

    /// A command with a clean environment; killed when its `Child` is dropped.
    pub(crate) fn cmd(&self, bin: &str) -> Command {
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

    /// Starts `jmp run --exporter-config` (controller mode), logging to `<log>`.
    pub(crate) fn run_exporter(&self, config: &Path, log: &str) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(log))
            .unwrap();
        self.cmd(JMP)
            .args(["run", "--exporter-config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    async fn exporter_status(&self, name: &str) -> Option<ExporterStatusValue> {
        let e: Option<Exporter> = self.ctl().state.store.get("default", name).await.unwrap();
        e.and_then(|e| e.status).and_then(|s| s.exporter_status)
    }

    pub(crate) async fn wait_status(&self, name: &str, want: ExporterStatusValue) {
        for _ in 0..300 {
            if self.exporter_status(name).await == Some(want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "exporter {name} never reached {want:?}; log:\n{}",
            self.log(&format!("{name}.log"))
        );
    }

    pub(crate) async fn lease(&self, name: &str) -> Lease {
        self.ctl()
            .state
            .store
            .get("default", name)
            .await
            .unwrap()
            .unwrap()
    }

    pub(crate) fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
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

pub(crate) async fn finish(child: Child) -> (i32, String, String) {
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .expect("the process did not finish in time")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub(crate) fn shell(lab: &Lab, client: &Path, args: &[&str], script: &str) -> Child {
    lab.cmd(JMP)
        .arg("shell")
        .arg("--client-config")
        .arg(client)
        .args(args)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_leases_by_selector_and_drives_the_exporter_through_the_router() {
    let lab = lab().await;
    let exporter_cfg = lab.exporter("ex1", &[("board", "rpi4")]).await;
    // Also files whose lease-created copies go when the lease ends.
    let files = lab.path("files");
    std::fs::create_dir(&files).unwrap();
    let mut yaml = std::fs::read_to_string(&exporter_cfg).unwrap();
    yaml += &format!(
        "  files:\n    type: jumpstarter_driver_opendal.driver.Opendal\n    config:\n      \
         scheme: fs\n      kwargs:\n        root: {}\n      remove_created_on_close: true\n",
        files.display()
    );
    std::fs::write(&exporter_cfg, yaml).unwrap();
    std::fs::write(lab.path("note.txt"), "a note").unwrap();
    let client = lab.client("hello").await;
    let mut exporter = lab.run_exporter(&exporter_cfg, "ex1.log");
    lab.wait_status("ex1", ExporterStatusValue::Available).await;

    let child = shell(
        &lab,
        &client,
        &["-l", "board=rpi4", "--duration", "10m"],
        "j power on && j power read && \
         j files write-from-path note.txt note.txt && test -f files/note.txt && \
         echo \"lease=$JMP_LEASE exporter=$JMP_EXPORTER labels=$JMP_EXPORTER_LABELS host=$JUMPSTARTER_HOST\" && \
         exit 7",
    );
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 7, "{stdout}{stderr}\n{}", lab.log("ex1.log"));
    assert!(stdout.contains("voltage=5.0 V"), "{stdout}");
    assert!(stdout.contains("exporter=ex1 "), "{stdout}");
    assert!(stdout.contains("labels=board=rpi4 "), "{stdout}");
    // Each `j` ends its connection through the router cleanly: no tunnel is reported lost.
    assert!(!stderr.contains("Lost the connection"), "{stderr}");
    let lease_name = stdout
        .split("lease=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .to_string();
    assert!(!lease_name.is_empty(), "{stdout}");

    // The lease was released on exit and the exporter is free again.
    assert!(lab.lease(&lease_name).await.spec.release);
    lab.wait_status("ex1", ExporterStatusValue::Available).await;
    // AVAILABLE comes with `EndSession` already (as upstream); the lease's end follows.
    for _ in 0..100 {
        if lab
            .log("ex1.log")
            .contains(&format!("lease {lease_name} ended"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = lab.log("ex1.log");
    assert!(
        log.contains(&format!("lease {lease_name} started")),
        "{log}"
    );
    assert!(log.contains(&format!("lease {lease_name} ended")), "{log}");
    // The lease's session ended for the drivers too (upstream closes them).
    assert!(!files.join("note.txt").exists());

    // By exporter name: a new lease.
    let child = shell(
        &lab,
        &client,
        &["-n", "ex1"],
        "j power off && echo \"lease=$JMP_LEASE\"",
    );
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(!stdout.contains(&format!("lease={lease_name}")), "{stdout}");

    // SIGTERM: the exporter unregisters, reports offline and exits 0.
    let pid = exporter.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(20), exporter.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0), "{}", lab.log("ex1.log"));
    assert_eq!(
        lab.exporter_status("ex1").await,
        Some(ExporterStatusValue::Offline)
    );
    // `jmp describe` says why it cannot list the drivers now (not "not registered yet").
    let out = lab
        .cmd(JMP)
        .args(["describe", "exporter", "ex1", "--client-config"])
        .arg(&client)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("the exporter is offline"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_client_waits_for_the_first_then_gets_the_exporter() {
    let lab = lab().await;
    let exporter_cfg = lab.exporter("ex2", &[("board", "x")]).await;
    let first_cfg = lab.client("first").await;
    let second_cfg = lab.client("second").await;
    let _exporter = lab.run_exporter(&exporter_cfg, "ex2.log");
    lab.wait_status("ex2", ExporterStatusValue::Available).await;

    let mut first = shell(
        &lab,
        &first_cfg,
        &["-l", "board=x"],
        "j power on && touch holding && while [ ! -f done ]; do sleep 0.1; done",
    );
    lab.wait_file("holding", &mut first).await;

    let mut second = shell(&lab, &second_cfg, &["-l", "board=x"], "j power off");
    let stderr = second.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let waiting = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            // The first may come before the scheduler has looked at the lease.
            if line.starts_with("Waiting for lease") && line.contains("queue") {
                return line;
            }
        }
        panic!("the second shell ended without waiting");
    })
    .await
    .expect("the second shell never said it was waiting");
    eprintln!("{waiting}");
    assert!(waiting.contains("position 1"), "{waiting}");
    assert!(second.try_wait().unwrap().is_none());

    std::fs::write(lab.path("done"), "").unwrap();
    let (code, out, err) = finish(first).await;
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = finish(second).await;
    assert_eq!(code, 0, "{out}{err}\n{}", lab.log("ex2.log"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_exporter_restarts_and_serves_the_same_lease() {
    let lab = lab().await;
    let exporter_cfg = lab.exporter("ex3", &[("board", "y")]).await;
    let client = lab.client("hello").await;
    let mut exporter = lab.run_exporter(&exporter_cfg, "ex3.log");
    lab.wait_status("ex3", ExporterStatusValue::Available).await;

    let mut sh = shell(
        &lab,
        &client,
        &["-l", "board=y"],
        "j power on && echo \"$JMP_LEASE\" > lease && touch step1 && \
         while [ ! -f step2 ]; do sleep 0.1; done && j power read",
    );
    lab.wait_file("step1", &mut sh).await;
    let lease_name = std::fs::read_to_string(lab.path("lease"))
        .unwrap()
        .trim()
        .to_string();

    exporter.start_kill().unwrap();
    exporter.wait().await.unwrap();
    // The lease survives the exporter's death.
    let lease = lab.lease(&lease_name).await;
    assert!(!lease.is_ended() && !lease.spec.release);
    assert_eq!(lease.assigned_exporter(), Some("ex3"));

    let _exporter = lab.run_exporter(&exporter_cfg, "ex3.log");
    lab.wait_status("ex3", ExporterStatusValue::LeaseReady)
        .await;
    std::fs::write(lab.path("step2"), "").unwrap();
    let (code, out, err) = finish(sh).await;
    assert_eq!(code, 0, "{out}{err}\n{}", lab.log("ex3.log"));
    assert!(out.contains("voltage=5.0 V"), "{out}");
    let log = lab.log("ex3.log");
    assert_eq!(
        log.matches(&format!("lease {lease_name} started")).count(),
        2,
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_error() {
    let lab = lab().await;
    let client = lab.client("hello").await;
    let run = |args: &[&str]| {
        lab.cmd(JMP)
            .arg("shell")
            .args(args)
            .args(["--", "true"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // The same client with a grpcOptions entry nothing applies: refused, naming it.
    let odd = lab.path("odd-options.yaml");
    std::fs::write(
        &odd,
        std::fs::read_to_string(&client).unwrap()
            + "grpcOptions:\n  grpc.max_receive_message_length: 10\n",
    )
    .unwrap();
    let odd = odd.to_str().unwrap();
    let client = client.to_str().unwrap();
    let cases: [(&[&str], &str); 8] = [
        (
            &["--client-config", odd, "-l", "a=b"],
            "grpc.max_receive_message_length",
        ),
        (
            &[
                "--client-config",
                client,
                "-l",
                "a=b",
                "--acquisition-timeout",
                "2",
            ],
            "at least 5 seconds",
        ),
        (&["--client-config", client, "-l", "a b=c"], "selector"),
        (
            &["--client-config", client, "-l", "a=b", "--duration", "0"],
            "duration must be positive",
        ),
        (
            &["--client-config", client, "-l", "a=b", "--duration", "soon"],
            "invalid duration \"soon\"",
        ),
        (&["--client-config", client], "--selector"),
        (&["--client", "nosuch", "-l", "a=b"], "nosuch"),
        (
            &["--client-config", client, "--lease", "no-such-lease"],
            "no-such-lease",
        ),
    ];
    for (args, want) in cases {
        let (code, out, err) = finish(run(args)).await;
        eprintln!("{args:?} -> {err}");
        assert_eq!(code, 1, "{args:?}: {out}{err}");
        assert!(err.starts_with("Error: "), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want {want:?} in {err}");
    }

    // An exporter config without an endpoint cannot run in controller mode.
    let cfg = lab.path("noendpoint.yaml");
    std::fs::write(
        &cfg,
        "apiVersion: jumpstarter.dev/v1alpha1\nkind: ExporterConfig\nmetadata:\n  namespace: default\n  name: x\n",
    )
    .unwrap();
    let child = lab
        .cmd(JMP)
        .args(["run", "--exporter-config"])
        .arg(&cfg)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out, err) = finish(child).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("noendpoint.yaml") && err.contains("endpoint"),
        "{err}"
    );
}

/// A TCP proxy whose connections can all be cut at once (a controller connection drop).
struct Proxy {
    port: u16,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
    /// While set, new connections are closed at once (the controller is away).
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    async fn start(target: std::net::SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let list = conns.clone();
        let down = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let is_down = down.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if is_down.load(std::sync::atomic::Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                list.lock().unwrap().push(task);
            }
        });
        Self {
            port,
            conns,
            accept,
            down,
        }
    }

    /// Cuts every connection and refuses new ones until [`Proxy::up`].
    fn down(&self) {
        self.down.store(true, std::sync::atomic::Ordering::SeqCst);
        self.cut();
    }

    fn up(&self) {
        self.down.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    fn cut(&self) {
        for t in self.conns.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporter_reconnects_after_the_controller_connection_drops() {
    let lab = lab().await;
    let proxy = Proxy::start(lab.ctl().addr).await;
    let exporter_cfg = lab.exporter_via("ex4", &[("board", "z")], proxy.port).await;
    let client = lab.client("hello").await;
    let _exporter = lab.run_exporter(&exporter_cfg, "ex4.log");
    lab.wait_status("ex4", ExporterStatusValue::Available).await;

    proxy.cut();
    let mut registered = 0;
    for _ in 0..300 {
        registered = lab
            .log("ex4.log")
            .matches("registered with controller")
            .count();
        if registered >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = lab.log("ex4.log");
    assert!(registered >= 2, "{log}");
    assert!(log.contains("reconnecting in"), "{log}");

    let child = shell(&lab, &client, &["-l", "board=z"], "j power on");
    let (code, out, err) = finish(child).await;
    assert_eq!(code, 0, "{out}{err}\n{}", lab.log("ex4.log"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_shell_still_releases_its_lease() {
    let lab = lab().await;
    let exporter_cfg = lab.exporter("ex5", &[("board", "t")]).await;
    let client = lab.client("hello").await;
    let _exporter = lab.run_exporter(&exporter_cfg, "ex5.log");
    lab.wait_status("ex5", ExporterStatusValue::Available).await;
    let mut sh = shell(
        &lab,
        &client,
        &["-l", "board=t"],
        "echo \"$JMP_LEASE\" > lease && exec sleep 30",
    );
    lab.wait_file("lease", &mut sh).await;
    let lease_name = std::fs::read_to_string(lab.path("lease"))
        .unwrap()
        .trim()
        .to_string();
    let pid = sh.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let (code, out, err) = finish(sh).await;
    assert_eq!(code, 143, "{out}{err}");
    assert!(lab.lease(&lease_name).await.spec.release);
}

/// A `jmp shell` waiting in the queue keeps waiting while the controller is away for a
/// moment (its lease is still queued there) and runs its command once it gets the exporter;
/// it does not give up at the first failed poll, leaving its lease queued for nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_shell_keeps_waiting_while_the_controller_is_away() {
    let lab = lab().await;
    let exporter_cfg = lab.exporter("q1", &[("queue", "q1")]).await;
    let holder = lab.client("holder").await;
    let waiter = lab.client("waiter").await;
    let proxy = Proxy::start(lab.ctl().addr).await;
    let yaml = std::fs::read_to_string(&waiter).unwrap().replace(
        &format!("localhost:{}", lab.ctl().addr.port()),
        &format!("localhost:{}", proxy.port),
    );
    std::fs::write(&waiter, yaml).unwrap();
    let _exporter = lab.run_exporter(&exporter_cfg, "q1.log");
    lab.wait_status("q1", ExporterStatusValue::Available).await;

    let held = shell(&lab, &holder, &["-l", "queue=q1"], "sleep 8");
    lab.wait_status("q1", ExporterStatusValue::LeaseReady).await;
    let mut queued = shell(&lab, &waiter, &["-l", "queue=q1"], "echo ran");
    // Queued: it says why it waits.
    let stderr = queued.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the queued shell said nothing")
            .unwrap()
            .expect("the queued shell ended");
        seen.push(line.clone());
        if line.contains("Waiting for lease") {
            break;
        }
    }
    proxy.down();
    tokio::time::sleep(Duration::from_secs(4)).await;
    proxy.up();
    let rest = tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push(line);
        }
        seen.join("\n")
    });
    let out = tokio::time::timeout(Duration::from_secs(90), queued.wait_with_output())
        .await
        .expect("the queued shell did not finish")
        .unwrap();
    let stderr = rest.await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("ran"), "{stdout}{stderr}");
    assert!(
        stderr.contains("the controller cannot be reached"),
        "{stderr}"
    );
    let (code, stdout, stderr) = finish(held).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
}

/// A config's CA is all `jmp` needs on a machine without system certificates (a minimal
/// container): the system's store is not required beside it. Without a CA, the empty
/// store is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configs_ca_is_enough_without_system_certificates() {
    let lab = lab().await;
    let client = lab.client("hello").await;
    let no_certs = lab.path("no-certs.pem");
    std::fs::write(&no_certs, "").unwrap();
    let no_cert_dir = lab.path("no-certs");
    std::fs::create_dir(&no_cert_dir).unwrap();
    let get = |config: &Path| {
        lab.cmd(JMP)
            .args(["get", "exporters", "--client-config"])
            .arg(config)
            .env("SSL_CERT_FILE", &no_certs)
            .env("SSL_CERT_DIR", &no_cert_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (code, out, err) = finish(get(&client)).await;
    assert_eq!(code, 0, "{out}{err}");

    let without_ca = lab.path("without-ca.yaml");
    let yaml = std::fs::read_to_string(&client).unwrap();
    let yaml: String = yaml
        .lines()
        .filter(|l| !l.trim_start().starts_with("ca:"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&without_ca, yaml).unwrap();
    let (code, out, err) = finish(get(&without_ca)).await;
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        err.contains("no system CA certificates found") && err.contains("tls.ca"),
        "{err}"
    );
}
