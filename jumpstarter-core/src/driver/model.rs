//! The driver model: what a driver is, how it is called, and the errors it returns.
//!
//! A driver is a value implementing [`Driver`]. Nobody writes that trait by hand: put
//! `#[driver(client = "...")]` on an `impl` block and mark the callable methods:
//!
//! ```
//! use jumpstarter_core::{driver, CallContext, DriverError};
//!
//! /// A lamp that remembers whether it is lit.
//! #[derive(Default)]
//! pub struct Lamp { lit: std::sync::atomic::AtomicBool }
//!
//! #[driver(client = "my_lab.client.LampClient")]
//! impl Lamp {
//!     /// `DriverCall("switch", [true])` -> the previous state.
//!     #[export]
//!     async fn switch(&self, ctx: &CallContext, on: bool) -> Result<bool, DriverError> {
//!         ctx.log_info(format!("lamp {}", if on { "on" } else { "off" }));
//!         Ok(self.lit.swap(on, std::sync::atomic::Ordering::SeqCst))
//!     }
//! }
//! ```
//!
//! - `#[export]` — unary (`DriverCall`): arguments decoded positionally from
//!   `google.protobuf.Value`, result encoded back (see [`crate::value`]);
//! - `#[export(streaming)]` — server streaming (`StreamingDriverCall`): return
//!   `Result<BoxStream<'static, Result<T, DriverError>>, DriverError>`;
//! - `#[export(stream)]` — a byte stream (`RouterService.Stream` with a `driver` request):
//!   return `Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static, DriverError>`.
//!
//! A method may take `&CallContext` as its first argument to log, or to open resource
//! streams (bytes the client sends or receives by handle, see [`CallContext::resource`]).

use std::{collections::BTreeMap, future::Future, pin::Pin, sync::Arc};

use futures::{StreamExt, stream::BoxStream};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};

use super::{error::DriverError, log::LogSink};
use crate::{
    value::{self, Value},
    wire::{
        presigned,
        resource::{ResourceHandle, ResourceRegistry, ResourceStream},
    },
};

/// A boxed, sendable future, as driver dispatch returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The results of a streaming call, already encoded.
pub type ValueStream = BoxStream<'static, Result<Value, DriverError>>;

/// A bidirectional byte stream, as `#[export(stream)]` methods return.
pub trait Duplex: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Duplex for T {}

/// A boxed [`Duplex`].
pub type BoxDuplex = Box<dyn Duplex>;

/// What a driver method can use besides its arguments: logging and resource streams.
#[derive(Clone)]
pub struct CallContext {
    pub(crate) driver_name: Arc<str>,
    /// The uuid of the driver called, when a session calls it.
    pub(crate) driver_uuid: Option<uuid::Uuid>,
    pub(crate) resources: Arc<ResourceRegistry>,
    pub(crate) logs: LogSink,
    /// Where this session's console transcripts go, if it keeps them.
    pub(crate) transcripts: Option<Arc<dyn super::transcript::Transcripts>>,
}

impl CallContext {
    /// A context detached from any session (for unit tests of drivers).
    pub fn detached(driver_name: &str) -> Self {
        Self {
            driver_name: driver_name.into(),
            driver_uuid: None,
            resources: Arc::new(ResourceRegistry::default()),
            logs: LogSink::default(),
            transcripts: None,
        }
    }

    /// The recorder of this driver's console transcript for the session, when the exporter
    /// keeps transcripts (a console driver gives it to its [`super::ConsoleFanout`]).
    pub fn console_recorder(&self) -> Option<Arc<dyn super::transcript::ConsoleRecorder>> {
        self.transcripts
            .as_ref()
            .and_then(|t| t.recorder(self.driver_uuid, &self.driver_name))
    }

    /// Logs at INFO on the driver's logger (`driver.<Type>`), also sent to `LogStream`.
    pub fn log_info(&self, msg: impl Into<String>) {
        self.logs.emit(&self.driver_name, "INFO", msg.into());
    }

    /// Logs at WARNING, also sent to `LogStream`.
    pub fn log_warning(&self, msg: impl Into<String>) {
        self.logs.emit(&self.driver_name, "WARNING", msg.into());
    }

    /// Logs at `severity` (`DEBUG`, `INFO`, `WARNING`, `ERROR`, `CRITICAL`), also sent to
    /// `LogStream` (records relayed from drivers hosted elsewhere keep their severity).
    pub fn log(&self, severity: &str, msg: impl Into<String>) {
        self.logs.emit(&self.driver_name, severity, msg.into());
    }

    /// Opens the resource stream a client passed by handle: read it to get the client's
    /// bytes (already decompressed when an encoding was negotiated), write it and shut it
    /// down to send bytes back. Each handle opens once.
    ///
    /// A presigned request (an HTTP(S) URL the client passed instead of bytes) is fetched
    /// (or, for `PUT`, uploaded to) by the exporter itself, with progress in this driver's
    /// log: see [`crate::wire::presigned`].
    pub fn resource(&self, handle: &ResourceHandle) -> Result<ResourceStream, DriverError> {
        match handle {
            ResourceHandle::PresignedRequest {
                headers,
                url,
                method,
            } => {
                let logs = self.logs.clone();
                let driver = self.driver_name.clone();
                let progress: presigned::ProgressFn =
                    Arc::new(move |line| logs.emit(&driver, "INFO", line));
                presigned::open(url, method, headers, progress)
            }
            ResourceHandle::ClientStream { .. } => self.resources.open(handle),
        }
    }
}

/// A driver: a node of an exporter's tree that clients call by uuid.
///
/// Implement it with the [`macro@crate::driver`] attribute rather than by hand.
pub trait Driver: Send + Sync + 'static {
    /// The `jumpstarter.dev/client` label: the client class that drives this (upstream Python
    /// path, e.g. `jumpstarter_driver_power.client.PowerClient`).
    fn client_class(&self) -> String;

    /// The driver's type name, used for its logger (`driver.<type name>`) and in errors.
    fn type_name(&self) -> &'static str;

    /// Names of the exported methods.
    fn exported_methods(&self) -> &'static [&'static str] {
        &[]
    }

    /// Extra labels reported for this driver.
    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// Help texts of the driver's `j` commands, by command name, reported in the instance's
    /// `methods_description`; they win over the config's `methods_description` (as upstream,
    /// where a driver fills it after the config). Default: none.
    fn methods_description(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// Fallback help texts, reported for commands that neither
    /// [`Driver::methods_description`] nor the config describes (so that a client can list
    /// every command from the report). Default: none.
    fn default_methods_description(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// Built-in children (besides those a config gives).
    fn children(&self) -> Vec<(String, Arc<dyn Driver>)> {
        Vec::new()
    }

    /// Runs when a session serving this driver ends (its lease ended, or the `jmp shell` or
    /// standalone exporter serving it stopped): release what that session's client left
    /// behind, such as open files. Calls still running for that session have been cancelled
    /// by then. Upstream drivers do this in `close()`. Default: nothing. With the
    /// [`macro@crate::driver`] attribute, name an `async fn(&self)` with `session_end = method`.
    fn session_end(self: Arc<Self>) -> BoxFuture<()> {
        Box::pin(std::future::ready(()))
    }

    /// A unary call (`DriverCall`).
    fn call(
        self: Arc<Self>,
        ctx: CallContext,
        method: String,
        args: Vec<Value>,
    ) -> BoxFuture<Result<Value, DriverError>>;

    /// A server-streaming call (`StreamingDriverCall`).
    fn streaming_call(
        self: Arc<Self>,
        ctx: CallContext,
        method: String,
        args: Vec<Value>,
    ) -> BoxFuture<Result<ValueStream, DriverError>>;

    /// Opens a byte stream (`RouterService.Stream` with a `driver` request).
    fn open_stream(
        self: Arc<Self>,
        ctx: CallContext,
        method: String,
    ) -> BoxFuture<Result<BoxDuplex, DriverError>>;
}

/// Encodes a typed result stream (used by the `#[driver]` macro).
pub fn encode_stream<T: Serialize + Send + 'static>(
    s: BoxStream<'static, Result<T, DriverError>>,
) -> ValueStream {
    s.map(|item| item.and_then(|v| value::to_value(&v).map_err(DriverError::from)))
        .boxed()
}
