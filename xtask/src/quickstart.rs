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
const EXPORT: &str = "export:
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

    /// Runs `jmp ARGS`, echoing the command and its output; fails on a non-zero exit.
    fn jmp(&self, args: &[&str]) -> Result<String> {
        println!("$ jmp {}", args.join(" "));
        let mut cmd = self.command("jmp");
        cmd.args(args);
        let out = run_cmd(cmd, Duration::from_secs(120))?;
        print!("{}", out.stdout);
        eprint!("{}", out.stderr);
        if out.code != 0 {
            bail!("jmp {} exited with {}", args.join(" "), out.code);
        }
        Ok(out.stdout)
    }
}

/// Runs the quickstart.
pub fn run(_args: &[String]) -> Result<()> {
    println!("== building jumpstarter-controller, jmp and j");
    crate::cargo(&[
        "build",
        "--quiet",
        "-p",
        "jumpstarter-controller",
        "-p",
        "jumpstarter-cli",
        "--bins",
    ])?;
    let lab = Lab {
        bin: crate::target_dir().join("debug"),
        home: home(),
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

    println!("$ jumpstarter-controller   (data dir, loopback ports and admin config of this lab)");
    let mut controller = lab.command("jumpstarter-controller");
    controller
        .arg("--data-dir")
        .arg(lab.home.join("data"))
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "off"])
        .arg("--admin-config")
        .arg(lab.admin_config());
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
    add_drivers(&exporter_config)?;
    println!("(added mock power and storage to {exporter_config_str})");

    println!("$ jmp run --exporter-config {exporter_config_str} &");
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
            "$ jmp {}   (try `j power on`, `j power read`, `j storage --help`; `exit` ends it)",
            shell_args.join(" ")
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
    Ok(())
}

/// Replaces the empty `export:` of a config written by `jmp admin create exporter`.
fn add_drivers(path: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = String::new();
    let mut replaced = false;
    for line in text.lines() {
        if line.trim_end() == "export: {}" || line.trim_end() == "export:" {
            out.push_str(EXPORT);
            replaced = true;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !replaced {
        out.push_str(EXPORT);
    }
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
