//! The checks and small conversions the admin service shares with its Apply and pool views
//! (kept apart so that those modules need not import the service).

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

use crate::objects::timestamp_to_proto;
use crate::objects::{
    RESERVED_LABEL_PREFIX,
    selector::{validate_dns1123_subdomain, validate_label_value, validate_qualified_name},
};

/// The namespace used when a request leaves it empty.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Longest namespace (a DNS-1123 label).
const NAMESPACE_MAX: usize = 63;

/// Kubernetes namespace rules (a DNS-1123 label).
pub(crate) fn validate_namespace(ns: &str) -> Result<(), String> {
    if ns.len() > NAMESPACE_MAX {
        return Err(format!(
            "{ns:?} must be no more than {NAMESPACE_MAX} characters"
        ));
    }
    if ns.contains('.') {
        return Err(format!(
            "{ns:?} must be a DNS-1123 label: lowercase alphanumeric characters or '-', \
             starting and ending with an alphanumeric character (no '.')"
        ));
    }
    validate_dns1123_subdomain(ns)
}

/// What the API server would refuse in one label (`label key "a b": ...`, `value ... of label
/// ...`); with `reserved`, also a key under the prefix an exporter reports itself.
pub(crate) fn label_problem(k: &str, v: &str, reserved: bool) -> Result<(), String> {
    validate_qualified_name(k).map_err(|e| format!("label key {k:?}: {e}"))?;
    validate_label_value(v).map_err(|e| format!("value {v:?} of label {k:?}: {e}"))?;
    if reserved && k.starts_with(RESERVED_LABEL_PREFIX) {
        return Err(format!(
            "label key {k:?}: the {RESERVED_LABEL_PREFIX} prefix is reserved for labels the \
             exporter reports itself"
        ));
    }
    Ok(())
}

/// When an object was created, for the admin API's messages.
pub(crate) fn created(m: &metav1::ObjectMeta) -> Option<prost_types::Timestamp> {
    m.creation_timestamp
        .as_ref()
        .map(|t| timestamp_to_proto(t.0))
}
