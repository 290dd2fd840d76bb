//! `cargo xtask bench` part: the direct path against the router, in the same run.
//!
//! Our controller (with its in-process router) on loopback, our exporter in controller mode
//! with `--direct-listener`, and two `jmp shell` sessions — one direct, one with
//! `--no-direct` — each timing unary calls (`bench_calls` on the shell's socket), an upload
//! with `j storage write-local-file` and a download with `j storage read-local-file`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    bench::{CallFigures, json_number},
    procs::{self, Background},
};

const READY_LINE: &str = "jumpstarter-controller ready:";
const EXPORT: &str = "export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
  storage:
    type: jumpstarter_driver_opendal.driver.MockStorageMux
";

/// Release binaries and a scratch directory for a distributed-mode lab on loopback.
pub(crate) struct Lab {
    /// The release binaries' directory.
    pub(crate) rel: PathBuf,
    /// Configs and data.
    pub(crate) work: crate::interop::tempfile_dir::Dir,
}

impl Lab {
    /// Our `jmp` with this lab's config directories and our binaries first on `PATH`.
    pub(crate) fn jmp(&self) -> Command {
        let mut c = Command::new(self.rel.join("jmp"));
        c.env("JMP_CLIENT_CONFIG_HOME", self.work.path().join("config"))
            .env("XDG_CONFIG_HOME", self.work.path())
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    self.rel.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("JMP_LOG", "warn")
            .env_remove("JMP_ADMIN_CONFIG")
            .env_remove("JUMPSTARTER_HOST")
            .env_remove("JMP_LEASE")
            .current_dir(self.work.path());
        c
    }

    /// `jmp admin create KIND NAME ARGS... --out FILE`: the file.
    pub(crate) fn admin_create(&self, kind: &str, name: &str, args: &[&str]) -> Result<PathBuf> {
        let out = self.work.path().join(format!("{name}.{kind}.yaml"));
        let mut c = self.jmp();
        c.args(["admin", "create", kind, name, "--nointeractive", "--out"])
            .arg(&out)
            .args(args);
        let o = procs::run(c, Duration::from_secs(60))?;
        ensure!(o.code == 0, "jmp admin create {kind} {name}: {}", o.stderr);
        Ok(out)
    }

    /// Our controller (with its router) on loopback, its admin config in this lab.
    pub(crate) fn start_controller(&self) -> Result<Background> {
        let mut ctl = Command::new(self.rel.join("jumpstarter-controller"));
        ctl.arg("--data-dir")
            .arg(self.work.path().join("data"))
            .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
            .args(["--metrics-listen", "off"])
            .arg("--admin-config")
            .arg(self.work.path().join("config").join("admin.yaml"))
            .env("RUST_LOG", "warn");
        let mut controller = Background::start("jumpstarter-controller", ctl)?;
        controller.wait_for_line(READY_LINE, Duration::from_secs(60))?;
        Ok(controller)
    }

    /// `jmp shell -l board=direct [--no-direct] -- sh -c SCRIPT`: its stdout.
    fn shell(&self, client: &Path, no_direct: bool, script: &str) -> Result<String> {
        let mut c = self.jmp();
        c.arg("shell").arg("--client-config").arg(client);
        c.args(["-l", "board=direct"]);
        if no_direct {
            c.arg("--no-direct");
        }
        c.args(["--", "sh", "-c", script]);
        let o = procs::run(c, Duration::from_secs(1800))?;
        if o.code != 0 {
            bail!("jmp shell failed: {}{}", o.stdout, o.stderr);
        }
        let want = if no_direct { "via router" } else { "directly" };
        ensure!(
            o.stderr.contains(want),
            "jmp shell did not connect {want}: {}",
            o.stderr
        );
        Ok(o.stdout)
    }
}

fn quoted(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// Runs the direct-vs-router benchmark (`--quick`: 300 calls, 64 MiB; else 5,000, 1 GiB).
pub fn run(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let calls = if quick { 300 } else { 5000 };
    let mib: u64 = if quick { 64 } else { 1024 };
    let rel = crate::bench::build_release()?;
    let lab = Lab {
        rel,
        work: crate::interop::tempfile_dir::Dir::new("jmp-bench-direct")?,
    };
    let controller = lab.start_controller()?;

    let exporter = lab.admin_create("exporter", "bench-direct", &["-l", "board=direct"])?;
    let text = std::fs::read_to_string(&exporter)?;
    ensure!(
        text.contains("\nexport:\n"),
        "{} has no empty `export: {{}}`:\n{text}",
        exporter.display()
    );
    std::fs::write(
        &exporter,
        text.replace("\nexport:\n", &format!("\n{EXPORT}")),
    )?;
    let client = lab.admin_create("client", "bench-client", &["--unsafe"])?;
    // The image and the exporter's medium on tmpfs when there is room: the upload figures
    // are the transfer's, not the disk's.
    let (scratch, on_tmpfs) = crate::bench_storage::scratch_dir(mib << 20)?;
    let mut run = lab.jmp();
    run.args(["run", "--exporter-config"])
        .arg(&exporter)
        .args(["--direct-listener", "127.0.0.1:0"])
        .env("TMPDIR", scratch.path())
        .env("JMP_LOG", "info");
    let mut exporter = Background::start("jmp run", run)?;
    exporter.wait_for_line("registered with controller", Duration::from_secs(60))?;

    let big = scratch.path().join("big");
    {
        let f = std::fs::File::create(&big).context("cannot create the upload file")?;
        f.set_len(mib * 1024 * 1024)?;
    }
    let bench_calls = lab.rel.join("examples/bench_calls");
    let copy = scratch.path().join("copy");
    // The shell prints the call figures (one JSON line), then `upload START END` and
    // `download START END` (seconds).
    let script = format!(
        "{bench} \"$JUMPSTARTER_HOST\" {calls} 1 && s=$(date +%s.%N) && \
         j storage write-local-file {big} 2>/dev/null && echo \"upload $s $(date +%s.%N)\" && \
         s=$(date +%s.%N) && j storage read-local-file {copy} 2>/dev/null && \
         echo \"download $s $(date +%s.%N)\" && rm -f {copy}",
        bench = quoted(&bench_calls),
        big = quoted(&big),
        copy = quoted(&copy),
    );
    // MiB/s of the transfer whose times follow `key` in `out`.
    let rate = |out: &str, key: &str| -> Result<f64> {
        let times: Vec<f64> = out
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .with_context(|| format!("no {key}time in {out:?}"))?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .with_context(|| format!("bad {key}time in {out:?}"))?;
        let [start, end] = times[..] else {
            bail!("bad {key}time in {out:?}");
        };
        Ok(mib as f64 / (end - start).max(0.001))
    };
    let measure = |no_direct: bool| -> Result<(CallFigures, f64, f64)> {
        let out = lab.shell(&client, no_direct, &script)?;
        let calls_line = out
            .lines()
            .find(|l| l.starts_with('{'))
            .with_context(|| format!("no call figures in {out:?}"))?;
        let figures = CallFigures {
            p50_us: json_number(calls_line, "p50_us")?,
            p99_us: json_number(calls_line, "p99_us")?,
            calls_per_sec: json_number(calls_line, "calls_per_sec")?,
        };
        Ok((figures, rate(&out, "upload ")?, rate(&out, "download ")?))
    };
    let (direct, direct_up, direct_down) = measure(false)?;
    let (routed, routed_up, routed_down) = measure(true)?;
    drop(exporter);
    drop(controller);

    println!(
        "== distributed mode: direct path vs router (loopback; unary power.on, {mib} MiB up and down)"
    );
    if on_tmpfs {
        println!("(the image, the exporter's medium and the downloaded copy are on tmpfs)");
    }
    println!(
        "{:<28} {:>10} {:>10} {:>12} {:>14} {:>16}",
        "", "p50 (µs)", "p99 (µs)", "calls/s", "upload MiB/s", "download MiB/s"
    );
    for (name, f, up, down) in [
        ("direct (per-lease mTLS)", direct, direct_up, direct_down),
        ("via router", routed, routed_up, routed_down),
    ] {
        println!(
            "{:<28} {:>10.1} {:>10.1} {:>12.0} {:>14.0} {:>16.0}",
            name, f.p50_us, f.p99_us, f.calls_per_sec, up, down
        );
    }
    println!(
        "direct: {:.1}x lower p50 latency, {:.1}x upload and {:.1}x download throughput",
        routed.p50_us / direct.p50_us.max(0.001),
        direct_up / routed_up.max(0.001),
        direct_down / routed_down.max(0.001)
    );
    Ok(())
}
