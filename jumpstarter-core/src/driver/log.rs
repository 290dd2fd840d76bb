//! Where driver log records go.

use jumpstarter_proto::v1::{LogSource, LogStreamResponse};
use tokio::sync::broadcast;

/// How many log records a `LogStream` subscriber may lag behind before it skips some.
const LOG_BUFFER: usize = 256;

/// Where driver log records go: `tracing` (target `driver`) and the session's `LogStream`.
#[derive(Clone)]
pub struct LogSink {
    tx: broadcast::Sender<LogStreamResponse>,
}

impl Default for LogSink {
    fn default() -> Self {
        Self {
            tx: broadcast::channel(LOG_BUFFER).0,
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
        });
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<LogStreamResponse> {
        self.tx.subscribe()
    }
}
