//! What a `jmp` and a `j` serve and offer: the driver registry (config `type:` → driver)
//! and the `j` command table (client class → commands). The stock binaries use
//! [`Toolkit::stock`]; a lab's own binaries add their drivers to it and call
//! [`crate::jmp_main_with`] / [`crate::j_main_with`] (see `docs/writing-a-driver.md`).

use std::{path::Path, sync::Arc};

use jumpstarter_core::{
    config::ExporterConfig,
    driver::{Constructor, DriverRegistry},
};
use jumpstarter_drivers::{CommandTable, DriverCommand};
use jumpstarter_exporter::Exporter;

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

    /// The exporter of `cfg` with this toolkit's drivers; its hooks find the `j` built
    /// beside this `jmp` ([`path_with_own_j`]).
    pub(crate) fn exporter(&self, cfg: &ExporterConfig) -> Exporter {
        let exporter = Exporter::from_config(cfg.clone(), Arc::clone(&self.registry));
        match path_with_own_j(&self.j_program) {
            Some(path) => exporter.with_hook_path(path),
            None => exporter,
        }
    }

    /// The `j` program `jmp mcp` runs.
    pub fn j_program(&self) -> &str {
        &self.j_program
    }
}

/// `PATH` for a child that runs `j`: `path` (the caller's `PATH`) with `dir` added last when
/// `dir` holds the `j` program and `path` does not name `dir` already; `None` when nothing
/// changes. Added last, a `j` the user put on `PATH` still wins.
fn path_with_j_dir(
    path: Option<&std::ffi::OsStr>,
    dir: &Path,
    j_program: &str,
) -> Option<std::ffi::OsString> {
    if !dir.join(j_program).is_file() {
        return None;
    }
    let mut parts: Vec<std::path::PathBuf> = path
        .map(std::env::split_paths)
        .into_iter()
        .flatten()
        .collect();
    if parts.iter().any(|p| p == dir) {
        return None;
    }
    parts.push(dir.to_path_buf());
    std::env::join_paths(parts).ok()
}

/// `PATH` for a child of `jmp shell` or a hook of `jmp run`, which may run `j` (named
/// `j_program`): this process's `PATH` with the directory of this `jmp` added last when the
/// `j` built beside it
/// is there, so that `target/debug/jmp shell ... -- j power on` finds `target/debug/j`
/// without either being installed (`None`: `PATH` stays as it is).
pub(crate) fn path_with_own_j(j_program: &str) -> Option<std::ffi::OsString> {
    let exe = std::env::current_exe().ok()?;
    path_with_j_dir(
        std::env::var_os("PATH").as_deref(),
        exe.parent()?,
        j_program,
    )
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

    #[test]
    fn the_directory_of_j_is_added_last_once_and_only_when_j_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = std::ffi::OsString::from("/usr/bin:/bin");
        assert_eq!(
            path_with_j_dir(Some(&path), dir.path(), "j"),
            None,
            "no j there"
        );
        std::fs::write(dir.path().join("j"), "").unwrap();
        let with = path_with_j_dir(Some(&path), dir.path(), "j").unwrap();
        assert_eq!(
            with,
            std::ffi::OsString::from(format!("/usr/bin:/bin:{}", dir.path().display()))
        );
        assert_eq!(
            path_with_j_dir(Some(&with), dir.path(), "j"),
            None,
            "already there"
        );
        assert_eq!(
            path_with_j_dir(None, dir.path(), "j").unwrap(),
            dir.path().as_os_str()
        );
        assert_eq!(path_with_j_dir(Some(&path), dir.path(), "other-j"), None);
    }
}
