//! Issue 22 item 8: the real binary under `umask 000` creates its data directory, `ca/` and
//! `server/` 0700, and refuses to start on a group/other-writable one, naming it, its mode
//! and the `chmod` to run.

use std::{
    io::{BufRead, BufReader},
    os::unix::fs::PermissionsExt,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

/// Runs the controller under `umask 000` until it reports ready (then kills it) or exits;
/// returns (became ready, stderr lines).
fn run_with_umask_000(data: &Path) -> (bool, Vec<String>) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("umask 000 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_jumpstarter-controller"))
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "off", "--no-admin-config"])
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let mut ready = false;
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => {
                let is_ready = l.starts_with(jumpstarter_controller::cli::READY_LINE_PREFIX);
                lines.push(l);
                if is_ready {
                    ready = true;
                    break;
                }
            }
            // Stderr closed: the process ended.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("controller neither became ready nor exited: {lines:?}");
            }
        }
    }
    let _ = child.kill();
    let status = child.wait().unwrap();
    if !ready {
        assert!(
            !status.success(),
            "exited successfully without serving: {lines:?}"
        );
    }
    (ready, lines)
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn data_directories_are_private_whatever_the_umask() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let (ready, lines) = run_with_umask_000(&data);
    assert!(ready, "{lines:?}");
    for p in [data.clone(), data.join("ca"), data.join("server")] {
        assert_eq!(mode(&p), 0o700, "{}", p.display());
    }

    // A group/other-writable one is refused with the path, the mode and the fix.
    std::fs::set_permissions(data.join("ca"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let (ready, lines) = run_with_umask_000(&data);
    assert!(!ready, "started on a world-writable ca/: {lines:?}");
    let all = lines.join("\n");
    let ca = data.join("ca").display().to_string();
    assert!(all.contains(&ca), "{all}");
    assert!(all.contains("0777"), "{all}");
    assert!(all.contains(&format!("chmod 0700 {ca}")), "{all}");
}
