//! The kustomize manifests under `deploy/kubernetes/` parse, list files that exist, carry the
//! CRDs `cargo xtask crds` generates today, and agree with the code on images, ports, Secret
//! names and the ConfigMap layout.

use std::path::{Path, PathBuf};

use jumpstarter_controller::{cluster_config, crd, key_secret};
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// Every YAML document of a file.
fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split("\n---")
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .map(|d| {
            serde_saphyr::from_str::<Value>(d).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}

fn find<'a>(all: &'a [Value], kind: &str, name: &str) -> &'a Value {
    all.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn base() -> Vec<Value> {
    let dir = deploy_dir().join("base");
    let k = &docs(&dir.join("kustomization.yaml"))[0];
    k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| docs(&dir.join(r.as_str().unwrap())))
        .collect()
}

#[test]
fn kustomize_base_names_the_right_images_ports_and_secrets() {
    let all = base();
    let ctl = find(&all, "Deployment", "jumpstarter-controller");
    let c = &ctl["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "jumpstarter-controller");
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--store=kubernetes"), "{args:?}");
    let ports: Vec<i64> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].as_i64().unwrap())
        .collect();
    assert_eq!(ports, [8082, 8083, 8080]);
    let svc = find(&all, "Service", "jumpstarter-controller");
    assert_eq!(svc["spec"]["ports"][0]["name"], "controller-grpc");
    assert_eq!(svc["spec"]["ports"][0]["port"], 8082);

    let router = find(&all, "Deployment", "jumpstarter-router");
    let spec = &router["spec"]["template"]["spec"];
    let r = &spec["containers"][0];
    assert_eq!(r["image"], "jumpstarter-router");
    let key = r["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "ROUTER_KEY")
        .unwrap();
    let secret_ref = &key["valueFrom"]["secretKeyRef"];
    assert_eq!(secret_ref["name"], key_secret::KEY_SECRET_NAME);
    assert!(
        key_secret::FILES
            .iter()
            .any(|(k, _)| secret_ref["key"] == *k)
    );
    assert_eq!(
        spec["volumes"][0]["secret"]["secretName"],
        key_secret::ROUTER_TLS_SECRET_NAME
    );
    assert_eq!(
        find(&all, "Service", "jumpstarter-router")["spec"]["ports"][0]["port"],
        8083
    );

    // RBAC covers the four kinds, the pools' two, Secrets, leader election Leases and events.
    let role = find(&all, "ClusterRole", "jumpstarter-controller");
    let text = role["rules"].to_string();
    for needed in [
        "clients",
        "exporters",
        "exporteraccesspolicies",
        "virtualtarget.jumpstarter.dev",
        "exportersets",
        "exportersets/status",
        "virtualtargetclasses",
        "leases/status",
        "secrets",
        "configmaps",
        "coordination.k8s.io",
        "events",
    ] {
        assert!(text.contains(needed), "ClusterRole lacks {needed}");
    }
}

#[test]
fn config_maps_parse_as_the_controller_reads_them() {
    let all = base();
    let cm: ConfigMap =
        serde_json::from_value(find(&all, "ConfigMap", "jumpstarter-controller").clone()).unwrap();
    let c = cluster_config::from_config_map(&cm).unwrap();
    assert_eq!(
        c.routers[0].endpoint,
        "jumpstarter-router.jumpstarter.svc:8083"
    );
    let kind = deploy_dir().join("overlays/kind/configmap-router.yaml");
    let cm: ConfigMap = serde_json::from_value(docs(&kind)[0].clone()).unwrap();
    assert_eq!(
        cluster_config::from_config_map(&cm).unwrap().routers.len(),
        1
    );
}

#[test]
fn deployed_crds_are_the_generated_ones() {
    let dir = deploy_dir().join("base/crds");
    for c in crd::crds().unwrap() {
        let path = dir.join(crd::file_name(&c));
        let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run `cargo xtask crds --out deploy/kubernetes/base/crds`)",
                path.display()
            )
        });
        assert_eq!(
            on_disk,
            crd::to_yaml(&c).unwrap(),
            "{} is stale: run `cargo xtask crds --out deploy/kubernetes/base/crds`",
            path.display()
        );
    }
}
