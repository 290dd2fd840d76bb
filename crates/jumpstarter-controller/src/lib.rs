//! The Jumpstarter controller: inventory, authentication and lease scheduling .

pub mod cli;
pub mod duration;
pub mod objects;
pub mod reconcile;
pub mod scheduler;
pub mod selector;
pub mod server;
pub mod service;
pub mod state;
pub mod store;
