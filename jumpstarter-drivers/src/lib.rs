//! Stock Jumpstarter drivers: their exporter halves, mocks, client halves and `j` commands,
//! and the registry mapping config `type:` names (upstream's Python class paths, so upstream
//! configs work unchanged) to constructors.

pub mod cli;
pub mod composite;
pub mod power;
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
        );
    r
}
