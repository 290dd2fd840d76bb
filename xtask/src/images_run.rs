//! The image archives of `cargo xtask images`, loaded and run by a real container runtime
//! against the real API server of `cargo xtask kube-up` (in `cargo xtask kube-e2e`, and
//! alone as `cargo xtask images-run` on a running `kube-up` cluster).
//!
//! The runtime is Debian's podman with runc (installed with `apt-get` when missing), with a
//! store of its own (so nothing of the machine's own podman images is touched), cgroupfs
//! (systemd may not run; crun does not work on hybrid cgroups), the host's network (every
//! server listens on 127.0.0.1, as the API server does). Every container runs as the image
//! says (`USER 65532:65532`, checked in `/proc`), with a read-only root file system, no
//! capabilities and `no-new-privileges`, as the Deployments of `deploy/kubernetes` run them.
//! First each archive's file layout is compared with `podman build` of its Dockerfile
//! ([`crate::images_layout`]); then:
//! 1. `jumpstarter-controller --store kubernetes` in namespace [`NAMESPACE`], with a mounted
//!    kubeconfig of the controller's ServiceAccount and a data directory that is an empty
//!    host directory (the Deployment's `emptyDir`); the ConfigMap names the router below as
//!    the only router;
//! 2. `jumpstarter-router` from the Secrets that controller wrote on its first start
//!    (`jumpstarter-router-tls` mounted as files, `router-key` of
//!    `jumpstarter-controller-keys` in the environment), as `deploy/kubernetes/base/router.yaml`
//!    takes them;
//! 3. `jmp admin create exporter|client` from the `jmp` image with an admin config made from
//!    the key Secret (docs/kubernetes.md section 4), `jmp run` of that exporter (a mock power
//!    driver) in a `jmp` container, and `jmp shell ... -- sh -c 'j power on && j power off'`
//!    in another, through `/bin/sh` as a CI job runs it; the exporter logs both calls and the
//!    router's metrics count the tunnels, so the session went through the router's container.
//!
//! Containers are removed (`podman rm -f`) at the end, also on failure, and any left by an
//! interrupted run at the start; every wait is bounded.

use std::{
    io::{Read, Write},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    kube,
    podman::{NONROOT, Podman, ensure_podman},
    procs,
};

/// The namespace of the controller run from its image (its ConfigMap, key Secrets, leader
/// Lease and the exporter and client of this step).
pub const NAMESPACE: &str = "jumpstarter-images";
/// The three images of `deploy/docker`, by name.
const IMAGES: [&str; 3] = ["jumpstarter-controller", "jumpstarter-router", "jmp"];
/// What every container is named after (removed by this name at start and end).
const PREFIX: &str = "jumpstarter-xtask-";
/// Every kubectl call here is bounded (kubectl waits for a stuck API server forever).
const KUBECTL_TIMEOUT: &str = "--request-timeout=30s";
/// The exporter and client this step creates.
const EXPORTER: &str = "board-images";
const CLIENT: &str = "ci-images";

/// `cargo xtask images-run [--dir DIR] [--layout]`: the archives in DIR (default
/// `target/images`) compared with `podman build` of their Dockerfiles and run against the
/// running `kube-up` cluster; `--layout`: only compared (no cluster needed).
pub fn run(args: &[String]) -> Result<()> {
    let mut dir = crate::target_dir().join("images");
    let mut layout_only = false;
    let mut rest = args.iter();
    while let Some(a) = rest.next() {
        match (a.as_str(), rest.as_slice().first()) {
            ("--layout", _) => layout_only = true,
            ("--dir", Some(d)) => {
                dir = PathBuf::from(d);
                rest.next();
            }
            _ => bail!(
                "usage: cargo xtask images-run [--dir DIR] [--layout] (without --layout, with \
                 cargo xtask kube-up running)"
            ),
        }
    }
    if layout_only {
        ensure_podman()?;
        return crate::images_layout::compare(&dir, &Podman::new());
    }
    kube::running()?;
    against_cluster(&dir)
}

/// The containers started here, removed (`podman rm -f`) when dropped.
struct Containers<'a> {
    podman: &'a Podman,
    names: Vec<String>,
}

impl Containers<'_> {
    /// Removes the containers a run left (also an interrupted one).
    fn remove_all(&self) {
        let names: Vec<String> = ["controller", "router", "exporter", "client", "admin"]
            .iter()
            .map(|n| format!("{PREFIX}{n}"))
            .chain(self.names.iter().cloned())
            .collect();
        let mut args = vec!["rm", "-f", "--ignore", "-t", "2"];
        args.extend(names.iter().map(String::as_str));
        if let Err(e) = self.podman.run(&args, Duration::from_secs(60)) {
            eprintln!("removing the containers: {e:#}");
        }
    }
}

impl Drop for Containers<'_> {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// The options every container gets: the host's network, the image's user (not overridden),
/// a read-only root, no capabilities, the file limits of a default pod.
const CONFINED: [&str; 11] = [
    "--pull=never",
    "--network=host",
    "--read-only",
    "--cap-drop=all",
    "--security-opt=no-new-privileges",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=4096:4096",
    "--log-driver",
    "k8s-file",
];

/// A directory owned by the images' user, mode 0700 (an `emptyDir` or a home).
fn user_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
    std::os::unix::fs::chown(path, Some(NONROOT), Some(NONROOT))
        .with_context(|| format!("chown {} (run as root)", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}

/// A file others may read (as Kubernetes mounts Secret and ConfigMap keys, 0644).
fn write_readable(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))?;
    Ok(())
}

/// One key of a Secret in [`NAMESPACE`], decoded; waits up to `timeout` for it to exist.
fn secret_key(secret: &str, key: &str, timeout: Duration) -> Result<String> {
    let template = format!("--template={{{{index .data \"{key}\" | base64decode}}}}");
    let deadline = Instant::now() + timeout;
    loop {
        match kube::kubectl(&[
            KUBECTL_TIMEOUT,
            "get",
            "secret",
            secret,
            "-n",
            NAMESPACE,
            "-o",
            "go-template",
            &template,
        ]) {
            Ok(v) if !v.is_empty() && v != "<no value>" => return Ok(v),
            Ok(_) if Instant::now() >= deadline => {
                bail!("Secret {NAMESPACE}/{secret} has no key {key}")
            }
            Err(e) if Instant::now() >= deadline => {
                return Err(e.context(format!(
                    "the controller did not write Secret {NAMESPACE}/{secret} within {timeout:?}"
                )));
            }
            _ => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// The text of `GET http://127.0.0.1:PORT/metrics`.
fn scrape(port: u16) -> Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to the router's metrics on port {port}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text)
}

/// The value of the counter `name` in a Prometheus text.
fn counter(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .filter_map(|l| l.strip_prefix(name))
        .find_map(|rest| rest.strip_prefix(' ')?.trim().parse().ok())
}

/// Loads the archives of `dir` and runs the controller, router and jmp images against the
/// running `kube-up` cluster (see the module's documentation).
pub fn against_cluster(dir: &Path) -> Result<()> {
    let started = Instant::now();
    ensure_podman()?;
    let podman = Podman::new();
    let mut containers = Containers {
        podman: &podman,
        names: Vec::new(),
    };
    containers.remove_all();
    crate::images_layout::compare(dir, &podman)?;

    // Loaded by the name their manifest.json gives them (`docker.io/library/NAME:TAG`).
    let t = Instant::now();
    let mut refs = Vec::new();
    for name in IMAGES {
        let archive = dir.join(format!("{name}.tar"));
        ensure!(
            archive.is_file(),
            "{} is missing (cargo xtask images --debug writes it)",
            archive.display()
        );
        let out = podman.run(
            &["load", "--input", &archive.display().to_string()],
            Duration::from_secs(180),
        )?;
        let reference = out
            .lines()
            .find_map(|l| l.strip_prefix("Loaded image: "))
            .or_else(|| {
                out.lines()
                    .find_map(|l| l.strip_prefix("Loaded image(s): "))
            })
            .map(|r| r.trim().to_owned())
            .with_context(|| format!("podman load {}: {out}", archive.display()))?;
        let user = podman.run(
            &[
                "image",
                "inspect",
                "--format",
                "{{.Config.User}}",
                &reference,
            ],
            Duration::from_secs(30),
        )?;
        ensure!(
            user.trim() == format!("{NONROOT}:{NONROOT}"),
            "{reference} runs as {:?}, not {NONROOT}:{NONROOT}",
            user.trim()
        );
        refs.push(reference);
    }
    let [controller_image, router_image, jmp_image] = [&refs[0], &refs[1], &refs[2]];
    println!(
        "   loaded {} into podman: {:.1}s",
        refs.join(", "),
        t.elapsed().as_secs_f64()
    );

    let work = crate::target_dir().join("images-run");
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    let (data, kube_dir, tls, home) = (
        work.join("data"),
        work.join("kube"),
        work.join("router-tls"),
        work.join("home"),
    );
    user_dir(&data)?;
    user_dir(&home)?;
    for d in [&kube_dir, &tls] {
        std::fs::create_dir_all(d)?;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
    }

    // The controller's kubeconfig (its ServiceAccount's token) with the cluster's CA mounted
    // beside it.
    let kubeconfig = std::fs::read_to_string(kube::controller_kubeconfig())?;
    let kubeconfig: String = kubeconfig
        .lines()
        .map(|l| match l.split_once("certificate-authority: ") {
            Some((indent, _)) => {
                format!("{indent}certificate-authority: /etc/jumpstarter/kube/ca.crt\n")
            }
            None => format!("{l}\n"),
        })
        .collect();
    write_readable(&kube_dir.join("kubeconfig"), kubeconfig.as_bytes())?;
    write_readable(
        &kube_dir.join("ca.crt"),
        &std::fs::read(kube::state_dir().join("ca.crt"))?,
    )?;

    let t = Instant::now();
    let (grpc, in_process_router, router, router_metrics) = (
        procs::free_port()?,
        procs::free_port()?,
        procs::free_port()?,
        procs::free_port()?,
    );
    // What an earlier run left; then the ConfigMap naming the router container.
    kube::kubectl_input(
        &[
            KUBECTL_TIMEOUT,
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=jumpstarter-xtask",
            "-f",
            "-",
        ],
        Some(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: jumpstarter-controller\n  \
             namespace: {NAMESPACE}\ndata:\n  config: |\n    authentication:\n      \
             internal:\n        prefix: \"internal:\"\n  router: |\n    router-images:\n      \
             endpoint: 127.0.0.1:{router}\n      labels: {{}}\n"
        )),
    )?;
    kube::kubectl(&[
        KUBECTL_TIMEOUT,
        "delete",
        "-n",
        NAMESPACE,
        "--ignore-not-found",
        "--wait=false",
        &format!("exporters.jumpstarter.dev/{EXPORTER}"),
        &format!("secrets/{EXPORTER}-exporter"),
        &format!("clients.jumpstarter.dev/{CLIENT}"),
        &format!("secrets/{CLIENT}-client"),
        "secrets/jumpstarter-controller-keys",
        "secrets/jumpstarter-router-tls",
        "leases.coordination.k8s.io/jumpstarter-controller-leader",
    ])?;
    kube::kubectl(&[
        KUBECTL_TIMEOUT,
        "delete",
        "-n",
        NAMESPACE,
        "--all",
        "--ignore-not-found",
        "--wait=false",
        "leases.jumpstarter.dev",
    ])?;

    // 1. The controller, as deploy/kubernetes/base/controller.yaml runs it.
    let name = format!("{PREFIX}controller");
    containers.names.push(name.clone());
    let mut args: Vec<String> = vec!["run".into(), "--detach".into(), format!("--name={name}")];
    args.extend(CONFINED.iter().map(|s| s.to_string()));
    args.extend([
        format!("--volume={}:/var/lib/jumpstarter", data.display()),
        format!("--volume={}:/etc/jumpstarter/kube:ro", kube_dir.display()),
        "--env=KUBECONFIG=/etc/jumpstarter/kube/kubeconfig".into(),
        format!("--env=NAMESPACE={NAMESPACE}"),
        format!("--env=POD_NAME={name}"),
        "--env=RUST_LOG=info".into(),
        controller_image.clone(),
        "--store=kubernetes".into(),
        "--data-dir=/var/lib/jumpstarter".into(),
        "--no-admin-config".into(),
        format!("--listen=127.0.0.1:{grpc}"),
        format!("--router-listen=127.0.0.1:{in_process_router}"),
        "--metrics-listen=off".into(),
        "--advertise-host=127.0.0.1".into(),
    ]);
    podman.run(&strs(&args), Duration::from_secs(60))?;
    podman.wait_for_log(
        &name,
        "jumpstarter-controller ready:",
        Duration::from_secs(60),
    )?;
    podman.check_confined(&name)?;
    println!(
        "   {controller_image}: serving on 127.0.0.1:{grpc} with --store kubernetes: {:.1}s",
        t.elapsed().as_secs_f64()
    );

    // 2. The router, from the Secrets the controller wrote.
    let t = Instant::now();
    let wait = Duration::from_secs(30);
    write_readable(
        &tls.join("tls.crt"),
        secret_key("jumpstarter-router-tls", "tls.crt", wait)?.as_bytes(),
    )?;
    write_readable(
        &tls.join("tls.key"),
        secret_key("jumpstarter-router-tls", "tls.key", wait)?.as_bytes(),
    )?;
    let router_key = secret_key("jumpstarter-controller-keys", "router-key", wait)?;
    let name = format!("{PREFIX}router");
    containers.names.push(name.clone());
    let mut args: Vec<String> = vec!["run".into(), "--detach".into(), format!("--name={name}")];
    args.extend(CONFINED.iter().map(|s| s.to_string()));
    args.extend([
        format!("--volume={}:/etc/jumpstarter/tls:ro", tls.display()),
        format!("--env=ROUTER_LISTEN=127.0.0.1:{router}"),
        "--env=EXTERNAL_CERT_PEM=/etc/jumpstarter/tls/tls.crt".into(),
        "--env=EXTERNAL_KEY_PEM=/etc/jumpstarter/tls/tls.key".into(),
        // The key from podman's environment, not its command line.
        "--env=ROUTER_KEY".into(),
        format!("--env=ROUTER_METRICS_LISTEN=127.0.0.1:{router_metrics}"),
        "--env=RUST_LOG=info".into(),
        router_image.clone(),
    ]);
    let mut cmd = podman.command(&strs(&args));
    cmd.env("ROUTER_KEY", router_key.trim());
    podman.run_cmd(cmd, Duration::from_secs(60))?;
    podman.wait_for_log(&name, "Router listening on", Duration::from_secs(60))?;
    podman.check_confined(&name)?;
    println!(
        "   {router_image}: listening on 127.0.0.1:{router} with the Secrets the controller \
         wrote: {:.1}s",
        t.elapsed().as_secs_f64()
    );

    // 3. jmp: the admin config from the key Secret, an exporter and a client.
    let t = Instant::now();
    let ca = kube::kubectl(&[
        KUBECTL_TIMEOUT,
        "get",
        "secret",
        "jumpstarter-controller-keys",
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.data.ca\\.crt}",
    ])?;
    let token = secret_key("jumpstarter-controller-keys", "admin-token", wait)?;
    let admin = home.join("admin.yaml");
    std::fs::write(
        &admin,
        format!(
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: AdminConfig\nendpoint: \
             127.0.0.1:{grpc}\ntls:\n  ca: {}\n  insecure: false\ntoken: {}\n",
            ca.trim(),
            token.trim()
        ),
    )?;
    std::os::unix::fs::chown(&admin, Some(NONROOT), Some(NONROOT))?;
    std::fs::set_permissions(&admin, std::fs::Permissions::from_mode(0o600))?;
    let jmp = |name: &str, detach: bool, entrypoint: Option<&str>, rest: &[&str]| {
        let mut args: Vec<String> = vec!["run".into(), format!("--name={name}")];
        args.push(if detach { "--detach" } else { "--rm" }.into());
        args.extend(CONFINED.iter().map(|s| s.to_string()));
        args.extend([
            format!("--volume={}:/home/nonroot", home.display()),
            "--env=JMP_ADMIN_CONFIG=/home/nonroot/admin.yaml".into(),
            "--env=RUST_LOG=info".into(),
        ]);
        if let Some(e) = entrypoint {
            args.push(format!("--entrypoint={e}"));
        }
        args.push(jmp_image.clone());
        args.extend(rest.iter().map(|s| s.to_string()));
        args
    };
    let admin_name = format!("{PREFIX}admin");
    for (kind, object, extra) in [
        ("exporter", EXPORTER, &["-l", "board=images"][..]),
        ("client", CLIENT, &["--unsafe"][..]),
    ] {
        let out = format!("/home/nonroot/{kind}.yaml");
        let args = jmp(
            &admin_name,
            false,
            None,
            &[
                &["admin", "create", kind, "-n", NAMESPACE, object],
                extra,
                &["--nointeractive", "--out", &out],
            ]
            .concat(),
        );
        podman
            .run(&strs(&args), Duration::from_secs(60))
            .with_context(|| format!("jmp admin create {kind} from {jmp_image}"))?;
    }
    let exporter_config = home.join("exporter.yaml");
    let text = std::fs::read_to_string(&exporter_config)?;
    ensure!(
        text.contains("\nexport:\n"),
        "{} has no export section:\n{text}",
        exporter_config.display()
    );
    std::fs::write(
        &exporter_config,
        text.replace(
            "\nexport:\n",
            "\nexport:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n",
        ),
    )?;
    let name = format!("{PREFIX}exporter");
    containers.names.push(name.clone());
    let args = jmp(
        &name,
        true,
        None,
        &["run", "--exporter-config", "/home/nonroot/exporter.yaml"],
    );
    podman.run(&strs(&args), Duration::from_secs(60))?;
    podman.wait_for_log(&name, "registered with controller", Duration::from_secs(60))?;
    podman.check_confined(&name)?;
    println!(
        "   {jmp_image}: jmp admin create exporter|client, jmp run registered: {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    let client = format!("{PREFIX}client");
    containers.names.push(client.clone());
    let script = "jmp shell --client-config /home/nonroot/client.yaml -l board=images -- \
                  sh -c 'j power on && j power off'";
    let args = jmp(&client, false, Some("/bin/sh"), &["-c", script]);
    podman
        .run(&strs(&args), Duration::from_secs(120))
        .context("jmp shell from the jmp image")?;
    podman.wait_for_log(&name, "power on", Duration::from_secs(10))?;
    podman.wait_for_log(&name, "power off", Duration::from_secs(10))?;
    let metrics = scrape(router_metrics)?;
    let tunnels = counter(&metrics, "jumpstarter_router_tunnels_total").unwrap_or(0);
    ensure!(
        tunnels > 0,
        "the session did not go through the router's container \
         (jumpstarter_router_tunnels_total {tunnels}):\n{metrics}"
    );
    println!(
        "   {jmp_image}: jmp shell -- j power on, j power off through the router container \
         ({tunnels} tunnels): {:.1}s",
        t.elapsed().as_secs_f64()
    );
    drop(containers);
    for reference in &refs {
        // The next build's binaries make new layers: keep the store small.
        let _ = podman.run(&["rmi", "--force", reference], Duration::from_secs(60));
    }
    // The configs and keys of a throw-away cluster; kept after a failure, to look at.
    std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    println!(
        "== the images ran under podman (runc): {:.1}s in all",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_from_prometheus_text() {
        let text = "# TYPE jumpstarter_router_tunnels_total counter\n\
                    jumpstarter_router_tunnels_total 3\n\
                    jumpstarter_router_tunnels_total_x 9\n";
        assert_eq!(counter(text, "jumpstarter_router_tunnels_total"), Some(3));
        assert_eq!(counter(text, "jumpstarter_router_pairs"), None);
    }
}
