//! What a first-time user meets: confirmations of state-changing `j` commands, a closed
//! stdout, completion.

use std::process::Stdio;

use crate::{J, JMP, Scratch, start_exporter, text};

/// The `j` commands that change the board say what they did, on stderr (stdout stays as
/// upstream's: empty), and reading is as before.
#[test]
fn state_changing_j_commands_confirm_on_stderr() {
    let s = Scratch::new();
    s.write(
        "exporter.yaml",
        &format!(
            "{}  storage:\n    type: jumpstarter_driver_opendal.driver.MockStorageMux\n",
            crate::MOCK_CONFIG
        ),
    );
    let j_dir = std::path::Path::new(J).parent().unwrap();
    let path = format!(
        "{}:{}",
        j_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = s
        .cmd(JMP)
        .env("PATH", path)
        .args(["shell", "--exporter-config"])
        .arg(s.path("exporter.yaml"))
        .args([
            "--",
            "sh",
            "-c",
            "exec 2>&1; j power on; j power off; j power cycle -w 0; j storage host; \
             j storage dut; j storage off",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    insta::assert_snapshot!(stdout, @r"
    Powered on
    Powered off
    Power cycling with 0 seconds wait time...
    Power cycled
    Storage connected to the host
    Storage connected to the DUT
    Storage disconnected
    ");
}

/// `target/debug/jmp shell --exporter-config FILE -- j power cycle`, as `cargo xtask
/// quickstart` suggests to try next: the `j` built beside `jmp` is found although neither is
/// on `PATH`; a `j` that is on `PATH` still comes first.
#[test]
fn jmp_shell_finds_the_j_built_beside_it() {
    let s = Scratch::new();
    s.write("exporter.yaml", crate::MOCK_CONFIG);
    let shell = |path: &str| {
        let out = s
            .cmd(JMP)
            .env("PATH", path)
            .args(["shell", "--exporter-config"])
            .arg(s.path("exporter.yaml"))
            .args(["--", "sh", "-c", "exec 2>&1; j power on"])
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "PATH={path}: {stdout}{stderr}");
        stdout
    };
    assert_eq!(shell("/usr/bin:/bin"), "Powered on\n");
    std::fs::create_dir(s.path("bin")).unwrap();
    s.write("bin/j", "#!/bin/sh\necho \"the j on PATH\"\n");
    let own = s.path("bin");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(own.join("j"), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    assert_eq!(
        shell(&format!("{}:/usr/bin:/bin", own.display())),
        "the j on PATH\n"
    );
}

/// Runs `jmp ARGS` with a stdout whose reading end is already closed.
fn with_closed_stdout(args: &[&str]) -> (Option<i32>, String) {
    let s = Scratch::new();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = s
        .cmd(JMP)
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (out.status.code(), text(&out).1)
}

/// `jmp completion bash | head -1` and the like: no panic, no backtrace, the code a shell
/// gives a tool a closed pipe stops (141).
#[test]
fn a_closed_stdout_ends_jmp_quietly() {
    for args in [&["completion", "bash"][..], &["version"]] {
        let (code, stderr) = with_closed_stdout(args);
        assert_eq!(code, Some(141), "jmp {args:?}: {stderr}");
        assert_eq!(stderr, "", "jmp {args:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Name completion, `-o wide`, `describe exporter` drivers (issue 24, items 5 and 7)

use std::time::Duration;

use jumpstarter_controller::objects::ExporterStatusValue;

use crate::distributed::{Lab, finish, lab};

/// Saves a lab client config under an alias, as `jmp config client create` would.
fn save_alias(lab: &Lab, from: &std::path::Path, alias: &str) {
    let dir = lab.path("config/clients");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(from, dir.join(format!("{alias}.yaml"))).unwrap();
}

/// Asks `jmp` for completions as the bash script does: `JMP_COMPLETE=bash jmp -- jmp WORDS`
/// with the index of the word being completed (the last). Flags (offered with the names
/// after an empty word) are left out.
async fn complete(lab: &Lab, words: &[&str]) -> Vec<String> {
    let child = lab
        .cmd(JMP)
        .env("JMP_COMPLETE", "bash")
        .env("_CLAP_COMPLETE_INDEX", words.len().to_string())
        .env("_CLAP_IFS", "\n")
        .args(["--", "jmp"])
        .args(words)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 0, "{words:?}: {stdout}{stderr}");
    assert_eq!(stderr, "", "{words:?}");
    stdout
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('-'))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_offers_client_exporter_and_lease_names() {
    let lab = lab().await;
    lab.exporter("ex1", &[("board", "rpi4")]).await;
    lab.exporter("ex2", &[("board", "imx8")]).await;
    let client = lab.client("hello").await;
    save_alias(&lab, &client, "hello");
    save_alias(&lab, &client, "work");
    // A client whose controller is not there: no names from it, no error, no hang.
    let down = std::fs::read_to_string(&client).unwrap().replace(
        &format!("localhost:{}", lab.ctl().addr.port()),
        "localhost:1",
    );
    std::fs::write(lab.path("config/clients/down.yaml"), down).unwrap();
    let exporters = lab.path("config/exporters");
    std::fs::create_dir_all(&exporters).unwrap();
    std::fs::write(exporters.join("bench.yaml"), crate::MOCK_CONFIG).unwrap();
    // A lease of hello's (waiting: its exporter is not running).
    let out = lab
        .cmd(JMP)
        .args(["create", "lease", "--client", "hello", "-n", "ex1"])
        .args(["--duration", "10m", "-o", "name"])
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let lease = stdout.trim().to_string();

    // Client aliases, from the local configs.
    assert_eq!(
        complete(&lab, &["shell", "--client", ""]).await,
        ["down", "hello", "work"]
    );
    assert_eq!(
        complete(&lab, &["get", "leases", "--client", "w"]).await,
        ["work"]
    );
    assert_eq!(
        complete(&lab, &["describe", "client", "h"]).await,
        ["hello"]
    );
    assert_eq!(
        complete(&lab, &["config", "client", "use", ""]).await,
        ["down", "hello", "work"]
    );
    // Exporter config aliases.
    assert_eq!(
        complete(&lab, &["config", "exporter", "edit", ""]).await,
        ["bench"]
    );
    assert_eq!(complete(&lab, &["run", "--exporter", "b"]).await, ["bench"]);
    // Exporter names, from the controller of the client the line names.
    assert_eq!(
        complete(&lab, &["describe", "exporter", "--client", "hello", ""]).await,
        ["ex1", "ex2"]
    );
    assert_eq!(
        complete(&lab, &["desc", "e", "--client=hello", "ex2"]).await,
        ["ex2"]
    );
    assert_eq!(
        complete(&lab, &["shell", "--client", "hello", "-n", ""]).await,
        ["ex1", "ex2"]
    );
    // Lease names: the client's own active leases.
    for words in [
        &["delete", "lease", "--client", "hello", ""][..],
        &["update", "lease", "--client", "hello", ""],
        &["describe", "lease", "--client", "hello", ""],
        &["shell", "--client", "hello", "--lease", ""],
    ] {
        assert_eq!(complete(&lab, words).await, [lease.as_str()], "{words:?}");
    }
    // No controller: nothing to offer, quietly.
    assert!(
        complete(&lab, &["describe", "exporter", "--client", "down", ""])
            .await
            .is_empty()
    );
    // Subcommands still complete as before.
    assert_eq!(complete(&lab, &["desc"]).await, ["describe"]);

    // The script `jmp completion bash` prints, sourced in a real bash, completes the same.
    let script = format!(
        "source <('{JMP}' completion bash) && COMP_WORDS=(jmp describe exporter --client hello '') \
         && COMP_CWORD=5 && _clap_complete_jmp jmp '' hello && printf '%s\\n' \"${{COMPREPLY[@]}}\""
    );
    let out = lab
        .cmd("bash")
        .args(["-c", &script])
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let names: Vec<&str> = stdout
        .split_whitespace()
        .filter(|w| !w.starts_with('-'))
        .collect();
    assert_eq!(names, ["ex1", "ex2"], "{stdout}{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wide_output_and_the_drivers_of_describe_exporter() {
    let lab = lab().await;
    let cfg = lab.exporter("ex1", &[("board", "rpi4")]).await;
    let client = lab.client("hello").await;
    let _exporter = lab.run_exporter(&cfg, "ex1.log");
    lab.wait_status("ex1", ExporterStatusValue::Available).await;

    let jmp = |args: &[&str]| {
        let mut c = lab.cmd(JMP);
        c.args(args).arg("--client-config").arg(&client);
        c
    };
    // The drivers from the exporter's registration, with their client classes.
    let out = jmp(&["describe", "exporter", "ex1"])
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let drivers = stdout
        .split_once("Drivers:\n")
        .map(|(_, d)| d)
        .unwrap_or_else(|| panic!("no drivers in:\n{stdout}"));
    insta::assert_snapshot!(drivers, @r"
      Name     Client                                               Labels
      ----     ------                                               ------
      (root)   jumpstarter_driver_composite.client.CompositeClient  <none>
      power    jumpstarter_driver_power.client.PowerClient          <none>
      storage  jumpstarter_driver_opendal.client.StorageMuxClient   <none>
    ");
    let out = jmp(&["describe", "exporter", "ex1", "-o", "json"])
        .output()
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["drivers"][1]["path"], "power", "{json}");
    assert_eq!(
        json["drivers"][1]["client"],
        "jumpstarter_driver_power.client.PowerClient"
    );

    // -o wide: the online, status and lease columns without --with.
    let out = jmp(&["get", "exporters", "-o", "wide"])
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let header: Vec<&str> = stdout
        .lines()
        .next()
        .unwrap()
        .split("  ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "ONLINE",
            "STATUS",
            "LABELS",
            "LEASED BY",
            "LEASE STATUS",
            "RELEASE TIME"
        ]
    );
    assert!(
        stdout.lines().nth(1).unwrap().contains("AVAILABLE"),
        "{stdout}"
    );
    let out = jmp(&[
        "create",
        "lease",
        "-n",
        "ex1",
        "--duration",
        "1h",
        "-o",
        "name",
    ])
    .output()
    .await
    .unwrap();
    assert!(out.status.success(), "{}", text(&out).1);
    let lease = text(&out).0.trim().to_string();
    let mut wide = String::new();
    for _ in 0..100 {
        let out = jmp(&["get", "leases", "-o", "wide"])
            .output()
            .await
            .unwrap();
        wide = text(&out).0;
        if wide.contains("In-Use") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let header: Vec<&str> = wide
        .lines()
        .next()
        .unwrap()
        .split("  ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "SELECTOR",
            "EXPIRES AT",
            "REMAINING",
            "CLIENT",
            "EXPORTER",
            "TAGS",
            "STATUS",
            "BEGIN TIME",
            "DURATION"
        ]
    );
    let row = wide.lines().nth(1).unwrap();
    assert!(
        row.starts_with(&lease) && row.contains("In-Use") && row.contains("1:00:00"),
        "{wide}"
    );
    // Without -o wide, as before.
    let out = jmp(&["get", "leases"]).output().await.unwrap();
    assert!(!text(&out).0.contains("BEGIN TIME"));
}

/// A free board: no "Waiting for lease" line (it only comes after 2 s), and one "Connected
/// to" line, also in an interactive shell (issue 24, item 8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_board_is_leased_quietly_and_connected_is_said_once() {
    let lab = lab().await;
    let cfg = lab.exporter("ex1", &[("board", "rpi4")]).await;
    let client = lab.client("hello").await;
    let _exporter = lab.run_exporter(&cfg, "ex1.log");
    lab.wait_status("ex1", ExporterStatusValue::Available).await;

    let child = crate::distributed::shell(&lab, &client, &["-n", "ex1"], "true");
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    insta::assert_snapshot!(stderr, @"Connected to ex1 via router");

    // No command: an interactive shell (here one reading an empty stdin).
    let child = lab
        .cmd(JMP)
        .args(["shell", "-n", "ex1", "--client-config"])
        .arg(&client)
        .env("SHELL", "/bin/sh")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    insta::assert_snapshot!(stderr, @r"
    Connected to ex1 via router
    Type `exit` to leave.
    ");
}

/// `jmp config direct certs` makes what direct mode needs: `jmp run` serves TLS with
/// server.pem/server-key.pem, and `jmp shell --tls-ca ca.pem` and `j` trust it, by host name
/// and by address (issue 24, item 9).
#[test]
fn direct_tls_works_with_the_certificates_jmp_makes() {
    let s = Scratch::new();
    let out = s
        .cmd(JMP)
        .args(["config", "direct", "certs", "--host", "localhost"])
        .args(["--ip", "127.0.0.1", "--out", "certs"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("jmp shell --tls-grpc localhost:PORT --tls-ca certs/ca.pem"),
        "{stderr}"
    );
    let certs = s.path("certs");
    let cert = certs.join("server.pem");
    let key = certs.join("server-key.pem");
    let ca = certs.join("ca.pem");
    let (_exporter, port) = start_exporter(
        &s,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    for host in ["localhost", "127.0.0.1"] {
        let addr = format!("{host}:{port}");
        let out = s
            .cmd(JMP)
            .args(["shell", "--tls-grpc", &addr, "--tls-ca"])
            .arg(&ca)
            .args(["--", J, "power", "read"])
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{addr}: {stdout}{stderr}");
        assert!(stdout.contains("voltage=5.0 V"), "{addr}: {stdout}");
    }
    // Without the CA the certificate is not trusted.
    let out = s
        .cmd(JMP)
        .args(["shell", "--tls-grpc", &format!("localhost:{port}")])
        .args(["--", J, "power", "read"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out).0);
    // A second run does not replace the files.
    let again = s
        .cmd(JMP)
        .args([
            "config",
            "direct",
            "certs",
            "--host",
            "localhost",
            "--out",
            "certs",
        ])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(text(&again).1.contains("--force"), "{}", text(&again).1);
}
