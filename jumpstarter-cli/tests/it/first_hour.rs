//! What a first-time user meets: confirmations of state-changing `j` commands, a closed
//! stdout, completion.

use std::process::Stdio;

use crate::{J, JMP, Scratch, text};

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
