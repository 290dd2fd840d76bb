//! Controller scale benchmark (driven by `cargo xtask bench`).
//!
//! `bench_scale ADMIN_CONFIG EXPORTERS LEASES [NAMESPACE]`: creates EXPORTERS exporters and one
//! client in NAMESPACE (default `default`) through the AdminService, registers every exporter and holds its `Status` stream (100
//! streams per HTTP/2 connection), then grants LEASES leases one after another, each on a
//! free exporter chosen by label, and measures the time from `CreateLease` to the leased
//! message on that exporter's Status stream. Prints one JSON line of figures.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt, stream};
use jumpstarter_core::{
    client::channel::{
        AuthChannel, ControllerAuth, GrpcChannel, TlsSettings, connect_authenticated, connect_tls,
    },
    config::AdminConfig,
};
use jumpstarter_proto::{
    admin_v1::{
        self, CreateClientRequest, CreateExporterRequest, admin_service_client::AdminServiceClient,
    },
    client_v1::{
        CreateLeaseRequest, DeleteLeaseRequest, Lease, client_service_client::ClientServiceClient,
    },
    v1::{
        DriverInstanceReport, RegisterRequest, ReportStatusRequest, StatusRequest,
        controller_service_client::ControllerServiceClient,
    },
};
use tokio::sync::oneshot;
use tonic::service::interceptor::InterceptedService;

type Waiters = Arc<Mutex<HashMap<String, oneshot::Sender<Instant>>>>;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let admin_path = args.first().expect("ADMIN_CONFIG");
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let leases: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(200);
    let ns: String = args.get(3).cloned().unwrap_or_else(|| "default".into());

    let admin_cfg = AdminConfig::load(std::path::Path::new(admin_path)).expect("admin config");
    let tls = TlsSettings {
        ca_pem: admin_cfg.ca_pem().expect("ca"),
        insecure: false,
    };
    let endpoint = admin_cfg.endpoint.clone();
    let admin_channel =
        connect_authenticated(&endpoint, &tls, &ControllerAuth::bearer(&admin_cfg.token))
            .await
            .expect("connect admin");
    let admin = AdminServiceClient::new(admin_channel);

    // One client.
    let client_creds = admin
        .clone()
        .create_client(CreateClientRequest {
            client: Some(admin_v1::Client {
                namespace: ns.clone(),
                name: "bench-client".into(),
                ..Default::default()
            }),
        })
        .await
        .expect("create client")
        .into_inner()
        .credentials
        .expect("credentials");

    // N exporters.
    let t0 = Instant::now();
    let tokens: Vec<(usize, String)> = stream::iter(0..n)
        .map(|i| {
            let mut admin = admin.clone();
            let ns = ns.clone();
            async move {
                let r = admin
                    .create_exporter(CreateExporterRequest {
                        exporter: Some(admin_v1::Exporter {
                            namespace: ns,
                            name: format!("bench-{i}"),
                            labels: [("bench-id".to_string(), i.to_string())].into(),
                            ..Default::default()
                        }),
                    })
                    .await?;
                let token = r
                    .into_inner()
                    .credentials
                    .map(|c| c.token)
                    .unwrap_or_default();
                Ok::<_, tonic::Status>((i, token))
            }
        })
        .buffer_unordered(32)
        .try_collect()
        .await
        .expect("create exporters");
    let create_secs = t0.elapsed().as_secs_f64();

    // Register them all and hold their Status streams.
    let waiters: Waiters = Arc::default();
    let t1 = Instant::now();
    let mut channels: Vec<GrpcChannel> = Vec::new();
    for _ in 0..n.div_ceil(100) {
        channels.push(connect_tls(&endpoint, &tls).await.expect("connect"));
    }
    let channels = Arc::new(channels);
    stream::iter(tokens)
        .map(|(i, token)| {
            let channels = channels.clone();
            let waiters = waiters.clone();
            let ns = ns.clone();
            async move {
                let auth = ControllerAuth::exporter(&ns, &format!("bench-{i}"), &token);
                let md = auth.call_metadata("controller").expect("metadata");
                let channel: AuthChannel = InterceptedService::new(channels[i / 100].clone(), md);
                let mut ctl = ControllerServiceClient::new(channel);
                ctl.register(RegisterRequest {
                    labels: Default::default(),
                    reports: vec![DriverInstanceReport {
                        uuid: uuid::Uuid::new_v4().to_string(),
                        ..Default::default()
                    }],
                })
                .await?;
                ctl.report_status(ReportStatusRequest {
                    status: 1,
                    message: None,
                    release_lease: None,
                })
                .await?;
                let mut status = ctl.status(StatusRequest {}).await?.into_inner();
                tokio::spawn(async move {
                    while let Some(Ok(msg)) = status.next().await {
                        if msg.leased
                            && let Some(name) = msg.lease_name
                            && let Some(tx) = waiters.lock().unwrap().remove(&name)
                        {
                            let _ = tx.send(Instant::now());
                        }
                    }
                });
                Ok::<_, tonic::Status>(())
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await
        .expect("register exporters");
    let register_secs = t1.elapsed().as_secs_f64();

    // Leases, one at a time, each on a free exporter.
    let client_channel = connect_authenticated(
        &endpoint,
        &tls,
        &ControllerAuth::client(&ns, "bench-client", &client_creds.token),
    )
    .await
    .expect("connect client");
    let mut client = ClientServiceClient::new(client_channel);
    let mut grants = Vec::with_capacity(leases);
    for k in 0..leases {
        let target = (k * 7919) % n;
        let name = uuid::Uuid::now_v7().to_string();
        let (tx, rx) = oneshot::channel();
        waiters.lock().unwrap().insert(name.clone(), tx);
        let start = Instant::now();
        client
            .create_lease(CreateLeaseRequest {
                parent: format!("namespaces/{ns}"),
                lease_id: name.clone(),
                lease: Some(Lease {
                    selector: format!("bench-id={target}"),
                    duration: Some(prost_types::Duration {
                        seconds: 600,
                        nanos: 0,
                    }),
                    ..Default::default()
                }),
            })
            .await
            .expect("create lease");
        let at = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .expect("lease granted within 30 s")
            .expect("status stream");
        grants.push(at.duration_since(start).as_secs_f64() * 1000.0);
        client
            .delete_lease(DeleteLeaseRequest {
                name: format!("namespaces/{ns}/leases/{name}"),
            })
            .await
            .expect("delete lease");
    }
    grants.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{{\"exporters\": {n}, \"leases\": {leases}, \"create_secs\": {create_secs:.2}, \
         \"register_secs\": {register_secs:.2}, \"grant_p50_ms\": {:.2}, \"grant_p99_ms\": {:.2}}}",
        percentile(&grants, 0.5),
        percentile(&grants, 0.99)
    );
}
