//! DTR and RTS on a serial device, as upstream's `set_dtr` / `set_rts`: the device is
//! opened afresh, the line set, and the device closed again (pyserial's
//! `serial_for_url(url, baudrate)` then `s.dtr = value`). The modem-line ioctls
//! (`TIOCMBIS` / `TIOCMBIC`) go through the `serialport` crate's safe API.

use std::path::Path;

use serialport::SerialPort;

/// A modem control line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModemLine {
    /// Data Terminal Ready.
    Dtr,
    /// Request To Send.
    Rts,
}

impl ModemLine {
    fn name(self) -> &'static str {
        match self {
            ModemLine::Dtr => "DTR",
            ModemLine::Rts => "RTS",
        }
    }
}

/// Why a modem line could not be set.
#[derive(Debug, thiserror::Error)]
pub enum ModemError {
    /// The device did not open.
    #[error("cannot open serial device {path}")]
    Open {
        /// The device path.
        path: String,
        /// What the open reported.
        #[source]
        source: serialport::Error,
    },
    /// The device opened but refused the modem-line request: pseudo-terminals and some
    /// adapters have no modem lines.
    #[error(
        "serial device {path} refused to set {line} (pseudo-terminals and adapters without \
         modem control lines cannot set DTR/RTS)"
    )]
    Refused {
        /// The device path.
        path: String,
        /// The line's name.
        line: &'static str,
        /// What the ioctl reported.
        #[source]
        source: serialport::Error,
    },
}

/// Opens `path` at `baudrate`, sets `line` to `value` and closes the device again. Blocks:
/// call it off the async runtime.
pub fn set_modem_line(
    path: &Path,
    baudrate: u32,
    line: ModemLine,
    value: bool,
) -> Result<(), ModemError> {
    let shown = path.display().to_string();
    // Not exclusive: a `connect` may hold the device open (pyserial opens shared too).
    let mut port = serialport::new(path.to_string_lossy(), baudrate)
        .exclusive(false)
        .open_native()
        .map_err(|source| ModemError::Open {
            path: shown.clone(),
            source,
        })?;
    let set = match line {
        ModemLine::Dtr => port.write_data_terminal_ready(value),
        ModemLine::Rts => port.write_request_to_send(value),
    };
    set.map_err(|source| ModemError::Refused {
        path: shown,
        line: line.name(),
        source,
    })
}
