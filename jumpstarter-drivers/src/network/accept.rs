//! The accept loop shared by the client-side listeners (TCP port forwards, the noVNC bridge).

use std::{net::SocketAddr, sync::Arc};

use tokio::{sync::Semaphore, task::JoinHandle};

/// Accepts connections on `listener` (Nagle off) and runs `handle` on each, at most `max` at
/// once (more wait in the listener's backlog); the task ends when aborted.
pub(super) fn serve_tcp<F, Fut>(
    listener: tokio::net::TcpListener,
    max: usize,
    handle: F,
) -> JoinHandle<()>
where
    F: Fn(tokio::net::TcpStream, SocketAddr) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(max));
    tokio::spawn(async move {
        let mut running = tokio::task::JoinSet::new();
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((conn, peer)) => {
                        let _ = conn.set_nodelay(true);
                        let work = handle(conn, peer);
                        running.spawn(async move {
                            work.await;
                            drop(permit);
                        });
                    }
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                },
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        }
    })
}
