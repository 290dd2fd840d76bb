//! Integration tests of jumpstarter-core: a real session server and the client library.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../../examples/custom_driver/driver.rs"]
#[allow(dead_code)]
mod thermostat;

mod hook_wait;
mod session;
mod transport;
mod tunnel;

use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

use jumpstarter_core::{
    DriverNode, Session,
    client::{ConnectOptions, ExporterSession, SessionChannel, connect_channel},
    server::{local_socket_path, serve_unix},
};

/// A session served on a Unix socket for the duration of a test.
pub struct Served {
    pub session: Arc<Session>,
    pub socket: PathBuf,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl Served {
    pub fn host(&self) -> String {
        self.socket.to_string_lossy().into_owned()
    }

    pub async fn client(&self) -> ExporterSession {
        ExporterSession::connect(&self.host(), &ConnectOptions::default())
            .await
            .unwrap()
    }

    pub async fn channel(&self) -> SessionChannel {
        connect_channel(&self.host(), &ConnectOptions::default())
            .await
            .unwrap()
    }
}

/// The test tree: root composite-like thermostat with a `thermostat` child.
pub fn tree() -> DriverNode {
    DriverNode::new(Arc::new(thermostat::Thermostat::default())).with_child(
        "thermostat",
        DriverNode::new(Arc::new(thermostat::Thermostat::default())),
    )
}

pub fn serve(session: Arc<Session>) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let socket = local_socket_path(dir.path());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = serve_unix(session.clone(), &socket, async {
        let _ = stopped.await;
    })
    .unwrap();
    tokio::spawn(server);
    Served {
        session,
        socket,
        _dir: dir,
        stop: Some(stop),
    }
}

pub fn serve_ready() -> Served {
    serve(Session::new_ready(
        tree(),
        BTreeMap::from([("board".into(), "x".into())]),
    ))
}
