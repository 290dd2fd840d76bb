//! `cargo xtask bench` part (alone: `cargo xtask bench-console [--quick]`): serial consoles
//! and port forwarding, ours next to upstream's in the same run.
//!
//! - Console: bytes per second through `connect` on `loop://` and on a pty (the
//!   `bench_console pty-echo` example on the other side sends back what it gets), and the
//!   round trip of one 16-byte line. Ours: the `bench_console console` example against our
//!   `jmp run`; upstream: `interop/bench_console.py` (its `stream()` API) against upstream's
//!   `jmp run`. Both exporters are local, on loopback TCP.
//! - Port forwarding: `j net forward-tcp 0` to a local sink (`bench_console sink`), timed by
//!   `bench_console send`, as a fraction of plain loopback TCP to the same sink in the same
//!   run: ours and upstream's `j` against their local exporters, and ours in distributed
//!   mode (our controller and router, our exporter) on the direct path (`j` connecting to it
//!   itself, and `j` through the shell's socket, which relays over it) and via the router.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    bench::json_number,
    bench_direct::Lab,
    procs::{self, Background},
};

const START: Duration = Duration::from_secs(60);

/// The exporter config: `loop` and `pty` consoles, `net` to the sink.
fn config(pty_link: &Path, sink_port: u16) -> String {
    format!(
        "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata: {{namespace: default, name: bench-console}}
endpoint: \"\"
token: \"\"
export:
{}",
        export(pty_link, sink_port)
    )
}

fn export(pty_link: &Path, sink_port: u16) -> String {
    format!(
        "  loop:
    type: jumpstarter_driver_pyserial.driver.PySerial
    config:
      url: loop://
  pty:
    type: jumpstarter_driver_pyserial.driver.PySerial
    config:
      url: {}
  net:
    type: jumpstarter_driver_network.driver.TcpNetwork
    config:
      host: 127.0.0.1
      port: {sink_port}
",
        pty_link.display()
    )
}

/// Console figures.
#[derive(Debug, Clone, Copy)]
struct Console {
    mib_per_sec: f64,
    rtt_p50_us: f64,
    rtt_p99_us: f64,
}

fn parse_console(out: &procs::Output, what: &str) -> Result<Console> {
    if out.code != 0 {
        bail!("{what} failed: {}{}", out.stdout, out.stderr);
    }
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("{what} printed no figures: {}", out.stdout))?;
    Ok(Console {
        mib_per_sec: json_number(line, "mib_per_sec")?,
        rtt_p50_us: json_number(line, "rtt_p50_us")?,
        rtt_p99_us: json_number(line, "rtt_p99_us")?,
    })
}

/// `bench_console send ADDR MIB`: MiB/s, and where the CPU went meanwhile.
fn send(example: &Path, addr: &str, mib: u64) -> Result<(f64, String)> {
    let mut c = Command::new(example);
    c.args(["send", addr, &mib.to_string()]);
    let before = CpuSnapshot::take();
    let out = procs::run(c, Duration::from_secs(600))?;
    let cpu = before.report(&CpuSnapshot::take(), mib);
    ensure!(out.code == 0, "bench_console send {addr}: {}", out.stderr);
    Ok((json_number(out.stdout.trim(), "mib_per_sec")?, cpu))
}

/// Starts `cmd` (a `j ... forward-tcp 0`, its stdout sent to stderr) and waits for the
/// local address it prints.
/// When `first` is given, a line containing it must come before the address.
fn start_forward(name: &str, cmd: Command, first: Option<&str>) -> Result<(Background, String)> {
    let mut fwd = Background::start(name, cmd)?;
    if let Some(first) = first {
        fwd.wait_for_line(first, START)?;
    }
    // The address is a line of its own (other lines may name loopback addresses too).
    for _ in 0..100 {
        let line = fwd.wait_for_line("127.0.0.1:", START)?;
        let line = line.trim();
        if line.starts_with("127.0.0.1:") && !line.contains(' ') {
            return Ok((fwd, line.to_string()));
        }
    }
    bail!("{name} printed no address line")
}

/// `sh -c 'exec J net forward-tcp 0 1>&2'` against `host`.
fn forward_cmd(j: &Path, host: &str, work: &Path) -> Command {
    let mut c = Command::new("sh");
    c.env("JUMPSTARTER_HOST", host)
        .env("JMP_GRPC_INSECURE", "1")
        .env("JMP_DRIVERS_ALLOW", "UNSAFE")
        .env("JMP_CLIENT_CONFIG_HOME", work.join("config"))
        .env("JMP_LOG", "warn")
        .arg("-c")
        .arg(r#"exec "$0" net forward-tcp 0 1>&2"#)
        .arg(j);
    c
}

/// Runs the console and forwarding benchmarks (`--quick`: 8 MiB, 200 lines, 128 MiB;
/// `--forward-only`: the forwards alone; `--compare DIR`: this build's distributed forwards
/// against the binaries in `DIR`, interleaved).
pub fn run(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    // `--forward-only`: the forwarding figures alone (no consoles, no upstream).
    let forward_only = args.iter().any(|a| a == "--forward-only");
    let (mib, lines, fwd_mib): (usize, usize, u64) = if quick {
        (8, 200, 128)
    } else {
        (64, 2000, 1024)
    };
    let rel = crate::bench::build_release()?;
    if let Some(i) = args.iter().position(|a| a == "--compare") {
        let other = args.get(i + 1).context(
            "--compare needs a directory of release binaries (jmp, j, jumpstarter-controller)",
        )?;
        return compare(&rel, Path::new(other), fwd_mib, if quick { 3 } else { 5 });
    }
    let venv = if forward_only {
        std::path::PathBuf::new()
    } else {
        crate::interop::ensure_venv()?
    };
    let example = rel.join("examples/bench_console");
    let work = crate::interop::tempfile_dir::Dir::new("jmp-bench-console")?;

    let link = work.path().join("pty-tty");
    let (pty, sink, sink_port) = start_pty_and_sink(&example, &link)?;
    let sink_addr = format!("127.0.0.1:{sink_port}");
    let cfg = work.path().join("exporter.yaml");
    std::fs::write(&cfg, config(&link, sink_port))?;

    // Plain loopback TCP first and last: the forwards are measured against their mean.
    let plain_before = send(&example, &sink_addr, fwd_mib)?;

    let (ours_exporter, port) =
        crate::bench::start_exporter(&rel.join("jmp"), &cfg, true, work.path())?;
    let host = format!("127.0.0.1:{port}");
    let ours_console = |driver: &str| -> Result<Console> {
        let mut c = Command::new(&example);
        c.args([
            "console",
            &host,
            driver,
            &mib.to_string(),
            &lines.to_string(),
        ])
        .env("JMP_GRPC_INSECURE", "1");
        parse_console(
            &procs::run(c, Duration::from_secs(600))?,
            &format!("bench_console console {driver}"),
        )
    };
    let consoles = if forward_only {
        None
    } else {
        Some((ours_console("loop")?, ours_console("pty")?))
    };
    let (fwd, addr) = start_forward(
        "our j net forward-tcp",
        forward_cmd(&rel.join("j"), &host, work.path()),
        None,
    )?;
    let ours_fwd = send(&example, &addr, fwd_mib)?;
    drop(fwd);
    drop(ours_exporter);

    let upstream = if forward_only {
        None
    } else {
        let (py_exporter, py_port) =
            crate::bench::start_exporter(&venv.join("bin/jmp"), &cfg, false, work.path())?;
        let py_host = format!("127.0.0.1:{py_port}");
        let py_console = |driver: &str| -> Result<Console> {
            let mut c = Command::new(venv.join("bin/python"));
            c.arg(crate::workspace_root().join("xtask/interop/bench_console.py"))
                .args([driver, &mib.to_string(), &lines.to_string()])
                .env("JUMPSTARTER_HOST", &py_host)
                .env("JMP_GRPC_INSECURE", "1")
                .env("JMP_DRIVERS_ALLOW", "UNSAFE");
            parse_console(
                &procs::run(c, Duration::from_secs(1200))?,
                &format!("bench_console.py {driver}"),
            )
        };
        let py_loop = py_console("loop")?;
        let py_pty = py_console("pty")?;
        let (fwd, addr) = start_forward(
            "(python) j net forward-tcp",
            forward_cmd(&venv.join("bin/j"), &py_host, work.path()),
            None,
        )?;
        let py_fwd = send(&example, &addr, fwd_mib)?;
        drop(fwd);
        drop(py_exporter);
        Some((py_loop, py_pty, py_fwd))
    };

    let dist = distributed(&rel, &link, sink_port, &example, fwd_mib)?;
    let plain_after = send(&example, &sink_addr, fwd_mib)?;
    let plain = (plain_before.0 + plain_after.0) / 2.0;
    drop(pty);
    drop(sink);

    if let (Some((ours_loop, ours_pty)), Some((py_loop, py_pty, _))) = (consoles, &upstream) {
        print_consoles(mib, lines, ours_loop, ours_pty, *py_loop, *py_pty);
    }
    println!(
        "== port forwarding: j net forward-tcp 0 -> TcpNetwork -> a local sink, {fwd_mib} MiB one way"
    );
    println!("{:<52} {:>10} {:>12}", "", "MiB/s", "of loopback");
    let mut rows = vec![
        ("plain loopback TCP, before", plain_before.clone()),
        ("plain loopback TCP, after", plain_after.clone()),
        (
            "plain loopback TCP to the sink (no forward)",
            (plain, String::new()),
        ),
        ("ours, local exporter (TCP)", ours_fwd),
    ];
    if let Some((_, _, py_fwd)) = upstream {
        rows.push(("upstream, local exporter (TCP)", py_fwd));
    }
    rows.push(("ours, distributed, direct path", dist.direct));
    rows.push((
        "ours, distributed, direct path via the shell's socket",
        dist.relayed,
    ));
    rows.push(("ours, distributed, via router", dist.routed));
    for (name, (v, _)) in &rows {
        println!(
            "{:<52} {:>10.0} {:>11.0}%",
            name,
            v,
            100.0 * v / plain.max(0.001)
        );
    }
    println!("target: ours direct >= 50% of loopback");
    println!("where the CPU went (both cores, per GiB forwarded):");
    for (name, (_, cpu)) in &rows {
        if !cpu.is_empty() {
            println!("  {name}: {cpu}");
        }
    }
    Ok(())
}

fn print_consoles(
    mib: usize,
    lines: usize,
    ours_loop: Console,
    ours_pty: Console,
    py_loop: Console,
    py_pty: Console,
) {
    println!(
        "== serial consoles: `connect` on loop:// and a pty, {mib} MiB each way at once; one 16-byte line round trip ({lines} lines)"
    );
    println!(
        "{:<46} {:>10} {:>14} {:>14}",
        "", "MiB/s", "rtt p50 (µs)", "rtt p99 (µs)"
    );
    for (name, f) in [
        ("ours, loop:// (Rust client -> Rust exporter)", ours_loop),
        ("upstream, loop:// (Python -> Python)", py_loop),
        ("ours, pty", ours_pty),
        ("upstream, pty", py_pty),
    ] {
        println!(
            "{:<46} {:>10.2} {:>14.1} {:>14.1}",
            name, f.mib_per_sec, f.rtt_p50_us, f.rtt_p99_us
        );
    }
    println!(
        "ratio: loop:// {:.1}x throughput, {:.1}x lower p50 round trip; pty {:.1}x throughput, {:.1}x lower p50 round trip",
        ours_loop.mib_per_sec / py_loop.mib_per_sec.max(0.001),
        py_loop.rtt_p50_us / ours_loop.rtt_p50_us.max(0.001),
        ours_pty.mib_per_sec / py_pty.mib_per_sec.max(0.001),
        py_pty.rtt_p50_us / ours_pty.rtt_p50_us.max(0.001),
    );
    println!("targets: >= 10x upstream's throughput, < half its latency");
}

/// The pty "board" (`bench_console pty-echo`, its tty linked at `link`) and the TCP sink;
/// returns both with the sink's port.
fn start_pty_and_sink(example: &Path, link: &Path) -> Result<(Background, Background, u16)> {
    let mut c = Command::new(example);
    c.arg("pty-echo").arg(link);
    let mut pty = Background::start("bench_console pty-echo", c)?;
    pty.wait_for_line("pty ready", START)?;
    let mut c = Command::new(example);
    c.arg("sink");
    let mut sink = Background::start("bench_console sink", c)?;
    let line = sink.wait_for_line("sink port ", START)?;
    let sink_port: u16 = line
        .rsplit(' ')
        .next()
        .and_then(|p| p.trim().parse().ok())
        .with_context(|| format!("the sink printed {line:?}"))?;
    Ok((pty, sink, sink_port))
}

/// `--compare DIR`: the distributed forwards of this build and of the binaries in `DIR`
/// (another build's `jmp`, `j` and `jumpstarter-controller`), interleaved over `rounds`
/// rounds with the order alternating, to the same sink; medians. For A/B of a change on a
/// noisy machine, where two separate runs do not compare.
fn compare(rel: &Path, other: &Path, mib: u64, rounds: usize) -> Result<()> {
    for bin in ["jmp", "j", "jumpstarter-controller"] {
        ensure!(
            other.join(bin).is_file(),
            "--compare {}: no {bin} in it",
            other.display()
        );
    }
    let example = rel.join("examples/bench_console");
    let work = crate::interop::tempfile_dir::Dir::new("jmp-bench-console-compare")?;
    let link = work.path().join("pty-tty");
    let (pty, sink, sink_port) = start_pty_and_sink(&example, &link)?;
    let sink_addr = format!("127.0.0.1:{sink_port}");
    let builds = [("this build", rel), ("--compare", other)];
    // [build][direct, router]
    let mut figures = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    let mut plain = Vec::new();
    for round in 0..rounds {
        plain.push(send(&example, &sink_addr, mib)?.0);
        for k in 0..2 {
            let b = (round + k) % 2;
            let Distributed { direct, routed, .. } =
                distributed(builds[b].1, &link, sink_port, &example, mib)?;
            println!(
                "round {}: {:<11} direct {:>6.0} MiB/s, router {:>6.0} MiB/s\n  direct: {}\n  router: {}",
                round + 1,
                builds[b].0,
                direct.0,
                routed.0,
                direct.1,
                routed.1
            );
            figures[b][0].push(direct.0);
            figures[b][1].push(routed.0);
        }
    }
    plain.push(send(&example, &sink_addr, mib)?.0);
    drop(pty);
    drop(sink);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let plain = median(&mut plain);
    println!(
        "== forwarding A/B, {mib} MiB one way, medians of {rounds} interleaved rounds; plain loopback {plain:.0} MiB/s"
    );
    println!("{:<44} {:>10} {:>12}", "", "MiB/s", "of loopback");
    for (b, (name, dir)) in builds.iter().enumerate() {
        for (k, path) in ["direct path", "via router"].iter().enumerate() {
            let v = median(&mut figures[b][k]);
            println!(
                "{:<44} {:>10.0} {:>11.0}%",
                format!("{name} ({}), {path}", dir.display()),
                v,
                100.0 * v / plain.max(0.001)
            );
        }
    }
    Ok(())
}

/// Our controller (in-process router), our exporter serving the bench drivers with its
/// direct listener, and `j net forward-tcp 0` in `jmp shell`: direct, direct through the
/// shell's socket, and `--no-direct`.
fn distributed(
    rel: &Path,
    link: &Path,
    sink_port: u16,
    example: &Path,
    mib: u64,
) -> Result<Distributed> {
    let lab = Lab {
        rel: rel.to_path_buf(),
        work: crate::interop::tempfile_dir::Dir::new("jmp-bench-console-dist")?,
    };
    let mut controller = lab.start_controller()?;
    let exporter = lab.admin_create("exporter", "bench-console", &["-l", "board=console"])?;
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
            &format!("\nexport:\n{}", export(link, sink_port)),
        ),
    )?;
    let client = lab.admin_create("client", "bench-console-client", &["--unsafe"])?;
    let mut run = lab.jmp();
    run.args(["run", "--exporter-config"])
        .arg(&exporter)
        .args(["--direct-listener", "127.0.0.1:0"])
        .env("JMP_LOG", "info");
    let mut exporter = Background::start("jmp run", run)?;
    exporter.wait_for_line("registered with controller", START)?;
    let measure = |path: Via| -> Result<(f64, String)> {
        let mut c = lab.jmp();
        c.arg("shell").arg("--client-config").arg(&client);
        c.args(["-l", "board=console"]);
        if path == Via::Router {
            c.arg("--no-direct");
        }
        // Without the shell's direct path file, `j` goes through the shell's socket, whose
        // relay then forwards every byte over the direct path.
        let unset = if path == Via::ShellRelay {
            "unset JMP_DIRECT_ENDPOINT; "
        } else {
            ""
        };
        c.args([
            "--",
            "sh",
            "-c",
            &format!("{unset}exec j net forward-tcp 0 1>&2"),
        ]);
        let want = if path == Via::Router {
            "via router"
        } else {
            "directly"
        };
        let (mut fwd, addr) = start_forward("jmp shell -- j net forward-tcp", c, Some(want))?;
        let v = send(example, &addr, mib)?;
        fwd.stop();
        Ok(v)
    };
    let direct = measure(Via::Direct)?;
    let relayed = measure(Via::ShellRelay)?;
    let routed = measure(Via::Router)?;
    drop(exporter);
    controller.stop();
    Ok(Distributed {
        direct,
        relayed,
        routed,
    })
}

/// How `j` in `jmp shell` reaches the exporter in [`distributed`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    /// `j` connects to the direct path itself.
    Direct,
    /// `j` goes through the shell's socket, which relays over the direct path.
    ShellRelay,
    /// `jmp shell --no-direct`: through the router.
    Router,
}

/// MiB/s and where the CPU went, for each path of [`distributed`].
struct Distributed {
    direct: (f64, String),
    relayed: (f64, String),
    routed: (f64, String),
}

/// CPU time spent while a measurement ran: the whole machine's (from `/proc/stat`) and per
/// command name (from `/proc/PID/stat` of the processes alive at both ends; one that
/// starts or ends in between counts only in the total).
struct CpuSnapshot {
    busy_ticks: u64,
    procs: std::collections::HashMap<u32, (String, u64)>,
}

impl CpuSnapshot {
    fn take() -> Self {
        let busy_ticks = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                let line = s.lines().next()?.to_string();
                // cpu user nice system idle iowait irq softirq steal ...
                let v: Vec<u64> = line
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect();
                Some(
                    v.iter()
                        .enumerate()
                        .filter(|(i, _)| *i != 3 && *i != 4)
                        .map(|(_, x)| x)
                        .sum(),
                )
            })
            .unwrap_or(0);
        let mut procs = std::collections::HashMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                    continue;
                };
                // pid (comm) state ppid ... utime(14) stime(15), counted after the ')'.
                let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                    continue;
                };
                let comm = stat[open + 1..close].to_string();
                let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
                let ticks = rest
                    .get(11)
                    .zip(rest.get(12))
                    .and_then(|(u, s)| Some(u.parse::<u64>().ok()? + s.parse::<u64>().ok()?));
                if let Some(t) = ticks {
                    procs.insert(pid, (comm, t));
                }
            }
        }
        Self { busy_ticks, procs }
    }

    /// "CPU s per GiB: total T (comm a, comm b, ...)" for `mib` moved since `self`.
    fn report(&self, after: &Self, mib: u64) -> String {
        let per_gib = |ticks: u64| ticks as f64 / 100.0 * 1024.0 / mib.max(1) as f64;
        let mut by_comm: std::collections::BTreeMap<String, u64> = Default::default();
        for (pid, (comm, t)) in &after.procs {
            if let Some((c0, t0)) = self.procs.get(pid)
                && c0 == comm
                && t > t0
            {
                *by_comm.entry(comm.clone()).or_default() += t - t0;
            }
        }
        let mut top: Vec<(String, u64)> = by_comm.into_iter().filter(|(_, t)| *t > 0).collect();
        top.sort_by_key(|b| std::cmp::Reverse(b.1));
        let parts: Vec<String> = top
            .iter()
            .take(6)
            .map(|(c, t)| format!("{c} {:.2}", per_gib(*t)))
            .collect();
        format!(
            "CPU s per GiB: all {:.2} ({})",
            per_gib(after.busy_ticks.saturating_sub(self.busy_ticks)),
            parts.join(", ")
        )
    }
}
