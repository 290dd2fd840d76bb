//! The accept loop shared by the client-side listeners (TCP and Unix port forwards, the
//! noVNC bridge).

use std::{future::Future, net::SocketAddr, sync::Arc};

use tokio::{sync::Semaphore, task::JoinHandle};

/// A listener [`serve`] can accept from.
pub(super) trait Listener: Send + Sync + 'static {
    /// An accepted connection.
    type Conn: Send + 'static;
    /// The peer's address.
    type Peer: Send;
    /// The next connection, ready to use.
    fn next(&self) -> impl Future<Output = std::io::Result<(Self::Conn, Self::Peer)>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Conn = tokio::net::TcpStream;
    type Peer = SocketAddr;
    async fn next(&self) -> std::io::Result<(Self::Conn, Self::Peer)> {
        let (conn, peer) = self.accept().await?;
        // Nagle off: forwarded bytes go out as they come.
        let _ = conn.set_nodelay(true);
        Ok((conn, peer))
    }
}

impl Listener for tokio::net::UnixListener {
    type Conn = tokio::net::UnixStream;
    type Peer = tokio::net::unix::SocketAddr;
    async fn next(&self) -> std::io::Result<(Self::Conn, Self::Peer)> {
        self.accept().await
    }
}

/// Accepts connections on `listener` and runs `handle` on each, at most `max` at once (more
/// wait in the listener's backlog); the task ends when aborted.
pub(super) fn serve<L, F, Fut>(listener: L, max: usize, handle: F) -> JoinHandle<()>
where
    L: Listener,
    F: Fn(L::Conn, L::Peer) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(max));
    tokio::spawn(async move {
        let mut running = tokio::task::JoinSet::new();
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            tokio::select! {
                accepted = listener.next() => match accepted {
                    Ok((conn, peer)) => {
                        let work = handle(conn, peer);
                        running.spawn(async move {
                            work.await;
                            drop(permit);
                        });
                    }
                    Err(e) => {
                        tracing::warn!("accept failed: {e}", e = jumpstarter_core::error_chain(&e));
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                },
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        }
    })
}
