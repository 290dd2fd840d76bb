//! A lease that ends under `jmp shell`: the shell says when and why, `j` says "the lease
//! ended" with gRPC code UNAVAILABLE, and `jmp shell` exits with its own code (75).

use jumpstarter_controller::objects::ExporterStatusValue;

use crate::{
    JMP,
    distributed::{finish, lab, shell},
};

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
    let lab = lab().await;
    let exporter_cfg = lab.exporter("ex-end", &[("board", "end")]).await;
    let client = lab.client("ender").await;
    let _exporter = lab.run_exporter(&exporter_cfg, "ex-end.log");
    lab.wait_status("ex-end", ExporterStatusValue::Available)
        .await;

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
    let lease = stdout
        .split("lease=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_default()
        .to_string();
    assert!(!lease.is_empty(), "{stdout}{stderr}");
    assert_eq!(code, 75, "{stdout}{stderr}");
    assert!(!stderr.contains("transport error"), "{stderr}");
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
