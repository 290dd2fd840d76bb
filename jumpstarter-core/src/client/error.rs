//! What client operations fail with.

use tonic::Status;

use crate::DriverError;

/// Why a client operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The exporter could not be reached.
    #[error("cannot connect to {target}: {message}")]
    Connect {
        /// The address or socket path.
        target: String,
        /// Why.
        message: String,
    },
    /// The exporter refused the passphrase.
    #[error("Authentication failed: {0}")]
    Authentication(String),
    /// A driver call failed.
    #[error("{driver}.{method}: {error}")]
    Call {
        /// The driver path (`power`).
        driver: String,
        /// The method.
        method: String,
        /// The error, mapped from the gRPC status.
        error: DriverError,
    },
    /// An RPC other than a driver call failed.
    #[error("{rpc} failed: {status}")]
    Rpc {
        /// The RPC.
        rpc: &'static str,
        /// The status.
        status: Box<Status>,
    },
    /// No driver at that path in the exporter's tree.
    #[error("no driver named {path:?} in this exporter (available: {available})")]
    NoSuchDriver {
        /// The requested path.
        path: String,
        /// The paths that exist.
        available: String,
    },
    /// The exporter's report is inconsistent.
    #[error("invalid report from exporter: {0}")]
    Report(String),
    /// A value could not be encoded or decoded.
    #[error("{0}")]
    Value(String),
    /// Local I/O failed during a transfer.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl ClientError {
    pub(crate) fn rpc(rpc: &'static str, status: Status) -> Self {
        if status.code() == tonic::Code::Unauthenticated {
            return ClientError::Authentication(status.message().to_string());
        }
        ClientError::Rpc {
            rpc,
            status: Box::new(status),
        }
    }
}

/// An error and its sources on one line (`a: b: c`), skipping repeats.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        src = s.source();
    }
    out
}
