//! Settings both ends of a session use: HTTP/2 flow-control windows, the TLS provider and the
//! metadata key of a direct-mode passphrase.

/// HTTP/2 stream flow-control window of our servers and clients.
pub const STREAM_WINDOW: u32 = 4 * 1024 * 1024;
/// HTTP/2 connection flow-control window of our servers and clients.
pub const CONNECTION_WINDOW: u32 = 8 * 1024 * 1024;

/// Read buffer under each TLS connection of a session (server and direct client).
///
/// rustls asks its transport for at most 4 KiB per read, so without a buffer beneath it a
/// bulk stream costs one `read(2)` per 4 KiB; with it, one per this many bytes.
pub const TLS_READ_BUFFER: usize = 64 * 1024;

/// The TLS provider of our clients and servers: ring's, with the AES-128-GCM suites first.
///
/// A server takes the client's order of cipher suites, and ring lists AES-256-GCM first.
/// AES-128-GCM is as much a standard TLS 1.3 suite (the one upstream's gRPC clients offer
/// first where the CPU has AES instructions) and costs less CPU per byte: 10 AES rounds
/// where AES-256 has 14, about 13% less a byte for the cipher (docs/performance.md). The
/// binaries make it the process's default with [`install_tls_provider`], which tonic's TLS
/// then uses too.
pub fn tls_provider() -> tokio_rustls::rustls::crypto::CryptoProvider {
    use tokio_rustls::rustls::CipherSuite;
    let mut provider = tokio_rustls::rustls::crypto::ring::default_provider();
    // Stable: the suites keep ring's order otherwise.
    provider.cipher_suites.sort_by_key(|s| {
        !matches!(
            s.suite(),
            CipherSuite::TLS13_AES_128_GCM_SHA256
                | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    });
    provider
}

/// Makes [`tls_provider`] the process's default TLS provider (the one TLS clients built
/// without a provider of their own use, tonic's among them). A no-op when a default is
/// already installed.
pub fn install_tls_provider() {
    // Err only when a default is already installed, which is then kept.
    let _ = tls_provider().install_default();
}

/// The metadata key carrying a direct-mode passphrase.
pub const PASSPHRASE_METADATA: &str = "x-jumpstarter-passphrase";
