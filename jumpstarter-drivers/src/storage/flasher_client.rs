//! The client half of flashers (`jumpstarter_driver_opendal.client.FlasherClient`) and its
//! `j NAME flash|dump` commands.

use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, ArgMatches, Command};
use jumpstarter_core::{
    ClientError, client::DriverClient, wire::resource::ContentEncoding,
    wire::resource::ResourceHandle,
};

use super::{
    Progress, ProgressWriter, TransferOptions,
    client::{
        compression_arg, encoding_for, file_arg, file_source, no_encoding_with_url, open_local,
        presigned_get, progress_for, refuse_url_dump, url_of, write_local_atomically,
    },
};
use crate::command::{CliFuture, DriverCommand};

/// Typed client for drivers reporting `jumpstarter_driver_opendal.client.FlasherClient`.
#[derive(Clone)]
pub struct FlasherClient(pub DriverClient);

impl FlasherClient {
    /// Flashes a local image into `target` (the driver's default partition when `None`).
    /// An `http://` or `https://` path is fetched by the exporter itself (a presigned `GET`,
    /// as upstream's client passes it).
    pub async fn flash(
        &self,
        path: &Path,
        target: Option<&str>,
        opts: &TransferOptions,
    ) -> Result<(), ClientError> {
        if let Some(url) = url_of(path) {
            no_encoding_with_url(&url, opts.encoding)?;
            let target = target.map(str::to_string);
            self.0
                .call::<serde_json::Value>("flash", (presigned_get(url), target))
                .await?;
            return Ok(());
        }
        let (file, _) = open_local(path).await?;
        let source = file_source(file, &opts.progress).await;
        let this = self.0.clone();
        let target = target.map(str::to_string);
        let r = self
            .0
            .upload(source, opts.encoding, |h: ResourceHandle| async move {
                this.call::<serde_json::Value>("flash", (h, target)).await
            })
            .await;
        match &r {
            Ok(_) => opts.progress.finish(),
            Err(_) => opts.progress.abandon(),
        }
        r.map(|_| ())
    }

    /// Dumps `target` (the default partition when `None`) into a local file, which appears
    /// only once complete. A URL is refused.
    pub async fn dump(
        &self,
        path: &Path,
        target: Option<&str>,
        opts: &TransferOptions,
    ) -> Result<(), ClientError> {
        refuse_url_dump(path)?;
        let this = self.0.clone();
        let encoding = opts.encoding;
        let progress = opts.progress.clone();
        let target = target.map(str::to_string);
        let r = write_local_atomically(path, |file| async move {
            let sink = ProgressWriter::new(file, progress);
            let caller = this.clone();
            this.download(sink, encoding, |h: ResourceHandle| async move {
                caller
                    .call::<serde_json::Value>("dump", (h, target))
                    .await
                    .map(|_| ())
            })
            .await
        })
        .await;
        match &r {
            Ok(()) => opts.progress.finish(),
            Err(_) => opts.progress.abandon(),
        }
        r
    }
}

/// The `j NAME flash|dump` commands of flashers.
pub fn flasher_cli() -> DriverCommand {
    DriverCommand {
        about: "Generic flasher interface",
        build,
        run,
    }
}

fn build(cmd: Command) -> Command {
    cmd.subcommand_required(true)
        .subcommand(
            Command::new("flash")
                .about("Flash an image to the DUT")
                .arg(
                    Arg::new("file")
                        .value_parser(clap::value_parser!(PathBuf))
                        .help("The image to flash (required unless --target is used)"),
                )
                .arg(
                    Arg::new("target")
                        .short('t')
                        .long("target")
                        .action(ArgAction::Append)
                        .value_name("NAME:FILE")
                        .help("Flash FILE into partition NAME (repeatable)"),
                )
                .arg(compression_arg()),
        )
        .subcommand(
            Command::new("dump")
                .about("Dump image from DUT to file")
                .arg(file_arg("The file to create"))
                .arg(
                    Arg::new("target")
                        .long("target")
                        .help("The partition to dump"),
                )
                .arg(
                    compression_arg()
                        .value_parser(["gzip", "xz", "bz2", "zstd"])
                        .help("Compress the dump (on the exporter if it accepts it, else locally)"),
                ),
        )
}

/// `NAME:FILE` specs of `flash --target`.
fn target_specs(m: &ArgMatches) -> Result<Vec<(String, PathBuf)>, ClientError> {
    m.get_many::<String>("target")
        .into_iter()
        .flatten()
        .map(|spec| match spec.split_once(':') {
            Some((name, file)) => Ok((name.to_string(), PathBuf::from(file))),
            None => Err(ClientError::Value(format!(
                "Invalid target spec '{spec}', expected name:file"
            ))),
        })
        .collect()
}

fn run(client: DriverClient, matches: ArgMatches) -> CliFuture {
    Box::pin(async move {
        let flasher = FlasherClient(client);
        match matches.subcommand() {
            Some(("flash", m)) => {
                let specs = target_specs(m)?;
                let jobs: Vec<(Option<String>, PathBuf)> = if specs.is_empty() {
                    let file = m.get_one::<PathBuf>("file").cloned().ok_or_else(|| {
                        ClientError::Value(
                            "FILE argument is required unless --target/-t is used".into(),
                        )
                    })?;
                    vec![(None, file)]
                } else {
                    specs.into_iter().map(|(n, f)| (Some(n), f)).collect()
                };
                for (target, file) in jobs {
                    let opts = TransferOptions {
                        encoding: encoding_for(m, &file).await?,
                        progress: progress_for("flash", &file).await,
                    };
                    flasher.flash(&file, target.as_deref(), &opts).await?;
                }
                Ok(())
            }
            Some(("dump", m)) => {
                let file = m.get_one::<PathBuf>("file").cloned().unwrap_or_default();
                let opts = TransferOptions {
                    encoding: m
                        .get_one::<String>("compression")
                        .and_then(|c| ContentEncoding::parse(c)),
                    progress: Progress::stderr("dump", None),
                };
                flasher
                    .dump(
                        &file,
                        m.get_one::<String>("target").map(String::as_str),
                        &opts,
                    )
                    .await
            }
            _ => Err(ClientError::Value("missing flasher command".into())),
        }
    })
}
