//! `cargo xtask kube-rollout [--reuse]`: `deploy/kubernetes/base` as a cluster runs it, with
//! the Deployment and ReplicaSet controllers of a real kube-controller-manager (the same
//! Kubernetes build as the API server) and a stand-in node ([`crate::kube_podlet`]: the
//! workspace's binaries as the pods, their readiness probes, the Services), then the
//! controller's leader killed under load.
//!
//! 1. The manifests are applied; `kubectl rollout status` of the controller and the router
//!    Deployments must complete (the routers wait for the Secrets the controller writes).
//! 2. The lab of docs/kubernetes.md, sections 4 and 5: an admin config from the key Secret,
//!    exporters and clients made with `jmp admin create`, `jmp run` and `jmp shell` against
//!    the Service's name (mapped to the stand-in Service in a private mount namespace's
//!    `/etc/hosts`). Load: one lease held by `jmp create lease`, one by a `jmp shell` whose
//!    command forwards a TCP port through the router Deployment to an echo server, with
//!    bytes flowing through it all along (each checked), and `jmp get exporters` every
//!    quarter second (its longest gap is the longest call stall).
//! 3. `kubectl rollout restart` of the controller while it all runs: the rollout completes.
//! 4. The leader's container killed with SIGKILL and started again by the kubelet (the
//!    standby sees its address refuse connections and takes over at once), then the leader
//!    frozen with SIGSTOP, as a node that stops answering (its address still takes
//!    connections and the Service still routes to it; the standby takes over once the Lease
//!    expires). After each: the time from the kill to the next lease granted and used (`jmp
//!    shell -l ... -- j power on` on a free exporter, started right after the kill), the
//!    longest call stall, and checks that both leases are still held, the stream never
//!    lost or reordered a byte, and no exporter is gone.
//!
//! `cargo xtask kube-e2e` runs it last; `cargo xtask bench` prints its figures.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{kube, kube_podlet::Podlet, procs::Background};

/// The namespace of `deploy/kubernetes/base`.
const NS: &str = "jumpstarter";
/// Where the stand-in Services listen: the controller's, the router's.
const CONTROLLER_SVC: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const ROUTER_SVC: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
/// How long a rollout may take.
const ROLLOUT_TIMEOUT: &str = "180s";

/// What one leader kill showed.
#[derive(Debug, Clone)]
pub struct Failover {
    /// What was done to the leader.
    pub what: &'static str,
    /// From the kill to another process leading (holding the Lease, its endpoints written).
    pub taken_over: Duration,
    /// From the kill to the next lease granted and used, with the longest time between two
    /// answered `jmp get exporters` around the kill (not measured for a frozen leader:
    /// exporters whose streams it holds come back when their keepalive gives up).
    pub next_lease: Option<(Duration, Duration)>,
}

/// The figures of one run.
#[derive(Debug, Clone)]
pub struct Report {
    /// `kubectl rollout status` of the controller, from the apply.
    pub controller_available: Duration,
    /// `kubectl rollout restart` to `rollout status` done.
    pub restart_rollout: Duration,
    /// The leader kills.
    pub failovers: Vec<Failover>,
    /// Bytes echoed through the router, all checked.
    pub stream_bytes: u64,
}

/// Runs the suite (`--reuse`: on the running `kube-up` cluster; `--no-build`: with the
/// binaries in target/debug as they are).
pub fn run(args: &[String]) -> Result<()> {
    let (cluster, bins) = kube::suite_setup("kube-rollout", args)?;
    let report = scenario(&bins)?;
    print_report(&report);
    drop(cluster);
    Ok(())
}

/// The failover part of `cargo xtask bench`: a fresh `kube-up` cluster (stopped again), the
/// scenario with the release binaries, its figures against the goal (under 5 s from the
/// leader's kill to the next lease served).
pub fn bench() -> Result<()> {
    let rel = crate::bench::build_release()?;
    println!("== controller failover on Kubernetes (deploy/kubernetes/base, 2 replicas)");
    let cluster = kube::up()?;
    let report = scenario(&rel)?;
    print_report(&report);
    for f in &report.failovers {
        if let Some((lease, _)) = f.next_lease {
            println!(
                "   {}: {:.1} s to the next lease served (goal: under 5 s){}",
                f.what,
                lease.as_secs_f64(),
                if lease < Duration::from_secs(5) {
                    ""
                } else {
                    "  MISSED"
                }
            );
        }
    }
    drop(cluster);
    Ok(())
}

/// Prints the figures as a table.
pub fn print_report(r: &Report) {
    println!("{:<64} {:>8}", "figure", "seconds");
    println!(
        "{:<64} {:>8.1}",
        "apply -> controller Deployment Available",
        r.controller_available.as_secs_f64()
    );
    println!(
        "{:<64} {:>8.1}",
        "rollout restart -> rollout status done",
        r.restart_rollout.as_secs_f64()
    );
    for f in &r.failovers {
        println!(
            "{:<64} {:>8.1}",
            format!("{}: kill -> another process leads", f.what),
            f.taken_over.as_secs_f64()
        );
        if let Some((lease, stall)) = f.next_lease {
            println!(
                "{:<64} {:>8.1}",
                format!("{}: kill -> next lease served", f.what),
                lease.as_secs_f64()
            );
            println!(
                "{:<64} {:>8.1}",
                format!("{}: longest call stall", f.what),
                stall.as_secs_f64()
            );
        }
    }
    println!(
        "{:<64} {:>8}",
        "bytes through the router during it all, none lost (KiB)",
        r.stream_bytes / 1024
    );
}

/// Everything of the module docs, on the running cluster; removes what it made.
pub fn scenario(bins: &Path) -> Result<Report> {
    let kcm = kube::ensure_binaries()?.controller_manager;
    let work = crate::target_dir().join("kube-rollout");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    println!(
        "== kube-rollout: deploy/kubernetes/base with kube-controller-manager {}",
        kube::K8S_VERSION
    );
    let result = scenario_in(bins, &kcm, &work);
    cleanup();
    if result.is_err() {
        // Where to look.
        println!("   logs under {}", work.display());
    }
    result
}

fn scenario_in(bins: &Path, kcm: &Path, work: &Path) -> Result<Report> {
    let manifests = work.join("base.yaml");
    let base = crate::workspace_root().join("deploy/kubernetes/base");
    std::fs::write(
        &manifests,
        kube::kubectl(&["kustomize", &base.display().to_string()])?,
    )?;
    // Leftovers of an earlier run on a reused cluster.
    cleanup();

    let mut podlet = Podlet::start(NS, bins, &work.join("pods"))?;
    podlet.service(
        CONTROLLER_SVC,
        &[("app.kubernetes.io/name", "jumpstarter-controller")],
        &[(8082, "controller-grpc"), (8083, "router")],
    )?;
    podlet.service(
        ROUTER_SVC,
        &[("app.kubernetes.io/name", "jumpstarter-router")],
        &[(8083, "router")],
    )?;
    let _kcm = start_controller_manager(kcm, work)?;

    let applied = Instant::now();
    kube::kubectl(&["apply", "-f", &manifests.display().to_string()])
        .context("kubectl apply of deploy/kubernetes/base")?;
    rollout_status("jumpstarter-controller", &podlet)?;
    let controller_available = applied.elapsed();
    println!(
        "   controller Deployment Available {:.1}s after the apply",
        controller_available.as_secs_f64()
    );
    rollout_status("jumpstarter-router", &podlet)?;
    println!(
        "   router Deployment Available {:.1}s after the apply",
        applied.elapsed().as_secs_f64()
    );

    let holder = leader(&podlet)?.pod;
    println!("   leader: {holder}");
    let lab = Lab::start(bins, work)?;
    println!("   lab: 3 exporters, 2 clients, a lease held, a byte stream through the router");

    let restarted = Instant::now();
    kube::kubectl(&[
        "rollout",
        "restart",
        "-n",
        NS,
        "deployment/jumpstarter-controller",
    ])?;
    // The Deployment controller sees the new template a moment later: wait for it to
    // observe it before asking for the status.
    thread::sleep(Duration::from_secs(1));
    rollout_status("jumpstarter-controller", &podlet)?;
    let restart_rollout = restarted.elapsed();
    println!(
        "   rollout restart done in {:.1}s",
        restart_rollout.as_secs_f64()
    );
    lab.check("after the rolling restart")?;
    let stall = lab.calls.take_longest_stall();
    println!(
        "   longest call stall during the rolling restart: {:.1}s",
        stall.as_secs_f64()
    );

    let mut failovers = Vec::new();
    for (what, frozen) in [
        ("leader's container killed (SIGKILL, restarted)", false),
        ("leader frozen (SIGSTOP: a node that stops answering)", true),
    ] {
        let Leader {
            pod: holder,
            identity,
        } = leader(&podlet)?;
        let _ = lab.calls.take_longest_stall();
        let killed = Instant::now();
        if frozen {
            podlet.freeze(&holder)?;
        } else {
            podlet.kill(&holder)?;
        }
        // Another process leads: the standby, or (after a kill) the container started
        // again in the same pod, whichever takes the Lease first.
        let taken_over = loop {
            let now = leader(&podlet)?;
            if now.identity != identity {
                break killed.elapsed();
            }
            ensure!(
                killed.elapsed() < Duration::from_secs(30),
                "{what}: no other process leads 30 s later"
            );
            thread::sleep(Duration::from_millis(50));
        };
        let next_lease = if frozen {
            None
        } else {
            lab.next_lease(&format!("after {what}"))?;
            let next_lease = killed.elapsed();
            // Calls answered again, for the stall to be measured up to now.
            lab.calls.wait_answered(Duration::from_secs(30))?;
            Some((next_lease, lab.calls.take_longest_stall()))
        };
        lab.check(&format!("after {what}"))?;
        match next_lease {
            Some((lease, stall)) => println!(
                "   {what}: another process leads {:.1}s after, the next lease served {:.1}s after, \
                 longest call stall {:.1}s",
                taken_over.as_secs_f64(),
                lease.as_secs_f64(),
                stall.as_secs_f64()
            ),
            None => println!(
                "   {what}: another process leads {:.1}s after",
                taken_over.as_secs_f64()
            ),
        }
        failovers.push(Failover {
            what,
            taken_over,
            next_lease,
        });
        if frozen {
            // The node is gone for good: as the node lifecycle controller would, remove the
            // pod (its container is killed), and the ReplicaSet makes another.
            kube::kubectl(&[
                "delete",
                "pod",
                &holder,
                "-n",
                NS,
                "--grace-period=0",
                "--force",
            ])?;
            rollout_status("jumpstarter-controller", &podlet)?;
        }
    }
    let stream_bytes = lab.finish()?;
    Ok(Report {
        controller_available,
        restart_rollout,
        failovers,
        stream_bytes,
    })
}

/// `kubectl rollout status` of Deployment `name`; on failure with what the node saw.
fn rollout_status(name: &str, podlet: &Podlet) -> Result<()> {
    kube::kubectl(&[
        "rollout",
        "status",
        "-n",
        NS,
        &format!("deployment/{name}"),
        &format!("--timeout={ROLLOUT_TIMEOUT}"),
    ])
    .map(|_| ())
    .with_context(|| {
        let pods = podlet.pods();
        let logs: Vec<String> = pods
            .iter()
            .map(|(p, _)| format!("--- {p}:\n{}", podlet.log_tail(p)))
            .collect();
        format!(
            "kubectl rollout status deployment/{name}; pods {pods:?}; events:\n{}\n{}",
            podlet.events().join("\n"),
            logs.join("\n")
        )
    })
}

/// The holder of the controller's leader election Lease.
struct Leader {
    /// Its pod.
    pod: String,
    /// The process (`POD_RANDOM`): a container started again in the same pod is another.
    identity: String,
}

/// The pod holding the controller's leader election Lease, once it has written where it
/// serves and is not on its way out (30 s at most).
fn leader(podlet: &Podlet) -> Result<Leader> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = kube::kubectl(&[
            "get",
            "lease",
            "jumpstarter-controller-leader",
            "-n",
            NS,
            "-o",
            "json",
        ])
        .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let holder = v["spec"]["holderIdentity"].as_str().unwrap_or_default();
        // The identity is POD_NAME_RANDOM.
        let pod = holder.rsplit_once('_').map_or(holder, |(p, _)| p);
        if !pod.is_empty()
            && podlet.pods().iter().any(|(p, _)| p == pod)
            && v["metadata"]["annotations"]["jumpstarter.dev/leader-endpoints"].is_string()
        {
            return Ok(Leader {
                pod: pod.to_owned(),
                identity: holder.to_owned(),
            });
        }
        ensure!(
            Instant::now() < deadline,
            "no controller leads with its endpoints written after 30 s: {text}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// kube-controller-manager with its Deployment and ReplicaSet controllers only.
fn start_controller_manager(kcm: &Path, work: &Path) -> Result<KillOnDrop> {
    let log = std::fs::File::create(work.join("kube-controller-manager.log"))?;
    let child = Command::new(kcm)
        .arg(format!(
            "--kubeconfig={}",
            kube::admin_kubeconfig().display()
        ))
        .args([
            "--controllers=deployment-controller,replicaset-controller",
            "--leader-elect=false",
            "--secure-port=0",
            "--use-service-account-credentials=false",
            "--v=1",
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting kube-controller-manager")?;
    Ok(KillOnDrop(child))
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes what the scenario makes: the Deployments with their pods (forced: no node may be
/// left to finish them), the Jumpstarter objects of namespace `default` it made, the Node.
fn cleanup() {
    let _ = kube::kubectl(&[
        "delete",
        "-n",
        NS,
        "--ignore-not-found",
        "--wait=false",
        "deployment/jumpstarter-controller",
        "deployment/jumpstarter-router",
    ]);
    let _ = kube::kubectl(&[
        "delete",
        "-n",
        NS,
        "replicasets,pods",
        "--all",
        "--ignore-not-found",
        "--grace-period=0",
        "--force",
    ]);
    let exporters: Vec<&str> = EXPORTERS.iter().map(|e| e.0).collect();
    let _ = kube::delete_objects(&exporters, &CLIENTS);
    let _ = kube::kubectl(&[
        "delete",
        "-n",
        "default",
        "leases.jumpstarter.dev",
        // Leases carry their selector's labels: every exporter here has `rollout=`.
        "-l",
        "rollout",
        "--ignore-not-found",
        "--wait=false",
    ]);
    // A Lease left by a controller that could not give it up would keep the first leader
    // of the next run waiting for its expiry.
    let _ = kube::kubectl(&[
        "delete",
        "lease",
        "jumpstarter-controller-leader",
        "-n",
        NS,
        "--ignore-not-found",
    ]);
    let _ = kube::kubectl(&[
        "delete",
        "node",
        crate::kube_podlet::NODE,
        "--ignore-not-found",
    ]);
}

/// The exporters: name, label value of `rollout=`, their `export:`.
const EXPORTERS: [(&str, &str); 3] = [
    ("rollout-net", "net"),
    ("rollout-held", "held"),
    ("rollout-free", "free"),
];
const CLIENTS: [&str; 2] = ["rollout-a", "rollout-b"];

/// The lab of the scenario, running.
struct Lab {
    bins: PathBuf,
    work: PathBuf,
    hosts: PathBuf,
    _exporters: Vec<Background>,
    _shell: Background,
    held_lease: String,
    stream: Stream,
    calls: Calls,
    stop: Arc<AtomicBool>,
    _echo: thread::JoinHandle<()>,
}

impl Lab {
    fn start(bins: &Path, work: &Path) -> Result<Self> {
        let hosts = work.join("hosts");
        std::fs::write(
            &hosts,
            format!(
                "127.0.0.1 localhost\n{CONTROLLER_SVC} jumpstarter-controller.jumpstarter.svc\n\
                 {ROUTER_SVC} jumpstarter-router.jumpstarter.svc\n"
            ),
        )?;
        let admin = work.join("admin.yaml");
        write_admin_config(&admin)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (echo_port, echo) = echo_server(stop.clone())?;
        let lab_cmd = LabCmd {
            bins: bins.to_owned(),
            hosts: hosts.clone(),
            work: work.to_owned(),
        };
        let mut exporters = Vec::new();
        for (name, label) in EXPORTERS {
            let out = work.join(format!("{name}.yaml"));
            lab_cmd.ok(
                lab_cmd
                    .jmp(&["admin", "create", "exporter", "-n", "default", name])
                    .args(["-l", &format!("rollout={label}"), "--out"])
                    .arg(&out)
                    .env("JMP_ADMIN_CONFIG", &admin),
                "jmp admin create exporter",
            )?;
            let export = if label == "net" {
                format!(
                    "export:\n  net:\n    type: jumpstarter_driver_network.driver.TcpNetwork\n    \
                     config: {{ host: 127.0.0.1, port: {echo_port} }}\n"
                )
            } else {
                "export:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n"
                    .to_owned()
            };
            crate::quickstart::fill_export(&out, &export)?;
            let mut cmd = lab_cmd.jmp(&["run", "--exporter-config"]);
            cmd.arg(&out);
            exporters.push(Background::start(name, cmd)?);
        }
        for c in CLIENTS {
            lab_cmd.ok(
                lab_cmd
                    .jmp(&["admin", "create", "client", "-n", "default", c, "--unsafe"])
                    .arg("--out")
                    .arg(work.join(format!("{c}.yaml")))
                    .env("JMP_ADMIN_CONFIG", &admin),
                "jmp admin create client",
            )?;
        }
        // A lease held by name, all along.
        let mut create =
            lab_cmd.jmp(&["create", "lease", "-l", "rollout=held", "--duration", "30m"]);
        create
            .arg("--client-config")
            .arg(work.join("rollout-b.yaml"))
            .args(["-o", "name"]);
        let held_lease = lab_cmd
            .ok(&mut create, "jmp create lease")?
            .trim()
            .to_owned();
        ensure!(!held_lease.is_empty(), "jmp create lease printed no name");
        // The byte stream: jmp shell forwarding a port through the router to the echo server.
        let fwd = crate::procs::free_port()?;
        let mut shell = lab_cmd.jmp(&[
            "shell",
            "-l",
            "rollout=net",
            "--no-direct",
            "--duration",
            "30m",
        ]);
        shell
            .arg("--client-config")
            .arg(work.join("rollout-a.yaml"))
            .args(["--", "j", "net", "forward-tcp", &format!("127.0.0.1:{fwd}")]);
        let shell = Background::start("jmp shell -- j net forward-tcp", shell)?;
        if let Err(e) = crate::procs::wait_port(fwd, Duration::from_secs(90)) {
            let said: Vec<String> = shell.lines.try_iter().collect();
            let exporter: Vec<String> = exporters[0].lines.try_iter().collect();
            bail!(
                "the forwarded port of jmp shell -- j net forward-tcp never opened ({e}); \
                 jmp shell said:\n{}\nthe exporter said:\n{}",
                said.join("\n"),
                exporter.join("\n")
            );
        }
        let stream = Stream::start(fwd, stop.clone())?;
        let calls = Calls::start(&lab_cmd, work.join("rollout-b.yaml"), stop.clone());
        let lab = Self {
            bins: bins.to_owned(),
            work: work.to_owned(),
            hosts,
            _exporters: exporters,
            _shell: shell,
            held_lease,
            stream,
            calls,
            stop,
            _echo: echo,
        };
        lab.calls.wait_answered(Duration::from_secs(30))?;
        lab.check("at the start")?;
        Ok(lab)
    }

    fn cmd(&self) -> LabCmd {
        LabCmd {
            bins: self.bins.clone(),
            hosts: self.hosts.clone(),
            work: self.work.clone(),
        }
    }

    /// A lease on the free exporter, granted and used (`j power on`).
    fn next_lease(&self, when: &str) -> Result<()> {
        let lab = self.cmd();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::new();
        while Instant::now() < deadline {
            let mut shell = lab.jmp(&["shell", "-l", "rollout=free", "--duration", "1m"]);
            shell
                .arg("--client-config")
                .arg(self.work.join("rollout-b.yaml"))
                .args(["--", "j", "power", "on"]);
            let started = Instant::now();
            let out = crate::procs::run(shell, Duration::from_secs(60))?;
            if out.code == 0 {
                return Ok(());
            }
            last = format!("exit {}: {}{}", out.code, out.stdout, out.stderr);
            println!(
                "   (a jmp shell of {:.1}s failed: {})",
                started.elapsed().as_secs_f64(),
                last.trim()
            );
            thread::sleep(Duration::from_millis(100));
        }
        bail!("{when}: no lease served within 60 s; the last jmp shell: {last}")
    }

    /// Leases still held, the stream still flowing and unbroken.
    fn check(&self, when: &str) -> Result<()> {
        let before = self.stream.received();
        self.stream
            .error()
            .map_or(Ok(()), |e| bail!("{when}: the byte stream: {e}"))?;
        let text = kube::kubectl(&[
            "get",
            "leases.jumpstarter.dev",
            &self.held_lease,
            "-n",
            "default",
            "-o",
            "json",
        ])
        .with_context(|| format!("{when}: lease {} is gone", self.held_lease))?;
        let v: serde_json::Value = serde_json::from_str(&text)?;
        ensure!(
            v["status"]["ended"].as_bool() != Some(true),
            "{when}: lease {} has ended: {}",
            self.held_lease,
            v["status"]
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.stream.received() == before {
            ensure!(
                Instant::now() < deadline,
                "{when}: no byte came back through the router for 10 s ({before} bytes so far)"
            );
            self.stream
                .error()
                .map_or(Ok(()), |e| bail!("{when}: the byte stream: {e}"))?;
            thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Stops the stream and checks that every byte sent came back.
    fn finish(self) -> Result<u64> {
        self.stop.store(true, Ordering::SeqCst);
        let bytes = self.stream.finish()?;
        Ok(bytes)
    }
}

/// Builds the lab's commands: `jmp` in a private mount namespace whose `/etc/hosts` maps the
/// Services' names to the stand-in Services.
struct LabCmd {
    bins: PathBuf,
    hosts: PathBuf,
    work: PathBuf,
}

impl LabCmd {
    fn jmp(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("unshare");
        cmd.args(["--user", "--map-root-user", "--mount", "--", "sh", "-c"])
            .arg(r#"mount --bind "$0" /etc/hosts && exec "$@""#)
            .arg(&self.hosts)
            .arg(self.bins.join("jmp"))
            .args(args)
            .env("PATH", path_with(&self.bins))
            .env("HOME", &self.work)
            .env("XDG_CONFIG_HOME", self.work.join("config"))
            .env_remove("JMP_CLIENT_CONFIG")
            .env_remove("JMP_ADMIN_CONFIG");
        cmd
    }

    /// Runs `cmd` to its end (60 s at most); its stdout, or an error with its output.
    fn ok(&self, cmd: &mut Command, what: &str) -> Result<String> {
        let cmd = std::mem::replace(cmd, Command::new("true"));
        let out = crate::procs::run(cmd, Duration::from_secs(60))?;
        ensure!(
            out.code == 0,
            "{what} failed (exit {}): {}{}",
            out.code,
            out.stdout,
            out.stderr
        );
        Ok(out.stdout)
    }
}

fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_owned()];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(paths).unwrap_or_default()
}

/// The admin config of docs/kubernetes.md section 4, from the key Secret.
fn write_admin_config(path: &Path) -> Result<()> {
    let field = |key: &str| {
        kube::kubectl(&[
            "get",
            "secret",
            "jumpstarter-controller-keys",
            "-n",
            NS,
            "-o",
            &format!("jsonpath={{.data.{}}}", key.replace('.', "\\.")),
        ])
    };
    let ca = field("ca.crt")?;
    let token = String::from_utf8(crate::kube_podlet::base64_decode(
        field("admin-token")?.trim(),
    )?)
    .context("the admin token is not UTF-8")?;
    std::fs::write(
        path,
        format!(
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: AdminConfig\n\
             endpoint: jumpstarter-controller.jumpstarter.svc:8082\n\
             tls:\n  ca: {}\n  insecure: false\ntoken: {}\n",
            ca.trim(),
            token.trim()
        ),
    )?;
    Ok(())
}

/// A TCP echo server on 127.0.0.1; its port.
fn echo_server(stop: Arc<AtomicBool>) -> Result<(u16, thread::JoinHandle<()>)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    l.set_nonblocking(true)?;
    let h = thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            match l.accept() {
                Ok((mut c, _)) => {
                    let _ = c.set_nonblocking(false);
                    thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n) = c.read(&mut buf) {
                            if n == 0 || c.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    });
                }
                Err(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    Ok((port, h))
}

/// The byte at stream offset `i` (no period that a lost or repeated chunk could hide in).
fn pattern(i: u64) -> u8 {
    (i ^ (i >> 8) ^ (i >> 16) ^ (i >> 24)) as u8
}

/// Bytes written at a steady rate to the forwarded port, each echoed byte checked.
struct Stream {
    received: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
    error: Arc<Mutex<Option<String>>>,
    writer: thread::JoinHandle<()>,
    reader: thread::JoinHandle<()>,
}

impl Stream {
    fn start(port: u16, stop: Arc<AtomicBool>) -> Result<Self> {
        let conn = TcpStream::connect(("127.0.0.1", port))?;
        conn.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut w = conn.try_clone()?;
        let mut r = conn;
        let (received, sent) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let error = Arc::new(Mutex::new(None));
        let writer = {
            let (sent, stop, error) = (sent.clone(), stop.clone(), error.clone());
            thread::spawn(move || {
                let mut at = 0u64;
                // 8 KiB every 20 ms: about 400 KiB/s.
                while !stop.load(Ordering::SeqCst) {
                    let chunk: Vec<u8> = (at..at + 8192).map(pattern).collect();
                    if let Err(e) = w.write_all(&chunk) {
                        *error.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(format!("writing at byte {at}: {e}"));
                        return;
                    }
                    at += 8192;
                    sent.store(at, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(20));
                }
                let _ = w.shutdown(std::net::Shutdown::Write);
            })
        };
        let reader = {
            let (received, error, sent, stop) =
                (received.clone(), error.clone(), sent.clone(), stop);
            thread::spawn(move || {
                let mut at = 0u64;
                let mut buf = [0u8; 16 * 1024];
                let mut idle_since: Option<Instant> = None;
                loop {
                    match r.read(&mut buf) {
                        Ok(0) => {
                            if !stop.load(Ordering::SeqCst) {
                                *error.lock().unwrap_or_else(|p| p.into_inner()) =
                                    Some(format!("the stream closed at byte {at}"));
                            }
                            return;
                        }
                        Ok(n) => {
                            idle_since = None;
                            for (k, b) in buf[..n].iter().enumerate() {
                                let i = at + k as u64;
                                if *b != pattern(i) {
                                    *error.lock().unwrap_or_else(|p| p.into_inner()) = Some(
                                        format!("byte {i} came back as {b}, not {}", pattern(i)),
                                    );
                                    return;
                                }
                            }
                            at += n as u64;
                            received.store(at, Ordering::SeqCst);
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) =>
                        {
                            // After the writer stopped: everything back, or 10 s.
                            if stop.load(Ordering::SeqCst) {
                                let since = *idle_since.get_or_insert_with(Instant::now);
                                if at >= sent.load(Ordering::SeqCst)
                                    || since.elapsed() > Duration::from_secs(10)
                                {
                                    return;
                                }
                            }
                        }
                        Err(e) => {
                            *error.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(format!("reading at byte {at}: {e}"));
                            return;
                        }
                    }
                }
            })
        };
        Ok(Self {
            received,
            sent,
            error,
            writer,
            reader,
        })
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }

    fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits for the echo of everything sent (the stop flag is set); the byte count.
    fn finish(self) -> Result<u64> {
        let _ = self.writer.join();
        let _ = self.reader.join();
        if let Some(e) = self.error.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            bail!("the byte stream: {e}");
        }
        let (sent, got) = (
            self.sent.load(Ordering::SeqCst),
            self.received.load(Ordering::SeqCst),
        );
        ensure!(
            got == sent,
            "the byte stream: {sent} bytes sent, {got} came back"
        );
        Ok(got)
    }
}

/// `jmp get exporters` in a loop, with the longest time between two answers.
struct Calls {
    state: Arc<Mutex<CallState>>,
    _thread: thread::JoinHandle<()>,
}

struct CallState {
    last_ok: Instant,
    longest: Duration,
    answered: u64,
}

impl Calls {
    fn start(lab: &LabCmd, client: PathBuf, stop: Arc<AtomicBool>) -> Self {
        let state = Arc::new(Mutex::new(CallState {
            last_ok: Instant::now(),
            longest: Duration::ZERO,
            answered: 0,
        }));
        let lab = LabCmd {
            bins: lab.bins.clone(),
            hosts: lab.hosts.clone(),
            work: lab.work.clone(),
        };
        let thread = {
            let state = state.clone();
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let mut cmd = lab.jmp(&["get", "exporters", "-o", "name", "--client-config"]);
                    cmd.arg(&client);
                    let ok =
                        crate::procs::run(cmd, Duration::from_secs(20)).is_ok_and(|o| o.code == 0);
                    if ok {
                        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                        let gap = s.last_ok.elapsed();
                        s.longest = s.longest.max(gap);
                        s.last_ok = Instant::now();
                        s.answered += 1;
                    }
                    thread::sleep(Duration::from_millis(250));
                }
            })
        };
        Self {
            state,
            _thread: thread,
        }
    }

    /// The longest gap since the last call of this, and starts a new measure.
    fn take_longest_stall(&self) -> Duration {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let longest = s.longest.max(s.last_ok.elapsed());
        s.longest = Duration::ZERO;
        s.last_ok = Instant::now();
        longest
    }

    /// Waits for the next answered call.
    fn wait_answered(&self, timeout: Duration) -> Result<()> {
        let start = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .answered;
        let deadline = Instant::now() + timeout;
        while self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .answered
            == start
        {
            ensure!(
                Instant::now() < deadline,
                "jmp get exporters got no answer for {timeout:?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_has_no_short_period() {
        // A chunk of 8 KiB lost or repeated would shift the stream by 8 KiB: the pattern
        // must differ there.
        assert!((0..65_536u64).any(|i| pattern(i) != pattern(i + 8192)));
        assert!((0..65_536u64).any(|i| pattern(i) != pattern(i + 16 * 1024)));
    }
}
