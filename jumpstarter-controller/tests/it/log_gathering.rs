//! Log gathering over the real services: the controller names itself as the telemetry
//! endpoint (or nothing with it off), keeps what the exporter of a lease pushes
//! (`TelemetryService.PushLogs`) beside its own events, and hands a lease's log to its
//! holder, a client it is shared with and the admin; anything else is refused and changes
//! nothing.

use std::time::Duration;

use futures::StreamExt;
use jumpstarter_proto::{
    admin_v1::{ObjectRef, admin_service_client::AdminServiceClient},
    client_v1::{CreateLeaseRequest, Lease, client_service_client::ClientServiceClient},
    ext_v1::{GetLeaseLogsRequest, client_extension_service_client::ClientExtensionServiceClient},
    v1::{
        GetServiceEndpointsRequest, LogEntry, PushLogsRequest, StatusResponse,
        controller_service_client::ControllerServiceClient,
        telemetry_service_client::TelemetryServiceClient,
    },
};
use tonic::Code;

use crate::{Identity, Lab, lab, lab_configured, req};

/// Exporter `name` (board=NAME) registered, available and following its status stream.
async fn board(lab: &Lab, name: &str) -> (Identity, tonic::Streaming<StatusResponse>) {
    let ex = lab.exporter(name, &[("board", name)]).await;
    let status = crate::admin::bring_online(&lab.channel().await, &ex).await;
    (ex, status)
}

/// A lease of `client` on board `board` (shared with `shared`), once granted: its short name.
async fn granted(
    lab: &Lab,
    client: &Identity,
    board: &str,
    shared: &[&str],
    status: &mut tonic::Streaming<StatusResponse>,
) -> String {
    let mut cli = ClientServiceClient::new(lab.channel().await);
    let lease = cli
        .create_lease(req(
            client,
            CreateLeaseRequest {
                parent: "namespaces/default".into(),
                lease_id: String::new(),
                lease: Some(Lease {
                    selector: format!("board={board}"),
                    duration: Some(prost_types::Duration {
                        seconds: 600,
                        nanos: 0,
                    }),
                    shared_with: shared.iter().map(|s| s.to_string()).collect(),
                    context: [("build_id".to_string(), "42".to_string())].into(),
                    ..Default::default()
                }),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let short = lease.name.rsplit('/').next().unwrap().to_string();
    // The exporter hears of it on its status stream (bounded: a hang is a failure).
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(Ok(msg)) = status.next().await {
            if msg.leased && msg.lease_name.as_deref() == Some(short.as_str()) {
                return;
            }
        }
        panic!("status stream ended before the lease was granted");
    })
    .await
    .expect("the lease was not granted within 60 s");
    short
}

fn entry(lease: &str, message: &str) -> LogEntry {
    LogEntry {
        timestamp: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
        severity: "info".into(),
        message: message.into(),
        lease: lease.into(),
        operation: "on".into(),
        result: "ok".into(),
        driver_type: "MockPower".into(),
        ..Default::default()
    }
}

/// A console transcript's record of `lease`, as the exporter pushes it.
fn console_entry(lease: &str) -> LogEntry {
    LogEntry {
        timestamp: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
        severity: "info".into(),
        message: "login: ".into(),
        lease: lease.into(),
        extra_fields: [
            ("stream", "console"),
            ("console", "serial"),
            ("direction", "board->client"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
        ..Default::default()
    }
}

async fn read(lab: &Lab, who: &Identity, lease: &str) -> Result<Vec<LogEntry>, tonic::Status> {
    read_part(lab, who, lease, false).await
}

/// The lease's console transcript entries (`console`) or its other entries.
async fn read_part(
    lab: &Lab,
    who: &Identity,
    lease: &str,
    console: bool,
) -> Result<Vec<LogEntry>, tonic::Status> {
    ClientExtensionServiceClient::new(lab.channel().await)
        .get_lease_logs(req(
            who,
            GetLeaseLogsRequest {
                name: format!("namespaces/default/leases/{lease}"),
                console,
            },
        ))
        .await
        .map(|r| r.into_inner().entries)
}

#[tokio::test]
async fn a_leases_story_is_its_controller_events_and_its_exporters_entries() {
    let lab = lab().await;
    let alice = lab.client("alice").await;
    let bob = lab.client("bob").await;
    let carol = lab.client("carol").await;
    let (ex, mut status) = board(&lab, "b1").await;
    let (other, _other_status) = board(&lab, "b2").await;

    // The controller names itself as the telemetry endpoint, to exporters and clients.
    let mut ctl = ControllerServiceClient::new(lab.channel().await);
    for who in [&ex, &alice] {
        let endpoints = ctl
            .get_service_endpoints(req(who, GetServiceEndpointsRequest {}))
            .await
            .unwrap()
            .into_inner()
            .telemetry_endpoints;
        assert_eq!(endpoints.len(), 1, "{endpoints:?}");
        assert!(
            endpoints[0]
                .endpoint
                .ends_with(&format!(":{}", lab.ctl.addr.port()))
        );
    }

    let lease = granted(&lab, &alice, "b1", &["bob"], &mut status).await;
    let mut sink = TelemetryServiceClient::new(lab.channel().await);
    let got = sink
        .push_logs(req(
            &ex,
            PushLogsRequest {
                entries: vec![entry(&lease, "driver call"), console_entry(&lease)],
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((got.accepted, got.dropped), (2, 0));

    // Refused, and nothing of the batch kept: entries for a lease another exporter holds,
    // entries claiming another exporter, a batch too big, a field too long.
    let refusals = [
        (
            &other,
            vec![entry(&lease, "forged")],
            Code::PermissionDenied,
            "not held by exporter",
        ),
        (
            &ex,
            vec![entry(&lease, "fine"), entry("no-such-lease", "forged")],
            Code::PermissionDenied,
            "not held by exporter",
        ),
        (
            &ex,
            vec![LogEntry {
                exporter: "b2".into(),
                ..entry(&lease, "forged")
            }],
            Code::PermissionDenied,
            "pushed by exporter",
        ),
        (
            &ex,
            vec![entry(&lease, "forged"); 1001],
            Code::InvalidArgument,
            "at most 1000",
        ),
        (
            &ex,
            vec![entry(&lease, "fine"), entry(&lease, &"x".repeat(20_000))],
            Code::InvalidArgument,
            "entry 1: message has 20000 characters",
        ),
    ];
    for (who, entries, code, text) in refusals {
        let e = sink
            .push_logs(req(who, PushLogsRequest { entries }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{}", e.message());
        assert!(e.message().contains(text), "{}", e.message());
    }
    // A client's credentials are not an exporter's.
    let e = sink
        .push_logs(req(
            &alice,
            PushLogsRequest {
                entries: vec![entry(&lease, "forged")],
            },
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.code(),
            Code::Unauthenticated | Code::PermissionDenied | Code::InvalidArgument
        ),
        "{e:?}"
    );

    // The holder and the client it is shared with read it; another client is told it does
    // not exist, as with GetLease.
    for who in [&alice, &bob] {
        let entries = read(&lab, who, &lease).await.unwrap();
        let messages: Vec<&str> = entries.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(
            messages,
            ["lease created", "lease granted", "driver call"],
            "{entries:?}"
        );
        let call = &entries[2];
        assert_eq!(call.exporter, "b1");
        assert_eq!(call.client, "alice");
        assert_eq!(call.namespace, "default");
        assert_eq!(call.component, "exporter");
        // The controller's own events carry the lease's context.
        assert_eq!(entries[0].extra_fields["build_id"], "42");
        assert_eq!(entries[1].extra_fields["build_id"], "42");
        assert_eq!(entries[1].exporter, "b1");
    }
    assert_eq!(
        read(&lab, &carol, &lease).await.unwrap_err().code(),
        Code::NotFound
    );
    // The console transcript apart: to the holder only; the client the lease is shared with
    // is told it does not exist, as another client is.
    let console = read_part(&lab, &alice, &lease, true).await.unwrap();
    assert_eq!(console.len(), 1, "{console:?}");
    assert_eq!(console[0].message, "login: ");
    assert_eq!(console[0].extra_fields["direction"], "board->client");
    for who in [&bob, &carol] {
        let e = read_part(&lab, who, &lease, true).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
    }

    // The admin reads any lease.
    let admin_token = lab.ctl.admin_token.clone();
    let mut admin = AdminServiceClient::new(lab.channel().await);
    let mut r = tonic::Request::new(ObjectRef {
        namespace: "default".into(),
        name: lease.clone(),
    });
    r.metadata_mut().insert(
        "authorization",
        format!("Bearer {admin_token}").parse().unwrap(),
    );
    let logs = admin.get_lease_logs(r).await.unwrap().into_inner();
    assert_eq!(logs.entries.len(), 4, "{:?}", logs.entries);
    assert_eq!(logs.name, format!("namespaces/default/leases/{lease}"));
}

#[tokio::test]
async fn with_log_gathering_off_no_endpoint_is_named_and_nothing_is_kept() {
    let lab = lab_configured(|c| c.lease_logs = None).await;
    let alice = lab.client("alice").await;
    let (ex, mut status) = board(&lab, "b1").await;
    let mut ctl = ControllerServiceClient::new(lab.channel().await);
    let endpoints = ctl
        .get_service_endpoints(req(&ex, GetServiceEndpointsRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert!(endpoints.telemetry_endpoints.is_empty());
    let lease = granted(&lab, &alice, "b1", &[], &mut status).await;
    let e = TelemetryServiceClient::new(lab.channel().await)
        .push_logs(req(
            &ex,
            PushLogsRequest {
                entries: vec![entry(&lease, "x")],
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    let e = read(&lab, &alice, &lease).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("--lease-logs off"), "{}", e.message());
}
