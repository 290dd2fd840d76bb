//! Our CRDs (`cargo xtask crds`) against upstream 0.9.0's (the Client: upstream main's),
//! structurally.

use std::path::{Path, PathBuf};

use jumpstarter_controller::crd;
use serde_json::Value;

fn upstream_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/crds")
}

fn load_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn generated_crds_match_upstream_except_allowed_differences() {
    let crds = crd::crds().unwrap();
    let mut files: Vec<String> = std::fs::read_dir(upstream_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    files.sort();
    let mut ours_files: Vec<String> = crds.iter().map(crd::file_name).collect();
    ours_files.sort();
    assert_eq!(
        ours_files, files,
        "one CRD per upstream CRD, same file names"
    );
    let mut report = Vec::new();
    for c in &crds {
        let ours = serde_json::to_value(c).unwrap();
        let theirs = load_yaml(&upstream_dir().join(crd::file_name(c)));
        for d in crd::structural_differences(&ours, &theirs) {
            report.push(format!("{}: {d}", crd::file_name(c)));
        }
    }
    assert!(
        report.is_empty(),
        "{} differences from upstream:\n{}",
        report.len(),
        report.join("\n")
    );
}

/// A change that makes our CRD wrong.
type Breakage = Box<dyn Fn(&mut Value)>;

#[test]
fn the_comparison_catches_real_differences() {
    // A test that cannot fail is a defect: break our Lease CRD in the ways that matter and
    // check each is reported.
    let lease = crd::crds()
        .unwrap()
        .into_iter()
        .find(|c| c.spec.names.kind == "Lease")
        .unwrap();
    let theirs = load_yaml(&upstream_dir().join("jumpstarter.dev_leases.yaml"));
    let base = serde_json::to_value(&lease).unwrap();
    let schema = "/spec/versions/0/schema/openAPIV3Schema/properties";
    let breakages: Vec<(&str, Breakage)> = vec![
        ("scope", Box::new(|v| v["spec"]["scope"] = "Cluster".into())),
        (
            "served",
            Box::new(|v| v["spec"]["versions"][0]["served"] = false.into()),
        ),
        (
            "subresources.status",
            Box::new(|v| {
                v["spec"]["versions"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("subresources");
            }),
        ),
        (
            "additionalPrinterColumns[1].jsonPath",
            Box::new(|v| {
                v["spec"]["versions"][0]["additionalPrinterColumns"][1]["jsonPath"] =
                    ".spec.clientRef".into()
            }),
        ),
        (
            "properties.spec.properties.tags.type",
            Box::new(move |v| {
                v.pointer_mut(&format!("{schema}/spec/properties/tags/type"))
                    .map(|t| *t = "string".into())
                    .unwrap()
            }),
        ),
        (
            "properties.status.required",
            Box::new(move |v| {
                v.pointer_mut(&format!("{schema}/status"))
                    .unwrap()
                    .as_object_mut()
                    .unwrap()
                    .remove("required");
            }),
        ),
        (
            "properties.spec.properties.release",
            Box::new(move |v| {
                v.pointer_mut(&format!("{schema}/spec/properties"))
                    .unwrap()
                    .as_object_mut()
                    .unwrap()
                    .remove("release");
            }),
        ),
    ];
    for (what, breakage) in breakages {
        let mut broken = base.clone();
        breakage(&mut broken);
        let diffs = crd::structural_differences(&broken, &theirs);
        assert!(
            diffs.iter().any(|d| d.contains(what)),
            "breaking {what} went unnoticed: {diffs:?}"
        );
    }
}

/// The CRDs copied from upstream main (2026-08) rather than 0.9.0: the Client, whose status
/// carries the token expiry (`conditions`, `tokenExpiresAt`) and its printer column, and the
/// two kinds of virtual target pools (JEP-0014), which 0.9.0 does not have.
const UPSTREAM_MAIN_COPIES: &[&str] = &[
    "jumpstarter.dev_clients.yaml",
    "virtualtarget.jumpstarter.dev_exportersets.yaml",
    "virtualtarget.jumpstarter.dev_virtualtargetclasses.yaml",
];

#[test]
fn upstream_copies_equal_the_shared_reference() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/reference/crds");
    if !shared.is_dir() {
        eprintln!("skipping: {} not present", shared.display());
        return;
    }
    let main = shared.join("../upstream-main-2026-08");
    let mut references: Vec<PathBuf> = std::fs::read_dir(&shared)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !UPSTREAM_MAIN_COPIES.iter().any(|m| p.ends_with(m)))
        .collect();
    references.extend(UPSTREAM_MAIN_COPIES.iter().map(|m| main.join(m)));
    // Every copy has its reference (none is left unchecked), and every reference its copy.
    let copies = std::fs::read_dir(upstream_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .count();
    assert_eq!(copies, references.len(), "{references:?}");
    for path in references {
        let copy = upstream_dir().join(path.file_name().unwrap());
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            std::fs::read_to_string(&copy).unwrap_or_default(),
            "{} differs from {}",
            copy.display(),
            path.display()
        );
    }
}

#[test]
fn the_comparison_catches_pool_differences() {
    // The ExporterSet's parts the comparison must see: scale subresource, CEL rules and their
    // messages, defaults, minimums and the status' required counts.
    let set = crd::crds()
        .unwrap()
        .into_iter()
        .find(|c| c.spec.names.kind == "ExporterSet")
        .unwrap();
    let theirs = load_yaml(&upstream_dir().join("virtualtarget.jumpstarter.dev_exportersets.yaml"));
    let base = serde_json::to_value(&set).unwrap();
    let spec = "/spec/versions/0/schema/openAPIV3Schema/properties/spec";
    let breakages: Vec<(&str, Breakage)> = vec![
        (
            "subresources.scale.specReplicasPath",
            Box::new(|v| {
                v["spec"]["versions"][0]["subresources"]["scale"]["specReplicasPath"] =
                    ".spec.minReplicas".into()
            }),
        ),
        (
            "spec.x-kubernetes-validations[0].message",
            Box::new(move |v| {
                *v.pointer_mut(&format!("{spec}/x-kubernetes-validations/0/message"))
                    .unwrap() = "min <= max".into()
            }),
        ),
        (
            "maxReplicas.default",
            Box::new(move |v| {
                *v.pointer_mut(&format!("{spec}/properties/maxReplicas/default"))
                    .unwrap() = 10.into()
            }),
        ),
        (
            "minReplicas.minimum",
            Box::new(move |v| {
                v.pointer_mut(&format!("{spec}/properties/minReplicas"))
                    .unwrap()
                    .as_object_mut()
                    .unwrap()
                    .remove("minimum");
            }),
        ),
        (
            "properties.status.required",
            Box::new(|v| {
                v.pointer_mut("/spec/versions/0/schema/openAPIV3Schema/properties/status")
                    .unwrap()
                    .as_object_mut()
                    .unwrap()
                    .remove("required");
            }),
        ),
    ];
    assert!(crd::structural_differences(&base, &theirs).is_empty());
    for (what, breakage) in breakages {
        let mut broken = base.clone();
        breakage(&mut broken);
        let diffs = crd::structural_differences(&broken, &theirs);
        assert!(
            diffs.iter().any(|d| d.contains(what)),
            "breaking {what} went unnoticed: {diffs:?}"
        );
    }
}
