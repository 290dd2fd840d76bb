//! Integration tests of jumpstarter-drivers: drivers served by a real session on a Unix
//! socket, driven through the client library.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod boot;
mod flasher;
mod network;
mod power;
mod qemu;
#[cfg(feature = "storage-s3")]
mod s3;
mod serial;
mod shell;
mod shell_env;
mod storage;

use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

use jumpstarter_core::{
    Driver, DriverNode, Session,
    client::{ConnectOptions, ExporterSession},
    server::{local_socket_path, serve_unix},
};
use jumpstarter_drivers::Composite;

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
    /// Serves a composite root with the given children.
    pub fn start(children: Vec<(&str, Arc<dyn Driver>)>) -> Self {
        let mut root = DriverNode::new(Arc::new(Composite));
        for (name, d) in children {
            root = root.with_child(name, DriverNode::new(d));
        }
        let session = Session::new_ready(root, BTreeMap::new());
        let dir = tempfile::tempdir().unwrap();
        let socket = local_socket_path(dir.path());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = serve_unix(session.clone(), &socket, async {
            let _ = stopped.await;
        })
        .unwrap();
        tokio::spawn(server);
        Self {
            session,
            socket,
            _dir: dir,
            stop: Some(stop),
        }
    }

    pub async fn client(&self) -> ExporterSession {
        ExporterSession::connect(&self.socket.to_string_lossy(), &ConnectOptions::default())
            .await
            .unwrap()
    }
}
