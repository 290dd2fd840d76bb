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

/// Installs [`JsonLines`] of `component` on stderr with `filter` (what [`init`] does with
/// JSON, for a binary that picks its own filter; with traces as [`init`]). Does nothing if a
/// subscriber is installed.
pub fn init_json(component: &'static str, filter: tracing_subscriber::EnvFilter) {
    use tracing_subscriber::prelude::*;
    let _ = JSON_COMPONENT.set(component);
    let _ = tracing_subscriber::registry()
        .with(crate::telemetry::with_trace_spans(filter))
        .with(SpanFields)
        .with(
            tracing_subscriber::fmt::layer()
                .event_format(JsonLines::new(component))
                .with_writer(std::io::stderr),
        )
        .with(crate::telemetry::layer())
        .try_init();
}

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
            eprintln!("{}", Value::Object(out));
        }
    }
}

fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| now.unix_timestamp().to_string())
}

/// The fields of a span, kept as JSON values by [`SpanFields`].
#[derive(Debug, Default)]
struct SpanJson(Map<String, Value>);

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
        let mut fields = SpanJson::default();
        attrs.record(&mut JsonVisitor(&mut fields.0));
        span.extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(fields) = ext.get_mut::<SpanJson>() {
            values.record(&mut JsonVisitor(&mut fields.0));
        }
    }
}

/// Records fields into a JSON map: numbers and booleans as such, the rest as strings.
struct JsonVisitor<'a>(&'a mut Map<String, Value>);

impl Visit for JsonVisitor<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let v = serde_json::Number::from_f64(value)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(value.to_string()));
        self.0.insert(field.name().to_string(), v);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().to_string(), crate::error_chain(value).into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}").into());
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

    /// The object for `event` in the spans `scope` holds (outermost first).
    fn object(&self, event: &Event<'_>, spans: Vec<Map<String, Value>>) -> Map<String, Value> {
        let mut out = Map::new();
        out.insert("timestamp".into(), now_rfc3339().into());
        out.insert(
            "level".into(),
            event.metadata().level().as_str().to_string().into(),
        );
        // The in-process router of a controller writes as the router it is.
        let target = event.metadata().target();
        let component = if target.starts_with("jumpstarter_router") {
            "router"
        } else {
            self.component
        };
        out.insert("component".into(), component.into());
        out.insert("target".into(), event.metadata().target().into());
        let mut context = Map::new();
        for mut fields in spans {
            if let Some(Value::String(c)) = fields.remove(LEASE_CONTEXT_FIELD)
                && let Ok(Value::Object(entries)) = serde_json::from_str::<Value>(&c)
            {
                context.extend(entries);
            }
            out.extend(fields);
        }
        let mut own = Map::new();
        event.record(&mut JsonVisitor(&mut own));
        out.extend(own);
        for (k, v) in context {
            out.entry(k).or_insert(v);
        }
        out
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
        let spans = ctx
            .event_scope()
            .map(|scope| {
                scope
                    .from_root()
                    .filter_map(|span| span.extensions().get::<SpanJson>().map(|f| f.0.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let object = self.object(event, spans);
        let line = serde_json::to_string(&object).map_err(|_| fmt::Error)?;
        writeln!(writer, "{line}")
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
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
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
        let context = [("build_id", "123"), ("lease_id", "forged")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        let got = lines(|| {
            let lease = tracing::info_span!(
                "lease",
                lease_id = "l-3",
                { LEASE_CONTEXT_FIELD } = context_field(&context).as_str()
            );
            let _a = lease.enter();
            tracing::info!("driver call");
        });
        assert_eq!(got[0]["build_id"], "123");
        assert_eq!(got[0]["lease_id"], "l-3");
        assert!(got[0].get(LEASE_CONTEXT_FIELD).is_none(), "{}", got[0]);
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
}
