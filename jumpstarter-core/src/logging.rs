//! Log lines for machines: `--log-format json` (or `JMP_LOG_FORMAT=json`) of `jmp run`,
//! `jumpstarter-controller` and `jumpstarter-router`.
//!
//! One JSON object a line with `timestamp` (RFC 3339, UTC), `level`, `component`, `target`,
//! `message`, the fields of every span the event is in (outermost first) and the event's own
//! fields, all at the top level, so a log store can index `lease_id`, `client`, `exporter`,
//! `namespace`, `driver_type`, `operation`, `result` and `duration_ms` without parsing
//! nested objects. A field set by an inner span or by the event wins over an outer one.
//!
//! ```
//! use tracing_subscriber::prelude::*;
//! let subscriber = tracing_subscriber::registry()
//!     .with(jumpstarter_core::logging::SpanFields)
//!     .with(
//!         tracing_subscriber::fmt::layer()
//!             .event_format(jumpstarter_core::logging::JsonLines::new("exporter"))
//!             .with_writer(std::io::stderr),
//!     );
//! tracing::subscriber::with_default(subscriber, || {
//!     let lease = tracing::info_span!("lease", lease_id = "l-1", client = "ci");
//!     let _in = lease.enter();
//!     tracing::info!(operation = "on", result = "ok", "driver call");
//! });
//! ```

use std::fmt;

use serde_json::{Map, Value};
use tracing::{
    Event, Subscriber,
    field::{Field, Visit},
    span,
};
use tracing_subscriber::{
    Layer,
    fmt::{FmtContext, FormatEvent, FormatFields, format},
    layer::Context,
    registry::LookupSpan,
};

/// Installs the log subscriber of a server binary (`component`: `controller`, `router`):
/// stderr, the level from `RUST_LOG` (default `info`), as [`JsonLines`] when `json`, else
/// text, coloured only for a person at a terminal; with the spans of a trace when
/// [`crate::telemetry::start`] turned traces on. Does nothing if one is installed.
pub fn init(component: &'static str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if json {
        init_json(component, filter);
    } else {
        use tracing_subscriber::prelude::*;
        let _ = tracing_subscriber::registry()
            .with(crate::telemetry::with_trace_spans(filter))
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .with(crate::telemetry::layer())
            .try_init();
    }
}

/// The span field that carries a lease's context (upstream main's `spec.context`) as a JSON
/// object: [`JsonLines`] writes each of its entries as a field of its own (never over a
/// field of the line), so every line of the lease carries them.
pub const LEASE_CONTEXT_FIELD: &str = "lease_context";

/// The value of [`LEASE_CONTEXT_FIELD`] for `context`.
pub fn context_field(context: &std::collections::BTreeMap<String, String>) -> String {
    serde_json::to_string(context).unwrap_or_default()
}

/// A span whose lines carry `context` (a lease's `spec.context`), each entry a field of its
/// own; [`tracing::Span::none`] for an empty context.
pub fn context_span(context: &std::collections::BTreeMap<String, String>) -> tracing::Span {
    if context.is_empty() {
        return tracing::Span::none();
    }
    tracing::info_span!(
        "lease",
        { LEASE_CONTEXT_FIELD } = context_field(context).as_str()
    )
}

/// The target of a driver call's line.
pub const CALL_TARGET: &str = "jumpstarter::driver_call";
/// The message of a driver call's line.
pub const CALL_MESSAGE: &str = "driver call";

/// A driver call's line (target [`CALL_TARGET`], level INFO, message [`CALL_MESSAGE`]), as
/// [`queue_call_line`] takes it.
#[derive(Debug)]
pub struct CallLine {
    /// `driver_type`.
    pub driver_type: &'static str,
    /// `operation`.
    pub operation: String,
    /// `result` is `error` with this `error` (the error's chain) when set, else `ok`.
    pub error: Option<String>,
    /// `duration_ms`.
    pub duration_ms: f64,
}

/// Where the driver call lines of this thread go: [`call_lines`] finds it once, at the start
/// of a call.
#[derive(Debug)]
pub enum CallLines {
    /// Nobody wants them.
    Off,
    /// To the writer of [`init_json`], whose filter wants them: [`CallQueue::push`].
    Queued(CallQueue),
    /// Wanted by another subscriber (text logs, a test's), or by a JSON one whose filter is
    /// asked at each line: [`queue_call_line`], else a tracing event.
    Logged,
}

/// The line queue of [`init_json`], as [`call_lines`] found it.
pub struct CallQueue {
    lines: JsonLines,
    queue: std::sync::Arc<LineQueue>,
}

impl fmt::Debug for CallQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallQueue")
            .field("lines", &self.lines)
            .finish_non_exhaustive()
    }
}

impl CallQueue {
    /// Queues `line` in the span `parent`, as [`queue_call_line`] does, without looking for
    /// the queue again.
    pub fn push(self, parent: &tracing::Span, line: CallLine) {
        push_call(&self.queue, self.lines, parent, line);
    }
}

/// `f` of this thread's subscriber and its [`JsonLayer`], when the subscriber has one and
/// traces are off (with traces on their layer must see each line as an event); `None`
/// otherwise or when `f` says so.
fn with_json_layer<T>(f: impl FnOnce(&tracing::Dispatch, &JsonLayer) -> Option<T>) -> Option<T> {
    if !JSON_LAYERS.load(std::sync::atomic::Ordering::Relaxed) || crate::telemetry::traces_on() {
        return None;
    }
    let mut f = Some(f);
    tracing::dispatcher::get_default(|d| {
        let layer = d.downcast_ref::<JsonLayer>()?;
        f.take().and_then(|f| f(d, layer))
    })
}

/// Where this thread's driver call lines go ([`CallLines`]). With the subscriber of
/// [`init_json`] the answer of its filter, asked once when it was installed, is kept: the
/// call neither asks the filter again nor looks for the queue a second time.
pub fn call_lines() -> CallLines {
    let kept = with_json_layer(|_, layer| {
        layer.wanted.get().map(|w| {
            if w.call {
                CallLines::Queued(CallQueue {
                    lines: layer.lines.clone(),
                    queue: layer.queue.clone(),
                })
            } else {
                CallLines::Off
            }
        })
    });
    if let Some(kept) = kept {
        return kept;
    }
    if tracing::enabled!(target: CALL_TARGET, tracing::Level::INFO) {
        CallLines::Logged
    } else {
        CallLines::Off
    }
}

/// Queues `line`, in the span `parent`, for the writer of [`init_json`] when that is this
/// thread's subscriber: its line is the one the same call logged as a tracing event would
/// get, but the calling thread only takes the time and the snapshots of `parent`'s spans,
/// and formats nothing. Gives `line` back when the subscriber is another (text logs, a
/// test's) or traces are on (their layer sees events): the caller then logs it as an event.
/// The caller has checked that [`CALL_TARGET`] is enabled at INFO.
pub fn queue_call_line(parent: &tracing::Span, line: CallLine) -> Result<(), CallLine> {
    let mut line = Some(line);
    with_json_layer(|_, layer| {
        let line = line.take()?;
        push_call(&layer.queue, layer.lines.clone(), parent, line);
        Some(())
    });
    match line {
        None => Ok(()),
        Some(line) => Err(line),
    }
}

/// Queues the call line `line` in the span `parent` on `queue`.
fn push_call(queue: &LineQueue, lines: JsonLines, parent: &tracing::Span, line: CallLine) {
    let spans = parent
        .with_subscriber(|(id, d)| scope_snapshots(d, id))
        .unwrap_or_default();
    queue.push(Pending::Call(
        lines,
        CallCaptured {
            time: std::time::SystemTime::now(),
            spans,
            line,
        },
    ));
}

/// The target of a driver's own log lines (`[driver.NAME] message`).
pub const DRIVER_TARGET: &str = "driver";

/// Queues driver `driver`'s log line `message` at `level` (target [`DRIVER_TARGET`], message
/// `[driver.NAME] message`, in the current span) for the writer of [`init_json`] when that is
/// this thread's subscriber: its line is the one the same line logged as a tracing event
/// would get, but the calling thread joins the message once, takes the time and the
/// snapshots of the current spans, and visits no fields. Returns false when the subscriber
/// is another (text logs, a test's) or traces are on (their layer sees events): the caller
/// then logs it as an event. The caller has checked that [`DRIVER_TARGET`] is enabled at
/// `level`.
pub fn queue_driver_line(level: tracing::Level, driver: &str, message: &str) -> bool {
    with_json_layer(|d, layer| {
        push_driver(d, layer, level, driver, message);
        Some(())
    })
    .is_some()
}

/// [`queue_driver_line`] without its caller's check, when the subscriber of [`init_json`] is
/// this thread's and the answer of its filter for `level` is kept (see [`call_lines`]):
/// `Some(true)` when the line was queued, `Some(false)` when the filter does not want it.
/// `None` otherwise: the caller asks the filter, then calls [`queue_driver_line`] or logs an
/// event.
pub fn queue_wanted_driver_line(
    level: tracing::Level,
    driver: &str,
    message: &str,
) -> Option<bool> {
    with_json_layer(|d, layer| {
        let wanted = layer.wanted.get()?.driver(level)?;
        if wanted {
            push_driver(d, layer, level, driver, message);
        }
        Some(wanted)
    })
}

/// Queues driver `driver`'s line `message` at `level`, in the current span of `d`, on
/// `layer`'s queue.
fn push_driver(
    d: &tracing::Dispatch,
    layer: &JsonLayer,
    level: tracing::Level,
    driver: &str,
    message: &str,
) {
    let spans = match d.current_span().id() {
        Some(id) => scope_snapshots(d, id),
        None => Vec::new(),
    };
    let mut text = String::with_capacity(10 + driver.len() + message.len());
    text.push_str("[driver.");
    text.push_str(driver);
    text.push_str("] ");
    text.push_str(message);
    layer.queue.push(Pending::Driver(
        layer.lines.clone(),
        DriverCaptured {
            time: std::time::SystemTime::now(),
            level,
            spans,
            message: text,
        },
    ));
}

/// Whether a [`JsonLayer`] was ever made: until then [`queue_driver_line`] has nothing to
/// look for (text logs pay one load).
static JSON_LAYERS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The snapshots of the fields of the spans of `scope`, outermost first.
fn snapshots<'a, R: LookupSpan<'a>>(
    scope: tracing_subscriber::registry::Scope<'a, R>,
) -> Vec<std::sync::Arc<SpanData>> {
    scope
        .from_root()
        .filter_map(|span| span.extensions().get::<SpanJson>().map(|f| f.0.clone()))
        .collect()
}

/// The snapshots of the spans of span `id`'s scope in `d` (outermost first). Looked up
/// through the layers under [`init_json`]'s JSON layer ([`JsonInner`], the third a look
/// meets) when `d` is its subscriber, else through the registry at the bottom of `d`.
fn scope_snapshots(d: &tracing::Dispatch, id: &span::Id) -> Vec<std::sync::Arc<SpanData>> {
    let found = match d.downcast_ref::<JsonInner>() {
        Some(inner) => inner.span(id).map(|span| snapshots(span.scope())),
        None => d
            .downcast_ref::<tracing_subscriber::Registry>()
            .and_then(|r| r.span(id))
            .map(|span| snapshots(span.scope())),
    };
    found.unwrap_or_default()
}

/// The layers of [`init_json`]'s subscriber under the traces' layer: the registry, the
/// filter and [`SpanFields`].
type JsonBase = tracing_subscriber::layer::Layered<
    SpanFields,
    tracing_subscriber::layer::Layered<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>,
>;

/// The layers of [`init_json`]'s subscriber under its JSON layer.
type JsonInner =
    tracing_subscriber::layer::Layered<Option<Box<dyn Layer<JsonBase> + Send + Sync>>, JsonBase>;

/// The subscriber of [`init_json`]: `filter`, [`SpanFields`], the traces' layer (when
/// traces are on) and `layer` outermost, the first layer a look for it meets.
fn json_stack(
    filter: tracing_subscriber::EnvFilter,
    layer: JsonLayer,
) -> tracing_subscriber::layer::Layered<JsonLayer, JsonInner> {
    use tracing_subscriber::prelude::*;
    tracing_subscriber::registry()
        .with(crate::telemetry::with_trace_spans(filter))
        .with(SpanFields)
        .with(crate::telemetry::layer())
        .with(layer)
}

/// Installs [`JsonLines`] of `component` on stderr with `filter` (what [`init`] does with
/// JSON, for a binary that picks its own filter; with traces as [`init`]). Does nothing if a
/// subscriber is installed.
pub fn init_json(component: &'static str, filter: tracing_subscriber::EnvFilter) {
    use tracing_subscriber::prelude::*;
    let queue = LineQueue::start();
    let fixed = answers_fixed(&filter);
    let layer = JsonLayer::new(JsonLines::new(component), queue.clone());
    let wanted = layer.wanted.clone();
    let installed = json_stack(filter, layer).try_init();
    if installed.is_ok() {
        let _ = JSON_COMPONENT.set(component);
        let _ = QUEUE.set(queue);
        if fixed {
            let _ = wanted.set(Wanted::ask());
        }
    }
}

/// Whether `filter`'s answer for a target and level is the same wherever it is asked: not
/// when a directive names a span (`[lease{lease_id=...}]=debug`).
fn answers_fixed(filter: &tracing_subscriber::EnvFilter) -> bool {
    !filter.to_string().contains('[')
}

/// Writes out every line logged so far (waiting at most a few seconds for stderr). A binary
/// calls it before it exits: with JSON logs the lines are written by a thread of their own.
pub fn flush() {
    if let Some(q) = QUEUE.get() {
        q.flush(std::time::Duration::from_secs(5));
    }
}

/// The queue of [`init_json`]'s lines, once installed.
static QUEUE: std::sync::OnceLock<std::sync::Arc<LineQueue>> = std::sync::OnceLock::new();

/// Set by [`init`] with JSON: the component [`say`] writes as.
static JSON_COMPONENT: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Writes `line` on stderr for the person or script that started the binary (its ready
/// line, where it listens): as is, or with JSON logs as a JSON line (level INFO) like the
/// others, so that every line of stderr parses. Never filtered out by the log level.
pub fn say(line: impl fmt::Display) {
    said(tracing::Level::INFO, &line.to_string(), None);
}

/// [`say`] for the error that stops the binary: `Error: message` as text, level ERROR as
/// JSON.
pub fn say_error(message: impl fmt::Display) {
    let message = message.to_string();
    said(tracing::Level::ERROR, &message, Some("Error: "));
}

fn said(level: tracing::Level, message: &str, text_prefix: Option<&str>) {
    match JSON_COMPONENT.get() {
        None => eprintln!("{}{message}", text_prefix.unwrap_or("")),
        Some(component) => {
            let mut out = Map::new();
            out.insert("timestamp".into(), now_rfc3339().into());
            out.insert("level".into(), level.as_str().into());
            out.insert("component".into(), (*component).into());
            out.insert("target".into(), "jumpstarter::said".into());
            out.insert("message".into(), message.into());
            let line = Value::Object(out).to_string();
            match QUEUE.get() {
                // In order with the lines logged before it, and out before the caller goes on
                // (a ready line is what a script waits for; an error line is the last one).
                Some(q) => {
                    q.push(Pending::Text(line));
                    q.flush(std::time::Duration::from_secs(5));
                }
                None => eprintln!("{line}"),
            }
        }
    }
}

fn now_rfc3339() -> String {
    rfc3339(std::time::SystemTime::now())
}

fn rfc3339(at: std::time::SystemTime) -> String {
    let at = time::OffsetDateTime::from(at);
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| at.unix_timestamp().to_string())
}

/// The fields of a span as JSON values, and the lease context it carries (parsed once, when
/// recorded), kept by [`SpanFields`]. Lines take a snapshot (an `Arc` clone); a later record
/// copies it first if a queued line still holds it.
#[derive(Debug, Default, Clone)]
struct SpanData {
    fields: Map<String, Value>,
    context: Option<Map<String, Value>>,
}

impl SpanData {
    fn record(&mut self, values: impl FnOnce(&mut JsonVisitor<'_, Map<String, Value>>)) {
        values(&mut JsonVisitor(&mut self.fields));
        if let Some(Value::String(c)) = self.fields.remove(LEASE_CONTEXT_FIELD)
            && let Ok(Value::Object(entries)) = serde_json::from_str::<Value>(&c)
        {
            self.context = Some(entries);
        }
    }
}

#[derive(Debug, Default)]
struct SpanJson(std::sync::Arc<SpanData>);

/// A layer that keeps each span's fields as JSON values, for [`JsonLines`] (add it to the
/// registry before the formatting layer).
#[derive(Debug, Clone, Copy, Default)]
pub struct SpanFields;

impl<S> Layer<S> for SpanFields
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut data = SpanData::default();
        data.record(|v| attrs.record(v));
        span.extensions_mut()
            .insert(SpanJson(std::sync::Arc::new(data)));
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(fields) = ext.get_mut::<SpanJson>() {
            std::sync::Arc::make_mut(&mut fields.0).record(|v| values.record(v));
        }
    }
}

/// Where [`JsonVisitor`] puts the fields it records.
trait FieldSink {
    fn put(&mut self, name: &'static str, value: Value);
}

/// A span's fields: by name, a later record replacing an earlier one.
impl FieldSink for Map<String, Value> {
    fn put(&mut self, name: &'static str, value: Value) {
        self.insert(name.to_string(), value);
    }
}

/// An event's own fields, in order, named by their static names: taking them costs the
/// logging thread no map and no key copies (the writer thread builds the line's map).
impl FieldSink for Vec<(&'static str, Value)> {
    fn put(&mut self, name: &'static str, value: Value) {
        self.push((name, value));
    }
}

/// Records fields as JSON values: numbers and booleans as such, the rest as strings.
struct JsonVisitor<'a, T: FieldSink>(&'a mut T);

impl<T: FieldSink> Visit for JsonVisitor<'_, T> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let v = serde_json::Number::from_f64(value)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(value.to_string()));
        self.0.put(field.name(), v);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.put(field.name(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.put(field.name(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.put(field.name(), value.into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.put(field.name(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.put(field.name(), crate::error_chain(value).into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // Room for a usual message at once: `format!` would start empty and grow it piece by
        // piece (a log line's message is formatted on the thread that logs it).
        let mut text = String::with_capacity(128);
        let _ = fmt::Write::write_fmt(&mut text, format_args!("{value:?}"));
        self.0.put(field.name(), text.into());
    }
}

/// Formats each event as one JSON object on one line (see the module docs).
#[derive(Debug, Clone)]
pub struct JsonLines {
    component: &'static str,
}

impl JsonLines {
    /// Lines of `component` (`controller`, `router`, `exporter`, `client`).
    pub fn new(component: &'static str) -> Self {
        Self { component }
    }

    /// The object for an event captured at `time` in the spans `spans` (outermost first).
    fn object(&self, e: Captured) -> Map<String, Value> {
        let mut out = Map::new();
        out.insert("timestamp".into(), rfc3339(e.time).into());
        out.insert("level".into(), e.level.as_str().to_string().into());
        // The in-process router of a controller writes as the router it is.
        let component = if e.target.starts_with("jumpstarter_router") {
            "router"
        } else {
            self.component
        };
        out.insert("component".into(), component.into());
        out.insert("target".into(), e.target.into());
        let mut context = Map::new();
        for span in &e.spans {
            if let Some(c) = &span.context {
                context.extend(c.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            out.extend(span.fields.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        out.extend(e.own.into_iter().map(|(k, v)| (k.to_string(), v)));
        for (k, v) in context {
            out.entry(k).or_insert(v);
        }
        out
    }

    /// The line (with its newline) of a captured event.
    fn line(&self, e: Captured, out: &mut Vec<u8>) {
        let object = self.object(e);
        if serde_json::to_writer(&mut *out, &object).is_ok() {
            out.push(b'\n');
        }
    }
}

/// An event as [`JsonLayer`] takes it on the logging thread: what its line needs, owned, so
/// that the line is formatted and written by the writer thread.
struct Captured {
    time: std::time::SystemTime,
    level: tracing::Level,
    target: &'static str,
    spans: Vec<std::sync::Arc<SpanData>>,
    own: Vec<(&'static str, Value)>,
}

impl Captured {
    /// `event` in the spans of `scope` (the snapshots [`SpanFields`] keeps).
    fn of<'a, R: LookupSpan<'a>>(
        event: &Event<'_>,
        scope: Option<tracing_subscriber::registry::Scope<'a, R>>,
    ) -> Self {
        let spans = scope.map(snapshots).unwrap_or_default();
        let mut own = Vec::with_capacity(event.metadata().fields().len());
        event.record(&mut JsonVisitor(&mut own));
        Captured {
            time: std::time::SystemTime::now(),
            level: *event.metadata().level(),
            target: event.metadata().target(),
            spans,
            own,
        }
    }
}

/// A driver call's line as [`queue_call_line`] takes it on the calling thread.
struct CallCaptured {
    time: std::time::SystemTime,
    spans: Vec<std::sync::Arc<SpanData>>,
    line: CallLine,
}

impl From<CallCaptured> for Captured {
    /// The fields the call's tracing event would have had, in the same order.
    fn from(c: CallCaptured) -> Self {
        let CallLine {
            driver_type,
            operation,
            error,
            duration_ms,
        } = c.line;
        let mut own: Vec<(&'static str, Value)> = Vec::with_capacity(6);
        own.push(("message", CALL_MESSAGE.into()));
        own.push(("driver_type", driver_type.into()));
        own.push(("operation", operation.into()));
        match error {
            None => own.push(("result", "ok".into())),
            Some(e) => {
                own.push(("result", "error".into()));
                own.push(("error", e.into()));
            }
        }
        let duration = serde_json::Number::from_f64(duration_ms)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(duration_ms.to_string()));
        own.push(("duration_ms", duration));
        Captured {
            time: c.time,
            level: tracing::Level::INFO,
            target: CALL_TARGET,
            spans: c.spans,
            own,
        }
    }
}

/// A driver's log line as [`queue_driver_line`] takes it on the logging thread.
struct DriverCaptured {
    time: std::time::SystemTime,
    level: tracing::Level,
    spans: Vec<std::sync::Arc<SpanData>>,
    /// `[driver.NAME] message`.
    message: String,
}

impl From<DriverCaptured> for Captured {
    /// The fields the line's tracing event would have had: its message.
    fn from(d: DriverCaptured) -> Self {
        Captured {
            time: d.time,
            level: d.level,
            target: DRIVER_TARGET,
            spans: d.spans,
            own: vec![("message", d.message.into())],
        }
    }
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: format::Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let object = self.object(Captured::of(event, ctx.event_scope()));
        let line = serde_json::to_string(&object).map_err(|_| fmt::Error)?;
        writeln!(writer, "{line}")
    }
}

/// The layer of [`init_json`]: takes each event (its fields and its spans' snapshots) on the
/// thread that logs it and queues it; the [`LineQueue`]'s thread formats and writes the lines,
/// in order, in batches. A driver call's lines thus cost its thread no formatting and no
/// write to stderr.
struct JsonLayer {
    lines: JsonLines,
    queue: std::sync::Arc<LineQueue>,
    /// What its filter wants of a driver call's lines, when [`init_json`] asked it.
    wanted: std::sync::Arc<std::sync::OnceLock<Wanted>>,
}

impl JsonLayer {
    fn new(lines: JsonLines, queue: std::sync::Arc<LineQueue>) -> Self {
        JSON_LAYERS.store(true, std::sync::atomic::Ordering::Relaxed);
        JsonLayer {
            lines,
            queue,
            wanted: Default::default(),
        }
    }
}

/// What the filter of [`init_json`]'s subscriber lets through of the lines a driver call
/// makes, asked once when it is installed: its directives stay as they are from then on, so
/// a call need not ask it again (asking costs as much as queueing the line). Not kept when
/// a directive names a span: those answer line by line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wanted {
    /// Driver call lines ([`CALL_TARGET`] at INFO).
    call: bool,
    /// A driver's own lines ([`DRIVER_TARGET`]) at WARN, INFO and DEBUG.
    driver: [bool; 3],
}

impl Wanted {
    /// Asks this thread's subscriber.
    fn ask() -> Self {
        use tracing::Level;
        Wanted {
            call: tracing::enabled!(target: CALL_TARGET, Level::INFO),
            driver: [
                tracing::enabled!(target: DRIVER_TARGET, Level::WARN),
                tracing::enabled!(target: DRIVER_TARGET, Level::INFO),
                tracing::enabled!(target: DRIVER_TARGET, Level::DEBUG),
            ],
        }
    }

    /// Whether a driver's line at `level` is wanted (`None`: not asked for that level).
    fn driver(&self, level: tracing::Level) -> Option<bool> {
        match level {
            tracing::Level::WARN => Some(self.driver[0]),
            tracing::Level::INFO => Some(self.driver[1]),
            tracing::Level::DEBUG => Some(self.driver[2]),
            _ => None,
        }
    }
}

impl<S> Layer<S> for JsonLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        self.queue.push(Pending::Event(
            self.lines.clone(),
            Captured::of(event, ctx.event_scope(event)),
        ));
    }
}

/// A line waiting for the writer thread.
enum Pending {
    /// An event, formatted by the writer.
    Event(JsonLines, Captured),
    /// A driver call's line ([`queue_call_line`]), formatted by the writer.
    Call(JsonLines, CallCaptured),
    /// A driver's log line ([`queue_driver_line`]), formatted by the writer.
    Driver(JsonLines, DriverCaptured),
    /// A line already formatted (without its newline).
    Text(String),
}

/// How many lines may wait for the writer; a logging thread that finds the queue full waits
/// for room (as it would wait for a full stderr pipe).
const QUEUE_BOUND: usize = 16_384;

/// The lines of [`init_json`] on their way to stderr, and the thread that writes them.
///
/// The writer takes every waiting line at once, formats them and writes them with one write.
/// While lines keep coming it looks for more every millisecond on its own, so a busy logging
/// thread never has to wake it; once idle for a while it sleeps until the next line wakes it.
struct LineQueue {
    state: std::sync::Mutex<QueueState>,
    /// Signalled when lines were written (room in the queue, a flush done).
    written: std::sync::Condvar,
    /// The writer thread, to wake it from its idle sleep.
    writer: std::sync::OnceLock<std::thread::Thread>,
    /// Whether the writer sleeps until woken (else it looks again within a millisecond).
    asleep: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct QueueState {
    lines: std::collections::VecDeque<Pending>,
    /// Lines queued and lines written since the start (a flush waits for the one to reach the
    /// other).
    queued: u64,
    done: u64,
    /// The writer is gone (it could not be started): lines are written by the logging thread.
    no_writer: bool,
}

impl LineQueue {
    fn start() -> std::sync::Arc<Self> {
        Self::start_to(std::io::stderr())
    }

    /// A queue whose thread writes to `out`.
    fn start_to(mut out: impl std::io::Write + Send + 'static) -> std::sync::Arc<Self> {
        let q = std::sync::Arc::new(LineQueue {
            state: Default::default(),
            written: Default::default(),
            writer: Default::default(),
            asleep: Default::default(),
        });
        let worker = q.clone();
        match std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || worker.run(&mut out))
        {
            Ok(handle) => {
                let _ = q.writer.set(handle.thread().clone());
            }
            Err(_) => {
                use crate::sync::LockExt;
                q.state.lock_or_recover().no_writer = true;
            }
        }
        q
    }

    fn push(&self, line: Pending) {
        use crate::sync::LockExt;
        let mut state = self.state.lock_or_recover();
        if state.no_writer {
            drop(state);
            let mut out = Vec::new();
            write_one(line, &mut out);
            let _ = std::io::Write::write_all(&mut std::io::stderr(), &out);
            return;
        }
        while state.lines.len() >= QUEUE_BOUND {
            self.wake();
            state = self
                .written
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        state.lines.push_back(line);
        state.queued += 1;
        drop(state);
        if self.asleep.load(std::sync::atomic::Ordering::SeqCst) {
            self.wake();
        }
    }

    fn wake(&self) {
        if let Some(t) = self.writer.get() {
            t.unpark();
        }
    }

    /// Waits until every line queued before the call is written, or `limit` passed.
    fn flush(&self, limit: std::time::Duration) {
        use crate::sync::LockExt;
        let deadline = std::time::Instant::now() + limit;
        let mut state = self.state.lock_or_recover();
        let target = state.queued;
        while state.done < target && !state.no_writer {
            self.wake();
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            state = self
                .written
                .wait_timeout(state, left.min(std::time::Duration::from_millis(50)))
                .map(|(s, _)| s)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// The writer thread: batches of lines to `out` until the process ends.
    fn run(&self, out: &mut dyn std::io::Write) {
        use crate::sync::LockExt;
        use std::sync::atomic::Ordering;
        /// Empty looks (a millisecond apart) before the writer sleeps until woken.
        const IDLE_LOOKS: u32 = 100;
        let mut buf = Vec::with_capacity(64 * 1024);
        let mut idle = 0u32;
        loop {
            let batch = std::mem::take(&mut self.state.lock_or_recover().lines);
            if batch.is_empty() {
                idle += 1;
                if idle < IDLE_LOOKS {
                    std::thread::park_timeout(std::time::Duration::from_millis(1));
                } else {
                    self.asleep.store(true, Ordering::SeqCst);
                    // A line queued before `asleep` was seen set is in the queue now.
                    if self.state.lock_or_recover().lines.is_empty() {
                        std::thread::park();
                    }
                    self.asleep.store(false, Ordering::SeqCst);
                    idle = 0;
                }
                continue;
            }
            idle = 0;
            let n = batch.len() as u64;
            for line in batch {
                write_one(line, &mut buf);
            }
            let _ = out.write_all(&buf);
            let _ = out.flush();
            buf.clear();
            if buf.capacity() > 1024 * 1024 {
                buf.shrink_to(64 * 1024);
            }
            self.state.lock_or_recover().done += n;
            self.written.notify_all();
        }
    }
}

fn write_one(line: Pending, out: &mut Vec<u8>) {
    match line {
        Pending::Event(lines, e) => lines.line(e, out),
        Pending::Call(lines, c) => lines.line(c.into(), out),
        Pending::Driver(lines, d) => lines.line(d.into(), out),
        Pending::Text(t) => {
            out.extend_from_slice(t.as_bytes());
            out.push(b'\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::prelude::*;

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn lines(f: impl FnOnce()) -> Vec<Value> {
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::registry().with(SpanFields).with(
            tracing_subscriber::fmt::layer()
                .event_format(JsonLines::new("exporter"))
                .with_writer(move || buf.clone()),
        );
        tracing::subscriber::with_default(subscriber, f);
        parsed(&out)
    }

    /// What `buf` holds, one JSON object a line.
    fn parsed(buf: &Buf) -> Vec<Value> {
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }

    #[test]
    fn span_and_event_fields_are_at_the_top_level_inner_ones_winning() {
        let got = lines(|| {
            let lease = tracing::info_span!("lease", lease_id = "l-1", client = "ci", n = 1u64);
            let _a = lease.enter();
            let call = tracing::info_span!("call", driver_type = "MockPower", n = 2u64);
            let _b = call.enter();
            tracing::info!(
                operation = "on",
                result = "ok",
                duration_ms = 3.5,
                "driver call"
            );
        });
        assert_eq!(got.len(), 1);
        let o = &got[0];
        assert_eq!(o["level"], "INFO");
        assert_eq!(o["component"], "exporter");
        assert_eq!(o["message"], "driver call");
        assert_eq!(o["lease_id"], "l-1");
        assert_eq!(o["client"], "ci");
        assert_eq!(o["driver_type"], "MockPower");
        assert_eq!(o["operation"], "on");
        assert_eq!(o["duration_ms"], 3.5);
        assert_eq!(o["n"], 2, "the inner span's field wins");
        let ts = o["timestamp"].as_str().unwrap();
        assert!(ts.ends_with('Z') && ts.contains('T'), "{ts}");
    }

    #[test]
    fn a_lease_context_becomes_fields_of_their_own_never_over_the_lines_own() {
        let got = lines(|| {
            let lease = lease_span("l-3", &[("build_id", "123"), ("lease_id", "forged")]);
            let _a = lease.enter();
            tracing::info!("driver call");
        });
        assert_eq!(got[0]["build_id"], "123");
        assert_eq!(got[0]["lease_id"], "l-3");
        assert!(got[0].get(LEASE_CONTEXT_FIELD).is_none(), "{}", got[0]);
    }

    /// A lease's span, `lease_id` and its `context` as [`LEASE_CONTEXT_FIELD`], as the
    /// exporter makes it.
    fn lease_span(lease_id: &str, context: &[(&str, &str)]) -> tracing::Span {
        let context = context
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        tracing::info_span!(
            "lease",
            lease_id,
            { LEASE_CONTEXT_FIELD } = context_field(&context).as_str()
        )
    }

    /// The JSON lines written through the line queue while `run` logs (given the queue),
    /// one object a line, once the queue is flushed.
    fn queued_lines(run: impl FnOnce(&LineQueue)) -> Vec<Value> {
        let buf = Buf::default();
        let queue = LineQueue::start_to(buf.clone());
        let layer = JsonLayer::new(JsonLines::new("exporter"), queue.clone());
        let subscriber = tracing_subscriber::registry().with(SpanFields).with(layer);
        tracing::subscriber::with_default(subscriber, || run(&queue));
        queue.flush(std::time::Duration::from_secs(30));
        parsed(&buf)
    }

    /// [`queued_lines`] through [`init_json`]'s own subscriber ([`json_stack`], everything
    /// enabled), its JSON layer keeping `wanted` as its filter's answers.
    fn queued_lines_wanting(wanted: Wanted, run: impl FnOnce(&LineQueue)) -> Vec<Value> {
        let buf = Buf::default();
        let queue = LineQueue::start_to(buf.clone());
        let layer = JsonLayer::new(JsonLines::new("exporter"), queue.clone());
        layer.wanted.set(wanted).unwrap();
        let subscriber = json_stack(tracing_subscriber::EnvFilter::new("trace"), layer);
        tracing::subscriber::with_default(subscriber, || run(&queue));
        queue.flush(std::time::Duration::from_secs(30));
        parsed(&buf)
    }

    #[test]
    fn queued_lines_are_written_in_order_by_the_writer_and_a_flush_waits_for_them() {
        let lines = queued_lines(|queue| {
            let lease = tracing::info_span!("lease", lease_id = "l-9");
            let _a = lease.enter();
            for n in 0..3000u64 {
                tracing::info!(n, "driver call");
                if n == 1500 {
                    queue.push(Pending::Text("{\"said\":true}".into()));
                }
            }
            // The span's field changes after the lines were queued: they keep the old value.
            lease.record("lease_id", "l-10");
            tracing::info!(n = 3000u64, "after");
        });
        assert_eq!(lines.len(), 3002, "every line, once");
        assert_eq!(lines[1501], serde_json::json!({"said": true}));
        let ns: Vec<u64> = lines
            .iter()
            .filter_map(|l| l.get("n").and_then(Value::as_u64))
            .collect();
        assert_eq!(ns, (0..=3000).collect::<Vec<_>>(), "in order");
        assert_eq!(lines[0]["lease_id"], "l-9");
        assert_eq!(lines[3001]["lease_id"], "l-10");
        assert_eq!(lines[3001]["message"], "after");
    }

    #[test]
    fn a_queued_call_line_is_the_line_its_event_would_be_and_other_subscribers_get_it_back() {
        let call = |error: Option<&str>| CallLine {
            driver_type: "MockPower",
            operation: "on".into(),
            error: error.map(str::to_string),
            duration_ms: 0.25,
        };
        let mut got = queued_lines(|_| {
            let lease = lease_span("l-4", &[("build_id", "7")]);
            assert!(queue_call_line(&lease, call(None)).is_ok());
            assert!(queue_call_line(&lease, call(Some("stuck: relay"))).is_ok());
            assert!(queue_call_line(&tracing::Span::none(), call(None)).is_ok());
            tracing::info!(
                target: "jumpstarter::driver_call",
                parent: &lease,
                driver_type = "MockPower",
                operation = "on",
                result = "ok",
                duration_ms = 0.25,
                "driver call"
            );
        });
        assert_eq!(got.len(), 4, "{got:?}");
        for l in &mut got {
            l.as_object_mut().unwrap().remove("timestamp").unwrap();
        }
        assert_eq!(got[0], got[3], "as its event");
        assert_eq!(
            got[0],
            serde_json::json!({"level": "INFO", "component": "exporter",
                "target": CALL_TARGET, "message": CALL_MESSAGE, "lease_id": "l-4",
                "build_id": "7", "driver_type": "MockPower", "operation": "on",
                "result": "ok", "duration_ms": 0.25})
        );
        assert_eq!(got[1]["result"], "error");
        assert_eq!(got[1]["error"], "stuck: relay");
        assert!(got[2].get("lease_id").is_none(), "{}", got[2]);
        // Another subscriber logs it itself.
        let back = lines(|| {
            let back = queue_call_line(&tracing::Span::none(), call(None));
            assert_eq!(back.map_err(|l| l.operation), Err("on".to_string()));
        });
        assert!(back.is_empty());
    }

    #[test]
    fn a_queued_driver_line_is_the_line_its_event_would_be_and_other_subscribers_get_it_back() {
        let mut got = queued_lines(|_| {
            let lease = lease_span("l-5", &[("build_id", "7")]);
            let in_lease = lease.enter();
            let call = tracing::info_span!("call", driver_type = "MockPower");
            let in_call = call.enter();
            let (driver, message) = ("MockPower", "Power \"on\"");
            assert!(queue_driver_line(tracing::Level::WARN, driver, message));
            tracing::warn!(target: DRIVER_TARGET, "[driver.{driver}] {message}");
            drop(in_call);
            drop(in_lease);
            assert!(queue_driver_line(tracing::Level::DEBUG, driver, "no lease"));
        });
        assert_eq!(got.len(), 3, "{got:?}");
        for l in &mut got {
            l.as_object_mut().unwrap().remove("timestamp").unwrap();
        }
        assert_eq!(got[0], got[1], "as its event");
        assert_eq!(
            got[0],
            serde_json::json!({"level": "WARN", "component": "exporter", "target": "driver",
                "message": "[driver.MockPower] Power \"on\"", "lease_id": "l-5",
                "build_id": "7", "driver_type": "MockPower"})
        );
        assert_eq!(
            got[2],
            serde_json::json!({"level": "DEBUG", "component": "exporter", "target": "driver",
                "message": "[driver.MockPower] no lease"})
        );
        // Another subscriber logs it itself.
        let back = lines(|| assert!(!queue_driver_line(tracing::Level::INFO, "MockPower", "on")));
        assert!(back.is_empty());
    }

    #[test]
    fn a_field_recorded_later_is_seen_and_quotes_are_escaped() {
        let got = lines(|| {
            let lease =
                tracing::info_span!("lease", lease_id = "l-2", exporter = tracing::field::Empty);
            lease.record("exporter", "board \"1\"");
            let _a = lease.enter();
            tracing::warn!("line\nwith \"quotes\"");
        });
        assert_eq!(got[0]["exporter"], "board \"1\"");
        assert_eq!(got[0]["message"], "line\nwith \"quotes\"");
        assert_eq!(got[0]["level"], "WARN");
    }

    #[test]
    fn kept_answers_route_a_calls_lines_without_asking_the_filter() {
        let call = || CallLine {
            driver_type: "MockPower",
            operation: "on".into(),
            error: None,
            duration_ms: 0.5,
        };
        let wanted = Wanted {
            call: true,
            driver: [true, false, true],
        };
        let got = queued_lines_wanting(wanted, |_| {
            // The spans are found through the layers under the JSON layer, not at the bottom.
            tracing::dispatcher::get_default(|d| assert!(d.downcast_ref::<JsonInner>().is_some()));
            let lease = tracing::info_span!("lease", lease_id = "l-6");
            let _in = lease.enter();
            match call_lines() {
                CallLines::Queued(q) => q.push(&lease, call()),
                other => panic!("{other:?}"),
            }
            assert_eq!(
                queue_wanted_driver_line(tracing::Level::INFO, "MockPower", "not wanted"),
                Some(false)
            );
            assert_eq!(
                queue_wanted_driver_line(tracing::Level::WARN, "MockPower", "hot"),
                Some(true)
            );
            // A level it was not asked about: the caller asks the filter.
            assert_eq!(
                queue_wanted_driver_line(tracing::Level::ERROR, "MockPower", "x"),
                None
            );
        });
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0]["operation"], "on");
        assert_eq!(got[0]["lease_id"], "l-6");
        assert_eq!(got[1]["message"], "[driver.MockPower] hot");
        assert_eq!(got[1]["lease_id"], "l-6");
        // Call lines not wanted: off, and nothing is queued.
        let none = Wanted {
            call: false,
            driver: [false; 3],
        };
        let got = queued_lines_wanting(none, |_| {
            assert!(matches!(call_lines(), CallLines::Off));
            assert_eq!(
                queue_wanted_driver_line(tracing::Level::WARN, "MockPower", "x"),
                Some(false)
            );
        });
        assert!(got.is_empty(), "{got:?}");
    }

    #[test]
    fn without_kept_answers_the_filter_is_asked_at_each_line() {
        // A JSON layer that keeps no answer, and another subscriber: the caller asks.
        queued_lines(|_| {
            assert!(matches!(call_lines(), CallLines::Logged));
            assert_eq!(
                queue_wanted_driver_line(tracing::Level::WARN, "MockPower", "x"),
                None
            );
        });
        lines(|| assert!(matches!(call_lines(), CallLines::Logged)));
        let quiet = tracing_subscriber::registry().with(tracing_subscriber::EnvFilter::new("warn"));
        tracing::subscriber::with_default(quiet, || {
            assert!(matches!(call_lines(), CallLines::Off));
        });
    }

    #[test]
    fn the_filter_is_asked_once_for_each_line_a_call_makes() {
        let ask = |directives: &str| {
            let filter = tracing_subscriber::EnvFilter::new(directives);
            let fixed = answers_fixed(&filter);
            let subscriber = tracing_subscriber::registry().with(filter);
            (
                fixed,
                tracing::subscriber::with_default(subscriber, Wanted::ask),
            )
        };
        assert_eq!(
            ask("warn,driver=info"),
            (
                true,
                Wanted {
                    call: false,
                    driver: [true, true, false]
                }
            )
        );
        assert_eq!(
            ask("warn,driver=debug,jumpstarter::driver_call=info"),
            (
                true,
                Wanted {
                    call: true,
                    driver: [true, true, true]
                }
            )
        );
        // A directive naming a span answers line by line: nothing is kept.
        assert!(!ask("warn,[lease{lease_id=l-1}]=debug").0);
    }
}
