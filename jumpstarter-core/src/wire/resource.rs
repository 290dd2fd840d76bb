//! Resource streams: bytes a client sends to (or receives from) a driver, passed by handle.
//!
//! The client opens `RouterService.Stream` on the session with a `resource` request; the
//! exporter registers the driver's end of two in-memory [`pipe`]s (one per direction) under a
//! fresh uuid and answers with the handle in the initial metadata. The client then passes
//! the handle as an ordinary driver-call argument, and the driver opens it with
//! [`crate::CallContext::resource`].
//!
//! Bytes move chunk by chunk with backpressure: each pipe holds at most [`PIPE_CHUNKS`]
//! chunks, so memory stays flat whatever the size. A pipe's writer either finishes (the
//! reader sees end of file) or fails, and a writer dropped without finishing is a failure
//! too: a transfer cut midway is an error for the reader, never a short file.
//!
//! Content encodings (gzip, xz, bz2, zstd) are negotiated as upstream does: the client names
//! the encoding of its bytes in the request (`x_jmp_content_encoding`); the exporter accepts
//! it in its initial metadata (`x_jmp_accept_encoding`) unless `JMP_DISABLE_COMPRESSION=1`,
//! and then decodes what the client sends and encodes what the driver sends back. When the
//! exporter does not accept it, the client does that work locally (see [`decoder`] and
//! [`encoder`]).

use std::{
    collections::HashMap,
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll, ready},
};

#[cfg(feature = "compression")]
use async_compression::tokio::{bufread, write};
use bytes::{Buf, Bytes, BytesMut};
use futures::Stream;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::PollSender;
use uuid::Uuid;

use crate::{
    DriverError,
    wire::frames::{FrameSink, FrameSource},
};

/// How many chunks a pipe holds before its writer waits (backpressure).
pub const PIPE_CHUNKS: usize = 4;

/// The environment variable that, set to `1`, makes the exporter refuse content encodings.
pub const DISABLE_COMPRESSION_ENV: &str = "JMP_DISABLE_COMPRESSION";

/// A content encoding negotiated for a resource stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContentEncoding {
    /// gzip
    Gzip,
    /// xz
    Xz,
    /// bzip2
    Bz2,
    /// zstd
    Zstd,
}

impl ContentEncoding {
    /// Every encoding, in upstream's order.
    pub const ALL: [ContentEncoding; 4] = [
        ContentEncoding::Gzip,
        ContentEncoding::Xz,
        ContentEncoding::Bz2,
        ContentEncoding::Zstd,
    ];

    /// The wire name (`gzip`, `xz`, `bz2`, `zstd`).
    pub fn as_str(self) -> &'static str {
        match self {
            ContentEncoding::Gzip => "gzip",
            ContentEncoding::Xz => "xz",
            ContentEncoding::Bz2 => "bz2",
            ContentEncoding::Zstd => "zstd",
        }
    }

    /// Parses a wire name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == name)
    }

    /// Recognises an encoding from the first bytes of a file (magic numbers).
    pub fn detect(head: &[u8]) -> Option<Self> {
        const MAGIC: [(&[u8], ContentEncoding); 4] = [
            (b"\x1f\x8b\x08", ContentEncoding::Gzip),
            (b"\xfd7zXZ\x00", ContentEncoding::Xz),
            (b"BZh", ContentEncoding::Bz2),
            (b"\x28\xb5\x2f\xfd", ContentEncoding::Zstd),
        ];
        MAGIC
            .into_iter()
            .find(|(m, _)| head.starts_with(m))
            .map(|(_, e)| e)
    }

    /// Whether this exporter accepts encodings (`JMP_DISABLE_COMPRESSION` is not `1`, and
    /// the crate was built with its `compression` feature).
    pub fn exporter_accepts() -> bool {
        cfg!(feature = "compression")
            && std::env::var(DISABLE_COMPRESSION_ENV).map_or(true, |v| v != "1")
    }
}

impl std::fmt::Display for ContentEncoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A boxed buffered reader.
pub type BoxBufRead = Pin<Box<dyn AsyncBufRead + Send>>;
/// A boxed writer.
pub type BoxWrite = Pin<Box<dyn AsyncWrite + Send>>;

/// Wraps `reader` so that reading yields the bytes decoded from `encoding`.
///
/// Without the crate's `compression` feature, reading a `Some` encoding fails with
/// [`io::ErrorKind::Unsupported`].
#[cfg(feature = "compression")]
pub fn decoder<R: AsyncBufRead + Send + 'static>(
    reader: R,
    encoding: Option<ContentEncoding>,
) -> BoxBufRead {
    fn buffered<D: AsyncRead + Send + 'static>(d: D) -> BoxBufRead {
        Box::pin(tokio::io::BufReader::with_capacity(64 * 1024, d))
    }
    match encoding {
        None => Box::pin(reader),
        Some(ContentEncoding::Gzip) => {
            let mut d = bufread::GzipDecoder::new(reader);
            d.multiple_members(true);
            buffered(d)
        }
        Some(ContentEncoding::Xz) => {
            let mut d = bufread::XzDecoder::new(reader);
            d.multiple_members(true);
            buffered(d)
        }
        Some(ContentEncoding::Bz2) => {
            let mut d = bufread::BzDecoder::new(reader);
            d.multiple_members(true);
            buffered(d)
        }
        Some(ContentEncoding::Zstd) => {
            let mut d = bufread::ZstdDecoder::new(reader);
            d.multiple_members(true);
            buffered(d)
        }
    }
}

/// Wraps `writer` so that what is written goes out encoded with `encoding` (shut it down
/// to write the trailer).
///
/// Without the crate's `compression` feature, writing a `Some` encoding fails with
/// [`io::ErrorKind::Unsupported`].
#[cfg(feature = "compression")]
pub fn encoder<W: AsyncWrite + Send + 'static>(
    writer: W,
    encoding: Option<ContentEncoding>,
) -> BoxWrite {
    match encoding {
        None => Box::pin(writer),
        Some(ContentEncoding::Gzip) => Box::pin(write::GzipEncoder::new(writer)),
        Some(ContentEncoding::Xz) => Box::pin(write::XzEncoder::new(writer)),
        Some(ContentEncoding::Bz2) => Box::pin(write::BzEncoder::new(writer)),
        Some(ContentEncoding::Zstd) => Box::pin(write::ZstdEncoder::new(writer)),
    }
}

/// See the `compression` build of [`decoder`].
#[cfg(not(feature = "compression"))]
pub fn decoder<R: AsyncBufRead + Send + 'static>(
    reader: R,
    encoding: Option<ContentEncoding>,
) -> BoxBufRead {
    match encoding {
        None => Box::pin(reader),
        Some(e) => Box::pin(Unsupported(e)),
    }
}

/// See the `compression` build of [`encoder`].
#[cfg(not(feature = "compression"))]
pub fn encoder<W: AsyncWrite + Send + 'static>(
    writer: W,
    encoding: Option<ContentEncoding>,
) -> BoxWrite {
    match encoding {
        None => Box::pin(writer),
        Some(e) => Box::pin(Unsupported(e)),
    }
}

/// A reader and writer that fails: an encoding this build cannot decode or encode.
#[cfg(not(feature = "compression"))]
struct Unsupported(ContentEncoding);

#[cfg(not(feature = "compression"))]
impl Unsupported {
    fn error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{} content encoding: jumpstarter-core was built without its `compression` feature",
                self.0
            ),
        )
    }
}

#[cfg(not(feature = "compression"))]
impl AsyncRead for Unsupported {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(Err(self.error()))
    }
}

#[cfg(not(feature = "compression"))]
impl AsyncBufRead for Unsupported {
    fn poll_fill_buf(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        Poll::Ready(Err(self.error()))
    }

    fn consume(self: Pin<&mut Self>, _: usize) {}
}

#[cfg(not(feature = "compression"))]
impl AsyncWrite for Unsupported {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(self.error()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Err(self.error()))
    }
}

/// The handle a driver method receives for a resource (the `resource` argument upstream).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ResourceHandle {
    /// Bytes streamed by the client over `RouterService.Stream`.
    ClientStream {
        /// The resource uuid the exporter assigned.
        uuid: Uuid,
        /// The encoding of the bytes on the client's side, if any.
        #[serde(default)]
        x_jmp_content_encoding: Option<ContentEncoding>,
    },
    /// A URL the exporter fetches (or uploads to) itself.
    PresignedRequest {
        /// Request headers.
        #[serde(default)]
        headers: HashMap<String, String>,
        /// The URL.
        url: String,
        /// `GET` or `PUT`.
        method: String,
    },
}

/// The request a client puts in the `request` metadata of `RouterService.Stream`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StreamRequestMetadata {
    /// Open an `#[export(stream)]` method of a driver.
    Driver {
        /// The driver uuid.
        uuid: Uuid,
        /// The method name.
        method: String,
    },
    /// Open a resource stream for a driver.
    Resource {
        /// The driver uuid.
        uuid: Uuid,
        /// The encoding the client would like to send in.
        #[serde(default)]
        x_jmp_content_encoding: Option<ContentEncoding>,
    },
}

impl StreamRequestMetadata {
    /// The exact compact JSON the upstream client emits (field order matters to no one, but
    /// we keep it identical to be safe).
    pub fn to_json(&self) -> String {
        match self {
            StreamRequestMetadata::Driver { uuid, method } => serde_json::json!({
                "kind": "driver", "uuid": uuid, "method": method
            })
            .to_string(),
            StreamRequestMetadata::Resource {
                uuid,
                x_jmp_content_encoding,
            } => format!(
                "{{\"kind\":\"resource\",\"uuid\":\"{uuid}\",\"x_jmp_content_encoding\":{}}}",
                match x_jmp_content_encoding {
                    Some(e) => format!("\"{e}\""),
                    None => "null".into(),
                }
            ),
        }
    }
}

// ------------------------------------------------------------------------------- pipes

/// How a pipe's writer ended.
#[derive(Debug, Clone)]
enum End {
    Finished,
    Failed(io::ErrorKind, String),
}

type EndSlot = Arc<Mutex<Option<End>>>;

fn set_end(slot: &EndSlot, end: End) {
    let mut g = slot.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        *g = Some(end);
    }
}

/// A bounded in-memory byte pipe: returns its writer and reader.
///
/// The reader sees end of file only after [`PipeWriter::finish`]; a writer that fails or is
/// dropped first makes the reader fail.
pub fn pipe() -> (PipeWriter, PipeReader) {
    let (tx, rx) = tokio::sync::mpsc::channel(PIPE_CHUNKS);
    let end: EndSlot = Arc::default();
    (
        PipeWriter {
            tx: Some(PollSender::new(tx)),
            end: end.clone(),
            finish_if_unused: false,
            used: false,
        },
        PipeReader {
            rx,
            end,
            current: Bytes::new(),
            done: false,
        },
    )
}

/// The writing end of a [`pipe`].
pub struct PipeWriter {
    tx: Option<PollSender<Bytes>>,
    end: EndSlot,
    finish_if_unused: bool,
    used: bool,
}

fn reader_gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the reading side went away")
}

fn write_after_shutdown() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "write after shutdown")
}

impl PipeWriter {
    /// Sends one chunk, waiting while the pipe is full.
    pub async fn send(&mut self, data: Bytes) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.used = true;
        let tx = self
            .tx
            .as_ref()
            .and_then(|s| s.get_ref())
            .ok_or_else(reader_gone)?;
        tx.send(data).await.map_err(|_| reader_gone())
    }

    /// A writer attached to nothing, left behind while the real one is lent out (dropping
    /// it does nothing; writing to it fails).
    fn detached() -> Self {
        Self {
            tx: None,
            end: Arc::default(),
            finish_if_unused: false,
            used: false,
        }
    }

    /// Ends the pipe cleanly: the reader sees end of file after the buffered chunks.
    pub fn finish_now(mut self) {
        self.close();
    }

    /// [`PipeWriter::finish_now`] for a writer that stays in place; later writes fail.
    pub(crate) fn close(&mut self) {
        set_end(&self.end, End::Finished);
        self.tx = None;
    }

    /// Whether nothing more can be sent: the reader went away or the pipe was ended.
    pub(crate) fn is_closed(&self) -> bool {
        self.tx.as_ref().is_none_or(|tx| tx.is_closed())
    }

    /// The poll form of [`PipeWriter::send`], for writers that gather their chunks
    /// themselves: once the pipe has room, queues what `chunk` returns.
    pub(crate) fn poll_send_with(
        &mut self,
        cx: &mut Context<'_>,
        chunk: impl FnOnce() -> Bytes,
    ) -> Poll<io::Result<()>> {
        let Some(tx) = self.tx.as_mut() else {
            return Poll::Ready(Err(write_after_shutdown()));
        };
        ready!(tx.poll_reserve(cx)).map_err(|_| reader_gone())?;
        self.used = true;
        tx.send_item(chunk()).map_err(|_| reader_gone())?;
        Poll::Ready(Ok(()))
    }

    /// Ends the pipe with an error: the reader fails after the buffered chunks.
    pub fn fail(mut self, error: io::Error) {
        set_end(
            &self.end,
            End::Failed(error.kind(), crate::error_chain(&error)),
        );
        self.tx = None;
    }

    /// A writer never written to ends cleanly when dropped (drivers that only read a
    /// resource need not close its other direction); once written to, a drop is a failure.
    pub fn finish_if_unused(mut self) -> Self {
        self.finish_if_unused = true;
        self
    }
}

impl Drop for PipeWriter {
    fn drop(&mut self) {
        if self.tx.is_some() {
            let end = if self.finish_if_unused && !self.used {
                End::Finished
            } else {
                End::Failed(
                    io::ErrorKind::UnexpectedEof,
                    "transfer broken: the sending side stopped before the end".into(),
                )
            };
            set_end(&self.end, end);
        }
    }
}

/// The common part of writing to a channel of chunks: queues a copy of up to
/// [`crate::wire::frames::CHUNK`] bytes of `buf` once there is room. `Some(n)` when queued,
/// `None` when the receiving side is gone, an error after shutdown (`tx` taken).
fn poll_queue_copy(
    tx: &mut Option<PollSender<Bytes>>,
    cx: &mut Context<'_>,
    buf: &[u8],
) -> Poll<io::Result<Option<usize>>> {
    if buf.is_empty() {
        return Poll::Ready(Ok(Some(0)));
    }
    let Some(tx) = tx.as_mut() else {
        return Poll::Ready(Err(write_after_shutdown()));
    };
    if ready!(tx.poll_reserve(cx)).is_err() {
        return Poll::Ready(Ok(None));
    }
    let n = buf.len().min(crate::wire::frames::CHUNK);
    Poll::Ready(Ok(tx
        .send_item(Bytes::copy_from_slice(&buf[..n]))
        .ok()
        .map(|()| n)))
}

impl AsyncWrite for PipeWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match ready!(poll_queue_copy(&mut self.tx, cx, buf))? {
            Some(n) => {
                self.used |= n > 0;
                Poll::Ready(Ok(n))
            }
            None => Poll::Ready(Err(reader_gone())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.close();
        Poll::Ready(Ok(()))
    }
}

impl FrameSink for PipeWriter {
    async fn write_chunk(&mut self, data: Bytes) -> io::Result<()> {
        self.send(data).await
    }
    async fn finish(self) -> io::Result<()> {
        self.finish_now();
        Ok(())
    }
    fn fail(self, error: io::Error) {
        PipeWriter::fail(self, error)
    }
}

/// The reading end of a [`pipe`]: `AsyncRead`, `AsyncBufRead` and a stream of chunks.
pub struct PipeReader {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    end: EndSlot,
    current: Bytes,
    done: bool,
}

impl PipeReader {
    /// A reader already at a clean end (what is left behind when a reader is moved out).
    fn exhausted() -> Self {
        let (_, rx) = tokio::sync::mpsc::channel(1);
        Self {
            rx,
            end: Arc::new(Mutex::new(Some(End::Finished))),
            current: Bytes::new(),
            done: true,
        }
    }

    fn ended(&mut self) -> io::Result<()> {
        self.done = true;
        let end = self.end.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match end {
            Some(End::Finished) => Ok(()),
            Some(End::Failed(kind, msg)) => Err(io::Error::new(kind, msg)),
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "transfer broken: the sending side went away before the end",
            )),
        }
    }

    /// The next chunk, `None` at a clean end of file.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        if !self.current.is_empty() {
            return Poll::Ready(Ok(Some(std::mem::take(&mut self.current))));
        }
        if self.done {
            return Poll::Ready(self.ended().map(|_| None));
        }
        match ready!(self.rx.poll_recv(cx)) {
            Some(b) => Poll::Ready(Ok(Some(b))),
            None => Poll::Ready(self.ended().map(|_| None)),
        }
    }

    /// The next chunk, `None` at a clean end of file.
    pub async fn chunk(&mut self) -> io::Result<Option<Bytes>> {
        std::future::poll_fn(|cx| self.poll_chunk(cx)).await
    }
}

impl AsyncBufRead for PipeReader {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this = self.get_mut();
        if this.current.is_empty() {
            match ready!(this.poll_chunk(cx))? {
                Some(b) => this.current = b,
                None => return Poll::Ready(Ok(&[])),
            }
        }
        Poll::Ready(Ok(&this.current[..]))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        let this = self.get_mut();
        this.current.advance(amt.min(this.current.len()));
    }
}

impl AsyncRead for PipeReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let data = ready!(self.as_mut().poll_fill_buf(cx))?;
        let n = data.len().min(buf.remaining());
        buf.put_slice(&data[..n]);
        self.consume(n);
        Poll::Ready(Ok(()))
    }
}

impl Stream for PipeReader {
    type Item = io::Result<Bytes>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_chunk(cx).map(|r| r.transpose())
    }
}

impl FrameSource for PipeReader {
    async fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        self.chunk().await
    }
}

// ------------------------------------------------------------------------------- files

/// How many chunks may wait between a local file and a transfer, in either direction
/// ([`file_chunks`], [`FileWriter`]).
pub const FILE_QUEUE: usize = 8;

/// A local file read as a stream of chunks of at most [`crate::wire::frames::CHUNK`] bytes.
///
/// A blocking thread reads the file straight into the chunks it hands over, so the bytes
/// are not copied again after the kernel's copy out of the page cache; at most
/// [`FILE_QUEUE`] chunks wait. A read error ends the stream with that error. Dropping the
/// stream stops the thread.
pub struct FileChunks {
    rx: tokio::sync::mpsc::Receiver<io::Result<Bytes>>,
}

/// Reads `file` from where it stands to its end, as [`FileChunks`].
pub fn file_chunks(file: std::fs::File) -> FileChunks {
    let (tx, rx) = tokio::sync::mpsc::channel(FILE_QUEUE);
    tokio::task::spawn_blocking(move || {
        let mut file = file;
        let read = read_file_chunks(&mut file, |chunk| {
            tx.blocking_send(Ok(chunk)).map_err(|_| reader_gone())
        });
        if let Err(e) = read {
            let _ = tx.blocking_send(Err(e));
        }
    });
    FileChunks { rx }
}

/// Reads `file` to its end in chunks of [`crate::wire::frames::CHUNK`] bytes (from recycled
/// buffers) handed to `send`; returns how many bytes, or the first error of either.
fn read_file_chunks(
    file: &mut std::fs::File,
    mut send: impl FnMut(Bytes) -> io::Result<()>,
) -> io::Result<u64> {
    let mut buffers = Recycler::default();
    let mut n = 0u64;
    while let Some(chunk) = read_chunk(file, buffers.take(crate::wire::frames::CHUNK))? {
        buffers.track(&chunk);
        n += chunk.len() as u64;
        send(chunk)?;
    }
    Ok(n)
}

/// Fills `buf` from `file` (short only at the end of the file); `None` at the end.
fn read_chunk(file: &mut impl std::io::Read, mut buf: BytesMut) -> io::Result<Option<Bytes>> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if filled == 0 {
        return Ok(None);
    }
    buf.truncate(filled);
    Ok(Some(buf.freeze()))
}

/// Chunk buffers handed out and taken back once every copy of them is gone (the transport
/// drops a chunk once it has sent it), so that steady reads neither allocate nor zero
/// memory: safe code can only read into initialised memory, and fresh memory costs page
/// faults too.
#[derive(Default)]
struct Recycler {
    out: std::collections::VecDeque<Bytes>,
}

/// How many handed-out chunks a [`Recycler`] keeps an eye on; older ones are let go.
const RECYCLED: usize = FILE_QUEUE + PIPE_CHUNKS + 8;

impl Recycler {
    /// A buffer of `len` initialised bytes: the oldest chunk handed out if nobody else holds
    /// it any more, a new zeroed one otherwise.
    fn take(&mut self, len: usize) -> BytesMut {
        if self.out.front().is_some_and(Bytes::is_unique)
            && let Some(oldest) = self.out.pop_front()
            && let Ok(buf) = oldest.try_into_mut()
            && buf.len() == len
        {
            return buf;
        }
        BytesMut::zeroed(len)
    }

    /// Keeps an eye on `chunk`, handed out.
    fn track(&mut self, chunk: &Bytes) {
        self.out.push_back(chunk.clone());
        if self.out.len() > RECYCLED {
            self.out.pop_front();
        }
    }
}

impl Stream for FileChunks {
    type Item = io::Result<Bytes>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// Where downloaded bytes go: any `AsyncWrite`, fed whole chunks.
///
/// By default a chunk is copied in with `write_all`; a sink that can keep the chunk as it
/// is ([`FileWriter`]) overrides [`ChunkWrite::write_chunk`] and takes it without a copy.
pub trait ChunkWrite: AsyncWrite + Send + Unpin {
    /// Writes all of `chunk`.
    fn write_chunk(&mut self, chunk: Bytes) -> impl Future<Output = io::Result<()>> + Send {
        async move {
            use tokio::io::AsyncWriteExt;
            self.write_all(&chunk).await
        }
    }
}

impl ChunkWrite for tokio::io::DuplexStream {}
impl ChunkWrite for Vec<u8> {}

/// An `AsyncWrite` over a local file, written by a blocking thread while the caller goes
/// on (at most [`FILE_QUEUE`] pieces wait; `tokio::fs::File` has one write in flight at a
/// time). Shutting it down waits for everything to be written and reports the first write
/// error; a write error also fails later writes.
pub struct FileWriter {
    tx: Option<PollSender<Bytes>>,
    writer: Option<tokio::task::JoinHandle<io::Result<u64>>>,
}

impl FileWriter {
    /// Writes to `file` from where it stands.
    pub fn new(mut file: std::fs::File) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(FILE_QUEUE);
        let writer = tokio::task::spawn_blocking(move || -> io::Result<u64> {
            use std::io::Write;
            let mut n = 0u64;
            while let Some(b) = rx.blocking_recv() {
                file.write_all(&b)?;
                n += b.len() as u64;
            }
            file.flush()?;
            Ok(n)
        });
        Self {
            tx: Some(PollSender::new(tx)),
            writer: Some(writer),
        }
    }

    /// Waits for the writer thread and returns how it ended.
    fn poll_writer(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let Some(writer) = self.writer.as_mut() else {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the file writer has already ended",
            )));
        };
        let r = ready!(Pin::new(writer).poll(cx));
        self.writer = None;
        Poll::Ready(match r {
            Ok(r) => r,
            Err(e) => Err(io::Error::other(format!(
                "file writer task failed: {e}",
                e = crate::error_chain(&e)
            ))),
        })
    }
}

impl ChunkWrite for FileWriter {
    /// Queues `chunk` itself for the writer thread: no copy.
    async fn write_chunk(&mut self, chunk: Bytes) -> io::Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        let Some(tx) = self.tx.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "write after shutdown",
            ));
        };
        let queued = std::future::poll_fn(|cx| tx.poll_reserve(cx)).await.is_ok()
            && tx.send_item(chunk).is_ok();
        if queued {
            return Ok(());
        }
        // The thread stopped at a write error: report it.
        let ended = std::future::poll_fn(|cx| self.poll_writer(cx)).await;
        Err(ended
            .err()
            .unwrap_or_else(|| io::Error::other("the file writer stopped early")))
    }
}

impl AsyncWrite for FileWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match ready!(poll_queue_copy(&mut self.tx, cx, buf))? {
            Some(n) => Poll::Ready(Ok(n)),
            None => {
                // The thread stopped at a write error: report it.
                let e = ready!(self.poll_writer(cx))
                    .err()
                    .unwrap_or_else(|| io::Error::other("the file writer stopped early"));
                Poll::Ready(Err(e))
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Queued pieces are written in order; shutdown waits for them.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tx = None;
        if self.writer.is_none() {
            return Poll::Ready(Ok(()));
        }
        ready!(self.poll_writer(cx)).map(|_| ()).into()
    }
}

// ---------------------------------------------------------------------- driver's end

/// The driver's end of a resource stream: read it for the client's bytes (decoded when an
/// encoding was negotiated), write it for bytes sent back and shut it down at the end.
///
/// Reading fails if the client's transfer broke midway. Dropping it without shutdown after
/// writing makes the client's read fail; never writing to it is fine.
pub struct ResourceStream {
    read: StreamRead,
    write: StreamWrite,
    /// A presigned `PUT`'s answer, awaited when the writing side is shut down.
    put_done: Option<tokio::sync::oneshot::Receiver<io::Result<()>>>,
}

/// The writing side: chunks handed to the session as they are, or encoded.
enum StreamWrite {
    Plain(PipeWriter),
    Encoded(BoxWrite),
}

/// The reading side: the client's chunks as they came, or decoded.
enum StreamRead {
    Plain(PipeReader),
    Decoded(BoxBufRead),
}

impl ResourceStream {
    fn new(reader: PipeReader, writer: PipeWriter, encoding: Option<ContentEncoding>) -> Self {
        Self {
            read: match encoding {
                None => StreamRead::Plain(reader),
                Some(_) => StreamRead::Decoded(decoder(reader, encoding)),
            },
            write: match encoding {
                None => StreamWrite::Plain(writer.finish_if_unused()),
                Some(_) => StreamWrite::Encoded(encoder(writer.finish_if_unused(), encoding)),
            },
            put_done: None,
        }
    }

    /// A presigned request's stream (see [`crate::wire::presigned`]): `reader` gives the
    /// downloaded bytes, `writer` takes the bytes to upload, and shutting the stream down
    /// waits for `put_done`, the upload's answer, when there is one.
    pub(crate) fn presigned(
        reader: PipeReader,
        writer: PipeWriter,
        put_done: Option<tokio::sync::oneshot::Receiver<io::Result<()>>>,
    ) -> Self {
        Self {
            read: StreamRead::Plain(reader),
            write: StreamWrite::Plain(writer.finish_if_unused()),
            put_done,
        }
    }

    /// The next piece of the client's bytes, `None` at the end (an error if the transfer
    /// broke). Without a copy when no encoding was negotiated: the bytes as received.
    pub async fn chunk(&mut self) -> io::Result<Option<Bytes>> {
        self.read.chunk().await
    }

    /// Writes all of the client's bytes to `file` and returns how many. A blocking thread
    /// takes the chunks as they arrive (decoding them if an encoding was negotiated) and
    /// writes them, with no copy on the way. A transfer that breaks midway is the error
    /// returned, even when the file took everything that arrived.
    pub async fn copy_to_file(&mut self, file: std::fs::File) -> io::Result<u64> {
        // The thread owns the reading half while it works: one hop per chunk, not two.
        let mut read =
            std::mem::replace(&mut self.read, StreamRead::Plain(PipeReader::exhausted()));
        let handle = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || -> io::Result<u64> {
            use std::io::Write;
            let mut file = file;
            let mut n = 0u64;
            while let Some(b) = handle.block_on(read.chunk())? {
                file.write_all(&b)?;
                n += b.len() as u64;
            }
            file.flush()?;
            Ok(n)
        })
        .await
        .map_err(|e| {
            io::Error::other(format!(
                "file writer task failed: {e}",
                e = crate::error_chain(&e)
            ))
        })?
    }

    /// Sends bytes to the client (encoded if an encoding was negotiated, otherwise as they
    /// are, without a copy, in pieces of at most [`crate::wire::frames::CHUNK`] bytes), waiting
    /// while the client is behind.
    pub async fn write_chunk(&mut self, data: Bytes) -> io::Result<()> {
        self.write.write_chunk(data).await
    }

    /// Sends all of `file` (from where it stands) to the client and returns how many bytes;
    /// a blocking thread reads the file straight into the chunks sent (see [`file_chunks`])
    /// and encodes them if an encoding was negotiated. The stream is not shut down: do that
    /// once everything is written.
    pub async fn copy_from_file(&mut self, file: std::fs::File) -> io::Result<u64> {
        // The thread borrows the writing half while it works and hands it back.
        let mut write =
            std::mem::replace(&mut self.write, StreamWrite::Plain(PipeWriter::detached()));
        let handle = tokio::runtime::Handle::current();
        let (write, read) = tokio::task::spawn_blocking(move || {
            let mut file = file;
            let read =
                read_file_chunks(&mut file, |chunk| handle.block_on(write.write_chunk(chunk)));
            (write, read)
        })
        .await
        .map_err(|e| {
            io::Error::other(format!(
                "file reader task failed: {e}",
                e = crate::error_chain(&e)
            ))
        })?;
        self.write = write;
        read
    }
}

impl StreamRead {
    async fn chunk(&mut self) -> io::Result<Option<Bytes>> {
        match self {
            StreamRead::Plain(r) => r.chunk().await,
            StreamRead::Decoded(r) => {
                let mut buf = bytes::BytesMut::with_capacity(crate::wire::frames::CHUNK);
                let n = tokio::io::AsyncReadExt::read_buf(r, &mut buf).await?;
                Ok((n > 0).then(|| buf.freeze()))
            }
        }
    }
}

impl StreamWrite {
    async fn write_chunk(&mut self, mut data: Bytes) -> io::Result<()> {
        match self {
            StreamWrite::Plain(w) => {
                while data.len() > crate::wire::frames::CHUNK {
                    w.send(data.split_to(crate::wire::frames::CHUNK)).await?;
                }
                w.send(data).await
            }
            StreamWrite::Encoded(w) => tokio::io::AsyncWriteExt::write_all(w, &data).await,
        }
    }
}

impl AsyncRead for ResourceStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.read {
            StreamRead::Plain(r) => Pin::new(r).poll_read(cx, buf),
            StreamRead::Decoded(r) => r.as_mut().poll_read(cx, buf),
        }
    }
}

impl AsyncBufRead for ResourceStream {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        match &mut self.get_mut().read {
            StreamRead::Plain(r) => Pin::new(r).poll_fill_buf(cx),
            StreamRead::Decoded(r) => r.as_mut().poll_fill_buf(cx),
        }
    }

    fn consume(mut self: Pin<&mut Self>, amt: usize) {
        match &mut self.read {
            StreamRead::Plain(r) => Pin::new(r).consume(amt),
            StreamRead::Decoded(r) => r.as_mut().consume(amt),
        }
    }
}

impl AsyncWrite for ResourceStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.write {
            StreamWrite::Plain(w) => Pin::new(w).poll_write(cx, buf),
            StreamWrite::Encoded(w) => w.as_mut().poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.write {
            StreamWrite::Plain(w) => Pin::new(w).poll_flush(cx),
            StreamWrite::Encoded(w) => w.as_mut().poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(match &mut self.write {
            StreamWrite::Plain(w) => Pin::new(w).poll_shutdown(cx),
            StreamWrite::Encoded(w) => w.as_mut().poll_shutdown(cx),
        })?;
        let Some(done) = self.put_done.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let answer = ready!(Pin::new(done).poll(cx)).unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "presigned HTTP PUT ended without an answer",
            ))
        });
        self.put_done = None;
        Poll::Ready(answer)
    }
}

/// The session's end of a resource stream: feed `inbound` from the client's frames and
/// send what comes out of `outbound`.
pub(crate) struct SessionEnd {
    pub(crate) inbound: PipeWriter,
    pub(crate) outbound: PipeReader,
}

struct Pending {
    driver_reader: PipeReader,
    driver_writer: PipeWriter,
    accepted: Option<ContentEncoding>,
}

/// The open resource streams of a session, by uuid.
#[derive(Default)]
pub struct ResourceRegistry {
    pending: Mutex<HashMap<Uuid, Pending>>,
}

impl ResourceRegistry {
    /// Registers a new resource whose bytes the exporter decodes from `accepted` (if any);
    /// returns its uuid, the session's end and a guard removing it when the RPC ends.
    pub(crate) fn create(
        self: &Arc<Self>,
        accepted: Option<ContentEncoding>,
    ) -> (Uuid, SessionEnd, ResourceGuard) {
        let (inbound, driver_reader) = pipe();
        let (driver_writer, outbound) = pipe();
        let uuid = Uuid::new_v4();
        self.lock().insert(
            uuid,
            Pending {
                driver_reader,
                driver_writer,
                accepted,
            },
        );
        let guard = ResourceGuard {
            registry: self.clone(),
            uuid,
        };
        (uuid, SessionEnd { inbound, outbound }, guard)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Pending>> {
        // A poisoned lock only means another call panicked while holding it; the map itself
        // is always consistent (single insert/remove operations).
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the driver's end of a resource stream (each handle opens once).
    pub fn open(&self, handle: &ResourceHandle) -> Result<ResourceStream, DriverError> {
        match handle {
            ResourceHandle::ClientStream {
                uuid,
                x_jmp_content_encoding,
            } => {
                let p = self.lock().remove(uuid).ok_or_else(|| {
                    DriverError::InvalidArgument(format!(
                        "unknown resource {uuid}: no open stream with that handle (closed or already used)"
                    ))
                })?;
                if p.accepted.is_none() && x_jmp_content_encoding.is_some() {
                    // Not accepted: the client decoded locally, the bytes are plain.
                    tracing::debug!(
                        "resource {uuid}: {x_jmp_content_encoding:?} was not accepted, bytes are plain"
                    );
                }
                Ok(ResourceStream::new(
                    p.driver_reader,
                    p.driver_writer,
                    p.accepted,
                ))
            }
            // Opened by `CallContext::resource` (crate::wire::presigned), which logs progress.
            ResourceHandle::PresignedRequest { url, .. } => Err(DriverError::Failed(format!(
                "a presigned request ({}) is opened through CallContext::resource",
                url.split('?').next().unwrap_or_default()
            ))),
        }
    }
}

/// Removes a resource from the registry when its stream RPC ends.
pub(crate) struct ResourceGuard {
    registry: Arc<ResourceRegistry>,
    uuid: Uuid,
}

impl Drop for ResourceGuard {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.uuid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn request_metadata_is_upstream_compact_json() {
        let u = Uuid::nil();
        let r = StreamRequestMetadata::Resource {
            uuid: u,
            x_jmp_content_encoding: None,
        };
        assert_eq!(
            r.to_json(),
            r#"{"kind":"resource","uuid":"00000000-0000-0000-0000-000000000000","x_jmp_content_encoding":null}"#
        );
        let parsed: StreamRequestMetadata = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(parsed, r);
        let z = StreamRequestMetadata::Resource {
            uuid: u,
            x_jmp_content_encoding: Some(ContentEncoding::Zstd),
        };
        assert!(z.to_json().ends_with(r#""x_jmp_content_encoding":"zstd"}"#));
        let d: StreamRequestMetadata = serde_json::from_str(
            r#"{"method":"connect","uuid":"00000000-0000-0000-0000-000000000000","kind":"driver"}"#,
        )
        .unwrap();
        assert!(matches!(d, StreamRequestMetadata::Driver { .. }));
        let bad = serde_json::from_str::<StreamRequestMetadata>(
            r#"{"kind":"resource","uuid":"00000000-0000-0000-0000-000000000000","x_jmp_content_encoding":"br"}"#,
        );
        assert!(bad.is_err());
    }

    #[test]
    fn handle_opens_once() {
        let reg = Arc::new(ResourceRegistry::default());
        let (uuid, _end, _guard) = reg.create(None);
        let h = ResourceHandle::ClientStream {
            uuid,
            x_jmp_content_encoding: None,
        };
        assert!(reg.open(&h).is_ok());
        let again = reg.open(&h).err().unwrap();
        assert!(again.to_string().contains("unknown resource"), "{again}");
    }

    #[test]
    fn guard_removes_unused_resource() {
        let reg = Arc::new(ResourceRegistry::default());
        let (uuid, _end, guard) = reg.create(None);
        drop(guard);
        let h = ResourceHandle::ClientStream {
            uuid,
            x_jmp_content_encoding: None,
        };
        assert!(reg.open(&h).is_err());
    }

    #[tokio::test]
    async fn pipe_finish_fail_and_drop() {
        let (mut w, mut r) = pipe();
        let reader = tokio::spawn(async move {
            let mut v = Vec::new();
            r.read_to_end(&mut v).await.map(|_| v)
        });
        w.send(Bytes::from_static(b"ab")).await.unwrap();
        w.write_all(b"cd").await.unwrap();
        w.shutdown().await.unwrap();
        assert_eq!(reader.await.unwrap().unwrap(), b"abcd");

        let (mut w, mut r) = pipe();
        w.send(Bytes::from_static(b"ab")).await.unwrap();
        drop(w);
        let mut v = Vec::new();
        let e = r.read_to_end(&mut v).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(v, b"ab");

        let (w, mut r) = pipe();
        w.fail(io::Error::other("boom"));
        let e = r.read_to_end(&mut Vec::new()).await.unwrap_err();
        assert!(e.to_string().contains("boom"));

        let (w, mut r) = pipe();
        drop(w.finish_if_unused());
        assert_eq!(r.read_to_end(&mut Vec::new()).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn pipe_is_bounded() {
        let (mut w, _r) = pipe();
        for _ in 0..PIPE_CHUNKS {
            w.send(Bytes::from_static(b"x")).await.unwrap();
        }
        let blocked = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            w.send(Bytes::from_static(b"x")),
        )
        .await;
        assert!(blocked.is_err(), "a full pipe must make the writer wait");
    }

    #[tokio::test]
    async fn encodings_round_trip_and_detect() {
        let data: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        for enc in ContentEncoding::ALL {
            let (w, r) = pipe();
            let mut e = encoder(w, Some(enc));
            let src = data.clone();
            let writer = tokio::spawn(async move {
                e.write_all(&src).await.unwrap();
                e.shutdown().await.unwrap();
            });
            let mut d = decoder(r, Some(enc));
            let mut out = Vec::new();
            // Peek at the encoded bytes indirectly: decoding must give back the data.
            d.read_to_end(&mut out).await.unwrap();
            writer.await.unwrap();
            assert_eq!(out, data, "{enc}");
        }
        assert_eq!(
            ContentEncoding::detect(b"\x1f\x8b\x08\x00"),
            Some(ContentEncoding::Gzip)
        );
        assert_eq!(ContentEncoding::detect(b"BZh9"), Some(ContentEncoding::Bz2));
        assert_eq!(ContentEncoding::detect(b"plain"), None);
        assert_eq!(ContentEncoding::parse("xz"), Some(ContentEncoding::Xz));
        assert_eq!(ContentEncoding::parse("br"), None);
    }

    #[tokio::test]
    async fn corrupt_encoded_input_is_an_error() {
        let (mut w, r) = pipe();
        w.send(Bytes::from_static(b"\x1f\x8b\x08\x00garbage-not-gzip"))
            .await
            .unwrap();
        w.finish_now();
        let mut d = decoder(r, Some(ContentEncoding::Gzip));
        assert!(d.read_to_end(&mut Vec::new()).await.is_err());
    }

    fn patterned(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    async fn collect(mut chunks: FileChunks) -> io::Result<Vec<Bytes>> {
        use futures::StreamExt;
        let mut out = Vec::new();
        while let Some(c) = chunks.next().await {
            out.push(c?);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn file_chunks_yield_the_file_in_full_chunks_then_the_rest() {
        let chunk = crate::wire::frames::CHUNK;
        for len in [0, 1, chunk - 1, chunk, chunk + 1, 3 * chunk + 17] {
            let mut f = tempfile::tempfile().unwrap();
            let data = patterned(len);
            std::io::Write::write_all(&mut f, &data).unwrap();
            std::io::Seek::rewind(&mut f).unwrap();
            let chunks = collect(file_chunks(f)).await.unwrap();
            assert!(chunks.iter().all(|c| !c.is_empty()), "len {len}");
            let (last, full) = chunks
                .split_last()
                .map_or((None, &[][..]), |(l, f)| (Some(l), f));
            assert!(full.iter().all(|c| c.len() == chunk), "len {len}");
            assert!(last.is_none_or(|l| l.len() <= chunk), "len {len}");
            assert_eq!(chunks.concat(), data, "len {len}");
        }
    }

    #[tokio::test]
    async fn file_chunks_start_where_the_file_stands() {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, b"skip this|keep this").unwrap();
        std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(10)).unwrap();
        assert_eq!(
            collect(file_chunks(f)).await.unwrap().concat(),
            b"keep this"
        );
    }

    #[tokio::test]
    async fn file_chunks_report_a_read_error() {
        // A directory opens, but reading it fails (EISDIR).
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::open(dir.path()).unwrap();
        let e = collect(file_chunks(f)).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::IsADirectory);
    }

    #[test]
    fn recycler_reuses_a_buffer_only_once_nobody_holds_it() {
        let mut r = Recycler::default();
        let first = r.take(16);
        let chunk = first.freeze();
        r.track(&chunk);
        let ptr = chunk.as_ptr();
        // Still held by the transport: a new buffer.
        let second = r.take(16);
        assert_ne!(second.as_ptr(), ptr);
        drop(second);
        // Released: the same memory comes back, whole.
        drop(chunk);
        let again = r.take(16);
        assert_eq!(again.as_ptr(), ptr);
        assert_eq!(again.len(), 16);
        // A slice of it still alive keeps it out of reuse.
        let chunk = again.freeze();
        r.track(&chunk);
        let slice = chunk.slice(4..8);
        drop(chunk);
        assert_ne!(r.take(16).as_ptr(), slice.as_ptr().wrapping_sub(4));
    }

    #[test]
    fn recycler_lets_go_of_old_chunks() {
        let mut r = Recycler::default();
        let held: Vec<Bytes> = (0..RECYCLED + 5)
            .map(|_| {
                let c = r.take(8).freeze();
                r.track(&c);
                c
            })
            .collect();
        assert_eq!(r.out.len(), RECYCLED);
        drop(held);
    }

    #[tokio::test]
    async fn file_writer_writes_everything_by_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let mut w = FileWriter::new(std::fs::File::create(&path).unwrap());
        let data = patterned(3 * crate::wire::frames::CHUNK + 5);
        for piece in data.chunks(100_000) {
            w.write_all(piece).await.unwrap();
        }
        w.shutdown().await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert!(w.write_all(b"late").await.is_err());
    }

    #[tokio::test]
    async fn file_writer_takes_whole_chunks_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let mut w = FileWriter::new(std::fs::File::create(&path).unwrap());
        let data = patterned(5 * crate::wire::frames::CHUNK + 3);
        // Chunks mixed with plain writes, an empty chunk among them.
        for (i, piece) in data.chunks(crate::wire::frames::CHUNK).enumerate() {
            if i % 2 == 0 {
                w.write_chunk(Bytes::copy_from_slice(piece)).await.unwrap();
                w.write_chunk(Bytes::new()).await.unwrap();
            } else {
                w.write_all(piece).await.unwrap();
            }
        }
        w.shutdown().await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert!(w.write_chunk(Bytes::from_static(b"late")).await.is_err());
    }

    #[tokio::test]
    async fn file_writer_reports_a_write_error() {
        // A file opened read-only: the writer thread's first write fails, whether it was
        // handed copies (`write_all`) or whole chunks (`write_chunk`).
        for whole_chunks in [false, true] {
            let f = tempfile::NamedTempFile::new().unwrap();
            let mut w = FileWriter::new(std::fs::File::open(f.path()).unwrap());
            let mut failed = None;
            for _ in 0..4 * FILE_QUEUE {
                let written = if whole_chunks {
                    w.write_chunk(Bytes::from(vec![7u8; 4096])).await
                } else {
                    w.write_all(&[7u8; 4096]).await
                };
                if let Err(e) = written {
                    failed = Some(e);
                    break;
                }
            }
            let e = match failed {
                Some(e) => e,
                None => w.shutdown().await.unwrap_err(),
            };
            assert_ne!(e.to_string(), "", "{e}");
            assert!(std::fs::read(f.path()).unwrap().is_empty());
        }
    }

    #[tokio::test]
    async fn copy_from_file_sends_the_file_through_the_stream() {
        let (_to_driver, reader) = pipe();
        let (writer, mut from_driver) = pipe();
        let mut stream = ResourceStream::new(reader, writer, None);
        let data = patterned(2 * crate::wire::frames::CHUNK + 9);
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &data).unwrap();
        std::io::Seek::rewind(&mut f).unwrap();
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            from_driver.read_to_end(&mut got).await.map(|_| got)
        });
        assert_eq!(stream.copy_from_file(f).await.unwrap(), data.len() as u64);
        stream.shutdown().await.unwrap();
        assert_eq!(reading.await.unwrap().unwrap(), data);
    }

    #[tokio::test]
    async fn copy_to_file_takes_everything_or_reports_the_cut() {
        let dir = tempfile::tempdir().unwrap();
        let data = patterned(2 * crate::wire::frames::CHUNK + 3);
        // Whole.
        let (mut to_driver, reader) = pipe();
        let (writer, _from_driver) = pipe();
        let mut stream = ResourceStream::new(reader, writer, None);
        let sending = {
            let data = data.clone();
            tokio::spawn(async move {
                for piece in data.chunks(100_000) {
                    to_driver.send(Bytes::copy_from_slice(piece)).await.unwrap();
                }
                to_driver.finish_now();
            })
        };
        let path = dir.path().join("whole");
        let n = stream
            .copy_to_file(std::fs::File::create(&path).unwrap())
            .await
            .unwrap();
        sending.await.unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(std::fs::read(&path).unwrap(), data);
        // Cut: the sender goes away without finishing.
        let (mut to_driver, reader) = pipe();
        let (writer, _from_driver) = pipe();
        let mut stream = ResourceStream::new(reader, writer, None);
        to_driver
            .send(Bytes::from_static(b"partial"))
            .await
            .unwrap();
        drop(to_driver);
        let path = dir.path().join("cut");
        let e = stream
            .copy_to_file(std::fs::File::create(&path).unwrap())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }
}
