//! gRPC channels to controllers and routers, as the config files describe them.
//!
//! Both always use TLS (bearer tokens never travel in the clear): verified against the
//! config's CA (`tls.ca`, base64 PEM) plus the system roots, or — with `tls.insecure`, as
//! upstream's `--insecure-tls` — without verifying the server at all.
//!
//! ```no_run
//! # async fn demo() -> Result<(), jumpstarter_core::ClientError> {
//! use jumpstarter_core::client::channel::{ControllerAuth, TlsSettings, connect_authenticated};
//! let tls = TlsSettings { ca_pem: None, insecure: true };
//! let auth = ControllerAuth::client("default", "hello", "token");
//! let channel = connect_authenticated("localhost:8082", &tls, &auth).await?;
//! # drop(channel); Ok(()) }
//! ```

use std::{path::Path, sync::Arc, time::Duration};

use hyper_util::rt::TokioIo;
use tokio_rustls::rustls::{
    self, DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    pki_types::{CertificateDer, ServerName, UnixTime},
};
use tonic::{
    metadata::MetadataValue,
    service::interceptor::InterceptedService,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Uri},
};

use crate::{
    auth::{KIND_KEY, NAME_KEY, NAMESPACE_KEY},
    client::error::ClientError,
    config::{ClientConfig, ConfigError, TlsConfig, decode_ca},
};

/// How to check the server's certificate.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TlsSettings {
    /// PEM of a CA to trust besides the system roots.
    pub ca_pem: Option<String>,
    /// Do not verify the server at all (`--insecure-tls`).
    pub insecure: bool,
}

impl TlsSettings {
    /// From a config file's `tls` block (`path` names the file in errors).
    /// `JMP_GRPC_INSECURE=1` / `JUMPSTARTER_GRPC_INSECURE=1` force `insecure`, as upstream.
    pub fn from_config(tls: &TlsConfig, path: Option<&Path>) -> Result<Self, ConfigError> {
        let forced = ["JMP_GRPC_INSECURE", "JUMPSTARTER_GRPC_INSECURE"]
            .iter()
            .any(|k| std::env::var(k).is_ok_and(|v| v == "1"));
        Ok(Self {
            ca_pem: decode_ca(tls, path)?,
            insecure: tls.insecure || forced,
        })
    }
}

/// Who is calling the controller: the metadata every controller RPC carries.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerAuth {
    /// The bearer token.
    pub token: String,
    /// `Client` or `Exporter` (`None`: send no kind/namespace/name, e.g. admin or router).
    pub kind: Option<&'static str>,
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
    /// For an exporter: this process's instance id, sent as
    /// [`crate::auth::EXPORTER_INSTANCE_HEADER`] so that the controller tells a second
    /// process of one exporter from a reconnection of the first.
    pub instance: Option<String>,
}

/// This process's exporter instance id (a random UUID, the same for every connection).
fn process_instance_id() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| uuid::Uuid::new_v4().to_string()).clone()
}

impl ControllerAuth {
    /// A client's credentials.
    pub fn client(namespace: &str, name: &str, token: &str) -> Self {
        Self {
            token: token.into(),
            kind: Some("Client"),
            namespace: namespace.into(),
            name: name.into(),
            instance: None,
        }
    }

    /// An exporter's credentials.
    pub fn exporter(namespace: &str, name: &str, token: &str) -> Self {
        Self {
            token: token.into(),
            kind: Some("Exporter"),
            namespace: namespace.into(),
            name: name.into(),
            instance: Some(process_instance_id()),
        }
    }

    /// Only a bearer token (admin API, router streams).
    pub fn bearer(token: &str) -> Self {
        Self {
            token: token.into(),
            kind: None,
            namespace: String::new(),
            name: String::new(),
            instance: None,
        }
    }

    /// The call metadata these credentials add to every RPC (`target` names the peer in
    /// errors).
    pub fn call_metadata(&self, target: &str) -> Result<CallMetadata, ClientError> {
        let value = |v: &str, what: &str| {
            MetadataValue::try_from(v).map_err(|_| {
                ClientError::connect(target, format!("the {what} must be printable ASCII"))
            })
        };
        let mut entries = vec![(
            "authorization",
            value(&format!("Bearer {}", self.token), "token")?,
        )];
        if let Some(kind) = self.kind {
            entries.push((KIND_KEY, value(kind, "kind")?));
            entries.push((NAMESPACE_KEY, value(&self.namespace, "namespace")?));
            entries.push((NAME_KEY, value(&self.name, "name")?));
        }
        if let Some(instance) = &self.instance {
            entries.push((
                crate::auth::EXPORTER_INSTANCE_HEADER,
                value(instance, "instance id")?,
            ));
        }
        Ok(CallMetadata::new(entries))
    }
}

/// A channel whose every call carries [`ControllerAuth`] metadata.
pub type AuthChannel = InterceptedService<GrpcChannel, CallMetadata>;

/// A tonic [`Channel`] that removes `grpc-status-details-bin` from every answer before
/// tonic reads it.
///
/// tonic 0.14 panics on a `grpc-status-details-bin` that is not base64 (an `expect` in
/// `Status::from_header_map`), so one bad header from a peer, or from a proxy in between,
/// would crash the task reading the answer. Nothing here uses status details; the code and
/// message are kept.
#[derive(Clone, Debug)]
pub struct GrpcChannel(Channel);

impl GrpcChannel {
    /// Wraps `channel`.
    pub fn new(channel: Channel) -> Self {
        Self(channel)
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for GrpcChannel {
    type Response = http::Response<ScrubbedBody>;
    type Error = tonic::transport::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.0, cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let answer = tower::Service::call(&mut self.0, req);
        Box::pin(async move {
            let (mut parts, body) = answer.await?.into_parts();
            parts.headers.remove(tonic::Status::GRPC_STATUS_DETAILS);
            Ok(http::Response::from_parts(parts, ScrubbedBody(body)))
        })
    }
}

/// A response body whose trailers carry no `grpc-status-details-bin` (see [`GrpcChannel`]).
pub struct ScrubbedBody(tonic::body::Body);

impl http_body::Body for ScrubbedBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        std::pin::Pin::new(&mut self.0).poll_frame(cx).map(|frame| {
            frame.map(|frame| {
                frame.map(|frame| match frame.into_trailers() {
                    Ok(mut trailers) => {
                        trailers.remove(tonic::Status::GRPC_STATUS_DETAILS);
                        http_body::Frame::trailers(trailers)
                    }
                    Err(frame) => frame,
                })
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0.size_hint()
    }
}

pub use crate::client::grpc_options::Keepalive;

/// What upstream clients use towards controllers (20 s pings, 180 s patience).
pub const CONTROLLER_KEEPALIVE: Keepalive = Keepalive {
    interval: Duration::from_secs(20),
    timeout: Duration::from_secs(180),
};

/// Opens a TLS channel to `endpoint` (`host:port`, or a URL with `https://`).
pub async fn connect_tls(endpoint: &str, tls: &TlsSettings) -> Result<GrpcChannel, ClientError> {
    connect_tls_with(endpoint, tls, CONTROLLER_KEEPALIVE).await
}

/// [`connect_tls`] with the given keepalive.
pub async fn connect_tls_with(
    endpoint: &str,
    tls: &TlsSettings,
    keepalive: Keepalive,
) -> Result<GrpcChannel, ClientError> {
    let hostport = endpoint
        .strip_prefix("https://")
        .or_else(|| endpoint.strip_prefix("grpcs://"))
        .unwrap_or(endpoint)
        .trim_end_matches('/')
        .to_string();
    let connect_err = |source: crate::BoxError| ClientError::connect(&hostport, source);
    let (host, _port) = split_host_port(&hostport).ok_or_else(|| {
        connect_err("expected host:port (e.g. jumpstarter.example.com:443)".into())
    })?;
    let base = |scheme: &str| {
        Endpoint::from_shared(format!("{scheme}://{hostport}"))
            .map(|e| {
                e.tcp_nodelay(true)
                    .connect_timeout(Duration::from_secs(10))
                    .http2_keep_alive_interval(keepalive.interval)
                    .keep_alive_timeout(keepalive.timeout)
                    .keep_alive_while_idle(true)
                    .initial_stream_window_size(crate::wire::settings::STREAM_WINDOW)
                    .initial_connection_window_size(crate::wire::settings::CONNECTION_WINDOW)
                    .max_frame_size(crate::wire::frames::MAX_FRAME)
            })
            .map_err(|e| connect_err(e.into()))
    };
    if tls.insecure {
        let config =
            rustls::ClientConfig::builder_with_provider(Arc::new(crate::tls::tls_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| connect_err(e.into()))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyServer))
                .with_no_client_auth();
        let mut config = config;
        config.alpn_protocols = vec![b"h2".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let server_name = ServerName::try_from(host.to_string()).map_err(|e| {
            connect_err(crate::Because::boxed(format!("bad host name {host:?}"), e))
        })?;
        let addr = hostport.clone();
        return base("http")?
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let connector = connector.clone();
                let server_name = server_name.clone();
                let addr = addr.clone();
                async move {
                    let tcp = tokio::net::TcpStream::connect(&addr).await?;
                    tcp.set_nodelay(true)?;
                    let stream = connector.connect(server_name, tcp).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
            .await
            .map(GrpcChannel)
            .map_err(|e| connect_err(e.into()));
    }
    let mut config = ClientTlsConfig::new().domain_name(host.to_string());
    let roots = crate::tls::system_roots();
    config = match (roots.is_empty(), &tls.ca_pem) {
        (false, _) => config.trust_anchors(roots.iter().cloned()),
        // No system certificates (a minimal container): the config's CA is enough.
        (true, Some(_)) => config,
        (true, None) => {
            return Err(connect_err(
                "no system CA certificates found (the system's store, or SSL_CERT_FILE / \
                 SSL_CERT_DIR) and the config has no tls.ca to trust instead"
                    .into(),
            ));
        }
    };
    if let Some(ca) = &tls.ca_pem {
        config = config.ca_certificate(Certificate::from_pem(ca));
    }
    base("https")?
        .tls_config(config)
        .map_err(|e| connect_err(e.into()))?
        .connect()
        .await
        .map(GrpcChannel)
        .map_err(|e| connect_err(e.into()))
}

/// Opens a TLS channel whose calls carry `auth`.
pub async fn connect_authenticated(
    endpoint: &str,
    tls: &TlsSettings,
    auth: &ControllerAuth,
) -> Result<AuthChannel, ClientError> {
    connect_authenticated_with(endpoint, tls, auth, CONTROLLER_KEEPALIVE).await
}

/// [`connect_authenticated`] with the given keepalive.
pub async fn connect_authenticated_with(
    endpoint: &str,
    tls: &TlsSettings,
    auth: &ControllerAuth,
    keepalive: Keepalive,
) -> Result<AuthChannel, ClientError> {
    let metadata = auth.call_metadata(endpoint)?;
    let channel = connect_tls_with(endpoint, tls, keepalive).await?;
    Ok(InterceptedService::new(channel, metadata))
}

/// Connects to the controller named in a client config, with its credentials.
pub async fn connect_client(cfg: &ClientConfig) -> Result<AuthChannel, ClientError> {
    let (endpoint, tls, auth) = client_credentials(cfg)?;
    // `grpcOptions`: applied, or refused naming the option.
    let keepalive = crate::client::grpc_options::keepalive(&cfg.grpc_options, CONTROLLER_KEEPALIVE)
        .map_err(|e| {
            let target = cfg
                .path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "client config".into());
            ClientError::connect(target, e)
        })?;
    connect_authenticated_with(&endpoint, &tls, &auth, keepalive).await
}

/// Endpoint, TLS settings and call metadata of a client config; errors name the missing
/// field.
pub fn client_credentials(
    cfg: &ClientConfig,
) -> Result<(String, TlsSettings, ControllerAuth), ClientError> {
    let where_ = cfg
        .path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "client config".into());
    let missing = |field: &str| ClientError::connect(&where_, format!("`{field}` is not set"));
    let endpoint = cfg
        .endpoint
        .clone()
        .filter(|e| !e.is_empty())
        .ok_or_else(|| missing("endpoint"))?;
    let token = cfg
        .token
        .clone()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| missing("token"))?;
    let tls = TlsSettings::from_config(&cfg.tls, cfg.path.as_deref())
        .map_err(|e| ClientError::connect(&where_, e))?;
    let namespace = cfg.metadata.namespace.as_deref().unwrap_or("default");
    Ok((
        endpoint,
        tls,
        ControllerAuth::client(namespace, &cfg.metadata.name, &token),
    ))
}

/// Splits `host:port` (IPv6 in brackets); `None` without a valid port.
pub(crate) fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let port = port.parse().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    (!host.is_empty()).then_some((host, port))
}

/// Accepts any server certificate, still checking the handshake signatures.
#[derive(Debug)]
pub(crate) struct AnyServer;

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &rustls::crypto::ring::default_provider().signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &rustls::crypto::ring::default_provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Adds per-call metadata (the passphrase) to every request.
#[derive(Clone, Default)]
pub struct CallMetadata {
    entries: Arc<Vec<(&'static str, MetadataValue<tonic::metadata::Ascii>)>>,
}

/// Shows the keys only: the values include bearer tokens and passphrases.
impl std::fmt::Debug for CallMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|(k, _)| k))
            .finish()
    }
}

impl CallMetadata {
    /// Metadata to add to every call.
    pub fn new(entries: Vec<(&'static str, MetadataValue<tonic::metadata::Ascii>)>) -> Self {
        Self {
            entries: Arc::new(entries),
        }
    }
}

impl tonic::service::Interceptor for CallMetadata {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        for (k, v) in self.entries.iter() {
            req.metadata_mut().insert(*k, v.clone());
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_host_and_port() {
        assert_eq!(split_host_port("a.b:443"), Some(("a.b", 443)));
        assert_eq!(split_host_port("[::1]:8082"), Some(("::1", 8082)));
        assert_eq!(split_host_port("a.b"), None);
        assert_eq!(split_host_port(":80"), None);
        assert_eq!(split_host_port("a:99999"), None);
    }

    #[tokio::test]
    async fn bad_endpoint_is_a_clear_error() {
        let e = connect_tls("no-port", &TlsSettings::default())
            .await
            .unwrap_err();
        let e = crate::error_chain(&e);
        assert!(e.contains("no-port") && e.contains("host:port"), "{e}");
    }

    #[test]
    fn non_ascii_token_is_refused() {
        let e = ControllerAuth::client("ns", "n", "to\nk")
            .call_metadata("x:1")
            .unwrap_err();
        let e = crate::error_chain(&e);
        assert!(e.contains("token"), "{e}");
    }
}
