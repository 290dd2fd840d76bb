//! `cargo xtask bench-dashboard [--quick] [--debug] [--no-build] [--exporters N]` (part of `cargo xtask
//! bench`): how fast the controller's web dashboard paints with a large fleet.
//!
//! A controller (embedded store, dashboard on port 0) with N exporters in its store (default
//! 10,000, created with `jmp admin apply` in batches of 250), two of them online (`jmp run`)
//! and one of those leased (`jmp shell ... -- sleep`), in Debian's headless `chromium`
//! driven over the DevTools protocol ([`crate::cdp`]). For each page, the median of several
//! loads (after one warm-up load) of the browser's own figures: the first paint and first
//! contentful paint (Paint Timing), and from Navigation Timing the time to the first byte,
//! to `DOMContentLoaded` and to `load`, and the page's size. Pages: the fleet (`/ui`, its
//! first page), a search over the whole fleet (`/ui?q=...`), the last page of the fleet,
//! and `/ui/leases`.
//!
//! The goal is a first paint under 1 s; nothing here is asserted against a time. `--quick`:
//! 1,000 exporters and 3 loads a page; `--debug`: the debug binaries (no release build;
//! slower in absolute terms); `--no-build`: the binaries as they are.

use std::{
    fmt::Write as _,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{
    bench_table::{loadavg, row},
    cdp::Browser,
    dashboard_e2e::{Lab, log_in},
    procs::Background,
    quickstart::fill_export,
};

/// Exporters a `jmp admin apply` creates at once (the controller takes at most 256
/// documents a request).
const BATCH: usize = 250;

/// The Performance API's figures of the page just loaded (milliseconds from the navigation's
/// start), once it has loaded and painted content (a quick page may paint after `load`);
/// `null` before.
const FIGURES_JS: &str = "(() => { \
    const n = performance.getEntriesByType('navigation')[0]; \
    if (!n || n.loadEventEnd <= 0) return null; \
    if (!performance.getEntriesByName('first-contentful-paint').length) return null; \
    const paint = name => { const e = performance.getEntriesByName(name)[0]; \
        return e ? e.startTime : -1; }; \
    return {fp: paint('first-paint'), fcp: paint('first-contentful-paint'), \
        ttfb: n.responseStart, dcl: n.domContentLoadedEventEnd, load: n.loadEventEnd, \
        bytes: n.encodedBodySize, rows: document.querySelectorAll('tr').length}; })()";

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

/// The exporters of batch `batch` (numbered from `first`, `count` of them) as `jmp admin
/// apply` documents: named `bench-00042`, labelled with a board type, a rack and a site so
/// that selectors and search have something to match.
fn batch_yaml(first: usize, count: usize) -> String {
    let mut out = String::new();
    for i in first..first + count {
        let _ = write!(
            out,
            "---\napiVersion: jumpstarter.dev/v1alpha1\nkind: Exporter\nmetadata:\n  \
             name: bench-{i:05}\n  namespace: default\n  labels:\n    board: {}\n    \
             rack: r{:03}\n    site: {}\nspec: {{}}\n",
            ["rpi4", "imx8", "qemu", "jetson"][i % 4],
            i / 40,
            ["lab-a", "lab-b", "lab-c"][i % 3],
        );
    }
    out
}

/// The median of `values` (which is not empty).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Runs the benchmark.
pub fn run(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let debug = args.iter().any(|a| a == "--debug");
    let n = flag_value(args, "--exporters")?.unwrap_or(if quick { 1000 } else { 10_000 });
    if n < 2 {
        bail!("--exporters takes at least 2");
    }
    let loads = if quick { 3 } else { 9 };
    let chromium = crate::cdp::ensure_chromium()?;
    let bin = match (debug, args.iter().any(|a| a == "--no-build")) {
        (true, false) => crate::debug_build()?,
        (false, false) => crate::bench::build_release()?,
        (true, true) => crate::target_dir().join("debug"),
        (false, true) => crate::target_dir().join("release"),
    };
    let work = crate::interop::tempfile_dir::Dir::new("jmp-bench-dashboard")?;
    let lab = Lab::new(&bin, work.path())?;
    let (_controller, base) = lab.start_controller(&[])?;
    println!(
        "== dashboard at scale: {n} exporters, {} build, {} loads a page (median), load \
         average {}",
        if debug { "debug" } else { "release" },
        loads,
        loadavg()
    );

    // The fleet: all but two through apply, those two created with their own configs and
    // run, so that the pages show exporters online and leased among the rest.
    let started = Instant::now();
    let mut first = 2;
    while first < n {
        let count = BATCH.min(n - first);
        let file = lab.path(&format!("batch-{first}.yaml"));
        std::fs::write(&file, batch_yaml(first, count))?;
        lab.jmp(&[
            "admin",
            "apply",
            "-f",
            &file.to_string_lossy(),
            "-o",
            "name",
        ])?;
        first += count;
    }
    let mut live = Vec::new();
    for i in 0..2 {
        let config = lab.path(&format!("live-{i}.yaml"));
        let config_str = config.to_string_lossy().into_owned();
        lab.jmp(&[
            "admin",
            "create",
            "exporter",
            &format!("bench-{i:05}"),
            "--label",
            "board=live",
            "--out",
            &config_str,
        ])?;
        fill_export(
            &config,
            "export:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n",
        )?;
        let mut run = lab.command("jmp");
        run.args(["run", "--exporter-config", &config_str])
            .env("JMP_LOG", "warn");
        live.push(Background::start("jmp run", run)?);
    }
    let client = lab.path("client.yaml");
    let client_str = client.to_string_lossy().into_owned();
    lab.jmp(&[
        "admin",
        "create",
        "client",
        "bench",
        "--unsafe",
        "--out",
        &client_str,
    ])?;
    let mut shell = lab.command("jmp");
    shell
        .args(["shell", "--client-config", &client_str, "-l", "board=live"])
        .args(["--", "sleep", "3600"])
        .stdout(Stdio::null());
    let _shell = Background::start("jmp shell", shell)?;
    println!(
        "created {n} exporters in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let mut b = Browser::launch(&chromium)?;
    let ctx = b.new_context()?;
    let page = b.new_page(Some(&ctx), 1280, 800)?;
    log_in(&mut b, &page, &base, &lab.admin_token()?, "admin", None)?;
    // The lease is granted and shown before any figure is taken.
    page.navigate(&mut b, &format!("{base}/ui/leases"))?;
    page.wait_for(
        &mut b,
        "document.querySelector('#leases tr[data-lease]')",
        Duration::from_secs(60),
        "the bench lease on /ui/leases",
    )?;

    let per_page = 100;
    let last_page = n.div_ceil(per_page);
    let pages = [
        ("fleet, page 1".to_string(), "/ui".to_string()),
        ("fleet, search".to_string(), "/ui?q=bench-0099".to_string()),
        (
            format!("fleet, page {last_page}"),
            format!("/ui?page={last_page}"),
        ),
        ("leases".to_string(), "/ui/leases".to_string()),
    ];
    for (what, path) in &pages {
        println!("{what}: {path}");
    }
    println!(
        "{:<52} {:>12}  {:<16}",
        "figure (median of the loads)", "value", "target"
    );
    for (what, path) in &pages {
        let url = format!("{base}{path}");
        let mut got: Vec<Value> = Vec::new();
        for i in 0..=loads {
            page.navigate(&mut b, &url)?;
            let v = page.wait_for(
                &mut b,
                FIGURES_JS,
                Duration::from_secs(30),
                &format!("the timings of {path}"),
            )?;
            // The first load warms the caches up.
            if i > 0 {
                got.push(v);
            }
        }
        let med = |k: &str| median(got.iter().filter_map(|v| v[k].as_f64()).collect());
        let (fp, fcp) = (med("fp"), med("fcp"));
        row(
            &format!("{what}: first paint / first contentful (ms)"),
            format!("{fp:.0} / {fcp:.0}"),
            "< 1000",
            Some((0.0..1000.0).contains(&fp) && fcp < 1000.0),
        );
        row(
            &format!("{what}: first byte / DOM ready / load (ms)"),
            format!(
                "{:.0} / {:.0} / {:.0}",
                med("ttfb"),
                med("dcl"),
                med("load")
            ),
            "",
            None,
        );
        row(
            &format!("{what}: HTML (KiB) / table rows"),
            format!("{:.0} / {:.0}", med("bytes") / 1024.0, med("rows")),
            "",
            None,
        );
    }
    println!("load average after: {}", loadavg());
    drop(live);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_that_many_exporter_documents() {
        let y = batch_yaml(40, 3);
        assert_eq!(y.matches("kind: Exporter\n").count(), 3);
        assert!(y.contains("name: bench-00040\n"), "{y}");
        assert!(y.contains("name: bench-00042\n"), "{y}");
        assert!(!y.contains("bench-00043"), "{y}");
        assert!(y.contains("rack: r001\n"), "{y}");
    }

    #[test]
    fn the_median_is_the_middle_value() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }
}
