//! `cargo xtask kube-up | kube-down`: a real Kubernetes API server (and its etcd) on loopback.
//!
//! `kube-apiserver` is built from the Go module `k8s.io/kubernetes` ([`K8S_VERSION`], every
//! `k8s.io/*` staging module pinned to [`STAGING_VERSION`] by `replace`) and `etcd` from
//! `go.etcd.io/etcd/server/v3` ([`ETCD_VERSION`]), once, into a cache directory outside the
//! clone keyed by both versions ([`bin_dir`]). `kube-up` then generates a CA, serving and
//! client certificates and a service-account signing key (`openssl`), starts etcd and the API
//! server on 127.0.0.1 with RBAC on, writes an admin kubeconfig, installs our CRDs, the
//! `jumpstarter` namespace and the controller's ServiceAccount/ClusterRole/binding from
//! `deploy/kubernetes/base`, and writes a second kubeconfig that authenticates as that
//! ServiceAccount (a token from the TokenRequest API). Each step prints its time.
//!
//! The processes run in the background (their ids in the state directory, [`state_dir`])
//! until `kube-down`; a failed `kube-up` stops what it started. `kubectl` must be on `PATH`.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::procs::free_port;

/// The Kubernetes release the API server is built from.
pub const K8S_VERSION: &str = "v1.34.3";
/// The staging modules (`k8s.io/api`, `k8s.io/apiserver`, ...) matching [`K8S_VERSION`].
pub const STAGING_VERSION: &str = "v0.34.3";
/// The etcd release.
pub const ETCD_VERSION: &str = "v3.6.16";
/// The Go version the build modules declare (the installed toolchain must be at least this).
const GO_DIRECTIVE: &str = "1.24.0";
/// The namespace the controller's ServiceAccount lives in (as in `deploy/kubernetes/base`).
pub const NAMESPACE: &str = "jumpstarter";

/// `~/.cache/jumpstarter-rs/kube` (see [`crate::cache_root`]).
fn cache_root() -> PathBuf {
    crate::cache_root().join("kube")
}

/// Where the built binaries of this version pair are kept.
pub fn bin_dir() -> PathBuf {
    cache_root()
        .join(format!("k8s-{K8S_VERSION}-etcd-{ETCD_VERSION}"))
        .join("bin")
}

/// The running cluster's files: certificates, kubeconfigs, etcd data, logs, process ids.
pub fn state_dir() -> PathBuf {
    cache_root().join("cluster")
}

/// The admin kubeconfig of a running `kube-up` cluster.
pub fn admin_kubeconfig() -> PathBuf {
    state_dir().join("admin.kubeconfig")
}

/// The kubeconfig that authenticates as the controller's ServiceAccount.
pub fn controller_kubeconfig() -> PathBuf {
    state_dir().join("controller.kubeconfig")
}

/// Prints how long a step took.
fn step<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let t = Instant::now();
    let out = f().with_context(|| format!("kube-up: {name}"))?;
    println!("   {name}: {:.1}s", t.elapsed().as_secs_f64());
    Ok(out)
}

/// `cargo xtask kube-up`.
pub fn run_up() -> Result<()> {
    let port = up()?.keep();
    println!(
        "cluster up at https://127.0.0.1:{}\n  export KUBECONFIG={}\n  \
         (the controller's ServiceAccount: {}); stop it with cargo xtask kube-down",
        port,
        admin_kubeconfig().display(),
        controller_kubeconfig().display()
    );
    Ok(())
}

/// `cargo xtask kube-down`.
pub fn run_down() -> Result<()> {
    down()
}

/// A started cluster; stopped when dropped unless [`Cluster::keep`] was called.
pub struct Cluster {
    /// The API server's secure port on 127.0.0.1.
    pub port: u16,
    armed: bool,
}

impl Cluster {
    /// Leaves the processes running (for `kube-down`); returns the API server's port.
    fn keep(mut self) -> u16 {
        self.armed = false;
        self.port
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = down()
        {
            eprintln!("kube-down: {e:#}");
        }
    }
}

/// The `[--reuse] [--no-build]` arguments of a suite run on the `kube-up` cluster (`task`
/// names it in the usage line): the cluster it started (`None` with `--reuse`: the running
/// one, checked) and the directory of the binaries (built unless `--no-build`).
pub fn suite_setup(task: &str, args: &[String]) -> Result<(Option<Cluster>, PathBuf)> {
    let (mut reuse, mut build) = (false, true);
    for a in args {
        match a.as_str() {
            "--reuse" => reuse = true,
            "--no-build" => build = false,
            _ => bail!("usage: cargo xtask {task} [--reuse] [--no-build]"),
        }
    }
    let cluster = if reuse {
        running()?;
        None
    } else {
        Some(up()?)
    };
    let bins = if build {
        crate::debug_build()?
    } else {
        crate::target_dir().join("debug")
    };
    Ok((cluster, bins))
}

/// Builds what is missing, stops an earlier cluster, starts a fresh one and configures it.
pub fn up() -> Result<Cluster> {
    let total = Instant::now();
    need_tool(
        "kubectl",
        "kubectl is needed to configure the cluster (Debian package kubectl)",
    )?;
    need_tool(
        "openssl",
        "openssl is needed to make the cluster's certificates",
    )?;
    println!("== kube-up: kube-apiserver {K8S_VERSION}, etcd {ETCD_VERSION}");
    let bins = step("binaries (cached)", ensure_binaries)?;
    down()?;
    let dir = state_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // From here on a failure stops what was started.
    let mut cluster = Cluster {
        port: 0,
        armed: true,
    };
    step("certificates and keys", || make_certs(&dir))?;
    let etcd_port = step("etcd", || start_etcd(&bins, &dir))?;
    cluster.port = free_port()?;
    step("kube-apiserver ready", || {
        start_apiserver(&bins, &dir, etcd_port, cluster.port)
    })?;
    step("CRDs installed and established", install_crds)?;
    step("namespace, ServiceAccount and RBAC", || {
        install_rbac(cluster.port)
    })?;
    println!("== kube-up: {:.1}s in all", total.elapsed().as_secs_f64());
    Ok(cluster)
}

/// Checks that the cluster of an earlier `kube-up` still runs and answers.
pub fn running() -> Result<()> {
    ensure!(
        admin_kubeconfig().is_file() && controller_kubeconfig().is_file(),
        "no cluster: {} is missing (start one with cargo xtask kube-up)",
        admin_kubeconfig().display()
    );
    let ready = kubectl(&["get", "--raw=/readyz"])
        .context("the kube-up cluster does not answer (restart it with cargo xtask kube-up)")?;
    ensure!(
        ready.trim() == "ok",
        "the kube-up cluster is not ready: {ready}"
    );
    Ok(())
}

fn need_tool(tool: &str, why: &str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    ensure!(found, "{tool} not found on PATH: {why}");
    Ok(())
}

/// The binaries of the cluster.
pub struct Binaries {
    etcd: PathBuf,
    apiserver: PathBuf,
    /// kube-controller-manager, of the same Kubernetes build: `cargo xtask kube-rollout`
    /// runs its Deployment and ReplicaSet controllers.
    pub controller_manager: PathBuf,
}

/// Builds etcd, kube-apiserver and kube-controller-manager with `go` unless the cache has
/// them (the last shares most of its packages with the API server: a minute or two more).
pub fn ensure_binaries() -> Result<Binaries> {
    let bin = bin_dir();
    let bins = Binaries {
        etcd: bin.join("etcd"),
        apiserver: bin.join("kube-apiserver"),
        controller_manager: bin.join("kube-controller-manager"),
    };
    let src = bin.parent().context("the cache directory has no parent")?;
    if !bins.etcd.is_file() {
        go_build(
            &src.join("src-etcd"),
            &format!("require go.etcd.io/etcd/server/v3 {ETCD_VERSION}\n"),
            "go.etcd.io/etcd/server/v3",
            &bins.etcd,
        )?;
    }
    if !bins.apiserver.is_file() {
        go_build(
            &src.join("src-k8s"),
            &k8s_requirements()?,
            "k8s.io/kubernetes/cmd/kube-apiserver",
            &bins.apiserver,
        )?;
    }
    if !bins.controller_manager.is_file() {
        go_build(
            &src.join("src-k8s"),
            &k8s_requirements()?,
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            &bins.controller_manager,
        )?;
    }
    Ok(bins)
}

/// `require k8s.io/kubernetes` and a `replace` of every staging module that its go.mod
/// points at `./staging/...` (which a module consumer cannot see) by the released version.
fn k8s_requirements() -> Result<String> {
    need_tool("go", "Go builds the Kubernetes API server and etcd")?;
    let out = go_command()
        .args(["mod", "download", "-json"])
        .arg(format!("k8s.io/kubernetes@{K8S_VERSION}"))
        .output()
        .context("running go mod download (is Go installed?)")?;
    ensure!(
        out.status.success(),
        "go mod download k8s.io/kubernetes@{K8S_VERSION} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let json = String::from_utf8_lossy(&out.stdout);
    let gomod = json
        .lines()
        .find_map(|l| l.trim().strip_prefix("\"GoMod\": \""))
        .and_then(|rest| rest.strip_suffix("\","))
        .context("go mod download printed no GoMod path")?;
    let text = std::fs::read_to_string(gomod).with_context(|| format!("reading {gomod}"))?;
    let mut out = format!("require k8s.io/kubernetes {K8S_VERSION}\n\nreplace (\n");
    let mut n = 0;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if let (Some(module), Some("=>"), Some(target)) = (words.next(), words.next(), words.next())
            && module.starts_with("k8s.io/")
            && target.starts_with("./staging/")
        {
            out.push_str(&format!("\t{module} => {module} {STAGING_VERSION}\n"));
            n += 1;
        }
    }
    ensure!(
        n > 0,
        "{gomod} replaces no staging module: unexpected layout"
    );
    out.push_str(")\n");
    Ok(out)
}

/// The Go module and build caches of both builds, shared between them and kept with the
/// binaries (outside the user's own Go caches, so CI can keep or drop them as one directory).
fn go_cache_env() -> [(&'static str, PathBuf); 2] {
    let go = cache_root().join("go");
    [
        ("GOMODCACHE", go.join("mod")),
        ("GOCACHE", go.join("build")),
    ]
}

/// What a build of `package` needs beyond the defaults: no cgo (static binaries, no C
/// compiler), no symbol tables or DWARF (`-s -w`: a faster link, a third of the size),
/// `-trimpath`, the in-tree cloud providers left out (`providerless`), and the release version
/// stamped in as Kubernetes' own build does (`/version` and `kubectl version` report it).
fn go_build_args(package: &str) -> Vec<String> {
    let mut ldflags = "-s -w".to_owned();
    if package.starts_with("k8s.io/kubernetes/") {
        let minor = K8S_VERSION.split('.').nth(1).unwrap_or_default();
        for (var, value) in [
            ("gitVersion", K8S_VERSION),
            ("gitMajor", "1"),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
        ] {
            ldflags.push_str(&format!(" -X k8s.io/component-base/version.{var}={value}"));
        }
    }
    [
        "build",
        "-p",
        "2",
        "-trimpath",
        "-tags=providerless",
        "-mod=mod",
        "-buildvcs=false",
    ]
    .map(str::to_owned)
    .into_iter()
    .chain([format!("-ldflags={ldflags}")])
    .collect()
}

/// Writes `dir/go.mod` and builds `package` into `output` ([`go_build_args`]), printing the
/// time it took.
fn go_build(dir: &Path, requirements: &str, package: &str, output: &Path) -> Result<()> {
    need_tool("go", "Go builds the Kubernetes API server and etcd")?;
    std::fs::create_dir_all(dir)?;
    if let Some(parent) = output.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(
        dir.join("go.mod"),
        format!("module jumpstarter-rs/kube-build\n\ngo {GO_DIRECTIVE}\n\n{requirements}"),
    )?;
    println!(
        "== go build {package} (cold build: minutes; cached in {})",
        dir.display()
    );
    let t = Instant::now();
    let tmp = output.with_extension("partial");
    let status = go_command()
        .args(go_build_args(package))
        .arg("-o")
        .arg(&tmp)
        .arg(package)
        .current_dir(dir)
        .stdin(Stdio::null())
        .status()
        .context("running go build")?;
    ensure!(status.success(), "go build {package} failed ({status})");
    std::fs::rename(&tmp, output)?;
    println!(
        "   built {} in {:.0}s",
        output.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `go` with the shared caches, no cgo, the installed toolchain only (no download of another)
/// and no `GOFLAGS` from the environment (the build sets its own flags).
pub fn go_command() -> Command {
    let mut cmd = Command::new("go");
    cmd.envs(go_cache_env())
        .env("CGO_ENABLED", "0")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "");
    cmd
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .context("running openssl")?;
    ensure!(
        out.status.success(),
        "openssl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A key and a certificate signed by the CA: `NAME.key`, `NAME.crt`.
fn signed_cert(dir: &Path, name: &str, subject: &str, ext: &str) -> Result<()> {
    let (key, csr, crt, extfile) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    std::fs::write(dir.join(&extfile), ext)?;
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            subject,
        ],
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "30",
            "-out",
            &crt,
            "-extfile",
            &extfile,
        ],
    )
}

fn make_certs(dir: &Path) -> Result<()> {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "30",
            "-subj",
            "/CN=jumpstarter-kube-ca",
        ],
    )?;
    signed_cert(
        dir,
        "apiserver",
        "/CN=kube-apiserver",
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n\
         extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n",
    )?;
    signed_cert(
        dir,
        "admin",
        "/O=system:masters/CN=kube-admin",
        "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature\n",
    )?;
    openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            "sa.key",
        ],
    )?;
    // The API server verifies tokens with the public half.
    openssl(dir, &["pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"])
}

/// Starts `program` in its own process group with its output in `dir/NAME.log`, and records
/// its id in `dir/NAME.pid`.
fn spawn(dir: &Path, name: &str, program: &Path, args: &[String]) -> Result<u32> {
    use std::os::unix::process::CommandExt;
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let pid = child.id();
    std::fs::write(dir.join(format!("{name}.pid")), pid.to_string())?;
    // Once xtask exits the child is adopted by init; kube-down signals it by id after
    // checking that the id still names this program.
    drop(child);
    Ok(pid)
}

fn log_tail(dir: &Path, name: &str) -> String {
    let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or_default()
            .trim_start()
            .starts_with('Z')
    })
}

fn start_etcd(bins: &Binaries, dir: &Path) -> Result<u16> {
    let (client, peer) = (free_port()?, free_port()?);
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let args = vec![
        "--name=default".to_owned(),
        format!("--data-dir={}", dir.join("etcd-data").display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=default={peer_url}"),
        "--listen-metrics-urls=".to_owned(),
        // A throw-away test cluster: no fsync (much faster on a shared disk).
        "--unsafe-no-fsync".to_owned(),
        "--log-level=warn".to_owned(),
    ];
    let pid = spawn(dir, "etcd", &bins.etcd, &args)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", client)).is_ok() {
            return Ok(client);
        }
        if !alive(pid) {
            bail!("etcd exited:\n{}", log_tail(dir, "etcd"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("etcd did not listen within 30s:\n{}", log_tail(dir, "etcd"))
}

fn kubeconfig(server: &str, dir: &Path, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: jumpstarter-kube\n  cluster:\n    \
         server: {server}\n    certificate-authority: {ca}\ncontexts:\n- name: jumpstarter-kube\n  \
         context:\n    cluster: jumpstarter-kube\n    user: u\n    namespace: default\n\
         current-context: jumpstarter-kube\nusers:\n- name: u\n  user:\n{user}",
        ca = dir.join("ca.crt").display(),
    )
}

fn start_apiserver(bins: &Binaries, dir: &Path, etcd_port: u16, port: u16) -> Result<()> {
    let f = |name: &str| dir.join(name).display().to_string();
    let server = format!("https://127.0.0.1:{port}");
    let args = vec![
        format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
        "--bind-address=127.0.0.1".to_owned(),
        "--advertise-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", f("apiserver-certs")),
        format!("--tls-cert-file={}", f("apiserver.crt")),
        format!("--tls-private-key-file={}", f("apiserver.key")),
        format!("--client-ca-file={}", f("ca.crt")),
        "--authorization-mode=RBAC".to_owned(),
        // Anonymous requests are allowed through authentication; RBAC lets them read only
        // what `system:unauthenticated` is bound to (here the issuer discovery, see
        // `install_rbac`), as a cluster that serves as an OIDC issuer does.
        "--anonymous-auth=true".to_owned(),
        format!("--service-account-issuer={server}"),
        format!("--service-account-key-file={}", f("sa.pub")),
        format!("--service-account-signing-key-file={}", f("sa.key")),
        "--api-audiences=https://kubernetes.default.svc".to_owned(),
        // Only a setting (no traffic goes there): the Service IP range.
        "--service-cluster-ip-range=10.96.0.0/24".to_owned(),
        // The `kubernetes` Service's endpoints would be 127.0.0.1, which Endpoints refuse.
        "--endpoint-reconciler-type=none".to_owned(),
        "--profiling=false".to_owned(),
        "--v=1".to_owned(),
    ];
    let pid = spawn(dir, "kube-apiserver", &bins.apiserver, &args)?;
    std::fs::write(
        admin_kubeconfig(),
        kubeconfig(
            &server,
            dir,
            &format!(
                "    client-certificate: {}\n    client-key: {}\n",
                f("admin.crt"),
                f("admin.key")
            ),
        ),
    )?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = String::new();
    while Instant::now() < deadline {
        if !alive(pid) {
            bail!(
                "kube-apiserver exited:\n{}",
                log_tail(dir, "kube-apiserver")
            );
        }
        match kubectl(&["get", "--raw=/readyz"]) {
            Ok(out) if out.trim() == "ok" => return Ok(()),
            Ok(out) => last = out,
            Err(e) => last = format!("{e:#}"),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!(
        "kube-apiserver not ready within 120s ({last}):\n{}",
        log_tail(dir, "kube-apiserver")
    )
}

/// The service-account issuer of the running cluster (`https://127.0.0.1:PORT`, the API
/// server's own address), from the admin kubeconfig.
pub fn issuer() -> Result<String> {
    let text = std::fs::read_to_string(admin_kubeconfig())
        .with_context(|| format!("reading {}", admin_kubeconfig().display()))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .map(|s| s.trim().to_owned())
        .context("no server in the admin kubeconfig")
}

/// `GET url` without credentials (trusting the cluster's CA); returns the body.
pub fn anonymous_get(url: &str) -> Result<String> {
    let out = Command::new("curl")
        .args([
            "--silent",
            "--show-error",
            "--fail",
            "--max-time",
            "10",
            "--cacert",
        ])
        .arg(state_dir().join("ca.crt"))
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .context("running curl")?;
    ensure!(
        out.status.success(),
        "GET {url} without credentials failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `kubectl` with the admin kubeconfig; returns its stdout.
pub fn kubectl(args: &[&str]) -> Result<String> {
    kubectl_input(args, None)
}

/// [`kubectl`] with `input` on its stdin.
pub fn kubectl_input(args: &[&str], input: Option<&str>) -> Result<String> {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", admin_kubeconfig())
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting kubectl")?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "kubectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Applies our CRDs (`deploy/kubernetes/base/crds`) and waits until they are established.
pub fn install_crds() -> Result<()> {
    let dir = crate::workspace_root().join("deploy/kubernetes/base/crds");
    let dir = dir.display().to_string();
    kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=jumpstarter-xtask",
        "-f",
        &dir,
    ])?;
    kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=60s",
    ])?;
    Ok(())
}

fn install_rbac(port: u16) -> Result<()> {
    let base = crate::workspace_root().join("deploy/kubernetes/base");
    for file in ["namespace.yaml", "rbac.yaml"] {
        let path = base.join(file).display().to_string();
        kubectl(&[
            "apply",
            "--server-side",
            "--field-manager=jumpstarter-xtask",
            "-n",
            NAMESPACE,
            "-f",
            &path,
        ])?;
    }
    allow_issuer_discovery()?;
    let token = kubectl(&[
        "create",
        "token",
        "jumpstarter-controller",
        "-n",
        NAMESPACE,
        "--duration=24h",
    ])?;
    let token = token.trim();
    ensure!(!token.is_empty(), "kubectl create token printed nothing");
    std::fs::write(
        controller_kubeconfig(),
        kubeconfig(
            &format!("https://127.0.0.1:{port}"),
            &state_dir(),
            &format!("    token: {token}\n"),
        )
        .replace("namespace: default", &format!("namespace: {NAMESPACE}")),
    )?;
    Ok(())
}

/// Lets anyone read the service-account issuer's discovery document and keys (binds
/// `system:service-account-issuer-discovery` to `system:unauthenticated`; idempotent):
/// external verifiers of ServiceAccount tokens (our controller's JWT authenticator,
/// docs/authentication.md) read them without credentials.
pub fn allow_issuer_discovery() -> Result<()> {
    kubectl_input(
        &[
            "apply",
            "--server-side",
            "--field-manager=jumpstarter-xtask",
            "-f",
            "-",
        ],
        Some(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  \
             name: jumpstarter-oidc-discovery\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  \
             kind: ClusterRole\n  name: system:service-account-issuer-discovery\nsubjects:\n  \
             - apiGroup: rbac.authorization.k8s.io\n    kind: Group\n    \
             name: system:unauthenticated\n",
        ),
    )?;
    Ok(())
}

/// Stops the processes a `kube-up` left (API server first) and removes the state directory.
pub fn down() -> Result<()> {
    let dir = state_dir();
    if !dir.exists() {
        return Ok(());
    }
    for (name, program) in [("kube-apiserver", "kube-apiserver"), ("etcd", "etcd")] {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("{name}.pid"))) else {
            continue;
        };
        let Ok(pid) = text.trim().parse::<u32>() else {
            continue;
        };
        // Only a process that still runs our program: the id may have been reused.
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        if !exe.starts_with(bin_dir()) || !exe.ends_with(program) {
            continue;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if alive(pid) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))
}

/// Deletes, in namespace `default`, the Exporters `exporters` and Clients `clients` with
/// their credential Secrets (those that exist).
pub fn delete_objects(exporters: &[&str], clients: &[&str]) -> Result<()> {
    let mut objects = Vec::new();
    for e in exporters {
        objects.push(format!("exporters.jumpstarter.dev/{e}"));
        objects.push(format!("secrets/{e}-exporter"));
    }
    for c in clients {
        objects.push(format!("clients.jumpstarter.dev/{c}"));
        objects.push(format!("secrets/{c}-client"));
    }
    let mut args = vec![
        "delete",
        "-n",
        "default",
        "--ignore-not-found",
        "--wait=false",
    ];
    args.extend(objects.iter().map(String::as_str));
    kubectl(&args)?;
    Ok(())
}
