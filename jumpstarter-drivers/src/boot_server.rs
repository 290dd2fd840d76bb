//! What the two boot servers (`HttpServer`, `Tftp`) share: the default host, the root
//! directory and its `storage` child, and the slot holding the running server.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use jumpstarter_core::{Driver, DriverError, sync::LockExt};

use crate::storage::Opendal;

/// This machine's address on its default route (what a board on the lab network reaches),
/// as upstream finds it: the host name's address unless it is loopback, else the source
/// address of a route to a public address (no packet is sent), else `0.0.0.0`.
pub(crate) fn default_host() -> String {
    let by_name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .and_then(|h| std::net::ToSocketAddrs::to_socket_addrs(&(h.as_str(), 0)).ok())
        .and_then(|mut a| a.find(|a| a.is_ipv4() && !a.ip().is_loopback()));
    if let Some(a) = by_name {
        return a.ip().to_string();
    }
    let routed = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.175.48.1:53").map(|()| s))
        .and_then(|s| s.local_addr());
    match routed {
        Ok(a) if !a.ip().is_unspecified() => a.ip().to_string(),
        _ => {
            tracing::warn!("could not determine the default IP address, falling back to 0.0.0.0");
            "0.0.0.0".into()
        }
    }
}

/// Creates `root_dir` (and its parents) if missing; an error names the field.
pub(crate) fn make_root(driver: &str, root: &std::path::Path) -> Result<(), DriverError> {
    std::fs::create_dir_all(root).map_err(|e| {
        DriverError::invalid_because(
            format!("{driver} root_dir {}: cannot create it", root.display()),
            e,
        )
    })
}

/// The `storage` child both boot servers have: an `fs` Opendal driver on `root_dir`.
pub(crate) fn storage_child(
    root: &std::path::Path,
    remove_created_on_close: bool,
) -> Result<Arc<dyn Driver>, DriverError> {
    let kwargs = BTreeMap::from([("root".to_string(), root.display().to_string())]);
    Ok(Arc::new(
        Opendal::new("fs", kwargs, remove_created_on_close).map_err(DriverError::from)?,
    ))
}

/// A server's task; dropping it stops the server and the connections or transfers it owns.
pub(crate) struct ServerTask(tokio::task::JoinHandle<()>);

impl ServerTask {
    /// Runs `serve` until the task is dropped.
    pub(crate) fn spawn(serve: impl Future<Output = ()> + Send + 'static) -> Self {
        Self(tokio::spawn(serve))
    }

    /// Stops the task and waits until it has ended, so that its listening socket is closed
    /// (a client that connects after `stop` returns is refused, not accepted and then reset).
    async fn stopped(mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

impl Drop for ServerTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The server a boot-server driver runs, if any, and the address it is bound to.
#[derive(Default)]
pub(crate) struct ServerSlot(Mutex<Option<(SocketAddr, ServerTask)>>);

impl ServerSlot {
    /// Whether a server is running.
    pub(crate) fn is_running(&self) -> bool {
        self.0.lock_or_recover().is_some()
    }

    /// Stops the running server and waits until its socket is closed; whether there was
    /// one.
    pub(crate) async fn stop(&self) -> bool {
        // Awaited outside the lock.
        let old = self.0.lock_or_recover().take();
        match old {
            Some((_, task)) => {
                task.stopped().await;
                true
            }
            None => false,
        }
    }

    /// Keeps `task`, bound to `addr`, as the running server, unless one is running already
    /// (another start won the race): then `task` is stopped and `false` returned.
    pub(crate) fn start(&self, addr: SocketAddr, task: ServerTask) -> bool {
        let mut slot = self.0.lock_or_recover();
        if slot.is_some() {
            return false;
        }
        *slot = Some((addr, task));
        true
    }

    /// Keeps `task`, bound to `addr`, as the running server, stopping any other.
    pub(crate) fn replace(&self, addr: SocketAddr, task: ServerTask) {
        let old = self.0.lock_or_recover().replace((addr, task));
        drop(old);
    }

    /// The bound port of the running server.
    pub(crate) fn port(&self) -> Option<u16> {
        self.0.lock_or_recover().as_ref().map(|(a, _)| a.port())
    }
}
