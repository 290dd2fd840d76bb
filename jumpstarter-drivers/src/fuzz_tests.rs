//! Fuzz targets of the drivers' parsers of bytes from the network: the TFTP and HTTP boot
//! servers' request parsing (here, driven over loopback sockets through the drivers' public
//! API, as a board or an attacker on the lab network would) and SNMP's BER and message
//! decoding (`snmp/fuzz_tests.rs`, beside the private modules it reaches).
//!
//! They run under `cargo test` (and so in `cargo xtask ci`) with proptest: a bounded number
//! of random inputs and mutations of valid ones, asserting that nothing panics, that a
//! server still serves a valid request after any input, and that what is accepted is
//! answered exactly as the RFCs say (the file's bytes, its ranges, the options
//! acknowledged). (cargo-fuzz needs a nightly compiler, which this project does not use.)
//!
//! [`fuzz_config`] is the one knob of the case count: `JUMPSTARTER_FUZZ_CASES` (what `cargo
//! xtask fuzz --cases N` sets), else `PROPTEST_CASES`, else 512 (`jumpstarter-core/src/fuzz_support.rs`).

use std::{
    net::SocketAddr,
    path::{Component, Path, PathBuf},
    sync::{Arc, OnceLock},
    time::Duration,
};

use jumpstarter_core::{CallContext, Driver, driver::DriverArgs, value::from_value};
use proptest::prelude::*;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpStream, UdpSocket},
};

use crate::{HttpServer, Tftp};

#[path = "../../jumpstarter-core/src/fuzz_support.rs"]
mod fuzz_support;
pub(crate) use fuzz_support::{edits, fuzz_config, mutate_bytes};

/// Bytes shown as an escaped byte string in a failure's report.
#[derive(Clone, PartialEq)]
pub(crate) struct Shown(pub(crate) Vec<u8>);

impl std::fmt::Debug for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "b\"{}\"", self.0.escape_ascii())
    }
}

/// Random bytes or a mutation of one of `seeds`.
fn bytes_or_mutation(seeds: &'static [&'static [u8]]) -> impl Strategy<Value = Shown> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300).prop_map(Shown),
        (prop::sample::select(seeds), edits()).prop_map(|(s, e)| Shown(mutate_bytes(s, &e))),
    ]
}

/// The runtime the servers under test run on (shared by the targets, which run in parallel).
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

/// Bytes 0, 7, 14, ... (mod 251) of length `len`: a file whose every offset is recognisable.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

/// A boot server driver serving a fresh directory on a loopback port.
struct Served {
    _dir: tempfile::TempDir,
    root: PathBuf,
    addr: SocketAddr,
    _driver: Arc<dyn Driver>,
}

/// The files both servers serve (name, length).
const FILES: &[(&str, usize)] = &[
    ("kernel", 1300),
    ("exact", 512),
    ("hello", 5),
    ("empty", 0),
    ("boot/vmlinuz", 3000),
    ("a b.img", 10),
    ("pxelinux.cfg/default", 700),
];

fn serve(
    ctor: fn(&DriverArgs) -> Result<Arc<dyn Driver>, jumpstarter_core::DriverError>,
    extra: serde_json::Value,
) -> Served {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    for (name, len) in FILES {
        let p = root.join(name);
        std::fs::create_dir_all(p.parent().expect("a parent")).expect("mkdir");
        std::fs::write(&p, pattern(*len)).expect("write");
    }
    std::fs::create_dir_all(root.join("boot/dtbs")).expect("mkdir");
    let mut config = serde_json::json!({
        "root_dir": root,
        "host": "127.0.0.1",
        "port": 0,
        "remove_created_on_close": false,
    });
    if let (Some(c), serde_json::Value::Object(extra)) = (config.as_object_mut(), extra) {
        c.extend(extra);
    }
    let driver = ctor(&DriverArgs { config }).expect("the driver builds");
    let port = runtime().block_on(async {
        let ctx = || CallContext::detached("fuzz");
        driver
            .clone()
            .call(ctx(), "start".into(), vec![])
            .await
            .expect("start");
        let v = driver
            .clone()
            .call(ctx(), "get_port".into(), vec![])
            .await
            .expect("get_port");
        from_value::<u16>(v).expect("a port")
    });
    let root = std::fs::canonicalize(&root).expect("canonical root");
    Served {
        _dir: dir,
        root,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        _driver: driver,
    }
}

// ---------------------------------------------------------------------------------------
// TFTP (RFC 1350, option negotiation RFC 2347, blksize RFC 2348, tsize/timeout RFC 2349)

const RRQ: u16 = 1;
const DATA: u16 = 3;
const ACK: u16 = 4;
const ERROR: u16 = 5;
const OACK: u16 = 6;

fn tftp() -> &'static Served {
    static S: OnceLock<Served> = OnceLock::new();
    S.get_or_init(|| serve(Tftp::from_args, serde_json::json!({})))
}

/// A request packet: the opcode, then each part NUL-terminated.
fn tftp_packet(opcode: u16, parts: &[&str]) -> Vec<u8> {
    let mut p = opcode.to_be_bytes().to_vec();
    for s in parts {
        p.extend_from_slice(s.as_bytes());
        p.push(0);
    }
    p
}

/// Valid (and nearly valid) requests the mutations start from.
fn tftp_seeds() -> &'static [&'static [u8]] {
    static SEEDS: OnceLock<Vec<&'static [u8]>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        [
            tftp_packet(RRQ, &["kernel", "octet"]),
            tftp_packet(
                RRQ,
                &[
                    "pxelinux.cfg/default",
                    "netascii",
                    "blksize",
                    "1428",
                    "tsize",
                    "0",
                ],
            ),
            tftp_packet(RRQ, &["/exact", "OCTET", "timeout", "3", "blksize", "64"]),
            tftp_packet(RRQ, &["empty", "octet", "tsize", "0", "windowsize", "4"]),
            tftp_packet(RRQ, &["../etc/passwd", "octet"]),
            tftp_packet(2, &["kernel", "octet"]),
            tftp_packet(ACK, &[]),
            [&[0, 5, 0, 4][..], b"bounce me\0"].concat(),
        ]
        .into_iter()
        .map(|p| &*Box::leak(p.into_boxed_slice()))
        .collect()
    })
}

/// What the server must do with a datagram sent to its port.
#[derive(Debug, PartialEq)]
enum TftpExpect {
    /// An ERROR packet with this code, from the server's port.
    Refused(u16),
    /// An ERROR packet must not be answered (RFC 1350: "error packets are not acknowledged").
    NotAnswered,
    /// A read request: a transfer from a port of its own.
    Read {
        name: String,
        blksize: Option<usize>,
        tsize: bool,
        timeout: Option<u64>,
    },
}

/// RFC 1350/2347/2348/2349 read requests, as the server's module docs promise to take them:
/// an error packet is not answered, a WRQ is refused as an access violation (the server is
/// read-only), anything else but a well-formed RRQ as an illegal operation. Options a server does not take (unknown names,
/// values out of range, names or values that are not UTF-8) are left out of the OACK; the
/// last of a repeated option counts. (A `timeout` in RFC 2349's range may be left out too:
/// see [`tftp_exchange`].)
fn tftp_model(p: &[u8]) -> TftpExpect {
    use TftpExpect::*;
    // An error packet (even a short one) is never answered.
    if p.starts_with(&ERROR.to_be_bytes()) {
        return NotAnswered;
    }
    if p.len() < 4 {
        return Refused(4);
    }
    match u16::from_be_bytes([p[0], p[1]]) {
        RRQ => {}
        2 => return Refused(2),
        _ => return Refused(4),
    }
    let Some(body) = p[2..].strip_suffix(&[0]) else {
        return Refused(4);
    };
    let fields: Vec<&[u8]> = body.split(|b| *b == 0).collect();
    if fields.len() < 2 || !fields.len().is_multiple_of(2) {
        return Refused(4);
    }
    let Ok(name) = std::str::from_utf8(fields[0]) else {
        return Refused(4);
    };
    if name.is_empty() || name.len() > 255 {
        return Refused(4);
    }
    match std::str::from_utf8(fields[1]).map(str::to_ascii_lowercase) {
        Ok(m) if m == "octet" || m == "netascii" => {}
        _ => return Refused(4),
    }
    let (mut blksize, mut tsize, mut timeout) = (None, false, None);
    for pair in fields[2..].chunks(2) {
        let (Ok(n), Ok(v)) = (std::str::from_utf8(pair[0]), std::str::from_utf8(pair[1])) else {
            continue;
        };
        match n.to_ascii_lowercase().as_str() {
            "blksize" => {
                blksize = v
                    .parse::<usize>()
                    .ok()
                    .filter(|b| *b >= 8)
                    .map(|b| b.min(65464));
            }
            "tsize" => tsize = true,
            "timeout" => timeout = v.parse::<u64>().ok().filter(|t| (1..=255).contains(t)),
            _ => {}
        }
    }
    Read {
        name: name.to_string(),
        blksize,
        tsize,
        timeout,
    }
}

/// The file a request names beneath `root` (a leading `/` is the root), or the error code:
/// `..` or a root anywhere is an access violation; a missing file or a directory is not found.
fn tftp_file(root: &Path, name: &str) -> Result<PathBuf, u16> {
    let mut path = root.to_path_buf();
    for c in Path::new(name.trim_start_matches('/')).components() {
        match c {
            Component::Normal(n) => path.push(n),
            Component::CurDir => {}
            _ => return Err(2),
        }
    }
    if path.is_file() { Ok(path) } else { Err(1) }
}

async fn recv_from(sock: &UdpSocket) -> Result<(Vec<u8>, SocketAddr), TestCaseError> {
    let mut buf = vec![0u8; 66_000];
    let (n, from) = tokio::time::timeout(Duration::from_secs(5), sock.recv_from(&mut buf))
        .await
        .map_err(|_| TestCaseError::fail("no answer within 5 s"))?
        .map_err(|e| TestCaseError::fail(format!("recv: {e}")))?;
    buf.truncate(n);
    Ok((buf, from))
}

fn opcode(p: &[u8]) -> u16 {
    match p {
        [a, b, ..] => u16::from_be_bytes([*a, *b]),
        _ => 0,
    }
}

/// Checks an ERROR packet: code `code` (any when `None`), a NUL-terminated UTF-8 message.
fn check_error(p: &[u8], code: Option<u16>) -> Result<(), TestCaseError> {
    prop_assert_eq!(opcode(p), ERROR, "not an ERROR packet: {:?}", p);
    prop_assert!(p.len() >= 5 && p.ends_with(&[0]), "malformed ERROR {:?}", p);
    if let Some(code) = code {
        prop_assert_eq!(u16::from_be_bytes([p[2], p[3]]), code, "{:?}", p);
    }
    prop_assert!(std::str::from_utf8(&p[4..p.len() - 1]).is_ok());
    Ok(())
}

/// Receives the rest of a transfer whose first packet is `first`, ACKing every block, and
/// checks that it carries `want` in blocks of `blksize`. Before ACKing block `b`, sends
/// `strays[b]` if any; returns `false` if a stray ERROR packet ended the transfer.
async fn tftp_receive(
    sock: &UdpSocket,
    tid: SocketAddr,
    mut first: Option<Vec<u8>>,
    blksize: usize,
    want: &[u8],
    strays: &[Option<Vec<u8>>],
) -> Result<bool, TestCaseError> {
    let mut got = Vec::new();
    let mut block: u16 = 1;
    loop {
        let p = match first.take() {
            Some(p) => p,
            None => {
                let (p, from) = recv_from(sock).await?;
                prop_assert_eq!(from, tid, "a packet from another port");
                p
            }
        };
        prop_assert_eq!(opcode(&p), DATA, "expected DATA {}, got {:?}", block, p);
        prop_assert_eq!(u16::from_be_bytes([p[2], p[3]]), block);
        let data = &p[4..];
        prop_assert!(
            data.len() <= blksize,
            "block of {} > {}",
            data.len(),
            blksize
        );
        got.extend_from_slice(data);
        if let Some(Some(stray)) = strays.get(usize::from(block)) {
            sock.send_to(stray, tid).await.expect("send");
            if stray.len() >= 4 && opcode(stray) == ERROR {
                return Ok(false);
            }
        }
        let mut ack = ACK.to_be_bytes().to_vec();
        ack.extend_from_slice(&block.to_be_bytes());
        sock.send_to(&ack, tid).await.expect("send");
        if data.len() < blksize {
            break;
        }
        block = block.wrapping_add(1);
    }
    prop_assert!(
        got == want,
        "the transfer carried {} bytes, not the file's {}",
        got.len(),
        want.len()
    );
    Ok(true)
}

/// Sends `packet` to the server and checks the answer against [`tftp_model`]; a transfer
/// it starts is received to its end.
async fn tftp_exchange(s: &Served, packet: &[u8]) -> Result<(), TestCaseError> {
    let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    sock.send_to(packet, s.addr).await.expect("send");
    match tftp_model(packet) {
        TftpExpect::Refused(code) => {
            let (p, from) = recv_from(&sock).await?;
            prop_assert_eq!(from, s.addr, "a refusal comes from the server's port");
            check_error(&p, Some(code))?;
        }
        // Answering would let two servers bounce errors forever (the "Loop DoS",
        // CVE-2024-2169). The server reads its port's datagrams in order: the first answer
        // must be the one to a write request sent next.
        TftpExpect::NotAnswered => {
            sock.send_to(&tftp_packet(2, &["f", "octet"]), s.addr)
                .await
                .expect("send");
            let (p, from) = recv_from(&sock).await?;
            prop_assert_eq!(from, s.addr);
            check_error(&p, Some(2))?;
        }
        TftpExpect::Read {
            name,
            blksize,
            tsize,
            timeout,
        } => {
            let (p, tid) = recv_from(&sock).await?;
            prop_assert!(tid != s.addr, "a transfer comes from a port of its own");
            let path = match tftp_file(&s.root, &name) {
                Ok(path) => path,
                Err(code) => return check_error(&p, Some(code)),
            };
            let want = std::fs::read(path).expect("read");
            // blksize and tsize as asked; a timeout in RFC 2349's range with its value, or
            // left out (RFC 2347 lets a server ignore an option; the server caps it lower).
            let mut oack = Vec::new();
            if let Some(b) = blksize {
                oack.push(("blksize".to_string(), b.to_string()));
            }
            if tsize {
                oack.push(("tsize".to_string(), want.len().to_string()));
            }
            let mut with_timeout = oack.clone();
            if let Some(t) = timeout {
                with_timeout.push(("timeout".to_string(), t.to_string()));
            }
            let first = if opcode(&p) == DATA && oack.is_empty() {
                Some(p)
            } else {
                prop_assert_eq!(opcode(&p), OACK, "expected an OACK: {:?}", Shown(p.clone()));
                let body = p[2..].strip_suffix(&[0]).unwrap_or(&[]);
                let fields: Vec<String> = body
                    .split(|b| *b == 0)
                    .map(|f| String::from_utf8_lossy(f).into_owned())
                    .collect();
                let got: Vec<(String, String)> = fields
                    .chunks(2)
                    .map(|c| (c[0].clone(), c.get(1).cloned().unwrap_or_default()))
                    .collect();
                prop_assert!(
                    (got == with_timeout || got == oack) && !got.is_empty(),
                    "OACK {:?}, expected {:?}",
                    got,
                    with_timeout
                );
                sock.send_to(&[0, 4, 0, 0], tid).await.expect("send");
                None
            };
            tftp_receive(&sock, tid, first, blksize.unwrap_or(512), &want, &[]).await?;
        }
    }
    Ok(())
}

/// A plain read of `hello` goes through: the server is alive and serving.
async fn tftp_still_serves(s: &Served) -> Result<(), TestCaseError> {
    let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    sock.send_to(&tftp_packet(RRQ, &["hello", "octet"]), s.addr)
        .await
        .expect("send");
    let (p, tid) = recv_from(&sock).await?;
    prop_assert!(tid != s.addr);
    tftp_receive(&sock, tid, Some(p), 512, &pattern(5), &[]).await?;
    Ok(())
}

/// A stray packet a client (or anyone who guessed the transfer's port) may send.
fn stray() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        3 => Just(None),
        1 => prop::collection::vec(any::<u8>(), 0..12).prop_map(Some),
        1 => any::<u16>().prop_map(|b| Some([&[0, 4][..], &b.to_be_bytes()].concat())),
        1 => (any::<u16>(), 0u16..10).prop_map(|(op, b)| Some([op.to_be_bytes(), b.to_be_bytes()].concat())),
    ]
}

// ---------------------------------------------------------------------------------------
// HTTP (RFC 9110 ranges; the path rules of http_server/serve.rs)

fn http() -> &'static Served {
    static S: OnceLock<Served> = OnceLock::new();
    S.get_or_init(|| serve(HttpServer::from_args, serde_json::json!({"timeout": 2})))
}

/// Request heads (and bodies) the mutations start from.
const HTTP_SEEDS: &[&[u8]] = &[
    b"GET /boot/vmlinuz HTTP/1.1\r\nHost: a\r\nRange: bytes=10-20\r\nConnection: close\r\n\r\n",
    b"HEAD /a%20b.img HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /boot/../../etc/passwd HTTP/1.0\r\n\r\n",
    b"POST /kernel HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
    b"GET /kernel HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET http://a/exact?x=%zz HTTP/1.1\r\nRange: bytes=-5\r\n\r\nGET /hello HTTP/1.1\r\n\r\n",
];

/// A response: status, headers (names lowercased), body.
#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Writes `request` and reads until the server closes (after `shutdown`, the write side is
/// closed first).
async fn http_raw(
    addr: SocketAddr,
    request: &[u8],
    shutdown: bool,
) -> Result<Vec<u8>, TestCaseError> {
    let mut c = TcpStream::connect(addr).await.expect("connect");
    // The server may answer and close before it has read everything (a bad head).
    let _ = c.write_all(request).await;
    if shutdown {
        let _ = c.shutdown().await;
    }
    let mut out = Vec::new();
    // A reset after the answer (the server closed with our bytes unread) ends it too.
    let read = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out)).await;
    if read.is_err() {
        return Err(TestCaseError::fail(
            "the server kept the connection open 10 s",
        ));
    }
    Ok(out)
}

/// Parses one HTTP/1.1 response (a `Content-Length` one, as the server sends).
fn parse_response(raw: &[u8]) -> Result<Response, TestCaseError> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            TestCaseError::fail(format!(
                "no response head in {:?}",
                String::from_utf8_lossy(raw)
            ))
        })?;
    let head =
        std::str::from_utf8(&raw[..end]).map_err(|_| TestCaseError::fail("head not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| TestCaseError::fail(format!("bad status line {status_line:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: raw[end + 4..].to_vec(),
    })
}

/// A `GET` of the whole `boot/vmlinuz` goes through: the server is alive and serving.
async fn http_still_serves(s: &Served) -> Result<(), TestCaseError> {
    let raw = http_raw(
        s.addr,
        b"GET /boot/vmlinuz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        false,
    )
    .await?;
    let r = parse_response(&raw)?;
    prop_assert_eq!(r.status, 200);
    prop_assert!(r.body == pattern(3000), "the body is not the file");
    Ok(())
}

/// A request target: segments of names that exist, `..`, `.`, empty ones, percent escapes
/// (valid, of `/`, `.` and NUL, malformed: `%zz`, `%4`, a sign for a digit) and random
/// safe characters.
fn request_path() -> impl Strategy<Value = String> {
    let segment = prop_oneof![
        prop::sample::select(vec![
            "boot",
            "vmlinuz",
            "dtbs",
            "kernel",
            "exact",
            "empty",
            "hello",
            "a%20b.img",
            "pxelinux.cfg",
            "default",
            "..",
            ".",
            "",
            "%2e%2e",
            "%2E",
            "%2F",
            "%2f..",
            "%00",
            "%5C",
            "%zz",
            "%4",
            "%",
            "%C3%28",
            "%+1",
            "%+0",
            "%-1",
            "%+f",
            "%e2%82%ac",
            "missing",
        ])
        .prop_map(str::to_string),
        "[A-Za-z0-9._~!$&'()*,;=:@-]{1,8}",
        prop::collection::vec(any::<u8>(), 1..4)
            .prop_map(|b| b.iter().map(|c| format!("%{c:02X}")).collect::<String>()),
    ];
    prop::collection::vec(segment, 0..5).prop_map(|s| format!("/{}", s.join("/")))
}

/// `Range` values: well-formed single ranges of every form (some beyond the end, some with
/// numbers over u64), several ranges, other units, and random visible text.
fn range_value() -> impl Strategy<Value = Option<String>> {
    let num = prop_oneof![0u64..3100, Just(u64::MAX), any::<u64>(),].prop_map(|n| n.to_string());
    let num_text = prop_oneof![num, "[0-9]{20,30}", Just(String::new()), "[ +a-]{1,2}"];
    prop::option::of(prop_oneof![
        (
            num_text.clone(),
            num_text.clone(),
            "[ ]{0,1}",
            prop::sample::select(vec!["bytes=", "Bytes=", "items=", "bytes ="])
        )
            .prop_map(|(a, b, sp, unit)| format!("{unit}{sp}{a}{sp}-{b}")),
        (num_text.clone(), num_text).prop_map(|(a, b)| format!("bytes={a}-{b},0-1")),
        "[ -~]{0,24}",
    ])
}

/// What a path resolves to under the HTTP server's rules (`http_server/serve.rs`): `%XX`
/// escapes decoded (a malformed one is 400); a decoded path that is not UTF-8, or has a
/// NUL, a backslash or a `..` segment is 404; empty segments are ignored; then the file, or
/// 404 if missing, 403 if a directory. The flag says whether the decoded path has a `.`
/// segment, which the result ignores: such a path may also be refused with 404 (see
/// [`check_http_answer`]).
fn http_path_model(root: &Path, target: &str) -> (Result<PathBuf, u16>, bool) {
    let mut decoded = Vec::new();
    let b = target.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let Some(hex) = b
                .get(i + 1..i + 3)
                .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            else {
                return (Err(400), false);
            };
            let hex = std::str::from_utf8(hex).expect("hex digits");
            decoded.push(u8::from_str_radix(hex, 16).expect("hex digits"));
            i += 3;
        } else {
            decoded.push(b[i]);
            i += 1;
        }
    }
    let Ok(decoded) = String::from_utf8(decoded) else {
        return (Err(404), false);
    };
    if decoded.contains('\0') || decoded.contains('\\') {
        return (Err(404), false);
    }
    let mut path = root.to_path_buf();
    let mut dot = false;
    for seg in decoded.split('/') {
        match seg {
            "" => {}
            "." => dot = true,
            ".." => return (Err(404), dot),
            s => path.push(s),
        }
    }
    let result = if path.is_dir() {
        Err(403)
    } else if path.is_file() {
        Ok(path)
    } else {
        Err(404)
    };
    (result, dot)
}

/// The range a `Range` value asks of a file of `len` bytes, as `http_server/serve.rs`
/// documents it (RFC 9110 14.2, where a server may always ignore the field): one byte range
/// `bytes=A-B`, `A-` or `-N`; `None` (the whole file) for anything else (several ranges,
/// another unit, a malformed value, `B < A`, numbers over u64); `Some(Err)` (416) when it
/// starts beyond the end or asks for the last 0 bytes (or any of an empty file).
fn range_model(value: &str, len: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = value.trim().strip_prefix("bytes=")?.trim();
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    let num = |s: &str| {
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse::<u64>().ok()
    };
    match (a.is_empty(), b.is_empty()) {
        (true, _) => {
            let n = num(b)?;
            if n == 0 || len == 0 {
                Some(Err(()))
            } else {
                Some(Ok((len - n.min(len), len - 1)))
            }
        }
        (false, true) => {
            let first = num(a)?;
            Some(if first >= len {
                Err(())
            } else {
                Ok((first, len - 1))
            })
        }
        (false, false) => {
            let (first, last) = (num(a)?, num(b)?);
            if last < first {
                return None;
            }
            Some(if first >= len {
                Err(())
            } else {
                Ok((first, last.min(len - 1)))
            })
        }
    }
}

/// Checks the answer to `METHOD path` with `range` against the models.
fn check_http_answer(
    s: &Served,
    head: bool,
    path: &str,
    range: Option<&str>,
    r: &Response,
) -> Result<(), TestCaseError> {
    let (expected, dot) = http_path_model(&s.root, path);
    // `..` anywhere is refused; a `.` segment is refused, or ignored (RFC 3986 5.2.4).
    if dot && r.status == 404 {
        return Ok(());
    }
    let file = match expected {
        Err(code) => {
            prop_assert_eq!(r.status, code, "{} (range {:?})", path, range);
            return Ok(());
        }
        Ok(file) => file,
    };
    let data = std::fs::read(file).expect("read");
    let len = data.len() as u64;
    let want = range.and_then(|v| range_model(v, len));
    match want {
        None => {
            prop_assert_eq!(r.status, 200, "{} (range {:?})", path, range);
            prop_assert_eq!(r.header("content-length"), Some(&*len.to_string()));
            if !head {
                prop_assert!(r.body == data, "the body is not the file");
            }
        }
        Some(Err(())) => {
            prop_assert_eq!(r.status, 416, "{} (range {:?})", path, range);
            prop_assert_eq!(r.header("content-range"), Some(&*format!("bytes */{len}")));
        }
        Some(Ok((first, last))) => {
            prop_assert_eq!(r.status, 206, "{} (range {:?})", path, range);
            prop_assert_eq!(
                r.header("content-range"),
                Some(&*format!("bytes {first}-{last}/{len}"))
            );
            let count = last - first + 1;
            prop_assert_eq!(r.header("content-length"), Some(&*count.to_string()));
            if !head {
                prop_assert!(
                    r.body[..] == data[first as usize..=last as usize],
                    "the body is not bytes {}-{}",
                    first,
                    last
                );
            }
        }
    }
    if head {
        prop_assert!(r.body.is_empty(), "a HEAD answer with a body");
    }
    Ok(())
}

proptest! {
    #![proptest_config(fuzz_config())]

    /// Any datagram to the TFTP server's port: refused with the right ERROR code, or (a
    /// read request, RFC 1350/2347-2349) the named file served exactly, with exactly the
    /// options taken in the OACK; then a plain read still goes through.
    #[test]
    fn tftp_requests_from_anyone_are_answered_as_the_rfcs_say(
        packet in bytes_or_mutation(tftp_seeds()),
    ) {
        let s = tftp();
        runtime().block_on(async {
            tftp_exchange(s, &packet.0).await?;
            tftp_still_serves(s).await
        })?;
    }

    /// Stray packets during a transfer (garbage, ACKs of other blocks, other opcodes) are
    /// ignored; an ERROR ends it. A transfer that was not ended carries the file exactly.
    #[test]
    fn tftp_transfers_ignore_stray_packets(
        strays in prop::collection::vec(stray(), 0..13),
    ) {
        let s = tftp();
        runtime().block_on(async {
            let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
            let rrq = tftp_packet(RRQ, &["pxelinux.cfg/default", "octet", "blksize", "64"]);
            sock.send_to(&rrq, s.addr).await.expect("send");
            let (p, tid) = recv_from(&sock).await?;
            prop_assert_eq!(&p[..], &b"\x00\x06blksize\x0064\x00"[..]);
            sock.send_to(&[0, 4, 0, 0], tid).await.expect("send");
            tftp_receive(&sock, tid, None, 64, &pattern(700), &strays).await?;
            tftp_still_serves(s).await
        })?;
    }

    /// Any bytes on a connection to the HTTP server (random, or mutated requests): no
    /// `500` (a panic while resolving the path), every answer an HTTP/1.1 status line; then
    /// a plain `GET` still goes through.
    #[test]
    fn http_request_heads_from_anyone_never_stop_the_server(
        request in bytes_or_mutation(HTTP_SEEDS),
    ) {
        let s = http();
        runtime().block_on(async {
            let raw = http_raw(s.addr, &request.0, true).await?;
            if !raw.is_empty() {
                let r = parse_response(&raw)?;
                prop_assert!(r.status != 500, "500 for {:?}", request);
            }
            http_still_serves(s).await
        })?;
    }

    /// `GET`/`HEAD` of any path with any `Range`: the status, `Content-Range`,
    /// `Content-Length` and body are what the path and range rules say; nothing outside the
    /// root is ever served.
    #[test]
    fn http_paths_and_ranges_are_answered_as_rfc_9110_says(
        head in any::<bool>(),
        path in request_path(),
        range in range_value(),
    ) {
        let s = http();
        let method = if head { "HEAD" } else { "GET" };
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n");
        if let Some(v) = &range {
            req.push_str(&format!("Range: {v}\r\n"));
        }
        req.push_str("\r\n");
        let r = runtime().block_on(async {
            let raw = http_raw(s.addr, req.as_bytes(), false).await?;
            parse_response(&raw)
        })?;
        check_http_answer(s, head, &path, range.as_deref(), &r)?;
    }
}
