//! Byte streams over `RouterService.Stream` frames.
//!
//! Both sides of a stream send `{payload, frame_type}` messages: `DATA` carries bytes,
//! `GOAWAY` marks the end of one direction, `PING` is ignored. What else ends a direction
//! depends on [`EndOfStream`]: upstream treats `RST_STREAM` as noise and the end of the gRPC
//! stream as a clean end; resource streams are stricter, so that a transfer cut midway is an
//! error for whoever reads it, never a short file.
//!
//! [`splice_with`] connects a frame stream to a [`FrameSink`] (where incoming bytes go) and
//! a [`FrameSource`] (what goes out), with backpressure in both directions: at most one
//! chunk in flight per direction besides the sink's own buffer. [`splice`] does the same for
//! any `AsyncRead + AsyncWrite` (driver byte streams, the router tunnel).

use std::{
    future::Future,
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::{BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use jumpstarter_proto::v1::FrameType;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::task::JoinHandle;

/// Largest payload we put in one DATA frame. Upstream's tools send 64 KiB and accept any
/// message up to gRPC's 4 MiB default; 256 KiB quarters the per-message work of a bulk
/// transfer (about 1.3x the throughput of 64 KiB on loopback) while the queues it sizes
/// (tunnel buffers, resource pipes) stay at a few MiB.
pub const CHUNK: usize = 256 * 1024;

/// The HTTP/2 frame size our servers and clients accept (SETTINGS_MAX_FRAME_SIZE), so that a
/// message carrying a [`CHUNK`] crosses the connection in one frame rather than seventeen
/// (the 1 KiB over is room for the gRPC and protobuf headers around the chunk).
pub const MAX_FRAME: u32 = CHUNK as u32 + 1024;

/// A router frame: implemented by both `StreamRequest` and `StreamResponse`.
pub trait Frame: Send + 'static {
    /// Builds a frame.
    fn new(payload: Vec<u8>, frame_type: FrameType) -> Self;
    /// Builds a frame from shared bytes.
    fn from_bytes(payload: Bytes, frame_type: FrameType) -> Self;
    /// Splits a frame into payload and type (unknown types are reported as `None`).
    fn into_parts(self) -> (Bytes, Option<FrameType>);
}

// Both message types are built and taken apart through `RawFrame`, which the hand-written
// codec needs anyway (it keeps unknown frame types as numbers).
impl<T: crate::wire::stream_rpc::RawFrame> Frame for T {
    fn new(payload: Vec<u8>, frame_type: FrameType) -> Self {
        Self::from_bytes(Bytes::from(payload), frame_type)
    }
    fn from_bytes(payload: Bytes, frame_type: FrameType) -> Self {
        Self::from_raw(payload, frame_type as i32)
    }
    fn into_parts(self) -> (Bytes, Option<FrameType>) {
        let (payload, frame_type) = self.into_raw();
        (payload, FrameType::try_from(frame_type).ok())
    }
}

/// How strictly the end of the incoming direction is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndOfStream {
    /// As upstream: GOAWAY or the end of the gRPC stream is a clean end, an error ends the
    /// direction (the sink is failed), RST_STREAM is ignored.
    Lenient,
    /// Only GOAWAY is a clean end: the gRPC stream ending without it, RST_STREAM, or an
    /// error fail the sink (used for resource streams).
    GoawayRequired,
}

/// Where the bytes of incoming DATA frames go.
pub trait FrameSink: Send + 'static {
    /// Writes one chunk (waits while the consumer is behind).
    fn write_chunk(&mut self, data: Bytes) -> impl Future<Output = io::Result<()>> + Send;
    /// The peer ended cleanly (GOAWAY).
    fn finish(self) -> impl Future<Output = io::Result<()>> + Send;
    /// The transfer broke: the consumer must see an error, not an end of file.
    fn fail(self, error: io::Error);
}

/// What goes out in DATA frames.
pub trait FrameSource: Send + 'static {
    /// The next chunk; `None` at a clean end of file.
    fn next_chunk(&mut self) -> impl Future<Output = io::Result<Option<Bytes>>> + Send;
}

/// A [`FrameSink`] over any `AsyncWrite`: a clean end shuts it down, a failure drops it
/// without shutdown (all a plain writer can be told).
pub struct IoSink<W>(pub W);

impl<W: AsyncWrite + Send + Unpin + 'static> FrameSink for IoSink<W> {
    async fn write_chunk(&mut self, data: Bytes) -> io::Result<()> {
        self.0.write_all(&data).await
    }
    async fn finish(mut self) -> io::Result<()> {
        self.0.shutdown().await
    }
    fn fail(self, error: io::Error) {
        tracing::debug!("stream broken: {error}", error = crate::error_chain(&error));
    }
}

/// A [`FrameSource`] over any `AsyncRead`, read in chunks of at most [`CHUNK`] bytes.
///
/// A large read becomes a chunk as it is, without a copy; a small one is copied out so that
/// the buffer can take the next read (a few bytes must not hold a whole buffer alive).
pub struct IoSource<R> {
    reader: R,
    buf: BytesMut,
}

/// Reads at least this long leave [`IoSource`] without a copy.
const SHARE_MIN: usize = 16 * 1024;

impl<R> IoSource<R> {
    /// Wraps a reader.
    pub fn new(reader: R) -> Self {
        Self {
            reader,
            buf: BytesMut::new(),
        }
    }
}

impl<R: AsyncRead + Send + Unpin + 'static> FrameSource for IoSource<R> {
    async fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        if self.buf.capacity() < CHUNK {
            // The last large chunk took the rest of the old buffer with it.
            self.buf = BytesMut::with_capacity(CHUNK);
        }
        let mut limited = (&mut self.buf).limit(CHUNK);
        let n = self.reader.read_buf(&mut limited).await?;
        if n == 0 {
            return Ok(None);
        }
        Ok(Some(if n >= SHARE_MIN {
            self.buf.split().freeze()
        } else {
            let chunk = Bytes::copy_from_slice(&self.buf);
            self.buf.clear();
            chunk
        }))
    }
}

/// Aborts a task when dropped.
pub(crate) struct AbortOnDrop<T>(pub(crate) JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long the incoming direction is read (and its frames dropped) after its GOAWAY, so
/// that the peer's stream ends the way the peer ends it rather than being cancelled.
const DRAIN: Duration = Duration::from_secs(10);

/// Pumps incoming frames into `sink` until GOAWAY, the end or an error.
///
/// After a GOAWAY (or once the sink is gone) a task of its own reads the rest of the
/// incoming stream and drops it, until it ends (for up to [`DRAIN`]): dropping the stream
/// unfinished would cancel its HTTP/2 stream (RST_STREAM), which a router reports to the
/// peer as a broken tunnel.
async fn pump_inbound<In, E, S, Snk>(mut inbound: S, mut sink: Snk, eof: EndOfStream)
where
    In: Frame,
    E: std::fmt::Display + Send + 'static,
    S: Stream<Item = Result<In, E>> + Send + Unpin + 'static,
    Snk: FrameSink,
{
    let broken = |msg: String| io::Error::new(io::ErrorKind::UnexpectedEof, msg);
    let drain = loop {
        match inbound.next().await {
            Some(Ok(frame)) => match frame.into_parts() {
                (payload, Some(FrameType::Data)) => {
                    if payload.is_empty() {
                        continue;
                    }
                    if let Err(e) = sink.write_chunk(payload).await {
                        // The consumer went away; nothing to tell it.
                        tracing::debug!("stream sink closed: {e}", e = crate::error_chain(&e));
                        break true;
                    }
                }
                (_, Some(FrameType::Goaway)) => {
                    if let Err(e) = sink.finish().await {
                        tracing::debug!("stream sink shutdown: {e}", e = crate::error_chain(&e));
                    }
                    break true;
                }
                (_, Some(FrameType::RstStream)) if eof == EndOfStream::GoawayRequired => {
                    sink.fail(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "transfer aborted by the peer (RST_STREAM frame)",
                    ));
                    break false;
                }
                (_, other) => tracing::trace!("ignoring frame {other:?}"),
            },
            Some(Err(e)) => {
                sink.fail(broken(format!("transfer broken: {e}")));
                break false;
            }
            None => {
                match eof {
                    EndOfStream::Lenient => {
                        if let Err(e) = sink.finish().await {
                            tracing::debug!(
                                "stream sink shutdown: {e}",
                                e = crate::error_chain(&e)
                            );
                        }
                    }
                    EndOfStream::GoawayRequired => sink.fail(broken(
                        "transfer broken: the stream ended without an end-of-stream (GOAWAY) frame"
                            .into(),
                    )),
                }
                break false;
            }
        }
    };
    if drain {
        tokio::spawn(async move {
            let rest = async { while inbound.next().await.is_some() {} };
            if tokio::time::timeout(DRAIN, rest).await.is_err() {
                tracing::debug!("stream still open {DRAIN:?} after its end-of-stream; dropped");
            }
        });
    }
}

/// Connects a stream of incoming frames to `sink` and `source`.
///
/// Incoming DATA payloads go to `sink`; the end of that direction is judged by `eof`. The
/// returned stream yields frames carrying what `source` produces, then a GOAWAY frame at its
/// end of file, or an error if `source` fails (the caller turns it into an error status or
/// an abort). After the GOAWAY the returned stream stays open until the incoming direction
/// has ended too, so that one side finishing never cuts the other short. `keep` is held
/// until the returned stream ends or is dropped (tie a resource's lifetime to the RPC).
pub fn splice_with<In, Out, E, S, Snk, Src, K>(
    inbound: S,
    sink: Snk,
    mut source: Src,
    eof: EndOfStream,
    keep: K,
) -> impl Stream<Item = io::Result<Out>> + Send
where
    In: Frame,
    Out: Frame,
    E: std::fmt::Display + Send + 'static,
    S: Stream<Item = Result<In, E>> + Send + Unpin + 'static,
    Snk: FrameSink,
    Src: FrameSource,
    K: Send + 'static,
{
    let inbound_task = tokio::spawn(pump_inbound(inbound, sink, eof));
    let mut guard = AbortOnDrop(inbound_task);
    generate(move |tx| async move {
        let _keep = keep;
        loop {
            match source.next_chunk().await {
                Ok(Some(chunk)) => {
                    if tx
                        .send(Ok(Out::from_bytes(chunk, FrameType::Data)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
        if tx
            .send(Ok(Out::new(Vec::new(), FrameType::Goaway)))
            .await
            .is_err()
        {
            return;
        }
        // Linger until the other direction is done (or the consumer drops us).
        let _ = (&mut guard.0).await;
    })
}

/// Connects a stream of incoming frames and an I/O object, as upstream does (lenient end).
///
/// Incoming DATA payloads are written to `io`; GOAWAY or the end of `inbound` shuts down
/// `io`'s write side (an error drops it without shutdown). The returned stream yields
/// frames carrying what `io` reads, then a GOAWAY frame at its end of file; a read error
/// ends it without GOAWAY. `keep` is held until the returned stream is dropped.
pub fn splice<In, Out, E, S, IO, K>(inbound: S, io: IO, keep: K) -> impl Stream<Item = Out> + Send
where
    In: Frame,
    Out: Frame,
    E: std::fmt::Display + Send + 'static,
    S: Stream<Item = Result<In, E>> + Send + Unpin + 'static,
    IO: AsyncRead + AsyncWrite + Send + 'static,
    K: Send + 'static,
{
    splice_io(inbound, io, keep).scan((), |_, item: io::Result<Out>| {
        futures::future::ready(match item {
            Ok(frame) => Some(frame),
            Err(e) => {
                tracing::debug!("stream source failed: {e}", e = crate::error_chain(&e));
                None
            }
        })
    })
}

/// As [`splice`], but a read error of `io` comes out as the stream's last item, for the
/// caller to report (a driver byte stream whose device went away ends the RPC with an
/// error status rather than as if the device had nothing more to say).
pub fn splice_io<In, Out, E, S, IO, K>(
    inbound: S,
    io: IO,
    keep: K,
) -> impl Stream<Item = io::Result<Out>> + Send
where
    In: Frame,
    Out: Frame,
    E: std::fmt::Display + Send + 'static,
    S: Stream<Item = Result<In, E>> + Send + Unpin + 'static,
    IO: AsyncRead + AsyncWrite + Send + 'static,
    K: Send + 'static,
{
    let (reader, writer) = tokio::io::split(io);
    splice_with(
        inbound,
        IoSink(writer),
        IoSource::new(reader),
        EndOfStream::Lenient,
        keep,
    )
}

/// A minimal generator: runs `f` with a bounded sender and yields what it sends.
fn generate<T, F, Fut>(f: F) -> impl Stream<Item = T> + Send
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<T>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let task = AbortOnDrop(tokio::spawn(f(tx)));
    ReceiverStream { rx, _task: task }
}

struct ReceiverStream<T> {
    rx: tokio::sync::mpsc::Receiver<T>,
    _task: AbortOnDrop<()>,
}

impl<T> Stream for ReceiverStream<T> {
    type Item = T;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::resource::pipe;
    use jumpstarter_proto::v1::{StreamRequest, StreamResponse};

    #[tokio::test]
    async fn data_then_goaway_round_trip() {
        let (a, mut b) = tokio::io::duplex(1024);
        let inbound = futures::stream::iter(vec![
            Ok::<_, String>(StreamRequest::new(b"hello ".to_vec(), FrameType::Data)),
            Ok(StreamRequest::new(vec![], FrameType::Ping)),
            Ok(StreamRequest::new(b"world".to_vec(), FrameType::Data)),
            Ok(StreamRequest::new(vec![], FrameType::Goaway)),
        ]);
        let out = splice::<_, StreamResponse, _, _, _, _>(inbound, a, ());
        let mut got = String::new();
        b.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "hello world");
        b.write_all(b"back").await.unwrap();
        b.shutdown().await.unwrap();
        drop(b);
        let frames: Vec<_> = out.collect().await;
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].payload, &b"back"[..]);
        assert_eq!(frames[1].frame_type, FrameType::Goaway as i32);
    }

    async fn strict_inbound(frames: Vec<Result<StreamRequest, String>>) -> io::Result<Vec<u8>> {
        let (sink_w, mut sink_r) = pipe();
        let (src_w, src_r) = pipe();
        src_w.finish_now();
        let out = splice_with::<_, StreamResponse, _, _, _, _, _>(
            futures::stream::iter(frames),
            sink_w,
            src_r,
            EndOfStream::GoawayRequired,
            (),
        );
        let reader = tokio::spawn(async move {
            let mut v = Vec::new();
            sink_r.read_to_end(&mut v).await.map(|_| v)
        });
        let _: Vec<_> = out.collect().await;
        reader.await.unwrap()
    }

    #[tokio::test]
    async fn strict_end_requires_goaway() {
        let data = |s: &[u8]| Ok(StreamRequest::new(s.to_vec(), FrameType::Data));
        let ok = strict_inbound(vec![
            data(b"ab"),
            data(b"cd"),
            Ok(StreamRequest::new(vec![], FrameType::Goaway)),
        ])
        .await
        .unwrap();
        assert_eq!(ok, b"abcd");

        let cut = strict_inbound(vec![data(b"ab")]).await.unwrap_err();
        assert!(cut.to_string().contains("GOAWAY"), "{cut}");

        let reset = strict_inbound(vec![
            data(b"ab"),
            Ok(StreamRequest::new(vec![], FrameType::RstStream)),
        ])
        .await
        .unwrap_err();
        assert!(reset.to_string().contains("RST_STREAM"), "{reset}");

        let err = strict_inbound(vec![data(b"ab"), Err("connection reset".into())])
            .await
            .unwrap_err();
        assert!(err.to_string().contains("connection reset"), "{err}");
    }

    /// Dropping the incoming stream right after its GOAWAY would cancel it (RST_STREAM),
    /// which a router passes on to the peer as a failure: it is read to its end instead.
    #[tokio::test]
    async fn inbound_is_read_to_its_end_after_goaway_not_dropped() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<StreamRequest, String>>(4);
        let (a, mut b) = tokio::io::duplex(1024);
        let out = splice::<_, StreamResponse, _, _, _, _>(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            a,
            (),
        );
        tx.send(Ok(StreamRequest::new(b"hi".to_vec(), FrameType::Data)))
            .await
            .unwrap();
        tx.send(Ok(StreamRequest::new(vec![], FrameType::Goaway)))
            .await
            .unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hi");
        b.shutdown().await.unwrap();
        drop(b);
        // Both directions are done: the outgoing stream ends...
        let frames: Vec<_> = out.collect().await;
        assert_eq!(frames.last().unwrap().frame_type, FrameType::Goaway as i32);
        // ...while the incoming one is still read, and dropped only at its own end.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !tx.is_closed(),
            "the incoming stream was dropped unfinished"
        );
        tx.send(Ok(StreamRequest::new(b"late".to_vec(), FrameType::Data)))
            .await
            .unwrap();
        drop(tx);
    }

    #[tokio::test]
    async fn source_error_is_reported_not_goaway() {
        let (sink_w, _sink_r) = pipe();
        let (src_w, src_r) = pipe();
        src_w.fail(io::Error::other("disk on fire"));
        let inbound = futures::stream::iter(Vec::<Result<StreamRequest, String>>::new());
        let out: Vec<io::Result<StreamResponse>> =
            splice_with(inbound, sink_w, src_r, EndOfStream::GoawayRequired, ())
                .collect()
                .await;
        assert_eq!(out.len(), 1);
        let e = out.into_iter().next().unwrap().unwrap_err();
        assert!(e.to_string().contains("disk on fire"), "{e}");
    }

    #[tokio::test]
    async fn outbound_lingers_until_inbound_ends() {
        // The source ends at once; the sink still receives everything sent afterwards.
        let (sink_w, mut sink_r) = pipe();
        let (src_w, src_r) = pipe();
        src_w.finish_now();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<StreamRequest, String>>(1);
        let out = splice_with::<_, StreamResponse, _, _, _, _, _>(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            sink_w,
            src_r,
            EndOfStream::GoawayRequired,
            (),
        );
        let collector = tokio::spawn(async move { out.collect::<Vec<_>>().await });
        tx.send(Ok(StreamRequest::new(b"late".to_vec(), FrameType::Data)))
            .await
            .unwrap();
        tx.send(Ok(StreamRequest::new(vec![], FrameType::Goaway)))
            .await
            .unwrap();
        let mut got = Vec::new();
        sink_r.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"late");
        let frames = collector.await.unwrap();
        assert_eq!(frames.len(), 1);
    }

    /// A reader handing out the given pieces, one per read (as a socket might).
    struct Pieces(std::collections::VecDeque<Vec<u8>>);

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if let Some(mut p) = self.0.pop_front() {
                let n = p.len().min(buf.remaining());
                buf.put_slice(&p[..n]);
                if n < p.len() {
                    self.0.push_front(p.split_off(n));
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn io_source_chunks_hold_what_was_read_in_order() {
        let sizes = [
            5,
            CHUNK + 10,
            40_000,
            3,
            SHARE_MIN,
            CHUNK,
            100,
            200_000,
            70_000,
        ];
        let pieces: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
            .collect();
        let want: Vec<u8> = pieces.concat();
        let mut source = IoSource::new(Pieces(pieces.into()));
        let mut got = Vec::new();
        let mut small = Vec::new();
        while let Some(chunk) = source.next_chunk().await.unwrap() {
            assert!(
                !chunk.is_empty() && chunk.len() <= CHUNK,
                "chunk of {}",
                chunk.len()
            );
            if chunk.len() < SHARE_MIN {
                small.push(chunk.clone());
            }
            got.extend_from_slice(&chunk);
        }
        assert!(got == want, "bytes in order, none lost or repeated");
        // Earlier chunks stay intact while later reads reuse the buffer.
        assert_eq!(&small[0][..], &want[..5]);
    }
}
