//! `cargo xtask fuzz [--cases N] [--target FILTER] [--seed N]`: every fuzz target of the
//! workspace with many more cases than `cargo test` gives them.
//!
//! The fuzz targets are the proptest tests in the `fuzz_tests` modules (core, controller,
//! drivers and their SNMP module, the exporter's Python bridge) and the stream-frame
//! targets beside the decoder in core's `wire/stream_rpc.rs` ([`EXTRA_TARGETS`]). Each
//! crate's `fuzz_config()` takes the number of cases from `JUMPSTARTER_FUZZ_CASES`, which
//! this sets (default [`DEFAULT_CASES`]; `cargo test` runs 512 of each). Targets marked
//! `#[ignore]` assert the correct behaviour of a known defect and are listed, not run.
//!
//! It lists the library test programs' tests (`cargo test --workspace --lib -- --list`,
//! with the features of every other workspace build, so nothing is rebuilt after `cargo
//! xtask ci`), keeps the fuzz targets (those whose name contains `--target FILTER`, when
//! given), prints them, runs them by exact name with a seed (printed first; `--seed N`
//! replays a run, through proptest's `PROPTEST_RNG_SEED`) and ends with a summary line.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader},
    process::Stdio,
    time::Instant,
};

use anyhow::{Context, Result, bail, ensure};

use crate::ci_summary::{TestCounts, format_elapsed};

/// Cases per target without `--cases`.
pub const DEFAULT_CASES: u64 = 20_000;

/// The variable every crate's `fuzz_config()` reads.
const CASES_ENV: &str = "JUMPSTARTER_FUZZ_CASES";

/// Fuzz targets outside the `fuzz_tests` modules (full test paths).
const EXTRA_TARGETS: &[&str] = &[
    "wire::stream_rpc::tests::any_frames_cut_anywhere_decode_to_the_same_stream",
    "wire::stream_rpc::tests::garbage_never_panics_and_an_error_ends_the_stream",
];

/// Command-line options.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Options {
    cases: u64,
    filter: Option<String>,
    seed: Option<u64>,
}

fn parse_args(args: &[String]) -> Result<Options> {
    let mut o = Options {
        cases: DEFAULT_CASES,
        filter: None,
        seed: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut number = |what: &str| -> Result<u64> {
            let v = it
                .next()
                .with_context(|| format!("{what} needs a number"))?;
            v.parse::<u64>()
                .with_context(|| format!("{what} {v:?}: not an unsigned number"))
        };
        match a.as_str() {
            "--cases" => {
                o.cases = number("--cases")?;
                ensure!(
                    (1..=u64::from(u32::MAX)).contains(&o.cases),
                    "--cases must be 1 to {}",
                    u32::MAX
                );
            }
            "--seed" => o.seed = Some(number("--seed")?),
            "--target" => {
                o.filter = Some(it.next().context("--target needs a filter")?.clone());
            }
            other => bail!(
                "cargo xtask fuzz: unknown argument {other:?} (use --cases N, --target FILTER, \
                 --seed N)"
            ),
        }
    }
    Ok(o)
}

/// Whether a test (its full path in its crate) is a fuzz target.
fn is_fuzz_target(name: &str) -> bool {
    name.starts_with("fuzz_tests::")
        || name.contains("::fuzz_tests::")
        || EXTRA_TARGETS.contains(&name)
}

/// The tests a `cargo test ... -- --list --format terse` printed.
fn listed(out: &str) -> BTreeSet<String> {
    out.lines()
        .filter_map(|l| l.trim().strip_suffix(": test"))
        .map(str::to_string)
        .collect()
}

/// The arguments of a `cargo test` of every library's unit tests, with the features of the
/// workspace's other builds (so that it reuses them).
fn cargo_test_args() -> Vec<&'static str> {
    vec![
        "test",
        "--workspace",
        "--lib",
        "--features",
        crate::TEST_FEATURES,
    ]
}

/// The library test programs' tests (`ignored`: only those marked `#[ignore]`).
fn list_tests(ignored: bool) -> Result<BTreeSet<String>> {
    let mut args = cargo_test_args();
    args.extend(["--quiet", "--", "--list", "--format", "terse"]);
    if ignored {
        args.push("--ignored");
    }
    let out = crate::cargo_command(&args)
        .stderr(Stdio::inherit())
        .output()
        .context("cannot start cargo")?;
    if !out.status.success() {
        bail!("cargo {} failed ({})", args.join(" "), out.status);
    }
    Ok(listed(&String::from_utf8_lossy(&out.stdout)))
}

/// A seed for proptest's generator when none is given: from the clock.
fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64 ^ u64::from(std::process::id()))
}

/// Runs `cargo xtask fuzz`.
pub fn run(args: &[String]) -> Result<()> {
    let o = parse_args(args)?;
    let started = Instant::now();
    let seed = o.seed.unwrap_or_else(fresh_seed);
    println!(
        "== fuzz: seed {seed} (replay: cargo xtask fuzz --seed {seed} --cases {})",
        o.cases
    );
    let wanted = |name: &String| {
        is_fuzz_target(name) && o.filter.as_ref().is_none_or(|f| name.contains(f.as_str()))
    };
    println!("== fuzz: building and listing the libraries' tests");
    let all = list_tests(false)?;
    let ignored: BTreeSet<String> = list_tests(true)?.into_iter().filter(wanted).collect();
    let targets: Vec<String> = all
        .iter()
        .filter(|n| wanted(n) && !ignored.contains(*n))
        .cloned()
        .collect();
    if targets.is_empty() {
        bail!(
            "no fuzz target matches {:?} (fuzz targets: tests in `fuzz_tests` modules and {})",
            o.filter.as_deref().unwrap_or(""),
            EXTRA_TARGETS.join(", ")
        );
    }
    println!(
        "== fuzz: {} targets, {} cases each:",
        targets.len(),
        o.cases
    );
    for t in &targets {
        println!("  {t}");
    }
    if !ignored.is_empty() {
        println!(
            "== fuzz: not run, {} targets of known defects (#[ignore]; `cargo test -- --ignored NAME`):",
            ignored.len()
        );
        for t in &ignored {
            println!("  {t}");
        }
    }

    let mut cmd_args = cargo_test_args();
    cmd_args.extend(["--", "--exact"]);
    cmd_args.extend(targets.iter().map(String::as_str));
    let (cases, seed_text) = (o.cases.to_string(), seed.to_string());
    let mut child = crate::cargo_command(&cmd_args)
        .env(CASES_ENV, &cases)
        .env("PROPTEST_RNG_SEED", &seed_text)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start cargo")?;
    let mut counts = TestCounts::default();
    let mut failed = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line.context("cannot read cargo's output")?;
            println!("{line}");
            counts.add_line(&line);
            if let Some(name) = line
                .strip_prefix("test ")
                .and_then(|l| l.strip_suffix(" ... FAILED"))
            {
                failed.push(name.to_string());
            }
        }
    }
    let status = child.wait().context("cannot wait for cargo")?;
    let elapsed = format_elapsed(started.elapsed());
    if !status.success() || counts.failed > 0 {
        bail!(
            "fuzz failed after {elapsed} (seed {seed}, {} cases each): {}",
            o.cases,
            if failed.is_empty() {
                format!("cargo test exited with {status}")
            } else {
                failed.join(", ")
            }
        );
    }
    ensure!(
        counts.passed >= targets.len() as u64,
        "{} of the {} targets ran (cargo's output above)",
        counts.passed,
        targets.len()
    );
    println!(
        "== fuzz passed in {elapsed}: {} targets, {} cases each ({} in all), seed {seed}; {} \
         targets of known defects not run",
        targets.len(),
        o.cases,
        o.cases * targets.len() as u64,
        ignored.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_parse() {
        assert_eq!(
            parse_args(&[]).unwrap(),
            Options {
                cases: DEFAULT_CASES,
                filter: None,
                seed: None
            }
        );
        assert_eq!(
            parse_args(&args(&[
                "--cases", "2000", "--target", "tftp", "--seed", "7"
            ]))
            .unwrap(),
            Options {
                cases: 2000,
                filter: Some("tftp".into()),
                seed: Some(7)
            }
        );
        for bad in [
            &["--cases"][..],
            &["--cases", "x"],
            &["--cases", "0"],
            &["--cases", "99999999999"],
            &["--target"],
            &["--bogus"],
        ] {
            assert!(parse_args(&args(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn fuzz_targets_are_found_in_a_test_list() {
        let out = "fuzz_tests::jwts_from_outside_never_panic: test\n\
                   snmp::fuzz_tests::ber_values_round_trip: test\n\
                   wire::stream_rpc::tests::garbage_never_panics_and_an_error_ends_the_stream: test\n\
                   wire::stream_rpc::tests::a_straddling_data_payload_comes_out_in_its_pieces_uncopied: test\n\
                   objects::selector::tests::parse: test\n\
                   not a test line\n";
        let found: Vec<String> = listed(out)
            .into_iter()
            .filter(|n| is_fuzz_target(n))
            .collect();
        assert_eq!(
            found,
            [
                "fuzz_tests::jwts_from_outside_never_panic",
                "snmp::fuzz_tests::ber_values_round_trip",
                "wire::stream_rpc::tests::garbage_never_panics_and_an_error_ends_the_stream",
            ]
        );
    }
}
