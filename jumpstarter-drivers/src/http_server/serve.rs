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
//! - At most [`MAX_CONNECTIONS`] connections at once (more wait in the kernel's backlog); a
//!   connection that sends no complete request head within the driver's `timeout` is closed.
//! - Stopping aborts the accept loop and every connection task at once.

use std::{
    convert::Infallible,
    path::{Component, Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncReadExt, AsyncSeekExt},
    net::TcpListener,
    sync::Semaphore,
    task::JoinSet,
};

use crate::boot_server::ServerTask;
use tokio_util::io::ReaderStream;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

type Body = BoxBody<Bytes, std::io::Error>;

/// Serves `root` on `listener` until the task is dropped.
pub fn start(listener: TcpListener, root: PathBuf, timeout: Duration) -> ServerTask {
    let root = Arc::new(root);
    ServerTask::spawn(async move {
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
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
                        tracing::warn!("HttpServer accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            };
            let root = root.clone();
            conns.spawn(async move {
                let _permit = permit;
                let svc = hyper::service::service_fn(move |req| {
                    let root = root.clone();
                    async move { Ok::<_, Infallible>(answer(&root, req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(timeout)
                    .serve_connection(TokioIo::new(sock), svc);
                if let Err(e) = conn.await {
                    tracing::debug!("HttpServer {peer}: {e}");
                }
            });
        }
    })
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

/// Decodes `%XX` escapes; `None` for a malformed escape.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
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
        assert_eq!(resolve(root, "/missing"), Err(StatusCode::NOT_FOUND));
    }
}
