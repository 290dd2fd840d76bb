//! A node of our tree whose driver lives in the Python child: every call is forwarded.
//!
//! Unary and streaming calls go to the child with the same uuid, method and arguments:
//! unary ones on its fast path (`fast.rs`) when they carry no resource and the path has
//! room, the rest to its `ExporterService`. Byte streams open the same method on the child's
//! `RouterService.Stream`. A resource handle among the arguments (bytes the client streams
//! to us) is replaced by a resource opened on the child for the same driver, and a task
//! copies between the two as the Python driver reads or writes: HTTP/2 flow control on both
//! hops gives backpressure and nothing is held whole.
//!
//! A console (a driver whose client class is in [`CONSOLE_CLIENTS`], such as upstream's
//! `PySerial`) is shared here as the Rust `PySerial` shares its own: the child's `connect`
//! stream is the source of a [`ConsoleFanout`], so one client writes (`connect`) while
//! others watch (`observe`: the scrollback, then live bytes), and `release_console` and
//! `console_status` work, whether or not the Python driver knows of observers.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::StreamExt;
use jumpstarter_core::{
    CallContext, ClientError, Driver, DriverError,
    driver::{BoxDuplex, BoxFuture, ConsoleFanout, ValueStream},
    value::{self, Value},
    wire::resource::ResourceHandle,
};
use jumpstarter_proto::v1::{
    DriverCallRequest, StreamingDriverCallRequest, exporter_service_client::ExporterServiceClient,
};
use prost_types::value::Kind;
use tokio::task::JoinHandle;

use super::host::{Conn, Host};

/// How long a resource copy may go on after the call that used it returned.
const RESOURCE_DRAIN: Duration = Duration::from_secs(30);

/// The type name our logs and errors give bridged drivers (their Python type is in the
/// messages).
const TYPE_NAME: &str = "PythonDriver";

/// Client classes of consoles: their `connect` stream is shared by a [`ConsoleFanout`].
/// (upstream's `PySerial`, whose client class the Rust `PySerial` reports too).
pub(crate) const CONSOLE_CLIENTS: &[&str] = &["jumpstarter_driver_pyserial.client.PySerialClient"];

/// A driver served by the Python child.
pub(crate) struct PythonDriver {
    pub host: Arc<Host>,
    /// Its uuid (the same in the child and in our tree).
    pub uuid: String,
    /// Its dotted path in the child's tree.
    pub path: String,
    pub client_class: String,
    pub labels: BTreeMap<String, String>,
    /// The config `type:` of the subtree it belongs to.
    pub type_name: String,
    /// A console's writer and observers over the child's `connect` stream (consoles only).
    pub console: Option<ConsoleFanout>,
}

impl PythonDriver {
    /// Opens byte stream `method` on the child.
    async fn open_child_stream(
        &self,
        ctx: &CallContext,
        method: &str,
    ) -> Result<BoxDuplex, DriverError> {
        let conn = self.conn(ctx)?;
        let client = conn
            .session
            .driver(&self.path)
            .map_err(|e| self.client_error(e))?;
        let io = client
            .open_stream(method)
            .await
            .map_err(|e| self.client_error(e))?;
        Ok(Box::new(io) as BoxDuplex)
    }

    fn conn(&self, ctx: &CallContext) -> Result<Conn, DriverError> {
        self.host.log_to(ctx);
        self.host.conn(&self.type_name)
    }

    /// A transport failure talking to the child says so; a driver's own error passes as is.
    fn status_error(&self, status: &tonic::Status) -> DriverError {
        match DriverError::from_status(status) {
            DriverError::Failed(msg) if is_transport(status) => DriverError::Failed(format!(
                "Python driver {} is unavailable: {msg}",
                self.type_name
            )),
            other => other,
        }
    }

    fn client_error(&self, e: ClientError) -> DriverError {
        match e {
            ClientError::Call { error, .. } => error,
            other => DriverError::Failed(format!(
                "Python driver {} is unavailable: {}",
                self.type_name,
                jumpstarter_core::error_chain(&other)
            )),
        }
    }

    /// Replaces client-stream resource handles among `args` with resources on the child,
    /// and starts the copies.
    async fn bridge_resources(
        &self,
        ctx: &CallContext,
        conn: &Conn,
        args: &mut [Value],
    ) -> Result<Vec<JoinHandle<()>>, DriverError> {
        let mut copies = Vec::new();
        for arg in args.iter_mut() {
            // Handles travel as a struct (upstream's `model_dump`), or as its JSON text.
            let handle = match &arg.kind {
                Some(Kind::StructValue(_)) => {
                    serde_json::from_value::<ResourceHandle>(value::to_json(arg.clone())).ok()
                }
                Some(Kind::StringValue(s)) if s.starts_with('{') => {
                    serde_json::from_str::<ResourceHandle>(s).ok()
                }
                _ => None,
            };
            let Some(handle @ ResourceHandle::ClientStream { .. }) = handle else {
                continue;
            };
            let as_text = matches!(arg.kind, Some(Kind::StringValue(_)));
            let mut local = ctx.resource(&handle)?;
            let client = conn
                .session
                .driver(&self.path)
                .map_err(|e| self.client_error(e))?;
            let remote = client
                .open_resource(None)
                .await
                .map_err(|e| self.client_error(e))?;
            let remote_handle = if as_text {
                let text = serde_json::to_string(&remote.handle).map_err(|e| {
                    DriverError::failed(format!(
                        "resource handle: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    ))
                })?;
                Value {
                    kind: Some(Kind::StringValue(text)),
                }
            } else {
                value::to_value(&remote.handle).map_err(|e| {
                    DriverError::failed(format!(
                        "resource handle: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    ))
                })?
            };
            let mut ends = remote.ends;
            copies.push(tokio::spawn(async move {
                if let Err(e) = tokio::io::copy_bidirectional(&mut local, &mut ends).await {
                    tracing::debug!(
                        "resource copy to the Python driver ended: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    );
                }
            }));
            *arg = remote_handle;
        }
        Ok(copies)
    }
}

fn is_transport(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
        || matches!(
            status.code(),
            tonic::Code::Unavailable | tonic::Code::Cancelled
        )
}

/// Lets the copies finish what the call started (a dump's last bytes), within a bound.
fn drain(copies: Vec<JoinHandle<()>>) {
    if copies.is_empty() {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        copies.iter().for_each(JoinHandle::abort);
        return;
    };
    rt.spawn(async move {
        let aborts: Vec<_> = copies.iter().map(|c| c.abort_handle()).collect();
        if tokio::time::timeout(RESOURCE_DRAIN, futures::future::join_all(copies))
            .await
            .is_err()
        {
            for a in aborts {
                a.abort();
            }
        }
    });
}

impl Driver for PythonDriver {
    fn client_class(&self) -> String {
        self.client_class.clone()
    }

    fn type_name(&self) -> &'static str {
        TYPE_NAME
    }

    fn labels(&self) -> BTreeMap<String, String> {
        self.labels.clone()
    }

    fn call(
        self: Arc<Self>,
        ctx: CallContext,
        method: String,
        mut args: Vec<Value>,
    ) -> BoxFuture<Result<Value, DriverError>> {
        Box::pin(async move {
            if let Some(fan) = &self.console {
                match method.as_str() {
                    "release_console" => {
                        if fan.release_console() {
                            ctx.log_info(format!("write token of {} released", self.path));
                        }
                        return Ok(Value {
                            kind: Some(Kind::NullValue(0)),
                        });
                    }
                    "console_status" => {
                        return value::to_value(&fan.status()).map_err(|e| {
                            DriverError::failed(format!(
                                "console status: {e}",
                                e = jumpstarter_core::error_chain(&e)
                            ))
                        });
                    }
                    _ => {}
                }
            }
            let conn = self.conn(&ctx)?;
            let copies = self.bridge_resources(&ctx, &conn, &mut args).await?;
            let request = DriverCallRequest {
                uuid: self.uuid.clone(),
                method,
                args,
            };
            // Unary calls without resources take the fast path when it has room
            // (`fast.rs`); the rest, and those it leaves, go through gRPC as before.
            if let Some(pool) = conn.fast.as_ref().filter(|_| copies.is_empty())
                && let Some(answer) = pool.call(&request).await
            {
                let resp = answer
                    .map_err(|e| {
                        DriverError::Failed(format!(
                            "Python driver {} is unavailable: {e}",
                            self.type_name,
                            e = jumpstarter_core::error_chain(&e)
                        ))
                    })?
                    .map_err(|s| self.status_error(&s))?;
                return Ok(resp.result.unwrap_or(Value {
                    kind: Some(Kind::NullValue(0)),
                }));
            }
            let result = ExporterServiceClient::new(conn.channel.clone())
                .driver_call(request)
                .await;
            drain(copies);
            let resp = result.map_err(|s| self.status_error(&s))?;
            Ok(resp.into_inner().result.unwrap_or(Value {
                kind: Some(Kind::NullValue(0)),
            }))
        })
    }

    fn streaming_call(
        self: Arc<Self>,
        ctx: CallContext,
        method: String,
        mut args: Vec<Value>,
    ) -> BoxFuture<Result<ValueStream, DriverError>> {
        Box::pin(async move {
            let conn = self.conn(&ctx)?;
            let copies = self.bridge_resources(&ctx, &conn, &mut args).await?;
            let resp = ExporterServiceClient::new(conn.channel.clone())
                .streaming_driver_call(StreamingDriverCallRequest {
                    uuid: self.uuid.clone(),
                    method,
                    args,
                })
                .await;
            let resp = match resp {
                Ok(r) => r,
                Err(s) => {
                    drain(copies);
                    return Err(self.status_error(&s));
                }
            };
            let this = self.clone();
            let items = resp.into_inner().map(move |item| {
                item.map(|r| r.result.unwrap_or_default())
                    .map_err(|s| this.status_error(&s))
            });
            // The copies run as long as the stream is consumed, then drain.
            let guard = DrainOnDrop(Some(copies));
            Ok(items
                .map(move |i| {
                    let _ = &guard;
                    i
                })
                .boxed())
        })
    }

    fn open_stream(
        self: Arc<Self>,
        ctx: CallContext,
        method: String,
    ) -> BoxFuture<Result<BoxDuplex, DriverError>> {
        Box::pin(async move {
            let Some(fan) = &self.console else {
                return self.open_child_stream(&ctx, &method).await;
            };
            let open = || self.open_child_stream(&ctx, "connect");
            let stream = match method.as_str() {
                "connect" => fan.connect(open, ctx.console_recorder()).await?,
                "observe" => fan.observe(open, ctx.console_recorder()).await?,
                _ => return self.open_child_stream(&ctx, &method).await,
            };
            Ok(Box::new(stream) as BoxDuplex)
        })
    }

    fn session_end(self: Arc<Self>) -> BoxFuture<()> {
        // The next lease's observers see nothing of this one's console.
        if let Some(fan) = &self.console {
            fan.reset();
        }
        Box::pin(std::future::ready(()))
    }
}

/// Drains resource copies when a streaming call's results are dropped.
struct DrainOnDrop(Option<Vec<JoinHandle<()>>>);

impl Drop for DrainOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            drain(c);
        }
    }
}
