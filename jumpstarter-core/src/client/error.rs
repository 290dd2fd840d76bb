//! What client operations fail with.

use tonic::Status;

use std::sync::Arc;

use crate::{Because, BoxError, DriverError, driver::SharedError};

/// Why a client operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The exporter (or a controller, a router) could not be reached, or the settings to
    /// reach it are unusable.
    #[error("cannot connect to {target}")]
    Connect {
        /// The address, socket path or config file.
        target: String,
        /// Why: the transport's error (in a [`crate::client::TlsMismatch`] when a TLS
        /// setting does not match the exporter's), or a message where no error caused it.
        #[source]
        source: BoxError,
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
    /// A value could not be encoded or decoded, or a local input is unusable, and this error
    /// says why (the message is the error's text; the error stays the source).
    #[error(transparent)]
    Encoding(SharedError),
    /// Local I/O failed during a transfer.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl ClientError {
    /// A [`ClientError::Connect`] for `target`, caused by `source` (an error or a message).
    pub fn connect(target: impl Into<String>, source: impl Into<BoxError>) -> Self {
        ClientError::Connect {
            target: target.into(),
            source: source.into(),
        }
    }

    /// A [`ClientError::Encoding`] holding `e`.
    pub fn encoding(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        ClientError::Encoding(Arc::new(e))
    }

    /// A [`ClientError::Encoding`]: `source`, met while doing `context` (the message is
    /// `context: source`).
    pub fn encoding_because(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        ClientError::Encoding(Arc::from(Because::boxed(context, source)))
    }

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
