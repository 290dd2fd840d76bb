//! The router part of `cargo xtask bench-scale`: many tunnels through one router (the
//! `jumpstarter-router` example `tunnel_load`; see its docs for the phases).

use std::path::Path;

use anyhow::Result;

use crate::{
    bench::json_number,
    bench_table::{loadavg, row, run_example},
};

/// Runs the tunnel benchmark with the binaries in `dir` (`quick`: 50 tunnels, 2 s windows).
pub fn run(dir: &Path, quick: bool) -> Result<()> {
    let (tunnels, bulk, secs) = if quick { (50, 4, 2) } else { (1000, 20, 10) };
    println!(
        "== router: {tunnels} tunnels (a TLS connection per end), {bulk} of them bulk, \
         load average {}",
        loadavg()
    );
    let line = run_example(
        &dir.join("examples/tunnel_load"),
        &[
            dir.join("jumpstarter-router").display().to_string(),
            tunnels.to_string(),
            bulk.to_string(),
            secs.to_string(),
        ],
    )?;
    let f = |k: &str| json_number(&line, k);
    println!("{:<52} {:>12}  {:<16}", "figure", "value", "target");
    row(
        &format!("tunnels open (of {tunnels}), each a frame both ways"),
        format!("{:.0}", f("opened")?),
        "all",
        Some(f("opened")? as usize == tunnels),
    );
    row(
        "time to open them (s)",
        format!("{:.1}", f("open_secs")?),
        "",
        None,
    );
    let per = f("per_tunnel_kib")?;
    row(
        "router RSS per idle tunnel (KiB)",
        format!("{per:.0}"),
        "< 200",
        Some(per < 200.0),
    );
    row(
        "router RSS, all idle (MiB)",
        format!("{:.0}", f("rss_idle_kib")? / 1024.0),
        "",
        None,
    );
    // The round trips' p50 / p99, with the 5 ms target on the p99 where `target`.
    let trips = |what: &str, key: &str, target: bool| -> Result<()> {
        let p99 = f(&format!("{key}_p99_ms"))?;
        row(
            what,
            format!("{:.2} / {p99:.2}", f(&format!("{key}_p50_ms"))?),
            if target { "p99 < 5" } else { "" },
            target.then_some(p99 < 5.0),
        );
        Ok(())
    };
    trips(
        "round trip, quiet router: p50 / p99 (ms)",
        "unary_alone",
        false,
    )?;
    trips(
        &format!("round trip beside {bulk} bulk streams: p50 / p99 (ms)"),
        "unary_loaded",
        true,
    )?;
    trips("  from a process of its own, quiet", "probe_alone", false)?;
    trips(
        "  from a process of its own, beside the bulk",
        "probe_loaded",
        true,
    )?;
    row(
        &format!("aggregate bulk throughput, {bulk} tunnels (MB/s)"),
        format!("{:.0}", f("aggregate_mb_s")?),
        "",
        None,
    );
    row(
        "bulk tunnel rate: min / median (MB/s)",
        format!("{:.1} / {:.1}", f("bulk_min_mb_s")?, f("bulk_median_mb_s")?),
        "",
        None,
    );
    row(
        "router CPU during bulk (% of a core)",
        format!("{:.0}", f("router_cpu_pct")?),
        "",
        None,
    );
    row(
        &format!(
            "bulk paced to {:.0} MB/s in all: got (MB/s)",
            f("cap_mb_s")?
        ),
        format!("{:.0}", f("capped_aggregate_mb_s")?),
        "",
        None,
    );
    row(
        "router CPU during paced bulk (% of a core)",
        format!("{:.0}", f("capped_router_cpu_pct")?),
        "",
        None,
    );
    trips(
        "  round trip from its own process beside it",
        "probe_capped",
        true,
    )?;
    row(
        "slow client: pushed into its tunnel after it stopped (MiB)",
        format!("{:.1}", f("slow_pushed_mib")?),
        "bounded",
        None,
    );
    row(
        "slow client: others' rate min / median (MB/s)",
        format!(
            "{:.1} / {:.1}",
            f("others_min_mb_s")?,
            f("others_median_mb_s")?
        ),
        "none starved",
        Some(f("starved")? == 0.0),
    );
    row(
        "router RSS with the slow client (MiB)",
        format!("{:.0}", f("rss_slow_kib")? / 1024.0),
        "",
        None,
    );
    println!("load average after: {}", loadavg());
    Ok(())
}
