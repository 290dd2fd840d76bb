//! A connected UDP socket as a byte stream: one write is one datagram, one read one datagram.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::UdpSocket,
};

/// The largest UDP payload: reads use a buffer this big so no datagram is cut.
const MAX_DATAGRAM: usize = 65_536;

/// A UDP socket connected to one peer, read and written as a stream of datagrams.
#[derive(Debug)]
pub struct UdpStream {
    socket: UdpSocket,
    buf: Vec<u8>,
    /// Bytes of the last datagram not yet read (the reader's buffer was smaller).
    pending: std::ops::Range<usize>,
}

impl UdpStream {
    /// Binds an ephemeral local port of the peer's address family and connects it to
    /// `host:port` (the first address `host` resolves to).
    pub async fn connect(host: &str, port: u16) -> io::Result<Self> {
        let peer = tokio::net::lookup_host((host, port))
            .await?
            .next()
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"))
            })?;
        let local: std::net::SocketAddr = if peer.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(local).await?;
        socket.connect(peer).await?;
        Ok(Self {
            socket,
            buf: Vec::new(),
            pending: 0..0,
        })
    }
}

impl AsyncRead for UdpStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // An empty datagram is skipped: 0 bytes would read as the end of the stream.
        while this.pending.is_empty() {
            if this.buf.len() < MAX_DATAGRAM {
                this.buf.resize(MAX_DATAGRAM, 0);
            }
            let mut rb = ReadBuf::new(&mut this.buf);
            match this.socket.poll_recv(cx, &mut rb) {
                Poll::Ready(Ok(())) => this.pending = 0..rb.filled().len(),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = this.pending.len().min(out.remaining());
        let start = this.pending.start;
        out.put_slice(&this.buf[start..start + n]);
        this.pending.start += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for UdpStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        // A datagram is sent whole or not at all; larger writes are cut at the UDP limit.
        let n = data.len().min(MAX_DATAGRAM - 8 - 20);
        self.socket.poll_send(cx, &data[..n])
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn writes_are_datagrams_and_reads_take_one_each() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = server.local_addr().unwrap().port();
        let mut s = UdpStream::connect("127.0.0.1", port).await.unwrap();
        s.write_all(b"one").await.unwrap();
        s.write_all(b"two!").await.unwrap();
        let mut buf = [0u8; 100];
        let (n, from) = server.recv_from(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"one");
        let (n, _) = server.recv_from(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"two!");
        server.send_to(b"back", from).await.unwrap();
        server.send_to(b"again", from).await.unwrap();
        let n = s.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"back");
        // A small reader buffer takes a datagram in pieces.
        let mut small = [0u8; 2];
        let n = s.read(&mut small).await.unwrap();
        assert_eq!(&small[..n], b"ag");
        let n = s.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"ain");
    }

    #[tokio::test]
    async fn an_unresolvable_host_is_an_error() {
        assert!(UdpStream::connect("no-such-host.invalid", 9).await.is_err());
    }
}
