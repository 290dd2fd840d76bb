//! The client halves of the QEMU board (`QemuClient`, `QemuFlasherClient`) and their `j`
//! commands: `j BOARD resize disk|memory SIZE` (the children's commands come with them),
//! `j BOARD flasher flash|dump`.

use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, ArgMatches, Command, value_parser};
use futures::TryStreamExt;
use jumpstarter_core::{
    ClientError,
    client::{DriverClient, UploadSource},
    wire::resource::file_chunks,
};

use crate::{
    Novnc,
    command::{CliFuture, DriverCommand},
    storage::{
        Progress, ProgressWriter, detect_encoding, presigned_get, refuse_url_dump, url_of,
        write_local_atomically,
    },
};

/// Typed client of the board (`jumpstarter_driver_qemu.client.QemuClient`); its children
/// (`power`, `flasher`, `console`, ...) are reached with [`DriverClient::child`].
#[derive(Clone)]
pub struct QemuClient(pub DriverClient);

impl QemuClient {
    /// The guest's host name.
    pub async fn hostname(&self) -> Result<String, ClientError> {
        self.0.call("get_hostname", ()).await
    }

    /// The guest user's name.
    pub async fn username(&self) -> Result<String, ClientError> {
        self.0.call("get_username", ()).await
    }

    /// The guest user's password.
    pub async fn password(&self) -> Result<String, ClientError> {
        self.0.call("get_password", ()).await
    }

    /// Grows the disk to `size` (e.g. `20G`) at the next power on.
    pub async fn set_disk_size(&self, size: &str) -> Result<(), ClientError> {
        self.0.call("set_disk_size", (size,)).await
    }

    /// Sets the memory of the next boot (e.g. `2G`).
    pub async fn set_memory_size(&self, size: &str) -> Result<(), ClientError> {
        self.0.call("set_memory_size", (size,)).await
    }

    /// The guest's screen in a browser: a noVNC bridge to the `vnc` child (upstream's
    /// `QemuClient.novnc()`); open [`Novnc::url`] while it lives.
    pub async fn novnc(&self, encrypt: bool) -> Result<Novnc, ClientError> {
        let vnc = self
            .0
            .child("vnc")
            .ok_or_else(|| ClientError::Value("this board has no vnc child".into()))?;
        crate::network::novnc(vnc, "connect", encrypt).await
    }
}

/// Typed client of the board's flasher (`jumpstarter_driver_qemu.client.QemuFlasherClient`).
#[derive(Clone)]
pub struct QemuFlasherClient(pub DriverClient);

impl QemuFlasherClient {
    /// Flashes a local image to `partition` (`root` when `None`). A compressed image
    /// (recognised by its first bytes) is sent compressed and expanded on the exporter.
    ///
    /// An `http://` or `https://` path is fetched by the exporter itself (a presigned
    /// `GET`, as upstream's client passes it; the exporter expands it the same way and logs
    /// its progress); `progress` is not used then.
    pub async fn flash(
        &self,
        path: &Path,
        partition: Option<&str>,
        progress: &Progress,
    ) -> Result<(), ClientError> {
        if let Some(url) = url_of(path) {
            let partition = partition.map(str::to_string);
            self.0
                .call::<serde_json::Value>("flash", (presigned_get(url), partition))
                .await?;
            return Ok(());
        }
        // An OCI reference goes to the exporter as given, which says whether it can flash
        // it (ours answers UNIMPLEMENTED); it is not a local file.
        if let Some(reference) = path.to_str().filter(|s| s.starts_with("oci://")) {
            let partition = partition.map(str::to_string);
            self.0
                .call::<serde_json::Value>("flash", (reference, partition))
                .await?;
            return Ok(());
        }
        let encoding = detect_encoding(path).await?;
        let file = std::fs::File::open(path).map_err(|e| io_err("opening", path, e))?;
        let p = progress.clone();
        let chunks = file_chunks(file).inspect_ok(move |c| p.inc(c.len() as u64));
        let partition = partition.map(str::to_string);
        let this = self.0.clone();
        let r = self
            .0
            .upload(UploadSource::chunks(chunks), encoding, |h| async move {
                this.call::<serde_json::Value>("flash", (h, partition))
                    .await
            })
            .await;
        finish(progress, &r);
        r.map(|_| ())
    }

    /// Dumps `partition` (`root` when `None`) into a local file, which appears only once
    /// complete: the bytes go to a hidden sibling renamed over `path` at the end, and removed
    /// if the dump fails or is interrupted (a file that was there stays as it was). A
    /// device, pipe or socket (`/dev/stdout`) is written directly. A URL is refused (as
    /// upstream's client, which cannot write to one either).
    pub async fn dump(
        &self,
        path: &Path,
        partition: Option<&str>,
        progress: &Progress,
    ) -> Result<(), ClientError> {
        refuse_url_dump(path)?;
        let partition = partition.map(str::to_string);
        let this = self.0.clone();
        let shown = progress.clone();
        let r = write_local_atomically(path, |file| async move {
            let sink = ProgressWriter::new(file, shown);
            let caller = this.clone();
            this.download(sink, None, |h| async move {
                caller
                    .call::<serde_json::Value>("dump", (h, partition))
                    .await
            })
            .await
        })
        .await;
        finish(progress, &r);
        r.map(|_| ())
    }
}

fn finish<T>(progress: &Progress, r: &Result<T, ClientError>) {
    match r {
        Ok(_) => progress.finish(),
        Err(_) => progress.abandon(),
    }
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> ClientError {
    ClientError::Io(std::io::Error::new(
        e.kind(),
        jumpstarter_core::Because::boxed(format!("{what} {}", path.display()), e),
    ))
}

/// The board's own `j` commands (`resize disk|memory SIZE`); `cli.rs` adds its children.
pub fn cli() -> DriverCommand {
    DriverCommand {
        about: "QEMU virtual board",
        build: build_board,
        run: run_board,
    }
}

fn build_board(cmd: Command) -> Command {
    let size = || Arg::new("size").required(true);
    cmd.subcommand_required(true)
        .subcommand(
            Command::new("novnc")
                .about("Show the guest's screen in a browser (noVNC)")
                .long_about(
                    "Show the guest's screen in a browser (noVNC)\n\nListens on a free \
                     loopback port for the noVNC page's WebSocket, prints the page's link and \
                     relays until interrupted (Ctrl-C).",
                )
                .arg(
                    Arg::new("no-encrypt")
                        .long("no-encrypt")
                        .action(ArgAction::SetTrue)
                        .help("Ask the page for ws:// instead of wss:// (encrypt=0 in the link)"),
                ),
        )
        .subcommand(
            Command::new("resize")
                .about("Resize QEMU resources")
                .subcommand_required(true)
                .subcommand(
                    Command::new("disk")
                        .about("Resize the root disk (e.g., 20G). Run before power on.")
                        .arg(size()),
                )
                .subcommand(
                    Command::new("memory")
                        .about("Set memory size (e.g., 2G, 4G). Takes effect on next boot.")
                        .arg(size()),
                ),
        )
}

fn run_board(client: DriverClient, matches: ArgMatches) -> CliFuture {
    Box::pin(async move {
        let board = QemuClient(client);
        if let Some(("novnc", m)) = matches.subcommand() {
            let bridge = board.novnc(!m.get_flag("no-encrypt")).await?;
            println!("{}", bridge.url());
            std::future::pending::<()>().await;
        }
        let Some(("resize", m)) = matches.subcommand() else {
            return Err(ClientError::Value("missing board command".into()));
        };
        let (what, m) = m
            .subcommand()
            .ok_or_else(|| ClientError::Value("resize: disk or memory".into()))?;
        let size = m.get_one::<String>("size").cloned().unwrap_or_default();
        match what {
            "disk" => {
                board.set_disk_size(&size).await?;
                println!("Disk will be resized to {size} on next power on");
            }
            "memory" => {
                board.set_memory_size(&size).await?;
                println!("Memory will be set to {size} on next power on");
            }
            other => return Err(ClientError::Value(format!("unknown resize target {other}"))),
        }
        Ok(())
    })
}

/// The `j BOARD flasher` commands: `flash [FILE] [-t PARTITION:FILE]...`, `dump FILE
/// [--target PARTITION]`, as upstream's flasher client.
pub fn flasher_cli() -> DriverCommand {
    DriverCommand {
        about: "Generic flasher interface",
        build: build_flasher,
        run: run_flasher,
    }
}

fn build_flasher(cmd: Command) -> Command {
    cmd.subcommand_required(true)
        .subcommand(
            Command::new("flash")
                .about("Flash image to DUT")
                .arg(
                    Arg::new("file")
                        .value_parser(value_parser!(PathBuf))
                        .help("The image to flash (to the root partition): a local file or an http(s):// URL the exporter fetches"),
                )
                .arg(
                    Arg::new("target")
                        .short('t')
                        .long("target")
                        .action(ArgAction::Append)
                        .help("name:file: flash FILE to partition NAME (repeatable)"),
                ),
        )
        .subcommand(
            Command::new("dump")
                .about("Dump image from DUT to file")
                .arg(
                    Arg::new("file")
                        .required(true)
                        .value_parser(value_parser!(PathBuf)),
                )
                .arg(Arg::new("target").long("target").help("The partition")),
        )
}

fn run_flasher(client: DriverClient, matches: ArgMatches) -> CliFuture {
    Box::pin(async move {
        let flasher = QemuFlasherClient(client);
        let Some((name, m)) = matches.subcommand() else {
            return Err(ClientError::Value("missing flasher command".into()));
        };
        match name {
            "flash" => {
                let targets: Vec<String> = m
                    .get_many::<String>("target")
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect();
                let mut jobs = Vec::new();
                for spec in &targets {
                    let (part, file) = spec.split_once(':').ok_or_else(|| {
                        ClientError::Value(format!(
                            "Invalid target spec '{spec}', expected name:file"
                        ))
                    })?;
                    jobs.push((Some(part.to_string()), PathBuf::from(file)));
                }
                if jobs.is_empty() {
                    let file = m.get_one::<PathBuf>("file").cloned().ok_or_else(|| {
                        ClientError::Value(
                            "FILE argument is required unless --target/-t is used".into(),
                        )
                    })?;
                    jobs.push((None, file));
                }
                for (part, file) in jobs {
                    // A URL is fetched by the exporter, whose progress `jmp shell` shows.
                    let progress = if url_of(&file).is_some() {
                        Progress::hidden()
                    } else {
                        let size = std::fs::metadata(&file).ok().map(|m| m.len());
                        Progress::stderr("flash", size)
                    };
                    flasher.flash(&file, part.as_deref(), &progress).await?;
                }
                Ok(())
            }
            "dump" => {
                let file = m.get_one::<PathBuf>("file").cloned().unwrap_or_default();
                let part = m.get_one::<String>("target").cloned();
                flasher
                    .dump(&file, part.as_deref(), &Progress::stderr("dump", None))
                    .await
            }
            other => Err(ClientError::Value(format!(
                "unknown flasher command {other}"
            ))),
        }
    })
}
