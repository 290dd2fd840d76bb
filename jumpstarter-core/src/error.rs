//! The errors of the session server.

/// Errors of the session server.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// A listener could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address or socket path.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TLS settings are unusable.
    #[error("TLS configuration: {0}")]
    Tls(#[source] tonic::transport::Error),
    /// The TLS certificate or key given to the listener is unusable.
    #[error("TLS certificate or key: {0}")]
    TlsIdentity(#[source] crate::auth::TlsError),
    /// The TLS certificate or key given to the listener is not PEM text.
    #[error("the TLS {0} is not PEM text")]
    NotPem(&'static str),
    /// The server stopped with an error.
    #[error("server error: {0}")]
    Serve(#[source] tonic::transport::Error),
}
