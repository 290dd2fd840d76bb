//! The Jumpstarter controller: inventory, authentication and lease scheduling .

pub mod admin_token;
pub mod auth;
pub mod cli;
pub mod cluster_config;
pub mod crd;
pub mod duration;
pub mod events;
pub mod external_auth;
pub mod http1;
pub mod key_secret;
pub mod leader;
pub mod login_service;
pub mod metrics;
pub mod objects;
pub mod owner_refs;
pub mod reconcile;
pub mod scheduler;
pub mod selector;
pub mod server;
pub mod service;
pub mod state;
pub mod store;
