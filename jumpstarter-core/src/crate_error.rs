//! [`Error`]: the crate's one error type, as kube-rs and reqwest give theirs. Each area keeps
//! its own enum (what a function of that area returns); `Error` wraps any of them
//! (`From` for each, so `?` works across areas) without repeating their messages: its
//! `Display` and `source` are the wrapped error's own.

use crate::{
    auth::{TlsError, TokenError},
    client::{ClientError, lease::LeaseError, tunnel::TunnelError},
    config::ConfigError,
    driver::{DriverError, value::ValueError},
    error::{BoxError, CoreError},
    oidc::OidcError,
};

/// Any error of this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reaching an exporter or calling its drivers ([`ClientError`]).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The controller, a lease or its hooks ([`LeaseError`]).
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// A config file ([`ConfigError`]).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A driver call, on the exporter side ([`DriverError`]).
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// A call argument or result that does not fit ([`ValueError`]).
    #[error(transparent)]
    Value(#[from] ValueError),
    /// Serving a session ([`CoreError`]).
    #[error(transparent)]
    Server(#[from] CoreError),
    /// A router tunnel ([`TunnelError`]).
    #[error(transparent)]
    Tunnel(#[from] TunnelError),
    /// A token ([`TokenError`]).
    #[error(transparent)]
    Token(#[from] TokenError),
    /// TLS material ([`TlsError`]).
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Signing in with OIDC ([`OidcError`]).
    #[error(transparent)]
    Oidc(#[from] OidcError),
    /// Anything else a caller met on the way (an I/O error of its own, say).
    #[error(transparent)]
    Other(BoxError),
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn the_wrapper_adds_nothing_to_the_message_or_the_chain() {
        let inner = LeaseError::Invalid("the lease name is empty".into());
        let text = inner.to_string();
        let e = Error::from(inner);
        assert_eq!(e.to_string(), text);
        assert!(
            e.source().is_none(),
            "{:?}",
            e.source().map(|s| s.to_string())
        );
        let io = std::io::Error::other("disk full");
        let e = Error::Other(Box::new(io));
        assert_eq!(crate::error_chain(&e), "disk full");
    }

    /// An error that only wraps another says what the other says, once: its chain does not
    /// repeat the message.
    #[test]
    fn wrapping_variants_do_not_repeat_their_cause() {
        let e = Error::from(ClientError::from(std::io::Error::other("disk full")));
        assert_eq!(e.to_string(), "disk full");
        assert!(e.source().is_none());
        let e = Error::from(TunnelError::from(std::io::Error::other("reset")));
        assert!(e.source().is_none());
        let json = serde_json::from_str::<u8>("x").unwrap_err();
        let text = json.to_string();
        let e = Error::from(ValueError::Shape(json));
        assert_eq!((e.to_string(), e.source().is_none()), (text, true));
    }

    #[test]
    fn a_lease_error_names_the_socket_and_keeps_the_cause_once() {
        let e = Error::from(LeaseError::Listen {
            path: "/run/x.sock".into(),
            source: std::io::Error::other("address in use"),
        });
        assert_eq!(e.to_string(), "cannot listen on /run/x.sock");
        assert_eq!(
            crate::error_chain(&e),
            "cannot listen on /run/x.sock: address in use"
        );
    }
}
