//! Parsers for command-line values: `key=value` labels and tags, selectors and begin times
//! (lease durations are parsed by `jumpstarter_core::client::lease::parse_duration`).

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use jiff::{Timestamp, civil::DateTime, tz::TimeZone};
use jumpstarter_core::labels::{validate_label_value, validate_qualified_name};

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
            validate_qualified_name(k)
                .map_err(|e| anyhow::anyhow!("invalid {what} key {k:?}: {e}"))?;
            validate_label_value(v)
                .map_err(|e| anyhow::anyhow!("invalid {what} value {v:?} for {k:?}: {e}"))?;
            out.insert(k.to_string(), v.to_string());
        }
    }
    Ok(out)
}

/// Parses repeated `--context key=value` flags (one entry each: a value may hold `,`, `/`,
/// `:`); the controller checks the entries themselves (sizes, key characters).
pub fn parse_context(items: &[String]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for item in items {
        let Some((k, v)) = item.split_once('=') else {
            bail!("invalid --context {item:?}: expected key=value");
        };
        let k = k.trim();
        if k.is_empty() {
            bail!("invalid --context {item:?}: the key is empty");
        }
        if out.insert(k.to_string(), v.to_string()).is_some() {
            bail!("invalid --context {item:?}: key {k:?} given twice");
        }
    }
    Ok(out)
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
            .map_err(|e| {
                anyhow::anyhow!(
                    "invalid begin time {text:?}: {e}",
                    e = jumpstarter_core::error_chain(&e)
                )
            })?
            .timestamp()),
        Err(_) => bail!(
            "invalid begin time {text:?}: expected ISO 8601, e.g. 2024-01-01T12:00:00 or \
             2024-01-01T12:00:00Z"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
