//! The client half of power drivers and the `j power` commands.

use std::time::Duration;

use clap::{Arg, ArgMatches, Command, value_parser};
use futures::{StreamExt, stream::BoxStream};
use jumpstarter_core::{ClientError, client::DriverClient};

use super::PowerReading;
use crate::command::{CliFuture, DriverCommand};

/// Typed client for drivers reporting `jumpstarter_driver_power.client.PowerClient`.
#[derive(Clone)]
pub struct PowerClient(pub DriverClient);

impl PowerClient {
    /// Turns power on. What the driver returns is ignored, as upstream's client does (its
    /// SNMP driver answers with a message).
    pub async fn on(&self) -> Result<(), ClientError> {
        let _: serde::de::IgnoredAny = self.0.call("on", ()).await?;
        Ok(())
    }

    /// Turns power off (what the driver returns is ignored, as for [`PowerClient::on`]).
    pub async fn off(&self) -> Result<(), ClientError> {
        let _: serde::de::IgnoredAny = self.0.call("off", ()).await?;
        Ok(())
    }

    /// Off, wait, on.
    pub async fn cycle(&self, wait: Duration) -> Result<(), ClientError> {
        self.off().await?;
        tokio::time::sleep(wait).await;
        self.on().await
    }

    /// Streams readings.
    pub async fn read(
        &self,
    ) -> Result<BoxStream<'static, Result<PowerReading, ClientError>>, ClientError> {
        self.0.streaming_call("read", ()).await
    }
}

/// Formats a reading as upstream's `j power read` does.
pub fn format_reading(r: &PowerReading) -> String {
    format!(
        "voltage={:?} V  current={:?} A  apparent_power={:?} VA",
        r.voltage,
        r.current,
        r.apparent_power()
    )
}

/// The `j power` commands.
pub fn cli() -> DriverCommand {
    DriverCommand {
        about: "Generic power",
        build,
        run,
    }
}

fn build(cmd: Command) -> Command {
    cmd.subcommand_required(true)
        .subcommand(Command::new("on").about("Power on"))
        .subcommand(Command::new("off").about("Power off"))
        .subcommand(
            Command::new("cycle").about("Power cycle").arg(
                Arg::new("wait")
                    .short('w')
                    .long("wait")
                    .value_parser(value_parser!(f64))
                    .default_value("2")
                    .help("Wait time in seconds between off and on"),
            ),
        )
        .subcommand(
            Command::new("read")
                .about("Read power readings")
                .arg(
                    Arg::new("count")
                        .short('n')
                        .long("count")
                        .value_parser(value_parser!(u64))
                        .default_value("1")
                        .help("Number of times to read (0 = until interrupted)"),
                )
                .arg(
                    Arg::new("interval")
                        .short('i')
                        .long("interval")
                        .value_parser(value_parser!(f64))
                        .default_value("1.0")
                        .help("Seconds between reads"),
                ),
        )
}

fn run(client: DriverClient, matches: ArgMatches) -> CliFuture {
    Box::pin(async move {
        let power = PowerClient(client);
        match matches.subcommand() {
            // Upstream prints nothing here; a confirmation on stderr leaves stdout as
            // upstream's for scripts.
            Some(("on", _)) => power.on().await.map(|()| eprintln!("Powered on")),
            Some(("off", _)) => power.off().await.map(|()| eprintln!("Powered off")),
            Some(("cycle", m)) => {
                let wait = m.get_one::<f64>("wait").copied().unwrap_or(2.0);
                if !(wait.is_finite() && wait >= 0.0) {
                    return Err(ClientError::Value(format!("invalid wait time: {wait}")));
                }
                println!("Power cycling with {wait} seconds wait time...");
                power.cycle(Duration::from_secs_f64(wait)).await?;
                eprintln!("Power cycled");
                Ok(())
            }
            Some(("read", m)) => {
                let count = m.get_one::<u64>("count").copied().unwrap_or(1);
                let interval = m.get_one::<f64>("interval").copied().unwrap_or(1.0);
                if !(interval.is_finite() && interval >= 0.0) {
                    return Err(ClientError::Value(format!("invalid interval: {interval}")));
                }
                let mut n = 0u64;
                loop {
                    let mut readings = power.read().await?;
                    while let Some(r) = readings.next().await {
                        println!("{}", format_reading(&r?));
                    }
                    n += 1;
                    if count != 0 && n >= count {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs_f64(interval)).await;
                }
                Ok(())
            }
            _ => Err(ClientError::Value("missing power command".into())),
        }
    })
}
