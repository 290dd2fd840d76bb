//! Power: switch a device under test on and off, and read voltage and current.
//!
//! The interface (client `jumpstarter_driver_power.client.PowerClient`): `on()`, `off()`,
//! and the streaming `read()` yielding [`PowerReading`]s. [`MockPower`] implements it
//! without hardware; [`PowerClient`] is the client half (with `cycle`, built from
//! `off`/`on`), and [`cli`] the `j power ...` commands.

mod client;

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use futures::{StreamExt, stream::BoxStream};
use jumpstarter_core::{CallContext, Driver, DriverError, driver, driver::DriverArgs};
use serde::{Deserialize, Serialize};

pub use client::{PowerClient, cli};

/// Upstream client class of power drivers.
pub const POWER_CLIENT: &str = "jumpstarter_driver_power.client.PowerClient";

/// One reading of a power supply.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PowerReading {
    /// Volts.
    pub voltage: f64,
    /// Amperes.
    pub current: f64,
}

impl PowerReading {
    /// Volt-amperes (voltage × current), as the upstream client computes it.
    pub fn apparent_power(&self) -> f64 {
        self.voltage * self.current
    }
}

/// A power switch without hardware: remembers its state and logs each change.
#[derive(Debug, Default)]
pub struct MockPower {
    on: AtomicBool,
}

#[driver(client = "jumpstarter_driver_power.client.PowerClient")]
impl MockPower {
    /// Turns power on.
    #[export]
    async fn on(&self, ctx: &CallContext) -> Result<(), DriverError> {
        self.on.store(true, Ordering::SeqCst);
        ctx.log_info("power on");
        Ok(())
    }

    /// Turns power off.
    #[export]
    async fn off(&self, ctx: &CallContext) -> Result<(), DriverError> {
        self.on.store(false, Ordering::SeqCst);
        ctx.log_info("power off");
        Ok(())
    }

    /// Streams two readings, 0 V/0 A then 5 V/2 A, as upstream's mock does.
    #[export(streaming)]
    async fn read(
        &self,
    ) -> Result<BoxStream<'static, Result<PowerReading, DriverError>>, DriverError> {
        let readings = [
            PowerReading {
                voltage: 0.0,
                current: 0.0,
            },
            PowerReading {
                voltage: 5.0,
                current: 2.0,
            },
        ];
        Ok(futures::stream::iter(readings.map(Ok)).boxed())
    }
}

impl MockPower {
    /// Constructor for the registry (takes no config).
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct NoConfig {}
        let _: NoConfig = args.parse()?;
        Ok(Arc::new(MockPower::default()))
    }

    /// Whether the mock is switched on.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }
}
