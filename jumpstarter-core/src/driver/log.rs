//! Where driver log records go.

use std::sync::{Arc, Mutex};

use jumpstarter_proto::v1::{LogSource, LogStreamResponse};
use tokio::sync::broadcast;

/// How many log records a `LogStream` subscriber may lag behind before it skips some.
const LOG_BUFFER: usize = 256;

/// How many hook output records are kept for a client that has not opened `LogStream` yet.
const HOOK_BACKLOG: usize = 1024;

/// The time of a record (upstream main's `LogStreamResponse.timestamp`).
fn now() -> prost_types::Timestamp {
    prost_types::Timestamp::from(std::time::SystemTime::now())
}

/// Told of every driver log line of a session (see [`LogSink::set_observer`]). It runs on
/// the driver's task: it must not block or wait.
pub trait LogObserver: Send + Sync {
    /// Driver `driver` logged `message` at `severity` (`DEBUG`, `INFO`, `WARNING`, ...).
    fn driver_log(&self, driver: &str, severity: &str, message: &str);

    /// A hook printed one line of output, `message`, under `source` (`BEFORE_LEASE_HOOK` /
    /// `AFTER_LEASE_HOOK`); by default nothing happens.
    fn hook_log(&self, _source: LogSource, _severity: &str, _message: &str) {}
}

/// Where driver log records go: `tracing` (target `driver`) and the session's `LogStream`.
#[derive(Clone)]
pub struct LogSink {
    tx: broadcast::Sender<LogStreamResponse>,
    /// Also told of each driver line (the exporter's log gathering).
    observer: Arc<Mutex<Option<Arc<dyn LogObserver>>>>,
    /// Hook records emitted while no `LogStream` was open; the next one replays them (as
    /// upstream's session queue keeps records until a client takes them).
    backlog: Arc<Mutex<std::collections::VecDeque<LogStreamResponse>>>,
}

impl Default for LogSink {
    fn default() -> Self {
        Self {
            tx: broadcast::channel(LOG_BUFFER).0,
            backlog: Arc::default(),
            observer: Arc::default(),
        }
    }
}

impl LogSink {
    /// Tells `observer` of each driver log line from now on (every clone of this sink).
    pub fn set_observer(&self, observer: Arc<dyn LogObserver>) {
        *self.observer.lock().unwrap_or_else(|p| p.into_inner()) = Some(observer);
    }

    /// The observer [`LogSink::set_observer`] set, if any.
    fn observer(&self) -> Option<Arc<dyn LogObserver>> {
        self.observer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records one driver log line.
    pub fn emit(&self, driver: &str, severity: &str, message: String) {
        if let Some(o) = self.observer() {
            o.driver_log(driver, severity, &message);
        }
        // With JSON logs the line is queued as it is (its message joined once, no fields
        // visited), else logged as an event.
        use tracing::Level;
        let level = match severity {
            "WARNING" | "ERROR" | "CRITICAL" => Level::WARN,
            "DEBUG" => Level::DEBUG,
            _ => Level::INFO,
        };
        if crate::logging::queue_wanted_driver_line(level, driver, &message).is_none() {
            let enabled = match level {
                Level::WARN => tracing::enabled!(target: "driver", Level::WARN),
                Level::DEBUG => tracing::enabled!(target: "driver", Level::DEBUG),
                _ => tracing::enabled!(target: "driver", Level::INFO),
            };
            if enabled && !crate::logging::queue_driver_line(level, driver, &message) {
                match level {
                    Level::WARN => tracing::warn!(target: "driver", "[driver.{driver}] {message}"),
                    Level::DEBUG => {
                        tracing::debug!(target: "driver", "[driver.{driver}] {message}")
                    }
                    _ => tracing::info!(target: "driver", "[driver.{driver}] {message}"),
                }
            }
        }
        // A record only for a `LogStream` that is open: without one, nobody would get it.
        if self.tx.receiver_count() == 0 {
            return;
        }
        let _ = self.tx.send(LogStreamResponse {
            uuid: String::new(),
            severity: severity.to_string(),
            message,
            source: Some(LogSource::Driver as i32),
            driver_type: Some(driver.to_string()),
            timestamp: Some(now()),
            ..Default::default()
        });
    }

    /// Records one line of hook output (or a hook's failure) under `source`
    /// (`BEFORE_LEASE_HOOK` / `AFTER_LEASE_HOOK`); kept for the next `LogStream` when none
    /// is open. The observer is told of it too ([`LogObserver::hook_log`]).
    pub fn emit_hook(&self, source: LogSource, severity: &str, message: String) {
        if let Some(o) = self.observer() {
            o.hook_log(source, severity, &message);
        }
        let rec = LogStreamResponse {
            uuid: String::new(),
            severity: severity.to_string(),
            message,
            source: Some(source as i32),
            timestamp: Some(now()),
            ..Default::default()
        };
        let mut backlog = self.backlog.lock().unwrap_or_else(|p| p.into_inner());
        if self.tx.receiver_count() == 0 {
            if backlog.len() == HOOK_BACKLOG {
                backlog.pop_front();
            }
            backlog.push_back(rec);
        } else {
            let _ = self.tx.send(rec);
        }
    }

    pub(crate) fn subscribe(
        &self,
    ) -> (
        Vec<LogStreamResponse>,
        broadcast::Receiver<LogStreamResponse>,
    ) {
        let mut backlog = self.backlog.lock().unwrap_or_else(|p| p.into_inner());
        (backlog.drain(..).collect(), self.tx.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observer_is_told_of_hook_lines_apart() {
        struct Hooks(Mutex<Vec<String>>);
        impl LogObserver for Hooks {
            fn driver_log(&self, _: &str, _: &str, _: &str) {}
            fn hook_log(&self, source: LogSource, severity: &str, message: &str) {
                self.0
                    .lock()
                    .unwrap()
                    .push(format!("{} {severity} {message}", source.as_str_name()));
            }
        }
        let sink = LogSink::default();
        let seen = Arc::new(Hooks(Mutex::default()));
        sink.set_observer(seen.clone());
        sink.emit("MockPower", "INFO", "power on".into());
        sink.emit_hook(LogSource::AfterLeaseHook, "INFO", "wiping".into());
        assert_eq!(
            *seen.0.lock().unwrap(),
            ["LOG_SOURCE_AFTER_LEASE_HOOK INFO wiping"]
        );
    }

    #[test]
    fn an_observer_is_told_of_driver_lines_not_hook_lines() {
        struct Seen(Mutex<Vec<String>>);
        impl LogObserver for Seen {
            fn driver_log(&self, driver: &str, severity: &str, message: &str) {
                self.0
                    .lock()
                    .unwrap()
                    .push(format!("{driver} {severity} {message}"));
            }
        }
        let sink = LogSink::default();
        let seen = Arc::new(Seen(Mutex::default()));
        sink.clone().set_observer(seen.clone());
        sink.emit("MockPower", "INFO", "power on".into());
        sink.emit_hook(LogSource::BeforeLeaseHook, "INFO", "flashing".into());
        assert_eq!(*seen.0.lock().unwrap(), ["MockPower INFO power on"]);
    }

    #[test]
    fn driver_records_carry_their_driver_type_and_time_and_hook_records_their_time() {
        let sink = LogSink::default();
        let (_, mut rx) = sink.subscribe();
        sink.emit("MockPower", "INFO", "power on".into());
        sink.emit_hook(LogSource::BeforeLeaseHook, "INFO", "flashing".into());
        let driver = rx.try_recv().unwrap();
        assert_eq!(driver.driver_type.as_deref(), Some("MockPower"));
        assert_eq!(driver.source, Some(LogSource::Driver as i32));
        let t = driver.timestamp.unwrap();
        assert!(t.seconds > 1_700_000_000, "{t:?}");
        let hook = rx.try_recv().unwrap();
        assert_eq!(hook.driver_type, None);
        assert!(hook.timestamp.is_some());
        assert!(hook.structured_fields.is_empty() && hook.operation.is_none());
    }
}
