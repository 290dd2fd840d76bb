//! The HTTP/1.1 static file server of [`super::HttpServer`]: `GET` and `HEAD` of the files
//! under the root, streamed from disk; anything else is refused.
//!
//! - A single byte range (`Range: bytes=A-B`, `A-`, `-N`) is answered with `206` and that
//!   part of the file, as upstream's aiohttp server does (bootloaders and opendal's `http`
//!   service read parts); a range beyond the end is `416`; several ranges, or a header that
//!   is not a byte range, get the whole file.
//!
//! - A request path is percent-decoded, and refused (`404`) if it has a `..` or `.`
//!   component, a NUL, or leads (through a symbolic link) out of the root; a directory is
//!   `403`, as upstream's static route without an index.
//! - At most [`MAX_CONNECTIONS`] connections at once (more wait in the kernel's backlog), and
//!   at most [`MAX_CONNECTIONS_PER_CLIENT`] from one client address (an IPv6 client: one
//!   `/64`): one more from that address is answered `503` and closed at once.
//! - The whole request head must arrive within [`HEADER_TIMEOUT`] (or the driver's
//!   `timeout`, if shorter) of the connection's start, or of the end of the previous
//!   response on a kept-alive connection; bytes trickling in do not extend it. A connection
//!   over which no byte moves either way for the driver's `timeout` (a client that stopped
//!   reading its response) is closed too.
//! - Stopping aborts the accept loop and every connection task at once.

use std::{
    collections::HashMap,
    convert::Infallible,
    net::IpAddr,
    path::{Component, Path, PathBuf},
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use jumpstarter_core::sync::LockExt;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWrite, ReadBuf},
    net::TcpListener,
    sync::Semaphore,
    task::JoinSet,
    time::Instant,
};

use crate::{boot_server::ServerTask, tftp::client_key};
use tokio_util::io::ReaderStream;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections served at once from one client address (an IPv6 client: one `/64` prefix).
pub const MAX_CONNECTIONS_PER_CLIENT: usize = 8;
/// The time a client has to send a whole request head: from the connection's start, or
/// from the end of the previous response on a kept-alive connection.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What a connection over [`MAX_CONNECTIONS_PER_CLIENT`] is told before it is closed.
const TOO_MANY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\
    Connection: close\r\n\r\n";

type Body = BoxBody<Bytes, std::io::Error>;

/// The bounds of a server's connections.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// See [`HEADER_TIMEOUT`].
    header: Duration,
    /// A connection over which no byte moves for this long is closed.
    idle: Duration,
    per_client: usize,
}

impl Limits {
    /// The bounds of a server whose connections may stay silent for `timeout` (the
    /// driver's field): the request head within [`HEADER_TIMEOUT`] whatever it says.
    fn for_timeout(timeout: Duration) -> Self {
        Self {
            header: HEADER_TIMEOUT.min(timeout),
            idle: timeout,
            per_client: MAX_CONNECTIONS_PER_CLIENT,
        }
    }
}

/// Serves `root` on `listener` until the task is dropped; a connection may stay silent
/// for `timeout`, but must send its request head within [`HEADER_TIMEOUT`].
pub fn start(listener: TcpListener, root: PathBuf, timeout: Duration) -> ServerTask {
    ServerTask::spawn(serve(
        listener,
        Arc::new(root),
        Limits::for_timeout(timeout),
    ))
}

async fn serve(listener: TcpListener, root: Arc<PathBuf>, limits: Limits) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let clients = Arc::new(PerClient::default());
    // Connection tasks live in the set: aborting this task drops it, which aborts them.
    let mut conns = JoinSet::new();
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (sock, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("HttpServer accept: {e}", e = jumpstarter_core::error_chain(&e));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let Some(client) = clients.try_acquire(peer.ip(), limits.per_client) else {
            tracing::info!(
                "HttpServer: refused a connection from {peer}: already {} from its address",
                limits.per_client
            );
            // Best effort, without waiting: the socket is closed right after.
            let _ = sock.try_write(TOO_MANY);
            continue;
        };
        let root = root.clone();
        conns.spawn(async move {
            let _slots = (permit, client);
            let svc = hyper::service::service_fn(move |req| {
                let root = root.clone();
                async move { Ok::<_, Infallible>(answer(&root, req).await) }
            });
            let io = Watched::new(sock);
            let moved = io.moved.clone();
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header)
                .serve_connection(TokioIo::new(io), svc);
            tokio::select! {
                r = conn => if let Err(e) = r {
                    tracing::debug!("HttpServer {peer}: {e}", e = jumpstarter_core::error_chain(&e));
                },
                () = moved.silent_for(limits.idle) => tracing::debug!(
                    "HttpServer {peer}: closed after {} s without a byte moving",
                    limits.idle.as_secs()
                ),
            }
        });
    }
}

/// The connections open per client address ([`client_key`]); an address has an entry only
/// while it has connections, so there are at most [`MAX_CONNECTIONS`] entries.
#[derive(Debug, Default)]
struct PerClient(Mutex<HashMap<IpAddr, usize>>);

impl PerClient {
    /// A slot for one more connection from `ip`, unless it has `limit` already.
    fn try_acquire(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Option<ClientSlot> {
        let key = client_key(ip);
        let mut open = self.0.lock_or_recover();
        let n = open.entry(key).or_default();
        if *n >= limit {
            if *n == 0 {
                open.remove(&key);
            }
            return None;
        }
        *n += 1;
        Some(ClientSlot(self.clone(), key))
    }
}

/// One connection's place in [`PerClient`], given back when dropped.
struct ClientSlot(Arc<PerClient>, IpAddr);

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = (self.0).0.lock_or_recover();
        if let Some(n) = open.get_mut(&self.1) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.1);
            }
        }
    }
}

/// When bytes last moved over a connection.
#[derive(Debug)]
struct LastMoved {
    start: Instant,
    /// Milliseconds from `start`.
    at: AtomicU64,
}

impl LastMoved {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.at.store(ms, Ordering::Relaxed);
    }

    /// Returns once no byte has moved for `limit`.
    async fn silent_for(&self, limit: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.at.load(Ordering::Relaxed));
            let until = last + limit;
            if Instant::now() >= until {
                return;
            }
            tokio::time::sleep_until(until).await;
        }
    }
}

/// A connection's socket that notes when bytes last moved either way.
struct Watched<S> {
    inner: S,
    moved: Arc<LastMoved>,
}

impl<S> Watched<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            moved: Arc::new(LastMoved {
                start: Instant::now(),
                at: AtomicU64::new(0),
            }),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.moved.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.moved.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.moved.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

fn status(code: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(format!("{}: {text}\n", code.as_u16())))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Decodes `%XX` escapes; `None` for a malformed escape (anything but two hex digits: not a
/// sign, which `from_str_radix` would take).
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// The file a request path names under `root`, or why not.
pub(crate) fn resolve(root: &Path, request_path: &str) -> Result<PathBuf, StatusCode> {
    let decoded = percent_decode(request_path).ok_or(StatusCode::BAD_REQUEST)?;
    let decoded = String::from_utf8(decoded).map_err(|_| StatusCode::NOT_FOUND)?;
    if decoded.contains('\0') || decoded.contains('\\') {
        return Err(StatusCode::NOT_FOUND);
    }
    let rel = Path::new(decoded.trim_start_matches('/'));
    let mut path = root.to_path_buf();
    for c in rel.components() {
        match c {
            Component::Normal(n) => path.push(n),
            // `..`, `.`, a root or a prefix inside the path: never beneath the root.
            _ => return Err(StatusCode::NOT_FOUND),
        }
    }
    // Symbolic links may point anywhere: what they lead to must stay beneath the root.
    let real_root = std::fs::canonicalize(root).map_err(|_| StatusCode::NOT_FOUND)?;
    let real = std::fs::canonicalize(&path).map_err(|_| StatusCode::NOT_FOUND)?;
    if !real.starts_with(&real_root) {
        return Err(StatusCode::NOT_FOUND);
    }
    Ok(real)
}

async fn answer(root: &Path, req: Request<Incoming>) -> Response<Body> {
    let head = match *req.method() {
        Method::GET => false,
        Method::HEAD => true,
        _ => {
            let mut r = status(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD");
            r.headers_mut()
                .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
            return r;
        }
    };
    let root2 = root.to_path_buf();
    let path = req.uri().path().to_string();
    let resolved = tokio::task::spawn_blocking(move || resolve(&root2, &path)).await;
    let file = match resolved {
        Ok(Ok(p)) => p,
        Ok(Err(code)) => return status(code, "not found"),
        Err(_) => return status(StatusCode::INTERNAL_SERVER_ERROR, "lookup failed"),
    };
    let f = match tokio::fs::File::open(&file).await {
        Ok(f) => f,
        Err(_) => return status(StatusCode::NOT_FOUND, "not found"),
    };
    let meta = match f.metadata().await {
        Ok(m) => m,
        Err(_) => return status(StatusCode::NOT_FOUND, "not found"),
    };
    if meta.is_dir() {
        return status(StatusCode::FORBIDDEN, "a directory");
    }
    let len = meta.len();
    let range = req
        .headers()
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| byte_range(v, len));
    let (code, start, count) = match range {
        None => (StatusCode::OK, 0, len),
        Some(Ok((start, end))) => (StatusCode::PARTIAL_CONTENT, start, end - start + 1),
        Some(Err(())) => {
            let mut r = status(StatusCode::RANGE_NOT_SATISFIABLE, "range not satisfiable");
            if let Ok(v) = header::HeaderValue::from_str(&format!("bytes */{len}")) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return r;
        }
    };
    let body = if head {
        empty()
    } else {
        let mut f = f;
        if start > 0 && f.seek(std::io::SeekFrom::Start(start)).await.is_err() {
            return status(StatusCode::INTERNAL_SERVER_ERROR, "seek failed");
        }
        let frames =
            futures::StreamExt::map(ReaderStream::with_capacity(f.take(count), 64 * 1024), |r| {
                r.map(Frame::data)
            });
        BodyExt::boxed(StreamBody::new(frames))
    };
    let mut r = Response::new(body);
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, header::HeaderValue::from(count));
    r.headers_mut().insert(
        header::ACCEPT_RANGES,
        header::HeaderValue::from_static("bytes"),
    );
    if code == StatusCode::PARTIAL_CONTENT
        && let Ok(v) =
            header::HeaderValue::from_str(&format!("bytes {start}-{}/{len}", start + count - 1))
    {
        r.headers_mut().insert(header::CONTENT_RANGE, v);
    }
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    r
}

/// The one byte range a `Range` header asks of a file of `len` bytes, as first and last
/// offsets: `None` to serve the whole file (not a byte range, several ranges, malformed),
/// `Some(Err(()))` when it starts beyond the end (`416`).
fn byte_range(header: &str, len: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = header.trim().strip_prefix("bytes=")?.trim();
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    let num = |s: &str| {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    if a.is_empty() {
        // The last N bytes.
        let n = num(b)?;
        if n == 0 || len == 0 {
            return Some(Err(()));
        }
        return Some(Ok((len - n.min(len), len - 1)));
    }
    let start = num(a)?;
    let end = if b.is_empty() { None } else { Some(num(b)?) };
    if end.is_some_and(|e| e < start) {
        return None;
    }
    if start >= len {
        return Some(Err(()));
    }
    Some(Ok((start, end.map_or(len - 1, |e| e.min(len - 1)))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_ranges_are_parsed_as_rfc_9110_says() {
        assert_eq!(byte_range("bytes=0-9", 100), Some(Ok((0, 9))));
        assert_eq!(byte_range("bytes=90-", 100), Some(Ok((90, 99))));
        assert_eq!(byte_range("bytes=90-500", 100), Some(Ok((90, 99))));
        assert_eq!(byte_range("bytes=-10", 100), Some(Ok((90, 99))));
        assert_eq!(byte_range("bytes=-500", 100), Some(Ok((0, 99))));
        assert_eq!(byte_range("bytes=100-", 100), Some(Err(())));
        assert_eq!(byte_range("bytes=-0", 100), Some(Err(())));
        assert_eq!(byte_range("bytes=0-", 0), Some(Err(())));
        // Whole file: several ranges, other units, nonsense.
        assert_eq!(byte_range("bytes=0-1,5-6", 100), None);
        assert_eq!(byte_range("items=0-1", 100), None);
        assert_eq!(byte_range("bytes=9-2", 100), None);
        assert_eq!(byte_range("bytes=a-b", 100), None);
        assert_eq!(byte_range("bytes=+1-2", 100), None);
        assert_eq!(byte_range("bytes=-", 100), None);
        assert_eq!(byte_range("bytes=99999999999999999999999-", 100), None);
    }

    #[test]
    fn paths_stay_beneath_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a b.img"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("out")).unwrap();
        assert!(resolve(root, "/sub/a%20b.img").is_ok());
        assert_eq!(
            resolve(root, "/sub/../../etc/passwd"),
            Err(StatusCode::NOT_FOUND)
        );
        assert_eq!(
            resolve(root, "/sub/%2e%2e/%2e%2e/etc/passwd"),
            Err(StatusCode::NOT_FOUND)
        );
        assert_eq!(resolve(root, "/out/passwd"), Err(StatusCode::NOT_FOUND));
        assert_eq!(resolve(root, "/nul%00"), Err(StatusCode::NOT_FOUND));
        assert_eq!(resolve(root, "/bad%zz"), Err(StatusCode::BAD_REQUEST));
        // A sign is no hex digit (`%+1` is not byte 1, `%+0` not a NUL).
        assert_eq!(resolve(root, "/sub/%+1"), Err(StatusCode::BAD_REQUEST));
        assert_eq!(resolve(root, "/nul%+0"), Err(StatusCode::BAD_REQUEST));
        assert_eq!(
            resolve(root, "/sub/a%20b%2Eimg"),
            resolve(root, "/sub/a b.img")
        );
        assert_eq!(resolve(root, "/missing"), Err(StatusCode::NOT_FOUND));
    }

    use tokio::{
        io::AsyncWriteExt,
        net::{TcpSocket, TcpStream},
    };

    const KERNEL: &[u8] = b"kernel bytes\n";
    /// A sparse file larger than what the loopback socket buffers hold.
    const BIG: u64 = 64 << 20;

    /// A server on 127.0.0.1 serving `kernel` ([`KERNEL`]) and `big` ([`BIG`] zeros).
    async fn serving(limits: Limits) -> (ServerTask, std::net::SocketAddr, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kernel"), KERNEL).unwrap();
        std::fs::File::create(dir.path().join("big"))
            .unwrap()
            .set_len(BIG)
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let root = Arc::new(dir.path().to_path_buf());
        (ServerTask::spawn(serve(listener, root, limits)), addr, dir)
    }

    async fn connect_from(ip: &str, to: std::net::SocketAddr) -> TcpStream {
        let s = TcpSocket::new_v4().unwrap();
        s.bind(format!("{ip}:0").parse().unwrap()).unwrap();
        s.connect(to).await.unwrap()
    }

    /// What the server sends until it closes the connection (a reset counts as closed), or
    /// `None` if it is still open after `within`.
    async fn until_closed(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        let deadline = Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
                Err(_) => return None,
                Ok(Ok(0) | Err(_)) => return Some(got),
                Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            }
        }
    }

    const GET_KERNEL: &[u8] = b"GET /kernel HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n";

    /// The bounds the driver's default `timeout` (600 s) gives: the request head is still
    /// due within HEADER_TIMEOUT.
    #[test]
    fn the_request_head_is_due_within_seconds_whatever_the_timeout() {
        let l = Limits::for_timeout(Duration::from_secs(600));
        assert_eq!(l.header, HEADER_TIMEOUT);
        assert!(HEADER_TIMEOUT <= Duration::from_secs(10));
        assert_eq!(l.idle, Duration::from_secs(600));
        assert_eq!(l.per_client, MAX_CONNECTIONS_PER_CLIENT);
        let l = Limits::for_timeout(Duration::from_secs(3));
        assert_eq!(l.header, Duration::from_secs(3));
    }

    /// More than MAX_CONNECTIONS half-sent requests from one address (with a header
    /// timeout too long to help): only MAX_CONNECTIONS_PER_CLIENT are kept, the others are
    /// closed at once, and a board at another address gets its file.
    #[tokio::test]
    async fn half_open_connections_from_one_address_leave_room_for_others() {
        let (_server, addr, _dir) = serving(Limits {
            header: Duration::from_secs(60),
            idle: Duration::from_secs(600),
            per_client: MAX_CONNECTIONS_PER_CLIENT,
        })
        .await;
        let mut flood = Vec::new();
        for _ in 0..MAX_CONNECTIONS + 6 {
            let mut s = connect_from("127.0.0.1", addr).await;
            s.write_all(b"GET /kernel HTTP/1.1\r\nHost: b")
                .await
                .unwrap();
            flood.push(s);
        }
        let mut board = connect_from("127.0.0.2", addr).await;
        board.write_all(GET_KERNEL).await.unwrap();
        let answer = until_closed(&mut board, Duration::from_secs(5))
            .await
            .expect("no answer to the board within 5 s");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("kernel bytes\n"), "{answer}");

        let closed = futures::future::join_all(
            flood
                .iter_mut()
                .map(|s| until_closed(s, Duration::from_secs(2))),
        )
        .await;
        let kept = closed.iter().filter(|c| c.is_none()).count();
        assert_eq!(kept, MAX_CONNECTIONS_PER_CLIENT);
    }

    /// A connection that sends nothing, and one that trickles an endless request head a
    /// byte at a time, are both closed once the header timeout has passed.
    #[tokio::test]
    async fn request_heads_are_due_by_a_deadline_that_trickling_does_not_move() {
        let (_server, addr, _dir) = serving(Limits {
            header: Duration::from_secs(1),
            idle: Duration::from_secs(600),
            per_client: MAX_CONNECTIONS_PER_CLIENT,
        })
        .await;
        let mut silent = connect_from("127.0.0.1", addr).await;
        let trickle = connect_from("127.0.0.1", addr).await;
        let (mut reader, mut writer) = trickle.into_split();
        let head = b"GET /kernel HTTP/1.1\r\nHost: b\r\nX-Pad: ";
        let trickling = tokio::spawn(async move {
            let bytes = head.iter().copied().chain(std::iter::repeat(b'a'));
            for b in bytes {
                if writer.write_all(&[b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        assert!(
            until_closed(&mut silent, Duration::from_secs(10))
                .await
                .is_some(),
            "a silent connection stayed open"
        );
        let mut buf = [0u8; 256];
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        trickling.abort();
        assert!(closed.is_ok(), "a trickling connection stayed open");
    }

    /// A client that asks for a large file and stops reading is cut off once nothing has
    /// moved for the idle timeout: it never gets the whole file.
    #[tokio::test]
    async fn a_client_that_stops_reading_is_cut_off() {
        let (_server, addr, _dir) = serving(Limits {
            header: HEADER_TIMEOUT,
            idle: Duration::from_secs(1),
            per_client: MAX_CONNECTIONS_PER_CLIENT,
        })
        .await;
        let mut s = connect_from("127.0.0.1", addr).await;
        s.write_all(b"GET /big HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let got = until_closed(&mut s, Duration::from_secs(30))
            .await
            .expect("the connection is still open");
        assert!((got.len() as u64) < BIG, "{} bytes arrived", got.len());
    }
}
