//! [`LeaseError`]: why leasing or reaching an exporter failed (the error of the controller
//! client, the lease steps and [`crate::LeaseSession`]).

use tonic::Code;

use crate::client::ClientError;

/// Why leasing or reaching an exporter failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The controller (or the exporter through it) could not be reached.
    #[error(transparent)]
    Connect(ClientError),
    /// A controller RPC failed.
    #[error("{rpc}: {message}")]
    Rpc {
        /// The RPC.
        rpc: &'static str,
        /// Its gRPC code.
        code: Code,
        /// The controller's message.
        message: String,
    },
    /// The lease can never become ready (Unsatisfiable, Invalid) or has ended.
    #[error("lease {lease} {state}: {message}")]
    Failed {
        /// The lease name.
        lease: String,
        /// What happened (`cannot be satisfied`, `is invalid`, `has ended`).
        state: &'static str,
        /// The controller's condition message.
        message: String,
    },
    /// The lease was not ready within the acquisition timeout.
    #[error("lease {lease} was not ready within {secs}s (last status: {last})")]
    Timeout {
        /// The lease name.
        lease: String,
        /// The timeout.
        secs: u64,
        /// Why it was still waiting.
        last: String,
    },
    /// A bad argument (duration, selector, lease name).
    #[error("{0}")]
    Invalid(String),
    /// The exporter's beforeLease or afterLease hook failed (`onFailure: endLease` or
    /// `exit`), or the controller refused to connect for the exporter's state.
    #[error("lease {lease}: {message}")]
    Hook {
        /// The lease name.
        lease: String,
        /// The exporter's status message.
        message: String,
    },
    /// A local socket could not be opened.
    #[error("cannot listen on {path}")]
    Listen {
        /// The socket path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

impl LeaseError {
    pub(crate) fn rpc(rpc: &'static str, s: tonic::Status) -> Self {
        LeaseError::Rpc {
            rpc,
            code: s.code(),
            message: s.message().to_string(),
        }
    }
}
