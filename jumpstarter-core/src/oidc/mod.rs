//! External OpenID Connect: the client side of `jmp login` / `jmp auth refresh`
//! ([`discover`], the token grants, PKCE), and the HTTPS client and errors the controller's
//! verifier of external issuers' tokens (in `jumpstarter-controller`) shares.
//!
//! Discovery documents, JWKS and token endpoints are reached with [`HttpsClient`] (HTTPS with
//! the system roots plus an optional CA; plain HTTP only to loopback hosts).

mod client;
mod http;

pub use client::{
    DEVICE_CODE_GRANT, DeviceAuthorization, DevicePoll, Discovery, TokenResponse, code_grant,
    device_authorization, device_token_poll, discover, password_grant, pkce_pair, random_state,
    refresh_grant, token_exchange_grant, token_issuer, unverified_claims,
};
pub use http::{
    HttpResponse, HttpsClient, form_decode, form_encode, is_loopback_host, url_decode, url_encode,
};

use crate::auth::TokenError;

/// Something went wrong talking to an issuer or verifying one of its tokens.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// An HTTP exchange failed (connect, TLS, protocol, timeout).
    #[error("{url}: {reason}")]
    Http {
        /// The URL.
        url: String,
        /// What failed.
        reason: String,
    },
    /// An HTTP exchange failed for a reason another error gives (connect, TLS, protocol).
    #[error("{url}: {what}")]
    Transfer {
        /// The URL.
        url: String,
        /// The step that failed (`cannot connect`, `TLS`, ...).
        what: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A response body is not JSON.
    #[error("{url}: unexpected response")]
    NotJson {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The TLS settings are unusable for a reason rustls gives (a CA that is not PEM...).
    #[error("TLS settings: {what}")]
    TlsConfig {
        /// What is unusable.
        what: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// An HTTP request got an unexpected status.
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// A response is not the JSON expected.
    #[error("{url}: unexpected response: {reason}")]
    Json {
        /// The URL.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The TLS settings are unusable (a CA that is not PEM...).
    #[error("TLS settings: {0}")]
    Tls(String),
    /// A JWTAuthenticator document is unusable; names the field.
    #[error("JWT authenticator {issuer:?}: {field}")]
    Config {
        /// The issuer URL (or `<unknown>`).
        issuer: String,
        /// The field at fault, e.g. `issuer.audiences`.
        field: String,
        /// What is wrong: the parser's error, or a message.
        #[source]
        source: crate::BoxError,
    },
    /// The token is not acceptable (signature, claims, expiry: "token is expired").
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The token's `kid` names no key of the issuer's JWKS, even after fetching it again.
    #[error("token key id {kid:?} is not in the JWKS of issuer {issuer}")]
    UnknownKey {
        /// The issuer.
        issuer: String,
        /// The key id of the token.
        kid: String,
    },
    /// A claim required by the configuration is missing or has another value.
    #[error("token claim {claim:?}: {reason}")]
    Claim {
        /// The claim.
        claim: String,
        /// What is wrong.
        reason: String,
    },
    /// The token endpoint refused a grant (OAuth `error` / `error_description`).
    #[error("{endpoint}: {error}{}", description.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Grant {
        /// The token endpoint.
        endpoint: String,
        /// The OAuth error code (e.g. `invalid_grant`).
        error: String,
        /// Its description, when given.
        description: Option<String>,
    },
}

impl OidcError {
    /// The status a controller RPC returns: `UNKNOWN` with the message, as upstream's
    /// authenticator errors surface (the Python client matches "token is expired").
    pub fn to_controller_status(&self) -> tonic::Status {
        tonic::Status::unknown(crate::error_chain(self))
    }
}
