//! Fuzz targets of the Python bridge's frames: the answers of the child's fast call socket
//! (`fast.rs`: a `u32` big-endian length, a kind byte and its body), read by the exporter
//! from a process that may die, misbehave or be replaced. They run under `cargo test` (and
//! so in `cargo xtask ci`) with proptest, asserting no panic, that a frame reads the same
//! however the stream is cut, that what is read is what was sent, and that a pool whose
//! child sent garbage still makes the next call. [`fuzz_config`] is the knob of the case
//! count: `JUMPSTARTER_FUZZ_CASES` (what `cargo xtask fuzz --cases N` sets), else
//! `PROPTEST_CASES`, else 512 (`jumpstarter-core/src/fuzz_support.rs`).

use std::{
    collections::VecDeque,
    pin::Pin,
    task::{Context, Poll},
};

use jumpstarter_core::value::from_json;
use jumpstarter_proto::v1::{DriverCallRequest, DriverCallResponse};
use proptest::prelude::*;
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};

use super::fast::{Answer, FastError, FastPool, decode_answer, read_answer};

#[path = "../../../jumpstarter-core/src/fuzz_support.rs"]
mod fuzz_support;
use fuzz_support::{edits, fuzz_config, mutate_bytes};

/// Bytes shown as an escaped byte string in a failure's report.
#[derive(Clone, PartialEq)]
struct Shown(Vec<u8>);

impl std::fmt::Debug for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "b\"{}\"", self.0.escape_ascii())
    }
}

/// A reader that hands out its bytes in the given pieces (a pipe's reads).
struct Pieces(VecDeque<Vec<u8>>);

impl Pieces {
    /// `bytes` cut at `cuts` (indexes into it).
    fn new(bytes: &[u8], cuts: &[prop::sample::Index]) -> Self {
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        at.push(0);
        at.push(bytes.len());
        at.sort_unstable();
        Pieces(
            at.windows(2)
                .filter(|w| w[0] < w[1])
                .map(|w| bytes[w[0]..w[1]].to_vec())
                .collect(),
        )
    }

    fn rest(&self) -> Vec<u8> {
        self.0.iter().flatten().copied().collect()
    }
}

impl AsyncRead for Pieces {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(mut piece) = self.0.pop_front() {
            let n = piece.len().min(buf.remaining());
            buf.put_slice(&piece[..n]);
            if n < piece.len() {
                self.0.push_front(piece.split_off(n));
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// What the child sends: a response, an error status, or a response's size over the limit.
#[derive(Debug, Clone)]
enum Sent {
    Response(DriverCallResponse),
    Error(u32, String),
    TooLarge(u64),
}

impl Sent {
    /// Its frame, as `bootstrap.py`'s `serve_fast` writes it.
    fn frame(&self) -> Vec<u8> {
        let body = match self {
            Sent::Response(r) => [vec![0], r.encode_to_vec()].concat(),
            Sent::Error(code, details) => {
                [&[1][..], &code.to_be_bytes(), details.as_bytes()].concat()
            }
            Sent::TooLarge(size) => [&[2][..], &size.to_be_bytes()].concat(),
        };
        [(body.len() as u32).to_be_bytes().to_vec(), body].concat()
    }
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i32>().prop_map(|n| serde_json::json!(n)),
        any::<String>().prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn sent() -> impl Strategy<Value = Sent> {
    prop_oneof![
        (any::<String>(), prop::option::of(json_value())).prop_map(|(uuid, v)| {
            Sent::Response(DriverCallResponse {
                uuid,
                result: v.map(from_json),
            })
        }),
        (0u32..=16, any::<String>()).prop_map(|(c, d)| Sent::Error(c, d)),
        any::<u64>().prop_map(Sent::TooLarge),
    ]
}

/// A comparable summary of a read: a response's encoding, a status's code and message, or
/// the error (an I/O error by kind).
fn summary(r: &Result<Answer, FastError>) -> String {
    match r {
        Ok(Ok(resp)) => format!("response {:?}", resp.encode_to_vec()),
        Ok(Err(s)) => format!("status {:?} {:?}", s.code(), s.message()),
        Err(FastError::Io(e)) => format!("io {:?}", e.kind()),
        Err(e) => format!("error {e}"),
    }
}

/// The frame that gives `answer` back.
fn frame_of(answer: &Answer) -> Vec<u8> {
    match answer {
        Ok(resp) => Sent::Response(resp.clone()).frame(),
        Err(s) => Sent::Error(s.code() as u32, s.message().to_string()).frame(),
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(f)
}

/// A fake child's fast call socket in a fresh directory: each connection reads one request
/// (which must decode to `want`), answers the next of `answers` and is closed.
async fn fake_child(
    answers: Vec<Vec<u8>>,
    want: DriverCallRequest,
) -> (
    tempfile::TempDir,
    FastPool,
    tokio::task::JoinHandle<Result<(), String>>,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("fast.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    let child = tokio::spawn(async move {
        for answer in answers {
            let (mut s, _) = listener.accept().await.map_err(|e| e.to_string())?;
            let mut head = [0u8; 4];
            s.read_exact(&mut head).await.map_err(|e| e.to_string())?;
            let mut body = vec![0u8; u32::from_be_bytes(head) as usize];
            s.read_exact(&mut body).await.map_err(|e| e.to_string())?;
            let got = DriverCallRequest::decode(&body[..]).map_err(|e| e.to_string())?;
            if got != want {
                return Err(format!("the request arrived as {got:?}"));
            }
            // Written and closed in one poll: the exporter reads the answer, then EOF.
            let _ = s.write_all(&answer).await;
        }
        Ok(())
    });
    (dir, FastPool::new(path), child)
}

proptest! {
    #![proptest_config(fuzz_config())]

    /// Every answer the child can send (responses with any values, statuses with any code
    /// and details, sizes) reads back as itself, however the pipe cuts it, and the reader
    /// takes exactly its frame.
    #[test]
    fn fast_answers_round_trip_in_any_pieces(
        sent in sent(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        after in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let frame = sent.frame();
        let mut pieces = Pieces::new(&[frame.clone(), after.clone()].concat(), &cuts);
        let got = block_on(read_answer(&mut pieces));
        match (&sent, &got) {
            (Sent::Response(r), Ok(Ok(g))) => prop_assert_eq!(r.encode_to_vec(), g.encode_to_vec()),
            (Sent::Error(c, d), Ok(Err(s))) => {
                prop_assert_eq!(s.code() as u32, *c);
                prop_assert_eq!(s.message(), d.as_str());
            }
            (Sent::TooLarge(n), Ok(Err(s))) => {
                prop_assert_eq!(s.code(), tonic::Code::OutOfRange);
                prop_assert!(s.message().contains(&format!("found {n} bytes")), "{}", s.message());
            }
            _ => prop_assert!(false, "{:?} read as {}", sent, summary(&got)),
        }
        prop_assert_eq!(pieces.rest(), after, "the reader took bytes past its frame");
    }

    /// Any bytes from the child (random, or mutated frames), cut anywhere: no panic, the
    /// same result however they are cut, and what reads as an answer is a fixed point of
    /// encoding and reading.
    #[test]
    fn fast_frames_from_the_child_never_panic(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64).prop_map(Shown),
            (sent(), edits()).prop_map(|(s, e)| Shown(mutate_bytes(&s.frame(), &e))),
        ],
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let whole = block_on(read_answer(&mut Pieces::new(&bytes.0, &[])));
        let cut = block_on(read_answer(&mut Pieces::new(&bytes.0, &cuts)));
        prop_assert_eq!(summary(&whole), summary(&cut));
        if let Some(body) = bytes.0.get(4..) {
            // The body decoder alone never panics either.
            let _ = decode_answer(body);
        }
        if let Ok(answer) = &whole {
            let again = block_on(read_answer(&mut Pieces::new(&frame_of(answer), &[])));
            prop_assert_eq!(summary(&again), summary(&whole));
        }
        if let Err(FastError::Malformed(m)) = &whole {
            prop_assert!(!m.is_empty());
        }
    }

    /// A pool whose child answers a call with any bytes and closes the connection: that call
    /// gets what the reader makes of the bytes (no panic), the request arrived intact, and
    /// the next call, on a fresh connection, gets its answer.
    #[test]
    fn fast_pools_survive_children_that_answer_garbage(
        garbage in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64).prop_map(Shown),
            (sent(), edits()).prop_map(|(s, e)| Shown(mutate_bytes(&s.frame(), &e))),
            (sent(), prop::collection::vec(any::<u8>(), 1..16))
                .prop_map(|(s, extra)| Shown([s.frame(), extra].concat())),
        ],
        uuid in "[a-f0-9-]{1,36}",
        method in "[a-z_]{1,12}",
    ) {
        let request = DriverCallRequest { uuid: uuid.clone(), method, args: vec![] };
        let right = DriverCallResponse { uuid, result: Some(from_json(serde_json::json!("ok"))) };
        let answers = vec![garbage.0.clone(), Sent::Response(right.clone()).frame()];
        block_on(async {
            let (_dir, pool, child) = fake_child(answers, request.clone()).await;
            let first = pool.call(&request).await.expect("the fast path takes it");
            let alone = read_answer(&mut Pieces::new(&garbage.0, &[])).await;
            prop_assert_eq!(summary(&first), summary(&alone));
            let second = pool.call(&request).await.expect("the fast path takes it");
            prop_assert_eq!(summary(&second), summary(&Ok(Ok(right))));
            match child.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(TestCaseError::fail(e)),
                Err(e) => Err(TestCaseError::fail(e.to_string())),
            }
        })?;
    }
}

/// A child that sends bytes after an answer and keeps the connection open: the pooled
/// connection must not hand those bytes to the next call as its answer. The child answers
/// its first request (on any connection) with a frame and a stale one, and every later
/// request with the frame for it, so the next call gets its own answer whether the pool
/// opens a fresh connection or not.
#[test]
fn a_connection_with_bytes_after_its_answer_is_not_reused() {
    block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("fast.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let answer = |text: &str| {
            Sent::Response(DriverCallResponse {
                uuid: "u".into(),
                result: Some(from_json(serde_json::json!(text))),
            })
            .frame()
        };
        let (first, stale, second) = (answer("first"), answer("stale"), answer("second"));
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let child = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let (first, stale, second) = (first.clone(), stale.clone(), second.clone());
                let calls = calls.clone();
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
                        let call = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let out = if call == 0 {
                            [first.clone(), stale.clone()].concat()
                        } else {
                            second.clone()
                        };
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
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
        let _ = pool.call(&request).await;
        let got = pool.call(&request).await.expect("taken");
        child.abort();
        let want: Result<Answer, FastError> = Ok(Ok(DriverCallResponse {
            uuid: "u".into(),
            result: Some(from_json(serde_json::json!("second"))),
        }));
        assert_eq!(summary(&got), summary(&want));
    });
}
