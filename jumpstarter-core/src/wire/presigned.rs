//! Presigned requests: resource handles that name an HTTP(S) URL the exporter fetches (`GET`,
//! for `flash` and `write`) or uploads to (`PUT`, for `dump` and `read`) itself, as upstream's
//! `PresignedRequestResource`. Upstream's client passes one when it is given an `http://` or
//! `https://` image, so the image goes from the server to the exporter without passing
//! through the client.
//!
//! - The URL is sent as written: its percent-encoding is kept (signed URLs are signed over
//!   their encoded form), and so is every redirect's `Location`.
//! - Redirects (301, 302, 303, 307, 308) are followed up to [`MAX_REDIRECTS`] times; a
//!   redirect back to a URL already visited is refused as a loop. Headers that carry
//!   credentials are dropped when a redirect leaves the origin.
//! - Bytes stream through a bounded pipe ([`super::resource::pipe`]): the body is never held
//!   whole, and a slow writer (the medium) slows the download down.
//! - Progress goes to the driver's log (and so to the client's `LogStream`) every
//!   [`PROGRESS_EVERY`], and once at the end.
//! - Errors name the status or the failure and the URL without its query (which may hold a
//!   signature).
//!
//! [`request`] sends one request by the same rules for clients inside the exporter (the
//! HTTP transport of opendal's `http` storage service).

use std::{
    collections::{HashMap, HashSet},
    io,
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use tokio::{net::TcpStream, sync::oneshot};
use tokio_rustls::rustls::{self, pki_types::ServerName};

use super::resource::{PipeReader, PipeWriter, ResourceStream, pipe};
use crate::DriverError;

/// How many redirects a request follows before giving up.
pub const MAX_REDIRECTS: usize = 10;
/// Connecting and receiving the response headers must finish within this.
const HEADERS_TIMEOUT: Duration = Duration::from_secs(60);
/// A body that sends nothing for this long is a failed transfer.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How often progress is logged during a transfer.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Where progress lines go (the driver's logger).
pub type ProgressFn = Arc<dyn Fn(String) + Send + Sync>;

/// The URL for messages, without what may hold a secret: the query and fragment become
/// `?[REDACTED]` (signatures, API tokens, `?user=..&password=..`), and the user
/// information `user:password@` becomes `[REDACTED]@`. Text that is not a URL is treated
/// the same way (everything before an `@` ahead of the first `/` is hidden).
pub fn redact(url: &str) -> String {
    let (base, query) = match url.split_once(['?', '#']) {
        Some((base, _)) => (base, "?[REDACTED]"),
        None => (url, ""),
    };
    // The scheme, when there is one (`http://`); otherwise the text starts with the host.
    let (scheme, rest) = match base.split_once("://") {
        Some((s, r))
            if !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) =>
        {
            (&base[..s.len() + 3], r)
        }
        _ => ("", base),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let rest = match rest[..authority_end].rfind('@') {
        Some(at) => format!("[REDACTED]{}", &rest[at..]),
        None => rest.to_string(),
    };
    format!("{scheme}{rest}{query}")
}

fn err(kind: io::ErrorKind, msg: String) -> io::Error {
    io::Error::new(kind, msg)
}

/// Opens a presigned request as a resource stream: `GET` fills its reading side with the
/// body, `PUT` sends what is written to it (its shutdown waits for the server's answer).
/// The request runs on a task of the current tokio runtime.
pub fn open(
    url: &str,
    method: &str,
    headers: &HashMap<String, String>,
    progress: ProgressFn,
) -> Result<ResourceStream, DriverError> {
    let target = Target::parse(url).map_err(DriverError::invalid)?;
    let mut hdrs = Vec::with_capacity(headers.len());
    for (k, v) in headers {
        let name = header::HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
            DriverError::InvalidArgument(format!("presigned request header {k:?} is not valid"))
        })?;
        let value = header::HeaderValue::from_str(v).map_err(|_| {
            DriverError::InvalidArgument(format!(
                "presigned request header {k:?} has a value that is not valid"
            ))
        })?;
        hdrs.push((name, value));
    }
    let rt = tokio::runtime::Handle::try_current()
        .map_err(|_| DriverError::Failed("presigned requests need a tokio runtime".into()))?;
    match method {
        "GET" => {
            let (writer, reader) = pipe();
            let (back, _unused) = pipe();
            rt.spawn(async move {
                match get(target, hdrs, &progress).await {
                    Ok((resp, target)) => stream_body(resp, writer, &target, &progress).await,
                    Err(e) => writer.fail(e),
                }
            });
            Ok(ResourceStream::presigned(reader, back, None))
        }
        "PUT" => {
            let (writer, body) = pipe();
            let (done_tx, done_rx) = oneshot::channel();
            let (finished, empty) = pipe();
            finished.finish_now();
            rt.spawn(async move {
                let r = put(target, hdrs, body, &progress).await;
                let _ = done_tx.send(r);
            });
            Ok(ResourceStream::presigned(empty, writer, Some(done_rx)))
        }
        other => Err(DriverError::InvalidArgument(format!(
            "presigned request method {other:?} is not supported (GET or PUT)"
        ))),
    }
}

/// A parsed `http(s)://` URL, its raw text kept for the request line.
#[derive(Clone)]
struct Target {
    url: String,
    https: bool,
    host: String,
    port: u16,
    authority: String,
    path_and_query: String,
}

impl Target {
    fn parse(url: &str) -> io::Result<Self> {
        let bad = |why: &str| {
            err(
                io::ErrorKind::InvalidInput,
                format!("URL {} {why}", redact(url)),
            )
        };
        let uri: Uri = url.parse().map_err(|_| bad("is not a valid URL"))?;
        let https = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("https") => true,
            Some(s) if s.eq_ignore_ascii_case("http") => false,
            _ => return Err(bad("is not http:// or https://")),
        };
        let authority = uri.authority().ok_or_else(|| bad("names no host"))?;
        if authority.as_str().contains('@') {
            return Err(bad(
                "holds credentials (user@host), which are not supported",
            ));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        if host.is_empty() {
            return Err(bad("names no host"));
        }
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let path_and_query = uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".into());
        Ok(Self {
            url: url.to_string(),
            https,
            host,
            port,
            authority: authority.as_str().to_string(),
            path_and_query,
        })
    }

    fn origin(&self) -> (bool, &str, u16) {
        (self.https, &self.host, self.port)
    }

    /// Resolves a redirect's `Location` against this URL, keeping its encoding as written.
    fn join(&self, location: &str) -> io::Result<Target> {
        let scheme = if self.https { "https" } else { "http" };
        // An absolute reference starts with a scheme (RFC 3986: a letter, then letters,
        // digits, `+`, `-`, `.`, then `:`); `Target::parse` refuses all but http(s).
        let has_scheme = location.split_once(':').is_some_and(|(scheme, _)| {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        });
        let next = if has_scheme {
            location.to_string()
        } else if location.starts_with("//") {
            format!("{scheme}:{location}")
        } else if location.starts_with('/') {
            format!("{scheme}://{}{location}", self.authority)
        } else {
            let path = self
                .path_and_query
                .split_once('?')
                .map_or(self.path_and_query.as_str(), |(p, _)| p);
            if location.starts_with('?') {
                format!("{scheme}://{}{path}{location}", self.authority)
            } else {
                let dir = path.rfind('/').map_or("/", |i| &path[..=i]);
                format!("{scheme}://{}{dir}{location}", self.authority)
            }
        };
        Target::parse(&next)
    }
}

fn tls_config() -> io::Result<Arc<rustls::ClientConfig>> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            // Bulk data: the suites cheapest per byte first.
            let provider = Arc::new(crate::tls::tls_provider());
            let builder = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS protocol versions: {e}", e = crate::error_chain(&e)))?;
            // Unreadable system certificates are skipped, as everywhere else.
            let roots =
                rustls::RootCertStore::from_iter(crate::tls::system_roots().iter().cloned());
            let mut config = builder.with_root_certificates(roots).with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        })
        .clone()
        .map_err(io::Error::other)
}

type Body = BoxBody<Bytes, io::Error>;

/// Sends one request on a fresh connection and returns the response headers.
async fn send(
    target: &Target,
    method: Method,
    headers: &[(header::HeaderName, header::HeaderValue)],
    body: Body,
    length: Option<u64>,
) -> io::Result<http::Response<hyper::body::Incoming>> {
    let url = redact(&target.url);
    let tcp = TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| {
            err(
                e.kind(),
                format!("cannot connect to {url}: {e}", e = crate::error_chain(&e)),
            )
        })?;
    let _ = tcp.set_nodelay(true);
    let mut builder = Request::builder()
        .method(method)
        .uri(target.path_and_query.as_str())
        .header(header::HOST, target.authority.as_str());
    for (k, v) in headers {
        builder = builder.header(k, v);
    }
    if let Some(n) = length {
        builder = builder.header(header::CONTENT_LENGTH, n);
    }
    let req = builder.body(body).map_err(|e| {
        err(
            io::ErrorKind::InvalidInput,
            format!(
                "cannot build the request for {url}: {e}",
                e = crate::error_chain(&e)
            ),
        )
    })?;
    let handshake_err = |e: hyper::Error| {
        err(
            io::ErrorKind::ConnectionAborted,
            format!("{url}: {e}", e = crate::error_chain(&e)),
        )
    };
    if target.https {
        let name = ServerName::try_from(target.host.clone()).map_err(|e| {
            err(
                io::ErrorKind::InvalidInput,
                format!("{url}: bad TLS name: {e}", e = crate::error_chain(&e)),
            )
        })?;
        let tls = tokio_rustls::TlsConnector::from(tls_config()?)
            .connect(name, tcp)
            .await
            .map_err(|e| {
                err(
                    e.kind(),
                    format!(
                        "TLS handshake with {url} failed: {e}",
                        e = crate::error_chain(&e)
                    ),
                )
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(handshake_err)?;
        tokio::spawn(conn);
        sender.send_request(req).await.map_err(handshake_err)
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(handshake_err)?;
        tokio::spawn(conn);
        sender.send_request(req).await.map_err(handshake_err)
    }
}

fn is_redirect(s: StatusCode) -> bool {
    matches!(s.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// Headers that carry credentials: dropped when a redirect leaves the origin.
fn is_sensitive(name: &header::HeaderName) -> bool {
    let n = name.as_str();
    ["authorization", "cookie", "proxy-authorization"].contains(&n)
        || ["x-amz-", "x-ms-", "x-goog-"]
            .iter()
            .any(|p| n.starts_with(p))
}

fn status_error(method: &str, status: StatusCode, target: &Target) -> io::Error {
    let kind = if status == StatusCode::NOT_FOUND {
        io::ErrorKind::NotFound
    } else if status == StatusCode::FORBIDDEN || status == StatusCode::UNAUTHORIZED {
        io::ErrorKind::PermissionDenied
    } else {
        io::ErrorKind::Other
    };
    err(
        kind,
        format!(
            "presigned HTTP {method} failed: status {status} for {}",
            redact(&target.url)
        ),
    )
}

/// `GET` with redirects followed by hand (bounded, loops refused, encoding kept); returns a
/// successful response and the URL that gave it.
async fn get(
    target: Target,
    headers: Vec<(header::HeaderName, header::HeaderValue)>,
    progress: &ProgressFn,
) -> io::Result<(http::Response<hyper::body::Incoming>, Target)> {
    let (resp, target) = follow(
        Method::GET,
        "presigned HTTP GET",
        target,
        headers,
        Some(progress),
    )
    .await?;
    if !resp.status().is_success() {
        return Err(status_error("GET", resp.status(), &target));
    }
    Ok((resp, target))
}

/// Sends a request without a body (`GET`, `HEAD`) and follows its redirects by hand:
/// at most [`MAX_REDIRECTS`], a loop refused, every `Location` kept as written, credentials
/// dropped when leaving the origin, each hop reported to `progress`. Returns the first
/// answer that is not a redirect, whatever its status, and the URL that gave it. `what`
/// names the request in errors.
/// How long a bodiless request waits before its one retry after a reset connection.
const RESET_RETRY: Duration = Duration::from_millis(50);

/// [`send`] of a request without a body (`GET`, `HEAD`: idempotent), tried once more when
/// its fresh connection was reset or broke off before any answer: a server stopping while
/// the connection sat in its accept queue (or a listening socket a forked process still held
/// for a moment) accepts and then resets it; the retry then meets the closed port and says
/// so ("cannot connect"), or reaches a server that is up again.
async fn send_bodiless(
    target: &Target,
    method: Method,
    headers: &[(header::HeaderName, header::HeaderValue)],
) -> io::Result<http::Response<hyper::body::Incoming>> {
    let empty = || -> Body { Empty::new().map_err(|never| match never {}).boxed() };
    match send(target, method.clone(), headers, empty(), None).await {
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
            ) =>
        {
            tracing::debug!("{e}; trying once more");
            tokio::time::sleep(RESET_RETRY).await;
            send(target, method, headers, empty(), None).await
        }
        r => r,
    }
}

async fn follow(
    method: Method,
    what: &str,
    mut target: Target,
    mut headers: Vec<(header::HeaderName, header::HeaderValue)>,
    progress: Option<&ProgressFn>,
) -> io::Result<(http::Response<hyper::body::Incoming>, Target)> {
    let first = redact(&target.url);
    let mut seen = HashSet::new();
    for _ in 0..=MAX_REDIRECTS {
        seen.insert(target.url.clone());
        let resp = tokio::time::timeout(
            HEADERS_TIMEOUT,
            send_bodiless(&target, method.clone(), &headers),
        )
        .await
        .map_err(|_| {
            err(
                io::ErrorKind::TimedOut,
                format!(
                    "{what}: no answer from {} within {}s",
                    redact(&target.url),
                    HEADERS_TIMEOUT.as_secs()
                ),
            )
        })??;
        let status = resp.status();
        if !is_redirect(status) {
            return Ok((resp, target));
        }
        let location = resp
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                err(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{what} redirect ({status}) missing Location header (or not a \
                         usable one) for {}",
                        redact(&target.url)
                    ),
                )
            })?
            .to_string();
        let next = target.join(&location)?;
        if seen.contains(&next.url) {
            return Err(err(
                io::ErrorKind::InvalidData,
                format!(
                    "{what}: Too many redirects ({MAX_REDIRECTS}) for {first}: a redirect \
                     loop, {} redirects back to {}",
                    redact(&target.url),
                    redact(&next.url)
                ),
            ));
        }
        if next.origin() != target.origin() {
            headers.retain(|(k, _)| !is_sensitive(k));
        }
        if let Some(progress) = progress {
            progress(format!(
                "redirected ({}) from {} to {}",
                status.as_u16(),
                redact(&target.url),
                redact(&next.url)
            ));
        }
        target = next;
    }
    Err(err(
        io::ErrorKind::InvalidData,
        format!("{what}: Too many redirects ({MAX_REDIRECTS}) for {first}"),
    ))
}

/// One HTTP(S) request for a client inside the exporter (the HTTP transport of opendal's
/// `http` storage service), with the rules of presigned requests: the URL and every
/// redirect's `Location` sent as written, TLS with the system's roots, no answer within
/// 60 s an error.
///
/// `GET` and `HEAD` follow redirects ([`MAX_REDIRECTS`] at most, loops refused,
/// credentials dropped across origins); other methods send `body` once and return what
/// comes back. The answer is returned whatever its status: the caller interprets it. Its
/// body streams; the caller bounds how long it waits for each piece.
pub async fn request(
    method: Method,
    url: &str,
    headers: &http::HeaderMap,
    body: Bytes,
) -> io::Result<http::Response<hyper::body::Incoming>> {
    let target = Target::parse(url)?;
    // `Host` and `Content-Length` are the request's own, set from the URL and the body.
    let headers: Vec<_> = headers
        .iter()
        .filter(|(k, _)| **k != header::HOST && **k != header::CONTENT_LENGTH)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let what = format!("HTTP {method}");
    if (method == Method::GET || method == Method::HEAD) && body.is_empty() {
        return follow(method, &what, target, headers, None)
            .await
            .map(|(resp, _)| resp);
    }
    let length = body.len() as u64;
    let body: Body = http_body_util::Full::new(body)
        .map_err(|never| match never {})
        .boxed();
    tokio::time::timeout(
        HEADERS_TIMEOUT,
        send(&target, method, &headers, body, Some(length)),
    )
    .await
    .map_err(|_| {
        err(
            io::ErrorKind::TimedOut,
            format!(
                "{what}: no answer from {} within {}s",
                redact(url),
                HEADERS_TIMEOUT.as_secs()
            ),
        )
    })?
}

/// Counts bytes and logs progress every [`PROGRESS_EVERY`].
struct Meter<'a> {
    verb: &'static str,
    url: String,
    total: Option<u64>,
    done: u64,
    start: Instant,
    last: Instant,
    progress: &'a ProgressFn,
}

impl<'a> Meter<'a> {
    fn new(verb: &'static str, url: &str, total: Option<u64>, progress: &'a ProgressFn) -> Self {
        let now = Instant::now();
        Self {
            verb,
            url: redact(url),
            total,
            done: 0,
            start: now,
            last: now,
            progress,
        }
    }

    fn line(&self) -> String {
        const MIB: f64 = 1024.0 * 1024.0;
        let secs = self.start.elapsed().as_secs_f64().max(0.001);
        let of = self
            .total
            .map(|t| format!(" of {:.1} MiB", t as f64 / MIB))
            .unwrap_or_default();
        format!(
            "{} {:.1} MiB{of} ({} bytes) {} {} in {:.1}s, {:.1} MiB/s",
            self.verb,
            self.done as f64 / MIB,
            self.done,
            if self.verb == "downloaded" {
                "from"
            } else {
                "to"
            },
            self.url,
            secs,
            self.done as f64 / MIB / secs
        )
    }

    fn add(&mut self, n: usize) {
        self.done += n as u64;
        if self.last.elapsed() >= PROGRESS_EVERY {
            self.last = Instant::now();
            (self.progress)(self.line());
        }
    }

    fn finish(&self) {
        (self.progress)(self.line());
    }
}

/// Streams a response body into the pipe (backpressure from the pipe's reader).
async fn stream_body(
    resp: http::Response<hyper::body::Incoming>,
    mut writer: PipeWriter,
    target: &Target,
    progress: &ProgressFn,
) {
    let total = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let mut meter = Meter::new("downloaded", &target.url, total, progress);
    let mut body = resp.into_body();
    loop {
        let frame = match tokio::time::timeout(IDLE_TIMEOUT, body.frame()).await {
            Err(_) => {
                return writer.fail(err(
                    io::ErrorKind::TimedOut,
                    format!(
                        "presigned HTTP GET: {} sent nothing for {}s",
                        redact(&target.url),
                        IDLE_TIMEOUT.as_secs()
                    ),
                ));
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return writer.fail(err(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "presigned HTTP GET stream interrupted for {}: {e}",
                        redact(&target.url),
                        e = crate::error_chain(&e)
                    ),
                ));
            }
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let n = data.len();
        if writer.send(data).await.is_err() {
            // The driver stopped reading (it failed or was cancelled): nothing to report to.
            return;
        }
        meter.add(n);
    }
    if let Some(t) = total
        && meter.done != t
    {
        return writer.fail(err(
            io::ErrorKind::UnexpectedEof,
            format!(
                "presigned HTTP GET from {} ended after {} of {t} bytes",
                redact(&target.url),
                meter.done
            ),
        ));
    }
    meter.finish();
    writer.finish_now();
}

/// `PUT` of what the driver writes into `body`, as a chunked request.
async fn put(
    target: Target,
    headers: Vec<(header::HeaderName, header::HeaderValue)>,
    mut body: PipeReader,
    progress: &ProgressFn,
) -> io::Result<()> {
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Frame<Bytes>>>(2);
    let url = target.url.clone();
    let progress2 = progress.clone();
    let pump = async move {
        let mut meter = Meter::new("uploaded", &url, None, &progress2);
        loop {
            match body.chunk().await {
                Ok(Some(b)) => {
                    let n = b.len();
                    if tx.send(Ok(Frame::data(b))).await.is_err() {
                        return;
                    }
                    meter.add(n);
                }
                Ok(None) => {
                    meter.finish();
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
    };
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let body: Body = BodyExt::boxed(StreamBody::new(stream));
    let request = async {
        let resp = send(&target, Method::PUT, &headers, body, None).await?;
        let status = resp.status();
        // Drain a small answer so that the connection ends cleanly.
        let _ = tokio::time::timeout(HEADERS_TIMEOUT, resp.into_body().collect()).await;
        if !status.is_success() {
            return Err(status_error("PUT", status, &target));
        }
        Ok(())
    };
    let (_, r) = tokio::join!(pump, request);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_keeps_encoding() {
        let t = Target::parse("http://127.0.0.1:80/a/b%2Fc/img%40x.raw?X-Sig=a%2Bb").unwrap();
        assert_eq!(t.path_and_query, "/a/b%2Fc/img%40x.raw?X-Sig=a%2Bb");
        assert_eq!(t.join("/x%20y").unwrap().url, "http://127.0.0.1:80/x%20y");
        assert_eq!(
            t.join("z%3D.img?s=%2F").unwrap().url,
            "http://127.0.0.1:80/a/b%2Fc/z%3D.img?s=%2F"
        );
        assert_eq!(t.join("//[::1]:9/p").unwrap().url, "http://[::1]:9/p");
        assert_eq!(t.join("//[::1]:9/p").unwrap().host, "::1");
        assert!(t.join("ftp://x/").is_err());
        assert!(Target::parse("http://user:pw@host/").is_err());
        assert!(Target::parse("file:///etc/passwd").is_err());
        assert!(Target::parse("http://host/a b").is_err());
    }

    #[test]
    fn redact_drops_query() {
        assert_eq!(redact("http://h/p?sig=1"), "http://h/p?[REDACTED]");
        assert_eq!(redact("http://h/p"), "http://h/p");
    }

    #[test]
    fn redact_drops_user_information() {
        for (url, shown) in [
            ("http://u:pw@h/p", "http://[REDACTED]@h/p"),
            (
                "https://u:pw@h:8/p?t=1",
                "https://[REDACTED]@h:8/p?[REDACTED]",
            ),
            ("http://a@b:pw@h", "http://[REDACTED]@h"),
            ("u:pw@h/p", "[REDACTED]@h/p"),
            ("http://h/a@b", "http://h/a@b"),
            ("http://h#u:pw@x", "http://h?[REDACTED]"),
            ("/local/path", "/local/path"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
        let Err(e) = Target::parse("http://user:hunter2@host/") else {
            panic!("credentials in the URL accepted");
        };
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    use std::sync::Mutex;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpListener;

    /// A tiny HTTP/1.1 server on loopback: routes by the raw request target (so that
    /// percent-encoding is seen as sent), one request per connection.
    struct Server {
        port: u16,
        requests: Arc<Mutex<Vec<String>>>,
        uploads: Arc<Mutex<Vec<Vec<u8>>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    fn body_of(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    async fn read_chunked<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).await.unwrap() == 0 {
                return out;
            }
            let n = usize::from_str_radix(line.trim(), 16).unwrap();
            if n == 0 {
                let mut end = String::new();
                r.read_line(&mut end).await.unwrap();
                return out;
            }
            let mut buf = vec![0; n + 2];
            r.read_exact(&mut buf).await.unwrap();
            out.extend_from_slice(&buf[..n]);
        }
    }

    async fn server() -> Server {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let uploads = Arc::new(Mutex::new(Vec::new()));
        let (reqs, ups) = (requests.clone(), uploads.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = l.accept().await else {
                    return;
                };
                let (reqs, ups) = (reqs.clone(), ups.clone());
                tokio::spawn(async move {
                    let mut r = BufReader::new(sock);
                    let mut line = String::new();
                    r.read_line(&mut line).await.unwrap();
                    let mut parts = line.split_whitespace();
                    let method = parts.next().unwrap_or_default().to_string();
                    let target = parts.next().unwrap_or_default().to_string();
                    let mut chunked = false;
                    let mut auth = false;
                    loop {
                        let mut h = String::new();
                        r.read_line(&mut h).await.unwrap();
                        let lower = h.to_ascii_lowercase();
                        chunked |= lower.starts_with("transfer-encoding: chunked");
                        auth |= lower.starts_with("authorization:");
                        if h == "\r\n" || h.is_empty() {
                            break;
                        }
                    }
                    reqs.lock()
                        .unwrap()
                        .push(format!("{method} {target} auth={auth}"));
                    let redirect = |code: u16, to: &str| {
                        format!("HTTP/1.1 {code} R\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n")
                            .into_bytes()
                    };
                    let ok = |body: &[u8]| {
                        let mut v =
                            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len())
                                .into_bytes();
                        v.extend_from_slice(body);
                        v
                    };
                    let status = |code: u16| {
                        format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n").into_bytes()
                    };
                    let answer = match (method.as_str(), target.as_str()) {
                        ("GET", "/file") => ok(&body_of(3 * 1024 * 1024 + 17)),
                        ("GET", "/r1") => redirect(302, "/r2"),
                        ("GET", "/r2") => redirect(307, "r3"),
                        ("GET", "/r3") => redirect(301, &format!("http://localhost:{port}/file")),
                        ("GET", "/loop-a") => redirect(302, "/loop-b"),
                        ("GET", "/loop-b") => redirect(308, "/loop-a"),
                        ("GET", t) if t.starts_with("/many") => {
                            let n: u32 = t[5..].parse().unwrap_or(0);
                            redirect(302, &format!("/many{}", n + 1))
                        }
                        ("GET", "/enc/a%2Fb%40c.img?sig=x%2By") => ok(b"encoded ok"),
                        ("GET", "/to-enc") => redirect(302, "/enc/a%2Fb%40c.img?sig=x%2By"),
                        ("GET", "/no-location") => status(302),
                        ("HEAD", "/file") => format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                            3 * 1024 * 1024 + 17
                        )
                        .into_bytes(),
                        ("HEAD", "/r1") => redirect(302, "/file"),
                        ("POST", "/r1") => redirect(302, "/file"),
                        ("GET", "/short") => {
                            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten..".to_vec()
                        }
                        ("PUT", "/up") | ("PUT", "/forbidden") => {
                            let data = if chunked {
                                read_chunked(&mut r).await
                            } else {
                                Vec::new()
                            };
                            ups.lock().unwrap().push(data);
                            if target == "/up" {
                                status(201)
                            } else {
                                status(403)
                            }
                        }
                        _ => status(404),
                    };
                    let mut sock = r.into_inner();
                    let _ = sock.write_all(&answer).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        Server {
            port,
            requests,
            uploads,
            task,
        }
    }

    fn collector() -> (ProgressFn, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l2 = lines.clone();
        (Arc::new(move |s| l2.lock().unwrap().push(s)), lines)
    }

    async fn fetch(url: &str, headers: &[(&str, &str)]) -> (io::Result<Vec<u8>>, Vec<String>) {
        let (p, lines) = collector();
        let h = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut s = open(url, "GET", &h, p).unwrap();
        let mut out = Vec::new();
        let r = s.read_to_end(&mut out).await.map(|_| out);
        let lines = lines.lock().unwrap().clone();
        (r, lines)
    }

    #[tokio::test]
    async fn get_streams_the_body_and_logs_progress() {
        let srv = server().await;
        let (r, lines) = fetch(&format!("http://127.0.0.1:{}/file", srv.port), &[]).await;
        assert_eq!(r.unwrap(), body_of(3 * 1024 * 1024 + 17));
        let last = lines.last().unwrap();
        assert!(
            last.contains("downloaded") && last.contains("3145745 bytes"),
            "{lines:?}"
        );
    }

    #[tokio::test]
    async fn get_follows_a_redirect_chain_dropping_credentials_across_origins() {
        let srv = server().await;
        let (r, lines) = fetch(
            &format!("http://127.0.0.1:{}/r1", srv.port),
            &[("Authorization", "Bearer x")],
        )
        .await;
        assert_eq!(r.unwrap().len(), 3 * 1024 * 1024 + 17);
        let reqs = srv.requests.lock().unwrap().clone();
        assert_eq!(
            reqs,
            [
                "GET /r1 auth=true",
                "GET /r2 auth=true",
                "GET /r3 auth=true",
                "GET /file auth=false"
            ]
        );
        assert_eq!(
            lines.iter().filter(|l| l.starts_with("redirected")).count(),
            3
        );
    }

    #[tokio::test]
    async fn get_keeps_percent_encoding_through_redirects() {
        let srv = server().await;
        let url = format!("http://127.0.0.1:{}/enc/a%2Fb%40c.img?sig=x%2By", srv.port);
        assert_eq!(fetch(&url, &[]).await.0.unwrap(), b"encoded ok");
        let url = format!("http://127.0.0.1:{}/to-enc", srv.port);
        assert_eq!(fetch(&url, &[]).await.0.unwrap(), b"encoded ok");
    }

    #[tokio::test]
    async fn get_refuses_loops_404s_and_broken_bodies() {
        let srv = server().await;
        let base = format!("http://127.0.0.1:{}", srv.port);
        // Upstream's wording is in each message, as scripts match it.
        let e = fetch(&format!("{base}/loop-a"), &[]).await.0.unwrap_err();
        assert!(e.to_string().contains("Too many redirects (10) for"), "{e}");
        assert!(e.to_string().contains("redirect loop"), "{e}");
        let e = fetch(&format!("{base}/many0"), &[]).await.0.unwrap_err();
        assert!(e.to_string().contains("Too many redirects (10) for"), "{e}");
        let e = fetch(&format!("{base}/missing?sig=secret"), &[])
            .await
            .0
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("404"), "{e}");
        assert!(
            !e.to_string().contains("secret"),
            "the query is redacted: {e}"
        );
        let e = fetch(&format!("{base}/no-location"), &[])
            .await
            .0
            .unwrap_err();
        assert!(e.to_string().contains("missing Location header"), "{e}");
        let e = fetch(&format!("{base}/short"), &[]).await.0.unwrap_err();
        assert!(
            e.to_string().contains("interrupted") || e.to_string().contains("ended after"),
            "{e}"
        );
        // Nothing listens on this port once the listener is gone.
        let dead = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let e = fetch(&format!("http://{dead}/x"), &[]).await.0.unwrap_err();
        assert!(e.to_string().contains("cannot connect"), "{e}");
    }

    /// A GET whose first connection is accepted and closed without an answer (a server
    /// stopping, restarting) is tried once more; a POST is not (it may have been done).
    #[tokio::test]
    async fn a_bodiless_request_reset_before_any_answer_is_tried_once_more() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = l.accept().await {
                let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut head = [0u8; 1024];
                let _ = sock.read(&mut head).await;
                // The first connection of each request goes unanswered.
                if n % 2 == 1 {
                    let _ = sock
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .await;
                }
            }
        });
        let url = format!("http://{addr}/x");
        let resp = request(Method::GET, &url, &http::HeaderMap::new(), Bytes::new())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
        let e = request(
            Method::POST,
            &url,
            &http::HeaderMap::new(),
            Bytes::from("x"),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains(&url), "{e}");
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn bad_requests_are_refused_before_anything_is_sent() {
        let (p, _) = collector();
        let h = HashMap::new();
        assert!(open("ftp://127.0.0.1/x", "GET", &h, p.clone()).is_err());
        assert!(open("http://127.0.0.1/x", "DELETE", &h, p.clone()).is_err());
        let bad = HashMap::from([("bad header".to_string(), "v".to_string())]);
        assert!(open("http://127.0.0.1/x", "GET", &bad, p).is_err());
    }

    #[tokio::test]
    async fn put_uploads_what_is_written_and_reports_the_answer() {
        let srv = server().await;
        let (p, lines) = collector();
        let mut s = open(
            &format!("http://127.0.0.1:{}/up", srv.port),
            "PUT",
            &HashMap::new(),
            p,
        )
        .unwrap();
        let data = body_of(1024 * 1024 + 3);
        for c in data.chunks(70_000) {
            s.write_all(c).await.unwrap();
        }
        s.shutdown().await.unwrap();
        assert_eq!(srv.uploads.lock().unwrap().clone(), vec![data]);
        assert!(lines.lock().unwrap().iter().any(|l| l.contains("uploaded")));

        let (p, _) = collector();
        let mut s = open(
            &format!("http://127.0.0.1:{}/forbidden", srv.port),
            "PUT",
            &HashMap::new(),
            p,
        )
        .unwrap();
        s.write_all(b"x").await.unwrap();
        let e = s.shutdown().await.unwrap_err();
        assert!(e.to_string().contains("403"), "{e}");
    }

    #[tokio::test]
    async fn request_follows_redirects_of_get_and_head_only_and_returns_any_status() {
        let srv = server().await;
        let base = format!("http://127.0.0.1:{}", srv.port);
        let mut auth = http::HeaderMap::new();
        auth.insert(header::AUTHORIZATION, "Bearer x".parse().unwrap());
        let r = request(Method::HEAD, &format!("{base}/r1"), &auth, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_LENGTH], "3145745");
        let r = request(Method::GET, &format!("{base}/r1"), &auth, Bytes::new())
            .await
            .unwrap();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), 3 * 1024 * 1024 + 17);
        // Another method gets the redirect itself, and a 404 is an answer, not an error.
        let r = request(Method::POST, &format!("{base}/r1"), &auth, Bytes::from("x"))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FOUND);
        let r = request(Method::GET, &format!("{base}/missing"), &auth, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            srv.requests.lock().unwrap().clone(),
            [
                "HEAD /r1 auth=true",
                "HEAD /file auth=true",
                "GET /r1 auth=true",
                "GET /r2 auth=true",
                "GET /r3 auth=true",
                "GET /file auth=false",
                "POST /r1 auth=true",
                "GET /missing auth=true"
            ]
        );
        let e = request(Method::GET, &format!("{base}/loop-a"), &auth, Bytes::new())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("redirect loop"), "{e}");
        let e = request(Method::GET, "ftp://127.0.0.1/x", &auth, Bytes::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
