//! The controller's gRPC services.

pub mod admin;
pub mod client;
pub mod controller;
pub mod devices;
