//! Prometheus metrics: RPC latencies (a tower layer on the gRPC server), leases by state and
//! exporters online/registered (read from the store at scrape time), and the in-process
//! router's counters, served as text on a small HTTP/1.1 listener (`GET /metrics`, core's
//! `server::http1::serve_metrics`).

use std::{
    collections::HashMap,
    fmt::Write as _,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use crate::{
    objects::{Client, Exporter, Lease, conditions, selector::LabelSelector},
    state::ControllerState,
    store::{ListParams, Store},
};
use jumpstarter_core::metrics::{
    ExemplarLabels,
    prometheus_client::{
        self,
        metrics::{
            exemplar::{CounterWithExemplar, HistogramWithExemplars},
            family::Family,
            gauge::Gauge,
            histogram::Histogram,
        },
    },
};

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

type MethodFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn rpc_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// Latency histograms of the controller's RPCs, by gRPC method path.
pub struct RpcMetrics {
    registry: prometheus_client::registry::Registry,
    methods: MethodFamily,
}

impl std::fmt::Debug for RpcMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcMetrics").finish_non_exhaustive()
    }
}

impl Default for RpcMetrics {
    fn default() -> Self {
        let mut registry = prometheus_client::registry::Registry::default();
        let methods: MethodFamily = Family::new_with_constructor(rpc_histogram);
        registry.register(
            "jumpstarter_controller_rpc_duration_seconds",
            "Time from request to response headers (for streams: until the stream is open), \
             by gRPC method",
            methods.clone(),
        );
        Self { registry, methods }
    }
}

impl RpcMetrics {
    /// Records one call of `method` (a request path; unknown ones are counted together as
    /// [`UNKNOWN_METHOD`]) that took `elapsed`.
    pub fn observe(&self, method: &str, elapsed: Duration) {
        let key = jumpstarter_core::metrics::label_value(method_label(method));
        self.methods
            .get_or_create(&vec![("method", key)])
            .observe(elapsed.as_secs_f64());
    }

    /// The registry to encode on a scrape.
    pub fn registry(&self) -> &prometheus_client::registry::Registry {
        &self.registry
    }

    /// The histograms as an OpenMetrics page.
    #[cfg(test)]
    pub fn openmetrics(&self) -> String {
        jumpstarter_core::metrics::openmetrics_page(&[&self.registry], "")
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
#[cfg(test)]
pub async fn object_metrics<S: Store>(state: &ControllerState<S>) -> String {
    object_metrics_and_gauges(state, &[]).await.0
}

/// Leases and exporters by state, read from the store now, and the exporter gauges by
/// `exporter_labels` (see [`exporter_gauges`]).
pub async fn object_metrics_and_gauges<S: Store>(
    state: &ControllerState<S>,
    exporter_labels: &[String],
) -> (String, prometheus_client::registry::Registry) {
    let mut gauges = None;
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
            gauges = Some(exporter_gauges(&list.items, exporter_labels));
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
    (out, gauges.unwrap_or_default())
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

/// Upper bounds (seconds) of the lease wait histogram: from an idle exporter to a queue of
/// hours.
pub const WAIT_BUCKETS: [f64; 14] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0,
];
/// Upper bounds (seconds) of the grant time histogram (a reconcile pass).
pub const GRANT_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// `result` of `jumpstarter_lease_acquisitions_total`: an exporter was assigned.
pub const GRANTED: &str = "granted";
/// `result`: the lease's time ran out before an exporter was assigned.
pub const EXPIRED: &str = "expired";
/// `result`: the client released (deleted) the lease, or went away, before it was granted.
pub const CANCELLED: &str = "cancelled";
/// `result`: no exporter can ever satisfy the lease (bad selector, none matches, no access).
pub const UNSATISFIABLE: &str = "unsatisfiable";

type Labels = Vec<(&'static str, String)>;

/// Lease acquisitions and their timings, counted by the reconcile loop (for the whole
/// process: one controller runs in it).
pub struct LeaseMetrics {
    registry: prometheus_client::registry::Registry,
    acquisitions: Family<Labels, CounterWithExemplar<ExemplarLabels>>,
    wait: HistogramWithExemplars<ExemplarLabels>,
    grant: Histogram,
}

impl std::fmt::Debug for LeaseMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseMetrics").finish_non_exhaustive()
    }
}

impl Default for LeaseMetrics {
    fn default() -> Self {
        let mut registry = prometheus_client::registry::Registry::default();
        let acquisitions = Family::<Labels, CounterWithExemplar<ExemplarLabels>>::default();
        registry.register(
            "jumpstarter_lease_acquisitions",
            "Lease requests by outcome: granted, expired, cancelled or unsatisfiable",
            acquisitions.clone(),
        );
        // Every result reads 0 from the start, so that rates and ratios exist.
        for r in [GRANTED, EXPIRED, CANCELLED, UNSATISFIABLE] {
            let _ = acquisitions.get_or_create(&vec![("result", r.to_string())]);
        }
        let wait = HistogramWithExemplars::new(WAIT_BUCKETS.into_iter());
        registry.register(
            "jumpstarter_lease_wait_duration_seconds",
            "Time from a lease's creation to its grant",
            wait.clone(),
        );
        let grant = Histogram::new(GRANT_BUCKETS);
        registry.register(
            "jumpstarter_lease_grant_duration_seconds",
            "Time the controller spent granting a lease: its reconcile pass until the grant was stored",
            grant.clone(),
        );
        Self {
            registry,
            acquisitions,
            wait,
            grant,
        }
    }
}

/// The process's [`LeaseMetrics`].
pub fn leases() -> &'static LeaseMetrics {
    static LEASES: std::sync::LazyLock<LeaseMetrics> = std::sync::LazyLock::new(Default::default);
    &LEASES
}

/// The `result` of a lease that ended before it was granted, from the reason of the
/// condition that ended it.
pub fn ended_result(reason: &str) -> &'static str {
    match reason {
        conditions::REASON_EXPIRED => EXPIRED,
        conditions::REASON_RELEASED | crate::lease::pending_guard::REASON_CLIENT_GONE => CANCELLED,
        _ => UNSATISFIABLE,
    }
}

/// A lease's exemplar: its client and name, then its context entries as far as they fit.
pub fn lease_exemplar(lease: &Lease) -> ExemplarLabels {
    let name = lease.metadata.name.as_deref().unwrap_or_default();
    jumpstarter_core::metrics::exemplar(
        [
            ("client", lease.spec.client_ref.name.as_str()),
            ("lease_id", name),
        ]
        .into_iter()
        .chain(
            lease
                .spec
                .context
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        ),
    )
}

impl LeaseMetrics {
    /// Counts what one reconcile pass (begun at `started`, deciding at `now`) wrote: each
    /// grant (with its wait since the lease's creation and the pass's time), and each lease
    /// that ended without ever being granted. `written` holds the decisions whose status was
    /// stored, with the lease as it was before.
    pub fn record_pass<'a>(
        &self,
        written: impl IntoIterator<Item = (&'a crate::lease::scheduler::LeaseDecision, &'a Lease)>,
        started: Instant,
        now: jiff::Timestamp,
    ) {
        use crate::lease::scheduler::Action;
        for (d, lease) in written {
            let result = match &d.action {
                Action::Assigned { .. } => GRANTED,
                Action::Ended { reason } if lease.assigned_exporter().is_none() => {
                    ended_result(reason)
                }
                _ => continue,
            };
            let ex = lease_exemplar(lease);
            let ex = (!ex.is_empty()).then_some(ex);
            if result == GRANTED {
                if let Some(created) = &lease.metadata.creation_timestamp {
                    let waited = now.duration_since(created.0).as_secs_f64().max(0.0);
                    self.wait.observe(waited, ex.clone(), None);
                }
                self.grant.observe(started.elapsed().as_secs_f64());
            }
            self.acquisitions
                .get_or_create(&vec![("result", result.to_string())])
                .inc_by(1, ex, None);
        }
    }

    /// [`LeaseMetrics::record_pass`] over a pass's `decisions` whose status was written:
    /// those whose own status `statuses` (the pass's leases' statuses by namespace and name)
    /// holds; `leases` are the leases the pass read.
    pub fn record_decisions(
        &self,
        decisions: &[crate::lease::scheduler::LeaseDecision],
        leases: &[Lease],
        statuses: &std::collections::BTreeMap<(&str, &str), &crate::objects::LeaseStatus>,
        started: Instant,
        now: jiff::Timestamp,
    ) {
        use crate::lease::scheduler::Action;
        let counted: Vec<&crate::lease::scheduler::LeaseDecision> = decisions
            .iter()
            .filter(|d| matches!(d.action, Action::Assigned { .. } | Action::Ended { .. }))
            .filter(|d| {
                statuses
                    .get(&(d.namespace.as_str(), d.name.as_str()))
                    .is_some_and(|st| std::ptr::eq(*st, &d.status))
            })
            .collect();
        if counted.is_empty() {
            return;
        }
        let by_key: HashMap<(&str, &str), &Lease> = leases
            .iter()
            .filter_map(|l| {
                Some((
                    (
                        l.metadata.namespace.as_deref()?,
                        l.metadata.name.as_deref()?,
                    ),
                    l,
                ))
            })
            .collect();
        self.record_pass(
            counted.into_iter().filter_map(|d| {
                by_key
                    .get(&(d.namespace.as_str(), d.name.as_str()))
                    .map(|l| (d, *l))
            }),
            started,
            now,
        );
    }

    /// The registry to encode on a scrape.
    pub fn registry(&self) -> &prometheus_client::registry::Registry {
        &self.registry
    }
}

/// Exporters online, leased and quarantined by the values of the admin's chosen exporter
/// labels (`--metrics-exporter-labels`; none: one series each), read from `exporters`.
pub fn exporter_gauges(
    exporters: &[Exporter],
    label_keys: &[String],
) -> prometheus_client::registry::Registry {
    let names: Vec<String> = label_keys
        .iter()
        .filter_map(|k| jumpstarter_core::metrics::label_name(k))
        .collect();
    // Online, leased, quarantined, by label values.
    let mut counts: std::collections::BTreeMap<Vec<(String, String)>, [i64; 3]> =
        std::collections::BTreeMap::new();
    for e in exporters {
        let labels: Vec<(String, String)> = label_keys
            .iter()
            .zip(&names)
            .map(|(k, n)| {
                let v = e
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(k))
                    .map(String::as_str)
                    .unwrap_or_default();
                (n.clone(), jumpstarter_core::metrics::label_value(v))
            })
            .collect();
        let c = counts.entry(labels).or_default();
        c[0] += i64::from(e.condition_is_true(conditions::ONLINE));
        c[1] += i64::from(e.status.as_ref().is_some_and(|s| s.lease_ref.is_some()));
        c[2] += i64::from(e.unhealthy().is_some());
    }
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = [
        (
            "jumpstarter_exporters_online",
            "Exporters whose Online condition is True",
        ),
        ("jumpstarter_exporters_leased", "Exporters holding a lease"),
        (
            "jumpstarter_exporters_quarantined",
            "Exporters quarantined (Healthy=False)",
        ),
    ];
    for (i, (name, help)) in metrics.into_iter().enumerate() {
        if names.is_empty() {
            // One series without labels, 0 without exporters.
            let g: Gauge = Gauge::default();
            g.set(counts.values().map(|c| c[i]).sum());
            registry.register(name, help, g);
        } else {
            let f = Family::<Vec<(String, String)>, Gauge>::default();
            for (labels, c) in &counts {
                f.get_or_create(labels).set(c[i]);
            }
            registry.register(name, help, f);
        }
    }
    registry
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

    fn lease_at(name: &str, created: jiff::Timestamp, context: &[(&str, &str)]) -> Lease {
        let mut l = Lease::new(
            name,
            crate::objects::LeaseSpec {
                client_ref: k8s_openapi::api::core::v1::LocalObjectReference { name: "ci".into() },
                context: context
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            },
        );
        l.metadata.namespace = Some("lab".into());
        l.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            created,
        ));
        l
    }

    fn decision(
        name: &str,
        action: crate::lease::scheduler::Action,
    ) -> crate::lease::scheduler::LeaseDecision {
        crate::lease::scheduler::LeaseDecision {
            namespace: "lab".into(),
            name: name.into(),
            action,
            status: Default::default(),
            status_changed: true,
            labels: Default::default(),
            labels_changed: false,
            owner_exporter: None,
            requeue_at: None,
        }
    }

    #[test]
    fn lease_outcomes_are_counted_with_the_lease_as_exemplar() {
        use crate::lease::scheduler::Action;
        let m = LeaseMetrics::default();
        let now: jiff::Timestamp = "2026-01-01T10:00:00Z".parse().unwrap();
        let created = now - jiff::SignedDuration::from_secs(42);
        let long = "v".repeat(120);
        let granted = lease_at("l1", created, &[("build_id", "n-42"), ("image", &long)]);
        let expired = lease_at("l2", created, &[]);
        let mut held = lease_at("l3", created, &[]);
        held.status = Some(crate::objects::LeaseStatus {
            exporter_ref: Some(k8s_openapi::api::core::v1::LocalObjectReference {
                name: "board".into(),
            }),
            ..Default::default()
        });
        let d1 = decision(
            "l1",
            Action::Assigned {
                exporter: "board".into(),
                priority: 0,
            },
        );
        let d2 = decision(
            "l2",
            Action::Ended {
                reason: conditions::REASON_EXPIRED,
            },
        );
        // A granted lease ending is no acquisition outcome.
        let d3 = decision(
            "l3",
            Action::Ended {
                reason: conditions::REASON_EXPIRED,
            },
        );
        m.record_pass(
            [(&d1, &granted), (&d2, &expired), (&d3, &held)],
            Instant::now(),
            now,
        );
        let text = jumpstarter_core::metrics::openmetrics_page(&[m.registry()], "");
        assert!(
            text.contains(
                "jumpstarter_lease_acquisitions_total{result=\"granted\"} 1 # {client=\"ci\",lease_id=\"l1\",build_id=\"n-42\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("jumpstarter_lease_acquisitions_total{result=\"expired\"} 1 # {client=\"ci\",lease_id=\"l2\"}"), "{text}");
        assert!(
            text.contains("jumpstarter_lease_acquisitions_total{result=\"cancelled\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("jumpstarter_lease_acquisitions_total{result=\"unsatisfiable\"} 0\n"),
            "{text}"
        );
        // Waited 42 s: in the 60 s bucket, not the 30 s one.
        assert!(
            text.contains("jumpstarter_lease_wait_duration_seconds_bucket{le=\"30.0\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "jumpstarter_lease_wait_duration_seconds_bucket{le=\"60.0\"} 1 # {client=\"ci\""
            ),
            "{text}"
        );
        assert!(
            text.contains("jumpstarter_lease_grant_duration_seconds_count 1\n"),
            "{text}"
        );
        assert!(!text.contains("image="), "over the exemplar limit: {text}");
        assert_eq!(ended_result(conditions::REASON_RELEASED), CANCELLED);
        assert_eq!(
            ended_result(crate::lease::pending_guard::REASON_CLIENT_GONE),
            CANCELLED
        );
        assert_eq!(ended_result("NoAccess"), UNSATISFIABLE);
    }

    #[test]
    fn exporter_gauges_by_the_admins_labels() {
        let ex = |name: &str, board: &str, online: bool, leased: bool| {
            let mut e = Exporter::new(name, Default::default());
            e.metadata.labels = Some(
                [("board".to_string(), board.to_string())]
                    .into_iter()
                    .collect(),
            );
            e.status = Some(crate::objects::ExporterStatus {
                conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                    type_: conditions::ONLINE.into(),
                    status: if online { "True" } else { "False" }.into(),
                    last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        jiff::Timestamp::UNIX_EPOCH,
                    ),
                    message: String::new(),
                    observed_generation: None,
                    reason: String::new(),
                }],
                lease_ref: leased
                    .then(|| k8s_openapi::api::core::v1::LocalObjectReference { name: "l".into() }),
                ..Default::default()
            });
            e
        };
        let all = [
            ex("a", "rpi4", true, true),
            ex("b", "rpi4", true, false),
            ex("c", "j784s4\"x", false, false),
        ];
        let page = |keys: &[&str]| {
            let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            jumpstarter_core::metrics::openmetrics_page(&[&exporter_gauges(&all, &keys)], "")
        };
        let text = page(&[]);
        assert!(text.contains("jumpstarter_exporters_online 2\n"), "{text}");
        assert!(text.contains("jumpstarter_exporters_leased 1\n"), "{text}");
        assert!(
            text.contains("jumpstarter_exporters_quarantined 0\n"),
            "{text}"
        );
        let text = page(&["board", "site-x"]);
        assert!(
            text.contains("jumpstarter_exporters_online{board=\"rpi4\",site_x=\"\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("jumpstarter_exporters_online{board=\"j784s4\\\"x\",site_x=\"\"} 0\n"),
            "{text}"
        );
        // No exporters, no labels: still one series each.
        let empty = jumpstarter_core::metrics::openmetrics_page(&[&exporter_gauges(&[], &[])], "");
        assert!(
            empty.contains("jumpstarter_exporters_online 0\n"),
            "{empty}"
        );
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
        let text = m.openmetrics();
        assert!(text.contains(
            "jumpstarter_controller_rpc_duration_seconds_bucket{le=\"0.005\",method=\"/jumpstarter.v1.ControllerService/Dial\"} 1"
        ));
        assert!(text.contains(
            "jumpstarter_controller_rpc_duration_seconds_bucket{le=\"10.0\",method=\"/jumpstarter.v1.ControllerService/Dial\"} 1"
        ));
        assert!(text.contains(
            "jumpstarter_controller_rpc_duration_seconds_bucket{le=\"+Inf\",method=\"/jumpstarter.v1.ControllerService/Dial\"} 2"
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
        let text = m.openmetrics();
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
        let methods = text
            .lines()
            .filter(|l| l.starts_with("jumpstarter_controller_rpc_duration_seconds_count{"))
            .count();
        assert_eq!(methods, 5);
        assert!(!text.contains("/x/"));
    }
}
