//! Printing a lease's gathered log (`jmp get lease NAME --logs`, `jmp admin logs --lease
//! NAME`): the controller's events and the exporter's pushed entries, oldest first, as text
//! or (`-o json`) one JSON object a line with the fields of the JSON logs; and its console
//! transcripts (`--console`): the records the exporter pushed marked `stream=console`.

use std::io::Write;

use anyhow::Result;
use jumpstarter_proto::{ext_v1::LeaseLogs, v1::LogEntry};
use serde_json::{Map, Value};

/// How a lease's log is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One line an entry for a person.
    Text,
    /// One JSON object a line.
    Json,
}

impl LogFormat {
    /// From `-o`: none is text, `json` is JSON.
    pub fn from_flag(flag: Option<&str>) -> Result<Self> {
        match flag {
            None | Some("text") => Ok(Self::Text),
            Some("json") => Ok(Self::Json),
            Some(other) => {
                anyhow::bail!("--output {other:?}: the logs are printed as text or json")
            }
        }
    }
}

fn timestamp(e: &LogEntry) -> String {
    e.timestamp
        .as_ref()
        .and_then(|t| jiff::Timestamp::new(t.seconds, t.nanos).ok())
        .map(|t| format!("{t:.3}"))
        .unwrap_or_default()
}

/// The JSON object of `e` (the JSON logs' field names; its extra fields at the top level,
/// never over the entry's own).
pub fn entry_json(e: &LogEntry) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("timestamp".into(), timestamp(e).into());
    for (k, v) in [
        ("level", e.severity.to_ascii_uppercase()),
        ("component", e.component.clone()),
        ("message", e.message.clone()),
        ("lease_id", e.lease.clone()),
        ("namespace", e.namespace.clone()),
        ("client", e.client.clone()),
        ("exporter", e.exporter.clone()),
        ("driver_type", e.driver_type.clone()),
        ("operation", e.operation.clone()),
        ("result", e.result.clone()),
    ] {
        if !v.is_empty() {
            out.insert(k.into(), v.into());
        }
    }
    let mut extra: Vec<_> = e.extra_fields.iter().collect();
    extra.sort();
    for (k, v) in extra {
        out.entry(k.clone()).or_insert_with(|| v.clone().into());
    }
    out
}

/// The text line of `e`: time, component, message, then its fields as `key=value`.
pub fn entry_text(e: &LogEntry) -> String {
    let mut line = format!("{} {:<10} {}", timestamp(e), e.component, e.message);
    for (k, v) in [
        ("client", &e.client),
        ("exporter", &e.exporter),
        ("driver_type", &e.driver_type),
        ("operation", &e.operation),
        ("result", &e.result),
    ] {
        // An exporter's own entries need not name it on every line.
        let implied = e.component == "exporter" && k == "exporter";
        if !v.is_empty() && !implied {
            line.push_str(&format!(" {k}={v}"));
        }
    }
    let mut extra: Vec<_> = e.extra_fields.iter().collect();
    extra.sort();
    for (k, v) in extra {
        if v.contains(char::is_whitespace) || v.is_empty() {
            line.push_str(&format!(" {k}={v:?}"));
        } else {
            line.push_str(&format!(" {k}={v}"));
        }
    }
    line
}

/// Whether `e` is a record of a console transcript (marked `stream=console`).
pub fn is_console(e: &LogEntry) -> bool {
    e.extra_fields.get("stream").is_some_and(|v| v == "console")
}

fn field<'a>(e: &'a LogEntry, key: &str) -> &'a str {
    e.extra_fields.get(key).map_or("", String::as_str)
}

/// The text line of a console record: time, console, direction and the bytes (escaped as
/// in the transcript file, in quotes).
pub fn console_text(e: &LogEntry) -> String {
    format!(
        "{} {} {} \"{}\"",
        timestamp(e),
        field(e, "console"),
        field(e, "direction"),
        e.message
    )
}

/// The JSON object of a console record: `timestamp`, `lease_id`, `console`, `direction`,
/// `text` (the bytes escaped as in the transcript file).
pub fn console_json(e: &LogEntry) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in [
        ("timestamp", timestamp(e)),
        ("lease_id", e.lease.clone()),
        ("console", field(e, "console").to_string()),
        ("direction", field(e, "direction").to_string()),
        ("text", e.message.clone()),
    ] {
        out.insert(k.into(), v.into());
    }
    out
}

/// Prints the console records among `logs` on stdout in `format`; a note on stderr when
/// entries were dropped.
pub fn print_console(logs: &LeaseLogs, format: LogFormat) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for e in logs.entries.iter().filter(|e| is_console(e)) {
        match format {
            LogFormat::Text => writeln!(out, "{}", console_text(e))?,
            LogFormat::Json => writeln!(out, "{}", Value::Object(console_json(e)))?,
        }
    }
    if logs.dropped > 0 {
        eprintln!(
            "Note: the controller dropped {} entries of this lease (its per-lease bounds)",
            logs.dropped
        );
    }
    Ok(())
}

/// Prints `logs` but the console records on stdout in `format`; a note on stderr when
/// entries were dropped.
pub fn print(logs: &LeaseLogs, format: LogFormat) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for e in logs.entries.iter().filter(|e| !is_console(e)) {
        match format {
            LogFormat::Text => writeln!(out, "{}", entry_text(e))?,
            LogFormat::Json => writeln!(out, "{}", Value::Object(entry_json(e)))?,
        }
    }
    if logs.dropped > 0 {
        eprintln!(
            "Note: the controller dropped {} entries of this lease (its per-lease bounds)",
            logs.dropped
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> LogEntry {
        LogEntry {
            timestamp: Some(prost_types::Timestamp {
                seconds: 1_800_000_000,
                nanos: 5_000_000,
            }),
            severity: "info".into(),
            message: "driver call".into(),
            component: "exporter".into(),
            exporter: "board".into(),
            lease: "l-1".into(),
            client: "ci".into(),
            operation: "on".into(),
            result: "ok".into(),
            driver_type: "MockPower".into(),
            extra_fields: [("build_id", "7"), ("lease_id", "forged")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
            namespace: "default".into(),
        }
    }

    #[test]
    fn json_has_the_json_logs_names_and_the_context_never_over_them() {
        let o = entry_json(&call());
        assert_eq!(o["lease_id"], "l-1");
        assert_eq!(o["level"], "INFO");
        assert_eq!(o["operation"], "on");
        assert_eq!(o["build_id"], "7");
        assert_eq!(o["timestamp"], "2027-01-15T08:00:00.005Z");
    }

    #[test]
    fn text_is_one_line_with_the_fields() {
        assert_eq!(
            entry_text(&call()),
            "2027-01-15T08:00:00.005Z exporter   driver call client=ci driver_type=MockPower \
             operation=on result=ok build_id=7 lease_id=forged"
        );
    }

    #[test]
    fn a_console_record_is_time_console_direction_and_text() {
        let mut e = call();
        e.message = "login: \\r\\n".into();
        e.extra_fields = [
            ("stream", "console"),
            ("console", "serial"),
            ("direction", "board->client"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        assert!(is_console(&e) && !is_console(&call()));
        assert_eq!(
            console_text(&e),
            "2027-01-15T08:00:00.005Z serial board->client \"login: \\r\\n\""
        );
        let o = console_json(&e);
        assert_eq!(o["direction"], "board->client");
        assert_eq!(o["text"], "login: \\r\\n");
        assert_eq!(o["lease_id"], "l-1");
    }

    #[test]
    fn only_text_and_json_are_formats() {
        assert_eq!(LogFormat::from_flag(None).unwrap(), LogFormat::Text);
        assert_eq!(LogFormat::from_flag(Some("json")).unwrap(), LogFormat::Json);
        assert!(LogFormat::from_flag(Some("yaml")).is_err());
    }
}
