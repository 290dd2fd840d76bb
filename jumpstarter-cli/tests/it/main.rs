//! End-to-end tests of `jmp` and `j`: the real binaries on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod admin;
mod boards;
mod console;
mod console_observers;
mod console_transcripts;
mod direct;
mod direct_path;
mod distributed;
mod doc_examples;
mod first_hour;
mod hints;
mod hooks;
mod insecure_tls;
mod json_logs;
mod keep_alive;
mod labels;
mod lease_end;
mod local;
mod log_gathering;
mod login;
mod mcp;
mod metrics;
mod motd;
mod pools;
mod pools_admin;
mod python_drivers;
mod qemu;
mod router_faults;
mod selectors;
mod sharing;
mod shell_timings;
mod single_lease;
mod storage;
mod token_expiry;
mod traces;
mod twin;
mod wording;

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

pub const JMP: &str = env!("CARGO_BIN_EXE_jmp");
pub const J: &str = env!("CARGO_BIN_EXE_j");

pub const MOCK_CONFIG: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: e2e
endpoint: \"\"
token: \"\"
export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
";

/// A scratch directory with an exporter config, and a clean environment for the tools.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

impl Scratch {
    pub fn new() -> Self {
        let s = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        s.write("exporter.yaml", MOCK_CONFIG);
        s
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn cmd(&self, bin: &str) -> Command {
        let mut c = Command::new(bin);
        // Temporary files (a mock medium, say) go in the scratch directory, so that they
        // go with it even when the process is killed before it can remove them.
        c.current_dir(self.dir.path())
            .env("TMPDIR", self.dir.path())
            .env("JMP_CLIENT_CONFIG_HOME", self.dir.path().join("config"))
            .env_remove("JUMPSTARTER_HOST")
            .env_remove("JMP_GRPC_INSECURE")
            .env_remove("JMP_GRPC_PASSPHRASE")
            .stdin(Stdio::null());
        c
    }

    /// With the admin config `admin` (a running controller's): exporter `board` labelled
    /// `label` (`key=value`), its config at `board.yaml` serving a MockPower as `power`, and
    /// client `ci` saved as the default client config (drivers unsafe-allowed). The
    /// exporter's config path.
    pub fn mock_board_and_client(&self, admin: &std::path::Path, label: &str) -> PathBuf {
        let exporter = self.path("board.yaml");
        let out = self
            .cmd(JMP)
            .env("JMP_ADMIN_CONFIG", admin)
            .args(["admin", "create", "exporter", "board", "-l", label, "--out"])
            .arg(&exporter)
            .output()
            .unwrap();
        assert!(out.status.success(), "{:?}", text(&out));
        let config = std::fs::read_to_string(&exporter).unwrap().replace(
            "\nexport:\n",
            "\nexport:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n",
        );
        std::fs::write(&exporter, config).unwrap();
        let out = self
            .cmd(JMP)
            .env("JMP_ADMIN_CONFIG", admin)
            .args(["admin", "create", "client", "ci", "--save", "--unsafe"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{:?}", text(&out));
        exporter
    }
}

pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A background process killed on drop.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `jmp run ... --tls-grpc-listener 127.0.0.1:0` and returns it with its port.
pub fn start_exporter(scratch: &Scratch, extra: &[&str]) -> (Running, u16) {
    let mut c = scratch.cmd(JMP);
    c.args(["run", "--exporter-config"])
        .arg(scratch.path("exporter.yaml"))
        .args(["--tls-grpc-listener", "127.0.0.1:0"])
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
    let mut child = c.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let running = Running(child);
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("jmp run did not report its address");
        if let Some(rest) = line.split("listening on ").nth(1) {
            let addr = rest.split_whitespace().next().unwrap();
            let port = addr.rsplit(':').next().unwrap().parse().unwrap();
            return (running, port);
        }
    }
}
