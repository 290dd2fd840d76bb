//! Issue 22 item 1: a granted lease cannot be extended past an ExporterAccessPolicy's
//! `maximumDuration` nor transferred to a client the policies refuse (`jmp update lease
//! --duration 10h` / `--to-client dave`), over the real ClientService.

use std::time::Duration;

use jumpstarter_controller::{
    GoDuration, LabelSelector,
    objects::{
        Client, ClientSpec, ExporterAccessPolicy, ExporterAccessPolicySpec, Policy, PolicyFrom,
    },
    store::Store,
};
use jumpstarter_core::auth::{ObjectKind, Subject};
use jumpstarter_proto::client_v1::{
    CreateLeaseRequest, GetLeaseRequest, Lease, UpdateLeaseRequest,
    client_service_client::ClientServiceClient,
};
use tonic::Code;

use crate::{Identity, Lab, lab, req};

async fn labelled_client(lab: &Lab, name: &str, labels: &[(&str, &str)]) -> Identity {
    let mut c = Client::new(name, ClientSpec::default());
    c.metadata.namespace = Some("default".into());
    c.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    let c = lab.ctl.state.store.create(&c).await.unwrap();
    let token = lab
        .ctl
        .state
        .auth
        .issuer
        .issue(&Subject::new(
            ObjectKind::Client,
            "default",
            name,
            c.metadata.uid.unwrap(),
        ))
        .unwrap()
        .token;
    Identity {
        kind: ObjectKind::Client,
        name: name.into(),
        token,
    }
}

fn update(name: &str, duration_secs: Option<i64>, to_client: Option<&str>) -> UpdateLeaseRequest {
    UpdateLeaseRequest {
        lease: Some(Lease {
            name: name.into(),
            duration: duration_secs.map(|seconds| prost_types::Duration { seconds, nanos: 0 }),
            client: to_client.map(|c| format!("namespaces/default/clients/{c}")),
            ..Default::default()
        }),
        update_mask: None,
        ..Default::default()
    }
}

#[tokio::test]
async fn policy_limits_hold_after_the_grant() {
    let lab = lab().await;
    let carol = labelled_client(&lab, "carol", &[("team", "x")]).await;
    let _erin = labelled_client(&lab, "erin", &[("team", "x")]).await;
    let dave = labelled_client(&lab, "dave", &[]).await;
    let ex = lab.exporter("board1", &[("board", "b")]).await;
    let mut policy = ExporterAccessPolicy::new(
        "team-x-only",
        ExporterAccessPolicySpec {
            exporter_selector: LabelSelector::parse("board=b").unwrap().to_k8s(),
            policies: vec![Policy {
                description: "team x, 2 minutes".into(),
                priority: 0,
                from: vec![PolicyFrom {
                    client_selector: LabelSelector::parse("team=x").unwrap().to_k8s(),
                }],
                maximum_duration: Some(GoDuration::from_secs(120)),
                spot_access: false,
            }],
        },
    );
    policy.metadata.namespace = Some("default".into());
    lab.ctl.state.store.create(&policy).await.unwrap();

    let ch = lab.channel().await;
    let mut cli = ClientServiceClient::new(ch.clone());
    let _status = crate::admin::bring_online(&ch, &ex).await;

    let lease = cli
        .create_lease(req(
            &carol,
            CreateLeaseRequest {
                parent: "namespaces/default".into(),
                lease_id: String::new(),
                lease: Some(Lease {
                    selector: "board=b".into(),
                    duration: Some(prost_types::Duration {
                        seconds: 60,
                        nanos: 0,
                    }),
                    ..Default::default()
                }),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let mut ready = false;
    for _ in 0..100 {
        let l = cli
            .get_lease(req(
                &carol,
                GetLeaseRequest {
                    name: lease.name.clone(),
                },
            ))
            .await
            .unwrap()
            .into_inner();
        if l.exporter.is_some() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "the lease was never granted");

    // `jmp update lease --duration 10h`: refused as a 10 h request would be.
    let e = cli
        .update_lease(req(&carol, update(&lease.name, Some(36_000), None)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    assert!(e.message().contains("NoAccess"), "{}", e.message());
    // `jmp update lease --to-client dave`: refused as dave's own request is.
    let e = cli
        .update_lease(req(&carol, update(&lease.name, None, Some("dave"))))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    assert!(e.message().contains("NoAccess"), "{}", e.message());

    // Nothing changed: still carol's, still 60 s; dave does not see it.
    let l = cli
        .get_lease(req(
            &carol,
            GetLeaseRequest {
                name: lease.name.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(l.duration.unwrap().seconds, 60);
    assert_eq!(
        l.client.as_deref(),
        Some("namespaces/default/clients/carol")
    );
    let e = cli
        .get_lease(req(
            &dave,
            GetLeaseRequest {
                name: lease.name.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // Changes within the policy still work.
    let l = cli
        .update_lease(req(&carol, update(&lease.name, Some(120), None)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(l.duration.unwrap().seconds, 120);
    let l = cli
        .update_lease(req(&carol, update(&lease.name, None, Some("erin"))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(l.client.as_deref(), Some("namespaces/default/clients/erin"));
    lab.ctl.shutdown().await;
}
