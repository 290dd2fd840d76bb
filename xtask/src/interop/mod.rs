//! `cargo xtask interop`: the upstream Python tools (PyPI 0.9.0) against ours, both ways.
//!
//! Builds a venv with the pinned packages (once, in `~/.cache/jumpstarter-rs/venvs`), builds our
//! binaries, checks descriptor conformance, then runs each scenario and prints
//! `N passed, N failed`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};

use crate::procs::{self, Background};

mod boards;
mod bridge;
mod console;
mod controller;
mod custom;
mod distributed;
mod driver_tests;
mod pools;
mod qemu;
mod scenarios;
mod snmp;
mod upstream_main;

pub use scenarios::{KUBE_SCENARIO_OBJECTS, against_kubernetes, run};

/// The upstream packages, pinned.
pub const REQUIREMENTS: &[&str] = &[
    "jumpstarter-cli==0.9.0",
    "jumpstarter-protocol==0.9.0",
    "jumpstarter-driver-power==0.9.0",
    "jumpstarter-driver-opendal==0.9.0",
    "jumpstarter-driver-composite==0.9.0",
    "jumpstarter-driver-pyserial==0.9.0",
    "jumpstarter-driver-network==0.9.0",
    "jumpstarter-driver-shell==0.9.0",
    "jumpstarter-driver-qemu==0.9.0",
    "jumpstarter-driver-snmp==0.9.0",
    // Upstream's driver tests (shipped in the driver wheels), run by `driver_tests`.
    "pytest==9.2.0",
    "pytest-asyncio==1.5.0",
];

const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Creates (once) the venv with the pinned upstream packages; returns its directory.
pub fn ensure_venv() -> Result<PathBuf> {
    venv_with("interop-venv", REQUIREMENTS)
}

/// Creates (once) the venv `NAME-HASH` with `requirements` installed, in the cache outside
/// the checkout ([`crate::cache_root`]`/venvs`; `HASH` is of the requirements and the
/// Python that runs it, so a change makes a new one); returns its directory.
pub fn venv_with(name: &str, requirements: &[&str]) -> Result<PathBuf> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let key = format!("{python}\n{}", requirements.join("\n"));
    let venv = crate::cache_root()
        .join("venvs")
        .join(format!("{name}-{}", crate::workspace::short_hash(&key)));
    let stamp = venv.join("requirements.stamp");
    let wanted = requirements.join("\n");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(venv);
    }
    println!(
        "== creating {} (pip install {})",
        venv.display(),
        requirements.join(" ")
    );
    let status = Command::new(&python)
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .status()
        .with_context(|| format!("running {python} -m venv"))?;
    ensure!(status.success(), "{python} -m venv failed ({status})");
    let status = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .args(requirements)
        .status()
        .context("running pip")?;
    ensure!(status.success(), "pip install failed ({status})");
    std::fs::write(&stamp, wanted)?;
    Ok(venv)
}

/// Paths the scenarios use.
pub struct Env {
    /// The venv.
    pub venv: PathBuf,
    /// Our `jmp`.
    pub jmp: PathBuf,
    /// Our `j`.
    pub j: PathBuf,
    /// A scratch directory for this run.
    pub work: tempfile_dir::Dir,
    /// The scripts directory (`xtask/interop`).
    pub scripts: PathBuf,
    /// Where the scenarios' controllers keep their objects.
    pub store: ControllerStore,
}

/// Where the controller of the controller-mode scenarios keeps its objects.
#[derive(Debug, Clone, Default)]
pub enum ControllerStore {
    /// SQLite in a fresh data directory per scenario.
    #[default]
    Sqlite,
    /// A cluster's CRDs (`--store kubernetes --namespace NAMESPACE`, `KUBECONFIG`): one
    /// cluster for every scenario, so the objects a scenario makes outlive it.
    Kubernetes {
        /// The kubeconfig the controller uses.
        kubeconfig: PathBuf,
        /// The controller's own namespace (ConfigMap, key Secret, leader Lease).
        namespace: String,
    },
}

/// A tiny temp-dir helper (xtask keeps its dependencies to anyhow and the proto crate).
pub mod tempfile_dir {
    use std::path::{Path, PathBuf};

    /// A directory removed when dropped.
    pub struct Dir(PathBuf);

    impl Dir {
        /// Creates a fresh directory under the system temp dir.
        pub fn new(prefix: &str) -> std::io::Result<Self> {
            Self::new_in(&std::env::temp_dir(), prefix)
        }
        /// Creates a fresh directory under `base`.
        pub fn new_in(base: &Path, prefix: &str) -> std::io::Result<Self> {
            for i in 0..1000u32 {
                let p = base.join(format!("{prefix}-{}-{i}", std::process::id()));
                if std::fs::create_dir(&p).is_ok() {
                    return Ok(Dir(p));
                }
            }
            Err(std::io::Error::other("cannot create a temp dir"))
        }
        /// Its path.
        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Env {
    fn py(&self, tool: &str) -> PathBuf {
        self.venv.join("bin").join(tool)
    }

    /// A command for an upstream tool with a clean config home.
    fn upstream(&self, tool: &str) -> Command {
        let mut c = Command::new(self.py(tool));
        c.env("JMP_CLIENT_CONFIG_HOME", self.work.path().join("py-config"))
            .env_remove("JUMPSTARTER_HOST")
            .current_dir(self.work.path());
        c
    }

    fn ours(&self, bin: &Path) -> Command {
        let mut c = Command::new(bin);
        c.env("JMP_CLIENT_CONFIG_HOME", self.work.path().join("rs-config"))
            .env_remove("JUMPSTARTER_HOST")
            .current_dir(self.work.path());
        c
    }

    fn config(&self) -> PathBuf {
        self.work.path().join("exporter.yaml")
    }
}

const EXPORTER_CONFIG: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: interop
endpoint: \"\"
token: \"\"
export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
  storage:
    type: jumpstarter_driver_opendal.driver.MockStorageMux
";

fn conformance(env: &Env) -> Result<()> {
    crate::conformance::run(&env.py("python"), &env.work.path().join("conformance"))
}

fn check(out: &procs::Output, what: &str) -> Result<()> {
    ensure!(
        out.code == 0,
        "{what} exited {}\nstdout:\n{}\nstderr:\n{}",
        out.code,
        out.stdout,
        out.stderr
    );
    Ok(())
}

fn expect_readings(out: &procs::Output) -> Result<()> {
    ensure!(
        out.stdout
            .contains("voltage=0.0 V  current=0.0 A  apparent_power=0.0 VA")
            && out
                .stdout
                .contains("voltage=5.0 V  current=2.0 A  apparent_power=10.0 VA"),
        "unexpected readings:\n{}{}",
        out.stdout,
        out.stderr
    );
    Ok(())
}

/// Upstream `j` inside our local `jmp shell` (our exporter on a private Unix socket).
fn py_j_unix(env: &Env) -> Result<()> {
    let mut c = env.ours(&env.jmp);
    c.arg("shell")
        .arg("--exporter-config")
        .arg(env.config())
        .arg("--")
        .arg(env.py("j"))
        .args(["power", "on"]);
    check(
        &procs::run(c, CALL_TIMEOUT)?,
        "jmp shell -- (python) j power on",
    )?;
    let mut c = env.ours(&env.jmp);
    c.arg("shell")
        .arg("--exporter-config")
        .arg(env.config())
        .arg("--")
        .arg(env.py("j"))
        .args(["power", "read"]);
    let out = procs::run(c, CALL_TIMEOUT)?;
    check(&out, "jmp shell -- (python) j power read")?;
    expect_readings(&out)
}

fn py_script_unix(env: &Env) -> Result<()> {
    let mut c = env.ours(&env.jmp);
    c.arg("shell")
        .arg("--exporter-config")
        .arg(env.config())
        .arg("--")
        .arg(env.py("python"))
        .arg(env.scripts.join("drive_power.py"));
    let out = procs::run(c, CALL_TIMEOUT)?;
    check(&out, "python drive_power.py")?;
    ensure!(out.stdout.contains("python client ok"), "{}", out.stdout);
    Ok(())
}

/// Starts our exporter on a TCP port (port 0) and returns it with its port.
fn our_direct_exporter(env: &Env, extra: &[&str]) -> Result<(Background, u16)> {
    our_direct_exporter_with(env, &env.config(), extra)
}

/// As [`our_direct_exporter`], with the exporter config `config`.
fn our_direct_exporter_with(env: &Env, config: &Path, extra: &[&str]) -> Result<(Background, u16)> {
    procs::start_our_exporter(env.ours(&env.jmp), config, extra)
}

fn py_direct(env: &Env, port: u16, passphrase: Option<&str>) -> Command {
    let mut c = env.upstream("j");
    c.env("JUMPSTARTER_HOST", format!("127.0.0.1:{port}"))
        .env("JMP_GRPC_INSECURE", "1")
        .env("JMP_DRIVERS_ALLOW", "UNSAFE");
    if let Some(p) = passphrase {
        c.env("JMP_GRPC_PASSPHRASE", p);
    }
    c
}

fn py_direct_plain(env: &Env) -> Result<()> {
    let (_exporter, port) = our_direct_exporter(env, &[])?;
    let mut c = py_direct(env, port, None);
    c.args(["power", "on"]);
    check(&procs::run(c, CALL_TIMEOUT)?, "(python) j power on")?;
    let mut c = py_direct(env, port, None);
    c.args(["power", "read"]);
    let out = procs::run(c, CALL_TIMEOUT)?;
    check(&out, "(python) j power read")?;
    expect_readings(&out)?;
    let mut c = py_direct(env, port, None);
    c.env("PATH", path_with_venv(env));
    let mut script = Command::new(env.py("python"));
    script.arg(env.scripts.join("drive_power.py"));
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => script.env(k, v),
            None => script.env_remove(k),
        };
    }
    let out = procs::run(script, CALL_TIMEOUT)?;
    check(&out, "python drive_power.py over TCP")
}

fn path_with_venv(env: &Env) -> String {
    format!(
        "{}:{}",
        env.venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn py_shell_tls_grpc(env: &Env) -> Result<()> {
    let (_exporter, port) = our_direct_exporter(env, &[])?;
    let mut c = env.upstream("jmp");
    c.env("PATH", path_with_venv(env)).args([
        "shell",
        "--tls-grpc",
        &format!("127.0.0.1:{port}"),
        "--tls-grpc-insecure",
        "--",
        "j",
        "power",
        "on",
    ]);
    check(
        &procs::run(c, CALL_TIMEOUT)?,
        "(python) jmp shell --tls-grpc -- j power on",
    )
}

fn py_direct_passphrase(env: &Env) -> Result<()> {
    let (_exporter, port) = our_direct_exporter(env, &["--passphrase", "s3cret"])?;
    let mut c = py_direct(env, port, Some("s3cret"));
    c.args(["power", "on"]);
    check(
        &procs::run(c, CALL_TIMEOUT)?,
        "(python) j power on with passphrase",
    )?;
    let mut c = py_direct(env, port, Some("wrong"));
    c.args(["power", "on"]);
    let out = procs::run(c, CALL_TIMEOUT)?;
    ensure!(
        out.code != 0,
        "a wrong passphrase was accepted:\n{}",
        out.stdout
    );
    ensure!(
        out.stderr.contains("invalid or missing passphrase")
            || out.stdout.contains("invalid or missing passphrase"),
        "unexpected error for a wrong passphrase:\n{}{}",
        out.stdout,
        out.stderr
    );
    // The exporter keeps serving after refusing.
    let mut c = py_direct(env, port, Some("s3cret"));
    c.args(["power", "off"]);
    check(
        &procs::run(c, CALL_TIMEOUT)?,
        "(python) j power off after a refusal",
    )
}

fn our_j(env: &Env, host: &str, args: &[&str]) -> Result<procs::Output> {
    let mut c = env.ours(&env.j);
    c.env("JUMPSTARTER_HOST", host)
        .env("JMP_GRPC_INSECURE", "1")
        .args(args);
    procs::run(c, CALL_TIMEOUT)
}

fn rs_j_to_py_tcp(env: &Env) -> Result<()> {
    let port = procs::free_port()?;
    let mut c = env.upstream("jmp");
    c.arg("run")
        .arg("--exporter-config")
        .arg(env.config())
        .args([
            "--tls-grpc-listener",
            &format!("127.0.0.1:{port}"),
            "--tls-grpc-insecure",
        ]);
    let _exporter = Background::start("(python) jmp run", c)?;
    procs::wait_port(port, Duration::from_secs(60))?;
    let host = format!("127.0.0.1:{port}");
    check(&our_j(env, &host, &["power", "on"])?, "our j power on")?;
    let out = our_j(env, &host, &["power", "read"])?;
    check(&out, "our j power read")?;
    expect_readings(&out)
}

fn rs_j_to_py_unix(env: &Env) -> Result<()> {
    let sock = env.work.path().join("py.sock");
    let _ = std::fs::remove_file(&sock);
    let mut c = env.upstream("python");
    c.arg(env.scripts.join("serve_unix.py"))
        .arg(env.config())
        .arg(&sock);
    let _exporter = Background::start("(python) serve_unix.py", c)?;
    procs::wait_path(&sock, Duration::from_secs(60))?;
    let host = sock.to_string_lossy().to_string();
    check(&our_j(env, &host, &["power", "on"])?, "our j power on")?;
    let out = our_j(env, &host, &["power", "read"])?;
    check(&out, "our j power read")?;
    expect_readings(&out)
}

// ------------------------------------------------------------------------------------
// Storage (resource streams): 64 MiB round trips through MockStorageMux, both ways.
// ------------------------------------------------------------------------------------

const STORAGE_BYTES: usize = 64 * 1024 * 1024;
const STORAGE_TIMEOUT: Duration = Duration::from_secs(300);

/// Writes `len` pseudo-random bytes (xorshift) to `path`.
fn storage_random_file(path: &Path, len: usize, seed: u64) -> Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x = seed | 1;
    let mut chunk = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for b in chunk.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
        }
        let n = left.min(chunk.len());
        f.write_all(&chunk[..n])?;
        left -= n;
    }
    f.flush()?;
    Ok(())
}

/// Fails unless two files hold the same bytes (compared in chunks).
fn storage_same_files(a: &Path, b: &Path) -> Result<()> {
    use std::io::Read;
    let (ma, mb) = (std::fs::metadata(a)?, std::fs::metadata(b)?);
    ensure!(
        ma.len() == mb.len(),
        "{} has {} bytes, {} has {}",
        a.display(),
        ma.len(),
        b.display(),
        mb.len()
    );
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut offset = 0u64;
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(());
        }
        fb.read_exact(&mut bb[..n])?;
        ensure!(
            ba[..n] == bb[..n],
            "{} and {} differ near offset {offset}",
            a.display(),
            b.display()
        );
        offset += n as u64;
    }
}

fn storage_gzip(src: &Path, dst: &Path) -> Result<()> {
    let out = std::fs::File::create(dst)?;
    let status = Command::new("gzip")
        .args(["-c", "-1"])
        .arg(src)
        .stdout(out)
        .status()
        .context("running gzip")?;
    ensure!(status.success(), "gzip failed ({status})");
    Ok(())
}

/// Upstream Python client (`StorageMuxClient.write_local_file` / `read_local_file`) inside
/// our local `jmp shell`, i.e. against our exporter on a Unix socket.
fn storage_py_client_to_ours(env: &Env) -> Result<()> {
    let src = env.work.path().join("storage-py-src.img");
    let dst = env.work.path().join("storage-py-dst.img");
    storage_random_file(&src, STORAGE_BYTES, 0x5eed)?;
    let mut c = env.ours(&env.jmp);
    c.arg("shell")
        .arg("--exporter-config")
        .arg(env.config())
        .arg("--")
        .arg(env.py("python"))
        .arg(env.scripts.join("storage_roundtrip.py"))
        .arg(&src)
        .arg(&dst);
    let out = procs::run(c, STORAGE_TIMEOUT)?;
    check(&out, "python storage_roundtrip.py against our exporter")?;
    ensure!(
        out.stdout.contains("python storage round trip ok"),
        "{}",
        out.stdout
    );
    storage_same_files(&src, &dst)
}

/// Starts the upstream exporter on a Unix socket; returns it and the socket path.
fn storage_py_exporter(
    env: &Env,
    name: &str,
    extra_env: &[(&str, &str)],
) -> Result<(Background, String)> {
    let sock = env.work.path().join(name);
    let _ = std::fs::remove_file(&sock);
    let mut c = env.upstream("python");
    c.arg(env.scripts.join("serve_unix.py"))
        .arg(env.config())
        .arg(&sock);
    for (k, v) in extra_env {
        c.env(k, v);
    }
    let exporter = Background::start("(python) serve_unix.py", c)?;
    procs::wait_path(&sock, Duration::from_secs(60))?;
    Ok((exporter, sock.to_string_lossy().into_owned()))
}

fn storage_our_j(env: &Env, host: &str, args: &[&Path], cmd: &[&str]) -> Result<()> {
    let mut c = env.ours(&env.j);
    c.env("JUMPSTARTER_HOST", host).args(cmd).args(args);
    let out = procs::run(c, STORAGE_TIMEOUT)?;
    check(&out, &format!("our j {}", cmd.join(" ")))
}

/// Our `j storage` against the upstream exporter: 64 MiB written and read back, then a
/// gzip image flashed (the exporter expands it) and read back.
fn storage_rs_client_to_py(env: &Env) -> Result<()> {
    let (_exporter, host) = storage_py_exporter(env, "py-storage.sock", &[])?;
    let src = env.work.path().join("storage-rs-src.img");
    let dst = env.work.path().join("storage-rs-dst.img");
    storage_random_file(&src, STORAGE_BYTES, 0xfeed)?;
    storage_our_j(env, &host, &[&src], &["storage", "write-local-file"])?;
    storage_our_j(env, &host, &[&dst], &["storage", "read-local-file"])?;
    storage_same_files(&src, &dst)?;

    let gz = env.work.path().join("storage-rs-src.img.gz");
    storage_gzip(&src, &gz)?;
    let back = env.work.path().join("storage-rs-back.img");
    storage_our_j(
        env,
        &host,
        &[&gz],
        &["storage", "flash", "--compression", "gzip"],
    )?;
    storage_our_j(env, &host, &[&back], &["storage", "read-local-file"])?;
    storage_same_files(&src, &back)
}

/// With `JMP_DISABLE_COMPRESSION=1` the upstream exporter refuses encodings: our client
/// expands the gzip image itself and sends it plain.
fn storage_rs_client_fallback(env: &Env) -> Result<()> {
    let (_exporter, host) = storage_py_exporter(
        env,
        "py-storage-plain.sock",
        &[("JMP_DISABLE_COMPRESSION", "1")],
    )?;
    let src = env.work.path().join("storage-fb-src.img");
    storage_random_file(&src, 8 * 1024 * 1024, 0xb00)?;
    let gz = env.work.path().join("storage-fb-src.img.gz");
    storage_gzip(&src, &gz)?;
    let back = env.work.path().join("storage-fb-back.img");
    storage_our_j(
        env,
        &host,
        &[&gz],
        &["storage", "flash", "--compression", "gzip"],
    )?;
    storage_our_j(env, &host, &[&back], &["storage", "read-local-file"])?;
    storage_same_files(&src, &back)
}

// ------------------------------------------------------------------------------------
// Storage through Opendal(fs): 64 MiB round trips, both ways, checked on the exporter's disk.
// ------------------------------------------------------------------------------------

/// Writes an exporter config with one `opendal` driver (scheme `fs`) rooted at a fresh
/// directory; returns the config path and the root.
fn opendal_config(env: &Env, name: &str) -> Result<(PathBuf, PathBuf)> {
    let root = env.work.path().join(format!("{name}-root"));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    let config = env.work.path().join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: {name}
endpoint: \"\"
token: \"\"
export:
  opendal:
    type: jumpstarter_driver_opendal.driver.Opendal
    config:
      scheme: fs
      kwargs:
        root: {}
",
            root.display()
        ),
    )?;
    Ok((config, root))
}

/// Upstream `OpendalClient.write_from_path` / `read_into_path` (plus exists, stat, hash and a
/// refused `..` path) inside our local `jmp shell` serving an Opendal(fs) driver.
fn opendal_py_client_to_ours(env: &Env) -> Result<()> {
    let (config, root) = opendal_config(env, "opendal-ours")?;
    let src = env.work.path().join("opendal-py-src.img");
    let dst = env.work.path().join("opendal-py-dst.img");
    storage_random_file(&src, STORAGE_BYTES, 0x0bda1)?;
    let mut c = env.ours(&env.jmp);
    c.arg("shell")
        .arg("--exporter-config")
        .arg(&config)
        .arg("--")
        .arg(env.py("python"))
        .arg(env.scripts.join("opendal_roundtrip.py"))
        .arg(&src)
        .arg(&dst);
    let out = procs::run(c, STORAGE_TIMEOUT)?;
    check(&out, "python opendal_roundtrip.py against our exporter")?;
    ensure!(
        out.stdout.contains("python opendal round trip ok"),
        "{}",
        out.stdout
    );
    storage_same_files(&src, &root.join("image.bin"))?;
    storage_same_files(&src, &dst)?;
    ensure!(
        !env.work.path().join("outside.bin").exists(),
        "a file appeared outside the storage root"
    );
    Ok(())
}

/// Runs our `j` against `host` and returns its standard output.
fn opendal_our_j(env: &Env, host: &str, args: &[&std::ffi::OsStr]) -> Result<String> {
    let mut c = env.ours(&env.j);
    c.env("JUMPSTARTER_HOST", host).arg("opendal").args(args);
    let out = procs::run(c, STORAGE_TIMEOUT)?;
    let what = args
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    check(&out, &format!("our j opendal {what}"))?;
    Ok(out.stdout)
}

/// Our `j opendal` against the upstream exporter serving Opendal(fs): 64 MiB written (the
/// bytes on the exporter's disk are checked), hashed by the exporter, read back; then a gzip
/// file written with `--compression gzip` arrives expanded.
fn opendal_rs_client_to_py(env: &Env) -> Result<()> {
    let (config, root) = opendal_config(env, "opendal-py")?;
    let sock = env.work.path().join("py-opendal.sock");
    let _ = std::fs::remove_file(&sock);
    let mut c = env.upstream("python");
    c.arg(env.scripts.join("serve_unix.py"))
        .arg(&config)
        .arg(&sock);
    let _exporter = Background::start("(python) serve_unix.py opendal", c)?;
    procs::wait_path(&sock, Duration::from_secs(60))?;
    let host = sock.to_string_lossy().into_owned();

    let src = env.work.path().join("opendal-rs-src.img");
    let dst = env.work.path().join("opendal-rs-dst.img");
    storage_random_file(&src, STORAGE_BYTES, 0xda7a)?;
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    opendal_our_j(
        env,
        &host,
        &[os("write-from-path"), os("image.bin"), src.as_os_str()],
    )?;
    storage_same_files(&src, &root.join("image.bin"))?;

    let remote = opendal_our_j(env, &host, &[os("hash"), os("image.bin")])?;
    let local = python_sha256(env, &src)?;
    ensure!(
        remote.trim() == local,
        "exporter hash {} != local {local}",
        remote.trim()
    );
    opendal_our_j(env, &host, &[os("exists"), os("image.bin")])?;
    opendal_our_j(
        env,
        &host,
        &[os("read-into-path"), os("image.bin"), dst.as_os_str()],
    )?;
    storage_same_files(&src, &dst)?;

    let gz = env.work.path().join("opendal-rs-src.img.gz");
    storage_gzip(&src, &gz)?;
    opendal_our_j(
        env,
        &host,
        &[
            os("write-from-path"),
            os("--compression"),
            os("gzip"),
            os("expanded.bin"),
            gz.as_os_str(),
        ],
    )?;
    storage_same_files(&src, &root.join("expanded.bin"))
}

/// The sha256 of a local file, computed by the venv's Python (xtask carries no digest crate).
fn python_sha256(env: &Env, path: &Path) -> Result<String> {
    let mut c = env.upstream("python");
    c.arg("-c")
        .arg(
            "import hashlib,sys\n\
             h=hashlib.sha256()\n\
             f=open(sys.argv[1],'rb')\n\
             while b:=f.read(1<<20): h.update(b)\n\
             print(h.hexdigest())",
        )
        .arg(path);
    let out = procs::run(c, STORAGE_TIMEOUT)?;
    check(&out, "python sha256")?;
    Ok(out.stdout.trim().to_string())
}
