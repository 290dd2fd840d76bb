//! `cargo xtask go-controller [--reuse]`: upstream's 0.9.0 Go controller and router, driven
//! by our exporter and our `jmp`/`j`.
//!
//! The source is upstream's release archive (`../shared/upstream/jumpstarter-controller-
//! 0.9.0.tar.gz`, beside the checkout); it is built once and cached under
//! [`crate::cache_root`] with the Go caches of the API server's build. One change is made to
//! it before the build: the controller, its router and its dashboard listen on hard-coded
//! ports of every interface (`:8082`, `:8083`, `:8084`); the build binds them to 127.0.0.1
//! instead, so that a test never listens beyond loopback. The ports stay fixed (upstream has
//! no option for them): the scenario checks they are free first and says which is taken.
//!
//! The scenario runs against the API server of `cargo xtask kube-up` (started for the run,
//! or the running one with `--reuse`), with upstream's CRDs applied over ours for its
//! duration (ours are applied again at the end, also on failure). Objects are made as
//! upstream's users make them, with `kubectl` (upstream's controller has no admin API; our
//! `jmp admin` talks to ours), and the credentials come from the Secrets upstream's
//! controller writes. Then our `jmp run` serves MockPower and MockStorageMux through it, and
//! our `jmp` and `j` go through the rows of [`MATRIX`]; every row is run, the table printed,
//! and the run fails if any row failed.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    kube,
    procs::{self, Background},
};

/// Upstream's release this builds.
pub const VERSION: &str = "0.9.0";
/// The namespace upstream's controller watches (it serves one namespace only).
const NAMESPACE: &str = "jumpstarter-go";
/// How long one `jmp`/`j` command may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// The label our exporter carries and the client selects by.
const SELECTOR: &str = "board=go-interop";

/// Where upstream binds on every interface, and what the build binds instead: (file, from,
/// to). Each must match exactly once, so a changed source fails the build loudly.
const LOOPBACK_PATCHES: [(&str, &str, &str); 3] = [
    (
        "internal/service/controller_service.go",
        "tls.Listen(\"tcp\", \":8082\"",
        "tls.Listen(\"tcp\", \"127.0.0.1:8082\"",
    ),
    (
        "internal/service/router_service.go",
        "net.Listen(\"tcp\", \":8083\")",
        "net.Listen(\"tcp\", \"127.0.0.1:8083\")",
    ),
    (
        "internal/service/dashboard_service.go",
        "r.Run(\":8084\")",
        "r.Run(\"127.0.0.1:8084\")",
    ),
];

/// The fixed ports upstream's processes listen on (the OIDC issuer's 8085 was loopback
/// already; the login service's port comes from `LOGIN_SERVICE_PORT`).
const PORTS: [(u16, &str); 5] = [
    (8082, "the controller's gRPC"),
    (8083, "the router"),
    (8084, "the dashboard"),
    (8085, "the internal OIDC issuer"),
    (8086, "the login service"),
];

/// What the scenario checks, in order: (row, what a user types).
pub const MATRIX: [(&str, &str); 9] = [
    (
        "register",
        "jmp run (our exporter) registers; jmp get exporters lists it",
    ),
    ("online", "the exporter reported online"),
    (
        "create lease",
        "jmp create lease -l SEL --duration 5m -o name",
    ),
    ("get leases", "jmp get leases lists it"),
    ("shell --lease", "jmp shell --lease NAME -- j power on"),
    (
        "delete lease",
        "jmp delete lease NAME; jmp get leases no longer lists it",
    ),
    (
        "shell -l",
        "jmp shell -l SEL -- j power on (a lease made and released)",
    ),
    ("exit code", "jmp shell -l SEL -- sh -c 'exit 3' exits 3"),
    (
        "storage",
        "j storage write-local-file, then read-local-file gives the same bytes",
    ),
];

/// The built controller and router.
pub struct Binaries {
    /// `cmd/` of upstream's source.
    pub controller: PathBuf,
    /// `cmd/router/`.
    pub router: PathBuf,
}

/// The archive of upstream's source, beside the checkout.
fn archive() -> PathBuf {
    let root = crate::workspace_root();
    root.parent().unwrap_or(&root).join(format!(
        "shared/upstream/jumpstarter-controller-{VERSION}.tar.gz"
    ))
}

/// Builds upstream's controller and router once (cached by the archive's and the patches'
/// hash); returns where they are.
pub fn ensure_binaries() -> Result<Binaries> {
    let archive = archive();
    let bytes = std::fs::read(&archive).with_context(|| {
        format!(
            "reading upstream's controller source {} (it sits in ../shared beside the checkout)",
            archive.display()
        )
    })?;
    let recipe = format!("{}{LOOPBACK_PATCHES:?}", sha256_hex(&bytes));
    let dir = crate::cache_root().join("go-controller").join(format!(
        "{VERSION}-{}",
        crate::workspace::short_hash(&recipe)
    ));
    let bins = Binaries {
        controller: dir.join("bin/jumpstarter-controller"),
        router: dir.join("bin/jumpstarter-router"),
    };
    if bins.controller.is_file() && bins.router.is_file() {
        return Ok(bins);
    }
    let src = dir.join("src");
    if src.exists() {
        std::fs::remove_dir_all(&src).with_context(|| format!("clearing {}", src.display()))?;
    }
    std::fs::create_dir_all(&src)?;
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg("--strip-components=1")
        .status()
        .context("running tar")?;
    ensure!(status.success(), "tar -xzf {} failed", archive.display());
    for (file, from, to) in LOOPBACK_PATCHES {
        let path = src.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        ensure!(
            text.matches(from).count() == 1,
            "{file} of upstream's controller does not contain {from:?} exactly once: \
             the loopback patch no longer applies"
        );
        std::fs::write(&path, text.replacen(from, to, 1))?;
    }
    for (package, output) in [("./cmd", &bins.controller), ("./cmd/router", &bins.router)] {
        println!(
            "== go build {package} of upstream's controller {VERSION} (cold: minutes; cached in {})",
            dir.display()
        );
        let t = Instant::now();
        let tmp = output.with_extension("partial");
        let status = kube::go_command()
            .args([
                "build",
                "-p",
                "2",
                "-trimpath",
                "-buildvcs=false",
                "-ldflags=-s -w",
            ])
            .arg("-o")
            .arg(&tmp)
            .arg(package)
            .current_dir(&src)
            .stdin(Stdio::null())
            .status()
            .context("running go build")?;
        ensure!(status.success(), "go build {package} failed ({status})");
        std::fs::rename(&tmp, output)?;
        println!("   built in {:.0}s", t.elapsed().as_secs_f64());
    }
    Ok(bins)
}

/// The SHA-256 of `bytes`, in hex.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `cargo xtask go-controller [--reuse]`.
pub fn run(args: &[String]) -> Result<()> {
    let reuse = match args {
        [] => false,
        [a] if a == "--reuse" => true,
        _ => bail!("usage: cargo xtask go-controller [--reuse]"),
    };
    let cluster = if reuse {
        kube::running()?;
        None
    } else {
        Some(kube::up()?)
    };
    let result = scenario(&crate::debug_build()?);
    drop(cluster);
    let rows = result?;
    print_matrix(&rows);
    let failed = rows.iter().filter(|r| r.1.is_err()).count();
    ensure!(
        failed == 0,
        "{failed} of {} rows failed against upstream's Go controller",
        rows.len()
    );
    Ok(())
}

/// One row's outcome: (row name, Ok or the reason it failed).
pub type Row = (&'static str, Result<(), String>);

/// Prints the matrix: each row, what it runs, and its outcome.
pub fn print_matrix(rows: &[Row]) {
    println!("== our exporter and jmp against upstream's Go controller {VERSION}");
    for ((name, outcome), (_, what)) in rows.iter().zip(MATRIX) {
        match outcome {
            Ok(()) => println!("   ok    {name:<14} {what}"),
            Err(e) => println!("   FAIL  {name:<14} {what}\n         {e}"),
        }
    }
}

/// Runs the scenario on the running cluster with the binaries of `bin`; upstream's CRDs are
/// replaced by ours again at the end. Returns every row (an Err only when the set-up fails).
pub fn scenario(bin: &Path) -> Result<Vec<Row>> {
    let go = ensure_binaries()?;
    for (port, what) in PORTS {
        std::net::TcpListener::bind(("127.0.0.1", port)).with_context(|| {
            format!(
                "127.0.0.1:{port} ({what} of upstream's controller, a fixed port) is taken: \
                 stop what listens there"
            )
        })?;
    }
    let crds = upstream_crds()?;
    let result = with_upstream_crds(&crds, || run_rows(bin, &go));
    let restored = kube::install_crds().context("applying our CRDs again");
    let rows = result?;
    restored?;
    Ok(rows)
}

/// Upstream's CRD files, from its source in the cache.
fn upstream_crds() -> Result<Vec<PathBuf>> {
    let go = ensure_binaries()?;
    let dir = go
        .controller
        .parent()
        .and_then(Path::parent)
        .context("no cache directory")?
        .join("src/deploy/operator/config/crd/bases");
    let files: Vec<PathBuf> = ["clients", "exporters", "leases", "exporteraccesspolicies"]
        .iter()
        .map(|k| dir.join(format!("jumpstarter.dev_{k}.yaml")))
        .collect();
    for f in &files {
        ensure!(f.is_file(), "upstream's CRD {} is missing", f.display());
    }
    Ok(files)
}

/// Applies `crds` (over ours: same names and group), then runs `f`.
fn with_upstream_crds<T>(crds: &[PathBuf], f: impl FnOnce() -> Result<T>) -> Result<T> {
    for c in crds {
        let path = c.display().to_string();
        kube::kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=jumpstarter-xtask",
            "-f",
            &path,
        ])?;
    }
    kube::kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=60s",
    ])?;
    f()
}

/// The objects and ConfigMap upstream's controller needs, in a namespace of its own,
/// emptied of what an earlier run left.
fn prepare_namespace() -> Result<()> {
    kube::kubectl_input(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n"
        )),
    )?;
    kube::kubectl(&[
        "delete",
        "-n",
        NAMESPACE,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=60s",
        "leases.jumpstarter.dev,exporters.jumpstarter.dev,clients.jumpstarter.dev,secrets,configmaps",
        "--all",
    ])?;
    // Upstream's layout: `router` lists the routers, `config` the settings (strict YAML).
    kube::kubectl_input(
        &["apply", "-n", NAMESPACE, "-f", "-"],
        Some(
            "apiVersion: v1
kind: ConfigMap
metadata:
  name: jumpstarter-controller
data:
  config: |
    authentication:
      internal:
        prefix: \"internal:\"
    provisioning:
      enabled: false
    grpc:
      keepalive:
        minTime: 1s
        permitWithoutStream: true
  router: |
    default:
      endpoint: 127.0.0.1:8083
",
        ),
    )?;
    Ok(())
}

/// Upstream's router and controller, as its Deployment runs them, on loopback.
fn start_upstream(go: &Binaries) -> Result<(Background, Background)> {
    let key = |name: &str| format!("go-interop-{name}-{}", std::process::id());
    let env = |c: &mut Command| {
        c.env("KUBECONFIG", kube::admin_kubeconfig())
            .env("NAMESPACE", NAMESPACE)
            .env("ROUTER_KEY", key("router"))
            .env("CONTROLLER_KEY", key("controller"))
            .env("GRPC_ENDPOINT", "127.0.0.1:8082")
            .env("GRPC_ROUTER_ENDPOINT", "127.0.0.1:8083")
            .env("LOGIN_SERVICE_PORT", "127.0.0.1:8086");
    };
    let mut router = Command::new(&go.router);
    env(&mut router);
    let router = Background::start("upstream's router", router)?;
    let mut controller = Command::new(&go.controller);
    env(&mut controller);
    controller.args([
        "--health-probe-bind-address=0",
        "--metrics-bind-address=0",
        "--leader-elect=false",
    ]);
    let controller = Background::start("upstream's controller", controller)?;
    for port in [8082, 8083] {
        procs::wait_port(port, Duration::from_secs(60)).with_context(|| {
            format!("upstream's controller or router did not listen on 127.0.0.1:{port}")
        })?;
    }
    Ok((router, controller))
}

/// Creates `kind` (Client or Exporter) `name` with `labels` as a user of upstream does
/// (`kubectl apply`), waits for the Secret its controller writes, and returns the token.
fn create_with_credential(kind: &str, name: &str, labels: &str) -> Result<String> {
    kube::kubectl_input(
        &["apply", "-n", NAMESPACE, "-f", "-"],
        Some(&format!(
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}\n  \
             labels: {labels}\nspec: {{}}\n"
        )),
    )?;
    let resource = format!("{}.jumpstarter.dev/{name}", kind.to_lowercase());
    let deadline = Instant::now() + Duration::from_secs(60);
    let secret = loop {
        let s = kube::kubectl(&[
            "get",
            "-n",
            NAMESPACE,
            &resource,
            "-o",
            "jsonpath={.status.credential.name}",
        ])?;
        if !s.trim().is_empty() {
            break s.trim().to_string();
        }
        ensure!(
            Instant::now() < deadline,
            "upstream's controller gave {kind} {name} no credential within 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let token = kube::kubectl(&[
        "get",
        "-n",
        NAMESPACE,
        "secret",
        &secret,
        "-o",
        "go-template={{.data.token | base64decode}}",
    ])?;
    ensure!(!token.trim().is_empty(), "Secret {secret} holds no token");
    Ok(token.trim().to_string())
}

/// A config of `kind` (ClientConfig or ExporterConfig) for upstream's controller: its
/// self-signed certificate is not checked (as upstream's own `--insecure-tls` configs do).
fn config_text(kind: &str, name: &str, token: &str, rest: &str) -> String {
    format!(
        "apiVersion: jumpstarter.dev/v1alpha1
kind: {kind}
metadata:
  namespace: {NAMESPACE}
  name: {name}
endpoint: 127.0.0.1:8082
tls:
  ca: \"\"
  insecure: true
token: {token}
{rest}"
    )
}

/// The lab on upstream's controller: our exporter, our client config, a scratch directory.
struct Lab {
    bin: PathBuf,
    work: crate::interop::tempfile_dir::Dir,
    client: PathBuf,
}

impl Lab {
    /// Our `jmp` (or `j`) with this lab's config home.
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(self.bin.join(program));
        c.env("JMP_CLIENT_CONFIG_HOME", self.work.path().join("config"))
            .env("PATH", path_with(&self.bin))
            .env_remove("JUMPSTARTER_HOST")
            .env_remove("JMP_CLIENT_CONFIG")
            .current_dir(self.work.path());
        c
    }

    /// `jmp ARGS... --client-config CLIENT` (the flag after the subcommand's own args).
    fn jmp(&self, args: &[&str]) -> Result<procs::Output> {
        let mut c = self.command("jmp");
        c.args(args).arg("--client-config").arg(&self.client);
        procs::run(c, CALL_TIMEOUT)
    }

    /// [`Lab::jmp`] that must exit 0; its stdout.
    fn jmp_ok(&self, args: &[&str]) -> Result<String, String> {
        let out = self.jmp(args).map_err(|e| format!("{e:#}"))?;
        if out.code != 0 {
            return Err(format!(
                "jmp {} exited {}: {}",
                args.join(" "),
                out.code,
                out.stderr.trim()
            ));
        }
        Ok(out.stdout)
    }

    /// `jmp shell SHELL_ARGS --client-config CLIENT -- COMMAND...`.
    fn shell(&self, shell_args: &[&str], command: &[&str]) -> Result<procs::Output> {
        let mut c = self.command("jmp");
        c.arg("shell")
            .args(shell_args)
            .arg("--client-config")
            .arg(&self.client)
            .arg("--")
            .args(command);
        procs::run(c, CALL_TIMEOUT)
    }
}

/// `bin` first on `PATH` (so `jmp shell` runs our `j`).
fn path_with(bin: &Path) -> String {
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Each row of [`MATRIX`], in order; a row whose precondition failed fails with that reason.
fn run_rows(bin: &Path, go: &Binaries) -> Result<Vec<Row>> {
    prepare_namespace()?;
    let (_router, _controller) = start_upstream(go)?;
    let exporter_token = create_with_credential(
        "Exporter",
        "go-exporter",
        &format!(
            "{{board: {}}}",
            SELECTOR.split('=').nth(1).unwrap_or_default()
        ),
    )?;
    let client_token = create_with_credential("Client", "go-client", "{}")?;
    let work = crate::interop::tempfile_dir::Dir::new("go-controller")?;
    let exporter_config = work.path().join("exporter.yaml");
    std::fs::write(
        &exporter_config,
        config_text(
            "ExporterConfig",
            "go-exporter",
            &exporter_token,
            crate::quickstart::EXPORT,
        ),
    )?;
    let client = work.path().join("client.yaml");
    std::fs::write(
        &client,
        config_text(
            "ClientConfig",
            "go-client",
            &client_token,
            "drivers:\n  allow: []\n  unsafe: true\n",
        ),
    )?;
    let lab = Lab {
        bin: bin.to_path_buf(),
        work,
        client,
    };
    let mut run = lab.command("jmp");
    run.arg("run")
        .arg("--exporter-config")
        .arg(&exporter_config)
        .env("RUST_LOG", "info");
    let mut exporter = Background::start("jmp run", run)?;

    let mut rows: Vec<Row> = Vec::new();
    let registered = wait_listed(&lab, "go-exporter");
    let registered_ok = registered.is_ok();
    rows.push(("register", registered.map(|_| ())));
    let online = if registered_ok {
        wait_online(&lab)
    } else {
        Err("not registered".into())
    };
    if online.is_err() {
        let said: Vec<String> = exporter.lines.try_iter().collect();
        eprintln!("our exporter printed:\n{}", said.join("\n"));
    }
    rows.push(("online", online));

    let lease = lab
        .jmp_ok(&[
            "create",
            "lease",
            "-l",
            SELECTOR,
            "--duration",
            "5m",
            "-o",
            "name",
        ])
        .and_then(|out| {
            let name = out.trim().rsplit('/').next().unwrap_or("").to_string();
            if name.is_empty() {
                Err(format!("no lease name printed: {out:?}"))
            } else {
                Ok(name)
            }
        });
    rows.push((
        "create lease",
        lease.as_ref().map(|_| ()).map_err(Clone::clone),
    ));
    let listed = lease.clone().and_then(|name| {
        let out = lab.jmp_ok(&["get", "leases", "-o", "name"])?;
        if out.contains(&name) {
            Ok(())
        } else {
            Err(format!("lease {name} not in jmp get leases: {out:?}"))
        }
    });
    rows.push(("get leases", listed));
    let by_lease = lease
        .clone()
        .and_then(|name| exit_code_of(lab.shell(&["--lease", &name], &["j", "power", "on"]), 0));
    rows.push(("shell --lease", by_lease));
    let deleted = lease.and_then(|name| {
        lab.jmp_ok(&["delete", "lease", &name])?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = lab.jmp_ok(&["get", "leases", "-o", "name"])?;
            if !out.contains(&name) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "lease {name} still listed 30 s after delete: {out:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    rows.push(("delete lease", deleted));
    rows.push((
        "shell -l",
        exit_code_of(lab.shell(&["-l", SELECTOR], &["j", "power", "on"]), 0),
    ));
    rows.push((
        "exit code",
        exit_code_of(lab.shell(&["-l", SELECTOR], &["sh", "-c", "exit 3"]), 3),
    ));
    rows.push(("storage", storage_round_trip(&lab)));
    exporter.stop();
    Ok(rows)
}

/// Ok when `out` ran and exited `want`.
fn exit_code_of(out: Result<procs::Output>, want: i32) -> Result<(), String> {
    let out = out.map_err(|e| format!("{e:#}"))?;
    if out.code == want {
        Ok(())
    } else {
        Err(format!(
            "exited {} (want {want}): {}",
            out.code,
            out.stderr.trim()
        ))
    }
}

/// Waits until `jmp get exporters -o name` lists `name`.
fn wait_listed(lab: &Lab, name: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = lab.jmp_ok(&["get", "exporters", "-o", "name"]);
        if let Ok(text) = &out
            && text.contains(name)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{name} not listed within 60 s: {out:?}"));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Waits until the exporter is shown online.
fn wait_online(lab: &Lab) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = lab.jmp_ok(&["get", "exporters", "--with", "online", "-o", "json"]);
        if let Ok(text) = &out
            && text.contains("\"online\": true")
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("not online within 60 s: {out:?}"));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Writes 4 MiB to the mock storage and reads them back, in one `jmp shell -l`.
fn storage_round_trip(lab: &Lab) -> Result<(), String> {
    let dir = lab.work.path();
    let src = dir.join("image.bin");
    let back = dir.join("back.bin");
    let data: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let script = format!(
        "j storage write-local-file {} && j storage read-local-file {}",
        src.display(),
        back.display()
    );
    exit_code_of(lab.shell(&["-l", SELECTOR], &["sh", "-c", &script]), 0)?;
    let got = std::fs::read(&back).map_err(|e| format!("reading {}: {e}", back.display()))?;
    if got == data {
        Ok(())
    } else {
        Err(format!(
            "read back {} bytes that differ from the {} written",
            got.len(),
            data.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_of_the_matrix_has_a_distinct_name() {
        let mut names: Vec<&str> = MATRIX.iter().map(|r| r.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), MATRIX.len());
    }

    #[test]
    fn configs_name_the_namespace_endpoint_and_token() {
        let text = config_text("ClientConfig", "c", "tok", "drivers: {}\n");
        assert!(text.contains("namespace: jumpstarter-go\n"), "{text}");
        assert!(text.contains("endpoint: 127.0.0.1:8082\n"), "{text}");
        assert!(text.contains("token: tok\n"), "{text}");
        assert!(text.ends_with("drivers: {}\n"), "{text}");
    }
}
