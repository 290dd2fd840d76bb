//! The TLS every part shares: the crypto provider (which cipher suites are offered first)
//! and the system's CA certificates.

use rustls::pki_types::TrustAnchor;
use tokio_rustls::rustls;

/// The TLS provider of our clients and servers: ring's, with the AES-128-GCM suites first.
///
/// A server takes the client's order of cipher suites, and ring lists AES-256-GCM first.
/// AES-128-GCM is as much a standard TLS 1.3 suite (the one upstream's gRPC clients offer
/// first where the CPU has AES instructions) and costs less CPU per byte: 10 AES rounds
/// where AES-256 has 14, about 13% less a byte for the cipher (docs/performance.md). The
/// binaries make it the process's default with [`install_tls_provider`], which tonic's TLS
/// then uses too.
pub fn tls_provider() -> rustls::crypto::CryptoProvider {
    use rustls::CipherSuite;
    let mut provider = rustls::crypto::ring::default_provider();
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

/// The system's trust anchors (`SSL_CERT_FILE`, `SSL_CERT_DIR` or the platform's store),
/// read once per process. Reading and parsing them takes a few milliseconds, and a
/// `jmp shell` makes two connections (the controller's and the router's); certificates
/// that do not parse are skipped.
pub(crate) fn system_roots() -> &'static [TrustAnchor<'static>] {
    static ROOTS: std::sync::OnceLock<Vec<TrustAnchor<'static>>> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        if !found.errors.is_empty() {
            tracing::debug!("system certificates partly unreadable: {:?}", found.errors);
        }
        let mut store = rustls::RootCertStore::empty();
        store.add_parsable_certificates(found.certs);
        store.roots
    })
}
