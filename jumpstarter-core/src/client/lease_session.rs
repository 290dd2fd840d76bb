//! [`LeaseSession`]: what `jmp shell` does around a command, for any Rust program. Request a
//! lease (or take an existing one), wait for it with the place in the queue reported to a
//! callback, reach the exporter (directly when it offers a path that answers, else through
//! the router), wait for its beforeLease hook, hand out the [`ExporterSession`], and at the
//! end `EndSession` (the afterLease hook) and release the lease.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use crate::{
    client::{
        ExporterSession, SessionChannel,
        controller::{ControllerClient, LeaseRequest},
        direct::{self, DirectTarget},
        lease::{self, AcquiredLease, LeaseSource},
        lease_error::LeaseError,
        timings,
        tunnel::RetryPolicy,
    },
    hooks::wait::{self, Ended, HOOK_WAIT, Ready},
};

/// How long a lease may wait in the queue by default (upstream's
/// `leases.acquisition_timeout`).
pub const DEFAULT_ACQUISITION_TIMEOUT: Duration = Duration::from_secs(7200);

type OnWait<'a> = Box<dyn FnMut(&str, &str) + Send + 'a>;

/// How to open a [`LeaseSession`]: from [`LeaseSession::builder`] or
/// [`LeaseSession::existing`].
#[must_use = "a builder does nothing until acquire() or connect() is awaited"]
pub struct LeaseSessionBuilder<'a> {
    controller: ControllerClient,
    source: LeaseSource,
    acquisition_timeout: Duration,
    direct: bool,
    retry: Option<RetryPolicy>,
    hook_timeout: Duration,
    on_wait: OnWait<'a>,
}

impl<'a> LeaseSessionBuilder<'a> {
    /// How long to wait for the lease to become ready (default
    /// [`DEFAULT_ACQUISITION_TIMEOUT`]).
    pub fn acquisition_timeout(mut self, timeout: Duration) -> Self {
        self.acquisition_timeout = timeout;
        self
    }

    /// Whether to use a direct path to the exporter when it offers one that answers
    /// (default `true`); otherwise every connection goes through the router.
    pub fn direct(mut self, on: bool) -> Self {
        self.direct = on;
        self
    }

    /// How tunnels are retried while the router or the exporter is unreachable (default:
    /// [`crate::client::tunnel::DEFAULT_RETRY_TIMEOUT`], no events).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// How long the exporter's beforeLease and afterLease hooks may keep the session
    /// waiting (default [`HOOK_WAIT`], as upstream).
    pub fn hook_timeout(mut self, timeout: Duration) -> Self {
        self.hook_timeout = timeout;
        self
    }

    /// Called with the lease name and the reason whenever the reason for waiting changes
    /// (the controller's `Pending` message, which says the place in the queue).
    pub fn on_wait(mut self, f: impl FnMut(&str, &str) + Send + 'a) -> Self {
        self.on_wait = Box::new(f);
        self
    }

    /// Acquires the lease and checks that the exporter can be reached (directly or through
    /// the router), without waiting for its beforeLease hook: for callers that serve the
    /// session themselves (`jmp shell` serves it on a local socket) and wait with
    /// [`LeaseSession::wait_ready_on`]. A lease created here is released again when reaching
    /// the exporter fails.
    pub async fn acquire(self) -> Result<LeaseSession, LeaseError> {
        let Self {
            controller,
            source,
            acquisition_timeout,
            direct,
            retry,
            hook_timeout,
            on_wait,
        } = self;
        let mut on_wait = on_wait;
        let mut acquired = lease::acquire(&controller, source, acquisition_timeout, |l, w| {
            on_wait(l, w)
        })
        .await?;
        if let Some(policy) = retry {
            acquired.set_retry(policy);
        }
        let mut session = LeaseSession {
            lease: acquired,
            direct: None,
            router: None,
            exporter: None,
            hook_timeout,
            ready: AtomicBool::new(false),
            session_ended: AtomicBool::new(false),
            finished: false,
        };
        // The first tunnel stays open: the session's own calls (its status, `EndSession`)
        // use it rather than dialling again.
        let step = timings::step("tunnel to the exporter");
        let router = session.lease.session_channel().await;
        step.end();
        let reached = match router {
            Err(e) => Err(e),
            Ok(router) if direct => {
                session.router = Some(router.clone());
                match session
                    .lease
                    .find_direct_on(router, direct::DIRECT_CONNECT_TIMEOUT)
                    .await
                {
                    Ok(d) => Ok(d),
                    Err(e @ LeaseError::Connect(_)) => Err(e),
                    // The tunnel works but the report is unreadable: stay on the router, the
                    // driver calls will say what is wrong.
                    Err(e) => {
                        tracing::warn!(
                            "cannot read the exporter's report: {e}",
                            e = crate::error_chain(&e)
                        );
                        Ok(None)
                    }
                }
            }
            Ok(router) => {
                session.router = Some(router);
                Ok(None)
            }
        };
        match reached {
            Ok(direct) => {
                session.direct = direct;
                Ok(session)
            }
            Err(e) => {
                if let Err(r) = session.release().await {
                    tracing::warn!("releasing the lease after a failure: {r}");
                }
                Err(e)
            }
        }
    }

    /// Acquires the lease, reaches the exporter, waits for its beforeLease hook and reads
    /// its driver tree: the session is ready for driver calls
    /// ([`LeaseSession::session`]). A lease created here is released again on failure.
    pub async fn connect(self) -> Result<LeaseSession, LeaseError> {
        let mut session = self.acquire().await?;
        match session.open().await {
            Ok(()) => Ok(session),
            Err(e) => {
                if let Err(r) = session.release().await {
                    tracing::warn!("releasing the lease after a failure: {r}");
                }
                Err(e)
            }
        }
    }
}

/// A leased exporter and the session with it: what `jmp shell` does around a command, for
/// any Rust program.
///
/// ```no_run
/// # async fn demo(cfg: jumpstarter_core::config::ClientConfig) -> Result<(), jumpstarter_core::Error> {
/// use std::time::Duration;
/// use jumpstarter_core::{ControllerClient, LeaseRequest, LeaseSession};
/// let controller = ControllerClient::connect(&cfg).await?;
/// let request = LeaseRequest::new("board=rpi4", Duration::from_secs(1800));
/// let lease = LeaseSession::builder(&controller, request)
///     .on_wait(|lease, why| eprintln!("Waiting for lease {lease}: {why}"))
///     .connect()
///     .await?;
/// lease.session()?.driver("power")?.call::<()>("on", ()).await?;
/// lease.release().await?;
/// # Ok(()) }
/// ```
///
/// Dropped without [`LeaseSession::release`], a lease it created is released in the
/// background (when a tokio runtime is still there), without `EndSession`.
pub struct LeaseSession {
    lease: AcquiredLease,
    direct: Option<DirectTarget>,
    /// The channel through the router opened when the exporter was first reached (it dials
    /// again by itself when its tunnel breaks).
    router: Option<SessionChannel>,
    exporter: Option<ExporterSession>,
    hook_timeout: Duration,
    ready: AtomicBool,
    session_ended: AtomicBool,
    finished: bool,
}

impl LeaseSession {
    /// A session on a new lease as `request` says.
    pub fn builder<'a>(
        controller: &ControllerClient,
        request: LeaseRequest,
    ) -> LeaseSessionBuilder<'a> {
        Self::from_source(controller, LeaseSource::Create(request))
    }

    /// A session on the existing lease `name` (short or `namespaces/NS/leases/NAME`), which
    /// stays as it is at the end: neither `EndSession` nor release.
    pub fn existing<'a>(
        controller: &ControllerClient,
        name: impl Into<String>,
    ) -> LeaseSessionBuilder<'a> {
        Self::from_source(controller, LeaseSource::Existing(name.into()))
    }

    /// A session on a new or an existing lease.
    pub fn from_source<'a>(
        controller: &ControllerClient,
        source: LeaseSource,
    ) -> LeaseSessionBuilder<'a> {
        LeaseSessionBuilder {
            controller: controller.clone(),
            source,
            acquisition_timeout: DEFAULT_ACQUISITION_TIMEOUT,
            direct: true,
            retry: None,
            hook_timeout: HOOK_WAIT,
            on_wait: Box::new(|_, _| {}),
        }
    }

    /// The lease: its name, exporter, labels, status.
    pub fn lease(&self) -> &AcquiredLease {
        &self.lease
    }

    /// The direct path to the exporter, when one answered (else the router carries it all).
    pub fn direct_path(&self) -> Option<&DirectTarget> {
        self.direct.as_ref()
    }

    /// A gRPC channel to the exporter's session: a new one over the direct path, else the
    /// one through the router that reached the exporter first (shared: HTTP/2 carries many
    /// calls at once), else a new one through the router.
    pub async fn channel(&self) -> Result<SessionChannel, LeaseError> {
        if let Some(direct) = &self.direct {
            match direct.channel().await {
                Ok(c) => return Ok(c),
                Err(e) => tracing::warn!("{e}; using the router", e = crate::error_chain(&e)),
            }
        }
        if let Some(router) = &self.router {
            return Ok(router.clone());
        }
        self.lease.session_channel().await
    }

    /// The session for driver calls, opened by [`LeaseSessionBuilder::connect`]; a session
    /// from [`LeaseSessionBuilder::acquire`] has none (its caller serves it).
    pub fn session(&self) -> Result<&ExporterSession, LeaseError> {
        self.exporter.as_ref().ok_or_else(|| {
            LeaseError::Invalid(format!(
                "lease {} was opened with acquire(), which leaves the session to its caller; \
                 connect() opens it",
                self.lease.name
            ))
        })
    }

    async fn open(&mut self) -> Result<(), LeaseError> {
        let channel = self.channel().await?;
        match self.wait_ready_on(channel.clone()).await {
            Ready::Ready { warning } => {
                if let Some(w) = warning {
                    tracing::warn!("lease {}: {w}", self.lease.name);
                }
            }
            Ready::Failed(message) => {
                return Err(LeaseError::Hook {
                    lease: self.lease.name.clone(),
                    message,
                });
            }
            Ready::LeaseEnded => {
                return Err(match self.lease.refusal() {
                    Some(message) => LeaseError::Hook {
                        lease: self.lease.name.clone(),
                        message,
                    },
                    None => LeaseError::Failed {
                        lease: self.lease.name.clone(),
                        state: "has ended",
                        message: "it ended during the exporter's beforeLease hook".into(),
                    },
                });
            }
        }
        let exporter = ExporterSession::from_channel(channel)
            .await
            .map_err(LeaseError::Connect)?;
        self.exporter = Some(exporter);
        Ok(())
    }

    /// Waits (over `channel`) until the exporter is ready for commands: its beforeLease hook
    /// over. A status poll that fails while the lease goes on does not end the wait; once
    /// the lease has ended it does ([`Ready::LeaseEnded`]; [`AcquiredLease::refusal`] then
    /// says whether the controller refused to connect for the exporter's state).
    pub async fn wait_ready_on(&self, channel: SessionChannel) -> Ready {
        let ready =
            wait::wait_ready_or(channel, self.hook_timeout, || self.lease.has_ended()).await;
        if matches!(ready, Ready::Ready { .. }) {
            self.ready.store(true, Ordering::Relaxed);
        }
        ready
    }

    /// Ends the session (`EndSession`) over `channel` and waits for the afterLease hook.
    /// [`LeaseSession::release`] then only releases the lease.
    pub async fn end_session_on(&self, channel: SessionChannel) -> Ended {
        self.session_ended.store(true, Ordering::Relaxed);
        wait::end_session(channel, self.hook_timeout).await
    }

    /// Ends the session and the lease: `EndSession` (waiting for the afterLease hook) if
    /// the session was ready and not ended yet, then releases the lease if it was created
    /// here. A lease given by name stays as it is. An afterLease hook that failed is
    /// reported after the lease is released.
    pub async fn release(mut self) -> Result<(), LeaseError> {
        self.finished = true;
        if !self.lease.owned {
            return Ok(());
        }
        let mut hook = Ok(());
        if self.ready.load(Ordering::Relaxed) && !self.session_ended.load(Ordering::Relaxed) {
            match self.channel().await {
                Ok(channel) => match self.end_session_on(channel).await {
                    Ended::Failed(message) => {
                        hook = Err(LeaseError::Hook {
                            lease: self.lease.name.clone(),
                            message,
                        })
                    }
                    Ended::Done { warning: Some(w) } => {
                        tracing::warn!("lease {}: {w}", self.lease.name)
                    }
                    Ended::TimedOut => tracing::warn!(
                        "lease {}: timeout waiting for the afterLease hook to complete",
                        self.lease.name
                    ),
                    _ => {}
                },
                Err(e) => tracing::debug!(
                    "lease {}: no EndSession: {e}",
                    self.lease.name,
                    e = crate::error_chain(&e)
                ),
            }
        }
        self.lease.release().await?;
        hook
    }

    /// Releases the lease if it was created here, without `EndSession` (so without waiting
    /// for an afterLease hook): for a caller that ended the session itself with
    /// [`LeaseSession::end_session_on`], or that must not wait (a signal).
    pub async fn release_now(mut self) -> Result<(), LeaseError> {
        self.finished = true;
        self.lease.release().await
    }

    /// Leaves the lease as it is (for one that ended by itself, or that another program
    /// goes on with): nothing is ended or released, now or on drop.
    pub fn detach(mut self) -> AcquiredLease {
        self.finished = true;
        self.lease.clone()
    }
}

impl Drop for LeaseSession {
    fn drop(&mut self) {
        if self.finished || !self.lease.owned {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "lease {} dropped outside a tokio runtime: it stays until it expires",
                self.lease.name
            );
            return;
        };
        let lease = self.lease.clone();
        runtime.spawn(async move {
            if let Err(e) = lease.release().await {
                tracing::warn!(
                    "releasing lease {} on drop: {e}",
                    lease.name,
                    e = crate::error_chain(&e)
                );
            }
        });
    }
}
