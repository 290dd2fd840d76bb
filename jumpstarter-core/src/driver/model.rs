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

use crate::{
    server::LogSink,
    value::{self, Value},
    wire::resource::{ResourceHandle, ResourceRegistry, ResourceStream},
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

/// What a driver call can fail with; each maps to the gRPC code upstream uses.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DriverError {
    /// No method of that name (NOT_FOUND).
    #[error("method {0} not found on driver")]
    MethodNotFound(String),
    /// The method exists but not for this call style (NOT_FOUND).
    #[error("method {method} missing marker {marker}")]
    MissingMarker {
        /// The method asked for.
        method: String,
        /// The upstream marker name of the call style (e.g. `marker_drivercall`).
        marker: &'static str,
    },
    /// No driver with that uuid in this exporter (UNKNOWN, as upstream).
    #[error("Unexpected <class 'KeyError'>: UUID('{0}')")]
    UnknownDriver(String),
    /// An argument has the wrong type or value (INVALID_ARGUMENT).
    #[error("{0}")]
    InvalidArgument(String),
    /// The driver does not implement this (UNIMPLEMENTED).
    #[error("{0}")]
    Unimplemented(String),
    /// The operation timed out (DEADLINE_EXCEEDED).
    #[error("{0}")]
    Timeout(String),
    /// The exporter is not in a state to serve calls (FAILED_PRECONDITION).
    #[error("{0}")]
    NotReady(String),
    /// Anything else (UNKNOWN, with the message as upstream's `str(e)`).
    #[error("{0}")]
    Failed(String),
}

impl DriverError {
    /// Shorthand for [`DriverError::Failed`].
    pub fn failed(msg: impl std::fmt::Display) -> Self {
        DriverError::Failed(msg.to_string())
    }

    /// The gRPC status for this error: the one place driver errors meet status codes.
    pub fn to_status(&self) -> tonic::Status {
        use tonic::Code;
        let code = match self {
            DriverError::MethodNotFound(_) | DriverError::MissingMarker { .. } => Code::NotFound,
            DriverError::UnknownDriver(_) | DriverError::Failed(_) => Code::Unknown,
            DriverError::InvalidArgument(_) => Code::InvalidArgument,
            DriverError::Unimplemented(_) => Code::Unimplemented,
            DriverError::Timeout(_) => Code::DeadlineExceeded,
            DriverError::NotReady(_) => Code::FailedPrecondition,
        };
        tonic::Status::new(code, self.to_string())
    }

    /// The error a client sees for a gRPC status from a driver call.
    pub fn from_status(status: &tonic::Status) -> Self {
        use tonic::Code;
        let msg = status.message().to_string();
        match status.code() {
            Code::NotFound => DriverError::MethodNotFound(msg),
            Code::InvalidArgument => DriverError::InvalidArgument(msg),
            Code::Unimplemented => DriverError::Unimplemented(msg),
            Code::DeadlineExceeded => DriverError::Timeout(msg),
            Code::FailedPrecondition => DriverError::NotReady(msg),
            _ => DriverError::Failed(msg),
        }
    }
}

impl From<std::io::Error> for DriverError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::TimedOut => DriverError::Timeout(e.to_string()),
            std::io::ErrorKind::InvalidInput => DriverError::InvalidArgument(e.to_string()),
            std::io::ErrorKind::Unsupported => DriverError::Unimplemented(e.to_string()),
            _ => DriverError::Failed(e.to_string()),
        }
    }
}

/// What a driver method can use besides its arguments: logging and resource streams.
#[derive(Clone)]
pub struct CallContext {
    pub(crate) driver_name: Arc<str>,
    pub(crate) resources: Arc<ResourceRegistry>,
    pub(crate) logs: LogSink,
}

impl CallContext {
    /// A context detached from any session (for unit tests of drivers).
    pub fn detached(driver_name: &str) -> Self {
        Self {
            driver_name: driver_name.into(),
            resources: Arc::new(ResourceRegistry::default()),
            logs: LogSink::default(),
        }
    }

    /// Logs at INFO on the driver's logger (`driver.<Type>`), also sent to `LogStream`.
    pub fn log_info(&self, msg: impl Into<String>) {
        self.logs.emit(&self.driver_name, "INFO", msg.into());
    }

    /// Logs at WARNING, also sent to `LogStream`.
    pub fn log_warning(&self, msg: impl Into<String>) {
        self.logs.emit(&self.driver_name, "WARNING", msg.into());
    }

    /// Opens the resource stream a client passed by handle: read it to get the client's
    /// bytes (already decompressed when an encoding was negotiated), write it and shut it
    /// down to send bytes back. Each handle opens once.
    pub fn resource(&self, handle: &ResourceHandle) -> Result<ResourceStream, DriverError> {
        self.resources.open(handle)
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
