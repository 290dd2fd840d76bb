//! A small certificate authority kept in a directory, and PEM file helpers.
//!
//! The controller creates the CA once (`ca.crt`, `ca.key` with mode 0600) and reuses it on
//! every start, so the server certificates it issues stay trusted by clients and exporters
//! whose config carries the CA (`tls.ca`), without `--insecure-tls`.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SerialNumber,
};
use time::OffsetDateTime;

use super::pem::write_secret_file;

/// File name of the CA certificate inside the CA directory.
pub const CA_CERT_FILE: &str = "ca.crt";
/// File name of the CA private key inside the CA directory (mode 0600).
pub const CA_KEY_FILE: &str = "ca.key";
/// Validity of the CA certificate.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);
/// Validity of issued server and client certificates.
const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// Backdating of `notBefore`, so peers with a slightly slow clock accept a fresh certificate.
const CLOCK_SKEW: Duration = Duration::from_secs(60 * 60);

/// A certificate, key or CA directory could not be used; the message names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A PEM file or text cannot be parsed.
    #[error("{path}: not valid PEM")]
    Pem {
        /// The file (or `<memory>`).
        path: PathBuf,
        /// Why.
        #[source]
        source: super::pem::PemError,
    },
    /// A file does not hold what it should (missing block, wrong key).
    #[error("{path}: {reason}")]
    Invalid {
        /// The file (or `<memory>`).
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The CA directory holds only one of `ca.crt` and `ca.key`; refusing to guess.
    #[error("CA directory {dir} has {present} but not {missing}; restore it or remove both")]
    IncompleteCa {
        /// The directory.
        dir: PathBuf,
        /// The file that exists.
        present: &'static str,
        /// The file that is missing.
        missing: &'static str,
    },
    /// A subject alternative name is neither an IP address nor a valid DNS name.
    #[error("invalid subject alternative name {0:?}")]
    SubjectAltName(String),
    /// Key or certificate generation failed.
    #[error("certificate generation failed")]
    Generate(#[source] rcgen::Error),
    /// The system's random number generator failed.
    #[error("certificate generation failed: the random number generator failed")]
    Random,
    /// A TLS configuration could not be built from generated certificates.
    #[error("unusable TLS configuration")]
    Config(#[source] tonic::transport::Error),
    /// A CA key or certificate PEM cannot be used.
    #[error("{path}: {what}")]
    Unusable {
        /// The file (or `<memory>`).
        path: PathBuf,
        /// What cannot be used, and why in words.
        what: &'static str,
        /// Why.
        #[source]
        source: rcgen::Error,
    },
}

fn generate_err(e: rcgen::Error) -> TlsError {
    TlsError::Generate(e)
}

/// A certificate with its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedCert {
    /// The certificate (leaf only).
    pub cert_pem: String,
    /// Its PKCS#8 private key.
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl IssuedCert {
    /// The pair as a tonic server (or mTLS client) identity.
    pub fn identity(&self) -> tonic::transport::Identity {
        tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem)
    }

    /// Writes `cert` (mode 0644) and `key` (mode 0600).
    pub fn save(&self, cert: &Path, key: &Path) -> Result<(), TlsError> {
        write_public_file(cert, self.cert_pem.as_bytes())?;
        write_secret_file(key, self.key_pem.as_bytes()).map_err(|source| TlsError::Write {
            path: key.to_owned(),
            source,
        })
    }
}

fn write_public_file(path: &Path, contents: &[u8]) -> Result<(), TlsError> {
    let res = (|| {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, contents)
    })();
    res.map_err(|source| TlsError::Write {
        path: path.to_owned(),
        source,
    })
}

fn random_serial() -> Result<SerialNumber, TlsError> {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| TlsError::Random)?;
    // Positive and non-zero, as RFC 5280 requires.
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

fn validity(params: &mut CertificateParams, lifetime: Duration) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - CLOCK_SKEW;
    params.not_after = now + lifetime;
}

/// An ECDSA P-256 CA that issues server and client certificates.
pub struct CertificateAuthority {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// A new self-signed CA named `common_name`, valid for 10 years.
    pub fn generate(common_name: &str) -> Result<Self, TlsError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(generate_err)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        dn.push(DnType::OrganizationName, "Jumpstarter");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(random_serial()?);
        validity(&mut params, CA_VALIDITY);
        let cert = params.self_signed(&key).map_err(generate_err)?;
        Ok(CertificateAuthority {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A CA from its certificate and key PEM; `origin` names the source in errors.
    pub fn from_pem(cert_pem: &str, key_pem: &str, origin: &Path) -> Result<Self, TlsError> {
        let invalid = |reason: String| TlsError::Invalid {
            path: origin.to_owned(),
            reason,
        };
        let key = KeyPair::from_pem(key_pem).map_err(|source| TlsError::Unusable {
            path: origin.to_owned(),
            what: "CA key is not a usable PKCS#8 key",
            source,
        })?;
        let cert_der = super::pem::certificates(cert_pem)
            .map_err(|source| TlsError::Pem {
                path: origin.to_owned(),
                source,
            })?
            .into_iter()
            .next()
            .ok_or_else(|| invalid("no CERTIFICATE PEM block".into()))?;
        // The certificate embeds the public key bytes of its key pair: a cheap check that the
        // two belong together, so a mix-up fails here and not at every TLS handshake.
        let public = key.public_key_raw();
        if public.is_empty() || !cert_der.windows(public.len()).any(|w| w == public) {
            return Err(invalid(
                "the CA key does not belong to the CA certificate".into(),
            ));
        }
        let issuer =
            Issuer::from_ca_cert_der(&cert_der, key).map_err(|source| TlsError::Unusable {
                path: origin.to_owned(),
                what: "CA certificate cannot be parsed",
                source,
            })?;
        Ok(CertificateAuthority {
            cert_pem: cert_pem.to_owned(),
            issuer,
        })
    }

    /// Loads `ca.crt` and `ca.key` from `dir`.
    pub fn load(dir: &Path) -> Result<Self, TlsError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let cert_pem = read_cert_pem(&cert_path)?;
        let key_pem = read_key_pem(&key_path)?;
        Self::from_pem(&cert_pem, &key_pem, &cert_path)
    }

    /// Loads the CA from `dir`, or creates one named `common_name` and saves it there when
    /// neither file exists. A half-present or unusable CA is an error, never overwritten.
    pub fn load_or_create(dir: &Path, common_name: &str) -> Result<Self, TlsError> {
        let has_cert = dir.join(CA_CERT_FILE).exists();
        let has_key = dir.join(CA_KEY_FILE).exists();
        match (has_cert, has_key) {
            (true, true) => Self::load(dir),
            (false, false) => {
                let ca = Self::generate(common_name)?;
                ca.save(dir)?;
                Ok(ca)
            }
            (true, false) => Err(TlsError::IncompleteCa {
                dir: dir.to_owned(),
                present: CA_CERT_FILE,
                missing: CA_KEY_FILE,
            }),
            (false, true) => Err(TlsError::IncompleteCa {
                dir: dir.to_owned(),
                present: CA_KEY_FILE,
                missing: CA_CERT_FILE,
            }),
        }
    }

    /// Writes `ca.key` (mode 0600) then `ca.crt` into `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), TlsError> {
        let key_path = dir.join(CA_KEY_FILE);
        write_secret_file(&key_path, self.issuer.key().serialize_pem().as_bytes()).map_err(
            |source| TlsError::Write {
                path: key_path,
                source,
            },
        )?;
        write_public_file(&dir.join(CA_CERT_FILE), self.cert_pem.as_bytes())
    }

    /// The CA certificate (PEM): what clients put in `tls.ca` (base64 of it).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Issues a server certificate for `sans` (DNS names and IP addresses; at least one),
    /// valid for one year, with a new P-256 key.
    pub fn issue_server_cert<S: AsRef<str>>(&self, sans: &[S]) -> Result<IssuedCert, TlsError> {
        let names: Vec<String> = sans.iter().map(|s| s.as_ref().trim().to_owned()).collect();
        let Some(first) = names.first().cloned() else {
            return Err(TlsError::SubjectAltName(String::new()));
        };
        if let Some(bad) = names.iter().find(|n| !valid_san(n)) {
            return Err(TlsError::SubjectAltName(bad.clone()));
        }
        let mut params = CertificateParams::new(names.clone())
            .map_err(|_| TlsError::SubjectAltName(names.join(",")))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, first);
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign_leaf(params)
    }

    /// Issues a client certificate with common name `common_name` (for mutual TLS).
    pub fn issue_client_cert(&self, common_name: &str) -> Result<IssuedCert, TlsError> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign_leaf(params)
    }

    fn sign_leaf(&self, mut params: CertificateParams) -> Result<IssuedCert, TlsError> {
        params.is_ca = IsCa::NoCa;
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial()?);
        validity(&mut params, LEAF_VALIDITY);
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(generate_err)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(generate_err)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// An IP address, or a DNS name of letters, digits, `-`, `.` and a leading `*.` wildcard.
fn valid_san(name: &str) -> bool {
    if name.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let host = name.strip_prefix("*.").unwrap_or(name);
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

fn read_pem_file(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Reads a PEM file that must hold at least one `CERTIFICATE` block (a certificate or chain).
pub fn read_cert_pem(path: &Path) -> Result<String, TlsError> {
    let text = read_pem_file(path)?;
    let certs = super::pem::certificates(&text).map_err(|source| TlsError::Pem {
        path: path.to_owned(),
        source,
    })?;
    if certs.is_empty() {
        return Err(TlsError::Invalid {
            path: path.to_owned(),
            reason: "no CERTIFICATE PEM block".into(),
        });
    }
    Ok(text)
}

/// Reads a PEM file that must hold a private key block (`PRIVATE KEY`, `EC PRIVATE KEY` or
/// `RSA PRIVATE KEY`).
pub fn read_key_pem(path: &Path) -> Result<String, TlsError> {
    let text = read_pem_file(path)?;
    match super::pem::private_key(&text) {
        Ok(_) => Ok(text),
        Err(super::pem::PemError::NoItemsFound) => Err(TlsError::Invalid {
            path: path.to_owned(),
            reason: "no PRIVATE KEY PEM block".into(),
        }),
        Err(source) => Err(TlsError::Pem {
            path: path.to_owned(),
            source,
        }),
    }
}

/// A tonic TLS identity from a certificate file and a key file (e.g. upstream's
/// `EXTERNAL_CERT_PEM` / `EXTERNAL_KEY_PEM`).
pub fn load_identity(cert: &Path, key: &Path) -> Result<tonic::transport::Identity, TlsError> {
    let cert_pem = read_cert_pem(cert)?;
    let key_pem = read_key_pem(key)?;
    Ok(tonic::transport::Identity::from_pem(cert_pem, key_pem))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf_der(pem: &str) -> Vec<u8> {
        super::super::pem::certificates(pem)
            .unwrap()
            .remove(0)
            .to_vec()
    }

    #[test]
    fn ca_is_created_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::load_or_create(dir.path(), "test CA").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(CA_KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let again = CertificateAuthority::load_or_create(dir.path(), "ignored").unwrap();
        assert_eq!(ca.cert_pem(), again.cert_pem());
        // A certificate issued by the reloaded CA names the original CA as its issuer.
        let leaf = again.issue_server_cert(&["localhost"]).unwrap();
        let ca_der = leaf_der(ca.cert_pem());
        let (_, ca_x509) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        let der = leaf_der(&leaf.cert_pem);
        let (_, x509) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert_eq!(x509.issuer(), ca_x509.subject());
        assert!(x509.verify_signature(Some(ca_x509.public_key())).is_ok());
        assert!(ca_x509.is_ca());
    }

    async fn handshake(
        port: u16,
        trusted_ca: &str,
        server_name: &str,
    ) -> Result<tonic::transport::Channel, tonic::transport::Error> {
        use tonic::transport::{Certificate, Channel, ClientTlsConfig};
        Channel::from_shared(format!("https://127.0.0.1:{port}"))
            .unwrap()
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(trusted_ca))
                    .domain_name(server_name),
            )
            .unwrap()
            .connect()
            .await
    }

    #[tokio::test]
    async fn issued_server_cert_passes_a_real_tls_handshake() {
        use tonic::transport::{Server, ServerTlsConfig};
        let ca = CertificateAuthority::generate("test CA").unwrap();
        let leaf = ca.issue_server_cert(&["localhost", "127.0.0.1"]).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(
            Server::builder()
                .tls_config(ServerTlsConfig::new().identity(leaf.identity()))
                .unwrap()
                .add_routes(tonic::service::Routes::default())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        assert!(handshake(port, ca.cert_pem(), "localhost").await.is_ok());
        assert!(handshake(port, ca.cert_pem(), "127.0.0.1").await.is_ok());
        // A name the certificate does not carry, and a CA that did not issue it, both fail.
        assert!(
            handshake(port, ca.cert_pem(), "elsewhere.example")
                .await
                .is_err()
        );
        let stranger = CertificateAuthority::generate("other CA").unwrap();
        assert!(
            handshake(port, stranger.cert_pem(), "localhost")
                .await
                .is_err()
        );
        server.abort();
    }

    #[test]
    fn server_cert_has_dns_and_ip_sans() {
        let ca = CertificateAuthority::generate("test CA").unwrap();
        let leaf = ca
            .issue_server_cert(&["localhost", "127.0.0.1", "::1", "ctl.example.com"])
            .unwrap();
        let der = leaf_der(&leaf.cert_pem);
        let (_, x509) = x509_parser::parse_x509_certificate(&der).unwrap();
        let san = x509.subject_alternative_name().unwrap().unwrap().value;
        let text = format!("{:?}", san.general_names);
        for want in ["localhost", "ctl.example.com", "127, 0, 0, 1"] {
            assert!(text.contains(want), "{want} missing from {text}");
        }
        assert!(!x509.is_ca());
        let eku = x509.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth);
        let client = ca.issue_client_cert("exporter-1").unwrap();
        let der = leaf_der(&client.cert_pem);
        let (_, x509) = x509_parser::parse_x509_certificate(&der).unwrap();
        let eku = x509.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        assert!(format!("{}", x509.subject()).contains("exporter-1"));
    }

    #[test]
    fn bad_sans_are_rejected() {
        let ca = CertificateAuthority::generate("test CA").unwrap();
        let empty: [&str; 0] = [];
        assert!(ca.issue_server_cert(&empty).is_err());
        for bad in ["", "a b", "host..name", "x/y", "é.example"] {
            let res = ca.issue_server_cert(&[bad]);
            assert!(
                matches!(res, Err(TlsError::SubjectAltName(_))),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn broken_ca_directories_name_the_file_and_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CA_CERT_FILE), "garbage").unwrap();
        let err = CertificateAuthority::load_or_create(dir.path(), "x").unwrap_err();
        assert!(matches!(err, TlsError::IncompleteCa { .. }), "{err}");
        std::fs::write(dir.path().join(CA_KEY_FILE), "garbage").unwrap();
        let err = CertificateAuthority::load_or_create(dir.path(), "x").unwrap_err();
        assert!(err.to_string().contains(CA_CERT_FILE), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(CA_CERT_FILE)).unwrap(),
            "garbage"
        );

        // A key from another CA is caught at load time.
        let a = CertificateAuthority::generate("a").unwrap();
        let b = CertificateAuthority::generate("b").unwrap();
        let err = CertificateAuthority::from_pem(
            a.cert_pem(),
            &b.issuer.key().serialize_pem(),
            Path::new("mixed.crt"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("does not belong"), "{err}");
    }

    #[test]
    fn pem_helpers_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        assert!(
            read_cert_pem(&missing)
                .unwrap_err()
                .to_string()
                .contains("nope.pem")
        );
        let not_cert = dir.path().join("key-as-cert.pem");
        let ca = CertificateAuthority::generate("x").unwrap();
        let leaf = ca.issue_server_cert(&["localhost"]).unwrap();
        std::fs::write(&not_cert, &leaf.key_pem).unwrap();
        let err = read_cert_pem(&not_cert).unwrap_err().to_string();
        assert!(
            err.contains("key-as-cert.pem") && err.contains("CERTIFICATE"),
            "{err}"
        );
        let err = read_key_pem(&missing).unwrap_err().to_string();
        assert!(err.contains("nope.pem"), "{err}");
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        leaf.save(&cert, &key).unwrap();
        assert!(load_identity(&cert, &key).is_ok());
        assert!(load_identity(&key, &cert).is_err());

        // Broken PEM names the file and keeps the parser's error as its source.
        let broken = dir.path().join("broken.pem");
        std::fs::write(&broken, "-----BEGIN CERTIFICATE-----\nAAAA\n").unwrap();
        for err in [
            read_cert_pem(&broken).unwrap_err(),
            CertificateAuthority::from_pem(
                "-----BEGIN CERTIFICATE-----\nAAAA\n",
                &ca.issuer.key().serialize_pem(),
                &broken,
            )
            .unwrap_err(),
        ] {
            assert!(matches!(err, TlsError::Pem { .. }), "{err}");
            let text = err.to_string();
            assert!(
                text.contains("broken.pem") && text.contains("PEM"),
                "{text}"
            );
            assert!(std::error::Error::source(&err).is_some(), "{text}");
        }
        std::fs::write(
            &broken,
            "-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let err = read_key_pem(&broken).unwrap_err();
        assert!(matches!(err, TlsError::Pem { .. }), "{err}");
    }
}
