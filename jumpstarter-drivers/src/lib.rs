//! Stock Jumpstarter drivers: their exporter halves, mocks, client halves and `j` commands,
//! and the registry mapping config `type:` names (upstream's Python class paths, so upstream
//! configs work unchanged) to constructors.
//!
//! An embedder uses three things, all re-exported here:
//! - [`stock_registry`]: hand it to the exporter runtime to build drivers from a config;
//! - the drivers (exporter halves) and their clients, one pair per upstream package:
//!   power ([`MockPower`], [`PowerClient`]), storage ([`Opendal`], [`OpendalClient`],
//!   [`MockStorageMux`], [`MockStorageMuxFlasher`], [`StorageMuxClient`]), serial
//!   ([`PySerial`], [`PySerialClient`], the expect API [`Console`]), network
//!   ([`TcpNetwork`], [`UdpNetwork`], [`UnixNetwork`], [`EchoNetwork`], [`NetworkClient`])
//!   and [`Composite`], with the types their methods take and return;
//! - [`j_command`] and [`run_j_command`]: the `j` command tree built from a lease's driver
//!   reports, and running what the user chose; [`j_command_with`] and
//!   [`run_j_command_with`] do the same with a [`CommandTable`] of one's own
//!   ([`stock_commands`] plus a lab's [`DriverCommand`]s, see `docs/writing-a-driver.md`).
//!
//! The modules are private: helpers shared between drivers, and each driver's `j`
//! subcommands, are not part of the API.

mod boot_server;
mod cli;
mod command;
mod composite;
#[cfg(test)]
mod fuzz_tests;
mod http_power;
mod http_server;
mod network;
mod power;
mod qemu;
mod serial;
mod shell;
mod snmp;
mod storage;
mod tftp;

pub use cli::{
    j_command, j_command_with, run as run_j_command, run_with as run_j_command_with, stock_commands,
};
pub use command::{CliFuture, CommandTable, DriverCommand};
pub use composite::{COMPOSITE_CLIENT, Composite};
pub use http_power::{HttpError, HttpPower};
pub use http_server::{HTTP_SERVER_CLIENT, HttpServer, HttpServerClient};
pub use network::{
    EchoNetwork, Forwarder, NETWORK_CLIENT, NetworkClient, Novnc, TcpNetwork, UdpNetwork,
    UdpStream, UnixNetwork, WebsocketNetwork,
};
pub use power::{MockPower, POWER_CLIENT, PowerClient, PowerReading};
pub use qemu::{
    Accel, Hostfwd, QEMU_CLIENT, QEMU_FLASHER_CLIENT, Qemu, QemuClient, QemuFlasher,
    QemuFlasherClient, QemuPower,
};
pub use serial::{
    Console, ExpectError, LineSettings, Match, PYSERIAL_CLIENT, Pty, PySerial, PySerialClient,
    SerialUrl, TtyStream,
};
pub use shell::{SHELL_CLIENT, Shell, ShellClient, ShellOutput, TIMEOUT_EXIT_CODE};
pub use snmp::{SNMP_CLIENT, SnmpError, SnmpServer};
pub use storage::Presign;
pub use storage::{
    Capability, DEFAULT_PARTITION, EntryMode, FlasherClient, HashAlgo, Metadata, MockFlasher,
    MockStorageMux, MockStorageMuxFlasher, OPENDAL_CLIENT, Opendal, OpendalClient, OpendalFile,
    PresignedRequest, Progress, ProgressReader, ProgressWriter, STORAGE_MUX_CLIENT,
    STORAGE_MUX_FLASHER_CLIENT, StorageError, StorageMuxClient, TransferOptions, detect_encoding,
    hash_reader,
};
pub use tftp::{TFTP_CLIENT, Tftp, TftpServerClient};

use jumpstarter_core::driver::{COMPOSITE_TYPE, DriverRegistry};

/// Every stock driver under its upstream config type name.
pub fn stock_registry() -> DriverRegistry {
    let mut r = DriverRegistry::new();
    r.register(COMPOSITE_TYPE, composite::Composite::from_args)
        .register(
            "jumpstarter_driver_power.driver.MockPower",
            power::MockPower::from_args,
        )
        .register(
            "jumpstarter_driver_power.driver.SyncMockPower",
            power::MockPower::from_args,
        )
        .register(
            "jumpstarter_driver_opendal.driver.Opendal",
            storage::Opendal::from_args,
        )
        .register(
            "jumpstarter_driver_opendal.driver.MockStorageMux",
            storage::MockStorageMux::from_args,
        )
        .register(
            "jumpstarter_driver_opendal.driver.MockStorageMuxFlasher",
            storage::MockStorageMuxFlasher::from_args,
        )
        .register(
            "jumpstarter_driver_network.driver.TcpNetwork",
            network::TcpNetwork::from_args,
        )
        .register(
            "jumpstarter_driver_network.driver.UdpNetwork",
            network::UdpNetwork::from_args,
        )
        .register(
            "jumpstarter_driver_network.driver.UnixNetwork",
            network::UnixNetwork::from_args,
        )
        .register(
            "jumpstarter_driver_network.driver.EchoNetwork",
            network::EchoNetwork::from_args,
        )
        .register(
            "jumpstarter_driver_network.driver.WebsocketNetwork",
            network::WebsocketNetwork::from_args,
        )
        .register(serial::nvdemux::NVDEMUX_TYPE, serial::nvdemux::refuse)
        .register(
            "jumpstarter_driver_pyserial.driver.PySerial",
            serial::PySerial::from_args,
        )
        .register("jumpstarter_driver_qemu.driver.Qemu", qemu::Qemu::from_args)
        .register(
            "jumpstarter_driver_shell.driver.Shell",
            shell::Shell::from_args,
        )
        .register(
            "jumpstarter_driver_snmp.driver.SNMPServer",
            snmp::SnmpServer::from_args,
        )
        .register(
            "jumpstarter_driver_http_power.driver.HttpPower",
            http_power::HttpPower::from_args,
        )
        .register(
            "jumpstarter_driver_opendal.driver.MockFlasher",
            storage::MockFlasher::from_args,
        )
        .register(
            "jumpstarter_driver_http.driver.HttpServer",
            http_server::HttpServer::from_args,
        )
        .register("jumpstarter_driver_tftp.driver.Tftp", tftp::Tftp::from_args);
    r
}
