//! An exporter's end of a router tunnel as an in-memory connection to its session server.
//!
//! A tunnel's payloads arrive as [`Bytes`] chunks; the session's HTTP/2 server reads a byte
//! stream. Rather than writing the chunks into a socket (or an in-memory pipe) for the
//! server to read back, [`tunnel_conn`] hands them over as they are: the server reads
//! straight out of the chunk that came off the router connection (through the
//! [`AuthorityRewriter`], which fixes the header blocks of upstream's Python clients), and
//! what the server writes is gathered into chunks that go out as tunnel frames. Each byte is
//! copied once on the way in and once on the way out, where a socket in between costs four
//! copies and two system calls per chunk.
//!
//! ```
//! # async fn demo() {
//! use jumpstarter_core::server::tunnel_conn;
//! let (conn, mut sink, mut source) = tunnel_conn();
//! // `sink` takes the peer's bytes, `source` yields the server's; `conn` goes to the server
//! // (see `server::serve_tunnels`).
//! # let _ = (conn, &mut sink, &mut source);
//! # }
//! ```

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::{
    server::h2_authority::AuthorityRewriter,
    wire::{
        frames::CHUNK,
        resource::{PipeReader, PipeWriter, pipe},
    },
};

/// Creates a connection and the two ends a tunnel drives it with: `sink` takes the bytes
/// the peer sent (the connection reads them), `source` yields what the connection writes.
///
/// Each direction is a [`pipe`], so both are bounded (four chunks each): a slow server
/// slows the tunnel down and a slow tunnel slows the server down. A failed `sink` is a read
/// error on the connection after what arrived before it.
pub fn tunnel_conn() -> (TunnelConn, PipeWriter, PipeReader) {
    let (sink, incoming) = pipe();
    let (outgoing, source) = pipe();
    (
        TunnelConn {
            incoming,
            rewriter: AuthorityRewriter::new(),
            chunk: Bytes::new(),
            run: 0,
            rewritten: Vec::new(),
            rewritten_at: 0,
            error: None,
            outgoing,
            pending: BytesMut::new(),
        },
        sink,
        source,
    )
}

/// The session server's side of a tunnel: reads what the peer sent (with bad `:authority`
/// values rewritten), writes what goes back. Created by [`tunnel_conn`].
pub struct TunnelConn {
    incoming: PipeReader,
    rewriter: AuthorityRewriter,
    /// The rest of the chunk being read.
    chunk: Bytes,
    /// How many bytes at the start of `chunk` pass through unchanged.
    run: usize,
    /// What the rewriter made of the bytes before that run, and how much of it was read.
    rewritten: Vec<u8>,
    rewritten_at: usize,
    /// An error met after some bytes were handed over: reported by the next read.
    error: Option<io::Error>,
    outgoing: PipeWriter,
    /// Written bytes not yet sent (sent on flush, or once a chunk's worth has gathered).
    pending: BytesMut,
}

impl std::fmt::Debug for TunnelConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelConn")
            .field("buffered_in", &self.chunk.len())
            .field("buffered_out", &self.pending.len())
            .finish_non_exhaustive()
    }
}

/// A connection the server drops ends the tunnel as cleanly as one it shuts down.
impl Drop for TunnelConn {
    fn drop(&mut self) {
        self.outgoing.close();
    }
}

impl TunnelConn {
    /// Moves bytes into `buf` until it is full or nothing more is at hand. `Ready(Ok)` with
    /// nothing added is the end of file.
    fn fill(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if self.rewritten_at < self.rewritten.len() {
                let left = &self.rewritten[self.rewritten_at..];
                let n = left.len().min(buf.remaining());
                buf.put_slice(&left[..n]);
                self.rewritten_at += n;
                continue;
            }
            if self.run > 0 {
                let n = self.run.min(buf.remaining());
                buf.put_slice(&self.chunk[..n]);
                self.chunk.advance(n);
                self.run -= n;
                continue;
            }
            if !self.chunk.is_empty() {
                self.rewritten.clear();
                self.rewritten_at = 0;
                let (used, run) = self
                    .rewriter
                    .next_run(&self.chunk, &mut self.rewritten)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                self.chunk.advance(used);
                self.run = run;
                continue;
            }
            match ready!(self.incoming.poll_chunk(cx))? {
                Some(chunk) => self.chunk = chunk,
                None => return Poll::Ready(Ok(())),
            }
        }
    }

    /// Sends the gathered bytes as one chunk (waits for room in the queue).
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.pending.is_empty() {
            return Poll::Ready(Ok(()));
        }
        let pending = &mut self.pending;
        self.outgoing
            .poll_send_with(cx, || pending.split().freeze())
    }
}

impl AsyncRead for TunnelConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(e) = this.error.take() {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        match this.fill(cx, buf) {
            Poll::Pending if buf.filled().len() > before => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) if buf.filled().len() > before => {
                this.error = Some(e);
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for TunnelConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let room = this.pending.capacity() - this.pending.len();
        // Never grow a buffer (that would copy what it holds): send what is gathered first.
        if this.pending.len() >= CHUNK || (!this.pending.is_empty() && room < total) {
            ready!(this.poll_send(cx))?;
        } else if this.outgoing.is_closed() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "tunnel closed",
            )));
        }
        if this.pending.capacity() - this.pending.len() < total {
            this.pending.reserve(total.max(CHUNK));
        }
        for b in bufs {
            this.pending.extend_from_slice(b);
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_send(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_send(cx))?;
        self.outgoing.close();
        Poll::Ready(Ok(()))
    }
}

impl tonic::transport::server::Connected for TunnelConn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::wire::{
        frames::{FrameSink, FrameSource},
        resource::PIPE_CHUNKS,
    };

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// A client's side of a connection: preface, SETTINGS, a request whose `:authority` is
    /// the percent-encoded socket path upstream's clients send, and 600 KiB of DATA.
    fn client_bytes() -> Vec<u8> {
        let mut enc = loona_hpack::Encoder::new();
        let block = enc.encode([
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/jumpstarter.v1.ExporterService/GetReport"),
            (b":authority", b"tmp%2Fjumpstarter-abc%2Fsocket"),
        ]);
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]));
        bytes.extend(frame(0x1, 0x4, 1, &block));
        let mut x: u32 = 7;
        for _ in 0..6 {
            let payload: Vec<u8> = (0..100 * 1024)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (x >> 16) as u8
                })
                .collect();
            bytes.extend(frame(0x0, 0, 1, &payload));
        }
        bytes
    }

    fn rewritten(input: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        AuthorityRewriter::new().feed(input, &mut out).unwrap();
        out
    }

    /// Feeds `input` to the sink in `piece`-byte chunks and reads the connection to its end
    /// `read`-byte reads at a time.
    async fn through(input: &[u8], piece: usize, read: usize) -> io::Result<Vec<u8>> {
        let (mut conn, mut sink, _source) = tunnel_conn();
        let chunks: Vec<Bytes> = input.chunks(piece).map(Bytes::copy_from_slice).collect();
        let feeder = tokio::spawn(async move {
            for c in chunks {
                sink.write_chunk(c).await?;
            }
            sink.finish().await
        });
        let mut got = Vec::new();
        let mut buf = vec![0u8; read];
        loop {
            let n = conn.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        feeder.await.unwrap()?;
        Ok(got)
    }

    #[tokio::test]
    async fn reads_are_the_rewritten_stream_whatever_the_chunks_and_reads() {
        let input = client_bytes();
        let want = rewritten(&input);
        assert_ne!(want, input, "the authority must have been rewritten");
        for (piece, read) in [(1, 64 * 1024), (7, 1000), (4096, 13), (300_000, 256 * 1024)] {
            let got = through(&input, piece, read).await.unwrap();
            assert!(got == want, "pieces of {piece}, reads of {read}");
        }
    }

    #[tokio::test]
    async fn a_broken_tunnel_is_a_read_error_after_what_arrived() {
        let (mut conn, mut sink, _source) = tunnel_conn();
        sink.write_chunk(Bytes::from_static(b"PRI * HTTP/2.0\r\n"))
            .await
            .unwrap();
        sink.fail(io::Error::new(io::ErrorKind::UnexpectedEof, "router gone"));
        let mut got = Vec::new();
        let e = conn.read_to_end(&mut got).await.unwrap_err();
        assert_eq!(got, b"PRI * HTTP/2.0\r\n");
        assert!(e.to_string().contains("router gone"), "{e}");
    }

    #[tokio::test]
    async fn a_peer_that_does_not_speak_http2_is_a_read_error() {
        let (mut conn, mut sink, _source) = tunnel_conn();
        sink.write_chunk(Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n"))
            .await
            .unwrap();
        let e = conn.read_to_end(&mut Vec::new()).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("preface"), "{e}");
    }

    #[tokio::test]
    async fn writes_are_gathered_into_chunks_and_shutdown_ends_the_source() {
        let (mut conn, _sink, mut source) = tunnel_conn();
        let big: Vec<u8> = (0..3 * CHUNK + 5).map(|i| (i % 251) as u8).collect();
        let writer = {
            let big = big.clone();
            tokio::spawn(async move {
                for _ in 0..3 {
                    conn.write_all(b"tiny").await?;
                }
                conn.flush().await?;
                for piece in big.chunks(10_000) {
                    conn.write_all(piece).await?;
                }
                conn.shutdown().await?;
                io::Result::Ok(conn)
            })
        };
        let first = source.next_chunk().await.unwrap().unwrap();
        assert_eq!(
            first,
            &b"tinytinytiny"[..],
            "small writes gathered until the flush"
        );
        let mut rest = Vec::new();
        let mut chunks = 0;
        while let Some(c) = source.next_chunk().await.unwrap() {
            assert!(c.len() <= CHUNK + 10_000, "chunk of {}", c.len());
            rest.extend_from_slice(&c);
            chunks += 1;
        }
        assert!(rest == big, "bytes arrive whole and in order");
        assert!((3..=5).contains(&chunks), "{chunks} chunks");
        writer.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn writes_wait_while_the_tunnel_is_behind_and_fail_once_it_is_gone() {
        let (mut conn, _sink, source) = tunnel_conn();
        let block = vec![1u8; 64 * 1024];
        let mut accepted = 0;
        loop {
            match tokio::time::timeout(Duration::from_millis(200), conn.write_all(&block)).await {
                Ok(r) => {
                    r.unwrap();
                    accepted += block.len();
                }
                Err(_) => break,
            }
            assert!(
                accepted <= (PIPE_CHUNKS + 2) * CHUNK,
                "{accepted} bytes taken"
            );
        }
        assert!(
            accepted >= PIPE_CHUNKS * CHUNK,
            "only {accepted} bytes taken"
        );
        drop(source);
        let e = conn.write_all(&block).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }
}
