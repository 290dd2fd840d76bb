//! The "easy login" endpoint: `GET /v1/auth/config` returns what `jmp login
//! [client@]host:port` needs to build a client config (upstream's login service, §3.2):
//! `{grpcEndpoint, routerEndpoint?, namespace, caBundle?, oidc: [{issuer, clientId, audiences}]}`;
//! `GET /` is a landing page for a person (what Jumpstarter is here and how to `jmp login`),
//! and `GET /healthz` says `ok`, as upstream main's. The port speaks HTTPS and, like upstream's
//! (which serves plain HTTP behind an ingress), plain HTTP: a connection that does not open
//! with a TLS handshake is answered in plain HTTP. Nothing served here is secret.

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
    #[error("TLS: login listener: the certificate or key is not usable PEM")]
    Pem(#[source] rustls::pki_types::pem::Error),
    /// rustls refused the protocol versions or the certificate and key.
    #[error("TLS: login listener: the certificate and key are refused")]
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

/// The first byte of a TLS ClientHello record.
const TLS_HANDSHAKE: u8 = 0x16;

/// Serves `GET /v1/auth/config`, `/` and `/healthz` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    doc: Arc<LoginDocument>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let handle = move |conn: tokio::net::TcpStream| {
        let (acceptor, doc) = (acceptor.clone(), doc.clone());
        async move {
            let mut first = [0u8; 1];
            match conn.peek(&mut first).await {
                // A TLS record starts with the handshake content type.
                Ok(1) if first[0] == TLS_HANDSHAKE => {
                    if let Ok(tls) = acceptor.accept(conn).await {
                        respond(tls, doc).await;
                    }
                }
                Ok(1) => respond(conn, doc).await,
                _ => {}
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
        const JSON: &str = "application/json";
        let (status, content_type, body) = match (method, path.as_str()) {
            (http::Method::GET, "/v1/auth/config") => {
                (http::StatusCode::OK, JSON, doc.to_json().to_string())
            }
            (http::Method::GET, "/") => (
                http::StatusCode::OK,
                "text/html; charset=utf-8",
                landing_page(&doc),
            ),
            (http::Method::GET, "/healthz") => {
                (http::StatusCode::OK, "text/plain", "ok".to_string())
            }
            (http::Method::GET, _) => (
                http::StatusCode::NOT_FOUND,
                JSON,
                r#"{"error":"not found"}"#.to_string(),
            ),
            _ => (
                http::StatusCode::METHOD_NOT_ALLOWED,
                JSON,
                r#"{"error":"method not allowed"}"#.to_string(),
            ),
        };
        std::future::ready(Reply {
            status,
            content_type,
            body,
        })
    })
    .await;
}

/// `text` with HTML's special characters escaped.
fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page at `/`: what this is and how to log in (upstream main's landing page says the
/// same: Jumpstarter, `jmp login`, the endpoints and the OIDC issuers).
fn landing_page(doc: &LoginDocument) -> String {
    let mut issuers = String::new();
    for (issuer, _) in &doc.issuers {
        issuers += &format!("<li><code>{}</code></li>\n", html_escape(issuer));
    }
    if issuers.is_empty() {
        issuers = "<li>none: ask an administrator for a client config \
                   (<code>jmp admin create client</code>)</li>\n"
            .to_string();
    }
    let router = doc.router_endpoint.as_deref().map_or(String::new(), |r| {
        format!(
            "<tr><th>Router</th><td><code>{}</code></td></tr>\n",
            html_escape(r)
        )
    });
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>Jumpstarter</title>\n</head>\n<body>\n<h1>Jumpstarter</h1>\n\
         <p>This is the login endpoint of a Jumpstarter controller. Log in with the \
         Jumpstarter CLI, giving it the address of this page (host and port):</p>\n\
         <pre>jmp login HOST:PORT</pre>\n\
         <p>or, to choose the client name: <code>jmp login CLIENT@HOST:PORT</code>. \
         <code>jmp login</code> reads <code>/v1/auth/config</code> here and writes a client \
         config.</p>\n<table>\n\
         <tr><th>Controller</th><td><code>{grpc}</code></td></tr>\n{router}\
         <tr><th>Namespace</th><td><code>{ns}</code></td></tr>\n</table>\n\
         <h2>OIDC issuers</h2>\n<ul>\n{issuers}</ul>\n</body>\n</html>\n",
        grpc = html_escape(&doc.grpc_endpoint),
        ns = html_escape(&doc.namespace),
    )
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

    #[test]
    fn landing_page_names_jumpstarter_and_jmp_login_and_escapes() {
        let d = LoginDocument {
            grpc_endpoint: "ctl:8082".into(),
            router_endpoint: None,
            namespace: "<lab>".into(),
            ca_bundle: String::new(),
            issuers: vec![("https://idp/?a=1&b=2".into(), vec![])],
        };
        let page = landing_page(&d);
        assert!(
            page.contains("Jumpstarter") && page.contains("jmp login"),
            "{page}"
        );
        assert!(page.contains("ctl:8082"), "{page}");
        assert!(
            page.contains("&lt;lab&gt;") && !page.contains("<lab>"),
            "{page}"
        );
        assert!(page.contains("https://idp/?a=1&amp;b=2"), "{page}");
        assert!(!page.contains("Router"), "{page}");
    }
}
