//! The client halves of storage drivers and the `j storage ...` commands.

use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, ArgMatches, Command, value_parser};
use futures::{StreamExt, TryStreamExt, stream::BoxStream};
use jumpstarter_core::{
    ClientError,
    client::{DriverClient, UploadSource},
    wire::resource::{ContentEncoding, FileWriter, ResourceHandle, decoder, file_chunks},
};
use tokio::io::AsyncReadExt;
use uuid::Uuid;

use super::{
    HashAlgo, Metadata, Partial, StorageError, WriteTarget, hash_reader, is_a_directory,
    open_in_place,
    opendal::{Capability, PresignedRequest},
    progress::{Progress, ProgressWriter},
    write_target,
};
use crate::command::{CliFuture, DriverCommand};

fn io_err(what: &str, path: &Path, e: std::io::Error) -> ClientError {
    ClientError::Io(std::io::Error::new(
        e.kind(),
        jumpstarter_core::Because::boxed(format!("{what} {}", path.display()), e),
    ))
}

pub(super) async fn open_local(path: &Path) -> Result<(tokio::fs::File, u64), ClientError> {
    let f = tokio::fs::File::open(path)
        .await
        .map_err(|e| io_err("opening", path, e))?;
    let meta = f
        .metadata()
        .await
        .map_err(|e| io_err("reading metadata of", path, e))?;
    if meta.is_dir() {
        return Err(storage_err(is_a_directory("reading", path)));
    }
    Ok((f, meta.len()))
}

/// The size of a regular file, for progress; none for a pipe or device (or a path that
/// cannot be read, reported when it is opened). Found without opening the file: a FIFO
/// opened twice loses what its writer sent in between.
pub(super) async fn local_size(path: &Path) -> Option<u64> {
    tokio::fs::metadata(path)
        .await
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.len())
}

/// A "local path" that is an `http://` or `https://` URL: the exporter fetches it itself
/// (upstream's client passes such a path as a presigned `GET` request, so the image goes
/// from the server to the exporter without passing through the client).
pub fn url_of(path: &Path) -> Option<String> {
    let s = path.to_str()?;
    (s.starts_with("http://") || s.starts_with("https://")).then(|| s.to_string())
}

/// A dump goes to a local file: `path` as a URL is refused (as upstream's client, which
/// cannot write to one either), rather than taken for a file name.
pub fn refuse_url_dump(path: &Path) -> Result<(), ClientError> {
    match url_of(path) {
        Some(url) => Err(ClientError::Value(format!(
            "cannot dump to a URL ({}): dump to a local file",
            url.split('?').next().unwrap_or_default()
        ))),
        None => Ok(()),
    }
}

/// The resource handle that makes the exporter `GET` `url` itself.
pub fn presigned_get(url: String) -> ResourceHandle {
    ResourceHandle::PresignedRequest {
        headers: Default::default(),
        url,
        method: "GET".into(),
    }
}

/// Refuses a content encoding with a URL: the exporter takes the URL's bytes as they are.
pub(super) fn no_encoding_with_url(
    url: &str,
    encoding: Option<ContentEncoding>,
) -> Result<(), ClientError> {
    match encoding {
        Some(e) => Err(ClientError::Value(format!(
            "compression ({e}) is not supported with an http(s) URL ({}): the exporter \
             fetches the URL's bytes as they are",
            url.split('?').next().unwrap_or_default()
        ))),
        None => Ok(()),
    }
}

/// The progress display of a transfer from `file`: none for a URL (the exporter fetches
/// it and logs its progress, which `jmp shell` shows).
pub(super) async fn progress_for(label: &'static str, file: &Path) -> Progress {
    if url_of(file).is_some() {
        Progress::hidden()
    } else {
        Progress::stderr(label, local_size(file).await)
    }
}

/// An opened local file as an upload source, counted by `progress` as it is read.
pub(super) async fn file_source(file: tokio::fs::File, progress: &Progress) -> UploadSource {
    let progress = progress.clone();
    let chunks = file_chunks(file.into_std().await)
        .inspect_ok(move |chunk| progress.inc(chunk.len() as u64));
    UploadSource::chunks(chunks)
}

/// Reads the first bytes of a file to recognise its compression.
pub async fn detect_encoding(path: &Path) -> Result<Option<ContentEncoding>, ClientError> {
    // Peeking at a pipe would take its first bytes away from the transfer.
    if local_size(path).await.is_none() && tokio::fs::metadata(path).await.is_ok() {
        return Err(ClientError::Value(format!(
            "cannot recognise the compression of {}: not a regular file (name it with \
             --compression)",
            path.display()
        )));
    }
    let mut f = tokio::fs::File::open(path)
        .await
        .map_err(|e| io_err("opening", path, e))?;
    let mut head = [0u8; 8];
    let mut n = 0;
    while n < head.len() {
        let m = f
            .read(&mut head[n..])
            .await
            .map_err(|e| io_err("reading", path, e))?;
        if m == 0 {
            break;
        }
        n += m;
    }
    Ok(ContentEncoding::detect(&head[..n]))
}

/// Writes into a hidden sibling of `path`, renamed over `path` only if `body` succeeds; the
/// sibling is removed otherwise, also when this future is dropped (the command interrupted).
///
/// A symbolic link is followed (the file it names is replaced, the link stays), and a
/// device, pipe or socket that exists (`/dev/null`, `/dev/stdout`, a FIFO) is written
/// directly: there is no file to put in place, and renaming over it would replace it.
pub(crate) async fn write_local_atomically<T, F, Fut>(
    path: &Path,
    body: F,
) -> Result<T, ClientError>
where
    F: FnOnce(FileWriter) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let target = match write_target(path).await.map_err(storage_err)? {
        WriteTarget::InPlace => {
            let file = open_in_place(path).await.map_err(storage_err)?;
            return body(FileWriter::new(file)).await;
        }
        WriteTarget::Replace(target) => target,
    };
    let (partial, file) = Partial::create(&target).await.map_err(storage_err)?;
    let v = body(FileWriter::new(file)).await?;
    partial.commit(&target).await.map_err(storage_err)?;
    Ok(v)
}

/// A local file error as the client reports it.
fn storage_err(e: StorageError) -> ClientError {
    match e {
        StorageError::File { what, path, source } => io_err(what, &path, source),
        other => ClientError::Value(other.to_string()),
    }
}

/// Options of a file transfer.
#[derive(Clone)]
pub struct TransferOptions {
    /// The encoding of the local file (sent compressed, expanded on the exporter when it
    /// accepts the encoding, locally otherwise).
    pub encoding: Option<ContentEncoding>,
    /// Where progress goes.
    pub progress: Progress,
}

impl Default for TransferOptions {
    fn default() -> Self {
        Self {
            encoding: None,
            progress: Progress::hidden(),
        }
    }
}

/// Typed client for storage muxes (`jumpstarter_driver_opendal.client.StorageMuxClient`
/// and `...StorageMuxFlasherClient`).
#[derive(Clone)]
pub struct StorageMuxClient(pub DriverClient);

impl StorageMuxClient {
    /// Connects the medium to the host.
    pub async fn host(&self) -> Result<(), ClientError> {
        self.0.call("host", ()).await
    }

    /// Connects the medium to the device under test.
    pub async fn dut(&self) -> Result<(), ClientError> {
        self.0.call("dut", ()).await
    }

    /// Disconnects the medium.
    pub async fn off(&self) -> Result<(), ClientError> {
        self.0.call("off", ()).await
    }

    /// Writes the resource `handle` to the medium (the raw driver call).
    pub async fn write(&self, handle: ResourceHandle) -> Result<(), ClientError> {
        self.0.call::<serde_json::Value>("write", (handle,)).await?;
        Ok(())
    }

    /// Sends the medium into the resource `handle` (the raw driver call).
    pub async fn read(&self, handle: ResourceHandle) -> Result<(), ClientError> {
        self.0.call::<serde_json::Value>("read", (handle,)).await?;
        Ok(())
    }

    /// The digest of the first `length` bytes of the medium, computed on the exporter (our
    /// extension; upstream exporters answer NOT_FOUND).
    pub async fn hash(&self, algo: HashAlgo, length: Option<u64>) -> Result<String, ClientError> {
        self.0.call("hash", (algo, length)).await
    }

    /// How many bytes the medium holds (our extension; upstream exporters answer NOT_FOUND).
    pub async fn size(&self) -> Result<u64, ClientError> {
        self.0.call("size", ()).await
    }

    /// Writes a local file to the medium; returns the number of bytes read from the file.
    pub async fn write_local_file(
        &self,
        path: &Path,
        opts: &TransferOptions,
    ) -> Result<u64, ClientError> {
        if let Some(url) = url_of(path) {
            no_encoding_with_url(&url, opts.encoding)?;
            self.write(presigned_get(url)).await?;
            return Ok(0);
        }
        let (file, len) = open_local(path).await?;
        let source = file_source(file, &opts.progress).await;
        let this = self.clone();
        let r = self
            .0
            .upload(
                source,
                opts.encoding,
                |h| async move { this.write(h).await },
            )
            .await;
        match &r {
            Ok(()) => opts.progress.finish(),
            Err(_) => opts.progress.abandon(),
        }
        r.map(|_| len)
    }

    /// Reads the medium into a local file (which appears only once complete).
    pub async fn read_local_file(
        &self,
        path: &Path,
        opts: &TransferOptions,
    ) -> Result<(), ClientError> {
        // A total for the display when the exporter can tell it (ours can; upstream's
        // cannot, and the dump goes on without one). A compressed dump arrives smaller.
        if opts.encoding.is_none()
            && !opts.progress.is_hidden()
            && let Ok(size) = self.size().await
        {
            opts.progress.set_total(size);
        }
        let this = self.clone();
        let encoding = opts.encoding;
        let progress = opts.progress.clone();
        let r = write_local_atomically(path, |file| async move {
            let sink = ProgressWriter::new(file, progress);
            let caller = this.clone();
            this.0
                .download(sink, encoding, |h| async move { caller.read(h).await })
                .await
        })
        .await;
        match &r {
            Ok(()) => opts.progress.finish(),
            Err(_) => opts.progress.abandon(),
        }
        r
    }

    /// Flashes a local image: host, write, (verify), then dut even if writing failed.
    ///
    /// With `verify`, the exporter hashes what the medium holds (sha256 of the image's
    /// length) and it is compared with the local image's digest: nothing is read back.
    pub async fn flash(
        &self,
        path: &Path,
        opts: &TransferOptions,
        verify: bool,
    ) -> Result<(), ClientError> {
        self.host().await?;
        let written = async {
            self.write_local_file(path, opts).await?;
            if verify {
                self.verify(path, opts.encoding).await?;
            }
            Ok::<(), ClientError>(())
        }
        .await;
        let dut = self.dut().await;
        written?;
        dut
    }

    /// Compares the medium with a local image by sha256, computed on both sides.
    pub async fn verify(
        &self,
        path: &Path,
        encoding: Option<ContentEncoding>,
    ) -> Result<(), ClientError> {
        if let Some(url) = url_of(path) {
            return Err(ClientError::Value(format!(
                "cannot verify against a URL ({}): download the image and verify with the \
                 local file",
                url.split('?').next().unwrap_or_default()
            )));
        }
        let (file, _) = open_local(path).await?;
        let plain = decoder(tokio::io::BufReader::with_capacity(1 << 20, file), encoding);
        let (local, len) = hash_reader(plain, HashAlgo::Sha256, None)
            .await
            .map_err(|e| io_err("hashing", path, e))?;
        let remote = self.hash(HashAlgo::Sha256, Some(len)).await.map_err(|e| {
            ClientError::Value(format!(
                "cannot verify: the exporter could not hash the medium ({e})",
                e = jumpstarter_core::error_chain(&e)
            ))
        })?;
        if remote != local {
            return Err(ClientError::Value(format!(
                "verification failed: the medium holds sha256 {remote}, {} has {local} ({len} bytes)",
                path.display()
            )));
        }
        Ok(())
    }

    /// Dumps the medium into a local file: host, read, then dut.
    pub async fn dump(&self, path: &Path, opts: &TransferOptions) -> Result<(), ClientError> {
        self.host().await?;
        let r = self.read_local_file(path, opts).await;
        let dut = self.dut().await;
        r?;
        dut
    }
}

/// A file opened on an Opendal driver.
pub struct OpendalFile {
    client: OpendalClient,
    fd: Uuid,
}

impl OpendalFile {
    /// The descriptor.
    pub fn fd(&self) -> Uuid {
        self.fd
    }

    /// Closes (and for writes, commits) the file.
    pub async fn close(self) -> Result<(), ClientError> {
        self.client.0.call("file_close", (self.fd,)).await
    }
}

/// The operations `presign_*` sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presign {
    /// `presign_stat` (HEAD).
    Stat,
    /// `presign_read` (GET).
    Read,
    /// `presign_write` (PUT).
    Write,
}

impl Presign {
    /// The driver method.
    pub fn method(self) -> &'static str {
        match self {
            Presign::Stat => "presign_stat",
            Presign::Read => "presign_read",
            Presign::Write => "presign_write",
        }
    }
}

/// Typed client for `jumpstarter_driver_opendal.client.OpendalClient`.
#[derive(Clone)]
pub struct OpendalClient(pub DriverClient);

impl OpendalClient {
    /// Opens a file (`rb` or `wb`).
    pub async fn open(&self, path: &str, mode: &str) -> Result<OpendalFile, ClientError> {
        let fd: Uuid = self.0.call("open", (path, mode)).await?;
        Ok(OpendalFile {
            client: self.clone(),
            fd,
        })
    }

    /// Streams a local file into `dst` on the storage (stored only if complete).
    pub async fn write_from_path(
        &self,
        dst: &str,
        src: &Path,
        opts: &TransferOptions,
    ) -> Result<(), ClientError> {
        if let Some(url) = url_of(src) {
            no_encoding_with_url(&url, opts.encoding)?;
            let f = self.open(dst, "wb").await?;
            let r = self
                .0
                .call::<()>("file_write", (f.fd, presigned_get(url)))
                .await;
            let closed = f.close().await;
            r?;
            return closed;
        }
        let (file, _) = open_local(src).await?;
        let f = self.open(dst, "wb").await?;
        let fd = f.fd;
        let this = self.clone();
        let r = self
            .0
            .upload(
                file_source(file, &opts.progress).await,
                opts.encoding,
                |h| async move { this.0.call::<()>("file_write", (fd, h)).await },
            )
            .await;
        let closed = f.close().await;
        match (&r, &closed) {
            (Ok(()), Ok(())) => opts.progress.finish(),
            _ => opts.progress.abandon(),
        }
        r?;
        closed
    }

    /// Streams `src` on the storage into a local file (which appears only once complete).
    pub async fn read_into_path(
        &self,
        src: &str,
        dst: &Path,
        opts: &TransferOptions,
    ) -> Result<(), ClientError> {
        if opts.encoding.is_none()
            && !opts.progress.is_hidden()
            && let Ok(meta) = self.stat(src).await
        {
            opts.progress.set_total(meta.content_length);
        }
        let f = self.open(src, "rb").await?;
        let fd = f.fd;
        let this = self.clone();
        let encoding = opts.encoding;
        let progress = opts.progress.clone();
        let r = write_local_atomically(dst, |file| async move {
            this.0
                .download(ProgressWriter::new(file, progress), encoding, |h| {
                    let this = this.clone();
                    async move { this.0.call::<()>("file_read", (fd, h)).await }
                })
                .await
        })
        .await;
        let closed = f.close().await;
        match (&r, &closed) {
            (Ok(()), Ok(())) => opts.progress.finish(),
            _ => opts.progress.abandon(),
        }
        r?;
        closed
    }

    /// Writes `data` to `path`.
    pub async fn write_bytes(&self, path: &str, data: Vec<u8>) -> Result<(), ClientError> {
        let f = self.open(path, "wb").await?;
        let fd = f.fd;
        let this = self.clone();
        let r = self
            .0
            .upload(
                UploadSource::reader(std::io::Cursor::new(data)),
                None,
                |h| async move { this.0.call::<()>("file_write", (fd, h)).await },
            )
            .await;
        let closed = f.close().await;
        r?;
        closed
    }

    /// Reads all of `path` (for small files).
    pub async fn read_bytes(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        let f = self.open(path, "rb").await?;
        let fd = f.fd;
        let this = self.clone();
        let (tx, mut rx) = tokio::io::duplex(64 * 1024);
        let collect = tokio::spawn(async move {
            let mut v = Vec::new();
            rx.read_to_end(&mut v).await.map(|_| v)
        });
        let r = self
            .0
            .download(tx, None, |h| async move {
                this.0.call::<()>("file_read", (fd, h)).await
            })
            .await;
        let closed = f.close().await;
        r?;
        closed?;
        collect
            .await
            .map_err(|e| ClientError::Io(std::io::Error::other(e)))?
            .map_err(ClientError::Io)
    }

    /// Metadata of `path`.
    pub async fn stat(&self, path: &str) -> Result<Metadata, ClientError> {
        self.0.call("stat", (path,)).await
    }

    /// Digest of `path`, computed on the exporter.
    pub async fn hash(&self, path: &str, algo: HashAlgo) -> Result<String, ClientError> {
        self.0.call("hash", (path, algo)).await
    }

    /// Whether `path` exists.
    pub async fn exists(&self, path: &str) -> Result<bool, ClientError> {
        self.0.call("exists", (path,)).await
    }

    /// Copies a file.
    pub async fn copy(&self, source: &str, target: &str) -> Result<(), ClientError> {
        self.0.call("copy", (source, target)).await
    }

    /// Renames a file.
    pub async fn rename(&self, source: &str, target: &str) -> Result<(), ClientError> {
        self.0.call("rename", (source, target)).await
    }

    /// Deletes a file.
    pub async fn delete(&self, path: &str) -> Result<(), ClientError> {
        self.0.call("delete", (path,)).await
    }

    /// Removes a directory tree.
    pub async fn remove_all(&self, path: &str) -> Result<(), ClientError> {
        self.0.call("remove_all", (path,)).await
    }

    /// Creates a directory (`path` ends with `/`).
    pub async fn create_dir(&self, path: &str) -> Result<(), ClientError> {
        self.0.call("create_dir", (path,)).await
    }

    /// Entries under `path` (`scan`: recursively).
    pub async fn list(
        &self,
        path: &str,
        recursive: bool,
    ) -> Result<BoxStream<'static, Result<String, ClientError>>, ClientError> {
        let method = if recursive { "scan" } else { "list" };
        self.0.streaming_call(method, (path,)).await
    }

    /// A request for `path` that the caller may send without the exporter, valid for
    /// `expire_second` seconds (services that presign, e.g. S3).
    pub async fn presign(
        &self,
        op: Presign,
        path: &str,
        expire_second: u64,
    ) -> Result<PresignedRequest, ClientError> {
        self.0.call(op.method(), (path, expire_second)).await
    }

    /// What the storage service supports.
    pub async fn capability(&self) -> Result<Capability, ClientError> {
        self.0.call("capability", ()).await
    }
}

// ------------------------------------------------------------------------------- CLI

pub(super) fn compression_arg() -> Arg {
    Arg::new("compression")
        .long("compression")
        .value_parser(["gzip", "xz", "bz2", "zstd", "auto"])
        .help(
            "Compression of the local file: sent compressed and expanded on the exporter \
             (or locally if the exporter does not accept it); `auto` recognises it from the \
             file's first bytes",
        )
}

pub(super) async fn encoding_for(
    m: &ArgMatches,
    path: &Path,
) -> Result<Option<ContentEncoding>, ClientError> {
    let given = m.get_one::<String>("compression").map(String::as_str);
    if let (Some(c), Some(url)) = (given, url_of(path)) {
        return Err(ClientError::Value(format!(
            "--compression {c} is not supported with an http(s) URL ({}): the exporter \
             fetches the URL's bytes as they are",
            url.split('?').next().unwrap_or_default()
        )));
    }
    match given {
        None => Ok(None),
        Some("auto") => detect_encoding(path).await,
        Some(name) => Ok(ContentEncoding::parse(name)),
    }
}

pub(super) fn file_arg(help: &'static str) -> Arg {
    Arg::new("file")
        .required(true)
        .value_parser(value_parser!(PathBuf))
        .help(help)
}

/// The `j storage` commands of storage muxes.
pub fn mux_cli() -> DriverCommand {
    DriverCommand {
        about: "Storage operations",
        build: build_mux,
        run: run_mux,
    }
}

fn build_mux(cmd: Command) -> Command {
    cmd.subcommand_required(true)
        .subcommand(Command::new("host").about("Connect storage to host"))
        .subcommand(Command::new("dut").about("Connect storage to dut"))
        .subcommand(Command::new("off").about("Disconnect storage"))
        .subcommand(
            Command::new("write-local-file")
                .about("Write a local file to the storage device (as is)")
                .arg(file_arg("The file to write")),
        )
        .subcommand(
            Command::new("read-local-file")
                .about("Read the storage device into a local file (created once complete)")
                .arg(file_arg("The file to create")),
        )
        .subcommand(
            Command::new("flash")
                .about("Flash an image: connect storage to host, write it, connect to dut")
                .arg(file_arg("The image to flash"))
                .arg(compression_arg())
                .arg(
                    Arg::new("verify")
                        .long("verify")
                        .action(ArgAction::SetTrue)
                        .help(
                            "After writing, compare the sha256 of the medium (computed on the \
                             exporter) with the image's, without reading the image back",
                        ),
                ),
        )
        .subcommand(
            Command::new("dump")
                .about("Dump the storage: connect to host, read it into a file, connect to dut")
                .arg(file_arg("The file to create"))
                .arg(compression_arg().value_parser(["gzip", "xz", "bz2", "zstd"]).help(
                    "Compress the dump (on the exporter if it accepts the encoding, else locally)",
                )),
        )
}

fn run_mux(client: DriverClient, matches: ArgMatches) -> CliFuture {
    Box::pin(async move {
        let mux = StorageMuxClient(client);
        let Some((name, m)) = matches.subcommand() else {
            return Err(ClientError::Value("missing storage command".into()));
        };
        // `host`, `dut` and `off` take no file (`get_one` would panic on them).
        let file = m
            .try_get_one::<PathBuf>("file")
            .ok()
            .flatten()
            .cloned()
            .unwrap_or_default();
        match name {
            // Upstream prints nothing here; a confirmation on stderr leaves stdout as
            // upstream's for scripts.
            "host" => mux
                .host()
                .await
                .map(|()| eprintln!("Storage connected to the host")),
            "dut" => mux
                .dut()
                .await
                .map(|()| eprintln!("Storage connected to the DUT")),
            "off" => mux.off().await.map(|()| eprintln!("Storage disconnected")),
            "write-local-file" => {
                let opts = TransferOptions {
                    encoding: None,
                    progress: progress_for("write", &file).await,
                };
                mux.write_local_file(&file, &opts).await.map(|_| ())
            }
            "read-local-file" => {
                let opts = TransferOptions {
                    encoding: None,
                    progress: Progress::stderr("read", None),
                };
                mux.read_local_file(&file, &opts).await
            }
            "flash" => {
                let opts = TransferOptions {
                    encoding: encoding_for(m, &file).await?,
                    progress: progress_for("flash", &file).await,
                };
                mux.flash(&file, &opts, m.get_flag("verify")).await?;
                if m.get_flag("verify") {
                    eprintln!("verified: the medium matches {}", file.display());
                }
                Ok(())
            }
            "dump" => {
                let opts = TransferOptions {
                    encoding: m
                        .get_one::<String>("compression")
                        .and_then(|c| ContentEncoding::parse(c)),
                    progress: Progress::stderr("dump", None),
                };
                mux.dump(&file, &opts).await
            }
            other => Err(ClientError::Value(format!(
                "unknown storage command {other}"
            ))),
        }
    })
}

/// The `j` commands of Opendal drivers.
pub fn opendal_cli() -> DriverCommand {
    DriverCommand {
        about: "Opendal storage",
        build: build_opendal,
        run: run_opendal,
    }
}

fn path_arg(name: &'static str, help: &'static str) -> Arg {
    Arg::new(name).required(true).help(help)
}

fn build_opendal(cmd: Command) -> Command {
    let p = || path_arg("path", "Path on the storage");
    cmd.subcommand_required(true)
        .subcommand(
            Command::new("write-from-path")
                .about("Copy a local file to the storage (stored only once complete)")
                .arg(path_arg("dst", "Destination path on the storage"))
                .arg(file_arg("Local file to send"))
                .arg(compression_arg()),
        )
        .subcommand(
            Command::new("read-into-path")
                .about("Copy a file from the storage into a local file (created once complete)")
                .arg(path_arg("src", "Source path on the storage"))
                .arg(file_arg("Local file to create")),
        )
        .subcommand(
            Command::new("stat")
                .about("Show a path's metadata")
                .arg(p()),
        )
        .subcommand(
            Command::new("hash")
                .about("Digest of a file, computed on the exporter")
                .arg(p())
                .arg(
                    Arg::new("algo")
                        .long("algo")
                        .value_parser(["md5", "sha256"])
                        .default_value("sha256"),
                ),
        )
        .subcommand(
            Command::new("exists")
                .about("Fail unless the path exists")
                .arg(p()),
        )
        .subcommand(Command::new("list").about("List a directory").arg(p()))
        .subcommand(
            Command::new("scan")
                .about("List a directory recursively")
                .arg(p()),
        )
        .subcommand(
            Command::new("copy")
                .about("Copy a file")
                .arg(path_arg("source", "Source"))
                .arg(path_arg("target", "Target")),
        )
        .subcommand(
            Command::new("rename")
                .about("Rename a file")
                .arg(path_arg("source", "Source"))
                .arg(path_arg("target", "Target")),
        )
        .subcommand(Command::new("delete").about("Delete a file").arg(p()))
        .subcommand(
            Command::new("remove-all")
                .about("Remove a directory tree")
                .arg(p()),
        )
        .subcommand(
            Command::new("create-dir")
                .about("Create a directory (path ends with /)")
                .arg(p()),
        )
        .subcommand(
            Command::new("write-bytes")
                .about("Write what comes on stdin into a file on the storage")
                .arg(p()),
        )
        .subcommand(
            Command::new("read-bytes")
                .about("Write a file of the storage to stdout")
                .arg(p()),
        )
        .subcommand(presign_command(
            "presign-stat",
            "Presign a stat (HEAD) request",
        ))
        .subcommand(presign_command(
            "presign-read",
            "Presign a read (GET) request",
        ))
        .subcommand(presign_command(
            "presign-write",
            "Presign a write (PUT) request",
        ))
        .subcommand(Command::new("capability").about("Show what the storage service supports"))
}

fn presign_command(name: &'static str, about: &'static str) -> Command {
    Command::new(name)
        .about(about)
        .arg(path_arg("path", "Path on the storage"))
        .arg(
            Arg::new("expire_second")
                .long("expire-second")
                .required(true)
                .value_parser(value_parser!(u64))
                .help("Seconds the request stays valid"),
        )
}

fn json<T: serde::Serialize>(v: &T) -> Result<(), ClientError> {
    let s = serde_json::to_string_pretty(v).map_err(ClientError::encoding)?;
    println!("{s}");
    Ok(())
}

fn run_opendal(client: DriverClient, matches: ArgMatches) -> CliFuture {
    Box::pin(async move {
        let c = OpendalClient(client);
        let Some((name, m)) = matches.subcommand() else {
            return Err(ClientError::Value("missing command".into()));
        };
        // Each subcommand defines only some of these arguments: `try_get_one` answers "absent"
        // where `get_one` would panic.
        let s = |k: &str| {
            m.try_get_one::<String>(k)
                .ok()
                .flatten()
                .cloned()
                .unwrap_or_default()
        };
        let file = m
            .try_get_one::<PathBuf>("file")
            .ok()
            .flatten()
            .cloned()
            .unwrap_or_default();
        match name {
            "write-from-path" => {
                let opts = TransferOptions {
                    encoding: encoding_for(m, &file).await?,
                    progress: progress_for("write", &file).await,
                };
                c.write_from_path(&s("dst"), &file, &opts).await
            }
            "read-into-path" => {
                let opts = TransferOptions {
                    encoding: None,
                    progress: Progress::stderr("read", None),
                };
                c.read_into_path(&s("src"), &file, &opts).await
            }
            "stat" => json(&c.stat(&s("path")).await?),
            "hash" => {
                let algo = if s("algo") == "md5" {
                    HashAlgo::Md5
                } else {
                    HashAlgo::Sha256
                };
                println!("{}", c.hash(&s("path"), algo).await?);
                Ok(())
            }
            "exists" => {
                if c.exists(&s("path")).await? {
                    Ok(())
                } else {
                    Err(ClientError::Value(format!(
                        "path {} does not exist",
                        s("path")
                    )))
                }
            }
            "list" | "scan" => {
                let mut entries = c.list(&s("path"), name == "scan").await?;
                while let Some(e) = entries.next().await {
                    println!("{}", e?);
                }
                Ok(())
            }
            "copy" => c.copy(&s("source"), &s("target")).await,
            "rename" => c.rename(&s("source"), &s("target")).await,
            "delete" => c.delete(&s("path")).await,
            "remove-all" => c.remove_all(&s("path")).await,
            "create-dir" => c.create_dir(&s("path")).await,
            "capability" => json(&c.capability().await?),
            "write-bytes" => {
                // Upstream reads all of stdin, then writes it: these are small files.
                let data = tokio::task::spawn_blocking(|| {
                    let mut data = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::stdin(), &mut data).map(|_| data)
                })
                .await
                .map_err(|e| ClientError::Io(std::io::Error::other(e)))?
                .map_err(ClientError::Io)?;
                c.write_bytes(&s("path"), data).await
            }
            "read-bytes" => {
                let data = c.read_bytes(&s("path")).await?;
                let mut out = std::io::stdout().lock();
                std::io::Write::write_all(&mut out, &data)
                    .and_then(|()| std::io::Write::flush(&mut out))
                    .map_err(ClientError::Io)
            }
            "presign-stat" | "presign-read" | "presign-write" => {
                let op = match name {
                    "presign-stat" => Presign::Stat,
                    "presign-read" => Presign::Read,
                    _ => Presign::Write,
                };
                let expire = m
                    .get_one::<u64>("expire_second")
                    .copied()
                    .unwrap_or_default();
                json(&c.presign(op, &s("path"), expire).await?)
            }
            other => Err(ClientError::Value(format!("unknown command {other}"))),
        }
    })
}
