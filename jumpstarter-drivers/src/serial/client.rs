//! The client half of serial consoles and the `j NAME start-console|pipe` commands.

use std::{io::IsTerminal, os::fd::AsFd};

use clap::{Arg, ArgAction, ArgMatches, Command};
use jumpstarter_core::{ClientError, client::DriverClient};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::expect::Console;
use crate::command::{CliFuture, DriverCommand};
use serde::Deserialize;

/// Ctrl-B: pressed three times in a row, it leaves `start-console`.
const CTRL_B: u8 = 0x02;

/// Typed client for drivers reporting `jumpstarter_driver_pyserial.client.PySerialClient`.
#[derive(Clone)]
pub struct PySerialClient(pub DriverClient);

impl PySerialClient {
    /// Opens the console: the board's bytes to read, yours to write.
    pub async fn connect(
        &self,
    ) -> Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static, ClientError> {
        self.0.open_stream("connect").await
    }

    /// Opens the console read-only: the last 64 KB it printed, then its live bytes (writes
    /// are refused by the exporter). Upstream's `stream(method="observe")`.
    pub async fn observe(
        &self,
    ) -> Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static, ClientError> {
        self.0.open_stream("observe").await
    }

    /// Takes the seat from the console's writer, so that another client may `connect`.
    pub async fn release_console(&self) -> Result<(), ClientError> {
        self.0.call("release_console", ()).await
    }

    /// Who uses the console: the writer, how many observe, the scrollback's size.
    pub async fn console_status(&self) -> Result<ConsoleStatus, ClientError> {
        self.0.call("console_status", ()).await
    }

    /// Opens the console for scripting (see [`Console`]): upstream's `pexpect()`.
    pub async fn console(
        &self,
    ) -> Result<Console<impl AsyncRead + AsyncWrite + Send + Unpin + 'static>, ClientError> {
        Ok(Console::new(self.connect().await?))
    }

    /// Ends every open connection to this console on the exporter.
    pub async fn close(&self) -> Result<(), ClientError> {
        self.0.call("close", ()).await
    }

    /// Sets the DTR line.
    pub async fn set_dtr(&self, value: bool) -> Result<(), ClientError> {
        self.0.call("set_dtr", (value,)).await
    }

    /// Sets the RTS line.
    pub async fn set_rts(&self, value: bool) -> Result<(), ClientError> {
        self.0.call("set_rts", (value,)).await
    }
}

/// What `console_status` reports (upstream's field names; absent fields read as empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ConsoleStatus {
    /// The writer holding the seat, if any.
    pub write_token_holder: Option<String>,
    /// Clients reading without the seat.
    pub observer_count: u64,
    /// Every client, the writer included.
    pub total_clients: u64,
    /// Whether the exporter has the console open.
    pub reader_running: bool,
    /// Bytes of scrollback an observer joining now would get.
    pub scrollback_bytes: u64,
}

impl std::fmt::Display for ConsoleStatus {
    /// Upstream's `console-status` lines.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let py_bool = |b: bool| if b { "True" } else { "False" };
        writeln!(
            f,
            "Write token holder: {}",
            self.write_token_holder.as_deref().unwrap_or("(none)")
        )?;
        writeln!(f, "Observers: {}", self.observer_count)?;
        writeln!(f, "Total clients: {}", self.total_clients)?;
        writeln!(f, "Reader running: {}", py_bool(self.reader_running))?;
        writeln!(f, "Scrollback: {} bytes", self.scrollback_bytes)
    }
}

/// The `j NAME` commands of serial consoles, as upstream's.
pub fn cli() -> DriverCommand {
    DriverCommand {
        about: "Serial port client",
        build,
        run,
    }
}

fn build(cmd: Command) -> Command {
    cmd.subcommand_required(true)
        .subcommand(
            Command::new("start-console")
                .about("Start serial port console")
                .arg(observe_arg("Watch-only mode (read-only)")),
        )
        .subcommand(
            Command::new("release-console").about("Force-release the serial console write token"),
        )
        .subcommand(Command::new("console-status").about("Show serial console session status"))
        .subcommand(
            Command::new("pipe")
                .about("Pipe serial port data to stdout or file")
                .long_about(
                    "Pipe serial port data to stdout or file.\n\nBy default, reads from the \
                     serial port and writes to stdout. Automatically detects if stdin is piped \
                     and enables bidirectional mode.\n\nWhen stdin is used, commands are sent \
                     until EOF, then continues monitoring serial output until Ctrl+C.\n\n\
                     Examples:\n  j serial pipe\n  j serial pipe -o serial.log\n  echo hello | \
                     j serial pipe\n  cat commands.txt | j serial pipe --no-output",
                )
                .arg(
                    Arg::new("output")
                        .short('o')
                        .long("output")
                        .help("Output file path. If not specified, writes to stdout."),
                )
                .arg(
                    Arg::new("input")
                        .short('i')
                        .long("input")
                        .action(ArgAction::SetTrue)
                        .help(
                            "Force enable stdin to serial port. Auto-detected if stdin is piped.",
                        ),
                )
                .arg(
                    Arg::new("no-input")
                        .long("no-input")
                        .action(ArgAction::SetTrue)
                        .help("Disable stdin to serial port, even if stdin is piped."),
                )
                .arg(
                    Arg::new("append")
                        .short('a')
                        .long("append")
                        .action(ArgAction::SetTrue)
                        .help("Append to output file instead of overwriting."),
                )
                .arg(
                    Arg::new("no-output")
                        .long("no-output")
                        .action(ArgAction::SetTrue)
                        .help(
                            "Disable serial output handling. Send stdin to serial and exit at EOF.",
                        ),
                )
                .arg(observe_arg(
                    "Watch-only mode (read-only). Use when another session has exclusive access.",
                )),
        )
}

fn observe_arg(help: &'static str) -> Arg {
    Arg::new("observe")
        .long("observe")
        .action(ArgAction::SetTrue)
        .help(help)
}

/// What `pipe` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipeMode {
    /// Write the console's output to this file instead of stdout.
    pub output: Option<String>,
    /// Send stdin to the console.
    pub input: bool,
    /// Append to `output`.
    pub append: bool,
    /// Only send stdin, exit at its end.
    pub no_output: bool,
    /// Read-only: open the console with `observe` (no stdin is sent).
    pub observe: bool,
}

/// Checks `pipe`'s flags as upstream does; `stdin_piped` is whether stdin is not a terminal.
pub fn pipe_mode(
    output: Option<String>,
    input: bool,
    no_input: bool,
    append: bool,
    no_output: bool,
    observe: bool,
    stdin_piped: bool,
) -> Result<PipeMode, ClientError> {
    let usage = |m: &str| Err(ClientError::Value(m.to_string()));
    if observe && input {
        return usage("Cannot use both --observe and --input");
    }
    if observe && no_output {
        return usage("Cannot use both --observe and --no-output");
    }
    if input && no_input {
        return usage("Cannot use both --input and --no-input");
    }
    if no_output && output.is_some() {
        return usage("Cannot use both --no-output and --output");
    }
    if no_output && append {
        return usage("Cannot use both --no-output and --append");
    }
    if append && output.is_none() {
        return usage("--append requires --output");
    }
    let input = if no_input || observe {
        false
    } else {
        input || stdin_piped
    };
    if no_output && !input {
        return usage("--no-output requires stdin input (pipe stdin or use --input)");
    }
    Ok(PipeMode {
        output,
        input,
        append,
        no_output,
        observe,
    })
}

fn run(client: DriverClient, matches: ArgMatches) -> CliFuture {
    Box::pin(async move {
        let serial = PySerialClient(client);
        match matches.subcommand() {
            Some(("start-console", m)) => start_console(&serial, m.get_flag("observe")).await,
            Some(("release-console", _)) => {
                serial.release_console().await?;
                eprintln!("Write token released.");
                Ok(())
            }
            Some(("console-status", _)) => {
                print!("{}", serial.console_status().await?);
                Ok(())
            }
            Some(("pipe", m)) => {
                let stdin_piped = !std::io::stdin().is_terminal();
                let mode = pipe_mode(
                    m.get_one::<String>("output").cloned(),
                    m.get_flag("input"),
                    m.get_flag("no-input"),
                    m.get_flag("append"),
                    m.get_flag("no-output"),
                    m.get_flag("observe"),
                    stdin_piped,
                )?;
                let how = match (&mode.output, mode.input, mode.no_output) {
                    (_, _, true) => {
                        "Fire-and-forget mode: stdin→serial, no output (exits at EOF)".to_string()
                    }
                    (None, false, _) => "Reading from serial port... (Ctrl+C to exit)".into(),
                    (None, true, _) => {
                        "Bidirectional mode: stdin→serial, serial→stdout (Ctrl+C to exit)".into()
                    }
                    (Some(f), false, _) => {
                        format!("Logging serial output to {f}... (Ctrl+C to exit)")
                    }
                    (Some(f), true, _) => {
                        format!("Bidirectional mode with logging to {f}... (Ctrl+C to exit)")
                    }
                };
                eprintln!("{how}");
                if mode.observe {
                    pipe_stream(serial.observe().await?, &mode).await
                } else {
                    pipe_stream(serial.connect().await?, &mode).await
                }
            }
            _ => Err(ClientError::Value("missing serial command".into())),
        }
    })
}

/// Pipes a byte stream to stdout (or a file) and stdin to it, as `pipe` does; also used by
/// the generic `j NAME open-stream METHOD`.
pub async fn pipe_stream<S>(stream: S, mode: &PipeMode) -> Result<(), ClientError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut rx, mut tx) = tokio::io::split(stream);
    let input = async move {
        if !mode.input {
            return std::future::pending::<Result<(), ClientError>>().await;
        }
        let mut stdin = std_stream(&std::io::stdin())?;
        tokio::io::copy(&mut stdin, &mut tx).await?;
        tx.flush().await?;
        let _ = tx.shutdown().await;
        Ok(())
    };
    if mode.no_output {
        return input.await;
    }
    let output = async {
        let mut out: Box<dyn AsyncWrite + Send + Unpin> = match &mode.output {
            Some(path) => {
                let mut o = tokio::fs::OpenOptions::new();
                o.create(true);
                if mode.append {
                    o.append(true);
                } else {
                    o.write(true).truncate(true);
                }
                Box::new(o.open(path).await.map_err(|e| {
                    ClientError::Io(std::io::Error::new(
                        e.kind(),
                        jumpstarter_core::Because::boxed(format!("cannot open {path}"), e),
                    ))
                })?)
            }
            None => Box::new(std_stream(&std::io::stdout())?),
        };
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match rx.read(&mut buf).await {
                Ok(0) => {
                    eprintln!("\nSerial connection closed normally (end of stream).");
                    return Ok(());
                }
                Ok(n) => n,
                Err(e) => {
                    return Err(ClientError::Value(format!(
                        "serial connection lost: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    )));
                }
            };
            out.write_all(&buf[..n]).await?;
            out.flush().await?;
        }
    };
    tokio::pin!(input);
    tokio::pin!(output);
    // stdin ending leaves the output running (until the stream ends or Ctrl+C).
    tokio::select! {
        r = &mut output => r,
        r = &mut input => { r?; output.await }
    }
}

/// Our stdin or stdout as an async file (its reads and writes run on tokio's blocking
/// threads, so the descriptor's own mode, shared with the shell, is left alone).
pub(crate) fn std_stream(fd: &impl AsFd) -> std::io::Result<tokio::fs::File> {
    let owned = fd.as_fd().try_clone_to_owned()?;
    Ok(tokio::fs::File::from_std(std::fs::File::from(owned)))
}

/// Puts a terminal in raw mode and puts it back when dropped (on every way out: return,
/// error, panic, the command being cancelled by a signal).
struct RawMode {
    fd: std::os::fd::OwnedFd,
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enter() -> std::io::Result<Self> {
        let fd = std::io::stdin().as_fd().try_clone_to_owned()?;
        let saved = rustix::termios::tcgetattr(&fd).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "start-console needs a terminal on stdin ({e}); use `pipe` instead",
                    e = jumpstarter_core::error_chain(&e)
                ),
            )
        })?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&fd, rustix::termios::OptionalActions::Drain, &raw)?;
        Ok(Self { fd, saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            &self.fd,
            rustix::termios::OptionalActions::Drain,
            &self.saved,
        );
    }
}

/// Counts Ctrl-B presses in a row; true at the third.
#[derive(Debug, Default)]
pub struct EscapeCounter(u8);

impl EscapeCounter {
    /// Feeds the bytes typed; returns how many of them to send before leaving, if the
    /// third Ctrl-B in a row is among them.
    pub fn feed(&mut self, typed: &[u8]) -> Option<usize> {
        for (i, b) in typed.iter().enumerate() {
            if *b == CTRL_B {
                self.0 += 1;
                if self.0 == 3 {
                    return Some(i);
                }
            } else {
                self.0 = 0;
            }
        }
        None
    }
}

async fn start_console(serial: &PySerialClient, observe: bool) -> Result<(), ClientError> {
    if observe {
        eprintln!(
            "\nStarting serial console in observe mode (read-only) ... exit with CTRL+B x 3 times\n"
        );
        run_console(serial.observe().await?, false).await
    } else {
        eprintln!("\nStarting serial port console ... exit with CTRL+B x 3 times\n");
        run_console(serial.connect().await?, true).await
    }
}

/// The terminal in raw mode on `stream`: its bytes to the screen, keys to it when `typing`
/// (an observer's keys only count Ctrl-B), until three Ctrl-B in a row.
async fn run_console<S>(stream: S, typing: bool) -> Result<(), ClientError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let raw = RawMode::enter()?;
    let (mut rx, mut tx) = tokio::io::split(stream);
    let keys = async move {
        let mut stdin = std_stream(&std::io::stdin())?;
        let mut esc = EscapeCounter::default();
        let mut buf = [0u8; 1024];
        loop {
            let n = stdin.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), ClientError>(());
            }
            if let Some(upto) = esc.feed(&buf[..n]) {
                if typing {
                    tx.write_all(&buf[..upto]).await?;
                }
                return Ok(());
            }
            if typing {
                tx.write_all(&buf[..n]).await?;
            }
        }
    };
    let screen = async move {
        let mut stdout = std_stream(&std::io::stdout())?;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = rx
                .read(&mut buf)
                .await
                .map_err(|e| ClientError::encoding_because("serial connection lost", e))?;
            if n == 0 {
                return Ok::<(), ClientError>(());
            }
            stdout.write_all(&buf[..n]).await?;
            stdout.flush().await?;
        }
    };
    let r = tokio::select! {
        r = keys => r,
        r = screen => r,
    };
    drop(raw);
    eprintln!();
    r
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn console_status_prints_as_upstreams() {
        let s: ConsoleStatus = serde_json::from_value(serde_json::json!({
            "write_token_holder": "connection 2", "observer_count": 2, "total_clients": 3,
            "reader_running": true, "scrollback_bytes": 120,
        }))
        .unwrap();
        assert_eq!(
            s.to_string(),
            "Write token holder: connection 2\nObservers: 2\nTotal clients: 3\n\
             Reader running: True\nScrollback: 120 bytes\n"
        );
        let none: ConsoleStatus = serde_json::from_value(serde_json::json!({})).unwrap();
        assert!(none.to_string().starts_with("Write token holder: (none)\n"));
    }

    #[test]
    fn three_ctrl_b_in_a_row_leave() {
        let mut e = EscapeCounter::default();
        assert_eq!(e.feed(b"ls\x02\x02x"), None, "interrupted");
        assert_eq!(e.feed(b"\x02\x02"), None);
        assert_eq!(e.feed(b"\x02rest"), Some(0));
        let mut e = EscapeCounter::default();
        assert_eq!(e.feed(b"ab\x02\x02\x02cd"), Some(4));
    }

    #[test]
    fn pipe_flags_are_checked_as_upstream() {
        let m = |o: Option<&str>, i, ni, a, no, piped| {
            pipe_mode(o.map(String::from), i, ni, a, no, false, piped)
        };
        let observe = |i, no, piped| pipe_mode(None, i, false, false, no, true, piped);
        let o = observe(false, false, true).unwrap();
        assert!(
            o.observe && !o.input,
            "an observer sends no stdin, piped or not"
        );
        for (bad, want) in [
            (observe(true, false, false), "--observe and --input"),
            (observe(false, true, true), "--observe and --no-output"),
        ] {
            let e = bad.unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        assert!(!m(None, false, false, false, false, false).unwrap().input);
        assert!(m(None, false, false, false, false, true).unwrap().input);
        assert!(!m(None, false, true, false, false, true).unwrap().input);
        assert!(
            m(Some("f"), true, false, true, false, false)
                .unwrap()
                .append
        );
        for (bad, want) in [
            (
                m(None, true, true, false, false, false),
                "--input and --no-input",
            ),
            (
                m(Some("f"), false, false, false, true, true),
                "--no-output and --output",
            ),
            (
                m(None, false, false, true, true, true),
                "--no-output and --append",
            ),
            (
                m(None, false, false, true, false, false),
                "--append requires --output",
            ),
            (
                m(None, false, false, false, true, false),
                "--no-output requires stdin",
            ),
        ] {
            let e = bad.unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
