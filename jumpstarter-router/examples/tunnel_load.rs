//! Router load: many tunnels at once (driven by `cargo xtask bench-scale`).
//!
//! `tunnel_load ROUTER_BIN TUNNELS BULK SECS [CAP_MB_S]`
//!
//! Starts the router binary (TLS on loopback), opens TUNNELS tunnels, each a client end and an
//! exporter end with an HTTP/2 connection of its own (as `j` and an exporter have), and
//! checks that every tunnel carries a frame each way. Then:
//! 1. idle: the router's RSS with every tunnel open and quiet, against before;
//! 2. unary alone: round trips of a 100-byte frame (the exporter end echoes it) on the quiet
//!    tunnels, one at a time, round robin;
//! 3. bulk: BULK tunnels stream 256 KiB frames from the exporter end to the client end as
//!    fast as they can for SECS seconds while the round trips go on beside them: aggregate
//!    throughput, each bulk tunnel's rate, the round trips' p50/p99;
//! 4. the same round trips from a process of their own (this binary with `--probe`, on
//!    PROBE_TUNNELS tunnels of its own): quiet, beside the bulk of phase 3, and beside the
//!    bulk tunnels paced to CAP_MB_S (default 100) MB/s in all. In phase 3 this process
//!    drives both ends of every bulk tunnel and the round trips on the same two cores as the
//!    router, so the round trips wait behind the bulk in its own runtime; the probe process
//!    and the paced bulk (a lab's concurrent flashes, not a flood that saturates the
//!    machine) leave what the router itself adds;
//! 5. a slow client: bulk again, but the first bulk tunnel's client stops reading: what its
//!    exporter end can still push (bounded by the windows and the router's buffer), the other
//!    bulk tunnels' rates, the router's RSS.
//!
//! Prints one JSON line of figures (the last line of stdout); exits non-zero when a tunnel
//! does not carry its frames or a count does not add up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures::{StreamExt, stream};
use jumpstarter_core::{
    auth::CertificateAuthority,
    client::{ConnectOptions, connect_channel},
};
use jumpstarter_proto::v1::{
    FrameType, StreamRequest, StreamResponse, router_service_client::RouterServiceClient,
};
use jumpstarter_router::RouterTokenKey;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    process::{ChildStdin, ChildStdout, Command},
    sync::{Notify, mpsc},
};
use tonic::{Request, Streaming};

const SECRET: &str = "0123456789abcdef0123456789abcdef0123456789abcdef";
const CHUNK: usize = 256 * 1024;
/// Tunnels the probe process makes its round trips on.
const PROBE_TUNNELS: usize = 10;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

fn rss_kib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(f64::NAN)
}

fn fig(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "-1".into()
    }
}

/// One end of a tunnel.
struct End {
    tx: mpsc::Sender<StreamRequest>,
    rx: Streaming<StreamResponse>,
}

async fn open(addr: &str, ca: &str, token: &str) -> End {
    let channel = connect_channel(
        addr,
        &ConnectOptions {
            insecure: false,
            passphrase: None,
            ca_pem: Some(ca.as_bytes().to_vec()),
        },
    )
    .await
    .expect("connect to the router");
    let (tx, rx) = mpsc::channel(4);
    let mut req = Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let resp = RouterServiceClient::new(channel)
        .stream(req)
        .await
        .expect("router stream");
    End {
        tx,
        rx: resp.into_inner(),
    }
}

fn data(payload: Bytes) -> StreamRequest {
    StreamRequest {
        payload,
        frame_type: FrameType::Data as i32,
    }
}

async fn next(end: &mut End) -> Option<StreamResponse> {
    match tokio::time::timeout(Duration::from_secs(30), end.rx.next()).await {
        Ok(Some(Ok(f))) => Some(f),
        _ => None,
    }
}

/// The exporter end of a tunnel sends back every frame it receives.
fn echo(mut exporter: End) {
    tokio::spawn(async move {
        while let Some(Ok(f)) = exporter.rx.next().await {
            if exporter.tx.send(data(f.payload)).await.is_err() {
                return;
            }
        }
    });
}

/// A bulk tunnel: the exporter end pushes chunks while `run` is set (one every `period` µs
/// when that is not 0, else as fast as it can; paced tunnels start `phase` of a period apart,
/// so that their chunks do not all leave at the same instant); the client end reads and
/// counts unless `paused`.
struct Bulk {
    received: Arc<AtomicU64>,
    pushed: Arc<AtomicU64>,
    paused: Arc<AtomicBool>,
    resume: Arc<Notify>,
}

fn start_bulk(
    mut client: End,
    exporter: End,
    run: Arc<AtomicBool>,
    period: Arc<AtomicU64>,
    phase: f64,
    chunk: Bytes,
) -> Bulk {
    let b = Bulk {
        received: Arc::default(),
        pushed: Arc::default(),
        paused: Arc::default(),
        resume: Arc::default(),
    };
    let pushed = b.pushed.clone();
    tokio::spawn(async move {
        let _keep = exporter.rx;
        let mut due = tokio::time::Instant::now();
        let mut started = false;
        loop {
            if !run.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(20)).await;
                started = false;
                continue;
            }
            let us = period.load(Ordering::Relaxed);
            if !started {
                started = true;
                due = tokio::time::Instant::now() + Duration::from_micros(us).mul_f64(phase);
            }
            if us > 0 {
                due += Duration::from_micros(us);
                tokio::time::sleep_until(due).await;
            }
            if exporter.tx.send(data(chunk.clone())).await.is_err() {
                return;
            }
            pushed.fetch_add(CHUNK as u64, Ordering::Relaxed);
        }
    });
    let (received, paused, resume) = (b.received.clone(), b.paused.clone(), b.resume.clone());
    tokio::spawn(async move {
        let _keep = client.tx;
        loop {
            while paused.load(Ordering::SeqCst) {
                let wake = resume.notified();
                if !paused.load(Ordering::SeqCst) {
                    break;
                }
                wake.await;
            }
            match client.rx.next().await {
                Some(Ok(f)) => {
                    received.fetch_add(f.payload.len() as u64, Ordering::Relaxed);
                }
                _ => return,
            }
        }
    });
    b
}

/// Round trips of a 100-byte frame over `tunnels` (client ends), one at a time, round
/// robin, until `stop`; the round-trip times in ms.
async fn round_trips(tunnels: &mut [End], stop: &AtomicBool, max: usize) -> Vec<f64> {
    let payload = Bytes::from(vec![7u8; 100]);
    let mut out = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) && out.len() < max && !tunnels.is_empty() {
        let end = &mut tunnels[i % tunnels.len()];
        i += 1;
        let t = Instant::now();
        if end.tx.send(data(payload.clone())).await.is_err() {
            break;
        }
        if next(end).await.is_none() {
            break;
        }
        out.push(t.elapsed().as_secs_f64() * 1000.0);
        // About 200 calls a second: a driver session's calls, not a flood.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    out
}

/// `tunnel_load --probe ADDR CA_FILE TOKEN...`: opens one tunnel per token (both ends; the
/// exporter end echoes), prints `ready`, then for each `measure` line on stdin makes round
/// trips until the next line and prints `P50_MS P99_MS COUNT`. Ends at the end of stdin.
async fn probe(args: &[String]) {
    let [addr, ca_file, tokens @ ..] = args else {
        panic!("--probe ADDR CA_FILE TOKEN...");
    };
    let ca = std::fs::read_to_string(ca_file).expect("the CA file");
    let mut clients = Vec::with_capacity(tokens.len());
    for token in tokens {
        let mut exporter = open(addr, &ca, token).await;
        let client = open(addr, &ca, token).await;
        client
            .tx
            .send(data(Bytes::from_static(b"hi")))
            .await
            .expect("probe send");
        next(&mut exporter)
            .await
            .expect("probe tunnel carries a frame");
        echo(exporter);
        clients.push(client);
    }
    println!("ready");
    // stdin's lines, read on a thread of their own (this crate's tokio has no `io-std`).
    let (line_tx, mut lines) = mpsc::channel::<String>(4);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { return };
            if line_tx.blocking_send(line).is_err() {
                return;
            }
        }
    });
    while let Some(line) = lines.recv().await {
        if line != "measure" {
            return;
        }
        let stop = AtomicBool::new(false);
        let (mut times, ()) = tokio::join!(round_trips(&mut clients, &stop, usize::MAX), async {
            let _ = lines.recv().await;
            stop.store(true, Ordering::SeqCst);
        });
        times.sort_by(|a, b| a.total_cmp(b));
        println!(
            "{} {} {}",
            fig(percentile(&times, 0.5)),
            fig(percentile(&times, 0.99)),
            times.len()
        );
    }
}

/// The probe process, seen from the main one.
struct Probe {
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Probe {
    /// The probe's next line of output (`None` after 60 s without one, or at its end).
    async fn line(&mut self) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(60), self.stdout.next_line())
            .await
            .ok()
            .and_then(Result::ok)
            .flatten()
    }

    /// Round trips in the probe process while `during` runs: (its output, (p50, p99, count)).
    async fn measure<T>(&mut self, during: impl Future<Output = T>) -> (T, (f64, f64, usize)) {
        self.stdin
            .write_all(b"measure\n")
            .await
            .expect("probe stdin");
        let out = during.await;
        self.stdin.write_all(b"stop\n").await.expect("probe stdin");
        let line = self.line().await.expect("the probe's figures");
        let v: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| {
            v.get(i)
                .and_then(|x| x.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        (out, (num(0), num(1), num(2) as usize))
    }
}

/// Bytes each bulk tunnel received over `secs` seconds (while `run` is set).
async fn bulk_window(bulks: &[Bulk], run: &AtomicBool, secs: f64) -> (Vec<f64>, f64) {
    let before: Vec<u64> = bulks
        .iter()
        .map(|b| b.received.load(Ordering::Relaxed))
        .collect();
    run.store(true, Ordering::SeqCst);
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let elapsed = t.elapsed().as_secs_f64();
    let rates = bulks
        .iter()
        .zip(before)
        .map(|(b, a)| (b.received.load(Ordering::Relaxed) - a) as f64 / elapsed / 1e6)
        .collect();
    run.store(false, Ordering::SeqCst);
    (rates, elapsed)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "--probe") {
        probe(&args[1..]).await;
        return;
    }
    let bin = args.first().expect("ROUTER_BIN").clone();
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).expect("TUNNELS");
    let bulk_n: usize = args.get(2).and_then(|a| a.parse().ok()).expect("BULK");
    let secs: f64 = args.get(3).and_then(|a| a.parse().ok()).expect("SECS");
    let cap_mb_s: f64 = args.get(4).map_or(100.0, |a| a.parse().expect("CAP_MB_S"));
    assert!(bulk_n >= 2 && bulk_n < n, "need 2 <= BULK < TUNNELS");

    let dir = tempfile::tempdir().expect("temp dir");
    let ca = CertificateAuthority::generate("bench ca").expect("ca");
    let cert = ca.issue_server_cert(&["localhost"]).expect("cert");
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&crt, &cert.cert_pem).expect("write cert");
    std::fs::write(&key, &cert.key_pem).expect("write key");
    let mut child = Command::new(&bin)
        .args(["--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&crt)
        .arg("--tls-key")
        .arg(&key)
        .arg("--max-connections")
        .arg((2 * (n + PROBE_TUNNELS) + 100).to_string())
        .env("ROUTER_KEY", SECRET)
        .env("RUST_LOG", "warn")
        .env_remove("ROUTER_METRICS_LISTEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the router");
    let pid = child.id().unwrap_or(0);
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let listening = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.split("Router listening on").nth(1) {
                return Some(rest.trim().to_string());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .expect("the router's listening line");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let port = listening.rsplit(':').next().expect("port").to_string();
    let addr = format!("localhost:{port}");
    let ca_pem = ca.cert_pem().to_string();
    let key = RouterTokenKey::new(SECRET.as_bytes().to_vec()).expect("router key");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = rss_kib(pid);

    // Open every tunnel; each carries one frame each way.
    let t = Instant::now();
    let mut pairs: Vec<(End, End)> = stream::iter(0..n)
        .map(|_| {
            let token = key.issue().expect("token").token;
            let (addr, ca_pem) = (addr.clone(), ca_pem.clone());
            async move {
                let mut exporter = open(&addr, &ca_pem, &token).await;
                let mut client = open(&addr, &ca_pem, &token).await;
                client.tx.send(data(Bytes::from_static(b"hi"))).await.ok()?;
                next(&mut exporter).await?;
                exporter
                    .tx
                    .send(data(Bytes::from_static(b"hi")))
                    .await
                    .ok()?;
                next(&mut client).await?;
                Some((client, exporter))
            }
        })
        .buffer_unordered(32)
        .filter_map(|p| async move { p })
        .collect()
        .await;
    let open_secs = t.elapsed().as_secs_f64();
    let opened = pairs.len();
    eprintln!("tunnel_load: {opened} of {n} tunnels open in {open_secs:.1} s");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_idle = rss_kib(pid);
    let per_tunnel_kib = (rss_idle - rss_before) / opened.max(1) as f64;

    // Quiet tunnels echo what their client end sends.
    let quiet: Vec<(End, End)> = pairs.split_off(bulk_n);
    let mut quiet_clients = Vec::with_capacity(quiet.len());
    for (client, exporter) in quiet {
        quiet_clients.push(client);
        echo(exporter);
    }
    // At most 100 of them take the round trips (the rest stay open and quiet).
    let probe_n = quiet_clients.len().min(100);
    let mut probes: Vec<End> = quiet_clients.drain(..probe_n).collect();

    let stop = AtomicBool::new(false);
    let mut alone = round_trips(&mut probes, &stop, 1000).await;
    alone.sort_by(|a, b| a.total_cmp(b));

    // The probe process, with tunnels of its own.
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca_pem).expect("write the CA");
    let mut probe_child = Command::new(std::env::current_exe().expect("own path"))
        .arg("--probe")
        .arg(&addr)
        .arg(&ca_file)
        .args((0..PROBE_TUNNELS).map(|_| key.issue().expect("token").token))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the probe process");
    let mut probe_proc = Probe {
        stdin: probe_child.stdin.take().expect("probe stdin"),
        stdout: BufReader::new(probe_child.stdout.take().expect("probe stdout")).lines(),
    };
    let ready = probe_proc.line().await;
    assert_eq!(
        ready.as_deref(),
        Some("ready"),
        "the probe process's tunnels"
    );
    let ((), probe_alone) = probe_proc
        .measure(tokio::time::sleep(Duration::from_secs_f64(secs.min(5.0))))
        .await;

    // Bulk beside the round trips.
    let run = Arc::new(AtomicBool::new(false));
    let period = Arc::new(AtomicU64::new(0));
    let chunk = Bytes::from(vec![0x5au8; CHUNK]);
    let bulks: Vec<Bulk> = pairs
        .into_iter()
        .enumerate()
        .map(|(i, (c, e))| {
            let phase = i as f64 / bulk_n as f64;
            start_bulk(c, e, run.clone(), period.clone(), phase, chunk.clone())
        })
        .collect();
    let cpu0 = cpu_secs(pid);
    let stop = AtomicBool::new(false);
    let (((rates, elapsed), mut loaded), probe_loaded) = probe_proc
        .measure(async {
            tokio::join!(
                async {
                    let r = bulk_window(&bulks, &run, secs).await;
                    stop.store(true, Ordering::SeqCst);
                    r
                },
                round_trips(&mut probes, &stop, usize::MAX)
            )
        })
        .await;
    let cpu_pct = (cpu_secs(pid) - cpu0) / elapsed * 100.0;

    // Paced bulk beside the probe process's round trips.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let per_tunnel_bytes_s = cap_mb_s * 1e6 / bulk_n as f64;
    period.store(
        (CHUNK as f64 / per_tunnel_bytes_s * 1e6) as u64,
        Ordering::SeqCst,
    );
    let cpu0 = cpu_secs(pid);
    let ((capped_rates, capped_elapsed), probe_capped) =
        probe_proc.measure(bulk_window(&bulks, &run, secs)).await;
    let capped_cpu_pct = (cpu_secs(pid) - cpu0) / capped_elapsed * 100.0;
    let capped_aggregate: f64 = capped_rates.iter().sum();
    period.store(0, Ordering::SeqCst);
    drop(probe_proc);
    let _ = probe_child.wait().await;
    loaded.sort_by(|a, b| a.total_cmp(b));
    let aggregate: f64 = rates.iter().sum();
    let mut sorted_rates = rates.clone();
    sorted_rates.sort_by(|a, b| a.total_cmp(b));
    let rss_bulk = rss_kib(pid);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A slow client: the first bulk tunnel's client stops reading.
    bulks[0].paused.store(true, Ordering::SeqCst);
    let pushed0 = bulks[0].pushed.load(Ordering::Relaxed);
    let received0 = bulks[0].received.load(Ordering::Relaxed);
    let (slow_rates, _) = bulk_window(&bulks, &run, secs).await;
    let slow_pushed_mib =
        (bulks[0].pushed.load(Ordering::Relaxed) - pushed0) as f64 / (1024.0 * 1024.0);
    let slow_received_mib =
        (bulks[0].received.load(Ordering::Relaxed) - received0) as f64 / (1024.0 * 1024.0);
    let rss_slow = rss_kib(pid);
    let others: Vec<f64> = slow_rates[1..].to_vec();
    let mut others_sorted = others.clone();
    others_sorted.sort_by(|a, b| a.total_cmp(b));
    let starved = others.iter().filter(|r| **r <= 0.0).count();
    bulks[0].paused.store(false, Ordering::SeqCst);
    bulks[0].resume.notify_waiters();

    // Every quiet tunnel is still there and echoes.
    let stop = AtomicBool::new(false);
    let after = round_trips(&mut probes, &stop, probe_n).await;
    let _ = child.kill().await;

    println!(
        "{{\"tunnels\": {n}, \"opened\": {opened}, \"bulk\": {bulk_n}, \"open_secs\": {}, \
         \"rss_before_kib\": {}, \"rss_idle_kib\": {}, \"per_tunnel_kib\": {}, \
         \"unary_alone_p50_ms\": {}, \"unary_alone_p99_ms\": {}, \"unary_alone_n\": {}, \
         \"unary_loaded_p50_ms\": {}, \"unary_loaded_p99_ms\": {}, \"unary_loaded_n\": {}, \
         \"aggregate_mb_s\": {}, \"bulk_min_mb_s\": {}, \"bulk_median_mb_s\": {}, \
         \"router_cpu_pct\": {}, \"rss_bulk_kib\": {}, \"slow_pushed_mib\": {}, \
         \"slow_received_mib\": {}, \"others_min_mb_s\": {}, \"others_median_mb_s\": {}, \
         \"starved\": {starved}, \"rss_slow_kib\": {}, \"echo_after\": {}, \
         \"probe_alone_p50_ms\": {}, \"probe_alone_p99_ms\": {}, \"probe_loaded_p50_ms\": {}, \
         \"probe_loaded_p99_ms\": {}, \"cap_mb_s\": {}, \"capped_aggregate_mb_s\": {}, \
         \"capped_router_cpu_pct\": {}, \"probe_capped_p50_ms\": {}, \
         \"probe_capped_p99_ms\": {}, \"probe_capped_n\": {}}}",
        fig(open_secs),
        fig(rss_before),
        fig(rss_idle),
        fig(per_tunnel_kib),
        fig(percentile(&alone, 0.5)),
        fig(percentile(&alone, 0.99)),
        alone.len(),
        fig(percentile(&loaded, 0.5)),
        fig(percentile(&loaded, 0.99)),
        loaded.len(),
        fig(aggregate),
        fig(sorted_rates.first().copied().unwrap_or(f64::NAN)),
        fig(percentile(&sorted_rates, 0.5)),
        fig(cpu_pct),
        fig(rss_bulk),
        fig(slow_pushed_mib),
        fig(slow_received_mib),
        fig(others_sorted.first().copied().unwrap_or(f64::NAN)),
        fig(percentile(&others_sorted, 0.5)),
        fig(rss_slow),
        after.len(),
        fig(probe_alone.0),
        fig(probe_alone.1),
        fig(probe_loaded.0),
        fig(probe_loaded.1),
        fig(cap_mb_s),
        fig(capped_aggregate),
        fig(capped_cpu_pct),
        fig(probe_capped.0),
        fig(probe_capped.1),
        probe_capped.2,
    );
    let ok = opened == n
        && starved == 0
        && after.len() == probe_n
        && !loaded.is_empty()
        && probe_alone.2 > 0
        && probe_loaded.2 > 0
        && probe_capped.2 > 0;
    if !ok {
        eprintln!("tunnel_load: the counts do not add up (see the JSON line)");
        std::process::exit(1);
    }
}
