//! A read-only TFTP server: RFC 1350 read requests, with the `blksize` (RFC 2348), `tsize`
//! and `timeout` (RFC 2349) options (RFC 2347 option negotiation).
//!
//! - Each transfer runs on a socket of its own (a fresh port, the transfer ID), connected to
//!   the client, so packets from anyone else never reach it.
//! - At most [`MAX_SESSIONS`] transfers run at once, and at most
//!   [`MAX_SESSIONS_PER_CLIENT`] for one client address (an IPv6 client: one `/64`); a
//!   request beyond that gets an error packet. Read requests need no handshake, so their
//!   source address can be forged: a transfer whose first packet (the OACK, or block 1) is
//!   not acknowledged within [`FIRST_ACK_WINDOW`] is abandoned (it is resent every
//!   [`FIRST_RESEND`] meanwhile), and when every slot is taken a new request takes the slot
//!   of the oldest transfer still waiting for that first ACK. A transfer that has had its
//!   first ACK is never pushed out: requests then get "server busy".
//! - Once acknowledged, a block is sent again when its ACK does not come within the
//!   timeout, at most [`RETRIES`] times; then the transfer is abandoned. The `timeout` option
//!   is accepted from 1 to [`MAX_TIMEOUT`] seconds; a larger value is left out of the OACK
//!   (RFC 2347 lets a server ignore an option), so [`DEFAULT_TIMEOUT`] applies. Duplicate
//!   ACKs are ignored (no "Sorcerer's Apprentice" resends). Block numbers roll over past
//!   65535 (as tftp-hpa and most clients do), so files of any size go through.
//! - Write requests are refused (access violation); file names with `..` components, or
//!   leading through a symbolic link out of the root, are refused too. Error packets are
//!   never answered (RFC 1350), so that two servers cannot bounce errors at each other
//!   forever (the "TFTP Loop DoS", CVE-2024-2169).

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv6Addr, SocketAddr},
    path::{Component, Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::AsyncReadExt,
    net::UdpSocket,
    task::{AbortHandle, JoinSet},
    time::Instant,
};

use crate::boot_server::ServerTask;

/// Transfers served at once.
pub const MAX_SESSIONS: usize = 64;
/// Transfers served at once to one client address (an IPv6 client: one `/64` prefix).
pub const MAX_SESSIONS_PER_CLIENT: usize = 8;
/// Resends of a block before a transfer is abandoned.
pub const RETRIES: u32 = 3;
/// Seconds to wait for an ACK unless the client asks otherwise (`timeout` option).
pub const DEFAULT_TIMEOUT: u64 = 5;
/// The largest `timeout` option accepted, in seconds (RFC 2349 allows up to 255).
pub const MAX_TIMEOUT: u64 = 10;
/// How long a transfer may wait for the ACK of its first packet (the OACK, or block 1),
/// resends included, before it is abandoned and its slot freed.
pub const FIRST_ACK_WINDOW: Duration = Duration::from_secs(6);
/// The first packet is sent again this often (or after the client's `timeout`, if shorter)
/// until it is acknowledged or [`FIRST_ACK_WINDOW`] has passed.
pub const FIRST_RESEND: Duration = Duration::from_secs(2);
/// Block size without the `blksize` option.
pub const DEFAULT_BLKSIZE: usize = 512;
/// The largest `blksize` (RFC 2348).
pub const MAX_BLKSIZE: usize = 65464;

const RRQ: u16 = 1;
const WRQ: u16 = 2;
const DATA: u16 = 3;
const ACK: u16 = 4;
const ERROR: u16 = 5;
const OACK: u16 = 6;

const ERR_UNDEFINED: u16 = 0;
const ERR_NOT_FOUND: u16 = 1;
const ERR_ACCESS: u16 = 2;
const ERR_ILLEGAL: u16 = 4;

/// The bounds a server keeps: the constants above ([`Limits::default`]); tests shorten the
/// windows.
#[derive(Debug, Clone, Copy)]
struct Limits {
    sessions: usize,
    per_client: usize,
    first_ack_window: Duration,
    first_resend: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            sessions: MAX_SESSIONS,
            per_client: MAX_SESSIONS_PER_CLIENT,
            first_ack_window: FIRST_ACK_WINDOW,
            first_resend: FIRST_RESEND,
        }
    }
}

/// A transfer in progress, as the request loop keeps track of it.
struct Session {
    peer: SocketAddr,
    /// [`client_key`] of the peer.
    client: IpAddr,
    started: Instant,
    /// Set once the client acknowledged the first packet: it is really there.
    confirmed: Arc<AtomicBool>,
    abort: AbortHandle,
}

/// The address one client's transfers are counted under: an IPv4 address (IPv4-mapped
/// IPv6 ones too), or the `/64` prefix of an IPv6 address (one host may hold a whole `/64`).
pub(crate) fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Serves the files under `root` on `socket` until the task is dropped.
pub fn start(socket: UdpSocket, root: PathBuf) -> ServerTask {
    ServerTask::spawn(serve(socket, Arc::new(root), Limits::default()))
}

async fn serve(socket: UdpSocket, root: Arc<PathBuf>, limits: Limits) {
    // Transfer tasks live in the set: dropping this future (the server stopped) aborts them.
    let mut transfers = JoinSet::new();
    // At most `limits.sessions` entries: one per transfer running.
    let mut sessions: HashMap<tokio::task::Id, Session> = HashMap::with_capacity(limits.sessions);
    let mut buf = vec![0u8; 2048];
    loop {
        let (n, peer) = tokio::select! {
            r = socket.recv_from(&mut buf) => match r {
                Ok(v) => v,
                Err(e) => {
                    tracing::debug!("Tftp recv: {e}", e = jumpstarter_core::error_chain(&e));
                    continue;
                }
            },
            Some(done) = transfers.join_next_with_id(), if !transfers.is_empty() => {
                let id = match done {
                    Ok((id, ())) => id,
                    Err(e) => e.id(),
                };
                sessions.remove(&id);
                continue;
            }
        };
        // Error packets are never answered (RFC 1350): answering them lets two servers, or
        // this one and itself with a forged source, bounce errors forever (CVE-2024-2169).
        if buf[..n].starts_with(&ERROR.to_be_bytes()) {
            tracing::debug!("Tftp: an error packet from {peer}, not answered");
            continue;
        }
        let req = match parse_request(&buf[..n]) {
            Ok(r) => r,
            Err((code, msg)) => {
                let _ = socket.send_to(&error_packet(code, &msg), peer).await;
                continue;
            }
        };
        let client = client_key(peer.ip());
        if sessions.values().filter(|s| s.client == client).count() >= limits.per_client {
            tracing::info!(
                "Tftp: refused {:?} to {peer}: already {} transfers to its address",
                req.filename,
                limits.per_client
            );
            let _ = socket
                .send_to(
                    &error_packet(ERR_UNDEFINED, "too many transfers to this address"),
                    peer,
                )
                .await;
            continue;
        }
        if sessions.len() >= limits.sessions {
            // Full: the oldest transfer nobody has acknowledged yet (its request may have
            // come from a forged address) makes way; acknowledged ones are never pushed out.
            let oldest = sessions
                .iter()
                .filter(|(_, s)| !s.confirmed.load(Ordering::Acquire))
                .min_by_key(|(_, s)| s.started)
                .map(|(id, _)| *id);
            let Some(old) = oldest.and_then(|id| sessions.remove(&id)) else {
                let _ = socket
                    .send_to(&error_packet(ERR_UNDEFINED, "server busy"), peer)
                    .await;
                continue;
            };
            old.abort.abort();
            tracing::info!(
                "Tftp: every slot taken; dropped the unacknowledged transfer to {} for {peer}",
                old.peer
            );
        }
        let root = root.clone();
        let local = socket.local_addr().ok();
        let confirmed = Arc::new(AtomicBool::new(false));
        let flag = confirmed.clone();
        let abort = transfers.spawn(async move {
            if let Err(e) = transfer(&root, local, peer, req, &flag, limits).await {
                tracing::info!(
                    "Tftp transfer to {peer}: {e}",
                    e = jumpstarter_core::error_chain(&e)
                );
            }
        });
        sessions.insert(
            abort.id(),
            Session {
                peer,
                client,
                started: Instant::now(),
                confirmed,
                abort,
            },
        );
    }
}

/// A read request.
#[derive(Debug, PartialEq)]
struct ReadRequest {
    filename: String,
    blksize: Option<usize>,
    tsize: bool,
    timeout: Option<u64>,
}

fn error_packet(code: u16, msg: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(5 + msg.len());
    p.extend_from_slice(&ERROR.to_be_bytes());
    p.extend_from_slice(&code.to_be_bytes());
    p.extend_from_slice(msg.as_bytes());
    p.push(0);
    p
}

fn parse_request(p: &[u8]) -> Result<ReadRequest, (u16, String)> {
    let illegal = |m: &str| (ERR_ILLEGAL, m.to_string());
    if p.len() < 4 {
        return Err(illegal("malformed packet"));
    }
    match u16::from_be_bytes([p[0], p[1]]) {
        RRQ => {}
        WRQ => return Err((ERR_ACCESS, "this server is read-only".into())),
        _ => return Err(illegal("expected a read request")),
    }
    let body = &p[2..];
    if body.last() != Some(&0) {
        return Err(illegal("malformed request"));
    }
    let fields: Vec<&[u8]> = body[..body.len() - 1].split(|b| *b == 0).collect();
    if fields.len() < 2 || !fields.len().is_multiple_of(2) {
        return Err(illegal("malformed request"));
    }
    let text = |b: &[u8]| std::str::from_utf8(b).map(str::to_string);
    let filename = text(fields[0]).map_err(|_| illegal("file name is not UTF-8"))?;
    if filename.is_empty() || filename.len() > 255 {
        return Err(illegal("bad file name"));
    }
    let mode = text(fields[1])
        .map_err(|_| illegal("bad mode"))?
        .to_ascii_lowercase();
    if mode != "octet" && mode != "netascii" {
        return Err(illegal("Unsupported transfer mode"));
    }
    let mut req = ReadRequest {
        filename,
        blksize: None,
        tsize: false,
        timeout: None,
    };
    for pair in fields[2..].chunks(2) {
        let (Ok(name), Ok(value)) = (text(pair[0]), text(pair[1])) else {
            continue;
        };
        // Unknown options, and values out of range, are left out of the OACK (RFC 2347).
        match name.to_ascii_lowercase().as_str() {
            "blksize" => {
                req.blksize = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n >= 8)
                    .map(|n| n.min(MAX_BLKSIZE));
            }
            "tsize" => req.tsize = true,
            "timeout" => {
                // RFC 2349 allows 1 to 255 s, but the OACK must echo the value: a longer
                // wait than MAX_TIMEOUT is declined rather than altered.
                req.timeout = value.parse().ok().filter(|t| (1..=MAX_TIMEOUT).contains(t));
            }
            _ => {}
        }
    }
    Ok(req)
}

/// The file a request names under `root`, or the error to send.
fn resolve(root: &Path, name: &str) -> Result<PathBuf, (u16, &'static str)> {
    let rel = Path::new(name.trim_start_matches('/'));
    let mut path = root.to_path_buf();
    for c in rel.components() {
        match c {
            Component::Normal(n) => path.push(n),
            Component::CurDir => {}
            _ => return Err((ERR_ACCESS, "Access violation")),
        }
    }
    let real_root = std::fs::canonicalize(root).map_err(|_| (ERR_NOT_FOUND, "File not found"))?;
    let real = std::fs::canonicalize(&path).map_err(|_| (ERR_NOT_FOUND, "File not found"))?;
    if !real.starts_with(&real_root) {
        return Err((ERR_ACCESS, "Access violation"));
    }
    if !real.is_file() {
        return Err((ERR_NOT_FOUND, "Not a file"));
    }
    Ok(real)
}

/// Waits for the ACK of `block`, ignoring duplicates and strays; `Ok(false)` on timeout.
async fn wait_ack(sock: &UdpSocket, block: u16, timeout: Duration) -> std::io::Result<bool> {
    let mut buf = [0u8; 516];
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let n = match tokio::time::timeout_at(deadline, sock.recv(&mut buf)).await {
            Err(_) => return Ok(false),
            Ok(r) => r?,
        };
        if n < 4 {
            continue;
        }
        match u16::from_be_bytes([buf[0], buf[1]]) {
            ACK if u16::from_be_bytes([buf[2], buf[3]]) == block => return Ok(true),
            ERROR => {
                let msg = String::from_utf8_lossy(&buf[4..n]);
                return Err(std::io::Error::other(format!(
                    "the client sent an error: {}",
                    msg.trim_end_matches('\0')
                )));
            }
            _ => {}
        }
    }
}

/// Sends a transfer's first packet and waits for the ACK of `block`, resending it every
/// `every`, for at most `window` in all: until that ACK nothing shows the client is there
/// (the request's source address may be forged).
async fn send_first(
    sock: &UdpSocket,
    packet: &[u8],
    block: u16,
    every: Duration,
    window: Duration,
) -> std::io::Result<()> {
    let deadline = Instant::now() + window;
    loop {
        sock.send(packet).await?;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        if wait_ack(sock, block, every.min(left)).await? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "no ACK of the first packet within {} ms",
            window.as_millis()
        ),
    ))
}

/// Sends `packet` and waits for the ACK of `block`, resending on timeout.
async fn send_acked(
    sock: &UdpSocket,
    packet: &[u8],
    block: u16,
    timeout: Duration,
) -> std::io::Result<()> {
    for _ in 0..=RETRIES {
        sock.send(packet).await?;
        if wait_ack(sock, block, timeout).await? {
            return Ok(());
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no ACK of block {block} after {RETRIES} resends"),
    ))
}

async fn transfer(
    root: &Path,
    local: Option<SocketAddr>,
    peer: SocketAddr,
    req: ReadRequest,
    confirmed: &AtomicBool,
    limits: Limits,
) -> std::io::Result<()> {
    let bind: SocketAddr = match local {
        Some(l) => SocketAddr::new(l.ip(), 0),
        None => "0.0.0.0:0".parse().map_err(std::io::Error::other)?,
    };
    let sock = UdpSocket::bind(bind).await?;
    sock.connect(peer).await?;
    let root2 = root.to_path_buf();
    let name = req.filename.clone();
    let path = match tokio::task::spawn_blocking(move || resolve(&root2, &name)).await {
        Ok(Ok(p)) => p,
        Ok(Err((code, msg))) => {
            let _ = sock.send(&error_packet(code, msg)).await;
            return Err(std::io::Error::other(format!("{}: {msg}", req.filename)));
        }
        Err(e) => return Err(std::io::Error::other(e)),
    };
    let mut file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) => {
            let _ = sock
                .send(&error_packet(ERR_NOT_FOUND, "File not found"))
                .await;
            return Err(e);
        }
    };
    let size = file.metadata().await?.len();
    let blksize = req.blksize.unwrap_or(DEFAULT_BLKSIZE);
    let timeout = Duration::from_secs(req.timeout.unwrap_or(DEFAULT_TIMEOUT));
    // Option acknowledgement: only the options understood, with the values used.
    let mut oack = Vec::new();
    if let Some(b) = req.blksize {
        oack.extend_from_slice(format!("blksize\0{b}\0").as_bytes());
    }
    if req.tsize {
        oack.extend_from_slice(format!("tsize\0{size}\0").as_bytes());
    }
    if let Some(t) = req.timeout {
        oack.extend_from_slice(format!("timeout\0{t}\0").as_bytes());
    }
    let first_resend = timeout.min(limits.first_resend);
    let mut first = true;
    if !oack.is_empty() {
        let mut p = OACK.to_be_bytes().to_vec();
        p.extend_from_slice(&oack);
        send_first(&sock, &p, 0, first_resend, limits.first_ack_window).await?;
        confirmed.store(true, Ordering::Release);
        first = false;
    }
    let mut packet = vec![0u8; 4 + blksize];
    let mut block: u16 = 0;
    loop {
        block = block.wrapping_add(1);
        let mut filled = 0;
        while filled < blksize {
            let n = file.read(&mut packet[4 + filled..]).await?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        packet[..2].copy_from_slice(&DATA.to_be_bytes());
        packet[2..4].copy_from_slice(&block.to_be_bytes());
        let data = &packet[..4 + filled];
        if first {
            send_first(&sock, data, block, first_resend, limits.first_ack_window).await?;
            confirmed.store(true, Ordering::Release);
            first = false;
        } else {
            send_acked(&sock, data, block, timeout).await?;
        }
        if filled < blksize {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rrq(parts: &[&str]) -> Vec<u8> {
        let mut p = RRQ.to_be_bytes().to_vec();
        for s in parts {
            p.extend_from_slice(s.as_bytes());
            p.push(0);
        }
        p
    }

    #[test]
    fn requests_parse_with_options_and_bad_ones_are_refused() {
        let r = parse_request(&rrq(&["a/b", "OCTET", "blksize", "1428", "tsize", "0"])).unwrap();
        assert_eq!(r.filename, "a/b");
        assert_eq!(r.blksize, Some(1428));
        assert!(r.tsize);
        let r = parse_request(&rrq(&["f", "octet", "blksize", "99999", "timeout", "0"])).unwrap();
        assert_eq!(r.blksize, Some(MAX_BLKSIZE));
        assert_eq!(r.timeout, None);
        // A timeout beyond MAX_TIMEOUT is declined (left out of the OACK), not honoured.
        for (asked, kept) in [
            ("1", Some(1)),
            ("10", Some(10)),
            ("11", None),
            ("255", None),
        ] {
            let r = parse_request(&rrq(&["f", "octet", "timeout", asked])).unwrap();
            assert_eq!(r.timeout, kept, "timeout {asked}");
        }
        assert!(parse_request(&rrq(&["f", "mail"])).is_err());
        assert!(parse_request(&rrq(&["f"])).is_err());
        assert!(parse_request(b"\x00\x01f\x00octet").is_err());
        assert_eq!(
            parse_request(&[0, 2, b'f', 0, b'o', 0]).unwrap_err().0,
            ERR_ACCESS
        );
        assert!(parse_request(&[0, 9]).is_err());
    }

    #[test]
    fn names_stay_beneath_the_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("pxelinux.cfg")).unwrap();
        std::fs::write(dir.path().join("pxelinux.cfg/default"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("out")).unwrap();
        assert!(resolve(dir.path(), "pxelinux.cfg/default").is_ok());
        assert!(resolve(dir.path(), "/pxelinux.cfg/default").is_ok());
        assert_eq!(
            resolve(dir.path(), "../etc/passwd").unwrap_err().0,
            ERR_ACCESS
        );
        assert_eq!(resolve(dir.path(), "out/passwd").unwrap_err().0, ERR_ACCESS);
        assert_eq!(
            resolve(dir.path(), "pxelinux.cfg").unwrap_err().0,
            ERR_NOT_FOUND
        );
        assert_eq!(resolve(dir.path(), "missing").unwrap_err().0, ERR_NOT_FOUND);
    }

    #[test]
    fn clients_are_counted_by_address_and_ipv6_by_prefix() {
        let key = |s: &str| client_key(s.parse().unwrap());
        assert_eq!(key("192.0.2.7"), key("192.0.2.7"));
        assert_ne!(key("192.0.2.7"), key("192.0.2.8"));
        assert_eq!(key("::ffff:192.0.2.7"), key("192.0.2.7"));
        assert_eq!(
            key("2001:db8:1:2::1"),
            key("2001:db8:1:2:aaaa:bbbb:cccc:dddd")
        );
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
    }

    /// The file the transfer tests fetch: six blocks of 512 bytes, the last one short.
    fn kernel() -> Vec<u8> {
        (0..3000u32).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// A server on 127.0.0.1 serving [`kernel`] as `kernel`.
    async fn serving(limits: Limits) -> (ServerTask, SocketAddr, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kernel"), kernel()).unwrap();
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let root = Arc::new(dir.path().to_path_buf());
        (ServerTask::spawn(serve(socket, root, limits)), addr, dir)
    }

    fn opcode(p: &[u8]) -> u16 {
        u16::from_be_bytes([p[0], p[1]])
    }

    fn ack(block: u16) -> Vec<u8> {
        let mut p = ACK.to_be_bytes().to_vec();
        p.extend_from_slice(&block.to_be_bytes());
        p
    }

    /// Receives one datagram, or panics after 5 s.
    async fn recv(sock: &UdpSocket, buf: &mut [u8]) -> (usize, SocketAddr) {
        tokio::time::timeout(Duration::from_secs(5), sock.recv_from(buf))
            .await
            .expect("no answer within 5 s")
            .unwrap()
    }

    /// Fetches `kernel` as a board does (no options, every block acknowledged); the
    /// server's error message if it refuses.
    async fn fetch(sock: &UdpSocket, server: SocketAddr) -> Result<Vec<u8>, String> {
        sock.send_to(&rrq(&["kernel", "octet"]), server)
            .await
            .unwrap();
        let mut out = Vec::new();
        let mut next: u16 = 1;
        let mut buf = vec![0u8; 1024];
        loop {
            let (n, from) = recv(sock, &mut buf).await;
            match opcode(&buf[..n]) {
                ERROR => {
                    return Err(String::from_utf8_lossy(&buf[4..n])
                        .trim_end_matches('\0')
                        .to_string());
                }
                DATA => {
                    let block = u16::from_be_bytes([buf[2], buf[3]]);
                    if block == next {
                        out.extend_from_slice(&buf[4..n]);
                        next += 1;
                    }
                    sock.send_to(&ack(block), from).await.unwrap();
                    if block + 1 == next && n - 4 < DEFAULT_BLKSIZE {
                        return Ok(out);
                    }
                }
                other => panic!("unexpected packet {other}"),
            }
        }
    }

    /// One address asking for `timeout` 255 and never acknowledging anything gets no more
    /// than its share of the slots (the rest of its requests get error packets), another
    /// client still gets its file, and the stalled transfers give their slots back once
    /// the first-ACK window has passed.
    #[tokio::test]
    async fn one_silent_address_cannot_take_every_slot_for_long() {
        let limits = Limits {
            first_ack_window: Duration::from_millis(500),
            first_resend: Duration::from_millis(200),
            ..Limits::default()
        };
        let (_server, addr, _dir) = serving(limits).await;
        let flood = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        for _ in 0..MAX_SESSIONS {
            flood
                .send_to(&rrq(&["kernel", "octet", "timeout", "255"]), addr)
                .await
                .unwrap();
        }
        let (mut refused, mut oacks) = (0, 0);
        let mut buf = vec![0u8; 1024];
        while refused < MAX_SESSIONS - MAX_SESSIONS_PER_CLIENT {
            let (n, from) = recv(&flood, &mut buf).await;
            match opcode(&buf[..n]) {
                ERROR if from == addr => {
                    let msg = String::from_utf8_lossy(&buf[4..n]);
                    assert!(msg.contains("too many transfers"), "{msg}");
                    refused += 1;
                }
                OACK => oacks += 1,
                _ => {}
            }
        }
        // timeout=255 was the only option, and it is declined: no OACK, block 1 at once.
        assert_eq!(oacks, 0);

        let board = UdpSocket::bind("127.0.0.2:0").await.unwrap();
        assert_eq!(fetch(&board, addr).await, Ok(kernel()));

        // The eight stalled transfers are abandoned after the window: the address gets
        // slots again (tried every 100 ms, for at most 5 s).
        let again = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match fetch(&again, addr).await {
                Ok(got) => {
                    assert_eq!(got, kernel());
                    break;
                }
                Err(e) => {
                    assert!(e.contains("too many transfers"), "{e}");
                    assert!(
                        Instant::now() < deadline,
                        "the stalled transfers kept their slots"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Requests from many (possibly forged) addresses that never acknowledge anything fill
    /// every slot: a new client still gets its file (the oldest unacknowledged transfer
    /// makes way), and a transfer already acknowledged is never the one pushed out.
    #[tokio::test]
    async fn unacknowledged_transfers_make_way_for_new_clients() {
        let (_server, addr, _dir) = serving(Limits::default()).await;
        let mut buf = vec![0u8; 1024];

        // The oldest transfer: a board that has acknowledged block 1.
        let board = UdpSocket::bind("127.0.0.2:0").await.unwrap();
        board
            .send_to(&rrq(&["kernel", "octet"]), addr)
            .await
            .unwrap();
        let (n, port) = recv(&board, &mut buf).await;
        assert_eq!((opcode(&buf[..n]), &buf[2..4]), (DATA, &[0u8, 1][..]));
        let mut got = buf[4..n].to_vec();
        board.send_to(&ack(1), port).await.unwrap();

        // Nine addresses, eight requests each: 72, more than the slots left.
        let mut floods = Vec::new();
        for i in 10..19 {
            let s = UdpSocket::bind(format!("127.0.0.{i}:0")).await.unwrap();
            for _ in 0..MAX_SESSIONS_PER_CLIENT {
                s.send_to(&rrq(&["kernel", "octet"]), addr).await.unwrap();
            }
            floods.push(s);
        }
        // Its request comes after all of those on the server's socket.
        let other = UdpSocket::bind("127.0.0.3:0").await.unwrap();
        assert_eq!(fetch(&other, addr).await, Ok(kernel()));

        // The first board's transfer goes on to the end.
        let mut next = 2u16;
        loop {
            let (n, from) = recv(&board, &mut buf).await;
            assert_eq!((opcode(&buf[..n]), from), (DATA, port));
            let block = u16::from_be_bytes([buf[2], buf[3]]);
            if block == next {
                got.extend_from_slice(&buf[4..n]);
                next += 1;
            }
            board.send_to(&ack(block), port).await.unwrap();
            if n - 4 < DEFAULT_BLKSIZE {
                break;
            }
        }
        assert_eq!(got, kernel());
    }

    /// An error packet sent to the server's port gets no answer (were it answered, two
    /// servers could bounce errors forever): the first answer that comes back is the one
    /// to the write request sent after it.
    #[tokio::test]
    async fn error_packets_are_not_answered() {
        let (_server, addr, _dir) = serving(Limits::default()).await;
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        sock.send_to(&error_packet(ERR_ILLEGAL, "bounce me"), addr)
            .await
            .unwrap();
        sock.send_to(&[0, 5, 0], addr).await.unwrap();
        let mut write = WRQ.to_be_bytes().to_vec();
        write.extend_from_slice(b"f\0octet\0");
        sock.send_to(&write, addr).await.unwrap();
        let mut buf = vec![0u8; 1024];
        let (n, from) = recv(&sock, &mut buf).await;
        assert_eq!(from, addr);
        assert_eq!(opcode(&buf[..n]), ERROR);
        assert_eq!(u16::from_be_bytes([buf[2], buf[3]]), ERR_ACCESS);
    }
}
