//! [`Exporter`]: the facade over the runtime's three modes.

use std::{ffi::OsString, future::Future, path::Path, sync::Arc};

use jumpstarter_core::{
    DriverNode, Session,
    config::ExporterConfig,
    driver::DriverRegistry,
    server::{listener::ConnectionLimits, serve_unix},
};

use crate::{
    bridge::{PythonDrivers, build_tree, check_config},
    controller::{ControllerTarget, ExporterError, ExporterOptions, run_with_options},
    hooks::lifecycle::sweep_stale_hook_dirs,
    standalone::Standalone,
};

/// An exporter: its config and the registry its drivers are built from.
///
/// Nothing runs until one of [`run`](Self::run), [`standalone`](Self::standalone) or
/// [`local`](Self::local) is called; [`check`](Self::check) only checks the config.
#[derive(Clone)]
pub struct Exporter {
    config: ExporterConfig,
    registry: Arc<DriverRegistry>,
    limits: Option<ConnectionLimits>,
    hook_path: Option<OsString>,
    metrics: Option<Arc<crate::metrics::ExporterMetrics>>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("name", &self.config.metadata.name)
            .field("path", &self.config.path)
            .finish_non_exhaustive()
    }
}

impl Exporter {
    /// The exporter of `config`, its drivers built from `registry`.
    pub fn from_config(config: ExporterConfig, registry: impl Into<Arc<DriverRegistry>>) -> Self {
        Self {
            config,
            registry: registry.into(),
            limits: None,
            hook_path: None,
            metrics: None,
        }
    }

    /// The connection limits of the direct listener (`directListener`; default
    /// [`ConnectionLimits::default`]).
    pub fn with_connection_limits(mut self, limits: ConnectionLimits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// The `PATH` lease hooks and health checks run with (default: this process's). `jmp`
    /// adds the directory of its own `j` here, so a hook finds the `j` built beside it.
    pub fn with_hook_path(mut self, path: impl Into<OsString>) -> Self {
        self.hook_path = Some(path.into());
        self
    }

    /// Counts each lease's driver calls and sessions in `metrics` (controller mode).
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::ExporterMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The config.
    pub fn config(&self) -> &ExporterConfig {
        &self.config
    }

    /// Checks the config as the exporter would build it, without serving it: the Rust
    /// drivers are built (and dropped at once); the types that go to Python are imported by
    /// the interpreter. Returns those types, with their config fields.
    pub async fn check(&self) -> Result<Vec<String>, ExporterError> {
        check_config(&self.registry, &self.config)
            .await
            .map_err(|source| self.build_error(source))
    }

    /// Builds the driver tree, starting the Python child when the config needs one (keep
    /// the returned [`PythonDrivers`] for as long as the tree is served).
    pub async fn build(&self) -> Result<(DriverNode, PythonDrivers), ExporterError> {
        build_tree(&self.registry, &self.config)
            .await
            .map_err(|source| self.build_error(source))
    }

    /// Controller mode (`jmp run`): checks the config's controller fields, builds the tree,
    /// registers and serves leases until `shutdown` resolves; then ends any lease session,
    /// reports `OFFLINE` and unregisters. Returns an error only for what retrying cannot fix
    /// (bad config, refused credentials, a hook failing with `onFailure: exit`).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ExporterError> {
        let target = ControllerTarget::from_config(&self.config)?;
        let mut options = ExporterOptions::from_config(&self.config)?;
        options.metrics = self.metrics.clone();
        if let Some(path) = &self.hook_path {
            options.set_hook_path(path);
        }
        if let Some(limits) = self.limits
            && let Some(direct) = options.direct.as_mut()
        {
            direct.limits = limits;
        }
        let (tree, _python) = self.build().await?;
        if options.hooks.is_some() || options.health.is_some() {
            // Hook sockets of an earlier run killed with SIGKILL.
            sweep_stale_hook_dirs();
        }
        run_with_options(target, tree, options, shutdown).await
    }

    /// Standalone mode (`jmp run --tls-grpc-listener`): builds the tree and the session and
    /// starts the beforeLease hook; serve it with [`Standalone::serve_tcp`].
    pub async fn standalone(self) -> Result<Standalone, ExporterError> {
        let (tree, python) = self.build().await?;
        Standalone::start(&self.config, tree, self.hook_path.as_deref(), python)
    }

    /// An in-process exporter without hooks (`jmp shell --exporter-config`): builds the tree
    /// and a ready session; serve it with [`Local::serve_unix`].
    pub async fn local(self) -> Result<Local, ExporterError> {
        let (tree, python) = self.build().await?;
        let session = Session::new_ready(tree, Default::default());
        session.set_motd(self.config.motd.as_deref().unwrap_or_default());
        Ok(Local {
            session,
            _python: python,
        })
    }

    fn build_error(&self, source: crate::bridge::BuildError) -> ExporterError {
        ExporterError::Build {
            name: self.config.metadata.name.clone(),
            source: Box::new(source),
        }
    }
}

/// An in-process exporter's session (see [`Exporter::local`]).
pub struct Local {
    session: Arc<Session>,
    /// The Python child of the tree, kept for as long as the session is served.
    _python: PythonDrivers,
}

impl Local {
    /// The session served.
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Listens on the Unix socket `path` now, and returns the future that serves the
    /// session there until `shutdown` resolves.
    pub fn serve_unix(
        &self,
        path: &Path,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<impl Future<Output = Result<(), ExporterError>> + Send + 'static, ExporterError>
    {
        let server = serve_unix(Arc::clone(&self.session), path, shutdown)?;
        Ok(async move { server.await.map_err(ExporterError::from) })
    }

    /// Ends the session (its drivers' `close`).
    pub async fn close(self) {
        self.session.close().await;
    }
}
