//! `cargo xtask kube-pools [--reuse]`: a virtual target pool on Kubernetes end to end, on the
//! real API server of `kube-up` (`cargo xtask kube-e2e` runs it after kube-rollout).
//!
//! `jumpstarter-controller --store kubernetes` (as its ServiceAccount, with the ClusterRole of
//! `deploy/kubernetes/base`) runs the pool engine with the `qemu.jumpstarter.dev` provisioner;
//! the stand-in node ([`crate::kube_podlet`]) runs each replica Pod's containers: the exporter
//! (`jmp run` of the debug build, its config from the Pod's Secret) and, for the QEMU runtime
//! sidecar, a process that does nothing. kube-controller-manager runs its garbage collector
//! and ServiceAccount controllers (the namespace's `default` ServiceAccount, which the Pods
//! run as). In namespace [`NS`]:
//!
//! 1. A VirtualTargetClass and an ExporterSet (`minAvailableReplicas: 1`, `ExitAndReplace`,
//!    a MockPower driver) applied with kubectl: one Pod appears and runs, its runtime sidecar
//!    and exporter started.
//! 2. `jmp shell -l pool=e2e -- j power on` is served by it; while it is leased another Pod
//!    is made (the warm pool); after the lease its exporter exits, its Pod is `Succeeded`
//!    and deleted, and a second `jmp shell` is served by another replica.
//! 3. `minAvailableReplicas` raised to 2 with `kubectl patch`: a Pod more; lowered to 1: one
//!    goes after the set's cooldown.
//! 4. The controller stopped and the ExporterSet deleted: the garbage collector removes its
//!    Pods (the stand-in node stops their processes) and their Secrets, by their owner
//!    references alone.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::{
    kube,
    kube_podlet::Podlet,
    procs::{Background, run as run_cmd, wait_path},
};

/// The namespace of the pool (the stand-in node serves its Pods only).
pub const NS: &str = "pools-e2e";
const SET: &str = "e2e-pool";
const CLASS: &str = "e2e-qemu";
const CLIENT: &str = "e2e-pool-client";
/// The label on every replica (its Exporter, Pod and Secret): the set's name.
const SET_LABEL: &str = "virtualtarget.jumpstarter.dev/exporterset";
/// How long each step may take.
const STEP: Duration = Duration::from_secs(120);

/// `cargo xtask kube-pools [--reuse] [--no-build]`.
pub fn run(args: &[String]) -> Result<()> {
    let (cluster, bins) = kube::suite_setup("kube-pools", args)?;
    scenario(&bins)?;
    drop(cluster);
    Ok(())
}

/// Everything of the module docs on the running cluster; removes what it made.
pub fn scenario(bins: &Path) -> Result<()> {
    let work = crate::target_dir().join("kube-pools");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    println!(
        "== virtual target pools: the qemu.jumpstarter.dev provisioner on kube-apiserver {}",
        kube::K8S_VERSION
    );
    let started = Instant::now();
    cleanup();
    let result = scenario_in(bins, &work);
    cleanup();
    match &result {
        Ok(()) => println!(
            "   pools scenario passed in {:.1}s",
            started.elapsed().as_secs_f64()
        ),
        Err(_) => println!("   logs under {}", work.display()),
    }
    result
}

/// One of the set's Pods as the API server has it.
#[derive(Debug, Clone)]
struct PodState {
    name: String,
    phase: String,
    deleting: bool,
    /// The target runtime sidecar's state (`running`, `terminated`, or empty).
    runtime: String,
}

fn set_pods() -> Result<Vec<PodState>> {
    let text = kube::kubectl(&[
        "get",
        "pods",
        "-n",
        NS,
        "-l",
        &format!("{SET_LABEL}={SET}"),
        "-o",
        "json",
    ])?;
    let v: Value = serde_json::from_str(&text)?;
    Ok(v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| PodState {
            name: p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            phase: p["status"]["phase"].as_str().unwrap_or_default().to_owned(),
            deleting: !p["metadata"]["deletionTimestamp"].is_null(),
            runtime: p["status"]["initContainerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["name"].as_str() == Some("target-runtime"))
                .and_then(|c| c["state"].as_object())
                .and_then(|s| s.keys().next().cloned())
                .unwrap_or_default(),
        })
        .collect())
}

/// The running (not deleting) Pods of the set.
fn running(pods: &[PodState]) -> Vec<String> {
    pods.iter()
        .filter(|p| p.phase == "Running" && !p.deleting)
        .map(|p| p.name.clone())
        .collect()
}

/// The lab: the processes, the configs, and what the stand-in node saw.
struct Lab {
    bins: PathBuf,
    work: PathBuf,
    podlet: Podlet,
    /// Every Pod of the set seen so far.
    seen: BTreeSet<String>,
    controller: Background,
    _kcm: Background,
}

impl Lab {
    fn jmp(&self) -> Command {
        let mut cmd = Command::new(self.bins.join("jmp"));
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.bins.clone()];
        paths.extend(std::env::split_paths(&path));
        cmd.env("PATH", std::env::join_paths(paths).unwrap_or(path))
            .env("JMP_CLIENT_CONFIG_HOME", self.work.join("config"))
            .env("JMP_ADMIN_CONFIG", self.work.join("config/admin.yaml"))
            .env_remove("JMP_NAME")
            .env_remove("JUMPSTARTER_HOST");
        cmd
    }

    /// Polls the set's Pods until `done` says so (its `Some` is returned), within [`STEP`].
    fn wait<T>(&mut self, what: &str, mut done: impl FnMut(&[PodState]) -> Option<T>) -> Result<T> {
        let deadline = Instant::now() + STEP;
        let mut last = Vec::new();
        while Instant::now() < deadline {
            let pods = set_pods()?;
            self.seen.extend(pods.iter().map(|p| p.name.clone()));
            if let Some(t) = done(&pods) {
                return Ok(t);
            }
            last = pods;
            thread::sleep(Duration::from_millis(250));
        }
        bail!("{what}: not within {STEP:?}; {}", self.diagnosis(&last))
    }

    /// What to look at when a step fails.
    fn diagnosis(&self, pods: &[PodState]) -> String {
        let lines: Vec<String> = self.controller.lines.try_iter().collect();
        let logs: Vec<String> = pods
            .iter()
            .map(|p| format!("--- {}:\n{}", p.name, self.podlet.log_tail(&p.name)))
            .collect();
        format!(
            "the set's Pods: {pods:?}\nstand-in node:\n{}\n{}\ncontroller (last lines):\n{}",
            self.podlet.events().join("\n"),
            logs.join("\n"),
            lines[lines.len().saturating_sub(40)..].join("\n")
        )
    }

    /// `jmp shell -l pool=e2e -- j power on`, which must succeed.
    fn lease_power_on(&self, what: &str) -> Result<()> {
        let mut cmd = self.jmp();
        cmd.args([
            "shell", "--client", CLIENT, "-l", "pool=e2e", "--", "j", "power", "on",
        ]);
        let out = run_cmd(cmd, STEP).with_context(|| {
            format!(
                "{what}: {}",
                self.diagnosis(&set_pods().unwrap_or_default())
            )
        })?;
        ensure!(
            out.code == 0,
            "{what}: jmp shell -l pool=e2e -- j power on exited with {}:\n{}{}\n{}",
            out.code,
            out.stdout,
            out.stderr,
            self.diagnosis(&set_pods().unwrap_or_default())
        );
        Ok(())
    }
}

fn apply(yaml: &str) -> Result<()> {
    kube::kubectl_input(&["apply", "-f", "-"], Some(yaml))?;
    Ok(())
}

fn scenario_in(bins: &Path, work: &Path) -> Result<()> {
    apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ))?;
    let kcm = kube::ensure_binaries()?.controller_manager;
    let mut cmd = Command::new(kcm);
    cmd.arg(format!(
        "--kubeconfig={}",
        kube::admin_kubeconfig().display()
    ))
    .args([
        "--controllers=garbage-collector-controller,serviceaccount-controller",
        "--leader-elect=false",
        "--secure-port=0",
        "--use-service-account-credentials=false",
        "--v=1",
    ]);
    let kcm = Background::start("kube-controller-manager", cmd)?;
    let podlet = Podlet::start(NS, bins, &work.join("pods"))?;

    let config = work.join("config");
    std::fs::create_dir_all(&config)?;
    let mut cmd = Command::new(bins.join("jumpstarter-controller"));
    // The controller's own namespace is the pool's: its settings are the defaults (the
    // in-process router), whatever ConfigMap earlier suites left in `jumpstarter`, and its
    // key Secrets go with the scenario's cleanup.
    cmd.args(["--store", "kubernetes", "--namespace", NS])
        .arg("--no-leader-election")
        .arg("--data-dir")
        .arg(work.join("data"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--router-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "off",
        ])
        .arg("--admin-config")
        .arg(config.join("admin.yaml"))
        .env("KUBECONFIG", kube::controller_kubeconfig())
        .env("RUST_LOG", "info");
    let controller = Background::start("jumpstarter-controller", cmd)?;
    let mut lab = Lab {
        bins: bins.to_owned(),
        work: work.to_owned(),
        podlet,
        seen: BTreeSet::new(),
        controller,
        _kcm: kcm,
    };
    wait_path(&config.join("admin.yaml"), Duration::from_secs(60))
        .with_context(|| format!("the controller did not start: {}", lab.diagnosis(&[])))?;
    let mut cmd = lab.jmp();
    cmd.args([
        "admin", "create", "client", CLIENT, "-n", NS, "--save", "--unsafe",
    ]);
    let out = run_cmd(cmd, STEP)?;
    ensure!(
        out.code == 0,
        "jmp admin create client: {}{}",
        out.stdout,
        out.stderr
    );

    // 1. The class and the set: one warm replica.
    let t = Instant::now();
    apply(&format!(
        "apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: VirtualTargetClass
metadata:
  name: {CLASS}
  namespace: {NS}
spec:
  provisioner: qemu.jumpstarter.dev
  parameters:
    machineType: virt
---
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata:
  name: {SET}
  namespace: {NS}
spec:
  virtualTargetClassName: {CLASS}
  minAvailableReplicas: 1
  maxReplicas: 3
  scaleDownCooldown: 2s
  recycleStrategy: ExitAndReplace
  selector:
    matchLabels:
      pool: e2e
  template:
    metadata:
      labels:
        pool: e2e
    spec:
      drivers:
        - name: power
          type: jumpstarter_driver_power.driver.MockPower
"
    ))?;
    let first = lab.wait("a Pod running for the warm pool", |pods| {
        let r = running(pods);
        let runtime_up = pods
            .iter()
            .any(|p| r.contains(&p.name) && p.runtime == "running");
        (r.len() == 1 && runtime_up).then(|| r[0].clone())
    })?;
    println!(
        "   ExporterSet applied -> Pod {first} running (exporter and runtime sidecar): {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let secret = kube::kubectl(&[
        "get",
        "secret",
        &format!("{first}-exporter-config"),
        "-n",
        NS,
        "-o",
        "jsonpath={.metadata.ownerReferences[0].kind}",
    ])?;
    ensure!(
        secret.trim() == "ExporterSet",
        "Secret {first}-exporter-config is owned by {secret:?}, not the ExporterSet"
    );

    // 2. A lease served by it; after it, the replica exits and is replaced.
    let t = Instant::now();
    lab.lease_power_on("the first lease")?;
    println!(
        "   jmp shell -l pool=e2e -- j power on: served ({:.1}s)",
        t.elapsed().as_secs_f64()
    );
    lab.wait(&format!("Pod {first} gone after its lease"), |pods| {
        pods.iter().all(|p| p.name != first).then_some(())
    })?;
    ensure!(
        lab.podlet
            .log_tail(&first)
            .contains("[driver.MockPower] power on"),
        "Pod {first}'s exporter did not log the driver call:\n{}",
        lab.podlet.log_tail(&first)
    );
    // Its exporter exited with 0 after the lease (ExitAndReplace) and the node wrote the
    // Pod's phase (Succeeded) before the engine deleted it.
    let events = lab.podlet.events();
    for needle in [
        format!("pod {first}: container exited (exit status: 0)"),
        format!("pod {first}: Ready=false, exit Some(0)"),
    ] {
        ensure!(
            events.iter().any(|e| e.contains(&needle)),
            "Pod {first}: no {needle:?} after its lease: {}",
            lab.diagnosis(&[])
        );
    }
    let replacement = lab.wait("a replacement Pod running", |pods| {
        let r = running(pods);
        (!r.is_empty()).then(|| r[0].clone())
    })?;
    println!(
        "   after the lease: Pod {first} exited (Succeeded) and was deleted; {replacement} runs"
    );
    lab.lease_power_on("the lease on the replacement")?;
    println!("   a second lease served by a replacement replica");

    // 3. The set changed: a Pod more, then one less after the cooldown.
    let settled = lab.wait("the pool back to one running Pod", |pods| {
        let r = running(pods);
        (r.len() == 1 && pods.len() == 1).then(|| r[0].clone())
    })?;
    kube::kubectl(&[
        "patch",
        "exporterset",
        SET,
        "-n",
        NS,
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailableReplicas":2}}"#,
    ])?;
    lab.wait("two running Pods after minAvailableReplicas: 2", |pods| {
        (running(pods).len() == 2).then_some(())
    })?;
    kube::kubectl(&[
        "patch",
        "exporterset",
        SET,
        "-n",
        NS,
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailableReplicas":1}}"#,
    ])?;
    lab.wait(
        "one Pod after minAvailableReplicas: 1 and the cooldown",
        |pods| (running(pods).len() == 1 && pods.len() == 1).then_some(()),
    )?;
    println!(
        "   minAvailableReplicas 1 -> 2 -> 1: a Pod made, then one deleted ({settled} was there before)"
    );

    // 4. Without the controller, deleting the set collects its Pods and Secrets.
    lab.controller.stop();
    let t = Instant::now();
    kube::kubectl(&["delete", "exporterset", SET, "-n", NS, "--wait=false"])?;
    lab.wait("the set's Pods collected", |pods| {
        pods.is_empty().then_some(())
    })?;
    let deadline = Instant::now() + STEP;
    loop {
        let secrets = kube::kubectl(&[
            "get",
            "secrets",
            "-n",
            NS,
            "-l",
            &format!("{SET_LABEL}={SET}"),
            "-o",
            "name",
        ])?;
        if secrets.trim().is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the set's Secrets were not collected: {secrets}"
        );
        thread::sleep(Duration::from_millis(250));
    }
    println!(
        "   ExporterSet deleted (controller stopped): its Pods and Secrets collected by the \
         garbage collector in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    ensure!(
        lab.seen.len() >= 4,
        "expected at least four Pods over the scenario, saw {:?}",
        lab.seen
    );
    println!("   {} Pods in all: {:?}", lab.seen.len(), lab.seen);
    Ok(())
}

/// Removes what the scenario makes (and an earlier run left): the pool's objects in [`NS`],
/// forced (no node may be left to finish a Pod), and the stand-in Node.
fn cleanup() {
    let _ = kube::kubectl(&[
        "delete",
        "-n",
        NS,
        "--ignore-not-found",
        "--wait=false",
        "exportersets.virtualtarget.jumpstarter.dev,virtualtargetclasses.virtualtarget.jumpstarter.dev,leases.jumpstarter.dev,exporters.jumpstarter.dev,clients.jumpstarter.dev",
        "--all",
    ]);
    let _ = kube::kubectl(&[
        "delete",
        "-n",
        NS,
        "pods,secrets",
        "--all",
        "--ignore-not-found",
        "--grace-period=0",
        "--force",
    ]);
    let _ = kube::kubectl(&[
        "delete",
        "node",
        crate::kube_podlet::NODE,
        "--ignore-not-found",
    ]);
}
