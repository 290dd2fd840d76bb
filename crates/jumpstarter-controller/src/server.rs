//! A whole controller on one machine: SQLite store and CA in a data directory, the
//! ControllerService and ClientService over TLS, the reconcile loop, and an in-process router.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use jumpstarter_core::auth::{CertificateAuthority, RouterTokenKey, TokenIssuer};
use jumpstarter_proto::{
    client_v1::client_service_server::ClientServiceServer,
    v1::controller_service_server::ControllerServiceServer,
};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tonic::transport::{Server, ServerTlsConfig};

use crate::{
    service::{client::ClientApi, controller::ControllerApi},
    state::{ControllerState, RouterEntry},
    store::SqliteStore,
};

/// Errors starting or running a controller.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A file in the data directory could not be used.
    #[error("data directory {path}: {reason}")]
    DataDir {
        /// The file or directory.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A listener could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// Anything else, with its cause.
    #[error("{0}")]
    Other(String),
}

/// How to run a controller.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Where the store, CA and keys live.
    pub data_dir: PathBuf,
    /// Address of the controller's gRPC listener.
    pub listen: String,
    /// Address of the in-process router's listener.
    pub router_listen: String,
    /// Host name (or IP) clients and exporters use to reach this machine; goes into the
    /// server certificate and the advertised endpoints.
    pub advertise_host: String,
}

/// A running controller.
pub struct RunningController {
    /// The controller's address.
    pub addr: SocketAddr,
    /// The in-process router's address.
    pub router_addr: SocketAddr,
    /// The endpoint advertised to clients (`host:port`).
    pub endpoint: String,
    /// PEM of the CA clients must trust.
    pub ca_pem: String,
    /// The shared state (store, issuer...).
    pub state: Arc<ControllerState<SqliteStore>>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningController {
    /// Stops serving: open streams (exporters' Status, Listen) get a few seconds to end
    /// gracefully, then everything is cut.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        for mut t in self.tasks.drain(..) {
            if tokio::time::timeout_at(deadline, &mut t).await.is_err() {
                t.abort();
            }
        }
    }
}

fn data_err(path: impl Into<PathBuf>, e: impl std::fmt::Display) -> ServerError {
    ServerError::DataDir {
        path: path.into(),
        reason: e.to_string(),
    }
}

async fn bind(addr: &str) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Listen {
            addr: addr.to_string(),
            source,
        })
}

/// Starts a controller (and its router) as configured.
pub async fn start(config: ControllerConfig) -> Result<RunningController, ServerError> {
    let dir = &config.data_dir;
    std::fs::create_dir_all(dir).map_err(|e| data_err(dir, e))?;
    let store = SqliteStore::open(dir.clone())
        .await
        .map_err(|e| data_err(dir, e))?;
    let ca = CertificateAuthority::load_or_create(&dir.join("ca"), "jumpstarter controller CA")
        .map_err(|e| data_err(dir.join("ca"), e))?;
    let mut sans = vec![
        config.advertise_host.clone(),
        "localhost".to_string(),
        "127.0.0.1".to_string(),
    ];
    sans.dedup();
    let cert = ca
        .issue_server_cert(&sans)
        .map_err(|e| ServerError::Other(format!("server certificate: {e}")))?;
    let issuer = TokenIssuer::load_or_generate(&dir.join("signing-key.pem"))
        .map_err(|e| data_err(dir.join("signing-key.pem"), e))?;
    let router_key_path = dir.join("router-key");
    let router_key = match std::fs::read_to_string(&router_key_path) {
        Ok(k) => RouterTokenKey::new(k.trim().as_bytes().to_vec())
            .map_err(|e| data_err(&router_key_path, e))?,
        Err(_) => {
            let (key, hex) =
                RouterTokenKey::generate().map_err(|e| data_err(&router_key_path, e))?;
            write_private(&router_key_path, &hex)?;
            key
        }
    };

    let listener = bind(&config.listen).await?;
    let router_listener = bind(&config.router_listen).await?;
    let addr = listener
        .local_addr()
        .map_err(|e| ServerError::Other(e.to_string()))?;
    let router_addr = router_listener
        .local_addr()
        .map_err(|e| ServerError::Other(e.to_string()))?;
    let endpoint = format!("{}:{}", config.advertise_host, addr.port());
    let router_endpoint = format!("{}:{}", config.advertise_host, router_addr.port());

    let state = ControllerState::new(
        store,
        Arc::new(issuer),
        router_key.clone(),
        vec![RouterEntry {
            name: "default".into(),
            endpoint: router_endpoint,
            labels: Default::default(),
        }],
        endpoint.clone(),
    );
    let (stop, stopped) = watch::channel(false);
    let until_stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut tasks = Vec::new();

    let router = jumpstarter_router::Router::new(router_key, Default::default());
    let router_identity = cert.identity();
    let rx = stopped.clone();
    tasks.push(tokio::spawn(async move {
        if let Err(e) = jumpstarter_router::serve(
            router,
            router_listener,
            Some(router_identity),
            until_stopped(rx),
        )
        .await
        {
            tracing::error!("router stopped: {e}");
        }
    }));

    let reconcile_state = state.clone();
    let rx = stopped.clone();
    tasks.push(tokio::spawn(crate::reconcile::run(
        reconcile_state,
        until_stopped(rx),
    )));

    let server = Server::builder()
        .tls_config(ServerTlsConfig::new().identity(cert.identity()))
        .map_err(|e| ServerError::Other(format!("TLS: {e}")))?
        // Clients ping every 20 s without calls (upstream channel defaults).
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(60)))
        .add_service(ControllerServiceServer::new(ControllerApi(state.clone())))
        .add_service(ClientServiceServer::new(ClientApi(state.clone())));
    let rx = stopped.clone();
    tasks.push(tokio::spawn(async move {
        if let Err(e) = server
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                until_stopped(rx),
            )
            .await
        {
            tracing::error!("controller server stopped: {e}");
        }
    }));

    Ok(RunningController {
        addr,
        router_addr,
        endpoint,
        ca_pem: ca.cert_pem().to_string(),
        state,
        stop,
        tasks,
    })
}

fn write_private(path: &std::path::Path, text: &str) -> Result<(), ServerError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| data_err(path, e))?;
    f.write_all(text.as_bytes()).map_err(|e| data_err(path, e))
}
