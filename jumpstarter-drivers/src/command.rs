//! What a driver client class brings to `j`: its [`DriverCommand`] (see [`crate::cli`], which
//! builds the `j` command from the driver tree).

use std::{future::Future, pin::Pin};

use clap::{ArgMatches, Command};
use jumpstarter_core::{ClientError, client::DriverClient};

/// What a `j` command returns.
pub type CliFuture = Pin<Box<dyn Future<Output = Result<(), ClientError>> + Send>>;

/// The `j` subcommands of one driver client class.
#[derive(Clone, Copy)]
pub struct DriverCommand {
    /// Default help text of the group (a config `description` overrides it).
    pub about: &'static str,
    /// Adds the driver's subcommands to its group.
    pub build: fn(Command) -> Command,
    /// Runs the chosen subcommand (`matches` are the group's).
    pub run: fn(DriverClient, ArgMatches) -> CliFuture,
}
