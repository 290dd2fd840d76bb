//! Lease sharing end to end: alice leases a board shared with bob; bob sees it in `jmp get
//! leases`, drives it with `jmp shell --lease NAME -- j ...` through the router and extends
//! it; carol is told it does not exist; bob cannot change the list; once alice takes bob off,
//! he loses it.

use std::path::Path;

use jumpstarter_controller::objects::ExporterStatusValue;

use crate::{
    JMP,
    distributed::{Lab, finish, lab, shell},
};

/// `jmp ARGS... --client-config CLIENT`: (exit code, stdout, stderr).
async fn jmp(lab: &Lab, client: &Path, args: &[&str]) -> (i32, String, String) {
    let out = lab
        .cmd(JMP)
        .args(args)
        .arg("--client-config")
        .arg(client)
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_lease_is_used_and_extended_by_the_client_it_is_shared_with() {
    let lab = lab().await;
    let exporter_cfg = lab.exporter("ex-share", &[("board", "share")]).await;
    let alice = lab.client("sh-alice").await;
    let bob = lab.client("sh-bob").await;
    let carol = lab.client("sh-carol").await;
    let _exporter = lab.run_exporter(&exporter_cfg, "ex-share.log");
    lab.wait_status("ex-share", ExporterStatusValue::Available)
        .await;

    // Bad lists are refused before anything is created.
    let (code, _, err) = jmp(
        &lab,
        &alice,
        &[
            "create",
            "lease",
            "-l",
            "board=share",
            "--duration",
            "2m",
            "--share",
            "sh-alice",
        ],
    )
    .await;
    assert_ne!(code, 0);
    assert!(err.contains("its owner"), "{err}");

    let (code, out, err) = jmp(
        &lab,
        &alice,
        &[
            "create",
            "lease",
            "-l",
            "board=share",
            "--duration",
            "2m",
            "--share",
            "sh-bob",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let lease = out.trim().to_string();
    assert!(!lease.is_empty());

    // bob sees it, with its owner and whom it is shared with.
    let (code, out, err) = jmp(&lab, &bob, &["get", "leases"]).await;
    assert_eq!(code, 0, "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with(&lease))
        .unwrap_or_else(|| panic!("bob does not see {lease}:\n{out}"));
    assert!(out.contains("SHARED WITH"), "{out}");
    assert!(row.contains("sh-alice") && row.contains("sh-bob"), "{out}");

    // bob drives the board through the router on alice's lease.
    let (code, out, err) = finish(shell(
        &lab,
        &bob,
        &["--lease", &lease],
        "j power on && echo powered",
    ))
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("powered"), "{out}{err}");

    // bob extends it.
    let (code, out, err) = jmp(
        &lab,
        &bob,
        &["update", "lease", &lease, "--duration", "5m", "-o", "json"],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["duration"], serde_json::json!(300.0), "{out}");

    // carol is told it does not exist, and cannot use it.
    let (code, _, err) = jmp(&lab, &carol, &["describe", "lease", &lease]).await;
    assert_ne!(code, 0);
    assert!(err.contains("not found"), "{err}");
    let (code, out, err) = finish(shell(&lab, &carol, &["--lease", &lease], "j power on")).await;
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("not found"), "{out}{err}");
    let (_, out, _) = jmp(&lab, &carol, &["get", "leases"]).await;
    assert!(!out.contains(&lease), "{out}");

    // Only alice changes the list.
    let (code, _, err) = jmp(&lab, &bob, &["share", "add", &lease, "sh-carol"]).await;
    assert_ne!(code, 0);
    assert!(err.contains("only the lease's owner"), "{err}");
    let (code, out, err) = jmp(&lab, &alice, &["share", "list", &lease, "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["sharedWith"], serde_json::json!(["sh-bob"]), "{out}");

    // alice takes bob off: he loses it.
    let (code, out, err) = jmp(&lab, &alice, &["share", "remove", &lease, "sh-bob"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("not shared with other clients"), "{out}");
    let (code, _, err) = jmp(&lab, &bob, &["describe", "lease", &lease]).await;
    assert_ne!(code, 0);
    assert!(err.contains("not found"), "{err}");
    let (code, out, err) = finish(shell(&lab, &bob, &["--lease", &lease], "j power on")).await;
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("not found"), "{out}{err}");

    let (code, _, err) = jmp(&lab, &alice, &["delete", "leases", &lease]).await;
    assert_eq!(code, 0, "{err}");
}
