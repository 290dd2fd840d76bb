//! Label selectors end to end: an unknown operator in a match expression is an error that
//! names it, never a selector that matches nothing.

use jumpstarter_controller::{
    objects::{ExporterAccessPolicy, ExporterStatusValue},
    store::Store,
};

use crate::distributed::{finish, lab, shell};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_with_an_unknown_operator_fails_the_lease_naming_the_operator() {
    let lab = lab().await;
    let cfg = lab.exporter("sel1", &[("board", "sel1")]).await;
    let client = lab.client("alice").await;
    // A policy stored with an operator the API server does not know (a Kubernetes store
    // takes it as written): its exporter selector would match `sel1`.
    let mut policy: ExporterAccessPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "jumpstarter.dev/v1alpha1",
        "kind": "ExporterAccessPolicy",
        "metadata": {"name": "typo"},
        "spec": {
            "exporterSelector": {
                "matchExpressions": [{"key": "board", "operator": "Equals", "values": ["sel1"]}]
            },
            "policies": [{"priority": 1, "from": [{"clientSelector": {}}]}]
        }
    }))
    .unwrap();
    policy.metadata.namespace = Some("default".into());
    lab.ctl().state.store.create(&policy).await.unwrap();
    let _exporter = lab.run_exporter(&cfg, "sel1.log");
    lab.wait_status("sel1", ExporterStatusValue::Available)
        .await;
    let (code, stdout, stderr) =
        finish(shell(&lab, &client, &["-l", "board=sel1"], "echo ran")).await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(!stdout.contains("ran"), "{stdout}");
    assert!(
        stderr.contains("ExporterAccessPolicy default/typo")
            && stderr.contains("\"Equals\" is not a valid label selector operator"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_with_an_unknown_operator_is_refused_naming_it() {
    let lab = lab().await;
    let client = lab.client("bob").await;
    let out = lab
        .cmd(crate::JMP)
        .args(["get", "exporters", "--client-config"])
        .arg(&client)
        .args(["-l", "board>3"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "invalid label selector \"board>3\" at position 5: operator '>' after key \"board\" \
             is not supported in label selectors"
        ),
        "{stderr}"
    );
    let (code, stdout, stderr) =
        finish(shell(&lab, &client, &["-l", "board ~ rpi"], "echo ran")).await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.contains("'~'"), "{stderr}");
}
