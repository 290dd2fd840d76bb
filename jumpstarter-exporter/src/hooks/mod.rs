//! Lease hooks (`hooks.beforeLease` / `hooks.afterLease` of an exporter config), as upstream
//! 0.9.0 runs them.
//!
//! - [`HookSpec`]: one hook, checked (`script` inline or a file path, `exec`, `timeout`,
//!   `onFailure: warn | endLease | exit`).
//! - [`process`]: runs one hook in a PTY with upstream's environment, its output line by
//!   line to the session's `LogStream` (source `BEFORE_LEASE_HOOK` / `AFTER_LEASE_HOOK`);
//!   its process group is killed on timeout, when the run is dropped and when the exporter
//!   dies (a watcher process, see [`process`]).
//! - [`health`]: the optional `healthCheck` (ours): a script between leases, and quarantine
//!   after failures in a row.
//! - [`lifecycle`]: the statuses around the hooks (`BEFORE_LEASE_HOOK`, `LEASE_READY`,
//!   `AFTER_LEASE_HOOK`, the `*_FAILED` states, `AVAILABLE`) and what each `onFailure` does.
//!
//! The client side (wait for `LEASE_READY`, `EndSession`) is `jumpstarter_core::hooks::wait`.

pub mod health;
pub mod lifecycle;
pub mod process;

use std::{path::Path, time::Duration};

use jumpstarter_core::config::{Hook, Hooks};
use jumpstarter_proto::v1::{ExporterStatus, LogSource};

/// A bad `hooks` section.
#[derive(Debug, thiserror::Error)]
pub enum HookConfigError {
    /// `onFailure` is none of `warn`, `endLease`, `exit`.
    #[error("hooks.{hook}.onFailure: {value:?} is not one of warn, endLease, exit")]
    OnFailure {
        /// `beforeLease` or `afterLease`.
        hook: &'static str,
        /// What the config says.
        value: String,
    },
    /// `timeout` is zero.
    #[error("hooks.{hook}.timeout: must be at least 1 second")]
    Timeout {
        /// `beforeLease` or `afterLease`.
        hook: &'static str,
    },
    /// A bad `healthCheck` key.
    #[error("healthCheck.{key}: {why}")]
    Health {
        /// The key.
        key: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// What a failed hook does to the lease and the exporter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// Log a warning and go on as if the hook succeeded.
    Warn,
    /// End the lease (a failed beforeLease hook also skips the afterLease hook).
    EndLease,
    /// End the lease and shut the exporter down with exit code 1.
    Exit,
}

/// Which hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookKind {
    /// `beforeLease`.
    BeforeLease,
    /// `afterLease`.
    AfterLease,
}

impl HookKind {
    /// The config key (`beforeLease` / `afterLease`).
    pub fn key(self) -> &'static str {
        match self {
            HookKind::BeforeLease => "beforeLease",
            HookKind::AfterLease => "afterLease",
        }
    }

    /// The `LogStream` source its output carries.
    pub fn log_source(self) -> LogSource {
        match self {
            HookKind::BeforeLease => LogSource::BeforeLeaseHook,
            HookKind::AfterLease => LogSource::AfterLeaseHook,
        }
    }

    /// The status while it runs.
    pub fn running(self) -> ExporterStatus {
        match self {
            HookKind::BeforeLease => ExporterStatus::BeforeLeaseHook,
            HookKind::AfterLease => ExporterStatus::AfterLeaseHook,
        }
    }

    /// The status when it failed with `endLease` / `exit`.
    pub fn failed(self) -> ExporterStatus {
        match self {
            HookKind::BeforeLease => ExporterStatus::BeforeLeaseHookFailed,
            HookKind::AfterLease => ExporterStatus::AfterLeaseHookFailed,
        }
    }
}

/// One checked hook.
#[derive(Debug, Clone, PartialEq)]
pub struct HookSpec {
    /// The interpreter (`exec`); `None`: auto-detected as upstream.
    pub exec: Option<String>,
    /// The script, inline or a file path.
    pub script: String,
    /// How long it may run.
    pub timeout: Duration,
    /// What a failure does.
    pub on_failure: OnFailure,
    /// The `PATH` it runs with (`None`: the exporter's own).
    pub path: Option<std::ffi::OsString>,
}

impl HookSpec {
    /// Checks one hook of the config.
    pub fn from_config(kind: HookKind, hook: &Hook) -> Result<Self, HookConfigError> {
        let on_failure = match hook.on_failure.as_str() {
            "warn" => OnFailure::Warn,
            "endLease" => OnFailure::EndLease,
            "exit" => OnFailure::Exit,
            other => {
                return Err(HookConfigError::OnFailure {
                    hook: kind.key(),
                    value: other.to_string(),
                });
            }
        };
        if hook.timeout == 0 {
            return Err(HookConfigError::Timeout { hook: kind.key() });
        }
        Ok(Self {
            exec: hook.exec.clone().filter(|e| !e.trim().is_empty()),
            script: hook.script.clone(),
            timeout: Duration::from_secs(hook.timeout),
            on_failure,
            path: None,
        })
    }

    /// The command line, as upstream builds it: a single-line script naming an existing
    /// file runs that file (interpreter from `exec`, else `python3` for `.py` and `/bin/sh`
    /// for anything else); otherwise the interpreter (`exec` or `/bin/sh`) gets `-c SCRIPT`.
    pub fn command_line(&self) -> Vec<String> {
        let stripped = self.script.trim();
        let is_file = !stripped.contains('\n') && Path::new(stripped).is_file();
        if is_file {
            let interpreter = self.exec.clone().unwrap_or_else(|| {
                let py = Path::new(stripped)
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("py"));
                if py { "python3" } else { "/bin/sh" }.to_string()
            });
            vec![interpreter, stripped.to_string()]
        } else {
            let interpreter = self.exec.clone().unwrap_or_else(|| "/bin/sh".into());
            vec![interpreter, "-c".into(), self.script.clone()]
        }
    }
}

/// Both hooks of an exporter, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeaseHooks {
    /// `beforeLease`.
    pub before: Option<HookSpec>,
    /// `afterLease`.
    pub after: Option<HookSpec>,
}

impl LeaseHooks {
    /// Checks the `hooks` section; `None` when it configures no hook.
    pub fn from_config(hooks: &Hooks) -> Result<Option<Self>, HookConfigError> {
        let before = hooks
            .before_lease
            .as_ref()
            .map(|h| HookSpec::from_config(HookKind::BeforeLease, h))
            .transpose()?;
        let after = hooks
            .after_lease
            .as_ref()
            .map(|h| HookSpec::from_config(HookKind::AfterLease, h))
            .transpose()?;
        Ok((before.is_some() || after.is_some()).then_some(Self { before, after }))
    }

    /// Runs both hooks with `PATH` set to `path`.
    pub fn set_path(&mut self, path: &std::ffi::OsStr) {
        for hook in [&mut self.before, &mut self.after].into_iter().flatten() {
            hook.path = Some(path.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(script: &str, exec: Option<&str>, on_failure: &str, timeout: u64) -> Hook {
        Hook {
            exec: exec.map(String::from),
            script: script.into(),
            timeout,
            on_failure: on_failure.into(),
        }
    }

    #[test]
    fn bad_on_failure_and_timeout_name_the_key() {
        let e = HookSpec::from_config(HookKind::BeforeLease, &hook("true", None, "panic", 5))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "hooks.beforeLease.onFailure: \"panic\" is not one of warn, endLease, exit"
        );
        let e = HookSpec::from_config(HookKind::AfterLease, &hook("true", None, "warn", 0))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "hooks.afterLease.timeout: must be at least 1 second");
    }

    #[test]
    fn command_line_detects_files_and_interpreters_as_upstream() {
        let dir = tempfile::tempdir().unwrap();
        let py = dir.path().join("prep.py");
        std::fs::write(&py, "print(1)\n").unwrap();
        let sh = dir.path().join("prep.sh");
        std::fs::write(&sh, "echo 1\n").unwrap();
        let spec = |script: &str, exec: Option<&str>| {
            HookSpec::from_config(HookKind::BeforeLease, &hook(script, exec, "warn", 1)).unwrap()
        };
        let py_s = py.to_string_lossy().to_string();
        let sh_s = sh.to_string_lossy().to_string();
        assert_eq!(spec(&py_s, None).command_line(), ["python3", py_s.as_str()]);
        assert_eq!(spec(&sh_s, None).command_line(), ["/bin/sh", sh_s.as_str()]);
        assert_eq!(
            spec(&format!("  {sh_s}\n"), Some("/bin/bash")).command_line(),
            ["/bin/bash", sh_s.as_str()]
        );
        // Not a file, or more than one line: inline.
        assert_eq!(
            spec("echo hi", None).command_line(),
            ["/bin/sh", "-c", "echo hi"]
        );
        let two = format!("{sh_s}\necho more");
        assert_eq!(
            spec(&two, Some("/bin/bash")).command_line(),
            ["/bin/bash", "-c", two.as_str()]
        );
    }

    #[test]
    fn no_hooks_is_none() {
        assert_eq!(LeaseHooks::from_config(&Hooks::default()).unwrap(), None);
    }
}
