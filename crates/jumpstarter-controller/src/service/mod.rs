//! The controller's gRPC services.

pub mod client;
pub mod controller;
