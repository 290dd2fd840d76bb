//! `cargo xtask bench-obs` (part of `cargo xtask bench`): what metrics and JSON call logs
//! cost, an exporter with `--metrics-listen` and `--log-format json` beside one that logs no
//! line per call, in interleaved rounds: `j power on` as a user runs it in `jmp shell`, a
//! connected client's `power.on` p50, and a 256 MiB upload, each overhead against 3%; and,
//! with valgrind installed, the repeatable figure: the instructions of the thread serving a
//! `power.on` call, counted by callgrind.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context, Result, bail};

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
    instructions(rel, work.path(), &config, if quick { 1 } else { 3 })
}

/// The calls of the shorter and of the longer run of [`instructions`]: their difference
/// leaves out the start, the connection and the end.
const FEW_CALLS: u64 = 1000;
const MANY_CALLS: u64 = 3000;

/// The repeatable figure, which time on this noisy machine cannot give: the instructions of
/// the thread serving `power.on` (`jmp run` with one tokio worker, under `valgrind
/// --tool=callgrind --separate-threads=yes`), per call: the difference between
/// [`MANY_CALLS`] and [`FEW_CALLS`] calls of one connected client, divided by their
/// difference; for the plain and the observed exporter in `rounds` interleaved rounds.
/// Without valgrind, says so and measures nothing.
fn instructions(rel: &Path, work: &Path, config: &Path, rounds: usize) -> Result<()> {
    let valgrind = Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !valgrind {
        println!(
            "(instructions a call: valgrind is not installed (Debian: apt install valgrind); \
             not measured)"
        );
        return Ok(());
    }
    println!(
        "== instructions of the thread serving power.on (callgrind), {}",
        if rounds == 1 {
            "1 round".to_string()
        } else {
            format!("{rounds} interleaved rounds")
        }
    );
    let mut paired = Paired::default();
    for round in 0..rounds {
        paired.round(round, |observed| {
            let few = serving_instructions(rel, work, config, observed, FEW_CALLS)?;
            let many = serving_instructions(rel, work, config, observed, MANY_CALLS)?;
            let per_call = many.saturating_sub(few) as f64 / (MANY_CALLS - FEW_CALLS) as f64;
            println!(
                "round {}: {:<8} {per_call:>8.0} instructions a call",
                round + 1,
                if observed { "observed" } else { "plain" }
            );
            Ok(per_call)
        })?;
    }
    let overhead = paired.overhead();
    println!(
        "{:<44} {:>12.0} {:>12.0} {:>+9.1}%  {}",
        "power.on, serving thread (instructions)",
        median(paired.plain.clone()),
        median(paired.observed.clone()),
        overhead * 100.0,
        if overhead < OVERHEAD_GOAL {
            "< 3%: met"
        } else {
            "< 3%: NOT met"
        }
    );
    Ok(())
}

/// The instructions of the busiest thread (the one serving the calls) of `jmp run` under
/// callgrind while one `bench_calls` client makes `calls` calls.
fn serving_instructions(
    rel: &Path,
    work: &Path,
    config: &Path,
    observed: bool,
    calls: u64,
) -> Result<u64> {
    let dir = work.join(format!(
        "callgrind-{}-{calls}",
        if observed { "observed" } else { "plain" }
    ));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    let mut c = Command::new("valgrind");
    c.args(["--tool=callgrind", "--separate-threads=yes"])
        .arg(format!(
            "--callgrind-out-file={}/callgrind.out.%p",
            dir.display()
        ))
        .arg(rel.join("jmp"))
        .args(["run", "--exporter-config"])
        .arg(config)
        .args(["--tls-grpc-listener", "127.0.0.1:0", "--tls-grpc-insecure"])
        .env("TOKIO_WORKER_THREADS", "1")
        .env("JMP_CLIENT_CONFIG_HOME", work.join("config"));
    if observed {
        c.args(OBSERVED_ARGS);
    } else {
        c.env("JMP_LOG", "warn");
    }
    let mut exporter = procs::Background::start("jmp run under callgrind", c)?;
    let line = exporter.wait_for_line("listening on", Duration::from_secs(300))?;
    let port = procs::listening_port(&line)?;
    let mut client = Command::new(rel.join("examples/bench_calls"));
    client
        .args([
            format!("127.0.0.1:{port}"),
            calls.to_string(),
            "1".to_string(),
        ])
        .env("JMP_GRPC_INSECURE", "1");
    let out = procs::run(client, Duration::from_secs(900))?;
    if out.code != 0 {
        bail!("bench_calls under callgrind failed: {}", out.stderr);
    }
    // It ends its session, then callgrind writes each thread's counts.
    exporter.stop_within(Duration::from_secs(120));
    let mut busiest = None;
    for entry in std::fs::read_dir(&dir)? {
        let text = std::fs::read_to_string(entry?.path())?;
        if let Some(n) = callgrind_summary(&text) {
            busiest = busiest.max(Some(n));
        }
    }
    busiest.with_context(|| format!("no callgrind profile with a summary in {}", dir.display()))
}

/// The instruction count of a callgrind profile's `summary:` line.
fn callgrind_summary(profile: &str) -> Option<u64> {
    profile
        .lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|n| n.trim().parse().ok())
}

/// The two numbers of the `times t0 t1` line a shell printed.
fn shell_times(stdout: &str) -> Result<(f64, f64)> {
    match crate::bench_storage::times_line(stdout)?[..] {
        [t0, t1] => Ok((t0, t1)),
        ref t => bail!("bad timings {t:?}: two times expected"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profiles_summary_is_its_instruction_count() {
        let profile = "version: 1\ncreator: callgrind-3.24.0\nthread: 3\nevents: Ir\n\
                       summary: 226736178\n\nfn=(1) main\n";
        assert_eq!(callgrind_summary(profile), Some(226_736_178));
        assert_eq!(callgrind_summary("events: Ir\n"), None);
        assert_eq!(callgrind_summary("summary: lots\n"), None);
    }
}
