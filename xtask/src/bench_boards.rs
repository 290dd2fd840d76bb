//! `cargo xtask bench-boards` (part of `cargo xtask bench`): the QEMU board's speed.
//!
//! - Flashing: a 1 GiB image written into the board's disk with `j board flasher flash`,
//!   next to the plain storage upload rate (`j storage write-local-file` into a
//!   `MockStorageMux`) of the same image, measured in the same `jmp shell`, interleaved, so
//!   both see the same machine. The target is flashing at >= 80% of the upload rate.
//! - Boot to prompt: from upstream's `QemuClient.power.on()` to the shell prompt on the
//!   console (`pexpect()`), with the test board of `cargo xtask qemu-board` under TCG
//!   (what CI has), through our `jmp shell`.
//!
//! `--size-mib N` changes the image size (default 1024); `--quick` means 64 MiB.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context, Result, ensure};

use crate::{bench_storage::scratch_dir, interop::ensure_venv, procs};

/// Runs of each transfer; the figure is the median.
const RUNS: usize = 3;

const CONFIG: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata: {namespace: default, name: bench-boards}
endpoint: \"\"
token: \"\"
export:
  board:
    type: jumpstarter_driver_qemu.driver.Qemu
    config:
      arch: x86_64
      accel: tcg
      smp: 1
      mem: 256M
  storage:
    type: jumpstarter_driver_opendal.driver.MockStorageMux
";

/// A file of `len` pseudo-random bytes (incompressible, so nothing is shortcut).
fn random_file(path: &Path, len: u64) -> Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut block = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for chunk in block.chunks_mut(8) {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let v = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn parse_size(args: &[String]) -> Result<u64> {
    if args.iter().any(|a| a == "--quick") {
        return Ok(64);
    }
    match args.iter().position(|a| a == "--size-mib") {
        None => Ok(1024),
        Some(i) => args
            .get(i + 1)
            .and_then(|s| s.parse().ok())
            .filter(|n| *n > 0)
            .context("--size-mib takes a positive number"),
    }
}

/// Runs the board bench and prints the figures.
pub fn run(args: &[String]) -> Result<()> {
    let size_mib = parse_size(args)?;
    let size = size_mib * 1024 * 1024;
    let image = crate::qemu_board::prepare()?;
    let venv = ensure_venv()?;
    let rel = crate::bench::build_release()?;
    let (jmp, j) = (rel.join("jmp"), rel.join("j"));
    // The image, the storage medium (and its partial copy) and the board's disk (and its
    // partial copy).
    let (scratch, on_tmpfs) = scratch_dir(size)?;
    let work = crate::interop::tempfile_dir::Dir::new("jmp-bench-boards")?;
    let cfg = work.path().join("exporter.yaml");
    std::fs::write(&cfg, CONFIG)?;
    let src = scratch.path().join("src.img");
    random_file(&src, size)?;
    println!(
        "== board bench: {size_mib} MiB image, files on {}",
        if on_tmpfs { "tmpfs (/dev/shm)" } else { "disk" }
    );

    // Flashing vs plain storage upload, interleaved, in one jmp shell.
    let inner = format!(
        "for i in {runs}; do \
           t0=$(date +%s.%N); \"{j}\" storage write-local-file \"{src}\" >/dev/null || exit 1; \
           t1=$(date +%s.%N); \"{j}\" board flasher flash \"{src}\" >/dev/null 2>&1 || exit 2; \
           t2=$(date +%s.%N); echo \"times $t0 $t1 $t2\"; \
         done",
        runs = (1..=RUNS)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(" "),
        j = j.display(),
        src = src.display(),
    );
    let mut c = Command::new(&jmp);
    c.env("TMPDIR", scratch.path())
        .args(["shell", "--exporter-config"])
        .arg(&cfg)
        .args(["--", "sh", "-c", &inner]);
    let out = procs::run(c, Duration::from_secs(1800))?;
    ensure!(
        out.code == 0,
        "jmp shell board flash bench exited {}\n{}\n{}",
        out.code,
        out.stdout,
        out.stderr
    );
    let (mut upload, mut flash) = (Vec::new(), Vec::new());
    for line in out.stdout.lines().filter(|l| l.starts_with("times ")) {
        let t: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .with_context(|| format!("bad timing line {line:?}"))?;
        ensure!(t.len() == 3, "bad timing line {line:?}");
        upload.push(t[1] - t[0]);
        flash.push(t[2] - t[1]);
    }
    ensure!(upload.len() == RUNS, "timings missing:\n{}", out.stdout);
    let mbps = |secs: f64| size as f64 / 1e6 / secs;
    let (up, fl) = (mbps(median(upload.clone())), mbps(median(flash.clone())));
    let spread = |v: &[f64]| {
        let r: Vec<f64> = v.iter().map(|s| mbps(*s)).collect();
        let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.iter().copied().fold(0.0, f64::max);
        format!("[{lo:.0}-{hi:.0}]")
    };
    println!("(medians of {RUNS} runs, slowest and fastest in brackets; Unix socket, jmp shell)");
    println!(
        "plain storage upload (j storage write-local-file): {up:>7.0} MB/s {}",
        spread(&upload)
    );
    println!(
        "QEMU board flash (j board flasher flash):          {fl:>7.0} MB/s {}",
        spread(&flash)
    );
    println!("flash / upload: {:.0}% (target >= 80%)", 100.0 * fl / up);
    drop(scratch);

    // Boot to prompt with upstream's client (TCG).
    let mut c = Command::new(&jmp);
    c.env(
        "PATH",
        format!(
            "{}:{}",
            venv.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    )
    .args(["shell", "--exporter-config"])
    .arg(&cfg)
    .arg("--")
    .arg(venv.join("bin/python"))
    .arg(crate::workspace_root().join("xtask/interop/qemu_board.py"))
    .arg(&image);
    let out = procs::run(c, Duration::from_secs(600))?;
    ensure!(
        out.code == 0 && out.stdout.contains("python qemu ok"),
        "boot-to-prompt run failed ({})\n{}\n{}",
        out.code,
        out.stdout,
        out.stderr
    );
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("prompt after"))
        .context("qemu_board.py printed no boot time")?;
    println!(
        "QEMU test board, power on to shell prompt (TCG): {}",
        &line["prompt after ".len()..]
    );
    Ok(())
}
