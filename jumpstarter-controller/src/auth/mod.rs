//! Who is calling: the controller's own tokens for Clients and Exporters ([`TokenIssuer`]),
//! the authentication metadata of controller RPCs ([`AuthMetadata`]), the verification of
//! external OIDC issuers' tokens ([`ExternalVerifier`], configured by Kubernetes
//! `JWTAuthenticator` documents), the set of issuers a controller accepts and Client
//! provisioning ([`ExternalAuth`](crate::ExternalAuth), `external_auth.rs`), and the admin
//! credential (`admin_token.rs`).
//!
//! The building blocks (JWS over `ring`, [`Subject`](jumpstarter_core::auth::Subject), the
//! CA) are in [`jumpstarter_core::auth`]; the router's tokens are
//! [`jumpstarter_router::RouterTokenKey`].

pub(crate) mod admin_token;
pub(crate) mod external_auth;
mod metadata;
mod oidc;
mod token;

pub use metadata::{AuthMetadata, derive_object_name, resolve_object_name};
pub use oidc::{
    ClaimMappings, ClaimValidationRule, ExternalVerifier, IssuerConfig, JwtAuthenticatorConfig,
    UsernameMapping,
};
pub use token::{
    DEFAULT_AUDIENCE, DEFAULT_TOKEN_LIFETIME, INTERNAL_USERNAME_PREFIX, IssuedToken, TokenIssuer,
};
