use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::LocalObjectReference;
use proptest::prelude::*;

use super::*;
use crate::lease::scheduler::{Action, Snapshot, schedule};
use crate::objects::{
    ClientSpec, Device, ExporterAccessPolicySpec, ExporterSpec, ExporterStatus,
    ExporterStatusValue, LeaseSpec, LeaseStatus, Policy, PolicyFrom,
};

const NS: &str = "lab";

fn now() -> Timestamp {
    "2026-01-01T10:00:00Z".parse().unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn exporter(name: &str, board: &str) -> Exporter {
    let mut e = Exporter::new(name, ExporterSpec::default());
    e.metadata.namespace = Some(NS.into());
    e.metadata.labels = Some(labels(&[("board", board)]));
    e.status = Some(ExporterStatus {
        devices: Some(vec![Device::default()]),
        last_seen: Some(metav1::Time(now())),
        exporter_status: Some(ExporterStatusValue::Available),
        ..Default::default()
    });
    e
}

fn client(name: &str, l: &[(&str, &str)]) -> Client {
    let mut c = Client::new(name, ClientSpec::default());
    c.metadata.namespace = Some(NS.into());
    c.metadata.labels = Some(labels(l));
    c
}

/// The lab: `board=b` only for `team=x`, at most 120 s; `board=c` for everyone.
fn view() -> AccessView {
    let rule = |sel: &str, max: Option<i64>| Policy {
        description: format!("for {sel}"),
        priority: 1,
        from: vec![PolicyFrom {
            client_selector: LabelSelector::parse(sel).unwrap().to_k8s(),
        }],
        maximum_duration: max.map(GoDuration::from_secs),
        spot_access: false,
    };
    let policy = |name: &str, exporters: &str, rules: Vec<Policy>| {
        let mut p = ExporterAccessPolicy::new(
            name,
            ExporterAccessPolicySpec {
                exporter_selector: LabelSelector::parse(exporters).unwrap().to_k8s(),
                policies: rules,
            },
        );
        p.metadata.namespace = Some(NS.into());
        p
    };
    AccessView {
        exporters: vec![exporter("eb", "b"), exporter("ec", "c")],
        policies: vec![
            policy("b", "board=b", vec![rule("team=x", Some(120))]),
            policy("c", "board=c", vec![rule("", None)]),
        ],
        clients: vec![
            client("carol", &[("team", "x")]),
            client("erin", &[("team", "x")]),
            client("dave", &[]),
        ],
    }
}

fn lease(name: &str, client: &str, board: &str, secs: i64) -> Lease {
    let mut l = Lease::new(
        name,
        LeaseSpec {
            client_ref: LocalObjectReference {
                name: client.into(),
            },
            duration: Some(GoDuration::from_secs(secs)),
            selector: LabelSelector::parse(&format!("board={board}"))
                .unwrap()
                .to_k8s(),
            ..Default::default()
        },
    );
    l.metadata.namespace = Some(NS.into());
    l.metadata.creation_timestamp = Some(metav1::Time(now()));
    l
}

fn running(mut l: Lease, exporter: &str) -> Lease {
    l.status = Some(LeaseStatus {
        exporter_ref: Some(LocalObjectReference {
            name: exporter.into(),
        }),
        begin_time: Some(metav1::Time(now())),
        ..Default::default()
    });
    l
}

fn duration_change(secs: i64) -> LeaseChange {
    LeaseChange {
        times: Some(LeaseTimes {
            begin: None,
            end: None,
            duration: Some(SignedDuration::from_secs(secs)),
        }),
        new_client: None,
    }
}

fn transfer(to: &str) -> LeaseChange {
    LeaseChange {
        times: None,
        new_client: Some(to.into()),
    }
}

#[test]
fn extending_past_the_policy_maximum_is_refused_and_changes_nothing() {
    let v = view();
    let mut l = running(lease("l", "carol", "b", 60), "eb");
    let before = l.clone();
    let e = apply_change(&mut l, &duration_change(10 * 3600), &v).unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(e.message().contains("NoAccess"), "{}", e.message());
    assert!(
        e.message().contains("it is not approved"),
        "{}",
        e.message()
    );
    assert_eq!(l, before);
    // Within the limit is fine.
    assert!(apply_change(&mut l, &duration_change(120), &v).unwrap());
    assert_eq!(l.spec.duration, Some(GoDuration::from_secs(120)));
}

#[test]
fn a_later_end_time_cannot_stretch_a_granted_lease() {
    let v = view();
    let mut l = running(lease("l", "carol", "b", 60), "eb");
    let end = now().checked_add(SignedDuration::from_hours(10)).unwrap();
    // A short duration with a far end (not reconciled, as a store edit could leave it): the
    // policy judges the time the lease would hold the exporter.
    let change = LeaseChange {
        times: Some(LeaseTimes {
            begin: None,
            end: Some(end),
            duration: Some(SignedDuration::from_secs(60)),
        }),
        new_client: None,
    };
    let e = apply_change(&mut l, &change, &v).unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{}", e.message());
}

#[test]
fn transfer_to_a_client_the_policy_refuses_is_refused() {
    let v = view();
    let mut l = running(lease("l", "carol", "b", 60), "eb");
    let before = l.clone();
    let e = apply_change(&mut l, &transfer("dave"), &v).unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(e.message().contains("NoAccess"), "{}", e.message());
    assert_eq!(l, before);
    // To another member of the team: allowed.
    assert!(apply_change(&mut l, &transfer("erin"), &v).unwrap());
    assert_eq!(l.spec.client_ref.name, "erin");
    // On the open board, dave may take it.
    let mut l = running(lease("m", "carol", "c", 60), "ec");
    assert!(apply_change(&mut l, &transfer("dave"), &v).unwrap());
}

#[test]
fn a_waiting_lease_is_checked_like_a_new_request() {
    let v = view();
    let mut l = lease("l", "carol", "b", 60);
    let e = apply_change(&mut l, &duration_change(3600), &v).unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let e = apply_change(&mut l, &transfer("dave"), &v).unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
}

/// Would a direct request by `client` for `duration`, pinned to `exporter`, be granted?
fn direct_request_granted(v: &AccessView, client: &str, exporter: &str, secs: i64) -> bool {
    let board = if exporter == "eb" { "b" } else { "c" };
    let mut l = lease("direct", client, board, secs);
    l.spec.exporter_ref = Some(LocalObjectReference {
        name: exporter.into(),
    });
    let ds = schedule(&Snapshot {
        leases: &[l],
        exporters: &v.exporters,
        policies: &v.policies,
        clients: &v.clients,
        pools: &[],
        now: now(),
    });
    matches!(&ds[0].action, Action::Assigned { exporter: e, .. } if e == exporter)
}

#[derive(Debug, Clone)]
enum Op {
    Create {
        client: usize,
        board: usize,
        secs: i64,
    },
    Extend {
        lease: usize,
        secs: i64,
    },
    Transfer {
        lease: usize,
        to: usize,
    },
}

const CLIENTS: [&str; 3] = ["carol", "erin", "dave"];
const BOARDS: [&str; 2] = ["b", "c"];

fn gen_secs() -> impl Strategy<Value = i64> {
    prop_oneof![Just(30i64), Just(120), Just(121), Just(3600), Just(36000)]
}

fn gen_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize, 0..2usize, gen_secs()).prop_map(|(client, board, secs)| Op::Create {
            client,
            board,
            secs
        }),
        (0..8usize, gen_secs()).prop_map(|(lease, secs)| Op::Extend { lease, secs }),
        (0..8usize, 0..3usize).prop_map(|(lease, to)| Op::Transfer { lease, to }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// No sequence of create/update/transfer reaches a state that a direct request could not:
    /// every lease holding an exporter is one its current client could have been granted
    /// directly, for the whole time it holds it.
    #[test]
    fn changes_never_reach_a_state_a_direct_request_could_not(
        ops in prop::collection::vec(gen_op(), 1..24),
    ) {
        let v = view();
        let mut leases: Vec<Lease> = Vec::new();
        for op in ops {
            match op {
                Op::Create { client, board, secs } => {
                    let n = leases.len();
                    leases.push(lease(&format!("l{n:02}"), CLIENTS[client], BOARDS[board], secs));
                }
                Op::Extend { lease, secs } => {
                    if let Some(l) = leases.get_mut(lease) {
                        // A refused change must leave the lease as it was.
                        let before = l.clone();
                        if apply_change(l, &duration_change(secs), &v).is_err() {
                            prop_assert_eq!(&*l, &before);
                        }
                    }
                }
                Op::Transfer { lease, to } => {
                    if let Some(l) = leases.get_mut(lease) {
                        let before = l.clone();
                        if apply_change(l, &transfer(CLIENTS[to]), &v).is_err() {
                            prop_assert_eq!(&*l, &before);
                        }
                    }
                }
            }
            // The scheduler runs after every change, as the controller's reconcile loop does.
            let ds = schedule(&Snapshot {
                leases: &leases,
                exporters: &v.exporters,
                policies: &v.policies,
                clients: &v.clients,
                pools: &[],
                now: now(),
            });
            for d in ds {
                if let Some(l) = leases.iter_mut().find(|l| l.metadata.name.as_deref() == Some(&d.name)) {
                    l.status = Some(d.status);
                }
            }
            for l in leases.iter().filter(|l| !l.is_ended()) {
                let Some(exporter) = l.assigned_exporter() else { continue };
                let held = crate::lease::scheduler::policy_duration(l)
                    .map(|d| d.as_secs())
                    .unwrap_or(i64::MAX);
                prop_assert!(
                    direct_request_granted(&v, &l.spec.client_ref.name, exporter, held),
                    "{} holds {} for {} for {}s, which a direct request could not get",
                    l.metadata.name.as_deref().unwrap_or_default(),
                    exporter,
                    l.spec.client_ref.name,
                    held
                );
            }
        }
    }
}
