//! Lease sharing over the real ClientService and ControllerService: the owner shares a lease
//! (`spec.sharedWith`); a shared client reads, lists, extends and releases it but neither
//! transfers it nor changes the list; any other client is told it does not exist; bad lists
//! are refused with a reason and change nothing.

use jumpstarter_controller::{objects::Lease as LeaseObject, store::Store};
use jumpstarter_proto::{
    client_v1::{
        CreateLeaseRequest, DeleteLeaseRequest, GetLeaseRequest, Lease, ListLeasesRequest,
        UpdateLeaseRequest, client_service_client::ClientServiceClient,
    },
    v1::{
        GetLeaseRequest as V1GetLeaseRequest, ListLeasesRequest as V1ListLeasesRequest,
        controller_service_client::ControllerServiceClient,
    },
};
use tonic::Code;

use crate::{Identity, Lab, lab, req};

type Cli = ClientServiceClient<jumpstarter_core::client::SessionChannel>;

fn create(shared_with: &[&str]) -> CreateLeaseRequest {
    CreateLeaseRequest {
        parent: "namespaces/default".into(),
        lease_id: String::new(),
        lease: Some(Lease {
            selector: "board=b".into(),
            duration: Some(prost_types::Duration {
                seconds: 60,
                nanos: 0,
            }),
            shared_with: shared_with.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }),
    }
}

fn share(name: &str, add: &[&str], remove: &[&str]) -> UpdateLeaseRequest {
    UpdateLeaseRequest {
        lease: Some(Lease {
            name: name.into(),
            ..Default::default()
        }),
        update_mask: None,
        add_shared_with: add.iter().map(|s| s.to_string()).collect(),
        remove_shared_with: remove.iter().map(|s| s.to_string()).collect(),
    }
}

fn extend(name: &str, seconds: i64) -> UpdateLeaseRequest {
    UpdateLeaseRequest {
        lease: Some(Lease {
            name: name.into(),
            duration: Some(prost_types::Duration { seconds, nanos: 0 }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn get(cli: &mut Cli, who: &Identity, name: &str) -> Result<Lease, tonic::Status> {
    cli.get_lease(req(who, GetLeaseRequest { name: name.into() }))
        .await
        .map(|r| r.into_inner())
}

async fn list(cli: &mut Cli, who: &Identity) -> Vec<String> {
    cli.list_leases(req(
        who,
        ListLeasesRequest {
            parent: "namespaces/default".into(),
            ..Default::default()
        },
    ))
    .await
    .unwrap()
    .into_inner()
    .leases
    .into_iter()
    .map(|l| l.name)
    .collect()
}

/// An exporter `board1` (board=b) registered and available, so leases on board=b pass the
/// access check of an update.
async fn board(lab: &Lab) -> tonic::Streaming<jumpstarter_proto::v1::StatusResponse> {
    let ex = lab.exporter("board1", &[("board", "b")]).await;
    crate::admin::bring_online(&lab.channel().await, &ex).await
}

#[tokio::test]
async fn bad_share_lists_are_refused_and_create_nothing() {
    let lab = lab().await;
    let alice = lab.client("alice").await;
    let _bob = lab.client("bob").await;
    let _status = board(&lab).await;
    let mut cli = ClientServiceClient::new(lab.channel().await);
    for (list, expect) in [
        (&["Bob_1"][..], "not a valid client name"),
        (&["alice"][..], "its owner"),
        (&["bob", "bob"][..], "named twice"),
        (&["zed"][..], "there is no client \"zed\""),
        (&["namespaces/other/clients/bob"][..], "its own namespace"),
        (&["a/b"][..], "not a valid client name"),
    ] {
        let e = cli
            .create_lease(req(&alice, create(list)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{list:?}: {}", e.message());
        assert!(e.message().contains(expect), "{list:?}: {}", e.message());
    }
    let stored = lab
        .ctl
        .state
        .store
        .list::<LeaseObject>(
            Some("default"),
            &jumpstarter_controller::LabelSelector::everything(),
            &Default::default(),
        )
        .await
        .unwrap();
    assert!(stored.items.is_empty(), "a refused request created a lease");
    // The full resource name of a client of the namespace is accepted as its short name.
    let l = cli
        .create_lease(req(&alice, create(&["namespaces/default/clients/bob"])))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(l.shared_with, vec!["bob".to_string()]);
}

#[tokio::test]
async fn owner_shared_and_other_clients_each_get_their_rights() {
    let lab = lab().await;
    let alice = lab.client("alice").await;
    let bob = lab.client("bob").await;
    let carol = lab.client("carol").await;
    let _status = board(&lab).await;
    let ch = lab.channel().await;
    let mut cli = ClientServiceClient::new(ch.clone());
    let mut ctl = ControllerServiceClient::new(ch.clone());

    let lease = cli
        .create_lease(req(&alice, create(&["bob"])))
        .await
        .unwrap()
        .into_inner();
    let name = lease.name.clone();
    let short = name.rsplit('/').next().unwrap().to_string();
    assert_eq!(lease.shared_with, vec!["bob".to_string()]);
    assert_eq!(
        lease.client.as_deref(),
        Some("namespaces/default/clients/alice")
    );

    // bob reads and lists it, on both services; carol is told it does not exist.
    let seen = get(&mut cli, &bob, &name).await.unwrap();
    assert_eq!(seen.shared_with, vec!["bob".to_string()]);
    assert!(list(&mut cli, &bob).await.contains(&name));
    assert_eq!(
        get(&mut cli, &carol, &name).await.unwrap_err().code(),
        Code::NotFound
    );
    assert!(!list(&mut cli, &carol).await.contains(&name));
    ctl.get_lease(req(
        &bob,
        V1GetLeaseRequest {
            name: short.clone(),
        },
    ))
    .await
    .unwrap();
    let e = ctl
        .get_lease(req(
            &carol,
            V1GetLeaseRequest {
                name: short.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert!(e.message().contains("permission denied"), "{}", e.message());
    let v1_names = |who: &Identity| {
        let mut ctl = ctl.clone();
        let who = who.clone();
        async move {
            ctl.list_leases(req(&who, V1ListLeasesRequest {}))
                .await
                .unwrap()
                .into_inner()
                .names
        }
    };
    assert!(v1_names(&bob).await.contains(&short));
    assert!(!v1_names(&carol).await.contains(&short));

    // bob extends it; carol cannot (NOT_FOUND, as for a lease that does not exist).
    let l = cli
        .update_lease(req(&bob, extend(&name, 90)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(l.duration.unwrap().seconds, 90);
    let e = cli
        .update_lease(req(&carol, extend(&name, 120)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());

    // Only alice changes the list or transfers the lease.
    let e = cli
        .update_lease(req(&bob, share(&name, &["carol"], &[])))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    assert!(
        e.message().contains("only the lease's owner"),
        "{}",
        e.message()
    );
    let mut transfer = extend(&name, 90);
    transfer.lease.as_mut().unwrap().duration = None;
    transfer.lease.as_mut().unwrap().client = Some("namespaces/default/clients/bob".into());
    let e = cli.update_lease(req(&bob, transfer)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    let e = cli
        .update_lease(req(&alice, share(&name, &[], &["carol"])))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("not shared with"), "{}", e.message());
    let e = cli
        .update_lease(req(&alice, share(&name, &["alice"], &[])))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    let l = cli
        .update_lease(req(&alice, share(&name, &["carol"], &[])))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(l.shared_with, vec!["bob".to_string(), "carol".to_string()]);
    assert!(get(&mut cli, &carol, &name).await.is_ok());

    // alice takes bob off: he loses it at once.
    let l = cli
        .update_lease(req(&alice, share(&name, &[], &["bob"])))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(l.shared_with, vec!["carol".to_string()]);
    assert_eq!(
        get(&mut cli, &bob, &name).await.unwrap_err().code(),
        Code::NotFound
    );
    let e = cli
        .delete_lease(req(&bob, DeleteLeaseRequest { name: name.clone() }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());

    // carol, shared with, releases it.
    cli.delete_lease(req(&carol, DeleteLeaseRequest { name: name.clone() }))
        .await
        .unwrap();
    let stored: LeaseObject = lab
        .ctl
        .state
        .store
        .get("default", &short)
        .await
        .unwrap()
        .unwrap();
    assert!(
        stored.spec.release,
        "the shared client's release was not recorded"
    );
}
