//! What the scale benchmarks (`bench_scale`, `bench_tunnels`) share: running a load
//! generator and printing the rows of their figures table.

use std::{
    io::Read,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// `/proc/loadavg`'s first three fields.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Runs the example `name` (built in `profile_dir`) with `args`: its progress on stderr goes
/// to ours, its last stdout line (a JSON object) is returned. Fails when it exits non-zero.
pub fn run_example(path: &std::path::Path, args: &[String]) -> Result<String> {
    let mut child = Command::new(path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", path.display()))?;
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout.read_to_string(&mut out)?;
    }
    let status = child.wait()?;
    let line = out.lines().last().unwrap_or_default().to_string();
    if !status.success() {
        bail!("{} failed ({status}): {line}", path.display());
    }
    Ok(line)
}

/// Prints one line of a figures table: what, the value, the target and whether it is met.
pub fn row(what: &str, value: String, target: &str, met: Option<bool>) {
    let mark = match met {
        Some(true) => "met",
        Some(false) => "NOT MET",
        None => "",
    };
    println!("{what:<52} {value:>12}  {target:<16} {mark}");
}
