//! The `qemu.jumpstarter.dev` provisioner ([`KubeProvisioner`]) against a real
//! `kube-apiserver` (ignored unless asked for: `cargo xtask kube-e2e` runs it), acting as the
//! controller's ServiceAccount, so that the ClusterRole of `deploy/kubernetes/base/rbac.yaml`
//! is checked too. No kubelet runs here: the test plays the node (as the cluster's admin): it
//! binds the Pods, writes their status as a kubelet does and finishes their graceful
//! deletion; no kube-controller-manager runs either, so the garbage collection the set's owner
//! reference asks for is checked as the reference itself (`cargo xtask kube-e2e`'s pool
//! scenario sees it collect).

use std::collections::BTreeMap;

use jumpstarter_controller::{
    objects::virtualtarget::{
        ExporterSet, LABEL_EXPORTER_SET, PROVISIONER_QEMU, VirtualTargetClass,
    },
    pools::{
        kube::{self as pods_kube, KubeProvisioner},
        provisioner::{Provisioner, ReplicaPhase, ReplicaRequest},
    },
};
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};

use crate::real_kube::{SERIAL, admin_client, client_from, suffix};

const NAMESPACE: &str = "jumpstarter";

/// The namespace's `default` ServiceAccount, which Pods without one run as and the API
/// server's ServiceAccount admission requires (kube-controller-manager makes it on a cluster;
/// none runs here).
async fn ensure_default_service_account(admin: &kube::Client) {
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    let mut sa = ServiceAccount::default();
    sa.metadata.name = Some("default".into());
    match sas.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_already_exists() => {}
        Err(e) => panic!("creating ServiceAccount default: {e}"),
    }
}

fn class() -> VirtualTargetClass {
    serde_saphyr::from_str(&format!(
        r#"
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: VirtualTargetClass
metadata:
  name: qemu-test
  namespace: {NAMESPACE}
spec:
  provisioner: {PROVISIONER_QEMU}
  scheduling:
    nodeSelector:
      kubernetes.io/arch: amd64
    resources:
      limits:
        cpu: "1"
  parameters:
    machineType: virt
    memory: 1Gi
"#
    ))
    .unwrap()
}

/// Creates ExporterSet `name` (as the admin, as `jmp admin apply` would) and returns it as
/// the API server has it (with its uid).
async fn create_set(admin: &kube::Client, name: &str) -> ExporterSet {
    let set: ExporterSet = serde_saphyr::from_str(&format!(
        r#"
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata:
  name: {name}
  namespace: {NAMESPACE}
spec:
  virtualTargetClassName: qemu-test
  parameters:
    memory: 2Gi
  selector:
    matchLabels:
      pool: {name}
  template:
    metadata:
      labels:
        pool: {name}
    spec:
      drivers:
        - name: power
          type: jumpstarter_driver_power.driver.MockPower
"#
    ))
    .unwrap();
    Api::<ExporterSet>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &set)
        .await
        .unwrap()
}

fn request(set: &ExporterSet, name: &str) -> ReplicaRequest {
    let set_name = set.metadata.name.clone().unwrap();
    ReplicaRequest {
        namespace: NAMESPACE.into(),
        name: name.into(),
        exporter_config: format!("endpoint: controller:8082\ntoken: token-of-{name}\n"),
        labels: BTreeMap::from([
            ("pool".to_string(), set_name.clone()),
            (LABEL_EXPORTER_SET.to_string(), set_name),
        ]),
        set: set.clone(),
        class: class(),
    }
}

/// Writes Pod `name`'s status as a kubelet does (merge patch of the status subresource).
async fn kubelet_reports(pods: &Api<Pod>, name: &str, status: serde_json::Value) {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await
    .unwrap();
}

/// Binds Pod `name` to a node, as the scheduler does (its deletion is then graceful).
async fn bind(admin: &kube::Client, name: &str) {
    let binding = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "real-kube-pools-node"},
    });
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    pods.create_subresource::<_, serde_json::Value>(
        "binding",
        name,
        &PostParams::default(),
        &binding,
    )
    .await
    .unwrap();
}

async fn phases(
    p: &KubeProvisioner,
    set: &ExporterSet,
) -> Vec<(String, ReplicaPhase, Option<String>)> {
    let mut v: Vec<_> = p
        .observe(set)
        .await
        .unwrap()
        .into_iter()
        .map(|o| (o.name, o.phase, o.message))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[tokio::test]
#[ignore = "needs a real API server: cargo xtask kube-e2e runs it"]
async fn real_kube_pool_replicas_are_pods_started_observed_and_stopped_as_the_controller() {
    let _serial = SERIAL.lock().await;
    let admin = admin_client().await;
    ensure_default_service_account(&admin).await;
    let provisioner = KubeProvisioner::new(client_from("JMP_TEST_CONTROLLER_KUBECONFIG").await);
    assert_eq!(provisioner.name(), PROVISIONER_QEMU);
    let set_name = format!("pool{}", suffix());
    let set = create_set(&admin, &set_name).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);

    // Bad input is refused naming the field, and nothing is created.
    let mut bad = request(&set, &format!("{set_name}-bad"));
    let mut images = bad.set.spec.images.clone().unwrap_or_default();
    images.exporter = Some(Default::default());
    images.exporter.as_mut().unwrap().image = Some(String::new());
    bad.set.spec.images = Some(images);
    let err = provisioner.start(&bad).await.unwrap_err();
    let chain = jumpstarter_core::error_chain(&err);
    assert!(chain.contains("spec.images.exporter.image"), "{chain}");
    assert!(
        secrets
            .get_opt(&pods_kube::secret_name(&bad.name))
            .await
            .unwrap()
            .is_none()
    );
    assert!(pods.get_opt(&bad.name).await.unwrap().is_none());

    // start: the Secret, then the Pod, with the layout of the module docs.
    let a = format!("{set_name}-a");
    let req = request(&set, &a);
    provisioner.start(&req).await.unwrap();
    // Again: idempotent (the Pod is ours), the Secret brought up to date.
    let mut again = req.clone();
    again.exporter_config = format!("endpoint: controller:8082\ntoken: new-token-of-{a}\n");
    provisioner.start(&again).await.unwrap();
    let pod = pods.get(&a).await.unwrap();
    let secret = secrets.get(&pods_kube::secret_name(&a)).await.unwrap();
    assert_eq!(
        secret.data.as_ref().unwrap()[pods_kube::CONFIG_KEY].0,
        again.exporter_config.as_bytes()
    );
    for (what, meta) in [("Pod", &pod.metadata), ("Secret", &secret.metadata)] {
        let owner = &meta.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "ExporterSet", "{what}");
        assert_eq!(Some(&owner.uid), set.metadata.uid.as_ref(), "{what}");
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true)),
            "{what}"
        );
        assert_eq!(
            meta.labels.as_ref().unwrap()[LABEL_EXPORTER_SET],
            set_name,
            "{what}"
        );
    }
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        spec.node_selector.as_ref().unwrap()["kubernetes.io/arch"],
        "amd64"
    );
    let runtime = &spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(runtime.name, pods_kube::RUNTIME_CONTAINER);
    assert_eq!(runtime.restart_policy.as_deref(), Some("Always"));
    assert_eq!(
        runtime.resources.as_ref().unwrap().limits.as_ref().unwrap()["cpu"].0,
        "1"
    );
    let params = runtime.env.as_ref().unwrap()[0].value.clone().unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&params).unwrap(),
        serde_json::json!({"machineType": "virt", "memory": "2Gi"})
    );
    let exporter = &spec.containers[0];
    assert_eq!(exporter.name, pods_kube::EXPORTER_CONTAINER);
    assert_eq!(
        exporter.image.as_deref(),
        Some(pods_kube::DEFAULT_EXPORTER_IMAGE)
    );
    for c in [runtime, exporter] {
        assert!(
            c.volume_mounts
                .as_ref()
                .unwrap()
                .iter()
                .any(|m| m.mount_path == pods_kube::SHARED_MOUNT),
            "{}",
            c.name
        );
        assert_eq!(
            c.security_context
                .as_ref()
                .unwrap()
                .read_only_root_filesystem,
            Some(true)
        );
    }

    // observe: no status yet is Pending; then what the node reports.
    assert_eq!(
        phases(&provisioner, &set).await,
        [(a.clone(), ReplicaPhase::Pending, None)]
    );
    bind(&admin, &a).await;
    kubelet_reports(&pods, &a, serde_json::json!({"phase": "Running"})).await;
    assert_eq!(phases(&provisioner, &set).await[0].1, ReplicaPhase::Running);
    kubelet_reports(
        &pods,
        &a,
        serde_json::json!({
            "phase": "Failed",
            "containerStatuses": [{
                "name": "exporter", "image": "jmp:dev", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 3, "reason": "Error"}},
            }],
        }),
    )
    .await;
    assert_eq!(
        phases(&provisioner, &set).await,
        [(
            a.clone(),
            ReplicaPhase::Failed,
            Some("exporter exited with code 3 (Error)".into())
        )]
    );

    // A second replica, and a Pod of the same label that another set owns: not observed.
    let b = format!("{set_name}-b");
    provisioner.start(&request(&set, &b)).await.unwrap();
    let mut stranger = pods.get(&b).await.unwrap();
    stranger.metadata = kube::api::ObjectMeta {
        name: Some(format!("{set_name}-stranger")),
        namespace: Some(NAMESPACE.into()),
        labels: stranger.metadata.labels.clone(),
        ..Default::default()
    };
    stranger.status = None;
    pods.create(&PostParams::default(), &stranger)
        .await
        .unwrap();
    let seen = phases(&provisioner, &set).await;
    assert_eq!(
        seen.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
        [a.as_str(), b.as_str()]
    );
    // Starting a replica whose name a Pod not ours has is refused.
    let err = provisioner
        .start(&request(&set, &format!("{set_name}-stranger")))
        .await
        .unwrap_err();
    assert!(
        jumpstarter_core::error_chain(&err).contains("not owned by ExporterSet"),
        "{}",
        jumpstarter_core::error_chain(&err)
    );
    assert!(
        secrets
            .get_opt(&pods_kube::secret_name(&format!("{set_name}-stranger")))
            .await
            .unwrap()
            .is_none(),
        "no config is left for a Pod that is not ours"
    );

    // stop of a running replica: a graceful delete (the node finishes it), the Secret gone.
    bind(&admin, &b).await;
    kubelet_reports(&pods, &b, serde_json::json!({"phase": "Running"})).await;
    provisioner.stop(NAMESPACE, &b).await.unwrap();
    let terminating = pods.get(&b).await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(
        terminating.metadata.deletion_grace_period_seconds,
        Some(30),
        "the Pod's default grace period"
    );
    assert!(
        secrets
            .get_opt(&pods_kube::secret_name(&b))
            .await
            .unwrap()
            .is_none()
    );
    let seen = phases(&provisioner, &set).await;
    assert_eq!(
        seen.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
        [a.as_str()],
        "a Pod being deleted is no longer a replica"
    );
    // As a kubelet finishes the deletion once the containers are stopped.
    pods.delete(&b, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(pods.get_opt(&b).await.unwrap().is_none());
    // Again: fine.
    provisioner.stop(NAMESPACE, &b).await.unwrap();
    // A replica that has exited (a terminal phase) goes at once.
    provisioner.stop(NAMESPACE, &a).await.unwrap();
    assert!(pods.get_opt(&a).await.unwrap().is_none());
    assert!(
        secrets
            .get_opt(&pods_kube::secret_name(&a))
            .await
            .unwrap()
            .is_none()
    );
    assert!(phases(&provisioner, &set).await.is_empty());

    // Deleting the set leaves garbage collection (not running here) to collect what it
    // owns: its references are what it goes by.
    let c = format!("{set_name}-c");
    provisioner.start(&request(&set, &c)).await.unwrap();
    Api::<ExporterSet>::namespaced(admin.clone(), NAMESPACE)
        .delete(&set_name, &DeleteParams::default())
        .await
        .unwrap();
    let owner = &pods
        .get(&c)
        .await
        .unwrap()
        .metadata
        .owner_references
        .unwrap()[0];
    assert_eq!(Some(&owner.uid), set.metadata.uid.as_ref());
    for p in [c.clone(), format!("{set_name}-stranger")] {
        pods.delete(&p, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }
    secrets
        .delete(&pods_kube::secret_name(&c), &DeleteParams::default())
        .await
        .unwrap();
}
