//! The one line `cargo xtask ci` ends with: what ran, the counts and the time.

use std::{
    io::{BufRead, BufReader},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context, Result, bail};

/// The totals of libtest's `test result:` lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TestCounts {
    /// Tests that passed.
    pub passed: u64,
    /// Tests that failed.
    pub failed: u64,
    /// Tests marked `#[ignore]`.
    pub ignored: u64,
    /// Test binaries (and doc-test runs) that reported.
    pub binaries: u64,
}

impl TestCounts {
    /// Adds one `test result: ok. 12 passed; 0 failed; 1 ignored; ...` line; other lines
    /// change nothing.
    pub fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        let count = |what: &str| {
            rest.split(';')
                .filter_map(|part| part.trim().strip_suffix(what))
                .filter_map(|n| n.trim().rsplit(' ').next()?.parse::<u64>().ok())
                .next()
                .unwrap_or(0)
        };
        self.passed += count(" passed");
        self.failed += count(" failed");
        self.ignored += count(" ignored");
        self.binaries += 1;
    }
}

/// Runs `cargo ARGS` from the workspace root with its output passed through (stdout line by
/// line, as it comes), counting the tests; fails on a non-zero exit.
pub fn cargo_test(args: &[&str], env: &[(&str, &str)]) -> Result<TestCounts> {
    let mut child = crate::cargo_command(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start cargo")?;
    let mut counts = TestCounts::default();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line.context("cannot read cargo's output")?;
            println!("{line}");
            counts.add_line(&line);
        }
    }
    let status = child.wait().context("cannot wait for cargo")?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(counts)
}

/// `12m 05s`, `45s`.
pub fn format_elapsed(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 {
        format!("{}m {:02}s", secs / 60, secs % 60)
    } else {
        format!("{secs}s")
    }
}

/// The last line of a passing `cargo xtask ci`.
pub fn pass_line(tests: TestCounts, interop: (usize, usize), elapsed: Duration) -> String {
    let ignored = if tests.ignored > 0 {
        format!(", {} ignored", tests.ignored)
    } else {
        String::new()
    };
    format!(
        "== ci passed in {}: fmt, arch, clippy, rustdoc clean; {} tests passed{ignored} \
         ({} test runs); s3 checks passed; interop {}/{} scenarios passed",
        format_elapsed(elapsed),
        tests.passed,
        tests.binaries,
        interop.0,
        interop.1,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_result_lines_are_summed() {
        let mut c = TestCounts::default();
        for line in [
            "running 3 tests",
            "test a ... ok",
            "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; \
             finished in 0.01s",
            "test result: ok. 40 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; \
             finished in 12.50s",
            "   Doc-tests jumpstarter_core",
            "test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
        ] {
            c.add_line(line);
        }
        assert_eq!(
            c,
            TestCounts {
                passed: 45,
                failed: 0,
                ignored: 1,
                binaries: 3
            }
        );
    }

    #[test]
    fn the_pass_line_says_what_ran_the_counts_and_the_time() {
        let tests = TestCounts {
            passed: 432,
            failed: 0,
            ignored: 0,
            binaries: 21,
        };
        insta::assert_snapshot!(
            pass_line(tests, (18, 18), Duration::from_secs(1083)),
            @"== ci passed in 18m 03s: fmt, arch, clippy, rustdoc clean; 432 tests passed (21 test runs); s3 checks passed; interop 18/18 scenarios passed"
        );
        assert_eq!(format_elapsed(Duration::from_secs(45)), "45s");
    }
}
