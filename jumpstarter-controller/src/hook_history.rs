//! Each exporter's recent hook runs and health events, as the controller sees them, for the
//! dashboard's exporter page (`docs/dashboard.md`). Kept in the controller's memory only: a
//! restarted controller (or a new leader) starts with none.
//!
//! - A **hook run** is read from the statuses the exporter reports (`ReportStatus`, upstream
//!   0.9.0's and ours alike): `BEFORE_LEASE_HOOK` / `AFTER_LEASE_HOOK` start one, the next
//!   status ends it (`LEASE_READY` / `AVAILABLE`: succeeded, or warned when the message starts
//!   with `[HOOK_WARNING]`; `*_HOOK_FAILED`: failed; `OFFLINE`: interrupted), with the lease
//!   the exporter held and the status message. Its output is the lease's pushed log entries
//!   marked as hook output ([`is_hook_output`]), read where log gathering keeps them.
//! - A **health event** is what the controller sees of health: an `[UNHEALTHY]` report (a
//!   health check or hooks failing `threshold` times in a row quarantine the exporter), an
//!   admin's quarantine and its clearing, and each run of the exporter's health check, pass
//!   or fail, that our exporter pushes with log gathering (a lease-less entry marked
//!   `stream=health`, [`is_health_check`]; upstream's exporters push none).
//!
//! Bounded: [`RUNS_KEPT`] runs per exporter, [`HEALTH_KEPT`] health-check runs and as many
//! other health events (frequent checks never push out a quarantine), messages cut to
//! [`MAX_MESSAGE`] bytes, at most [`MAX_EXPORTERS`] exporters (the one changed longest ago is
//! forgotten first).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use jiff::Timestamp;
use jumpstarter_core::hooks::{HOOK_WARNING_PREFIX, Unhealthy};
use jumpstarter_core::sync::LockExt;
use jumpstarter_proto::v1::{ExporterStatus, LogEntry};
use tokio::sync::watch;

/// Hook runs kept per exporter.
pub const RUNS_KEPT: usize = 20;
/// Health events kept per exporter.
pub const HEALTH_KEPT: usize = 50;
/// Exporters with a history, at most.
pub const MAX_EXPORTERS: usize = 20_000;
/// Bytes of a kept message, at most (the end is cut).
pub const MAX_MESSAGE: usize = 4096;
/// The `extra_fields["stream"]` of a pushed entry that is a line of hook output (with
/// `operation` the hook: `beforeLease` or `afterLease`).
pub const HOOK_STREAM: &str = jumpstarter_core::hooks::HOOK_OUTPUT_STREAM;
/// The `extra_fields["stream"]` of a pushed entry that is one run of the exporter's health
/// check (no lease; see [`jumpstarter_core::hooks::HEALTH_CHECK_STREAM`]).
pub const HEALTH_STREAM: &str = jumpstarter_core::hooks::HEALTH_CHECK_STREAM;

/// Which lease hook ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookKind {
    /// `hooks.beforeLease`.
    BeforeLease,
    /// `hooks.afterLease`.
    AfterLease,
}

impl HookKind {
    /// The config key (`beforeLease`, `afterLease`), also the `operation` of its output lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BeforeLease => "beforeLease",
            Self::AfterLease => "afterLease",
        }
    }
}

/// How a hook run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunResult {
    /// Not ended yet.
    Running,
    /// The next status was `LEASE_READY` / `AVAILABLE`.
    Succeeded,
    /// It failed with `onFailure: warn` (`[HOOK_WARNING]` message).
    Warned,
    /// `BEFORE_LEASE_HOOK_FAILED` / `AFTER_LEASE_HOOK_FAILED`.
    Failed,
    /// The exporter went offline (or started another hook) before it ended.
    Interrupted,
}

impl RunResult {
    /// The word shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Warned => "warned",
            Self::Failed => "failed",
            Self::Interrupted => "interrupted",
        }
    }
}

/// One hook run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookRun {
    /// Which hook.
    pub kind: HookKind,
    /// The lease it ran for, when the exporter held one.
    pub lease: Option<String>,
    /// When its `*_HOOK` status was reported.
    pub start: Timestamp,
    /// When the status that ended it was reported.
    pub end: Option<Timestamp>,
    /// How it ended.
    pub result: RunResult,
    /// The message of the status that ended it (why it failed, the warning).
    pub message: String,
}

impl HookRun {
    /// Ends this run at `now` with `result` and the message of the status that ended it.
    fn finish(&mut self, result: RunResult, now: Timestamp, message: &str) {
        self.result = result;
        self.end = Some(now);
        self.message = cut(message);
    }
}

/// Adds `run` to an exporter's `runs`, dropping the oldest when [`RUNS_KEPT`] are kept.
fn push_run(runs: &mut VecDeque<HookRun>, run: HookRun) {
    if runs.len() >= RUNS_KEPT {
        runs.pop_front();
    }
    runs.push_back(run);
}

/// What a health event was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthKind {
    /// The exporter reported itself unhealthy and is quarantined.
    Unhealthy,
    /// An admin quarantined it.
    QuarantinedByAdmin,
    /// An admin cleared its quarantine.
    Cleared,
    /// A run of its health check passed (pushed by the exporter).
    CheckPassed,
    /// A run of its health check failed (pushed by the exporter).
    CheckFailed,
}

impl HealthKind {
    /// The word shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unhealthy => "unhealthy",
            Self::QuarantinedByAdmin => "quarantined by an admin",
            Self::Cleared => "cleared",
            Self::CheckPassed => "check passed",
            Self::CheckFailed => "check failed",
        }
    }

    /// Whether it is a run of the health check (kept apart, see [`HEALTH_KEPT`]).
    pub fn is_check(self) -> bool {
        matches!(self, Self::CheckPassed | Self::CheckFailed)
    }
}

/// What a run of the health check pushed besides its result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRun {
    /// Failures in a row with this run (0 when it passed).
    pub failures: u32,
    /// Failures in a row that quarantine the exporter (0: not said).
    pub threshold: u32,
    /// How long it ran, when said.
    pub duration: Option<std::time::Duration>,
    /// The last lines of its output.
    pub output: String,
}

/// One health event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthEvent {
    /// When the controller saw it.
    pub time: Timestamp,
    /// What it was.
    pub kind: HealthKind,
    /// What failed (`healthCheck`, `beforeLease`, `afterLease`), or who acted.
    pub source: String,
    /// Why, and the last output of what failed (a health check's run: why it failed).
    pub message: String,
    /// A run of the health check: its count, duration and output.
    pub check: Option<CheckRun>,
}

#[derive(Debug, Default)]
struct Exporter {
    runs: VecDeque<HookRun>,
    health: VecDeque<HealthEvent>,
    /// The last lease a status report came with (an `AFTER_LEASE_HOOK` may come once the
    /// lease has ended and the exporter's `leaseRef` is gone).
    last_lease: Option<String>,
    touched: Timestamp,
}

/// The hook runs and health events of every exporter (see the module docs).
#[derive(Debug)]
pub struct HookHistory {
    exporters: Mutex<HashMap<(String, String), Exporter>>,
    changes: watch::Sender<u64>,
}

impl Default for HookHistory {
    fn default() -> Self {
        Self {
            exporters: Mutex::default(),
            changes: watch::channel(0).0,
        }
    }
}

/// `s` cut to [`MAX_MESSAGE`] bytes on a character boundary.
fn cut(s: &str) -> String {
    if s.len() <= MAX_MESSAGE {
        return s.to_string();
    }
    let mut end = MAX_MESSAGE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Whether a pushed entry is a line of output of hook `kind`.
pub fn is_hook_output(e: &LogEntry, kind: HookKind) -> bool {
    e.operation == kind.as_str()
        && e.extra_fields.get("stream").map(String::as_str) == Some(HOOK_STREAM)
}

/// Whether a pushed entry is a line of output of any hook.
pub fn is_any_hook_output(e: &LogEntry) -> bool {
    is_hook_output(e, HookKind::BeforeLease) || is_hook_output(e, HookKind::AfterLease)
}

/// Whether a pushed entry is a run of the health check: no lease and marked
/// `stream=health` (the only entries without a lease the controller takes).
pub fn is_health_check(e: &LogEntry) -> bool {
    e.lease.is_empty() && e.extra_fields.get("stream").map(String::as_str) == Some(HEALTH_STREAM)
}

/// The health event of a pushed run of the health check ([`is_health_check`]), seen at
/// `now`: failed unless its `result` is `ok`; `failures`, `threshold` and `duration_ms`
/// read from its extra fields (left out when they do not parse), `error` as the message.
pub fn health_check_event(e: &LogEntry, now: Timestamp) -> HealthEvent {
    let field = |k: &str| e.extra_fields.get(k).map(String::as_str);
    let number = |k: &str| field(k).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
    let duration = field("duration_ms")
        .and_then(|v| v.parse::<f64>().ok())
        .and_then(|ms| std::time::Duration::try_from_secs_f64(ms / 1e3).ok());
    HealthEvent {
        time: now,
        kind: if e.result == "ok" {
            HealthKind::CheckPassed
        } else {
            HealthKind::CheckFailed
        },
        source: "healthCheck".to_string(),
        message: field("error").unwrap_or_default().to_string(),
        check: Some(CheckRun {
            failures: number("failures"),
            threshold: number("threshold"),
            duration,
            output: e.message.clone(),
        }),
    }
}

impl HookHistory {
    /// Changes each time something is recorded (the dashboard's event stream waits on it).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Says that something shown with the history changed (hook output was pushed).
    pub fn touch(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    fn with<R>(
        &self,
        namespace: &str,
        name: &str,
        now: Timestamp,
        f: impl FnOnce(&mut Exporter) -> R,
    ) -> R {
        let r = {
            let mut all = self.exporters.lock_or_recover();
            let key = (namespace.to_string(), name.to_string());
            if !all.contains_key(&key)
                && all.len() >= MAX_EXPORTERS
                && let Some(oldest) = all
                    .iter()
                    .min_by_key(|(_, e)| e.touched)
                    .map(|(k, _)| k.clone())
            {
                all.remove(&oldest);
            }
            let e = all.entry(key).or_default();
            e.touched = now;
            f(e)
        };
        self.touch();
        r
    }

    /// Exporter `namespace/name` reported `status` with `message` while holding `lease`.
    pub fn status_reported(
        &self,
        namespace: &str,
        name: &str,
        status: ExporterStatus,
        message: &str,
        lease: Option<&str>,
        now: Timestamp,
    ) {
        use ExporterStatus as S;
        if let Some(u) = Unhealthy::parse(message) {
            let text = if u.output.is_empty() {
                u.reason.to_string()
            } else {
                format!("{}\n{}", u.reason, u.output)
            };
            self.health(
                namespace,
                name,
                HealthEvent {
                    time: now,
                    kind: HealthKind::Unhealthy,
                    source: u.kind.to_string(),
                    message: text,
                    check: None,
                },
            );
            return;
        }
        if !matches!(
            status,
            S::BeforeLeaseHook
                | S::AfterLeaseHook
                | S::BeforeLeaseHookFailed
                | S::AfterLeaseHookFailed
                | S::LeaseReady
                | S::Available
                | S::Offline
        ) {
            return;
        }
        self.with(namespace, name, now, |e| {
            if let Some(l) = lease {
                e.last_lease = Some(l.to_string());
            }
            let lease = lease.map(str::to_string).or_else(|| e.last_lease.clone());
            let running = e.runs.back_mut().filter(|r| r.result == RunResult::Running);
            let (kind, result) = match status {
                S::BeforeLeaseHook | S::AfterLeaseHook => {
                    let kind = if status == S::BeforeLeaseHook {
                        HookKind::BeforeLease
                    } else {
                        HookKind::AfterLease
                    };
                    if let Some(r) = running {
                        if r.kind == kind && r.lease == lease {
                            return; // the same run reported again
                        }
                        r.result = RunResult::Interrupted;
                        r.end = Some(now);
                    }
                    push_run(
                        &mut e.runs,
                        HookRun {
                            kind,
                            lease,
                            start: now,
                            end: None,
                            result: RunResult::Running,
                            message: cut(message),
                        },
                    );
                    return;
                }
                S::BeforeLeaseHookFailed => (HookKind::BeforeLease, RunResult::Failed),
                S::AfterLeaseHookFailed => (HookKind::AfterLease, RunResult::Failed),
                S::LeaseReady | S::Available | S::Offline => {
                    let Some(r) = running else { return };
                    let result = if status == S::Offline {
                        RunResult::Interrupted
                    } else if message.starts_with(HOOK_WARNING_PREFIX) {
                        RunResult::Warned
                    } else {
                        RunResult::Succeeded
                    };
                    r.finish(result, now, message);
                    return;
                }
                _ => return,
            };
            // A failure ends the running run of its kind, else is a run of its own.
            match running {
                Some(r) if r.kind == kind => r.finish(result, now, message),
                _ => {
                    push_run(
                        &mut e.runs,
                        HookRun {
                            kind,
                            lease,
                            start: now,
                            end: Some(now),
                            result,
                            message: cut(message),
                        },
                    );
                }
            }
        });
    }

    /// Records a health event of exporter `namespace/name`, forgetting the oldest of its
    /// sort (a health check's run, or another event) when [`HEALTH_KEPT`] are kept.
    pub fn health(&self, namespace: &str, name: &str, mut ev: HealthEvent) {
        ev.message = cut(&ev.message);
        if let Some(c) = &mut ev.check {
            c.output = cut(&c.output);
        }
        let check = ev.kind.is_check();
        self.with(namespace, name, ev.time, |e| {
            let of_sort = |h: &HealthEvent| h.kind.is_check() == check;
            if e.health.iter().filter(|h| of_sort(h)).count() >= HEALTH_KEPT
                && let Some(i) = e.health.iter().position(of_sort)
            {
                e.health.remove(i);
            }
            e.health.push_back(ev);
        });
    }

    /// The hook runs of `namespace/name`, newest first.
    pub fn runs(&self, namespace: &str, name: &str) -> Vec<HookRun> {
        self.exporters
            .lock_or_recover()
            .get(&(namespace.to_string(), name.to_string()))
            .map(|e| e.runs.iter().rev().cloned().collect())
            .unwrap_or_default()
    }

    /// The health events of `namespace/name`, newest first.
    pub fn health_events(&self, namespace: &str, name: &str) -> Vec<HealthEvent> {
        self.exporters
            .lock_or_recover()
            .get(&(namespace.to_string(), name.to_string()))
            .map(|e| e.health.iter().rev().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ExporterStatus as S;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn statuses_make_hook_runs() {
        let h = HookHistory::default();
        let r =
            |s, m: &str, lease: Option<&str>, at| h.status_reported("ns", "e", s, m, lease, t(at));
        r(S::Available, "Available for new lease", None, 0);
        assert!(h.runs("ns", "e").is_empty());
        r(
            S::BeforeLeaseHook,
            "Running beforeLease hook",
            Some("l1"),
            1,
        );
        r(
            S::BeforeLeaseHook,
            "Running beforeLease hook",
            Some("l1"),
            2,
        );
        r(S::LeaseReady, "Ready for commands", Some("l1"), 3);
        r(S::AfterLeaseHook, "Running afterLease hooks", None, 10);
        r(
            S::Available,
            "[HOOK_WARNING] afterLease hook warning: exit 1",
            None,
            11,
        );
        r(
            S::BeforeLeaseHookFailed,
            "beforeLease hook failed (on_failure=endLease): boom",
            Some("l2"),
            20,
        );
        r(
            S::AfterLeaseHook,
            "Running afterLease hooks",
            Some("l3"),
            30,
        );
        r(S::Offline, "bye", None, 31);
        let runs = h.runs("ns", "e");
        let got: Vec<_> = runs
            .iter()
            .map(|r| (r.kind, r.lease.as_deref(), r.result, r.start, r.end))
            .collect();
        assert_eq!(
            got,
            [
                (
                    HookKind::AfterLease,
                    Some("l3"),
                    RunResult::Interrupted,
                    t(30),
                    Some(t(31))
                ),
                (
                    HookKind::BeforeLease,
                    Some("l2"),
                    RunResult::Failed,
                    t(20),
                    Some(t(20))
                ),
                // The lease had ended: the last one reported is named.
                (
                    HookKind::AfterLease,
                    Some("l1"),
                    RunResult::Warned,
                    t(10),
                    Some(t(11))
                ),
                (
                    HookKind::BeforeLease,
                    Some("l1"),
                    RunResult::Succeeded,
                    t(1),
                    Some(t(3))
                ),
            ]
        );
        assert!(runs[1].message.ends_with("boom"));
        assert!(h.runs("ns", "other").is_empty());
    }

    #[test]
    fn history_is_bounded() {
        let h = HookHistory::default();
        for i in 0..(RUNS_KEPT as i64 + 5) {
            h.status_reported(
                "ns",
                "e",
                S::BeforeLeaseHook,
                "x",
                Some(&format!("l{i}")),
                t(2 * i),
            );
            h.status_reported(
                "ns",
                "e",
                S::LeaseReady,
                &"y".repeat(10_000),
                None,
                t(2 * i + 1),
            );
        }
        let runs = h.runs("ns", "e");
        assert_eq!(runs.len(), RUNS_KEPT);
        assert_eq!(
            runs[0].lease.as_deref(),
            Some(&*format!("l{}", RUNS_KEPT + 4))
        );
        assert!(runs[0].message.len() <= MAX_MESSAGE + 3);
        for i in 0..(HEALTH_KEPT + 3) {
            h.status_reported(
                "ns",
                "e",
                S::Available,
                &format!("[UNHEALTHY] healthCheck: failed {i}\nout"),
                None,
                t(0),
            );
        }
        let ev = h.health_events("ns", "e");
        assert_eq!(ev.len(), HEALTH_KEPT);
        assert_eq!(
            (ev[0].kind, ev[0].source.as_str()),
            (HealthKind::Unhealthy, "healthCheck")
        );
        assert_eq!(ev[0].message, format!("failed {}\nout", HEALTH_KEPT + 2));
    }

    fn check_entry(result: &str, failures: &str, output: &str) -> LogEntry {
        LogEntry {
            operation: "healthCheck".into(),
            result: result.into(),
            message: output.into(),
            extra_fields: [
                ("stream", HEALTH_STREAM),
                ("failures", failures),
                ("threshold", "3"),
                ("duration_ms", "1234.500"),
                ("error", "Hook failed with exit code 2"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn health_check_runs_are_recorded_and_bounded_apart_from_other_events() {
        let e = check_entry("error", "2", "probe: no answer");
        assert!(is_health_check(&e));
        assert!(!is_any_hook_output(&e));
        let mut leased = e.clone();
        leased.lease = "l1".into();
        assert!(!is_health_check(&leased), "a lease's entry");
        let ev = health_check_event(&e, t(5));
        assert_eq!(
            (ev.kind, ev.source.as_str(), ev.message.as_str(), ev.time),
            (
                HealthKind::CheckFailed,
                "healthCheck",
                "Hook failed with exit code 2",
                t(5)
            )
        );
        assert_eq!(
            ev.check,
            Some(CheckRun {
                failures: 2,
                threshold: 3,
                duration: Some(std::time::Duration::from_micros(1_234_500)),
                output: "probe: no answer".into(),
            })
        );
        // Fields that do not parse are left out; `ok` is a pass.
        let mut odd = check_entry("ok", "many", "");
        odd.extra_fields.insert("duration_ms".into(), "-1".into());
        let ev = health_check_event(&odd, t(6));
        let c = ev.check.unwrap();
        assert_eq!(
            (ev.kind, c.failures, c.duration),
            (HealthKind::CheckPassed, 0, None)
        );

        let h = HookHistory::default();
        h.status_reported(
            "ns",
            "e",
            S::Available,
            "[UNHEALTHY] healthCheck: failed 3 times in a row (last: x)",
            None,
            t(0),
        );
        for i in 0..(HEALTH_KEPT as i64 + 7) {
            let mut e = check_entry("ok", "0", &format!("run {i}"));
            e.message
                .push_str(&"y".repeat(if i == 0 { 0 } else { 10_000 }));
            h.health("ns", "e", health_check_event(&e, t(i + 1)));
        }
        let ev = h.health_events("ns", "e");
        // The oldest checks went; the quarantine, older than all of them, stayed.
        assert_eq!(ev.len(), HEALTH_KEPT + 1);
        assert_eq!(ev[HEALTH_KEPT].kind, HealthKind::Unhealthy);
        assert!(
            ev[..HEALTH_KEPT]
                .iter()
                .all(|e| e.kind == HealthKind::CheckPassed)
        );
        let output = |e: &HealthEvent| e.check.as_ref().unwrap().output.clone();
        assert!(output(&ev[0]).starts_with(&format!("run {}", HEALTH_KEPT + 6)));
        assert!(output(&ev[HEALTH_KEPT - 1]).starts_with("run 7"));
        assert!(output(&ev[0]).len() <= MAX_MESSAGE + 3);
        // Other events are bounded on their own: the checks stay.
        for _ in 0..HEALTH_KEPT {
            h.health(
                "ns",
                "e",
                HealthEvent {
                    time: t(100),
                    kind: HealthKind::Cleared,
                    source: "admin".into(),
                    message: String::new(),
                    check: None,
                },
            );
        }
        let ev = h.health_events("ns", "e");
        assert_eq!(ev.len(), 2 * HEALTH_KEPT);
        assert!(!ev.iter().any(|e| e.kind == HealthKind::Unhealthy));
        assert_eq!(ev.iter().filter(|e| e.kind.is_check()).count(), HEALTH_KEPT);
    }

    #[test]
    fn hook_output_is_marked_by_stream_and_operation() {
        let mut e = LogEntry {
            operation: "beforeLease".into(),
            ..Default::default()
        };
        assert!(!is_any_hook_output(&e), "a driver method of that name");
        e.extra_fields.insert("stream".into(), HOOK_STREAM.into());
        assert!(is_hook_output(&e, HookKind::BeforeLease));
        assert!(!is_hook_output(&e, HookKind::AfterLease));
    }
}
