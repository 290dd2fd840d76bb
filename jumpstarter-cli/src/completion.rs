//! Shell completion of `jmp`, names included, as kubectl completes them.
//!
//! `jmp completion bash|zsh|fish` prints a script that asks `jmp` itself for completions:
//! the shell runs `JMP_COMPLETE=SHELL jmp -- WORDS...` (clap_complete's dynamic engine) and
//! `jmp` answers with the subcommands, flags and values that fit. Values of name arguments
//! come from here:
//!
//! - client aliases (`--client`, `describe client`, `config client use|delete`) and
//!   exporter config aliases (`--exporter`, `config exporter edit|delete`) from the local
//!   config directories;
//! - exporter names (`describe exporter`, `shell -n`, `create lease -n`) and the caller's
//!   active lease names (`describe|update|delete lease`, `shell --lease`) from the
//!   controller of the client config the command line names (`--client`,
//!   `--client-config`) or the current one, when it answers within [`CONTROLLER_TIMEOUT`];
//!   otherwise none, without a message (a shell completion must not print errors).

use std::{ffi::OsString, path::PathBuf, time::Duration};

use clap_complete::engine::{ArgValueCandidates, CompletionCandidate};
use jumpstarter_core::{
    client::{ControllerClient, ExporterQuery, LeaseQuery},
    config::{ClientConfig, SYSTEM_EXPORTER_DIR, config_dir},
};

/// The environment variable that switches `jmp` into answering completions (its value
/// names the shell). Not `COMPLETE` (clap's default), which a user may have set for
/// something else, nor upstream's `_JMP_COMPLETE` (click's protocol, which upstream's own
/// scripts still speak).
pub const COMPLETE_VAR: &str = "JMP_COMPLETE";

/// How long completion waits for the controller before offering only local names.
pub const CONTROLLER_TIMEOUT: Duration = Duration::from_secs(1);

/// Shells `jmp completion` writes scripts for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionShell {
    /// GNU bash.
    Bash,
    /// Z shell.
    Zsh,
    /// fish.
    Fish,
}

/// Answers a completion request when [`COMPLETE_VAR`] is set (and exits); returns otherwise.
/// Call it first in `main`, with the factory of the command being completed.
pub fn answer_if_asked<F: Fn() -> clap::Command>(factory: F) {
    clap_complete::CompleteEnv::with_factory(factory)
        .var(COMPLETE_VAR)
        .complete();
}

/// The script for `shell` that completes `bin` (the command name the user types) by
/// running `program` (how to start this binary: its name on `PATH`, or an absolute path).
pub fn script(shell: CompletionShell, bin: &str, program: &str) -> std::io::Result<Vec<u8>> {
    use clap_complete::env::EnvCompleter;
    let mut buf = Vec::new();
    let completer: &dyn EnvCompleter = match shell {
        CompletionShell::Bash => &clap_complete::env::Bash,
        CompletionShell::Zsh => &clap_complete::env::Zsh,
        CompletionShell::Fish => &clap_complete::env::Fish,
    };
    completer.write_registration(COMPLETE_VAR, bin, bin, program, &mut buf)?;
    Ok(buf)
}

/// How the script should start this binary: `argv[0]` when it is a bare name (found on
/// `PATH`, as the user typed it), else made absolute so the script works from any directory.
pub fn program_path() -> String {
    let argv0 = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("jmp"));
    if argv0.components().count() > 1 {
        std::path::absolute(&argv0)
            .unwrap_or(argv0)
            .to_string_lossy()
            .into_owned()
    } else {
        argv0.to_string_lossy().into_owned()
    }
}

// ---------------------------------------------------------------------------------------
// Completers, attached to arguments with `#[arg(add = ...)]`

/// Completes client config aliases.
pub fn client_aliases() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        ClientConfig::aliases()
            .into_iter()
            .map(CompletionCandidate::new)
            .collect::<Vec<_>>()
    })
}

/// Completes exporter config aliases (the user directory, then `/etc/jumpstarter/exporters`).
pub fn exporter_aliases() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        let mut names = yaml_stems(&config_dir().join("exporters"));
        names.extend(yaml_stems(std::path::Path::new(SYSTEM_EXPORTER_DIR)));
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(CompletionCandidate::new)
            .collect::<Vec<_>>()
    })
}

/// Completes exporter names from the controller (help: status and labels).
pub fn exporter_names() -> ArgValueCandidates {
    ArgValueCandidates::new(|| from_controller(Names::Exporters))
}

/// Completes the caller's active lease names from the controller (help: the exporter).
pub fn lease_names() -> ArgValueCandidates {
    ArgValueCandidates::new(|| from_controller(Names::Leases))
}

/// The base names of `*.yaml` files in `dir` (none when it is missing).
fn yaml_stems(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".yaml")
                .filter(|n| !n.is_empty())
                .map(str::to_string)
        })
        .collect()
}

/// The client config a command line names: `--client-config PATH` / `--client ALIAS`
/// (also `--flag=value`), looked for among the words after `--` of a completion request.
fn client_from_words(words: &[OsString]) -> (Option<PathBuf>, Option<String>) {
    let words: Vec<String> = words
        .iter()
        .skip_while(|w| *w != "--")
        .skip(1)
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    let (mut path, mut alias) = (None, None);
    let mut i = 0;
    while i < words.len() {
        let w = &words[i];
        let next = words.get(i + 1).filter(|v| !v.is_empty()).cloned();
        if let Some(v) = w.strip_prefix("--client-config=") {
            path = Some(PathBuf::from(v));
        } else if let Some(v) = w.strip_prefix("--client=") {
            alias = Some(v.to_string());
        } else if w == "--client-config" {
            path = next.map(PathBuf::from);
            i += 1;
        } else if w == "--client" {
            alias = next;
            i += 1;
        }
        i += 1;
    }
    (path, alias)
}

#[derive(Clone, Copy)]
enum Names {
    Exporters,
    Leases,
}

/// Names from the controller of the command line's client config, or none when there is
/// no usable config or the controller does not answer in time.
fn from_controller(what: Names) -> Vec<CompletionCandidate> {
    let words: Vec<OsString> = std::env::args_os().collect();
    let (path, alias) = client_from_words(&words);
    let Ok(cfg) = ClientConfig::resolve(path.as_deref(), alias.as_deref()) else {
        return Vec::new();
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Vec::new();
    };
    rt.block_on(async {
        tokio::time::timeout(CONTROLLER_TIMEOUT, query(&cfg, what))
            .await
            .ok()
            .flatten()
            .unwrap_or_default()
    })
}

/// One page of names is plenty for a completion (a shell lists at most a screenful).
const PAGE: i32 = 500;

async fn query(cfg: &ClientConfig, what: Names) -> Option<Vec<CompletionCandidate>> {
    let api = ControllerClient::connect(cfg).await.ok()?;
    let short = |n: &str| n.rsplit('/').next().unwrap_or(n).to_string();
    let mut out = match what {
        Names::Exporters => api
            .list_exporters_page(
                &ExporterQuery {
                    page_size: PAGE,
                    ..ExporterQuery::default()
                },
                None,
            )
            .await
            .ok()?
            .items
            .into_iter()
            .map(|e| {
                let labels: Vec<String> =
                    e.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let mut labels = labels;
                labels.sort();
                CompletionCandidate::new(short(&e.name)).help(Some(labels.join(",").into()))
            })
            .collect::<Vec<_>>(),
        Names::Leases => api
            .list_leases_page(
                &LeaseQuery {
                    page_size: PAGE,
                    ..LeaseQuery::default()
                },
                None,
            )
            .await
            .ok()?
            .items
            .into_iter()
            // The leases the caller may describe, update and delete: its own and those shared with it.
            .filter(|l| api.may_use(l))
            .map(|l| {
                let exporter = l.exporter.as_deref().map(short).unwrap_or_default();
                let help = if exporter.is_empty() {
                    format!("waiting: {}", l.selector)
                } else {
                    format!("on {exporter}")
                };
                CompletionCandidate::new(short(&l.name)).help(Some(help.into()))
            })
            .collect::<Vec<_>>(),
    };
    out.sort_by(|a, b| a.get_value().cmp(b.get_value()));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<OsString> {
        w.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_client_is_read_from_the_completed_command_line() {
        let (p, a) = client_from_words(&words(&[
            "jmp", "--", "jmp", "get", "leases", "--client", "lab", "",
        ]));
        assert_eq!((p, a.as_deref()), (None, Some("lab")));
        let (p, a) = client_from_words(&words(&[
            "jmp",
            "--",
            "jmp",
            "describe",
            "exporter",
            "--client-config=/x/c.yaml",
            "",
        ]));
        assert_eq!((p, a), (Some(PathBuf::from("/x/c.yaml")), None));
        // The words before `--` are the completer's own; a flag still being typed names
        // nothing.
        let (p, a) = client_from_words(&words(&["jmp", "--client", "x", "--", "jmp", "--client"]));
        assert_eq!((p, a), (None, None));
        let (p, a) = client_from_words(&words(&["jmp", "--", "jmp", "--client", ""]));
        assert_eq!((p, a), (None, None));
    }

    #[test]
    fn scripts_call_this_binary_with_the_completion_variable() {
        for shell in [
            CompletionShell::Bash,
            CompletionShell::Zsh,
            CompletionShell::Fish,
        ] {
            let s = String::from_utf8(script(shell, "jmp", "/opt/bin/jmp").unwrap()).unwrap();
            assert!(s.contains(COMPLETE_VAR), "{shell:?}: {s}");
            assert!(s.contains("/opt/bin/jmp"), "{shell:?}: {s}");
        }
    }
}
