//! What a driver call can fail with.

use std::sync::Arc;

use crate::{Because, BoxError};

/// The error a [`DriverError::Other`] or [`DriverError::Invalid`] holds (shared, so that a
/// `DriverError` stays `Clone`).
pub type SharedError = Arc<dyn std::error::Error + Send + Sync>;

/// What a driver call can fail with; each maps to the gRPC code upstream uses.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DriverError {
    /// No method of that name (NOT_FOUND).
    #[error("method {0} not found on driver")]
    MethodNotFound(String),
    /// The method exists but not for this call style (NOT_FOUND).
    #[error("method {method} missing marker {marker}")]
    MissingMarker {
        /// The method asked for.
        method: String,
        /// The upstream marker name of the call style (e.g. `marker_drivercall`).
        marker: &'static str,
    },
    /// Something else not found, with the whole message (NOT_FOUND): what a client makes of
    /// a NOT_FOUND status that is not [`DriverError::MethodNotFound`]'s text.
    #[error("{0}")]
    NotFound(String),
    /// No driver with that uuid in this exporter (UNKNOWN, as upstream).
    #[error("Unexpected <class 'KeyError'>: UUID('{0}')")]
    UnknownDriver(String),
    /// An argument has the wrong type or value (INVALID_ARGUMENT).
    #[error("{0}")]
    InvalidArgument(String),
    /// The driver does not implement this (UNIMPLEMENTED).
    #[error("{0}")]
    Unimplemented(String),
    /// The operation timed out (DEADLINE_EXCEEDED).
    #[error("{0}")]
    Timeout(String),
    /// The exporter is not in a state to serve calls (FAILED_PRECONDITION).
    #[error("{0}")]
    NotReady(String),
    /// Anything else (UNKNOWN, with the message as upstream's `str(e)`).
    #[error("{0}")]
    Failed(String),
    /// An argument is unusable, and this error says why (INVALID_ARGUMENT; the message is
    /// the error's text). The error stays the source.
    #[error(transparent)]
    Invalid(SharedError),
    /// Anything else, caused by this error (UNKNOWN, as [`DriverError::Failed`]; the message
    /// is the error's text). The error stays the source.
    #[error(transparent)]
    Other(SharedError),
}

impl DriverError {
    /// Shorthand for [`DriverError::Failed`].
    pub fn failed(msg: impl std::fmt::Display) -> Self {
        DriverError::Failed(msg.to_string())
    }

    /// A [`DriverError::Other`]: `source`, met while doing `context` (the message is
    /// `context`, its chain `context: source`).
    pub fn because(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        DriverError::Other(Arc::from(Because::boxed(context, source)))
    }

    /// A [`DriverError::Invalid`]: an argument is unusable because of `source`, found while
    /// doing `context` (the message is `context`, its chain `context: source`).
    pub fn invalid_because(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        DriverError::Invalid(Arc::from(Because::boxed(context, source)))
    }

    /// A [`DriverError::Other`] holding `e`.
    pub fn other(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        DriverError::Other(Arc::new(e))
    }

    /// A [`DriverError::Invalid`] holding `e`.
    pub fn invalid(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        DriverError::Invalid(Arc::new(e))
    }

    /// The gRPC status for this error: the one place driver errors meet status codes.
    pub fn to_status(&self) -> tonic::Status {
        use tonic::Code;
        let code = match self {
            DriverError::MethodNotFound(_)
            | DriverError::MissingMarker { .. }
            | DriverError::NotFound(_) => Code::NotFound,
            DriverError::UnknownDriver(_) | DriverError::Failed(_) | DriverError::Other(_) => {
                Code::Unknown
            }
            DriverError::InvalidArgument(_) | DriverError::Invalid(_) => Code::InvalidArgument,
            DriverError::Unimplemented(_) => Code::Unimplemented,
            DriverError::Timeout(_) => Code::DeadlineExceeded,
            DriverError::NotReady(_) => Code::FailedPrecondition,
        };
        tonic::Status::new(code, crate::error_chain(self))
    }

    /// The error a client sees for a gRPC status from a driver call.
    pub fn from_status(status: &tonic::Status) -> Self {
        use tonic::Code;
        let msg = status.message().to_string();
        match status.code() {
            // The message is kept as it came: "method X not found on driver" gives back
            // `MethodNotFound(X)` (its text is the same again), anything else stays whole.
            // Wrapping the whole text again doubled it at every hop (a Python driver behind
            // the bridge read "method method X not found on driver not found on driver").
            Code::NotFound => match msg
                .strip_prefix("method ")
                .and_then(|m| m.strip_suffix(" not found on driver"))
            {
                Some(method) => DriverError::MethodNotFound(method.to_string()),
                None => DriverError::NotFound(msg),
            },
            Code::InvalidArgument => DriverError::InvalidArgument(msg),
            Code::Unimplemented => DriverError::Unimplemented(msg),
            Code::DeadlineExceeded => DriverError::Timeout(msg),
            Code::FailedPrecondition => DriverError::NotReady(msg),
            _ => DriverError::Failed(msg),
        }
    }
}

impl From<std::io::Error> for DriverError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::TimedOut => DriverError::Timeout(e.to_string()),
            std::io::ErrorKind::InvalidInput => DriverError::invalid(e),
            std::io::ErrorKind::Unsupported => DriverError::Unimplemented(e.to_string()),
            _ => DriverError::other(e),
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_not_found_status_keeps_its_message_through_any_number_of_hops() {
        let first = DriverError::MethodNotFound("nosuch".into()).to_status();
        assert_eq!(first.code(), tonic::Code::NotFound);
        // Client to bridge to client: the same status every time.
        let mut status = first.clone();
        for _ in 0..3 {
            let e = DriverError::from_status(&status);
            assert!(
                matches!(&e, DriverError::MethodNotFound(m) if m == "nosuch"),
                "{e:?}"
            );
            status = e.to_status();
            assert_eq!(status.message(), first.message());
            assert_eq!(status.code(), tonic::Code::NotFound);
        }
        let marker = DriverError::MissingMarker {
            method: "on".into(),
            marker: "marker_drivercall",
        }
        .to_status();
        let e = DriverError::from_status(&marker);
        assert_eq!(e.to_string(), marker.message());
        assert_eq!(e.to_status().code(), tonic::Code::NotFound);
    }

    use super::*;

    #[test]
    fn a_cause_is_kept_as_the_source_and_printed_once_by_the_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = DriverError::because("cannot open /x", io);
        assert_eq!(e.to_string(), "cannot open /x");
        assert_eq!(crate::error_chain(&e), "cannot open /x: no such file");
        let source = std::error::Error::source(&e).expect("the io error is the source");
        assert_eq!(source.to_string(), "no such file");
        assert!(source.downcast_ref::<std::io::Error>().is_some());
        let status = e.clone().to_status();
        assert_eq!(status.code(), tonic::Code::Unknown);
        assert_eq!(status.message(), "cannot open /x: no such file");

        let bad = DriverError::invalid_because("disk_size", "not a size");
        assert_eq!(bad.to_status().code(), tonic::Code::InvalidArgument);
        assert_eq!(bad.to_string(), "disk_size");
        assert_eq!(crate::error_chain(&bad), "disk_size: not a size");
        assert_eq!(bad.to_status().message(), "disk_size: not a size");

        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = DriverError::from(io);
        assert_eq!(e.to_string(), "denied");
        assert!(matches!(e, DriverError::Other(_)));
        assert_eq!(e.to_status().code(), tonic::Code::Unknown);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidInput, "bad");
        assert_eq!(
            DriverError::from(io).to_status().code(),
            tonic::Code::InvalidArgument
        );
    }
}
