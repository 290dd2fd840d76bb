//! Settings both ends of a session use: HTTP/2 flow-control windows and the metadata key of
//! a direct-mode passphrase.

/// HTTP/2 stream flow-control window of our servers and clients.
pub const STREAM_WINDOW: u32 = 4 * 1024 * 1024;
/// HTTP/2 connection flow-control window of our servers and clients.
pub const CONNECTION_WINDOW: u32 = 8 * 1024 * 1024;

/// Read buffer under each TLS connection of a session (server and direct client).
///
/// rustls asks its transport for at most 4 KiB per read, so without a buffer beneath it a
/// bulk stream costs one `read(2)` per 4 KiB; with it, one per this many bytes.
pub const TLS_READ_BUFFER: usize = 64 * 1024;

/// The metadata key carrying a direct-mode passphrase.
pub const PASSPHRASE_METADATA: &str = "x-jumpstarter-passphrase";
