//! `cargo xtask bench-obs` (part of `cargo xtask bench`): what metrics and JSON call logs
//! cost, an exporter with `--metrics-listen` and `--log-format json` beside one that logs no
//! line per call, in interleaved rounds: `j power on` as a user runs it in `jmp shell`, a
//! connected client's `power.on` p50, and a 256 MiB upload, each overhead against 3%.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Result, bail};

use crate::{bench::parse_figures, procs};

/// Runs the section on the release binaries (`--quick`: fewer rounds and a smaller upload).
pub fn run(args: &[String]) -> Result<()> {
    let rel = crate::bench::build_release()?;
    observability(&rel, args.iter().any(|a| a == "--quick"))
}

/// The exporter of [`observability`]: mock power and storage.
const OBSERVED_CONFIG: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata: {namespace: default, name: bench}
endpoint: \"\"
token: \"\"
export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
  storage:
    type: jumpstarter_driver_opendal.driver.MockStorageMux
";

/// What `jmp run --metrics-listen ADDR --log-format json` adds to a plain `jmp run`.
const OBSERVED_ARGS: [&str; 4] = ["--metrics-listen", "127.0.0.1:0", "--log-format", "json"];

/// The target for each overhead [`observability`] measures.
const OVERHEAD_GOAL: f64 = 0.03;

/// Times taken by the plain and the observed exporter, one pair per round.
#[derive(Default)]
struct Paired {
    plain: Vec<f64>,
    observed: Vec<f64>,
}

impl Paired {
    /// Runs `measure(observed)` for both exporters, the order swapped every other round so
    /// that neither always goes first.
    fn round(&mut self, round: usize, mut measure: impl FnMut(bool) -> Result<f64>) -> Result<()> {
        for observed in [!round.is_multiple_of(2), round.is_multiple_of(2)] {
            let v = measure(observed)?;
            if observed {
                self.observed.push(v);
            } else {
                self.plain.push(v);
            }
        }
        Ok(())
    }

    /// The median of the rounds' ratios observed / plain, minus one: what the observed
    /// exporter costs more, as a share (pair by pair, so that a drift of the machine's speed
    /// between rounds cancels out).
    fn overhead(&self) -> f64 {
        let ratios: Vec<f64> = self
            .plain
            .iter()
            .zip(&self.observed)
            .map(|(p, o)| o / p.max(1e-12))
            .collect();
        median(ratios) - 1.0
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// What metrics and JSON call logs cost: two exporters side by side, one plain and one with
/// `--metrics-listen` and `--log-format json` (its lines on a pipe that is read, as a log
/// collector would), measured in interleaved rounds: `j power on` as a user runs it (the
/// whole command, in `jmp shell`), the latency of one `power.on` call from a client that
/// stays connected (p50), and a 256 MiB upload (`j storage write-local-file`). Prints each
/// overhead (the median of the rounds' ratios) against the goal of 3%.
pub(crate) fn observability(rel: &Path, quick: bool) -> Result<()> {
    let (rounds, commands, calls, size_mib) = if quick {
        (3, 5, 300, 64)
    } else {
        (9, 40, 5000, 256)
    };
    let size = size_mib << 20;
    let work = crate::interop::tempfile_dir::Dir::new("jmp-bench-obs")?;
    let config = work.path().join("exporter.yaml");
    std::fs::write(&config, OBSERVED_CONFIG)?;
    // The image, and each exporter's medium with its partial copy.
    let (scratch, _) = crate::bench_storage::scratch_dir(2 * size)?;
    let image = scratch.path().join("src.img");
    crate::bench_storage::random_file(&image, size)?;
    let start = |extra: &[&str], quiet: bool| {
        let mut c = Command::new(rel.join("jmp"));
        c.env("JMP_CLIENT_CONFIG_HOME", work.path().join("config"))
            .env("TMPDIR", scratch.path());
        if quiet {
            c.env("JMP_LOG", "warn");
        }
        procs::start_our_exporter(c, &config, extra)
    };
    // The plain exporter logs no line per call (as the exporter of the table above): by
    // default it would write each driver log line (mock power's "Power on") to stderr as
    // text, on the thread serving the call, which costs it more than the observed one's
    // queued JSON lines.
    let (mut plain, plain_port) = start(&[], true)?;
    let (mut observed, observed_port) = start(&OBSERVED_ARGS, false)?;
    let host = |observed: bool| {
        format!(
            "127.0.0.1:{}",
            if observed { observed_port } else { plain_port }
        )
    };
    println!(
        "== metrics and JSON call logs ({}): overhead, {rounds} interleaved rounds",
        OBSERVED_ARGS.join(" ")
    );

    // `j power on`, `commands` times in one `jmp shell`: the milliseconds of one.
    let inner = format!(
        "t0=$(date +%s.%N); i=0; while [ $i -lt {commands} ]; do \"{j}\" power on || exit 1; \
         i=$((i+1)); done; t1=$(date +%s.%N); echo \"times $t0 $t1\"",
        j = rel.join("j").display()
    );
    let mut command = Paired::default();
    for round in 0..rounds {
        command.round(round, |observed| {
            let mut c = Command::new(rel.join("jmp"));
            c.env("JMP_CLIENT_CONFIG_HOME", work.path().join("config"))
                .args([
                    "shell",
                    "--tls-grpc",
                    &host(observed),
                    "--tls-grpc-insecure",
                ])
                .args(["--", "sh", "-c", &inner]);
            let out = procs::run(c, Duration::from_secs(300))?;
            if out.code != 0 {
                bail!("jmp shell -- j power on failed: {}", out.stderr);
            }
            let (t0, t1) = shell_times(&out.stdout)?;
            Ok((t1 - t0) * 1e3 / commands as f64)
        })?;
    }

    // One call's latency, p50, from a client that stays connected.
    let mut call = Paired::default();
    for round in 0..rounds {
        call.round(round, |observed| {
            let mut c = Command::new(rel.join("examples/bench_calls"));
            c.args([host(observed), calls.to_string(), "1".to_string()])
                .env("JMP_GRPC_INSECURE", "1");
            let out = procs::run(c, Duration::from_secs(300))?;
            if out.code != 0 {
                bail!("bench_calls failed: {}", out.stderr);
            }
            Ok(parse_figures(out.stdout.trim())?.p50_us)
        })?;
    }

    // The upload: seconds.
    let mut upload = Paired::default();
    for round in 0..rounds {
        upload.round(round, |observed| {
            let mut c = Command::new(rel.join("j"));
            c.env("JUMPSTARTER_HOST", host(observed))
                .env("JMP_GRPC_INSECURE", "1")
                .args(["storage", "write-local-file"])
                .arg(&image);
            let start = std::time::Instant::now();
            let out = procs::run(c, Duration::from_secs(900))?;
            if out.code != 0 {
                bail!("j storage write-local-file failed: {}", out.stderr);
            }
            Ok(start.elapsed().as_secs_f64())
        })?;
    }
    plain.stop();
    observed.stop();

    println!(
        "{:<44} {:>12} {:>12} {:>10}",
        "", "plain", "observed", "overhead"
    );
    let row = |name: &str, unit: &str, p: &Paired, show: &dyn Fn(f64) -> f64| {
        let overhead = p.overhead();
        println!(
            "{:<44} {:>12.1} {:>12.1} {:>+9.1}%  {}",
            format!("{name} ({unit})"),
            show(median(p.plain.clone())),
            show(median(p.observed.clone())),
            overhead * 100.0,
            if overhead < OVERHEAD_GOAL {
                "< 3%: met"
            } else {
                "< 3%: NOT met"
            }
        );
    };
    let same = |v: f64| v;
    row("`j power on` in `jmp shell`", "ms each", &command, &same);
    row("power.on, client connected, p50", "µs", &call, &same);
    let mb_s = |secs: f64| size as f64 / 1e6 / secs.max(1e-9);
    row(
        &format!("{size_mib} MiB upload, TCP"),
        "MB/s",
        &upload,
        &mb_s,
    );
    println!(
        "(overhead: the median of the rounds' ratios observed / plain, in time; medians of \
         the rounds in the columns)"
    );
    Ok(())
}

/// The two numbers of the `times t0 t1` line a shell printed.
fn shell_times(stdout: &str) -> Result<(f64, f64)> {
    match crate::bench_storage::times_line(stdout)?[..] {
        [t0, t1] => Ok((t0, t1)),
        ref t => bail!("bad timings {t:?}: two times expected"),
    }
}
