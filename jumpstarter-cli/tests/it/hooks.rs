//! Lease hooks (`hooks.beforeLease` / `hooks.afterLease`) with real scripts, through
//! `jmp shell`: standalone (`jmp run --tls-grpc-listener` + `jmp shell --tls-grpc`) and
//! distributed (controller, router, `jmp run`, `jmp shell --client-config`).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use jumpstarter_controller::objects::ExporterStatusValue;

use crate::{
    J, JMP, Running, Scratch,
    distributed::{finish, lab, shell},
    text,
};

/// `PATH` with the directory of the `j` under test first (hooks call `j`).
fn path_with_j() -> String {
    format!(
        "{}:{}",
        Path::new(J).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn hooks_yaml(hooks: &str) -> String {
    format!("{}hooks:\n{hooks}", crate::MOCK_CONFIG)
}

/// Indents a script for a YAML block scalar at `indent` spaces.
fn block(script: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    script
        .lines()
        .map(|l| format!("{pad}{l}\n"))
        .collect::<String>()
}

/// Starts the standalone exporter of `s` (plaintext) and returns it, its address and the
/// receiver of its stderr lines.
fn standalone(s: &Scratch) -> (Running, String, std::sync::mpsc::Receiver<String>) {
    standalone_with_path(s, &path_with_j())
}

/// [`standalone`] with the hooks' `PATH`.
fn standalone_with_path(
    s: &Scratch,
    path: &str,
) -> (Running, String, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead, BufReader};
    let mut c = s.cmd(JMP);
    c.env("PATH", path)
        .args(["run", "--exporter-config"])
        .arg(s.path("exporter.yaml"))
        .args(["--tls-grpc-listener", "127.0.0.1:0", "--tls-grpc-insecure"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
    let mut child = c.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let running = Running(child);
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("jmp run did not report its address");
        if let Some(rest) = line.split("listening on ").nth(1) {
            let addr = rest.split_whitespace().next().unwrap().to_string();
            return (running, addr, rx);
        }
    }
}

fn direct_shell(s: &Scratch, addr: &str, script: &str) -> Command {
    let mut c = s.cmd(JMP);
    c.env("PATH", path_with_j())
        .args(["shell", "--tls-grpc", addr, "--tls-grpc-insecure", "--"])
        .args(["sh", "-c", script]);
    c
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

#[test]
fn standalone_before_lease_runs_first_with_upstreams_environment() {
    let s = Scratch::new();
    let order = s.path("order");
    let env = s.path("env");
    s.write(
        "exporter.yaml",
        &hooks_yaml(&format!(
            "  beforeLease:\n    script: |\n{}    timeout: 30\n    onFailure: endLease\n",
            block(
                &format!(
                    "echo \"hello from the hook\"\n\
                     sleep 1\n\
                     j power on\n\
                     echo \"LEASE_NAME=$LEASE_NAME\" > {env}\n\
                     echo \"CLIENT_NAME=[$CLIENT_NAME]\" >> {env}\n\
                     echo \"JMP_DRIVERS_ALLOW=$JMP_DRIVERS_ALLOW\" >> {env}\n\
                     echo \"TERM=$TERM\" >> {env}\n\
                     echo \"DEBIAN_FRONTEND=$DEBIAN_FRONTEND\" >> {env}\n\
                     echo \"GIT_TERMINAL_PROMPT=$GIT_TERMINAL_PROMPT\" >> {env}\n\
                     env | grep -q '^PS1=' && echo PS1=exported >> {env}\n\
                     test -S \"$JUMPSTARTER_HOST\" && echo \"socket=yes\" >> {env}\n\
                     test -t 1 && echo \"tty=yes\" >> {env}\n\
                     echo hook >> {order}",
                    env = env.display(),
                    order = order.display()
                ),
                6
            )
        )),
    );
    // No `j` on the exporter's `PATH`: the hook's `j` is the one built beside `jmp`.
    let (_exporter, addr, _log) = standalone_with_path(&s, "/usr/bin:/bin");
    let out = direct_shell(
        &s,
        &addr,
        &format!("echo command >> {} && j power read", order.display()),
    )
    .env("PS1", "$ ")
    .output()
    .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    // The hook's output reaches the client, tagged with its source.
    assert!(
        stderr.contains("[beforeLease] hello from the hook"),
        "{stderr}"
    );
    assert_eq!(read(&order), "hook\ncommand\n");
    // The hook's `j power on` reached the drivers (its confirmation is hook output).
    assert!(stderr.contains("[beforeLease] Powered on"), "{stderr}");
    assert!(stdout.contains("voltage=5.0 V"), "{stdout}");
    assert_eq!(
        read(&env),
        "LEASE_NAME=standalone\nCLIENT_NAME=[]\nJMP_DRIVERS_ALLOW=UNSAFE\nTERM=dumb\n\
         DEBIAN_FRONTEND=noninteractive\nGIT_TERMINAL_PROMPT=0\nsocket=yes\ntty=yes\n"
    );
}

#[test]
fn standalone_end_lease_failure_skips_the_command_with_a_one_line_reason() {
    let s = Scratch::new();
    let ran = s.path("ran");
    s.write(
        "exporter.yaml",
        &hooks_yaml(
            "  beforeLease:\n    script: |\n      echo failing\n      exit 3\n    onFailure: endLease\n",
        ),
    );
    let (_exporter, addr, _log) = standalone(&s);
    let out = direct_shell(&s, &addr, &format!("touch {}", ran.display()))
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(!ran.exists(), "the command ran");
    assert!(stderr.contains("[beforeLease] failing"), "{stderr}");
    assert!(
        stderr.contains(
            "Error: beforeLease hook failed (on_failure=endLease): Hook failed with exit code 3"
        ),
        "{stderr}"
    );
    // Driver calls stay refused: the lease is over for the drivers.
    let out = s
        .cmd(J)
        .env("JUMPSTARTER_HOST", &addr)
        .env("JMP_GRPC_INSECURE", "1")
        .args(["power", "on"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn standalone_warn_failure_runs_the_command_with_a_warning() {
    let s = Scratch::new();
    s.write(
        "exporter.yaml",
        &hooks_yaml("  beforeLease:\n    script: exit 1\n"),
    );
    let (_exporter, addr, _log) = standalone(&s);
    let out = direct_shell(&s, &addr, "j power on").output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("Warning: beforeLease hook warning: Hook failed with exit code 1"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "[beforeLease] WARNING Hook failed with exit code 1 (on_failure=warn, continuing)"
        ),
        "{stderr}"
    );
}

#[test]
fn standalone_timeout_kills_the_hook_and_fails_it() {
    let s = Scratch::new();
    let pid = s.path("pid");
    s.write(
        "exporter.yaml",
        &hooks_yaml(&format!(
            "  beforeLease:\n    script: |\n      sleep 300 &\n      echo $! > {}\n      wait\n    timeout: 1\n    onFailure: endLease\n",
            pid.display()
        )),
    );
    let (_exporter, addr, _log) = standalone(&s);
    let out = direct_shell(&s, &addr, "true").output().unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains(
            "Error: beforeLease hook failed (on_failure=endLease): Hook timed out after 1 seconds"
        ),
        "{stderr}"
    );
    // The whole process group went, the background `sleep` too.
    let pid = read(&pid).trim().to_string();
    assert!(!pid.is_empty());
    assert!(gone(&pid), "hook child {pid} survived the timeout");
}

#[test]
fn standalone_exit_failure_shuts_the_exporter_down_with_code_1() {
    let s = Scratch::new();
    s.write(
        "exporter.yaml",
        &hooks_yaml("  beforeLease:\n    script: exit 2\n    onFailure: exit\n"),
    );
    let (mut exporter, _addr, _log) = standalone(&s);
    let mut code = None;
    for _ in 0..300 {
        if let Some(status) = exporter.0.try_wait().unwrap() {
            code = status.code();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(code, Some(1));
}

#[test]
fn script_file_and_exec_bash() {
    let s = Scratch::new();
    let out_file = s.path("out");
    let script = s.write(
        "prepare.sh",
        &format!(
            "if [[ -n \"$BASH_VERSION\" ]]; then echo bash > {}; fi\necho from the file\n",
            out_file.display()
        ),
    );
    s.write(
        "exporter.yaml",
        &hooks_yaml(&format!(
            "  beforeLease:\n    exec: /bin/bash\n    script: {}\n    onFailure: endLease\n",
            script.display()
        )),
    );
    let (_exporter, addr, _log) = standalone(&s);
    let out = direct_shell(&s, &addr, "true").output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("[beforeLease] from the file"), "{stderr}");
    assert_eq!(read(&out_file), "bash\n");
}

/// The pinned upstream venv (`cargo xtask venv`): `$JUMPSTARTER_UPSTREAM_VENV`, else
/// `target/interop-venv` beside the binaries under test. `None` (the test is skipped) when
/// it is missing outside CI; in CI (`CI=true`) a missing venv fails the test.
pub(crate) fn upstream_venv() -> Option<PathBuf> {
    let venv = std::env::var_os("JUMPSTARTER_UPSTREAM_VENV")
        .map(PathBuf::from)
        .or_else(|| {
            Path::new(J)
                .parent()
                .and_then(Path::parent)
                .map(|t| t.join("interop-venv"))
        })?;
    if venv.join("bin/python3").exists() && venv.join("bin/j").exists() {
        return Some(venv);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "the upstream Python venv is missing at {} (create it with `cargo xtask venv`)",
        venv.display()
    );
    eprintln!(
        "skipped: no upstream venv at {} (create it with `cargo xtask venv`)",
        venv.display()
    );
    None
}

#[test]
fn a_python_hook_drives_the_board_with_the_upstream_client() {
    let Some(venv) = upstream_venv() else {
        return;
    };
    let s = Scratch::new();
    let hook = s.write(
        "power_on.py",
        "import os, subprocess\n\
         from jumpstarter.utils.env import env\n\
         with env() as client:\n\
         \x20   client.power.on()\n\
         print('python hook: power on for', os.environ['JMP_DRIVERS_ALLOW'])\n\
         subprocess.run(['j', 'power', 'off'], check=True)\n\
         print('python hook: upstream j ran')\n",
    );
    s.write(
        "exporter.yaml",
        &hooks_yaml(&format!(
            "  beforeLease:\n    script: {}\n    timeout: 120\n    onFailure: endLease\n",
            hook.display()
        )),
    );
    // The venv first: `python3` (auto-detected for `.py`) and `j` are upstream's.
    let path = format!(
        "{}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (_exporter, addr, log) = standalone_with_path(&s, &path);
    let out = direct_shell(&s, &addr, "echo command ran")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    let log: Vec<String> = log.try_iter().collect();
    assert!(out.status.success(), "{stdout}{stderr}\n{}", log.join("\n"));
    assert!(stdout.contains("command ran"), "{stdout}");
    assert!(
        stderr.contains("[beforeLease] python hook: power on for UNSAFE"),
        "{stderr}"
    );
    assert!(
        stderr.contains("[beforeLease] python hook: upstream j ran"),
        "{stderr}"
    );
}

#[test]
fn a_local_shell_says_it_does_not_run_hooks_and_runs_the_command() {
    let s = Scratch::new();
    let ran = s.path("ran");
    s.write(
        "exporter.yaml",
        &hooks_yaml(&format!(
            "  beforeLease:\n    script: touch {}\n    onFailure: exit\n",
            ran.display()
        )),
    );
    let out = s
        .cmd(JMP)
        .env("PATH", path_with_j())
        .args([
            "shell",
            "--exporter-config",
            "exporter.yaml",
            "--",
            "j",
            "power",
            "on",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    // As upstream: hooks run around leases of `jmp run`, not in a local shell; ours says so.
    assert!(
        stderr.contains("Warning: `hooks` of the exporter config are not run by a local shell"),
        "{stderr}"
    );
    assert!(!ran.exists());
}

#[test]
fn bad_on_failure_is_refused_at_start_naming_the_key() {
    let s = Scratch::new();
    s.write(
        "exporter.yaml",
        &hooks_yaml("  beforeLease:\n    script: true\n    onFailure: explode\n"),
    );
    let out = s
        .cmd(JMP)
        .args(["run", "--exporter-config"])
        .arg(s.path("exporter.yaml"))
        .args(["--tls-grpc-listener", "127.0.0.1:0", "--tls-grpc-insecure"])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "hooks.beforeLease.onFailure: \"explode\" is not one of warn, endLease, exit"
        ),
        "{stderr}"
    );
}

#[test]
fn sigkill_of_the_exporter_during_a_hook_leaves_no_hook_child() {
    let s = Scratch::new();
    let pid = s.path("pid");
    s.write(
        "exporter.yaml",
        &hooks_yaml(&format!(
            "  beforeLease:\n    script: |\n      sleep 300 &\n      echo $! > {}\n      wait\n    timeout: 300\n",
            pid.display()
        )),
    );
    let (mut exporter, _addr, _log) = standalone(&s);
    let mut child_pid = String::new();
    for _ in 0..300 {
        child_pid = read(&pid).trim().to_string();
        if !child_pid.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!child_pid.is_empty(), "the hook did not start");
    assert!(!gone(&child_pid));
    exporter.0.kill().unwrap(); // SIGKILL
    exporter.0.wait().unwrap();
    assert!(
        gone(&child_pid),
        "hook child {child_pid} outlived the exporter"
    );
}

/// Whether process `pid` is gone (or a zombie), waiting up to 10 s.
fn gone(pid: &str) -> bool {
    for _ in 0..200 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat) if stat.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')) => {
                return true;
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    false
}

/// The exporter config of `lab`'s exporter `name` with `hooks` added.
async fn lab_exporter(lab: &crate::distributed::Lab, name: &str, hooks: &str) -> PathBuf {
    let cfg = lab.exporter(name, &[("hooks", name)]).await;
    let yaml = std::fs::read_to_string(&cfg).unwrap() + "hooks:\n" + hooks;
    std::fs::write(&cfg, yaml).unwrap();
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_hooks_run_in_order_around_the_command() {
    let lab = lab().await;
    let order = lab.path("order");
    let o = order.display();
    let cfg = lab_exporter(
        &lab,
        "hk1",
        &format!(
            "  beforeLease:\n    script: |\n      echo \"before $LEASE_NAME $CLIENT_NAME\"\n      \
             j power on\n      echo before >> {o}\n    onFailure: endLease\n  \
             afterLease:\n    script: |\n      echo after cleaning up\n      j power off\n      \
             echo after >> {o}\n    onFailure: warn\n"
        ),
    )
    .await;
    let client = lab.client("alice").await;
    let _exporter = lab.run_exporter(&cfg, "hk1.log");
    lab.wait_status("hk1", ExporterStatusValue::Available).await;
    let child = shell(
        &lab,
        &client,
        &["-l", "hooks=hk1"],
        &format!("echo command >> {o}; echo \"lease=$JMP_LEASE\""),
    );
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 0, "{stdout}{stderr}\n{}", lab.log("hk1.log"));
    assert_eq!(
        read(&order),
        "before\ncommand\nafter\n",
        "{stderr}\n{}",
        lab.log("hk1.log")
    );
    let lease = stdout.trim().strip_prefix("lease=").unwrap().to_string();
    assert!(
        stderr.contains(&format!("[beforeLease] before {lease} alice")),
        "{stderr}"
    );
    // The afterLease output is shown before the shell returns.
    assert!(
        stderr.contains("[afterLease] after cleaning up"),
        "{stderr}"
    );
    assert!(!stderr.contains("Error"), "{stderr}");
    lab.wait_status("hk1", ExporterStatusValue::Available).await;
    // The controller saw both runs (the dashboard's exporter page) and got their output
    // with the lease's pushed lines (log gathering is on by default).
    use jumpstarter_controller::hook_history::{HookKind, RunResult, is_hook_output};
    let state = &lab.ctl().state;
    let mut seen = (Vec::new(), Vec::new());
    for _ in 0..100 {
        let runs = state.hook_history.runs("default", "hk1");
        let story = state
            .lease_logs
            .as_ref()
            .expect("lease logs are kept by default")
            .read("default", &lease);
        let output = |kind| {
            story
                .entries
                .iter()
                .filter(|e| is_hook_output(e, kind))
                .map(|e| e.message.clone())
                .collect::<Vec<_>>()
        };
        seen = (
            runs.iter()
                .map(|r| (r.kind, r.result, r.lease.clone()))
                .collect::<Vec<_>>(),
            [output(HookKind::BeforeLease), output(HookKind::AfterLease)].concat(),
        );
        if seen.1.len() >= 2 && seen.0.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lease = Some(lease);
    assert_eq!(
        seen.0,
        // Newest first.
        vec![
            (HookKind::AfterLease, RunResult::Succeeded, lease.clone()),
            (HookKind::BeforeLease, RunResult::Succeeded, lease.clone()),
        ],
        "{}",
        lab.log("hk1.log")
    );
    assert!(
        seen.1.iter().any(|l| l.contains("before "))
            && seen.1.iter().any(|l| l == "after cleaning up"),
        "{:?}",
        seen.1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_end_lease_failure_skips_the_after_lease_hook() {
    let lab = lab().await;
    let after = lab.path("after");
    let cfg = lab_exporter(
        &lab,
        "hk2",
        &format!(
            "  beforeLease:\n    script: |\n      echo checking\n      sleep 2\n      exit 4\n    onFailure: endLease\n  \
             afterLease:\n    script: touch {}\n",
            after.display()
        ),
    )
    .await;
    let client = lab.client("bob").await;
    let _exporter = lab.run_exporter(&cfg, "hk2.log");
    lab.wait_status("hk2", ExporterStatusValue::Available).await;
    let child = shell(&lab, &client, &["-l", "hooks=hk2"], "echo ran");
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(!stdout.contains("ran"), "{stdout}");
    // One line with the reason, naming the exit code: from the exporter's status when the
    // client got in during the hook, or from the controller's refusal to dial an exporter
    // whose hook failed, which carries the exporter's reason.
    let reason = stderr
        .lines()
        .filter(|l| l.starts_with("Error: "))
        .collect::<Vec<_>>();
    assert_eq!(reason.len(), 1, "{stderr}");
    assert!(
        reason[0].contains(
            "beforeLease hook failed (on_failure=endLease): Hook failed with exit code 4"
        ),
        "{stderr}"
    );
    // The exporter is free again and the afterLease hook never ran.
    lab.wait_status("hk2", ExporterStatusValue::Available).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!after.exists(), "{}", lab.log("hk2.log"));
}

/// A beforeLease hook that fails at once: the client usually meets the failure when it
/// dials, and the controller's refusal carries the exporter's reason (the exit code).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_a_hook_that_fails_at_once_is_reported_with_its_exit_code() {
    let lab = lab().await;
    let cfg = lab_exporter(
        &lab,
        "hk5",
        "  beforeLease:\n    script: exit 5\n    onFailure: endLease\n",
    )
    .await;
    let client = lab.client("carol").await;
    let _exporter = lab.run_exporter(&cfg, "hk5.log");
    lab.wait_status("hk5", ExporterStatusValue::Available).await;
    let child = shell(&lab, &client, &["-l", "hooks=hk5"], "echo ran");
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(!stdout.contains("ran"), "{stdout}");
    assert!(stderr.contains("Hook failed with exit code 5"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_lease_timeout_during_a_slow_hook_ends_cleanly() {
    let lab = lab().await;
    let cfg = lab_exporter(
        &lab,
        "hk3",
        "  beforeLease:\n    script: |\n      echo slow\n      sleep 20\n    timeout: 60\n",
    )
    .await;
    let client = lab.client("carol").await;
    let _exporter = lab.run_exporter(&cfg, "hk3.log");
    lab.wait_status("hk3", ExporterStatusValue::Available).await;
    let child = shell(
        &lab,
        &client,
        &["-l", "hooks=hk3", "--duration", "5s"],
        "echo ran",
    );
    let (code, stdout, stderr) = finish(child).await;
    // The command never ran: not a success (75, as for a lease that ends under the
    // command), and no error either.
    assert_eq!(code, 75, "{stdout}{stderr}\n{}", lab.log("hk3.log"));
    assert!(!stdout.contains("ran"), "{stdout}");
    assert!(!stderr.contains("Error"), "{stderr}");
    assert!(stderr.contains("[beforeLease] slow"), "{stderr}");
    assert!(stderr.contains("the command did not run"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_after_lease_exit_failure_is_reported_and_stops_the_exporter() {
    let lab = lab().await;
    let cfg = lab_exporter(
        &lab,
        "hk4",
        "  afterLease:\n    script: |\n      echo cleanup broke\n      exit 5\n    onFailure: exit\n",
    )
    .await;
    let client = lab.client("dave").await;
    let mut exporter = lab.run_exporter(&cfg, "hk4.log");
    lab.wait_status("hk4", ExporterStatusValue::Available).await;
    let child = shell(&lab, &client, &["-l", "hooks=hk4"], "echo ran");
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 1, "{stdout}{stderr}\n{}", lab.log("hk4.log"));
    // The command ran; the afterLease output and the one-line reason follow it.
    assert!(stdout.contains("ran"), "{stdout}");
    assert!(stderr.contains("[afterLease] cleanup broke"), "{stderr}");
    assert!(
        stderr.contains(
            "Error: afterLease hook failed (on_failure=exit, shutting down): Hook failed with exit code 5"
        ),
        "{stderr}"
    );
    // The exporter goes away with exit code 1, offline.
    let status = tokio::time::timeout(Duration::from_secs(30), exporter.wait())
        .await
        .expect("the exporter did not stop")
        .unwrap();
    assert_eq!(status.code(), Some(1), "{}", lab.log("hk4.log"));
    lab.wait_status("hk4", ExporterStatusValue::Offline).await;
}

#[test]
fn failure_detection_ends_jmp_run_after_rapid_controller_failures() {
    let s = Scratch::new();
    s.write(
        "exporter.yaml",
        &(crate::MOCK_CONFIG
            .replace("endpoint: \"\"", "endpoint: \"127.0.0.1:1\"")
            .replace("token: \"\"", "token: \"t\"")
            + "failureDetection:\n  maxRapidFailures: 1\n  rapidFailureWindow: 30\n"),
    );
    // 1 x 6 attempts against a closed port: about 8-15 s of backoff.
    let mut child = s
        .cmd(JMP)
        .args(["run", "--exporter-config"])
        .arg(s.path("exporter.yaml"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut code = None;
    for _ in 0..600 {
        if let Some(status) = child.try_wait().unwrap() {
            code = status.code();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("6 connection attempts in a row failed within 30s each (failureDetection"),
        "{stderr}"
    );
}

/// Waits (bounded) until the controller has quarantined exporter `name`; returns the
/// condition's reason and message.
async fn wait_unhealthy(lab: &crate::distributed::Lab, name: &str, log: &str) -> (String, String) {
    use jumpstarter_controller::{objects::Exporter, store::Store};
    for _ in 0..300 {
        let e: Option<Exporter> = lab.ctl().state.store.get("default", name).await.unwrap();
        if let Some(c) = e.as_ref().and_then(|e| e.unhealthy()) {
            return (c.reason.clone(), c.message.clone());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} was not quarantined\n{}", lab.log(log));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_failing_health_checks_quarantine_the_exporter() {
    let lab = lab().await;
    let broken = lab.path("broken");
    std::fs::write(&broken, "").unwrap();
    let cfg = lab.exporter("hq1", &[("hooks", "hq1")]).await;
    let yaml = std::fs::read_to_string(&cfg).unwrap()
        + &format!(
            "healthCheck:\n  script: |\n    j power on\n    if [ -e {b} ]; then echo probe: no answer; exit 3; fi\n  \
             interval: 1\n  timeout: 20\n  threshold: 2\n",
            b = broken.display()
        );
    std::fs::write(&cfg, yaml).unwrap();
    let client = lab.client("erin").await;
    let _exporter = lab.run_exporter(&cfg, "hq1.log");
    let (reason, message) = wait_unhealthy(&lab, "hq1", "hq1.log").await;
    assert_eq!(reason, "HealthCheckFailed");
    assert_eq!(
        message,
        "healthCheck: failed 2 times in a row (last: Hook failed with exit code 3)\nPowered on\nprobe: no answer"
    );
    // Each failed run reached the controller (log gathering is on by default): the
    // dashboard's health history lists them, newest first, counted out of the threshold.
    use jumpstarter_controller::hook_history::HealthKind;
    let mut runs = Vec::new();
    for _ in 0..100 {
        runs = lab
            .ctl()
            .state
            .hook_history
            .health_events("default", "hq1")
            .into_iter()
            .filter_map(|ev| Some((ev.kind, ev.message, ev.check?)))
            .map(|(kind, why, c)| (kind, c.failures, c.threshold, why, c.output))
            .collect();
        if runs.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let run = |failures| {
        (
            HealthKind::CheckFailed,
            failures,
            2,
            "Hook failed with exit code 3".to_string(),
            "Powered on\nprobe: no answer".to_string(),
        )
    };
    // The first two (the oldest; the count starts again after the quarantine).
    let first = runs.len().checked_sub(2).map(|i| &runs[i..]);
    assert_eq!(first, Some(&[run(2), run(1)][..]), "{}", lab.log("hq1.log"));
    // Clients see it; its ordinary status is unchanged.
    let out = lab
        .cmd(JMP)
        .args(["get", "exporters", "--with", "status", "--client-config"])
        .arg(&client)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("UNHEALTHY"), "{stdout}{stderr}");
    let out = lab
        .cmd(JMP)
        .args(["describe", "exporter", "hq1", "--client-config"])
        .arg(&client)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.contains("Last Output:\n  Powered on\n  probe: no answer\n"),
        "{stdout}{stderr}"
    );
    // A lease for it waits, naming the reason.
    let out = lab
        .cmd(JMP)
        .args([
            "create",
            "lease",
            "-l",
            "hooks=hq1",
            "--duration",
            "1m",
            "-o",
            "name",
            "--client-config",
        ])
        .arg(&client)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let lease_name = stdout.trim().rsplit('/').next().unwrap().to_string();
    let mut pending = String::new();
    for _ in 0..100 {
        let l = lab.lease(&lease_name).await;
        let st = l.status.clone().unwrap_or_default();
        if let Some(c) = st.conditions.iter().find(|c| c.type_ == "Pending") {
            pending = format!("{} {}", c.reason, c.message);
            if c.reason == "Unhealthy" {
                break;
            }
        }
        assert!(
            st.exporter_ref.is_none(),
            "an unhealthy exporter was leased"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(pending.starts_with("Unhealthy "), "{pending}");
    // Repaired and cleared (as `jmp admin clear-health` does): the lease gets it.
    std::fs::remove_file(&broken).unwrap();
    {
        use jumpstarter_controller::objects::{conditions, set_condition};
        let store = &lab.ctl().state.store;
        jumpstarter_controller::testing::update_exporter_status(store, "default", "hq1", |e| {
            let st = e.status.get_or_insert_with(Default::default);
            set_condition(
                &mut st.conditions,
                conditions::HEALTHY,
                true,
                conditions::REASON_CLEARED,
                "Cleared by an admin",
                None,
                jiff::Timestamp::now(),
            );
        })
        .await;
        lab.ctl().state.wake.notify_one();
    }
    let mut leased = false;
    for _ in 0..300 {
        let l = lab.lease(&lease_name).await;
        if l.status.and_then(|s| s.exporter_ref).is_some() {
            leased = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(leased, "{}", lab.log("hq1.log"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_failing_hooks_quarantine_the_exporter() {
    let lab = lab().await;
    let cfg = lab_exporter(
        &lab,
        "hq2",
        "  beforeLease:\n    script: |\n      echo relay stuck\n      exit 6\n    onFailure: warn\n",
    )
    .await;
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg).unwrap() + "healthCheck:\n  threshold: 1\n",
    )
    .unwrap();
    let client = lab.client("frank").await;
    let _exporter = lab.run_exporter(&cfg, "hq2.log");
    lab.wait_status("hq2", ExporterStatusValue::Available).await;
    let child = shell(&lab, &client, &["-l", "hooks=hq2"], "echo ran");
    let (code, stdout, stderr) = finish(child).await;
    // warn: the command still runs.
    assert_eq!(code, 0, "{stdout}{stderr}\n{}", lab.log("hq2.log"));
    assert!(stdout.contains("ran"), "{stdout}");
    let (reason, message) = wait_unhealthy(&lab, "hq2", "hq2.log").await;
    assert_eq!(reason, "HookFailed");
    assert_eq!(
        message,
        "beforeLease: failed 1 times in a row (last: Hook failed with exit code 6)\nrelay stuck"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_sigkill_during_before_lease_leaves_no_hook_child_and_the_lease_ends() {
    let lab = lab().await;
    let pid = lab.path("hook.pid");
    let cfg = lab_exporter(
        &lab,
        "hk9",
        &format!(
            "  beforeLease:\n    script: |\n      echo powering on\n      sleep 300 &\n      \
             echo $! > {}\n      wait\n    timeout: 300\n",
            pid.display()
        ),
    )
    .await;
    let client = lab.client("grace").await;
    let mut exporter = lab.run_exporter(&cfg, "hk9.log");
    lab.wait_status("hk9", ExporterStatusValue::Available).await;
    let child = shell(
        &lab,
        &client,
        &["-l", "hooks=hk9", "--duration", "5s"],
        "echo ran",
    );
    let mut hook_pid = String::new();
    for _ in 0..600 {
        hook_pid = read(&pid).trim().to_string();
        if !hook_pid.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !hook_pid.is_empty(),
        "the hook did not start\n{}",
        lab.log("hk9.log")
    );
    exporter.start_kill().unwrap(); // SIGKILL
    exporter.wait().await.unwrap();
    assert!(
        gone(&hook_pid),
        "hook child {hook_pid} outlived the exporter"
    );
    // The client's command never runs; the shell ends by itself (the lease expires).
    let (_code, stdout, stderr) = finish(child).await;
    assert!(!stdout.contains("ran"), "{stdout}{stderr}");
    // The lease is not left assigned forever.
    use jumpstarter_controller::{objects::Lease, store::Store};
    let mut ended = false;
    for _ in 0..300 {
        let leases = lab
            .ctl()
            .state
            .store
            .list::<Lease>(Some("default"), &Default::default(), &Default::default())
            .await
            .unwrap();
        if !leases.items.is_empty() && leases.items.iter().all(|l| l.is_ended()) {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ended, "the lease of a killed exporter stayed assigned");
}

/// Once a lease has ended, its client's connection to the exporter calls nothing, also
/// while the afterLease hook runs (whose own `j` keeps working). The client here holds one
/// connection over the whole lease, as upstream's Python client does, rather than `j`,
/// which connects anew for every command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_driver_calls_are_refused_once_the_lease_ended() {
    use jumpstarter_core::{
        client::{
            ControllerClient, ExporterSession, LeaseRequest,
            lease::{LeaseSource, acquire},
        },
        config::ClientConfig,
    };
    let lab = lab().await;
    let (started, release, done) = (lab.path("started"), lab.path("release"), lab.path("done"));
    let cfg = lab_exporter(
        &lab,
        "hk6",
        &format!(
            "  afterLease:\n    script: |\n      j power on\n      touch {started}\n      \
             for i in $(seq 300); do [ -e {release} ] && break; sleep 0.1; done\n      \
             j power off\n      touch {done}\n    timeout: 60\n",
            started = started.display(),
            release = release.display(),
            done = done.display()
        ),
    )
    .await;
    let client = ClientConfig::load(&lab.client("erin").await).unwrap();
    let _exporter = lab.run_exporter(&cfg, "hk6.log");
    lab.wait_status("hk6", ExporterStatusValue::Available).await;

    let controller = ControllerClient::connect(&client).await.unwrap();
    let lease = acquire(
        &controller,
        LeaseSource::Create(LeaseRequest::new("hooks=hk6", Duration::from_secs(3))),
        Duration::from_secs(30),
        |_, _| {},
    )
    .await
    .unwrap();
    let session = ExporterSession::from_channel(lease.session_channel().await.unwrap())
        .await
        .unwrap();
    let power = session.driver("power").unwrap();
    let mut ready = false;
    for _ in 0..100 {
        if power.call::<()>("on", ()).await.is_ok() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "{}", lab.log("hk6.log"));

    // The duration runs out; the afterLease hook starts (its `j` works) and waits.
    for _ in 0..300 {
        if started.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(started.exists(), "{}", lab.log("hk6.log"));
    let e = power
        .call::<()>("off", ())
        .await
        .expect_err("a driver call after the lease ended was served");
    assert!(e.to_string().contains("has ended"), "{e}");
    let e = power
        .streaming_call::<serde_json::Value>("read", ())
        .await
        .err()
        .expect("a streaming call after the lease ended was served");
    assert!(e.to_string().contains("has ended"), "{e}");

    // The hook's own `j` still works.
    std::fs::write(&release, "").unwrap();
    for _ in 0..300 {
        if done.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(done.exists(), "{}", lab.log("hk6.log"));
    lab.wait_status("hk6", ExporterStatusValue::Available).await;
}

/// The embedders' facade: a [`LeaseSession`] reports its place in the queue while another
/// holds the board, hands out its session only once the beforeLease hook is over, ends the
/// session (afterLease hook) and the lease on `release()`, and releases a lease it created
/// when dropped.
///
/// [`LeaseSession`]: jumpstarter_core::LeaseSession
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_session_queues_waits_for_the_hook_and_releases() {
    use jumpstarter_core::{ControllerClient, LeaseRequest, LeaseSession, config::ClientConfig};
    let lab = lab().await;
    let (before, after) = (lab.path("before"), lab.path("after"));
    let cfg = lab_exporter(
        &lab,
        "hk7",
        &format!(
            "  beforeLease:\n    script: |\n      sleep 1\n      echo x >> {before}\n    \
             onFailure: endLease\n  afterLease:\n    script: |\n      echo x >> {after}\n",
            before = before.display(),
            after = after.display()
        ),
    )
    .await;
    let client = ClientConfig::load(&lab.client("frank").await).unwrap();
    let _exporter = lab.run_exporter(&cfg, "hk7.log");
    lab.wait_status("hk7", ExporterStatusValue::Available).await;
    let controller = ControllerClient::connect(&client).await.unwrap();
    let request = || LeaseRequest::new("hooks=hk7", Duration::from_secs(600));

    let first = LeaseSession::builder(&controller, request())
        .connect()
        .await
        .unwrap();
    // The session is handed out after the beforeLease hook, not while it runs.
    assert_eq!(std::fs::read_to_string(&before).unwrap(), "x\n");
    first
        .session()
        .unwrap()
        .driver("power")
        .unwrap()
        .call::<()>("on", ())
        .await
        .unwrap();
    let first_name = first.lease().name.clone();

    // A second session waits in the queue and says so; it gets the board once the first
    // is released.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(16);
    let waiting = tokio::spawn({
        let controller = controller.clone();
        async move {
            LeaseSession::builder(&controller, request())
                .acquisition_timeout(Duration::from_secs(60))
                .on_wait(move |_, why| {
                    let _ = tx.try_send(why.to_string());
                })
                .connect()
                .await
        }
    });
    let why = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("no queue report within 30s")
        .unwrap();
    assert!(why.contains("position 1 in queue"), "{why}");
    first.release().await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&after).unwrap(),
        "x\n",
        "afterLease hook"
    );
    assert!(
        ends(&controller, &first_name).await,
        "lease {first_name} did not end"
    );

    let second = waiting.await.unwrap().unwrap();
    assert_eq!(std::fs::read_to_string(&before).unwrap(), "x\nx\n");
    let second_name = second.lease().name.clone();
    // Dropped: released in the background (no EndSession), so the board is free again.
    drop(second);
    let released = ends(&controller, &second_name).await;
    assert!(released, "lease {second_name} was not released on drop");
}

/// Whether lease `name` ends (`Ready` False) within 10 s.
async fn ends(controller: &jumpstarter_core::ControllerClient, name: &str) -> bool {
    for _ in 0..100 {
        let l = controller.get_lease(name).await.unwrap();
        if l.conditions
            .iter()
            .any(|c| c.r#type.as_deref() == Some("Ready") && c.status.as_deref() == Some("False"))
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
