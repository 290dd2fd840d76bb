//! The Kubernetes store against a real `kube-apiserver` (ignored unless asked for; `cargo xtask
//! kube-e2e` starts one with `cargo xtask kube-up` and runs these). `KUBECONFIG` is the
//! cluster's admin; `JMP_TEST_CONTROLLER_KUBECONFIG` authenticates as the controller's
//! ServiceAccount, bound to the ClusterRole of `deploy/kubernetes/base/rbac.yaml`, so every
//! test that writes as the controller also checks that the role grants what it needs.

use std::time::Duration;

use jumpstarter_controller::{
    objects::{Client, ClientSpec, Exporter},
    store::{KubeStore, Store, credentials},
    testing::internals::{
        EventRecorder, EventType, ExporterEvent, LeaderConfig, LeaderElector, reasons,
    },
};
use k8s_openapi::api::core::v1::{Event, Namespace};

use crate::kube_store::{exporter, lease_goes_pending_then_ready};

/// The namespace `kube-up` creates for the controller (as `deploy/kubernetes/base`).
const NAMESPACE: &str = "jumpstarter";

/// One test at a time: each runs reconcile passes over every namespace, which would also act
/// on the other tests' objects.
pub(crate) static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub(crate) fn suffix() -> String {
    format!("-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

pub(crate) async fn client_from(var: &str) -> kube::Client {
    let path = std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} must name a kubeconfig of a real cluster (cargo xtask kube-e2e sets it)")
    });
    let kubeconfig =
        kube::config::Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("{var}={path}: {e}"));
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The store as the controller's ServiceAccount.
async fn controller_store() -> KubeStore {
    KubeStore::new(client_from("JMP_TEST_CONTROLLER_KUBECONFIG").await).with_watch_timeout(30)
}

/// The cluster's admin.
pub(crate) async fn admin_client() -> kube::Client {
    client_from("KUBECONFIG").await
}

#[tokio::test]
#[ignore = "needs a real API server: cargo xtask kube-e2e runs it"]
async fn real_lease_flow_pending_to_ready_as_the_controller() {
    let _serial = SERIAL.lock().await;
    let store = controller_store().await;
    lease_goes_pending_then_ready(store, NAMESPACE, &suffix()).await;
}

#[tokio::test]
#[ignore = "needs a real API server: cargo xtask kube-e2e runs it"]
async fn real_conflicts_secrets_and_deletes_as_the_controller() {
    let _serial = SERIAL.lock().await;
    let store = controller_store().await;
    let name = format!("conflict{}", suffix());
    let mut e = exporter(&name, &[]);
    e.metadata.namespace = Some(NAMESPACE.into());
    let created = store.create(&e).await.unwrap();
    let mut a = created.clone();
    a.spec.enabled = Some(false);
    let updated = store.update(&a).await.unwrap();
    let mut stale = created.clone();
    stale.spec.username = Some("x".into());
    assert!(store.update(&stale).await.unwrap_err().is_conflict());
    credentials::put_credential(&store, &created, "tok")
        .await
        .unwrap();
    let secret_name = credentials::secret_name(&created);
    assert_eq!(
        credentials::read_credential(&store, NAMESPACE, &secret_name)
            .await
            .unwrap()
            .as_deref(),
        Some("tok")
    );
    // A stale version is refused and deletes nothing.
    let err = store
        .delete::<Exporter>(
            NAMESPACE,
            &name,
            created.metadata.resource_version.as_deref(),
        )
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    // The server answers these deletes with Status{Success}: the store still returns the
    // object as it was deleted.
    let deleted = store
        .delete::<Exporter>(NAMESPACE, &name, None)
        .await
        .unwrap();
    assert_eq!(deleted.metadata.uid, updated.metadata.uid);
    assert_eq!(deleted.spec.enabled, Some(false));
    let secret = store
        .delete::<k8s_openapi::api::core::v1::Secret>(NAMESPACE, &secret_name, None)
        .await
        .unwrap();
    assert_eq!(secret.metadata.name.as_deref(), Some(secret_name.as_str()));
    assert!(
        store
            .delete::<Exporter>(NAMESPACE, &name, None)
            .await
            .unwrap_err()
            .is_not_found()
    );

    // `jmp admin delete client NAME --delete`: the Client and its credential Secret.
    let mut c = Client::new(&format!("alice{}", suffix()), ClientSpec::default());
    c.metadata.namespace = Some(NAMESPACE.into());
    let c = store.create(&c).await.unwrap();
    credentials::put_credential(&store, &c, "t").await.unwrap();
    let gone = store
        .delete::<Client>(NAMESPACE, c.metadata.name.as_deref().unwrap(), None)
        .await
        .unwrap();
    assert_eq!(gone.metadata.uid, c.metadata.uid);
    store
        .delete::<k8s_openapi::api::core::v1::Secret>(
            NAMESPACE,
            &credentials::secret_name(&c),
            None,
        )
        .await
        .unwrap();
}

/// Events with an `eventTime` are accepted (they used to be refused with 422 for lack of
/// `action` and `reportingInstance`).
#[tokio::test]
#[ignore = "needs a real API server: cargo xtask kube-e2e runs it"]
async fn real_exporter_events_are_accepted() {
    let _serial = SERIAL.lock().await;
    let store = controller_store().await;
    let name = format!("evt{}", suffix());
    let mut e = exporter(&name, &[]);
    e.metadata.namespace = Some(NAMESPACE.into());
    let e = store.create(&e).await.unwrap();
    let recorder = EventRecorder::kubernetes(store.client().clone());
    let long = "x".repeat(3000);
    recorder.record(
        &e,
        &ExporterEvent {
            type_: EventType::Warning,
            reason: reasons::OFFLINE,
            message: format!("Exporter reported offline (graceful shutdown): message={long}"),
        },
    );
    recorder.record(
        &e,
        &ExporterEvent {
            type_: EventType::Normal,
            reason: reasons::ONLINE,
            message: "Exporter is online".into(),
        },
    );
    // Listing events is the admin's (the controller only writes them).
    let events: kube::Api<Event> = kube::Api::namespaced(admin_client().await, NAMESPACE);
    let selector = format!("involvedObject.name={name}");
    let mut found = Vec::new();
    for _ in 0..100 {
        found = events
            .list(&kube::api::ListParams::default().fields(&selector))
            .await
            .unwrap()
            .items;
        if found.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut reasons_found: Vec<_> = found
        .iter()
        .map(|e| e.reason.clone().unwrap_or_default())
        .collect();
    reasons_found.sort();
    assert_eq!(
        reasons_found,
        [reasons::OFFLINE, reasons::ONLINE],
        "events posted (see the controller log for refusals): {found:?}"
    );
    assert_eq!(recorder.dropped(), 0);
    store
        .delete::<Exporter>(NAMESPACE, &name, None)
        .await
        .unwrap();
}

/// RBAC is on (the ServiceAccount may not do what the role does not grant) and the role
/// grants leader election.
#[tokio::test]
#[ignore = "needs a real API server: cargo xtask kube-e2e runs it"]
async fn real_rbac_is_enforced_and_leader_election_works_as_the_controller() {
    let _serial = SERIAL.lock().await;
    let store = controller_store().await;
    let namespaces: kube::Api<Namespace> = kube::Api::all(store.client().clone());
    match namespaces.list(&kube::api::ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("listing namespaces must be forbidden to the controller: {other:?}"),
    }
    let mut config = LeaderConfig::new(NAMESPACE);
    config.name = format!("e2e-leader{}", suffix());
    let mut first = LeaderElector::new(store.clone(), config.clone()).unwrap();
    assert!(first.try_acquire_or_renew().await.unwrap());
    let mut other_config = config.clone();
    other_config.identity = format!("other{}", suffix());
    let mut second = LeaderElector::new(store.clone(), other_config).unwrap();
    assert!(!second.try_acquire_or_renew().await.unwrap());
    first.release().await.unwrap();
    assert!(second.try_acquire_or_renew().await.unwrap());
    second.release().await.unwrap();
}

/// Objects as upstream's samples write them (YAML applied through the API, not built with
/// our types): our controller reads them, schedules the Lease under the access policy and
/// writes the statuses.
#[tokio::test]
#[ignore = "needs a real API server: cargo xtask kube-e2e runs it"]
async fn real_upstream_style_objects_are_read_and_scheduled() {
    let _serial = SERIAL.lock().await;
    use jumpstarter_controller::{
        objects::{ExporterAccessPolicy, Lease},
        reconcile_once,
    };
    use kube::api::{DynamicObject, Patch, PatchParams};
    use kube::discovery::ApiResource;

    let s = suffix();
    let namespace = NAMESPACE;
    let yaml = format!(
        r#"
apiVersion: jumpstarter.dev/v1alpha1
kind: Client
metadata:
  name: client-sample{s}
  labels:
    team: qa{s}
spec:
  username: "internal:client-sample"
---
apiVersion: jumpstarter.dev/v1alpha1
kind: Exporter
metadata:
  name: exporter-sample{s}
  labels:
    example.com/board: rpi4{s}
spec:
  username: "internal:exporter-sample"
---
apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterAccessPolicy
metadata:
  name: policy-sample{s}
spec:
  exporterSelector:
    matchLabels:
      example.com/board: rpi4{s}
  policies:
    - priority: 10
      from:
        - clientSelector:
            matchLabels:
              team: qa{s}
      maximumDuration: 2h
---
apiVersion: jumpstarter.dev/v1alpha1
kind: Lease
metadata:
  name: lease-sample{s}
spec:
  clientRef:
    name: client-sample{s}
  duration: 1h
  selector:
    matchLabels:
      example.com/board: rpi4{s}
"#
    );
    let admin = admin_client().await;
    for doc in yaml.split("\n---\n") {
        let obj: DynamicObject = serde_saphyr::from_str(doc).unwrap();
        let types = obj.types.clone().unwrap();
        let (group, version) = types.api_version.split_once('/').unwrap();
        let plural = format!("{}s", types.kind.to_lowercase()).replace("policys", "policies");
        let ar = ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: types.api_version.clone(),
            kind: types.kind.clone(),
            plural,
        };
        let api: kube::Api<DynamicObject> =
            kube::Api::namespaced_with(admin.clone(), namespace, &ar);
        let name = obj.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("upstream-samples"),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {} {name}: {e}", types.kind));
    }

    // The controller (as its ServiceAccount) reads them with its own types.
    let store = controller_store().await;
    let policy: ExporterAccessPolicy = store
        .get(namespace, &format!("policy-sample{s}"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(policy.spec.policies[0].priority, 10);
    // The exporter comes online and registers, as `jmp run` would make the controller write.
    let mut e: Exporter = store
        .get(namespace, &format!("exporter-sample{s}"))
        .await
        .unwrap()
        .unwrap();
    e.status = Some(jumpstarter_controller::objects::ExporterStatus {
        last_seen: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        )),
        devices: Some(vec![]),
        ..Default::default()
    });
    store.update_status(&e).await.unwrap();

    let state = jumpstarter_controller::testing::state_with_new_keys(store.clone());
    let lease_name = format!("lease-sample{s}");
    let mut assigned = None;
    for _ in 0..20 {
        reconcile_once(&state).await.unwrap();
        let l: Lease = store.get(namespace, &lease_name).await.unwrap().unwrap();
        if let Some(x) = l.assigned_exporter() {
            assigned = Some(x.to_owned());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(assigned, Some(format!("exporter-sample{s}")));
    let e: Exporter = store
        .get(namespace, &format!("exporter-sample{s}"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        e.status.and_then(|st| st.lease_ref).map(|r| r.name),
        Some(lease_name.clone())
    );
    for (kind, name) in [
        ("lease", lease_name),
        ("policy", format!("policy-sample{s}")),
        ("exporter", format!("exporter-sample{s}")),
        ("client", format!("client-sample{s}")),
    ] {
        let r = match kind {
            "lease" => store
                .delete::<Lease>(namespace, &name, None)
                .await
                .map(drop),
            "policy" => store
                .delete::<ExporterAccessPolicy>(namespace, &name, None)
                .await
                .map(drop),
            "exporter" => store
                .delete::<Exporter>(namespace, &name, None)
                .await
                .map(drop),
            _ => store
                .delete::<Client>(namespace, &name, None)
                .await
                .map(drop),
        };
        r.unwrap();
    }
}
