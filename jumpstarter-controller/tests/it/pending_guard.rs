//! Issue 22 item 4 (server guard): a lease waiting for an exporter whose client has gone
//! silent is ended after the configured time, with a condition saying so; a client that
//! keeps polling keeps its place.

use std::time::Duration;

use jumpstarter_controller::{
    ControllerConfig, REASON_CLIENT_GONE,
    objects::{Lease as StoredLease, find_condition},
    start,
    store::Store,
};
use jumpstarter_proto::client_v1::{
    CreateLeaseRequest, GetLeaseRequest, Lease, client_service_client::ClientServiceClient,
};

use crate::{Lab, req};

#[tokio::test]
async fn a_silent_clients_waiting_lease_is_ended() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = start(ControllerConfig {
        pending_client_timeout: Some(Duration::from_secs(2)),
        ..ControllerConfig::loopback(dir.path().join("data"))
    })
    .await
    .unwrap();
    let lab = Lab { ctl, dir };
    let quiet = lab.client("quiet").await;
    let polling = lab.client("polling").await;
    // Never online: both leases wait.
    lab.exporter("ex1", &[("board", "x")]).await;
    let mut cli = ClientServiceClient::new(lab.channel().await);
    let mut names = Vec::new();
    for who in [&quiet, &polling] {
        let l = cli
            .create_lease(req(
                who,
                CreateLeaseRequest {
                    parent: "namespaces/default".into(),
                    lease_id: String::new(),
                    lease: Some(Lease {
                        selector: "board=x".into(),
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
        names.push(l.name.rsplit('/').next().unwrap().to_string());
    }
    let stored = |name: String| {
        let store = &lab.ctl.state.store;
        async move {
            store
                .get::<StoredLease>("default", &name)
                .await
                .unwrap()
                .unwrap()
        }
    };
    let mut ended = None;
    for _ in 0..150 {
        // The polling client is heard from all along.
        cli.get_lease(req(
            &polling,
            GetLeaseRequest {
                name: format!("namespaces/default/leases/{}", names[1]),
            },
        ))
        .await
        .unwrap();
        let l = stored(names[0].clone()).await;
        if l.is_ended() {
            ended = Some(l);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let l = ended.expect("the silent client's lease was never ended");
    let conds = &l.status.as_ref().unwrap().conditions;
    let ready = find_condition(conds, "Ready").unwrap();
    assert_eq!(ready.reason, REASON_CLIENT_GONE);
    assert!(ready.message.contains("quiet"), "{}", ready.message);
    assert!(!stored(names[1].clone()).await.is_ended());
    lab.ctl.shutdown().await;
}
