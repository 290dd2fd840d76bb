//! Persistent connections to leased exporters, as upstream's `jmp_connect` keeps them: each
//! holds a ready lease, a private Unix socket tunnelled to the exporter (what `j` commands
//! use, as inside `jmp shell`) and a client session over that socket for driver calls.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use jiff::Timestamp;
use jumpstarter_core::{
    client::{ConnectOptions, ControllerClient, ExporterSession, LeaseSession, lease::LeaseSource},
    config::ClientConfig,
    server::local_socket_path,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// At most this many connections are open at once (each holds a lease and a socket).
pub const MAX_CONNECTIONS: usize = 16;

/// One open connection.
pub struct Connection {
    /// Short random id the agent refers to it by.
    pub id: String,
    /// The lease's name.
    pub lease_name: String,
    /// The exporter's name.
    pub exporter_name: String,
    /// The exporter's labels.
    pub exporter_labels: BTreeMap<String, String>,
    /// The local socket (`JUMPSTARTER_HOST` for `j`).
    pub socket_path: PathBuf,
    /// `JMP_DRIVERS_ALLOW` for `j`: `UNSAFE` or the config's allow-list.
    pub drivers_allow: String,
    /// When it was opened.
    pub created_at: Timestamp,
    /// The client session over the socket.
    pub session: ExporterSession,
    /// Whether the lease was created for this connection.
    owned: bool,
    /// The lease, until the connection is closed.
    lease: tokio::sync::Mutex<Option<LeaseSession>>,
    cancel: CancellationToken,
    server: Mutex<Option<JoinHandle<()>>>,
    // Holds the socket's private directory until the connection is dropped.
    _dir: tempfile::TempDir,
}

impl Connection {
    /// Whether the lease was created for this connection (and so is released with it).
    pub fn owns_lease(&self) -> bool {
        self.owned
    }

    /// Stops serving the socket; then releases the lease if `release` and we created it.
    /// Returns whether the lease was released.
    async fn close(&self, release: bool) -> Result<bool> {
        self.cancel.cancel();
        let server = self.server.lock().ok().and_then(|mut s| s.take());
        if let Some(server) = server {
            let _ = server.await;
        }
        let Some(lease) = self.lease.lock().await.take() else {
            return Ok(false);
        };
        if release && self.owned {
            lease
                .release_now()
                .await
                .with_context(|| format!("cannot release lease {}", self.lease_name))?;
            return Ok(true);
        }
        lease.detach();
        Ok(false)
    }
}

/// The open connections.
#[derive(Default)]
pub struct Connections {
    open: tokio::sync::Mutex<BTreeMap<String, Arc<Connection>>>,
}

impl Connections {
    /// Acquires a lease (creating it, or waiting for an existing one to be ready) and
    /// connects to its exporter. A lease created here is released again if connecting fails.
    /// Waits at most `timeout` for the lease (default: the config's acquisition timeout).
    pub async fn open(
        &self,
        cfg: &ClientConfig,
        source: LeaseSource,
        timeout: Option<Duration>,
    ) -> Result<Arc<Connection>> {
        if self.open.lock().await.len() >= MAX_CONNECTIONS {
            bail!(
                "already {MAX_CONNECTIONS} connections open; close one with jmp_disconnect first"
            );
        }
        if let LeaseSource::Create(req) = &source {
            req.check()?;
        }
        let timeout =
            timeout.unwrap_or_else(|| Duration::from_secs(cfg.leases.acquisition_timeout));
        let controller = ControllerClient::connect(cfg).await?;
        // As `jmp shell`: go straight to the exporter when it offers a path that answers.
        let lease = LeaseSession::from_source(&controller, source)
            .acquisition_timeout(timeout)
            .on_wait(|name, why| tracing::info!("waiting for lease {name}: {why}"))
            .acquire()
            .await?;
        let drivers_allow = if cfg.allows_unsafe() {
            "UNSAFE".to_string()
        } else {
            cfg.drivers.allow.join(",")
        };
        let served = match serve(&lease).await {
            Ok(s) => s,
            Err(e) => {
                let name = lease.lease().name.clone();
                if let Err(r) = lease.release_now().await {
                    tracing::warn!("cannot release lease {name}: {r}");
                }
                return Err(e);
            }
        };
        let acquired = lease.lease();
        let conn = Arc::new(Connection {
            id: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
            lease_name: acquired.name.clone(),
            exporter_name: acquired.exporter.clone(),
            exporter_labels: acquired.exporter_labels.clone(),
            owned: acquired.owned,
            socket_path: served.socket,
            drivers_allow,
            created_at: Timestamp::now(),
            session: served.session,
            lease: tokio::sync::Mutex::new(Some(lease)),
            cancel: served.cancel,
            server: Mutex::new(Some(served.server)),
            _dir: served.dir,
        });
        tracing::info!(
            "connection {} to exporter {} (lease {})",
            conn.id,
            conn.exporter_name,
            conn.lease_name
        );
        self.open
            .lock()
            .await
            .insert(conn.id.clone(), Arc::clone(&conn));
        Ok(conn)
    }

    /// The connection `id`, or an error listing the open ones.
    pub async fn get(&self, id: &str) -> Result<Arc<Connection>> {
        let open = self.open.lock().await;
        match open.get(id) {
            Some(c) => Ok(Arc::clone(c)),
            None => bail!(
                "no connection with id {id:?} (open: {}); open one with jmp_connect",
                if open.is_empty() {
                    "none".to_string()
                } else {
                    open.keys().cloned().collect::<Vec<_>>().join(", ")
                }
            ),
        }
    }

    /// Every open connection, by id.
    pub async fn list(&self) -> Vec<Arc<Connection>> {
        self.open.lock().await.values().cloned().collect()
    }

    /// Closes the connection `id`, releasing its lease if it created it. Returns the
    /// connection and whether its lease was released.
    pub async fn close(&self, id: &str) -> Result<(Arc<Connection>, bool)> {
        let conn = self.get(id).await?;
        self.open.lock().await.remove(id);
        let released = conn.close(true).await?;
        Ok((conn, released))
    }

    /// Closes (without releasing anything) the connections using lease `lease_name`, which
    /// was deleted by other means. Returns their ids.
    pub async fn forget_lease(&self, lease_name: &str) -> Vec<String> {
        let gone: Vec<Arc<Connection>> = {
            let mut open = self.open.lock().await;
            let ids: Vec<String> = open
                .values()
                .filter(|c| c.lease_name == lease_name)
                .map(|c| c.id.clone())
                .collect();
            ids.iter().filter_map(|id| open.remove(id)).collect()
        };
        for c in &gone {
            let _ = c.close(false).await;
        }
        gone.iter().map(|c| c.id.clone()).collect()
    }

    /// Closes every connection, releasing the leases they created (at shutdown).
    pub async fn close_all(&self) {
        let all: Vec<Arc<Connection>> = std::mem::take(&mut *self.open.lock().await)
            .into_values()
            .collect();
        for c in all {
            match c.close(true).await {
                Ok(true) => tracing::info!("released lease {}", c.lease_name),
                Ok(false) => {}
                Err(e) => tracing::warn!("{e:#}"),
            }
        }
    }
}

/// What serving a lease locally takes.
struct Served {
    dir: tempfile::TempDir,
    socket: PathBuf,
    cancel: CancellationToken,
    server: JoinHandle<()>,
    session: ExporterSession,
}

/// Serves the lease on a private socket and connects a session to it.
async fn serve(session: &LeaseSession) -> Result<Served> {
    let dir = crate::shell::private_dir()?;
    let socket = local_socket_path(dir.path());
    let lease = session.lease();
    let direct = session.direct_path().cloned();
    let cancel = CancellationToken::new();
    let server = tokio::spawn(lease.serve_local_via(&socket, direct, cancel.clone())?);
    match ExporterSession::connect(&socket.to_string_lossy(), &ConnectOptions::default()).await {
        Ok(session) => Ok(Served {
            dir,
            socket,
            cancel,
            server,
            session,
        }),
        Err(e) => {
            cancel.cancel();
            let _ = server.await;
            Err(anyhow::Error::new(e)
                .context(format!("cannot reach the exporter of lease {}", lease.name)))
        }
    }
}
