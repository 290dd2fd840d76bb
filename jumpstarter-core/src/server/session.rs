//! The exporter session: `ExporterService` and `RouterService` over a driver tree.
//!
//! One [`Session`] serves one driver tree. Serve it on a Unix socket, on TCP (plaintext or
//! TLS, optionally behind a passphrase), or on any connection with [`crate::server`].

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use futures::{Stream, StreamExt};
use jumpstarter_proto::v1::{
    DriverCallRequest, DriverCallResponse, EndSessionRequest, EndSessionResponse, Endpoint,
    ExporterStatus, GetReportResponse, GetStatusRequest, GetStatusResponse, LogSource,
    LogStreamResponse, ResetRequest, ResetResponse, StreamRequest, StreamResponse,
    StreamingDriverCallRequest, StreamingDriverCallResponse,
    exporter_service_server::ExporterService,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::{
    CallContext, Driver, DriverError,
    driver::DriverNode,
    driver::LogSink,
    wire::{
        frames::{EndOfStream, splice_io, splice_with},
        resource::{ContentEncoding, ResourceRegistry, StreamRequestMetadata},
        stream_rpc,
    },
};

/// The `LogStream` response header that says how many records held for a client that had
/// not opened the stream yet (hook output) come first. Our own; other clients ignore it.
pub const LOG_BACKLOG_HEADER: &str = "jumpstarter-log-backlog";

/// How long [`Session::close`] waits for one driver's [`Driver::session_end`].
pub const SESSION_END_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The status an exporter reports through `GetStatus`.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusState {
    /// Current status.
    pub status: ExporterStatus,
    /// Message explaining it.
    pub message: Option<String>,
    /// Incremented on every change.
    pub version: u64,
    /// The status before the current one.
    pub previous: Option<ExporterStatus>,
}

/// One driver tree served to clients.
pub struct Session {
    uuid: Uuid,
    labels: BTreeMap<String, String>,
    root: DriverNode,
    drivers: BTreeMap<Uuid, (String, Arc<dyn Driver>)>,
    resources: Arc<ResourceRegistry>,
    logs: LogSink,
    status: watch::Sender<StatusState>,
    end_requested: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    alternative_endpoints: Mutex<Vec<Endpoint>>,
    /// The message of the day `GetReport` returns (upstream main's `motd`).
    motd: Mutex<String>,
    closed: std::sync::atomic::AtomicBool,
    /// Driver calls refused whatever the status (a beforeLease hook runs: only its own
    /// connection, served by another session over the same drivers, may call them).
    calls_blocked: std::sync::atomic::AtomicBool,
    /// Set, with the reason, once the lease this session serves has ended: driver calls
    /// and streams are refused for good, and the open ones are cut.
    revoked: watch::Sender<Option<String>>,
    /// Where its consoles' transcripts go (see [`Session::set_transcripts`]).
    transcripts: Mutex<Option<Arc<dyn crate::driver::Transcripts>>>,
    /// The span the lines of its driver calls are logged in (the lease's, with `lease_id`
    /// and `client`; see [`Session::set_log_span`]).
    log_span: Mutex<tracing::Span>,
    /// Told of every driver call, for metrics (see [`Session::set_call_observer`]).
    call_observer: Mutex<Option<Arc<dyn crate::metrics::CallObserver>>>,
    /// Told of the bytes of driver and resource streams (see
    /// [`Session::set_stream_observer`]).
    stream_observer: Mutex<Option<Arc<dyn crate::metrics::StreamObserver>>>,
}

impl Session {
    /// A session over `root` with the exporter's labels, starting in `AVAILABLE`.
    pub fn new(root: DriverNode, labels: BTreeMap<String, String>) -> Arc<Self> {
        let drivers = root.index();
        let (status, _) = watch::channel(StatusState {
            status: ExporterStatus::Available,
            message: None,
            version: 0,
            previous: None,
        });
        Arc::new(Self {
            uuid: Uuid::new_v4(),
            labels,
            root,
            drivers,
            resources: Arc::new(ResourceRegistry::default()),
            logs: LogSink::default(),
            status,
            end_requested: Mutex::new(None),
            alternative_endpoints: Mutex::new(Vec::new()),
            motd: Mutex::new(String::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
            calls_blocked: std::sync::atomic::AtomicBool::new(false),
            revoked: watch::channel(None).0,
            transcripts: Mutex::new(None),
            log_span: Mutex::new(tracing::Span::none()),
            call_observer: Mutex::new(None),
            stream_observer: Mutex::new(None),
        })
    }

    /// Logs this session's driver calls (one line each, target `jumpstarter::driver_call`,
    /// at INFO: `driver_type`, `operation`, `result`, `duration_ms`) in `span`.
    pub fn set_log_span(&self, span: tracing::Span) {
        *self.log_span.lock().unwrap_or_else(|p| p.into_inner()) = span;
    }

    /// Tells `observer` of each driver call of this session when it has returned (the
    /// exporter's metrics).
    pub fn set_call_observer(&self, observer: Arc<dyn crate::metrics::CallObserver>) {
        *self.call_observer.lock().unwrap_or_else(|p| p.into_inner()) = Some(observer);
    }

    /// Tells `observer` of the bytes this session's driver and resource streams carry, each
    /// direction in batches (the exporter's metrics).
    pub fn set_stream_observer(&self, observer: Arc<dyn crate::metrics::StreamObserver>) {
        *self
            .stream_observer
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(observer);
    }

    /// Byte counters (received, sent) for a stream of driver `uuid`, when observed.
    fn stream_counts(
        &self,
        uuid: &str,
    ) -> (
        Option<crate::metrics::ByteCount>,
        Option<crate::metrics::ByteCount>,
    ) {
        let observer = self
            .stream_observer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match observer {
            Some(o) => {
                let driver_type = self.driver_type(uuid);
                (
                    Some(crate::metrics::ByteCount::new(o.clone(), driver_type, "rx")),
                    Some(crate::metrics::ByteCount::new(o, driver_type, "tx")),
                )
            }
            None => (None, None),
        }
    }

    fn call_observer(&self) -> Option<Arc<dyn crate::metrics::CallObserver>> {
        self.call_observer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Tells the call observer, if any, of a call of `operation` on driver `uuid`.
    fn observe_call<T>(
        observer: Option<&Arc<dyn crate::metrics::CallObserver>>,
        driver_type: &str,
        operation: &str,
        r: &Result<T, DriverError>,
        elapsed: std::time::Duration,
    ) {
        if let Some(o) = observer {
            o.driver_call(driver_type, operation, r.as_ref().err(), elapsed);
        }
    }

    fn log_span(&self) -> tracing::Span {
        self.log_span
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The line of one driver call (see [`Session::set_log_span`]) in `span`, going where
    /// `lines` says; `traced`: the call has a span of its own in a trace. With JSON logs the
    /// line is queued for their writer as it is ([`crate::logging::CallQueue::push`],
    /// [`crate::logging::queue_call_line`]), else logged as an event.
    fn log_call<T>(
        span: &tracing::Span,
        traced: bool,
        lines: crate::logging::CallLines,
        driver_type: &'static str,
        operation: String,
        r: &Result<T, DriverError>,
        elapsed: std::time::Duration,
    ) {
        let line = crate::logging::CallLine {
            driver_type,
            operation,
            error: r.as_ref().err().map(|e| crate::error_chain(e)),
            duration_ms: elapsed.as_secs_f64() * 1e3,
        };
        let line = if traced {
            line
        } else if let crate::logging::CallLines::Queued(queue) = lines {
            queue.push(span, line);
            return;
        } else {
            match crate::logging::queue_call_line(span, line) {
                Ok(()) => return,
                Err(line) => line,
            }
        };
        let crate::logging::CallLine {
            driver_type,
            operation,
            error,
            duration_ms,
        } = line;
        match error {
            None => tracing::info!(
                target: "jumpstarter::driver_call",
                parent: span,
                driver_type,
                operation,
                result = "ok",
                duration_ms,
                "driver call"
            ),
            Some(error) => tracing::info!(
                target: "jumpstarter::driver_call",
                parent: span,
                driver_type,
                operation,
                result = "error",
                error = %error,
                duration_ms,
                "driver call"
            ),
        }
    }

    /// The type of the driver `uuid` names (`unknown` for none).
    fn driver_type(&self, uuid: &str) -> &'static str {
        Uuid::parse_str(uuid)
            .ok()
            .and_then(|u| self.drivers.get(&u))
            .map_or("unknown", |(_, d)| d.type_name())
    }

    /// Tells `observer` of each log line its drivers write (the exporter's log gathering).
    pub fn set_log_observer(&self, observer: Arc<dyn crate::driver::LogObserver>) {
        self.logs.set_observer(observer);
    }

    /// Keeps transcripts of the consoles this session's clients open, in `transcripts`
    /// (the exporter sets one per lease, before clients connect).
    pub fn set_transcripts(&self, transcripts: Arc<dyn crate::driver::Transcripts>) {
        *self.transcripts.lock().unwrap_or_else(|p| p.into_inner()) = Some(transcripts);
    }

    /// A session ready for driver calls at once (local and direct modes): status
    /// `LEASE_READY`, version 1, previous `AVAILABLE`, as upstream's standalone sessions.
    pub fn new_ready(root: DriverNode, labels: BTreeMap<String, String>) -> Arc<Self> {
        let s = Self::new(root, labels);
        s.set_status(
            ExporterStatus::LeaseReady,
            Some("Ready for commands".into()),
        );
        s
    }

    /// Ends the session for its drivers, once it serves no more calls (its lease ended, the
    /// shell or standalone exporter stopped): every driver's [`Driver::session_end`] runs,
    /// concurrently, each given at most [`SESSION_END_TIMEOUT`]. Only the first call does
    /// anything.
    pub async fn close(&self) {
        if self.closed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let ends = self.drivers.values().map(|(name, driver)| {
            let end = Arc::clone(driver).session_end();
            async move {
                if tokio::time::timeout(SESSION_END_TIMEOUT, end)
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        "driver {name:?} did not finish ending its session within {:?}; gave up",
                        SESSION_END_TIMEOUT
                    );
                }
            }
        });
        futures::future::join_all(ends).await;
    }

    /// The root of the driver tree.
    pub fn root(&self) -> &DriverNode {
        &self.root
    }

    /// The exporter labels.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// Changes the status (bumping the version).
    pub fn set_status(&self, status: ExporterStatus, message: Option<String>) {
        self.status.send_modify(|s| {
            s.previous = Some(s.status);
            s.status = status;
            s.message = message;
            s.version += 1;
        });
    }

    /// Refuses (or allows again) driver calls whatever the status: clients wait while a
    /// beforeLease hook runs, as upstream, which holds their connections until it ends.
    pub fn block_driver_calls(&self, blocked: bool) {
        self.calls_blocked
            .store(blocked, std::sync::atomic::Ordering::SeqCst);
    }

    /// The lease this session serves has ended (`why` says how): from now on every driver
    /// call, streaming call and driver or resource stream of its clients is refused with
    /// FAILED_PRECONDITION, and the ones in progress are cut with that error. Status,
    /// report, log and `EndSession` calls keep working, so that a client can follow the
    /// afterLease hook (whose own `j` is served by another session). Only the first call
    /// counts.
    pub fn revoke(&self, why: impl Into<String>) {
        let why = why.into();
        self.revoked.send_if_modified(|r| {
            if r.is_none() {
                *r = Some(why);
                true
            } else {
                false
            }
        });
    }

    /// Why driver calls are refused for good, once [`Session::revoke`] was called.
    pub fn revoked(&self) -> Option<String> {
        self.revoked.borrow().clone()
    }

    /// Completes (with the reason) when the session is revoked.
    fn until_revoked(&self) -> impl Future<Output = String> + Send + 'static {
        let mut rx = self.revoked.subscribe();
        async move {
            let why = rx
                .wait_for(Option::is_some)
                .await
                .map(|why| why.clone().unwrap_or_default());
            match why {
                Ok(why) => why,
                // The session is gone: nothing is served any more anyway.
                Err(_) => std::future::pending().await,
            }
        }
    }

    /// Records hook output for this session's `LogStream` (see [`LogSink::emit_hook`]).
    pub fn hook_log(&self, source: LogSource, severity: &str, message: String) {
        self.logs.emit_hook(source, severity, message);
    }

    /// Fires when the status changes.
    pub fn watch_status(&self) -> watch::Receiver<StatusState> {
        self.status.subscribe()
    }

    /// The current status.
    pub fn status(&self) -> StatusState {
        self.status.borrow().clone()
    }

    /// Arms `EndSession`: the returned receiver fires when a client asks to end the session.
    pub fn on_end_session(&self) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        *self.end_requested.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        rx
    }

    /// Sets the endpoints `GetReport` advertises besides the current connection (the
    /// direct path, see [`crate::client::direct`]).
    pub fn set_alternative_endpoints(&self, endpoints: Vec<Endpoint>) {
        *self
            .alternative_endpoints
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = endpoints;
    }

    /// Sets the message of the day clients get in `GetReport` (the exporter config's
    /// `motd`).
    pub fn set_motd(&self, motd: &str) {
        *self.motd.lock().unwrap_or_else(|p| p.into_inner()) = motd.to_string();
    }

    /// Appends `text` (trimmed; nothing when empty) to the message of the day on a line of
    /// its own, as upstream main appends what a beforeLease hook wrote to `$JMP_MOTD_FILE`.
    pub fn append_motd(&self, text: &str) {
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        let mut motd = self.motd.lock().unwrap_or_else(|p| p.into_inner());
        if !motd.is_empty() {
            motd.push('\n');
        }
        motd.push_str(text);
    }

    /// The message of the day.
    pub fn motd(&self) -> String {
        self.motd.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The `GetReport` answer.
    pub fn report(&self) -> GetReportResponse {
        GetReportResponse {
            uuid: self.uuid.to_string(),
            labels: self.labels.clone().into_iter().collect(),
            reports: self.root.reports(),
            alternative_endpoints: self
                .alternative_endpoints
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            motd: self.motd(),
        }
    }

    fn context(&self, name: &str, uuid: &str) -> CallContext {
        CallContext {
            driver_name: name.into(),
            driver_uuid: Uuid::parse_str(uuid).ok(),
            resources: self.resources.clone(),
            logs: self.logs.clone(),
            transcripts: self
                .transcripts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    fn lookup(&self, uuid: &str) -> Result<(String, Arc<dyn Driver>), DriverError> {
        Uuid::parse_str(uuid)
            .ok()
            .and_then(|u| self.drivers.get(&u).cloned())
            .ok_or_else(|| DriverError::UnknownDriver(uuid.to_string()))
    }

    fn check_revoked(&self) -> Result<(), DriverError> {
        match self.revoked() {
            Some(why) => Err(DriverError::NotReady(why)),
            None => Ok(()),
        }
    }

    fn check_ready(&self) -> Result<(), DriverError> {
        self.check_revoked()?;
        let s = self.status.borrow().status;
        if self.calls_blocked.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(DriverError::NotReady(format!(
                "Exporter not ready for driver calls (status: {})",
                s.as_str_name()
            )));
        }
        match s {
            ExporterStatus::LeaseReady
            | ExporterStatus::BeforeLeaseHook
            | ExporterStatus::AfterLeaseHook => Ok(()),
            other => Err(DriverError::NotReady(format!(
                "Exporter not ready for driver calls (status: {})",
                other.as_str_name()
            ))),
        }
    }

    /// Runs a unary driver call (what `DriverCall` does, without gRPC).
    pub async fn driver_call(
        &self,
        uuid: &str,
        method: String,
        args: Vec<prost_types::Value>,
    ) -> Result<prost_types::Value, DriverError> {
        let lines = crate::logging::call_lines();
        let driver_type = self.driver_type(uuid);
        let log_span = self.log_span();
        // With traces on, the log span is the lease's `lease.serve`: each call is a span.
        let traced = crate::telemetry::driver_call(&log_span, driver_type, &method);
        let observer = self.call_observer();
        let off = matches!(lines, crate::logging::CallLines::Off);
        if off && traced.is_none() && observer.is_none() {
            return self.driver_call_unlogged(uuid, method, args).await;
        }
        let started = std::time::Instant::now();
        let operation = method.clone();
        let call = self.driver_call_unlogged(uuid, method, args);
        // The driver's own log lines carry the lease's fields too.
        let r = if !traced.is_none() {
            tracing::Instrument::instrument(call, traced.clone()).await
        } else if !log_span.is_none() {
            tracing::Instrument::instrument(call, log_span.clone()).await
        } else {
            call.await
        };
        let elapsed = started.elapsed();
        crate::telemetry::record_result(&traced, &r);
        Self::observe_call(observer.as_ref(), driver_type, &operation, &r, elapsed);
        if !off {
            Self::log_call(
                &log_span,
                !traced.is_none(),
                lines,
                driver_type,
                operation,
                &r,
                elapsed,
            );
        }
        r
    }

    async fn driver_call_unlogged(
        &self,
        uuid: &str,
        method: String,
        args: Vec<prost_types::Value>,
    ) -> Result<prost_types::Value, DriverError> {
        self.check_ready()?;
        let (name, driver) = self.lookup(uuid)?;
        let ctx = self.context(&name, uuid);
        let revoked = self.until_revoked();
        tokio::select! {
            biased;
            why = revoked => Err(DriverError::NotReady(why)),
            r = driver.call(ctx, method, args) => r,
        }
    }

    /// The gRPC services of this session, to add to a tonic router.
    pub fn services(self: &Arc<Self>) -> SessionService {
        SessionService(self.clone())
    }
}

/// `ExporterService` and `RouterService` over a [`Session`].
#[derive(Clone)]
pub struct SessionService(pub Arc<Session>);

type BoxStatusStream<T> = std::pin::Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl ExporterService for SessionService {
    async fn get_report(&self, _: Request<()>) -> Result<Response<GetReportResponse>, Status> {
        Ok(Response::new(self.0.report()))
    }

    async fn driver_call(
        &self,
        request: Request<DriverCallRequest>,
    ) -> Result<Response<DriverCallResponse>, Status> {
        let req = request.into_inner();
        let result = self
            .0
            .driver_call(&req.uuid, req.method, req.args)
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(DriverCallResponse {
            uuid: Uuid::new_v4().to_string(),
            result: Some(result),
        }))
    }

    type StreamingDriverCallStream = BoxStatusStream<StreamingDriverCallResponse>;

    async fn streaming_driver_call(
        &self,
        request: Request<StreamingDriverCallRequest>,
    ) -> Result<Response<Self::StreamingDriverCallStream>, Status> {
        let req = request.into_inner();
        self.0.check_ready().map_err(|e| e.to_status())?;
        let (name, driver) = self.0.lookup(&req.uuid).map_err(|e| e.to_status())?;
        let ctx = self.0.context(&name, &req.uuid);
        let lines = crate::logging::call_lines();
        let off = matches!(lines, crate::logging::CallLines::Off);
        let observer = self.0.call_observer();
        let started = std::time::Instant::now();
        let operation = (!off || observer.is_some()).then(|| req.method.clone());
        let driver_type = self.0.driver_type(&req.uuid);
        let log_span = self.0.log_span();
        // The span of a streaming call covers its start.
        let traced = crate::telemetry::driver_call(&log_span, driver_type, &req.method);
        let stream = tracing::Instrument::instrument(
            driver.streaming_call(ctx, req.method, req.args),
            traced.clone(),
        )
        .await;
        let elapsed = started.elapsed();
        crate::telemetry::record_result(&traced, &stream);
        let is_traced = !traced.is_none();
        drop(traced);
        if let Some(operation) = operation {
            Session::observe_call(observer.as_ref(), driver_type, &operation, &stream, elapsed);
            if !off {
                Session::log_call(
                    &log_span,
                    is_traced,
                    lines,
                    driver_type,
                    operation,
                    &stream,
                    elapsed,
                );
            }
        }
        let stream = stream.map_err(|e| e.to_status())?;
        let out = stream.map(|item| {
            item.map(|v| StreamingDriverCallResponse {
                uuid: Uuid::new_v4().to_string(),
                result: Some(v),
            })
            .map_err(|e| e.to_status())
        });
        Ok(Response::new(cut_when_revoked(
            Box::pin(out),
            self.0.until_revoked(),
        )))
    }

    type LogStreamStream = BoxStatusStream<LogStreamResponse>;

    async fn log_stream(&self, _: Request<()>) -> Result<Response<Self::LogStreamStream>, Status> {
        let (backlog, rx) = self.0.logs.subscribe();
        let uuid = self.0.uuid.to_string();
        let replayed = backlog.len();
        let backlog = futures::stream::iter(backlog.into_iter().map(Ok));
        let live = tokio_stream::wrappers::BroadcastStream::new(rx);
        let out = backlog.chain(live).filter_map(move |r| {
            let uuid = uuid.clone();
            async move {
                match r {
                    Ok(mut rec) => {
                        rec.uuid = uuid;
                        Some(Ok(rec))
                    }
                    // A slow reader skips what it missed rather than stalling drivers.
                    Err(_) => None,
                }
            }
        });
        let mut response = Response::new(Box::pin(out) as Self::LogStreamStream);
        // How many held records come first, so that a client leaving soon after a hook
        // (`jmp shell` with a quick command) knows when it has them all.
        response
            .metadata_mut()
            .insert(LOG_BACKLOG_HEADER, replayed.into());
        Ok(response)
    }

    async fn reset(&self, _: Request<ResetRequest>) -> Result<Response<ResetResponse>, Status> {
        Err(Status::unimplemented("Method not implemented!"))
    }

    async fn get_status(
        &self,
        _: Request<GetStatusRequest>,
    ) -> Result<Response<GetStatusResponse>, Status> {
        let s = self.0.status();
        Ok(Response::new(GetStatusResponse {
            status: s.status as i32,
            message: s.message,
            status_version: s.version,
            previous_status: s.previous.map(|p| p as i32),
        }))
    }

    async fn end_session(
        &self,
        _: Request<EndSessionRequest>,
    ) -> Result<Response<EndSessionResponse>, Status> {
        let tx = self
            .0
            .end_requested
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let resp = match tx {
            Some(tx) => {
                let _ = tx.send(());
                EndSessionResponse {
                    success: true,
                    message: Some(
                        "Session end triggered, afterLease hook running asynchronously".into(),
                    ),
                }
            }
            None => EndSessionResponse {
                success: false,
                message: Some("No active lease context".into()),
            },
        };
        Ok(Response::new(resp))
    }
}

/// `RouterService` (its one RPC, `Stream`) served straight over HTTP/2 by
/// [`crate::wire::stream_rpc`], which spares bulk transfers tonic's per-message copies.
///
/// Add it to a tonic server beside `ExporterServiceServer` (wrap it in
/// `tonic::service::interceptor::InterceptedService` to check requests first).
#[derive(Clone)]
pub struct StreamService(pub SessionService);

impl tonic::server::NamedService for StreamService {
    const NAME: &'static str = "jumpstarter.v1.RouterService";
}

impl tower::Service<http::Request<tonic::body::Body>> for StreamService {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let svc = self.0.clone();
        Box::pin(async move {
            Ok(match svc.stream_rpc(req).await {
                Ok(response) => response,
                Err(status) => status.into_http(),
            })
        })
    }
}

impl SessionService {
    async fn stream_rpc(
        &self,
        req: http::Request<tonic::body::Body>,
    ) -> Result<http::Response<tonic::body::Body>, Status> {
        stream_rpc::check_request(&req)?;
        let raw = req
            .headers()
            .get("request")
            .ok_or_else(|| Status::invalid_argument("missing \"request\" metadata"))?
            .to_str()
            .map_err(|_| Status::invalid_argument("\"request\" metadata is not text"))?
            .to_string();
        let meta: StreamRequestMetadata = serde_json::from_str(&raw).map_err(|e| {
            Status::invalid_argument(format!(
                "invalid \"request\" metadata {raw:?}: {e}",
                e = crate::error_chain(&e)
            ))
        })?;
        let stream_uuid = match &meta {
            StreamRequestMetadata::Driver { uuid, .. }
            | StreamRequestMetadata::Resource { uuid, .. } => uuid.to_string(),
        };
        let (mut rx, mut tx) = self.0.stream_counts(&stream_uuid);
        let inbound = stream_rpc::FrameDecoder::<_, StreamRequest>::new(
            req.into_body(),
            stream_rpc::Side::Server,
        )
        .map(move |frame| {
            if let (Some(c), Ok(f)) = (rx.as_mut(), &frame) {
                c.add(f.payload.len());
            }
            frame
        });
        self.0.check_revoked().map_err(|e| e.to_status())?;
        let mut headers = http::HeaderMap::new();
        let out: BoxStatusStream<StreamResponse> = match meta {
            StreamRequestMetadata::Driver { uuid, method } => {
                let (name, driver) = self
                    .0
                    .lookup(&uuid.to_string())
                    .map_err(|e| e.to_status())?;
                let io = driver
                    .open_stream(self.0.context(&name, &uuid.to_string()), method.clone())
                    .await
                    .map_err(|e| e.to_status())?;
                // A device that fails mid-stream (a serial adapter unplugged) ends the RPC
                // with an error status the client shows, as an upstream exporter's
                // exception does.
                Box::pin(
                    splice_io::<_, StreamResponse, _, _, _, _>(inbound, io, ()).map(move |r| {
                        r.map_err(|e| {
                            Status::unknown(format!(
                                "{name}.{method}: {e}",
                                e = crate::error_chain(&e)
                            ))
                        })
                    }),
                )
            }
            StreamRequestMetadata::Resource {
                uuid,
                x_jmp_content_encoding,
            } => {
                self.0
                    .lookup(&uuid.to_string())
                    .map_err(|e| e.to_status())?;
                let (response, metadata) =
                    resource_stream(&self.0.resources, inbound, x_jmp_content_encoding);
                for (key, value) in metadata {
                    let value = http::HeaderValue::try_from(value.as_str()).map_err(|e| {
                        Status::internal(format!(
                            "resource metadata: {e}",
                            e = crate::error_chain(&e)
                        ))
                    })?;
                    headers.insert(key, value);
                }
                response
            }
        };
        let out: BoxStatusStream<StreamResponse> = Box::pin(out.map(move |frame| {
            if let (Some(c), Ok(f)) = (tx.as_mut(), &frame) {
                c.add(f.payload.len());
            }
            frame
        }));
        let out = cut_when_revoked(out, self.0.until_revoked());
        Ok(stream_rpc::response(out, headers))
    }
}

/// `stream` until `revoked` completes; then one FAILED_PRECONDITION error with its reason,
/// and the end (dropping `stream` stops whatever it drives, both ways).
fn cut_when_revoked<T: Send + 'static>(
    stream: BoxStatusStream<T>,
    revoked: impl Future<Output = String> + Send + 'static,
) -> BoxStatusStream<T> {
    let revoked: std::pin::Pin<Box<dyn Future<Output = String> + Send>> = Box::pin(revoked);
    Box::pin(futures::stream::unfold(
        Some((stream, revoked)),
        |state| async move {
            let (mut stream, mut revoked) = state?;
            tokio::select! {
                biased;
                why = &mut revoked => Some((Err(Status::failed_precondition(why)), None)),
                item = stream.next() => item.map(|item| (item, Some((stream, revoked)))),
            }
        },
    ))
}

/// Serves one resource stream: registers the driver's end, pipes the client's frames into
/// it and the driver's bytes back. Returns the response stream and the initial metadata
/// (`resource` handle, and `x_jmp_accept_encoding` when the requested encoding is accepted).
///
/// A driver side that breaks ends the response with `ABORTED`, never with a clean GOAWAY.
fn resource_stream<S>(
    resources: &Arc<ResourceRegistry>,
    inbound: S,
    requested: Option<ContentEncoding>,
) -> (BoxStatusStream<StreamResponse>, Vec<(&'static str, String)>)
where
    S: Stream<Item = Result<StreamRequest, Status>> + Send + Unpin + 'static,
{
    let accepted = requested.filter(|_| ContentEncoding::exporter_accepts());
    let (resource, end, guard) = resources.create(accepted);
    let handle = serde_json::json!({
        "kind": "client_stream",
        "uuid": resource,
        "x_jmp_content_encoding": requested,
    })
    .to_string();
    let mut metadata = vec![("resource", handle)];
    if let Some(enc) = accepted {
        metadata.push(("x_jmp_accept_encoding", enc.as_str().to_string()));
    }
    let out = splice_with::<_, StreamResponse, _, _, _, _, _>(
        inbound,
        end.inbound,
        end.outbound,
        EndOfStream::GoawayRequired,
        guard,
    )
    .map(|item| {
        item.map_err(|e| {
            Status::aborted(format!(
                "resource stream broken: {e}",
                e = crate::error_chain(&e)
            ))
        })
    });
    (Box::pin(out), metadata)
}
