//! Output of `jmp` commands: plain tables, `describe` views, `-o json|yaml|name|path`, and
//! the time and duration formats people see.
//!
//! Tables separate columns with two spaces and pad every column but the last, as the seed
//! walkthrough shows (`NAME                 LABELS`). Describe views align each group of
//! fields on its longest key plus two spaces, the way `kubectl describe` does.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use base64::Engine;
use jiff::{Timestamp, tz::TimeZone};
use serde::Serialize;

/// The `-o` modes of upstream's CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// The human view (table or describe).
    Plain,
    /// JSON, 4-space indent (pydantic's `model_dump_json(indent=4)`).
    Json,
    /// YAML with sorted keys (`yaml.safe_dump`).
    Yaml,
    /// One name per line.
    Name,
    /// One file path per line.
    Path,
}

impl OutputMode {
    /// From the value of `-o` (already restricted by clap to the modes a command offers).
    pub fn from_flag(flag: Option<&str>) -> Result<Self> {
        Ok(match flag {
            None => Self::Plain,
            Some("json") => Self::Json,
            Some("yaml") => Self::Yaml,
            Some("name") => Self::Name,
            Some("path") => Self::Path,
            Some(other) => bail!("unknown output mode {other:?} (use json, yaml, name or path)"),
        })
    }
}

/// JSON text of a value with a 4-space indent, as upstream prints it.
pub fn to_json<T: Serialize>(value: &T) -> Result<String> {
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    value
        .serialize(&mut ser)
        .context("cannot encode the output as JSON")?;
    String::from_utf8(buf).context("JSON output is not UTF-8")
}

/// YAML text of a value with keys sorted at every level, as upstream's `yaml.safe_dump`.
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String> {
    let json = serde_json::to_value(value).context("cannot encode the output")?;
    let sorted = sort_keys(json);
    serde_saphyr::to_string(&sorted).context("cannot encode the output as YAML")
}

fn sort_keys(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(map) => {
            let sorted: BTreeMap<String, serde_json::Value> =
                map.into_iter().map(|(k, v)| (k, sort_keys(v))).collect();
            serde_json::Value::Object(sorted.into_iter().collect())
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sort_keys).collect())
        }
        other => other,
    }
}

/// Prints a value as JSON or YAML (the caller handles the other modes).
pub fn print_structured<T: Serialize>(mode: OutputMode, value: &T) -> Result<()> {
    match mode {
        OutputMode::Json => println!("{}", to_json(value)?),
        OutputMode::Yaml => print!("{}", ensure_newline(to_yaml(value)?)),
        _ => bail!("internal: {mode:?} is not a structured output mode"),
    }
    Ok(())
}

fn ensure_newline(mut s: String) -> String {
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

/// A plain table: headers and rows of cells.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    /// Column headers.
    pub headers: Vec<String>,
    /// Rows; each has one cell per header.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these headers and no rows.
    pub fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Self {
        Self {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// The table's text: columns two spaces apart, the last one unpadded, every line
    /// prefixed with `indent` spaces and ended with a newline.
    pub fn render(&self, indent: usize) -> String {
        let cols = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(cols) {
                widths[i] = widths[i].max(width(cell));
            }
        }
        let line = |cells: &[String]| {
            let mut s = " ".repeat(indent);
            for (i, w) in widths.iter().enumerate() {
                let cell = cells.get(i).map(String::as_str).unwrap_or("");
                s.push_str(cell);
                if i + 1 < cols {
                    s.push_str(&" ".repeat(w - width(cell) + 2));
                }
            }
            let mut s = s.trim_end().to_string();
            s.push('\n');
            s
        };
        let mut out = line(&self.headers);
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }

    /// Like [`Self::render`], with a dashed line under the headers (the Conditions table of
    /// `describe lease`).
    pub fn render_underlined(&self, indent: usize) -> String {
        let mut with_rule = self.clone();
        let rule: Vec<String> = self.headers.iter().map(|h| "-".repeat(width(h))).collect();
        with_rule.rows.insert(0, rule);
        with_rule.render(indent)
    }
}

fn width(s: &str) -> usize {
    s.chars().count()
}

/// A `describe` view being built.
#[derive(Debug, Default)]
pub struct Describe {
    out: String,
}

impl Describe {
    /// An empty view.
    pub fn new() -> Self {
        Self::default()
    }

    /// A group of `Key:  value` lines aligned on the longest key plus two spaces.
    pub fn fields(&mut self, indent: usize, fields: &[(&str, String)]) {
        let key_width = fields.iter().map(|(k, _)| width(k) + 1).max().unwrap_or(0);
        for (k, v) in fields {
            let key = format!("{k}:");
            let pad = key_width - width(&key) + 2;
            self.out.push_str(&format!(
                "{}{key}{}{v}\n",
                " ".repeat(indent),
                " ".repeat(pad)
            ));
        }
    }

    /// One line, as is.
    pub fn line(&mut self, indent: usize, text: &str) {
        self.out
            .push_str(&format!("{}{}\n", " ".repeat(indent), text.trim_end()));
    }

    /// A `Title:` line followed by one indented `k=v` line per entry, or `Title:  <none>`.
    pub fn map_section(&mut self, title: &str, map: &BTreeMap<String, String>) {
        if map.is_empty() {
            self.fields(0, &[(title, "<none>".into())]);
        } else {
            self.line(0, &format!("{title}:"));
            for (k, v) in map {
                self.line(2, &format!("{k}={v}"));
            }
        }
    }

    /// A pre-rendered block (e.g. a table).
    pub fn raw(&mut self, text: &str) {
        self.out.push_str(text);
    }

    /// The finished text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// `yes` / `no`.
pub fn yes_no(b: bool) -> String {
    if b { "yes".into() } else { "no".into() }
}

/// `k=v,k2=v2` in key order (the LABELS column).
pub fn labels_text(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A timestamp in a time zone with its abbreviation: `2026-08-31 10:04:36 EDT`.
pub fn format_time(ts: Timestamp, tz: &TimeZone) -> String {
    ts.to_zoned(tz.clone())
        .strftime("%Y-%m-%d %H:%M:%S %Z")
        .to_string()
}

/// A timestamp in UTC: `2026-08-31 14:04:36 UTC`.
pub fn format_utc(ts: Timestamp) -> String {
    format_time(ts, &TimeZone::UTC)
}

/// A protobuf timestamp as a jiff one (`None` when out of range).
pub fn timestamp(t: &prost_types::Timestamp) -> Option<Timestamp> {
    Timestamp::new(t.seconds, t.nanos).ok()
}

/// A protobuf duration in seconds (with fractions).
pub fn duration_secs(d: &prost_types::Duration) -> f64 {
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

/// A duration as Python prints a `timedelta`: `0:05:00`, `1 day, 2:00:00`,
/// `0:00:01.500000`.
pub fn format_timedelta(secs: f64) -> String {
    let negative = secs < 0.0;
    let micros_total = (secs.abs() * 1e6).round() as u128;
    let micros = micros_total % 1_000_000;
    let whole = micros_total / 1_000_000;
    let days = whole / 86_400;
    let rest = whole % 86_400;
    let (h, m, s) = (rest / 3600, rest % 3600 / 60, rest % 60);
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    if days > 0 {
        out.push_str(&format!("{days} day{}, ", if days == 1 { "" } else { "s" }));
    }
    out.push_str(&format!("{h}:{m:02}:{s:02}"));
    if micros > 0 {
        out.push_str(&format!(".{micros:06}"));
    }
    out
}

/// `8723h 53m` (hours and minutes of a span of seconds, never negative).
pub fn format_hours_minutes(secs: i64) -> String {
    let secs = secs.max(0);
    format!("{}h {}m", secs / 3600, secs % 3600 / 60)
}

/// A short age like kubectl's: `45s`, `12m`, `5h`, `3d`.
pub fn format_age(secs: i64) -> String {
    let secs = secs.max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// The `exp` claim of a JWT, read without verifying the signature (only to tell the user
/// when their token expires). `None` if the token is not a JWT or has no `exp`.
pub fn jwt_expiry(token: &str) -> Option<Timestamp> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?;
    let secs = exp.as_i64().or_else(|| exp.as_f64().map(|f| f as i64))?;
    Timestamp::from_second(secs).ok()
}

/// The `Token:` status line in upstream's words: `Valid (8723h 53m remaining)`, `EXPIRED (2h 5m ago)`.
pub fn token_status(expiry: Timestamp, now: Timestamp) -> String {
    let left = expiry.as_second() - now.as_second();
    if left > 0 {
        format!("Valid ({} remaining)", format_hours_minutes(left))
    } else {
        format!("EXPIRED ({} ago)", format_hours_minutes(-left))
    }
}

/// The last segment of a resource name (`namespaces/ns/leases/x` -> `x`).
pub fn short_name(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// The namespace of a resource name (`namespaces/ns/...` -> `ns`).
pub fn name_namespace(name: &str) -> Option<&str> {
    let mut parts = name.split('/');
    (parts.next() == Some("namespaces"))
        .then(|| parts.next())
        .flatten()
}

/// An error with its causes, on one line.
pub fn format_error(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_the_seed() {
        let mut t = Table::new(["NAME", "LABELS"]);
        t.row(["example-distributed", "foo=bar"]);
        assert_eq!(
            t.render(0),
            "NAME                 LABELS\nexample-distributed  foo=bar\n"
        );
        // Empty last cells leave no trailing spaces.
        let mut t = Table::new(["A", "B"]);
        t.row(["x", ""]);
        assert_eq!(t.render(0), "A  B\nx\n");
    }

    #[test]
    fn describe_aligns_each_group() {
        let mut d = Describe::new();
        d.fields(
            0,
            &[
                ("Name", "example-distributed".into()),
                ("Namespace", "lab".into()),
            ],
        );
        d.fields(0, &[("Online", "yes".into()), ("Enabled", "yes".into())]);
        d.fields(0, &[("Lease", "<none>".into())]);
        assert_eq!(
            d.finish(),
            "Name:       example-distributed\nNamespace:  lab\nOnline:   yes\nEnabled:  yes\nLease:  <none>\n"
        );
    }

    #[test]
    fn underlined_table() {
        let mut t = Table::new(["Type", "Status"]);
        t.row(["Ready", "True"]);
        assert_eq!(
            t.render_underlined(2),
            "  Type   Status\n  ----   ------\n  Ready  True\n"
        );
    }

    #[test]
    fn timedeltas_print_like_python() {
        assert_eq!(format_timedelta(300.0), "0:05:00");
        assert_eq!(format_timedelta(86_400.0 + 7200.0), "1 day, 2:00:00");
        assert_eq!(format_timedelta(2.0 * 86_400.0), "2 days, 0:00:00");
        assert_eq!(format_timedelta(1.5), "0:00:01.500000");
    }

    #[test]
    fn times_carry_the_zone_abbreviation() {
        let ts: Timestamp = "2026-08-31T14:04:36Z".parse().unwrap();
        assert_eq!(format_utc(ts), "2026-08-31 14:04:36 UTC");
        let ny = TimeZone::get("America/New_York").unwrap();
        assert_eq!(format_time(ts, &ny), "2026-08-31 10:04:36 EDT");
    }

    #[test]
    fn jwt_expiry_is_read_without_verification() {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let token = format!(
            "{}.{}.sig",
            b64(r#"{"alg":"ES256"}"#),
            b64(r#"{"exp":1819591256,"sub":"x"}"#)
        );
        let exp = jwt_expiry(&token).unwrap();
        assert_eq!(format_utc(exp), "2027-08-30 02:00:56 UTC");
        let now = Timestamp::from_second(1819591256 - (8723 * 3600 + 53 * 60 + 10)).unwrap();
        assert_eq!(token_status(exp, now), "Valid (8723h 53m remaining)");
        let later = Timestamp::from_second(1819591256 + 3700).unwrap();
        assert_eq!(token_status(exp, later), "EXPIRED (1h 1m ago)");
        assert_eq!(jwt_expiry("not-a-jwt"), None);
        assert_eq!(jwt_expiry("a.%%%.c"), None);
    }

    #[test]
    fn json_and_yaml_modes() {
        let v = serde_json::json!({"b": 1, "a": {"d": [1], "c": "x"}});
        assert_eq!(
            to_json(&v).unwrap(),
            "{\n    \"a\": {\n        \"c\": \"x\",\n        \"d\": [\n            1\n        ]\n    },\n    \"b\": 1\n}"
        );
        let y = to_yaml(&v).unwrap();
        assert!(y.find("a:").unwrap() < y.find("b:").unwrap(), "{y}");
        assert_eq!(OutputMode::from_flag(None).unwrap(), OutputMode::Plain);
        assert!(OutputMode::from_flag(Some("xml")).is_err());
    }

    #[test]
    fn names_and_ages() {
        assert_eq!(short_name("namespaces/ns/leases/x"), "x");
        assert_eq!(name_namespace("namespaces/ns/leases/x"), Some("ns"));
        assert_eq!(name_namespace("x"), None);
        assert_eq!(format_age(30), "30s");
        assert_eq!(format_age(600), "10m");
        assert_eq!(format_age(3 * 86_400), "3d");
    }
}
