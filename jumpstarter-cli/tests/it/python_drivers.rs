//! Python drivers hosted by our exporter through a child running upstream's runtime
//! (`docs/python-drivers.md`): a lab's in-house driver module, upstream drivers forced to
//! Python, beside Rust drivers, in one tree.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use futures::StreamExt;
use jumpstarter_core::{
    client::{ConnectOptions, ExporterSession, UploadSource, connect_channel},
    wire::resource::ResourceHandle,
};
use jumpstarter_proto::v1::exporter_service_client::ExporterServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{J, JMP, Running, Scratch, hooks::upstream_venv, text};

/// A lab's own Python drivers (what a lab moving to our exporter brings along).
const LAB_DRIVERS: &str = r#"
import asyncio
import os
from contextlib import asynccontextmanager
from dataclasses import dataclass

from anyio import create_memory_object_stream
from anyio.streams.stapled import StapledObjectStream
from jumpstarter.client import DriverClient
from jumpstarter.driver import Driver, export, exportstream

CANCELLED = [0]


class LampClient(DriverClient):
    def switch(self, on):
        return self.call("switch", on)


@dataclass(kw_only=True)
class Lamp(Driver):
    brightness: int = 3

    @classmethod
    def client(cls):
        return "lab_drivers.LampClient"

    @export
    def switch(self, on: bool) -> str:
        self.logger.info("lamp switched %s", on)
        return f"lamp {'on' if on else 'off'} at {self.brightness}"

    @export
    async def count(self, n: int):
        for i in range(int(n)):
            yield i

    @export
    def fail(self):
        raise ValueError("the bulb is broken")

    @export
    def crash(self):
        os._exit(1)

    @export
    def pid(self) -> int:
        return os.getpid()

    @export
    def boom(self):
        raise RuntimeError("boom \u00e9")

    @export
    def size(self, data: str) -> int:
        return len(data)

    @export
    def big(self, n) -> str:
        return "x" * int(n)

    @export
    async def nap(self, seconds) -> str:
        # Which server runs the call: the fast path's FastCall.run or grpc's handler.
        await asyncio.sleep(float(seconds))
        return asyncio.current_task().get_coro().__qualname__

    @export
    async def hang(self):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            CANCELLED[0] += 1
            raise

    @export
    def cancellations(self) -> int:
        return CANCELLED[0]

    @exportstream
    @asynccontextmanager
    async def echo(self):
        tx, rx = create_memory_object_stream(32)
        async with tx, rx:
            yield StapledObjectStream(tx, rx)


@dataclass(kw_only=True)
class Rack(Driver):
    @classmethod
    def client(cls):
        return "jumpstarter_driver_composite.client.CompositeClient"
"#;

/// Rust MockPower; a Rust Composite with a Rust and a Python child; a Python composite with
/// a Python child; upstream's Python Shell and MockFlasher (forced to Python).
const MIXED: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: mixed
endpoint: \"\"
token: \"\"
export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
  bench:
    type: jumpstarter_driver_composite.driver.Composite
    children:
      power2:
        type: jumpstarter_driver_power.driver.MockPower
      lamp:
        type: lab_drivers.Lamp
        description: the bench lamp
        config:
          brightness: 7
  rack:
    type: lab_drivers.Rack
    children:
      lamp:
        type: lab_drivers.Lamp
  sh:
    type: jumpstarter_driver_shell.driver.Shell
    config:
      methods:
        hello: echo \"hello $1\"
  flasher:
    type: jumpstarter_driver_opendal.driver.MockFlasher
";

const FORCED: &str =
    "jumpstarter_driver_shell.driver.Shell,jumpstarter_driver_opendal.driver.MockFlasher";

/// A scratch dir with the lab module and `config`, and the venv's interpreter.
fn scratch(config: &str) -> Option<(Scratch, PathBuf)> {
    let venv = upstream_venv()?;
    let s = Scratch::new();
    s.write("exporter.yaml", config);
    std::fs::create_dir_all(s.path("lab")).unwrap();
    s.write("lab/lab_drivers.py", LAB_DRIVERS);
    Some((s, venv))
}

fn python_env(c: &mut std::process::Command, s: &Scratch, venv: &Path) {
    c.env("JMP_PYTHON", venv.join("bin/python3"))
        .env("JMP_PYTHON_DRIVERS", FORCED)
        .env("PYTHONPATH", s.path("lab"));
}

/// `jmp run --tls-grpc-listener 127.0.0.1:0 --tls-grpc-insecure` with the Python env.
fn standalone(s: &Scratch, venv: &Path) -> (Running, String) {
    standalone_with(s, venv, &[])
}

/// [`standalone`] with more environment variables.
fn standalone_with(s: &Scratch, venv: &Path, envs: &[(&str, &str)]) -> (Running, String) {
    standalone_from(s.cmd(JMP), s, venv, envs)
}

/// [`standalone`] started as a script's background job is: with SIGINT ignored, which its
/// children inherit (`sh`'s `trap "" INT`, then `exec`, so the pid is the exporter's).
fn standalone_ignoring_sigint(s: &Scratch, venv: &Path) -> (Running, String) {
    let mut c = s.cmd("sh");
    c.args(["-c", r#"trap "" INT; exec "$@""#, "sh", JMP]);
    standalone_from(c, s, venv, &[])
}

/// `c` (a command that ends up running our `jmp`) with `run` and the arguments of
/// [`standalone`].
fn standalone_from(
    mut c: std::process::Command,
    s: &Scratch,
    venv: &Path,
    envs: &[(&str, &str)],
) -> (Running, String) {
    c.args(["run", "--exporter-config"])
        .arg(s.path("exporter.yaml"))
        .args(["--tls-grpc-listener", "127.0.0.1:0", "--tls-grpc-insecure"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
    python_env(&mut c, s, venv);
    c.envs(envs.iter().copied());
    let mut child = c.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let running = Running(child);
    let mut seen = Vec::new();
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(90))
            .unwrap_or_else(|_| panic!("jmp run did not report its address: {seen:?}"));
        if let Some(rest) = line.split("listening on ").nth(1) {
            let addr = rest.split_whitespace().next().unwrap().to_string();
            return (running, addr);
        }
        seen.push(line);
    }
}

fn insecure() -> ConnectOptions {
    ConnectOptions {
        insecure: true,
        ..Default::default()
    }
}

/// The pids of `pid`'s children.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
    {
        let Ok(task) = task else { continue };
        let kids = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(
            kids.split_whitespace()
                .filter_map(|k| k.parse::<u32>().ok()),
        );
    }
    out
}

/// Whether `pid` is alive (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The Python child of the exporter `pid`.
fn python_child(pid: u32) -> u32 {
    children_of(pid)
        .into_iter()
        .find(|c| {
            std::fs::read_to_string(format!("/proc/{c}/cmdline"))
                .is_ok_and(|cmd| cmd.contains("bootstrap.py"))
        })
        .expect("the exporter has no Python child")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_drivers_are_served_beside_rust_ones_in_one_tree() {
    let Some((s, venv)) = scratch(MIXED) else {
        return;
    };
    let (_exporter, addr) = standalone(&s, &venv);
    let session = ExporterSession::connect(&addr, &insecure()).await.unwrap();

    // One tree: Rust and Python nodes side by side, with the Python ones' labels.
    let lamp = session.driver("bench.lamp").unwrap();
    assert_eq!(lamp.node().client_class(), "lab_drivers.LampClient");
    assert_eq!(lamp.node().description.as_deref(), Some("the bench lamp"));
    assert_eq!(
        session.driver("rack").unwrap().node().client_class(),
        "jumpstarter_driver_composite.client.CompositeClient"
    );
    assert_eq!(
        session.driver("sh").unwrap().node().client_class(),
        "jumpstarter_driver_shell.client.ShellClient"
    );

    // LogStream carries the Python drivers' logs.
    let channel = connect_channel(&addr, &insecure()).await.unwrap();
    let mut logs = ExporterServiceClient::new(channel)
        .log_stream(())
        .await
        .unwrap()
        .into_inner();

    // Unary, into a Rust composite and a Python composite.
    let r: String = lamp.call("switch", (true,)).await.unwrap();
    assert_eq!(r, "lamp on at 7");
    let rack_lamp = session.driver("rack.lamp").unwrap();
    let r: String = rack_lamp.call("switch", (false,)).await.unwrap();
    assert_eq!(r, "lamp off at 3");
    // A method the Python driver lacks: NOT_FOUND with upstream's one message, not wrapped
    // again by the bridge and the client.
    match lamp.call::<String>("nosuch", ()).await {
        Err(jumpstarter_core::client::ClientError::Call {
            error: jumpstarter_core::DriverError::MethodNotFound(m),
            ..
        }) => assert_eq!(m, "nosuch"),
        other => panic!("expected method not found, got {other:?}"),
    }
    let found = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(Ok(rec)) = logs.next().await {
            if rec.message.contains("lamp switched True") {
                return rec;
            }
        }
        panic!("LogStream ended");
    })
    .await
    .expect("the Python driver's log never reached LogStream");
    assert_eq!(found.severity, "INFO");

    // The Rust drivers beside them.
    let () = session
        .driver("bench.power2")
        .unwrap()
        .call("on", ())
        .await
        .unwrap();
    let () = session
        .driver("power")
        .unwrap()
        .call("on", ())
        .await
        .unwrap();

    // Server streaming.
    let items: Vec<serde_json::Value> = lamp
        .streaming_call::<serde_json::Value>("count", (3,))
        .await
        .unwrap()
        .map(|i| i.unwrap())
        .collect()
        .await;
    assert_eq!(items.len(), 3, "{items:?}");
    assert_eq!(items[2].as_f64(), Some(2.0), "{items:?}");

    // A Python driver's error reaches the client with its message.
    let err = lamp
        .call::<serde_json::Value>("fail", ())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("the bulb is broken"), "{err}");
    let err = lamp
        .call::<serde_json::Value>("no_such_method", ())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no_such_method"), "{err}");

    // A byte stream.
    let mut io = lamp.open_stream("echo").await.unwrap();
    io.write_all(b"ping").await.unwrap();
    io.flush().await.unwrap();
    let mut buf = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(20), io.read_exact(&mut buf))
        .await
        .expect("no echo")
        .unwrap();
    assert_eq!(&buf, b"ping");
    drop(io);

    // A resource: 8 MiB through upstream's Python MockFlasher and back.
    let image: Vec<u8> = (0..8 * 1024 * 1024u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let flasher = session.driver("flasher").unwrap();
    let caller = flasher.clone();
    let data = image.clone();
    flasher
        .upload(
            UploadSource::reader(std::io::Cursor::new(data)),
            None,
            |h: ResourceHandle| async move {
                caller
                    .call::<serde_json::Value>("flash", (h, Option::<String>::None))
                    .await
            },
        )
        .await
        .unwrap();
    let out = s.path("dumped.img");
    let caller = flasher.clone();
    flasher
        .download(
            jumpstarter_core::wire::resource::FileWriter::new(std::fs::File::create(&out).unwrap()),
            None,
            |h: ResourceHandle| async move {
                caller
                    .call::<serde_json::Value>("dump", (h, Option::<String>::None))
                    .await
                    .map(|_| ())
            },
        )
        .await
        .unwrap();
    assert!(
        std::fs::read(&out).unwrap() == image,
        "dump differs from the flashed image"
    );
}

#[test]
fn j_and_upstreams_python_client_drive_python_and_rust_drivers_in_local_mode() {
    let Some((s, venv)) = scratch(MIXED) else {
        return;
    };
    s.write("image.bin", &"x".repeat(100_000));
    s.write(
        "client.py",
        "from jumpstarter.utils.env import env\n\
         with env() as client:\n\
         \x20   print('py:', client.bench.lamp.switch(True))\n\
         \x20   client.power.on()\n\
         \x20   client.flasher.flash('image.bin')\n\
         \x20   print('py: flashed')\n",
    );
    let script = format!(
        "set -e; {j} power on; {j} bench lamp call switch true; {j} sh hello world; \
         {j} flasher flash image.bin; {j} bench lamp --help; {py} client.py",
        j = J,
        py = venv.join("bin/python3").display()
    );
    let mut c = s.cmd(JMP);
    c.args([
        "shell",
        "--exporter-config",
        "exporter.yaml",
        "--",
        "sh",
        "-c",
    ])
    .arg(&script);
    python_env(&mut c, &s, &venv);
    let out = c.output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("\"lamp on at 7\""), "{stdout}");
    assert!(stdout.contains("hello world"), "{stdout}");
    assert!(stdout.contains("py: lamp on at 7"), "{stdout}");
    assert!(stdout.contains("py: flashed"), "{stdout}");
    // No native commands for the lab's class: the generic ones, and where friendly ones are.
    assert!(
        stdout.contains("call") && stdout.contains("stream-call"),
        "{stdout}"
    );
    assert!(stdout.contains("package lab-drivers"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_python_child_is_restarted_while_rust_drivers_keep_working() {
    let Some((s, venv)) = scratch(MIXED) else {
        return;
    };
    let (exporter, addr) = standalone(&s, &venv);
    let session = ExporterSession::connect(&addr, &insecure()).await.unwrap();
    let lamp = session.driver("bench.lamp").unwrap();
    let before: u32 = lamp.call("pid", ()).await.unwrap();
    assert_eq!(before, python_child(exporter.0.id()));

    // The call that kills it fails, and says the Python driver is unavailable.
    let err = lamp
        .call::<serde_json::Value>("crash", ())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("unavailable"), "{err}");
    // The Rust drivers do not notice.
    let () = session
        .driver("power")
        .unwrap()
        .call("on", ())
        .await
        .unwrap();
    // The same uuids work again once the child is back.
    let mut last = String::new();
    for _ in 0..120 {
        match lamp.call::<u32>("pid", ()).await {
            Ok(pid) => {
                assert_ne!(pid, before);
                let r: String = lamp.call("switch", (true,)).await.unwrap();
                assert_eq!(r, "lamp on at 7");
                return;
            }
            Err(e) => {
                last = e.to_string();
                assert!(last.contains("lab_drivers.Lamp"), "{last}");
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("the Python child was not restarted: {last}");
}

#[test]
fn the_python_child_dies_with_a_killed_exporter() {
    let Some((s, venv)) = scratch(MIXED) else {
        return;
    };
    let (mut exporter, _addr) = standalone(&s, &venv);
    let python = python_child(exporter.0.id());
    assert!(alive(python));
    // kill -9: no destructor runs in the exporter.
    exporter.0.kill().unwrap();
    exporter.0.wait().unwrap();
    for _ in 0..200 {
        if !alive(python) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the Python child {python} outlived the exporter");
}

#[test]
fn a_missing_python_module_names_the_type_package_and_interpreter() {
    let Some((s, venv)) = scratch(
        "export:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n  \
         relay:\n    type: acme_relays.driver.Relay\n",
    ) else {
        return;
    };
    let mut c = s.cmd(JMP);
    c.args(["shell", "--exporter-config", "exporter.yaml", "--", "true"]);
    python_env(&mut c, &s, &venv);
    let out = c.output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}{stderr}");
    let python = venv.join("bin/python3");
    for want in [
        "\"acme_relays.driver.Relay\"",
        "export.relay",
        "pip install acme-relays",
        "No module named 'acme_relays'",
        &python.display().to_string(),
    ] {
        assert!(stderr.contains(want), "{want:?} missing from: {stderr}");
    }
}

#[test]
fn a_python_driver_without_an_interpreter_names_the_type_and_what_to_install() {
    let s = Scratch::new();
    s.write(
        "exporter.yaml",
        "export:\n  relay:\n    type: acme_relays.driver.Relay\n",
    );
    let out = s
        .cmd(JMP)
        .args(["shell", "--exporter-config", "exporter.yaml", "--", "true"])
        .env("JMP_PYTHON", s.path("no-such-python"))
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}{stderr}");
    for want in [
        "acme_relays.driver.Relay (export.relay)",
        "no-such-python",
        "acme-relays",
        "JMP_PYTHON",
    ] {
        assert!(stderr.contains(want), "{want:?} missing from: {stderr}");
    }
}

#[test]
fn a_python_driver_that_fails_to_build_shows_pythons_error() {
    let Some((s, venv)) =
        scratch("export:\n  lamp:\n    type: lab_drivers.Lamp\n    config:\n      wattage: 40\n")
    else {
        return;
    };
    let mut c = s.cmd(JMP);
    c.args(["shell", "--exporter-config", "exporter.yaml", "--", "true"]);
    python_env(&mut c, &s, &venv);
    let out = c.output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("\"lab_drivers.Lamp\" (export.lamp)"),
        "{stderr}"
    );
    assert!(stderr.contains("wattage"), "{stderr}");
    assert!(stderr.contains("Traceback"), "{stderr}");
    // The type is known (Python imported it); only its construction failed.
    assert!(!stderr.contains("unknown driver type"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_exporter_lets_its_python_drivers_clean_up() {
    let Some((s, venv)) = scratch(MIXED) else {
        return;
    };
    let (mut exporter, addr) = standalone(&s, &venv);
    let python = python_child(exporter.0.id());
    let session = ExporterSession::connect(&addr, &insecure()).await.unwrap();
    let flasher = session.driver("flasher").unwrap();
    let caller = flasher.clone();
    flasher
        .upload(
            UploadSource::reader(std::io::Cursor::new(vec![7u8; 100_000])),
            None,
            |h: ResourceHandle| async move {
                caller
                    .call::<serde_json::Value>("flash", (h, Option::<String>::None))
                    .await
            },
        )
        .await
        .unwrap();
    // upstream's MockFlasher keeps its medium in a temporary directory (under TMPDIR, the
    // scratch directory): there while it runs.
    let temp_dirs = || {
        std::fs::read_dir(s.dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("tmp") || n.starts_with("jmp-python-"))
            .collect::<Vec<_>>()
    };
    assert!(!temp_dirs().is_empty());
    drop(session);
    let status = std::process::Command::new("kill")
        .args(["-TERM", &exporter.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    exporter.0.wait().unwrap();
    // Bounded above the child's 15 s watchdog, so a slow close is seen as such.
    for _ in 0..300 {
        if !alive(python) && temp_dirs().is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "after the exporter stopped: Python child alive {}, left behind {:?}",
        alive(python),
        temp_dirs()
    );
}

/// An exporter started with SIGINT ignored (a background job of a script) passes that on to
/// its Python child, where the bootstrap's SIGINT to itself used to do nothing: the child
/// then lingered until its watchdog killed it 15 s later. It now ends by itself at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_child_ends_with_its_exporter_even_with_sigint_ignored() {
    let Some((s, venv)) = scratch(MIXED) else {
        return;
    };
    let (mut exporter, addr) = standalone_ignoring_sigint(&s, &venv);
    let python = python_child(exporter.0.id());
    let session = ExporterSession::connect(&addr, &insecure()).await.unwrap();
    let pid: u32 = session
        .driver("bench.lamp")
        .unwrap()
        .call("pid", ())
        .await
        .unwrap();
    assert_eq!(pid, python);
    drop(session);
    let status = std::process::Command::new("kill")
        .args(["-TERM", &exporter.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    exporter.0.wait().unwrap();
    // Bounded below the child's 15 s watchdog: ending by itself takes well under a second,
    // being killed by the watchdog takes 15 s.
    for _ in 0..100 {
        if !alive(python) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the Python child {python} is still alive 10 s after its exporter stopped");
}

/// A Python composite whose children are a Python driver and a Rust-only driver (HttpPower:
/// upstream's `jumpstarter_driver_http_power` is not installed in the venv, so Python cannot
/// build it): the child leaves it to us, and it hangs under its Python parent in our tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_children_hang_under_a_python_parent() {
    // A plain HTTP endpoint for HttpPower to switch, answering one request.
    let http = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = http.local_addr().unwrap().port();
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Ok((mut conn, _)) = http.accept() {
            use std::io::{Read, Write};
            conn.set_read_timeout(Some(Duration::from_secs(30))).ok();
            let mut buf = [0u8; 4096];
            let n = conn.read(&mut buf).unwrap_or(0);
            let _ = seen_tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    let Some((s, venv)) = scratch(&format!(
        "export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
  rack:
    type: lab_drivers.Rack
    children:
      lamp:
        type: lab_drivers.Lamp
      pdu:
        type: jumpstarter_driver_http_power.driver.HttpPower
        config:
          power_on:
            url: http://127.0.0.1:{port}/relay/on
          power_off:
            url: http://127.0.0.1:{port}/relay/off
"
    )) else {
        return;
    };
    let (_exporter, addr) = standalone(&s, &venv);
    let session = ExporterSession::connect(&addr, &insecure()).await.unwrap();
    let rack = session.driver("rack").unwrap();
    let names: Vec<&str> = rack
        .node()
        .children
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert!(
        names.contains(&"lamp") && names.contains(&"pdu"),
        "{names:?}"
    );
    // The Python child under the Python parent.
    let r: String = session
        .driver("rack.lamp")
        .unwrap()
        .call("switch", (true,))
        .await
        .unwrap();
    assert_eq!(r, "lamp on at 3");
    // The Rust child under it: our HttpPower makes the request.
    let pdu = session.driver("rack.pdu").unwrap();
    assert_eq!(
        pdu.node().client_class(),
        "jumpstarter_driver_power.client.PowerClient"
    );
    let () = pdu.call("on", ()).await.unwrap();
    let request = seen_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(request.starts_with("GET /relay/on "), "{request}");
}

/// `jmp config exporter edit` accepts types only Python provides (the interpreter imports
/// them) and still refuses a type neither Rust nor Python has, as `jmp run` does.
#[test]
fn config_exporter_edit_accepts_python_only_types() {
    let Some((s, venv)) = scratch(MIXED) else {
        return;
    };
    let edit = |sed: &str| {
        let editor = s.write("editor.sh", &format!("#!/bin/sh\nsed -i '{sed}' \"$1\"\n"));
        let mut c = s.cmd(JMP);
        c.env("VISUAL", format!("sh {}", editor.display()))
            .args(["config", "exporter", "edit", "lab"]);
        python_env(&mut c, &s, &venv);
        c.output().unwrap()
    };
    let out = s
        .cmd(JMP)
        .args([
            "config",
            "exporter",
            "create",
            "lab",
            "--endpoint",
            "ctl:443",
            "--token",
            "t",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    let path = s.path("config/exporters/lab.yaml");

    // A lab's Python driver and a Rust one: saved, and the Python one named.
    let out = edit(
        "s/^export:$/export:\\n  lamp:\\n    type: lab_drivers.Lamp\\n  power:\\n    type: jumpstarter_driver_power.driver.MockPower/",
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("Served by Python drivers")
            && stderr.contains("lab_drivers.Lamp (export.lamp)"),
        "{stderr}"
    );
    let saved = std::fs::read_to_string(&path).unwrap();
    assert!(saved.contains("lab_drivers.Lamp"), "{saved}");

    // A type Python cannot import either: refused, the file unchanged, with Python's reason.
    let out = edit("s/lab_drivers.Lamp/lab_drivers.Lampp/");
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("export.lamp.type: unknown driver type \"lab_drivers.Lampp\""),
        "{stderr}"
    );
    assert!(stderr.contains("Lampp"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), saved);
}

/// The fast path's limit on a message (`bridge/fast.rs`): gRPC's default.
const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// The exporter with the unary fast path (the default) and without it (`JMP_BRIDGE_FAST=0`).
const MODES: [(&str, &[(&str, &str)]); 2] = [("fast", &[]), ("grpc", &[("JMP_BRIDGE_FAST", "0")])];

/// What a raw `DriverCall` to `bench.lamp` answers: its result, or its status code and
/// message.
async fn raw_call(
    addr: &str,
    method: &str,
    args: Vec<serde_json::Value>,
) -> Result<prost_types::Value, (tonic::Code, String)> {
    let session = ExporterSession::connect(addr, &insecure()).await.unwrap();
    let uuid = session.driver("bench.lamp").unwrap().node().uuid.clone();
    let channel = connect_channel(addr, &insecure()).await.unwrap();
    ExporterServiceClient::new(channel)
        .driver_call(jumpstarter_proto::v1::DriverCallRequest {
            uuid,
            method: method.into(),
            args: args
                .into_iter()
                .map(jumpstarter_core::value::from_json)
                .collect(),
        })
        .await
        .map(|r| r.into_inner().result.unwrap_or_default())
        .map_err(|s| (s.code(), s.message().to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_calls_answer_the_same_on_the_fast_path_and_through_grpc() {
    let Some((s, venv)) = scratch(MIXED) else {
        return;
    };
    use serde_json::json;
    let near = "y".repeat(MAX_MESSAGE - 1024);
    let cases: Vec<(&str, Vec<serde_json::Value>)> = vec![
        ("switch", vec![json!(true)]),
        // A driver's exceptions: ValueError, another one (non-ASCII message).
        ("fail", vec![]),
        ("boom", vec![]),
        // No such method, a method that is not exported, bad arguments.
        ("no_such_method", vec![]),
        ("_Driver__lookup_drivercall", vec![]),
        ("switch", vec![]),
        ("switch", vec![json!(true), json!(false)]),
        ("size", vec![json!(1)]),
        // An argument and a response near the limit, and a response over it.
        ("size", vec![json!(near)]),
        ("big", vec![json!(MAX_MESSAGE - 1024)]),
        ("big", vec![json!(MAX_MESSAGE + 1024)]),
    ];
    let mut answers = Vec::new();
    for (mode, envs) in MODES {
        let (_exporter, addr) = standalone_with(&s, &venv, envs);
        let mut got = Vec::new();
        for (method, args) in &cases {
            got.push(raw_call(&addr, method, args.clone()).await);
        }
        // Which path served them.
        let served = raw_call(&addr, "nap", vec![json!(0)]).await.unwrap();
        let served = jumpstarter_core::value::to_json(served);
        assert_eq!(
            served.as_str().unwrap().contains("FastCall"),
            mode == "fast",
            "{mode}: {served}"
        );
        answers.push(got);
    }
    for (i, (method, _)) in cases.iter().enumerate() {
        let (fast, grpc) = (&answers[0][i], &answers[1][i]);
        assert_eq!(fast, grpc, "case {i} ({method})");
    }
    // And they are what they should be.
    let errors: Vec<_> = answers[0]
        .iter()
        .map(|a| a.as_ref().err().cloned())
        .collect();
    assert!(answers[0][0].is_ok());
    assert_eq!(
        errors[1],
        Some((tonic::Code::InvalidArgument, "the bulb is broken".into()))
    );
    assert_eq!(
        errors[2],
        Some((tonic::Code::Unknown, "boom \u{e9}".into()))
    );
    assert_eq!(errors[3].as_ref().map(|e| e.0), Some(tonic::Code::NotFound));
    assert!(
        errors[3].as_ref().unwrap().1.contains("no_such_method"),
        "{errors:?}"
    );
    assert_eq!(errors[4].as_ref().map(|e| e.0), Some(tonic::Code::NotFound));
    for e in &errors[5..7] {
        assert!(
            e.as_ref()
                .is_some_and(|(c, m)| *c == tonic::Code::Unknown && m.contains("switch()")),
            "{e:?}"
        );
    }
    assert_eq!(errors[7].as_ref().map(|e| e.0), Some(tonic::Code::Unknown));
    let size = answers[0][8].clone().map(jumpstarter_core::value::to_json);
    assert_eq!(size.unwrap().as_f64(), Some((MAX_MESSAGE - 1024) as f64));
    let big = answers[0][9].clone().map(jumpstarter_core::value::to_json);
    assert_eq!(
        big.unwrap().as_str().map(str::len),
        Some(MAX_MESSAGE - 1024)
    );
    let over = errors[10].clone().unwrap();
    assert!(over.1.contains("too large"), "{over:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_unary_calls_share_the_fast_path_and_overflow_to_grpc() {
    let Some((s, venv)) = scratch(MIXED) else {
        return;
    };
    let (_exporter, addr) = standalone(&s, &venv);
    let session = ExporterSession::connect(&addr, &insecure()).await.unwrap();
    let lamp = session.driver("bench.lamp").unwrap();
    // Many short calls at once: each gets its own answer.
    let calls = (0..48).map(|i| {
        let lamp = lamp.clone();
        async move {
            let on = i % 2 == 0;
            let r: String = lamp.call("switch", (on,)).await.unwrap();
            assert_eq!(r, format!("lamp {} at 7", if on { "on" } else { "off" }));
        }
    });
    futures::future::join_all(calls).await;
    // 16 long ones at once: they run concurrently; at most 8 (the fast path's connections)
    // on the fast path, the rest through gRPC.
    let started = std::time::Instant::now();
    let naps = (0..16).map(|_| {
        let lamp = lamp.clone();
        async move { lamp.call::<String>("nap", (3,)).await.unwrap() }
    });
    let served = futures::future::join_all(naps).await;
    let fast = served.iter().filter(|s| s.contains("FastCall")).count();
    assert!((1..=8).contains(&fast), "{served:?}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_or_orphaned_unary_call_ends_as_through_grpc() {
    let Some((s, venv)) = scratch(MIXED) else {
        return;
    };
    for (mode, envs) in MODES {
        let (exporter, addr) = standalone_with(&s, &venv, envs);
        let session = ExporterSession::connect(&addr, &insecure()).await.unwrap();
        let lamp = session.driver("bench.lamp").unwrap();
        // A client that gives up: the Python driver's call is cancelled.
        let gave_up = tokio::time::timeout(
            Duration::from_millis(1500),
            lamp.call::<serde_json::Value>("hang", ()),
        )
        .await;
        assert!(gave_up.is_err(), "{mode}: {gave_up:?}");
        let mut cancelled = 0;
        for _ in 0..100 {
            cancelled = lamp.call::<u32>("cancellations", ()).await.unwrap();
            if cancelled > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(cancelled, 1, "{mode}: the driver's call was not cancelled");

        // The child killed during a call: the call fails at once, saying so.
        let caller = lamp.clone();
        let call = tokio::spawn(async move { caller.call::<serde_json::Value>("hang", ()).await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let child = python_child(exporter.0.id());
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(child as i32).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        let err = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("the call outlived the child")
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unavailable") && err.contains("lab_drivers.Lamp"),
            "{mode}: {err}"
        );
        // And the restarted child serves the same uuid (on the fast path again).
        let mut last = String::new();
        let mut back = false;
        for _ in 0..120 {
            match lamp.call::<String>("nap", (0,)).await {
                Ok(served) => {
                    assert_eq!(served.contains("FastCall"), mode == "fast", "{served}");
                    back = true;
                    break;
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(back, "{mode}: the Python child was not restarted: {last}");
    }
}
