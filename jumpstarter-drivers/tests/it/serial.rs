//! Serial consoles end to end: a pseudo-terminal "board" behind a served PySerial.

use std::{path::Path, sync::Arc, time::Duration};

use jumpstarter_drivers::{Pty, PySerial, PySerialClient, SerialUrl};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Served;

const T: Duration = Duration::from_secs(10);

/// A simulated board on the controlling side of `pty`: a login prompt, then a shell that
/// answers `echo WORDS` and `uname`. Runs until the pty is dropped (the task owns it).
fn board(pty: Pty) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // The whole pty moves in (its device side held open with it), not just the field.
        let mut pty = pty;
        let io = &mut pty.controller;
        let mut logged_in = false;
        let mut line = Vec::new();
        let mut buf = [0u8; 256];
        loop {
            let Ok(n) = io.read(&mut buf).await else {
                return;
            };
            if n == 0 {
                return;
            }
            for &b in &buf[..n] {
                if b != b'\n' && b != b'\r' {
                    line.push(b);
                    continue;
                }
                let cmd = String::from_utf8_lossy(&line).into_owned();
                line.clear();
                let reply = if !logged_in {
                    if cmd == "root" {
                        logged_in = true;
                        "\r\nWelcome to the board\r\nroot@board:~# ".to_string()
                    } else {
                        "\r\nboard login: ".to_string()
                    }
                } else if let Some(words) = cmd.strip_prefix("echo ") {
                    format!("{words}\r\nroot@board:~# ")
                } else if cmd == "uname" {
                    "Linux\r\nroot@board:~# ".to_string()
                } else if cmd == "exit" {
                    logged_in = false;
                    "\r\nboard login: ".to_string()
                } else {
                    format!("{cmd}: command not found\r\nroot@board:~# ")
                };
                if io.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
}

/// Points the stable device name `link` at a new pty (as udev's /dev/serial/by-id does).
fn plug(link: &Path) -> (Pty, std::path::PathBuf) {
    let pty = Pty::open().unwrap();
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(&pty.device_path, link).unwrap();
    let path = pty.device_path.clone();
    (pty, path)
}

async fn serial_client(served: &Served) -> PySerialClient {
    PySerialClient(served.client().await.driver("serial").unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_logs_into_a_pty_board() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("ttyBOARD");
    let (pty, _) = plug(&link);
    let _board = board(pty);
    let served = Served::start(vec![(
        "serial",
        Arc::new(PySerial::new(SerialUrl::Device(link.clone()))),
    )]);
    let serial = serial_client(&served).await;
    let log = dir.path().join("console.log");
    let mut c = serial.console().await.unwrap().with_timeout(T);
    c.log_to(&log).unwrap();
    c.send_line("").await.unwrap();
    c.expect("login: ").await.unwrap();
    c.send_line("root").await.unwrap();
    let m = c.expect(r"root@board:~# ").await.unwrap();
    assert!(m.before_text().contains("Welcome"), "{}", m.before_text());
    c.send_line("echo hello board").await.unwrap();
    let m = c.expect(r"(?m)^(.*)\r\nroot@board").await.unwrap();
    assert_eq!(m.groups[1].as_deref(), Some(&b"hello board"[..]));
    c.send_line("uname").await.unwrap();
    c.expect("Linux").await.unwrap();
    drop(c);
    let transcript = std::fs::read_to_string(&log).unwrap();
    assert!(
        transcript.contains("echo hello board\n") && transcript.contains("Welcome"),
        "{transcript}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unplugged_device_ends_the_stream_with_an_error_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("ttyUSB-board");
    let (pty, _) = plug(&link);
    let board1 = board(pty);
    let served = Served::start(vec![(
        "serial",
        Arc::new(PySerial::new(SerialUrl::Device(link.clone()))),
    )]);
    let serial = serial_client(&served).await;
    let mut c = serial.console().await.unwrap().with_timeout(T);
    c.send_line("").await.unwrap();
    c.expect("login: ").await.unwrap();

    // Unplug: the board's end of the pty goes away.
    board1.abort();
    let _ = board1.await;
    let mut s = c.into_inner();
    let mut buf = [0u8; 64];
    let err = tokio::time::timeout(T, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => panic!("the stream ended as if nothing happened"),
                Ok(_) => continue,
                Err(e) => return e,
            }
        }
    })
    .await
    .unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains("disconnected") && msg.contains("ttyUSB-board"),
        "{msg}"
    );

    // While it is away, connect fails naming the device; the exporter stays up.
    std::fs::remove_file(&link).unwrap();
    let e = serial.connect().await.err().unwrap().to_string();
    assert!(e.contains("ttyUSB-board"), "{e}");

    // Plugged back in (a new pty under the same name): the next connect works.
    // (The kernel may hand out the same /dev/pts number again: the old one was released.)
    let (pty, _) = plug(&link);
    let _board2 = board(pty);
    let mut c = serial.console().await.unwrap().with_timeout(T);
    c.send_line("root").await.unwrap();
    c.expect("root@board:~# ").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_open_streams_and_loop_echoes() {
    let served = Served::start(vec![("serial", Arc::new(PySerial::new(SerialUrl::Loop)))]);
    let serial = serial_client(&served).await;
    let mut s = serial.connect().await.unwrap();
    s.write_all(b"loopback").await.unwrap();
    let mut buf = [0u8; 8];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"loopback");
    serial.set_dtr(true).await.unwrap();
    serial.set_rts(false).await.unwrap();
    serial.close().await.unwrap();
    let n = tokio::time::timeout(T, s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0, "close() ends the stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_urls_reach_a_console_server() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = c.write_all(b"console-server> ").await;
                let (mut r, mut w) = c.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let served = Served::start(vec![(
        "serial",
        Arc::new(PySerial::new(SerialUrl::Socket {
            host: "127.0.0.1".into(),
            port,
        })),
    )]);
    let serial = serial_client(&served).await;
    let mut c = serial.console().await.unwrap().with_timeout(T);
    c.expect("console-server> ").await.unwrap();
    c.send_line("hi").await.unwrap();
    c.expect("hi\n").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_device_without_check_present_fails_connect_clearly() {
    let args = jumpstarter_core::driver::DriverArgs {
        config: serde_json::json!({"url": "/dev/ttyNOPE9", "check_present": false}),
    };
    let driver = PySerial::from_args(&args).unwrap();
    let served = Served::start(vec![("serial", driver)]);
    let serial = serial_client(&served).await;
    let e = serial.connect().await.err().unwrap().to_string();
    assert!(e.contains("cannot open serial device /dev/ttyNOPE9"), "{e}");
    // With check_present (the default), the driver is refused at construction.
    let args = jumpstarter_core::driver::DriverArgs {
        config: serde_json::json!({"url": "/dev/ttyNOPE9"}),
    };
    let e = PySerial::from_args(&args).err().unwrap().to_string();
    assert!(e.contains("url") && e.contains("/dev/ttyNOPE9"), "{e}");
}

/// An upstream exporter config with consoles and networks builds unchanged; a missing
/// device with `check_present` (the default) fails the build naming the field and path.
#[tokio::test]
async fn upstream_configs_build_and_a_missing_device_fails_at_start() {
    let pty = Pty::open().unwrap();
    let yaml = format!(
        "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: lab
endpoint: \"\"
token: \"\"
export:
  serial:
    type: jumpstarter_driver_pyserial.driver.PySerial
    config:
      url: {}
      baudrate: 9600
      cps: 50
  ssh:
    type: jumpstarter_driver_network.driver.TcpNetwork
    config:
      host: localhost
      port: 22
  dns:
    type: jumpstarter_driver_network.driver.UdpNetwork
    config: {{host: 127.0.0.1, port: 53, enable_address: false}}
  qmp:
    type: jumpstarter_driver_network.driver.UnixNetwork
    config: {{path: /run/qmp.sock}}
  echo:
    type: jumpstarter_driver_network.driver.EchoNetwork
  loop:
    type: jumpstarter_driver_pyserial.driver.PySerial
    config: {{url: \"loop://\"}}
",
        pty.device_path.display()
    );
    let path = Path::new("exporter.yaml");
    let registry = jumpstarter_drivers::stock_registry();
    let cfg = jumpstarter_core::config::ExporterConfig::parse(&yaml, path).unwrap();
    let tree = registry.build(&cfg).unwrap();
    let classes: Vec<String> = tree
        .children
        .iter()
        .map(|(_, n)| n.driver.client_class())
        .collect();
    assert_eq!(classes.len(), 6, "{classes:?}");
    assert!(
        classes
            .iter()
            .all(|c| c.ends_with("PySerialClient") || c.ends_with("NetworkClient"))
    );

    let missing = yaml.replace(
        &pty.device_path.display().to_string(),
        "/dev/ttyUSB-not-plugged",
    );
    let cfg = jumpstarter_core::config::ExporterConfig::parse(&missing, path).unwrap();
    let e = registry.build(&cfg).err().unwrap().to_string();
    assert!(
        e.contains("export.serial") && e.contains("url") && e.contains("/dev/ttyUSB-not-plugged"),
        "{e}"
    );
}
