use super::*;
use crate::objects::LeaseSpec;
use jumpstarter_core::config::ExporterConfig;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn scaling(min: usize, max: usize, min_available: usize) -> Scaling {
    Scaling {
        min,
        max,
        min_available,
        cooldown: SignedDuration::from_secs(60),
        exit_and_replace: false,
        max_starts: 4,
    }
}

fn r(name: &str, state: ReplicaState) -> ReplicaView {
    ReplicaView {
        name: name.into(),
        state,
        idle_since: None,
    }
}

fn idle(name: &str, since: i64) -> ReplicaView {
    ReplicaView {
        name: name.into(),
        state: ReplicaState::Available,
        idle_since: Some(t(since)),
    }
}

fn removed(p: &Plan) -> Vec<(&str, Action)> {
    p.remove
        .iter()
        .map(|r| (r.name.as_str(), r.action))
        .collect()
}

use ReplicaState::*;

#[test]
fn decisions_table() {
    // (case, scaling, replicas, pending leases, now) -> (start, drain, removed, limited)
    struct Case {
        what: &'static str,
        s: Scaling,
        replicas: Vec<ReplicaView>,
        pending: usize,
        start: usize,
        drain: Vec<&'static str>,
        remove: Vec<(&'static str, Action)>,
        limited: bool,
    }
    let cases = vec![
        Case {
            what: "empty warm pool of 2 fills",
            s: scaling(0, 4, 2),
            replicas: vec![],
            pending: 0,
            start: 2,
            drain: vec![],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "replicas still starting count as coming: no second start",
            s: scaling(0, 4, 2),
            replicas: vec![r("a", Starting), r("b", Starting)],
            pending: 0,
            start: 0,
            drain: vec![],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "warm pool full: nothing to do",
            s: scaling(0, 4, 2),
            replicas: vec![idle("a", 0), idle("b", 0)],
            pending: 0,
            start: 0,
            drain: vec![],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "a leased replica is replaced in the warm pool",
            s: scaling(0, 4, 2),
            replicas: vec![r("a", Leased), idle("b", 0)],
            pending: 0,
            start: 1,
            drain: vec![],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "queued leases from zero: one replica each",
            s: scaling(0, 4, 0),
            replicas: vec![],
            pending: 3,
            start: 3,
            drain: vec![],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "queued leases beyond max: limited",
            s: scaling(0, 2, 0),
            replicas: vec![r("a", Leased)],
            pending: 3,
            start: 1,
            drain: vec![],
            remove: vec![],
            limited: true,
        },
        Case {
            what: "at max with leases waiting: nothing started, limited",
            s: scaling(0, 2, 0),
            replicas: vec![r("a", Leased), r("b", Leased)],
            pending: 1,
            start: 0,
            drain: vec![],
            remove: vec![],
            limited: true,
        },
        Case {
            what: "at max with no lease waiting: not limited",
            s: scaling(0, 2, 3),
            replicas: vec![r("a", Leased), r("b", Leased)],
            pending: 0,
            start: 0,
            drain: vec![],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "starts are rate-limited per pass",
            s: Scaling {
                max_starts: 2,
                ..scaling(0, 0, 0)
            },
            replicas: vec![],
            pending: 10,
            start: 0,
            drain: vec![],
            remove: vec![],
            limited: true,
        },
        Case {
            what: "rate limit with room",
            s: Scaling {
                max_starts: 2,
                ..scaling(0, usize::MAX, 0)
            },
            replicas: vec![],
            pending: 10,
            start: 2,
            drain: vec![],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "cooldown not yet elapsed: the excess stays",
            s: scaling(0, 4, 0),
            replicas: vec![idle("a", 50)],
            pending: 0,
            start: 0,
            drain: vec![],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "scale to zero after the cooldown",
            s: scaling(0, 4, 0),
            replicas: vec![idle("a", 0), idle("b", 30)],
            pending: 0,
            start: 0,
            drain: vec!["a", "b"],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "scale down keeps the warm pool, longest idle goes first",
            s: scaling(0, 4, 1),
            replicas: vec![idle("b", 10), idle("a", 20), r("c", Leased)],
            pending: 0,
            start: 0,
            drain: vec!["b"],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "scale down never below minReplicas",
            s: scaling(2, 4, 0),
            replicas: vec![idle("a", 0), idle("b", 0), idle("c", 0)],
            pending: 0,
            start: 0,
            drain: vec!["a"],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "minReplicas above what is wanted for leases",
            s: scaling(3, 4, 0),
            replicas: vec![r("a", Leased)],
            pending: 0,
            start: 2,
            drain: vec![],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "min > available: fill both floors",
            s: scaling(1, 4, 2),
            replicas: vec![r("a", Leased)],
            pending: 0,
            start: 2,
            drain: vec![],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "a waiting lease keeps an idle replica (it is about to be granted)",
            s: scaling(0, 4, 0),
            replicas: vec![idle("a", 0)],
            pending: 1,
            start: 0,
            drain: vec![],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "ended replicas are removed before new ones are counted (tight max)",
            s: scaling(0, 1, 1),
            replicas: vec![r("a", Ended { failed: false })],
            pending: 0,
            start: 1,
            drain: vec![],
            remove: vec![("a", Action::Replace)],
            limited: false,
        },
        Case {
            what: "a killed replica is replaced",
            s: scaling(0, 4, 1),
            replicas: vec![r("a", Ended { failed: true })],
            pending: 0,
            start: 1,
            drain: vec![],
            remove: vec![("a", Action::Replace)],
            limited: false,
        },
        Case {
            what: "quarantined: replaced when unleased, kept while leased",
            s: scaling(0, 4, 1),
            replicas: vec![
                r("a", Quarantined { leased: false }),
                r("b", Quarantined { leased: true }),
            ],
            pending: 0,
            start: 1,
            drain: vec![],
            remove: vec![("a", Action::Replace)],
            limited: false,
        },
        Case {
            what: "orphaned replicas are replaced",
            s: scaling(0, 4, 1),
            replicas: vec![r("a", Orphaned)],
            pending: 0,
            start: 1,
            drain: vec![],
            remove: vec![("a", Action::Replace)],
            limited: false,
        },
        Case {
            what: "never ready: replaced",
            s: scaling(0, 4, 1),
            replicas: vec![r("a", NeverReady)],
            pending: 0,
            start: 1,
            drain: vec![],
            remove: vec![("a", Action::Replace)],
            limited: false,
        },
        Case {
            what: "draining: removed once unleased, kept while leased",
            s: scaling(0, 4, 0),
            replicas: vec![
                r("a", Draining { leased: false }),
                r("b", Draining { leased: true }),
            ],
            pending: 0,
            start: 0,
            drain: vec![],
            remove: vec![("a", Action::ScaleDown)],
            limited: false,
        },
        Case {
            what: "a draining replica does not count towards minReplicas",
            s: scaling(1, 4, 0),
            replicas: vec![r("a", Draining { leased: true })],
            pending: 0,
            start: 1,
            drain: vec![],
            remove: vec![],
            limited: false,
        },
        Case {
            what: "retiring: waits for its exit, stopped when overdue",
            s: scaling(0, 4, 0),
            replicas: vec![
                r(
                    "a",
                    Retiring {
                        leased: false,
                        overdue: false,
                    },
                ),
                r(
                    "b",
                    Retiring {
                        leased: false,
                        overdue: true,
                    },
                ),
            ],
            pending: 0,
            start: 0,
            drain: vec![],
            remove: vec![("b", Action::Replace)],
            limited: false,
        },
        Case {
            what: "an admin-disabled replica is neither available nor removed",
            s: scaling(0, 4, 1),
            replicas: vec![r("a", Unavailable)],
            pending: 0,
            start: 1,
            drain: vec![],
            remove: vec![],
            limited: false,
        },
    ];
    for c in cases {
        let p = decide(&c.s, &c.replicas, c.pending, t(100));
        assert_eq!(p.start, c.start, "{}: start", c.what);
        assert_eq!(p.drain, c.drain, "{}: drain", c.what);
        assert_eq!(removed(&p), c.remove, "{}: remove", c.what);
        assert_eq!(p.limited.is_some(), c.limited, "{}: limited", c.what);
    }
}

#[test]
fn exit_and_replace_retires_leased_replicas_and_in_place_reuse_does_not() {
    let replicas = [r("a", Leased), idle("b", 0)];
    let mut s = scaling(0, 4, 1);
    assert!(decide(&s, &replicas, 0, t(100)).retire.is_empty());
    s.exit_and_replace = true;
    assert_eq!(decide(&s, &replicas, 0, t(100)).retire, vec!["a"]);
}

const SET: &str = r#"
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata:
  name: mock-pool
  namespace: lab
spec:
  virtualTargetClassName: local
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
            delay: 0
        - name: alias
          ref: power
"#;

fn set() -> ExporterSet {
    serde_saphyr::from_str(SET).unwrap()
}

#[test]
fn replica_config_is_an_exporter_config_jmp_run_reads() {
    let s = set();
    let yaml = replica_config(
        &s,
        "lab",
        "mock-pool-abcde",
        "ctl:8082",
        "tok",
        "-----BEGIN CERTIFICATE-----\n",
    )
    .unwrap();
    let cfg = ExporterConfig::parse(&yaml, std::path::Path::new("replica.yaml")).unwrap();
    assert_eq!(cfg.endpoint.as_deref(), Some("ctl:8082"));
    assert_eq!(cfg.token.as_deref(), Some("tok"));
    assert_eq!(cfg.metadata.name, "mock-pool-abcde");
    assert_eq!(cfg.metadata.namespace.as_deref(), Some("lab"));
    assert_eq!(
        jumpstarter_core::config::decode_ca(&cfg.tls, None)
            .unwrap()
            .as_deref(),
        Some("-----BEGIN CERTIFICATE-----\n")
    );
    assert!(!cfg.tls.insecure);
    assert!(cfg.exit_on_lease_end, "ExitAndReplace is the default");
    let keys: Vec<&str> = cfg.export.keys().map(String::as_str).collect();
    assert_eq!(keys, ["power", "alias"]);
    let power = &cfg.export["power"];
    assert_eq!(
        power.driver_type.as_ref().map(|t| t.value.as_str()),
        Some("jumpstarter_driver_power.driver.MockPower")
    );
    assert_eq!(power.config, serde_json::json!({"delay": 0}));
    assert_eq!(
        cfg.export["alias"]
            .reference
            .as_ref()
            .map(|t| t.value.as_str()),
        Some("power")
    );

    let mut reuse = set();
    reuse.spec.recycle_strategy = Some(RecycleStrategy::InPlaceReuse);
    let yaml = replica_config(&reuse, "lab", "n", "e:1", "t", "").unwrap();
    let cfg = ExporterConfig::parse(&yaml, std::path::Path::new("r.yaml")).unwrap();
    assert!(!cfg.exit_on_lease_end);
    assert_eq!(cfg.tls.ca, "", "no CA: system roots");
}

#[test]
fn duplicate_and_malformed_drivers_are_refused_naming_them() {
    let mut s = set();
    let drivers = s
        .spec
        .template
        .spec
        .as_mut()
        .unwrap()
        .drivers
        .as_mut()
        .unwrap();
    drivers[1] = drivers[0].clone();
    let e = replica_config(&s, "lab", "n", "e:1", "t", "").unwrap_err();
    assert!(e.to_string().contains("\"power\" is used twice"), "{e}");
    let mut s = set();
    s.spec
        .template
        .spec
        .as_mut()
        .unwrap()
        .drivers
        .as_mut()
        .unwrap()[0]
        .type_ = None;
    let e = replica_config(&s, "lab", "n", "e:1", "t", "").unwrap_err();
    assert!(e.to_string().contains("either type or ref"), "{e}");
}

#[test]
fn replica_names_are_dns_labels_after_the_set() {
    let n = replica_name("mock-pool");
    assert!(n.starts_with("mock-pool-"), "{n}");
    assert_eq!(n.len(), "mock-pool-".len() + 5);
    assert!(
        n["mock-pool-".len()..]
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    );
    assert_ne!(replica_name("mock-pool"), replica_name("mock-pool"));
    let long = replica_name(&format!("{}.x", "a".repeat(80)));
    assert!(long.len() <= 63, "{long}");
    crate::objects::selector::validate_dns1123_subdomain(&long).unwrap();
    assert!(!long.contains('.') && !long.contains("--"), "{long}");
    let dotted = replica_name("a.b");
    assert!(dotted.starts_with("a-b-"), "{dotted}");
}

#[test]
fn replica_labels_add_the_set_label() {
    let labels = replica_labels(&set());
    assert_eq!(labels["pool"], "mock");
    assert_eq!(labels[LABEL_EXPORTER_SET], "mock-pool");
}

fn lease(name: &str, selector: &[(&str, &str)]) -> Lease {
    let mut l = Lease::new(
        name,
        LeaseSpec {
            selector: metav1::LabelSelector {
                match_labels: Some(
                    selector
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    l.metadata.namespace = Some("lab".into());
    l
}

#[test]
fn which_leases_wait_for_a_pool() {
    let labels = replica_labels(&set());
    let now = t(0);
    assert!(lease_waits_for(
        &lease("l", &[("pool", "mock")]),
        "lab",
        &labels,
        now
    ));
    assert!(!lease_waits_for(
        &lease("l", &[("pool", "mock")]),
        "other",
        &labels,
        now
    ));
    assert!(!lease_waits_for(
        &lease("l", &[("pool", "real")]),
        "lab",
        &labels,
        now
    ));
    assert!(
        !lease_waits_for(&lease("l", &[]), "lab", &labels, now),
        "an empty selector"
    );
    let mut pinned = lease("l", &[("pool", "mock")]);
    pinned.spec.exporter_ref =
        Some(k8s_openapi::api::core::v1::LocalObjectReference { name: "x".into() });
    assert!(!lease_waits_for(&pinned, "lab", &labels, now));
    let mut granted = lease("l", &[("pool", "mock")]);
    granted.status = Some(crate::objects::LeaseStatus {
        exporter_ref: Some(k8s_openapi::api::core::v1::LocalObjectReference { name: "x".into() }),
        ..Default::default()
    });
    assert!(!lease_waits_for(&granted, "lab", &labels, now));
    let mut ended = lease("l", &[("pool", "mock")]);
    ended.status = Some(crate::objects::LeaseStatus {
        ended: true,
        ..Default::default()
    });
    assert!(!lease_waits_for(&ended, "lab", &labels, now));
    let mut later = lease("l", &[("pool", "mock")]);
    later.spec.begin_time = Some(metav1::Time(t(60)));
    assert!(!lease_waits_for(&later, "lab", &labels, now));
    let mut released = lease("l", &[("pool", "mock")]);
    released.spec.release = true;
    assert!(!lease_waits_for(&released, "lab", &labels, now));
}

#[test]
fn the_scheduler_keeps_a_lease_only_a_pool_can_serve_waiting() {
    use crate::lease::scheduler::{Action as LeaseAction, Snapshot, schedule};
    let leases = [lease("l", &[("pool", "mock")])];
    let unsatisfiable = |pools: &[(String, BTreeMap<String, String>)], exporters: &[Exporter]| {
        let ds = schedule(&Snapshot {
            leases: &leases,
            exporters,
            policies: &[],
            clients: &[],
            pools,
            now: t(0),
        });
        assert_eq!(ds.len(), 1);
        match &ds[0].action {
            LeaseAction::Waiting { .. } => false,
            LeaseAction::Ended { .. } => true,
            other => panic!("{other:?}"),
        }
    };
    // Without a pool, no matching exporter ends the lease (upstream's behaviour).
    assert!(unsatisfiable(&[], &[]));
    let pools = [("lab".to_string(), replica_labels(&set()))];
    assert!(!unsatisfiable(&pools, &[]));
    // Another namespace's pool does not count.
    let elsewhere = [("other".to_string(), replica_labels(&set()))];
    assert!(unsatisfiable(&elsewhere, &[]));
    // A retiring replica (disabled) is all there is: the lease waits for a new one.
    let mut disabled = Exporter::new(
        "mock-pool-aaaaa",
        ExporterSpec {
            username: None,
            enabled: Some(false),
        },
    );
    disabled.metadata.namespace = Some("lab".into());
    disabled.metadata.labels = Some(replica_labels(&set()));
    assert!(unsatisfiable(&[], std::slice::from_ref(&disabled)));
    assert!(!unsatisfiable(&pools, std::slice::from_ref(&disabled)));
}

/// A replica Exporter created at `t(0)`, online and registered at `now` when `online`.
fn replica(online: bool) -> Exporter {
    let mut e = Exporter::new(
        "pool-aaaaa",
        ExporterSpec {
            username: None,
            enabled: None,
        },
    );
    e.metadata.namespace = Some("lab".into());
    e.metadata.creation_timestamp = Some(metav1::Time(t(0)));
    if online {
        e.status = Some(crate::objects::ExporterStatus {
            devices: Some(vec![]),
            last_seen: Some(metav1::Time(t(99))),
            exporter_status: Some(crate::objects::ExporterStatusValue::Available),
            ..Default::default()
        });
    }
    e
}

fn observed(phase: ReplicaPhase) -> ReplicaObservation {
    ReplicaObservation {
        name: "pool-aaaaa".into(),
        phase,
        message: None,
    }
}

#[test]
fn replica_states_from_the_exporter_and_its_process() {
    let now = t(100);
    let none = HashMap::new();
    let held: HashMap<ObjectKey, String> = [(
        ("lab".to_string(), "pool-aaaaa".to_string()),
        "l1".to_string(),
    )]
    .into();
    let running = observed(ReplicaPhase::Running);
    let state = |e: &Exporter, o: Option<&ReplicaObservation>, h: &HashMap<ObjectKey, String>| {
        replica_state(e, o, h, now, true, |_| false)
    };
    assert_eq!(state(&replica(false), Some(&running), &none), Starting);
    assert_eq!(state(&replica(true), Some(&running), &none), Available);
    assert_eq!(state(&replica(true), Some(&running), &held), Leased);
    assert_eq!(
        state(
            &replica(true),
            Some(&observed(ReplicaPhase::Succeeded)),
            &held
        ),
        Ended { failed: false }
    );
    assert_eq!(
        state(&replica(true), Some(&observed(ReplicaPhase::Failed)), &none),
        Ended { failed: true }
    );
    // Nothing behind it: orphaned, unless it is new (its provisioner may not list it yet).
    assert_eq!(state(&replica(true), None, &none), Orphaned);
    let mut young = replica(false);
    young.metadata.creation_timestamp = Some(metav1::Time(t(90)));
    assert_eq!(state(&young, None, &none), Starting);
    // ... unless this engine did not make it (a restarted controller): orphaned at once.
    assert_eq!(
        replica_state(&young, None, &none, now, false, |_| false),
        Orphaned
    );
    // Quarantined by the health check.
    let mut sick = replica(true);
    crate::objects::set_condition(
        &mut sick.status.as_mut().unwrap().conditions,
        crate::objects::conditions::HEALTHY,
        false,
        crate::objects::conditions::REASON_HEALTH_CHECK_FAILED,
        "3 failures",
        None,
        now,
    );
    assert_eq!(
        state(&sick, Some(&running), &none),
        Quarantined { leased: false }
    );
    // Disabled by an admin: unavailable, not drained.
    let mut off = replica(true);
    off.spec.enabled = Some(false);
    assert_eq!(state(&off, Some(&running), &none), Unavailable);
    // Disabled by the engine.
    let mut draining = off.clone();
    draining.metadata.annotations =
        Some([(ANNOTATION_RETIRING.to_string(), "ScaleDown".to_string())].into());
    assert_eq!(
        state(&draining, Some(&running), &held),
        Draining { leased: true }
    );
    let mut retiring = off;
    retiring.metadata.annotations = Some(
        [(
            ANNOTATION_RETIRING.to_string(),
            "ExitAndReplace".to_string(),
        )]
        .into(),
    );
    assert_eq!(
        replica_state(&retiring, Some(&running), &none, now, true, |leased| {
            !leased
        }),
        Retiring {
            leased: false,
            overdue: true
        }
    );
}
