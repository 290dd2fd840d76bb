//! `AdminService.Apply` and the ExporterSet/VirtualTargetClass RPCs on the Kubernetes store
//! (the in-memory fake API server): objects land as the CRDs' resources, a created client's
//! token is in its credential Secret, re-applying changes nothing, and a bad document among
//! good ones writes nothing. On the SQLite store: only the admin token applies or reads them.
//! (`jumpstarter-cli`'s `pools_admin` tests run the rest through `jmp admin` on SQLite.)

use jumpstarter_controller::{
    ControllerConfig,
    objects::{
        Exporter,
        virtualtarget::{ExporterSet, VirtualTargetClass},
    },
    start_with_store,
    store::{KubeStore, Store, credentials},
    testing::FakeApiServer,
};
use jumpstarter_proto::admin_v1::{
    ApplyRequest, ListRequest, admin_service_client::AdminServiceClient,
};

use crate::admin::{admin_req, obj};

const DOCS: [&str; 3] = [
    "apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: VirtualTargetClass
metadata: {name: local}
spec: {provisioner: local}
",
    "apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata: {name: mock-pool}
spec:
  virtualTargetClassName: local
  maxReplicas: 3
  selector: {matchLabels: {pool: mock}}
  template:
    metadata: {labels: {pool: mock}}
    spec:
      drivers: [{name: power, type: jumpstarter_driver_power.driver.MockPower}]
",
    "apiVersion: jumpstarter.dev/v1alpha1
kind: Client
metadata: {name: alice}
",
];

fn apply(docs: &[String]) -> ApplyRequest {
    ApplyRequest {
        documents: docs.to_vec(),
        namespace: String::new(),
    }
}

#[tokio::test]
async fn apply_on_the_kubernetes_store() {
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApiServer::new();
    let store = KubeStore::new(api.client()).with_watch_timeout(5);
    let ctl = start_with_store(
        ControllerConfig {
            credential_secrets: true,
            ..ControllerConfig::loopback(dir.path().join("data"))
        },
        store.clone(),
    )
    .await
    .unwrap();
    let ch = crate::tls_channel(&ctl).await;
    let token = ctl.admin_token.clone();
    let mut admin = AdminServiceClient::new(ch);
    let docs: Vec<String> = DOCS.iter().map(|d| d.to_string()).collect();

    let out = admin
        .apply(admin_req(&token, apply(&docs)))
        .await
        .unwrap()
        .into_inner();
    let actions: Vec<&str> = out.results.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(actions, ["created", "created", "created"]);
    // The client's token is the one its Secret keeps, and the note says where it is.
    let issued = out.results[2].credentials.clone().unwrap().token;
    assert_eq!(
        credentials::read_credential(&store, "default", "alice-client")
            .await
            .unwrap(),
        Some(issued)
    );
    assert!(
        out.results[2].note.contains("Secret alice-client"),
        "{:?}",
        out.results[2]
    );
    // The objects are the CRDs' resources.
    let set: ExporterSet = store.get("default", "mock-pool").await.unwrap().unwrap();
    assert_eq!(set.spec.max_replicas, Some(3));
    let class: Option<VirtualTargetClass> = store.get("default", "local").await.unwrap();
    assert!(class.is_some());

    // Again: unchanged; a new ceiling: configured.
    let out = admin
        .apply(admin_req(&token, apply(&docs)))
        .await
        .unwrap()
        .into_inner();
    let actions: Vec<&str> = out.results.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(actions, ["unchanged", "unchanged", "unchanged"]);
    assert!(out.results[2].credentials.is_none());
    let mut raised = docs.clone();
    raised[1] = raised[1].replace("maxReplicas: 3", "maxReplicas: 5");
    let out = admin
        .apply(admin_req(&token, apply(&raised)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.results[1].action, "configured");
    let got = admin
        .get_exporter_set(admin_req(&token, obj("mock-pool")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((got.max_replicas, got.selector.as_str()), (5, "pool=mock"));

    // An exporter's own labels (reported at registration) and the pool engine's annotations
    // stay when its document is applied again without them.
    let exporter = "apiVersion: jumpstarter.dev/v1alpha1
kind: Exporter
metadata: {name: board, labels: {board: rpi4}}
"
    .to_string();
    let out = admin
        .apply(admin_req(&token, apply(std::slice::from_ref(&exporter))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.results[0].action, "created");
    assert!(out.results[0].credentials.is_some());
    let mut e: Exporter = store.get("default", "board").await.unwrap().unwrap();
    e.metadata
        .labels
        .get_or_insert_default()
        .insert("jumpstarter.dev/name".into(), "board".into());
    // The pool engine's annotation stays too; one a person added by hand goes, as the
    // document does not carry it.
    let annotations = e.metadata.annotations.get_or_insert_default();
    annotations.insert(
        "virtualtarget.jumpstarter.dev/retiring".into(),
        "scaled down".into(),
    );
    annotations.insert("note".into(), "by hand".into());
    store.update(&e).await.unwrap();
    let relabelled = exporter.replace("board: rpi4", "board: rpi5");
    let out = admin
        .apply(admin_req(&token, apply(&[relabelled])))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.results[0].action, "configured");
    let e: Exporter = store.get("default", "board").await.unwrap().unwrap();
    let labels = e.metadata.labels.unwrap();
    assert_eq!(labels["board"], "rpi5");
    assert_eq!(labels["jumpstarter.dev/name"], "board");
    let annotations = e.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get("virtualtarget.jumpstarter.dev/retiring")
            .map(String::as_str),
        Some("scaled down")
    );
    assert!(!annotations.contains_key("note"), "{annotations:?}");

    // A bad document among good ones: nothing is written, the document is named.
    let mut bad = vec![DOCS[0].replace("name: local", "name: other")];
    bad.push(
        DOCS[1]
            .replace("mock-pool", "bad-pool")
            .replace("maxReplicas: 3", "maxReplicas: -1"),
    );
    let e = admin
        .apply(admin_req(&token, apply(&bad)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message()
            .starts_with("document 2 (ExporterSet bad-pool): spec.maxReplicas"),
        "{}",
        e.message()
    );
    let classes = admin
        .list_virtual_target_classes(admin_req(&token, ListRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .classes;
    let names: Vec<&str> = classes.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["local"]);

    // A class in use stays; the set goes, then the class.
    let e = admin
        .delete_virtual_target_class(admin_req(&token, obj("local")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    admin
        .delete_exporter_set(admin_req(&token, obj("mock-pool")))
        .await
        .unwrap();
    admin
        .delete_virtual_target_class(admin_req(&token, obj("local")))
        .await
        .unwrap();
    let sets = admin
        .list_exporter_sets(admin_req(&token, ListRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .exporter_sets;
    assert!(sets.is_empty());
    ctl.shutdown().await;
}

#[tokio::test]
async fn only_the_admin_token_applies_or_reads_pools() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = jumpstarter_controller::start(ControllerConfig::loopback(dir.path().join("data")))
        .await
        .unwrap();
    let ch = crate::tls_channel(&ctl).await;
    let token = ctl.admin_token.clone();
    let mut admin = AdminServiceClient::new(ch);
    let alice = crate::admin::create_client(&mut admin, &token, "alice", &[])
        .await
        .unwrap();
    let docs: Vec<String> = DOCS[..2].iter().map(|d| d.to_string()).collect();
    for (who, code) in [
        (alice.token.as_str(), tonic::Code::PermissionDenied),
        ("not-a-token", tonic::Code::Unauthenticated),
    ] {
        let e = admin.apply(admin_req(who, apply(&docs))).await.unwrap_err();
        assert_eq!(e.code(), code, "{}", e.message());
        let e = admin
            .list_exporter_sets(admin_req(who, ListRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{}", e.message());
        let e = admin
            .delete_virtual_target_class(admin_req(who, obj("local")))
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{}", e.message());
    }
    // Nothing was written; the admin token then applies on this (SQLite) store.
    let sets = admin
        .list_exporter_sets(admin_req(&token, ListRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .exporter_sets;
    assert!(sets.is_empty());
    let out = admin
        .apply(admin_req(&token, apply(&docs)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.results.len(), 2);
    assert!(out.results.iter().all(|r| r.action == "created"));
    let got = admin
        .get_exporter_set(admin_req(&token, obj("mock-pool")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.virtual_target_class_name, "local");
    ctl.shutdown().await;
}
