//! Log gathering through the controller with the real binaries: `jmp get lease NAME --logs`
//! (the story of one lease is checked in `json_logs`); with gathering off the exporter
//! still serves its driver calls and the read says why there is nothing.

use std::{process::Command, time::Duration};

use serde_json::Value;

use crate::{JMP, Scratch, json_logs::Logged, text};

/// `jmp get lease LEASE --logs -o json` (with `args`), once an entry with message `until`
/// is there (the exporter pushes in the background): one object a line. Bounded: 120 tries.
pub(crate) fn story(s: &Scratch, lease: &str, args: &[&str], until: &str) -> Vec<Value> {
    let mut last = String::new();
    for _ in 0..120 {
        let out = s
            .cmd(JMP)
            .args(["get", "lease", lease, "--logs", "-o", "json"])
            .args(args)
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stderr}");
        let objects: Vec<Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect();
        if objects.iter().any(|o| o["message"] == until) {
            return objects;
        }
        last = stdout;
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("no {until:?} in the log of {lease}; last:\n{last}");
}

#[test]
fn with_log_gathering_off_the_exporter_still_serves_and_the_read_says_why() {
    let s = Scratch::new();
    let bin = crate::doc_examples::controller_dir().join("jumpstarter-controller");
    let admin = s.path("admin.yaml");
    let mut ctl = Command::new(bin);
    ctl.current_dir(s.dir.path())
        .arg("--data-dir")
        .arg(s.path("data"))
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args([
            "--metrics-listen",
            "off",
            "--lease-logs",
            "off",
            "--admin-config",
        ])
        .arg(&admin)
        .env("JMP_LOG_FORMAT", "json")
        .env_remove("RUST_LOG");
    let mut ctl = Logged::start(ctl);
    ctl.wait_for("saying it is ready", |l| {
        l.contains("jumpstarter-controller ready")
    });
    let exporter = s.mock_board_and_client(&admin, "kind=off");
    let mut run = s.cmd(JMP);
    run.args(["run", "--exporter-config"])
        .arg(&exporter)
        .env_remove("RUST_LOG")
        .env_remove("JMP_LOG");
    let mut run = Logged::start(run);
    run.wait_for("saying it registered", |l| {
        l.contains("registered with controller")
    });

    let out = s
        .cmd(JMP)
        .args(["shell", "--client", "ci", "-l", "kind=off", "--"])
        .args(["j", "power", "on"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    let created = ctl.wait_for("saying the lease was created", |l| {
        l.contains("\"lease created\"")
    });
    let created: Value = serde_json::from_str(&created).unwrap();
    let lease = created["lease_id"].as_str().unwrap().to_string();
    // The exporter was told of no sink: it pushes nothing and says nothing about it.
    assert!(
        !run.seen_any(|l| l.contains("pushing the leases' logs")),
        "the exporter found a sink with gathering off"
    );
    let out = s
        .cmd(JMP)
        .args(["get", "lease", &lease, "--logs", "--client", "ci"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out).1;
    assert!(err.contains("--lease-logs off"), "{err}");
}
