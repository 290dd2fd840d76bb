//! `jmp shell --keep-alive`: a 3 s lease under a command that runs 8 s survives with it and
//! ends without it; an access policy's `maximumDuration` stops the extensions (said on
//! stderr) and the lease then ends under the command.

use jumpstarter_controller::{
    objects::{ExporterAccessPolicy, ExporterStatusValue},
    store::Store,
};

use crate::distributed::{finish, lab, shell};

/// Sleeps 8 s in 0.5 s steps, then drives the board: `j` fails once the lease has ended.
const SCRIPT: &str = "for i in $(seq 16); do sleep 0.5; done; j power on && echo alive";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_lease_outlives_its_duration_and_one_not_kept_ends() {
    let lab = lab().await;
    let cfg = lab.exporter("ex-ka", &[("board", "ka")]).await;
    let client = lab.client("keeper").await;
    let _exporter = lab.run_exporter(&cfg, "ex-ka.log");
    lab.wait_status("ex-ka", ExporterStatusValue::Available)
        .await;

    let (code, out, err) = finish(shell(
        &lab,
        &client,
        &["-l", "board=ka", "--duration", "3s", "--keep-alive"],
        SCRIPT,
    ))
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("alive"), "{out}{err}");
    assert_eq!(err.matches("Keeping lease").count(), 1, "said once: {err}");
    assert!(!err.contains("ended while the command ran"), "{err}");

    // Without --keep-alive the same command outlives the lease (exit code 75).
    lab.wait_status("ex-ka", ExporterStatusValue::Available)
        .await;
    let (code, out, err) = finish(shell(
        &lab,
        &client,
        &["-l", "board=ka", "--duration", "3s"],
        SCRIPT,
    ))
    .await;
    assert_eq!(code, 75, "{out}{err}");
    assert!(!out.contains("alive"), "{out}{err}");
    assert!(!err.contains("Keeping lease"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_stops_at_the_access_policys_maximum() {
    let lab = lab().await;
    let cfg = lab.exporter("ex-kamax", &[("board", "kamax")]).await;
    let client = lab.client("keeper").await;
    let mut policy: ExporterAccessPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "jumpstarter.dev/v1alpha1",
        "kind": "ExporterAccessPolicy",
        "metadata": {"name": "five-seconds"},
        "spec": {
            "exporterSelector": {"matchLabels": {"board": "kamax"}},
            "policies": [{"priority": 1, "from": [{"clientSelector": {}}], "maximumDuration": "5s"}]
        }
    }))
    .unwrap();
    policy.metadata.namespace = Some("default".into());
    lab.ctl().state.store.create(&policy).await.unwrap();
    let _exporter = lab.run_exporter(&cfg, "ex-kamax.log");
    lab.wait_status("ex-kamax", ExporterStatusValue::Available)
        .await;

    let (code, out, err) = finish(shell(
        &lab,
        &client,
        &["-l", "board=kamax", "--duration", "3s", "--keep-alive"],
        SCRIPT,
    ))
    .await;
    assert_eq!(code, 75, "{out}{err}");
    assert!(!out.contains("alive"), "{out}{err}");
    assert_eq!(
        err.matches("reached the longest duration the access policy allows")
            .count(),
        1,
        "said once: {err}"
    );
}
