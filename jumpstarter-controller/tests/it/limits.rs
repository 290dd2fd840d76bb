//! Issue 22 items 5 and 9: size limits name the field and the limit; an invalid lease id and
//! a Duration with out-of-range nanos are INVALID_ARGUMENT, and nothing is stored.

use jumpstarter_controller::{
    LabelSelector,
    objects::Lease as StoredLease,
    store::{ListParams, Store},
};
use jumpstarter_proto::client_v1::{
    CreateLeaseRequest, Lease, ListExportersRequest, client_service_client::ClientServiceClient,
};
use tonic::Code;

use crate::{lab, req};

#[tokio::test]
async fn oversized_and_malformed_client_input_is_invalid_argument() {
    let lab = lab().await;
    let hello = lab.client("hello").await;
    let ch = lab.channel().await;
    let mut cli = ClientServiceClient::new(ch).max_encoding_message_size(8 * 1024 * 1024);
    let create = |lease_id: &str, lease: Lease| CreateLeaseRequest {
        parent: "namespaces/default".into(),
        lease_id: lease_id.into(),
        lease: Some(lease),
    };
    let lease = |selector: String, seconds: i64, nanos: i32| Lease {
        selector,
        duration: Some(prost_types::Duration { seconds, nanos }),
        ..Default::default()
    };

    // A 1 MB selector: refused before it is parsed.
    let big = format!("a in ({})", vec!["x"; 500_000].join(","));
    let e = cli
        .create_lease(req(&hello, create("", lease(big.clone(), 60, 0))))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("lease.selector"), "{}", e.message());
    assert!(e.message().contains("4096"), "{}", e.message());
    let e = cli
        .list_exporters(req(
            &hello,
            ListExportersRequest {
                parent: "namespaces/default".into(),
                filter: big,
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("filter"), "{}", e.message());

    // Too many tags.
    let mut tagged = lease("a=b".into(), 60, 0);
    tagged.tags = (0..1000)
        .map(|i| (format!("k{i}"), "v".to_string()))
        .collect();
    let e = cli
        .create_lease(req(&hello, create("", tagged)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("lease.tags"), "{}", e.message());

    // An invalid lease id.
    for bad in ["Not_A_Name", "a/b", &"x".repeat(300)] {
        let e = cli
            .create_lease(req(&hello, create(bad, lease("a=b".into(), 60, 0))))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {}", e.message());
        assert!(e.message().contains("lease_id"), "{}", e.message());
    }

    // Nanos out of range.
    let e = cli
        .create_lease(req(
            &hello,
            create("", lease("a=b".into(), 60, 1_000_000_000)),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("nanos"), "{}", e.message());

    // Nothing was stored.
    let stored = lab
        .ctl
        .state
        .store
        .list::<StoredLease>(None, &LabelSelector::everything(), &ListParams::default())
        .await
        .unwrap();
    assert!(stored.items.is_empty(), "{:?}", stored.items);
    lab.ctl.shutdown().await;
}
