//! Prometheus metrics: RPC latencies (a tower layer on the gRPC server), leases by state and
//! exporters online/registered (read from the store at scrape time), and the in-process
//! router's counters, served as text on a small HTTP/1.1 listener (`GET /metrics`, core's
//! `server::http1::serve_metrics`).

use std::{
    collections::HashMap,
    fmt::Write as _,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use crate::{
    objects::{Client, Exporter, Lease, conditions, selector::LabelSelector},
    state::ControllerState,
    store::{ListParams, Store},
};
use jumpstarter_core::sync::LockExt;

/// Upper bounds (seconds) of the RPC latency histogram buckets.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
/// The `method` label of every path that is not a method the controller serves: a caller
/// inventing paths (even unauthenticated) adds at most this one label.
pub const UNKNOWN_METHOD: &str = "unknown";
/// Methods served beside the Jumpstarter and admin services (health, reflection).
const OTHER_METHODS: [&str; 4] = [
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// Every gRPC path the controller serves (`/package.Service/Method`), from the compiled
/// descriptor sets.
fn known_methods() -> &'static std::collections::HashSet<String> {
    static KNOWN: std::sync::OnceLock<std::collections::HashSet<String>> =
        std::sync::OnceLock::new();
    KNOWN.get_or_init(|| {
        use prost::Message as _;
        let mut out: std::collections::HashSet<String> =
            OTHER_METHODS.iter().map(|m| m.to_string()).collect();
        for set in [
            jumpstarter_proto::FILE_DESCRIPTOR_SET,
            jumpstarter_proto::ADMIN_DESCRIPTOR_SET,
        ] {
            // Compiled into the binary; a set that does not decode only makes its methods
            // count as unknown.
            let Ok(fds) = prost_types::FileDescriptorSet::decode(set) else {
                continue;
            };
            for file in &fds.file {
                for service in &file.service {
                    for method in &service.method {
                        out.insert(format!(
                            "/{}.{}/{}",
                            file.package(),
                            service.name(),
                            method.name()
                        ));
                    }
                }
            }
        }
        out
    })
}

/// The `method` label for request path `path`: the path when the controller serves it, else
/// [`UNKNOWN_METHOD`].
pub fn method_label(path: &str) -> &str {
    if known_methods().contains(path) {
        path
    } else {
        UNKNOWN_METHOD
    }
}

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// Latency histograms of the controller's RPCs, by gRPC method path.
#[derive(Debug, Default)]
pub struct RpcMetrics {
    methods: Mutex<HashMap<String, Histogram>>,
}

impl RpcMetrics {
    /// Records one call of `method` (a request path; unknown ones are counted together as
    /// [`UNKNOWN_METHOD`]) that took `elapsed`.
    pub fn observe(&self, method: &str, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let mut m = self.methods.lock_or_recover();
        let key = method_label(method);
        let h = m.entry(key.to_string()).or_default();
        for (i, le) in BUCKETS.iter().enumerate() {
            if secs <= *le {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += secs;
    }

    /// Prometheus text of the histograms.
    pub fn prometheus(&self) -> String {
        let m = self.methods.lock_or_recover().clone();
        let mut methods: Vec<_> = m.into_iter().collect();
        methods.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = String::from(
            "# HELP jumpstarter_controller_rpc_duration_seconds Time from request to response \
             headers (for streams: until the stream is open), by gRPC method.\n\
             # TYPE jumpstarter_controller_rpc_duration_seconds histogram\n",
        );
        for (method, h) in methods {
            let method = escape_label(&method);
            for (i, le) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "jumpstarter_controller_rpc_duration_seconds_bucket{{method=\"{method}\",le=\"{le}\"}} {}",
                    h.counts[i]
                );
            }
            let _ = writeln!(
                out,
                "jumpstarter_controller_rpc_duration_seconds_bucket{{method=\"{method}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "jumpstarter_controller_rpc_duration_seconds_sum{{method=\"{method}\"}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "jumpstarter_controller_rpc_duration_seconds_count{{method=\"{method}\"}} {}",
                h.count
            );
        }
        out
    }
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Tower layer timing every request into [`RpcMetrics`].
#[derive(Debug, Clone)]
pub struct RpcMetricsLayer(pub Arc<RpcMetrics>);

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcTimer<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RpcTimer {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// The service [`RpcMetricsLayer`] wraps around the gRPC routes.
#[derive(Debug, Clone)]
pub struct RpcTimer<S> {
    inner: S,
    metrics: Arc<RpcMetrics>,
}

impl<S, B> tower::Service<tonic::codegen::http::Request<B>> for RpcTimer<S>
where
    S: tower::Service<tonic::codegen::http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        let method = req.uri().path().to_string();
        let metrics = self.metrics.clone();
        let start = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            metrics.observe(&method, start.elapsed());
            r
        })
    }
}

/// Leases and exporters by state, read from the store now.
pub async fn object_metrics<S: Store>(state: &ControllerState<S>) -> String {
    let mut out = String::new();
    let all = LabelSelector::everything();
    let params = ListParams::default();
    match state.store.list::<Lease>(None, &all, &params).await {
        Ok(list) => {
            let (mut pending, mut ready, mut ended) = (0u64, 0u64, 0u64);
            for l in &list.items {
                if l.is_ended() {
                    ended += 1;
                } else if l.assigned_exporter().is_some() {
                    ready += 1;
                } else {
                    pending += 1;
                }
            }
            out.push_str(
                "# HELP jumpstarter_controller_leases Leases by state.\n\
                 # TYPE jumpstarter_controller_leases gauge\n",
            );
            for (s, n) in [("pending", pending), ("ready", ready), ("ended", ended)] {
                let _ = writeln!(out, "jumpstarter_controller_leases{{state=\"{s}\"}} {n}");
            }
        }
        Err(e) => tracing::warn!(
            "metrics: cannot list leases: {e}",
            e = jumpstarter_core::error_chain(&e)
        ),
    }
    match state.store.list::<Exporter>(None, &all, &params).await {
        Ok(list) => {
            let online = list
                .items
                .iter()
                .filter(|e| e.condition_is_true(conditions::ONLINE))
                .count();
            let registered = list
                .items
                .iter()
                .filter(|e| e.condition_is_true(conditions::REGISTERED))
                .count();
            let _ = write!(
                out,
                "# HELP jumpstarter_controller_exporters Exporters known to the controller.\n\
                 # TYPE jumpstarter_controller_exporters gauge\n\
                 jumpstarter_controller_exporters {}\n\
                 # HELP jumpstarter_controller_exporters_online Exporters whose Online condition is True.\n\
                 # TYPE jumpstarter_controller_exporters_online gauge\n\
                 jumpstarter_controller_exporters_online {online}\n\
                 # HELP jumpstarter_controller_exporters_registered Exporters whose Registered condition is True.\n\
                 # TYPE jumpstarter_controller_exporters_registered gauge\n\
                 jumpstarter_controller_exporters_registered {registered}\n",
                list.items.len()
            );
        }
        Err(e) => tracing::warn!(
            "metrics: cannot list exporters: {e}",
            e = jumpstarter_core::error_chain(&e)
        ),
    }
    match state.store.list::<Client>(None, &all, &params).await {
        Ok(list) => out.push_str(&client_token_metrics(&list.items)),
        Err(e) => tracing::warn!(
            "metrics: cannot list clients: {e}",
            e = jumpstarter_core::error_chain(&e)
        ),
    }
    let _ = write!(
        out,
        "# HELP jumpstarter_controller_exporter_cache_lists_total Times the exporter cache \
         listed every exporter: once at start, again each time it fell behind the store's \
         watch.\n\
         # TYPE jumpstarter_controller_exporter_cache_lists_total counter\n\
         jumpstarter_controller_exporter_cache_lists_total {}\n",
        state.exporters.lists()
    );
    let events = state.exporters.event_recorder();
    if events.is_enabled() {
        let _ = write!(
            out,
            "# HELP jumpstarter_controller_events_dropped_total Kubernetes Events about exporters \
             dropped because the queue to the API server was full.\n\
             # TYPE jumpstarter_controller_events_dropped_total counter\n\
             jumpstarter_controller_events_dropped_total {}\n",
            events.dropped()
        );
    }
    if let Some(n) = state.store.commits() {
        let _ = write!(
            out,
            "# HELP jumpstarter_controller_store_commits_total Store transactions that changed \
             something (one disk sync each with the embedded store).\n\
             # TYPE jumpstarter_controller_store_commits_total counter\n\
             jumpstarter_controller_store_commits_total {n}\n"
        );
    }
    out
}

/// Each client's token expiry (upstream main's `tokenExpiresAt`, as a Unix time) and how
/// many clients' `TokenExpiring` condition is true, by reason.
fn client_token_metrics(clients: &[Client]) -> String {
    let mut out = String::from(
        "# HELP jumpstarter_controller_client_token_expiry_timestamp_seconds When the token \
         the controller last issued to the client expires (Unix time).\n\
         # TYPE jumpstarter_controller_client_token_expiry_timestamp_seconds gauge\n",
    );
    let mut expiring: std::collections::BTreeMap<String, u64> =
        ["Expired", "ExpiresWithin7Days", "ExpiresWithin30Days"]
            .into_iter()
            .map(|r| (r.to_string(), 0))
            .collect();
    for c in clients {
        let Some(status) = &c.status else { continue };
        let Some(at) = &status.token_expires_at else {
            continue;
        };
        let _ = writeln!(
            out,
            "jumpstarter_controller_client_token_expiry_timestamp_seconds{{namespace=\"{}\",name=\"{}\"}} {}",
            escape_label(c.metadata.namespace.as_deref().unwrap_or_default()),
            escape_label(c.metadata.name.as_deref().unwrap_or_default()),
            at.0.as_second()
        );
        if let Some(cond) =
            crate::objects::find_condition(&status.conditions, crate::objects::TOKEN_EXPIRING)
            && cond.status == conditions::TRUE
        {
            *expiring.entry(cond.reason.clone()).or_default() += 1;
        }
    }
    out.push_str(
        "# HELP jumpstarter_controller_clients_token_expiring Clients whose TokenExpiring \
         condition is True, by reason.\n\
         # TYPE jumpstarter_controller_clients_token_expiring gauge\n",
    );
    for (reason, n) in expiring {
        let _ = writeln!(
            out,
            "jumpstarter_controller_clients_token_expiring{{reason=\"{}\"}} {n}",
            escape_label(&reason)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_over<S: Store>(store: S) -> std::sync::Arc<ControllerState<S>> {
        let issuer = std::sync::Arc::new(crate::auth::TokenIssuer::generate().unwrap());
        let (router_key, _) = jumpstarter_router::RouterTokenKey::generate().unwrap();
        ControllerState::new(store, issuer, router_key, vec![], "localhost:1".into())
    }

    /// With the Kubernetes store the dropped exporter events are counted in the metrics;
    /// the embedded store records no events, so it has no such line.
    #[cfg(feature = "kubernetes")]
    #[tokio::test]
    async fn dropped_exporter_events_are_a_metric_where_events_are_recorded() {
        let api = crate::testing::FakeApiServer::new();
        let kube = state_over(crate::store::KubeStore::new(api.client()));
        let text = object_metrics(&kube).await;
        assert!(
            text.contains("\njumpstarter_controller_events_dropped_total 0\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE jumpstarter_controller_events_dropped_total counter"));
        let dir = tempfile::tempdir().unwrap();
        let sqlite = state_over(crate::store::SqliteStore::open(dir.path()).await.unwrap());
        let text = object_metrics(&sqlite).await;
        assert!(!text.contains("events_dropped"), "{text}");
    }

    #[test]
    fn histogram_counts_cumulatively() {
        let m = RpcMetrics::default();
        m.observe(
            "/jumpstarter.v1.ControllerService/Dial",
            Duration::from_millis(3),
        );
        m.observe(
            "/jumpstarter.v1.ControllerService/Dial",
            Duration::from_secs(20),
        );
        let text = m.prometheus();
        assert!(text.contains(
            "jumpstarter_controller_rpc_duration_seconds_bucket{method=\"/jumpstarter.v1.ControllerService/Dial\",le=\"0.005\"} 1"
        ));
        assert!(text.contains(
            "jumpstarter_controller_rpc_duration_seconds_bucket{method=\"/jumpstarter.v1.ControllerService/Dial\",le=\"10\"} 1"
        ));
        assert!(text.contains(
            "jumpstarter_controller_rpc_duration_seconds_bucket{method=\"/jumpstarter.v1.ControllerService/Dial\",le=\"+Inf\"} 2"
        ));
        assert!(
            text.contains("jumpstarter_controller_rpc_duration_seconds_count{method=\"/jumpstarter.v1.ControllerService/Dial\"} 2")
        );
    }

    #[test]
    fn method_labels_are_bounded_and_escaped() {
        let m = RpcMetrics::default();
        for i in 0..500 {
            m.observe(&format!("/x/{i}"), Duration::from_millis(1));
        }
        m.observe("/x/\"q", Duration::from_millis(1));
        let real = "/jumpstarter.client.v1.ClientService/ListExporters";
        m.observe(real, Duration::from_millis(1));
        m.observe(
            "/jumpstarter.admin.v1.AdminService/CreateClient",
            Duration::from_millis(1),
        );
        m.observe("/grpc.health.v1.Health/Check", Duration::from_millis(1));
        m.observe(
            "/jumpstarter.v1.ControllerService/Register",
            Duration::from_millis(1),
        );
        let text = m.prometheus();
        assert!(
            text.contains(
                "jumpstarter_controller_rpc_duration_seconds_count{method=\"unknown\"} 501"
            ),
            "{text}"
        );
        // Junk paths took one slot; the real methods are still counted under their names.
        assert!(
            text.contains(&format!(
                "jumpstarter_controller_rpc_duration_seconds_count{{method=\"{real}\"}} 1"
            )),
            "{text}"
        );
        let methods = m.methods.lock().unwrap().len();
        assert_eq!(methods, 5);
        assert!(!text.contains("/x/"));
    }
}
