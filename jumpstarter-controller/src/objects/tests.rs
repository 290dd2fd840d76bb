#![allow(deprecated)] // `Exporter.online` is deprecated in the proto.

use super::*;
use kube::CustomResourceExt;
use serde_json::{Value, json};

const CRD_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/reference/crds");

/// The reference CRD as JSON, or `None` when the shared reference is not present (CI copies
/// shared/ next to the checkout, so it normally is).
fn reference(file: &str) -> Option<Value> {
    let path = format!("{CRD_DIR}/{file}");
    let text = std::fs::read_to_string(&path).ok()?;
    Some(serde_saphyr::from_str::<Value>(&text).unwrap())
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    k.sort();
    k
}

/// Compare names, scope, printer columns, subresources, and the property names and leaf types
/// of spec and status (recursively, down to `depth`).
fn compare_crd(ours: Value, file: &str) {
    let Some(theirs) = reference(file) else {
        // Developers without ../shared skip; CI always has it, so there it must not skip.
        assert!(
            std::env::var_os("CI").is_none(),
            "{CRD_DIR}/{file} not found (CI must have ../shared beside the checkout)"
        );
        eprintln!("skipping: {CRD_DIR}/{file} not found");
        return;
    };
    assert_eq!(ours["spec"]["group"], theirs["spec"]["group"]);
    assert_eq!(ours["spec"]["scope"], theirs["spec"]["scope"]);
    assert_eq!(ours["metadata"]["name"], theirs["metadata"]["name"]);
    for k in ["kind", "plural", "singular"] {
        assert_eq!(ours["spec"]["names"][k], theirs["spec"]["names"][k], "{k}");
    }
    let ov = &ours["spec"]["versions"][0];
    let tv = &theirs["spec"]["versions"][0];
    assert_eq!(ov["name"], tv["name"]);
    assert_eq!(ov["subresources"], tv["subresources"]);
    let cols = |v: &Value| -> Vec<(Value, Value, Value, Value)> {
        v["additionalPrinterColumns"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        (
                            c["name"].clone(),
                            c["jsonPath"].clone(),
                            c["type"].clone(),
                            c.get("priority").cloned().unwrap_or(json!(0)),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(cols(ov), cols(tv), "printer columns of {file}");
    let os = &ov["schema"]["openAPIV3Schema"]["properties"];
    let ts = &tv["schema"]["openAPIV3Schema"]["properties"];
    for part in ["spec", "status"] {
        compare_props(&os[part], &ts[part], &format!("{file}:{part}"), 4);
    }
}

fn compare_props(ours: &Value, theirs: &Value, at: &str, depth: usize) {
    assert_eq!(
        keys(&ours["properties"]),
        keys(&theirs["properties"]),
        "property names at {at}"
    );
    if theirs.get("type").is_some() {
        assert_eq!(ours["type"], theirs["type"], "type at {at}");
    }
    if depth == 0 {
        return;
    }
    for k in keys(&theirs["properties"]) {
        let (o, t) = (&ours["properties"][&k], &theirs["properties"][&k]);
        assert_eq!(o["type"], t["type"], "type at {at}.{k}");
        if t.get("format").is_some() {
            assert_eq!(o["format"], t["format"], "format at {at}.{k}");
        }
        // k8s-openapi's metav1.Condition schema has no enum/pattern validation (a known,
        // harmless difference from controller-gen's).
        if t.get("enum").is_some() && !at.contains("conditions") {
            assert_eq!(o["enum"], t["enum"], "enum at {at}.{k}");
        }
        compare_props(o, t, &format!("{at}.{k}"), depth - 1);
        if t["type"] == "array" {
            compare_props(&o["items"], &t["items"], &format!("{at}.{k}[]"), depth - 1);
        }
    }
}

#[test]
fn crds_match_reference() {
    // Upstream main's Client (0.9.0's plus `conditions`, `tokenExpiresAt` and its printer
    // column): what the token expiry needs.
    compare_crd(
        serde_json::to_value(Client::crd()).unwrap(),
        "../upstream-main-2026-08/jumpstarter.dev_clients.yaml",
    );
    compare_crd(
        serde_json::to_value(Exporter::crd()).unwrap(),
        "jumpstarter.dev_exporters.yaml",
    );
    // Our one addition to the Lease (`spec.sharedWith`, optional): checked, then set aside.
    let mut lease = serde_json::to_value(Lease::crd()).unwrap();
    let spec_props = &mut lease["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"];
    let shared = spec_props
        .as_object_mut()
        .and_then(|o| o.remove("sharedWith"))
        .expect("spec.sharedWith");
    assert_eq!(shared["type"], "array");
    assert_eq!(shared["items"]["type"], "string");
    // Upstream main's `spec.context` (after 0.9.0): as upstream main has it, then set aside.
    let context = spec_props
        .as_object_mut()
        .and_then(|o| o.remove("context"))
        .expect("spec.context");
    assert_eq!(context["type"], "object");
    assert_eq!(context["additionalProperties"]["type"], "string");
    assert_eq!(context["maxProperties"], 8);
    if let Some(main) = reference("../upstream-main-2026-08/jumpstarter.dev_leases.yaml") {
        let theirs = &main["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["context"];
        assert_eq!(context["maxProperties"], theirs["maxProperties"]);
        assert_eq!(context["type"], theirs["type"]);
    }
    compare_crd(lease, "jumpstarter.dev_leases.yaml");
    compare_crd(
        serde_json::to_value(ExporterAccessPolicy::crd()).unwrap(),
        "jumpstarter.dev_exporteraccesspolicies.yaml",
    );
}

#[test]
fn lease_crd_key_fields() {
    let crd = serde_json::to_value(Lease::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut required: Vec<&str> = spec["required"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    required.sort();
    // Upstream requires clientRef and selector; selector has a default so ours may omit it.
    assert!(required.contains(&"clientRef"), "{required:?}");
    assert_eq!(spec["properties"]["tags"]["maxProperties"], json!(10));
    assert_eq!(spec["properties"]["duration"]["type"], json!("string"));
    let rules = spec["x-kubernetes-validations"].as_array().unwrap();
    assert_eq!(rules.len(), 3);
    assert_eq!(
        rules[0]["message"],
        json!("one of selector or exporterRef.name is required")
    );
    assert_eq!(rules[2]["message"], json!("context is immutable once set"));
    let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
    assert_eq!(status["required"], json!(["ended"]));
    assert_eq!(
        status["properties"]["priority"],
        json!({"type": "integer", "description": "The effective priority from the access policy."})
    );
    let exp = serde_json::to_value(Exporter::crd()).unwrap();
    let enabled = &exp["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["enabled"];
    assert_eq!(enabled["default"], json!(true));
}

#[test]
fn objects_round_trip_upstream_json() {
    // Shapes as the Go controller writes them.
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "jumpstarter.dev/v1alpha1",
        "kind": "Lease",
        "metadata": {"name": "l1", "namespace": "lab", "labels": {"board": "rpi4"}},
        "spec": {
            "clientRef": {"name": "alice"},
            "duration": "30m0s",
            "selector": {"matchLabels": {"board": "rpi4"}},
            "tags": {"team": "qa"},
            "beginTime": "2026-01-01T10:00:00Z"
        },
        "status": {
            "beginTime": "2026-01-01T10:00:05Z",
            "ended": false,
            "exporterRef": {"name": "e1"},
            "priority": 5,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "Ready",
                "message": "An exporter has been acquired for the client",
                "lastTransitionTime": "2026-01-01T10:00:05Z"
            }]
        }
    }))
    .unwrap();
    assert_eq!(lease.spec.duration, Some(GoDuration::from_secs(1800)));
    assert_eq!(lease.assigned_exporter(), Some("e1"));
    let back = serde_json::to_value(&lease).unwrap();
    assert_eq!(back["spec"]["duration"], json!("30m0s"));
    assert_eq!(back["status"]["ended"], json!(false));
    assert_eq!(back["status"]["priority"], json!(5));
    assert!(back["spec"].get("release").is_none());
    assert!(back["status"].get("spotAccess").is_none());

    let exporter: Exporter = serde_json::from_value(json!({
        "apiVersion": "jumpstarter.dev/v1alpha1",
        "kind": "Exporter",
        "metadata": {"name": "e1", "namespace": "lab"},
        "spec": {},
        "status": {
            "exporterStatus": "",
            "devices": [{"uuid": "u1", "parent_uuid": "u0", "labels": {"a": "b"}}],
            "lastSeen": "2026-01-01T10:00:00Z"
        }
    }))
    .unwrap();
    let st = exporter.status.as_ref().unwrap();
    assert_eq!(st.exporter_status, None);
    assert_eq!(
        st.devices.as_ref().unwrap()[0].parent_uuid.as_deref(),
        Some("u0")
    );
    assert!(exporter.is_enabled());
    let back = serde_json::to_value(&exporter).unwrap();
    assert_eq!(back["status"]["devices"][0]["parent_uuid"], json!("u0"));

    let bad = serde_json::from_value::<Exporter>(json!({
        "apiVersion": "jumpstarter.dev/v1alpha1", "kind": "Exporter",
        "metadata": {"name": "e1"}, "spec": {},
        "status": {"exporterStatus": "Sleeping"}
    }))
    .unwrap_err();
    assert!(bad.to_string().contains("\"Sleeping\""), "{bad}");

    let policy: ExporterAccessPolicy = serde_json::from_value(json!({
        "apiVersion": "jumpstarter.dev/v1alpha1", "kind": "ExporterAccessPolicy",
        "metadata": {"name": "p", "namespace": "lab"},
        "spec": {
            "exporterSelector": {"matchLabels": {"pool": "a"}},
            "policies": [{
                "description": "qa team", "priority": 10, "maximumDuration": "1h",
                "from": [{"clientSelector": {"matchLabels": {"team": "qa"}}}]
            }]
        }
    }))
    .unwrap();
    assert_eq!(
        policy.spec.policies[0].maximum_duration,
        Some(GoDuration::from_secs(3600))
    );
}

#[test]
fn exporter_status_mapping_is_total() {
    for n in 0..8 {
        let v = exporter_status_from_proto(n).unwrap();
        assert_eq!(pb::ExporterStatus::from(v) as i32, n);
        assert_eq!(ExporterStatusValue::from_str_opt(v.as_str()), Some(v));
        assert_eq!(
            serde_json::to_value(v).unwrap(),
            json!(v.as_str()),
            "serde name of {v:?}"
        );
    }
    assert_eq!(
        exporter_status_from_proto(8),
        Err(ObjectError::UnknownExporterStatus(8))
    );
    assert_eq!(
        exporter_status_to_proto(None),
        pb::ExporterStatus::Unspecified
    );
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

#[test]
fn online_state_follows_last_seen() {
    let now = ts("2026-01-01T10:00:00Z");
    let st = |seen: Option<&str>, status: Option<ExporterStatusValue>| ExporterStatus {
        last_seen: seen.map(|s| metav1::Time(ts(s))),
        exporter_status: status,
        status_message: "Exporter shutting down".into(),
        ..Default::default()
    };
    let never = exporter_online_state(Some(&st(None, None)), now);
    assert_eq!(
        (never.online, never.message.as_str()),
        (false, "Never seen")
    );
    assert_eq!(never.force_offline_message, None);
    let stale = exporter_online_state(Some(&st(Some("2026-01-01T09:58:59Z"), None)), now);
    assert!(!stale.online && stale.force_offline_message.is_some());
    let off = exporter_online_state(
        Some(&st(
            Some("2026-01-01T09:59:30Z"),
            Some(ExporterStatusValue::Offline),
        )),
        now,
    );
    assert_eq!(
        (off.online, off.reason, off.message.as_str()),
        (false, "Offline", "Exporter shutting down")
    );
    let on = exporter_online_state(
        Some(&st(
            Some("2026-01-01T09:59:30Z"),
            Some(ExporterStatusValue::Available),
        )),
        now,
    );
    assert!(on.online);
    assert_eq!(on.reason, "Seen");
    assert!(!exporter_online_state(None, now).online);
}

#[test]
fn set_condition_keeps_transition_time_when_status_is_unchanged() {
    let t1 = ts("2026-01-01T10:00:00Z");
    let t2 = ts("2026-01-01T11:00:00Z");
    let mut conds = Vec::new();
    assert!(set_condition(
        &mut conds, "Pending", true, "Offline", "a", None, t1
    ));
    assert!(set_condition(
        &mut conds, "Pending", true, "NotReady", "b", None, t2
    ));
    assert_eq!(conds[0].last_transition_time.0, t1);
    assert_eq!(conds[0].reason, "NotReady");
    assert!(!set_condition(
        &mut conds, "Pending", true, "NotReady", "b", None, t2
    ));
    assert!(set_condition(
        &mut conds, "Pending", false, "Ready", "c", None, t2
    ));
    assert_eq!(conds[0].last_transition_time.0, t2);
    assert_eq!(conds.len(), 1);
}

fn times(b: Option<&str>, e: Option<&str>, d: Option<i64>) -> LeaseTimes {
    LeaseTimes {
        begin: b.map(ts),
        end: e.map(ts),
        duration: d.map(SignedDuration::from_secs),
    }
}

#[test]
fn lease_time_reconciliation() {
    let b = "2026-01-01T10:00:00Z";
    let e = "2026-01-01T11:00:00Z";
    // begin + end → duration.
    let t = reconcile_lease_times(times(Some(b), Some(e), None)).unwrap();
    assert_eq!(t.duration, Some(SignedDuration::from_secs(3600)));
    // Matching explicit duration is fine.
    assert!(reconcile_lease_times(times(Some(b), Some(e), Some(3600))).is_ok());
    // end + duration → begin.
    let t = reconcile_lease_times(times(None, Some(e), Some(1800))).unwrap();
    assert_eq!(t.begin, Some(ts("2026-01-01T10:30:00Z")));
    // begin + duration, or duration alone, stay as they are.
    let t = reconcile_lease_times(times(Some(b), None, Some(60))).unwrap();
    assert_eq!((t.begin, t.end), (Some(ts(b)), None));
    assert!(reconcile_lease_times(times(None, None, Some(60))).is_ok());

    let err = |t: LeaseTimes| reconcile_lease_times(t).unwrap_err().to_string();
    assert!(err(times(Some(b), Some(e), Some(60))).contains("conflicts"));
    assert!(err(times(Some(e), Some(b), None)).contains("must be after"));
    assert!(err(times(Some(b), Some(b), None)).contains("must be after"));
    assert!(err(times(None, None, Some(-5))).contains("must be positive, got -5s"));
    assert!(err(times(None, None, Some(0))).contains("duration is required"));
    assert!(err(times(None, None, None)).contains("duration is required"));
    assert!(err(times(Some(b), None, None)).contains("duration is required"));
    assert!(err(times(None, Some(e), None)).contains("duration is required"));
}

#[test]
fn tag_validation() {
    let tags = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert!(validate_lease_tags(&tags(&[("team", "qa"), ("ci.job", "123")]), 10).is_ok());
    let cases = [
        (tags(&[("jumpstarter.dev/x", "1")]), "must not start with"),
        (
            tags(&[("metadata.jumpstarter.dev/x", "1")]),
            "must not start with",
        ),
        (tags(&[("a/b", "1")]), "must not contain '/'"),
        (tags(&[("-a", "1")]), "tag key \"-a\""),
        (tags(&[("a", "bad value")]), "tag \"a\" value \"bad value\""),
        (
            tags(&[("a", "1"), ("b", "2")]),
            "too many tags: 2 (at most 1",
        ),
    ];
    for (t, needle) in cases {
        let e = validate_lease_tags(&t, 1).unwrap_err().to_string();
        assert!(e.starts_with("invalid lease tags: "), "{e}");
        assert!(e.contains(needle), "{e}");
    }
}

fn proto_lease(selector: &str) -> client_v1::Lease {
    client_v1::Lease {
        selector: selector.into(),
        duration: Some(prost_types::Duration {
            seconds: 1800,
            nanos: 0,
        }),
        ..Default::default()
    }
}

#[test]
fn lease_from_proto_builds_spec_and_labels() {
    let mut req = proto_lease("board=rpi4,site!=lab2,site!=lab3,metadata.jumpstarter.dev/x=y");
    req.tags.insert("team".into(), "qa".into());
    req.exporter_name = Some("e1".into());
    req.allow_disabled = true;
    let l = lease_from_proto(&req, "lab", "l1", "alice", DEFAULT_MAX_TAGS).unwrap();
    assert_eq!(l.metadata.namespace.as_deref(), Some("lab"));
    assert_eq!(l.spec.client_ref.name, "alice");
    assert_eq!(l.spec.duration, Some(GoDuration::from_secs(1800)));
    assert_eq!(l.spec.exporter_ref.as_ref().unwrap().name, "e1");
    assert!(l.spec.allow_disabled);
    let sel = &l.spec.selector;
    assert_eq!(
        sel.match_labels
            .as_ref()
            .unwrap()
            .get("board")
            .map(String::as_str),
        Some("rpi4")
    );
    let expr = &sel.match_expressions.as_ref().unwrap()[0];
    assert_eq!(
        (expr.key.as_str(), expr.operator.as_str()),
        ("site", "NotIn")
    );
    assert_eq!(
        expr.values.as_deref(),
        Some(&["lab2".to_string(), "lab3".to_string()][..])
    );
    let labels = l.metadata.labels.clone().unwrap();
    assert_eq!(labels.get("board").map(String::as_str), Some("rpi4"));
    assert_eq!(
        labels
            .get("metadata.jumpstarter.dev/team")
            .map(String::as_str),
        Some("qa")
    );
    // matchLabels under the tag prefix are not copied (they would fake tags).
    assert!(!labels.contains_key("metadata.jumpstarter.dev/x"));
    assert!(!labels.contains_key(LEASE_ENDED_LABEL));

    // Only an exporter name is enough.
    let mut req = proto_lease("");
    req.exporter_name = Some("e1".into());
    let l = lease_from_proto(&req, "lab", "l2", "alice", DEFAULT_MAX_TAGS).unwrap();
    assert_eq!(l.metadata.labels, None);
    assert_eq!(lease_to_proto(&l, Timestamp::UNIX_EPOCH).selector, "<none>");
}

#[test]
fn lease_from_proto_rejects_bad_input() {
    let e = lease_from_proto(&proto_lease("  "), "lab", "l", "c", 10).unwrap_err();
    assert_eq!(e, ObjectError::SelectorOrExporterRequired);
    assert_eq!(
        e.to_string(),
        "one of selector or exporter_name is required"
    );
    let e = lease_from_proto(&proto_lease("a in (b"), "lab", "l", "c", 10).unwrap_err();
    assert!(matches!(e, ObjectError::Selector(_)), "{e}");
    let mut req = proto_lease("a=b");
    req.tags.insert("jumpstarter.dev/x".into(), "1".into());
    let e = lease_from_proto(&req, "lab", "l", "c", 10).unwrap_err();
    assert!(matches!(e, ObjectError::InvalidTags(_)), "{e}");
    let mut req = proto_lease("a=b");
    req.duration = None;
    let e = lease_from_proto(&req, "lab", "l", "c", 10).unwrap_err();
    assert!(e.to_string().contains("duration is required"), "{e}");
    let mut req = proto_lease("a=b");
    req.duration = Some(prost_types::Duration {
        seconds: -1,
        nanos: 0,
    });
    let e = lease_from_proto(&req, "lab", "l", "c", 10).unwrap_err();
    assert!(e.to_string().contains("must be positive"), "{e}");
    let mut req = proto_lease("a=b");
    req.begin_time = Some(prost_types::Timestamp {
        seconds: i64::MAX,
        nanos: 0,
    });
    let e = lease_from_proto(&req, "lab", "l", "c", 10).unwrap_err();
    assert!(e.to_string().contains("begin_time"), "{e}");
}

#[test]
fn lease_to_proto_maps_every_field() {
    let mut req = proto_lease("board=rpi4,site!=x");
    req.begin_time = Some(prost_types::Timestamp {
        seconds: 1_767_261_600, // 2026-01-01T10:00:00Z
        nanos: 0,
    });
    req.tags.insert("team".into(), "qa".into());
    let mut l = lease_from_proto(&req, "lab", "l1", "alice", 10).unwrap();
    let begun = ts("2026-01-01T10:00:05Z");
    let mut conds = Vec::new();
    set_condition(
        &mut conds,
        conditions::READY,
        true,
        conditions::REASON_READY,
        "An exporter has been acquired for the client",
        Some(1),
        begun,
    );
    l.status = Some(LeaseStatus {
        begin_time: Some(metav1::Time(begun)),
        exporter_ref: Some(LocalObjectReference { name: "e1".into() }),
        conditions: conds,
        ..Default::default()
    });
    let p = lease_to_proto(&l, ts("2026-01-01T10:01:05Z"));
    assert_eq!(p.name, "namespaces/lab/leases/l1");
    assert_eq!(p.selector, "board=rpi4,site notin (x)");
    assert_eq!(p.client.as_deref(), Some("namespaces/lab/clients/alice"));
    assert_eq!(p.exporter.as_deref(), Some("namespaces/lab/exporters/e1"));
    assert_eq!(p.exporter_name, None);
    assert_eq!(p.duration.as_ref().map(|d| d.seconds), Some(1800));
    assert_eq!(
        p.begin_time.as_ref().map(|t| t.seconds),
        Some(1_767_261_600)
    );
    assert_eq!(p.end_time, None);
    assert_eq!(
        p.effective_begin_time.as_ref().map(|t| t.seconds),
        Some(1_767_261_605)
    );
    assert_eq!(p.effective_end_time, None);
    assert_eq!(p.effective_duration.as_ref().map(|d| d.seconds), Some(60));
    assert_eq!(p.tags.get("team").map(String::as_str), Some("qa"));
    let c = &p.conditions[0];
    assert_eq!(c.r#type.as_deref(), Some("Ready"));
    assert_eq!(c.status.as_deref(), Some("True"));
    assert_eq!(c.observed_generation, Some(1));
    assert_eq!(
        c.last_transition_time.as_ref().and_then(|t| t.seconds),
        Some(1_767_261_605)
    );
    // Ended: the effective duration stops at the end.
    if let Some(s) = l.status.as_mut() {
        s.end_time = Some(metav1::Time(ts("2026-01-01T10:00:35Z")));
        s.ended = true;
    }
    let p = lease_to_proto(&l, ts("2026-01-01T12:00:00Z"));
    assert_eq!(p.effective_duration.as_ref().map(|d| d.seconds), Some(30));
    assert!(lease_labels(&l).contains_key(LEASE_ENDED_LABEL));
    // The labels as if the status said otherwise: the same but for the ended label.
    let mut not_ended = lease_labels_with(&l, false);
    assert!(!not_ended.contains_key(LEASE_ENDED_LABEL));
    not_ended.insert(LEASE_ENDED_LABEL.to_string(), "true".to_string());
    assert_eq!(not_ended, lease_labels(&l));
    // A selector the API server would reject shows as "<error>", as upstream.
    l.spec.selector.match_labels = Some([("bad key".to_string(), "v".to_string())].into());
    assert_eq!(lease_to_proto(&l, begun).selector, "<error>");
}

#[test]
fn lease_expiration() {
    let mut l = Lease::new(
        "l",
        LeaseSpec {
            duration: Some(GoDuration::from_secs(60)),
            ..Default::default()
        },
    );
    assert_eq!(l.expiration(), None);
    let begun = LeaseStatus {
        begin_time: Some(metav1::Time(ts("2026-01-01T10:00:10Z"))),
        ..Default::default()
    };
    // As if the lease had that status (the scheduler's new one), without copying it.
    assert_eq!(
        l.expiration_with(Some(&begun)),
        Some(ts("2026-01-01T10:01:10Z"))
    );
    assert_eq!(l.expiration_with(None), None);
    l.status = Some(begun);
    assert_eq!(l.expiration(), Some(ts("2026-01-01T10:01:10Z")));
    l.spec.begin_time = Some(metav1::Time(ts("2026-01-01T10:00:00Z")));
    assert_eq!(l.expiration(), Some(ts("2026-01-01T10:01:00Z")));
    l.spec.end_time = Some(metav1::Time(ts("2026-01-01T10:00:30Z")));
    assert_eq!(l.expiration(), Some(ts("2026-01-01T10:00:30Z")));
}

#[test]
fn exporter_to_proto_maps_fields() {
    let mut e = Exporter::new("e1", ExporterSpec::default());
    e.metadata.namespace = Some("lab".into());
    e.metadata.labels = Some([("board".to_string(), "rpi4".to_string())].into());
    let p = exporter_to_proto(&e);
    assert_eq!(p.name, "namespaces/lab/exporters/e1");
    assert_eq!(p.enabled, Some(true));
    assert!(!p.online);
    assert_eq!(p.status, pb::ExporterStatus::Unspecified as i32);
    e.spec.enabled = Some(false);
    let mut st = ExporterStatus {
        exporter_status: Some(ExporterStatusValue::LeaseReady),
        status_message: "Ready for commands".into(),
        ..Default::default()
    };
    set_condition(
        &mut st.conditions,
        conditions::ONLINE,
        true,
        conditions::REASON_SEEN,
        "Last seen less than 1 minute ago",
        None,
        Timestamp::UNIX_EPOCH,
    );
    e.status = Some(st);
    let p = exporter_to_proto(&e);
    assert_eq!(p.enabled, Some(false));
    assert!(p.online);
    assert_eq!(p.status, pb::ExporterStatus::LeaseReady as i32);
    assert_eq!(p.status_message, "Ready for commands");
    assert_eq!(p.labels.get("board").map(String::as_str), Some("rpi4"));
}

#[test]
fn hidden_and_deprecated_labels_are_shown_as_the_policy_says() {
    let mut e = Exporter::new("e1", ExporterSpec::default());
    e.metadata.namespace = Some("lab".into());
    e.metadata.labels = Some(
        [
            ("board", "rpi4"),
            ("internal.example.com/rack", "r7"),
            ("old-board", "rpi4"),
            ("hidden.jumpstarter.dev/owner", "ci"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
    );
    let policy = LabelPolicy {
        hidden: ["internal.example.com/rack".to_string()].into(),
        deprecated: [
            ("old-board".to_string(), "use board".to_string()),
            ("not-on-it".to_string(), "use something".to_string()),
        ]
        .into(),
    };
    let keys = |p: &client_v1::Exporter| {
        let mut k: Vec<String> = p.labels.keys().cloned().collect();
        k.sort();
        k
    };
    // Default: hidden and deprecated keys left out; the deprecated one the exporter carries
    // is reported with its message, the other not.
    let mut p = exporter_to_proto(&e);
    policy.apply(&mut p, false);
    assert_eq!(keys(&p), ["board"]);
    assert_eq!(
        p.deprecated_labels,
        [("old-board".to_string(), "use board".to_string())].into()
    );
    // Asked for: every label, still with the deprecation.
    let mut p = exporter_to_proto(&e);
    policy.apply(&mut p, true);
    assert_eq!(
        keys(&p),
        [
            "board",
            "hidden.jumpstarter.dev/owner",
            "internal.example.com/rack",
            "old-board"
        ]
    );
    assert_eq!(p.deprecated_labels.len(), 1);
    // No policy: as stored, but for the keys under `hidden.jumpstarter.dev/`.
    let mut p = exporter_to_proto(&e);
    LabelPolicy::default().apply(&mut p, false);
    assert_eq!(
        keys(&p),
        ["board", "internal.example.com/rack", "old-board"]
    );
    assert!(p.deprecated_labels.is_empty());
    let mut p = exporter_to_proto(&e);
    LabelPolicy::default().apply(&mut p, true);
    assert_eq!(keys(&p).len(), 4);
}

#[test]
fn a_lease_selector_using_deprecated_labels_reports_them_with_their_messages() {
    let policy = LabelPolicy {
        deprecated: [("old-board".to_string(), "use board".to_string())].into(),
        ..LabelPolicy::default()
    };
    let mut lease = client_v1::Lease {
        selector: "old-board=rpi4,!old-board-x,team in (a,b)".into(),
        ..Default::default()
    };
    policy.annotate_lease(&mut lease);
    assert_eq!(
        lease.deprecated_labels,
        [("old-board".to_string(), "use board".to_string())].into()
    );
    let mut lease = client_v1::Lease {
        selector: "board=rpi4".into(),
        ..Default::default()
    };
    policy.annotate_lease(&mut lease);
    assert!(lease.deprecated_labels.is_empty());
}

#[test]
fn token_expiring_follows_upstream_mains_thresholds() {
    let now: Timestamp = "2026-12-01T00:00:00Z".parse().unwrap();
    let at = |days: i64| now + SignedDuration::from_hours(days * 24);
    for (days, status, reason, message) in [
        (
            -1,
            "True",
            "Expired",
            "Token expired on 2026-11-30T00:00:00Z",
        ),
        (
            3,
            "True",
            "ExpiresWithin7Days",
            "Token expires on 2026-12-04T00:00:00Z (3 days remaining)",
        ),
        (7, "True", "ExpiresWithin7Days", "(7 days remaining)"),
        (20, "True", "ExpiresWithin30Days", "(20 days remaining)"),
        (365, "False", "Valid", "(365 days remaining)"),
    ] {
        let mut s = ClientStatus::default();
        assert!(set_token_expiry(&mut s, at(days), Some(2), now));
        assert_eq!(s.token_expires_at, Some(metav1::Time(at(days))));
        let c = find_condition(&s.conditions, TOKEN_EXPIRING).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            (status, reason),
            "{days}"
        );
        assert!(c.message.contains(message), "{days}: {}", c.message);
        assert_eq!(c.observed_generation, Some(2));
        // Nothing new: nothing changes.
        assert!(!set_token_expiry(&mut s, at(days), Some(2), now));
    }
}

#[test]
fn a_lease_context_is_checked_entry_by_entry() {
    let ctx = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert!(validate_lease_context(&ctx(&[])).is_ok());
    assert!(
        validate_lease_context(&ctx(&[
            ("build_id", "123"),
            ("image_digest", "sha256:0123abcd"),
            ("vcs.ref", "refs/heads/main, with comma")
        ]))
        .is_ok()
    );
    let nine: Vec<(String, String)> = (0..9).map(|i| (format!("k{i}"), "v".to_string())).collect();
    let e = validate_lease_context(&nine.into_iter().collect()).unwrap_err();
    assert!(e.to_string().contains("9 entries (at most 8)"), "{e}");
    for (k, v, says) in [
        ("", "v", "key \"\""),
        ("_x", "v", "starting"),
        ("a b", "v", "key \"a b\""),
        (&"k".repeat(33) as &str, "v", "1 to 32"),
        ("k", &"v".repeat(65) as &str, "65 characters"),
        ("k", "line\nbreak", "control characters"),
    ] {
        let e = validate_lease_context(&ctx(&[(k, v)])).unwrap_err();
        assert!(e.to_string().contains(says), "{k:?}={v:?}: {e}");
        assert!(e.to_string().starts_with("invalid lease context"), "{e}");
    }
}
