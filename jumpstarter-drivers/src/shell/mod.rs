//! Shell: run the commands an exporter's config names, on the exporter host.
//!
//! Config (as upstream `jumpstarter_driver_shell.driver.Shell`): `methods` (each a command
//! string, or a mapping with `command`, `description` and `timeout`), `shell` (the
//! interpreter and its flags, default `["bash", "-c"]`), `timeout` (seconds, default 300)
//! and `cwd`. A method runs as `SHELL... COMMAND METHOD ARGS...`: the script sees the method
//! name as `$0` and the caller's arguments as `$1`, `$2`, ... — they are passed as separate
//! program arguments, never pasted into the script, so the shell does not re-parse them.
//!
//! `call_method(method, env, *args)` streams `[stdout, stderr, returncode]` triples: output
//! as it comes (returncode `null`), then a last one carrying the exit code (negative: killed
//! by that signal; 199: the method's timeout expired, as upstream). `env` adds environment
//! variables to the exporter's own; names must be identifiers and those that could take over
//! the process (`PATH`, `HOME`, `LD_*`, ...) are refused, as upstream does.
//!
//! [`ShellClient`] is the client half and [`cli`] the `j NAME METHOD [ARGS]` commands.

mod client;
mod run;

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use jumpstarter_core::{
    CallContext, Driver, DriverError,
    driver::{BoxDuplex, BoxFuture, DriverArgs, ValueStream},
    value::{self, Value},
};
use serde_json::Value as Json;

pub(crate) use client::add_methods;
pub use client::{ShellClient, ShellOutput, cli};
pub use run::TIMEOUT_EXIT_CODE;

/// Upstream client class of the shell driver.
pub const SHELL_CLIENT: &str = "jumpstarter_driver_shell.client.ShellClient";

/// Environment variables a caller may not set (upstream's list).
const BLOCKED_ENV: &[&str] = &[
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "PATH",
    "PYTHONPATH",
    "BASH_ENV",
    "KUBECONFIG",
    "HOME",
];

/// Prefixes of environment variables a caller may not set (upstream's list).
const BLOCKED_ENV_PREFIXES: &[&str] = &["LD_", "BASH_FUNC_"];

/// Upstream's default timeout of a method, in seconds.
const DEFAULT_TIMEOUT: u64 = 300;

/// One configured method.
#[derive(Debug, Clone, PartialEq)]
struct Method {
    command: String,
    description: Option<String>,
    timeout: Duration,
}

/// Runs configured shell commands (upstream `jumpstarter_driver_shell.driver.Shell`).
#[derive(Debug)]
pub struct Shell {
    methods: BTreeMap<String, Method>,
    shell: Vec<String>,
    cwd: Option<PathBuf>,
}

fn invalid(field: &str, message: impl std::fmt::Display) -> DriverError {
    DriverError::InvalidArgument(format!("{field}: {message}"))
}

/// A timeout in whole or fractional seconds, positive and finite.
fn parse_timeout(field: &str, v: &Json) -> Result<Duration, DriverError> {
    let secs = v
        .as_f64()
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= 365.0 * 86400.0)
        .ok_or_else(|| {
            invalid(
                field,
                format!("expected a positive number of seconds, got {v}"),
            )
        })?;
    Ok(Duration::from_secs_f64(secs))
}

impl Shell {
    /// Constructor for the registry: reads and checks the config.
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        Ok(Arc::new(Self::from_config(&args.config)?))
    }

    fn from_config(config: &Json) -> Result<Self, DriverError> {
        let empty = serde_json::Map::new();
        let cfg = match config {
            Json::Object(m) => m,
            Json::Null => &empty,
            other => {
                return Err(invalid(
                    "config",
                    format!("expected a mapping, got {other}"),
                ));
            }
        };
        if let Some(k) = cfg
            .keys()
            .find(|k| !["methods", "shell", "timeout", "cwd"].contains(&k.as_str()))
        {
            return Err(invalid(
                k,
                "unknown field (known: methods, shell, timeout, cwd)",
            ));
        }
        let timeout = match cfg.get("timeout") {
            None => Duration::from_secs(DEFAULT_TIMEOUT),
            Some(v) => parse_timeout("timeout", v)?,
        };
        let shell = match cfg.get("shell") {
            None => vec!["bash".to_string(), "-c".to_string()],
            Some(Json::Array(items)) => items
                .iter()
                .map(|i| {
                    i.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| invalid("shell", format!("expected strings, got {i}")))
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(invalid(
                    "shell",
                    format!("expected a list such as [bash, -c], got {other}"),
                ));
            }
        };
        if shell.first().is_none_or(|p| p.is_empty()) {
            return Err(invalid("shell", "names no program"));
        }
        let cwd = match cfg.get("cwd") {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) if !s.is_empty() => Some(PathBuf::from(s)),
            Some(other) => {
                return Err(invalid("cwd", format!("expected a directory, got {other}")));
            }
        };
        let Some(Json::Object(ms)) = cfg.get("methods") else {
            return Err(invalid(
                "methods",
                "required: a mapping of method names to commands",
            ));
        };
        let mut methods = BTreeMap::new();
        for (name, spec) in ms {
            let field = format!("methods.{name}");
            check_method_name(&field, name)?;
            methods.insert(name.clone(), parse_method(&field, spec, timeout)?);
        }
        Ok(Self {
            methods,
            shell,
            cwd,
        })
    }

    /// The configured method names (`get_methods`).
    pub fn method_names(&self) -> Vec<String> {
        self.methods.keys().cloned().collect()
    }

    /// Checks a call's arguments and starts the method; see [`run::Running`].
    fn start(
        &self,
        ctx: &CallContext,
        method: &str,
        env: &BTreeMap<String, String>,
        args: &[String],
    ) -> Result<ValueStream, DriverError> {
        let m = self.methods.get(method).ok_or_else(|| {
            DriverError::InvalidArgument(format!(
                "Method '{method}' not found in available methods: {:?}",
                self.method_names()
            ))
        })?;
        check_env(env)?;
        if let Some(dir) = &self.cwd
            && !dir.is_dir()
        {
            return Err(DriverError::InvalidArgument(format!(
                "Working directory does not exist: {}",
                dir.display()
            )));
        }
        ctx.log_info(format!(
            "calling {method} with args: {args:?} and env: {env:?}"
        ));
        let mut argv = self.shell.clone();
        argv.push(m.command.clone());
        argv.push(method.to_string());
        argv.extend(args.iter().cloned());
        run::start(
            method,
            &argv,
            env,
            self.cwd.as_deref(),
            m.timeout,
            ctx.clone(),
        )
    }
}

/// Method names become `j` commands and Python attribute names: identifiers (ASCII letters,
/// digits, `_` and `-`), not starting with `-`.
fn check_method_name(field: &str, name: &str) -> Result<(), DriverError> {
    let ok = !name.is_empty()
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            "a method name must be letters, digits, '_' or '-' (it becomes a j command)",
        ))
    }
}

fn parse_method(
    field: &str,
    spec: &Json,
    default_timeout: Duration,
) -> Result<Method, DriverError> {
    let method = match spec {
        Json::String(command) => Method {
            command: command.clone(),
            description: None,
            timeout: default_timeout,
        },
        Json::Object(m) => {
            if let Some(k) = m
                .keys()
                .find(|k| !["command", "description", "timeout"].contains(&k.as_str()))
            {
                return Err(invalid(
                    &format!("{field}.{k}"),
                    "unknown field (known: command, description, timeout)",
                ));
            }
            let text = |key: &str| -> Result<Option<String>, DriverError> {
                match m.get(key) {
                    None | Some(Json::Null) => Ok(None),
                    Some(Json::String(s)) => Ok(Some(s.clone())),
                    Some(other) => Err(invalid(
                        &format!("{field}.{key}"),
                        format!("expected a string, got {other}"),
                    )),
                }
            };
            Method {
                // Upstream's default when a mapping names no command.
                command: text("command")?.unwrap_or_else(|| "echo Hello".into()),
                description: text("description")?,
                timeout: match m.get("timeout") {
                    None | Some(Json::Null) => default_timeout,
                    Some(v) => parse_timeout(&format!("{field}.timeout"), v)?,
                },
            }
        }
        other => {
            return Err(invalid(
                field,
                format!("expected a command string or a mapping with `command`, got {other}"),
            ));
        }
    };
    if method.command.trim().is_empty() {
        return Err(invalid(field, "the command is empty"));
    }
    Ok(method)
}

/// Upstream's rules for caller-supplied environment variables: identifier names, and none
/// that could take over the process.
fn check_env(env: &BTreeMap<String, String>) -> Result<(), DriverError> {
    for key in env.keys() {
        let mut chars = key.chars();
        let identifier = chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
            && chars.all(|c| c.is_alphanumeric() || c == '_');
        if !identifier {
            return Err(DriverError::InvalidArgument(format!(
                "Invalid environment variable name: {key}"
            )));
        }
        if BLOCKED_ENV.contains(&key.as_str())
            || BLOCKED_ENV_PREFIXES.iter().any(|p| key.starts_with(p))
        {
            return Err(DriverError::InvalidArgument(format!(
                "Environment variable '{key}' is blocked for security reasons"
            )));
        }
    }
    Ok(())
}

/// The arguments of one `call_method`: the method, extra environment, `$1`, `$2`, ...
type MethodCall = (String, BTreeMap<String, String>, Vec<String>);

/// Decodes `call_method(method, env, *args)`.
fn decode_call(args: Vec<Value>) -> Result<MethodCall, DriverError> {
    let mut it = args.into_iter().map(value::to_json);
    let method = match it.next() {
        Some(Json::String(m)) => m,
        Some(other) => {
            return Err(DriverError::InvalidArgument(format!(
                "the method name must be a string, got {other}"
            )));
        }
        None => {
            return Err(DriverError::InvalidArgument(
                "Shell.call_method() missing 2 required positional arguments: 'method' and 'env'"
                    .into(),
            ));
        }
    };
    let env = match it.next() {
        None | Some(Json::Null) => BTreeMap::new(),
        Some(Json::Object(m)) => m
            .into_iter()
            .map(|(k, v)| match v {
                Json::String(s) => Ok((k, s)),
                other => Err(DriverError::InvalidArgument(format!(
                    "environment variable {k}: expected a string value, got {other}"
                ))),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(DriverError::InvalidArgument(format!(
                "env must be a mapping of names to strings, got {other}"
            )));
        }
    };
    let rest = it
        .map(|a| match a {
            Json::String(s) => Ok(s),
            other => Err(DriverError::InvalidArgument(format!(
                "All arguments must be strings, got {other}"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((method, env, rest))
}

impl Driver for Shell {
    fn client_class(&self) -> String {
        SHELL_CLIENT.to_string()
    }

    fn type_name(&self) -> &'static str {
        "Shell"
    }

    fn exported_methods(&self) -> &'static [&'static str] {
        &["get_methods", "call_method"]
    }

    fn methods_description(&self) -> BTreeMap<String, String> {
        self.methods
            .iter()
            .filter_map(|(name, m)| Some((name.clone(), m.description.clone()?)))
            .collect()
    }

    fn default_methods_description(&self) -> BTreeMap<String, String> {
        // Upstream's help text of an undescribed method; reported so that a client can list
        // every method from the report alone.
        self.methods
            .keys()
            .map(|name| (name.clone(), format!("Execute the {name} shell method")))
            .collect()
    }

    fn call(
        self: Arc<Self>,
        _ctx: CallContext,
        method: String,
        args: Vec<Value>,
    ) -> BoxFuture<Result<Value, DriverError>> {
        Box::pin(async move {
            match method.as_str() {
                "get_methods" => {
                    value::ArgDecoder::new("Shell", "get_methods", args, 0)?;
                    value::to_value(&self.method_names()).map_err(DriverError::from)
                }
                "call_method" => Err(DriverError::MissingMarker {
                    method,
                    marker: "marker_drivercall",
                }),
                _ => Err(DriverError::MethodNotFound(method)),
            }
        })
    }

    fn streaming_call(
        self: Arc<Self>,
        ctx: CallContext,
        method: String,
        args: Vec<Value>,
    ) -> BoxFuture<Result<ValueStream, DriverError>> {
        Box::pin(async move {
            match method.as_str() {
                "call_method" => {
                    let (name, env, rest) = decode_call(args)?;
                    self.start(&ctx, &name, &env, &rest)
                }
                "get_methods" => Err(DriverError::MissingMarker {
                    method,
                    marker: "marker_streamingdrivercall",
                }),
                _ => Err(DriverError::MethodNotFound(method)),
            }
        })
    }

    fn open_stream(
        self: Arc<Self>,
        _ctx: CallContext,
        method: String,
    ) -> BoxFuture<Result<BoxDuplex, DriverError>> {
        Box::pin(async move { Err(DriverError::MethodNotFound(method)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(config: Json) -> String {
        match Shell::from_config(&config) {
            Ok(_) => panic!("accepted {config}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn config_forms_as_upstream() {
        let s = Shell::from_config(&json!({
            "methods": {
                "hello": "echo hi",
                "slow": {"command": "sleep 1", "timeout": 5, "description": "Sleeps"},
                "bare": {"description": "no command"},
            },
            "timeout": 10,
            "shell": ["sh", "-c"],
            "cwd": "/tmp",
        }))
        .unwrap();
        assert_eq!(s.method_names(), ["bare", "hello", "slow"]);
        assert_eq!(s.methods["hello"].timeout, Duration::from_secs(10));
        assert_eq!(s.methods["slow"].timeout, Duration::from_secs(5));
        assert_eq!(s.methods["bare"].command, "echo Hello");
        assert_eq!(s.shell, ["sh", "-c"]);
        let d = s.methods_description();
        assert_eq!(d.len(), 2);
        assert_eq!(d["bare"], "no command");
        assert_eq!(d["slow"], "Sleeps");
        assert_eq!(
            s.default_methods_description()["hello"],
            "Execute the hello shell method"
        );
    }

    #[test]
    fn bad_configs_name_the_field() {
        assert!(err(json!({})).starts_with("methods: required"));
        assert!(err(json!({"methods": {}, "shel": []})).starts_with("shel: unknown field"));
        assert!(err(json!({"methods": {"a": 3}})).starts_with("methods.a: expected"));
        assert!(err(json!({"methods": {"a": {"cmd": "x"}}})).starts_with("methods.a.cmd:"));
        assert!(err(json!({"methods": {"a": {"timeout": -1}}})).starts_with("methods.a.timeout:"));
        assert!(err(json!({"methods": {"a": " "}})).starts_with("methods.a: the command is empty"));
        assert!(err(json!({"methods": {"-x": "true"}})).starts_with("methods.-x:"));
        assert!(err(json!({"methods": {"a b": "true"}})).starts_with("methods.a b:"));
        assert!(err(json!({"methods": {}, "shell": []})).starts_with("shell: names no program"));
        assert!(err(json!({"methods": {}, "shell": "bash"})).starts_with("shell: expected a list"));
        assert!(err(json!({"methods": {}, "timeout": "x"})).starts_with("timeout: expected"));
        assert!(err(json!({"methods": {}, "timeout": 0})).starts_with("timeout: expected"));
        assert!(err(json!({"methods": {}, "cwd": 3})).starts_with("cwd: expected"));
    }

    #[test]
    fn env_rules_as_upstream() {
        let env = |k: &str| BTreeMap::from([(k.to_string(), "v".to_string())]);
        assert!(check_env(&env("FOO_1")).is_ok());
        assert!(check_env(&env("_x")).is_ok());
        for bad in ["1A", "A-B", "", "A B", "A=B"] {
            assert_eq!(
                check_env(&env(bad)).unwrap_err().to_string(),
                format!("Invalid environment variable name: {bad}")
            );
        }
        for blocked in [
            "PATH",
            "HOME",
            "LD_PRELOAD",
            "LD_ANYTHING",
            "BASH_FUNC_x%%",
            "BASH_ENV",
        ] {
            let e = check_env(&env(blocked));
            assert!(e.is_err(), "{blocked} accepted");
        }
    }

    #[test]
    fn call_arguments_are_checked() {
        let v = |j: Json| value::from_json(j);
        let (m, env, args) =
            decode_call(vec![v(json!("a")), v(json!({"K": "v"})), v(json!("x y"))]).unwrap();
        assert_eq!(
            (m.as_str(), env["K"].as_str(), args),
            ("a", "v", vec!["x y".to_string()])
        );
        assert!(decode_call(vec![]).is_err());
        assert!(decode_call(vec![v(json!(1))]).is_err());
        assert!(decode_call(vec![v(json!("a")), v(json!([1]))]).is_err());
        assert!(decode_call(vec![v(json!("a")), v(json!({"K": 1}))]).is_err());
        let e = decode_call(vec![v(json!("a")), v(json!({})), v(json!(3))]).unwrap_err();
        assert_eq!(e.to_string(), "All arguments must be strings, got 3");
    }
}
