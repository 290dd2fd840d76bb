//! What a driver client class brings to `j`: its [`DriverCommand`], and the [`CommandTable`]
//! of them by client class (see [`crate::cli`], which builds the `j` command from the driver
//! tree).

use std::{collections::BTreeMap, future::Future, pin::Pin};

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

/// The `j` commands `j` knows, by driver client class (the `jumpstarter.dev/client` label a
/// driver reports). A driver whose class is not in the table gets the generic `call` and
/// `stream-call` commands. `crate::stock_commands` is the table of the stock drivers; a
/// lab's own `j` adds its classes to it.
#[derive(Clone, Default)]
pub struct CommandTable {
    by_class: BTreeMap<String, DriverCommand>,
}

impl CommandTable {
    /// An empty table (every driver gets the generic commands).
    pub fn new() -> Self {
        Self::default()
    }

    /// Gives drivers reporting `client_class` the commands of `command`, replacing what the
    /// table had for that class.
    pub fn insert(&mut self, client_class: impl Into<String>, command: DriverCommand) -> &mut Self {
        self.by_class.insert(client_class.into(), command);
        self
    }

    /// The commands of `client_class`, if the table has them.
    pub fn get(&self, client_class: &str) -> Option<DriverCommand> {
        self.by_class.get(client_class).copied()
    }

    /// The client classes in the table.
    pub fn classes(&self) -> impl Iterator<Item = &str> {
        self.by_class.keys().map(String::as_str)
    }
}
