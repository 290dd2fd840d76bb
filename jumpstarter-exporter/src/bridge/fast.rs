//! The fast path for unary calls to the Python child.
//!
//! Besides upstream's gRPC server, the child (`bootstrap.py`, `serve_fast`) serves a second
//! Unix socket in the same private directory, where each connection carries one call at a
//! time in a minimal framing:
//!
//! - request: a `u32` big-endian length, then a `DriverCallRequest` (protobuf);
//! - answer: a `u32` big-endian length, then a kind byte and its body: `0` a
//!   `DriverCallResponse`; `1` an error, a `u32` big-endian gRPC status code then the
//!   details (UTF-8); `2` the response was larger than [`MAX_MESSAGE`], a `u64` big-endian
//!   its size.
//!
//! The child runs upstream's own `Session.DriverCall` on its event loop for it, so that the
//! answers and errors are those its gRPC server gives, without grpcio's three thread
//! hand-offs per call and without HTTP/2 on our side. Frames are bounded both ways by
//! [`MAX_MESSAGE`] (gRPC's default limit on a received message). Dropping a call closes its
//! connection, and the child cancels the call, as for a cancelled gRPC call. A connection
//! the child closed, or sent anything on past its answer, is dropped rather than reused, so
//! that no call reads bytes that are not the answer to its own request.

use std::{os::fd::AsFd, path::PathBuf, sync::Arc};

use jumpstarter_proto::v1::{DriverCallRequest, DriverCallResponse};
use prost::Message;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
    sync::Semaphore,
};

/// The largest request or response: gRPC's default limit on a received message, which is
/// what the gRPC path to the child enforces (tonic on our side, grpcio on the child's).
pub(crate) const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// The largest answer frame: a kind byte and a message, or an error's code and details.
const MAX_FRAME: usize = MAX_MESSAGE + 1;

/// At most this many connections (so calls in flight) on the fast path; a call beyond them
/// takes the gRPC path instead of waiting.
pub(crate) const MAX_CONNECTIONS: usize = 8;

/// `JMP_BRIDGE_FAST=0` turns the fast path off: every call goes through gRPC (for A/B
/// measurements and as a way out).
pub(crate) const FAST_ENV: &str = "JMP_BRIDGE_FAST";

/// Whether the fast path is on (it is unless [`FAST_ENV`] is `0`).
pub(crate) fn enabled() -> bool {
    std::env::var(FAST_ENV).map_or(true, |v| v.trim() != "0")
}

/// Why a call on the fast path got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FastError {
    /// Connecting to the child's socket failed.
    #[error("cannot connect to its fast call socket")]
    Connect(#[source] std::io::Error),
    /// Reading or writing failed.
    #[error("its fast call connection failed")]
    Io(#[source] std::io::Error),
    /// The child closed the connection before answering (it died, or refused the request).
    #[error("its host process closed the connection before answering")]
    Closed,
    /// The child answered something that is not a frame of the protocol.
    #[error("its host process answered a malformed frame: {0}")]
    Malformed(String),
}

/// The child's answer to one call: its response, or the status its gRPC server would give.
pub(crate) type Answer = Result<DriverCallResponse, tonic::Status>;

/// A bounded pool of connections to one child's fast call socket.
pub(crate) struct FastPool {
    path: PathBuf,
    idle: std::sync::Mutex<Vec<UnixStream>>,
    permits: Arc<Semaphore>,
}

impl FastPool {
    pub(crate) fn new(path: PathBuf) -> Self {
        FastPool {
            path,
            idle: std::sync::Mutex::new(Vec::with_capacity(MAX_CONNECTIONS)),
            permits: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        }
    }

    /// Calls the child with `request`, or `None` when the fast path cannot take it now (every
    /// connection busy, or a request over [`MAX_MESSAGE`]): the caller uses gRPC then, which
    /// gives such a request the same answer as before.
    pub(crate) async fn call(
        &self,
        request: &DriverCallRequest,
    ) -> Option<Result<Answer, FastError>> {
        let len = request.encoded_len();
        if len > MAX_MESSAGE {
            return None;
        }
        let _permit = self.permits.clone().try_acquire_owned().ok()?;
        let mut frame = Vec::with_capacity(4 + len);
        frame.extend_from_slice(&(len as u32).to_be_bytes());
        request.encode(&mut frame).ok()?;
        let reused = self.take_idle();
        let result = match reused {
            Some(mut stream) => match exchange(&mut stream, &frame).await {
                // An idle connection the child has closed: the request never left, so it is
                // safe to send it again on a fresh one.
                Err(Exchange::Send(_)) => self.fresh(&frame).await,
                other => other.map(|a| (a, stream)),
            },
            None => self.fresh(&frame).await,
        };
        Some(match result {
            Ok((answer, stream)) => {
                // Dropped with the future if the call is cancelled: only a connection that
                // finished its exchange goes back, and only with nothing after its answer.
                if reusable(&stream) {
                    self.idle
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(stream);
                }
                Ok(answer)
            }
            Err(e) => Err(e.into()),
        })
    }

    /// An idle connection still fit for a call: those the child closed or sent bytes on
    /// while they were idle are dropped.
    fn take_idle(&self) -> Option<UnixStream> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(stream) = idle.pop() {
            if reusable(&stream) {
                return Some(stream);
            }
        }
        None
    }

    async fn fresh(&self, frame: &[u8]) -> Result<(Answer, UnixStream), Exchange> {
        let mut stream = UnixStream::connect(&self.path)
            .await
            .map_err(|e| Exchange::Failed(FastError::Connect(e)))?;
        let answer = exchange(&mut stream, frame).await?;
        Ok((answer, stream))
    }
}

/// Whether a connection can carry another call: the child has not closed it and sent
/// nothing after its last answer. Bytes there are no answer to the next request (one call at
/// a time): read as one, they would give a call another call's answer. This asks the kernel
/// with a non-blocking read, not tokio's cached readiness, which may not have seen bytes
/// that just arrived; the byte it may take goes with the connection, which is dropped.
fn reusable(stream: &UnixStream) -> bool {
    let mut byte = [0u8; 1];
    match rustix::io::read(stream.as_fd(), &mut byte[..]) {
        Err(rustix::io::Errno::AGAIN) => true,
        Ok(0) => false,
        Ok(_) => {
            tracing::warn!(
                "the host process sent bytes after its answer on a fast call connection; \
                 dropping the connection"
            );
            false
        }
        Err(e) => {
            tracing::debug!(
                "a fast call connection is not reused: {e}",
                e = jumpstarter_core::error_chain(&e)
            );
            false
        }
    }
}

/// How an exchange failed: before the request was sent (safe to retry) or after.
enum Exchange {
    Send(std::io::Error),
    Failed(FastError),
}

impl From<Exchange> for FastError {
    fn from(e: Exchange) -> Self {
        match e {
            Exchange::Send(e) => FastError::Io(e),
            Exchange::Failed(e) => e,
        }
    }
}

/// Sends one request frame and reads its answer.
async fn exchange<S>(stream: &mut S, frame: &[u8]) -> Result<Answer, Exchange>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    stream.write_all(frame).await.map_err(Exchange::Send)?;
    read_answer(stream).await.map_err(Exchange::Failed)
}

/// Reads and decodes one answer frame, refusing anything outside the protocol.
pub(crate) async fn read_answer<S>(stream: &mut S) -> Result<Answer, FastError>
where
    S: tokio::io::AsyncRead + Unpin,
{
    let mut head = [0u8; 4];
    match stream.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FastError::Closed),
        Err(e) => return Err(FastError::Io(e)),
    }
    let len = u32::from_be_bytes(head) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(FastError::Malformed(format!(
            "a frame of {len} bytes (1 to {MAX_FRAME} expected)"
        )));
    }
    let mut body = vec![0u8; len];
    match stream.read_exact(&mut body).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FastError::Closed),
        Err(e) => return Err(FastError::Io(e)),
    }
    decode_answer(&body)
}

/// Decodes an answer frame's body (its kind byte and what follows).
pub(crate) fn decode_answer(body: &[u8]) -> Result<Answer, FastError> {
    let (kind, rest) = body
        .split_first()
        .ok_or_else(|| FastError::Malformed("an empty frame".into()))?;
    match kind {
        0 => DriverCallResponse::decode(rest).map(Ok).map_err(|e| {
            FastError::Malformed(format!(
                "an unreadable response: {e}",
                e = jumpstarter_core::error_chain(&e)
            ))
        }),
        1 => {
            let (code, details) = rest
                .split_first_chunk::<4>()
                .ok_or_else(|| FastError::Malformed("an error without its code".into()))?;
            let code = u32::from_be_bytes(*code);
            let code = i32::try_from(code)
                .ok()
                .filter(|c| (0..=16).contains(c))
                .ok_or_else(|| FastError::Malformed(format!("an unknown status code {code}")))?;
            Ok(Err(tonic::Status::new(
                tonic::Code::from_i32(code),
                String::from_utf8_lossy(details).into_owned(),
            )))
        }
        2 => {
            let size = rest
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| FastError::Malformed("a size that is not 8 bytes".into()))?;
            // What tonic answers for a response over its limit on the gRPC path.
            Ok(Err(tonic::Status::out_of_range(format!(
                "Error, decoded message length too large: found {size} bytes, the limit is: \
                 {MAX_MESSAGE} bytes"
            ))))
        }
        other => Err(FastError::Malformed(format!(
            "an unknown frame kind {other}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::{Value, value::Kind};

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        f
    }

    async fn answer_of(bytes: Vec<u8>) -> Result<Answer, FastError> {
        let (mut a, mut b) = tokio::io::duplex(64 * 1024);
        let writer = tokio::spawn(async move {
            let _ = b.write_all(&bytes).await;
        });
        let r = read_answer(&mut a).await;
        writer.abort();
        r
    }

    #[tokio::test]
    async fn answers_decode() {
        let resp = DriverCallResponse {
            uuid: "u".into(),
            result: Some(Value {
                kind: Some(Kind::StringValue("lamp on".into())),
            }),
        };
        let mut body = vec![0];
        resp.encode(&mut body).unwrap();
        assert_eq!(answer_of(frame(&body)).await.unwrap().unwrap(), resp);

        let mut body = vec![1];
        body.extend_from_slice(&3u32.to_be_bytes());
        body.extend_from_slice("the bulb is broken é".as_bytes());
        let status = answer_of(frame(&body)).await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "the bulb is broken é");

        let mut body = vec![2];
        body.extend_from_slice(&5_000_000u64.to_be_bytes());
        let status = answer_of(frame(&body)).await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::OutOfRange);
        assert_eq!(
            status.message(),
            "Error, decoded message length too large: found 5000000 bytes, the limit is: \
             4194304 bytes"
        );
    }

    #[tokio::test]
    async fn malformed_frames_are_refused_with_a_clear_error() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            // Over the bound: refused from its header, nothing read or allocated.
            (
                ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec(),
                "a frame of 4194306 bytes",
            ),
            (
                u32::MAX.to_be_bytes().to_vec(),
                "a frame of 4294967295 bytes",
            ),
            (frame(&[]), "a frame of 0 bytes"),
            (frame(&[7, 1, 2]), "unknown frame kind 7"),
            (frame(&[0, 0xff, 0xff, 0xff]), "unreadable response"),
            (frame(&[1, 0, 0]), "an error without its code"),
            (frame(&[1, 0, 0, 0, 99, b'x']), "unknown status code 99"),
            (frame(&[2, 1, 2]), "not 8 bytes"),
        ];
        for (bytes, want) in cases {
            let err = answer_of(bytes).await.unwrap_err();
            assert!(matches!(err, FastError::Malformed(_)), "{err:?}");
            assert!(err.to_string().contains(want), "{err} / {want}");
        }
        // A frame cut short, or nothing at all: the child closed the connection.
        let mut cut = frame(&[0, 1, 2, 3]);
        cut.truncate(6);
        assert!(matches!(answer_of(cut).await, Err(FastError::Closed)));
        assert!(matches!(answer_of(vec![]).await, Err(FastError::Closed)));
    }

    /// Bytes the child sends on a connection after it went back to the pool are not taken
    /// for the next call's answer: the connection is dropped and the call takes a fresh one.
    #[tokio::test]
    async fn bytes_that_arrive_on_an_idle_connection_are_not_taken_for_an_answer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fast.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let answer = |text: &str| {
            let resp = DriverCallResponse {
                uuid: "u".into(),
                result: Some(Value {
                    kind: Some(Kind::StringValue(text.into())),
                }),
            };
            frame(&[vec![0], resp.encode_to_vec()].concat())
        };
        let (first, stale, second) = (answer("first"), answer("stale"), answer("second"));
        let (idle_tx, idle_rx) = tokio::sync::oneshot::channel::<()>();
        let (stale_tx, stale_rx) = tokio::sync::oneshot::channel::<()>();
        let child = tokio::spawn(async move {
            let mut signals = Some((idle_rx, stale_tx));
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let (first, stale, second) = (first.clone(), stale.clone(), second.clone());
                let mut signals = signals.take();
                tokio::spawn(async move {
                    loop {
                        let mut head = [0u8; 4];
                        if s.read_exact(&mut head).await.is_err() {
                            return;
                        }
                        let mut body = vec![0u8; u32::from_be_bytes(head) as usize];
                        if s.read_exact(&mut body).await.is_err() {
                            return;
                        }
                        let Some((idle_rx, stale_tx)) = signals.take() else {
                            let _ = s.write_all(&second).await;
                            continue;
                        };
                        let _ = s.write_all(&first).await;
                        let _ = idle_rx.await;
                        let _ = s.write_all(&stale).await;
                        let _ = stale_tx.send(());
                    }
                });
            }
        });
        let pool = FastPool::new(path);
        let request = DriverCallRequest {
            uuid: "u".into(),
            method: "m".into(),
            args: vec![],
        };
        let text = |got: Option<Result<Answer, FastError>>| match got {
            Some(Ok(Ok(DriverCallResponse {
                result:
                    Some(Value {
                        kind: Some(Kind::StringValue(s)),
                    }),
                ..
            }))) => s,
            other => panic!("{other:?}"),
        };
        assert_eq!(text(pool.call(&request).await), "first");
        idle_tx.send(()).unwrap();
        stale_rx.await.unwrap();
        assert_eq!(text(pool.call(&request).await), "second");
        assert_eq!(text(pool.call(&request).await), "second");
        child.abort();
    }

    #[tokio::test]
    async fn a_busy_pool_and_a_large_request_leave_the_call_to_grpc() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fast.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let pool = Arc::new(FastPool::new(path));
        // Over the limit: not taken.
        let big = DriverCallRequest {
            uuid: "u".into(),
            method: "m".into(),
            args: vec![Value {
                kind: Some(Kind::StringValue("x".repeat(MAX_MESSAGE))),
            }],
        };
        assert!(pool.call(&big).await.is_none());
        // MAX_CONNECTIONS calls in flight (the server never answers): the next is not taken.
        let small = DriverCallRequest {
            uuid: "u".into(),
            method: "m".into(),
            args: vec![],
        };
        let mut calls = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            let (p, r) = (pool.clone(), small.clone());
            calls.push(tokio::spawn(async move { p.call(&r).await.is_some() }));
        }
        let mut accepted = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            accepted.push(listener.accept().await.unwrap().0);
        }
        assert!(pool.call(&small).await.is_none());
        // The server goes away: each call in flight fails, none panics, and the permits
        // come back.
        drop(accepted);
        for c in calls {
            assert!(c.await.unwrap());
        }
        assert_eq!(pool.permits.available_permits(), MAX_CONNECTIONS);
    }
}
