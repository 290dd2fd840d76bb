//! The exporter half: [`Chamber`], a climate chamber without hardware.

use std::sync::{Arc, Mutex};

use futures::{StreamExt, stream::BoxStream};
use jumpstarter_core::{CallContext, Driver, DriverError, driver, driver::DriverArgs};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// The config `type:` of the chamber (upstream's naming: `PACKAGE.driver.CLASS`).
pub const CHAMBER_TYPE: &str = "jumpstarter_example_chamber.driver.Chamber";

/// The client class the chamber reports (`jumpstarter.dev/client`): upstream's Python client
/// imports it from `python/jumpstarter_example_chamber/client.py`; `my-j` maps it to
/// [`crate::cli`].
pub const CHAMBER_CLIENT: &str = "jumpstarter_example_chamber.client.ChamberClient";

/// Most readings one `read` call streams.
pub const MAX_READ_COUNT: u32 = 10_000;

/// Longest console line (bytes, newline excluded); longer ones are answered with an error.
pub const MAX_LINE: usize = 1024;

/// Bytes buffered in each direction of a console connection.
const CONSOLE_BUFFER: usize = 16 * 1024;

/// The chamber's `config:` mapping.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChamberConfig {
    /// A name for the chamber, reported by `info`.
    #[serde(default = "default_label")]
    pub label: String,
    /// Temperature sensors (1 to 8); `read` yields one reading per sensor per round.
    #[serde(default = "default_sensors")]
    pub sensors: u8,
    /// The target temperature at start, °C.
    #[serde(default = "default_setpoint")]
    pub setpoint: f64,
    /// The lowest target allowed, °C.
    #[serde(default = "default_min")]
    pub min: f64,
    /// The highest target allowed, °C.
    #[serde(default = "default_max")]
    pub max: f64,
}

fn default_label() -> String {
    "chamber".into()
}
fn default_sensors() -> u8 {
    2
}
fn default_setpoint() -> f64 {
    25.0
}
fn default_min() -> f64 {
    -40.0
}
fn default_max() -> f64 {
    150.0
}

impl ChamberConfig {
    /// Checks the fields together: a clear error naming the field at fault.
    fn check(&self) -> Result<(), DriverError> {
        let bad = |m: String| Err(DriverError::InvalidArgument(m));
        if !(1..=8).contains(&self.sensors) {
            return bad(format!("sensors: {} is not between 1 and 8", self.sensors));
        }
        if !(self.min.is_finite() && self.max.is_finite() && self.min < self.max) {
            return bad(format!(
                "min/max: {} .. {} is not a range of finite temperatures",
                self.min, self.max
            ));
        }
        if !(self.min..=self.max).contains(&self.setpoint) {
            return bad(format!(
                "setpoint: {} is outside min/max ({} .. {})",
                self.setpoint, self.min, self.max
            ));
        }
        Ok(())
    }
}

/// What `info` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChamberInfo {
    /// The config's `label`.
    pub label: String,
    /// The number of sensors.
    pub sensors: u8,
    /// The lowest target allowed, °C.
    pub min: f64,
    /// The highest target allowed, °C.
    pub max: f64,
}

/// One sensor reading.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    /// Which sensor (0-based).
    pub sensor: u8,
    /// Its temperature, °C.
    pub celsius: f64,
}

/// A climate chamber without hardware: it holds its target, and sensor N reads the target
/// plus N degrees.
#[derive(Debug)]
pub struct Chamber {
    config: ChamberConfig,
    target: Arc<Mutex<f64>>,
}

#[driver(client = "jumpstarter_example_chamber.client.ChamberClient")]
impl Chamber {
    /// Sets the target temperature (°C); returns the previous one.
    #[export]
    async fn set_target(&self, ctx: &CallContext, celsius: f64) -> Result<f64, DriverError> {
        let previous = store_target(&self.config, &self.target, celsius)?;
        ctx.log_info(format!("target {previous} -> {celsius} °C"));
        Ok(previous)
    }

    /// The target temperature, °C.
    #[export]
    async fn target(&self) -> Result<f64, DriverError> {
        Ok(load_target(&self.target))
    }

    /// The chamber's label, sensors and allowed range.
    #[export]
    async fn info(&self) -> Result<ChamberInfo, DriverError> {
        Ok(ChamberInfo {
            label: self.config.label.clone(),
            sensors: self.config.sensors,
            min: self.config.min,
            max: self.config.max,
        })
    }

    /// `count` rounds of readings, one per sensor each (1 to [`MAX_READ_COUNT`] rounds).
    #[export(streaming)]
    async fn read(
        &self,
        count: u32,
    ) -> Result<BoxStream<'static, Result<Reading, DriverError>>, DriverError> {
        if !(1..=MAX_READ_COUNT).contains(&count) {
            return Err(DriverError::InvalidArgument(format!(
                "count: {count} is not between 1 and {MAX_READ_COUNT}"
            )));
        }
        let sensors = self.config.sensors;
        let shared = Arc::clone(&self.target);
        let readings = (0..count).flat_map(move |_| 0..sensors).map(move |sensor| {
            Ok(Reading {
                sensor,
                celsius: load_target(&shared) + f64::from(sensor),
            })
        });
        Ok(futures::stream::iter(readings).boxed())
    }

    /// The chamber controller's console, a line protocol: `TARGET?` answers `TARGET <°C>`,
    /// `TARGET <°C>` sets it and answers `OK <previous>`, anything else `ERR ...`.
    #[export(stream)]
    async fn console(&self, ctx: &CallContext) -> Result<DuplexStream, DriverError> {
        ctx.log_info("console opened");
        let (ours, theirs) = tokio::io::duplex(CONSOLE_BUFFER);
        tokio::spawn(serve_console(
            ours,
            self.config.clone(),
            Arc::clone(&self.target),
        ));
        Ok(theirs)
    }
}

impl Chamber {
    /// Constructor for the registry: the `config:` mapping, checked.
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        let config: ChamberConfig = args.parse()?;
        config.check()?;
        Ok(Arc::new(Chamber {
            target: Arc::new(Mutex::new(config.setpoint)),
            config,
        }))
    }
}

fn load_target(shared: &Mutex<f64>) -> f64 {
    *shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn store_target(
    config: &ChamberConfig,
    shared: &Mutex<f64>,
    celsius: f64,
) -> Result<f64, DriverError> {
    if !(config.min..=config.max).contains(&celsius) {
        return Err(DriverError::InvalidArgument(format!(
            "target {celsius} °C is outside {} .. {} °C",
            config.min, config.max
        )));
    }
    let mut t = shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok(std::mem::replace(&mut *t, celsius))
}

/// The answer to one console line.
fn answer(config: &ChamberConfig, shared: &Mutex<f64>, line: &str) -> String {
    let line = line.trim();
    match line.split_once(' ') {
        _ if line == "TARGET?" => format!("TARGET {}", load_target(shared)),
        Some(("TARGET", value)) => match value.trim().parse::<f64>() {
            Ok(celsius) => match store_target(config, shared, celsius) {
                Ok(previous) => format!("OK {previous}"),
                Err(e) => format!("ERR {e}"),
            },
            Err(_) => format!("ERR not a temperature: {value:?}"),
        },
        _ => format!("ERR unknown command: {line:?}"),
    }
}

/// Answers console lines until the client closes its side.
async fn serve_console(mut io: DuplexStream, config: ChamberConfig, shared: Arc<Mutex<f64>>) {
    let mut pending: Vec<u8> = Vec::new();
    let mut too_long = false;
    let mut buf = [0u8; 4096];
    loop {
        let n = match io.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        for &b in &buf[..n] {
            if b != b'\n' {
                if pending.len() < MAX_LINE {
                    pending.push(b);
                } else {
                    too_long = true;
                }
                continue;
            }
            let reply = if too_long {
                format!("ERR line longer than {MAX_LINE} bytes")
            } else {
                answer(&config, &shared, &String::from_utf8_lossy(&pending))
            };
            pending.clear();
            too_long = false;
            if io.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn config(v: serde_json::Value) -> Result<Arc<dyn Driver>, DriverError> {
        Chamber::from_args(&DriverArgs { config: v })
    }

    #[test]
    fn bad_configs_name_the_field() {
        let e = |v| config(v).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e(serde_json::json!({"sensors": 9})).contains("sensors"));
        assert!(e(serde_json::json!({"min": 10, "max": 0})).contains("min/max"));
        assert!(e(serde_json::json!({"setpoint": 500})).contains("setpoint"));
        assert!(e(serde_json::json!({"colour": "red"})).contains("colour"));
        assert!(config(serde_json::Value::Null).is_ok());
    }

    #[test]
    fn console_lines() {
        let c: ChamberConfig = serde_json::from_value(serde_json::json!({})).unwrap();
        let t = Mutex::new(25.0);
        assert_eq!(answer(&c, &t, "TARGET?"), "TARGET 25");
        assert_eq!(answer(&c, &t, "TARGET 30.5\r"), "OK 25");
        assert_eq!(answer(&c, &t, "TARGET?"), "TARGET 30.5");
        assert!(answer(&c, &t, "TARGET 900").starts_with("ERR target 900"));
        assert!(answer(&c, &t, "TARGET hot").starts_with("ERR not a temperature"));
        assert!(answer(&c, &t, "OPEN DOOR").starts_with("ERR unknown command"));
        assert_eq!(answer(&c, &t, "TARGET?"), "TARGET 30.5");
    }

    #[tokio::test]
    async fn console_survives_an_overlong_line() {
        let c: ChamberConfig = serde_json::from_value(serde_json::json!({})).unwrap();
        let (ours, mut theirs) = tokio::io::duplex(CONSOLE_BUFFER);
        let task = tokio::spawn(serve_console(ours, c, Arc::new(Mutex::new(20.0))));
        let mut long = vec![b'x'; MAX_LINE * 3];
        long.extend_from_slice(b"\nTARGET?\n");
        theirs.write_all(&long).await.unwrap();
        let mut got = Vec::new();
        while got.iter().filter(|&&b| b == b'\n').count() < 2 {
            let mut b = [0u8; 256];
            let n = theirs.read(&mut b).await.unwrap();
            assert!(n > 0, "console closed early: {got:?}");
            got.extend_from_slice(&b[..n]);
        }
        assert_eq!(
            String::from_utf8(got).unwrap(),
            format!("ERR line longer than {MAX_LINE} bytes\nTARGET 20\n")
        );
        drop(theirs);
        task.await.unwrap();
    }
}
