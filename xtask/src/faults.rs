//! `cargo xtask faults`: the fault-injection suite (issue 22).
//!
//! Starts a lab of real binaries on loopback — a controller (SQLite store) that hands out a
//! standalone `jumpstarter-router`, three exporters (`jmp run`: mock power and a mock storage
//! mux backed by a file in the exporter's own storage directory, except the second, whose
//! medium is the mux's temporary file; the first runs `beforeLease`/`afterLease` shell
//! hooks, the last also serves the direct path) and a board exporter (a QEMU board that is
//! flashed, into its private directory, but never powered on) — and runs a scripted lab day
//! in rounds: clients (`jmp shell -l SELECTOR -- sh -c 'j power on && j storage flash IMAGE
//! && j power off'`) lease exporters by selector, more of them than there are exporters, and
//! one flashes a 256 MiB disk image to the board (`j board flasher flash`), while one process
//! of one kind is killed with SIGKILL and, for a server, started again: at a seeded random
//! moment the controller, the router, an exporter or a client; the board exporter once a
//! flash has written a seeded amount of its partial file; the controller, away for 30 s,
//! while a hook of the first exporter runs (seen from the lines the hook prints in its log;
//! the suite holds the hook at a gate file until a seeded moment of the outage).
//!
//! After each round it checks, and counts every violation as a loss:
//! - every client ended by itself (an exit code, success or error) within a bound; one that
//!   exited 0 ran all its commands;
//! - every server is still running (none exited on its own) and every exporter is online;
//! - once the leases' time is up, no lease is active (each client lists its own) and no
//!   exporter is held by a lease;
//! - no lease a client was handed is missing from the controller, or names another
//!   exporter; no two leases held the same exporter at the same time (from the leases'
//!   effective begin and end times);
//! - no stray process: every process started by the suite (found by a marker in its
//!   environment, so orphans and other process groups count too) is one of the servers;
//! - no temporary or partial file in an exporter's storage directory or `TMPDIR` but the
//!   running exporter's own (named after its PID: its temporary medium, a running hook's
//!   socket directory, its board's directory, which holds no partial image), and none at all
//!   in the clients' `TMPDIR` (a killed `jmp shell`'s socket directory is removed by the next
//!   `jmp`); a killed board exporter's directory is gone once it is started again.
//!   `XDG_RUNTIME_DIR` is unset, so every socket directory goes to a `TMPDIR` the suite
//!   checks (reached through a short link in `/tmp`, so a socket's path fits);
//! - every lease of the first exporter could run its hooks.
//!
//! `--seed N` replays a run (the seed is printed first), `--rounds N` sets its length,
//! `--quick` is the bounded run `cargo xtask ci` does (one round per kind of process).

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsString,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail, ensure};

/// The environment variable every process of the suite carries (inherited by whatever
/// they start), with a value unique to the run.
const MARKER: &str = "JMP_FAULTS_RUN";
/// Exporters with mock drivers in the lab (the board exporter comes after them).
const EXPORTERS: usize = 3;
/// The board exporter's name, and its label `board=` (the mock exporters' is `fault`).
const BOARD: &str = "fault-board";
/// Size of the disk image each board operation flashes: a sparse file of zeros (the
/// exporter writes every byte), big enough that a kill lands mid-flash.
const BOARD_IMAGE_BYTES: u64 = 256 * 1024 * 1024;
/// The kind of the QEMU board's private directory, `jumpstarter-qemu-PID-RANDOM` in the
/// board exporter's `TMPDIR`, where a flash writes a partial file (`.root.partial-RANDOM`)
/// and renames it over `root` once complete.
const BOARD_DIR_KIND: &str = "jumpstarter-qemu";
/// How long the controller is away in a [`Kind::HookController`] round.
const HOOK_AWAY: Duration = Duration::from_secs(30);
/// Clients (each its own client object and config).
const CLIENTS: usize = 4;
/// Lease duration of each client operation.
const LEASE_SECS: u64 = 20;
/// Size of the image each operation flashes.
const IMAGE_BYTES: usize = 3 * 1024 * 1024;
/// An operation that has not ended by itself after this long counts as hung.
const OP_LIMIT: Duration = Duration::from_secs(150);
/// How long a server may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a check waits for the lab to settle (exporters online, leases ended, strays
/// gone): the lease duration, a pending lease's client timeout and slack.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(LEASE_SECS + 70);

/// What a round kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Controller,
    Router,
    Exporter,
    Client,
    /// The board exporter, while a flash writes its disk image.
    BoardFlash,
    /// The controller, for [`HOOK_AWAY`], while a hook of the first exporter runs.
    HookController,
}

const KINDS: [Kind; 6] = [
    Kind::Controller,
    Kind::Router,
    Kind::Exporter,
    Kind::Client,
    Kind::BoardFlash,
    Kind::HookController,
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Controller => "controller",
            Kind::Router => "router",
            Kind::Exporter => "exporter",
            Kind::Client => "client",
            Kind::BoardFlash => "board exporter mid-flash",
            Kind::HookController => "controller during a hook",
        }
    }
}

/// Command-line options.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Options {
    seed: u64,
    rounds: usize,
    quick: bool,
    release: bool,
}

fn parse_args(args: &[String], default_seed: u64) -> Result<Options> {
    let mut o = Options {
        seed: default_seed,
        rounds: 12,
        quick: false,
        release: false,
    };
    let mut rounds = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seed" => {
                let v = it.next().context("--seed needs a number")?;
                o.seed = v
                    .parse()
                    .with_context(|| format!("--seed {v:?}: not an unsigned number"))?;
            }
            "--rounds" => {
                let v = it.next().context("--rounds needs a number")?;
                let n: usize = v
                    .parse()
                    .with_context(|| format!("--rounds {v:?}: not an unsigned number"))?;
                ensure!(n > 0, "--rounds must be at least 1");
                rounds = Some(n);
            }
            "--quick" => o.quick = true,
            "--release" => o.release = true,
            other => bail!(
                "cargo xtask faults: unknown argument {other:?} (use --seed N, --rounds N, \
                 --quick, --release)"
            ),
        }
    }
    o.rounds = rounds.unwrap_or(if o.quick { KINDS.len() } else { 12 });
    Ok(o)
}

/// A small seeded generator (SplitMix64): the same seed replays the same choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A duration in `lo..hi` milliseconds.
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo).max(1)))
    }
}

/// A server of the lab: started again after it is killed, with its output in a new log
/// file each time.
struct Service {
    name: String,
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(String, OsString)>,
    /// The line (part) it prints once ready.
    ready: &'static str,
    logs: PathBuf,
    starts: usize,
    child: Option<Child>,
    log: PathBuf,
}

impl Service {
    fn start(&mut self, lab: &Lab) -> Result<()> {
        self.starts += 1;
        self.log = self.logs.join(format!("{}.{}.log", self.name, self.starts));
        let file = fs::File::create(&self.log)
            .with_context(|| format!("cannot create {}", self.log.display()))?;
        let mut cmd = lab.command(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        self.child = Some(
            cmd.spawn()
                .with_context(|| format!("starting {}", self.name))?,
        );
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let text = fs::read_to_string(&self.log).unwrap_or_default();
            if text.contains(self.ready) {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                bail!(
                    "{} exited ({status}) before it was ready; {}:\n{text}",
                    self.name,
                    self.log.display()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not print {:?} within {READY_TIMEOUT:?}; {}:\n{text}",
                    self.name,
                    self.ready,
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Some(status)` when it has exited on its own.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL, and reap it.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM; SIGKILL after 10 s.
    fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        if matches!(c.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
        }
        let _ = c.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One exporter of the lab.
struct ExporterSlot {
    name: String,
    svc: Service,
    storage: PathBuf,
    tmp: PathBuf,
    /// The board exporter (a QEMU board, flashed but never powered on).
    board: bool,
    /// The log read by the last check, and how far.
    log_seen: (PathBuf, usize),
}

impl ExporterSlot {
    /// The running exporter's board directory (`jumpstarter-qemu-PID-RANDOM` in its
    /// `TMPDIR`), when it has one.
    fn board_dir(&self) -> Option<PathBuf> {
        if !self.board {
            return None;
        }
        let pid = self.svc.pid()?;
        entries(&self.tmp)
            .ok()?
            .into_iter()
            .find(|f| temp_owner(f, &[BOARD_DIR_KIND]) == Some(pid))
            .map(|f| self.tmp.join(f))
    }
}

/// How the short links to labs' directories are named in `/tmp`: `jmp-faults-PID`.
const LINK_PREFIX: &str = "jmp-faults-";

/// A short path to the lab's directory (`/tmp/jmp-faults-PID`, a symbolic link) through
/// which exporters and clients get their `TMPDIR`: the socket a hook's or `jmp shell`'s `j`
/// reaches, `TMPDIR/jumpstarter-hook-PID-RANDOM/exporter@socket`, must fit in a Unix socket
/// address (at most 107 bytes), which it does not in a lab under a long target directory
/// (the exporter then runs no hook: `cannot serve the hook socket`). Removed when dropped.
struct ShortLink(Option<PathBuf>);

impl ShortLink {
    /// A link to `dir`, after removing the links of runs that were killed; none (the
    /// directory itself is used) when `/tmp` takes no link.
    fn new(dir: &Path) -> Self {
        let base = Path::new("/tmp");
        for f in entries(base).unwrap_or_default() {
            let Some(pid) = f
                .strip_prefix(LINK_PREFIX)
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let path = base.join(&f);
            if !Path::new(&format!("/proc/{pid}")).exists()
                && fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink())
            {
                let _ = fs::remove_file(&path);
            }
        }
        let link = base.join(format!("{LINK_PREFIX}{}", std::process::id()));
        if fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()) {
            let _ = fs::remove_file(&link);
        }
        match std::os::unix::fs::symlink(dir, &link) {
            Ok(()) => Self(Some(link)),
            Err(e) => {
                println!(
                    "cannot link {} to {} ({e}): TMPDIRs are under {0}",
                    dir.display(),
                    link.display()
                );
                Self(None)
            }
        }
    }

    /// `dir` (the lab's directory) through the link.
    fn path(&self, dir: &Path) -> PathBuf {
        self.0.clone().unwrap_or_else(|| dir.to_path_buf())
    }
}

impl Drop for ShortLink {
    fn drop(&mut self) {
        if let Some(link) = &self.0 {
            let _ = fs::remove_file(link);
        }
    }
}

/// The lab: its servers, configs and files.
struct Lab {
    bin: PathBuf,
    dir: PathBuf,
    tag: String,
    controller: Service,
    router: Service,
    exporters: Vec<ExporterSlot>,
    clients: Vec<PathBuf>,
    auditor: PathBuf,
    image: PathBuf,
    board_image: PathBuf,
    /// Dropped after the servers, which are stopped when dropped.
    short: ShortLink,
}

impl Lab {
    /// A command for one of our binaries (or any program) with the lab's environment: our
    /// binaries first on `PATH`, configs under the lab, the run's marker.
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.bin.clone()];
        paths.extend(std::env::split_paths(&path));
        cmd.env("PATH", std::env::join_paths(paths).unwrap_or(path))
            .env("JMP_CLIENT_CONFIG_HOME", self.dir.join("config"))
            .env(
                "JMP_ADMIN_CONFIG",
                self.dir.join("config").join("admin.yaml"),
            )
            .env("HOME", self.dir.join("home"))
            .env("TMPDIR", self.short.path(&self.dir).join("tmp"))
            .env_remove("XDG_RUNTIME_DIR")
            .env(MARKER, &self.tag)
            .env_remove("JMP_NAME")
            .env_remove("JMP_LEASE")
            .env_remove("JMP_CLIENT_CONFIG")
            .env_remove("JUMPSTARTER_HOST");
        cmd
    }

    fn jmp(&self) -> Command {
        self.command(&self.bin.join("jmp"))
    }

    /// Runs `jmp ARGS` to completion; its output, or an error naming it.
    fn jmp_ok(&self, args: &[&str]) -> Result<String> {
        let mut cmd = self.jmp();
        cmd.args(args);
        let out = crate::procs::run(cmd, Duration::from_secs(60))?;
        ensure!(
            out.code == 0,
            "jmp {} exited with {}:\n{}{}",
            args.join(" "),
            out.code,
            out.stdout,
            out.stderr
        );
        Ok(out.stdout)
    }

    /// `jmp` as the auditor client, JSON output parsed.
    fn audit(&self, args: &[&str]) -> Result<serde_json::Value> {
        let auditor = self.auditor.to_string_lossy().into_owned();
        let mut all = args.to_vec();
        all.extend(["--client-config", &auditor, "-o", "json"]);
        let text = self.jmp_ok(&all)?;
        serde_json::from_str(&text)
            .with_context(|| format!("jmp {} printed no JSON: {text}", args.join(" ")))
    }

    /// The leases of every client (a client lists only its own), ended ones too with
    /// `ended`.
    fn leases(&self, ended: bool) -> Result<Vec<serde_json::Value>> {
        let mut out = Vec::new();
        for client in self.clients.iter().chain([&self.auditor]) {
            let client = client.to_string_lossy().into_owned();
            let mut args = vec!["get", "leases", "--client-config", &client, "-o", "json"];
            if ended {
                args.push("-a");
            }
            let text = self.jmp_ok(&args)?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("jmp get leases printed no JSON: {text}"))?;
            out.extend(v["leases"].as_array().cloned().unwrap_or_default());
        }
        Ok(out)
    }

    fn services_mut(&mut self) -> impl Iterator<Item = &mut Service> {
        [&mut self.controller, &mut self.router]
            .into_iter()
            .chain(self.exporters.iter_mut().map(|e| &mut e.svc))
    }

    fn service_pids(&self) -> BTreeSet<u32> {
        [&self.controller, &self.router]
            .into_iter()
            .chain(self.exporters.iter().map(|e| &e.svc))
            .filter_map(Service::pid)
            .collect()
    }
}

/// The drivers every exporter serves: the storage mux's medium is `medium.img` in its
/// storage directory `storage`, or (without one) the mux's own temporary file.
fn export_section(storage: Option<&Path>) -> String {
    let power = "export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
  storage:
    type: jumpstarter_driver_opendal.driver.MockStorageMux
";
    match storage {
        Some(dir) => format!(
            "{power}    config:\n      file: {}\n",
            dir.join("medium.img").display()
        ),
        None => power.to_string(),
    }
}

/// The kinds of temporary files and directories a running exporter keeps in its `TMPDIR`,
/// named `KIND-PID-RANDOM` after it: a temporary medium, a hook's socket directory, the
/// board's directory.
const EXPORTER_TEMP_KINDS: [&str; 3] = ["jmp-storage-mux", "jumpstarter-hook", BOARD_DIR_KIND];

/// The drivers of the board exporter: a QEMU board, which is flashed (into its directory)
/// but never powered on, so no QEMU runs.
const BOARD_EXPORT: &str = "export:
  board:
    type: jumpstarter_driver_qemu.driver.Qemu
    config:
      mem: 256M
";

/// The PID in `name` when it is `KIND-PID-RANDOM` of one of `kinds`.
fn temp_owner(name: &str, kinds: &[&str]) -> Option<u32> {
    kinds.iter().find_map(|kind| {
        let rest = name.strip_prefix(kind)?.strip_prefix('-')?;
        let (pid, tail) = rest.split_once('-')?;
        if tail.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        pid.parse().ok()
    })
}

/// The hooks of the first exporter: `j power on` before a lease, `j power off` after it.
/// Each prints [`HOOK_BEGIN`] first and [`HOOK_END`] last (the exporter logs them as
/// `[beforeLease] faults-hook-begin` ...), so the suite sees from the log when one runs, and
/// waits (20 s at most) while the suite holds its gate, the file `GATES/beforeLease` or
/// `GATES/afterLease`, so that the suite can keep one running. The hook's exit status is
/// its `j`'s.
fn hooks(gates: &Path) -> String {
    let hook = |name: &str, call: &str| {
        format!(
            "  {name}:
    script: |
      echo {HOOK_BEGIN}
      i=0
      while [ -e '{gate}' ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
      {call}
      rc=$?
      echo {HOOK_END}
      exit $rc
    timeout: 30
    onFailure: warn
",
            gate = gates.join(name).display()
        )
    };
    format!(
        "hooks:\n{}{}",
        hook("beforeLease", "j power on"),
        hook("afterLease", "j power off")
    )
}
/// The line a hook of [`hooks`] prints first.
const HOOK_BEGIN: &str = "faults-hook-begin";
/// The line a hook of [`hooks`] prints last.
const HOOK_END: &str = "faults-hook-end";

/// Sets the lab up: builds nothing (the caller did), writes configs, starts the servers.
fn start_lab(bin: PathBuf, dir: PathBuf, tag: String, rng: &mut Rng) -> Result<Lab> {
    for sub in ["config", "gates", "home", "logs", "ops", "tmp"] {
        fs::create_dir_all(dir.join(sub))?;
    }
    let grpc_port = crate::procs::free_port()?;
    let router_port = crate::procs::free_port()?;
    let data = dir.join("data");
    let routers = dir.join("routers.yaml");
    fs::write(
        &routers,
        format!("faults:\n  endpoint: 127.0.0.1:{router_port}\n"),
    )?;
    let logs = dir.join("logs");
    let image = dir.join("image.bin");
    let mut bytes = vec![0u8; IMAGE_BYTES];
    for chunk in bytes.chunks_mut(8) {
        let v = rng.next().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    fs::write(&image, bytes)?;
    let board_image = dir.join("board.img");
    fs::File::create(&board_image)?.set_len(BOARD_IMAGE_BYTES)?;

    let os = |s: &str| OsString::from(s);
    let controller = Service {
        name: "controller".into(),
        program: bin.join("jumpstarter-controller"),
        args: vec![
            os("--data-dir"),
            data.clone().into_os_string(),
            os("--listen"),
            os(&format!("127.0.0.1:{grpc_port}")),
            os("--router-listen"),
            os("127.0.0.1:0"),
            os("--metrics-listen"),
            os("off"),
            os("--advertise-host"),
            os("127.0.0.1"),
            os("--admin-config"),
            dir.join("config").join("admin.yaml").into_os_string(),
            os("--routers"),
            routers.into_os_string(),
            // A queued lease whose client was killed ends after this (not 10 minutes).
            os("--pending-lease-client-timeout"),
            os("20s"),
        ],
        env: Vec::new(),
        ready: "jumpstarter-controller ready:",
        logs: logs.clone(),
        starts: 0,
        child: None,
        log: PathBuf::new(),
    };
    let placeholder = |name: &str| Service {
        name: name.into(),
        program: PathBuf::new(),
        args: Vec::new(),
        env: Vec::new(),
        ready: "",
        logs: logs.clone(),
        starts: 0,
        child: None,
        log: PathBuf::new(),
    };
    let mut lab = Lab {
        bin: bin.clone(),
        dir: dir.clone(),
        tag,
        controller,
        router: placeholder("router"),
        exporters: Vec::new(),
        clients: Vec::new(),
        auditor: PathBuf::new(),
        image,
        board_image,
        short: ShortLink::new(&dir),
    };
    let mut controller = std::mem::replace(&mut lab.controller, placeholder("controller"));
    controller.start(&lab)?;
    lab.controller = controller;

    // The standalone router, with the controller's server certificate and router key.
    let key = fs::read_to_string(data.join("router-key")).context("reading the router key")?;
    let mut router = Service {
        name: "router".into(),
        program: bin.join("jumpstarter-router"),
        args: vec![
            os("--listen"),
            os(&format!("127.0.0.1:{router_port}")),
            os("--tls-cert"),
            data.join("server").join("tls.crt").into_os_string(),
            os("--tls-key"),
            data.join("server").join("tls.key").into_os_string(),
        ],
        env: vec![("ROUTER_KEY".into(), os(key.trim()))],
        ready: "Router listening on",
        logs: logs.clone(),
        starts: 0,
        child: None,
        log: PathBuf::new(),
    };
    router.start(&lab)?;
    lab.router = router;

    // The mock exporters, then the board exporter.
    for i in 0..=EXPORTERS {
        let board = i == EXPORTERS;
        let (name, labels) = if board {
            (
                BOARD.to_string(),
                [format!("board={BOARD}"), "slot=b0".into()],
            )
        } else {
            (
                format!("fault-e{i}"),
                ["board=fault".into(), format!("slot=e{i}")],
            )
        };
        let root = dir.join(&name);
        let (storage, tmp) = (root.join("storage"), root.join("tmp"));
        fs::create_dir_all(&storage)?;
        fs::create_dir_all(&tmp)?;
        let config = root.join("exporter.yaml");
        let config_s = config.to_string_lossy().into_owned();
        lab.jmp_ok(&[
            "admin",
            "create",
            "exporter",
            &name,
            "--nointeractive",
            "-l",
            &labels[0],
            "-l",
            &labels[1],
            "--out",
            &config_s,
        ])?;
        let text = fs::read_to_string(&config)?;
        ensure!(
            text.contains("\nexport:\n"),
            "{config_s} has no empty `export:` to fill:\n{text}"
        );
        // The second exporter's medium is the mux's temporary file (in its TMPDIR).
        let medium_dir = (i != 1).then_some(storage.as_path());
        let export = if board {
            BOARD_EXPORT.to_string()
        } else {
            export_section(medium_dir)
        };
        let mut text = text.replace("\nexport:\n", &format!("\n{export}"));
        if i == 0 {
            // `jmp admin create exporter` writes empty hooks; ours replace them.
            let hooks = hooks(&lab.gates());
            let empty = "\nhooks:\n  beforeLease: null\n  afterLease: null\n";
            text = if text.contains(empty) {
                text.replace(empty, &format!("\n{hooks}"))
            } else {
                ensure!(
                    !text.contains("\nhooks:"),
                    "{config_s} has hooks of an unknown shape:\n{text}"
                );
                text + &hooks
            };
        }
        fs::write(&config, text)?;
        let mut args = vec![os("run"), os("--exporter-config"), config.into_os_string()];
        if i == EXPORTERS - 1 {
            args.extend([os("--direct-listener"), os("127.0.0.1:0")]);
        }
        let mut svc = Service {
            name: name.clone(),
            program: bin.join("jmp"),
            args,
            // The same directory as `tmp`, by a shorter path.
            env: vec![(
                "TMPDIR".into(),
                lab.short
                    .path(&dir)
                    .join(&name)
                    .join("tmp")
                    .into_os_string(),
            )],
            ready: "registered with controller",
            logs: logs.clone(),
            starts: 0,
            child: None,
            log: PathBuf::new(),
        };
        svc.start(&lab)?;
        lab.exporters.push(ExporterSlot {
            name,
            svc,
            storage,
            tmp,
            board,
            log_seen: (PathBuf::new(), 0),
        });
    }
    for i in 0..=CLIENTS {
        let name = if i == CLIENTS {
            "fault-auditor".to_string()
        } else {
            format!("fault-c{i}")
        };
        let out = dir.join("config").join(format!("{name}.yaml"));
        let out_s = out.to_string_lossy().into_owned();
        lab.jmp_ok(&[
            "admin",
            "create",
            "client",
            &name,
            "--nointeractive",
            "--unsafe",
            "--out",
            &out_s,
        ])?;
        if i == CLIENTS {
            lab.auditor = out;
        } else {
            lab.clients.push(out);
        }
    }
    Ok(lab)
}

/// One client operation: a `jmp shell` running power and storage calls.
struct Op {
    id: usize,
    /// A flash of the board exporter.
    board: bool,
    child: Option<Child>,
    out: PathBuf,
    err: PathBuf,
    started: Instant,
    /// How long it ran, once it ended by itself.
    took: Option<Duration>,
    /// Exit code, once it ended by itself.
    code: Option<i32>,
    killed: bool,
    hung: bool,
}

/// What the suite counted.
#[derive(Debug, Default)]
struct Counts {
    faults: BTreeMap<Kind, usize>,
    operations: usize,
    succeeded: usize,
    failed: usize,
    killed: usize,
    losses: Vec<String>,
}

impl Counts {
    fn summary(&self, seed: u64, rounds: usize) -> String {
        let faults: usize = self.faults.values().sum();
        let mut by_kind = String::new();
        for k in KINDS {
            let _ = write!(
                by_kind,
                "{}{} {}",
                if by_kind.is_empty() { "" } else { ", " },
                k.name(),
                self.faults.get(&k).copied().unwrap_or(0)
            );
        }
        format!(
            "faults: seed {seed}, {rounds} rounds: {faults} faults injected ({by_kind}), \
             {} operations ({} succeeded, {} failed with an error, {} killed), {} losses",
            self.operations,
            self.succeeded,
            self.failed,
            self.killed,
            self.losses.len()
        )
    }
}

/// Starts a client operation on an exporter `selector` picks: on a mock exporter power
/// and storage calls, on the board exporter (`board`) a flash of its disk image.
fn start_op(lab: &Lab, id: usize, client: &Path, selector: &str, board: bool) -> Result<Op> {
    let out = lab.dir.join("ops").join(format!("op{id}.out"));
    let err = lab.dir.join("ops").join(format!("op{id}.err"));
    let script = if board {
        let image = lab.board_image.to_string_lossy().into_owned();
        format!(
            "echo \"lease=$JMP_LEASE exporter=$JMP_EXPORTER\" && \
             j board flasher flash '{image}' && echo op-done"
        )
    } else {
        let image = lab.image.to_string_lossy().into_owned();
        format!(
            "echo \"lease=$JMP_LEASE exporter=$JMP_EXPORTER\" && j power on && \
             j storage flash '{image}' && j power off && echo op-done"
        )
    };
    let mut cmd = lab.jmp();
    cmd.arg("shell")
        .arg("--client-config")
        .arg(client)
        .args([
            "-l",
            selector,
            "--duration",
            &format!("{LEASE_SECS}s"),
            "--acquisition-timeout",
            "90s",
            "--retry-timeout",
            "20s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out)?)
        .stderr(fs::File::create(&err)?);
    let child = cmd.spawn().context("starting jmp shell")?;
    Ok(Op {
        id,
        board,
        child: Some(child),
        out,
        err,
        started: Instant::now(),
        took: None,
        code: None,
        killed: false,
        hung: false,
    })
}

impl Op {
    fn running(&mut self) -> bool {
        let Some(c) = self.child.as_mut() else {
            return false;
        };
        match c.try_wait() {
            Ok(Some(status)) => {
                self.code = Some(status.code().unwrap_or(-1));
                self.took = Some(self.started.elapsed());
                self.child = None;
                false
            }
            _ => true,
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The lease and exporter the command inside the shell was handed.
    fn lease(&self) -> Option<(String, String)> {
        let text = fs::read_to_string(&self.out).ok()?;
        let line = text.lines().find(|l| l.starts_with("lease="))?;
        let mut parts = line.split_whitespace();
        let lease = parts.next()?.strip_prefix("lease=")?.to_string();
        let exporter = parts.next()?.strip_prefix("exporter=")?.to_string();
        (!lease.is_empty()).then_some((lease, exporter))
    }
}

/// Where a server of the lab is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Controller,
    Router,
    Exporter(usize),
}

impl Lab {
    /// Takes the server out of `slot` (a placeholder stays until [`Lab::put`]).
    fn take(&mut self, slot: Slot) -> Service {
        let place = match slot {
            Slot::Controller => &mut self.controller,
            Slot::Router => &mut self.router,
            Slot::Exporter(i) => &mut self.exporters[i].svc,
        };
        std::mem::replace(place, dummy())
    }

    fn put(&mut self, slot: Slot, svc: Service) {
        match slot {
            Slot::Controller => self.controller = svc,
            Slot::Router => self.router = svc,
            Slot::Exporter(i) => self.exporters[i].svc = svc,
        }
    }

    /// The index of the board exporter.
    fn board(&self) -> usize {
        EXPORTERS
    }

    /// Where the gates of the first exporter's hooks are (see [`hooks`]).
    fn gates(&self) -> PathBuf {
        self.dir.join("gates")
    }
}

/// The kill of one round.
struct Fault {
    kind: Kind,
    /// When (from the round's start) the kill happens, or, for a kill tied to a flash or a
    /// hook, when the suite starts waiting for one.
    at: Duration,
    /// Which exporter (for [`Kind::Exporter`]).
    index: usize,
    /// How long a killed server stays down.
    down: Duration,
    /// For [`Kind::BoardFlash`]: how much of the image the flash has written when the
    /// exporter is killed.
    flashed: u64,
    /// For [`Kind::HookController`]: the hook (`beforeLease`, `afterLease`) during which the
    /// controller is killed.
    hook: &'static str,
    /// For [`Kind::HookController`]: the first exporter's log and its length when the suite
    /// began to wait; only a hook that begins after that counts.
    log_from: Option<(PathBuf, usize)>,
    /// For [`Kind::HookController`]: the gate that holds the hook (see [`hooks`]), while
    /// the suite holds it.
    gate: Option<PathBuf>,
    /// For [`Kind::HookController`]: when the held hook was seen to run.
    hook_seen: Option<Instant>,
    /// For [`Kind::HookController`]: how long the hook runs before the controller is killed.
    hold: Duration,
    /// For [`Kind::HookController`]: how long after the kill the hook goes on (its gate
    /// opens), and when.
    release: Duration,
    release_at: Option<Instant>,
    /// The killed server, and when it is started again.
    away: Option<(Slot, Service, Instant)>,
    /// For [`Kind::BoardFlash`]: the killed exporter's board directory, which its next
    /// start must remove.
    leftover: Option<PathBuf>,
    /// Operations started because the round's own ended before the kill could happen.
    extra: usize,
    done: bool,
}

/// How many operations a round starts at most when its own ended before the kill could
/// happen.
const EXTRA_OPS: usize = 10;

/// Runs one round; returns the leases its clients were handed (lease → exporter).
fn round(
    lab: &mut Lab,
    rng: &mut Rng,
    number: usize,
    kind: Kind,
    counts: &mut Counts,
    next_op: &mut usize,
) -> Result<BTreeMap<String, String>> {
    let n_ops = CLIENTS + rng.below(3) as usize;
    // (start, client, selector, board)
    let mut plan: Vec<(Duration, usize, String, bool)> = (0..n_ops)
        .map(|i| {
            let selector = match rng.below(3) {
                0 => format!("board=fault,slot=e{}", rng.below(EXPORTERS as u64)),
                _ => "board=fault".to_string(),
            };
            (rng.millis(0, 2500), i % CLIENTS, selector, false)
        })
        .collect();
    // One flash of the board exporter in every round.
    plan.push((
        rng.millis(0, 2500),
        rng.below(CLIENTS as u64) as usize,
        format!("board={BOARD}"),
        true,
    ));
    if kind == Kind::HookController {
        // A lease of the first exporter (the one with hooks) at least.
        plan[0].2 = "board=fault,slot=e0".to_string();
    }
    plan.sort_by_key(|p| p.0);
    let mut fault = Fault {
        kind,
        // The controller goes away while the round's clients start: some hold a lease
        // then, some wait for one, some start while it is away.
        at: if kind == Kind::HookController {
            rng.millis(300, 2500)
        } else {
            rng.millis(300, 7000)
        },
        index: rng.below(EXPORTERS as u64) as usize,
        down: rng.millis(100, 2000),
        flashed: (1 << 20) + rng.below(BOARD_IMAGE_BYTES / 2),
        hook: if rng.below(2) == 0 {
            "beforeLease"
        } else {
            "afterLease"
        },
        log_from: None,
        gate: None,
        hook_seen: None,
        hold: rng.millis(300, 3000),
        release: rng.millis(0, 10_000),
        release_at: None,
        away: None,
        leftover: None,
        extra: 0,
        done: false,
    };
    // The choices that depend on how the round goes (which running client is killed, the
    // operations started when the round's own ended early) draw from a generator of their
    // own, so that every round of a replay starts with the same plan.
    let mut rng_late = Rng(rng.next());
    let rng = &mut rng_late;
    let at = fault.at;
    let what = match kind {
        Kind::Exporter => format!(
            "SIGKILL of the exporter {} at {at:?}",
            lab.exporters[fault.index].name
        ),
        Kind::BoardFlash => format!(
            "SIGKILL of the board exporter {BOARD} once a flash has written {} MiB \
             (watching from {at:?})",
            fault.flashed >> 20
        ),
        Kind::HookController => format!(
            "SIGKILL of the controller for {HOOK_AWAY:?} during {}'s next {} hook \
             (watching from {at:?})",
            lab.exporters[0].name, fault.hook
        ),
        _ => format!("SIGKILL of the {} at {at:?}", kind.name()),
    };
    println!("-- round {number}: {} clients, {what}", n_ops + 1);
    let t0 = Instant::now();
    let mut ops: Vec<Op> = Vec::new();
    let mut planned = plan.into_iter().peekable();
    loop {
        let now = t0.elapsed();
        while planned.peek().is_some_and(|p| p.0 <= now) {
            if let Some((_, client, selector, board)) = planned.next() {
                *next_op += 1;
                ops.push(start_op(
                    lab,
                    *next_op,
                    &lab.clients[client],
                    &selector,
                    board,
                )?);
                counts.operations += 1;
            }
        }
        if !fault.done && fault.away.is_none() && now >= fault.at {
            inject(lab, &mut fault, &mut ops, rng, number, t0, counts)?;
        }
        if fault.release_at.is_some_and(|at| Instant::now() >= at)
            && let Some(gate) = fault.gate.take()
        {
            let _ = fs::remove_file(gate);
        }
        if fault
            .away
            .as_ref()
            .is_some_and(|(_, _, back)| Instant::now() >= *back)
            && let Some((slot, mut svc, _)) = fault.away.take()
        {
            let started = svc.start(lab);
            lab.put(slot, svc);
            started?;
            if let Some(dir) = fault.leftover.take()
                && dir.exists()
            {
                counts.losses.push(format!(
                    "round {number}: the killed board exporter's directory {} was not \
                     removed when it started again",
                    dir.display()
                ));
            }
            *counts.faults.entry(fault.kind).or_default() += 1;
            fault.done = true;
        }
        let mut any_running = false;
        let mut board_running = false;
        for op in ops.iter_mut() {
            if op.running() {
                any_running = true;
                board_running |= op.board;
                if op.started.elapsed() > OP_LIMIT {
                    op.kill();
                    op.hung = true;
                }
            }
        }
        if planned.peek().is_none() && !fault.done && fault.away.is_none() {
            // The round's operations ended before the moment to kill came: start one more
            // (for a flash or a hook, once the suite waits for one).
            let armed = t0.elapsed() >= fault.at;
            let more = match fault.kind {
                Kind::Client => (!any_running).then_some(("board=fault".to_string(), false)),
                Kind::BoardFlash => {
                    (armed && !board_running).then(|| (format!("board={BOARD}"), true))
                }
                Kind::HookController => {
                    (fault.log_from.is_some() && fault.hook_seen.is_none() && !any_running)
                        .then_some(("board=fault,slot=e0".to_string(), false))
                }
                _ => None,
            };
            if let Some((selector, board)) = more {
                if fault.extra == EXTRA_OPS {
                    counts.losses.push(format!(
                        "round {number}: no moment to inject the fault ({}) came in {} \
                         operations more (see {})",
                        fault.kind.name(),
                        EXTRA_OPS,
                        lab.dir.join("logs").display()
                    ));
                    fault.done = true;
                } else {
                    fault.extra += 1;
                    *next_op += 1;
                    let client = rng.below(CLIENTS as u64) as usize;
                    ops.push(start_op(
                        lab,
                        *next_op,
                        &lab.clients[client],
                        &selector,
                        board,
                    )?);
                    counts.operations += 1;
                    if fault.kind == Kind::Client {
                        // A moment within this operation's life: it takes about a quarter
                        // of a second on an idle machine, so within 1 s, then ever closer
                        // to that (a moment each operation outlived at 3 s, then within
                        // ever less, missed all ten in about one round of thirty).
                        let within = 250 + 750 / fault.extra as u64;
                        fault.at = t0.elapsed() + rng.millis(20, within);
                    }
                }
            }
        }
        if planned.peek().is_none() && !any_running && fault.done {
            break;
        }
        // A kill tied to a flash or a hook must come while it runs: look often.
        let waiting = !fault.done
            && fault.away.is_none()
            && matches!(fault.kind, Kind::BoardFlash | Kind::HookController);
        std::thread::sleep(Duration::from_millis(if waiting { 5 } else { 50 }));
    }

    if let Some(gate) = fault.gate.take() {
        let _ = fs::remove_file(gate);
    }
    let longest = ops.iter().filter_map(|o| o.took).max().unwrap_or_default();
    println!(
        "   {:.1?}: every client ended, the longest after {longest:.1?}",
        t0.elapsed()
    );
    let mut handed = BTreeMap::new();
    for op in &ops {
        if let Some((lease, exporter)) = op.lease() {
            handed.insert(lease, exporter);
        }
        if op.hung {
            counts.losses.push(format!(
                "round {number}: client operation {} did not end within {OP_LIMIT:?} (see {})",
                op.id,
                op.err.display()
            ));
        } else if op.killed {
            counts.killed += 1;
        } else if op.code == Some(0) {
            let out = fs::read_to_string(&op.out).unwrap_or_default();
            if out.contains("op-done") {
                counts.succeeded += 1;
            } else {
                counts.losses.push(format!(
                    "round {number}: client operation {} exited 0 without finishing its \
                     commands (see {})",
                    op.id,
                    op.out.display()
                ));
            }
        } else if op.code.is_some_and(|c| c > 0) {
            let err = fs::read_to_string(&op.err).unwrap_or_default();
            if err.trim().is_empty() {
                counts.losses.push(format!(
                    "round {number}: client operation {} failed ({:?}) without saying why",
                    op.id, op.code
                ));
            } else {
                counts.failed += 1;
            }
        } else {
            counts.losses.push(format!(
                "round {number}: client operation {} died of a signal nobody sent (see {})",
                op.id,
                op.err.display()
            ));
        }
    }
    Ok(handed)
}

/// Whether a hook `hook` of [`hooks`] runs according to `log` (from a point on): the last
/// line it printed there is its first.
fn hook_running(log: &str, hook: &str) -> bool {
    let begin = format!("[{hook}] {HOOK_BEGIN}");
    let end = format!("[{hook}] {HOOK_END}");
    match (log.rfind(&begin), log.rfind(&end)) {
        (Some(b), Some(e)) => b > e,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Whether `name` is a half-written file: `NAME.partial`, or the hidden
/// `.NAME.partial-RANDOM` the QEMU flasher and the storage drivers write into.
fn is_partial(name: &str) -> bool {
    name.ends_with(".partial") || (name.starts_with('.') && name.contains(".partial-"))
}

/// The size of the board image a flash is writing in the board directory `dir` (the
/// largest partial file; `None`: none).
fn partial_size(dir: &Path) -> Option<u64> {
    entries(dir)
        .ok()?
        .into_iter()
        .filter(|f| is_partial(f))
        .filter_map(|f| fs::metadata(dir.join(f)).ok().map(|m| m.len()))
        .max()
}

/// Kills what `fault` names when its moment has come; a killed server is started again by
/// the round once `fault.away` says so.
fn inject(
    lab: &mut Lab,
    fault: &mut Fault,
    ops: &mut [Op],
    rng: &mut Rng,
    number: usize,
    t0: Instant,
    counts: &mut Counts,
) -> Result<()> {
    let (slot, down) = match fault.kind {
        Kind::Client => {
            let running: Vec<usize> = ops
                .iter_mut()
                .enumerate()
                .filter_map(|(i, o)| o.running().then_some(i))
                .collect();
            if running.is_empty() {
                // Wait for one to run (the next tick).
                return Ok(());
            }
            let op = &mut ops[running[rng.below(running.len() as u64) as usize]];
            op.kill();
            op.killed = true;
            *counts.faults.entry(fault.kind).or_default() += 1;
            fault.done = true;
            return Ok(());
        }
        Kind::Controller => (Slot::Controller, fault.down),
        Kind::Router => (Slot::Router, fault.down),
        Kind::Exporter => (Slot::Exporter(fault.index), fault.down),
        Kind::BoardFlash => {
            let board = &lab.exporters[lab.board()];
            let Some(dir) = board.board_dir() else {
                return Ok(());
            };
            let Some(written) = partial_size(&dir).filter(|n| *n >= fault.flashed) else {
                return Ok(());
            };
            println!(
                "   {:.1?}: {BOARD} killed with {} MiB of the flash written",
                t0.elapsed(),
                written >> 20
            );
            fault.leftover = Some(dir);
            (Slot::Exporter(lab.board()), fault.down)
        }
        Kind::HookController => {
            let log = lab.exporters[0].svc.log.clone();
            let text = fs::read_to_string(&log).unwrap_or_default();
            let from = match &fault.log_from {
                Some((path, from)) if *path == log => (*from).min(text.len()),
                _ => {
                    // From now on the next such hook is held at its gate.
                    let gate = lab.gates().join(fault.hook);
                    fs::write(&gate, "")
                        .with_context(|| format!("cannot create {}", gate.display()))?;
                    fault.gate = Some(gate);
                    fault.log_from = Some((log, text.len()));
                    return Ok(());
                }
            };
            if !text.is_char_boundary(from) || !hook_running(&text[from..], fault.hook) {
                return Ok(());
            }
            let name = &lab.exporters[0].name;
            let Some(seen) = fault.hook_seen else {
                println!(
                    "   {:.1?}: {name}'s {} hook runs (held at its gate)",
                    t0.elapsed(),
                    fault.hook
                );
                fault.hook_seen = Some(Instant::now());
                return Ok(());
            };
            if seen.elapsed() < fault.hold {
                return Ok(());
            }
            println!(
                "   {:.1?}: controller killed during {name}'s {} hook, which goes on {:.1?} \
                 later",
                t0.elapsed(),
                fault.hook,
                fault.release
            );
            fault.release_at = Some(Instant::now() + fault.release);
            (Slot::Controller, HOOK_AWAY)
        }
    };
    let mut svc = lab.take(slot);
    svc.kill();
    if let Some(dir) = &fault.leftover
        && partial_size(dir).is_none()
    {
        // The flash ended between the look and the kill; the directory is swept all the
        // same.
        println!(
            "   round {number}: the flash had ended when {BOARD} was killed ({} has no \
             partial file)",
            dir.display()
        );
    }
    fault.away = Some((slot, svc, Instant::now() + down));
    Ok(())
}

fn dummy() -> Service {
    Service {
        name: String::new(),
        program: PathBuf::new(),
        args: Vec::new(),
        env: Vec::new(),
        ready: "",
        logs: PathBuf::new(),
        starts: 0,
        child: None,
        log: PathBuf::new(),
    }
}

/// Polls `check` until it returns no problems or `timeout` passes; the last problems.
fn settle(
    timeout: Duration,
    mut check: impl FnMut() -> Result<Vec<String>>,
) -> Result<Vec<String>> {
    let deadline = Instant::now() + timeout;
    loop {
        let problems = check()?;
        if problems.is_empty() || Instant::now() > deadline {
            return Ok(problems);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The checks after a round; every problem found is a loss.
fn check_round(
    lab: &mut Lab,
    number: usize,
    handed: &BTreeMap<String, String>,
    counts: &mut Counts,
) -> Result<()> {
    let mut problems = Vec::new();
    // Servers that died on their own are a finding; start them again to go on.
    let mut dead = Vec::new();
    for svc in lab.services_mut() {
        if let Some(status) = svc.exited() {
            problems.push(format!(
                "{} exited on its own ({status}); see {}",
                svc.name,
                svc.log.display()
            ));
            dead.push(svc.name.clone());
        }
    }
    for name in dead {
        let mut svc = if name == "controller" {
            std::mem::replace(&mut lab.controller, dummy())
        } else if name == "router" {
            std::mem::replace(&mut lab.router, dummy())
        } else {
            let i = lab
                .exporters
                .iter()
                .position(|e| e.name == name)
                .context("unknown server")?;
            std::mem::replace(&mut lab.exporters[i].svc, dummy())
        };
        svc.kill();
        let started = svc.start(lab);
        if name == "controller" {
            lab.controller = svc;
        } else if name == "router" {
            lab.router = svc;
        } else if let Some(e) = lab.exporters.iter_mut().find(|e| e.name == name) {
            e.svc = svc;
        }
        started?;
    }

    let names: Vec<String> = lab.exporters.iter().map(|e| e.name.clone()).collect();
    problems.extend(settle(SETTLE_TIMEOUT, || {
        let v = lab.audit(&["get", "exporters", "--with", "online"])?;
        let online: BTreeSet<String> = v["exporters"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter(|e| e["online"].as_bool() == Some(true))
            .filter_map(|e| e["name"].as_str().map(str::to_string))
            .collect();
        Ok(names
            .iter()
            .filter(|n| !online.contains(*n))
            .map(|n| format!("exporter {n} is not online"))
            .collect())
    })?);

    // Once every lease's time is up: none active, no exporter held.
    problems.extend(settle(SETTLE_TIMEOUT, || {
        let mut p = Vec::new();
        for l in lab.leases(false)? {
            p.push(format!(
                "lease {} (client {}, exporter {:?}) is still active",
                l["name"].as_str().unwrap_or("?"),
                l["client"].as_str().unwrap_or("?"),
                l["exporter"].as_str().unwrap_or("")
            ));
        }
        let admin_json = lab.jmp_ok(&["admin", "get", "leases", "-o", "json"])?;
        let held: serde_json::Value = serde_json::from_str(&admin_json)
            .with_context(|| format!("jmp admin get leases printed no JSON: {admin_json}"))?;
        for i in held["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            p.push(format!(
                "exporter {} is still held by lease {}",
                i["exporter"].as_str().unwrap_or("?"),
                i["name"].as_str().unwrap_or("?")
            ));
        }
        Ok(p)
    })?);

    // The history: every lease handed out is known, and no exporter was held twice at once.
    let leases = lab.leases(true)?;
    let mut known = BTreeMap::new();
    let mut by_exporter: BTreeMap<String, Vec<(f64, f64, String)>> = BTreeMap::new();
    for l in &leases {
        let name = l["name"].as_str().unwrap_or_default().to_string();
        let exporter = l["exporter"].as_str().unwrap_or_default().to_string();
        known.insert(name.clone(), exporter.clone());
        let begin = l["effective_begin_time"].as_str().and_then(parse_rfc3339);
        let end = l["effective_end_time"]
            .as_str()
            .and_then(parse_rfc3339)
            .unwrap_or(f64::INFINITY);
        if let Some(begin) = begin
            && !exporter.is_empty()
        {
            by_exporter
                .entry(exporter)
                .or_default()
                .push((begin, end, name));
        }
    }
    for (lease, exporter) in handed {
        match known.get(lease) {
            None => problems.push(format!(
                "lease {lease} (handed to a client on {exporter}) is missing from the controller"
            )),
            Some(e) if e != exporter => problems.push(format!(
                "lease {lease} was handed to a client on {exporter}, the controller says {e}"
            )),
            Some(_) => {}
        }
    }
    for (exporter, spans) in by_exporter {
        for (a, b) in overlapping(spans) {
            problems.push(format!(
                "exporter {exporter} was held by leases {a} and {b} at the same time"
            ));
        }
    }

    // Every hook could run (the exporter logs why not, and goes on without it).
    for e in lab.exporters.iter_mut() {
        let text = fs::read_to_string(&e.svc.log).unwrap_or_default();
        let from = if e.log_seen.0 == e.svc.log {
            e.log_seen.1.min(text.len())
        } else {
            0
        };
        for line in text.get(from..).unwrap_or_default().lines() {
            if line.contains("hooks cannot run") {
                problems.push(format!("{}: {}", e.name, line.trim()));
            }
        }
        e.log_seen = (e.svc.log.clone(), text.len());
    }

    // No stray process, no leftover file.
    problems.extend(settle(Duration::from_secs(15), || {
        let servers = lab.service_pids();
        Ok(marked_processes(&lab.tag)
            .into_iter()
            .filter(|(pid, _)| !servers.contains(pid))
            .map(|(pid, cmd)| format!("stray process {pid}: {cmd}"))
            .collect())
    })?);
    problems.extend(settle(Duration::from_secs(15), || {
        let mut p = Vec::new();
        for e in &lab.exporters {
            for f in entries(&e.storage)? {
                if f != "medium.img" {
                    p.push(format!(
                        "{} left {} in its storage directory",
                        e.name,
                        e.storage.join(&f).display()
                    ));
                }
            }
            let pid = e.svc.pid();
            for f in entries(&e.tmp)? {
                if pid.is_some() && temp_owner(&f, &EXPORTER_TEMP_KINDS) == pid {
                    continue;
                }
                p.push(format!(
                    "{} left {} in its TMPDIR",
                    e.name,
                    e.tmp.join(&f).display()
                ));
            }
            // No flash runs: the running board's directory holds no half-written image.
            if let Some(dir) = e.board_dir() {
                for f in entries(&dir)? {
                    if is_partial(&f) {
                        p.push(format!(
                            "{} left {} in its board directory",
                            e.name,
                            dir.join(&f).display()
                        ));
                    }
                }
            }
        }
        // Every client has ended: nothing of theirs may be left.
        let clients_tmp = lab.dir.join("tmp");
        for f in entries(&clients_tmp)? {
            p.push(format!(
                "a client left {} in its TMPDIR",
                clients_tmp.join(&f).display()
            ));
        }
        Ok(p)
    })?);
    for p in problems {
        counts.losses.push(format!("round {number}: {p}"));
    }
    Ok(())
}

/// Names in `dir` (none when it does not exist).
fn entries(dir: &Path) -> Result<Vec<String>> {
    match fs::read_dir(dir) {
        Ok(rd) => Ok(rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("cannot list {}", dir.display())),
    }
}

/// Processes whose environment holds `MARKER=tag` (pid → command line).
fn marked_processes(tag: &str) -> BTreeMap<u32, String> {
    let needle = format!("{MARKER}={tag}");
    let mut out = BTreeMap::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(env) = fs::read(e.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
            // A zombie has an empty command line; it is still a process nobody reaped.
            let cmd = fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            out.insert(pid, cmd.trim().to_string());
        }
    }
    out
}

/// Seconds since the Unix epoch of an RFC 3339 UTC time (`2026-01-02T03:04:05.5Z`).
fn parse_rfc3339(s: &str) -> Option<f64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.splitn(3, ':');
    let (h, min) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let sec: f64 = t.next()?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + min * 60) as f64 + sec)
}

/// Runs the suite.
pub fn run(args: &[String]) -> Result<()> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let o = parse_args(args, now % 1_000_000_007)?;
    println!(
        "== fault injection: seed {} (replay with `cargo xtask faults --seed {} --rounds {}`)",
        o.seed, o.seed, o.rounds
    );
    // The workspace build a developer (and `cargo xtask ci`'s tests) already made: building
    // only these packages would unify features differently and recompile their
    // dependencies.
    if o.release {
        crate::cargo(&["build", "--workspace", "--bins", "--release"])?;
    } else {
        crate::debug_build()?;
    }
    let bin = crate::target_dir().join(if o.release { "release" } else { "debug" });
    let dir = crate::target_dir().join("faults");
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    fs::create_dir_all(&dir)?;
    let mut rng = Rng(o.seed);
    let tag = format!("{}-{}", std::process::id(), rng.next());
    let started = Instant::now();
    let mut lab = start_lab(bin, dir.clone(), tag.clone(), &mut rng)?;
    println!(
        "lab up in {:?}; files and logs in {}",
        started.elapsed(),
        dir.display()
    );

    let mut counts = Counts::default();
    let mut next_op = 0;
    let mut order: Vec<Kind> = Vec::new();
    for r in 0..o.rounds {
        // Each kind once in every four rounds, in a seeded order.
        if r % KINDS.len() == 0 {
            order = KINDS.to_vec();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        let kind = order[r % KINDS.len()];
        let before = counts.losses.len();
        let r0 = Instant::now();
        let handed = round(&mut lab, &mut rng, r + 1, kind, &mut counts, &mut next_op)?;
        check_round(&mut lab, r + 1, &handed, &mut counts)?;
        println!("   {:.1?}: checked", r0.elapsed());
        for l in &counts.losses[before..] {
            println!("LOSS {l}");
        }
    }

    // The exporters first, while the controller they unregister from still runs (stopped
    // after it, each would wait for it in vain).
    let stopping = Instant::now();
    for e in lab.exporters.iter_mut() {
        e.svc.stop();
    }
    lab.router.stop();
    lab.controller.stop();
    println!("lab stopped in {:.1?}", stopping.elapsed());
    let left = settle(Duration::from_secs(15), || {
        Ok(marked_processes(&tag)
            .into_iter()
            .map(|(pid, cmd)| format!("after the lab stopped: stray process {pid}: {cmd}"))
            .collect())
    })?;
    counts.losses.extend(left);
    println!(
        "{} (in {:.0?})",
        counts.summary(o.seed, o.rounds),
        started.elapsed()
    );
    if !counts.losses.is_empty() {
        bail!(
            "{} losses (seed {}; logs in {}):\n{}",
            counts.losses.len(),
            o.seed,
            dir.join("logs").display(),
            counts.losses.join("\n")
        );
    }
    Ok(())
}

/// Pairs of spans `(begin, end, name)` of one exporter that overlap. Timestamps have one
/// second's resolution (as Kubernetes' `metav1.Time`): a lease that ended in the second the
/// next one began sorts first (by begin, then end), and touching spans do not count.
fn overlapping(mut spans: Vec<(f64, f64, String)>) -> Vec<(String, String)> {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    spans
        .windows(2)
        .filter(|w| w[1].0 + 0.001 < w[0].1)
        .map(|w| (w[0].2.clone(), w[1].2.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_turning_over_within_one_second_do_not_overlap() {
        let span = |b: f64, e: f64, n: &str| (b, e, n.to_string());
        // Ended in second 5, the next began in second 5 and ended in 6: listed either way.
        assert!(overlapping(vec![span(5.0, 6.0, "b"), span(5.0, 5.0, "a")]).is_empty());
        assert!(overlapping(vec![span(5.0, 5.0, "a"), span(5.0, 6.0, "b")]).is_empty());
        assert!(overlapping(vec![span(1.0, 5.0, "a"), span(5.0, f64::INFINITY, "b")]).is_empty());
        // Began in second 5 while the other held it until 7: a real overlap.
        assert_eq!(
            overlapping(vec![span(4.0, 7.0, "a"), span(5.0, 8.0, "b")]),
            vec![("a".to_string(), "b".to_string())]
        );
    }

    #[test]
    fn arguments_are_checked() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse_args(&args(&["--seed", "42", "--rounds", "3"]), 7).unwrap();
        assert_eq!((o.seed, o.rounds, o.quick), (42, 3, false));
        let o = parse_args(&args(&["--quick"]), 7).unwrap();
        assert_eq!((o.seed, o.rounds), (7, KINDS.len()));
        for bad in [
            &["--seed"][..],
            &["--seed", "x"],
            &["--rounds", "0"],
            &["--rounds", "-1"],
            &["--fast"],
        ] {
            assert!(parse_args(&args(bad), 7).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn the_same_seed_replays_the_same_choices() {
        let (mut a, mut b, mut c) = (Rng(5), Rng(5), Rng(6));
        let xs: Vec<u64> = (0..8).map(|_| a.below(1000)).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.below(1000)).collect();
        let zs: Vec<u64> = (0..8).map(|_| c.below(1000)).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
        assert!(xs.iter().all(|x| *x < 1000));
        let d = a.millis(300, 400);
        assert!(d >= Duration::from_millis(300) && d < Duration::from_millis(400));
    }

    #[test]
    fn rfc3339_times_parse_to_epoch_seconds() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:01.5Z"), Some(951_868_801.5));
        assert_eq!(parse_rfc3339("2026-12-02T05:00:00Z"), Some(1_796_187_600.0));
        // Fractions order correctly (text order would not).
        assert!(parse_rfc3339("2026-12-02T05:00:00Z") < parse_rfc3339("2026-12-02T05:00:00.1Z"));
        for bad in ["", "2026-12-02", "2026-12-02T05:00:00", "x-1-1T0:0:0Z"] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn marked_processes_are_found_by_their_environment() {
        let tag = format!("test-{}", std::process::id());
        let mut child = Command::new("sleep")
            .arg("30")
            .env(MARKER, &tag)
            .spawn()
            .unwrap();
        // Until the child has exec'd, /proc shows the environment it was forked with.
        let mut found = marked_processes(&tag);
        for _ in 0..250 {
            if found.contains_key(&child.id()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            found = marked_processes(&tag);
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains_key(&child.id()), "{found:?}");
        assert!(marked_processes(&format!("{tag}-other")).is_empty());
    }

    #[test]
    fn the_running_exporters_own_temporary_files_are_recognised() {
        let k = &EXPORTER_TEMP_KINDS;
        assert_eq!(temp_owner("jmp-storage-mux-42-a1b2", k), Some(42));
        assert_eq!(temp_owner("jumpstarter-hook-7-x", k), Some(7));
        for other in [
            "jmp-storage-mux-a1b2c3",
            "jmp-storage-mux-42-",
            "jumpstarter-shell-42-x",
            ".medium.img.partial-42-x",
            "jumpstarter-hook-watcher-1-x",
        ] {
            assert_eq!(temp_owner(other, k), None, "{other}");
        }
    }

    #[test]
    fn the_board_directory_and_half_written_images_are_recognised() {
        let k = &EXPORTER_TEMP_KINDS;
        assert_eq!(temp_owner("jumpstarter-qemu-42-AbC123", k), Some(42));
        assert_eq!(temp_owner("jumpstarter-qemu-AbC123", k), None);
        for partial in [
            "root.partial",
            ".root.partial-79c1a2f57f23475288a731f820206503",
            ".medium.img.partial-42-x",
        ] {
            assert!(is_partial(partial), "{partial}");
        }
        for other in ["root", "bios", "root.partial.d/x", "partial", "cidata.iso"] {
            assert!(!is_partial(other), "{other}");
        }
    }

    #[test]
    fn a_hook_runs_from_its_first_line_to_its_last() {
        let before = "[beforeLease] faults-hook-begin\n";
        let after = "[afterLease] faults-hook-begin\n";
        let before_end = "[beforeLease] faults-hook-end\n";
        assert!(hook_running(before, "beforeLease"));
        assert!(!hook_running(before, "afterLease"));
        assert!(!hook_running(
            &format!("{before}{before_end}"),
            "beforeLease"
        ));
        assert!(hook_running(
            &format!("{before}{before_end}{after}"),
            "afterLease"
        ));
        // A second run of the same hook, begun after the first ended.
        assert!(hook_running(
            &format!("{before}{before_end}{before}"),
            "beforeLease"
        ));
        assert!(!hook_running("", "beforeLease"));
    }

    #[test]
    fn a_hook_socket_under_the_short_link_fits_a_unix_socket_address() {
        // The longest PIDs (pid_max is at most 2^22), the longest exporter name.
        let link = PathBuf::from(format!("/tmp/{LINK_PREFIX}4194304"));
        let socket = link
            .join(BOARD)
            .join("tmp")
            .join("jumpstarter-hook-4194304-AbC123")
            .join("exporter@socket");
        assert!(
            socket.as_os_str().len() <= 107,
            "{} is {} bytes",
            socket.display(),
            socket.as_os_str().len()
        );
    }

    #[test]
    fn exporters_get_a_configured_or_a_temporary_medium() {
        let with = export_section(Some(Path::new("/lab/e0/storage")));
        assert!(
            with.contains("file: /lab/e0/storage/medium.img\n"),
            "{with}"
        );
        let without = export_section(None);
        assert!(without.ends_with("MockStorageMux\n"), "{without}");
        assert!(!without.contains("file:"), "{without}");
    }

    #[test]
    fn the_summary_names_every_count() {
        let mut c = Counts::default();
        c.faults.insert(Kind::Router, 2);
        c.operations = 5;
        c.succeeded = 3;
        c.failed = 1;
        c.killed = 1;
        assert_eq!(
            c.summary(9, 2),
            "faults: seed 9, 2 rounds: 2 faults injected (controller 0, router 2, exporter 0, \
             client 0, board exporter mid-flash 0, controller during a hook 0), 5 operations \
             (3 succeeded, 1 failed with an error, 1 killed), 0 losses"
        );
    }
}
