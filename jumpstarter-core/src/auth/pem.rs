//! PEM files: read through `rustls-pki-types`' [`PemObject`] (the one PEM reader of the
//! workspace), written by [`pem_encode`], secrets stored with mode 0600.

use std::path::Path;

use base64::{Engine, engine::general_purpose::STANDARD};
pub use tokio_rustls::rustls::pki_types::pem::{Error as PemError, PemObject};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The certificates of `pem` (one certificate or a chain), in order; blocks of other kinds
/// and text around the blocks are skipped.
pub fn certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>, PemError> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).collect()
}

/// The first private key of `pem` (`PRIVATE KEY`, `EC PRIVATE KEY` or `RSA PRIVATE KEY`);
/// [`PemError::NoItemsFound`] when there is none.
pub fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
}

/// `der` as one PEM block labelled `label`, 64 base64 characters a line.
pub fn pem_encode(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Writes `contents` to `path` with mode 0600, via a temporary file and a rename, so a crash
/// never leaves a half-written secret (see [`crate::private_file::write_private_file`]).
pub fn write_secret_file(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    crate::private_file::write_private_file(path, contents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_blocks_and_ignores_text_around_them() {
        let text = format!(
            "subject=foo\n{}junk\n{}{}",
            pem_encode("CERTIFICATE", &[0, 1, 2, 3]),
            pem_encode("PRIVATE KEY", &[4, 5]),
            pem_encode("CERTIFICATE", &[6]),
        );
        let certs = certificates(&text).unwrap();
        assert_eq!(certs.len(), 2);
        assert_eq!(certs[0].as_ref(), [0, 1, 2, 3]);
        assert_eq!(certs[1].as_ref(), [6]);
        assert_eq!(private_key(&text).unwrap().secret_der(), [4, 5]);
        assert!(certificates("nothing here").unwrap().is_empty());
        assert!(matches!(
            private_key("nothing here"),
            Err(PemError::NoItemsFound)
        ));
    }

    #[test]
    fn bad_pem_is_an_error() {
        assert!(matches!(
            certificates("-----BEGIN CERTIFICATE-----\nAAAA\n"),
            Err(PemError::MissingSectionEnd { .. })
        ));
        assert!(
            certificates("-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n").is_err()
        );
        assert!(
            private_key("-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n").is_err()
        );
    }
}
