//! The client half of the TFTP boot server (`jumpstarter_driver_tftp.client.TftpServerClient`)
//! and its `j NAME start|stop|get-host|get-port` commands (upstream's client is a composite:
//! `j NAME storage ...` reaches its `storage` child, here as there).

use clap::{ArgMatches, Command};
use jumpstarter_core::{ClientError, client::DriverClient};

use crate::{
    command::{CliFuture, DriverCommand},
    storage::OpendalClient,
};

/// Typed client for drivers reporting `jumpstarter_driver_tftp.client.TftpServerClient`.
#[derive(Clone)]
pub struct TftpServerClient(pub DriverClient);

impl TftpServerClient {
    /// Starts the server.
    pub async fn start(&self) -> Result<(), ClientError> {
        self.0.call("start", ()).await
    }

    /// Stops the server.
    pub async fn stop(&self) -> Result<(), ClientError> {
        self.0.call("stop", ()).await
    }

    /// The address the server listens on.
    pub async fn get_host(&self) -> Result<String, ClientError> {
        self.0.call("get_host", ()).await
    }

    /// The port.
    pub async fn get_port(&self) -> Result<u16, ClientError> {
        self.0.call("get_port", ()).await
    }

    /// The `storage` child (an Opendal client on the served directory).
    pub fn storage(&self) -> Result<OpendalClient, ClientError> {
        self.0
            .child("storage")
            .map(OpendalClient)
            .ok_or_else(|| ClientError::Value("the TFTP server has no storage child".into()))
    }
}

/// The `j` commands of TFTP boot servers.
pub fn cli() -> DriverCommand {
    DriverCommand {
        about: "TFTP server for boot files",
        build,
        run,
    }
}

fn build(cmd: Command) -> Command {
    cmd.subcommand_required(true)
        .subcommand(Command::new("start").about("Start the TFTP server"))
        .subcommand(Command::new("stop").about("Stop the TFTP server"))
        .subcommand(Command::new("get-host").about("Print the address the server listens on"))
        .subcommand(Command::new("get-port").about("Print the server's port"))
}

fn run(client: DriverClient, matches: ArgMatches) -> CliFuture {
    Box::pin(async move {
        let c = TftpServerClient(client);
        match matches.subcommand() {
            Some(("start", _)) => c.start().await,
            Some(("stop", _)) => c.stop().await,
            Some(("get-host", _)) => {
                println!("{}", c.get_host().await?);
                Ok(())
            }
            Some(("get-port", _)) => {
                println!("{}", c.get_port().await?);
                Ok(())
            }
            _ => Err(ClientError::Value("missing TFTP server command".into())),
        }
    })
}
