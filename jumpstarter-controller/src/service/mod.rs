//! The controller's gRPC services, the easy-login endpoint ([`login`]) and the size limits on
//! what they accept ([`limits`]).

pub mod admin;
pub mod admin_apply;
pub(crate) mod admin_checks;
pub mod admin_pools;
pub mod client;
pub mod controller;
pub mod devices;
pub mod limits;
pub mod live_exporters;
pub mod login;
pub mod telemetry;
pub mod token_expiry;
