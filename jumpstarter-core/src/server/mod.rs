//! The exporter side: a [`Session`] serves a driver tree (`ExporterService` and
//! `RouterService`), on a Unix socket, TCP or router tunnels ([`serve_unix`], [`serve_tcp`],
//! [`serve_tunnels`]); a tunnel is handed to the server in memory ([`tunnel_conn`]), its
//! HTTP/2 header blocks fixed on the way (`h2_authority`). Network listeners that serve
//! gRPC accept through [`listener::ConnectionGuard`] (connection limit, handshake and
//! first-frame timeouts). An exporter's direct listener serves each lease's session to
//! the lease holder over TLS ([`direct`]). Small HTTP/1.1 endpoints (metrics, easy login)
//! are served by `http1` (a workspace internal).

pub mod direct;
#[doc(hidden)]
pub mod h2_authority;
#[doc(hidden)]
pub mod http1;
pub mod listener;
mod serve;
mod session;
mod tunnel_conn;

pub(crate) use serve::Severable;
pub use serve::{
    SHUTDOWN_GRACE, ServeOptions, local_socket_path, nodelay_incoming, serve_tcp, serve_tunnels,
    serve_unix,
};
pub use session::{
    LOG_BACKLOG_HEADER, SESSION_END_TIMEOUT, Session, SessionService, StatusState, StreamService,
};
pub use tunnel_conn::{TunnelConn, tunnel_conn};
