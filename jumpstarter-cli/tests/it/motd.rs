//! The exporter's message of the day (upstream main's `motd`): set in the exporter config,
//! added to by a beforeLease hook through `$JMP_MOTD_FILE`, returned in `GetReport` and
//! printed by `jmp shell` before an interactive shell, never before `-- CMD`.

use std::{io::Write, process::Stdio};

use jumpstarter_controller::objects::ExporterStatusValue;
use tokio::io::AsyncWriteExt;

use crate::{
    JMP, Scratch,
    distributed::{finish, lab, shell},
    text,
};

const MOTD_CONFIG: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: motd
endpoint: \"\"
token: \"\"
motd: |
  Welcome to the rig.
  Please power it off when done.
export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
";

#[test]
fn a_local_interactive_shell_prints_the_configs_motd_and_a_command_does_not() {
    let s = Scratch::new();
    let cfg = s.write("motd.yaml", MOTD_CONFIG);
    let mut child = s
        .cmd(JMP)
        .args(["shell", "--exporter-config"])
        .arg(&cfg)
        .env("SHELL", "/bin/bash")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"echo inside\nexit\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("Welcome to the rig.\nPlease power it off when done.\n"),
        "{stdout}"
    );
    assert!(stdout.ends_with("inside\n"), "{stdout}");

    let out = s
        .cmd(JMP)
        .args(["shell", "--exporter-config"])
        .arg(&cfg)
        .args(["--", "sh", "-c", "echo cmd"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, "cmd\n");
    assert!(!stderr.contains("Welcome"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_before_lease_hook_appends_to_the_motd_through_jmp_motd_file() {
    let lab = lab().await;
    let cfg = lab.exporter("m1", &[("motd", "m1")]).await;
    let after = lab.path("after-env");
    let yaml = std::fs::read_to_string(&cfg).unwrap()
        + &format!(
            "motd: Board m1 (rpi4)\nhooks:\n  beforeLease:\n    script: |\n      \
             echo \"flashed build 42\" > \"$JMP_MOTD_FILE\"\n  afterLease:\n    script: |\n      \
             echo \"after:${{JMP_MOTD_FILE:-unset}}\" > {}\n",
            after.display()
        );
    std::fs::write(&cfg, yaml).unwrap();
    let client = lab.client("alice").await;
    let _exporter = lab.run_exporter(&cfg, "m1.log");
    lab.wait_status("m1", ExporterStatusValue::Available).await;

    let mut child = lab
        .cmd(JMP)
        .args(["shell", "--client-config"])
        .arg(&client)
        .args(["-l", "motd=m1"])
        .env("SHELL", "/bin/bash")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"echo inside\nexit\n").await.unwrap();
    drop(stdin);
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 0, "{stdout}{stderr}\n{}", lab.log("m1.log"));
    assert!(
        stdout.starts_with("Board m1 (rpi4)\nflashed build 42\n"),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.ends_with("inside\n"), "{stdout}");
    // `$JMP_MOTD_FILE` is the beforeLease hook's only.
    assert_eq!(
        std::fs::read_to_string(&after).unwrap_or_default(),
        "after:unset\n",
        "{}",
        lab.log("m1.log")
    );

    lab.wait_status("m1", ExporterStatusValue::Available).await;
    let (code, stdout, stderr) = finish(shell(&lab, &client, &["-l", "motd=m1"], "echo cmd")).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(stdout, "cmd\n", "{stderr}");
}
