//! A stand-in node for `cargo xtask kube-rollout` and `kube-pools`: it does for the pods of
//! one namespace what the scheduler, a kubelet and kube-proxy would, with the workspace's
//! binaries as processes on loopback, so that the Deployment and ReplicaSet controllers of a
//! real kube-controller-manager (and the pool engine) see pods start, pass or fail their
//! readiness probes, exit, and stop.
//!
//! - **Scheduling:** each new pod is bound to the Node [`NODE`] (the `pods/binding`
//!   subresource, as the scheduler does), so that deleting it is graceful as on a cluster.
//! - **Containers:** a pod's container runs the binary its `command` or image names
//!   (`jumpstarter-controller`, `jumpstarter-router`, `jmp`, from the debug build), with the
//!   pod's args and env (`value`, the downward API's `metadata.name`, `metadata.namespace` and
//!   `status.podIP`, `secretKeyRef`). Each pod has an address of its own, `127.0.1.N`. What a
//!   process of this machine cannot have as a pod has is mapped, and only this: an unspecified
//!   listen address (`0.0.0.0`) in args and env is the pod's address (a pod listens on its own
//!   network namespace), and each volume's `mountPath` in args and env is a directory of the
//!   pod's own (an `emptyDir`, or a `secret` volume's files written from the Secret); the
//!   ServiceAccount's token reaches the process as `KUBECONFIG` (the controller's
//!   ServiceAccount kubeconfig of `kube-up`), not as a projected volume. A pod whose Secret is
//!   missing waits, as a kubelet retries a failed mount; a container that exits is started
//!   again (`restartPolicy: Always`, with a one-second back-off). With `restartPolicy: Never`
//!   (a pool replica's Pod) the pod's exit ends it: `Succeeded` or `Failed` with the exit
//!   code, its sidecars stopped.
//! - **Native sidecars:** init containers with `restartPolicy: Always` start before the main
//!   container and stop after it; one whose image is not ours (a pool's target runtime, e.g.
//!   QEMU) is stood in for by a process that does nothing (`sleep infinity`).
//! - **Probes and status:** the readiness probe (`tcpSocket`, by port name or number, at its
//!   `periodSeconds`) decides the pod's `Ready` condition, written to its status subresource
//!   as a kubelet writes it.
//! - **Termination:** a pod marked for deletion gets SIGTERM, SIGKILL after its grace period,
//!   and is then removed (grace period 0, as a kubelet finishes a deletion).
//! - **Services:** a Service's ports are served at an address of its own ([`Podlet::service`])
//!   and each connection is forwarded to a Ready pod that the Service selects (round robin),
//!   as kube-proxy does; the caller maps the Service's DNS name to that address.

use std::{
    collections::BTreeMap,
    io::{BufReader, Read, Write},
    net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::kube;

/// The Node every pod is bound to.
pub const NODE: &str = "podlet";

/// One pod as the stand-in node knows it.
struct Pod {
    uid: String,
    ip: Ipv4Addr,
    labels: BTreeMap<String, String>,
    spec: Value,
    dir: PathBuf,
    child: Option<Child>,
    /// The native sidecars' processes, started before `child`.
    sidecars: Vec<Child>,
    /// The main container's exit code, once it has exited in a `restartPolicy: Never` pod.
    terminated: Option<i32>,
    /// When the container may be (re)started.
    start_after: Instant,
    started_at: String,
    restarts: u32,
    ready: bool,
    /// The readiness and exit written to the API server last.
    reported: Option<(bool, Option<i32>)>,
    next_probe: Instant,
    /// The deletion's grace period, once the pod is marked for deletion.
    deleting: Option<u64>,
    /// Gone from the API server.
    gone: bool,
    /// What the pod waits for, said once.
    waiting: Option<String>,
}

/// The stand-in node (see the module docs). Dropping it stops every process it started.
pub struct Podlet {
    inner: Arc<Inner>,
    threads: Vec<thread::JoinHandle<()>>,
}

struct Inner {
    namespace: String,
    bins: PathBuf,
    root: PathBuf,
    pods: Mutex<BTreeMap<String, Pod>>,
    next_ip: AtomicUsize,
    stop: AtomicBool,
    events: Mutex<Vec<String>>,
    started: Instant,
}

impl Podlet {
    /// Starts serving the pods of `namespace` (binaries from `bins`, pod directories under
    /// `root`), after creating the Node object.
    pub fn start(namespace: &str, bins: &Path, root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root)?;
        kube::kubectl_input(
            &["apply", "-f", "-"],
            Some(
                &json!({
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
                })
                .to_string(),
            ),
        )
        .context("creating the Node object")?;
        let inner = Arc::new(Inner {
            namespace: namespace.to_owned(),
            bins: bins.to_owned(),
            root: root.to_owned(),
            pods: Mutex::new(BTreeMap::new()),
            next_ip: AtomicUsize::new(2),
            stop: AtomicBool::new(false),
            events: Mutex::new(Vec::new()),
            started: Instant::now(),
        });
        let watch = {
            let inner = inner.clone();
            thread::spawn(move || inner.watch_loop())
        };
        let sync = {
            let inner = inner.clone();
            thread::spawn(move || inner.sync_loop())
        };
        Ok(Self {
            inner,
            threads: vec![watch, sync],
        })
    }

    /// Serves Service `name`'s `ports` (port, target port name or number) at `ip`, forwarding
    /// each connection to a Ready pod whose labels include `selector`.
    pub fn service(
        &mut self,
        ip: Ipv4Addr,
        selector: &[(&str, &str)],
        ports: &[(u16, &str)],
    ) -> Result<()> {
        for &(port, target) in ports {
            let listener = TcpListener::bind((ip, port))
                .with_context(|| format!("cannot listen on {ip}:{port} for a Service"))?;
            listener.set_nonblocking(true)?;
            let inner = self.inner.clone();
            let selector: Vec<(String, String)> = selector
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let target = target.to_owned();
            self.threads.push(thread::spawn(move || {
                inner.proxy_loop(listener, &selector, &target)
            }));
        }
        Ok(())
    }

    /// The pods' names with their Ready state.
    pub fn pods(&self) -> Vec<(String, bool)> {
        let pods = self.inner.lock();
        pods.iter()
            .filter(|(_, p)| !p.gone)
            .map(|(n, p)| (n.clone(), p.ready))
            .collect()
    }

    /// Kills pod `name`'s container with SIGKILL; it is started again at once, as a kubelet
    /// restarts a container that exited for the first time.
    pub fn kill(&self, name: &str) -> Result<()> {
        let mut pods = self.inner.lock();
        let pod = pods
            .get_mut(name)
            .with_context(|| format!("no pod {name} on the stand-in node"))?;
        let child = pod
            .child
            .as_mut()
            .with_context(|| format!("pod {name} has no running container"))?;
        child.kill().context("SIGKILL")?;
        let _ = child.wait();
        pod.child = None;
        pod.restarts += 1;
        pod.ready = false;
        pod.start_after = Instant::now();
        Ok(())
    }

    /// Stops pod `name`'s container with SIGSTOP, as a node that stops answering: its
    /// address still takes connections (into the listen backlog) and answers nothing, and
    /// the pod stays Ready (no kubelet reports it). It is killed when the pod goes.
    pub fn freeze(&self, name: &str) -> Result<()> {
        let pods = self.inner.lock();
        let pod = pods
            .get(name)
            .with_context(|| format!("no pod {name} on the stand-in node"))?;
        let child = pod
            .child
            .as_ref()
            .with_context(|| format!("pod {name} has no running container"))?;
        let status = Command::new("kill")
            .args(["-STOP", &child.id().to_string()])
            .status()
            .context("kill -STOP")?;
        anyhow::ensure!(
            status.success(),
            "kill -STOP of pod {name}'s container failed"
        );
        Ok(())
    }

    /// What happened, one line an event, with seconds since the start.
    pub fn events(&self) -> Vec<String> {
        self.inner
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The last lines of pod `name`'s container output (all restarts).
    pub fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.inner.root.join(name).join("container.log"))
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Podlet {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        // As a node drains: SIGTERM to every container at once, SIGKILL after 10 s.
        let children: Vec<Child> = {
            let mut pods = self.inner.lock();
            pods.values_mut()
                .flat_map(|p| p.child.take().into_iter().chain(p.sidecars.drain(..)))
                .collect()
        };
        let stopping: Vec<_> = children
            .into_iter()
            .map(|c| thread::spawn(move || stop_gracefully(c, Duration::from_secs(10))))
            .collect();
        for t in stopping {
            let _ = t.join();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Pod>> {
        self.pods.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn event(&self, mut text: String) {
        if text.len() > 400 {
            let mut cut = 400;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str(" [...]");
        }
        let line = format!("{:6.1}s {text}", self.started.elapsed().as_secs_f64());
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(line);
    }

    /// Follows the namespace's pods (`kubectl get pods --watch`), restarting the watch when
    /// it ends.
    fn watch_loop(self: Arc<Self>) {
        while !self.stop.load(Ordering::SeqCst) {
            let child = Command::new("kubectl")
                .args([
                    "get",
                    "pods",
                    "-n",
                    &self.namespace,
                    "--watch",
                    "--output-watch-events",
                    "-o",
                    "json",
                ])
                .env("KUBECONFIG", kube::admin_kubeconfig())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn();
            let mut child = match child {
                Ok(c) => c,
                Err(e) => {
                    self.event(format!("cannot start kubectl get pods --watch: {e}"));
                    thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            let Some(out) = child.stdout.take() else {
                let _ = child.kill();
                continue;
            };
            let stream =
                serde_json::Deserializer::from_reader(BufReader::new(out)).into_iter::<Value>();
            // Ends the watch (so that the reader below returns) once asked to stop.
            let done = Arc::new(AtomicBool::new(false));
            let killer = {
                let (done, me, pid) = (done.clone(), self.clone(), child.id());
                thread::spawn(move || {
                    while !done.load(Ordering::SeqCst) && !me.stop.load(Ordering::SeqCst) {
                        thread::sleep(Duration::from_millis(100));
                    }
                    let _ = Command::new("kill")
                        .args(["-TERM", &pid.to_string()])
                        .status();
                })
            };
            for event in stream {
                let Ok(event) = event else { break };
                self.on_event(&event);
                if self.stop.load(Ordering::SeqCst) {
                    break;
                }
            }
            done.store(true, Ordering::SeqCst);
            let _ = killer.join();
            let _ = child.wait();
        }
    }

    fn on_event(&self, event: &Value) {
        let kind = event["type"].as_str().unwrap_or_default();
        let pod = &event["object"];
        let Some(name) = pod["metadata"]["name"].as_str() else {
            return;
        };
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let mut pods = self.lock();
        if kind == "DELETED" {
            if let Some(p) = pods.get_mut(name).filter(|p| p.uid == uid) {
                p.gone = true;
            }
            return;
        }
        let deleting = pod["metadata"]["deletionTimestamp"].as_str().map(|_| {
            pod["metadata"]["deletionGracePeriodSeconds"]
                .as_u64()
                .unwrap_or(30)
        });
        if let Some(p) = pods.get_mut(name).filter(|p| p.uid == uid) {
            if p.deleting.is_none() && deleting.is_some() {
                p.deleting = deleting;
            }
            return;
        }
        if deleting.is_some() {
            return;
        }
        let n = self.next_ip.fetch_add(1, Ordering::SeqCst);
        let ip = Ipv4Addr::new(127, 0, 1, (n % 250) as u8 + 2);
        let labels = pod["metadata"]["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let dir = self.root.join(name);
        let binding = json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": self.namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        });
        if pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty)
            && let Err(e) = kube::kubectl_input(
                &[
                    "create",
                    "--raw",
                    &format!("/api/v1/namespaces/{}/pods/{name}/binding", self.namespace),
                    "-f",
                    "-",
                ],
                Some(&binding.to_string()),
            )
        {
            self.event(format!("pod {name}: cannot bind it: {e:#}"));
        }
        self.event(format!("pod {name}: scheduled, address {ip}"));
        pods.insert(
            name.to_owned(),
            Pod {
                uid: uid.to_owned(),
                ip,
                labels,
                spec: pod["spec"].clone(),
                dir,
                child: None,
                sidecars: Vec::new(),
                terminated: None,
                start_after: Instant::now(),
                started_at: String::new(),
                restarts: 0,
                ready: false,
                reported: None,
                next_probe: Instant::now(),
                deleting: None,
                gone: false,
                waiting: None,
            },
        );
    }

    /// Starts, probes, reports and stops the pods' containers.
    fn sync_loop(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            let names: Vec<String> = self.lock().keys().cloned().collect();
            for name in names {
                if let Err(e) = self.sync_pod(&name) {
                    self.event(format!("pod {name}: {e:#}"));
                }
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn sync_pod(&self, name: &str) -> Result<()> {
        let mut pods = self.lock();
        let Some(pod) = pods.get_mut(name) else {
            return Ok(());
        };
        if pod.gone || pod.deleting.is_some() {
            let grace = pod.deleting.unwrap_or(0);
            let child = pod.child.take();
            let sidecars = std::mem::take(&mut pod.sidecars);
            let (gone, uid) = (pod.gone, pod.uid.clone());
            pods.remove(name);
            drop(pods);
            if let Some(child) = child {
                self.event(format!("pod {name}: SIGTERM (grace period {grace}s)"));
                stop_gracefully(child, Duration::from_secs(grace));
                self.event(format!("pod {name}: container stopped"));
            }
            // Sidecars after the main container, as a kubelet stops them.
            for sidecar in sidecars {
                stop_gracefully(sidecar, Duration::from_secs(grace));
            }
            if !gone {
                // As a kubelet finishes a deletion: grace period 0, for this pod only.
                let body = json!({
                    "kind": "DeleteOptions",
                    "apiVersion": "v1",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": uid},
                });
                let _ = kube::kubectl_input(
                    &[
                        "delete",
                        "--raw",
                        &format!("/api/v1/namespaces/{}/pods/{name}", self.namespace),
                        "-f",
                        "-",
                    ],
                    Some(&body.to_string()),
                );
            }
            return Ok(());
        }
        // An exited container.
        if let Some(child) = pod.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            pod.child = None;
            pod.ready = false;
            if pod.spec["restartPolicy"].as_str() == Some("Never") {
                // The pod is done: its sidecars stop, its phase is final.
                use std::os::unix::process::ExitStatusExt;
                let code = status
                    .code()
                    .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
                pod.terminated = Some(code);
                let sidecars = std::mem::take(&mut pod.sidecars);
                drop(pods);
                self.event(format!("pod {name}: container exited ({status}), pod done"));
                for sidecar in sidecars {
                    stop_gracefully(sidecar, Duration::from_secs(10));
                }
                return Ok(());
            }
            pod.restarts += 1;
            pod.start_after = Instant::now() + Duration::from_secs(1);
            let line = format!("pod {name}: container exited ({status}), restarting");
            drop(pods);
            self.event(line);
            return Ok(());
        }
        if pod.child.is_none() && pod.terminated.is_none() && Instant::now() >= pod.start_after {
            match self.start_pod_containers(pod) {
                Ok(child) => {
                    pod.child = Some(child);
                    pod.started_at = rfc3339_now();
                    pod.waiting = None;
                    pod.next_probe = Instant::now();
                    let line = format!("pod {name}: container started");
                    drop(pods);
                    self.event(line);
                    return Ok(());
                }
                Err(e) => {
                    let why = format!("{e:#}");
                    pod.start_after = Instant::now() + Duration::from_secs(1);
                    if pod.waiting.as_deref() != Some(&why) {
                        pod.waiting = Some(why.clone());
                        drop(pods);
                        self.event(format!("pod {name}: waiting: {why}"));
                    }
                    return Ok(());
                }
            }
        }
        if pod.child.is_some() && Instant::now() >= pod.next_probe {
            let probe = &pod.spec["containers"][0]["readinessProbe"];
            let period = probe["periodSeconds"].as_u64().unwrap_or(10);
            pod.next_probe = Instant::now() + Duration::from_secs(period);
            pod.ready = match probe["tcpSocket"]["port"].clone() {
                Value::Null => true,
                port => {
                    let port = container_port(&pod.spec, &port)?;
                    TcpStream::connect_timeout(
                        &SocketAddr::from((pod.ip, port)),
                        Duration::from_secs(1),
                    )
                    .is_ok()
                }
            };
        }
        let now = (pod.ready, pod.terminated);
        if (pod.child.is_some() || pod.terminated.is_some()) && pod.reported != Some(now) {
            let status = pod_status(pod);
            let ready = pod.ready;
            let uid = pod.uid.clone();
            drop(pods);
            kube::kubectl(&[
                "patch",
                "pod",
                name,
                "-n",
                &self.namespace,
                "--subresource=status",
                "--type=merge",
                "-p",
                &status.to_string(),
            ])
            .context("writing the pod's status")?;
            self.event(format!("pod {name}: Ready={ready}, exit {:?}", now.1));
            if let Some(p) = self.lock().get_mut(name).filter(|p| p.uid == uid) {
                p.reported = Some(now);
            }
        }
        Ok(())
    }

    /// Starts the pod's native sidecars (those not running yet), then its main container;
    /// returns the main container's process.
    fn start_pod_containers(&self, pod: &mut Pod) -> Result<Child> {
        let sidecars: Vec<Value> = pod.spec["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["restartPolicy"].as_str() == Some("Always"))
            .cloned()
            .collect();
        for c in sidecars.iter().skip(pod.sidecars.len()) {
            let child = self.start_container(pod, c)?;
            pod.sidecars.push(child);
        }
        let main = pod.spec["containers"][0].clone();
        self.start_container(pod, &main)
    }

    /// Starts container `c` of the pod.
    fn start_container(&self, pod: &Pod, c: &Value) -> Result<Child> {
        let cname = c["name"].as_str().unwrap_or("container");
        let image = c["image"].as_str().context("the container has no image")?;
        let command: Vec<&str> = c["command"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let base = |s: &str| -> String {
            s.rsplit('/')
                .next()
                .and_then(|i| i.split(':').next())
                .unwrap_or_default()
                .to_owned()
        };
        let program = command.first().map_or_else(|| base(image), |p| base(p));
        let ours = matches!(
            program.as_str(),
            "jumpstarter-controller" | "jumpstarter-router" | "jmp"
        );
        let is_sidecar = c["restartPolicy"].as_str() == Some("Always");
        if !ours && !is_sidecar {
            bail!("image {image} is not one of ours");
        }
        // Volumes first: a missing Secret keeps the pod waiting, as a failed mount does.
        std::fs::create_dir_all(&pod.dir)?;
        let mut mounts: Vec<(String, PathBuf)> = Vec::new();
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            let (Some(vname), Some(path)) = (m["name"].as_str(), m["mountPath"].as_str()) else {
                continue;
            };
            let vol = pod.spec["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["name"].as_str() == Some(vname))
                .with_context(|| format!("volume {vname} is not in the pod"))?;
            if !vol["projected"].is_null() && vname.starts_with("kube-api-access-") {
                // The ServiceAccount token: the process gets a kubeconfig instead (below).
                continue;
            }
            let dir = pod.dir.join("volumes").join(vname);
            std::fs::create_dir_all(&dir)?;
            if let Some(secret) = vol["secret"]["secretName"].as_str() {
                let data = self.secret(secret).with_context(|| {
                    format!("FailedMount: volume {vname}: Secret {secret} not found")
                })?;
                for (k, v) in data {
                    std::fs::write(dir.join(k), v)?;
                }
            } else if vol["emptyDir"].is_null() {
                bail!("volume {vname}: only emptyDir and secret volumes are served here");
            }
            mounts.push((path.to_owned(), dir));
        }
        let ip = pod.ip.to_string();
        let map = |s: &str| -> String { map_mounts(&s.replace("0.0.0.0", &ip), &mounts) };
        let mut env: Vec<(String, String)> = Vec::new();
        for e in c["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().context("an env entry has no name")?;
            let value = if let Some(v) = e["value"].as_str() {
                map(v)
            } else if let Some(field) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                match field {
                    "metadata.namespace" => self.namespace.clone(),
                    "metadata.name" => pod
                        .dir
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    "status.podIP" => ip.clone(),
                    other => bail!("env {name}: fieldRef {other} is not served here"),
                }
            } else if let Some(secret) = e["valueFrom"]["secretKeyRef"]["name"].as_str() {
                let key = e["valueFrom"]["secretKeyRef"]["key"]
                    .as_str()
                    .unwrap_or_default();
                let data = self.secret(secret).with_context(|| {
                    format!("CreateContainerConfigError: env {name}: Secret {secret} not found")
                })?;
                let v = data
                    .get(key)
                    .with_context(|| format!("env {name}: Secret {secret} has no key {key}"))?;
                String::from_utf8_lossy(v).into_owned()
            } else {
                bail!("env {name}: only value, fieldRef and secretKeyRef are served here");
            };
            env.push((name.to_owned(), value));
        }
        let args: Vec<String> = command
            .iter()
            .skip(1)
            .copied()
            .chain(
                c["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str),
            )
            .map(map)
            .collect();
        // The main container's output is container.log, a sidecar's <name>.log.
        let log_name = if is_sidecar {
            format!("{cname}.log")
        } else {
            "container.log".to_owned()
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(pod.dir.join(log_name))?;
        let (exe, args) = if ours {
            (self.bins.join(&program), args)
        } else {
            // A target runtime that is not ours: a process that does nothing stands in.
            (PathBuf::from("sleep"), vec!["infinity".to_owned()])
        };
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &pod.dir)
            .envs(env)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if pod.spec["serviceAccountName"].as_str() == Some("jumpstarter-controller") {
            cmd.env("KUBECONFIG", kube::controller_kubeconfig());
        }
        cmd.spawn()
            .with_context(|| format!("starting {}", exe.display()))
    }

    /// Secret `name`'s data, decoded.
    fn secret(&self, name: &str) -> Result<BTreeMap<String, Vec<u8>>> {
        let text = kube::kubectl(&["get", "secret", name, "-n", &self.namespace, "-o", "json"])?;
        let v: Value = serde_json::from_str(&text)?;
        let mut out = BTreeMap::new();
        for (k, d) in v["data"].as_object().into_iter().flatten() {
            out.insert(
                k.clone(),
                base64_decode(d.as_str().unwrap_or_default())
                    .with_context(|| format!("Secret {name}: key {k} is not base64"))?,
            );
        }
        Ok(out)
    }

    /// Forwards each connection `listener` accepts to a Ready pod matching `selector`.
    fn proxy_loop(&self, listener: TcpListener, selector: &[(String, String)], target: &str) {
        let mut turn = 0usize;
        while !self.stop.load(Ordering::SeqCst) {
            let conn = match listener.accept() {
                Ok((c, _)) => c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(20));
                    continue;
                }
                Err(_) => continue,
            };
            let endpoints: Vec<SocketAddr> = {
                let pods = self.lock();
                pods.values()
                    .filter(|p| p.ready && !p.gone && p.deleting.is_none())
                    .filter(|p| {
                        selector
                            .iter()
                            .all(|(k, v)| p.labels.get(k).is_some_and(|x| x == v))
                    })
                    .filter_map(|p| {
                        container_port(&p.spec, &Value::String(target.to_owned()))
                            .ok()
                            .or_else(|| target.parse().ok())
                            .map(|port| SocketAddr::from((p.ip, port)))
                    })
                    .collect()
            };
            if endpoints.is_empty() {
                // No endpoints: the connection is refused, as kube-proxy's REJECT does.
                let _ = conn.shutdown(Shutdown::Both);
                continue;
            }
            turn += 1;
            let to = endpoints[turn % endpoints.len()];
            thread::spawn(move || splice(conn, to));
        }
    }
}

/// Copies both ways between `conn` and a new connection to `to`, until both ends close.
fn splice(conn: TcpStream, to: SocketAddr) {
    let Ok(upstream) = TcpStream::connect_timeout(&to, Duration::from_secs(3)) else {
        return;
    };
    let _ = conn.set_nonblocking(false);
    let pairs = (conn.try_clone(), upstream.try_clone());
    let (Ok(conn2), Ok(up2)) = pairs else {
        return;
    };
    let a = thread::spawn(move || copy(conn, upstream));
    copy(up2, conn2);
    let _ = a.join();
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

/// `s` with each mount path in it (where a path component ends after it) replaced by the
/// pod's directory for it, in one pass: a directory put in is not searched again (a pod
/// directory under `/tmp` stays as it is when `/tmp` is a mount too). The longest mount path
/// wins where several match.
fn map_mounts(s: &str, mounts: &[(String, PathBuf)]) -> String {
    let mut sorted: Vec<&(String, PathBuf)> = mounts.iter().collect();
    sorted.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    'scan: while let Some(c) = rest.chars().next() {
        for (path, dir) in &sorted {
            if let Some(after) = rest.strip_prefix(path.as_str())
                && (after.is_empty() || after.starts_with('/'))
            {
                out.push_str(&dir.display().to_string());
                rest = after;
                continue 'scan;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// SIGTERM, then SIGKILL after `grace`.
fn stop_gracefully(mut child: Child, grace: Duration) {
    // SIGCONT after the SIGTERM, for a frozen one, as a container runtime does.
    for signal in ["-TERM", "-CONT"] {
        let _ = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status();
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The container port `port` names (a number, or the name of one of the container's ports).
fn container_port(spec: &Value, port: &Value) -> Result<u16> {
    if let Some(n) = port.as_u64() {
        return u16::try_from(n).context("a port above 65535");
    }
    let name = port
        .as_str()
        .context("a port that is neither a number nor a name")?;
    if let Ok(n) = name.parse() {
        return Ok(n);
    }
    spec["containers"][0]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"].as_str() == Some(name))
        .and_then(|p| p["containerPort"].as_u64())
        .and_then(|n| u16::try_from(n).ok())
        .with_context(|| format!("the container has no port named {name}"))
}

/// The status a kubelet writes for a running pod, or one whose main container has exited
/// (`restartPolicy: Never`).
fn pod_status(pod: &Pod) -> Value {
    let ready = if pod.ready { "True" } else { "False" };
    let now = rfc3339_now();
    let c = &pod.spec["containers"][0];
    let (phase, state) = match pod.terminated {
        None => ("Running", json!({"running": {"startedAt": pod.started_at}})),
        Some(code) => (
            if code == 0 { "Succeeded" } else { "Failed" },
            json!({"terminated": {
                "exitCode": code,
                "reason": if code == 0 { "Completed" } else { "Error" },
                "startedAt": pod.started_at,
                "finishedAt": now,
            }}),
        ),
    };
    let sidecars: Vec<Value> = pod.spec["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["restartPolicy"].as_str() == Some("Always"))
        .map(|s| {
            let running = pod.terminated.is_none();
            json!({
                "name": s["name"],
                "image": s["image"],
                "imageID": "",
                "ready": running,
                "started": running,
                "restartCount": 0,
                "state": if running {
                    json!({"running": {"startedAt": pod.started_at}})
                } else {
                    json!({"terminated": {"exitCode": 0, "reason": "Completed",
                        "startedAt": pod.started_at, "finishedAt": now}})
                },
            })
        })
        .collect();
    json!({"status": {
        "phase": phase,
        "hostIP": "127.0.0.1",
        "podIP": pod.ip.to_string(),
        "podIPs": [{"ip": pod.ip.to_string()}],
        "startTime": pod.started_at,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": pod.started_at},
            {"type": "Initialized", "status": "True", "lastTransitionTime": pod.started_at},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
            {"type": "Ready", "status": ready, "lastTransitionTime": now},
        ],
        "containerStatuses": [{
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": pod.ready,
            "started": true,
            "restartCount": pod.restarts,
            "state": state,
        }],
        "initContainerStatuses": sidecars,
    }})
}

/// Now, as RFC 3339 in UTC with seconds.
pub fn rfc3339_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Standard base64 (the Secret's `data`).
pub fn base64_decode(text: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for b in text.bytes() {
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' | b'\n' | b'\r' => continue,
            other => bail!("{:?} is not a base64 character", other as char),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_and_dates() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGk=").unwrap(), b"hi");
        assert!(base64_decode("a*b").is_err());
        let now = rfc3339_now();
        assert_eq!(now.len(), 20, "{now}");
        assert!(now.starts_with("20") && now.ends_with('Z'), "{now}");
    }

    #[test]
    fn mount_paths_are_mapped_once() {
        let mounts = vec![
            ("/tmp".to_owned(), PathBuf::from("/tmp/pods/p/volumes/tmp")),
            (
                "/etc/jumpstarter/exporter".to_owned(),
                PathBuf::from("/tmp/pods/p/volumes/exporter-config"),
            ),
            ("/var/lib/jumpstarter".to_owned(), PathBuf::from("/d")),
        ];
        assert_eq!(
            map_mounts("/etc/jumpstarter/exporter/exporter.yaml", &mounts),
            "/tmp/pods/p/volumes/exporter-config/exporter.yaml"
        );
        assert_eq!(
            map_mounts("--data-dir=/var/lib/jumpstarter", &mounts),
            "--data-dir=/d"
        );
        assert_eq!(map_mounts("/tmpfoo", &mounts), "/tmpfoo");
        assert_eq!(map_mounts("/tmp/x", &mounts), "/tmp/pods/p/volumes/tmp/x");
    }

    #[test]
    fn container_ports_by_name_and_number() {
        let spec = json!({"containers": [{"ports": [
            {"name": "controller-grpc", "containerPort": 8082},
        ]}]});
        assert_eq!(
            container_port(&spec, &json!("controller-grpc")).unwrap(),
            8082
        );
        assert_eq!(container_port(&spec, &json!(9000)).unwrap(), 9000);
        assert!(container_port(&spec, &json!("metrics")).is_err());
    }
}
