//! The client half of the HTTP boot server (`jumpstarter_driver_http.client.HttpServerClient`)
//! and its `j NAME start|stop|get-url|get-host|get-port` commands (upstream's client is a
//! composite: `j NAME storage ...` reaches its `storage` child, here as there).

use std::path::Path;

use clap::{Arg, ArgMatches, Command, value_parser};
use jumpstarter_core::{ClientError, client::DriverClient};

use crate::{
    command::{CliFuture, DriverCommand},
    storage::{OpendalClient, TransferOptions},
};

/// Typed client for drivers reporting `jumpstarter_driver_http.client.HttpServerClient`.
#[derive(Clone)]
pub struct HttpServerClient(pub DriverClient);

impl HttpServerClient {
    /// Starts the server.
    pub async fn start(&self) -> Result<(), ClientError> {
        self.0.call("start", ()).await
    }

    /// Stops the server.
    pub async fn stop(&self) -> Result<(), ClientError> {
        self.0.call("stop", ()).await
    }

    /// The base URL (`http://HOST:PORT`).
    pub async fn get_url(&self) -> Result<String, ClientError> {
        self.0.call("get_url", ()).await
    }

    /// The address the server listens on.
    pub async fn get_host(&self) -> Result<String, ClientError> {
        self.0.call("get_host", ()).await
    }

    /// The bound port (`0` when stopped).
    pub async fn get_port(&self) -> Result<u16, ClientError> {
        self.0.call("get_port", ()).await
    }

    /// The `storage` child (an Opendal client on the served directory).
    pub fn storage(&self) -> Result<OpendalClient, ClientError> {
        self.0
            .child("storage")
            .map(OpendalClient)
            .ok_or_else(|| ClientError::Value("the HTTP server has no storage child".into()))
    }

    /// Uploads `src` (a local file, or an `http(s)://` URL the exporter fetches) as `dst`
    /// through the storage child; returns the URL the board downloads it from (as
    /// upstream's `put_file`).
    pub async fn put_file(
        &self,
        dst: &str,
        src: &Path,
        opts: &TransferOptions,
    ) -> Result<String, ClientError> {
        self.storage()?.write_from_path(dst, src, opts).await?;
        let base = self.get_url().await?;
        Ok(format!(
            "{}/{}",
            base.trim_end_matches('/'),
            dst.trim_start_matches('/')
        ))
    }
}

/// The `j` commands of HTTP boot servers.
pub fn cli() -> DriverCommand {
    DriverCommand {
        about: "HTTP server for boot files",
        build,
        run,
    }
}

fn build(cmd: Command) -> Command {
    cmd.subcommand_required(true)
        .subcommand(Command::new("start").about("Start the HTTP server"))
        .subcommand(Command::new("stop").about("Stop the HTTP server"))
        .subcommand(Command::new("get-url").about("Print the server's base URL"))
        .subcommand(Command::new("get-host").about("Print the address the server listens on"))
        .subcommand(Command::new("get-port").about("Print the bound port (0 when stopped)"))
        .subcommand(
            Command::new("put-file")
                .about("Upload a local file (or an http(s) URL) and print its URL on the server")
                .arg(Arg::new("dst").required(true).help("Name on the server"))
                .arg(
                    Arg::new("src")
                        .required(true)
                        .value_parser(value_parser!(std::path::PathBuf))
                        .help("Local file or http(s) URL"),
                ),
        )
}

fn run(client: DriverClient, matches: ArgMatches) -> CliFuture {
    Box::pin(async move {
        let c = HttpServerClient(client);
        match matches.subcommand() {
            Some(("start", _)) => c.start().await,
            Some(("stop", _)) => c.stop().await,
            Some(("get-url", _)) => {
                println!("{}", c.get_url().await?);
                Ok(())
            }
            Some(("get-host", _)) => {
                println!("{}", c.get_host().await?);
                Ok(())
            }
            Some(("get-port", _)) => {
                println!("{}", c.get_port().await?);
                Ok(())
            }
            Some(("put-file", m)) => {
                let dst = m.get_one::<String>("dst").cloned().unwrap_or_default();
                let src = m
                    .get_one::<std::path::PathBuf>("src")
                    .cloned()
                    .unwrap_or_default();
                let url = c.put_file(&dst, &src, &TransferOptions::default()).await?;
                println!("{url}");
                Ok(())
            }
            _ => Err(ClientError::Value("missing HTTP server command".into())),
        }
    })
}
