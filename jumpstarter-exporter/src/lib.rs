//! The Jumpstarter exporter runtime, as a library: what `jmp run` does, for any Rust
//! program that wants its own exporter binary or serves drivers in-process (a test
//! harness, a lab's own tool).
//!
//! An [`Exporter`] takes an exporter config and the driver registry that maps its `type:`
//! names to constructors (the stock one is `jumpstarter_drivers::stock_registry()`). It
//! builds the driver tree (types no Rust driver provides are hosted by one Python child,
//! see `docs/python-drivers.md`) and then serves it in one of three ways:
//!
//! - [`Exporter::run`]: controller mode. Register with the controller of the config, wait
//!   for leases, serve each lease's client through the router (and the direct listener, if
//!   any), run the lease hooks and health checks, reconnect after any drop, and say goodbye
//!   at shutdown.
//! - [`Exporter::standalone`] then [`Standalone::serve_tcp`]: standalone mode (`jmp run
//!   --tls-grpc-listener`), one session on a TCP listener, with the beforeLease hook at
//!   start and the afterLease hook at shutdown.
//! - [`Exporter::local`] then [`Local::serve_unix`]: an in-process exporter on a Unix
//!   socket, without hooks (`jmp shell --exporter-config`).
//!
//! ```no_run
//! use jumpstarter_core::{config::ExporterConfig, driver::DriverRegistry};
//! use jumpstarter_exporter::Exporter;
//!
//! # async fn example(registry: DriverRegistry) -> Result<(), Box<dyn std::error::Error>> {
//! let config = ExporterConfig::load(std::path::Path::new("/etc/jumpstarter/exporters/lab.yaml"))?;
//! Exporter::from_config(config, registry)
//!     .run(async {
//!         let _ = tokio::signal::ctrl_c().await;
//!     })
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! The parts the facade assembles are public for embedders that need them apart: the
//! driver tree with its Python child ([`build_tree`], [`PythonDrivers`]), controller mode
//! with explicit options ([`run_with_options`], [`ExporterOptions`], [`ControllerTarget`]),
//! and the lease hooks and health checks ([`hooks`]).

mod bridge;
mod controller;
mod exporter;
pub mod hooks;
pub mod metrics;
mod standalone;
pub mod telemetry;
pub mod transcript;

pub use bridge::{BuildError, PythonDrivers, StartError, build_tree, check_config};
pub use controller::{Backoff, ControllerTarget, ExporterError, ExporterOptions, run_with_options};
pub use exporter::{Exporter, Local};
pub use standalone::Standalone;
