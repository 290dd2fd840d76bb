//! The CustomResourceDefinitions of the controller's kinds, shaped like upstream's.
//!
//! `kube::CustomResourceExt::crd()` gives a CRD from our Rust types; it differs from the YAML
//! upstream's controller-gen writes in ways that matter on a cluster (nullable markers, list and
//! map types, validation of conditions, defaults) and in ways that do not (descriptions). The
//! functions here start from `crd()` and apply the adjustments listed in [`adjust`], so that
//! `kubectl apply` of our CRDs over upstream's changes nothing a controller or user relies on.
//! [`structural_differences`] compares two CRDs field by field and reports every difference
//! not covered by [`ALLOWED_DIFFERENCES`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{Value, json};

use crate::objects::virtualtarget::{ExporterSet, VirtualTargetClass};
use crate::objects::{Client, Exporter, ExporterAccessPolicy, Lease};

/// Building or writing CRDs failed.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A generated CRD does not have the expected shape (a bug in the adjustments).
    #[error("CRD {name}: {reason}")]
    Shape {
        /// The CRD's name (`<plural>.<group>`).
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// Writing a CRD file failed.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A difference [`structural_differences`] tolerates, and why.
#[derive(Debug, Clone, Copy)]
pub struct AllowedDifference {
    /// Which flattened paths it covers: a path ending with this suffix, or containing it when
    /// it starts with `*`.
    pub path: &'static str,
    /// Why the difference does not matter.
    pub reason: &'static str,
}

/// The differences between our CRDs and upstream's that are accepted; anything else fails
/// [`structural_differences`].
pub const ALLOWED_DIFFERENCES: &[AllowedDifference] = &[
    AllowedDifference {
        path: "*.description",
        reason: "prose: ours comes from our doc comments; Kubernetes does not act on it",
    },
    AllowedDifference {
        path: "*metadata.annotations.controller-gen.kubebuilder.io/version",
        reason: "stamp of the generator that wrote upstream's file; ours is not controller-gen",
    },
    AllowedDifference {
        path: "*openAPIV3Schema.properties.spec.properties.sharedWith.type",
        reason: SHARED_WITH,
    },
    AllowedDifference {
        path: "*openAPIV3Schema.properties.spec.properties.sharedWith.items.type",
        reason: SHARED_WITH,
    },
    AllowedDifference {
        path: "*openAPIV3Schema.properties.spec.properties.sharedWith.maxItems",
        reason: SHARED_WITH,
    },
    AllowedDifference {
        path: "*openAPIV3Schema.properties.spec.properties.context.type",
        reason: CONTEXT,
    },
    AllowedDifference {
        path: "*openAPIV3Schema.properties.spec.properties.context.additionalProperties.type",
        reason: CONTEXT,
    },
    AllowedDifference {
        path: "*openAPIV3Schema.properties.spec.properties.context.maxProperties",
        reason: CONTEXT,
    },
    AllowedDifference {
        path: "*openAPIV3Schema.properties.spec.x-kubernetes-validations[2].message",
        reason: CONTEXT,
    },
    AllowedDifference {
        path: "*openAPIV3Schema.properties.spec.x-kubernetes-validations[2].rule",
        reason: CONTEXT,
    },
];

const CONTEXT: &str = "upstream main's spec.context (after 0.9.0, JEP-0013): optional, immutable once set, at most 8 entries, as upstream main's CRD has it";

const SHARED_WITH: &str = "our addition (lease sharing): optional, so upstream's objects and controller are unaffected; upstream's open pull request names it the same";

/// The six CRDs (Client, Exporter, Lease, ExporterAccessPolicy of `jumpstarter.dev`;
/// ExporterSet and VirtualTargetClass of `virtualtarget.jumpstarter.dev`), adjusted to
/// upstream's shape.
pub fn crds() -> Result<Vec<CustomResourceDefinition>, CrdError> {
    [
        Client::crd(),
        Exporter::crd(),
        Lease::crd(),
        ExporterAccessPolicy::crd(),
        ExporterSet::crd(),
        VirtualTargetClass::crd(),
    ]
    .into_iter()
    .map(adjust)
    .collect()
}

/// The file name controller-gen uses for a CRD: `<group>_<plural>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// A CRD as a YAML document (starting with `---`, as controller-gen's files do).
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, CrdError> {
    let yaml = serde_saphyr::to_string(crd).map_err(|e| CrdError::Shape {
        name: crd.metadata.name.clone().unwrap_or_default(),
        reason: format!(
            "cannot render YAML: {e}",
            e = jumpstarter_core::error_chain(&e)
        ),
    })?;
    Ok(format!("---\n{yaml}"))
}

/// Writes every CRD as `<dir>/<group>_<plural>.yaml` (creating `dir`) and returns the paths.
pub fn write_all(dir: &Path) -> Result<Vec<PathBuf>, CrdError> {
    let write_err = |path: &Path, source| CrdError::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| write_err(dir, e))?;
    let mut written = Vec::new();
    for crd in crds()? {
        let path = dir.join(file_name(&crd));
        std::fs::write(&path, to_yaml(&crd)?).map_err(|e| write_err(&path, e))?;
        written.push(path);
    }
    Ok(written)
}

/// Turns `kube-derive`'s CRD into upstream's shape:
///
/// - `spec.names.listKind` set (`<Kind>List`);
/// - the root schema without `title` and `required: [spec]`, and with the `apiVersion`,
///   `kind` and `metadata` properties every controller-gen CRD lists;
/// - no `nullable` (our serializers omit unset fields instead of writing `null`);
/// - `default` only where upstream has one: `Lease.spec.selector` (`{}`),
///   `Exporter.spec.enabled` (`true`) and every object reference's `name` (`""`);
/// - object references (`{name}`) optional-named and `x-kubernetes-map-type: atomic`;
/// - label selectors `x-kubernetes-map-type: atomic`, their lists `x-kubernetes-list-type:
///   atomic`;
/// - conditions with `metav1.Condition`'s validation (enum, patterns, lengths, minimum);
/// - `Lease.spec` requires `selector` (its default fills it in when omitted);
/// - the ExporterSet's and VirtualTargetClass's defaults (`maxReplicas: 4`, `bindingMode:
///   Immediate`, ...), and the ExporterSet's status requiring its counts;
/// - resource requirements with `claims` a list map and quantities `int-or-string` with
///   their pattern;
/// - `subresources: {}` on a kind with neither status nor scale (the VirtualTargetClass).
///
/// Minimums, lengths, patterns and CEL rules come from `schemars` attributes on the types.
pub fn adjust(crd: CustomResourceDefinition) -> Result<CustomResourceDefinition, CrdError> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let shape = |reason: &str| CrdError::Shape {
        name: name.clone(),
        reason: reason.to_string(),
    };
    let mut v =
        serde_json::to_value(&crd).map_err(|e| shape(&jumpstarter_core::error_chain(&e)))?;
    let kind = v["spec"]["names"]["kind"]
        .as_str()
        .ok_or_else(|| shape("no spec.names.kind"))?
        .to_string();
    v["spec"]["names"]["listKind"] = json!(format!("{kind}List"));
    let versions = v["spec"]["versions"]
        .as_array_mut()
        .ok_or_else(|| shape("no spec.versions"))?;
    for version in versions {
        // controller-gen writes `subresources: {}` for a kind without status or scale.
        if let Some(version) = version.as_object_mut() {
            version.entry("subresources").or_insert_with(|| json!({}));
        }
        let root = version
            .pointer_mut("/schema/openAPIV3Schema")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| shape("a version has no schema.openAPIV3Schema"))?;
        root.remove("title");
        root.remove("required");
        let props = root
            .entry("properties")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or_else(|| shape("schema properties is not an object"))?;
        props.insert("apiVersion".into(), api_version_schema());
        props.insert("kind".into(), kind_schema());
        props.insert("metadata".into(), json!({"type": "object"}));
        let schema = version
            .pointer_mut("/schema/openAPIV3Schema")
            .ok_or_else(|| shape("schema vanished"))?;
        rewrite(schema);
        for (path, default) in upstream_defaults(&kind) {
            let field = schema
                .pointer_mut(&path)
                .and_then(Value::as_object_mut)
                .ok_or_else(|| shape(&format!("no schema at {path} for its default")))?;
            field.insert("default".into(), default);
        }
        if kind == "ExporterSet" {
            // Every count of the status is always written (upstream's are not omitempty).
            let status = schema
                .pointer_mut("/properties/status")
                .and_then(Value::as_object_mut)
                .ok_or_else(|| shape("ExporterSet has no status schema"))?;
            let counts: Vec<Value> = status
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| {
                    p.iter()
                        .filter(|(_, s)| s["type"] == json!("integer"))
                        .map(|(k, _)| json!(k))
                        .collect()
                })
                .unwrap_or_default();
            status.insert("required".into(), Value::Array(counts));
        }
        if kind == "Lease" {
            let required = schema
                .pointer_mut("/properties/spec/required")
                .and_then(Value::as_array_mut)
                .ok_or_else(|| shape("Lease spec has no required list"))?;
            if !required.contains(&json!("selector")) {
                required.push(json!("selector"));
            }
        }
    }
    serde_json::from_value(v).map_err(|e| {
        shape(&format!(
            "adjusted CRD does not parse: {e}",
            e = jumpstarter_core::error_chain(&e)
        ))
    })
}

/// The defaults upstream's schema has besides object reference names (JSON pointers into the
/// version schema).
fn upstream_defaults(kind: &str) -> Vec<(String, Value)> {
    let at = |field: &str| format!("/properties/spec/properties/{field}");
    match kind {
        "Lease" => vec![(at("selector"), json!({}))],
        "Exporter" => vec![(at("enabled"), json!(true))],
        // The defaults ExporterSetSpec's accessors apply (min(), max(), ...).
        "ExporterSet" => vec![
            (at("maxReplicas"), json!(4)),
            (at("minAvailableReplicas"), json!(0)),
            (at("minReplicas"), json!(0)),
            (at("recycleStrategy"), json!("ExitAndReplace")),
            (at("scaleDownCooldown"), json!("5m")),
        ],
        "VirtualTargetClass" => vec![
            (at("bindingMode"), json!("Immediate")),
            (at("reclaimPolicy"), json!("Delete")),
            (
                at("caBundleConfigMapRef/properties/key"),
                json!("ca-bundle.crt"),
            ),
        ],
        _ => vec![],
    }
}

fn api_version_schema() -> Value {
    json!({
        "description": "APIVersion defines the versioned schema of this representation of an object.\nServers should convert recognized schemas to the latest internal value, and\nmay reject unrecognized values.\nMore info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources",
        "type": "string"
    })
}

fn kind_schema() -> Value {
    json!({
        "description": "Kind is a string value representing the REST resource this object represents.\nServers may infer this from the endpoint the client submits requests to.\nCannot be updated.\nIn CamelCase.\nMore info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
        "type": "string"
    })
}

/// The property names of a schema object, sorted.
fn property_names(schema: &serde_json::Map<String, Value>) -> Vec<&str> {
    let mut names: Vec<&str> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    names.sort_unstable();
    names
}

/// Sets `key: value` on the schema object at `pointer` inside `schema`, if there is one.
fn mark(schema: &mut Value, pointer: &str, key: &str, value: Value) {
    if let Some(target) = schema.pointer_mut(pointer).and_then(Value::as_object_mut) {
        target.insert(key.into(), value);
    }
}

/// The pattern of a `resource.Quantity` (`500m`, `4Gi`, `1e3`), as controller-gen writes it.
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// The schema-wide rewrites of [`adjust`], recursively.
fn rewrite(schema: &mut Value) {
    let names: Vec<String> = match schema.as_object_mut() {
        Some(obj) => {
            obj.remove("nullable");
            obj.remove("default");
            property_names(obj).into_iter().map(str::to_owned).collect()
        }
        None => return,
    };
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    match names.as_slice() {
        ["name"] => {
            // LocalObjectReference, as controller-gen renders it.
            if let Some(obj) = schema.as_object_mut() {
                obj.remove("required");
            }
            mark(schema, "", "x-kubernetes-map-type", json!("atomic"));
            mark(schema, "/properties/name", "default", json!(""));
            return;
        }
        ["matchExpressions", "matchLabels"] => {
            mark(schema, "", "x-kubernetes-map-type", json!("atomic"));
            let exprs = "/properties/matchExpressions";
            mark(schema, exprs, "x-kubernetes-list-type", json!("atomic"));
            let values = format!("{exprs}/items/properties/values");
            mark(schema, &values, "x-kubernetes-list-type", json!("atomic"));
        }
        [
            "lastTransitionTime",
            "message",
            "observedGeneration",
            "reason",
            "status",
            "type",
        ] => {
            // metav1.Condition's validation markers.
            let rules = [
                ("message", "maxLength", json!(32768)),
                ("observedGeneration", "minimum", json!(0)),
                ("reason", "maxLength", json!(1024)),
                ("reason", "minLength", json!(1)),
                (
                    "reason",
                    "pattern",
                    json!("^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
                ),
                ("status", "enum", json!(["True", "False", "Unknown"])),
                ("type", "maxLength", json!(316)),
                (
                    "type",
                    "pattern",
                    json!(
                        "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                    ),
                ),
            ];
            for (field, key, value) in rules {
                mark(schema, &format!("/properties/{field}"), key, value);
            }
        }
        ["claims", "limits", "requests"] => {
            // corev1.ResourceRequirements, as controller-gen renders it.
            let claims = "/properties/claims";
            mark(schema, claims, "x-kubernetes-list-type", json!("map"));
            mark(
                schema,
                claims,
                "x-kubernetes-list-map-keys",
                json!(["name"]),
            );
            for field in ["limits", "requests"] {
                let quantity = format!("/properties/{field}/additionalProperties");
                mark(
                    schema,
                    &quantity,
                    "anyOf",
                    json!([{"type": "integer"}, {"type": "string"}]),
                );
                mark(schema, &quantity, "pattern", json!(QUANTITY_PATTERN));
            }
        }
        _ => {}
    }
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(children)) = obj.get_mut("properties") {
        children.values_mut().for_each(rewrite);
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = obj.get_mut(key) {
            rewrite(child);
        }
    }
}

/// Flattens a JSON document into `path -> leaf` (`required` lists sorted, as their order
/// carries no meaning; whole numbers as integers).
fn flatten(v: &Value, path: &str, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, child) in map {
                flatten(child, &format!("{path}.{k}"), out);
            }
        }
        Value::Array(items) if path.ends_with(".required") => {
            let mut sorted = items.clone();
            sorted.sort_by_key(Value::to_string);
            out.insert(path.to_string(), Value::Array(sorted));
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, child) in items.iter().enumerate() {
                flatten(child, &format!("{path}[{i}]"), out);
            }
        }
        Value::Number(n) => {
            // `minimum: 0` and `minimum: 0.0` are the same bound (k8s-openapi holds it as f64).
            let n = match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => json!(f as i64),
                _ => Value::Number(n.clone()),
            };
            out.insert(path.to_string(), n);
        }
        leaf => {
            out.insert(path.to_string(), leaf.clone());
        }
    }
}

fn allowed(path: &str) -> bool {
    ALLOWED_DIFFERENCES
        .iter()
        .any(|a| match a.path.strip_prefix('*') {
            Some(suffix) => path.ends_with(suffix),
            None => path == a.path,
        })
}

/// Every difference between two CRDs (as JSON) that [`ALLOWED_DIFFERENCES`] does not cover:
/// names, group, scope, versions (served, storage, subresources, printer columns) and every
/// schema keyword (types, formats, required lists, enums, defaults, validations, list and map
/// types) at every path. Empty when they match.
pub fn structural_differences(ours: &Value, theirs: &Value) -> Vec<String> {
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    flatten(ours, "", &mut a);
    flatten(theirs, "", &mut b);
    let missing = Value::String("<absent>".into());
    let mut paths: Vec<&String> = a.keys().chain(b.keys()).collect();
    paths.sort_unstable();
    paths.dedup();
    paths
        .into_iter()
        .filter(|p| !allowed(p))
        .filter_map(|p| {
            let (o, t) = (a.get(p).unwrap_or(&missing), b.get(p).unwrap_or(&missing));
            (o != t).then(|| format!("{p}: ours {o}, upstream {t}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjustments_are_applied_and_round_trip() {
        let crds = crds().unwrap();
        assert_eq!(crds.len(), 6);
        let names: Vec<String> = crds.iter().map(file_name).collect();
        assert_eq!(
            names,
            [
                "jumpstarter.dev_clients.yaml",
                "jumpstarter.dev_exporters.yaml",
                "jumpstarter.dev_leases.yaml",
                "jumpstarter.dev_exporteraccesspolicies.yaml",
                "virtualtarget.jumpstarter.dev_exportersets.yaml",
                "virtualtarget.jumpstarter.dev_virtualtargetclasses.yaml"
            ]
        );
        let set = serde_json::to_value(&crds[4]).unwrap();
        let version = &set["spec"]["versions"][0];
        assert_eq!(
            version["subresources"]["scale"]["specReplicasPath"],
            json!(".spec.maxReplicas")
        );
        let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["properties"]["maxReplicas"]["default"], json!(4));
        assert_eq!(spec["properties"]["minReplicas"]["minimum"], json!(0.0));
        let class = serde_json::to_value(&crds[5]).unwrap();
        assert_eq!(class["spec"]["versions"][0]["subresources"], json!({}));
        let lease = serde_json::to_value(&crds[2]).unwrap();
        let text = lease.to_string();
        assert!(!text.contains("nullable"), "{text}");
        assert_eq!(lease["spec"]["names"]["listKind"], json!("LeaseList"));
        let spec = &lease["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["properties"]["selector"]["default"], json!({}));
        assert_eq!(
            spec["properties"]["clientRef"]["x-kubernetes-map-type"],
            json!("atomic")
        );
        // YAML renders and parses back to the same CRD.
        let yaml = to_yaml(&crds[2]).unwrap();
        assert!(yaml.starts_with("---\n"));
        let back: CustomResourceDefinition = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, crds[2]);
    }

    #[test]
    fn differences_are_reported_by_path() {
        let ours =
            json!({"spec": {"a": {"type": "string", "description": "x"}, "required": ["b", "a"]}});
        let same =
            json!({"spec": {"a": {"type": "string", "description": "y"}, "required": ["a", "b"]}});
        assert!(structural_differences(&ours, &same).is_empty());
        let other = json!({"spec": {"a": {"type": "integer"}, "required": ["a"], "c": true}});
        let diffs = structural_differences(&ours, &other);
        assert_eq!(diffs.len(), 3, "{diffs:?}");
        assert!(
            diffs[0].starts_with(".spec.a.type: ours \"string\""),
            "{diffs:?}"
        );
        assert!(
            diffs
                .iter()
                .any(|d| d.starts_with(".spec.c: ours \"<absent>\""))
        );
    }

    #[test]
    fn write_all_writes_one_file_per_crd_and_names_bad_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_all(&dir.path().join("out")).unwrap();
        assert_eq!(written.len(), 6);
        for p in &written {
            let text = std::fs::read_to_string(p).unwrap();
            assert!(
                text.contains("group: jumpstarter.dev")
                    || text.contains("group: virtualtarget.jumpstarter.dev"),
                "{text}"
            );
        }
        let file = dir.path().join("plain-file");
        std::fs::write(&file, b"x").unwrap();
        let err = write_all(&file).unwrap_err();
        assert!(err.to_string().contains("plain-file"), "{err}");
    }
}
