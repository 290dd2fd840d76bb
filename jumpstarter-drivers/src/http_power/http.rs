//! One HTTP/1.1 request per connection (`http://` or `https://` with the system's roots),
//! with optional basic auth, a bounded response body and a timeout on the whole exchange.
//!
//! Errors reach the lease holder, so every URL in them is redacted
//! ([`jumpstarter_core::wire::presigned::redact`]): the query (plugs that take
//! `?user=..&password=..` or an API token there) and any `user:password@` are hidden, in
//! the configured URL and in a redirect's `Location` alike.

use std::{sync::Arc, time::Duration};

use base64::Engine as _;
use bytes::Bytes;
use http::{Method, Request, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use jumpstarter_core::wire::presigned::redact;
use tokio_rustls::rustls;

/// Responses larger than this are refused (a PDU's status document is a few KiB).
const MAX_BODY: usize = 1024 * 1024;

/// What a request can fail with. Every `url` is redacted (no query, no user information).
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The URL cannot be used.
    #[error("{url:?}: {why}")]
    BadUrl {
        /// The URL, redacted.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The text is not a URL.
    #[error("{url:?}: not a URL")]
    NotAUrl {
        /// The text, redacted.
        url: String,
        /// Why it does not parse.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// Connecting, TLS, sending or reading failed.
    #[error("{method} {url}: {what}")]
    Transfer {
        /// The method.
        method: Method,
        /// The URL, redacted.
        url: String,
        /// The step that failed.
        what: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The whole exchange took too long.
    #[error("{method} {url}: no answer within {timeout:?}")]
    Timeout {
        /// The method.
        method: Method,
        /// The URL, redacted.
        url: String,
        /// The limit.
        timeout: Duration,
    },
    /// The server answered with an error (or redirect) status.
    #[error("{method} {url}: HTTP {status}{location}")]
    Status {
        /// The method.
        method: Method,
        /// The URL, redacted.
        url: String,
        /// The status.
        status: http::StatusCode,
        /// ` (redirected to ...)` for redirects, which are not followed (redacted as `url`).
        location: String,
    },
}

/// A checked endpoint URL. Its `Debug` shows it redacted.
#[derive(Clone)]
pub struct Url {
    /// The URL for messages ([`redact`]ed); the URL itself is only sent, never shown.
    shown: String,
    host: String,
    port: u16,
    https: bool,
    authority: String,
    path: String,
}

impl std::fmt::Debug for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.shown)
    }
}

impl Url {
    /// Parses an `http://` or `https://` URL.
    pub fn parse(url: &str) -> Result<Url, HttpError> {
        let bad = |why: String| HttpError::BadUrl {
            url: redact(url),
            why,
        };
        let uri: Uri = url.parse().map_err(|source| HttpError::NotAUrl {
            url: redact(url),
            source,
        })?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => return Err(bad(format!("scheme {other:?} is not http or https"))),
            None => return Err(bad("no scheme (http:// or https://)".into())),
        };
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host".into()))?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
            .to_string();
        let authority = uri
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_else(|| host.clone());
        if authority.contains('@') {
            return Err(bad(
                "credentials in the URL are not supported; use auth.basic".into(),
            ));
        }
        Ok(Url {
            shown: redact(url),
            port: uri.port_u16().unwrap_or(if https { 443 } else { 80 }),
            host,
            https,
            authority,
            path: uri
                .path_and_query()
                .map_or_else(|| "/".to_string(), |p| p.as_str().to_string()),
        })
    }

    /// Whether this is an `https://` URL.
    pub fn is_https(&self) -> bool {
        self.https
    }
}

/// A request to make.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    /// The method.
    pub method: &'a Method,
    /// The URL.
    pub url: &'a Url,
    /// The body (sent as is, without a content type, as upstream's `requests` does).
    pub body: Option<&'a str>,
    /// Basic auth user and password.
    pub basic: Option<(&'a str, &'a str)>,
}

/// Makes `call`; a non-2xx status is an error. Returns the body.
pub async fn request(
    tls: Option<&Arc<rustls::ClientConfig>>,
    call: Call<'_>,
    timeout: Duration,
) -> Result<Bytes, HttpError> {
    let method = call.method.clone();
    let url = call.url.shown.clone();
    tokio::time::timeout(timeout, exchange(tls, call))
        .await
        .map_err(|_| HttpError::Timeout {
            method,
            url,
            timeout,
        })?
}

async fn exchange(
    tls: Option<&Arc<rustls::ClientConfig>>,
    call: Call<'_>,
) -> Result<Bytes, HttpError> {
    let url = call.url;
    let transfer = |what: &'static str| {
        let method = call.method.clone();
        let url = url.shown.clone();
        move |e: Box<dyn std::error::Error + Send + Sync>| HttpError::Transfer {
            method,
            url,
            what,
            source: e,
        }
    };
    let mut builder = Request::builder()
        .method(call.method.clone())
        .uri(url.path.as_str())
        .header(header::HOST, url.authority.as_str())
        .header(header::USER_AGENT, "jumpstarter-rs")
        .header(header::ACCEPT, "*/*")
        .header(header::CONNECTION, "close");
    if let Some((user, password)) = call.basic {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        builder = builder.header(header::AUTHORIZATION, format!("Basic {token}"));
    }
    let req = builder
        .body(Full::new(Bytes::from(
            call.body.unwrap_or_default().to_string(),
        )))
        .map_err(|e| transfer("cannot build the request")(e.into()))?;
    let tcp = tokio::net::TcpStream::connect((url.host.as_str(), url.port))
        .await
        .map_err(|e| transfer("cannot connect")(e.into()))?;
    let resp = if url.https {
        let config = tls.ok_or_else(|| transfer("TLS")("no TLS settings".into()))?;
        let name = rustls::pki_types::ServerName::try_from(url.host.clone())
            .map_err(|e| transfer("bad TLS server name")(e.into()))?;
        let stream = tokio_rustls::TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| transfer("TLS handshake")(e.into()))?;
        send(TokioIo::new(stream), req).await
    } else {
        send(TokioIo::new(tcp), req).await
    }
    .map_err(|(what, e)| transfer(what)(e))?;
    let (status, location, body) = resp;
    if !status.is_success() {
        return Err(HttpError::Status {
            method: call.method.clone(),
            url: url.shown.clone(),
            status,
            location: location
                .map(|l| {
                    format!(
                        " (redirected to {}; redirects are not followed)",
                        redact(&l)
                    )
                })
                .unwrap_or_default(),
        });
    }
    Ok(body)
}

type Sent = (http::StatusCode, Option<String>, Bytes);
type SendError = (&'static str, Box<dyn std::error::Error + Send + Sync>);

async fn send<T>(io: T, req: Request<Full<Bytes>>) -> Result<Sent, SendError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| ("HTTP handshake", e.into()))?;
    let driver = tokio::spawn(conn);
    let result = async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| ("HTTP request", e.into()))?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, MAX_BODY)
            .collect()
            .await
            .map_err(|e| ("reading the response", e))?
            .to_bytes();
        let location = parts
            .headers
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .map(str::to_string)
            .filter(|_| parts.status.is_redirection());
        Ok((parts.status, location, body))
    }
    .await;
    driver.abort();
    result
}

/// rustls (ring) trusting the system's root certificates.
pub fn tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates are skipped, as elsewhere in the workspace.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        let u = Url::parse("http://127.0.0.1:8080/relay/0?turn=on").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.https),
            ("127.0.0.1", 8080, false)
        );
        assert_eq!(u.path, "/relay/0?turn=on");
        let u = Url::parse("https://[::1]/x").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.https), ("::1", 443, true));
        for bad in ["", "ftp://h/x", "/relative", "http://", "http://u:p@h/"] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn url_errors_and_debug_show_no_secret() {
        for bad in [
            "http://admin:hunter2@h/",
            "ftp://h/x?password=hunter2",
            "http://h/a b?password=hunter2",
        ] {
            let e = Url::parse(bad).unwrap_err().to_string();
            assert!(!e.contains("hunter2"), "{e}");
        }
        let u = Url::parse("http://h/cm?user=admin&password=hunter2").unwrap();
        assert_eq!(format!("{u:?}"), "\"http://h/cm?[REDACTED]\"");
    }

    fn get(url: &Url) -> Call<'_> {
        Call {
            method: &Method::GET,
            url,
            body: None,
            basic: None,
        }
    }

    #[tokio::test]
    async fn request_errors_show_no_secret() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Nothing listens: the connection is refused.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = Url::parse(&format!(
            "http://127.0.0.1:{closed}/cm?user=admin&password=hunter2"
        ))
        .unwrap();
        let e = request(None, get(&url), Duration::from_secs(30))
            .await
            .unwrap_err();
        let text = jumpstarter_core::error_chain(&e);
        assert!(text.contains("cannot connect"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("/cm?[REDACTED]"), "{text}");

        // A redirect whose target carries credentials too.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut chunk = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut chunk).await.unwrap();
                if n == 0 {
                    break;
                }
                head.extend_from_slice(&chunk[..n]);
            }
            conn.write_all(
                b"HTTP/1.1 302 Found\r\nLocation: http://u:hunter2@plug/login?token=hunter2\r\n\
                  Content-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await
            .unwrap();
            let _ = conn.shutdown().await;
        });
        let url = Url::parse(&format!("http://127.0.0.1:{port}/relay?token=hunter2")).unwrap();
        let e = request(None, get(&url), Duration::from_secs(30))
            .await
            .unwrap_err();
        server.await.unwrap();
        let text = jumpstarter_core::error_chain(&e);
        assert!(text.contains("HTTP 302"), "{text}");
        assert!(
            text.contains("redirected to http://[REDACTED]@plug/login?[REDACTED]"),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
    }
}
