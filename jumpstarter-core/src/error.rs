//! The errors of the session server; [`BoxError`] and [`Because`], the causes other errors
//! hold; [`error_chain`] to print any error with its causes.

/// Errors of the session server.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// A listener could not be opened.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address or socket path.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TLS settings are unusable.
    #[error("unusable TLS configuration")]
    Tls(#[source] tonic::transport::Error),
    /// The TLS certificate or key given to the listener is unusable.
    #[error("unusable TLS certificate or key")]
    TlsIdentity(#[source] crate::auth::TlsError),
    /// The TLS certificate or key given to the listener is not PEM text.
    #[error("the TLS {0} is not PEM text")]
    NotPem(&'static str),
    /// The server stopped with an error.
    #[error("the server failed")]
    Serve(#[source] tonic::transport::Error),
}

/// The cause an error holds: any error, or a message (`"...".into()`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An error with what was being done when it happened (`cannot serialize`); its source is
/// the error, so the chain (see [`error_chain`]) prints both.
#[derive(Debug, thiserror::Error)]
#[error("{context}")]
pub struct Because {
    /// What was being done.
    pub context: String,
    /// The error.
    #[source]
    pub source: BoxError,
}

impl Because {
    /// `source`, met while doing `context`, as the cause another error holds.
    pub fn boxed(context: impl Into<String>, source: impl Into<BoxError>) -> BoxError {
        Box::new(Because {
            context: context.into(),
            source: source.into(),
        })
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
