//! Credentials and TLS building blocks shared by the controller, the router and their clients.
//!
//! - [`CertificateAuthority`]: a small ECDSA P-256 CA kept in a directory, issuing server
//!   and client certificates; [`read_cert_pem`], [`read_key_pem`], [`load_identity`] read PEM
//!   files with errors that name the file.
//! - [`jwt`]: compact JWS encoding and verification over `ring`, on which the controller's
//!   tokens (in `jumpstarter-controller`) and the router's tokens (in `jumpstarter-router`)
//!   are built; [`Subject`] and [`TokenError`] are theirs.
//! - [`bearer_token`] and the `jumpstarter-*` metadata keys of controller RPCs.
//!
//! JWTs are encoded and verified here over `ring` (already in the tree through TLS) rather
//! than through a JWT crate, to avoid a second crypto stack; only ES256 and HS256/384/512
//! are accepted, and the algorithm a key expects is fixed by the verifier, never by the
//! token header.

mod bearer;
mod ca;
pub mod jwt;
pub mod pem;

use std::fmt;

pub use bearer::{EXPORTER_INSTANCE_HEADER, KIND_KEY, NAME_KEY, NAMESPACE_KEY, bearer_token};
pub use ca::{
    CA_CERT_FILE, CA_KEY_FILE, CertificateAuthority, IssuedCert, TlsError, load_identity,
    read_cert_pem, read_key_pem,
};

/// `iss` of the controller's own tokens (upstream's internal issuer URL); `jmp login` tells
/// them from external issuers' tokens by it.
pub const DEFAULT_ISSUER: &str = "https://localhost:8085";

/// A token could not be issued, loaded or verified.
///
/// Controller RPCs report these as `UNKNOWN` with the message (see
/// [`TokenError::to_controller_status`]), as upstream does; the Python client re-logs in
/// when the message contains "token is expired", which [`TokenError::Expired`] keeps.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token is not a well-formed compact JWT (three base64url parts, JSON header and claims).
    #[error("malformed token: {0}")]
    Malformed(String),
    /// The header names an algorithm this verifier does not accept.
    #[error("unexpected token signing algorithm {0:?}")]
    Algorithm(String),
    /// The signature does not verify with the key.
    #[error("invalid token signature")]
    Signature,
    /// `exp` has passed.
    #[error("token is expired (exp {exp}, now {now})")]
    Expired {
        /// The token's `exp` (Unix seconds).
        exp: i64,
        /// The verifier's clock (Unix seconds).
        now: i64,
    },
    /// `nbf` has not been reached yet.
    #[error("token is not valid yet (nbf {nbf}, now {now})")]
    NotYetValid {
        /// The token's `nbf` (Unix seconds).
        nbf: i64,
        /// The verifier's clock (Unix seconds).
        now: i64,
    },
    /// `iat` is in the future.
    #[error("token used before issued (iat {iat}, now {now})")]
    IssuedInFuture {
        /// The token's `iat` (Unix seconds).
        iat: i64,
        /// The verifier's clock (Unix seconds).
        now: i64,
    },
    /// A required claim is absent or has the wrong JSON type.
    #[error("token has no valid {0:?} claim")]
    MissingClaim(&'static str),
    /// `iss` is not the expected issuer.
    #[error("token issuer {found:?} is not {expected:?}")]
    Issuer {
        /// What the verifier expects.
        expected: String,
        /// What the token says.
        found: String,
    },
    /// `aud` does not contain the expected audience.
    #[error("token audience {found:?} does not include {expected:?}")]
    Audience {
        /// What the verifier expects.
        expected: String,
        /// What the token says.
        found: Vec<String>,
    },
    /// `sub` is not `<client|exporter>:<namespace>:<name>:<uid>`.
    #[error("token subject {0:?} is not <client|exporter>:<namespace>:<name>:<uid>")]
    Subject(String),
    /// The signing key could not be generated, read, parsed or written.
    #[error("signing key {path}")]
    Key {
        /// The key file, or `<generated>` / `<memory>`.
        path: String,
        /// What went wrong: the parser's error, or a message.
        #[source]
        source: crate::BoxError,
    },
    /// The signing key file could not be read or written.
    #[error("signing key {path}: {what}")]
    KeyFile {
        /// The key file.
        path: String,
        /// `cannot read` or `cannot write`.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Signing failed (crypto backend error).
    #[error("cannot sign token: {0}")]
    Sign(String),
    /// The header or claims could not be encoded as JSON.
    #[error("cannot sign token: the header or claims cannot be encoded")]
    Encode(#[source] serde_json::Error),
}

impl TokenError {
    /// The status a controller RPC returns for this error: `UNKNOWN` with the message, as
    /// upstream's authenticator errors surface (the Python client matches "token is expired").
    pub fn to_controller_status(&self) -> tonic::Status {
        tonic::Status::unknown(crate::error_chain(self))
    }

    /// The status the router returns for any token failure: `UNAUTHENTICATED "invalid jwt token"`.
    pub fn to_router_status(&self) -> tonic::Status {
        tonic::Status::unauthenticated("invalid jwt token")
    }
}

/// The two kinds of controller objects that hold credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// A `Client` (people and CI jobs that lease exporters).
    Client,
    /// An `Exporter` (a host that serves drivers).
    Exporter,
}

impl ObjectKind {
    /// The Kubernetes kind name, as sent in `jumpstarter-kind` ("Client" / "Exporter").
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Client => "Client",
            ObjectKind::Exporter => "Exporter",
        }
    }

    /// The kind named by a `jumpstarter-kind` metadata value (exact match, as upstream).
    pub fn from_metadata(value: &str) -> Option<Self> {
        match value {
            "Client" => Some(ObjectKind::Client),
            "Exporter" => Some(ObjectKind::Exporter),
            _ => None,
        }
    }

    fn subject_prefix(self) -> &'static str {
        match self {
            ObjectKind::Client => "client",
            ObjectKind::Exporter => "exporter",
        }
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The subject of a controller token: `<client|exporter>:<namespace>:<name>:<uid>`
/// (upstream's `InternalSubject()`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Subject {
    /// Client or Exporter.
    pub kind: ObjectKind,
    /// The object's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The object's `metadata.uid` (a re-created object with the same name gets a new uid,
    /// which invalidates old tokens).
    pub uid: String,
}

impl Subject {
    /// A subject from its parts.
    pub fn new(
        kind: ObjectKind,
        namespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
    ) -> Self {
        Subject {
            kind,
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    /// Parses `client:<ns>:<name>:<uid>` / `exporter:<ns>:<name>:<uid>`; every part non-empty.
    pub fn parse(sub: &str) -> Result<Self, TokenError> {
        let bad = || TokenError::Subject(sub.to_owned());
        let mut parts = sub.splitn(4, ':');
        let kind = match parts.next() {
            Some("client") => ObjectKind::Client,
            Some("exporter") => ObjectKind::Exporter,
            _ => return Err(bad()),
        };
        let (Some(namespace), Some(name), Some(uid)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        if namespace.is_empty() || name.is_empty() || uid.is_empty() || uid.contains(':') {
            return Err(bad());
        }
        Ok(Subject::new(kind, namespace, name, uid))
    }

    /// The username upstream's authorizer compares with: `prefix + subject`
    /// (prefix `INTERNAL_USERNAME_PREFIX` of `jumpstarter_controller::auth` by default).
    pub fn username(&self, prefix: &str) -> String {
        format!("{prefix}{self}")
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.kind.subject_prefix(),
            self.namespace,
            self.name,
            self.uid
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_round_trips() {
        let s = Subject::new(ObjectKind::Exporter, "lab", "board-1", "1234-abcd");
        assert_eq!(s.to_string(), "exporter:lab:board-1:1234-abcd");
        assert_eq!(Subject::parse(&s.to_string()).unwrap(), s);
        assert_eq!(
            s.username("internal:"),
            "internal:exporter:lab:board-1:1234-abcd"
        );
    }

    #[test]
    fn bad_subjects_are_rejected() {
        for bad in [
            "",
            "client",
            "client:ns:name",
            "robot:ns:name:uid",
            "client::name:uid",
            "client:ns::uid",
            "client:ns:name:",
            "client:ns:name:uid:extra",
            "Client:ns:name:uid",
        ] {
            assert!(
                matches!(Subject::parse(bad), Err(TokenError::Subject(_))),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn kinds_parse_exactly() {
        assert_eq!(
            ObjectKind::from_metadata("Client"),
            Some(ObjectKind::Client)
        );
        assert_eq!(
            ObjectKind::from_metadata("Exporter"),
            Some(ObjectKind::Exporter)
        );
        assert_eq!(ObjectKind::from_metadata("client"), None);
        assert_eq!(ObjectKind::from_metadata(""), None);
    }

    #[test]
    fn status_mappings_keep_upstream_texts() {
        let e = TokenError::Expired { exp: 1, now: 2 };
        let st = e.to_controller_status();
        assert_eq!(st.code(), tonic::Code::Unknown);
        assert!(st.message().contains("token is expired"));
        let st = TokenError::Signature.to_router_status();
        assert_eq!(st.code(), tonic::Code::Unauthenticated);
        assert_eq!(st.message(), "invalid jwt token");
    }
}
