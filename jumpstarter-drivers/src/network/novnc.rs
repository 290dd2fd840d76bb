//! noVNC for a VNC byte stream, as upstream's `NovncAdapter` (`QemuClient.novnc()`).
//!
//! A browser's noVNC page speaks VNC inside a WebSocket. [`novnc`] listens on a temporary
//! TCP port on loopback, accepts WebSocket connections there (plain `ws://`, as upstream's
//! adapter) and relays each one through its own byte stream to the driver (QEMU's `vnc`
//! child, or any network driver whose far end is a VNC server): each binary or text message
//! from the browser is written to the stream as it is, and what the stream yields is sent
//! back as binary messages. It returns the same `https://novnc.com/noVNC/vnc.html?...` link
//! upstream prints, which points the hosted noVNC page at that port.

use std::{net::SocketAddr, sync::Arc};

use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use jumpstarter_core::{ClientError, client::DriverClient, wire::frames::CHUNK};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    task::JoinHandle,
};
use tokio_tungstenite::tungstenite::{Message, protocol::WebSocketConfig};

/// At most this many browser connections are relayed at once; more wait to be accepted.
const MAX_VIEWERS: usize = 16;

/// The largest message accepted from a browser (a VNC client sends key and pointer events
/// and small requests; 1 MiB is far more than any needs).
const MAX_MESSAGE: usize = 1 << 20;

/// A running noVNC bridge; dropping it stops listening and cuts the relayed connections.
pub struct Novnc {
    url: String,
    local: SocketAddr,
    task: JoinHandle<()>,
}

impl Novnc {
    /// The noVNC page's link, with this bridge's host and port in its query.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where the WebSocket listener is.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

impl Drop for Novnc {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The link upstream's adapter yields: the hosted noVNC page, told to connect to
/// `local` (`encrypt=1` asks the page for `wss://`, as upstream's default).
fn novnc_url(local: SocketAddr, encrypt: bool) -> String {
    format!(
        "https://novnc.com/noVNC/vnc.html?encrypt={}&autoconnect=1&reconnect=1&host={}&port={}",
        u8::from(encrypt),
        local.ip(),
        local.port()
    )
}

/// Listens on `127.0.0.1` (a free port) and relays every WebSocket connection to
/// `method` of `client`; returns once listening.
pub async fn novnc(
    client: DriverClient,
    method: &str,
    encrypt: bool,
) -> Result<Novnc, ClientError> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| {
            ClientError::Io(std::io::Error::new(
                e.kind(),
                jumpstarter_core::Because::boxed("cannot listen on 127.0.0.1".to_string(), e),
            ))
        })?;
    let local = listener.local_addr()?;
    let method: Arc<str> = method.into();
    let task = super::accept::serve(listener, MAX_VIEWERS, move |conn, peer| {
        let (client, method) = (client.clone(), method.clone());
        async move {
            if let Err(e) = relay(client, &method, conn).await {
                tracing::info!(
                    "noVNC connection from {peer} ended: {e}",
                    e = jumpstarter_core::error_chain(&e)
                );
            }
        }
    });
    Ok(Novnc {
        url: novnc_url(local, encrypt),
        local,
        task,
    })
}

/// Why a relayed connection ended early.
#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("the WebSocket failed")]
    WebSocket(#[from] tokio_tungstenite::tungstenite::Error),
    #[error("the VNC stream failed")]
    Stream(#[from] ClientError),
    #[error("the VNC stream failed")]
    Io(#[from] std::io::Error),
}

/// One browser connection: the WebSocket handshake, then messages to and from a new stream.
async fn relay(
    client: DriverClient,
    method: &str,
    conn: tokio::net::TcpStream,
) -> Result<(), RelayError> {
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    let ws = tokio_tungstenite::accept_async_with_config(conn, Some(config)).await?;
    let remote = client.open_stream(method).await?;
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (mut rd, mut wr) = tokio::io::split(remote);
    let to_vnc = async {
        while let Some(msg) = ws_rx.next().await {
            match msg? {
                Message::Binary(b) => wr.write_all(&b).await?,
                Message::Text(t) => wr.write_all(t.as_bytes()).await?,
                Message::Close(_) => break,
                // Pings are answered by the WebSocket layer.
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
            }
        }
        wr.shutdown().await?;
        Ok::<_, RelayError>(())
    };
    let from_vnc = async {
        let mut buf = BytesMut::with_capacity(CHUNK);
        loop {
            buf.reserve(CHUNK);
            if rd.read_buf(&mut buf).await? == 0 {
                break;
            }
            ws_tx.send(Message::Binary(buf.split().freeze())).await?;
        }
        // The VNC server hung up: tell the browser.
        ws_tx.close().await?;
        Ok::<_, RelayError>(())
    };
    // Whichever side ends first ends the connection.
    tokio::select! {
        r = to_vnc => r,
        r = from_vnc => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_is_upstreams() {
        let addr: SocketAddr = "127.0.0.1:5901".parse().unwrap_or_else(|_| unreachable!());
        assert_eq!(
            novnc_url(addr, true),
            "https://novnc.com/noVNC/vnc.html?encrypt=1&autoconnect=1&reconnect=1&host=127.0.0.1&port=5901"
        );
        assert!(novnc_url(addr, false).contains("encrypt=0&"));
    }
}
