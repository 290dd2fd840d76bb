//! What a driver call can fail with.

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
}

impl DriverError {
    /// Shorthand for [`DriverError::Failed`].
    pub fn failed(msg: impl std::fmt::Display) -> Self {
        DriverError::Failed(msg.to_string())
    }

    /// The gRPC status for this error: the one place driver errors meet status codes.
    pub fn to_status(&self) -> tonic::Status {
        use tonic::Code;
        let code = match self {
            DriverError::MethodNotFound(_) | DriverError::MissingMarker { .. } => Code::NotFound,
            DriverError::UnknownDriver(_) | DriverError::Failed(_) => Code::Unknown,
            DriverError::InvalidArgument(_) => Code::InvalidArgument,
            DriverError::Unimplemented(_) => Code::Unimplemented,
            DriverError::Timeout(_) => Code::DeadlineExceeded,
            DriverError::NotReady(_) => Code::FailedPrecondition,
        };
        tonic::Status::new(code, self.to_string())
    }

    /// The error a client sees for a gRPC status from a driver call.
    pub fn from_status(status: &tonic::Status) -> Self {
        use tonic::Code;
        let msg = status.message().to_string();
        match status.code() {
            Code::NotFound => DriverError::MethodNotFound(msg),
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
            std::io::ErrorKind::InvalidInput => DriverError::InvalidArgument(e.to_string()),
            std::io::ErrorKind::Unsupported => DriverError::Unimplemented(e.to_string()),
            _ => DriverError::Failed(e.to_string()),
        }
    }
}
