//! What `jmp shell` does once it has an exporter to talk to: run a command (or the user's
//! shell) with `JUMPSTARTER_HOST` and friends set, and return its exit code.

use std::{collections::BTreeMap, path::Path, time::Duration};

use anyhow::{Context, Result};
use jumpstarter_core::{
    client::{ConnectOptions, connect_channel},
    config::ExporterConfig,
    server::local_socket_path,
};
use jumpstarter_proto::v1::{LogSource, exporter_service_client::ExporterServiceClient};

/// How [`run_child`] runs its child besides the environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChildOptions<'a> {
    /// Print the exporter's log records on stderr while the child runs (`jmp shell
    /// --exporter-logs` of a local shell; a caller that follows the logs itself, around the
    /// lease hooks, leaves it off).
    pub exporter_logs: bool,
    /// The caller already said where the shell is connected ("Connected to EXPORTER via
    /// router"): an interactive shell then only says how to leave.
    pub announced: bool,
    /// The `j` program of the toolkit: the directory of this `jmp` is added to the child's
    /// `PATH` when that `j` is beside it (empty: `PATH` stays as it is).
    pub j_program: &'a str,
}

/// How often the log follower tries to (re)open the exporter's `LogStream`, as upstream.
const LOG_STREAM_ATTEMPTS: u32 = 10;

/// Prints the exporter's log records reached through `env` (`JUMPSTARTER_HOST` and the
/// `JMP_GRPC_*` settings) on stderr until cancelled. Exporters without `LogStream` are left
/// alone after the first answer that says so.
async fn print_exporter_logs(env: ShellEnv) {
    let Some((host, opts)) = exporter_address(&env) else {
        return;
    };
    for _ in 0..LOG_STREAM_ATTEMPTS {
        if let Ok(channel) = connect_channel(&host, &opts).await {
            match ExporterServiceClient::new(channel).log_stream(()).await {
                Ok(response) => {
                    let mut records = response.into_inner();
                    while let Ok(Some(r)) = records.message().await {
                        let source = r
                            .source
                            .and_then(|s| LogSource::try_from(s).ok())
                            .map(|s| match s {
                                LogSource::Driver => "driver",
                                LogSource::BeforeLeaseHook => "beforeLease",
                                LogSource::AfterLeaseHook => "afterLease",
                                LogSource::System | LogSource::Unspecified => "exporter",
                            })
                            .unwrap_or("exporter");
                        eprintln!("[{source}] {} {}", r.severity, r.message);
                    }
                }
                Err(status) if status.code() == tonic::Code::Unimplemented => return,
                Err(status) => tracing::debug!("exporter LogStream: {}", status.message()),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Where the child of `jmp shell` reaches the exporter: `JUMPSTARTER_HOST` and the
/// `JMP_GRPC_*` settings of `env`.
fn exporter_address(env: &ShellEnv) -> Option<(String, ConnectOptions)> {
    let host = env.get("JUMPSTARTER_HOST")?.clone();
    let opts = ConnectOptions {
        insecure: env.contains_key("JMP_GRPC_INSECURE"),
        passphrase: env.get("JMP_GRPC_PASSPHRASE").cloned(),
        ca_pem: env.get("JMP_GRPC_CA").and_then(|p| std::fs::read(p).ok()),
    };
    Some((host, opts))
}

/// How long `jmp shell` waits for the exporter's message of the day.
const MOTD_TIMEOUT: Duration = Duration::from_secs(5);

/// The exporter's message of the day (upstream main's `GetReport.motd`), asked for after
/// the beforeLease hook (which may add to it); `None` when it has none or does not answer
/// within [`MOTD_TIMEOUT`] (the shell starts anyway).
async fn exporter_motd(env: &ShellEnv) -> Option<String> {
    let (host, opts) = exporter_address(env)?;
    let ask = async {
        let channel = connect_channel(&host, &opts).await.ok()?;
        let report = ExporterServiceClient::new(channel)
            .get_report(())
            .await
            .ok()?;
        Some(report.into_inner().motd)
    };
    match tokio::time::timeout(MOTD_TIMEOUT, ask).await {
        Ok(Some(motd)) if !motd.is_empty() => Some(motd),
        Ok(_) => None,
        Err(_) => {
            tracing::debug!("the exporter did not send its motd in time");
            None
        }
    }
}

/// Environment for the child of `jmp shell`.
pub type ShellEnv = BTreeMap<String, String>;

/// Runs `command` (or an interactive shell when empty) with `env` added; returns the exit
/// code to leave with (128 + signal when the child was killed by a signal).
pub async fn run_child(
    command: &[String],
    env: &ShellEnv,
    context: &str,
    opts: ChildOptions<'_>,
) -> Result<i32> {
    let mut cmd = if let Some((prog, args)) = command.split_first() {
        let mut c = tokio::process::Command::new(prog);
        c.args(args);
        c
    } else {
        let shell = std::env::var("SHELL")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "bash".into());
        let mut c = tokio::process::Command::new(&shell);
        let name = Path::new(&shell)
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        match name.as_str() {
            "bash" => {
                c.args(["--norc", "--noprofile"]);
                c.env("PS1", format!("⚡{context} ➤ "));
            }
            "zsh" => {
                c.arg("--no-rcs");
                c.env("PROMPT", format!("⚡{context} ➤ "));
            }
            _ => {
                c.env("PS1", format!("⚡{context} ➤ "));
            }
        }
        // Interactive shells only, as upstream main: `-- CMD` output stays the command's.
        if let Some(motd) = exporter_motd(env).await {
            println!("{}", motd.trim_end());
        }
        if opts.announced {
            eprintln!("Type `exit` to leave.");
        } else {
            eprintln!("Connected to {context}; type `exit` to leave.");
        }
        c
    };
    cmd.envs(env);
    if let Some(path) = Some(opts.j_program)
        .filter(|j| !j.is_empty())
        .and_then(crate::toolkit::path_with_own_j)
    {
        cmd.env("PATH", path);
    }
    // If jmp is told to stop while the child runs, the child must not outlive it.
    cmd.kill_on_drop(true);
    let program = command.first().cloned().unwrap_or_else(|| "shell".into());
    let spawning = jumpstarter_core::client::timings::step("command spawned");
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {program:?}"))?;
    spawning.end();
    let logs = opts
        .exporter_logs
        .then(|| tokio::spawn(print_exporter_logs(env.clone())));
    // Ctrl-C belongs to the child (it shares our terminal); we keep serving until it exits.
    let status = loop {
        tokio::select! {
            s = child.wait() => break s.with_context(|| format!("waiting for {program:?}"))?,
            _ = tokio::signal::ctrl_c() => continue,
        }
    };
    if let Some(logs) = logs {
        logs.abort();
    }
    Ok(exit_code(status))
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// The environment every `jmp shell` child gets besides `JUMPSTARTER_HOST`.
pub fn base_env(host: &str) -> ShellEnv {
    let mut env = ShellEnv::new();
    env.insert("JUMPSTARTER_HOST".into(), host.into());
    env.insert("JMP_DRIVERS_ALLOW".into(), "UNSAFE".into());
    env.insert("_JMP_SUPPRESS_DRIVER_WARNINGS".into(), "1".into());
    env
}

/// Builds the exporter of `cfg` in this process, serves it on a private Unix socket and runs
/// `command` against it. Unlike upstream 0.9.0, the command's exit code is returned.
/// `exporter_logs`: print the exporter's log records while the command runs.
pub async fn local(
    toolkit: &crate::Toolkit,
    cfg: &ExporterConfig,
    command: &[String],
    exporter_logs: bool,
) -> Result<i32> {
    let exporter = toolkit.exporter(cfg).local().await?;
    let dir = private_dir()?;
    let socket = local_socket_path(dir.path());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = exporter.serve_unix(&socket, async {
        let _ = stopped.await;
    })?;
    let server = tokio::spawn(server);
    let env = base_env(&socket.to_string_lossy());
    let opts = ChildOptions {
        exporter_logs,
        announced: false,
        j_program: toolkit.j_program(),
    };
    let code = run_child(command, &env, "local", opts).await;
    let _ = stop.send(());
    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(
            "exporter stopped with an error: {e}",
            e = jumpstarter_core::error_chain(&e)
        ),
        Err(e) => tracing::warn!(
            "exporter task failed: {e}",
            e = jumpstarter_core::error_chain(&e)
        ),
    }
    exporter.close().await;
    code
}

/// The kind of `jmp shell`'s socket directories: named `jumpstarter-shell-PID-RANDOM`
/// ([`jumpstarter_core::leftovers`]).
const SHELL_DIR_KIND: &str = "jumpstarter-shell";

/// Where `jmp shell` puts its socket directories: `$XDG_RUNTIME_DIR` or the temp dir.
fn private_base() -> std::path::PathBuf {
    std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty() && Path::new(d).is_dir())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// A fresh private (0700) directory under `$XDG_RUNTIME_DIR` or the temp dir, named after
/// this process; the ones of killed `jmp` processes are removed first.
pub fn private_dir() -> Result<tempfile::TempDir> {
    let base = private_base();
    jumpstarter_core::leftovers::private_dir_in(&base, SHELL_DIR_KIND)
        .with_context(|| format!("cannot create a private directory in {}", base.display()))
}

/// Removes the socket directories of `jmp` processes that were killed (SIGKILL) before
/// they could: `jmp` does this at start, whatever the command.
pub fn sweep_stale_dirs() {
    jumpstarter_core::leftovers::sweep_in(&private_base(), SHELL_DIR_KIND);
}
