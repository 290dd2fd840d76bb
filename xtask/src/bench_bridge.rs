//! `cargo xtask bench` part: the overhead of serving a Python driver through our exporter's
//! bridge (`docs/python-drivers.md`), against the same Python driver under upstream's
//! exporter alone, in the same run.
//!
//! The driver is upstream's Python MockPower (sent to Python with `JMP_PYTHON_DRIVERS`, as
//! we have a Rust one), at `power`. Each round times unary `power.on` calls with our Rust
//! client (`bench_calls`) and with upstream's Python client (`bench_calls.py`) against our
//! exporter (TCP, then the bridge's Unix socket to the Python child) and against upstream's
//! `jmp run` (TCP); rounds alternate, and the medians of the rounds' p50s are compared.
//! Target: the bridge no slower than upstream alone by more than 20%.
//!
//! `cargo xtask bench-bridge [--quick] [--debug]`: `--debug` times the debug binaries (no
//! release build; the exporter is then slower than it ships).

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{Result, bail};

use crate::{
    bench::{CallFigures, json_number},
    interop::ensure_venv,
    procs::{self, Background},
};

const CONFIG: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata: {namespace: default, name: bench-bridge}
endpoint: \"\"
token: \"\"
export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
";

/// The target: the bridge's p50 at most this many times upstream's.
const TARGET_RATIO: f64 = 1.2;

/// Medians of the rounds' figures.
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => 0.0,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

fn figures(line: &str) -> Result<CallFigures> {
    Ok(CallFigures {
        p50_us: json_number(line, "p50_us")?,
        p99_us: json_number(line, "p99_us")?,
        calls_per_sec: json_number(line, "calls_per_sec")?,
    })
}

/// Runs the benchmark.
pub fn run(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let debug = args.iter().any(|a| a == "--debug");
    let (calls, py_calls, rounds) = if quick {
        (300, 200, 3)
    } else {
        (2000, 1000, 5)
    };
    let bin = if debug {
        crate::cargo(&[
            "build",
            "--quiet",
            "-p",
            "jumpstarter-cli",
            "--bin",
            "jmp",
            "--example",
            "bench_calls",
        ])?;
        crate::target_dir().join("debug")
    } else {
        crate::bench::build_release()?
    };
    let venv = ensure_venv()?;
    let work = crate::interop::tempfile_dir::Dir::new("jmp-bench-bridge")?;
    let config = work.path().join("exporter.yaml");
    std::fs::write(&config, CONFIG)?;

    let start = |ours: bool| -> Result<(Background, u16)> {
        let jmp: PathBuf = if ours {
            bin.join("jmp")
        } else {
            venv.join("bin/jmp")
        };
        let mut c = Command::new(jmp);
        c.env("JMP_CLIENT_CONFIG_HOME", work.path().join("config"))
            .env("JMP_LOG", "warn")
            .env("JMP_PYTHON", venv.join("bin/python3"))
            .env(
                "JMP_PYTHON_DRIVERS",
                "jumpstarter_driver_power.driver.MockPower",
            );
        if ours {
            return procs::start_our_exporter(c, &config, &[]);
        }
        let port = procs::free_port()?;
        c.args(["run", "--exporter-config"]).arg(&config).args([
            "--tls-grpc-listener",
            &format!("127.0.0.1:{port}"),
            "--tls-grpc-insecure",
        ]);
        let bg = Background::start("(python) jmp run", c)?;
        procs::wait_port(port, Duration::from_secs(60))?;
        Ok((bg, port))
    };
    let rust_client = |port: u16| -> Result<CallFigures> {
        let mut c = Command::new(bin.join("examples/bench_calls"));
        c.args([format!("127.0.0.1:{port}"), calls.to_string(), "1".into()])
            .env("JMP_GRPC_INSECURE", "1");
        let out = procs::run(c, Duration::from_secs(600))?;
        if out.code != 0 {
            bail!("bench_calls failed: {}", out.stderr);
        }
        figures(out.stdout.trim())
    };
    let python_client = |port: u16| -> Result<CallFigures> {
        let mut c = Command::new(venv.join("bin/python"));
        c.arg(crate::workspace_root().join("xtask/interop/bench_calls.py"))
            .arg(py_calls.to_string())
            .env("JUMPSTARTER_HOST", format!("127.0.0.1:{port}"))
            .env("JMP_GRPC_INSECURE", "1")
            .env("JMP_DRIVERS_ALLOW", "UNSAFE");
        let out = procs::run(c, Duration::from_secs(600))?;
        if out.code != 0 {
            bail!("bench_calls.py failed: {}", out.stderr);
        }
        figures(out.stdout.trim())
    };

    println!(
        "== Python driver (upstream MockPower) through our exporter's bridge vs under upstream's \
         exporter alone: unary power.on, TCP on loopback, plaintext, {} binaries, {rounds} \
         alternating rounds",
        if debug { "debug" } else { "release" }
    );
    // [ours, upstream] x [rust client, python client]: each round's figures.
    let mut rows: [[Vec<CallFigures>; 2]; 2] = Default::default();
    for round in 0..rounds {
        for first in [true, false] {
            // Alternate which exporter goes first, so that neither always runs warmer.
            let ours = if round % 2 == 0 { first } else { !first };
            let side = usize::from(!ours);
            let (exporter, port) = start(ours)?;
            rows[side][0].push(rust_client(port)?);
            rows[side][1].push(python_client(port)?);
            drop(exporter);
        }
    }
    let med = |v: &Vec<CallFigures>, f: fn(&CallFigures) -> f64| median(v.iter().map(f).collect());
    println!(
        "{:<58} {:>10} {:>10} {:>10}",
        "(medians of the rounds)", "p50 (µs)", "p99 (µs)", "calls/s"
    );
    let names = [
        [
            "bridge: Rust client -> our exporter -> Python child",
            "bridge: Python client -> our exporter -> Python child",
        ],
        [
            "upstream: Rust client -> upstream exporter",
            "upstream: Python client -> upstream exporter",
        ],
    ];
    for (side, row) in rows.iter().enumerate() {
        for (client, v) in row.iter().enumerate() {
            println!(
                "{:<58} {:>10.1} {:>10.1} {:>10.0}",
                names[side][client],
                med(v, |f| f.p50_us),
                med(v, |f| f.p99_us),
                med(v, |f| f.calls_per_sec)
            );
        }
    }
    for (client, name) in ["Rust client", "Python client"].iter().enumerate() {
        let ours = med(&rows[0][client], |f| f.p50_us);
        let up = med(&rows[1][client], |f| f.p50_us);
        let ratio = ours / up.max(0.001);
        println!(
            "ratio ({name}): bridge p50 / upstream p50 = {ratio:.2} ({:+.1} µs); target <= {TARGET_RATIO:.2}: {}",
            ours - up,
            if ratio <= TARGET_RATIO {
                "met"
            } else {
                "NOT met"
            }
        );
    }
    Ok(())
}
