//! The real `jumpstarter-controller` binary: killed with SIGKILL while holding an active and a
//! pending lease, restarted on the same data directory, everything is still there and the
//! old credentials still work.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use jumpstarter_core::{
    auth::ObjectKind,
    client::{ConnectOptions, SessionChannel, connect_channel},
    config::AdminConfig,
};
use jumpstarter_proto::{
    admin_v1::{ListRequest, admin_service_client::AdminServiceClient},
    client_v1::{ListLeasesRequest, client_service_client::ClientServiceClient},
};

use crate::{
    admin::{
        admin_req, bring_online, create_client, create_exporter, create_lease, identity, is_ready,
        wait_exporter_lease, wait_lease,
    },
    req,
};

/// A controller process, killed when dropped.
struct Controller {
    child: Child,
    grpc: String,
    metrics: String,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(data: &Path, admin_config: &Path) -> Controller {
    let mut child = Command::new(env!("CARGO_BIN_EXE_jumpstarter-controller"))
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(data)
        .arg("--admin-config")
        .arg(admin_config)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stderr).lines();
        for line in lines.by_ref() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.strip_prefix(jumpstarter_controller::cli::READY_LINE_PREFIX) {
                let _ = tx.send(rest.to_string());
                break;
            }
            let _ = tx.send(format!("other: {line}"));
        }
        // Keep draining so the child never blocks on a full pipe.
        for _ in lines {}
    });
    let mut seen = Vec::new();
    let ready = loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) if l.starts_with("other: ") => seen.push(l),
            Ok(l) => break l,
            Err(_) => panic!("controller did not report ready; stderr: {seen:?}"),
        }
    };
    let field = |k: &str| {
        ready
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k}= in {ready:?}"))
            .to_string()
    };
    Controller {
        grpc: field("grpc"),
        metrics: field("metrics"),
        child,
    }
}

async fn channel(cfg: &AdminConfig) -> SessionChannel {
    connect_channel(
        &cfg.endpoint,
        &ConnectOptions {
            insecure: false,
            passphrase: None,
            ca_pem: cfg.ca_pem().unwrap().map(String::into_bytes),
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn binary_survives_kill_9_with_leases_intact() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let admin_path = dir.path().join("admin.yaml");

    let ctl = spawn(&data, &admin_path);
    let cfg = AdminConfig::load(&admin_path).unwrap();
    assert!(
        cfg.endpoint
            .ends_with(&format!(":{}", ctl.grpc.rsplit(':').next().unwrap()))
    );
    assert_ne!(ctl.metrics, "off");
    let ch = channel(&cfg).await;
    let mut admin = AdminServiceClient::new(ch.clone());
    let alice = identity(
        ObjectKind::Client,
        &create_client(&mut admin, &cfg.token, "alice", &[])
            .await
            .unwrap(),
    );
    let ex = identity(
        ObjectKind::Exporter,
        &create_exporter(&mut admin, &cfg.token, "ex", &[("k", "v")])
            .await
            .unwrap(),
    );
    let status = bring_online(&ch, &ex).await;
    let active = create_lease(&ch, &alice, "k=v").await;
    let active = wait_lease(&ch, &alice, &active.name, is_ready).await;
    // The exporter's leaseRef is written just after the lease's Ready condition.
    wait_exporter_lease(
        &mut admin,
        &cfg.token,
        "ex",
        active.name.rsplit('/').next().unwrap(),
    )
    .await;
    let pending = create_lease(&ch, &alice, "k=v").await;
    drop(status);
    drop(admin);
    drop(ch);

    // SIGKILL: no chance to flush or say goodbye.
    drop(ctl);

    let ctl = spawn(&data, &admin_path);
    let cfg2 = AdminConfig::load(&admin_path).unwrap();
    assert_eq!(cfg2.token, cfg.token, "the admin token is kept");
    assert_eq!(cfg2.tls.ca, cfg.tls.ca, "the CA is kept");
    assert!(
        cfg2.endpoint
            .ends_with(&format!(":{}", ctl.grpc.rsplit(':').next().unwrap()))
    );
    let ch = channel(&cfg2).await;
    let mut admin = AdminServiceClient::new(ch.clone());
    let clients = admin
        .list_clients(admin_req(&cfg2.token, ListRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .clients;
    assert_eq!(clients.len(), 1);
    let exporters = admin
        .list_exporters(admin_req(&cfg2.token, ListRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .exporters;
    assert_eq!(exporters.len(), 1);
    assert_eq!(exporters[0].lease, active.name.rsplit('/').next().unwrap());

    // The old client token (signing key kept) sees both leases as they were.
    let leases = ClientServiceClient::new(ch.clone())
        .list_leases(req(
            &alice,
            ListLeasesRequest {
                parent: "namespaces/default".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .leases;
    assert_eq!(leases.len(), 2);
    let a = leases.iter().find(|l| l.name == active.name).unwrap();
    assert!(is_ready(a));
    assert_eq!(a.exporter, active.exporter);
    assert_eq!(a.effective_begin_time, active.effective_begin_time);
    let p = leases.iter().find(|l| l.name == pending.name).unwrap();
    assert!(!is_ready(p));
    assert!(p.exporter.is_none());

    // The exporter reconnects with its old token and still holds the active lease.
    let _status = bring_online(&ch, &ex).await;
    let held = admin
        .get_exporter(admin_req(&cfg2.token, crate::admin::obj("ex")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.lease, active.name.rsplit('/').next().unwrap());
}
