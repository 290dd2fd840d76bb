//! A small HTTPS client for OIDC discovery, JWKS and token endpoints: one request per
//! connection, bounded response size, a timeout on every step.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio_rustls::rustls::{
    self,
    pki_types::{CertificateDer, ServerName, pem::PemObject},
};

use super::OidcError;

/// What every request accepts: JSON, and JWK Sets (RFC 7517 section 8.5), which Kubernetes
/// serves only under their own media type.
const ACCEPT: &str = "application/json, application/jwk-set+json";

/// Responses larger than this are refused (discovery documents and JWKS are a few KiB).
const MAX_BODY: usize = 1024 * 1024;
/// Connect, handshake, request and body together must finish within this.
const TIMEOUT: Duration = Duration::from_secs(15);

/// A response: status, headers and the whole (bounded) body.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// The status code.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl HttpResponse {
    /// The body as JSON; `url` names the source in errors.
    pub fn json(&self, url: &str) -> Result<Value, OidcError> {
        serde_json::from_slice(&self.body).map_err(|source| OidcError::NotJson {
            url: url.to_owned(),
            source,
        })
    }
}

/// An HTTPS client trusting the system roots plus an optional extra CA, or (insecure)
/// anything. Plain `http://` is accepted for loopback hosts only (local callbacks, tests).
#[derive(Clone)]
pub struct HttpsClient {
    tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for HttpsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsClient").finish_non_exhaustive()
    }
}

/// Whether `host` (as in a URL, IPv6 without brackets) is a loopback name or address.
pub fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl HttpsClient {
    /// A client trusting the system roots plus `extra_ca_pem` (a PEM bundle), or, with
    /// `insecure`, any server certificate.
    pub fn new(extra_ca_pem: Option<&str>, insecure: bool) -> Result<Self, OidcError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("protocol versions", e))?;
        let mut config = if insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(crate::client::channel::AnyServer))
                .with_no_client_auth()
        } else {
            // Unreadable system certificates are skipped: the extra CA may be all we need.
            let mut roots =
                rustls::RootCertStore::from_iter(crate::tls::system_roots().iter().cloned());
            if let Some(pem) = extra_ca_pem {
                let mut added = 0;
                for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                    let cert = cert.map_err(|e| tls_err("certificate authority is not PEM", e))?;
                    roots
                        .add(cert)
                        .map_err(|e| tls_err("certificate authority is unusable", e))?;
                    added += 1;
                }
                if added == 0 {
                    return Err(OidcError::Tls(
                        "certificate authority holds no PEM certificate".into(),
                    ));
                }
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            tls: Arc::new(config),
        })
    }

    /// `GET url`.
    pub async fn get(&self, url: &str) -> Result<HttpResponse, OidcError> {
        self.send(Method::GET, url, None).await
    }

    /// `GET url`, expecting `200` and a JSON body (`application/json`, or a JWK Set as
    /// `application/jwk-set+json`).
    pub async fn get_json(&self, url: &str) -> Result<Value, OidcError> {
        let resp = self.get(url).await?;
        if resp.status != StatusCode::OK {
            return Err(OidcError::Status {
                url: url.to_owned(),
                status: resp.status.as_u16(),
                body: snippet(&resp.body),
            });
        }
        resp.json(url)
    }

    /// `POST url` with an `application/x-www-form-urlencoded` body.
    pub async fn post_form(
        &self,
        url: &str,
        form: &[(&str, &str)],
    ) -> Result<HttpResponse, OidcError> {
        self.send(Method::POST, url, Some(form_encode(form))).await
    }

    async fn send(
        &self,
        method: Method,
        url: &str,
        form: Option<String>,
    ) -> Result<HttpResponse, OidcError> {
        tokio::time::timeout(TIMEOUT, self.send_inner(method, url, form))
            .await
            .map_err(|_| http_err(url, format!("no answer within {}s", TIMEOUT.as_secs())))?
    }

    async fn send_inner(
        &self,
        method: Method,
        url: &str,
        form: Option<String>,
    ) -> Result<HttpResponse, OidcError> {
        let uri: Uri = url.parse().map_err(|e| transfer_err(url, "not a URL", e))?;
        let host = uri
            .host()
            .ok_or_else(|| http_err(url, "no host".into()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") if is_loopback_host(&host) => false,
            Some("http") => {
                return Err(http_err(
                    url,
                    "plain http is only allowed to loopback hosts; use https".into(),
                ));
            }
            _ => return Err(http_err(url, "scheme must be https".into())),
        };
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let authority = uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_else(|| host.clone());
        let path = uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".into());
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, authority)
            // A Kubernetes API server serves its issuer keys (`/openid/v1/jwks`) only as
            // `application/jwk-set+json` and answers 406 to `Accept: application/json` alone.
            .header(header::ACCEPT, ACCEPT)
            .header(header::USER_AGENT, "jumpstarter-rs")
            .header(header::CONNECTION, "close");
        if form.is_some() {
            builder = builder.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        }
        let req = builder
            .body(Full::new(Bytes::from(form.unwrap_or_default())))
            .map_err(|e| transfer_err(url, "cannot build the request", e))?;
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| transfer_err(url, "cannot connect", e))?;
        if https {
            let name = ServerName::try_from(host.clone())
                .map_err(|e| transfer_err(url, "bad host name", e))?;
            let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| transfer_err(url, "TLS", e))?;
            exchange(TokioIo::new(tls), req, url).await
        } else {
            exchange(TokioIo::new(tcp), req, url).await
        }
    }
}

async fn exchange<T>(io: T, req: Request<Full<Bytes>>, url: &str) -> Result<HttpResponse, OidcError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| transfer_err(url, "HTTP handshake", e))?;
    let driver = tokio::spawn(conn);
    let result = async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| transfer_err(url, "HTTP request", e))?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, MAX_BODY)
            .collect()
            .await
            .map_err(|e| transfer_err(url, "reading the response", e))?
            .to_bytes();
        Ok(HttpResponse {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
    .await;
    driver.abort();
    result
}

fn transfer_err(
    url: &str,
    what: &'static str,
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> OidcError {
    OidcError::Transfer {
        url: url.to_owned(),
        what,
        source: source.into(),
    }
}

fn tls_err(
    what: &'static str,
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> OidcError {
    OidcError::TlsConfig {
        what,
        source: source.into(),
    }
}

fn http_err(url: &str, reason: String) -> OidcError {
    OidcError::Http {
        url: url.to_owned(),
        reason,
    }
}

/// The start of a body, for error messages.
pub(crate) fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_owned(),
    }
}

/// Percent-encodes one form/query component (RFC 3986 unreserved characters stay).
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes one form/query component (`+` is a space).
pub fn url_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a=1&b=2`, each part encoded.
pub fn form_encode(form: &[(&str, &str)]) -> String {
    form.iter()
        .map(|(k, v)| format!("{}={}", url_encode(k), url_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The pairs of a query string or form body, decoded.
pub fn form_decode(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (url_decode(k), url_decode(v)),
            None => (url_decode(p), String::new()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_round_trip() {
        let enc = form_encode(&[("a b", "x&y=z/ü"), ("k", "")]);
        assert_eq!(enc, "a%20b=x%26y%3Dz%2F%C3%BC&k=");
        let dec = form_decode(&enc);
        assert_eq!(dec[0], ("a b".into(), "x&y=z/ü".into()));
        assert_eq!(dec[1], ("k".into(), String::new()));
        assert_eq!(url_decode("a+b%2"), "a b%2");
        assert_eq!(url_decode("%zz"), "%zz");
    }

    #[test]
    fn loopback_hosts() {
        assert!(is_loopback_host("localhost"));
        assert!(is_loopback_host("127.0.0.1"));
        assert!(is_loopback_host("::1"));
        assert!(!is_loopback_host("example.com"));
        assert!(!is_loopback_host("10.0.0.1"));
    }

    #[tokio::test]
    async fn plain_http_is_refused_off_loopback() {
        let c = HttpsClient::new(None, false).unwrap();
        let e = c.get("http://example.com/x").await.unwrap_err().to_string();
        assert!(e.contains("loopback"), "{e}");
        let e = c.get("ftp://example.com/x").await.unwrap_err().to_string();
        assert!(e.contains("https"), "{e}");
        assert!(HttpsClient::new(Some("not pem"), false).is_err());
    }
}
