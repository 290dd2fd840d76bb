//! `cargo xtask bench` part (alone: `cargo xtask bench-observers [--quick] [--debug]
//! [--no-build] [--rounds N]`):
//! a console's writer with observers beside it.
//!
//! Our `jmp run` serves a `loop://` console; `bench_console observers` opens 0, 1 or 10
//! observers (`observe`; of the ten, one never reads: a stalled observer whose exporter-side
//! buffer fills and drops its oldest bytes), then times MiB written through the writer's
//! `connect` and read back. The writer's throughput should stay within 10% of its
//! throughput without observers: each observer's delivery budget
//! (`observer_bytes_per_second`, 4 MiB/s by default) bounds what observers together take
//! from the cores the writer needs. A last case runs the ten observers on a second exporter
//! whose budget is out of reach (1 TiB/s), to show what observers cost without one.
//!
//! The cases run in turns (round 1 of every case, then round 2, ...), so that a change in
//! the machine's load meanwhile touches every case alike; a case's share of the writer's
//! throughput without observers is the median of its rounds' shares against the same
//! round's case without observers. Release binaries (only `jmp` and the `bench_console`
//! example are built); `--debug` times the debug binaries instead (slower in absolute terms,
//! the ratio is the figure); `--no-build` takes the binaries as they are; `--rounds N` takes
//! N rounds of each case (15 by default, 3 with `--quick`).
//!
//! Per case: the writer's throughput (MiB/s, and as a share of it without observers); what
//! each reading observer received (MiB, MiB/s and a share of the bytes the writer moved: an
//! observer past its budget or lagging drops its oldest bytes, by design); the CPU the
//! exporter and the client used meanwhile (cores busy, and CPU ms per MiB the writer moved).
//! It ends with PASS or FAIL for each case with observers against "within 10%".

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::Result;

use crate::{bench::json_number, procs};

/// The exporter's config; `rate`, each observer's budget in bytes per second, if not the
/// driver's default.
fn config(rate: Option<u64>) -> String {
    let rate = rate
        .map(|r| format!("      observer_bytes_per_second: {r}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata: {{namespace: default, name: bench-observers}}
endpoint: \"\"
token: \"\"
export:
  loop:
    type: jumpstarter_driver_pyserial.driver.PySerial
    config:
      url: loop://
{rate}"
    )
}

/// Each observer's budget by default (the driver's `observer_bytes_per_second`).
const BUDGET: u64 = 4 * 1024 * 1024;

/// A budget no observer reaches, for the case that shows observers without one.
const NO_BUDGET: u64 = 1 << 40;

/// One case: its label, observers that read, observers that never read, and whether the
/// observers have the default budget (else [`NO_BUDGET`]).
struct Case {
    label: &'static str,
    reading: usize,
    stalled: usize,
    budgeted: bool,
}

const CASES: [Case; 5] = [
    Case {
        label: "no observers",
        reading: 0,
        stalled: 0,
        budgeted: true,
    },
    Case {
        label: "1 observer",
        reading: 1,
        stalled: 0,
        budgeted: true,
    },
    Case {
        label: "1 stalled observer",
        reading: 0,
        stalled: 1,
        budgeted: true,
    },
    Case {
        label: "10 observers, 1 of them stalled",
        reading: 9,
        stalled: 1,
        budgeted: true,
    },
    Case {
        label: "the same without a budget",
        reading: 9,
        stalled: 1,
        budgeted: false,
    },
];

/// Runs the benchmark.
pub fn run(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let debug = args.iter().any(|a| a == "--debug");
    let (mib, mut rounds) = if quick { (16, 3) } else { (256, 15) };
    if let Some(i) = args.iter().position(|a| a == "--rounds") {
        rounds = args
            .get(i + 1)
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| anyhow::anyhow!("--rounds takes a number of rounds above 0"))?;
    }
    let mut build = vec!["build", "--quiet"];
    if !debug {
        build.push("--release");
    }
    build.extend([
        "-p",
        "jumpstarter-cli",
        "--bin",
        "jmp",
        "--example",
        "bench_console",
    ]);
    if !args.iter().any(|a| a == "--no-build") {
        crate::cargo(&build)?;
    }
    let bin: PathBuf = crate::target_dir().join(if debug { "debug" } else { "release" });
    let work = crate::interop::tempfile_dir::Dir::new("jmp-bench-observers")?;
    // Two exporters: the console with the default budget, and one without.
    let mut exporters = Vec::new();
    for (name, rate) in [("budget", None), ("unbudgeted", Some(NO_BUDGET))] {
        let path = work.path().join(format!("{name}.yaml"));
        std::fs::write(&path, config(rate))?;
        let mut c = Command::new(bin.join("jmp"));
        c.env("JMP_CLIENT_CONFIG_HOME", work.path().join(name))
            .env("JMP_LOG", "warn");
        let (exporter, port) = procs::start_our_exporter(c, &path, &[])?;
        let pid = exporter.pid().to_string();
        exporters.push((exporter, format!("127.0.0.1:{port}"), pid));
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);

    println!(
        "== console writer with observers ({mib} MiB through loop://, median of {rounds} \
         rounds taken in turns, {} build, {cores} cores; observers' budget {} MiB/s each)",
        if debug { "debug" } else { "release" },
        BUDGET >> 20
    );
    let mut figures: Vec<Vec<Round>> = CASES.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (case, figures) in CASES.iter().zip(&mut figures) {
            let (_, host, pid) = &exporters[usize::from(!case.budgeted)];
            figures.push(round(&bin, host, pid, mib, case)?);
        }
    }
    report(&figures, mib as f64, cores);
    Ok(())
}

/// One run of `bench_console observers` for `case`.
fn round(bin: &std::path::Path, host: &str, pid: &str, mib: usize, case: &Case) -> Result<Round> {
    let mut c = Command::new(bin.join("examples/bench_console"));
    c.args([
        "observers",
        host,
        "loop",
        &mib.to_string(),
        &case.reading.to_string(),
        &case.stalled.to_string(),
        pid,
    ])
    .env("JMP_GRPC_INSECURE", "1");
    let out = procs::run(c, Duration::from_secs(600))?;
    anyhow::ensure!(
        out.code == 0,
        "bench_console observers ({}) failed: {}{}",
        case.label,
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
    Ok(Round {
        rate,
        seconds: mib as f64 / rate.max(f64::MIN_POSITIVE),
        observed_mib: json_number(&line, "observed_mib")?,
        cpu_s: json_number(&line, "cpu_s")?,
    })
}

/// The median of `v` (0 for none).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Prints each case's medians, the verdicts and the CPU budget.
fn report(figures: &[Vec<Round>], mib: f64, cores: usize) {
    let none = &figures[0];
    println!(
        "{:<34} {:>8} {:>8} {:>9} {:>9} {:>9} {:>6} {:>7}   rounds (writer MiB/s)",
        "", "writer", "of none", "each obs", "each obs", "each obs", "cores", "CPU ms"
    );
    println!(
        "{:<34} {:>8} {:>8} {:>9} {:>9} {:>9} {:>6} {:>7}",
        "", "MiB/s", "", "got MiB", "MiB/s", "got", "busy", "per MiB"
    );
    let mut shares = Vec::new();
    for (case, rounds) in CASES.iter().zip(figures) {
        let m = |f: fn(&Round) -> f64| median(rounds.iter().map(f).collect());
        // Each round against the same turn's case without observers.
        let share = median(
            rounds
                .iter()
                .zip(none)
                .map(|(r, n)| r.rate / n.rate.max(f64::MIN_POSITIVE))
                .collect(),
        );
        shares.push(share);
        let k = case.reading as f64;
        let (got, got_rate, got_share) = if case.reading == 0 {
            ("-".to_string(), "-".to_string(), "-".to_string())
        } else {
            (
                format!(
                    "{:.1}",
                    median(rounds.iter().map(|r| r.observed_mib / k).collect())
                ),
                format!(
                    "{:.1}",
                    median(
                        rounds
                            .iter()
                            .map(|r| r.observed_mib / k / r.seconds)
                            .collect()
                    )
                ),
                format!(
                    "{:.1}%",
                    100.0 * median(rounds.iter().map(|r| r.observed_mib / k / mib).collect())
                ),
            )
        };
        let all: Vec<String> = rounds.iter().map(|f| format!("{:.0}", f.rate)).collect();
        println!(
            "{:<34} {:>8.1} {:>7.0}% {:>9} {:>9} {:>9} {:>6.2} {:>7.2}   {}",
            case.label,
            m(|r| r.rate),
            100.0 * share,
            got,
            got_rate,
            got_share,
            m(|r| r.cpu_s / r.seconds),
            median(rounds.iter().map(|r| 1000.0 * r.cpu_s / mib).collect()),
            all.join(" ")
        );
    }
    // Two views less sensitive to the machine's other load than the medians: the best
    // rounds (each case when least disturbed) and the CPU per MiB the writer moved.
    let best = |rounds: &[Round]| rounds.iter().map(|r| r.rate).fold(0.0, f64::max);
    let cpu = |rounds: &[Round]| median(rounds.iter().map(|r| r.cpu_s / mib).collect());
    for ((case, share), rounds) in CASES.iter().zip(&shares).zip(figures).skip(1) {
        let verdict = if !case.budgeted {
            "(for comparison)"
        } else if *share >= 0.9 {
            "PASS"
        } else {
            "FAIL"
        };
        println!(
            "{verdict:<16} {}: the writer at {:.0}% of its throughput without observers \
             (target: within 10%; best rounds {:.0}%, CPU per MiB {:+.0}%)",
            case.label,
            100.0 * share,
            100.0 * best(rounds) / best(none).max(f64::MIN_POSITIVE),
            100.0 * (cpu(rounds) / cpu(none).max(f64::MIN_POSITIVE) - 1.0),
        );
    }
    budget(figures, mib, cores);
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

/// Prints what observers cost per MiB they receive, the ceiling that cost sets on the writer
/// when every observer receives every byte, and the share of the cores the budget leaves
/// them.
fn budget(figures: &[Vec<Round>], mib: f64, cores: usize) {
    let (Some(none), Some(unbudgeted)) = (figures.first(), figures.last()) else {
        return;
    };
    let Some(case) = CASES.last() else {
        return;
    };
    let k = case.reading as f64;
    // The writer's own CPU per MiB, and each observer's per MiB it received.
    let w = median(none.iter().map(|r| r.cpu_s / mib).collect());
    let o = median(
        unbudgeted
            .iter()
            .map(|r| (r.cpu_s - w * mib) / r.observed_mib.max(f64::MIN_POSITIVE))
            .collect(),
    );
    if w <= 0.0 || o <= 0.0 {
        println!("(no CPU figures: /proc is not readable here)");
        return;
    }
    let cores = cores as f64;
    let alone = median(none.iter().map(|r| r.rate).collect());
    let ceiling = cores / (w + k * o);
    let capped = k * (BUDGET as f64 / f64::from(1u32 << 20)) * o;
    println!(
        "cost: the writer's path {:.2} CPU ms per MiB, each observer {:.2} per MiB it \
         receives; with {k} observers receiving every byte the writer could reach at most \
         {ceiling:.0} MiB/s on {cores} cores ({:.0}% of {alone:.0} alone); at their budget \
         ({} MiB/s each) the {k} take at most {:.3} of a core",
        1000.0 * w,
        1000.0 * o,
        100.0 * ceiling / alone,
        BUDGET >> 20,
        capped,
    );
}
