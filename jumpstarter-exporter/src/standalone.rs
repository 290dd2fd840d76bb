//! Standalone mode (`jmp run --tls-grpc-listener`): one session served on a TCP listener,
//! no controller. With hooks in the config, the beforeLease hook runs once at start (clients
//! may connect meanwhile; their driver calls wait for it) and the afterLease hook at
//! shutdown, as upstream.

use std::{future::Future, sync::Arc};

use jumpstarter_core::{
    DriverNode, Session,
    config::ExporterConfig,
    server::{ServeOptions, serve_tcp},
};
use tokio::net::TcpListener;

use crate::{
    bridge::PythonDrivers,
    controller::{ExporterError, config_path},
    hooks::{
        LeaseHooks,
        lifecycle::{LeaseHookRun, NoController, Verdict, sweep_stale_hook_dirs},
    },
};

/// A standalone exporter, built and with its beforeLease hook started: serve it with
/// [`Standalone::serve_tcp`].
pub struct Standalone {
    session: Arc<Session>,
    hooks: Option<Hooks>,
    /// The Python child of the tree, kept for as long as the session is served.
    _python: PythonDrivers,
}

/// The hooks of a standalone exporter.
struct Hooks {
    run: Arc<LeaseHookRun>,
    exit: tokio::sync::watch::Receiver<bool>,
}

impl Standalone {
    /// The session of `tree`, and its hooks when `cfg` has some: the beforeLease hook
    /// starts at once.
    pub(crate) fn start(
        cfg: &ExporterConfig,
        tree: DriverNode,
        hook_path: Option<&std::ffi::OsStr>,
        python: PythonDrivers,
    ) -> Result<Self, ExporterError> {
        let hooks = LeaseHooks::from_config(&cfg.hooks).map_err(|e| ExporterError::Config {
            path: config_path(cfg),
            message: jumpstarter_core::error_chain(&e),
        })?;
        let motd = cfg.motd.as_deref().unwrap_or_default();
        let Some(mut hooks) = hooks else {
            let session = Session::new_ready(tree, Default::default());
            session.set_motd(motd);
            return Ok(Self {
                session,
                hooks: None,
                _python: python,
            });
        };
        if let Some(path) = hook_path {
            hooks.set_path(path);
        }
        // Hook sockets of an earlier run killed with SIGKILL.
        sweep_stale_hook_dirs();
        let session = Session::new(tree.clone(), Default::default());
        session.set_motd(motd);
        if hooks.before.is_some() {
            session.block_driver_calls(true);
        }
        let run = LeaseHookRun::start(
            Arc::new(hooks),
            tree,
            Arc::clone(&session),
            "standalone",
            "",
        )?;
        let (tx, exit) = tokio::sync::watch::channel(false);
        let before = Arc::clone(&run);
        tokio::spawn(async move {
            if before.before_lease(&NoController).await == Verdict::Exit {
                let _ = tx.send(true);
            }
        });
        Ok(Self {
            session,
            hooks: Some(Hooks { run, exit }),
            _python: python,
        })
    }

    /// The session served.
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Serves the session on `listener` until `shutdown` resolves or a hook fails with
    /// `onFailure: exit`; then runs the afterLease hook (unless the beforeLease hook failed
    /// with `endLease`/`exit`) and closes the session. A hook that asked the exporter to
    /// exit is [`ExporterError::HookExit`].
    pub async fn serve_tcp(
        mut self,
        listener: TcpListener,
        opts: ServeOptions,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ExporterError> {
        let stop = async {
            match self.hooks.as_mut() {
                Some(h) => tokio::select! {
                    _ = shutdown => {}
                    _ = h.exit_requested() => {}
                },
                None => shutdown.await,
            }
        };
        let served = serve_tcp(Arc::clone(&self.session), listener, opts, stop).await;
        // No client calls a driver while the afterLease hook runs.
        self.session
            .revoke("the exporter is shutting down: it refuses driver calls");
        let exit = match &self.hooks {
            Some(h) => h.finish().await,
            None => false,
        };
        self.session.close().await;
        served?;
        if exit {
            return Err(ExporterError::HookExit(
                "a lease hook failed with onFailure: exit".into(),
            ));
        }
        Ok(())
    }
}

impl Hooks {
    /// Resolves when a hook failed with `onFailure: exit`.
    async fn exit_requested(&mut self) {
        if self.exit.wait_for(|e| *e).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// At shutdown: the afterLease hook (unless the beforeLease hook failed with
    /// `endLease`/`exit`). Returns whether the exporter must exit with code 1.
    async fn finish(&self) -> bool {
        let verdict = self.run.after_lease(&NoController).await;
        verdict == Verdict::Exit || self.run.exiting()
    }
}
