//! `jmp shell --timings` (and `JMP_TIMINGS=1`): at exit, a timeline on stderr of the steps a
//! lease to command goes through, each with its start and duration; nothing without them.

use jumpstarter_controller::objects::ExporterStatusValue;

use crate::{
    JMP,
    distributed::{finish, lab},
};

/// The steps of a lease to command, in the order they start.
const STEPS: &[&str] = &[
    "client config loaded",
    "controller connection (TCP, TLS, HTTP/2)",
    "lease acquired, exporter reached",
    "CreateLease",
    "lease granted",
    "GetExporter (labels)",
    "tunnel to the exporter",
    "Dial",
    "router connection (TCP, TLS, HTTP/2)",
    "GetReport (direct endpoints)",
    "local socket served",
    "exporter ready (GetStatus)",
    "command ran",
    "command spawned",
    "EndSession, afterLease hook awaited",
    "log follower stopped",
    "tunnels closed",
    "DeleteLease",
    "async runtime shut down",
];

/// The step names of a timeline, in its order (each line: start, duration, indented name).
fn steps(stderr: &str) -> Vec<String> {
    let Some(at) = stderr.find("timings (ms since the process started):") else {
        return Vec::new();
    };
    stderr[at..]
        .lines()
        .skip(2)
        .filter_map(|l| {
            let (start, rest) = l.trim_start().split_once(' ')?;
            start.parse::<f64>().ok()?;
            let (took, name) = rest.trim_start().split_once(' ')?;
            took.parse::<f64>().ok()?;
            Some(name.trim().to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_timings_list_each_step_of_a_lease_to_command_in_order() {
    let lab = lab().await;
    let exporter = lab.exporter("ex-t", &[("board", "timed")]).await;
    let client = lab.client("timer").await;
    let _run = lab.run_exporter(&exporter, "ex-t.log");
    lab.wait_status("ex-t", ExporterStatusValue::Available)
        .await;

    let shell = |flag: Option<&str>, env: Option<(&str, &str)>| {
        let mut c = lab.cmd(JMP);
        c.arg("shell").arg("--client-config").arg(&client);
        c.args(flag);
        c.args(["-l", "board=timed", "--", "true"]);
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };

    let (code, _, stderr) = finish(shell(Some("--timings"), None)).await;
    assert_eq!(code, 0, "{stderr}\n{}", lab.log("ex-t.log"));
    let seen = steps(&stderr);
    // Each step once, in order (a step may carry a detail: "lease granted (0 GetLease)").
    let mut at = 0;
    for step in STEPS {
        let found = seen[at..]
            .iter()
            .position(|s| s == step || s.starts_with(&format!("{step} (")));
        match found {
            Some(i) => at += i + 1,
            None => panic!(
                "no step {step:?} after {:?} in\n{stderr}",
                seen.get(at.wrapping_sub(1))
            ),
        }
    }
    // A free exporter: the grant came in CreateLease's answer, not from a GetLease poll.
    assert!(
        seen.iter().any(|s| s == "lease granted (0 GetLease)"),
        "{stderr}"
    );
    let total = stderr.lines().last().unwrap_or_default();
    assert!(total.trim_end().ends_with("total"), "{stderr}");

    // The same from the environment; and nothing without either.
    let (code, _, stderr) = finish(shell(None, Some(("JMP_TIMINGS", "1")))).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        steps(&stderr).iter().any(|s| s == "DeleteLease"),
        "{stderr}"
    );
    let (code, _, stderr) = finish(shell(None, Some(("JMP_TIMINGS", "0")))).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("timings"), "{stderr}");
}
