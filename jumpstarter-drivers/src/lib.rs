//! Stock Jumpstarter drivers: their exporter halves, mocks, client halves and `j` commands,
//! and the registry mapping config `type:` names (upstream's Python class paths, so upstream
//! configs work unchanged) to constructors.
//!
//! Entry points: [`stock_registry`] (hand it to the exporter runtime to build drivers from a
//! config), and per driver one module holding its exporter half and its client half:
//! [`power`] (`MockPower`, `PowerClient`), [`serial`] (`PySerial`, `PySerialClient`, `Pty`),
//! [`network`] (`TcpNetwork`, `UdpNetwork`, `UnixNetwork`, `NetworkClient`), [`storage`]
//! (`Opendal`, the storage muxes and their clients) and [`composite`]. [`cli`] builds the
//! `j` command tree from a lease's driver reports. The modules stay public because each is
//! the API of one driver, as upstream's one package per driver; helpers shared between
//! drivers stay private.

pub mod cli;
mod command;
pub mod composite;
pub mod network;
pub mod power;
pub mod serial;
pub mod shell;
pub mod storage;

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
            "jumpstarter_driver_pyserial.driver.PySerial",
            serial::PySerial::from_args,
        )
        .register(
            "jumpstarter_driver_shell.driver.Shell",
            shell::Shell::from_args,
        )
        .register(
            "jumpstarter_driver_opendal.driver.MockFlasher",
            storage::MockFlasher::from_args,
        );
    r
}
