//! Jumpstarter core: the driver model and its three RPC styles, the Value codec, the
//! exporter session server, the client library and config files.
//!
//! - Write a driver: [`driver`](macro@driver) attribute + [`Driver`] trait ([`mod@driver`] explains).
//! - Serve drivers: build a [`DriverNode`] tree (or load an [`config::ExporterConfig`] with
//!   a [`driver::DriverRegistry`]), wrap it in a [`Session`], serve it with [`server`].
//! - Call drivers: [`client::ExporterSession`].

extern crate self as jumpstarter_core;

pub mod auth;
pub mod client;
pub mod config;
pub mod driver;
mod error;
pub mod hooks;
pub mod labels;
pub mod leftovers;
pub mod oidc;
pub mod private_file;
pub mod server;
pub mod sync;
pub mod wire;

#[cfg(test)]
mod fuzz_tests;

pub use client::{
    ClientError, ControllerClient, ExporterQuery, LeaseQuery, LeaseRequest, LeaseSession, LeaseUpdate,
};
pub use driver::{CallContext, Driver, DriverError, DriverNode, value};
pub use error::{Because, BoxError, CoreError, error_chain};
pub use jumpstarter_macros::driver;
pub use server::Session;
