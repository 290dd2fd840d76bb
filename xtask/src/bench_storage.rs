//! Storage throughput: upload and download of one image through MockStorageMux, ours vs
//! the upstream Python client + exporter, over direct TCP and over a Unix socket, measured
//! in the same run; plus our exporter's peak RSS (VmHWM).
//!
//! `run(&["--size-mib", "1024"])` (the default size is 1 GiB). Release builds are used.
//! Our figures include the `j` process start; the Python figures are timed inside the
//! Python script (its start-up excluded), which favours Python. Each transfer runs
//! [`RUNS`] times and the median is printed; the medium and the downloaded copy are on
//! tmpfs when there is room (see [`scratch_dir`]).
//!
//! To show what the machine itself allows, the same image is also copied with plain
//! syscalls and no protocol at all (file -> loopback socket -> file, see [`plain_copy`]):
//! no tool can move a file between two processes on this machine faster than that. The
//! TCP copies run between our TCP runs and the Unix copies between our Unix runs, so that
//! each ratio compares figures taken close together.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    interop::{ensure_venv, tempfile_dir::Dir},
    procs::{self, Background},
};

const CONFIG: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: bench
endpoint: \"\"
token: \"\"
export:
  storage:
    type: jumpstarter_driver_opendal.driver.MockStorageMux
";

const PY_CLIENT: &str = r#"
import sys, time
from jumpstarter.utils.env import env
src, dst, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
with env() as client:
    for _ in range(runs):
        t = time.monotonic(); client.storage.write_local_file(src); up = time.monotonic() - t
        t = time.monotonic(); client.storage.read_local_file(dst); down = time.monotonic() - t
        print(f"upload_seconds {up}")
        print(f"download_seconds {down}", flush=True)
"#;

/// One measured configuration: the seconds of each run.
struct Figures {
    name: String,
    upload: Vec<f64>,
    download: Vec<f64>,
}

/// Rates of runs that took `secs` each, for `size` bytes: the median, the slowest, the fastest.
fn rates(size: u64, secs: &[f64]) -> (f64, f64, f64) {
    let mut r: Vec<f64> = secs.iter().map(|s| mb_per_s(size, *s)).collect();
    r.sort_by(f64::total_cmp);
    let (lo, hi) = (r.first().copied(), r.last().copied());
    (median(r), lo.unwrap_or(f64::NAN), hi.unwrap_or(f64::NAN))
}

/// "median (slowest-fastest)".
fn spread(size: u64, secs: &[f64]) -> String {
    let (m, lo, hi) = rates(size, secs);
    format!("{m:.0} ({lo:.0}-{hi:.0})")
}

fn mb_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e6 / secs.max(1e-9)
}

pub(crate) fn random_file(path: &Path, len: u64) -> Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut chunk = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for b in chunk.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
        }
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    // On disk (when not on tmpfs) before anything is measured: its write-back would
    // compete with the runs.
    f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(())
}

fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn timed(mut cmd: Command, what: &str) -> Result<f64> {
    let start = Instant::now();
    let out = procs::run(
        {
            cmd.env("NO_COLOR", "1");
            cmd
        },
        Duration::from_secs(900),
    )?;
    ensure!(
        out.code == 0,
        "{what} exited {}\n{}\n{}",
        out.code,
        out.stdout,
        out.stderr
    );
    Ok(start.elapsed().as_secs_f64())
}

fn same_size(a: &Path, b: &Path) -> Result<()> {
    let (la, lb) = (std::fs::metadata(a)?.len(), std::fs::metadata(b)?.len());
    ensure!(
        la == lb,
        "{} has {la} bytes, {} has {lb}",
        a.display(),
        b.display()
    );
    Ok(())
}

/// Our exporter (`jmp run`) on TCP; returns it and its port.
fn our_tcp_exporter(
    jmp: &Path,
    config: &Path,
    scratch: &Path,
    extra: &[&str],
) -> Result<(Background, u16)> {
    let mut c = Command::new(jmp);
    c.env("TMPDIR", scratch);
    crate::procs::start_our_exporter(c, config, extra)
}

/// Where the image, the exporters' medium (their temporary directory) and the downloaded
/// copy go: tmpfs when it has room for them, so that the figures measure the transfer rather
/// than the disk. (ext4 allocates a whole file's blocks on the spot when it is renamed over
/// another, and this VM pages out file cache left idle for a minute.) The same place serves
/// ours and Python. Returns the directory and whether it is on tmpfs.
pub(crate) fn scratch_dir(size: u64) -> Result<(Dir, bool)> {
    let shm = Path::new("/dev/shm");
    // The image, the medium, its partial copy while a write is under way, and the
    // downloaded copy.
    let needed = 4 * size + (64 << 20);
    if free_bytes(shm).is_some_and(|free| free > needed) {
        return Ok((Dir::new_in(shm, "jmp-bench-storage")?, true));
    }
    Ok((Dir::new("jmp-bench-scratch")?, false))
}

/// Free bytes on the filesystem of `path`, from `df` (none if it cannot tell).
fn free_bytes(path: &Path) -> Option<u64> {
    let out = Command::new("df").arg("-Pk").arg(path).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let kib: u64 = text
        .lines()
        .nth(1)?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The upload and download seconds of the Python script's [`RUNS`] runs.
fn parse_py(out: &str) -> Result<(Vec<f64>, Vec<f64>)> {
    let get = |key: &str| -> Result<Vec<f64>> {
        let v: Vec<f64> = out
            .lines()
            .filter_map(|l| l.strip_prefix(key))
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        ensure!(
            v.len() == RUNS,
            "expected {RUNS} {key}figures in python output:\n{out}"
        );
        Ok(v)
    };
    Ok((get("upload_seconds ")?, get("download_seconds ")?))
}

/// How many times each transfer runs; the median is reported (single runs on our VMs vary
/// severalfold, see [`free_page_reporting`], and medians of 3 still swung by half).
const RUNS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// What `run` was asked for.
struct Options {
    size_mib: u64,
    /// Skips the Python runs (and the venv): for quick iterations on our side.
    ours_only: bool,
}

fn parse_args(args: &[String]) -> Result<Options> {
    let mut opts = Options {
        size_mib: 1024,
        ours_only: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--size-mib" => {
                opts.size_mib = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .context("--size-mib takes a number")?;
            }
            "--ours-only" => opts.ours_only = true,
            other => {
                bail!("unknown bench-storage argument {other:?} (known: --size-mib N, --ours-only)")
            }
        }
    }
    Ok(opts)
}

/// The binaries, files and directories every measurement uses.
struct Bench {
    size: u64,
    jmp: std::path::PathBuf,
    j: std::path::PathBuf,
    work: Dir,
    config: std::path::PathBuf,
    script: std::path::PathBuf,
    scratch: Dir,
    src: std::path::PathBuf,
    dst: std::path::PathBuf,
}

impl Bench {
    /// Builds our release binaries and lays out the work and scratch directories (the image
    /// is not written yet).
    fn prepare(size: u64) -> Result<(Self, bool)> {
        crate::bench::build_release()?;
        let target = crate::target_dir();
        let work = Dir::new("jmp-bench-storage")?;
        let config = work.path().join("exporter.yaml");
        std::fs::write(&config, CONFIG)?;
        let script = work.path().join("py_client.py");
        std::fs::write(&script, PY_CLIENT)?;
        let (scratch, on_tmpfs) = scratch_dir(size)?;
        let src = scratch.path().join("src.img");
        let dst = scratch.path().join("dst.img");
        Ok((
            Self {
                size,
                jmp: target.join("release/jmp"),
                j: target.join("release/j"),
                work,
                config,
                script,
                scratch,
                src,
                dst,
            },
            on_tmpfs,
        ))
    }

    /// One plain copy of the image (TCP or Unix), checked and cleared away: its seconds.
    fn plain_run(&self, unix: bool) -> Result<f64> {
        let secs = plain_copy(&self.src, &self.dst, unix, self.scratch.path())?;
        self.check_and_clear()?;
        Ok(secs)
    }

    /// Checks that the downloaded copy is whole, then removes it.
    fn check_and_clear(&self) -> Result<()> {
        same_size(&self.src, &self.dst)?;
        std::fs::remove_file(&self.dst)?;
        Ok(())
    }
}

/// One transport's measurements of ours: the figures, the exporter's peak RSS (KiB) and the
/// plain copies taken between the runs.
struct Ours {
    figures: Figures,
    peak_kib: Option<u64>,
    plain: Vec<f64>,
}

/// Runs the storage benchmark and prints the figures.
pub fn run(args: &[String]) -> Result<()> {
    let opts = parse_args(args)?;
    let venv = if opts.ours_only {
        None
    } else {
        Some(ensure_venv()?)
    };
    let (bench, on_tmpfs) = Bench::prepare(opts.size_mib * 1024 * 1024)?;
    print_conditions(&bench, opts.size_mib, on_tmpfs);
    random_file(&bench.src, bench.size)?;
    // What metrics and JSON call logs cost an upload is measured by `cargo xtask bench`'s
    // section of its own, in interleaved rounds.
    let tcp = ours_tcp(&bench, &[], "ours   TCP ")?;
    let unix = ours_unix(&bench)?;
    let mut peak = Vec::new();
    if let Some(kib) = tcp.peak_kib {
        peak.push(("ours, TCP", kib));
    }
    if let Some(kib) = unix.peak_kib {
        peak.push(("ours, Unix socket (jmp shell)", kib));
    }
    let plain = [("TCP ", tcp.plain), ("Unix", unix.plain)];
    let mut rows = vec![tcp.figures, unix.figures];
    if let Some(venv) = &venv {
        rows.push(python_tcp(&bench, venv)?);
        rows.push(python_unix(&bench, venv)?);
    }
    report(bench.size, &rows, &plain, &peak);
    Ok(())
}

/// What the figures depend on: the size, where the files are, whether the VM reclaims memory.
fn print_conditions(bench: &Bench, size_mib: u64, on_tmpfs: bool) {
    println!("== storage bench: {size_mib} MiB through MockStorageMux");
    if on_tmpfs {
        println!(
            "(the image, the exporters' medium and the downloaded copy are on tmpfs, {}, for \
             every run: the figures are the transfer's, not this machine's disk's)",
            bench.scratch.path().display()
        );
    } else {
        println!("(no room on /dev/shm: the image, the medium and the copy are on disk)");
    }
    if free_page_reporting() {
        println!(
            "(this VM hands memory back to its host as soon as it is freed (virtio-balloon free \
             page reporting): a write into pages freed a moment ago waits for the host to back \
             them again, so single runs vary severalfold here, the plain copy's included)"
        );
    }
}

/// Ours, direct TCP: `j storage` against `jmp run` on a TCP listener (started with `extra`);
/// `name` is its row's.
fn ours_tcp(bench: &Bench, extra: &[&str], name: &str) -> Result<Ours> {
    let (exporter, port) =
        our_tcp_exporter(&bench.jmp, &bench.config, bench.scratch.path(), extra)?;
    let host = format!("127.0.0.1:{port}");
    let ours = |sub: &str, file: &Path| {
        let mut c = Command::new(&bench.j);
        c.env("JUMPSTARTER_HOST", &host)
            .env("JMP_GRPC_INSECURE", "1")
            .args(["storage", sub])
            .arg(file);
        c
    };
    let (mut ups, mut downs, mut plain) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        ups.push(timed(
            ours("write-local-file", &bench.src),
            "our j write-local-file",
        )?);
        downs.push(timed(
            ours("read-local-file", &bench.dst),
            "our j read-local-file",
        )?);
        bench.check_and_clear()?;
        // The machine's ceiling, measured between our runs so that both see the same
        // moment of a machine whose speed drifts.
        plain.push(bench.plain_run(false)?);
    }
    let peak_kib = peak_rss_kib(exporter.pid());
    let _ = std::fs::remove_file(&bench.dst);
    Ok(Ours {
        figures: Figures {
            name: name.into(),
            upload: ups,
            download: downs,
        },
        peak_kib,
        plain,
    })
}

/// Ours, Unix socket (the exporter inside `jmp shell`, timestamps from the shell): one shell
/// per run, so that a plain Unix copy can run between them.
fn ours_unix(bench: &Bench) -> Result<Ours> {
    let inner = format!(
        "t0=$(date +%s.%N); \"{j}\" storage write-local-file \"{src}\" || exit 1; \
         t1=$(date +%s.%N); \"{j}\" storage read-local-file \"{dst}\" || exit 1; \
         t2=$(date +%s.%N); echo \"times $t0 $t1 $t2\"; \
         grep VmHWM /proc/$PPID/status",
        j = bench.j.display(),
        src = bench.src.display(),
        dst = bench.dst.display()
    );
    let (mut ups, mut downs, mut plain, mut hwm) = (Vec::new(), Vec::new(), Vec::new(), None);
    for _ in 0..RUNS {
        let mut c = Command::new(&bench.jmp);
        c.env("TMPDIR", bench.scratch.path())
            .args(["shell", "--exporter-config"])
            .arg(&bench.config)
            .args(["--", "sh", "-c", &inner]);
        let out = procs::run(c, Duration::from_secs(900))?;
        ensure!(
            out.code == 0,
            "jmp shell storage bench exited {}\n{}\n{}",
            out.code,
            out.stdout,
            out.stderr
        );
        let (up, down) = shell_timings(&out.stdout)?;
        ups.push(up);
        downs.push(down);
        bench.check_and_clear()?;
        let kib = out
            .stdout
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok());
        hwm = hwm.max(kib);
        // The Unix ceiling, between our Unix runs.
        plain.push(bench.plain_run(true)?);
    }
    Ok(Ours {
        figures: Figures {
            name: "ours   Unix".into(),
            upload: ups,
            download: downs,
        },
        peak_kib: hwm,
        plain,
    })
}

/// The upload and download seconds of the shell's `times t0 t1 t2` line.
fn shell_timings(stdout: &str) -> Result<(f64, f64)> {
    match times_line(stdout)?[..] {
        [t0, t1, t2] => Ok((t1 - t0, t2 - t1)),
        ref t => bail!("bad timings {t:?}: three times expected"),
    }
}

/// The numbers of the `times ...` line a bench's shell command printed (the moments it
/// took, in seconds).
pub(crate) fn times_line(stdout: &str) -> Result<Vec<f64>> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("times "))
        .with_context(|| format!("no timings in:\n{stdout}"))?;
    Ok(line
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect())
}

/// The Python client's RUNS round trips against `host`: one row of figures.
fn py_client(bench: &Bench, venv: &Path, host: &str, name: &str) -> Result<Figures> {
    let mut c = Command::new(venv.join("bin/python"));
    c.arg(&bench.script)
        .arg(&bench.src)
        .arg(&bench.dst)
        .arg(RUNS.to_string())
        .env("JUMPSTARTER_HOST", host)
        .env("JMP_GRPC_INSECURE", "1")
        .env("JMP_DRIVERS_ALLOW", "UNSAFE")
        .env(
            "JMP_CLIENT_CONFIG_HOME",
            bench.work.path().join("py-config"),
        );
    let out = procs::run(c, Duration::from_secs(1800))?;
    ensure!(out.code == 0, "python client failed:\n{}", out.stderr);
    let (upload, download) = parse_py(&out.stdout)?;
    bench.check_and_clear()?;
    Ok(Figures {
        name: name.into(),
        upload,
        download,
    })
}

/// Python, direct TCP: upstream's `jmp run` on a TCP listener.
fn python_tcp(bench: &Bench, venv: &Path) -> Result<Figures> {
    let port = procs::free_port()?;
    let mut c = Command::new(venv.join("bin/jmp"));
    c.args(["run", "--exporter-config"])
        .arg(&bench.config)
        .args([
            "--tls-grpc-listener",
            &format!("127.0.0.1:{port}"),
            "--tls-grpc-insecure",
        ])
        .env(
            "JMP_CLIENT_CONFIG_HOME",
            bench.work.path().join("py-config"),
        )
        .env("TMPDIR", bench.scratch.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _exporter = Background::start("python jmp run", c)?;
    procs::wait_port(port, Duration::from_secs(60))?;
    py_client(bench, venv, &format!("127.0.0.1:{port}"), "python TCP ")
}

/// Python, Unix socket: upstream's exporter served on a socket by `serve_unix.py`.
fn python_unix(bench: &Bench, venv: &Path) -> Result<Figures> {
    let sock = bench.work.path().join("py.sock");
    let mut c = Command::new(venv.join("bin/python"));
    c.arg(crate::workspace_root().join("xtask/interop/serve_unix.py"))
        .arg(&bench.config)
        .arg(&sock)
        .env("TMPDIR", bench.scratch.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _exporter = Background::start("python serve_unix.py", c)?;
    procs::wait_path(&sock, Duration::from_secs(60))?;
    py_client(bench, venv, &sock.to_string_lossy(), "python Unix")
}

/// Prints the medians (with their spread), the speed-ups over Python, our share of the
/// plain-copy ceiling, and the exporters' peak RSS.
fn report(size: u64, rows: &[Figures], plain: &[(&str, Vec<f64>)], peak: &[(&str, u64)]) {
    println!("(each figure is the median of {RUNS} runs, the slowest and fastest in brackets)");
    println!("{:<12} {:>20} {:>20}", "", "upload MB/s", "download MB/s");
    for r in rows {
        println!(
            "{:<12} {:>20} {:>20}",
            r.name,
            spread(size, &r.upload),
            spread(size, &r.download)
        );
    }
    for transport in ["TCP ", "Unix"] {
        let find = |who: &str| {
            rows.iter()
                .find(|r| r.name == format!("{who} {transport}"))
                .map(|r| (rates(size, &r.upload).0, rates(size, &r.download).0))
        };
        if let (Some(o), Some(p)) = (find("ours  "), find("python")) {
            println!(
                "speed-up {}: upload {:.1}x, download {:.1}x",
                transport.trim(),
                o.0 / p.0.max(1e-9),
                o.1 / p.1.max(1e-9)
            );
        }
    }
    for (transport, secs) in plain {
        let ceiling = rates(size, secs).0;
        println!(
            "plain syscalls {} (file -> socket -> file, no protocol): {} MB/s",
            transport.trim(),
            spread(size, secs)
        );
        if let Some(o) = rows
            .iter()
            .find(|r| r.name == format!("ours   {transport}"))
        {
            println!(
                "  ours at {:.0}% (upload) and {:.0}% (download) of it",
                100.0 * rates(size, &o.upload).0 / ceiling.max(1e-9),
                100.0 * rates(size, &o.download).0 / ceiling.max(1e-9)
            );
        }
    }
    for (what, kib) in peak {
        println!("exporter peak RSS ({what}): {:.1} MB", *kib as f64 / 1024.0);
    }
}

/// Whether this machine is a VM that reports freed memory to its host (virtio-balloon free
/// page reporting), which the host then takes back. Each transfer here writes a fresh copy
/// into pages that another one has just freed; on such a VM that write waits for the host to
/// back the pages again, for however long the host takes, which shows as runs of the same
/// binaries severalfold apart.
fn free_page_reporting() -> bool {
    let Ok(devices) = std::fs::read_dir("/sys/bus/virtio/devices") else {
        return false;
    };
    devices.flatten().any(|d| {
        let read = |f: &str| std::fs::read_to_string(d.path().join(f)).unwrap_or_default();
        // Device 5 is the balloon; feature bit 5 (the sixth character) is
        // VIRTIO_BALLOON_F_REPORTING.
        read("device").trim() == "0x0005" && read("features").as_bytes().get(5) == Some(&b'1')
    })
}

/// Copies `src` to `dst` through a loopback socket (TCP, or a Unix socket in `dir`) with
/// plain blocking syscalls and no protocol: one thread reads the file, one sends, one
/// receives, one writes the copy, handing `CHUNK`-byte buffers along bounded queues (the
/// same pipeline shape as ours, minus everything but the copies). Returns the seconds taken.
fn plain_copy(src: &Path, dst: &Path, unix: bool, dir: &Path) -> Result<f64> {
    use std::io::{Read, Write};
    use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
    const CHUNK: usize = 256 * 1024;
    const QUEUE: usize = 8;

    type Chunk = (Vec<u8>, usize);
    /// Moves chunks from `read` to `write` through a bounded queue; buffers come back on a
    /// second queue so that no chunk is allocated twice.
    fn pump(
        mut read: impl Read + Send + 'static,
        mut write: impl Write + Send + 'static,
    ) -> std::thread::JoinHandle<std::io::Result<()>> {
        let (full_tx, full_rx): (SyncSender<Chunk>, Receiver<Chunk>) = sync_channel(QUEUE);
        let (free_tx, free_rx) = sync_channel::<Vec<u8>>(QUEUE + 1);
        for _ in 0..=QUEUE {
            let _ = free_tx.send(vec![0u8; CHUNK]);
        }
        let writer = std::thread::spawn(move || -> std::io::Result<()> {
            for (buf, n) in full_rx {
                write.write_all(&buf[..n])?;
                let _ = free_tx.send(buf);
            }
            write.flush()
        });
        std::thread::spawn(move || -> std::io::Result<()> {
            while let Ok(mut buf) = free_rx.recv() {
                let n = read.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                if full_tx.send((buf, n)).is_err() {
                    break;
                }
            }
            drop(full_tx);
            writer
                .join()
                .map_err(|_| std::io::Error::other("writer thread panicked"))?
        })
    }
    let join = |h: std::thread::JoinHandle<std::io::Result<()>>| -> Result<()> {
        h.join()
            .map_err(|_| anyhow::anyhow!("plain copy thread panicked"))?
            .context("plain copy")
    };

    let input = std::fs::File::open(src)?;
    let output = std::fs::File::create(dst)?;
    let start = Instant::now();
    if unix {
        let sock = dir.join("plain-copy.sock");
        let _ = std::fs::remove_file(&sock);
        let listener = std::os::unix::net::UnixListener::bind(&sock)?;
        let client = std::os::unix::net::UnixStream::connect(&sock)?;
        let (server, _) = listener.accept()?;
        let send = pump(input, client);
        let recv = pump(server, output);
        join(send)?;
        join(recv)?;
        let _ = std::fs::remove_file(&sock);
    } else {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let client = std::net::TcpStream::connect(listener.local_addr()?)?;
        let (server, _) = listener.accept()?;
        let send = pump(input, client);
        let recv = pump(server, output);
        join(send)?;
        join(recv)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_times_line_gives_the_transfer_seconds() {
        let out = "wrote\ntimes 10.0 12.5 16.0\n";
        assert_eq!(times_line(out).unwrap(), [10.0, 12.5, 16.0]);
        assert_eq!(shell_timings(out).unwrap(), (2.5, 3.5));
        assert!(shell_timings("times 1 2\n").is_err());
        assert!(times_line("no line\n").is_err());
    }
}
