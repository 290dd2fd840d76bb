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
//! variables to the exporter's own. Only the configured script may run, so a client's
//! variables are data for it and nothing more: a name must be a plain identifier
//! (`[A-Za-z_][A-Za-z0-9_]*`) and not one that changes how the shell, the dynamic loader, the
//! C library or a common interpreter behaves (`SHELLOPTS`, `PS4`, `IFS`, `PATH`, `HOME`,
//! `BASH_*`, `LD_*`, `PYTHON*`, ...: see [`REFUSED_NAMES`] and [`REFUSED_PREFIXES`]). Such a
//! call is refused (INVALID_ARGUMENT naming the variable and why) before anything runs. This
//! is a superset of upstream's list, which lets `SHELLOPTS=xtrace PS4='$(cmd)'` run `cmd`.
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

/// Why a client may not set a variable: what the name changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Read by the shell itself (bash, sh/dash, ksh, zsh, fish): its options, start-up
    /// files, prompts and traces, word splitting, command lookup, `cd`, here-documents.
    Shell,
    /// Read by the dynamic loader or the C library: libraries loaded into every program,
    /// modules loaded by `iconv`, tunables, locale and resolver files.
    Loader,
    /// Read at start by an interpreter the configured `shell` may be, or a tool scripts
    /// commonly run: code, modules or configuration it loads, commands it runs.
    Interpreter,
}

impl Refusal {
    fn why(self) -> &'static str {
        match self {
            Refusal::Shell => "it changes how the shell runs the script",
            Refusal::Loader => {
                "it changes how the dynamic loader or the C library loads code and data"
            }
            Refusal::Interpreter => {
                "an interpreter or tool the script may start would load code or configuration from it"
            }
        }
    }
}

/// Environment variables a client may not set (exact names; case matters, as for the
/// programs that read them). Upstream refuses `LD_PRELOAD`, `LD_LIBRARY_PATH`, `PATH`,
/// `PYTHONPATH`, `BASH_ENV`, `KUBECONFIG` and `HOME`; this list adds what else the shell,
/// the loader and common interpreters read.
const REFUSED_NAMES: &[(&str, Refusal)] = &[
    // The shell: options and start-up files.
    ("SHELLOPTS", Refusal::Shell),
    ("BASHOPTS", Refusal::Shell),
    ("ENV", Refusal::Shell),
    ("POSIXLY_CORRECT", Refusal::Shell),
    ("ZDOTDIR", Refusal::Shell),
    ("INPUTRC", Refusal::Shell),
    // Prompts and traces (`PS4` is expanded for every traced command).
    ("PS0", Refusal::Shell),
    ("PS1", Refusal::Shell),
    ("PS2", Refusal::Shell),
    ("PS3", Refusal::Shell),
    ("PS4", Refusal::Shell),
    ("PROMPT_COMMAND", Refusal::Shell),
    ("PROMPT_DIRTRIM", Refusal::Shell),
    ("TIMEFORMAT", Refusal::Shell),
    // Parsing, expansion and command lookup.
    ("IFS", Refusal::Shell),
    ("PATH", Refusal::Shell),
    ("FPATH", Refusal::Shell),
    ("CDPATH", Refusal::Shell),
    ("GLOBIGNORE", Refusal::Shell),
    ("GLOBSORT", Refusal::Shell),
    ("EXECIGNORE", Refusal::Shell),
    ("FIGNORE", Refusal::Shell),
    ("FUNCNEST", Refusal::Shell),
    ("TMOUT", Refusal::Shell),
    ("OPTIND", Refusal::Shell),
    ("OPTERR", Refusal::Shell),
    ("OPTARG", Refusal::Shell),
    ("RANDOM", Refusal::Shell),
    ("SRANDOM", Refusal::Shell),
    ("SECONDS", Refusal::Shell),
    ("SHLVL", Refusal::Shell),
    // Where the shell and what it starts find the user's files, other shells, directories.
    ("HOME", Refusal::Shell),
    ("SHELL", Refusal::Shell),
    ("PWD", Refusal::Shell),
    ("OLDPWD", Refusal::Shell),
    ("TMPDIR", Refusal::Shell),
    ("TEXTDOMAIN", Refusal::Shell),
    ("TEXTDOMAINDIR", Refusal::Shell),
    ("MAIL", Refusal::Shell),
    ("MAILPATH", Refusal::Shell),
    ("MAILCHECK", Refusal::Shell),
    ("HOSTFILE", Refusal::Shell),
    ("HISTFILE", Refusal::Shell),
    ("HISTFILESIZE", Refusal::Shell),
    ("HISTSIZE", Refusal::Shell),
    ("HISTCONTROL", Refusal::Shell),
    ("HISTIGNORE", Refusal::Shell),
    ("HISTTIMEFORMAT", Refusal::Shell),
    // The C library: glibc's own list of variables unsafe for privileged programs
    // (`LD_*` is a prefix below).
    ("GCONV_PATH", Refusal::Loader),
    ("GETCONF_DIR", Refusal::Loader),
    ("GLIBC_TUNABLES", Refusal::Loader),
    ("HOSTALIASES", Refusal::Loader),
    ("LOCALDOMAIN", Refusal::Loader),
    ("LOCPATH", Refusal::Loader),
    ("NIS_PATH", Refusal::Loader),
    ("NLSPATH", Refusal::Loader),
    ("RESOLV_HOST_CONF", Refusal::Loader),
    ("RES_OPTIONS", Refusal::Loader),
    ("TZDIR", Refusal::Loader),
    // Interpreters (the configured `shell` may be one) and tools.
    ("RUBYOPT", Refusal::Interpreter),
    ("RUBYLIB", Refusal::Interpreter),
    ("NODE_OPTIONS", Refusal::Interpreter),
    ("NODE_PATH", Refusal::Interpreter),
    ("JAVA_TOOL_OPTIONS", Refusal::Interpreter),
    ("_JAVA_OPTIONS", Refusal::Interpreter),
    ("JDK_JAVA_OPTIONS", Refusal::Interpreter),
    ("TAR_OPTIONS", Refusal::Interpreter),
    ("KUBECONFIG", Refusal::Interpreter),
];

/// Prefixes of environment variables a client may not set.
const REFUSED_PREFIXES: &[(&str, Refusal)] = &[
    // `BASH_ENV`, `BASH_XTRACEFD`, `BASH_COMPAT`, `BASH_LOADABLES_PATH`, exported functions
    // (`BASH_FUNC_name%%`, not identifiers anyway), ...
    ("BASH_", Refusal::Shell),
    // fish reads its function and configuration paths from these.
    ("fish_", Refusal::Shell),
    ("XDG_", Refusal::Shell),
    ("LD_", Refusal::Loader),
    ("MALLOC_", Refusal::Loader),
    // PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, PYTHONWARNINGS (which can import a module), ...
    ("PYTHON", Refusal::Interpreter),
    ("PERL", Refusal::Interpreter),
    ("LUA_", Refusal::Interpreter),
    ("GIT_", Refusal::Interpreter),
];

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

/// Whether a client may set variable `name`: `Err` says why not.
///
/// A name must be a plain identifier, `[A-Za-z_][A-Za-z0-9_]*` (upstream's Python
/// `isidentifier()` also lets non-ASCII letters through; no shell takes those), and none of
/// [`REFUSED_NAMES`] nor start with one of [`REFUSED_PREFIXES`].
fn check_env_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let identifier = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !identifier {
        // Escaped: the name may hold control characters, and the message reaches logs.
        return Err(format!(
            "Invalid environment variable name: {} (a name is ASCII letters, digits and \
             '_', not starting with a digit)",
            name.escape_debug()
        ));
    }
    let refusal = REFUSED_NAMES
        .iter()
        .find(|(n, _)| *n == name)
        .or_else(|| REFUSED_PREFIXES.iter().find(|(p, _)| name.starts_with(p)))
        .map(|(_, r)| *r);
    match refusal {
        None => Ok(()),
        Some(r) => Err(format!(
            "Environment variable '{name}' is blocked for security reasons: {}",
            r.why()
        )),
    }
}

/// Checks a call's environment before anything runs: every name (see [`check_env_name`]),
/// and no value with a NUL byte (no program could receive it).
fn check_env(env: &BTreeMap<String, String>) -> Result<(), DriverError> {
    for (key, value) in env {
        check_env_name(key).map_err(DriverError::InvalidArgument)?;
        if value.contains('\0') {
            return Err(DriverError::InvalidArgument(format!(
                "Environment variable '{key}': the value contains a NUL byte"
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
        // An undescribed method is not described in the report either (upstream's client
        // lists the methods with get_methods and words the help of those itself).
        let node = jumpstarter_core::driver::DriverNode::new(Arc::new(s));
        assert_eq!(
            node.methods_description.keys().collect::<Vec<_>>(),
            ["bare", "slow"]
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
    fn env_names_a_client_may_and_may_not_set() {
        const SH: Option<&str> = Some("changes how the shell runs the script");
        const LD: Option<&str> = Some("dynamic loader");
        const TOOL: Option<&str> = Some("interpreter or tool");
        // (name, None: allowed | Some(what the refusal says))
        let table: &[(&str, Option<&str>)] = &[
            ("FOO", None),
            ("FOO_1", None),
            ("_x", None),
            ("board", None),
            ("BOARD_IP", None),
            ("LANG", None),
            ("LC_ALL", None),
            ("TZ", None),
            ("TERM", None),
            ("SHELL_LEVEL", None), // only the exact name SHELL
            ("PATH_TO_IMAGE", None),
            ("path", None), // case matters, as for the programs that read them
            ("ld_preload", None),
            // Not identifiers.
            ("", Some("Invalid environment variable name: ")),
            ("1A", Some("Invalid environment variable name: 1A")),
            ("A-B", Some("Invalid environment variable name: A-B")),
            ("A B", Some("Invalid environment variable name: A B")),
            ("A=B", Some("Invalid environment variable name: A=B")),
            (
                "BASH_FUNC_x%%",
                Some("Invalid environment variable name: BASH_FUNC_x%%"),
            ),
            ("\u{e9}t\u{e9}", Some("Invalid environment variable name: ")),
            ("A\0", Some("Invalid environment variable name: A\\0 (")),
            ("A\nB", Some("Invalid environment variable name: A\\nB (")),
            // The shell.
            ("SHELLOPTS", SH),
            ("BASHOPTS", SH),
            ("BASH_ENV", SH),
            ("BASH_XTRACEFD", SH),
            ("BASH_FUNC_x", SH),
            ("ENV", SH),
            ("PS1", SH),
            ("PS2", SH),
            ("PS3", SH),
            ("PS4", SH),
            ("PROMPT_COMMAND", SH),
            ("IFS", SH),
            ("CDPATH", SH),
            ("GLOBIGNORE", SH),
            ("PATH", SH),
            ("HOME", SH),
            ("SHELL", SH),
            ("POSIXLY_CORRECT", SH),
            ("ZDOTDIR", SH),
            ("XDG_CONFIG_HOME", SH),
            ("TMPDIR", SH),
            // The loader and the C library.
            ("LD_PRELOAD", LD),
            ("LD_LIBRARY_PATH", LD),
            ("LD_AUDIT", LD),
            ("GCONV_PATH", LD),
            ("GLIBC_TUNABLES", LD),
            ("MALLOC_CHECK_", LD),
            ("LOCPATH", LD),
            // Interpreters and tools.
            ("PYTHONPATH", TOOL),
            ("PYTHONSTARTUP", TOOL),
            ("PYTHONWARNINGS", TOOL),
            ("PERL5OPT", TOOL),
            ("RUBYOPT", TOOL),
            ("NODE_OPTIONS", TOOL),
            ("GIT_SSH_COMMAND", TOOL),
            ("KUBECONFIG", TOOL),
        ];
        for (name, refused) in table {
            match (check_env_name(name), refused) {
                (Ok(()), None) => {}
                (Err(e), Some(what)) => assert!(e.contains(what), "{name:?}: {e}"),
                (Ok(()), Some(_)) => panic!("{name:?} accepted"),
                (Err(e), None) => panic!("{name:?} refused: {e}"),
            }
        }
        // Upstream's wording comes first, then why.
        assert_eq!(
            check_env_name("PS4").unwrap_err(),
            "Environment variable 'PS4' is blocked for security reasons: it changes how the \
             shell runs the script"
        );
        // Every listed name is refused, and none is covered by a prefix already (each entry
        // matters).
        for (n, _) in REFUSED_NAMES {
            assert!(check_env_name(n).is_err(), "{n}");
            assert!(
                !REFUSED_PREFIXES.iter().any(|(p, _)| n.starts_with(p)),
                "{n} is covered by a prefix"
            );
        }
    }

    #[test]
    fn env_is_checked_whole_before_anything_runs() {
        let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(check_env(&env(&[("FOO", "bar"), ("X", "$(touch y)")])).is_ok());
        let e = check_env(&env(&[("FOO", "bar"), ("SHELLOPTS", "xtrace")])).unwrap_err();
        assert!(matches!(e, DriverError::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().contains("'SHELLOPTS'"), "{e}");
        let e = check_env(&env(&[("FOO", "a\0b")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Environment variable 'FOO': the value contains a NUL byte"
        );
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
