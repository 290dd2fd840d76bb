//! AdminService over the real TLS listener: credentials that work on the other services,
//! listing, deletion, rotation, authorization and bad input; plus the admin config, health,
//! reflection, metrics and own certificates.

use std::{collections::HashMap, os::unix::fs::PermissionsExt, time::Duration};

use futures::StreamExt;
use jumpstarter_controller::{
    ControllerConfig, objects::Lease as LeaseObject, start, store::Store,
};
use jumpstarter_core::{
    auth::ObjectKind,
    client::{ConnectOptions, SessionChannel, connect_channel},
    config::AdminConfig,
};
use jumpstarter_proto::{
    admin_v1::{
        AccessPolicy, AccessRule, Client as AdminClient, CreateClientRequest,
        CreateExporterRequest, Credentials, Exporter as AdminExporter, ListRequest, ObjectRef,
        admin_service_client::AdminServiceClient,
    },
    client_v1::{
        CreateLeaseRequest, GetLeaseRequest, Lease, ListExportersRequest, ListLeasesRequest,
        client_service_client::ClientServiceClient,
    },
    v1::{
        DriverInstanceReport, ExporterStatus, RegisterRequest, ReportStatusRequest, StatusRequest,
        StatusResponse, controller_service_client::ControllerServiceClient,
    },
};
use tonic::{Code, Streaming};

use crate::{Identity, Lab, lab, req};

/// A request with `authorization: Bearer <token>` only.
pub fn admin_req<T>(token: &str, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

pub fn obj(name: &str) -> ObjectRef {
    ObjectRef {
        namespace: String::new(),
        name: name.into(),
    }
}

fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn identity(kind: ObjectKind, c: &Credentials) -> Identity {
    Identity {
        kind,
        name: c.name.clone(),
        token: c.token.clone(),
    }
}

pub async fn create_client(
    admin: &mut AdminServiceClient<SessionChannel>,
    token: &str,
    name: &str,
    l: &[(&str, &str)],
) -> Result<Credentials, tonic::Status> {
    let r = admin
        .create_client(admin_req(
            token,
            CreateClientRequest {
                client: Some(AdminClient {
                    name: name.into(),
                    labels: labels(l),
                    ..Default::default()
                }),
            },
        ))
        .await?
        .into_inner();
    Ok(r.credentials.unwrap())
}

pub async fn create_exporter(
    admin: &mut AdminServiceClient<SessionChannel>,
    token: &str,
    name: &str,
    l: &[(&str, &str)],
) -> Result<Credentials, tonic::Status> {
    let r = admin
        .create_exporter(admin_req(
            token,
            CreateExporterRequest {
                exporter: Some(AdminExporter {
                    name: name.into(),
                    labels: labels(l),
                    ..Default::default()
                }),
            },
        ))
        .await?
        .into_inner();
    Ok(r.credentials.unwrap())
}

/// Registers, reports Available and opens the Status stream (keep it to stay online).
pub async fn bring_online(ch: &SessionChannel, ex: &Identity) -> Streaming<StatusResponse> {
    let mut ctl = ControllerServiceClient::new(ch.clone());
    ctl.register(req(
        ex,
        RegisterRequest {
            labels: Default::default(),
            reports: vec![DriverInstanceReport {
                uuid: uuid::Uuid::new_v4().to_string(),
                ..Default::default()
            }],
        },
    ))
    .await
    .unwrap();
    ctl.report_status(req(
        ex,
        ReportStatusRequest {
            status: ExporterStatus::Available as i32,
            message: Some("available".into()),
            release_lease: None,
        },
    ))
    .await
    .unwrap();
    let mut s = ctl
        .status(req(ex, StatusRequest {}))
        .await
        .unwrap()
        .into_inner();
    s.next().await.unwrap().unwrap();
    s
}

pub fn lease_spec(selector: &str, secs: i64) -> Lease {
    Lease {
        selector: selector.into(),
        duration: Some(prost_types::Duration {
            seconds: secs,
            nanos: 0,
        }),
        ..Default::default()
    }
}

pub async fn create_lease(ch: &SessionChannel, who: &Identity, selector: &str) -> Lease {
    ClientServiceClient::new(ch.clone())
        .create_lease(req(
            who,
            CreateLeaseRequest {
                parent: "namespaces/default".into(),
                lease_id: String::new(),
                lease: Some(lease_spec(selector, 3600)),
            },
        ))
        .await
        .unwrap()
        .into_inner()
}

fn condition(l: &Lease, t: &str) -> Option<(String, String)> {
    l.conditions
        .iter()
        .find(|c| c.r#type.as_deref() == Some(t))
        .map(|c| {
            (
                c.status.clone().unwrap_or_default(),
                c.reason.clone().unwrap_or_default(),
            )
        })
}

/// Polls GetLease until `pred` holds.
pub async fn wait_lease(
    ch: &SessionChannel,
    who: &Identity,
    name: &str,
    pred: impl Fn(&Lease) -> bool,
) -> Lease {
    let mut cli = ClientServiceClient::new(ch.clone());
    for _ in 0..100 {
        let l = cli
            .get_lease(req(who, GetLeaseRequest { name: name.into() }))
            .await
            .unwrap()
            .into_inner();
        if pred(&l) {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("lease {name} never reached the expected state");
}

/// Waits (bounded) until the admin API shows exporter `name` held by lease `lease` (a bare
/// name). The reconcile pass writes the lease's Ready condition before the exporter's
/// `leaseRef`, so a reader can see one without the other for a moment, as upstream's can.
pub async fn wait_exporter_lease(
    admin: &mut AdminServiceClient<SessionChannel>,
    token: &str,
    name: &str,
    lease: &str,
) -> jumpstarter_proto::admin_v1::Exporter {
    let mut last = String::new();
    for _ in 0..100 {
        let got = admin
            .get_exporter(admin_req(token, obj(name)))
            .await
            .unwrap()
            .into_inner();
        if got.lease == lease {
            return got;
        }
        last = got.lease;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("exporter {name} never showed lease {lease:?} (last: {last:?})");
}

pub fn is_ready(l: &Lease) -> bool {
    condition(l, "Ready").is_some_and(|(s, _)| s == "True")
}

impl Lab {
    async fn admin(&self) -> AdminServiceClient<SessionChannel> {
        AdminServiceClient::new(self.channel().await)
    }
}

#[tokio::test]
async fn created_credentials_work_on_the_other_services() {
    let lab = lab().await;
    let token = lab.ctl.admin_token.clone();
    let ch = lab.channel().await;
    let mut admin = lab.admin().await;

    let c = create_client(&mut admin, &token, "alice", &[("team", "ci")])
        .await
        .unwrap();
    assert_eq!(c.endpoint, lab.ctl.endpoint);
    assert_eq!(c.ca_pem, lab.ctl.ca_pem);
    assert_eq!(
        (c.namespace.as_str(), c.name.as_str()),
        ("default", "alice")
    );
    assert!(c.expiry.unwrap().seconds > jiff::Timestamp::now().as_second());
    let alice = identity(ObjectKind::Client, &c);
    let e = create_exporter(&mut admin, &token, "rpi-1", &[("board", "rpi4")])
        .await
        .unwrap();
    create_exporter(&mut admin, &token, "rpi-2", &[("board", "rpi5")])
        .await
        .unwrap();
    let ex = identity(ObjectKind::Exporter, &e);

    // The exporter registers with its token; the client sees it online and leases it.
    let mut status = bring_online(&ch, &ex).await;
    let mut cli = ClientServiceClient::new(ch.clone());
    let listed = cli
        .list_exporters(req(
            &alice,
            ListExportersRequest {
                parent: "namespaces/default".into(),
                filter: "board=rpi4".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.exporters.len(), 1);
    let lease = create_lease(&ch, &alice, "board=rpi4").await;
    wait_lease(&ch, &alice, &lease.name, is_ready).await;

    // Listing by selector and by namespace; Get shows the lease holding the exporter.
    let all = admin
        .list_exporters(admin_req(&token, ListRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.exporters.len(), 2);
    let rpi5 = admin
        .list_exporters(admin_req(
            &token,
            ListRequest {
                namespace: "default".into(),
                selector: "board in (rpi5)".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rpi5.exporters.len(), 1);
    assert_eq!(rpi5.exporters[0].name, "rpi-2");
    let none = admin
        .list_clients(admin_req(
            &token,
            ListRequest {
                namespace: "elsewhere".into(),
                selector: String::new(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(none.clients.is_empty());
    let got = wait_exporter_lease(
        &mut admin,
        &token,
        "rpi-1",
        lease.name.rsplit('/').next().unwrap(),
    )
    .await;
    assert!(got.online);
    assert!(got.enabled);
    assert_eq!(got.labels.get("board").map(String::as_str), Some("rpi4"));
    let got = admin
        .get_client(admin_req(&token, obj("alice")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.labels.get("team").map(String::as_str), Some("ci"));
    assert!(got.created.is_some());

    // Rotation: a new token that works too.
    let rotated = admin
        .rotate_client(admin_req(&token, obj("alice")))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(rotated.token, c.token);
    let alice2 = identity(ObjectKind::Client, &rotated);
    cli.list_leases(req(
        &alice2,
        ListLeasesRequest {
            parent: "namespaces/default".into(),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    let rotated_ex = admin
        .rotate_exporter(admin_req(&token, obj("rpi-1")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rotated_ex.name, "rpi-1");

    // Deleting the exporter ends its lease and its Status stream.
    admin
        .delete_exporter(admin_req(&token, obj("rpi-1")))
        .await
        .unwrap();
    let ended = wait_lease(&ch, &alice, &lease.name, |l| {
        condition(l, "Ready").is_some_and(|(s, _)| s == "False")
    })
    .await;
    assert_eq!(condition(&ended, "Ready").unwrap().1, "Released");
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match status.next().await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Some(e),
                None => return None,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(end.map(|e| e.code()), Some(Code::NotFound));
    // Its token is worthless now.
    let e = ControllerServiceClient::new(ch.clone())
        .register(req(&ex, RegisterRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = admin
        .get_exporter(admin_req(&token, obj("rpi-1")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("rpi-1"), "{}", e.message());
    lab.ctl.shutdown().await;
}

#[tokio::test]
async fn deleting_a_client_releases_its_leases() {
    let lab = lab().await;
    let token = lab.ctl.admin_token.clone();
    let ch = lab.channel().await;
    let mut admin = lab.admin().await;
    let alice = identity(
        ObjectKind::Client,
        &create_client(&mut admin, &token, "alice", &[])
            .await
            .unwrap(),
    );
    let ex = identity(
        ObjectKind::Exporter,
        &create_exporter(&mut admin, &token, "ex", &[("k", "v")])
            .await
            .unwrap(),
    );
    let mut status = bring_online(&ch, &ex).await;
    let active = create_lease(&ch, &alice, "k=v").await;
    wait_lease(&ch, &alice, &active.name, is_ready).await;
    let pending = create_lease(&ch, &alice, "k=v").await;

    admin
        .delete_client(admin_req(&token, obj("alice")))
        .await
        .unwrap();
    // Both leases end; the exporter is free again.
    let store = &lab.ctl.state.store;
    for l in [&active, &pending] {
        let name = l.name.rsplit('/').next().unwrap();
        let mut ended = false;
        for _ in 0..100 {
            let obj: LeaseObject = store.get("default", name).await.unwrap().unwrap();
            if obj.is_ended() {
                ended = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ended, "lease {name} did not end");
    }
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
    assert!(!freed.leased);
    let e = ClientServiceClient::new(ch.clone())
        .list_leases(req(
            &alice,
            ListLeasesRequest {
                parent: "namespaces/default".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    lab.ctl.shutdown().await;
}

#[tokio::test]
async fn only_the_admin_token_is_accepted() {
    let lab = lab().await;
    let token = lab.ctl.admin_token.clone();
    let mut admin = lab.admin().await;
    let c = create_client(&mut admin, &token, "alice", &[])
        .await
        .unwrap();
    let e = create_exporter(&mut admin, &token, "ex", &[])
        .await
        .unwrap();

    let e1 = admin
        .list_clients(tonic::Request::new(ListRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(e1.code(), Code::Unauthenticated);
    for wrong in [
        "garbage".to_string(),
        format!("{token}x"),
        token[..token.len() - 1].to_string(),
    ] {
        let e = create_client(&mut admin, &wrong, "mallory", &[])
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{wrong}");
    }
    for t in [&c.token, &e.token] {
        let err = create_client(&mut admin, t, "mallory", &[])
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied);
        let err = admin
            .delete_client(admin_req(t, obj("alice")))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied);
    }
    let clients = admin
        .list_clients(admin_req(&token, ListRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .clients;
    let names: Vec<_> = clients.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["alice"]);
    lab.ctl.shutdown().await;
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let lab = lab().await;
    let token = lab.ctl.admin_token.clone();
    let mut admin = lab.admin().await;
    create_client(&mut admin, &token, "alice", &[])
        .await
        .unwrap();
    create_exporter(&mut admin, &token, "ex", &[])
        .await
        .unwrap();

    for (name, l, field) in [
        ("", vec![], "name"),
        ("Alice", vec![], "name"),
        ("a_b", vec![], "name"),
        ("ok", vec![("bad key", "v")], "label key"),
        ("ok", vec![("k", "bad value!")], "label"),
    ] {
        let e = create_client(&mut admin, &token, name, &l)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{name} {l:?}");
        assert!(e.message().contains("client"), "{}", e.message());
        assert!(e.message().contains(field), "{}", e.message());
        let e = create_exporter(&mut admin, &token, name, &l)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{name} {l:?}");
        assert!(e.message().contains("exporter"), "{}", e.message());
    }
    let e = create_exporter(&mut admin, &token, "ok", &[("jumpstarter.dev/name", "x")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = admin
        .create_client(admin_req(&token, CreateClientRequest { client: None }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let mut bad_ns = obj("alice");
    bad_ns.namespace = "Bad.NS".into();
    let e = admin
        .get_client(admin_req(&token, bad_ns))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("namespace"), "{}", e.message());

    // Duplicates.
    let e = create_client(&mut admin, &token, "alice", &[])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    assert!(e.message().contains("alice"), "{}", e.message());
    let e = create_exporter(&mut admin, &token, "ex", &[])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);

    // Malformed selectors.
    for sel in ["a in (b", "==x", "a=b c"] {
        let e = admin
            .list_exporters(admin_req(
                &token,
                ListRequest {
                    namespace: String::new(),
                    selector: sel.into(),
                },
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{sel}");
        assert!(e.message().contains("selector"), "{}", e.message());
    }
    let policy = |sel: &str, from: &str| AccessPolicy {
        namespace: String::new(),
        name: "lab".into(),
        exporter_selector: sel.into(),
        rules: vec![AccessRule {
            from_client_selectors: vec![from.into()],
            priority: 5,
            ..Default::default()
        }],
    };
    for (sel, from, field) in [
        ("a in (b", "team=ci", "exporter_selector"),
        ("board=x", "team in (", "rules[0].from_client_selectors[0]"),
    ] {
        let e = admin
            .create_access_policy(admin_req(&token, policy(sel, from)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains(field), "{}", e.message());
    }

    // Unknown objects.
    for e in [
        admin
            .get_client(admin_req(&token, obj("bob")))
            .await
            .unwrap_err(),
        admin
            .delete_client(admin_req(&token, obj("bob")))
            .await
            .unwrap_err(),
        admin
            .rotate_exporter(admin_req(&token, obj("nope")))
            .await
            .unwrap_err(),
        admin
            .delete_access_policy(admin_req(&token, obj("nope")))
            .await
            .unwrap_err(),
    ] {
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
    }

    // State unchanged.
    let clients = admin
        .list_clients(admin_req(&token, ListRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .clients;
    assert_eq!(clients.len(), 1);
    let exporters = admin
        .list_exporters(admin_req(&token, ListRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .exporters;
    assert_eq!(exporters.len(), 1);
    let policies = admin
        .list_access_policies(admin_req(&token, ListRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .policies;
    assert!(policies.is_empty());

    // A good policy round-trips and can be deleted.
    let created = admin
        .create_access_policy(admin_req(&token, policy("board=x", "team=ci")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.namespace, "default");
    assert_eq!(created.rules[0].from_client_selectors, ["team=ci"]);
    let got = admin
        .get_access_policy(admin_req(&token, obj("lab")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got, created);
    let e = admin
        .create_access_policy(admin_req(&token, policy("board=x", "team=ci")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    admin
        .delete_access_policy(admin_req(&token, obj("lab")))
        .await
        .unwrap();
    lab.ctl.shutdown().await;
}

#[tokio::test]
async fn admin_config_is_written_private_with_ca_and_token() {
    let lab = lab().await;
    let path = lab.dir.path().join("config/admin.yaml");
    assert_eq!(lab.ctl.admin_config.as_deref(), Some(path.as_path()));
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let cfg = AdminConfig::load(&path).unwrap();
    assert_eq!(cfg.endpoint, lab.ctl.endpoint);
    assert_eq!(cfg.token, lab.ctl.admin_token);
    assert_eq!(
        cfg.ca_pem().unwrap().as_deref(),
        Some(lab.ctl.ca_pem.as_str())
    );
    assert!(!cfg.tls.insecure);
    // The admin token file in the data directory is private too.
    let token_file = lab.dir.path().join("data/admin-token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // The config is enough to reach the admin API.
    let ch = connect_channel(
        &cfg.endpoint,
        &ConnectOptions {
            insecure: false,
            passphrase: None,
            ca_pem: cfg.ca_pem().unwrap().map(String::into_bytes),
        },
    )
    .await
    .unwrap();
    AdminServiceClient::new(ch)
        .list_clients(admin_req(&cfg.token, ListRequest::default()))
        .await
        .unwrap();
    lab.ctl.shutdown().await;
}

#[tokio::test]
async fn health_serving_and_reflection_lists_services() {
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let lab = lab().await;
    let ch = lab.channel().await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    for service in [
        "",
        "jumpstarter.v1.ControllerService",
        "jumpstarter.client.v1.ClientService",
        "jumpstarter.admin.v1.AdminService",
    ] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }
    let e = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    let mut refl = ServerReflectionClient::new(ch);
    let outbound = futures::stream::iter([ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    }]);
    let mut inbound = refl
        .server_reflection_info(outbound)
        .await
        .unwrap()
        .into_inner();
    let resp = inbound.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("unexpected reflection response {resp:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for s in [
        "jumpstarter.v1.ControllerService",
        "jumpstarter.client.v1.ClientService",
        "jumpstarter.admin.v1.AdminService",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(&s), "{s} missing from {names:?}");
    }
    lab.ctl.shutdown().await;
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut s = String::new();
    c.read_to_string(&mut s).await.unwrap();
    s
}

#[tokio::test]
async fn metrics_endpoint_returns_the_families() {
    let lab = lab().await;
    let token = lab.ctl.admin_token.clone();
    let ch = lab.channel().await;
    let mut admin = lab.admin().await;
    let alice = identity(
        ObjectKind::Client,
        &create_client(&mut admin, &token, "alice", &[])
            .await
            .unwrap(),
    );
    let ex = identity(
        ObjectKind::Exporter,
        &create_exporter(&mut admin, &token, "ex", &[("k", "v")])
            .await
            .unwrap(),
    );
    let _status = bring_online(&ch, &ex).await;
    let active = create_lease(&ch, &alice, "k=v").await;
    wait_lease(&ch, &alice, &active.name, is_ready).await;
    create_lease(&ch, &alice, "k=v").await;
    // The Online condition is written by the reconcile loop.
    let addr = lab.ctl.metrics_addr.unwrap();
    let mut text = String::new();
    for _ in 0..50 {
        text = http_get(addr, "/metrics").await;
        if text.contains("jumpstarter_controller_exporters_online 1\n") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    for line in [
        "jumpstarter_controller_leases{state=\"pending\"} 1\n",
        "jumpstarter_controller_leases{state=\"ready\"} 1\n",
        "jumpstarter_controller_leases{state=\"ended\"} 0\n",
        "jumpstarter_controller_exporters 1\n",
        "jumpstarter_controller_exporters_online 1\n",
        "jumpstarter_controller_exporters_registered 1\n",
        "jumpstarter_controller_rpc_duration_seconds_count{method=\"/jumpstarter.admin.v1.AdminService/CreateClient\"} 1\n",
        "# TYPE jumpstarter_controller_rpc_duration_seconds histogram\n",
        "# TYPE jumpstarter_router_active_tunnels gauge\n",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    let nf = http_get(addr, "/other").await;
    assert!(nf.starts_with("HTTP/1.1 404"), "{nf}");
    lab.ctl.shutdown().await;
}

#[tokio::test]
async fn own_certificate_is_served_and_configs_carry_only_the_given_ca() {
    use jumpstarter_core::auth::CertificateAuthority;
    let dir = tempfile::tempdir().unwrap();
    let other_ca = CertificateAuthority::generate("someone else's CA").unwrap();
    let cert = other_ca
        .issue_server_cert(&["localhost", "127.0.0.1"])
        .unwrap();
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    cert.save(&cert_path, &key_path).unwrap();
    let ca_path = dir.path().join("ca.crt");
    std::fs::write(&ca_path, other_ca.cert_pem()).unwrap();

    // Without --tls-ca: no CA in the configs.
    let admin_path = dir.path().join("admin.yaml");
    let ctl = start(ControllerConfig {
        admin_config: Some(admin_path.clone()),
        tls_cert: Some(cert_path.clone()),
        tls_key: Some(key_path.clone()),
        ..ControllerConfig::loopback(dir.path().join("data"))
    })
    .await
    .unwrap();
    assert_eq!(ctl.ca_pem, "");
    assert_eq!(
        AdminConfig::load(&admin_path).unwrap().ca_pem().unwrap(),
        None
    );
    // The served certificate is ours: the given CA verifies it, the controller's own does not.
    let opts = |ca: &str| ConnectOptions {
        insecure: false,
        passphrase: None,
        ca_pem: Some(ca.as_bytes().to_vec()),
    };
    let endpoint = format!("localhost:{}", ctl.addr.port());
    let ch = connect_channel(&endpoint, &opts(other_ca.cert_pem()))
        .await
        .unwrap();
    let c = create_client(
        &mut AdminServiceClient::new(ch),
        &ctl.admin_token,
        "alice",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(c.ca_pem, "");
    let own_ca = std::fs::read_to_string(
        dir.path()
            .join("data/ca")
            .join(jumpstarter_core::auth::CA_CERT_FILE),
    )
    .unwrap();
    let refused = match connect_channel(&endpoint, &opts(&own_ca)).await {
        Err(_) => true,
        Ok(ch) => AdminServiceClient::new(ch)
            .list_clients(admin_req(&ctl.admin_token, ListRequest::default()))
            .await
            .is_err(),
    };
    assert!(
        refused,
        "the controller's own CA must not verify the given cert"
    );
    ctl.shutdown().await;

    // With --tls-ca: that CA is handed out.
    let ctl = start(ControllerConfig {
        admin_config: Some(admin_path.clone()),
        tls_cert: Some(cert_path.clone()),
        tls_key: Some(key_path.clone()),
        tls_ca: Some(ca_path.clone()),
        ..ControllerConfig::loopback(dir.path().join("data"))
    })
    .await
    .unwrap();
    assert_eq!(ctl.ca_pem, other_ca.cert_pem());
    assert_eq!(
        AdminConfig::load(&admin_path)
            .unwrap()
            .ca_pem()
            .unwrap()
            .as_deref(),
        Some(other_ca.cert_pem())
    );
    ctl.shutdown().await;

    // Bad settings are refused with the file or flag named.
    for (cert, key, ca, what) in [
        (Some(cert_path.clone()), None, None, "--tls-key"),
        (None, Some(key_path.clone()), None, "--tls-cert"),
        (None, None, Some(ca_path.clone()), "--tls-ca"),
        (
            Some(dir.path().join("missing.crt")),
            Some(key_path.clone()),
            None,
            "missing.crt",
        ),
    ] {
        let e = start(ControllerConfig {
            tls_cert: cert,
            tls_key: key,
            tls_ca: ca,
            ..ControllerConfig::loopback(dir.path().join("data"))
        })
        .await
        .err()
        .map(|e| jumpstarter_core::error_chain(&e))
        .unwrap();
        assert!(e.contains(what), "{what}: {e}");
    }
}

#[tokio::test]
async fn server_certificate_is_kept_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cert_file = data.join("server/tls.crt");
    let served = || std::fs::read_to_string(&cert_file).unwrap();
    let ctl = start(ControllerConfig::loopback(data.clone()))
        .await
        .unwrap();
    let first = served();
    let key_mode = std::fs::metadata(data.join("server/tls.key"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(key_mode, 0o600);
    ctl.shutdown().await;

    let ctl = start(ControllerConfig::loopback(data.clone()))
        .await
        .unwrap();
    assert_eq!(
        served(),
        first,
        "same SANs and CA: the certificate is reused"
    );
    // And it is what the listener presents: clients trusting the CA still connect.
    let ch = connect_channel(
        &format!("localhost:{}", ctl.addr.port()),
        &ConnectOptions {
            insecure: false,
            passphrase: None,
            ca_pem: Some(ctl.ca_pem.clone().into_bytes()),
        },
    )
    .await
    .unwrap();
    AdminServiceClient::new(ch)
        .list_clients(admin_req(&ctl.admin_token, ListRequest::default()))
        .await
        .unwrap();
    ctl.shutdown().await;

    let ctl = start(ControllerConfig {
        advertise_host: "lab.example".into(),
        ..ControllerConfig::loopback(data.clone())
    })
    .await
    .unwrap();
    assert_ne!(
        served(),
        first,
        "a new endpoint name needs a new certificate"
    );
    ctl.shutdown().await;
}

/// `authentication.internal.tokenLifetime` of the ConfigMap: the tokens issued from then on
/// expire after it (the default is a year).
#[tokio::test]
async fn issued_tokens_live_as_long_as_the_configured_lifetime() {
    let exp_in = |token: &str| {
        let claims = jumpstarter_core::oidc::unverified_claims(token).unwrap();
        let exp = claims["exp"].as_i64().unwrap();
        exp - jiff::Timestamp::now().as_second()
    };
    let short = crate::lab_configured(|c| c.token_lifetime = Some(Duration::from_secs(3600))).await;
    let token = short.ctl.admin_token.clone();
    let c = create_client(&mut short.admin().await, &token, "short", &[])
        .await
        .unwrap();
    assert!(
        (3590..=3600).contains(&exp_in(&c.token)),
        "{}",
        exp_in(&c.token)
    );
    let default = lab().await;
    let token = default.ctl.admin_token.clone();
    let c = create_client(&mut default.admin().await, &token, "long", &[])
        .await
        .unwrap();
    let year = 365 * 24 * 3600;
    assert!((year - 10..=year).contains(&exp_in(&c.token)));
}

#[tokio::test]
async fn a_stopping_controller_ends_an_exporters_status_stream_cleanly() {
    let lab = lab().await;
    let token = lab.ctl.admin_token.clone();
    let ch = lab.channel().await;
    let mut admin = lab.admin().await;
    let e = create_exporter(&mut admin, &token, "rpi-1", &[("board", "rpi4")])
        .await
        .unwrap();
    let ex = identity(ObjectKind::Exporter, &e);
    let mut status = bring_online(&ch, &ex).await;
    let stopping = tokio::spawn(lab.ctl.shutdown());
    // The stream ends as a stream ends (no error): the controller does not hold it until its
    // shutdown gives up waiting and cuts the connection.
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match status.next().await {
                Some(Ok(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .unwrap();
    assert!(end.is_none(), "the Status stream was cut: {end:?}");
    stopping.await.unwrap();
}
