//! Upstream main's wording, as its own e2e suite checks it: a lease asked of an exporter
//! that does not exist "cannot be satisfied", and `jmp get exporters --with leases,status`
//! keeps both the exporter's STATUS and the lease columns.

use jumpstarter_controller::objects::ExporterStatusValue;

use crate::{
    JMP,
    distributed::{finish, lab, shell},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsatisfiable_by_name_and_the_exporter_status_columns() {
    let lab = lab().await;
    let exporter_cfg = lab.exporter("ex-word", &[("board", "word")]).await;
    let client = lab.client("worder").await;
    let _exporter = lab.run_exporter(&exporter_cfg, "ex-word.log");
    lab.wait_status("ex-word", ExporterStatusValue::Available)
        .await;

    let (code, out, err) = finish(shell(
        &lab,
        &client,
        &["--name", "test-exporter-does-not-exist"],
        "true",
    ))
    .await;
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("cannot be satisfied"), "{err}");

    let out = lab
        .cmd(JMP)
        .args([
            "create",
            "lease",
            "-l",
            "board=word",
            "--duration",
            "2m",
            "-o",
            "name",
        ])
        .arg("--client-config")
        .arg(&client)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.wait_status("ex-word", ExporterStatusValue::LeaseReady)
        .await;
    let out = lab
        .cmd(JMP)
        .args([
            "get",
            "exporters",
            "--with",
            "leases,status",
            "--client-config",
        ])
        .arg(&client)
        .output()
        .await
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = table.lines().next().unwrap_or_default();
    for col in ["NAME", "STATUS", "LABELS", "LEASED BY", "LEASE STATUS"] {
        assert!(header.contains(col), "{table}");
    }
    let row = table
        .lines()
        .find(|l| l.starts_with("ex-word"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("LEASE_READY") && row.contains("worder"),
        "{table}"
    );
}
