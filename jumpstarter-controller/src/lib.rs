//! The Jumpstarter controller: inventory, authentication and lease scheduling.
//!
//! # Entry points
//! - [`cli::main`]: the `jumpstarter-controller` binary (flags in [`cli::Args`]).
//! - [`start`] with a [`ControllerConfig`]: a whole controller in-process (gRPC services, the
//!   in-process router, the reconcile loop, optional metrics and login listeners) over the
//!   SQLite store in its data directory; [`start_with_store`] over any [`store::Store`]
//!   (e.g. [`store::KubeStore`] on a cluster). Both return a [`RunningController`].
//! - [`objects`]: the CRD types (Client, Exporter, Lease, ExporterAccessPolicy) and [`crd`]
//!   their schemas; [`store`]: where they live.
//! - [`cluster_config`] and [`key_secret`]: the ConfigMap and Secrets of a Kubernetes
//!   deployment.
//! - The parts [`start_with_store`] assembles, for embedding them differently: the shared
//!   [`ControllerState`], the gRPC services [`ClientApi`], [`ControllerApi`] and [`AdminApi`],
//!   and the reconcile loop ([`run_reconcile_loop`], one pass: [`reconcile_once`]).
//!
//! # Embed a controller
//!
//! A whole controller in a test or a tool: the SQLite store in a data directory of your
//! choice, everything on loopback with ports the OS picks.
//!
//! ```
//! use jumpstarter_controller::{ControllerConfig, start};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let data_dir = tempfile::tempdir()?;
//! let controller = start(ControllerConfig::loopback(data_dir.path().to_path_buf())).await?;
//! // Clients and exporters use this endpoint and trust this CA (`jmp admin create` writes
//! // both into the configs it makes, with the admin token).
//! assert!(controller.ca_pem.contains("BEGIN CERTIFICATE"));
//! println!("controller at {}, router at {}", controller.endpoint, controller.router_addr);
//! controller.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # Layout
//! The files are in folders by job:
//! - `service/`: the gRPC services ([`AdminApi`], [`ClientApi`], [`ControllerApi`], the
//!   client API extensions), the easy-login endpoint and the size limits on every request.
//! - `lease/`: scheduling and leases: the scheduler (a pure function), the reconcile loop
//!   that runs it, a client's change to its lease, garbage collection of ended leases, the
//!   guard against queued leases nobody waits for, and the copies of objects the loop keeps.
//! - [`store`]: where the objects live ([`store::Store`], SQLite and Kubernetes backends),
//!   the data directory, its PID lock, and backup/restore of the SQLite store.
//! - [`auth`]: who is calling: the controller's tokens, OIDC verification, external issuers
//!   ([`ExternalAuth`]) and the admin token.
//! - `kubernetes/`: what a cluster deployment adds: [`crd`], [`cluster_config`],
//!   [`key_secret`], leader election, Events about exporters and owner references.
//! - `ui/`: the web dashboard (`--ui-listen`, see `docs/dashboard.md`).
//! - [`objects`]: the data model, with [`GoDuration`] and [`LabelSelector`].
//! - At the root: [`cli`], `server.rs` ([`start`]), `state.rs` ([`ControllerState`]),
//!   `metrics.rs` (Prometheus), `testing/` (the `test-util` fakes).

pub mod auth;
pub mod cli;
pub mod objects;
pub mod pools;
pub mod store;
#[cfg(all(feature = "kubernetes", any(test, feature = "test-util")))]
pub mod testing;

#[cfg(test)]
mod fuzz_tests;
pub mod hook_history;
mod kubernetes;
mod lease;
pub mod lease_logs;
mod metrics;
mod server;
mod service;
mod state;
mod ui;

pub use auth::external_auth::{ExternalAuth, read_authentication_file};
pub use kubernetes::{cluster_config, crd, key_secret};
pub use lease::{
    pending_guard::REASON_CLIENT_GONE,
    reconcile::{reconcile_once, run as run_reconcile_loop},
};
pub use objects::{
    duration::GoDuration,
    selector::{LabelSelector, SelectorError},
};
pub use server::{ControllerConfig, RunningController, ServerError, start, start_with_store};
pub use service::{admin::AdminApi, client::ClientApi, controller::ControllerApi};
pub use state::{Authenticator, Caller, ControllerState, ExporterCache, ListenQueues, RouterEntry};
