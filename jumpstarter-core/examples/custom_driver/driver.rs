//! The example driver: a thermostat with a unary, a typed-struct and a streaming method.

use std::sync::Mutex;

use futures::{StreamExt, stream::BoxStream};
use jumpstarter_core::{CallContext, DriverError, driver};
use serde::{Deserialize, Serialize};

/// A thermostat with a target temperature and a simulated sensor.
#[derive(Default)]
pub struct Thermostat {
    target: Mutex<f64>,
}

/// What `status()` returns.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct ThermostatStatus {
    /// Target temperature in °C.
    pub target: f64,
    /// Whether the heater is running.
    pub heating: bool,
}

#[driver(client = "my_lab.client.ThermostatClient")]
impl Thermostat {
    /// Sets the target temperature; returns the previous one.
    #[export]
    async fn set_target(&self, ctx: &CallContext, celsius: f64) -> Result<f64, DriverError> {
        if !(-40.0..=120.0).contains(&celsius) {
            // INVALID_ARGUMENT on the wire.
            return Err(DriverError::InvalidArgument(format!(
                "target {celsius} °C is outside -40..=120"
            )));
        }
        ctx.log_info(format!("target set to {celsius} °C"));
        let mut t = self
            .target
            .lock()
            .map_err(|_| DriverError::failed("lock poisoned"))?;
        Ok(std::mem::replace(&mut *t, celsius))
    }

    /// Returns the current status.
    #[export]
    async fn status(&self) -> Result<ThermostatStatus, DriverError> {
        let target = *self
            .target
            .lock()
            .map_err(|_| DriverError::failed("lock poisoned"))?;
        Ok(ThermostatStatus {
            target,
            heating: target > 20.0,
        })
    }

    /// Streams `count` simulated sensor readings.
    #[export(streaming)]
    async fn readings(
        &self,
        count: u32,
    ) -> Result<BoxStream<'static, Result<f64, DriverError>>, DriverError> {
        Ok(futures::stream::iter((0..count).map(|i| Ok(19.5 + f64::from(i) * 0.1))).boxed())
    }
}
