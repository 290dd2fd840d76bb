//! What a `jmp` and a `j` serve and offer: the driver registry (config `type:` → driver)
//! and the `j` command table (client class → commands). The stock binaries use
//! [`Toolkit::stock`]; a lab's own binaries add their drivers to it and call
//! [`crate::jmp_main_with`] / [`crate::j_main_with`] (see `docs/writing-a-driver.md`).

use std::sync::{Arc, OnceLock};

use jumpstarter_core::driver::{Constructor, DriverRegistry};
use jumpstarter_drivers::{CommandTable, DriverCommand};

/// The drivers a `jmp` builds from exporter configs and the commands a `j` offers for them:
/// the stock set, plus a lab's own.
///
/// ```no_run
/// use jumpstarter_cli::Toolkit;
/// use jumpstarter_drivers::{MockPower, POWER_CLIENT, stock_commands};
///
/// fn main() -> std::process::ExitCode {
///     // Stand-ins for a lab's driver constructor and its `j` commands.
///     let commands = stock_commands().get(POWER_CLIENT).expect("stock power commands");
///     let toolkit = Toolkit::stock()
///         .with_driver("my_lab.driver.Switch", MockPower::from_args)
///         .with_commands("my_lab.client.SwitchClient", commands)
///         .with_j_program("my-j");
///     jumpstarter_cli::jmp_main_with(toolkit)
/// }
/// ```
#[derive(Clone)]
pub struct Toolkit {
    registry: Arc<DriverRegistry>,
    commands: Arc<CommandTable>,
    j_program: String,
}

impl Toolkit {
    /// The stock drivers and their commands (what `jmp` and `j` use); `jmp mcp` runs `j`.
    pub fn stock() -> Self {
        Self {
            registry: Arc::new(jumpstarter_drivers::stock_registry()),
            commands: Arc::new(jumpstarter_drivers::stock_commands()),
            j_program: "j".into(),
        }
    }

    /// Builds exporter-config entries of `type: TYPE_NAME` with `ctor` (replacing a stock
    /// driver of that name, if any).
    pub fn with_driver(mut self, type_name: impl Into<String>, ctor: Constructor) -> Self {
        Arc::make_mut(&mut self.registry).register(type_name, ctor);
        self
    }

    /// Gives drivers reporting the client class `client_class` the `j` subcommands of
    /// `command` (replacing the stock ones of that class, if any).
    pub fn with_commands(
        mut self,
        client_class: impl Into<String>,
        command: DriverCommand,
    ) -> Self {
        Arc::make_mut(&mut self.commands).insert(client_class, command);
        self
    }

    /// Replaces the registry as a whole.
    pub fn with_registry(mut self, registry: DriverRegistry) -> Self {
        self.registry = Arc::new(registry);
        self
    }

    /// Replaces the command table as a whole.
    pub fn with_command_table(mut self, commands: CommandTable) -> Self {
        self.commands = Arc::new(commands);
        self
    }

    /// The `j` program `jmp mcp` runs for its `j` tool: a file name, looked up next to the
    /// running `jmp` first, then on `PATH` (default `j`). A lab's `jmp` names its own `j`.
    pub fn with_j_program(mut self, name: impl Into<String>) -> Self {
        self.j_program = name.into();
        self
    }

    /// The driver registry.
    pub fn registry(&self) -> &DriverRegistry {
        &self.registry
    }

    /// The `j` command table.
    pub fn commands(&self) -> &Arc<CommandTable> {
        &self.commands
    }

    /// The `j` program `jmp mcp` runs.
    pub fn j_program(&self) -> &str {
        &self.j_program
    }
}

/// The toolkit of this process, set once by the entry point.
static CURRENT: OnceLock<Toolkit> = OnceLock::new();

/// Makes `toolkit` the one [`current`] returns. The first call wins: an entry point runs
/// once per process, and a second one (a test calling `main` twice) keeps the first.
pub(crate) fn install(toolkit: Toolkit) {
    if CURRENT.set(toolkit).is_err() {
        tracing::debug!("a toolkit was already installed; keeping it");
    }
}

/// The toolkit of this process: what the entry point installed, else the stock one.
pub(crate) fn current() -> &'static Toolkit {
    CURRENT.get_or_init(Toolkit::stock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lab_adds_to_the_stock_set_without_losing_it() {
        let power = jumpstarter_drivers::stock_commands()
            .get(jumpstarter_drivers::POWER_CLIENT)
            .map(|c| c.about);
        let Some(cmd) =
            jumpstarter_drivers::stock_commands().get(jumpstarter_drivers::POWER_CLIENT)
        else {
            panic!("no stock power commands");
        };
        let t = Toolkit::stock()
            .with_driver(
                "lab.driver.Thing",
                jumpstarter_drivers::MockPower::from_args,
            )
            .with_commands("lab.client.ThingClient", cmd)
            .with_j_program("lab-j");
        let types: Vec<&str> = t.registry().types().collect();
        assert!(types.contains(&"lab.driver.Thing"), "{types:?}");
        assert!(
            types.contains(&"jumpstarter_driver_power.driver.MockPower"),
            "{types:?}"
        );
        assert_eq!(
            t.commands().get("lab.client.ThingClient").map(|c| c.about),
            power
        );
        assert!(
            t.commands()
                .get(jumpstarter_drivers::POWER_CLIENT)
                .is_some()
        );
        assert_eq!(t.j_program(), "lab-j");
        // The stock toolkit is untouched by a lab's additions (copy on write).
        let stock = Toolkit::stock();
        assert!(!stock.registry().types().any(|t| t == "lab.driver.Thing"));
        assert!(stock.commands().get("lab.client.ThingClient").is_none());
        assert_eq!(stock.j_program(), "j");
    }
}
