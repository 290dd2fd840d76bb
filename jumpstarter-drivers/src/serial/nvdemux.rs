//! `jumpstarter_driver_pyserial.nvdemux.driver.NVDemuxSerial`: refused, with an error that
//! names the type and says why.
//!
//! Upstream's driver does not open a serial port itself: it starts NVIDIA's
//! `nv_tcu_demuxer` binary on a Tegra board's multiplexed debug UART (found by a
//! `/dev/serial/by-id` glob), shares that one process between every `NVDemuxSerial` of the
//! exporter, parses the pseudo-terminal path the tool prints for each channel
//! (`CCPLEX: 0`, `BPMP: 1`, ...), restarts it when the USB device comes back after an
//! unplug, and then serves each channel like a `PySerial` on that pty. The byte stream
//! would fit this crate's `PySerial` (a pty is a device path), but the process manager
//! around the vendor tool (one shared child per exporter, its output format, its restart
//! rules) has no counterpart here yet and cannot be tested without the tool and the
//! hardware, so the type is refused at exporter start rather than half-supported.
//! Workaround: run `nv_tcu_demuxer` beside the exporter and point a `PySerial` at the
//! channel's pty (a stable symlink to it).

use std::sync::Arc;

use jumpstarter_core::{Driver, DriverError, driver::DriverArgs};

/// Upstream's config type name of the NVIDIA TCU demultiplexer console.
pub const NVDEMUX_TYPE: &str = "jumpstarter_driver_pyserial.nvdemux.driver.NVDemuxSerial";

/// Constructor for the registry: always refuses, naming the type and the workaround.
pub fn refuse(_args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
    Err(DriverError::Unimplemented(format!(
        "{NVDEMUX_TYPE} is not supported by this exporter (it manages NVIDIA's nv_tcu_demuxer \
         process); run nv_tcu_demuxer yourself and export the channel's pty with \
         jumpstarter_driver_pyserial.driver.PySerial (url: the pty path)"
    )))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_type_is_refused_by_name() {
        let args = DriverArgs {
            config: serde_json::json!({"demuxer_path": "/opt/nv_tcu_demuxer"}),
        };
        let e = refuse(&args).err().unwrap();
        assert!(matches!(e, DriverError::Unimplemented(_)));
        let e = e.to_string();
        assert!(e.contains(NVDEMUX_TYPE) && e.contains("PySerial"), "{e}");
    }
}
