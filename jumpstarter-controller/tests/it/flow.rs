//! Register -> Status -> CreateLease -> Ready -> Dial -> release, ownership and bad input.

use std::time::Duration;

use futures::StreamExt;
use jumpstarter_proto::{
    client_v1::{
        CreateLeaseRequest, DeleteLeaseRequest, GetLeaseRequest, Lease, ListExportersRequest,
        ListLeasesRequest, client_service_client::ClientServiceClient,
    },
    v1::{
        DialRequest, DriverInstanceReport, ExporterStatus, ListenRequest, RegisterRequest,
        ReportStatusRequest, StatusRequest, controller_service_client::ControllerServiceClient,
    },
};
use tonic::Code;

use crate::{Identity, lab, lab_configured, req};

fn lease_spec(selector: &str, secs: i64) -> Lease {
    Lease {
        selector: selector.into(),
        duration: Some(prost_types::Duration {
            seconds: secs,
            nanos: 0,
        }),
        ..Default::default()
    }
}

async fn wait_ready(
    c: &mut ClientServiceClient<jumpstarter_core::client::SessionChannel>,
    who: &Identity,
    name: &str,
) -> Lease {
    for _ in 0..100 {
        let l = c
            .get_lease(req(who, GetLeaseRequest { name: name.into() }))
            .await
            .unwrap()
            .into_inner();
        if l.conditions
            .iter()
            .any(|c| c.r#type.as_deref() == Some("Ready") && c.status.as_deref() == Some("True"))
        {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("lease {name} never became ready");
}

#[tokio::test]
async fn full_lease_flow_over_tls() {
    let lab = lab().await;
    let hello = lab.client("hello").await;
    let other = lab.client("other").await;
    let ex = lab.exporter("ex1", &[("foo", "bar")]).await;
    let ch = lab.channel().await;
    let mut ctl = ControllerServiceClient::new(ch.clone());
    let mut cli = ClientServiceClient::new(ch.clone());

    // The exporter registers, reports available and holds its Status stream.
    let uuid = ctl
        .register(req(
            &ex,
            RegisterRequest {
                labels: Default::default(),
                reports: vec![DriverInstanceReport {
                    uuid: uuid::Uuid::new_v4().to_string(),
                    ..Default::default()
                }],
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .uuid;
    assert!(!uuid.is_empty());
    ctl.report_status(req(
        &ex,
        ReportStatusRequest {
            status: ExporterStatus::Available as i32,
            message: Some("Exporter registered and available".into()),
            release_lease: None,
        },
    ))
    .await
    .unwrap();
    let mut status = ctl
        .status(req(&ex, StatusRequest {}))
        .await
        .unwrap()
        .into_inner();
    let first = status.next().await.unwrap().unwrap();
    assert!(!first.leased);

    // The client sees it online and leases it.
    let list = cli
        .list_exporters(req(
            &hello,
            ListExportersRequest {
                parent: "namespaces/default".into(),
                filter: "foo=bar".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.exporters.len(), 1);
    assert_eq!(list.exporters[0].name, "namespaces/default/exporters/ex1");
    let lease = cli
        .create_lease(req(
            &hello,
            CreateLeaseRequest {
                parent: "namespaces/default".into(),
                lease_id: String::new(),
                lease: Some(lease_spec("foo=bar", 300)),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let lease_name = lease.name.rsplit('/').next().unwrap().to_string();
    let ready = wait_ready(&mut cli, &hello, &lease.name).await;
    assert_eq!(
        ready.exporter.as_deref(),
        Some("namespaces/default/exporters/ex1")
    );

    // The exporter learns of the lease on its Status stream.
    let leased = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let m = status.next().await.unwrap().unwrap();
            if m.leased {
                return m;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(leased.lease_name.as_deref(), Some(lease_name.as_str()));
    assert_eq!(leased.client_name.as_deref(), Some("hello"));

    // Listen, then Dial: the same router token reaches both.
    let mut listen = ctl
        .listen(req(
            &ex,
            ListenRequest {
                lease_name: lease_name.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    ctl.report_status(req(
        &ex,
        ReportStatusRequest {
            status: ExporterStatus::LeaseReady as i32,
            message: Some("Ready for commands".into()),
            release_lease: None,
        },
    ))
    .await
    .unwrap();
    let dial = ctl
        .dial(req(
            &hello,
            DialRequest {
                lease_name: lease_name.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let heard = listen.next().await.unwrap().unwrap();
    assert_eq!(heard.router_token, dial.router_token);
    assert_eq!(
        dial.router_endpoint,
        format!("localhost:{}", lab.ctl.router_addr.port())
    );

    // Ownership: another client can neither see, dial nor delete the lease.
    let e = cli
        .get_lease(req(
            &other,
            GetLeaseRequest {
                name: lease.name.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = ctl
        .dial(req(
            &other,
            DialRequest {
                lease_name: lease_name.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.message(), "permission denied");
    let e = cli
        .delete_lease(req(
            &other,
            DeleteLeaseRequest {
                name: lease.name.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let theirs = cli
        .list_leases(req(
            &other,
            ListLeasesRequest {
                parent: "namespaces/default".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(theirs.leases.is_empty());

    // Release: the lease ends and the exporter is told.
    cli.delete_lease(req(
        &hello,
        DeleteLeaseRequest {
            name: lease.name.clone(),
        },
    ))
    .await
    .unwrap();
    let e = cli
        .delete_lease(req(
            &hello,
            DeleteLeaseRequest {
                name: lease.name.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let freed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let m = status.next().await.unwrap().unwrap();
            if !m.leased {
                return m;
            }
        }
    })
    .await
    .unwrap();
    assert!(freed.lease_name.is_none());
    lab.ctl.shutdown().await;
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let lab = lab().await;
    let hello = lab.client("hello").await;
    let ch = lab.channel().await;
    let mut cli = ClientServiceClient::new(ch.clone());
    let create = |selector: &str, secs: i64| CreateLeaseRequest {
        parent: "namespaces/default".into(),
        lease_id: String::new(),
        lease: Some(lease_spec(selector, secs)),
    };
    for (body, what) in [
        (create("foo in (bar", 60), "malformed selector"),
        (create("", 60), "no selector"),
        (create("foo=bar", 0), "zero duration"),
        (create("foo=bar", -5), "negative duration"),
    ] {
        let e = cli.create_lease(req(&hello, body)).await.unwrap_err();
        assert!(
            matches!(e.code(), Code::InvalidArgument | Code::Unknown),
            "{what}: {e:?}"
        );
    }
    let mut tagged = create("foo=bar", 60);
    if let Some(l) = tagged.lease.as_mut() {
        l.tags.insert("jumpstarter.dev/x".into(), "y".into());
    }
    let e = cli.create_lease(req(&hello, tagged)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = cli
        .create_lease(req(
            &hello,
            CreateLeaseRequest {
                parent: "namespaces/elsewhere".into(),
                lease_id: String::new(),
                lease: Some(lease_spec("foo=bar", 60)),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // Nothing was created.
    let all = cli
        .list_leases(req(
            &hello,
            ListLeasesRequest {
                parent: "namespaces/default".into(),
                only_active: Some(false),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(all.leases.is_empty());

    // Garbage and missing credentials.
    let mut garbage = hello.clone();
    garbage.token = "not-a-jwt".into();
    let e = cli
        .list_leases(req(
            &garbage,
            ListLeasesRequest {
                parent: "namespaces/default".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unknown);
    let e = cli
        .list_leases(tonic::Request::new(ListLeasesRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert_eq!(e.message(), "missing authorization header");
    // An exporter token on a client RPC.
    let ex = lab.exporter("ex1", &[]).await;
    let e = cli
        .list_leases(req(
            &ex,
            ListLeasesRequest {
                parent: "namespaces/default".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "object kind mismatch");
    lab.ctl.shutdown().await;
}

/// `hiddenLabels` and `deprecatedLabels` of the ConfigMap: `GetExporter` and `ListExporters`
/// leave those keys out of an exporter's labels unless asked (`show_hidden_labels`), report
/// the deprecated ones with their message, and a selector still matches them all.
#[tokio::test]
async fn hidden_and_deprecated_labels_are_left_out_unless_asked() {
    use jumpstarter_proto::client_v1::GetExporterRequest;
    let lab = lab_configured(|c| {
        c.label_policy = jumpstarter_controller::objects::LabelPolicy {
            hidden: ["rack".to_string()].into(),
            deprecated: [("old-board".to_string(), "use board".to_string())].into(),
        };
    })
    .await;
    let hello = lab.client("hello").await;
    lab.exporter("ex1", &[("board", "a"), ("rack", "r7"), ("old-board", "a")])
        .await;
    let mut cli = ClientServiceClient::new(lab.channel().await);
    let keys = |e: &jumpstarter_proto::client_v1::Exporter| {
        let mut k: Vec<&str> = e.labels.keys().map(String::as_str).collect();
        k.sort_unstable();
        k.join(",")
    };
    for show in [false, true] {
        // Selected by a hidden label: it still matches.
        let list = cli
            .list_exporters(req(
                &hello,
                ListExportersRequest {
                    parent: "namespaces/default".into(),
                    filter: "rack=r7".into(),
                    show_hidden_labels: show,
                    ..Default::default()
                },
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(list.exporters.len(), 1);
        let got = cli
            .get_exporter(req(
                &hello,
                GetExporterRequest {
                    name: "namespaces/default/exporters/ex1".into(),
                    show_hidden_labels: show,
                },
            ))
            .await
            .unwrap()
            .into_inner();
        let want = if show {
            "board,old-board,rack"
        } else {
            "board"
        };
        for e in [&list.exporters[0], &got] {
            assert_eq!(keys(e), want, "show_hidden_labels {show}");
            assert_eq!(
                e.deprecated_labels,
                [("old-board".to_string(), "use board".to_string())].into()
            );
        }
    }
}

fn ready(l: &Lease) -> bool {
    l.conditions
        .iter()
        .any(|c| c.r#type.as_deref() == Some("Ready") && c.status.as_deref() == Some("True"))
}

fn granted_spec(selector: &str) -> Option<Lease> {
    Some(Lease {
        selector: selector.into(),
        duration: Some(prost_types::Duration {
            seconds: 300,
            nanos: 0,
        }),
        ..Default::default()
    })
}

/// `CreateLease` answers once the scheduler has looked at the new lease: a lease an online,
/// free exporter can take at once comes back ready (its client need not poll for the
/// grant); one that must wait comes back waiting, and is granted later as before (what a
/// client that polls, like upstream's, sees either way).
#[tokio::test]
async fn a_lease_granted_at_once_comes_back_ready_and_a_waiting_one_waiting() {
    let lab = lab().await;
    let first = lab.client("first").await;
    let second = lab.client("second").await;
    let ex = lab.exporter("ex1", &[("board", "g")]).await;
    let ch = lab.channel().await;
    let mut cli = ClientServiceClient::new(ch.clone());
    // The exporter comes online: registered, available, its Status stream open.
    let _status = crate::admin::bring_online(&ch, &ex).await;

    let granted = cli
        .create_lease(req(
            &first,
            CreateLeaseRequest {
                parent: "namespaces/default".into(),
                lease_id: String::new(),
                lease: granted_spec("board=g"),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(ready(&granted), "{granted:?}");
    assert_eq!(
        granted.exporter.as_deref(),
        Some("namespaces/default/exporters/ex1")
    );
    // What a polling client then reads says the same.
    let polled = cli
        .get_lease(req(
            &first,
            GetLeaseRequest {
                name: granted.name.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(ready(&polled) && polled.exporter == granted.exporter);
    // The lease as stored, not an earlier copy (the answer comes from the pass's writes).
    assert_eq!(polled.conditions, granted.conditions);

    // The exporter is taken: the next lease comes back waiting, with its place in the queue.
    let waiting = cli
        .create_lease(req(
            &second,
            CreateLeaseRequest {
                parent: "namespaces/default".into(),
                lease_id: String::new(),
                lease: granted_spec("board=g"),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!ready(&waiting), "{waiting:?}");
    assert!(waiting.exporter.is_none(), "{waiting:?}");
    assert!(
        waiting
            .conditions
            .iter()
            .any(|c| c.r#type.as_deref() == Some("Pending") && c.status.as_deref() == Some("True")),
        "{waiting:?}"
    );
    cli.delete_lease(req(
        &first,
        DeleteLeaseRequest {
            name: granted.name.clone(),
        },
    ))
    .await
    .unwrap();
    cli.delete_lease(req(
        &second,
        DeleteLeaseRequest {
            name: waiting.name.clone(),
        },
    ))
    .await
    .unwrap();
}
