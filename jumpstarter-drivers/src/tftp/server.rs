//! A read-only TFTP server: RFC 1350 read requests, with the `blksize` (RFC 2348), `tsize`
//! and `timeout` (RFC 2349) options (RFC 2347 option negotiation).
//!
//! - Each transfer runs on a socket of its own (a fresh port, the transfer ID), connected to
//!   the client, so packets from anyone else never reach it. At most [`MAX_SESSIONS`]
//!   transfers run at once; a request beyond that gets an error packet.
//! - A block is sent again when its ACK does not come within the timeout, at most
//!   [`RETRIES`] times; then the transfer is abandoned. Duplicate ACKs are ignored (no
//!   "Sorcerer's Apprentice" resends). Block numbers roll over past 65535 (as tftp-hpa and
//!   most clients do), so files of any size go through.
//! - Write requests are refused (access violation); file names with `..` components, or
//!   leading through a symbolic link out of the root, are refused too.

use std::{
    net::SocketAddr,
    path::{Component, Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio::{io::AsyncReadExt, net::UdpSocket, sync::Semaphore, task::JoinSet};

use crate::boot_server::ServerTask;

/// Transfers served at once.
pub const MAX_SESSIONS: usize = 64;
/// Resends of a block before a transfer is abandoned.
pub const RETRIES: u32 = 3;
/// Seconds to wait for an ACK unless the client asks otherwise (`timeout` option).
pub const DEFAULT_TIMEOUT: u64 = 5;
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

/// Serves the files under `root` on `socket` until the task is dropped.
pub fn start(socket: UdpSocket, root: PathBuf) -> ServerTask {
    let root = Arc::new(root);
    ServerTask::spawn(async move {
        let slots = Arc::new(Semaphore::new(MAX_SESSIONS));
        let mut transfers = JoinSet::new();
        let mut buf = vec![0u8; 2048];
        loop {
            let (n, peer) = tokio::select! {
                r = socket.recv_from(&mut buf) => match r {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::debug!("Tftp recv: {e}");
                        continue;
                    }
                },
                Some(_) = transfers.join_next(), if !transfers.is_empty() => continue,
            };
            let req = match parse_request(&buf[..n]) {
                Ok(r) => r,
                Err((code, msg)) => {
                    let _ = socket.send_to(&error_packet(code, &msg), peer).await;
                    continue;
                }
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                let _ = socket
                    .send_to(&error_packet(ERR_UNDEFINED, "server busy"), peer)
                    .await;
                continue;
            };
            let root = root.clone();
            let local = socket.local_addr().ok();
            transfers.spawn(async move {
                let _permit = permit;
                if let Err(e) = transfer(&root, local, peer, req).await {
                    tracing::info!("Tftp transfer to {peer}: {e}");
                }
            });
        }
    })
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
                req.timeout = value.parse().ok().filter(|t| (1..=255).contains(t));
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
    if !oack.is_empty() {
        let mut p = OACK.to_be_bytes().to_vec();
        p.extend_from_slice(&oack);
        send_acked(&sock, &p, 0, timeout).await?;
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
        send_acked(&sock, &packet[..4 + filled], block, timeout).await?;
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
}
