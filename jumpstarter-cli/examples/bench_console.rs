//! Console and port-forwarding figures for `cargo xtask bench-console`.
//!
//! - `bench_console console HOST DRIVER MIB LINES`: on the driver's `connect` stream (an
//!   echoing console: `loop://`, or a pty with `pty-echo` on the other side), LINES one-line
//!   round trips (16 bytes out, the same 16 back), then MIB MiB written and read back at the
//!   same time; prints `{"mib_per_sec":..,"rtt_p50_us":..,"rtt_p99_us":..}`.
//! - `bench_console observers HOST DRIVER MIB READING STALLED [EXPORTER_PID]`: opens READING
//!   observers (`observe`, each on a connection of its own) that read and discard, and
//!   STALLED ones that never read, then
//!   times MIB MiB through the writer's `connect` as `console` does (after its 20 warm-up
//!   lines); prints `{"mib_per_sec":..,"rtt_p50_us":..,"rtt_p99_us":..,"observed_mib":..,
//!   "cpu_s":..}`: the writer's throughput, the MiB the reading observers received between
//!   them while it was timed, and the CPU seconds this process and the exporter (its pid
//!   given) used meanwhile (Linux `/proc`; 0 elsewhere).
//! - `bench_console pty-echo LINK`: a pseudo-terminal whose device side is linked at LINK;
//!   what the device side writes comes back to it. Prints `pty ready` on stderr; runs until
//!   killed.
//! - `bench_console sink`: a TCP sink on 127.0.0.1 (prints `sink port N` on stderr): each
//!   connection sends an 8-byte big-endian length, then that many bytes; the sink answers
//!   one byte once it has them all.
//! - `bench_console send ADDR MIB`: sends MIB MiB to a sink at ADDR (directly or through a
//!   forward) and prints `{"mib_per_sec":..}`, timed from the connect to the sink's answer.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use jumpstarter_core::client::{ConnectOptions, ExporterSession};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes per write in the throughput runs (the Python bench uses the same).
const CHUNK: usize = 16 * 1024;
/// One console line: 15 characters and a newline.
const LINE: &[u8; 16] = b"0123456789abcde\n";

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| -> Result<&str> {
        args.get(i)
            .map(String::as_str)
            .with_context(|| format!("missing argument {}", i + 1))
    };
    match arg(0)? {
        "console" => {
            let session = ExporterSession::connect(arg(1)?, &ConnectOptions::from_env()).await?;
            let stream = session.driver(arg(2)?)?.open_stream("connect").await?;
            let t = console(stream, arg(3)?.parse()?, arg(4)?.parse()?, None).await?;
            println!(
                "{{\"mib_per_sec\":{:.2},\"rtt_p50_us\":{:.1},\"rtt_p99_us\":{:.1}}}",
                t.mib_per_sec, t.rtt_p50_us, t.rtt_p99_us
            );
            Ok(())
        }
        "observers" => {
            let session = ExporterSession::connect(arg(1)?, &ConnectOptions::from_env()).await?;
            let driver = session.driver(arg(2)?)?;
            let (reading, stalled): (usize, usize) = (arg(4)?.parse()?, arg(5)?.parse()?);
            let exporter: Option<u32> = args.get(6).map(|p| p.parse()).transpose()?;
            let observed = Arc::new(AtomicU64::new(0));
            let mut held = Vec::new();
            let mut sessions = Vec::new();
            for i in 0..reading + stalled {
                // Each observer on a connection of its own, as people watching from their
                // own machines are (on one connection, the writer's frames would queue
                // behind the observers' in one HTTP/2 connection's window).
                let own = ExporterSession::connect(arg(1)?, &ConnectOptions::from_env()).await?;
                let mut s = own.driver(arg(2)?)?.open_stream("observe").await?;
                sessions.push(own);
                if i < reading {
                    let observed = observed.clone();
                    held.push(tokio::spawn(async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n @ 1..) = s.read(&mut buf).await {
                            observed.fetch_add(n as u64, Ordering::Relaxed);
                        }
                    }));
                } else {
                    // Opened and never read: its exporter-side buffer fills and drops.
                    held.push(tokio::spawn(async move {
                        let _s = s;
                        std::future::pending::<()>().await
                    }));
                }
            }
            let stream = driver.open_stream("connect").await?;
            let t = console(stream, arg(3)?.parse()?, 0, Some((exporter, &observed))).await;
            held.iter().for_each(tokio::task::JoinHandle::abort);
            drop(sessions);
            let t = t?;
            println!(
                "{{\"mib_per_sec\":{:.2},\"rtt_p50_us\":{:.1},\"rtt_p99_us\":{:.1},\
                 \"observed_mib\":{:.2},\"cpu_s\":{:.3}}}",
                t.mib_per_sec, t.rtt_p50_us, t.rtt_p99_us, t.observed_mib, t.cpu_s
            );
            Ok(())
        }
        "pty-echo" => pty_echo(arg(1)?).await,
        "sink" => sink().await,
        "send" => send(arg(1)?, arg(2)?.parse()?).await,
        other => bail!("unknown mode {other:?}"),
    }
}

/// What `console` measured.
struct Timing {
    mib_per_sec: f64,
    rtt_p50_us: f64,
    rtt_p99_us: f64,
    /// MiB the observers received while the throughput was timed.
    observed_mib: f64,
    /// CPU seconds of this process and the exporter while the throughput was timed.
    cpu_s: f64,
}

/// CPU seconds (user and system) process `pid` has used, from `/proc` (0 where there is
/// none). The kernel's clock tick is 100 Hz on every Linux this runs on.
fn cpu_seconds(pid: Option<u32>) -> f64 {
    let path = pid.map_or_else(
        || "/proc/self/stat".to_string(),
        |p| format!("/proc/{p}/stat"),
    );
    let Ok(stat) = std::fs::read_to_string(path) else {
        return 0.0;
    };
    // Fields after the command's closing parenthesis: state is the 3rd field, utime the 14th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// Times `mib` MiB through the console's writer after `lines` timed round trips. With
/// `observers` (the exporter's pid, if known, and the observers' byte count) it also
/// measures what the observers received and the CPU used meanwhile.
async fn console<S: AsyncRead + AsyncWrite + Send + Unpin + 'static>(
    stream: S,
    mib: usize,
    lines: usize,
    observers: Option<(Option<u32>, &AtomicU64)>,
) -> Result<Timing> {
    let (mut r, mut w) = tokio::io::split(stream);
    let mut buf = [0u8; LINE.len()];
    let mut lat = Vec::with_capacity(lines);
    for i in 0..lines + 20 {
        let t = Instant::now();
        w.write_all(LINE).await?;
        r.read_exact(&mut buf).await?;
        ensure!(&buf == LINE, "the console answered {buf:?}");
        if i >= 20 {
            lat.push(t.elapsed());
        }
    }
    let total = mib << 20;
    let exporter = observers.and_then(|o| o.0);
    let cpu = || cpu_seconds(None) + exporter.map_or(0.0, |p| cpu_seconds(Some(p)));
    let observed = || observers.map_or(0, |o| o.1.load(Ordering::Relaxed));
    let (cpu0, observed0) = (cpu(), observed());
    let start = Instant::now();
    let writer = tokio::spawn(async move {
        let chunk = vec![b'x'; CHUNK];
        let mut left = total;
        while left > 0 {
            let n = left.min(CHUNK);
            w.write_all(&chunk[..n]).await?;
            left -= n;
        }
        Ok::<_, std::io::Error>(w)
    });
    let mut got = 0;
    let mut big = vec![0u8; 64 * 1024];
    while got < total {
        let n = r.read(&mut big).await?;
        ensure!(n > 0, "the console ended after {got} of {total} bytes");
        got += n;
    }
    let elapsed = start.elapsed();
    let (cpu1, observed1) = (cpu(), observed());
    let _w = writer.await??;
    lat.sort();
    let pct = |p: f64| {
        let idx = ((lat.len() as f64 - 1.0) * p).round() as usize;
        lat.get(idx).map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Ok(Timing {
        mib_per_sec: mib as f64 / elapsed.as_secs_f64(),
        rtt_p50_us: pct(0.5),
        rtt_p99_us: pct(0.99),
        observed_mib: (observed1 - observed0) as f64 / f64::from(1u32 << 20),
        cpu_s: cpu1 - cpu0,
    })
}

async fn pty_echo(link: &str) -> Result<()> {
    let pty = jumpstarter_drivers::Pty::open()?;
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(&pty.device_path, link)
        .with_context(|| format!("cannot link {link}"))?;
    eprintln!("pty ready {}", pty.device_path.display());
    let (mut r, mut w) = tokio::io::split(pty.controller);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) => return Ok(()),
            Ok(n) => w.write_all(&buf[..n]).await?,
            // Nobody has the device open right now: wait for the next opener.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

async fn sink() -> Result<()> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    eprintln!("sink port {}", l.local_addr()?.port());
    loop {
        let (mut c, _) = l.accept().await?;
        tokio::spawn(async move {
            let mut len = [0u8; 8];
            c.read_exact(&mut len).await?;
            let mut left = u64::from_be_bytes(len);
            let mut buf = vec![0u8; 256 * 1024];
            while left > 0 {
                let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                let n = c.read(&mut buf[..want]).await?;
                if n == 0 {
                    return Ok(());
                }
                left -= n as u64;
            }
            c.write_all(b"!").await?;
            c.flush().await?;
            // Wait for the sender to close, so the answer is not lost to a reset.
            let _ = c.read(&mut buf).await;
            Ok::<_, std::io::Error>(())
        });
    }
}

async fn send(addr: &str, mib: u64) -> Result<()> {
    let total = mib << 20;
    let start = Instant::now();
    let mut c = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    c.set_nodelay(true)?;
    c.write_all(&total.to_be_bytes()).await?;
    let chunk = vec![b'x'; 256 * 1024];
    let mut left = total;
    while left > 0 {
        let n = chunk.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        c.write_all(&chunk[..n]).await?;
        left -= n as u64;
    }
    let mut ack = [0u8; 1];
    c.read_exact(&mut ack)
        .await
        .context("the sink did not answer")?;
    let elapsed = start.elapsed();
    println!(
        "{{\"mib_per_sec\":{:.1}}}",
        mib as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}
