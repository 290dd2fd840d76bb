//! Byte streams over `RouterService.Stream` frames.
//!
//! Both sides of a stream send `{payload, frame_type}` messages: `DATA` carries bytes,
//! `GOAWAY` marks the end of one direction, `PING` and `RST_STREAM` are ignored, and the end
//! of the gRPC stream also ends the direction. [`splice`] connects such a frame stream to an
//! `AsyncRead + AsyncWrite`, with backpressure in both directions and at most one chunk in
//! flight per direction besides the pipe buffer.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use futures::{Stream, StreamExt};
use jumpstarter_proto::v1::{FrameType, StreamRequest, StreamResponse};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::task::JoinHandle;

/// Largest payload we put in one DATA frame (the upstream tools use the same bound).
pub const CHUNK: usize = 64 * 1024;

/// A router frame: implemented by both `StreamRequest` and `StreamResponse`.
pub trait Frame: Send + 'static {
    /// Builds a frame.
    fn new(payload: Vec<u8>, frame_type: FrameType) -> Self;
    /// Splits a frame into payload and type (unknown types are reported as `None`).
    fn into_parts(self) -> (Vec<u8>, Option<FrameType>);
}

macro_rules! impl_frame {
    ($t:ty) => {
        impl Frame for $t {
            fn new(payload: Vec<u8>, frame_type: FrameType) -> Self {
                Self {
                    payload,
                    frame_type: frame_type as i32,
                }
            }
            fn into_parts(self) -> (Vec<u8>, Option<FrameType>) {
                (self.payload, FrameType::try_from(self.frame_type).ok())
            }
        }
    };
}
impl_frame!(StreamRequest);
impl_frame!(StreamResponse);

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Connects a stream of incoming frames and an I/O object.
///
/// Incoming DATA payloads are written to `io`; GOAWAY or the end of `inbound` shuts down
/// `io`'s write side. The returned stream yields frames carrying what `io` reads, then a
/// GOAWAY frame when `io` reaches end of file. `keep` is held until the returned stream is
/// dropped (use it to tie a resource's lifetime to the RPC).
pub fn splice<In, Out, E, S, IO, K>(inbound: S, io: IO, keep: K) -> impl Stream<Item = Out> + Send
where
    In: Frame,
    Out: Frame,
    E: std::fmt::Display + Send + 'static,
    S: Stream<Item = Result<In, E>> + Send + Unpin + 'static,
    IO: AsyncRead + AsyncWrite + Send + 'static,
    K: Send + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(io);
    let inbound_task = tokio::spawn(async move {
        let mut inbound = inbound;
        while let Some(item) = inbound.next().await {
            match item {
                Ok(frame) => match frame.into_parts() {
                    (payload, Some(FrameType::Data)) => {
                        if payload.is_empty() {
                            continue;
                        }
                        if let Err(e) = writer.write_all(&payload).await {
                            tracing::debug!("stream sink closed: {e}");
                            return;
                        }
                    }
                    (_, Some(FrameType::Goaway)) => break,
                    (_, other) => tracing::trace!("ignoring frame {other:?}"),
                },
                Err(e) => {
                    tracing::debug!("inbound frames ended with an error: {e}");
                    // Dropping the writer without shutdown makes the reader see EOF too;
                    // callers that must tell a broken transfer from a complete one check
                    // the GOAWAY they received.
                    return;
                }
            }
        }
        let _ = writer.shutdown().await;
    });
    let guard = AbortOnDrop(inbound_task);

    async_stream(move |tx| async move {
        let _guard = guard;
        let _keep = keep;
        let mut buf = vec![0u8; CHUNK];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => {
                    if tx
                        .send(Out::new(buf[..n].to_vec(), FrameType::Data))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!("stream source failed: {e}");
                    return;
                }
            }
        }
        let _ = tx.send(Out::new(Vec::new(), FrameType::Goaway)).await;
    })
}

/// A minimal generator: runs `f` with a bounded sender and yields what it sends.
fn async_stream<T, F, Fut>(f: F) -> impl Stream<Item = T> + Send
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<T>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let task = AbortOnDrop(tokio::spawn(f(tx)));
    ReceiverStream { rx, _task: task }
}

struct ReceiverStream<T> {
    rx: tokio::sync::mpsc::Receiver<T>,
    _task: AbortOnDrop,
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
        assert_eq!(frames[0].payload, b"back");
        assert_eq!(frames[1].frame_type, FrameType::Goaway as i32);
    }
}
