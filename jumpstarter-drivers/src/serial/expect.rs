//! Scripting a console from Rust, pexpect-style: send lines, wait for patterns.
//!
//! [`Console`] wraps any byte stream (a serial console's `connect`, a forwarded TCP
//! connection, a pty) and is itself `AsyncRead + AsyncWrite`, so it can be handed to code
//! that wants a plain stream once the scripted part is over.
//!
//! ```no_run
//! use std::time::Duration;
//! use jumpstarter_drivers::{Console, PySerialClient};
//!
//! # async fn login(serial: PySerialClient) -> Result<(), Box<dyn std::error::Error>> {
//! let mut console = serial.console().await?.with_timeout(Duration::from_secs(30));
//! console.log_to("boot.log")?;                 // the whole transcript, both directions
//! console.send_line("").await?;
//! console.expect("login: ").await?;
//! console.send_line("root").await?;
//! let m = console.expect(r"(?m)^# $").await?;  // a regex
//! println!("banner before the prompt: {}", String::from_utf8_lossy(&m.before));
//! # Ok(()) }
//! ```

use std::{
    io::{self, Write},
    path::Path,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use regex::bytes::Regex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// Unmatched output kept for matching; older bytes are dropped (as pexpect's `maxread`
/// window), so a chatty console cannot grow memory without bound.
pub const MAX_BUFFER: usize = 1024 * 1024;

/// Why an expectation failed.
#[derive(Debug, thiserror::Error)]
pub enum ExpectError {
    /// Nothing matched in time; `before` holds what arrived meanwhile (the tail of it).
    #[error("timed out after {timeout:?} waiting for /{pattern}/; last output: {tail:?}")]
    Timeout {
        /// The pattern.
        pattern: String,
        /// How long it waited.
        timeout: Duration,
        /// The last bytes received (up to 200), for the message.
        tail: String,
    },
    /// The console ended before the pattern appeared.
    #[error("the console ended while waiting for /{pattern}/")]
    Eof {
        /// The pattern.
        pattern: String,
    },
    /// The pattern is not a valid regular expression.
    #[error("invalid pattern /{pattern}/")]
    Pattern {
        /// The pattern.
        pattern: String,
        /// The regex error.
        #[source]
        source: regex::Error,
    },
    /// Reading or writing the console (or the transcript) failed.
    #[error("console I/O failed")]
    Io(#[from] io::Error),
}

/// A successful match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    /// What arrived before the match.
    pub before: Vec<u8>,
    /// The matched bytes.
    pub matched: Vec<u8>,
    /// Capture groups (index 0 is the whole match); `None` for a group that did not take part.
    pub groups: Vec<Option<Vec<u8>>>,
}

impl Match {
    /// [`Match::before`] as text (invalid UTF-8 replaced).
    pub fn before_text(&self) -> String {
        String::from_utf8_lossy(&self.before).into_owned()
    }
}

/// A byte stream with an expect API and an optional transcript.
pub struct Console<S> {
    io: S,
    buf: Vec<u8>,
    timeout: Duration,
    line_ending: &'static str,
    transcript: Option<std::fs::File>,
    eof: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Console<S> {
    /// Wraps `io`; expectations time out after 30 s unless [`Console::with_timeout`] says.
    pub fn new(io: S) -> Self {
        Self {
            io,
            buf: Vec::new(),
            timeout: Duration::from_secs(30),
            line_ending: "\n",
            transcript: None,
            eof: false,
        }
    }

    /// Sets the default timeout of [`Console::expect`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets what [`Console::send_line`] appends (`"\n"` by default, as pexpect; some
    /// consoles want `"\r"`).
    pub fn with_line_ending(mut self, ending: &'static str) -> Self {
        self.line_ending = ending;
        self
    }

    /// Appends everything received and sent from now on to the file at `path`.
    pub fn log_to(&mut self, path: impl AsRef<Path>) -> io::Result<()> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path.as_ref())
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    jumpstarter_core::Because::boxed(
                        format!("cannot open transcript {}", path.as_ref().display()),
                        e,
                    ),
                )
            })?;
        self.transcript = Some(file);
        Ok(())
    }

    fn log(&mut self, data: &[u8]) -> io::Result<()> {
        if let Some(f) = self.transcript.as_mut() {
            f.write_all(data)?;
        }
        Ok(())
    }

    /// Sends bytes as they are.
    pub async fn send(&mut self, data: impl AsRef<[u8]>) -> Result<(), ExpectError> {
        let data = data.as_ref();
        self.io.write_all(data).await?;
        self.io.flush().await?;
        self.log(data)?;
        Ok(())
    }

    /// Sends `line` and the line ending.
    pub async fn send_line(&mut self, line: &str) -> Result<(), ExpectError> {
        let mut data = Vec::with_capacity(line.len() + 2);
        data.extend_from_slice(line.as_bytes());
        data.extend_from_slice(self.line_ending.as_bytes());
        self.send(data).await
    }

    /// Waits (up to the default timeout) for `pattern`, a regular expression over the
    /// received bytes; consumes the output up to the end of the match.
    pub async fn expect(&mut self, pattern: &str) -> Result<Match, ExpectError> {
        let timeout = self.timeout;
        self.expect_timeout(pattern, timeout).await
    }

    /// [`Console::expect`] with its own timeout.
    pub async fn expect_timeout(
        &mut self,
        pattern: &str,
        timeout: Duration,
    ) -> Result<Match, ExpectError> {
        let re = Regex::new(pattern).map_err(|source| ExpectError::Pattern {
            pattern: pattern.to_string(),
            source,
        })?;
        self.expect_regex(&re, timeout).await
    }

    /// Waits for a compiled regex.
    pub async fn expect_regex(
        &mut self,
        re: &Regex,
        timeout: Duration,
    ) -> Result<Match, ExpectError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(m) = self.take_match(re) {
                return Ok(m);
            }
            if self.eof {
                return Err(ExpectError::Eof {
                    pattern: re.as_str().to_string(),
                });
            }
            match tokio::time::timeout_at(deadline, self.fill()).await {
                Ok(r) => r?,
                Err(_) => {
                    let tail_start = self.buf.len().saturating_sub(200);
                    return Err(ExpectError::Timeout {
                        pattern: re.as_str().to_string(),
                        timeout,
                        tail: String::from_utf8_lossy(&self.buf[tail_start..]).into_owned(),
                    });
                }
            }
        }
    }

    /// Waits until the console ends; returns what it sent meanwhile.
    pub async fn expect_eof(&mut self, timeout: Duration) -> Result<Vec<u8>, ExpectError> {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.eof {
            match tokio::time::timeout_at(deadline, self.fill()).await {
                Ok(r) => r?,
                Err(_) => {
                    return Err(ExpectError::Timeout {
                        pattern: "<end of stream>".into(),
                        timeout,
                        tail: String::new(),
                    });
                }
            }
        }
        Ok(std::mem::take(&mut self.buf))
    }

    /// Output received but not consumed by a match yet.
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// The underlying stream (unconsumed output is lost).
    pub fn into_inner(self) -> S {
        self.io
    }

    fn take_match(&mut self, re: &Regex) -> Option<Match> {
        let caps = re.captures(&self.buf)?;
        let whole = caps.get(0)?;
        let groups = caps
            .iter()
            .map(|g| g.map(|g| g.as_bytes().to_vec()))
            .collect();
        let m = Match {
            before: self.buf[..whole.start()].to_vec(),
            matched: whole.as_bytes().to_vec(),
            groups,
        };
        self.buf.drain(..whole.end());
        Some(m)
    }

    /// Reads what is available into the buffer.
    async fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 4096];
        let n = self.io.read(&mut chunk).await?;
        if n == 0 {
            self.eof = true;
            return Ok(());
        }
        self.log(&chunk[..n])?;
        self.buf.extend_from_slice(&chunk[..n]);
        if self.buf.len() > MAX_BUFFER {
            let excess = self.buf.len() - MAX_BUFFER;
            self.buf.drain(..excess);
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Console<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.buf.is_empty() {
            let n = this.buf.len().min(out.remaining());
            out.put_slice(&this.buf[..n]);
            this.buf.drain(..n);
            return Poll::Ready(Ok(()));
        }
        let before = out.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, out);
        if let Poll::Ready(Ok(())) = r
            && let Some(f) = this.transcript.as_mut()
        {
            f.write_all(&out.filled()[before..])?;
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Console<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = r
            && let Some(f) = this.transcript.as_mut()
        {
            f.write_all(&data[..n])?;
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn expect_matches_regexes_and_keeps_what_came_before() {
        let (a, mut b) = tokio::io::duplex(1024);
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("t.log");
        let mut c = Console::new(a).with_timeout(Duration::from_secs(5));
        c.log_to(&log).unwrap();
        b.write_all(b"U-Boot 2024\r\nboard login: ").await.unwrap();
        let m = c.expect("login: ").await.unwrap();
        assert_eq!(m.before_text(), "U-Boot 2024\r\nboard ");
        c.send_line("root").await.unwrap();
        let mut got = [0u8; 5];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"root\n");
        b.write_all(b"Linux 6.1 #1\r\nroot@board:~# ")
            .await
            .unwrap();
        let m = c.expect(r"Linux (\d+)\.(\d+)").await.unwrap();
        assert_eq!(m.groups[1].as_deref(), Some(&b"6"[..]));
        let m = c.expect(r"# $").await.unwrap();
        assert_eq!(m.before_text(), " #1\r\nroot@board:~");
        drop(c);
        let transcript = std::fs::read_to_string(&log).unwrap();
        assert!(transcript.contains("board login: root\n"), "{transcript}");
        assert!(transcript.contains("root@board:~# "), "{transcript}");
    }

    #[tokio::test]
    async fn timeouts_eof_and_bad_patterns_are_errors() {
        let (a, mut b) = tokio::io::duplex(1024);
        let mut c = Console::new(a);
        b.write_all(b"booting...").await.unwrap();
        let e = c
            .expect_timeout("login:", Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, ExpectError::Timeout { tail, .. } if tail == "booting..."),
            "{e}"
        );
        assert!(matches!(
            c.expect("(").await.unwrap_err(),
            ExpectError::Pattern { .. }
        ));
        drop(b);
        let e = c.expect("never").await.unwrap_err();
        assert!(matches!(e, ExpectError::Eof { .. }), "{e}");
        assert_eq!(c.buffered(), b"booting...");
    }

    #[tokio::test]
    async fn the_buffer_is_bounded() {
        let (a, mut b) = tokio::io::duplex(64 * 1024);
        let mut c = Console::new(a);
        let writer = tokio::spawn(async move {
            let junk = vec![b'x'; 64 * 1024];
            for _ in 0..40 {
                b.write_all(&junk).await.unwrap();
            }
            b.write_all(b"END").await.unwrap();
            b
        });
        let m = c.expect("END").await.unwrap();
        assert!(
            !m.before.is_empty() && m.before.len() <= MAX_BUFFER,
            "{} bytes kept",
            m.before.len()
        );
        drop(writer.await.unwrap());
    }
}
