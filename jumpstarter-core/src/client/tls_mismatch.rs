//! Connections to an exporter that fail for a TLS setting a person can fix: a certificate
//! signed by a CA the client does not trust, one that does not name the host the client
//! connected to, an exporter that speaks plaintext HTTP/2 to a TLS client, or TLS to a
//! plaintext one.
//!
//! rustls reports the first two as typed errors deep in tonic's transport error. The others
//! show as a connection the exporter resets, closes or answers with bytes of the other
//! protocol, which reads differently from one attempt to the next, so they are confirmed by
//! asking the exporter again in the other protocol: an HTTP/2 preface, which an HTTP/2
//! server answers with its SETTINGS frame, or a TLS handshake (any certificate accepted:
//! nothing is sent over it).

use std::{error::Error, fmt, net::IpAddr, time::Duration};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::{self, CertificateError};

use crate::BoxError;

/// Why a TLS connection to an exporter failed, when it is a setting that does not match
/// the exporter's: the cause of a [`crate::ClientError::Connect`], holding the transport's
/// error as its own cause.
#[derive(Debug, thiserror::Error)]
pub enum TlsMismatch {
    /// The exporter's certificate is signed by no CA the client trusts (no CA given, or
    /// another one).
    #[error("the exporter's certificate is not signed by a CA this client trusts")]
    UntrustedCertificate(#[source] BoxError),
    /// The exporter's certificate does not name the host the client connected to.
    #[error(
        "the exporter's certificate is not valid for {name:?} (it is for {})",
        names_or_none(presented)
    )]
    WrongName {
        /// The name the client connected to.
        name: String,
        /// The names the certificate has.
        presented: Vec<CertName>,
        /// The transport's error.
        #[source]
        source: BoxError,
    },
    /// The exporter answers in plaintext HTTP/2: it has no TLS.
    #[error("the exporter answers in plaintext HTTP/2, without TLS")]
    Plaintext(#[source] BoxError),
    /// The exporter speaks TLS, and the client spoke plaintext HTTP/2.
    #[error("the exporter speaks TLS, and this client spoke plaintext HTTP/2")]
    SpeaksTls(#[source] BoxError),
}

/// A name in a certificate's subjectAltName.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertName {
    /// A DNS name (`board1.lab`, `localhost`).
    Dns(String),
    /// An IP address.
    Ip(IpAddr),
    /// Another kind of name, as rustls shows it.
    Other(String),
}

impl fmt::Display for CertName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CertName::Dns(n) | CertName::Other(n) => f.write_str(n),
            CertName::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

impl CertName {
    /// From rustls's text of a presented name (`DnsName("localhost")`,
    /// `IpAddress(127.0.0.1)`); anything else is kept as [`CertName::Other`].
    fn parse(text: &str) -> Self {
        if let Some(name) = text
            .strip_prefix("DnsName(\"")
            .and_then(|r| r.strip_suffix("\")"))
        {
            return CertName::Dns(name.to_string());
        }
        if let Some(ip) = text
            .strip_prefix("IpAddress(")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|r| r.parse().ok())
        {
            return CertName::Ip(ip);
        }
        CertName::Other(text.to_string())
    }
}

fn names_or_none(names: &[CertName]) -> String {
    if names.is_empty() {
        return "no name".into();
    }
    names
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// How long the plaintext probe of [`classify`] may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The cause of a failed TLS connection to the exporter at `addr` (`host:port`): `error`
/// wrapped in the [`TlsMismatch`] it shows, or as it is.
pub(crate) async fn classify(addr: &str, error: tonic::transport::Error) -> BoxError {
    let (certificate, closed) = {
        let root: &(dyn Error + 'static) = &error;
        (certificate_error(root).cloned(), closed_at_handshake(root))
    };
    match certificate {
        Some(CertificateError::UnknownIssuer) => {
            return Box::new(TlsMismatch::UntrustedCertificate(error.into()));
        }
        Some(CertificateError::NotValidForNameContext {
            expected,
            presented,
        }) => {
            return Box::new(TlsMismatch::WrongName {
                name: expected.to_str().into_owned(),
                presented: presented.iter().map(|p| CertName::parse(p)).collect(),
                source: error.into(),
            });
        }
        Some(CertificateError::NotValidForName) => {
            return Box::new(TlsMismatch::WrongName {
                name: host_of(addr).to_string(),
                presented: Vec::new(),
                source: error.into(),
            });
        }
        _ => {}
    }
    if closed && answers_plaintext_http2(addr).await {
        return Box::new(TlsMismatch::Plaintext(error.into()));
    }
    error.into()
}

/// The cause of a failed plaintext connection to the exporter at `addr`, or of a failed
/// first call over it, when the connection was lost: `error` in a
/// [`TlsMismatch::SpeaksTls`] when the exporter completes a TLS handshake, or as it is.
pub(crate) async fn classify_plaintext(addr: &str, error: BoxError) -> BoxError {
    if completes_tls_handshake(addr).await {
        return Box::new(TlsMismatch::SpeaksTls(error));
    }
    error
}

/// Whether `addr` completes a TLS handshake (any certificate accepted).
async fn completes_tls_handshake(addr: &str) -> bool {
    let Ok(name) = rustls::pki_types::ServerName::try_from(host_of(addr).to_string()) else {
        return false;
    };
    let Ok(config) = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions() else {
        return false;
    };
    let config = config
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(crate::client::channel::AnyServer))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let probe = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        connector.connect(name, tcp).await.ok().map(|_| ())
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, probe).await,
        Ok(Some(()))
    )
}

/// The host of `host:port` (`[v6]:port` without its brackets).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// `e` and its causes, with the error inside each `std::io::Error` (whose `source()` skips
/// it: tokio-rustls reports rustls's errors that way).
fn causes<'a>(e: &'a (dyn Error + 'static)) -> Vec<&'a (dyn Error + 'static)> {
    let mut out = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        out.push(err);
        next = match err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn Error + 'static)),
            None => err.source(),
        };
        if out.len() > 32 {
            break;
        }
    }
    out
}

/// The certificate error rustls reported, if any.
fn certificate_error<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a CertificateError> {
    causes(e)
        .into_iter()
        .find_map(|c| match c.downcast_ref::<rustls::Error>() {
            Some(rustls::Error::InvalidCertificate(ce)) => Some(ce),
            _ => None,
        })
}

/// Whether the handshake ended as a plaintext server ends it: the connection reset or
/// closed at our `ClientHello`, or an answer that is no TLS record.
pub(crate) fn closed_at_handshake(e: &(dyn Error + 'static)) -> bool {
    use std::io::ErrorKind::*;
    causes(e).into_iter().any(|c| {
        matches!(
            c.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidMessage(_))
        ) || c.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | UnexpectedEof | BrokenPipe
            )
        })
    })
}

/// The client preface of HTTP/2 and an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Whether `addr` answers an HTTP/2 preface in plaintext with a SETTINGS frame (an HTTP/2
/// server without TLS does; a TLS server answers with an alert, or closes).
async fn answers_plaintext_http2(addr: &str) -> bool {
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(PREFACE).await.ok()?;
        let mut head = [0u8; 9];
        s.read_exact(&mut head).await.ok()?;
        Some(is_settings_frame_head(&head))
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, probe).await,
        Ok(Some(true))
    )
}

/// Whether a 9-byte frame head is a server's first SETTINGS frame: type 4, no ACK flag,
/// stream 0, a length that is a multiple of 6.
fn is_settings_frame_head(head: &[u8; 9]) -> bool {
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]);
    head[3] == 0x04 && head[4] & 0x01 == 0 && head[5..] == [0, 0, 0, 0] && len.is_multiple_of(6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_rustls_text() {
        assert_eq!(
            CertName::parse("DnsName(\"localhost\")"),
            CertName::Dns("localhost".into())
        );
        assert_eq!(
            CertName::parse("IpAddress(127.0.0.1)"),
            CertName::Ip("127.0.0.1".parse().unwrap())
        );
        assert_eq!(
            CertName::parse("IpAddress(::1)"),
            CertName::Ip("::1".parse().unwrap())
        );
        assert_eq!(
            CertName::parse("DirectoryName"),
            CertName::Other("DirectoryName".into())
        );
    }

    #[test]
    fn hosts() {
        assert_eq!(host_of("127.0.0.1:1"), "127.0.0.1");
        assert_eq!(host_of("[::1]:1"), "::1");
        assert_eq!(host_of("board1.lab:443"), "board1.lab");
    }

    #[test]
    fn settings_frame_heads() {
        assert!(is_settings_frame_head(&[0, 0, 18, 4, 0, 0, 0, 0, 0]));
        assert!(is_settings_frame_head(&[0, 0, 0, 4, 0, 0, 0, 0, 0]));
        // A SETTINGS ACK, another frame type, a TLS alert record.
        assert!(!is_settings_frame_head(&[0, 0, 0, 4, 1, 0, 0, 0, 0]));
        assert!(!is_settings_frame_head(&[0, 0, 8, 7, 0, 0, 0, 0, 0]));
        assert!(!is_settings_frame_head(&[0x15, 3, 3, 0, 2, 2, 0x32, 0, 0]));
    }

    #[test]
    fn rustls_errors_are_found_inside_io_errors() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        let outer = crate::Because {
            context: "transport error".into(),
            source: Box::new(io),
        };
        assert_eq!(
            certificate_error(&outer),
            Some(&CertificateError::UnknownIssuer)
        );
        assert!(!closed_at_handshake(&outer));
        let reset = crate::Because {
            context: "transport error".into(),
            source: Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
        };
        assert!(closed_at_handshake(&reset));
        assert_eq!(certificate_error(&reset), None);
    }

    #[tokio::test]
    async fn the_probe_tells_a_plaintext_http2_server_from_others() {
        use tokio::net::TcpListener;
        // An HTTP/2 server without TLS: answers the preface with SETTINGS.
        let h2 = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = h2.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = h2.accept().await.unwrap();
            let mut preface = [0u8; PREFACE.len()];
            s.read_exact(&mut preface).await.unwrap();
            s.write_all(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100])
                .await
                .unwrap();
            let _ = s.read(&mut [0u8; 1]).await;
        });
        assert!(answers_plaintext_http2(&addr).await);
        // A server that closes at once.
        let closer = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = closer.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (s, _) = closer.accept().await.unwrap();
            drop(s);
        });
        assert!(!answers_plaintext_http2(&addr).await);
    }

    #[tokio::test]
    async fn the_tls_probe_tells_a_tls_server_from_a_plaintext_one() {
        use tokio::net::TcpListener;
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let tls = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tls.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (s, _) = tls.accept().await.unwrap();
            let _ = acceptor.accept(s).await;
        });
        assert!(completes_tls_handshake(&addr).await);
        // A plaintext server that answers with an HTTP/2 SETTINGS frame.
        let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = plain.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = plain.accept().await.unwrap();
            let _ = s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
        });
        assert!(!completes_tls_handshake(&addr).await);
    }
}
