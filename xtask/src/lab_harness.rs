//! `cargo xtask lab-harness`: runs `examples/lab-harness` (a Rust harness that uses only the
//! `jumpstarter-core` facade) against a lab on loopback: a controller (embedded store,
//! in-process router, port 0), an exporter with mock power and storage and a serial console
//! on a fake board's console server (TCP, port 0, printing a boot banner and a login
//! prompt), and a client created with `jmp admin`. It checks that the harness leased the
//! board, flashed and verified the image, saw the prompt and released the lease. `cargo
//! xtask ci` runs it.

use std::{
    io::{Read, Write},
    net::TcpListener,
    path::Path,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    procs::{Background, run as run_cmd, wait_path},
    quickstart::fill_export,
};

/// What the fake board's console prints to each connection: a boot banner, then a prompt.
const BANNER: &[u8] = b"\r\nU-Boot 2024.01 (mock)\r\nStarting kernel ...\r\n\r\nlab-board login: ";

/// The harness's label selector, set on the exporter.
const LABEL: &str = "board=lab-harness";

/// A fake board's serial console: a TCP server on loopback that prints [`BANNER`] to each
/// connection and reads (and drops) what is typed; stopped when dropped.
struct FakeConsole {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl FakeConsole {
    fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").context("fake console: cannot listen")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        let stopped = Arc::clone(&stopped);
                        std::thread::spawn(move || {
                            let _ = conn.set_nonblocking(false);
                            let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
                            if conn.write_all(BANNER).is_err() {
                                return;
                            }
                            let mut buf = [0u8; 1024];
                            while !stopped.load(Ordering::Relaxed) {
                                match conn.read(&mut buf) {
                                    Ok(0) => return,
                                    Ok(_) => {}
                                    Err(e)
                                        if matches!(
                                            e.kind(),
                                            std::io::ErrorKind::WouldBlock
                                                | std::io::ErrorKind::TimedOut
                                        ) => {}
                                    Err(_) => return,
                                }
                            }
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(Self { port, stop })
    }
}

impl Drop for FakeConsole {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The drivers of the harness's board.
fn drivers(console_port: u16) -> String {
    format!(
        "export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
  storage:
    type: jumpstarter_driver_opendal.driver.MockStorageMux
  serial:
    type: jumpstarter_driver_pyserial.driver.PySerial
    config:
      url: socket://127.0.0.1:{console_port}
"
    )
}

/// Runs [`run_with`] with the binaries of the workspace's test build (the harness's among
/// them: its integration test makes `cargo test` build it), so nothing is built again.
pub fn run(_args: &[String]) -> Result<()> {
    crate::debug_build()?;
    run_with(
        &crate::target_dir().join("debug"),
        &crate::target_dir().join("lab-harness"),
    )
}

/// The lab in `home` with the binaries of `bin`, and the harness run against it.
pub fn run_with(bin: &Path, home: &Path) -> Result<()> {
    if home.exists() {
        std::fs::remove_dir_all(home)
            .with_context(|| format!("cannot clear {}", home.display()))?;
    }
    std::fs::create_dir_all(home)?;
    let command = |program: &str| {
        let mut cmd = Command::new(bin.join(program));
        cmd.env("JMP_CLIENT_CONFIG_HOME", home.join("config"))
            .env("JMP_ADMIN_CONFIG", home.join("config").join("admin.yaml"))
            .env_remove("JMP_NAME")
            .env_remove("JMP_LEASE")
            .env_remove("JUMPSTARTER_HOST");
        cmd
    };
    let jmp = |args: &[&str]| -> Result<String> {
        let mut cmd = command("jmp");
        cmd.args(args);
        let out = run_cmd(cmd, Duration::from_secs(60))?;
        if out.code != 0 {
            bail!(
                "jmp {} failed: {}{}",
                args.join(" "),
                out.stdout,
                out.stderr
            );
        }
        Ok(out.stdout)
    };

    let console = FakeConsole::start()?;
    let data = home.join("data").to_string_lossy().into_owned();
    let admin = home.join("config").join("admin.yaml");
    let mut controller = command("jumpstarter-controller");
    controller.args([
        "--data-dir",
        &data,
        "--listen",
        "127.0.0.1:0",
        "--router-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "off",
        "--admin-config",
        &admin.to_string_lossy(),
    ]);
    let _controller = Background::start("jumpstarter-controller", controller)?;
    wait_path(&admin, Duration::from_secs(60))
        .context("the controller did not write its admin config")?;

    let exporter_config = home.join("exporter.yaml");
    let exporter_str = exporter_config.to_string_lossy().into_owned();
    jmp(&[
        "admin",
        "create",
        "exporter",
        "harness-board",
        "--label",
        LABEL,
        "--out",
        &exporter_str,
    ])?;
    fill_export(&exporter_config, &drivers(console.port))?;
    let mut run = command("jmp");
    run.args(["run", "--exporter-config", &exporter_str]);
    let mut exporter = Background::start("jmp run", run)?;

    let client_config = home.join("client.yaml");
    let client_str = client_config.to_string_lossy().into_owned();
    jmp(&[
        "admin",
        "create",
        "client",
        "harness",
        "--unsafe",
        "--out",
        &client_str,
    ])?;
    wait_online(&jmp, &client_str, &mut exporter)?;

    // A 4 MiB image, not all zeros, so that a verification that read nothing would fail.
    let image = home.join("image.img");
    let bytes: Vec<u8> = (0..4u32 << 20)
        .map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes()[2])
        .collect();
    std::fs::write(&image, bytes).with_context(|| format!("cannot write {}", image.display()))?;

    let mut harness = command("lab-harness");
    harness.args([
        "--client-config",
        &client_str,
        "--selector",
        LABEL,
        "--image",
        &image.to_string_lossy(),
        "--prompt",
        "login: ",
        "--timeout",
        "60s",
    ]);
    println!(
        "$ lab-harness --client-config {client_str} --selector {LABEL} --image {}",
        image.display()
    );
    let out = run_cmd(harness, Duration::from_secs(180))?;
    print!("{}", out.stdout);
    if out.code != 0 {
        let said: Vec<String> = exporter.lines.try_iter().collect();
        bail!(
            "lab-harness exited with {}: {}\nthe exporter printed:\n{}",
            out.code,
            out.stderr,
            said.join("\n")
        );
    }
    for want in [
        "leased harness-board",
        "flashed",
        "(verified)",
        "powered on",
        "console: \"lab-board login: \"",
        "powered off",
        "released",
    ] {
        if !out.stdout.contains(want) {
            bail!(
                "lab-harness did not say {want:?}:\n{}{}",
                out.stdout,
                out.stderr
            );
        }
    }
    // The lease is gone: nothing active is left for this client.
    let leases = jmp(&[
        "get",
        "leases",
        "--client-config",
        &client_str,
        "-o",
        "name",
    ])?;
    if !leases.trim().is_empty() {
        bail!("lab-harness left active leases: {leases}");
    }
    println!("lab-harness: leased, flashed, powered on, saw the prompt and released");
    Ok(())
}

/// Waits until the controller reports the exporter online.
fn wait_online(
    jmp: &dyn Fn(&[&str]) -> Result<String>,
    client: &str,
    exporter: &mut Background,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = jmp(&[
            "get",
            "exporters",
            "--client-config",
            client,
            "--with",
            "online",
            "-o",
            "json",
        ]);
        if let Ok(text) = &out
            && text.contains("\"online\": true")
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            let said: Vec<String> = exporter.lines.try_iter().collect();
            bail!(
                "the exporter did not come online within 60 s ({out:?}); it printed:\n{}",
                said.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_console_prints_its_banner_to_each_connection() {
        let console = FakeConsole::start().unwrap();
        for _ in 0..2 {
            let mut conn = std::net::TcpStream::connect(("127.0.0.1", console.port)).unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut got = vec![0u8; BANNER.len()];
            conn.read_exact(&mut got).unwrap();
            assert_eq!(got, BANNER);
        }
    }

    #[test]
    fn the_export_fills_the_empty_section() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.yaml");
        std::fs::write(&path, "apiVersion: v1\nexport:\ntoken: x\n").unwrap();
        fill_export(&path, &drivers(1234)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("url: socket://127.0.0.1:1234\ntoken: x"),
            "{text}"
        );
    }
}
