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

pub mod auth;
pub mod cli;
pub mod cluster_config;
pub mod crd;
pub mod key_secret;
pub mod objects;
pub mod store;
#[cfg(all(feature = "kubernetes", any(test, feature = "test-util")))]
pub mod testing;

mod admin_token;
mod backup;
mod data_dir;
mod duration;
mod events;
mod exporter_view;
mod external_auth;
#[cfg(test)]
mod fuzz_tests;
mod leader;
mod lease_gc;
mod lease_update;
mod limits;
mod login_service;
mod metrics;
mod object_view;
mod owner_refs;
mod pending_guard;
mod pid_lock;
mod reconcile;
mod scheduler;
mod selector;
mod server;
mod service;
mod state;

pub use duration::GoDuration;
pub use external_auth::{ExternalAuth, read_authentication_file};
pub use pending_guard::REASON_CLIENT_GONE;
pub use reconcile::{reconcile_once, run as run_reconcile_loop};
pub use selector::{LabelSelector, SelectorError};
pub use server::{ControllerConfig, RunningController, ServerError, start, start_with_store};
pub use service::{admin::AdminApi, client::ClientApi, controller::ControllerApi};
pub use state::{Authenticator, Caller, ControllerState, ExporterCache, ListenQueues, RouterEntry};
