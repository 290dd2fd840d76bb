//! The exporter's Prometheus metrics (upstream's JEP-0013 names): its driver calls by driver
//! type, operation and result, with the lease's client and id as exemplars, and the lease
//! sessions it serves. `jmp run --metrics-listen ADDR` serves them (OpenMetrics) on `/metrics`.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use jumpstarter_core::{
    DriverError,
    metrics::{
        CallObserver, ExemplarLabels, StreamObserver, error_type, exemplar, is_unknown_call,
        label_value, openmetrics_page,
        prometheus_client::{
            encoding::{EncodeLabelSet, LabelSetEncoder},
            metrics::{
                exemplar::{CounterWithExemplar, HistogramWithExemplars},
                family::Family,
                gauge::Gauge,
            },
            registry::Registry,
        },
    },
};

/// Upper bounds (seconds) of the driver call duration buckets: from a relay switch to
/// flashing an image.
pub const OPERATION_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 60.0, 300.0,
];
/// Distinct (driver type, operation) pairs counted under their own names; further ones (a
/// driver accepting any method name) are counted as operation `other`.
pub const MAX_OPERATIONS: usize = 512;
/// The `operation` of a call naming a method or driver the exporter does not have.
pub const UNKNOWN_OPERATION: &str = "unknown";
/// The `operation` of calls past [`MAX_OPERATIONS`].
pub const OTHER_OPERATION: &str = "other";

type Labels = Vec<(&'static str, String)>;
type HistogramFamily = Family<
    Labels,
    HistogramWithExemplars<LeaseExemplar>,
    fn() -> HistogramWithExemplars<LeaseExemplar>,
>;

/// A lease's exemplar labels, shared by the samples of its calls: a call's exemplar is an
/// `Arc` clone, not a copy of the labels' strings.
#[derive(Clone, Debug, Default)]
struct LeaseExemplar(Arc<ExemplarLabels>);

impl EncodeLabelSet for LeaseExemplar {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        self.0.as_slice().encode(encoder)
    }
}

fn operation_histogram() -> HistogramWithExemplars<LeaseExemplar> {
    HistogramWithExemplars::new(OPERATION_BUCKETS.into_iter())
}

/// The metrics of one exporter (one `jmp run`).
pub struct ExporterMetrics {
    registry: Registry,
    exporter: String,
    operations: Family<Labels, CounterWithExemplar<LeaseExemplar>>,
    durations: HistogramFamily,
    errors: Family<Labels, CounterWithExemplar<LeaseExemplar>>,
    stream_bytes: Family<Labels, CounterWithExemplar<LeaseExemplar>>,
    sessions: Gauge,
    operations_seen: Mutex<HashSet<(String, String)>>,
    /// The series a successful call of (driver type, operation) counts in, once known: a
    /// call then costs two lookups of short names instead of building and hashing its labels
    /// three times.
    successes: Mutex<NameMap<NameMap<SuccessSeries>>>,
}

/// A map keyed by short names (driver types, operations), hashed with [`Fnv`].
type NameMap<V> = HashMap<String, V, std::hash::BuildHasherDefault<Fnv>>;

/// FNV-1a, for the names of [`NameMap`]: a few instructions a byte where the default
/// SipHash costs a hundred or more a key, on the path of every driver call. Its keys are
/// bounded ([`MAX_OPERATIONS`]), so names made to collide cost at most that many compares.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The counter and histogram series of successful calls of one (driver type, operation).
struct SuccessSeries {
    count: CounterWithExemplar<LeaseExemplar>,
    duration: HistogramWithExemplars<LeaseExemplar>,
}

impl std::fmt::Debug for ExporterMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExporterMetrics")
            .field("exporter", &self.exporter)
            .finish_non_exhaustive()
    }
}

/// Two handles are equal when they are the same metrics.
impl PartialEq for ExporterMetrics {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl ExporterMetrics {
    /// The metrics of the exporter named `exporter` (its `exporter` label).
    pub fn new(exporter: &str) -> Arc<Self> {
        let mut registry = Registry::default();
        let operations = Family::<Labels, CounterWithExemplar<LeaseExemplar>>::default();
        registry.register(
            "jumpstarter_operations",
            "Driver calls served, by driver type, operation and result (success or failure)",
            operations.clone(),
        );
        let durations: HistogramFamily = Family::new_with_constructor(operation_histogram);
        registry.register(
            "jumpstarter_operation_duration_seconds",
            "Time a driver call took (for a streaming call: until its stream was open)",
            durations.clone(),
        );
        let errors = Family::<Labels, CounterWithExemplar<LeaseExemplar>>::default();
        registry.register(
            "jumpstarter_operation_errors",
            "Failed driver calls, by class of error",
            errors.clone(),
        );
        let stream_bytes = Family::<Labels, CounterWithExemplar<LeaseExemplar>>::default();
        registry.register(
            "jumpstarter_stream_bytes",
            "Bytes of driver and resource streams (rx: from the client, tx: to the client)",
            stream_bytes.clone(),
        );
        let exporter_label = label_value(exporter);
        let sessions_family = Family::<Labels, Gauge>::default();
        registry.register(
            "jumpstarter_active_sessions",
            "Lease sessions the exporter serves now",
            sessions_family.clone(),
        );
        registry
            .sub_registry_with_label(("destination".into(), "controller".into()))
            .register(
                "jumpstarter_telemetry_dropped",
                "Log entries dropped instead of pushed to the telemetry sink (queue full, sink down or refusing)",
                crate::telemetry::DROPPED_TOTAL.clone(),
            );
        // One series, created now so that it reads 0 before the first lease.
        let sessions_series = sessions_family
            .get_or_create(&vec![("exporter", exporter_label.clone())])
            .clone();
        Arc::new(Self {
            registry,
            exporter: exporter_label,
            operations,
            durations,
            errors,
            stream_bytes,
            sessions: sessions_series,
            operations_seen: Mutex::new(HashSet::new()),
            successes: Mutex::new(NameMap::default()),
        })
    }

    /// The OpenMetrics page of a scrape.
    pub fn render(&self) -> String {
        openmetrics_page(&[&self.registry], "")
    }

    /// The metrics of one lease's session: counts it as active until the returned value is
    /// dropped, and its call observer puts `client`, `lease_id` and then as many of the
    /// lease's `context` entries as fit (see [`jumpstarter_core::metrics::exemplar`]) on
    /// each call's samples as exemplar.
    pub fn lease(
        self: &Arc<Self>,
        client: &str,
        lease_id: &str,
        context: &BTreeMap<String, String>,
    ) -> LeaseMetrics {
        self.sessions.inc();
        let pairs = [("client", client), ("lease_id", lease_id)]
            .into_iter()
            .chain(context.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        LeaseMetrics {
            observer: Arc::new(LeaseCalls {
                metrics: Arc::clone(self),
                exemplar: LeaseExemplar(Arc::new(exemplar(pairs))),
                streams: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The `operation` label of a call: bounded (see [`MAX_OPERATIONS`]).
    fn operation_label(
        &self,
        driver_type: &str,
        operation: &str,
        error: Option<&DriverError>,
    ) -> String {
        if error.is_some_and(is_unknown_call) {
            return UNKNOWN_OPERATION.to_string();
        }
        let mut seen = self
            .operations_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let key = (driver_type.to_string(), operation.to_string());
        if seen.contains(&key) {
            return label_value(operation);
        }
        if seen.len() >= MAX_OPERATIONS {
            return OTHER_OPERATION.to_string();
        }
        seen.insert(key);
        label_value(operation)
    }

    fn record(
        &self,
        driver_type: &str,
        operation: &str,
        error: Option<&DriverError>,
        elapsed: Duration,
        exemplar: &LeaseExemplar,
    ) {
        let ex = || (!exemplar.0.is_empty()).then(|| exemplar.clone());
        if error.is_none() {
            // Counted under the lock (held for as long as a clone of the series would take).
            let known = self.successes.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(series) = known.get(driver_type).and_then(|ops| ops.get(operation)) {
                series.count.inc_by(1, ex(), None);
                series.duration.observe(elapsed.as_secs_f64(), ex(), None);
                return;
            }
            drop(known);
        }
        let raw_operation = operation;
        let operation = self.operation_label(driver_type, operation, error);
        let driver_type_raw = driver_type;
        let driver_type = label_value(driver_type);
        let result = if error.is_some() {
            "failure"
        } else {
            "success"
        };
        let labels: Labels = vec![
            ("exporter", self.exporter.clone()),
            ("operation", operation.clone()),
            ("result", result.to_string()),
            ("driver_type", driver_type.clone()),
        ];
        let count = self.operations.get_or_create(&labels).clone();
        let duration = self.durations.get_or_create(&labels).clone();
        count.inc_by(1, ex(), None);
        duration.observe(elapsed.as_secs_f64(), ex(), None);
        // Remembered only under its own name (bounded as the operations are).
        if error.is_none() && operation != OTHER_OPERATION {
            self.successes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(driver_type_raw.to_string())
                .or_default()
                .insert(raw_operation.to_string(), SuccessSeries { count, duration });
        }
        if let Some(e) = error {
            let labels: Labels = vec![
                ("exporter", self.exporter.clone()),
                ("operation", operation),
                ("driver_type", driver_type),
                ("error_type", error_type(e).to_string()),
            ];
            self.errors.get_or_create(&labels).inc_by(1, ex(), None);
        }
    }
}

/// The metrics of one lease's session (see [`ExporterMetrics::lease`]).
pub struct LeaseMetrics {
    observer: Arc<LeaseCalls>,
}

impl LeaseMetrics {
    /// What to give the lease's session (`Session::set_call_observer`).
    pub fn observer(&self) -> Arc<dyn CallObserver> {
        self.observer.clone()
    }

    /// What to give the lease's session for its streams (`Session::set_stream_observer`).
    pub fn stream_observer(&self) -> Arc<dyn StreamObserver> {
        self.observer.clone()
    }
}

impl Drop for LeaseMetrics {
    fn drop(&mut self) {
        self.observer.metrics.sessions.dec();
    }
}

struct LeaseCalls {
    metrics: Arc<ExporterMetrics>,
    exemplar: LeaseExemplar,
    /// The stream byte series of this lease's streams by (driver type, direction), once
    /// looked up: a batch of bytes then costs a short scan instead of building and hashing
    /// its labels.
    streams: Mutex<Vec<(String, &'static str, CounterWithExemplar<LeaseExemplar>)>>,
}

/// Stream byte series a [`LeaseCalls`] remembers, at most (a session's drivers are fewer).
const MAX_STREAM_SERIES: usize = 64;

impl CallObserver for LeaseCalls {
    fn driver_call(
        &self,
        driver_type: &str,
        operation: &str,
        error: Option<&DriverError>,
        elapsed: Duration,
    ) {
        self.metrics
            .record(driver_type, operation, error, elapsed, &self.exemplar);
    }
}

impl StreamObserver for LeaseCalls {
    fn stream_bytes(&self, driver_type: &str, direction: &'static str, bytes: u64) {
        let ex = || (!self.exemplar.0.is_empty()).then(|| self.exemplar.clone());
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, series)) = streams
            .iter()
            .find(|(t, d, _)| *d == direction && t == driver_type)
        {
            series.inc_by(bytes, ex(), None);
            return;
        }
        let m = &self.metrics;
        let labels: Labels = vec![
            ("exporter", m.exporter.clone()),
            ("driver_type", label_value(driver_type)),
            ("direction", direction.to_string()),
        ];
        let series = m.stream_bytes.get_or_create(&labels).clone();
        series.inc_by(bytes, ex(), None);
        if streams.len() < MAX_STREAM_SERIES {
            streams.push((driver_type.to_string(), direction, series));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(m: &Arc<ExporterMetrics>) -> LeaseMetrics {
        let context = BTreeMap::from([
            ("build_id".to_string(), "nightly-42".to_string()),
            ("image".to_string(), "x".repeat(90)),
        ]);
        m.lease("ci", "01a24e0f-42c4-7096-aaeb-0d323edf902e", &context)
    }

    #[test]
    fn dropped_log_entries_are_served() {
        let m = ExporterMetrics::new("board-1");
        let series = "jumpstarter_telemetry_dropped_total{destination=\"controller\"} ";
        let read = |text: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(series))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {series} in {text}"))
        };
        let before = read(&m.render());
        crate::telemetry::DROPPED_TOTAL.inc_by(3);
        // Other tests of this binary may drop entries meanwhile: at least these three.
        assert!(read(&m.render()) >= before + 3);
    }

    #[test]
    fn calls_are_counted_with_the_lease_as_exemplar() {
        let m = ExporterMetrics::new("board-1");
        let text = m.render();
        assert!(
            text.contains("jumpstarter_active_sessions{exporter=\"board-1\"} 0"),
            "{text}"
        );
        let l = lease(&m);
        let o = l.observer();
        o.driver_call("MockPower", "on", None, Duration::from_millis(2));
        o.driver_call(
            "MockPower",
            "off",
            Some(&DriverError::Timeout("slow".into())),
            Duration::from_secs(2),
        );
        let text = m.render();
        let ex = "# {client=\"ci\",lease_id=\"01a24e0f-42c4-7096-aaeb-0d323edf902e\",build_id=\"nightly-42\"} 1";
        assert!(
            text.contains(&format!(
                "jumpstarter_operations_total{{exporter=\"board-1\",operation=\"on\",result=\"success\",driver_type=\"MockPower\"}} 1 {ex}"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "jumpstarter_operation_errors_total{{exporter=\"board-1\",operation=\"off\",driver_type=\"MockPower\",error_type=\"timeout\"}} 1 {ex}"
            )),
            "{text}"
        );
        assert!(
            text.contains("jumpstarter_operation_duration_seconds_bucket{le=\"2.5\",exporter=\"board-1\",operation=\"off\",result=\"failure\",driver_type=\"MockPower\"} 1 # {"),
            "{text}"
        );
        assert!(
            text.contains("jumpstarter_active_sessions{exporter=\"board-1\"} 1"),
            "{text}"
        );
        // The context entry that does not fit the 128 characters is left out.
        assert!(!text.contains("image="), "{text}");
        // Stream bytes, in batches and at the stream's end.
        {
            let mut rx =
                jumpstarter_core::metrics::ByteCount::new(l.stream_observer(), "Opendal", "rx");
            for _ in 0..3 {
                rx.add(40 * 1024);
            }
            let text = m.render();
            assert!(
                text.contains("jumpstarter_stream_bytes_total{exporter=\"board-1\",driver_type=\"Opendal\",direction=\"rx\"} 81920 # {client=\"ci\""),
                "{text}"
            );
        }
        assert!(
            m.render().contains(
                "jumpstarter_stream_bytes_total{exporter=\"board-1\",driver_type=\"Opendal\",direction=\"rx\"} 122880 "
            )
        );
        drop(l);
        assert!(
            m.render()
                .contains("jumpstarter_active_sessions{exporter=\"board-1\"} 0")
        );
    }

    #[test]
    fn operation_labels_are_bounded() {
        let m = ExporterMetrics::new("b");
        let l = lease(&m);
        let o = l.observer();
        // Methods the driver does not have: one label value for all.
        for i in 0..100 {
            o.driver_call(
                "MockPower",
                &format!("nope{i}"),
                Some(&DriverError::MethodNotFound(format!("nope{i}"))),
                Duration::ZERO,
            );
        }
        // A driver accepting any name: at most MAX_OPERATIONS of its own, then `other`.
        for i in 0..MAX_OPERATIONS + 10 {
            o.driver_call("Any", &format!("m{i}\""), None, Duration::ZERO);
        }
        let text = m.render();
        assert!(
            text.contains(
                "operation=\"unknown\",result=\"failure\",driver_type=\"MockPower\"} 100"
            ),
            "{text}"
        );
        assert!(
            text.contains("operation=\"other\",result=\"success\",driver_type=\"Any\"} 10"),
            "{text}"
        );
        assert!(text.contains("operation=\"m0\\\"\""), "escaped: {text}");
        let series = text
            .lines()
            .filter(|l| l.starts_with("jumpstarter_operations_total{"))
            .count();
        assert_eq!(series, MAX_OPERATIONS + 2);
    }
}
