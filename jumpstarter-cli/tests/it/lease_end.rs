//! A lease that ends under `jmp shell`: the shell says when and why, `j` says "the lease
//! ended" with gRPC code UNAVAILABLE, and `jmp shell` exits with its own code (75).

use jumpstarter_controller::objects::ExporterStatusValue;

use crate::{
    JMP,
    distributed::{Lab, finish, lab, shell},
};

/// A lab with exporter `exporter` (label `board=BOARD`) running and available, and the
/// config of client `client`.
async fn lab_with_board(
    exporter: &str,
    board: &str,
    client: &str,
) -> (Lab, std::path::PathBuf, tokio::process::Child) {
    let lab = lab().await;
    let exporter_cfg = lab.exporter(exporter, &[("board", board)]).await;
    let client = lab.client(client).await;
    let running = lab.run_exporter(&exporter_cfg, &format!("{exporter}.log"));
    lab.wait_status(exporter, ExporterStatusValue::Available)
        .await;
    (lab, client, running)
}

/// The lease the command's `echo "lease=$JMP_LEASE"` named on stdout.
fn lease_echoed(stdout: &str) -> String {
    stdout
        .split("lease=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_default()
        .to_string()
}

/// The lines of `stderr` about the end, with the lease name and the times made stable.
fn end_lines(stderr: &str, lease: &str) -> String {
    let mut out = Vec::new();
    for line in stderr.lines().filter(|l| l.contains("ended")) {
        let mut line = line.replace(lease, "LEASE");
        while let Some(i) = line.find("ended at 20") {
            let start = i + "ended at ".len();
            // `2026-12-01 23:40:05 +00:00`
            let end = (start + 26).min(line.len());
            line.replace_range(start..end, "TIME");
        }
        out.push(line);
    }
    out.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ends_under_the_command_is_announced_and_has_its_own_exit_code() {
    let (lab, client, _exporter) = lab_with_board("ex-end", "end", "ender").await;

    // `j` works during the lease; after its end (a bounded wait) it fails with "the lease
    // ended", which the script passes on before exiting 3.
    let child = shell(
        &lab,
        &client,
        &["-l", "board=end", "--duration", "3s"],
        "echo \"lease=$JMP_LEASE\"; j power on || exit 9; sleep 3; \
         for i in $(seq 60); do \
           if j power on 2>j.err; then sleep 0.5; continue; fi; \
           grep -q 'lease ended' j.err && break; sleep 0.5; \
         done; cat j.err >&2; exit 3",
    );
    let (code, stdout, stderr) = finish(child).await;
    let lease = lease_echoed(&stdout);
    assert!(!lease.is_empty(), "{stdout}{stderr}");
    assert_eq!(code, 75, "{stdout}{stderr}");
    assert!(!stderr.contains("transport error"), "{stderr}");
    // The router closing the tunnel is the lease's end, not a lost connection: no warning.
    assert!(!stderr.contains("Lost the connection"), "{stderr}");
    insta::assert_snapshot!(end_lines(&stderr, &lease), @r"
    Lease LEASE ended at TIME: its duration of 3s ran out
    Error: GetReport: the lease ended (lease LEASE ended at TIME: its duration of 3s ran out) (gRPC code UNAVAILABLE)
    Lease LEASE ended while the command ran (its duration of 3s ran out); exiting with 75 (the command's own exit code was 3)
    ");
    // The exporter is free again, and the client has no active lease: an empty listing
    // says so, as upstream's.
    lab.wait_status("ex-end", ExporterStatusValue::Available)
        .await;
    let out = lab
        .cmd(JMP)
        .args(["get", "leases", "--client-config"])
        .arg(&client)
        .output()
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "No resources found.\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The lease of an idle command runs out: the exporter closes its side of the tunnel the
/// shell keeps open (the exporter's log stream), the router fails ours, usually a moment before
/// the shell's status check sees the end. That is the lease's end, said once, not a lost
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_runs_out_under_an_idle_command_is_no_lost_connection() {
    let (lab, client, _exporter) = lab_with_board("ex-idle", "idle", "idler").await;
    let child = shell(
        &lab,
        &client,
        &["-l", "board=idle", "--duration", "3s"],
        "echo \"lease=$JMP_LEASE\"; j power on || exit 9; sleep 7; exit 3",
    );
    let (code, stdout, stderr) = finish(child).await;
    let lease = lease_echoed(&stdout);
    assert!(!lease.is_empty(), "{stdout}{stderr}");
    assert_eq!(code, 75, "{stdout}{stderr}");
    assert!(!stderr.contains("Lost the connection"), "{stderr}");
    insta::assert_snapshot!(end_lines(&stderr, &lease), @r"
    Lease LEASE ended at TIME: its duration of 3s ran out
    Lease LEASE ended while the command ran (its duration of 3s ran out); exiting with 75 (the command's own exit code was 3)
    ");
}

/// `jmp delete lease` from elsewhere while the command runs: the router fails the tunnel at
/// once, and the lost tunnel has the shell check its lease, which has ended: the end is said,
/// no lost connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_deleted_under_the_command_is_no_lost_connection() {
    let (lab, client, _exporter) = lab_with_board("ex-del", "del", "deleter").await;
    // Idle long enough for the shell's periodic check (every 10s) to see the end too.
    let mut child = shell(
        &lab,
        &client,
        &["-l", "board=del", "--duration", "10m"],
        "j power on || exit 9; echo \"$JMP_LEASE\" > lease.txt; sleep 12; exit 3",
    );
    for _ in 0..600 {
        if !lab.log("lease.txt").trim().is_empty() {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the shell exited ({status}) before its command started");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let lease = lab.log("lease.txt").trim().to_string();
    assert!(!lease.is_empty(), "the command never wrote its lease");
    let out = lab
        .cmd(JMP)
        .args(["delete", "lease", &lease, "--client-config"])
        .arg(&client)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 75, "{stdout}{stderr}");
    assert!(!stderr.contains("Lost the connection"), "{stderr}");
    // Said once, while the command ran.
    assert_eq!(
        stderr.matches(&format!("Lease {lease} ended at")).count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("Lease {lease} ended while the command ran")),
        "{stderr}"
    );
}
