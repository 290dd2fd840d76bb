//! `cargo xtask quickstart`: the whole lab on one machine, as a newcomer would run it.
//!
//! Builds the binaries, starts a controller (embedded store, in-process router) with its
//! data under `target/quickstart/`, creates an exporter with mock power and storage and a
//! client through `jmp admin`, runs the exporter, lists it, and opens `jmp shell` on it
//! (interactive on a terminal; otherwise it runs a few `j` commands). Everything it started
//! is stopped at the end. Each step prints the command it runs, so the same can be done by
//! hand (see docs/quickstart.md).

use std::{
    io::IsTerminal,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::procs::{Background, run as run_cmd, wait_path};

/// The drivers the quickstart exporter serves.
pub const EXPORT: &str = "export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
  storage:
    type: jumpstarter_driver_opendal.driver.MockStorageMux
";

/// Where the quickstart keeps its data and configs.
fn home() -> PathBuf {
    crate::target_dir().join("quickstart")
}

struct Lab {
    bin: PathBuf,
    home: PathBuf,
}

impl Lab {
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.bin.clone()];
        paths.extend(std::env::split_paths(&path));
        cmd.env("PATH", std::env::join_paths(paths).unwrap_or(path))
            .env("JMP_CLIENT_CONFIG_HOME", self.home.join("config"))
            .env("JMP_ADMIN_CONFIG", self.admin_config())
            .env_remove("JMP_NAME")
            .env_remove("JUMPSTARTER_HOST");
        cmd
    }

    fn admin_config(&self) -> PathBuf {
        self.home.join("config").join("admin.yaml")
    }

    /// Runs `jmp ARGS` after echoing it as a person would type it; its stdout and stderr go
    /// straight to ours, so they stay in order. Fails on a non-zero exit.
    fn jmp(&self, args: &[&str]) -> Result<()> {
        println!("$ {}", command_line("jmp", args));
        let mut cmd = self.command("jmp");
        cmd.args(args);
        let code = run_inherited(cmd, Duration::from_secs(120))?;
        if code != 0 {
            bail!("{} exited with {code}", command_line("jmp", args));
        }
        Ok(())
    }
}

/// `PROGRAM ARGS...` with each word shell-quoted, ready to paste.
fn command_line(program: &str, args: &[&str]) -> String {
    std::iter::once(program)
        .chain(args.iter().copied())
        .map(shell_quote)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `word` as a POSIX shell reads it back: as is when it has only safe characters, else in
/// single quotes (a `'` inside as `'\''`).
fn shell_quote(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// Runs `cmd` with our stdout and stderr (so what it prints keeps its order); kills it
/// after `timeout`. Returns its exit code (-1 when killed by a signal).
fn run_inherited(mut cmd: Command, timeout: Duration) -> Result<i32> {
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status.code().unwrap_or(-1));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{cmd:?} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A path as short as it can be written from the current directory.
fn shown(path: &Path) -> String {
    let cwd = std::env::current_dir().unwrap_or_default();
    path.strip_prefix(&cwd)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

/// What to try after the quickstart: three commands, ready to paste.
fn next_steps(bin: &str, exporter_config: &str) -> String {
    let jmp = format!("{bin}/jmp");
    let local = command_line(
        &jmp,
        &[
            "shell",
            "--exporter-config",
            exporter_config,
            "--",
            "j",
            "power",
            "cycle",
        ],
    );
    let interactive = command_line(&jmp, &["shell", "--exporter-config", exporter_config]);
    let controller = command_line(&format!("{bin}/jumpstarter-controller"), &["--help"]);
    format!(
        "== next, try (the lab above is stopped; these need no controller):\n\
         {local}\n    # local mode: the same mock board inside jmp, one command\n\
         {interactive}\n    # an interactive shell on it; `j --help` lists its drivers\n\
         {controller}\n    # then docs/quickstart.md, step 5, runs the whole lab by hand\n"
    )
}

/// Runs the quickstart: builds the controller, `jmp` and `j` (only those: a newcomer's first
/// build), then walks through the lab.
pub fn run(_args: &[String]) -> Result<()> {
    println!(
        "== building jumpstarter-controller, jmp and j (a first build compiles about 450 \
         crates: 10-15 minutes on 2 cores; later runs take seconds)"
    );
    crate::cargo(&[
        "build",
        "-p",
        "jumpstarter-controller",
        "-p",
        "jumpstarter-cli",
        "--bins",
    ])?;
    walkthrough(&crate::target_dir().join("debug"), &home(), &[], &[])
}

/// The quickstart with the binaries of `bin` and its lab in `home`, the controller started
/// with `controller_extra` arguments and `controller_env` (e.g. `--store kubernetes` and a
/// `KUBECONFIG`).
pub fn walkthrough(
    bin: &Path,
    home: &Path,
    controller_extra: &[&str],
    controller_env: &[(&str, &str)],
) -> Result<()> {
    let lab = Lab {
        bin: bin.to_path_buf(),
        home: home.to_path_buf(),
    };
    if lab.home.exists() {
        std::fs::remove_dir_all(&lab.home)
            .with_context(|| format!("cannot clear {}", lab.home.display()))?;
    }
    std::fs::create_dir_all(&lab.home)?;
    println!(
        "== the lab lives in {} (configs in {}/config)",
        lab.home.display(),
        lab.home.display()
    );

    let data = lab.home.join("data").to_string_lossy().into_owned();
    let admin = lab.admin_config().to_string_lossy().into_owned();
    let controller_args = [
        "--data-dir",
        data.as_str(),
        "--listen",
        "127.0.0.1:0",
        "--router-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "off",
        "--admin-config",
        admin.as_str(),
    ];
    let shown_args: Vec<&str> = controller_args
        .iter()
        .chain(controller_extra)
        .copied()
        .collect();
    println!(
        "$ {} &",
        command_line("jumpstarter-controller", &shown_args)
    );
    let mut controller = lab.command("jumpstarter-controller");
    controller
        .args(controller_args)
        .args(controller_extra)
        .envs(controller_env.iter().copied());
    let _controller = Background::start("jumpstarter-controller", controller)?;
    wait_path(&lab.admin_config(), Duration::from_secs(60))
        .context("the controller did not write its admin config")?;

    let exporter_config = lab.home.join("exporter.yaml");
    let exporter_config_str = exporter_config.to_string_lossy().into_owned();
    lab.jmp(&[
        "admin",
        "create",
        "exporter",
        "quickstart",
        "--label",
        "board=mock",
        "--out",
        &exporter_config_str,
    ])?;
    fill_export(&exporter_config, EXPORT)?;
    println!("(added mock power and storage to {exporter_config_str})");

    println!(
        "$ {} &",
        command_line("jmp", &["run", "--exporter-config", &exporter_config_str])
    );
    let mut run = lab.command("jmp");
    run.args(["run", "--exporter-config", &exporter_config_str]);
    let mut exporter = Background::start("jmp run", run)?;

    lab.jmp(&[
        "admin",
        "create",
        "client",
        "quickstart",
        "--save",
        "--unsafe",
    ])?;
    wait_online(&lab, &mut exporter)?;
    lab.jmp(&["get", "exporters"])?;

    let shell_args = [
        "shell",
        "--client",
        "quickstart",
        "--selector",
        "board=mock",
    ];
    if std::io::stdin().is_terminal() && std::io::stdout().is_terminal() {
        println!(
            "$ {}   # try `j power on`, `j power read`, `j storage --help`; `exit` ends it",
            command_line("jmp", &shell_args)
        );
        let status = lab.command("jmp").args(shell_args).status()?;
        if !status.success() {
            bail!("jmp shell exited with {status}");
        }
    } else {
        let script = "j power on && j power read && j storage dut && j power off";
        let mut args: Vec<&str> = shell_args.to_vec();
        args.extend(["--", "sh", "-c", script]);
        lab.jmp(&args)?;
    }
    println!("== done; stopping the exporter and the controller");
    print!("{}", next_steps(&shown(&lab.bin), &shown(&exporter_config)));
    Ok(())
}

/// Replaces the empty `export:` of a config written by `jmp admin create exporter` with
/// `export` (the `export:` key and its drivers), as a person following docs/quickstart.md
/// would: the drivers go right under it.
pub fn fill_export(path: &Path, export: &str) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let Some(i) = text.find("\nexport:\n") else {
        bail!("{} has no empty `export:` to fill:\n{text}", path.display());
    };
    let out = format!(
        "{}\n{export}{}",
        &text[..i],
        &text[i + "\nexport:\n".len()..]
    );
    std::fs::write(path, out).with_context(|| format!("cannot write {}", path.display()))
}

/// Waits until the controller reports the exporter online.
fn wait_online(lab: &Lab, exporter: &mut Background) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut cmd = lab.command("jmp");
        cmd.args(["get", "exporters", "--with", "online", "-o", "json"]);
        let out = run_cmd(cmd, Duration::from_secs(30))?;
        if out.code == 0 && out.stdout.contains("\"online\": true") {
            return Ok(());
        }
        if Instant::now() > deadline {
            let said: Vec<String> = exporter.lines.try_iter().collect();
            bail!(
                "the exporter did not come online within 60 s; it printed:\n{}\njmp get said: {}{}",
                said.join("\n"),
                out.stdout,
                out.stderr
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_printed_as_a_person_types_them() {
        assert_eq!(
            command_line(
                "jmp",
                &[
                    "shell",
                    "-l",
                    "board=mock",
                    "--",
                    "sh",
                    "-c",
                    "j power on && j power read"
                ]
            ),
            "jmp shell -l board=mock -- sh -c 'j power on && j power read'"
        );
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote("/a b/c"), "'/a b/c'");
        assert_eq!(
            shell_quote("target/quickstart/x.yaml"),
            "target/quickstart/x.yaml"
        );
    }

    #[test]
    fn the_quickstart_ends_with_three_commands_to_try() {
        insta::assert_snapshot!(
            next_steps("target/debug", "target/quickstart/exporter.yaml"),
            @r"
        == next, try (the lab above is stopped; these need no controller):
        target/debug/jmp shell --exporter-config target/quickstart/exporter.yaml -- j power cycle
            # local mode: the same mock board inside jmp, one command
        target/debug/jmp shell --exporter-config target/quickstart/exporter.yaml
            # an interactive shell on it; `j --help` lists its drivers
        target/debug/jumpstarter-controller --help
            # then docs/quickstart.md, step 5, runs the whole lab by hand
        "
        );
    }
}
