//! The client side: connect to an exporter session and call its drivers
//! ([`ExporterSession`], [`DriverClient`]); reach controllers and routers ([`channel`]);
//! lease an exporter ([`lease`]), reach it through a router tunnel ([`tunnel`]) or directly
//! ([`direct`], whose listener is the server's `server::direct`).

pub mod channel;
pub mod controller;
pub mod direct;
mod error;
pub mod grpc_options;
pub mod keep_alive;
pub mod lease;
mod lease_error;
mod lease_session;
mod session;
pub mod timings;
pub mod tls_mismatch;
pub mod tunnel;

pub use channel::CallMetadata;
pub use controller::{
    ControllerClient, ExporterQuery, LeaseQuery, LeaseRequest, LeaseUpdate, Page, proto_duration,
};
pub use error::ClientError;
pub use lease_session::{DEFAULT_ACQUISITION_TIMEOUT, LeaseSession, LeaseSessionBuilder};
pub use session::{
    ClientNode, ClientResource, ConnectOptions, DriverClient, ExporterSession, IntoArgs,
    RouterStreamEnds, SessionChannel, Target, UploadSource, connect_channel,
};
pub use tls_mismatch::TlsMismatch;
