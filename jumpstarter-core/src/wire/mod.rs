//! What both sides of a session speak: `RouterService.Stream` over HTTP/2 ([`stream_rpc`]),
//! byte streams as its frames ([`frames`]) and resource streams ([`resource`]).

pub mod frames;
pub mod resource;
pub mod stream_rpc;
