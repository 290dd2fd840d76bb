//! What both sides of a session speak: `RouterService.Stream` over HTTP/2 ([`stream_rpc`]),
//! byte streams as its frames ([`frames`]), resource streams ([`resource`]) and the
//! URLs the exporter fetches itself ([`presigned`]).

pub mod frames;
pub mod presigned;
pub mod resource;
pub mod stream_rpc;
