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

/// Where driver log records go: `tracing` (target `driver`) and the session's `LogStream`.
#[derive(Clone)]
pub struct LogSink {
    tx: broadcast::Sender<LogStreamResponse>,
    /// Hook records emitted while no `LogStream` was open; the next one replays them (as
    /// upstream's session queue keeps records until a client takes them).
    backlog: Arc<Mutex<std::collections::VecDeque<LogStreamResponse>>>,
}

impl Default for LogSink {
    fn default() -> Self {
        Self {
            tx: broadcast::channel(LOG_BUFFER).0,
            backlog: Arc::default(),
        }
    }
}

impl LogSink {
    /// Records one driver log line.
    pub fn emit(&self, driver: &str, severity: &str, message: String) {
        match severity {
            "WARNING" | "ERROR" | "CRITICAL" => {
                tracing::warn!(target: "driver", "[driver.{driver}] {message}")
            }
            "DEBUG" => tracing::debug!(target: "driver", "[driver.{driver}] {message}"),
            _ => tracing::info!(target: "driver", "[driver.{driver}] {message}"),
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
    /// is open.
    pub fn emit_hook(&self, source: LogSource, severity: &str, message: String) {
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
