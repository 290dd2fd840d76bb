//! Debian's `prometheus` for the metrics end-to-end test (`jumpstarter-cli`'s `metrics::`
//! test starts its own on a loopback port, scraping the controller and `jmp run`, and runs
//! `promtool check metrics`): `prepare` installs the package when it is missing. Also the
//! check of the Grafana dashboard (`deploy/grafana/jumpstarter.json`) against the metrics
//! the docs list.

use std::{path::Path, process::Command};

use anyhow::Result;

/// The Debian package the test needs.
const PACKAGE: &str = "prometheus";

/// Installs `prometheus` (with `promtool`) unless both are there.
pub fn prepare() -> Result<()> {
    if Path::new("/usr/bin/prometheus").exists() && Path::new("/usr/bin/promtool").exists() {
        return Ok(());
    }
    crate::workspace::apt_install(&[PACKAGE], false, "the metrics test needs it")?;
    // The package enables a system Prometheus on port 9090; the test runs its own.
    let _ = Command::new("sh")
        .args([
            "-c",
            "command -v systemctl >/dev/null && systemctl disable --now prometheus",
        ])
        .status();
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The metric names in the table of `docs/observability.md` (first column).
    fn documented(doc: &str) -> BTreeSet<String> {
        doc.lines()
            .filter_map(|l| l.strip_prefix("| `jumpstarter_"))
            .filter_map(|l| l.split('`').next())
            .map(|n| format!("jumpstarter_{n}"))
            .collect()
    }

    /// Every `jumpstarter_...` name in a PromQL expression.
    fn names(expr: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = expr;
        while let Some(at) = rest.find("jumpstarter_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            out.push(tail[..end].to_string());
            rest = &tail[end..];
        }
        out
    }

    #[test]
    fn the_grafana_dashboard_is_json_and_queries_only_documented_metrics() {
        let root = crate::workspace::workspace_root();
        let doc = std::fs::read_to_string(root.join("docs/observability.md")).unwrap();
        let known = documented(&doc);
        assert!(known.contains("jumpstarter_operations_total"), "{known:?}");
        let text = std::fs::read_to_string(root.join("deploy/grafana/jumpstarter.json")).unwrap();
        let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut exprs = Vec::new();
        let mut stack = vec![&dash];
        while let Some(v) = stack.pop() {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(e) = m.get("expr").and_then(|e| e.as_str()) {
                        exprs.push(e.to_string());
                    }
                    stack.extend(m.values());
                }
                serde_json::Value::Array(a) => stack.extend(a),
                _ => {}
            }
        }
        assert!(exprs.len() >= 10, "{exprs:?}");
        for e in &exprs {
            let found = names(e);
            assert!(!found.is_empty(), "no metric in {e:?}");
            for n in found {
                let base = ["_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|s| n.strip_suffix(s))
                    .filter(|b| known.contains(*b))
                    .unwrap_or(&n);
                assert!(
                    known.contains(base),
                    "{e:?} queries {n}, not in the docs' table"
                );
            }
        }
        // What the docs' table names, the code serves (a name dropped from the code must
        // leave the table too).
        for n in &known {
            let family = n.strip_suffix("_total").unwrap_or(n);
            let sources = [
                "jumpstarter-controller/src/metrics.rs",
                "jumpstarter-exporter/src/metrics.rs",
                "jumpstarter-router/src/router.rs",
                "jumpstarter-core/src/server/listener.rs",
            ];
            assert!(
                sources.iter().any(|s| std::fs::read_to_string(root.join(s))
                    .unwrap()
                    .contains(&format!("\"{family}"))
                    || std::fs::read_to_string(root.join(s))
                        .unwrap()
                        .contains(&format!(" {family}"))),
                "{n} is in the docs' table but in no metrics source"
            );
        }
    }
}
