//! `cargo xtask ci [--timings] [--full]`: everything CI runs, in the order that keeps two
//! cores busy.
//!
//! 1. `cargo fmt --check` and the architecture checks (seconds).
//! 2. Started in the background, each a child `xtask` with its output in
//!    `target/ci/NAME.log`: what the tests need from outside (Debian packages, the QEMU
//!    board, the venvs) and the Go build of kube-apiserver and etcd (at the lowest CPU
//!    priority, so that it only takes what cargo leaves). Both are cached outside the
//!    checkout, under names that carry their versions ([`crate::cache_root`]): a warm run
//!    only checks them.
//! 3. One build of every target of the workspace, with the lints: the workspace's crates
//!    are compiled through `clippy-driver`, so this build reports what `cargo clippy
//!    --all-targets` would, and any warning fails it. Every later step reuses it.
//! 4. `cargo doc` with `-D warnings`.
//! 5. `cargo test --workspace` (the S3 service's tests against moto included).
//! 6. The suites that run the binaries against real servers: interop with upstream 0.9.0,
//!    the web dashboard in headless chromium, fault injection, the container images, the
//!    lab at scale (smoke), and last the Kubernetes backend (its API server built meanwhile).
//!
//! `--timings` prints each step's seconds as it ends and a table at the end (also of a
//! failed run, up to the step that failed). `--full` runs the long soak of fault injection
//! instead of its quick round.

use std::{
    fs::File,
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::ci_summary::{self, format_elapsed};

/// The options of `cargo xtask ci`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Options {
    timings: bool,
    full: bool,
}

fn options(args: &[String]) -> Result<Options> {
    let mut o = Options::default();
    for a in args {
        match a.as_str() {
            "--timings" => o.timings = true,
            "--full" => o.full = true,
            other => bail!("cargo xtask ci: unknown option {other:?} (--timings, --full)"),
        }
    }
    Ok(o)
}

/// Runs CI.
pub fn run(args: &[String]) -> Result<()> {
    let o = options(args)?;
    let started = Instant::now();
    let mut t = Timings::new(o.timings);
    let result = steps(o, &mut t);
    if o.timings || result.is_err() {
        t.print(started.elapsed());
    }
    let (tests, interop) = result?;
    println!(
        "{}",
        ci_summary::pass_line(tests, interop, started.elapsed())
    );
    Ok(())
}

fn steps(o: Options, t: &mut Timings) -> Result<(ci_summary::TestCounts, (usize, usize))> {
    t.step("cargo fmt --check", || {
        crate::cargo(&["fmt", "--all", "--", "--check"])
    })?;
    t.step("architecture (cargo xtask arch)", crate::arch::run)?;

    let mut prepare = Helper::start("prepare", &["ci-prepare"], 10)?;
    let mut kube = Helper::start("kube-build", &["kube-build"], 19)?;
    // Offline, a second or two (its venv, once: ~15 s); against the API server in kube-e2e.
    t.step("Kubernetes manifests, strict schemas", || {
        crate::manifests::run(&[])
    })?;

    crate::workspace::lint_while_building()?;
    t.step("build all targets, with clippy -D warnings", build_and_lint)?;
    t.step("cargo doc -D warnings", || {
        crate::cargo_with_env(
            &[
                "doc",
                "--workspace",
                "--no-deps",
                "--quiet",
                "--features",
                crate::TEST_FEATURES,
            ],
            &[("RUSTDOCFLAGS", "-D warnings")],
        )
    })?;
    t.step("(waiting) Debian packages, QEMU board, venvs", || {
        prepare.wait()
    })?;

    let venv = crate::interop::ensure_venv()?;
    let s3_python = crate::s3::venv()?.join("bin/python");
    let board = crate::qemu_board::prepare()?;
    let tests = t.step("cargo test --workspace (with S3 against moto)", || {
        ci_summary::cargo_test(
            &["test", "--workspace", "--features", crate::TEST_FEATURES],
            &[
                ("JUMPSTARTER_UPSTREAM_VENV", &venv.to_string_lossy()),
                ("JMP_TEST_S3_PYTHON", &s3_python.to_string_lossy()),
                ("JUMPSTARTER_QEMU_BOARD_IMAGE", &board.to_string_lossy()),
            ],
        )
    })?;

    let interop = t.step("interop with upstream 0.9.0", || crate::interop::run(None))?;
    // A Rust program that uses only the jumpstarter-core facade, against a lab on loopback.
    t.step("examples/lab-harness against a local lab", || {
        crate::lab_harness::run(&[])
    })?;
    // The web dashboard in headless chromium; its screenshots in target/ci-artifacts/dashboard.
    t.step("dashboard in headless chromium", || {
        crate::dashboard_e2e::run(&[])
    })?;
    if o.full {
        t.step("fault injection (soak)", || crate::faults::run(&[]))?;
    } else {
        t.step("fault injection (--quick)", || {
            crate::faults::run(&["--quick".to_string()])
        })?;
    }
    // With the debug build (CI has no release build); layers, checks and `--help` in a
    // chroot.
    t.step("container images (--debug)", || {
        crate::images::run(&["--debug".to_string()])
    })?;
    t.step("lab at scale, smoke (bench-scale --quick)", || {
        crate::bench_scale::run(&["--quick".to_string()])
    })?;
    // Last: on a cold machine the Go build, at the lowest priority, takes what the steps
    // above leave of the two cores.
    t.step("(waiting) kube-apiserver and etcd", || kube.wait())?;
    // The archives of the container images step, run by podman against its API server.
    let images = crate::target_dir().join("images").display().to_string();
    t.step("the Kubernetes backend against a real API server", || {
        crate::kube_e2e::run(&["--images".to_string(), images])
    })?;
    Ok((tests, interop))
}

/// `cargo xtask ci-prepare` (started by `ci`): the Debian packages (podman and runc for the
/// images among them, snmpd, prometheus and chromium), the QEMU board and the venvs the
/// tests need.
pub fn prepare() -> Result<()> {
    crate::qemu_board::prepare()?;
    crate::snmpd::prepare()?;
    crate::prometheus::prepare()?;
    crate::boot_tools::ensure()?;
    crate::cdp::ensure_chromium()?;
    crate::podman::ensure_podman()?;
    crate::interop::ensure_venv()?;
    crate::s3::venv()?;
    Ok(())
}

/// `cargo xtask kube-build` (started by `ci`): kube-apiserver and etcd, built once.
pub fn kube_build() -> Result<()> {
    crate::kube::ensure_binaries()?;
    crate::go_controller::ensure_binaries().map(|_| ())
}

/// Builds every target of the workspace (what `cargo test --workspace` runs, and the
/// examples) with the lints on, printing the compiler's messages; fails on any warning.
/// The workspace has no benches, so these are all its targets.
fn build_and_lint() -> Result<()> {
    // The one debug build of the run, with cargo's JSON messages instead of `--quiet`.
    let args: Vec<&str> = crate::workspace::DEBUG_BUILD
        .iter()
        .copied()
        .filter(|a| *a != "--quiet")
        .chain(["--message-format", "json"])
        .collect();
    let mut child = crate::cargo_command(&args)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start cargo")?;
    let mut lint = LintCount::default();
    if let Some(out) = child.stdout.take() {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines() {
            let line = line.context("cannot read cargo's output")?;
            if let Some(rendered) = lint.add(&line) {
                print!("{rendered}");
            }
        }
    }
    let status = child.wait().context("cannot wait for cargo")?;
    if !status.success() {
        bail!("the build failed ({status})");
    }
    if lint.warnings > 0 {
        bail!(
            "{} warning(s) in the workspace's code (clippy and rustc, -D warnings)",
            lint.warnings
        );
    }
    Ok(())
}

/// The compiler messages of a `--message-format json` build.
#[derive(Debug, Default, PartialEq, Eq)]
struct LintCount {
    warnings: usize,
}

impl LintCount {
    /// Reads one line of cargo's JSON output; returns the message to print, if it is one.
    /// Counts warnings and errors, not rustc's closing "N warnings emitted".
    fn add(&mut self, line: &str) -> Option<String> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        if v.get("reason")?.as_str()? != "compiler-message" {
            return None;
        }
        let message = v.get("message")?;
        let rendered = message.get("rendered")?.as_str()?.to_string();
        let level = message.get("level")?.as_str()?;
        let summary = message
            .get("spans")
            .and_then(|s| s.as_array())
            .is_some_and(|s| s.is_empty())
            && message.get("code").is_none_or(|c| c.is_null());
        if matches!(level, "warning" | "error") && !summary {
            self.warnings += 1;
        }
        Some(rendered)
    }
}

/// A child `xtask` running beside the steps, its output in `target/ci/NAME.log`.
struct Helper {
    name: &'static str,
    log: PathBuf,
    child: Option<Child>,
    started: Instant,
}

impl Helper {
    /// Starts `xtask ARGS` at CPU priority `nice` (0 normal, 19 lowest).
    fn start(name: &'static str, args: &[&str], nice: u8) -> Result<Self> {
        let dir = crate::target_dir().join("ci");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let exe = std::env::current_exe().context("cannot find the xtask binary")?;
        // A process group of its own: stopping it stops what it started (go build, pip).
        let child = Command::new("nice")
            .process_group(0)
            .arg("-n")
            .arg(nice.to_string())
            .arg(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting xtask {}", args.join(" ")))?;
        println!(
            "== started in the background: {name} (output in {})",
            log.display()
        );
        Ok(Self {
            name,
            log,
            child: Some(child),
            started: Instant::now(),
        })
    }

    /// Waits for it; on failure, its output is the error.
    fn wait(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let status = child.wait().context("cannot wait for a background step")?;
        let took = self.started.elapsed();
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        if !status.success() {
            bail!(
                "{} failed ({status}) after {}:\n{text}",
                self.name,
                format_elapsed(took)
            );
        }
        println!(
            "== {} done, {} after it started (its output: {})",
            self.name,
            format_elapsed(took),
            self.log.display()
        );
        Ok(())
    }
}

impl Drop for Helper {
    /// A failed step before the wait: the helper and everything it started stop.
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Each step's wall time.
struct Timings {
    print_each: bool,
    steps: Vec<(String, Duration, bool)>,
}

impl Timings {
    fn new(print_each: bool) -> Self {
        Self {
            print_each,
            steps: Vec::new(),
        }
    }

    /// Runs one step, announcing it and recording how long it took and whether it passed.
    fn step<T>(&mut self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        println!("== {name}");
        let started = Instant::now();
        let r = f();
        let took = started.elapsed();
        if self.print_each {
            println!(
                "== {name}: {:.0} s{}",
                took.as_secs_f64(),
                if r.is_ok() { "" } else { " (failed)" }
            );
        }
        self.steps.push((name.to_string(), took, r.is_ok()));
        r.with_context(|| format!("step {name:?}"))
    }

    fn print(&self, total: Duration) {
        println!("{}", self.table(total));
    }

    /// The table: one line a step, then the total.
    fn table(&self, total: Duration) -> String {
        let width = self
            .steps
            .iter()
            .map(|(n, _, _)| n.len())
            .max()
            .unwrap_or(0)
            .max(5);
        let mut out = String::from("== ci timings (wall clock, seconds)\n");
        for (name, took, ok) in &self.steps {
            out.push_str(&format!(
                "{name:<width$}  {:>6.0}{}\n",
                took.as_secs_f64(),
                if *ok { "" } else { "  FAILED" }
            ));
        }
        out.push_str(&format!(
            "{:<width$}  {:>6.0}  ({})",
            "total",
            total.as_secs_f64(),
            format_elapsed(total)
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        assert_eq!(options(&[]).unwrap(), Options::default());
        let o = options(&["--timings".into(), "--full".into()]).unwrap();
        assert!(o.timings && o.full);
        let e = options(&["--fast".into()]).unwrap_err().to_string();
        assert!(e.contains("--fast") && e.contains("--timings"), "{e}");
    }

    #[test]
    fn warnings_and_errors_count_and_their_summary_does_not() {
        let mut c = LintCount::default();
        let msg = |level: &str, spans: &str, code: &str| {
            format!(
                r#"{{"reason":"compiler-message","message":{{"rendered":"{level}: x\n","level":"{level}","spans":{spans},"code":{code}}}}}"#
            )
        };
        let span = r#"[{"file_name":"a.rs"}]"#;
        assert_eq!(
            c.add(&msg("warning", span, r#"{"code":"clippy::len_zero"}"#)),
            Some("warning: x\n".into())
        );
        c.add(&msg("error", span, "null"));
        // rustc's "warning: 2 warnings emitted": no span, no code.
        c.add(&msg("warning", "[]", "null"));
        c.add(&msg("note", span, "null"));
        assert_eq!(c.add(r#"{"reason":"compiler-artifact"}"#), None);
        assert_eq!(c.add("not json"), None);
        assert_eq!(c.warnings, 2);
    }

    #[test]
    fn the_table_names_each_step_its_seconds_and_a_failure() {
        let mut t = Timings::new(false);
        t.step("fmt", || Ok(())).unwrap();
        let _ = t.step("a longer step", || -> Result<()> { bail!("no") });
        let table = t.table(Duration::from_secs(125));
        assert!(table.contains("fmt"), "{table}");
        assert!(
            table.contains("a longer step") && table.contains("FAILED"),
            "{table}"
        );
        assert!(table.ends_with("(2m 05s)"), "{table}");
    }
}
