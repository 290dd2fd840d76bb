//! `cargo xtask bench` part (alone: `cargo xtask bench-observers [--quick] [--debug]`):
//! a console's writer with observers beside it.
//!
//! Our `jmp run` serves a `loop://` console; `bench_console observers` opens 0, 1 or 10
//! observers (`observe`; of the ten, one never reads: a stalled observer whose exporter-side
//! buffer fills and drops its oldest bytes), then times MiB written through the writer's
//! `connect` and read back. The writer's throughput should stay within 10% of its
//! throughput without observers. Each case runs a few rounds; the median is shown.
//! `--debug` times the debug binaries (no release build; slower in absolute terms, the
//! ratio is the figure).

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::Result;

use crate::{bench::json_number, procs};

const CONFIG: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata: {namespace: default, name: bench-observers}
endpoint: \"\"
token: \"\"
export:
  loop:
    type: jumpstarter_driver_pyserial.driver.PySerial
    config:
      url: loop://
";

/// (label, observers that read, observers that never read)
const CASES: [(&str, usize, usize); 4] = [
    ("no observers", 0, 0),
    ("1 observer", 1, 0),
    ("1 stalled observer", 0, 1),
    ("10 observers, 1 of them stalled", 9, 1),
];

/// Runs the benchmark.
pub fn run(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let debug = args.iter().any(|a| a == "--debug");
    let (mib, rounds) = if quick { (16, 3) } else { (128, 5) };
    let bin: PathBuf = if debug {
        crate::cargo(&[
            "build",
            "--quiet",
            "-p",
            "jumpstarter-cli",
            "--bin",
            "jmp",
            "--example",
            "bench_console",
        ])?;
        crate::target_dir().join("debug")
    } else {
        crate::bench::build_release()?
    };
    let work = crate::interop::tempfile_dir::Dir::new("jmp-bench-observers")?;
    let config = work.path().join("exporter.yaml");
    std::fs::write(&config, CONFIG)?;
    let mut c = Command::new(bin.join("jmp"));
    c.env("JMP_CLIENT_CONFIG_HOME", work.path().join("config"))
        .env("JMP_LOG", "warn");
    let (_exporter, port) = procs::start_our_exporter(c, &config, &[])?;
    let host = format!("127.0.0.1:{port}");

    println!(
        "== console writer with observers ({mib} MiB through loop://, median of {rounds}, {} build)",
        if debug { "debug" } else { "release" }
    );
    let mut medians = Vec::new();
    for (label, reading, stalled) in CASES {
        let mut figures = Vec::new();
        for _ in 0..rounds {
            let mut c = Command::new(bin.join("examples/bench_console"));
            c.args([
                "observers",
                &host,
                "loop",
                &mib.to_string(),
                &reading.to_string(),
                &stalled.to_string(),
            ])
            .env("JMP_GRPC_INSECURE", "1");
            let out = procs::run(c, Duration::from_secs(600))?;
            anyhow::ensure!(
                out.code == 0,
                "bench_console observers ({label}) failed: {}{}",
                out.stdout,
                out.stderr
            );
            let line = out
                .stdout
                .lines()
                .find(|l| l.starts_with('{'))
                .unwrap_or_default()
                .to_string();
            figures.push(json_number(&line, "mib_per_sec")?);
        }
        figures.sort_by(f64::total_cmp);
        medians.push((label, figures[figures.len() / 2], figures));
    }
    let base = medians.first().map_or(0.0, |m| m.1).max(f64::MIN_POSITIVE);
    println!(
        "{:<34} {:>10} {:>16}   rounds (MiB/s)",
        "", "MiB/s", "of no observers"
    );
    for (label, median, all) in &medians {
        let rounds: Vec<String> = all.iter().map(|f| format!("{f:.1}")).collect();
        println!(
            "{:<34} {:>10.1} {:>15.0}%   {}",
            label,
            median,
            100.0 * median / base,
            rounds.join(" ")
        );
    }
    println!("target: the writer's throughput with observers >= 90% of without");
    Ok(())
}
