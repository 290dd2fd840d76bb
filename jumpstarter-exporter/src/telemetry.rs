//! Log gathering, the exporter's side (upstream main's JEP-0013): after registering, the
//! exporter asks the controller where its telemetry sink is (`GetServiceEndpoints`; an
//! upstream 0.9.0 controller answers UNIMPLEMENTED, which means none) and pushes each
//! lease's structured entries there (`TelemetryService.PushLogs`): one per driver call
//! (`driver_type`, `operation`, `result`, `duration_ms`), one per driver log line and one per
//! line of the lease's hooks' output (`stream=hook`, see [`HOOK_STREAM`]), each with the
//! lease's name, client and context. Between leases too, one entry per run of the health
//! check (`stream=health`, no lease; see [`HealthCheckRun`]).
//!
//! Entries go through a bounded queue to one background task that sends them in batches:
//! a driver call only ever tries to queue its entry, never waits. When the queue is full
//! or the sink does not take a batch (down, stalled past [`PUSH_TIMEOUT`], refusing), the
//! entries are dropped and counted in [`DROPPED_TOTAL`], with a warning at most once per
//! [`WARN_EVERY`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU64, Ordering},
};
use std::time::{Duration, Instant};

use jumpstarter_core::client::channel::AuthChannel;
use jumpstarter_proto::v1::{
    GetServiceEndpointsRequest, LogEntry, LogSource, PushLogsRequest, TelemetryEndpoint,
    controller_service_client::ControllerServiceClient,
    telemetry_service_client::TelemetryServiceClient,
};
use tokio::sync::mpsc;
use tonic::Code;

/// Entries the exporter dropped instead of pushing them (queue full, sink down or
/// refusing): the metric `jumpstarter_telemetry_dropped_total{destination="controller"}`
/// that `jmp run --metrics-listen` serves (the telemetry sink the controller names is the
/// one destination).
pub static DROPPED_TOTAL: std::sync::LazyLock<
    jumpstarter_core::metrics::prometheus_client::metrics::counter::Counter,
> = std::sync::LazyLock::new(Default::default);

/// Entries waiting to be pushed, at most.
pub const QUEUE: usize = 4096;
/// Entries in one `PushLogs` request, at most (the controller takes 1,000).
pub const BATCH: usize = 500;
/// How long the first entry of a batch waits for others.
const GATHER: Duration = Duration::from_millis(200);
/// A `PushLogs` call taking longer is given up (its entries dropped).
pub const PUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// Dropped entries are reported in the log at most this often.
pub const WARN_EVERY: Duration = Duration::from_secs(60);

/// Bounds of an entry the controller checks (upstream main's for `extra_fields`).
const MAX_EXTRA_FIELDS: usize = 16;
const MAX_EXTRA_KEY: usize = 64;
const MAX_EXTRA_VALUE: usize = 256;
const MAX_MESSAGE: usize = 16 * 1024;

/// The telemetry sink the controller names, if any: `None` for an empty list, for an
/// upstream 0.9.0 controller (UNIMPLEMENTED) and when the question fails.
pub async fn discover(channel: &AuthChannel) -> Option<TelemetryEndpoint> {
    match ControllerServiceClient::new(channel.clone())
        .get_service_endpoints(GetServiceEndpointsRequest {})
        .await
    {
        Ok(r) => r.into_inner().telemetry_endpoints.into_iter().next(),
        Err(s) if s.code() == Code::Unimplemented => None,
        Err(s) => {
            tracing::warn!(
                "cannot ask the controller for its telemetry endpoint ({:?}: {}); not pushing logs",
                s.code(),
                s.message()
            );
            None
        }
    }
}

/// Counts dropped entries and says so in the log now and then.
#[derive(Debug, Default)]
struct Drops {
    last_warned: Mutex<Option<Instant>>,
    since_warned: AtomicU64,
}

impl Drops {
    fn add(&self, n: u64, why: &str) {
        if n == 0 {
            return;
        }
        DROPPED_TOTAL.inc_by(n);
        let pending = self.since_warned.fetch_add(n, Ordering::Relaxed) + n;
        let mut last = self.last_warned.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            *last = Some(Instant::now());
            self.since_warned.store(0, Ordering::Relaxed);
            tracing::warn!(
                dropped = pending,
                "telemetry: {pending} log entries dropped ({why}); {} in all",
                DROPPED_TOTAL.get()
            );
        }
    }
}

/// Where the entries go (the leases' and the health checks'): the queue to the background
/// task pushing them; one per exporter, started once it knows the controller's sink.
#[derive(Debug, Clone)]
pub struct TelemetrySink {
    tx: mpsc::Sender<LogEntry>,
    drops: Arc<Drops>,
    /// Room in the queue a console record leaves for the driver calls and lines.
    reserve: usize,
}

impl TelemetrySink {
    /// A sink pushing to `client`, and its background task (it ends when every clone of
    /// the sink is gone).
    pub fn start(
        client: TelemetryServiceClient<AuthChannel>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        Self::start_with(client, QUEUE)
    }

    fn start_with(
        client: TelemetryServiceClient<AuthChannel>,
        queue: usize,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(queue);
        let drops = Arc::new(Drops::default());
        let task = tokio::spawn(push_loop(rx, client, drops.clone()));
        (
            Self {
                tx,
                drops,
                reserve: queue / 4,
            },
            task,
        )
    }

    /// A sink whose entries are read from the returned queue (tests).
    #[cfg(test)]
    pub(crate) fn channel(queue: usize) -> (Self, mpsc::Receiver<LogEntry>) {
        let (tx, rx) = mpsc::channel(queue);
        (
            Self {
                tx,
                drops: Arc::default(),
                reserve: queue / 4,
            },
            rx,
        )
    }

    /// Queues a console record as [`TelemetrySink::offer`] does, but only while more than a
    /// quarter of the queue is free: a chatty console cannot crowd out the lease's driver
    /// calls and lines on their way (what does not fit is dropped and counted).
    pub fn offer_console(&self, entry: LogEntry) {
        if self.tx.capacity() <= self.reserve {
            self.drops.add(
                1,
                "console records leave the rest of the queue to driver calls",
            );
            return;
        }
        self.offer(entry);
    }

    /// Queues `entry`, or drops (and counts) it when the queue is full: never waits.
    pub fn offer(&self, entry: LogEntry) {
        if self.tx.try_send(entry).is_err() {
            self.drops.add(1, "the queue to the telemetry sink is full");
        }
    }
}

async fn push_loop(
    mut rx: mpsc::Receiver<LogEntry>,
    mut client: TelemetryServiceClient<AuthChannel>,
    drops: Arc<Drops>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        let until = tokio::time::Instant::now() + GATHER;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(e)) => batch.push(e),
                Ok(None) | Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        let request = PushLogsRequest {
            entries: std::mem::take(&mut batch),
        };
        match tokio::time::timeout(PUSH_TIMEOUT, client.push_logs(request)).await {
            Ok(Ok(r)) => drops.add(u64::from(r.get_ref().dropped), "the sink is full"),
            Ok(Err(s)) => drops.add(
                n,
                &format!("the sink refused them: {:?}: {}", s.code(), s.message()),
            ),
            Err(_) => drops.add(n, "the sink did not answer in time"),
        }
    }
}

/// One lease's entries: told of its driver calls and its drivers' log lines.
pub struct LeaseTelemetry {
    sink: TelemetrySink,
    lease: String,
    client: String,
    exporter: String,
    namespace: String,
    /// The lease's context, as the entries carry it (bounded as the controller wants).
    context: HashMap<String, String>,
}

impl LeaseTelemetry {
    /// Entries of lease `lease` (of `client`, with `context`) served by `exporter`.
    pub fn new(
        sink: TelemetrySink,
        lease: &str,
        client: &str,
        exporter: &str,
        namespace: &str,
        context: &BTreeMap<String, String>,
    ) -> Self {
        let context = context
            .iter()
            .filter(|(k, _)| k.chars().count() <= MAX_EXTRA_KEY)
            .take(MAX_EXTRA_FIELDS - 2)
            .map(|(k, v)| (k.clone(), truncate(v, MAX_EXTRA_VALUE)))
            .collect();
        Self {
            sink,
            lease: lease.into(),
            client: client.into(),
            exporter: exporter.into(),
            namespace: namespace.into(),
            context,
        }
    }

    fn entry(&self, severity: &str, message: &str) -> LogEntry {
        LogEntry {
            timestamp: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
            severity: severity.into(),
            message: truncate(message, MAX_MESSAGE),
            component: "exporter".into(),
            exporter: self.exporter.clone(),
            lease: self.lease.clone(),
            client: self.client.clone(),
            namespace: self.namespace.clone(),
            extra_fields: self.context.clone(),
            ..Default::default()
        }
    }

    /// The entry of one driver call.
    pub fn call(
        &self,
        driver_type: &str,
        operation: &str,
        error: Option<&jumpstarter_core::DriverError>,
        elapsed: Duration,
    ) {
        let mut e = self.entry(
            if error.is_some() { "error" } else { "info" },
            "driver call",
        );
        e.driver_type = truncate(driver_type, 200);
        e.operation = truncate(operation, 200);
        e.result = if error.is_some() { "error" } else { "ok" }.into();
        e.extra_fields.insert(
            "duration_ms".into(),
            format!("{:.3}", elapsed.as_secs_f64() * 1e3),
        );
        if let Some(err) = error {
            e.extra_fields.insert(
                "error".into(),
                truncate(&jumpstarter_core::error_chain(err), MAX_EXTRA_VALUE),
            );
        }
        self.sink.offer(e);
    }
}

/// The `extra_fields` value of `stream` that marks an entry as a console transcript's
/// record (with `console`, the console's name, and `direction`, `board->client` or
/// `client->board`); the message is the bytes escaped as in the transcript file.
pub const CONSOLE_STREAM: &str = "console";

impl LeaseTelemetry {
    /// The entry of one record of console `console`'s transcript: `text` (escaped bytes)
    /// that went `direction`, the first of them at `at`. Without the lease's context (the
    /// lease's other entries carry it), so a console's many entries stay small.
    pub fn console(&self, console: &str, direction: &str, at: std::time::SystemTime, text: &str) {
        let mut e = self.entry("info", text);
        e.timestamp = Some(prost_types::Timestamp::from(at));
        e.extra_fields = HashMap::from([
            ("stream".to_string(), CONSOLE_STREAM.to_string()),
            ("console".to_string(), truncate(console, MAX_EXTRA_VALUE)),
            ("direction".to_string(), direction.to_string()),
        ]);
        self.sink.offer_console(e);
    }
}

impl jumpstarter_core::metrics::CallObserver for LeaseTelemetry {
    fn driver_call(
        &self,
        driver_type: &str,
        operation: &str,
        error: Option<&jumpstarter_core::DriverError>,
        elapsed: Duration,
    ) {
        self.call(driver_type, operation, error, elapsed);
    }
}

/// The `extra_fields` value of `stream` that marks an entry as a line of a lease hook's
/// output (with `operation` the hook, `beforeLease` or `afterLease`): the controller's
/// dashboard shows these with the exporter's hook runs.
pub const HOOK_STREAM: &str = jumpstarter_core::hooks::HOOK_OUTPUT_STREAM;

impl jumpstarter_core::driver::LogObserver for LeaseTelemetry {
    fn driver_log(&self, driver: &str, severity: &str, message: &str) {
        let mut e = self.entry(&severity.to_ascii_lowercase(), message);
        e.driver_type = truncate(driver, 200);
        self.sink.offer(e);
    }

    fn hook_log(&self, source: LogSource, severity: &str, message: &str) {
        let hook = match source {
            LogSource::BeforeLeaseHook => "beforeLease",
            LogSource::AfterLeaseHook => "afterLease",
            _ => return,
        };
        let mut e = self.entry(&severity.to_ascii_lowercase(), message);
        e.operation = hook.into();
        e.extra_fields
            .insert("stream".to_string(), HOOK_STREAM.to_string());
        self.sink.offer(e);
    }
}

/// The `extra_fields` value of `stream` that marks an entry as one run of the exporter's
/// health check (see [`HealthCheckRun`]): the controller's dashboard shows these in the
/// exporter's health history.
pub const HEALTH_STREAM: &str = jumpstarter_core::hooks::HEALTH_CHECK_STREAM;

/// One run of the health check, as its entry tells it: pushed between leases, so with no
/// lease (nor client, nor context); `operation` `healthCheck`, `result` `ok` or `error`, the
/// extra fields `stream=health`, `failures` (in a row, this one included), `threshold`,
/// `duration_ms` and, when it failed, `error`; the message is the last lines of its output.
#[derive(Debug, Clone, Copy)]
pub struct HealthCheckRun<'a> {
    /// Passed, or why it failed.
    pub result: &'a Result<(), String>,
    /// The last lines of its output.
    pub output: &'a str,
    /// Failures in a row with this run (0 when it passed).
    pub failures: u32,
    /// Failures in a row that make the exporter unhealthy.
    pub threshold: u32,
    /// How long it ran.
    pub duration: Duration,
}

impl HealthCheckRun<'_> {
    /// The entry of this run of exporter `(name, namespace)`.
    fn entry(&self, (exporter, namespace): (&str, &str)) -> LogEntry {
        let failed = self.result.is_err();
        let mut extra_fields = HashMap::from([
            ("stream".to_string(), HEALTH_STREAM.to_string()),
            ("failures".to_string(), self.failures.to_string()),
            ("threshold".to_string(), self.threshold.to_string()),
            (
                "duration_ms".to_string(),
                format!("{:.3}", self.duration.as_secs_f64() * 1e3),
            ),
        ]);
        if let Err(why) = self.result {
            extra_fields.insert("error".into(), truncate(why, MAX_EXTRA_VALUE));
        }
        LogEntry {
            timestamp: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
            severity: if failed { "warning" } else { "info" }.into(),
            message: truncate(self.output, MAX_MESSAGE),
            component: "exporter".into(),
            exporter: exporter.into(),
            namespace: namespace.into(),
            // The config key, as `[UNHEALTHY] healthCheck: ...` names it.
            operation: "healthCheck".into(),
            result: if failed { "error" } else { "ok" }.into(),
            extra_fields,
            ..Default::default()
        }
    }
}

impl TelemetrySink {
    /// Queues the entry of one run of the health check of exporter `(name, namespace)`, as
    /// [`TelemetrySink::offer`] does (never waits; dropped and counted when it does not fit).
    pub fn health_check(&self, exporter: (&str, &str), run: &HealthCheckRun<'_>) {
        self.offer(run.entry(exporter));
    }
}

/// Several observers of a session's driver calls (the exporter's metrics and log gathering).
pub struct CallObservers(pub Vec<Arc<dyn jumpstarter_core::metrics::CallObserver>>);

impl jumpstarter_core::metrics::CallObserver for CallObservers {
    fn driver_call(
        &self,
        driver_type: &str,
        operation: &str,
        error: Option<&jumpstarter_core::DriverError>,
        elapsed: Duration,
    ) {
        for o in &self.0 {
            o.driver_call(driver_type, operation, error, elapsed);
        }
    }
}

/// `s` cut to `max` characters.
fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => s[..i].to_string(),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jumpstarter_proto::v1::{
        PushLogsResponse,
        telemetry_service_server::{TelemetryService, TelemetryServiceServer},
    };

    /// A sink that takes requests and never answers (a stalled telemetry service).
    struct Stalled;

    #[tonic::async_trait]
    impl TelemetryService for Stalled {
        async fn push_logs(
            &self,
            _: tonic::Request<PushLogsRequest>,
        ) -> Result<tonic::Response<PushLogsResponse>, tonic::Status> {
            std::future::pending().await
        }
    }

    async fn stalled_client() -> TelemetryServiceClient<AuthChannel> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TelemetryServiceServer::new(Stalled))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        let auth = jumpstarter_core::client::channel::ControllerAuth::bearer("t")
            .call_metadata("sink")
            .unwrap();
        TelemetryServiceClient::new(tonic::service::interceptor::InterceptedService::new(
            jumpstarter_core::client::channel::GrpcChannel::new(channel),
            auth,
        ))
    }

    #[test]
    fn truncate_counts_characters() {
        assert_eq!(truncate("héllo", 2), "hé");
        assert_eq!(truncate("ab", 5), "ab");
    }

    #[tokio::test]
    async fn a_stalled_sink_never_blocks_and_the_overflow_is_counted() {
        let (sink, _task) = TelemetrySink::start_with(stalled_client().await, 8);
        let lease = LeaseTelemetry::new(sink, "l", "ci", "board", "ns", &BTreeMap::new());
        // One entry, then time for the push task to send it and hang in the stalled call.
        lease.call("MockPower", "on", None, Duration::from_millis(1));
        tokio::time::sleep(GATHER * 3).await;
        let before = DROPPED_TOTAL.get();
        // Far more entries than the queue holds: each offer returns at once (the loop
        // would hang otherwise) and what does not fit is counted.
        for _ in 0..100 {
            lease.call("MockPower", "on", None, Duration::from_millis(1));
        }
        let dropped = DROPPED_TOTAL.get() - before;
        // 8 fit in the queue (one fewer if the first entry was still queued).
        assert!((91..=92).contains(&dropped), "{dropped}");
    }

    #[test]
    fn console_records_leave_a_quarter_of_the_queue_to_driver_calls() {
        let (sink, mut rx) = TelemetrySink::channel(8);
        let lease = LeaseTelemetry::new(sink, "l", "ci", "board", "ns", &BTreeMap::new());
        for _ in 0..20 {
            lease.console(
                "serial",
                "board->client",
                std::time::SystemTime::now(),
                "x\\n",
            );
        }
        for _ in 0..2 {
            lease.call("MockPower", "on", None, Duration::from_millis(1));
        }
        let mut kinds = Vec::new();
        while let Ok(e) = rx.try_recv() {
            kinds.push(if e.extra_fields.contains_key("stream") {
                "console"
            } else {
                "call"
            });
        }
        assert_eq!(kinds, [["console"; 6].as_slice(), &["call"; 2]].concat());
    }

    #[test]
    fn entries_carry_the_lease_and_a_bounded_context() {
        let (tx, mut rx) = mpsc::channel(4);
        let sink = TelemetrySink {
            tx,
            drops: Arc::default(),
            reserve: 1,
        };
        let context: BTreeMap<String, String> = (0..20)
            .map(|i| (format!("k{i:02}"), "v".repeat(300)))
            .chain([("x".repeat(65), "long key".to_string())])
            .collect();
        let lease = LeaseTelemetry::new(sink, "l-1", "ci", "board", "ns", &context);
        lease.call(
            "MockPower",
            "on",
            Some(&jumpstarter_core::DriverError::NotFound("x".into())),
            Duration::from_millis(2),
        );
        let e = rx.try_recv().unwrap();
        assert_eq!((e.lease.as_str(), e.client.as_str()), ("l-1", "ci"));
        assert_eq!((e.operation.as_str(), e.result.as_str()), ("on", "error"));
        assert!(
            e.extra_fields.len() <= MAX_EXTRA_FIELDS,
            "{}",
            e.extra_fields.len()
        );
        assert!(
            e.extra_fields
                .values()
                .all(|v| v.chars().count() <= MAX_EXTRA_VALUE)
        );
        assert!(
            e.extra_fields
                .keys()
                .all(|k| k.chars().count() <= MAX_EXTRA_KEY)
        );
        assert!(e.extra_fields.contains_key("error"));
        assert_eq!(e.extra_fields["k00"].len(), MAX_EXTRA_VALUE);
    }

    #[test]
    fn hook_lines_are_marked_with_their_hook() {
        use jumpstarter_core::driver::LogObserver;
        let (tx, mut rx) = mpsc::channel(4);
        let sink = TelemetrySink {
            tx,
            drops: Arc::default(),
            reserve: 1,
        };
        let context = BTreeMap::from([("build".to_string(), "7".to_string())]);
        let lease = LeaseTelemetry::new(sink, "l-1", "ci", "board", "ns", &context);
        lease.hook_log(LogSource::BeforeLeaseHook, "INFO", "flashing");
        lease.hook_log(LogSource::Driver, "INFO", "not a hook");
        let e = rx.try_recv().unwrap();
        assert_eq!(
            (
                e.operation.as_str(),
                e.message.as_str(),
                e.severity.as_str()
            ),
            ("beforeLease", "flashing", "info")
        );
        assert_eq!(e.extra_fields["stream"], HOOK_STREAM);
        assert_eq!(e.extra_fields["build"], "7");
        assert!(rx.try_recv().is_err());
    }
}
