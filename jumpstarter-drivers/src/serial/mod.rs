//! Serial consoles: upstream's `jumpstarter_driver_pyserial.driver.PySerial`.
//!
//! Config fields as upstream: `url` (a device path such as `/dev/ttyUSB0`,
//! `socket://HOST:PORT` for a console server, or `loop://`, pyserial's loopback),
//! `baudrate` (default 115200), `check_present` (default true: a device that cannot be
//! opened fails the exporter at start), `cps` (characters per second sent to the device,
//! for boards whose UART drops bytes of fast input) and `disable_hupcl` (keep DTR up when
//! the port closes), and ours: `transcript` (default true; `false` keeps the console out of
//! the exporter's `consoleTranscripts`, for a console that carries secrets) and
//! `observer_bytes_per_second` (default 4 MiB/s: the most each observer receives, beyond
//! which its oldest bytes are dropped; see [`ConsoleFanout`]). `rfc2217://` URLs are refused
//! at start (no maintained Rust RFC 2217 client to build on).
//!
//! Methods (client class `jumpstarter_driver_pyserial.client.PySerialClient`):
//! `connect` (`@exportstream`, the console's bytes both ways: the writer), `observe`
//! (`@exportstream`, read-only: the last 64 KB, then live bytes), `release_console` (takes
//! the seat from the writer), `console_status` (who writes, how many observe), as upstream's
//! observe mode names them; `close` (ends every open stream),
//! `set_dtr` / `set_rts` (no-ops on `loop://` and `socket://` as in pyserial; on a device
//! they open it afresh, set the line and close it again, as upstream: see [`modem`]; a
//! device without modem lines, such as a pseudo-terminal, fails the call naming the device
//! and the line).
//!
//! The console is opened when its first stream opens and closed when its last one ends; a
//! [`ConsoleFanout`] shares it between one writer and any number of observers (a slow
//! observer drops its oldest bytes and never slows the writer or the board). A device that
//! goes away while connected (a USB adapter unplugged) ends every stream with an error naming
//! the device; the next `connect` or `observe` opens it afresh.

pub mod client;
pub mod device;
pub mod expect;
pub mod modem;
pub mod nvdemux;

use std::{
    future::Future,
    io,
    path::PathBuf,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use jumpstarter_core::{
    CallContext, Driver, DriverError, driver,
    driver::{
        BoxDuplex, ConsoleFanout, ConsoleRecorder, ConsoleStatus, ConsoleStream, DriverArgs,
        fanout::{FanoutOptions, OBSERVER_BYTES_PER_SECOND},
    },
};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use client::{PySerialClient, cli};
pub use device::{LineSettings, Pty, TtyStream};
pub use expect::{Console, ExpectError, Match};

/// Upstream client class of serial drivers.
pub const PYSERIAL_CLIENT: &str = "jumpstarter_driver_pyserial.client.PySerialClient";

/// Where a [`PySerial`] connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SerialUrl {
    /// A serial device (or pty) path.
    Device(PathBuf),
    /// `socket://HOST:PORT`: a raw TCP console server.
    Socket {
        /// Host name or address.
        host: String,
        /// TCP port.
        port: u16,
    },
    /// `loop://`: what is written comes back.
    Loop,
}

impl SerialUrl {
    /// Parses a pyserial URL; errors name the `url` field.
    pub fn parse(url: &str) -> Result<Self, DriverError> {
        let bad = |why: &str| DriverError::InvalidArgument(format!("url: {url:?}: {why}"));
        if url.is_empty() {
            return Err(bad("must not be empty"));
        }
        let Some((scheme, rest)) = url.split_once("://") else {
            return Ok(SerialUrl::Device(PathBuf::from(url)));
        };
        match scheme {
            "loop" if rest.is_empty() => Ok(SerialUrl::Loop),
            "loop" => Err(bad("loop:// takes no options here")),
            "socket" => {
                let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
                    let (h, p) = v6
                        .split_once("]:")
                        .ok_or_else(|| bad("expected socket://HOST:PORT"))?;
                    (h, p)
                } else {
                    rest.rsplit_once(':')
                        .ok_or_else(|| bad("expected socket://HOST:PORT"))?
                };
                if host.is_empty() {
                    return Err(bad("socket:// needs a host"));
                }
                let port = port
                    .parse::<u16>()
                    .map_err(|_| bad("the port must be a number from 0 to 65535"))?;
                Ok(SerialUrl::Socket {
                    host: host.to_string(),
                    port,
                })
            }
            "rfc2217" => Err(bad(
                "rfc2217:// is not supported by this exporter (use socket:// to a raw TCP port \
                 of the console server)",
            )),
            other => Err(bad(&format!(
                "unsupported URL scheme {other}:// (supported: a device path, socket://, loop://)"
            ))),
        }
    }
}

fn default_baudrate() -> u32 {
    115_200
}
fn default_true() -> bool {
    true
}

/// Upstream's config fields.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    url: String,
    #[serde(default = "default_baudrate")]
    baudrate: u32,
    #[serde(default = "default_true")]
    check_present: bool,
    #[serde(default)]
    cps: Option<f64>,
    #[serde(default)]
    disable_hupcl: bool,
    /// Ours: `false` keeps this console out of the exporter's transcripts (a console that
    /// carries secrets).
    #[serde(default = "default_true")]
    transcript: bool,
    /// Ours: the most each observer receives per second (see [`FanoutOptions::observer_rate`]).
    #[serde(default = "default_observer_rate")]
    observer_bytes_per_second: u64,
}

fn default_observer_rate() -> u64 {
    OBSERVER_BYTES_PER_SECOND
}

/// Bytes buffered by a `loop://` connection before its writer waits.
const LOOP_BUFFER: usize = 64 * 1024;

/// A serial console (`jumpstarter_driver_pyserial.driver.PySerial`).
#[derive(Debug)]
pub struct PySerial {
    url: SerialUrl,
    settings: LineSettings,
    cps: Option<f64>,
    /// The writer and observers of this console.
    fanout: ConsoleFanout,
    /// Whether the exporter's console transcripts may record it.
    transcript: bool,
}

/// What `connect` and `observe` return: a client's end of the console's [`ConsoleFanout`].
pub type SerialStream = ConsoleStream;

#[driver(
    client = "jumpstarter_driver_pyserial.client.PySerialClient",
    session_end = session_ended
)]
impl PySerial {
    /// Opens the console to write: the board's bytes from now on, and yours to it. One
    /// writer at a time: another `connect` is refused while one holds the seat (see
    /// [`ConsoleFanout`]).
    #[export(stream)]
    async fn connect(&self, ctx: &CallContext) -> Result<SerialStream, DriverError> {
        self.fanout
            .connect(|| self.open_source(ctx), self.recorder(ctx))
            .await
    }

    /// Opens the console read-only: the last 64 KB it printed, then its live bytes; writes
    /// are refused. Any number of observers, beside the writer or without one.
    #[export(stream)]
    async fn observe(&self, ctx: &CallContext) -> Result<SerialStream, DriverError> {
        self.fanout
            .observe(|| self.open_source(ctx), self.recorder(ctx))
            .await
    }

    /// Takes the seat from the console's writer (its writes fail from now on, it reads on),
    /// so that another client may `connect`.
    #[export]
    async fn release_console(&self, ctx: &CallContext) -> Result<(), DriverError> {
        if self.fanout.release_console() {
            ctx.log_info(format!("write token of {} released", self.url_text()));
        }
        Ok(())
    }

    /// Who uses the console: the writer, how many observe, the scrollback's size.
    #[export]
    async fn console_status(&self) -> Result<ConsoleStatus, DriverError> {
        Ok(self.fanout.status())
    }

    /// Ends every open `connect` stream of this console (no-op when none is open).
    #[export]
    async fn close(&self, ctx: &CallContext) -> Result<(), DriverError> {
        ctx.log_info(format!(
            "close() closing connections to {}",
            self.url_text()
        ));
        self.close_all().await;
        Ok(())
    }

    /// Sets the DTR line (see the module docs for what each URL kind does).
    #[export]
    async fn set_dtr(&self, value: bool) -> Result<(), DriverError> {
        self.modem_line(modem::ModemLine::Dtr, value).await
    }

    /// Sets the RTS line (see the module docs for what each URL kind does).
    #[export]
    async fn set_rts(&self, value: bool) -> Result<(), DriverError> {
        self.modem_line(modem::ModemLine::Rts, value).await
    }
}

impl PySerial {
    /// A console on `url` with upstream's defaults (115200 baud, no throttling).
    pub fn new(url: SerialUrl) -> Self {
        Self {
            url,
            settings: LineSettings {
                baudrate: default_baudrate(),
                disable_hupcl: false,
            },
            cps: None,
            fanout: ConsoleFanout::default(),
            transcript: true,
        }
    }

    /// Sets the line settings.
    pub fn with_settings(mut self, settings: LineSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Sends at most `cps` characters per second to the device.
    pub fn with_cps(mut self, cps: Option<f64>) -> Self {
        self.cps = cps.filter(|c| *c > 0.0);
        self
    }

    /// Each observer receives at most `bytes_per_second` (`observer_bytes_per_second`; at
    /// least 1); beyond it its oldest bytes are dropped.
    pub fn with_observer_rate(mut self, bytes_per_second: u64) -> Self {
        self.fanout = ConsoleFanout::new(FanoutOptions {
            observer_rate: bytes_per_second.max(1),
            ..FanoutOptions::default()
        });
        self
    }

    /// Keeps this console out of the exporter's transcripts (`transcript: false`).
    pub fn without_transcript(mut self) -> Self {
        self.transcript = false;
        self
    }

    /// The session's transcript recorder for this console, unless it is kept out.
    fn recorder(&self, ctx: &CallContext) -> Option<Arc<dyn ConsoleRecorder>> {
        self.transcript.then(|| ctx.console_recorder()).flatten()
    }

    /// Constructor for the registry: upstream's fields (see the module docs).
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        Ok(Arc::new(Self::from_config(args)?))
    }

    /// A console from its config fields (see the module docs); errors name the field.
    pub fn from_config(args: &DriverArgs) -> Result<Self, DriverError> {
        if let Some(v) = args.config.get("transcript")
            && !v.is_boolean()
        {
            return Err(DriverError::InvalidArgument(format!(
                "transcript: must be true or false, not {v}"
            )));
        }
        if let Some(v) = args.config.get("observer_bytes_per_second")
            && v.as_u64().is_none_or(|n| n == 0)
        {
            return Err(DriverError::InvalidArgument(format!(
                "observer_bytes_per_second: must be a whole number of bytes greater than 0, \
                 not {v}"
            )));
        }
        let c: Config = args.parse()?;
        let url = SerialUrl::parse(&c.url)?;
        if c.baudrate == 0 {
            return Err(DriverError::InvalidArgument(
                "baudrate: must be greater than 0".into(),
            ));
        }
        if let Some(cps) = c.cps
            && !(cps.is_finite() && cps >= 0.0)
        {
            return Err(DriverError::InvalidArgument(format!(
                "cps: must be a non-negative number of characters per second, not {cps}"
            )));
        }
        if c.check_present
            && let SerialUrl::Device(path) = &url
        {
            device::probe_device(path).map_err(|e| {
                DriverError::InvalidArgument(format!(
                    "url: serial device {} is not present ({e}); set check_present: false to \
                     start without it",
                    path.display()
                ))
            })?;
        }
        let serial = PySerial::new(url)
            .with_settings(LineSettings {
                baudrate: c.baudrate,
                disable_hupcl: c.disable_hupcl,
            })
            .with_cps(c.cps)
            .with_observer_rate(c.observer_bytes_per_second);
        Ok(if c.transcript {
            serial
        } else {
            serial.without_transcript()
        })
    }

    /// Opens the physical console (the fan-out's source), throttled to `cps`.
    async fn open_source(&self, ctx: &CallContext) -> Result<BoxDuplex, DriverError> {
        let cps = self.cps.map(|c| format!(", cps: {c}")).unwrap_or_default();
        ctx.log_info(format!(
            "Connecting to {}, baudrate: {}{cps}",
            self.url_text(),
            self.settings.baudrate
        ));
        let io: BoxDuplex = match &self.url {
            SerialUrl::Loop => {
                let (r, w) = tokio::io::simplex(LOOP_BUFFER);
                Box::new(tokio::io::join(r, w))
            }
            SerialUrl::Socket { host, port } => {
                let s = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(|e| {
                        DriverError::because(
                            format!("cannot connect to serial console {}", self.url_text()),
                            e,
                        )
                    })?;
                let _ = s.set_nodelay(true);
                Box::new(s)
            }
            SerialUrl::Device(path) => {
                Box::new(device::open_device(path, self.settings).map_err(|e| {
                    DriverError::because(format!("cannot open serial device {}", path.display()), e)
                })?)
            }
        };
        Ok(Box::new(Throttled::new(io, self.cps)))
    }

    fn url_text(&self) -> String {
        match &self.url {
            SerialUrl::Device(p) => p.display().to_string(),
            SerialUrl::Socket { host, port } => {
                format!("socket://{}", crate::network::format_host_port(host, *port))
            }
            SerialUrl::Loop => "loop://".into(),
        }
    }

    async fn close_all(&self) {
        self.fanout.close_all();
    }

    /// At the end of a session: every stream ends and the scrollback is forgotten (the next
    /// lease's observers see nothing of this one's).
    async fn session_ended(&self) {
        self.fanout.reset();
    }

    async fn modem_line(&self, line: modem::ModemLine, value: bool) -> Result<(), DriverError> {
        match &self.url {
            // pyserial ignores modem lines on these URLs.
            SerialUrl::Loop | SerialUrl::Socket { .. } => Ok(()),
            SerialUrl::Device(path) => {
                let path = path.clone();
                let baudrate = self.settings.baudrate;
                tokio::task::spawn_blocking(move || {
                    modem::set_modem_line(&path, baudrate, line, value)
                })
                .await
                .map_err(|e| DriverError::because(format!("setting {line:?} failed"), e))?
                .map_err(DriverError::other)
            }
        }
    }
}

/// Writes at most `cps` characters per second to the inner stream (one byte at a time,
/// spaced evenly); reads pass through.
pub struct Throttled<T> {
    inner: T,
    gap: Option<Duration>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> Throttled<T> {
    /// Throttles writes to `cps` characters per second (`None` or 0: not at all).
    pub fn new(inner: T, cps: Option<f64>) -> Self {
        let gap = cps
            .filter(|c| c.is_finite() && *c > 0.0)
            .map(|c| Duration::from_secs_f64(1.0 / c));
        Self {
            inner,
            gap,
            wait: None,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Throttled<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Throttled<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let Some(gap) = this.gap else {
            return Pin::new(&mut this.inner).poll_write(cx, data);
        };
        if let Some(wait) = this.wait.as_mut() {
            ready!(wait.as_mut().poll(cx));
            this.wait = None;
        }
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, &data[..data.len().min(1)]))?;
        if n > 0 {
            this.wait = Some(Box::pin(tokio::time::sleep(gap)));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn args(v: serde_json::Value) -> DriverArgs {
        DriverArgs { config: v }
    }

    fn err(r: Result<Arc<dyn Driver>, DriverError>) -> String {
        match r {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn urls_parse_as_pyserial_names_them() {
        assert_eq!(SerialUrl::parse("loop://").unwrap(), SerialUrl::Loop);
        assert_eq!(
            SerialUrl::parse("/dev/ttyUSB0").unwrap(),
            SerialUrl::Device("/dev/ttyUSB0".into())
        );
        assert_eq!(
            SerialUrl::parse("socket://console:7001").unwrap(),
            SerialUrl::Socket {
                host: "console".into(),
                port: 7001
            }
        );
        assert_eq!(
            SerialUrl::parse("socket://[::1]:7001").unwrap(),
            SerialUrl::Socket {
                host: "::1".into(),
                port: 7001
            }
        );
        for (bad, why) in [
            ("", "empty"),
            ("socket://host", "HOST:PORT"),
            ("socket://:5", "host"),
            ("socket://h:99999", "port"),
            ("rfc2217://h:5", "rfc2217"),
            ("spy://x", "spy"),
            ("loop://?logging=debug", "options"),
        ] {
            let e = SerialUrl::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with("url: ") && e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn config_fields_are_checked_and_named() {
        let e = err(PySerial::from_args(&args(serde_json::json!({}))));
        assert!(e.contains("url"), "{e}");
        let e = err(PySerial::from_args(&args(
            serde_json::json!({"url": "loop://", "baud": 9600}),
        )));
        assert!(e.contains("baud"), "{e}");
        let e = err(PySerial::from_args(&args(
            serde_json::json!({"url": "loop://", "transcript": "off"}),
        )));
        assert!(e.contains("transcript"), "{e}");
        assert!(
            PySerial::from_args(&args(
                serde_json::json!({"url": "loop://", "transcript": false})
            ))
            .is_ok()
        );
        let e = err(PySerial::from_args(&args(
            serde_json::json!({"url": "loop://", "baudrate": 0}),
        )));
        assert!(e.contains("baudrate"), "{e}");
        let e = err(PySerial::from_args(&args(
            serde_json::json!({"url": "loop://", "cps": -1.0}),
        )));
        assert!(e.contains("cps"), "{e}");
        for bad in [
            serde_json::json!(0),
            serde_json::json!(-1),
            serde_json::json!("4M"),
        ] {
            let e = err(PySerial::from_args(&args(
                serde_json::json!({"url": "loop://", "observer_bytes_per_second": bad}),
            )));
            assert!(e.contains("observer_bytes_per_second"), "{bad}: {e}");
        }
        let rate = |v: serde_json::Value| {
            PySerial::from_config(&args(v))
                .unwrap()
                .fanout
                .options()
                .observer_rate
        };
        assert_eq!(
            rate(serde_json::json!({"url": "loop://"})),
            OBSERVER_BYTES_PER_SECOND
        );
        assert_eq!(
            rate(serde_json::json!({"url": "loop://", "observer_bytes_per_second": 1000})),
            1000
        );
        let e = err(PySerial::from_args(&args(
            serde_json::json!({"url": "/dev/no-such-serial-device"}),
        )));
        assert!(
            e.contains("url")
                && e.contains("/dev/no-such-serial-device")
                && e.contains("check_present"),
            "{e}"
        );
        let ok = PySerial::from_args(&args(serde_json::json!({
            "url": "/dev/no-such-serial-device", "check_present": false,
            "baudrate": 9600, "cps": 100, "disable_hupcl": true,
        })));
        assert!(ok.is_ok());
    }

    #[tokio::test]
    async fn loop_echoes_and_close_ends_the_stream() {
        let serial = PySerial::new(SerialUrl::Loop);
        let ctx = CallContext::detached("PySerial");
        let mut s = serial.connect(&ctx).await.unwrap();
        s.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        serial.close(&ctx).await.unwrap();
        assert_eq!(s.read(&mut buf).await.unwrap(), 0, "closed reads as ended");
        assert!(s.write_all(b"x").await.is_err());
        // A later connection is not closed by the earlier close().
        let mut s = serial.connect(&ctx).await.unwrap();
        s.write_all(b"ok").await.unwrap();
        let mut buf = [0u8; 2];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ok");
    }

    #[tokio::test]
    async fn cps_spaces_out_what_is_written() {
        let serial = PySerial::new(SerialUrl::Loop).with_cps(Some(100.0));
        let ctx = CallContext::detached("PySerial");
        let mut s = serial.connect(&ctx).await.unwrap();
        let start = tokio::time::Instant::now();
        s.write_all(b"abcde").await.unwrap();
        // Five bytes at 100 per second: at least four gaps of 10 ms (a lower bound only).
        assert!(
            start.elapsed() >= Duration::from_millis(40),
            "{:?}",
            start.elapsed()
        );
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"abcde");
    }

    #[tokio::test]
    async fn modem_lines_are_no_ops_on_urls_and_clear_errors_on_devices_without_them() {
        let lp = PySerial::new(SerialUrl::Loop);
        assert!(lp.set_dtr(true).await.is_ok());
        assert!(lp.set_rts(false).await.is_ok());
        let missing = PySerial::new(SerialUrl::Device("/dev/no-such-serial-device".into()));
        let e = missing.set_dtr(true).await.err().unwrap().to_string();
        assert!(
            e.contains("cannot open serial device /dev/no-such-serial-device"),
            "{e}"
        );
        // A pseudo-terminal opens like a serial port but has no modem lines: Linux refuses
        // the request (ENOTTY), and the error says which device and line, and why.
        let pty = Pty::open().unwrap();
        let path = pty.device_path.display().to_string();
        let dev = PySerial::new(SerialUrl::Device(pty.device_path.clone()));
        for (what, r) in [
            ("DTR", dev.set_dtr(true).await),
            ("RTS", dev.set_rts(false).await),
        ] {
            let e = r.err().unwrap().to_string();
            assert!(
                e.contains(&format!("serial device {path} refused to set {what}"))
                    && e.contains("cannot set DTR/RTS"),
                "{e}"
            );
        }
    }

    #[tokio::test]
    async fn a_missing_device_fails_connect_clearly() {
        let serial = PySerial::new(SerialUrl::Device("/dev/no-such-serial-device".into()));
        let e = serial
            .connect(&CallContext::detached("PySerial"))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("/dev/no-such-serial-device"), "{e}");
    }
}
