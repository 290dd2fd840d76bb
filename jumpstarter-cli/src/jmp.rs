//! `jmp`: the Jumpstarter CLI.

use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use jumpstarter_core::{
    client::{ConnectOptions, ExporterSession, timings},
    config::{ExporterConfig, exporter_config_path},
    server::{
        ServeOptions,
        listener::{ConnectionLimits, DEFAULT_MAX_CONNECTIONS},
    },
};

use crate::{completion::CompletionShell, shell};

/// The Jumpstarter CLI
#[derive(Parser, Debug)]
#[command(name = "jmp", version = crate::config_cmd::VERSION_TEXT, about = "The Jumpstarter CLI")]
pub struct Cli {
    /// Set the log level (DEBUG: what jmp does; TRACE or RUST_LOG: also the libraries under it)
    #[arg(long, global = true, value_parser = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "TRACE"])]
    pub log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Spawns a shell (or custom command) connecting to a local or remote exporter
    #[command(visible_alias = "sh", alias = "s")]
    Shell(ShellArgs),
    /// Run an exporter locally.
    Run(RunArgs),
    /// Manage clients and exporters on the controller (admin)
    #[command(subcommand, alias = "a")]
    Admin(crate::admin::AdminCommand),
    /// Manage local configurations
    #[command(subcommand, alias = "conf")]
    Config(crate::config_cmd::ConfigCommand),
    /// Display one or many resources
    #[command(subcommand, alias = "g")]
    Get(crate::resources::GetCommand),
    /// Show one resource in full
    #[command(subcommand, alias = "desc")]
    Describe(crate::resources::DescribeCommand),
    /// Create a resource
    #[command(subcommand, alias = "c")]
    Create(crate::resources::CreateCommand),
    /// Update a resource
    #[command(subcommand)]
    Update(crate::resources::UpdateCommand),
    /// Delete resources
    #[command(subcommand, alias = "del", alias = "d")]
    Delete(crate::resources::DeleteCommand),
    /// Share a lease with other clients of its namespace, or stop sharing it
    #[command(subcommand)]
    Share(crate::share::ShareCommand),
    /// Authentication and token management commands.
    #[command(subcommand)]
    Auth(crate::auth::AuthCommand),
    /// Login into a jumpstarter instance.
    Login(Box<crate::login::LoginArgs>),
    /// Jumpstarter driver CLI tool
    #[command(subcommand)]
    Driver(crate::auth::DriverCommand),
    /// MCP server for AI agent interaction with Jumpstarter hardware.
    #[command(subcommand)]
    Mcp(crate::mcp::McpCommand),
    /// Get the current Jumpstarter version
    #[command(alias = "ver", alias = "v")]
    Version(crate::config_cmd::VersionArgs),
    /// Generate shell completion script.
    ///
    /// For bash: `source <(jmp completion bash)`; zsh: `source <(jmp completion zsh)`;
    /// fish: `jmp completion fish | source`.
    Completion {
        /// The shell to generate the script for.
        #[arg(value_enum)]
        shell: CompletionShell,
    },
}

/// Writes the completion script of `jmp` for `shell` to stdout (quietly stopping when stdout
/// is closed: `jmp completion bash | head -1`). The script asks `jmp` for the words to offer
/// (`crate::completion`), so names of clients, exporters and leases complete too.
fn completion(shell: CompletionShell) -> Result<i32> {
    let script = crate::completion::script(shell, "jmp", &crate::completion::program_path())
        .context("cannot write the completion script")?;
    crate::pipe::write_stdout(&script).context("cannot write the completion script")?;
    Ok(0)
}

/// Which exporter config to use.
#[derive(Args, Debug, Default)]
struct ExporterSelect {
    /// Path of exporter config
    #[arg(long, value_name = "PATH")]
    exporter_config: Option<PathBuf>,
    /// Alias of exporter config
    #[arg(long, value_name = "TEXT", conflicts_with = "exporter_config",
          add = crate::completion::exporter_aliases())]
    exporter: Option<String>,
}

impl ExporterSelect {
    fn load(&self) -> Result<Option<ExporterConfig>> {
        let path = match (&self.exporter_config, &self.exporter) {
            (Some(p), _) => p.clone(),
            (None, Some(alias)) => exporter_config_path(alias)?,
            (None, None) => return Ok(None),
        };
        Ok(Some(ExporterConfig::load(&path)?))
    }
}

/// Spawns a shell (or custom command) connecting to a local or remote exporter.
///
/// COMMAND is the custom command to run instead of shell; its exit code becomes jmp's.
#[derive(Args, Debug)]
struct ShellArgs {
    #[command(flatten)]
    exporter: ExporterSelect,
    /// Connect directly to an exporter at this address (no controller). E.g.
    /// exporter.host.name:1234.
    #[arg(long, value_name = "HOST:PORT")]
    tls_grpc: Option<String>,
    /// With --tls-grpc, connect without TLS (insecure, for development only).
    #[arg(long, requires = "tls_grpc")]
    tls_grpc_insecure: bool,
    /// With --tls-grpc, also trust this CA certificate (PEM) besides the system roots.
    #[arg(long, value_name = "PATH", requires = "tls_grpc")]
    tls_ca: Option<PathBuf>,
    /// Passphrase for authenticating with a standalone exporter (--tls-grpc).
    #[arg(long, value_name = "TEXT", requires = "tls_grpc")]
    passphrase: Option<String>,
    /// Path to client config
    #[arg(long, value_name = "PATH")]
    client_config: Option<PathBuf>,
    /// Alias of client config
    #[arg(long, value_name = "TEXT", conflicts_with = "client_config",
          add = crate::completion::client_aliases())]
    client: Option<String>,
    /// Use this existing lease (also JMP_LEASE); it is not released on exit.
    #[arg(long, value_name = "TEXT", add = crate::completion::lease_names())]
    lease: Option<String>,
    /// Selector (label query) to filter on, supports '=', '==', and '!=' (e.g. -l
    /// key1=value1,key2=value2). Can be specified multiple times.
    #[arg(short = 'l', long = "selector", value_name = "TEXT")]
    selector: Vec<String>,
    /// Target a specific exporter/device name directly.
    #[arg(short = 'n', long = "name", value_name = "TEXT",
          add = crate::completion::exporter_names())]
    name: Option<String>,
    /// Lease duration: 30m, 3h30m, 1d, 1d3h40m, PT1H30M, 01:30:00, 2 days, 01:30:00.
    #[arg(long, value_name = "DURATION", default_value = "00:30:00")]
    duration: String,
    /// Override acquisition timeout (e.g. '30m', '3h30m', '1d', or seconds). Must be >= 5
    /// seconds. Default: the client config's leases.acquisition_timeout (2h unless set)
    #[arg(long, value_name = "DURATION")]
    acquisition_timeout: Option<String>,
    /// Override retry timeout for unreachable exporters (e.g., '5m', '30s', '0' to disable).
    /// Default: 5m.
    #[arg(long, value_name = "DURATION", env = "JMP_RETRY_TIMEOUT")]
    retry_timeout: Option<String>,
    /// Always go through the router, even when the exporter offers a direct connection.
    #[arg(long)]
    no_direct: bool,
    /// Enable exporter log streaming (the exporter's log records are printed on stderr
    /// while the command runs).
    #[arg(long)]
    exporter_logs: bool,
    /// Keep extending the lease while the shell or its command runs, up to the access
    /// policy's maximum duration (with a controller). Extensions stop when jmp exits.
    #[arg(long)]
    keep_alive: bool,
    /// What the new lease is for, as key=value (repeatable, at most 8): e.g.
    /// build_id=123. On every log line of the lease
    #[arg(long, value_name = "KEY=VALUE")]
    context: Vec<String>,
    /// Print on stderr, at exit, where the time went: each step (config, controller
    /// connection, lease, tunnel, command, release) with its start and duration since the
    /// process started, in milliseconds. Also JMP_TIMINGS=1.
    #[arg(long)]
    timings: bool,
    /// The command to run instead of a shell.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    command: Vec<String>,
}

/// Run an exporter locally.
#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    exporter: ExporterSelect,
    /// Listen on TCP (and optional TLS) instead of registering with a controller. E.g. 1234
    /// or 0.0.0.0:1234.
    #[arg(long, value_name = "[HOST:]PORT")]
    tls_grpc_listener: Option<String>,
    /// With --tls-grpc-listener, listen without TLS (insecure, for development only).
    #[arg(long, requires = "tls_grpc_listener")]
    tls_grpc_insecure: bool,
    /// Server certificate (PEM) for --tls-grpc-listener.
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Server private key (PEM) for --tls-grpc-listener.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require this passphrase from clients connecting via --tls-grpc-listener.
    #[arg(long, value_name = "TEXT", requires = "tls_grpc_listener")]
    passphrase: Option<String>,
    /// Controller mode: also serve leased clients directly on this TCP address (per-lease
    /// mutual TLS), so clients on this network bypass the router. E.g. 7000 or
    /// 0.0.0.0:7000. Overrides the config's `directListener`.
    #[arg(long, value_name = "[HOST:]PORT", conflicts_with = "tls_grpc_listener")]
    direct_listener: Option<String>,
    /// Host name or address clients use for --direct-listener (default: its host, or this
    /// machine's name when it listens on all addresses).
    #[arg(long, value_name = "HOST", conflicts_with = "tls_grpc_listener")]
    direct_advertise: Option<String>,
    /// Exit after the current lease ends instead of waiting for a new one (the config's
    /// `exitOnLeaseEnd: true`). Controller mode only.
    #[arg(long, conflicts_with = "tls_grpc_listener")]
    exit_on_lease_end: bool,
    /// Serve Prometheus metrics (OpenMetrics, with the lease's client and id as exemplars)
    /// on `http://ADDR/metrics`: driver calls by driver type, operation and result, their
    /// durations and errors, stream bytes, active lease sessions. E.g. 9100 or
    /// 127.0.0.1:0. With --tls-grpc-listener the one session counts, without exemplars.
    #[arg(long, value_name = "[HOST:]PORT")]
    metrics_listen: Option<String>,
    /// Log lines as text for a person, or as JSON for a log store: one object a line with
    /// lease_id, client, exporter and the driver calls' operation, result and duration_ms.
    #[arg(long, value_name = "FORMAT", env = "JMP_LOG_FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    log_format: String,
    /// Export traces of each lease (the lease and its driver calls) (OTLP over gRPC) to this collector, e.g.
    /// `http://127.0.0.1:4317`; `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`)
    /// does the same. Off when none is set.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// Concurrent connections on --tls-grpc-listener or --direct-listener (established or
    /// handshaking); more are closed at once, with a warning in the log.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS,
          env = "JMP_MAX_CONNECTIONS")]
    max_connections: usize,
    /// Seconds a connection to --tls-grpc-listener or --direct-listener may take for its
    /// TLS handshake, and again to send the HTTP/2 preface after it.
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    handshake_timeout: u64,
    /// Seconds between the HTTP/2 keepalive pings --tls-grpc-listener or --direct-listener
    /// sends on each connection.
    #[arg(long, value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    keepalive_interval: u64,
    /// Seconds a keepalive ping may stay unanswered before the connection is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..))]
    keepalive_timeout: u64,
}

impl RunArgs {
    /// The bounds of the exporter's network listener.
    fn limits(&self) -> ConnectionLimits {
        let t = Duration::from_secs(self.handshake_timeout);
        ConnectionLimits {
            max_connections: self.max_connections,
            handshake_timeout: t,
            first_frame_timeout: t,
            keepalive_interval: Duration::from_secs(self.keepalive_interval),
            keepalive_timeout: Duration::from_secs(self.keepalive_timeout),
            ..ConnectionLimits::default()
        }
    }
}

/// Entry point of the `jmp` binary: the stock drivers.
pub fn main() -> ExitCode {
    let started = Instant::now();
    let toolkit = crate::Toolkit::stock();
    timed_main(toolkit, started)
}

/// Entry point of a lab's own `jmp`: every command and flag of `jmp`, with the drivers of
/// `toolkit` (`jmp run`, local `jmp shell`, `jmp driver list`, the config check of
/// `jmp config exporter edit`) and its `j` commands and `j` program (`jmp mcp`).
pub fn main_with(toolkit: crate::Toolkit) -> ExitCode {
    timed_main(toolkit, Instant::now())
}

/// [`main_with`], the timeline of `--timings` / `JMP_TIMINGS` counted from `started`.
fn timed_main(toolkit: crate::Toolkit, started: Instant) -> ExitCode {
    let before_parse = Instant::now();
    crate::pipe::exit_quietly_on_closed_stdout();
    jumpstarter_core::tls::install_tls_provider();
    crate::completion::answer_if_asked(<Cli as clap::CommandFactory>::command);
    let cli = Cli::parse();
    if timings::wanted_by_env() || matches!(&cli.command, Command::Shell(s) if s.timings) {
        timings::start(started);
        timings::record("drivers registered", started, before_parse);
        timings::record("arguments parsed", before_parse, Instant::now());
    }
    let code = untimed_main(cli, &toolkit);
    if let Some(text) = timings::render() {
        eprint!("{text}");
    }
    code
}

fn untimed_main(cli: Cli, toolkit: &crate::Toolkit) -> ExitCode {
    let setup = timings::step("logging and async runtime set up");
    let json = matches!(&cli.command, Command::Run(r) if r.log_format == "json");
    // `jmp run` exports traces when an OTLP endpoint is set.
    let _traces = match &cli.command {
        Command::Run(r) => {
            match jumpstarter_core::telemetry::start(
                "jumpstarter-exporter",
                r.otlp_endpoint.as_deref(),
            ) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("Error: {}", jumpstarter_core::error_chain(&e));
                    return ExitCode::FAILURE;
                }
            }
        }
        _ => None,
    };
    crate::logging::init(cli.log_level.as_deref(), json);
    if matches!(&cli.command, Command::Run(_))
        && let Err(e) = exit_with_parent_if_asked()
    {
        eprintln!("Error: {e:#}");
        return ExitCode::FAILURE;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    setup.end();
    let result = rt.block_on(run(cli, toolkit));
    let shutdown = timings::step("async runtime shut down");
    drop(rt);
    shutdown.end();
    // With JSON logs, the lines logged so far go out before the process does.
    jumpstarter_core::logging::flush();
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("Error: {}", crate::output::format_error(&e));
            ExitCode::FAILURE
        }
    }
}

/// Set by the controller's `local` pool provisioner on a `jmp run` that must not outlive it:
/// the controller's pid. `jmp run` then asks the kernel for SIGTERM (a graceful stop, hooks
/// included) when that parent dies, and stops at once if it is already gone.
pub const EXIT_WITH_PARENT_ENV: &str = "JMP_RUN_EXIT_WITH_PARENT";

/// Honours [`EXIT_WITH_PARENT_ENV`]. Called on the main thread before the runtime starts: the
/// kernel keeps the parent-death signal per thread, and the main thread lives as long as the
/// process.
fn exit_with_parent_if_asked() -> Result<()> {
    let Some(value) = std::env::var_os(EXIT_WITH_PARENT_ENV) else {
        return Ok(());
    };
    let parent = value
        .to_str()
        .and_then(|v| v.trim().parse::<i32>().ok())
        .filter(|p| *p > 0)
        .with_context(|| format!("{EXIT_WITH_PARENT_ENV}={value:?} is not a process id"))?;
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .with_context(|| format!("{EXIT_WITH_PARENT_ENV}: cannot set the parent-death signal"))?;
    // The parent may have died before the signal was set: then nobody would send it.
    let ppid = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get());
    if ppid != parent {
        bail!(
            "the process that started this jmp run (pid {parent}, {EXIT_WITH_PARENT_ENV}) is gone"
        );
    }
    Ok(())
}

/// Runs a parsed command line with the drivers and `j` commands of `toolkit`; returns the
/// exit code.
pub async fn run(cli: Cli, toolkit: &crate::Toolkit) -> Result<i32> {
    // What a `jmp` killed with SIGKILL left (its socket directory): the next `jmp` removes it.
    crate::shell::sweep_stale_dirs();
    match cli.command {
        Command::Shell(args) => shell(args, toolkit).await,
        Command::Run(args) => run_exporter(args, toolkit).await,
        Command::Admin(cmd) => crate::admin::run(cmd).await,
        Command::Config(cmd) => crate::config_cmd::run(cmd, toolkit).await,
        Command::Get(cmd) => crate::resources::get(cmd).await,
        Command::Describe(cmd) => crate::resources::describe(cmd).await,
        Command::Create(cmd) => crate::resources::create(cmd).await,
        Command::Update(cmd) => crate::resources::update(cmd).await,
        Command::Delete(cmd) => crate::resources::delete(cmd).await,
        Command::Share(cmd) => crate::share::run(cmd).await,
        Command::Auth(cmd) => crate::auth::run(cmd).await,
        Command::Login(args) => crate::login::run(*args).await,
        Command::Driver(cmd) => crate::auth::driver(cmd, toolkit),
        Command::Mcp(cmd) => crate::mcp::run(cmd, toolkit.clone()).await,
        Command::Version(args) => crate::config_cmd::version(args),
        Command::Completion { shell } => completion(shell),
    }
}

async fn shell(args: ShellArgs, toolkit: &crate::Toolkit) -> Result<i32> {
    let local = args.tls_grpc.is_some()
        || args.exporter.exporter_config.is_some()
        || args.exporter.exporter.is_some();
    anyhow::ensure!(
        args.context.is_empty() || !local,
        "--context sets the context of a lease a controller grants: a shell with --tls-grpc or an exporter config has no lease"
    );
    if let Some(addr) = &args.tls_grpc {
        let opts = ConnectOptions {
            insecure: args.tls_grpc_insecure,
            passphrase: args.passphrase.clone(),
            ca_pem: match &args.tls_ca {
                Some(p) => {
                    Some(std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?)
                }
                None => None,
            },
        };
        // Fail here, with one clear line, rather than in every command of the shell.
        ExporterSession::connect(addr, &opts)
            .await
            .map_err(|e| crate::hints::direct_error(addr, opts.insecure, e.into()))?;
        let mut env = shell::base_env(addr);
        if args.tls_grpc_insecure {
            env.insert("JMP_GRPC_INSECURE".into(), "1".into());
        }
        if let Some(p) = &args.passphrase {
            env.insert("JMP_GRPC_PASSPHRASE".into(), p.clone());
        }
        if let Some(p) = &args.tls_ca {
            let abs = std::path::absolute(p).unwrap_or_else(|_| p.clone());
            env.insert("JMP_GRPC_CA".into(), abs.to_string_lossy().into());
        }
        env.insert("JMP_LEASE".into(), "direct".into());
        env.insert("JMP_EXPORTER".into(), "direct".into());
        // As upstream: show hook output, wait for LEASE_READY; no EndSession (the
        // standalone exporter's session outlives this client).
        let channel = jumpstarter_core::client::connect_channel(addr, &opts).await?;
        let logs = crate::hook_wait::follow_logs(channel.clone(), args.exporter_logs);
        let ready = // No controller to ask: a standalone exporter's session outlives every client, so
        // polls that fail are retried for the whole wait.
        crate::hook_wait::before_command(channel, || std::future::ready(false), || None).await;
        // A failed beforeLease hook: its output (which says why) is waited for.
        let hook_failed = ready.is_err();
        let code = match ready {
            Ok(None) => {
                let child = shell::ChildOptions {
                    j_program: toolkit.j_program(),
                    ..shell::ChildOptions::default()
                };
                shell::run_child(&args.command, &env, "direct", child).await
            }
            Ok(Some(code)) => Ok(code),
            Err(e) => Err(e),
        };
        crate::hook_wait::stop_logs(logs, hook_failed).await;
        return code;
    }
    match args.exporter.load()? {
        Some(cfg) => {
            if cfg.hooks.before_lease.is_some() || cfg.hooks.after_lease.is_some() {
                // Upstream runs hooks only around leases (`jmp run`), not in local shells.
                eprintln!(
                    "Warning: `hooks` of the exporter config are not run by a local shell (they run around leases of `jmp run`)"
                );
            }
            if cfg.exit_on_lease_end {
                // A local shell's exporter lives as long as the shell: there is no lease.
                eprintln!(
                    "Warning: `exitOnLeaseEnd` of the exporter config applies to `jmp run` with a controller, not to a local shell"
                );
            }
            shell::local(toolkit, &cfg, &args.command, args.exporter_logs).await
        }
        // No exporter: lease one through the controller of a client config.
        None => {
            let lease = crate::distributed::ShellLease {
                client_config: args.client_config,
                client: args.client,
                lease: args.lease,
                selectors: args.selector,
                name: args.name,
                duration: args.duration,
                acquisition_timeout: args.acquisition_timeout,
                retry_timeout: args.retry_timeout,
                no_direct: args.no_direct,
                exporter_logs: args.exporter_logs,
                keep_alive: args.keep_alive,
                context: args.context,
            };
            crate::distributed::shell(toolkit, lease, &args.command).await
        }
    }
}

/// Parses `[HOST:]PORT` (default host 0.0.0.0, as upstream).
fn listen_addr(spec: &str) -> Result<String> {
    let (host, port) = match spec.rsplit_once(':') {
        Some((h, p)) => (h.trim_start_matches('[').trim_end_matches(']'), p),
        None => ("0.0.0.0", spec),
    };
    let port: u16 = port
        .parse()
        .with_context(|| format!("invalid port in {spec:?}"))?;
    let host = if host.is_empty() { "0.0.0.0" } else { host };
    Ok(if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

/// `jmp run --metrics-listen`: the exporter's metrics, served on `spec` until the process
/// ends.
async fn serve_exporter_metrics(
    spec: &str,
    exporter: &str,
    json: bool,
) -> Result<std::sync::Arc<jumpstarter_exporter::metrics::ExporterMetrics>> {
    let addr = listen_addr(spec).context("--metrics-listen")?;
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("--metrics-listen: cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    if json {
        tracing::info!(addr = %local, "serving metrics on http://{local}/metrics");
    } else {
        eprintln!("Serving metrics on http://{local}/metrics");
    }
    let metrics = jumpstarter_exporter::metrics::ExporterMetrics::new(exporter);
    let m = std::sync::Arc::clone(&metrics);
    let render: jumpstarter_core::server::http1::MetricsRender = std::sync::Arc::new(move || {
        let page = m.render();
        Box::pin(async move { page })
    });
    tokio::spawn(jumpstarter_core::server::http1::serve_metrics(
        listener,
        render,
        std::future::pending::<()>(),
    ));
    Ok(metrics)
}

async fn run_exporter(args: RunArgs, toolkit: &crate::Toolkit) -> Result<i32> {
    let cfg = args
        .exporter
        .load()?
        .context("no exporter given: use --exporter-config PATH or --exporter ALIAS")?;
    let Some(spec) = &args.tls_grpc_listener else {
        let mut cfg = cfg;
        if args.direct_listener.is_some() {
            cfg.direct_listener = args.direct_listener.clone();
        }
        if args.direct_advertise.is_some() {
            cfg.direct_advertise = args.direct_advertise.clone();
        }
        if args.exit_on_lease_end {
            cfg.exit_on_lease_end = true;
        }
        let metrics = match &args.metrics_listen {
            Some(spec) => Some(
                serve_exporter_metrics(spec, &cfg.metadata.name, args.log_format == "json").await?,
            ),
            None => None,
        };
        return crate::distributed::run_exporter(toolkit, &cfg, args.limits(), metrics).await;
    };
    let tls = match (&args.tls_cert, &args.tls_key, args.tls_grpc_insecure) {
        (Some(_), Some(_), true) => {
            bail!("--tls-grpc-insecure cannot be used with --tls-cert/--tls-key")
        }
        (Some(c), Some(k), false) => Some((
            std::fs::read(c).with_context(|| format!("cannot read {}", c.display()))?,
            std::fs::read(k).with_context(|| format!("cannot read {}", k.display()))?,
        )),
        (None, None, true) => None,
        _ => bail!("--tls-grpc-listener needs --tls-cert and --tls-key, or --tls-grpc-insecure"),
    };
    if cfg.exit_on_lease_end {
        // A standalone exporter serves one session until it is stopped: it has no leases.
        eprintln!(
            "Warning: `exitOnLeaseEnd` of the exporter config applies to controller mode only; \
             --tls-grpc-listener serves until it is stopped"
        );
    }
    let standalone = toolkit.exporter(&cfg).standalone().await?;
    // Kept for as long as the session is served: it counts as the one active session.
    let _session_metrics = match &args.metrics_listen {
        Some(spec) => {
            let metrics =
                serve_exporter_metrics(spec, &cfg.metadata.name, args.log_format == "json").await?;
            let lease = metrics.lease("", "", &Default::default());
            standalone.session().set_call_observer(lease.observer());
            standalone
                .session()
                .set_stream_observer(lease.stream_observer());
            Some(lease)
        }
        None => None,
    };
    let addr = listen_addr(spec).context("--tls-grpc-listener")?;
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    eprintln!(
        "Exporter {} listening on {local} ({})",
        cfg.metadata.name,
        if tls.is_some() { "TLS" } else { "plaintext" }
    );
    let opts = ServeOptions {
        tls,
        passphrase: args.passphrase.clone(),
        limits: args.limits(),
    };
    standalone
        .serve_tcp(listener, opts, crate::signals::shutdown_signal())
        .await?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(listen_addr("1234").unwrap(), "0.0.0.0:1234");
        assert_eq!(listen_addr("127.0.0.1:0").unwrap(), "127.0.0.1:0");
        assert_eq!(listen_addr(":99").unwrap(), "0.0.0.0:99");
        assert_eq!(listen_addr("[::1]:5").unwrap(), "[::1]:5");
        assert!(listen_addr("host:port").is_err());
    }

    #[test]
    fn cli_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn run_flags_set_the_listener_limits_and_keepalive() {
        use clap::Parser;
        let limits = |extra: &[&str]| {
            let mut args = vec!["jmp", "run", "--direct-listener", "127.0.0.1:0"];
            args.extend(extra);
            match Cli::try_parse_from(args).map(|c| c.command) {
                Ok(Command::Run(r)) => Ok(r.limits()),
                Ok(other) => panic!("parsed as {other:?}"),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(limits(&[]).unwrap(), ConnectionLimits::default());
        let l = limits(&[
            "--max-connections",
            "3",
            "--handshake-timeout",
            "4",
            "--keepalive-interval",
            "5",
            "--keepalive-timeout",
            "7",
        ])
        .unwrap();
        assert_eq!(
            l,
            ConnectionLimits {
                max_connections: 3,
                handshake_timeout: Duration::from_secs(4),
                first_frame_timeout: Duration::from_secs(4),
                keepalive_interval: Duration::from_secs(5),
                keepalive_timeout: Duration::from_secs(7),
                ..ConnectionLimits::default()
            }
        );
        for bad in [
            &["--keepalive-interval", "0"][..],
            &["--keepalive-timeout", "0"],
            &["--keepalive-interval", "soon"],
        ] {
            let e = limits(bad).unwrap_err();
            assert!(e.contains(bad[0]), "{bad:?}: {e}");
        }
    }

    /// Upstream's aliases (`AliasedGroup`), which apply in every group that has the command.
    const UPSTREAM_ALIASES: &[(&str, &[&str])] = &[
        ("create", &["c"]),
        ("import", &["i"]),
        ("get", &["g"]),
        ("admin", &["a"]),
        ("config", &["conf"]),
        ("delete", &["del", "d"]),
        ("shell", &["sh", "s"]),
        ("list", &["ls"]),
        ("exporter", &["exporters", "e"]),
        ("exporters", &["exporter"]),
        ("client", &["clients", "c"]),
        ("clients", &["client"]),
        ("lease", &["leases", "l"]),
        ("leases", &["lease"]),
        ("cluster", &["clusters"]),
        ("clusters", &["cluster"]),
        ("version", &["ver", "v"]),
    ];

    /// Walks every upstream 0.9.0 command path (tests/data, taken from its `--help`): each
    /// must resolve here, under its name and each of its aliases, and take each flag.
    #[test]
    fn upstream_command_tree() {
        use clap::CommandFactory;
        let data = include_str!("../tests/data/upstream-jmp-0.9.0-commands.txt");
        let mut root = Cli::command();
        root.build();
        let mut missing = Vec::new();
        let mut paths = 0;
        'paths: for line in data
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (path, flags) = line.split_once(':').unwrap();
            paths += 1;
            let mut cmd = &root;
            for word in path.split_whitespace().skip(1) {
                let Some(sub) = cmd.find_subcommand(word) else {
                    missing.push(format!("{path}: no command {word:?}"));
                    continue 'paths;
                };
                let aliases = UPSTREAM_ALIASES
                    .iter()
                    .filter(|(name, _)| *name == word)
                    .flat_map(|(_, a)| a.iter());
                for alias in aliases {
                    // An alias that names another command of the group is that command.
                    let other = cmd.get_subcommands().any(|c| c.get_name() == *alias);
                    match cmd.find_subcommand(alias) {
                        Some(c) if c.get_name() == sub.get_name() || other => {}
                        _ => missing.push(format!("{path}: alias {alias:?} of {word:?}")),
                    }
                }
                cmd = sub;
            }
            for flag in flags.split_whitespace() {
                let found = cmd.get_arguments().any(|a| match flag.strip_prefix("--") {
                    Some(long) => {
                        a.get_long() == Some(long)
                            || a.get_all_aliases().is_some_and(|v| v.contains(&long))
                    }
                    None => a.get_short() == flag.chars().nth(1),
                });
                if !found {
                    missing.push(format!("{path}: flag {flag}"));
                }
            }
        }
        assert!(paths > 50, "only {paths} command paths read");
        assert!(missing.is_empty(), "missing:\n{}", missing.join("\n"));
    }
}
