//! Parsers for command-line values: `key=value` labels and tags, lease durations and begin
//! times.

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use jiff::{Timestamp, civil::DateTime, tz::TimeZone};

/// Parses `key=value` pairs (repeated flags, each possibly comma-separated) into a map,
/// checking keys and values as Kubernetes label rules do. `what` names the flag in errors.
pub fn parse_key_values(items: &[String], what: &str) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for item in items {
        for pair in item.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((k, v)) = pair.split_once('=') else {
                bail!("invalid {what} {pair:?}: expected key=value");
            };
            let (k, v) = (k.trim(), v.trim());
            check_label_key(k).map_err(|e| anyhow::anyhow!("invalid {what} key {k:?}: {e}"))?;
            check_label_value(v)
                .map_err(|e| anyhow::anyhow!("invalid {what} value {v:?} for {k:?}: {e}"))?;
            out.insert(k.to_string(), v.to_string());
        }
    }
    Ok(out)
}

fn is_name_segment(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > max {
        return Err(format!("must be at most {max} characters"));
    }
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if !s.chars().all(ok_char) {
        return Err("may contain only letters, digits, '-', '_' and '.'".into());
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(s.chars().next()) || !alnum(s.chars().last()) {
        return Err("must start and end with a letter or digit".into());
    }
    Ok(())
}

/// A label key: `[prefix/]name`, prefix a DNS subdomain, name at most 63 characters.
pub fn check_label_key(k: &str) -> Result<(), String> {
    let name = match k.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 {
                return Err("the prefix must be 1 to 253 characters".into());
            }
            let ok = prefix.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
            if !ok {
                return Err("the prefix must be a DNS subdomain (e.g. example.com)".into());
            }
            name
        }
        None => k,
    };
    is_name_segment(name, 63)
}

/// A label value: empty, or at most 63 characters of `[A-Za-z0-9._-]` starting and ending
/// with a letter or digit.
pub fn check_label_value(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Ok(());
    }
    is_name_segment(v, 63)
}

/// Joins repeated `-l` flags into one selector string.
pub fn join_selectors(selectors: &[String]) -> String {
    selectors
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses a lease duration in the formats upstream accepts (see
/// [`jumpstarter_core::client::lease::parse_duration`]), refusing zero. Returns seconds.
pub fn parse_positive_duration(text: &str) -> Result<f64> {
    let secs = jumpstarter_core::client::lease::parse_duration(text)?.as_secs_f64();
    if secs <= 0.0 {
        bail!("invalid duration {text:?}: a lease duration must be greater than zero");
    }
    Ok(secs)
}

/// A protobuf duration from seconds.
pub fn proto_duration(secs: f64) -> prost_types::Duration {
    let whole = secs.trunc();
    prost_types::Duration {
        seconds: whole as i64,
        nanos: ((secs - whole) * 1e9).round() as i32,
    }
}

/// Parses `--begin-time`: ISO 8601 with an offset (`2024-01-01T12:00:00Z`) or without one
/// (then in `tz`, the local zone for users).
pub fn parse_begin_time(text: &str, tz: &TimeZone) -> Result<Timestamp> {
    let s = text.trim();
    if let Ok(ts) = s.parse::<Timestamp>() {
        return Ok(ts);
    }
    match s.parse::<DateTime>() {
        Ok(dt) => Ok(dt
            .to_zoned(tz.clone())
            .map_err(|e| anyhow::anyhow!("invalid begin time {text:?}: {e}"))?
            .timestamp()),
        Err(_) => bail!(
            "invalid begin time {text:?}: expected ISO 8601, e.g. 2024-01-01T12:00:00 or \
             2024-01-01T12:00:00Z"
        ),
    }
}

/// A protobuf timestamp.
pub fn proto_timestamp(ts: Timestamp) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ts.as_second(),
        nanos: ts.subsec_nanosecond(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_must_be_positive() {
        assert_eq!(parse_positive_duration("5m").unwrap(), 300.0);
        assert_eq!(parse_positive_duration("1 day, 0:00:10").unwrap(), 86_410.0);
        for bad in ["0", "0s", "PT0S", "-5", "soon", ""] {
            assert!(parse_positive_duration(bad).is_err(), "{bad}");
        }
        let e = parse_positive_duration("0").unwrap_err().to_string();
        assert!(e.contains("greater than zero"), "{e}");
    }

    #[test]
    fn labels_are_checked() {
        let m = parse_key_values(&["foo=bar,a.b/c=".into(), "x=1".into()], "label").unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m["a.b/c"], "");
        for bad in ["foo", "=x", "foo=bar baz", "-a=b", "Foo.Bar/x=y", "a=-b"] {
            let e = parse_key_values(&[bad.into()], "label").unwrap_err();
            assert!(e.to_string().contains("label"), "{bad}: {e}");
        }
    }

    #[test]
    fn begin_times() {
        let utc = TimeZone::UTC;
        let t = parse_begin_time("2024-01-01T12:00:00Z", &utc).unwrap();
        assert_eq!(t.as_second(), 1_704_110_400);
        let ny = TimeZone::get("America/New_York").unwrap();
        let t = parse_begin_time("2024-01-01T12:00:00", &ny).unwrap();
        assert_eq!(t.as_second(), 1_704_110_400 + 5 * 3600);
        assert!(parse_begin_time("tomorrow", &utc).is_err());
        assert_eq!(proto_duration(1.5).nanos, 500_000_000);
    }
}
