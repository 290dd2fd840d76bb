//! The controller's log when stderr is a pipe or a file: plain text, no colour codes
//! (issue 24, item 8).

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

#[test]
fn the_log_in_a_pipe_has_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_jumpstarter-controller"))
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--admin-config")
        .arg(dir.path().join("admin.yaml"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let ready = loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) if l.starts_with(jumpstarter_controller::cli::READY_LINE_PREFIX) => break true,
            Ok(l) => lines.push(l),
            Err(_) => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(ready, "the controller did not report ready: {lines:#?}");
    // At least one tracing record was written (so the check below checks something).
    assert!(lines.iter().any(|l| l.contains(" INFO ")), "{lines:#?}");
    for l in &lines {
        assert!(!l.contains('\u{1b}'), "a colour code in {l:?}");
    }
}
