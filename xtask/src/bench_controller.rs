//! Controller scale: lease grant latency with 1,000 and 10,000 exporters holding Status
//! streams, and the controller's CPU time and peak memory (`--quick`: 100 and 1,000).
//! `--store kubernetes`: each size also with the controller keeping its objects in the
//! cluster `cargo xtask kube-up` runs (`--store kubernetes` as the controller's
//! ServiceAccount, objects in namespace [`KUBE_NAMESPACE`], emptied before and after), side
//! by side with SQLite.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context, Result, bail};

use crate::{
    bench::json_number,
    procs::{self, Background},
};

/// Peak resident set (VmHWM) and CPU seconds (user + system) of a process, from /proc.
fn usage(pid: u32) -> Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let hwm_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmHWM in /proc status")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces) start at ") ".
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the full line (11 and 12 here), in clock ticks.
    let cpu = (ticks(11) + ticks(12)) / 100.0;
    Ok((hwm_kb / 1024.0, cpu))
}

/// The namespace of the Kubernetes runs: the controller's own and the benchmark's objects.
pub const KUBE_NAMESPACE: &str = "jumpstarter-bench";

/// Where the controller keeps its objects in one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreKind {
    Sqlite,
    Kubernetes,
}

/// Creates [`KUBE_NAMESPACE`] if needed and deletes every Jumpstarter object and Secret in it.
fn empty_kube_namespace() -> Result<()> {
    crate::kube::kubectl_input(
        &[
            "apply",
            "--server-side",
            "--field-manager=jumpstarter-xtask",
            "-f",
            "-",
        ],
        Some(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {KUBE_NAMESPACE}\n"
        )),
    )?;
    const KINDS: &str =
        "exporters.jumpstarter.dev,clients.jumpstarter.dev,leases.jumpstarter.dev,secrets";
    // Not `kubectl delete`'s own wait: it hung for minutes here (kubectl 1.34, 100
    // exporters) after every object was gone. Poll for an empty namespace instead.
    crate::kube::kubectl(&[
        "delete",
        "-n",
        KUBE_NAMESPACE,
        "--all",
        "--ignore-not-found",
        "--wait=false",
        KINDS,
    ])?;
    for _ in 0..240 {
        let left = crate::kube::kubectl(&["get", "-n", KUBE_NAMESPACE, KINDS, "-o", "name"])?;
        if left.trim().is_empty() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    anyhow::bail!("the objects in namespace {KUBE_NAMESPACE} were not deleted within 2 minutes")
}

fn one(
    bin: &Path,
    example: &Path,
    exporters: usize,
    leases: usize,
    store: StoreKind,
) -> Result<()> {
    let work = crate::interop::tempfile_dir::Dir::new("jmp-bench-ctl")?;
    let admin = work.path().join("admin.yaml");
    let mut cmd = Command::new(bin.join("jumpstarter-controller"));
    let mut namespace = "default";
    if store == StoreKind::Kubernetes {
        empty_kube_namespace()?;
        cmd.args(["--store", "kubernetes", "--namespace", KUBE_NAMESPACE])
            .env("KUBECONFIG", crate::kube::controller_kubeconfig());
        namespace = KUBE_NAMESPACE;
    }
    cmd.arg("--data-dir")
        .arg(work.path().join("data"))
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "off"])
        .arg("--admin-config")
        .arg(&admin)
        .env("RUST_LOG", "warn");
    let controller = Background::start("jumpstarter-controller", cmd)?;
    procs::wait_path(&admin, Duration::from_secs(60))?;
    let mut run = Command::new(example);
    run.arg(&admin)
        .arg(exporters.to_string())
        .arg(leases.to_string())
        .arg(namespace);
    let out = procs::run(run, Duration::from_secs(1800))?;
    if out.code != 0 {
        bail!("bench_scale failed: {}{}", out.stdout, out.stderr);
    }
    let (rss_mb, cpu_s) = usage(controller.pid())?;
    drop(controller);
    if store == StoreKind::Kubernetes {
        empty_kube_namespace()?;
    }
    let line = out.stdout.lines().last().unwrap_or_default();
    let n = |key: &str| json_number(line, key);
    println!(
        "{:>10} {:>9} {:>10.1} {:>10.1} {:>12.1} {:>12.1} {:>10.0} {:>12.1}",
        match store {
            StoreKind::Sqlite => "sqlite",
            StoreKind::Kubernetes => "kubernetes",
        },
        exporters,
        n("grant_p50_ms")?,
        n("grant_p99_ms")?,
        n("create_secs")?,
        n("register_secs")?,
        rss_mb,
        cpu_s
    );
    Ok(())
}

/// Runs the controller scale benchmark.
pub fn run(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let kube = match args
        .iter()
        .position(|a| a == "--store")
        .map(|i| args.get(i + 1).map(String::as_str))
    {
        None | Some(Some("sqlite")) => false,
        Some(Some("kubernetes")) => true,
        Some(other) => bail!("--store sqlite|kubernetes, not {other:?}"),
    };
    if kube {
        crate::kube::running()?;
    }
    let rel = crate::bench::build_release()?;
    let example = rel.join("examples/bench_scale");
    let sizes: &[usize] = if quick { &[100, 1000] } else { &[1000, 10_000] };
    let leases = if quick { 50 } else { 200 };
    println!(
        "== controller scale: {leases} leases granted one by one, exporters holding Status streams"
    );
    println!(
        "{:>10} {:>9} {:>10} {:>10} {:>12} {:>12} {:>10} {:>12}",
        "store",
        "exporters",
        "p50 (ms)",
        "p99 (ms)",
        "create (s)",
        "register (s)",
        "RSS (MB)",
        "run CPU (s)"
    );
    for &n in sizes {
        one(&rel, &example, n, leases, StoreKind::Sqlite)?;
        if kube {
            one(&rel, &example, n, leases, StoreKind::Kubernetes)?;
        }
    }
    println!(
        "run CPU: the controller's user and system time over the whole run, creating and \
         registering the exporters included (CPU per grant in a burst: cargo xtask bench-scale)"
    );
    println!("targets: grant p99 < 50 ms at 10,000 exporters, controller RSS < 512 MB");
    Ok(())
}
