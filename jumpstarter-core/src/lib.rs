//! Jumpstarter core: the driver model and its three RPC styles, the Value codec, the
//! exporter session server, the client library (with its facade for Rust programs that lease
//! boards: [`ControllerClient`], [`LeaseSession`]) and config files.
//!
//! What a program names is at the root:
//!
//! - **Lease and call:** [`ControllerClient`] (leases and exporters on the controller, as
//!   kube-rs's `Api<T>`: get/list/create/update/delete, paging included), [`LeaseRequest`],
//!   [`LeaseUpdate`], [`ExporterQuery`], [`LeaseQuery`]; [`LeaseSession`] (request, wait in
//!   the queue, connect, hooks, release); [`ExporterSession`] and [`DriverClient`] to call
//!   drivers; [`ConnectOptions`] to reach an exporter by address; [`ClientConfig`].
//! - **Write and serve drivers:** the [`driver`](macro@driver) attribute and the [`Driver`]
//!   trait ([`mod@driver`] explains), [`DriverNode`] trees, the [`DriverRegistry`] that builds
//!   them from an [`ExporterConfig`], a [`Session`] served by [`serve_unix`], [`serve_tcp`]
//!   or [`serve_tunnels`].
//! - **Errors:** one [`Error`], with a variant per area ([`ClientError`], [`LeaseError`],
//!   [`ConfigError`], [`DriverError`], ...) and `From` for each, so `?` works across them.
//!
//! # Lease a board by label, power it on, release it
//!
//! ```no_run
//! use std::time::Duration;
//! use jumpstarter_core::{ClientConfig, ControllerClient, LeaseRequest, LeaseSession};
//!
//! # async fn demo() -> Result<(), jumpstarter_core::Error> {
//! // The client config `jmp config client use` selected (or JMP_* variables).
//! let cfg = ClientConfig::resolve(None, None)?;
//! let controller = ControllerClient::connect(&cfg).await?;
//! let request = LeaseRequest::new("board=rpi4", Duration::from_secs(1800));
//! let lease = LeaseSession::builder(&controller, request)
//!     .on_wait(|lease, why| eprintln!("waiting for lease {lease}: {why}"))
//!     .connect()
//!     .await?;
//! lease.session()?.driver("power")?.call::<()>("on", ()).await?;
//! // Ends the session (the exporter's afterLease hook runs) and releases the lease.
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Serve a custom driver
//!
//! ```
//! use std::{collections::BTreeMap, sync::Arc};
//! use jumpstarter_core::{ConnectOptions, DriverError, DriverNode, ExporterSession, Session};
//!
//! /// A relay with one method.
//! struct Relay;
//!
//! #[jumpstarter_core::driver(client = "my_lab.client.RelayClient")]
//! impl Relay {
//!     /// Says which channel was switched.
//!     #[export]
//!     async fn switch(&self, channel: u32) -> Result<String, DriverError> {
//!         Ok(format!("channel {channel} on"))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), jumpstarter_core::Error> {
//! let tree = DriverNode::new(Arc::new(Relay)).with_child("relay", DriverNode::new(Arc::new(Relay)));
//! let dir = tempfile::tempdir().map_err(|e| jumpstarter_core::Error::Other(e.into()))?;
//! let socket = jumpstarter_core::server::local_socket_path(dir.path());
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let session = Session::new_ready(tree, BTreeMap::new());
//! let server = tokio::spawn(jumpstarter_core::serve_unix(session, &socket, async {
//!     let _ = stopped.await;
//! })?);
//!
//! // What `j` or a Rust program does on the other side.
//! let exporter = ExporterSession::connect(&socket.to_string_lossy(), &ConnectOptions::default()).await?;
//! let said: String = exporter.driver("relay")?.call("switch", (3,)).await?;
//! assert_eq!(said, "channel 3 on");
//! let _ = stop.send(());
//! let _ = server.await;
//! # Ok(()) }
//! ```

extern crate self as jumpstarter_core;

pub mod auth;
pub mod client;
pub mod config;
mod crate_error;
pub mod driver;
mod error;
pub mod hooks;
#[doc(hidden)]
pub mod labels;
#[doc(hidden)]
pub mod leftovers;
pub mod logging;
pub mod metrics;
#[doc(hidden)]
pub mod oidc;
#[doc(hidden)]
pub mod private_file;
pub mod server;
#[doc(hidden)]
pub mod sync;
pub mod telemetry;
pub mod tls;
pub mod wire;

#[cfg(test)]
mod fuzz_tests;

pub use client::{
    ClientError, ConnectOptions, ControllerClient, DriverClient, ExporterQuery, ExporterSession,
    LeaseQuery, LeaseRequest, LeaseSession, LeaseSessionBuilder, LeaseUpdate,
    lease::{LeaseError, parse_duration},
};
pub use config::{ClientConfig, ConfigError, ExporterConfig};
pub use crate_error::Error;
pub use driver::{CallContext, Driver, DriverError, DriverNode, DriverRegistry, value};
pub use error::{Because, BoxError, CoreError, error_chain};
pub use jumpstarter_macros::driver;
pub use server::{ServeOptions, Session, serve_tcp, serve_tunnels, serve_unix};
