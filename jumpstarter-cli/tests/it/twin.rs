//! One exporter identity started twice: the second process is refused at once with the
//! reason, and stopping it (or the first) leaves the exporter's state and leases right.

use std::time::Duration;

use jumpstarter_controller::objects::ExporterStatusValue;
use tokio::process::Child;

use crate::distributed::{Lab, finish, lab, shell};

fn terminate(child: &Child) {
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
}

async fn exited(child: &mut Child, lab: &Lab, log: &str) -> Option<i32> {
    tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap_or_else(|_| panic!("the exporter did not stop; log:\n{}", lab.log(log)))
        .unwrap()
        .code()
}

async fn wait_log(lab: &Lab, log: &str, text: &str) -> String {
    for _ in 0..300 {
        let l = lab.log(log);
        if let Some(line) = l.lines().find(|l| l.contains(text)) {
            return line.to_string();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{text:?} never appeared in {log}:\n{}", lab.log(log));
}

/// The refusal line with the port, times and log prefix made stable.
fn stable(line: &str) -> String {
    let line = &line[line.find("ERROR").unwrap_or(0)..];
    let mut out = line.to_string();
    for host in ["127.0.0.1:", "localhost:"] {
        let mut done = String::new();
        let mut rest = out.as_str();
        while let Some(i) = rest.find(host) {
            done.push_str(&rest[..i + host.len()]);
            rest = rest[i + host.len()..].trim_start_matches(|c: char| c.is_ascii_digit());
            done.push_str("PORT");
        }
        done.push_str(rest);
        out = done;
    }
    match (out.find(" since "), out.find(" UTC)")) {
        (Some(a), Some(b)) if a < b => out.replace_range(a + " since ".len()..b + 4, "TIME"),
        _ => {}
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_of_one_exporter_is_refused_and_takes_nothing_offline() {
    let lab = lab().await;
    let cfg = lab.exporter("twin", &[("twin", "1")]).await;
    let client = lab.client("tess").await;
    let mut first = lab.run_exporter(&cfg, "twin.log");
    lab.wait_status("twin", ExporterStatusValue::Available)
        .await;

    let mut second = lab.run_exporter(&cfg, "twin-2.log");
    let line = wait_log(&lab, "twin-2.log", "is already online").await;
    insta::assert_snapshot!(stable(&line), @"ERROR exporter default/twin is already online (connected from 127.0.0.1:PORT since TIME); stop that one first (controller localhost:PORT). This process keeps trying for 75 s (in case that is a connection of an earlier run whose host went down), then stops.");

    // Stopping the second process changes nothing: the first still serves leases.
    terminate(&second);
    exited(&mut second, &lab, "twin-2.log").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    lab.wait_status("twin", ExporterStatusValue::Available)
        .await;
    let (code, stdout, stderr) =
        finish(shell(&lab, &client, &["-l", "twin=1"], "j power on")).await;
    assert_eq!(code, 0, "{stdout}{stderr}\n{}", lab.log("twin.log"));

    // A second process while a lease is held leaves the lease alone too.
    let held = shell(
        &lab,
        &client,
        &["-l", "twin=1"],
        "j power on && sleep 4 && j power off",
    );
    lab.wait_status("twin", ExporterStatusValue::LeaseReady)
        .await;
    let mut third = lab.run_exporter(&cfg, "twin-3.log");
    wait_log(&lab, "twin-3.log", "is already online").await;
    terminate(&third);
    exited(&mut third, &lab, "twin-3.log").await;
    let (code, stdout, stderr) = finish(held).await;
    assert_eq!(code, 0, "{stdout}{stderr}\n{}", lab.log("twin.log"));

    // Once the first stops, the exporter is offline, and a new process takes over.
    terminate(&first);
    assert_eq!(exited(&mut first, &lab, "twin.log").await, Some(0));
    lab.wait_status("twin", ExporterStatusValue::Offline).await;
    let _fourth = lab.run_exporter(&cfg, "twin-4.log");
    lab.wait_status("twin", ExporterStatusValue::Available)
        .await;
    let (code, stdout, stderr) =
        finish(shell(&lab, &client, &["-l", "twin=1"], "j power on")).await;
    assert_eq!(code, 0, "{stdout}{stderr}\n{}", lab.log("twin-4.log"));
}
