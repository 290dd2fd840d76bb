//! A whole controller (`server::start_with_store`) over the Kubernetes store, backed by the
//! in-memory fake API server: AdminService writes the credential Secrets, the routers come
//! from the `router` ConfigMap layout, and a lease goes from creation to Dial, where the
//! router is chosen by the exporter's labels.

use futures::StreamExt;
use jumpstarter_controller::{
    ControllerConfig, RunningController, cluster_config, start_with_store,
    store::{KubeStore, credentials},
    testing::FakeApiServer,
};
use jumpstarter_core::{auth::ObjectKind, client::SessionChannel};
use jumpstarter_proto::{
    admin_v1::admin_service_client::AdminServiceClient,
    v1::{
        DialRequest, ExporterStatus, ListenRequest, ReportStatusRequest,
        controller_service_client::ControllerServiceClient,
    },
};
use k8s_openapi::api::core::v1::ConfigMap;

use crate::admin::{
    admin_req, bring_online, create_client, create_exporter, create_lease, identity, is_ready, obj,
    wait_lease,
};
use crate::req;

const CONFIG_MAP: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: jumpstarter-controller
  namespace: default
data:
  router: |
    router-0:
      endpoint: router-0.lab.example.com:443
      labels:
        site: lab1
    router-1:
      endpoint: router-1.lab.example.com:443
      labels:
        site: lab2
"#;

async fn kube_controller(
    dir: &tempfile::TempDir,
) -> (RunningController<KubeStore>, KubeStore, SessionChannel) {
    let api = FakeApiServer::new();
    let store = KubeStore::new(api.client()).with_watch_timeout(5);
    let cm: ConfigMap = serde_saphyr::from_str(CONFIG_MAP).unwrap();
    jumpstarter_controller::store::Store::create(&store, &cm)
        .await
        .unwrap();
    let cluster = cluster_config::load(&store, "default").await.unwrap();
    assert_eq!(cluster.routers.len(), 2);
    let ctl = start_with_store(
        ControllerConfig {
            routers: Some(cluster.routers),
            credential_secrets: true,
            ..ControllerConfig::loopback(dir.path().join("data"))
        },
        store.clone(),
    )
    .await
    .unwrap();
    let ch = crate::tls_channel(&ctl).await;
    (ctl, store, ch)
}

#[tokio::test]
async fn kube_controller_keeps_secrets_and_chooses_routers_by_label() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, store, ch) = kube_controller(&dir).await;
    let token = ctl.admin_token.clone();
    let mut admin = AdminServiceClient::new(ch.clone());

    // Credentials land in the Secrets upstream's tools read.
    let alice = create_client(&mut admin, &token, "alice", &[])
        .await
        .unwrap();
    let board = create_exporter(&mut admin, &token, "board", &[("site", "lab2")])
        .await
        .unwrap();
    let secret = |name: &'static str| {
        let store = store.clone();
        async move {
            credentials::read_credential(&store, "default", name)
                .await
                .unwrap()
        }
    };
    assert_eq!(secret("alice-client").await, Some(alice.token.clone()));
    assert_eq!(secret("board-exporter").await, Some(board.token.clone()));
    let rotated = admin
        .rotate_client(admin_req(&token, obj("alice")))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(rotated.token, alice.token);
    assert_eq!(secret("alice-client").await, Some(rotated.token.clone()));

    // The lease flow over the Kubernetes store, then Dial picks router-1 (site=lab2).
    let client = identity(ObjectKind::Client, &rotated);
    let ex = identity(ObjectKind::Exporter, &board);
    let _status = bring_online(&ch, &ex).await;
    let lease = create_lease(&ch, &client, "site=lab2").await;
    let lease = wait_lease(&ch, &client, &lease.name, is_ready).await;
    let lease_name = lease.name.rsplit('/').next().unwrap().to_string();
    let mut ctl_api = ControllerServiceClient::new(ch.clone());
    let mut listen = ctl_api
        .listen(req(
            &ex,
            ListenRequest {
                lease_name: lease_name.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    ctl_api
        .report_status(req(
            &ex,
            ReportStatusRequest {
                status: ExporterStatus::LeaseReady as i32,
                message: Some("Ready for commands".into()),
                release_lease: None,
            },
        ))
        .await
        .unwrap();
    let dial = ctl_api
        .dial(req(
            &client,
            DialRequest {
                lease_name: lease_name.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dial.router_endpoint, "router-1.lab.example.com:443");
    let heard = listen.next().await.unwrap().unwrap();
    assert_eq!(heard.router_endpoint, dial.router_endpoint);

    // A token of the wrong kind is still refused by the admin API.
    let e = admin
        .rotate_client(admin_req(&alice.token, obj("alice")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    ctl.shutdown().await;
}

/// The events of `namespace` once one with `reason` is there (waits up to 10 s).
async fn events_once(
    store: &KubeStore,
    namespace: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::core::v1::Event> {
    use jumpstarter_controller::{
        LabelSelector,
        store::{ListParams, Store},
    };
    for _ in 0..200 {
        let items = store
            .list::<k8s_openapi::api::core::v1::Event>(
                Some(namespace),
                &LabelSelector::everything(),
                &ListParams::default(),
            )
            .await
            .unwrap()
            .items;
        if items.iter().any(|e| e.reason.as_deref() == Some(reason)) {
            return items;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("no {reason} event in {namespace}");
}

#[tokio::test]
async fn kube_controller_records_exporter_events_and_owns_leases_by_exporter() {
    use jumpstarter_controller::{
        objects::{Exporter, Lease},
        store::Store,
    };
    let dir = tempfile::tempdir().unwrap();
    let (ctl, store, ch) = kube_controller(&dir).await;
    let token = ctl.admin_token.clone();
    let mut admin = AdminServiceClient::new(ch.clone());
    let alice = create_client(&mut admin, &token, "alice", &[])
        .await
        .unwrap();
    let board = create_exporter(&mut admin, &token, "board", &[("site", "lab1")])
        .await
        .unwrap();
    let exporter: Exporter = store.get("default", "board").await.unwrap().unwrap();
    let uid = exporter.metadata.uid.clone().unwrap();
    let about_board = |e: &k8s_openapi::api::core::v1::Event| {
        let o = &e.involved_object;
        o.kind.as_deref() == Some("Exporter")
            && o.name.as_deref() == Some("board")
            && o.namespace.as_deref() == Some("default")
            && o.uid.as_deref() == Some(uid.as_str())
            && e.metadata.namespace.as_deref() == Some("default")
    };

    // Online: an ExporterOnline event about the Exporter in its namespace.
    let ex = identity(ObjectKind::Exporter, &board);
    let status = bring_online(&ch, &ex).await;
    let events = events_once(&store, "default", "ExporterOnline").await;
    let online: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("ExporterOnline"))
        .collect();
    assert_eq!(online.len(), 1, "{events:?}");
    assert!(about_board(online[0]), "{:?}", online[0]);
    assert_eq!(online[0].type_.as_deref(), Some("Normal"));

    // A lease gets the exporter as its controller owner once assigned.
    let client = identity(ObjectKind::Client, &alice);
    let lease = create_lease(&ch, &client, "site=lab1").await;
    let lease = wait_lease(&ch, &client, &lease.name, is_ready).await;
    let lease_name = lease.name.rsplit('/').next().unwrap().to_string();
    let mut owners = None;
    for _ in 0..200 {
        let l: Lease = store.get("default", &lease_name).await.unwrap().unwrap();
        owners = l.metadata.owner_references.clone();
        if owners.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let owners = owners.expect("the lease never got an owner reference");
    assert_eq!(owners.len(), 1, "{owners:?}");
    let owner = &owners[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str(),
            owner.controller,
            owner.block_owner_deletion
        ),
        (
            "jumpstarter.dev/v1alpha1",
            "Exporter",
            "board",
            uid.as_str(),
            Some(true),
            Some(true)
        )
    );

    // Offline (graceful shutdown): an ExporterOffline warning with the exporter's message.
    ControllerServiceClient::new(ch.clone())
        .report_status(req(
            &ex,
            ReportStatusRequest {
                status: ExporterStatus::Offline as i32,
                message: Some("shutting down".into()),
                release_lease: None,
            },
        ))
        .await
        .unwrap();
    let events = events_once(&store, "default", "ExporterOffline").await;
    let offline: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("ExporterOffline"))
        .collect();
    assert_eq!(offline.len(), 1, "{events:?}");
    assert!(about_board(offline[0]), "{:?}", offline[0]);
    assert_eq!(offline[0].type_.as_deref(), Some("Warning"));
    assert_eq!(
        offline[0].message.as_deref(),
        Some("Exporter reported offline (graceful shutdown): exporter=board message=shutting down")
    );
    // The Client owns nothing but its Secret.
    let client_events = events
        .iter()
        .filter(|e| e.involved_object.kind.as_deref() != Some("Exporter"))
        .count();
    assert_eq!(client_events, 0);
    drop(status);
    ctl.shutdown().await;
}
