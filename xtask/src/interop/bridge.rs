//! Python drivers beside Rust ones (issue 28, `docs/python-drivers.md`): one exporter config
//! with our Rust MockPower and upstream's Python Shell and MockFlasher (sent to Python with
//! `JMP_PYTHON_DRIVERS`, as we have Rust ones too), served by our exporter in local, direct
//! and distributed mode. Upstream's Python client and our `j` each power on and off, run a
//! shell method and check its output, flash an image and dump it back. In direct mode a
//! 256 MiB flash through the Python flasher must keep the exporter's and the Python child's
//! memory flat.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result, ensure};

use super::{Env, STORAGE_TIMEOUT, check, storage_random_file, storage_same_files};
use crate::procs::{self, Background};

/// The mixed drivers: Rust MockPower, Python Shell and MockFlasher.
const EXPORT: &str = "export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
  sh:
    type: jumpstarter_driver_shell.driver.Shell
    config:
      methods:
        greet: echo \"bridge greets $1\"
        fail_with: exit $1
  flasher:
    type: jumpstarter_driver_opendal.driver.MockFlasher
";

/// Upstream's Python implementations of types we also have in Rust.
const FORCED: &str =
    "jumpstarter_driver_shell.driver.Shell,jumpstarter_driver_opendal.driver.MockFlasher";

/// The image the clients flash and dump back in every mode.
const IMAGE_BYTES: usize = 4 * 1024 * 1024;

/// The flash whose memory is watched.
const BIG_FLASH_BYTES: usize = 256 * 1024 * 1024;

/// How much either process may grow during the big flash.
const MAX_GROWTH_KIB: u64 = 64 * 1024;

/// Our `jmp`, with the Python drivers' environment.
fn our_jmp(env: &Env) -> Command {
    let mut c = env.ours(&env.jmp);
    c.env("JMP_PYTHON", env.venv.join("bin/python3"))
        .env("JMP_PYTHON_DRIVERS", FORCED);
    c
}

/// A config with [`EXPORT`] for local and direct mode.
fn local_config(env: &Env) -> Result<PathBuf> {
    let path = env.work.path().join("bridge-exporter.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: bridge
endpoint: \"\"
token: \"\"
{EXPORT}"
        ),
    )?;
    Ok(path)
}

fn quoted(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// The commands our `j` runs in each mode (in a shell with `j` on `PATH`), dumping the
/// flashed image into `dump`.
fn our_j_script(j: &str, image: &Path, dump: &Path) -> String {
    format!(
        "set -e; {j} power on; {j} power off; {j} sh greet rust; \
         if {j} sh fail_with 7; then echo 'fail_with succeeded'; exit 1; fi; \
         {j} flasher flash {img}; {j} flasher dump {dump}; echo 'our j bridge ok'",
        img = quoted(image),
        dump = quoted(dump),
    )
}

/// What our `j` must have printed.
fn our_j_ok(out: &procs::Output, what: &str, image: &Path, dump: &Path) -> Result<()> {
    check(out, what)?;
    ensure!(
        out.stdout.contains("bridge greets rust") && out.stdout.contains("our j bridge ok"),
        "{what}: unexpected output\nstdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    storage_same_files(image, dump)
}

/// What upstream's client must have printed.
fn py_ok(out: &procs::Output, what: &str, image: &Path, dump: &Path) -> Result<()> {
    check(out, what)?;
    ensure!(
        out.stdout.contains("bridge greets python")
            && out.stdout.contains("python bridge client ok"),
        "{what}: unexpected output\nstdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    storage_same_files(image, dump)
}

/// A fresh image and the paths the two clients dump it back into.
fn image(env: &Env, mode: &str, seed: u64) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let dir = env.work.path();
    let img = dir.join(format!("bridge-{mode}.img"));
    storage_random_file(&img, IMAGE_BYTES, seed)?;
    Ok((
        img,
        dir.join(format!("bridge-{mode}-rs-dump.img")),
        dir.join(format!("bridge-{mode}-py-dump.img")),
    ))
}

/// Local mode: our `jmp shell --exporter-config` (our exporter on a private Unix socket) runs
/// our `j`, then upstream's client.
pub(super) fn local(env: &Env) -> Result<()> {
    let config = local_config(env)?;
    let (img, rs_dump, py_dump) = image(env, "local", 0xb1d6e)?;
    let script = format!(
        "{} && {} {} {} {}",
        our_j_script(&env.j.display().to_string(), &img, &rs_dump),
        quoted(&env.venv.join("bin/python")),
        quoted(&env.scripts.join("bridge_client.py")),
        quoted(&img),
        quoted(&py_dump)
    );
    let mut c = our_jmp(env);
    c.arg("shell")
        .arg("--exporter-config")
        .arg(&config)
        .args(["--", "sh", "-c", &script]);
    let out = procs::run(c, STORAGE_TIMEOUT)?;
    our_j_ok(&out, "jmp shell --exporter-config -- our j", &img, &rs_dump)?;
    py_ok(
        &out,
        "jmp shell --exporter-config -- python bridge_client.py",
        &img,
        &py_dump,
    )
}

/// Direct mode: our `jmp run` on TCP, driven by our `j` and upstream's client; then the
/// 256 MiB flash with both processes' memory sampled.
pub(super) fn direct(env: &Env) -> Result<()> {
    let config = local_config(env)?;
    let (exporter, port) = procs::start_our_exporter(our_jmp(env), &config, &[])?;
    let host = format!("127.0.0.1:{port}");
    let (img, rs_dump, py_dump) = image(env, "direct", 0xd1ec7)?;

    let mut sh = env.ours(Path::new("sh"));
    sh.env("JUMPSTARTER_HOST", &host)
        .env("JMP_GRPC_INSECURE", "1")
        .env("PATH", path_with_ours(env)?)
        .args(["-c", &our_j_script("j", &img, &rs_dump)]);
    our_j_ok(
        &procs::run(sh, STORAGE_TIMEOUT)?,
        "our j -> our exporter (direct TCP)",
        &img,
        &rs_dump,
    )?;

    let mut py = env.upstream("python");
    py.env("JUMPSTARTER_HOST", &host)
        .env("JMP_GRPC_INSECURE", "1")
        .env("JMP_DRIVERS_ALLOW", "UNSAFE")
        .arg(env.scripts.join("bridge_client.py"))
        .arg(&img)
        .arg(&py_dump);
    py_ok(
        &procs::run(py, STORAGE_TIMEOUT)?,
        "python bridge_client.py -> our exporter (direct TCP)",
        &img,
        &py_dump,
    )?;
    let _ = std::fs::remove_file(&rs_dump);
    let _ = std::fs::remove_file(&py_dump);

    big_flash(env, &exporter, &host)
}

/// `PATH` with our binaries first (so `j` is ours).
fn path_with_ours(env: &Env) -> Result<String> {
    Ok(format!(
        "{}:{}",
        env.jmp.parent().context("no binary directory")?.display(),
        std::env::var("PATH").unwrap_or_default()
    ))
}

/// Resident memory (VmRSS) of `pid`, KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The Python driver host among `pid`'s children (its command line runs `bootstrap.py`).
fn python_child(pid: u32) -> Result<u32> {
    let mut kids = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        kids.extend(
            text.split_whitespace()
                .filter_map(|k| k.parse::<u32>().ok()),
        );
    }
    kids.into_iter()
        .find(|k| {
            std::fs::read_to_string(format!("/proc/{k}/cmdline"))
                .is_ok_and(|cmd| cmd.contains("bootstrap.py"))
        })
        .with_context(|| format!("the exporter {pid} has no Python driver host child"))
}

/// Samples the resident memory of `pids` every 50 ms until `stop`; returns each one's
/// highest sample, KiB.
fn sample_peaks(pids: Vec<u32>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<u64>> {
    std::thread::spawn(move || {
        let mut peaks = vec![0u64; pids.len()];
        // Bounded: the flash has a timeout, and `stop` is set whatever its outcome.
        while !stop.load(Ordering::Relaxed) {
            for (peak, pid) in peaks.iter_mut().zip(&pids) {
                *peak = (*peak).max(rss_kib(*pid).unwrap_or(0));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        peaks
    })
}

/// Flashes 256 MiB with our `j` through the Python MockFlasher and dumps it back; fails if
/// the exporter or the Python child grew by more than [`MAX_GROWTH_KIB`] meanwhile.
fn big_flash(env: &Env, exporter: &Background, host: &str) -> Result<()> {
    let exporter_pid = exporter.pid();
    let python_pid = python_child(exporter_pid)?;
    let img = env.work.path().join("bridge-big.img");
    let back = env.work.path().join("bridge-big-back.img");
    storage_random_file(&img, BIG_FLASH_BYTES, 0xb16f1a5)?;
    let j = |args: &[&std::ffi::OsStr]| -> Result<procs::Output> {
        let mut c = env.ours(&env.j);
        c.env("JUMPSTARTER_HOST", host)
            .env("JMP_GRPC_INSECURE", "1")
            .args(args);
        procs::run(c, STORAGE_TIMEOUT)
    };
    let before = [
        rss_kib(exporter_pid).context("no VmRSS for the exporter")?,
        rss_kib(python_pid).context("no VmRSS for the Python child")?,
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_peaks(vec![exporter_pid, python_pid], stop.clone());
    let flashed = j(&["flasher".as_ref(), "flash".as_ref(), img.as_os_str()]);
    stop.store(true, Ordering::Relaxed);
    let peaks = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("the memory sampler panicked"))?;
    check(&flashed?, "our j flasher flash (256 MiB)")?;
    let names = ["exporter", "Python child"];
    for ((name, b), p) in names.iter().zip(before).zip(&peaks) {
        println!(
            "   256 MiB flash: {name} RSS {:.1} MiB before, {:.1} MiB peak (+{:.1} MiB)",
            b as f64 / 1024.0,
            *p as f64 / 1024.0,
            p.saturating_sub(b) as f64 / 1024.0
        );
    }
    for ((name, b), p) in names.iter().zip(before).zip(&peaks) {
        ensure!(
            p.saturating_sub(b) <= MAX_GROWTH_KIB,
            "the {name} grew by {} KiB (from {b} KiB) during a 256 MiB flash; the bound is \
             {MAX_GROWTH_KIB} KiB: the image is being buffered",
            p.saturating_sub(b)
        );
    }
    let out = j(&["flasher".as_ref(), "dump".as_ref(), back.as_os_str()])?;
    check(&out, "our j flasher dump (256 MiB)")?;
    let same = storage_same_files(&img, &back);
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_file(&back);
    same
}

/// Distributed mode: our exporter registered with our controller, leased through the router
/// by our `jmp shell` (our `j`) and upstream's `jmp shell` (its client).
pub(super) fn distributed(env: &Env) -> Result<()> {
    let _controller = super::controller::start_controller(env, "bridge-dist-data")?.0;
    let exporter = super::distributed::exporter_config_with(env, "bridge-ex", "bridge", EXPORT)?;
    let rs_client = super::distributed::client_config(env, "bridge-rs-client")?;
    let py_client = super::distributed::client_config(env, "bridge-py-client")?;
    let mut c = our_jmp(env);
    c.arg("run").arg("--exporter-config").arg(&exporter);
    let mut ours = Background::start("jmp run (bridge)", c)?;
    ours.wait_for_line("registered with controller", Duration::from_secs(90))?;

    let (img, rs_dump, py_dump) = image(env, "dist", 0xd157b)?;
    let out = super::distributed::our_shell(
        env,
        &rs_client,
        "bridge",
        &our_j_script("j", &img, &rs_dump),
    )?;
    our_j_ok(&out, "jmp shell -l board=bridge -- our j", &img, &rs_dump)?;
    super::distributed::no_tunnel_lost(&out)?;

    let python = env.venv.join("bin").join("python");
    let script = env.scripts.join("bridge_client.py");
    let out = super::distributed::py_shell(
        env,
        &py_client,
        "bridge",
        &[&python, &script, &img, &py_dump],
    )?;
    py_ok(
        &out,
        "(python) jmp shell -l board=bridge -- python bridge_client.py",
        &img,
        &py_dump,
    )?;
    // Upstream's `j` builds its shell commands from the driver's methods, through the bridge.
    let j = env.venv.join("bin").join("j");
    let out = super::distributed::py_shell(
        env,
        &py_client,
        "bridge",
        &[
            &j,
            Path::new("sh"),
            Path::new("greet"),
            Path::new("upstream-j"),
        ],
    )?;
    check(&out, "(python) jmp shell -- j sh greet upstream-j")?;
    ensure!(
        out.stdout.contains("bridge greets upstream-j"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    Ok(())
}
