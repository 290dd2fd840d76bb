//! `jmp` start-up: wall time of `jmp version` and `jmp get exporters` (against our
//! controller on loopback), ours next to the upstream Python `jmp` doing the same; and lease
//! to command: `jmp shell -l board=bench -- true` against our controller and our exporter
//! (mock power) on an idle lab, from start to exit.
//!
//! Each command runs several times (lease to command at least [`LEASE_RUNS`] times); the
//! median is reported. Then one more lease to command with `--timings` prints where its time
//! goes. Targets: at least 20x faster start-up, at least 10x faster lease to command, and
//! lease to command within 45 ms.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

use crate::{
    interop::{ensure_venv, tempfile_dir::Dir},
    procs::{self, Background},
};

/// What the controller prints once it serves.
const READY_LINE: &str = "jumpstarter-controller ready:";
const TIMEOUT: Duration = Duration::from_secs(120);
/// Runs of the lease-to-command row (without `--quick`): its steps vary more than a start-up.
const LEASE_RUNS: usize = 21;
/// The lease-to-command target, in milliseconds.
const LEASE_TARGET_MS: f64 = 45.0;

/// Median wall time of `cmd` (rebuilt by `make` for each run), failing on a non-zero exit.
fn median_wall(runs: usize, what: &str, make: &dyn Fn() -> Command) -> Result<Duration> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        let out = procs::run(make(), TIMEOUT)?;
        let took = start.elapsed();
        if out.code != 0 {
            bail!("{what} failed (exit {}): {}", out.code, out.stderr.trim());
        }
        times.push(took);
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// Runs the start-up benchmark. `--quick` runs each command 3 times instead of 11.
pub fn run(args: &[String]) -> Result<()> {
    let runs = if args.iter().any(|a| a == "--quick") {
        3
    } else {
        11
    };
    let rel = crate::bench::build_release()?;
    let venv = ensure_venv()?;
    let work = Dir::new("jmp-bench-startup")?;
    let dir = work.path();
    let admin = dir.join("admin.yaml");
    let client = dir.join("client.yaml");

    let mut c = Command::new(rel.join("jumpstarter-controller"));
    c.arg("--data-dir")
        .arg(dir.join("data"))
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "off", "--admin-config"])
        .arg(&admin)
        .env("RUST_LOG", "warn");
    let mut controller = Background::start("jumpstarter-controller", c)?;
    controller.wait_for_line(READY_LINE, Duration::from_secs(60))?;

    let mut c = ours(&rel.join("jmp"), dir);
    c.args([
        "admin",
        "create",
        "client",
        "bench",
        "--unsafe",
        "--nointeractive",
    ])
    .arg("--admin-config")
    .arg(&admin)
    .arg("--out")
    .arg(&client);
    let out = procs::run(c, TIMEOUT)?;
    if out.code != 0 {
        bail!("jmp admin create client failed: {}", out.stderr.trim());
    }

    // An exporter with mock power, for the lease-to-command row.
    let exporter = dir.join("exporter.yaml");
    let mut c = ours(&rel.join("jmp"), dir);
    c.args([
        "admin",
        "create",
        "exporter",
        "bench-ex",
        "-l",
        "board=bench",
    ])
    .arg("--nointeractive")
    .arg("--admin-config")
    .arg(&admin)
    .arg("--out")
    .arg(&exporter);
    let out = procs::run(c, TIMEOUT)?;
    if out.code != 0 {
        bail!("jmp admin create exporter failed: {}", out.stderr.trim());
    }
    let text = std::fs::read_to_string(&exporter)?;
    if !text.contains("\nexport:\n") {
        bail!("{} has no empty `export:`:\n{text}", exporter.display());
    }
    std::fs::write(
        &exporter,
        text.replace(
            "\nexport:\n",
            "\nexport:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n",
        ),
    )?;
    let mut c = ours(&rel.join("jmp"), dir);
    c.arg("run")
        .arg("--exporter-config")
        .arg(&exporter)
        .env("JMP_LOG", "info");
    let mut run = Background::start("jmp run", c)?;
    run.wait_for_line("registered with controller", Duration::from_secs(60))?;

    println!("== jmp start-up: median wall time of {runs} runs");
    println!(
        "{:<34} {:>12} {:>14} {:>8}",
        "", "ours (ms)", "upstream (ms)", "ratio"
    );
    let jmp = rel.join("jmp");
    let py = venv.join("bin/jmp");
    let client_s = client.to_string_lossy().into_owned();
    // Lease to command on an idle lab: create the lease, wait for the grant, dial through
    // the router, run `true`, end the session, release (issue 27's "lease-to-command").
    let shell: Vec<String> = [
        "shell",
        "--client-config",
        &client_s,
        "-l",
        "board=bench",
        "--",
        "true",
    ]
    .map(String::from)
    .to_vec();
    let commands: [(&str, Vec<String>); 3] = [
        ("jmp version", vec!["version".into()]),
        (
            "jmp get exporters",
            vec![
                "get".into(),
                "exporters".into(),
                "--client-config".into(),
                client.to_string_lossy().into_owned(),
            ],
        ),
        ("jmp shell -l ... -- true", shell),
    ];
    let mut worst = f64::INFINITY;
    let mut lease_ratio = f64::NAN;
    let mut lease_ms = f64::NAN;
    for (name, args) in &commands {
        let is_shell = args.first().map(String::as_str) == Some("shell");
        let runs = if is_shell && runs > 3 {
            runs.max(LEASE_RUNS)
        } else {
            runs
        };
        let ours_t = median_wall(runs, &format!("(ours) {name}"), &|| {
            let mut c = ours(&jmp, dir);
            c.args(args);
            c
        })?;
        let py_t = median_wall(runs, &format!("(python) {name}"), &|| {
            let mut c = Command::new(&py);
            c.env("JMP_CLIENT_CONFIG_HOME", dir.join("py-config"))
                .env_remove("JUMPSTARTER_HOST")
                .current_dir(dir)
                .args(args);
            c
        })?;
        let ratio = py_t.as_secs_f64() / ours_t.as_secs_f64().max(1e-9);
        if is_shell {
            lease_ratio = ratio;
            lease_ms = ours_t.as_secs_f64() * 1e3;
        } else {
            worst = worst.min(ratio);
        }
        println!(
            "{:<34} {:>12.1} {:>14.1} {:>7.1}x",
            name,
            ours_t.as_secs_f64() * 1e3,
            py_t.as_secs_f64() * 1e3,
            ratio
        );
    }
    println!("target: start-up at least 20x faster (lowest ratio here: {worst:.1}x)");
    println!("target: lease to command at least 10x faster (here: {lease_ratio:.1}x)");
    println!(
        "target: lease to command within {LEASE_TARGET_MS:.0} ms (here: {lease_ms:.1} ms, {})",
        if lease_ms <= LEASE_TARGET_MS {
            "met"
        } else {
            "not met"
        }
    );
    // Where one lease to command spends its time (`jmp shell --timings`).
    let mut c = ours(&jmp, dir);
    c.args([
        "shell",
        "--timings",
        "--client-config",
        &client_s,
        "-l",
        "board=bench",
        "--",
        "true",
    ]);
    let out = procs::run(c, TIMEOUT)?;
    if out.code != 0 {
        bail!("(ours) jmp shell --timings failed: {}", out.stderr.trim());
    }
    println!("== one lease to command, jmp shell --timings:");
    match out.stderr.find("timings (") {
        Some(at) => print!("{}", &out.stderr[at..]),
        None => bail!("jmp shell --timings printed no timeline:\n{}", out.stderr),
    }
    run.stop();
    controller.stop();
    Ok(())
}

/// Our `jmp` with this run's config home.
fn ours(jmp: &Path, dir: &Path) -> Command {
    let mut c = Command::new(jmp);
    c.env("JMP_CLIENT_CONFIG_HOME", dir.join("rs-config"))
        .env_remove("JUMPSTARTER_HOST")
        .env_remove("JMP_ADMIN_CONFIG")
        .current_dir(dir);
    c
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_of_a_failing_command_is_an_error() {
        let err = super::median_wall(1, "false", &|| std::process::Command::new("false"));
        assert!(err.is_err());
        let ok = super::median_wall(3, "true", &|| std::process::Command::new("true"));
        assert!(ok.is_ok());
    }
}
