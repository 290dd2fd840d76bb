//! The client library: connect to an exporter session, read its driver tree, call drivers.
//!
//! ```no_run
//! # async fn demo() -> Result<(), jumpstarter_core::ClientError> {
//! use jumpstarter_core::client::{ConnectOptions, ExporterSession};
//! // What `j` does inside `jmp shell`: JUMPSTARTER_HOST is a Unix path or host:port.
//! let session = ExporterSession::connect("/tmp/jumpstarter.sock", &ConnectOptions::from_env()).await?;
//! let power = session.driver("power")?;
//! power.call::<()>("on", ()).await?;
//! # Ok(()) }
//! ```

use std::{collections::BTreeMap, path::PathBuf, pin::Pin, sync::Arc};

use bytes::Bytes;

use futures::{StreamExt, stream::BoxStream};
use hyper_util::rt::TokioIo;
use jumpstarter_proto::v1::FrameType;
use jumpstarter_proto::v1::{
    DriverCallRequest, GetStatusRequest, GetStatusResponse, StreamRequest,
    StreamingDriverCallRequest, exporter_service_client::ExporterServiceClient,
};
use serde::{Serialize, de::DeserializeOwned};
use std::future::Future;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tonic::{
    Status,
    metadata::{MetadataMap, MetadataValue},
    service::interceptor::InterceptedService,
    transport::{Certificate, ClientTlsConfig, Endpoint, Uri},
};

use crate::{
    DriverError,
    client::{
        channel::{CallMetadata, GrpcChannel},
        error::ClientError,
    },
    driver::{CLIENT_LABEL, NAME_LABEL},
    value::{self, Value},
    wire::{
        frames::{AbortOnDrop, CHUNK, EndOfStream, Frame, splice_with},
        resource::{
            ChunkWrite, ContentEncoding, PipeReader, PipeWriter, ResourceHandle,
            StreamRequestMetadata, decoder, encoder, pipe,
        },
        settings::{CONNECTION_WINDOW, PASSPHRASE_METADATA, STREAM_WINDOW},
        stream_rpc,
    },
};

/// How to reach an exporter session.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// A Unix socket path (local mode).
    Unix(PathBuf),
    /// `host:port` (direct mode).
    Tcp(String),
}

impl Target {
    /// Parses `JUMPSTARTER_HOST`: `host:port` with a valid port is TCP, anything else a path.
    pub fn parse(host: &str) -> Self {
        if let Some((h, p)) = host.rsplit_once(':')
            && !h.is_empty()
            && !h.contains('/')
            && p.parse::<u16>().is_ok()
        {
            return Target::Tcp(host.to_string());
        }
        Target::Unix(PathBuf::from(host.strip_prefix("unix://").unwrap_or(host)))
    }
}

/// Options for direct (TCP) connections.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// Plaintext HTTP/2 instead of TLS (`JMP_GRPC_INSECURE=1`).
    pub insecure: bool,
    /// Passphrase sent with every RPC (`JMP_GRPC_PASSPHRASE`).
    pub passphrase: Option<String>,
    /// Extra CA certificate (PEM) to trust for TLS (`JMP_GRPC_CA`, a file path).
    pub ca_pem: Option<Vec<u8>>,
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| matches!(v.as_str(), "1" | "true" | "True" | "yes"))
}

impl ConnectOptions {
    /// Reads `JMP_GRPC_INSECURE` / `JUMPSTARTER_GRPC_INSECURE`, `JMP_GRPC_PASSPHRASE` and
    /// `JMP_GRPC_CA`, as `jmp shell` sets them for the commands it runs.
    pub fn from_env() -> Self {
        Self {
            insecure: env_flag("JMP_GRPC_INSECURE") || env_flag("JUMPSTARTER_GRPC_INSECURE"),
            passphrase: std::env::var("JMP_GRPC_PASSPHRASE")
                .ok()
                .filter(|p| !p.is_empty()),
            ca_pem: std::env::var_os("JMP_GRPC_CA").and_then(|p| std::fs::read(p).ok()),
        }
    }
}

/// The innermost cause under a status made locally from a transport failure (e.g. which
/// router connection a tunnel lost), when it says more than the status message; statuses
/// received from the peer have no such cause.
fn transport_cause(status: &Status) -> Option<String> {
    let mut cause = None;
    let mut src = std::error::Error::source(status);
    while let Some(e) = src {
        cause = Some(crate::error_chain(&e));
        src = e.source();
    }
    cause.filter(|c| !c.is_empty() && !status.message().contains(c.as_str()))
}

/// A channel with call metadata attached.
pub type SessionChannel = InterceptedService<GrpcChannel, CallMetadata>;

/// Opens a gRPC channel to an exporter session.
pub async fn connect_channel(
    host: &str,
    opts: &ConnectOptions,
) -> Result<SessionChannel, ClientError> {
    let connect_err = |e: tonic::transport::Error| ClientError::connect(host, e);
    let channel = match Target::parse(host) {
        Target::Unix(path) => {
            let endpoint = Endpoint::from_static("http://localhost")
                .initial_stream_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .max_frame_size(crate::wire::frames::MAX_FRAME);
            endpoint
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let s = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(TokioIo::new(s))
                    }
                }))
                .await
                .map_err(connect_err)?
        }
        Target::Tcp(addr) => {
            let scheme = if opts.insecure { "http" } else { "https" };
            let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
                .map_err(connect_err)?
                .tcp_nodelay(true)
                .initial_stream_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .max_frame_size(crate::wire::frames::MAX_FRAME)
                .http2_keep_alive_interval(std::time::Duration::from_secs(20))
                .keep_alive_while_idle(true);
            if !opts.insecure {
                let mut tls = ClientTlsConfig::new().with_native_roots();
                if let Some(ca) = &opts.ca_pem {
                    tls = tls.ca_certificate(Certificate::from_pem(ca));
                }
                endpoint = endpoint.tls_config(tls).map_err(connect_err)?;
            }
            match endpoint.connect().await {
                Ok(channel) => channel,
                // Say which setting does not match the exporter's, when that is why.
                Err(e) if !opts.insecure => {
                    return Err(ClientError::connect(
                        host,
                        super::tls_mismatch::classify(&addr, e).await,
                    ));
                }
                Err(e) if super::tls_mismatch::closed_at_handshake(&e) => {
                    return Err(ClientError::connect(
                        host,
                        super::tls_mismatch::classify_plaintext(&addr, e.into()).await,
                    ));
                }
                Err(e) => return Err(connect_err(e)),
            }
        }
    };
    let channel = GrpcChannel::new(channel);
    let mut entries = Vec::new();
    if let Some(p) = &opts.passphrase {
        let v = MetadataValue::try_from(p.as_str())
            .map_err(|_| ClientError::connect(host, "the passphrase must be printable ASCII"))?;
        entries.push((PASSPHRASE_METADATA, v));
    }
    Ok(InterceptedService::new(channel, CallMetadata::new(entries)))
}

/// One driver as the client sees it (from `GetReport`).
#[derive(Debug, Clone)]
pub struct ClientNode {
    /// Driver uuid.
    pub uuid: String,
    /// Dotted path from the root (`""` for the root).
    pub path: String,
    /// Reported labels.
    pub labels: BTreeMap<String, String>,
    /// Description.
    pub description: Option<String>,
    /// Help per CLI command.
    pub methods_description: BTreeMap<String, String>,
    /// Children by name, in report order.
    pub children: Vec<(String, Arc<ClientNode>)>,
}

impl ClientNode {
    /// The `jumpstarter.dev/client` label.
    pub fn client_class(&self) -> &str {
        self.labels
            .get(CLIENT_LABEL)
            .map(String::as_str)
            .unwrap_or("")
    }
}

/// Rebuilds the tree from a report list (parents before children, as upstream).
fn build_tree(
    reports: Vec<jumpstarter_proto::v1::DriverInstanceReport>,
) -> Result<Arc<ClientNode>, ClientError> {
    use std::collections::HashMap;
    let mut children_of: HashMap<String, Vec<(String, String)>> = HashMap::new();
    let mut by_uuid: HashMap<String, jumpstarter_proto::v1::DriverInstanceReport> = HashMap::new();
    let mut root = None;
    for r in reports {
        match &r.parent_uuid {
            Some(p) => {
                if !by_uuid.contains_key(p) {
                    return Err(ClientError::Report(format!(
                        "driver {} appears before its parent {p}",
                        r.uuid
                    )));
                }
                let name = r
                    .labels
                    .get(NAME_LABEL)
                    .cloned()
                    .unwrap_or_else(|| r.uuid.clone());
                children_of
                    .entry(p.clone())
                    .or_default()
                    .push((name, r.uuid.clone()));
            }
            None if root.is_none() => root = Some(r.uuid.clone()),
            None => {}
        }
        // A proxy repeats its target's uuid; the first report of a uuid is the one we keep.
        by_uuid.entry(r.uuid.clone()).or_insert(r);
    }
    let root = root.ok_or_else(|| ClientError::Report("no root driver".into()))?;
    fn make(
        uuid: &str,
        path: String,
        by_uuid: &HashMap<String, jumpstarter_proto::v1::DriverInstanceReport>,
        children_of: &HashMap<String, Vec<(String, String)>>,
        depth: usize,
    ) -> Result<Arc<ClientNode>, ClientError> {
        if depth > 64 {
            return Err(ClientError::Report(
                "driver tree deeper than 64 levels".into(),
            ));
        }
        let r = by_uuid
            .get(uuid)
            .ok_or_else(|| ClientError::Report(format!("unknown driver {uuid}")))?;
        let mut children = Vec::new();
        for (name, child) in children_of.get(uuid).into_iter().flatten() {
            let p = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            children.push((
                name.clone(),
                make(child, p, by_uuid, children_of, depth + 1)?,
            ));
        }
        Ok(Arc::new(ClientNode {
            uuid: uuid.to_string(),
            path,
            labels: r.labels.clone().into_iter().collect(),
            description: r.description.clone(),
            methods_description: r.methods_description.clone().into_iter().collect(),
            children,
        }))
    }
    make(&root, String::new(), &by_uuid, &children_of, 0)
}

/// A connected exporter session with its driver tree.
#[derive(Clone)]
pub struct ExporterSession {
    channel: SessionChannel,
    labels: BTreeMap<String, String>,
    root: Arc<ClientNode>,
}

impl ExporterSession {
    /// Connects to `host` (Unix path or `host:port`) and reads the driver tree.
    pub async fn connect(host: &str, opts: &ConnectOptions) -> Result<Self, ClientError> {
        let channel = connect_channel(host, opts).await?;
        match Self::from_channel(channel).await {
            // A plaintext client whose first call lost its connection (the status was made
            // here, from a transport error): say so if the exporter speaks TLS.
            Err(ClientError::Rpc { rpc, status })
                if opts.insecure && std::error::Error::source(&*status).is_some() =>
            {
                let Target::Tcp(addr) = Target::parse(host) else {
                    return Err(ClientError::Rpc { rpc, status });
                };
                let cause = super::tls_mismatch::classify_plaintext(&addr, status).await;
                match cause.downcast::<Status>() {
                    Ok(status) => Err(ClientError::Rpc { rpc, status }),
                    Err(cause) => Err(ClientError::connect(host, cause)),
                }
            }
            other => other,
        }
    }

    /// Reads the driver tree over an existing channel.
    pub async fn from_channel(channel: SessionChannel) -> Result<Self, ClientError> {
        let report = ExporterServiceClient::new(channel.clone())
            .get_report(())
            .await
            .map_err(|s| ClientError::rpc("GetReport", s))?
            .into_inner();
        let root = build_tree(report.reports)?;
        Ok(Self {
            channel,
            labels: report.labels.into_iter().collect(),
            root,
        })
    }

    /// The exporter's labels.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// The root driver.
    pub fn root(&self) -> DriverClient {
        DriverClient {
            channel: self.channel.clone(),
            node: self.root.clone(),
        }
    }

    /// The driver at a dotted path (`power`, `storage.disk`).
    pub fn driver(&self, path: &str) -> Result<DriverClient, ClientError> {
        let mut node = self.root.clone();
        for part in path.split('.').filter(|p| !p.is_empty()) {
            let next = node
                .children
                .iter()
                .find(|(n, _)| n == part)
                .map(|(_, c)| c.clone());
            node = match next {
                Some(n) => n,
                None => {
                    return Err(ClientError::NoSuchDriver {
                        path: path.to_string(),
                        available: all_paths(&self.root).join(", "),
                    });
                }
            };
        }
        Ok(DriverClient {
            channel: self.channel.clone(),
            node,
        })
    }

    /// The exporter's status (`GetStatus`).
    pub async fn status(&self) -> Result<GetStatusResponse, ClientError> {
        ExporterServiceClient::new(self.channel.clone())
            .get_status(GetStatusRequest {})
            .await
            .map(|r| r.into_inner())
            .map_err(|s| ClientError::rpc("GetStatus", s))
    }
}

fn all_paths(node: &ClientNode) -> Vec<String> {
    let mut out = Vec::new();
    for (_, c) in &node.children {
        out.push(c.path.clone());
        out.extend(all_paths(c));
    }
    out
}

/// Positional arguments of a driver call.
pub trait IntoArgs {
    /// Encodes the arguments.
    fn into_args(self) -> Result<Vec<Value>, ClientError>;
}

impl IntoArgs for Vec<Value> {
    fn into_args(self) -> Result<Vec<Value>, ClientError> {
        Ok(self)
    }
}

impl IntoArgs for () {
    fn into_args(self) -> Result<Vec<Value>, ClientError> {
        Ok(Vec::new())
    }
}

macro_rules! tuple_args {
    ($($t:ident),+) => {
        impl<$($t: Serialize),+> IntoArgs for ($($t,)+) {
            #[allow(non_snake_case)]
            fn into_args(self) -> Result<Vec<Value>, ClientError> {
                let ($($t,)+) = self;
                Ok(vec![$(value::to_value(&$t).map_err(ClientError::encoding)?),+])
            }
        }
    };
}
tuple_args!(A);
tuple_args!(A, B);
tuple_args!(A, B, C);
tuple_args!(A, B, C, D);

/// A handle on one driver of a connected exporter.
#[derive(Clone)]
pub struct DriverClient {
    channel: SessionChannel,
    node: Arc<ClientNode>,
}

impl DriverClient {
    /// What the exporter reported about this driver.
    pub fn node(&self) -> &ClientNode {
        &self.node
    }

    /// The driver's path (`power`).
    pub fn path(&self) -> &str {
        &self.node.path
    }

    /// A child by name.
    pub fn child(&self, name: &str) -> Option<DriverClient> {
        self.node
            .children
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| DriverClient {
                channel: self.channel.clone(),
                node: c.clone(),
            })
    }

    /// The children, in report order.
    pub fn children(&self) -> Vec<(String, DriverClient)> {
        self.node
            .children
            .iter()
            .map(|(n, c)| {
                (
                    n.clone(),
                    DriverClient {
                        channel: self.channel.clone(),
                        node: c.clone(),
                    },
                )
            })
            .collect()
    }

    fn call_error(&self, method: &str, status: &Status) -> ClientError {
        if status.code() == tonic::Code::Unauthenticated {
            return ClientError::Authentication(status.message().to_string());
        }
        let mut error = DriverError::from_status(status);
        if let (DriverError::Failed(msg), Some(cause)) = (&mut error, transport_cause(status)) {
            msg.push_str(": ");
            msg.push_str(&cause);
        }
        ClientError::Call {
            driver: self.node.path.clone(),
            method: method.to_string(),
            error,
        }
    }

    /// Calls a unary method and decodes its result.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        args: impl IntoArgs,
    ) -> Result<T, ClientError> {
        let raw = self.call_raw(method, args.into_args()?).await?;
        value::from_value(raw).map_err(|e| ClientError::encoding_because(method, e))
    }

    /// Calls a unary method, returning the raw `Value`.
    pub async fn call_raw(&self, method: &str, args: Vec<Value>) -> Result<Value, ClientError> {
        let resp = ExporterServiceClient::new(self.channel.clone())
            .driver_call(DriverCallRequest {
                uuid: self.node.uuid.clone(),
                method: method.to_string(),
                args,
            })
            .await
            .map_err(|s| self.call_error(method, &s))?;
        Ok(resp.into_inner().result.unwrap_or(Value {
            kind: Some(prost_types::value::Kind::NullValue(0)),
        }))
    }

    /// Calls a streaming method; each item is decoded as `T`.
    pub async fn streaming_call<T: DeserializeOwned + Send + 'static>(
        &self,
        method: &str,
        args: impl IntoArgs,
    ) -> Result<BoxStream<'static, Result<T, ClientError>>, ClientError> {
        let resp = ExporterServiceClient::new(self.channel.clone())
            .streaming_driver_call(StreamingDriverCallRequest {
                uuid: self.node.uuid.clone(),
                method: method.to_string(),
                args: args.into_args()?,
            })
            .await
            .map_err(|s| self.call_error(method, &s))?;
        let this = self.clone();
        let method = method.to_string();
        Ok(resp
            .into_inner()
            .map(move |item| {
                let item = item.map_err(|s| this.call_error(&method, &s))?;
                let v = item.result.unwrap_or_default();
                value::from_value(v).map_err(|e| ClientError::encoding_because(&*method, e))
            })
            .boxed())
    }

    async fn open_router_stream(
        &self,
        request: &StreamRequestMetadata,
        eof: EndOfStream,
    ) -> Result<(MetadataMap, RouterStreamEnds), ClientError> {
        let (tx, rx) = tokio::sync::mpsc::channel::<StreamRequest>(1);
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "request",
            http::HeaderValue::try_from(request.to_json()).map_err(ClientError::encoding)?,
        );
        // Spoken straight over HTTP/2 (see `stream_rpc`): tonic's codec would copy every
        // chunk once more on each side.
        let (headers, inbound) = stream_rpc::call(
            self.channel.clone(),
            headers,
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )
        .await
        .map_err(|status| self.call_error("stream", &status))?;
        let meta = MetadataMap::from_headers(headers);
        let (upload, upload_source) = pipe();
        let (download_sink, download) = pipe();
        let mut outbound = Box::pin(splice_with::<_, StreamRequest, _, _, _, _, _>(
            inbound,
            download_sink,
            upload_source,
            eof,
            (),
        ));
        let task = AbortOnDrop(tokio::spawn(async move {
            while let Some(item) = outbound.next().await {
                match item {
                    Ok(frame) => {
                        if tx.send(frame).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        // Tell the peer the transfer broke (our exporter fails the driver's
                        // read on RST_STREAM), then cancel the call, which upstream
                        // exporters see as an error too.
                        tracing::debug!("resource upload broken: {e}", e = crate::error_chain(&e));
                        let _ = tx.try_send(StreamRequest::new(Vec::new(), FrameType::RstStream));
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        break;
                    }
                }
            }
        }));
        Ok((
            meta,
            RouterStreamEnds {
                upload,
                download,
                task,
            },
        ))
    }

    /// Opens a byte stream to an `#[export(stream)]` method (upstream `@exportstream`).
    pub async fn open_stream(
        &self,
        method: &str,
    ) -> Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static, ClientError> {
        self.open_stream_ends(method).await
    }

    /// [`DriverClient::open_stream`] as its two ends, for a relay:
    /// [`RouterStreamEnds::splice`] joins a connection to them without copying the bytes.
    pub async fn open_stream_ends(&self, method: &str) -> Result<RouterStreamEnds, ClientError> {
        let uuid = parse_uuid(&self.node.uuid)?;
        let (_, ends) = self
            .open_router_stream(
                &StreamRequestMetadata::Driver {
                    uuid,
                    method: method.to_string(),
                },
                EndOfStream::Lenient,
            )
            .await?;
        Ok(ends)
    }

    /// Opens a resource stream for this driver, asking the exporter to accept bytes in
    /// `encoding` (the encoding of the data on the client's side).
    ///
    /// Most callers want [`DriverClient::upload`] or [`DriverClient::download`], which also
    /// run the driver call and fall back to local (de)compression.
    pub async fn open_resource(
        &self,
        encoding: Option<ContentEncoding>,
    ) -> Result<ClientResource, ClientError> {
        let uuid = parse_uuid(&self.node.uuid)?;
        let (meta, ends) = self
            .open_router_stream(
                &StreamRequestMetadata::Resource {
                    uuid,
                    x_jmp_content_encoding: encoding,
                },
                EndOfStream::GoawayRequired,
            )
            .await?;
        let raw = meta
            .get("resource")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| ClientError::Report("exporter sent no resource handle".into()))?;
        let handle: ResourceHandle = serde_json::from_str(raw).map_err(|e| {
            ClientError::Report(format!(
                "bad resource handle {raw:?}: {e}",
                e = crate::error_chain(&e)
            ))
        })?;
        let accepted = meta
            .get("x_jmp_accept_encoding")
            .and_then(|v| v.to_str().ok())
            .and_then(ContentEncoding::parse)
            .filter(|a| Some(*a) == encoding);
        Ok(ClientResource {
            handle,
            accepted,
            ends,
        })
    }

    /// Streams `source` to this driver: opens a resource, runs `call` with its handle (the
    /// driver method that reads it) while sending, and returns what `call` returns.
    ///
    /// `encoding` is the encoding of `source`: the exporter decodes it if it accepts it,
    /// otherwise it is decoded here and sent plain. Fails if reading `source` fails, if the
    /// call fails, or if the driver returns without reading everything.
    pub async fn upload<T, F, Fut>(
        &self,
        source: UploadSource,
        encoding: Option<ContentEncoding>,
        call: F,
    ) -> Result<T, ClientError>
    where
        F: FnOnce(ResourceHandle) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let res = self.open_resource(encoding).await?;
        let local_decode = if res.accepted.is_some() {
            None
        } else {
            encoding
        };
        let ClientResource { handle, ends, .. } = res;
        let handle = plain_if_not_accepted(handle, local_decode.is_some());
        let RouterStreamEnds {
            mut upload,
            download: _download,
            task: _task,
        } = ends;
        let mut pump = AbortOnDrop(tokio::spawn(async move {
            let sent = match (source, local_decode) {
                (UploadSource::Chunks(chunks), None) => send_chunks(chunks, &mut upload).await,
                (UploadSource::Chunks(chunks), Some(enc)) => {
                    let reader = tokio_util::io::StreamReader::new(chunks);
                    send_read(Box::pin(reader), Some(enc), &mut upload).await
                }
                (UploadSource::Reader(reader), dec) => send_read(reader, dec, &mut upload).await,
            };
            match sent {
                Ok(()) => {
                    upload.finish_now();
                    Ok(())
                }
                Err(e) => {
                    let msg = crate::error_chain(&e);
                    upload.fail(e);
                    Err(std::io::Error::other(msg))
                }
            }
        }));
        let result = call(handle).await;
        let pumped = match &result {
            Ok(_) => tokio::time::timeout(DRAIN_TIMEOUT, &mut pump.0)
                .await
                .map_err(|_| {
                    std::io::Error::other("the driver returned before reading all the data")
                })
                .and_then(|r| r.map_err(std::io::Error::other).and_then(|r| r)),
            Err(_) => {
                pump.0.abort();
                match tokio::time::timeout(std::time::Duration::from_millis(1), &mut pump.0).await {
                    Ok(Ok(Err(e))) => Err(e),
                    _ => Ok(()),
                }
            }
        };
        match (result, pumped) {
            (Ok(v), Ok(())) => Ok(v),
            (Ok(_), Err(e)) => Err(ClientError::Io(e)),
            (Err(call), Err(e)) => Err(ClientError::Io(std::io::Error::other(format!(
                "{e} (and the driver call failed: {call})",
                e = crate::error_chain(&e)
            )))),
            (Err(call), Ok(())) => Err(call),
        }
    }

    /// Streams what this driver sends into `sink`: opens a resource, runs `call` with its
    /// handle (the driver method that writes it) while receiving, shuts `sink` down at the
    /// end and returns what `call` returns.
    ///
    /// `encoding` is the encoding wanted in `sink`: the exporter encodes if it accepts it,
    /// otherwise it is encoded here. Fails if the transfer breaks (an error frame or a
    /// stream cut before the end), if writing `sink` fails, or if the call fails.
    pub async fn download<T, F, Fut, W>(
        &self,
        sink: W,
        encoding: Option<ContentEncoding>,
        call: F,
    ) -> Result<T, ClientError>
    where
        W: ChunkWrite + 'static,
        F: FnOnce(ResourceHandle) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let res = self.open_resource(encoding).await?;
        let local_encode = if res.accepted.is_some() {
            None
        } else {
            encoding
        };
        let ClientResource { handle, ends, .. } = res;
        let handle = plain_if_not_accepted(handle, local_encode.is_some());
        let RouterStreamEnds {
            upload,
            mut download,
            task: _task,
        } = ends;
        upload.finish_now();
        let mut pump = AbortOnDrop(tokio::spawn(async move {
            // Chunks go to the sink as they come, whole; an encoder's small writes are
            // gathered.
            let Some(enc) = local_encode else {
                let mut sink = sink;
                while let Some(chunk) = download.chunk().await? {
                    sink.write_chunk(chunk).await?;
                }
                return sink.shutdown().await;
            };
            let mut writer = encoder(
                tokio::io::BufWriter::with_capacity(LOCAL_IO_BUFFER, sink),
                Some(enc),
            );
            while let Some(chunk) = download.chunk().await? {
                writer.write_all(&chunk).await?;
            }
            writer.shutdown().await
        }));
        let result = call(handle).await;
        let pumped = match &result {
            Ok(_) => tokio::time::timeout(DRAIN_TIMEOUT, &mut pump.0)
                .await
                .map_err(|_| {
                    std::io::Error::other("the driver returned without ending the data stream")
                })
                .and_then(|r| r.map_err(std::io::Error::other).and_then(|r| r)),
            Err(_) => {
                pump.0.abort();
                Ok(())
            }
        };
        match (result, pumped) {
            (Ok(v), Ok(())) => Ok(v),
            (Ok(_), Err(e)) => Err(ClientError::Io(e)),
            (Err(call), _) => Err(call),
        }
    }
}

/// When we (de)compress locally the bytes on the wire are plain, so the handle we pass
/// must say so: upstream exporters decode by the handle's encoding even when they did not
/// accept it.
fn plain_if_not_accepted(handle: ResourceHandle, local: bool) -> ResourceHandle {
    match handle {
        ResourceHandle::ClientStream { uuid, .. } if local => ResourceHandle::ClientStream {
            uuid,
            x_jmp_content_encoding: None,
        },
        other => other,
    }
}

/// What [`DriverClient::upload`] sends.
pub enum UploadSource {
    /// The bytes of a reader, read in pieces of up to [`CHUNK`] bytes.
    Reader(Pin<Box<dyn AsyncRead + Send>>),
    /// Chunks sent as they come, without a copy (larger ones are cut to [`CHUNK`] bytes).
    Chunks(Pin<Box<dyn futures::Stream<Item = std::io::Result<Bytes>> + Send>>),
}

impl UploadSource {
    /// The bytes of `reader`.
    pub fn reader(reader: impl AsyncRead + Send + 'static) -> Self {
        Self::Reader(Box::pin(reader))
    }

    /// A stream of chunks: an error item fails the upload.
    pub fn chunks(
        chunks: impl futures::Stream<Item = std::io::Result<Bytes>> + Send + 'static,
    ) -> Self {
        Self::Chunks(Box::pin(chunks))
    }

    /// A local file from where it stands, read by a blocking thread straight into the
    /// chunks sent ([`crate::wire::resource::file_chunks`]): the fastest way to send a file.
    pub fn file(file: std::fs::File) -> Self {
        Self::chunks(crate::wire::resource::file_chunks(file))
    }
}

impl std::fmt::Debug for UploadSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UploadSource::Reader(_) => "UploadSource::Reader",
            UploadSource::Chunks(_) => "UploadSource::Chunks",
        })
    }
}

/// Sends `chunks` as they are, cutting those over [`CHUNK`] bytes.
async fn send_chunks(
    mut chunks: Pin<Box<dyn futures::Stream<Item = std::io::Result<Bytes>> + Send>>,
    upload: &mut PipeWriter,
) -> std::io::Result<()> {
    while let Some(chunk) = chunks.next().await {
        let mut chunk = chunk?;
        while chunk.len() > CHUNK {
            upload.send(chunk.split_to(CHUNK)).await?;
        }
        upload.send(chunk).await?;
    }
    Ok(())
}

/// Sends what `reader` yields, decoded from `decode` if given, in chunks of [`CHUNK`] bytes.
async fn send_read(
    reader: Pin<Box<dyn AsyncRead + Send>>,
    decode: Option<ContentEncoding>,
    upload: &mut PipeWriter,
) -> std::io::Result<()> {
    // Large reads from the source (a file: each read is a blocking-pool hop).
    let mut reader = decoder(
        tokio::io::BufReader::with_capacity(LOCAL_IO_BUFFER, reader),
        decode,
    );
    // Chunks are cut from large blocks without copying: a block is allocated once per
    // LOCAL_IO_BUFFER bytes, and freed when the last chunk of it has been sent.
    let mut buf = bytes::BytesMut::new();
    loop {
        if buf.capacity() < CHUNK {
            buf.reserve(LOCAL_IO_BUFFER);
        }
        match reader
            .read_buf(&mut bytes::BufMut::limit(&mut buf, CHUNK))
            .await?
        {
            0 => return Ok(()),
            _ => upload.send(buf.split().freeze()).await?,
        }
    }
}

/// Buffer between a transfer and the caller's local source or sink.
const LOCAL_IO_BUFFER: usize = 1024 * 1024;

/// How long a transfer may take to drain once the driver call has returned.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The client's ends of a `RouterService.Stream`: write to `upload`, read from `download`.
/// Dropping it cancels the stream.
pub struct RouterStreamEnds {
    /// Bytes for the driver: finish it to send GOAWAY; failing or dropping it aborts.
    pub upload: PipeWriter,
    /// Bytes from the driver; fails if the transfer breaks.
    pub download: PipeReader,
    task: AbortOnDrop<()>,
}

impl RouterStreamEnds {
    /// Relays bytes both ways between `conn` and the stream until both directions have
    /// ended, as `tokio::io::copy_bidirectional` does (an end of file from one side shuts
    /// down writing to the other), but without copying them: each read from `conn` becomes
    /// one chunk of the stream in the buffer it was read into, and each chunk from the stream
    /// is written to `conn` from its own buffer. The first error of either direction ends
    /// both.
    pub async fn splice<C>(mut self, conn: C) -> std::io::Result<()>
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let (mut from_conn, mut to_conn) = tokio::io::split(conn);
        let upload = &mut self.upload;
        let download = &mut self.download;
        let up = async {
            let mut buf = bytes::BytesMut::new();
            loop {
                use bytes::BufMut;
                buf.reserve(crate::wire::frames::CHUNK);
                let mut room = (&mut buf).limit(crate::wire::frames::CHUNK);
                if from_conn.read_buf(&mut room).await? == 0 {
                    upload.close();
                    return Ok::<_, std::io::Error>(());
                }
                upload.send(buf.split().freeze()).await?;
            }
        };
        let down = async {
            while let Some(chunk) = download.next().await {
                to_conn.write_all(&chunk?).await?;
            }
            to_conn.shutdown().await
        };
        tokio::try_join!(up, down).map(|_| ())
    }
}

impl AsyncRead for RouterStreamEnds {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.download).poll_read(cx, buf)
    }
}

impl AsyncWrite for RouterStreamEnds {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.upload).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.upload).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.upload).poll_shutdown(cx)
    }
}

/// A resource stream opened by the client ([`DriverClient::open_resource`]).
pub struct ClientResource {
    /// The handle to pass to the driver method.
    pub handle: ResourceHandle,
    /// The encoding the exporter accepted (it decodes what we send and encodes what it
    /// sends); `None` when the bytes on the wire must be plain.
    pub accepted: Option<ContentEncoding>,
    /// The stream's ends (dropping them cancels the stream).
    pub ends: RouterStreamEnds,
}

fn parse_uuid(s: &str) -> Result<uuid::Uuid, ClientError> {
    uuid::Uuid::parse_str(s).map_err(|e| {
        ClientError::Report(format!(
            "bad driver uuid {s:?}: {e}",
            e = crate::error_chain(&e)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(
            Target::parse("127.0.0.1:1234"),
            Target::Tcp("127.0.0.1:1234".into())
        );
        assert_eq!(
            Target::parse("[::1]:1234"),
            Target::Tcp("[::1]:1234".into())
        );
        assert_eq!(
            Target::parse("/tmp/x/socket"),
            Target::Unix("/tmp/x/socket".into())
        );
        assert_eq!(
            Target::parse("host:notaport"),
            Target::Unix("host:notaport".into())
        );
        assert_eq!(Target::parse("unix:///a/b"), Target::Unix("/a/b".into()));
    }
}
