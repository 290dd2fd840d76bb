//! The client side of the lease hooks (`hooks.beforeLease` / `hooks.afterLease` of an
//! exporter config, `docs/hooks.md`), as upstream 0.9.0's client sees them.
//!
//! - [`wait`]: wait for `LEASE_READY`, `EndSession` and wait for the afterLease hook.
//! - [`HOOK_WARNING_PREFIX`]: the status-message convention both ends share.
//!
//! The exporter side (running the hooks, their statuses) lives in the CLI's exporter runtime
//! (`jumpstarter-cli/src/hooks/`).

pub mod wait;

/// Prefix of a status message that carries a hook warning (`onFailure: warn`); clients
/// print what follows it as a warning, as upstream.
pub const HOOK_WARNING_PREFIX: &str = "[HOOK_WARNING] ";

/// Prefix of a status message that says the exporter is unhealthy (ours, not upstream's;
/// `docs/hooks.md`): `[UNHEALTHY] KIND: REASON`, then on the next lines the last output of
/// what failed. `KIND` is `healthCheck`, `beforeLease` or `afterLease`. An exporter sends it
/// with `ReportStatus` (its status unchanged) once its health check or hooks failed
/// `healthCheck.threshold` times in a row; our controller then marks it unhealthy (the
/// `Healthy` condition) and shows clients its status message with this prefix. Upstream's
/// controller just shows the message.
pub const UNHEALTHY_PREFIX: &str = "[UNHEALTHY] ";

/// The `extra_fields["stream"]` of a log-gathering entry (`TelemetryService.PushLogs`) that is
/// one line of a lease hook's output, its `operation` the hook (`beforeLease` or
/// `afterLease`); ours: our exporter pushes them, our controller shows them with the
/// exporter's hook runs on its dashboard.
pub const HOOK_OUTPUT_STREAM: &str = "hook";

/// The `extra_fields["stream"]` of a log-gathering entry (`TelemetryService.PushLogs`) that is
/// one run of an exporter's health check (`healthCheck`), pass or fail: no lease, `operation`
/// `healthCheck`, `result` `ok` or `error`, the extra fields `failures` (in a row, this run
/// included; 0 when it passed), `threshold`, `duration_ms` and, when it failed, `error` (why),
/// and the message the last lines of its output. Ours: our exporter pushes them, our
/// controller shows them in the exporter's health history on its dashboard.
pub const HEALTH_CHECK_STREAM: &str = "health";

/// What an `[UNHEALTHY] ...` status message says (see [`UNHEALTHY_PREFIX`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhealthy<'a> {
    /// `healthCheck`, `beforeLease` or `afterLease` (or what the sender wrote).
    pub kind: &'a str,
    /// The first line after the kind: why.
    pub reason: &'a str,
    /// The rest: the last output of what failed (may be empty).
    pub output: &'a str,
}

impl<'a> Unhealthy<'a> {
    /// Parses a status message; `None` when it does not start with [`UNHEALTHY_PREFIX`].
    pub fn parse(message: &'a str) -> Option<Self> {
        let rest = message.strip_prefix(UNHEALTHY_PREFIX)?;
        let (first, output) = rest.split_once('\n').unwrap_or((rest, ""));
        let (kind, reason) = match first.split_once(": ") {
            Some((k, r)) if !k.is_empty() && !k.contains(' ') => (k, r),
            _ => ("", first),
        };
        Some(Self {
            kind,
            reason: reason.trim(),
            output: output.trim_end(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhealthy_messages_parse() {
        let u =
            Unhealthy::parse("[UNHEALTHY] healthCheck: failed 3 times in a row\nline 1\nline 2\n")
                .unwrap();
        assert_eq!(u.kind, "healthCheck");
        assert_eq!(u.reason, "failed 3 times in a row");
        assert_eq!(u.output, "line 1\nline 2");
        let u = Unhealthy::parse("[UNHEALTHY] something odd").unwrap();
        assert_eq!((u.kind, u.reason, u.output), ("", "something odd", ""));
        assert_eq!(Unhealthy::parse("Available for new lease"), None);
        assert_eq!(Unhealthy::parse(""), None);
    }
}
