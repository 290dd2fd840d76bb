//! Metrics in the OpenMetrics text format (what Prometheus asks for, the format that carries
//! exemplars), shared by the controller, the router and the exporter: a page from a
//! `prometheus-client` registry plus hand-written text, the older Prometheus text format for
//! scrapers that do not accept OpenMetrics, and exemplar label sets kept within OpenMetrics'
//! 128-character limit.

use std::fmt::Write as _;

pub use prometheus_client;
use prometheus_client::registry::Registry;

/// `Content-Type` of an OpenMetrics 1.0 page.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of a page in the Prometheus text format 0.0.4.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// OpenMetrics 1.0's limit on an exemplar's label names and values together, in characters.
pub const EXEMPLAR_MAX_CHARS: usize = 128;

/// The labels of one exemplar (name, escaped value), as the counters and histograms with
/// exemplars take them.
pub type ExemplarLabels = Vec<(String, String)>;

/// Told of every driver call a session serves (see
/// [`crate::server::Session::set_call_observer`]), when it has returned. It runs on the
/// call's task: it must not block or wait.
pub trait CallObserver: Send + Sync {
    /// A call of `operation` on a driver of type `driver_type` (`unknown` for a driver the
    /// session does not have) took `elapsed` and failed with `error`, if it did.
    fn driver_call(
        &self,
        driver_type: &str,
        operation: &str,
        error: Option<&crate::DriverError>,
        elapsed: std::time::Duration,
    );
}

/// Told of the bytes a session's driver and resource streams carry (see
/// [`crate::server::Session::set_stream_observer`]), in batches (see [`ByteCount`]). It runs
/// on the stream's task: it must not block or wait.
pub trait StreamObserver: Send + Sync {
    /// `bytes` more went `direction` (`rx`: from the client into the exporter, `tx`: out to
    /// the client) on a stream of a driver of type `driver_type`.
    fn stream_bytes(&self, driver_type: &str, direction: &'static str, bytes: u64);
}

/// Bytes a [`ByteCount`] holds before telling its observer.
pub const BYTE_COUNT_BATCH: u64 = 64 * 1024;

/// The bytes of one direction of one stream, told to a [`StreamObserver`] every
/// [`BYTE_COUNT_BATCH`] bytes and when dropped (the stream's end).
pub struct ByteCount {
    observer: std::sync::Arc<dyn StreamObserver>,
    driver_type: String,
    direction: &'static str,
    pending: u64,
}

impl ByteCount {
    /// Counts for `observer` the bytes going `direction` on a stream of `driver_type`.
    pub fn new(
        observer: std::sync::Arc<dyn StreamObserver>,
        driver_type: &str,
        direction: &'static str,
    ) -> Self {
        Self {
            observer,
            driver_type: driver_type.to_string(),
            direction,
            pending: 0,
        }
    }

    /// `n` more bytes.
    pub fn add(&mut self, n: usize) {
        self.pending += n as u64;
        if self.pending >= BYTE_COUNT_BATCH {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.pending > 0 {
            self.observer
                .stream_bytes(&self.driver_type, self.direction, self.pending);
            self.pending = 0;
        }
    }
}

impl Drop for ByteCount {
    fn drop(&mut self) {
        self.flush();
    }
}

/// The `error_type` label of a failed driver call: a small fixed set.
pub fn error_type(e: &crate::DriverError) -> &'static str {
    use crate::DriverError as E;
    match e {
        E::MethodNotFound(_) | E::MissingMarker { .. } | E::Unimplemented(_) => "unimplemented",
        E::NotFound(_) | E::UnknownDriver(_) => "not_found",
        E::InvalidArgument(_) | E::Invalid(_) => "invalid_argument",
        E::Timeout(_) => "timeout",
        E::NotReady(_) => "not_ready",
        E::Failed(_) | E::Other(_) => "device_error",
    }
}

/// Whether a failed call named a method or driver the session does not have: its operation
/// is counted as `unknown`, so that callers cannot add label values.
pub fn is_unknown_call(e: &crate::DriverError) -> bool {
    use crate::DriverError as E;
    matches!(
        e,
        E::MethodNotFound(_) | E::MissingMarker { .. } | E::NotFound(_) | E::UnknownDriver(_)
    )
}

/// Whether an `Accept` header asks for OpenMetrics (Prometheus' does).
pub fn accepts_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|part| {
            let mut params = part.split(';');
            let media = params.next().unwrap_or_default().trim();
            media.eq_ignore_ascii_case("application/openmetrics-text")
                && !params.any(|p| p.trim().replace(' ', "") == "q=0")
        })
    })
}

/// A label value as the text formats need it: backslash, double quote and newline escaped
/// (`prometheus-client` writes values as they are).
pub fn label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A label name made valid (`[a-zA-Z_][a-zA-Z0-9_]*`): other characters become `_`; `None`
/// for an empty name.
pub fn label_name(s: &str) -> Option<String> {
    if s.is_empty() {
        return None;
    }
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    Some(out)
}

/// An exemplar's labels from `pairs` in their order (the most important first): each name made
/// valid, each value escaped, a pair with an empty value or a name already taken left out, and
/// a pair that would take the names and values past [`EXEMPLAR_MAX_CHARS`] dropped (later,
/// shorter pairs may still fit).
pub fn exemplar<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> ExemplarLabels {
    let mut out: ExemplarLabels = Vec::new();
    let mut used = 0;
    for (name, value) in pairs {
        let Some(name) = label_name(name) else {
            continue;
        };
        if value.is_empty() || out.iter().any(|(n, _)| *n == name) {
            continue;
        }
        let value = label_value(value);
        let len = name.chars().count() + value.chars().count();
        if used + len > EXEMPLAR_MAX_CHARS {
            continue;
        }
        used += len;
        out.push((name, value));
    }
    out
}

/// An OpenMetrics page: `legacy` (hand-written Prometheus text format, see
/// [`text_to_openmetrics`]) then the metrics of `registries`, then `# EOF`.
pub fn openmetrics_page(registries: &[&Registry], legacy: &str) -> String {
    let mut out = text_to_openmetrics(legacy);
    for r in registries {
        // Writing into a String cannot fail; a metric that fails to encode is left out.
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, r);
    }
    let _ = prometheus_client::encoding::text::encode_eof(&mut out);
    out
}

/// Prometheus text (format 0.0.4) as OpenMetrics without the `# EOF`: a counter's family is
/// named without `_total` in its `# HELP` and `# TYPE` lines, `untyped` is `unknown`.
pub fn text_to_openmetrics(text: &str) -> String {
    let counters: std::collections::HashSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .filter(|n| n.ends_with("_total"))
        .collect();
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let meta = line
            .strip_prefix("# HELP ")
            .map(|r| ("HELP", r))
            .or_else(|| line.strip_prefix("# TYPE ").map(|r| ("TYPE", r)));
        match meta {
            Some((kind, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let name = if counters.contains(name) {
                    name.strip_suffix("_total").unwrap_or(name)
                } else {
                    name
                };
                let tail = if kind == "TYPE" && tail == "untyped" {
                    "unknown"
                } else {
                    tail
                };
                let _ = writeln!(out, "# {kind} {name} {tail}");
            }
            None if line.is_empty() => {}
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// An OpenMetrics page in the Prometheus text format 0.0.4, for scrapers that do not ask for
/// OpenMetrics: exemplars, `# UNIT` and `# EOF` left out, a counter's family named with its
/// `_total`, `unknown` as `untyped`.
pub fn openmetrics_to_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = line
            .strip_prefix("# HELP ")
            .map(|r| ("HELP", r))
            .or_else(|| line.strip_prefix("# TYPE ").map(|r| ("TYPE", r)));
        if let Some((kind, rest)) = meta {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let tail = if kind == "TYPE" && tail == "unknown" {
                "untyped"
            } else {
                tail
            };
            if counters.contains(name) && !name.ends_with("_total") {
                let _ = writeln!(out, "# {kind} {name}_total {tail}");
            } else {
                let _ = writeln!(out, "# {kind} {name} {tail}");
            }
            continue;
        }
        if line.starts_with('#') {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        out.push_str(strip_exemplar(line));
        out.push('\n');
    }
    out
}

/// A sample line without its exemplar (` # {...} value [timestamp]` after the value); the
/// labels are skipped quote-aware, as their values may hold `#`.
fn strip_exemplar(line: &str) -> &str {
    let mut in_quotes = false;
    let mut escaped = false;
    // Labels follow the name directly (`name{...}`); a `{` after a space is the exemplar's.
    let mut labels_done = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .is_none_or(|i| !line[i..].starts_with('{'));
    for (i, c) in line.char_indices() {
        if !labels_done {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_quotes => escaped = true,
                '"' => in_quotes = !in_quotes,
                '}' if !in_quotes => labels_done = true,
                _ => {}
            }
            continue;
        }
        if c == '#' {
            return line[..i].trim_end();
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::{counter::Counter, exemplar::CounterWithExemplar};

    #[test]
    fn exemplars_stay_within_the_openmetrics_limit_in_priority_order() {
        let lease = "01a24e0f-42c4-7096-aaeb-0d323edf902e";
        let long = "x".repeat(100);
        let e = exemplar([
            ("client", "ci"),
            ("lease_id", lease),
            ("build-id", "nightly-42"),
            ("image_digest", long.as_str()),
            ("empty", ""),
            ("client", "again"),
            ("9k", "v"),
        ]);
        let names: Vec<&str> = e.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["client", "lease_id", "build_id", "_9k"]);
        let total: usize = e
            .iter()
            .map(|(n, v)| n.chars().count() + v.chars().count())
            .sum();
        assert!(total <= EXEMPLAR_MAX_CHARS, "{total}");
        // Even one oversized pair is dropped rather than cut.
        assert!(exemplar([("k", long.repeat(2).as_str())]).is_empty());
        // Values are escaped; multibyte characters count as one.
        let e = exemplar([("client", "a\"b\\c\nd"), ("n", &"é".repeat(100))]);
        assert_eq!(e[0].1, "a\\\"b\\\\c\\nd");
        assert_eq!(e[1].1.chars().count(), 100);
    }

    #[test]
    fn accept_header_negotiation() {
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                    version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(accepts_openmetrics(Some(prom)));
        assert!(!accepts_openmetrics(Some("text/plain")));
        assert!(!accepts_openmetrics(Some("*/*")));
        assert!(!accepts_openmetrics(None));
        assert!(!accepts_openmetrics(Some(
            "application/openmetrics-text; q=0, text/plain"
        )));
    }

    #[test]
    fn both_formats_of_one_page() {
        let mut r = Registry::default();
        let c: CounterWithExemplar<ExemplarLabels> = CounterWithExemplar::default();
        r.register("jumpstarter_x", "X things", c.clone());
        c.inc_by(2, Some(exemplar([("lease_id", "l#1")])), None);
        let plain = Counter::<u64>::default();
        r.register("jumpstarter_y", "Y things", plain.clone());
        let legacy = "# HELP old_total Old things.\n# TYPE old_total counter\nold_total 3\n\
                      # TYPE g gauge\ng{l=\"a # {b}\"} 1\n";
        let om = openmetrics_page(&[&r], legacy);
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(om.contains("# TYPE old counter\nold_total 3\n"), "{om}");
        assert!(om.contains("# HELP old Old things.\n"), "{om}");
        assert!(
            om.contains("jumpstarter_x_total 2 # {lease_id=\"l#1\"} 2"),
            "{om}"
        );
        let text = openmetrics_to_text(&om);
        assert!(
            !text.contains("EOF") && !text.contains("lease_id"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE old_total counter\nold_total 3\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE jumpstarter_x_total counter\njumpstarter_x_total 2\n"),
            "{text}"
        );
        assert!(text.contains("g{l=\"a # {b}\"} 1\n"), "{text}");
    }
}
