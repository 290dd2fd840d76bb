//! The floor under `bench_calls`: the same loopback round trip made by tonic alone, with no
//! Jumpstarter code on either side. Used by `cargo xtask bench` to show how much of a driver
//! call's latency is the gRPC stack and the machine rather than ours.
//!
//! `bench_floor serve` serves `grpc.health.v1.Health` on 127.0.0.1 (port 0) and prints
//! `listening on PORT` on stderr; `bench_floor call PORT CALLS` calls `Check` (an empty message) CALLS
//! times after a warm-up and prints one JSON line like `bench_calls`.

use std::time::{Duration, Instant};

use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

#[path = "common/runtime.rs"]
mod runtime;

/// See `common/runtime.rs` for `BENCH_RUNTIME` and `TOKIO_WORKER_THREADS`.
fn main() -> anyhow::Result<()> {
    runtime::run(run())
}

async fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve") => {
            let (_reporter, service) = tonic_health::server::health_reporter();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            eprintln!("listening on {}", listener.local_addr()?.port());
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .add_service(service)
                .serve_with_incoming(incoming)
                .await?;
        }
        Some("call") => {
            let port = args.get(2).map(String::as_str).unwrap_or_default();
            let calls: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(2000);
            let channel =
                tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?
                    .tcp_nodelay(true)
                    .connect()
                    .await?;
            let mut client = HealthClient::new(channel);
            let request = || HealthCheckRequest {
                service: String::new(),
            };
            for _ in 0..200 {
                client.check(request()).await?;
            }
            let mut lat: Vec<Duration> = Vec::with_capacity(calls);
            let start = Instant::now();
            for _ in 0..calls {
                let t = Instant::now();
                client.check(request()).await?;
                lat.push(t.elapsed());
            }
            let elapsed = start.elapsed();
            lat.sort();
            let pct = |p: f64| {
                let idx = ((lat.len() as f64 - 1.0) * p).round() as usize;
                lat.get(idx).map(|d| d.as_secs_f64() * 1e6).unwrap_or(0.0)
            };
            println!(
                "{{\"p50_us\":{:.1},\"p99_us\":{:.1},\"calls_per_sec\":{:.0}}}",
                pct(0.50),
                pct(0.99),
                lat.len() as f64 / elapsed.as_secs_f64()
            );
        }
        _ => anyhow::bail!("usage: bench_floor serve | bench_floor call PORT CALLS"),
    }
    Ok(())
}
