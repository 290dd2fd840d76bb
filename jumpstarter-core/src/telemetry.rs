//! Traces of a lease's path over OpenTelemetry (OTLP/gRPC), off unless asked for.
//!
//! `jumpstarter-controller`, `jumpstarter-router` and `jmp run` export spans when
//! `--otlp-endpoint URL`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set ([`start`]). The spans (target [`TARGET`]):
//!
//! | span | where | what |
//! |---|---|---|
//! | `lease` | controller | the root: from the lease's creation to its end |
//! | `lease.create` | controller | `CreateLease` |
//! | `lease.grant` | controller | the lease got its exporter |
//! | `lease.dial` | controller | a client's `Dial` |
//! | `lease.end` | controller | the lease ended |
//! | `router.tunnel` | router | one tunnel of the lease (`stream`) |
//! | `lease.serve` | exporter | the exporter serving the lease |
//! | `driver.call` | exporter | one driver call (`driver_type`, `operation`, `result`) |
//!
//! All of them carry `lease_id` and `namespace`, the lease's spans `client` and `exporter`. One lease is one
//! trace across the processes without anything new on the wire: its trace id, and the span
//! id of its root, come from its namespace and name ([`lease_trace_ids`]), which the
//! controller and the exporter both know.
//!
//! Spans go out in batches from a thread of their own (bounded queue: when it is full,
//! spans are dropped), so a collector that is slow or down never holds up a call. The
//! standard `OTEL_*` settings apply (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_BSP_*`,
//! `OTEL_TRACES_SAMPLER`, `OTEL_SDK_DISABLED`).
//!
//! Without the `otlp` feature of this crate the span helpers do nothing and [`start`]
//! refuses an endpoint.

use tracing::Span;

/// The target of every span of a trace (the log filter lets them through when traces are
/// on, whatever `RUST_LOG` says).
pub const TARGET: &str = "jumpstarter::trace";

/// Which lease a span is about.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeaseRef<'a> {
    /// The lease's namespace.
    pub namespace: &'a str,
    /// The lease's name (`lease_id`).
    pub name: &'a str,
    /// The client holding it.
    pub client: &'a str,
    /// The exporter serving it (empty before the grant).
    pub exporter: &'a str,
}

/// A step of a lease on the controller, each a span of the lease's trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `lease.create`: `CreateLease` stored it.
    Create,
    /// `lease.grant`: it got its exporter.
    Grant,
    /// `lease.dial`: a client asked for a connection to its exporter.
    Dial,
    /// `lease.end`: it ended.
    End,
}

/// The ids of a lease's trace: the same in every process that knows the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTraceIds {
    /// The W3C trace id (16 bytes, never all zero).
    pub trace_id: [u8; 16],
    /// The span id of the lease's root span `lease` (8 bytes, never all zero).
    pub root_span_id: [u8; 8],
}

impl LeaseTraceIds {
    /// The trace id as W3C writes it (32 lowercase hex digits).
    pub fn trace_id_hex(&self) -> String {
        self.trace_id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The trace ids of the lease `name` in `namespace`: the first 16 bytes of
/// SHA-256(`jumpstarter.dev/lease-trace/v1` LF namespace LF name) are the trace id, the next
/// 8 the root span's id.
pub fn lease_trace_ids(namespace: &str, name: &str) -> LeaseTraceIds {
    let input = format!("jumpstarter.dev/lease-trace/v1\n{namespace}\n{name}");
    let digest = ring::digest::digest(&ring::digest::SHA256, input.as_bytes());
    let d = digest.as_ref();
    let mut trace_id = [0u8; 16];
    trace_id.copy_from_slice(&d[..16]);
    let mut root_span_id = [0u8; 8];
    root_span_id.copy_from_slice(&d[16..24]);
    // All zero is "no id" in W3C; one in 2^128 (2^64), but never wrong.
    if trace_id == [0; 16] {
        trace_id[15] = 1;
    }
    if root_span_id == [0; 8] {
        root_span_id[7] = 1;
    }
    LeaseTraceIds {
        trace_id,
        root_span_id,
    }
}

/// Whether spans are exported (an OTLP endpoint is set and [`start`] ran).
pub fn traces_on() -> bool {
    #[cfg(feature = "otlp")]
    {
        otlp::tracer().is_some()
    }
    #[cfg(not(feature = "otlp"))]
    {
        false
    }
}

/// The span of `step` of `lease`, in the lease's trace; [`Span::none`] when traces are off.
/// The controller's log lines stay outside it: with traces on, text logs look as before.
pub fn lease_step(step: Step, lease: &LeaseRef<'_>) -> Span {
    if !traces_on() {
        return Span::none();
    }
    let LeaseRef {
        namespace,
        name,
        client,
        exporter,
    } = *lease;
    let span = match step {
        Step::Create => tracing::info_span!(target: TARGET, parent: None, "lease.create",
            lease_id = name, namespace, client, exporter, result = tracing::field::Empty,
            otel.status_code = tracing::field::Empty),
        Step::Grant => tracing::info_span!(target: TARGET, parent: None, "lease.grant",
            lease_id = name, namespace, client, exporter),
        Step::Dial => tracing::info_span!(target: TARGET, parent: None, "lease.dial",
            lease_id = name, namespace, client, exporter),
        Step::End => tracing::info_span!(target: TARGET, parent: None, "lease.end",
            lease_id = name, namespace, client, exporter),
    };
    join_lease_trace(&span, namespace, name);
    span
}

/// The exporter's span of `lease` (`lease.serve`, in the lease's trace), the parent of its
/// driver calls; [`Span::none`] when traces are off. Its contextual parent is the current
/// span (the exporter's log span of the lease), so the log lines in it keep their fields.
pub fn lease_serve(lease: &LeaseRef<'_>) -> Span {
    if !traces_on() {
        return Span::none();
    }
    let LeaseRef {
        namespace,
        name,
        client,
        exporter,
    } = *lease;
    let span = tracing::info_span!(target: TARGET, "lease.serve",
        lease_id = name, namespace, client, exporter);
    join_lease_trace(&span, namespace, name);
    span
}

/// The router's span of one tunnel of the lease `name` in `namespace` (`router.tunnel`,
/// with `stream`), from its opening to its end; [`Span::none`] when traces are off or the
/// lease is unknown (a token of upstream's controller).
pub fn tunnel(namespace: &str, name: &str, stream: &str) -> Span {
    if !traces_on() || name.is_empty() {
        return Span::none();
    }
    let span = tracing::info_span!(target: TARGET, parent: None, "router.tunnel",
        lease_id = name, namespace, stream);
    join_lease_trace(&span, namespace, name);
    span
}

/// The span of one driver call in `parent` (the lease's `lease.serve`); [`Span::none`]
/// when `parent` is not a span of a trace. [`record_result`] tells how it went.
pub fn driver_call(parent: &Span, driver_type: &str, operation: &str) -> Span {
    if parent.metadata().is_none_or(|m| m.target() != TARGET) {
        return Span::none();
    }
    tracing::info_span!(target: TARGET, parent: parent, "driver.call",
        driver_type, operation, result = tracing::field::Empty,
        error = tracing::field::Empty, otel.status_code = tracing::field::Empty)
}

/// Records `result` (`ok` or `error`, with the error's chain) on a span of
/// [`lease_step`]`(Step::Create, ..)` or [`driver_call`].
pub fn record_result<T, E: std::error::Error>(span: &Span, r: &Result<T, E>) {
    if span.is_none() {
        return;
    }
    match r {
        Ok(_) => {
            span.record("result", "ok");
        }
        Err(e) => {
            span.record("result", "error");
            span.record("error", crate::error_chain(e).as_str());
            span.record("otel.status_code", "ERROR");
        }
    }
}

/// The root span of `lease` (`lease`, from `created` to now, with the span id of
/// [`lease_trace_ids`]): the controller sends it when the lease ends, `reason` why. Does
/// nothing when traces are off.
pub fn lease_root(lease: &LeaseRef<'_>, created: std::time::SystemTime, reason: &str) {
    #[cfg(feature = "otlp")]
    otlp::lease_root(lease, created, reason);
    #[cfg(not(feature = "otlp"))]
    let _ = (lease, created, reason);
}

fn join_lease_trace(span: &Span, namespace: &str, name: &str) {
    #[cfg(feature = "otlp")]
    otlp::join_lease_trace(span, namespace, name);
    #[cfg(not(feature = "otlp"))]
    let _ = (span, namespace, name);
}

/// Why traces could not be turned on.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// An OTLP endpoint is set but this binary was built without the `otlp` feature.
    #[error(
        "{0} is set but this binary was built without traces (the `otlp` feature of jumpstarter-core)"
    )]
    NotBuiltIn(&'static str),
    /// The OTLP endpoint is not a URL.
    #[error("{what} {endpoint:?} is not an http:// or https:// URL")]
    BadEndpoint {
        /// The flag or variable that set it.
        what: &'static str,
        /// What it says.
        endpoint: String,
    },
    /// `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` asks for a transport that is not built in.
    #[error(
        "{var}={value:?}: only OTLP over gRPC (`grpc`) is built in; unset it or set it to grpc"
    )]
    UnsupportedProtocol {
        /// The variable.
        var: &'static str,
        /// What it says.
        value: String,
    },
    /// The span exporter could not be set up.
    #[error("cannot set up the OTLP span exporter")]
    Exporter(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The thread that sends spans could not start.
    #[error("cannot start the thread that sends spans")]
    Runtime(#[source] std::io::Error),
}

/// Sends what is left when dropped (waits up to a few seconds for the collector).
#[derive(Debug)]
pub struct Traces(());

impl Drop for Traces {
    fn drop(&mut self) {
        #[cfg(feature = "otlp")]
        otlp::shutdown();
    }
}

/// The endpoint traces go to: `flag` (`--otlp-endpoint`), else the OTLP environment
/// variables; `None`: traces are off. `OTEL_SDK_DISABLED=true` and
/// `OTEL_TRACES_EXPORTER=none` turn them off whatever is set.
fn configured(flag: Option<&str>) -> Option<(&'static str, String)> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
    {
        return None;
    }
    if let Some(f) = flag.filter(|f| !f.trim().is_empty()) {
        return Some(("--otlp-endpoint", f.trim().to_string()));
    }
    [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .into_iter()
    .find_map(|var| env(var).map(|v| (var, v.trim().to_string())))
}

/// Refuses an OTLP protocol other than gRPC: a setting that asks for HTTP would otherwise be
/// read and ignored (the traces-specific variable wins, as in the OpenTelemetry spec).
fn check_protocol(env: impl Fn(&str) -> Option<String>) -> Result<(), TelemetryError> {
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        let Some(value) = env(var).filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        if value.trim().eq_ignore_ascii_case("grpc") {
            return Ok(());
        }
        return Err(TelemetryError::UnsupportedProtocol { var, value });
    }
    Ok(())
}

/// Turns traces on when an OTLP endpoint is set (`endpoint`, from `--otlp-endpoint`, else
/// the environment), as service `default_service` unless `OTEL_SERVICE_NAME` (or
/// `service.name` in `OTEL_RESOURCE_ATTRIBUTES`) names it. Call it before the log
/// subscriber is installed ([`crate::logging::init`]): the spans go through it. Keep the
/// returned guard until the end of `main`. `Ok(None)`: traces are off.
pub fn start(
    default_service: &'static str,
    endpoint: Option<&str>,
) -> Result<Option<Traces>, TelemetryError> {
    let Some((what, endpoint)) = configured(endpoint) else {
        return Ok(None);
    };
    let scheme = endpoint
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.scheme_str().map(str::to_ascii_lowercase))
        .filter(|s| s == "http" || s == "https");
    if scheme.is_none() {
        return Err(TelemetryError::BadEndpoint { what, endpoint });
    }
    check_protocol(|k| std::env::var(k).ok())?;
    #[cfg(feature = "otlp")]
    {
        otlp::start(default_service, endpoint)?;
        Ok(Some(Traces(())))
    }
    #[cfg(not(feature = "otlp"))]
    {
        let _ = default_service;
        Err(TelemetryError::NotBuiltIn(what))
    }
}

/// The layer that turns the spans of [`TARGET`] into OpenTelemetry spans, when traces are
/// on (add it to the log subscriber).
pub fn layer<S>() -> Option<Box<dyn tracing_subscriber::Layer<S> + Send + Sync>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    #[cfg(feature = "otlp")]
    {
        otlp::layer()
    }
    #[cfg(not(feature = "otlp"))]
    {
        None
    }
}

/// `filter` letting the spans of [`TARGET`] through when traces are on.
pub fn with_trace_spans(filter: tracing_subscriber::EnvFilter) -> tracing_subscriber::EnvFilter {
    if !traces_on() {
        return filter;
    }
    match format!("{TARGET}=info").parse() {
        Ok(d) => filter.add_directive(d),
        Err(_) => filter,
    }
}

#[cfg(feature = "otlp")]
mod otlp {
    use std::{cell::Cell, sync::OnceLock, time::Duration};

    use opentelemetry::{
        Context, KeyValue,
        trace::{
            SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _,
            TracerProvider as _,
        },
    };
    use opentelemetry_sdk::{
        Resource,
        trace::{IdGenerator, RandomIdGenerator, SdkTracer, SdkTracerProvider},
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::Layer as _;

    use super::{LeaseRef, TelemetryError, lease_trace_ids};

    struct Started {
        provider: SdkTracerProvider,
        tracer: SdkTracer,
    }

    static STARTED: OnceLock<Started> = OnceLock::new();
    /// The runtime of the exporter's gRPC channel: a thread of its own, apart from the
    /// binary's runtime (which may not exist yet, and which spans never slow).
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

    /// How long [`shutdown`] waits for the last spans to go out.
    const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);

    pub(super) fn tracer() -> Option<&'static SdkTracer> {
        STARTED.get().map(|s| &s.tracer)
    }

    thread_local! {
        /// Set while the root span of a lease is built: the ids it must have.
        static NEXT_IDS: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
    }

    /// Random ids, except for a lease's root span (see [`lease_root`]).
    #[derive(Debug, Default)]
    struct LeaseIds(RandomIdGenerator);

    impl IdGenerator for LeaseIds {
        fn new_trace_id(&self) -> TraceId {
            NEXT_IDS
                .get()
                .map_or_else(|| self.0.new_trace_id(), |(t, _)| t)
        }
        fn new_span_id(&self) -> SpanId {
            NEXT_IDS
                .get()
                .map_or_else(|| self.0.new_span_id(), |(_, s)| s)
        }
    }

    fn resource(default_service: &'static str) -> Resource {
        // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by the default builder.
        let r = Resource::builder().build();
        let named = r
            .get(&opentelemetry::Key::from_static_str("service.name"))
            .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
        let b = Resource::builder()
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
        if named {
            b.build()
        } else {
            b.with_service_name(default_service).build()
        }
    }

    pub(super) fn start(
        default_service: &'static str,
        endpoint: String,
    ) -> Result<(), TelemetryError> {
        if STARTED.get().is_some() {
            return Ok(());
        }
        let rt = match RUNTIME.get() {
            Some(rt) => rt,
            None => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("otlp-export")
                    .enable_all()
                    .build()
                    .map_err(TelemetryError::Runtime)?;
                RUNTIME.get_or_init(|| rt)
            }
        };
        let exporter = {
            let _in_rt = rt.enter();
            use opentelemetry_otlp::{WithExportConfig as _, WithTonicConfig as _};
            let https = endpoint.to_ascii_lowercase().starts_with("https:");
            let b = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint);
            let b = if https {
                // With the system's CA certificates (tonic has none by default).
                b.with_tls_config(tonic::transport::ClientTlsConfig::new().with_native_roots())
            } else {
                b
            };
            b.build()
                .map_err(|e| TelemetryError::Exporter(Box::new(e)))?
        };
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_id_generator(LeaseIds::default())
            .with_resource(resource(default_service))
            .build();
        let tracer = provider.tracer("jumpstarter");
        let _ = STARTED.set(Started { provider, tracer });
        Ok(())
    }

    pub(super) fn shutdown() {
        if let Some(s) = STARTED.get() {
            let _ = s.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT);
        }
    }

    pub(super) fn layer<S>() -> Option<Box<dyn tracing_subscriber::Layer<S> + Send + Sync>>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        let tracer = tracer()?.clone();
        Some(Box::new(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_tracked_inactivity(false)
                .with_filter(OnlyTraceSpans),
        ))
    }

    /// Lets the spans of [`super::TARGET`] through to the OpenTelemetry layer, deciding at
    /// each span rather than once per callsite: with a callsite interest of `always`, the
    /// per-layer filter state a `tracing::enabled!` check leaves behind (the driver call
    /// lines' check, say) would hide the next span of the thread from the layer.
    struct OnlyTraceSpans;

    impl<S> tracing_subscriber::layer::Filter<S> for OnlyTraceSpans {
        fn enabled(
            &self,
            meta: &tracing::Metadata<'_>,
            _: &tracing_subscriber::layer::Context<'_, S>,
        ) -> bool {
            meta.target() == super::TARGET
        }

        fn callsite_enabled(
            &self,
            meta: &'static tracing::Metadata<'static>,
        ) -> tracing::subscriber::Interest {
            if meta.target() == super::TARGET {
                tracing::subscriber::Interest::sometimes()
            } else {
                tracing::subscriber::Interest::never()
            }
        }
    }

    /// The lease's root span, as a remote parent.
    fn root_context(namespace: &str, name: &str) -> Context {
        let ids = lease_trace_ids(namespace, name);
        Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_bytes(ids.trace_id),
            SpanId::from_bytes(ids.root_span_id),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        ))
    }

    pub(super) fn join_lease_trace(span: &tracing::Span, namespace: &str, name: &str) {
        if span.is_none() {
            return;
        }
        let _ = span.set_parent(root_context(namespace, name));
    }

    pub(super) fn lease_root(lease: &LeaseRef<'_>, created: std::time::SystemTime, reason: &str) {
        let Some(tracer) = tracer() else { return };
        let ids = lease_trace_ids(lease.namespace, lease.name);
        let attributes = vec![
            KeyValue::new("lease_id", lease.name.to_string()),
            KeyValue::new("namespace", lease.namespace.to_string()),
            KeyValue::new("client", lease.client.to_string()),
            KeyValue::new("exporter", lease.exporter.to_string()),
            KeyValue::new("reason", reason.to_string()),
        ];
        NEXT_IDS.set(Some((
            TraceId::from_bytes(ids.trace_id),
            SpanId::from_bytes(ids.root_span_id),
        )));
        let mut span = tracer
            .span_builder("lease")
            .with_start_time(created)
            .with_attributes(attributes)
            .start_with_context(tracer, &Context::new());
        NEXT_IDS.set(None);
        opentelemetry::trace::Span::end(&mut span);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_has_one_trace_id_whoever_derives_it() {
        let a = lease_trace_ids("default", "01a24e0f-42c4-7096-aaeb-0d323edf902e");
        let b = lease_trace_ids("default", "01a24e0f-42c4-7096-aaeb-0d323edf902e");
        assert_eq!(a, b);
        assert_ne!(a.trace_id, [0; 16]);
        assert_ne!(a.root_span_id, [0; 8]);
        assert_eq!(a.trace_id_hex().len(), 32);
        assert!(a.trace_id_hex().chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn the_namespace_and_the_name_both_make_the_trace() {
        let a = lease_trace_ids("default", "l1");
        assert_ne!(a.trace_id, lease_trace_ids("other", "l1").trace_id);
        assert_ne!(a.trace_id, lease_trace_ids("default", "l2").trace_id);
        // No way to make one from the other by moving the separator.
        assert_ne!(
            lease_trace_ids("a", "bc").trace_id,
            lease_trace_ids("ab", "c").trace_id
        );
    }

    #[test]
    fn the_derivation_is_fixed() {
        // SHA-256("jumpstarter.dev/lease-trace/v1\ndefault\nl1"), computed elsewhere: another
        // implementation (e.g. a Python exporter) must find the same ids.
        let ids = lease_trace_ids("default", "l1");
        assert_eq!(ids.trace_id_hex(), "298ce29b242529545dff0be2c3c3de96");
        let span: String = ids
            .root_span_id
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(span, "5ffd75e55fb1d971");
    }

    #[test]
    fn without_an_endpoint_traces_are_off_and_spans_are_none() {
        // The test environment sets no OTLP endpoint.
        if configured(None).is_some() {
            return;
        }
        assert!(start("test", None).is_ok_and(|t| t.is_none()));
        assert!(!traces_on());
        let lease = LeaseRef {
            namespace: "default",
            name: "l1",
            client: "ci",
            exporter: "board",
        };
        assert!(lease_step(Step::Create, &lease).is_none());
        assert!(lease_serve(&lease).is_none());
        assert!(driver_call(&Span::none(), "MockPower", "on").is_none());
    }

    #[test]
    fn only_the_grpc_protocol_is_accepted() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(super::check_protocol(env(&[])).is_ok());
        assert!(super::check_protocol(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])).is_ok());
        let e = super::check_protocol(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && e.contains("http/protobuf"),
            "{e}"
        );
        // The traces-specific variable wins over the general one.
        assert!(
            super::check_protocol(env(&[
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ]))
            .is_ok()
        );
        let e = super::check_protocol(env(&[
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), "{e}");
    }

    #[test]
    fn a_bad_endpoint_is_refused_naming_the_flag() {
        let e = start("test", Some("localhost:4317")).err();
        let e = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            e.contains("--otlp-endpoint") && e.contains("localhost:4317"),
            "{e}"
        );
        assert!(!traces_on());
    }
}
