//! A serial device (or either end of a pseudo-terminal) as an async byte stream.
//!
//! The device is opened non-blocking and set to raw 8N1 at the configured baud rate through
//! termios (`rustix`, no `unsafe`); reads and writes go through tokio's reactor. A read of 0
//! bytes or `EIO` means the device hung up (a USB adapter unplugged, the other end of a
//! pty closed): it is reported as an error, never as a quiet end of stream, since a serial
//! line has no end of file.

use std::{
    io,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    pin::Pin,
    task::{Context, Poll, ready},
};

use rustix::{
    fs::{Mode, OFlags},
    termios::{self, ControlModes, OptionalActions},
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, unix::AsyncFd};

/// Line settings applied when a device is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineSettings {
    /// Bits per second.
    pub baudrate: u32,
    /// Leave HUPCL off, so closing the port does not drop DTR (which resets some boards).
    pub disable_hupcl: bool,
}

/// Opens `path` read-write, non-blocking, without making it our controlling terminal.
fn open_fd(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDWR | OFlags::NOCTTY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Raw mode, 8N1, receiver on, modem status ignored, no flow control, `baudrate`.
fn configure(fd: &OwnedFd, settings: LineSettings) -> io::Result<()> {
    let mut t = termios::tcgetattr(fd)?;
    t.make_raw();
    t.control_modes
        .remove(ControlModes::CSIZE | ControlModes::PARENB | ControlModes::CSTOPB);
    t.control_modes.remove(ControlModes::CRTSCTS);
    t.control_modes
        .insert(ControlModes::CS8 | ControlModes::CREAD | ControlModes::CLOCAL);
    if settings.disable_hupcl {
        t.control_modes.remove(ControlModes::HUPCL);
    }
    t.input_modes
        .remove(termios::InputModes::IXON | termios::InputModes::IXOFF);
    t.set_speed(settings.baudrate).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            jumpstarter_core::Because::boxed(
                format!("baud rate {} not supported", settings.baudrate),
                e,
            ),
        )
    })?;
    termios::tcsetattr(fd, OptionalActions::Now, &t)?;
    Ok(())
}

/// Opens and configures the serial device at `path`.
pub fn open_device(path: &Path, settings: LineSettings) -> io::Result<TtyStream> {
    let fd = open_fd(path)?;
    configure(&fd, settings)?;
    TtyStream::new(fd, path.to_path_buf())
}

/// Checks that the device at `path` opens as a terminal (used for `check_present`).
pub fn probe_device(path: &Path) -> io::Result<()> {
    let fd = open_fd(path)?;
    termios::tcgetattr(&fd)?;
    Ok(())
}

/// How much of a read buffer is made ready (zeroed) for one `read(2)`. Callers pass large
/// buffers (the byte-stream framer's is 256 KiB) and `ReadBuf` starts them uninitialised:
/// zeroing all of it for each read of a few KiB cost more than the read itself.
const READ_STEP: usize = 16 * 1024;

/// A terminal file descriptor read and written asynchronously.
#[derive(Debug)]
pub struct TtyStream {
    fd: AsyncFd<OwnedFd>,
    path: PathBuf,
}

impl TtyStream {
    /// Wraps an open terminal descriptor (made non-blocking here); `path` names it in errors.
    pub fn new(fd: OwnedFd, path: PathBuf) -> io::Result<Self> {
        let flags = rustix::fs::fcntl_getfl(&fd)?;
        rustix::fs::fcntl_setfl(&fd, flags | OFlags::NONBLOCK)?;
        // `AsyncFd::new` is deprecated because a type could change the descriptor it
        // reports while registered; an `OwnedFd` never does, so this use is sound (and
        // `AsyncFd::register`, its replacement, is `unsafe`, which this workspace forbids).
        #[allow(deprecated)]
        let fd = AsyncFd::new(fd)?;
        Ok(Self { fd, path })
    }

    fn hung_up(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::BrokenPipe,
            format!(
                "serial device {} disconnected (hung up)",
                self.path.display()
            ),
        )
    }
}

impl AsyncRead for TtyStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            let mut guard = ready!(this.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled_to(buf.remaining().min(READ_STEP));
            match guard.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut *unfilled)?)) {
                Ok(Ok(0)) => return Poll::Ready(Err(this.hung_up())),
                Ok(Ok(n)) => {
                    buf.advance(n);
                    // A pty hands out at most 4 KiB per read (a UART driver often less):
                    // take what else is already waiting, so that one message carries it
                    // all instead of one message per kernel buffer.
                    while buf.remaining() > 0 {
                        let unfilled = buf.initialize_unfilled_to(buf.remaining().min(READ_STEP));
                        match guard.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut *unfilled)?))
                        {
                            Ok(Ok(n)) if n > 0 => buf.advance(n),
                            // Would block: deliver what was read. A hang-up or an error is
                            // read again, and reported, by the next call.
                            _ => break,
                        }
                    }
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) => {
                    return Poll::Ready(Err(this.hung_up()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for TtyStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            let mut guard = ready!(this.fd.poll_write_ready(cx))?;
            match guard.try_io(|fd| Ok(rustix::io::write(fd.get_ref(), data)?)) {
                Ok(Err(e)) if e.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) => {
                    return Poll::Ready(Err(this.hung_up()));
                }
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A serial line has no half-close: the client finishing its input leaves the
        // device open for what the board still prints.
        Poll::Ready(Ok(()))
    }
}

/// A pseudo-terminal pair: the controlling side (a simulated board, or a terminal emulator)
/// and the path of the device side, which opens like a serial port.
#[derive(Debug)]
pub struct Pty {
    /// The controlling (master) side.
    pub controller: TtyStream,
    /// The path of the device (slave) side, e.g. `/dev/pts/3`.
    pub device_path: PathBuf,
    /// The device side kept open, so the controller never reads `EIO` while no one else
    /// has the device open.
    _device_hold: OwnedFd,
}

impl Pty {
    /// Opens a new pseudo-terminal pair, its device side in the kernel's default (cooked)
    /// mode until someone opens it as a serial port (which sets it raw).
    pub fn open() -> io::Result<Self> {
        use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
        let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
        grantpt(&master)?;
        unlockpt(&master)?;
        let name = ptsname(&master, Vec::new())?;
        let device_path = PathBuf::from(
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name.as_bytes()),
        );
        let hold = open_fd(&device_path)?;
        Ok(Self {
            controller: TtyStream::new(master, PathBuf::from("/dev/ptmx"))?,
            device_path,
            _device_hold: hold,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const SETTINGS: LineSettings = LineSettings {
        baudrate: 9600,
        disable_hupcl: true,
    };

    #[tokio::test]
    async fn bytes_cross_a_pty_both_ways_and_a_hang_up_is_an_error() {
        let mut pty = Pty::open().unwrap();
        let mut dev = open_device(&pty.device_path, SETTINGS).unwrap();
        let t = termios::tcgetattr(dev.fd.get_ref()).unwrap();
        assert_eq!(t.output_speed(), 9600);
        assert!(!t.control_modes.contains(ControlModes::HUPCL));
        dev.write_all(b"hello\n").await.unwrap();
        let mut buf = [0u8; 6];
        pty.controller.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello\n", "raw mode keeps bytes as they are");
        pty.controller.write_all(b"\x03back\r").await.unwrap();
        let mut buf = [0u8; 6];
        dev.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"\x03back\r");
        drop(pty);
        let err = dev.read(&mut [0u8; 8]).await.unwrap_err();
        assert!(err.to_string().contains("disconnected"), "{err}");
    }

    #[tokio::test]
    async fn a_burst_larger_than_the_line_disciplines_buffer_arrives_whole_and_in_order() {
        // Reads take what is waiting beyond the pty's 4 KiB per read(2), and zero only
        // what they use of a large caller buffer (the byte-stream framer's is 256 KiB).
        let mut pty = Pty::open().unwrap();
        let mut dev = open_device(&pty.device_path, SETTINGS).unwrap();
        let sent: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let writer = async {
            pty.controller.write_all(&sent).await.unwrap();
        };
        let reader = async {
            let mut got = Vec::with_capacity(sent.len());
            let mut reads = 0;
            while got.len() < sent.len() {
                let mut buf = bytes::BytesMut::with_capacity(256 * 1024);
                let n = dev.read_buf(&mut buf).await.unwrap();
                assert!(n > 0);
                got.extend_from_slice(&buf);
                reads += 1;
            }
            (got, reads)
        };
        let ((), (got, reads)) = tokio::join!(writer, reader);
        assert!(
            got == sent,
            "{} bytes in {reads} reads, not as sent",
            got.len()
        );
    }

    #[test]
    fn a_missing_or_non_terminal_device_is_refused() {
        let e = probe_device(Path::new("/dev/no-such-tty")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let f = tempfile::NamedTempFile::new().unwrap();
        assert!(probe_device(f.path()).is_err(), "a plain file is no tty");
        assert!(
            open_device(
                f.path(),
                LineSettings {
                    baudrate: 9600,
                    disable_hupcl: false
                }
            )
            .is_err()
        );
    }
}
