use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, PodCondition,
    PodStatus,
};

use super::*;
use crate::objects::virtualtarget::{Images, VirtualTargetClass};

const SET: &str = r#"
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata:
  name: rpi4-virtual
  namespace: lab
  uid: 5b0c6a4e-0000-4000-8000-000000000001
spec:
  virtualTargetClassName: qemu-rpi4
  parameters:
    resources:
      memory: 8Gi
  selector:
    matchLabels:
      board: rpi4
  template:
    metadata:
      labels:
        board: rpi4
    spec:
      drivers:
        - name: power
          type: jumpstarter_driver_power.driver.MockPower
"#;

const CLASS: &str = r#"
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: VirtualTargetClass
metadata:
  name: qemu-rpi4
  namespace: lab
spec:
  provisioner: qemu.jumpstarter.dev
  images:
    runtime:
      image: registry.example.com/qemu-runtime:1
      imagePullPolicy: IfNotPresent
  scheduling:
    nodeSelector:
      kubernetes.io/arch: arm64
    tolerations:
      - key: jumpstarter.dev/kvm
        operator: Exists
        effect: NoSchedule
    resources:
      limits:
        devices.kubevirt.io/kvm: "1"
  parameters:
    machineType: virt
    resources:
      cpu: 4
      memory: 4Gi
"#;

fn request() -> ReplicaRequest {
    let set: ExporterSet = serde_saphyr::from_str(SET).unwrap();
    let class: VirtualTargetClass = serde_saphyr::from_str(CLASS).unwrap();
    ReplicaRequest {
        namespace: "lab".into(),
        name: "rpi4-virtual-x7k2p".into(),
        exporter_config: "endpoint: controller:8082\ntoken: secret-token\n".into(),
        labels: BTreeMap::from([
            ("board".to_string(), "rpi4".to_string()),
            (LABEL_EXPORTER_SET.to_string(), "rpi4-virtual".to_string()),
        ]),
        set,
        class,
    }
}

#[test]
fn a_replica_is_a_pod_with_the_exporter_and_a_runtime_sidecar() {
    let r = render(&request()).unwrap();
    let pod = &r.pod;
    assert_eq!(pod.metadata.name.as_deref(), Some("rpi4-virtual-x7k2p"));
    assert_eq!(pod.metadata.namespace.as_deref(), Some("lab"));
    let labels = pod.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["board"], "rpi4");
    assert_eq!(labels[LABEL_EXPORTER_SET], "rpi4-virtual");
    let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        (
            "ExporterSet",
            "rpi4-virtual",
            "5b0c6a4e-0000-4000-8000-000000000001"
        )
    );
    assert_eq!(owner.api_version, "virtualtarget.jumpstarter.dev/v1alpha1");
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );

    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(spec.automount_service_account_token, Some(false));
    let psc = spec.security_context.as_ref().unwrap();
    assert_eq!(
        (psc.run_as_non_root, psc.run_as_user, psc.fs_group),
        (Some(true), Some(65532), Some(65532))
    );
    // The exporter: the main (only) container.
    assert_eq!(spec.containers.len(), 1);
    let exporter = &spec.containers[0];
    assert_eq!(exporter.name, EXPORTER_CONTAINER);
    assert_eq!(exporter.image.as_deref(), Some(DEFAULT_EXPORTER_IMAGE));
    assert_eq!(
        exporter.command.as_deref().unwrap(),
        ["jmp", "run", "--exporter-config", CONFIG_PATH]
    );
    assert!(CONFIG_PATH.starts_with(CONFIG_MOUNT) && CONFIG_PATH.ends_with(CONFIG_KEY));
    let mounts = exporter.volume_mounts.as_ref().unwrap();
    let config = mounts
        .iter()
        .find(|m| m.mount_path == CONFIG_MOUNT)
        .unwrap();
    assert_eq!(config.read_only, Some(true));
    assert!(
        mounts
            .iter()
            .any(|m| m.mount_path == SHARED_MOUNT && m.name == "shared")
    );
    // The runtime: a native sidecar with the class's image, resources and the parameters.
    let init = spec.init_containers.as_ref().unwrap();
    assert_eq!(init.len(), 1);
    let runtime = &init[0];
    assert_eq!(runtime.name, RUNTIME_CONTAINER);
    assert_eq!(runtime.restart_policy.as_deref(), Some("Always"));
    assert_eq!(
        runtime.image.as_deref(),
        Some("registry.example.com/qemu-runtime:1")
    );
    assert_eq!(runtime.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert!(
        runtime
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.mount_path == SHARED_MOUNT && m.name == "shared")
    );
    assert!(
        !runtime
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.name == "exporter-config"),
        "the runtime does not see the exporter's token"
    );
    let limits = runtime.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["devices.kubevirt.io/kvm"].0, "1");
    let env = runtime.env.as_ref().unwrap();
    let params: serde_json::Value = serde_json::from_str(
        env.iter()
            .find(|e| e.name == PARAMETERS_ENV)
            .unwrap()
            .value
            .as_deref()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        params,
        serde_json::json!({"machineType": "virt", "resources": {"cpu": 4, "memory": "8Gi"}})
    );
    for c in [exporter, runtime] {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref().unwrap(),
            ["ALL"]
        );
    }
    // Scheduling from the class.
    assert_eq!(
        spec.node_selector.as_ref().unwrap()["kubernetes.io/arch"],
        "arm64"
    );
    assert_eq!(
        spec.tolerations.as_ref().unwrap()[0].key.as_deref(),
        Some("jumpstarter.dev/kvm")
    );
    // Volumes: the shared emptyDir and the Secret.
    let volumes = spec.volumes.as_ref().unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v.name == "shared" && v.empty_dir.is_some())
    );
    let secret_volume = volumes.iter().find_map(|v| v.secret.as_ref()).unwrap();
    assert_eq!(
        secret_volume.secret_name.as_deref(),
        Some("rpi4-virtual-x7k2p-exporter-config")
    );

    // The Secret: the config, owned by the set.
    assert_eq!(
        r.secret.metadata.name.as_deref(),
        Some("rpi4-virtual-x7k2p-exporter-config")
    );
    assert_eq!(
        r.secret.data.as_ref().unwrap()[CONFIG_KEY].0,
        b"endpoint: controller:8082\ntoken: secret-token\n"
    );
    assert_eq!(
        r.secret.metadata.owner_references,
        pod.metadata.owner_references
    );
}

#[test]
fn images_come_from_the_set_over_the_class_over_the_defaults() {
    let mut req = request();
    req.set.spec.images = Some(Images {
        exporter: Some(ImageSpec {
            image: Some("registry.example.com/jmp:2".into()),
            image_pull_policy: None,
        }),
        runtime: Some(ImageSpec {
            image: None,
            image_pull_policy: Some(PullPolicy::Always),
        }),
    });
    let spec = render(&req).unwrap().pod.spec.unwrap();
    let runtime = &spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(
        runtime.image.as_deref(),
        Some("registry.example.com/qemu-runtime:1"),
        "the image from the class"
    );
    assert_eq!(runtime.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(
        spec.containers[0].image.as_deref(),
        Some("registry.example.com/jmp:2")
    );
    assert_eq!(spec.containers[0].image_pull_policy, None);

    req.class.spec.images = None;
    req.set.spec.images = None;
    let spec = render(&req).unwrap().pod.spec.unwrap();
    assert_eq!(
        spec.init_containers.as_ref().unwrap()[0].image.as_deref(),
        Some(DEFAULT_RUNTIME_IMAGE)
    );
    // Without parameters anywhere the runtime gets an empty object.
    req.class.spec.parameters = None;
    req.set.spec.parameters = None;
    let spec = render(&req).unwrap().pod.spec.unwrap();
    let env = spec.init_containers.as_ref().unwrap()[0]
        .env
        .clone()
        .unwrap();
    assert_eq!(env[0].value.as_deref(), Some("{}"));
}

#[test]
fn bad_requests_are_refused_naming_the_field() {
    let field = |req: &ReplicaRequest| render(req).unwrap_err().field;

    let mut req = request();
    req.name = "Rpi4_Virtual".into();
    assert_eq!(field(&req), "replica name");
    req.name = "x".repeat(64);
    assert_eq!(field(&req), "replica name");

    let mut req = request();
    req.namespace = String::new();
    assert_eq!(field(&req), "namespace");

    let mut req = request();
    req.set.spec.images = Some(Images {
        exporter: Some(ImageSpec {
            image: Some(String::new()),
            image_pull_policy: None,
        }),
        runtime: None,
    });
    assert_eq!(field(&req), "ExporterSet spec.images.exporter.image");

    let mut req = request();
    req.class
        .spec
        .images
        .as_mut()
        .unwrap()
        .runtime
        .as_mut()
        .unwrap()
        .image = Some(" ".into());
    assert_eq!(field(&req), "VirtualTargetClass spec.images.runtime.image");

    let mut req = request();
    req.set.metadata.uid = None;
    assert_eq!(field(&req), "ExporterSet metadata.uid");

    let mut req = request();
    req.set.metadata.namespace = Some("elsewhere".into());
    assert_eq!(field(&req), "ExporterSet metadata.namespace");

    let mut req = request();
    req.labels
        .insert("board".into(), "not a label value".into());
    let err = render(&req).unwrap_err();
    assert!(err.field.contains("board"), "{err}");
}

fn pod_with(status: PodStatus) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("rpi4-virtual-x7k2p".into()),
            ..Default::default()
        },
        spec: None,
        status: Some(status),
    }
}

#[test]
fn pod_phases_map_to_replica_phases_with_their_reason() {
    let phase = |p: Option<&str>| {
        observe_pod(&pod_with(PodStatus {
            phase: p.map(str::to_string),
            ..Default::default()
        }))
        .phase
    };
    assert_eq!(phase(None), ReplicaPhase::Pending);
    assert_eq!(phase(Some("Pending")), ReplicaPhase::Pending);
    assert_eq!(phase(Some("Running")), ReplicaPhase::Running);
    assert_eq!(phase(Some("Succeeded")), ReplicaPhase::Succeeded);
    assert_eq!(phase(Some("Failed")), ReplicaPhase::Failed);
    assert_eq!(phase(Some("Unknown")), ReplicaPhase::Unknown);
    assert_eq!(phase(Some("Exploded")), ReplicaPhase::Unknown);

    // A failed exporter: its exit code and reason.
    let o = observe_pod(&pod_with(PodStatus {
        phase: Some("Failed".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: EXPORTER_CONTAINER.into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 1,
                    reason: Some("Error".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    }));
    assert_eq!(o.name, "rpi4-virtual-x7k2p");
    assert_eq!(
        o.message.as_deref(),
        Some("exporter exited with code 1 (Error)")
    );

    // A runtime whose image cannot be pulled.
    let o = observe_pod(&pod_with(PodStatus {
        phase: Some("Pending".into()),
        init_container_statuses: Some(vec![ContainerStatus {
            name: RUNTIME_CONTAINER.into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ImagePullBackOff".into()),
                    message: Some("pull access denied".into()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    }));
    assert_eq!(
        o.message.as_deref(),
        Some("target-runtime: ImagePullBackOff: pull access denied")
    );

    // No node fits.
    let o = observe_pod(&pod_with(PodStatus {
        phase: Some("Pending".into()),
        conditions: Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some("0/3 nodes are available".into()),
            ..Default::default()
        }]),
        ..Default::default()
    }));
    assert_eq!(
        o.message.as_deref(),
        Some("Unschedulable: 0/3 nodes are available")
    );

    // The Pod's own reason comes first.
    let o = observe_pod(&pod_with(PodStatus {
        phase: Some("Failed".into()),
        reason: Some("Evicted".into()),
        message: Some("low on memory".into()),
        ..Default::default()
    }));
    assert_eq!(o.message.as_deref(), Some("Evicted: low on memory"));
}
