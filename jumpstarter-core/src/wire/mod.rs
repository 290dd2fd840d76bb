//! What both sides of a session speak: `RouterService.Stream` over HTTP/2 ([`stream_rpc`]),
//! byte streams as its frames ([`frames`]), resource streams ([`resource`]), the URLs the
//! exporter fetches itself ([`presigned`]) and the HTTP/2 settings and metadata keys both
//! ends use ([`settings`]).

pub mod frames;
pub mod presigned;
pub mod resource;
pub mod settings;
pub mod stream_rpc;
