//! The client side of the direct path: clients on the exporter's network bypass the router.
//!
//! An exporter with a direct listener (`server::direct`) advertises, per lease, a TLS
//! endpoint with the lease's CA and a client identity in
//! `GetReportResponse.alternative_endpoints`, which only the lease holder can read through
//! its authenticated router tunnel. A client reads the report through the router, tries the
//! advertised endpoints with a short timeout ([`probe`]) and, when one answers with the same
//! session, uses it ([`DirectTarget`]); otherwise it stays on the router. Upstream clients
//! ignore the field.

use std::{path::Path, sync::Arc, time::Duration};

use hyper_util::rt::TokioIo;
use jumpstarter_proto::v1::{Endpoint, exporter_service_client::ExporterServiceClient};
use prost::Message;
use tokio::{io::BufReader, net::TcpStream};
use tokio_rustls::{
    TlsConnector,
    client::TlsStream,
    rustls::{
        self, RootCertStore,
        pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject},
    },
};
use tonic::transport::Uri;

use crate::{
    Because, BoxError,
    client::{CallMetadata, ClientError, ConnectOptions, ExporterSession, SessionChannel},
    wire::settings::{CONNECTION_WINDOW, STREAM_WINDOW},
};

/// The variable through which `jmp shell` names the file holding its direct path's
/// advertisement ([`DirectTarget::save`]), for `j` to connect by itself.
pub const DIRECT_ENV: &str = "JMP_DIRECT_ENDPOINT";

/// How long a client waits for an advertised endpoint before staying on the router.
pub const DIRECT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Buffer per direction when a local connection is forwarded over the direct path.
pub const DIRECT_COPY_BUFFER: usize = crate::wire::frames::CHUNK;

/// An advertised direct endpoint is unusable (bad address, certificate or key).
#[derive(Debug, thiserror::Error)]
#[error("direct endpoint {endpoint:?}")]
pub struct EndpointError {
    /// The advertised `host:port`.
    pub endpoint: String,
    /// What is wrong: the parser's or TLS library's error, or a message.
    #[source]
    pub source: BoxError,
}

/// An advertised direct endpoint, ready to connect to with the lease's client identity.
#[derive(Clone)]
pub struct DirectTarget {
    endpoint: String,
    server_name: ServerName<'static>,
    connector: TlsConnector,
    /// The advertisement it was made from, kept for [`DirectTarget::save`].
    advert: Endpoint,
}

impl std::fmt::Debug for DirectTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectTarget")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl DirectTarget {
    /// Checks an advertisement: `host:port`, a CA certificate, a client certificate and its
    /// key, all PEM.
    pub fn from_endpoint(ep: &Endpoint) -> Result<Self, EndpointError> {
        let bad = |source: BoxError| EndpointError {
            endpoint: ep.endpoint.clone(),
            source,
        };
        let (host, _port) = crate::client::channel::split_host_port(&ep.endpoint)
            .ok_or_else(|| bad("expected host:port".into()))?;
        let server_name = ServerName::try_from(host.to_string())
            .map_err(|e| bad(Because::boxed(format!("bad host name {host:?}"), e)))?;
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ep.certificate.as_bytes()) {
            let cert = cert.map_err(|e| bad(Because::boxed("CA certificate", e)))?;
            roots
                .add(cert)
                .map_err(|e| bad(Because::boxed("CA certificate", e)))?;
        }
        if roots.is_empty() {
            return Err(bad("no CA certificate".into()));
        }
        let chain = CertificateDer::pem_slice_iter(ep.client_certificate.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(Because::boxed("client certificate", e)))?;
        if chain.is_empty() {
            return Err(bad("no client certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(ep.client_private_key.as_bytes())
            .map_err(|e| bad(Because::boxed("client private key", e)))?;
        let mut config =
            rustls::ClientConfig::builder_with_provider(Arc::new(crate::tls::tls_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| bad(e.into()))?
                .with_root_certificates(roots)
                .with_client_auth_cert(chain, key)
                .map_err(|e| bad(Because::boxed("client identity", e)))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Self {
            endpoint: ep.endpoint.clone(),
            server_name,
            connector: TlsConnector::from(Arc::new(config)),
            advert: ep.clone(),
        })
    }

    /// Keeps the advertisement in `path`, readable by its owner only, for the commands
    /// `jmp shell` runs ([`DIRECT_ENV`]): they then reach the exporter themselves rather
    /// than through the shell's local socket, whose relay costs every forwarded byte two
    /// more copies through the kernel and a process's CPU.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        crate::private_file::write_private_file(path, &self.advert.encode_to_vec())
    }

    /// Reads what [`DirectTarget::save`] wrote and checks it as
    /// [`DirectTarget::from_endpoint`] does.
    pub fn load(path: &Path) -> Result<Self, EndpointError> {
        let bad = |source: BoxError| EndpointError {
            endpoint: path.display().to_string(),
            source,
        };
        let bytes = std::fs::read(path).map_err(|e| bad(e.into()))?;
        let ep = Endpoint::decode(bytes.as_slice()).map_err(|e| bad(e.into()))?;
        Self::from_endpoint(&ep)
    }

    /// The `host:port` it connects to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// A TLS connection to the endpoint, carrying whatever the caller speaks (the local
    /// socket of `jmp shell` forwards raw HTTP/2 over it).
    pub async fn connect_stream(&self) -> std::io::Result<TlsStream<BufReader<TcpStream>>> {
        let tcp = TcpStream::connect(&self.endpoint).await?;
        tcp.set_nodelay(true)?;
        // rustls reads at most 4 KiB at a time: buffer beneath it.
        let tcp = BufReader::with_capacity(crate::wire::settings::TLS_READ_BUFFER, tcp);
        self.connector.connect(self.server_name.clone(), tcp).await
    }

    /// A gRPC channel to the exporter's session over the direct path.
    pub async fn channel(&self) -> Result<SessionChannel, ClientError> {
        let target = self.clone();
        let channel = tonic::transport::Endpoint::from_static("http://jumpstarter-direct")
            .tcp_nodelay(true)
            .connect_timeout(DIRECT_CONNECT_TIMEOUT)
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(crate::wire::frames::MAX_FRAME)
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let target = target.clone();
                async move { target.connect_stream().await.map(TokioIo::new) }
            }))
            .await
            .map_err(|e| {
                ClientError::connect(format!("exporter (direct, {})", self.endpoint), e)
            })?;
        Ok(tonic::service::interceptor::InterceptedService::new(
            crate::client::channel::GrpcChannel::new(channel),
            CallMetadata::default(),
        ))
    }

    /// Whether the endpoint answers `GetReport` for the session with `uuid` within
    /// `timeout`; the error says why not.
    pub async fn check(&self, uuid: &str, timeout: Duration) -> Result<(), String> {
        let attempt = async {
            let channel = self.channel().await.map_err(|e| crate::error_chain(&e))?;
            let report = ExporterServiceClient::new(channel)
                .get_report(())
                .await
                .map_err(|s| format!("GetReport: {} ({:?})", s.message(), s.code()))?
                .into_inner();
            if report.uuid != uuid {
                return Err(format!(
                    "serves another session ({}, expected {uuid})",
                    report.uuid
                ));
            }
            Ok(())
        };
        tokio::time::timeout(timeout, attempt)
            .await
            .map_err(|_| format!("no answer within {:.1}s", timeout.as_secs_f64()))?
    }
}

/// What `j` connects to inside `jmp shell`: the direct path whose advertisement
/// `direct` names (the shell's [`DIRECT_ENV`]) when it answers within
/// [`DIRECT_CONNECT_TIMEOUT`], else `host` (the shell's socket, which also says why a
/// lease has ended). Over the direct path the forwarded bytes skip the shell's relay.
pub async fn connect_session(
    direct: Option<&Path>,
    host: &str,
    opts: &ConnectOptions,
) -> Result<ExporterSession, ClientError> {
    if let Some(path) = direct {
        let attempt = async {
            let target = DirectTarget::load(path).map_err(|e| crate::error_chain(&e))?;
            let channel = target.channel().await.map_err(|e| crate::error_chain(&e))?;
            ExporterSession::from_channel(channel)
                .await
                .map_err(|e| crate::error_chain(&e))
        };
        match tokio::time::timeout(DIRECT_CONNECT_TIMEOUT, attempt).await {
            Ok(Ok(session)) => return Ok(session),
            Ok(Err(e)) => tracing::debug!("direct path: {e}; using {host}"),
            Err(_) => tracing::debug!("direct path did not answer; using {host}"),
        }
    }
    ExporterSession::connect(host, opts).await
}

/// The first of `endpoints` that answers for the session `uuid` within `timeout` each;
/// `None` when none does (the reasons are logged at debug level).
pub async fn probe(endpoints: &[Endpoint], uuid: &str, timeout: Duration) -> Option<DirectTarget> {
    for ep in endpoints {
        let target = match DirectTarget::from_endpoint(ep) {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!("{e}", e = crate::error_chain(&e));
                continue;
            }
        };
        match target.check(uuid, timeout).await {
            Ok(()) => return Some(target),
            Err(e) => tracing::debug!("direct endpoint {}: {e}", ep.endpoint),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::direct::LeaseCredentials;
    use tokio::net::TcpListener;

    #[test]
    fn bad_advertisements_are_refused_with_the_field_named() {
        let good = LeaseCredentials::issue("l", "localhost")
            .unwrap()
            .endpoint("localhost:1");
        let cases: [(Endpoint, &str); 5] = [
            (
                Endpoint {
                    endpoint: "nope".into(),
                    ..good.clone()
                },
                "host:port",
            ),
            (
                Endpoint {
                    certificate: String::new(),
                    ..good.clone()
                },
                "CA certificate",
            ),
            (
                Endpoint {
                    client_certificate: "garbage".into(),
                    ..good.clone()
                },
                "client certificate",
            ),
            (
                Endpoint {
                    client_private_key: String::new(),
                    ..good.clone()
                },
                "client private key",
            ),
            (
                Endpoint {
                    client_private_key: LeaseCredentials::issue("x", "localhost")
                        .unwrap()
                        .endpoint("localhost:1")
                        .client_private_key,
                    ..good.clone()
                },
                "client identity",
            ),
        ];
        for (ep, want) in cases {
            let e = crate::error_chain(&DirectTarget::from_endpoint(&ep).unwrap_err());
            assert!(e.contains(want), "want {want:?} in {e}");
        }
    }

    /// The direct path's TLS, where `j` encrypts and the exporter decrypts every forwarded
    /// byte, settles on AES-128-GCM (ring alone would pick AES-256-GCM).
    #[tokio::test]
    async fn the_direct_path_negotiates_aes_128_gcm() {
        let creds = LeaseCredentials::issue("l", "127.0.0.1").unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = creds.server_tls().unwrap();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let tls = acceptor.accept(tcp).await.unwrap();
            tls.get_ref().1.negotiated_cipher_suite().map(|s| s.suite())
        });
        let target = DirectTarget::from_endpoint(&creds.endpoint(&addr.to_string())).unwrap();
        let tls = target.connect_stream().await.unwrap();
        let client = tls.get_ref().1.negotiated_cipher_suite().map(|s| s.suite());
        let want = Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        assert_eq!(client, want);
        assert_eq!(server.await.unwrap(), want);
    }

    #[tokio::test]
    async fn probe_skips_dead_and_bad_endpoints() {
        let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = dead.local_addr().unwrap().port();
        drop(dead);
        let creds = LeaseCredentials::issue("l", "127.0.0.1").unwrap();
        let eps = [
            Endpoint::default(),
            creds.endpoint(&format!("127.0.0.1:{port}")),
        ];
        let t = std::time::Instant::now();
        assert!(probe(&eps, "u", DIRECT_CONNECT_TIMEOUT).await.is_none());
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
