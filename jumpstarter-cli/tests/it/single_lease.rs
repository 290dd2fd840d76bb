//! Single-lease exporters (upstream main's `exitOnLeaseEnd` / `jmp run --exit-on-lease-end`):
//! `jmp run` serves one lease, runs its afterLease hook, says goodbye and exits 0; it never
//! exits before its first lease.

use std::time::Duration;

use jumpstarter_controller::objects::ExporterStatusValue;
use tokio::process::Child;

use crate::distributed::{Lab, finish, lab, shell};

/// Waits up to 30 s for the exporter to exit; its exit code.
async fn exit_code(lab: &Lab, exporter: &mut Child, log: &str) -> Option<i32> {
    let status = tokio::time::timeout(Duration::from_secs(30), exporter.wait())
        .await
        .unwrap_or_else(|_| panic!("the exporter did not exit; log:\n{}", lab.log(log)))
        .unwrap();
    status.code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_on_lease_end_in_the_config_serves_one_lease_then_exits_0_after_the_after_lease_hook()
{
    let lab = lab().await;
    let cfg = lab.exporter("once1", &[("single", "once1")]).await;
    let after = lab.path("after-lease-ran");
    let yaml = std::fs::read_to_string(&cfg).unwrap()
        + &format!(
            "exitOnLeaseEnd: true\nhooks:\n  afterLease:\n    script: |\n      sleep 1\n      \
             echo done > {}\n",
            after.display()
        );
    std::fs::write(&cfg, yaml).unwrap();
    let client = lab.client("alice").await;
    let mut exporter = lab.run_exporter(&cfg, "once1.log");
    lab.wait_status("once1", ExporterStatusValue::Available)
        .await;
    // Never before its first lease.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        exporter.try_wait().unwrap().is_none(),
        "the exporter exited before any lease; log:\n{}",
        lab.log("once1.log")
    );
    let (code, stdout, stderr) = finish(shell(
        &lab,
        &client,
        &["-l", "single=once1"],
        "j power on && echo ran",
    ))
    .await;
    assert_eq!(code, 0, "{stdout}{stderr}\n{}", lab.log("once1.log"));
    assert!(stdout.contains("ran"), "{stdout}");
    assert_eq!(
        exit_code(&lab, &mut exporter, "once1.log").await,
        Some(0),
        "{}",
        lab.log("once1.log")
    );
    // The afterLease hook ran to its end before the exporter went away.
    assert_eq!(
        std::fs::read_to_string(&after).unwrap_or_default(),
        "done\n",
        "{}",
        lab.log("once1.log")
    );
    // It said goodbye: offline, so a second client's lease is not given to it.
    lab.wait_status("once1", ExporterStatusValue::Offline).await;
    let log = lab.log("once1.log");
    assert!(log.contains("exitOnLeaseEnd"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jmp_run_exit_on_lease_end_flag_exits_0_after_the_lease() {
    let lab = lab().await;
    let cfg = lab.exporter("once2", &[("single", "once2")]).await;
    let client = lab.client("bob").await;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(lab.path("once2.log"))
        .unwrap();
    let mut exporter = lab
        .cmd(crate::JMP)
        .args(["run", "--exit-on-lease-end", "--exporter-config"])
        .arg(&cfg)
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    lab.wait_status("once2", ExporterStatusValue::Available)
        .await;
    let (code, stdout, stderr) =
        finish(shell(&lab, &client, &["-l", "single=once2"], "echo ran")).await;
    assert_eq!(code, 0, "{stdout}{stderr}\n{}", lab.log("once2.log"));
    assert_eq!(
        exit_code(&lab, &mut exporter, "once2.log").await,
        Some(0),
        "{}",
        lab.log("once2.log")
    );
    lab.wait_status("once2", ExporterStatusValue::Offline).await;
}

#[test]
fn exit_on_lease_end_is_refused_with_tls_grpc_listener() {
    let s = crate::Scratch::new();
    let out = s
        .cmd(crate::JMP)
        .args([
            "run",
            "--exit-on-lease-end",
            "--exporter-config",
            "exporter.yaml",
            "--tls-grpc-listener",
            "127.0.0.1:0",
            "--tls-grpc-insecure",
        ])
        .output()
        .unwrap();
    let (_, stderr) = crate::text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--exit-on-lease-end"), "{stderr}");
}

#[test]
fn exit_on_lease_end_in_a_local_shell_is_a_warning_not_silence() {
    let s = crate::Scratch::new();
    let cfg = s.write(
        "once.yaml",
        &format!("{}exitOnLeaseEnd: true\n", crate::MOCK_CONFIG),
    );
    let out = s
        .cmd(crate::JMP)
        .args(["shell", "--exporter-config"])
        .arg(&cfg)
        .args(["--", "j", "power", "on"])
        .output()
        .unwrap();
    let (stdout, stderr) = crate::text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("Warning: `exitOnLeaseEnd` of the exporter config applies to `jmp run`"),
        "{stderr}"
    );
}
