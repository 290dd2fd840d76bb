//! The Jumpstarter router: pairs two `RouterService.Stream` calls that present router tokens
//! with the same subject (one from the client, one from the exporter) and forwards their
//! frames to each other unchanged.
//!
//! - Authentication: exactly one `authorization: Bearer <jwt>`, an HS256 router token signed
//!   with the key shared with the controller (issuer, audience, expiry checked); anything
//!   else is refused with `UNAUTHENTICATED "invalid jwt token"`.
//! - Pairing: the first stream of a subject waits (at most [`RouterConfig::pair_timeout`]);
//!   the second is paired with it. Unlike upstream, a subject pairs once: a third stream on
//!   the same token is refused (`ALREADY_EXISTS`), so a leaked token cannot splice into or
//!   hijack a live tunnel.
//! - Forwarding: frames are passed both ways through bounded channels, so a slow side slows
//!   the other and nothing buffers without bound. When one side ends or fails, both end.
//!   The RPC is spoken straight over HTTP/2 ([`jumpstarter_core::wire::stream_rpc`]): a payload
//!   leaves as a slice of the HTTP/2 frame it came in, never copied.
//!
//! Entry points: [`Router::new`] with a [`RouterTokenKey`] (the key shared with the
//! controller) and a [`RouterConfig`], then [`serve`] on a bound listener (or add
//! [`Router::service`] to your own tonic server); [`Router::stats`] gives the counters.
//! [`cli::main`] is the `jumpstarter-router` binary.
//!
//! # Run a router
//!
//! ```
//! use jumpstarter_core::server::listener::{ConnectionGuard, ConnectionLimits};
//! use jumpstarter_router::{Router, RouterConfig, RouterTokenKey, serve};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The key that signs router tokens; the controller that hands them out holds `secret`.
//! let (key, secret) = RouterTokenKey::generate()?;
//! assert!(!secret.is_empty());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! println!("router on {}", listener.local_addr()?);
//! let router = Router::new(key, RouterConfig::default());
//! let guard = ConnectionGuard::new("router", ConnectionLimits::default());
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! // Plaintext here; pass an `IssuedCert` for TLS.
//! let running = tokio::spawn(serve(router, listener, None, guard, async {
//!     let _ = stopped.await;
//! }));
//! let _ = stop.send(());
//! running.await??;
//! # Ok(()) }
//! ```

pub mod cli;
mod metrics;
mod router;
mod token;

pub use router::{Router, RouterConfig, RouterError, RouterStats, RouterStreamService, serve};
pub use token::{
    LEASE_CLAIM, LEASE_CONTEXT_CLAIM, ROUTER_AUDIENCE, ROUTER_ISSUER, ROUTER_TOKEN_LIFETIME,
    RouterToken, RouterTokenKey, VerifiedStream,
};
