//! `j storage` interrupted midway: nothing half-written stays behind, on either side.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use crate::{J, Running, Scratch, start_exporter};

/// Files in `dir` whose name marks a partial write.
fn partials(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".partial-"))
        .collect()
}

/// Waits until `cond` holds (panics after 30 s, naming `what`).
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Pseudo-random bytes (xorshift), which no encoder shrinks.
fn random_bytes(len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// An exporter whose storage mux keeps its medium in `medium` (holding `content`), with an
/// Opendal driver `files` on the directory `files`.
fn exporter_with_medium(s: &Scratch, content: &[u8]) -> (Running, String, PathBuf) {
    let medium = s.path("medium.img");
    std::fs::write(&medium, content).unwrap();
    std::fs::create_dir(s.path("files")).unwrap();
    s.write(
        "exporter.yaml",
        &format!(
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: ExporterConfig\nmetadata:\n  \
             namespace: default\n  name: e2e\nendpoint: \"\"\ntoken: \"\"\nexport:\n  \
             storage:\n    type: jumpstarter_driver_opendal.driver.MockStorageMux\n    \
             config:\n      file: {}\n  \
             files:\n    type: jumpstarter_driver_opendal.driver.Opendal\n    config:\n      \
             scheme: fs\n      kwargs:\n        root: {}\n",
            medium.display(),
            s.path("files").display()
        ),
    );
    let (exporter, port) = start_exporter(s, &["--tls-grpc-insecure"]);
    (exporter, format!("127.0.0.1:{port}"), medium)
}

fn j(s: &Scratch, host: &str, args: &[&str]) -> Child {
    j_on(s, host, "storage", args)
}

/// `j DRIVER ARGS...` with stderr piped (not a terminal: progress comes as plain lines).
fn j_on(s: &Scratch, host: &str, driver: &str, args: &[&str]) -> Child {
    s.cmd(J)
        .env("JUMPSTARTER_HOST", host)
        .env("JMP_GRPC_INSECURE", "1")
        .arg(driver)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Makes a named pipe at `path`.
fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

/// Sends `signal` (`INT`, `TERM`) to process `pid`.
fn signal(pid: u32, signal: &str) {
    let ok = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{signal} {pid} failed");
}

fn interrupt(child: &mut Child) -> (Option<i32>, String) {
    signal(child.id(), "INT");
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    (child.wait().unwrap().code(), stderr)
}

#[test]
fn an_interrupted_dump_leaves_no_partial_file() {
    let s = Scratch::new();
    // xz on random bytes runs at a few MB/s: the dump is still going when interrupted.
    let (_exporter, host, _) = exporter_with_medium(&s, &random_bytes(32 << 20));
    let mut child = j(&s, &host, &["dump", "dump.img.xz", "--compression", "xz"]);
    wait_for("the dump's partial file", || {
        !partials(s.dir.path()).is_empty()
    });
    let (code, stderr) = interrupt(&mut child);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("Interrupted"), "{stderr}");
    assert!(
        partials(s.dir.path()).is_empty(),
        "{:?}",
        partials(s.dir.path())
    );
    assert!(!s.path("dump.img.xz").exists());
}

#[test]
fn an_interrupted_upload_leaves_the_medium_and_no_partial_file() {
    let s = Scratch::new();
    let (_exporter, host, medium) = exporter_with_medium(&s, b"previous content");
    // The image comes through a FIFO fed by the test, so the upload is midway for sure.
    let fifo = s.path("image.fifo");
    mkfifo(&fifo);
    let mut child = j(&s, &host, &["write-local-file", "image.fifo"]);
    let mut feed = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    if let Err(e) = feed.write_all(&random_bytes(4 << 20)) {
        let mut stderr = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        panic!("feeding the image: {e}; j: {:?} {stderr}", child.wait());
    }
    wait_for("the medium's partial file", || {
        !partials(s.dir.path()).is_empty()
    });
    let (code, stderr) = interrupt(&mut child);
    drop(feed);
    assert_eq!(code, Some(130), "{stderr}");
    // The exporter notices its client is gone and removes what it had written.
    wait_for("the partial medium to be removed", || {
        partials(s.dir.path()).is_empty()
    });
    assert_eq!(std::fs::read(&medium).unwrap(), b"previous content");
}

#[test]
fn an_exporter_stopping_mid_upload_stops_soon_and_keeps_the_medium() {
    let s = Scratch::new();
    let (mut exporter, host, medium) = exporter_with_medium(&s, b"previous content");
    let fifo = s.path("image.fifo");
    mkfifo(&fifo);
    let mut child = j(&s, &host, &["write-local-file", "image.fifo"]);
    // The upload stalls: its source stays open with nothing more to read.
    let mut feed = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    feed.write_all(&random_bytes(1 << 20)).unwrap();
    wait_for("the medium's partial file", || {
        !partials(s.dir.path()).is_empty()
    });
    signal(exporter.0.id(), "TERM");
    // The stalled call is cut after the grace period instead of holding the exporter.
    let mut status = None;
    wait_for("the exporter to exit", || {
        status = exporter.0.try_wait().unwrap();
        status.is_some()
    });
    assert_eq!(status.and_then(|s| s.code()), Some(0));
    assert!(
        partials(s.dir.path()).is_empty(),
        "{:?}",
        partials(s.dir.path())
    );
    assert_eq!(std::fs::read(&medium).unwrap(), b"previous content");
    drop(feed);
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!child.wait().unwrap().success(), "{stderr}");
}

#[test]
fn downloads_show_their_total_when_the_exporter_knows_it() {
    let s = Scratch::new();
    let image = random_bytes(3 << 20);
    let (_exporter, host, _) = exporter_with_medium(&s, &image);
    std::fs::write(s.path("files/a.bin"), &image[..1 << 20]).unwrap();
    let last_line = |child: Child| {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr.lines().last().unwrap_or_default().to_string()
    };

    // The mux tells the medium's size (`size`, ours), Opendal the file's (`stat`).
    let line = last_line(j(&s, &host, &["dump", "dump.img"]));
    assert!(line.starts_with("dump: 3.0 MiB / 3.0 MiB (100%)"), "{line}");
    let line = last_line(j(&s, &host, &["read-local-file", "read.img"]));
    assert!(line.starts_with("read: 3.0 MiB / 3.0 MiB (100%)"), "{line}");
    let line = last_line(j_on(
        &s,
        &host,
        "files",
        &["read-into-path", "a.bin", "a.bin"],
    ));
    assert!(line.starts_with("read: 1.0 MiB / 1.0 MiB (100%)"), "{line}");
    assert_eq!(std::fs::read(s.path("dump.img")).unwrap(), image);
    assert_eq!(std::fs::read(s.path("a.bin")).unwrap(), &image[..1 << 20]);

    // A compressed dump arrives smaller than the medium: no total rather than a wrong one.
    let line = last_line(j(
        &s,
        &host,
        &["dump", "dump.img.gz", "--compression", "gzip"],
    ));
    assert!(line.starts_with("dump: ") && !line.contains('%'), "{line}");
}
