//! The "easy login" endpoint: `GET /v1/auth/config` over HTTPS returns what `jmp login
//! [client@]host:port` needs to build a client config (upstream's login service, §3.2):
//! `{grpcEndpoint, routerEndpoint?, namespace, caBundle?, oidc: [{issuer, clientId, audiences}]}`.

use std::{sync::Arc, time::Duration};

use jumpstarter_core::auth::IssuedCert;
use tokio::net::TcpListener;
use tokio_rustls::{TlsAcceptor, rustls};

use jumpstarter_core::server::http1::{self, Reply};

/// Requests in flight at once; more connections are closed.
const MAX_CONNECTIONS: usize = 64;
/// A connection must be done within this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The OIDC client id `jmp login` uses by default.
pub const DEFAULT_CLIENT_ID: &str = "jumpstarter-cli";

/// What `/v1/auth/config` describes.
#[derive(Debug, Clone, PartialEq)]
pub struct LoginDocument {
    /// The controller's gRPC endpoint (`host:port`).
    pub grpc_endpoint: String,
    /// The first router's endpoint.
    pub router_endpoint: Option<String>,
    /// The namespace clients live in.
    pub namespace: String,
    /// PEM of the CA clients must trust (empty: system roots).
    pub ca_bundle: String,
    /// External issuers and their audiences.
    pub issuers: Vec<(String, Vec<String>)>,
}

impl LoginDocument {
    /// The JSON body. `clientId` is `jumpstarter-cli` when the issuer accepts that
    /// audience, else its first audience.
    pub fn to_json(&self) -> serde_json::Value {
        let oidc: Vec<serde_json::Value> = self
            .issuers
            .iter()
            .map(|(issuer, audiences)| {
                let client_id = if audiences.iter().any(|a| a == DEFAULT_CLIENT_ID) {
                    DEFAULT_CLIENT_ID
                } else {
                    audiences.first().map_or(DEFAULT_CLIENT_ID, String::as_str)
                };
                serde_json::json!({"issuer": issuer, "clientId": client_id, "audiences": audiences})
            })
            .collect();
        let mut doc = serde_json::json!({
            "grpcEndpoint": self.grpc_endpoint,
            "namespace": self.namespace,
            "oidc": oidc,
        });
        if let Some(r) = &self.router_endpoint {
            doc["routerEndpoint"] = r.clone().into();
        }
        if !self.ca_bundle.is_empty() {
            doc["caBundle"] = self.ca_bundle.clone().into();
        }
        doc
    }
}

/// The login listener's certificate or key is unusable.
#[derive(Debug, thiserror::Error)]
pub enum AcceptorError {
    /// The certificate or key PEM does not parse, or holds no key.
    #[error("TLS: login listener: {0}")]
    Pem(#[source] rustls::pki_types::pem::Error),
    /// rustls refused the protocol versions or the certificate and key.
    #[error("TLS: login listener: {0}")]
    Rustls(#[source] rustls::Error),
}

/// A TLS acceptor presenting `identity`.
pub fn acceptor(identity: &IssuedCert) -> Result<TlsAcceptor, AcceptorError> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let certs = CertificateDer::pem_slice_iter(identity.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(AcceptorError::Pem)?;
    let key =
        PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes()).map_err(AcceptorError::Pem)?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(AcceptorError::Rustls)?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(AcceptorError::Rustls)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `GET /v1/auth/config` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    doc: Arc<LoginDocument>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let handle = move |conn| {
        let (acceptor, doc) = (acceptor.clone(), doc.clone());
        async move {
            if let Ok(tls) = acceptor.accept(conn).await {
                respond(tls, doc).await;
            }
        }
    };
    http1::serve(
        "login",
        listener,
        MAX_CONNECTIONS,
        REQUEST_TIMEOUT,
        handle,
        shutdown,
    )
    .await;
}

async fn respond<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static>(
    conn: S,
    doc: Arc<LoginDocument>,
) {
    http1::respond(conn, move |method, path| {
        let (status, body) = match (method, path.as_str()) {
            (http::Method::GET, "/v1/auth/config") => {
                (http::StatusCode::OK, doc.to_json().to_string())
            }
            (http::Method::GET, _) => (
                http::StatusCode::NOT_FOUND,
                r#"{"error":"not found"}"#.to_string(),
            ),
            _ => (
                http::StatusCode::METHOD_NOT_ALLOWED,
                r#"{"error":"method not allowed"}"#.to_string(),
            ),
        };
        std::future::ready(Reply {
            status,
            content_type: "application/json",
            body,
        })
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_shape() {
        let d = LoginDocument {
            grpc_endpoint: "ctl:8082".into(),
            router_endpoint: Some("r:8083".into()),
            namespace: "lab".into(),
            ca_bundle: String::new(),
            issuers: vec![
                (
                    "https://a".into(),
                    vec!["x".into(), "jumpstarter-cli".into()],
                ),
                ("https://b".into(), vec!["y".into()]),
            ],
        };
        let j = d.to_json();
        assert_eq!(j["grpcEndpoint"], "ctl:8082");
        assert_eq!(j["routerEndpoint"], "r:8083");
        assert_eq!(j["namespace"], "lab");
        assert!(j.get("caBundle").is_none());
        assert_eq!(j["oidc"][0]["clientId"], "jumpstarter-cli");
        assert_eq!(j["oidc"][1]["clientId"], "y");
    }
}
