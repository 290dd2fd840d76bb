//! Health checks and quarantine (ours, not upstream's; `docs/hooks.md`), LAVA's health-check
//! idea: the optional `healthCheck` section of an exporter config runs a script between
//! leases every `interval` seconds, and counts failures in a row, of the health check and of
//! the lease hooks alike (any success starts the count again). At `threshold` failures the
//! exporter tells the controller it is unhealthy: a `ReportStatus` whose message starts with
//! [`UNHEALTHY_PREFIX`] (`[UNHEALTHY] KIND: REASON`, then the last output), which our
//! controller keeps as the exporter's `Healthy` condition until an admin clears it
//! (`jmp admin clear-health exporter NAME`); meanwhile it leases the exporter to nobody.
//!
//! With log gathering (a controller naming its telemetry sink), each run of the health
//! check, pass or fail, is also pushed as one entry without a lease (`stream=health`, with
//! the failures in a row, the threshold, its duration and the last output; see
//! [`checked`]), which our controller shows in the exporter's health history.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use jumpstarter_core::{DriverNode, config::HealthCheck, hooks::UNHEALTHY_PREFIX};
use jumpstarter_proto::v1::LogSource;

use super::{
    HookConfigError, HookSpec, OnFailure,
    lifecycle::HookSocket,
    process::{self, HookEnv, Outcome, OutputTo},
};

/// The config key of health checks.
pub const HEALTH_CHECK: &str = "healthCheck";

/// The longest `[UNHEALTHY]` message sent (the controller takes status messages up to 4 KiB).
const MAX_MESSAGE: usize = 4000;

/// A checked `healthCheck` section.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthPolicy {
    /// The health-check script (`None`: only hook failures count).
    pub check: Option<HookSpec>,
    /// Time between two health checks.
    pub interval: Duration,
    /// Failures in a row that make the exporter unhealthy.
    pub threshold: u32,
}

impl HealthPolicy {
    /// Checks a `healthCheck` section.
    pub fn from_config(hc: &HealthCheck) -> Result<Self, HookConfigError> {
        let bad = |key: &'static str, why: &'static str| HookConfigError::Health { key, why };
        if hc.interval == 0 {
            return Err(bad("interval", "must be at least 1 second"));
        }
        if hc.timeout == 0 {
            return Err(bad("timeout", "must be at least 1 second"));
        }
        if hc.threshold == 0 {
            return Err(bad("threshold", "must be at least 1"));
        }
        let check = hc
            .script
            .as_ref()
            .filter(|s| !s.trim().is_empty())
            .map(|script| HookSpec {
                exec: hc.exec.clone().filter(|e| !e.trim().is_empty()),
                script: script.clone(),
                timeout: Duration::from_secs(hc.timeout),
                on_failure: OnFailure::Warn,
                path: None,
            });
        if check.is_none() && hc.exec.is_some() {
            return Err(bad("exec", "needs a script"));
        }
        Ok(Self {
            check,
            interval: Duration::from_secs(hc.interval),
            threshold: hc.threshold,
        })
    }
}

/// Counts failures in a row (health checks and hooks alike).
#[derive(Debug)]
pub struct HealthTracker {
    threshold: u32,
    failures: AtomicU32,
}

impl HealthTracker {
    /// A tracker that says "unhealthy" at `threshold` failures in a row.
    pub fn new(threshold: u32) -> Self {
        Self {
            threshold: threshold.max(1),
            failures: AtomicU32::new(0),
        }
    }

    /// Failures in a row that make the exporter unhealthy.
    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    /// Records one run of `key` (`healthCheck`, `beforeLease`, `afterLease`); returns the
    /// `[UNHEALTHY]` status message to send when this failure is the `threshold`-th in a
    /// row (the count then starts again).
    pub fn record(&self, key: &str, outcome: &Outcome) -> Option<String> {
        self.count(key, outcome).1
    }

    /// [`HealthTracker::record`], also returning the failures in a row this run makes (0
    /// when it passed; `threshold` when it made the exporter unhealthy).
    pub fn count(&self, key: &str, outcome: &Outcome) -> (u32, Option<String>) {
        let Err(why) = &outcome.result else {
            self.failures.store(0, Ordering::SeqCst);
            return (0, None);
        };
        let n = self.failures.fetch_add(1, Ordering::SeqCst) + 1;
        tracing::warn!(
            "{key} failed ({n} of {} in a row before quarantine): {why}",
            self.threshold
        );
        if n < self.threshold {
            return (n, None);
        }
        self.failures.store(0, Ordering::SeqCst);
        (
            n,
            Some(unhealthy_message(key, n, why, &outcome.last_output)),
        )
    }
}

/// One health check ended after `duration`: counts it with `tracker` and offers its entry
/// (`stream=health`, see [`crate::telemetry::HealthCheckRun`]) to `sink`, when the exporter
/// pushes its logs (never waiting: a full queue or a sink that is down drops it, counted);
/// returns the `[UNHEALTHY]` message to report when it made the exporter unhealthy.
pub fn checked(
    tracker: &HealthTracker,
    sink: Option<&crate::telemetry::TelemetrySink>,
    exporter: (&str, &str),
    outcome: &Outcome,
    duration: Duration,
) -> Option<String> {
    let (failures, unhealthy) = tracker.count(HEALTH_CHECK, outcome);
    if let Some(sink) = sink {
        sink.health_check(
            exporter,
            &crate::telemetry::HealthCheckRun {
                result: &outcome.result,
                output: &outcome.last_output,
                failures,
                threshold: tracker.threshold(),
                duration,
            },
        );
    }
    unhealthy
}

/// `[UNHEALTHY] KEY: failed N times in a row (last: WHY)` and the last output, at most
/// [`MAX_MESSAGE`] bytes (the output's end is kept).
fn unhealthy_message(key: &str, n: u32, why: &str, output: &str) -> String {
    let head = format!("{UNHEALTHY_PREFIX}{key}: failed {n} times in a row (last: {why})");
    let mut head: String = head.chars().take(MAX_MESSAGE / 2).collect();
    if output.is_empty() {
        return head;
    }
    let room = MAX_MESSAGE.saturating_sub(head.len() + 1);
    let mut start = output.len().saturating_sub(room);
    while !output.is_char_boundary(start) {
        start += 1;
    }
    head.push('\n');
    head.push_str(&output[start..]);
    head
}

/// Runs the health check once, its `j` reaching `tree` on a private socket.
pub async fn run_check(spec: &HookSpec, tree: DriverNode) -> Outcome {
    let socket = match HookSocket::start(tree, BTreeMap::new()) {
        Ok(s) => s,
        Err(e) => {
            return Outcome {
                result: Err(format!(
                    "Error executing hook: {e}",
                    e = jumpstarter_core::error_chain(&e)
                )),
                last_output: String::new(),
            };
        }
    };
    let env = HookEnv {
        lease_name: String::new(),
        client_name: String::new(),
        socket: socket.path().to_path_buf(),
        motd_file: None,
    };
    let out = OutputTo {
        key: HEALTH_CHECK,
        source: LogSource::Unspecified,
        session: std::sync::Arc::clone(socket.session()),
    };
    process::run(spec, out, &env).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hc(script: Option<&str>, interval: u64, timeout: u64, threshold: u32) -> HealthCheck {
        HealthCheck {
            exec: None,
            script: script.map(String::from),
            interval,
            timeout,
            threshold,
        }
    }

    #[test]
    fn bad_sections_name_the_key() {
        for (c, want) in [
            (
                hc(Some("true"), 0, 5, 3),
                "healthCheck.interval: must be at least 1 second",
            ),
            (
                hc(Some("true"), 5, 0, 3),
                "healthCheck.timeout: must be at least 1 second",
            ),
            (
                hc(Some("true"), 5, 5, 0),
                "healthCheck.threshold: must be at least 1",
            ),
        ] {
            assert_eq!(HealthPolicy::from_config(&c).unwrap_err().to_string(), want);
        }
        let mut c = hc(None, 5, 5, 3);
        c.exec = Some("/bin/bash".into());
        assert_eq!(
            HealthPolicy::from_config(&c).unwrap_err().to_string(),
            "healthCheck.exec: needs a script"
        );
        let p = HealthPolicy::from_config(&hc(None, 5, 5, 2)).unwrap();
        assert_eq!((p.check, p.threshold), (None, 2));
    }

    #[test]
    fn threshold_failures_in_a_row_make_one_message() {
        let t = HealthTracker::new(2);
        let fail = Outcome {
            result: Err("Hook failed with exit code 3".into()),
            last_output: "board did not answer".into(),
        };
        let ok = Outcome {
            result: Ok(()),
            last_output: String::new(),
        };
        assert_eq!(t.record("healthCheck", &fail), None);
        assert_eq!(t.record("beforeLease", &ok), None);
        assert_eq!(t.record("healthCheck", &fail), None);
        let msg = t.record("afterLease", &fail).unwrap();
        assert_eq!(
            msg,
            "[UNHEALTHY] afterLease: failed 2 times in a row (last: Hook failed with exit code 3)\nboard did not answer"
        );
        let parsed = jumpstarter_core::hooks::Unhealthy::parse(&msg).unwrap();
        assert_eq!(parsed.kind, "afterLease");
        // The count starts again.
        assert_eq!(t.record("healthCheck", &fail), None);
    }

    /// Each run offers one lease-less `stream=health` entry, pass or fail, with its count.
    #[tokio::test]
    async fn each_check_offers_an_entry_with_its_result_and_count() {
        let tree = DriverNode::new(std::sync::Arc::new(jumpstarter_drivers::Composite));
        let spec = |script: &str| HookSpec {
            exec: None,
            script: script.into(),
            timeout: Duration::from_secs(30),
            on_failure: OnFailure::Warn,
            path: None,
        };
        let (sink, mut rx) = crate::telemetry::TelemetrySink::channel(8);
        let t = HealthTracker::new(2);
        let mut run = async |script: &str| {
            let o = run_check(&spec(script), tree.clone()).await;
            let unhealthy = checked(
                &t,
                Some(&sink),
                ("board", "lab"),
                &o,
                Duration::from_millis(1500),
            );
            (unhealthy, rx.try_recv().unwrap())
        };
        let (unhealthy, e) = run("echo probe: no answer; exit 3").await;
        assert_eq!(unhealthy, None);
        assert_eq!(
            (e.lease.as_str(), e.exporter.as_str(), e.namespace.as_str()),
            ("", "board", "lab")
        );
        assert_eq!(
            (e.operation.as_str(), e.result.as_str()),
            ("healthCheck", "error")
        );
        assert_eq!(e.severity, "warning");
        assert_eq!(e.message, "probe: no answer");
        let f = |k: &str| e.extra_fields.get(k).map(String::as_str);
        assert_eq!(
            f("stream"),
            Some(jumpstarter_core::hooks::HEALTH_CHECK_STREAM)
        );
        assert_eq!((f("failures"), f("threshold")), (Some("1"), Some("2")));
        assert_eq!(f("duration_ms"), Some("1500.000"));
        assert_eq!(f("error"), Some("Hook failed with exit code 3"));
        // The second failure in a row makes the exporter unhealthy; its entry says 2 of 2.
        let (unhealthy, e) = run("exit 3").await;
        assert!(
            unhealthy
                .unwrap()
                .starts_with("[UNHEALTHY] healthCheck: failed 2")
        );
        assert_eq!(e.extra_fields["failures"], "2");
        let (unhealthy, e) = run("echo all good").await;
        assert_eq!(unhealthy, None);
        assert_eq!((e.result.as_str(), e.severity.as_str()), ("ok", "info"));
        assert_eq!(
            (e.extra_fields["failures"].as_str(), e.message.as_str()),
            ("0", "all good")
        );
        assert!(!e.extra_fields.contains_key("error"));
        // Without a sink (no log gathering) only the count is kept.
        let o = run_check(&spec("exit 1"), tree.clone()).await;
        assert_eq!(
            checked(&t, None, ("board", "lab"), &o, Duration::ZERO),
            None
        );
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn long_output_keeps_its_end_within_the_limit() {
        let out = format!("{}THE END", "x".repeat(10_000));
        let msg = unhealthy_message("healthCheck", 3, "Hook failed with exit code 1", &out);
        assert!(msg.len() <= MAX_MESSAGE, "{}", msg.len());
        assert!(msg.ends_with("THE END"));
        assert!(msg.starts_with("[UNHEALTHY] healthCheck: failed 3 times"));
    }

    #[tokio::test]
    async fn a_check_runs_with_j_on_its_socket_and_keeps_its_output() {
        let tree = DriverNode::new(std::sync::Arc::new(jumpstarter_drivers::Composite));
        let spec = HookSpec {
            exec: None,
            script: "echo checking; test -S \"$JUMPSTARTER_HOST\" && echo socket-ok; exit 4".into(),
            timeout: Duration::from_secs(30),
            on_failure: OnFailure::Warn,
            path: None,
        };
        let o = run_check(&spec, tree).await;
        assert_eq!(o.result, Err("Hook failed with exit code 4".into()));
        assert_eq!(o.last_output, "checking\nsocket-ok");
    }
}
