//! Jumpstarter core: the driver model and its three RPC styles, the Value codec, the
//! exporter session server, the client library and config files.
//!
//! - Write a driver: [`driver`](macro@driver) attribute + [`Driver`] trait ([`mod@driver`] explains).
//! - Serve drivers: build a [`DriverNode`] tree (or load an [`config::ExporterConfig`] with
//!   a [`registry::DriverRegistry`]), wrap it in a [`Session`], serve it with [`serve`].
//! - Call drivers: [`client::ExporterSession`].

extern crate self as jumpstarter_core;

pub mod auth;
pub mod channel;
pub mod client;
pub mod client_config;
pub mod config;
pub mod config_keys;
pub mod direct;
pub mod driver;
pub mod exporter;
pub mod frames;
pub mod grpc_options;
pub mod h2_authority;
pub mod hooks;
pub mod lease;
pub mod oidc;
pub mod registry;
pub mod resource;
pub mod serve;
pub mod session;
pub mod stream_rpc;
pub mod tree;
pub mod tunnel;
pub mod tunnel_conn;
pub mod value;

pub use client::ClientError;
pub use driver::{CallContext, Driver, DriverError};
pub use jumpstarter_macros::driver;
pub use session::Session;
pub use tree::DriverNode;

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
    Tls(String),
    /// The server stopped with an error.
    #[error("server error: {0}")]
    Serve(String),
}
