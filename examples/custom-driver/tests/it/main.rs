//! End to end: the example's own `my-jmp` and `my-j` (each a `main` of a few lines) serve
//! and drive its `Chamber` driver locally and through a controller and its router.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod lab;

use std::process::Stdio;

use jumpstarter_controller::objects::ExporterStatusValue;

use lab::{Lab, finish};

const MY_JMP: &str = env!("CARGO_BIN_EXE_my-jmp");
const MY_J: &str = env!("CARGO_BIN_EXE_my-j");

/// The chamber with every config field set, beside a stock MockPower.
const EXPORT: &str = "export:
  chamber:
    type: jumpstarter_example_chamber.driver.Chamber
    config:
      label: lab-chamber
      sensors: 3
      setpoint: 20
      min: -10
      max: 60
  power:
    type: jumpstarter_driver_power.driver.MockPower
";

/// Every method of the chamber through `my-j`: unary (target, info), streaming (read),
/// the byte stream (ask, and the generic `open-stream console`), and a stock driver.
const CALL_EVERYTHING: &str = "set -e
my-j chamber target
my-j chamber target 42.5
my-j chamber target
my-j chamber info
my-j chamber read -n 2
my-j chamber ask 'TARGET?'
my-j chamber ask 'TARGET -5'
printf 'TARGET?\\nPREHEAT\\n' | my-j chamber open-stream console
my-j power on
";

/// What [`CALL_EVERYTHING`] prints on stdout.
const EVERYTHING_OUTPUT: &str = "20.0
42.5
{\"label\":\"lab-chamber\",\"sensors\":3,\"min\":-10.0,\"max\":60.0}
sensor=0 celsius=42.5
sensor=1 celsius=43.5
sensor=2 celsius=44.5
sensor=0 celsius=42.5
sensor=1 celsius=43.5
sensor=2 celsius=44.5
TARGET 42.5
OK 42.5
TARGET -5
ERR unknown command: \"PREHEAT\"
";

/// Bad input through `my-j`: each fails naming what is wrong, and changes nothing.
const BAD_INPUT: &str = "
my-j chamber target -5 2>/dev/null || exit 9
my-j chamber target 61 && exit 10
my-j chamber read -n 0 && exit 11
my-j chamber target hot && exit 12
my-j chamber target
";

fn assert_bad_input(code: i32, stdout: &str, stderr: &str) {
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stderr.contains("target 61 °C is outside -10 .. 60 °C"),
        "{stderr}"
    );
    assert!(stderr.contains("count: 0 is not between 1 and"), "{stderr}");
    assert!(stderr.contains("invalid value 'hot'"), "{stderr}");
    assert_eq!(stdout, "-5.0\n", "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn my_jmp_serves_the_chamber_through_the_controller_and_my_j_calls_every_method() {
    let lab = Lab::start().await;
    let exporter_cfg = lab.exporter("chamber-ex", "chamber", EXPORT).await;
    let client = lab.client("lab-user").await;
    let _exporter = lab.run(
        MY_JMP,
        &["run", "--exporter-config", &exporter_cfg.to_string_lossy()],
        "chamber-ex.log",
    );
    lab.wait_status(
        "chamber-ex",
        ExporterStatusValue::Available,
        "chamber-ex.log",
    )
    .await;

    let shell = |script: &str| {
        lab.cmd(MY_JMP)
            .arg("shell")
            .arg("--client-config")
            .arg(&client)
            .args(["-l", "board=chamber", "--", "sh", "-c", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (code, stdout, stderr) = finish(shell(CALL_EVERYTHING)).await;
    assert_eq!(
        code,
        0,
        "{stdout}{stderr}\nexporter log:\n{}",
        lab.log("chamber-ex.log")
    );
    assert_eq!(stdout, EVERYTHING_OUTPUT, "{stderr}");
    assert!(stderr.contains("Target 20 -> 42.5 °C"), "{stderr}");
    assert!(stderr.contains("Powered on"), "{stderr}");
    // The driver's log records reached the exporter's log.
    let log = lab.log("chamber-ex.log");
    assert!(log.contains("target 20 -> 42.5 °C"), "{log}");

    // A new lease: bad input fails naming what is wrong and changes nothing.
    let (code, stdout, stderr) = finish(shell(BAD_INPUT)).await;
    assert_bad_input(code, &stdout, &stderr);
    lab.wait_status(
        "chamber-ex",
        ExporterStatusValue::Available,
        "chamber-ex.log",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn my_jmp_serves_the_chamber_locally_lists_it_and_refuses_a_bad_config() {
    let lab = Lab::bare();
    let cfg = lab.write(
        "local.yaml",
        &format!(
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: ExporterConfig\nmetadata:\n  \
             namespace: default\n  name: local\nendpoint: \"\"\ntoken: \"\"\n{EXPORT}"
        ),
    );
    let cfg_s = cfg.to_string_lossy().into_owned();

    let (code, stdout, stderr) = finish(
        lab.cmd(MY_JMP)
            .args(["driver", "list"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout
            .lines()
            .any(|l| l == "jumpstarter_example_chamber.driver.Chamber"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l == "jumpstarter_driver_power.driver.MockPower"),
        "{stdout}"
    );

    let local_shell = |cfg: &str, script: &str| {
        lab.cmd(MY_JMP)
            .args(["shell", "--exporter-config", cfg, "--", "sh", "-c", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (code, stdout, stderr) = finish(local_shell(&cfg_s, CALL_EVERYTHING)).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(stdout, EVERYTHING_OUTPUT, "{stderr}");

    let (code, stdout, stderr) = finish(local_shell(&cfg_s, BAD_INPUT)).await;
    assert_bad_input(code, &stdout, &stderr);

    // A config the chamber refuses: the exporter does not start, and says which field.
    let bad = lab.write(
        "bad.yaml",
        &std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("sensors: 3", "sensors: 12"),
    );
    let (code, stdout, stderr) =
        finish(local_shell(&bad.to_string_lossy(), "echo should-not-run")).await;
    assert_ne!(code, 0, "{stdout}{stderr}");
    assert!(!stdout.contains("should-not-run"), "{stdout}");
    assert!(
        stderr.contains("sensors: 12 is not between 1 and 8"),
        "{stderr}"
    );

    // The stock `j` is not needed: `my-j` outside a shell says what is missing.
    let (code, _, stderr) = finish(
        lab.cmd(MY_J)
            .args(["chamber", "target"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
    .await;
    assert_ne!(code, 0);
    assert!(stderr.contains("JUMPSTARTER_HOST"), "{stderr}");
}
