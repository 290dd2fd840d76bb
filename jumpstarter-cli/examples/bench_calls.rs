//! Measures unary driver-call latency and throughput against an exporter.
//!
//! `bench_calls HOST CALLS CONCURRENCY` calls `power.on` CALLS times (after a warm-up) and
//! prints one JSON line: `{"p50_us":..,"p99_us":..,"calls_per_sec":..}`. With a
//! concurrency above 1, that many tasks share one connection. Used by `cargo xtask bench`.

use std::time::{Duration, Instant};

use jumpstarter_core::client::{ConnectOptions, ExporterSession};

#[path = "common/runtime.rs"]
mod runtime;

/// See `common/runtime.rs` for `BENCH_RUNTIME` and `TOKIO_WORKER_THREADS`.
fn main() -> anyhow::Result<()> {
    runtime::run(run())
}

async fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let host = args.get(1).cloned().unwrap_or_default();
    let calls: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2000);
    let concurrency: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(1).max(1);
    let session = ExporterSession::connect(&host, &ConnectOptions::from_env()).await?;
    let power = session.driver("power")?;
    for _ in 0..200 {
        power.call::<()>("on", ()).await?;
    }
    let per_task = calls / concurrency;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let power = power.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let t = Instant::now();
                power.call::<()>("on", ()).await?;
                lat.push(t.elapsed());
            }
            Ok::<_, jumpstarter_core::ClientError>(lat)
        }));
    }
    let mut all: Vec<Duration> = Vec::with_capacity(calls);
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = start.elapsed();
    all.sort();
    let pct = |p: f64| {
        let idx = ((all.len() as f64 - 1.0) * p).round() as usize;
        all.get(idx).map(|d| d.as_secs_f64() * 1e6).unwrap_or(0.0)
    };
    println!(
        "{{\"p50_us\":{:.1},\"p99_us\":{:.1},\"calls_per_sec\":{:.0}}}",
        pct(0.50),
        pct(0.99),
        all.len() as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}
