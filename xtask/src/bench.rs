//! `cargo xtask bench`: our figures next to the upstream Python tools', measured in one run.
//!
//! Performance claims live here, never in timed test assertions.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::{
    interop::ensure_venv,
    procs::{self, Background},
};

const CONFIG: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata: {namespace: default, name: bench}
endpoint: \"\"
token: \"\"
export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
";

/// Call latency and throughput figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallFigures {
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// Calls per second.
    pub calls_per_sec: f64,
}

/// The number after `"key":` in a one-line JSON object (xtask has no JSON dependency).
pub fn json_number(line: &str, key: &str) -> Result<f64> {
    let pat = format!("\"{key}\":");
    let rest = line
        .split(&pat)
        .nth(1)
        .with_context(|| format!("no {key} in {line:?}"))?;
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end]
        .trim()
        .parse()
        .with_context(|| format!("bad {key} in {line:?}"))
}

pub(crate) fn parse_figures(line: &str) -> Result<CallFigures> {
    Ok(CallFigures {
        p50_us: json_number(line, "p50_us")?,
        p99_us: json_number(line, "p99_us")?,
        calls_per_sec: json_number(line, "calls_per_sec")?,
    })
}

/// The packages [`build_release`] builds (all their binaries and examples, one cargo command,
/// so that the benchmarks and `cargo xtask images` share one release build).
pub(crate) const RELEASE_PACKAGES: &[&str] = &[
    "jumpstarter-cli",
    "jumpstarter-controller",
    "jumpstarter-router",
];

/// Builds every release binary and example the benchmarks use, with one cargo command,
/// and returns `target/release`.
///
/// Every benchmark builds through this one command on purpose: cargo unifies the features of
/// shared dependencies over the packages and targets one command selects, so benchmarks that
/// each built their own subset (the CLI alone, the CLI with the controller, with or without
/// examples) rebuilt tonic, rustls and their kin in release mode each time they ran one
/// after the other.
pub(crate) fn build_release() -> Result<PathBuf> {
    let mut args = vec!["build", "--release", "--quiet"];
    for package in RELEASE_PACKAGES {
        args.extend(["-p", package]);
    }
    args.extend(["--bins", "--examples"]);
    crate::cargo(&args)?;
    Ok(crate::target_dir().join("release"))
}

/// Starts a `jmp run` (ours or upstream) on loopback; returns it with its port.
pub(crate) fn start_exporter(
    jmp: &PathBuf,
    config: &PathBuf,
    ours: bool,
    work: &std::path::Path,
) -> Result<(Background, u16)> {
    let mut c = Command::new(jmp);
    c.env("JMP_CLIENT_CONFIG_HOME", work.join("config"))
        .env("JMP_LOG", "warn");
    if ours {
        return procs::start_our_exporter(c, config, &[]);
    }
    let port = procs::free_port()?;
    c.args(["run", "--exporter-config"]).arg(config).args([
        "--tls-grpc-listener",
        &format!("127.0.0.1:{port}"),
        "--tls-grpc-insecure",
    ]);
    let bg = Background::start("exporter", c)?;
    procs::wait_port(port, Duration::from_secs(60))?;
    Ok((bg, port))
}

/// Runs the benchmarks. `--quick` uses small counts (a smoke run).
pub fn run(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let calls = if quick { 300 } else { 5000 };
    let py_calls = if quick { 100 } else { 1000 };
    let rel = build_release()?;
    let venv = ensure_venv()?;
    let work = crate::interop::tempfile_dir::Dir::new("jmp-bench")?;
    let config = work.path().join("exporter.yaml");
    std::fs::write(&config, CONFIG)?;

    println!("== unary driver calls (power.on), direct TCP on loopback, plaintext");
    let (ours_exporter, port) = start_exporter(&rel.join("jmp"), &config, true, work.path())?;
    let host = format!("127.0.0.1:{port}");
    let run_rs_on = |host: &str, conc: usize| -> Result<CallFigures> {
        let mut c = Command::new(rel.join("examples/bench_calls"));
        c.args([host, &calls.to_string(), &conc.to_string()])
            .env("JMP_GRPC_INSECURE", "1");
        let out = procs::run(c, Duration::from_secs(300))?;
        if out.code != 0 {
            bail!("bench_calls failed: {}", out.stderr);
        }
        parse_figures(out.stdout.trim())
    };
    let ours = run_rs_on(&host, 1)?;
    let ours_conc = run_rs_on(&host, 16)?;
    drop(ours_exporter);
    let floor = floor(&rel, calls)?;

    let (py_exporter, py_port) =
        start_exporter(&venv.join("bin/jmp"), &config, false, work.path())?;
    let mut c = Command::new(venv.join("bin/python"));
    c.arg(crate::workspace_root().join("xtask/interop/bench_calls.py"))
        .arg(py_calls.to_string())
        .env("JUMPSTARTER_HOST", format!("127.0.0.1:{py_port}"))
        .env("JMP_GRPC_INSECURE", "1")
        .env("JMP_DRIVERS_ALLOW", "UNSAFE");
    let out = procs::run(c, Duration::from_secs(600))?;
    if out.code != 0 {
        bail!("python bench failed: {}", out.stderr);
    }
    let py = parse_figures(out.stdout.trim())?;
    drop(py_exporter);

    println!(
        "{:<44} {:>10} {:>10} {:>12}",
        "", "p50 (µs)", "p99 (µs)", "calls/s"
    );
    let row = |name: &str, f: &CallFigures| {
        println!(
            "{:<44} {:>10.1} {:>10.1} {:>12.0}",
            name, f.p50_us, f.p99_us, f.calls_per_sec
        )
    };
    row("ours (Rust client -> Rust exporter)", &ours);
    row("ours, 16 concurrent callers", &ours_conc);
    row("upstream (Python client -> Python exporter)", &py);
    row("floor: tonic alone (grpc.health Check)", &floor);
    println!(
        "ratio: {:.1}x lower p50 latency, {:.1}x throughput (sequential), {:.1}x (concurrent vs Python)",
        py.p50_us / ours.p50_us.max(0.001),
        ours.calls_per_sec / py.calls_per_sec.max(0.001),
        ours_conc.calls_per_sec / py.calls_per_sec.max(0.001)
    );
    println!(
        "floor: the same round trip with no Jumpstarter code; ours adds {:.1} µs at p50",
        ours.p50_us - floor.p50_us
    );
    println!("targets: p50 < 100 µs, throughput >= 20x Python");
    Ok(())
}

/// The gRPC stack's own unary round trip on this machine: tonic's health service in one
/// process, called from another, as `bench_calls` calls our exporter.
fn floor(rel: &Path, calls: usize) -> Result<CallFigures> {
    let mut serve = Command::new(rel.join("examples/bench_floor"));
    serve.arg("serve");
    let mut server = procs::Background::start("bench_floor serve", serve)?;
    let line = server.wait_for_line("listening on", Duration::from_secs(30))?;
    let port = line
        .rsplit(' ')
        .next()
        .map(str::trim)
        .unwrap_or_default()
        .to_string();
    let mut c = Command::new(rel.join("examples/bench_floor"));
    c.args(["call", port.as_str(), &calls.to_string()]);
    let out = procs::run(c, Duration::from_secs(300))?;
    if out.code != 0 {
        bail!("bench_floor failed: {}", out.stderr);
    }
    parse_figures(out.stdout.trim())
}
