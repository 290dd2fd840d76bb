//! Exporter labels as `jmp get` shows them (upstream main): hidden labels, deprecated labels
//! and paging.

use std::path::Path;

use jumpstarter_controller::objects::{ExporterStatusValue, LabelPolicy};

use crate::{
    JMP,
    distributed::{Lab, finish, lab, lab_with, shell},
};

/// Runs `jmp ARGS --client-config CLIENT`: (exit code, stdout, stderr).
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
async fn hidden_labels_are_left_out_of_every_output_format_unless_show_hidden() {
    let lab = lab_with(|c| {
        c.label_policy = LabelPolicy {
            hidden: ["internal.example.com/rack".to_string()].into(),
            ..LabelPolicy::default()
        }
    })
    .await;
    lab.exporter(
        "h1",
        &[
            ("board", "rpi4"),
            ("hidden.jumpstarter.dev/owner", "ci-pool"),
            ("internal.example.com/rack", "r7"),
        ],
    )
    .await;
    let client = lab.client("alice").await;
    for format in [&[][..], &["-o", "wide"], &["-o", "json"], &["-o", "yaml"]] {
        let args = [&["get", "exporters"][..], format].concat();
        let (code, stdout, stderr) = jmp(&lab, &client, &args).await;
        assert_eq!(code, 0, "{args:?}: {stderr}");
        assert!(stdout.contains("rpi4"), "{args:?}: {stdout}");
        assert!(!stdout.contains("ci-pool"), "{args:?}: {stdout}");
        assert!(
            !stdout.contains("hidden.jumpstarter.dev"),
            "{args:?}: {stdout}"
        );
        assert!(!stdout.contains("r7"), "{args:?}: {stdout}");
        for flag in ["--show-hidden", "--show-hidden-labels"] {
            let args = [&args[..], &[flag]].concat();
            let (code, stdout, stderr) = jmp(&lab, &client, &args).await;
            assert_eq!(code, 0, "{args:?}: {stderr}");
            assert!(
                stdout.contains("hidden.jumpstarter.dev/owner") && stdout.contains("ci-pool"),
                "{args:?}: {stdout}"
            );
            assert!(stdout.contains("r7"), "{args:?}: {stdout}");
        }
    }
    // Hidden from view, not from selectors.
    let (code, stdout, stderr) = jmp(
        &lab,
        &client,
        &[
            "get",
            "exporters",
            "-l",
            "hidden.jumpstarter.dev/owner=ci-pool",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), "h1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deprecated_labels_warn_on_stderr_when_listing_exporters_creating_or_listing_leases_and_in_jmp_shell()
 {
    let lab = lab_with(|c| {
        c.label_policy = LabelPolicy {
            deprecated: [("old-board".to_string(), "use board instead".to_string())].into(),
            ..LabelPolicy::default()
        }
    })
    .await;
    lab.exporter("d1", &[("board", "rpi4"), ("old-board", "rpi4")])
        .await;
    let client = lab.client("alice").await;
    let (code, stdout, stderr) = jmp(&lab, &client, &["get", "exporters", "-o", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(
            "Warning: label 'old-board' on exporter 'd1' is deprecated: use board instead"
        ),
        "{stderr}"
    );
    // On stderr only: stdout stays parseable.
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(v["exporters"].is_array(), "{v}");

    let (code, stdout, stderr) = jmp(
        &lab,
        &client,
        &[
            "create",
            "lease",
            "-l",
            "old-board=rpi4",
            "--duration",
            "1h",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let lease = stdout.trim().to_string();
    assert!(!lease.is_empty() && !lease.contains("Warning"), "{stdout}");
    assert!(
        stderr.contains("Warning: selector label 'old-board' is deprecated: use board instead"),
        "{stderr}"
    );
    let (code, stdout, stderr) = jmp(&lab, &client, &["get", "leases"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains(&lease), "{stdout}");
    assert!(
        stderr.contains(&format!(
            "Warning: selector label 'old-board' on lease '{lease}' is deprecated: use board instead"
        )),
        "{stderr}"
    );
    // jmp shell warns too, on stderr, and runs the command.
    let cfg = lab.exporter("d2", &[("old-board", "pi5")]).await;
    let _exporter = lab.run_exporter(&cfg, "d2.log");
    lab.wait_status("d2", ExporterStatusValue::Available).await;
    let (code, stdout, stderr) =
        finish(shell(&lab, &client, &["-l", "old-board=pi5"], "echo ran")).await;
    assert_eq!(code, 0, "{stdout}{stderr}\n{}", lab.log("d2.log"));
    assert_eq!(stdout, "ran\n");
    assert!(
        stderr.contains("Warning: selector label 'old-board' is deprecated: use board instead"),
        "{stderr}"
    );
    // A lease by a label that is not deprecated: no warning.
    let (code, _, stderr) = jmp(
        &lab,
        &client,
        &["create", "lease", "-l", "board=rpi4", "--duration", "1h"],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("Warning"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_size_pages_through_every_exporter_and_lease() {
    let lab = lab().await;
    let names: Vec<String> = (1..=5).map(|i| format!("p{i}")).collect();
    for n in &names {
        lab.exporter(n, &[("pool", "paging")]).await;
    }
    let client = lab.client("alice").await;
    for size in ["1", "2", "100"] {
        let (code, stdout, stderr) = jmp(
            &lab,
            &client,
            &["get", "exporters", "--page-size", size, "-o", "name"],
        )
        .await;
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(
            stdout.lines().collect::<Vec<_>>(),
            names,
            "--page-size {size}"
        );
    }
    let mut leases = Vec::new();
    for _ in 0..3 {
        let (code, stdout, stderr) = jmp(
            &lab,
            &client,
            &[
                "create",
                "lease",
                "-l",
                "pool=paging",
                "--duration",
                "1h",
                "-o",
                "name",
            ],
        )
        .await;
        assert_eq!(code, 0, "{stderr}");
        leases.push(stdout.trim().to_string());
    }
    leases.sort();
    for size in ["1", "2"] {
        let (code, stdout, stderr) = jmp(
            &lab,
            &client,
            &["get", "leases", "--page-size", size, "-o", "name"],
        )
        .await;
        assert_eq!(code, 0, "{stderr}");
        let mut got: Vec<String> = stdout.lines().map(str::to_string).collect();
        got.sort();
        assert_eq!(got, leases, "--page-size {size}");
    }
    for cmd in ["exporters", "leases"] {
        let (code, _, stderr) = jmp(&lab, &client, &["get", cmd, "--page-size", "0"]).await;
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("--page-size"), "{stderr}");
    }
}

/// `jmp get exporters --with online,status,leases -o json` of exporter `name`.
async fn listed(lab: &Lab, client: &Path, name: &str) -> serde_json::Value {
    let (code, stdout, stderr) = jmp(
        lab,
        client,
        &[
            "get",
            "exporters",
            "--with",
            "online,status,leases",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    v["exporters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not listed: {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporters_are_listed_with_their_online_and_leased_state() {
    let lab = lab().await;
    let cfg = lab.exporter("av1", &[("board", "av1")]).await;
    let client = lab.client("alice").await;
    // Never connected: offline, as upstream main shows an exporter with no status yet.
    let e = listed(&lab, &client, "av1").await;
    assert_eq!(
        (e["online"].clone(), e["status"].clone()),
        (false.into(), "OFFLINE".into()),
        "{e}"
    );
    let mut exporter = lab.run_exporter(&cfg, "av1.log");
    lab.wait_status("av1", ExporterStatusValue::Available).await;
    let e = listed(&lab, &client, "av1").await;
    assert_eq!(
        (e["online"].clone(), e["status"].clone()),
        (true.into(), "AVAILABLE".into()),
        "{e}"
    );
    assert!(e["lease"].is_null(), "{e}");
    // Leased: LEASE_READY, with the caller's lease.
    let (code, stdout, stderr) = jmp(
        &lab,
        &client,
        &[
            "create",
            "lease",
            "-l",
            "board=av1",
            "--duration",
            "1h",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let lease = stdout.trim().to_string();
    lab.wait_status("av1", ExporterStatusValue::LeaseReady)
        .await;
    let e = listed(&lab, &client, "av1").await;
    assert_eq!(
        (e["online"].clone(), e["status"].clone()),
        (true.into(), "LEASE_READY".into()),
        "{e}"
    );
    assert_eq!(e["lease"]["name"], lease.as_str(), "{e}");
    // Stopped (it says goodbye): offline again.
    let pid = exporter.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), exporter.wait()).await;
    lab.wait_status("av1", ExporterStatusValue::Offline).await;
    let e = listed(&lab, &client, "av1").await;
    assert_eq!(
        (e["online"].clone(), e["status"].clone()),
        (false.into(), "OFFLINE".into()),
        "{e}"
    );
}
