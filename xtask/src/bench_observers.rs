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
//!
//! Two figures per case, as the writer and its observers share the machine's cores:
//! - the writer's throughput (MiB/s, and as a share of it without observers);
//! - what each reading observer received (a share of the bytes the writer moved: a
//!   lagging observer drops its oldest bytes, by design) and the CPU the exporter and the
//!   client used meanwhile (cores busy, and CPU ms per MiB the writer moved).
//!
//! From the case without observers (the writer's CPU per MiB, `w`) and the case with nine
//! reading ones (each observer's CPU per MiB it received, `o`), it prints the ceiling the
//! cores set: with `k` observers each receiving every byte, the writer cannot go faster
//! than `cores / (w + k·o)`, whatever the fan-out does, since every observer's bytes are
//! framed, sent and read on the same cores.

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
    let (exporter, port) = procs::start_our_exporter(c, &config, &[])?;
    let exporter_pid = exporter.pid().to_string();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let host = format!("127.0.0.1:{port}");

    println!(
        "== console writer with observers ({mib} MiB through loop://, median of {rounds}, {} build)",
        if debug { "debug" } else { "release" }
    );
    let mut cases = Vec::new();
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
                &exporter_pid,
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
            let rate = json_number(&line, "mib_per_sec")?;
            figures.push(Round {
                rate,
                seconds: mib as f64 / rate.max(f64::MIN_POSITIVE),
                observed_mib: json_number(&line, "observed_mib")?,
                cpu_s: json_number(&line, "cpu_s")?,
            });
        }
        figures.sort_by(|a, b| a.rate.total_cmp(&b.rate));
        let median = figures[figures.len() / 2];
        cases.push((label, reading, median, figures));
    }
    let base = cases
        .first()
        .map_or(0.0, |c| c.2.rate)
        .max(f64::MIN_POSITIVE);
    println!(
        "{:<34} {:>8} {:>8} {:>9} {:>7} {:>8}   rounds (MiB/s)",
        "", "MiB/s", "of none", "observer", "cores", "CPU ms"
    );
    println!(
        "{:<34} {:>8} {:>8} {:>9} {:>7} {:>8}",
        "", "(writer)", "", "received", "busy", "per MiB"
    );
    for (label, reading, m, all) in &cases {
        let rounds: Vec<String> = all.iter().map(|f| format!("{:.1}", f.rate)).collect();
        let received = if *reading == 0 {
            "-".to_string()
        } else {
            format!(
                "{:.0}%",
                100.0 * m.observed_mib / (*reading as f64 * mib as f64)
            )
        };
        println!(
            "{:<34} {:>8.1} {:>7.0}% {:>9} {:>7.2} {:>8.1}   {}",
            label,
            m.rate,
            100.0 * m.rate / base,
            received,
            m.cpu_s / m.seconds,
            1000.0 * m.cpu_s / mib as f64,
            rounds.join(" ")
        );
    }
    println!("target: the writer's throughput with observers >= 90% of without");
    budget(&cases, mib as f64, cores);
    Ok(())
}

/// One round's figures.
#[derive(Debug, Clone, Copy)]
struct Round {
    /// The writer's MiB/s.
    rate: f64,
    /// How long the writer's MiB took.
    seconds: f64,
    /// MiB the reading observers received between them meanwhile.
    observed_mib: f64,
    /// CPU seconds of the exporter and the client meanwhile.
    cpu_s: f64,
}

/// Prints the ceiling the cores set on the writer when every observer receives every byte.
fn budget(cases: &[(&str, usize, Round, Vec<Round>)], mib: f64, cores: usize) {
    let (Some(none), Some(many)) = (
        cases.iter().find(|c| c.1 == 0 && c.0 == "no observers"),
        cases.iter().max_by_key(|c| c.1),
    ) else {
        return;
    };
    let k = many.1 as f64;
    // The writer's own CPU per MiB, and each observer's per MiB it received.
    let w = none.2.cpu_s / mib;
    let o = (many.2.cpu_s - w * mib) / many.2.observed_mib.max(f64::MIN_POSITIVE);
    if w <= 0.0 || o <= 0.0 {
        println!("(no CPU figures: /proc is not readable here)");
        return;
    }
    let cores = cores as f64;
    let alone = none.2.rate;
    let ceiling = cores / (w + k * o);
    println!(
        "budget: the writer costs {:.1} CPU ms per MiB, each observer {:.1} per MiB it \
         receives; on {cores} cores, with {k} observers receiving every byte the writer could \
         reach at most {:.1} MiB/s ({:.0}% of {:.1} without observers, which used {:.2} cores)",
        1000.0 * w,
        1000.0 * o,
        ceiling,
        100.0 * ceiling / alone,
        alone,
        none.2.cpu_s / none.2.seconds,
    );
}
