//! The client half: [`ChamberClient`], and the `j` commands of the chamber ([`cli`]).

use clap::{Arg, ArgMatches, Command, value_parser};
use futures::{StreamExt, stream::BoxStream};
use jumpstarter_core::{ClientError, client::DriverClient};
use jumpstarter_drivers::{CliFuture, DriverCommand};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::driver::{ChamberInfo, MAX_LINE, Reading};

/// Typed client of drivers reporting [`crate::CHAMBER_CLIENT`].
#[derive(Clone)]
pub struct ChamberClient(pub DriverClient);

impl ChamberClient {
    /// Sets the target temperature (°C); returns the previous one.
    pub async fn set_target(&self, celsius: f64) -> Result<f64, ClientError> {
        self.0.call("set_target", (celsius,)).await
    }

    /// The target temperature, °C.
    pub async fn target(&self) -> Result<f64, ClientError> {
        self.0.call("target", ()).await
    }

    /// The chamber's label, sensors and allowed range.
    pub async fn info(&self) -> Result<ChamberInfo, ClientError> {
        self.0.call("info", ()).await
    }

    /// `count` rounds of readings, one per sensor each.
    pub async fn read(
        &self,
        count: u32,
    ) -> Result<BoxStream<'static, Result<Reading, ClientError>>, ClientError> {
        self.0.streaming_call("read", (count,)).await
    }

    /// Sends one line to the console and returns its answer (without the newline).
    pub async fn ask(&self, line: &str) -> Result<String, ClientError> {
        if line.contains('\n') {
            return Err(ClientError::Value(
                "a console line cannot contain a newline".into(),
            ));
        }
        let mut console = self.0.open_stream("console").await?;
        let io = |e: std::io::Error| ClientError::Value(format!("console: {e}"));
        console
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(io)?;
        let mut answer = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            if console.read(&mut byte).await.map_err(io)? == 0 {
                return Err(ClientError::Value(
                    "console: closed before answering".into(),
                ));
            }
            if byte[0] == b'\n' {
                break;
            }
            // The chamber answers in short lines; a longer one is not the chamber.
            if answer.len() > MAX_LINE {
                return Err(ClientError::Value(format!(
                    "console: answer longer than {MAX_LINE} bytes"
                )));
            }
            answer.push(byte[0]);
        }
        let _ = console.shutdown().await;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }
}

/// The chamber's `j` commands: `target [CELSIUS]`, `info`, `read [-n COUNT]`, `ask LINE`.
pub fn cli() -> DriverCommand {
    DriverCommand {
        about: "Climate chamber",
        build,
        run,
    }
}

fn build(cmd: Command) -> Command {
    cmd.subcommand_required(true)
        .subcommand(
            Command::new("target")
                .about("Print the target temperature, or set it")
                .arg(
                    Arg::new("celsius")
                        .value_parser(value_parser!(f64))
                        .allow_negative_numbers(true)
                        .help("The new target, °C"),
                ),
        )
        .subcommand(Command::new("info").about("Print label, sensors and range as JSON"))
        .subcommand(
            Command::new("read").about("Print sensor readings").arg(
                Arg::new("count")
                    .short('n')
                    .long("count")
                    .value_parser(value_parser!(u32))
                    .default_value("1")
                    .help("Rounds of readings (one per sensor each)"),
            ),
        )
        .subcommand(
            Command::new("ask")
                .about("Send one line to the chamber's console and print its answer")
                .arg(Arg::new("line").required(true)),
        )
}

fn run(client: DriverClient, matches: ArgMatches) -> CliFuture {
    Box::pin(async move {
        let chamber = ChamberClient(client);
        match matches.subcommand() {
            Some(("target", m)) => match m.get_one::<f64>("celsius") {
                Some(&celsius) => {
                    let previous = chamber.set_target(celsius).await?;
                    eprintln!("Target {previous} -> {celsius} °C");
                    Ok(())
                }
                None => {
                    println!("{:?}", chamber.target().await?);
                    Ok(())
                }
            },
            Some(("info", _)) => {
                let info = chamber.info().await?;
                let json = serde_json::to_string(&info)
                    .map_err(|e| ClientError::Value(format!("info: {e}")))?;
                println!("{json}");
                Ok(())
            }
            Some(("read", m)) => {
                let count = m.get_one::<u32>("count").copied().unwrap_or(1);
                let mut readings = chamber.read(count).await?;
                while let Some(r) = readings.next().await {
                    let r = r?;
                    println!("sensor={} celsius={:?}", r.sensor, r.celsius);
                }
                Ok(())
            }
            Some(("ask", m)) => {
                let line = m.get_one::<String>("line").map_or("", String::as_str);
                println!("{}", chamber.ask(line).await?);
                Ok(())
            }
            _ => Err(ClientError::Value("missing command".into())),
        }
    })
}
