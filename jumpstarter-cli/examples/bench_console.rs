//! Console and port-forwarding figures for `cargo xtask bench-console`.
//!
//! - `bench_console console HOST DRIVER MIB LINES`: on the driver's `connect` stream (an
//!   echoing console: `loop://`, or a pty with `pty-echo` on the other side), LINES one-line
//!   round trips (16 bytes out, the same 16 back), then MIB MiB written and read back at the
//!   same time; prints `{"mib_per_sec":..,"rtt_p50_us":..,"rtt_p99_us":..}`.
//! - `bench_console observers HOST DRIVER MIB READING STALLED`: opens READING observers
//!   (`observe`) that read and discard, and STALLED ones that never read, then times MIB MiB
//!   through the writer's `connect` as `console` does (after its 20 warm-up lines); prints
//!   `{"mib_per_sec":..,"rtt_p50_us":..,"rtt_p99_us":..}`.
//! - `bench_console pty-echo LINK`: a pseudo-terminal whose device side is linked at LINK;
//!   what the device side writes comes back to it. Prints `pty ready` on stderr; runs until
//!   killed.
//! - `bench_console sink`: a TCP sink on 127.0.0.1 (prints `sink port N` on stderr): each
//!   connection sends an 8-byte big-endian length, then that many bytes; the sink answers
//!   one byte once it has them all.
//! - `bench_console send ADDR MIB`: sends MIB MiB to a sink at ADDR (directly or through a
//!   forward) and prints `{"mib_per_sec":..}`, timed from the connect to the sink's answer.

use std::time::{Duration, Instant};

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
            console(stream, arg(3)?.parse()?, arg(4)?.parse()?).await
        }
        "observers" => {
            let session = ExporterSession::connect(arg(1)?, &ConnectOptions::from_env()).await?;
            let driver = session.driver(arg(2)?)?;
            let (reading, stalled): (usize, usize) = (arg(4)?.parse()?, arg(5)?.parse()?);
            let mut held = Vec::new();
            for i in 0..reading + stalled {
                let mut s = driver.open_stream("observe").await?;
                if i < reading {
                    held.push(tokio::spawn(async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
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
            let r = console(stream, arg(3)?.parse()?, 0).await;
            held.iter().for_each(tokio::task::JoinHandle::abort);
            r
        }
        "pty-echo" => pty_echo(arg(1)?).await,
        "sink" => sink().await,
        "send" => send(arg(1)?, arg(2)?.parse()?).await,
        other => bail!("unknown mode {other:?}"),
    }
}

async fn console<S: AsyncRead + AsyncWrite + Send + Unpin + 'static>(
    stream: S,
    mib: usize,
    lines: usize,
) -> Result<()> {
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
    let _w = writer.await??;
    lat.sort();
    let pct = |p: f64| {
        let idx = ((lat.len() as f64 - 1.0) * p).round() as usize;
        lat.get(idx).map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    println!(
        "{{\"mib_per_sec\":{:.2},\"rtt_p50_us\":{:.1},\"rtt_p99_us\":{:.1}}}",
        mib as f64 / elapsed.as_secs_f64(),
        pct(0.5),
        pct(0.99)
    );
    Ok(())
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
