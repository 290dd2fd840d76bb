//! Upstream's own driver tests, run through our exporter.
//!
//! Upstream's driver wheels ship their pytest tests (`jumpstarter_driver_*/*_test.py`); the
//! venv installs the pinned wheels, so those files are there as released. They build a
//! driver object and call `jumpstarter.common.utils.serve(driver)` for a client of an
//! in-process Python exporter; `xtask/interop/driver_tests_plugin.py` replaces `serve` so
//! that our `jmp run` serves the driver (its type and arguments as an exporter config
//! entry: our Rust driver for the type, or upstream's Python driver in our exporter's
//! bridge) and upstream's client talks to it.
//!
//! Each package's tests run in one pytest process; the counts are printed per package and in
//! total. The scenario fails on any failed test that is not in [`KNOWN_UPSTREAM_FAILURES`]
//! (each of which is run again with upstream's own `serve` and must fail there too) or in
//! [`IN_PROCESS_ONLY`] (tests that patch the driver inside the test process, which an
//! exporter in another process cannot share: reported as not expressible, and they must
//! still fail through ours, or the table is out of date).

use std::{collections::BTreeMap, path::Path, process::Command, time::Duration};

use anyhow::{Context, Result, bail, ensure};

use super::{Env, path_with_venv};
use crate::procs;

/// The driver packages whose tests run, as installed from the pinned wheels.
const PACKAGES: &[&str] = &[
    "jumpstarter_driver_shell",
    "jumpstarter_driver_opendal",
    "jumpstarter_driver_pyserial",
    "jumpstarter_driver_power",
    "jumpstarter_driver_composite",
    "jumpstarter_driver_network",
    "jumpstarter_driver_snmp",
    "jumpstarter_driver_qemu",
];

/// Tests that fail with upstream's own `serve` too (test id from the package directory,
/// reason). Each is run with upstream's `serve` on every run and must fail there.
const KNOWN_UPSTREAM_FAILURES: &[(&str, &str)] = &[(
    "jumpstarter_driver_qemu/driver_test.py::test_driver_qemu",
    "downloads UEFI firmware and a Fedora cloud image from the internet (github.com), which the \
     test machines cannot reach",
)];

/// Tests that patch the driver's module in the test process (`unittest.mock.patch`) and
/// expect the driver, served by `serve`, to see the patch: not expressible as an exporter
/// config served by another process (test id, reason).
const IN_PROCESS_ONLY: &[(&str, &str)] = &[
    (
        "jumpstarter_driver_qemu/driver_test.py::test_flash_oci_via_flasher_client",
        "patches asyncio.create_subprocess_exec and get_fls_binary in the test process and \
         expects the served Qemu driver to run the fake fls",
    ),
    (
        "jumpstarter_driver_qemu/driver_test.py::test_flash_oci_convenience_method",
        "patches asyncio.create_subprocess_exec and get_fls_binary in the test process and \
         expects the served Qemu driver to run the fake fls",
    ),
];

/// How long one package's tests may take.
const PACKAGE_TIMEOUT: Duration = Duration::from_secs(900);

/// One test's outcome, as the plugin writes it.
#[derive(Debug)]
struct TestResult {
    /// `passed`, `failed`, `skipped` or `not-expressible`.
    outcome: String,
    /// How many drivers the test had served by our exporter.
    served: u64,
    /// Why it failed or was skipped.
    reason: String,
}

/// The counts of one package (or of all).
#[derive(Debug, Default)]
struct Counts {
    passed: usize,
    /// Of the passed, those that had a driver served by our exporter.
    served: usize,
    failed: usize,
    skipped: usize,
    not_expressible: usize,
    known_upstream: usize,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.passed += o.passed;
        self.served += o.served;
        self.failed += o.failed;
        self.skipped += o.skipped;
        self.not_expressible += o.not_expressible;
        self.known_upstream += o.known_upstream;
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} passed ({} through our exporter), {} failed, {} skipped, {} not expressible, \
             {} known upstream failures",
            self.passed,
            self.served,
            self.failed,
            self.skipped,
            self.not_expressible,
            self.known_upstream
        )
    }
}

/// The directory a package is installed in, in the venv.
fn package_dir(env: &Env, package: &str) -> Result<std::path::PathBuf> {
    let mut c = env.upstream("python");
    c.args([
        "-c",
        "import importlib.util,sys,pathlib\n\
         print(pathlib.Path(importlib.util.find_spec(sys.argv[1]).origin).parent)",
        package,
    ]);
    let out = procs::run(c, Duration::from_secs(60))?;
    super::check(&out, &format!("locating {package}"))?;
    Ok(out.stdout.trim().into())
}

/// Runs pytest on `targets` with the plugin in `mode` (`ours` or `upstream`); returns each
/// test's result by its id relative to `rootdir` (the venv's site-packages), and pytest's
/// output.
fn pytest(
    env: &Env,
    mode: &str,
    name: &str,
    rootdir: &Path,
    targets: &[std::path::PathBuf],
) -> Result<(BTreeMap<String, TestResult>, procs::Output)> {
    let work = env.work.path().join("driver-tests").join(name);
    std::fs::create_dir_all(&work)?;
    let report = work.join("report.json");
    let _ = std::fs::remove_file(&report);
    let mut c = Command::new(env.venv.join("bin/python"));
    c.args([
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "driver_tests_plugin",
    ])
    // Upstream's fabric adapter test runs a command that reads standard input, which
    // pytest's capture refuses; standard input is /dev/null.
    .args(["--capture=no", "-q", "-rfEs", "--rootdir"])
    .arg(rootdir)
    .args(targets)
    .env("PYTHONPATH", &env.scripts)
    .env("PYTHONDONTWRITEBYTECODE", "1")
    .env("PATH", path_with_venv(env))
    .env("JMP_DRIVER_TESTS_MODE", mode)
    .env("JMP_DRIVER_TESTS_JMP", &env.jmp)
    .env("JMP_DRIVER_TESTS_REPORT", &report)
    .env("JMP_DRIVER_TESTS_LOGS", work.join("logs"))
    .env("JMP_PYTHON", env.venv.join("bin/python3"))
    .env("JMP_CLIENT_CONFIG_HOME", work.join("config"))
    .env("HOME", &work)
    .env_remove("JUMPSTARTER_HOST")
    .env_remove("JMP_PYTHON_DRIVERS")
    .current_dir(&work);
    let out = procs::run(c, PACKAGE_TIMEOUT)?;
    // 0: all passed; 1: some failed; 5: none collected (an error below).
    ensure!(
        out.code == 0 || out.code == 1 || out.code == 5,
        "pytest ({mode}) on {name} exited {}\nstdout:\n{}\nstderr:\n{}",
        out.code,
        out.stdout,
        out.stderr
    );
    let text = std::fs::read_to_string(&report).with_context(|| {
        format!(
            "pytest ({mode}) on {name} wrote no report\nstdout:\n{}\nstderr:\n{}",
            out.stdout, out.stderr
        )
    })?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("reading {}", report.display()))?;
    let obj = json
        .as_object()
        .with_context(|| format!("{} is not a mapping", report.display()))?;
    let mut results = BTreeMap::new();
    for (id, r) in obj {
        results.insert(
            id.clone(),
            TestResult {
                outcome: r["outcome"].as_str().unwrap_or("?").to_string(),
                served: r["served"].as_u64().unwrap_or(0),
                reason: r["reason"].as_str().unwrap_or("").to_string(),
            },
        );
    }
    Ok((results, out))
}

/// The first line of a reason, shortened for the summary.
fn short(reason: &str) -> String {
    let line = reason.lines().next().unwrap_or("");
    if line.chars().count() > 200 {
        format!("{}...", line.chars().take(200).collect::<String>())
    } else {
        line.to_string()
    }
}

/// The plugin on itself (`xtask/interop/driver_tests_selfcheck_test.py`): each test's
/// expected outcome and whether our exporter served it.
const SELF_CHECK: &[(&str, &str, bool)] = &[
    ("test_live_object", "not-expressible", false),
    ("test_live_object_caught", "not-expressible", false),
    ("test_wrong_answer", "failed", true),
    ("test_right_answer", "passed", true),
];

/// Runs the plugin's self check: it must tell what the scenario counts on.
fn self_check(env: &Env) -> Result<()> {
    let file = "driver_tests_selfcheck_test.py";
    let (results, out) = pytest(
        env,
        "ours",
        "self-check",
        &env.scripts,
        &[env.scripts.join(file)],
    )?;
    for (test, outcome, served) in SELF_CHECK {
        let id = format!("{file}::{test}");
        let r = results
            .get(&id)
            .with_context(|| format!("the plugin's self check did not run {id}\n{}", out.stdout))?;
        ensure!(
            r.outcome == *outcome && (r.served > 0) == *served,
            "the plugin's self check: {id} was {} (served {}), expected {outcome} (served: \
             {served})\n{}",
            r.outcome,
            r.served,
            tail(&out.stdout, 60)
        );
    }
    ensure!(
        results.len() == SELF_CHECK.len(),
        "the plugin's self check ran {} tests, expected {}",
        results.len(),
        SELF_CHECK.len()
    );
    println!("   the plugin's self check: live objects not expressible, wrong answers fail");
    Ok(())
}

/// The scenario: the plugin's self check, every package's tests through our exporter, then
/// the known upstream failures with upstream's own `serve`.
pub(super) fn upstream_driver_tests(env: &Env) -> Result<()> {
    self_check(env)?;
    let mut total = Counts::default();
    let mut problems = Vec::new();
    let mut seen_known = Vec::new();
    for package in PACKAGES {
        let dir = package_dir(env, package)?;
        let root = dir
            .parent()
            .context("a package directory without a parent")?;
        let (results, out) = pytest(env, "ours", package, root, std::slice::from_ref(&dir))?;
        let mut counts = Counts::default();
        for (id, r) in &results {
            let known = KNOWN_UPSTREAM_FAILURES.iter().find(|(k, _)| k == id);
            let in_process = IN_PROCESS_ONLY.iter().find(|(k, _)| k == id);
            match (r.outcome.as_str(), known, in_process) {
                ("passed", None, None) => {
                    counts.passed += 1;
                    if r.served > 0 {
                        counts.served += 1;
                    }
                }
                ("passed", Some(_), _) => {
                    // Passing through ours is fine; the table entry is still checked below.
                    counts.passed += 1;
                    counts.served += usize::from(r.served > 0);
                    seen_known.push(id.clone());
                }
                ("passed", None, Some(_)) => problems.push(format!(
                    "{id} passed through our exporter: take it out of IN_PROCESS_ONLY"
                )),
                ("failed", Some((_, why)), _) => {
                    counts.known_upstream += 1;
                    seen_known.push(id.clone());
                    println!("   known upstream failure {id}: {why}");
                }
                ("failed", None, Some((_, why))) => {
                    counts.not_expressible += 1;
                    println!("   not expressible {id}: {why}");
                }
                ("failed", None, None) => {
                    counts.failed += 1;
                    problems.push(format!("{id} failed: {}", short(&r.reason)));
                }
                ("skipped", ..) => {
                    counts.skipped += 1;
                    println!("   skipped {id}: {}", short(&r.reason));
                }
                ("not-expressible", ..) => {
                    counts.not_expressible += 1;
                    println!("   not expressible {id}: {}", short(&r.reason));
                }
                (other, ..) => problems.push(format!("{id}: unknown outcome {other:?}")),
            }
        }
        println!("   {package}: {counts}");
        if results.is_empty() {
            problems.push(format!("{package}: no tests collected\n{}", out.stdout));
        }
        if counts.failed > 0 {
            let log = env
                .work
                .path()
                .join("driver-tests")
                .join(package)
                .join("pytest.log");
            let _ = std::fs::write(&log, format!("{}\n{}", out.stdout, out.stderr));
            println!("{}", tail(&out.stdout, 150));
        }
        total.add(&counts);
    }
    for (id, why) in KNOWN_UPSTREAM_FAILURES {
        ensure!(
            seen_known.iter().any(|s| s == id),
            "known upstream failure {id} was not run ({why})"
        );
        let (package, _) = id.split_once('/').context("a test id without a package")?;
        let dir = package_dir(env, package)?;
        let root = dir
            .parent()
            .context("a package directory without a parent")?;
        let (results, out) = pytest(env, "upstream", "upstream-check", root, &[root.join(id)])?;
        match results.get(*id).map(|r| r.outcome.as_str()) {
            Some("failed") => {
                println!("   {id} fails with upstream's own serve too");
            }
            other => bail!(
                "{id} is listed as failing with upstream's own serve ({why}), but there it \
                 was {other:?}: take it out of KNOWN_UPSTREAM_FAILURES\n{}",
                tail(&out.stdout, 60)
            ),
        }
    }
    println!("   upstream's driver tests through our exporter: {total}");
    if !problems.is_empty() {
        bail!(
            "{} of upstream's driver tests do not pass through our exporter:\n{}",
            problems.len(),
            problems.join("\n")
        );
    }
    ensure!(total.passed > 0, "no test passed");
    Ok(())
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_test_names_a_package_that_runs() {
        for (id, why) in KNOWN_UPSTREAM_FAILURES.iter().chain(IN_PROCESS_ONLY) {
            let package = id.split_once('/').map(|(p, _)| p);
            assert!(
                package.is_some_and(|p| PACKAGES.contains(&p)),
                "{id} is not in a package that runs"
            );
            assert!(id.contains("::") && !why.is_empty(), "{id}");
        }
    }

    #[test]
    fn counts_print_every_category() {
        let c = Counts {
            passed: 3,
            served: 2,
            failed: 1,
            skipped: 4,
            not_expressible: 5,
            known_upstream: 6,
        };
        assert_eq!(
            c.to_string(),
            "3 passed (2 through our exporter), 1 failed, 4 skipped, 5 not expressible, \
             6 known upstream failures"
        );
        assert_eq!(short(&"x".repeat(250)).len(), 203);
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
    }
}
