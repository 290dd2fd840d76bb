//! The "easy login" endpoint: `GET /v1/auth/config` over HTTPS returns what `jmp login
//! [client@]host:port` needs to build a client config (upstream's login service, §3.2):
//! `{grpcEndpoint, routerEndpoint?, namespace, caBundle?, oidc: [{issuer, clientId, audiences}]}`.

use std::{sync::Arc, time::Duration};

use jumpstarter_core::auth::IssuedCert;
use tokio::net::TcpListener;
use tokio_rustls::{TlsAcceptor, rustls};

use crate::{
    http1::{self, Request},
    server::ServerError,
};

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

/// A TLS acceptor presenting `identity`.
pub fn acceptor(identity: &IssuedCert) -> Result<TlsAcceptor, ServerError> {
    let tls = |e: String| ServerError::Tls(format!("login listener: {e}"));
    let certs = rustls_pemfile::certs(&mut identity.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls(e.to_string()))?;
    let key = rustls_pemfile::private_key(&mut identity.key_pem.as_bytes())
        .map_err(|e| tls(e.to_string()))?
        .ok_or_else(|| tls("no private key".into()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| tls(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| tls(e.to_string()))?;
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
                respond(tls, &doc).await;
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

async fn respond<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut conn: S,
    doc: &LoginDocument,
) {
    let Request::Line(method, path) = http1::read_request_line(&mut conn).await else {
        return;
    };
    let (status, body) = match (method.as_str(), path.as_str()) {
        ("GET", "/v1/auth/config") => ("200 OK", doc.to_json().to_string()),
        ("GET", _) => ("404 Not Found", r#"{"error":"not found"}"#.to_string()),
        _ => (
            "405 Method Not Allowed",
            r#"{"error":"method not allowed"}"#.to_string(),
        ),
    };
    http1::reply(&mut conn, status, "application/json", &body).await;
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
