use super::*;
use crate::objects::duration::GoDuration;
use crate::objects::{
    ClientSpec, Device, ExporterAccessPolicySpec, ExporterSpec, ExporterStatus, LeaseSpec, Policy,
    PolicyFrom,
};
use proptest::prelude::*;

const NS: &str = "lab";

fn now() -> Timestamp {
    "2026-01-01T10:00:00Z".parse().unwrap()
}

fn at(secs: i64) -> Timestamp {
    now()
        .saturating_add(SignedDuration::from_secs(secs))
        .unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// An online, registered, Available exporter.
fn exporter(name: &str, l: &[(&str, &str)]) -> Exporter {
    let mut e = Exporter::new(name, ExporterSpec::default());
    e.metadata.namespace = Some(NS.into());
    e.metadata.labels = Some(labels(l));
    e.status = Some(ExporterStatus {
        devices: Some(vec![Device::default()]),
        last_seen: Some(metav1::Time(at(-5))),
        exporter_status: Some(ExporterStatusValue::Available),
        ..Default::default()
    });
    e
}

/// A pending lease for client `alice` asking 1 h, created `created` seconds from now.
fn lease(name: &str, selector: &str, created: i64) -> Lease {
    let mut l = Lease::new(
        name,
        LeaseSpec {
            client_ref: LocalObjectReference {
                name: "alice".into(),
            },
            duration: Some(GoDuration::from_secs(3600)),
            selector: LabelSelector::parse(selector).unwrap().to_k8s(),
            ..Default::default()
        },
    );
    l.metadata.namespace = Some(NS.into());
    l.metadata.creation_timestamp = Some(metav1::Time(at(created)));
    l
}

fn running(mut l: Lease, exporter: &str, begun: i64) -> Lease {
    l.status = Some(LeaseStatus {
        exporter_ref: Some(LocalObjectReference {
            name: exporter.into(),
        }),
        begin_time: Some(metav1::Time(at(begun))),
        ..Default::default()
    });
    l
}

fn client(name: &str, l: &[(&str, &str)]) -> Client {
    let mut c = Client::new(name, ClientSpec::default());
    c.metadata.namespace = Some(NS.into());
    c.metadata.labels = Some(labels(l));
    c
}

fn rule(priority: i64, client_sel: &str) -> Policy {
    Policy {
        description: format!("rule {priority}"),
        priority,
        from: vec![PolicyFrom {
            client_selector: LabelSelector::parse(client_sel).unwrap().to_k8s(),
        }],
        maximum_duration: None,
        spot_access: false,
    }
}

fn policy(name: &str, exporter_sel: &str, rules: Vec<Policy>) -> ExporterAccessPolicy {
    let mut p = ExporterAccessPolicy::new(
        name,
        ExporterAccessPolicySpec {
            exporter_selector: LabelSelector::parse(exporter_sel).unwrap().to_k8s(),
            policies: rules,
        },
    );
    p.metadata.namespace = Some(NS.into());
    p
}

#[derive(Default)]
struct World {
    leases: Vec<Lease>,
    exporters: Vec<Exporter>,
    policies: Vec<ExporterAccessPolicy>,
    clients: Vec<Client>,
    /// The labels of the exporters pools can make, by namespace.
    pools: Vec<(String, BTreeMap<String, String>)>,
}

impl World {
    fn run(&self) -> Vec<LeaseDecision> {
        schedule(&Snapshot {
            leases: &self.leases,
            exporters: &self.exporters,
            policies: &self.policies,
            clients: &self.clients,
            pools: &self.pools,
            now: now(),
        })
    }

    fn one(&self, name: &str) -> LeaseDecision {
        self.run()
            .into_iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("no decision for {name}"))
    }
}

fn cond<'a>(d: &'a LeaseDecision, type_: &str) -> &'a metav1::Condition {
    find_condition(&d.status.conditions, type_)
        .unwrap_or_else(|| panic!("no {type_} condition on {}: {:?}", d.name, d.status))
}

fn assert_ended(d: &LeaseDecision, type_: &str, reason: &str, needle: &str) {
    assert_eq!(
        d.action,
        Action::Ended {
            reason: leak(reason)
        },
        "{d:?}"
    );
    assert!(d.status.ended && d.status.end_time.is_some());
    let cnd = cond(d, type_);
    assert_eq!((cnd.status.as_str(), cnd.reason.as_str()), ("True", reason));
    assert!(cnd.message.contains(needle), "{}", cnd.message);
    assert!(d.status_changed && d.labels_changed);
    assert_eq!(
        d.labels
            .get(crate::objects::LEASE_ENDED_LABEL)
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(d.requeue_at, None);
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

fn assert_waiting(d: &LeaseDecision, reason: &str, needle: &str, position: usize) {
    assert_eq!(
        d.action,
        Action::Waiting {
            reason: leak(reason),
            position
        },
        "{d:?}"
    );
    let cnd = cond(d, c::PENDING);
    assert_eq!((cnd.status.as_str(), cnd.reason.as_str()), ("True", reason));
    assert!(cnd.message.contains(needle), "{}", cnd.message);
    assert!(
        cnd.message
            .ends_with(&format!("(position {position} in queue)")),
        "{}",
        cnd.message
    );
    assert!(!d.status.ended && d.status.exporter_ref.is_none());
    assert_eq!(d.requeue_at, Some(at(1)));
}

#[test]
fn assigns_a_free_exporter_and_sets_ready() {
    let w = World {
        leases: vec![lease("l1", "board=rpi4", 0)],
        exporters: vec![exporter("e1", &[("board", "rpi4")])],
        ..Default::default()
    };
    let d = w.one("l1");
    assert_eq!(
        d.action,
        Action::Assigned {
            exporter: "e1".into(),
            priority: 0
        }
    );
    assert_eq!(d.owner_exporter.as_deref(), Some("e1"));
    assert_eq!(d.status.begin_time, Some(metav1::Time(now())));
    let r = cond(&d, c::READY);
    assert_eq!((r.status.as_str(), r.reason.as_str()), ("True", "Ready"));
    assert_eq!(r.message, "An exporter has been acquired for the client");
    assert_eq!(d.requeue_at, Some(at(3600)));
    assert!(d.status_changed);
    assert!(!d.status.ended);
    assert_eq!(d.labels.get("board").map(String::as_str), Some("rpi4"));
}

#[test]
fn invalid_selector() {
    let mut l = lease("l1", "", 0);
    l.spec.selector = metav1::LabelSelector::default();
    let w = World {
        leases: vec![l],
        exporters: vec![exporter("e1", &[])],
        ..Default::default()
    };
    assert_ended(
        &w.one("l1"),
        c::INVALID,
        c::REASON_INVALID_SELECTOR,
        "one of selector",
    );
    // A stored selector the API server would refuse is Invalid too.
    let mut l = lease("l2", "a=b", 0);
    l.spec.selector.match_labels = Some(labels(&[("bad key", "v")]));
    let w = World {
        leases: vec![l],
        ..Default::default()
    };
    assert_ended(
        &w.one("l2"),
        c::INVALID,
        c::REASON_INVALID_SELECTOR,
        "bad key",
    );
}

#[test]
fn pinned_exporter_reasons() {
    let pinned = |name: &str, selector: &str| {
        let mut l = lease("l1", selector, 0);
        l.spec.exporter_ref = Some(LocalObjectReference { name: name.into() });
        l
    };
    let mut disabled = exporter("off", &[("board", "rpi4")]);
    disabled.spec.enabled = Some(false);
    let exporters = vec![exporter("e1", &[("board", "rpi4")]), disabled];
    let run = |l: Lease| {
        World {
            leases: vec![l],
            exporters: exporters.clone(),
            ..Default::default()
        }
        .one("l1")
    };
    assert_ended(
        &run(pinned("nope", "")),
        c::UNSATISFIABLE,
        c::REASON_EXPORTER_NOT_FOUND,
        "\"nope\" does not exist",
    );
    assert_ended(
        &run(pinned("e1", "board=rpi3")),
        c::UNSATISFIABLE,
        c::REASON_SELECTOR_MISMATCH,
        "does not match the lease selector board=rpi3",
    );
    assert_ended(
        &run(pinned("off", "")),
        c::UNSATISFIABLE,
        c::REASON_EXPORTER_DISABLED,
        "\"off\" is disabled",
    );
    // allowDisabled lets a pinned lease take a disabled exporter.
    let mut l = pinned("off", "");
    l.spec.allow_disabled = true;
    assert!(matches!(run(l).action, Action::Assigned { ref exporter, .. } if exporter == "off"));
    // Pinned with an empty selector is fine.
    assert!(matches!(
        run(pinned("e1", "")).action,
        Action::Assigned { .. }
    ));
}

#[test]
fn all_disabled_and_no_match() {
    let mut e = exporter("e1", &[("board", "rpi4")]);
    e.spec.enabled = Some(false);
    let w = World {
        leases: vec![lease("l1", "board=rpi4", 0), lease("l2", "board=x", 0)],
        exporters: vec![e],
        ..Default::default()
    };
    assert_ended(
        &w.one("l1"),
        c::UNSATISFIABLE,
        c::REASON_ALL_DISABLED,
        "The 1 exporter matching the selector board=rpi4 is disabled",
    );
    assert_ended(
        &w.one("l2"),
        c::UNSATISFIABLE,
        c::REASON_NO_ACCESS,
        "no exporters matching the selector board=x",
    );
}

#[test]
fn policies_grant_priority_and_deny() {
    let mut w = World {
        leases: vec![lease("l1", "board=rpi4", 0)],
        exporters: vec![exporter("e1", &[("board", "rpi4"), ("pool", "a")])],
        policies: vec![policy(
            "p",
            "pool=a",
            vec![rule(5, "team=qa"), rule(9, "team=dev")],
        )],
        clients: vec![client("alice", &[("team", "qa")])],
        pools: Vec::new(),
    };
    let d = w.one("l1");
    assert_eq!(
        d.action,
        Action::Assigned {
            exporter: "e1".into(),
            priority: 5
        }
    );
    assert_eq!(d.status.priority, 5);
    assert!(!d.status.spot_access);

    // maximumDuration shorter than the request: not approved.
    w.policies[0].spec.policies[0].maximum_duration = Some(GoDuration::from_secs(60));
    assert_ended(
        &w.one("l1"),
        c::UNSATISFIABLE,
        c::REASON_NO_ACCESS,
        "While there is 1 exporter matching the selector, it is not approved by any policy for your client. Matching policies: rule 9",
    );
    // A client no rule matches.
    w.policies[0].spec.policies[0].maximum_duration = None;
    w.clients = vec![client("alice", &[("team", "ops")])];
    assert_ended(
        &w.one("l1"),
        c::UNSATISFIABLE,
        c::REASON_NO_ACCESS,
        "rule 5, rule 9",
    );
    // A missing Client object has no labels.
    w.clients.clear();
    assert_ended(
        &w.one("l1"),
        c::UNSATISFIABLE,
        c::REASON_NO_ACCESS,
        "it is not approved by any policy",
    );
}

#[test]
fn spot_access_is_unsatisfiable() {
    let mut r = rule(1, "");
    r.spot_access = true;
    let w = World {
        leases: vec![lease("l1", "board=rpi4", 0)],
        exporters: vec![exporter("e1", &[("board", "rpi4")])],
        policies: vec![policy("p", "", vec![r])],
        clients: vec![client("alice", &[])],
        pools: Vec::new(),
    };
    assert_ended(
        &w.one("l1"),
        c::UNSATISFIABLE,
        c::REASON_SPOT_ACCESS,
        "(e1)",
    );
}

#[test]
fn pending_offline_not_available_not_ready() {
    let sel = "board=rpi4";
    // Offline: never seen, stale, unregistered, or reported Offline.
    let mut never = exporter("e1", &[("board", "rpi4")]);
    never.status.as_mut().unwrap().last_seen = None;
    let mut stale = exporter("e2", &[("board", "rpi4")]);
    stale.status.as_mut().unwrap().last_seen = Some(metav1::Time(at(-61)));
    let mut unregistered = exporter("e3", &[("board", "rpi4")]);
    unregistered.status.as_mut().unwrap().devices = None;
    let mut off = exporter("e4", &[("board", "rpi4")]);
    off.status.as_mut().unwrap().exporter_status = Some(ExporterStatusValue::Offline);
    let w = World {
        leases: vec![lease("l1", sel, 0)],
        exporters: vec![never, stale, unregistered, off],
        ..Default::default()
    };
    assert_waiting(
        &w.one("l1"),
        c::REASON_OFFLINE,
        &format!(
            "While there are 4 available exporters (i.e. e1, e2, e3, e4), none of them are online \
             (e1 never seen, e2 last seen {}, e3 last seen",
            at(-61).strftime("%Y-%m-%d %H:%M:%S UTC")
        ),
        1,
    );

    // NotAvailable: the only exporter is held.
    let w = World {
        leases: vec![
            running(lease("a", sel, -100), "e1", -50),
            lease("b", sel, 0),
        ],
        exporters: vec![exporter("e1", &[("board", "rpi4")])],
        ..Default::default()
    };
    let ds = w.run();
    assert_eq!(ds[0].action, Action::Running);
    assert!(!ds[0].status_changed);
    assert_eq!(ds[0].requeue_at, Some(at(3550)));
    assert_waiting(
        &ds[1],
        c::REASON_NOT_AVAILABLE,
        "There is 1 approved exporter, (i.e. e1) but it is already leased",
        1,
    );

    // NotReady: free but still cleaning up.
    let mut cleaning = exporter("e1", &[("board", "rpi4")]);
    cleaning.status.as_mut().unwrap().exporter_status = Some(ExporterStatusValue::AfterLeaseHook);
    let w = World {
        leases: vec![lease("l1", sel, 0)],
        exporters: vec![cleaning],
        ..Default::default()
    };
    assert_waiting(
        &w.one("l1"),
        c::REASON_NOT_READY,
        "There is 1 approved and free exporter, (i.e. e1) but it is not ready",
        1,
    );

    // Unspecified and unset statuses count as ready (old exporters).
    for st in [None, Some(ExporterStatusValue::Unspecified)] {
        let mut e = exporter("e1", &[("board", "rpi4")]);
        e.status.as_mut().unwrap().exporter_status = st;
        let w = World {
            leases: vec![lease("l1", sel, 0)],
            exporters: vec![e],
            ..Default::default()
        };
        assert!(matches!(w.one("l1").action, Action::Assigned { .. }));
    }
}

#[test]
fn release_and_expiry() {
    let sel = "board=rpi4";
    let e = exporter("e1", &[("board", "rpi4")]);
    // Released while running.
    let mut l = running(lease("l1", sel, -100), "e1", -50);
    l.spec.release = true;
    let w = World {
        leases: vec![l, lease("l2", sel, 0)],
        exporters: vec![e.clone()],
        ..Default::default()
    };
    let ds = w.run();
    let d = &ds[0];
    assert_eq!(
        d.action,
        Action::Ended {
            reason: c::REASON_RELEASED
        }
    );
    let r = cond(d, c::READY);
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("False", "Released")
    );
    assert_eq!(r.message, "The lease was marked for release");
    // The freed exporter goes to the waiting lease in the same pass.
    assert!(matches!(ds[1].action, Action::Assigned { ref exporter, .. } if exporter == "e1"));

    // Expired: begun an hour and a bit ago.
    let w = World {
        leases: vec![running(lease("l1", sel, -4000), "e1", -3601)],
        exporters: vec![e.clone()],
        ..Default::default()
    };
    let d = w.one("l1");
    assert_eq!(
        d.action,
        Action::Ended {
            reason: c::REASON_EXPIRED
        }
    );
    let r = cond(&d, c::READY);
    assert_eq!(
        (r.status.as_str(), r.reason.as_str(), r.message.as_str()),
        ("False", "Expired", "The lease has expired")
    );
    // Exactly at its end it has ended too.
    let w = World {
        leases: vec![running(lease("l1", sel, -4000), "e1", -3600)],
        exporters: vec![e.clone()],
        ..Default::default()
    };
    assert!(w.one("l1").status.ended);
    // spec.endTime wins over the duration.
    let mut l = running(lease("l1", sel, -100), "e1", -50);
    l.spec.end_time = Some(metav1::Time(at(-1)));
    let w = World {
        leases: vec![l],
        exporters: vec![e.clone()],
        ..Default::default()
    };
    assert!(w.one("l1").status.ended);

    // Released before being granted: ends without an exporter.
    let mut l = lease("l1", sel, 0);
    l.spec.release = true;
    let w = World {
        leases: vec![l],
        exporters: vec![e.clone()],
        ..Default::default()
    };
    let d = w.one("l1");
    assert_eq!(
        d.action,
        Action::Ended {
            reason: c::REASON_RELEASED
        }
    );
    assert_eq!(d.status.exporter_ref, None);

    // Pending past its requested end: Expired, never granted.
    let mut l = lease("l1", sel, -100);
    l.spec.begin_time = Some(metav1::Time(at(-7200)));
    let w = World {
        leases: vec![l],
        exporters: vec![e],
        ..Default::default()
    };
    let d = w.one("l1");
    assert_eq!(
        d.action,
        Action::Ended {
            reason: c::REASON_EXPIRED
        }
    );
    assert_eq!(d.status.exporter_ref, None);
}

#[test]
fn future_begin_is_deferred() {
    let mut l = lease("l1", "board=rpi4", 0);
    l.spec.begin_time = Some(metav1::Time(at(600)));
    let w = World {
        leases: vec![l],
        exporters: vec![exporter("e1", &[("board", "rpi4")])],
        ..Default::default()
    };
    let d = w.one("l1");
    assert_eq!(d.action, Action::Deferred);
    assert_eq!(d.requeue_at, Some(at(600)));
    assert!(!d.status_changed);
    // A lease with a requested begin expires relative to that begin once granted.
    let mut l = lease("l1", "board=rpi4", 0);
    l.spec.begin_time = Some(metav1::Time(at(-600)));
    let w = World {
        leases: vec![l],
        exporters: vec![exporter("e1", &[("board", "rpi4")])],
        ..Default::default()
    };
    let d = w.one("l1");
    assert!(matches!(d.action, Action::Assigned { .. }));
    assert_eq!(d.requeue_at, Some(at(3000)));
}

#[test]
fn ended_leases_are_ignored_and_terminal_conditions_end() {
    let mut done = running(lease("done", "board=rpi4", -100), "e1", -50);
    done.status.as_mut().unwrap().ended = true;
    let mut stuck = lease("stuck", "board=rpi4", -10);
    stuck.status = Some(LeaseStatus::default());
    set_condition(
        &mut stuck.status.as_mut().unwrap().conditions,
        c::UNSATISFIABLE,
        true,
        c::REASON_NO_ACCESS,
        "x",
        None,
        at(-10),
    );
    let w = World {
        leases: vec![done, stuck, lease("new", "board=rpi4", 0)],
        exporters: vec![exporter("e1", &[("board", "rpi4")])],
        ..Default::default()
    };
    let ds = w.run();
    assert_eq!(ds.len(), 2, "{ds:?}");
    assert!(
        matches!(ds[0].action, Action::Assigned { .. }),
        "an ended lease holds nothing"
    );
    assert_eq!(
        ds[1].action,
        Action::Ended {
            reason: c::REASON_NO_ACCESS
        }
    );
}

#[test]
fn queue_order_is_priority_then_fifo_then_name() {
    let sel = "board=rpi4";
    let mut vip = lease("vip", sel, 30);
    vip.spec.client_ref.name = "boss".into();
    let w = World {
        leases: vec![
            lease("c-late", sel, 20),
            lease("b-early", sel, 10),
            lease("a-same", sel, 10),
            vip,
        ],
        exporters: vec![
            exporter("e1", &[("board", "rpi4")]),
            exporter("e2", &[("board", "rpi4")]),
        ],
        policies: vec![policy(
            "p",
            "",
            vec![rule(1, "team=qa"), rule(7, "team=boss")],
        )],
        clients: vec![
            client("alice", &[("team", "qa")]),
            client("boss", &[("team", "boss")]),
        ],
        pools: Vec::new(),
    };
    let ds = w.run();
    let by = |n: &str| ds.iter().find(|d| d.name == n).unwrap();
    // The high-priority lease is served first even though it is the newest; then FIFO, ties by
    // name.
    assert_eq!(
        by("vip").action,
        Action::Assigned {
            exporter: "e1".into(),
            priority: 7
        }
    );
    assert_eq!(
        by("a-same").action,
        Action::Assigned {
            exporter: "e2".into(),
            priority: 1
        }
    );
    assert_waiting(by("b-early"), c::REASON_NOT_AVAILABLE, "already leased", 1);
    assert_waiting(by("c-late"), c::REASON_NOT_AVAILABLE, "already leased", 2);
}

#[test]
fn queue_position_counts_only_competitors() {
    let w = World {
        leases: vec![
            running(lease("r1", "board=a", -100), "ea", -50),
            running(lease("r2", "board=b", -100), "eb", -50),
            lease("wa1", "board=a", 0),
            lease("wb1", "board=b", 1),
            lease("wa2", "board=a", 2),
        ],
        exporters: vec![
            exporter("ea", &[("board", "a")]),
            exporter("eb", &[("board", "b")]),
        ],
        ..Default::default()
    };
    let ds = w.run();
    let by = |n: &str| ds.iter().find(|d| d.name == n).unwrap();
    assert_waiting(by("wa1"), c::REASON_NOT_AVAILABLE, "(i.e. ea)", 1);
    assert_waiting(by("wb1"), c::REASON_NOT_AVAILABLE, "(i.e. eb)", 1);
    assert_waiting(by("wa2"), c::REASON_NOT_AVAILABLE, "(i.e. ea)", 2);
}

#[test]
fn corrupt_double_assignment_is_repaired() {
    // Two live leases claim e1 (e.g. written by another controller): only one keeps it.
    let w = World {
        leases: vec![
            running(lease("a", "board=rpi4", -100), "e1", -50),
            running(lease("b", "board=rpi4", -90), "e1", -40),
        ],
        exporters: vec![exporter("e1", &[("board", "rpi4")])],
        ..Default::default()
    };
    let ds = w.run();
    assert_eq!(ds[0].action, Action::Running);
    assert!(
        matches!(ds[1].action, Action::Waiting { .. }),
        "{:?}",
        ds[1]
    );
    assert_eq!(ds[1].status.exporter_ref, None);
}

#[test]
fn exporter_lease_refs_lists_live_holders() {
    let live = LeaseStatus {
        exporter_ref: Some(LocalObjectReference { name: "e1".into() }),
        ..Default::default()
    };
    let ended = LeaseStatus {
        ended: true,
        exporter_ref: Some(LocalObjectReference { name: "e2".into() }),
        ..Default::default()
    };
    let refs = exporter_lease_refs([("lab", "l1", &live), ("lab", "l2", &ended)]);
    assert_eq!(refs.len(), 1);
    assert_eq!(
        refs.get(&("lab".into(), "e1".into())).map(String::as_str),
        Some("l1")
    );
}

// ---- property tests ----

#[derive(Debug, Clone)]
struct GenExporter {
    board: u8,
    online: bool,
    ready: bool,
    enabled: bool,
}

#[derive(Debug, Clone)]
struct GenLease {
    board: u8,
    vip: bool,
    created: i64,
    /// None: pending; Some((exporter index, begun seconds ago)).
    running: Option<(usize, i64)>,
    duration: i64,
    release: bool,
}

fn gen_exporter() -> impl Strategy<Value = GenExporter> {
    (
        0u8..2,
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.9),
    )
        .prop_map(|(board, online, ready, enabled)| GenExporter {
            board,
            online,
            ready,
            enabled,
        })
}

fn gen_lease() -> impl Strategy<Value = GenLease> {
    (
        0u8..2,
        any::<bool>(),
        -500i64..0,
        prop::option::weighted(0.4, (0usize..6, 0i64..400)),
        1i64..300,
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(board, vip, created, running, duration, release)| GenLease {
                board,
                vip,
                created,
                running,
                duration,
                release,
            },
        )
}

fn build(exps: &[GenExporter], ls: &[GenLease]) -> World {
    let exporters: Vec<Exporter> = exps
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let board = g.board.to_string();
            let mut e = exporter(&format!("e{i}"), &[("board", &board)]);
            e.spec.enabled = Some(g.enabled);
            let st = e.status.as_mut().unwrap();
            if !g.online {
                st.last_seen = Some(metav1::Time(at(-120)));
            }
            if !g.ready {
                st.exporter_status = Some(ExporterStatusValue::LeaseReady);
            }
            e
        })
        .collect();
    let leases = ls
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mut l = lease(
                &format!("l{i:02}"),
                &format!("board={}", g.board),
                g.created,
            );
            l.spec.duration = Some(GoDuration::from_secs(g.duration));
            l.spec.release = g.release;
            if g.vip {
                l.spec.client_ref.name = "boss".into();
            }
            match g.running {
                Some((e, ago)) if e < exps.len() => running(l, &format!("e{e}"), -ago),
                _ => l,
            }
        })
        .collect();
    World {
        leases,
        exporters,
        policies: vec![policy(
            "p",
            "",
            vec![rule(1, "team=qa"), rule(5, "team=boss")],
        )],
        clients: vec![
            client("alice", &[("team", "qa")]),
            client("boss", &[("team", "boss")]),
        ],
        pools: Vec::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn scheduling_invariants(
        exps in prop::collection::vec(gen_exporter(), 0..6),
        ls in prop::collection::vec(gen_lease(), 0..10),
    ) {
        let w = build(&exps, &ls);
        let ds = w.run();
        let t = now();

        // No exporter held by two live leases.
        let mut holders: BTreeMap<String, String> = BTreeMap::new();
        for d in ds.iter().filter(|d| !d.status.ended) {
            if let Some(r) = &d.status.exporter_ref
                && let Some(other) = holders.insert(r.name.clone(), d.name.clone())
            {
                prop_assert!(false, "{} held by {} and {}", r.name, other, d.name);
            }
        }

        // No live lease past its end, and every granted one is requeued at its end.
        for d in ds.iter().filter(|d| !d.status.ended) {
            let l = w.leases.iter().find(|l| l.metadata.name.as_deref() == Some(&d.name)).unwrap();
            let mut after = l.clone();
            after.status = Some(d.status.clone());
            if let Some(exp) = after.expiration() {
                prop_assert!(exp > t, "{} live past its end {exp}", d.name);
                prop_assert_eq!(d.requeue_at, Some(exp));
            }
        }

        // Queue order: a lease granted in this pass never overtakes a waiting lease that could
        // have used its exporter and comes first (priority desc, then creation, then name).
        let key = |name: &str| {
            let l = w.leases.iter().find(|l| l.metadata.name.as_deref() == Some(name)).unwrap();
            let prio = if l.spec.client_ref.name == "boss" { 5 } else { 1 };
            (Reverse(prio), l.metadata.creation_timestamp.clone().map(|t| t.0), name.to_string())
        };
        let board_of = |name: &str| {
            let l = w.leases.iter().find(|l| l.metadata.name.as_deref() == Some(name)).unwrap();
            l.spec.selector.match_labels.clone().unwrap_or_default()
        };
        for granted in &ds {
            let Action::Assigned { exporter, priority } = &granted.action else { continue };
            prop_assert_eq!(*priority, key(&granted.name).0.0);
            for waiting in &ds {
                if !matches!(waiting.action, Action::Waiting { .. }) { continue; }
                if board_of(&waiting.name) != board_of(&granted.name) { continue; }
                prop_assert!(
                    key(&granted.name) < key(&waiting.name),
                    "{} got {} before {} which was ahead in the queue",
                    granted.name, exporter, waiting.name
                );
            }
        }

        // Positions among competitors are 1..=n without gaps, in queue order.
        for board in ["0", "1"] {
            let mut positions: Vec<(_, usize)> = ds.iter().filter_map(|d| match d.action {
                Action::Waiting { position, .. }
                    if board_of(&d.name).get("board").map(String::as_str) == Some(board) =>
                    Some((key(&d.name), position)),
                _ => None,
            }).collect();
            positions.sort();
            for (i, (_, p)) in positions.iter().enumerate() {
                prop_assert_eq!(*p, i + 1);
            }
        }
    }
}

#[test]
fn unhealthy_exporters_are_leased_to_nobody_until_cleared() {
    let sel = "board=rpi4";
    let quarantine = |e: &mut Exporter, healthy: bool| {
        let st = e.status.as_mut().unwrap();
        crate::objects::set_condition(
            &mut st.conditions,
            c::HEALTHY,
            healthy,
            if healthy {
                c::REASON_CLEARED
            } else {
                c::REASON_HEALTH_CHECK_FAILED
            },
            "healthCheck: failed 3 times in a row",
            None,
            now(),
        );
    };
    let mut sick = exporter("e1", &[("board", "rpi4")]);
    quarantine(&mut sick, false);
    let w = World {
        leases: vec![lease("l1", sel, 0)],
        exporters: vec![sick.clone()],
        ..Default::default()
    };
    assert_waiting(
        &w.one("l1"),
        c::REASON_UNHEALTHY,
        "There is 1 approved and free exporter, (i.e. e1) but it is unhealthy",
        1,
    );
    // A healthy one beside it is chosen.
    let w = World {
        leases: vec![lease("l1", sel, 0)],
        exporters: vec![sick.clone(), exporter("e2", &[("board", "rpi4")])],
        ..Default::default()
    };
    assert_eq!(
        w.one("l1").action,
        Action::Assigned {
            exporter: "e2".into(),
            priority: 0
        }
    );
    // Cleared: leased again.
    quarantine(&mut sick, true);
    let w = World {
        leases: vec![lease("l1", sel, 0)],
        exporters: vec![sick],
        ..Default::default()
    };
    assert!(matches!(w.one("l1").action, Action::Assigned { .. }));
}

/// Without policies, leases asking the same selector share one evaluation in a pass: each
/// still gets its own exporter, and leases asking something else are evaluated on their own.
#[test]
fn leases_asking_the_same_share_an_evaluation_and_others_stay_apart() {
    let w = World {
        leases: vec![
            lease("x1", "board=a", 0),
            lease("y1", "board=b", 1),
            lease("x2", "board=a", 2),
            lease("z1", "board=c", 3),
            lease("x3", "board=a", 4),
            lease("z2", "board=c", 5),
        ],
        exporters: vec![
            exporter("a1", &[("board", "a")]),
            exporter("a2", &[("board", "a")]),
            exporter("b1", &[("board", "b")]),
        ],
        ..Default::default()
    };
    let ds = w.run();
    let by = |n: &str| ds.iter().find(|d| d.name == n).unwrap();
    let assigned = |n: &str| match &by(n).action {
        Action::Assigned { exporter, .. } => exporter.clone(),
        other => panic!("{n}: {other:?}"),
    };
    assert_eq!(assigned("x1"), "a1");
    assert_eq!(assigned("y1"), "b1");
    assert_eq!(assigned("x2"), "a2");
    assert_waiting(by("x3"), c::REASON_NOT_AVAILABLE, "(i.e. a1, a2)", 1);
    for z in ["z1", "z2"] {
        assert_ended(
            by(z),
            c::UNSATISFIABLE,
            c::REASON_NO_ACCESS,
            "no exporters matching the selector board=c",
        );
    }
}

#[test]
fn a_policy_with_an_unknown_operator_is_an_error_naming_it_not_a_policy_matching_nothing() {
    let bad_operator = |sel: &mut metav1::LabelSelector| {
        sel.match_expressions = Some(vec![metav1::LabelSelectorRequirement {
            key: "board".into(),
            operator: "Matches".into(),
            values: Some(vec!["rpi4".into()]),
        }]);
    };
    let exporters = vec![exporter("e1", &[("board", "rpi4")])];
    let clients = vec![client("c1", &[("team", "a")])];
    // A broken exporter selector beside a policy that would grant the exporter.
    let mut broken = policy("broken", "board=rpi4", vec![rule(10, "team=a")]);
    bad_operator(&mut broken.spec.exporter_selector);
    let w = World {
        leases: vec![lease("l1", "board=rpi4", 0)],
        exporters: exporters.clone(),
        policies: vec![
            broken,
            policy("good", "board=rpi4", vec![rule(1, "team=a")]),
        ],
        clients: clients.clone(),
        pools: Vec::new(),
    };
    let d = w.one("l1");
    assert_ended(&d, c::INVALID, c::REASON_INVALID_SELECTOR, "\"Matches\"");
    assert_ended(
        &d,
        c::INVALID,
        c::REASON_INVALID_SELECTOR,
        "ExporterAccessPolicy lab/broken: spec.exporterSelector",
    );
    // The same in a rule's client selector.
    let mut broken = policy("broken2", "board=rpi4", vec![rule(1, "team=a")]);
    bad_operator(&mut broken.spec.policies[0].from[0].client_selector);
    let w = World {
        leases: vec![lease("l2", "board=rpi4", 0)],
        exporters,
        policies: vec![broken],
        clients,
        pools: Vec::new(),
    };
    assert_ended(
        &w.one("l2"),
        c::INVALID,
        c::REASON_INVALID_SELECTOR,
        "spec.policies[0].from[0].clientSelector is invalid: invalid label selector requirement for key \"board\": \"Matches\"",
    );
}

#[test]
fn a_lease_only_a_pool_could_serve_waits_for_it_when_the_policies_grant_its_exporters() {
    let mut w = World {
        leases: vec![lease("l", "pool=qemu", -1)],
        clients: vec![client("alice", &[("team", "a")])],
        pools: vec![(NS.into(), labels(&[("pool", "qemu")]))],
        ..Default::default()
    };
    // No policies: the pool may serve it.
    assert!(
        matches!(w.one("l").action, Action::Waiting { .. }),
        "{:?}",
        w.one("l")
    );
    // A policy granting the pool's exporters to alice's team: still waiting.
    w.policies = vec![policy("p", "pool=qemu", vec![rule(1, "team=a")])];
    assert!(
        matches!(w.one("l").action, Action::Waiting { .. }),
        "{:?}",
        w.one("l")
    );
    // Policies that grant them to another team only: no replica would ever be alice's.
    w.policies = vec![policy("p", "pool=qemu", vec![rule(1, "team=b")])];
    assert_ended(
        &w.one("l"),
        c::UNSATISFIABLE,
        c::REASON_NO_ACCESS,
        "no exporters matching",
    );
    // A pool in another namespace does not count.
    w.policies.clear();
    w.pools = vec![("elsewhere".into(), labels(&[("pool", "qemu")]))];
    assert_ended(
        &w.one("l"),
        c::UNSATISFIABLE,
        c::REASON_NO_ACCESS,
        "no exporters matching",
    );
}

#[test]
fn policies_grant_judges_a_pool_replica_by_its_labels_and_the_lease_duration() {
    let l = lease("l", "pool=qemu", -1);
    let team_a = labels(&[("team", "a")]);
    let replica = labels(&[("pool", "qemu")]);
    assert!(policies_grant(&l, &replica, &[], &team_a));
    let grants = policy("p", "pool=qemu", vec![rule(1, "team=a")]);
    assert!(policies_grant(&l, &replica, &[&grants], &team_a));
    assert!(!policies_grant(
        &l,
        &replica,
        &[&grants],
        &labels(&[("team", "b")])
    ));
    assert!(!policies_grant(
        &l,
        &labels(&[("pool", "other")]),
        &[&grants],
        &team_a
    ));
    // The lease asks 1 h; a rule allowing 10 minutes does not grant it.
    let mut short = rule(1, "team=a");
    short.maximum_duration = Some(GoDuration::from_secs(600));
    let short = policy("p", "pool=qemu", vec![short]);
    assert!(!policies_grant(&l, &replica, &[&short], &team_a));
}
