//! A small QMP (QEMU Machine Protocol) client over a Unix socket.
//!
//! QMP is JSON, one message per line: the server greets (`{"QMP": {...}}`), the client
//! negotiates capabilities (`qmp_capabilities`), then sends commands (`{"execute": ...}`) and
//! reads replies (`{"return": ...}` or `{"error": {"class", "desc"}}`), skipping the
//! asynchronous events (`{"event": ...}`) the server may send in between.

use std::{path::Path, time::Duration};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{
        UnixStream,
        unix::{OwnedReadHalf, OwnedWriteHalf},
    },
};

/// The longest QMP line accepted (a reply of `query-*` is a few KiB).
const MAX_LINE: usize = 1024 * 1024;
/// How long one command may take.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// What went wrong talking QMP.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// The socket could not be connected, read or written.
    #[error("QMP socket {path}")]
    Io {
        /// The socket path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The server sent something that is not QMP.
    #[error("QMP protocol error: {0}")]
    Protocol(String),
    /// A message that is not JSON.
    #[error("QMP protocol error: not JSON: {start:?}")]
    NotJson {
        /// Its first 200 bytes.
        start: String,
        /// Why it is not JSON.
        #[source]
        source: serde_json::Error,
    },
    /// QEMU answered the command with an error.
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        /// The command sent.
        command: String,
        /// QEMU's error class.
        class: String,
        /// QEMU's description.
        desc: String,
    },
    /// No reply in time.
    #[error("QMP command {0} got no reply within {REPLY_TIMEOUT:?}")]
    Timeout(String),
}

/// A negotiated QMP connection.
pub struct Qmp {
    path: String,
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl Qmp {
    /// Connects to the socket at `path`, reads the greeting and negotiates capabilities.
    pub async fn connect(path: &Path) -> Result<Self, QmpError> {
        let p = path.display().to_string();
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| QmpError::Io {
                path: p.clone(),
                source,
            })?;
        Self::handshake(p, stream).await
    }

    async fn handshake(path: String, stream: UnixStream) -> Result<Self, QmpError> {
        let (r, w) = stream.into_split();
        let mut qmp = Qmp {
            path,
            reader: BufReader::new(r),
            writer: w,
        };
        let greeting = tokio::time::timeout(REPLY_TIMEOUT, qmp.read_message())
            .await
            .map_err(|_| QmpError::Timeout("(greeting)".into()))??;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol(format!(
                "expected a QMP greeting, got {greeting}"
            )));
        }
        qmp.execute("qmp_capabilities", None).await?;
        Ok(qmp)
    }

    /// Runs `command` (with `arguments`) and returns its `return` value.
    pub async fn execute(
        &mut self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, QmpError> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        let mut line = msg.to_string();
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .await
            .map_err(|source| self.io(source))?;
        tokio::time::timeout(REPLY_TIMEOUT, self.reply(command))
            .await
            .map_err(|_| QmpError::Timeout(command.to_string()))?
    }

    async fn reply(&mut self, command: &str) -> Result<Value, QmpError> {
        loop {
            let mut msg = self.read_message().await?;
            if let Some(r) = msg.get_mut("return") {
                return Ok(r.take());
            }
            if let Some(e) = msg.get("error") {
                let field = |k: &str| {
                    e.get(k)
                        .and_then(Value::as_str)
                        .unwrap_or("(none)")
                        .to_string()
                };
                return Err(QmpError::Command {
                    command: command.to_string(),
                    class: field("class"),
                    desc: field("desc"),
                });
            }
            if msg.get("event").is_some() {
                continue;
            }
            return Err(QmpError::Protocol(format!("unexpected message {msg}")));
        }
    }

    async fn read_message(&mut self) -> Result<Value, QmpError> {
        let mut line = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
            .map_err(|source| self.io(source))?;
        if n == 0 {
            return Err(QmpError::Protocol(
                "the server closed the connection".into(),
            ));
        }
        if line.len() > MAX_LINE {
            return Err(QmpError::Protocol(format!(
                "a message longer than {MAX_LINE} bytes"
            )));
        }
        serde_json::from_slice(&line).map_err(|source| QmpError::NotJson {
            start: String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned(),
            source,
        })
    }

    fn io(&self, source: std::io::Error) -> QmpError {
        QmpError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

/// The pty path of chardev `label` in a `query-chardev` reply (`"filename": "pty:/dev/pts/3"`).
pub fn pty_of(chardevs: &Value, label: &str) -> Option<String> {
    chardevs
        .as_array()?
        .iter()
        .find(|c| c.get("label").and_then(Value::as_str) == Some(label))?
        .get("filename")?
        .as_str()?
        .strip_prefix("pty:")
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A QMP server speaking `script`: after each client line, the next reply lines.
    async fn fake_server(listener: tokio::net::UnixListener, replies: Vec<Vec<&'static str>>) {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        for reply in replies {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0);
            for line in reply {
                s.write_all(line.as_bytes()).await.unwrap();
                s.write_all(b"\n").await.unwrap();
            }
        }
    }

    #[tokio::test]
    async fn negotiates_skips_events_and_reports_errors() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("qmp");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let server = tokio::spawn(fake_server(
            listener,
            vec![
                vec!["{\"return\": {}}"],
                vec![
                    "{\"event\": \"RESET\", \"timestamp\": {}}",
                    "{\"return\": [{\"label\": \"serial0\", \"filename\": \"pty:/dev/pts/7\"}]}",
                ],
                vec!["{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"no such\"}}"],
                vec!["not json"],
            ],
        ));
        let mut q = Qmp::connect(&sock).await.unwrap();
        let devs = q.execute("query-chardev", None).await.unwrap();
        assert_eq!(pty_of(&devs, "serial0").as_deref(), Some("/dev/pts/7"));
        assert_eq!(pty_of(&devs, "serial1"), None);
        let e = q.execute("nope", None).await.unwrap_err();
        assert!(e.to_string().contains("CommandNotFound: no such"), "{e}");
        let e = q.execute("query-status", None).await.unwrap_err();
        assert!(matches!(e, QmpError::NotJson { .. }), "{e}");
        let text = jumpstarter_core::error_chain(&e);
        assert!(text.starts_with("QMP protocol error: not JSON: "), "{text}");
        assert!(text.contains("expected ident"), "{text}");
        let source = std::error::Error::source(&e).expect("the JSON error is kept");
        assert!(source.is::<serde_json::Error>(), "{source}");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn refuses_a_server_that_does_not_greet() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("qmp");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(b"{\"hello\": 1}\n").await.unwrap();
        });
        let e = match Qmp::connect(&sock).await {
            Err(e) => e,
            Ok(_) => panic!("connected to a non-QMP server"),
        };
        assert!(e.to_string().contains("greeting"), "{e}");
        server.await.unwrap();
    }
}
