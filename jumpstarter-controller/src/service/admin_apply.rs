//! The documents of `AdminService.Apply`: upstream-format objects (YAML or JSON, as `kubectl
//! apply -f` takes them) read, checked and turned into the objects to write.
//!
//! Every document is checked before anything is written, so one bad document writes nothing.
//! A document is refused (INVALID_ARGUMENT naming its index, kind and name) for: not parsing,
//! an unknown `apiVersion`/`kind`, no `metadata.name`, a namespace other than the request's,
//! a field the kind's CRD does not have, labels the API server would refuse, or what the
//! kind's own checks refuse (an ExporterSet's [`ExporterSetSpec::validate`], an access
//! policy's selectors and durations). `status` is never taken from a document: the
//! controller writes it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use tonic::Status;

use crate::objects::{
    Client, Exporter, ExporterAccessPolicy,
    selector::{LabelSelector, validate_dns1123_subdomain, validate_qualified_name},
    virtualtarget::{ExporterSet, VirtualTargetClass},
};
use crate::service::limits::{self, MAX_LABELS, MAX_RULES, MAX_TEXT};

/// Documents one Apply takes at most.
pub const MAX_DOCUMENTS: usize = 256;
/// Bytes of one document at most.
pub const MAX_DOCUMENT_BYTES: usize = 256 * 1024;

/// `apiVersion` of the `jumpstarter.dev` kinds.
const CORE_API: &str = "jumpstarter.dev/v1alpha1";
/// `apiVersion` of the virtual target kinds.
const POOL_API: &str = "virtualtarget.jumpstarter.dev/v1alpha1";

/// The `metadata` fields a document may carry (those of `ObjectMeta`). Only `name`,
/// `namespace`, `labels` and `annotations` are applied; the others (as `kubectl get -o yaml`
/// prints them) are the store's and are ignored.
const METADATA_FIELDS: &[&str] = &[
    "name",
    "namespace",
    "labels",
    "annotations",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generateName",
    "managedFields",
    "ownerReferences",
    "finalizers",
    "selfLink",
];

/// The object of one document, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Desired {
    /// A `jumpstarter.dev` Client.
    Client(Client),
    /// A `jumpstarter.dev` Exporter.
    Exporter(Exporter),
    /// A `jumpstarter.dev` ExporterAccessPolicy.
    Policy(ExporterAccessPolicy),
    /// A `virtualtarget.jumpstarter.dev` ExporterSet.
    Set(ExporterSet),
    /// A `virtualtarget.jumpstarter.dev` VirtualTargetClass.
    Class(VirtualTargetClass),
}

impl Desired {
    /// The kind (`ExporterSet`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Client(_) => "Client",
            Self::Exporter(_) => "Exporter",
            Self::Policy(_) => "ExporterAccessPolicy",
            Self::Set(_) => "ExporterSet",
            Self::Class(_) => "VirtualTargetClass",
        }
    }

    /// The `apiVersion`.
    pub fn api_version(&self) -> &'static str {
        match self {
            Self::Client(_) | Self::Exporter(_) | Self::Policy(_) => CORE_API,
            Self::Set(_) | Self::Class(_) => POOL_API,
        }
    }

    fn meta(&self) -> &metav1::ObjectMeta {
        match self {
            Self::Client(o) => &o.metadata,
            Self::Exporter(o) => &o.metadata,
            Self::Policy(o) => &o.metadata,
            Self::Set(o) => &o.metadata,
            Self::Class(o) => &o.metadata,
        }
    }

    /// The namespace (always set once checked).
    pub fn namespace(&self) -> &str {
        self.meta().namespace.as_deref().unwrap_or_default()
    }

    /// The name (always set once checked).
    pub fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }
}

/// One checked document and whether it carried a `status` (which is ignored).
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// The object to create or update.
    pub desired: Desired,
    /// The document had a `status`, which was left out.
    pub status_ignored: bool,
}

/// Reads and checks every document; the first bad one is an INVALID_ARGUMENT naming it
/// (`document 2 (ExporterSet mock-pool): ...`). `namespace` is the request's (empty:
/// `default`, and documents may name their own).
pub fn parse_documents(documents: &[String], namespace: &str) -> Result<Vec<Document>, Status> {
    if documents.is_empty() {
        return Err(Status::invalid_argument("no documents to apply"));
    }
    limits::check_count("documents", documents.len(), MAX_DOCUMENTS)?;
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(documents.len());
    for (i, text) in documents.iter().enumerate() {
        let doc = parse_document(text, namespace)
            .map_err(|e| Status::invalid_argument(format!("document {n}{e}", n = i + 1)))?;
        let key = (
            doc.desired.kind(),
            doc.desired.namespace().to_string(),
            doc.desired.name().to_string(),
        );
        if !seen.insert(key) {
            return Err(Status::invalid_argument(format!(
                "document {n} ({kind} {name}): the same object is in an earlier document",
                n = i + 1,
                kind = doc.desired.kind(),
                name = doc.desired.name()
            )));
        }
        out.push(doc);
    }
    Ok(out)
}

/// Why one document is refused: `" (KIND NAME): reason"`, or `": reason"` before its kind
/// and name are known.
type DocError = String;

fn parse_document(text: &str, namespace: &str) -> Result<Document, DocError> {
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(format!(
            ": too long: {} bytes (the limit is {MAX_DOCUMENT_BYTES})",
            text.len()
        ));
    }
    let value: Value = serde_saphyr::from_str(text).map_err(|e| {
        // The parser's first line says where and what; the rest is a picture of the text.
        let text = jumpstarter_core::error_chain(&e);
        let first = text.lines().next().unwrap_or_default();
        format!(
            ": not YAML or JSON: {e}",
            e = first.strip_prefix("error: ").unwrap_or(first)
        )
    })?;
    let Value::Object(mut map) = value else {
        return Err(": not an object (a mapping with apiVersion, kind, metadata, spec)".into());
    };
    let text_field = |map: &serde_json::Map<String, Value>, f: &str| -> Result<String, DocError> {
        match map.get(f) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(Value::String(_)) | None => Err(format!(": {f} is required")),
            Some(other) => Err(format!(": {f} must be a string, not {other}")),
        }
    };
    let api_version = text_field(&map, "apiVersion")?;
    let kind = text_field(&map, "kind")?;
    let name = map
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let at = |reason: String| -> DocError {
        if name.is_empty() {
            format!(" ({kind}): {reason}")
        } else {
            format!(" ({kind} {name}): {reason}")
        }
    };
    let status_ignored = map.remove("status").is_some();
    let body = Value::Object(map);
    let desired = match (api_version.as_str(), kind.as_str()) {
        (CORE_API, "Client") => Desired::Client(typed(&kind, body, namespace).map_err(at)?),
        (CORE_API, "Exporter") => Desired::Exporter(typed(&kind, body, namespace).map_err(at)?),
        (CORE_API, "ExporterAccessPolicy") => {
            Desired::Policy(typed(&kind, body, namespace).map_err(at)?)
        }
        (POOL_API, "ExporterSet") => Desired::Set(typed(&kind, body, namespace).map_err(at)?),
        (POOL_API, "VirtualTargetClass") => {
            Desired::Class(typed(&kind, body, namespace).map_err(at)?)
        }
        (CORE_API, "Lease") => {
            return Err(at(
                "leases are not applied: a client requests one (jmp create lease, jmp shell)"
                    .into(),
            ));
        }
        (_, "Client" | "Exporter" | "ExporterAccessPolicy") => {
            return Err(at(format!(
                "apiVersion {api_version:?} is not served: {kind} is {CORE_API}"
            )));
        }
        (_, "ExporterSet" | "VirtualTargetClass") => {
            return Err(at(format!(
                "apiVersion {api_version:?} is not served: {kind} is {POOL_API}"
            )));
        }
        _ => {
            return Err(at(format!(
                "unknown kind {kind:?} (apiVersion {api_version:?}): this controller applies \
                 Client, Exporter, ExporterAccessPolicy ({CORE_API}), ExporterSet and \
                 VirtualTargetClass ({POOL_API})"
            )));
        }
    };
    check(&desired).map_err(at)?;
    Ok(Document {
        desired,
        status_ignored,
    })
}

/// The kind's schema (its CRD's), by kind; built once.
fn schemas() -> &'static BTreeMap<String, Value> {
    static SCHEMAS: OnceLock<BTreeMap<String, Value>> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let mut out = BTreeMap::new();
        // The CRDs are built from our own types: a failure is a bug that the crd tests catch;
        // without a schema, the unknown-field check is skipped rather than refusing all.
        if let Ok(crds) = crate::kubernetes::crd::crds() {
            for c in crds {
                let schema = c
                    .spec
                    .versions
                    .first()
                    .and_then(|v| v.schema.as_ref())
                    .and_then(|s| s.open_api_v3_schema.as_ref())
                    .and_then(|s| serde_json::to_value(s).ok());
                if let Some(schema) = schema {
                    out.insert(c.spec.names.kind.clone(), schema);
                }
            }
        }
        out
    })
}

/// Every field of `value` the schema does not have, as paths (`spec.maxReplica`).
fn unknown_fields(value: &Value, schema: &Value, path: &str, out: &mut Vec<String>) {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match value {
        Value::Object(map) => {
            if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
                return;
            }
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, v) in map {
                    match props.get(k) {
                        Some(s) => unknown_fields(v, s, &join(k), out),
                        None => out.push(join(k)),
                    }
                }
            } else if let Some(s) = schema.get("additionalProperties") {
                for (k, v) in map {
                    unknown_fields(v, s, &join(k), out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    unknown_fields(v, s, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// Fills in the schema's `default`s where `value` leaves a field out (or null), recursively,
/// as the API server does for a CRD.
fn fill_defaults(value: &mut Value, schema: &Value) {
    match value {
        Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, s) in props {
                    match map.get_mut(k) {
                        Some(v) if !v.is_null() => fill_defaults(v, s),
                        _ => {
                            if let Some(d) = s.get("default") {
                                let mut d = d.clone();
                                fill_defaults(&mut d, s);
                                map.insert(k.clone(), d);
                            }
                        }
                    }
                }
            } else if let Some(s) = schema.get("additionalProperties") {
                map.values_mut().for_each(|v| fill_defaults(v, s));
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                items.iter_mut().for_each(|v| fill_defaults(v, s));
            }
        }
        _ => {}
    }
}

/// The document as kind `K`: no unknown field, a name, the namespace settled, the CRD's
/// defaults filled in.
fn typed<K: Serialize + DeserializeOwned + kube::Resource>(
    kind: &str,
    mut body: Value,
    namespace: &str,
) -> Result<K, String> {
    let mut unknown = Vec::new();
    if let Some(schema) = schemas().get(kind) {
        unknown_fields(&body, schema, "", &mut unknown);
    }
    if let Some(Value::Object(meta)) = body.get("metadata") {
        unknown.extend(
            meta.keys()
                .filter(|k| !METADATA_FIELDS.contains(&k.as_str()))
                .map(|k| format!("metadata.{k}")),
        );
    }
    if !unknown.is_empty() {
        return Err(format!(
            "unknown field{s} {list} (not in the {kind} CRD)",
            s = if unknown.len() == 1 { "" } else { "s" },
            list = unknown
                .iter()
                .map(|u| format!("\"{u}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    // Only name, namespace, labels and annotations are the document's to give.
    let meta = body
        .get("metadata")
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    let keep = |k: &str| meta.get(k).filter(|v| !v.is_null()).cloned();
    let mut kept = serde_json::Map::new();
    for k in ["name", "namespace", "labels", "annotations"] {
        if let Some(v) = keep(k) {
            kept.insert(k.into(), v);
        }
    }
    body["metadata"] = Value::Object(kept);
    // A kind whose spec has no required field may leave it out (upstream's CRDs do not
    // require it).
    if body.get("spec").is_none_or(Value::is_null) {
        body["spec"] = Value::Object(Default::default());
    }
    // The CRD's defaults, as the API server fills them in: the object is stored the same on
    // both backends, and a document applied again compares equal to what was stored.
    if let Some(schema) = schemas().get(kind) {
        fill_defaults(&mut body, schema);
    }
    let mut obj: K =
        serde_json::from_value(body).map_err(|e| format!("not a valid {kind}: {e}"))?;
    let m = obj.meta_mut();
    let name = m.name.clone().unwrap_or_default();
    if name.is_empty() {
        return Err("metadata.name is required".into());
    }
    validate_dns1123_subdomain(&name).map_err(|e| format!("metadata.name: {e}"))?;
    let wanted = if namespace.is_empty() {
        crate::service::admin_checks::DEFAULT_NAMESPACE
    } else {
        namespace
    };
    match m.namespace.as_deref() {
        Some(ns) if !namespace.is_empty() && ns != namespace => {
            return Err(format!(
                "its namespace {ns:?} does not match the namespace {namespace:?} of the request \
                 (pass -n {ns}, or leave metadata.namespace out)"
            ));
        }
        Some(ns) => {
            crate::service::admin_checks::validate_namespace(ns)
                .map_err(|e| format!("metadata.namespace: {e}"))?;
        }
        None => m.namespace = Some(wanted.to_string()),
    }
    Ok(obj)
}

/// Checks labels and annotations as the API server does, and an Exporter's labels against
/// the reserved prefix.
fn check_meta(meta: &metav1::ObjectMeta, reserved: bool) -> Result<(), String> {
    let labels = meta.labels.clone().unwrap_or_default();
    check_labels("metadata.labels", &labels, reserved)?;
    let annotations = meta.annotations.clone().unwrap_or_default();
    limits::check_labels("metadata.annotations", annotations.iter(), MAX_TEXT)
        .map_err(|s| s.message().to_string())?;
    for k in annotations.keys() {
        validate_qualified_name(k).map_err(|e| format!("metadata.annotations key {k:?}: {e}"))?;
    }
    Ok(())
}

fn check_labels(
    field: &str,
    labels: &BTreeMap<String, String>,
    reserved: bool,
) -> Result<(), String> {
    limits::check_count(field, labels.len(), MAX_LABELS).map_err(|s| s.message().to_string())?;
    for (k, v) in labels {
        crate::service::admin_checks::label_problem(k, v, reserved)
            .map_err(|e| format!("{field}: {e}"))?;
    }
    Ok(())
}

fn check_username(u: &Option<String>) -> Result<(), String> {
    if let Some(u) = u {
        limits::check_len("spec.username", u, MAX_TEXT).map_err(|s| s.message().to_string())?;
    }
    Ok(())
}

fn check_selector(field: &str, sel: &metav1::LabelSelector) -> Result<(), String> {
    LabelSelector::from_k8s(sel)
        .map(drop)
        .map_err(|e| format!("{field}: {e}", e = jumpstarter_core::error_chain(&e)))
}

/// The kind's own checks.
fn check(desired: &Desired) -> Result<(), String> {
    match desired {
        Desired::Client(c) => {
            check_meta(&c.metadata, false)?;
            check_username(&c.spec.username)
        }
        Desired::Exporter(e) => {
            check_meta(&e.metadata, true)?;
            check_username(&e.spec.username)
        }
        Desired::Policy(p) => {
            check_meta(&p.metadata, false)?;
            check_selector("spec.exporterSelector", &p.spec.exporter_selector)?;
            limits::check_count("spec.policies", p.spec.policies.len(), MAX_RULES)
                .map_err(|s| s.message().to_string())?;
            for (i, r) in p.spec.policies.iter().enumerate() {
                limits::check_len(
                    &format!("spec.policies[{i}].description"),
                    &r.description,
                    MAX_TEXT,
                )
                .map_err(|s| s.message().to_string())?;
                for (j, f) in r.from.iter().enumerate() {
                    check_selector(
                        &format!("spec.policies[{i}].from[{j}].clientSelector"),
                        &f.client_selector,
                    )?;
                }
                if let Some(d) = r.maximum_duration
                    && !d.0.is_positive()
                {
                    return Err(format!(
                        "spec.policies[{i}].maximumDuration: must be positive, got {d}"
                    ));
                }
            }
            Ok(())
        }
        Desired::Set(s) => {
            check_meta(&s.metadata, false)?;
            let name = s.metadata.name.as_deref().unwrap_or_default();
            s.spec.validate(name).map_err(|e| e.field_and_reason())?;
            let template_labels = s
                .spec
                .template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.clone())
                .unwrap_or_default();
            // The replicas' Exporters carry these labels.
            check_labels("spec.template.metadata.labels", &template_labels, true)
        }
        Desired::Class(c) => {
            check_meta(&c.metadata, false)?;
            let name = c.metadata.name.as_deref().unwrap_or_default();
            c.spec.validate(name).map_err(|e| e.field_and_reason())?;
            if let Some(r) = &c.spec.ca_bundle_config_map_ref
                && r.name.is_empty()
            {
                return Err("spec.caBundleConfigMapRef.name: must not be empty".into());
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::virtualtarget::{BindingMode, ReclaimPolicy, RecycleStrategy};

    const CLASS: &str = "\
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: VirtualTargetClass
metadata:
  name: local
spec:
  provisioner: local
";

    const SET: &str = "\
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata:
  name: mock-pool
  labels:
    team: qa
spec:
  virtualTargetClassName: local
  maxReplicas: 3
  minAvailableReplicas: 1
  selector:
    matchLabels:
      pool: mock
  template:
    metadata:
      labels:
        pool: mock
    spec:
      drivers:
        - name: power
          type: jumpstarter_driver_power.driver.MockPower
          config:
            any: [thing]
";

    fn docs(texts: &[&str]) -> Vec<String> {
        texts.iter().map(|t| t.to_string()).collect()
    }

    fn refused(texts: &[&str], ns: &str) -> String {
        let e = parse_documents(&docs(texts), ns).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{}", e.message());
        e.message().to_string()
    }

    #[test]
    fn documents_of_every_kind_read_in_order() {
        let client = "apiVersion: jumpstarter.dev/v1alpha1\nkind: Client\nmetadata:\n  name: ci\nspec:\n  username: internal:ci\n";
        let exporter = r#"{"apiVersion": "jumpstarter.dev/v1alpha1", "kind": "Exporter",
            "metadata": {"name": "board", "namespace": "lab", "labels": {"board": "rpi4"}},
            "spec": {}}"#;
        let policy = "\
apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterAccessPolicy
metadata: {name: p}
spec:
  exporterSelector: {matchLabels: {board: rpi4}}
  policies: [{priority: 1, from: [{clientSelector: {matchLabels: {team: qa}}}], maximumDuration: 1h}]
";
        let got = parse_documents(&docs(&[CLASS, SET, client, exporter, policy]), "").unwrap();
        let kinds: Vec<&str> = got.iter().map(|d| d.desired.kind()).collect();
        assert_eq!(
            kinds,
            [
                "VirtualTargetClass",
                "ExporterSet",
                "Client",
                "Exporter",
                "ExporterAccessPolicy"
            ]
        );
        assert_eq!(got[0].desired.namespace(), "default");
        assert_eq!(got[3].desired.namespace(), "lab");
        let Desired::Set(set) = &got[1].desired else {
            panic!("{:?}", got[1]);
        };
        assert_eq!(set.spec.max(), 3);
        // Free-form driver config is kept as given.
        let drivers = set
            .spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .drivers
            .as_ref()
            .unwrap();
        assert_eq!(
            drivers[0].config.as_ref().unwrap().0,
            serde_json::json!({"any": ["thing"]})
        );
        // The CRD's defaults are filled in, as the API server does.
        assert_eq!(set.spec.min_replicas, Some(0));
        assert_eq!(set.spec.scale_down_cooldown.as_deref(), Some("5m"));
        assert_eq!(
            set.spec.recycle_strategy,
            Some(RecycleStrategy::ExitAndReplace)
        );
        let Desired::Class(class) = &got[0].desired else {
            panic!("{:?}", got[0]);
        };
        assert_eq!(class.spec.binding_mode, Some(BindingMode::Immediate));
        assert_eq!(class.spec.reclaim_policy, Some(ReclaimPolicy::Delete));
        let Desired::Exporter(exporter) = &got[3].desired else {
            panic!("{:?}", got[3]);
        };
        assert_eq!(exporter.spec.enabled, Some(true));
        // The request's namespace applies to documents naming none.
        let got = parse_documents(&docs(&[CLASS]), "lab").unwrap();
        assert_eq!(got[0].desired.namespace(), "lab");
    }

    #[test]
    fn store_fields_are_dropped_and_status_is_never_taken() {
        let from_get = format!(
            "{SET}status:\n  replicas: 7\n  readyReplicas: 7\n"
        )
        .replace(
            "  name: mock-pool\n",
            "  name: mock-pool\n  uid: 1234\n  resourceVersion: \"99\"\n  creationTimestamp: \"2026-01-01T00:00:00Z\"\n",
        );
        let got = parse_documents(&docs(&[&from_get]), "").unwrap();
        assert!(got[0].status_ignored);
        let Desired::Set(set) = &got[0].desired else {
            panic!()
        };
        assert!(set.status.is_none());
        assert!(set.metadata.uid.is_none() && set.metadata.resource_version.is_none());
        assert_eq!(set.metadata.labels.as_ref().unwrap()["team"], "qa");
    }

    #[test]
    fn every_refusal_names_the_document_kind_and_name() {
        let cases: Vec<(String, &str)> = vec![
            ("a: [".into(), "document 2: not YAML or JSON"),
            ("- 1\n- 2\n".into(), "document 2: not an object"),
            ("kind: Client\nmetadata: {name: x}\n".into(), "apiVersion is required"),
            (
                "apiVersion: jumpstarter.dev/v1alpha1\nmetadata: {name: x}\n".into(),
                "kind is required",
            ),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n".into(),
                "document 2 (ConfigMap x): unknown kind \"ConfigMap\"",
            ),
            (
                CLASS.replace("virtualtarget.jumpstarter.dev/v1alpha1", "virtualtarget.jumpstarter.dev/v1"),
                "document 2 (VirtualTargetClass local): apiVersion \"virtualtarget.jumpstarter.dev/v1\" is not served",
            ),
            (
                "apiVersion: jumpstarter.dev/v1alpha1\nkind: Lease\nmetadata: {name: l}\n".into(),
                "document 2 (Lease l): leases are not applied",
            ),
            (
                CLASS.replace("  name: local\n", "  labels: {a: b}\n"),
                "document 2 (VirtualTargetClass): metadata.name is required",
            ),
            (
                CLASS.replace("  name: local\n", "  name: Local_1\n"),
                "document 2 (VirtualTargetClass Local_1): metadata.name",
            ),
            (
                SET.replace("maxReplicas: 3", "maxReplica: 3"),
                "document 2 (ExporterSet mock-pool): unknown field \"spec.maxReplica\"",
            ),
            (
                SET.replace("  name: mock-pool\n", "  name: mock-pool\n  colour: red\n"),
                "unknown field \"metadata.colour\"",
            ),
            (
                SET.replace("maxReplicas: 3", "maxReplicas: 3\n  minReplicas: 5"),
                "document 2 (ExporterSet mock-pool): spec.minReplicas: minReplicas must be less than or equal to maxReplicas",
            ),
            (
                SET.replace("pool: mock\n    spec", "pool: other\n    spec"),
                "(ExporterSet mock-pool): spec.selector",
            ),
            (
                SET.replace("maxReplicas: 3", "maxReplicas: many"),
                "(ExporterSet mock-pool): not a valid ExporterSet: invalid type",
            ),
            (
                SET.replace("        pool: mock\n    spec", "        pool: mock\n        jumpstarter.dev/name: x\n    spec"),
                "spec.template.metadata.labels: label key \"jumpstarter.dev/name\"",
            ),
            (
                CLASS.replace("provisioner: local", "provisioner: \"\""),
                "(VirtualTargetClass local): spec.provisioner",
            ),
            (
                "apiVersion: jumpstarter.dev/v1alpha1\nkind: Exporter\nmetadata:\n  name: e\n  labels: {\"bad key\": v}\n".into(),
                "(Exporter e): metadata.labels: label key \"bad key\"",
            ),
            (
                "apiVersion: jumpstarter.dev/v1alpha1\nkind: ExporterAccessPolicy\nmetadata: {name: p}\nspec:\n  policies: [{maximumDuration: 0s}]\n".into(),
                "(ExporterAccessPolicy p): spec.policies[0].maximumDuration",
            ),
        ];
        for (bad, expected) in cases {
            let msg = refused(&[CLASS, &bad, SET], "");
            assert!(msg.contains(expected), "{expected:?} not in {msg:?}");
        }
    }

    #[test]
    fn namespaces_must_agree_and_duplicates_are_refused() {
        let in_lab = CLASS.replace("  name: local\n", "  name: local\n  namespace: lab\n");
        assert!(parse_documents(&docs(&[&in_lab]), "lab").is_ok());
        let msg = refused(&[&in_lab], "other");
        assert!(
            msg.contains("document 1 (VirtualTargetClass local): its namespace \"lab\" does not match the namespace \"other\""),
            "{msg}"
        );
        let msg = refused(&[CLASS, CLASS], "");
        assert!(
            msg.contains("document 2 (VirtualTargetClass local): the same object"),
            "{msg}"
        );
        assert!(refused(&[], "").contains("no documents"));
        let many: Vec<&str> = vec![CLASS; MAX_DOCUMENTS + 1];
        assert!(refused(&many, "").contains("too many"));
        let huge = format!("{CLASS}# {}\n", "x".repeat(MAX_DOCUMENT_BYTES));
        assert!(refused(&[&huge], "").contains("document 1: too long"));
    }
}
