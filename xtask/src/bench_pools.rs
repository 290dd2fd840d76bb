//! `cargo xtask bench-pools` (part of `cargo xtask bench`): virtual target pools (the
//! `local` provisioner, MockPower replicas) on our release controller, in one run:
//!
//! - warm pool: `jmp shell -l pool=warm -- true` on a set that keeps replicas ready
//!   (`minAvailableReplicas: 2`, `InPlaceReuse`) next to the same command on a static
//!   exporter (`-l board=bench`), interleaved; goal: the pool within 1.5x of the static one;
//! - cold start: the same command on a set at zero replicas (`minAvailableReplicas: 0`), so
//!   the lease waits while the controller starts a `jmp run`; goal: under 1 s;
//! - burst: 20 `jmp shell` at once on a set of `maxReplicas: 20` at zero: every lease
//!   granted, the time from each `jmp shell` start to its command running (p50, p99), the
//!   controller's RSS and CPU (from `/proc`) over the burst, and the time until every replica
//!   is gone once the leases ended (`scaleDownCooldown: 2s`);
//! - QEMU cold start: a lease on a set of QEMU boards at zero (the board of `cargo xtask
//!   qemu-board`), whose command flashes the board, powers it on and waits for its console to
//!   say it is ready: the time from `jmp shell` to its command (what the pool adds; goal:
//!   under 1 s) and the boot itself (flash, power on, ready), which a static exporter's board
//!   takes too.
//!
//! Medians of several runs; nothing here is asserted against a time. `--quick`: fewer runs;
//! `--debug`: the debug binaries (no release build; slower in absolute terms); `--no-qemu`:
//! without the QEMU part (which installs QEMU and builds the board when missing).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    interop::tempfile_dir::Dir,
    procs::{self, Background},
};

/// What the controller prints once it serves.
const READY_LINE: &str = "jumpstarter-controller ready:";
const TIMEOUT: Duration = Duration::from_secs(120);
/// Leases in the burst, and the burst set's `maxReplicas`.
const BURST: usize = 20;

const POOLS: &str = "apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: VirtualTargetClass
metadata: {name: local, namespace: default}
spec:
  provisioner: local
---
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata: {name: warm, namespace: default}
spec:
  virtualTargetClassName: local
  maxReplicas: 4
  minAvailableReplicas: 2
  recycleStrategy: InPlaceReuse
  selector: {matchLabels: {pool: warm}}
  template:
    metadata: {labels: {pool: warm}}
    spec:
      drivers:
        - {name: power, type: jumpstarter_driver_power.driver.MockPower}
---
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata: {name: cold, namespace: default}
spec:
  virtualTargetClassName: local
  maxReplicas: 1
  minAvailableReplicas: 0
  recycleStrategy: ExitAndReplace
  scaleDownCooldown: 1s
  selector: {matchLabels: {pool: cold}}
  template:
    metadata: {labels: {pool: cold}}
    spec:
      drivers:
        - {name: power, type: jumpstarter_driver_power.driver.MockPower}
---
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata: {name: burst, namespace: default}
spec:
  virtualTargetClassName: local
  maxReplicas: 20
  minAvailableReplicas: 0
  recycleStrategy: InPlaceReuse
  scaleDownCooldown: 2s
  selector: {matchLabels: {pool: burst}}
  template:
    metadata: {labels: {pool: burst}}
    spec:
      drivers:
        - {name: power, type: jumpstarter_driver_power.driver.MockPower}
";

/// The lab of this benchmark: the release controller with its pools, a client and a static
/// exporter.
struct Lab {
    dir: PathBuf,
    jmp: PathBuf,
    client: PathBuf,
    controller: Background,
    _exporter: Background,
}

impl Lab {
    /// Our `jmp` with this run's config home (where the controller writes its admin config).
    fn jmp(&self) -> Command {
        ours(&self.jmp, &self.dir)
    }

    /// `jmp admin ARGS`, failing on a non-zero exit; its stdout.
    fn admin(&self, args: &[&str]) -> Result<String> {
        let mut c = self.jmp();
        c.arg("admin").args(args);
        let out = procs::run(c, TIMEOUT)?;
        if out.code != 0 {
            bail!("jmp admin {} failed: {}", args.join(" "), out.stderr.trim());
        }
        Ok(out.stdout)
    }

    /// `jmp shell -l SELECTOR -- CMD...`.
    fn shell(&self, selector: &str, cmd: &[&str]) -> Command {
        let mut c = self.jmp();
        c.arg("shell")
            .arg("--client-config")
            .arg(&self.client)
            .args(["-l", selector, "--"])
            .args(cmd);
        c
    }

    /// The AVAILABLE column of `jmp admin get exportersets SET`.
    fn available(&self, set: &str) -> Result<u32> {
        let out = self.admin(&["get", "exportersets", set])?;
        let row = out
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|cols| cols.first() == Some(&set))
            .with_context(|| format!("no row for {set}:\n{out}"))?;
        row.get(4)
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no AVAILABLE count for {set}:\n{out}"))
    }

    /// The replicas of `set` whose process runs or is being stopped: their directories
    /// under the controller's `pools/` (removed once the process is gone).
    fn replica_dirs(&self, set: &str) -> usize {
        std::fs::read_dir(self.dir.join("data/pools/default"))
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with(&format!("{set}-"))
                    })
                    .count()
            })
            .unwrap_or(0)
    }

    /// Polls `ok` every 50 ms for at most `limit`; how long it took.
    fn wait(&self, what: &str, limit: Duration, ok: impl Fn() -> Result<bool>) -> Result<Duration> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if ok()? {
                return Ok(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("{what}: not within {limit:?}")
    }
}

/// Our `jmp` with this run's config home.
fn ours(jmp: &Path, dir: &Path) -> Command {
    let mut c = Command::new(jmp);
    c.env("JMP_CLIENT_CONFIG_HOME", dir.join("rs-config"))
        .env_remove("JUMPSTARTER_HOST")
        .env_remove("JMP_ADMIN_CONFIG")
        .current_dir(dir);
    c
}

/// Starts the controller, makes the client and the static exporter, applies the pools.
fn lab(rel: &Path, dir: &Path) -> Result<Lab> {
    let jmp = rel.join("jmp");
    let mut c = Command::new(rel.join("jumpstarter-controller"));
    c.arg("--data-dir")
        .arg(dir.join("data"))
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "off", "--admin-config"])
        .arg(dir.join("rs-config/admin.yaml"))
        .arg("--pools-jmp")
        .arg(&jmp)
        .args([
            "--pools-stop-replicas-on-exit",
            "--pools-replicas-exit-with-controller",
        ])
        .env("RUST_LOG", "warn");
    let mut controller = Background::start("jumpstarter-controller", c)?;
    controller.wait_for_line(READY_LINE, Duration::from_secs(60))?;

    let client = dir.join("client.yaml");
    let exporter = dir.join("exporter.yaml");
    let run_admin = |args: &[&str], out: &Path| -> Result<()> {
        let mut c = ours(&jmp, dir);
        c.arg("admin")
            .args(args)
            .args(["--nointeractive", "--out"])
            .arg(out);
        let o = procs::run(c, TIMEOUT)?;
        ensure!(
            o.code == 0,
            "jmp admin {} failed: {}",
            args.join(" "),
            o.stderr.trim()
        );
        Ok(())
    };
    run_admin(&["create", "client", "bench", "--unsafe"], &client)?;
    run_admin(
        &["create", "exporter", "bench-ex", "-l", "board=bench"],
        &exporter,
    )?;
    let text = std::fs::read_to_string(&exporter)?;
    ensure!(
        text.contains("\nexport:\n"),
        "{} has no empty `export:`:\n{text}",
        exporter.display()
    );
    std::fs::write(
        &exporter,
        text.replace(
            "\nexport:\n",
            "\nexport:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n",
        ),
    )?;
    let mut c = ours(&jmp, dir);
    c.arg("run")
        .arg("--exporter-config")
        .arg(&exporter)
        .env("JMP_LOG", "info");
    let mut run = Background::start("jmp run", c)?;
    run.wait_for_line("registered with controller", Duration::from_secs(60))?;

    let lab = Lab {
        dir: dir.to_path_buf(),
        jmp,
        client,
        controller,
        _exporter: run,
    };
    let pools = dir.join("pools.yaml");
    std::fs::write(&pools, POOLS)?;
    lab.admin(&["apply", "-f", &pools.to_string_lossy()])?;
    Ok(lab)
}

/// Wall time of `cmd`, failing on a non-zero exit.
fn timed(what: &str, cmd: Command) -> Result<Duration> {
    let start = Instant::now();
    let out = procs::run(cmd, TIMEOUT)?;
    let took = start.elapsed();
    if out.code != 0 {
        bail!("{what} failed (exit {}): {}", out.code, out.stderr.trim());
    }
    Ok(took)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The value at quantile `q` (0..=1) of sorted `v` (nearest rank).
fn quantile(v: &[Duration], q: f64) -> Duration {
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A process's resident set and peak resident set (KiB), from `/proc/PID/status`.
fn rss_kib(pid: u32) -> Result<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// A process's CPU time so far (user + system), from `/proc/PID/stat`.
fn cpu_time(pid: u32) -> Result<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .with_context(|| format!("bad /proc/{pid}/stat: {text:?}"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat; here 11 and 12 (0-based, from state).
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("bad /proc/{pid}/stat: {text:?}"))
    };
    let hz = clock_ticks();
    Ok(Duration::from_secs_f64(
        (ticks(11)? + ticks(12)?) as f64 / hz,
    ))
}

/// `getconf CLK_TCK` (100 on Linux unless it says otherwise).
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Runs the pool benchmark. `--quick`: 3 runs of each lease instead of 11 (7 cold);
/// `--debug`: the debug binaries.
pub fn run(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let (runs, cold_runs) = if quick { (3, 3) } else { (11, 7) };
    let rel = if args.iter().any(|a| a == "--debug") {
        crate::cargo(&[
            "build",
            "--quiet",
            "-p",
            "jumpstarter-cli",
            "-p",
            "jumpstarter-controller",
            "--bins",
        ])?;
        crate::target_dir().join("debug")
    } else {
        crate::bench::build_release()?
    };
    let work = Dir::new("jmp-bench-pools")?;
    let lab = lab(&rel, work.path())?;

    println!("== virtual target pools (local provisioner, MockPower replicas)");
    lab.wait("2 warm replicas available", TIMEOUT, || {
        Ok(lab.available("warm")? >= 2)
    })?;
    // One lease each first, not counted (page cache, connections).
    timed(
        "jmp shell -l board=bench",
        lab.shell("board=bench", &["true"]),
    )?;
    timed("jmp shell -l pool=warm", lab.shell("pool=warm", &["true"]))?;
    let (mut static_t, mut warm_t) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        lab.wait("2 warm replicas available", TIMEOUT, || {
            Ok(lab.available("warm")? >= 2)
        })?;
        static_t.push(timed(
            "jmp shell -l board=bench",
            lab.shell("board=bench", &["true"]),
        )?);
        warm_t.push(timed(
            "jmp shell -l pool=warm",
            lab.shell("pool=warm", &["true"]),
        )?);
    }
    let (static_m, warm_m) = (median(static_t), median(warm_t));

    let mut cold_t = Vec::new();
    for _ in 0..cold_runs {
        lab.wait("pool cold at zero replicas", TIMEOUT, || {
            Ok(lab.replica_dirs("cold") == 0)
        })?;
        cold_t.push(timed(
            "jmp shell -l pool=cold",
            lab.shell("pool=cold", &["true"]),
        )?);
    }
    let cold_m = median(cold_t);

    println!("{:<52} {:>12}", "lease to command (median)", "ms");
    println!(
        "{:<52} {:>12.1}",
        format!("static exporter: jmp shell -l board=bench -- true ({runs})"),
        ms(static_m)
    );
    println!(
        "{:<52} {:>12.1}",
        format!("warm pool: jmp shell -l pool=warm -- true ({runs})"),
        ms(warm_m)
    );
    println!(
        "{:<52} {:>12.1}",
        format!("cold pool (0 replicas): -l pool=cold ({cold_runs})"),
        ms(cold_m)
    );
    println!(
        "warm pool / static exporter: {:.2}x (goal: within 1.5x); cold start {:.0} ms (goal: under 1 s)",
        warm_m.as_secs_f64() / static_m.as_secs_f64().max(1e-9),
        ms(cold_m)
    );

    burst(&lab)?;
    if !args.iter().any(|a| a == "--no-qemu") {
        qemu_cold(&lab, if quick { 1 } else { 3 })?;
    }
    Ok(())
}

/// The set of QEMU boards at zero replicas; `{accel}` is filled in.
const QEMU_POOL: &str = "apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata: {name: qemu, namespace: default}
spec:
  virtualTargetClassName: local
  maxReplicas: 1
  minAvailableReplicas: 0
  recycleStrategy: ExitAndReplace
  scaleDownCooldown: 1s
  selector: {matchLabels: {pool: qemu}}
  template:
    metadata: {labels: {pool: qemu}}
    spec:
      drivers:
        - name: board
          type: jumpstarter_driver_qemu.driver.Qemu
          config: {arch: x86_64, accel: {accel}, smp: 1, mem: 256M}
";

/// What the board prints on its console once booted.
const BOARD_READY: &str = "jumpstarter-board: ready";

/// `runs` leases on a set of QEMU boards at zero, each flashing, booting and waiting for the
/// board: the time to the command (the pool's part) and the boot (the board's part).
fn qemu_cold(lab: &Lab, runs: usize) -> Result<()> {
    let image = crate::qemu_board::prepare()?;
    // TCG unless told otherwise, as the QEMU tests (nested KVM hangs some hosts' BIOS).
    let accel = std::env::var("JUMPSTARTER_TEST_QEMU_ACCEL").unwrap_or_else(|_| "tcg".into());
    let pool = lab.dir.join("qemu-pool.yaml");
    std::fs::write(&pool, QEMU_POOL.replace("{accel}", &accel))?;
    lab.admin(&["apply", "-f", &pool.to_string_lossy()])?;
    let j = lab
        .jmp
        .parent()
        .context("the jmp binary has no directory")?
        .join("j");
    let dir = lab.dir.join("qemu");
    std::fs::create_dir_all(&dir)?;
    println!(
        "== QEMU board pool ({accel}), cold: jmp shell -l pool=qemu, flash, power on, wait for the board"
    );
    let (mut to_cmd, mut boot) = (Vec::new(), Vec::new());
    for i in 0..runs {
        lab.wait("QEMU pool at zero replicas", TIMEOUT, || {
            Ok(lab.replica_dirs("qemu") == 0)
        })?;
        let started = dir.join(format!("started-{i}"));
        let booted = dir.join(format!("booted-{i}"));
        let script = format!(
            "date +%s%N > {started}; \
             {j} board flasher flash {image} >/dev/null && {j} board power on && \
             timeout 300 {j} board console pipe --no-input </dev/null 2>/dev/null \
               | grep -m1 -q '{BOARD_READY}' && \
             date +%s%N > {booted}",
            started = started.display(),
            booted = booted.display(),
            j = j.display(),
            image = image.display(),
        );
        let at = SystemTime::now();
        let took = timed(
            "jmp shell -l pool=qemu (flash, boot)",
            lab.shell("pool=qemu", &["sh", "-c", &script]),
        )?;
        let stamp = |path: &Path| -> Result<SystemTime> {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("the command did not write {}", path.display()))?;
            let ns: u64 = text
                .trim()
                .parse()
                .with_context(|| format!("bad time in {}: {text:?}", path.display()))?;
            Ok(UNIX_EPOCH + Duration::from_nanos(ns))
        };
        let (s, b) = (stamp(&started)?, stamp(&booted)?);
        let cmd = s.duration_since(at).unwrap_or_default();
        let up = b.duration_since(s).unwrap_or_default();
        println!(
            "  run {}: {:.0} ms to the command, board ready {:.1} s later ({:.1} s in all)",
            i + 1,
            ms(cmd),
            up.as_secs_f64(),
            took.as_secs_f64()
        );
        to_cmd.push(cmd);
        boot.push(up);
    }
    let (cmd_m, boot_m) = (median(to_cmd), median(boot));
    println!(
        "QEMU cold start ({runs} runs, medians): {:.0} ms to the command + {:.1} s boot (flash, power on, ready) (goal: boot time plus under 1 s)",
        ms(cmd_m),
        boot_m.as_secs_f64()
    );
    Ok(())
}

/// `BURST` leases at once on the `burst` set at zero.
fn burst(lab: &Lab) -> Result<()> {
    let dir = lab.dir.join("burst");
    std::fs::create_dir_all(&dir)?;
    let release = dir.join("release");
    let pid = lab.controller.pid();
    let (rss_before, _) = rss_kib(pid)?;
    let cpu_before = cpu_time(pid)?;
    let wall = Instant::now();

    // Each shell's command writes the wall clock (ns) when it runs, then holds its lease
    // until `release` exists (bounded: 2 minutes), so every lease needs a replica of its own.
    let mut shells: Vec<(SystemTime, Child)> = Vec::with_capacity(BURST);
    for i in 0..BURST {
        let script = format!(
            "date +%s%N > {granted}.tmp && mv {granted}.tmp {granted}; \
             for _ in $(seq 1200); do [ -e {release} ] && exit 0; sleep 0.1; done; exit 1",
            granted = dir.join(format!("granted-{i}")).display(),
            release = release.display(),
        );
        let mut c = lab.shell("pool=burst", &["sh", "-c", &script]);
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let started = SystemTime::now();
        shells.push((started, c.spawn().context("starting jmp shell")?));
    }
    let result = (|| -> Result<()> {
        let mut rss_peak = rss_before;
        let start = Instant::now();
        loop {
            rss_peak = rss_peak.max(rss_kib(pid)?.0);
            let granted = (0..BURST)
                .filter(|i| dir.join(format!("granted-{i}")).exists())
                .count();
            if granted == BURST {
                break;
            }
            if start.elapsed() > Duration::from_secs(180) {
                bail!("only {granted} of {BURST} burst leases granted within 180 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let all_granted = wall.elapsed();
        let cpu = cpu_time(pid)?.saturating_sub(cpu_before);
        let replicas = lab.replica_dirs("burst");
        let mut grants = Vec::with_capacity(BURST);
        for (i, (started, _)) in shells.iter().enumerate() {
            let path = dir.join(format!("granted-{i}"));
            let text = std::fs::read_to_string(&path)?;
            let ns: u128 = text
                .trim()
                .parse()
                .with_context(|| format!("bad time in {}: {text:?}", path.display()))?;
            let at = UNIX_EPOCH + Duration::from_nanos(u64::try_from(ns)?);
            grants.push(at.duration_since(*started).unwrap_or_default());
        }
        grants.sort();
        std::fs::write(&release, "")?;
        let released = Instant::now();
        println!(
            "burst: {BURST} jmp shell at once on a pool at zero (maxReplicas {BURST}): all granted, {replicas} replicas"
        );
        println!(
            "  jmp shell start to its command running: p50 {:.0} ms, p99 {:.0} ms; all within {:.0} ms",
            ms(quantile(&grants, 0.5)),
            ms(quantile(&grants, 0.99)),
            ms(all_granted)
        );
        println!(
            "  controller: RSS {:.1} MiB before, {:.1} MiB peak during the burst; CPU {:.2} s over {:.1} s ({:.0}% of a core)",
            rss_before as f64 / 1024.0,
            rss_peak as f64 / 1024.0,
            cpu.as_secs_f64(),
            all_granted.as_secs_f64(),
            100.0 * cpu.as_secs_f64() / all_granted.as_secs_f64().max(1e-9)
        );
        lab.wait(
            "every burst replica gone after the cooldown",
            TIMEOUT,
            || Ok(lab.replica_dirs("burst") == 0),
        )?;
        println!(
            "  every replica gone {:.1} s after the leases were let go (scaleDownCooldown 2s)",
            released.elapsed().as_secs_f64()
        );
        Ok(())
    })();
    // Let every shell end (their command exits once `release` exists); kill stragglers.
    let _ = std::fs::write(&release, "");
    let mut failed = 0;
    for (_, mut child) in shells {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        if !status.is_some_and(|s| s.success()) {
            failed += 1;
        }
    }
    result?;
    ensure!(failed == 0, "{failed} of {BURST} burst jmp shell failed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=20).map(Duration::from_millis).collect();
        assert_eq!(super::quantile(&v, 0.5), Duration::from_millis(10));
        assert_eq!(super::quantile(&v, 0.99), Duration::from_millis(20));
        assert_eq!(super::quantile(&v[..1], 0.5), Duration::from_millis(1));
    }

    #[test]
    fn own_cpu_time_and_rss_are_read_from_proc() {
        let pid = std::process::id();
        let (rss, peak) = super::rss_kib(pid).unwrap();
        assert!(rss > 0 && peak >= rss);
        assert!(super::cpu_time(pid).is_ok());
        assert!(super::rss_kib(u32::MAX).is_err());
    }
}
