//! `j` console and network commands against `jmp run`: start-console on a real terminal
//! (a pty), forward-tcp, open-stream.

use std::{
    io::{BufRead, BufReader, Read, Write},
    process::Stdio,
    time::{Duration, Instant},
};

use jumpstarter_drivers::Pty;
use rustix::termios::LocalModes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{J, Running, Scratch, start_exporter, text};

const CONSOLE_CONFIG: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: consoles
endpoint: \"\"
token: \"\"
export:
  serial:
    type: jumpstarter_driver_pyserial.driver.PySerial
    config:
      url: \"loop://\"
  echo:
    type: jumpstarter_driver_network.driver.EchoNetwork
";

fn console_exporter() -> (Scratch, Running, String) {
    let s = Scratch::new();
    s.write("exporter.yaml", CONSOLE_CONFIG);
    let (exporter, port) = start_exporter(&s, &["--tls-grpc-insecure"]);
    (s, exporter, format!("127.0.0.1:{port}"))
}

/// Waits (bounded) for `child` to exit; kills it and fails if it does not.
fn wait_exit(child: &mut std::process::Child, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_console_is_raw_leaves_on_three_ctrl_b_and_restores_the_terminal() {
    let (s, _exporter, addr) = console_exporter();
    let mut pty = Pty::open().unwrap();
    let term = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&pty.device_path)
            .unwrap()
    };
    let before = rustix::termios::tcgetattr(term()).unwrap();
    assert!(
        before
            .local_modes
            .contains(LocalModes::ICANON | LocalModes::ECHO)
    );
    let mut child = s
        .cmd(J)
        .env("JUMPSTARTER_HOST", &addr)
        .env("JMP_GRPC_INSECURE", "1")
        .args(["serial", "start-console"])
        .stdin(term())
        .stdout(term())
        .stderr(term())
        .spawn()
        .unwrap();
    // Raw mode: no canonical input, no echo (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = rustix::termios::tcgetattr(term()).unwrap();
        if !now.local_modes.contains(LocalModes::ICANON) {
            assert!(!now.local_modes.contains(LocalModes::ECHO));
            break;
        }
        assert!(Instant::now() < deadline, "the terminal never went raw");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // What is typed goes to the console (loop://) and comes back once, unechoed.
    pty.controller.write_all(b"typed\x02x").await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    tokio::time::timeout(Duration::from_secs(20), async {
        while !String::from_utf8_lossy(&seen).contains("typed\x02x") {
            let n = pty.controller.read(&mut buf).await.unwrap();
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("console output: {:?}", String::from_utf8_lossy(&seen)));
    assert!(
        String::from_utf8_lossy(&seen).contains("exit with CTRL+B x 3 times"),
        "{:?}",
        String::from_utf8_lossy(&seen)
    );
    // Ctrl-B three times in a row leaves, and the terminal is as it was.
    pty.controller.write_all(b"\x02\x02\x02").await.unwrap();
    let status = tokio::task::spawn_blocking(move || {
        let st = wait_exit(&mut child, "j serial start-console");
        drop(child);
        st
    })
    .await
    .unwrap();
    assert!(status.success(), "{status}");
    let after = rustix::termios::tcgetattr(term()).unwrap();
    assert_eq!(after.local_modes, before.local_modes);
    assert_eq!(after.input_modes, before.input_modes);
    assert_eq!(after.output_modes, before.output_modes);
}

#[test]
fn start_console_without_a_terminal_says_to_use_pipe() {
    let (s, _exporter, addr) = console_exporter();
    let out = s
        .cmd(J)
        .env("JUMPSTARTER_HOST", &addr)
        .env("JMP_GRPC_INSECURE", "1")
        .args(["serial", "start-console"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("needs a terminal") && stderr.contains("pipe"),
        "{stderr}"
    );
}

#[test]
fn forward_tcp_prints_its_address_and_relays() {
    let (s, _exporter, addr) = console_exporter();
    let mut child = Running(
        s.cmd(J)
            .env("JUMPSTARTER_HOST", &addr)
            .env("JMP_GRPC_INSECURE", "1")
            .args(["echo", "forward-tcp", "--address", "127.0.0.1", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let local = line.trim();
    assert!(local.starts_with("127.0.0.1:"), "{line:?}");
    let mut c = std::net::TcpStream::connect(local).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.write_all(b"round trip").unwrap();
    let mut got = [0u8; 10];
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"round trip");
}

#[test]
fn open_stream_pipes_stdin_through_any_stream_method() {
    let (s, _exporter, addr) = console_exporter();
    let mut child = s
        .cmd(J)
        .env("JUMPSTARTER_HOST", &addr)
        .env("JMP_GRPC_INSECURE", "1")
        .args(["echo", "open-stream", "connect"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"through open-stream")
        .unwrap();
    // stdin's end ends the echo stream's input, then its output: j exits by itself.
    let status = wait_exit(&mut child, "j echo open-stream");
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(stdout, "through open-stream");
}

#[test]
fn forward_tcp_refuses_a_bad_port() {
    let (s, _exporter, addr) = console_exporter();
    let out = s
        .cmd(J)
        .env("JUMPSTARTER_HOST", &addr)
        .env("JMP_GRPC_INSECURE", "1")
        .args(["echo", "forward-tcp", "70000"])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("invalid port"), "{stderr}");
}
