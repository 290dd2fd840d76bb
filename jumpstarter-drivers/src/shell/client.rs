//! The client half of the shell driver and its `j NAME METHOD [ARGS]` commands.

use std::{collections::BTreeMap, io::Write};

use clap::{Arg, ArgAction, ArgMatches, Command};
use futures::{StreamExt, stream::BoxStream};
use jumpstarter_core::{
    ClientError,
    client::{ClientNode, DriverClient},
    value,
};
use serde::Deserialize;

use crate::command::{CliFuture, DriverCommand};

/// One item of `call_method`: output that came, and the exit code in the last item.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "(String, String, Option<i64>)")]
pub struct ShellOutput {
    /// Standard output text.
    pub stdout: String,
    /// Standard error text.
    pub stderr: String,
    /// The exit code (only in the last item; negative: killed by that signal).
    pub returncode: Option<i64>,
}

impl From<(String, String, Option<i64>)> for ShellOutput {
    fn from((stdout, stderr, returncode): (String, String, Option<i64>)) -> Self {
        Self {
            stdout,
            stderr,
            returncode,
        }
    }
}

/// Typed client for drivers reporting `jumpstarter_driver_shell.client.ShellClient`.
#[derive(Clone)]
pub struct ShellClient(pub DriverClient);

impl ShellClient {
    /// The configured method names.
    pub async fn get_methods(&self) -> Result<Vec<String>, ClientError> {
        self.0.call("get_methods", ()).await
    }

    /// Runs `method` with extra environment variables and arguments (`$1`, `$2`, ...),
    /// streaming its output.
    pub async fn call_method(
        &self,
        method: &str,
        env: &BTreeMap<String, String>,
        args: &[String],
    ) -> Result<BoxStream<'static, Result<ShellOutput, ClientError>>, ClientError> {
        let mut call = vec![
            value::to_value(&method).map_err(ClientError::encoding)?,
            value::to_value(env).map_err(ClientError::encoding)?,
        ];
        for a in args {
            call.push(value::to_value(a).map_err(ClientError::encoding)?);
        }
        self.0.streaming_call("call_method", call).await
    }

    /// Runs `method`, copying its output to this process's stdout and stderr as it comes,
    /// and returns its exit code (as upstream's `client.METHOD(*args, **env)`).
    pub async fn run(
        &self,
        method: &str,
        env: &BTreeMap<String, String>,
        args: &[String],
    ) -> Result<i64, ClientError> {
        let mut items = self.call_method(method, env, args).await?;
        let mut code = 0;
        while let Some(item) = items.next().await {
            let item = item?;
            if !item.stdout.is_empty() {
                let mut out = std::io::stdout().lock();
                out.write_all(item.stdout.as_bytes())?;
                out.flush()?;
            }
            if !item.stderr.is_empty() {
                let mut err = std::io::stderr().lock();
                err.write_all(item.stderr.as_bytes())?;
                err.flush()?;
            }
            if let Some(c) = item.returncode {
                code = c;
            }
        }
        Ok(code)
    }
}

/// The `j NAME METHOD` commands of a shell driver (without its methods: see
/// [`method_command`]; `crate::cli` adds one per method the report describes).
pub fn cli() -> DriverCommand {
    DriverCommand {
        about: "Shell command executor",
        build,
        run,
    }
}

fn build(cmd: Command) -> Command {
    // Methods the report does not list (an upstream exporter describes only some) still
    // run: the exporter checks the name.
    cmd.subcommand_required(true)
        .allow_external_subcommands(true)
        .external_subcommand_value_parser(clap::value_parser!(String))
}

/// The `j NAME METHOD [--env K=V]... [ARGS]...` command of one method.
pub fn method_command(name: &str, help: &str) -> Command {
    with_method_args(Command::new(name.to_string()).about(help.to_string()))
}

fn with_method_args(cmd: Command) -> Command {
    cmd.arg(
        Arg::new("env")
            .short('e')
            .long("env")
            .action(ArgAction::Append)
            .value_name("KEY=VALUE")
            .help("Environment variables in KEY=VALUE format")
            .long_help(
                "Environment variables in KEY=VALUE format. KEY is letters, digits and '_'; \
                 the exporter refuses names that change how its shell, dynamic loader or \
                 interpreters behave (PATH, HOME, SHELLOPTS, PS4, IFS, ENV, BASH_*, LD_*, \
                 PYTHON*, GIT_*, ...)",
            ),
    )
    .arg(
        Arg::new("args")
            .num_args(0..)
            .trailing_var_arg(true)
            .allow_hyphen_values(true)
            .help("Arguments of the method ($1, $2, ... in its script)"),
    )
}

/// The method commands for a node: every method in `listed` (what its `get_methods`
/// answered), or, without that, every method its report describes. A method the report does
/// not describe gets upstream's generic help text.
pub(crate) fn add_methods(cmd: Command, node: &ClientNode, listed: Option<&[String]>) -> Command {
    let names: Vec<&String> = match listed {
        Some(listed) => listed.iter().collect(),
        None => node.methods_description.keys().collect(),
    };
    names.into_iter().fold(cmd, |cmd, name| {
        let help = node
            .methods_description
            .get(name)
            .cloned()
            .unwrap_or_else(|| format!("Execute the {name} shell method"));
        cmd.subcommand(method_command(name, &help))
    })
}

/// Parses `--env` values.
fn parse_env(m: &ArgMatches) -> Result<BTreeMap<String, String>, ClientError> {
    m.get_many::<String>("env")
        .into_iter()
        .flatten()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => Ok((k.to_string(), v.to_string())),
            None => Err(ClientError::Value(format!(
                "Invalid --env value '{kv}'. Use KEY=VALUE."
            ))),
        })
        .collect()
}

/// The exit status `j` ends with for a method's exit code: the code itself, `128 + N` when
/// signal N killed it.
pub fn exit_status(code: i64) -> i32 {
    let code = if code < 0 { 128 - code } else { code };
    // As a shell does, keep the low byte.
    i32::try_from(code & 0xff).unwrap_or(1)
}

fn run(client: DriverClient, matches: ArgMatches) -> CliFuture {
    Box::pin(async move {
        let (method, env, args) = match matches.subcommand() {
            Some((name, m)) if m.try_contains_id("env").is_ok() => {
                let args: Vec<String> = m
                    .get_many::<String>("args")
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect();
                (name.to_string(), parse_env(m)?, args)
            }
            Some((name, m)) => {
                // A method the report did not list: parse its arguments the same way.
                let raw: Vec<String> = m
                    .get_many::<String>("")
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect();
                let parsed = with_method_args(Command::new(name.to_string()))
                    .no_binary_name(true)
                    .try_get_matches_from(raw)
                    .map_err(ClientError::encoding)?;
                let args = parsed
                    .get_many::<String>("args")
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect();
                (name.to_string(), parse_env(&parsed)?, args)
            }
            None => return Err(ClientError::Value("missing shell method".into())),
        };
        let code = ShellClient(client).run(&method, &env, &args).await?;
        if code != 0 {
            // Upstream exits with the method's code; so does `j`.
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
            std::process::exit(exit_status(code));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_as_a_shell_reports_them() {
        assert_eq!(exit_status(3), 3);
        assert_eq!(exit_status(199), 199);
        assert_eq!(exit_status(-9), 137);
        assert_eq!(exit_status(256), 0);
    }

    #[test]
    fn method_arguments_stay_verbatim() {
        let m = method_command("run", "help")
            .try_get_matches_from(["run", "-e", "A=1", "--", "x; rm -rf /", "-n", "$HOME"])
            .unwrap();
        let args: Vec<&String> = m.get_many::<String>("args").unwrap().collect();
        assert_eq!(args, ["x; rm -rf /", "-n", "$HOME"]);
        assert_eq!(parse_env(&m).unwrap()["A"], "1");
        // Options after the first argument belong to the method, as upstream's
        // allow_interspersed_args=False.
        let m = method_command("run", "help")
            .try_get_matches_from(["run", "a", "-e", "B=2"])
            .unwrap();
        let args: Vec<&String> = m.get_many::<String>("args").unwrap().collect();
        assert_eq!(args, ["a", "-e", "B=2"]);
        assert!(parse_env(&m).unwrap().is_empty());
        let bad = method_command("run", "help")
            .try_get_matches_from(["run", "-e", "NOEQUALS"])
            .unwrap();
        assert!(parse_env(&bad).is_err());
    }
}
