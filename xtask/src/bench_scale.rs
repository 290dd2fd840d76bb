//! `cargo xtask bench-scale [--quick] [--exporters N] [--per-conn K] [--only controller|router]`:
//! the lab at full load on one machine.
//!
//! 1. The controller with N live exporters (default 10,000; `--quick`: 200), all spoken for
//!    by one load-generator process (`jumpstarter-controller` example `scale_load`), K
//!    exporters per HTTP/2 connection (default 100): RSS, idle CPU, store commits per
//!    second, lease grants with 1,000 clients asking at once, 1,000 exporters dropping at
//!    once, a restart.
//! 2. The router with 1,000 tunnels (`--quick`: 50): see [`crate::bench_tunnels`].
//!
//! `--quick` (a CI smoke, debug builds) checks only that the machinery works and that the
//! counts add up; it asserts nothing about speed.

use anyhow::{Context, Result, bail};

use crate::{
    bench::json_number,
    bench_table::{loadavg, row, run_example},
};

fn flag_value(args: &[String], name: &str) -> Result<Option<usize>> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .map(Some)
            .with_context(|| format!("{name} needs a number")),
    }
}

/// Runs the scale benchmark.
pub fn run(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    // `--only controller` / `--only router`: one of the two parts.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .map(|i| args.get(i + 1).map(String::as_str).unwrap_or_default());
    if let Some(part) = only
        && part != "controller"
        && part != "router"
    {
        bail!("--only takes controller or router, not {part:?}");
    }
    let n = flag_value(args, "--exporters")?.unwrap_or(if quick { 200 } else { 10_000 });
    let per_conn = flag_value(args, "--per-conn")?.unwrap_or(if quick { 50 } else { 100 });
    let clients = (if quick { 50 } else { 1000 }).min(n);
    // Noticing a drop takes the minute after which an exporter counts as offline: not in
    // the smoke run.
    let drop_n = if quick { 0 } else { 1000.min(n) };
    let idle_secs = if quick { 3 } else { 30 };
    // The release binaries come from the one release build every benchmark shares
    // (`bench::build_release`); the smoke run in CI uses debug builds (CI has no release
    // build), most of them already built by `cargo test --workspace`.
    let dir = if quick {
        crate::debug_build()?
    } else {
        crate::bench::build_release()?
    };
    if only == Some("router") {
        return crate::bench_tunnels::run(&dir, quick);
    }
    let work = crate::interop::tempfile_dir::Dir::new("jmp-bench-scale")?;

    let load_before = loadavg();
    println!(
        "== controller at scale: {n} live exporters ({per_conn} per HTTP/2 connection), \
         {clients} clients, {} build, load average {load_before}",
        if quick { "debug" } else { "release" }
    );
    let line = run_example(
        &dir.join("examples/scale_load"),
        &[
            dir.join("jumpstarter-controller").display().to_string(),
            work.path().display().to_string(),
            n.to_string(),
            clients.to_string(),
            drop_n.to_string(),
            idle_secs.to_string(),
            per_conn.to_string(),
        ],
    )?;
    let f = |k: &str| json_number(&line, k);
    let fmt = |v: f64, prec: usize| {
        if v < 0.0 {
            "n/a".to_string()
        } else {
            format!("{v:.prec$}")
        }
    };
    println!("{:<52} {:>12}  {:<16}", "figure", "value", "target");
    row(
        "create exporters + clients (admin API, s)",
        fmt(f("create_secs")?, 1),
        "",
        None,
    );
    row(
        "all exporters registered, Status held (s)",
        fmt(f("register_secs")?, 1),
        "",
        None,
    );
    let rss = f("rss_idle_mib")?;
    row(
        "controller RSS, idle (MiB)",
        fmt(rss, 0),
        "< 1024",
        Some(rss < 1024.0),
    );
    row(
        "controller RSS, 1,000 leases held (MiB)",
        fmt(f("rss_leased_mib")?, 0),
        "",
        None,
    );
    row(
        "controller peak RSS, whole run (MiB)",
        fmt(f("rss_hwm_mib")?, 0),
        "",
        None,
    );
    let cpu = f("idle_cpu_pct")?;
    row(
        &format!(
            "controller CPU, idle {:.0} s (% of a core)",
            f("idle_secs")?
        ),
        fmt(cpu, 1),
        "< 10",
        Some(cpu < 10.0),
    );
    let commits = f("store_commits_per_sec")?;
    row(
        "store commits per second, idle",
        fmt(commits, 1),
        "batched",
        (commits >= 0.0).then_some(commits <= 2.0),
    );
    row(
        &format!("leases granted (of {clients} asked at once)"),
        format!("{:.0}", f("granted")?),
        "all",
        Some(f("granted")? as usize == clients),
    );
    // The floor under the grants: the cheapest call the controller answers, sent
    // by every client at once over the same connections, and the ES256 check each client's
    // first call pays. The grant p99 cannot be lower than what these cost the two cores.
    row(
        &format!("floor: {clients} health checks at once, p50 / p99 (ms)"),
        format!(
            "{} / {}",
            fmt(f("floor_p50_ms")?, 1),
            fmt(f("floor_p99_ms")?, 1)
        ),
        "",
        None,
    );
    row(
        "floor: their CPU, controller / load generator (ms)",
        format!(
            "{} / {}",
            fmt(f("floor_ctl_cpu_ms")?, 0),
            fmt(f("floor_gen_cpu_ms")?, 0)
        ),
        "",
        None,
    );
    row(
        "floor: ES256 check of a new token (µs)",
        fmt(f("es256_check_us")?, 0),
        "",
        None,
    );
    row("grant p50 (ms)", fmt(f("grant_p50_ms")?, 1), "", None);
    let p99 = f("grant_p99_ms")?;
    row("grant p99 (ms)", fmt(p99, 1), "< 100", Some(p99 < 100.0));
    row("grant max (ms)", fmt(f("grant_max_ms")?, 1), "", None);
    row(
        "all leases granted (s)",
        fmt(f("grant_all_secs")?, 2),
        "",
        None,
    );
    row(
        "CreateLease answered: p50 (ms)",
        fmt(f("create_p50_ms")?, 1),
        "",
        None,
    );
    row(
        "CreateLease answered: p99 (ms)",
        fmt(f("create_p99_ms")?, 1),
        "",
        None,
    );
    // What the two cores did between the calls leaving and the last grant (controller and
    // load generator share them): the floor under the grant p99.
    row(
        "CPU until the last grant: controller (ms)",
        fmt(f("grant_ctl_cpu_ms")?, 0),
        "",
        None,
    );
    row(
        "CPU until the last grant: load generator (ms)",
        fmt(f("grant_gen_cpu_ms")?, 0),
        "",
        None,
    );
    // The controller's share of that, per lease granted.
    let granted = f("granted")?;
    row(
        "controller CPU per grant (ms)",
        if granted > 0.0 {
            fmt(f("grant_ctl_cpu_ms")? / granted, 2)
        } else {
            "n/a".to_string()
        },
        "",
        None,
    );
    if drop_n > 0 {
        row(
            &format!("{drop_n} exporters dropped: all listed offline (s)"),
            fmt(f("drop_notice_secs")?, 1),
            "",
            None,
        );
    }
    row(
        "restart: controller ready (s)",
        fmt(f("restart_ready_secs")?, 1),
        "",
        None,
    );
    row(
        &format!("restart: all {} exporters back (s)", n - drop_n),
        fmt(f("reregister_secs")?, 1),
        "",
        None,
    );
    // Once each: the exporter cache was never cut off by the store's watch.
    for (what, key) in [
        ("exporter cache lists (1 = never cut off)", "cache_lists"),
        ("the same after the restart", "cache_lists_after_restart"),
    ] {
        let lists = f(key)?;
        row(
            what,
            fmt(lists, 0),
            "1",
            (lists >= 0.0).then_some(lists == 1.0),
        );
    }
    row(
        "load generator CPU, whole run (s)",
        fmt(f("loadgen_cpu_secs")?, 1),
        "",
        None,
    );
    println!("load average after: {}", loadavg());
    if only == Some("controller") {
        return Ok(());
    }
    crate::bench_tunnels::run(&dir, quick)
}
