//! `jumpstarter_driver_network.driver.WebsocketNetwork`: a WebSocket client connection from
//! the exporter, relayed as a stream of messages.
//!
//! Each DATA frame the client sends is one binary message to the server; each message the
//! server sends (binary, or text as its UTF-8 bytes) is one DATA frame back, as upstream's
//! `WebsocketClientStream`. Pings are answered by the WebSocket layer; a close from the
//! server ends the stream. `ws://` connects in plain TCP, `wss://` over TLS (rustls with the
//! system's root certificates).

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use jumpstarter_core::{CallContext, Driver, DriverError, driver, driver::DriverArgs};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::rustls;
use tokio_tungstenite::{
    WebSocketStream,
    tungstenite::{self, Message, client::IntoClientRequest, http::Uri, protocol::WebSocketConfig},
};

use super::ADDRESS_DISABLED;

/// The largest message accepted from the server (the default of the WebSocket library,
/// 64 MiB, is more than a console or a tunnel needs at once).
const MAX_MESSAGE: usize = 16 << 20;

/// A boxed byte stream under the WebSocket: plain TCP or TLS.
type Transport = Box<dyn jumpstarter_core::driver::Duplex>;

/// A WebSocket connection as a byte stream: one write is one binary message, one read
/// returns (part of) one message.
pub struct WebsocketStream {
    ws: WebSocketStream<Transport>,
    /// The part of the last message not read yet.
    pending: Bytes,
    /// The server closed the connection.
    closed: bool,
}

impl std::fmt::Debug for WebsocketStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebsocketStream")
            .field("pending", &self.pending.len())
            .field("closed", &self.closed)
            .finish()
    }
}

fn io_error(e: tungstenite::Error) -> io::Error {
    match e {
        tungstenite::Error::Io(e) => e,
        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the WebSocket connection is closed",
        ),
        other => io::Error::other(other),
    }
}

impl AsyncRead for WebsocketStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Empty messages are skipped: 0 bytes would read as the end of the stream.
        while this.pending.is_empty() {
            if this.closed {
                return Poll::Ready(Ok(()));
            }
            match ready!(this.ws.poll_next_unpin(cx)) {
                None
                | Some(Ok(Message::Close(_)))
                | Some(Err(tungstenite::Error::ConnectionClosed)) => this.closed = true,
                Some(Ok(Message::Binary(b))) => this.pending = b,
                Some(Ok(Message::Text(t))) => this.pending = Bytes::from(t),
                // Pings are answered by the WebSocket layer; pongs and raw frames carry no data.
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
            }
        }
        let n = this.pending.len().min(out.remaining());
        out.put_slice(&this.pending.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for WebsocketStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        ready!(this.ws.poll_ready_unpin(cx)).map_err(io_error)?;
        this.ws
            .start_send_unpin(Message::Binary(Bytes::copy_from_slice(data)))
            .map_err(io_error)?;
        // Sent now rather than at the next flush: the relay writes one frame at a time.
        // What does not fit in the socket yet goes out at the next write or flush.
        if let Poll::Ready(Err(e)) = this.ws.poll_flush_unpin(cx) {
            return Poll::Ready(Err(io_error(e)));
        }
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().ws.poll_flush_unpin(cx).map_err(io_error)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match ready!(self.get_mut().ws.poll_close_unpin(cx)) {
            Ok(())
            | Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                Poll::Ready(Ok(()))
            }
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }
}

/// A checked `ws://` or `wss://` URL.
#[derive(Debug, Clone)]
struct WsUrl {
    text: String,
    host: String,
    port: u16,
    tls: bool,
}

impl WsUrl {
    fn parse(url: &str) -> Result<Self, DriverError> {
        let bad = |why: &str| DriverError::InvalidArgument(format!("url: {url:?} {why}"));
        let uri: Uri = url.parse().map_err(|e| {
            bad(&format!(
                "is not a URL ({e})",
                e = jumpstarter_core::error_chain(&e)
            ))
        })?;
        let tls = match uri.scheme_str() {
            Some("ws") => false,
            Some("wss") => true,
            Some(other) => return Err(bad(&format!("has scheme {other:?}, not ws or wss"))),
            None => return Err(bad("has no scheme (ws:// or wss://)")),
        };
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("has no host"))?;
        // `[::1]` in a URL is the host `::1`.
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
            .to_string();
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Ok(Self {
            text: url.to_string(),
            host,
            port,
            tls,
        })
    }
}

/// Upstream's config fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    url: String,
    #[serde(default = "super::default_true")]
    enable_address: bool,
}

/// A WebSocket connection from the exporter
/// (`jumpstarter_driver_network.driver.WebsocketNetwork`).
#[derive(Clone)]
pub struct WebsocketNetwork {
    url: WsUrl,
    enable_address: bool,
    /// TLS settings for `wss://` URLs (built once, with the system's roots).
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for WebsocketNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebsocketNetwork")
            .field("url", &self.url.text)
            .field("enable_address", &self.enable_address)
            .finish()
    }
}

#[driver(client = "jumpstarter_driver_network.client.NetworkClient")]
impl WebsocketNetwork {
    /// Opens a WebSocket connection to `url` and relays its messages.
    #[export(stream)]
    async fn connect(&self, ctx: &CallContext) -> Result<WebsocketStream, DriverError> {
        ctx.log_info(format!("Connecting to {}", self.url.text));
        self.open().await
    }

    /// The configured `url`, as upstream.
    #[export]
    async fn address(&self) -> Result<String, DriverError> {
        if !self.enable_address {
            return Err(DriverError::InvalidArgument(ADDRESS_DISABLED.into()));
        }
        Ok(self.url.text.clone())
    }
}

impl WebsocketNetwork {
    /// A driver connecting to `url` (`ws://` or `wss://`).
    pub fn new(url: &str, enable_address: bool) -> Result<Self, DriverError> {
        let url = WsUrl::parse(url)?;
        let tls = if url.tls {
            Some(Arc::new(tls_config([])?))
        } else {
            None
        };
        Ok(Self {
            url,
            enable_address,
            tls,
        })
    }

    /// The same driver also trusting `roots` (CA certificates, DER) for `wss://`, besides
    /// the system's root certificates: a lab's own CA, or a test's. No effect on `ws://`.
    pub fn with_root_certificates(
        mut self,
        roots: impl IntoIterator<Item = rustls::pki_types::CertificateDer<'static>>,
    ) -> Result<Self, DriverError> {
        if self.url.tls {
            self.tls = Some(Arc::new(tls_config(roots)?));
        }
        Ok(self)
    }

    /// Constructor for the registry: `url`, `enable_address` (default true).
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        let c: Config = args.parse()?;
        Ok(Arc::new(Self::new(&c.url, c.enable_address)?))
    }

    /// Connects and performs the WebSocket handshake.
    pub async fn open(&self) -> Result<WebsocketStream, DriverError> {
        let url = &self.url.text;
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            DriverError::failed(format!("cannot connect to WebSocket {url}: {what}{e}"))
        };
        let tcp = tokio::net::TcpStream::connect((self.url.host.as_str(), self.url.port))
            .await
            .map_err(|e| failed("", &e))?;
        let _ = tcp.set_nodelay(true);
        let transport: Transport = match &self.tls {
            None => Box::new(tcp),
            Some(config) => {
                let name = rustls::pki_types::ServerName::try_from(self.url.host.clone())
                    .map_err(|e| failed("bad TLS server name: ", &e))?;
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| failed("TLS: ", &e))?;
                Box::new(tls)
            }
        };
        let request = url
            .as_str()
            .into_client_request()
            .map_err(|e| failed("", &e))?;
        let config = WebSocketConfig::default()
            .write_buffer_size(0)
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let (ws, _response) =
            tokio_tungstenite::client_async_with_config(request, transport, Some(config))
                .await
                .map_err(|e| failed("handshake: ", &e))?;
        Ok(WebsocketStream {
            ws,
            pending: Bytes::new(),
            closed: false,
        })
    }
}

/// rustls (ring) trusting the system's root certificates and `extra`.
fn tls_config(
    extra: impl IntoIterator<Item = rustls::pki_types::CertificateDer<'static>>,
) -> Result<rustls::ClientConfig, DriverError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates are skipped, as elsewhere in the workspace.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    for cert in extra {
        roots.add(cert).map_err(|e| {
            DriverError::invalid_because("not a usable CA certificate for wss://", e)
        })?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| DriverError::because("url: cannot set up TLS for wss://", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn urls_are_checked_at_start_naming_the_field() {
        let u = WsUrl::parse("ws://127.0.0.1:8080/path?q=1").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.tls), ("127.0.0.1", 8080, false));
        let u = WsUrl::parse("wss://example.com/x").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.tls), ("example.com", 443, true));
        let u = WsUrl::parse("ws://[::1]/").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 80));
        for (bad, why) in [
            ("http://h/", "scheme"),
            ("h:80", "scheme"),
            ("ws://", "URL"),
            ("not a url", "URL"),
        ] {
            let e = WsUrl::parse(bad).err().unwrap().to_string();
            assert!(e.contains("url: ") && e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_configs_are_refused() {
        let args = |v| DriverArgs { config: v };
        let e = WebsocketNetwork::from_args(&args(serde_json::json!({})))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("url"), "{e}");
        let e =
            WebsocketNetwork::from_args(&args(serde_json::json!({"url": "ws://h/", "colour": 1})))
                .err()
                .unwrap()
                .to_string();
        assert!(e.contains("colour"), "{e}");
        assert!(
            WebsocketNetwork::from_args(&args(
                serde_json::json!({"url": "wss://h/", "enable_address": false})
            ))
            .is_ok()
        );
    }

    #[tokio::test]
    async fn address_is_the_url_unless_disabled() {
        let on = WebsocketNetwork::new("ws://127.0.0.1:9/echo", true).unwrap();
        assert_eq!(on.address().await.unwrap(), "ws://127.0.0.1:9/echo");
        let off = WebsocketNetwork::new("ws://127.0.0.1:9/echo", false).unwrap();
        assert!(matches!(
            off.address().await,
            Err(DriverError::InvalidArgument(m)) if m.contains("enable_address")
        ));
    }
}
