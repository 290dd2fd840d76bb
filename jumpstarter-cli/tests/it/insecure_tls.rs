//! `jmp config client create --insecure-tls` and `jmp config exporter create --insecure-tls`
//! (upstream main): configs with `tls.insecure: true` and no CA, which reach a controller
//! whose certificate nothing on this machine trusts.

use std::process::Stdio;

use jumpstarter_controller::objects::ExporterStatusValue;

use crate::{JMP, distributed::lab};

/// The `token:` of a config `lab` wrote.
fn token_of(path: &std::path::Path) -> String {
    let yaml = std::fs::read_to_string(path).unwrap();
    let line = yaml.lines().find(|l| l.starts_with("token:")).unwrap();
    line["token:".len()..].trim().trim_matches('"').to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configs_created_with_insecure_tls_reach_a_controller_whose_ca_they_lack() {
    let lab = lab().await;
    let endpoint = format!("localhost:{}", lab.ctl().addr.port());
    let client_token = token_of(&lab.client("alice").await);
    let exporter_token = token_of(&lab.exporter("k1", &[("board", "k1")]).await);
    let create = |kind: &str, alias: &str, name: &str, token: &str, insecure: bool| {
        let mut c = lab.cmd(JMP);
        c.args(["config", kind, "create", alias, "--endpoint", &endpoint])
            .args(["--name", name, "--token", token]);
        if insecure {
            c.arg("--insecure-tls");
        }
        c
    };
    // Without the flag: no CA, a certificate nothing trusts, refused.
    let out = create("client", "strict", "alice", &client_token, false)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = lab
        .cmd(JMP)
        .args(["get", "exporters", "--client", "strict"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.to_lowercase().contains("certificate"), "{stderr}");

    // With it: said on stderr, written as upstream writes it, and it connects.
    let out = create("client", "lab", "alice", &client_token, true)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("Insecure TLS mode is enabled"), "{stderr}");
    let saved = std::fs::read_to_string(lab.path("config/clients/lab.yaml")).unwrap();
    assert!(saved.contains("insecure: true"), "{saved}");
    let out = create("exporter", "k1", "k1", &exporter_token, true)
        .arg("--nointeractive")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("Insecure TLS"), "{stderr}");
    let exporter_cfg = lab.path("config/exporters/k1.yaml");
    let saved = std::fs::read_to_string(&exporter_cfg).unwrap();
    assert!(saved.contains("insecure: true"), "{saved}");
    // The exporter config needs drivers to be useful; the controller accepts it as it is.
    let log = std::fs::File::create(lab.path("k1.log")).unwrap();
    let _exporter = lab
        .cmd(JMP)
        .args(["run", "--exporter", "k1"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    lab.wait_status("k1", ExporterStatusValue::Available).await;
    let out = lab
        .cmd(JMP)
        .args(["get", "exporters", "--client", "lab", "-o", "name"])
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("k1"), "{stdout}{stderr}");
}
